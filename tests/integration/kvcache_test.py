#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../tools/python" "$0" "$@"'
"""tests/integration/kvcache_test.py — bench/kvcache on a hand-made trace of
four requests: --dry-run prints the ideal prefix hit ratios computed here by
hand (the whole trace at 512-token blocks, the selection scaled and capped),
then both runs on the tiny checkpoint serve every request (token-id prompts,
streamed) and print the report. docs/kvbench.md.
usage: kvcache_test.py BUILDDIR"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
KVCACHE = os.path.join(HERE, "..", "..", "bench", "kvcache")

# ideal, 512-token blocks: lengths 1024 + 1536 + 700 + 512 = 3772; r1 holds
# r0's two blocks (1024), r2 the first one (512): 1536 / 3772 = 40.7%.
# --block-tokens 64 --max-input 100: lengths 100, 100, 88 (700 * 64 / 512,
# rounded up), 64 = 352; r1 hits min(128, 100), r2 64: 164 / 352 = 46.6%.
TRACE = [
    {"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]},
    {"timestamp": 100, "input_length": 1536, "output_length": 5, "hash_ids": [1, 2, 3]},
    {"timestamp": 200, "input_length": 700, "output_length": 5, "hash_ids": [1, 4]},
    {"timestamp": 300, "input_length": 512, "output_length": 5, "hash_ids": [5]},
]
WANT_DRY = [
    "ideal prefix hit ratio (512-token blocks, unbounded cache): 40.7%",
    "selection: 4 requests of 3 conversations",
    "352 prompt tokens, length min 64 p50 100 max 100",
    "ideal prefix hit ratio of the selection: 46.6% (164 of 352 tokens); the whole trace: 40.7%",
]
WANT_RUN = ["cache off     4     0", "cache on      4     0", "ttft p50 cached/cold: "]


def run(args):
    r = subprocess.run([sys.executable, KVCACHE] + args, capture_output=True, text=True,
                       timeout=150)
    return r.returncode, r.stdout + r.stderr


def main():
    build = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="kvcache-test-") as tmp:
        trace = os.path.join(tmp, "trace.jsonl")
        with open(trace, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in TRACE))
        common = ["--trace", trace, "--sample", "1", "--block-tokens", "64", "--max-input",
                  "100", "--time-scale", "0.5"]
        rc, out = run(common + ["--dry-run"])
        bad = [w for w in WANT_DRY if w not in out]
        if rc != 0 or bad:
            print("FAIL: --dry-run exit %d, lacks %r:\n%s" % (rc, bad, out))
            return 1
        rc, out = run(common + ["--preset", "tiny", "--build", build])
        if rc == 77:
            print(out)
            return 77
        bad = [w for w in WANT_RUN if w not in out]
        if rc != 0 or bad:
            print("FAIL: exit %d, lacks %r:\n%s" % (rc, bad, out))
            return 1
    print(out)
    print("ok kvcache")
    return 0


if __name__ == "__main__":
    sys.exit(main())
