/* tests/chat/test_chat_fixtures.c — the chat format (text/chat_prompt.c,
 * text/chat_reply.c) against the reference fixtures that tests/chat/regen
 * writes: prompts byte for byte (and their special-token ranges and reply
 * options), refusals, and the output reader one-shot, one token piece at a
 * time (the deltas after every piece) and one byte at a time.
 * usage: test_chat_fixtures encode.json parse.json */
#include "../unit/check.h"
#include "chat_prompt.h"

#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* ---- Encoding ----------------------------------------------------------- */

/* Print s[from, to) with control bytes escaped. */
static void
print_escaped(const char *s, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stderr);
        else if (c < 0x20)
            fprintf(stderr, "\\x%02x", c);
        else
            fputc(c, stderr);
    }
}

/* Report the first byte where got differs from want, with context. */
static void
diff_first(const char *name, const char *want, size_t wlen, const char *got, size_t glen)
{
    size_t i = 0;

    while (i < wlen && i < glen && want[i] == got[i])
        i++;
    size_t from = i > 80 ? i - 80 : 0;
    while (from > 0 && ((unsigned char)want[from] & 0xC0) == 0x80)
        from--;
    fprintf(stderr, "%s: prompt differs at byte %zu (want %zu bytes, got %zu)\n", name, i, wlen,
            glen);
    fputs("  same: ...", stderr);
    print_escaped(want, from, i);
    fputs("\n  want: ", stderr);
    print_escaped(want, i, wlen < i + 120 ? wlen : i + 120);
    fputs("\n  got:  ", stderr);
    print_escaped(got, i, glen < i + 120 ? glen : i + 120);
    fputs("\n", stderr);
}

static const char *const start_names[] = { "plain", "reasoning", "reasoning_cont",
                                           "content_cont" };

static void
check_parse_opts(const char *name, const td_chat_reply_opts_t *po, const json_t *want)
{
    const char *ws = json_string_value(json_object_get(want, "start"));
    bool ok = ws && strcmp(start_names[po->start], ws) == 0 &&
              po->tool_calls == json_is_true(json_object_get(want, "tool_calls")) &&
              po->in_tool_calls == json_is_true(json_object_get(want, "in_tool_calls"));
    const json_t *stop = json_object_get(want, "stop");
    ok = ok && po->nstop == json_array_size(stop);
    for (size_t i = 0; ok && i < po->nstop; i++)
        ok = strcmp(po->stop[i], json_string_value(json_array_get(stop, i))) == 0;
    if (!ok) {
        char *w = json_dumps(want, JSON_COMPACT);
        fprintf(stderr, "%s: parse options: got start %s tool_calls %d in_tool_calls %d "
                        "%zu stop; want %s\n", name, start_names[po->start], po->tool_calls,
                po->in_tool_calls, po->nstop, w);
        free(w);
    }
    CHECK(ok);
}

static void
run_encode(const json_t *cases, int *passed, int *refused)
{
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        const json_t *c = json_array_get(cases, ci);
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *body = json_string_value(json_object_get(c, "body"));
        const json_t *want_err = json_object_get(c, "error");
        json_error_t jerr;
        td_chat_prompt_err_t err;
        td_chat_prompt_t *p = NULL;

        json_t *req = json_loads(body, 0, &jerr);
        CHECK(req != NULL);
        if (req == NULL) {
            fprintf(stderr, "%s: body: %s\n", name, jerr.text);
            continue;
        }
        td_status_t st = td_chat_prompt_encode(req, NULL, &p, &err);
        if (want_err) {
            CHECK(st == TD_ERR_INVALID || st == TD_ERR_UNSUPPORTED);
            if (st == TD_ERR_INVALID || st == TD_ERR_UNSUPPORTED) {
                CHECK(err.message[0] != '\0');
                (*refused)++;
            } else {
                fprintf(stderr, "%s: accepted; the reference refuses it: %s\n", name,
                        json_string_value(want_err));
            }
        } else {
            CHECK_STATUS(st, TD_OK);
            if (st != TD_OK) {
                fprintf(stderr, "%s: refused: %s (param %s)\n", name, err.message, err.param);
            } else {
                const json_t *wp = json_object_get(c, "prompt");
                const char *want = json_string_value(wp);
                size_t wlen = json_string_length(wp);
                bool same = p->len == wlen && memcmp(p->text, want, wlen) == 0;
                if (!same)
                    diff_first(name, want, wlen, p->text, p->len);
                CHECK(same);

                const json_t *spans = json_object_get(c, "specials");
                bool spans_ok = json_array_size(spans) == p->nspecials;
                for (size_t i = 0; spans_ok && i < p->nspecials; i++) {
                    const json_t *s = json_array_get(spans, i);
                    spans_ok = (size_t)json_integer_value(json_array_get(s, 0)) ==
                                   p->specials[i].start &&
                               (size_t)json_integer_value(json_array_get(s, 1)) ==
                                   p->specials[i].end;
                    if (!spans_ok)
                        fprintf(stderr, "%s: special range %zu: got [%zu, %zu), want "
                                        "[%" JSON_INTEGER_FORMAT ", %" JSON_INTEGER_FORMAT ")\n",
                                name, i, p->specials[i].start, p->specials[i].end,
                                json_integer_value(json_array_get(s, 0)),
                                json_integer_value(json_array_get(s, 1)));
                }
                if (json_array_size(spans) != p->nspecials)
                    fprintf(stderr, "%s: %zu special ranges, want %zu\n", name, p->nspecials,
                            json_array_size(spans));
                CHECK(spans_ok);
                check_parse_opts(name, &p->reply, json_object_get(c, "parse"));
                if (same && spans_ok)
                    (*passed)++;
            }
        }
        td_chat_prompt_destroy(p);
        json_decref(req);
    }
}

/* ---- Output reading ----------------------------------------------------- */

/* "call_07_<20 alnum><4 digits>" for call 7 -> "call_07_*" (and "call_07_ET_..."
 * -> "call_07_ET_*"); NULL if malformed. */
static char *
norm_id(const char *id, size_t index)
{
    char prefix[32];
    int n = snprintf(prefix, sizeof(prefix), "call_%02zu_", index);
    size_t len = strlen(id);

    if (strncmp(id, prefix, (size_t)n) != 0)
        return NULL;
    if (strncmp(id + n, "ET_", 3) == 0) {
        memcpy(prefix + n, "ET_", 4);
        n += 3;
    }
    if (len != (size_t)n + 24)
        return NULL;
    for (size_t i = (size_t)n; i < len; i++)
        if (i < (size_t)n + 20 ? !isalnum((unsigned char)id[i]) : !isdigit((unsigned char)id[i]))
            return NULL;
    char *out = malloc((size_t)n + 2);
    if (out) {
        memcpy(out, prefix, (size_t)n);
        out[n] = '*';
        out[n + 1] = '\0';
    }
    return out;
}

/* The reply as the fixture holds it: ids normalised. */
static json_t *
reply_json(const char *name, const td_chat_reply_t *r)
{
    json_t *msg = NULL;

    CHECK_STATUS(td_chat_reply_json(r, &msg), TD_OK);
    json_t *calls = json_object_get(msg, "tool_calls");
    for (size_t i = 0; i < json_array_size(calls); i++) {
        json_t *call = json_array_get(calls, i);
        char *id = norm_id(json_string_value(json_object_get(call, "id")), i);
        if (id == NULL)
            fprintf(stderr, "%s: malformed tool call id %s\n", name,
                    json_string_value(json_object_get(call, "id")));
        CHECK(id != NULL);
        json_object_set_new(call, "id", json_string(id ? id : "?"));
        free(id);
    }
    return msg;
}

/* Append deltas as fixture events, merging adjacent texts of one kind. */
static void
add_events(json_t *ev, const td_chat_reply_delta_t *d, size_t n)
{
    static const char *const kinds[] = { "reasoning", "content", "call", "args" };

    for (size_t i = 0; i < n; i++) {
        json_t *last = json_array_get(ev, json_array_size(ev) - 1);
        const char *lk = last ? json_string_value(json_array_get(last, 0)) : NULL;
        switch (d[i].kind) {
        case TD_CHAT_REPLY_DELTA_REASONING:
        case TD_CHAT_REPLY_DELTA_CONTENT:
            if (lk && strcmp(lk, kinds[d[i].kind]) == 0) {
                json_t *t = json_array_get(last, 1);
                char *s = malloc(json_string_length(t) + d[i].len + 1);
                memcpy(s, json_string_value(t), json_string_length(t));
                memcpy(s + json_string_length(t), d[i].text, d[i].len);
                json_array_set_new(last, 1, json_stringn(s, json_string_length(t) + d[i].len));
                free(s);
            } else {
                json_array_append_new(ev, json_pack("[s, s%]", kinds[d[i].kind], d[i].text,
                                                    d[i].len));
            }
            break;
        case TD_CHAT_REPLY_DELTA_TOOL_CALL:
            json_array_append_new(ev, json_pack("[s, i, s]", "call", (int)d[i].index,
                                                d[i].name));
            break;
        case TD_CHAT_REPLY_DELTA_TOOL_ARGS:
            if (lk && strcmp(lk, "args") == 0 &&
                json_integer_value(json_array_get(last, 1)) == d[i].index) {
                json_t *t = json_array_get(last, 2);
                char *s = malloc(json_string_length(t) + d[i].len + 1);
                memcpy(s, json_string_value(t), json_string_length(t));
                memcpy(s + json_string_length(t), d[i].text, d[i].len);
                json_array_set_new(last, 2, json_stringn(s, json_string_length(t) + d[i].len));
                free(s);
            } else {
                json_array_append_new(ev, json_pack("[s, i, s%]", "args", (int)d[i].index,
                                                    d[i].text, d[i].len));
            }
            break;
        }
    }
}

/* Append the events of src to dst, merging at the seam (for whole-stream views). */
static void
merge_events(json_t *dst, const json_t *src)
{
    for (size_t i = 0; i < json_array_size(src); i++) {
        const json_t *e = json_array_get(src, i);
        const char *k = json_string_value(json_array_get(e, 0));
        json_t *last = json_array_get(dst, json_array_size(dst) - 1);
        const char *lk = last ? json_string_value(json_array_get(last, 0)) : NULL;
        size_t ti = strcmp(k, "args") == 0 ? 2 : 1;
        bool same = lk && strcmp(lk, k) == 0 &&
                    (strcmp(k, "reasoning") == 0 || strcmp(k, "content") == 0 ||
                     (strcmp(k, "args") == 0 && json_integer_value(json_array_get(last, 1)) ==
                                                    json_integer_value(json_array_get(e, 1))));
        if (same) {
            json_t *a = json_array_get(last, ti), *b = json_array_get(e, ti);
            size_t la = json_string_length(a), lb = json_string_length(b);
            char *s = malloc(la + lb + 1);
            memcpy(s, json_string_value(a), la);
            memcpy(s + la, json_string_value(b), lb);
            json_array_set_new(last, ti, json_stringn(s, la + lb));
            free(s);
        } else {
            json_array_append_new(dst, json_deep_copy(e));
        }
    }
}

/* Remove the ["finish", reason] events. */
static void
drop_finish(json_t *ev)
{
    for (size_t i = json_array_size(ev); i-- > 0;)
        if (strcmp(json_string_value(json_array_get(json_array_get(ev, i), 0)), "finish") == 0)
            json_array_remove(ev, i);
}

static bool
same_json(const char *name, const char *what, const json_t *got, const json_t *want)
{
    if (json_equal(got, want))
        return true;
    char *g = json_dumps(got, JSON_COMPACT | JSON_ENSURE_ASCII);
    char *w = json_dumps(want, JSON_COMPACT | JSON_ENSURE_ASCII);
    fprintf(stderr, "%s: %s differs\n  got:  %s\n  want: %s\n", name, what, g, w);
    free(g);
    free(w);
    return false;
}

/* Feed pieces (n of them, given as offsets into text) and collect the events
 * of each feed, the finish, and the final message. */
static json_t *
stream(const char *name, const td_chat_reply_opts_t *po, const char *text, const size_t *cuts,
       size_t n, td_chat_reply_finish_t engine, json_t **msg, const char **finish)
{
    td_chat_reply_reader_t *p = NULL;
    const td_chat_reply_delta_t *d;
    size_t nd;
    json_t *pushes = json_array();

    CHECK_STATUS(td_chat_reply_reader_create(po, &p), TD_OK);
    if (p == NULL)
        return pushes;
    for (size_t i = 0; i < n; i++) {
        json_t *ev = json_array();
        bool was = td_chat_reply_reader_stopped(p);
        CHECK_STATUS(td_chat_reply_reader_feed(p, text + cuts[i], cuts[i + 1] - cuts[i], &d, &nd),
                     TD_OK);
        add_events(ev, d, nd);
        if (!was && td_chat_reply_reader_stopped(p))
            json_array_append_new(ev, json_pack("[s, s]", "finish", "stop"));
        json_array_append_new(pushes, ev);
    }
    json_t *ev = json_array();
    bool was = td_chat_reply_reader_stopped(p);
    CHECK_STATUS(td_chat_reply_reader_finish(p, engine, &d, &nd), TD_OK);
    add_events(ev, d, nd);
    const td_chat_reply_t *r = td_chat_reply_reader_reply(p);
    if (!was)
        json_array_append_new(ev, json_pack("[s, s]", "finish",
                                            td_chat_reply_finish_str(r->finish)));
    json_array_append_new(pushes, ev);
    *msg = reply_json(name, r);
    *finish = td_chat_reply_finish_str(r->finish);
    td_chat_reply_reader_destroy(p);
    return pushes;
}

static void
run_parse(const json_t *cases, int *passed)
{
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        const json_t *c = json_array_get(cases, ci);
        const char *name = json_string_value(json_object_get(c, "name"));
        const json_t *tj = json_object_get(c, "text");
        const char *text = json_string_value(tj);
        size_t len = json_string_length(tj);
        const json_t *pieces = json_object_get(c, "pieces");
        const json_t *want_pushes = json_object_get(c, "pushes");
        const json_t *want_msg = json_object_get(c, "message");
        const char *want_fin = json_string_value(json_object_get(c, "finish_reason"));
        td_chat_reply_finish_t engine = strcmp(json_string_value(json_object_get(c, "finish")),
                                               "length") == 0 ? TD_CHAT_REPLY_FINISH_LENGTH
                                                              : TD_CHAT_REPLY_FINISH_STOP;
        int failures = td_check_failures;
        json_error_t jerr;
        td_chat_prompt_t *prompt = NULL;

        json_t *req = json_loads(json_string_value(json_object_get(c, "body")), 0, &jerr);
        CHECK(req != NULL);
        CHECK_STATUS(td_chat_prompt_encode(req, NULL, &prompt, NULL), TD_OK);
        json_decref(req);
        if (prompt == NULL)
            continue;
        td_chat_reply_opts_t po = prompt->reply;

        /* One shot. */
        td_chat_reply_t *r = NULL;
        CHECK_STATUS(td_chat_reply_parse(&po, text, len, engine, &r), TD_OK);
        if (r) {
            json_t *m = reply_json(name, r);
            CHECK(same_json(name, "one-shot message", m, want_msg));
            CHECK_STR(td_chat_reply_finish_str(r->finish), want_fin);
            json_decref(m);
            td_chat_reply_destroy(r);
        }

        /* One token piece at a time: the deltas after every piece. */
        size_t np = json_array_size(pieces);
        size_t *cuts = calloc(len + 2, sizeof(*cuts));
        size_t off = 0;
        for (size_t i = 0; i < np; i++) {
            cuts[i] = off;
            off += json_string_length(json_array_get(pieces, i));
        }
        cuts[np] = off;
        CHECK(off == len);
        json_t *msg = NULL;
        const char *fin = NULL;
        json_t *got = stream(name, &po, text, cuts, np, engine, &msg, &fin);
        CHECK(json_array_size(got) == json_array_size(want_pushes));
        for (size_t i = 0; i < json_array_size(want_pushes); i++) {
            char what[64];
            snprintf(what, sizeof(what), "deltas after piece %zu of %zu", i, np);
            if (!same_json(name, what, json_array_get(got, i), json_array_get(want_pushes, i))) {
                td_check_failures++;
                break;
            }
        }
        CHECK(same_json(name, "streamed message", msg, want_msg));
        CHECK_STR(fin, want_fin);
        json_decref(got);
        json_decref(msg);

        /* One byte at a time (pieces end inside UTF-8 characters): the same
         * deltas overall. Not the finish reason: where a call is announced
         * only by the final flush, the reference reports "stop", and which
         * call that is depends on how the output was cut. */
        json_t *want_all = json_array();
        for (size_t i = 0; i < json_array_size(want_pushes); i++)
            merge_events(want_all, json_array_get(want_pushes, i));
        drop_finish(want_all);
        for (size_t i = 0; i <= len; i++)
            cuts[i] = i;
        got = stream(name, &po, text, cuts, len, engine, &msg, &fin);
        json_t *got_all = json_array();
        for (size_t i = 0; i < json_array_size(got); i++)
            merge_events(got_all, json_array_get(got, i));
        drop_finish(got_all);
        CHECK(same_json(name, "byte-at-a-time deltas", got_all, want_all));
        CHECK(same_json(name, "byte-at-a-time message", msg, want_msg));
        json_decref(got);
        json_decref(got_all);
        json_decref(want_all);
        json_decref(msg);
        free(cuts);

        td_chat_prompt_destroy(prompt);
        if (td_check_failures == failures)
            (*passed)++;
    }
}

int
main(int argc, char **argv)
{
    json_error_t jerr;

    if (argc != 3) {
        fprintf(stderr, "usage: test_chat_fixtures encode.json parse.json\n");
        return 2;
    }
    json_t *enc = json_load_file(argv[1], 0, &jerr);
    json_t *par = json_load_file(argv[2], 0, &jerr);
    if (enc == NULL || par == NULL) {
        fprintf(stderr, "test_chat_fixtures: %s:%d: %s\n", jerr.source, jerr.line, jerr.text);
        return 1;
    }
    int passed = 0, refused = 0, parsed = 0;
    size_t nrefusals = 0;
    const json_t *ec = json_object_get(enc, "cases");
    const json_t *pc = json_object_get(par, "cases");
    for (size_t i = 0; i < json_array_size(ec); i++)
        nrefusals += json_object_get(json_array_get(ec, i), "error") != NULL;
    run_encode(ec, &passed, &refused);
    run_parse(pc, &parsed);
    fprintf(stderr, "encode: %d of %zu prompts equal the reference, %d of %zu refusals "
                    "refused; parse: %d of %zu outputs equal (one-shot, per token, per byte)\n",
            passed, json_array_size(ec) - nrefusals, refused, nrefusals, parsed,
            json_array_size(pc));
    json_decref(enc);
    json_decref(par);
    return td_check_exit("test_chat_fixtures");
}
