/* engine/synthetic/synthetic.h — the synthetic engine: not a model, a deterministic
 * stand-in for load tests and cluster simulation. Its tokens and KV bytes are
 * keyed hashes of the token prefix (docs/engine.md gives the exact spec), so a
 * receiver verifies every byte and a test computes the output on its own; a
 * cost model sets its speed: flat per-token costs, or the GPU cost model
 * (sim/gpucost.h) of a model config on a GPU profile. */
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
    char *gpu_profile;       /* a GPU profile (gpucost.h); "" or NULL: the costs above */
    char *gpu_model;         /* the config.json the GPU cost model reads */
    uint64_t gpu_ranks;      /* GPUs of the DEP group / decode domain it models */
    double time_dilation;    /* the GPU cost model's times are slept x this */
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
    TD_CONFIG_OPT_STRING("synth-gpu-profile", st, m.gpu_profile, "",               \
                         "synthetic engine: a GPU profile (deploy/profiles/*.json): sleep the GPU cost model's times instead of the synth-*-us costs"), \
    TD_CONFIG_OPT_STRING("synth-gpu-model", st, m.gpu_model, "",                   \
                         "synthetic engine: the model config.json the GPU cost model reads (with synth-gpu-profile)"), \
    TD_CONFIG_OPT_UINT64("synth-gpu-ranks", st, m.gpu_ranks, "1", 1, 65536,        \
                         "synthetic engine: GPUs of the DEP group or decode domain the GPU cost model assumes"), \
    TD_CONFIG_OPT_DOUBLE("time-dilation", st, m.time_dilation, "1", 0, 1e6,        \
                         "synthetic engine: the GPU cost model's times are slept times this (0: flat out)"), \
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
