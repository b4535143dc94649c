/* net/hello.c — Hello construction and checks, HMAC-SHA256 proof of the
 * cluster secret (OpenSSL). No I/O: net/ctl.c drives the exchange. */
#include "hello.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "log.h"

#define HELLO_PROOF_LABEL "tandem-ctl-proof-v2"

static const char *const hello_role_names[] = {
    [TANDEM__ROLE__ROLE_UNSPECIFIED] = "?",
    [TANDEM__ROLE__ROLE_ROUTER]      = "router",
    [TANDEM__ROLE__ROLE_PREFILL]     = "prefill",
    [TANDEM__ROLE__ROLE_DECODE]      = "decode",
    [TANDEM__ROLE__ROLE_TOOL]        = "tool",
};

const char *
td_hello_role_str(Tandem__Role role)
{
    if ((unsigned)role >= sizeof(hello_role_names) / sizeof(hello_role_names[0]))
        return "?";
    return hello_role_names[role];
}

static int
hello_role_valid(Tandem__Role role)
{
    return role >= TANDEM__ROLE__ROLE_ROUTER && role <= TANDEM__ROLE__ROLE_TOOL;
}

static int
hello_node_id_valid(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n > TD_HELLO_NODE_ID_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] > '~')
            return 0;
    return 1;
}

void
td_hello_printable(char *dst, size_t dst_len, const char *src, size_t len)
{
    int cut = len > dst_len - 1;
    size_t keep = !cut ? len : dst_len > 4 ? dst_len - 4 : 0, n;

    if (dst_len == 0)
        return;
    for (n = 0; n < keep; n++)
        dst[n] = (src[n] >= ' ' && src[n] <= '~') ? src[n] : '?';
    for (; cut && n + 1 < dst_len; n++)
        dst[n] = '.';
    dst[n] = '\0';
}

td_status_t
td_hello_ident_check(const td_hello_ident_t *ident)
{
    if (!hello_role_valid(ident->role)) {
        td_error("hello: invalid own role %d", (int)ident->role);
        return TD_ERR_INVALID;
    }
    if (ident->node_id == NULL || !hello_node_id_valid(ident->node_id)) {
        td_error("hello: node id must be 1..%u printable bytes without spaces",
                 TD_HELLO_NODE_ID_MAX);
        return TD_ERR_INVALID;
    }
    if (ident->model_fingerprint == NULL ||
        strlen(ident->model_fingerprint) > TD_HELLO_MODEL_MAX) {
        td_error("hello: model fingerprint missing or longer than %u bytes",
                 TD_HELLO_MODEL_MAX);
        return TD_ERR_INVALID;
    }
    return TD_OK;
}

td_status_t
td_hello_nonce_make(uint8_t nonce[TD_HELLO_NONCE_LEN])
{
    if (RAND_bytes(nonce, TD_HELLO_NONCE_LEN) != 1) {
        td_error("hello: RAND_bytes failed");
        return TD_ERR_INTERNAL;
    }
    return TD_OK;
}

void
td_hello_build(Tandem__Hello *msg, const td_hello_ident_t *ident,
               const uint8_t nonce[TD_HELLO_NONCE_LEN])
{
    tandem__hello__init(msg);
    msg->protocol_version = ident->protocol_version;
    msg->role = ident->role;
    msg->node_id = (char *)ident->node_id;
    msg->rank_id = ident->rank_id;
    msg->incarnation = ident->incarnation;
    msg->model_fingerprint = (char *)ident->model_fingerprint;
    msg->kv_layout_hash = ident->kv_layout_hash;
    msg->nonce.data = (uint8_t *)nonce;
    msg->nonce.len = TD_HELLO_NONCE_LEN;
}

td_status_t
td_hello_check(const td_hello_ident_t *ours, const uint8_t our_nonce[TD_HELLO_NONCE_LEN],
               const Tandem__Hello *peer, char *reason, size_t reason_len,
               Tandem__RejectCode *code)
{
    char a[40], b[40];

    if (peer->protocol_version != ours->protocol_version) {
        snprintf(reason, reason_len, "protocol version differs (ours %" PRIu32
                 ", peer %" PRIu32 ")", ours->protocol_version, peer->protocol_version);
        *code = TANDEM__REJECT_CODE__REJECT_VERSION;
        return TD_ERR_MISMATCH;
    }
    if (!hello_role_valid(peer->role)) {
        snprintf(reason, reason_len, "invalid peer role %d", (int)peer->role);
        *code = TANDEM__REJECT_CODE__REJECT_IDENTITY;
        return TD_ERR_PROTO;
    }
    if (!hello_node_id_valid(peer->node_id)) {
        td_hello_printable(a, sizeof(a), peer->node_id, strlen(peer->node_id));
        snprintf(reason, reason_len, "invalid peer node id \"%s\"", a);
        *code = TANDEM__REJECT_CODE__REJECT_IDENTITY;
        return TD_ERR_PROTO;
    }
    if (peer->nonce.len != TD_HELLO_NONCE_LEN) {
        snprintf(reason, reason_len, "peer nonce is %zu bytes, want %u",
                 peer->nonce.len, TD_HELLO_NONCE_LEN);
        *code = TANDEM__REJECT_CODE__REJECT_IDENTITY;
        return TD_ERR_PROTO;
    }
    if (CRYPTO_memcmp(peer->nonce.data, our_nonce, TD_HELLO_NONCE_LEN) == 0) {
        snprintf(reason, reason_len, "peer nonce equals ours (our own hello reflected)");
        *code = TANDEM__REJECT_CODE__REJECT_AUTH;
        return TD_ERR_AUTH;
    }
    /* Incarnations are random per process: a peer with ours is this process
     * reached through itself, e.g. a relay of our own proof (docs). */
    if (peer->incarnation == ours->incarnation) {
        snprintf(reason, reason_len, "peer claims our own incarnation %016" PRIx64
                 ": a connection to ourselves or a relay", peer->incarnation);
        *code = TANDEM__REJECT_CODE__REJECT_IDENTITY;
        return TD_ERR_AUTH;
    }
    if (strcmp(peer->model_fingerprint, ours->model_fingerprint) != 0) {
        td_hello_printable(a, sizeof(a), ours->model_fingerprint,
                           strlen(ours->model_fingerprint));
        td_hello_printable(b, sizeof(b), peer->model_fingerprint,
                           strlen(peer->model_fingerprint));
        snprintf(reason, reason_len, "model fingerprint differs (ours %s, peer %s)", a, b);
        *code = TANDEM__REJECT_CODE__REJECT_MODEL;
        return TD_ERR_MISMATCH;
    }
    if (peer->kv_layout_hash != ours->kv_layout_hash) {
        snprintf(reason, reason_len, "kv layout hash differs (ours %016" PRIx64
                 ", peer %016" PRIx64 ")", ours->kv_layout_hash, peer->kv_layout_hash);
        *code = TANDEM__REJECT_CODE__REJECT_LAYOUT;
        return TD_ERR_MISMATCH;
    }
    return TD_OK;
}

/* Big-endian append helpers for the transcript; the caller sized the buffer. */
static uint8_t *
hello_put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);  p[3] = (uint8_t)v;
    return p + 4;
}

static uint8_t *
hello_put_u64(uint8_t *p, uint64_t v)
{
    return hello_put_u32(hello_put_u32(p, (uint32_t)(v >> 32)), (uint32_t)v);
}

static uint8_t *
hello_put_str(uint8_t *p, const char *s, size_t n)
{
    p = hello_put_u32(p, (uint32_t)n);
    memcpy(p, s, n);
    return p + n;
}

/* Worst-case canonical encoding of one Hello: 3 u32 + role u32, 2 u64, 2
 * length-prefixed strings, length-prefixed nonce. */
#define HELLO_ENC_MAX (4 * 4 + 2 * 8 + 4 + TD_HELLO_NODE_ID_MAX + 4 + TD_HELLO_MODEL_MAX + \
                       4 + TD_HELLO_NONCE_LEN)

/* Append h's canonical encoding at p; NULL when a field is out of bounds. */
static uint8_t *
hello_put_hello(uint8_t *p, const Tandem__Hello *h)
{
    size_t node_len = strlen(h->node_id), model_len = strlen(h->model_fingerprint);

    if (h->nonce.len != TD_HELLO_NONCE_LEN || node_len > TD_HELLO_NODE_ID_MAX ||
        model_len > TD_HELLO_MODEL_MAX)
        return NULL;
    p = hello_put_u32(p, h->protocol_version);
    p = hello_put_u32(p, (uint32_t)h->role);
    p = hello_put_str(p, h->node_id, node_len);
    p = hello_put_u32(p, h->rank_id);
    p = hello_put_u64(p, h->incarnation);
    p = hello_put_str(p, h->model_fingerprint, model_len);
    p = hello_put_u64(p, h->kv_layout_hash);
    return hello_put_str(p, (const char *)h->nonce.data, h->nonce.len);
}

td_status_t
td_hello_proof_compute(const uint8_t *secret, size_t secret_len, td_hello_dir_t prover,
                       const Tandem__Hello *initiator, const Tandem__Hello *acceptor,
                       uint8_t proof[TD_HELLO_PROOF_LEN])
{
    uint8_t buf[sizeof(HELLO_PROOF_LABEL) + 1 + 2 * HELLO_ENC_MAX];
    unsigned int md_len = 0;
    uint8_t *p = buf;

    if (secret_len == 0 || secret_len > INT32_MAX ||
        (prover != TD_HELLO_INITIATOR && prover != TD_HELLO_ACCEPTOR))
        return TD_ERR_RANGE;
    /* label NUL | prover | initiator's Hello | acceptor's Hello */
    memcpy(p, HELLO_PROOF_LABEL, sizeof(HELLO_PROOF_LABEL));
    p += sizeof(HELLO_PROOF_LABEL);
    *p++ = (uint8_t)prover;
    if ((p = hello_put_hello(p, initiator)) == NULL || (p = hello_put_hello(p, acceptor)) == NULL)
        return TD_ERR_RANGE;
    if (HMAC(EVP_sha256(), secret, (int)secret_len, buf, (size_t)(p - buf), proof,
             &md_len) == NULL || md_len != TD_HELLO_PROOF_LEN) {
        td_error("hello: HMAC-SHA256 failed");
        return TD_ERR_INTERNAL;
    }
    return TD_OK;
}

td_status_t
td_hello_proof_verify(const uint8_t *secret, size_t secret_len, td_hello_dir_t prover,
                      const Tandem__Hello *initiator, const Tandem__Hello *acceptor,
                      const ProtobufCBinaryData *proof, char *reason, size_t reason_len)
{
    uint8_t want[TD_HELLO_PROOF_LEN];
    td_status_t st;

    st = td_hello_proof_compute(secret, secret_len, prover, initiator, acceptor, want);
    if (st == TD_ERR_RANGE || (st == TD_OK && (proof->len != TD_HELLO_PROOF_LEN ||
                                               CRYPTO_memcmp(want, proof->data, TD_HELLO_PROOF_LEN) != 0))) {
        snprintf(reason, reason_len, "cluster secret proof failed");
        st = TD_ERR_AUTH;
    }
    OPENSSL_cleanse(want, sizeof(want));
    return st;
}
