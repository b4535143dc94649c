/* tests/unit/test_rconv.c — routerd/rconv.c, the decode ranks' kept
 * conversation states as routerd finds them: the longest kept sequence a
 * prompt begins with (and is longer than), at every length around the
 * hashed blocks; ranks that cannot take work skipped; replacement by id,
 * removal by id and by rank, the oldest forgotten at the cap; of two states
 * of the same tokens, the newer. */
#include <stdlib.h>
#include <string.h>

#include "chainhash.h"
#include "check.h"
#include "rconv.h"

#define SEED 77u

static int rank_a, rank_b;   /* stand-ins: only their addresses count */

/* The hit for prompt tokens[0..n), or ntokens 0 when none. */
static td_rconv_hit_t
find(td_rconv_t *t, const int32_t *tokens, size_t n, bool (*usable)(void *, void *))
{
    td_rcache_prompt_t p;
    td_rconv_hit_t hit = { NULL, 0, 0 };

    td_rcache_prompt_init(&p, SEED, tokens, n);
    if (!td_rconv_find(t, &p, usable, NULL, &hit))
        hit = (td_rconv_hit_t){ NULL, 0, 0 };
    td_rcache_prompt_fini(&p);
    return hit;
}

static bool
not_b(void *rank, void *arg)
{
    (void)arg;
    return rank != &rank_b;
}

static void
test_lengths(void)
{
    int32_t tok[100];
    td_rconv_t *t = NULL;

    for (int i = 0; i < 100; i++)
        tok[i] = 1000 + i * 7;
    CHECK_STATUS(td_rconv_create(64, &t), TD_OK);
    if (t == NULL)
        return;
    /* one state of every length from 1 to 40: a prompt of n tokens finds n - 1 */
    for (uint64_t n = 1; n <= 40; n++)
        CHECK_STATUS(td_rconv_add(t, &rank_a, 500 + n, SEED, tok, n), TD_OK);
    CHECK_EQ_INT(td_rconv_count(t), 40);
    for (size_t n = 2; n <= 41; n++) {
        td_rconv_hit_t h = find(t, tok, n, NULL);
        CHECK_EQ_INT(h.ntokens, n - 1);
        CHECK_EQ_INT(h.id, 500 + n - 1);
        CHECK(h.rank == &rank_a);
    }
    /* longer prompts find the longest: 40 */
    CHECK_EQ_INT(find(t, tok, 100, NULL).ntokens, 40);
    /* a prompt no longer than any state finds the shorter ones only */
    CHECK_EQ_INT(find(t, tok, 1, NULL).ntokens, 0);
    /* a prompt that differs at token 20 finds at most 20 tokens */
    int32_t other[100];
    memcpy(other, tok, sizeof(tok));
    other[20] ^= 1;
    CHECK_EQ_INT(find(t, other, 100, NULL).ntokens, 20);
    other[3] ^= 1;   /* inside the first block: at most 3 */
    CHECK_EQ_INT(find(t, other, 100, NULL).ntokens, 3);
    other[0] ^= 1;
    CHECK_EQ_INT(find(t, other, 100, NULL).ntokens, 0);
    /* a seed of another model finds nothing */
    td_rcache_prompt_t p;
    td_rconv_hit_t h;
    td_rcache_prompt_init(&p, SEED + 1, tok, 100);
    CHECK(!td_rconv_find(t, &p, NULL, NULL, &h));
    td_rcache_prompt_fini(&p);
    td_rconv_destroy(t);
}

static void
test_ranks_and_removal(void)
{
    int32_t tok[64];
    td_rconv_t *t = NULL;

    for (int i = 0; i < 64; i++)
        tok[i] = 7 + i;
    CHECK_STATUS(td_rconv_create(3, &t), TD_OK);
    if (t == NULL)
        return;
    CHECK_STATUS(td_rconv_add(t, &rank_a, 1, SEED, tok, 20), TD_OK);
    CHECK_STATUS(td_rconv_add(t, &rank_b, 2, SEED, tok, 33), TD_OK);
    CHECK_EQ_INT(find(t, tok, 64, NULL).id, 2);
    CHECK_EQ_INT(find(t, tok, 64, not_b).id, 1);     /* b cannot take work: a's */
    /* the same id again replaces its state */
    CHECK_STATUS(td_rconv_add(t, &rank_b, 2, SEED, tok, 17), TD_OK);
    CHECK_EQ_INT(td_rconv_count(t), 2);
    CHECK_EQ_INT(find(t, tok, 64, NULL).id, 1);
    CHECK_EQ_INT(find(t, tok, 19, NULL).id, 2);
    td_rconv_remove(t, 1);
    CHECK_EQ_INT(find(t, tok, 64, NULL).id, 2);
    td_rconv_remove(t, 999);   /* unknown: nothing */
    CHECK_EQ_INT(td_rconv_count(t), 1);
    /* the cap: the oldest goes */
    CHECK_STATUS(td_rconv_add(t, &rank_a, 3, SEED, tok, 40), TD_OK);
    CHECK_STATUS(td_rconv_add(t, &rank_a, 4, SEED, tok, 50), TD_OK);
    CHECK_STATUS(td_rconv_add(t, &rank_a, 5, SEED, tok, 60), TD_OK);
    CHECK_EQ_INT(td_rconv_count(t), 3);
    CHECK_EQ_INT(find(t, tok, 18, NULL).ntokens, 0);   /* id 2 (17 tokens) forgotten */
    CHECK_EQ_INT(find(t, tok, 45, NULL).id, 3);
    td_rconv_remove_rank(t, &rank_a);
    CHECK_EQ_INT(td_rconv_count(t), 0);
    CHECK_EQ_INT(find(t, tok, 64, NULL).ntokens, 0);
    CHECK_STATUS(td_rconv_add(t, &rank_a, 6, SEED, tok, 0), TD_ERR_INVALID);
    td_rconv_destroy(t);
    CHECK_STATUS(td_rconv_create(0, &t), TD_ERR_INVALID);
}

/* Two ranks keep the same tokens: the newer state is found, then the older
 * once the newer is gone. */
static void
test_same_tokens(void)
{
    int32_t tok[40];
    td_rconv_t *t = NULL;

    for (int i = 0; i < 40; i++)
        tok[i] = 3 + i;
    CHECK_STATUS(td_rconv_create(8, &t), TD_OK);
    if (t == NULL)
        return;
    for (uint64_t n = 20; n <= 36; n += 16) {   /* a tail after 1 block, and 2 whole blocks */
        CHECK_STATUS(td_rconv_add(t, &rank_a, 10 + n, SEED, tok, n), TD_OK);
        CHECK_STATUS(td_rconv_add(t, &rank_b, 20 + n, SEED, tok, n), TD_OK);
        CHECK_STATUS(td_rconv_add(t, &rank_a, 30 + n, SEED, tok, n - 1), TD_OK);
        CHECK_EQ_INT(find(t, tok, n + 1, NULL).id, 20 + n);
        CHECK_EQ_INT(find(t, tok, n + 1, not_b).id, 10 + n);
        td_rconv_remove(t, 20 + n);
        CHECK_EQ_INT(find(t, tok, n + 1, NULL).id, 10 + n);
    }
    td_rconv_destroy(t);
}

int
main(void)
{
    test_lengths();
    test_ranks_and_removal();
    test_same_tokens();
    return td_check_exit("test_rconv");
}
