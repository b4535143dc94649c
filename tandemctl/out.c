/* tandemctl/out.c — output: table cells from router JSON that may be odd
 * (a missing or mistyped field prints "?" and warns, never crashes), padded
 * text tables, and the --json printer. */
#include "tandemctl.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

struct tdctl_table_s {
    size_t ncols;
    size_t nrows, cap;
    char **cells;  /* [nrows * ncols], owned */
};

static void
out_warn(tdctl_t *ctl, const char *ctx, const char *key, const char *why)
{
    ctl->warnings++;
    td_warn("%s: field \"%s\" %s", ctx, key, why);
}

/* obj[key], where key may be a path "load.running" through nested objects;
 * a null on the way is the value (a dead rank's "load": null). */
static const json_t *
out_lookup(const json_t *obj, const char *key)
{
    const char *dot;
    while (obj != NULL && (dot = strchr(key, '.')) != NULL) {
        obj = json_is_object(obj) ? json_object_getn(obj, key, (size_t)(dot - key)) : NULL;
        key = dot + 1;
        if (json_is_null(obj))
            return obj;
    }
    return json_is_object(obj) ? json_object_get(obj, key) : NULL;
}

void
tdctl_out_cell(tdctl_t *ctl, const json_t *obj, const char *key, const char *ctx,
               char *buf, size_t len)
{
    const json_t *v = out_lookup(obj, key);
    const json_t *node = json_object_get(v, "node"), *rank = json_object_get(v, "rank");

    if (json_is_string(node) && json_is_integer(rank)) {  /* a rank: {node, rank} */
        snprintf(buf, len, "%s/%" JSON_INTEGER_FORMAT, json_string_value(node),
                 json_integer_value(rank));
        return;
    }
    switch (v != NULL ? json_typeof(v) : JSON_OBJECT) {
    case JSON_STRING:
        snprintf(buf, len, "%s", json_string_value(v));
        return;
    case JSON_INTEGER:
        snprintf(buf, len, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return;
    case JSON_REAL:
        snprintf(buf, len, "%.3g", json_real_value(v));
        return;
    case JSON_TRUE:
    case JSON_FALSE:
        snprintf(buf, len, "%s", json_is_true(v) ? "yes" : "no");
        return;
    case JSON_NULL:
        snprintf(buf, len, "-");
        return;
    default:
        out_warn(ctl, ctx, key, v == NULL ? "missing" : "has the wrong type");
        snprintf(buf, len, "?");
        return;
    }
}

const json_t *
tdctl_out_array(tdctl_t *ctl, const json_t *obj, const char *key, const char *ctx)
{
    const json_t *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    if (json_is_array(v))
        return v;
    out_warn(ctl, ctx, key, v == NULL ? "missing" : "is not an array");
    return NULL;
}

tdctl_table_t *
tdctl_table_create(size_t ncols)
{
    tdctl_table_t *t = calloc(1, sizeof(*t));
    if (t != NULL)
        t->ncols = ncols;
    return t;
}

void
tdctl_table_destroy(tdctl_table_t *t)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->nrows * t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    free(t);
}

td_status_t
tdctl_table_add(tdctl_table_t *t, const char *const *cells)
{
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 16;
        char **c = realloc(t->cells, cap * t->ncols * sizeof(*c));
        if (c == NULL)
            return TD_ERR_NOMEM;
        t->cells = c;
        t->cap = cap;
    }
    char **row = t->cells + t->nrows * t->ncols;
    for (size_t i = 0; i < t->ncols; i++) {
        if ((row[i] = strdup(cells[i])) == NULL) {
            while (i-- > 0)
                free(row[i]);
            return TD_ERR_NOMEM;
        }
    }
    t->nrows++;
    return TD_OK;
}

void
tdctl_table_print(const tdctl_table_t *t, FILE *out)
{
    size_t width[32] = { 0 };
    size_t ncols = t->ncols < 32 ? t->ncols : 32;

    for (size_t r = 0; r < t->nrows; r++)
        for (size_t c = 0; c < ncols; c++) {
            size_t w = strlen(t->cells[r * t->ncols + c]);
            if (w > width[c])
                width[c] = w;
        }
    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t c = 0; c < ncols; c++) {
            const char *cell = t->cells[r * t->ncols + c];
            if (c + 1 == ncols)
                fprintf(out, "%s\n", cell);
            else
                fprintf(out, "%-*s  ", (int)width[c], cell);
        }
    }
}

void
tdctl_out_bytes(uint64_t v, char *buf, size_t len)
{
    static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB" };
    double x = (double)v;
    size_t u = 0;

    if (v < 1024) {
        snprintf(buf, len, "%" PRIu64 " B", v);
        return;
    }
    x /= 1024;
    while (x >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
        x /= 1024;
        u++;
    }
    if (x < 100 && x != (double)(uint64_t)x)
        snprintf(buf, len, "%.1f %s", x, units[u]);
    else
        snprintf(buf, len, "%.0f %s", x, units[u]);
}

/* An integer field of o as uint64 (0 when absent or not a non-negative
 * integer: the callers print "?" for a missing stats object, not fields). */
static uint64_t
out_u64(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);

    return json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v)
                                                           : 0;
}

void
tdctl_out_cache(const json_t *cache, char *buf, size_t len)
{
    const json_t *s = json_object_get(cache, "stats");
    char pool[32], host[32], ssd[32], hit[16] = "-";

    if (!json_is_object(cache)) {
        snprintf(buf, len, "-");
        return;
    }
    if (!json_is_object(s)) {
        snprintf(buf, len, "no report yet");
        return;
    }
    uint64_t lookup = out_u64(s, "lookup_tokens");
    uint64_t hits = out_u64(s, "hit_pool_tokens") + out_u64(s, "hit_host_tokens") +
                    out_u64(s, "hit_ssd_tokens");
    tdctl_out_bytes(out_u64(s, "pool_bytes"), pool, sizeof pool);
    tdctl_out_bytes(out_u64(s, "host_bytes"), host, sizeof host);
    tdctl_out_bytes(out_u64(s, "ssd_bytes"), ssd, sizeof ssd);
    if (lookup > 0)
        snprintf(hit, sizeof hit, "%.0f%%", 100.0 * (double)hits / (double)lookup);
    snprintf(buf, len, "%s pool / %s host / %s ssd, hit %s", pool, host, ssd, hit);
}

void
tdctl_out_json(const json_t *j)
{
    json_dumpf(j, stdout, JSON_INDENT(2) | JSON_SORT_KEYS);
    fputc('\n', stdout);
}

/* Most columns a table built from tdctl_col_t may have. */
#define TDCTL_OUT_MAXCOLS 16

tdctl_table_t *
tdctl_out_table_create(const tdctl_col_t *cols, size_t ncols)
{
    const char *hdr[TDCTL_OUT_MAXCOLS];
    tdctl_table_t *t = tdctl_table_create(ncols);

    if (t == NULL || ncols > TDCTL_OUT_MAXCOLS)
        goto err_destroy;
    for (size_t i = 0; i < ncols; i++)
        hdr[i] = cols[i].header;
    if (tdctl_table_add(t, hdr) != TD_OK)
        goto err_destroy;
    return t;

err_destroy:
    tdctl_table_destroy(t);
    return NULL;
}

td_status_t
tdctl_out_row(tdctl_t *ctl, tdctl_table_t *t, const tdctl_col_t *cols, size_t ncols,
              const json_t *outer, const json_t *inner, const char *ctx)
{
    char buf[TDCTL_OUT_MAXCOLS][128];
    const char *row[TDCTL_OUT_MAXCOLS];
    bool odd_row = !json_is_object(inner);

    if (odd_row) {  /* one warning for the row, not one per column */
        ctl->warnings++;
        td_warn("%s: not an object", ctx);
    }
    for (size_t i = 0; i < ncols && i < TDCTL_OUT_MAXCOLS; i++) {
        char cctx[192];
        snprintf(cctx, sizeof(cctx), "%s: column %s", ctx, cols[i].header);
        if (odd_row)
            snprintf(buf[i], sizeof(buf[i]), "?");
        else
            tdctl_out_cell(ctl, cols[i].outer ? outer : inner, cols[i].key, cctx, buf[i],
                           sizeof(buf[i]));
        row[i] = buf[i];
    }
    return tdctl_table_add(t, row);
}
