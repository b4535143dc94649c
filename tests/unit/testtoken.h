/* tests/unit/testtoken.h — transfer tokens for tests that play both ends of
 * the data plane (xfer/xfer.h, "token"): a token made from the transfer id,
 * so the sender knows it without a control plane, and the receiver's check
 * that a note carries its id's token. */
#ifndef TD_TESTTOKEN_H
#define TD_TESTTOKEN_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "xfer.h"

/* Transfer id's token: its 8 bytes twice, the second half inverted. */
static inline td_xfer_token_t
td_test_token(uint64_t xfer_id)
{
    td_xfer_token_t t;

    for (unsigned i = 0; i < 8; i++) {
        t.b[i] = (uint8_t)(xfer_id >> (8 * i));
        t.b[8 + i] = (uint8_t)~t.b[i];
    }
    return t;
}

/* The same, for td_xfer_post (which copies it): valid until 16 more calls. */
static inline const td_xfer_token_t *
td_test_tokp(uint64_t xfer_id)
{
    static td_xfer_token_t ring[16];
    static unsigned next;
    td_xfer_token_t *t = &ring[next++ % 16];

    *t = td_test_token(xfer_id);
    return t;
}

/* td_xfer_auth_fn: the note carries td_test_token(xfer_id). */
static inline bool
td_test_token_auth(td_xfer_t *x, uint64_t xfer_id, const td_xfer_token_t *token, void *arg)
{
    td_xfer_token_t want = td_test_token(xfer_id);

    (void)x;
    (void)arg;
    return td_xfer_token_eq(&want, token);
}

#endif
