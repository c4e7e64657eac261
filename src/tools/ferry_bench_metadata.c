/*
 * ferry_bench --metadata-ops: control-plane latency through a metadata store.
 *
 * Two engines in this process share the store given by --metadata: an owner
 * publishes segments, a reader opens them.  Measured, each --iterations
 * times:
 *   publish      ferry_publish() of a segment holding one buffer, and of one
 *                holding --registrations buffers (the descriptor is rebuilt,
 *                encoded and stored);
 *   publish, 1 change: ferry_unregister (or ferry_register again) of one
 *                page of the large segment, its publish included (a shared
 *                store with change records: one record, and the whole
 *                descriptor once per checkpoint);
 *   open         ferry_segment_open() of a segment not in the reader's cache
 *                (store fetch + decode), for a 1-buffer and the large segment;
 *   open cached  ferry_segment_open() of a segment already open;
 *   open after a change: the same, the owner having unregistered (or
 *                registered again) one buffer before each open, so that its
 *                descriptor is made and encoded anew;
 *   refresh      ferry_segment_refresh() of an open segment after its owner
 *                unregistered one buffer, or registered it again
 *                (alternately), for the small and the large segment: what a
 *                peer pays for one change (p2p: the changes since its
 *                revision; other stores: the whole descriptor).
 * Reported as median, 99th percentile and mean in microseconds.
 */
#include "ferry_bench.h"
#include "tool_args.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct md_options {
    const char *metadata;
    const char *transport;
    unsigned iterations;
    unsigned registrations;
    unsigned small;
} md_options_t;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *store, const char *op, const char *label, double *samples,
                   unsigned n)
{
    double sum = 0;
    qsort(samples, n, sizeof(*samples), by_value);
    for (unsigned i = 0; i < n; i++)
        sum += samples[i];
    size_t rank = (size_t)(0.99 * n + 0.999999); /* nearest rank, 1-based */
    double median = samples[n / 2], p99 = samples[rank ? rank - 1 : 0];
    printf("%-34s %12.1f %12.1f %12.1f\n", label, median, p99, sum / n);
    printf("RESULT store=%s op=%s iterations=%u median_us=%.1f p99_us=%.1f mean_us=%.1f\n",
           store, op, n, median, p99, sum / n);
}

static int make_engine(const md_options_t *o, const char *name, ferry_engine_h *engine_p)
{
    ferry_config_t config = {.field_mask = FERRY_CONFIG_FIELD_TRANSPORTS,
                             .transports = o->transport ? o->transport : "tcp"};
    if (o->metadata) {
        config.field_mask |= FERRY_CONFIG_FIELD_METADATA;
        config.metadata = o->metadata;
    }
    if (name) {
        config.field_mask |= FERRY_CONFIG_FIELD_NAME;
        config.name = name;
    }
    ferry_status_t status = ferry_engine_create(&config, engine_p);
    if (status != FERRY_OK)
        fprintf(stderr, "ferry_bench: engine on %s: %s\n", o->metadata ? o->metadata :
                "FERRY_METADATA", ferry_status_string(status));
    return status == FERRY_OK ? 0 : -1;
}

/* Open and close `name` n times; open is uncached each time (the close of
 * the last handle drops the cached descriptor).  With an owner and one of
 * its registered pages, the owner unregisters (or registers again) that page
 * before each open, unmeasured: the owner's descriptor is made and encoded
 * anew for each open. */
static int time_opens(ferry_engine_h owner, unsigned char *page, ferry_engine_h reader,
                      const char *name, double *samples, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        ferry_segment_h segment;
        ferry_status_t changed = FERRY_OK;
        if (owner != NULL)
            changed = i % 2 ? ferry_register(owner, page, 4096, "cpu", FERRY_REG_REMOTE)
                            : ferry_unregister(owner, page);
        if (changed != FERRY_OK) {
            fprintf(stderr, "ferry_bench: register: %s\n", ferry_status_string(changed));
            return -1;
        }
        double start = now_us();
        ferry_status_t status = ferry_segment_open(reader, name, &segment);
        samples[i] = now_us() - start;
        if (status != FERRY_OK) {
            fprintf(stderr, "ferry_bench: open %s: %s\n", name, ferry_status_string(status));
            return -1;
        }
        ferry_segment_close(reader, segment);
    }
    if (owner != NULL && n % 2 &&
        ferry_register(owner, page, 4096, "cpu", FERRY_REG_REMOTE) != FERRY_OK)
        return -1;
    return 0;
}

/* Open `name`, then n times: the owner unregisters one of its pages (and
 * next time registers it again), unmeasured; the reader's refresh is
 * measured. */
static int time_refreshes(ferry_engine_h owner, ferry_engine_h reader, const char *name,
                          unsigned char *page, double *samples, unsigned n)
{
    ferry_segment_h segment;
    ferry_status_t status = ferry_segment_open(reader, name, &segment);
    for (unsigned i = 0; i < n && status == FERRY_OK; i++) {
        status = i % 2 ? ferry_register(owner, page, 4096, "cpu", FERRY_REG_REMOTE)
                       : ferry_unregister(owner, page);
        if (status != FERRY_OK)
            break;
        double start = now_us();
        status = ferry_segment_refresh(reader, name);
        samples[i] = now_us() - start;
    }
    if (status == FERRY_OK && n % 2)
        status = ferry_register(owner, page, 4096, "cpu", FERRY_REG_REMOTE);
    if (status != FERRY_OK)
        fprintf(stderr, "ferry_bench: refresh %s: %s\n", name, ferry_status_string(status));
    ferry_segment_close(reader, segment);
    return status == FERRY_OK ? 0 : -1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: ferry_bench --metadata-ops [--metadata=URI] [--iterations=N] "
            "[--registrations=N]\n"
            "  --metadata=URI        store to measure (default: FERRY_METADATA, else p2p)\n"
            "  --iterations=N        samples per operation (default 200)\n"
            "  --registrations=N     buffers in the large segment (default 1000)\n"
            "  --small=N             buffers in the small segment (default 1)\n"
            "  --transport=NAME      transports the engines enable (default tcp)\n"
            "Prints median, p99 and mean latency in microseconds of publish, uncached open,\n"
            "cached open and refresh after one change, and one RESULT line per operation.\n");
}

static int parse(int argc, char **argv, md_options_t *o)
{
    static const struct option options[] = {
        {"metadata-ops", no_argument, NULL, 'O'},
        {"metadata", required_argument, NULL, 'm'},
        {"iterations", required_argument, NULL, 'i'},
        {"registrations", required_argument, NULL, 'r'},
        {"small", required_argument, NULL, 's'},
        {"transport", required_argument, NULL, 'T'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (md_options_t){.iterations = 200, .registrations = 1000, .small = 1};
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (opt) {
        case 'O': break;
        case 'm': o->metadata = optarg; break;
        case 'T': o->transport = optarg; break;
        case 'i':
            if (ferry_tool_parse_count(optarg, 1, 1000000, &o->iterations)) {
                fprintf(stderr, "ferry_bench: --iterations is 1..1000000\n");
                return -1;
            }
            break;
        case 'r':
            if (ferry_tool_parse_count(optarg, 1, 1000000, &o->registrations)) {
                fprintf(stderr, "ferry_bench: --registrations is 1..1000000\n");
                return -1;
            }
            break;
        case 's':
            if (ferry_tool_parse_count(optarg, 1, 1000000, &o->small)) {
                fprintf(stderr, "ferry_bench: --small is 1..1000000\n");
                return -1;
            }
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ferry_bench: unexpected argument %s\n", argv[optind]);
        return -1;
    }
    return 0;
}

int ferry_bench_metadata_main(int argc, char **argv)
{
    md_options_t o;
    if (parse(argc, argv, &o) != 0)
        return 2;
    const char *uri = o.metadata ? o.metadata : getenv("FERRY_METADATA");
    uri = uri && *uri ? uri : "p2p";
    char store[32];
    snprintf(store, sizeof(store), "%.*s", (int)strcspn(uri, ":"), uri);
    int p2p = strcmp(store, "p2p") == 0;
    /* p2p names are RPC addresses; the other stores take chosen names. */
    char small_name[128], large_name[128], reader_name[128];
    snprintf(small_name, sizeof(small_name), "ferry-bench-md-%d-small", (int)getpid());
    snprintf(large_name, sizeof(large_name), "ferry-bench-md-%d-large", (int)getpid());
    snprintf(reader_name, sizeof(reader_name), "ferry-bench-md-%d-reader", (int)getpid());

    ferry_engine_h small = NULL, large = NULL, reader = NULL;
    size_t page = 4096, n = o.registrations;
    /* [small segment][large segment] */
    size_t pages = o.small + n;
    unsigned char *arena = NULL, *small_arena, *large_arena;
    double *samples = calloc(o.iterations, sizeof(double));
    ferry_region_t *regions = calloc(n > o.small ? n : o.small, sizeof(*regions));
    int rc = 1;
    if (samples == NULL || regions == NULL || posix_memalign((void **)&arena, page, pages * page))
        goto out;
    small_arena = arena;
    large_arena = arena + o.small * page;
    if (make_engine(&o, p2p ? NULL : small_name, &small) || make_engine(&o, p2p ? NULL :
        large_name, &large) || make_engine(&o, p2p ? NULL : reader_name, &reader))
        goto out;

    for (size_t i = 0; i < o.small; i++)
        regions[i] = (ferry_region_t){.addr = small_arena + i * page, .length = page,
                                      .location = "cpu"};
    ferry_status_t status = ferry_register_batch(small, regions, o.small, FERRY_REG_REMOTE);
    for (size_t i = 0; i < n; i++)
        regions[i] = (ferry_region_t){.addr = large_arena + i * page, .length = page,
                                      .location = "cpu"};
    /* One deferred batch: the registrations themselves are not measured. */
    if (status == FERRY_OK)
        status = ferry_register_batch(large, regions, n, FERRY_REG_REMOTE |
                                      FERRY_REG_DEFER_PUBLISH);
    if (status != FERRY_OK) {
        fprintf(stderr, "ferry_bench: register: %s\n", ferry_status_string(status));
        goto out;
    }
    printf("ferry_bench --metadata-ops: store %s, %u iterations, %u and %u registrations\n",
           uri, o.iterations, o.small, o.registrations);
    printf("%-34s %12s %12s %12s\n", "operation", "median_us", "p99_us", "mean_us");

    char label[64];
    for (unsigned i = 0; i < o.iterations; i++) {
        double start = now_us();
        status = ferry_publish(small);
        samples[i] = now_us() - start;
        if (status != FERRY_OK) {
            fprintf(stderr, "ferry_bench: publish: %s\n", ferry_status_string(status));
            goto out;
        }
    }
    snprintf(label, sizeof(label), "publish (%u buffer%s)", o.small, o.small > 1 ? "s" : "");
    report(store, "publish_1", label, samples, o.iterations);
    for (unsigned i = 0; i < o.iterations; i++) {
        double start = now_us();
        status = ferry_publish(large);
        samples[i] = now_us() - start;
        if (status != FERRY_OK) {
            fprintf(stderr, "ferry_bench: publish: %s\n", ferry_status_string(status));
            goto out;
        }
    }
    snprintf(label, sizeof(label), "publish (%u buffers)", o.registrations);
    report(store, "publish", label, samples, o.iterations);
    /* A change published: one page unregistered, then registered again. */
    for (unsigned i = 0; i < o.iterations; i++) {
        unsigned char *page_p = large_arena + (n - 1) * page;
        double start = now_us();
        status = i % 2 ? ferry_register(large, page_p, page, "cpu", FERRY_REG_REMOTE)
                       : ferry_unregister(large, page_p);
        samples[i] = now_us() - start;
        if (status != FERRY_OK) {
            fprintf(stderr, "ferry_bench: register: %s\n", ferry_status_string(status));
            goto out;
        }
    }
    if (o.iterations % 2 &&
        ferry_register(large, large_arena + (n - 1) * page, page, "cpu", FERRY_REG_REMOTE) !=
            FERRY_OK)
        goto out;
    snprintf(label, sizeof(label), "publish, 1 change (%u)", o.registrations);
    report(store, "publish_change", label, samples, o.iterations);

    const char *small_seg = ferry_engine_segment_name(small);
    const char *large_seg = ferry_engine_segment_name(large);
    if (time_opens(NULL, NULL, reader, small_seg, samples, o.iterations) != 0)
        goto out;
    snprintf(label, sizeof(label), "open uncached (%u buffer%s)", o.small, o.small > 1 ? "s" : "");
    report(store, "open_uncached_1", label, samples, o.iterations);
    double first = now_us();
    if (time_opens(NULL, NULL, reader, large_seg, samples, 1) != 0)
        goto out;
    first = now_us() - first;
    printf("%-34s %12.1f\n", "first open (owner builds)", first);
    printf("RESULT store=%s op=open_first iterations=1 median_us=%.1f p99_us=%.1f "
           "mean_us=%.1f\n", store, first, first, first);
    if (time_opens(NULL, NULL, reader, large_seg, samples, o.iterations) != 0)
        goto out;
    snprintf(label, sizeof(label), "open uncached (%u buffers)", o.registrations);
    report(store, "open_uncached", label, samples, o.iterations);
    if (time_opens(large, large_arena + (n - 1) * page, reader, large_seg, samples,
                   o.iterations) != 0)
        goto out;
    snprintf(label, sizeof(label), "open after a change (%u)", o.registrations);
    report(store, "open_changed", label, samples, o.iterations);

    ferry_segment_h held, again;
    if (ferry_segment_open(reader, large_seg, &held) != FERRY_OK)
        goto out;
    char *json = NULL;
    if (ferry_segment_describe(reader, held, &json) == FERRY_OK)
        printf("(the %u-buffer descriptor is %zu bytes of JSON)\n", o.registrations,
               strlen(json));
    free(json);
    for (unsigned i = 0; i < o.iterations; i++) {
        double start = now_us();
        status = ferry_segment_open(reader, large_seg, &again);
        samples[i] = now_us() - start;
        if (status != FERRY_OK)
            break;
        ferry_segment_close(reader, again);
    }
    ferry_segment_close(reader, held);
    if (status != FERRY_OK)
        goto out;
    report(store, "open_cached", "open cached", samples, o.iterations);

    if (time_refreshes(small, reader, small_seg, small_arena + (o.small - 1) * page, samples,
                       o.iterations) != 0)
        goto out;
    snprintf(label, sizeof(label), "refresh, 1 change (%u)", o.small);
    report(store, "refresh_1", label, samples, o.iterations);
    if (time_refreshes(large, reader, large_seg, large_arena + (n - 1) * page, samples,
                       o.iterations) != 0)
        goto out;
    snprintf(label, sizeof(label), "refresh, 1 change (%u)", o.registrations);
    report(store, "refresh", label, samples, o.iterations);
    fflush(stdout);
    rc = 0;

out:
    if (reader)
        ferry_engine_destroy(reader);
    if (large)
        ferry_engine_destroy(large);
    if (small)
        ferry_engine_destroy(small);
    free(arena);
    free(regions);
    free(samples);
    return rc;
}
