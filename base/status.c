/* base/status.c — names of td_status_t values and errno conversion. */
#include "status.h"

#include <errno.h>

const char *
td_status_str(td_status_t st)
{
    switch (st) {
    case TD_OK:              return "ok";
    case TD_INPROGRESS:      return "in progress";
    case TD_ERR_NOMEM:       return "out of memory";
    case TD_ERR_INVALID:     return "invalid argument";
    case TD_ERR_RANGE:       return "out of range";
    case TD_ERR_IO:          return "i/o error";
    case TD_ERR_CLOSED:      return "connection closed";
    case TD_ERR_TIMEOUT:     return "timeout";
    case TD_ERR_PROTO:       return "protocol error";
    case TD_ERR_TOO_BIG:     return "too big";
    case TD_ERR_AUTH:        return "authentication failed";
    case TD_ERR_MISMATCH:    return "mismatch";
    case TD_ERR_PEER:        return "peer failure";
    case TD_ERR_CANCELED:    return "canceled";
    case TD_ERR_STALE:       return "stale incarnation";
    case TD_ERR_BUSY:        return "busy";
    case TD_ERR_NOT_FOUND:   return "not found";
    case TD_ERR_UNSUPPORTED: return "not supported";
    case TD_ERR_UCX:         return "ucx error";
    case TD_ERR_CUDA:        return "cuda error";
    case TD_ERR_STATE:       return "wrong state";
    case TD_ERR_INTERNAL:    return "internal error";
    }
    return "unknown status";
}

td_status_t
td_status_from_errno(int err)
{
    switch (err) {
    case 0:            return TD_OK;
    case ENOMEM:       return TD_ERR_NOMEM;
    case EINVAL:       return TD_ERR_INVALID;
    case ERANGE:
    case EOVERFLOW:    return TD_ERR_RANGE;
    case ETIMEDOUT:    return TD_ERR_TIMEOUT;
    case ECONNRESET:
    case EPIPE:
    case ECONNREFUSED: return TD_ERR_CLOSED;
    case EAGAIN:       return TD_ERR_BUSY;
    case ENOENT:       return TD_ERR_NOT_FOUND;
    case EMSGSIZE:
    case E2BIG:        return TD_ERR_TOO_BIG;
    case ENOTSUP:      return TD_ERR_UNSUPPORTED;
    case ECANCELED:    return TD_ERR_CANCELED;
    case EACCES:
    case EPERM:        return TD_ERR_AUTH;
    default:           return TD_ERR_IO;
    }
}
