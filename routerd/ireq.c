/* routerd/ireq.c — the one internal request (ireq.h): the parse helpers the
 * protocol adapters share, the fields common to them (sampling, stop rules,
 * choices, output options, constraints, vLLM's extensions), the checks
 * across fields, and the request's life. */
#include "ireq.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "grammar.h"

#define INVALID_REQUEST "invalid_request_error"

/* ===================================================================== */
/* Field primitives: each fills p->e and returns a failure status, or TD_OK */
/* ===================================================================== */

void
td_ireq_param_fmt(td_ireq_param_t pp, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pp, sizeof(td_ireq_param_t), fmt, ap);
    va_end(ap);
}

const char *
td_ireq_json_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:  return "an object";
    case JSON_ARRAY:   return "an array";
    case JSON_STRING:  return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL:    return "a decimal";
    case JSON_TRUE:
    case JSON_FALSE:   return "a boolean";
    case JSON_NULL:    return "null";
    }
    return "an unknown type";
}

td_status_t
td_ireq_bad_type(td_ireq_parse_t *p, const char *param, const char *expected, const json_t *v)
{
    td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "invalid_type",
                      "Invalid type for '%s': expected %s, but got %s instead.", param,
                      expected, td_ireq_json_type(v));
    return TD_ERR_INVALID;
}

td_status_t
td_ireq_missing(td_ireq_parse_t *p, const char *param)
{
    td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "missing_required_parameter",
                      "Missing required parameter: '%s'.", param);
    return TD_ERR_INVALID;
}

td_status_t
td_ireq_unsupported(td_ireq_parse_t *p, const char *param, const char *why)
{
    td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "unsupported_value",
                      "Unsupported value for '%s': %s", param, why);
    return TD_ERR_UNSUPPORTED;
}

td_status_t
td_ireq_nomem(td_ireq_parse_t *p)
{
    td_openai_err_internal(p->e, "out of memory");
    return TD_ERR_NOMEM;
}

td_status_t
td_ireq_get_int(td_ireq_parse_t *p, const char *param, const json_t *v, int64_t min, int64_t max,
        int64_t *out)
{
    if (!json_is_integer(v))
        return td_ireq_bad_type(p, param, "an integer", v);
    int64_t x = json_integer_value(v);
    if (x < min || x > max) {
        bool below = x < min;
        td_openai_err_set(p->e, 400, INVALID_REQUEST, param,
                          below ? "integer_below_min_value" : "integer_above_max_value",
                          "Invalid '%s': integer %s value. Expected a value %s %lld, but got "
                          "%lld instead.", param, below ? "below minimum" : "above maximum",
                          below ? ">=" : "<=", (long long)(below ? min : max), (long long)x);
        return TD_ERR_INVALID;
    }
    *out = x;
    return TD_OK;
}

/* A number in [lo, hi], or (lo, hi] when lo_open. */
td_status_t
td_ireq_get_number(td_ireq_parse_t *p, const char *param, const json_t *v, double lo, bool lo_open, double hi,
           double *out)
{
    if (!json_is_number(v))
        return td_ireq_bad_type(p, param, "a number", v);
    double x = json_number_value(v);
    bool below = lo_open ? !(x > lo) : !(x >= lo);
    if (below || !(x <= hi)) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, param,
                          below ? "decimal_below_min_value" : "decimal_above_max_value",
                          "Invalid '%s': decimal %s value. Expected a value %s %g, but got %g "
                          "instead.", param, below ? "below minimum" : "above maximum",
                          below ? (lo_open ? ">" : ">=") : "<=", below ? lo : hi, x);
        return TD_ERR_INVALID;
    }
    *out = x;
    return TD_OK;
}

td_status_t
td_ireq_get_bool(td_ireq_parse_t *p, const char *param, const json_t *v, bool *out)
{
    if (!json_is_boolean(v))
        return td_ireq_bad_type(p, param, "a boolean", v);
    *out = json_is_true(v);
    return TD_OK;
}

td_status_t
td_ireq_get_string(td_ireq_parse_t *p, const char *param, const json_t *v, char **out)
{
    if (!json_is_string(v))
        return td_ireq_bad_type(p, param, "a string", v);
    if ((*out = strdup(json_string_value(v))) == NULL)
        return td_ireq_nomem(p);
    return TD_OK;
}

/* The raw JSON of v, kept for a later stage (the chat encoder). */
td_status_t
td_ireq_get_raw(td_ireq_parse_t *p, const json_t *v, char **out)
{
    if ((*out = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY)) == NULL)
        return td_ireq_nomem(p);
    return TD_OK;
}

td_status_t
td_ireq_empty_array(td_ireq_parse_t *p, const char *param)
{
    td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "empty_array",
                      "Invalid '%s': empty array. Expected an array with minimum length 1, "
                      "but got an empty array instead.", param);
    return TD_ERR_INVALID;
}


td_status_t
td_ireq_get_token(td_ireq_parse_t *p, const char *param, const json_t *v, int32_t *out)
{
    uint64_t limit = p->cfg->vocab ? p->cfg->vocab : (uint64_t)INT32_MAX + 1;
    json_int_t id;

    if (!json_is_integer(v))
        return td_ireq_bad_type(p, param, "an integer (a token id)", v);
    id = json_integer_value(v);
    if (id < 0 || (uint64_t)id >= limit) {
        if (p->cfg->vocab)
            td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "invalid_value",
                              "Invalid '%s': token id %lld is outside the vocabulary of this "
                              "model (ids 0 to %u).", param, (long long)id, p->cfg->vocab - 1);
        else
            td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "invalid_value",
                              "Invalid '%s': token id %lld is not a token id (0 to %d).", param,
                              (long long)id, INT32_MAX);
        return TD_ERR_INVALID;
    }
    *out = (int32_t)id;
    return TD_OK;
}

/* ===================================================================== */
/* The shared fields: sampling                                            */
/* ===================================================================== */

static td_status_t
field_stream(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    return td_ireq_get_bool(p, key, v, &p->req->out.stream);
}

static td_status_t
field_stream_options(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    const json_t *u;

    if (!json_is_object(v))
        return td_ireq_bad_type(p, key, "an object", v);
    p->has_stream_options = true;
    u = json_object_get(v, "include_usage");
    if (u == NULL || json_is_null(u))
        return TD_OK;
    return td_ireq_get_bool(p, "stream_options.include_usage", u, &p->req->out.include_usage);
}

static td_status_t
field_max_tokens(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    int64_t *dst = strcmp(key, "max_tokens") == 0 ? &p->max_tokens : &p->max_completion;
    return td_ireq_get_int(p, key, v, 1, p->cfg->max_tokens_limit, dst);
}

static td_status_t
field_min_tokens(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    int64_t n = 0;
    td_status_t rc = td_ireq_get_int(p, key, v, 0, p->cfg->max_tokens_limit, &n);

    p->req->sampling.min_tokens = (uint32_t)n;
    return rc;
}

/* One of the sampler's numbers: temperature, top_p, min_p, the penalties
 * (engine/sample.h's bounds). */
static td_status_t
field_number(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    static const struct {
        const char *name;
        size_t off;
        double lo, hi;
        bool lo_open;
    } nums[] = {
        { "temperature", offsetof(td_ireq_sampling_t, temperature), 0, 2, false },
        { "top_p", offsetof(td_ireq_sampling_t, top_p), 0, 1, true },
        { "min_p", offsetof(td_ireq_sampling_t, min_p), 0, 1, false },
        { "repetition_penalty", offsetof(td_ireq_sampling_t, repetition_penalty), 0,
          TD_IREQ_REPETITION_MAX, true },
        { "presence_penalty", offsetof(td_ireq_sampling_t, presence_penalty),
          -TD_IREQ_PENALTY_LIMIT, TD_IREQ_PENALTY_LIMIT, false },
        { "frequency_penalty", offsetof(td_ireq_sampling_t, frequency_penalty),
          -TD_IREQ_PENALTY_LIMIT, TD_IREQ_PENALTY_LIMIT, false },
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if (strcmp(nums[i].name, key) == 0)
            return td_ireq_get_number(p, key, v, nums[i].lo, nums[i].lo_open, nums[i].hi,
                                      (double *)((char *)&p->req->sampling + nums[i].off));
    return TD_ERR_INTERNAL;
}

/* vLLM's top_k: -1 or 0 is off, else the k most likely. */
static td_status_t
field_top_k(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    int64_t k = 0;
    td_status_t rc = td_ireq_get_int(p, key, v, -1, INT32_MAX, &k);

    p->req->sampling.top_k = k > 0 ? (uint32_t)k : 0;
    return rc;
}

static td_status_t
field_seed(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    td_status_t rc = td_ireq_get_int(p, key, v, INT64_MIN, INT64_MAX, &p->req->sampling.seed);
    p->req->sampling.has_seed = rc == TD_OK;
    return rc;
}

/* An extension (vLLM has one too, ordered the other way): the admission
 * queue serves higher values first. */
static td_status_t
field_priority(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    int64_t prio = 0;
    td_status_t rc = td_ireq_get_int(p, key, v, INT32_MIN, INT32_MAX, &prio);

    p->req->priority = (int32_t)prio;
    return rc;
}

/* {"<token id>": bias in [-100, 100], ...}: ids in the vocabulary, at most
 * TD_OPENAI_MAX_BIAS of them. */
static td_status_t
field_logit_bias(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    td_ireq_sampling_t *s = &p->req->sampling;
    const char *k;
    const json_t *b;
    size_t n;

    if (!json_is_object(v))
        return td_ireq_bad_type(p, key, "an object", v);
    n = json_object_size(v);
    if (n == 0)
        return TD_OK;
    if (n > TD_OPENAI_MAX_BIAS) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, key, "invalid_value",
                          "Invalid '%s': %zu tokens, this server takes at most %d.", key, n,
                          TD_OPENAI_MAX_BIAS);
        return TD_ERR_INVALID;
    }
    if ((s->logit_bias = calloc(n, sizeof(*s->logit_bias))) == NULL)
        return td_ireq_nomem(p);
    json_object_foreach((json_t *)v, k, b) {
        td_ireq_param_t pp;
        char *end = NULL;
        long long id;
        double x;

        td_ireq_param_fmt(pp, "%s.%s", key, k);
        errno = 0;
        id = k[0] >= '0' && k[0] <= '9' ? strtoll(k, &end, 10) : -1;
        if (id < 0 || end == NULL || *end != '\0' || errno != 0 || id > INT32_MAX) {
            td_openai_err_set(p->e, 400, INVALID_REQUEST, key, "invalid_value",
                              "Invalid key in '%s': '%s' is not a token id.", key, k);
            return TD_ERR_INVALID;
        }
        if (p->cfg->vocab != 0 && (uint64_t)id >= p->cfg->vocab) {
            td_openai_err_set(p->e, 400, INVALID_REQUEST, key, "invalid_value",
                              "Invalid '%s': token id %lld is outside the vocabulary of this "
                              "model (%u tokens).", key, id, p->cfg->vocab);
            return TD_ERR_INVALID;
        }
        td_status_t rc = td_ireq_get_number(p, pp, b, -100, false, 100, &x);
        if (rc != TD_OK)
            return rc;
        for (size_t i = 0; i < s->nbias; i++)
            if (s->logit_bias[i].token == id) {   /* "7" and "07" */
                td_openai_err_set(p->e, 400, INVALID_REQUEST, key, "invalid_value",
                                  "Invalid '%s': token id %lld is given twice.", key, id);
                return TD_ERR_INVALID;
            }
        s->logit_bias[s->nbias++] = (td_openai_bias_t){ (int32_t)id, (float)x };
    }
    return TD_OK;
}

/* ===================================================================== */
/* The shared fields: stop rules, choices, output                          */
/* ===================================================================== */

static td_status_t
add_stop(td_ireq_parse_t *p, const char *param, const json_t *s)
{
    td_ireq_stop_t *st = &p->req->stop;
    size_t cap = p->cfg->max_stop_bytes ? p->cfg->max_stop_bytes : TD_OPENAI_STOP_BYTES;

    if (!json_is_string(s))
        return td_ireq_bad_type(p, param, "a string", s);
    if (json_string_length(s) == 0) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "invalid_value",
                          "Invalid '%s': stop sequences must not be empty.", param);
        return TD_ERR_INVALID;
    }
    if (json_string_length(s) > cap) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "string_above_max_length",
                          "Invalid '%s': a stop sequence of %zu bytes; this server takes at "
                          "most %zu bytes per stop sequence (max-stop-bytes).", param,
                          json_string_length(s), cap);
        return TD_ERR_INVALID;
    }
    return td_ireq_get_string(p, param, s, &st->strings[st->nstrings++]);
}

static td_status_t
field_stop(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    size_t n;

    if (json_is_string(v))
        return add_stop(p, key, v);
    if (!json_is_array(v))
        return td_ireq_bad_type(p, key, "a string or an array of strings", v);
    n = json_array_size(v);
    if (n > TD_OPENAI_MAX_STOP) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, key, "array_above_max_length",
                          "Invalid '%s': array too long. Expected an array with maximum "
                          "length %d, but got an array with length %zu instead.", key,
                          TD_OPENAI_MAX_STOP, n);
        return TD_ERR_INVALID;
    }
    for (size_t i = 0; i < n; i++) {
        td_ireq_param_t pp;
        td_ireq_param_fmt(pp, "stop[%zu]", i);
        td_status_t rc = add_stop(p, pp, json_array_get(v, i));
        if (rc != TD_OK)
            return rc;
    }
    return TD_OK;
}

/* vLLM's stop_token_ids: ids of the vocabulary that end a choice as an EOS
 * id does (with the model's, at most TD_IREQ_MAX_STOP_IDS: td_ireq_finish). */
static td_status_t
field_stop_token_ids(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    td_ireq_stop_t *st = &p->req->stop;

    if (!json_is_array(v))
        return td_ireq_bad_type(p, key, "an array of token ids", v);
    if (json_array_size(v) > TD_IREQ_MAX_STOP_IDS) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, key, "array_above_max_length",
                          "Invalid '%s': array too long. Expected an array with maximum "
                          "length %d, but got an array with length %zu instead.", key,
                          TD_IREQ_MAX_STOP_IDS, json_array_size(v));
        return TD_ERR_INVALID;
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        td_ireq_param_t pp;
        int32_t id;
        td_status_t rc;
        bool dup = false;

        td_ireq_param_fmt(pp, "%s[%zu]", key, i);
        if ((rc = td_ireq_get_token(p, pp, json_array_get(v, i), &id)) != TD_OK)
            return rc;
        for (size_t j = 0; j < st->ntoken_ids; j++)
            dup |= st->token_ids[j] == id;
        if (!dup)
            st->token_ids[st->ntoken_ids++] = id;
    }
    return TD_OK;
}

/* The booleans of the stop rules and the output. */
static td_status_t
field_flag(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    td_ireq_t *r = p->req;
    bool *dst = strcmp(key, "ignore_eos") == 0                   ? &r->stop.ignore_eos
              : strcmp(key, "include_stop_str_in_output") == 0   ? &r->stop.include_stop_str
              : strcmp(key, "skip_special_tokens") == 0          ? &r->out.skip_special
                                                                 : NULL;
    return dst ? td_ireq_get_bool(p, key, v, dst) : TD_ERR_INTERNAL;
}

static td_status_t
field_n(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    uint32_t max = p->cfg->max_n ? p->cfg->max_n : TD_IREQ_DEFAULT_MAX_N;
    int64_t n = 1;
    td_status_t rc = td_ireq_get_int(p, key, v, 1, max, &n);

    p->req->n = (uint32_t)n;
    return rc;
}

/* best_of: sample best_of sequences, return the n most likely. Not offered:
 * every choice generated is returned (n); 1 (or n itself) asks nothing. */
static td_status_t
field_best_of(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    if (!json_is_integer(v))
        return td_ireq_bad_type(p, key, "an integer", v);
    if (json_integer_value(v) == 1)
        return TD_OK;
    return td_ireq_unsupported(p, key, "best_of is not supported by this server: it would "
                                       "generate best_of sequences and return only the n most "
                                       "likely; use n, which returns every sequence it "
                                       "generates.");
}

/* An object field read key by key: fn(p, "key.k", k, value) for each. */
static td_status_t
object_each(td_ireq_parse_t *p, const char *key, const json_t *v,
            td_status_t (*fn)(td_ireq_parse_t *p, const char *param, const char *k,
                              const json_t *x))
{
    const char *k;
    const json_t *x;

    if (!json_is_object(v))
        return td_ireq_bad_type(p, key, "an object", v);
    json_object_foreach((json_t *)v, k, x) {
        td_ireq_param_t pp;
        td_status_t rc;

        td_ireq_param_fmt(pp, "%s.%s", key, k);
        if ((rc = fn(p, pp, k, x)) != TD_OK)
            return rc;
    }
    return TD_OK;
}

/* chat_template_kwargs: the V4.1 chat template's switch, as vLLM passes it
 * ({"thinking": bool}); any other key changes a template this server does
 * not take, so it is refused. */
static td_status_t
template_kwarg(td_ireq_parse_t *p, const char *param, const char *k, const json_t *x)
{
    bool on;
    td_status_t rc;

    if (strcmp(k, "thinking") != 0)
        return td_ireq_unsupported(p, param, "this server's chat template (DeepSeek-V4.1) "
                                             "takes only 'thinking'.");
    if (json_is_null(x))
        return TD_OK;
    if ((rc = td_ireq_get_bool(p, param, x, &on)) == TD_OK)
        p->req->reasoning.thinking = on;
    return rc;
}

static td_status_t
field_chat_template_kwargs(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    return object_each(p, key, v, template_kwarg);
}

/* ===================================================================== */
/* The shared fields: constraints (structured output)                     */
/* ===================================================================== */

/* vLLM's guided_json / guided_regex / guided_choice / guided_grammar, and
 * structured_outputs {json, regex, choice, grammar}: recorded as the
 * request's constraint (td_ireq_finish refuses it until the grammar engine
 * is wired). */
static td_status_t
constraint_set(td_ireq_parse_t *p, const char *param, td_ireq_constraint_kind_t kind,
               const json_t *spec)
{
    td_ireq_constraint_t *c = &p->req->constraint;

    if (c->kind != TD_IREQ_CONSTRAINT_NONE) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "invalid_value",
                          "Invalid '%s': the request asks for structured output already "
                          "('%s'); send one.", param, c->param);
        return TD_ERR_INVALID;
    }
    c->kind = kind;
    c->spec = spec ? json_incref((json_t *)spec) : NULL;
    snprintf(c->param, sizeof c->param, "%s", param);
    return TD_OK;
}

td_status_t
td_ireq_constraint_set(td_ireq_parse_t *p, const char *param, td_ireq_constraint_kind_t kind,
                       const json_t *spec)
{
    return constraint_set(p, param, kind, spec);
}

static const struct {
    const char *name;     /* guided_<name> and structured_outputs.<name> */
    td_ireq_constraint_kind_t kind;
    json_type type;       /* JSON_TRUE: any; else the one type taken */
} constraint_kinds[] = {
    { "json", TD_IREQ_CONSTRAINT_JSON_SCHEMA, JSON_TRUE },
    { "regex", TD_IREQ_CONSTRAINT_REGEX, JSON_STRING },
    { "choice", TD_IREQ_CONSTRAINT_CHOICE, JSON_ARRAY },
    { "grammar", TD_IREQ_CONSTRAINT_GRAMMAR, JSON_STRING },
};

static td_status_t
constraint_of(td_ireq_parse_t *p, const char *param, const char *name, const json_t *v)
{
    for (size_t i = 0; i < sizeof constraint_kinds / sizeof constraint_kinds[0]; i++) {
        if (strcmp(constraint_kinds[i].name, name) != 0)
            continue;
        if (constraint_kinds[i].type != JSON_TRUE && json_typeof(v) != constraint_kinds[i].type)
            return td_ireq_bad_type(p, param, constraint_kinds[i].type == JSON_STRING
                                                  ? "a string" : "an array", v);
        return constraint_set(p, param, constraint_kinds[i].kind, v);
    }
    return td_ireq_unsupported(p, param, "structured_outputs takes json, regex, choice or "
                                         "grammar.");
}

static td_status_t
field_guided(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    return constraint_of(p, key, key + strlen("guided_"), v);
}

static td_status_t
structured_output(td_ireq_parse_t *p, const char *param, const char *k, const json_t *x)
{
    return json_is_null(x) ? TD_OK : constraint_of(p, param, k, x);
}

static td_status_t
field_structured_outputs(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    return object_each(p, key, v, structured_output);
}

/* response_format: text asks for nothing; json_object and json_schema are
 * constraints. */
static td_status_t
field_response_format(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    const json_t *t, *js;
    const char *type;

    if (!json_is_object(v))
        return td_ireq_bad_type(p, key, "an object", v);
    t = json_object_get(v, "type");
    if (t == NULL)
        return td_ireq_missing(p, "response_format.type");
    if (!json_is_string(t))
        return td_ireq_bad_type(p, "response_format.type", "a string", t);
    type = json_string_value(t);
    if (strcmp(type, "text") == 0)
        return TD_OK;
    if (strcmp(type, "json_object") == 0)
        return constraint_set(p, "response_format.type", TD_IREQ_CONSTRAINT_JSON_OBJECT, NULL);
    if (strcmp(type, "json_schema") != 0) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, "response_format.type", "invalid_value",
                          "Invalid value: '%s'. Supported values are: 'text', 'json_object' "
                          "and 'json_schema'.", type);
        return TD_ERR_INVALID;
    }
    js = json_object_get(v, "json_schema");
    if (js == NULL || json_is_null(js))
        return td_ireq_missing(p, "response_format.json_schema");
    if (!json_is_object(js))
        return td_ireq_bad_type(p, "response_format.json_schema", "an object", js);
    p->req->constraint.strict = json_is_true(json_object_get(js, "strict"));
    return constraint_set(p, "response_format.json_schema", TD_IREQ_CONSTRAINT_JSON_SCHEMA,
                          json_object_get(js, "schema"));
}

/* Type-checked only: user is accepted for compatibility and not used. */
static td_status_t
field_user(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    return json_is_string(v) ? TD_OK : td_ireq_bad_type(p, key, "a string", v);
}

#define CHAT TD_IREQ_KIND(TD_OPENAI_CHAT)
#define COMP TD_IREQ_KIND(TD_OPENAI_COMPLETION)

static const td_ireq_field_t shared_fields[] = {
    { "stream",                     CHAT | COMP, field_stream, false },
    { "stream_options",             CHAT | COMP, field_stream_options, false },
    { "max_tokens",                 CHAT | COMP, field_max_tokens, false },
    { "max_completion_tokens",      CHAT,        field_max_tokens, false },
    { "min_tokens",                 CHAT | COMP, field_min_tokens, false },
    { "temperature",                CHAT | COMP, field_number, false },
    { "top_p",                      CHAT | COMP, field_number, false },
    { "top_k",                      CHAT | COMP, field_top_k, false },
    { "min_p",                      CHAT | COMP, field_number, false },
    { "repetition_penalty",         CHAT | COMP, field_number, false },
    { "presence_penalty",           CHAT | COMP, field_number, false },
    { "frequency_penalty",          CHAT | COMP, field_number, false },
    { "seed",                       CHAT | COMP, field_seed, false },
    { "priority",                   CHAT | COMP, field_priority, false },
    { "logit_bias",                 CHAT | COMP, field_logit_bias, false },
    { "stop",                       CHAT | COMP, field_stop, false },
    { "stop_token_ids",             CHAT | COMP, field_stop_token_ids, false },
    { "ignore_eos",                 CHAT | COMP, field_flag, false },
    { "include_stop_str_in_output", CHAT | COMP, field_flag, false },
    { "skip_special_tokens",        CHAT | COMP, field_flag, false },
    { "n",                          CHAT | COMP, field_n, false },
    { "best_of",                    CHAT | COMP, field_best_of, false },
    { "chat_template_kwargs",       CHAT,        field_chat_template_kwargs, false },
    { "response_format",            CHAT,        field_response_format, false },
    { "guided_json",                CHAT | COMP, field_guided, false },
    { "guided_regex",               CHAT | COMP, field_guided, false },
    { "guided_choice",              CHAT | COMP, field_guided, false },
    { "guided_grammar",             CHAT | COMP, field_guided, false },
    { "structured_outputs",         CHAT | COMP, field_structured_outputs, false },
    { "user",                       CHAT | COMP, field_user, false },
};

const td_ireq_field_t *
td_ireq_field_find(td_openai_kind_t kind, const char *name)
{
    for (size_t i = 0; i < sizeof shared_fields / sizeof shared_fields[0]; i++)
        if ((shared_fields[i].kinds & TD_IREQ_KIND(kind)) &&
            strcmp(shared_fields[i].name, name) == 0)
            return &shared_fields[i];
    return NULL;
}

/* vLLM's request fields this server does not take: named so in the refusal,
 * so that a client moving over knows it is no typo. */
static const char *const vllm_unsupported[] = {
    "use_beam_search", "length_penalty", "early_stopping", "bad_words", "allowed_token_ids",
    "prompt_logprobs", "truncate_prompt_tokens", "spaces_between_special_tokens",
    "add_generation_prompt", "continue_final_message", "add_special_tokens", "documents",
    "chat_template", "mm_processor_kwargs", "guided_decoding_backend",
    "guided_whitespace_pattern", "structural_tag", "logits_processors",
    "return_tokens_as_token_ids", "return_token_ids", "cache_salt", "kv_transfer_params",
    "vllm_xargs", "request_id", "prompt_embeds", "thinking_token_budget", "detokenize",
    "output_kind", "media_io_kwargs",
};

static td_status_t
unknown_field(td_ireq_parse_t *p, const char *key)
{
    for (size_t i = 0; i < sizeof vllm_unsupported / sizeof vllm_unsupported[0]; i++)
        if (strcmp(vllm_unsupported[i], key) == 0) {
            td_openai_err_set(p->e, 400, INVALID_REQUEST, key, "unsupported_parameter",
                              "Unrecognized request argument supplied: %s (a vLLM extension "
                              "this server does not support; docs/api.md lists the ones it "
                              "does).", key);
            return TD_ERR_INVALID;
        }
    td_openai_err_set(p->e, 400, INVALID_REQUEST, NULL, NULL,
                      "Unrecognized request argument supplied: %s", key);
    return TD_ERR_INVALID;
}

/* ===================================================================== */
/* Parsing                                                                */
/* ===================================================================== */

td_ireq_t *
td_ireq_new(td_openai_kind_t kind)
{
    td_ireq_t *r = calloc(1, sizeof *r);

    if (r == NULL)
        return NULL;
    r->kind = kind;
    r->sampling.temperature = 1;
    r->sampling.top_p = 1;
    r->sampling.repetition_penalty = 1;
    r->n = 1;
    r->out.skip_special = true;
    r->reasoning.thinking = -1;
    return r;
}

size_t
td_ireq_stop_ids(const td_ireq_t *req, const td_ireq_cfg_t *cfg,
                 int32_t out[TD_IREQ_MAX_STOP_IDS])
{
    size_t n = 0;

    for (size_t i = 0; i < req->stop.ntoken_ids && n < TD_IREQ_MAX_STOP_IDS; i++)
        out[n++] = req->stop.token_ids[i];
    for (uint32_t i = 0; !req->stop.ignore_eos && i < cfg->nmodel_stop; i++) {
        bool dup = false;
        for (size_t j = 0; j < n; j++)
            dup |= out[j] == cfg->model_stop[i];
        if (!dup && n < TD_IREQ_MAX_STOP_IDS)
            out[n++] = cfg->model_stop[i];
    }
    return n;
}

/* The stop ids with the model's fit the sampler's bound. */
static td_status_t
finish_stop_ids(td_ireq_parse_t *p)
{
    const td_ireq_t *r = p->req;
    size_t n = r->stop.ntoken_ids;

    for (uint32_t i = 0; !r->stop.ignore_eos && i < p->cfg->nmodel_stop; i++) {
        bool dup = false;
        for (size_t j = 0; j < r->stop.ntoken_ids; j++)
            dup |= r->stop.token_ids[j] == p->cfg->model_stop[i];
        n += !dup;
    }
    if (n <= TD_IREQ_MAX_STOP_IDS)
        return TD_OK;
    td_openai_err_set(p->e, 400, INVALID_REQUEST, "stop_token_ids", "array_above_max_length",
                      "Invalid 'stop_token_ids': with the model's %u end-of-sequence ids they "
                      "are %zu stop tokens; this server takes at most %d.", p->cfg->nmodel_stop,
                      n, TD_IREQ_MAX_STOP_IDS);
    return TD_ERR_INVALID;
}

/* The first token of every choice and its log-probabilities travel from
 * the prefill rank to the decode rank in one transfer notification (at most
 * 4096 bytes): the choices it can hold with top_logprobs alternatives each,
 * from the worst-case sizes of their protobuf fields. */
static uint32_t
finish_max_n_logprobs(uint32_t top)
{
    uint32_t per = 23 + 17 * top;   /* a token, a TokenLogprob and its TopLogprobs */

    return (TD_IREQ_NOTE_BUDGET - 64) / per;
}

/* Whether a message of the conversation says "json" (any case): OpenAI's
 * rule for json_object. */
static bool
finish_mentions_json(const td_ireq_t *r)
{
    for (size_t i = 0; i < r->nmsgs; i++)
        for (const char *c = r->msgs[i].content; c != NULL && *c; c++)
            if (strncasecmp(c, "json", 4) == 0)
                return true;
    return false;
}

/* tool_choice "required" or {"type": "function", "function": {"name"}} with
 * tools: the DSML calls become the constraint, {"tools": [their function
 * objects], "name": the forced one, "single": parallel_tool_calls false};
 * its text, or NULL when tool_choice forces nothing. */
static char *
finish_tool_spec(const td_ireq_t *r)
{
    json_t *tc = r->tool_choice ? json_loads(r->tool_choice, JSON_DECODE_ANY, NULL) : NULL;
    json_t *tools = r->tools ? json_loads(r->tools, 0, NULL) : NULL;
    json_t *spec = NULL, *fns = json_array(), *name = NULL;
    char *text = NULL;

    if (json_is_object(tc))
        name = json_object_get(json_object_get(tc, "function"), "name");
    if (!(json_is_string(tc) && strcmp(json_string_value(tc), "required") == 0) &&
        !json_is_string(name))
        goto out;
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *fn = json_object_get(json_array_get(tools, i), "function");
        if (json_is_object(fn))
            json_array_append(fns, fn);
    }
    if (json_array_size(fns) == 0)
        goto out;
    spec = json_pack("{s:O}", "tools", fns);
    if (spec != NULL && name != NULL)
        json_object_set(spec, "name", name);
    if (spec != NULL && json_is_false(json_object_get(r->body, "parallel_tool_calls")))
        json_object_set_new(spec, "single", json_true());   /* one call only */
    text = spec != NULL ? json_dumps(spec, JSON_COMPACT) : NULL;
out:
    json_decref(spec);
    json_decref(fns);
    json_decref(tc);
    json_decref(tools);
    return text;
}

/* The constraint's spec as the grammar engine reads it. */
static char *
finish_constraint_text(const td_ireq_constraint_t *c)
{
    const json_t *schema;

    switch (c->kind) {
    case TD_IREQ_CONSTRAINT_JSON_OBJECT:
        return strdup("");
    case TD_IREQ_CONSTRAINT_JSON_SCHEMA:
        /* text.format and output_config.format record their format object
         * ({type, name, schema, strict}); the other fields the schema itself */
        schema = strcmp(c->param, "text.format") == 0 ||
                         strcmp(c->param, "output_config.format") == 0
                     ? json_object_get(c->spec, "schema") : c->spec;
        return schema != NULL ? json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY)
                              : strdup("{}");
    case TD_IREQ_CONSTRAINT_CHOICE:
        return json_dumps(c->spec, JSON_COMPACT | JSON_ENCODE_ANY);
    default:
        return strdup(json_is_string(c->spec) ? json_string_value(c->spec) : "");
    }
}

/* The constraint compiled against the vocabulary (the ranks compile it
 * again where they sample): a spec the engine refuses is a 400 naming the
 * field and the part (docs/structured-output.md). */
static td_status_t
finish_constraint(td_ireq_parse_t *p)
{
    td_ireq_constraint_t *c = &p->req->constraint;
    td_grammar_opts_t o = { .strict = c->strict, .max_spec_bytes = p->cfg->max_constraint_bytes,
                            .budget_ms = p->cfg->constraint_budget_ms };
    td_grammar_err_t ge;
    td_grammar_t *g;
    td_status_t st;

    if (p->req->kind == TD_OPENAI_CHAT && p->req->tools != NULL && p->req->tool_choice != NULL) {
        char *tools = finish_tool_spec(p->req);
        if (tools != NULL && c->kind != TD_IREQ_CONSTRAINT_NONE) {
            free(tools);
            td_openai_err_set(p->e, 400, INVALID_REQUEST, "tool_choice", "unsupported_value",
                              "Unsupported value for 'tool_choice': a forced tool call together "
                              "with '%s' is not supported.", c->param);
            return TD_ERR_UNSUPPORTED;
        }
        if (tools != NULL && p->cfg->gvocab == NULL) {
            free(tools);   /* without a vocabulary the prompt still opens the block */
        } else if (tools != NULL) {
            c->kind = TD_IREQ_CONSTRAINT_TOOL_CALLS;
            c->text = tools;
            snprintf(c->param, sizeof c->param, "tool_choice");
        }
    }
    if (c->kind == TD_IREQ_CONSTRAINT_NONE)
        return TD_OK;
    if (p->cfg->gvocab == NULL) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, c->param, "unsupported_value",
                          "Unsupported value for '%s': structured output needs the model's "
                          "tokenizer, and this server runs without one.", c->param);
        return TD_ERR_UNSUPPORTED;
    }
    if (c->kind == TD_IREQ_CONSTRAINT_JSON_OBJECT && p->req->kind == TD_OPENAI_CHAT &&
        !finish_mentions_json(p->req)) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, "messages", "invalid_value",
                          "'messages' must contain the word 'json' in some form, to use "
                          "'response_format' of type 'json_object'.");
        return TD_ERR_INVALID;
    }
    if (c->text == NULL && (c->text = finish_constraint_text(c)) == NULL)
        return td_ireq_nomem(p);
    st = td_grammar_compile(p->cfg->gvocab, (td_grammar_kind_t)(c->kind - 1), c->text,
                            strlen(c->text), &o, &g, &ge);
    if (st == TD_ERR_NOMEM)
        return td_ireq_nomem(p);
    if (st != TD_OK) {
        /* "<param>.schema.<path> <message>": the message names the path's last part */
        const char *sub = c->kind == TD_IREQ_CONSTRAINT_JSON_SCHEMA &&
                          (strncmp(c->param, "response_format", 15) == 0 ||
                           strcmp(c->param, "text.format") == 0 ||
                           strcmp(c->param, "output_config.format") == 0) ? ".schema" : "";
        const char *last = strrchr(ge.path, '.') ? strrchr(ge.path, '.') + 1 : ge.path;
        size_t ll = strlen(last);
        bool named = ll > 0 && strncmp(ge.msg, last, ll) == 0 && ge.msg[ll] == ' ';
        td_openai_err_set(p->e, 400, INVALID_REQUEST, c->param,
                          st == TD_ERR_UNSUPPORTED ? "unsupported_value" : "invalid_value",
                          "%s%s%s%s%s%s", c->param, sub, ge.path[0] ? "." : "", ge.path,
                          named ? "" : ": ", named ? ge.msg + ll : ge.msg);
        return st;
    }
    td_grammar_destroy(g);
    return TD_OK;
}

td_status_t
td_ireq_finish(td_ireq_parse_t *p)
{
    td_ireq_t *r = p->req;
    td_status_t rc;

    if (!p->has_model)
        return td_ireq_missing(p, "model");
    if (!p->has_body)
        return td_ireq_missing(p, r->kind == TD_OPENAI_COMPLETION ? "prompt"
                                  : r->kind == TD_OPENAI_RESPONSES ? "input" : "messages");
    if (p->has_stream_options && !r->out.stream) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, "stream_options", "invalid_value",
                          "The 'stream_options' parameter is only allowed when 'stream' is "
                          "enabled.");
        return TD_ERR_INVALID;
    }
    if (r->kind == TD_OPENAI_CHAT && r->out.top_logprobs > 0 && !r->out.logprobs) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, "top_logprobs", "invalid_value",
                          "Invalid 'top_logprobs': it needs 'logprobs' set to true.");
        return TD_ERR_INVALID;
    }
    if (p->max_tokens && p->max_completion && p->max_tokens != p->max_completion) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, "max_tokens", "invalid_value",
                          "'max_tokens' (%lld) and 'max_completion_tokens' (%lld) disagree; "
                          "send one of them.", (long long)p->max_tokens,
                          (long long)p->max_completion);
        return TD_ERR_INVALID;
    }
    r->sampling.max_tokens = p->max_completion ? (uint32_t)p->max_completion
                           : p->max_tokens     ? (uint32_t)p->max_tokens
                                               : p->cfg->max_tokens_default;
    if (r->sampling.max_tokens > p->cfg->max_tokens_limit)
        r->sampling.max_tokens = p->cfg->max_tokens_limit;
    if (r->sampling.min_tokens > r->sampling.max_tokens) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, "min_tokens", "invalid_value",
                          "Invalid 'min_tokens': %u is above max_tokens (%u).",
                          r->sampling.min_tokens, r->sampling.max_tokens);
        return TD_ERR_INVALID;
    }
    if (r->n > 1 && r->out.logprobs && r->n > finish_max_n_logprobs(r->out.top_logprobs)) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, "n", "integer_above_max_value",
                          "Invalid 'n': with log-probabilities and %u alternatives each, this "
                          "server takes at most %u choices (their first tokens travel "
                          "together from the prefill rank).", r->out.top_logprobs,
                          finish_max_n_logprobs(r->out.top_logprobs));
        return TD_ERR_INVALID;
    }
    if ((rc = finish_stop_ids(p)) != TD_OK || (rc = finish_constraint(p)) != TD_OK)
        return rc;
    for (const char *const *m = p->cfg->models; m && *m; m++)
        if (strcmp(*m, r->model) == 0)
            return TD_OK;
    td_openai_err_set(p->e, 404, INVALID_REQUEST, NULL, "model_not_found",
                      "The model `%s` does not exist or you do not have access to it.",
                      r->model);
    return TD_ERR_NOT_FOUND;
}

td_status_t
td_ireq_parse_object(const td_ireq_cfg_t *cfg, td_openai_kind_t kind,
                     const td_ireq_field_t *own, json_t *body, td_ireq_t **out,
                     td_openai_err_t *e)
{
    td_ireq_t *req = td_ireq_new(kind);
    td_ireq_parse_t p = { .cfg = cfg, .req = req, .e = e };
    const char *key;
    json_t *v;
    td_status_t rc;

    if (req == NULL) {
        td_openai_err_internal(e, "out of memory");
        return TD_ERR_NOMEM;
    }
    json_object_foreach(body, key, v) {
        const td_ireq_field_t *f = NULL;

        for (size_t i = 0; own != NULL && own[i].name != NULL && f == NULL; i++)
            if ((own[i].kinds & TD_IREQ_KIND(kind)) && strcmp(own[i].name, key) == 0)
                f = &own[i];
        if (f == NULL)
            f = td_ireq_field_find(kind, key);
        if (f == NULL) {
            rc = unknown_field(&p, key);
            goto err_destroy;
        }
        if (json_is_null(v) && !f->required)
            continue;   /* null: the default, as OpenAI treats it */
        rc = json_is_null(v) ? td_ireq_missing(&p, key) : f->fn(&p, key, v);
        if (rc != TD_OK)
            goto err_destroy;
    }
    req->body = json_incref(body);   /* finish reads it too (parallel_tool_calls) */
    if ((rc = td_ireq_finish(&p)) != TD_OK)
        goto err_destroy;
    *out = req;
    return TD_OK;

err_destroy:
    td_ireq_destroy(req);
    return rc;
}

td_status_t
td_ireq_set_msgs(td_ireq_parse_t *p, const json_t *messages)
{
    td_ireq_t *r = p->req;
    size_t n = json_array_size(messages);

    if (n == 0 || (r->msgs = calloc(n, sizeof *r->msgs)) == NULL)
        return n == 0 ? td_ireq_empty_array(p, "messages") : td_ireq_nomem(p);
    for (r->nmsgs = 0; r->nmsgs < n; r->nmsgs++) {
        const json_t *m = json_array_get(messages, r->nmsgs);
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *text = json_string_value(json_object_get(m, "content"));
        td_ireq_msg_t *msg = &r->msgs[r->nmsgs];

        for (int k = TD_OPENAI_ROLE_SYSTEM; role && k <= TD_OPENAI_ROLE_DEVELOPER; k++)
            if (strcmp(role, td_openai_role_str((td_openai_role_t)k)) == 0)
                msg->role = (td_openai_role_t)k;
        if ((msg->content = strdup(text ? text : "")) == NULL) {
            r->nmsgs++;
            return td_ireq_nomem(p);
        }
    }
    return TD_OK;
}

void
td_ireq_destroy(td_ireq_t *req)
{
    if (req == NULL)
        return;
    for (size_t i = 0; i < req->nmsgs; i++) {
        free(req->msgs[i].content);
        free(req->msgs[i].name);
        free(req->msgs[i].tool_call_id);
        free(req->msgs[i].tool_calls);
    }
    free(req->msgs);
    for (size_t i = 0; i < req->stop.nstrings; i++)
        free(req->stop.strings[i]);
    free(req->sampling.logit_bias);
    free(req->model);
    free(req->prompt);
    free(req->prompt_ids);
    free(req->tools);
    free(req->tool_choice);
    json_decref(req->constraint.spec);
    free(req->constraint.text);
    json_decref(req->body);
    json_decref(req->proto);
    free(req);
}
