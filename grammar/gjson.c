/* grammar/gjson.c — the JSON Schema front end: a schema (or json_object)
 * as rules of the graph. Compact JSON (no insignificant whitespace),
 * properties in schema order, pattern matching the whole string; every
 * keyword either applied or refused with its path (docs/structured-output.md
 * lists them). Each subschema compiles once (a map from the schema object to
 * its rule), so $ref recursion is a rule calling itself. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"

typedef struct {
    gctx_t *c;
    json_t *root;
    td_hmap_t *memo;         /* schema object -> rule */
    bool strict;
    uint32_t r_any, r_str, r_num, r_int, r_obj_any;   /* shared rules, 0: not made */
    bool have_any, have_str, have_num, have_int;
    int depth;
} js_t;

static uint32_t js_schema(js_t *j, json_t *s);

/* Path handling: append ".seg" (or "[i]") for a nested compile; restore. */
static size_t
js_path_push(js_t *j, const char *pre, const char *a)
{
    size_t old = strlen(j->c->path);
    snprintf(j->c->path + old, sizeof(j->c->path) - old, "%s%s%s", old ? "." : "", pre, a);
    return old;
}

static void
js_path_pop(js_t *j, size_t old)
{
    j->c->path[old] = '\0';
}

/* ---- The value rules every schema shares ------------------------------------------ */

/* A JSON string's content characters: any but ", \ and controls; the short
 * escapes; \u with four hex digits. */
static gfrag_t
js_strchar_but(js_t *j, const bool *excl)
{
    gctx_t *c = j->c;
    gcset_t lit = { 0 };
    gfrag_t alt = gb_alt_begin(c), hex = gb_alt_begin(c);

    for (uint32_t b = 0x20; b < 0x7F; b++)   /* DEL is not written raw */
        if (b != '"' && b != '\\' && (excl == NULL || !excl[b]))
            gcset_add(&lit, b, b);
    gcset_add(&lit, 0x80, 0x10FFFF);
    gcset_norm(&lit);
    gb_alt_add(c, alt, gb_utf8(c, &lit));
    gcset_free(&lit);
    gfrag_t esc = gb_alt_begin(c);
    static const char shorts[] = "\"\\bfnrt";
    for (const char *p = shorts; *p; p++)
        gb_alt_add(c, esc, gb_range(c, (uint8_t)*p, (uint8_t)*p));
    /* \u only for what cannot be written raw: \u0000-\u001f, \u007f */
    gb_alt_add(c, hex, gb_range(c, '0', '9'));
    gb_alt_add(c, hex, gb_range(c, 'a', 'f'));
    gb_alt_add(c, hex, gb_range(c, 'A', 'F'));
    gfrag_t u = gb_alt_begin(c);
    gb_alt_add(c, u, gb_seq(c, gb_range(c, '0', '1'), hex));
    gfrag_t del = gb_alt_begin(c);
    gb_alt_add(c, del, gb_range(c, 'f', 'f'));
    gb_alt_add(c, del, gb_range(c, 'F', 'F'));
    gb_alt_add(c, u, gb_seq(c, gb_lit(c, "7", 1), del));
    gb_alt_add(c, esc, gb_seq(c, gb_lit(c, "u00", 3), u));
    gb_alt_add(c, alt, gb_seq(c, gb_lit(c, "\\", 1), esc));
    return alt;
}

static gfrag_t
js_strchar(js_t *j)
{
    return js_strchar_but(j, NULL);
}

static uint32_t
js_string_rule(js_t *j)
{
    if (!j->have_str) {
        j->have_str = true;
        j->r_str = gb_rule(j->c);
        gfrag_t f = gb_seq(j->c, gb_lit(j->c, "\"", 1), gb_star(j->c, js_strchar(j)));
        gb_rule_set(j->c, j->r_str, gb_seq(j->c, f, gb_lit(j->c, "\"", 1)));
    }
    return j->r_str;
}

/* -?(0|[1-9][0-9]*) */
static gfrag_t
js_int_frag(js_t *j)
{
    gctx_t *c = j->c;
    gfrag_t nz = gb_seq(c, gb_range(c, '1', '9'), gb_star(c, gb_range(c, '0', '9')));
    gfrag_t alt = gb_alt_begin(c);
    gb_alt_add(c, alt, gb_lit(c, "0", 1));
    gb_alt_add(c, alt, nz);
    return gb_seq(c, gb_opt(c, gb_lit(c, "-", 1)), alt);
}

static uint32_t
js_int_rule(js_t *j)
{
    if (!j->have_int) {
        j->have_int = true;
        j->r_int = gb_rule(j->c);
        gb_rule_set(j->c, j->r_int, js_int_frag(j));
    }
    return j->r_int;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static uint32_t
js_num_rule(js_t *j)
{
    gctx_t *c = j->c;

    if (!j->have_num) {
        j->have_num = true;
        j->r_num = gb_rule(c);
        gfrag_t frac = gb_seq(c, gb_lit(c, ".", 1), gb_plus(c, gb_range(c, '0', '9')));
        gfrag_t sign = gb_alt_begin(c);
        gb_alt_add(c, sign, gb_range(c, '+', '+'));
        gb_alt_add(c, sign, gb_range(c, '-', '-'));
        gfrag_t e = gb_alt_begin(c);
        gb_alt_add(c, e, gb_range(c, 'e', 'e'));
        gb_alt_add(c, e, gb_range(c, 'E', 'E'));
        gfrag_t exp = gb_seq(c, gb_seq(c, e, gb_opt(c, sign)), gb_plus(c, gb_range(c, '0', '9')));
        gfrag_t f = gb_seq(c, gb_seq(c, js_int_frag(j), gb_opt(c, frac)), gb_opt(c, exp));
        gb_rule_set(c, j->r_num, f);
    }
    return j->r_num;
}

static gfrag_t
js_comma(gctx_t *c)
{
    return gb_lit(c, ",", 1);
}

/* Any JSON value; any object (json_object). */
static uint32_t
js_any_rule(js_t *j)
{
    gctx_t *c = j->c;

    if (j->have_any)
        return j->r_any;
    j->have_any = true;
    j->r_any = gb_rule(c);
    j->r_obj_any = gb_rule(c);
    uint32_t member = gb_rule(c), arr = gb_rule(c);
    gb_rule_set(c, member, gb_seq(c, gb_seq(c, gb_callf(c, js_string_rule(j)), gb_lit(c, ":", 1)),
                                  gb_callf(c, j->r_any)));
    gfrag_t o = gb_seq(c, gb_lit(c, "{", 1), gb_repeat_sep(c, member, js_comma, 0, UINT32_MAX));
    gb_rule_set(c, j->r_obj_any, gb_seq(c, o, gb_lit(c, "}", 1)));
    gfrag_t a = gb_seq(c, gb_lit(c, "[", 1), gb_repeat_sep(c, j->r_any, js_comma, 0, UINT32_MAX));
    gb_rule_set(c, arr, gb_seq(c, a, gb_lit(c, "]", 1)));
    gfrag_t v = gb_alt_begin(c);
    gb_alt_add(c, v, gb_callf(c, j->r_obj_any));
    gb_alt_add(c, v, gb_callf(c, arr));
    gb_alt_add(c, v, gb_callf(c, js_string_rule(j)));
    gb_alt_add(c, v, gb_callf(c, js_num_rule(j)));
    gb_alt_add(c, v, gb_lit(c, "true", 4));
    gb_alt_add(c, v, gb_lit(c, "false", 5));
    gb_alt_add(c, v, gb_lit(c, "null", 4));
    gb_rule_set(c, j->r_any, v);
    return j->r_any;
}

/* ---- Integer ranges -------------------------------------------------------------- */

/* The decimal strings of the same length n between a and b (digit strings,
 * leading zeros allowed inside). */
static gfrag_t
js_digits_fixed(gctx_t *c, const char *a, const char *b, size_t n)
{
    if (n == 0)
        return gb_empty(c);
    if (n == 1)
        return gb_range(c, (uint8_t)a[0], (uint8_t)b[0]);
    if (a[0] == b[0])
        return gb_seq(c, gb_lit(c, a, 1), js_digits_fixed(c, a + 1, b + 1, n - 1));
    char nines[24], zeros[24];
    memset(nines, '9', n);
    memset(zeros, '0', n);
    gfrag_t alt = gb_alt_begin(c);
    gb_alt_add(c, alt, gb_seq(c, gb_lit(c, a, 1), js_digits_fixed(c, a + 1, nines, n - 1)));
    if (b[0] - a[0] > 1) {
        gfrag_t mid = gb_range(c, (uint8_t)(a[0] + 1), (uint8_t)(b[0] - 1));
        gb_alt_add(c, alt, gb_seq(c, mid, js_digits_fixed(c, zeros, nines, n - 1)));
    }
    gb_alt_add(c, alt, gb_seq(c, gb_lit(c, b, 1), js_digits_fixed(c, zeros, b + 1, n - 1)));
    return alt;
}

/* The positive integers in [lo, hi] (hi 0: no upper bound), canonical. */
static void
js_pos_range(gctx_t *c, gfrag_t alt, uint64_t lo, uint64_t hi)
{
    char a[24], b[24];
    uint64_t p10 = 1;

    for (size_t d = 1; d <= 20 && c->st == TD_OK; d++, p10 = d <= 20 ? p10 * 10 : p10) {
        uint64_t dlo = p10, dhi = d == 20 ? UINT64_MAX : p10 * 10 - 1;
        if (hi != 0 && dlo > hi)
            break;
        if (dhi < lo)
            continue;
        uint64_t x = lo > dlo ? lo : dlo, y = hi != 0 && hi < dhi ? hi : dhi;
        if (hi == 0 && x == dlo) {   /* every number of d or more digits */
            gfrag_t f = gb_seq(c, gb_range(c, '1', '9'), gb_empty(c));
            for (size_t k = 1; k < d; k++)
                f = gb_seq(c, f, gb_range(c, '0', '9'));
            gb_alt_add(c, alt, gb_seq(c, f, gb_star(c, gb_range(c, '0', '9'))));
            return;
        }
        snprintf(a, sizeof a, "%llu", (unsigned long long)x);
        snprintf(b, sizeof b, "%llu", (unsigned long long)y);
        gb_alt_add(c, alt, js_digits_fixed(c, a, b, d));
        if (d == 20)
            break;
    }
}

/* Integers in [lo, hi] (has_lo / has_hi: bounded). */
static gfrag_t
js_int_range(js_t *j, bool has_lo, int64_t lo, bool has_hi, int64_t hi)
{
    gctx_t *c = j->c;
    gfrag_t alt = gb_alt_begin(c);

    if (has_lo && has_hi && lo > hi) {
        gctx_fail(c, TD_ERR_INVALID, "minimum is above maximum: no integer satisfies the bounds");
        return alt;
    }
    if ((!has_lo || lo <= 0) && (!has_hi || hi >= 0))
        gb_alt_add(c, alt, gb_lit(c, "0", 1));
    if (!has_hi || hi > 0)
        js_pos_range(c, alt, !has_lo || lo < 1 ? 1 : (uint64_t)lo, has_hi ? (uint64_t)hi : 0);
    if (!has_lo || lo < 0) {   /* -[n] for n in [max(1, -hi), -lo] */
        gfrag_t neg = gb_alt_begin(c);
        uint64_t nlo = !has_hi || hi > -1 ? 1 : (uint64_t)(-(hi + 1)) + 1;
        uint64_t nhi = has_lo ? (uint64_t)(-(lo + 1)) + 1 : 0;
        js_pos_range(c, neg, nlo, nhi);
        if (!has_hi || hi >= 0)   /* -0, as the unbounded integer rule has it */
            gb_alt_add(c, neg, gb_lit(c, "0", 1));
        gb_alt_add(c, alt, gb_seq(c, gb_lit(c, "-", 1), neg));
    }
    return alt;
}

/* The integer bounds of schema s: minimum / maximum and their exclusive
 * forms, made inclusive. */
static td_status_t
js_int_bounds(js_t *j, json_t *s, bool *has_lo, int64_t *lo, bool *has_hi, int64_t *hi)
{
    static const char *const keys[] = { "minimum", "exclusiveMinimum", "maximum",
                                        "exclusiveMaximum" };

    *has_lo = *has_hi = false;
    for (int k = 0; k < 4; k++) {
        json_t *v = json_object_get(s, keys[k]);
        if (v == NULL)
            continue;
        if (!json_is_number(v))
            return gctx_fail(j->c, TD_ERR_INVALID, "%s must be a number", keys[k]);
        double x = json_number_value(v);
        if (x < -9.2e18 || x > 9.2e18)
            return gctx_fail(j->c, TD_ERR_UNSUPPORTED, "%s beyond +-9.2e18 is not supported",
                             keys[k]);
        double b = k < 2 ? (k == 0 ? ceil(x) : floor(x) + 1) : (k == 2 ? floor(x) : ceil(x) - 1);
        if (k < 2 && (!*has_lo || (int64_t)b > *lo)) {
            *lo = (int64_t)b;
            *has_lo = true;
        }
        if (k >= 2 && (!*has_hi || (int64_t)b < *hi)) {
            *hi = (int64_t)b;
            *has_hi = true;
        }
    }
    return TD_OK;
}

/* ---- Strings --------------------------------------------------------------------- */

static const struct {
    const char *name, *re;
} js_formats[] = {
    { "date", "[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-"
              "(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-9]))" },
    { "time", "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?"
              "(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])" },
    { "date-time", "[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-"
                   "(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-9]))T"
                   "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?"
                   "(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])" },
    { "uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}" },
    { "email", "[a-zA-Z0-9_%+-]+(\\.[a-zA-Z0-9_%+-]+)*@[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?"
               "(\\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)+" },
    { "ipv4", "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}"
              "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])" },
};

static td_status_t
js_get_count(js_t *j, json_t *s, const char *key, uint32_t *out, bool *has)
{
    json_t *v = json_object_get(s, key);

    *has = v != NULL;
    if (v == NULL)
        return TD_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return gctx_fail(j->c, TD_ERR_INVALID, "%s must be a non-negative integer", key);
    if (json_integer_value(v) > 10000)
        return gctx_fail(j->c, TD_ERR_UNSUPPORTED, "%s over 10000 is not supported", key);
    *out = (uint32_t)json_integer_value(v);
    return TD_OK;
}

static gfrag_t
js_string(js_t *j, json_t *s)
{
    gctx_t *c = j->c;
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    uint32_t min = 0, max = UINT32_MAX;
    bool has_min, has_max;
    const char *re = NULL;

    if (js_get_count(j, s, "minLength", &min, &has_min) != TD_OK ||
        js_get_count(j, s, "maxLength", &max, &has_max) != TD_OK)
        return gb_empty(c);
    if (has_min && has_max && min > max) {
        gctx_fail(c, TD_ERR_INVALID, "minLength is above maxLength");
        return gb_empty(c);
    }
    if (pat != NULL && !json_is_string(pat)) {
        gctx_fail(c, TD_ERR_INVALID, "pattern must be a string");
        return gb_empty(c);
    }
    if (fmt != NULL) {
        for (size_t i = 0; i < sizeof js_formats / sizeof js_formats[0] && re == NULL; i++)
            if (json_is_string(fmt) && strcmp(json_string_value(fmt), js_formats[i].name) == 0)
                re = js_formats[i].re;
        if (re == NULL) {
            gctx_fail(c, TD_ERR_UNSUPPORTED, "format %s is not supported",
                      json_is_string(fmt) ? json_string_value(fmt) : "(not a string)");
            return gb_empty(c);
        }
    }
    if ((pat != NULL || re != NULL) && (has_min || has_max || (pat != NULL && re != NULL))) {
        gctx_fail(c, TD_ERR_UNSUPPORTED, "pattern or format together with minLength, "
                  "maxLength or each other is not supported");
        return gb_empty(c);
    }
    gfrag_t body;
    if (pat != NULL || re != NULL) {
        const char *p = pat != NULL ? json_string_value(pat) : re;
        size_t old = js_path_push(j, "", pat != NULL ? "pattern" : "format");
        body = gregex_build(c, p, pat != NULL ? json_string_length(pat) : strlen(re), true);
        js_path_pop(j, old);
    } else if (has_min || has_max) {
        uint32_t ch = gb_rule(c);
        gb_rule_set(c, ch, js_strchar(j));
        body = gb_repeat(c, ch, min, max);
    } else {
        return gb_callf(c, js_string_rule(j));
    }
    return gb_seq(c, gb_seq(c, gb_lit(c, "\"", 1), body), gb_lit(c, "\"", 1));
}

/* ---- Arrays ---------------------------------------------------------------------- */

/* prefixItems[i ..] then the items rule, as the elements after the first
 * i (a comma before each but the array's first). */
static gfrag_t
js_array_from(js_t *j, const uint32_t *pre, size_t npre, size_t i, uint32_t item, uint32_t min,
              uint32_t max)
{
    gctx_t *c = j->c;
    gfrag_t alt = gb_alt_begin(c);

    if (i >= min)
        gb_alt_add(c, alt, gb_empty(c));
    if (max != UINT32_MAX && i >= max)
        return alt;
    if (i < npre) {
        gfrag_t e = gb_callf(c, pre[i]);
        if (i > 0)
            e = gb_seq(c, gb_lit(c, ",", 1), e);
        gb_alt_add(c, alt, gb_seq(c, e, js_array_from(j, pre, npre, i + 1, item, min, max)));
        return alt;
    }
    if (item == UINT32_MAX)
        return alt;
    /* i or more from items: the rest as repetitions */
    uint32_t rmin = min > i ? min - (uint32_t)i : 0;
    uint32_t rmax = max == UINT32_MAX ? UINT32_MAX : max - (uint32_t)i;
    if (i == 0)
        return gb_repeat_sep(c, item, js_comma, rmin, rmax);
    uint32_t ci = gb_rule(c);
    gb_rule_set(c, ci, gb_seq(c, gb_lit(c, ",", 1), gb_callf(c, item)));
    gfrag_t rep = gb_repeat(c, ci, rmin, rmax);
    gb_alt_add(c, alt, rep);
    return alt;
}

static gfrag_t
js_array(js_t *j, json_t *s)
{
    gctx_t *c = j->c;
    json_t *items = json_object_get(s, "items"), *pre = json_object_get(s, "prefixItems");
    uint32_t min = 0, max = UINT32_MAX, item = UINT32_MAX, rules[256];
    bool has_min, has_max;
    size_t npre = 0, old;

    if (js_get_count(j, s, "minItems", &min, &has_min) != TD_OK ||
        js_get_count(j, s, "maxItems", &max, &has_max) != TD_OK)
        return gb_empty(c);
    if (has_min && has_max && min > max) {
        gctx_fail(c, TD_ERR_INVALID, "minItems is above maxItems");
        return gb_empty(c);
    }
    if (pre != NULL) {
        if (!json_is_array(pre) || json_array_size(pre) > 256) {
            gctx_fail(c, TD_ERR_INVALID, "prefixItems must be an array of at most 256 schemas");
            return gb_empty(c);
        }
        npre = json_array_size(pre);
        for (size_t i = 0; i < npre && c->st == TD_OK; i++) {
            char seg[48];
            snprintf(seg, sizeof seg, "prefixItems[%zu]", i);
            old = js_path_push(j, "", seg);
            rules[i] = js_schema(j, json_array_get(pre, i));
            js_path_pop(j, old);
        }
    }
    if (items == NULL || json_is_true(items)) {
        item = js_any_rule(j);
    } else if (!json_is_false(items)) {
        old = js_path_push(j, "", "items");
        item = js_schema(j, items);
        js_path_pop(j, old);
    }
    if (item == UINT32_MAX && min > npre) {
        gctx_fail(c, TD_ERR_INVALID, "minItems needs more items than prefixItems allows");
        return gb_empty(c);
    }
    gfrag_t f = js_array_from(j, rules, npre, 0, item, min, max);
    return gb_seq(c, gb_seq(c, gb_lit(c, "[", 1), f), gb_lit(c, "]", 1));
}

/* ---- Objects --------------------------------------------------------------------- */

/* The rest of a key after the prefix keys[lo..hi) share (plen bytes), then
 * its closing quote, for any key but those: a trie of the declared keys
 * where leaving it by any other character leads to any string. */
static gfrag_t
js_key_rest(js_t *j, const char *const *keys, size_t lo, size_t hi, size_t plen, uint32_t free)
{
    gctx_t *c = j->c;
    gfrag_t alt = gb_alt_begin(c);
    bool next[128] = { false }, whole = false;

    for (size_t k = lo; k < hi; k++) {
        if (keys[k][plen] == '\0')
            whole = true;
        else
            next[(uint8_t)keys[k][plen]] = true;
    }
    if (!whole)
        gb_alt_add(c, alt, gb_lit(c, "\"", 1));
    for (size_t k = lo; k < hi && c->st == TD_OK;) {
        uint8_t b = (uint8_t)keys[k][plen];
        size_t e = k + 1;
        while (e < hi && (uint8_t)keys[e][plen] == b)
            e++;
        if (b != 0)
            gb_alt_add(c, alt, gb_seq(c, gb_range(c, b, b),
                                      js_key_rest(j, keys, k, e, plen + 1, free)));
        k = e;
    }
    gb_alt_add(c, alt, gb_seq(c, js_strchar_but(j, next), gb_callf(c, free)));
    return alt;
}

static int
str_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* An additional property: a key other than the declared ones, ':' and a
 * value of the additional schema (rule val). */
static uint32_t
js_extra_rule(js_t *j, const char **keys, size_t n, uint32_t val)
{
    gctx_t *c = j->c;
    uint32_t free = gb_rule(c), r = gb_rule(c);

    for (size_t k = 0; k < n; k++)
        for (const char *p = keys[k]; *p; p++)
            if ((uint8_t)*p < 0x20 || (uint8_t)*p >= 0x80 || *p == '"' || *p == '\\') {
                gctx_fail(c, TD_ERR_UNSUPPORTED, "additional properties beside a property "
                          "whose name is not plain ASCII are not supported");
                return r;
            }
    qsort(keys, n, sizeof(*keys), str_cmp);
    gb_rule_set(c, free, gb_seq(c, gb_star(c, js_strchar(j)), gb_lit(c, "\"", 1)));
    gfrag_t key = gb_seq(c, gb_lit(c, "\"", 1), js_key_rest(j, keys, 0, n, 0, free));
    gb_rule_set(c, r, gb_seq(c, gb_seq(c, key, gb_lit(c, ":", 1)), gb_callf(c, val)));
    return r;
}

typedef struct {
    const char *key;
    uint32_t val;        /* the value's rule */
    bool required;
} js_prop_t;

/* "key": value, as its literal key and the value's rule. */
static gfrag_t
js_kv(js_t *j, const js_prop_t *p)
{
    gctx_t *c = j->c;
    json_t *k = json_string(p->key);
    char *lit = k != NULL ? json_dumps(k, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    gfrag_t f;

    json_decref(k);
    if (lit == NULL) {
        gctx_fail(c, TD_ERR_NOMEM, "out of memory");
        return gb_empty(c);
    }
    f = gb_seq(c, gb_lit(c, lit, strlen(lit)), gb_lit(c, ":", 1));
    free(lit);
    return gb_seq(c, f, gb_callf(c, p->val));
}

/* The members in schema order, optional ones skippable, extras (rule
 * extra, UINT32_MAX: none) after them: a[i] follows something already
 * written (a comma first), b[i] nothing yet. */
static gfrag_t
js_members(js_t *j, const js_prop_t *p, size_t n, uint32_t extra)
{
    gctx_t *c = j->c;
    uint32_t *a = malloc((n + 1) * sizeof(uint32_t)), *b = malloc((n + 1) * sizeof(uint32_t));

    if (a == NULL || b == NULL) {
        free(a);
        free(b);
        gctx_fail(c, TD_ERR_NOMEM, "out of memory");
        return gb_empty(c);
    }
    for (size_t i = 0; i <= n; i++) {
        a[i] = gb_rule(c);
        b[i] = gb_rule(c);
    }
    if (extra == UINT32_MAX) {
        gb_rule_set(c, a[n], gb_empty(c));
        gb_rule_set(c, b[n], gb_empty(c));
    } else {
        gb_rule_set(c, a[n], gb_star(c, gb_seq(c, gb_lit(c, ",", 1), gb_callf(c, extra))));
        gb_rule_set(c, b[n], gb_repeat_sep(c, extra, js_comma, 0, UINT32_MAX));
    }
    for (size_t i = n; i-- > 0 && c->st == TD_OK;) {
        gfrag_t an = gb_seq(c, gb_seq(c, gb_lit(c, ",", 1), js_kv(j, &p[i])), gb_callf(c, a[i + 1]));
        gfrag_t bn = gb_seq(c, js_kv(j, &p[i]), gb_callf(c, a[i + 1]));
        if (!p[i].required) {
            gfrag_t aa = gb_alt_begin(c), ba = gb_alt_begin(c);
            gb_alt_add(c, aa, an);
            gb_alt_add(c, aa, gb_callf(c, a[i + 1]));
            gb_alt_add(c, ba, bn);
            gb_alt_add(c, ba, gb_callf(c, b[i + 1]));
            an = aa;
            bn = ba;
        }
        gb_rule_set(c, a[i], an);
        gb_rule_set(c, b[i], bn);
    }
    gfrag_t f = gb_callf(c, b[0]);
    free(a);
    free(b);
    return f;
}

static gfrag_t
js_object(js_t *j, json_t *s)
{
    gctx_t *c = j->c;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *add = json_object_get(s, "additionalProperties");
    size_t n = props != NULL ? json_object_size(props) : 0, i = 0, old;
    js_prop_t *p = calloc(n + 1, sizeof(*p));
    const char **keys = calloc(n + 1, sizeof(*keys));
    uint32_t extra = UINT32_MAX;
    const char *k;
    json_t *v;
    gfrag_t f = gb_empty(c);

    if (p == NULL || keys == NULL) {
        gctx_fail(c, TD_ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((props != NULL && !json_is_object(props)) || (req != NULL && !json_is_array(req))) {
        gctx_fail(c, TD_ERR_INVALID, "properties must be an object and required an array");
        goto out;
    }
    json_object_foreach(props, k, v) {
        old = js_path_push(j, "properties.", k);
        p[i].key = keys[i] = k;
        p[i].val = js_schema(j, v);
        js_path_pop(j, old);
        i++;
    }
    for (size_t r = 0; r < json_array_size(req); r++) {
        json_t *rv = json_array_get(req, r);
        size_t q = 0;
        while (q < n && json_is_string(rv) && strcmp(p[q].key, json_string_value(rv)) != 0)
            q++;
        if (q == n) {
            gctx_fail(c, TD_ERR_UNSUPPORTED, "required names %s, which is not in properties",
                      json_is_string(rv) ? json_string_value(rv) : "a non-string");
            goto out;
        }
        p[q].required = true;
    }
    if (add == NULL ? !j->strict : !json_is_false(add)) {
        uint32_t val = js_any_rule(j);
        if (add != NULL && !json_is_true(add)) {
            old = js_path_push(j, "", "additionalProperties");
            val = js_schema(j, add);
            js_path_pop(j, old);
        }
        extra = js_extra_rule(j, keys, n, val);
    }
    f = gb_seq(c, gb_seq(c, gb_lit(c, "{", 1), js_members(j, p, n, extra)), gb_lit(c, "}", 1));
out:
    free(p);
    free(keys);
    return f;
}

/* ---- Schemas --------------------------------------------------------------------- */

static const char *const js_ignored[] = {   /* annotations: no effect on the output */
    "title", "description", "$schema", "$id", "$comment", "examples", "default",
    "deprecated", "readOnly", "writeOnly", "$defs", "definitions", NULL };
static const char *const js_applied[] = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum",
    "const", "anyOf", "oneOf", "allOf", "$ref", "minItems", "maxItems", "minLength",
    "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", NULL };

static bool
in_list(const char *const *l, const char *k)
{
    for (; *l != NULL; l++)
        if (strcmp(*l, k) == 0)
            return true;
    return false;
}

/* A value's exact serialisation (const, enum). */
static gfrag_t
js_literal(js_t *j, json_t *v)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    gfrag_t f;

    if (s == NULL) {
        gctx_fail(j->c, TD_ERR_NOMEM, "out of memory");
        return gb_empty(j->c);
    }
    f = gb_lit(j->c, s, strlen(s));
    free(s);
    return f;
}

/* Schema s restricted to one type. */
static gfrag_t
js_typed(js_t *j, json_t *s, const char *t)
{
    gctx_t *c = j->c;

    if (strcmp(t, "object") == 0)
        return js_object(j, s);
    if (strcmp(t, "array") == 0)
        return js_array(j, s);
    if (strcmp(t, "string") == 0)
        return js_string(j, s);
    if (strcmp(t, "boolean") == 0) {
        gfrag_t a = gb_alt_begin(c);
        gb_alt_add(c, a, gb_lit(c, "true", 4));
        gb_alt_add(c, a, gb_lit(c, "false", 5));
        return a;
    }
    if (strcmp(t, "null") == 0)
        return gb_lit(c, "null", 4);
    bool has_lo, has_hi;
    int64_t lo = 0, hi = 0;
    bool bounded = json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
                   json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum");
    if (strcmp(t, "integer") == 0) {
        if (!bounded)
            return gb_callf(c, js_int_rule(j));
        if (js_int_bounds(j, s, &has_lo, &lo, &has_hi, &hi) != TD_OK)
            return gb_empty(c);
        return js_int_range(j, has_lo, lo, has_hi, hi);
    }
    if (strcmp(t, "number") == 0) {
        if (bounded)
            gctx_fail(c, TD_ERR_UNSUPPORTED, "minimum and maximum on a number are not "
                      "supported (they are on an integer)");
        return gb_callf(c, js_num_rule(j));
    }
    gctx_fail(c, TD_ERR_INVALID, "type %s is not a JSON Schema type", t);
    return gb_empty(c);
}

/* The type a schema without "type" has from its keywords; NULL: any. */
static const char *
js_implied_type(json_t *s)
{
    static const struct {
        const char *key, *type;
    } kw[] = { { "properties", "object" }, { "additionalProperties", "object" },
               { "required", "object" }, { "items", "array" }, { "prefixItems", "array" },
               { "minItems", "array" }, { "maxItems", "array" }, { "pattern", "string" },
               { "format", "string" }, { "minLength", "string" }, { "maxLength", "string" },
               { "minimum", "number" }, { "maximum", "number" },
               { "exclusiveMinimum", "number" }, { "exclusiveMaximum", "number" } };
    for (size_t i = 0; i < sizeof kw / sizeof kw[0]; i++)
        if (json_object_get(s, kw[i].key) != NULL)
            return kw[i].type;
    return NULL;
}

/* "#", "#/$defs/x", "#/definitions/x" or any JSON pointer in the document. */
static json_t *
js_resolve(js_t *j, const char *ref)
{
    json_t *cur = j->root;
    char seg[256];

    if (ref[0] != '#')
        return NULL;
    for (const char *p = ref + 1; *p == '/' && cur != NULL;) {
        size_t n = 0;
        for (p++; *p && *p != '/' && n + 1 < sizeof seg; p++) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
                seg[n++] = p[1] == '0' ? '~' : '/';
                p++;
            } else {
                seg[n++] = *p;
            }
        }
        seg[n] = '\0';
        if (json_is_array(cur)) {
            char *end;
            unsigned long ix = strtoul(seg, &end, 10);
            cur = *end == '\0' ? json_array_get(cur, ix) : NULL;
        } else {
            cur = json_object_get(cur, seg);
        }
        if (*p != '\0' && *p != '/')
            return NULL;
    }
    return cur;
}

/* anyOf / oneOf / enum: alternatives. */
static gfrag_t
js_alternatives(js_t *j, json_t *s, const char *key)
{
    gctx_t *c = j->c;
    json_t *l = json_object_get(s, key);
    gfrag_t alt = gb_alt_begin(c);

    if (!json_is_array(l) || json_array_size(l) == 0) {
        gctx_fail(c, TD_ERR_INVALID, "%s must be a non-empty array", key);
        return alt;
    }
    for (size_t i = 0; i < json_array_size(l) && c->st == TD_OK; i++) {
        char seg[64];
        snprintf(seg, sizeof seg, "%s[%zu]", key, i);
        size_t old = js_path_push(j, "", seg);
        if (strcmp(key, "enum") == 0)
            gb_alt_add(c, alt, js_literal(j, json_array_get(l, i)));
        else
            gb_alt_add(c, alt, gb_callf(c, js_schema(j, json_array_get(l, i))));
        js_path_pop(j, old);
    }
    return alt;
}

/* Whether s has a keyword besides the annotations and those of keep. */
static const char *
js_other_keyword(json_t *s, const char *const *keep)
{
    const char *k;
    json_t *v;

    json_object_foreach(s, k, v) {
        if (!in_list(js_ignored, k) && !in_list(keep, k))
            return k;
    }
    return NULL;
}

/* An object schema's fragment. */
static gfrag_t
js_body(js_t *j, json_t *s)
{
    gctx_t *c = j->c;
    static const char *const none[] = { NULL };
    const char *k, *other;
    json_t *v;

    json_object_foreach(s, k, v) {
        if (!in_list(js_ignored, k) && !in_list(js_applied, k)) {
            size_t old = js_path_push(j, "", k);
            gctx_fail(c, TD_ERR_UNSUPPORTED, "%s is not supported", k);
            js_path_pop(j, old);
            return gb_empty(c);
        }
    }
    static const char *const comb[] = { "$ref", "anyOf", "oneOf", "allOf", "const", "enum", NULL };
    for (const char *const *cw = comb; *cw != NULL; cw++) {
        if (json_object_get(s, *cw) == NULL)
            continue;
        const char *keep[] = { *cw, strcmp(*cw, "const") && strcmp(*cw, "enum") ? NULL : "type",
                               NULL };
        if ((other = js_other_keyword(s, keep)) != NULL) {
            gctx_fail(c, TD_ERR_UNSUPPORTED, "%s together with %s is not supported", *cw, other);
            return gb_empty(c);
        }
        v = json_object_get(s, *cw);
        if (strcmp(*cw, "$ref") == 0) {
            json_t *t = json_is_string(v) ? js_resolve(j, json_string_value(v)) : NULL;
            if (t == NULL) {
                gctx_fail(c, TD_ERR_UNSUPPORTED, "$ref %s does not name a part of this schema",
                          json_is_string(v) ? json_string_value(v) : "(not a string)");
                return gb_empty(c);
            }
            return gb_callf(c, js_schema(j, t));
        }
        if (strcmp(*cw, "const") == 0)
            return js_literal(j, v);
        if (strcmp(*cw, "allOf") == 0) {
            if (!json_is_array(v) || json_array_size(v) != 1) {
                gctx_fail(c, TD_ERR_UNSUPPORTED, "allOf with other than one schema is not "
                          "supported");
                return gb_empty(c);
            }
            size_t old = js_path_push(j, "", "allOf[0]");
            uint32_t r = js_schema(j, json_array_get(v, 0));
            js_path_pop(j, old);
            return gb_callf(c, r);
        }
        return js_alternatives(j, s, *cw);
    }
    (void)none;
    json_t *t = json_object_get(s, "type");
    if (t == NULL) {
        const char *it = js_implied_type(s);
        return it != NULL ? js_typed(j, s, it) : gb_callf(c, js_any_rule(j));
    }
    if (json_is_string(t))
        return js_typed(j, s, json_string_value(t));
    if (!json_is_array(t) || json_array_size(t) == 0) {
        gctx_fail(c, TD_ERR_INVALID, "type must be a string or a non-empty array of strings");
        return gb_empty(c);
    }
    gfrag_t alt = gb_alt_begin(c);
    for (size_t i = 0; i < json_array_size(t) && c->st == TD_OK; i++) {
        json_t *ti = json_array_get(t, i);
        if (!json_is_string(ti)) {
            gctx_fail(c, TD_ERR_INVALID, "type must be a string or an array of strings");
            break;
        }
        gb_alt_add(c, alt, js_typed(j, s, json_string_value(ti)));
    }
    return alt;
}

static uint32_t
js_schema(js_t *j, json_t *s)
{
    gctx_t *c = j->c;
    uint64_t r = td_hmap_get(j->memo, (uint64_t)(uintptr_t)s);

    if (r != TD_HMAP_NONE)
        return (uint32_t)r;
    if (c->st != TD_OK || gctx_tick(c) != TD_OK)
        return 0;
    if (json_is_true(s))
        return js_any_rule(j);
    if (!json_is_object(s)) {
        gctx_fail(c, json_is_false(s) ? TD_ERR_INVALID : TD_ERR_INVALID,
                  json_is_false(s) ? "the schema false matches nothing"
                                   : "a schema must be an object or a boolean");
        return 0;
    }
    if (++j->depth > 200) {
        gctx_fail(c, TD_ERR_UNSUPPORTED, "the schema is nested deeper than 200 levels");
        return 0;
    }
    uint32_t rule = gb_rule(c);
    if (td_hmap_put(j->memo, (uint64_t)(uintptr_t)s, rule) != TD_OK) {
        gctx_fail(c, TD_ERR_NOMEM, "out of memory");
        return 0;
    }
    gb_rule_set(c, rule, js_body(j, s));
    j->depth--;
    return rule;
}

td_status_t
gjson_build(gctx_t *c, const char *spec, size_t len, bool object_only)
{
    js_t j = { .c = c, .strict = c->opts->strict };
    json_error_t je;
    td_status_t st;

    if ((st = td_hmap_create(64, &j.memo)) != TD_OK)
        return gctx_fail(c, st, "out of memory");
    if (object_only) {
        js_any_rule(&j);
        c->g->root = j.r_obj_any;
        goto out;
    }
    j.root = json_loadb(spec, len, JSON_DECODE_ANY, &je);
    if (j.root == NULL) {
        gctx_fail(c, TD_ERR_INVALID, "the schema is not JSON: %s at offset %d", je.text,
                  je.position);
        goto out;
    }
    c->g->root = js_schema(&j, j.root);
out:
    json_decref(j.root);
    td_hmap_destroy(j.memo);
    return c->st;
}

td_status_t
gchoice_build(gctx_t *c, const char *spec, size_t len)
{
    json_t *l = json_loadb(spec, len, 0, NULL);
    uint32_t r = gb_rule(c);
    gfrag_t alt = gb_alt_begin(c);

    c->g->root = r;
    if (!json_is_array(l) || json_array_size(l) == 0) {
        json_decref(l);
        return gctx_fail(c, TD_ERR_INVALID, "a choice is a non-empty array of strings");
    }
    for (size_t i = 0; i < json_array_size(l); i++) {
        json_t *s = json_array_get(l, i);
        if (!json_is_string(s)) {
            snprintf(c->path, sizeof c->path, "[%zu]", i);
            gctx_fail(c, TD_ERR_INVALID, "a choice must be a string");
            break;
        }
        gb_alt_add(c, alt, gb_lit(c, json_string_value(s), json_string_length(s)));
    }
    gb_rule_set(c, r, alt);
    json_decref(l);
    return c->st;
}
