/* tools/generate — text generation on one checkpoint in one process: an
 * OpenAI chat request (or a raw prompt) in, the model's reply streamed out
 * (model/model, engine/sample, text/chat), a summary on stderr; with --dep N
 * the forward pass runs as a DEP group of N rank threads (docs/dep.md). */
#include "chat_prompt.h"
#include "kvmem.h"
#include "model.h"
#include "sample.h"
#include "tokenizer.h"
#include "v41id.h"

#include "buf.h"
#include "cli.h"
#include "clock.h"
#include "config.h"
#include "log.h"
#include "progress.h"
#include "rng.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GEN_DEFAULT_MAX_TOKENS 256
#define GEN_DEFAULT_CHUNK 256
#define GEN_MAX_DEP 256
#define GEN_MAX_REQUESTS 1024

static void
usage(FILE *f)
{
    fprintf(f,
        "usage: generate [--model DIR] (--messages FILE|- | --prompt TEXT | --prompt-ids IDS)\n"
        "                [--max-tokens N]\n"
        "                [--temperature T] [--top-p P] [--top-k K] [--seed S] [--no-stream]\n"
        "                [--min-p P] [--repetition-penalty R] [--presence-penalty X]\n"
        "                [--frequency-penalty X] [--min-tokens N] [--ignore-eos]\n"
        "                [--stop-token-ids IDS] [--no-skip-special]\n"
        "                [--thinking|--no-thinking] [--effort LEVEL] [--logprobs N] [--json]\n"
        "                [--context N] [--chunk N] [--dep N [--placement FILE]] [--requests R]\n"
        "  Generate a reply with the DeepSeek-V4.1 checkpoint in DIR (default: $TANDEM_MODEL)\n"
        "  and stream its text to standard output; a summary goes to standard error.\n"
        "  --messages FILE  an OpenAI chat completion request, or a bare messages array\n"
        "                   (- reads standard input), rendered in the V4.1 chat format;\n"
        "                   the reply is read back into reasoning, content and tool calls\n"
        "  --prompt TEXT    raw text, tokenized as it is (special-token spellings are tokens)\n"
        "  --prompt-ids IDS the prompt as token ids, separated by spaces or commas\n"
        "  --max-tokens N   generated tokens at most (default %d)\n"
        "  --temperature T  0 is greedy (default 1)\n"
        "  --top-p P        keep the smallest most likely set with mass >= P, in (0, 1] (default 1)\n"
        "  --top-k K        keep the K most likely tokens; 0: all (default 0)\n"
        "  --seed S         the draw at position p depends on (S, p) only (default: random,\n"
        "                   printed in the summary)\n"
        "  --min-p P        drop tokens less likely than P times the top one, in [0, 1] (0)\n"
        "  --repetition-penalty R  vLLM's, over prompt and output, in (0, 2] (default 1: off)\n"
        "  --presence-penalty X, --frequency-penalty X\n"
        "                   OpenAI's, over the output, in [-2, 2] (default 0: off)\n"
        "  --min-tokens N   no stop token before N tokens were generated (default 0)\n"
        "  --ignore-eos     the model's end-of-sequence ids do not end the reply\n"
        "  --stop-token-ids IDS  token ids that end the reply too (spaces or commas)\n"
        "  --no-skip-special     special tokens are shown in the text\n"
        "  --no-stream      print the reply once it is complete\n"
        "  --thinking, --no-thinking, --effort LEVEL\n"
        "                   as the request's \"thinking\" and \"reasoning_effort\" (--messages)\n"
        "  --logprobs N     report each token's log-probability and the N (0..%d) most\n"
        "                   likely alternatives (with --json)\n"
        "  --json           JSON lines: one per token and per reply delta, then a summary\n"
        "                   object (with --no-stream only that object)\n"
        "  --context N      tokens the request may reach, prompt included (default: the\n"
        "                   config's max_position_embeddings)\n"
        "  --chunk N        prefill chunk in tokens (default %d)\n"
        "  --dep N          run the model as a DEP group of N rank threads (1..%d): each\n"
        "                   rank holds its share of the routed experts, the requests are\n"
        "                   spread over the ranks; the same output bit for bit\n"
        "  --placement FILE which rank holds which expert (JSON; default: contiguous ranges)\n"
        "  --requests R     run R copies of the request side by side (1..%d; copy i on rank\n"
        "                   i %% N, seeded S + i); only the first is printed (default 1)\n"
        "Errors print a message and exit 1; bad usage exits 2.\n",
        GEN_DEFAULT_MAX_TOKENS, TD_SAMPLE_MAX_TOP, GEN_DEFAULT_CHUNK, GEN_MAX_DEP,
        GEN_MAX_REQUESTS);
}

/* ---- options -------------------------------------------------------------------- */

typedef struct {
    const char *model;
    const char *messages;         /* a path, "-" for stdin; NULL with --prompt */
    const char *prompt;
    const char *prompt_ids;       /* --prompt-ids */
    uint64_t max_tokens;
    double temperature, top_p;
    uint64_t top_k;
    uint64_t seed;
    bool seed_set;
    bool stream, json;
    td_chat_prompt_opts_t chat;
    bool chat_set;                /* --thinking, --no-thinking or --effort given */
    int64_t logprobs;             /* -1: not asked */
    uint64_t context;             /* 0: the config's */
    uint64_t chunk;
    uint64_t dep;                 /* 0: no DEP group */
    const char *placement;        /* NULL: contiguous ranges */
    uint64_t requests;
    double min_p, repetition_penalty, presence_penalty, frequency_penalty;
    uint64_t min_tokens;
    bool ignore_eos;
    bool show_special;            /* --no-skip-special */
    int32_t stop_ids[TD_SAMPLE_MAX_STOP];   /* --stop-token-ids */
    uint32_t nstop_ids;
} gen_opts_t;

enum {
    OPT_MODEL = 256, OPT_MESSAGES, OPT_PROMPT, OPT_MAX, OPT_TEMP, OPT_TOPP, OPT_TOPK,
    OPT_SEED, OPT_NOSTREAM, OPT_THINK, OPT_NOTHINK, OPT_EFFORT, OPT_LOGPROBS, OPT_JSON,
    OPT_CONTEXT, OPT_CHUNK, OPT_DEP, OPT_PLACEMENT, OPT_REQUESTS, OPT_PROMPT_IDS,
    OPT_MINP = 512, OPT_REP, OPT_PRES, OPT_FREQ, OPT_MINTOK, OPT_IGNORE_EOS, OPT_STOP_IDS,
    OPT_SHOW_SPECIAL,
};

static const struct option gen_longopts[] = {
    { "model", required_argument, NULL, OPT_MODEL },
    { "messages", required_argument, NULL, OPT_MESSAGES },
    { "prompt", required_argument, NULL, OPT_PROMPT },
    { "prompt-ids", required_argument, NULL, OPT_PROMPT_IDS },
    { "max-tokens", required_argument, NULL, OPT_MAX },
    { "temperature", required_argument, NULL, OPT_TEMP },
    { "top-p", required_argument, NULL, OPT_TOPP },
    { "top-k", required_argument, NULL, OPT_TOPK },
    { "seed", required_argument, NULL, OPT_SEED },
    { "no-stream", no_argument, NULL, OPT_NOSTREAM },
    { "thinking", no_argument, NULL, OPT_THINK },
    { "no-thinking", no_argument, NULL, OPT_NOTHINK },
    { "effort", required_argument, NULL, OPT_EFFORT },
    { "logprobs", required_argument, NULL, OPT_LOGPROBS },
    { "json", no_argument, NULL, OPT_JSON },
    { "context", required_argument, NULL, OPT_CONTEXT },
    { "chunk", required_argument, NULL, OPT_CHUNK },
    { "dep", required_argument, NULL, OPT_DEP },
    { "placement", required_argument, NULL, OPT_PLACEMENT },
    { "requests", required_argument, NULL, OPT_REQUESTS },
    { "min-p", required_argument, NULL, OPT_MINP },
    { "repetition-penalty", required_argument, NULL, OPT_REP },
    { "presence-penalty", required_argument, NULL, OPT_PRES },
    { "frequency-penalty", required_argument, NULL, OPT_FREQ },
    { "min-tokens", required_argument, NULL, OPT_MINTOK },
    { "ignore-eos", no_argument, NULL, OPT_IGNORE_EOS },
    { "stop-token-ids", required_argument, NULL, OPT_STOP_IDS },
    { "no-skip-special", no_argument, NULL, OPT_SHOW_SPECIAL },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
};

/* --stop-token-ids: ids separated by spaces or commas, at most 16. */
static td_status_t
parse_stop_ids(const char *arg, gen_opts_t *o, char *err, size_t errlen)
{
    const char *p = arg;

    o->nstop_ids = 0;
    while (*p) {
        char *end;
        unsigned long long v;

        if (*p == ' ' || *p == ',') {
            p++;
            continue;
        }
        errno = 0;
        v = strtoull(p, &end, 10);
        if (end == p || errno != 0 || v > INT32_MAX || (*end && *end != ' ' && *end != ',')) {
            snprintf(err, errlen, "--stop-token-ids: \"%s\" is not a list of token ids", arg);
            return TD_ERR_INVALID;
        }
        if (o->nstop_ids == TD_SAMPLE_MAX_STOP) {
            snprintf(err, errlen, "--stop-token-ids: more than %d ids", TD_SAMPLE_MAX_STOP);
            return TD_ERR_RANGE;
        }
        o->stop_ids[o->nstop_ids++] = (int32_t)v;
        p = end;
    }
    return TD_OK;
}

/* The sampling options past the classic ones (the sampler's other steps). */
static td_status_t
parse_sampling_opt(int c, const char *arg, gen_opts_t *o, char *err, size_t errlen)
{
    switch (c) {
    case OPT_MINP:
        return td_config_parse_double("--min-p", arg, 0, 1, &o->min_p, err, errlen);
    case OPT_REP:
        if (td_config_parse_double("--repetition-penalty", arg, 0, TD_SAMPLE_REPETITION_MAX,
                                   &o->repetition_penalty, err, errlen) != TD_OK)
            return TD_ERR_RANGE;
        if (o->repetition_penalty == 0) {
            snprintf(err, errlen, "--repetition-penalty: %s is not in (0, 2]", arg);
            return TD_ERR_RANGE;
        }
        return TD_OK;
    case OPT_PRES:
        return td_config_parse_double("--presence-penalty", arg, -TD_SAMPLE_PENALTY_LIMIT,
                                      TD_SAMPLE_PENALTY_LIMIT, &o->presence_penalty, err,
                                      errlen);
    case OPT_FREQ:
        return td_config_parse_double("--frequency-penalty", arg, -TD_SAMPLE_PENALTY_LIMIT,
                                      TD_SAMPLE_PENALTY_LIMIT, &o->frequency_penalty, err,
                                      errlen);
    case OPT_MINTOK:
        return td_config_parse_uint("--min-tokens", arg, 0, UINT32_MAX, &o->min_tokens, err,
                                    errlen);
    case OPT_IGNORE_EOS:
        o->ignore_eos = true;
        return TD_OK;
    case OPT_SHOW_SPECIAL:
        o->show_special = true;
        return TD_OK;
    case OPT_STOP_IDS:
        return parse_stop_ids(arg, o, err, errlen);
    }
    return TD_ERR_INTERNAL;
}

/* The classic sampling options and the output's: --max-tokens, --temperature,
 * --top-p, --top-k, --seed, --logprobs. */
static td_status_t
parse_classic_opt(int c, const char *arg, gen_opts_t *o, char *err, size_t errlen)
{
    uint64_t v = 0;
    td_status_t st;

    switch (c) {
    case OPT_MAX:
        return td_config_parse_uint("--max-tokens", arg, 1, UINT32_MAX, &o->max_tokens, err,
                                    errlen);
    case OPT_TEMP:
        st = td_config_parse_double("--temperature", arg, 0, 0, &o->temperature, err, errlen);
        if (st == TD_OK && o->temperature < 0) {
            snprintf(err, errlen, "--temperature: %s is negative", arg);
            st = TD_ERR_RANGE;
        }
        return st;
    case OPT_TOPP:
        st = td_config_parse_double("--top-p", arg, 0, 1, &o->top_p, err, errlen);
        if (st == TD_OK && o->top_p == 0) {
            snprintf(err, errlen, "--top-p: %s is not in (0, 1]", arg);
            st = TD_ERR_RANGE;
        }
        return st;
    case OPT_TOPK:
        return td_config_parse_uint("--top-k", arg, 0, UINT32_MAX, &o->top_k, err, errlen);
    case OPT_SEED:
        o->seed_set = true;
        return td_config_parse_uint("--seed", arg, 0, 0, &o->seed, err, errlen);
    case OPT_LOGPROBS:
        st = td_config_parse_uint("--logprobs", arg, 0, TD_SAMPLE_MAX_TOP, &v, err, errlen);
        o->logprobs = (int64_t)v;
        return st;
    }
    return TD_ERR_INTERNAL;
}

/* How the engine runs: --context, --chunk, --dep, --requests. */
static td_status_t
parse_engine_opt(int c, const char *arg, gen_opts_t *o, char *err, size_t errlen)
{
    switch (c) {
    case OPT_CONTEXT:
        return td_config_parse_uint("--context", arg, 2, UINT32_MAX, &o->context, err, errlen);
    case OPT_CHUNK:
        return td_config_parse_uint("--chunk", arg, 1, 1u << 20, &o->chunk, err, errlen);
    case OPT_DEP:
        return td_config_parse_uint("--dep", arg, 1, GEN_MAX_DEP, &o->dep, err, errlen);
    case OPT_REQUESTS:
        return td_config_parse_uint("--requests", arg, 1, GEN_MAX_REQUESTS, &o->requests, err,
                                    errlen);
    }
    return TD_ERR_INTERNAL;
}

/* The options that go together or exclude each other; 0, or 2 after a message. */
static int
parse_check(const gen_opts_t *o)
{
    if ((o->messages != NULL) + (o->prompt != NULL) + (o->prompt_ids != NULL) != 1) {
        fprintf(stderr, "generate: give one of --messages FILE, --prompt TEXT and "
                        "--prompt-ids IDS\n");
        return 2;
    }
    if ((o->prompt != NULL || o->prompt_ids != NULL) && o->chat_set) {
        fprintf(stderr, "generate: --thinking, --no-thinking and --effort go with --messages\n");
        return 2;
    }
    if (o->placement != NULL && o->dep == 0) {
        fprintf(stderr, "generate: --placement goes with --dep\n");
        return 2;
    }
    if (o->logprobs >= 0 && !o->json) {
        fprintf(stderr, "generate: --logprobs goes with --json\n");
        return 2;
    }
    if (o->model == NULL || o->model[0] == '\0') {
        fprintf(stderr, "generate: no model: give --model DIR or set TANDEM_MODEL\n");
        return 2;
    }
    return 0;
}

/* 0, or 2 after a message (usage error); 1 for --help printed. */
static int
parse_opts(int argc, char **argv, gen_opts_t *o)
{
    char err[TD_CONFIG_ERRLEN];
    int c;

    *o = (gen_opts_t){
        .model = getenv("TANDEM_MODEL"), .max_tokens = GEN_DEFAULT_MAX_TOKENS,
        .temperature = 1.0, .top_p = 1.0, .stream = true, .repetition_penalty = 1.0,
        .chat = { .thinking = -1, .effort = NULL }, .logprobs = -1, .chunk = GEN_DEFAULT_CHUNK,
        .requests = 1,
    };
    while ((c = getopt_long(argc, argv, "h", gen_longopts, NULL)) != -1) {
        td_status_t st = TD_OK;
        switch (c) {
        case OPT_MODEL: o->model = optarg; break;
        case OPT_MESSAGES: o->messages = optarg; break;
        case OPT_PROMPT: o->prompt = optarg; break;
        case OPT_PROMPT_IDS: o->prompt_ids = optarg; break;
        case OPT_NOSTREAM: o->stream = false; break;
        case OPT_THINK: o->chat.thinking = 1; o->chat_set = true; break;
        case OPT_NOTHINK: o->chat.thinking = 0; o->chat_set = true; break;
        case OPT_EFFORT: o->chat.effort = optarg; o->chat_set = true; break;
        case OPT_JSON: o->json = true; break;
        case OPT_PLACEMENT: o->placement = optarg; break;
        case OPT_MAX: case OPT_TEMP: case OPT_TOPP: case OPT_TOPK: case OPT_SEED:
        case OPT_LOGPROBS:
            st = parse_classic_opt(c, optarg, o, err, sizeof(err));
            break;
        case OPT_CONTEXT: case OPT_CHUNK: case OPT_DEP: case OPT_REQUESTS:
            st = parse_engine_opt(c, optarg, o, err, sizeof(err));
            break;
        case 'h': usage(stdout); return 1;
        case OPT_MINP: case OPT_REP: case OPT_PRES: case OPT_FREQ: case OPT_MINTOK:
        case OPT_IGNORE_EOS: case OPT_STOP_IDS: case OPT_SHOW_SPECIAL:
            st = parse_sampling_opt(c, optarg, o, err, sizeof(err));
            break;
        default: usage(stderr); return 2;
        }
        if (st != TD_OK) {
            fprintf(stderr, "generate: %s\n", err);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "generate: unexpected argument \"%s\"\n", argv[optind]);
        return 2;
    }
    return parse_check(o);
}

/* ---- output ------------------------------------------------------------------------ */

typedef enum { SEC_NONE, SEC_REASONING, SEC_CONTENT, SEC_TOOL } gen_section_t;

/* Where the reply goes and how: text (reasoning dimmed on a terminal, else
 * each of its lines prefixed "> "), or JSON lines. */
typedef struct {
    bool tty, json, stream;
    gen_section_t section;
    bool line_start;        /* the last byte written was a newline (or none yet) */
    bool failed;            /* a write failed (reported once at the end) */
} gen_out_t;

static void
out_put(gen_out_t *g, const char *s, size_t n)
{
    if (n == 0)
        return;
    if (fwrite(s, 1, n, stdout) != n)
        g->failed = true;
    g->line_start = s[n - 1] == '\n';
}

/* A terminal control sequence: not text, the line state stays. */
static void
out_ctl(gen_out_t *g, const char *seq)
{
    if (fputs(seq, stdout) == EOF)
        g->failed = true;
}

static void
out_section(gen_out_t *g, gen_section_t s)
{
    if (g->section == s)
        return;
    if (g->section == SEC_REASONING && g->tty)
        out_ctl(g, "\033[0m");
    if (g->section != SEC_NONE && !g->line_start)
        out_put(g, "\n", 1);
    if (g->section == SEC_REASONING)
        out_put(g, "\n", 1);
    if (s == SEC_REASONING && g->tty)
        out_ctl(g, "\033[2m");
    g->section = s;
}

/* Text of a kind; reasoning on a non-terminal gets "> " at each line start. */
static void
out_text(gen_out_t *g, gen_section_t s, const char *text, size_t len)
{
    if (len == 0)
        return;
    out_section(g, s);
    if (s != SEC_REASONING || g->tty) {
        out_put(g, text, len);
        return;
    }
    while (len > 0) {
        const char *nl = memchr(text, '\n', len);
        size_t n = nl ? (size_t)(nl - text) + 1 : len;
        if (g->line_start)
            out_put(g, "> ", 2);
        out_put(g, text, n);
        text += n;
        len -= n;
    }
}

static void
out_tool_call(gen_out_t *g, uint32_t index, const char *name)
{
    char head[256];
    int n;

    out_section(g, SEC_TOOL);
    if (!g->line_start)
        out_put(g, "\n", 1);
    n = snprintf(head, sizeof(head), "[tool call %u: %s] ", index, name);
    out_put(g, head, n > 0 && (size_t)n < sizeof(head) ? (size_t)n : strlen(head));
}

/* After the reply: the terminal's attributes back, the line ended. */
static void
out_end(gen_out_t *g)
{
    if (g->section == SEC_REASONING && g->tty)
        out_ctl(g, "\033[0m");
    if (g->tty && !g->line_start)
        out_put(g, "\n", 1);
}

/* One JSON line (o is stolen). */
static void
out_json(gen_out_t *g, json_t *o)
{
    if (o == NULL || json_dumpf(o, stdout, JSON_COMPACT) != 0 || fputc('\n', stdout) == EOF)
        g->failed = true;
    json_decref(o);
}

static void
out_delta(gen_out_t *g, const td_chat_reply_delta_t *d)
{
    static const char *const kinds[] = { "reasoning", "content", "tool_call", "tool_args" };

    if (g->json) {
        json_t *o = json_pack("{s:s, s:I}", "type", kinds[d->kind], "index", (json_int_t)d->index);
        if (o == NULL)
            return out_json(g, NULL);
        if (d->kind == TD_CHAT_REPLY_DELTA_TOOL_CALL) {
            json_object_set_new(o, "id", json_string(d->id));
            json_object_set_new(o, "name", json_string(d->name));
        } else {
            json_t *t = json_stringn(d->text, d->len);
            if (t == NULL)
                g->failed = true;
            json_object_set_new(o, "text", t ? t : json_string(""));
            if (d->kind != TD_CHAT_REPLY_DELTA_TOOL_ARGS)
                json_object_del(o, "index");
        }
        return out_json(g, o);
    }
    switch (d->kind) {
    case TD_CHAT_REPLY_DELTA_REASONING: out_text(g, SEC_REASONING, d->text, d->len); break;
    case TD_CHAT_REPLY_DELTA_CONTENT: out_text(g, SEC_CONTENT, d->text, d->len); break;
    case TD_CHAT_REPLY_DELTA_TOOL_CALL: out_tool_call(g, d->index, d->name); break;
    case TD_CHAT_REPLY_DELTA_TOOL_ARGS: out_text(g, SEC_TOOL, d->text, d->len); break;
    }
}

/* ---- the generation ------------------------------------------------------------------ */

typedef struct gen_rank gen_rank_t;

/* One request of the run: request 0, or a copy of it decoded beside it
 * (--requests), on rank i % nranks. */
typedef struct {
    uint32_t rank;
    td_kvmem_t *mem;              /* its KV memory: this tool owns it (a daemon's pools would) */
    td_cache_t cache;
    float *logits;                /* [V] */
    td_sample_params_t sp;        /* request 0's; a copy's seed is S + i */
    td_sample_hist_t hist;        /* its prompt and output, when a penalty is on */
    int32_t token;                /* the last chosen: the next step's input */
    size_t ngen;
    bool done;
} gen_req_t;

typedef struct {
    const gen_opts_t *o;
    td_model_t *m;
    td_chat_prompt_t *chat;       /* NULL with --prompt */
    td_chat_reply_reader_t *parser;     /* NULL with --prompt */
    uint32_t *prompt;             /* [nprompt] */
    size_t nprompt;
    td_sample_params_t sp;
    uint64_t context;             /* the request's limit, prompt included */
    gen_out_t out;

    td_detok_t detok;
    char *piece;                  /* [piece_cap] detok output */
    size_t piece_cap;
    td_buf_t text;                /* everything decoded (--prompt), for --no-stream and --json */

    int32_t *ids;                 /* [ngen] generated */
    size_t ngen;
    json_t *logprobs;             /* per-token records for --no-stream --json, or NULL */
    const char *finish;
    double load_s, prefill_s, decode_s;

    /* the ranks: one, this thread's, without --dep; else a DEP group of
     * rank threads that step together (gen_step) */
    gen_rank_t *ranks;            /* [nranks] */
    uint32_t nranks;
    td_placement_t *placement;    /* --dep */
    td_comm_group_t *group;       /* --dep */
    pthread_mutex_t mu;           /* the step hand-off (--dep) */
    pthread_cond_t cv;
    uint64_t step;                /* steps begun (under mu) */
    uint32_t pending;             /* ranks still in the current step (under mu) */
    bool quit;                    /* the rank threads stop (under mu) */

    gen_req_t *reqs;              /* [nreq]: request 0 is the one printed */
    size_t nreq;
    size_t total_gen;             /* tokens generated by all of them */
    td_sample_finish_t fin;       /* request 0's finish */
} gen_t;

/* One rank: its model (with --dep only its experts), communicator, DEP
 * context, cpu pool and thread, and its part of the current step. */
struct gen_rank {
    gen_t *g;
    uint32_t rank;
    td_model_t *m;
    td_comm_t *comm;              /* NULL without --dep */
    td_forward_dep_t *dep;
    td_kernels_cpu_pool_t *pool;
    pthread_t th;
    bool started;
    td_forward_seq_t *seqs;       /* [nreq] this step's */
    size_t nseqs;
    td_status_t st;
};

/* The log-probabilities of a step as JSON (OpenAI's token / bytes / logprob). */
static json_t *
json_logprob(const td_tokenizer_t *tok, int32_t id, double lp)
{
    const char *b = "";
    size_t n;
    td_detok_t st = { 0 };
    char buf[TD_DETOK_OUT_MAX(64) + 8], *txt = buf;
    json_t *bytes = json_array(), *o;

    if (td_tokenizer_piece(tok, (uint32_t)id, &b, &n) != TD_OK)
        n = 0;
    if (TD_DETOK_OUT_MAX(n) + 3 > sizeof(buf))
        txt = malloc(TD_DETOK_OUT_MAX(n) + 3);
    size_t tl = 0;
    if (txt != NULL) {
        tl = td_detok_bytes(&st, b, n, txt);
        tl += td_detok_flush(&st, txt + tl);
    }
    for (size_t i = 0; bytes && i < n; i++)
        json_array_append_new(bytes, json_integer((unsigned char)b[i]));
    o = json_pack("{s:I, s:s%, s:o, s:o}", "id", (json_int_t)id, "token", txt ? txt : "",
                  txt ? tl : 0, "bytes", bytes, "logprob",
                  isfinite(lp) ? json_real(lp) : json_null());
    if (txt != buf)
        free(txt);
    return o;
}

static json_t *
json_pick(const td_tokenizer_t *tok, const td_sample_pick_t *pk)
{
    json_t *o = json_logprob(tok, pk->token, pk->logprob), *top = json_array();

    for (uint32_t i = 0; top && i < pk->ntop; i++)
        json_array_append_new(top, json_logprob(tok, pk->top[i].id, pk->top[i].logprob));
    if (o == NULL || top == NULL || json_object_set_new(o, "top_logprobs", top) != 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Feed decoded text to the reply reader (--messages) or straight out. */
static int
gen_text(gen_t *g, const char *text, size_t len)
{
    if (g->parser != NULL) {
        const td_chat_reply_delta_t *d;
        size_t nd;
        if (td_chat_reply_reader_feed(g->parser, text, len, &d, &nd) != TD_OK)
            return -1;   /* the reader logged why */
        for (size_t i = 0; g->out.stream && i < nd; i++)
            out_delta(&g->out, &d[i]);
        return 0;
    }
    if (td_buf_append(&g->text, text, len) != TD_OK) {
        fprintf(stderr, "generate: out of memory\n");
        return -1;
    }
    if (g->out.stream && !g->out.json)
        out_text(&g->out, SEC_CONTENT, text, len);
    return 0;
}

/* One chosen token: record it, decode its text, print. A stop token's text
 * is not part of the reply. */
static int
gen_emit(gen_t *g, const td_sample_pick_t *pk, td_sample_finish_t fin)
{
    const td_tokenizer_t *tok = g->m->tok;
    size_t len = 0;
    td_status_t st;

    g->ids[g->ngen++] = pk->token;
    if (fin != TD_SAMPLE_FINISH_STOP) {
        st = td_detok_feed(&g->detok, tok, (uint32_t)pk->token,
                           g->o->show_special ? 0 : TD_TOKENIZER_SKIP_SPECIAL, g->piece,
                           g->piece_cap, &len);
        if (st != TD_OK) {
            fprintf(stderr, "generate: token %d has no text in the tokenizer (%s)\n", pk->token,
                    td_status_str(st));
            return -1;
        }
    }
    if (g->out.json && (g->out.stream || g->logprobs != NULL)) {
        json_t *o = json_pack("{s:s, s:I, s:I, s:s%}", "type", "token", "index",
                              (json_int_t)(g->ngen - 1), "id", (json_int_t)pk->token, "text",
                              g->piece, len);
        if (o != NULL && fin == TD_SAMPLE_FINISH_STOP)
            json_object_set_new(o, "stop", json_true());
        if (o != NULL && g->o->logprobs >= 0) {
            json_t *lp = json_pick(tok, pk);
            json_object_set_new(o, "logprob", lp ? json_incref(json_object_get(lp, "logprob"))
                                                 : NULL);
            json_object_set_new(o, "top_logprobs",
                                lp ? json_incref(json_object_get(lp, "top_logprobs")) : NULL);
            json_decref(lp);
        }
        if (g->out.stream) {
            out_json(&g->out, o);
        } else if (o == NULL || json_array_append_new(g->logprobs, o) != 0) {
            fprintf(stderr, "generate: out of memory\n");
            return -1;
        }
    }
    if (gen_text(g, g->piece, len) != 0)
        return -1;
    if (g->out.stream && fflush(stdout) != 0)
        g->out.failed = true;
    return 0;
}

/* End of output: what detok and the reader held back, the finish reason. */
static int
gen_finish(gen_t *g, td_sample_finish_t fin)
{
    char tail[8];
    size_t n = td_detok_flush(&g->detok, tail);

    if (gen_text(g, tail, n) != 0)
        return -1;
    g->finish = td_sample_finish_str(fin);
    if (g->parser != NULL) {
        const td_chat_reply_delta_t *d;
        size_t nd;
        if (td_chat_reply_reader_finish(g->parser,
                                        fin == TD_SAMPLE_FINISH_LENGTH
                                            ? TD_CHAT_REPLY_FINISH_LENGTH
                                            : TD_CHAT_REPLY_FINISH_STOP,
                                        &d, &nd) != TD_OK)
            return -1;   /* the reader logged why */
        for (size_t i = 0; g->out.stream && i < nd; i++)
            out_delta(&g->out, &d[i]);
        g->finish = td_chat_reply_finish_str(td_chat_reply_reader_reply(g->parser)->finish);
    }
    return 0;
}

/* --no-stream text: the whole reply at once. */
static void
gen_print_reply(gen_t *g)
{
    if (g->parser == NULL) {
        out_text(&g->out, SEC_CONTENT, g->text.data, g->text.len);
        return;
    }
    const td_chat_reply_t *r = td_chat_reply_reader_reply(g->parser);
    if (r->reasoning != NULL)
        out_text(&g->out, SEC_REASONING, r->reasoning, r->reasoning_len);
    out_text(&g->out, SEC_CONTENT, r->content, r->content_len);
    for (size_t i = 0; i < r->ncalls; i++) {
        out_tool_call(&g->out, (uint32_t)i, r->calls[i].name);
        out_text(&g->out, SEC_TOOL, r->calls[i].arguments, r->calls[i].arguments_len);
    }
}

static double
rate(double n, double s)
{
    return s > 0 ? n / s : 0;
}

/* The closing JSON object. */
static void
gen_print_done(gen_t *g)
{
    json_t *ids = json_array(), *pids = json_array(), *o, *msg = NULL;
    double ndec = g->ngen > 1 ? (double)(g->ngen - 1) : 0;

    for (size_t i = 0; ids && i < g->ngen; i++)
        json_array_append_new(ids, json_integer(g->ids[i]));
    for (size_t i = 0; pids && i < g->nprompt; i++)
        json_array_append_new(pids, json_integer(g->prompt[i]));
    o = json_pack("{s:s, s:s, s:o, s:o, s:{s:I, s:I}, s:{s:f, s:f, s:f, s:f, s:f}, s:I}",
                  "type", "done", "finish_reason", g->finish, "ids", ids, "prompt_ids", pids,
                  "usage", "prompt_tokens", (json_int_t)g->nprompt, "completion_tokens",
                  (json_int_t)g->ngen, "timing", "load_s", g->load_s, "prefill_s", g->prefill_s,
                  "prefill_tok_s", rate((double)g->nprompt, g->prefill_s), "decode_s",
                  g->decode_s, "decode_tok_s", rate(ndec, g->decode_s), "seed",
                  (json_int_t)g->sp.seed);
    if (o == NULL)
        return out_json(&g->out, NULL);
    if (g->parser != NULL) {
        if (td_chat_reply_json(td_chat_reply_reader_reply(g->parser), &msg) != TD_OK)
            g->out.failed = true;
        json_object_set_new(o, "message", msg);
    } else {
        json_t *t = json_stringn(g->text.data ? g->text.data : "", g->text.len);
        if (t == NULL)
            g->out.failed = true;
        json_object_set_new(o, "text", t);
    }
    if (g->logprobs != NULL)
        json_object_set(o, "tokens", g->logprobs);
    out_json(&g->out, o);
}

/* ---- the ranks -------------------------------------------------------------------------- */

/* A rank thread: waits for a step, runs its pass (with or without requests
 * in it: every rank of the group takes part in every step), says it is done. */
static void *
gen_rank_main(void *arg)
{
    gen_rank_t *r = arg;
    gen_t *g = r->g;
    uint64_t seen = 0;

    td_kernels_cpu_pool_bind(r->pool);
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (!g->quit && g->step == seen)
            pthread_cond_wait(&g->cv, &g->mu);
        bool quit = g->quit;
        seen = g->step;
        pthread_mutex_unlock(&g->mu);
        if (quit)
            break;
        r->st = td_forward_dep(r->dep, r->seqs, r->nseqs, NULL, NULL);   /* logs why */
        pthread_mutex_lock(&g->mu);
        if (--g->pending == 0)
            pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
    td_kernels_cpu_pool_bind(NULL);
    return NULL;
}

/* Start the rank threads (--dep); 0, or -1 after a message. */
static int
gen_ranks_start(gen_t *g)
{
    for (uint32_t r = 0; g->group != NULL && r < g->nranks; r++) {
        int e = pthread_create(&g->ranks[r].th, NULL, gen_rank_main, &g->ranks[r]);
        if (e != 0) {
            fprintf(stderr, "generate: rank %u: cannot start its thread: %s\n", r, strerror(e));
            return -1;
        }
        g->ranks[r].started = true;
    }
    return 0;
}

static void
gen_ranks_stop(gen_t *g)
{
    if (g->group == NULL)
        return;
    pthread_mutex_lock(&g->mu);
    g->quit = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    for (uint32_t r = 0; r < g->nranks; r++)
        if (g->ranks[r].started) {
            pthread_join(g->ranks[r].th, NULL);
            g->ranks[r].started = false;
        }
}

/* Put n tokens of request i into the next step. */
static void
gen_add(gen_t *g, size_t i, const int32_t *tokens, size_t n)
{
    gen_req_t *q = &g->reqs[i];
    gen_rank_t *r = &g->ranks[q->rank];

    r->seqs[r->nseqs++] = (td_forward_seq_t){ &q->cache, tokens, n, q->logits, 0, 0 };
}

/* One forward pass of every rank with what gen_add put in, then the step
 * is emptied; 0, or -1 (the pass logged why). */
static int
gen_step(gen_t *g)
{
    int rc = 0;

    if (g->group == NULL) {
        gen_rank_t *r = &g->ranks[0];
        if (r->nseqs > 0 && td_forward(r->m, r->seqs, r->nseqs, NULL, NULL) != TD_OK)
            rc = -1;
        r->nseqs = 0;
        return rc;
    }
    pthread_mutex_lock(&g->mu);
    g->pending = g->nranks;
    g->step++;
    pthread_cond_broadcast(&g->cv);
    while (g->pending > 0)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    for (uint32_t r = 0; r < g->nranks; r++) {
        if (g->ranks[r].st != TD_OK)
            rc = -1;
        g->ranks[r].nseqs = 0;
    }
    return rc;
}

/* ---- the run ------------------------------------------------------------------------------ */

/* Choose request i's token at position pos from its logits; request 0's is
 * printed. 0, or -1 after a message. */
static int
gen_pick(gen_t *g, size_t i, uint64_t pos, uint64_t cap)
{
    gen_req_t *q = &g->reqs[i];
    size_t V = (size_t)g->m->cfg->vocab_size;
    td_sample_params_t sp = q->sp;
    td_sample_dist_t lg = { (uint32_t)V, NULL, q->logits };
    td_sample_row_t row = { &sp, q->hist.count ? &q->hist : NULL, pos, q->ngen, NULL };
    td_sample_pick_t pk;

    sp.logprobs = i == 0 && g->o->logprobs >= 0;
    sp.top_logprobs = sp.logprobs ? (uint32_t)g->o->logprobs : 0;
    if (td_sample_row_pick(&lg, &row, -1, &pk) != TD_OK)   /* logs why */
        return -1;
    if (q->hist.count && td_sample_hist_add(&q->hist, &pk.token, 1, true) != TD_OK) {
        fprintf(stderr, "generate: out of memory\n");
        return -1;
    }
    td_sample_finish_t fin = td_sample_finish(&q->sp, pk.token, q->ngen + 1, pos + 1, cap);
    q->token = pk.token;
    q->ngen++;
    g->total_gen++;
    if (i == 0) {
        if (gen_emit(g, &pk, fin) != 0)
            return -1;
        if (fin == TD_SAMPLE_FINISH_NONE && g->parser != NULL &&
            td_chat_reply_reader_stopped(g->parser))
            fin = TD_SAMPLE_FINISH_STOP;
        g->fin = fin;
        if (g->out.failed)   /* nothing more can be shown: every request ends */
            for (size_t j = 0; j < g->nreq; j++)
                g->reqs[j].done = true;
    }
    if (fin != TD_SAMPLE_FINISH_NONE)
        q->done = true;
    return 0;
}

/* Prefill in chunks, then decode until every request has a stop token or
 * reached the length limit; each step is one pass of every rank. */
static int
gen_run(gen_t *g)
{
    size_t V = (size_t)g->m->cfg->vocab_size;
    uint64_t cap = g->nprompt + g->sp.max_tokens;
    int32_t *in = NULL;
    int rc = -1;

    if (cap > g->context)
        cap = g->context;
    g->fin = TD_SAMPLE_FINISH_NONE;
    g->nreq = (size_t)g->o->requests;
    g->reqs = calloc(g->nreq, sizeof(*g->reqs));
    in = malloc(g->nprompt * sizeof(int32_t));
    g->ids = malloc((g->sp.max_tokens + 1) * sizeof(int32_t));
    if (g->reqs == NULL || in == NULL || g->ids == NULL)
        goto nomem;
    for (uint32_t r = 0; r < g->nranks; r++)
        if ((g->ranks[r].seqs = calloc(g->nreq, sizeof(td_forward_seq_t))) == NULL)
            goto nomem;
    for (size_t i = 0; i < g->nreq; i++) {
        gen_req_t *q = &g->reqs[i];
        q->rank = (uint32_t)(i % g->nranks);
        q->sp = g->sp;
        q->sp.seed = g->sp.seed + i;
        if (td_sample_params_penalized(&q->sp) &&
            (td_sample_hist_init(&q->hist, (uint32_t)V) != TD_OK ||
             td_sample_hist_add(&q->hist, (const int32_t *)g->prompt, g->nprompt, false) != TD_OK))
            goto nomem;
        const td_model_t *m = g->ranks[q->rank].m;
        if (td_kvmem_create(m->plan->layout, cap, 0, &q->mem) != TD_OK ||   /* logs why */
            td_cache_init(&q->cache, m->plan, &q->mem->kv) != TD_OK)
            goto cleanup;
        td_cache_reset(&q->cache);
        if ((q->logits = malloc(V * sizeof(float))) == NULL)
            goto nomem;
    }
    for (size_t i = 0; i < g->nprompt; i++)
        in[i] = (int32_t)g->prompt[i];
    if (gen_ranks_start(g) != 0)
        goto cleanup;

    double t0 = td_clock_s();
    for (size_t at = 0; at < g->nprompt; at += g->o->chunk) {
        size_t n = g->nprompt - at < g->o->chunk ? g->nprompt - at : g->o->chunk;
        for (size_t i = 0; i < g->nreq; i++)
            gen_add(g, i, in + at, n);
        if (gen_step(g) != 0)
            goto cleanup;
    }
    double t1 = td_clock_s();
    g->prefill_s = t1 - t0;

    uint64_t pos = g->nprompt;
    for (size_t i = 0; i < g->nreq; i++)
        if (gen_pick(g, i, pos, cap) != 0)
            goto cleanup;
    for (;;) {
        size_t live = 0;
        for (size_t i = 0; i < g->nreq; i++)
            if (!g->reqs[i].done) {
                gen_add(g, i, &g->reqs[i].token, 1);
                live++;
            }
        if (live == 0)
            break;
        if (gen_step(g) != 0)
            goto cleanup;
        pos++;
        for (size_t i = 0; i < g->nreq; i++)
            if (!g->reqs[i].done && gen_pick(g, i, pos, cap) != 0)
                goto cleanup;
    }
    g->decode_s = td_clock_s() - t1;
    if (gen_finish(g, g->fin) != 0)
        goto cleanup;
    rc = 0;
    goto cleanup;
nomem:
    fprintf(stderr, "generate: out of memory\n");
cleanup:
    gen_ranks_stop(g);
    for (size_t i = 0; g->reqs != NULL && i < g->nreq; i++) {
        free(g->reqs[i].logits);
        td_sample_hist_free(&g->reqs[i].hist);
        td_kvmem_destroy(g->reqs[i].mem);
    }
    free(g->reqs);
    g->reqs = NULL;
    free(in);
    return rc;
}

/* ---- input ---------------------------------------------------------------------------- */

/* Read and render the chat request; prints why on failure. */
static int
gen_read_request(const char *path, const td_chat_prompt_opts_t *opts, td_chat_prompt_t **out)
{
    FILE *f = stdin;
    char *text = NULL;
    size_t len;
    json_error_t jerr;
    td_chat_prompt_err_t err;
    const char *name = strcmp(path, "-") == 0 ? "<stdin>" : path;

    if (f == stdin && strcmp(path, "-") != 0 && (f = fopen(path, "rb")) == NULL) {
        fprintf(stderr, "generate: --messages %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = cli_read_all(f, &text, &len);
    int e = errno;
    if (f != stdin)
        fclose(f);
    if (rc != 0) {
        fprintf(stderr, "generate: --messages %s: read failed: %s\n", name, strerror(e));
        return -1;
    }
    json_t *req = json_loadb(text, len, JSON_ALLOW_NUL, &jerr);
    free(text);
    if (req == NULL) {
        fprintf(stderr, "generate: --messages %s:%d:%d: not JSON: %s\n", name, jerr.line,
                jerr.column, jerr.text);
        return -1;
    }
    td_status_t st = td_chat_prompt_encode(req, opts, out, &err);
    json_decref(req);
    if (st == TD_OK)
        return 0;
    if (st == TD_ERR_INVALID || st == TD_ERR_UNSUPPORTED)   /* a refusal: ours to say */
        fprintf(stderr, "generate: --messages %s: request refused (%s)%s%s: %s\n", name,
                td_status_str(st), err.param[0] ? " at " : "", err.param, err.message);
    return -1;   /* otherwise the encoder logged why */
}

/* --prompt-ids: decimal ids separated by spaces or commas into g->prompt;
 * prints why on failure. */
static int
gen_parse_ids(gen_t *g, const char *s)
{
    size_t cap = strlen(s) / 2 + 1;

    g->prompt = malloc(cap * sizeof(*g->prompt));
    if (g->prompt == NULL) {
        fprintf(stderr, "generate: out of memory\n");
        return -1;
    }
    g->nprompt = 0;
    while (*s != '\0') {
        char *end;
        unsigned long long v;

        if (*s == ' ' || *s == ',' || *s == '\n' || *s == '\t') {
            s++;
            continue;
        }
        errno = 0;
        v = strtoull(s, &end, 10);
        if (end == s || errno != 0 || v > UINT32_MAX || *s == '-' || g->nprompt >= cap) {
            fprintf(stderr, "generate: --prompt-ids: \"%.20s\" is not a token id\n", s);
            return -1;
        }
        g->prompt[g->nprompt++] = (uint32_t)v;
        s = end;
    }
    return 0;
}

/* Prompt ids, sampling and limits; prints why on failure. */
static int
gen_prepare(gen_t *g)
{
    const gen_opts_t *o = g->o;
    td_model_t *m = g->m;
    td_status_t st;
    char why[96];

    if (m->tok == NULL) {
        fprintf(stderr, "generate: model %s has no tokenizer.json: it is needed to read the "
                        "prompt and write the reply\n", o->model);
        return -1;
    }
    if (g->chat != NULL)
        st = td_chat_prompt_ids(g->chat, m->tok, &g->prompt, &g->nprompt);
    else if (o->prompt_ids != NULL)
        st = gen_parse_ids(g, o->prompt_ids) == 0 ? TD_OK : TD_ERR_INVALID;
    else
        st = td_tokenizer_encode(m->tok, o->prompt, strlen(o->prompt), TD_TOKENIZER_SPECIAL,
                                 &g->prompt, &g->nprompt);
    if (st != TD_OK)
        return -1;   /* the tokenizer (or gen_parse_ids) said why */
    for (size_t i = 0; i < g->nprompt; i++)
        if ((int64_t)g->prompt[i] >= m->cfg->vocab_size) {
            fprintf(stderr, "generate: prompt token %zu is id %u, outside the model's "
                            "vocabulary of %lld\n", i, g->prompt[i],
                    (long long)m->cfg->vocab_size);
            return -1;
        }
    if (g->nprompt == 0) {
        fprintf(stderr, "generate: the prompt is empty (0 tokens)\n");
        return -1;
    }
    uint64_t maxpos = (uint64_t)m->cfg->max_position_embeddings;
    g->context = o->context ? o->context : maxpos;
    if (g->context > maxpos) {
        fprintf(stderr, "generate: --context %llu is above the model's max_position_embeddings "
                        "(%llu)\n", (unsigned long long)g->context, (unsigned long long)maxpos);
        return -1;
    }
    if (g->nprompt >= g->context) {
        fprintf(stderr, "generate: the prompt has %zu tokens: it does not fit the context of "
                        "%llu tokens with room for a reply\n", g->nprompt,
                (unsigned long long)g->context);
        return -1;
    }
    g->sp = (td_sample_params_t){
        .temperature = o->temperature, .top_p = o->top_p, .top_k = (uint32_t)o->top_k,
        .seed = o->seed, .max_tokens = (uint32_t)o->max_tokens, .min_p = o->min_p,
        .repetition_penalty = o->repetition_penalty, .presence_penalty = o->presence_penalty,
        .frequency_penalty = o->frequency_penalty, .min_tokens = (uint32_t)o->min_tokens,
    };
    for (uint32_t i = 0; i < o->nstop_ids; i++) {
        if (o->stop_ids[i] >= m->cfg->vocab_size) {
            fprintf(stderr, "generate: --stop-token-ids: %d is outside the model's vocabulary "
                            "of %lld\n", o->stop_ids[i], (long long)m->cfg->vocab_size);
            return -1;
        }
        (void)td_sample_stop_add(&g->sp, o->stop_ids[i]);   /* <= 16: fits */
    }
    if (!o->seed_set)
        g->sp.seed = td_rng_mix64((uint64_t)time(NULL) * TD_RNG_GAMMA ^
                                     td_rng_mix64((uint64_t)getpid() + (uint64_t)clock()));
    if (td_sample_check(&g->sp, why, sizeof(why)) != TD_OK) {
        fprintf(stderr, "generate: %s\n", why);
        return -1;
    }
    /* the checkpoint's end-of-sequence ids, as the serving engines take them */
    int32_t eos[TD_SAMPLE_MAX_STOP];
    uint32_t neos = 0;
    st = td_v41_eos_ids(o->model, m->cfg, eos, &neos);   /* logs why */
    if (st == TD_ERR_NOT_FOUND)
        fprintf(stderr, "generate: %s names no end-of-sequence token: the reply ends at "
                        "--max-tokens\n", o->model);
    else if (st != TD_OK)
        return -1;
    for (uint32_t i = 0; !o->ignore_eos && i < neos; i++)
        if (td_sample_stop_add(&g->sp, eos[i]) != TD_OK) {
            fprintf(stderr, "generate: more than %d stop tokens\n", TD_SAMPLE_MAX_STOP);
            return -1;
        }
    if (g->chat != NULL) {
        td_chat_reply_opts_t po = g->chat->reply;
        po.id_seed = td_rng_mix64(g->sp.seed + TD_RNG_GAMMA) | 1;   /* reproducible ids */
        if (td_chat_reply_reader_create(&po, &g->parser) != TD_OK)   /* logs why */
            return -1;
    }
    g->piece_cap = TD_DETOK_OUT_MAX(td_tokenizer_max_piece(m->tok)) + 8;
    g->piece = malloc(g->piece_cap);
    if (g->piece == NULL || (o->json && !o->stream && (g->logprobs = json_array()) == NULL)) {
        fprintf(stderr, "generate: out of memory\n");
        return -1;
    }
    return 0;
}

/* Loading a checkpoint of hundreds of GB takes minutes: its progress lines
 * go to stderr (the log shows warnings only), every few seconds, then the
 * last one when any was shown; a quick load prints nothing. */
static void
gen_on_progress(td_progress_phase_t phase, const char *line, void *arg)
{
    bool *shown = arg;

    if (phase == TD_PROGRESS_STEP)
        *shown = true;
    else if (phase == TD_PROGRESS_BEGIN || !*shown)
        return;
    fprintf(stderr, "generate: %s\n", line);
}

/* The model: one load without --dep; with --dep N, the placement, the
 * communicator group and, for every rank, a load of its experts only, its
 * communicator, DEP context and cpu pool (the cpu threads shared out). 0,
 * or -1 after a message. */
static int
gen_load(gen_t *g)
{
    const gen_opts_t *o = g->o;
    td_status_t st;

    g->nranks = o->dep ? (uint32_t)o->dep : 1;
    g->ranks = calloc(g->nranks, sizeof(*g->ranks));
    if (g->ranks == NULL) {
        fprintf(stderr, "generate: out of memory\n");
        return -1;
    }
    for (uint32_t r = 0; r < g->nranks; r++) {
        g->ranks[r].g = g;
        g->ranks[r].rank = r;
    }
    if (o->dep == 0) {
        st = td_model_load(o->model, &g->m);
        if (st != TD_OK)
            goto err_model;
        g->ranks[0].m = g->m;
        return 0;
    }

    /* the expert count, for the placement, from the config alone */
    td_modelcfg_t *cfg = NULL;
    st = td_modelcfg_load(o->model, &cfg);   /* logs why */
    if (st != TD_OK)
        goto err_model;
    uint32_t E = (uint32_t)cfg->n_routed_experts;
    td_modelcfg_destroy(cfg);
    st = o->placement ? td_placement_load(o->placement, E, g->nranks, &g->placement)
                      : td_placement_create_ranges(E, g->nranks, &g->placement);
    if (st != TD_OK) {   /* logged with the reason */
        if (o->placement)
            fprintf(stderr, "generate: --placement %s: refused (%s)\n", o->placement,
                    td_status_str(st));
        return -1;
    }
    td_comm_opts_t co = { .name = "generate DEP" };
    if (td_comm_group_create(g->nranks, &co, &g->group) != TD_OK ||   /* logs why */
        pthread_mutex_init(&g->mu, NULL) != 0 || pthread_cond_init(&g->cv, NULL) != 0) {
        fprintf(stderr, "generate: cannot make a DEP group of %u ranks\n", g->nranks);
        return -1;
    }
    unsigned threads = td_kernels_cpu_threads() / g->nranks;
    for (uint32_t r = 0; r < g->nranks; r++) {
        gen_rank_t *k = &g->ranks[r];
        td_model_opts_t mo = { g->placement, r };
        st = td_model_load_opts(o->model, &mo, &k->m);
        if (st != TD_OK)
            goto err_model;
        if (td_comm_cpu_create(g->group, r, &k->comm) != TD_OK ||
            td_forward_dep_create(k->m, k->comm, g->placement, &k->dep) != TD_OK ||
            td_kernels_cpu_pool_create(threads ? threads : 1, &k->pool) != TD_OK) {
            fprintf(stderr, "generate: cannot set up rank %u of the DEP group\n", r);
            return -1;   /* logged why */
        }
    }
    g->m = g->ranks[0].m;
    return 0;

err_model:
    fprintf(stderr, "generate: cannot load the model in %s: %s\n", o->model, td_status_str(st));
    return -1;
}

static void
gen_unload(gen_t *g)
{
    for (uint32_t r = 0; g->ranks != NULL && r < g->nranks; r++) {
        gen_rank_t *k = &g->ranks[r];
        td_forward_dep_destroy(k->dep);
        td_comm_destroy(k->comm);
        td_kernels_cpu_pool_destroy(k->pool);
        if (k->m != g->m)
            td_model_destroy(k->m);
        free(k->seqs);
    }
    if (g->group != NULL) {
        td_comm_group_destroy(g->group);
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
    }
    free(g->ranks);
    td_placement_destroy(g->placement);
    td_model_destroy(g->m);
}

int
main(int argc, char **argv)
{
    gen_opts_t o;
    gen_t g = { 0 };
    int rc;

    td_log_set_ident("generate");
    td_log_set_level(TD_LOG_WARN);
    rc = parse_opts(argc, argv, &o);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    g.o = &o;
    g.out = (gen_out_t){
        .tty = isatty(STDOUT_FILENO) && !o.json && getenv("NO_COLOR") == NULL,
        .json = o.json, .stream = o.stream, .line_start = true,
    };
    rc = 1;
    if (o.messages != NULL && gen_read_request(o.messages, &o.chat, &g.chat) != 0)
        goto cleanup;

    double t0 = td_clock_s();
    bool progress_shown = false;
    td_progress_set_handler(gen_on_progress, &progress_shown);
    int loaded = gen_load(&g);
    td_progress_set_handler(NULL, NULL);
    if (loaded != 0)
        goto cleanup;
    g.load_s = td_clock_s() - t0;
    if (gen_prepare(&g) != 0 || gen_run(&g) != 0)
        goto cleanup;

    if (o.json) {
        gen_print_done(&g);
    } else {
        if (!o.stream)
            gen_print_reply(&g);
        out_end(&g.out);
    }
    if (fflush(stdout) != 0 || g.out.failed) {
        fprintf(stderr, "generate: writing the reply failed: %s\n", strerror(errno));
        goto cleanup;
    }
    double ndec = g.ngen > 1 ? (double)(g.ngen - 1) : 0;
    char how[40] = "greedy";
    if (!(g.sp.temperature == 0 || g.sp.top_k == 1))
        snprintf(how, sizeof(how), "seed %llu", (unsigned long long)g.sp.seed);
    char group[160] = "";
    if (o.dep || g.nreq > 1) {
        double all = g.total_gen > g.nreq ? (double)(g.total_gen - g.nreq) : 0;
        int n = snprintf(group, sizeof(group), ";");
        if (o.dep)
            n += snprintf(group + n, sizeof(group) - (size_t)n, " DEP %u (%s)", g.nranks,
                          o.placement ? o.placement : "contiguous experts");
        snprintf(group + n, sizeof(group) - (size_t)n, "%s %zu request%s, %zu tokens "
                 "generated in all (%.1f tok/s)", o.dep ? "," : "", g.nreq,
                 g.nreq == 1 ? "" : "s", g.total_gen, rate(all, g.decode_s));
    }
    fprintf(stderr,
            "generate: %zu prompt tokens, prefill %.3f s (%.1f tok/s); %zu tokens generated, "
            "decode %.3f s (%.1f tok/s); finish %s; %s%s\n",
            g.nprompt, g.prefill_s, rate((double)g.nprompt, g.prefill_s), g.ngen, g.decode_s,
            rate(ndec, g.decode_s), g.finish, how, group);
    rc = 0;
cleanup:
    json_decref(g.logprobs);
    free(g.ids);
    td_buf_free(&g.text);
    free(g.piece);
    free(g.prompt);
    td_chat_reply_reader_destroy(g.parser);
    td_chat_prompt_destroy(g.chat);
    gen_unload(&g);
    return rc;
}
