/*
 * ferry_lock_t's slow paths (the fast ones are inline in ferry/lock.h): the
 * three-state futex mutex of Drepper's "Futexes Are Tricky".  A waiter
 * marks the lock contended (2) and sleeps while it stays so; the holder
 * that releases a contended lock wakes one.  A short spin first: the
 * holders here keep it for a copy of a few bytes.
 */
#include "util.h"

#define SPINS 64

void ferry_lock_wait(ferry_lock_t *lock)
{
    for (int i = 0; i < SPINS; i++) {
        int expected = 0;
        if (atomic_load_explicit(&lock->state, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_weak_explicit(&lock->state, &expected, 1,
                                                  memory_order_acquire, memory_order_relaxed))
            return;
        ferry_cpu_relax();
    }
    /* From here on we may sleep, so the lock is taken as contended: its
     * release then wakes the next sleeper, whether or not that is us. */
    while (atomic_exchange_explicit(&lock->state, 2, memory_order_acquire) != 0)
        ferry_futex_wait(&lock->state, 2, NULL);
}

void ferry_lock_wake(ferry_lock_t *lock)
{
    ferry_futex_wake(&lock->state, 1);
}
