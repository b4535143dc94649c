/* net/frame.c — encode and decode length-prefixed Envelope frames on
 * libevent evbuffers. */
#include "frame.h"

#include <event2/buffer.h>
#include <stdio.h>

#include "pbcap.h"

td_status_t
td_frame_encode(struct evbuffer *out, const Tandem__Envelope *env, uint32_t max_body)
{
    struct evbuffer_iovec vec;
    size_t body;
    uint8_t *p;

    if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD__NOT_SET)
        return TD_ERR_INVALID;
    body = tandem__envelope__get_packed_size(env);
    if (body > max_body)
        return TD_ERR_TOO_BIG;
    if (evbuffer_reserve_space(out, (ev_ssize_t)(TD_FRAME_HEADER_LEN + body), &vec, 1) != 1)
        return TD_ERR_NOMEM;
    p = vec.iov_base;
    p[0] = (uint8_t)(body >> 24);
    p[1] = (uint8_t)(body >> 16);
    p[2] = (uint8_t)(body >> 8);
    p[3] = (uint8_t)body;
    if (tandem__envelope__pack(env, p + TD_FRAME_HEADER_LEN) != body)
        return TD_ERR_INTERNAL;
    vec.iov_len = TD_FRAME_HEADER_LEN + body;
    if (evbuffer_commit_space(out, &vec, 1) != 0)
        return TD_ERR_NOMEM;
    return TD_OK;
}

/* Whether a whole frame of at most max_body body bytes is at the front of in:
 * TD_OK (*body = its body length), TD_INPROGRESS, or TD_ERR_TOO_BIG (*body =
 * the announced length, decided from the 4 length bytes alone). */
static td_status_t
frame_whole(struct evbuffer *in, uint32_t max_body, uint32_t *body)
{
    uint8_t hdr[TD_FRAME_HEADER_LEN];

    if (evbuffer_copyout(in, hdr, sizeof(hdr)) != (ev_ssize_t)sizeof(hdr))
        return TD_INPROGRESS;
    *body = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    if (*body > max_body)
        return TD_ERR_TOO_BIG;
    if (evbuffer_get_length(in) < TD_FRAME_HEADER_LEN + (size_t)*body)
        return TD_INPROGRESS;
    return TD_OK;
}

/* Protobuf varint of at most max_bytes bytes from p[0..n): its length in
 * bytes, or 0 when it is cut short or too long. */
static size_t
frame_varint(const uint8_t *p, size_t n, size_t max_bytes, uint64_t *v)
{
    uint64_t x = 0;

    for (size_t i = 0; i < n && i < max_bytes; i++) {
        x |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if (!(p[i] & 0x80)) {
            *v = x;
            return i + 1;
        }
    }
    return 0;
}

td_status_t
td_frame_peek(struct evbuffer *in, uint32_t max_body, uint32_t *field_out,
              uint32_t *body_len_out)
{
    /* key: 5 bytes cover field numbers up to 2^29; length: 5 bytes cover u32 */
    uint8_t head[TD_FRAME_HEADER_LEN + 10];
    uint64_t key, len;
    size_t n, k, l;
    uint32_t body;
    td_status_t st = frame_whole(in, max_body, &body);

    if (st == TD_ERR_TOO_BIG && body_len_out)
        *body_len_out = body;
    if (st != TD_OK)
        return st;
    n = body < sizeof(head) - TD_FRAME_HEADER_LEN ? body : sizeof(head) - TD_FRAME_HEADER_LEN;
    evbuffer_copyout(in, head, TD_FRAME_HEADER_LEN + n);
    k = frame_varint(head + TD_FRAME_HEADER_LEN, n, 5, &key);
    if (k == 0 || (key & 7) != 2 || (key >> 3) == 0)
        return TD_ERR_PROTO;
    l = frame_varint(head + TD_FRAME_HEADER_LEN + k, n - k, 5, &len);
    if (l == 0 || k + l + len != body)
        return TD_ERR_PROTO;
    *field_out = (uint32_t)(key >> 3);
    if (body_len_out)
        *body_len_out = body;
    return TD_OK;
}

td_status_t
td_frame_decode(struct evbuffer *in, uint32_t max_body, Tandem__Envelope **env_out,
                uint32_t *body_len_out, char *why, size_t whylen)
{
    Tandem__Envelope *env;
    unsigned char *frame;
    uint32_t body;
    td_status_t st = frame_whole(in, max_body, &body);

    if (st == TD_ERR_TOO_BIG && body_len_out)
        *body_len_out = body;
    if (st != TD_OK)
        return st;
    frame = evbuffer_pullup(in, (ev_ssize_t)(TD_FRAME_HEADER_LEN + body));
    if (frame == NULL)
        return TD_ERR_NOMEM;
    st = td_pbcap_check(&tandem__envelope__descriptor, frame + TD_FRAME_HEADER_LEN, body,
                        &td_pbcap_tandem, why, whylen);
    if (st != TD_OK) {
        evbuffer_drain(in, TD_FRAME_HEADER_LEN + (size_t)body);
        return st == TD_ERR_TOO_BIG ? TD_ERR_RANGE : TD_ERR_PROTO;
    }
    env = tandem__envelope__unpack(NULL, body, frame + TD_FRAME_HEADER_LEN);
    evbuffer_drain(in, TD_FRAME_HEADER_LEN + (size_t)body);
    if (env == NULL) {
        if (why != NULL && whylen > 0)
            snprintf(why, whylen, "not a tandem envelope");
        return TD_ERR_PROTO;
    }
    if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD__NOT_SET) {
        tandem__envelope__free_unpacked(env, NULL);
        if (why != NULL && whylen > 0)
            snprintf(why, whylen, "an envelope without a payload");
        return TD_ERR_PROTO;
    }
    if (body_len_out)
        *body_len_out = body;
    *env_out = env;
    return TD_OK;
}
