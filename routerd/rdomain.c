/* routerd/rdomain.c — the decode domains being assembled through this router:
 * DomainJoin held per id and rank on its connection, DomainPeers to every
 * member once the id is whole, DomainRefused for what cannot be held.
 * docs/dep.md, "A domain across processes". */
#include "rdomain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "domjoin.h"
#include "hello.h"
#include "log.h"

/* One rank's join: held while its connection lives. */
typedef struct {
    td_ctl_conn_t *conn;          /* NULL: the rank has not joined */
    uint64_t incarnation;
    ProtobufCBinaryData address;  /* own copy */
} rdomain_member_t;

typedef struct rdomain_s {
    struct rdomain_s *next;
    char id[TD_DOMJOIN_ID_MAX + 1];
    uint32_t size;                /* from its first join; every other must agree */
    uint32_t joined;
    rdomain_member_t *members;    /* [size], index = domain rank */
} rdomain_t;

struct td_rdomain_table_s {
    rdomain_t *domains;
    size_t held;                  /* joins, over every domain */
    uint64_t rounds;              /* domains made whole so far */
};

td_status_t
td_rdomain_table_create(td_rdomain_table_t **out)
{
    td_rdomain_table_t *t = calloc(1, sizeof(*t));

    if (t == NULL)
        return TD_ERR_NOMEM;
    *out = t;
    return TD_OK;
}

static void
rdomain_free(rdomain_t *d)
{
    for (uint32_t r = 0; r < d->size; r++)
        free(d->members[r].address.data);
    free(d->members);
    free(d);
}

/* Take d out of the table's list (its joins are no longer counted). */
static void
rdomain_unlink(td_rdomain_table_t *t, rdomain_t *d)
{
    for (rdomain_t **p = &t->domains; *p != NULL; p = &(*p)->next)
        if (*p == d) {
            *p = d->next;
            t->held -= d->joined;
            return;
        }
}

void
td_rdomain_table_destroy(td_rdomain_table_t *t)
{
    if (t == NULL)
        return;
    while (t->domains != NULL) {
        rdomain_t *d = t->domains;
        t->domains = d->next;
        rdomain_free(d);
    }
    free(t);
}

static rdomain_t *
rdomain_find(td_rdomain_table_t *t, const char *id)
{
    for (rdomain_t *d = t->domains; d != NULL; d = d->next)
        if (strcmp(d->id, id) == 0)
            return d;
    return NULL;
}

/* The member conn holds, in *d_out. */
static rdomain_member_t *
rdomain_member_by_conn(td_rdomain_table_t *t, const td_ctl_conn_t *conn, rdomain_t **d_out,
                       uint32_t *rank_out)
{
    for (rdomain_t *d = t->domains; d != NULL; d = d->next)
        for (uint32_t r = 0; r < d->size; r++)
            if (d->members[r].conn == conn) {
                *d_out = d;
                *rank_out = r;
                return &d->members[r];
            }
    return NULL;
}

/* Refuse j: logged, DomainRefused{reason}, the connection closed. */
static void
rdomain_refuse(td_ctl_conn_t *conn, const Tandem__DomainJoin *j, const char *reason)
{
    Tandem__DomainRefused ref = TANDEM__DOMAIN_REFUSED__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    char id[TD_DOMJOIN_ID_MAX + 8];
    const char *raw = j->domain_id ? j->domain_id : "";

    td_hello_printable(id, sizeof(id), raw, strlen(raw));
    td_warn("dep domain %s: join of rank %u from %s refused: %s", id, j->rank,
            td_ctl_conn_name(conn), reason);
    ref.domain_id = id;
    ref.rank = j->rank;
    ref.reason = (char *)reason;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_DOMAIN_REFUSED;
    env.domain_refused = &ref;
    (void)td_ctl_conn_send(conn, &env);   /* a failure was logged by the connection */
    td_ctl_conn_close(conn, TANDEM__REJECT_CODE__REJECT_PROTO, reason);
}

/* d is whole: every member gets the same DomainPeers; d leaves the table
 * first (a member's connection may end while it is sent to). */
static void
rdomain_deliver(td_rdomain_table_t *t, rdomain_t *d)
{
    Tandem__DomainPeers dp = TANDEM__DOMAIN_PEERS__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    ProtobufCBinaryData *addrs = calloc(d->size, sizeof(*addrs));
    uint64_t *incs = calloc(d->size, sizeof(*incs));
    uint32_t sent = 0;

    rdomain_unlink(t, d);
    t->rounds++;
    if (addrs == NULL || incs == NULL) {
        td_error("dep domain %s: out of memory for its peers: its ranks wait out their "
                 "deadline", d->id);
        goto out;
    }
    for (uint32_t r = 0; r < d->size; r++) {
        addrs[r] = d->members[r].address;
        incs[r] = d->members[r].incarnation;
    }
    dp.domain_id = d->id;
    dp.size = d->size;
    dp.n_addresses = d->size;
    dp.addresses = addrs;
    dp.n_incarnations = d->size;
    dp.incarnations = incs;
    dp.round = t->rounds;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_DOMAIN_PEERS;
    env.domain_peers = &dp;
    for (uint32_t r = 0; r < d->size; r++)
        if (td_ctl_conn_send(d->members[r].conn, &env) == TD_OK)   /* else logged there */
            sent++;
    td_info("dep domain %s: all %u ranks joined: every rank's address sent to %u of them "
            "(round %llu)", d->id, d->size, sent, (unsigned long long)t->rounds);
out:
    free(addrs);
    free(incs);
    rdomain_free(d);
}

void
td_rdomain_join(td_rdomain_table_t *t, td_ctl_conn_t *conn, const Tandem__DomainJoin *j)
{
    const Tandem__Hello *hello = td_ctl_conn_peer(conn);
    const char *why = NULL;
    char reason[256];
    rdomain_t *d = NULL, *mine;
    uint32_t mrank;

    if (!td_domjoin_valid(j, &why))
        goto refuse;
    if (hello == NULL || j->incarnation != hello->incarnation) {
        why = "incarnation other than the connection's";
        goto refuse;
    }
    why = reason;
    if (rdomain_member_by_conn(t, conn, &mine, &mrank) != NULL) {
        snprintf(reason, sizeof(reason), "this connection already joined (domain %s rank %u)",
                 mine->id, mrank);
        goto refuse;
    }
    d = rdomain_find(t, j->domain_id);
    if (d != NULL && d->size != j->size) {
        snprintf(reason, sizeof(reason), "size %u, but the domain's other joins say %u",
                 j->size, d->size);
        goto refuse;
    }
    if (d != NULL && d->members[j->rank].conn != NULL) {
        const rdomain_member_t *m = &d->members[j->rank];
        snprintf(reason, sizeof(reason), "rank %u is held by %s (incarnation %016llx), still "
                 "connected", j->rank, td_ctl_conn_name(m->conn),
                 (unsigned long long)m->incarnation);
        goto refuse;
    }
    why = "router out of memory";
    if (t->held >= TD_RDOMAIN_HELD_MAX) {
        why = "the router holds too many domain joins";
        goto refuse;
    }
    if (d == NULL) {
        if ((d = calloc(1, sizeof(*d))) == NULL)
            goto refuse;
        if ((d->members = calloc(j->size, sizeof(*d->members))) == NULL) {
            free(d);
            goto refuse;
        }
        snprintf(d->id, sizeof(d->id), "%s", j->domain_id);
        d->size = j->size;
        d->next = t->domains;
        t->domains = d;
    }
    rdomain_member_t *m = &d->members[j->rank];
    if ((m->address.data = malloc(j->address.len)) == NULL) {
        if (d->joined == 0) {
            rdomain_unlink(t, d);
            rdomain_free(d);
        }
        goto refuse;
    }
    memcpy(m->address.data, j->address.data, j->address.len);
    m->address.len = j->address.len;
    m->conn = conn;
    m->incarnation = j->incarnation;
    d->joined++;
    t->held++;
    td_info("dep domain %s: rank %u of %u joined from %s (incarnation %016llx): %u of %u", d->id,
            j->rank, d->size, td_ctl_conn_name(conn), (unsigned long long)j->incarnation,
            d->joined, d->size);
    if (d->joined == d->size)
        rdomain_deliver(t, d);
    return;

refuse:
    rdomain_refuse(conn, j, why);
}

void
td_rdomain_conn_gone(td_rdomain_table_t *t, const td_ctl_conn_t *conn)
{
    rdomain_t *d;
    uint32_t r;
    rdomain_member_t *m = rdomain_member_by_conn(t, conn, &d, &r);

    if (m == NULL)
        return;
    free(m->address.data);
    *m = (rdomain_member_t){ 0 };
    d->joined--;
    t->held--;
    td_info("dep domain %s: rank %u left before the domain was whole (connection ended): %u "
            "of %u joined", d->id, r, d->joined, d->size);
    if (d->joined == 0) {
        rdomain_unlink(t, d);
        rdomain_free(d);
    }
}

size_t
td_rdomain_held(const td_rdomain_table_t *t)
{
    return t->held;
}

uint64_t
td_rdomain_rounds(const td_rdomain_table_t *t)
{
    return t->rounds;
}
