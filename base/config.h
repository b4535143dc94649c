/* base/config.h — the declarative option table that drives a daemon's config
 * file, its command-line flags and the admin `config` view: one entry per option
 * (name, type, bounds, default, offset into the daemon's struct, help). */
#ifndef TD_CONFIG_H
#define TD_CONFIG_H

#include "log.h"
#include "status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Option types and the C type of the struct field each one writes. */
typedef enum {
    TD_CONFIG_BOOL = 1, /* bool; true/false, yes/no, on/off, 1/0 */
    TD_CONFIG_INT64,    /* int64_t; decimal, optional '-' */
    TD_CONFIG_UINT64,   /* uint64_t; decimal */
    TD_CONFIG_DOUBLE,   /* double; finite */
    TD_CONFIG_STRING,   /* char *, heap-owned by the struct; never NULL once set */
    TD_CONFIG_SIZE,     /* uint64_t bytes; suffix k/KiB m/MiB g/GiB t/TiB (x1024) */
    TD_CONFIG_DURATION, /* uint64_t milliseconds; suffix ms, s, m, h; bare = ms */
    TD_CONFIG_ENUM,     /* int (or an int-sized enum): index into `choices` */
    TD_CONFIG_LOG_LEVEL /* td_log_level_t; error, warn, info, debug, trace */
} td_config_type_t;

/* A bound; the member read is the one of the option's type: i for INT64,
 * u for UINT64/SIZE/DURATION, d for DOUBLE. min == max == 0 means unbounded
 * (the full range of the type). */
typedef union {
    int64_t  i;
    uint64_t u;
    double   d;
} td_config_bound_t;

typedef struct {
    const char *name;            /* "listen-port": the file key and the flag --listen-port */
    td_config_type_t type;
    td_config_bound_t min, max;  /* inclusive; numeric types only */
    const char *const *choices;  /* ENUM: NULL-terminated names, index = value */
    const char *def;             /* default, parsed like a file or flag value;
                                    NULL for a string means "" */
    size_t offset;               /* offsetof(daemon struct, field) */
    const char *help;            /* one line, lower-case, no final period */
} td_config_opt_t;

/* What td_config_parse_args asks the caller to do next. */
typedef enum {
    TD_CONFIG_RUN = 0,  /* start normally */
    TD_CONFIG_HELP,     /* --help / -h: print td_config_usage() and exit 0 */
    TD_CONFIG_DUMP,     /* --dump-config: print td_config_dump() and exit 0 */
} td_config_action_t;

/* Room for any message these functions write into err. */
#define TD_CONFIG_ERRLEN 512

/* ---- Declaring a table --------------------------------------------------
 * static const td_config_opt_t opts[] = {
 *     TD_CONFIG_OPT_UINT64("listen-port", my_cfg_t, port, "7000", 1, 65535,
 *                          "port the control listener binds"),
 *     TD_CONFIG_OPT_END
 * };
 * Each macro checks at compile time that the field has the type's C type. */
#define TD_CONFIG_OFFSET_(st, field, ctype) \
    _Generic(((st *)0)->field, ctype: offsetof(st, field))
/* Enum fields: any int-sized type (a C enum or int). */
#define TD_CONFIG_OFFSET_INT_(st, field) \
    (offsetof(st, field) + 0 * sizeof(char[sizeof(((st *)0)->field) == sizeof(int) ? 1 : -1]))

#define TD_CONFIG_OPT_(nm, ty, off, df, mn, mx, hp)                          \
    { .name = (nm), .type = (ty), .min = mn, .max = mx, .choices = NULL,    \
      .def = (df), .offset = (off), .help = (hp) }

#define TD_CONFIG_OPT_BOOL(nm, st, field, df, hp) \
    TD_CONFIG_OPT_(nm, TD_CONFIG_BOOL, TD_CONFIG_OFFSET_(st, field, bool), df, {0}, {0}, hp)
#define TD_CONFIG_OPT_INT64(nm, st, field, df, mn, mx, hp)                   \
    TD_CONFIG_OPT_(nm, TD_CONFIG_INT64, TD_CONFIG_OFFSET_(st, field, int64_t), df, \
                   {.i = (mn)}, {.i = (mx)}, hp)
#define TD_CONFIG_OPT_UINT64(nm, st, field, df, mn, mx, hp)                  \
    TD_CONFIG_OPT_(nm, TD_CONFIG_UINT64, TD_CONFIG_OFFSET_(st, field, uint64_t), df, \
                   {.u = (mn)}, {.u = (mx)}, hp)
#define TD_CONFIG_OPT_DOUBLE(nm, st, field, df, mn, mx, hp)                  \
    TD_CONFIG_OPT_(nm, TD_CONFIG_DOUBLE, TD_CONFIG_OFFSET_(st, field, double), df, \
                   {.d = (mn)}, {.d = (mx)}, hp)
#define TD_CONFIG_OPT_SIZE(nm, st, field, df, mn, mx, hp)                    \
    TD_CONFIG_OPT_(nm, TD_CONFIG_SIZE, TD_CONFIG_OFFSET_(st, field, uint64_t), df, \
                   {.u = (mn)}, {.u = (mx)}, hp)
#define TD_CONFIG_OPT_DURATION(nm, st, field, df, mn, mx, hp)                \
    TD_CONFIG_OPT_(nm, TD_CONFIG_DURATION, TD_CONFIG_OFFSET_(st, field, uint64_t), df, \
                   {.u = (mn)}, {.u = (mx)}, hp)
#define TD_CONFIG_OPT_STRING(nm, st, field, df, hp) \
    TD_CONFIG_OPT_(nm, TD_CONFIG_STRING, TD_CONFIG_OFFSET_(st, field, char *), df, {0}, {0}, hp)
#define TD_CONFIG_OPT_LOG_LEVEL(nm, st, field, df, hp)                       \
    TD_CONFIG_OPT_(nm, TD_CONFIG_LOG_LEVEL, TD_CONFIG_OFFSET_(st, field, td_log_level_t), \
                   df, {0}, {0}, hp)
#define TD_CONFIG_OPT_ENUM(nm, st, field, chs, df, hp)                       \
    { .name = (nm), .type = TD_CONFIG_ENUM, .min = {0}, .max = {0},          \
      .choices = (chs), .def = (df), .offset = TD_CONFIG_OFFSET_INT_(st, field), \
      .help = (hp) }
#define TD_CONFIG_OPT_END { .name = NULL }

/* ---- Using a table ------------------------------------------------------
 * `cfg` points at the daemon's struct. The struct owns its strings:
 * td_config_free() releases them. Nothing here logs: a failure returns a
 * status and writes one message naming the key, the value and what is
 * allowed into err (errlen bytes, may be NULL), for the caller to report once.
 * Nothing here locks: a struct changed at run time needs the caller's lock. */

/* Initialise every field of cfg from the table's defaults. cfg is treated as
 * uninitialised (strings it held are not freed). A default that does not
 * parse is a bug in the table: TD_ERR_INTERNAL, nothing left allocated. */
td_status_t td_config_defaults(const td_config_opt_t *table, void *cfg,
                               char *err, size_t errlen);

/* Free the strings of cfg and set them to NULL. */
void td_config_free(const td_config_opt_t *table, void *cfg);

/* The option called name, or NULL. */
const td_config_opt_t *td_config_find(const td_config_opt_t *table, const char *name);

/* The one setter: parse value for option name and store it. Unknown name or
 * bad syntax: TD_ERR_INVALID; out of bounds or overflow: TD_ERR_RANGE;
 * cfg is unchanged on failure. value is taken as is (no trimming). */
td_status_t td_config_set(const td_config_opt_t *table, void *cfg, const char *name,
                          const char *value, char *err, size_t errlen);

/* ---- One value, without a table -----------------------------------------
 * The syntax of the table's number types for a value read on its own: the
 * tools' and benchmarks' command-line flags (getopt), or anything else that
 * takes one number. uint: decimal; size: bytes with an optional suffix
 * k/KiB m/MiB g/GiB t/TiB (x1024, case-insensitive); double: finite decimal.
 * The value must lie in [min, max] (min == max == 0: unbounded, as in a
 * table). Bad syntax: TD_ERR_INVALID; out of bounds, a '-' on an unsigned
 * value or overflow: TD_ERR_RANGE; *out is set only on TD_OK. Nothing is
 * logged: on failure err (may be NULL) gets the table's message, led by name,
 * e.g. "--size: invalid value \"4X\": expected a size (...) in [1, 4GiB]". */
td_status_t td_config_parse_uint(const char *name, const char *s, uint64_t min, uint64_t max,
                                 uint64_t *out, char *err, size_t errlen);
td_status_t td_config_parse_size(const char *name, const char *s, uint64_t min, uint64_t max,
                                 uint64_t *out, char *err, size_t errlen);
td_status_t td_config_parse_double(const char *name, const char *s, double min, double max,
                                   double *out, char *err, size_t errlen);

/* Format opt's current value in cfg as the file syntax reads it back
 * (strings quoted and escaped, sizes and durations in their largest exact
 * unit). snprintf-like: returns the length needed, writes at most len bytes. */
size_t td_config_format(const td_config_opt_t *opt, const void *cfg, char *buf, size_t len);

/* Apply a config file: `key = value` lines; '#' starts a comment (at line
 * start, or after whitespace outside quotes); blank lines skipped; key and
 * value trimmed; a value may be double-quoted, with \" \\ \n \t escapes.
 * Errors are prefixed "path:line: ". A missing file: TD_ERR_NOT_FOUND.
 * On failure the lines before the bad one have been applied. */
td_status_t td_config_load_file(const td_config_opt_t *table, void *cfg, const char *path,
                                char *err, size_t errlen);

/* Apply command-line flags on top of cfg (call td_config_defaults first):
 * --name=value, --name value, --flag / --no-flag for bools, --config FILE
 * (every file is loaded before any flag is applied, whatever the order),
 * --help / -h, --dump-config, and "--" ending the options. argv[0] is the
 * program name.
 * Positional arguments: with npos NULL they are rejected (TD_ERR_INVALID);
 * otherwise they are moved, in order, to argv[1 .. *npos] (the options
 * follow) and *npos is set.
 * --help anywhere before "--" wins: cfg is untouched and *action is
 * TD_CONFIG_HELP, even if other arguments are bad. *action and *npos are set
 * only on success. */
td_status_t td_config_parse_args(const td_config_opt_t *table, void *cfg, int argc,
                                 char **argv, td_config_action_t *action, int *npos,
                                 char *err, size_t errlen);

/* Print a usage listing generated from the table: each flag with its type,
 * help, default and bounds or choices. */
void td_config_usage(const td_config_opt_t *table, const char *prog, FILE *out);

/* Print the effective config as `key = value` lines, in table order, that
 * td_config_load_file reads back to the same values. */
td_status_t td_config_dump(const td_config_opt_t *table, const void *cfg, FILE *out);

#endif
