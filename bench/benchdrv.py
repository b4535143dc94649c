# bench/benchdrv.py — what the comparison drivers (xfer-vs-ucx, xfer-vs-memcpy)
# share: finding the build, running a tool with a timeout and echoing it,
# parsing "key=value" result lines, sizes, medians and Markdown tables.
import os
import re
import shlex
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M"
# The UCX transport list each --transport maps to, for every tool alike.
UCX_TLS = {"shm": "sm,self", "tcp": "tcp,self"}

_UNITS = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gib": 1 << 30}


def parse_size(text):
    """'64K', '4MiB', '4096' -> bytes (powers of two)."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS or int(m.group(1)) == 0:
        raise ValueError(f"bad size '{text}'")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def parse_sizes(text):
    return [parse_size(s) for s in text.split(",") if s.strip()]


def fmt_size(n):
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n % mult == 0:
            return f"{n // mult} {unit}"
    return f"{n} B"


def find_build(arg):
    """The build directory holding bench/xferbench: --build, build-bench/, build/."""
    candidates = [arg] if arg else [os.path.join(REPO, "build-bench"), os.path.join(REPO, "build")]
    for d in candidates:
        if os.path.isfile(os.path.join(d, "bench", "xferbench")):
            return os.path.abspath(d)
    sys.exit(f"no bench/xferbench under {', '.join(candidates)}: build first "
             "(meson setup build-bench -Dbuildtype=release -Dcuda=disabled && ninja -C build-bench)")


def show(cmd, env_extra):
    prefix = " ".join(f"{k}={v}" for k, v in sorted(env_extra.items()))
    print(f"+ {prefix + ' ' if prefix else ''}{shlex.join(cmd)}", flush=True)


def run(cmd, env_extra, timeout):
    """Run cmd to completion (killed after timeout seconds); return stdout."""
    show(cmd, env_extra)
    env = dict(os.environ, **env_extra)
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{os.path.basename(cmd[0])} timed out after {timeout} s")
    if p.returncode != 0:
        raise RuntimeError(f"{os.path.basename(cmd[0])} exited with {p.returncode}:\n"
                           f"{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p.stdout


def result_lines(text, tool):
    """Every 'tool key=value ...' line of text as a dict."""
    out = []
    for line in text.splitlines():
        if line.startswith(tool + " "):
            out.append(dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv))
    return out


def gbps_of(text, tool):
    """GB/s of the single round a tool printed."""
    lines = result_lines(text, tool)
    if len(lines) != 1:
        raise RuntimeError(f"{tool}: expected one result line, got {len(lines)}")
    return float(lines[0]["gbps"])


def median(values):
    return statistics.median(values)


def table(headers, rows):
    """Markdown table; numbers already formatted as strings."""
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---:" if i else "---" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def compare(sizes, rounds, label, runners):
    """For each size, `rounds` rounds alternating the two runners (each returns
    GB/s for one run); returns rows [size, a, b, b/a] of medians."""
    rows = []
    for size in sizes:
        results = ([], [])
        for r in range(rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            for i in order:
                results[i].append(runners[i](size))
        a, b = median(results[0]), median(results[1])
        print(f"# {label} {fmt_size(size)}: rounds {results[0]} vs {results[1]} GB/s", flush=True)
        rows.append([fmt_size(size), f"{a:.2f}", f"{b:.2f}", f"{b / a:.2f}"])
    return rows
