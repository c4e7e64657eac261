/* The monotonic clock in seconds, for tests that bound how long a step takes. */
#ifndef FERRY_TEST_CLOCK_H
#define FERRY_TEST_CLOCK_H

#include <time.h>

static inline double test_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
