/* tests/integration/xfer_forge.c — a forger on the data plane: a UCX
 * endpoint of its own that connects to a worker's address and sends it
 * notifications with guessed tokens, half for random transfer ids and half
 * for one transfer id the caller names (a live request's), each carrying a
 * KvNote that would end that request ("canceled") if it were ever parsed.
 * The receiver must drop every one unparsed and log at most one line a
 * second (docs/xfer.md, "Authenticated notifications").
 * Usage: xfer_forge ADDR_HEX INCARNATION_HEX XFER_ID NOTES SECONDS
 * Exit 0 once every note went out (the receiver took it), 1 otherwise. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "clock.h"
#include "log.h"
#include "tandem.pb-c.h"
#include "xfer.h"

typedef struct {
    unsigned sent, done, failed;
} forge_t;

static void
forge_done(td_xfer_t *x, uint64_t xfer_id, td_status_t st, void *arg)
{
    forge_t *f = arg;

    (void)x, (void)xfer_id;
    f->done++;
    f->failed += st != TD_OK;
}

static int
hex_bytes(const char *hex, uint8_t **out, size_t *len)
{
    size_t n = strlen(hex) / 2;
    uint8_t *b = malloc(n ? n : 1);

    if (b == NULL || strlen(hex) % 2)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) {
            free(b);
            return -1;
        }
        b[i] = (uint8_t)v;
    }
    *out = b;
    *len = n;
    return 0;
}

int
main(int argc, char **argv)
{
    uint8_t *addr, note[128];
    size_t alen, nlen;
    forge_t f = { 0 };

    if (argc != 6 || hex_bytes(argv[1], &addr, &alen) != 0) {
        fprintf(stderr, "usage: xfer_forge ADDR_HEX INCARNATION_HEX XFER_ID NOTES SECONDS\n");
        return 2;
    }
    uint64_t inc = strtoull(argv[2], NULL, 16), target = strtoull(argv[3], NULL, 10);
    unsigned notes = (unsigned)strtoul(argv[4], NULL, 10);
    double secs = strtod(argv[5], NULL);
    td_log_set_ident("xfer_forge");
    struct event_base *base = event_base_new();
    td_xfer_config_t xc = { .incarnation = 0xf0f0f0f0ull, .transports = "shm,self" };
    td_xfer_t *x = NULL;
    td_xfer_peer_t *peer = NULL;
    if (td_xfer_create(base, &xc, &x) != TD_OK ||
        td_xfer_peer_create(x, addr, alen, inc, &peer) != TD_OK) {
        fprintf(stderr, "xfer_forge: cannot reach the worker\n");
        return 1;
    }
    /* what a parsed note would do: end the request, canceled */
    Tandem__KvNote kn = TANDEM__KV_NOTE__INIT;
    kn.req_id = 1;
    kn.canceled = 1;
    kn.reason = "forged";
    nlen = tandem__kv_note__pack(&kn, note);
    uint64_t t0 = td_clock_ns(), span = (uint64_t)(secs * 1e9);
    while (f.sent < notes) {
        td_xfer_token_t tok;
        uint64_t id;
        if (td_xfer_token_draw(&tok) != TD_OK)
            return 1;
        memcpy(&id, tok.b, sizeof id);   /* a random id, or the live one */
        if (f.sent % 2)
            id = target;
        if (td_xfer_post(peer, id, &tok, NULL, 0, note, nlen, 0, forge_done, &f) == TD_OK)
            f.sent++;
        else
            break;
        /* spread over the span: no faster than the schedule */
        while (td_clock_ns() - t0 < span * f.sent / notes)
            event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    }
    while (f.done < f.sent && td_clock_ns() - t0 < span + 5000000000ull)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    printf("xfer_forge: %u notes sent, %u taken, %u failed\n", f.sent, f.done - f.failed,
           f.failed);
    td_xfer_peer_destroy(peer);
    td_xfer_destroy(x);
    event_base_free(base);
    free(addr);
    return f.sent == notes && f.done == f.sent && f.failed == 0 ? 0 : 1;
}
