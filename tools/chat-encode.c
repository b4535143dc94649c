/* tools/chat-encode — the V4.1 chat format from the command line: an OpenAI
 * chat request (or a messages array) in, the prompt out; with --parse, model
 * output text in, the parsed reply as JSON out (text/chat_prompt.c,
 * text/chat_reply.c). */
#include "chat_prompt.h"
#include "tokenizer.h"

#include "log.h"
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void
usage(FILE *f)
{
    fprintf(f,
            "usage: chat-encode [--thinking|--no-thinking] [--effort LEVEL] [--json]\n"
            "                   [--tokenizer PATH --ids] [FILE|-]\n"
            "       chat-encode --parse [--request FILE] [--thinking|--no-thinking] [--no-tools]\n"
            "                   [--stop STRING]... [--length] [FILE|-]\n"
            "  Read an OpenAI chat completion request (or a bare messages array) from FILE\n"
            "  (standard input when FILE is - or absent) and print the DeepSeek-V4.1 prompt.\n"
            "  --thinking, --no-thinking  as if the request had \"thinking\": {\"type\": ...}\n"
            "  --effort LEVEL   as if it had \"reasoning_effort\": none, minimal, low, medium,\n"
            "                   high, xhigh, ultra or max\n"
            "  --json           print {\"prompt\", \"specials\" (byte ranges of special tokens),\n"
            "                   \"thinking\", \"effort\", \"parse\"} instead of the bare prompt\n"
            "  --tokenizer PATH  tokenizer.json or its checkpoint directory, for --ids\n"
            "                   (default: $TANDEM_TOKENIZER)\n"
            "  --ids            print the prompt's token ids, space-separated, as the\n"
            "                   server tokenizes it (special-token ranges as tokens, the\n"
            "                   text between them without the added vocabulary)\n"
            "  --parse          read model output text instead and print {\"message\",\n"
            "                   \"finish_reason\"}. What the prompt left open comes from\n"
            "                   --request (a request file, encoded as above); without it,\n"
            "                   thinking is on and tool calls are recognised\n"
            "  --no-tools       --parse: do not recognise tool calls\n"
            "  --stop STRING    --parse: a stop string (repeatable)\n"
            "  --length         --parse: the output was cut by max_tokens\n"
            "A refused request prints the reason (an OpenAI error body with --json) and\n"
            "exits 1; bad usage exits 2.\n");
}

static int
read_input(const char *path, char **out, size_t *len)
{
    FILE *f = stdin;

    if (strcmp(path, "-") != 0) {
        f = fopen(path, "rb");
        if (f == NULL) {
            fprintf(stderr, "chat-encode: %s: %s\n", path, strerror(errno));
            return -1;
        }
    }
    int rc = cli_read_all(f, out, len);
    if (rc != 0)
        fprintf(stderr, "chat-encode: %s: read failed: %s\n", path, strerror(errno));
    if (f != stdin)
        fclose(f);
    return rc;
}

/* Read and encode a request file; prints why on failure. */
static int
encode_file(const char *path, const td_chat_prompt_opts_t *opts, bool json_errors,
            td_chat_prompt_t **out)
{
    char *text = NULL;
    size_t len;
    json_error_t jerr;
    td_chat_prompt_err_t err;

    if (read_input(path, &text, &len) != 0)
        return -1;
    json_t *req = json_loadb(text, len, JSON_ALLOW_NUL, &jerr);
    free(text);
    if (req == NULL) {
        fprintf(stderr, "chat-encode: %s:%d:%d: not JSON: %s\n", path, jerr.line, jerr.column,
                jerr.text);
        return -1;
    }
    td_status_t st = td_chat_prompt_encode(req, opts, out, &err);
    json_decref(req);
    if (st == TD_OK)
        return 0;
    if (st == TD_ERR_INVALID || st == TD_ERR_UNSUPPORTED) {
        char *body = NULL;
        if (json_errors && td_chat_prompt_err_json(&err, &body) == TD_OK) {
            printf("%s\n", body);
            free(body);
        }
        fprintf(stderr, "chat-encode: %s: refused (%s)%s%s: %s\n", path, td_status_str(st),
                err.param[0] ? " at " : "", err.param, err.message);
    }
    return -1;   /* a refusal is ours to print; anything else the encoder logged */
}

/* The prompt, or its --json form, on stdout; 0, or -1 after a message. */
static int
print_prompt(const td_chat_prompt_t *p, bool json)
{
    if (!json) {
        if (fwrite(p->text, 1, p->len, stdout) == p->len)
            return 0;
        fprintf(stderr, "chat-encode: writing the prompt: %s\n", strerror(errno));
        return -1;
    }

    json_t *spans = json_array();
    json_t *stop = json_array();
    static const char *const starts[] = { "plain", "reasoning", "reasoning_cont",
                                          "content_cont" };
    for (size_t i = 0; spans && i < p->nspecials; i++)
        json_array_append_new(spans, json_pack("[I,I]", (json_int_t)p->specials[i].start,
                                               (json_int_t)p->specials[i].end));
    for (size_t i = 0; stop && i < p->reply.nstop; i++)
        json_array_append_new(stop, json_string(p->reply.stop[i]));
    json_t *o = json_pack("{s:s%, s:o, s:b, s:i, s:{s:s, s:b, s:b, s:o}}", "prompt", p->text,
                          p->len, "specials", spans, "thinking", p->thinking, "effort",
                          (int)p->effort, "parse", "start", starts[p->reply.start],
                          "tool_calls", p->reply.tool_calls, "in_tool_calls",
                          p->reply.in_tool_calls, "stop", stop);
    if (o == NULL) {
        fprintf(stderr, "chat-encode: out of memory\n");
        return -1;
    }
    int rc = json_dumpf(o, stdout, JSON_INDENT(2)) == 0 && fputc('\n', stdout) != EOF ? 0 : -1;
    json_decref(o);
    if (rc != 0)
        fprintf(stderr, "chat-encode: writing the prompt: %s\n", strerror(errno));
    return rc;
}

/* --ids: the prompt's ids on one line; 0, or 1 (a failure logged where it
 * happened). */
static int
print_ids(const td_chat_prompt_t *p, const char *path)
{
    td_tokenizer_t *tok = NULL;
    uint32_t *ids = NULL;
    size_t n = 0;
    td_status_t st = td_tokenizer_load(path, &tok);

    if (st != TD_OK)
        return 1;   /* the tokenizer logged why */
    st = td_chat_prompt_ids(p, tok, &ids, &n);
    td_tokenizer_destroy(tok);
    if (st != TD_OK)
        return 1;   /* logged where it failed */
    for (size_t i = 0; i < n; i++)
        printf(i ? " %u" : "%u", ids[i]);
    putchar('\n');
    free(ids);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "chat-encode: writing the ids: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}

int
main(int argc, char **argv)
{
    enum { OPT_EFFORT = 256, OPT_REQUEST, OPT_STOP, OPT_TOKENIZER, OPT_IDS };
    static const struct option longopts[] = {
        { "thinking", no_argument, NULL, 't' },
        { "no-thinking", no_argument, NULL, 'n' },
        { "effort", required_argument, NULL, OPT_EFFORT },
        { "json", no_argument, NULL, 'j' },
        { "parse", no_argument, NULL, 'p' },
        { "request", required_argument, NULL, OPT_REQUEST },
        { "no-tools", no_argument, NULL, 'T' },
        { "stop", required_argument, NULL, OPT_STOP },
        { "length", no_argument, NULL, 'l' },
        { "tokenizer", required_argument, NULL, OPT_TOKENIZER },
        { "ids", no_argument, NULL, OPT_IDS },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    td_chat_prompt_opts_t opts = { .thinking = -1, .effort = NULL };
    const char *request = NULL;
    const char *stops[64];
    size_t nstop = 0;
    bool json = false, parse = false, no_tools = false, length = false, ids = false;
    const char *tokenizer = getenv("TANDEM_TOKENIZER");
    int c;

    td_log_set_ident("chat-encode");
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 't': opts.thinking = 1; break;
        case 'n': opts.thinking = 0; break;
        case OPT_EFFORT: opts.effort = optarg; break;
        case 'j': json = true; break;
        case 'p': parse = true; break;
        case OPT_REQUEST: request = optarg; break;
        case 'T': no_tools = true; break;
        case OPT_STOP:
            if (nstop == sizeof(stops) / sizeof(*stops) || optarg[0] == '\0') {
                fprintf(stderr, "chat-encode: --stop: at most 64 non-empty strings\n");
                return 2;
            }
            stops[nstop++] = optarg;
            break;
        case 'l': length = true; break;
        case OPT_TOKENIZER: tokenizer = optarg; break;
        case OPT_IDS: ids = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (argc - optind > 1) {
        usage(stderr);
        return 2;
    }
    const char *path = optind < argc ? argv[optind] : "-";

    if (!parse) {
        td_chat_prompt_t *p = NULL;
        if (request || no_tools || nstop || length) {
            fprintf(stderr, "chat-encode: --request, --no-tools, --stop and --length go with "
                            "--parse\n");
            return 2;
        }
        if (ids && (json || !tokenizer || !tokenizer[0])) {
            fprintf(stderr, "chat-encode: --ids needs --tokenizer PATH (or $TANDEM_TOKENIZER) "
                            "and goes without --json\n");
            return 2;
        }
        if (encode_file(path, &opts, json, &p) != 0)
            return 1;
        if (ids) {
            int rc = print_ids(p, tokenizer);
            td_chat_prompt_destroy(p);
            return rc;
        }
        int rc = print_prompt(p, json);   /* says why it failed */
        td_chat_prompt_destroy(p);
        if (rc != 0)
            return 1;
        if (fflush(stdout) != 0) {
            fprintf(stderr, "chat-encode: writing the prompt: %s\n", strerror(errno));
            return 1;
        }
        return 0;
    }

    /* --parse */
    td_chat_prompt_t *req = NULL;
    td_chat_reply_opts_t po = {
        .start = opts.thinking == 0 ? TD_CHAT_REPLY_START_PLAIN : TD_CHAT_REPLY_START_REASONING,
        .tool_calls = !no_tools,
    };
    if (request) {
        if (encode_file(request, &opts, false, &req) != 0)
            return 1;
        po = req->reply;
        if (no_tools)
            po.tool_calls = false;
    }
    if (nstop) {
        po.stop = stops;
        po.nstop = nstop;
    }
    char *text = NULL;
    size_t len;
    td_chat_reply_t *reply = NULL;
    json_t *msg = NULL, *o = NULL;
    int rc = 1;
    if (read_input(path, &text, &len) != 0)
        goto cleanup;
    td_status_t st = td_chat_reply_parse(&po, text, len,
                                         length ? TD_CHAT_REPLY_FINISH_LENGTH
                                                : TD_CHAT_REPLY_FINISH_STOP, &reply);
    if (st == TD_OK)
        st = td_chat_reply_json(reply, &msg);
    if (st != TD_OK)
        goto cleanup;   /* the reader logged why */
    o = json_pack("{s:O, s:s}", "message", msg, "finish_reason",
                  td_chat_reply_finish_str(reply->finish));
    if (o == NULL || json_dumpf(o, stdout, JSON_INDENT(2)) != 0 || fputc('\n', stdout) == EOF ||
        fflush(stdout) != 0) {
        fprintf(stderr, "chat-encode: writing the reply failed\n");
        goto cleanup;
    }
    rc = 0;
cleanup:
    json_decref(o);
    json_decref(msg);
    td_chat_reply_destroy(reply);
    free(text);
    td_chat_prompt_destroy(req);
    return rc;
}
