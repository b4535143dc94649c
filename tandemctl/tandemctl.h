/* tandemctl/tandemctl.h — what tandemctl's pieces share: the invocation
 * (options, admin key), the command table entry, the admin HTTP client
 * (http.c) and the output helpers (out.c) that turn router JSON into tables. */
#ifndef TDCTL_H
#define TDCTL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "log.h"
#include "status.h"

/* Options; filled by the config table in main.c. */
typedef struct {
    char *router;          /* base URL, "" = $TANDEM_ROUTER or the local-cluster state */
    char *admin_key_file;  /* "" = $TANDEM_ADMIN_KEY_FILE, local-cluster state, /etc/tandem */
    bool json;             /* print the router's JSON instead of a table */
    uint64_t timeout_ms;   /* whole request, connect included */
} tdctl_opts_t;

/* One invocation. Owns opts' strings (td_config_free) and admin_key. */
typedef struct {
    tdctl_opts_t opts;
    char *admin_key;       /* bearer key, read from the key file */
    unsigned warnings;     /* odd fields met while printing */
    int nargs;             /* the command's arguments (between its nargs and nargs_max) */
} tdctl_t;

/* A command: name, argument synopsis, one line of help, more lines for
 * `tandemctl CMD --help` (NULL: none), argument count (exact, or nargs to
 * nargs_max when nargs_max is above it), whether it goes without the admin
 * key, and the function run with args[0 .. ctl->nargs-1]. */
typedef struct {
    const char *name;
    const char *args;
    const char *help;
    const char *details;
    int nargs;
    int nargs_max;
    bool no_key;           /* needs no admin key (the router's public paths only) */
    td_status_t (*exec)(tdctl_t *ctl, char **args);
} tdctl_cmd_entry_t;

extern const tdctl_cmd_entry_t tdctl_cmd_status_entry;
extern const tdctl_cmd_entry_t tdctl_cmd_drain_entry;
extern const tdctl_cmd_entry_t tdctl_cmd_undrain_entry;
extern const tdctl_cmd_entry_t tdctl_cmd_remove_entry;
extern const tdctl_cmd_entry_t tdctl_cmd_requests_entry;
extern const tdctl_cmd_entry_t tdctl_cmd_cancel_entry;
extern const tdctl_cmd_entry_t tdctl_cmd_config_entry;
extern const tdctl_cmd_entry_t tdctl_cmd_cache_entry;
extern const tdctl_cmd_entry_t tdctl_cmd_ready_entry;

/* cmds.c: the table (NULL-terminated) and lookup by name. */
extern const tdctl_cmd_entry_t *const tdctl_cmds_table[];
const tdctl_cmd_entry_t *tdctl_cmds_find(const char *name);

/* cmd.c: the shape of the read-only commands: GET path, then print the JSON
 * answer (--json) or hand it to render for a table ... */
typedef td_status_t (*tdctl_render_fn)(tdctl_t *ctl, const json_t *ans);
td_status_t tdctl_cmd_get(tdctl_t *ctl, const char *path, const char *what,
                          tdctl_render_fn render);
/* ... and the one four commands share: POST {key: value} to path, then print
 * "OBJ VALUE: STATUS" (the answer's "status", else done; or the JSON answer
 * with --json); verb names the action in error messages. */
td_status_t tdctl_cmd_post(tdctl_t *ctl, const char *verb, const char *path, const char *key,
                           const char *obj, const char *value, const char *done);

/* http.c: one admin call. method "GET" or "POST"; body may be NULL (not
 * stolen). On TD_OK *out is the parsed JSON answer of a 2xx reply (caller
 * decrefs). Failures are logged here, once, naming what failed:
 * unreachable router (TD_ERR_PEER), timeout (TD_ERR_TIMEOUT), 401/403
 * (TD_ERR_AUTH), 404 (TD_ERR_NOT_FOUND), 409 (TD_ERR_STATE), another status
 * (TD_ERR_PEER), a body that is not JSON (TD_ERR_PROTO). what names the
 * action for messages ("drain node n3"). */
td_status_t tdctl_http_call(tdctl_t *ctl, const char *method, const char *path,
                            json_t *body, const char *what, json_t **out);
/* One GET without the admin key, bounded by timeout_ms: on TD_OK (an answer
 * came, whatever its status) *code is the HTTP status and *out its JSON body
 * (NULL when it is not JSON; the caller decrefs); TD_ERR_TIMEOUT,
 * TD_ERR_PEER (unreachable), TD_ERR_INVALID (the URL) otherwise. Logs
 * nothing. */
td_status_t tdctl_http_probe(tdctl_t *ctl, const char *path, uint64_t timeout_ms, int *code,
                             json_t **out);

/* out.c -------------------------------------------------------------------- */

/* Format obj[key] for a table cell (key may be a path, "load.running"; a
 * null on the path is the cell's value):
 * strings as they are, integers and reals as numbers, booleans yes/no, null
 * "-", a rank reference {"node", "rank"} as node/rank. A missing key or an object/array
 * gives "?" and a warning naming where (ctx) and the key. */
void tdctl_out_cell(tdctl_t *ctl, const json_t *obj, const char *key, const char *ctx,
                    char *buf, size_t len);

/* obj[key] as an array; missing or not an array: NULL and a warning. */
const json_t *tdctl_out_array(tdctl_t *ctl, const json_t *obj, const char *key,
                              const char *ctx);

/* A text table: rows of cells, printed with columns padded to their widest
 * cell. Owns copies of the cells. */
typedef struct tdctl_table_s tdctl_table_t;
tdctl_table_t *tdctl_table_create(size_t ncols);
void tdctl_table_destroy(tdctl_table_t *t);
/* Append one row of ncols cells; TD_ERR_NOMEM on allocation failure. */
td_status_t tdctl_table_add(tdctl_table_t *t, const char *const *cells);
void tdctl_table_print(const tdctl_table_t *t, FILE *out);

/* A table column: header, the JSON field, and whether the field is read from
 * the outer object (a node) rather than the row's own (a rank). */
typedef struct {
    const char *header;
    const char *key;
    bool outer;
} tdctl_col_t;

/* A table whose first row is the columns' headers; NULL when out of memory. */
tdctl_table_t *tdctl_out_table_create(const tdctl_col_t *cols, size_t ncols);
/* Append the row for inner (and outer, may be NULL), cells per
 * tdctl_out_cell; ctx names the row in warnings. */
td_status_t tdctl_out_row(tdctl_t *ctl, tdctl_table_t *t, const tdctl_col_t *cols,
                          size_t ncols, const json_t *outer, const json_t *inner,
                          const char *ctx);

/* Bytes as "512 B", "12.3 MiB", "40 MiB", "1.2 GiB". */
void tdctl_out_bytes(uint64_t v, char *buf, size_t len);
/* A prefill rank's "cache" object of /admin/status as one cell:
 * "12.3 MiB pool / 40 MiB host / 1.2 GiB ssd, hit 56%" (hits over lookups
 * in every tier); "-" for null (no prefix cache) or anything not an object,
 * "no report yet" before its first Load. */
void tdctl_out_cache(const json_t *cache, char *buf, size_t len);

/* Print the JSON answer for --json (indented, sorted keys, newline). */
void tdctl_out_json(const json_t *j);

#endif
