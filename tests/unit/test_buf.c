/* tests/unit/test_buf.c — base/buf.h, the one growable buffer: appends,
 * printf, truncate, reset and take, each case a list of steps with the
 * contents after each; the sticky failure made to happen with an append too
 * large to ever fit. */
#include "buf.h"
#include "check.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    OP_PUTS,        /* td_buf_puts(s) */
    OP_APPEND,      /* td_buf_append(s, n) */
    OP_PRINTF,      /* td_buf_printf("%s:%zu", s, n) */
    OP_TRUNCATE,    /* td_buf_truncate(n) */
    OP_RESET,       /* td_buf_reset() */
    OP_HUGE,        /* td_buf_append of SIZE_MAX / 2 + 1 bytes: refused before any allocation */
    OP_END
} op_kind_t;

typedef struct {
    op_kind_t op;
    const char *s;
    size_t n;
    td_status_t want;       /* what the call returns (truncate, reset: TD_OK) */
    const char *after;      /* the contents afterwards */
    size_t after_len;       /* their length when they hold a NUL; 0: strlen(after) */
} op_t;

#define STEP(op, s, n, want, after) { op, s, n, want, after, 0 }
#define END { OP_END, NULL, 0, TD_OK, NULL, 0 }

static const struct {
    const char *name;
    op_t ops[8];
} cases[] = {
    { "nothing appended", { END } },
    { "append and puts",
      { STEP(OP_PUTS, "ab", 0, TD_OK, "ab"),
        STEP(OP_APPEND, "cdef", 2, TD_OK, "abcd"),
        { OP_APPEND, "\0x", 2, TD_OK, "abcd\0x", 6 },   /* an inner NUL is kept */
        END } },
    { "zero bytes still allocate the NUL",
      { STEP(OP_APPEND, "", 0, TD_OK, ""), STEP(OP_PUTS, "", 0, TD_OK, ""), END } },
    { "printf appends",
      { STEP(OP_PRINTF, "n", 42, TD_OK, "n:42"),
        STEP(OP_PRINTF, "k", 7, TD_OK, "n:42k:7"),
        STEP(OP_PUTS, "!", 0, TD_OK, "n:42k:7!"),
        END } },
    { "truncate",
      { STEP(OP_PUTS, "hello", 0, TD_OK, "hello"),
        STEP(OP_TRUNCATE, NULL, 2, TD_OK, "he"),
        STEP(OP_TRUNCATE, NULL, 10, TD_OK, "he"),   /* longer than the contents: no change */
        STEP(OP_PUTS, "y", 0, TD_OK, "hey"),
        STEP(OP_TRUNCATE, NULL, 0, TD_OK, ""),
        END } },
    { "reset keeps the memory",
      { STEP(OP_PUTS, "abc", 0, TD_OK, "abc"),
        STEP(OP_RESET, NULL, 0, TD_OK, ""),
        STEP(OP_PUTS, "x", 0, TD_OK, "x"),
        END } },
    { "a failed append sticks, contents unchanged",
      { STEP(OP_PUTS, "ab", 0, TD_OK, "ab"),
        STEP(OP_HUGE, NULL, 0, TD_ERR_NOMEM, "ab"),
        STEP(OP_PUTS, "c", 0, TD_ERR_NOMEM, "ab"),
        STEP(OP_PRINTF, "d", 1, TD_ERR_NOMEM, "ab"),
        STEP(OP_APPEND, "", 0, TD_ERR_NOMEM, "ab"),
        STEP(OP_TRUNCATE, NULL, 1, TD_OK, "a"),     /* truncating does not clear it */
        STEP(OP_PUTS, "e", 0, TD_ERR_NOMEM, "a"),
        END } },
    { "reset clears the failure",
      { STEP(OP_PUTS, "ab", 0, TD_OK, "ab"),
        STEP(OP_HUGE, NULL, 0, TD_ERR_NOMEM, "ab"),
        STEP(OP_RESET, NULL, 0, TD_OK, ""),
        STEP(OP_PUTS, "z", 0, TD_OK, "z"),
        END } },
    { "a failure on an empty buffer", { STEP(OP_HUGE, NULL, 0, TD_ERR_NOMEM, ""), END } },
};

/* The contents, length and NUL of b are those of want (len bytes, which may
 * hold a NUL). */
static void
check_contents(const char *what, size_t step, const td_buf_t *b, const char *want, size_t len)
{
    int before = td_check_failures;

    CHECK_EQ_INT(b->len, len);
    if (b->data != NULL) {
        CHECK(b->len < b->cap);
        CHECK(memcmp(b->data, want, len) == 0);
        CHECK(b->data[b->len] == '\0');
    } else {
        CHECK_EQ_INT(len, 0);
    }
    if (td_check_failures != before)
        fprintf(stderr, "  in case \"%s\", step %zu: want \"%s\"\n", what, step, want);
}

static void
test_cases(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        td_buf_t b = {0};
        const char *want = "";
        size_t len = 0;
        bool failed = false;

        for (size_t k = 0; cases[i].ops[k].op != OP_END; k++) {
            const op_t *o = &cases[i].ops[k];
            td_status_t st = TD_OK;

            switch (o->op) {
            case OP_PUTS:     st = td_buf_puts(&b, o->s); break;
            case OP_APPEND:   st = td_buf_append(&b, o->s, o->n); break;
            case OP_PRINTF:   st = td_buf_printf(&b, "%s:%zu", o->s, o->n); break;
            case OP_TRUNCATE: td_buf_truncate(&b, o->n); break;
            case OP_RESET:    td_buf_reset(&b); break;
            case OP_HUGE:     st = td_buf_append(&b, "", SIZE_MAX / 2 + 1); break;
            case OP_END:      break;
            }
            CHECK_STATUS(st, o->want);
            if (o->op == OP_HUGE)
                failed = true;
            else if (o->op == OP_RESET)
                failed = false;
            want = o->after;
            len = o->after_len ? o->after_len : strlen(o->after);
            check_contents(cases[i].name, k, &b, want, len);
            CHECK_STATUS(td_buf_status(&b), failed ? TD_ERR_NOMEM : TD_OK);
            CHECK_EQ_INT(b.failed != 0, failed);
        }

        /* take: the contents (or "" for nothing), or NULL after a failure;
         * the buffer is empty either way */
        size_t tlen = 12345;
        char *s = td_buf_take(&b, &tlen);
        if (failed) {
            CHECK(s == NULL);
            CHECK_EQ_INT(tlen, 12345);      /* not set on failure */
        } else {
            CHECK(s != NULL && memcmp(s, want, len) == 0 && s[len] == '\0');
            CHECK_EQ_INT(tlen, len);
        }
        CHECK(b.data == NULL && b.len == 0 && b.cap == 0 && !b.failed);
        free(s);
    }
}

/* Many small appends: the allocation doubles and the contents stay whole. */
static void
test_growth(void)
{
    td_buf_t b = {0};
    size_t allocs = 0, cap = 0;

    for (size_t i = 0; i < 10000; i++) {
        char c = (char)('a' + i % 26);
        CHECK_STATUS(td_buf_append(&b, &c, 1), TD_OK);
        if (b.cap != cap) {
            allocs++;
            CHECK(cap == 0 || b.cap >= 2 * cap);
            cap = b.cap;
        }
    }
    CHECK_EQ_INT(b.len, 10000);
    CHECK(b.data[10000] == '\0');
    for (size_t i = 0; i < 10000; i++)
        if (b.data[i] != (char)('a' + i % 26)) {
            CHECK(!"contents changed while growing");
            break;
        }
    CHECK(allocs <= 16);

    /* reserve makes room without changing the contents */
    td_buf_reset(&b);
    CHECK_STATUS(td_buf_reserve(&b, 100000), TD_OK);
    CHECK(b.cap >= 100001 && b.len == 0 && b.data[0] == '\0');
    td_buf_free(&b);
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0);

    /* sizes whose len + 1 or doubling would overflow are refused before the
     * room check and before any allocation, on an empty and a non-empty
     * buffer alike */
    const size_t huge[] = { SIZE_MAX, SIZE_MAX - 1, SIZE_MAX / 2, SIZE_MAX / 4 };
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        td_buf_t e = { 0 };
        CHECK_STATUS(td_buf_append(&e, "", huge[i]), TD_ERR_NOMEM);
        CHECK(e.failed && e.data == NULL);
        td_buf_free(&e);
        CHECK_STATUS(td_buf_puts(&e, "abc"), TD_OK);
        CHECK_STATUS(td_buf_append(&e, "", huge[i]), TD_ERR_NOMEM);
        CHECK(e.failed && e.len == 3);
        td_buf_free(&e);
    }

    /* free forgets a failure too */
    CHECK_STATUS(td_buf_append(&b, "", SIZE_MAX / 2 + 1), TD_ERR_NOMEM);
    td_buf_free(&b);
    CHECK_STATUS(td_buf_puts(&b, "ok"), TD_OK);
    CHECK_STR(b.data, "ok");
    td_buf_free(&b);

    /* a long printf (beyond the first allocation) */
    char big[300];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    CHECK_STATUS(td_buf_printf(&b, "%s:%zu", big, (size_t)7), TD_OK);
    CHECK_EQ_INT(b.len, 301);
    CHECK(strncmp(b.data, big, 299) == 0 && strcmp(b.data + 299, ":7") == 0);
    td_buf_free(&b);
}

int
main(void)
{
    test_cases();
    test_growth();
    return td_check_exit("test_buf");
}
