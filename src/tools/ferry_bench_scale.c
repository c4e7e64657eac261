/*
 * ferry_bench_scale: many engines, all to all, as a job of many ranks
 * meets Ferry.  Each of P processes (forked here, or the ranks of an MPI
 * job) creates E engines; every engine opens every other engine's segment
 * and WRITEs one slot into it, so N = P x E engines make N(N-1) opens and
 * writes.  Every slot is then checked by its owner.
 *
 * It reports the time to full connectivity (from the barrier after every
 * engine is created and published to the barrier after the last engine has
 * opened and written to all others), and per process (the largest) the
 * threads, open descriptors, sockets and resident memory before any engine,
 * with the engines idle and at full connectivity, and what the control
 * plane did: RPC requests served and made (p2p fetches descriptors this
 * way), PMIx calls made.  A store server's own counts (redis, etcd,
 * ferry_metad) are read around the run by contrib/bench-scale.sh.
 *
 * Segments stay open until every process has measured, then close; engines
 * are destroyed (not their buffers unregistered one by one: that would
 * tell N-1 subscribers each) after the last exchange.
 */
#include <config.h>

#include <ferry/ferry.h>

#include <dirent.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ferry_bench_scale.h"
#include "tool_args.h"

#define NAME_MAX_LENGTH 96
#define ERRORS_SHOWN 5 /* per engine: the first failures are said, the rest counted */
#define PUBLISH_WAIT_S 10 /* at most (and at most -T): the store's retries of a publication */

typedef struct options {
    int processes;
    int engines;
    size_t slot;
    const char *metadata;
    const char *transports;
    unsigned timeout_s;
} options_t;

/* What a process says of each of its engines (the first exchange). */
typedef struct engine_card {
    uint64_t buffer;
    char name[NAME_MAX_LENGTH];
} engine_card_t;

/* Resources of this process at one moment. */
typedef struct usage {
    uint32_t threads;
    uint32_t fds;
    uint32_t sockets;
    uint64_t rss_kib;
} usage_t;

enum { AT_START, AT_IDLE, AT_CONNECTED, AT_MAX };

/* What each process reports (the last exchange). */
typedef struct report {
    double connect_s;     /* from the start barrier to its own engines' last write */
    double open_us_sum;   /* time inside ferry_segment_open, all its engines */
    double write_us_sum;  /* time from submit to completion of the writes */
    usage_t usage[AT_MAX];
    uint64_t rpc_served, rpc_calls, rpc_fanned_out, rpc_accepted;
    uint64_t pmix[SCALE_PMIX_MAX];
    uint64_t failed_opens, failed_writes, bad_slots;
} report_t;

/* One engine's all-to-all, run by its own thread. */
typedef struct engine_run {
    const options_t *opts;
    ferry_engine_h engine;
    int global; /* its index among all engines */
    int total;
    unsigned char *buffer; /* total slots: slot i is written by engine i */
    const engine_card_t *cards;
    ferry_segment_h *segments; /* [total], NULL for itself and failures */
    double open_us, write_us;
    uint64_t failed_opens, failed_writes;
} engine_run_t;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* The byte at offset k of the slot that engine `from` writes into `to`. */
static unsigned char pattern_byte(int from, int to, size_t k)
{
    uint32_t x = (uint32_t)from * 2654435761u ^ (uint32_t)to * 40503u ^ (uint32_t)k * 131u;
    return (unsigned char)(x >> 13 ^ x);
}

static void fill(unsigned char *p, size_t length, int from, int to)
{
    for (size_t k = 0; k < length; k++)
        p[k] = pattern_byte(from, to, k);
}

static void measure(usage_t *usage)
{
    memset(usage, 0, sizeof(*usage));
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    while (status != NULL && fgets(line, sizeof(line), status) != NULL) {
        unsigned long long value;
        if (sscanf(line, "Threads: %llu", &value) == 1)
            usage->threads = (uint32_t)value;
        else if (sscanf(line, "VmRSS: %llu kB", &value) == 1)
            usage->rss_kib = value;
    }
    if (status != NULL)
        fclose(status);
    DIR *dir = opendir("/proc/self/fd");
    struct dirent *entry;
    while (dir != NULL && (entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] == '.')
            continue;
        char path[300], target[64];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", entry->d_name);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        usage->fds++;
        usage->sockets += n > 7 && strncmp(target, "socket:", 7) == 0;
    }
    if (dir != NULL) {
        closedir(dir);
        usage->fds--; /* the directory's own descriptor */
    }
}

/* Ferry's RPC counters (FERRY_INFO_COUNTERS: "name value" lines). */
static void read_rpc_counters(report_t *report)
{
    char *text = NULL;
    size_t length = 0;
    FILE *out = open_memstream(&text, &length);
    if (out == NULL)
        return;
    ferry_info_print(out, FERRY_INFO_COUNTERS);
    fclose(out);
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[64];
        unsigned long long value;
        if (sscanf(line, "%63s %llu", name, &value) != 2)
            continue;
        if (strncmp(name, "rpc.served.", 11) == 0)
            report->rpc_served += value;
        else if (strcmp(name, "rpc.calls") == 0)
            report->rpc_calls = value;
        else if (strcmp(name, "rpc.calls.fanned_out") == 0)
            report->rpc_fanned_out = value;
        else if (strcmp(name, "rpc.connections.accepted") == 0)
            report->rpc_accepted = value;
    }
    free(text);
}

static ferry_status_t write_slot(engine_run_t *run, ferry_segment_h segment, int to,
                                 unsigned char *local)
{
    const options_t *opts = run->opts;
    ferry_batch_h batch;
    ferry_status_t status = ferry_batch_create(run->engine, 1, &batch);
    if (status != FERRY_OK)
        return status;
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = local, .target = segment,
                           .target_offset = run->cards[to].buffer + (uint64_t)run->global *
                                                                        opts->slot,
                           .length = opts->slot};
    status = ferry_batch_submit(batch, &req, 1);
    if (status == FERRY_OK)
        status = ferry_batch_wait(batch, (int)opts->timeout_s * 1000);
    ferry_xfer_status_t xfer = {0};
    if (status == FERRY_OK && ferry_batch_status(batch, 0, &xfer) == FERRY_OK &&
        xfer.state != FERRY_XFER_COMPLETED)
        status = xfer.error ? xfer.error : FERRY_ERR_IO;
    if (ferry_batch_destroy(batch) != FERRY_OK && status == FERRY_OK)
        status = FERRY_ERR_BUSY;
    return status;
}

static void *connect_all(void *arg)
{
    engine_run_t *run = arg;
    unsigned char *local = malloc(run->opts->slot);
    for (int i = 1; i < run->total && local != NULL; i++) {
        int to = (run->global + i) % run->total; /* everyone starts on a different peer */
        double start = now_us();
        ferry_status_t status = ferry_segment_open(run->engine, run->cards[to].name,
                                                   &run->segments[to]);
        double opened = now_us();
        run->open_us += opened - start;
        if (status != FERRY_OK) {
            run->segments[to] = NULL;
            if (run->failed_opens++ < ERRORS_SHOWN)
                fprintf(stderr, "ferry_bench_scale: engine %d: open %s: %s\n", run->global,
                        run->cards[to].name, ferry_status_string(status));
            continue;
        }
        fill(local, run->opts->slot, run->global, to);
        status = write_slot(run, run->segments[to], to, local);
        run->write_us += now_us() - opened;
        if (status != FERRY_OK && run->failed_writes++ < ERRORS_SHOWN)
            fprintf(stderr, "ferry_bench_scale: engine %d: write to %s: %s\n", run->global,
                    run->cards[to].name, ferry_status_string(status));
    }
    if (local == NULL)
        run->failed_writes = (uint64_t)run->total - 1;
    free(local);
    return NULL;
}

/* Slots of this engine's buffer that do not hold what their writer wrote. */
static uint64_t check_slots(const engine_run_t *run)
{
    uint64_t bad = 0;
    size_t slot = run->opts->slot;
    for (int from = 0; from < run->total; from++) {
        if (from == run->global)
            continue;
        const unsigned char *p = run->buffer + (size_t)from * slot;
        for (size_t k = 0; k < slot; k++) {
            if (p[k] != pattern_byte(from, run->global, k)) {
                if (bad++ < ERRORS_SHOWN)
                    fprintf(stderr, "ferry_bench_scale: engine %d: the slot of engine %d "
                            "differs at byte %zu\n", run->global, from, k);
                break;
            }
        }
    }
    return bad;
}

static const char *store_name(const options_t *opts, int mpi)
{
    const char *uri = opts->metadata ? opts->metadata : getenv("FERRY_METADATA");
    if (uri != NULL && *uri != '\0')
        return uri;
    return mpi ? "pmix (the launcher's)" : "p2p";
}

static int uses_p2p(const options_t *opts, int mpi)
{
    const char *store = store_name(opts, mpi);
    return strncmp(store, "p2p", 3) == 0;
}

static ferry_status_t create_engine(const options_t *opts, int mpi, int rank, int index,
                                    engine_run_t *run)
{
    char name[NAME_MAX_LENGTH];
    ferry_config_t config = {0};
    /* p2p names a segment by its RPC address; under a launcher a process's
     * first engine keeps its rank's name ("rank:N" with pmix). */
    if (!uses_p2p(opts, mpi) && !(mpi && index == 0)) {
        snprintf(name, sizeof(name), "scale-%d-%d", rank, index);
        config.field_mask |= FERRY_CONFIG_FIELD_NAME;
        config.name = name;
    }
    if (opts->metadata != NULL) {
        config.field_mask |= FERRY_CONFIG_FIELD_METADATA;
        config.metadata = opts->metadata;
    }
    if (opts->transports != NULL) {
        config.field_mask |= FERRY_CONFIG_FIELD_TRANSPORTS;
        config.transports = opts->transports;
    }
    ferry_status_t status = ferry_engine_create(&config, &run->engine);
    if (status != FERRY_OK)
        return status;
    size_t length = opts->slot * (size_t)run->total;
    run->buffer = aligned_alloc(4096, (length + 4095) / 4096 * 4096);
    if (run->buffer == NULL)
        return FERRY_ERR_NO_MEMORY;
    memset(run->buffer, 0, length);
    return ferry_register(run->engine, run->buffer, length, "cpu", FERRY_REG_REMOTE);
}

/* Every engine's segment is in the store before anyone opens it.
 * ferry_register succeeds when its publication did not (the store retries
 * in the background), so a store that stalled past its request bound would
 * turn into opens that miss the segment: each engine publishes again until
 * its store says yes, all with one deadline.  An engine still unpublished
 * at the deadline is said once; the opens of its segment then fail and are
 * counted. */
static void confirm_published(const options_t *opts, engine_run_t *runs, int engines)
{
    unsigned wait_s = opts->timeout_s < PUBLISH_WAIT_S ? opts->timeout_s : PUBLISH_WAIT_S;
    double deadline = now_us() + wait_s * 1e6;
    ferry_status_t *last = calloc((size_t)engines, sizeof(*last));
    if (last == NULL)
        return; /* the opens will tell */
    for (int e = 0; e < engines; e++)
        last[e] = FERRY_ERR_METADATA;
    for (;;) {
        int missing = 0;
        for (int e = 0; e < engines; e++)
            if (last[e] != FERRY_OK)
                missing += (last[e] = ferry_publish(runs[e].engine)) != FERRY_OK;
        if (missing == 0 || now_us() >= deadline)
            break;
        usleep(100000);
    }
    for (int e = 0; e < engines; e++)
        if (last[e] != FERRY_OK)
            fprintf(stderr, "ferry_bench_scale: engine %d: segment %s not published in %u s: %s\n",
                    runs[e].global, ferry_engine_segment_name(runs[e].engine), wait_s,
                    ferry_status_string(last[e]));
    free(last);
}

static double median(double *values, int n)
{
    for (int i = 1; i < n; i++) /* insertion sort: n is the process count */
        for (int j = i; j > 0 && values[j] < values[j - 1]; j--) {
            double t = values[j];
            values[j] = values[j - 1];
            values[j - 1] = t;
        }
    return n == 0 ? 0 : n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

#define USAGE_MAX(field, at)                                                                  \
    ({                                                                                        \
        uint64_t m_ = 0;                                                                      \
        for (int p_ = 0; p_ < processes; p_++)                                                \
            m_ = reports[p_].usage[at].field > m_ ? reports[p_].usage[at].field : m_;         \
        m_;                                                                                   \
    })

static int print_reports(const options_t *opts, int mpi, int processes, report_t *reports)
{
    int total = processes * opts->engines;
    uint64_t pairs = (uint64_t)total * (uint64_t)(total - 1);
    double connect_s = 0, open_us = 0, write_us = 0;
    uint64_t served = 0, calls = 0, fanned = 0, accepted = 0, opens = 0, writes = 0, bad = 0;
    uint64_t pmix[SCALE_PMIX_MAX] = {0};
    double *rss = calloc((size_t)processes, sizeof(*rss));
    for (int p = 0; p < processes; p++) {
        const report_t *r = &reports[p];
        connect_s = r->connect_s > connect_s ? r->connect_s : connect_s;
        open_us += r->open_us_sum;
        write_us += r->write_us_sum;
        served += r->rpc_served;
        calls += r->rpc_calls;
        fanned += r->rpc_fanned_out;
        accepted += r->rpc_accepted;
        opens += r->failed_opens;
        writes += r->failed_writes;
        bad += r->bad_slots;
        for (int i = 0; i < SCALE_PMIX_MAX; i++)
            pmix[i] += r->pmix[i];
        if (rss != NULL)
            rss[p] = r->usage[AT_CONNECTED].rss_kib / 1024.0;
    }
    double rss_median = rss ? median(rss, processes) : 0;
    free(rss);
    int failures = opens + writes + bad > 0;
    printf("# ferry_bench_scale: %d engines (%d processes x %d), store %s, transports %s, "
           "slot %zu B\n", total, processes, opts->engines, store_name(opts, mpi),
           opts->transports ? opts->transports : "(default)", opts->slot);
    printf("# all-to-all: %llu opens and %llu writes; failed opens %llu, failed writes %llu, "
           "bad slots %llu\n", (unsigned long long)pairs, (unsigned long long)pairs,
           (unsigned long long)opens, (unsigned long long)writes, (unsigned long long)bad);
    printf("# time to full connectivity: %.3f s (mean open %.1f us, mean write %.1f us, each "
           "engine one at a time)\n", connect_s, open_us / (double)(pairs ? pairs : 1),
           write_us / (double)(pairs ? pairs : 1));
    printf("# per process (largest)  %12s %12s %16s\n", "no engine", "engines idle",
           "fully connected");
    static const char *const labels[] = {"threads", "descriptors", "sockets", "RSS (MiB)"};
    for (int row = 0; row < 4; row++) {
        printf("# %-22s", labels[row]);
        for (int at = 0; at < AT_MAX; at++) {
            uint64_t v = row == 0   ? USAGE_MAX(threads, at)
                         : row == 1 ? USAGE_MAX(fds, at)
                         : row == 2 ? USAGE_MAX(sockets, at)
                                    : USAGE_MAX(rss_kib, at) / 1024;
            printf(" %*llu", at == AT_CONNECTED ? 16 : 12, (unsigned long long)v);
        }
        printf("\n");
    }
    printf("# control plane, all processes: RPC served %llu, RPC calls %llu (+%llu fanned out), "
           "RPC connections accepted %llu; PMIx get %llu, put %llu, commit %llu, fence %llu\n",
           (unsigned long long)served, (unsigned long long)calls, (unsigned long long)fanned,
           (unsigned long long)accepted, (unsigned long long)pmix[SCALE_PMIX_GET],
           (unsigned long long)pmix[SCALE_PMIX_PUT], (unsigned long long)pmix[SCALE_PMIX_COMMIT],
           (unsigned long long)pmix[SCALE_PMIX_FENCE]);
    /* One line for scripts (contrib/bench-scale.sh). */
    printf("RESULT engines=%d processes=%d engines_per_process=%d connect_s=%.3f "
           "threads=%llu threads_idle=%llu fds=%llu sockets=%llu rss_mib=%.1f "
           "rss_mib_median=%.1f rss_mib_idle=%.1f rpc_served=%llu rpc_calls=%llu "
           "rpc_accepted=%llu pmix_get=%llu pmix_put=%llu pmix_commit=%llu pmix_fence=%llu "
           "failures=%llu\n", total, processes, opts->engines, connect_s,
           (unsigned long long)USAGE_MAX(threads, AT_CONNECTED),
           (unsigned long long)USAGE_MAX(threads, AT_IDLE),
           (unsigned long long)USAGE_MAX(fds, AT_CONNECTED),
           (unsigned long long)USAGE_MAX(sockets, AT_CONNECTED),
           USAGE_MAX(rss_kib, AT_CONNECTED) / 1024.0, rss_median,
           USAGE_MAX(rss_kib, AT_IDLE) / 1024.0, (unsigned long long)served,
           (unsigned long long)(calls + fanned), (unsigned long long)accepted,
           (unsigned long long)pmix[SCALE_PMIX_GET], (unsigned long long)pmix[SCALE_PMIX_PUT],
           (unsigned long long)pmix[SCALE_PMIX_COMMIT], (unsigned long long)pmix[SCALE_PMIX_FENCE],
           (unsigned long long)(opens + writes + bad));
    fflush(stdout);
    return failures;
}

/* One process's part.  Returns 0 when every open, write and slot was good. */
static int run_process(const options_t *opts, scale_coord_t *coord)
{
    int rank = scale_coord_rank(coord), processes = scale_coord_size(coord);
    int mpi = scale_coord_is_mpi(coord), engines = opts->engines;
    int total = processes * engines;
    report_t report = {0};
    uint64_t pmix_before[SCALE_PMIX_MAX];
    scale_pmix_counts(pmix_before);
    measure(&report.usage[AT_START]);

    engine_run_t *runs = calloc((size_t)engines, sizeof(*runs));
    engine_card_t *mine = calloc((size_t)engines, sizeof(*mine));
    engine_card_t *cards = calloc((size_t)total, sizeof(*cards));
    report_t *reports = calloc((size_t)processes, sizeof(*reports));
    pthread_t *threads = calloc((size_t)engines, sizeof(*threads));
    int broken = runs == NULL || mine == NULL || cards == NULL || reports == NULL ||
                 threads == NULL;
    for (int e = 0; e < engines && !broken; e++) {
        engine_run_t *run = &runs[e];
        *run = (engine_run_t){.opts = opts, .global = rank * engines + e, .total = total,
                              .cards = cards};
        run->segments = calloc((size_t)total, sizeof(*run->segments));
        ferry_status_t status = run->segments ? create_engine(opts, mpi, rank, e, run)
                                              : FERRY_ERR_NO_MEMORY;
        if (status != FERRY_OK) {
            fprintf(stderr, "ferry_bench_scale: process %d: engine %d: %s\n", rank, e,
                    ferry_status_string(status));
            broken = 1;
            break;
        }
        mine[e].buffer = (uint64_t)(uintptr_t)run->buffer;
        snprintf(mine[e].name, sizeof(mine[e].name), "%s",
                 ferry_engine_segment_name(run->engine));
    }
    if (!broken)
        confirm_published(opts, runs, engines);
    measure(&report.usage[AT_IDLE]);
    /* A process that could not start its engines still takes part in every
     * exchange (with empty names), so that the others fail cleanly. */
    int lost = broken || scale_coord_allgather(coord, mine, engines * sizeof(*mine), cards);
    double start = now_us();
    int started = 0;
    for (int e = 0; e < engines && !lost; e++)
        started += pthread_create(&threads[e], NULL, connect_all, &runs[e]) == 0;
    for (int e = 0; e < started; e++)
        pthread_join(threads[e], NULL);
    if (!lost && started < engines) {
        fprintf(stderr, "ferry_bench_scale: process %d: could not start its threads\n", rank);
        broken = 1;
    }
    report.connect_s = (now_us() - start) / 1e6;
    char token = 0, *tokens = calloc((size_t)processes, 1);
    /* Everyone connected: measure, then check what the others wrote. */
    lost = lost || tokens == NULL || scale_coord_allgather(coord, &token, 1, tokens);
    measure(&report.usage[AT_CONNECTED]);
    read_rpc_counters(&report);
    uint64_t pmix_after[SCALE_PMIX_MAX];
    scale_pmix_counts(pmix_after);
    for (int i = 0; i < SCALE_PMIX_MAX; i++)
        report.pmix[i] = pmix_after[i] - pmix_before[i];
    for (int e = 0; e < engines && runs != NULL; e++) {
        engine_run_t *run = &runs[e];
        report.open_us_sum += run->open_us;
        report.write_us_sum += run->write_us;
        report.failed_opens += run->failed_opens;
        report.failed_writes += run->failed_writes;
        if (!lost && run->buffer != NULL)
            report.bad_slots += check_slots(run);
    }
    if (broken)
        report.failed_opens += (uint64_t)engines * (uint64_t)(total - 1);
    lost = lost || scale_coord_allgather(coord, &report, sizeof(report), reports);
    int failed = lost || report.failed_opens + report.failed_writes + report.bad_slots > 0;
    if (!lost && rank == 0)
        failed |= print_reports(opts, mpi, processes, reports);
    /* Nobody writes any more: every process has reported. */
    for (int e = 0; e < engines && runs != NULL; e++) {
        engine_run_t *run = &runs[e];
        for (int i = 0; run->segments != NULL && i < total; i++)
            if (run->segments[i] != NULL)
                ferry_segment_close(run->engine, run->segments[i]);
        if (run->engine != NULL)
            ferry_engine_destroy(run->engine);
        free(run->buffer);
        free(run->segments);
    }
    free(tokens);
    free(threads);
    free(reports);
    free(cards);
    free(mine);
    free(runs);
    return failed;
}

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: ferry_bench_scale [-p PROCESSES] [-e ENGINES] [-s SLOT] [-m URI] [-t LIST]\n"
            "                         [-T SECONDS]\n"
            "Every engine opens every other engine's segment and writes one slot into it;\n"
            "reports the time to full connectivity and what it cost each process and store.\n"
            "  -p, --processes N   processes forked here (default 4); under mpirun or srun\n"
            "                      --mpi=pmix the job's ranks instead\n"
            "  -e, --engines N     engines per process (default 8; 1 under a launcher)\n"
            "  -s, --slot SIZE     bytes each engine writes into each other one (default 64)\n"
            "  -m, --metadata URI  the store (default: FERRY_METADATA, else p2p; pmix under\n"
            "                      a PMIx launcher)\n"
            "  -t, --transports L  FERRY_TRANSPORTS for every engine\n"
            "  -T, --timeout S     bound on each write (default 120); the parent waits at most\n"
            "                      ten times it for each exchange\n"
            "The last line, RESULT key=value ..., is for scripts (contrib/bench-scale.sh).\n");
}

int main(int argc, char **argv)
{
    options_t opts = {.processes = 4, .engines = 0, .slot = 64, .timeout_s = 120};
    static const struct option long_options[] = {
        {"processes", required_argument, NULL, 'p'}, {"engines", required_argument, NULL, 'e'},
        {"slot", required_argument, NULL, 's'},      {"metadata", required_argument, NULL, 'm'},
        {"transports", required_argument, NULL, 't'}, {"timeout", required_argument, NULL, 'T'},
        {"help", no_argument, NULL, 'h'},            {NULL, 0, NULL, 0},
    };
    int c;
    unsigned count;
    while ((c = getopt_long(argc, argv, "p:e:s:m:t:T:h", long_options, NULL)) != -1) {
        switch (c) {
        case 'p':
            if (ferry_tool_parse_count(optarg, 1, 65536, &count) != 0) {
                fprintf(stderr, "ferry_bench_scale: -p takes 1..65536\n");
                return 2;
            }
            opts.processes = (int)count;
            break;
        case 'e':
            if (ferry_tool_parse_count(optarg, 1, 65536, &count) != 0) {
                fprintf(stderr, "ferry_bench_scale: -e takes 1..65536\n");
                return 2;
            }
            opts.engines = (int)count;
            break;
        case 's':
            if (ferry_tool_parse_size(optarg, &opts.slot) != 0 || opts.slot == 0 ||
                opts.slot > ((size_t)1 << 20)) {
                fprintf(stderr, "ferry_bench_scale: -s takes a size from 1 to 1m\n");
                return 2;
            }
            break;
        case 'm': opts.metadata = optarg; break;
        case 't': opts.transports = optarg; break;
        case 'T':
            if (ferry_tool_parse_count(optarg, 1, 65536, &opts.timeout_s) != 0) {
                fprintf(stderr, "ferry_bench_scale: -T takes 1..65536 seconds\n");
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    /* Forked processes: refuse before forking them. */
    if (!scale_coord_under_launcher() &&
        (uint64_t)(opts.engines ? opts.engines : 8) * (uint64_t)opts.processes > 65536) {
        fprintf(stderr, "ferry_bench_scale: at most 65536 engines in all\n");
        return 2;
    }
    scale_coord_t *coord;
    int failed = 0;
    int rc = scale_coord_start(&argc, &argv, opts.processes, 10 * opts.timeout_s, &coord,
                               &failed);
    if (rc < 0)
        return 1;
    if (rc > 0) /* the parent of forked processes: they are done */
        return failed ? 1 : 0;
    if (opts.engines == 0)
        opts.engines = scale_coord_is_mpi(coord) ? 1 : 8;
    if ((uint64_t)opts.engines * (uint64_t)scale_coord_size(coord) > 65536) {
        if (scale_coord_rank(coord) == 0)
            fprintf(stderr, "ferry_bench_scale: at most 65536 engines in all\n");
        scale_coord_finish(coord, 1);
        return 2;
    }
    failed = run_process(&opts, coord);
    scale_coord_finish(coord, failed); /* a forked process exits here */
    return failed ? 1 : 0;
}
