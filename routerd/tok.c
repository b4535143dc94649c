/* routerd/tok.c — incremental UTF-8-safe decoding shared by every tokenizer:
 * ids -> piece bytes -> whole characters, invalid sequences -> U+FFFD. */
#include "tok.h"

#include <stdbool.h>

static const char replacement[3] = { (char)0xEF, (char)0xBF, (char)0xBD }; /* U+FFFD */

/* Length of the character a lead byte starts; 0 for a byte that cannot start one. */
static uint8_t
utf8_lead_len(uint8_t b)
{
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF)
        return 2;
    if (b >= 0xE0 && b <= 0xEF)
        return 3;
    if (b >= 0xF0 && b <= 0xF4)
        return 4;
    return 0;
}

/* Whether b may follow the bytes held (Unicode table 3-7: no overlongs,
 * surrogates or code points above U+10FFFF). */
static bool
utf8_continues(const td_tok_dec_t *st, uint8_t b)
{
    uint8_t lo = 0x80, hi = 0xBF;
    if (st->n == 1) {
        switch (st->buf[0]) {
        case 0xE0: lo = 0xA0; break;
        case 0xED: hi = 0x9F; break;
        case 0xF0: lo = 0x90; break;
        case 0xF4: hi = 0x8F; break;
        default: break;
        }
    }
    return b >= lo && b <= hi;
}

static td_status_t
dec_byte(td_tok_dec_t *st, uint8_t b, td_strbuf_t *out)
{
    td_status_t st_rc;
    if (st->n > 0) {
        if (utf8_continues(st, b)) {
            st->buf[st->n++] = b;
            if (st->n < st->need)
                return TD_OK;
            st->n = 0;
            return td_strbuf_append(out, st->buf, st->need);
        }
        /* a truncated character: one U+FFFD, then b starts afresh */
        st->n = 0;
        if ((st_rc = td_strbuf_append(out, replacement, sizeof replacement)) != TD_OK)
            return st_rc;
    }
    uint8_t len = utf8_lead_len(b);
    if (len == 0)
        return td_strbuf_append(out, replacement, sizeof replacement);
    if (len == 1)
        return td_strbuf_append(out, &b, 1);
    st->buf[0] = b;
    st->n = 1;
    st->need = len;
    return TD_OK;
}

td_status_t
td_tok_decode(const td_tok_t *tok, td_tok_dec_t *st, const uint32_t *ids, size_t nids,
              td_strbuf_t *out)
{
    for (size_t i = 0; i < nids; i++) {
        const char *bytes;
        size_t len;
        td_status_t rc = tok->ops->piece(tok, ids[i], &bytes, &len);
        if (rc != TD_OK)
            return rc;
        for (size_t j = 0; j < len; j++)
            if ((rc = dec_byte(st, (uint8_t)bytes[j], out)) != TD_OK)
                return rc;
    }
    return TD_OK;
}

td_status_t
td_tok_decode_flush(td_tok_dec_t *st, td_strbuf_t *out)
{
    if (st->n == 0)
        return TD_OK;
    st->n = 0;
    return td_strbuf_append(out, replacement, sizeof replacement);
}
