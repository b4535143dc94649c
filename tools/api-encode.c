/* tools/api-encode — routerd's Messages and Responses adapters from the
 * command line, for comparing them with the reference (tests/chat/
 * api_recipe_test.py): each case's request parsed by the adapter
 * (routerd/adapt-*.c), its conversation encoded in the V4.1 format and
 * tokenized as routerd does; with "pieces", that model output read back by
 * the V4.1 reader into the protocol's stream events, as routerd sends them. */
#include "adapt-anthropic.h"
#include "adapt-responses.h"
#include "anthropic.h"
#include "oresp.h"
#include "chat_prompt.h"
#include "cli.h"
#include "grammar.h"
#include "tokenizer.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void
usage(FILE *f)
{
    fprintf(f,
            "usage: api-encode --tokenizer PATH [--model NAME] [CASES|-]\n"
            "  CASES: {\"cases\": [{\"api\": \"messages\"|\"responses\", \"body\": {...},\n"
            "          \"default_thinking\": false (optional: routerd's default-thinking false),\n"
            "          \"pieces\": [output text, ...] (optional), \"finish\": \"stop\"|\"length\"}]}\n"
            "  prints {\"results\": [{\"prompt\", \"ids\", \"thinking\", \"max_tokens\",\n"
            "          \"events\": [[name, data], ...]} or {\"status\", \"error\", \"param\"}]}\n");
}

/* A tiny SSE reader: the events out holds, as [name, data] pairs. */
static json_t *
events_of(const td_buf_t *b)
{
    json_t *a = json_array();
    const char *s = b->data ? b->data : "", *end = s + b->len;
    char name[64] = "";

    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        size_t n = nl ? (size_t)(nl - s) : (size_t)(end - s);
        if (n > 7 && strncmp(s, "event: ", 7) == 0)
            snprintf(name, sizeof name, "%.*s", (int)(n - 7), s + 7);
        else if (n > 6 && strncmp(s, "data: ", 6) == 0)
            json_array_append_new(a, json_pack("[s, o]", name,
                                               json_loadb(s + 6, n - 6, 0, NULL)));
        s += n + 1;
    }
    return a;
}

/* The output pieces through the V4.1 reader and the Messages stream writer. */
static json_t *
stream_messages(const td_chat_prompt_t *p, const json_t *pieces, bool length, size_t nprompt)
{
    td_chat_reply_reader_t *rd;
    td_anthropic_stream_t s = { .id = "ID1", .model = "tiny" };
    td_anthropic_usage_t u = { .input_tokens = (uint32_t)nprompt,
                               .output_tokens = (uint32_t)json_array_size(pieces) };
    const td_chat_reply_delta_t *d;
    size_t nd;
    td_buf_t out = {0};
    json_t *ev;

    td_chat_reply_opts_t ro = p->reply;
    ro.split_args = true;
    if (td_chat_reply_reader_create(&ro, &rd) != TD_OK)
        return NULL;
    td_anthropic_usage_t u0 = { .input_tokens = (uint32_t)nprompt };
    s.thinking = p->reply.start == TD_CHAT_REPLY_START_REASONING;
    td_anthropic_stream_start(&s, &u0, &out);
    u.output_tokens = 0;   /* the pieces fed: those after a stop string are not */
    for (size_t i = 0; i < json_array_size(pieces) && !td_chat_reply_reader_stopped(rd); i++) {
        const json_t *t = json_array_get(pieces, i);
        u.output_tokens++;
        td_chat_reply_reader_feed(rd, json_string_value(t), json_string_length(t), &d, &nd);
        for (size_t k = 0; k < nd; k++)
            td_anthropic_stream_delta(&s, &d[k], &out);
    }
    td_chat_reply_reader_finish(rd, length ? TD_CHAT_REPLY_FINISH_LENGTH
                                           : TD_CHAT_REPLY_FINISH_STOP, &d, &nd);
    for (size_t k = 0; k < nd; k++)
        td_anthropic_stream_delta(&s, &d[k], &out);
    const td_chat_reply_t *r = td_chat_reply_reader_reply(rd);
    td_anthropic_stop_t stop = {
        .finish = r->finish == TD_CHAT_REPLY_FINISH_LENGTH ? TD_OPENAI_FINISH_LENGTH
                : r->finish == TD_CHAT_REPLY_FINISH_TOOL_CALLS ? TD_OPENAI_FINISH_TOOL_CALLS
                                                               : TD_OPENAI_FINISH_STOP,
        .by_stop_string = td_chat_reply_reader_stopped(rd),
        .stop = td_chat_reply_reader_stop(rd),
    };
    td_anthropic_stream_end(&s, &stop, &u, &out);
    ev = events_of(&out);
    td_buf_free(&out);
    td_chat_reply_reader_destroy(rd);
    return ev;
}

/* The output pieces through the V4.1 reader and the Responses writer. */
static json_t *
stream_responses(const td_chat_prompt_t *p, const td_ireq_t *o, const json_t *pieces,
                 bool length, size_t nprompt)
{
    td_chat_reply_reader_t *rd;
    td_chat_reply_opts_t ro = p->reply;
    td_oresp_t r;
    const td_chat_reply_delta_t *d;
    size_t nd;
    td_buf_t out = {0};
    json_t *ev;

    ro.split_args = true;
    if (td_chat_reply_reader_create(&ro, &rd) != TD_OK ||
        td_oresp_init(&r, "resp_ID1", 1, json_object_get(o->proto, "echo"), false) != TD_OK)
        return NULL;
    td_oresp_start(&r, &out);
    size_t fed = 0;   /* the pieces fed: those after a stop string are not */
    for (size_t i = 0; i < json_array_size(pieces) && !td_chat_reply_reader_stopped(rd); i++) {
        const json_t *t = json_array_get(pieces, i);
        fed++;
        td_chat_reply_reader_feed(rd, json_string_value(t), json_string_length(t), &d, &nd);
        for (size_t k = 0; k < nd; k++)
            td_oresp_delta(&r, &d[k], &out);
    }
    td_chat_reply_reader_finish(rd, length ? TD_CHAT_REPLY_FINISH_LENGTH
                                           : TD_CHAT_REPLY_FINISH_STOP, &d, &nd);
    for (size_t k = 0; k < nd; k++)
        td_oresp_delta(&r, &d[k], &out);
    td_oresp_usage_t u = { .input_tokens = (uint32_t)nprompt, .output_tokens = (uint32_t)fed };
    td_chat_reply_finish_t f = td_chat_reply_reader_reply(rd)->finish;
    td_oresp_end(&r, f == TD_CHAT_REPLY_FINISH_LENGTH ? TD_OPENAI_FINISH_LENGTH
                                                      : TD_OPENAI_FINISH_STOP, &u, 1, &out, NULL);
    ev = events_of(&out);
    td_buf_free(&out);
    td_oresp_fini(&r);
    td_chat_reply_reader_destroy(rd);
    return ev;
}

/* One case's result object. */
static json_t *
run_case(const td_ireq_cfg_t *cfg, const td_tokenizer_t *tok, const json_t *c)
{
    const json_t *body = json_object_get(c, "body");
    const json_t *pieces = json_object_get(c, "pieces");
    const char *fin = json_string_value(json_object_get(c, "finish"));
    char *text = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY);
    td_openai_err_t e = {0};
    td_ireq_t *o = NULL;
    td_chat_prompt_t *p = NULL;
    td_chat_prompt_err_t ce = {0};
    uint32_t *ids = NULL;
    size_t n = 0;
    json_t *res, *a;

    bool responses = strcmp(json_string_value(json_object_get(c, "api")), "responses") == 0;
    if ((responses ? td_adapt_responses_parse(cfg, body, NULL, &o, &e)
                   : td_adapt_anthropic_parse(cfg, false, text, strlen(text), &o, &e)) != TD_OK) {
        free(text);
        return json_pack("{s:i, s:s, s:s?}", "status", e.http, "error", e.message, "param",
                         e.param[0] ? e.param : NULL);
    }
    free(text);
    td_chat_prompt_opts_t opts = { .thinking = o->reasoning.thinking };
    if (td_chat_prompt_encode(o->body, &opts, &p, &ce) != TD_OK) {
        td_ireq_destroy(o);
        return json_pack("{s:i, s:s, s:s?}", "status", 400, "error", ce.message, "param",
                         ce.param[0] ? ce.param : NULL);
    }
    if (td_chat_prompt_ids(p, tok, &ids, &n) != TD_OK)
        n = 0;
    a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    res = json_pack("{s:s%, s:o, s:b, s:i, s:f, s:f, s:i, s:i}", "prompt", p->text, p->len,
                    "ids", a, "thinking", p->thinking, "max_tokens",
                    (json_int_t)o->sampling.max_tokens, "temperature", o->sampling.temperature,
                    "top_p", o->sampling.top_p, "top_k", (json_int_t)o->sampling.top_k,
                    "budget", (json_int_t)o->reasoning.budget);
    if (json_is_array(pieces))
        json_object_set_new(res, "events",
                            responses ? stream_responses(p, o, pieces, fin && !strcmp(fin, "length"),
                                                         n)
                                      : stream_messages(p, pieces, fin && !strcmp(fin, "length"),
                                                        n));
    free(ids);
    td_chat_prompt_destroy(p);
    td_ireq_destroy(o);
    return res;
}

int
main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "tokenizer", required_argument, NULL, 't' },
        { "model", required_argument, NULL, 'm' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *tokpath = NULL, *model = "tiny";
    const char *models[2] = { NULL, NULL };
    td_tokenizer_t *tok = NULL;
    char *in;
    size_t len;
    int c;

    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 't': tokpath = optarg; break;
        case 'm': model = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (tokpath == NULL || argc - optind > 1) {
        usage(stderr);
        return 2;
    }
    FILE *f = optind < argc && strcmp(argv[optind], "-") != 0 ? fopen(argv[optind], "rb") : stdin;
    if (f == NULL || cli_read_all(f, &in, &len) != 0) {
        fprintf(stderr, "api-encode: cannot read the cases\n");
        return 1;
    }
    json_t *root = json_loadb(in, len, 0, NULL);
    free(in);
    if (!json_is_array(json_object_get(root, "cases"))) {
        fprintf(stderr, "api-encode: the input is not {\"cases\": [...]}\n");
        return 1;
    }
    if (td_tokenizer_load(tokpath, &tok) != TD_OK)
        return 1;   /* logged */
    /* constraints are checked against the vocabulary, as routerd does */
    static const char eos_tok[] = "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
    uint32_t eos_id;
    td_gvocab_t *gv = NULL;
    if (td_tokenizer_find(tok, eos_tok, strlen(eos_tok), &eos_id) != TD_OK ||
        td_gvocab_create(tok, &(int32_t){ (int32_t)eos_id }, 1, &gv) != TD_OK)
        return 1;   /* logged */
    models[0] = model;
    td_ireq_cfg_t cfg = { .models = models, .max_body = 1 << 24, .max_tokens_limit = 1 << 20,
                          .max_tokens_default = 256, .gvocab = gv, .max_constraint_bytes = 1 << 20,
                          .constraint_budget_ms = 10000 };
    json_t *results = json_array();
    const json_t *cases = json_object_get(root, "cases");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *one = json_array_get(cases, i);
        cfg.no_default_thinking = json_is_false(json_object_get(one, "default_thinking"));
        json_array_append_new(results, run_case(&cfg, tok, one));
    }
    json_t *o = json_pack("{s:o}", "results", results);
    json_dumpf(o, stdout, JSON_COMPACT | JSON_ENSURE_ASCII);
    putchar('\n');
    json_decref(o);
    json_decref(root);
    td_gvocab_destroy(gv);
    td_tokenizer_destroy(tok);
    return 0;
}
