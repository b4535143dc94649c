/* tests/fuzz/fuzz_openai.c — routerd's OpenAI request parser
 * (td_openai_req_parse) on arbitrary bodies of /v1/chat/completions and
 * /v1/completions, and what a parsed request drives without a model: its stop
 * strings (text/stopmatch.c) over generated text fed in pieces, and that text as
 * a stream chunk. Checks: a refusal's error is valid JSON; an accepted request
 * keeps the documented bounds; the stop matcher's output does not depend on
 * how the text is cut. Input: a byte of choices, the body, then optionally
 * FUZZ_SEP and the generated text. */
#include <jansson.h>
#include <math.h>

#include "buf.h"
#include "fuzz.h"
#include "adapt-openai.h"
#include "ireq.h"
#include "openai.h"
#include "stopmatch.h"

static const char *const openai_models[] = { "tandem-fuzz", "m", NULL };

/* An error or response body (after "data: " for an SSE event) is one JSON object. */
static void
openai_check_json(const char *text, size_t len)
{
    json_error_t jerr;
    json_t *j = json_loadb(text, len, JSON_ALLOW_NUL, &jerr);

    if (j == NULL)
        fprintf(stderr, "not JSON (%s): %.*s\n", jerr.text, (int)len, text);
    FUZZ_CHECK(json_is_object(j));
    json_decref(j);
}

static void
openai_check_err(const td_openai_err_t *e)
{
    td_buf_t b = {0};

    FUZZ_CHECK(e->http >= 400 && e->http < 600 && e->type && e->message[0]);
    FUZZ_CHECK(td_openai_err_json(e, &b) == TD_OK);
    openai_check_json(b.data, b.len);
    td_buf_free(&b);
}

static void
openai_check_req(const td_ireq_cfg_t *cfg, const td_ireq_t *r, td_openai_kind_t kind)
{
    FUZZ_CHECK(r->kind == kind && r->model && r->body);
    if (kind == TD_OPENAI_CHAT) {
        FUZZ_CHECK(r->nmsgs >= 1 && r->prompt == NULL);
        for (size_t i = 0; i < r->nmsgs; i++) {
            FUZZ_CHECK(r->msgs[i].content != NULL);
            FUZZ_CHECK((r->msgs[i].role == TD_OPENAI_ROLE_TOOL) ==
                       (r->msgs[i].tool_call_id != NULL));
            (void)td_openai_role_str(r->msgs[i].role);
        }
        FUZZ_CHECK(r->out.top_logprobs <= TD_OPENAI_MAX_TOP_LOGPROBS);
    } else {
        FUZZ_CHECK(r->nmsgs == 0 && r->prompt != NULL);
        FUZZ_CHECK(r->out.top_logprobs <= TD_OPENAI_MAX_COMPLETION_LOGPROBS);
    }
    FUZZ_CHECK(r->sampling.max_tokens >= 1 && r->sampling.max_tokens <= cfg->max_tokens_limit);
    FUZZ_CHECK(r->sampling.temperature >= 0 && r->sampling.temperature <= 2);
    FUZZ_CHECK(r->sampling.top_p > 0 && r->sampling.top_p <= 1);
    FUZZ_CHECK(fabs(r->sampling.presence_penalty) <= 2 && fabs(r->sampling.frequency_penalty) <= 2);
    FUZZ_CHECK(r->sampling.min_p >= 0 && r->sampling.min_p <= 1);
    FUZZ_CHECK(r->sampling.repetition_penalty > 0 && r->sampling.repetition_penalty <= 2);
    FUZZ_CHECK(r->sampling.min_tokens <= r->sampling.max_tokens);
    FUZZ_CHECK(r->n >= 1 && r->n <= (cfg->max_n ? cfg->max_n : TD_IREQ_DEFAULT_MAX_N));
    FUZZ_CHECK(r->stop.ntoken_ids <= TD_IREQ_MAX_STOP_IDS);
    for (size_t i = 0; i < r->stop.ntoken_ids; i++)
        FUZZ_CHECK(r->stop.token_ids[i] >= 0 &&
                   (cfg->vocab == 0 || (uint32_t)r->stop.token_ids[i] < cfg->vocab));
    FUZZ_CHECK(r->constraint.kind == TD_IREQ_CONSTRAINT_NONE);
    FUZZ_CHECK(r->stop.nstrings <= TD_OPENAI_MAX_STOP && r->sampling.nbias <= TD_OPENAI_MAX_BIAS);
    for (size_t i = 0; i < r->stop.nstrings; i++)
        FUZZ_CHECK(r->stop.strings[i] && r->stop.strings[i][0]);
    for (size_t i = 0; i < r->sampling.nbias; i++) {
        FUZZ_CHECK(r->sampling.logit_bias[i].token >= 0);
        FUZZ_CHECK(cfg->vocab == 0 || (uint32_t)r->sampling.logit_bias[i].token < cfg->vocab);
        FUZZ_CHECK(r->sampling.logit_bias[i].bias >= -100 && r->sampling.logit_bias[i].bias <= 100);
        for (size_t j = 0; j < i; j++)
            FUZZ_CHECK(r->sampling.logit_bias[j].token != r->sampling.logit_bias[i].token);
    }
}

/* The stop strings over text: fed in pieces of `piece` bytes, then at once. */
static void
openai_stops(const td_ireq_t *r, const uint8_t *text, size_t len, size_t piece)
{
    td_buf_t whole = {0}, cut = {0};
    bool mw = false, mc = false, m;
    td_stopmatch_filter_t *s;

    FUZZ_CHECK(td_stopmatch_filter_create((const char *const *)r->stop.strings, r->stop.nstrings, false, &s) == TD_OK);
    FUZZ_CHECK(td_stopmatch_filter_feed(s, (const char *)text, len, true, &whole, &mw) == TD_OK);
    if (!mw)
        FUZZ_CHECK(td_stopmatch_filter_flush(s, &whole) == TD_OK);
    td_stopmatch_filter_destroy(s);

    FUZZ_CHECK(td_stopmatch_filter_create((const char *const *)r->stop.strings, r->stop.nstrings, false, &s) == TD_OK);
    for (size_t off = 0; off < len && !mc; off += piece) {
        size_t n = len - off < piece ? len - off : piece;

        FUZZ_CHECK(td_stopmatch_filter_feed(s, (const char *)text + off, n, true, &cut, &m) == TD_OK);
        mc = m;
    }
    if (!mc)
        FUZZ_CHECK(td_stopmatch_filter_flush(s, &cut) == TD_OK);
    td_stopmatch_filter_destroy(s);

    FUZZ_CHECK(mw == mc && whole.len == cut.len);
    FUZZ_CHECK(whole.len == 0 || memcmp(whole.data, cut.data, whole.len) == 0);
    FUZZ_CHECK(mw || r->stop.nstrings || whole.len == len);
    td_buf_free(&whole);
    td_buf_free(&cut);
}

/* The text as the first chunk of a stream: one SSE event with a JSON object. */
static void
openai_chunk(const td_ireq_t *r, const uint8_t *text, size_t len)
{
    td_openai_stream_t s = { .meta = { .kind = r->kind, .id = "chatcmpl-fuzz", .created = 1,
                                       .model = r->model },
                             .include_usage = r->out.include_usage };
    td_buf_t b = {0};
    td_status_t st = td_openai_stream_text(&s, 0, NULL, (const char *)text, len, &b);

    if (st == TD_OK) {
        /* "data: <json>\n\n": compact JSON has no line break of its own */
        char *end = b.len > 8 ? strstr(b.data, "\n\n") : NULL;

        FUZZ_CHECK(end != NULL && end + 2 == b.data + b.len);
        FUZZ_CHECK(memcmp(b.data, "data: ", 6) == 0 && memchr(b.data, '\n', b.len) == end);
        openai_check_json(b.data + 6, (size_t)(end - b.data - 6));
    }
    td_buf_free(&b);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    fuzz_in_t in = { data, size };
    uint8_t c = fuzz_u8(&in);
    td_openai_kind_t kind = c & 1 ? TD_OPENAI_COMPLETION : TD_OPENAI_CHAT;
    td_ireq_cfg_t cfg = { .models = openai_models,
                            .max_body = c & 2 ? 64 : 1u << 20,
                            .max_tokens_limit = c & 4 ? 1 : 4096,
                            .max_tokens_default = c & 4 ? 1 : 16,
                            .vocab = c & 8 ? 0 : 1000 };
    size_t piece = (c >> 4) + 1;
    fuzz_in_t body, text;
    td_ireq_t *r = NULL;
    td_openai_err_t e;
    char *copy;
    td_status_t st;

    if (!init) {
        fuzz_log_quiet();
        init = 1;
    }
    body = fuzz_piece(&in);
    text = in;
    /* The body as routerd hands it over: NUL-terminated, its own allocation. */
    copy = malloc(body.n + 1);
    FUZZ_CHECK(copy != NULL);
    memcpy(copy, body.p, body.n);
    copy[body.n] = '\0';
    memset(&e, 0, sizeof e);
    st = td_adapt_openai_parse(&cfg, kind, copy, body.n, &r, &e);
    if (st == TD_OK) {
        openai_check_req(&cfg, r, kind);
        openai_stops(r, text.p, text.n, piece);
        openai_chunk(r, text.p, text.n);
        td_ireq_destroy(r);
    } else {
        FUZZ_CHECK(r == NULL);
        FUZZ_CHECK(st == TD_ERR_TOO_BIG || st == TD_ERR_INVALID || st == TD_ERR_UNSUPPORTED ||
                   st == TD_ERR_NOT_FOUND);
        openai_check_err(&e);
    }
    free(copy);
    return 0;
}
