/* bench/tokenizer/tokbench.c — single-thread encode throughput of the V4.1
 * tokenizer over a corpus file (documents separated by 0x1E, as mkcorpus
 * writes), one document at a time; prints one JSON line per run. */
#include "clock.h"
#include "config.h"
#include "tokenizer.h"

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void
usage(FILE *f)
{
    fprintf(f, "usage: tokbench [--tokenizer PATH] [--passes N] CORPUS\n"
               "  Encode every document of CORPUS (split at 0x1E bytes), N passes (default 1),\n"
               "  and print {\"impl\", \"bytes\", \"docs\", \"tokens\", \"seconds\", \"mb_s\",\n"
               "  \"tok_s\", \"checksum\"} per pass. PATH: a tokenizer.json or its directory\n"
               "  (default $TANDEM_TOKENIZER). checksum: h = h * 1000003 + id + 1 (mod 2^64)\n"
               "  over all ids in order, to compare with other tokenizers.\n");
}

int
main(int argc, char **argv)
{
    const char *path = getenv("TANDEM_TOKENIZER");
    uint64_t passes = 1;
    char err[TD_CONFIG_ERRLEN];
    static const struct option opts[] = {
        { "tokenizer", required_argument, NULL, 't' },
        { "passes", required_argument, NULL, 'p' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c;
    while ((c = getopt_long(argc, argv, "t:p:h", opts, NULL)) != -1) {
        switch (c) {
        case 't': path = optarg; break;
        case 'p':
            if (td_config_parse_uint("--passes", optarg, 1, 1000000, &passes, err,
                                     sizeof(err)) != TD_OK) {
                fprintf(stderr, "tokbench: %s\n", err);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind + 1 != argc || !path) {
        if (!path)
            fprintf(stderr, "tokbench: no tokenizer: pass --tokenizer PATH or set "
                            "TANDEM_TOKENIZER\n");
        usage(stderr);
        return 2;
    }
    FILE *f = fopen(argv[optind], "rb");
    if (!f) {
        perror(argv[optind]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc(size > 0 ? (size_t)size : 1);
    if (!text || fread(text, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "tokbench: cannot read %s\n", argv[optind]);
        return 1;
    }
    fclose(f);

    td_tokenizer_t *tok;
    if (td_tokenizer_load(path, &tok) != TD_OK) {
        fprintf(stderr, "tokbench: cannot load the tokenizer %s\n", path);
        return 1;
    }
    for (uint64_t p = 0; p < passes; p++) {
        size_t docs = 0, tokens = 0, bytes = 0;
        uint64_t sum = 0;
        double t0 = td_clock_s();
        const char *s = text, *end = text + size;
        while (s <= end) {
            const char *e = memchr(s, 0x1E, (size_t)(end - s));
            if (!e)
                e = end;
            uint32_t *ids;
            size_t n;
            if (td_tokenizer_encode(tok, s, (size_t)(e - s), TD_TOKENIZER_SPECIAL, &ids, &n) !=
                TD_OK) {
                fprintf(stderr, "tokbench: encode failed on document %zu\n", docs);
                return 1;
            }
            for (size_t i = 0; i < n; i++)
                sum = sum * 1000003u + ids[i] + 1;
            free(ids);
            tokens += n;
            bytes += (size_t)(e - s);
            docs++;
            s = e + 1;
        }
        double dt = td_clock_s() - t0;
        printf("{\"impl\": \"tandem\", \"bytes\": %zu, \"docs\": %zu, \"tokens\": %zu, "
               "\"seconds\": %.6f, \"mb_s\": %.3f, \"tok_s\": %.0f, \"checksum\": \"%016llx\"}\n",
               bytes, docs, tokens, dt, (double)bytes / dt / 1e6, (double)tokens / dt,
               (unsigned long long)sum);
        fflush(stdout);
    }
    td_tokenizer_destroy(tok);
    free(text);
    return 0;
}
