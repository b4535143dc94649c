/* net/frame.h — control-plane wire frames: a u32 big-endian length, then
 * one packed tandem.Envelope. The length is checked against a maximum before
 * anything is allocated or waited for. */
#ifndef TD_FRAME_H
#define TD_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tandem.pb-c.h"

struct evbuffer;

#define TD_FRAME_HEADER_LEN 4u
#define TD_FRAME_MAX_DEFAULT (4u << 20)   /* body bytes, when a caller has no better idea */

/* Append one frame holding env to out. TD_ERR_TOO_BIG (nothing appended) when
 * the packed Envelope exceeds max_body bytes; TD_ERR_INVALID when env has no
 * payload. */
td_status_t td_frame_encode(struct evbuffer *out, const Tandem__Envelope *env,
                            uint32_t max_body);

/* Take one frame from the front of in.
 *   TD_OK          *env_out is the unpacked Envelope (it has a payload); the
 *                  caller frees it with tandem__envelope__free_unpacked(x, NULL).
 *   TD_INPROGRESS  not a whole frame yet; nothing consumed.
 *   TD_ERR_TOO_BIG the length prefix exceeds max_body; nothing consumed and
 *                  *body_len_out says the announced length.
 *   TD_ERR_RANGE   a whole frame arrived with more repeated elements than
 *                  td_pbcap_tandem allows (net/pbcap.h): refused before
 *                  unpacking, consumed, why says which field.
 *   TD_ERR_PROTO   a whole frame arrived but is not an Envelope with a payload
 *                  (garbage, truncated message, unknown payload); it is consumed.
 * body_len_out may be NULL; when given it is set for TD_OK and TD_ERR_TOO_BIG.
 * why (whylen bytes, may be NULL) says what was wrong for TD_ERR_RANGE and
 * TD_ERR_PROTO. Decides; does not log (the connection owning in names itself
 * in the log). */
td_status_t td_frame_decode(struct evbuffer *in, uint32_t max_body,
                            Tandem__Envelope **env_out, uint32_t *body_len_out, char *why,
                            size_t whylen);

/* Look at the frame at the front of in without consuming or unpacking it, so
 * that a receiver can refuse a payload before protobuf-c parses any of it.
 *   TD_OK          a whole frame is there and its body is exactly one
 *                  length-delimited field (protobuf key varint = field << 3 | 2,
 *                  length varint, that many bytes, nothing after): *field_out
 *                  is its field number, i.e. the Envelope payload case.
 *   TD_INPROGRESS, TD_ERR_TOO_BIG  as td_frame_decode.
 *   TD_ERR_PROTO   the body is anything else (empty, bad varint, another
 *                  wire type, several fields).
 * Nothing is consumed. body_len_out may be NULL; set for TD_OK, TD_ERR_TOO_BIG. */
td_status_t td_frame_peek(struct evbuffer *in, uint32_t max_body, uint32_t *field_out,
                          uint32_t *body_len_out);

#endif
