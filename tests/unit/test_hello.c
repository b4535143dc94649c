/* tests/unit/test_hello.c — Hello checks (one mismatch at a time, with the
 * reason an operator reads) and the HMAC proof: good, wrong secret, replayed
 * onto another connection's nonce, tampered identity. */
#include "check.h"
#include "hello.h"

#include <string.h>

static const td_hello_ident_t ours = {
    .protocol_version = TD_HELLO_PROTOCOL_VERSION,
    .role = TANDEM__ROLE__ROLE_DECODE,
    .node_id = "node-a",
    .rank_id = 3,
    .incarnation = 0x1234,
    .model_fingerprint = "deepseek-v4.1-flash@ab12",
    .kv_layout_hash = 0xfeed,
};

enum mutation { M_NONE, M_VERSION, M_MODEL, M_LAYOUT, M_ROLE0, M_ROLE99, M_NODE_EMPTY,
                M_NODE_SPACE, M_NONCE_SHORT };

static void
test_check(void)
{
    static const struct {
        enum mutation m;
        td_status_t want;
        Tandem__RejectCode code;
        const char *reason;
    } cases[] = {
        { M_NONE, TD_OK, 0, "" },
        { M_VERSION, TD_ERR_MISMATCH, TANDEM__REJECT_CODE__REJECT_VERSION,
          "protocol version differs (ours 1, peer 2)" },
        { M_MODEL, TD_ERR_MISMATCH, TANDEM__REJECT_CODE__REJECT_MODEL,
          "model fingerprint differs (ours deepseek-v4.1-flash@ab12, peer deepseek-v4.1-flash@cd?4)" },
        { M_LAYOUT, TD_ERR_MISMATCH, TANDEM__REJECT_CODE__REJECT_LAYOUT,
          "kv layout hash differs (ours 000000000000feed, peer 000000000000beef)" },
        { M_ROLE0, TD_ERR_PROTO, TANDEM__REJECT_CODE__REJECT_IDENTITY, "invalid peer role 0" },
        { M_ROLE99, TD_ERR_PROTO, TANDEM__REJECT_CODE__REJECT_IDENTITY, "invalid peer role 99" },
        { M_NODE_EMPTY, TD_ERR_PROTO, TANDEM__REJECT_CODE__REJECT_IDENTITY, "invalid peer node id \"\"" },
        { M_NODE_SPACE, TD_ERR_PROTO, TANDEM__REJECT_CODE__REJECT_IDENTITY, "invalid peer node id \"a b\"" },
        { M_NONCE_SHORT, TD_ERR_PROTO, TANDEM__REJECT_CODE__REJECT_IDENTITY, "peer nonce is 31 bytes, want 32" },
    };
    uint8_t nonce[TD_HELLO_NONCE_LEN] = { 1 };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        Tandem__Hello peer;
        td_hello_ident_t id = ours;
        char reason[TD_HELLO_REASON_MAX] = "";
        Tandem__RejectCode code = 0;

        id.role = TANDEM__ROLE__ROLE_PREFILL;
        id.node_id = "node-b";
        switch (cases[i].m) {
        case M_VERSION:    id.protocol_version = 2; break;
        case M_MODEL:      id.model_fingerprint = "deepseek-v4.1-flash@cd\0014"; break;
        case M_LAYOUT:     id.kv_layout_hash = 0xbeef; break;
        case M_ROLE0:      id.role = 0; break;
        case M_ROLE99:     id.role = 99; break;
        case M_NODE_EMPTY: id.node_id = ""; break;
        case M_NODE_SPACE: id.node_id = "a b"; break;
        default: break;
        }
        td_hello_build(&peer, &id, nonce);
        if (cases[i].m == M_NONCE_SHORT)
            peer.nonce.len = 31;
        CHECK_STATUS(td_hello_check(&ours, &peer, reason, sizeof(reason), &code), cases[i].want);
        CHECK_STR(reason, cases[i].reason);
        CHECK_EQ_INT(code, cases[i].code);
    }
}

static void
test_proof(void)
{
    static const uint8_t secret[] = "cluster-secret", other[] = "cluster-secreT";
    uint8_t na[TD_HELLO_NONCE_LEN], nb[TD_HELLO_NONCE_LEN], nc[TD_HELLO_NONCE_LEN];
    uint8_t proof[TD_HELLO_PROOF_LEN], proof2[TD_HELLO_PROOF_LEN];
    ProtobufCBinaryData pd = { sizeof(proof), proof };
    char reason[TD_HELLO_REASON_MAX];
    Tandem__Hello a;

    CHECK_STATUS(td_hello_nonce_make(na), TD_OK);
    CHECK_STATUS(td_hello_nonce_make(nb), TD_OK);
    CHECK_STATUS(td_hello_nonce_make(nc), TD_OK);
    CHECK(memcmp(na, nb, sizeof(na)) != 0);
    td_hello_build(&a, &ours, na);

    /* A proves to B over B's nonce; B verifies with its own nonce. */
    CHECK_STATUS(td_hello_proof_compute(secret, sizeof(secret), nb, &a, proof), TD_OK);
    CHECK_STATUS(td_hello_proof_verify(secret, sizeof(secret), nb, &a, &pd, reason,
                                       sizeof(reason)), TD_OK);
    /* Deterministic, and different for another verifier nonce. */
    CHECK_STATUS(td_hello_proof_compute(secret, sizeof(secret), nb, &a, proof2), TD_OK);
    CHECK(memcmp(proof, proof2, sizeof(proof)) == 0);

    static const struct { const char *name; int wrong_secret, replay, tamper, short_proof, reflect; } bad[] = {
        { "wrong secret", 1, 0, 0, 0, 0 },
        { "replayed onto another connection", 0, 1, 0, 0, 0 },
        { "identity changed after proving", 0, 0, 1, 0, 0 },
        { "short proof", 0, 0, 0, 1, 0 },
        { "reflected nonces", 0, 0, 0, 0, 1 },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        Tandem__Hello peer = a;
        ProtobufCBinaryData p = pd;
        const uint8_t *verifier_nonce = bad[i].replay ? nc : nb;

        if (bad[i].tamper)
            peer.rank_id = 4;
        if (bad[i].short_proof)
            p.len = TD_HELLO_PROOF_LEN - 1;
        if (bad[i].reflect) {   /* B's nonce in A's hello, A's nonce as verifier */
            peer.nonce.data = nb;
            verifier_nonce = na;
        }
        reason[0] = '\0';
        CHECK_STATUS(td_hello_proof_verify(bad[i].wrong_secret ? other : secret, sizeof(secret),
                                           verifier_nonce, &peer, &p, reason, sizeof(reason)),
                     TD_ERR_AUTH);
        CHECK_STR(reason, "cluster secret proof failed");
    }
    CHECK_STATUS(td_hello_proof_compute(secret, 0, nb, &a, proof), TD_ERR_RANGE);
}

static void
test_printable_and_ident(void)
{
    char out[8];
    td_hello_ident_t id = ours;

    td_hello_printable(out, sizeof(out), "a\nb\x7f", 4);
    CHECK_STR(out, "a?b?");
    td_hello_printable(out, sizeof(out), "abcdefghij", 10);
    CHECK_STR(out, "abcd...");
    td_hello_printable(out, sizeof(out), "abcdefg", 7);
    CHECK_STR(out, "abcdefg");
    CHECK_STR(td_hello_role_str(TANDEM__ROLE__ROLE_PREFILL), "prefill");
    CHECK_STR(td_hello_role_str(42), "?");

    CHECK_STATUS(td_hello_ident_check(&id), TD_OK);
    id.role = 0;
    CHECK_STATUS(td_hello_ident_check(&id), TD_ERR_INVALID);
    id = ours;
    id.node_id = "has space";
    CHECK_STATUS(td_hello_ident_check(&id), TD_ERR_INVALID);
}

int
main(void)
{
    test_check();
    test_proof();
    test_printable_and_ident();
    return td_check_exit("test_hello");
}
