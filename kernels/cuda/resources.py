#!/usr/bin/env python3
"""kernels/cuda/resources.py — the compiler's resource report of every CUDA
kernel: registers, shared memory, stack frame and spills per architecture,
as ptxas states them (nvcc --resource-usage).

  resources.py compile OUT.ptxas -- NVCC ARGS...
      run nvcc with --resource-usage (the build does, for every .cu); its
      ptxas lines go to OUT.ptxas, everything else to stderr as usual
  resources.py table OUT.md REPORT.ptxas...
      the table of docs/kernels.md ("Resources"), one row per kernel
  resources.py check REPORT.ptxas...
      the rules (exit 1 with the reasons): every kernel is reported for
      every architecture of the build, no kernel spills, the hot kernels
      (HOT) have no stack frame, and every kernel's static shared memory
      fits a block (SHARED_LIMIT).
"""
import re
import subprocess
import sys

# Kernels whose speed is the forward pass's (docs/kernels.md): no stack
# frame allowed. Matched against the demangled name.
HOT = [r"\bgemm_", r"\battention", r"\bmoe_", r"\bindexer"]
# Shared memory a block may have on sm_90 and sm_100 (227 KiB).
SHARED_LIMIT = 227 * 1024

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")
SMEM = re.compile(r"(\d+) bytes smem")


def compile_(out, cmd):
    res = subprocess.run(cmd + ["--resource-usage"], capture_output=True, text=True)
    keep = []
    for line in res.stderr.splitlines(keepends=True):
        if line.startswith("ptxas info") or PROPS.search(line):
            keep.append(line)
        else:
            sys.stderr.write(line)
    sys.stdout.write(res.stdout)
    if res.returncode == 0:
        with open(out, "w") as f:
            f.writelines(keep)
    return res.returncode


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True, check=True).stdout.splitlines()
        if len(out) == len(names):
            return dict(zip(names, out))
    except (OSError, subprocess.CalledProcessError):
        pass
    return {n: n for n in names}


def parse(paths):
    """{(mangled, arch): {regs, smem, stack, spill_st, spill_ld}}"""
    kernels = {}
    for path in paths:
        cur = None
        for line in open(path):
            m = ENTRY.search(line)
            if m:
                cur = (m.group(1), m.group(2))
                kernels[cur] = {"regs": 0, "smem": 0, "stack": 0, "spill_st": 0, "spill_ld": 0}
                continue
            if cur is None:
                continue
            m = PROPS.search(line)
            if m:
                k = kernels[cur]
                k["stack"], k["spill_st"], k["spill_ld"] = (int(g) for g in m.groups())
            m = USED.search(line)
            if m:
                kernels[cur]["regs"] = int(m.group(1))
                s = SMEM.search(line)
                kernels[cur]["smem"] = int(s.group(1)) if s else 0
                cur = None
    return kernels


def short(name):
    """td_cuda::gemm_f32_kernel<true>(td_cuda::gemm_args) -> gemm_f32_kernel<true>"""
    name = re.sub(r"\(.*\)$", "", name)
    name = re.sub(r"^void ", "", name)
    return name.replace("td_cuda::", "").replace("__nv_bfloat16", "bf16")


def table(out, paths):
    kernels = parse(paths)
    names = demangle(sorted({k for k, _ in kernels}))
    archs = sorted({a for _, a in kernels}, key=lambda a: int(re.sub(r"\D", "", a)))
    rows = ["| kernel | " + " | ".join(f"{a}: regs, smem, stack, spills" for a in archs) + " |",
            "| --- |" + " --- |" * len(archs)]
    for mangled in sorted(names, key=lambda n: short(names[n])):
        cells = []
        for a in archs:
            k = kernels.get((mangled, a))
            cells.append("—" if k is None else
                         f"{k['regs']}, {k['smem']} B, {k['stack']} B, {k['spill_st'] + k['spill_ld']} B")
        rows.append(f"| `{short(names[mangled])}` | " + " | ".join(cells) + " |")
    with open(out, "w") as f:
        f.write("\n".join(rows) + "\n")
    return 0


def check(paths):
    kernels = parse(paths)
    names = demangle(sorted({k for k, _ in kernels}))
    archs = sorted({a for _, a in kernels})
    problems = []
    if not kernels:
        problems.append("no kernel in the reports: " + " ".join(paths))
    for mangled, name in names.items():
        hot = any(re.search(h, name) for h in HOT)
        for a in archs:
            k = kernels.get((mangled, a))
            if k is None:
                problems.append(f"{short(name)}: no report for {a}")
                continue
            if k["spill_st"] or k["spill_ld"]:
                problems.append(f"{short(name)} on {a}: spills {k['spill_st']} bytes, "
                                f"reloads {k['spill_ld']}")
            if hot and k["stack"]:
                problems.append(f"{short(name)} on {a}: {k['stack']} bytes of stack frame "
                                f"in a hot kernel")
            if k["smem"] > SHARED_LIMIT:
                problems.append(f"{short(name)} on {a}: {k['smem']} bytes of shared memory, "
                                f"above {SHARED_LIMIT}")
    for p in problems:
        print("resources:", p)
    nhot = sum(1 for n in names.values() if any(re.search(h, n) for h in HOT))
    print(f"resources: {len(names)} kernels ({nhot} hot) on {', '.join(archs) or 'no arch'}: "
          + ("ok" if not problems else f"{len(problems)} problems"))
    return 1 if problems else 0


def main(argv):
    if len(argv) >= 4 and argv[1] == "compile" and argv[3] == "--":
        return compile_(argv[2], argv[4:])
    if len(argv) >= 3 and argv[1] == "table":
        return table(argv[2], argv[3:])
    if len(argv) >= 2 and argv[1] == "check":
        return check(argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
