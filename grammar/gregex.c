/* grammar/gregex.c — the regex front end: a documented subset of PCRE
 * (docs/structured-output.md) parsed by recursive descent into a fragment of
 * the rule graph that matches whole strings; in JSON mode its characters
 * are matched as they appear inside a JSON string (escaped where JSON
 * escapes them). */
#include <stdio.h>
#include <string.h>

#include "gram.h"

#define RX_MAX_DEPTH 128
#define RX_MAX_REPEAT 10000

typedef struct {
    gctx_t *c;
    const char *s;
    size_t len, i;
    bool json;
    int depth;
} rx_t;

static gfrag_t rx_alt(rx_t *r);

static gfrag_t
rx_fail(rx_t *r, td_status_t st, const char *what)
{
    gctx_fail(r->c, st, "invalid regex at offset %zu: %s", r->i, what);
    return gb_empty(r->c);
}

/* The next code point of the pattern (UTF-8); -1 on a bad byte. */
static int32_t
rx_cp(rx_t *r)
{
    const uint8_t *p = (const uint8_t *)r->s + r->i;
    size_t left = r->len - r->i;
    uint32_t cp;
    size_t n;

    if (p[0] < 0x80) {
        r->i++;
        return p[0];
    }
    n = p[0] >= 0xF0 ? 4 : p[0] >= 0xE0 ? 3 : p[0] >= 0xC0 ? 2 : 0;
    if (n == 0 || n > left)
        return -2;
    cp = p[0] & (0x7F >> n);
    for (size_t k = 1; k < n; k++) {
        if ((p[k] & 0xC0) != 0x80)
            return -2;
        cp = cp << 6 | (p[k] & 0x3F);
    }
    r->i += n;
    return (int32_t)cp;
}

static gfrag_t
rx_set(rx_t *r, gcset_t *s)
{
    gfrag_t f;

    gcset_norm(s);
    f = r->json ? gb_json_chars(r->c, s) : gb_utf8(r->c, s);
    gcset_free(s);
    return f;
}

static int
hexval(char ch)
{
    return ch >= '0' && ch <= '9' ? ch - '0'
           : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
           : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* After a backslash: a class escape (\d \w \s and negations) into s, or a
 * single code point (returned). -1: a class was added; -2: an error; -3: an
 * escape not supported. */
static int32_t
rx_escape(rx_t *r, gcset_t *s)
{
    static const char *const simple = "nrtfv0";
    static const uint32_t simple_cp[] = { '\n', '\r', '\t', '\f', '\v', 0 };

    if (r->i >= r->len)
        return -2;
    char ch = r->s[r->i++];
    const char *k = strchr(simple, ch);
    if (k != NULL && ch != '\0')
        return (int32_t)simple_cp[k - simple];
    if (ch == 'd' || ch == 'D' || ch == 'w' || ch == 'W' || ch == 's' || ch == 'S') {
        gcset_t t = { 0 };
        char lc = (char)(ch | 0x20);
        if (lc == 'd' || lc == 'w')
            gcset_add(&t, '0', '9');
        if (lc == 'w') {
            gcset_add(&t, 'a', 'z');
            gcset_add(&t, 'A', 'Z');
            gcset_add(&t, '_', '_');
        }
        if (lc == 's') {
            gcset_add(&t, '\t', '\r');
            gcset_add(&t, ' ', ' ');
        }
        if (ch != lc)
            gcset_negate(&t);
        for (size_t i = 0; i < t.n; i++)
            gcset_add(s, t.r[i][0], t.r[i][1]);
        gcset_free(&t);
        return -1;
    }
    if (ch == 'x' || ch == 'u') {
        size_t nd = ch == 'x' ? 2 : 4;
        int32_t v = 0;
        if (r->i + nd > r->len)
            return -2;
        for (size_t k2 = 0; k2 < nd; k2++) {
            int h = hexval(r->s[r->i++]);
            if (h < 0)
                return -2;
            v = v * 16 + h;
        }
        return v;
    }
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9'))
        return -3;   /* \b, \1, \p ...: not supported */
    r->i--;
    return rx_cp(r);
}

/* [...] after the '['. */
static gfrag_t
rx_class(rx_t *r)
{
    gcset_t s = { 0 };
    bool neg = r->i < r->len && r->s[r->i] == '^';
    bool first = true;

    r->i += neg;
    while (r->i < r->len && (r->s[r->i] != ']' || first)) {
        int32_t lo, hi;
        first = false;
        if (r->s[r->i] == '\\') {
            r->i++;
            lo = rx_escape(r, &s);
        } else {
            lo = rx_cp(r);
        }
        if (lo == -1)
            continue;
        if (lo < -1) {
            gcset_free(&s);
            return rx_fail(r, TD_ERR_UNSUPPORTED, "a bad or unsupported escape in a class");
        }
        hi = lo;
        if (r->i + 1 < r->len && r->s[r->i] == '-' && r->s[r->i + 1] != ']') {
            r->i++;
            if (r->s[r->i] == '\\') {
                r->i++;
                hi = rx_escape(r, &s);
            } else {
                hi = rx_cp(r);
            }
            if (hi < lo) {
                gcset_free(&s);
                return rx_fail(r, TD_ERR_INVALID, "a class range out of order");
            }
        }
        gcset_add(&s, (uint32_t)lo, (uint32_t)hi);
    }
    if (r->i >= r->len) {
        gcset_free(&s);
        return rx_fail(r, TD_ERR_INVALID, "a character class without its ']'");
    }
    r->i++;
    if (neg)
        gcset_negate(&s);
    return rx_set(r, &s);
}

static gfrag_t
rx_atom(rx_t *r)
{
    gcset_t s = { 0 };
    int32_t cp;
    char ch = r->s[r->i];

    if (ch == '(') {
        r->i++;
        if (r->i + 1 < r->len && r->s[r->i] == '?') {
            if (r->s[r->i + 1] != ':')
                return rx_fail(r, TD_ERR_UNSUPPORTED,
                               "lookaround and group options are not supported");
            r->i += 2;
        }
        if (++r->depth > RX_MAX_DEPTH)
            return rx_fail(r, TD_ERR_UNSUPPORTED, "groups nested too deep");
        gfrag_t f = rx_alt(r);
        r->depth--;
        if (r->i >= r->len || r->s[r->i] != ')')
            return rx_fail(r, TD_ERR_INVALID, "a group without its ')'");
        r->i++;
        return f;
    }
    if (ch == '[') {
        r->i++;
        return rx_class(r);
    }
    if (ch == '.') {
        r->i++;
        gcset_add(&s, '\n', '\n');
        gcset_negate(&s);
        return rx_set(r, &s);
    }
    if (ch == '*' || ch == '+' || ch == '?' || ch == '{')
        return rx_fail(r, TD_ERR_INVALID, "a quantifier with nothing to repeat");
    if (ch == '\\') {
        r->i++;
        cp = rx_escape(r, &s);
        if (cp == -1)
            return rx_set(r, &s);
        if (cp == -3)
            return rx_fail(r, TD_ERR_UNSUPPORTED, "this escape (word boundaries, back "
                           "references, Unicode properties) is not supported");
    } else {
        cp = rx_cp(r);
    }
    if (cp < 0)
        return rx_fail(r, TD_ERR_INVALID, "bad escape or UTF-8");
    gcset_add(&s, (uint32_t)cp, (uint32_t)cp);
    return rx_set(r, &s);
}

/* {n}, {n,}, {n,m} after the '{': true with the bounds. */
static bool
rx_braces(rx_t *r, uint32_t *min, uint32_t *max)
{
    size_t i = r->i;
    unsigned long a = 0, b;
    int nd = 0;

    while (i < r->len && r->s[i] >= '0' && r->s[i] <= '9' && nd < 7)
        a = a * 10 + (unsigned long)(r->s[i++] - '0'), nd++;
    if (nd == 0 || i >= r->len)
        return false;
    b = a;
    if (r->s[i] == ',') {
        i++;
        b = UINT32_MAX;
        if (i < r->len && r->s[i] >= '0' && r->s[i] <= '9') {
            for (b = 0, nd = 0; i < r->len && r->s[i] >= '0' && r->s[i] <= '9' && nd < 7; nd++)
                b = b * 10 + (unsigned long)(r->s[i++] - '0');
        }
    }
    if (i >= r->len || r->s[i] != '}')
        return false;
    r->i = i + 1;
    *min = (uint32_t)a;
    *max = (uint32_t)b;
    return true;
}

/* An atom and its quantifiers. */
static gfrag_t
rx_piece(rx_t *r)
{
    gfrag_t f = rx_atom(r);

    while (r->i < r->len && r->c->st == TD_OK) {
        char q = r->s[r->i];
        uint32_t min, max;
        if (q == '*' || q == '+' || q == '?') {
            r->i++;
            f = q == '*' ? gb_star(r->c, f) : q == '+' ? gb_plus(r->c, f) : gb_opt(r->c, f);
        } else if (q == '{') {
            r->i++;
            if (!rx_braces(r, &min, &max))
                return rx_fail(r, TD_ERR_INVALID, "a bad {n,m} quantifier");
            if (max < min || (max != UINT32_MAX && max > RX_MAX_REPEAT) || min > RX_MAX_REPEAT)
                return rx_fail(r, TD_ERR_UNSUPPORTED, "a {n,m} quantifier out of order or "
                               "over 10000");
            uint32_t rule = gb_rule(r->c);
            gb_rule_set(r->c, rule, f);
            f = gb_repeat(r->c, rule, min, max);
        } else {
            break;
        }
        if (r->i < r->len && (r->s[r->i] == '?' || r->s[r->i] == '+'))
            r->i++;   /* lazy and possessive forms match the same strings */
    }
    return f;
}

static gfrag_t
rx_concat(rx_t *r)
{
    gfrag_t f = gb_empty(r->c);

    while (r->i < r->len && r->s[r->i] != '|' && r->s[r->i] != ')' && r->c->st == TD_OK) {
        if (r->s[r->i] == '^' && r->i == 0) {   /* anchors: the match is whole anyway */
            r->i++;
            continue;
        }
        if (r->s[r->i] == '$' && r->i + 1 == r->len) {
            r->i++;
            continue;
        }
        if (r->s[r->i] == '^' || r->s[r->i] == '$')
            return rx_fail(r, TD_ERR_UNSUPPORTED, "anchors inside the pattern are not "
                           "supported");
        f = gb_seq(r->c, f, rx_piece(r));
    }
    return f;
}

static gfrag_t
rx_alt(rx_t *r)
{
    gfrag_t first = rx_concat(r), alt;

    if (r->i >= r->len || r->s[r->i] != '|')
        return first;
    alt = gb_alt_begin(r->c);
    gb_alt_add(r->c, alt, first);
    while (r->i < r->len && r->s[r->i] == '|' && r->c->st == TD_OK) {
        r->i++;
        gb_alt_add(r->c, alt, rx_concat(r));
    }
    return alt;
}

gfrag_t
gregex_build(gctx_t *c, const char *re, size_t len, bool json)
{
    rx_t r = { .c = c, .s = re, .len = len, .json = json };
    gfrag_t f = rx_alt(&r);

    if (c->st == TD_OK && r.i < len)
        rx_fail(&r, TD_ERR_INVALID, "an unmatched ')'");
    return f;
}
