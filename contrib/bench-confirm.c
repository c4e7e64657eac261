/*
 * What a peer pays for the owner's confirmation of a descriptor it read from
 * a shared store (src/core/confirm.c), before a one-sided transport may use
 * it: whole (the owner sends its whole descriptor, the peer decodes and
 * compares), and after a refresh by the store's change records (the owner
 * sends its changes since the confirmed descriptor before; the peer applies
 * them to that one and compares).  Medians in microseconds.
 *
 * Internal functions: built against the build tree's convenience library.
 *   cc -O2 -D_GNU_SOURCE -Iinclude -Isrc -o /tmp/bench-confirm contrib/bench-confirm.c \
 *      build/.libs/libferry_internal.a -ljansson -lcurl -lpthread -ldl -lm
 *   FERRY_MODULE_DIR=build/modules/.libs /tmp/bench-confirm redis://127.0.0.1:6379 100000 20
 */
#include <ferry/ferry.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

/* The middle sample (sorts samples in place: few of them). */
static double median(double *samples, unsigned n)
{
    for (unsigned i = 1; i < n; i++)
        for (unsigned j = i; j > 0 && samples[j - 1] > samples[j]; j--) {
            double t = samples[j];
            samples[j] = samples[j - 1];
            samples[j - 1] = t;
        }
    return samples[n / 2];
}

static ferry_engine_h engine_on(const char *uri, const char *name)
{
    ferry_config_t config = {.field_mask = FERRY_CONFIG_FIELD_METADATA |
                                           FERRY_CONFIG_FIELD_TRANSPORTS |
                                           FERRY_CONFIG_FIELD_NAME,
                             .metadata = uri, .transports = "tcp", .name = name};
    ferry_engine_h engine;
    if (ferry_engine_create(&config, &engine) != FERRY_OK)
        exit(1);
    return engine;
}

static ferry_descriptor_t *held(ferry_engine_h reader, ferry_segment_h handle)
{
    ferry_engine_t *engine = ferry_engine_lookup(reader);
    ferry_segment_t *segment = ferry_handle_lookup((uint64_t)(uintptr_t)handle,
                                                   FERRY_HANDLE_SEGMENT, engine);
    ferry_descriptor_t *desc;
    if (segment == NULL || ferry_segment_descriptor(engine, segment, &desc) != FERRY_OK)
        exit(1);
    return desc;
}

int main(int argc, char **argv)
{
    const char *uri = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
    size_t n = argc > 2 ? strtoul(argv[2], NULL, 10) : 100000;
    unsigned iterations = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 10) : 20;
    size_t page = 4096;
    unsigned char *arena;
    ferry_region_t *regions = calloc(n, sizeof(*regions));
    double *whole = calloc(iterations, sizeof(double)), *by_changes = calloc(iterations,
                                                                             sizeof(double));
    if (posix_memalign((void **)&arena, page, n * page) != 0 || !regions || !whole ||
        !by_changes)
        return 1;
    for (size_t i = 0; i < n; i++)
        regions[i] = (ferry_region_t){.addr = arena + i * page, .length = page,
                                      .location = "cpu"};
    ferry_engine_h owner = engine_on(uri, "confirm-owner");
    ferry_engine_h reader = engine_on(uri, "confirm-reader");
    ferry_engine_t *engine = ferry_engine_lookup(reader);
    if (ferry_register_batch(owner, regions, n, FERRY_REG_REMOTE) != FERRY_OK)
        return 1;
    for (unsigned i = 0; i < iterations; i++) {
        /* a fresh open: confirmed whole */
        ferry_segment_h segment;
        if (ferry_segment_open(reader, "confirm-owner", &segment) != FERRY_OK)
            return 1;
        ferry_descriptor_t *desc = held(reader, segment);
        double start = now_us();
        int ok = ferry_engine_descriptor_confirmed(engine, desc);
        whole[i] = now_us() - start;
        ferry_descriptor_unref(desc);
        /* one change, a refresh by the store's records, confirmed by changes */
        unsigned char *last = arena + (n - 1) * page;
        ferry_status_t changed = i % 2 ? ferry_register(owner, last, page, "cpu",
                                                        FERRY_REG_REMOTE)
                                       : ferry_unregister(owner, last);
        if (!ok || changed != FERRY_OK ||
            ferry_segment_refresh(reader, "confirm-owner") != FERRY_OK)
            return 1;
        desc = held(reader, segment);
        int based = desc->confirm_base != NULL;
        start = now_us();
        ok = ferry_engine_descriptor_confirmed(engine, desc);
        by_changes[i] = now_us() - start;
        ferry_descriptor_unref(desc);
        ferry_segment_close(reader, segment);
        if (!ok || !based) {
            fprintf(stderr, "confirmation %s\n", ok ? "not by changes" : "refused");
            return 1;
        }
    }
    printf("confirm %zu buffers through %s: whole %.1f us, by changes %.1f us (medians of %u)\n",
           n, uri, median(whole, iterations), median(by_changes, iterations), iterations);
    ferry_engine_destroy(reader);
    ferry_engine_destroy(owner);
    free(regions);
    free(arena);
    free(whole);
    free(by_changes);
    return 0;
}
