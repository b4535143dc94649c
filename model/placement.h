/* model/placement.h — expert placement for expert parallelism (DEPn): which
 * rank of a DEP group holds which routed expert (one map for every layer),
 * made of contiguous ranges or read from a JSON file, replicas allowed, and
 * the rule that sends a token's expert to one of its replicas. docs/dep.md. */
#ifndef TD_PLACEMENT_H
#define TD_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Immutable once made: the ranks of a group may share one. */
typedef struct td_placement td_placement_t;

/* The most ranks a placement spans. */
#define TD_PLACEMENT_MAX_RANKS 1024u

/* The default: experts in contiguous ranges, rank r holding
 * E / n of them in order, the first E % n ranks one more (6 experts at 4
 * ranks: 2, 2, 1, 1; at 8 ranks the last two hold none). Both >= 1, ranks
 * <= TD_PLACEMENT_MAX_RANKS (TD_ERR_INVALID otherwise, logged). */
td_status_t td_placement_create_ranges(uint32_t experts, uint32_t ranks, td_placement_t **out);

/* Parse a placement file's text (docs/dep.md, "Placement file"):
 *     {"experts": 6, "ranks": [[0, 1], [2, 3], [4, 5, 0], [5]]}
 * ranks[r] lists the experts rank r holds; "experts", when present, must
 * equal experts. Refused (TD_ERR_INVALID, the reason in err, nothing
 * logged): not JSON, another shape, a count of ranks other than ranks, an
 * expert id outside [0, experts), one listed twice by a rank, an expert no
 * rank holds. */
td_status_t td_placement_parse(const char *text, size_t len, uint32_t experts, uint32_t ranks,
                               td_placement_t **out, char *err, size_t errlen);

/* Read and parse the file at path; a refusal is logged once, naming the
 * file ("placement FILE: ..."): TD_ERR_INVALID, or the read's status. */
td_status_t td_placement_load(const char *path, uint32_t experts, uint32_t ranks,
                              td_placement_t **out);

void td_placement_destroy(td_placement_t *p);

uint32_t td_placement_ranks(const td_placement_t *p);
uint32_t td_placement_experts(const td_placement_t *p);

/* Whether rank holds expert. */
bool td_placement_holds(const td_placement_t *p, uint32_t rank, uint32_t expert);

/* How many experts rank holds. */
uint32_t td_placement_held(const td_placement_t *p, uint32_t rank);

/* The ranks holding expert, ascending: *ranks points into p; the count is
 * returned (>= 1). */
uint32_t td_placement_replicas(const td_placement_t *p, uint32_t expert,
                               const uint32_t **ranks);

/* The replica that serves expert for row `row` of rank `rank`'s pass: rank
 * itself when it holds the expert, else replica (rank + row) % replicas of
 * the ascending list (round-robin over the rows). Deterministic; a single
 * replica is always chosen. */
uint32_t td_placement_route(const td_placement_t *p, uint32_t expert, uint32_t rank,
                            uint64_t row);

#endif
