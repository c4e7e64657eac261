/*
 * A segment's copiers: the requests in flight whose transport copies
 * one-sided (shm, cxl, ucx: the initiator writes the peer's memory and the
 * peer checks nothing).  They make the unregister rule hold: when the
 * owner's ferry_unregister returns, no copy into the range is in flight and
 * none can start.  The owner's INVALIDATE marks the segment changed, then
 * waits here until the copies counted in before that have ended; a copy
 * counted in after it sees the change and resolves anew.
 *
 *   enter:      count in (RMW, seq_cst), then read the segment's version
 *               (a run of requests to one segment counts in at once)
 *   invalidate: change the version (seq_cst store), then read the counts
 * Either the entering copy sees the new version, or the invalidation sees
 * the copy's count: never neither.
 *
 * Two counts, by epoch, so that a drain waits only for the copies that
 * began before it: new ones go to the other count, and a steady stream of
 * short copies cannot keep the drained count above zero.  Each count's
 * word holds the number of copies and COPIERS_SLEEPER (a drain sleeps on
 * it, a futex): the exit that brings it to zero is the copy's last touch
 * of the segment and wakes the drain.
 */
#include "core.h"

#include <errno.h>
#include <limits.h>
#include <time.h>

#define COPIERS_SLEEPER 0x80000000u
#define COPIERS_COUNT(word) ((word) & ~COPIERS_SLEEPER)

ferry_status_t ferry_segment_copier_enter(ferry_segment_t *segment, uint64_t version,
                                          unsigned copies, int *epoch_p)
{
    int epoch = atomic_load_explicit(&segment->copier_epoch, memory_order_relaxed) & 1;
    atomic_fetch_add_explicit(&segment->copiers[epoch], copies, memory_order_seq_cst);
    if (version != 0 && atomic_load_explicit(&segment->version, memory_order_seq_cst) == version) {
        *epoch_p = epoch;
        return FERRY_OK;
    }
    ferry_segment_copier_exit(segment, epoch, copies);
    return FERRY_ERR_STALE;
}

void ferry_segment_copier_exit(ferry_segment_t *segment, int epoch, unsigned copies)
{
    atomic_uint *count = &segment->copiers[epoch];
    if (atomic_fetch_sub_explicit(count, copies, memory_order_release) ==
        (COPIERS_SLEEPER | copies))
        ferry_futex_wake(count, INT_MAX);
}

/* Until that count is zero or the deadline (NULL: none) passed. */
static ferry_status_t wait_zero(atomic_uint *count, const struct timespec *deadline)
{
    unsigned word = atomic_load_explicit(count, memory_order_seq_cst);
    while (COPIERS_COUNT(word) > 0) {
        if (!(word & COPIERS_SLEEPER) &&
            !atomic_compare_exchange_weak_explicit(count, &word, word | COPIERS_SLEEPER,
                                                   memory_order_seq_cst,
                                                   memory_order_seq_cst))
            continue;
        if (ferry_futex_wait(count, word | COPIERS_SLEEPER, deadline) == ETIMEDOUT &&
            COPIERS_COUNT(atomic_load(count)) > 0)
            return FERRY_ERR_TIMEOUT;
        word = atomic_load_explicit(count, memory_order_seq_cst);
    }
    return FERRY_OK;
}

ferry_status_t ferry_segment_copiers_drain(ferry_segment_t *segment, unsigned timeout_ms)
{
    struct timespec deadline;
    ferry_deadline_after_ms(&deadline, CLOCK_MONOTONIC, timeout_ms);
    /* One drain at a time per segment: each flips the epoch once. */
    pthread_mutex_lock(&segment->drain_lock);
    int old = atomic_fetch_xor_explicit(&segment->copier_epoch, 1, memory_order_seq_cst) & 1;
    /* The count new copies go to now was drained before and may keep that
     * drain's sleeper bit, which would make every exit to zero a system
     * call; nobody sleeps on it now (drains are serialized). */
    atomic_fetch_and(&segment->copiers[old ^ 1], ~COPIERS_SLEEPER);
    ferry_status_t status = wait_zero(&segment->copiers[old], &deadline);
    pthread_mutex_unlock(&segment->drain_lock);
    return status;
}

void ferry_segment_copiers_wait_all(ferry_segment_t *segment)
{
    for (int epoch = 0; epoch < 2; epoch++)
        wait_zero(&segment->copiers[epoch], NULL);
}
