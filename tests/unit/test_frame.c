/* tests/unit/test_frame.c — frame encode/decode: round trips, byte-at-a-time
 * delivery, a table of bad inputs (oversized, garbage, truncated, empty), and
 * td_frame_peek's reading of the first field without unpacking. */
#include "check.h"
#include "frame.h"

#include <event2/buffer.h>

static Tandem__Envelope *
decode_all(struct evbuffer *buf, uint32_t max, td_status_t *st)
{
    Tandem__Envelope *env = NULL;

    *st = td_frame_decode(buf, max, &env, NULL, NULL, 0);
    return *st == TD_OK ? env : NULL;
}

static void
test_round_trip_and_partial(void)
{
    struct evbuffer *whole = evbuffer_new(), *trickle = evbuffer_new();
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT, *got;
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    unsigned char bytes[64];
    size_t n;
    td_status_t st;

    hb.seq = 77;
    hb.time_ns = 123456789;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_HEARTBEAT;
    env.heartbeat = &hb;
    CHECK_STATUS(td_frame_encode(whole, &env, 1024), TD_OK);
    CHECK_STATUS(td_frame_encode(whole, &env, 1024), TD_OK);   /* two back to back */
    n = evbuffer_get_length(whole) / 2;
    CHECK(n > TD_FRAME_HEADER_LEN && n <= sizeof(bytes));
    evbuffer_copyout(whole, bytes, n);
    CHECK_EQ_INT(bytes[0] << 24 | bytes[1] << 16 | bytes[2] << 8 | bytes[3],
                 n - TD_FRAME_HEADER_LEN);

    for (int i = 0; i < 2; i++) {
        got = decode_all(whole, 1024, &st);
        CHECK_STATUS(st, TD_OK);
        if (got) {
            CHECK_EQ_INT(got->payload_case, TANDEM__ENVELOPE__PAYLOAD_HEARTBEAT);
            CHECK_EQ_INT(got->heartbeat->seq, 77);
            CHECK_EQ_INT(got->heartbeat->time_ns, 123456789);
            tandem__envelope__free_unpacked(got, NULL);
        }
    }
    CHECK_EQ_INT(evbuffer_get_length(whole), 0);
    CHECK_STATUS(td_frame_decode(whole, 1024, &got, NULL, NULL, 0), TD_INPROGRESS);

    /* One byte at a time: in progress until the last byte, nothing consumed. */
    for (size_t i = 0; i < n; i++) {
        evbuffer_add(trickle, bytes + i, 1);
        got = decode_all(trickle, 1024, &st);
        if (i + 1 < n) {
            CHECK_STATUS(st, TD_INPROGRESS);
            CHECK_EQ_INT(evbuffer_get_length(trickle), i + 1);
        } else {
            CHECK_STATUS(st, TD_OK);
            CHECK(got && got->heartbeat->seq == 77);
        }
        if (got)
            tandem__envelope__free_unpacked(got, NULL);
    }
    CHECK_EQ_INT(evbuffer_get_length(trickle), 0);
    evbuffer_free(whole);
    evbuffer_free(trickle);
}

static void
test_bad_input(void)
{
    static const struct {
        const char *name;
        unsigned char bytes[16];
        size_t len;
        uint32_t max;
        td_status_t want;
        size_t left;          /* bytes still in the buffer afterwards */
        uint32_t body_len;    /* reported for TD_ERR_TOO_BIG */
    } cases[] = {
        { "header incomplete", { 0, 0 }, 2, 1024, TD_INPROGRESS, 2, 0 },
        { "body incomplete", { 0, 0, 0, 9, 0x22 }, 5, 1024, TD_INPROGRESS, 5, 0 },
        { "huge length", { 0x7f, 0xff, 0xff, 0xff }, 4, 1024, TD_ERR_TOO_BIG, 4, 0x7fffffff },
        { "one over max, no body yet", { 0, 0, 4, 1 }, 4, 1024, TD_ERR_TOO_BIG, 4, 1025 },
        { "exactly max waits", { 0, 0, 4, 0 }, 4, 1024, TD_INPROGRESS, 4, 0 },
        { "garbage body", { 0, 0, 0, 5, 0xff, 0xff, 0xff, 0xff, 0xff }, 9, 1024, TD_ERR_PROTO, 0, 0 },
        /* hello submessage announces 32 bytes, 3 follow */
        { "truncated message", { 0, 0, 0, 5, 0x0a, 0x20, 0x08, 0x01, 0x12 }, 9, 1024, TD_ERR_PROTO, 0, 0 },
        { "empty body", { 0, 0, 0, 0 }, 4, 1024, TD_ERR_PROTO, 0, 0 },
        /* field 99 varint 1: valid protobuf, but no payload we know */
        { "unknown payload", { 0, 0, 0, 3, 0x98, 0x06, 0x01 }, 7, 1024, TD_ERR_PROTO, 0, 0 },
        { "bad one, then a byte of the next", { 0, 0, 0, 1, 0xff, 0 }, 6, 1024, TD_ERR_PROTO, 1, 0 },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct evbuffer *buf = evbuffer_new();
        Tandem__Envelope *env = NULL;
        uint32_t body_len = 0;
        td_status_t st;

        evbuffer_add(buf, cases[i].bytes, cases[i].len);
        st = td_frame_decode(buf, cases[i].max, &env, &body_len, NULL, 0);
        if (st != cases[i].want)
            fprintf(stderr, "case \"%s\":\n", cases[i].name);
        CHECK_STATUS(st, cases[i].want);
        CHECK_EQ_INT(evbuffer_get_length(buf), cases[i].left);
        if (cases[i].want == TD_ERR_TOO_BIG)
            CHECK_EQ_INT(body_len, cases[i].body_len);
        CHECK(env == NULL);
        evbuffer_free(buf);
    }
}

static void
test_encode_limits(void)
{
    struct evbuffer *buf = evbuffer_new();
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Reject rej = TANDEM__REJECT__INIT;
    char reason[200];

    CHECK_STATUS(td_frame_encode(buf, &env, 1024), TD_ERR_INVALID);   /* no payload */
    memset(reason, 'x', sizeof(reason) - 1);
    reason[sizeof(reason) - 1] = '\0';
    rej.reason = reason;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_REJECT;
    env.reject = &rej;
    CHECK_STATUS(td_frame_encode(buf, &env, 100), TD_ERR_TOO_BIG);
    CHECK_EQ_INT(evbuffer_get_length(buf), 0);
    CHECK_STATUS(td_frame_encode(buf, &env, 1024), TD_OK);
    CHECK(evbuffer_get_length(buf) > sizeof(reason));
    /* The receiver's smaller limit refuses it from the header alone. */
    CHECK_STATUS(td_frame_decode(buf, 100, &(Tandem__Envelope *){ NULL }, NULL, NULL, 0),
                 TD_ERR_TOO_BIG);
    evbuffer_free(buf);
}

static void
test_peek(void)
{
    static const struct {
        const char *name;
        unsigned char bytes[16];
        size_t len;
        td_status_t want;
        uint32_t field;
    } cases[] = {
        { "hello, empty", { 0, 0, 0, 2, 0x0a, 0x00 }, 6, TD_OK, 1 },
        { "heartbeat, body not parsed", { 0, 0, 0, 4, 0x22, 0x02, 0xff, 0xff }, 8, TD_OK, 4 },
        { "field 40", { 0, 0, 0, 3, 0xc2, 0x02, 0x00 }, 7, TD_OK, 40 },
        { "partial body", { 0, 0, 0, 4, 0x22, 0x02 }, 6, TD_INPROGRESS, 0 },
        { "partial header", { 0, 0 }, 2, TD_INPROGRESS, 0 },
        { "too big", { 0, 0, 0x10, 0 }, 4, TD_ERR_TOO_BIG, 0 },
        { "empty body", { 0, 0, 0, 0 }, 4, TD_ERR_PROTO, 0 },
        { "two fields", { 0, 0, 0, 4, 0x0a, 0x00, 0x22, 0x00 }, 8, TD_ERR_PROTO, 0 },
        { "varint wire type", { 0, 0, 0, 2, 0x20, 0x01 }, 6, TD_ERR_PROTO, 0 },
        { "field 0", { 0, 0, 0, 2, 0x02, 0x00 }, 6, TD_ERR_PROTO, 0 },
        { "length past the body", { 0, 0, 0, 2, 0x0a, 0x05 }, 6, TD_ERR_PROTO, 0 },
        { "cut key varint", { 0, 0, 0, 1, 0x8a }, 5, TD_ERR_PROTO, 0 },
        { "overlong key varint", { 0, 0, 0, 7, 0x8a, 0x80, 0x80, 0x80, 0x80, 0x00, 0x00 }, 11,
          TD_ERR_PROTO, 0 },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct evbuffer *buf = evbuffer_new();
        uint32_t field = 0, body_len = 0;
        td_status_t st;

        evbuffer_add(buf, cases[i].bytes, cases[i].len);
        st = td_frame_peek(buf, 1024, &field, &body_len);
        if (st != cases[i].want || field != cases[i].field)
            fprintf(stderr, "peek case \"%s\": %s field %u\n", cases[i].name,
                    td_status_str(st), (unsigned)field);
        CHECK_STATUS(st, cases[i].want);
        CHECK_EQ_INT(field, cases[i].field);
        if (st == TD_OK)
            CHECK_EQ_INT(body_len, cases[i].len - TD_FRAME_HEADER_LEN);
        CHECK_EQ_INT(evbuffer_get_length(buf), cases[i].len);   /* nothing consumed */
        evbuffer_free(buf);
    }
}

int
main(void)
{
    test_round_trip_and_partial();
    test_bad_input();
    test_encode_limits();
    test_peek();
    return td_check_exit("test_frame");
}
