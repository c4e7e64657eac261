/*
 * Futex waits and wakes on a 32-bit atomic word, for the objects whose last
 * touch by another thread must be a single atomic instruction: a wake names
 * the word's address and reads nothing, so the word's owner may free it as
 * soon as it sees the value it waited for (a batch's pending count).  A
 * wake on memory freed and reused meanwhile is a spurious wake-up for
 * whoever sleeps there, which every futex waiter tolerates.
 */
#include "util.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static long futex(void *word, int op, unsigned value, const struct timespec *deadline,
                  unsigned bitset)
{
    return syscall(SYS_futex, word, op | FUTEX_PRIVATE_FLAG, value, deadline, NULL, bitset);
}

int ferry_futex_wait(void *word, unsigned expected, const struct timespec *deadline)
{
    /* WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline (NULL: none). */
    if (futex(word, FUTEX_WAIT_BITSET, expected, deadline, FUTEX_BITSET_MATCH_ANY) == 0)
        return 0;
    return errno == ETIMEDOUT ? ETIMEDOUT : 0; /* EAGAIN, EINTR: look again */
}

void ferry_futex_wake(void *word, int waiters)
{
    futex(word, FUTEX_WAKE, (unsigned)waiters, NULL, 0);
}
