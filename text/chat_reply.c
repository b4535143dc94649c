/* text/chat_reply.c — the streaming reader of DeepSeek-V4.1 output: a byte-level
 * state machine that splits it into reasoning, content and DSML tool calls, with
 * the deltas of each feed the reference reader's (docs/chat.md). */
#include "chat_reply.h"
#include "chat.h"

#include "buf.h"
#include "log.h"
#include "rng.h"
#include "stopmatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* ---- Reading the output: the marker state machine -----------------------
 * The output is read byte by byte. Each stage has a list of patterns
 * (branches), tried in order; bytes that cannot be part of a pattern any more
 * get the stage's own action (content, reasoning, skipped, ...); a pattern
 * that completes has the branch's action and moves to the branch's stage.
 * Bytes that may still become a pattern are held back, so a delta is never
 * taken back. Patterns:
 *   STRING      the string (or any of the stop strings), found anywhere
 *               (text/stopmatch.h's automaton);
 *   NL_STRING   the string with the newlines right before it (they are not
 *               content: "text\n\n</think>" gives "text");
 *   LEADING_NL  a newline as the first byte of the stage (leading newlines
 *               are dropped one at a time).
 * When things are released follows the reference reader exactly (it shows in
 * the deltas of each feed): what precedes a completed pattern at once; held
 * bytes at the end of a feed, and only whole feeds' worth of them; a
 * completed pattern's own action at the end of the feed, unless everything
 * after it in that same feed is still a possible pattern (release_held). */

typedef enum { PAT_STRING, PAT_NL_STRING, PAT_LEADING_NL } chat_pat_kind_t;

typedef enum {
    STAGE_CONTENT,      /* flag: at the start (leading newlines dropped) */
    STAGE_REASONING,    /* flag: at the start */
    STAGE_CALLS,        /* inside the tool-call block, between invokes */
    STAGE_TOOL_NAME,    /* after invoke name=" */
    STAGE_ARGS,         /* inside an invoke; flag: no parameter yet */
    STAGE_PARAM_NAME,   /* after parameter name= : the quoted name, up to a space */
    STAGE_PARAM_TYPE,   /* after that space, until string="true|false"> */
    STAGE_PARAM_VALUE,  /* flag: a string value */
    STAGE_FINISHED,     /* after the block, or a stop string: the rest is dropped */
} chat_stage_t;

typedef enum {
    ACT_CONTENT,
    ACT_REASONING,
    ACT_SKIP,
    ACT_STOP,          /* a stop string */
    ACT_CALL_BEGIN,    /* invoke name=" */
    ACT_CALL_NAME,     /* bytes of the name */
    ACT_CALL_NAME_END, /* its closing quote: the call is announced */
    ACT_ARGS_LABEL,    /* JSON punctuation: the label */
    ACT_ARGS_RAW,      /* bytes as they are (quoted parameter names, non-string values) */
    ACT_ARGS_STRING,   /* bytes escaped for a JSON string */
} chat_act_t;

enum {
    PAT_DSML_BEGIN, PAT_DSML_END, PAT_CALLS_END1, PAT_CALLS_END2, PAT_THINK_END,
    PAT_INVOKE, PAT_QUOTE, PAT_PARAM, PAT_SPACE, PAT_TRUE, PAT_FALSE, PAT_NFIXED
};

static const char *const chat_fixed_pats[PAT_NFIXED] = {
    [PAT_DSML_BEGIN] = "<" TD_CHAT_TOK_DSML,
    [PAT_DSML_END]   = "</" TD_CHAT_TOK_DSML,
    [PAT_CALLS_END1] = "</" TD_CHAT_TOK_DSML "tool_calls>",
    [PAT_CALLS_END2] = "</" TD_CHAT_TOK_DSML " calls>",
    [PAT_THINK_END]  = TD_CHAT_TOK_UNTHINK,
    [PAT_INVOKE]     = "invoke name=\"",
    [PAT_QUOTE]      = "\"",
    [PAT_PARAM]      = "parameter name=",
    [PAT_SPACE]      = " ",
    [PAT_TRUE]       = "true\">",
    [PAT_FALSE]      = "false\">",
};

/* A pattern: one marker, or every stop string at once (text/stopmatch.h,
 * the one matcher; a single string walks it as KMP would). */
typedef struct {
    td_stopmatch_t *m;
} chat_pat_t;

typedef struct {
    chat_pat_kind_t kind;
    const chat_pat_t *pat;  /* NULL for PAT_LEADING_NL */
    uint32_t state;         /* pat's automaton state */
    size_t len;             /* bytes of pat matched (a complete match: its length) */
    size_t nl;              /* NL_STRING: newlines before them */
    bool leading, matched;  /* LEADING_NL */
    chat_stage_t next;
    bool next_flag;
    chat_act_t act;
    const char *label;      /* ACT_ARGS_LABEL */
} chat_branch_t;

struct td_chat_reply_reader {
    td_chat_reply_start_t start;
    bool tool_calls;
    bool split_args;        /* opts.split_args */
    bool args_cut;          /* split_args: the next arguments piece opens a new delta */
    chat_pat_t pats[PAT_NFIXED];
    chat_pat_t stops;       /* every stop string (none: NULL automaton) */
    bool stops_armed;       /* a stop string that completes counts (min_tokens reached) */
    const char *stop_hit;   /* the stop string that matched (the automaton's), or NULL */
    bool stop_include;      /* a matched stop string is content too */

    chat_stage_t stage;
    bool flag;
    chat_branch_t *br;
    size_t nbr;
    chat_act_t unmatched;
    /* The action of the pattern the last match completed, not yet taken
     * (pending), and the bytes this stage has seen since, not yet acted on. */
    bool pending;
    chat_act_t pend_act;
    const char *pend_label;
    bool pend_within;       /* the whole pattern came in one feed */
    bool pend_checked;      /* a feed has ended since the match */
    bool pend_glued;        /* ... and that feed went on after the pattern */
    td_buf_t held;
    size_t *frags;          /* held, cut where the feeds that brought it began */
    size_t nfrags, frags_cap;
    bool frag_open;         /* the current feed has a fragment in frags */

    uint8_t utf8[4];        /* an unfinished UTF-8 character from the last feed */
    size_t nutf8;
    bool stopped, finished;
    td_rng_t rng;           /* tool call ids */

    /* What the deltas add up to. */
    td_buf_t content, reasoning, name;
    td_buf_t *args;       /* per call */
    td_chat_reply_t reply;
    size_t calls_cap;

    /* Deltas of the current feed; their texts live in dtext. */
    td_chat_reply_delta_t *deltas;
    size_t ndeltas, deltas_cap;
    size_t *doff;           /* offset of each delta's text in dtext */
    td_buf_t dtext;
    bool oom;
};

/* Step a string branch's automaton: the bytes of pat matched now (the
 * pattern's length when one completes, what may still become one else);
 * true when one completes. */
static bool
pat_step(chat_branch_t *b, char c)
{
    size_t hit;

    b->state = td_stopmatch_step(b->pat->m, b->state, (unsigned char)c);
    hit = td_stopmatch_hit(b->pat->m, b->state, NULL);
    b->len = hit ? hit : td_stopmatch_depth(b->pat->m, b->state);
    return hit > 0;
}

/* Feed one byte; true when the pattern is complete. */
static bool
branch_feed(chat_branch_t *b, char c)
{
    switch (b->kind) {
    case PAT_STRING:
        return pat_step(b, c);
    case PAT_NL_STRING:
        if (b->len == 0 && c == '\n') {
            b->nl++;
            return false;
        } else {
            size_t before = b->len;
            bool hit = pat_step(b, c);
            if (b->len <= before)
                b->nl = 0;
            return hit;
        }
    case PAT_LEADING_NL:
        if (b->leading)
            b->matched = c == '\n';
        b->leading = false;
        return b->matched;
    }
    return false;
}

/* Bytes at the end of what was seen that belong to the (partial) match. */
static size_t
branch_len(const chat_branch_t *b)
{
    switch (b->kind) {
    case PAT_STRING:     return b->len;
    case PAT_NL_STRING:  return b->len + b->nl;
    case PAT_LEADING_NL: return b->matched ? 1 : 0;
    }
    return 0;
}

static void
add_branch(td_chat_reply_reader_t *p, chat_pat_kind_t kind, const chat_pat_t *pat,
           chat_stage_t next, bool next_flag, chat_act_t act, const char *label)
{
    p->br[p->nbr++] = (chat_branch_t){
        .kind = kind, .pat = pat, .leading = true, .next = next, .next_flag = next_flag,
        .act = act, .label = label,
    };
}

/* Enter a stage: its branches, in the order they are tried, and the action
 * of bytes no branch can use. */
static void
stage_enter(td_chat_reply_reader_t *p, chat_stage_t stage, bool flag)
{
    const chat_pat_t *pt = p->pats;

    p->stage = stage;
    p->flag = flag;
    p->nbr = 0;
    switch (stage) {
    case STAGE_CONTENT:
        if (p->stops.m != NULL)
            add_branch(p, PAT_STRING, &p->stops, STAGE_FINISHED, false, ACT_STOP, NULL);
        if (p->tool_calls)
            add_branch(p, PAT_NL_STRING, &pt[PAT_DSML_BEGIN], STAGE_CALLS, false, ACT_SKIP, NULL);
        if (flag)
            add_branch(p, PAT_LEADING_NL, NULL, STAGE_CONTENT, true, ACT_SKIP, NULL);
        /* A stray end of thinking in the content is dropped. */
        add_branch(p, PAT_STRING, &pt[PAT_THINK_END], STAGE_CONTENT, false, ACT_SKIP, NULL);
        p->unmatched = ACT_CONTENT;
        break;
    case STAGE_REASONING:
        if (p->tool_calls)
            add_branch(p, PAT_NL_STRING, &pt[PAT_DSML_BEGIN], STAGE_CALLS, false, ACT_SKIP, NULL);
        if (flag)
            add_branch(p, PAT_LEADING_NL, NULL, STAGE_REASONING, true, ACT_SKIP, NULL);
        add_branch(p, PAT_NL_STRING, &pt[PAT_THINK_END], STAGE_CONTENT, true, ACT_SKIP, NULL);
        p->unmatched = ACT_REASONING;
        break;
    case STAGE_CALLS:
        add_branch(p, PAT_STRING, &pt[PAT_INVOKE], STAGE_TOOL_NAME, false, ACT_CALL_BEGIN, NULL);
        add_branch(p, PAT_STRING, &pt[PAT_CALLS_END1], STAGE_FINISHED, false, ACT_SKIP, NULL);
        add_branch(p, PAT_STRING, &pt[PAT_CALLS_END2], STAGE_FINISHED, false, ACT_SKIP, NULL);
        p->unmatched = ACT_SKIP;
        break;
    case STAGE_TOOL_NAME:
        add_branch(p, PAT_STRING, &pt[PAT_QUOTE], STAGE_ARGS, true, ACT_CALL_NAME_END, NULL);
        p->unmatched = ACT_CALL_NAME;
        break;
    case STAGE_ARGS:
        add_branch(p, PAT_STRING, &pt[PAT_PARAM], STAGE_PARAM_NAME, false, ACT_ARGS_LABEL,
                   flag ? "{" : ", ");
        add_branch(p, PAT_STRING, &pt[PAT_DSML_END], STAGE_CALLS, false, ACT_ARGS_LABEL,
                   flag ? "{}" : "}");
        p->unmatched = ACT_SKIP;
        break;
    case STAGE_PARAM_NAME:
        /* The name goes out with its quotes, as written, up to the first space. */
        add_branch(p, PAT_STRING, &pt[PAT_SPACE], STAGE_PARAM_TYPE, false, ACT_ARGS_LABEL,
                   ": ");
        p->unmatched = ACT_ARGS_RAW;
        break;
    case STAGE_PARAM_TYPE:
        add_branch(p, PAT_STRING, &pt[PAT_TRUE], STAGE_PARAM_VALUE, true, ACT_ARGS_LABEL, "\"");
        add_branch(p, PAT_STRING, &pt[PAT_FALSE], STAGE_PARAM_VALUE, false, ACT_SKIP, NULL);
        p->unmatched = ACT_SKIP;
        break;
    case STAGE_PARAM_VALUE:
        add_branch(p, PAT_STRING, &pt[PAT_DSML_END], STAGE_ARGS, false,
                   flag ? ACT_ARGS_LABEL : ACT_SKIP, flag ? "\"" : NULL);
        p->unmatched = flag ? ACT_ARGS_STRING : ACT_ARGS_RAW;
        break;
    case STAGE_FINISHED:
        p->unmatched = ACT_SKIP;
        break;
    }
}

/* ---- Deltas and the reply ---------------------------------------------- */

/* The reply has reasoning (possibly empty) when the output begins in it. */
static bool
chat_starts_in_reasoning(td_chat_reply_start_t s)
{
    return s == TD_CHAT_REPLY_START_REASONING || s == TD_CHAT_REPLY_START_REASONING_CONT;
}

/* A new delta with an empty text; NULL when out of memory. */
static td_chat_reply_delta_t *
delta_new(td_chat_reply_reader_t *p, td_chat_reply_delta_kind_t kind, uint32_t index)
{
    if (p->ndeltas == p->deltas_cap) {
        size_t cap = p->deltas_cap ? 2 * p->deltas_cap : 16;
        td_chat_reply_delta_t *d = realloc(p->deltas, cap * sizeof(*d));
        if (d == NULL) {
            p->oom = true;
            return NULL;
        }
        p->deltas = d;
        size_t *o = realloc(p->doff, cap * sizeof(*o));
        if (o == NULL) {
            p->oom = true;
            return NULL;
        }
        p->doff = o;
        p->deltas_cap = cap;
    }
    if (td_buf_append(&p->dtext, "", 1) != TD_OK) {
        p->oom = true;
        return NULL;
    }
    p->doff[p->ndeltas] = p->dtext.len - 1;
    p->deltas[p->ndeltas] = (td_chat_reply_delta_t){ .kind = kind, .index = index };
    return &p->deltas[p->ndeltas++];
}

/* Text for the deltas; it extends the last delta when that is of the same
 * kind (and the same call). Each delta's text is followed by a NUL in dtext. */
static void
delta_text(td_chat_reply_reader_t *p, td_chat_reply_delta_kind_t kind, uint32_t index,
           const char *s, size_t n, bool escape)
{
    td_chat_reply_delta_t *last = p->ndeltas ? &p->deltas[p->ndeltas - 1] : NULL;

    if (n == 0)
        return;
    if (last == NULL || last->kind != kind ||
        (kind == TD_CHAT_REPLY_DELTA_TOOL_ARGS && (last->index != index || p->args_cut))) {
        last = delta_new(p, kind, index);
        if (last == NULL)
            return;
    }
    /* Write over the NUL that ends the last delta. */
    td_buf_truncate(&p->dtext, p->dtext.len - 1);
    size_t before = p->dtext.len;
    if (escape)
        td_chat_json_escape(&p->dtext, s, n);
    else
        td_buf_append(&p->dtext, s, n);
    last->len += p->dtext.len - before;
    td_buf_append(&p->dtext, "", 1);
}

static const char chat_id_alnum[] =
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/* A call's name is complete: the call exists from now on. */
static void
call_open(td_chat_reply_reader_t *p)
{
    td_chat_reply_t *r = &p->reply;

    if (r->ncalls == p->calls_cap) {
        size_t cap = p->calls_cap ? 2 * p->calls_cap : 4;
        td_chat_reply_call_t *c = realloc(r->calls, cap * sizeof(*c));
        td_buf_t *a = c ? realloc(p->args, cap * sizeof(*a)) : NULL;
        if (c)
            r->calls = c;
        if (a == NULL) {
            p->oom = true;
            return;
        }
        p->args = a;
        p->calls_cap = cap;
    }
    /* With thinking on, a call made before any reasoning is marked "ET_"
     * (empty thinking) in its id, as the reference does. */
    char id[48];
    int n = snprintf(id, sizeof(id), "call_%02zu_%s", r->ncalls,
                     p->start != TD_CHAT_REPLY_START_PLAIN && p->reasoning.len == 0 ? "ET_" : "");
    for (int i = 0; i < 24 && n < (int)sizeof(id) - 1; i++, n++) {
        uint64_t x = td_rng_next(&p->rng);
        id[n] = i < 20 ? chat_id_alnum[x % 62] : (char)('0' + x % 10);
    }
    id[n] = '\0';
    td_chat_reply_call_t *call = &r->calls[r->ncalls];
    call->id = strdup(id);
    call->name = td_buf_take(&p->name, NULL);
    call->arguments = NULL;
    call->arguments_len = 0;
    p->args[r->ncalls] = (td_buf_t){ 0 };
    if (call->id == NULL || call->name == NULL) {
        free(call->id);
        free(call->name);
        p->oom = true;
        return;
    }
    r->ncalls++;
    td_chat_reply_delta_t *d = delta_new(p, TD_CHAT_REPLY_DELTA_TOOL_CALL,
                                         (uint32_t)(r->ncalls - 1));
    if (d) {
        d->id = call->id;
        d->name = call->name;
    }
}

static void
call_args(td_chat_reply_reader_t *p, const char *s, size_t n, bool escape)
{
    td_chat_reply_t *r = &p->reply;

    if (r->ncalls == 0 || n == 0)
        return;
    size_t i = r->ncalls - 1;
    if (escape)
        td_chat_json_escape(&p->args[i], s, n);
    else
        td_buf_append(&p->args[i], s, n);
    delta_text(p, TD_CHAT_REPLY_DELTA_TOOL_ARGS, (uint32_t)i, s, n, escape);
    p->args_cut = false;
}

/* split_args: a label (punctuation) is a piece of its own, and what follows
 * it begins another. */
static void
call_label(td_chat_reply_reader_t *p, const char *label)
{
    p->args_cut = p->split_args;
    call_args(p, label, strlen(label), false);
    p->args_cut = p->split_args;
}

/* Act on n bytes. */
static void
act(td_chat_reply_reader_t *p, chat_act_t a, const char *s, size_t n, const char *label)
{
    switch (a) {
    case ACT_CONTENT:
        td_buf_append(&p->content, s, n);
        delta_text(p, TD_CHAT_REPLY_DELTA_CONTENT, 0, s, n, false);
        break;
    case ACT_REASONING:
        td_buf_append(&p->reasoning, s, n);
        delta_text(p, TD_CHAT_REPLY_DELTA_REASONING, 0, s, n, false);
        break;
    case ACT_SKIP:
        break;
    case ACT_STOP:
        if (label != NULL)   /* include_stop_str_in_output */
            act(p, ACT_CONTENT, label, strlen(label), NULL);
        p->stopped = true;
        break;
    case ACT_CALL_BEGIN:
        td_buf_truncate(&p->name, 0);
        break;
    case ACT_CALL_NAME:
        td_buf_append(&p->name, s, n);
        break;
    case ACT_CALL_NAME_END:
        call_open(p);
        break;
    case ACT_ARGS_LABEL:
        call_label(p, label);
        break;
    case ACT_ARGS_RAW:
        call_args(p, s, n, false);
        break;
    case ACT_ARGS_STRING:
        call_args(p, s, n, true);
        break;
    }
}

/* Take the pending pattern action, if any. */
static void
pending_release(td_chat_reply_reader_t *p)
{
    if (p->pending) {
        p->pending = false;
        act(p, p->pend_act, "", 0, p->pend_label);
    }
}

/* Act on the first n held bytes (after the pending pattern action). */
static void
held_release(td_chat_reply_reader_t *p, size_t n)
{
    pending_release(p);
    if (n == 0)
        return;
    act(p, p->unmatched, p->held.data, n, NULL);
    memmove(p->held.data, p->held.data + n, p->held.len - n);
    td_buf_truncate(&p->held, p->held.len - n);
    size_t k = 0;
    while (k < p->nfrags && p->frags[k] <= n) {
        n -= p->frags[k];
        k++;
    }
    if (k < p->nfrags)
        p->frags[k] -= n;
    memmove(p->frags, p->frags + k, (p->nfrags - k) * sizeof(*p->frags));
    p->nfrags -= k;
}

/* One byte of (valid UTF-8) output through the state machine. When a pattern
 * completes, what came before it is acted on at once; the pattern's own
 * action is pending until the end of the feed (see release_held). */
static void
feed_byte(td_chat_reply_reader_t *p, char c)
{
    chat_branch_t *hit = NULL;

    if (td_buf_append(&p->held, &c, 1) != TD_OK)
        return;
    if (!p->frag_open || p->nfrags == 0) {
        if (p->nfrags == p->frags_cap) {
            size_t cap = p->frags_cap ? 2 * p->frags_cap : 8;
            size_t *f = realloc(p->frags, cap * sizeof(*f));
            if (f == NULL) {
                p->oom = true;
                return;
            }
            p->frags = f;
            p->frags_cap = cap;
        }
        p->frags[p->nfrags++] = 0;
        p->frag_open = true;
    }
    p->frags[p->nfrags - 1]++;
    for (size_t i = 0; i < p->nbr; i++)
        if (branch_feed(&p->br[i], c)) {
            if (p->br[i].act == ACT_STOP && !p->stops_armed) {   /* min_tokens not reached */
                p->br[i].len = td_stopmatch_depth(p->br[i].pat->m, p->br[i].state);
                continue;
            }
            hit = &p->br[i];
            break;
        }
    if (hit == NULL)
        return;
    chat_branch_t b = *hit;
    size_t m = branch_len(&b);
    if (b.act == ACT_STOP) {
        size_t which;
        (void)td_stopmatch_hit(b.pat->m, b.state, &which);
        p->stop_hit = td_stopmatch_pattern(b.pat->m, which);
        if (p->stop_include)   /* the stop string is content too */
            b.label = p->stop_hit;
    }
    if (m > p->held.len)
        m = p->held.len;
    bool within = p->frag_open && p->frags[p->nfrags - 1] >= m;
    held_release(p, p->held.len - m);
    td_buf_truncate(&p->held, 0);   /* the pattern's bytes: its action stands for them */
    p->nfrags = 0;
    p->frag_open = false;     /* what follows in this feed starts a new fragment */
    p->pending = true;
    p->pend_act = b.act;
    p->pend_label = b.label;
    p->pend_within = within;
    p->pend_checked = false;
    p->pend_glued = false;
    stage_enter(p, b.next, b.next_flag);
}

/* End of a feed. The held bytes that no branch can still use go out, but only
 * in whole fragments (what one feed added since the last match): the
 * reference reader releases no part of a piece that ends inside a possible
 * marker. A pending pattern action waits while everything after it is a
 * possible marker, if the pattern and those bytes came in one feed (the
 * reference's timing, found by comparing piece by piece); otherwise it is
 * taken at the end of the feed. The deltas are the reference's, piece for
 * piece. */
static void
release_held(td_chat_reply_reader_t *p)
{
    size_t m = 0, n = 0;

    for (size_t i = 0; i < p->nbr; i++) {
        size_t l = branch_len(&p->br[i]);
        if (l > m)
            m = l;
    }
    bool all_partial = p->held.len > 0 && m >= p->held.len;
    if (p->pending) {
        if (!p->pend_checked) {
            p->pend_checked = true;
            p->pend_glued = p->pend_within && p->held.len > 0;
        }
        if (!(p->pend_glued && all_partial))
            pending_release(p);
    }
    if (all_partial)
        return;
    size_t limit = p->held.len - m;
    for (size_t k = 0; k < p->nfrags && n + p->frags[k] <= limit; k++)
        n += p->frags[k];
    if (n)
        held_release(p, n);
}

/* Length of a well-formed UTF-8 character at s (n bytes available): > 0 when
 * complete, 0 when s is a valid but unfinished start, -k when the first k
 * bytes are an ill-formed sequence (replaced by one U+FFFD). */
static int
utf8_char(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    int need;
    uint8_t lo = 0x80, hi = 0xBF;

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        return -1;
    }
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n)
            return 0;
        uint8_t b = s[i];
        if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF))
            return -i;
    }
    return need;
}

static void
feed_utf8(td_chat_reply_reader_t *p, const uint8_t *s, size_t n, bool final)
{
    size_t i = 0;

    while (i < n) {
        int k = utf8_char(s + i, n - i);
        if (k == 0 && !final)
            break;
        if (k <= 0) {
            static const char repl[] = "\xef\xbf\xbd";
            for (int j = 0; j < 3; j++)
                feed_byte(p, repl[j]);
            i += k < 0 ? (size_t)-k : n - i;
            continue;
        }
        for (int j = 0; j < k; j++)
            feed_byte(p, (char)s[i + j]);
        i += (size_t)k;
    }
    if (i < n) {   /* an unfinished character: keep it */
        memcpy(p->utf8, s + i, n - i);
        p->nutf8 = n - i;
    }
}

static void
deltas_begin(td_chat_reply_reader_t *p)
{
    p->ndeltas = 0;
    td_buf_truncate(&p->dtext, 0);
}

/* Point the deltas at their texts (dtext no longer moves) and refresh the reply. */
static td_status_t
deltas_end(td_chat_reply_reader_t *p, const td_chat_reply_delta_t **deltas, size_t *ndeltas)
{
    td_chat_reply_t *r = &p->reply;

    td_buf_reserve(&p->dtext, 0);   /* each is NUL-terminated from now on */
    td_buf_reserve(&p->content, 0);
    td_buf_reserve(&p->reasoning, 0);
    for (size_t i = 0; i < r->ncalls; i++) {
        if (td_buf_reserve(&p->args[i], 0) != TD_OK)
            p->oom = true;
        r->calls[i].arguments = p->args[i].data;
        r->calls[i].arguments_len = p->args[i].len;
    }
    if (p->oom || p->dtext.failed || p->content.failed || p->reasoning.failed ||
        p->held.failed || p->name.failed) {
        td_error("chat reply: out of memory reading the model output");
        p->finished = true;   /* the reply is incomplete; nothing more can be added */
        return TD_ERR_NOMEM;
    }
    for (size_t i = 0; i < p->ndeltas; i++)
        p->deltas[i].text = p->dtext.data + p->doff[i];
    r->content = p->content.data;
    r->content_len = p->content.len;
    r->reasoning = chat_starts_in_reasoning(p->start) ? p->reasoning.data : NULL;
    r->reasoning_len = chat_starts_in_reasoning(p->start) ? p->reasoning.len : 0;
    *deltas = p->deltas;
    *ndeltas = p->ndeltas;
    return TD_OK;
}

/* ---- The reader's public side ------------------------------------------- */

td_status_t
td_chat_reply_reader_create(const td_chat_reply_opts_t *opts, td_chat_reply_reader_t **out)
{
    td_chat_reply_reader_t *p = calloc(1, sizeof(*p));
    td_status_t st = TD_ERR_NOMEM;

    if (p == NULL)
        goto err_free;
    if (opts->start > TD_CHAT_REPLY_START_CONTENT_CONT) {
        td_error("chat reply: unknown start stage %d", (int)opts->start);
        st = TD_ERR_INVALID;
        goto err_free;
    }
    p->start = opts->start;
    p->tool_calls = opts->tool_calls;
    p->split_args = opts->split_args;
    for (int i = 0; i < PAT_NFIXED; i++)
        if (td_stopmatch_create(&chat_fixed_pats[i], NULL, 1, &p->pats[i].m) != TD_OK)
            goto err_free;
    for (size_t i = 0; i < opts->nstop; i++) {
        if (opts->stop[i] == NULL || opts->stop[i][0] == '\0') {
            td_error("chat reply: stop string %zu is empty", i);
            st = TD_ERR_INVALID;
            goto err_free;
        }
    }
    if (opts->nstop > 0 && td_stopmatch_create(opts->stop, NULL, opts->nstop, &p->stops.m) != TD_OK)
        goto err_free;
    p->stops_armed = true;
    p->stop_include = opts->stop_include;
    p->br = calloc(5, sizeof(*p->br));
    if (p->br == NULL)
        goto err_free;
    uint64_t seed = opts->id_seed;
    if (seed == 0 && getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed)) {
        struct timespec ts;   /* ids need to be unlikely to repeat, not secret */
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
    }
    p->rng = td_rng_seed(seed);
    if (opts->in_tool_calls)
        stage_enter(p, STAGE_CALLS, false);
    else if (opts->start == TD_CHAT_REPLY_START_REASONING)
        stage_enter(p, STAGE_REASONING, true);
    else if (opts->start == TD_CHAT_REPLY_START_REASONING_CONT)
        stage_enter(p, STAGE_REASONING, false);
    else
        stage_enter(p, STAGE_CONTENT, opts->start == TD_CHAT_REPLY_START_PLAIN);
    if (td_buf_reserve(&p->content, 0) != TD_OK || td_buf_reserve(&p->reasoning, 0) != TD_OK)
        goto err_free;
    p->reply.content = p->content.data;
    p->reply.reasoning = chat_starts_in_reasoning(p->start) ? p->reasoning.data : NULL;
    *out = p;
    return TD_OK;
err_free:
    if (st == TD_ERR_NOMEM)
        td_error("chat reply: out of memory creating a reader");
    td_chat_reply_reader_destroy(p);
    return st;
}

void
td_chat_reply_reader_destroy(td_chat_reply_reader_t *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < PAT_NFIXED; i++)
        td_stopmatch_destroy(p->pats[i].m);
    td_stopmatch_destroy(p->stops.m);
    free(p->br);
    free(p->frags);
    td_buf_free(&p->held);
    td_buf_free(&p->content);
    td_buf_free(&p->reasoning);
    td_buf_free(&p->name);
    for (size_t i = 0; i < p->reply.ncalls; i++) {
        free(p->reply.calls[i].id);
        free(p->reply.calls[i].name);
        td_buf_free(&p->args[i]);
    }
    free(p->reply.calls);
    free(p->args);
    free(p->deltas);
    free(p->doff);
    td_buf_free(&p->dtext);
    free(p);
}

td_status_t
td_chat_reply_reader_feed(td_chat_reply_reader_t *p, const char *text, size_t len,
                    const td_chat_reply_delta_t **deltas, size_t *ndeltas)
{
    if (p->finished) {
        td_error("chat reply: feed after finish");
        return TD_ERR_STATE;
    }
    deltas_begin(p);
    p->frag_open = false;
    if (!p->stopped && len > 0) {   /* after a stop string, the rest is ignored */
        const uint8_t *s = (const uint8_t *)text;
        /* Complete a character left unfinished by the last feed first. */
        while (p->nutf8 && len) {
            p->utf8[p->nutf8++] = *s++;
            len--;
            int k = utf8_char(p->utf8, p->nutf8);
            if (k != 0 || p->nutf8 == 4) {
                uint8_t tmp[4];
                size_t n = p->nutf8;
                memcpy(tmp, p->utf8, n);
                p->nutf8 = 0;
                feed_utf8(p, tmp, n, false);
            }
        }
        feed_utf8(p, s, len, false);
        release_held(p);
    }
    return deltas_end(p, deltas, ndeltas);
}

td_status_t
td_chat_reply_reader_finish(td_chat_reply_reader_t *p, td_chat_reply_finish_t engine,
                      const td_chat_reply_delta_t **deltas, size_t *ndeltas)
{
    if (p->finished) {
        td_error("chat reply: finished twice");
        return TD_ERR_STATE;
    }
    deltas_begin(p);
    /* A call announced only now, by the final flush, does not make the
     * finish reason "tool_calls" (the reference decides it before). */
    bool had_calls = p->reply.ncalls > 0;
    p->frag_open = false;
    if (!p->stopped) {
        if (p->nutf8) {
            uint8_t tmp[4];
            size_t n = p->nutf8;
            memcpy(tmp, p->utf8, n);
            p->nutf8 = 0;
            feed_utf8(p, tmp, n, true);
        }
        held_release(p, p->held.len);
    }
    if (p->stopped)
        p->reply.finish = TD_CHAT_REPLY_FINISH_STOP;
    else if (engine == TD_CHAT_REPLY_FINISH_LENGTH)
        p->reply.finish = TD_CHAT_REPLY_FINISH_LENGTH;
    else if (had_calls)
        p->reply.finish = TD_CHAT_REPLY_FINISH_TOOL_CALLS;
    else
        p->reply.finish = TD_CHAT_REPLY_FINISH_STOP;
    td_status_t st = deltas_end(p, deltas, ndeltas);
    p->finished = true;
    return st;
}

void
td_chat_reply_reader_arm(td_chat_reply_reader_t *p, bool armed)
{
    p->stops_armed = armed;
}

const char *
td_chat_reply_reader_stop(const td_chat_reply_reader_t *rd)
{
    return rd->stopped ? rd->stop_hit : NULL;
}

bool
td_chat_reply_reader_in_reasoning(const td_chat_reply_reader_t *rd)
{
    return rd->stage == STAGE_REASONING;
}

bool
td_chat_reply_reader_stopped(const td_chat_reply_reader_t *p)
{
    return p->stopped;
}

const td_chat_reply_t *
td_chat_reply_reader_reply(const td_chat_reply_reader_t *p)
{
    return &p->reply;
}

const char *
td_chat_reply_finish_str(td_chat_reply_finish_t f)
{
    switch (f) {
    case TD_CHAT_REPLY_FINISH_STOP:       return "stop";
    case TD_CHAT_REPLY_FINISH_LENGTH:     return "length";
    case TD_CHAT_REPLY_FINISH_TOOL_CALLS: return "tool_calls";
    }
    return "stop";
}

void
td_chat_reply_destroy(td_chat_reply_t *r)
{
    if (r == NULL)
        return;
    free(r->content);
    free(r->reasoning);
    for (size_t i = 0; i < r->ncalls; i++) {
        free(r->calls[i].id);
        free(r->calls[i].name);
        free(r->calls[i].arguments);
    }
    free(r->calls);
    free(r);
}

td_status_t
td_chat_reply_parse(const td_chat_reply_opts_t *opts, const char *text, size_t len,
              td_chat_reply_finish_t engine, td_chat_reply_t **out)
{
    td_chat_reply_reader_t *p = NULL;
    const td_chat_reply_delta_t *d;
    size_t nd;
    td_status_t st;

    st = td_chat_reply_reader_create(opts, &p);
    if (st != TD_OK)
        return st;
    st = td_chat_reply_reader_feed(p, text, len, &d, &nd);
    if (st == TD_OK)
        st = td_chat_reply_reader_finish(p, engine, &d, &nd);
    if (st != TD_OK)
        goto cleanup;
    td_chat_reply_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        td_error("chat reply: out of memory");
        st = TD_ERR_NOMEM;
        goto cleanup;
    }
    /* Move the reply's storage out of the reader. */
    *r = p->reply;
    if (r->reasoning != NULL)
        r->reasoning = td_buf_take(&p->reasoning, NULL);
    r->content = td_buf_take(&p->content, NULL);
    for (size_t i = 0; i < r->ncalls; i++)
        r->calls[i].arguments = td_buf_take(&p->args[i], NULL);
    p->reply.calls = NULL;
    p->reply.ncalls = 0;
    *out = r;
cleanup:
    td_chat_reply_reader_destroy(p);
    return st;
}

td_status_t
td_chat_reply_json(const td_chat_reply_t *r, json_t **out)
{
    json_t *msg = json_object();
    json_t *calls = NULL;

    if (msg == NULL ||
        json_object_set_new(msg, "role", json_string("assistant")) ||
        json_object_set_new(msg, "content",
                            json_stringn(r->content ? r->content : "", r->content_len)))
        goto err_nomem;
    if (r->reasoning &&
        json_object_set_new(msg, "reasoning_content",
                            json_stringn(r->reasoning ? r->reasoning : "", r->reasoning_len)))
        goto err_nomem;
    if (r->ncalls) {
        calls = json_array();
        if (calls == NULL)
            goto err_nomem;
        for (size_t i = 0; i < r->ncalls; i++) {
            const td_chat_reply_call_t *c = &r->calls[i];
            json_t *call = json_pack("{s:I, s:s, s:s, s:{s:s, s:s%}}", "index", (json_int_t)i,
                                     "id", c->id, "type", "function", "function",
                                     "name", c->name, "arguments",
                                     c->arguments ? c->arguments : "", c->arguments_len);
            if (call == NULL || json_array_append_new(calls, call))
                goto err_nomem;
        }
        if (json_object_set_new(msg, "tool_calls", calls)) {
            calls = NULL;
            goto err_nomem;
        }
        calls = NULL;
    }
    *out = msg;
    return TD_OK;
err_nomem:
    td_error("chat reply: out of memory building the message");
    json_decref(calls);
    json_decref(msg);
    return TD_ERR_NOMEM;
}

