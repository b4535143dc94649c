/* base/config.c — the option table engine: one parser per type, one setter
 * that defaults, config files, flags and the admin view all go through, and
 * one formatter that writes values back in the syntax the parser reads. */
#include "config.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>

/* ---- Values, units and messages ---------------------------------------- */

/* A parsed value, before it is stored; s points into the caller's text. */
typedef union {
    bool b;
    int64_t i;
    uint64_t u;
    double d;
    int e;          /* ENUM and LOG_LEVEL: index of the choice */
    const char *s;
} config_value_t;

typedef struct {
    const char *suffix;
    uint64_t scale;
} config_unit_t;

/* Accepted suffixes (case-insensitive); of those with the same scale, the
 * last one listed is the one printed. */
static const config_unit_t config_size_units[] = {
    { "", 1 },
    { "k", 1ull << 10 }, { "KiB", 1ull << 10 },
    { "m", 1ull << 20 }, { "MiB", 1ull << 20 },
    { "g", 1ull << 30 }, { "GiB", 1ull << 30 },
    { "t", 1ull << 40 }, { "TiB", 1ull << 40 },
    { NULL, 0 },
};
static const config_unit_t config_duration_units[] = {
    { "", 1 }, { "ms", 1 }, { "s", 1000 }, { "m", 60 * 1000 }, { "h", 3600 * 1000 },
    { NULL, 0 },
};
static const config_unit_t config_plain_units[] = { { "", 1 }, { NULL, 0 } };

static const struct {
    const char *word; /* placeholder in --help: --name=WORD */
    const char *kind; /* what a value must look like, for messages */
} config_types[] = {
    [TD_CONFIG_BOOL]      = { "BOOL", "true/false, yes/no, on/off or 1/0" },
    [TD_CONFIG_INT64]     = { "INT", "an integer" },
    [TD_CONFIG_UINT64]    = { "UINT", "a non-negative integer" },
    [TD_CONFIG_DOUBLE]    = { "NUM", "a finite number" },
    [TD_CONFIG_STRING]    = { "STR", "a string" },
    [TD_CONFIG_SIZE]      = { "SIZE", "a size (bytes, or with a suffix k/KiB, "
                                      "m/MiB, g/GiB, t/TiB)" },
    [TD_CONFIG_DURATION]  = { "DURATION", "a duration (milliseconds, or with a "
                                          "suffix ms, s, m, h)" },
    [TD_CONFIG_ENUM]      = { "CHOICE", "one of" },
    [TD_CONFIG_LOG_LEVEL] = { "LEVEL", "one of" },
};

static const struct {
    const char *name;
    bool value;
} config_bool_words[] = {
    { "true", true }, { "false", false }, { "yes", true }, { "no", false },
    { "on", true },   { "off", false },   { "1", true },   { "0", false },
};

/* Appends to a fixed buffer, snprintf-style: n counts what was asked for, so a
 * caller learns the length it needs even when the text was cut. */
typedef struct {
    char *p;
    size_t cap;
    size_t n;
} config_buf_t;

__attribute__((format(printf, 2, 3)))
static void
config_buf_printf(config_buf_t *b, const char *fmt, ...)
{
    size_t room = b->n < b->cap ? b->cap - b->n : 0;
    va_list ap;

    va_start(ap, fmt);
    int w = vsnprintf(room ? b->p + b->n : NULL, room, fmt, ap);
    va_end(ap);
    if (w > 0)
        b->n += (size_t)w;
}

__attribute__((format(printf, 3, 4)))
static void
config_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static bool
config_valid_type(td_config_type_t type)
{
    return type >= TD_CONFIG_BOOL && type <= TD_CONFIG_LOG_LEVEL;
}

/* Name of choice i of an ENUM or LOG_LEVEL option, NULL past the end. */
static const char *
config_choice(const td_config_opt_t *opt, int i)
{
    if (i < 0)
        return NULL;
    if (opt->type == TD_CONFIG_LOG_LEVEL)
        return i <= TD_LOG_TRACE ? td_log_level_str((td_log_level_t)i) : NULL;
    if (opt->choices == NULL) /* a table bug: no value parses, defaults report it */
        return NULL;
    for (int k = 0; k < i; k++)
        if (opt->choices[k] == NULL)
            return NULL;
    return opt->choices[i];
}

static bool
config_bounded(const td_config_opt_t *opt)
{
    switch (opt->type) {
    case TD_CONFIG_INT64:
        return opt->min.i != 0 || opt->max.i != 0;
    case TD_CONFIG_UINT64:
    case TD_CONFIG_SIZE:
    case TD_CONFIG_DURATION:
        return opt->min.u != 0 || opt->max.u != 0;
    case TD_CONFIG_DOUBLE:
        return opt->min.d != 0 || opt->max.d != 0;
    default:
        return false;
    }
}

static bool
config_in_bounds(const td_config_opt_t *opt, const config_value_t *v)
{
    if (!config_bounded(opt))
        return true;
    switch (opt->type) {
    case TD_CONFIG_INT64:
        return v->i >= opt->min.i && v->i <= opt->max.i;
    case TD_CONFIG_DOUBLE:
        return v->d >= opt->min.d && v->d <= opt->max.d;
    default:
        return v->u >= opt->min.u && v->u <= opt->max.u;
    }
}

/* ---- Parsing ------------------------------------------------------------ */

/* Unsigned decimal with one of units' suffixes. A leading '-' on an
 * otherwise valid value, or a product past UINT64_MAX, is TD_ERR_RANGE. */
static td_status_t
config_parse_scaled(const char *s, const config_unit_t *units, uint64_t *out)
{
    bool negative = (*s == '-');
    const char *digits = negative ? s + 1 : s;
    char *end;

    if (!isdigit((unsigned char)*digits))
        return TD_ERR_INVALID;
    errno = 0;
    unsigned long long n = strtoull(digits, &end, 10);
    bool overflow = (errno == ERANGE);
    const config_unit_t *unit = units;
    while (unit->suffix != NULL && strcasecmp(end, unit->suffix) != 0)
        unit++;
    if (unit->suffix == NULL)
        return TD_ERR_INVALID;
    if (negative || overflow || n > UINT64_MAX / unit->scale)
        return TD_ERR_RANGE;
    *out = (uint64_t)n * unit->scale;
    return TD_OK;
}

static td_status_t
config_parse_int64(const char *s, int64_t *out)
{
    const char *digits = (*s == '-') ? s + 1 : s;
    char *end;

    if (!isdigit((unsigned char)*digits))
        return TD_ERR_INVALID;
    errno = 0;
    long long n = strtoll(s, &end, 10);
    if (*end != '\0')
        return TD_ERR_INVALID;
    if (errno == ERANGE)
        return TD_ERR_RANGE;
    *out = n;
    return TD_OK;
}

static td_status_t
config_parse_double(const char *s, double *out)
{
    const char *digits = (*s == '-') ? s + 1 : s;
    char *end;

    /* strtod also takes "inf", "nan" and leading blanks: refuse them here */
    if (!isdigit((unsigned char)*digits) &&
        !(*digits == '.' && isdigit((unsigned char)digits[1])))
        return TD_ERR_INVALID;
    double d = strtod(s, &end);
    if (*end != '\0')
        return TD_ERR_INVALID;
    if (!isfinite(d))
        return TD_ERR_RANGE;
    *out = d;
    return TD_OK;
}

static td_status_t
config_parse_value(const td_config_opt_t *opt, const char *s, config_value_t *v)
{
    switch (opt->type) {
    case TD_CONFIG_BOOL:
        for (size_t i = 0; i < sizeof(config_bool_words) / sizeof(config_bool_words[0]); i++) {
            if (strcasecmp(s, config_bool_words[i].name) == 0) {
                v->b = config_bool_words[i].value;
                return TD_OK;
            }
        }
        return TD_ERR_INVALID;
    case TD_CONFIG_INT64:
        return config_parse_int64(s, &v->i);
    case TD_CONFIG_UINT64:
        return config_parse_scaled(s, config_plain_units, &v->u);
    case TD_CONFIG_DOUBLE:
        return config_parse_double(s, &v->d);
    case TD_CONFIG_STRING:
        v->s = s;
        return TD_OK;
    case TD_CONFIG_SIZE:
        return config_parse_scaled(s, config_size_units, &v->u);
    case TD_CONFIG_DURATION:
        return config_parse_scaled(s, config_duration_units, &v->u);
    case TD_CONFIG_ENUM:
    case TD_CONFIG_LOG_LEVEL:
        for (int i = 0; config_choice(opt, i) != NULL; i++) {
            if (strcasecmp(s, config_choice(opt, i)) == 0) {
                v->e = i;
                return TD_OK;
            }
        }
        return TD_ERR_INVALID;
    }
    return TD_ERR_INTERNAL;
}

/* ---- The struct's fields ------------------------------------------------ */

static void
config_load(const td_config_opt_t *opt, const void *cfg, config_value_t *v)
{
    const void *f = (const char *)cfg + opt->offset;

    switch (opt->type) {
    case TD_CONFIG_BOOL:      v->b = *(const bool *)f; break;
    case TD_CONFIG_INT64:     v->i = *(const int64_t *)f; break;
    case TD_CONFIG_DOUBLE:    v->d = *(const double *)f; break;
    case TD_CONFIG_STRING:    v->s = *(char *const *)f; break;
    case TD_CONFIG_ENUM:      v->e = *(const int *)f; break;
    case TD_CONFIG_LOG_LEVEL: v->e = (int)*(const td_log_level_t *)f; break;
    case TD_CONFIG_UINT64:
    case TD_CONFIG_SIZE:
    case TD_CONFIG_DURATION:  v->u = *(const uint64_t *)f; break;
    }
}

static td_status_t
config_store(const td_config_opt_t *opt, void *cfg, const config_value_t *v)
{
    void *f = (char *)cfg + opt->offset;

    switch (opt->type) {
    case TD_CONFIG_BOOL:      *(bool *)f = v->b; break;
    case TD_CONFIG_INT64:     *(int64_t *)f = v->i; break;
    case TD_CONFIG_DOUBLE:    *(double *)f = v->d; break;
    case TD_CONFIG_ENUM:      *(int *)f = v->e; break;
    case TD_CONFIG_LOG_LEVEL: *(td_log_level_t *)f = (td_log_level_t)v->e; break;
    case TD_CONFIG_UINT64:
    case TD_CONFIG_SIZE:
    case TD_CONFIG_DURATION:  *(uint64_t *)f = v->u; break;
    case TD_CONFIG_STRING: {
        char *copy = strdup(v->s);
        if (copy == NULL)
            return TD_ERR_NOMEM;
        free(*(char **)f);
        *(char **)f = copy;
        break;
    }
    }
    return TD_OK;
}

/* ---- Formatting --------------------------------------------------------- */

static void
config_format_scaled(config_buf_t *b, uint64_t v, const config_unit_t *units)
{
    const config_unit_t *best = units; /* units[0] has scale 1 */

    for (const config_unit_t *u = units; u->suffix != NULL; u++) {
        bool divides = (v == 0) ? u->scale == 1 : v % u->scale == 0;
        if (divides && u->scale >= best->scale)
            best = u;
    }
    config_buf_printf(b, "%" PRIu64 "%s", v / best->scale, best->suffix);
}

/* The shortest text that reads back to the same double. */
static void
config_format_double(config_buf_t *b, double d)
{
    char text[32];

    if (d == trunc(d) && fabs(d) < 1e15) {
        config_buf_printf(b, "%.0f", d);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(text, sizeof(text), "%.*g", prec, d);
        if (strtod(text, NULL) == d)
            break;
    }
    config_buf_printf(b, "%s", text);
}

static void
config_format_string(config_buf_t *b, const char *s)
{
    config_buf_printf(b, "\"");
    for (; s != NULL && *s != '\0'; s++) {
        switch (*s) {
        case '"':  config_buf_printf(b, "\\\""); break;
        case '\\': config_buf_printf(b, "\\\\"); break;
        case '\n': config_buf_printf(b, "\\n"); break;
        case '\t': config_buf_printf(b, "\\t"); break;
        default:   config_buf_printf(b, "%c", *s); break;
        }
    }
    config_buf_printf(b, "\"");
}

static void
config_format_value(const td_config_opt_t *opt, const config_value_t *v, config_buf_t *b)
{
    switch (opt->type) {
    case TD_CONFIG_BOOL:     config_buf_printf(b, "%s", v->b ? "true" : "false"); break;
    case TD_CONFIG_INT64:    config_buf_printf(b, "%" PRId64, v->i); break;
    case TD_CONFIG_UINT64:   config_buf_printf(b, "%" PRIu64, v->u); break;
    case TD_CONFIG_DOUBLE:   config_format_double(b, v->d); break;
    case TD_CONFIG_STRING:   config_format_string(b, v->s); break;
    case TD_CONFIG_SIZE:     config_format_scaled(b, v->u, config_size_units); break;
    case TD_CONFIG_DURATION: config_format_scaled(b, v->u, config_duration_units); break;
    case TD_CONFIG_ENUM:
    case TD_CONFIG_LOG_LEVEL: {
        const char *name = config_choice(opt, v->e);
        /* a value set behind the table's back: visible, and refused on reload */
        if (name != NULL)
            config_buf_printf(b, "%s", name);
        else
            config_buf_printf(b, "%d", v->e);
        break;
    }
    }
}

static config_value_t
config_bound_value(const td_config_opt_t *opt, const td_config_bound_t *bound)
{
    config_value_t v;

    switch (opt->type) {
    case TD_CONFIG_INT64:  v.i = bound->i; break;
    case TD_CONFIG_DOUBLE: v.d = bound->d; break;
    default:               v.u = bound->u; break;
    }
    return v;
}

/* What a value of opt must look like: "a non-negative integer in [1, 65535]",
 * "one of fifo, lru, random". */
static void
config_describe(const td_config_opt_t *opt, config_buf_t *b)
{
    config_buf_printf(b, "%s", config_types[opt->type].kind);
    if (opt->type == TD_CONFIG_ENUM || opt->type == TD_CONFIG_LOG_LEVEL) {
        for (int i = 0; config_choice(opt, i) != NULL; i++)
            config_buf_printf(b, "%s%s", i ? ", " : " ", config_choice(opt, i));
    } else if (config_bounded(opt)) {
        config_value_t lo = config_bound_value(opt, &opt->min);
        config_value_t hi = config_bound_value(opt, &opt->max);
        config_buf_printf(b, " in [");
        config_format_value(opt, &lo, b);
        config_buf_printf(b, ", ");
        config_format_value(opt, &hi, b);
        config_buf_printf(b, "]");
    }
}

size_t
td_config_format(const td_config_opt_t *opt, const void *cfg, char *buf, size_t len)
{
    config_buf_t b = { .p = buf, .cap = len, .n = 0 };
    config_value_t v;

    if (len > 0)
        buf[0] = '\0';
    config_load(opt, cfg, &v);
    config_format_value(opt, &v, &b);
    return b.n;
}

/* ---- Setting ------------------------------------------------------------ */

static const td_config_opt_t *
config_find_n(const td_config_opt_t *table, const char *name, size_t len)
{
    for (const td_config_opt_t *o = table; o->name != NULL; o++)
        if (strncmp(o->name, name, len) == 0 && o->name[len] == '\0')
            return o;
    return NULL;
}

const td_config_opt_t *
td_config_find(const td_config_opt_t *table, const char *name)
{
    return config_find_n(table, name, strlen(name));
}

static td_status_t
config_opt_set(const td_config_opt_t *opt, void *cfg, const char *value, char *err,
               size_t errlen)
{
    config_value_t v;
    td_status_t st;

    if (!config_valid_type(opt->type)) {
        config_err(err, errlen, "%s: bad option type %d in table", opt->name, (int)opt->type);
        return TD_ERR_INTERNAL;
    }
    st = config_parse_value(opt, value, &v);
    if (st == TD_OK && !config_in_bounds(opt, &v))
        st = TD_ERR_RANGE;
    if (st != TD_OK) {
        char want[256];
        config_buf_t b = { .p = want, .cap = sizeof(want), .n = 0 };
        config_describe(opt, &b);
        config_err(err, errlen, "%s: %s \"%s\": expected %s", opt->name,
                   st == TD_ERR_RANGE ? "value out of range" : "invalid value", value, want);
        return st;
    }
    st = config_store(opt, cfg, &v);
    if (st != TD_OK)
        config_err(err, errlen, "%s: out of memory", opt->name);
    return st;
}

td_status_t
td_config_set(const td_config_opt_t *table, void *cfg, const char *name, const char *value,
              char *err, size_t errlen)
{
    const td_config_opt_t *opt = td_config_find(table, name);

    if (opt == NULL) {
        config_err(err, errlen, "unknown option \"%s\"", name);
        return TD_ERR_INVALID;
    }
    return config_opt_set(opt, cfg, value, err, errlen);
}

/* One value parsed and stored as an option of a table of one would be. */
static td_status_t
config_parse_one(const char *name, td_config_type_t type, td_config_bound_t min,
                 td_config_bound_t max, const char *s, void *out, char *err, size_t errlen)
{
    const td_config_opt_t opt = { .name = name, .type = type, .min = min, .max = max };

    return config_opt_set(&opt, out, s, err, errlen);
}

td_status_t
td_config_parse_uint(const char *name, const char *s, uint64_t min, uint64_t max,
                     uint64_t *out, char *err, size_t errlen)
{
    return config_parse_one(name, TD_CONFIG_UINT64, (td_config_bound_t){ .u = min },
                            (td_config_bound_t){ .u = max }, s, out, err, errlen);
}

td_status_t
td_config_parse_size(const char *name, const char *s, uint64_t min, uint64_t max,
                     uint64_t *out, char *err, size_t errlen)
{
    return config_parse_one(name, TD_CONFIG_SIZE, (td_config_bound_t){ .u = min },
                            (td_config_bound_t){ .u = max }, s, out, err, errlen);
}

td_status_t
td_config_parse_double(const char *name, const char *s, double min, double max,
                       double *out, char *err, size_t errlen)
{
    return config_parse_one(name, TD_CONFIG_DOUBLE, (td_config_bound_t){ .d = min },
                            (td_config_bound_t){ .d = max }, s, out, err, errlen);
}

void
td_config_free(const td_config_opt_t *table, void *cfg)
{
    for (const td_config_opt_t *o = table; o->name != NULL; o++) {
        if (o->type == TD_CONFIG_STRING) {
            char **f = (char **)((char *)cfg + o->offset);
            free(*f);
            *f = NULL;
        }
    }
}

td_status_t
td_config_defaults(const td_config_opt_t *table, void *cfg, char *err, size_t errlen)
{
    char msg[TD_CONFIG_ERRLEN];

    for (const td_config_opt_t *o = table; o->name != NULL; o++)
        if (o->type == TD_CONFIG_STRING)
            *(char **)((char *)cfg + o->offset) = NULL;

    for (const td_config_opt_t *o = table; o->name != NULL; o++) {
        const char *def = o->def;
        if (def == NULL && o->type == TD_CONFIG_STRING)
            def = "";
        if (def == NULL) {
            config_err(err, errlen, "bad default in option table: %s: no default", o->name);
            goto err_free_strings;
        }
        if (config_opt_set(o, cfg, def, msg, sizeof(msg)) != TD_OK) {
            config_err(err, errlen, "bad default in option table: %s", msg);
            goto err_free_strings;
        }
    }
    return TD_OK;

err_free_strings:
    td_config_free(table, cfg);
    return TD_ERR_INTERNAL;
}

/* ---- Config files ------------------------------------------------------- */

static char *
config_skip_space(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    return s;
}

static void
config_trim_right(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
}

/* Turn the text after '=' into the value, in place: strip a trailing comment
 * and blanks, or undo the quotes and escapes of a quoted value. */
static td_status_t
config_file_value(char *v, char *msg, size_t msglen)
{
    if (*v != '"') {
        for (char *p = v; *p != '\0'; p++) {
            if (*p == '#' && (p == v || isspace((unsigned char)p[-1]))) {
                *p = '\0';
                break;
            }
        }
        config_trim_right(v);
        return TD_OK;
    }

    char *w = v;
    char *r = v + 1;
    for (; *r != '"'; r++) {
        char c = *r;
        if (c == '\0') {
            config_err(msg, msglen, "unterminated quoted value");
            return TD_ERR_INVALID;
        }
        if (c == '\\') {
            switch (*++r) {
            case '"':  c = '"'; break;
            case '\\': c = '\\'; break;
            case 'n':  c = '\n'; break;
            case 't':  c = '\t'; break;
            case '\0':
                config_err(msg, msglen, "unterminated quoted value");
                return TD_ERR_INVALID;
            default:
                config_err(msg, msglen, "unknown escape \"\\%c\" in quoted value", *r);
                return TD_ERR_INVALID;
            }
        }
        *w++ = c;
    }
    r = config_skip_space(r + 1);
    if (*r != '\0' && *r != '#') {
        config_err(msg, msglen, "unexpected text after the closing quote");
        return TD_ERR_INVALID;
    }
    *w = '\0';
    return TD_OK;
}

static td_status_t
config_file_line(const td_config_opt_t *table, void *cfg, char *line, char *msg,
                 size_t msglen)
{
    char *key = config_skip_space(line);
    td_status_t st;

    if (*key == '\0' || *key == '#')
        return TD_OK;
    char *eq = strchr(key, '=');
    if (eq == NULL) {
        config_err(msg, msglen, "expected \"key = value\"");
        return TD_ERR_INVALID;
    }
    *eq = '\0';
    config_trim_right(key);
    if (*key == '\0') {
        config_err(msg, msglen, "missing key before '='");
        return TD_ERR_INVALID;
    }
    char *value = config_skip_space(eq + 1);
    st = config_file_value(value, msg, msglen);
    if (st != TD_OK)
        return st;
    return td_config_set(table, cfg, key, value, msg, msglen);
}

td_status_t
td_config_load_file(const td_config_opt_t *table, void *cfg, const char *path, char *err,
                    size_t errlen)
{
    char msg[TD_CONFIG_ERRLEN];
    char *line = NULL;
    size_t cap = 0;
    unsigned lineno = 0;
    td_status_t st = TD_OK;
    FILE *f = fopen(path, "r");

    if (f == NULL) {
        int e = errno;
        config_err(err, errlen, "cannot open config file %s: %s", path, strerror(e));
        return td_status_from_errno(e);
    }
    for (;;) {
        errno = 0;
        ssize_t n = getline(&line, &cap, f);
        if (n < 0) {
            if (!feof(f)) {
                st = td_status_from_errno(errno ? errno : EIO);
                config_err(msg, sizeof(msg), "read failed: %s", strerror(errno ? errno : EIO));
            }
            break;
        }
        lineno++;
        if (strlen(line) != (size_t)n) {
            config_err(msg, sizeof(msg), "line contains a NUL byte");
            st = TD_ERR_INVALID;
            break;
        }
        st = config_file_line(table, cfg, line, msg, sizeof(msg));
        if (st != TD_OK)
            break;
    }
    if (st != TD_OK)
        config_err(err, errlen, "%s:%u: %s", path, lineno, msg);
    free(line);
    fclose(f);
    return st;
}

td_status_t
td_config_dump(const td_config_opt_t *table, const void *cfg, FILE *out)
{
    char small[256];

    for (const td_config_opt_t *o = table; o->name != NULL; o++) {
        char *text = small;
        size_t need = td_config_format(o, cfg, small, sizeof(small));
        if (need >= sizeof(small)) {
            text = malloc(need + 1);
            if (text == NULL)
                return TD_ERR_NOMEM;
            td_config_format(o, cfg, text, need + 1);
        }
        int w = fprintf(out, "%s = %s\n", o->name, text);
        if (text != small)
            free(text);
        if (w < 0)
            return TD_ERR_IO;
    }
    return fflush(out) == 0 ? TD_OK : TD_ERR_IO;
}

/* ---- Command line ------------------------------------------------------- */

typedef enum {
    CONFIG_ARGS_FILES, /* check every argument, load the --config files */
    CONFIG_ARGS_FLAGS, /* apply the flags, gather the positional arguments */
} config_args_pass_t;

/* One walk over argv; both passes split the arguments identically. */
static td_status_t
config_args_walk(const td_config_opt_t *table, void *cfg, int argc, char **argv,
                 config_args_pass_t pass, bool *dump, int *npos, char *err, size_t errlen)
{
    char msg[TD_CONFIG_ERRLEN];
    bool options_done = false;
    int next_pos = 1;

    for (int i = 1; i < argc; i++) {
        char *a = argv[i];

        if (options_done || a[0] != '-' || a[1] == '\0') {
            if (npos == NULL) {
                config_err(err, errlen, "unexpected argument \"%s\"", a);
                return TD_ERR_INVALID;
            }
            if (pass == CONFIG_ARGS_FLAGS) { /* stable: argv[next_pos..i] rotates right */
                memmove(&argv[next_pos + 1], &argv[next_pos],
                        (size_t)(i - next_pos) * sizeof(*argv));
                argv[next_pos++] = a;
            }
            continue;
        }
        if (strcmp(a, "--") == 0) {
            options_done = true;
            continue;
        }
        if (strcmp(a, "--dump-config") == 0) {
            *dump = true;
            continue;
        }
        if (a[1] != '-') {
            config_err(err, errlen, "unknown option \"%s\"", a);
            return TD_ERR_INVALID;
        }

        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t namelen = eq ? (size_t)(eq - name) : strlen(name);
        const char *value = eq ? eq + 1 : NULL;
        bool is_config = (namelen == 6 && strncmp(name, "config", 6) == 0);
        const td_config_opt_t *opt = is_config ? NULL : config_find_n(table, name, namelen);

        if (opt == NULL && !is_config && namelen > 3 && strncmp(name, "no-", 3) == 0) {
            opt = config_find_n(table, name + 3, namelen - 3);
            if (opt != NULL && (opt->type != TD_CONFIG_BOOL || value != NULL)) {
                config_err(err, errlen, "\"%s\": --no-NAME takes no value and is "
                           "for bool options only", a);
                return TD_ERR_INVALID;
            }
            value = "false";
        }
        if (opt == NULL && !is_config) {
            config_err(err, errlen, "unknown option \"--%.*s\"", (int)namelen, name);
            return TD_ERR_INVALID;
        }
        if (value == NULL) {
            if (opt != NULL && opt->type == TD_CONFIG_BOOL) {
                value = "true";
            } else if (i + 1 < argc) {
                value = argv[++i];
            } else {
                config_err(err, errlen, "option \"--%.*s\" needs a value", (int)namelen, name);
                return TD_ERR_INVALID;
            }
        }

        td_status_t st = TD_OK;
        if (is_config && pass == CONFIG_ARGS_FILES) {
            st = td_config_load_file(table, cfg, value, err, errlen);
        } else if (!is_config && pass == CONFIG_ARGS_FLAGS) {
            st = config_opt_set(opt, cfg, value, msg, sizeof(msg));
            if (st != TD_OK)
                config_err(err, errlen, "--%s", msg);
        }
        if (st != TD_OK)
            return st;
    }
    if (npos != NULL)
        *npos = next_pos - 1;
    return TD_OK;
}

td_status_t
td_config_parse_args(const td_config_opt_t *table, void *cfg, int argc, char **argv,
                     td_config_action_t *action, int *npos, char *err, size_t errlen)
{
    bool dump = false;
    int n = 0;
    td_status_t st;

    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            *action = TD_CONFIG_HELP;
            if (npos != NULL)
                *npos = 0;
            return TD_OK;
        }
    }
    st = config_args_walk(table, cfg, argc, argv, CONFIG_ARGS_FILES, &dump,
                          npos ? &n : NULL, err, errlen);
    if (st != TD_OK)
        return st;
    st = config_args_walk(table, cfg, argc, argv, CONFIG_ARGS_FLAGS, &dump,
                          npos ? &n : NULL, err, errlen);
    if (st != TD_OK)
        return st;
    *action = dump ? TD_CONFIG_DUMP : TD_CONFIG_RUN;
    if (npos != NULL)
        *npos = n;
    return TD_OK;
}

void
td_config_usage(const td_config_opt_t *table, const char *prog, FILE *out)
{
    char flag[128], want[512];

    fprintf(out, "usage: %s [--config FILE] [--NAME=VALUE ...]\n\n"
                 "options (a config file sets the same names as \"NAME = VALUE\" lines;\n"
                 "flags override the file, whatever their order):\n", prog);
    for (const td_config_opt_t *o = table; o->name != NULL; o++) {
        config_buf_t b = { .p = want, .cap = sizeof(want), .n = 0 };
        assert(config_valid_type(o->type));
        if (o->type == TD_CONFIG_BOOL)
            snprintf(flag, sizeof(flag), "--[no-]%s", o->name);
        else
            snprintf(flag, sizeof(flag), "--%s=%s", o->name, config_types[o->type].word);
        fprintf(out, "  %-32s %s\n", flag, o->help ? o->help : "");
        if (o->type == TD_CONFIG_STRING)
            config_format_string(&b, o->def);
        else
            config_buf_printf(&b, "%s", o->def ? o->def : "(none)");
        config_buf_printf(&b, "; ");
        config_describe(o, &b);
        fprintf(out, "  %-32s default %s\n", "", want);
    }
    fprintf(out, "  %-32s %s\n", "--config=FILE", "load FILE before applying the flags");
    fprintf(out, "  %-32s %s\n", "--dump-config", "print the effective configuration and exit");
    fprintf(out, "  %-32s %s\n", "--help, -h", "print this help and exit");
}
