/* routerd/cluster.c — membership: the control listener worker ranks connect
 * to, the table of nodes and ranks (registration, load, draining, death),
 * DecodePeer news to prefill ranks, the prefill ranks' cache blocks
 * (CacheEvent, CacheFlush), and admin drain / undrain / remove. A
 * connection in the tool role is a decode domain's rank joining its domain
 * (rdomain.c), never a rank of the table.
 * Messages about requests and lost ranks go to the handlers (cluster.h). */
#include "cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* ======================================================================= */
/* Nodes and ranks                                                          */
/* ======================================================================= */

static td_rrank_node_t *
node_find(td_cluster_t *c, const char *name)
{
    for (td_rrank_node_t *n = c->nodes; n; n = n->next)
        if (strcmp(n->name, name) == 0)
            return n;
    return NULL;
}

static td_rrank_node_t *
node_get(td_cluster_t *c, const char *name)
{
    td_rrank_node_t *n = node_find(c, name);

    if (n)
        return n;
    n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    snprintf(n->name, sizeof n->name, "%s", name);
    n->next = c->nodes;
    c->nodes = n;
    return n;
}

static void
rank_free(td_rrank_t *rk)
{
    if (rk->reg)
        tandem__register__free_unpacked(rk->reg, NULL);
    free(rk->expert_tokens);
    td_rcache_fini(&rk->cache);
    free(rk);
}

static td_rrank_t *
rank_by_conn(td_cluster_t *c, const td_ctl_conn_t *conn)
{
    for (td_rrank_t *rk = c->ranks; rk; rk = rk->next)
        if (rk->conn == conn)
            return rk;
    return NULL;
}

static td_rrank_t *
rank_find(td_cluster_t *c, const char *node, uint32_t rank_id, Tandem__Role role)
{
    for (td_rrank_t *rk = c->ranks; rk; rk = rk->next)
        if (rk->rank_id == rank_id && rk->role == role && strcmp(rk->node->name, node) == 0)
            return rk;
    return NULL;
}

static void drain_send(td_rrank_t *rk, bool draining);

/* Forget a node that is being removed once none of its ranks holds a request:
 * lift the drain the removal began, close their connections and free the
 * entries. A worker that still runs registers again, as a new node that
 * takes requests (docs/routerd.md, "remove"). */
static void
node_forget_if_idle(td_cluster_t *c, td_rrank_node_t *n)
{
    if (!n->removing || c->hold)
        return;
    for (td_rrank_t *rk = c->ranks; rk; rk = rk->next)
        if (rk->node == n && rk->inflight > 0)
            return;
    td_info("node %s: removed", n->name);
    for (td_rrank_t **p = &c->ranks; *p;) {
        td_rrank_t *rk = *p;
        if (rk->node != n) {
            p = &rk->next;
            continue;
        }
        if (rk->conn) {   /* on_closed runs now or later and finds no rank */
            td_ctl_conn_t *conn = rk->conn;
            /* queued before the Reject, so the worker reads it first: it is
             * not left draining when it comes back */
            if (rk->reg)
                drain_send(rk, false);
            rk->conn = NULL;
            td_ctl_conn_close(conn, TANDEM__REJECT_CODE__REJECT_IDENTITY,
                              "node removed by the operator");
        }
        *p = rk->next;
        rank_free(rk);
    }
    for (td_rrank_node_t **p = &c->nodes; *p; p = &(*p)->next)
        if (*p == n) {
            *p = n->next;
            free(n);
            break;
        }
}

void
td_cluster_rank_bind(td_cluster_t *c, td_rrank_t *rk)
{
    rk->inflight++;
}

void
td_cluster_rank_release(td_cluster_t *c, td_rrank_t *rk)
{
    if (rk->inflight > 0)
        rk->inflight--;
    if (rk->inflight == 0)
        node_forget_if_idle(c, rk->node);
}

static void
capacity_changed(td_cluster_t *c)
{
    if (c->h.on_capacity)
        c->h.on_capacity(c, c->h.arg);
}

/* ======================================================================= */
/* DecodePeer and Drain                                                      */
/* ======================================================================= */

static void
decode_peer_send(td_rrank_t *to, const td_rrank_t *d, bool gone)
{
    Tandem__DecodePeer dp = TANDEM__DECODE_PEER__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    dp.node_id = (char *)d->node->name;
    dp.rank_id = d->rank_id;
    dp.incarnation = d->incarnation;
    dp.gone = gone;
    if (!gone && d->reg) {
        dp.xfer_address = d->reg->xfer_address;
        dp.n_pools = d->reg->n_pools;
        dp.pools = d->reg->pools;
    }
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_DECODE_PEER;
    env.decode_peer = &dp;
    (void)td_rrank_send(to, &env);
}

/* News of decode rank d to every registered prefill rank. */
static void
decode_peer_broadcast(td_cluster_t *c, const td_rrank_t *d, bool gone)
{
    for (td_rrank_t *rk = c->ranks; rk; rk = rk->next)
        if (rk->role == TANDEM__ROLE__ROLE_PREFILL && rk->conn && rk->reg)
            decode_peer_send(rk, d, gone);
}

static void
drain_send(td_rrank_t *rk, bool draining)
{
    Tandem__Drain dr = TANDEM__DRAIN__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    dr.draining = draining;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_DRAIN;
    env.drain = &dr;
    (void)td_rrank_send(rk, &env);
}

td_status_t
td_cluster_node_drain(td_cluster_t *c, const char *name, bool draining)
{
    td_rrank_node_t *n = node_find(c, name);

    if (!n)
        return TD_ERR_NOT_FOUND;
    n->draining = draining;
    if (!draining)
        n->removing = false;
    td_info("node %s: %s by the operator", n->name, draining ? "draining" : "undrained");
    for (td_rrank_t *rk = c->ranks; rk; rk = rk->next)
        if (rk->node == n && rk->conn && rk->reg)
            drain_send(rk, draining);
    capacity_changed(c);
    return TD_OK;
}

td_status_t
td_cluster_node_remove(td_cluster_t *c, const char *name)
{
    td_status_t st = td_cluster_node_drain(c, name, true);
    td_rrank_node_t *n;

    if (st != TD_OK)
        return st;
    n = node_find(c, name);
    n->removing = true;
    node_forget_if_idle(c, n);
    return TD_OK;
}

/* ======================================================================= */
/* Control connections                                                       */
/* ======================================================================= */

/* rk's connection ended (the connection logged why): the handler lets its
 * requests go; forget: a removed node may be freed now (not while the caller
 * still uses rk). */
static void
rank_lost(td_cluster_t *c, td_rrank_t *rk, const char *how, bool forget)
{
    bool was_registered = rk->reg != NULL;

    td_info("%s rank %s/%u: dead (%s), %u requests bound", td_hello_role_str(rk->role),
            rk->node->name, rk->rank_id, how, rk->inflight);
    rk->conn = NULL;
    /* its last Load says nothing about a rank that is gone */
    td_rrank_load_clear(rk);
    td_rcache_clear(&rk->cache, true);   /* a rank that comes back announces again */
    c->hold++;   /* rk stays while its requests let go of it */
    if (c->h.on_rank_lost)
        c->h.on_rank_lost(c, rk, c->h.arg);
    c->hold--;
    if (was_registered && rk->role == TANDEM__ROLE__ROLE_DECODE)
        decode_peer_broadcast(c, rk, true);
    if (forget)
        node_forget_if_idle(c, rk->node);
}

static void
cluster_on_established(td_ctl_conn_t *conn, const Tandem__Hello *peer, void *arg)
{
    td_cluster_t *c = arg;
    td_rrank_node_t *n;
    td_rrank_t *rk;

    if (peer->role == TANDEM__ROLE__ROLE_TOOL) {   /* a domain's join: DomainJoin next */
        td_debug("%s: connected (domain exchange)", td_ctl_conn_name(conn));
        return;
    }
    /* a refusal is logged once, by the connection, with the reason given */
    if (peer->role != TANDEM__ROLE__ROLE_PREFILL && peer->role != TANDEM__ROLE__ROLE_DECODE) {
        td_ctl_conn_close(conn, TANDEM__REJECT_CODE__REJECT_IDENTITY,
                          "only prefill and decode ranks, and decode domains' joins (tool "
                          "role), connect to a router's control port");
        return;
    }
    n = node_get(c, peer->node_id);
    if (!n)
        goto err_nomem;
    rk = rank_find(c, peer->node_id, peer->rank_id, peer->role);
    if (rk && rk->conn) {   /* a restart or a second connection replaces the first */
        td_ctl_conn_t *old = rk->conn;
        rank_lost(c, rk, "replaced by a new connection", false);
        td_ctl_conn_close(old, TANDEM__REJECT_CODE__REJECT_IDENTITY,
                          "replaced by a newer connection of the same rank");
    }
    if (!rk) {
        rk = calloc(1, sizeof *rk);
        if (!rk)
            goto err_nomem;
        rk->node = n;
        rk->rank_id = peer->rank_id;
        rk->role = peer->role;
        td_rcache_init(&rk->cache, c->cache_max_blocks);
        rk->next = c->ranks;
        c->ranks = rk;
    }
    if (rk->reg) {
        tandem__register__free_unpacked(rk->reg, NULL);
        rk->reg = NULL;
    }
    rk->conn = conn;
    rk->incarnation = peer->incarnation;
    td_rrank_load_clear(rk);
    td_rcache_clear(&rk->cache, true);
    td_info("%s: connected (incarnation %016llx)", td_ctl_conn_name(conn),
            (unsigned long long)peer->incarnation);
    return;

err_nomem:
    td_ctl_conn_close(conn, TANDEM__REJECT_CODE__REJECT_UNSPECIFIED,
                      "router out of memory for the rank table");
}

/* Our own copy of a Register (env is freed after the callback). */
static td_status_t
register_copy(const Tandem__Register *src, Tandem__Register **out)
{
    size_t len = tandem__register__get_packed_size(src);
    uint8_t *buf = malloc(len ? len : 1);
    Tandem__Register *cp;

    if (!buf)
        return TD_ERR_NOMEM;
    tandem__register__pack(src, buf);
    cp = tandem__register__unpack(NULL, len, buf);
    free(buf);
    if (!cp)
        return TD_ERR_NOMEM;
    *out = cp;
    return TD_OK;
}

static void
on_register(td_cluster_t *c, td_rrank_t *rk, const Tandem__Register *reg)
{
    Tandem__Registered ok = TANDEM__REGISTERED__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Register *cp;
    bool first = rk->reg == NULL;

    if (rk->role == TANDEM__ROLE__ROLE_DECODE && reg->max_batch == 0) {
        td_ctl_conn_close(rk->conn, TANDEM__REJECT_CODE__REJECT_PROTO,
                          "decode rank registered with max_batch 0");
        return;
    }
    const char *why;
    if (!td_rrank_dep_valid(reg, &why)) {
        td_ctl_conn_close(rk->conn, TANDEM__REJECT_CODE__REJECT_PROTO, why);
        return;
    }
    if (register_copy(reg, &cp) != TD_OK) {
        td_ctl_conn_close(rk->conn, TANDEM__REJECT_CODE__REJECT_UNSPECIFIED,
                          "router out of memory for the registration");
        return;
    }
    if (rk->reg && rk->reg->cache_block_tokens != cp->cache_block_tokens)
        td_rcache_clear(&rk->cache, false);   /* blocks of another size: other hashes */
    if (rk->reg)
        tandem__register__free_unpacked(rk->reg, NULL);
    rk->reg = cp;
    if (first) {
        rk->load.kv_tokens_free = cp->kv_tokens_total;
        rk->load.draining = cp->draining;
    }
    char dep[128] = "";
    if (cp->dep_size > 0)
        snprintf(dep, sizeof dep, ", dep group %s rank %u of %u", cp->dep_domain, cp->dep_rank,
                 cp->dep_size);
    char cache[64] = "";
    if (td_rrank_cache_block(rk) > 0)
        snprintf(cache, sizeof cache, ", prefix cache blocks of %u tokens",
                 td_rrank_cache_block(rk));
    td_info("%s: registered: engine %s, max context %llu, kv tokens %llu, max batch %u%s%s%s",
            td_ctl_conn_name(rk->conn), cp->engine_name, (unsigned long long)cp->max_context,
            (unsigned long long)cp->kv_tokens_total, cp->max_batch, dep, cache,
            cp->draining ? ", draining" : "");
    ok.router_id = c->router_id;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_REGISTERED;
    env.registered = &ok;
    if (td_rrank_send(rk, &env) != TD_OK)
        return;
    if (rk->node->draining)
        drain_send(rk, true);
    if (rk->role == TANDEM__ROLE__ROLE_DECODE) {
        decode_peer_broadcast(c, rk, false);
    } else {
        for (td_rrank_t *d = c->ranks; d; d = d->next)
            if (d->role == TANDEM__ROLE__ROLE_DECODE && d->conn && d->reg)
                decode_peer_send(rk, d, false);
    }
    capacity_changed(c);
}

static void
on_load(td_cluster_t *c, td_rrank_t *rk, const Tandem__Load *ld)
{
    td_rrank_load(rk, ld);
    td_trace("%s: load: kv used %llu free %llu, running %u, queued %u",
             td_ctl_conn_name(rk->conn), (unsigned long long)ld->kv_tokens_used,
             (unsigned long long)ld->kv_tokens_free, ld->running, ld->queued);
    capacity_changed(c);
}

/* A decode rank freed a request's row and blocks: room now, not at its
 * next Load (a Released of a decoded that does not say its tokens frees
 * the row only). */
static void
on_released(td_cluster_t *c, td_rrank_t *rk, const Tandem__Released *rel)
{
    td_debug("%s: request %016llx: blocks released", td_ctl_conn_name(rk->conn),
             (unsigned long long)rel->req_id);
    if (rk->role != TANDEM__ROLE__ROLE_DECODE)
        return;
    td_rrank_admit_freed(rk, rel->tokens);
    capacity_changed(c);
}

/* A prefill rank's CacheEvent: applied to its set of blocks; one that
 * cannot be trusted empties the set (logged here, the connection stays). */
static void
on_cache_event(td_rrank_t *rk, const Tandem__CacheEvent *ev)
{
    td_rcache_event_t e = { .seq = ev->seq, .cleared = ev->cleared, .added = ev->added,
                            .nadded = ev->n_added, .removed = ev->removed,
                            .nremoved = ev->n_removed };
    const char *why = "", *name = td_ctl_conn_name(rk->conn);
    unsigned long long seq = (unsigned long long)ev->seq;
    td_status_t st;

    if (td_rrank_cache_block(rk) == 0) {
        td_log_peer(&rk->log, TD_LOG_WARN, "%s: cache event from a rank "
                       "without a prefix cache (a %s rank, cache block tokens 0): ignored",
                       name, td_hello_role_str(rk->role));
        return;
    }
    st = td_rcache_apply(&rk->cache, &e, &why);
    if (st == TD_ERR_PROTO)
        td_log_peer(&rk->log, TD_LOG_WARN, "%s: cache event %llu malformed "
                       "(%s): its cache blocks forgotten", name, seq, why);
    else if (st == TD_ERR_TOO_BIG)
        td_log_peer(&rk->log, TD_LOG_WARN, "%s: more than %zu cache blocks "
                       "announced (cache-max-blocks): the rest are not tracked until its cache "
                       "is cleared", name, rk->cache.max);
    else if (st != TD_OK)
        td_log_peer(&rk->log, TD_LOG_WARN, "%s: cache event %llu: %s: its "
                       "cache blocks forgotten", name, seq, td_status_str(st));
    td_trace("%s: cache event %llu: cleared %d, +%zu -%zu, %zu blocks", name, seq, ev->cleared,
             ev->n_added, ev->n_removed, rk->cache.n);
}

static void
cache_flush_send(td_rrank_t *rk, const char *reason)
{
    Tandem__CacheFlush fl = TANDEM__CACHE_FLUSH__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    fl.reason = (char *)reason;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_CACHE_FLUSH;
    env.cache_flush = &fl;
    (void)td_rrank_send(rk, &env);
}

td_status_t
td_cluster_node_cache_flush(td_cluster_t *c, const char *name, const char *reason,
                            unsigned *sent)
{
    td_rrank_node_t *n = node_find(c, name);
    unsigned k = 0;

    if (!n)
        return TD_ERR_NOT_FOUND;
    for (td_rrank_t *rk = c->ranks; rk; rk = rk->next)
        if (rk->node == n && rk->conn && td_rrank_cache_block(rk) > 0) {
            cache_flush_send(rk, reason);
            k++;
        }
    td_info("node %s: cache flush sent to %u prefill ranks by the operator", n->name, k);
    *sent = k;
    return TD_OK;
}

/* ======================================================================= */
/* Fences (docs/decoded.md, "Fencing"): the router relays, keeps nothing     */
/* ======================================================================= */

static void
fenced_send(td_rrank_t *to, Tandem__Fenced *f)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_FENCED;
    env.fenced = f;
    (void)td_rrank_send(to, &env);
}

/* A decode rank's Fence (for its own transfers only): to the prefill rank
 * it names when that incarnation is connected; {gone} back at once when
 * another incarnation of that rank registered since; else nothing (the
 * decode rank asks again). */
static void
on_fence(td_cluster_t *c, td_rrank_t *rk, const Tandem__Fence *msg)
{
    Tandem__Fence fwd = *msg, *f = &fwd;   /* the message's strings stay its own */
    td_rrank_t *p;

    if (rk->role != TANDEM__ROLE__ROLE_DECODE || f->decode_incarnation != rk->incarnation ||
        f->decode_rank != rk->rank_id) {
        td_log_peer(&rk->log, TD_LOG_WARN, "%s: fence for another rank's transfers ignored",
                    td_ctl_conn_name(rk->conn));
        return;
    }
    fwd.decode_node = rk->node->name;
    p = rank_find(c, f->prefill_node ? f->prefill_node : "", f->prefill_rank,
                  TANDEM__ROLE__ROLE_PREFILL);
    if (p == NULL || p->incarnation == 0)
        return;
    if (p->incarnation == f->prefill_incarnation) {
        if (p->conn != NULL && p->reg != NULL) {
            Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
            env.payload_case = TANDEM__ENVELOPE__PAYLOAD_FENCE;
            env.fence = f;
            (void)td_rrank_send(p, &env);
        }
        return;
    }
    Tandem__Fenced ans = TANDEM__FENCED__INIT;
    ans.prefill_node = p->node->name;
    ans.prefill_rank = f->prefill_rank;
    ans.prefill_incarnation = f->prefill_incarnation;
    ans.decode_node = f->decode_node;
    ans.decode_rank = f->decode_rank;
    ans.decode_incarnation = f->decode_incarnation;
    ans.n_xfer_ids = f->n_xfer_ids;
    ans.xfer_ids = f->xfer_ids;
    ans.gone = true;
    td_info("prefill rank %s/%u: incarnation %016llx gone (now %016llx): %zu transfers of "
            "decode rank %s/%u fenced", p->node->name, p->rank_id,
            (unsigned long long)f->prefill_incarnation, (unsigned long long)p->incarnation,
            f->n_xfer_ids, rk->node->name, rk->rank_id);
    fenced_send(rk, &ans);
}

/* A prefill rank's Fenced (for its own transfers: named from its
 * connection) to the decode rank it names, when connected. */
static void
on_fenced(td_cluster_t *c, td_rrank_t *rk, const Tandem__Fenced *msg)
{
    Tandem__Fenced fwd = *msg, *f = &fwd;   /* the message's strings stay its own */
    td_rrank_t *d;

    if (rk->role != TANDEM__ROLE__ROLE_PREFILL || f->gone)
        return;
    fwd.prefill_node = rk->node->name;
    fwd.prefill_rank = rk->rank_id;
    fwd.prefill_incarnation = rk->incarnation;
    d = rank_find(c, f->decode_node ? f->decode_node : "", f->decode_rank,
                  TANDEM__ROLE__ROLE_DECODE);
    if (d != NULL && d->incarnation == f->decode_incarnation && d->conn != NULL)
        fenced_send(d, f);
}

static void
cluster_on_message(td_ctl_conn_t *conn, const Tandem__Envelope *env, void *arg)
{
    td_cluster_t *c = arg;
    td_rrank_t *rk = rank_by_conn(c, conn);
    const Tandem__Hello *peer = td_ctl_conn_peer(conn);

    if (!rk && peer && peer->role == TANDEM__ROLE__ROLE_TOOL) {
        if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_DOMAIN_JOIN)
            td_rdomain_join(c->domains, conn, env->domain_join);
        else
            td_ctl_conn_close(conn, TANDEM__REJECT_CODE__REJECT_PROTO,
                              "a tool connection sends a router DomainJoin only");
        return;
    }
    if (!rk)
        return;   /* being replaced or removed */
    if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_REGISTER) {
        on_register(c, rk, env->register_);
        return;
    }
    if (!rk->reg) {
        td_ctl_conn_close(conn, TANDEM__REJECT_CODE__REJECT_PROTO,
                          "message before Register");
        return;
    }
    switch (env->payload_case) {
    case TANDEM__ENVELOPE__PAYLOAD_LOAD:
        on_load(c, rk, env->load);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_CACHE_EVENT:
        on_cache_event(rk, env->cache_event);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_RELEASED:
        on_released(c, rk, env->released);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_FENCE:
        on_fence(c, rk, env->fence);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_FENCED:
        on_fenced(c, rk, env->fenced);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_ADMIT_OK:
    case TANDEM__ENVELOPE__PAYLOAD_ADMIT_REJECT:
    case TANDEM__ENVELOPE__PAYLOAD_PREFILL_DONE:
    case TANDEM__ENVELOPE__PAYLOAD_TOKENS:
    case TANDEM__ENVELOPE__PAYLOAD_FORGET:
        if (c->h.on_message)
            c->h.on_message(c, rk, env, c->h.arg);
        break;
    default: {
        char why[64];
        snprintf(why, sizeof why, "unexpected message for a router (payload %d)",
                 (int)env->payload_case);
        td_ctl_conn_close(conn, TANDEM__REJECT_CODE__REJECT_PROTO, why);
        break;
    }
    }
}

static void
cluster_on_closed(td_ctl_conn_t *conn, td_status_t why, const char *reason, void *arg)
{
    td_cluster_t *c = arg;
    td_rrank_t *rk = rank_by_conn(c, conn);

    if (rk)
        rank_lost(c, rk, "connection ended", true);
    else
        td_rdomain_conn_gone(c->domains, conn);
}

/* ======================================================================= */
/* Life                                                                      */
/* ======================================================================= */

td_status_t
td_cluster_init(td_cluster_t *c, struct event_base *base, const td_cluster_config_t *cfg,
                const td_cluster_handlers_t *h)
{
    td_ctl_handlers_t ch = {
        .on_established = cluster_on_established,
        .on_message = cluster_on_message,
        .on_closed = cluster_on_closed,
        .arg = c,
    };

    memset(c, 0, sizeof *c);
    c->h = *h;
    snprintf(c->router_id, sizeof c->router_id, "%s", cfg->router_id);
    c->cache_max_blocks = cfg->cache_max_blocks;
    if (td_rdomain_table_create(&c->domains) != TD_OK) {
        td_error("cluster: out of memory");
        return TD_ERR_NOMEM;
    }
    return td_ctl_listener_create(base, &cfg->ctl, &ch, cfg->host, cfg->port, &c->lst);
}

void
td_cluster_fini(td_cluster_t *c)
{
    if (c->lst)
        td_ctl_listener_destroy(c->lst);
    c->lst = NULL;
    td_rdomain_table_destroy(c->domains);   /* after the connections it named */
    c->domains = NULL;
    while (c->ranks) {
        td_rrank_t *rk = c->ranks;
        c->ranks = rk->next;
        rank_free(rk);
    }
    while (c->nodes) {
        td_rrank_node_t *n = c->nodes;
        c->nodes = n->next;
        free(n);
    }
}

uint16_t
td_cluster_port(const td_cluster_t *c)
{
    return td_ctl_listener_port(c->lst);
}
