/* engine/synthetic/synthetic.h — the synthetic engine: not a model, a deterministic
 * stand-in for load tests and cluster simulation. Its tokens and KV bytes are
 * keyed hashes of the token prefix (docs/engine.md gives the exact spec), so a
 * receiver verifies every byte and a test computes the output on its own; a
 * cost model sets its speed. */
#ifndef TD_SYNTHETIC_H
#define TD_SYNTHETIC_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "layout.h"
#include "status.h"

typedef struct td_engine td_engine_t;
typedef struct td_engine_req td_engine_req_t;

#define TD_SYNTH_NAME "synthetic"
#define TD_SYNTH_KIND "synthetic (not a model: keyed-hash tokens and KV)"
#define TD_SYNTH_CANDIDATES 8   /* tokens with a finite logit at each position */

typedef struct {
    uint64_t key;            /* the hash key: different keys, different "models" */
    uint64_t vocab;
    uint64_t max_context;
    double prefill_us;       /* µs per prefill token per layer */
    double step_us;          /* µs per decode step */
    double row_us;           /* µs per decode batch row */
    td_layout_config_t layout;
} td_synth_config_t;

#define TD_SYNTH_CONFIG_OPTS(st, m)                                                \
    TD_CONFIG_OPT_UINT64("synth-key", st, m.key, "4096", 0, 0,                     \
                         "synthetic engine: key of its token and kv hashes"),      \
    TD_CONFIG_OPT_UINT64("synth-vocab", st, m.vocab, "129280", 2, 1u << 30,        \
                         "synthetic engine: vocabulary size"),                     \
    TD_CONFIG_OPT_UINT64("synth-max-context", st, m.max_context, "1048576", 1, 1ull << 32, \
                         "synthetic engine: longest sequence in tokens"),          \
    TD_CONFIG_OPT_DOUBLE("synth-prefill-us", st, m.prefill_us, "0", 0, 1e6,        \
                         "synthetic engine: modeled us per prefill token per layer (0: flat out)"), \
    TD_CONFIG_OPT_DOUBLE("synth-step-us", st, m.step_us, "0", 0, 1e7,              \
                         "synthetic engine: modeled us per decode step"),          \
    TD_CONFIG_OPT_DOUBLE("synth-row-us", st, m.row_us, "0", 0, 1e6,                \
                         "synthetic engine: modeled us per decode batch row"),     \
    TD_LAYOUT_CONFIG_OPTS(st, m.layout)

/* Create a synthetic engine (copies what it needs from cfg). */
td_status_t td_synth_create(const td_synth_config_t *cfg, td_engine_t **out);

/* Fill buf with the bytes of entries [first, first + count) of segment seg as
 * they are for req's current sequence (a paged entry must be complete; a fixed
 * segment is asked for whole). req must belong to a synthetic engine. */
td_status_t td_synth_kv_expect(td_engine_req_t *req, uint32_t seg, uint64_t first,
                               uint64_t count, void *buf);

/* Check received bytes against td_synth_kv_expect: TD_OK when every byte is
 * right, else TD_ERR_MISMATCH and *bad = offset of the first wrong byte in
 * data (the caller logs; a peer's bytes are not an invariant). */
td_status_t td_synth_kv_verify(td_engine_req_t *req, uint32_t seg, uint64_t first,
                               uint64_t count, const void *data, uint64_t *bad);

#endif
