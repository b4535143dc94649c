/* routerd/rtok.c — /tokenize and /detokenize (rtok.h): the body parsed and
 * the ids or text made on a text thread, answered on the loop. */
#include "rtok.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "adapt-anthropic.h"
#include "adapt-openai.h"
#include "apikeys.h"
#include "buf.h"
#include "log.h"

#define INVALID_REQUEST "invalid_request_error"

/* One request in flight; on the router's list until its done came. */
typedef struct rtok_job {
    struct rtok_job *prev, *next;
    td_rtok_t *x;
    td_http_req_t *hreq;        /* NULL once its client is gone */
    td_rtok_mode_t mode;
    char id[100];               /* a stored response's id */
    char owner[TD_APIKEYS_OWNER_LEN];
    char *body;
    size_t len;
    td_openai_err_t err;        /* the job's refusal (err.http 0: none) */
    td_buf_t out;               /* the job's answer */
} rtok_job_t;

struct td_rtok_s {
    td_rtok_cfg_t cfg;
    rtok_job_t *jobs;
};

td_status_t
td_rtok_create(const td_rtok_cfg_t *cfg, td_rtok_t **out)
{
    td_rtok_t *x = calloc(1, sizeof *x);

    if (x == NULL)
        return TD_ERR_NOMEM;
    x->cfg = *cfg;
    *out = x;
    return TD_OK;
}

static void
job_free(rtok_job_t *j)
{
    td_rtok_t *x = j->x;

    if (j->prev)
        j->prev->next = j->next;
    else
        x->jobs = j->next;
    if (j->next)
        j->next->prev = j->prev;
    if (j->hreq)
        td_http_on_gone(j->hreq, NULL, NULL);
    free(j->body);
    td_buf_free(&j->out);
    free(j);
}

void
td_rtok_destroy(td_rtok_t *x)
{
    if (x == NULL)
        return;
    while (x->jobs)   /* dropped with the text threads, never started */
        job_free(x->jobs);
    free(x);
}

/* ---- The job (a text thread) ------------------------------------------------ */

static td_status_t
refuse(rtok_job_t *j, const char *param, const char *code, const char *msg)
{
    td_openai_err_set(&j->err, 400, INVALID_REQUEST, param, code, "%s", msg);
    return TD_ERR_INVALID;
}

/* Fields of a /tokenize body that only say "as routerd does anyway". */
static td_status_t
tokenize_flag(rtok_job_t *j, const char *key, const json_t *v, bool *return_strs)
{
    if (!json_is_boolean(v)) {
        td_openai_err_set(&j->err, 400, INVALID_REQUEST, key, "invalid_type",
                          "Invalid type for '%s': expected a boolean.", key);
        return TD_ERR_INVALID;
    }
    if (strcmp(key, "return_token_strs") == 0)
        *return_strs = json_is_true(v);
    else if (strcmp(key, "add_generation_prompt") == 0 && !json_is_true(v))
        return refuse(j, key, "unsupported_value", "Unsupported value for "
                      "'add_generation_prompt': the prompt always ends with the assistant's "
                      "turn opened, as a chat request's does.");
    else if (strcmp(key, "continue_final_message") == 0 && json_is_true(v))
        return refuse(j, key, "unsupported_value", "Unsupported value for "
                      "'continue_final_message': this server does not continue a final "
                      "message.");
    /* add_special_tokens: the tokenizer's post-processor adds none (ByteLevel),
     * so either value gives the same ids */
    return TD_OK;
}

/* The /tokenize body as the request of its kind (a chat for "messages", a
 * completion for "prompt") that the adapter parses: its own fields taken
 * out, the served model filled in. *kind set. */
static json_t *
tokenize_request(rtok_job_t *j, json_t *body, td_openai_kind_t *kind, bool *return_strs)
{
    static const char *const own[] = { "add_special_tokens", "return_token_strs",
                                       "add_generation_prompt", "continue_final_message" };
    json_t *req = json_deep_copy(body);

    if (req == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
        json_t *v = json_object_get(req, own[i]);
        if (v != NULL && !json_is_null(v) && tokenize_flag(j, own[i], v, return_strs) != TD_OK) {
            json_decref(req);
            return NULL;
        }
        json_object_del(req, own[i]);
    }
    *kind = json_object_get(req, "messages") != NULL ? TD_OPENAI_CHAT : TD_OPENAI_COMPLETION;
    if (json_object_get(req, "model") == NULL)
        json_object_set_new(req, "model", json_string(j->x->cfg.text->model));
    return req;
}

/* {"count", "max_model_len", "tokens", "token_strs"} of the ids. */
static td_status_t
tokenize_answer(rtok_job_t *j, const uint32_t *ids, size_t n, bool strs)
{
    const td_tok_t *tok = j->x->cfg.text->tok;
    json_t *a = json_array(), *s = strs ? json_array() : json_null(), *o;
    char *text;

    for (size_t i = 0; a != NULL && s != NULL && i < n; i++) {
        json_array_append_new(a, json_integer(ids[i]));
        if (strs) {
            const char *b;
            size_t len;
            td_tok_dec_t d = {0};
            td_buf_t t = {0};
            if (td_tok_spell(tok, ids[i], &b, &len) == TD_OK &&
                td_tok_decode(tok, &d, &ids[i], 1, false, &t) == TD_OK &&
                td_tok_decode_flush(&d, &t) == TD_OK)
                json_array_append_new(s, json_stringn(t.data ? t.data : "", t.len));
            td_buf_free(&t);
        }
    }
    o = json_pack("{s:I, s:I, s:o, s:o}", "count", (json_int_t)n, "max_model_len",
                  (json_int_t)j->x->cfg.max_context, "tokens", a, "token_strs", s);
    text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (text == NULL)
        return TD_ERR_NOMEM;
    td_buf_puts(&j->out, text);
    free(text);
    return td_buf_status(&j->out);
}

static void
tokenize_run(rtok_job_t *j, json_t *body)
{
    const td_rtext_cfg_t *cfg = j->x->cfg.text;
    td_openai_kind_t kind;
    bool strs = false;
    json_t *req = tokenize_request(j, body, &kind, &strs);
    char *text = req ? json_dumps(req, JSON_COMPACT) : NULL;
    td_ireq_t *o = NULL;
    uint32_t *ids = NULL;
    size_t n = 0;

    json_decref(req);
    if (j->err.http != 0)
        goto out;
    if (text == NULL) {
        td_openai_err_internal(&j->err, "out of memory");
        goto out;
    }
    if (td_adapt_openai_parse(cfg->api, kind, text, strlen(text), &o, &j->err) != TD_OK ||
        td_rtext_prompt_ids(cfg, o, &ids, &n, NULL, &j->err) != TD_OK)
        goto out;
    if (tokenize_answer(j, ids, n, strs) != TD_OK)
        td_openai_err_internal(&j->err, "out of memory");
out:
    free(ids);
    free(text);
    td_ireq_destroy(o);
}

/* {"tokens": [ids], "skip_special_tokens": bool (default false, as a
 * tokenizer's decode)} -> {"prompt": text}. */
static void
detokenize_run(rtok_job_t *j, json_t *body)
{
    const td_rtext_cfg_t *cfg = j->x->cfg.text;
    td_ireq_parse_t p = { .cfg = cfg->api, .e = &j->err };
    const json_t *ids = json_object_get(body, "tokens"), *skip = NULL;
    const char *key;
    json_t *v;
    td_tok_dec_t d = {0};
    td_buf_t t = {0};
    char *text;

    json_object_foreach(body, key, v) {
        if (strcmp(key, "tokens") != 0 && strcmp(key, "model") != 0 &&
            strcmp(key, "skip_special_tokens") != 0) {
            td_openai_err_set(&j->err, 400, INVALID_REQUEST, NULL, NULL,
                              "Unrecognized request argument supplied: %s", key);
            return;
        }
    }
    skip = json_object_get(body, "skip_special_tokens");
    if (skip != NULL && !json_is_null(skip) && !json_is_boolean(skip)) {
        td_ireq_bad_type(&p, "skip_special_tokens", "a boolean", skip);
        return;
    }
    if (ids == NULL || !json_is_array(ids)) {
        if (ids == NULL)
            td_ireq_missing(&p, "tokens");
        else
            td_ireq_bad_type(&p, "tokens", "an array of token ids", ids);
        return;
    }
    for (size_t i = 0; i < json_array_size(ids); i++) {
        td_ireq_param_t pp;
        int32_t id;
        td_ireq_param_fmt(pp, "tokens[%zu]", i);
        if (td_ireq_get_token(&p, pp, json_array_get(ids, i), &id) != TD_OK ||
            td_tok_decode(cfg->tok, &d, (const uint32_t *)&id, 1, json_is_true(skip), &t) !=
                TD_OK) {
            td_buf_free(&t);
            if (j->err.http == 0)
                td_openai_err_internal(&j->err, "could not decode the tokens");
            return;
        }
    }
    (void)td_tok_decode_flush(&d, &t);
    v = json_pack("{s:s%}", "prompt", t.data ? t.data : "", t.len);
    text = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    td_buf_free(&t);
    if (text == NULL || td_buf_puts(&j->out, text) != TD_OK)
        td_openai_err_internal(&j->err, "out of memory");
    free(text);
}

/* count_tokens: the prompt a Messages request would be sent with. */
static void
count_run(rtok_job_t *j)
{
    const td_rtext_cfg_t *cfg = j->x->cfg.text;
    td_ireq_t *o = NULL;
    uint32_t *ids = NULL;
    size_t n = 0;

    if (td_adapt_anthropic_parse(cfg->api, true, j->body, j->len, &o, &j->err) == TD_OK &&
        td_rtext_prompt_ids(cfg, o, &ids, &n, NULL, &j->err) == TD_OK &&
        td_buf_printf(&j->out, "{\"input_tokens\":%zu}", n) != TD_OK)
        td_openai_err_internal(&j->err, "out of memory");
    free(ids);
    td_ireq_destroy(o);
}

/* A stored response: GET (the response object), DELETE ({id, object,
 * deleted}), cancel (only background responses can be: none are). Another
 * key's, a missing or an expired one: 404. The store's I/O: this runs on a
 * text thread. */
static void
stored_run(rtok_job_t *j)
{
    td_rstore_t *store = j->x->cfg.store;
    json_t *rec = NULL;
    char *s = NULL;
    td_status_t st = store ? td_rstore_get(store, j->id, j->owner, &rec) : TD_ERR_NOT_FOUND;

    if (st != TD_OK) {
        td_openai_err_set(&j->err, 404, INVALID_REQUEST, NULL, NULL,
                          "No response found with id '%.96s'.%s", j->id,
                          store ? "" : " (This server stores no responses: it runs without "
                                       "responses-dir.)");
        return;
    }
    if (j->mode == TD_RTOK_RESPONSE_CANCEL) {
        td_openai_err_set(&j->err, 400, INVALID_REQUEST, NULL, NULL,
                          "Only responses created with background set to true can be "
                          "cancelled; this server makes none (the response '%.96s' is "
                          "complete).", j->id);
    } else if (j->mode == TD_RTOK_RESPONSE_DELETE) {
        if (td_rstore_delete(store, j->id, j->owner) != TD_OK)
            td_openai_err_set(&j->err, 404, INVALID_REQUEST, NULL, NULL,
                              "No response found with id '%.96s'.", j->id);
        else
            td_buf_printf(&j->out, "{\"id\":\"%s\",\"object\":\"response\",\"deleted\":true}",
                          j->id);
    } else if ((s = json_dumps(json_object_get(rec, "response"), JSON_COMPACT)) != NULL) {
        td_buf_puts(&j->out, s);
    }
    if (j->err.http == 0 && td_buf_status(&j->out) != TD_OK)
        td_openai_err_internal(&j->err, "out of memory");
    free(s);
    json_decref(rec);
}

static void
job_run(void *arg)
{
    rtok_job_t *j = arg;
    const td_ireq_cfg_t *api = j->x->cfg.text->api;
    json_error_t jerr;
    json_t *body;

    if (j->mode >= TD_RTOK_RESPONSE_GET) {
        stored_run(j);
        return;
    }

    if (j->len > api->max_body) {
        td_openai_err_too_big(&j->err, j->len, api->max_body);
        return;
    }
    body = json_loadb(j->body, j->len, 0, &jerr);
    if (body == NULL || !json_is_object(body)) {
        td_openai_err_set(&j->err, 400, INVALID_REQUEST, NULL, NULL,
                          "We could not parse the JSON body of your request: %s. The API "
                          "expects a JSON object.", body ? "not an object" : jerr.text);
        json_decref(body);
        return;
    }
    if (j->mode == TD_RTOK_DETOKENIZE)
        detokenize_run(j, body);
    else if (j->mode == TD_RTOK_TOKENIZE)
        tokenize_run(j, body);
    else
        count_run(j);
    json_decref(body);
}

/* ---- The loop ------------------------------------------------------------------ */

static void rtok_serve(td_rtok_t *x, td_http_req_t *hreq, td_rtok_mode_t mode, const char *id);

static void
job_done(void *arg)
{
    rtok_job_t *j = arg;
    td_http_req_t *h = j->hreq;

    if (h != NULL) {
        td_http_on_gone(h, NULL, NULL);
        j->hreq = NULL;
        if (j->err.http != 0)
            td_http_refuse(j->x->cfg.metrics, h, &j->err);
        else
            td_http_reply(h, 200, "application/json", j->out.data, j->out.len);
    }
    job_free(j);
}

static void
job_gone(td_http_req_t *hreq, void *arg)
{
    ((rtok_job_t *)arg)->hreq = NULL;
}

void
td_rtok_serve_stored(td_rtok_t *x, td_http_req_t *hreq, td_rtok_mode_t mode, const char *id)
{
    char buf[100];

    snprintf(buf, sizeof buf, "%s", id);
    rtok_serve(x, hreq, mode, buf);
}

void
td_rtok_serve(td_rtok_t *x, td_http_req_t *hreq, td_rtok_mode_t mode)
{
    rtok_serve(x, hreq, mode, NULL);
}

static void
rtok_serve(td_rtok_t *x, td_http_req_t *hreq, td_rtok_mode_t mode, const char *id)
{
    rtok_job_t *j = calloc(1, sizeof *j);
    td_openai_err_t e;

    if (j != NULL)
        j->body = td_http_body_take(hreq, &j->len);
    if (j == NULL || j->body == NULL) {
        free(j);
        td_openai_err_internal(&e, "out of memory");
        td_http_refuse(x->cfg.metrics, hreq, &e);
        return;
    }
    j->x = x;
    j->hreq = hreq;
    j->mode = mode;
    if (id != NULL) {
        snprintf(j->id, sizeof j->id, "%s", id);
        td_apikeys_owner(td_http_header(hreq, "Authorization"), td_http_header(hreq, "x-api-key"),
                         j->owner);
    }
    j->next = x->jobs;
    if (x->jobs)
        x->jobs->prev = j;
    x->jobs = j;
    td_http_on_gone(hreq, job_gone, j);
    if (td_jobq_post(x->cfg.pool, job_run, job_done, j) != TD_OK) {
        td_openai_err_internal(&e, "out of memory");
        td_http_on_gone(hreq, NULL, NULL);
        j->hreq = NULL;
        job_free(j);
        td_http_refuse(x->cfg.metrics, hreq, &e);
    }
}
