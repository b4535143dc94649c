/* tests/fuzz/fuzz_api.c — routerd's Messages and Responses adapters
 * (routerd/adapt-anthropic.c, adapt-responses.c) on arbitrary bodies, and
 * what an accepted request drives without a model: the chat encoder on the
 * converted conversation, the V4.1 reader over generated text fed in pieces
 * into the protocol's stream writer (anthropic.c, oresp.c) and its final
 * message or response. Checks: a refusal's error is valid JSON in the
 * protocol's format; an accepted request is whole (model, body, proto); every
 * event is `event: <type>` then one JSON object of that type. Input: a byte
 * of choices, the body, then optionally FUZZ_SEP and the generated text. */
#include <jansson.h>
#include <string.h>

#include "adapt-anthropic.h"
#include "adapt-responses.h"
#include "anthropic.h"
#include "buf.h"
#include "chat_prompt.h"
#include "fuzz.h"
#include "ireq.h"
#include "oresp.h"

static const char *const api_models[] = { "tandem-fuzz", "m", NULL };

static void
api_check_json(const char *text, size_t len)
{
    json_t *j = json_loadb(text, len, JSON_ALLOW_NUL, NULL);

    FUZZ_CHECK(json_is_object(j));
    json_decref(j);
}

/* Every event of out: "event: NAME\ndata: JSON\n\n", JSON's type NAME. */
static void
api_check_events(const td_buf_t *out)
{
    const char *s = out->data ? out->data : "", *end = s + out->len;

    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        FUZZ_CHECK(nl != NULL && strncmp(s, "event: ", 7) == 0);
        size_t nlen = (size_t)(nl - s - 7);
        const char *d = nl + 1, *dend = strstr(d, "\n\n");
        FUZZ_CHECK(dend != NULL && strncmp(d, "data: ", 6) == 0);
        json_t *j = json_loadb(d + 6, (size_t)(dend - d - 6), JSON_ALLOW_NUL, NULL);
        FUZZ_CHECK(json_is_object(j));
        const char *t = json_string_value(json_object_get(j, "type"));
        FUZZ_CHECK(t != NULL && strlen(t) == nlen && memcmp(t, s + 7, nlen) == 0);
        json_decref(j);
        s = dend + 2;
    }
}

/* The text through the V4.1 reader (pieces of `piece` bytes) into the
 * protocol's writer. */
static void
api_stream(const td_ireq_t *r, const td_chat_prompt_t *p, const uint8_t *text, size_t n,
           size_t piece, bool length)
{
    td_chat_reply_reader_t *rd;
    td_chat_reply_opts_t ro = p->reply;
    td_anthropic_stream_t as = { .id = "msg_f", .model = "m", .thinking = p->thinking };
    td_oresp_t or;
    td_buf_t out = {0};
    const td_chat_reply_delta_t *d;
    size_t nd;
    bool resp = r->kind == TD_OPENAI_RESPONSES;

    ro.split_args = true;
    FUZZ_CHECK(td_chat_reply_reader_create(&ro, &rd) == TD_OK);
    FUZZ_CHECK(td_oresp_init(&or, "resp_f", 1, json_object_get(r->proto, "echo"), true) ==
               TD_OK);
    td_anthropic_usage_t au = { 3, 0, 0 };
    FUZZ_CHECK((resp ? td_oresp_start(&or, &out) : td_anthropic_stream_start(&as, &au, &out)) ==
               TD_OK);
    for (size_t at = 0; at <= n; at += piece) {
        size_t k = n - at < piece ? n - at : piece;
        bool last = at + k >= n;
        FUZZ_CHECK((last ? td_chat_reply_reader_finish(rd, length ? TD_CHAT_REPLY_FINISH_LENGTH
                                                                  : TD_CHAT_REPLY_FINISH_STOP,
                                                       &d, &nd)
                         : td_chat_reply_reader_feed(rd, (const char *)text + at, k, &d, &nd)) ==
                   TD_OK);
        for (size_t i = 0; i < nd; i++)
            FUZZ_CHECK((resp ? td_oresp_delta(&or, &d[i], &out)
                             : td_anthropic_stream_delta(&as, &d[i], &out)) == TD_OK);
        if (last)
            break;
    }
    td_anthropic_stop_t stop = { .finish = length ? TD_OPENAI_FINISH_LENGTH
                                                  : TD_OPENAI_FINISH_STOP };
    td_oresp_usage_t ou = { 3, 0, (uint32_t)n, 0 };
    json_t *final = NULL;
    FUZZ_CHECK((resp ? td_oresp_end(&or, stop.finish, &ou, 2, &out, &final)
                     : td_anthropic_stream_end(&as, &stop, &au, &out)) == TD_OK);
    api_check_events(&out);
    td_buf_reset(&out);
    if (!resp) {
        FUZZ_CHECK(td_anthropic_message_json("msg_f", "m", td_chat_reply_reader_reply(rd), &stop,
                                             &au, &out) == TD_OK);
        api_check_json(out.data, out.len);
    } else {
        FUZZ_CHECK(json_is_object(final) && json_is_array(json_object_get(final, "output")));
    }
    json_decref(final);
    td_buf_free(&out);
    td_oresp_fini(&or);
    td_chat_reply_reader_destroy(rd);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    fuzz_in_t in = { data, size };
    uint8_t c = fuzz_u8(&in);
    bool resp = c & 1;
    td_ireq_cfg_t cfg = { .models = api_models, .max_body = c & 2 ? 64 : 1u << 20,
                          .max_tokens_limit = c & 4 ? 1 : 4096, .max_tokens_default = 16 };
    fuzz_in_t body = fuzz_piece(&in), text = in;
    td_ireq_t *r = NULL;
    td_openai_err_t e;
    td_buf_t b = {0};
    td_status_t st;
    char *copy;

    if (!init) {
        fuzz_log_quiet();
        init = 1;
    }
    copy = malloc(body.n + 1);
    FUZZ_CHECK(copy != NULL);
    memcpy(copy, body.p, body.n);
    copy[body.n] = '\0';
    memset(&e, 0, sizeof e);
    if (resp) {
        json_t *j = json_loadb(copy, body.n, 0, NULL);
        st = json_is_object(j) ? td_adapt_responses_parse(&cfg, j, NULL, &r, &e) : TD_ERR_INVALID;
        if (!json_is_object(j))
            td_openai_err_set(&e, 400, "invalid_request_error", NULL, NULL, "not an object");
        json_decref(j);
    } else {
        st = td_adapt_anthropic_parse(&cfg, c & 8, copy, body.n, &r, &e);
    }
    if (st != TD_OK) {
        FUZZ_CHECK(r == NULL && e.http >= 400 && e.http < 600 && e.message[0]);
        FUZZ_CHECK((resp ? td_openai_err_json(&e, &b) : td_anthropic_err_json(&e, &b)) == TD_OK);
        api_check_json(b.data, b.len);
    } else {
        td_chat_prompt_t *p = NULL;
        td_chat_prompt_opts_t po = { .thinking = r->reasoning.thinking };
        FUZZ_CHECK(r->model && json_is_object(r->body) && r->nmsgs >= 1);
        FUZZ_CHECK(!resp || json_is_object(json_object_get(r->proto, "echo")));
        if (td_chat_prompt_encode(r->body, &po, &p, NULL) == TD_OK) {
            api_stream(r, p, text.p, text.n, (size_t)(c >> 4) + 1, c & 8);
            td_chat_prompt_destroy(p);
        }
        td_ireq_destroy(r);
    }
    td_buf_free(&b);
    free(copy);
    return 0;
}
