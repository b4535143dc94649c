/* tests/unit/test_config.c — the option table: every type's good and bad
 * values, config files (errors at the right line), flags and their precedence,
 * usage, dump -> load round trips, and one value parsed without a table (the
 * tools' and benchmarks' flags). */
#include "check.h"
#include "config.h"

#include <stdlib.h>
#include <unistd.h>

typedef enum { EVICT_FIFO, EVICT_LRU, EVICT_RANDOM } evict_t;

typedef struct {
    bool verbose;
    bool pin;
    int64_t offset;
    int64_t any_int;
    uint64_t port;
    uint64_t any_uint;
    double ratio;
    uint64_t pool;
    uint64_t timeout_ms;
    char *name;
    char *motd;
    evict_t evict;
    td_log_level_t log_level;
} test_cfg_t;

static const char *const evict_names[] = { "fifo", "lru", "random", NULL };

static const td_config_opt_t opts[] = {
    TD_CONFIG_OPT_BOOL("verbose", test_cfg_t, verbose, "false", "log every request"),
    TD_CONFIG_OPT_BOOL("pin", test_cfg_t, pin, "yes", "pin rank threads to cores"),
    TD_CONFIG_OPT_INT64("offset", test_cfg_t, offset, "-3", -10, 100, "signed test value"),
    TD_CONFIG_OPT_INT64("any-int", test_cfg_t, any_int, "0", 0, 0, "unbounded int"),
    TD_CONFIG_OPT_UINT64("listen-port", test_cfg_t, port, "7000", 1, 65535,
                         "port the control listener binds"),
    TD_CONFIG_OPT_UINT64("any-uint", test_cfg_t, any_uint, "0", 0, 0, "unbounded uint"),
    TD_CONFIG_OPT_DOUBLE("ratio", test_cfg_t, ratio, "0.25", 0.0, 1.0, "a fraction"),
    TD_CONFIG_OPT_SIZE("kv-pool", test_cfg_t, pool, "64MiB", 4096, 1ull << 40,
                       "bytes of kv pool per rank"),
    TD_CONFIG_OPT_DURATION("timeout", test_cfg_t, timeout_ms, "30s", 1, 3600 * 1000,
                           "request deadline"),
    TD_CONFIG_OPT_STRING("name", test_cfg_t, name, "node-a", "node name"),
    TD_CONFIG_OPT_STRING("motd", test_cfg_t, motd, NULL, "message of the day"),
    TD_CONFIG_OPT_ENUM("evict", test_cfg_t, evict, evict_names, "lru", "eviction policy"),
    TD_CONFIG_OPT_LOG_LEVEL("log-level", test_cfg_t, log_level, "info", "log threshold"),
    TD_CONFIG_OPT_END
};

static char tmpdir[] = "/tmp/test_config.XXXXXX";

/* Write text to tmpdir/name; returns the path (static buffer per slot). */
static const char *
write_file(const char *name, const char *text)
{
    static char paths[4][256];
    static int slot;
    char *path = paths[slot++ % 4];

    snprintf(path, sizeof(paths[0]), "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f != NULL) {
        fputs(text, f);
        fclose(f);
    }
    return path;
}

/* Current value of option name, formatted. */
static const char *
fmt(const test_cfg_t *cfg, const char *name)
{
    static char buf[256];
    const td_config_opt_t *opt = td_config_find(opts, name);

    CHECK(opt != NULL);
    if (opt == NULL)
        return "(no such option)";
    CHECK(td_config_format(opt, cfg, buf, sizeof(buf)) < sizeof(buf));
    return buf;
}

static void
fresh(test_cfg_t *cfg)
{
    char err[TD_CONFIG_ERRLEN];

    memset(cfg, 0xa5, sizeof(*cfg)); /* defaults must not read what was there */
    CHECK_STATUS(td_config_defaults(opts, cfg, err, sizeof(err)), TD_OK);
}

static void
test_defaults(void)
{
    test_cfg_t cfg;

    fresh(&cfg);
    CHECK(!cfg.verbose);
    CHECK(cfg.pin);
    CHECK_EQ_INT(cfg.offset, -3);
    CHECK_EQ_INT(cfg.port, 7000);
    CHECK(cfg.ratio == 0.25);
    CHECK_EQ_INT(cfg.pool, 64ull << 20);
    CHECK_EQ_INT(cfg.timeout_ms, 30000);
    CHECK_STR(cfg.name, "node-a");
    CHECK_STR(cfg.motd, "");
    CHECK_EQ_INT(cfg.evict, EVICT_LRU);
    CHECK_EQ_INT(cfg.log_level, TD_LOG_INFO);
    td_config_free(opts, &cfg);
    CHECK(cfg.name == NULL && cfg.motd == NULL);
}

/* One row: set name = value; want a status and, on success, the value as
 * td_config_format prints it (on failure, the old value must stay). */
static const struct {
    const char *name, *value;
    td_status_t st;
    const char *want;
} set_cases[] = {
    { "verbose", "true", TD_OK, "true" },
    { "verbose", "YES", TD_OK, "true" },
    { "verbose", "on", TD_OK, "true" },
    { "verbose", "1", TD_OK, "true" },
    { "pin", "off", TD_OK, "false" },
    { "pin", "No", TD_OK, "false" },
    { "pin", "0", TD_OK, "false" },
    { "verbose", "maybe", TD_ERR_INVALID, NULL },
    { "verbose", "2", TD_ERR_INVALID, NULL },
    { "verbose", "", TD_ERR_INVALID, NULL },

    { "offset", "-10", TD_OK, "-10" },
    { "offset", "100", TD_OK, "100" },
    { "offset", "101", TD_ERR_RANGE, NULL },
    { "offset", "-11", TD_ERR_RANGE, NULL },
    { "offset", "99999999999999999999", TD_ERR_RANGE, NULL },
    { "offset", "12abc", TD_ERR_INVALID, NULL },
    { "offset", " 5", TD_ERR_INVALID, NULL },
    { "offset", "0x10", TD_ERR_INVALID, NULL },
    { "offset", "-", TD_ERR_INVALID, NULL },
    { "offset", "", TD_ERR_INVALID, NULL },
    { "any-int", "-9223372036854775808", TD_OK, "-9223372036854775808" },
    { "any-int", "9223372036854775807", TD_OK, "9223372036854775807" },
    { "any-int", "9223372036854775808", TD_ERR_RANGE, NULL },

    { "listen-port", "1", TD_OK, "1" },
    { "listen-port", "65535", TD_OK, "65535" },
    { "listen-port", "0", TD_ERR_RANGE, NULL },
    { "listen-port", "65536", TD_ERR_RANGE, NULL },
    { "listen-port", "-1", TD_ERR_RANGE, NULL },
    { "listen-port", "99999999999999999999", TD_ERR_RANGE, NULL },
    { "listen-port", "+5", TD_ERR_INVALID, NULL },
    { "listen-port", "80k", TD_ERR_INVALID, NULL },
    { "listen-port", "", TD_ERR_INVALID, NULL },
    { "any-uint", "18446744073709551615", TD_OK, "18446744073709551615" },
    { "any-uint", "18446744073709551616", TD_ERR_RANGE, NULL },

    { "ratio", "0.5", TD_OK, "0.5" },
    { "ratio", "1e-3", TD_OK, "0.001" },
    { "ratio", ".125", TD_OK, "0.125" },
    { "ratio", "1", TD_OK, "1" },
    { "ratio", "0.1", TD_OK, "0.1" },
    { "ratio", "1.5", TD_ERR_RANGE, NULL },
    { "ratio", "-0.1", TD_ERR_RANGE, NULL },
    { "ratio", "1e999", TD_ERR_RANGE, NULL },
    { "ratio", "nan", TD_ERR_INVALID, NULL },
    { "ratio", "inf", TD_ERR_INVALID, NULL },
    { "ratio", "0.5x", TD_ERR_INVALID, NULL },
    { "ratio", "", TD_ERR_INVALID, NULL },

    { "kv-pool", "4096", TD_OK, "4KiB" },
    { "kv-pool", "5000", TD_OK, "5000" },
    { "kv-pool", "64m", TD_OK, "64MiB" },
    { "kv-pool", "64M", TD_OK, "64MiB" },
    { "kv-pool", "2GiB", TD_OK, "2GiB" },
    { "kv-pool", "1536m", TD_OK, "1536MiB" },
    { "kv-pool", "1024g", TD_OK, "1TiB" },
    { "kv-pool", "4k", TD_OK, "4KiB" },
    { "kv-pool", "3k", TD_ERR_RANGE, NULL },
    { "kv-pool", "2t", TD_ERR_RANGE, NULL },
    { "kv-pool", "-1k", TD_ERR_RANGE, NULL },
    { "kv-pool", "99999999999999999999", TD_ERR_RANGE, NULL },
    { "kv-pool", "17179869184g", TD_ERR_RANGE, NULL }, /* 2^34 GiB overflows u64 */
    { "kv-pool", "1.5g", TD_ERR_INVALID, NULL },
    { "kv-pool", "10x", TD_ERR_INVALID, NULL },
    { "kv-pool", "1kb", TD_ERR_INVALID, NULL },
    { "kv-pool", "64 MiB", TD_ERR_INVALID, NULL },
    { "kv-pool", "k", TD_ERR_INVALID, NULL },
    { "kv-pool", "", TD_ERR_INVALID, NULL },

    { "timeout", "250", TD_OK, "250ms" },
    { "timeout", "250ms", TD_OK, "250ms" },
    { "timeout", "1500ms", TD_OK, "1500ms" },
    { "timeout", "30s", TD_OK, "30s" },
    { "timeout", "90s", TD_OK, "90s" },
    { "timeout", "120s", TD_OK, "2m" },
    { "timeout", "60m", TD_OK, "1h" },
    { "timeout", "1h", TD_OK, "1h" },
    { "timeout", "61m", TD_ERR_RANGE, NULL },
    { "timeout", "0", TD_ERR_RANGE, NULL },
    { "timeout", "-5s", TD_ERR_RANGE, NULL },
    { "timeout", "1.5s", TD_ERR_INVALID, NULL },
    { "timeout", "5d", TD_ERR_INVALID, NULL },
    { "timeout", "", TD_ERR_INVALID, NULL },

    { "name", "node-b", TD_OK, "\"node-b\"" },
    { "name", "", TD_OK, "\"\"" },
    { "name", "a \"q\" \\ b", TD_OK, "\"a \\\"q\\\" \\\\ b\"" },

    { "evict", "random", TD_OK, "random" },
    { "evict", "FIFO", TD_OK, "fifo" },
    { "evict", "mru", TD_ERR_INVALID, NULL },
    { "evict", "", TD_ERR_INVALID, NULL },

    { "log-level", "debug", TD_OK, "debug" },
    { "log-level", "WARN", TD_OK, "warn" },
    { "log-level", "verbose", TD_ERR_INVALID, NULL },

    { "no-such-key", "1", TD_ERR_INVALID, NULL },
};

static void
test_set(void)
{
    char err[TD_CONFIG_ERRLEN], before[256];
    test_cfg_t cfg;

    fresh(&cfg);
    for (size_t i = 0; i < sizeof(set_cases) / sizeof(set_cases[0]); i++) {
        const char *name = set_cases[i].name;
        bool known = td_config_find(opts, name) != NULL;
        snprintf(before, sizeof(before), "%s", known ? fmt(&cfg, name) : "");
        err[0] = '\0';
        td_status_t st = td_config_set(opts, &cfg, name, set_cases[i].value, err, sizeof(err));
        if (st != set_cases[i].st)
            fprintf(stderr, "case %zu: %s = \"%s\": %s (%s)\n", i, name,
                    set_cases[i].value, td_status_str(st), err);
        CHECK_STATUS(st, set_cases[i].st);
        if (set_cases[i].st == TD_OK) {
            CHECK_STR(fmt(&cfg, name), set_cases[i].want);
            continue;
        }
        /* the message names the key and the value; the old value stays */
        CHECK(strstr(err, name) != NULL);
        if (known && strstr(err, set_cases[i].value) == NULL) {
            fprintf(stderr, "case %zu: message \"%s\" lacks the value\n", i, err);
            CHECK(0);
        }
        if (known)
            CHECK_STR(fmt(&cfg, name), before);
    }

    /* the message tells what is allowed, in the option's own units */
    td_config_set(opts, &cfg, "kv-pool", "3k", err, sizeof(err));
    CHECK_STR(err, "kv-pool: value out of range \"3k\": expected a size (bytes, or with a "
                   "suffix k/KiB, m/MiB, g/GiB, t/TiB) in [4KiB, 1TiB]");
    td_config_set(opts, &cfg, "listen-port", "abc", err, sizeof(err));
    CHECK_STR(err, "listen-port: invalid value \"abc\": expected a non-negative integer "
                   "in [1, 65535]");
    td_config_set(opts, &cfg, "evict", "mru", err, sizeof(err));
    CHECK_STR(err, "evict: invalid value \"mru\": expected one of fifo, lru, random");
    td_config_set(opts, &cfg, "log-level", "x", err, sizeof(err));
    CHECK(strstr(err, "error, warn, info, debug, trace") != NULL);
    td_config_set(opts, &cfg, "no-such-key", "1", err, sizeof(err));
    CHECK_STR(err, "unknown option \"no-such-key\"");
    /* a NULL err buffer is allowed */
    CHECK_STATUS(td_config_set(opts, &cfg, "listen-port", "0", NULL, 0), TD_ERR_RANGE);
    td_config_free(opts, &cfg);
}

static void
test_bad_table(void)
{
    typedef struct { uint64_t n; char *s; } small_t;
    static const td_config_opt_t bad_default[] = {
        TD_CONFIG_OPT_STRING("s", small_t, s, "kept", "a string set before the bad one"),
        TD_CONFIG_OPT_UINT64("n", small_t, n, "0", 1, 10, "default below min"),
        TD_CONFIG_OPT_END
    };
    static const td_config_opt_t no_default[] = {
        TD_CONFIG_OPT_UINT64("n", small_t, n, NULL, 0, 0, "no default"),
        TD_CONFIG_OPT_END
    };
    char err[TD_CONFIG_ERRLEN];
    small_t c;

    CHECK_STATUS(td_config_defaults(bad_default, &c, err, sizeof(err)), TD_ERR_INTERNAL);
    CHECK(strstr(err, "bad default in option table: n: value out of range \"0\"") != NULL);
    CHECK(c.s == NULL); /* nothing left allocated (ASan checks the leak) */
    CHECK_STATUS(td_config_defaults(no_default, &c, err, sizeof(err)), TD_ERR_INTERNAL);
    CHECK(strstr(err, "n: no default") != NULL);
}

static void
test_file(void)
{
    char err[TD_CONFIG_ERRLEN];
    test_cfg_t cfg;
    const char *path;

    fresh(&cfg);
    path = write_file("good.conf",
        "# a comment\n"
        "\n"
        "   listen-port   =   8080   \n"
        "\t# indented comment\n"
        "kv-pool=2g # trailing comment\n"
        "name = \"a # not a comment\"   # but this is\n"
        "motd = \"tab\\there \\\"quoted\\\" back\\\\slash\\nline\"\n"
        "verbose = on\r\n"
        "evict = random\n"
        "timeout =\"5s\"\n"
        "offset = 7\n"
        "offset = 9\n"
        "ratio = 0.75#no space before #: part of the value? no: a number cannot hold it\n");
    /* the last line is an error: '#' without a blank before it is not a comment */
    CHECK_STATUS(td_config_load_file(opts, &cfg, path, err, sizeof(err)), TD_ERR_INVALID);
    char want[512];
    snprintf(want, sizeof(want), "%s:13: ratio: invalid value", path);
    CHECK(strncmp(err, want, strlen(want)) == 0);
    /* the lines before it were applied */
    CHECK_EQ_INT(cfg.port, 8080);
    CHECK_EQ_INT(cfg.pool, 2ull << 30);
    CHECK_STR(cfg.name, "a # not a comment");
    CHECK_STR(cfg.motd, "tab\there \"quoted\" back\\slash\nline");
    CHECK(cfg.verbose);
    CHECK_EQ_INT(cfg.evict, EVICT_RANDOM);
    CHECK_EQ_INT(cfg.timeout_ms, 5000);
    CHECK_EQ_INT(cfg.offset, 9);
    CHECK(cfg.ratio == 0.25);

    /* each error names file:line */
    static const struct {
        const char *text;
        td_status_t st;
        const char *msg; /* after "path:" */
    } bad[] = {
        { "listen-port = 1\n\nlisten-port = 0\n", TD_ERR_RANGE,
          "3: listen-port: value out of range \"0\"" },
        { "# c\nlisten-port 80\n", TD_ERR_INVALID, "2: expected \"key = value\"" },
        { "= 5\n", TD_ERR_INVALID, "1: missing key before '='" },
        { "\n\n\n\nbogus = 1\n", TD_ERR_INVALID, "5: unknown option \"bogus\"" },
        { "name = \"open\n", TD_ERR_INVALID, "1: unterminated quoted value" },
        { "name = \"ends in backslash\\", TD_ERR_INVALID, "1: unterminated quoted value" },
        { "name = \"x\" y\n", TD_ERR_INVALID, "1: unexpected text after the closing quote" },
        { "name = \"\\q\"\n", TD_ERR_INVALID, "1: unknown escape \"\\q\"" },
        { "listen-port =\n", TD_ERR_INVALID, "1: listen-port: invalid value \"\"" },
        { "listen-port = 99999999999999999999\n", TD_ERR_RANGE,
          "1: listen-port: value out of range" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        path = write_file("bad.conf", bad[i].text);
        CHECK_STATUS(td_config_load_file(opts, &cfg, path, err, sizeof(err)), bad[i].st);
        snprintf(want, sizeof(want), "%s:%s", path, bad[i].msg);
        if (strncmp(err, want, strlen(want)) != 0) {
            fprintf(stderr, "file case %zu: got \"%s\", want prefix \"%s\"\n", i, err, want);
            CHECK(0);
        }
    }

    /* a NUL byte inside a line is an error, not a truncated value */
    path = write_file("nul.conf", "");
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f != NULL) {
        fwrite("name = ab\0cd\n", 1, 13, f);
        fclose(f);
    }
    CHECK_STATUS(td_config_load_file(opts, &cfg, path, err, sizeof(err)), TD_ERR_INVALID);
    CHECK(strstr(err, ":1: line contains a NUL byte") != NULL);

    snprintf(want, sizeof(want), "%s/missing.conf", tmpdir);
    CHECK_STATUS(td_config_load_file(opts, &cfg, want, err, sizeof(err)), TD_ERR_NOT_FOUND);
    CHECK(strstr(err, "cannot open config file") != NULL);
    CHECK(strstr(err, want) != NULL);
    CHECK(strstr(err, "No such file") != NULL);
    td_config_free(opts, &cfg);
}

/* Parse a NULL-terminated argument list into a fresh config. */
static td_status_t
parse(test_cfg_t *cfg, char **argv, td_config_action_t *action, int *npos, char *err)
{
    int argc = 0;

    while (argv[argc] != NULL)
        argc++;
    fresh(cfg);
    return td_config_parse_args(opts, cfg, argc, argv, action, npos, err, TD_CONFIG_ERRLEN);
}

static void
test_args(void)
{
    char err[TD_CONFIG_ERRLEN];
    td_config_action_t action = (td_config_action_t)-1;
    test_cfg_t cfg;
    int npos = -1;
    const char *conf = write_file("flags.conf", "listen-port = 5000\nname = from-file\n"
                                                "verbose = true\npin = false\n");
    char conf_arg[300];
    snprintf(conf_arg, sizeof(conf_arg), "--config=%s", conf);

    /* flags override the file whatever their order; both value forms */
    {
        char *argv[] = { "prog", "--listen-port=9", "--no-verbose", "--config", (char *)conf,
                         "--ratio", "0.5", "--pin", "--log-level=debug", NULL };
        CHECK_STATUS(parse(&cfg, argv, &action, NULL, err), TD_OK);
        CHECK_EQ_INT(action, TD_CONFIG_RUN);
        CHECK_EQ_INT(cfg.port, 9);
        CHECK(!cfg.verbose);
        CHECK(cfg.pin);
        CHECK_STR(cfg.name, "from-file");
        CHECK(cfg.ratio == 0.5);
        CHECK_EQ_INT(cfg.log_level, TD_LOG_DEBUG);
        td_config_free(opts, &cfg);
    }
    /* --verbose=false, --name value that starts with '-', negative number as value */
    {
        char *argv[] = { "prog", "--verbose=false", "--name", "-x-", "--offset", "-7",
                         conf_arg, "--dump-config", NULL };
        CHECK_STATUS(parse(&cfg, argv, &action, NULL, err), TD_OK);
        CHECK_EQ_INT(action, TD_CONFIG_DUMP);
        CHECK(!cfg.verbose);
        CHECK_STR(cfg.name, "-x-");
        CHECK_EQ_INT(cfg.offset, -7);
        CHECK_EQ_INT(cfg.port, 5000);
        td_config_free(opts, &cfg);
    }
    /* positional arguments: compacted to argv[1..npos] in order */
    {
        char *argv[] = { "prog", "drain", "--listen-port", "80", "rank-3", "-", "--",
                         "--not-a-flag", NULL };
        CHECK_STATUS(parse(&cfg, argv, &action, &npos, err), TD_OK);
        CHECK_EQ_INT(npos, 4);
        CHECK_STR(argv[1], "drain");
        CHECK_STR(argv[2], "rank-3");
        CHECK_STR(argv[3], "-");
        CHECK_STR(argv[4], "--not-a-flag");
        CHECK_EQ_INT(cfg.port, 80);
        td_config_free(opts, &cfg);
    }
    /* --help wins over anything else and touches nothing */
    {
        char *argv[] = { "prog", "--bogus", "--listen-port=0", "-h", "extra", NULL };
        npos = -1;
        CHECK_STATUS(parse(&cfg, argv, &action, &npos, err), TD_OK);
        CHECK_EQ_INT(action, TD_CONFIG_HELP);
        CHECK_EQ_INT(npos, 0);
        CHECK_EQ_INT(cfg.port, 7000);
        td_config_free(opts, &cfg);
    }

    static const struct {
        const char *args[6];
        td_status_t st;
        const char *msg;
    } bad[] = {
        { { "stray" }, TD_ERR_INVALID, "unexpected argument \"stray\"" },
        { { "--bogus=1" }, TD_ERR_INVALID, "unknown option \"--bogus\"" },
        { { "-x" }, TD_ERR_INVALID, "unknown option \"-x\"" },
        { { "--listen-port" }, TD_ERR_INVALID, "option \"--listen-port\" needs a value" },
        { { "--config" }, TD_ERR_INVALID, "option \"--config\" needs a value" },
        { { "--listen-port=0" }, TD_ERR_RANGE, "--listen-port: value out of range \"0\"" },
        { { "--kv-pool", "lots" }, TD_ERR_INVALID, "--kv-pool: invalid value \"lots\"" },
        { { "--no-listen-port" }, TD_ERR_INVALID, "\"--no-listen-port\": --no-NAME" },
        { { "--no-verbose=1" }, TD_ERR_INVALID, "\"--no-verbose=1\": --no-NAME" },
        { { "--verbose=maybe" }, TD_ERR_INVALID, "--verbose: invalid value \"maybe\"" },
        { { "--no-bogus" }, TD_ERR_INVALID, "unknown option \"--no-bogus\"" },
        /* a missing --config file */
        { { "--config=/nonexistent/x.conf" }, TD_ERR_NOT_FOUND,
          "cannot open config file /nonexistent/x.conf" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *argv[8] = { "prog" };
        int argc = 1;
        for (; argc <= 6 && bad[i].args[argc - 1] != NULL; argc++)
            argv[argc] = (char *)bad[i].args[argc - 1];
        argv[argc] = NULL;
        action = (td_config_action_t)-1;
        err[0] = '\0';
        CHECK_STATUS(parse(&cfg, argv, &action, NULL, err), bad[i].st);
        CHECK_EQ_INT((int)action, -1); /* not set on failure */
        if (strncmp(err, bad[i].msg, strlen(bad[i].msg)) != 0) {
            fprintf(stderr, "args case %zu: got \"%s\", want prefix \"%s\"\n", i, err,
                    bad[i].msg);
            CHECK(0);
        }
        td_config_free(opts, &cfg);
    }

    /* an error inside a --config file names file:line */
    const char *badconf = write_file("badflags.conf", "name = ok\nevict = mru\n");
    {
        char *argv[] = { "prog", "--config", (char *)badconf, NULL };
        CHECK_STATUS(parse(&cfg, argv, &action, NULL, err), TD_ERR_INVALID);
        char want[512];
        snprintf(want, sizeof(want), "%s:2: evict: invalid value \"mru\"", badconf);
        CHECK(strncmp(err, want, strlen(want)) == 0);
        td_config_free(opts, &cfg);
    }
}

static void
test_usage(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);

    CHECK(out != NULL);
    if (out == NULL)
        return;
    td_config_usage(opts, "prefilld", out);
    fclose(out);
    static const char *const want[] = {
        "usage: prefilld [--config FILE]",
        "  --listen-port=UINT               port the control listener binds\n"
        "                                   default 7000; a non-negative integer in [1, 65535]\n",
        "  --[no-]verbose                   log every request\n"
        "                                   default false; true/false",
        "--kv-pool=SIZE", "default 64MiB; a size (bytes", "in [4KiB, 1TiB]",
        "--timeout=DURATION", "default 30s", "in [1ms, 1h]",
        "--evict=CHOICE", "default lru; one of fifo, lru, random",
        "--name=STR", "default \"node-a\"; a string",
        "--motd=STR", "default \"\"",
        "--ratio=NUM", "in [0, 1]",
        "--any-int=INT", "default 0; an integer\n",
        "--log-level=LEVEL", "--config=FILE", "--dump-config", "--help, -h",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        if (strstr(text, want[i]) == NULL) {
            fprintf(stderr, "usage lacks \"%s\":\n%s", want[i], text);
            CHECK(0);
        }
    }
    free(text);
}

/* Dump a config to a string. */
static char *
dump(const test_cfg_t *cfg)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);

    CHECK(out != NULL);
    if (out == NULL)
        return NULL;
    CHECK_STATUS(td_config_dump(opts, cfg, out), TD_OK);
    fclose(out);
    return text;
}

static void
test_round_trip(void)
{
    char err[TD_CONFIG_ERRLEN];
    test_cfg_t a, b;

    fresh(&a);
    char *text = dump(&a);
    CHECK(strstr(text, "listen-port = 7000\nany-uint = 0\nratio = 0.25\nkv-pool = 64MiB\n"
                       "timeout = 30s\nname = \"node-a\"\nmotd = \"\"\nevict = lru\n"
                       "log-level = info\n") != NULL);
    free(text);

    static const char *const changes[][2] = {
        { "verbose", "true" }, { "pin", "false" }, { "offset", "-10" },
        { "any-int", "-9223372036854775808" }, { "listen-port", "65535" },
        { "any-uint", "18446744073709551615" }, { "ratio", "0.1" },
        { "kv-pool", "12345" }, { "timeout", "90s" },
        { "name", "  # \"tricky\" \\ value\twith\nnewline = x  " },
        { "motd", "#" }, { "evict", "fifo" }, { "log-level", "trace" },
    };
    for (size_t i = 0; i < sizeof(changes) / sizeof(changes[0]); i++)
        CHECK_STATUS(td_config_set(opts, &a, changes[i][0], changes[i][1], err, sizeof(err)),
                     TD_OK);
    /* a long string goes through the dump's heap path */
    char long_value[1000];
    memset(long_value, 'z', sizeof(long_value) - 1);
    long_value[sizeof(long_value) - 1] = '\0';
    CHECK_STATUS(td_config_set(opts, &a, "motd", long_value, err, sizeof(err)), TD_OK);
    a.ratio = 1.0 / 3.0; /* needs all 17 digits */

    text = dump(&a);
    const char *path = write_file("dump.conf", text);
    fresh(&b);
    CHECK_STATUS(td_config_load_file(opts, &b, path, err, sizeof(err)), TD_OK);
    char *again = dump(&b);
    CHECK_STR(again, text);
    CHECK(b.verbose && !b.pin);
    CHECK_EQ_INT(b.offset, -10);
    CHECK_EQ_INT(b.any_int, INT64_MIN);
    CHECK_EQ_INT(b.port, 65535);
    CHECK(b.any_uint == UINT64_MAX);
    CHECK(b.ratio == 1.0 / 3.0);
    CHECK_EQ_INT(b.pool, 12345);
    CHECK_EQ_INT(b.timeout_ms, 90000);
    CHECK_STR(b.name, "  # \"tricky\" \\ value\twith\nnewline = x  ");
    CHECK_STR(b.motd, long_value);
    CHECK_EQ_INT(b.evict, EVICT_FIFO);
    CHECK_EQ_INT(b.log_level, TD_LOG_TRACE);
    free(text);
    free(again);
    td_config_free(opts, &a);
    td_config_free(opts, &b);
}

/* One value without a table: what the tools' and benchmarks' flags take. */
static void
test_parse_one(void)
{
    enum { UINT, SIZE, DOUBLE };
    static const struct {
        int kind;
        const char *s;
        double min, max;        /* as the call takes them (0, 0: unbounded) */
        td_status_t want;
        double value;           /* on TD_OK */
        const char *msg;        /* in the message otherwise */
    } cases[] = {
        { UINT, "0", 0, 0, TD_OK, 0, NULL },
        { UINT, "4096", 1, 65536, TD_OK, 4096, NULL },
        { UINT, "18446744073709551615", 0, 0, TD_OK, 18446744073709551615.0, NULL },
        { UINT, "18446744073709551616", 0, 0, TD_ERR_RANGE, 0, "value out of range" },
        { UINT, "0", 1, 10, TD_ERR_RANGE, 0, "--n: value out of range \"0\": expected a "
                                              "non-negative integer in [1, 10]" },
        { UINT, "11", 1, 10, TD_ERR_RANGE, 0, "in [1, 10]" },
        { UINT, "-1", 0, 0, TD_ERR_RANGE, 0, "value out of range \"-1\"" },
        { UINT, "4K", 0, 0, TD_ERR_INVALID, 0, "invalid value \"4K\"" },
        { UINT, "", 0, 0, TD_ERR_INVALID, 0, "invalid value \"\"" },
        { UINT, " 1", 0, 0, TD_ERR_INVALID, 0, "invalid value" },
        { UINT, "1 ", 0, 0, TD_ERR_INVALID, 0, "invalid value" },
        { UINT, "0x10", 0, 0, TD_ERR_INVALID, 0, "invalid value" },
        { UINT, "+1", 0, 0, TD_ERR_INVALID, 0, "invalid value" },
        { UINT, "1.5", 0, 0, TD_ERR_INVALID, 0, "invalid value" },
        { SIZE, "4096", 1, 0x1p62, TD_OK, 4096, NULL },
        { SIZE, "4K", 1, 0x1p62, TD_OK, 4096, NULL },
        { SIZE, "4k", 1, 0x1p62, TD_OK, 4096, NULL },
        { SIZE, "4KiB", 1, 0x1p62, TD_OK, 4096, NULL },
        { SIZE, "64kib", 1, 0x1p62, TD_OK, 65536, NULL },
        { SIZE, "1M", 1, 0x1p62, TD_OK, 1048576, NULL },
        { SIZE, "1MiB", 1, 0x1p62, TD_OK, 1048576, NULL },
        { SIZE, "2G", 1, 0x1p62, TD_OK, 2147483648.0, NULL },
        { SIZE, "1T", 1, 0x1p62, TD_OK, 1099511627776.0, NULL },
        { SIZE, "0", 1, 0x1p62, TD_ERR_RANGE, 0, "value out of range \"0\": expected a size" },
        { SIZE, "16777216T", 0, 0, TD_ERR_RANGE, 0, "value out of range" },   /* 2^64 */
        { SIZE, "4KB", 0, 0, TD_ERR_INVALID, 0, "invalid value \"4KB\": expected a size" },
        { SIZE, "4 K", 0, 0, TD_ERR_INVALID, 0, "invalid value" },
        { SIZE, "K", 0, 0, TD_ERR_INVALID, 0, "invalid value" },
        { SIZE, "1.5M", 0, 0, TD_ERR_INVALID, 0, "invalid value" },
        { SIZE, "-4K", 0, 0, TD_ERR_RANGE, 0, "value out of range" },
        { DOUBLE, "0.5", 0, 1, TD_OK, 0.5, NULL },
        { DOUBLE, ".5", 0, 0, TD_OK, 0.5, NULL },
        { DOUBLE, "-2.5", 0, 0, TD_OK, -2.5, NULL },
        { DOUBLE, "1e-3", 0, 0, TD_OK, 1e-3, NULL },
        { DOUBLE, "1.5", 0, 1, TD_ERR_RANGE, 0, "--n: value out of range \"1.5\": expected a "
                                                "finite number in [0, 1]" },
        { DOUBLE, "1e999", 0, 0, TD_ERR_RANGE, 0, "value out of range" },
        { DOUBLE, "inf", 0, 0, TD_ERR_INVALID, 0, "invalid value \"inf\"" },
        { DOUBLE, "nan", 0, 0, TD_ERR_INVALID, 0, "invalid value" },
        { DOUBLE, "", 0, 0, TD_ERR_INVALID, 0, "invalid value" },
        { DOUBLE, "1x", 0, 0, TD_ERR_INVALID, 0, "invalid value" },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[TD_CONFIG_ERRLEN] = "";
        uint64_t u = 12345;
        double d = 12345;
        td_status_t st;

        switch (cases[i].kind) {
        case UINT:
            st = td_config_parse_uint("--n", cases[i].s, (uint64_t)cases[i].min,
                                      (uint64_t)cases[i].max, &u, err, sizeof(err));
            break;
        case SIZE:
            st = td_config_parse_size("--n", cases[i].s, (uint64_t)cases[i].min,
                                      (uint64_t)cases[i].max, &u, err, sizeof(err));
            break;
        default:
            st = td_config_parse_double("--n", cases[i].s, cases[i].min, cases[i].max, &d,
                                        err, sizeof(err));
            break;
        }
        if (st != cases[i].want) {
            fprintf(stderr, "case %zu \"%s\": %s, want %s (%s)\n", i, cases[i].s,
                    td_status_str(st), td_status_str(cases[i].want), err);
            td_check_failures++;
            continue;
        }
        if (st == TD_OK) {
            CHECK(cases[i].kind == DOUBLE ? d == cases[i].value : (double)u == cases[i].value);
            CHECK_STR(err, "");
        } else {
            /* nothing stored; the message names the flag and says what is wanted */
            CHECK(u == 12345 && d == 12345);
            CHECK(strncmp(err, "--n: ", 5) == 0);
            if (strstr(err, cases[i].msg) == NULL) {
                fprintf(stderr, "case %zu \"%s\": message \"%s\" lacks \"%s\"\n", i,
                        cases[i].s, err, cases[i].msg);
                td_check_failures++;
            }
        }
    }
    /* the message is optional */
    uint64_t v = 0;
    CHECK_STATUS(td_config_parse_uint("--n", "x", 0, 0, &v, NULL, 0), TD_ERR_INVALID);
    CHECK_STATUS(td_config_parse_size("--n", "2M", 0, 0, &v, NULL, 0), TD_OK);
    CHECK_EQ_INT(v, 2 << 20);
}

static void
remove_tmpdir(void)
{
    static const char *const names[] = {
        "good.conf", "bad.conf", "nul.conf", "flags.conf", "badflags.conf", "dump.conf",
    };
    char path[300];

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", tmpdir, names[i]);
        unlink(path);
    }
    CHECK(rmdir(tmpdir) == 0);
}

int
main(void)
{
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    test_defaults();
    test_set();
    test_bad_table();
    test_file();
    test_args();
    test_usage();
    test_round_trip();
    test_parse_one();
    remove_tmpdir();
    return td_check_exit("test_config");
}
