/* routerd/rstore.c — stored responses on disk (see rstore.h). */
#include "rstore.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

struct td_rstore {
    char *dir;
    uint64_t max_bytes, max_age_s;
    pthread_mutex_t trim;      /* one trim at a time in this process */
    unsigned tmp_seq;          /* under trim's mutex too: temporary names */
    atomic_uint_fast64_t bytes, files, dropped;   /* the last trim's view (metrics) */
};

td_status_t
td_rstore_create(const td_rstore_cfg_t *cfg, td_rstore_t **out)
{
    td_rstore_t *s = calloc(1, sizeof *s);

    if (s == NULL || (s->dir = strdup(cfg->dir)) == NULL) {
        free(s);
        return TD_ERR_NOMEM;
    }
    if (mkdir(s->dir, 0700) != 0 && errno != EEXIST) {
        td_error("responses store %s: cannot create it: %s", s->dir, strerror(errno));
        goto err_free;
    }
    if (access(s->dir, W_OK | X_OK) != 0) {
        td_error("responses store %s: not a writable directory: %s", s->dir, strerror(errno));
        goto err_free;
    }
    s->max_bytes = cfg->max_bytes;
    s->max_age_s = cfg->max_age_s;
    pthread_mutex_init(&s->trim, NULL);
    *out = s;
    return TD_OK;

err_free:
    free(s->dir);
    free(s);
    return TD_ERR_IO;
}

void
td_rstore_destroy(td_rstore_t *s)
{
    if (s == NULL)
        return;
    pthread_mutex_destroy(&s->trim);
    free(s->dir);
    free(s);
}

void
td_rstore_stats(const td_rstore_t *s, td_rstore_stats_t *out)
{
    out->bytes = atomic_load(&((td_rstore_t *)s)->bytes);
    out->files = atomic_load(&((td_rstore_t *)s)->files);
    out->dropped = atomic_load(&((td_rstore_t *)s)->dropped);
    out->max_bytes = s->max_bytes;
}

bool
td_rstore_id_ok(const char *id)
{
    size_t n = strlen(id);

    if (n == 0 || n > 96)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') ||
              (id[i] >= '0' && id[i] <= '9') || id[i] == '_' || id[i] == '-'))
            return false;
    return true;
}

static void
path_of(const td_rstore_t *s, const char *id, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s.json", s->dir, id);
}

/* ===================================================================== */
/* The budget                                                             */
/* ===================================================================== */

typedef struct {
    char name[112];
    struct timespec mtime;
    uint64_t size;
} rstore_file_t;

static int
by_age(const void *a, const void *b)
{
    const rstore_file_t *x = a, *y = b;

    if (x->mtime.tv_sec != y->mtime.tv_sec)
        return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec)
        return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The stored files (not the temporary ones), oldest first; *total: their
 * bytes. Expired ones are removed on the way. */
static td_status_t
trim_scan(td_rstore_t *s, rstore_file_t **files, size_t *n, uint64_t *total)
{
    DIR *d = opendir(s->dir);
    struct dirent *e;
    size_t cap = 0;
    time_t now = time(NULL);

    *files = NULL;
    *n = 0;
    *total = 0;
    if (d == NULL)
        return TD_ERR_IO;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        char path[4096];
        struct stat st;
        if (e->d_name[0] == '.' || len < 6 || len >= sizeof (*files)->name ||
            strcmp(e->d_name + len - 5, ".json") != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", s->dir, e->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (s->max_age_s && (uint64_t)(now - st.st_mtime) > s->max_age_s) {
            unlink(path);
            continue;
        }
        if (*n == cap) {
            rstore_file_t *f = realloc(*files, (cap = cap ? 2 * cap : 64) * sizeof *f);
            if (f == NULL) {
                closedir(d);
                return TD_ERR_NOMEM;
            }
            *files = f;
        }
        memcpy((*files)[*n].name, e->d_name, len + 1);   /* len < sizeof name: checked */
        (*files)[*n].mtime = st.st_mtim;
        (*files)[(*n)++].size = (uint64_t)st.st_size;
        *total += (uint64_t)st.st_size;
    }
    closedir(d);
    qsort(*files, *n, sizeof **files, by_age);
    return TD_OK;
}

/* Drop the expired, then the oldest until the rest fit the budget. */
static void
trim(td_rstore_t *s)
{
    rstore_file_t *files;
    size_t n;
    uint64_t total;

    size_t i = 0;

    pthread_mutex_lock(&s->trim);
    if (trim_scan(s, &files, &n, &total) == TD_OK) {
        for (; i < n && total > s->max_bytes; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", s->dir, files[i].name);
            if (unlink(path) == 0 || errno == ENOENT)
                total -= files[i].size;
        }
        atomic_store(&s->bytes, total);
        atomic_store(&s->files, n - i);
        atomic_fetch_add(&s->dropped, i);
    }
    pthread_mutex_unlock(&s->trim);
    free(files);
}

/* ===================================================================== */
/* Records                                                                */
/* ===================================================================== */

/* text[0, len) into a new file at path (0600): 0, or -1 with errno. */
static int
write_new(const char *path, const char *text, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600), e;

    if (fd < 0)
        return -1;
    for (size_t at = 0; at < len;) {
        ssize_t w = write(fd, text + at, len - at);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            goto err_close;
        at += (size_t)w;
    }
    if (fsync(fd) != 0)
        goto err_close;
    return close(fd);

err_close:
    e = errno ? errno : EIO;
    close(fd);
    errno = e;
    return -1;
}

td_status_t
td_rstore_put(td_rstore_t *s, const char *id, const char *owner, json_t *rec)
{
    char path[4096], tmp[4200];
    char *text;
    size_t len;
    unsigned seq;
    int rc;

    if (!td_rstore_id_ok(id))
        return TD_ERR_INVALID;
    json_object_set_new(rec, "owner", json_string(owner));
    json_object_set_new(rec, "created", json_integer((json_int_t)time(NULL)));
    if ((text = json_dumps(rec, JSON_COMPACT)) == NULL)
        return TD_ERR_NOMEM;
    len = strlen(text);
    path_of(s, id, path, sizeof path);
    pthread_mutex_lock(&s->trim);
    seq = s->tmp_seq++;
    pthread_mutex_unlock(&s->trim);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s-%ld-%u", s->dir, id, (long)getpid(), seq);
    rc = write_new(tmp, text, len);
    free(text);
    if (rc != 0 || rename(tmp, path) != 0) {
        td_warn("responses store %s: cannot store %s: %s", s->dir, id, strerror(errno));
        unlink(tmp);
        return TD_ERR_IO;
    }
    trim(s);
    return TD_OK;
}

td_status_t
td_rstore_get(td_rstore_t *s, const char *id, const char *owner, json_t **rec)
{
    char path[4096];
    json_t *r;
    struct stat st;

    if (!td_rstore_id_ok(id))
        return TD_ERR_NOT_FOUND;
    path_of(s, id, path, sizeof path);
    if (stat(path, &st) != 0 || (s->max_age_s &&
                                 (uint64_t)(time(NULL) - st.st_mtime) > s->max_age_s))
        return TD_ERR_NOT_FOUND;
    r = json_load_file(path, JSON_ALLOW_NUL, NULL);   /* a reply may hold U+0000 */
    if (!json_is_object(r) || !json_is_string(json_object_get(r, "owner")) ||
        strcmp(json_string_value(json_object_get(r, "owner")), owner) != 0) {
        json_decref(r);
        return TD_ERR_NOT_FOUND;
    }
    *rec = r;
    return TD_OK;
}

td_status_t
td_rstore_delete(td_rstore_t *s, const char *id, const char *owner)
{
    char path[4096];
    json_t *r;
    td_status_t st = td_rstore_get(s, id, owner, &r);

    if (st != TD_OK)
        return st;
    json_decref(r);
    path_of(s, id, path, sizeof path);
    return unlink(path) == 0 ? TD_OK : TD_ERR_NOT_FOUND;
}
