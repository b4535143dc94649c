/* tests/weights/test_weights_ref.c — the C half of the reference test: reads
 * the fixtures weights_ref.py wrote with safetensors' own writer (DIR), checks
 * every decode, dequantization, encode and quantizer result bit for bit against
 * the values numpy/fractions computed, then writes DIR/c/{one.safetensors,
 * sharded/, quant.safetensors} with our writer for the Python side to load. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../unit/check.h"
#include "log.h"
#include "quant.h"
#include "safetensors.h"

static const char *dir;

static char *
path_of(const char *name)
{
    static char buf[4][4096];
    static int k;

    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
    return buf[k];
}

/* Raw little-endian f32 file -> malloc'd array. */
static float *
read_f32(const char *name, size_t *n)
{
    FILE *f = fopen(path_of(name), "rb");
    long len;
    float *v;

    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    v = malloc((size_t)len + 4);
    if (v != NULL && fread(v, 1, (size_t)len, f) != (size_t)len) {
        free(v);
        v = NULL;
    }
    fclose(f);
    *n = (size_t)len / 4;
    return v;
}

/* Bit-exact, except that any NaN equals any NaN. */
static int
same_f32(float a, float b)
{
    uint32_t x, y;

    if (isnan(a) && isnan(b))
        return 1;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y;
}

static int
compare(const char *what, const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!same_f32(got[i], want[i])) {
            fprintf(stderr, "%s: element %zu: got %.9g, want %.9g\n", what, i,
                    (double)got[i], (double)want[i]);
            return 0;
        }
    }
    return 1;
}

static td_st_t *
open_file(const char *name)
{
    td_st_t *st = NULL;

    if (td_st_open(path_of(name), &st) != TD_OK) {
        fprintf(stderr, "open %s failed (the reader logged why)\n", name);
        td_check_failures++;
        return NULL;
    }
    return st;
}

static const td_st_tensor_t *
need(td_st_t *st, const char *name)
{
    const td_st_tensor_t *t = td_st_find(st, name);

    if (t == NULL) {
        fprintf(stderr, "tensor %s missing\n", name);
        td_check_failures++;
    }
    return t;
}

static int cases;

static void
run_decode(json_t *list)
{
    size_t i;
    json_t *c;

    json_array_foreach(list, i, c) {
        td_st_t *st = open_file(json_string_value(json_object_get(c, "file")));
        const td_st_tensor_t *t;
        size_t n = 0;
        float *want, *got;

        if (st == NULL)
            continue;
        t = need(st, json_string_value(json_object_get(c, "tensor")));
        want = read_f32(json_string_value(json_object_get(c, "expect")), &n);
        if (t != NULL && want != NULL) {
            CHECK_EQ_INT(td_st_numel(t), (int64_t)n);
            got = malloc((n + 1) * sizeof(float));
            CHECK_STATUS(td_quant_to_f32(t, got), TD_OK);
            if (!compare(t->name, got, want, n))
                td_check_failures++;
            free(got);
            cases++;
        }
        free(want);
        td_st_close(st);
    }
}

static void
run_dequant(json_t *list)
{
    size_t i;
    json_t *c;

    json_array_foreach(list, i, c) {
        td_st_t *st = open_file(json_string_value(json_object_get(c, "file")));
        const td_st_tensor_t *w, *s;
        json_t *blk = json_object_get(c, "block");
        size_t n = 0;
        float *want, *got;

        if (st == NULL)
            continue;
        w = need(st, json_string_value(json_object_get(c, "weight")));
        s = need(st, json_string_value(json_object_get(c, "scale")));
        want = read_f32(json_string_value(json_object_get(c, "expect")), &n);
        if (w != NULL && s != NULL && want != NULL) {
            got = malloc((n + 1) * sizeof(float));
            CHECK_STATUS(td_quant_dequant(w, s, (int)json_integer_value(json_array_get(blk, 0)),
                                          (int)json_integer_value(json_array_get(blk, 1)), got),
                         TD_OK);
            if (!compare(w->name, got, want, n))
                td_check_failures++;
            free(got);
            cases++;
        }
        free(want);
        td_st_close(st);
    }
}

static void
run_encode(json_t *list)
{
    size_t i;
    json_t *c;

    json_array_foreach(list, i, c) {
        td_st_t *st = open_file(json_string_value(json_object_get(c, "file")));
        const td_st_tensor_t *x, *want;
        td_dtype_t dt;

        if (st == NULL)
            continue;
        x = need(st, json_string_value(json_object_get(c, "input")));
        want = need(st, json_string_value(json_object_get(c, "expect")));
        CHECK_STATUS(td_dtype_parse(json_string_value(json_object_get(c, "dtype")), &dt), TD_OK);
        if (x != NULL && want != NULL && x->dtype == TD_DT_F32) {
            int64_t n = td_st_numel(x);
            float *xv = malloc((size_t)n * sizeof(float));
            uint8_t *out = malloc(want->nbytes + 1);
            size_t esz = td_dtype_bits(dt) / 8;

            CHECK_STATUS(td_quant_to_f32(x, xv), TD_OK);
            CHECK_STATUS(td_quant_from_f32(xv, (size_t)n, dt, out), TD_OK);
            for (int64_t k = 0; k < n; k++) {
                if (memcmp(out + k * esz, (const uint8_t *)want->data + k * esz, esz) != 0) {
                    uint32_t g = 0, wv = 0;
                    memcpy(&g, out + k * esz, esz);
                    memcpy(&wv, (const uint8_t *)want->data + k * esz, esz);
                    fprintf(stderr, "encode %s: x[%" PRId64 "] = %.9g: got 0x%x, want 0x%x\n",
                            td_dtype_name(dt), k, (double)xv[k], g, wv);
                    td_check_failures++;
                    break;
                }
            }
            free(xv);
            free(out);
            cases++;
        }
        td_st_close(st);
    }
}

/* Quantize each input with the C quantizers, compare with the reference bytes,
 * and add the results to the writer `qw`. */
static void
run_quant(json_t *list, td_st_writer_t *qw)
{
    size_t i;
    json_t *c;

    json_array_foreach(list, i, c) {
        td_st_t *st = open_file(json_string_value(json_object_get(c, "file")));
        const char *kind = json_string_value(json_object_get(c, "kind"));
        const td_st_tensor_t *x, *wq, *ws;
        uint8_t *q, *s;
        float *xv;
        int64_t rows, cols;
        td_status_t rc = TD_ERR_INVALID;

        if (st == NULL)
            continue;
        x = need(st, json_string_value(json_object_get(c, "input")));
        wq = need(st, json_string_value(json_object_get(c, "q")));
        ws = need(st, json_string_value(json_object_get(c, "scale")));
        if (x == NULL || wq == NULL || ws == NULL || x->ndim != 2) {
            td_st_close(st);
            continue;
        }
        rows = x->shape[0];
        cols = x->shape[1];
        xv = malloc((size_t)(rows * cols) * sizeof(float));
        q = calloc(wq->nbytes + 1, 1);
        s = calloc(ws->nbytes + 1, 1);
        CHECK_STATUS(td_quant_to_f32(x, xv), TD_OK);
        if (strcmp(kind, "fp8_block") == 0) {
            json_t *b = json_object_get(c, "block");
            rc = td_quant_fp8_block(xv, rows, cols, (int)json_integer_value(json_array_get(b, 0)),
                                    (int)json_integer_value(json_array_get(b, 1)), q, s);
        } else if (strcmp(kind, "fp4") == 0) {
            rc = td_quant_fp4_group(xv, rows, cols, q, s);
        } else if (strcmp(kind, "fp8_rows") == 0) {
            rc = td_quant_fp8_rows(xv, rows, cols,
                                   (int)json_integer_value(json_object_get(c, "group")), q, s);
        }
        CHECK_STATUS(rc, TD_OK);
        for (size_t k = 0; k < wq->nbytes; k++) {
            if (q[k] != ((const uint8_t *)wq->data)[k]) {
                fprintf(stderr, "%s %s: code %zu: got 0x%02x, want 0x%02x (x = %.9g)\n", kind,
                        x->name, k, q[k], ((const uint8_t *)wq->data)[k],
                        (double)xv[strcmp(kind, "fp4") == 0 ? 2 * k : k]);
                td_check_failures++;
                break;
            }
        }
        CHECK(memcmp(s, ws->data, ws->nbytes) == 0);
        CHECK_STATUS(td_st_writer_add(qw, wq->name, TD_DT_U8, wq->ndim, wq->shape, q, wq->nbytes),
                     TD_OK);
        CHECK_STATUS(td_st_writer_add(qw, ws->name, TD_DT_U8, ws->ndim, ws->shape, s, ws->nbytes),
                     TD_OK);
        free(xv);
        free(q);
        free(s);
        cases++;
        td_st_close(st);
    }
}

/* The sharded fixture holds the same tensors as dtypes.safetensors. */
static void
run_sharded(json_t *sh)
{
    td_st_t *a = open_file(json_string_value(json_object_get(sh, "dir")));
    td_st_t *b = open_file(json_string_value(json_object_get(sh, "same_as")));

    if (a != NULL && b != NULL) {
        CHECK_EQ_INT(td_st_count(a), td_st_count(b));
        for (size_t i = 0; i < td_st_count(b); i++) {
            const td_st_tensor_t *tb = td_st_at(b, i);
            const td_st_tensor_t *ta = td_st_find(a, tb->name);

            CHECK(ta != NULL);
            if (ta == NULL)
                continue;
            CHECK_EQ_INT(ta->dtype, tb->dtype);
            CHECK_EQ_INT(ta->ndim, tb->ndim);
            CHECK_EQ_INT(ta->nbytes, tb->nbytes);
            CHECK(memcmp(ta->data, tb->data, tb->nbytes) == 0);
            CHECK(strncmp(ta->file, "model-0000", 10) == 0);
        }
        CHECK_STR(td_st_metadata(a, "format"), "pt");
        cases++;
    }
    td_st_close(a);
    td_st_close(b);
}

/* Rewrite dtypes.safetensors with our writer, as one file and as shards. */
static void
write_copies(void)
{
    td_st_t *src = open_file("dtypes.safetensors");
    td_st_writer_t *one = NULL, *sh = NULL;

    if (src == NULL)
        return;
    CHECK_STATUS(td_st_writer_create(path_of("c/one.safetensors"), &one), TD_OK);
    CHECK_STATUS(td_st_writer_create_sharded(path_of("c/sharded"), 70000, &sh), TD_OK);
    for (size_t i = 0; i < td_st_count(src) && one && sh; i++) {
        const td_st_tensor_t *t = td_st_at(src, i);

        CHECK_STATUS(td_st_writer_add(one, t->name, t->dtype, t->ndim, t->shape, t->data,
                                      t->nbytes), TD_OK);
        CHECK_STATUS(td_st_writer_add(sh, t->name, t->dtype, t->ndim, t->shape, t->data,
                                      t->nbytes), TD_OK);
    }
    if (one)
        CHECK_STATUS(td_st_writer_finish(one, "{\"format\": \"pt\", \"producer\": \"tandem\"}"),
                     TD_OK);
    if (sh)
        CHECK_STATUS(td_st_writer_finish(sh, NULL), TD_OK);
    td_st_close(src);
}

int
main(int argc, char **argv)
{
    json_error_t jerr;
    json_t *man;
    td_st_writer_t *qw = NULL;

    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURE_DIR (made by weights_ref.py gen)\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    td_log_set_level(TD_LOG_ERROR);
    man = json_load_file(path_of("manifest.json"), 0, &jerr);
    if (man == NULL) {
        fprintf(stderr, "manifest.json: %s\n", jerr.text);
        return 1;
    }
    mkdir(path_of("c"), 0755);
    run_decode(json_object_get(man, "decode"));
    run_dequant(json_object_get(man, "dequant"));
    run_encode(json_object_get(man, "encode"));
    CHECK_STATUS(td_st_writer_create(path_of("c/quant.safetensors"), &qw), TD_OK);
    if (qw != NULL) {
        run_quant(json_object_get(man, "quant"), qw);
        CHECK_STATUS(td_st_writer_finish(qw, NULL), TD_OK);
    }
    run_sharded(json_object_get(man, "sharded"));
    write_copies();
    json_decref(man);
    fprintf(stderr, "test_weights_ref: %d reference cases\n", cases);
    CHECK(cases >= 30);
    return td_check_exit("test_weights_ref");
}
