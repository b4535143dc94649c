/* bench/kvtier.c — the SSD tier's cold read bandwidth (kvcache/kvtier.h):
 * N records of the `mid` model's 128-token blocks written through the tier,
 * the page cache dropped (fsync + POSIX_FADV_DONTNEED), then read back as
 * prefill hits would, in chains of 16..64 blocks (td_kvtier_get_many); next
 * to `dd` over one file of the same bytes (the tier's files end to end) in
 * the same directory after the same drop. Read twice: one chain at a time
 * (a lone request's get_many), and with td_kvtier_prefetch D chains ahead
 * (requests queued at a prefill rank: each chain's reads started when its
 * request arrives, got when its turn comes). Prints MB/s (1e6)
 * of each and their ratios to dd (docs/kvtier.md). */
#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "benchutil.h"
#include "chainhash.h"
#include "clock.h"
#include "kvtier.h"
#include "log.h"

typedef struct {
    const char *dir;
    uint64_t records;
    uint64_t payload, snapshot;
    uint32_t snapshot_every;
    uint32_t block_tokens;
    uint32_t chain_min, chain_max;
    uint32_t passes;
    uint32_t read_threads;
    uint32_t prefetch_depth;
    int keep;
} kvtierbench_opts_t;

static void
kvtierbench_usage(FILE *f)
{
    fprintf(f,
        "usage: kvtier [options]\n"
        "The SSD tier's cold read bandwidth against dd on the same directory.\n"
        "  --dir D             the tier's directory (default: a new one under /var/tmp)\n"
        "  --records N         records written (default 4096)\n"
        "  --payload B         payload bytes per record (default 24576)\n"
        "  --snapshot B        snapshot bytes (default 139264) ...\n"
        "  --snapshot-every K  ... on one record of every K (default 8; 0: none)\n"
        "  --block-tokens G    tokens per block (default 128)\n"
        "  --chain A:B         blocks per put_many and per get_many, uniform in [A, B],\n"
        "                      drawn apart for the two (default 16:64; B at most 256)\n"
        "  --passes N          passes of ours, dd, dd direct, each cold; medians (default 5)\n"
        "  --read-threads N    the tier's reader threads (default 4)\n"
        "  --prefetch-depth D  chains prefetched ahead in the second reads (default 4; 0: none)\n"
        "  --keep              leave the files\n"
        "Output: kvtier what=ours|prefetch|dd|dd-direct pass=P bytes=B s=S mbps=M, then the\n"
        "medians and ratio=R, the median of the passes' ours / the faster dd (prefetch_ratio:\n"
        "the same for the prefetch reads), then each one's range.\n"
        "dd reads dd.bin, the tier's files end to end (the same bytes).\n");
}

/* fsync and drop from the page cache every file of dir. */
static int
kvtierbench_drop(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;

    if (d == NULL)
        return -1;
    while ((de = readdir(d)) != NULL) {
        char p[4096];
        int fd;

        if (de->d_name[0] == '.')
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        if ((fd = open(p, O_RDONLY)) < 0)
            continue;
        fsync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    closedir(d);
    return 0;
}

/* Writes path as the concatenation of dir's .kvb files: dd reads the same
 * bytes as the tier; their total, 0 on failure. */
static uint64_t
kvtierbench_concat(const char *dir, const char *path)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    uint64_t total = 0;
    static char buf[1 << 20];
    int out;

    if (d == NULL)
        return 0;
    if ((out = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600)) < 0) {
        closedir(d);
        return 0;
    }
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        char p[4096];
        ssize_t got;
        int fd;

        if (len < 4 || strcmp(de->d_name + len - 4, ".kvb") != 0)
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        if ((fd = open(p, O_RDONLY)) < 0)
            continue;
        while ((got = read(fd, buf, sizeof(buf))) > 0) {
            if (write(out, buf, (size_t)got) != got) {
                total = 0;
                break;
            }
            total += (uint64_t)got;
        }
        close(fd);
    }
    closedir(d);
    if (close(out) != 0)
        total = 0;
    return total;
}

/* Runs dd over path; its seconds from dd's own line, -1 on failure. */
static double
kvtierbench_dd(const char *path, const char *iflag, uint64_t *bytes)
{
    char cmd[4300], line[512];
    double s = -1;
    FILE *p;

    snprintf(cmd, sizeof(cmd), "dd if='%s' of=/dev/null bs=1M %s 2>&1", path, iflag);
    if ((p = popen(cmd, "r")) == NULL)
        return -1;
    while (fgets(line, sizeof(line), p) != NULL) {
        unsigned long long b;
        const char *c = strstr(line, "copied, ");

        if (c != NULL && sscanf(line, "%llu bytes", &b) == 1) {
            *bytes = b;
            s = strtod(c + 8, NULL);
        }
    }
    if (pclose(p) != 0)
        return -1;
    return s;
}

static double
kvtierbench_cpu(const struct rusage *a, const struct rusage *b)
{
    return (double)(b->ru_utime.tv_sec - a->ru_utime.tv_sec + b->ru_stime.tv_sec -
                    a->ru_stime.tv_sec) +
           (double)(b->ru_utime.tv_usec - a->ru_utime.tv_usec + b->ru_stime.tv_usec -
                    a->ru_stime.tv_usec) / 1e6;
}

/* One cold pass: all n records read back in chains of chain_min..chain_max
 * blocks drawn from rng, each with one get_many; with depth > 0 each chain
 * is prefetched depth chains before its get_many. The tier's SSD bytes per
 * second (MB/s) into *mbps, its CPU seconds; -1 when a read failed. */
static int
kvtierbench_pass(td_kvtier_t *kt, const kvtierbench_opts_t *o, const uint64_t *hashes,
                 const int32_t *tokens, uint8_t *outbuf, td_kvtier_out_t *outs, uint64_t rng,
                 uint32_t depth, double *mbps, double *cpu_s, uint64_t *bytes)
{
    uint64_t n = o->records, g = o->block_tokens, nc = 0, before, ns;
    uint64_t *start = malloc((n + 1) * sizeof(*start));
    td_kvtier_stats_t a, b;
    struct rusage ru0, ru1;
    int rc = -1;

    if (start == NULL)
        return -1;
    for (uint64_t i = 0; i < n; nc++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t k = o->chain_min + (rng >> 33) % (o->chain_max - o->chain_min + 1);

        start[nc] = i;
        i += k > n - i ? n - i : k;
    }
    start[nc] = n;
    kvtierbench_drop(o->dir);
    td_kvtier_stats(kt, &a);
    getrusage(RUSAGE_SELF, &ru0);
    before = td_clock_ns();
    for (uint64_t c = 0; c < nc && depth > 0 && c < depth; c++)
        (void)td_kvtier_prefetch(kt, hashes + start[c], start[c + 1] - start[c]);
    for (uint64_t c = 0; c < nc; c++) {
        uint64_t i = start[c], k = start[c + 1] - start[c];
        size_t hit = 0;

        if (depth > 0 && c + depth < nc)
            (void)td_kvtier_prefetch(kt, hashes + start[c + depth],
                                     start[c + depth + 1] - start[c + depth]);
        for (uint64_t j = 0; j < k; j++)
            outs[j] = (td_kvtier_out_t){ outbuf + j * (o->payload + o->snapshot), o->payload,
                                         outbuf + j * (o->payload + o->snapshot) + o->payload,
                                         o->snapshot, 0, 0, 0 };
        if (td_kvtier_get_many(kt, hashes + i, k, tokens + i * g, (uint32_t)g, outs, &hit) !=
                TD_OK || hit != k) {
            fprintf(stderr, "kvtier: chain at %" PRIu64 ": %zu of %" PRIu64 " read\n", i, hit, k);
            goto out;
        }
        for (uint64_t j = 0; j < k; j++)
            if (outs[j].tier != TD_KVTIER_SSD) {
                fprintf(stderr, "kvtier: block %" PRIu64 " was not an SSD hit\n", i + j);
                goto out;
            }
    }
    ns = td_clock_ns() - before;
    getrusage(RUSAGE_SELF, &ru1);
    td_kvtier_stats(kt, &b);
    *bytes = b.bytes_read - a.bytes_read;
    *mbps = (double)*bytes / ((double)ns / 1e9) / 1e6;
    *cpu_s = kvtierbench_cpu(&ru0, &ru1);
    if (depth > 0)
        printf("kvtier prefetch blocks=%" PRIu64 " unused=%" PRIu64 " got_ssd=%" PRIu64 "\n",
               b.prefetched - a.prefetched, b.prefetch_unused - a.prefetch_unused,
               b.hits_ssd - a.hits_ssd);
    rc = 0;
out:
    free(start);
    return rc;
}

static int
kvtierbench_parse_chain(const char *s, kvtierbench_opts_t *o)
{
    unsigned a, b;

    if (sscanf(s, "%u:%u", &a, &b) != 2 || a == 0 || b < a)
        return -1;
    o->chain_min = a;
    o->chain_max = b;
    return 0;
}

int
main(int argc, char **argv)
{
    kvtierbench_opts_t o = { NULL, 4096, 24576, 139264, 8, 128, 16, 64, 5, 4, 4, 0 };
    static const struct option longopts[] = {
        { "dir", required_argument, NULL, 'd' },
        { "records", required_argument, NULL, 'n' },
        { "payload", required_argument, NULL, 'p' },
        { "snapshot", required_argument, NULL, 's' },
        { "snapshot-every", required_argument, NULL, 'e' },
        { "block-tokens", required_argument, NULL, 'g' },
        { "chain", required_argument, NULL, 'c' },
        { "passes", required_argument, NULL, 'r' },
        { "read-threads", required_argument, NULL, 't' },
        { "prefetch-depth", required_argument, NULL, 'D' },
        { "keep", no_argument, NULL, 'k' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    char tmpl[] = "/var/tmp/kvtierbench.XXXXXX";
    char big[4200];
    double *ours = NULL, *dd = NULL, *ddd = NULL, *ratio = NULL, *pf = NULL, *pfratio = NULL;
    int c, rc = 1;

    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'd': o.dir = optarg; break;
        case 'n': o.records = strtoull(optarg, NULL, 0); break;
        case 'p': o.payload = strtoull(optarg, NULL, 0); break;
        case 's': o.snapshot = strtoull(optarg, NULL, 0); break;
        case 'e': o.snapshot_every = (uint32_t)strtoul(optarg, NULL, 0); break;
        case 'g': o.block_tokens = (uint32_t)strtoul(optarg, NULL, 0); break;
        case 'c':
            if (kvtierbench_parse_chain(optarg, &o) != 0) {
                kvtierbench_usage(stderr);
                return 2;
            }
            break;
        case 'r': o.passes = (uint32_t)strtoul(optarg, NULL, 0); break;
        case 't': o.read_threads = (uint32_t)strtoul(optarg, NULL, 0); break;
        case 'D': o.prefetch_depth = (uint32_t)strtoul(optarg, NULL, 0); break;
        case 'k': o.keep = 1; break;
        case 'h': kvtierbench_usage(stdout); return 0;
        default: kvtierbench_usage(stderr); return 2;
        }
    }
    if (o.records == 0 || o.payload == 0 || o.block_tokens == 0 || o.passes == 0 ||
        o.chain_max > 256) {
        kvtierbench_usage(stderr);
        return 2;
    }
    if (o.dir == NULL) {
        if (mkdtemp(tmpl) == NULL) {
            perror("kvtier: mkdtemp");
            return 1;
        }
        o.dir = tmpl;
    }

    /* ---- write N records as one chain -------------------------------------- */
    uint64_t n = o.records, g = o.block_tokens;
    int32_t *tokens = malloc(n * g * sizeof(*tokens));
    uint64_t *hashes = malloc(n * sizeof(*hashes));
    uint8_t *payload = malloc(o.payload), *snapshot = malloc(o.snapshot ? o.snapshot : 1);
    uint32_t cmax = o.chain_max;
    uint8_t *outbuf = malloc(cmax * (o.payload + o.snapshot));
    td_kvtier_out_t *outs = calloc(cmax, sizeof(*outs));
    td_kvrec_t *recs = calloc(cmax, sizeof(*recs));
    td_kvtier_t *kt = NULL;
    td_kvtier_config_t cfg = { .host_budget = 0, .ssd_dir = o.dir, .ssd_budget = UINT64_MAX / 2,
                               .layout_hash = 1, .seed = 2, .queue_cap = 256,
                               .read_threads = o.read_threads };

    if (!tokens || !hashes || !payload || !snapshot || !outbuf || !outs || !recs)
        goto cleanup;
    for (uint64_t i = 0; i < n * g; i++)
        tokens[i] = (int32_t)(i * 2654435761u % 129280);
    for (uint64_t i = 0; i < o.payload; i++)
        payload[i] = (uint8_t)(i * 31 + 7);
    for (uint64_t i = 0; i < o.snapshot; i++)
        snapshot[i] = (uint8_t)(i * 17 + 3);
    td_chain_hashes(2, tokens, n * g, (uint32_t)g, hashes, n);
    if (td_kvtier_create(&cfg, &kt) != TD_OK)
        goto cleanup;
    /* put batches of 16..64 (chain lengths drawn apart from the reads' ones) */
    uint64_t t0 = td_clock_ns(), wrng = 12345;
    for (uint64_t i = 0; i < n;) {
        wrng = wrng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t k = o.chain_min + (wrng >> 33) % (o.chain_max - o.chain_min + 1);
        td_kvtier_stats_t st;

        if (k > n - i)
            k = n - i;
        for (uint64_t j = 0; j < k; j++) {
            uint64_t b = i + j;
            bool snap = o.snapshot_every && o.snapshot > 0 &&
                        b % o.snapshot_every == o.snapshot_every - 1;

            recs[j] = (td_kvrec_t){ hashes[b], b ? hashes[b - 1] : 2, (b + 1) * g, (uint32_t)g,
                                    tokens + b * g, payload, o.payload, snap ? snapshot : NULL,
                                    snap ? o.snapshot : 0 };
        }
        for (;;) {   /* keep the queue from dropping: wait while it is full */
            td_kvtier_stats(kt, &st);
            if (st.queued + k <= cfg.queue_cap)
                break;
            usleep(200);
        }
        if (td_kvtier_put_many(kt, recs, k) != TD_OK)
            goto cleanup;
        i += k;
    }
    td_kvtier_wait_idle(kt);
    double wsec = (double)(td_clock_ns() - t0) / 1e9;
    td_kvtier_stats_t st;
    td_kvtier_stats(kt, &st);
    printf("kvtier write records=%" PRIu64 " files=%" PRIu64 " bytes=%" PRIu64
           " s=%.3f mbps=%.1f dropped=%" PRIu64 "\n", st.ssd_records, st.ssd_files, st.ssd_bytes,
           wsec, (double)st.ssd_bytes / wsec / 1e6, st.writes_dropped);
    if (st.ssd_records != n) {
        fprintf(stderr, "kvtier: %" PRIu64 " of %" PRIu64 " records on SSD\n", st.ssd_records, n);
        goto cleanup;
    }

    /* ---- dd's file: the tier's files end to end, the same bytes ---------------- */
    uint64_t total = st.ssd_bytes;

    snprintf(big, sizeof(big), "%s/dd.bin", o.dir);
    if (kvtierbench_concat(o.dir, big) != total) {
        fprintf(stderr, "kvtier: cannot write %s\n", big);
        unlink(big);
        goto cleanup;
    }

    /* ---- passes: ours (cold reads in chains), dd, dd iflag=direct ------------- */
    ours = calloc(o.passes, sizeof(double));
    dd = calloc(o.passes, sizeof(double));
    ddd = calloc(o.passes, sizeof(double));
    ratio = calloc(o.passes, sizeof(double));
    pf = calloc(o.passes, sizeof(double));
    pfratio = calloc(o.passes, sizeof(double));

    if (!ours || !dd || !ddd || !ratio || !pf || !pfratio)
        goto cleanup;
    for (uint32_t pass = 0; pass < o.passes; pass++) {
        uint64_t rng = 0x9E3779B97F4A7C15ull + pass, bytes = 0;
        double s, cpu;

        if (kvtierbench_pass(kt, &o, hashes, tokens, outbuf, outs, rng, 0, &ours[pass], &cpu,
                             &bytes) != 0)
            goto cleanup;
        printf("kvtier what=ours pass=%u bytes=%" PRIu64 " s=%.3f mbps=%.1f cpu_s=%.3f\n", pass,
               bytes, (double)bytes / ours[pass] / 1e6, ours[pass], cpu);
        if (o.prefetch_depth > 0) {
            if (kvtierbench_pass(kt, &o, hashes, tokens, outbuf, outs, rng, o.prefetch_depth,
                                 &pf[pass], &cpu, &bytes) != 0)
                goto cleanup;
            printf("kvtier what=prefetch pass=%u depth=%u bytes=%" PRIu64 " s=%.3f mbps=%.1f "
                   "cpu_s=%.3f\n", pass, o.prefetch_depth, bytes, (double)bytes / pf[pass] / 1e6,
                   pf[pass], cpu);
        }
        kvtierbench_drop(o.dir);
        if ((s = kvtierbench_dd(big, "", &bytes)) <= 0) {
            fprintf(stderr, "kvtier: dd did not run\n");
            goto cleanup;
        }
        dd[pass] = (double)bytes / s / 1e6;
        printf("kvtier what=dd pass=%u bytes=%" PRIu64 " s=%.3f mbps=%.1f\n", pass, bytes, s, dd[pass]);
        kvtierbench_drop(o.dir);
        if ((s = kvtierbench_dd(big, "iflag=direct", &bytes)) > 0) {
            ddd[pass] = (double)bytes / s / 1e6;
            printf("kvtier what=dd-direct pass=%u bytes=%" PRIu64 " s=%.3f mbps=%.1f\n", pass,
                   bytes, s, ddd[pass]);
        }
        ratio[pass] = ours[pass] / (ddd[pass] > dd[pass] ? ddd[pass] : dd[pass]);
        pfratio[pass] = pf[pass] / (ddd[pass] > dd[pass] ? ddd[pass] : dd[pass]);
    }
    unlink(big);
    printf("kvtier records=%" PRIu64 " payload=%" PRIu64 " snapshot=%" PRIu64 "/%u chain=%u:%u "
           "read_threads=%u prefetch_depth=%u bytes=%" PRIu64 " passes=%u median: ours_mbps=%.1f "
           "prefetch_mbps=%.1f dd_mbps=%.1f dd_direct_mbps=%.1f ratio=%.2f prefetch_ratio=%.2f\n",
           n, o.payload, o.snapshot, o.snapshot_every, o.chain_min, o.chain_max, o.read_threads,
           o.prefetch_depth, total, o.passes, bench_median(ours, o.passes),
           bench_median(pf, o.passes), bench_median(dd, o.passes), bench_median(ddd, o.passes),
           bench_median(ratio, o.passes), bench_median(pfratio, o.passes));
    /* the medians left each array sorted: its spread is its ends */
    printf("kvtier range over %u passes: ours_mbps=%.1f..%.1f prefetch_mbps=%.1f..%.1f "
           "dd_mbps=%.1f..%.1f dd_direct_mbps=%.1f..%.1f ratio=%.2f..%.2f "
           "prefetch_ratio=%.2f..%.2f\n", o.passes, ours[0], ours[o.passes - 1], pf[0],
           pf[o.passes - 1], dd[0], dd[o.passes - 1], ddd[0], ddd[o.passes - 1], ratio[0],
           ratio[o.passes - 1], pfratio[0], pfratio[o.passes - 1]);
    rc = 0;

cleanup:
    if (kt != NULL) {
        if (!o.keep)
            td_kvtier_flush(kt);
        td_kvtier_destroy(kt);
    }
    if (!o.keep && o.dir == tmpl) {
        char p[4200];

        snprintf(p, sizeof(p), "%s/LOCK", o.dir);
        unlink(p);
        rmdir(o.dir);
    }
    free(pfratio);
    free(pf);
    free(ratio);
    free(ddd);
    free(dd);
    free(ours);
    free(recs);
    free(outs);
    free(outbuf);
    free(snapshot);
    free(payload);
    free(hashes);
    free(tokens);
    return rc;
}
