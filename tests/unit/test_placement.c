/* tests/unit/test_placement.c — model/placement: contiguous ranges with
 * uneven counts, placement files (replicas; every refusal with its reason),
 * and the replica rule. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "logcap.h"
#include "placement.h"

/* What rank r holds, as a string of expert ids ("0 1 "), and how many. */
static uint32_t
held_str(const td_placement_t *p, uint32_t r, char *out, size_t len)
{
    size_t at = 0;
    uint32_t n = 0;

    out[0] = '\0';
    for (uint32_t e = 0; e < td_placement_experts(p) && at < len; e++)
        if (td_placement_holds(p, r, e)) {
            at += (size_t)snprintf(out + at, len - at, "%u ", e);
            n++;
        }
    return n;
}

/* The default: contiguous ranges, the first E % n ranks one more. */
static void
test_ranges(void)
{
    static const struct {
        uint32_t experts, ranks;
        const char *held[8];   /* per rank */
    } cases[] = {
        { 6, 4, { "0 1 ", "2 3 ", "4 ", "5 " } },
        { 16, 8, { "0 1 ", "2 3 ", "4 5 ", "6 7 ", "8 9 ", "10 11 ", "12 13 ", "14 15 " } },
        { 8, 3, { "0 1 2 ", "3 4 5 ", "6 7 " } },
        { 6, 8, { "0 ", "1 ", "2 ", "3 ", "4 ", "5 ", "", "" } },
        { 8, 1, { "0 1 2 3 4 5 6 7 " } },
        { 1, 1, { "0 " } },
    };
    char got[128];

    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        td_placement_t *p = NULL;
        CHECK_STATUS(td_placement_create_ranges(cases[c].experts, cases[c].ranks, &p), TD_OK);
        if (p == NULL)
            continue;
        CHECK_EQ_INT(td_placement_ranks(p), cases[c].ranks);
        CHECK_EQ_INT(td_placement_experts(p), cases[c].experts);
        for (uint32_t r = 0; r < cases[c].ranks; r++) {
            uint32_t n = held_str(p, r, got, sizeof(got));
            CHECK_STR(got, cases[c].held[r]);
            CHECK_EQ_INT(td_placement_held(p, r), n);
        }
        for (uint32_t e = 0; e < cases[c].experts; e++) {
            const uint32_t *reps;
            CHECK_EQ_INT(td_placement_replicas(p, e, &reps), 1);
            CHECK(td_placement_holds(p, reps[0], e));
            for (uint32_t r = 0; r < cases[c].ranks; r++)   /* one replica: always it */
                for (uint64_t row = 0; row < 3; row++)
                    CHECK_EQ_INT(td_placement_route(p, e, r, row), reps[0]);
        }
        CHECK(!td_placement_holds(p, cases[c].ranks, 0));   /* out of range: no */
        CHECK(!td_placement_holds(p, 0, cases[c].experts));
        td_placement_destroy(p);
    }
    td_placement_t *p = NULL;
    td_logcap_start();
    CHECK_STATUS(td_placement_create_ranges(0, 1, &p), TD_ERR_INVALID);
    CHECK_STATUS(td_placement_create_ranges(4, 0, &p), TD_ERR_INVALID);
    CHECK_STATUS(td_placement_create_ranges(4, TD_PLACEMENT_MAX_RANKS + 1, &p), TD_ERR_INVALID);
    CHECK_EQ_INT(td_logcap.errors, 3);
    td_logcap_stop();
    CHECK(p == NULL);
}

/* A file with replicas: holdings, replica lists and the rule (own rank
 * first, else round-robin over the rows from the rank's offset). */
static void
test_replicas(void)
{
    static const char text[] =
        "{\"experts\": 6, \"ranks\": [[0, 1], [2, 3, 0], [4, 5, 0], [5, 1]]}";
    td_placement_t *p = NULL;
    char err[256] = "", got[64];
    const uint32_t *reps;

    CHECK_STATUS(td_placement_parse(text, strlen(text), 6, 4, &p, err, sizeof(err)), TD_OK);
    if (p == NULL) {
        fprintf(stderr, "replicas: %s\n", err);
        return;
    }
    CHECK_EQ_INT(held_str(p, 0, got, sizeof(got)), 2);
    CHECK_STR(got, "0 1 ");
    CHECK_EQ_INT(held_str(p, 1, got, sizeof(got)), 3);
    CHECK_STR(got, "0 2 3 ");
    CHECK_EQ_INT(td_placement_held(p, 3), 2);
    CHECK_EQ_INT(td_placement_replicas(p, 0, &reps), 3);
    CHECK(reps[0] == 0 && reps[1] == 1 && reps[2] == 2);
    CHECK_EQ_INT(td_placement_replicas(p, 5, &reps), 2);
    CHECK(reps[0] == 2 && reps[1] == 3);
    CHECK_EQ_INT(td_placement_replicas(p, 3, &reps), 1);
    /* a rank holding a replica keeps its tokens */
    for (uint64_t row = 0; row < 5; row++) {
        CHECK_EQ_INT(td_placement_route(p, 0, 1, row), 1);
        CHECK_EQ_INT(td_placement_route(p, 5, 3, row), 3);
        CHECK_EQ_INT(td_placement_route(p, 3, 0, row), 1);   /* a single replica */
    }
    /* rank 3 and expert 0 (replicas 0, 1, 2): (3 + row) % 3 */
    static const uint32_t want0[] = { 0, 1, 2, 0, 1, 2 };
    for (uint64_t row = 0; row < 6; row++)
        CHECK_EQ_INT(td_placement_route(p, 0, 3, row), want0[row]);
    /* rank 1 and expert 5 (replicas 2, 3): (1 + row) % 2 */
    static const uint32_t want5[] = { 3, 2, 3, 2 };
    for (uint64_t row = 0; row < 4; row++)
        CHECK_EQ_INT(td_placement_route(p, 5, 1, row), want5[row]);
    td_placement_destroy(p);

    /* "experts" may be left out; a rank may hold nothing */
    static const char bare[] = "{\"ranks\": [[0, 1, 2], []]}";
    p = NULL;
    CHECK_STATUS(td_placement_parse(bare, strlen(bare), 3, 2, &p, err, sizeof(err)), TD_OK);
    if (p != NULL) {
        CHECK_EQ_INT(td_placement_held(p, 1), 0);
        for (uint32_t e = 0; e < 3; e++)
            CHECK_EQ_INT(td_placement_route(p, e, 1, 7), 0);
    }
    td_placement_destroy(p);
}

/* Every refusal, with its reason. */
static void
test_refused(void)
{
    static const struct {
        const char *text;
        uint32_t experts, ranks;
        const char *why;   /* a part of the message */
    } cases[] = {
        { "{\"ranks\": [[0, 1], [2, 3]", 4, 2, "not JSON" },
        { "[[0, 1], [2, 3]]", 4, 2, "not a JSON object" },
        { "{\"rank\": [[0, 1], [2, 3]]}", 4, 2, "unknown key \"rank\"" },
        { "{\"experts\": 8, \"ranks\": [[0, 1], [2, 3]]}", 4, 2, "\"experts\" is not 4" },
        { "{\"experts\": \"4\", \"ranks\": [[0, 1], [2, 3]]}", 4, 2, "\"experts\" is not 4" },
        { "{\"experts\": 4}", 4, 2, "\"ranks\" is missing" },
        { "{\"ranks\": {\"0\": [0]}}", 4, 2, "\"ranks\" is missing or not an array" },
        { "{\"ranks\": [[0, 1, 2, 3]]}", 4, 2, "lists 1 ranks, the group has 2" },
        { "{\"ranks\": [[0, 1], [2, 3], []]}", 4, 2, "lists 3 ranks, the group has 2" },
        { "{\"ranks\": [[0, 1], 2]}", 4, 2, "ranks[1] is not an array" },
        { "{\"ranks\": [[0, 1], [2, 4]]}", 4, 2, "ranks[1][1] is not an expert id in [0, 4)" },
        { "{\"ranks\": [[0, -1], [2, 3]]}", 4, 2, "ranks[0][1] is not an expert id" },
        { "{\"ranks\": [[0, 1.0], [2, 3]]}", 4, 2, "ranks[0][1] is not an expert id" },
        { "{\"ranks\": [[0, \"1\"], [2, 3]]}", 4, 2, "ranks[0][1] is not an expert id" },
        { "{\"ranks\": [[0, 1, 0], [2, 3]]}", 4, 2, "ranks[0] lists expert 0 twice" },
        { "{\"ranks\": [[0, 1], [3]]}", 4, 2, "expert 2 is held by no rank" },
        { "{\"ranks\": [[], []]}", 4, 2, "expert 0 is held by no rank" },
        { "{\"ranks\": [[0], [0]], \"ranks\": [[0], [0]]}", 1, 2, "not JSON" },
        { "{\"ranks\": []}", 4, 0, "0 ranks" },
    };
    char err[256];

    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        td_placement_t *p = NULL;
        err[0] = '\0';
        CHECK_STATUS(td_placement_parse(cases[c].text, strlen(cases[c].text), cases[c].experts,
                                        cases[c].ranks, &p, err, sizeof(err)), TD_ERR_INVALID);
        CHECK(p == NULL);
        if (strstr(err, cases[c].why) == NULL) {
            fprintf(stderr, "case %zu (%s): message \"%s\" lacks \"%s\"\n", c, cases[c].text,
                    err, cases[c].why);
            td_check_failures++;
        }
    }
}

/* A file: read, parsed; a bad one refused with one error line naming it. */
static void
test_load(void)
{
    char path[] = "/tmp/test_placement.XXXXXX";
    int fd = mkstemp(path);
    td_placement_t *p = NULL;

    CHECK(fd >= 0);
    if (fd < 0)
        return;
    static const char good[] = "{\"experts\": 4, \"ranks\": [[0, 1, 2], [2, 3]]}\n";
    CHECK(write(fd, good, strlen(good)) == (ssize_t)strlen(good));
    close(fd);
    CHECK_STATUS(td_placement_load(path, 4, 2, &p), TD_OK);
    if (p != NULL)
        CHECK_EQ_INT(td_placement_held(p, 0), 3);
    td_placement_destroy(p);
    p = NULL;

    td_logcap_start();
    CHECK_STATUS(td_placement_load(path, 4, 3, &p), TD_ERR_INVALID);
    CHECK_EQ_INT(td_logcap.errors, 1);
    CHECK(strstr(td_logcap.last, path) != NULL);
    CHECK(strstr(td_logcap.last, "\"ranks\" lists 2 ranks, the group has 3") != NULL);
    unlink(path);
    td_logcap_reset();
    CHECK_STATUS(td_placement_load(path, 4, 2, &p), TD_ERR_NOT_FOUND);
    CHECK_EQ_INT(td_logcap.errors, 1);
    CHECK(strstr(td_logcap.last, path) != NULL);
    td_logcap_stop();
    CHECK(p == NULL);
}

int
main(void)
{
    td_log_set_level(TD_LOG_WARN);
    test_ranges();
    test_replicas();
    test_refused();
    test_load();
    return td_check_exit("test_placement");
}
