/* tests/fuzz/fuzz_safetensors.c — the safetensors reader (ckpt/safetensors.c)
 * on arbitrary files: one file (its header length, header JSON, tensor table
 * and the tiling of the data region), or a sharded checkpoint (an index
 * model.safetensors.index.json and shards "a.safetensors", "b.safetensors"),
 * written to a scratch directory and opened with td_st_open. Checks on an
 * accepted checkpoint: tensors are sorted and found by name, their shapes give
 * their byte counts, their data lie inside the file, and for one file they
 * tile the data region exactly. Input: a byte of choices; then the file; or
 * for sharded, index FUZZ_SEP a FUZZ_SEP b. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"
#include "safetensors.h"

static char st_dir[64];
static volatile char st_sink;

static void
st_cleanup(void)
{
    static const char *const names[] = { "model.safetensors", "model.safetensors.index.json",
                                         "a.safetensors", "b.safetensors" };
    char path[128];

    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", st_dir, names[i]);
        unlink(path);
    }
    rmdir(st_dir);
}

static void
st_put(const char *name, const uint8_t *p, size_t n)
{
    char path[128];
    int fd;

    snprintf(path, sizeof path, "%s/%s", st_dir, name);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(n == 0 || write(fd, p, n) == (ssize_t)n);
    close(fd);
}

static void
st_drop(const char *name)
{
    char path[128];

    snprintf(path, sizeof path, "%s/%s", st_dir, name);
    unlink(path);
}

/* The file's header length (the first 8 bytes, little-endian). */
static uint64_t
st_hlen(const uint8_t *p, size_t n)
{
    uint64_t h = 0;

    for (int i = 7; i >= 0 && n >= 8; i--)
        h = h << 8 | p[i];
    return h;
}

static void
st_check(const td_st_t *st, const fuzz_in_t *single)
{
    size_t n = td_st_count(st);
    uint64_t total = 0;
    const char *lo = NULL;

    for (size_t i = 0; i < n; i++) {
        const td_st_tensor_t *t = td_st_at(st, i);
        char shape[128];
        int64_t numel = td_st_numel(t);

        FUZZ_CHECK(t && t->name && t->name[0] && t->file);
        FUZZ_CHECK(td_st_find(st, t->name) == t);
        FUZZ_CHECK(i == 0 || strcmp(td_st_at(st, i - 1)->name, t->name) < 0);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= TD_ST_MAX_DIMS && t->dtype < TD_DT_COUNT);
        FUZZ_CHECK(numel >= 0 && (uint64_t)numel * td_dtype_bits(t->dtype) / 8 == t->nbytes);
        td_st_shape_str(shape, sizeof shape, t->ndim, t->shape);
        (void)td_dtype_name(t->dtype);
        total += t->nbytes;
        if (t->nbytes)
            FUZZ_CHECK(t->data != NULL);
        if (single && (lo == NULL || (const char *)t->data < lo))
            lo = t->data;
    }
    (void)td_st_metadata(st, "format");
    if (single) {
        /* The tensors tile what follows the header, in the mapped file. */
        uint64_t data_len = single->n - 8 - st_hlen(single->p, single->n);

        FUZZ_CHECK(total == data_len);
        for (size_t i = 0; i < n; i++) {
            const td_st_tensor_t *t = td_st_at(st, i);

            FUZZ_CHECK((const char *)t->data >= lo);
            FUZZ_CHECK((uint64_t)((const char *)t->data - lo) + t->nbytes <= data_len);
            if (t->nbytes) {   /* touch both ends: a bad offset faults */
                st_sink += ((const volatile char *)t->data)[0];
                st_sink += ((const volatile char *)t->data)[t->nbytes - 1];
            }
        }
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in_t in = { data, size };
    uint8_t c = fuzz_u8(&in);
    char path[128];
    td_st_t *st = NULL;
    td_status_t rc;

    if (st_dir[0] == '\0') {
        const char *tmp = getenv("TMPDIR");

        fuzz_log_quiet();
        if (tmp == NULL || *tmp == '\0' || strlen(tmp) >= 40)   /* memory first: speed */
            tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(st_dir, sizeof st_dir, "%s/td-fuzz-st-XXXXXX", tmp);
        FUZZ_CHECK(mkdtemp(st_dir) != NULL);
        atexit(st_cleanup);
    }
    if (c & 1) {
        fuzz_in_t idx = fuzz_piece(&in), a = fuzz_piece(&in), b = in;

        st_drop("model.safetensors");
        st_put("model.safetensors.index.json", idx.p, idx.n);
        st_put("a.safetensors", a.p, a.n);
        if (c & 2)
            st_put("b.safetensors", b.p, b.n);
        else
            st_drop("b.safetensors");
        /* the directory, or the index named directly */
        snprintf(path, sizeof path, "%s%s", st_dir, c & 4 ? "/model.safetensors.index.json" : "");
        rc = td_st_open(path, &st);
        if (rc == TD_OK)
            st_check(st, NULL);
    } else {
        st_drop("model.safetensors.index.json");
        st_put("model.safetensors", in.p, in.n);
        snprintf(path, sizeof path, "%s%s", st_dir, c & 4 ? "/model.safetensors" : "");
        rc = td_st_open(path, &st);
        if (rc == TD_OK)
            st_check(st, &in);
    }
    if (rc != TD_OK)
        FUZZ_CHECK(st == NULL);
    td_st_close(st);
    return 0;
}
