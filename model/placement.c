/* model/placement.c — expert placement for DEPn: contiguous ranges, a JSON
 * file with replicas, validation, and the replica rule (placement.h). */
#include "placement.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

struct td_placement {
    uint32_t experts, ranks;
    unsigned char *holds;    /* [ranks, experts] 1 where the rank holds the expert */
    uint32_t *held;          /* [ranks] experts held */
    uint32_t *rep_at;        /* [experts + 1] each expert's replicas in rep */
    uint32_t *rep;           /* [sum of held] ranks, ascending per expert */
};

/* The largest file accepted: a placement of 1024 ranks x 384 experts with
 * every expert everywhere is ~2 MB of text. */
#define PLACEMENT_FILE_MAX (16u << 20)

__attribute__((format(printf, 3, 4))) static td_status_t
placement_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err != NULL && errlen > 0) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return TD_ERR_INVALID;
}

static td_placement_t *
placement_alloc(uint32_t experts, uint32_t ranks)
{
    td_placement_t *p = calloc(1, sizeof(*p));

    if (p == NULL)
        return NULL;
    p->experts = experts;
    p->ranks = ranks;
    p->holds = calloc((size_t)experts * ranks, 1);
    p->held = calloc(ranks, sizeof(*p->held));
    p->rep_at = calloc((size_t)experts + 1, sizeof(*p->rep_at));
    if (p->holds == NULL || p->held == NULL || p->rep_at == NULL) {
        td_placement_destroy(p);
        return NULL;
    }
    return p;
}

/* The replica lists from holds; an expert that no rank holds is refused. */
static td_status_t
placement_finish(td_placement_t *p, char *err, size_t errlen)
{
    size_t total = 0;

    for (uint32_t e = 0; e < p->experts; e++) {
        uint32_t n = 0;
        for (uint32_t r = 0; r < p->ranks; r++)
            n += p->holds[(size_t)r * p->experts + e];
        if (n == 0)
            return placement_fail(err, errlen, "expert %u is held by no rank", e);
        p->rep_at[e] = (uint32_t)total;
        total += n;
    }
    p->rep_at[p->experts] = (uint32_t)total;
    p->rep = malloc(total * sizeof(*p->rep));
    if (p->rep == NULL)
        return placement_fail(err, errlen, "out of memory");
    for (uint32_t e = 0, at = 0; e < p->experts; e++)
        for (uint32_t r = 0; r < p->ranks; r++)
            if (p->holds[(size_t)r * p->experts + e])
                p->rep[at++] = r;
    return TD_OK;
}

static td_status_t
placement_check_sizes(uint32_t experts, uint32_t ranks, char *err, size_t errlen)
{
    if (experts == 0 || ranks == 0 || ranks > TD_PLACEMENT_MAX_RANKS)
        return placement_fail(err, errlen, "%u experts over %u ranks (1 .. %u ranks)", experts,
                              ranks, TD_PLACEMENT_MAX_RANKS);
    return TD_OK;
}

td_status_t
td_placement_create_ranges(uint32_t experts, uint32_t ranks, td_placement_t **out)
{
    char err[128];
    td_status_t st = placement_check_sizes(experts, ranks, err, sizeof(err));

    if (st != TD_OK) {
        td_error("placement: %s", err);
        return st;
    }
    td_placement_t *p = placement_alloc(experts, ranks);
    if (p == NULL) {
        td_error("placement: out of memory (%u experts, %u ranks)", experts, ranks);
        return TD_ERR_NOMEM;
    }
    uint32_t base = experts / ranks, extra = experts % ranks, e = 0;
    for (uint32_t r = 0; r < ranks; r++) {
        uint32_t n = base + (r < extra ? 1 : 0);
        for (uint32_t i = 0; i < n; i++, e++)
            p->holds[(size_t)r * experts + e] = 1;
        p->held[r] = n;
    }
    st = placement_finish(p, err, sizeof(err));
    if (st != TD_OK) {
        td_error("placement: %s", err);
        td_placement_destroy(p);
        return st;
    }
    *out = p;
    return TD_OK;
}

td_status_t
td_placement_parse(const char *text, size_t len, uint32_t experts, uint32_t ranks,
                   td_placement_t **out, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root, *jr, *je_n;
    td_placement_t *p = NULL;
    td_status_t st;

    st = placement_check_sizes(experts, ranks, err, errlen);
    if (st != TD_OK)
        return st;
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL)
        return placement_fail(err, errlen, "%d:%d: not JSON: %s", je.line, je.column, je.text);
    if (!json_is_object(root)) {
        st = placement_fail(err, errlen, "not a JSON object");
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "experts") != 0 && strcmp(key, "ranks") != 0) {
            st = placement_fail(err, errlen, "unknown key \"%s\" (experts, ranks)", key);
            goto out;
        }
    }
    je_n = json_object_get(root, "experts");
    if (je_n != NULL && (!json_is_integer(je_n) || json_integer_value(je_n) != (json_int_t)experts)) {
        st = placement_fail(err, errlen, "\"experts\" is not %u (the model's n_routed_experts)",
                            experts);
        goto out;
    }
    jr = json_object_get(root, "ranks");
    if (!json_is_array(jr)) {
        st = placement_fail(err, errlen, "\"ranks\" is missing or not an array of arrays");
        goto out;
    }
    if (json_array_size(jr) != ranks) {
        st = placement_fail(err, errlen, "\"ranks\" lists %zu ranks, the group has %u",
                            json_array_size(jr), ranks);
        goto out;
    }
    p = placement_alloc(experts, ranks);
    if (p == NULL) {
        st = placement_fail(err, errlen, "out of memory");
        goto out;
    }
    for (uint32_t r = 0; r < ranks; r++) {
        json_t *list = json_array_get(jr, r), *v;
        size_t i;
        if (!json_is_array(list)) {
            st = placement_fail(err, errlen, "ranks[%u] is not an array of expert ids", r);
            goto out;
        }
        json_array_foreach(list, i, v) {
            json_int_t e = json_is_integer(v) ? json_integer_value(v) : -1;
            if (e < 0 || e >= (json_int_t)experts) {
                st = placement_fail(err, errlen, "ranks[%u][%zu] is not an expert id in "
                                    "[0, %u)", r, i, experts);
                goto out;
            }
            unsigned char *h = &p->holds[(size_t)r * experts + (size_t)e];
            if (*h) {
                st = placement_fail(err, errlen, "ranks[%u] lists expert %lld twice", r,
                                    (long long)e);
                goto out;
            }
            *h = 1;
            p->held[r]++;
        }
    }
    st = placement_finish(p, err, errlen);

out:
    json_decref(root);
    if (st != TD_OK) {
        td_placement_destroy(p);
        return st;
    }
    *out = p;
    return TD_OK;
}

td_status_t
td_placement_load(const char *path, uint32_t experts, uint32_t ranks, td_placement_t **out)
{
    char err[256];
    char *text = NULL;
    size_t len = 0;
    td_status_t st;
    FILE *f = fopen(path, "rb");

    if (f == NULL) {
        st = td_status_from_errno(errno);
        td_error("placement %s: %s", path, strerror(errno));
        return st;
    }
    text = malloc(PLACEMENT_FILE_MAX + 1);
    if (text == NULL) {
        fclose(f);
        td_error("placement %s: out of memory", path);
        return TD_ERR_NOMEM;
    }
    len = fread(text, 1, PLACEMENT_FILE_MAX + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || len > PLACEMENT_FILE_MAX) {
        free(text);
        td_error("placement %s: %s", path,
                 bad ? "read failed" : "larger than 16 MiB: not a placement file");
        return bad ? TD_ERR_IO : TD_ERR_INVALID;
    }
    st = td_placement_parse(text, len, experts, ranks, out, err, sizeof(err));
    free(text);
    if (st != TD_OK)
        td_error("placement %s: %s", path, err);
    return st;
}

void
td_placement_destroy(td_placement_t *p)
{
    if (p == NULL)
        return;
    free(p->holds);
    free(p->held);
    free(p->rep_at);
    free(p->rep);
    free(p);
}

uint32_t
td_placement_ranks(const td_placement_t *p)
{
    return p->ranks;
}

uint32_t
td_placement_experts(const td_placement_t *p)
{
    return p->experts;
}

bool
td_placement_holds(const td_placement_t *p, uint32_t rank, uint32_t expert)
{
    return rank < p->ranks && expert < p->experts &&
           p->holds[(size_t)rank * p->experts + expert] != 0;
}

uint32_t
td_placement_held(const td_placement_t *p, uint32_t rank)
{
    return rank < p->ranks ? p->held[rank] : 0;
}

uint32_t
td_placement_replicas(const td_placement_t *p, uint32_t expert, const uint32_t **ranks)
{
    *ranks = p->rep + p->rep_at[expert];
    return p->rep_at[expert + 1] - p->rep_at[expert];
}

uint32_t
td_placement_route(const td_placement_t *p, uint32_t expert, uint32_t rank, uint64_t row)
{
    const uint32_t *reps = p->rep + p->rep_at[expert];
    uint32_t n = p->rep_at[expert + 1] - p->rep_at[expert];

    if (n == 1)
        return reps[0];
    if (td_placement_holds(p, rank, expert))
        return rank;
    return reps[(rank + row) % n];
}
