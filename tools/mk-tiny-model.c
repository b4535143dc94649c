/* tools/mk-tiny-model.c — writes a small deterministic DeepSeek-V4.1 checkpoint
 * in the release's format (composite config.json, safetensors, tokenizer.json
 * and tokenizer_config.json) for tests and benchmarks. docs/model.md. */
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "modelcfg.h"
#include "quant.h"
#include "rng.h"
#include "safetensors.h"
#include "tokenizer.h"
#include "tokmap.h"
#include "weights.h"

/* ---- Presets ------------------------------------------------------------------ */

#define MK_MAX_LAYERS 16

typedef struct {
    const char *name;
    const char *help;
    int hidden, layers, heads, head_dim, q_lora, rope_dim, window;
    int ratios[MK_MAX_LAYERS];
    int kv[MK_MAX_LAYERS], nkv;
    int index[MK_MAX_LAYERS], nindex;
    int candidate, cand_topk, cand_block;
    int index_heads, index_head_dim, index_topk;
    int o_groups, o_lora;
    int moe_inter, experts, topk;
    int engram[MK_MAX_LAYERS], nengram;
    int engram_vocab, engram_ngram, engram_heads, engram_dim;
    int max_pos, yarn_factor, yarn_orig;
} mk_preset_t;

/* 8 layers: a window-only layer, a ratio-2 group (source 1, reindex 3), a
 * ratio-1 group (source 4, the candidate source, reindex 6 under its
 * candidates); engram on a layer of each group. */
#define MK_SCHEDULE                                                       \
    .layers = 8, .ratios = { 0, 2, 2, 2, 1, 1, 1, 1 },                    \
    .kv = { 1, 4 }, .nkv = 2, .index = { 1, 3, 4, 6 }, .nindex = 4,       \
    .candidate = 4

static const mk_preset_t mk_presets[] = {
    { .name = "tiny", .help = "hidden 64, 8 layers, 8 experts top-2, engram on layers 2 and 5",
      .hidden = 64, .heads = 4, .head_dim = 64, .q_lora = 32, .rope_dim = 16, .window = 8,
      MK_SCHEDULE, .cand_topk = 2, .cand_block = 2,
      .index_heads = 2, .index_head_dim = 32, .index_topk = 4, .o_groups = 2, .o_lora = 32,
      .moe_inter = 32, .experts = 8, .topk = 2, .engram = { 2, 5 }, .nengram = 2,
      .engram_vocab = 61, .engram_ngram = 3, .engram_heads = 2, .engram_dim = 32,
      .max_pos = 1024, .yarn_factor = 4, .yarn_orig = 256 },
    { .name = "tiny-noengram", .help = "tiny without engram layers",
      .hidden = 64, .heads = 4, .head_dim = 64, .q_lora = 32, .rope_dim = 16, .window = 8,
      MK_SCHEDULE, .cand_topk = 2, .cand_block = 2,
      .index_heads = 2, .index_head_dim = 32, .index_topk = 4, .o_groups = 2, .o_lora = 32,
      .moe_inter = 32, .experts = 8, .topk = 2, .nengram = 0,
      .engram_vocab = 61, .engram_ngram = 3, .engram_heads = 2, .engram_dim = 32,
      .max_pos = 1024, .yarn_factor = 4, .yarn_orig = 256 },
    { .name = "mid", .help = "hidden 1024, 8 layers, 8 experts top-2 (benchmarks)",
      .hidden = 1024, .heads = 8, .head_dim = 128, .q_lora = 256, .rope_dim = 32, .window = 128,
      MK_SCHEDULE, .cand_topk = 16, .cand_block = 8,
      .index_heads = 4, .index_head_dim = 64, .index_topk = 64, .o_groups = 4, .o_lora = 256,
      .moe_inter = 256, .experts = 8, .topk = 2, .engram = { 2, 5 }, .nengram = 2,
      .engram_vocab = 4099, .engram_ngram = 3, .engram_heads = 4, .engram_dim = 64,
      .max_pos = 65536, .yarn_factor = 4, .yarn_orig = 16384 },
};

/* ---- Options ------------------------------------------------------------------- */

typedef enum { MK_QUANT_NONE, MK_QUANT_FP8, MK_QUANT_FP8_FP4 } mk_quant_t;

typedef struct {
    const mk_preset_t *preset;
    uint64_t seed;
    td_dtype_t dtype;          /* F32 or BF16: storage of the float tensors */
    mk_quant_t quant;
    bool perturbed;            /* --init perturbed */
    const char *tokenizer;     /* NULL: generate one */
    uint64_t shard_mb;         /* 0: one file */
    uint64_t experts, topk;    /* 0: the preset's */
    mk_preset_t custom;        /* the preset with --experts / --topk applied */
    const char *outdir;
} mk_opts_t;

static void
mk_usage(FILE *f)
{
    fprintf(f,
            "usage: mk-tiny-model [--preset NAME] [--seed N] [--dtype f32|bf16]\n"
            "                     [--quant none|fp8|fp8+fp4] [--init reference|perturbed]\n"
            "                     [--tokenizer tokenizer.json] [--shard-mb N]\n"
            "                     [--experts N] [--topk K] OUTDIR\n"
            "Writes a deterministic DeepSeek-V4.1 checkpoint: config.json, safetensors,\n"
            "tokenizer.json and tokenizer_config.json. --experts and --topk replace the\n"
            "preset's routed experts per layer and experts per token. Presets:\n");
    for (size_t i = 0; i < sizeof(mk_presets) / sizeof(mk_presets[0]); i++)
        fprintf(f, "  %-14s %s%s\n", mk_presets[i].name, mk_presets[i].help,
                i == 0 ? " (default)" : "");
}

/* A word option's choices and the value each stands for. */
typedef struct {
    const char *word;
    int value;
} mk_choice_t;

static const mk_choice_t mk_dtypes[] = { { "f32", TD_DT_F32 }, { "bf16", TD_DT_BF16 }, { NULL, 0 } };
static const mk_choice_t mk_quants[] = {
    { "none", MK_QUANT_NONE }, { "fp8", MK_QUANT_FP8 }, { "fp8+fp4", MK_QUANT_FP8_FP4 }, { NULL, 0 },
};
static const mk_choice_t mk_inits[] = { { "reference", 0 }, { "perturbed", 1 }, { NULL, 0 } };

/* *value: the value of arg among words; 2 with a message naming the choices
 * when it is none of them. */
static int
mk_choose(const char *opt, const char *arg, const mk_choice_t *words, const char *choices, int *value)
{
    for (const mk_choice_t *w = words; w->word != NULL; w++)
        if (strcmp(arg, w->word) == 0) {
            *value = w->value;
            return 0;
        }
    fprintf(stderr, "mk-tiny-model: %s %s: %s\n", opt, arg, choices);
    return 2;
}

/* *v: arg as an integer in min .. max (max 0: no bound); 2 with a message
 * saying what it must be when it is not. */
static int
mk_uint(const char *opt, const char *arg, uint64_t min, uint64_t max, const char *must,
        uint64_t *v)
{
    if (td_config_parse_uint(opt, arg, min, max, v, NULL, 0) == TD_OK)
        return 0;
    fprintf(stderr, "mk-tiny-model: %s %s: %s\n", opt, arg, must);
    return 2;
}

/* One option of the command line (getopt_long's c and optarg) into o. */
static int
mk_parse_opt(int c, const char *arg, mk_opts_t *o)
{
    int v = 0, rc = 0;

    switch (c) {
    case 'p':
        o->preset = NULL;
        for (size_t i = 0; i < sizeof(mk_presets) / sizeof(mk_presets[0]); i++)
            if (strcmp(arg, mk_presets[i].name) == 0)
                o->preset = &mk_presets[i];
        if (o->preset == NULL) {
            fprintf(stderr, "mk-tiny-model: --preset %s: no such preset\n", arg);
            return 2;
        }
        return 0;
    case 's':
        return mk_uint("--seed", arg, 0, 0, "not a non-negative integer", &o->seed);
    case 'd':
        if ((rc = mk_choose("--dtype", arg, mk_dtypes, "f32 or bf16", &v)) == 0)
            o->dtype = (td_dtype_t)v;
        return rc;
    case 'q':
        if ((rc = mk_choose("--quant", arg, mk_quants, "none, fp8 or fp8+fp4", &v)) == 0)
            o->quant = (mk_quant_t)v;
        return rc;
    case 'i':
        if ((rc = mk_choose("--init", arg, mk_inits, "reference or perturbed", &v)) == 0)
            o->perturbed = v != 0;
        return rc;
    case 't':
        o->tokenizer = arg;
        return 0;
    case 'm':
        return mk_uint("--shard-mb", arg, 1, 1u << 20, "1 .. 1048576", &o->shard_mb);
    case 'e':
        return mk_uint("--experts", arg, 1, 1024, "1 .. 1024", &o->experts);
    case 'k':
        return mk_uint("--topk", arg, 1, 1024, "1 .. 1024", &o->topk);
    default:
        mk_usage(stderr);
        return 2;
    }
}

static int
mk_parse_args(int argc, char **argv, mk_opts_t *o)
{
    static const struct option longopts[] = {
        { "preset", required_argument, NULL, 'p' },
        { "seed", required_argument, NULL, 's' },
        { "dtype", required_argument, NULL, 'd' },
        { "quant", required_argument, NULL, 'q' },
        { "init", required_argument, NULL, 'i' },
        { "tokenizer", required_argument, NULL, 't' },
        { "shard-mb", required_argument, NULL, 'm' },
        { "experts", required_argument, NULL, 'e' },
        { "topk", required_argument, NULL, 'k' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c, rc;

    memset(o, 0, sizeof(*o));
    o->preset = &mk_presets[0];
    o->dtype = TD_DT_BF16;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == 'h') {
            mk_usage(stdout);
            exit(0);
        }
        if ((rc = mk_parse_opt(c, optarg, o)) != 0)
            return rc;
    }
    if (optind != argc - 1) {
        mk_usage(stderr);
        return 2;
    }
    o->outdir = argv[optind];
    if (o->experts != 0 || o->topk != 0) {
        o->custom = *o->preset;
        if (o->experts != 0)
            o->custom.experts = (int)o->experts;
        if (o->topk != 0)
            o->custom.topk = (int)o->topk;
        if (o->custom.topk > o->custom.experts) {
            fprintf(stderr, "mk-tiny-model: --topk %d is more than the %d experts\n",
                    o->custom.topk, o->custom.experts);
            return 2;
        }
        o->preset = &o->custom;
    }
    return 0;
}

/* ---- Deterministic random numbers ------------------------------------------------ */

/* One td_rng stream per tensor, seeded from the seed and the tensor's name,
 * so a tensor's values do not depend on which other tensors exist. */
static td_rng_t
mk_stream(uint64_t seed, const char *name)
{
    uint64_t h = 0xCBF29CE484222325ull;   /* FNV-1a of the name */

    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001B3ull;
    td_rng_t r = td_rng_seed(h ^ seed * TD_RNG_GAMMA);
    td_rng_next(&r);   /* the first number is skipped */
    return r;
}

/* Standard normal, approximately: the Irwin-Hall sum of 12 uniforms minus 6
 * (mean 0, variance 1, within +-6). Integer-exact, so the same on every host. */
static double
mk_normal(td_rng_t *s)
{
    int64_t acc = 0;

    for (int i = 0; i < 6; i++) {
        uint64_t r = td_rng_next(s);
        acc += (int64_t)(r >> 32) + (int64_t)(r & 0xFFFFFFFFu);
    }
    return (double)acc / 4294967296.0 - 6.0;
}

/* ---- Files --------------------------------------------------------------------- */

static int
mk_write_file(const char *dir, const char *name, const void *data, size_t len)
{
    char path[4096], tmp[4200];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "wb");
    if (f == NULL) {
        fprintf(stderr, "mk-tiny-model: %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    if (fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "mk-tiny-model: %s: write failed\n", tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        fprintf(stderr, "mk-tiny-model: %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

static int
mk_write_json(const char *dir, const char *name, const json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    int rc;

    if (s == NULL) {
        fprintf(stderr, "mk-tiny-model: %s: out of memory\n", name);
        return -1;
    }
    rc = mk_write_file(dir, name, s, strlen(s));
    free(s);
    return rc;
}

static char *
mk_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;

    if (f == NULL) {
        fprintf(stderr, "mk-tiny-model: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
        (buf = malloc((size_t)n + 1)) == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "mk-tiny-model: %s: cannot read\n", path);
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

/* Remove the checkpoint files an earlier run may have left in dir (a sharded
 * index would otherwise shadow a new single file, and the other way round). */
static int
mk_clean(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char path[4096];
    int rc = 0;

    if (d == NULL) {
        fprintf(stderr, "mk-tiny-model: %s: %s\n", dir, strerror(errno));
        return -1;
    }
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, "model.safetensors") != 0 &&
            strcmp(de->d_name, "model.safetensors.index.json") != 0 &&
            fnmatch("model-*-of-*.safetensors", de->d_name, 0) != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        if (unlink(path) != 0) {
            fprintf(stderr, "mk-tiny-model: %s: %s\n", path, strerror(errno));
            rc = -1;
        }
    }
    closedir(d);
    return rc;
}

/* ---- The generated tokenizer ------------------------------------------------------ */

/* The added tokens of the V4 tokenizer that are not numbered place holders,
 * with their exact contents and flags, plus <｜System｜>, which the V4.1 chat
 * format opens its system block with (the V4 tokenizer does not have it); the
 * first three are also ids 0-2 of the BPE vocabulary, as in the release. */
static const struct {
    const char *content;
    int special;
    int normalized;
} mk_added[] = {
    { "<｜begin▁of▁sentence｜>", 1, 0 },
    { "<｜end▁of▁sentence｜>", 1, 0 },
    { "<｜▁pad▁｜>", 1, 0 },
    { "<｜fim▁hole｜>", 0, 1 },
    { "<｜fim▁begin｜>", 0, 1 },
    { "<｜fim▁end｜>", 0, 1 },
    { "<｜User｜>", 0, 1 },
    { "<｜Assistant｜>", 0, 1 },
    { "<｜System｜>", 0, 1 },
    { "<|EOT|>", 0, 1 },
    { "<｜tool▁calls▁begin｜>", 0, 1 },
    { "<｜tool▁calls▁end｜>", 0, 1 },
    { "<｜tool▁call▁begin｜>", 0, 1 },
    { "<｜tool▁call▁end｜>", 0, 1 },
    { "<｜tool▁outputs▁begin｜>", 0, 1 },
    { "<｜tool▁outputs▁end｜>", 0, 1 },
    { "<｜tool▁output▁begin｜>", 0, 1 },
    { "<｜tool▁output▁end｜>", 0, 1 },
    { "<｜tool▁sep｜>", 0, 1 },
    { "<｜begin▁of▁repo▁name｜>", 0, 1 },
    { "<｜end▁of▁repo▁name｜>", 0, 1 },
    { "<｜begin▁of▁file▁name｜>", 0, 1 },
    { "<｜end▁of▁file▁name｜>", 0, 1 },
    { "<｜begin▁of▁file｜>", 0, 1 },
    { "<｜end▁of▁file｜>", 0, 1 },
    { "<think>", 0, 1 },
    { "</think>", 0, 1 },
    { "<｜place▁holder▁for▁copy｜>", 0, 1 },
    { "<｜place▁holder▁for▁pointer▁replace｜>", 0, 1 },
    { "｜DSML｜", 0, 1 },
    { "<｜begin▁sys｜>", 0, 1 },
    { "<｜end▁sys｜>", 0, 1 },
    { "<｜latest_reminder｜>", 0, 1 },
    { "<｜action｜>", 0, 1 },
    { "<｜query｜>", 0, 1 },
    { "<｜authority｜>", 0, 1 },
    { "<｜domain｜>", 0, 1 },
    { "<｜task｜>", 0, 1 },
    { "<｜political｜>", 0, 1 },
    { "<｜entity｜>", 0, 1 },
    { "<｜title｜>", 0, 1 },
    { "<｜safety｜>", 0, 1 },
    { "<｜answer｜>", 0, 1 },
    { "<｜search｜>", 0, 1 },
    { "<dsml:", 0, 1 },
    { "</dsml:", 0, 1 },
    { "<｜search▁begin｜>", 0, 1 },
    { "<｜search▁end｜>", 0, 1 },
    { "<｜extracted_url｜>", 0, 1 },
    { "<｜read_url｜>", 0, 1 },
    { "<｜end_of_query｜>", 1, 0 },
    { "<｜rl_image_pad｜>", 1, 0 },
    { "<｜rl_image_start｜>", 1, 0 },
    { "<｜image2｜>", 0, 0 },
    { "<｜/table>｜", 0, 0 },
    { "<｜table｜>", 0, 0 },
    { "<｜/td｜>", 0, 0 },
    { "<｜td｜>", 0, 0 },
    { "<｜/tr｜>", 0, 0 },
    { "<｜tr｜>", 0, 0 },
    { "<｜/polygon｜>", 1, 0 },
    { "<｜polygon｜>", 1, 0 },
    { "<｜/point｜>", 1, 0 },
    { "<｜point｜>", 1, 0 },
    { "<｜/box｜>", 1, 0 },
    { "<｜box｜>", 1, 0 },
    { "<｜/ref｜>", 1, 0 },
    { "<｜ref｜>", 1, 0 },
    { "<｜image｜>", 1, 0 },
};

#define MK_NADDED (sizeof(mk_added) / sizeof(mk_added[0]))
#define MK_NMERGES 600

/* The text the merges are learned from. */
static const char mk_corpus[] =
    "The quick brown fox jumps over the lazy dog. A model reads the prompt, keeps a cache "
    "of what it has seen, and writes one token at a time. When the request is long, the "
    "server splits the work: one machine reads the prompt and another one writes the answer. "
    "The cache moves between them over the network, layer by layer, while the next layer is "
    "still being computed. Every block of the cache belongs to exactly one request, and a "
    "block is never handed to another request while a peer may still write into it.\n"
    "Tokens are pieces of text. Common words become single tokens; rare words are spelled out "
    "in smaller pieces, down to single bytes. This is why the tokenizer can read any input, "
    "even text in languages it was never trained on, and why the same sentence always turns "
    "into the same numbers.\n"
    "Questions and answers: What is the capital of France? The capital of France is Paris. "
    "How many days are there in a week? There are seven days in a week. Please write a short "
    "poem about the sea. The sea is wide and deep and blue; it keeps the secrets of the moon.\n"
    "int main(int argc, char **argv)\n{\n    int count = 0;\n    for (int i = 1; i < argc; i++) {\n"
    "        if (strcmp(argv[i], \"--help\") == 0)\n            return usage(stdout);\n"
    "        count += 1;\n    }\n    printf(\"%d arguments\\n\", count);\n    return 0;\n}\n"
    "def tokenize(text: str) -> list[int]:\n    ids = []\n    for word in text.split():\n"
    "        ids.append(vocab.get(word, 0))\n    return ids\n\n"
    "class Request:\n    def __init__(self, prompt, max_tokens=16):\n        self.prompt = prompt\n"
    "        self.max_tokens = max_tokens\n        self.output = []\n\n"
    "{\"role\": \"user\", \"content\": \"Hello, how are you today?\"}\n"
    "{\"role\": \"assistant\", \"content\": \"I am fine, thank you. How can I help you?\"}\n"
    "The numbers 1, 2, 3, 10, 42, 100 and 2026 appear in the text, as do dates like 2026-11-29 "
    "and times like 12:30. Functions return values; variables hold them; the result is "
    "printed to the screen. The engine runs on the processor or on the graphics card, and "
    "the results must be the same on both.\n"
    "Once upon a time there was a small town by a river. The people of the town grew apples "
    "and pears, and every autumn they carried the fruit to the market in the city. The road "
    "was long, so they started before the sun came up and returned when the stars were out. "
    "One year the river rose and the bridge was washed away. The children of the town built "
    "a new one from the wood of an old barn, and it is still standing there today.\n"
    "To install the package, run the install script, then start the server with the default "
    "configuration. The server listens on port 8000 and answers requests in the same format "
    "as the other services. Logs are written to standard error; set the log level to debug "
    "to see every request as it arrives. If the server does not start, check that the port "
    "is free and that the model directory contains the configuration and the weights.\n"
    "static int\nparse_line(const char *line, size_t len, struct entry *out)\n{\n"
    "    const char *eq = memchr(line, '=', len);\n    if (eq == NULL)\n"
    "        return -1;\n    out->key = strndup(line, (size_t)(eq - line));\n"
    "    out->value = strndup(eq + 1, len - (size_t)(eq - line) - 1);\n"
    "    return out->key && out->value ? 0 : -1;\n}\n"
    "for name, value in sorted(settings.items()):\n    if value is None:\n"
    "        continue\n    print(f\"{name} = {value}\")\n"
    "The weather today is sunny with a light wind from the west. Tomorrow there will be "
    "clouds in the morning and rain in the afternoon, and the temperature will fall in the "
    "evening. People who walk to work should take an umbrella with them.\n";

/* GPT-2's byte-level alphabet: byte b -> a printable code point. */
static void
mk_byte_alphabet(uint32_t cp[256])
{
    int n = 0;

    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

static size_t
mk_utf8(uint32_t c, char *out)
{
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xC0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    out[0] = (char)(0xE0 | (c >> 12));
    out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[2] = (char)(0x80 | (c & 0x3F));
    return 3;
}

/* The order GPT-2 lists its alphabet in (printable bytes first). */
static void
mk_byte_order(uint8_t order[256])
{
    int n = 0;

    for (int b = 0; b < 256; b++)
        if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
            order[n++] = (uint8_t)b;
    for (int b = 0; b < 256; b++)
        if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE))
            order[n++] = (uint8_t)b;
}

static bool is_alpha_(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static bool is_digit_(int c) { return c >= '0' && c <= '9'; }
static bool is_space_(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_punct_(int c) { return c > ' ' && c < 127 && !is_alpha_(c) && !is_digit_(c); }

/* The length of the next pre-token of s (an ASCII approximation of the V4
 * pre-tokenizer: digit runs of up to 3, punctuation + letters, an optional
 * leading space + letters, punctuation runs, newlines, spaces). */
static size_t
mk_pretoken(const char *s)
{
    size_t i = 0;

    if (is_digit_(s[0])) {
        while (i < 3 && is_digit_(s[i]))
            i++;
        return i;
    }
    if (is_punct_(s[0]) && is_alpha_(s[1])) {
        i = 1;
        while (is_alpha_(s[i]))
            i++;
        return i;
    }
    if (is_alpha_(s[0]) || (s[0] != '\n' && s[0] != '\r' && !is_punct_(s[0]) && is_alpha_(s[1]))) {
        i = 1;
        while (is_alpha_(s[i]))
            i++;
        return i;
    }
    if (is_punct_(s[0]) || (s[0] == ' ' && is_punct_(s[1]))) {
        i = s[0] == ' ' ? 1 : 0;
        while (is_punct_(s[i]))
            i++;
        while (s[i] == '\n' || s[i] == '\r')
            i++;
        return i;
    }
    while (is_space_(s[i]) && s[i] != '\n')
        i++;
    if (s[i] == '\n') {
        while (s[i] == '\n' || s[i] == '\r')
            i++;
        return i;
    }
    if (i > 1 && s[i] != '\0')
        i--;   /* the last space goes with the next word */
    return i ? i : 1;
}

typedef struct {
    int *sym;       /* symbol ids */
    int n;
    int count;      /* occurrences in the corpus */
} mk_word_t;

typedef struct {
    char **str;     /* [n] byte-level strings of the vocabulary */
    int n, cap;
    int (*merge)[2];
    int nmerges;
} mk_vocab_t;

static int
mk_vocab_add(mk_vocab_t *v, const char *s, size_t len)
{
    if (v->n == v->cap) {
        int cap = v->cap ? 2 * v->cap : 512;
        char **p = realloc(v->str, (size_t)cap * sizeof(*p));
        if (p == NULL)
            return -1;
        v->str = p;
        v->cap = cap;
    }
    v->str[v->n] = strndup(s, len);
    return v->str[v->n] == NULL ? -1 : v->n++;
}

/* Learn up to MK_NMERGES merges from the corpus; ties go to the pair whose
 * ids are smallest, so the result is fixed. */
static int
mk_learn(mk_vocab_t *v, const int byte_id[256])
{
    mk_word_t *w = NULL;
    int nw = 0, capw = 0, rc = -1;
    int *counts = NULL;
    const char *p = mk_corpus;

    /* distinct pre-tokens with their counts */
    while (*p) {
        size_t len = mk_pretoken(p);
        int k;
        for (k = 0; k < nw; k++) {
            if (w[k].n == (int)len) {
                int j = 0;
                while (j < (int)len && w[k].sym[j] == byte_id[(uint8_t)p[j]])
                    j++;
                if (j == (int)len)
                    break;
            }
        }
        if (k < nw) {
            w[k].count++;
        } else {
            if (nw == capw) {
                capw = capw ? 2 * capw : 256;
                mk_word_t *q = realloc(w, (size_t)capw * sizeof(*q));
                if (q == NULL)
                    goto out;
                w = q;
            }
            w[nw].sym = malloc(len * sizeof(int));
            if (w[nw].sym == NULL)
                goto out;
            for (size_t j = 0; j < len; j++)
                w[nw].sym[j] = byte_id[(uint8_t)p[j]];
            w[nw].n = (int)len;
            w[nw].count = 1;
            nw++;
        }
        p += len;
    }

    v->merge = calloc(MK_NMERGES, sizeof(*v->merge));
    if (v->merge == NULL)
        goto out;
    for (int m = 0; m < MK_NMERGES; m++) {
        int best_a = -1, best_b = -1, best = 1;
        size_t nsym = (size_t)v->n;
        /* count pairs: a dense table is fine at this size */
        free(counts);
        counts = calloc(nsym * nsym, sizeof(int));
        if (counts == NULL)
            goto out;
        for (int k = 0; k < nw; k++)
            for (int j = 0; j + 1 < w[k].n; j++)
                counts[(size_t)w[k].sym[j] * nsym + (size_t)w[k].sym[j + 1]] += w[k].count;
        for (size_t a = 0; a < nsym; a++)
            for (size_t b = 0; b < nsym; b++)
                if (counts[a * nsym + b] > best) {
                    best = counts[a * nsym + b];
                    best_a = (int)a;
                    best_b = (int)b;
                }
        if (best_a < 0)
            break;
        char buf[512];
        size_t la = strlen(v->str[best_a]), lb = strlen(v->str[best_b]);
        if (la + lb >= sizeof(buf))
            break;
        memcpy(buf, v->str[best_a], la);
        memcpy(buf + la, v->str[best_b], lb);
        int id = mk_vocab_add(v, buf, la + lb);
        if (id < 0)
            goto out;
        v->merge[v->nmerges][0] = best_a;
        v->merge[v->nmerges][1] = best_b;
        v->nmerges++;
        for (int k = 0; k < nw; k++) {
            int o = 0;
            for (int j = 0; j < w[k].n; j++) {
                if (j + 1 < w[k].n && w[k].sym[j] == best_a && w[k].sym[j + 1] == best_b) {
                    w[k].sym[o++] = id;
                    j++;
                } else {
                    w[k].sym[o++] = w[k].sym[j];
                }
            }
            w[k].n = o;
        }
    }
    rc = 0;
out:
    free(counts);
    for (int k = 0; k < nw; k++)
        free(w[k].sym);
    free(w);
    return rc;
}

static json_t *
mk_added_json(size_t i, int id)
{
    return json_pack("{sisssbsbsbsbsb}", "id", id, "content", mk_added[i].content,
                     "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized",
                     mk_added[i].normalized, "special", mk_added[i].special);
}

/* The tokenizer.json of the V4 structure over a small learned vocabulary. */
static json_t *
mk_tokenizer_json(void)
{
    mk_vocab_t v = { 0 };
    uint32_t cp[256];
    uint8_t order[256];
    int byte_id[256];
    json_t *root = NULL, *vocab, *merges, *added, *pre;
    char buf[8];

    mk_byte_alphabet(cp);
    mk_byte_order(order);
    for (int i = 0; i < 3; i++)
        if (mk_vocab_add(&v, mk_added[i].content, strlen(mk_added[i].content)) < 0)
            goto out;
    for (int i = 0; i < 256; i++) {
        size_t n = mk_utf8(cp[order[i]], buf);
        byte_id[order[i]] = mk_vocab_add(&v, buf, n);
        if (byte_id[order[i]] < 0)
            goto out;
    }
    if (mk_learn(&v, byte_id) != 0)
        goto out;

    vocab = json_object();
    merges = json_array();
    added = json_array();
    for (int i = 0; vocab && i < v.n; i++)
        json_object_set_new(vocab, v.str[i], json_integer(i));
    for (int m = 0; merges && m < v.nmerges; m++) {
        char *s = NULL;
        if (asprintf(&s, "%s %s", v.str[v.merge[m][0]], v.str[v.merge[m][1]]) < 0)
            break;
        json_array_append_new(merges, json_string(s));
        free(s);
    }
    for (size_t i = 0; added && i < MK_NADDED; i++)
        json_array_append_new(added, mk_added_json(i, i < 3 ? (int)i : v.n + (int)i - 3));
    pre = json_pack(
        "{ss s[{sss{ss}sssb} {sss{ss}sssb} {sss{ss}sssb} {sssbsbsb}]}",
        "type", "Sequence", "pretokenizers",
        "type", "Split", "pattern", "Regex", "\\p{N}{1,3}", "behavior", "Isolated", "invert", 0,
        "type", "Split", "pattern", "Regex", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        "behavior", "Isolated", "invert", 0,
        "type", "Split", "pattern", "Regex",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
        "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
        "behavior", "Isolated", "invert", 0,
        "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0);
    if (vocab == NULL || merges == NULL || added == NULL || pre == NULL) {
        json_decref(vocab);
        json_decref(merges);
        json_decref(added);
        json_decref(pre);
        goto out;
    }
    root = json_pack(
        "{ss sn sn so s{ss s[]} so s{sssbsbsb} s{sssbsbsb}"
        " s{ss sn sn sn sn sb sb so so}}",
        "version", "1.0", "truncation", "padding", "added_tokens", added,
        "normalizer", "type", "Sequence", "normalizers", "pre_tokenizer", pre,
        "post_processor", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 0,
        "use_regex", 1,
        "decoder", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1,
        "model", "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix",
        "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0, "vocab", vocab, "merges", merges);
out:
    for (int i = 0; i < v.n; i++)
        free(v.str[i]);
    free(v.str);
    free(v.merge);
    return root;
}

static json_t *
mk_tokenizer_config(void)
{
    json_t *tok[3];

    for (int i = 0; i < 3; i++)
        tok[i] = json_pack("{sssssbsbsbsb}", "__type", "AddedToken", "content",
                           mk_added[i < 2 ? i : 1].content, "lstrip", 0, "normalized", 1,
                           "rstrip", 0, "single_word", 0);
    return json_pack("{sbsbsosbsosbsisos{}snss}", "add_bos_token", 0, "add_eos_token", 0,
                     "bos_token", tok[0], "clean_up_tokenization_spaces", 0, "eos_token", tok[1],
                     "legacy", 1, "model_max_length", 1048576, "pad_token", tok[2],
                     "sp_model_kwargs", "unk_token", "tokenizer_class",
                     "PreTrainedTokenizerFast");
}

/* ---- config.json ------------------------------------------------------------------ */

static json_t *
mk_int_array(const int *v, int n)
{
    json_t *a = json_array();

    for (int i = 0; a != NULL && i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* The text config's fields of the model's shape (attention, compression,
 * indexer, experts, routing), in the release's order. */
static json_t *
mk_text_shape(const mk_preset_t *p, uint32_t vocab)
{
    json_error_t jerr;
    json_t *text = json_pack_ex(&jerr, 0,
        "{ss si si si si si si si si sf sf"
        " s{sssisisisi} si sb sf si so so so si si si si si si si si"
        " si si si si si ss sf sb sf ss sf si si sf"
        " so si}",
        "model_type", "deepseek_v41_text",
        "vocab_size", (int)vocab,
        "hidden_size", p->hidden,
        "num_hidden_layers", p->layers,
        "num_attention_heads", p->heads,
        "num_key_value_heads", 1,
        "head_dim", p->head_dim,
        "q_lora_rank", p->q_lora,
        "qk_rope_head_dim", p->rope_dim,
        "rope_theta", 10000.0,
        "compress_rope_theta", 160000.0,
        "rope_scaling", "rope_type", "yarn", "factor", p->yarn_factor, "beta_fast", 32,
        "beta_slow", 1, "original_max_position_embeddings", p->yarn_orig,
        "max_position_embeddings", p->max_pos,
        "attention_bias", 0,
        "attention_dropout", 0.0,
        "sliding_window", p->window,
        "compress_ratios", mk_int_array(p->ratios, p->layers),
        "kv_source_layer_ids", mk_int_array(p->kv, p->nkv),
        "index_source_layer_ids", mk_int_array(p->index, p->nindex),
        "candidate_source_layer_id", p->candidate,
        "candidate_topk_blocks", p->cand_topk,
        "candidate_block_size", p->cand_block,
        "index_n_heads", p->index_heads,
        "index_head_dim", p->index_head_dim,
        "index_topk", p->index_topk,
        "o_groups", p->o_groups,
        "o_lora_rank", p->o_lora,
        "moe_intermediate_size", p->moe_inter,
        "n_routed_experts", p->experts,
        "n_shared_experts", 1,
        "num_experts_per_tok", p->topk,
        "hc_mult", 4,
        "scoring_func", "sqrtsoftplus",
        "gate_temp", 1.0,
        "norm_topk_prob", 1,
        "routed_scaling_factor", 1.5,
        "topk_method", "noaux_tc",
        "swiglu_limit", 10.0,
        "hc_sinkhorn_iters", 20,
        "num_nextn_predict_layers", 0,
        "hc_eps", 1e-6,
        "engram_layer_ids", mk_int_array(p->engram, p->nengram),
        "engram_vocab_size", p->engram_vocab);

    if (text == NULL)
        fprintf(stderr, "mk-tiny-model: config: %s\n", jerr.text);
    return text;
}

/* The text config: its shape, then the engram's sizes and the token ids.
 * engram_rows: NULL for the first pass (before the bucket sizes are known). */
static json_t *
mk_text_config(const mk_preset_t *p, uint32_t vocab, int64_t bos, int64_t eos,
               uint32_t compressed_vocab, const uint64_t *engram_rows)
{
    json_t *text, *rows = json_array();

    for (int k = 0; rows != NULL && engram_rows != NULL && k < p->nengram; k++)
        json_array_append_new(rows, json_integer((json_int_t)engram_rows[k]));
    text = mk_text_shape(p, vocab);
    if (text == NULL || rows == NULL) {
        json_decref(rows);
        json_decref(text);
        return NULL;
    }
    /* json_object_set_new takes rows, also when it fails */
    if (json_object_set_new(text, "engram_num_embeddings", rows) ||
        json_object_set_new(text, "engram_max_ngram_size", json_integer(p->engram_ngram)) ||
        json_object_set_new(text, "engram_n_heads", json_integer(p->engram_heads)) ||
        json_object_set_new(text, "engram_head_dim", json_integer(p->engram_dim)) ||
        json_object_set_new(text, "engram_pad_id", json_integer(2)) ||
        json_object_set_new(text, "engram_compressed_vocab_size", json_integer(compressed_vocab)) ||
        json_object_set_new(text, "dspark_noise_token_id", json_integer(vocab - 1)) ||
        json_object_set_new(text, "hidden_act", json_string("silu")) ||
        json_object_set_new(text, "initializer_range", json_real(0.02)) ||
        json_object_set_new(text, "rms_norm_eps", json_real(1e-20)) ||
        json_object_set_new(text, "use_cache", json_true()) ||
        json_object_set_new(text, "tie_word_embeddings", json_false()) ||
        json_object_set_new(text, "bos_token_id", json_integer(bos)) ||
        json_object_set_new(text, "eos_token_id", json_integer(eos)))
        goto err_text;
    if (engram_rows == NULL)   /* first pass: the bucket sizes are computed from it */
        json_object_del(text, "engram_num_embeddings");
    return text;

err_text:
    json_decref(text);
    return NULL;
}

/* The composite config of the release's shape: the text config, the dtype
 * and the quantization. engram_rows: as for mk_text_config. */
static json_t *
mk_config_json(const mk_opts_t *o, uint32_t vocab, int64_t bos, int64_t eos,
               uint32_t compressed_vocab, const uint64_t *engram_rows)
{
    json_t *text, *root;

    text = mk_text_config(o->preset, vocab, bos, eos, compressed_vocab, engram_rows);
    if (text == NULL)
        return NULL;
    root = json_pack("{s[s]ssso sbss}", "architectures", "DeepseekV41ForCausalLM",
                     "model_type", "deepseek_v41", "text_config", text,
                     "tie_word_embeddings", 0,
                     "torch_dtype", o->dtype == TD_DT_F32 ? "float32" : "bfloat16");
    if (root == NULL)
        return NULL;
    if (o->quant != MK_QUANT_NONE) {
        json_t *q = json_pack("{sss[ii]ssss}", "quant_method", "fp8", "weight_block_size", 32, 32,
                              "scale_fmt", "ue8m0", "expert_dtype",
                              o->quant == MK_QUANT_FP8_FP4 ? "fp4" : "fp8");
        if (q == NULL || json_object_set_new(root, "quantization_config", q) != 0) {
            json_decref(root);
            return NULL;
        }
    }
    return root;
}

/* ---- Tensors ------------------------------------------------------------------------ */

/* The initial value pattern of a tensor, after the reference's _init_weights:
 * linears and embeddings N(0, initializer_range), norms and scales ones,
 * sinks, biases and hc bases zeros. */
typedef enum { MK_NORMAL, MK_ONES, MK_ZEROS } mk_init_t;

static bool
ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static mk_init_t
mk_init_of(const char *name)
{
    if (ends_with(name, "norm.weight") || ends_with(name, "_scale") ||
        ends_with(name, "engram.embed.scale") || ends_with(name, "engram.q_weight") ||
        ends_with(name, "engram.k_weight"))
        return MK_ONES;
    if (ends_with(name, "attn_sink") || ends_with(name, "gate.bias") ||
        ends_with(name, "gate.bias_vl") || ends_with(name, "_base"))
        return MK_ZEROS;
    return MK_NORMAL;
}

/* Values of one tensor (n floats). --init perturbed moves the constant ones
 * off their constants (ones by N(0, 0.1), zeros by N(0, 0.1); sinks by N(0, 1))
 * so that a forward pass that ignores them gives other results. */
static void
mk_fill(const mk_opts_t *o, const char *name, float *x, size_t n)
{
    td_rng_t s = mk_stream(o->seed, name);
    mk_init_t init = mk_init_of(name);
    double std = 0.02;

    if (init != MK_NORMAL && o->perturbed && !ends_with(name, "engram.embed.scale"))
        std = ends_with(name, "attn_sink") ? 1.0 : 0.1;
    else if (init != MK_NORMAL)
        std = 0.0;
    for (size_t i = 0; i < n; i++) {
        double base = init == MK_ONES ? 1.0 : 0.0;
        x[i] = (float)(base + (std > 0 ? std * mk_normal(&s) : 0.0));
    }
}

static int
mk_add(td_st_writer_t *w, const char *name, td_dtype_t dt, int ndim, const int64_t *shape,
       const void *data, size_t nbytes)
{
    /* a failure is logged by the writer, naming the tensor */
    return td_st_writer_add(w, name, dt, ndim, shape, data, nbytes) == TD_OK ? 0 : -1;
}

/* Generate, quantize and add one schema tensor (with its scale). */
static int
mk_tensor(const mk_opts_t *o, td_st_writer_t *w, const td_weights_entry_t *e)
{
    const int64_t rows = e->shape[0], cols = e->ndim > 1 ? e->shape[1] : 1;
    const size_t n = (size_t)rows * (size_t)cols;
    float *x = malloc(n * sizeof(float));
    uint8_t *q = NULL, *sc = NULL;
    int rc = -1;
    td_status_t st = TD_OK;

    if (x == NULL)
        goto nomem;
    mk_fill(o, e->name, x, n);
    switch (e->format) {
    case TD_WEIGHTS_FLOAT:
    case TD_WEIGHTS_F32: {
        td_dtype_t dt = e->format == TD_WEIGHTS_F32 ? TD_DT_F32 : o->dtype;
        size_t bytes = n * (td_dtype_bits(dt) / 8);
        q = malloc(bytes);
        if (q == NULL)
            goto nomem;
        if ((st = td_quant_from_f32(x, n, dt, q)) != TD_OK)
            break;
        rc = mk_add(w, e->name, dt, e->ndim, e->shape, q, bytes);
        goto out;
    }
    case TD_WEIGHTS_FP8_BLOCK:
        q = malloc(n);
        sc = malloc((size_t)(e->scale_shape[0] * e->scale_shape[1]));
        if (q == NULL || sc == NULL)
            goto nomem;
        st = td_quant_fp8_block(x, rows, cols, 32, 32, q, sc);
        if (st == TD_OK && (rc = mk_add(w, e->name, TD_DT_F8_E4M3, 2, e->shape, q, n)) == 0)
            rc = mk_add(w, e->scale_name, TD_DT_E8M0, 2, e->scale_shape, sc,
                        (size_t)(e->scale_shape[0] * e->scale_shape[1]));
        break;
    case TD_WEIGHTS_FP8_ROWS:
        q = malloc(n);
        sc = malloc((size_t)(e->scale_shape[0] * e->scale_shape[1]));
        if (q == NULL || sc == NULL)
            goto nomem;
        st = td_quant_fp8_rows(x, rows, cols, 32, q, sc);
        if (st == TD_OK && (rc = mk_add(w, e->name, TD_DT_F8_E4M3, 2, e->shape, q, n)) == 0)
            rc = mk_add(w, e->scale_name, TD_DT_E8M0, 2, e->scale_shape, sc,
                        (size_t)(e->scale_shape[0] * e->scale_shape[1]));
        break;
    case TD_WEIGHTS_FP4_GROUP: {
        const int64_t packed[2] = { rows, cols / 2 };
        q = malloc(n / 2);
        sc = malloc((size_t)(e->scale_shape[0] * e->scale_shape[1]));
        if (q == NULL || sc == NULL)
            goto nomem;
        st = td_quant_fp4_group(x, rows, cols, q, sc);
        if (st == TD_OK && (rc = mk_add(w, e->name, TD_DT_I8, 2, packed, q, n / 2)) == 0)
            rc = mk_add(w, e->scale_name, TD_DT_E8M0, 2, e->scale_shape, sc,
                        (size_t)(e->scale_shape[0] * e->scale_shape[1]));
        break;
    }
    }
    goto out;   /* a quantizer that failed logged why */
nomem:
    fprintf(stderr, "mk-tiny-model: tensor %s: out of memory\n", e->name);
out:
    free(x);
    free(q);
    free(sc);
    return rc;
}

/* ---- main ----------------------------------------------------------------------------- */

/* The number of token classes the engram hashes see (text/tokmap). */
static int
mk_compressed_vocab(const td_tokenizer_t *tok, uint32_t *out)
{
    uint32_t *map = NULL, n = 0;
    td_status_t st = td_tokmap_build(tok, &map, &n);

    if (st != TD_OK)
        return -1;   /* tokmap logged why */
    free(map);
    *out = n;
    return 0;
}

int
main(int argc, char **argv)
{
    mk_opts_t o;
    char path[4096], err[1024];
    td_tokenizer_t *tok = NULL;
    td_modelcfg_t *cfg = NULL;
    td_weights_schema_t *schema = NULL;
    td_st_writer_t *w = NULL;
    td_st_t *st = NULL;
    td_weights_t *bound = NULL;
    json_t *j = NULL;
    char *text = NULL;
    size_t len;
    uint32_t vocab, compressed = 0, id;
    int64_t bos = 0, eos = 1;
    uint64_t rows[MK_MAX_LAYERS];
    int rc;

    if ((rc = mk_parse_args(argc, argv, &o)) != 0)
        return rc;
    td_log_set_ident("mk-tiny-model");
    td_log_set_level(TD_LOG_WARN);
    if (mkdir(o.outdir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "mk-tiny-model: %s: %s\n", o.outdir, strerror(errno));
        return 1;
    }
    rc = 1;

    if (mk_clean(o.outdir) != 0)
        goto out;

    /* tokenizer: the given one (with its tokenizer_config.json when it has
     * one), or a generated one */
    if (o.tokenizer != NULL) {
        struct stat sb;
        char src[4096], *slash;
        bool have_config;
        if (stat(o.tokenizer, &sb) == 0 && S_ISDIR(sb.st_mode))
            snprintf(src, sizeof(src), "%s/tokenizer.json", o.tokenizer);
        else
            snprintf(src, sizeof(src), "%s", o.tokenizer);
        if ((text = mk_read_file(src, &len)) == NULL ||
            mk_write_file(o.outdir, "tokenizer.json", text, len) != 0)
            goto out;
        free(text);
        text = NULL;
        slash = strrchr(src, '/');
        if (slash != NULL)
            snprintf(slash + 1, sizeof(src) - (size_t)(slash + 1 - src), "tokenizer_config.json");
        else
            snprintf(src, sizeof(src), "tokenizer_config.json");
        have_config = stat(src, &sb) == 0 && S_ISREG(sb.st_mode);
        if (have_config && ((text = mk_read_file(src, &len)) == NULL ||
                            mk_write_file(o.outdir, "tokenizer_config.json", text, len) != 0))
            goto out;
        free(text);
        text = NULL;
        if (!have_config) {
            j = mk_tokenizer_config();
            if (j == NULL || mk_write_json(o.outdir, "tokenizer_config.json", j) != 0)
                goto out;
            json_decref(j);
            j = NULL;
        }
    } else {
        j = mk_tokenizer_json();
        if (j == NULL || mk_write_json(o.outdir, "tokenizer.json", j) != 0) {
            fprintf(stderr, "mk-tiny-model: cannot build the tokenizer\n");
            goto out;
        }
        json_decref(j);
        j = mk_tokenizer_config();
        if (j == NULL || mk_write_json(o.outdir, "tokenizer_config.json", j) != 0)
            goto out;
        json_decref(j);
        j = NULL;
    }
    snprintf(path, sizeof(path), "%s/tokenizer.json", o.outdir);
    if (td_tokenizer_load(path, &tok) != TD_OK)   /* logs why, with the path */
        goto out;
    vocab = td_tokenizer_vocab_size(tok);
    if (td_tokenizer_find(tok, mk_added[0].content, strlen(mk_added[0].content), &id) == TD_OK)
        bos = id;
    if (td_tokenizer_find(tok, mk_added[1].content, strlen(mk_added[1].content), &id) == TD_OK)
        eos = id;
    if (mk_compressed_vocab(tok, &compressed) != 0)
        goto out;

    /* config: a first pass gives the engram bucket sizes, the second is written */
    j = mk_config_json(&o, vocab, bos, eos, compressed, NULL);
    text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (text == NULL || td_modelcfg_parse(text, strlen(text), &cfg, err, sizeof(err)) != TD_OK) {
        fprintf(stderr, "mk-tiny-model: config: %s\n", text && err[0] ? err : "out of memory");
        goto out;
    }
    for (uint32_t k = 0; k < cfg->engram_layer_ids.n; k++)
        if (td_modelcfg_engram_primes(cfg, k, NULL, &rows[k]) != TD_OK) {
            fprintf(stderr, "mk-tiny-model: config: engram layer %u has no bucket layout\n", k);
            goto out;
        }
    json_decref(j);
    free(text);
    text = NULL;
    td_modelcfg_destroy(cfg);
    cfg = NULL;
    j = mk_config_json(&o, vocab, bos, eos, compressed, rows);
    if (j == NULL || mk_write_json(o.outdir, "config.json", j) != 0)
        goto out;
    if (td_modelcfg_load(o.outdir, &cfg) != TD_OK || td_weights_schema_create(cfg, &schema) != TD_OK)
        goto out;

    /* tensors */
    if (o.shard_mb > 0) {
        if (td_st_writer_create_sharded(o.outdir, (size_t)o.shard_mb << 20, &w) != TD_OK)
            goto out;   /* logged by the writer */
    } else {
        snprintf(path, sizeof(path), "%s/model.safetensors", o.outdir);
        if (td_st_writer_create(path, &w) != TD_OK)
            goto out;   /* logged by the writer */
    }
    for (size_t i = 0; i < schema->n; i++)
        if (mk_tensor(&o, w, &schema->entries[i]) != 0)
            goto out;
    if (td_st_writer_finish(w, "{\"format\": \"pt\"}") != TD_OK) {
        w = NULL;
        goto out;   /* logged by the writer */
    }
    w = NULL;

    /* what was written binds to the schema */
    if (td_st_open(o.outdir, &st) != TD_OK)
        goto out;   /* logged by the reader */
    if (td_weights_bind(schema, st, NULL, NULL, &bound) != TD_OK)
        goto out;
    printf("mk-tiny-model: %s: preset %s, vocab %u, %zu tensors, %zu schema entries, %" PRIu64
           " bytes\n", o.outdir, o.preset->name, vocab, td_st_count(st), schema->n, bound->bytes);
    rc = 0;
    goto out;

out:
    td_weights_destroy(bound);
    td_st_close(st);
    td_st_writer_destroy(w);
    td_weights_schema_destroy(schema);
    td_modelcfg_destroy(cfg);
    td_tokenizer_destroy(tok);
    json_decref(j);
    free(text);
    return rc;
}
