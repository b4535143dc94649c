/* tests/tokenizer/test_tokenizer_unit.c — the tokenizer's edges: malformed
 * and unsupported tokenizer.json files (status and message), a small
 * tokenizer built here, streaming decode, flags, and encoding from several
 * threads at once. */
#include "tokenizer.h"

#include "check.h"
#include "log.h"
#include "tokref.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- Log capture ---------------------------------------------------------- */

static char last_log[1024];

static void
log_sink(td_log_level_t level, const char *line, void *arg)
{
    (void)level;
    (void)arg;
    snprintf(last_log, sizeof last_log, "%s", line);
}

static char tmpdir[] = "/tmp/td-toktest-XXXXXX";

static const char *
write_file(const char *name, const char *data, size_t len)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
    return path;
}

/* ---- A small tokenizer ------------------------------------------------------ */

/* The 256 byte-level symbols (as "\u0100" escapes where needed), plus a few
 * merged tokens; the arguments: extra vocab entries, merges, added tokens,
 * pre_tokenizer, and members that end the top level (later members replace
 * earlier ones of the same name). */
static char *
small_json(const char *vocab_extra, const char *merges, const char *added, const char *pre,
           const char *rest)
{
    size_t cap = 65536;
    char *s = malloc(cap);
    size_t n = 0;
    n += (size_t)snprintf(s + n, cap - n, "{\"version\": \"1.0\", \"added_tokens\": [%s], "
                          "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": []}, "
                          "\"pre_tokenizer\": %s, \"decoder\": {\"type\": \"ByteLevel\"}, "
                          "\"model\": {\"type\": \"BPE\", \"vocab\": {",
                          added, pre);
    unsigned k = 0;
    for (unsigned b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        unsigned cp = printable ? b : 0x100 + k++;
        if (cp == '"' || cp == '\\')
            n += (size_t)snprintf(s + n, cap - n, "\"\\%c\": %u, ", (char)cp, b);
        else
            n += (size_t)snprintf(s + n, cap - n, "\"\\u%04x\": %u, ", cp, b);
    }
    n += (size_t)snprintf(s + n, cap - n, "%s}, \"merges\": [%s]}%s}", vocab_extra, merges, rest);
    return s;
}

#define SMALL_PRE                                                                       \
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "  \
    "{\"Regex\": \" ?\\\\p{L}+|\\\\s+\"}, \"behavior\": \"Isolated\", \"invert\": false}, " \
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}"
#define SMALL_VOCAB "\"ab\": 256, \"abc\": 257, \"\\u0120a\": 258, \"\\u0120ab\": 259"
#define SMALL_MERGES "\"a b\", \"ab c\", \"\\u0120 a\", \"\\u0120a b\""
#define SMALL_ADDED                                                                     \
    "{\"id\": 300, \"content\": \"<s>\", \"special\": true, \"lstrip\": false, "       \
    "\"rstrip\": false, \"normalized\": false, \"single_word\": false}, "               \
    "{\"id\": 301, \"content\": \"<x>\", \"special\": false, \"lstrip\": false, "      \
    "\"rstrip\": false, \"normalized\": true, \"single_word\": false}"

static uint32_t
find(const td_tokenizer_t *tok, const char *s)
{
    uint32_t id = UINT32_MAX;
    CHECK_STATUS(td_tokenizer_find(tok, s, strlen(s), &id), TD_OK);
    return id;
}

static void
test_small(void)
{
    char *json = small_json(SMALL_VOCAB, SMALL_MERGES, SMALL_ADDED, SMALL_PRE, "");
    const char *path = write_file("small.json", json, strlen(json));
    td_tokenizer_t *tok = NULL;
    CHECK_STATUS(td_tokenizer_load(path, &tok), TD_OK);
    free(json);
    if (!tok)
        return;
    CHECK_EQ_INT(td_tokenizer_vocab_size(tok), 302);
    CHECK_EQ_INT(td_tokenizer_is_special(tok, 300), 1);
    CHECK_EQ_INT(td_tokenizer_is_special(tok, 301), 0);
    CHECK_EQ_INT(td_tokenizer_is_special(tok, 299), 0);
    const char *p;
    size_t len;
    CHECK_STATUS(td_tokenizer_piece(tok, 299, &p, &len), TD_ERR_RANGE);  /* a hole */
    CHECK_STATUS(td_tokenizer_piece(tok, 259, &p, &len), TD_OK);
    CHECK(len == 3 && memcmp(p, " ab", 3) == 0);
    CHECK_STATUS(td_tokenizer_token(tok, 259, &p, &len), TD_OK);
    CHECK(len == 4 && memcmp(p, "\xc4\xa0" "ab", 4) == 0);   /* "Ġab" */

    /* merges by rank: "abc" -> [abc]; " ab" -> [Ġ][ab] ("a b" ranks before
     * "Ġ a", and there is no "Ġ ab"); " a" -> [Ġa] */
    uint32_t *ids;
    size_t n;
    CHECK_STATUS(td_tokenizer_encode(tok, "abc ab a", 8, TD_TOKENIZER_SPECIAL, &ids, &n), TD_OK);
    CHECK(n == 4 && ids[0] == find(tok, "abc") && ids[1] == find(tok, "\xc4\xa0") &&
          ids[2] == find(tok, "ab") && ids[3] == find(tok, "\xc4\xa0" "a"));
    free(ids);
    /* special <s> only with TD_TOKENIZER_SPECIAL; <x> (not special) always,
     * unless TD_TOKENIZER_NO_ADDED */
    CHECK_STATUS(td_tokenizer_encode(tok, "<s><x>", 6, TD_TOKENIZER_SPECIAL, &ids, &n), TD_OK);
    CHECK(n == 2 && ids[0] == 300 && ids[1] == 301);
    free(ids);
    CHECK_STATUS(td_tokenizer_encode(tok, "<s><x>", 6, 0, &ids, &n), TD_OK);
    CHECK(n == 4 && ids[3] == 301 && ids[0] == find(tok, "<"));
    free(ids);
    CHECK_STATUS(td_tokenizer_encode(tok, "<s><x>", 6, TD_TOKENIZER_NO_ADDED, &ids, &n), TD_OK);
    CHECK(n == 6);
    free(ids);
    /* empty text: no ids, but an array */
    ids = NULL;
    CHECK_STATUS(td_tokenizer_encode(tok, "", 0, TD_TOKENIZER_SPECIAL, &ids, &n), TD_OK);
    CHECK(ids != NULL && n == 0);
    free(ids);
    /* NUL and invalid bytes: decode(encode(x)) is x with U+FFFD */
    static const char odd[] = "a\0b\xff\xe6\x97";
    CHECK_STATUS(td_tokenizer_encode(tok, odd, sizeof odd - 1, TD_TOKENIZER_SPECIAL, &ids, &n),
                 TD_OK);
    char *text;
    CHECK_STATUS(td_tokenizer_decode(tok, ids, n, 0, &text, &len), TD_OK);
    CHECK(len == 9 && memcmp(text, "a\0b\xef\xbf\xbd\xef\xbf\xbd", 9) == 0);
    free(text);
    free(ids);
    /* decode: skip specials; an id with no token */
    uint32_t some[] = { 300, 256, 301 };
    CHECK_STATUS(td_tokenizer_decode(tok, some, 3, TD_TOKENIZER_SKIP_SPECIAL, &text, &len), TD_OK);
    CHECK_STR(text, "ab<x>");
    free(text);
    uint32_t bad[] = { 256, 299 };
    CHECK_STATUS(td_tokenizer_decode(tok, bad, 2, 0, &text, &len), TD_ERR_RANGE);
    td_tokenizer_destroy(tok);

    /* the same file through its directory */
    write_file("tokenizer.json", "{}", 2);
    last_log[0] = '\0';
    CHECK_STATUS(td_tokenizer_load(tmpdir, &tok), TD_ERR_UNSUPPORTED);
    CHECK(strstr(last_log, "/tokenizer.json: decoder: missing") != NULL);
}

/* ---- Malformed and unsupported files -------------------------------------- */

typedef struct {
    const char *name;
    const char *vocab, *merges, *added, *pre, *rest;
    td_status_t want;
    const char *msg;     /* the message names this */
} bad_case_t;

#define SPLIT(pat, behavior)                                                          \
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": " \
    "{\"Regex\": \"" pat "\"}, \"behavior\": \"" behavior "\", \"invert\": false}, "  \
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}"

static const bad_case_t bad_cases[] = {
    { "merge of an unknown token", SMALL_VOCAB, "\"a zz\"", "", SMALL_PRE, "",
      TD_ERR_INVALID, "model.merges[0]: right token \"zz\" is not in model.vocab" },
    { "merge of an unknown left token", SMALL_VOCAB, "\"a b\", \"qq b\"", "", SMALL_PRE, "",
      TD_ERR_INVALID, "model.merges[1]: left token \"qq\"" },
    { "merge result not in vocab", SMALL_VOCAB, "\"b a\"", "", SMALL_PRE, "",
      TD_ERR_INVALID, "merged token \"ba\"" },
    { "merge without a space", SMALL_VOCAB, "\"ab\"", "", SMALL_PRE, "",
      TD_ERR_INVALID, "model.merges[0]: \"ab\" is not two tokens" },
    { "merge a number", SMALL_VOCAB, "7", "", SMALL_PRE, "",
      TD_ERR_INVALID, "model.merges[0]: want \"a b\"" },
    { "unknown pre-tokenizer", SMALL_VOCAB, SMALL_MERGES, "", "{\"type\": \"Whitespace\"}", "",
      TD_ERR_UNSUPPORTED, "pre_tokenizer.type: \"Whitespace\" is not supported" },
    { "unknown pre-tokenizer in a sequence", SMALL_VOCAB, SMALL_MERGES, "",
      "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}]}", "",
      TD_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[0].type: \"Digits\"" },
    { "pre-tokenizer of the wrong type", SMALL_VOCAB, SMALL_MERGES, "", "[1, 2]", "",
      TD_ERR_INVALID, "pre_tokenizer: want an object, found an array" },
    { "Split behavior", SMALL_VOCAB, SMALL_MERGES, "", SPLIT("a", "Removed"), "",
      TD_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[0].behavior: \"Removed\"" },
    { "bad regex", SMALL_VOCAB, SMALL_MERGES, "", SPLIT("(a", "Isolated"), "",
      TD_ERR_UNSUPPORTED, "PCRE2 cannot compile" },
    { "\\w in a regex", SMALL_VOCAB, SMALL_MERGES, "", SPLIT("\\\\w+", "Isolated"), "",
      TD_ERR_UNSUPPORTED, "the escape \\w" },
    { "negated category in a class", SMALL_VOCAB, SMALL_MERGES, "", SPLIT("[a\\\\P{L}]", "Isolated"),
      "", TD_ERR_UNSUPPORTED, "the escape \\P" },
    { "no ByteLevel", SMALL_VOCAB, SMALL_MERGES, "",
      "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Isolated\"}", "",
      TD_ERR_UNSUPPORTED, "no ByteLevel step" },
    { "a step after ByteLevel", SMALL_VOCAB, SMALL_MERGES, "",
      "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, {\"type\": \"Split\", "
      "\"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Isolated\"}]}", "",
      TD_ERR_UNSUPPORTED, "after ByteLevel" },
    { "normalizer", SMALL_VOCAB, SMALL_MERGES, "", SMALL_PRE,
      ", \"normalizer\": {\"type\": \"NFC\"}", TD_ERR_UNSUPPORTED, "normalizer.type: \"NFC\"" },
    { "decoder", SMALL_VOCAB, SMALL_MERGES, "", SMALL_PRE,
      ", \"decoder\": {\"type\": \"WordPiece\"}", TD_ERR_UNSUPPORTED, "decoder.type: \"WordPiece\"" },
    { "post-processor", SMALL_VOCAB, SMALL_MERGES, "", SMALL_PRE,
      ", \"post_processor\": {\"type\": \"TemplateProcessing\"}", TD_ERR_UNSUPPORTED,
      "post_processor.type: \"TemplateProcessing\"" },
    { "truncation", SMALL_VOCAB, SMALL_MERGES, "", SMALL_PRE,
      ", \"truncation\": {\"max_length\": 5}", TD_ERR_UNSUPPORTED, "truncation" },
    { "added tokens not a list", SMALL_VOCAB, SMALL_MERGES, "", SMALL_PRE,
      ", \"added_tokens\": 5", TD_ERR_INVALID, "added_tokens: want an array" },
    { "added token empty", SMALL_VOCAB, SMALL_MERGES, "{\"id\": 5, \"content\": \"\"}", SMALL_PRE,
      "", TD_ERR_INVALID, "added_tokens[0].content: missing or empty" },
    { "added token flag type", SMALL_VOCAB, SMALL_MERGES,
      "{\"id\": 5, \"content\": \"<a>\", \"special\": \"yes\"}", SMALL_PRE, "",
      TD_ERR_INVALID, "added_tokens[0].special: want a boolean, found a string" },
    { "added token single_word", SMALL_VOCAB, SMALL_MERGES,
      "{\"id\": 5, \"content\": \"<a>\", \"single_word\": true}", SMALL_PRE, "",
      TD_ERR_UNSUPPORTED, "added_tokens[0].single_word" },
    { "added token id", SMALL_VOCAB, SMALL_MERGES, "{\"id\": -1, \"content\": \"<a>\"}",
      SMALL_PRE, "", TD_ERR_INVALID, "added_tokens[0].id" },
    { "vocab id type", "\"zz\": \"x\"", SMALL_MERGES, "", SMALL_PRE, "",
      TD_ERR_INVALID, "model.vocab[\"zz\"]: want an id" },
    { "vocab id too large", "\"zz\": 99999999999", SMALL_MERGES, "", SMALL_PRE, "",
      TD_ERR_INVALID, "model.vocab[\"zz\"]" },
    { "vocab id twice", "\"zz\": 7", SMALL_MERGES, "", SMALL_PRE, "",
      TD_ERR_INVALID, "id 7 given to two tokens" },
};

static void
test_bad_files(const char *real)
{
    td_tokenizer_t *tok = (td_tokenizer_t *)&tok;   /* must stay untouched */
    td_tokenizer_t *const sentinel = tok;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case_t *c = &bad_cases[i];
        char *json = small_json(c->vocab, c->merges, c->added, c->pre, c->rest);
        const char *path = write_file("bad.json", json, strlen(json));
        last_log[0] = '\0';
        td_status_t rc = td_tokenizer_load(path, &tok);
        if (rc != c->want || !strstr(last_log, c->msg) || tok != sentinel) {
            fprintf(stderr, "bad file \"%s\": got %s, want %s; message \"%s\" should name "
                            "\"%s\"\n", c->name, td_status_str(rc), td_status_str(c->want),
                    last_log, c->msg);
            td_check_failures++;
        }
        if (rc == TD_OK && tok != sentinel)
            td_tokenizer_destroy(tok);
        tok = sentinel;
        free(json);
    }

    /* wrong types at the top */
    static const struct {
        const char *json, *msg;
    } shapes[] = {
        { "[]", "want a JSON object, found an array" },
        { "{\"model\": 3, \"decoder\": {\"type\": \"ByteLevel\"}}", "model: want an object" },
        { "{\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"WordPiece\"}}",
          "model.type: \"WordPiece\"" },
        { "{\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", "
          "\"vocab\": []}}", "model.vocab: want an object, found an array" },
        { "{\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", "
          "\"vocab\": {\"a\": 0}, \"merges\": {}}}", "model.merges: want an array" },
        { "{\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", "
          "\"unk_token\": \"<unk>\", \"vocab\": {\"a\": 0}}}", "model.unk_token" },
        { "{\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", "
          "\"byte_fallback\": true, \"vocab\": {\"a\": 0}}}", "model.byte_fallback" },
        { "{\"model\": {\"type\": \"BPE\"}}", "decoder: missing" },
        { "{\"truncated\": ", "not valid JSON" },
        { "", "not valid JSON" },
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const char *path = write_file("bad.json", shapes[i].json, strlen(shapes[i].json));
        last_log[0] = '\0';
        td_status_t rc = td_tokenizer_load(path, &tok);
        if (rc == TD_OK || !strstr(last_log, shapes[i].msg) || tok != sentinel) {
            fprintf(stderr, "bad file %s: got %s; message \"%s\" should name \"%s\"\n",
                    shapes[i].json, td_status_str(rc), last_log, shapes[i].msg);
            td_check_failures++;
        }
    }

    /* the real file cut short, at a few lengths */
    FILE *f = fopen(real, "rb");
    char *data = NULL;
    long size = 0;
    if (f && fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (data = malloc((size_t)size)) && fread(data, 1, (size_t)size, f) == (size_t)size) {
        long cuts[] = { 1, 100, 4096, size / 3, size / 2, size - 2 };
        for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
            const char *path = write_file("cut.json", data, (size_t)cuts[i]);
            last_log[0] = '\0';
            CHECK_STATUS(td_tokenizer_load(path, &tok), TD_ERR_INVALID);
            CHECK(strstr(last_log, "not valid JSON") != NULL);
        }
    } else {
        CHECK(!"cannot read the real tokenizer.json");
    }
    if (f)
        fclose(f);
    free(data);

    /* every prefix of a small valid file, and every byte changed: a status,
     * never a crash (ASan watches) */
    char *json = small_json(SMALL_VOCAB, SMALL_MERGES, SMALL_ADDED, SMALL_PRE, "");
    size_t len = strlen(json);
    td_log_set_level(TD_LOG_ERROR);
    for (size_t cut = 0; cut < len; cut += 7) {
        const char *path = write_file("cut.json", json, cut);
        CHECK(td_tokenizer_load(path, &tok) != TD_OK && tok == sentinel);
    }
    for (size_t i = 0; i < len; i += 3) {
        char saved = json[i];
        static const char subst[] = "\"{}[],:0a\\ ";
        json[i] = subst[i % (sizeof subst - 1)];
        const char *path = write_file("flip.json", json, len);
        if (td_tokenizer_load(path, &tok) == TD_OK) {
            uint32_t *ids;
            size_t n;
            CHECK_STATUS(td_tokenizer_encode(tok, "ab <s> x", 8, TD_TOKENIZER_SPECIAL, &ids, &n),
                         TD_OK);
            free(ids);
            td_tokenizer_destroy(tok);
            tok = sentinel;
        }
        json[i] = saved;
    }
    free(json);

    last_log[0] = '\0';
    CHECK_STATUS(td_tokenizer_load("/nonexistent/tokenizer.json", &tok), TD_ERR_NOT_FOUND);
    CHECK(strstr(last_log, "/nonexistent/tokenizer.json") != NULL);
}

/* ---- Streaming decode ----------------------------------------------------- */

static void
test_stream(const td_tokenizer_t *tok)
{
    /* the ids of single bytes */
    uint32_t byte_id[256];
    memset(byte_id, 0xff, sizeof byte_id);
    for (uint32_t id = 0; id < td_tokenizer_vocab_size(tok); id++) {
        const char *p;
        size_t len;
        if (td_tokenizer_piece(tok, id, &p, &len) == TD_OK && len == 1 &&
            !td_tokenizer_is_special(tok, id) && byte_id[(uint8_t)p[0]] == UINT32_MAX)
            byte_id[(uint8_t)p[0]] = id;
    }
    for (int b = 0; b < 256; b++)
        CHECK(byte_id[b] != UINT32_MAX);

    /* a 4-byte emoji one byte-token at a time: nothing until it is whole */
    static const uint8_t emoji[] = { 0xF0, 0x9F, 0x98, 0x80 };
    char out[64];
    size_t len;
    td_detok_t st = { 0 };
    for (int i = 0; i < 4; i++) {
        CHECK_STATUS(td_detok_feed(&st, tok, byte_id[emoji[i]], 0, out, sizeof out, &len), TD_OK);
        CHECK_EQ_INT(len, i < 3 ? 0 : 4);
    }
    CHECK(memcmp(out, emoji, 4) == 0);
    CHECK_EQ_INT(td_detok_flush(&st, out), 0);

    /* the real encoding of text with emoji, fed id by id: whole characters
     * only, and all of them */
    static const char text[] = "ok 🙂👍🏽 👨‍👩‍👧‍👦 🇺🇦 done";
    uint32_t *ids;
    size_t n;
    CHECK_STATUS(td_tokenizer_encode(tok, text, sizeof text - 1, TD_TOKENIZER_SPECIAL, &ids, &n),
                 TD_OK);
    char acc[256];
    size_t acc_len = 0;
    td_detok_t st2 = { 0 };
    int held = 0;
    for (size_t i = 0; i < n; i++) {
        char chunk[TD_DETOK_OUT_MAX(64)];
        CHECK_STATUS(td_detok_feed(&st2, tok, ids[i], 0, chunk, sizeof chunk, &len), TD_OK);
        held += st2.n > 0;
        CHECK(acc_len + len <= sizeof acc);
        memcpy(acc + acc_len, chunk, len);
        acc_len += len;
        /* never a U+FFFD: nothing invalid was fed */
        CHECK(memmem(acc, acc_len, "\xef\xbf\xbd", 3) == NULL);
    }
    CHECK(held > 0);   /* some token ended inside a character */
    CHECK_EQ_INT(td_detok_flush(&st2, acc + acc_len), 0);
    CHECK(acc_len == sizeof text - 1 && memcmp(acc, text, acc_len) == 0);
    free(ids);

    /* an unfinished character at the end of the stream: U+FFFD */
    td_detok_t st3 = { 0 };
    CHECK_STATUS(td_detok_feed(&st3, tok, byte_id[0xF0], 0, out, sizeof out, &len), TD_OK);
    CHECK_EQ_INT(len, 0);
    CHECK_EQ_INT(td_detok_flush(&st3, out), 3);
    CHECK(memcmp(out, "\xef\xbf\xbd", 3) == 0);
    CHECK_EQ_INT(st3.n, 0);

    /* errors leave the state alone */
    td_detok_t st4 = { 0 };
    CHECK_STATUS(td_detok_feed(&st4, tok, byte_id[0xE6], 0, out, sizeof out, &len), TD_OK);
    td_detok_t before = st4;
    CHECK_STATUS(td_detok_feed(&st4, tok, td_tokenizer_vocab_size(tok), 0, out, sizeof out, &len),
                 TD_ERR_RANGE);
    CHECK_STATUS(td_detok_feed(&st4, tok, byte_id[0x97], 0, out, 5, &len), TD_ERR_TOO_BIG);
    CHECK(memcmp(&st4, &before, sizeof st4) == 0);

    /* special tokens: skipped with the flag, their text without */
    uint32_t bos = UINT32_MAX;
    for (uint32_t id = 0; id < td_tokenizer_vocab_size(tok) && bos == UINT32_MAX; id++)
        if (td_tokenizer_is_special(tok, id))
            bos = id;
    const char *piece;
    size_t plen;
    CHECK_STATUS(td_tokenizer_piece(tok, bos, &piece, &plen), TD_OK);
    char big[TD_DETOK_OUT_MAX(256)];
    td_detok_t st5 = { 0 };
    CHECK_STATUS(td_detok_feed(&st5, tok, bos, TD_TOKENIZER_SKIP_SPECIAL, big, sizeof big, &len),
                 TD_OK);
    CHECK_EQ_INT(len, 0);
    CHECK_STATUS(td_detok_feed(&st5, tok, bos, 0, big, sizeof big, &len), TD_OK);
    CHECK(len == plen && memcmp(big, piece, plen) == 0);
}

/* ---- Several threads on one tokenizer ---------------------------------- */

typedef struct {
    const td_tokenizer_t *tok;
    const char *text;
    size_t len;
    uint32_t *want;
    size_t nwant;
    int bad;
} thread_arg_t;

static void *
encode_loop(void *p)
{
    thread_arg_t *a = p;
    for (int i = 0; i < 200; i++) {
        uint32_t *ids;
        size_t n;
        if (td_tokenizer_encode(a->tok, a->text, a->len, TD_TOKENIZER_SPECIAL, &ids, &n) != TD_OK ||
            n != a->nwant || memcmp(ids, a->want, n * sizeof *ids) != 0)
            a->bad++;
        free(ids);
    }
    return NULL;
}

static void
test_threads(const td_tokenizer_t *tok)
{
    static const char *const texts[4] = {
        "The quick brown fox jumps over the lazy dog. 1234567 <think>",
        "日本語のテキストと中文的句子，混在しています。",
        "def f(x):\n    return x ** 2  # 🙂\n\n\n",
        "Привет, мир! ¿Qué tal? <｜User｜>hi<｜Assistant｜>",
    };
    thread_arg_t args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg_t){ .tok = tok, .text = texts[i], .len = strlen(texts[i]) };
        CHECK_STATUS(td_tokenizer_encode(tok, texts[i], args[i].len, TD_TOKENIZER_SPECIAL,
                                         &args[i].want, &args[i].nwant), TD_OK);
    }
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, encode_loop, &args[i]);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(args[i].bad, 0);
        free(args[i].want);
    }
}

int
main(void)
{
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    td_log_set_sink(log_sink, NULL);
    char *real = tokref_path();
    test_small();
    if (real) {
        test_bad_files(real);
        td_tokenizer_t *tok = NULL;
        td_log_set_level(TD_LOG_INFO);
        CHECK_STATUS(td_tokenizer_load(real, &tok), TD_OK);
        if (tok) {
            test_stream(tok);
            test_threads(tok);
            td_tokenizer_destroy(tok);
        }
    } else {
        CHECK(!"no reference tokenizer.json");
    }
    td_log_set_sink(NULL, NULL);
    free(real);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf -- '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", tmpdir);
    return td_check_exit("test_tokenizer_unit");
}
