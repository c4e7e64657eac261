/* ferry_bench_scale's parts: the processes' coordination (fork or MPI) and
 * the counters it reads besides Ferry's own. */
#ifndef FERRY_BENCH_SCALE_H
#define FERRY_BENCH_SCALE_H

#include <stddef.h>
#include <stdint.h>

/* ---- ferry_bench_scale_coord.c: every process gives a blob of the same size
 * and gets everyone's, in process order: the exchange is also a barrier. ---- */
typedef struct scale_coord scale_coord_t;

/* Under an MPI launcher (its variables are set, and MPI is built in): the
 * job's ranks.  Otherwise `processes` children forked from here; the parent
 * only relays, and scale_coord_start returns 0 in each child, 1 in the parent
 * once every child has exited (*failed_p: one of them failed or the relay
 * did), -1 when nothing could start.  timeout_s bounds each exchange in the
 * parent: a child that does not answer in time fails the run. */
int scale_coord_start(int *argc_p, char ***argv_p, int processes, unsigned timeout_s,
                      scale_coord_t **coord_p, int *failed_p);
/* Whether this process is a rank of an MPI launcher's job (its variables). */
int scale_coord_under_launcher(void);
int scale_coord_rank(const scale_coord_t *coord);
int scale_coord_size(const scale_coord_t *coord);
int scale_coord_is_mpi(const scale_coord_t *coord);
/* 0 on success; -1 when the relay broke (a process died): the caller exits. */
int scale_coord_allgather(scale_coord_t *coord, const void *mine, size_t length, void *all);
/* The end of a process: MPI_Finalize, or the child's exit status to the parent. */
void scale_coord_finish(scale_coord_t *coord, int failed);

/* ---- ferry_bench_scale_pmix.c: PMIx calls this process made (all zero where
 * the pmix module is not built); the PMIx functions are counted on their way
 * from any module to libpmix. ---- */
enum { SCALE_PMIX_GET, SCALE_PMIX_PUT, SCALE_PMIX_COMMIT, SCALE_PMIX_FENCE, SCALE_PMIX_MAX };
void scale_pmix_counts(uint64_t counts[SCALE_PMIX_MAX]);

#endif
