/* tests/fuzz/fuzz_frame.c — control-plane frames as a peer's bytes reach them
 * before authentication: td_frame_peek and td_frame_decode on a stream that
 * arrives in pieces, against a length cap taken from the input; then each
 * handshake payload through what the connection does with it (td_hello_check,
 * the proof check, printable reasons). Checks that peek and decode agree and
 * that a decoded Envelope encodes and decodes again. */
#include <event2/buffer.h>

#include "ctl.h"
#include "frame.h"
#include "fuzz.h"
#include "hello.h"

static const uint8_t frame_secret[] = "fuzz-secret";
static const uint8_t frame_nonce[TD_HELLO_NONCE_LEN] = { 1, 2, 3 };

/* Who we are: a router whose peer must match version, model and layout. */
static const td_hello_ident_t frame_ours = {
    .protocol_version = TD_HELLO_PROTOCOL_VERSION,
    .role = TANDEM__ROLE__ROLE_ROUTER,
    .node_id = "router0",
    .rank_id = 0,
    .incarnation = 0x1111222233334444u,
    .model_fingerprint = "0123456789abcdef",
    .kv_layout_hash = 0x5555666677778888u,
};

/* What ctl.c does with a handshake payload it unpacked. */
static void
frame_handshake(const Tandem__Envelope *env, const Tandem__Hello **last_hello)
{
    char reason[TD_HELLO_REASON_MAX];
    Tandem__RejectCode code = 0;
    Tandem__Hello ours;

    switch (env->payload_case) {
    case TANDEM__ENVELOPE__PAYLOAD_HELLO:
        if (td_hello_check(&frame_ours, frame_nonce, env->hello, reason, sizeof(reason),
                           &code) == TD_OK) {
            uint8_t proof[TD_HELLO_PROOF_LEN];

            td_hello_build(&ours, &frame_ours, frame_nonce);
            FUZZ_CHECK(td_hello_proof_compute(frame_secret, sizeof(frame_secret),
                                              TD_HELLO_ACCEPTOR, env->hello, &ours,
                                              proof) == TD_OK);
            *last_hello = env->hello;
        } else {
            FUZZ_CHECK(code != TANDEM__REJECT_CODE__REJECT_UNSPECIFIED);
            FUZZ_CHECK(strlen(reason) < sizeof(reason));
        }
        break;
    case TANDEM__ENVELOPE__PAYLOAD_HELLO_AUTH:
        if (*last_hello) {
            td_hello_build(&ours, &frame_ours, frame_nonce);
            /* A proof from the input is never the right one (HMAC). */
            FUZZ_CHECK(td_hello_proof_verify(frame_secret, sizeof(frame_secret),
                                             TD_HELLO_INITIATOR, *last_hello, &ours,
                                             &env->hello_auth->proof, reason,
                                             sizeof(reason)) == TD_ERR_AUTH);
        }
        break;
    case TANDEM__ENVELOPE__PAYLOAD_REJECT:
        td_hello_printable(reason, sizeof(reason), env->reject->reason,
                           strlen(env->reject->reason));
        FUZZ_CHECK(strlen(reason) < sizeof(reason));
        (void)td_hello_role_str((Tandem__Role)env->reject->code);
        break;
    default:
        break;
    }
}

/* A decoded Envelope packs into one frame, which decodes to the same payload
 * (or is refused: protobuf-c keeps unknown fields, also ones it will not
 * read back, e.g. field number 0 spelled as a two-byte varint). */
static void
frame_reencode(const Tandem__Envelope *env, uint32_t max)
{
    struct evbuffer *b = evbuffer_new();
    Tandem__Envelope *again = NULL;
    td_status_t st;

    FUZZ_CHECK(b != NULL);
    st = td_frame_encode(b, env, max);
    if (st == TD_OK) {
        st = td_frame_decode(b, max, &again, NULL, NULL, 0);
        FUZZ_CHECK(st == TD_OK || st == TD_ERR_PROTO || st == TD_ERR_RANGE);
        FUZZ_CHECK(st != TD_OK || again->payload_case == env->payload_case);
        FUZZ_CHECK(evbuffer_get_length(b) == 0);
        if (again)
            tandem__envelope__free_unpacked(again, NULL);
    } else {
        FUZZ_CHECK(st == TD_ERR_TOO_BIG);   /* unknown fields may make it longer */
    }
    evbuffer_free(b);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    fuzz_in_t in = { data, size };
    uint8_t cap = fuzz_u8(&in), piece = fuzz_u8(&in);
    /* The cap before authentication (4096) or a small / odd one. */
    uint32_t max = cap & 0x80 ? TD_CTL_HELLO_FRAME_MAX : (uint32_t)(cap & 0x7f) * 37u;
    size_t chunk = piece ? piece : in.n ? in.n : 1;
    struct evbuffer *b = evbuffer_new();
    Tandem__Envelope *keep[64];
    const Tandem__Hello *last_hello = NULL;
    size_t nkeep = 0, off = 0;
    int done = 0;

    if (!init) {
        fuzz_log_quiet();
        init = 1;
    }
    FUZZ_CHECK(b != NULL);
    while (!done && off < in.n) {
        size_t take = in.n - off < chunk ? in.n - off : chunk;

        evbuffer_add(b, in.p + off, take);
        off += take;
        for (;;) {
            uint32_t field = 0, plen = 0, dlen = 0;
            size_t before = evbuffer_get_length(b);
            Tandem__Envelope *env = NULL;
            td_status_t ps = td_frame_peek(b, max, &field, &plen);
            td_status_t ds;

            FUZZ_CHECK(evbuffer_get_length(b) == before);   /* peek consumes nothing */
            ds = td_frame_decode(b, max, &env, &dlen, NULL, 0);
            if (ps == TD_INPROGRESS || ps == TD_ERR_TOO_BIG) {
                FUZZ_CHECK(ds == ps);
                FUZZ_CHECK(evbuffer_get_length(b) == before);
                if (ps == TD_ERR_TOO_BIG) {
                    FUZZ_CHECK(plen == dlen && plen > max);
                    done = 1;   /* the connection closes here */
                }
                break;
            }
            FUZZ_CHECK(ps == TD_OK || ps == TD_ERR_PROTO);
            FUZZ_CHECK(ds == TD_OK || ds == TD_ERR_PROTO || ds == TD_ERR_RANGE);
            if (ds != TD_OK) {
                FUZZ_CHECK(env == NULL);
                continue;
            }
            FUZZ_CHECK(dlen <= max && before - evbuffer_get_length(b) == dlen + 4u);
            FUZZ_CHECK(env->payload_case != TANDEM__ENVELOPE__PAYLOAD__NOT_SET);
            /* One length-delimited field exactly: it is the payload. */
            if (ps == TD_OK)
                FUZZ_CHECK((uint32_t)env->payload_case == field && plen == dlen);
            frame_handshake(env, &last_hello);
            frame_reencode(env, max);
            keep[nkeep++] = env;   /* last_hello may point into it */
            if (nkeep == sizeof(keep) / sizeof(keep[0])) {
                done = 1;
                break;
            }
        }
    }
    for (size_t i = 0; i < nkeep; i++)
        tandem__envelope__free_unpacked(keep[i], NULL);
    evbuffer_free(b);
    return 0;
}
