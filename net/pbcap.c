/* net/pbcap.c — counting a packed protobuf message's repeated elements on
 * the wire (tags, varints, lengths; nested messages by their descriptors),
 * so that a message whose unpacking would cost far more than its bytes is
 * refused before protobuf-c allocates anything. */
#include "pbcap.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "tandem.pb-c.h"

/* Per-message counters; a message with more fields shares the last one
 * among the rest (a tighter count, never a looser one). */
#define PBCAP_FIELDS_MAX 128u

static const td_pbcap_rule_t tandem_rules[] = {
    { &tandem__sampling__descriptor, "stop_tokens", 16 },
    { &tandem__sampling__descriptor, "logit_bias", 300 },
    { NULL, NULL, 0 },
};

const td_pbcap_t td_pbcap_tandem = {
    .scalar_max = 1u << 21,     /* a prompt of 2 M tokens: past every model's context */
    .object_max = 4096,
    .objects_total = 1u << 16,
    .depth_max = 8,
    .rules = tandem_rules,
};

typedef struct {
    const td_pbcap_t *caps;
    uint64_t objects;               /* message, string and bytes elements so far */
    char *why;
    size_t whylen;
} pbcap_ctx_t;

static td_status_t __attribute__((format(printf, 3, 4)))
pbcap_fail(pbcap_ctx_t *x, td_status_t st, const char *fmt, ...)
{
    va_list ap;

    if (x->why != NULL && x->whylen > 0) {
        va_start(ap, fmt);
        vsnprintf(x->why, x->whylen, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* A varint at p[0 .. end): its length in bytes, 0 when truncated or longer
 * than 10 bytes. */
static size_t
pbcap_varint(const uint8_t *p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;

    for (size_t i = 0; i < 10 && p + i < end; i++) {
        x |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if (!(p[i] & 0x80)) {
            *v = x;
            return i + 1;
        }
    }
    return 0;
}

static bool
pbcap_is_object(ProtobufCType t)
{
    return t == PROTOBUF_C_TYPE_MESSAGE || t == PROTOBUF_C_TYPE_STRING ||
           t == PROTOBUF_C_TYPE_BYTES;
}

/* Elements of a packed repeated field of type t in p[0 .. len). */
static uint64_t
pbcap_packed_count(ProtobufCType t, const uint8_t *p, size_t len)
{
    uint64_t n = 0;

    switch (t) {
    case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_SFIXED32: case PROTOBUF_C_TYPE_FLOAT:
        return len / 4;
    case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_SFIXED64: case PROTOBUF_C_TYPE_DOUBLE:
        return len / 8;
    default:   /* varints: one ends at each byte without the high bit */
        for (size_t i = 0; i < len; i++)
            n += !(p[i] & 0x80);
        return n;
    }
}

static uint32_t
pbcap_field_max(const pbcap_ctx_t *x, const ProtobufCMessageDescriptor *d,
                const ProtobufCFieldDescriptor *f)
{
    for (const td_pbcap_rule_t *r = x->caps->rules; r != NULL && r->msg != NULL; r++)
        if (r->msg == d && strcmp(r->field, f->name) == 0)
            return r->max;
    return pbcap_is_object(f->type) ? x->caps->object_max : x->caps->scalar_max;
}

/* One field's value at p (wire type wt): its length in *used. */
static td_status_t
pbcap_value(pbcap_ctx_t *x, const ProtobufCMessageDescriptor *d, uint32_t wt, const uint8_t *p,
            const uint8_t *end, size_t *used, const uint8_t **body, size_t *blen)
{
    uint64_t v;
    size_t k;

    *body = NULL;
    switch (wt) {
    case 0:
        k = pbcap_varint(p, end, &v);
        break;
    case 1:
        k = end - p >= 8 ? 8 : 0;
        break;
    case 5:
        k = end - p >= 4 ? 4 : 0;
        break;
    case 2:
        k = pbcap_varint(p, end, &v);
        if (k == 0 || v > (uint64_t)(end - p - k))
            return pbcap_fail(x, TD_ERR_PROTO, "%s: a length past the end", d->name);
        *body = p + k;
        *blen = (size_t)v;
        k += (size_t)v;
        break;
    default:
        return pbcap_fail(x, TD_ERR_PROTO, "%s: wire type %u", d->name, wt);
    }
    if (k == 0)
        return pbcap_fail(x, TD_ERR_PROTO, "%s: a value past the end", d->name);
    *used = k;
    return TD_OK;
}

static td_status_t pbcap_msg(pbcap_ctx_t *x, const ProtobufCMessageDescriptor *d,
                             const uint8_t *p, size_t len, uint32_t depth);

/* Count the elements one occurrence of field f brought (n) against its cap
 * and the message's total; a message value is read in turn. */
static td_status_t
pbcap_field(pbcap_ctx_t *x, const ProtobufCMessageDescriptor *d,
            const ProtobufCFieldDescriptor *f, uint32_t wt, const uint8_t *body, size_t blen,
            uint32_t *count, uint32_t depth)
{
    bool object = pbcap_is_object(f->type);
    uint64_t n = 1;

    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        uint32_t max = pbcap_field_max(x, d, f);
        if (wt == 2 && !object)
            n = pbcap_packed_count(f->type, body, blen);
        if (n > max - *count)
            return pbcap_fail(x, TD_ERR_TOO_BIG, "%s.%s: more than %u elements", d->name,
                              f->name, max);
        *count += (uint32_t)n;
    }
    if (object || f->type == PROTOBUF_C_TYPE_MESSAGE) {
        x->objects += n;
        if (x->objects > x->caps->objects_total)
            return pbcap_fail(x, TD_ERR_TOO_BIG, "%s.%s: more than %llu messages, strings and "
                              "bytes in all", d->name, f->name,
                              (unsigned long long)x->caps->objects_total);
    }
    if (f->type == PROTOBUF_C_TYPE_MESSAGE && wt == 2)
        return pbcap_msg(x, f->descriptor, body, blen, depth + 1);
    return TD_OK;
}

static td_status_t
pbcap_msg(pbcap_ctx_t *x, const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t len,
          uint32_t depth)
{
    uint32_t counts[PBCAP_FIELDS_MAX] = { 0 };
    const uint8_t *end = p + len;

    if (depth > x->caps->depth_max)
        return pbcap_fail(x, TD_ERR_TOO_BIG, "%s: nested deeper than %u", d->name,
                          x->caps->depth_max);
    while (p < end) {
        uint64_t key;
        size_t k = pbcap_varint(p, end, &key), used = 0, blen = 0;
        const uint8_t *body;
        td_status_t st;

        if (k == 0 || (key >> 3) == 0 || (key >> 3) > UINT32_MAX)
            return pbcap_fail(x, TD_ERR_PROTO, "%s: a bad field key", d->name);
        p += k;
        st = pbcap_value(x, d, (uint32_t)(key & 7), p, end, &used, &body, &blen);
        if (st != TD_OK)
            return st;
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3));
        if (f != NULL) {
            size_t i = (size_t)(f - d->fields);
            st = pbcap_field(x, d, f, (uint32_t)(key & 7), body, blen,
                             &counts[i < PBCAP_FIELDS_MAX ? i : PBCAP_FIELDS_MAX - 1], depth);
            if (st != TD_OK)
                return st;
        }
        p += used;
    }
    return TD_OK;
}

td_status_t
td_pbcap_check(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
               const td_pbcap_t *caps, char *why, size_t whylen)
{
    pbcap_ctx_t x = { .caps = caps, .why = why, .whylen = whylen };

    if (why != NULL && whylen > 0)
        why[0] = '\0';
    return pbcap_msg(&x, d, buf, len, 0);
}
