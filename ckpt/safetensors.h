/* ckpt/safetensors.h — safetensors checkpoints: open one file or a directory
 * (model.safetensors, or model.safetensors.index.json over shards) through mmap
 * with strict header validation, and write files or sharded checkpoints.
 * Format notes and every error message: docs/weights.md. */
#ifndef TD_SAFETENSORS_H
#define TD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Element types, named after the safetensors header codes. */
typedef enum {
    TD_DT_BOOL = 0,   /* "BOOL", 1 byte */
    TD_DT_U8,         /* "U8" */
    TD_DT_I8,         /* "I8" */
    TD_DT_F8_E5M2,    /* "F8_E5M2" */
    TD_DT_F8_E4M3,    /* "F8_E4M3" (torch float8_e4m3fn) */
    TD_DT_E8M0,       /* "F8_E8M0" (torch float8_e8m0fnu) */
    TD_DT_F4,         /* "F4": two e2m1 codes a byte; the header shape is logical */
    TD_DT_I16,        /* "I16" */
    TD_DT_U16,        /* "U16" */
    TD_DT_F16,        /* "F16" */
    TD_DT_BF16,       /* "BF16" */
    TD_DT_I32,        /* "I32" */
    TD_DT_U32,        /* "U32" */
    TD_DT_F32,        /* "F32" */
    TD_DT_I64,        /* "I64" */
    TD_DT_U64,        /* "U64" */
    TD_DT_F64,        /* "F64" */
    TD_DT_COUNT
} td_dtype_t;

/* Header code ("BF16"); "?" for a value outside the enum. */
const char *td_dtype_name(td_dtype_t dt);
/* Header code -> dtype; TD_ERR_NOT_FOUND for an unknown code. */
td_status_t td_dtype_parse(const char *name, td_dtype_t *out);
/* Bits per element: 4 for F4, else 8 * bytes. */
unsigned td_dtype_bits(td_dtype_t dt);
/* A shape as messages print it, "[2,3]" ("[]" for a scalar), cut to len. */
void td_st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape);

#define TD_ST_MAX_DIMS 8

/* One tensor. `data` points into the mapping (valid until td_st_close) and is
 * aligned only as far as the file aligns it (writers here pad headers to 8).
 * For F4 the shape is the logical one: nbytes = elements / 2. */
typedef struct {
    const char *name;
    td_dtype_t dtype;
    int ndim;                         /* 0 for a scalar */
    int64_t shape[TD_ST_MAX_DIMS];
    const void *data;
    size_t nbytes;
    const char *file;                 /* shard file name it lives in */
} td_st_tensor_t;

/* An opened checkpoint; owns the mappings, the names and the metadata. */
typedef struct td_st td_st_t;

/* Open `path`: a .safetensors file, a model.safetensors.index.json, or a
 * directory holding model.safetensors.index.json (sharded) or model.safetensors. Every header is
 * validated before *out is set. Like every td_st_* call that fails, it logs
 * why once, at error level, naming the file, e.g.
 * "model-00002-of-00003.safetensors: truncated: header says 1234 bytes, file
 * has 1000", and returns the status; the caller logs nothing more. */
td_status_t td_st_open(const char *path, td_st_t **out);
void td_st_close(td_st_t *st);

/* Lookup by name (binary search); NULL if absent. */
const td_st_tensor_t *td_st_find(const td_st_t *st, const char *name);
/* Tensors in name order, 0 <= i < td_st_count(). */
size_t td_st_count(const td_st_t *st);
const td_st_tensor_t *td_st_at(const td_st_t *st, size_t i);
/* A `__metadata__` value of the (first) file; NULL if absent. */
const char *td_st_metadata(const td_st_t *st, const char *key);
/* Number of elements: the product of the shape (1 for a scalar). */
int64_t td_st_numel(const td_st_tensor_t *t);
/* Drop the pages that lie wholly inside t's bytes from the process's memory
 * (the mapping stays valid: read again, they come back from the file). A
 * loader calls it on what it has copied, so a checkpoint is not held twice. */
void td_st_release(const td_st_tensor_t *t);

/* ---- writing ---------------------------------------------------------------
 * A writer collects tensors (it copies their bytes) and writes them on finish:
 * one file (td_st_writer_create), or a directory with model-0000k-of-0000n
 * shards of at most max_shard_bytes of tensor data each plus
 * model.safetensors.index.json (td_st_writer_create_sharded; a checkpoint that
 * fits one shard is written as model.safetensors with no index, like
 * transformers' save_pretrained). Files are written to "<name>.tmp" and renamed.
 * Headers are padded with spaces to a multiple of 8 bytes. */
typedef struct td_st_writer td_st_writer_t;

td_status_t td_st_writer_create(const char *path, td_st_writer_t **out);
td_status_t td_st_writer_create_sharded(const char *dir, size_t max_shard_bytes,
                                        td_st_writer_t **out);
/* Checks the name (non-empty, not "__metadata__", not yet added), the shape
 * (ndim <= TD_ST_MAX_DIMS, dims >= 0) and nbytes against dtype x shape. */
td_status_t td_st_writer_add(td_st_writer_t *w, const char *name, td_dtype_t dt,
                             int ndim, const int64_t *shape, const void *data,
                             size_t nbytes);
/* Writes everything and frees the writer, whatever the outcome.
 * metadata_json: NULL or a JSON object of string values, stored as
 * `__metadata__` in every file. */
td_status_t td_st_writer_finish(td_st_writer_t *w, const char *metadata_json);
/* Abandons an unfinished writer; nothing is written. NULL is a no-op. */
void td_st_writer_destroy(td_st_writer_t *w);

#endif
