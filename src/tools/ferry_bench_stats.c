/* ferry_bench --stats: what the engine counted (ferry_stats_snapshot), one
 * row per transport and per peer that finished requests, and a STATS line
 * each for scripts. */
#include "ferry_bench.h"

#include <inttypes.h>
#include <stdlib.h>

/* The rows (lines 0) or the STATS lines (lines 1) of one kind. */
static void print_kind(ferry_engine_h engine, ferry_stats_kind_t kind, int lines, FILE *out)
{
    size_t n = 0;
    if (ferry_stats_snapshot(engine, kind, NULL, 0, &n) != FERRY_OK || n == 0)
        return;
    ferry_stats_t *all = calloc(n, sizeof(*all));
    if (all == NULL || ferry_stats_snapshot(engine, kind, all, n, &n) != FERRY_OK) {
        free(all);
        return;
    }
    const char *what = kind == FERRY_STATS_BY_PEER ? "peer" : "transport";
    for (size_t i = 0; i < n; i++) {
        const ferry_stats_t *s = &all[i];
        if (s->requests == 0)
            continue;
        double p50 = ferry_stats_latency_ns(s, 0.5) / 1e3;
        double p99 = ferry_stats_latency_ns(s, 0.99) / 1e3;
        if (!lines)
            fprintf(out, "  %-9s %-24.24s %12" PRIu64 " %8" PRIu64 " %14" PRIu64 " %9.1f %9.1f\n",
                    what, s->name, s->requests, s->failures, s->bytes, p50, p99);
        else
            fprintf(out, "STATS kind=%s name=%s requests=%" PRIu64 " failures=%" PRIu64
                    " bytes=%" PRIu64 " latency_p50_us=%.3f latency_p99_us=%.3f\n",
                    what, s->name, s->requests, s->failures, s->bytes, p50, p99);
    }
    free(all);
}

void ferry_bench_stats_print(ferry_engine_h engine, FILE *out)
{
    fprintf(out, "statistics (latency: submit to completion, upper edge of its log2 bucket):\n");
    fprintf(out, "  %-9s %-24s %12s %8s %14s %9s %9s\n", "by", "name", "requests", "failed",
            "bytes", "p50 us", "p99 us");
    for (int lines = 0; lines < 2; lines++) {
        print_kind(engine, FERRY_STATS_BY_TRANSPORT, lines, out);
        print_kind(engine, FERRY_STATS_BY_PEER, lines, out);
    }
}
