/* ferry_bench's clock and latency samples, for the latency and pingpong
 * modes alike. */
#include "ferry_bench.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

double ferry_bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Room for n more; 0 when there is (a sample set that cannot grow keeps
 * what it has: the run goes on, with fewer samples). */
static int reserve(ferry_bench_samples_t *s, size_t n)
{
    if (s->count + n <= s->capacity)
        return 0;
    size_t capacity = s->capacity ? s->capacity : 1024;
    while (capacity < s->count + n)
        capacity *= 2;
    double *grown = realloc(s->values, capacity * sizeof(*grown));
    if (grown == NULL)
        return -1;
    s->values = grown;
    s->capacity = capacity;
    return 0;
}

void ferry_bench_samples_add(ferry_bench_samples_t *s, double value)
{
    if (reserve(s, 1) == 0)
        s->values[s->count++] = value;
}

void ferry_bench_samples_merge(ferry_bench_samples_t *into, ferry_bench_samples_t *from)
{
    if (from->count > 0 && reserve(into, from->count) == 0) {
        memcpy(into->values + into->count, from->values, from->count * sizeof(*from->values));
        into->count += from->count;
    }
    ferry_bench_samples_free(from);
}

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void ferry_bench_samples_summary(ferry_bench_samples_t *s, double *median_p, double *p99_p)
{
    *median_p = *p99_p = 0;
    if (s->count == 0)
        return;
    qsort(s->values, s->count, sizeof(*s->values), compare_double);
    *median_p = s->values[s->count / 2];
    *p99_p = s->values[(size_t)((double)(s->count - 1) * 0.99)];
}

void ferry_bench_samples_free(ferry_bench_samples_t *s)
{
    free(s->values);
    *s = (ferry_bench_samples_t){0};
}
