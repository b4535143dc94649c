/* routerd/tok.c — incremental UTF-8-safe decoding shared by every tokenizer:
 * ids -> piece bytes -> whole characters, invalid sequences -> U+FFFD (the
 * engine tokenizer's td_detok_bytes does the byte work). */
#include "tok.h"

td_status_t
td_tok_decode(const td_tok_t *tok, td_tok_dec_t *st, const uint32_t *ids, size_t nids,
              bool skip_special, td_buf_t *out)
{
    for (size_t i = 0; i < nids; i++) {
        const char *bytes;
        size_t len;
        char buf[TD_DETOK_OUT_MAX(64)];
        td_status_t rc = skip_special ? tok->ops->piece(tok, ids[i], &bytes, &len)
                                      : tok->ops->spell(tok, ids[i], &bytes, &len);
        if (rc != TD_OK)
            return rc;
        /* in slices, so that the output buffer stays on the stack */
        for (size_t j = 0; j < len; j += 64) {
            size_t k = len - j < 64 ? len - j : 64;
            size_t n = td_detok_bytes(st, bytes + j, k, buf);
            if ((rc = td_buf_append(out, buf, n)) != TD_OK)
                return rc;
        }
    }
    return TD_OK;
}

td_status_t
td_tok_decode_flush(td_tok_dec_t *st, td_buf_t *out)
{
    char buf[3];
    size_t n = td_detok_flush(st, buf);
    return n ? td_buf_append(out, buf, n) : TD_OK;
}
