/* tests/weights/test_safetensors.c — the reader's named error for each class of
 * bad checkpoint, writer round trips (one file, shards), a fuzz pass over
 * truncations and byte flips, and the quant module's layouts and shape errors
 * (its scalar codec, kernels/numfmt, is tests/unit/test_numfmt.c). Needs
 * nothing but the library. */
#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../unit/check.h"
#include "../unit/logcap.h"
#include "quant.h"
#include "rng.h"
#include "safetensors.h"
#include "tensor2d.h"

static char tmpdir[256];

static char *
P(const char *name)
{
    static char buf[8][512];
    static int k;

    k = (k + 1) % 8;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", tmpdir, name);
    return buf[k];
}

static void
put_bytes(const char *path, const void *data, size_t len)
{
    FILE *f;

    unlink(path);   /* a fresh file: ext4 flushes a truncated one on close */
    f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len)
        fprintf(stderr, "cannot write %s\n", path);
    if (f)
        fclose(f);
}

static void
put_text(const char *path, const char *text)
{
    put_bytes(path, text, strlen(text));
}

/* A safetensors file: given header length field, header text, data bytes. */
static void
put_st_raw(const char *path, uint64_t hlen_field, const char *hdr, size_t data_len)
{
    size_t hl = strlen(hdr);
    unsigned char *b = calloc(8 + hl + data_len + 1, 1);

    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(hlen_field >> (8 * i));
    memcpy(b + 8, hdr, hl);
    for (size_t i = 0; i < data_len; i++)
        b[8 + hl + i] = (unsigned char)(i * 7 + 1);
    put_bytes(path, b, 8 + hl + data_len);
    free(b);
}

static void
put_st(const char *path, const char *hdr, size_t data_len)
{
    put_st_raw(path, strlen(hdr), hdr, data_len);
}

static void
rm_tree(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *e;

    if (d == NULL) {
        unlink(path);
        return;
    }
    while ((e = readdir(d)) != NULL) {
        char sub[1024];

        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
        rm_tree(sub);
    }
    closedir(d);
    rmdir(path);
}

/* Opening `path` fails with `want`, the message holds `text`, logged once. */
static void
expect_fail(const char *path, td_status_t want, const char *text, int line)
{
    td_st_t *st = NULL;
    int before = td_logcap.errors;
    td_status_t rc = td_st_open(path, &st);

    if (rc != want || strstr(td_logcap.last, text) == NULL || td_logcap.errors != before + 1) {
        fprintf(stderr, "line %d: %s: got %s \"%s\" (%d error lines), want %s \"%s\"\n", line,
                path, td_status_str(rc), td_logcap.last, td_logcap.errors - before,
                td_status_str(want), text);
        td_check_failures++;
    }
    if (st != NULL) {
        td_check_failures++;
        td_st_close(st);
    }
}

#define EXPECT_FAIL(path, want, text) expect_fail(path, want, text, __LINE__)

#define U8(name, b, e, n) "\"" name "\":{\"dtype\":\"U8\",\"shape\":[" #n "],\"data_offsets\":[" #b "," #e "]}"

static void
test_error_classes(void)
{
    /* truncated file: the header is whole, the data is not */
    put_st(P("trunc.safetensors"),
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 10);
    EXPECT_FAIL(P("trunc.safetensors"), TD_ERR_INVALID,
                "trunc.safetensors: truncated: tensors need 16 data bytes, file has 10 after the header");

    /* header length beyond the file */
    put_st_raw(P("hlen.safetensors"), 1234, "{}", 990);
    EXPECT_FAIL(P("hlen.safetensors"), TD_ERR_INVALID,
                "hlen.safetensors: truncated: header says 1234 bytes, file has 1000");
    put_bytes(P("tiny.safetensors"), "\x02\x00\x00", 3);
    EXPECT_FAIL(P("tiny.safetensors"), TD_ERR_INVALID, "tiny.safetensors: truncated: 3 bytes");
    put_st_raw(P("huge.safetensors"), 200000000, "{}", 0);
    EXPECT_FAIL(P("huge.safetensors"), TD_ERR_INVALID, "truncated: header says 200000000 bytes");

    /* bad header JSON */
    put_st(P("json.safetensors"), "{\"a\":{\"dtype\":\"U8\",,}}", 0);
    EXPECT_FAIL(P("json.safetensors"), TD_ERR_INVALID,
                "json.safetensors: bad header JSON at line 1 column");
    put_st(P("arr.safetensors"), "[1,2]", 0);
    EXPECT_FAIL(P("arr.safetensors"), TD_ERR_INVALID, "header is not a JSON object");
    put_st(P("meta.safetensors"), "{\"__metadata__\":{\"x\":1}}", 0);
    EXPECT_FAIL(P("meta.safetensors"), TD_ERR_INVALID, "__metadata__ value 'x' is not a string");

    /* offsets out of range */
    put_st(P("range.safetensors"), "{" U8("a", 0, 4, 4) "," U8("b", 100, 104, 4) "}", 8);
    EXPECT_FAIL(P("range.safetensors"), TD_ERR_RANGE,
                "range.safetensors: tensor 'b': data_offsets [100,104] exceed data region (8 bytes)");

    /* dtype/shape size mismatch */
    put_st(P("size.safetensors"), "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);
    EXPECT_FAIL(P("size.safetensors"), TD_ERR_INVALID,
                "tensor 'w': data_offsets [0,2] hold 2 bytes, but F32 [2] needs 8");
    put_st(P("f4.safetensors"), "{\"w\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]}}", 1);
    EXPECT_FAIL(P("f4.safetensors"), TD_ERR_INVALID, "F4 [3] is not a whole number of bytes");

    /* unknown dtype */
    put_st(P("dtype.safetensors"), "{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);
    EXPECT_FAIL(P("dtype.safetensors"), TD_ERR_UNSUPPORTED, "tensor 'w': unknown dtype 'Q4_K'");

    /* duplicate tensor */
    put_st(P("dup.safetensors"), "{" U8("a", 0, 2, 2) "," U8("a", 2, 4, 2) "}", 4);
    EXPECT_FAIL(P("dup.safetensors"), TD_ERR_INVALID, "dup.safetensors: duplicate tensor 'a' in the header");

    /* the data region must be tiled exactly (safetensors rejects holes and overlaps) */
    put_st(P("overlap.safetensors"), "{" U8("a", 0, 4, 4) "," U8("b", 2, 6, 4) "}", 6);
    EXPECT_FAIL(P("overlap.safetensors"), TD_ERR_INVALID, "tensor 'b': data_offsets [2,6] overlap tensor 'a' [0,4]");
    put_st(P("hole.safetensors"), "{" U8("a", 0, 2, 2) "," U8("b", 4, 6, 2) "}", 6);
    EXPECT_FAIL(P("hole.safetensors"), TD_ERR_INVALID, "leave bytes [2,4) of the data region unused");
    put_st(P("tail.safetensors"), "{" U8("a", 0, 2, 2) "}", 5);
    EXPECT_FAIL(P("tail.safetensors"), TD_ERR_INVALID, "3 bytes after the last tensor");

    /* shapes */
    put_st(P("dims.safetensors"), "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1);
    EXPECT_FAIL(P("dims.safetensors"), TD_ERR_UNSUPPORTED, "9 dimensions, at most 8");
    put_st(P("neg.safetensors"), "{\"w\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1);
    EXPECT_FAIL(P("neg.safetensors"), TD_ERR_INVALID, "shape entry 0 is not a non-negative integer");
    put_st(P("offs.safetensors"), "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1]}}", 1);
    EXPECT_FAIL(P("offs.safetensors"), TD_ERR_INVALID, "\"data_offsets\" is not a pair");
    put_st(P("big.safetensors"), "{\"w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904,8],"
           "\"data_offsets\":[0,1]}}", 1);
    EXPECT_FAIL(P("big.safetensors"), TD_ERR_INVALID, "is not a whole number of bytes or is too large");

    /* missing paths */
    EXPECT_FAIL(P("nothing-here"), TD_ERR_NOT_FOUND, "No such file or directory");
    mkdir(P("emptydir"), 0755);
    EXPECT_FAIL(P("emptydir"), TD_ERR_NOT_FOUND, "no model.safetensors.index.json or model.safetensors");

    /* sharded checkpoints */
    mkdir(P("ck"), 0755);
    put_st(P("ck/model-00001-of-00002.safetensors"), "{" U8("a", 0, 2, 2) "," U8("b", 2, 4, 2) "}", 4);
    put_st(P("ck/model-00002-of-00002.safetensors"), "{" U8("c", 0, 3, 3) "}", 3);
    put_text(P("ck/model.safetensors.index.json"),
             "{\n  \"metadata\": {\"total_size\": 7},\n  \"weight_map\": {\"a\": }\n}\n");
    EXPECT_FAIL(P("ck"), TD_ERR_INVALID, "model.safetensors.index.json: bad JSON at line 3");
    put_text(P("ck/model.safetensors.index.json"), "{\"metadata\": {}}");
    EXPECT_FAIL(P("ck"), TD_ERR_INVALID, "model.safetensors.index.json: no \"weight_map\" object");
    put_text(P("ck/model.safetensors.index.json"),
             "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"a\": \"x\"}}");
    EXPECT_FAIL(P("ck"), TD_ERR_INVALID, "duplicate key 'a'");
    put_text(P("ck/model.safetensors.index.json"),
             "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", "
             "\"b\": \"model-00001-of-00002.safetensors\", \"c\": \"model-00003-of-00003.safetensors\"}}");
    EXPECT_FAIL(P("ck"), TD_ERR_NOT_FOUND,
                "model.safetensors.index.json: shard 'model-00003-of-00003.safetensors' is missing");
    put_text(P("ck/model.safetensors.index.json"),
             "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", "
             "\"b\": \"model-00002-of-00002.safetensors\", \"c\": \"model-00002-of-00002.safetensors\"}}");
    EXPECT_FAIL(P("ck"), TD_ERR_NOT_FOUND,
                "tensor 'b' listed in index is missing from shard 'model-00002-of-00002.safetensors'");
    put_text(P("ck/model.safetensors.index.json"),
             "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", "
             "\"c\": \"model-00002-of-00002.safetensors\"}}");
    EXPECT_FAIL(P("ck"), TD_ERR_INVALID,
                "tensor 'b' in shard 'model-00001-of-00002.safetensors' is not listed in "
                "model.safetensors.index.json");
    put_text(P("ck/model.safetensors.index.json"),
             "{\"weight_map\": {\"a\": \"../model-00001-of-00002.safetensors\"}}");
    EXPECT_FAIL(P("ck"), TD_ERR_INVALID, "shard name '../model-00001-of-00002.safetensors'");
    put_text(P("ck/model.safetensors.index.json"), "{\"weight_map\": {\"a\": 3}}");
    EXPECT_FAIL(P("ck"), TD_ERR_INVALID, "weight_map entry 'a' is not a string");
    /* a broken shard names the shard */
    put_st(P("ck/model-00002-of-00002.safetensors"), "{" U8("c", 0, 3, 3) "}", 1);
    put_text(P("ck/model.safetensors.index.json"),
             "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", "
             "\"b\": \"model-00001-of-00002.safetensors\", \"c\": \"model-00002-of-00002.safetensors\"}}");
    EXPECT_FAIL(P("ck"), TD_ERR_INVALID,
                "model-00002-of-00002.safetensors: truncated: tensors need 3 data bytes, file has 1");
    /* the same name in two shards */
    put_st(P("ck/model-00002-of-00002.safetensors"), "{" U8("b", 0, 3, 3) "}", 3);
    EXPECT_FAIL(P("ck"), TD_ERR_INVALID, "tensor 'b' appears in both");

    put_st(P("ck/model-00002-of-00002.safetensors"), "{" U8("c", 0, 3, 3) "}", 3);
    {
        td_st_t *st = NULL;

        CHECK_STATUS(td_st_open(P("ck"), &st), TD_OK);
        if (st != NULL) {
            const td_st_tensor_t *c = td_st_find(st, "c");

            CHECK_EQ_INT(td_st_count(st), 3);
            CHECK(c != NULL && c->nbytes == 3 && strcmp(c->file, "model-00002-of-00002.safetensors") == 0);
            CHECK(td_st_find(st, "zz") == NULL);
            td_st_close(st);
        }
        /* the index file itself opens the same checkpoint */
        st = NULL;
        CHECK_STATUS(td_st_open(P("ck/model.safetensors.index.json"), &st), TD_OK);
        CHECK(st != NULL && td_st_count(st) == 3);
        td_st_close(st);
    }
}

/* One file and a sharded checkpoint written by the writer read back the same. */
static void
test_writer(void)
{
    static const float f[6] = {1, -2, 3.5f, 0, -0.0f, 1e-3f};
    static const uint8_t b[5] = {1, 2, 3, 4, 5};
    const int64_t s23[2] = {2, 3}, s5[1] = {5}, s0[2] = {0, 4}, s10[1] = {10};
    uint8_t big[4096];
    td_st_writer_t *w = NULL;
    td_st_t *st = NULL;
    FILE *fp;
    unsigned char len8[8];
    uint64_t hlen = 0;

    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (uint8_t)(i * 31);
    CHECK_STATUS(td_st_writer_create(P("w.safetensors"), &w), TD_OK);
    CHECK_STATUS(td_st_writer_add(w, "z.f", TD_DT_F32, 2, s23, f, sizeof(f)), TD_OK);
    CHECK_STATUS(td_st_writer_add(w, "a.b", TD_DT_U8, 1, s5, b, sizeof(b)), TD_OK);
    CHECK_STATUS(td_st_writer_add(w, "empty", TD_DT_BF16, 2, s0, NULL, 0), TD_OK);
    CHECK_STATUS(td_st_writer_add(w, "scalar", TD_DT_F32, 0, NULL, f, 4), TD_OK);
    CHECK_STATUS(td_st_writer_add(w, "packed", TD_DT_F4, 1, s10, b, 5), TD_OK);
    /* the writer's own refusals */
    CHECK_STATUS(td_st_writer_add(w, "a.b", TD_DT_U8, 1, s5, b, sizeof(b)), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "duplicate tensor 'a.b'") != NULL);
    CHECK_STATUS(td_st_writer_add(w, "x", TD_DT_F32, 1, s5, b, sizeof(b)), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "tensor 'x': 5 bytes given, F32 [5] needs") != NULL);
    CHECK_STATUS(td_st_writer_add(w, "__metadata__", TD_DT_U8, 1, s5, b, 5), TD_ERR_INVALID);
    CHECK_STATUS(td_st_writer_finish(w, "{\"format\":\"pt\",\"k\":\"v\"}"), TD_OK);

    fp = fopen(P("w.safetensors"), "rb");
    if (fp != NULL && fread(len8, 1, 8, fp) == 8) {
        for (int i = 7; i >= 0; i--)
            hlen = (hlen << 8) | len8[i];
    }
    if (fp)
        fclose(fp);
    CHECK(hlen > 0 && hlen % 8 == 0);

    CHECK_STATUS(td_st_open(P("w.safetensors"), &st), TD_OK);
    if (st != NULL) {
        const td_st_tensor_t *t;

        CHECK_EQ_INT(td_st_count(st), 5);
        CHECK_STR(td_st_at(st, 0)->name, "a.b");     /* name order */
        CHECK_STR(td_st_at(st, 4)->name, "z.f");
        CHECK(td_st_at(st, 5) == NULL);
        t = td_st_find(st, "z.f");
        CHECK(t != NULL && t->dtype == TD_DT_F32 && t->ndim == 2 && t->shape[1] == 3 &&
              memcmp(t->data, f, sizeof(f)) == 0 && td_st_numel(t) == 6);
        t = td_st_find(st, "empty");
        CHECK(t != NULL && t->nbytes == 0 && td_st_numel(t) == 0);
        t = td_st_find(st, "scalar");
        CHECK(t != NULL && t->ndim == 0 && td_st_numel(t) == 1 && t->nbytes == 4);
        t = td_st_find(st, "packed");
        CHECK(t != NULL && t->dtype == TD_DT_F4 && t->shape[0] == 10 && t->nbytes == 5);
        CHECK_STR(td_st_metadata(st, "k"), "v");
        CHECK(td_st_metadata(st, "nope") == NULL);
        CHECK_STR(td_st_at(st, 0)->file, "w.safetensors");
        td_st_close(st);
    }

    /* metadata must be an object of strings */
    CHECK_STATUS(td_st_writer_create(P("m.safetensors"), &w), TD_OK);
    CHECK_STATUS(td_st_writer_finish(w, "{\"n\": 1}"), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "metadata value 'n' is not a string") != NULL);
    CHECK(access(P("m.safetensors"), F_OK) != 0);

    /* sharded: 4 KiB tensors into 10 KiB shards -> 3 shards + index */
    CHECK_STATUS(td_st_writer_create_sharded(P("shw"), 10000, &w), TD_OK);
    for (int i = 0; i < 6; i++) {
        char name[32];
        const int64_t shp[1] = {4096};

        snprintf(name, sizeof(name), "layers.%d.w", i);
        CHECK_STATUS(td_st_writer_add(w, name, TD_DT_U8, 1, shp, big, sizeof(big)), TD_OK);
    }
    CHECK_STATUS(td_st_writer_add(w, "tail", TD_DT_U8, 1, s5, b, 5), TD_OK);
    CHECK_STATUS(td_st_writer_finish(w, "{\"format\":\"pt\"}"), TD_OK);
    CHECK(access(P("shw/model-00003-of-00003.safetensors"), F_OK) == 0);
    CHECK(access(P("shw/model.safetensors.index.json"), F_OK) == 0);
    CHECK_STATUS(td_st_open(P("shw"), &st), TD_OK);
    if (st != NULL) {
        const td_st_tensor_t *t = td_st_find(st, "layers.5.w");

        CHECK_EQ_INT(td_st_count(st), 7);
        CHECK(t != NULL && memcmp(t->data, big, sizeof(big)) == 0 &&
              strcmp(t->file, "model-00003-of-00003.safetensors") == 0);
        CHECK_STR(td_st_metadata(st, "format"), "pt");
        td_st_close(st);
    }
    /* one shard's worth is written as model.safetensors, no index */
    CHECK_STATUS(td_st_writer_create_sharded(P("sh1"), 1 << 20, &w), TD_OK);
    CHECK_STATUS(td_st_writer_add(w, "a", TD_DT_U8, 1, s5, b, 5), TD_OK);
    CHECK_STATUS(td_st_writer_finish(w, NULL), TD_OK);
    CHECK(access(P("sh1/model.safetensors"), F_OK) == 0);
    CHECK(access(P("sh1/model.safetensors.index.json"), F_OK) != 0);
    CHECK_STATUS(td_st_open(P("sh1"), &st), TD_OK);
    td_st_close(st);
    /* abandoned writers write nothing */
    CHECK_STATUS(td_st_writer_create(P("gone.safetensors"), &w), TD_OK);
    CHECK_STATUS(td_st_writer_add(w, "a", TD_DT_U8, 1, s5, b, 5), TD_OK);
    td_st_writer_destroy(w);
    CHECK(access(P("gone.safetensors"), F_OK) != 0);
}

static size_t
read_all(const char *path, unsigned char **out)
{
    FILE *f = fopen(path, "rb");
    long n;

    *out = NULL;
    if (f == NULL)
        return 0;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc((size_t)n + 1);
    if (fread(*out, 1, (size_t)n, f) != (size_t)n)
        n = 0;
    fclose(f);
    return (size_t)n;
}

/* Touch every byte of every tensor and dequantize what can be. */
static void
walk(td_st_t *st)
{
    unsigned sum = 0;

    for (size_t i = 0; i < td_st_count(st); i++) {
        const td_st_tensor_t *t = td_st_at(st, i);
        const td_st_tensor_t *s = i + 1 < td_st_count(st) ? td_st_at(st, i + 1) : NULL;
        int64_t n = td_st_numel(t), m = td_quant_dequant_count(t, s);

        for (size_t k = 0; k < t->nbytes; k++)
            sum += ((const unsigned char *)t->data)[k];
        if (n < (1 << 20)) {
            float *out = malloc((size_t)n * sizeof(float) + 4);
            (void)td_quant_to_f32(t, out);
            free(out);
        }
        if (m >= 0 && m < (1 << 20)) {
            float *out = malloc((size_t)m * sizeof(float) + 4);
            (void)td_quant_dequant(t, s, 0, 0, out);
            free(out);
        }
    }
    (void)sum;
}

/* Every truncation fails cleanly; byte flips never crash. */
static void
test_fuzz(void)
{
    static const uint8_t codes[64] = {0x38, 0x40, 0x7f, 0x01};
    const int64_t sw[2] = {2, 32}, ss[2] = {1, 1}, se[2] = {2, 16}, se_s[2] = {2, 1};
    unsigned char *good = NULL, *buf;
    size_t n, opened = 0;
    td_st_writer_t *w = NULL;
    td_st_t *st;
    td_rng_t rng = td_rng_seed(12345);

    CHECK_STATUS(td_st_writer_create(P("fz.safetensors"), &w), TD_OK);
    CHECK_STATUS(td_st_writer_add(w, "w", TD_DT_F8_E4M3, 2, sw, codes, 64), TD_OK);
    CHECK_STATUS(td_st_writer_add(w, "w.scale", TD_DT_E8M0, 2, ss, codes, 1), TD_OK);
    CHECK_STATUS(td_st_writer_add(w, "x", TD_DT_I8, 2, se, codes, 32), TD_OK);
    CHECK_STATUS(td_st_writer_add(w, "x.scale", TD_DT_E8M0, 2, se_s, codes, 2), TD_OK);
    CHECK_STATUS(td_st_writer_finish(w, "{\"a\":\"b\"}"), TD_OK);
    n = read_all(P("fz.safetensors"), &good);
    CHECK(n > 100);
    if (good == NULL)
        return;
    for (size_t len = 0; len < n; len++) {
        put_bytes(P("cut.safetensors"), good, len);
        st = NULL;
        CHECK(td_st_open(P("cut.safetensors"), &st) != TD_OK);
        td_st_close(st);
    }
    buf = malloc(n);
    for (int round = 0; round < 4000; round++) {
        memcpy(buf, good, n);
        for (int k = 0; k < 1 + round % 3; k++) {
            size_t pos = td_rng_next(&rng) % n;
            /* half the flips go to the 8-byte length and the header */
            if (round % 2 == 0)
                pos = pos % (n < 200 ? n : 200);
            buf[pos] = (unsigned char)td_rng_next(&rng);
        }
        put_bytes(P("flip.safetensors"), buf, n);
        st = NULL;
        if (td_st_open(P("flip.safetensors"), &st) == TD_OK) {
            opened++;
            walk(st);
            td_st_close(st);
        }
    }
    fprintf(stderr, "fuzz: %zu truncations failed cleanly; %zu of 4000 mutated files opened\n",
            n, opened);
    free(buf);
    free(good);

    /* the index: every truncation and byte flip of a sharded checkpoint's index */
    CHECK_STATUS(td_st_writer_create_sharded(P("fzs"), 40, &w), TD_OK);
    CHECK_STATUS(td_st_writer_add(w, "w", TD_DT_F8_E4M3, 2, sw, codes, 64), TD_OK);
    CHECK_STATUS(td_st_writer_add(w, "x", TD_DT_I8, 2, se, codes, 32), TD_OK);
    CHECK_STATUS(td_st_writer_add(w, "y", TD_DT_I8, 2, se, codes, 32), TD_OK);
    CHECK_STATUS(td_st_writer_finish(w, NULL), TD_OK);
    n = read_all(P("fzs/model.safetensors.index.json"), &good);
    CHECK(n > 50);
    if (good == NULL)
        return;
    st = NULL;
    CHECK_STATUS(td_st_open(P("fzs"), &st), TD_OK);
    td_st_close(st);
    for (size_t len = 0; len < n + 400; len++) {
        unsigned char *b2 = malloc(n);

        memcpy(b2, good, n);
        if (len >= n) {     /* flips after the truncations */
            size_t pos = td_rng_next(&rng) % n;
            b2[pos] = (unsigned char)td_rng_next(&rng);
        }
        put_bytes(P("fzs/model.safetensors.index.json"), b2, len < n ? len : n);
        st = NULL;
        if (td_st_open(P("fzs"), &st) == TD_OK)
            walk(st);
        td_st_close(st);
        free(b2);
    }
    free(good);
}

/* ---- quant ----------------------------------------------------------------- */

static void
test_quant_layouts(void)
{
    enum { R = 40, C = 70, K = 64 };
    static float x[R * C], y[R * C];
    static uint8_t q[R * C], s[128];
    td_st_tensor_t w, sc;
    float maxerr = 0;

    for (int i = 0; i < R * C; i++)
        x[i] = sinf((float)i * 0.37f) * (1.0f + (float)(i % 7)) * 0.01f;

    /* fp8 32x32 with partial edge blocks: quantize, dequantize, bound the error */
    CHECK_STATUS(td_quant_fp8_block(x, R, C, 32, 32, q, s), TD_OK);
    w = tensor2d("w", TD_DT_F8_E4M3, R, C, q);
    sc = tensor2d("w.scale", TD_DT_E8M0, 2, 3, s);
    CHECK_STATUS(td_quant_dequant(&w, &sc, 32, 32, y), TD_OK);
    for (int i = 0; i < R * C; i++)
        maxerr = fmaxf(maxerr, fabsf(x[i] - y[i]));
    CHECK(maxerr < 0.07f * 0.0625f);
    /* 40 x 72 does not divide into 2 x 3: the block size is needed */
    CHECK_STATUS(td_quant_dequant(&w, &sc, 0, 0, y), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "tensor 'w': scale 'w.scale' shape [2,3] does not divide "
                 "weight shape [40,70]; give the block size") != NULL);
    sc = tensor2d("w.scale", TD_DT_E8M0, 2, 2, s);
    CHECK_STATUS(td_quant_dequant(&w, &sc, 32, 32, y), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "scale 'w.scale' has shape [2,2], which does not tile "
                 "weight [40,70] in 32x32 blocks (expected [2,3])") != NULL);
    sc = tensor2d("w.scale", TD_DT_I32, 2, 3, s);
    CHECK_STATUS(td_quant_dequant(&w, &sc, 32, 32, y), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "has dtype I32; a block scale is") != NULL);
    sc = tensor2d("w.scale", TD_DT_E8M0, 2, 3, s);
    sc.ndim = 1;
    CHECK_STATUS(td_quant_dequant(&w, &sc, 32, 32, y), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "must be 2-D") != NULL);
    w = tensor2d("b", TD_DT_BF16, R, C, q);
    sc = tensor2d("w.scale", TD_DT_E8M0, 2, 3, s);
    CHECK_STATUS(td_quant_dequant(&w, &sc, 32, 32, y), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "tensor 'b': dtype BF16 does not take a block scale") != NULL);

    /* fp4 experts [R, K] */
    CHECK_STATUS(td_quant_fp4_group(x, R, K, q, s), TD_OK);
    w = tensor2d("e", TD_DT_I8, R, K / 2, q);
    sc = tensor2d("e.scale", TD_DT_E8M0, R, K / 32, s);
    CHECK_STATUS(td_quant_dequant(&w, &sc, 0, 0, y), TD_OK);
    maxerr = 0;
    for (int i = 0; i < R; i++)
        for (int j = 0; j < K; j++)
            maxerr = fmaxf(maxerr, fabsf(x[i * K + j] - y[i * K + j]));
    CHECK(maxerr <= 0.07f * 0.25f);
    sc = tensor2d("e.scale", TD_DT_E8M0, R, 3, s);
    CHECK_STATUS(td_quant_dequant(&w, &sc, 0, 0, y), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "packed fp4 weight [40,32] (40 x 64 values) needs [40, K/group]") != NULL);
    sc = tensor2d("e.scale", TD_DT_E8M0, R, 2, s);
    CHECK_STATUS(td_quant_dequant(&w, &sc, 32, 32, y), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "gives groups of 1x32, not 32x32") != NULL);
    CHECK_STATUS(td_quant_fp4_group(x, R, 48, q, s), TD_ERR_INVALID);

    /* engram rows */
    CHECK_STATUS(td_quant_fp8_rows(x, R, K, 32, q, s), TD_OK);
    w = tensor2d("t", TD_DT_F8_E4M3, R, K, q);
    sc = tensor2d("t.scale", TD_DT_E8M0, R, K / 32, s);
    CHECK_STATUS(td_quant_dequant(&w, &sc, 0, 0, y), TD_OK);

    /* non-finite input is refused */
    x[5] = NAN;
    CHECK_STATUS(td_quant_fp8_block(x, R, C, 32, 32, q, s), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "element 5 (row 0, column 5) is not finite") != NULL);
    x[5] = 0;
    CHECK_STATUS(td_quant_from_f32(x, 4, TD_DT_I32, q), TD_ERR_UNSUPPORTED);
}

int
main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/td-st-test-%d", (int)getpid());
    rm_tree(tmpdir);
    if (mkdir(tmpdir, 0700) != 0) {
        perror(tmpdir);
        return 1;
    }
    td_logcap_start();
    test_error_classes();
    test_writer();
    test_fuzz();
    test_quant_layouts();
    td_logcap_stop();
    rm_tree(tmpdir);
    return td_check_exit("test_safetensors");
}
