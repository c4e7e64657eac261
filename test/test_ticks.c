/*
 * Ticks (src/util/ticks.c): the statistics' clock.  An interval read in
 * ticks and converted to nanoseconds lies within the CLOCK_MONOTONIC
 * readings taken around it, and is at least the sleep inside it.
 */
#include <criterion/criterion.h>

#include <time.h>

#include "../src/util/util.h"

static uint64_t monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

/* One interval of about sleep_ns: fails when its ticks, converted, fall
 * outside [the sleep, the clock readings around it] (0.5 % of slack for
 * the rate's measurement). */
static void check_interval(uint64_t sleep_ns)
{
    uint64_t outer0 = monotonic_ns();
    uint64_t t0 = ferry_ticks();
    struct timespec pause = {.tv_sec = (time_t)(sleep_ns / 1000000000u),
                             .tv_nsec = (long)(sleep_ns % 1000000000u)};
    while (nanosleep(&pause, &pause) != 0)
        ;
    uint64_t t1 = ferry_ticks();
    uint64_t outer = monotonic_ns() - outer0;
    uint64_t ns = ferry_ticks_to_ns(t1 - t0);
    cr_assert_geq(ns, sleep_ns - sleep_ns / 200, "%llu ns measured over a %llu ns sleep",
                  (unsigned long long)ns, (unsigned long long)sleep_ns);
    cr_assert_leq(ns, outer + outer / 200, "%llu ns measured within %llu ns",
                  (unsigned long long)ns, (unsigned long long)outer);
}

Test(ticks, intervals_convert_to_the_monotonic_clock_s_nanoseconds)
{
    ferry_ticks_init();
    ferry_ticks_init(); /* once per process: the second call changes nothing */
    check_interval(2000000);  /* 2 ms */
    check_interval(30000000); /* 30 ms */
    /* An interval the statistics see at most: seconds convert without
     * overflow (the rate multiplies 128-bit). */
    uint64_t one_minute = (uint64_t)60 * 1000000000u;
    uint64_t ticks = one_minute;
#if FERRY_TICKS_HAVE_TSC
    if (ferry_ticks_tsc)
        ticks = (uint64_t)(((unsigned __int128)one_minute << 32) / ferry_ticks_ns_mult);
#endif
    uint64_t ns = ferry_ticks_to_ns(ticks);
    cr_assert(ns > one_minute - one_minute / 1000 && ns < one_minute + one_minute / 1000,
              "a minute of ticks is %llu ns", (unsigned long long)ns);
}
