/*
 * Ticks: a clock for short intervals that costs less to read than
 * clock_gettime (util.h, ferry_ticks).  The statistics time every request
 * with two readings (at submit and at completion); with a one-request
 * batch those two CLOCK_MONOTONIC readings were ~47 ns of an 8 B write
 * that takes ~0.7 us over libfabric's shm (doc/performance.md, "The
 * engine's per-request path").
 *
 * On x86-64, where the kernel itself keeps CLOCK_MONOTONIC on the TSC (its
 * clocksource is "tsc": it found the counter invariant and in step across
 * CPUs), a tick is a TSC count, read with one instruction (~10 ns here
 * against ~23 ns), and converted to nanoseconds only where an interval is
 * counted, with a rate measured once per process against CLOCK_MONOTONIC.
 * Anywhere else a tick is a CLOCK_MONOTONIC nanosecond.
 */
#include "util.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int ferry_ticks_tsc;
uint64_t ferry_ticks_ns_mult = (uint64_t)1 << 32; /* ns = ticks * mult >> 32 */

#if FERRY_TICKS_HAVE_TSC
/* Whether the kernel's CLOCK_MONOTONIC runs on the TSC. */
static int kernel_uses_tsc(void)
{
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (f == NULL)
        return 0;
    char name[32] = "";
    int ok = fgets(name, sizeof(name), f) != NULL && strcmp(name, "tsc\n") == 0;
    fclose(f);
    return ok;
}

/* One (ns, tsc) pair, the TSC read on both sides of the clock and
 * averaged; 0 when the two reads lie far apart (preempted between them:
 * the caller takes another). */
static int clock_pair(uint64_t *ns_p, uint64_t *tsc_p)
{
    uint64_t before = __builtin_ia32_rdtsc();
    uint64_t ns = ferry_time_ns();
    uint64_t after = __builtin_ia32_rdtsc();
    if (after - before > 100000) /* tens of us at any TSC rate */
        return 0;
    *ns_p = ns;
    *tsc_p = before + (after - before) / 2;
    return 1;
}

/* The TSC's rate against CLOCK_MONOTONIC over 200 us (a spin, once per
 * process): enough for the statistics' power-of-two latency buckets. */
static void calibrate(void)
{
    if (!kernel_uses_tsc())
        return;
    uint64_t ns0 = 0, tsc0 = 0, ns1 = 0, tsc1 = 0;
    for (int tries = 0; tries < 8; tries++) {
        if (!clock_pair(&ns0, &tsc0))
            continue;
        while (ferry_time_ns() - ns0 < 200000)
            ;
        if (clock_pair(&ns1, &tsc1) && tsc1 > tsc0)
            break;
        tsc1 = tsc0;
    }
    if (tsc1 <= tsc0)
        return; /* no clean measurement: clock_gettime, as elsewhere */
    ferry_ticks_ns_mult = (uint64_t)(((unsigned __int128)(ns1 - ns0) << 32) / (tsc1 - tsc0));
    ferry_ticks_tsc = 1;
}
#else
static void calibrate(void)
{
}
#endif

void ferry_ticks_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, calibrate);
}
