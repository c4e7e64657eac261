/* Random identifiers (engine generations). */
#include "util.h"

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

uint64_t ferry_random_u64(void)
{
    uint64_t value = 0;
    if (getrandom(&value, sizeof(value), 0) != (ssize_t)sizeof(value)) {
        /* No entropy source: still unique enough across incarnations. */
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        value = ((uint64_t)now.tv_nsec << 32) ^ (uint64_t)now.tv_sec ^ ((uint64_t)getpid() << 16);
    }
    return value ? value : 1;
}
