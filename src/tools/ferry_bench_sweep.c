/*
 * ferry_bench --sweep: block sizes MIN, 2 MIN, 4 MIN ... up to MAX in one
 * run against one target (one engine, one segment open, one connection),
 * each size measured as a run of its own with that --block-size measures
 * it: throughput (batches of --batch-size, --window, --threads, for
 * --duration), then latency as --latency measures it (one request per
 * batch, median and 99th percentile of 32-request means), and with
 * --memcpy-baseline single-thread memcpy of the same blocks.  One row per
 * size: a table, or CSV (--format=csv) that contrib/plot-bench.sh reads.
 */
#include "ferry_bench.h"
#include "tool_args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SWEEP_DEFAULT_MIN 1
#define SWEEP_DEFAULT_MAX ((size_t)4 << 20)
#define SWEEP_LIMIT ((size_t)1 << 30) /* the largest block a sweep moves */
#define BUFFER_CAP ((size_t)64 << 20) /* as a run without --buffer-size */

int ferry_bench_sweep_parse(const char *text, ferry_bench_options_t *o)
{
    size_t min = SWEEP_DEFAULT_MIN, max = SWEEP_DEFAULT_MAX;
    if (text != NULL) {
        const char *colon = strchr(text, ':');
        char first[64];
        if (colon == NULL || (size_t)(colon - text) >= sizeof(first)) {
            fprintf(stderr, "ferry_bench: --sweep=MIN:MAX (e.g. 1:4m), not %s\n", text);
            return -1;
        }
        snprintf(first, sizeof(first), "%.*s", (int)(colon - text), text);
        if (ferry_tool_parse_size(first, &min) || ferry_tool_parse_size(colon + 1, &max) ||
            min == 0 || max < min || max > SWEEP_LIMIT) {
            fprintf(stderr, "ferry_bench: --sweep=MIN:MAX wants 1 <= MIN <= MAX <= 1g, not %s\n",
                    text);
            return -1;
        }
    }
    o->sweep = 1;
    o->sweep_min = min;
    o->sweep_max = max;
    return 0;
}

/* One size's row. */
typedef struct sweep_row {
    size_t block_size;
    char transport[32];
    double gbps, requests_per_s;
    double median_us, p99_us;
    double memcpy_gbps; /* negative: not measured */
    int failed;
} sweep_row_t;

/* Each size's blocks wrap around batch x block of each thread's part, as
 * a run of that size alone would (cache-resident when small). */
static size_t wrap_size(size_t block, size_t batch, unsigned window, size_t stride)
{
    size_t want = block * batch * window;
    if (want / batch / window != block || want > BUFFER_CAP)
        want = BUFFER_CAP;
    if (want > stride)
        want = stride;
    return want < block ? block : want;
}

static int measure_size(const ferry_bench_options_t *o, const ferry_bench_peer_t *peer,
                        size_t block, sweep_row_t *row)
{
    *row = (sweep_row_t){.block_size = block, .memcpy_gbps = -1};
    ferry_bench_options_t size_o = *o;
    size_o.block_size = block;
    size_o.buffer_size = wrap_size(block, o->batch_size, o->window, peer->stride);
    if (o->baseline)
        row->memcpy_gbps = ferry_bench_memcpy_gbps(&size_o, peer->engine, peer->local);
    ferry_bench_result_t result;
    int rc = ferry_bench_measure(&size_o, peer, &result);
    snprintf(row->transport, sizeof(row->transport), "%s", result.transport);
    row->gbps = result.bytes / result.seconds / 1e9;
    row->requests_per_s = result.requests / result.seconds;
    ferry_bench_samples_free(&result.samples);
    if (rc != 0) {
        row->failed = 1;
        return -1;
    }
    ferry_bench_options_t latency_o = size_o;
    latency_o.latency = 1;
    latency_o.batch_size = 1;
    latency_o.window = 1;
    latency_o.buffer_size = wrap_size(block, 1, 1, peer->stride);
    rc = ferry_bench_measure(&latency_o, peer, &result);
    ferry_bench_samples_summary(&result.samples, &row->median_us, &row->p99_us);
    ferry_bench_samples_free(&result.samples);
    row->failed = rc != 0;
    return rc;
}

static void print_head(const ferry_bench_options_t *o)
{
    if (o->csv) {
        printf("block_size,operation,transport,threads,batch_size,window,gbps,requests_per_s,"
               "latency_median_us,latency_p99_us,memcpy_gbps,status\n");
    } else {
        printf("ferry_bench --sweep: %s, block %zu B to %zu B, batch %zu, window %u, threads %u, "
               "memory %s -> %s, %.2f s per size and measurement%s\n",
               o->write ? "write" : "read", o->sweep_min, o->sweep_max, o->batch_size, o->window,
               o->threads, o->local_memory, o->remote_memory, o->duration,
               o->verify ? ", verified" : "");
        printf("%10s %-10s %10s %12s %11s %11s %11s\n", "block_B", "transport", "GB/s",
               "requests/s", "median_us", "p99_us", "memcpy_GB/s");
    }
    fflush(stdout);
}

static void print_row(const ferry_bench_options_t *o, const sweep_row_t *row)
{
    char memcpy_text[32] = "";
    if (row->memcpy_gbps >= 0)
        snprintf(memcpy_text, sizeof(memcpy_text), "%.4f", row->memcpy_gbps);
    if (o->csv)
        printf("%zu,%s,%s,%u,%zu,%u,%.4f,%.0f,%.3f,%.3f,%s,%s\n", row->block_size,
               o->write ? "write" : "read", row->transport, o->threads, o->batch_size, o->window,
               row->gbps, row->requests_per_s, row->median_us, row->p99_us, memcpy_text,
               row->failed ? "failed" : "ok");
    else
        printf("%10zu %-10s %10.4f %12.0f %11.2f %11.2f %11s%s\n", row->block_size,
               row->transport, row->gbps, row->requests_per_s, row->median_us, row->p99_us,
               row->memcpy_gbps >= 0 ? memcpy_text : "-", row->failed ? "  FAILED" : "");
    fflush(stdout);
}

int ferry_bench_sweep(const ferry_bench_options_t *o, const ferry_bench_peer_t *peer)
{
    print_head(o);
    for (size_t block = o->sweep_min; block <= o->sweep_max; block *= 2) {
        sweep_row_t row;
        int rc = measure_size(o, peer, block, &row);
        print_row(o, &row);
        if (rc != 0) {
            fprintf(stderr, "ferry_bench: --sweep stopped at block %zu B\n", block);
            return -1;
        }
        if (block > o->sweep_max / 2)
            break; /* the next one would pass MAX (or overflow) */
    }
    return 0;
}
