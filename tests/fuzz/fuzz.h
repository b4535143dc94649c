/* tests/fuzz/fuzz.h — what every harness of tests/fuzz/ defines (libFuzzer's
 * entry point, also called by replay.c) and the small helpers they share:
 * quiet logging, fixture paths from the environment, and reading the choices
 * a harness takes from the front of its input. docs/fuzzing.md. */
#ifndef TD_FUZZ_H
#define TD_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* Run one input; returns 0 (libFuzzer's contract). A bug is a crash, a
 * sanitizer report or an abort() from a harness's own check. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A harness's own invariant failed: say which and abort (libFuzzer saves the
 * input as a crash; replay fails). */
#define FUZZ_CHECK(cond)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                     \
            abort();                                                            \
        }                                                                       \
    } while (0)

static inline void
fuzz_log_sink(td_log_level_t level, const char *line, void *arg)
{
    (void)level, (void)line, (void)arg;
}

/* Format every log line up to debug (so that peer bytes in messages are
 * formatted too) and throw it away. */
static inline void
fuzz_log_quiet(void)
{
    td_log_set_sink(fuzz_log_sink, NULL);
    td_log_set_level(TD_LOG_DEBUG);
}

/* The path in environment variable name (set by tests/fuzz/meson.build and
 * bench/fuzz); without it the harness cannot run: say so and exit 1. */
static inline const char *
fuzz_env_path(const char *name, const char *what)
{
    const char *p = getenv(name);

    if (p == NULL || *p == '\0') {
        fprintf(stderr, "fuzz: %s is not set (%s); bench/fuzz and meson test set it\n", name,
                what);
        exit(1);
    }
    return p;
}

/* The input as a stream of choices followed by payload bytes. */
typedef struct {
    const uint8_t *p;
    size_t n;
} fuzz_in_t;

/* One byte (0 once the input is used up). */
static inline uint8_t
fuzz_u8(fuzz_in_t *in)
{
    uint8_t v = 0;

    if (in->n) {
        v = in->p[0];
        in->p++;
        in->n--;
    }
    return v;
}

/* Four bytes, little-endian. */
static inline uint32_t
fuzz_u32(fuzz_in_t *in)
{
    uint32_t v = 0;

    for (int i = 0; i < 4; i++)
        v |= (uint32_t)fuzz_u8(in) << (8 * i);
    return v;
}

/* The next piece up to a 4-byte separator "\xff\xfe\xfd\xfc" (or the rest):
 * harnesses that need several inputs (a file and its index, an output in
 * pieces) cut theirs there. */
#define FUZZ_SEP "\xff\xfe\xfd\xfc"
#define FUZZ_SEP_LEN 4u

static inline fuzz_in_t
fuzz_piece(fuzz_in_t *in)
{
    fuzz_in_t out = *in;
    const uint8_t *s = in->n >= FUZZ_SEP_LEN
                           ? memmem(in->p, in->n, FUZZ_SEP, FUZZ_SEP_LEN)
                           : NULL;

    if (s == NULL) {
        in->p += in->n;
        in->n = 0;
        return out;
    }
    out.n = (size_t)(s - in->p);
    in->n -= out.n + FUZZ_SEP_LEN;
    in->p = s + FUZZ_SEP_LEN;
    return out;
}

#endif
