/* tests/fuzz/fuzz_grammar.c — the grammar engine's compilers (JSON Schema,
 * regex, choice, GBNF: grammar/) on arbitrary specs against the tiny
 * checkpoint's vocabulary ($TD_FUZZ_TINY), then a short walk through the
 * allowed tokens. Checks: a refusal has a message and one of the documented
 * statuses; every token the mask allows advances, every other is refused;
 * rollback returns to the first mask. Input: a byte of choices (kind,
 * strict, precompute), then the spec; the walk's picks come from the spec's
 * bytes. */
#include <string.h>

#include "fuzz.h"
#include "grammar.h"
#include "tokenizer.h"

static td_tokenizer_t *gz_tok;
static td_gvocab_t *gz_v;

static int32_t
gz_pick(const uint64_t *mask, uint32_t vocab, uint32_t seed)
{
    for (uint32_t k = 0; k < vocab; k++) {
        uint32_t id = (seed + k * 2654435761u) % vocab;
        if (mask[id >> 6] >> (id & 63) & 1)
            return (int32_t)id;
    }
    return -1;
}

static void
gz_walk(td_grammar_t *g, const uint8_t *p, size_t n)
{
    uint32_t vocab = td_gvocab_size(gz_v);
    size_t words = td_gvocab_mask_words(gz_v);
    uint64_t *first = malloc(words * sizeof(uint64_t));
    td_gmatch_t *m = NULL;
    size_t taken = 0;

    FUZZ_CHECK(first != NULL && td_gmatch_create(g, &m) == TD_OK);
    const uint64_t *mask = td_gmatch_mask(m);
    FUZZ_CHECK(mask != NULL);
    memcpy(first, mask, words * sizeof(uint64_t));
    for (size_t i = 0; i < 8; i++) {
        mask = td_gmatch_mask(m);
        FUZZ_CHECK(mask != NULL);
        uint32_t seed = n ? p[i % n] * 257u + (uint32_t)i : (uint32_t)i;
        int32_t t = gz_pick(mask, vocab, seed);
        int32_t bad = (int32_t)(seed % vocab);
        if (!(mask[(uint32_t)bad >> 6] >> (bad & 63) & 1))
            FUZZ_CHECK(td_gmatch_advance(m, bad) == TD_ERR_INVALID);
        if (t < 0)
            break;
        FUZZ_CHECK(td_gmatch_advance(m, t) == TD_OK);
        taken++;
    }
    FUZZ_CHECK(td_gmatch_rollback(m, taken) == TD_OK);
    mask = td_gmatch_mask(m);
    FUZZ_CHECK(mask != NULL && memcmp(mask, first, words * sizeof(uint64_t)) == 0);
    td_gmatch_destroy(m);
    free(first);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    td_grammar_opts_t o = { .budget_ms = 200, .max_spec_bytes = 64u << 10 };
    td_grammar_err_t e;
    td_grammar_t *g = NULL;
    td_status_t st;
    static const int32_t eos = 1;

    if (gz_tok == NULL) {
        char path[4096];

        fuzz_log_quiet();
        snprintf(path, sizeof path, "%s/tokenizer.json",
                 fuzz_env_path("TD_FUZZ_TINY", "a tools/mk-tiny-model checkpoint"));
        FUZZ_CHECK(td_tokenizer_load(path, &gz_tok) == TD_OK);
        FUZZ_CHECK(td_gvocab_create(gz_tok, &eos, 1, &gz_v) == TD_OK);
    }
    if (size == 0)
        return 0;
    o.strict = data[0] & 8;
    o.precompute = data[0] & 16;
    st = td_grammar_compile(gz_v, (td_grammar_kind_t)(data[0] % 5), (const char *)data + 1,
                            size - 1, &o, &g, &e);
    if (st != TD_OK) {
        FUZZ_CHECK(st == TD_ERR_INVALID || st == TD_ERR_UNSUPPORTED || st == TD_ERR_TOO_BIG ||
                   st == TD_ERR_TIMEOUT);
        FUZZ_CHECK(e.msg[0] != '\0');
        return 0;
    }
    gz_walk(g, data + 1, size - 1);
    td_grammar_destroy(g);
    return 0;
}
