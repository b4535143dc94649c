/* net/pbcap.h — the repeated elements of a packed protobuf message, counted
 * on the wire before protobuf-c unpacks it. A frame within its byte cap can
 * still make protobuf-c allocate many times its size (an element of a
 * repeated message is a whole struct and an allocation, however few bytes it
 * took on the wire); so every repeated field has an element cap, and the
 * message a cap of message, string and bytes elements in all (nested ones
 * included), checked here first. Style rule 20: a budget in elements for
 * every repeated field a peer can grow. */
#ifndef TD_PBCAP_H
#define TD_PBCAP_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "status.h"

/* One field's own cap: the repeated field `field` of messages of type msg. */
typedef struct {
    const ProtobufCMessageDescriptor *msg;
    const char *field;
    uint32_t max;
} td_pbcap_rule_t;

typedef struct {
    uint32_t scalar_max;            /* elements of one repeated number field */
    uint32_t object_max;            /* elements of one repeated message, string or bytes field */
    uint64_t objects_total;         /* message, string and bytes elements in the whole message */
    uint32_t depth_max;             /* messages nested deeper are refused */
    const td_pbcap_rule_t *rules;   /* fields with their own cap; ends with msg NULL */
} td_pbcap_t;

/* The caps of the control plane's messages (tandem.proto), for frames and
 * the data plane's KvNote: the defaults, and the fields whose documented
 * bounds are lower (Sampling's stop tokens and logit bias). */
extern const td_pbcap_t td_pbcap_tandem;

/* Whether the packed message buf[len] of type d stays within caps: TD_OK;
 * TD_ERR_TOO_BIG with why ("tandem.Sampling.logit_bias: 301 elements, over
 * the cap of 300") when a cap is exceeded; TD_ERR_PROTO with why when the
 * bytes are not protobuf wire format (a truncated varint, a length past the
 * end, a wire type protobuf-c refuses). Reads the bytes once, allocates
 * nothing, logs nothing. why may be NULL. */
td_status_t td_pbcap_check(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                           const td_pbcap_t *caps, char *why, size_t whylen);

#endif
