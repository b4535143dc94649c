/* base/rng.h — the one keyed mix and the one pseudo-random generator of the
 * tree: splitmix64's finalizer (td_rng_mix64), from which every keyed hash is
 * built (the synthetic engine's tokens and KV, the sampler's draws, request
 * ids), and splitmix64 as a seeded stream for tests, benchmarks and tools. */
#ifndef TD_RNG_H
#define TD_RNG_H

#include <stdint.h>

/* The golden-ratio increment of splitmix64. */
#define TD_RNG_GAMMA 0x9e3779b97f4a7c15ull

/* splitmix64's finalizer: a bijective mix of 64 bits. */
static inline uint64_t
td_rng_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A splitmix64 stream: the same seed gives the same numbers on every host. */
typedef struct {
    uint64_t state;
} td_rng_t;

static inline td_rng_t
td_rng_seed(uint64_t seed)
{
    td_rng_t r = { seed };

    return r;
}

static inline uint64_t
td_rng_next(td_rng_t *r)
{
    r->state += TD_RNG_GAMMA;
    return td_rng_mix64(r->state);
}

/* Uniform in [0, 1) with 53 bits. */
static inline double
td_rng_uniform(td_rng_t *r)
{
    return (double)(td_rng_next(r) >> 11) * 0x1.0p-53;
}

/* Uniform float in [lo, hi). */
static inline float
td_rng_range(td_rng_t *r, float lo, float hi)
{
    return lo + (hi - lo) * (float)td_rng_uniform(r);
}

#endif
