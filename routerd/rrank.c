/* routerd/rrank.c — one worker rank as routerd sees it: its state from its
 * connection, registration and draining, the DEP group it belongs to, and
 * sending it a message. */
#include "rrank.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

static const char *const rrank_state_names[] = {
    [TD_RRANK_UP] = "up", [TD_RRANK_JOINING] = "joining",
    [TD_RRANK_DRAINING] = "draining", [TD_RRANK_DEAD] = "dead",
};

const char *
td_rrank_state_str(td_rrank_state_t st)
{
    return (unsigned)st <= TD_RRANK_DEAD ? rrank_state_names[st] : "?";
}

void
td_rrank_load(td_rrank_t *rk, const Tandem__Load *ld)
{
    rk->load = *ld;
    rk->load.base.unknown_fields = NULL;
    rk->load.base.n_unknown_fields = 0;
    rk->load.expert_tokens = NULL;   /* the message's: copied below */
    rk->load.n_expert_tokens = 0;
    rk->load.cache = NULL;           /* the message's: its scalars copied here */
    rk->load.loop_pass_counts = NULL;   /* the message's: into rk->loop */
    rk->load.n_loop_pass_counts = 0;
    if (ld->n_loop_pass_counts == TD_LOOPSTAT_NBUCKETS + 1) {
        memcpy(rk->loop.counts, ld->loop_pass_counts, sizeof rk->loop.counts);
        rk->loop.n = 0;
        for (size_t i = 0; i < ld->n_loop_pass_counts; i++)
            rk->loop.n += ld->loop_pass_counts[i];
        rk->loop.sum_us = ld->loop_pass_sum_us;
        rk->loop.max_us = ld->loop_pass_max_us;
    }
    rk->has_cache_stats = ld->cache != NULL;
    if (ld->cache) {
        rk->cache_stats = *ld->cache;
        rk->cache_stats.base.unknown_fields = NULL;
        rk->cache_stats.base.n_unknown_fields = 0;
    }
    if (ld->n_expert_tokens != rk->n_expert_tokens) {
        uint64_t *e = realloc(rk->expert_tokens, (ld->n_expert_tokens ? ld->n_expert_tokens
                                                                       : 1) * sizeof(*e));
        if (e != NULL) {
            rk->expert_tokens = e;
            rk->n_expert_tokens = ld->n_expert_tokens;
        }
    }
    if (rk->n_expert_tokens == ld->n_expert_tokens && ld->n_expert_tokens > 0)
        memcpy(rk->expert_tokens, ld->expert_tokens, ld->n_expert_tokens * sizeof(uint64_t));
    /* what it has not answered may not be in it yet */
    rk->pend_tokens = rk->unans_tokens;
    rk->pend_reqs = rk->unans_reqs;
    rk->freed_tokens = 0;
    rk->freed_reqs = 0;
    rk->refused = false;
}

void
td_rrank_load_clear(td_rrank_t *rk)
{
    memset(&rk->load, 0, sizeof rk->load);
    rk->n_expert_tokens = 0;
    rk->pend_tokens = 0;
    rk->pend_reqs = 0;
    rk->freed_tokens = 0;
    rk->freed_reqs = 0;
    rk->unans_tokens = 0;
    rk->unans_reqs = 0;
    rk->refused = false;
    rk->has_cache_stats = false;
}

td_rrank_room_t
td_rrank_room(const td_rrank_t *rk)
{
    uint64_t free_tok = rk->load.kv_tokens_free + rk->freed_tokens;
    uint64_t rows = (uint64_t)rk->load.running + rk->load.queued + rk->pend_reqs;
    uint64_t total = rk->reg ? rk->reg->kv_tokens_total : 0;

    free_tok = free_tok > rk->pend_tokens ? free_tok - rk->pend_tokens : 0;
    if (total > 0 && free_tok > total)   /* a release the Load showed already */
        free_tok = total;
    rows = rows > rk->freed_reqs ? rows - rk->freed_reqs : 0;
    return (td_rrank_room_t){ .free_tok = free_tok, .rows = rows };
}

void
td_rrank_admit_sent(td_rrank_t *rk, uint64_t need)
{
    rk->pend_tokens += need;
    rk->pend_reqs++;
    rk->unans_tokens += need;
    rk->unans_reqs++;
}

void
td_rrank_admit_answered(td_rrank_t *rk, uint64_t need)
{
    rk->unans_tokens = rk->unans_tokens > need ? rk->unans_tokens - need : 0;
    rk->unans_reqs -= rk->unans_reqs > 0;
}

void
td_rrank_admit_freed(td_rrank_t *rk, uint64_t need)
{
    rk->freed_tokens += need;
    rk->freed_reqs++;
}

td_rrank_state_t
td_rrank_state(const td_rrank_t *rk)
{
    if (!rk->conn)
        return TD_RRANK_DEAD;
    if (!rk->reg)
        return TD_RRANK_JOINING;
    if (rk->node->draining || rk->load.draining || rk->reg->draining)
        return TD_RRANK_DRAINING;
    return TD_RRANK_UP;
}

uint32_t
td_rrank_dep_size(const td_rrank_t *rk)
{
    return rk->reg ? rk->reg->dep_size : 0;
}

bool
td_rrank_same_dep(const td_rrank_t *a, const td_rrank_t *b)
{
    return td_rrank_dep_size(a) > 0 && td_rrank_dep_size(b) > 0 && a->role == b->role &&
           strcmp(a->reg->dep_domain, b->reg->dep_domain) == 0;
}

bool
td_rrank_dep_valid(const Tandem__Register *reg, const char **why)
{
    const char *d = reg->dep_domain ? reg->dep_domain : "";
    size_t n = strlen(d);

    if (reg->dep_size == 0)
        return true;
    for (size_t i = 0; i < n; i++)
        if (d[i] < ' ' || d[i] > '~')
            n = 0;
    if (n == 0 || n > TD_HELLO_NODE_ID_MAX) {
        *why = "dep domain must be 1..64 printable bytes";
        return false;
    }
    if (reg->dep_rank >= reg->dep_size) {
        *why = "dep rank outside its group";
        return false;
    }
    return true;
}

td_status_t
td_rrank_send(td_rrank_t *rk, const Tandem__Envelope *env)
{
    td_status_t st;

    if (!rk->conn) {
        td_debug("%s rank %s/%u: not connected; message (payload %d) not sent",
                 td_hello_role_str(rk->role), rk->node->name, rk->rank_id,
                 (int)env->payload_case);
        return TD_ERR_CLOSED;
    }
    st = td_ctl_conn_send(rk->conn, env);
    /* an oversized frame was logged by the control connection, which decided it */
    if (st != TD_OK && st != TD_ERR_TOO_BIG)
        td_warn("%s: message (payload %d) not sent: %s", td_ctl_conn_name(rk->conn),
                (int)env->payload_case, td_status_str(st));
    return st;
}

uint32_t
td_rrank_cache_block(const td_rrank_t *rk)
{
    return rk->reg && rk->role == TANDEM__ROLE__ROLE_PREFILL ? rk->reg->cache_block_tokens : 0;
}
