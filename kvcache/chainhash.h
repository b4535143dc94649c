/* kvcache/chainhash.h — the hash chain of a prompt's cache blocks: block i of
 * `block_tokens` tokens hashes to a 64-bit value that covers every token
 * before it too (the previous block's hash is its first input), so equal
 * hashes mean equal prefixes with high probability. A prefill rank's prefix
 * cache keys its blocks by it and the router finds how much of a prompt a
 * rank holds with it (docs/kvcache.md); whoever serves KV from a hit still
 * compares the tokens it stored, so a collision costs a miss, never wrong KV.
 * The seed binds the chain to one model and KV layout. */
#ifndef TD_CHAINHASH_H
#define TD_CHAINHASH_H

#include <stddef.h>
#include <stdint.h>

/* The chain's start for a model fingerprint and KV layout hash (both as
 * Hello carries them: the fingerprint as its string). */
uint64_t td_chain_seed(const char *model_fingerprint, uint64_t layout_hash);

/* The hash of a block of n tokens after the block whose hash is prev (the
 * first block: prev = the seed). Never 0. */
uint64_t td_chain_hash(uint64_t prev, const int32_t *tokens, size_t n);

/* Hashes of the whole blocks of tokens[0..ntokens): out[i] covers tokens
 * [0, (i + 1) * block_tokens); returns how many (at most cap, at most
 * ntokens / block_tokens; 0 when block_tokens is 0). */
size_t td_chain_hashes(uint64_t seed, const int32_t *tokens, size_t ntokens,
                       uint32_t block_tokens, uint64_t *out, size_t cap);

#endif
