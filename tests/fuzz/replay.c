/* tests/fuzz/replay.c — runs a harness (LLVMFuzzerTestOneInput) on every file
 * of the given directories or files, in name order, without libFuzzer: the
 * saved corpora are replayed this way by meson test, under the sanitizers in
 * the ASan build. An argument with no input in it fails (a corpus that went
 * missing must not pass). Usage: replay-NAME DIR|FILE... */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

/* Read path whole into a buffer of exactly its size (so that a harness
 * reading past the input is caught by ASan); 0 on success. */
static int
replay_read(const char *path, uint8_t **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    struct stat sb;
    uint8_t *buf;

    if (f == NULL || fstat(fileno(f), &sb) != 0) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        if (f)
            fclose(f);
        return -1;
    }
    buf = malloc(sb.st_size ? (size_t)sb.st_size : 1);
    if (buf == NULL || fread(buf, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size) {
        fprintf(stderr, "replay: %s: cannot read %lld bytes\n", path, (long long)sb.st_size);
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    *out = buf;
    *len = (size_t)sb.st_size;
    return 0;
}

static int
replay_file(const char *path)
{
    uint8_t *buf;
    size_t len;

    if (replay_read(path, &buf, &len) != 0)
        return -1;
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return 0;
}

static int
replay_name_cmp(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int
replay_skip(const struct dirent *d)
{
    return d->d_name[0] != '.';
}

/* Every file of dir; the number replayed, or -1. */
static long
replay_dir(const char *dir)
{
    struct dirent **names;
    int n = scandir(dir, &names, replay_skip, replay_name_cmp);
    long done = 0;
    int failed = 0;

    if (n < 0) {
        fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        size_t len = strlen(dir) + strlen(names[i]->d_name) + 2;
        char *path = malloc(len);

        if (path == NULL || (snprintf(path, len, "%s/%s", dir, names[i]->d_name),
                             replay_file(path) != 0))
            failed = 1;
        else
            done++;
        free(path);
        free(names[i]);
    }
    free(names);
    return failed ? -1 : done;
}

int
main(int argc, char **argv)
{
    long total = 0;

    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR|FILE...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        long n;

        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        n = S_ISDIR(sb.st_mode) ? replay_dir(argv[i]) : replay_file(argv[i]) == 0 ? 1 : -1;
        if (n < 0)
            return 1;
        if (n == 0) {
            fprintf(stderr, "replay: %s: no inputs\n", argv[i]);
            return 1;
        }
        printf("replay: %s: %ld inputs\n", argv[i], n);
        total += n;
    }
    printf("replay: %ld inputs, no crash\n", total);
    return 0;
}
