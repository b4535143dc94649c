/* tests/model/model_check.c — what test_tiny.py asks of a checkpoint directory
 * through the C front end: bind it to its weight schema, list the schema's
 * tensor names, print the resolved config, or tokenize a text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "modelcfg.h"
#include "safetensors.h"
#include "tokenizer.h"
#include "weights.h"

static int
usage(void)
{
    fprintf(stderr, "usage: model_check bind|names|config DIR\n"
                    "       model_check encode DIR TEXT\n");
    return 2;
}

int
main(int argc, char **argv)
{
    td_modelcfg_t *cfg = NULL;
    td_weights_schema_t *s = NULL;
    td_st_t *st = NULL;
    td_weights_t *w = NULL;
    int rc = 1;

    if (argc < 3)
        return usage();
    td_log_set_level(TD_LOG_WARN);
    if (strcmp(argv[1], "encode") == 0) {
        td_tokenizer_t *tok = NULL;
        uint32_t *ids = NULL;
        size_t n = 0;
        if (argc != 4)
            return usage();
        if (td_tokenizer_load(argv[2], &tok) != TD_OK ||
            td_tokenizer_encode(tok, argv[3], strlen(argv[3]), TD_TOKENIZER_SPECIAL, &ids, &n) != TD_OK) {
            td_tokenizer_destroy(tok);
            return 1;
        }
        for (size_t i = 0; i < n; i++)
            printf("%s%u", i ? " " : "", ids[i]);
        printf("\n");
        free(ids);
        td_tokenizer_destroy(tok);
        return 0;
    }
    if (argc != 3)
        return usage();
    if (td_modelcfg_load(argv[2], &cfg) != TD_OK)
        return 1;
    if (strcmp(argv[1], "config") == 0) {
        char *js = td_modelcfg_to_json(cfg);
        if (js != NULL) {
            printf("%s\n", js);
            free(js);
            rc = 0;
        }
        goto out;
    }
    if (td_weights_schema_create(cfg, &s) != TD_OK)
        goto out;
    if (strcmp(argv[1], "names") == 0) {
        for (size_t i = 0; i < s->n; i++) {
            printf("%s\n", s->entries[i].name);
            if (s->entries[i].scale_name[0] != '\0')
                printf("%s\n", s->entries[i].scale_name);
        }
        rc = 0;
    } else if (strcmp(argv[1], "bind") == 0) {
        if (td_st_open(argv[2], &st) != TD_OK || td_weights_bind(s, st, NULL, NULL, &w) != TD_OK)
            goto out;
        printf("bound %zu schema tensors, %zu ignored, %llu bytes\n", w->n, w->ignored,
               (unsigned long long)w->bytes);
        rc = 0;
    } else {
        rc = usage();
    }
out:
    td_weights_destroy(w);
    td_st_close(st);
    td_weights_schema_destroy(s);
    td_modelcfg_destroy(cfg);
    return rc;
}
