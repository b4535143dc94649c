/* tests/fuzz/fuzz_chat_reply.c — the V4.1 reply reader (text/chat_reply.c) on
 * arbitrary model output fed in arbitrary pieces, with reading options and
 * stop strings from the input, then the reply as an OpenAI message. Checks:
 * every delta's text is valid UTF-8; the deltas add up to the reader's reply;
 * the reply does not depend on the cut: one-shot parsing gives the same
 * content, reasoning and calls (the finish reason may differ, docs/chat.md);
 * the message is a JSON object. Input: two bytes of choices (options, the cut),
 * up to three stop strings each followed by FUZZ_SEP, then the output. */
#include <jansson.h>

#include "buf.h"
#include "chat_reply.h"
#include "fuzz.h"

/* What the deltas add up to. */
typedef struct {
    td_buf_t content, reasoning;
    td_buf_t args[64];
    char *ids[64], *names[64];
    size_t ncalls;
} cr_sum_t;

static void
cr_sum_free(cr_sum_t *s)
{
    td_buf_free(&s->content);
    td_buf_free(&s->reasoning);
    for (size_t i = 0; i < s->ncalls && i < 64; i++) {
        td_buf_free(&s->args[i]);
        free(s->ids[i]);
        free(s->names[i]);
    }
}

static int
cr_utf8(const char *text, size_t len)
{
    json_t *j = json_stringn(text, len);   /* NULL for invalid UTF-8 */

    json_decref(j);
    return j != NULL;
}

static void
cr_valid_utf8(const char *text, size_t len)
{
    FUZZ_CHECK(cr_utf8(text, len));
}

static void
cr_add(cr_sum_t *s, const td_chat_reply_delta_t *d, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        switch (d[i].kind) {
        case TD_CHAT_REPLY_DELTA_REASONING:
            cr_valid_utf8(d[i].text, d[i].len);
            td_buf_append(&s->reasoning, d[i].text, d[i].len);
            break;
        case TD_CHAT_REPLY_DELTA_CONTENT:
            cr_valid_utf8(d[i].text, d[i].len);
            td_buf_append(&s->content, d[i].text, d[i].len);
            break;
        case TD_CHAT_REPLY_DELTA_TOOL_CALL:
            FUZZ_CHECK(d[i].index == s->ncalls && d[i].id && d[i].name);
            cr_valid_utf8(d[i].name, strlen(d[i].name));
            if (s->ncalls < 64) {
                s->ids[s->ncalls] = strdup(d[i].id);
                s->names[s->ncalls] = strdup(d[i].name);
                memset(&s->args[s->ncalls], 0, sizeof(s->args[0]));
            }
            s->ncalls++;
            break;
        case TD_CHAT_REPLY_DELTA_TOOL_ARGS:
            FUZZ_CHECK(d[i].index + 1 == s->ncalls);
            cr_valid_utf8(d[i].text, d[i].len);
            if (d[i].index < 64)
                td_buf_append(&s->args[d[i].index], d[i].text, d[i].len);
            break;
        default:
            FUZZ_CHECK(!"unknown delta kind");
        }
    }
}

static int
cr_same(const char *a, size_t alen, const char *b, size_t blen)
{
    return alen == blen && (alen == 0 || memcmp(a, b, alen) == 0);
}

static void
cr_check_reply(const td_chat_reply_t *r, const cr_sum_t *s)
{
    FUZZ_CHECK(cr_same(r->content, r->content_len, s->content.data, s->content.len));
    FUZZ_CHECK(r->reasoning != NULL || s->reasoning.len == 0);
    if (r->reasoning)
        FUZZ_CHECK(cr_same(r->reasoning, r->reasoning_len, s->reasoning.data,
                           s->reasoning.len));
    FUZZ_CHECK(r->ncalls == s->ncalls);
    for (size_t i = 0; i < r->ncalls && i < 64; i++) {
        FUZZ_CHECK(strcmp(r->calls[i].id, s->ids[i]) == 0);
        FUZZ_CHECK(strcmp(r->calls[i].name, s->names[i]) == 0);
        FUZZ_CHECK(cr_same(r->calls[i].arguments, r->calls[i].arguments_len,
                           s->args[i].data, s->args[i].len));
    }
}

static void
cr_check_same(const td_chat_reply_t *a, const td_chat_reply_t *b)
{
    FUZZ_CHECK(cr_same(a->content, a->content_len, b->content, b->content_len));
    FUZZ_CHECK((a->reasoning == NULL) == (b->reasoning == NULL));
    if (a->reasoning)
        FUZZ_CHECK(cr_same(a->reasoning, a->reasoning_len, b->reasoning, b->reasoning_len));
    FUZZ_CHECK(a->ncalls == b->ncalls);
    for (size_t i = 0; i < a->ncalls; i++) {
        FUZZ_CHECK(strcmp(a->calls[i].id, b->calls[i].id) == 0);
        FUZZ_CHECK(strcmp(a->calls[i].name, b->calls[i].name) == 0);
        FUZZ_CHECK(cr_same(a->calls[i].arguments, a->calls[i].arguments_len,
                           b->calls[i].arguments, b->calls[i].arguments_len));
    }
}

static void
cr_check_json(const td_chat_reply_t *r)
{
    json_t *msg = NULL;
    char *s;

    FUZZ_CHECK(td_chat_reply_json(r, &msg) == TD_OK);
    FUZZ_CHECK(json_is_object(msg));
    s = json_dumps(msg, JSON_COMPACT);
    FUZZ_CHECK(s != NULL);
    free(s);
    json_decref(msg);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    fuzz_in_t in = { data, size };
    uint8_t c = fuzz_u8(&in), cut = fuzz_u8(&in);
    char *stops[3];
    td_chat_reply_opts_t opts = { .start = (td_chat_reply_start_t)(c & 3),
                                  .tool_calls = (c & 4) != 0,
                                  .in_tool_calls = (c & 12) == 12,
                                  .stop = (const char *const *)stops,
                                  .id_seed = 7 };
    td_chat_reply_finish_t engine = c & 0x80 ? TD_CHAT_REPLY_FINISH_LENGTH
                                             : TD_CHAT_REPLY_FINISH_STOP;
    td_chat_reply_reader_t *rd = NULL;
    const td_chat_reply_delta_t *d;
    td_chat_reply_t *once = NULL;
    cr_sum_t sum;
    uint32_t rng = cut * 2654435761u + 1;
    size_t nstop = (c >> 4) & 3, n;

    if (!init) {
        fuzz_log_quiet();
        init = 1;
    }
    if (nstop == 3 && !(c & 0x40))
        nstop = 0;
    for (size_t i = 0; i < nstop; i++) {
        fuzz_in_t s = fuzz_piece(&in);

        if (s.n == 0) {   /* a stop string is never empty */
            nstop = i;
            break;
        }
        stops[i] = strndup((const char *)s.p, s.n);
        FUZZ_CHECK(stops[i] != NULL);
        /* as a request's "stop" gives them: non-empty UTF-8 (an invalid
         * one could match inside the U+FFFD of invalid output) */
        if (strlen(stops[i]) == 0 || !cr_utf8(stops[i], strlen(stops[i]))) {
            free(stops[i]);
            nstop = i;
            break;
        }
    }
    opts.nstop = nstop;
    memset(&sum, 0, sizeof sum);

    FUZZ_CHECK(td_chat_reply_reader_create(&opts, &rd) == TD_OK);
    for (size_t off = 0; off < in.n;) {
        size_t piece = in.n - off;

        if (cut) {   /* pieces of 1 .. 16 bytes, drawn from the cut byte */
            rng = rng * 1103515245u + 12345u;
            piece = 1 + (rng >> 16) % (1 + cut % 16);
            if (piece > in.n - off)
                piece = in.n - off;
        }
        FUZZ_CHECK(td_chat_reply_reader_feed(rd, (const char *)in.p + off, piece, &d, &n) ==
                   TD_OK);
        cr_add(&sum, d, n);
        off += piece;
    }
    FUZZ_CHECK(td_chat_reply_reader_finish(rd, engine, &d, &n) == TD_OK);
    cr_add(&sum, d, n);
    FUZZ_CHECK(td_chat_reply_reader_feed(rd, "x", 1, &d, &n) == TD_ERR_STATE);
    cr_check_reply(td_chat_reply_reader_reply(rd), &sum);
    cr_check_json(td_chat_reply_reader_reply(rd));

    FUZZ_CHECK(td_chat_reply_parse(&opts, (const char *)in.p, in.n, engine, &once) == TD_OK);
    cr_check_same(once, td_chat_reply_reader_reply(rd));
    td_chat_reply_destroy(once);

    td_chat_reply_reader_destroy(rd);
    cr_sum_free(&sum);
    for (size_t i = 0; i < nstop; i++)
        free(stops[i]);
    return 0;
}
