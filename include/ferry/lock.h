/*
 * ferry_lock_t: a mutex for the paths a small transfer takes, for the core
 * and for plugins.  Taking and releasing one nobody else holds is one
 * atomic instruction each, inline; pthread_mutex_lock and _unlock took 31
 * and 26 instructions through their calls, twice per 8-byte write.  A
 * thread that finds it held spins a little, then sleeps on a futex until
 * the holder lets go.  Zero (FERRY_LOCK_INIT, or memory from calloc) is
 * unlocked.  Not recursive; no condition variables wait on it.
 *
 * C11 only (stdatomic.h): plugin.h does not include it.
 */
#ifndef FERRY_LOCK_H
#define FERRY_LOCK_H

#include <stdatomic.h>

#include <ferry/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_lock {
    atomic_int state; /* 0 free, 1 held, 2 held and someone sleeps on it */
} ferry_lock_t;

#define FERRY_LOCK_INIT {0}

/* The slow paths: wait until the lock is ours; wake one sleeper. */
FERRY_API void ferry_lock_wait(ferry_lock_t *lock);
FERRY_API void ferry_lock_wake(ferry_lock_t *lock);

static inline void ferry_lock_acquire(ferry_lock_t *lock)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong_explicit(&lock->state, &expected, 1,
                                                 memory_order_acquire, memory_order_relaxed))
        ferry_lock_wait(lock);
}

static inline void ferry_lock_release(ferry_lock_t *lock)
{
    if (atomic_exchange_explicit(&lock->state, 0, memory_order_release) == 2)
        ferry_lock_wake(lock);
}

#ifdef __cplusplus
}
#endif

#endif
