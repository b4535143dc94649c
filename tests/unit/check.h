/* tests/unit/check.h — the few macros the C tests share: a failed CHECK prints
 * where and what, counts, and lets the test go on; main returns td_check_exit(). */
#ifndef TD_CHECK_H
#define TD_CHECK_H

#include <stdio.h>
#include <string.h>

static int td_check_failures;

#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                  \
            td_check_failures++;                                             \
        }                                                                    \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                   \
    do {                                                                     \
        long long va_ = (long long)(a), vb_ = (long long)(b);                \
        if (va_ != vb_) {                                                    \
            fprintf(stderr, "%s:%d: check failed: %s == %s (%lld != %lld)\n",\
                    __FILE__, __LINE__, #a, #b, va_, vb_);                   \
            td_check_failures++;                                             \
        }                                                                    \
    } while (0)

#define CHECK_STATUS(expr, want)                                             \
    do {                                                                     \
        td_status_t got_ = (expr);                                           \
        if (got_ != (want)) {                                                \
            fprintf(stderr, "%s:%d: %s: got %s, want %s\n", __FILE__,        \
                    __LINE__, #expr, td_status_str(got_),                    \
                    td_status_str(want));                                    \
            td_check_failures++;                                             \
        }                                                                    \
    } while (0)

#define CHECK_STR(a, b)                                                      \
    do {                                                                     \
        const char *sa_ = (a), *sb_ = (b);                                   \
        if (sa_ == NULL || sb_ == NULL || strcmp(sa_, sb_) != 0) {           \
            fprintf(stderr, "%s:%d: check failed: %s == %s (\"%s\" != \"%s\")\n", \
                    __FILE__, __LINE__, #a, #b, sa_ ? sa_ : "(null)",        \
                    sb_ ? sb_ : "(null)");                                   \
            td_check_failures++;                                             \
        }                                                                    \
    } while (0)

static inline int
td_check_exit(const char *name)
{
    if (td_check_failures)
        fprintf(stderr, "%s: %d check(s) failed\n", name, td_check_failures);
    else
        fprintf(stderr, "%s: all checks passed\n", name);
    return td_check_failures ? 1 : 0;
}

#endif
