/* ckpt/safetensors.c — safetensors reader (mmap, strict header validation,
 * sharded index) and writer (single file or shards + index). Every failure on
 * file bytes is a status plus a message naming the file and the tensor. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

#define ST_HEADER_MAX  100000000ull  /* the safetensors header size limit */
#define ST_INDEX_MAX   (256u << 20)  /* largest index file we read */
#define ST_INDEX_NAME  "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"

/* ==================================================================== */
/* dtypes                                                                */
/* ==================================================================== */

static const struct {
    const char *name;
    unsigned bits;
} dtype_info[TD_DT_COUNT] = {
    [TD_DT_BOOL]    = {"BOOL", 8},
    [TD_DT_U8]      = {"U8", 8},
    [TD_DT_I8]      = {"I8", 8},
    [TD_DT_F8_E5M2] = {"F8_E5M2", 8},
    [TD_DT_F8_E4M3] = {"F8_E4M3", 8},
    [TD_DT_E8M0]    = {"F8_E8M0", 8},
    [TD_DT_F4]      = {"F4", 4},
    [TD_DT_I16]     = {"I16", 16},
    [TD_DT_U16]     = {"U16", 16},
    [TD_DT_F16]     = {"F16", 16},
    [TD_DT_BF16]    = {"BF16", 16},
    [TD_DT_I32]     = {"I32", 32},
    [TD_DT_U32]     = {"U32", 32},
    [TD_DT_F32]     = {"F32", 32},
    [TD_DT_I64]     = {"I64", 64},
    [TD_DT_U64]     = {"U64", 64},
    [TD_DT_F64]     = {"F64", 64},
};

const char *
td_dtype_name(td_dtype_t dt)
{
    if ((unsigned)dt >= TD_DT_COUNT)
        return "?";
    return dtype_info[dt].name;
}

td_status_t
td_dtype_parse(const char *name, td_dtype_t *out)
{
    for (int i = 0; i < TD_DT_COUNT; i++) {
        if (strcmp(name, dtype_info[i].name) == 0) {
            *out = (td_dtype_t)i;
            return TD_OK;
        }
    }
    return TD_ERR_NOT_FOUND;
}

unsigned
td_dtype_bits(td_dtype_t dt)
{
    if ((unsigned)dt >= TD_DT_COUNT)
        return 0;
    return dtype_info[dt].bits;
}

int64_t
td_st_numel(const td_st_tensor_t *t)
{
    int64_t n = 1;

    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

void
td_st_release(const td_st_tensor_t *t)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)t->data, b = a + t->nbytes;

    if (t->data == NULL || pg == 0 || (pg & (pg - 1)) != 0)
        return;
    a = (a + pg - 1) & ~(pg - 1);
    b &= ~(pg - 1);
    /* a failure only leaves the pages resident: nothing to report */
    if (b > a)
        (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Bytes of `ndim` dims of dtype dt; false on overflow or a partial byte. */
static int
st_nbytes(td_dtype_t dt, int ndim, const int64_t *shape, uint64_t *out)
{
    uint64_t bits = td_dtype_bits(dt);

    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];

        if (d != 0 && bits > (UINT64_C(1) << 63) / d)
            return 0;   /* more than 2^60 bytes */
        bits *= d;
    }
    if (bits % 8 != 0)
        return 0;
    *out = bits / 8;
    return 1;
}

void
td_st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t off = 0;

    off += (size_t)snprintf(buf + off, len - off, "[");
    for (int i = 0; i < ndim && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%" PRId64, i ? "," : "", shape[i]);
    if (off < len)
        snprintf(buf + off, len - off, "]");
}

/* ==================================================================== */
/* errors                                                                */
/* ==================================================================== */

/* Every failure is logged here, once, where it is decided; callers get the
 * status and log nothing more. */
#define st_fail(st, ...) (td_log_write(TD_LOG_ERROR, __VA_ARGS__), (st))

/* ==================================================================== */
/* reader                                                                */
/* ==================================================================== */

typedef struct {
    char *name;        /* shard name as listed (or basename of the path) */
    void *map;
    size_t size;
} st_file_t;

struct td_st {
    st_file_t *files;
    size_t nfiles;
    td_st_tensor_t *tensors;  /* sorted by name; names owned */
    size_t ntensors;
    size_t cap;
    json_t *metadata;         /* `__metadata__` of the first file, or NULL */
};

static int
st_tensor_cmp(const void *a, const void *b)
{
    return strcmp(((const td_st_tensor_t *)a)->name, ((const td_st_tensor_t *)b)->name);
}

static td_status_t
st_push(td_st_t *st, const td_st_tensor_t *t)
{
    if (st->ntensors == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 64;
        td_st_tensor_t *n = realloc(st->tensors, cap * sizeof(*n));

        if (n == NULL)
            return st_fail(TD_ERR_NOMEM, "out of memory for %zu tensors", cap);
        st->tensors = n;
        st->cap = cap;
    }
    st->tensors[st->ntensors++] = *t;
    return TD_OK;
}

/* Map a whole file read-only. */
static td_status_t
st_map(const char *path, const char *name, st_file_t *f)
{
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        int e = errno;
        return st_fail(e == ENOENT ? TD_ERR_NOT_FOUND : td_status_from_errno(e),
                       "%s: cannot open: %s", name, strerror(e));
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return st_fail(TD_ERR_INVALID, "%s: not a regular file", name);
    }
    f->size = (size_t)sb.st_size;
    f->map = NULL;
    if (f->size > 0) {
        f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            int e = errno;
            f->map = NULL;
            close(fd);
            return st_fail(td_status_from_errno(e), "%s: mmap of %zu bytes failed: %s",
                           name, f->size, strerror(e));
        }
    }
    close(fd);
    return TD_OK;
}

/* "duplicate object key near '"x"'" -> x (best effort, for the message). */
static void
st_dup_key(const char *text, char *out, size_t len)
{
    const char *p = strstr(text, "near '\"");
    const char *e;

    snprintf(out, len, "?");
    if (p == NULL)
        return;
    p += 7;
    e = strrchr(p, '"');
    if (e == NULL || e < p)
        return;
    snprintf(out, len, "%.*s", (int)(e - p), p);
}

/* A non-negative JSON integer. */
static int
st_json_u64(const json_t *v, int64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return 0;
    *out = (int64_t)json_integer_value(v);
    return 1;
}

typedef struct {
    size_t idx;       /* index into st->tensors */
    uint64_t begin, end;
} st_span_t;

static int
st_span_cmp(const void *a, const void *b)
{
    const st_span_t *x = a, *y = b;

    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : (x->end > y->end);
}

/* Parse one tensor entry of file `fname` into *t (name not yet set). */
static td_status_t
st_parse_entry(const char *fname, const char *key, const json_t *v,
               td_st_tensor_t *t, uint64_t *begin, uint64_t *end)
{
    const json_t *jdt, *jshape, *joff;
    uint64_t need;
    int64_t b, e;
    char shp[256];

    if (key[0] == '\0')
        return st_fail(TD_ERR_INVALID, "%s: a tensor has an empty name", fname);
    if (!json_is_object(v))
        return st_fail(TD_ERR_INVALID, "%s: tensor '%s': entry is not a JSON object", fname, key);
    jdt = json_object_get(v, "dtype");
    jshape = json_object_get(v, "shape");
    joff = json_object_get(v, "data_offsets");
    if (!json_is_string(jdt))
        return st_fail(TD_ERR_INVALID, "%s: tensor '%s': no \"dtype\" string", fname, key);
    if (td_dtype_parse(json_string_value(jdt), &t->dtype) != TD_OK)
        return st_fail(TD_ERR_UNSUPPORTED, "%s: tensor '%s': unknown dtype '%s'", fname, key,
                       json_string_value(jdt));
    if (!json_is_array(jshape))
        return st_fail(TD_ERR_INVALID, "%s: tensor '%s': no \"shape\" array", fname, key);
    if (json_array_size(jshape) > TD_ST_MAX_DIMS)
        return st_fail(TD_ERR_UNSUPPORTED, "%s: tensor '%s': %zu dimensions, at most %d",
                       fname, key, json_array_size(jshape), TD_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(jshape);
    for (int i = 0; i < t->ndim; i++) {
        if (!st_json_u64(json_array_get(jshape, (size_t)i), &t->shape[i]))
            return st_fail(TD_ERR_INVALID, "%s: tensor '%s': shape entry %d is not a "
                           "non-negative integer", fname, key, i);
    }
    if (!json_is_array(joff) || json_array_size(joff) != 2 ||
        !st_json_u64(json_array_get(joff, 0), &b) || !st_json_u64(json_array_get(joff, 1), &e))
        return st_fail(TD_ERR_INVALID, "%s: tensor '%s': \"data_offsets\" is not a pair of "
                       "non-negative integers", fname, key);
    td_st_shape_str(shp, sizeof(shp), t->ndim, t->shape);
    if (e < b)
        return st_fail(TD_ERR_INVALID, "%s: tensor '%s': data_offsets [%" PRId64 ",%" PRId64
                       "] end before they begin", fname, key, b, e);
    if (!st_nbytes(t->dtype, t->ndim, t->shape, &need))
        return st_fail(TD_ERR_INVALID, "%s: tensor '%s': %s %s is not a whole number of bytes "
                       "or is too large", fname, key, td_dtype_name(t->dtype), shp);
    if ((uint64_t)(e - b) != need)
        return st_fail(TD_ERR_INVALID, "%s: tensor '%s': data_offsets [%" PRId64 ",%" PRId64
                       "] hold %" PRIu64 " bytes, but %s %s needs %" PRIu64, fname, key, b, e,
                       (uint64_t)(e - b), td_dtype_name(t->dtype), shp, need);
    *begin = (uint64_t)b;
    *end = (uint64_t)e;
    t->nbytes = (size_t)need;
    return TD_OK;
}

/* Check that the spans of one file tile its data region exactly. */
static td_status_t
st_check_spans(const td_st_t *st, const char *fname, st_span_t *sp, size_t n,
               uint64_t data_len)
{
    uint64_t pos = 0;
    size_t bad = n;        /* first span that breaks the tiling */

    qsort(sp, n, sizeof(*sp), st_span_cmp);
    for (size_t i = 0; i < n; i++) {
        if (sp[i].begin != pos && bad == n)
            bad = i;
        if (sp[i].end > pos)
            pos = sp[i].end;
    }
    if (bad == n && pos > data_len)
        return st_fail(TD_ERR_INVALID, "%s: truncated: tensors need %" PRIu64 " data bytes, "
                       "file has %" PRIu64 " after the header", fname, pos, data_len);
    for (size_t i = 0; i < n; i++) {
        if (sp[i].end > data_len)
            return st_fail(TD_ERR_RANGE, "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64
                           "] exceed data region (%" PRIu64 " bytes)", fname,
                           st->tensors[sp[i].idx].name, sp[i].begin, sp[i].end, data_len);
    }
    if (bad < n) {
        const st_span_t *s = &sp[bad];
        uint64_t prev_end = bad ? sp[bad - 1].end : 0;

        if (bad > 0 && s->begin < prev_end)
            return st_fail(TD_ERR_INVALID, "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64
                           "] overlap tensor '%s' [%" PRIu64 ",%" PRIu64 "]", fname,
                           st->tensors[s->idx].name, s->begin, s->end,
                           st->tensors[sp[bad - 1].idx].name, sp[bad - 1].begin, prev_end);
        return st_fail(TD_ERR_INVALID, "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64
                       "] leave bytes [%" PRIu64 ",%" PRIu64 ") of the data region unused",
                       fname, st->tensors[s->idx].name, s->begin, s->end, prev_end, s->begin);
    }
    if (pos < data_len)
        return st_fail(TD_ERR_INVALID, "%s: %" PRIu64 " bytes after the last tensor (data region "
                       "%" PRIu64 " bytes, tensors cover %" PRIu64 ")", fname, data_len - pos,
                       data_len, pos);
    return TD_OK;
}

/* The header's length: the file's first 8 bytes (little-endian), within the
 * file and ST_HEADER_MAX. */
static td_status_t
st_header_len(const st_file_t *f, uint64_t *out)
{
    const unsigned char *base = f->map;
    uint64_t hlen = 0;

    if (f->size < 8)
        return st_fail(TD_ERR_INVALID, "%s: truncated: %zu bytes, no room for the 8-byte header "
                       "length", f->name, f->size);
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | base[i];
    if (hlen > f->size - 8)
        return st_fail(TD_ERR_INVALID, "%s: truncated: header says %" PRIu64 " bytes, file has %zu",
                       f->name, hlen, f->size);
    if (hlen > ST_HEADER_MAX)
        return st_fail(TD_ERR_TOO_BIG, "%s: header of %" PRIu64 " bytes exceeds the %llu-byte "
                       "limit", f->name, hlen, ST_HEADER_MAX);
    *out = hlen;
    return TD_OK;
}

/* The header's JSON (hlen bytes after the length), no key twice. */
static td_status_t
st_header_load(const st_file_t *f, uint64_t hlen, json_t **out)
{
    json_error_t jerr;
    json_t *hdr = json_loadb((const char *)f->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES,
                             &jerr);

    if (hdr == NULL) {
        if (json_error_code(&jerr) == json_error_duplicate_key) {
            char k[256];
            st_dup_key(jerr.text, k, sizeof(k));
            return st_fail(TD_ERR_INVALID, "%s: duplicate tensor '%s' in the header", f->name, k);
        }
        return st_fail(TD_ERR_INVALID, "%s: bad header JSON at line %d column %d: %s", f->name,
                       jerr.line, jerr.column, jerr.text);
    }
    *out = hdr;
    return TD_OK;
}

/* The header's __metadata__, when there is one: an object of strings. The
 * first file's is st's. */
static td_status_t
st_parse_metadata(td_st_t *st, const char *fname, json_t *hdr)
{
    json_t *meta = json_object_get(hdr, "__metadata__"), *mv;
    const char *mk;

    if (meta == NULL)
        return TD_OK;
    if (!json_is_object(meta))
        return st_fail(TD_ERR_INVALID, "%s: __metadata__ is not a JSON object", fname);
    json_object_foreach(meta, mk, mv) {
        if (!json_is_string(mv))
            return st_fail(TD_ERR_INVALID, "%s: __metadata__ value '%s' is not a string",
                           fname, mk);
    }
    if (st->metadata == NULL)
        st->metadata = json_incref(meta);
    return TD_OK;
}

/* The header's tensors, appended to st; their data pointers set once their
 * spans tile file fi's data region (after the hlen-byte header). */
static td_status_t
st_parse_tensors(td_st_t *st, size_t fi, json_t *hdr, uint64_t hlen)
{
    const st_file_t *f = &st->files[fi];
    const unsigned char *data = (const unsigned char *)f->map + 8 + hlen;
    const char *key;
    json_t *val;
    st_span_t *spans;
    size_t n = 0;
    td_status_t rc = TD_OK;

    spans = calloc(json_object_size(hdr) + 1, sizeof(*spans));
    if (spans == NULL)
        return st_fail(TD_ERR_NOMEM, "%s: out of memory", f->name);
    json_object_foreach(hdr, key, val) {
        td_st_tensor_t t;
        uint64_t b = 0, e = 0;

        if (strcmp(key, "__metadata__") == 0)
            continue;
        memset(&t, 0, sizeof(t));
        rc = st_parse_entry(f->name, key, val, &t, &b, &e);
        if (rc != TD_OK)
            goto out;
        t.name = strdup(key);
        t.file = f->name;
        if (t.name == NULL) {
            rc = st_fail(TD_ERR_NOMEM, "%s: out of memory", f->name);
            goto out;
        }
        rc = st_push(st, &t);
        if (rc != TD_OK) {
            free((char *)t.name);
            goto out;
        }
        spans[n].idx = st->ntensors - 1;
        spans[n].begin = b;
        spans[n].end = e;
        n++;
    }
    rc = st_check_spans(st, f->name, spans, n, f->size - 8 - hlen);
    if (rc != TD_OK)
        goto out;
    for (size_t i = 0; i < n; i++)
        st->tensors[spans[i].idx].data = data + spans[i].begin;
out:
    free(spans);
    return rc;
}

/* Parse the header of mapped file `fi` and append its tensors to st. */
static td_status_t
st_parse_file(td_st_t *st, size_t fi)
{
    const st_file_t *f = &st->files[fi];
    uint64_t hlen;
    json_t *hdr;
    td_status_t rc;

    if ((rc = st_header_len(f, &hlen)) != TD_OK || (rc = st_header_load(f, hlen, &hdr)) != TD_OK)
        return rc;
    if (!json_is_object(hdr))
        rc = st_fail(TD_ERR_INVALID, "%s: header is not a JSON object", f->name);
    else if ((rc = st_parse_metadata(st, f->name, hdr)) == TD_OK)
        rc = st_parse_tensors(st, fi, hdr, hlen);
    json_decref(hdr);
    return rc;
}

void
td_st_close(td_st_t *st)
{
    if (st == NULL)
        return;
    for (size_t i = 0; i < st->ntensors; i++)
        free((char *)st->tensors[i].name);
    free(st->tensors);
    for (size_t i = 0; i < st->nfiles; i++) {
        if (st->files[i].map != NULL)
            munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].name);
    }
    free(st->files);
    json_decref(st->metadata);
    free(st);
}

static char *
st_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);

    if (p == NULL)
        return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

/* Add and map a file; `name` is copied. */
static td_status_t
st_add_file(td_st_t *st, const char *path, const char *name)
{
    st_file_t *n = realloc(st->files, (st->nfiles + 1) * sizeof(*n));
    td_status_t rc;

    if (n == NULL)
        return st_fail(TD_ERR_NOMEM, "%s: out of memory", name);
    st->files = n;
    memset(&n[st->nfiles], 0, sizeof(*n));
    n[st->nfiles].name = strdup(name);
    if (n[st->nfiles].name == NULL)
        return st_fail(TD_ERR_NOMEM, "%s: out of memory", name);
    st->nfiles++;
    rc = st_map(path, name, &n[st->nfiles - 1]);
    if (rc != TD_OK)
        return rc;
    return st_parse_file(st, st->nfiles - 1);
}

/* Sort by name and reject a name found in two files. */
static td_status_t
st_finalize(td_st_t *st)
{
    if (st->ntensors > 1)
        qsort(st->tensors, st->ntensors, sizeof(*st->tensors), st_tensor_cmp);
    for (size_t i = 1; i < st->ntensors; i++) {
        if (strcmp(st->tensors[i - 1].name, st->tensors[i].name) == 0)
            return st_fail(TD_ERR_INVALID, "tensor '%s' appears in both '%s' and '%s'",
                           st->tensors[i].name, st->tensors[i - 1].file, st->tensors[i].file);
    }
    return TD_OK;
}

static int
st_shard_name_ok(const char *s)
{
    const char *p = s;

    if (s[0] == '\0' || s[0] == '/')
        return 0;
    while (*p) {
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);

        if ((len == 2 && p[0] == '.' && p[1] == '.') || len == 0)
            return 0;
        p += len;
        if (*p == '/')
            p++;
    }
    return 1;
}

/* Read the whole (small) index file. */
static td_status_t
st_read_index(const char *path, char **out, size_t *len)
{
    struct stat sb;
    char *buf;
    size_t got = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        int e = errno;
        return st_fail(td_status_from_errno(e), ST_INDEX_NAME ": cannot open: %s", strerror(e));
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > ST_INDEX_MAX) {
        close(fd);
        return st_fail(TD_ERR_INVALID, ST_INDEX_NAME ": not a regular file of at most %u bytes",
                       ST_INDEX_MAX);
    }
    buf = malloc((size_t)sb.st_size + 1);
    if (buf == NULL) {
        close(fd);
        return st_fail(TD_ERR_NOMEM, ST_INDEX_NAME ": out of memory");
    }
    while (got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return st_fail(td_status_from_errno(e), ST_INDEX_NAME ": read failed: %s", strerror(e));
        }
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return TD_OK;
}

/* The index file's JSON, no key twice. */
static td_status_t
st_index_load(const char *index_path, json_t **out)
{
    char *text = NULL;
    size_t len = 0;
    json_error_t jerr;
    json_t *idx;
    td_status_t rc;

    rc = st_read_index(index_path, &text, &len);
    if (rc != TD_OK)
        return rc;
    idx = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (idx == NULL) {
        if (json_error_code(&jerr) == json_error_duplicate_key) {
            char k[256];
            st_dup_key(jerr.text, k, sizeof(k));
            return st_fail(TD_ERR_INVALID, ST_INDEX_NAME ": duplicate key '%s' at line %d",
                           k, jerr.line);
        }
        return st_fail(TD_ERR_INVALID, ST_INDEX_NAME ": bad JSON at line %d column %d: %s",
                       jerr.line, jerr.column, jerr.text);
    }
    *out = idx;
    return TD_OK;
}

/* *out: the distinct shards of the weight map, in the order they first
 * appear (name -> its rank); each a string naming a file inside the
 * checkpoint directory. */
static td_status_t
st_index_shards(json_t *wmap, json_t **out)
{
    json_t *shards = json_object(), *val;
    const char *key;

    if (shards == NULL)
        return st_fail(TD_ERR_NOMEM, ST_INDEX_NAME ": out of memory");
    json_object_foreach(wmap, key, val) {
        const char *s = json_string_value(val);
        td_status_t rc = TD_OK;

        if (s == NULL)
            rc = st_fail(TD_ERR_INVALID, ST_INDEX_NAME ": weight_map entry '%s' is not a string",
                         key);
        else if (!st_shard_name_ok(s))
            rc = st_fail(TD_ERR_INVALID, ST_INDEX_NAME ": shard name '%s' (for tensor '%s') "
                         "leaves the checkpoint directory", s, key);
        else if (json_object_get(shards, s) == NULL &&
                 json_object_set_new(shards, s,
                                     json_integer((json_int_t)json_object_size(shards))) != 0)
            rc = st_fail(TD_ERR_NOMEM, ST_INDEX_NAME ": out of memory");
        if (rc != TD_OK) {
            json_decref(shards);
            return rc;
        }
    }
    *out = shards;
    return TD_OK;
}

/* Map and parse each shard of dir. */
static td_status_t
st_add_shards(td_st_t *st, const char *dir, json_t *shards)
{
    const char *key;
    json_t *val;

    json_object_foreach(shards, key, val) {
        char *path = st_join(dir, key);
        struct stat sb;
        td_status_t rc;

        if (path == NULL)
            return st_fail(TD_ERR_NOMEM, ST_INDEX_NAME ": out of memory");
        if (stat(path, &sb) != 0 && errno == ENOENT) {
            free(path);
            return st_fail(TD_ERR_NOT_FOUND, ST_INDEX_NAME ": shard '%s' is missing", key);
        }
        rc = st_add_file(st, path, key);
        free(path);
        if (rc != TD_OK)
            return rc;
    }
    return TD_OK;
}

/* The index and the shards agree: every tensor listed is in the shard named
 * for it, every tensor of the shards is listed; a metadata.total_size other
 * than the tensors' bytes is only warned about. */
static td_status_t
st_index_match(const td_st_t *st, json_t *idx, json_t *wmap)
{
    const char *key;
    json_t *val, *meta;

    json_object_foreach(wmap, key, val) {
        td_st_tensor_t probe = {.name = key};
        const td_st_tensor_t *t = bsearch(&probe, st->tensors, st->ntensors,
                                          sizeof(*st->tensors), st_tensor_cmp);

        if (t == NULL || strcmp(t->file, json_string_value(val)) != 0)
            return st_fail(TD_ERR_NOT_FOUND, "tensor '%s' listed in index is missing from shard '%s'",
                           key, json_string_value(val));
    }
    for (size_t i = 0; i < st->ntensors; i++) {
        if (json_object_get(wmap, st->tensors[i].name) == NULL)
            return st_fail(TD_ERR_INVALID, "tensor '%s' in shard '%s' is not listed in "
                           ST_INDEX_NAME, st->tensors[i].name, st->tensors[i].file);
    }
    meta = json_object_get(idx, "metadata");
    if (json_is_object(meta) && json_is_integer(json_object_get(meta, "total_size"))) {
        uint64_t total = 0, said = (uint64_t)json_integer_value(json_object_get(meta, "total_size"));

        for (size_t i = 0; i < st->ntensors; i++)
            total += st->tensors[i].nbytes;
        if (total != said)
            td_warn(ST_INDEX_NAME ": metadata.total_size is %" PRIu64 " but the tensors hold %"
                    PRIu64 " bytes", said, total);
    }
    return TD_OK;
}

/* A sharded checkpoint: the index at index_path, its shards in dir. */
static td_status_t
st_open_sharded(td_st_t *st, const char *dir, const char *index_path)
{
    json_t *idx, *wmap, *shards = NULL;
    td_status_t rc;

    rc = st_index_load(index_path, &idx);
    if (rc != TD_OK)
        return rc;
    wmap = json_is_object(idx) ? json_object_get(idx, "weight_map") : NULL;
    if (!json_is_object(wmap))
        rc = st_fail(TD_ERR_INVALID, ST_INDEX_NAME ": no \"weight_map\" object");
    else if ((rc = st_index_shards(wmap, &shards)) == TD_OK &&
             (rc = st_add_shards(st, dir, shards)) == TD_OK &&
             (rc = st_finalize(st)) == TD_OK)
        rc = st_index_match(st, idx, wmap);
    json_decref(shards);
    json_decref(idx);
    return rc;
}

td_status_t
td_st_open(const char *path, td_st_t **out)
{
    struct stat sb;
    td_st_t *st;
    td_status_t rc;

    if (stat(path, &sb) != 0) {
        int e = errno;
        return st_fail(e == ENOENT ? TD_ERR_NOT_FOUND : td_status_from_errno(e),
                       "%s: %s", path, strerror(e));
    }
    st = calloc(1, sizeof(*st));
    if (st == NULL)
        return st_fail(TD_ERR_NOMEM, "%s: out of memory", path);
    if (S_ISDIR(sb.st_mode)) {
        char *index = st_join(path, ST_INDEX_NAME);
        char *single = st_join(path, ST_SINGLE_NAME);

        if (index == NULL || single == NULL)
            rc = st_fail(TD_ERR_NOMEM, "%s: out of memory", path);
        else if (access(index, F_OK) == 0)
            rc = st_open_sharded(st, path, index);
        else if (access(single, F_OK) == 0) {
            rc = st_add_file(st, single, ST_SINGLE_NAME);
            if (rc == TD_OK)
                rc = st_finalize(st);
        } else
            rc = st_fail(TD_ERR_NOT_FOUND, "%s: no " ST_INDEX_NAME " or " ST_SINGLE_NAME, path);
        free(index);
        free(single);
    } else {
        const char *slash = strrchr(path, '/');
        const char *base = slash ? slash + 1 : path;

        if (strcmp(base, ST_INDEX_NAME) == 0) {
            /* the index itself names a sharded checkpoint */
            char *d = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");

            rc = d ? st_open_sharded(st, d, path) : st_fail(TD_ERR_NOMEM, "%s: out of memory", path);
            free(d);
        } else {
            rc = st_add_file(st, path, base);
            if (rc == TD_OK)
                rc = st_finalize(st);
        }
    }
    if (rc != TD_OK) {
        td_st_close(st);
        return rc;
    }
    *out = st;
    return TD_OK;
}

const td_st_tensor_t *
td_st_find(const td_st_t *st, const char *name)
{
    td_st_tensor_t probe = {.name = name};

    if (st->ntensors == 0)
        return NULL;
    return bsearch(&probe, st->tensors, st->ntensors, sizeof(*st->tensors), st_tensor_cmp);
}

size_t
td_st_count(const td_st_t *st)
{
    return st->ntensors;
}

const td_st_tensor_t *
td_st_at(const td_st_t *st, size_t i)
{
    return i < st->ntensors ? &st->tensors[i] : NULL;
}

const char *
td_st_metadata(const td_st_t *st, const char *key)
{
    if (st->metadata == NULL)
        return NULL;
    return json_string_value(json_object_get(st->metadata, key));
}

/* ==================================================================== */
/* writer                                                                */
/* ==================================================================== */

typedef struct {
    char *name;
    td_dtype_t dtype;
    int ndim;
    int64_t shape[TD_ST_MAX_DIMS];
    void *data;
    size_t nbytes;
    unsigned shard;
} st_entry_t;

struct td_st_writer {
    char *path;            /* file, or directory when sharded */
    int sharded;
    size_t max_shard;
    st_entry_t *e;
    size_t n, cap;
    json_t *names;         /* set of added names */
};

static td_status_t
st_writer_new(const char *path, int sharded, size_t max_shard, td_st_writer_t **out)
{
    td_st_writer_t *w;

    w = calloc(1, sizeof(*w));
    if (w == NULL || (w->path = strdup(path)) == NULL || (w->names = json_object()) == NULL) {
        if (w != NULL) {
            free(w->path);
            free(w);
        }
        return st_fail(TD_ERR_NOMEM, "%s: out of memory", path);
    }
    w->sharded = sharded;
    w->max_shard = max_shard;
    *out = w;
    return TD_OK;
}

td_status_t
td_st_writer_create(const char *path, td_st_writer_t **out)
{
    return st_writer_new(path, 0, 0, out);
}

td_status_t
td_st_writer_create_sharded(const char *dir, size_t max_shard_bytes, td_st_writer_t **out)
{
    if (max_shard_bytes == 0)
        return st_fail(TD_ERR_INVALID, "%s: max shard size must be positive", dir);
    return st_writer_new(dir, 1, max_shard_bytes, out);
}

void
td_st_writer_destroy(td_st_writer_t *w)
{
    if (w == NULL)
        return;
    for (size_t i = 0; i < w->n; i++) {
        free(w->e[i].name);
        free(w->e[i].data);
    }
    free(w->e);
    json_decref(w->names);
    free(w->path);
    free(w);
}

td_status_t
td_st_writer_add(td_st_writer_t *w, const char *name, td_dtype_t dt, int ndim,
                 const int64_t *shape, const void *data, size_t nbytes)
{
    st_entry_t *e;
    uint64_t need;
    char shp[256] = "[]";

    if (name == NULL || name[0] == '\0' || strcmp(name, "__metadata__") == 0)
        return st_fail(TD_ERR_INVALID, "%s: bad tensor name '%s'", w->path, name ? name : "");
    if (json_object_get(w->names, name) != NULL)
        return st_fail(TD_ERR_INVALID, "%s: duplicate tensor '%s'", w->path, name);
    if ((unsigned)dt >= TD_DT_COUNT)
        return st_fail(TD_ERR_INVALID, "%s: tensor '%s': unknown dtype %d", w->path, name, (int)dt);
    if (ndim < 0 || ndim > TD_ST_MAX_DIMS)
        return st_fail(TD_ERR_INVALID, "%s: tensor '%s': %d dimensions, at most %d", w->path,
                       name, ndim, TD_ST_MAX_DIMS);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return st_fail(TD_ERR_INVALID, "%s: tensor '%s': negative dimension", w->path, name);
    }
    td_st_shape_str(shp, sizeof(shp), ndim, shape);
    if (!st_nbytes(dt, ndim, shape, &need) || need != nbytes)
        return st_fail(TD_ERR_INVALID, "%s: tensor '%s': %zu bytes given, %s %s needs a whole "
                       "number of bytes equal to it", w->path, name, nbytes, td_dtype_name(dt), shp);
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        st_entry_t *ne = realloc(w->e, cap * sizeof(*ne));

        if (ne == NULL)
            return st_fail(TD_ERR_NOMEM, "%s: out of memory", w->path);
        w->e = ne;
        w->cap = cap;
    }
    e = &w->e[w->n];
    memset(e, 0, sizeof(*e));
    e->name = strdup(name);
    e->data = malloc(nbytes ? nbytes : 1);
    if (e->name == NULL || e->data == NULL ||
        json_object_set_new(w->names, name, json_true()) != 0) {
        free(e->name);
        free(e->data);
        return st_fail(TD_ERR_NOMEM, "%s: out of memory", w->path);
    }
    if (nbytes)
        memcpy(e->data, data, nbytes);
    e->dtype = dt;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        e->shape[i] = shape[i];
    e->nbytes = nbytes;
    w->n++;
    return TD_OK;
}

static td_status_t
st_write_all(int fd, const char *path, const void *buf, size_t len)
{
    const char *p = buf;

    while (len > 0) {
        ssize_t r = write(fd, p, len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            return st_fail(td_status_from_errno(e), "%s: write failed: %s", path, strerror(e));
        }
        p += r;
        len -= (size_t)r;
    }
    return TD_OK;
}

/* Write `buf` parts to path via path.tmp + rename. */
static td_status_t
st_write_file(const char *path, const char *header, size_t hlen, st_entry_t *e, size_t n,
              unsigned shard)
{
    size_t tlen = strlen(path) + 5;
    char *tmp = malloc(tlen);
    unsigned char len8[8];
    int fd;
    td_status_t rc;

    if (tmp == NULL)
        return st_fail(TD_ERR_NOMEM, "%s: out of memory", path);
    snprintf(tmp, tlen, "%s.tmp", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int err = errno;
        rc = st_fail(td_status_from_errno(err), "%s: cannot create: %s", tmp, strerror(err));
        free(tmp);
        return rc;
    }
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    rc = st_write_all(fd, tmp, len8, 8);
    if (rc == TD_OK)
        rc = st_write_all(fd, tmp, header, hlen);
    for (size_t i = 0; i < n && rc == TD_OK; i++) {
        if (e[i].shard == shard)
            rc = st_write_all(fd, tmp, e[i].data, e[i].nbytes);
    }
    if (close(fd) != 0 && rc == TD_OK) {
        int err = errno;
        rc = st_fail(td_status_from_errno(err), "%s: close failed: %s", tmp, strerror(err));
    }
    if (rc == TD_OK && rename(tmp, path) != 0) {
        int err = errno;
        rc = st_fail(td_status_from_errno(err), "%s: rename failed: %s", path, strerror(err));
    }
    if (rc != TD_OK)
        unlink(tmp);
    free(tmp);
    return rc;
}

/* Header JSON for the tensors of one shard, padded with spaces to 8 bytes. */
static td_status_t
st_header(const char *path, json_t *meta, st_entry_t *e, size_t n, unsigned shard,
          char **out, size_t *len)
{
    json_t *h = json_object();
    uint64_t off = 0;
    char *s, *p;
    size_t sl, pl;

    if (h == NULL)
        return st_fail(TD_ERR_NOMEM, "%s: out of memory", path);
    if (meta != NULL)
        json_object_set(h, "__metadata__", meta);
    for (size_t i = 0; i < n; i++) {
        json_t *t, *shape;

        if (e[i].shard != shard)
            continue;
        shape = json_array();
        for (int d = 0; d < e[i].ndim; d++)
            json_array_append_new(shape, json_integer(e[i].shape[d]));
        t = json_pack("{s:s, s:o, s:[I,I]}", "dtype", td_dtype_name(e[i].dtype), "shape", shape,
                      "data_offsets", (json_int_t)off, (json_int_t)(off + e[i].nbytes));
        if (t == NULL || json_object_set_new(h, e[i].name, t) != 0) {
            json_decref(h);
            return st_fail(TD_ERR_NOMEM, "%s: out of memory", path);
        }
        off += e[i].nbytes;
    }
    s = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    if (s == NULL)
        return st_fail(TD_ERR_NOMEM, "%s: out of memory", path);
    sl = strlen(s);
    pl = (sl + 7) / 8 * 8;
    p = malloc(pl);
    if (p == NULL) {
        free(s);
        return st_fail(TD_ERR_NOMEM, "%s: out of memory", path);
    }
    memcpy(p, s, sl);
    memset(p + sl, ' ', pl - sl);
    free(s);
    *out = p;
    *len = pl;
    return TD_OK;
}

static td_status_t
st_write_shard(td_st_writer_t *w, const char *path, json_t *meta, unsigned shard)
{
    char *hdr = NULL;
    size_t hlen = 0;
    td_status_t rc = st_header(path, meta, w->e, w->n, shard, &hdr, &hlen);

    if (rc == TD_OK)
        rc = st_write_file(path, hdr, hlen, w->e, w->n, shard);
    free(hdr);
    return rc;
}

static td_status_t
st_write_index(td_st_writer_t *w, unsigned nshards)
{
    json_t *idx = NULL, *wmap;
    char *path = NULL, *tmp = NULL, *text = NULL;
    uint64_t total = 0;
    char name[64];
    td_status_t rc = TD_OK;
    int fd;

    wmap = json_object();
    for (size_t i = 0; i < w->n && wmap != NULL; i++) {
        snprintf(name, sizeof(name), "model-%05u-of-%05u.safetensors", w->e[i].shard + 1, nshards);
        if (json_object_set_new(wmap, w->e[i].name, json_string(name)) != 0)
            break;
        total += w->e[i].nbytes;
    }
    if (wmap != NULL)
        idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                        "weight_map", wmap);
    path = st_join(w->path, ST_INDEX_NAME);
    tmp = st_join(w->path, ST_INDEX_NAME ".tmp");
    if (idx != NULL)
        text = json_dumps(idx, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (idx == NULL || path == NULL || tmp == NULL || text == NULL) {
        rc = st_fail(TD_ERR_NOMEM, "%s: out of memory", w->path);
        goto out;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        rc = st_fail(td_status_from_errno(e), "%s: cannot create: %s", tmp, strerror(e));
        goto out;
    }
    rc = st_write_all(fd, tmp, text, strlen(text));
    if (rc == TD_OK)
        rc = st_write_all(fd, tmp, "\n", 1);
    close(fd);
    if (rc == TD_OK && rename(tmp, path) != 0) {
        int e = errno;
        rc = st_fail(td_status_from_errno(e), "%s: rename failed: %s", path, strerror(e));
    }
out:
    free(text);
    free(path);
    free(tmp);
    json_decref(idx);
    return rc;
}

td_status_t
td_st_writer_finish(td_st_writer_t *w, const char *metadata_json)
{
    json_t *meta = NULL;
    td_status_t rc = TD_OK;
    unsigned nshards = 1;

    if (metadata_json != NULL) {
        json_error_t jerr;
        const char *k;
        json_t *v;

        meta = json_loads(metadata_json, JSON_REJECT_DUPLICATES, &jerr);
        if (!json_is_object(meta)) {
            rc = st_fail(TD_ERR_INVALID, "%s: metadata is not a JSON object%s%s", w->path,
                         meta == NULL ? ": " : "", meta == NULL ? jerr.text : "");
            goto out;
        }
        json_object_foreach(meta, k, v) {
            if (!json_is_string(v)) {
                rc = st_fail(TD_ERR_INVALID, "%s: metadata value '%s' is not a string", w->path, k);
                goto out;
            }
        }
    }
    if (w->sharded) {
        size_t cur = 0;
        unsigned s = 0;

        for (size_t i = 0; i < w->n; i++) {
            if (cur > 0 && cur + w->e[i].nbytes > w->max_shard) {
                s++;
                cur = 0;
            }
            w->e[i].shard = s;
            cur += w->e[i].nbytes;
        }
        nshards = s + 1;
        if (mkdir(w->path, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            rc = st_fail(td_status_from_errno(e), "%s: cannot create directory: %s", w->path,
                         strerror(e));
            goto out;
        }
        if (nshards == 1) {
            char *p = st_join(w->path, ST_SINGLE_NAME);

            rc = p ? st_write_shard(w, p, meta, 0) : st_fail(TD_ERR_NOMEM, "out of memory");
            free(p);
            goto out;
        }
        for (unsigned k = 0; k < nshards && rc == TD_OK; k++) {
            char name[64];
            char *p;

            snprintf(name, sizeof(name), "model-%05u-of-%05u.safetensors", k + 1, nshards);
            p = st_join(w->path, name);
            rc = p ? st_write_shard(w, p, meta, k) : st_fail(TD_ERR_NOMEM, "out of memory");
            free(p);
        }
        if (rc == TD_OK)
            rc = st_write_index(w, nshards);
    } else {
        rc = st_write_shard(w, w->path, meta, 0);
    }
out:
    json_decref(meta);
    td_st_writer_destroy(w);
    return rc;
}
