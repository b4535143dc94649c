/* net/domjoin.c — a decode domain's address exchange through a router:
 * DomainJoin's checks, and the client a domain rank runs (its own control
 * connection and event base, DomainJoin, wait for DomainPeers, close).
 * docs/dep.md, "A domain across processes". */
#include "domjoin.h"

#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "fsm.h"
#include "hello.h"
#include "link.h"
#include "log.h"

#define DOMJOIN_RETRY_MS 200u   /* between rounds over the router list */

bool
td_domjoin_valid(const Tandem__DomainJoin *j, const char **why)
{
    const char *id = j->domain_id ? j->domain_id : "";
    size_t n = strlen(id);

    for (size_t i = 0; i < n; i++)
        if (id[i] < ' ' || id[i] > '~')
            n = 0;
    if (n == 0 || n > TD_DOMJOIN_ID_MAX)
        *why = "domain id must be 1..64 printable bytes";
    else if (j->size == 0 || j->size > TD_DOMJOIN_SIZE_MAX)
        *why = "domain size must be 1..256";
    else if (j->rank >= j->size)
        *why = "rank outside the domain";
    else if (j->address.len == 0 || j->address.len > TD_DOMJOIN_ADDR_MAX)
        *why = "address must be 1..8192 bytes";
    else
        return true;
    return false;
}

/* ---- The client ------------------------------------------------------------ */

/* One rank's join: which router it is at and how far it got. */
typedef enum {
    DOMJOIN_CONNECTING = 0,   /* handshake with routers[at] */
    DOMJOIN_WAITING,          /* DomainJoin sent there; waiting for DomainPeers */
    DOMJOIN_PAUSED,           /* every router tried: the retry timer runs */
    DOMJOIN_DONE,             /* result is set */
} domjoin_state_t;

static const char *const domjoin_state_names[] = {
    [DOMJOIN_CONNECTING] = "connecting", [DOMJOIN_WAITING] = "waiting",
    [DOMJOIN_PAUSED] = "paused", [DOMJOIN_DONE] = "done",
};

static const uint32_t domjoin_state_next[] = {
    [DOMJOIN_CONNECTING] = TD_FSM_BIT(DOMJOIN_CONNECTING) | TD_FSM_BIT(DOMJOIN_WAITING) |
                           TD_FSM_BIT(DOMJOIN_PAUSED) | TD_FSM_BIT(DOMJOIN_DONE),
    [DOMJOIN_WAITING] = TD_FSM_BIT(DOMJOIN_PAUSED) | TD_FSM_BIT(DOMJOIN_DONE),
    [DOMJOIN_PAUSED] = TD_FSM_BIT(DOMJOIN_CONNECTING) | TD_FSM_BIT(DOMJOIN_DONE),
    [DOMJOIN_DONE] = 0,
};

static const td_fsm_t domjoin_fsm = { "dep domain join", domjoin_state_names,
                                      domjoin_state_next, 4 };

typedef struct {
    const td_domjoin_config_t *cfg;
    const void *addr;
    size_t len;
    struct event_base *base;
    td_link_addr_t *routers;   /* [nrouters] */
    size_t nrouters, at;
    td_ctl_conn_t *conn;       /* to routers[at]; NULL when none */
    struct event *retry, *deadline;
    domjoin_state_t state;
    td_status_t result;        /* when DONE */
    void **addrs;              /* the caller's [size], filled on TD_OK */
    size_t *lens;
} domjoin_t;

static void
domjoin_set_state(domjoin_t *j, domjoin_state_t to)
{
    j->state = td_fsm_step(&domjoin_fsm, j->cfg->rank, j->state, to, j->cfg->id);
}

static void
domjoin_done(domjoin_t *j, td_status_t st)
{
    domjoin_set_state(j, DOMJOIN_DONE);
    j->result = st;
    event_base_loopbreak(j->base);
}

static void domjoin_try(domjoin_t *j);

/* The connection to routers[at] ended or failed: the next router, or, past
 * the last, the list again after a pause. */
static void
domjoin_next(domjoin_t *j)
{
    struct timeval tv = td_ctl_timeval_ms(DOMJOIN_RETRY_MS);

    if (++j->at < j->nrouters) {
        domjoin_try(j);
        return;
    }
    j->at = 0;
    domjoin_set_state(j, DOMJOIN_PAUSED);
    if (evtimer_add(j->retry, &tv) != 0)
        domjoin_done(j, TD_ERR_NOMEM);
}

/* DomainPeers: for this domain, this size, every rank's address within
 * bounds, and ours where ours should be. Copied into the caller's arrays. */
static void
domjoin_on_peers(domjoin_t *j, const Tandem__DomainPeers *p)
{
    const td_domjoin_config_t *c = j->cfg;
    uint32_t n = c->size;
    const char *why = NULL;

    if (p->domain_id == NULL || strcmp(p->domain_id, c->id) != 0 || p->size != n)
        why = "another domain or size";
    else if (p->n_addresses != n || p->n_incarnations != n)
        why = "not one address and incarnation per rank";
    else if (p->addresses[c->rank].len != j->len ||
             memcmp(p->addresses[c->rank].data, j->addr, j->len) != 0 ||
             p->incarnations[c->rank] != c->ctl.ident.incarnation)
        why = "our own rank's address is not ours";
    for (uint32_t r = 0; why == NULL && r < n; r++)
        if (p->addresses[r].len == 0 || p->addresses[r].len > TD_DOMJOIN_ADDR_MAX)
            why = "an address out of bounds";
    if (why != NULL) {
        td_error("dep domain %s: rank %u: router %s sent a malformed DomainPeers (%s)", c->id,
                 c->rank, j->routers[j->at].name, why);
        domjoin_done(j, TD_ERR_PROTO);
        return;
    }
    for (uint32_t r = 0; r < n; r++) {
        if ((j->addrs[r] = malloc(p->addresses[r].len)) == NULL) {
            for (uint32_t k = 0; k < r; k++) {
                free(j->addrs[k]);
                j->addrs[k] = NULL;
            }
            td_error("dep domain %s: rank %u: out of memory", c->id, c->rank);
            domjoin_done(j, TD_ERR_NOMEM);
            return;
        }
        memcpy(j->addrs[r], p->addresses[r].data, p->addresses[r].len);
        j->lens[r] = p->addresses[r].len;
    }
    td_info("dep domain %s: rank %u: every rank's address from router %s (round %llu)", c->id,
            c->rank, j->routers[j->at].name, (unsigned long long)p->round);
    domjoin_done(j, TD_OK);
}

static void
domjoin_on_established(td_ctl_conn_t *conn, const Tandem__Hello *peer, void *arg)
{
    domjoin_t *j = arg;
    const td_domjoin_config_t *c = j->cfg;
    Tandem__DomainJoin dj = TANDEM__DOMAIN_JOIN__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    td_status_t st;

    (void)peer;
    dj.domain_id = (char *)c->id;
    dj.size = c->size;
    dj.rank = c->rank;
    dj.incarnation = c->ctl.ident.incarnation;
    dj.address = (ProtobufCBinaryData){ j->len, (uint8_t *)j->addr };
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_DOMAIN_JOIN;
    env.domain_join = &dj;
    if ((st = td_ctl_conn_send(conn, &env)) != TD_OK) {
        td_error("dep domain %s: rank %u: cannot send DomainJoin to router %s: %s", c->id,
                 c->rank, j->routers[j->at].name, td_status_str(st));
        domjoin_done(j, st);
        return;
    }
    domjoin_set_state(j, DOMJOIN_WAITING);
    td_info("dep domain %s: rank %u of %u: joined at router %s; waiting for the other ranks",
            c->id, c->rank, c->size, j->routers[j->at].name);
}

static void
domjoin_on_message(td_ctl_conn_t *conn, const Tandem__Envelope *env, void *arg)
{
    domjoin_t *j = arg;
    char reason[TD_HELLO_REASON_MAX];

    (void)conn;
    if (j->state != DOMJOIN_WAITING)
        return;
    switch (env->payload_case) {
    case TANDEM__ENVELOPE__PAYLOAD_DOMAIN_PEERS:
        domjoin_on_peers(j, env->domain_peers);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_DOMAIN_REFUSED: {
        const char *r = env->domain_refused->reason ? env->domain_refused->reason : "";
        td_hello_printable(reason, sizeof(reason), r, strlen(r));
        td_error("dep domain %s: rank %u: router %s refused the join: %s", j->cfg->id,
                 j->cfg->rank, j->routers[j->at].name, reason);
        domjoin_done(j, TD_ERR_PEER);
        break;
    }
    default:
        break;   /* nothing else is for a domain connection */
    }
}

static void
domjoin_on_closed(td_ctl_conn_t *conn, td_status_t why, const char *reason, void *arg)
{
    domjoin_t *j = arg;
    domjoin_state_t was = j->state;

    td_ctl_conn_destroy(conn);
    j->conn = NULL;
    if (was == DOMJOIN_DONE)
        return;   /* the Reject after a DomainRefused */
    if (why == TD_ERR_PEER && was == DOMJOIN_WAITING) {
        /* a Reject on the join: a routerd that does not know the message
         * refuses it as a malformed frame */
        td_error("dep domain %s: rank %u: router %s closed the connection on the join (%s): a "
                 "routerd older than this decoded does not know DomainJoin; upgrade it, or "
                 "exchange the addresses through --domain-dir", j->cfg->id, j->cfg->rank,
                 j->routers[j->at].name, reason);
        domjoin_done(j, TD_ERR_UNSUPPORTED);
        return;
    }
    if (was == DOMJOIN_WAITING) {
        td_warn("dep domain %s: rank %u: router %s lost while waiting (%s): joining again",
                j->cfg->id, j->cfg->rank, j->routers[j->at].name, reason);
        j->at = j->nrouters;   /* from the first router, after a pause */
    }
    domjoin_next(j);
}

/* Connect to routers[at]. */
static void
domjoin_try(domjoin_t *j)
{
    td_ctl_handlers_t h = { domjoin_on_established, domjoin_on_message, domjoin_on_closed, j };

    domjoin_set_state(j, DOMJOIN_CONNECTING);
    if (td_ctl_conn_connect_addrs(j->base, &j->cfg->ctl, &h, &j->routers[j->at].addrs,
                                  &j->conn) != TD_OK) {
        j->conn = NULL;
        domjoin_next(j);
    }
}

static void
domjoin_on_retry(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    domjoin_try(arg);
}

static void
domjoin_on_deadline(evutil_socket_t fd, short what, void *arg)
{
    domjoin_t *j = arg;

    (void)fd;
    (void)what;
    if (j->state == DOMJOIN_DONE)
        return;
    if (j->state == DOMJOIN_WAITING)
        td_error("dep domain %s: rank %u: the domain's %u ranks did not all join at router %s "
                 "within %llu ms", j->cfg->id, j->cfg->rank, j->cfg->size,
                 j->routers[j->at].name, (unsigned long long)j->cfg->wait_ms);
    else
        td_error("dep domain %s: rank %u: no router of %s took the join within %llu ms",
                 j->cfg->id, j->cfg->rank, j->cfg->routers, (unsigned long long)j->cfg->wait_ms);
    domjoin_done(j, TD_ERR_TIMEOUT);
}

td_status_t
td_domjoin_run(const td_domjoin_config_t *cfg, const void *addr, size_t len, void **addrs,
               size_t *lens)
{
    domjoin_t j = { .cfg = cfg, .addr = addr, .len = len, .addrs = addrs, .lens = lens,
                    .result = TD_ERR_INTERNAL };
    struct timeval tv = td_ctl_timeval_ms(cfg->wait_ms > UINT32_MAX ? UINT32_MAX
                                                                    : (uint32_t)cfg->wait_ms);
    td_status_t st;

    if ((st = td_link_routers_resolve(cfg->routers, &j.routers, &j.nrouters)) != TD_OK)
        return st;   /* logged */
    st = TD_ERR_NOMEM;
    if ((j.base = event_base_new()) == NULL)
        goto err_free_routers;
    j.retry = evtimer_new(j.base, domjoin_on_retry, &j);
    j.deadline = evtimer_new(j.base, domjoin_on_deadline, &j);
    if (j.retry == NULL || j.deadline == NULL || evtimer_add(j.deadline, &tv) != 0)
        goto err_free_base;
    domjoin_try(&j);
    while (j.state != DOMJOIN_DONE)
        if (event_base_dispatch(j.base) < 0)
            break;
    st = j.state == DOMJOIN_DONE ? j.result : TD_ERR_INTERNAL;
    td_ctl_conn_destroy(j.conn);

err_free_base:
    if (st == TD_ERR_NOMEM && j.state != DOMJOIN_DONE)
        td_error("dep domain %s: rank %u: out of memory", cfg->id, cfg->rank);
    if (j.retry != NULL)
        event_free(j.retry);
    if (j.deadline != NULL)
        event_free(j.deadline);
    if (j.base != NULL)
        event_base_free(j.base);
err_free_routers:
    free(j.routers);
    return st;
}
