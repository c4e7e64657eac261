/*
 * PMIx calls counted on the client side, for ferry_bench_scale's report of
 * what each store costs.  The pmix module is not changed for it: this
 * executable defines PMIx_Get, PMIx_Put, PMIx_Commit and PMIx_Fence and
 * exports them (ferry_bench_scale.dynlist; pmix.h declares them with default
 * visibility, past -fvisibility=hidden), so the dynamic linker binds the
 * module's calls -- and MPI's own, which the benchmark leaves out by taking
 * differences around its Ferry phase -- to these, which count and pass the
 * call on to libpmix (linked to this executable, so RTLD_NEXT finds it).
 * Built where the pmix module is; elsewhere every count is zero.
 */
#include <config.h>

#include "ferry_bench_scale.h"

#include <stdatomic.h>

static atomic_uint_fast64_t calls[SCALE_PMIX_MAX];

#ifdef FERRY_SCALE_PMIX_COUNT
#include <dlfcn.h>
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>

/* The next definition of name: libpmix's.  Without it nothing can go on. */
static void *real(const char *name)
{
    void *fn = dlsym(RTLD_NEXT, name);
    if (fn == NULL) {
        fprintf(stderr, "ferry_bench_scale: %s not found past the counter: %s\n", name,
                dlerror());
        abort();
    }
    return fn;
}

/* Count the call, and find the real function once (any thread may be first). */
#define COUNTED(which, type, name)                                                            \
    static _Atomic(type) real_slot;                                                           \
    atomic_fetch_add_explicit(&calls[which], 1, memory_order_relaxed);                        \
    type real_fn = atomic_load_explicit(&real_slot, memory_order_acquire);                    \
    if (real_fn == NULL) {                                                                    \
        real_fn = (type)real(name);                                                           \
        atomic_store_explicit(&real_slot, real_fn, memory_order_release);                     \
    }

typedef pmix_status_t (*get_fn)(const pmix_proc_t *, const char[], const pmix_info_t[], size_t,
                                pmix_value_t **);
typedef pmix_status_t (*put_fn)(pmix_scope_t, const char[], pmix_value_t *);
typedef pmix_status_t (*commit_fn)(void);
typedef pmix_status_t (*fence_fn)(const pmix_proc_t[], size_t, const pmix_info_t[], size_t);

pmix_status_t PMIx_Get(const pmix_proc_t *proc, const char key[], const pmix_info_t info[],
                       size_t ninfo, pmix_value_t **val)
{
    COUNTED(SCALE_PMIX_GET, get_fn, "PMIx_Get");
    return real_fn(proc, key, info, ninfo, val);
}

pmix_status_t PMIx_Put(pmix_scope_t scope, const char key[], pmix_value_t *val)
{
    COUNTED(SCALE_PMIX_PUT, put_fn, "PMIx_Put");
    return real_fn(scope, key, val);
}

pmix_status_t PMIx_Commit(void)
{
    COUNTED(SCALE_PMIX_COMMIT, commit_fn, "PMIx_Commit");
    return real_fn();
}

pmix_status_t PMIx_Fence(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                         size_t ninfo)
{
    COUNTED(SCALE_PMIX_FENCE, fence_fn, "PMIx_Fence");
    return real_fn(procs, nprocs, info, ninfo);
}

/* A direct reference, so that the linker keeps libpmix among this
 * executable's libraries (--as-needed would drop it) and RTLD_NEXT finds it. */
const char *scale_pmix_version(void);
const char *scale_pmix_version(void)
{
    return PMIx_Get_version();
}
#endif

void scale_pmix_counts(uint64_t counts[SCALE_PMIX_MAX])
{
    for (int i = 0; i < SCALE_PMIX_MAX; i++)
        counts[i] = atomic_load_explicit(&calls[i], memory_order_relaxed);
}
