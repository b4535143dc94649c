/* kvcache/xxh64.h — the 64-bit checksum of the KV cache tiers' files: XXH64
 * (Yann Collet's xxHash, 64-bit variant), written here so kvcache/ needs no
 * library beyond td_base. Chained through the seed for data in several parts. */
#ifndef TD_XXH64_H
#define TD_XXH64_H

#include <stddef.h>
#include <stdint.h>

/* XXH64 of data[0..len) with the given seed; equal to the reference
 * XXH64(data, len, seed). */
uint64_t td_xxh64(const void *data, size_t len, uint64_t seed);

#endif
