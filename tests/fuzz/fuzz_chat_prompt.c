/* tests/fuzz/fuzz_chat_prompt.c — the V4.1 chat encoder (text/chat_prompt.c)
 * on arbitrary JSON request bodies, with the overriding options taken from the
 * input, then the prompt as ids with the tiny checkpoint's tokenizer
 * ($TD_FUZZ_TINY) and a reply reader made from its reply options, as routerd
 * does. Checks: a refusal has a message and valid error JSON; a prompt's
 * special ranges are ascending, disjoint and inside the text; its ids decode
 * to the prompt text exactly (specials as their tokens, text without them).
 * Input: a byte of choices, then the body. */
#include <jansson.h>

#include "chat_prompt.h"
#include "chat_reply.h"
#include "fuzz.h"
#include "tokenizer.h"

static td_tokenizer_t *cp_tok;

static const char *const cp_efforts[] = { NULL,   "none",  "minimal", "low", "medium",
                                          "high", "xhigh", "ultra",   "max" };

static void
cp_check_prompt(const td_chat_prompt_t *p)
{
    uint32_t *ids = NULL;
    size_t n = 0, dl = 0, end = 0;
    char *text = NULL;
    td_chat_reply_reader_t *rd = NULL;

    FUZZ_CHECK(p->text != NULL && p->text[p->len] == '\0');
    for (size_t i = 0; i < p->nspecials; i++) {
        FUZZ_CHECK(p->specials[i].start >= end && p->specials[i].start < p->specials[i].end);
        end = p->specials[i].end;
        FUZZ_CHECK(end <= p->len);
    }
    FUZZ_CHECK(p->thinking ? p->effort != 0 : p->effort == 0);
    FUZZ_CHECK(td_chat_prompt_ids(p, cp_tok, &ids, &n) == TD_OK);
    FUZZ_CHECK(ids != NULL);
    FUZZ_CHECK(td_tokenizer_decode(cp_tok, ids, n, 0, &text, &dl) == TD_OK);
    FUZZ_CHECK(dl == p->len && memcmp(text, p->text, dl) == 0);
    FUZZ_CHECK(td_chat_reply_reader_create(&p->reply, &rd) == TD_OK);
    td_chat_reply_reader_destroy(rd);
    free(text);
    free(ids);
}

static void
cp_check_err(const td_chat_prompt_err_t *e, td_status_t st)
{
    char *body = NULL;
    json_t *j;

    FUZZ_CHECK(st == TD_ERR_INVALID || st == TD_ERR_UNSUPPORTED);
    FUZZ_CHECK(e->message[0] != '\0');
    FUZZ_CHECK(st != TD_ERR_UNSUPPORTED || e->code != NULL);
    FUZZ_CHECK(td_chat_prompt_err_json(e, &body) == TD_OK);
    j = json_loads(body, 0, NULL);
    FUZZ_CHECK(json_is_object(j));
    json_decref(j);
    free(body);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in_t in = { data, size };
    uint8_t c = fuzz_u8(&in);
    td_chat_prompt_opts_t opts = { .thinking = (int)(c % 3) - 1,
                                   .effort = cp_efforts[(c >> 2) % 9] };
    td_chat_prompt_t *p = NULL;
    td_chat_prompt_err_t e;
    json_t *req;
    td_status_t st;

    if (cp_tok == NULL) {
        char path[4096];

        fuzz_log_quiet();
        snprintf(path, sizeof path, "%s/tokenizer.json",
                 fuzz_env_path("TD_FUZZ_TINY", "a tools/mk-tiny-model checkpoint"));
        FUZZ_CHECK(td_tokenizer_load(path, &cp_tok) == TD_OK);
    }
    req = json_loadb((const char *)in.p, in.n, c & 0x80 ? JSON_ALLOW_NUL : 0, NULL);
    if (req == NULL)
        return 0;
    memset(&e, 0, sizeof e);
    st = td_chat_prompt_encode(req, c & 0x40 ? NULL : &opts, &p, &e);
    if (st == TD_OK)
        cp_check_prompt(p);
    else
        cp_check_err(&e, st);
    td_chat_prompt_destroy(p);
    json_decref(req);
    return 0;
}
