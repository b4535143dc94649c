#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../tools/python" "$0" "$@"'
"""tests/integration/comm_ucx_test.py — the UCX communicator (comm/ucx.c)
across processes: starts SIZE comm_ucx_peer processes on loopback, which
exchange their addresses through a temporary directory, and checks what
they report. Every wait has a limit; on any failure the processes are
killed and their output printed.

Usage: comm_ucx_test.py MODE SIZE VARIANT PEER_EXE
  MODE     run | kill | stall | toobig | abort | mismatch (see comm_ucx_peer.c)
  VARIANT  shm (UCX shared memory), tcp (tcp over lo), small (shm with 4 KiB
           slots, 2 per rank and 1 KiB messages: segments in many chunks,
           puts and acknowledgements)"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

PEER = -11        # td_status_t values (base/status.h)
TIMEOUT = -6
TOO_BIG = -8
CANCELED = -12
MISMATCH = -10
CLOSED = -5
DETECT_S = 5.0    # a dead or failed rank is seen by the others within this
DEADLINE_MS = 500  # stall: the collectives' deadline

VARIANTS = {
    "shm": ["--tls", "shm,self"],
    "tcp": ["--tls", "tcp,self"],
    "small": ["--tls", "shm,self", "--chunk", "4096", "--slots", "2", "--max-payload", "1024"],
}


def fail(msg, procs, outdir):
    print(f"comm_ucx_test: FAIL: {msg}")
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    dump(outdir, len(procs))
    sys.exit(1)


def dump(outdir, n):
    for r in range(n):
        for what in ("out", "err"):
            path = os.path.join(outdir, f"rank{r}.{what}")
            if os.path.exists(path):
                text = open(path, errors="replace").read()
                print(f"---- rank {r} std{what} ----\n{text[-6000:]}")


def lines(outdir, r):
    path = os.path.join(outdir, f"rank{r}.out")
    try:
        return open(path, errors="replace").read().splitlines()
    except OSError:
        return []


def result(outdir, r, key):
    """key=value pairs of rank r's first stdout line holding key."""
    for line in lines(outdir, r):
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        if key in fields:
            return fields
    return None


def wait_all(procs, limit_s, outdir):
    until = time.monotonic() + limit_s
    for r, p in enumerate(procs):
        try:
            p.wait(timeout=max(0.1, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            fail(f"rank {r} still running after {limit_s} s (a hang)", procs, outdir)


def main():
    if len(sys.argv) != 5 or sys.argv[1] not in ("run", "kill", "stall", "toobig", "abort", "mismatch") or \
            sys.argv[3] not in VARIANTS:
        print(__doc__)
        return 2
    mode, size, variant, exe = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    extra = list(VARIANTS[variant])
    if mode == "run":
        extra += ["--iters", "500" if variant != "small" else "200"]
    elif mode == "kill":
        extra += ["--iters", "100000000"]
    elif mode == "stall":
        extra += ["--iters", "1000", "--deadline-ms", str(DEADLINE_MS)]
    else:
        extra += ["--iters", "1000"]
    with tempfile.TemporaryDirectory(prefix="comm-ucx-") as d:
        outdir = os.path.join(d, "out")
        os.mkdir(outdir)
        procs = []
        for r in range(size):
            cmd = [exe, mode, d, str(r), str(size), "--seed", "7"] + extra
            if r == 0:
                print("+", " ".join(cmd))
            procs.append(subprocess.Popen(
                cmd, stdout=open(os.path.join(outdir, f"rank{r}.out"), "w"),
                stderr=open(os.path.join(outdir, f"rank{r}.err"), "w"), start_new_session=True))
        try:
            check(mode, size, procs, outdir)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        dump(outdir, size)
    print(f"comm_ucx_test {mode} {size} {variant}: ok")
    return 0


def check(mode, size, procs, outdir):
    if mode == "run":
        wait_all(procs, 150, outdir)
        for r, p in enumerate(procs):
            res = result(outdir, r, "collectives")
            if p.returncode != 0 or res is None:
                fail(f"rank {r} exited {p.returncode} without its summary", procs, outdir)
            print(f"rank {r}: {res['collectives']} collectives in {int(res['us']) / 1e6:.2f} s")
        return

    if mode == "kill":
        victim = 1
        until = time.monotonic() + 60
        while not all(result(outdir, r, "looping") is not None or
                      any("looping" in l for l in lines(outdir, r)) for r in range(size)):
            if time.monotonic() > until or any(p.poll() is not None for p in procs):
                fail("the ranks did not all start looping", procs, outdir)
            time.sleep(0.02)
        time.sleep(0.3)
        t_kill = time.monotonic()
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()   # reaped: a zombie looks alive to UCX's shm keepalive
        print(f"killed rank {victim}")
        wait_all([p for r, p in enumerate(procs) if r != victim], 30, outdir)
        for r, p in enumerate(procs):
            if r == victim:
                continue
            res = result(outdir, r, "code")
            if p.returncode != 0 or res is None:
                fail(f"rank {r} exited {p.returncode} without reporting the failure", procs,
                     outdir)
            code, seen = int(res["code"]), int(res["at_ns"]) / 1e9 - t_kill
            print(f"rank {r}: code {code} {seen * 1000:.0f} ms after the kill "
                  f"(collective {res['collective']})")
            if code not in (PEER, CLOSED):
                fail(f"rank {r}: status {code}, want peer failure", procs, outdir)
            if not 0 <= seen < DETECT_S:
                fail(f"rank {r}: failure seen {seen:.2f} s after the kill (limit {DETECT_S} s)",
                     procs, outdir)
        return

    wait_all(procs, 60, outdir)
    for r, p in enumerate(procs):
        res = result(outdir, r, "code")
        if p.returncode != 0 or res is None:
            fail(f"rank {r} exited {p.returncode} without reporting the failure", procs, outdir)
        code, took = int(res["code"]), float(res["took_ms"])
        print(f"rank {r}: code {code} after {took:.0f} ms (collective {res['collective']})")
        if mode == "stall":
            if r == size - 1:
                if code not in (PEER, TIMEOUT):   # it woke to find the others gone
                    fail(f"the stalled rank: status {code}", procs, outdir)
            elif code != TIMEOUT or not DEADLINE_MS <= took < DEADLINE_MS + 1500:
                fail(f"rank {r}: status {code} after {took:.0f} ms, want timeout after "
                     f"{DEADLINE_MS} ms", procs, outdir)
        elif mode == "mismatch":
            # rank 0 sees the others' all-to-all chunks in its barrier; each
            # other rank sees rank 0's barrier chunk, or first its abort
            want = (MISMATCH,) if r == 0 else (MISMATCH, PEER)
            if code not in want or took >= DETECT_S * 1000:
                fail(f"rank {r}: status {code} after {took:.0f} ms, want {want}", procs, outdir)
        else:
            want = PEER if r else TOO_BIG if mode == "toobig" else CANCELED
            if code != want or (r != 0 and took >= DETECT_S * 1000):
                fail(f"rank {r}: status {code} after {took:.0f} ms, want {want}", procs, outdir)


if __name__ == "__main__":
    sys.exit(main())
