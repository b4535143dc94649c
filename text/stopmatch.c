/* text/stopmatch.c — the stop matcher of stopmatch.h: a trie of the patterns
 * with Aho–Corasick failure links (each node knows the longest pattern that
 * ends there), and the filter that holds back the longest suffix of the text
 * that may still begin a stop string. */
#include "stopmatch.h"

#include <stdlib.h>
#include <string.h>

/* ---- The automaton ---------------------------------------------------------- */

typedef struct {
    uint32_t child;      /* first child, 0: none (node 0, the root, is nobody's child) */
    uint32_t sibling;    /* next child of the same parent, 0: none */
    uint32_t fail;       /* the longest proper suffix that is a trie node */
    uint32_t depth;      /* bytes from the root */
    uint32_t out_len;    /* the longest pattern ending here (0: none) */
    uint32_t out_idx;    /*   its index */
    unsigned char byte;  /* the edge from the parent */
} stopmatch_node_t;

struct td_stopmatch {
    stopmatch_node_t *nodes;   /* [nnodes], 0 the root */
    uint32_t nnodes;
    char **pats;               /* [npats] copies */
    size_t *lens;              /* [npats] */
    size_t npats;
};

static uint32_t
node_child(const td_stopmatch_t *m, uint32_t s, unsigned char c)
{
    for (uint32_t v = m->nodes[s].child; v != 0; v = m->nodes[v].sibling)
        if (m->nodes[v].byte == c)
            return v;
    return 0;
}

/* The trie of every pattern; a node's out_len is its own pattern's length
 * when one ends there (the first of equal ones wins). */
static void
stopmatch_trie(td_stopmatch_t *m)
{
    m->nnodes = 1;
    for (size_t i = 0; i < m->npats; i++) {
        uint32_t s = 0;

        for (size_t k = 0; k < m->lens[i]; k++) {
            unsigned char c = (unsigned char)m->pats[i][k];
            uint32_t v = node_child(m, s, c);

            if (v == 0) {
                v = m->nnodes++;
                m->nodes[v] = (stopmatch_node_t){ .sibling = m->nodes[s].child, .byte = c,
                                                  .depth = m->nodes[s].depth + 1 };
                m->nodes[s].child = v;
            }
            s = v;
        }
        if (m->nodes[s].out_len == 0) {
            m->nodes[s].out_len = (uint32_t)m->lens[i];
            m->nodes[s].out_idx = (uint32_t)i;
        }
    }
}

/* Failure links in breadth-first order (a node's fail is shallower, so it
 * is done before it), and each node's longest pattern ending there: its own,
 * else its fail's. */
static td_status_t
stopmatch_links(td_stopmatch_t *m)
{
    uint32_t *queue = malloc(m->nnodes * sizeof(*queue));
    size_t head = 0, tail = 0;

    if (queue == NULL)
        return TD_ERR_NOMEM;
    for (uint32_t v = m->nodes[0].child; v != 0; v = m->nodes[v].sibling) {
        m->nodes[v].fail = 0;
        queue[tail++] = v;
    }
    while (head < tail) {
        uint32_t u = queue[head++];

        for (uint32_t v = m->nodes[u].child; v != 0; v = m->nodes[v].sibling) {
            uint32_t f = m->nodes[u].fail;
            uint32_t to;

            while (f != 0 && node_child(m, f, m->nodes[v].byte) == 0)
                f = m->nodes[f].fail;
            to = node_child(m, f, m->nodes[v].byte);
            m->nodes[v].fail = to != v ? to : 0;
            if (m->nodes[v].out_len == 0) {
                m->nodes[v].out_len = m->nodes[m->nodes[v].fail].out_len;
                m->nodes[v].out_idx = m->nodes[m->nodes[v].fail].out_idx;
            }
            queue[tail++] = v;
        }
    }
    free(queue);
    return TD_OK;
}

td_status_t
td_stopmatch_create(const char *const *pats, const size_t *lens, size_t n,
                    td_stopmatch_t **out)
{
    td_stopmatch_t *m;
    size_t total = 1;

    for (size_t i = 0; i < n; i++) {
        size_t len = lens ? lens[i] : (pats[i] ? strlen(pats[i]) : 0);
        if (pats[i] == NULL || len == 0 || len > UINT32_MAX - total)
            return TD_ERR_INVALID;
        total += len;
    }
    if ((m = calloc(1, sizeof(*m))) == NULL)
        return TD_ERR_NOMEM;
    m->nodes = calloc(total, sizeof(*m->nodes));
    m->pats = calloc(n ? n : 1, sizeof(*m->pats));
    m->lens = calloc(n ? n : 1, sizeof(*m->lens));
    if (m->nodes == NULL || m->pats == NULL || m->lens == NULL)
        goto err_destroy;
    for (; m->npats < n; m->npats++) {
        size_t len = lens ? lens[m->npats] : strlen(pats[m->npats]);
        if ((m->pats[m->npats] = malloc(len + 1)) == NULL)
            goto err_destroy;
        memcpy(m->pats[m->npats], pats[m->npats], len);
        m->pats[m->npats][len] = '\0';
        m->lens[m->npats] = len;
    }
    stopmatch_trie(m);
    if (stopmatch_links(m) != TD_OK)
        goto err_destroy;
    *out = m;
    return TD_OK;

err_destroy:
    td_stopmatch_destroy(m);
    return TD_ERR_NOMEM;
}

void
td_stopmatch_destroy(td_stopmatch_t *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->npats; i++)
        free(m->pats[i]);
    free(m->pats);
    free(m->lens);
    free(m->nodes);
    free(m);
}

uint32_t
td_stopmatch_step(const td_stopmatch_t *m, uint32_t s, unsigned char c)
{
    uint32_t v;

    while ((v = node_child(m, s, c)) == 0 && s != 0)
        s = m->nodes[s].fail;
    return v;
}

size_t
td_stopmatch_depth(const td_stopmatch_t *m, uint32_t s)
{
    return m->nodes[s].depth;
}

size_t
td_stopmatch_hit(const td_stopmatch_t *m, uint32_t s, size_t *which)
{
    if (which != NULL)
        *which = m->nodes[s].out_idx;
    return m->nodes[s].out_len;
}

const char *
td_stopmatch_pattern(const td_stopmatch_t *m, size_t i)
{
    return m->pats[i];
}

size_t
td_stopmatch_len(const td_stopmatch_t *m, size_t i)
{
    return m->lens[i];
}

size_t
td_stopmatch_count(const td_stopmatch_t *m)
{
    return m->npats;
}

/* ---- The streaming stop filter ---------------------------------------------- */

/* Text fed but not released stays in hold; after each feed it is exactly the
 * automaton's depth: the longest suffix that is a proper prefix of a stop
 * string (a whole one would have matched), so shorter than the longest. */
struct td_stopmatch_filter {
    td_stopmatch_t *m;
    uint32_t state;
    bool include;
    bool matched;      /* a stop string completed; nothing more is released */
    size_t which;      /* matched: its index */
    td_buf_t hold;
};

td_status_t
td_stopmatch_filter_create(const char *const *stops, size_t n, bool include,
                           td_stopmatch_filter_t **out)
{
    td_stopmatch_filter_t *f = calloc(1, sizeof(*f));
    td_status_t st;

    if (f == NULL)
        return TD_ERR_NOMEM;
    st = td_stopmatch_create(stops, NULL, n, &f->m);
    if (st != TD_OK) {
        free(f);
        return st;
    }
    f->include = include;
    *out = f;
    return TD_OK;
}

void
td_stopmatch_filter_destroy(td_stopmatch_filter_t *f)
{
    if (f == NULL)
        return;
    td_stopmatch_destroy(f->m);
    td_buf_free(&f->hold);
    free(f);
}

td_status_t
td_stopmatch_filter_feed(td_stopmatch_filter_t *f, const char *text, size_t len, bool armed,
                         td_buf_t *out, bool *matched)
{
    size_t start = f->hold.len, keep;
    td_status_t st;

    if (f->matched || len == 0) {
        *matched = f->matched;
        return TD_OK;
    }
    if ((st = td_buf_append(&f->hold, text, len)) != TD_OK)
        return st;
    for (size_t i = 0; i < len; i++) {
        size_t hit;

        f->state = td_stopmatch_step(f->m, f->state, (unsigned char)text[i]);
        hit = armed ? td_stopmatch_hit(f->m, f->state, &f->which) : 0;
        if (hit > 0) {
            size_t end = start + i + 1;   /* the match is hold[end - hit, end) */
            st = td_buf_append(out, f->hold.data, f->include ? end : end - hit);
            if (st != TD_OK)
                return st;
            f->matched = true;
            td_buf_free(&f->hold);
            *matched = true;
            return TD_OK;
        }
    }
    keep = td_stopmatch_depth(f->m, f->state);
    if ((st = td_buf_append(out, f->hold.data, f->hold.len - keep)) != TD_OK)
        return st;
    memmove(f->hold.data, f->hold.data + f->hold.len - keep, keep);
    td_buf_truncate(&f->hold, keep);
    *matched = false;
    return TD_OK;
}

const char *
td_stopmatch_filter_which(const td_stopmatch_filter_t *f)
{
    return f->matched ? td_stopmatch_pattern(f->m, f->which) : NULL;
}

td_status_t
td_stopmatch_filter_flush(td_stopmatch_filter_t *f, td_buf_t *out)
{
    td_status_t st;

    if (f->matched || f->hold.len == 0)
        return TD_OK;
    st = td_buf_append(out, f->hold.data, f->hold.len);
    if (st == TD_OK)
        td_buf_truncate(&f->hold, 0);
    f->state = TD_STOPMATCH_START;
    return st;
}
