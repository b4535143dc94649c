/* net/hello.h — the control-plane handshake as pure functions: build our
 * Hello, check a peer's Hello against our expectations, and compute / verify
 * the HMAC-SHA256 proof of the cluster secret (docs/control-plane.md). */
#ifndef TD_HELLO_H
#define TD_HELLO_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tandem.pb-c.h"

#define TD_HELLO_PROTOCOL_VERSION 2u
#define TD_HELLO_NONCE_LEN        32u
#define TD_HELLO_PROOF_LEN        32u   /* HMAC-SHA256 */
#define TD_HELLO_NODE_ID_MAX      64u   /* bytes, printable ASCII */
#define TD_HELLO_MODEL_MAX        256u  /* bytes of model fingerprint */
#define TD_HELLO_REASON_MAX       256u  /* reason buffers, NUL included */

/* Who we are and what the peer must agree with. Strings are borrowed. */
typedef struct {
    uint32_t protocol_version;       /* TD_HELLO_PROTOCOL_VERSION in daemons */
    Tandem__Role role;
    const char *node_id;
    uint32_t rank_id;
    uint64_t incarnation;
    const char *model_fingerprint;
    uint64_t kv_layout_hash;
} td_hello_ident_t;

/* TD_OK when ident is something we may send (known role, node id 1..64
 * printable bytes, fingerprint <= 256 bytes); logs why not. */
td_status_t td_hello_ident_check(const td_hello_ident_t *ident);

/* Fill 32 fresh random bytes (OpenSSL RAND_bytes). */
td_status_t td_hello_nonce_make(uint8_t nonce[TD_HELLO_NONCE_LEN]);

/* Fill msg (initialised here) from ident and nonce; msg borrows their memory,
 * so it is valid while they are. */
void td_hello_build(Tandem__Hello *msg, const td_hello_ident_t *ident,
                    const uint8_t nonce[TD_HELLO_NONCE_LEN]);

/* Which end of the TCP connection a side is: the one that called connect()
 * or the one that accepted. Part of every proof, so a proof made by one end
 * is never valid coming from the other. */
typedef enum {
    TD_HELLO_INITIATOR = 1,
    TD_HELLO_ACCEPTOR  = 2,
} td_hello_dir_t;

/* Check the peer's Hello against ours (our_nonce: the nonce in the Hello we
 * sent). TD_OK, or TD_ERR_MISMATCH (version, model, layout) / TD_ERR_PROTO
 * (bad role, node id, nonce) / TD_ERR_AUTH (the peer's nonce is ours: our
 * own Hello reflected; or its incarnation is ours: a connection to ourselves,
 * e.g. our own proof relayed) with a readable reason in reason[reason_len] and
 * the matching Reject code in *code. */
td_status_t td_hello_check(const td_hello_ident_t *ours,
                           const uint8_t our_nonce[TD_HELLO_NONCE_LEN],
                           const Tandem__Hello *peer, char *reason, size_t reason_len,
                           Tandem__RejectCode *code);

/* proof = HMAC-SHA256(secret, label || prover || initiator's Hello ||
 * acceptor's Hello), every field of both Hellos (nonces included) in a
 * canonical big-endian encoding (docs/control-plane.md). Both ends compute
 * it over the same two Hellos; only the prover byte differs. TD_ERR_RANGE for
 * out-of-bounds fields. */
td_status_t td_hello_proof_compute(const uint8_t *secret, size_t secret_len,
                                   td_hello_dir_t prover, const Tandem__Hello *initiator,
                                   const Tandem__Hello *acceptor,
                                   uint8_t proof[TD_HELLO_PROOF_LEN]);

/* TD_OK when proof is the right one from prover over the two Hellos
 * (constant-time compare); TD_ERR_AUTH with a reason otherwise. */
td_status_t td_hello_proof_verify(const uint8_t *secret, size_t secret_len,
                                  td_hello_dir_t prover, const Tandem__Hello *initiator,
                                  const Tandem__Hello *acceptor,
                                  const ProtobufCBinaryData *proof,
                                  char *reason, size_t reason_len);

/* Copy len bytes of untrusted text into dst[dst_len] as printable ASCII
 * (others become '?'), truncated with "..." — for logging peer strings. */
void td_hello_printable(char *dst, size_t dst_len, const char *src, size_t len);

/* "router", "prefill", "decode", "tool", or "?" */
const char *td_hello_role_str(Tandem__Role role);

#endif
