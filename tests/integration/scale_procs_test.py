#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../tools/python" "$0" "$@"'
"""tests/integration/scale_procs_test.py — bench/scale/procs on a small
cluster (1 prefilld x 1 rank, 1 decoded x 2 ranks, k = 2) and a hand-made
trace of six requests: every request served, the JSON's keys, three PNGs;
goodput's rule on a table; the des comparison against a stand-in des that
prints a hand-made des JSON (docs/scale.md's keys), its ratios and the
goodput line. docs/scale-topology.md.
usage: scale_procs_test.py BUILDDIR"""
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROCS = os.path.join(HERE, "..", "..", "bench", "scale", "procs")
GOODPUT_PY = os.path.join(HERE, "..", "..", "sim", "goodput.py")

TRACE = [{"timestamp": 100 * i, "input_length": n, "output_length": m, "hash_ids": [i, 100 + i]}
         for i, (n, m) in enumerate([(900, 6), (600, 4), (1000, 8), (700, 5), (800, 1),
                                     (950, 7)])]

# goodput: (points as (rate, attainment), target) -> req/s
GOODPUT = [
    ([(1, 1.0), (2, 0.95), (4, 0.5)], 0.9, 2 + 2 * 0.05 / 0.45),
    ([(1, 1.0), (2, 0.95), (4, 0.92)], 0.9, 4.0),
    ([(1, 0.5), (2, 0.4)], 0.9, 0.0),
    ([(4, 0.2), (1, 0.9), (2, 0.6)], 0.9, 1.0),
]

# a des run as docs/scale.md describes its --json
FAKE_DES = '''#!/bin/sh
cat <<EOF
{"config": {"arrivals": "replay"}, "run": {"events": 1, "wall_s": 0.1}, "version": 1,
 "summary": {"requests": 6, "done": 6, "too_long": 0, "refused": 0, "slo_met": 6,
  "attainment": 1.0, "ttft_p50_s": %s, "ttft_p99_s": %s, "ttft_mean_s": 0.1,
  "tpot_p50_s": %s, "tpot_p99_s": %s, "tpot_mean_s": 0.01, "makespan_s": 1.0,
  "req_per_s": 6.0, "out_tok_per_s": 30.0, "hit_ratio": 0.0}}
EOF
'''


def load_goodput():
    loader = importlib.machinery.SourceFileLoader("sim_goodput", GOODPUT_PY)
    spec = importlib.util.spec_from_loader("sim_goodput", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def main():
    build = sys.argv[1]
    gp = load_goodput()
    for pts, target, want in GOODPUT:
        got = gp.goodput([{"rate": r, "attainment": a} for r, a in pts], target)
        if abs(got - want) > 1e-9:
            print("FAIL: goodput(%r, %g) = %g, want %g" % (pts, target, got, want))
            return 1
    with tempfile.TemporaryDirectory(prefix="scale-procs-test-") as tmp:
        trace = os.path.join(tmp, "trace.jsonl")
        with open(trace, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in TRACE))
        out_json, img = os.path.join(tmp, "out.json"), os.path.join(tmp, "img")
        cmd = [sys.executable, PROCS, "--trace", trace, "--requests", "6", "--rates", "2,4",
               "--prefill", "1", "--prefill-ranks", "1", "--decode", "1", "--decode-ranks", "2",
               "--dilation", "2", "--build", build, "--out", out_json, "--plot-dir", img]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        out = r.stdout + r.stderr
        if r.returncode != 0 or "6/6 done" not in out:
            print("FAIL: exit %d, not every request served:\n%s" % (r.returncode, out))
            return 1
        doc = json.load(open(out_json))
        keys = ("attainment", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")
        if (doc["version"] != 1 or [p["rate"] for p in doc["points"]] != [2.0, 4.0] or
                any(p[k] is None for p in doc["points"] for k in keys) or
                doc["runs"][0]["summary"]["done"] != 6 or "goodput_req_per_s" not in doc):
            print("FAIL: JSON:\n%s" % json.dumps(doc, indent=1)[:3000])
            return 1
        for name in ("ttft", "tpot", "attainment"):
            with open(os.path.join(img, "scale-topology-%s.png" % name), "rb") as f:
                if f.read(8) != b"\x89PNG\r\n\x1a\n":
                    print("FAIL: %s plot is not a PNG" % name)
                    return 1
        # des at twice the processes' TTFT p50 and TPOT p99, the same elsewhere
        p = doc["points"][0]
        des = os.path.join(tmp, "des")
        with open(des, "w") as f:
            f.write(FAKE_DES % (2 * p["ttft_p50_s"], p["ttft_p99_s"], p["tpot_p50_s"],
                                2 * p["tpot_p99_s"]))
        os.chmod(des, 0o755)
        r = subprocess.run([sys.executable, PROCS, "--trace", trace, "--compare", out_json,
                            "--des", des, "--build", build], capture_output=True, text=True,
                           timeout=120)
        out2 = r.stdout + r.stderr
        want = ["rate 2: des/processes attainment 1.000  ttft_p50 2.000  ttft_p99 1.000  "
                "tpot_p50 1.000  tpot_p99 2.000",
                "des vs processes goodput: %.3f" % (4.0 / doc["goodput_req_per_s"])]
        bad = [w for w in want if w not in out2]
        if r.returncode != 0 or bad or doc["points"][0]["attainment"] != 1.0:
            print("FAIL: compare exit %d, lacks %r:\n%s\n%s" % (r.returncode, bad, out2, out))
            return 1
    print(out + out2)
    print("ok scale-procs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
