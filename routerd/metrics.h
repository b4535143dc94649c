/* routerd/metrics.h — the router's counters and latency histograms, and their
 * Prometheus text rendering (route-metrics.c adds the per-rank gauges). */
#ifndef TD_ROUTERD_METRICS_H
#define TD_ROUTERD_METRICS_H

#include <stdint.h>

#include "buf.h"
#include "status.h"

/* How a request ended. */
typedef enum {
    TD_OUTCOME_DONE = 0,    /* answered: stop or length */
    TD_OUTCOME_FAILED,      /* an error after it was accepted */
    TD_OUTCOME_CANCELED,    /* client gone, operator cancel */
    TD_OUTCOME_REJECTED,    /* refused before scheduling: 4xx, 503 */
    TD_OUTCOME_N
} td_outcome_t;

/* Why something failed; every error response and error event counts once. */
typedef enum {
    TD_ERRREASON_BAD_REQUEST = 0,  /* 400 */
    TD_ERRREASON_UNAUTHORIZED,     /* 401 */
    TD_ERRREASON_NOT_FOUND,        /* 404 */
    TD_ERRREASON_TOO_LARGE,        /* 413 */
    TD_ERRREASON_NO_CAPACITY,      /* 503: no rank could take it (none up, all tried) */
    TD_ERRREASON_QUEUE_FULL,       /* 503: no room now, and the admission queue is full */
    TD_ERRREASON_QUEUE_TIMEOUT,    /* 503: waited in the admission queue past its deadline */
    TD_ERRREASON_TOO_LONG,         /* prompt + max_tokens over every context */
    TD_ERRREASON_RANK_LOST,        /* a rank's connection ended mid-request */
    TD_ERRREASON_PREFILL_FAILED,   /* PrefillDone with an error */
    TD_ERRREASON_DECODE_FAILED,    /* Tokens{error} */
    TD_ERRREASON_TIMEOUT,          /* --request-timeout */
    TD_ERRREASON_SHUTDOWN,         /* refused or ended by the router's shutdown */
    TD_ERRREASON_INTERNAL,         /* our bug or out of memory */
    TD_ERRREASON_SLOW_READER,      /* a stream's client read too slowly (backpressure) */
    TD_ERRREASON_N
} td_errreason_t;

#define TD_METRICS_NBUCKETS 16

/* A histogram in seconds; buckets are fixed (metrics.c): latencies
 * (td_metrics_observe) or waits in the admission queue (_observe_wait). */
typedef struct {
    uint64_t counts[TD_METRICS_NBUCKETS + 1];  /* last: +Inf */
    uint64_t n;
    double sum;
} td_metrics_hist_t;

typedef struct {
    uint64_t requests[TD_OUTCOME_N];
    uint64_t errors[TD_ERRREASON_N];
    td_metrics_hist_t ttft;         /* request received -> first token sent */
    td_metrics_hist_t itl;          /* between token messages of one request */
    td_metrics_hist_t queue_wait;   /* each stay in the admission queue (wait buckets) */
    uint64_t kv_bytes_moved;        /* KV bytes of finished prefills (from the layout) */
    uint64_t prompt_tokens;
    uint64_t completion_tokens;
    uint64_t retries;               /* re-admissions (AdmitReject, a rank lost) */
    /* multi-turn on the decode ranks (docs/kvcache.md, "Multi-turn") */
    uint64_t kept_noted;            /* finished requests whose state a decode rank kept */
    uint64_t continue_sent;         /* requests sent to continue a kept state */
    uint64_t continue_refused;      /*   of them refused by the rank (admitted anew) */
    uint64_t continue_kept_tokens;  /* prompt tokens those requests took from kept states */
    uint64_t continue_suffix_tokens;/* prompt tokens their decode ranks prefilled */
    /* backpressure of streams (docs/routerd.md, "Backpressure") */
    uint64_t streams_paused;        /* times a stream's decode row was paused */
    uint64_t streams_resumed;       /*   and resumed */
    uint64_t slow_timeout;          /* streams canceled: paused past slow-reader-timeout */
    uint64_t slow_evicted;          /*   the decode rank's paused budget was full */
    uint64_t paused_now;            /* streams paused now */
} td_metrics_t;

const char *td_metrics_outcome_str(td_outcome_t o);
const char *td_metrics_errreason_str(td_errreason_t r);
void td_metrics_observe(td_metrics_hist_t *h, double seconds);
void td_metrics_observe_wait(td_metrics_hist_t *h, double seconds);

/* Append "# HELP", "# TYPE" and the series of the counters and histograms. */
td_status_t td_metrics_render(const td_metrics_t *m, td_buf_t *out);
/* Append "# HELP name help\n# TYPE name type\n". */
td_status_t td_metrics_header(td_buf_t *out, const char *name, const char *type,
                              const char *help);

#endif
