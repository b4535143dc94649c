/* tests/unit/test_pbcap.c — repeated elements counted on the wire before
 * unpacking (net/pbcap.h): a table of messages built byte by byte, within and
 * past their caps (packed and one element per key, nested, the total), and
 * wire errors; then a frame of 1 M empty repeated elements, refused by
 * td_frame_decode before protobuf-c unpacks it. */
#include "check.h"
#include "frame.h"
#include "pbcap.h"

#include <event2/buffer.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* A growing byte string. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
} wbuf_t;

static void
wb_put(wbuf_t *b, const void *src, size_t n)
{
    if (n == 0)   /* an empty field: src may be NULL (memcpy's arguments must not be) */
        return;
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        CHECK(b->p != NULL);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void
wb_varint(wbuf_t *b, uint64_t v)
{
    uint8_t x[10];
    size_t k = 0;

    do {
        x[k] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v)
            x[k] |= 0x80;
        k++;
    } while (v);
    wb_put(b, x, k);
}

static void
wb_key(wbuf_t *b, uint32_t field, uint32_t wt)
{
    wb_varint(b, (uint64_t)field << 3 | wt);
}

/* field (length-delimited) holding inner's bytes. */
static void
wb_sub(wbuf_t *b, uint32_t field, const wbuf_t *inner)
{
    wb_key(b, field, 2);
    wb_varint(b, inner->n);
    wb_put(b, inner->p, inner->n);
}

static uint32_t
field_no(const ProtobufCMessageDescriptor *d, const char *name)
{
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, name);

    CHECK(f != NULL);
    return f ? f->id : 0;
}

/* A Sampling of n stop tokens, packed or one per key; and n empty
 * logit_bias messages. */
static void
sampling(wbuf_t *s, uint32_t nstop, bool packed, uint32_t nbias)
{
    uint32_t stop = field_no(&tandem__sampling__descriptor, "stop_tokens");
    uint32_t bias = field_no(&tandem__sampling__descriptor, "logit_bias");
    wbuf_t p = { 0 };

    for (uint32_t i = 0; i < nstop; i++) {
        if (packed) {
            wb_varint(&p, 7);
        } else {
            wb_key(s, stop, 0);
            wb_varint(s, 7);
        }
    }
    if (packed && nstop > 0)
        wb_sub(s, stop, &p);
    for (uint32_t i = 0; i < nbias; i++) {
        wb_key(s, bias, 2);
        wb_varint(s, 0);
    }
    free(p.p);
}

/* Tokens with n log-probability entries of ntop alternatives each. */
static void
tokens(wbuf_t *t, uint32_t n, uint32_t ntop)
{
    uint32_t lp = field_no(&tandem__tokens__descriptor, "logprobs");
    uint32_t top = field_no(&tandem__token_logprob__descriptor, "top");
    wbuf_t e = { 0 };

    for (uint32_t j = 0; j < ntop; j++) {
        wb_key(&e, top, 2);
        wb_varint(&e, 0);
    }
    for (uint32_t i = 0; i < n; i++)
        wb_sub(t, lp, &e);
    free(e.p);
}

/* An Envelope whose payload is field `payload` holding inner. */
static wbuf_t
envelope(const char *payload, const wbuf_t *inner)
{
    wbuf_t env = { 0 };

    wb_sub(&env, field_no(&tandem__envelope__descriptor, payload), inner);
    return env;
}

static void
test_cases(void)
{
    static const td_pbcap_t small = { .scalar_max = 100, .object_max = 100,
                                      .objects_total = 10, .depth_max = 8, .rules = NULL };
    static const struct {
        const char *name;
        int kind;            /* 0 sampling in an admit, 1 tokens, 2 raw bytes */
        uint32_t a, b;       /* sampling: stop tokens, logit bias; tokens: entries, tops */
        bool unpacked;       /* stop tokens one per key */
        const td_pbcap_t *caps;
        const char *raw;
        size_t rawlen;
        td_status_t want;
        const char *why;     /* in the reason */
    } cases[] = {
        { "stop tokens at the cap", 0, 16, 0, false, NULL, NULL, 0, TD_OK, NULL },
        { "stop tokens past the cap, packed", 0, 17, 0, false, NULL, NULL, 0, TD_ERR_TOO_BIG,
          "tandem.Sampling.stop_tokens: more than 16" },
        { "stop tokens past the cap, one per key", 0, 17, 0, true, NULL, NULL, 0,
          TD_ERR_TOO_BIG, "stop_tokens" },
        { "logit bias at the cap", 0, 0, 300, false, NULL, NULL, 0, TD_OK, NULL },
        { "logit bias past the cap", 0, 0, 301, false, NULL, NULL, 0, TD_ERR_TOO_BIG,
          "tandem.Sampling.logit_bias: more than 300" },
        { "log-probabilities at the default cap", 1, 4096, 0, false, NULL, NULL, 0, TD_OK,
          NULL },
        { "log-probabilities past the default cap", 1, 4097, 0, false, NULL, NULL, 0,
          TD_ERR_TOO_BIG, "tandem.Tokens.logprobs: more than 4096" },
        { "nested: the total of messages", 1, 3, 3, false, &small, NULL, 0, TD_ERR_TOO_BIG,
          "in all" },
        { "nested: within the total", 1, 2, 3, false, &small, NULL, 0, TD_OK, NULL },
        { "a truncated varint", 2, 0, 0, false, NULL, "\x08\x80", 2, TD_ERR_PROTO,
          "past the end" },
        { "a length past the end", 2, 0, 0, false, NULL, "\x0a\x05\x00", 3, TD_ERR_PROTO,
          "past the end" },
        { "a group (wire type 3)", 2, 0, 0, false, NULL, "\x0b", 1, TD_ERR_PROTO,
          "wire type" },
        { "field 0", 2, 0, 0, false, NULL, "\x00\x00", 2, TD_ERR_PROTO, "key" },
        { "an unknown field is skipped", 2, 0, 0, false, NULL, "\xf8\x3f\x01", 3, TD_OK,
          NULL },
        { "empty", 2, 0, 0, false, NULL, "", 0, TD_OK, NULL },
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        wbuf_t inner = { 0 }, adm = { 0 }, env = { 0 };
        char why[200];
        td_status_t st;

        if (cases[i].kind == 0) {
            sampling(&inner, cases[i].a, cases[i].unpacked, cases[i].b);
            wb_sub(&adm, field_no(&tandem__admit__descriptor, "sampling"), &inner);
            env = envelope("admit", &adm);
        } else if (cases[i].kind == 1) {
            tokens(&inner, cases[i].a, cases[i].b);
            env = envelope("tokens", &inner);
        } else {
            wb_put(&env, cases[i].raw, cases[i].rawlen);
        }
        st = td_pbcap_check(&tandem__envelope__descriptor, env.p, env.n,
                            cases[i].caps ? cases[i].caps : &td_pbcap_tandem, why, sizeof why);
        if (st != cases[i].want || (cases[i].why && !strstr(why, cases[i].why)))
            fprintf(stderr, "case \"%s\": %s (%s)\n", cases[i].name, td_status_str(st), why);
        CHECK_STATUS(st, cases[i].want);
        CHECK(cases[i].why == NULL || strstr(why, cases[i].why) != NULL);
        if (st == TD_OK && cases[i].kind != 2) {   /* what passes, protobuf-c reads */
            Tandem__Envelope *e = tandem__envelope__unpack(NULL, env.n, env.p);
            CHECK(e != NULL);
            if (e)
                tandem__envelope__free_unpacked(e, NULL);
        }
        free(inner.p);
        free(adm.p);
        free(env.p);
    }
}

static void
test_frame_of_a_million(void)
{
    wbuf_t inner = { 0 }, env;
    struct evbuffer *buf = evbuffer_new();
    Tandem__Envelope *got = NULL;
    uint8_t hdr[4];
    char why[200];

    tokens(&inner, 1u << 20, 0);   /* 1 M empty TokenLogprob: 2 MiB on the wire */
    env = envelope("tokens", &inner);
    CHECK(env.n < TD_FRAME_MAX_DEFAULT);
    hdr[0] = (uint8_t)(env.n >> 24);
    hdr[1] = (uint8_t)(env.n >> 16);
    hdr[2] = (uint8_t)(env.n >> 8);
    hdr[3] = (uint8_t)env.n;
    evbuffer_add(buf, hdr, 4);
    evbuffer_add(buf, env.p, env.n);
    CHECK_STATUS(td_frame_decode(buf, TD_FRAME_MAX_DEFAULT, &got, NULL, why, sizeof why),
                 TD_ERR_RANGE);
    CHECK(got == NULL);
    CHECK(strstr(why, "tandem.Tokens.logprobs: more than 4096") != NULL);
    CHECK_EQ_INT(evbuffer_get_length(buf), 0);   /* consumed */
    evbuffer_free(buf);
    free(inner.p);
    free(env.p);
}

int
main(void)
{
    test_cases();
    test_frame_of_a_million();
    return td_check_exit("test_pbcap");
}
