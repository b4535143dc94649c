#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../tools/python" "$0" "$@"'
# Loads a DeepSeek-V4.1 checkpoint in the release's format (docs/weights.md) into Hugging Face
# transformers' DeepseekV41ForCausalLM (fp32, eager) and runs the reference forward on token ids.
#
# Needs: torch, numpy, safetensors, and transformers with models/deepseek_v41 (the module of
# transformers main 0a2080b43eb64e6d448186a4f3f0bc9c618f4797; no PyPI release has it yet, see
# docs/golden.md). Importable (tests/golden/regen, benchmarks) or runnable:
#
#   tests/golden/ref_forward.py CKPT_DIR --ids 5,17,300            # logits stats per position
#   tests/golden/ref_forward.py CKPT_DIR --random 29 --seed 1 --greedy 8
#
# The checkpoint is read with safetensors' own parser and dequantized here in numpy, from the
# format description alone (fp8 e4m3 blocks, packed fp4 e2m1 groups, fp8 engram rows, ue8m0
# scales); nothing of Tandem's C code is used.

import json
import os
import sys
import time

import numpy as np  # noqa: E402
import safetensors  # noqa: E402

REFERENCE_COMMIT = "0a2080b43eb64e6d448186a4f3f0bc9c618f4797"


class CheckpointError(Exception):
    """A checkpoint this loader cannot map onto the reference module; the message names the tensor."""


# ---------------------------------------------------------------- number formats


def _e4m3fn_table():
    t = np.zeros(256, dtype=np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exp = (code >> 3) & 0xF
        man = code & 0x7
        if exp == 0xF and man == 0x7:
            t[code] = np.nan
        elif exp == 0:
            t[code] = sign * man / 8.0 * 2.0**-6
        else:
            t[code] = sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)
    return t.astype(np.float32)


E4M3FN = _e4m3fn_table()
E8M0 = np.array([2.0 ** (b - 127) if b != 255 else np.nan for b in range(256)], dtype=np.float64).astype(np.float32)
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                dtype=np.float32)


def decode(name, dtype, shape, data):
    """Plain (unpacked) tensor bytes -> float32 array. F8_E4M3 gives the bare e4m3 values,
    F8_E8M0 the power-of-two values (U8 is taken as stored e8m0 bytes only by the callers)."""
    buf = bytes(data)
    if dtype == "F32":
        return np.frombuffer(buf, dtype="<f4").reshape(shape).copy()
    if dtype == "F16":
        return np.frombuffer(buf, dtype="<f2").astype(np.float32).reshape(shape)
    if dtype == "BF16":
        u = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32).reshape(shape)
    if dtype == "F8_E4M3":
        return E4M3FN[np.frombuffer(buf, dtype=np.uint8)].reshape(shape)
    if dtype == "F8_E8M0":
        return E8M0[np.frombuffer(buf, dtype=np.uint8)].reshape(shape)
    raise CheckpointError(f"tensor '{name}': dtype {dtype} is not a float format this loader decodes")


def decode_scale(name, t):
    """A block-scale tensor (F8_E8M0, U8 holding e8m0 bytes, or F32/BF16/F16) -> float32."""
    if t["dtype"] == "U8":
        return E8M0[np.frombuffer(bytes(t["data"]), dtype=np.uint8)].reshape(t["shape"])
    return decode(name, t["dtype"], t["shape"], t["data"])


def dequant_fp8_block(name, w, scale, block):
    """fp8 e4m3 weight [R, C] with scale [ceil(R/br), ceil(C/bc)]: w * scale of its block."""
    rows, cols = w.shape
    br, bc = block
    want = (-(-rows // br), -(-cols // bc))
    if scale.shape != want:
        raise CheckpointError(f"tensor '{name}': scale shape {list(scale.shape)} does not tile weight "
                              f"{[rows, cols]} in {br}x{bc} blocks (expected {list(want)})")
    full = np.repeat(np.repeat(scale, br, axis=0), bc, axis=1)[:rows, :cols]
    return (w * full).astype(np.float32)


def dequant_fp4(name, packed, scale, logical_k=None):
    """Packed fp4 e2m1 weight: [R, K/2] bytes, element 2k in the low nibble and 2k+1 in the
    high nibble, with one scale per 32 along K ([R, K/32])."""
    rows = packed.shape[0]
    lo = E2M1[packed & 0x0F]
    hi = E2M1[packed >> 4]
    values = np.stack([lo, hi], axis=-1).reshape(rows, -1)
    k = values.shape[1] if logical_k is None else logical_k
    if scale.shape[0] != rows or scale.shape[1] == 0 or k % scale.shape[1]:
        raise CheckpointError(f"tensor '{name}': scale shape {list(scale.shape)} does not fit packed fp4 "
                              f"weight of {rows} x {k} values")
    group = k // scale.shape[1]
    return (values[:, :k] * np.repeat(scale, group, axis=1)).astype(np.float32)


def dequant_fp8_rows(name, w, scale):
    """Engram table: fp8 e4m3 rows [rows, dim] with one scale per row and 32 channels."""
    rows, dim = w.shape
    if scale.shape[0] != rows or scale.shape[1] == 0 or dim % scale.shape[1]:
        raise CheckpointError(f"tensor '{name}': scale shape {list(scale.shape)} does not fit rows {[rows, dim]}")
    return (w * np.repeat(scale, dim // scale.shape[1], axis=1)).astype(np.float32)


# ---------------------------------------------------------------- checkpoint


def read_raw(ckpt_dir):
    """{name: {"dtype", "shape", "data"}} from model.safetensors or the shards listed in
    model.safetensors.index.json, parsed by safetensors.deserialize."""
    index = os.path.join(ckpt_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    raw = {}
    for shard in shards:
        with open(os.path.join(ckpt_dir, shard), "rb") as f:
            for name, t in safetensors.deserialize(f.read()):
                if name in raw:
                    raise CheckpointError(f"tensor '{name}' appears twice ({shard})")
                raw[name] = t
    return raw


IGNORED_PREFIXES = ("mtp.", "vision.", "aligner.")
IGNORED_NAMES = ("image_start", "image_end", "image_newline")


def module_name(release_name):
    """Release tensor name -> DeepseekV41ForCausalLM parameter name (docs/golden.md)."""
    if release_name == "head.weight":
        return "lm_head.weight"
    return "model." + release_name


def release_state(ckpt_dir, block=(32, 32)):
    """Every backbone tensor of the checkpoint as float32, keyed by the module's parameter
    names, quantized weights dequantized; returns (state, report) where report counts what
    was done."""
    raw = read_raw(ckpt_dir)
    state = {}
    report = {"float": 0, "fp8_block": 0, "fp4_group": 0, "fp8_rows": 0, "ignored": 0}
    for name in sorted(raw):
        t = raw[name]
        if name.startswith(IGNORED_PREFIXES) or ".mtp." in name or name in IGNORED_NAMES:
            report["ignored"] += 1
            continue
        if name.endswith(".scale") and not name.endswith("engram.embed.scale"):
            owner = name[: -len(".scale")] + ".weight"
            if owner not in raw:
                raise CheckpointError(f"tensor '{name}': a scale with no '{owner}'")
            continue  # consumed with its weight
        dtype, shape = t["dtype"], t["shape"]
        if name.endswith("engram.embed.scale"):
            weight = raw.get(name[: -len(".scale")] + ".weight")
            if weight is not None and weight["dtype"] == "F8_E4M3":
                # folded into the dequantized table below; a float table takes no scale
                # (DeepseekV41EngramEmbedding ignores it unless its weight is fp8)
                state[module_name(name)] = np.ones(shape, dtype=np.float32)
            else:
                state[module_name(name)] = decode(name, dtype, shape, t["data"])
            report["float"] += 1
            continue
        scale_name = name[: -len(".weight")] + ".scale" if name.endswith(".weight") else None
        scale = raw.get(scale_name) if scale_name else None
        if dtype == "F8_E4M3" and scale is not None:
            w = decode(name, dtype, shape, t["data"])
            s = decode_scale(scale_name, scale)
            if name.endswith("engram.embed.weight"):
                state[module_name(name)] = dequant_fp8_rows(name, w, s)
                report["fp8_rows"] += 1
            else:
                state[module_name(name)] = dequant_fp8_block(name, w, s, block)
                report["fp8_block"] += 1
        elif dtype in ("I8", "U8", "F4") and scale is not None:
            packed = np.frombuffer(bytes(t["data"]), dtype=np.uint8).reshape(shape[0], -1)
            k = shape[1] if dtype == "F4" else None
            state[module_name(name)] = dequant_fp4(name, packed, decode_scale(scale_name, scale), k)
            report["fp4_group"] += 1
        elif dtype in ("F8_E4M3", "I8", "U8", "F4"):
            raise CheckpointError(f"tensor '{name}': {dtype} without its '{scale_name}'")
        else:
            state[module_name(name)] = decode(name, dtype, shape, t["data"])
            report["float"] += 1
    return state, report


# ---------------------------------------------------------------- model


def reference_module():
    """The transformers module of the reference (ImportError with a hint when missing)."""
    import contextlib
    import io
    import logging
    import warnings

    # Cosmetic only: 5.24's auto_docstring prints an "[ERROR]" line per class of a module not in
    # its tables, and 5.24 renamed the cache argument (`past_key_values` -> `cache`) of the mask
    # helper and of model outputs, which it reports as deprecations.
    logging.getLogger("transformers.utils.generic").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*past_key_values.*create_sliding_window_causal_mask", category=FutureWarning)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            from transformers.models.deepseek_v41 import modeling_deepseek_v41 as modeling
            from transformers.models.deepseek_v41.configuration_deepseek_v41 import DeepseekV41Config
    except ImportError as e:
        raise ImportError(f"transformers has no complete models/deepseek_v41 ({e}); docs/golden.md says how to "
                          f"install the module of transformers {REFERENCE_COMMIT}") from e
    if not hasattr(modeling, "DeepseekV41ForCausalLM"):
        raise ImportError("transformers.models.deepseek_v41.modeling_deepseek_v41 has no DeepseekV41ForCausalLM "
                          "(only the token-map function?); docs/golden.md says how to install the full module")
    return modeling, DeepseekV41Config


def load_model(ckpt_dir, bind_tokenizer=True):
    """DeepseekV41ForCausalLM in fp32 with eager attention, the checkpoint loaded with
    load_state_dict(strict=True), the tokenizer bound when the config has engram layers.
    Returns (model, info)."""
    import torch
    from transformers import PreTrainedTokenizerFast

    modeling, config_class = reference_module()
    with open(os.path.join(ckpt_dir, "config.json")) as f:
        config_dict = json.load(f)
    quant = config_dict.pop("quantization_config", None)  # dequantized here: the model is float
    block = tuple(quant.get("weight_block_size", [128, 128])) if quant else (32, 32)
    config = config_class.from_dict(config_dict)
    model = modeling.DeepseekV41ForCausalLM._from_config(config, attn_implementation="eager", dtype=torch.float32)
    state, report = release_state(ckpt_dir, block)
    try:
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    except RuntimeError as e:  # missing / unexpected keys, shape mismatches, all listed by torch
        raise CheckpointError(f"does not fit DeepseekV41ForCausalLM (module names: 'model.' + checkpoint name, "
                              f"lm_head.weight = head.weight): {e}") from e
    model.eval()
    tokenizer = None
    if bind_tokenizer and model.config.engram_layer_ids:
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(ckpt_dir, "tokenizer.json"))
        model.model.bind_tokenizer(tokenizer)
    info = {"tensors": report, "quantization_config": quant, "attn_implementation": model.config._attn_implementation,
            "dtype": str(model.dtype).replace("torch.", ""), "tokenizer_bound": tokenizer is not None}
    return model, info


class TopkTies:
    """Context in which every torch.topk resolves ties at its boundary to the lowest index,
    and counts such ties per call site (rule="torch" keeps torch's own order, still counting).

    torch.topk leaves the order of equal values unspecified, and small configs tie often: the
    indexer's ReLU'd scores are exactly 0.0 for keys that every head scores negatively, and
    fp4-quantized keys collide. The chosen set then depends on torch's kernel. Under the
    "lowest" rule the k largest values are taken by a stable descending sort; values and
    indices equal torch's wherever no tie straddles the boundary (the order of the indexer's
    unsorted picks is not used by the reference)."""

    def __init__(self, rule="lowest"):
        if rule not in ("lowest", "torch"):
            raise ValueError(f"top-k tie rule '{rule}': expected 'lowest' or 'torch'")
        self.rule = rule
        self.ties = {}  # call site -> [rows, rows whose k-th and (k+1)-th values are equal and finite]
        self._modes = []

    def _topk(self, func, args, kwargs):
        import torch

        x = args[0]
        k = args[1] if len(args) > 1 else kwargs["k"]
        dim = kwargs.get("dim", args[2] if len(args) > 2 else -1)
        if dim not in (-1, x.dim() - 1) or not kwargs.get("largest", True):
            raise RuntimeError("TopkTies: only largest-k over the last dimension is handled")
        values, indices = torch.sort(x, dim=-1, descending=True, stable=True)
        frame = sys._getframe(2)
        site = type(frame.f_locals["self"]).__name__ if "self" in frame.f_locals else frame.f_code.co_name
        rows = values.reshape(-1, values.shape[-1])
        count = self.ties.setdefault(site, [0, 0])
        count[0] += rows.shape[0]
        if k < rows.shape[1]:
            b, nxt = rows[:, k - 1], rows[:, k]
            count[1] += int(((b == nxt) & torch.isfinite(b)).sum())
        if self.rule == "torch":
            return func(*args, **kwargs)
        return torch.return_types.topk((values[..., :k], indices[..., :k]))

    def __enter__(self):
        import torch
        from torch.overrides import TorchFunctionMode

        owner = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func in (torch.Tensor.topk, torch.topk):
                    return owner._topk(func, args, kwargs)
                return func(*args, **kwargs)

        mode = Mode()
        mode.__enter__()
        self._modes.append(mode)
        return self

    def __exit__(self, *exc):
        return self._modes.pop().__exit__(*exc)


def _ties(ties):
    """A TopkTies as given, one for a rule name, or no interception at all for None (torch's
    own order at full speed: what a benchmark of transformers should use)."""
    if ties is None:
        import contextlib

        return contextlib.nullcontext()
    return ties if isinstance(ties, TopkTies) else TopkTies(ties)


def new_sequence(model):
    """Forget the engram n-gram history of an earlier sequence (it lives on the model, not the
    cache). The reference never reads a stale entry at positions it has not rewritten, so this
    changes no result; it keeps each sequence independent of the ones before it."""
    hash_state = model.model.engram_hash_state
    if hash_state is not None:
        hash_state.history = None


def new_cache(model):
    from transformers.cache_utils import DynamicCache

    return DynamicCache(config=model.config)


def prefill_logits(model, ids, ties="lowest"):
    """The one-shot forward of a fresh sequence: model(input_ids) on a new DynamicCache, as the
    config's default use_cache=True does (the reference's cache path). float32 [S, vocab]."""
    import torch

    new_sequence(model)
    with _ties(ties), torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long), past_key_values=new_cache(model), use_cache=True)
    return out.logits[0].numpy()


def chunked_logits(model, ids, chunk, ties="lowest"):
    """The prompt fed through one cache `chunk` tokens per call. float32 [S, vocab]."""
    import torch

    new_sequence(model)
    cache = new_cache(model)
    rows = []
    with _ties(ties), torch.no_grad():
        for s in range(0, len(ids), chunk):
            out = model(torch.tensor([ids[s:s + chunk]], dtype=torch.long), past_key_values=cache, use_cache=True)
            rows.append(out.logits[0].numpy())
    return np.concatenate(rows)


def no_cache_logits(model, ids, ties="lowest"):
    """model(input_ids, use_cache=False): the reference's path without a cache."""
    import torch

    new_sequence(model)
    with _ties(ties), torch.no_grad():
        return model(torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0].numpy()


def greedy(model, ids, steps, ties="lowest"):
    """Greedy decoding with the reference's cache: prefill, then one token per call.
    Returns (tokens, step_logits [steps, vocab]); step_logits[i] chose tokens[i]."""
    import torch

    new_sequence(model)
    cache = new_cache(model)
    tokens, rows = [], []
    with _ties(ties), torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long), past_key_values=cache, use_cache=True)
        while True:
            row = out.logits[0, -1]
            nxt = int(row.argmax())
            tokens.append(nxt)
            rows.append(row.numpy().copy())
            if len(tokens) == steps:
                break
            out = model(torch.tensor([[nxt]], dtype=torch.long), past_key_values=out.past_key_values, use_cache=True)
    return tokens, np.stack(rows)


def generate_tokens(model, ids, steps, ties="lowest"):
    """The same greedy continuation through model.generate(do_sample=False)."""
    import torch

    new_sequence(model)
    with _ties(ties), torch.no_grad():
        out = model.generate(torch.tensor([ids], dtype=torch.long), max_new_tokens=steps, min_new_tokens=steps,
                             do_sample=False)
    return out[0, len(ids):].tolist()


def stats(logits):
    """Per-position summary lines of float32 logits [S, vocab]."""
    lines = []
    for i, row in enumerate(logits):
        top = np.argsort(-row, kind="stable")[:3]
        lines.append(f"pos {i:4d}: mean {row.mean():+.6f} std {row.std():.6f} min {row.min():+.6f} "
                     f"max {row.max():+.6f} top " + " ".join(f"{t}:{row[t]:+.5f}" for t in top))
    return lines


def _main(argv):
    import argparse

    ap = argparse.ArgumentParser(description="Run the transformers DeepSeek-V4.1 reference forward on a checkpoint.")
    ap.add_argument("ckpt", help="checkpoint directory (config.json, model.safetensors[.index.json], tokenizer.json)")
    ap.add_argument("--ids", help="comma-separated token ids")
    ap.add_argument("--random", type=int, metavar="N", help="N random non-special token ids")
    ap.add_argument("--seed", type=int, default=0, help="seed for --random (default 0)")
    ap.add_argument("--greedy", type=int, default=0, metavar="K", help="also generate K greedy tokens with the cache")
    ap.add_argument("--ties", choices=("lowest", "torch", "none"), default="lowest",
                    help="top-k ties: lowest index first (default, as the fixtures), torch's own order, or "
                         "torch's order without interception (for timing)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    args = ap.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    try:
        model, info = load_model(args.ckpt)
    except (CheckpointError, ImportError, OSError) as e:
        print(f"ref_forward: {args.ckpt}: {e}", file=sys.stderr)
        return 1
    t1 = time.perf_counter()
    if args.ids:
        ids = [int(x) for x in args.ids.split(",") if x.strip()]
    else:
        rng = np.random.default_rng(args.seed)
        allowed = [i for i in range(model.config.vocab_size) if i not in special_ids(args.ckpt)]
        ids = [int(x) for x in rng.choice(allowed, size=args.random or 8)]
    print(f"loaded {args.ckpt} in {t1 - t0:.2f} s: {info}")
    print("ids:", ",".join(map(str, ids)))
    ties = TopkTies(args.ties) if args.ties != "none" else None
    logits = prefill_logits(model, ids, ties)
    t2 = time.perf_counter()
    print(f"forward of {len(ids)} tokens: {t2 - t1:.3f} s, logits {list(logits.shape)}")
    print("\n".join(stats(logits)))
    if ties is not None:
        print("top-k calls and boundary ties per site:", {k: tuple(v) for k, v in sorted(ties.ties.items())})
    if args.greedy:
        tokens, _ = greedy(model, ids, args.greedy, ties)
        print(f"greedy ({time.perf_counter() - t2:.3f} s):", ",".join(map(str, tokens)))
    return 0


def special_ids(ckpt_dir):
    """Ids of the tokenizer's added tokens marked special."""
    with open(os.path.join(ckpt_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    return {t["id"] for t in tok.get("added_tokens", []) if t.get("special")}


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
