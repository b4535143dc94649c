/* text/tokmap.h — the engram's compressed token map of DeepSeek-V4.1: every
 * token id -> a class shared by the ids whose text normalizes alike (" The",
 * "the", "THE"), numbered in first-seen id order, as transformers'
 * build_compressed_token_map numbers them. */
#ifndef TD_TOKMAP_H
#define TD_TOKMAP_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tokenizer.h"

/* Normalize one token's text as the engram does: NFKC, NFD, combining marks
 * removed, lower case, each run of [ \t\r\n] -> one space, a text that is then
 * exactly one space kept as " ", surrounding whitespace stripped (Hugging Face
 * tokenizers 0.23.3's normalizers, Unicode tables included). s: len bytes of
 * UTF-8 (NUL bytes allowed); not UTF-8: TD_ERR_INVALID. *out: malloc'd,
 * NUL-terminated, caller frees; *outlen excludes the NUL; may be empty. */
td_status_t td_tokmap_normalize(const char *s, size_t len, char **out, size_t *outlen);

/* map[id] for every id < td_tokenizer_vocab_size(tok): the class of the id's
 * text (the bytes it decodes to on its own, normalized; its raw vocabulary
 * string when those bytes are not whole UTF-8 or hold U+FFFD; the text itself
 * when it normalizes to nothing). *nclasses: the number of distinct classes
 * (the model's engram_compressed_vocab_size). *map: malloc'd, caller frees. */
td_status_t td_tokmap_build(const td_tokenizer_t *tok, uint32_t **map, uint32_t *nclasses);

#endif
