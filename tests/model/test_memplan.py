#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../tools/python" "$0" "$@"'
# tests/model/test_memplan.py — tools/memplan: its weight bytes equal the
# bytes of real checkpoints (tools/mk-tiny-model's, float, fp8 and fp8+fp4,
# bf16 and f32) bound by the C front end (--checkpoint); on the released
# V4.1-Flash config its expert, engram-table and KV figures equal the ones
# computed here from the config by hand, and its per-GPU lines add up to the
# GPU's HBM; --released covers H200, B200 and GB200 at DEP 4 and 8; bad
# arguments exit 2 with a message (docs/memplan.md).
#
# Usage: test_memplan.py MEMPLAN MK_TINY_MODEL ROOT
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

MEMPLAN, MK, ROOT = sys.argv[1:4]
H200 = os.path.join(ROOT, "deploy/profiles/h200.json")
FLASH = os.path.join(ROOT, "deploy/models/deepseek-v41-flash.json")
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, flush=True)


def run(*args, want=0):
    r = subprocess.run([MEMPLAN, *args], capture_output=True, text=True, timeout=60)
    check(r.returncode == want, "memplan %s: exit %d, expected %d: %s" %
          (" ".join(args), r.returncode, want, (r.stdout + r.stderr)[-600:]))
    return r.stdout + r.stderr


# 1. real checkpoints: the plan's weight bytes are the bound tensors' bytes
tmp = tempfile.mkdtemp(prefix="memplan-")
try:
    for label, extra in (("tiny", []), ("tiny-fp8+fp4", ["--quant", "fp8+fp4"]),
                         ("noengram-f32-fp8", ["--preset", "tiny-noengram", "--dtype", "f32",
                                               "--quant", "fp8"])):
        d = os.path.join(tmp, label)
        subprocess.run([MK, *extra, d], check=True, capture_output=True, timeout=120)
        out = run("--model", d, "--profile", H200, "--dep", "1,2", "--checkpoint", d)
        m = re.search(r"checkpoint .*: (\d+) bytes bound, (\d+) planned: (\w+)", out)
        check(m and m.group(3) == "equal" and m.group(1) == m.group(2),
              "%s: the plan's bytes against the checkpoint's: %r" % (label, out[:800]))
        check(out.count("fits: yes") == 2, "%s: a tiny model does not fit an H200: %s" %
              (label, out))
        print("%s: %s" % (label, m.group(0) if m else "no checkpoint line"), flush=True)
finally:
    shutil.rmtree(tmp, ignore_errors=True)

# 2. the released config, against the config by hand
with open(FLASH) as f:
    cfg = json.load(f)
t = cfg["text_config"]
L, H, E, I = (t["num_hidden_layers"], t["hidden_size"], t["n_routed_experts"],
              t["moe_intermediate_size"])
experts = L * E * 3 * H * I * (0.5 + 1 / 32)          # fp4 codes + a ue8m0 scale per 32
tables = sum(t["engram_num_embeddings"]) * t["engram_head_dim"] * (1 + 1 / 32)
out = run("--model", FLASH, "--profile", H200, "--dep", "4,8", "--engram", "shard")
m = re.search(r"routed experts ([\d.]+) GB, engram tables ([\d.]+) GB", out)
check(m and abs(float(m.group(1)) - experts / 1e9) < 0.006 and
      abs(float(m.group(2)) - tables / 1e9) < 0.006,
      "experts / tables %r, by hand %.2f / %.2f GB" % (m and m.groups(), experts / 1e9,
                                                       tables / 1e9))
# paged KV per token: fp4 compressed KV (e2m1 + e4m3 per 16) and fp4 indexer keys
# (e2m1 + ue8m0 per 32) of each KV-source layer, over its compression ratio
ratios = t["compress_ratios"][:L]
kv_entry = t["head_dim"] / 2 + t["head_dim"] / 16
idx_entry = t["index_head_dim"] / 2 + t["index_head_dim"] / 32
src = t.get("kv_source_layer_ids") or [i for i in range(L) if ratios[i] and
                                       (i == 0 or ratios[i - 1] != ratios[i])]
isrc = t.get("index_source_layer_ids") or src
paged = sum((kv_entry + (idx_entry if i in isrc else 0)) / ratios[i] for i in src)
m = re.search(r"KV: ([\d.]+) bytes a token paged", out)
check(m and abs(float(m.group(1)) - paged) < 0.05, "KV %r, by hand %.1f" %
      (m and m.group(1), paged))
# each plan's lines add up to the HBM
for block in out.split("\n\n")[1:]:
    vals = [float(v) for v in re.findall(r"^  \S.*?\s+(-?[\d.]+)$", block, re.M)]
    check(len(vals) == 7 and abs(vals[0] - sum(vals[1:])) < 0.05,
          "a plan's lines do not add up to its HBM: %r" % vals)
check(out.count("fits: yes") == 2, "the released model sharded on H200: %s" % out)
print(out, flush=True)

# 3. --released: three GPUs, two DEP sizes, three placements
out = run("--released", "--root", ROOT)
rows = [l for l in out.splitlines() if re.match(r"\| [A-Z]", l) and "GPU |" not in l]
check(len(rows) == 18, "--released: %d rows, expected 18" % len(rows))
check(all(" no |" in r for r in rows if "| replicate |" in r),
      "the released model's engram tables fit every GPU whole")
check(all(" yes |" in r for r in rows if "| shard |" in r or "| host |" in r),
      "a sharded or host placement does not fit")
print(out, flush=True)

# 4. bad arguments and files
for args in (["--model", FLASH], ["--dep", "0", "--model", FLASH, "--profile", H200],
             ["--engram", "gpu", "--model", FLASH, "--profile", H200],
             ["--context", "x", "--model", FLASH, "--profile", H200],
             ["--reserve-gib", "-1", "--model", FLASH, "--profile", H200],
             ["--hbm-gb", "0", "--model", FLASH, "--profile", H200]):
    out = run(*args, want=2)
    check(out.strip(), "memplan %s: no message" % " ".join(args))
out = run("--model", FLASH, "--profile", H200, "--dep", "8", "--hbm-gb", "150")
check("HBM                                                 150.00" in out, "--hbm-gb: %r" % out)
out = run("--model", "/nonexistent", "--profile", H200, want=1)
check("/nonexistent" in out, "a missing config is not named: %r" % out)
out = run("--model", FLASH, "--profile", H200, "--engram", "replicate", "--dep", "8", want=3)
check("fits: NO" in out, "a plan that does not fit: %r" % out)

print("test_memplan: %s" % ("all checks passed" if failures == 0 else "%d failed" % failures))
sys.exit(1 if failures else 0)
