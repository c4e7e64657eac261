/*
 * ferry_lock_t (include/ferry/lock.h, src/util/lock.c): mutual exclusion
 * under contention from more threads than cores, and a waiter that sleeps
 * (not spins) while the holder keeps the lock, then gets it.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "../src/util/util.h"

#define THREADS 4
#define ROUNDS 200000

static ferry_lock_t counter_lock = FERRY_LOCK_INIT;
static unsigned long counter; /* counter_lock; a torn update shows as a short count */

static void *count_up(void *arg)
{
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        ferry_lock_acquire(&counter_lock);
        unsigned long seen = counter;
        if (i % 1024 == 0)
            sched_yield(); /* preempted while holding it: others must sleep, not lose */
        counter = seen + 1;
        ferry_lock_release(&counter_lock);
    }
    return NULL;
}

Test(lock, excludes_under_contention)
{
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&threads[i], NULL, count_up, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    cr_assert_eq(counter, (unsigned long)THREADS * ROUNDS);
    cr_assert_eq(atomic_load(&counter_lock.state), 0, "left held");
}

static ferry_lock_t held = FERRY_LOCK_INIT;
static atomic_int waiter_got;

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *wait_for_it(void *arg)
{
    double *cpu = arg;
    double before = cpu_seconds();
    ferry_lock_acquire(&held);
    *cpu = cpu_seconds() - before;
    atomic_store(&waiter_got, 1);
    ferry_lock_release(&held);
    return NULL;
}

Test(lock, waiter_sleeps_until_the_holder_releases)
{
    double waiter_cpu = -1;
    ferry_lock_acquire(&held);
    pthread_t waiter;
    cr_assert_eq(pthread_create(&waiter, NULL, wait_for_it, &waiter_cpu), 0);
    usleep(300 * 1000);
    cr_assert_eq(atomic_load(&waiter_got), 0, "the waiter took a held lock");
    cr_assert_eq(atomic_load(&held.state), 2, "the waiter did not mark the lock contended");
    ferry_lock_release(&held);
    pthread_join(waiter, NULL);
    cr_assert_eq(atomic_load(&waiter_got), 1);
    cr_assert_lt(waiter_cpu, 0.1, "the waiter spun for %.3f s of CPU instead of sleeping",
                 waiter_cpu);
    cr_assert_eq(atomic_load(&held.state), 0);
}
