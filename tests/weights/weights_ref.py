#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../tools/python" "$0" "$@"'
"""tests/weights/weights_ref.py — reference side of the safetensors/quant tests.

Needs python3 with safetensors (>= 0.6, for the F8_E8M0 and F4 dtype codes) and
numpy; no torch, no network. Expected values are computed here independently of
ckpt/quant.c: decoders by formula or numpy, encoders and quantizers by exact
rational arithmetic (fractions) over each format's value grid.

  weights_ref.py gen DIR      write fixtures + manifest.json into DIR
  weights_ref.py check DIR    check the files the C side wrote into DIR/c
  weights_ref.py run EXE      gen into a temp dir, run `EXE DIR`, then check
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
from fractions import Fraction

import numpy as np
import safetensors

if not hasattr(safetensors, "TensorSpec"):
    sys.exit("weights_ref.py: safetensors %s has no TensorSpec (F8_E8M0/F4 writing); "
             "need >= 0.8" % getattr(safetensors, "__version__", "?"))
TensorSpec = safetensors.TensorSpec

# ---------------------------------------------------------------- formats

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e4m3_value(code):
    """e4m3fn code -> float (NaN for 0x7F/0xFF), by the format's definition."""
    code = int(code)
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 7
    if e == 15 and m == 7:
        return math.copysign(math.nan, sign)
    if e == 0:
        return sign * m * 2.0 ** -9
    return sign * (1 + m / 8) * 2.0 ** (e - 7)


def e5m2_value(code):
    return float(np.array([int(code) << 8], dtype=np.uint16).view(np.float16)[0])


def e8m0_value(code):
    code = int(code)
    return math.nan if code == 255 else 2.0 ** (code - 127)


def e2m1_value(code):
    code = int(code)
    v = E2M1[code & 7]
    return -v if code & 8 else v


def nearest_even(x, grid, overflow):
    """Code of the grid value nearest to |x| (exact), ties to the even code.
    grid: ascending [(Fraction value, code)] from zero; `overflow` a virtual
    (value, code) past the top. Returns the code or None when |x| rounds to
    or past the overflow value."""
    a = abs(Fraction(x))
    pts = grid + [overflow]
    if a >= pts[-1][0]:
        return None
    for (lo, lc), (hi, hc) in zip(pts, pts[1:]):
        if lo <= a <= hi:
            dl, dh = a - lo, hi - a
            if dl < dh or (dl == dh and lc % 2 == 0):
                return lc
            return None if (hi, hc) == overflow else hc
    raise AssertionError(x)


E4M3_GRID = [(Fraction(e4m3_value(c)), c) for c in range(0x7F)]
E5M2_GRID = [(Fraction(e5m2_value(c)), c) for c in range(0x7C)]
E2M1_GRID = [(Fraction(v), c) for c, v in enumerate(E2M1)]


def enc_e4m3(x):
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    if math.isnan(x) or math.isinf(x):
        return 0x7F | sign
    c = nearest_even(x, E4M3_GRID, (Fraction(480), 0x7F))
    return (0x7F if c is None else c) | sign


def enc_e5m2(x):
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    if math.isnan(x):
        return 0x7F | sign
    if math.isinf(x):
        return 0x7C | sign
    c = nearest_even(x, E5M2_GRID, (Fraction(65536), 0x7C))
    return (0x7C if c is None else c) | sign


def enc_e2m1(x):
    """Nearest code, ties to even, saturating at 6; sign from the sign bit."""
    sign = 8 if math.copysign(1.0, x) < 0 else 0
    if math.isnan(x):
        return sign
    c = nearest_even(min(abs(x), 6.0), E2M1_GRID, (Fraction(8), 8))
    return c | sign


def enc_bf16(x):
    """f32 -> bf16 bits, nearest even by exact comparison of the two neighbours."""
    if math.isnan(x):
        return 0x7FC0
    bits = int(np.array([x], dtype=np.float32).view(np.uint32)[0])
    sign, mag = bits & 0x80000000, bits & 0x7FFFFFFF
    if mag == 0x7F800000:
        return (sign | mag) >> 16
    lo = mag >> 16                      # truncation toward zero
    hi = lo + 1
    def val(h):
        return Fraction(float(np.array([h << 16], dtype=np.uint32).view(np.float32)[0])) \
            if h < 0x7F80 else None
    a = abs(Fraction(float(np.float32(x))))
    vlo = val(lo)
    if vlo == a:
        return (sign >> 16) | lo
    vhi = val(hi)
    if vhi is None:                     # next is inf: halfway point is max + ulp/2
        vhi = Fraction(2) ** 128
    dl, dh = a - vlo, vhi - a
    pick = lo if (dl < dh or (dl == dh and lo % 2 == 0)) else hi
    return (sign >> 16) | pick


def enc_f16(x):
    return int(np.array([x], dtype=np.float32).astype(np.float16).view(np.uint16)[0])


def enc_e8m0(x):
    """torch's rule, restated on values: the exponent of |x|, plus one when the
    significand is >= 1.5; f32 subnormals above 2^-127 go to 2^-126."""
    if math.isnan(x) or math.isinf(x):
        return 255
    a = abs(float(np.float32(x)))
    if a == 0.0:
        return 0
    m, e = math.frexp(a)                # a = m * 2^e, m in [0.5, 1)
    exp = e - 1                         # a = (2m) * 2^exp
    if exp < -126:                      # f32 subnormal: biased exponent 0
        return 1 if a > 2.0 ** -127 else 0
    return exp + 127 + (1 if 2 * m >= 1.5 else 0)


def ceil_pow2_code(t):
    """ue8m0 code of 2^ceil(log2 t), t a positive float (exact)."""
    t = max(t, 2.0 ** -126)
    m, e = math.frexp(t)
    k = e - 1 if m == 0.5 else e
    return min(k + 127, 254)


# ---------------------------------------------------------------- quantizers

def f32(v):
    return np.float32(v)


def q_fp8_block(x, br, bc):
    rows, cols = x.shape
    sr, sc = -(-rows // br), -(-cols // bc)
    q = np.zeros((rows, cols), np.uint8)
    s = np.zeros((sr, sc), np.uint8)
    for bi in range(sr):
        for bj in range(sc):
            blk = x[bi * br:(bi + 1) * br, bj * bc:(bj + 1) * bc]
            amax = f32(np.max(np.abs(blk)))
            code = 127 if amax == 0 else ceil_pow2_code(float(amax * f32(1.0 / 448.0)))
            s[bi, bj] = code
            scale = f32(2.0 ** (code - 127))
            for (i, j), v in np.ndenumerate(blk):
                y = float(np.clip(f32(v) / scale, -448.0, 448.0))
                q[bi * br + i, bj * bc + j] = enc_e4m3(y)
    return q, s


def q_fp4(x):
    rows, cols = x.shape
    packed = np.zeros((rows, cols // 2), np.uint8)
    s = np.zeros((rows, cols // 32), np.uint8)
    for i in range(rows):
        for g in range(cols // 32):
            blk = x[i, g * 32:(g + 1) * 32]
            amax = max(f32(np.max(np.abs(blk))), f32(6.0 * 2.0 ** -126))
            code = ceil_pow2_code(float(f32(amax) * f32(1.0 / 6.0)))
            s[i, g] = code
            scale = f32(2.0 ** (code - 127))
            codes = [enc_e2m1(float(np.clip(f32(v) / scale, -6.0, 6.0))) for v in blk]
            for k in range(16):
                packed[i, g * 16 + k] = codes[2 * k] | (codes[2 * k + 1] << 4)
    return packed, s


def q_fp8_rows(x, group):
    rows, cols = x.shape
    q = np.zeros((rows, cols), np.uint8)
    s = np.zeros((rows, cols // group), np.uint8)
    for i in range(rows):
        for g in range(cols // group):
            blk = x[i, g * group:(g + 1) * group]
            amax = max(f32(np.max(np.abs(blk))), f32(1e-4))
            code = ceil_pow2_code(float(f32(amax) * f32(1.0 / 448.0)))
            s[i, g] = code
            scale = f32(2.0 ** (code - 127))
            for j, v in enumerate(blk):
                q[i, g * group + j] = enc_e4m3(float(np.clip(f32(v) / scale, -448.0, 448.0)))
    return q, s


# ---------------------------------------------------------------- writing

TORCH_NAME = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16",
    "BF16": "bfloat16", "F32": "float32", "F64": "float64", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu", "F4": "float4_e2m1fn_x2",
}


def write_st(path, tensors, metadata=None):
    """tensors: {name: (dtype code, logical shape, bytes)} -> safetensors' own writer."""
    keep, specs = [], {}
    for name, (dt, shape, raw) in tensors.items():
        buf = np.frombuffer(raw, dtype=np.uint8).copy() if raw else np.zeros(1, np.uint8)
        keep.append(buf)
        spec_shape = list(shape)
        if dt == "F4":                  # the constructor doubles the last dim
            spec_shape[-1] //= 2
        specs[name] = TensorSpec(dtype=TORCH_NAME[dt], shape=spec_shape,
                                 data_ptr=buf.ctypes.data, data_len=len(raw))
    safetensors.serialize_file(specs, path, metadata=metadata)
    del keep


def f32_file(path, values):
    np.asarray(values, dtype=np.float32).tofile(path)


def gen(d):
    rng = np.random.default_rng(1234)
    man = {"decode": [], "dequant": [], "encode": [], "quant": []}

    # -- every code of every small format, plus ints and floats ------------
    t = {}
    exp = {}
    all8 = np.arange(256, dtype=np.uint8)
    all16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    t["bf16"] = ("BF16", [256, 256], all16.tobytes())
    exp["bf16"] = (all16.astype(np.uint32) << 16).view(np.float32)
    t["f16"] = ("F16", [65536], all16.tobytes())
    exp["f16"] = all16.view(np.float16).astype(np.float32)
    t["e4m3"] = ("F8_E4M3", [16, 16], all8.tobytes())
    exp["e4m3"] = [e4m3_value(c) for c in range(256)]
    t["e5m2"] = ("F8_E5M2", [256], all8.tobytes())
    exp["e5m2"] = [e5m2_value(c) for c in range(256)]
    t["e8m0"] = ("F8_E8M0", [256], all8.tobytes())
    exp["e8m0"] = [e8m0_value(c) for c in range(256)]
    t["fp4"] = ("F4", [2, 256], all8.tobytes())
    exp["fp4"] = [e2m1_value(n) for b in range(256) for n in (b & 15, b >> 4)]
    t["i8"] = ("I8", [256], all8.tobytes())
    exp["i8"] = all8.view(np.int8).astype(np.float32)
    t["u8"] = ("U8", [4, 64], all8.tobytes())
    exp["u8"] = all8.astype(np.float32)
    b = np.array([0, 1, 1, 0, 1], np.uint8)
    t["bool"] = ("BOOL", [5], b.tobytes())
    exp["bool"] = b.astype(np.float32)
    i16 = np.array([-32768, -1, 0, 1, 12345, 32767], np.int16)
    t["i16"] = ("I16", [6], i16.tobytes())
    exp["i16"] = i16.astype(np.float32)
    u16 = np.array([0, 1, 65535, 4242], np.uint16)
    t["u16"] = ("U16", [2, 2], u16.tobytes())
    exp["u16"] = u16.astype(np.float32)
    i32 = np.array([-2**31, -7, 0, 9, 2**24, 2**31 - 1], np.int32)
    t["i32"] = ("I32", [3, 2], i32.tobytes())
    exp["i32"] = i32.astype(np.float32)
    u32 = np.array([0, 3, 2**32 - 1], np.uint32)
    t["u32"] = ("U32", [3], u32.tobytes())
    exp["u32"] = u32.astype(np.float32)
    i64 = np.array([-2**63, -5, 0, 2**40 + 3, 2**63 - 1], np.int64)
    t["i64"] = ("I64", [5], i64.tobytes())
    exp["i64"] = i64.astype(np.float32)
    u64 = np.array([0, 2**64 - 1, 17], np.uint64)
    t["u64"] = ("U64", [3], u64.tobytes())
    exp["u64"] = u64.astype(np.float32)
    f64 = np.array([0.0, -0.0, 1.0 / 3.0, 1e300, -1e-300, math.inf, math.nan, 2.5], np.float64)
    t["f64"] = ("F64", [8], f64.tobytes())
    exp["f64"] = f64.astype(np.float32)
    f32v = np.concatenate([np.array([0.0, -0.0, 1.0, -1.5, 3.4028235e38, 1e-45, -1e-40,
                                     math.inf, -math.inf, math.nan], np.float32),
                           rng.standard_normal(54).astype(np.float32)])
    t["f32"] = ("F32", [8, 8], f32v.tobytes())
    exp["f32"] = f32v
    t["scalar"] = ("F32", [], np.array([2.75], np.float32).tobytes())
    exp["scalar"] = [2.75]
    t["empty"] = ("F32", [0, 3], b"")
    exp["empty"] = []
    write_st(os.path.join(d, "dtypes.safetensors"), t,
             metadata={"format": "pt", "note": "all codes"})
    for name in t:
        f32_file(os.path.join(d, name + ".f32"), exp[name])
        man["decode"].append({"file": "dtypes.safetensors", "tensor": name,
                              "expect": name + ".f32"})

    # -- sharded copy of the same tensors: index + 3 shards ----------------
    shard_dir = os.path.join(d, "sharded")
    os.makedirs(shard_dir)
    names = sorted(t)
    wmap = {}
    for k in range(3):
        part = {n: t[n] for n in names[k::3]}
        fname = "model-%05d-of-00003.safetensors" % (k + 1)
        write_st(os.path.join(shard_dir, fname), part, metadata={"format": "pt"})
        wmap.update({n: fname for n in part})
    total = sum(len(t[n][2]) for n in names)
    with open(os.path.join(shard_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)
    man["sharded"] = {"dir": "sharded", "same_as": "dtypes.safetensors"}

    # -- block-scaled layouts ----------------------------------------------
    t = {}
    finite8 = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)

    def fp8_case(name, rows, cols, srows, scols, br, bc, scale_dt="F8_E8M0", nan=False):
        q = rng.choice(finite8, size=(rows, cols)).astype(np.uint8)
        if nan:
            q[0, 0] = 0x7F
        if scale_dt in ("F8_E8M0", "U8"):
            s = rng.integers(110, 140, size=(srows, scols)).astype(np.uint8)
            sv = np.vectorize(e8m0_value)(s).astype(np.float32)
            sraw = s.tobytes()
        else:
            sv = (rng.random((srows, scols)) * 0.01 + 1e-4).astype(np.float32)
            sraw = sv.tobytes()
        t[name] = ("F8_E4M3", [rows, cols], q.tobytes())
        t[name + ".scale"] = (scale_dt, [srows, scols], sraw)
        val = np.vectorize(e4m3_value)(q).astype(np.float32)
        rb = br if br else rows // srows
        cb = bc if bc else cols // scols
        full = np.repeat(np.repeat(sv, rb, axis=0), cb, axis=1)[:rows, :cols]
        f32_file(os.path.join(d, name + ".f32"), val * full)
        man["dequant"].append({"file": "blocks.safetensors", "weight": name,
                               "scale": name + ".scale", "block": [br, bc],
                               "expect": name + ".f32"})

    fp8_case("w32", 64, 96, 2, 3, 0, 0, nan=True)            # V4.1 32x32
    fp8_case("w32edge", 40, 70, 2, 3, 32, 32)                 # partial edge blocks
    fp8_case("w128", 256, 128, 2, 1, 128, 128)                # V4 128x128
    fp8_case("w128f32", 128, 256, 1, 2, 128, 128, "F32")      # V3-style f32 scale
    fp8_case("engram", 5, 256, 5, 8, 0, 0)                    # per-row, per-32
    fp8_case("engramu8", 3, 64, 3, 2, 1, 32, "U8")

    def fp4_case(name, rows, k, packed_dt):
        codes = rng.integers(0, 256, size=(rows, k // 2)).astype(np.uint8)
        s = rng.integers(115, 135, size=(rows, k // 32)).astype(np.uint8)
        shape = [rows, k] if packed_dt == "F4" else [rows, k // 2]
        t[name] = (packed_dt, shape, codes.tobytes())
        t[name + ".scale"] = ("F8_E8M0", [rows, k // 32], s.tobytes())
        vals = np.array([[e2m1_value(n) for b in row for n in (b & 15, b >> 4)] for row in codes],
                        np.float32)
        sv = np.repeat(np.vectorize(e8m0_value)(s).astype(np.float32), 32, axis=1)
        f32_file(os.path.join(d, name + ".f32"), vals * sv)
        man["dequant"].append({"file": "blocks.safetensors", "weight": name,
                               "scale": name + ".scale", "block": [0, 0],
                               "expect": name + ".f32"})

    fp4_case("expert", 4, 128, "I8")
    fp4_case("expertu8", 2, 64, "U8")
    fp4_case("expertf4", 3, 96, "F4")
    write_st(os.path.join(d, "blocks.safetensors"), t)

    # -- f32 -> each format ------------------------------------------------
    specials = [0.0, -0.0, 1.0, -1.0, 0.1, -2.5, 448.0, 464.0, 464.0001, 479.9, 480.0,
                -500.0, 1e6, 57344.0, 61439.0, 61440.0, 65504.0, 65519.0, 65520.0, 3e38,
                2.0 ** -6, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -11, 1.5 * 2.0 ** -9,
                2.0 ** -14, 2.0 ** -16, 2.0 ** -17, 3 * 2.0 ** -17, 2.0 ** -24, 2.0 ** -25,
                1.5 * 2.0 ** -25, 2.0 ** -26, 6e-8, 1e-40, -1e-45, 2.0 ** -127, 1.2e-38,
                1.5, 1.4999999, 0.75, 3.0, 2.0 ** 127, 1.75 * 2.0 ** 127, 3.4028235e38,
                1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -9, 256.5, 0.3,
                math.inf, -math.inf, math.nan, -math.nan]
    halfway = [float(np.float32(v)) for v in
               (np.array([0x3F808000, 0x3F818000, 0x40490FDB, 0x7F7F8000, 0x7F7FFFFF,
                          0x00008000, 0x0001FFFF], np.uint32).view(np.float32))]
    # every midpoint of the e4m3 and e5m2 grids (both tie directions), and
    # bf16 midpoints of random codes
    ties = [float((a + b) / 2) for grid in (E4M3_GRID, E5M2_GRID)
            for (a, _), (b, _) in zip(grid, grid[1:])]
    ties += [-v for v in ties[::7]]
    mids = rng.integers(0, 0x7F7F, 64).astype(np.uint32) << 16 | 0x8000
    ties += [float(v) for v in mids.view(np.float32)]
    rnd = list((rng.standard_normal(300) * np.exp(rng.uniform(-20, 20, 300))).astype(np.float32))
    xs = np.array(specials + halfway + ties + [float(v) for v in rnd], np.float32)
    enc = {"x": ("F32", [len(xs)], xs.tobytes())}
    encoders = {"BF16": (enc_bf16, np.uint16), "F16": (enc_f16, np.uint16),
                "F8_E4M3": (enc_e4m3, np.uint8), "F8_E5M2": (enc_e5m2, np.uint8),
                "F8_E8M0": (enc_e8m0, np.uint8)}
    for dt, (fn, npt) in encoders.items():
        out = np.array([fn(float(v)) for v in xs], npt)
        enc["x." + dt] = (dt, [len(xs)], out.tobytes())
        man["encode"].append({"file": "encode.safetensors", "input": "x", "dtype": dt,
                              "expect": "x." + dt})
    write_st(os.path.join(d, "encode.safetensors"), enc)

    # -- reference quantizers ------------------------------------------------
    t = {}

    def add_q(kind, name, x, q, s, **kw):
        t[name] = ("F32", list(x.shape), x.astype(np.float32).tobytes())
        t[name + ".q"] = ("U8", list(q.shape), q.tobytes())
        t[name + ".s"] = ("U8", list(s.shape), s.tobytes())
        ent = {"file": "quant.safetensors", "kind": kind, "input": name,
               "q": name + ".q", "scale": name + ".s"}
        ent.update(kw)
        man["quant"].append(ent)

    a = (rng.standard_normal((40, 70)) * 0.02).astype(np.float32)
    a[0:32, 32:64] = 0.0                                   # a zero block
    a[32:40, 64:70] *= 1e6                                 # large partial block
    a[0, 0] = 448.0 * 2.0 ** -7                            # amax exactly 448 * 2^k
    q, s = q_fp8_block(a, 32, 32)
    add_q("fp8_block", "a", a, q, s, block=[32, 32])
    bb = (rng.standard_normal((128, 256)) * 3).astype(np.float32)
    q, s = q_fp8_block(bb, 128, 128)
    add_q("fp8_block", "b", bb, q, s, block=[128, 128])

    e = (rng.standard_normal((6, 64)) * 0.05).astype(np.float32)
    e[1, :32] = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4, np.float32)
    e[1, :32] *= np.where(np.arange(32) % 2, -1, 1).astype(np.float32)
    e[2, :32] = 0.0                                        # all-zero group: floor
    e[3, 32:] = np.float32(-0.0)
    e[4, :] *= 1e-30                                       # tiny values
    q, s = q_fp4(e)
    add_q("fp4", "e", e, q, s)

    r = (rng.standard_normal((6, 256)) * 0.01).astype(np.float32)
    r[0, :32] = 0.0
    r[1, 32:64] *= 1e-6                                    # below the 1e-4 amax floor
    r[2, :] = np.linspace(-1000, 1000, 256, dtype=np.float32)
    q, s = q_fp8_rows(r, 32)
    add_q("fp8_rows", "r", r, q, s, group=32)
    write_st(os.path.join(d, "quant.safetensors"), t)

    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(man, f, indent=1)


# ---------------------------------------------------------------- checking

NUMPY_OK = {"BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64", "F16", "F32", "F64"}


def load_raw(path):
    with open(path, "rb") as f:
        return {n: v for n, v in safetensors.deserialize(f.read())}


def check(d):
    failures = []
    done = [0]

    def ok(cond, msg):
        done[0] += 1
        if not cond:
            failures.append(msg)
    src = load_raw(os.path.join(d, "dtypes.safetensors"))
    one = os.path.join(d, "c", "one.safetensors")
    got = load_raw(one)
    ok(set(got) == set(src), "one.safetensors: names %s != %s" % (sorted(got), sorted(src)))
    for n, v in src.items():
        g = got.get(n)
        if g is not None:
            ok((g["dtype"], g["shape"], bytes(g["data"])) == (v["dtype"], v["shape"], bytes(v["data"])),
               "one.safetensors: tensor %s differs" % n)
    with safetensors.safe_open(one, framework="numpy") as f:
        meta = f.metadata()
        ok(meta == {"format": "pt", "producer": "tandem"}, "one.safetensors: metadata %r" % meta)
        for n in f.keys():
            if src[n]["dtype"] in NUMPY_OK:
                arr = f.get_tensor(n)
                ref = np.frombuffer(bytes(src[n]["data"]), dtype=arr.dtype).reshape(src[n]["shape"])
                ok(arr.shape == ref.shape and arr.tobytes() == ref.tobytes(),
                   "one.safetensors: numpy value of %s differs" % n)

    sdir = os.path.join(d, "c", "sharded")
    with open(os.path.join(sdir, "model.safetensors.index.json")) as f:
        idx = json.load(f)
    shards = sorted(set(idx["weight_map"].values()))
    ok(len(shards) >= 3, "sharded: %d shards, want >= 3" % len(shards))
    seen = {}
    for sh in shards:
        for n, v in load_raw(os.path.join(sdir, sh)).items():
            ok(idx["weight_map"].get(n) == sh,
               "sharded: %s in %s but index says %s" % (n, sh, idx["weight_map"].get(n)))
            seen[n] = v
    ok(set(seen) == set(src), "sharded: names differ")
    for n, v in src.items():
        if n in seen:
            ok(bytes(seen[n]["data"]) == bytes(v["data"]), "sharded: tensor %s differs" % n)
    total = sum(len(bytes(v["data"])) for v in src.values())
    ok(idx["metadata"]["total_size"] == total,
       "sharded: total_size %s != %s" % (idx["metadata"]["total_size"], total))

    # the C quantizers' output, written with the C writer, vs the references
    ref = load_raw(os.path.join(d, "quant.safetensors"))
    cq = load_raw(os.path.join(d, "c", "quant.safetensors"))
    for name, v in cq.items():
        want = ref.get(name)
        ok(want is not None and bytes(want["data"]) == bytes(v["data"]) and want["shape"] == v["shape"],
           "quant: %s differs from the reference quantizer" % name)
    ok(len(cq) == 8, "quant: C wrote %d quantized tensors, want 8" % len(cq))

    for msg in failures:
        print("FAIL:", msg)
    print("python check: %d passed, %d failed" % (done[0] - len(failures), len(failures)))
    return 1 if failures else 0


def main():
    np.seterr(over="ignore", invalid="ignore")
    if len(sys.argv) == 3 and sys.argv[1] == "gen":
        gen(sys.argv[2])
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "check":
        return check(sys.argv[2])
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        with tempfile.TemporaryDirectory(prefix="td-weights-") as d:
            gen(d)
            rc = subprocess.call([sys.argv[2], d])
            if rc != 0:
                print("%s exited %d" % (sys.argv[2], rc))
                return 1
            return check(d)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
