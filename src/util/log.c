/* Logging: one line per event to stderr, level from FERRY_LOG_LEVEL. */
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int ferry_log_level_current = FERRY_LOG_WARN;

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

void ferry_log_init(void)
{
    const char *value = getenv("FERRY_LOG_LEVEL");
    if (value == NULL || *value == '\0')
        return;
    for (size_t i = 0; i < FERRY_ARRAY_SIZE(level_names); i++) {
        if (strcasecmp(value, level_names[i]) == 0) {
            ferry_log_level_current = (int)i;
            return;
        }
    }
    fprintf(stderr, "ferry: warn: FERRY_LOG_LEVEL=%s is not one of error, warn, info, "
                    "debug, trace; using warn\n", value);
}

void ferry_log_write(ferry_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);

    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    /* one fprintf so lines from several threads do not interleave */
    fprintf(stderr, "[%ld.%06ld] ferry[%d] %s %s:%d %s\n", (long)now.tv_sec,
            now.tv_nsec / 1000, (int)getpid(), level_names[level], base, line, message);
}

uint64_t ferry_time_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

uint64_t ferry_time_us(void)
{
    return ferry_time_ns() / 1000u;
}

void ferry_deadline_after_us(struct timespec *deadline_p, int clock, uint64_t timeout_us)
{
    clock_gettime((clockid_t)clock, deadline_p);
    deadline_p->tv_sec += (time_t)(timeout_us / 1000000u);
    deadline_p->tv_nsec += (long)(timeout_us % 1000000u) * 1000L;
    if (deadline_p->tv_nsec >= 1000000000L) {
        deadline_p->tv_sec++;
        deadline_p->tv_nsec -= 1000000000L;
    }
}

void ferry_deadline_after_ms(struct timespec *deadline_p, int clock, unsigned timeout_ms)
{
    ferry_deadline_after_us(deadline_p, clock, (uint64_t)timeout_ms * 1000u);
}

uint64_t ferry_time_ms(void)
{
    return ferry_time_us() / 1000u;
}

char *ferry_strdup_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *out = NULL;
    if (vasprintf(&out, fmt, ap) < 0)
        out = NULL;
    va_end(ap);
    return out;
}

unsigned long ferry_log_burst_due(ferry_log_burst_t *burst, uint64_t now_ms,
                                  uint64_t interval_ms)
{
    burst->count++;
    if (burst->said_ms != 0 && now_ms - burst->said_ms < interval_ms)
        return 0;
    unsigned long count = burst->count;
    burst->said_ms = now_ms;
    burst->count = 0;
    return count;
}
