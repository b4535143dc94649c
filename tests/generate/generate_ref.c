/* tests/generate/generate_ref.c — the plainest generation loop over the
 * library, for tools/generate to be compared with: one prefill call, one
 * decode step per token, argmax (or td_sample_rows with a seed), stop at the
 * config's eos ids, log-probabilities by a direct double loop; with
 * --penalties R,P,F and --min-tokens N the logits are changed first by
 * direct loops over the prompt and the ids so far (vLLM's repetition
 * penalty, OpenAI's presence and frequency penalties, the eos ids at -inf
 * before N tokens), not by the sampler's history. Prints
 * {"prompt_ids", "ids", "logprobs", "finish_reason"}. */
#include "chat_prompt.h"
#include "kvmem.h"
#include "model.h"
#include "sample.h"
#include "tokenizer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int
fail(const char *what)
{
    fprintf(stderr, "generate_ref: %s\n", what);
    return 1;
}

int
main(int argc, char **argv)
{
    const char *dir = NULL, *prompt = NULL, *messages = NULL;
    td_chat_prompt_opts_t copts = { .thinking = -1 };
    td_sample_params_t sp = td_sample_params_greedy();
    unsigned long max_tokens = 16, min_tokens = 0;
    double rep = 1, pres = 0, freq = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--no-thinking") == 0) {
            copts.thinking = 0;
            continue;
        }
        if (v == NULL)
            return fail("usage: generate_ref DIR (--prompt TEXT | --messages FILE "
                        "[--no-thinking]) [--max-tokens N] [--temperature T --top-p P "
                        "--top-k K --seed S]");
        if (strcmp(a, "--model") == 0) dir = v;
        else if (strcmp(a, "--prompt") == 0) prompt = v;
        else if (strcmp(a, "--messages") == 0) messages = v;
        else if (strcmp(a, "--max-tokens") == 0) max_tokens = strtoul(v, NULL, 10);
        else if (strcmp(a, "--temperature") == 0) sp.temperature = strtod(v, NULL);
        else if (strcmp(a, "--top-p") == 0) sp.top_p = strtod(v, NULL);
        else if (strcmp(a, "--top-k") == 0) sp.top_k = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--seed") == 0) sp.seed = strtoull(v, NULL, 10);
        else if (strcmp(a, "--penalties") == 0 && sscanf(v, "%lf,%lf,%lf", &rep, &pres, &freq) == 3)
            ;
        else if (strcmp(a, "--min-tokens") == 0) min_tokens = strtoul(v, NULL, 10);
        else return fail(a);
        i++;
    }
    if (dir == NULL || (prompt == NULL) == (messages == NULL))
        return fail("give --model DIR and one of --prompt, --messages");

    td_model_t *m = NULL;
    if (td_model_load(dir, &m) != TD_OK || m->tok == NULL)
        return fail("cannot load the model");
    uint32_t *ids = NULL;
    size_t n = 0;
    if (prompt != NULL) {
        if (td_tokenizer_encode(m->tok, prompt, strlen(prompt), TD_TOKENIZER_SPECIAL, &ids, &n) !=
            TD_OK)
            return fail("tokenize");
    } else {
        json_error_t je;
        json_t *req = json_load_file(messages, 0, &je);
        td_chat_prompt_t *p = NULL;
        if (req == NULL || td_chat_prompt_encode(req, &copts, &p, NULL) != TD_OK ||
            td_chat_prompt_ids(p, m->tok, &ids, &n) != TD_OK)
            return fail("encode the request");
        json_decref(req);
        td_chat_prompt_destroy(p);
    }

    size_t V = (size_t)m->cfg->vocab_size;
    float *logits = malloc(V * sizeof(float));
    int32_t *in = malloc(n * sizeof(int32_t));
    td_kvmem_t *mem = NULL;
    td_cache_t cache, *c = &cache;
    for (size_t i = 0; i < n; i++)
        in[i] = (int32_t)ids[i];
    if (td_kvmem_create(m->plan->layout, n + max_tokens, 0, &mem) != TD_OK ||
        td_cache_init(c, m->plan, &mem->kv) != TD_OK)
        return fail("kv memory");
    td_cache_reset(c);
    if (td_forward_prefill(m, c, in, n, 0, logits) != TD_OK)
        return fail("prefill");

    json_t *out_ids = json_array(), *lps = json_array(), *pids = json_array();
    const char *finish = "length";
    const td_sample_params_t *sps[1] = { &sp };
    for (size_t i = 0; i < n; i++)
        json_array_append_new(pids, json_integer(ids[i]));
    int32_t *gen = malloc((max_tokens + 1) * sizeof(int32_t));
    for (unsigned long g = 0; g < max_tokens; g++) {
        uint64_t pos = n + g;
        int32_t t;
        for (size_t v = 0; v < V; v++) {   /* the penalties and the mask, written out */
            int seen = 0, cnt = 0;
            for (size_t k = 0; k < n; k++)
                seen |= ids[k] == v;
            for (unsigned long k = 0; k < g; k++)
                cnt += gen[k] == (int32_t)v;
            if (rep != 1 && (seen || cnt > 0))
                logits[v] = logits[v] > 0 ? logits[v] / (float)rep : logits[v] * (float)rep;
            if (cnt > 0)
                logits[v] -= (float)(freq * cnt + pres);
            for (uint32_t k = 0; g < min_tokens && k < m->cfg->eos_token_id.n; k++)
                if (m->cfg->eos_token_id.v[k] == (int64_t)v)
                    logits[v] = -INFINITY;
        }
        if (td_sample_rows(logits, 1, V, sps, &pos, &t) != TD_OK)
            return fail("sample");
        double z = 0;
        for (size_t i = 0; i < V; i++)
            z += exp((double)logits[i]);
        gen[g] = t;
        json_array_append_new(out_ids, json_integer(t));
        json_array_append_new(lps, json_real((double)logits[t] - log(z)));
        int stop = 0;
        for (uint32_t k = 0; k < m->cfg->eos_token_id.n; k++)
            stop |= m->cfg->eos_token_id.v[k] == t;
        if (stop) {
            finish = "stop";
            break;
        }
        if (g + 1 == max_tokens)
            break;
        if (td_forward_decode(m, &c, &t, 1, logits) != TD_OK)
            return fail("decode");
    }
    json_t *o = json_pack("{s:o, s:o, s:o, s:s}", "prompt_ids", pids, "ids", out_ids, "logprobs",
                          lps, "finish_reason", finish);
    json_dumpf(o, stdout, JSON_COMPACT);
    putchar('\n');
    json_decref(o);
    td_kvmem_destroy(mem);
    free(gen);
    free(in);
    free(logits);
    free(ids);
    td_model_destroy(m);
    return 0;
}
