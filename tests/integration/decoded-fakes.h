/* tests/integration/decoded-fakes.h — what the decoded tests share: the
 * small synthetic engine every side uses, a fake router that records what a
 * decode rank sends, a fake prefill rank that pushes real KV over UCX, the
 * engine's own expectation of a token stream, and loop/socket helpers. */
#ifndef TD_DECODED_FAKES_H
#define TD_DECODED_FAKES_H

#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "kvmem.h"
#include "../unit/testutil.h"
#include "engine.h"
#include "kvsum.h"
#include "registry.h"
#include "tandem.pb-c.h"
#include "xfer.h"

#define P_INC       0x9e9e9e9eull   /* the fake prefill's incarnation */
#define DEADLINE_MS 300u            /* transfer deadline */
#define GRACE_MARGIN_MS 100u        /* grace = 2 × DEADLINE_MS + it = 700 ms */
#define GRACE_MS (2 * DEADLINE_MS + GRACE_MARGIN_MS)
#define TLS         "shm,self"
#define MAX_MSGS    8192
/* The engine options fk_engine() uses, for a decoded command line. */
#define FK_ENGINE_ARGS "--kv-layers=4", "--kv-sources=1:2,2:1", "--kv-entry-bytes=40", \
    "--kv-index-entry-bytes=12", "--kv-window=8", "--kv-window-entry-bytes=24",          \
    "--kv-partial-entry-bytes=16", "--kv-block-entries=4", "--synth-vocab=1000",         \
    "--synth-max-context=4096"

/* Failed checks inside the fakes; a test adds them to its own count. */
extern int fk_failures;

td_engine_t *fk_engine(void);

/* ---- Fake router: every message, deep-copied ---- */
typedef struct {
    Tandem__Envelope *msgs[MAX_MSGS];
    size_t n;
    Tandem__Load load;
    int loads;
    int fail_sends;
} fk_router_t;

/* td_drank_io_t callbacks (router must be the fk_router_t itself). */
td_status_t fk_router_send(void *router, const Tandem__Envelope *env, void *arg);
void fk_router_load(const Tandem__Load *load, void *arg);
/* td_drank_io_t's broadcast: recorded in arg (the fk_router_t). */
void fk_router_broadcast(const Tandem__Envelope *env, void *arg);
/* Record a copy of env (also for a fake router on a control connection). */
void fk_router_record(fk_router_t *rt, const Tandem__Envelope *env);
void fk_router_clear(fk_router_t *rt);
/* The first AdmitOk / AdmitReject / Tokens / Released of request id, or
 * the first Fence naming transfer id. */
const Tandem__Envelope *fk_router_find(const fk_router_t *rt, Tandem__Envelope__PayloadCase pc,
                                       uint64_t id);
/* Tokens of request id in order; *finish = the last finish, *error its error. */
size_t fk_router_tokens(const fk_router_t *rt, uint64_t id, int32_t *out, size_t max,
                        int *finish, const char **error);

/* ---- The loop ---- */
void fk_tick(evutil_socket_t fd, short what, void *arg);
typedef int (*fk_pred_fn)(void *arg);
/* Run the loop until pred or timeout; returns pred's last value. */
int fk_run_until(struct event_base *base, fk_pred_fn pred, void *arg, uint64_t timeout_ms);
int fk_never(void *arg);
typedef struct {
    fk_router_t *rt;
    Tandem__Envelope__PayloadCase pc;
    uint64_t id;
} fk_wait_msg_t;
int fk_wait_msg(struct event_base *base, fk_router_t *rt, Tandem__Envelope__PayloadCase pc,
                uint64_t id, uint64_t timeout_ms);

/* ---- Fake prefill rank ---- */
typedef struct {
    td_xfer_t *x;
    td_xfer_peer_t *peer;
    const Tandem__KvDest *dest;
    const td_layout_t *layout;
    uint8_t *bufs[256];     /* staged piece bytes, alive until the end */
    size_t nbufs;
    /* Faults, each cleared once done: */
    int corrupt;            /* flip one byte of the first paged piece in flight (after
                               the checksum took it) */
    int corrupt_src;        /* flip it before the checksum: wrong KV, right sum */
    int bad_sum;            /* send a wrong checksum in the next KvNote */
    td_kvsum_t *sum;        /* of the push in progress (engine/kvsum.h) */
    int inflight;
    int failed;
} fk_p_t;
/* A fake prefill of incarnation P_INC (fk_p_create_inc: p_inc) with an
 * endpoint to the decode rank of d_inc that reg describes. */
td_status_t fk_p_create(struct event_base *base, const Tandem__Register *reg, uint64_t d_inc,
                        const td_layout_t *layout, fk_p_t *fp);
td_status_t fk_p_create_inc(struct event_base *base, const Tandem__Register *reg,
                            uint64_t d_inc, uint64_t p_inc, const td_layout_t *layout,
                            fk_p_t *fp);
void fk_p_destroy(fk_p_t *fp);
/* Prefill prompt into dest (every layer's pieces, one transfer each); with
 * `terminal` post the KvNote (canceled, or the first token and the checksum
 * of the pieces as the engine gave them). Returns the first token. */
/* The transfer token a decode rank put in its KvDest (all zeros when it is
 * not 16 bytes: the rank then drops the notes, as it would anyone's). */
const td_xfer_token_t *fk_dest_token(const Tandem__KvDest *dest);

int32_t fk_p_push(fk_p_t *fp, td_engine_t *e, const Tandem__KvDest *dest, uint64_t id,
                  const int32_t *prompt, size_t n, uint32_t max_tokens, int terminal,
                  int canceled);

/* What the engine says the greedy stream is: the first token, then steps. */
size_t fk_expect(td_engine_t *e, const int32_t *prompt, size_t n, uint32_t max_tokens,
                 int32_t *out);
void fk_prompt(int32_t *p, size_t n, int32_t seed);

/* An Admit of request id for prompt from the fake prefill ("fake-p", P_INC),
 * ready to send as adm->env; it points into adm and at prompt. */
typedef struct {
    Tandem__Sampling s;
    Tandem__Admit a;
    Tandem__Envelope env;
} fk_admit_t;
void fk_admit_init(fk_admit_t *adm, uint64_t id, const int32_t *prompt, size_t n,
                   uint32_t max_tokens);

/* ---- Framed envelopes over a socket (u32 host-order length + packed) ---- */
int fk_env_send(int fd, const Tandem__Envelope *env);
Tandem__Envelope *fk_env_recv(int fd);

#endif
