/* tandemctl/main.c — the operator CLI: options (the config table), where the
 * router and the admin key come from, and dispatch to the command table.
 * Exit status: 0 done, 1 the call failed, 2 bad usage. */
#include "tandemctl.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "log.h"

static const td_config_opt_t tdctl_opts[] = {
    TD_CONFIG_OPT_STRING("router", tdctl_opts_t, router, "",
                         "routerd's admin api, http://HOST:PORT (default: $TANDEM_ROUTER, "
                         "the local cluster's, http://127.0.0.1:8001)"),
    TD_CONFIG_OPT_STRING("admin-key-file", tdctl_opts_t, admin_key_file, "",
                         "file with the admin key (default: $TANDEM_ADMIN_KEY_FILE, the local "
                         "cluster's, $TANDEM_ETC_DIR/admin.key (default /etc/tandem))"),
    TD_CONFIG_OPT_BOOL("json", tdctl_opts_t, json, "false",
                       "print the router's json answer instead of a table"),
    TD_CONFIG_OPT_DURATION("timeout", tdctl_opts_t, timeout_ms, "10s", 1, 3600000,
                           "give up on the router after this long"),
    TD_CONFIG_OPT_END
};

/* Messages go to stderr as "tandemctl: ...", without the daemons' timestamps. */
static void
main_log_sink(td_log_level_t level, const char *line, void *arg)
{
    fprintf(stderr, "tandemctl: %s%s\n", level == TD_LOG_WARN ? "warning: " : "", line);
}

/* The local cluster's state directory: $TANDEM_LOCAL_DIR or ./local-cluster. */
static const char *
main_local_dir(void)
{
    const char *d = getenv("TANDEM_LOCAL_DIR");
    return d != NULL && *d != '\0' ? d : "local-cluster";
}

/* The installed cluster's configuration directory: $TANDEM_ETC_DIR or
 * /etc/tandem (the systemd units' key files live there). */
static const char *
main_etc_dir(void)
{
    const char *d = getenv("TANDEM_ETC_DIR");
    return d != NULL && *d != '\0' ? d : "/etc/tandem";
}

/* The first line of path that is neither blank nor a '#' comment, trimmed,
 * into a fresh string. TD_ERR_NOT_FOUND for a missing file; anything else
 * wrong is logged. */
static td_status_t
main_read_first_line(const char *path, const char *what, char **out)
{
    char line[1024];
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        td_status_t st = td_status_from_errno(errno);
        if (st != TD_ERR_NOT_FOUND)
            td_error("%s file %s: %s", what, path, strerror(errno));
        return st;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        char *s = line, *e = line + strlen(line);
        while (isspace((unsigned char)*s))
            s++;
        while (e > s && isspace((unsigned char)e[-1]))
            *--e = '\0';
        if (*s == '\0' || *s == '#')
            continue;
        fclose(f);
        for (char *c = s; *c != '\0'; c++)
            if (isspace((unsigned char)*c) || iscntrl((unsigned char)*c)) {
                td_error("%s file %s: the first entry contains blanks or control characters",
                         what, path);
                return TD_ERR_INVALID;
            }
        if ((*out = strdup(s)) == NULL) {
            td_error("%s file %s: out of memory", what, path);
            return TD_ERR_NOMEM;
        }
        return TD_OK;
    }
    fclose(f);
    td_error("%s file %s: no entry in it", what, path);
    return TD_ERR_INVALID;
}

/* Replace the (owned) string *slot, when empty, by the first source that
 * gives a value: the environment variable, then each file in order (its
 * first line when read_file, else the path of the first file that exists).
 * TD_ERR_NOT_FOUND when none does. */
static td_status_t
main_resolve(char **slot, const char *env, const char *const *files, size_t nfiles,
             const char *what, bool read_file)
{
    const char *e = getenv(env);
    td_status_t st = TD_ERR_NOT_FOUND;
    char *v = NULL;

    if (**slot != '\0')
        return TD_OK;
    if (e != NULL && *e != '\0') {
        st = (v = strdup(e)) != NULL ? TD_OK : TD_ERR_NOMEM;
    } else {
        for (size_t i = 0; i < nfiles && st == TD_ERR_NOT_FOUND; i++) {
            if (read_file)
                st = main_read_first_line(files[i], what, &v);
            else if (access(files[i], F_OK) == 0)
                st = (v = strdup(files[i])) != NULL ? TD_OK : TD_ERR_NOMEM;
        }
    }
    if (st == TD_ERR_NOMEM)
        td_error("%s: out of memory", what);
    if (st == TD_OK) {
        free(*slot);
        *slot = v;
    }
    return st;
}

/* Router URL and (with_key) admin key, from the options or their defaults. */
static td_status_t
main_setup(tdctl_t *ctl, bool with_key)
{
    char url_file[4096], key_file[4096], etc_key_file[4096];
    snprintf(url_file, sizeof(url_file), "%s/admin.url", main_local_dir());
    snprintf(key_file, sizeof(key_file), "%s/admin.key", main_local_dir());
    snprintf(etc_key_file, sizeof(etc_key_file), "%s/admin.key", main_etc_dir());
    const char *url_files[] = { url_file };
    const char *key_files[] = { key_file, etc_key_file };

    td_status_t st = main_resolve(&ctl->opts.router, "TANDEM_ROUTER", url_files, 1,
                                  "router url", true);
    if (st == TD_ERR_NOT_FOUND) {  /* routerd's default admin-listen */
        free(ctl->opts.router);
        if ((ctl->opts.router = strdup("http://127.0.0.1:8001")) == NULL) {
            td_error("router url: out of memory");
            return TD_ERR_NOMEM;
        }
        st = TD_OK;
    }
    if (st != TD_OK)
        return st;
    if (strstr(ctl->opts.router, "://") == NULL) {  /* "host:port" is fine too */
        char *u = malloc(strlen(ctl->opts.router) + 8);
        if (u == NULL) {
            td_error("router url: out of memory");
            return TD_ERR_NOMEM;
        }
        sprintf(u, "http://%s", ctl->opts.router);
        free(ctl->opts.router);
        ctl->opts.router = u;
    }
    if (!with_key)
        return TD_OK;
    st = main_resolve(&ctl->opts.admin_key_file, "TANDEM_ADMIN_KEY_FILE", key_files, 2,
                      "admin key", false);
    if (st == TD_ERR_NOT_FOUND)
        td_error("no admin key: give --admin-key-file FILE or set TANDEM_ADMIN_KEY_FILE "
                 "(looked for %s and %s)", key_file, key_files[1]);
    if (st != TD_OK)
        return st;
    st = main_read_first_line(ctl->opts.admin_key_file, "admin key", &ctl->admin_key);
    if (st == TD_ERR_NOT_FOUND)
        td_error("admin key file %s: no such file", ctl->opts.admin_key_file);
    else if (st == TD_OK && strlen(ctl->admin_key) > 512) {
        td_error("admin key file %s: the key is longer than 512 bytes",
                 ctl->opts.admin_key_file);
        st = TD_ERR_INVALID;
    }
    return st;
}

static void
main_usage(FILE *out)
{
    fprintf(out, "usage: tandemctl [options] COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; tdctl_cmds_table[i] != NULL; i++) {
        const tdctl_cmd_entry_t *c = tdctl_cmds_table[i];
        fprintf(out, "  %-8s %-5s  %s\n", c->name, c->args, c->help);
    }
    fprintf(out, "  %-8s %-5s  %s\n", "help", "[CMD]", "this help, or one command's");
    fprintf(out, "\n");
    td_config_usage(tdctl_opts, "tandemctl", out);
}

/* `tandemctl CMD --help`, `tandemctl help CMD`. */
static void
main_cmd_usage(const tdctl_cmd_entry_t *c, FILE *out)
{
    fprintf(out, "usage: tandemctl [options] %s%s%s\n\n%s\n", c->name, c->args[0] ? " " : "",
            c->args, c->help);
    if (c->details != NULL)
        fprintf(out, "\n%s", c->details);
    fprintf(out, "\noptions: --router URL (routerd's admin api), --admin-key-file FILE, "
                 "--json, --timeout DURATION\n(tandemctl --help describes them)\n");
}

/* Take --help / -h out of argv (before "--"): with a command it asks for
 * that command's usage, so the options parser must not see it. */
static bool
main_take_help(int *argc, char **argv)
{
    bool help = false;
    int j = 1;

    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            while (i < *argc)
                argv[j++] = argv[i++];
            break;
        }
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            help = true;
        else
            argv[j++] = argv[i];
    }
    *argc = j;
    argv[j] = NULL;
    return help;
}

/* help [CMD] (also CMD --help): 0, or 2 for an unknown command. */
static int
main_help(const char *name)
{
    const tdctl_cmd_entry_t *cmd;

    if (name == NULL) {
        main_usage(stdout);
        return 0;
    }
    if (strcmp(name, "help") == 0) {
        printf("usage: tandemctl help [COMMAND]\n\nThe commands and options, or one "
               "command's usage (also: tandemctl COMMAND --help).\n");
        return 0;
    }
    if ((cmd = tdctl_cmds_find(name)) == NULL) {
        td_error("unknown command \"%s\" (tandemctl help lists them)", name);
        return 2;
    }
    main_cmd_usage(cmd, stdout);
    return 0;
}

int
main(int argc, char **argv)
{
    char err[TD_CONFIG_ERRLEN];
    td_config_action_t action;
    int npos = 0, rc = 2;
    tdctl_t ctl = { .admin_key = NULL };
    bool help;

    td_log_set_ident("tandemctl");
    td_log_set_sink(main_log_sink, NULL);
    help = main_take_help(&argc, argv);
    if (td_config_defaults(tdctl_opts, &ctl.opts, err, sizeof(err)) != TD_OK) {
        td_error("%s", err);
        return 1;
    }
    if (td_config_parse_args(tdctl_opts, &ctl.opts, argc, argv, &action, &npos, err,
                             sizeof(err)) != TD_OK) {
        if (help) {   /* the help asked for, whatever else is wrong */
            rc = main_help(NULL);
            goto out_free_opts;
        }
        td_error("%s", err);
        goto out_free_opts;
    }
    if (help || (npos >= 1 && strcmp(argv[1], "help") == 0)) {
        bool cmd_help = npos >= 1 && strcmp(argv[1], "help") == 0;
        const char *name = cmd_help ? (npos >= 2 ? argv[2] : NULL) : (npos >= 1 ? argv[1] : NULL);
        if (cmd_help && npos > 2) {
            td_error("usage: tandemctl help [COMMAND]");
            goto out_free_opts;
        }
        rc = main_help(name);
        goto out_free_opts;
    }
    if (action != TD_CONFIG_RUN) {
        td_config_dump(tdctl_opts, &ctl.opts, stdout);
        rc = 0;
        goto out_free_opts;
    }
    if (npos < 1) {
        main_usage(stderr);
        goto out_free_opts;
    }
    const tdctl_cmd_entry_t *cmd = tdctl_cmds_find(argv[1]);
    if (cmd == NULL) {
        td_error("unknown command \"%s\" (tandemctl help lists them)", argv[1]);
        goto out_free_opts;
    }
    if (npos - 1 < cmd->nargs || npos - 1 > (cmd->nargs_max > cmd->nargs ? cmd->nargs_max
                                                                       : cmd->nargs)) {
        td_error("usage: tandemctl %s%s%s (tandemctl %s --help)", cmd->name,
                 cmd->args[0] ? " " : "", cmd->args, cmd->name);
        goto out_free_opts;
    }
    rc = 1;
    ctl.nargs = npos - 1;
    if (main_setup(&ctl, !cmd->no_key) != TD_OK || cmd->exec(&ctl, argv + 2) != TD_OK)
        goto out_free_opts;
    if (fflush(stdout) != 0) {
        td_error("%s: cannot write the output: %s", cmd->name, strerror(errno));
        goto out_free_opts;
    }
    rc = 0;

out_free_opts:
    free(ctl.admin_key);
    td_config_free(tdctl_opts, &ctl.opts);
    return rc;
}
