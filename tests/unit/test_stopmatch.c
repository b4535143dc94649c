/* tests/unit/test_stopmatch.c — the one stop matcher (text/stopmatch.h): the
 * automaton's depth and longest match after every byte against a direct
 * search, on random texts and pattern sets; the stop filter on a table of
 * cases, each cut in every way, include_stop_str_in_output, arming
 * (min_tokens), and random texts against a reference of its rule. */
#include "buf.h"
#include "check.h"
#include "rng.h"
#include "stopmatch.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static td_rng_t rng = { .state = 11 };

/* ---- The automaton against a direct search ---------------------------------- */

/* The longest suffix of t[0..len) that is a prefix of a pattern (depth), and
 * the longest pattern that is a suffix (hit). */
static void
naive(const char *const *pats, size_t n, const char *t, size_t len, size_t *depth, size_t *hit)
{
    *depth = *hit = 0;
    for (size_t i = 0; i < n; i++) {
        size_t pl = strlen(pats[i]);
        if (pl <= len && memcmp(t + len - pl, pats[i], pl) == 0 && pl > *hit)
            *hit = pl;
        for (size_t k = pl < len ? pl : len; k > *depth; k--)
            if (memcmp(t + len - k, pats[i], k) == 0) {
                *depth = k;
                break;
            }
    }
}

static void
test_automaton_random(void)
{
    for (int round = 0; round < 300; round++) {
        char buf[6][8], text[200];
        const char *pats[6];
        size_t n = 1 + td_rng_next(&rng) % 6, len = td_rng_next(&rng) % sizeof(text);
        td_stopmatch_t *m = NULL;
        uint32_t s = TD_STOPMATCH_START;

        for (size_t i = 0; i < n; i++) {   /* small alphabet: many overlaps */
            size_t pl = 1 + td_rng_next(&rng) % 7;
            for (size_t k = 0; k < pl; k++)
                buf[i][k] = (char)('a' + td_rng_next(&rng) % 3);
            buf[i][pl] = '\0';
            pats[i] = buf[i];
        }
        for (size_t k = 0; k < len; k++)
            text[k] = (char)('a' + td_rng_next(&rng) % 3);
        CHECK_STATUS(td_stopmatch_create(pats, NULL, n, &m), TD_OK);
        if (m == NULL)
            return;
        for (size_t k = 0; k < len; k++) {
            size_t d, h, which;
            s = td_stopmatch_step(m, s, (unsigned char)text[k]);
            naive(pats, n, text, k + 1, &d, &h);
            CHECK_EQ_INT(td_stopmatch_depth(m, s), d);
            CHECK_EQ_INT(td_stopmatch_hit(m, s, &which), h);
            if (h > 0)
                CHECK_EQ_INT(strlen(pats[which]), h);
        }
        td_stopmatch_destroy(m);
    }
}

static void
test_automaton_edges(void)
{
    td_stopmatch_t *m = NULL;
    const char *none[] = { NULL };
    const char *empty[] = { "ok", "" };
    const char *bin[] = { "a\0b", "\xff" };
    const size_t binlen[] = { 3, 1 };
    uint32_t s = TD_STOPMATCH_START;

    CHECK_STATUS(td_stopmatch_create(none, NULL, 0, &m), TD_OK);   /* nothing matches */
    s = td_stopmatch_step(m, s, 'x');
    CHECK_EQ_INT(td_stopmatch_hit(m, s, NULL), 0);
    CHECK_EQ_INT(td_stopmatch_depth(m, s), 0);
    td_stopmatch_destroy(m);
    m = NULL;
    CHECK_STATUS(td_stopmatch_create(empty, NULL, 2, &m), TD_ERR_INVALID);
    CHECK(m == NULL);
    CHECK_STATUS(td_stopmatch_create(bin, binlen, 2, &m), TD_OK);   /* any bytes */
    s = TD_STOPMATCH_START;
    for (size_t i = 0; i < 3; i++)
        s = td_stopmatch_step(m, s, (unsigned char)"a\0b"[i]);
    CHECK_EQ_INT(td_stopmatch_hit(m, s, NULL), 3);
    s = td_stopmatch_step(m, s, 0xff);
    CHECK_EQ_INT(td_stopmatch_hit(m, s, NULL), 1);
    CHECK_EQ_INT(td_stopmatch_count(m), 2);
    CHECK_EQ_INT(td_stopmatch_len(m, 0), 3);
    td_stopmatch_destroy(m);
}

/* ---- The filter ----------------------------------------------------------------- */

/* Feed text cut at the offsets in cuts (ascending, ending with 0), then
 * flush; returns what came out and whether a stop matched. armed_from:
 * feeds that start before this byte are not armed. */
static char *
filter_run(const char *const *stops, size_t nstops, bool include, const char *text,
           const size_t *cuts, size_t armed_from, bool *matched)
{
    td_stopmatch_filter_t *f = NULL;
    td_buf_t out = {0};
    size_t len = strlen(text), at = 0;
    char *s;

    *matched = false;
    CHECK_STATUS(td_stopmatch_filter_create(stops, nstops, include, &f), TD_OK);
    if (f == NULL)
        return strdup("");
    for (size_t i = 0;; i++) {
        size_t end = cuts && cuts[i] ? cuts[i] : len;
        bool mt = false;
        size_t before = out.len;
        CHECK_STATUS(td_stopmatch_filter_feed(f, text + at, end - at, at >= armed_from, &out,
                                              &mt), TD_OK);
        if (*matched)
            CHECK_EQ_INT(out.len, before);   /* nothing after a match */
        *matched |= mt;
        at = end;
        if (end == len)
            break;
    }
    CHECK_STATUS(td_stopmatch_filter_flush(f, &out), TD_OK);
    td_stopmatch_filter_destroy(f);
    s = strdup(out.data ? out.data : "");
    td_buf_free(&out);
    return s;
}

static void
test_filter_cases(void)
{
    static const struct {
        const char *stops[4];
        const char *text, *want, *want_incl;
        bool matched;
    } cases[] = {
        { { NULL }, "no stops at all", "no stops at all", "no stops at all", false },
        { { "END" }, "abcEND", "abc", "abcEND", true },
        { { "END" }, "abcENDdef", "abc", "abcEND", true },
        { { "END" }, "ENDabc", "", "END", true },
        { { "END" }, "abcEN", "abcEN", "abcEN", false },   /* partial at the end: flushed */
        { { "END" }, "EEND", "E", "EEND", true },
        { { "aab" }, "aaab", "a", "aaab", true },          /* restart inside a partial */
        { { "abc", "bcd" }, "xabcd", "x", "xabc", true },  /* overlapping: abc completes first */
        { { "bcd", "abc" }, "xabcd", "x", "xabc", true },
        { { "abcd", "bc" }, "xabcd", "xa", "xabc", true }, /* bc completes before abcd */
        { { "b", "ab" }, "xab", "x", "xab", true },        /* same end: the longest */
        { { "\n\n", "###" }, "line\n#\n\nrest", "line\n#", "line\n#\n\n", true },
        { { "x", "y" }, "abc", "abc", "abc", false },
        { { "\xc3\xa9t\xc3\xa9" }, "caf\xc3\xa9 \xc3\xa9t\xc3\xa9!", "caf\xc3\xa9 ",
          "caf\xc3\xa9 \xc3\xa9t\xc3\xa9", true },
        { { "aaaa" }, "aaa", "aaa", "aaa", false },
        { { "aa", "aaa" }, "baaa", "b", "baa", true },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t ns = 0, len = strlen(cases[i].text);
        size_t bytes[64] = {0};

        while (ns < 4 && cases[i].stops[ns])
            ns++;
        for (size_t j = 1; j < len && j < 63; j++)
            bytes[j - 1] = j;
        /* whole, byte by byte, and every split into two pieces; with and
         * without the stop string in the output */
        for (int incl = 0; incl < 2; incl++)
            for (size_t split = 0; split <= len + 1; split++) {
                size_t two[2] = { split, 0 };
                const size_t *cuts = split == 0 ? NULL : split == len + 1 ? bytes : two;
                const char *want = incl ? cases[i].want_incl : cases[i].want;
                bool matched = false;
                char *got;

                if (split == len)
                    continue;   /* same as whole */
                got = filter_run(cases[i].stops, ns, incl, cases[i].text, cuts, 0, &matched);
                if (strcmp(got, want) != 0 || matched != cases[i].matched)
                    fprintf(stderr, "stop case %zu split %zu incl %d: got \"%s\" matched %d\n",
                            i, split, incl, got, matched);
                CHECK_STR(got, want);
                CHECK(matched == cases[i].matched);
                free(got);
            }
    }
}

static void
test_filter_hold(void)
{
    /* held text is released as soon as it cannot start a stop string */
    td_stopmatch_filter_t *f;
    const char *stops[] = { "STOP" };
    td_buf_t out = {0};
    bool mt;
    const char *empty[] = { "ok", "" };

    CHECK_STATUS(td_stopmatch_filter_create(stops, 1, false, &f), TD_OK);
    CHECK_STATUS(td_stopmatch_filter_feed(f, "abST", 4, true, &out, &mt), TD_OK);
    CHECK_STR(out.data, "ab");
    CHECK(!mt && td_stopmatch_filter_which(f) == NULL);
    CHECK_STATUS(td_stopmatch_filter_feed(f, "x", 1, true, &out, &mt), TD_OK);
    CHECK_STR(out.data, "abSTx");
    CHECK_STATUS(td_stopmatch_filter_feed(f, "STO", 3, true, &out, &mt), TD_OK);
    CHECK_STR(out.data, "abSTx");
    CHECK_STATUS(td_stopmatch_filter_feed(f, "P tail", 6, true, &out, &mt), TD_OK);
    CHECK(mt);
    CHECK_STR(out.data, "abSTx");
    CHECK_STR(td_stopmatch_filter_which(f), "STOP");
    CHECK_STATUS(td_stopmatch_filter_feed(f, "more", 4, true, &out, &mt), TD_OK);
    CHECK(mt);
    CHECK_STR(out.data, "abSTx");
    td_stopmatch_filter_destroy(f);
    td_buf_free(&out);

    /* which one matched, of several */
    const char *several[] = { "zz", "ab", "b" };
    CHECK_STATUS(td_stopmatch_filter_create(several, 3, false, &f), TD_OK);
    td_buf_reset(&out);
    CHECK_STATUS(td_stopmatch_filter_feed(f, "xxab", 4, true, &out, &mt), TD_OK);
    CHECK(mt);
    CHECK_STR(td_stopmatch_filter_which(f), "ab");   /* at equal ends the longest */
    td_stopmatch_filter_destroy(f);
    td_buf_free(&out);

    f = NULL;
    CHECK_STATUS(td_stopmatch_filter_create(empty, 2, false, &f), TD_ERR_INVALID);
    CHECK(f == NULL);
}

/* Not armed (min_tokens not reached): a stop string that completes then is
 * text; one that completes once armed counts, even when it began before. */
static void
test_filter_armed(void)
{
    const char *stops[] = { "END" };
    const size_t cuts[] = { 5, 8, 0 };   /* "xxEND" | "yyE" | "ND!" */
    bool matched;
    char *got = filter_run(stops, 1, false, "xxENDyyEND!", cuts, 5, &matched);

    CHECK_STR(got, "xxENDyy");
    CHECK(matched);
    free(got);
    got = filter_run(stops, 1, false, "xxENDyyEND", cuts, 100, &matched);   /* never armed */
    CHECK_STR(got, "xxENDyyEND");
    CHECK(!matched);
    free(got);
}

/* The filter's rule on random texts and cuts: output = text up to the
 * earliest end of a stop string (longest at that end), or all of it. */
static void
test_filter_random(void)
{
    for (int round = 0; round < 500; round++) {
        char buf[4][6], text[120];
        const char *stops[4];
        size_t n = 1 + td_rng_next(&rng) % 4, len = td_rng_next(&rng) % 100, cuts[8] = {0};
        size_t want = len, at = 0, ncut = 0;
        bool hit = false, matched;
        char *got;

        for (size_t i = 0; i < n; i++) {
            size_t pl = 1 + td_rng_next(&rng) % 5;
            for (size_t k = 0; k < pl; k++)
                buf[i][k] = (char)('a' + td_rng_next(&rng) % 3);
            buf[i][pl] = '\0';
            stops[i] = buf[i];
        }
        for (size_t k = 0; k < len; k++)
            text[k] = (char)('a' + td_rng_next(&rng) % 4);
        text[len] = '\0';
        for (size_t end = 1; end <= len && !hit; end++)
            for (size_t L = end; L > 0 && !hit; L--)
                for (size_t i = 0; i < n && !hit; i++)
                    if (strlen(stops[i]) == L && memcmp(text + end - L, stops[i], L) == 0) {
                        hit = true;
                        want = end - L;
                    }
        while (ncut < 7 && at < len) {
            at += 1 + td_rng_next(&rng) % 20;
            if (at < len)
                cuts[ncut++] = at;
        }
        got = filter_run(stops, n, false, text, cuts, 0, &matched);
        CHECK_EQ_INT(strlen(got), want);
        CHECK(memcmp(got, text, strlen(got)) == 0);
        CHECK(matched == hit);
        free(got);
    }
}

int
main(void)
{
    test_automaton_random();
    test_automaton_edges();
    test_filter_cases();
    test_filter_hold();
    test_filter_armed();
    test_filter_random();
    return td_check_exit("test_stopmatch");
}
