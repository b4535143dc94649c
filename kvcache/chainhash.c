/* kvcache/chainhash.c — the cache blocks' hash chain (chainhash.h): FNV-1a
 * over the seed's strings, then per block the previous hash and each token
 * through td_rng_mix64. */
#include "chainhash.h"

#include <string.h>

#include "rng.h"

uint64_t
td_chain_seed(const char *model_fingerprint, uint64_t layout_hash)
{
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a 64 */
    const char *tag = "tdchain1";

    for (const char *p = tag; *p != '\0'; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    for (const char *p = model_fingerprint != NULL ? model_fingerprint : ""; *p != '\0'; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    return td_rng_mix64(h ^ td_rng_mix64(layout_hash));
}

uint64_t
td_chain_hash(uint64_t prev, const int32_t *tokens, size_t n)
{
    uint64_t h = td_rng_mix64(prev ^ TD_RNG_GAMMA);

    for (size_t i = 0; i < n; i++)
        h = td_rng_mix64(h + TD_RNG_GAMMA * ((uint64_t)(uint32_t)tokens[i] + 1));
    h = td_rng_mix64(h ^ (uint64_t)n);
    return h != 0 ? h : 1;
}

size_t
td_chain_hashes(uint64_t seed, const int32_t *tokens, size_t ntokens, uint32_t block_tokens,
                uint64_t *out, size_t cap)
{
    size_t n = 0;
    uint64_t prev = seed;

    if (block_tokens == 0)
        return 0;
    while (n < cap && (n + 1) * (size_t)block_tokens <= ntokens) {
        prev = td_chain_hash(prev, tokens + n * block_tokens, block_tokens);
        out[n++] = prev;
    }
    return n;
}
