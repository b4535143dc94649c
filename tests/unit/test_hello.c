/* tests/unit/test_hello.c — Hello checks (one mismatch at a time, with the
 * reason an operator reads) and the HMAC proof: good, wrong secret, replayed
 * onto another connection, tampered Hello fields, reflected to its sender, a
 * proof obtained on a second connection to the same verifier, and a node's
 * own proof relayed back to it through a connection it made (refused by the
 * incarnation check). */
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
                M_NODE_SPACE, M_NONCE_SHORT, M_NONCE_OURS, M_INCARNATION_OURS };

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
          "protocol version differs (ours 2, peer 3)" },
        { M_MODEL, TD_ERR_MISMATCH, TANDEM__REJECT_CODE__REJECT_MODEL,
          "model fingerprint differs (ours deepseek-v4.1-flash@ab12, peer deepseek-v4.1-flash@cd?4)" },
        { M_LAYOUT, TD_ERR_MISMATCH, TANDEM__REJECT_CODE__REJECT_LAYOUT,
          "kv layout hash differs (ours 000000000000feed, peer 000000000000beef)" },
        { M_ROLE0, TD_ERR_PROTO, TANDEM__REJECT_CODE__REJECT_IDENTITY, "invalid peer role 0" },
        { M_ROLE99, TD_ERR_PROTO, TANDEM__REJECT_CODE__REJECT_IDENTITY, "invalid peer role 99" },
        { M_NODE_EMPTY, TD_ERR_PROTO, TANDEM__REJECT_CODE__REJECT_IDENTITY, "invalid peer node id \"\"" },
        { M_NODE_SPACE, TD_ERR_PROTO, TANDEM__REJECT_CODE__REJECT_IDENTITY, "invalid peer node id \"a b\"" },
        { M_NONCE_SHORT, TD_ERR_PROTO, TANDEM__REJECT_CODE__REJECT_IDENTITY, "peer nonce is 31 bytes, want 32" },
        /* Our whole Hello reflected (our incarnation too) reads as reflection. */
        { M_NONCE_OURS, TD_ERR_AUTH, TANDEM__REJECT_CODE__REJECT_AUTH,
          "peer nonce equals ours (our own hello reflected)" },
        { M_INCARNATION_OURS, TD_ERR_AUTH, TANDEM__REJECT_CODE__REJECT_IDENTITY,
          "peer claims our own incarnation 0000000000001234: a connection to ourselves or a relay" },
    };
    uint8_t nonce[TD_HELLO_NONCE_LEN] = { 1 }, our_nonce[TD_HELLO_NONCE_LEN] = { 2 };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        Tandem__Hello peer;
        td_hello_ident_t id = ours;
        char reason[TD_HELLO_REASON_MAX] = "";
        Tandem__RejectCode code = 0;

        id.role = TANDEM__ROLE__ROLE_PREFILL;
        id.node_id = "node-b";
        id.incarnation = 0x5678;
        switch (cases[i].m) {
        case M_VERSION:    id.protocol_version = TD_HELLO_PROTOCOL_VERSION + 1; break;
        case M_MODEL:      id.model_fingerprint = "deepseek-v4.1-flash@cd\0014"; break;
        case M_LAYOUT:     id.kv_layout_hash = 0xbeef; break;
        case M_ROLE0:      id.role = 0; break;
        case M_ROLE99:     id.role = 99; break;
        case M_NODE_EMPTY: id.node_id = ""; break;
        case M_NODE_SPACE: id.node_id = "a b"; break;
        case M_NONCE_OURS:
        case M_INCARNATION_OURS: id.incarnation = ours.incarnation; break;
        default: break;
        }
        td_hello_build(&peer, &id, cases[i].m == M_NONCE_OURS ? our_nonce : nonce);
        if (cases[i].m == M_NONCE_SHORT)
            peer.nonce.len = 31;
        CHECK_STATUS(td_hello_check(&ours, our_nonce, &peer, reason, sizeof(reason), &code),
                     cases[i].want);
        CHECK_STR(reason, cases[i].reason);
        CHECK_EQ_INT(code, cases[i].code);
    }
}

static const uint8_t secret[] = "cluster-secret";

/* proof by prover over (ini, acc) verifies against (ini2, acc2) as prover2? */
static td_status_t
verify_as(td_hello_dir_t prover, const Tandem__Hello *ini, const Tandem__Hello *acc,
          td_hello_dir_t prover2, const Tandem__Hello *ini2, const Tandem__Hello *acc2)
{
    uint8_t proof[TD_HELLO_PROOF_LEN];
    ProtobufCBinaryData pd = { sizeof(proof), proof };
    char reason[TD_HELLO_REASON_MAX] = "";
    td_status_t st;

    CHECK_STATUS(td_hello_proof_compute(secret, sizeof(secret), prover, ini, acc, proof), TD_OK);
    st = td_hello_proof_verify(secret, sizeof(secret), prover2, ini2, acc2, &pd, reason,
                               sizeof(reason));
    if (st != TD_OK)
        CHECK_STR(reason, "cluster secret proof failed");
    return st;
}

static void
test_proof(void)
{
    static const uint8_t other[] = "cluster-secreT";
    static const td_hello_ident_t them = {
        .protocol_version = TD_HELLO_PROTOCOL_VERSION, .role = TANDEM__ROLE__ROLE_PREFILL,
        .node_id = "node-b", .rank_id = 1, .incarnation = 0x5678,
        .model_fingerprint = "deepseek-v4.1-flash@ab12", .kv_layout_hash = 0xfeed,
    };
    uint8_t na[TD_HELLO_NONCE_LEN], nb[TD_HELLO_NONCE_LEN], nc[TD_HELLO_NONCE_LEN];
    uint8_t proof[TD_HELLO_PROOF_LEN], proof2[TD_HELLO_PROOF_LEN];
    ProtobufCBinaryData pd = { sizeof(proof), proof };
    char reason[TD_HELLO_REASON_MAX];
    const td_hello_dir_t I = TD_HELLO_INITIATOR, A = TD_HELLO_ACCEPTOR;
    Tandem__Hello a, b, c;

    CHECK_STATUS(td_hello_nonce_make(na), TD_OK);
    CHECK_STATUS(td_hello_nonce_make(nb), TD_OK);
    CHECK_STATUS(td_hello_nonce_make(nc), TD_OK);
    CHECK(memcmp(na, nb, sizeof(na)) != 0);
    td_hello_build(&a, &them, na);   /* a connects ... */
    td_hello_build(&b, &ours, nb);   /* ... to b */

    /* Each side proves over both Hellos; the other verifies. Deterministic. */
    CHECK_STATUS(verify_as(I, &a, &b, I, &a, &b), TD_OK);
    CHECK_STATUS(verify_as(A, &a, &b, A, &a, &b), TD_OK);
    CHECK_STATUS(td_hello_proof_compute(secret, sizeof(secret), I, &a, &b, proof), TD_OK);
    CHECK_STATUS(td_hello_proof_compute(secret, sizeof(secret), I, &a, &b, proof2), TD_OK);
    CHECK(memcmp(proof, proof2, sizeof(proof)) == 0);
    CHECK_STATUS(td_hello_proof_compute(secret, sizeof(secret), A, &a, &b, proof2), TD_OK);
    CHECK(memcmp(proof, proof2, sizeof(proof)) != 0);

    /* Wrong secret; short proof. */
    reason[0] = '\0';
    CHECK_STATUS(td_hello_proof_verify(other, sizeof(other), I, &a, &b, &pd, reason,
                                       sizeof(reason)), TD_ERR_AUTH);
    CHECK_STR(reason, "cluster secret proof failed");
    pd.len = TD_HELLO_PROOF_LEN - 1;
    CHECK_STATUS(td_hello_proof_verify(secret, sizeof(secret), I, &a, &b, &pd, reason,
                                       sizeof(reason)), TD_ERR_AUTH);

    /* Every field of either Hello is inside: change one after proving. */
    for (int side = 0; side < 2; side++) {
        for (int f = 0; f < 8; f++) {
            Tandem__Hello ta = a, tb = b, *t = side ? &tb : &ta;
            uint8_t n2[TD_HELLO_NONCE_LEN];

            memcpy(n2, t->nonce.data, sizeof(n2));
            n2[31] ^= 1;
            switch (f) {
            case 0: t->protocol_version++; break;
            case 1: t->role = TANDEM__ROLE__ROLE_ROUTER; break;
            case 2: t->node_id = "node-x"; break;
            case 3: t->rank_id++; break;
            case 4: t->incarnation++; break;
            case 5: t->model_fingerprint = "deepseek-v4.1-flash@ab13"; break;
            case 6: t->kv_layout_hash++; break;
            case 7: t->nonce.data = n2; break;
            }
            CHECK_STATUS(verify_as(I, &a, &b, I, &ta, &tb), TD_ERR_AUTH);
        }
    }
    /* Replayed onto another connection: the verifier's fresh nonce differs. */
    td_hello_build(&c, &ours, nc);
    CHECK_STATUS(verify_as(I, &a, &b, I, &a, &c), TD_ERR_AUTH);

    /* Reflection: b's own proof sent back to it as if from the initiator,
     * also when b's own Hello is reflected too (same Hello in both slots). */
    CHECK_STATUS(verify_as(A, &a, &b, I, &a, &b), TD_ERR_AUTH);
    CHECK_STATUS(verify_as(A, &b, &b, I, &b, &b), TD_ERR_AUTH);
    /* Roles swapped: a proof made as initiator of (a, b) is not one of (b, a). */
    CHECK_STATUS(verify_as(I, &a, &b, I, &b, &a), TD_ERR_AUTH);

    /* Second connection: the attacker holds connection 1 to b (b's Hello b,
     * nonce nb) and opens connection 2 (b's Hello c, nonce nc), sending there
     * a Hello x that carries nb. b proves on connection 2; on connection 1 the
     * attacker presents c as its own Hello and wants that proof accepted. */
    {
        Tandem__Hello x = a;

        x.nonce.data = nb;
        CHECK_STATUS(verify_as(A, &x, &c, I, &c, &b), TD_ERR_AUTH);
        CHECK_STATUS(verify_as(A, &x, &c, A, &c, &b), TD_ERR_AUTH);
    }
    CHECK_STATUS(td_hello_proof_compute(secret, 0, I, &a, &b, proof), TD_ERR_RANGE);
    CHECK_STATUS(td_hello_proof_compute(secret, sizeof(secret), 0, &a, &b, proof), TD_ERR_RANGE);
}

/* Relay through a self-connection: the attacker holds connection 1 to b (b
 * accepted: b's Hello b1, nonce n1) and makes b connect to it (connection 2:
 * b's Hello b2, nonce n2). It sends b2 on connection 1 as its own Hello and
 * b1 on connection 2 as the acceptor's, then relays b's initiator proof from
 * connection 2 into connection 1. The transcripts match, so the proof alone
 * verifies; the Hello check refuses it first (b2 carries b's incarnation). */
static void
test_relay_to_self(void)
{
    uint8_t n1[TD_HELLO_NONCE_LEN], n2[TD_HELLO_NONCE_LEN];
    char reason[TD_HELLO_REASON_MAX] = "";
    Tandem__RejectCode code = 0;
    Tandem__Hello b1, b2;

    CHECK_STATUS(td_hello_nonce_make(n1), TD_OK);
    CHECK_STATUS(td_hello_nonce_make(n2), TD_OK);
    td_hello_build(&b1, &ours, n1);
    td_hello_build(&b2, &ours, n2);
    /* b's proof as initiator of connection 2 over (b2, b1) ... */
    CHECK_STATUS(verify_as(TD_HELLO_INITIATOR, &b2, &b1, TD_HELLO_INITIATOR, &b2, &b1), TD_OK);
    /* ... but on connection 1 b never gets that far with peer Hello b2. */
    CHECK_STATUS(td_hello_check(&ours, n1, &b2, reason, sizeof(reason), &code), TD_ERR_AUTH);
    CHECK_STR(reason, "peer claims our own incarnation 0000000000001234: "
                      "a connection to ourselves or a relay");
    CHECK_EQ_INT(code, TANDEM__REJECT_CODE__REJECT_IDENTITY);
    /* The same on connection 2, where b is the initiator and sees b1. */
    CHECK_STATUS(td_hello_check(&ours, n2, &b1, reason, sizeof(reason), &code), TD_ERR_AUTH);
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
    test_relay_to_self();
    test_printable_and_ident();
    return td_check_exit("test_hello");
}
