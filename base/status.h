/* base/status.h — the one status type every Tandem function returns.
 * TD_OK is zero, TD_INPROGRESS positive, failures negative; foreign codes
 * (errno, ucs_status_t, cudaError_t) are converted once, at the boundary. */
#ifndef TD_STATUS_H
#define TD_STATUS_H

typedef enum {
    TD_OK               = 0,
    TD_INPROGRESS       = 1,   /* accepted; completion is reported later */

    TD_ERR_NOMEM        = -1,  /* allocation failed */
    TD_ERR_INVALID      = -2,  /* bad argument or malformed input */
    TD_ERR_RANGE        = -3,  /* value or descriptor outside its bounds */
    TD_ERR_IO           = -4,  /* system call failed */
    TD_ERR_CLOSED       = -5,  /* peer closed the connection */
    TD_ERR_TIMEOUT      = -6,  /* deadline passed */
    TD_ERR_PROTO        = -7,  /* peer broke the wire protocol */
    TD_ERR_TOO_BIG      = -8,  /* frame or buffer larger than allowed */
    TD_ERR_AUTH         = -9,  /* cluster secret proof failed */
    TD_ERR_MISMATCH     = -10, /* handshake field differs (version, model, layout) */
    TD_ERR_PEER         = -11, /* remote peer failed or is unreachable */
    TD_ERR_CANCELED     = -12, /* canceled by the caller */
    TD_ERR_STALE        = -13, /* message for an older incarnation */
    TD_ERR_BUSY         = -14, /* resource exhausted; try later */
    TD_ERR_NOT_FOUND    = -15, /* no such object */
    TD_ERR_UNSUPPORTED  = -16, /* not implemented or not supported here */
    TD_ERR_UCX          = -17, /* UCX reported an error not mapped above */
    TD_ERR_CUDA         = -18, /* CUDA runtime error */
    TD_ERR_STATE        = -19, /* operation not valid in the current state */
    TD_ERR_INTERNAL     = -20, /* a bug: an invariant did not hold */
} td_status_t;

/* Stable lower-case name of a status, e.g. "timeout"; never NULL. */
const char *td_status_str(td_status_t st);

/* Convert an errno value (positive) to a status. */
td_status_t td_status_from_errno(int err);

#endif
