/*
 * ferry_osu_{put,get}_{latency,bw}, ferry_osu_put_bibw: the OSU
 * Micro-Benchmarks one-sided tests, with the data moved by Ferry.  Two MPI
 * ranks; MPI only starts the job, shares the segment names and buffer
 * addresses and separates the message sizes with barriers.  --api=mpi runs
 * the same sweep through MPI one-sided (MPI_Win_allocate, MPI_Put/MPI_Get,
 * MPI_Win_flush); --api=both measures each size both ways, back to back, in
 * one job.  Output, defaults and
 * arithmetic are OSU 6.x's: latency = time / iterations, bandwidth =
 * size / 1e6 * iterations * window / time, bi-bandwidth twice that.
 *
 * Built once per test: FERRY_OSU_TEST names which.
 */
#include <ferry/ferry.h>
#include <mpi.h>

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tool_args.h"

enum { FERRY_OSU_PUT_LATENCY, FERRY_OSU_GET_LATENCY, FERRY_OSU_PUT_BW, FERRY_OSU_GET_BW,
       FERRY_OSU_PUT_BIBW };
#ifndef FERRY_OSU_TEST
#error "build with -DFERRY_OSU_TEST=FERRY_OSU_<TEST>"
#endif

typedef enum { LATENCY, BW, BIBW } osu_kind_t;

typedef struct osu_test {
    const char *program;
    const char *title; /* after "# OSU MPI_Put" or "# OSU Ferry_Put" */
    int get;
    osu_kind_t kind;
} osu_test_t;

static const osu_test_t tests[] = {
    [FERRY_OSU_PUT_LATENCY] = {"ferry_osu_put_latency", "Latency Test", 0, LATENCY},
    [FERRY_OSU_GET_LATENCY] = {"ferry_osu_get_latency", "latency Test", 1, LATENCY},
    [FERRY_OSU_PUT_BW] = {"ferry_osu_put_bw", "Bandwidth Test", 0, BW},
    [FERRY_OSU_GET_BW] = {"ferry_osu_get_bw", "Bandwidth Test", 1, BW},
    [FERRY_OSU_PUT_BIBW] = {"ferry_osu_put_bibw", "Bi-directional Bandwidth Test", 0, BIBW},
};
static const osu_test_t *const test = &tests[FERRY_OSU_TEST];

#define OSU_VERSION "6.2"
#define FIELD_WIDTH 20
#define FLOAT_PRECISION 2
#define LARGE_MESSAGE_SIZE 8192
#define MAX_SIZE_LIMIT ((size_t)1 << 30)

typedef struct options {
    size_t min_size, max_size;
    unsigned iterations, skip, iterations_large, skip_large;
    unsigned window;
    int mpi;                 /* --api=mpi; sweep through MPI one-sided */
    int both;                /* --api=both: Ferry and MPI, size by size */
    const char *transport;   /* --transport: FERRY_TRANSPORTS */
} options_t;

static int rank;
static int passive_sleeps; /* --passive-wait=sleep */

static void usage(FILE *out)
{
    fprintf(out,
        "Usage: mpirun -np 2 %s [options]\n"
        "  -m, --message-size [MIN:]MAX  sizes from MIN (default 1) to MAX bytes, doubling\n"
        "                                (default 4194304; k/m suffixes)\n"
        "  -x, --warmup N                untimed iterations per size (default %s)\n"
        "  -i, --iterations N            timed iterations per size (default %s)\n"
        "%s"
        "  -d, --accelerator cuda|rocm   device buffers (this build has none)\n"
        "  -T, --transport NAME          Ferry transports to enable, as FERRY_TRANSPORTS\n"
        "                                (default: every one, the best picked per peer)\n"
        "      --api ferry|mpi|both      move the data with Ferry (default) or with MPI\n"
        "                                one-sided (MPI_Win_allocate, MPI_Win_flush); both:\n"
        "                                each size through Ferry then MPI, two tables\n"
        "      --passive-wait spin|sleep how a rank that moves no data waits for the other at\n"
        "                                the end of a size: inside MPI, as OSU's MPI_Barrier\n"
        "                                (spin, the default), or polling a nonblocking\n"
        "                                collective with 200 us naps, leaving its core free\n"
        "                                (sleep); either API alike\n"
        "  -h, --help                    this text\n",
        test->program, test->kind == LATENCY ? "100, 10 above 8 KiB" : "10, 2 above 8 KiB",
        test->kind == LATENCY ? "10000, 1000 above 8 KiB" : "100, 20 above 8 KiB",
        test->kind == LATENCY
            ? ""
            : "  -W, --window-size N           requests per flush (default 64)\n");
}

/* A message size: 1 to 1 GiB, k/m suffixes. */
static int parse_size(const char *text, size_t *value_p)
{
    size_t value;
    if (ferry_tool_parse_size(text, &value) != 0 || value == 0 || value > MAX_SIZE_LIMIT)
        return -1;
    *value_p = value;
    return 0;
}

/* 0: run; 1: exit 0 (help); -1: bad usage (said why). */
static int parse_options(int argc, char **argv, options_t *o)
{
    static const struct option long_options[] = {
        {"message-size", required_argument, NULL, 'm'},
        {"warmup", required_argument, NULL, 'x'},
        {"iterations", required_argument, NULL, 'i'},
        {"window-size", required_argument, NULL, 'W'},
        {"accelerator", required_argument, NULL, 'd'},
        {"transport", required_argument, NULL, 'T'},
        {"api", required_argument, NULL, 'A'},
        {"passive-wait", required_argument, NULL, 'P'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (options_t){.min_size = 1, .max_size = (size_t)1 << 22, .window = 64};
    if (test->kind == LATENCY) {
        o->iterations = 10000, o->skip = 100, o->iterations_large = 1000, o->skip_large = 10;
    } else {
        o->iterations = 100, o->skip = 10, o->iterations_large = 20, o->skip_large = 2;
    }
    const char *optstring = test->kind == LATENCY ? "m:x:i:d:T:h" : "m:x:i:W:d:T:h";
    int opt;
    opterr = rank == 0;
    while ((opt = getopt_long(argc, argv, optstring, long_options, NULL)) != -1) {
        switch (opt) {
        case 'm': {
            const char *colon = strchr(optarg, ':');
            int bad = 0;
            if (colon != NULL) {
                char min[64];
                snprintf(min, sizeof(min), "%.*s", (int)(colon - optarg), optarg);
                bad = parse_size(min, &o->min_size) ||
                      (colon[1] != '\0' && parse_size(colon + 1, &o->max_size));
            } else {
                bad = parse_size(optarg, &o->max_size);
            }
            if (bad || o->min_size > o->max_size) {
                if (rank == 0)
                    fprintf(stderr, "%s: -m takes [MIN:]MAX, 1 <= MIN <= MAX <= 1g, not %s\n",
                            test->program, optarg);
                return -1;
            }
            break;
        }
        case 'x':
            if (ferry_tool_parse_count(optarg, 0, 1u << 30, &o->skip))
                goto err_count;
            o->skip_large = o->skip;
            break;
        case 'i':
            if (ferry_tool_parse_count(optarg, 1, 1u << 30, &o->iterations))
                goto err_count;
            o->iterations_large = o->iterations;
            break;
        case 'W':
            if (test->kind == LATENCY ||
                ferry_tool_parse_count(optarg, 1, 1u << 30, &o->window))
                goto err_count;
            break;
        case 'd':
            if (rank == 0)
                fprintf(stderr, "%s: -d %s: this build has no device-buffer support\n",
                        test->program, optarg);
            return -1;
        case 'T': o->transport = optarg; break;
        case 'A':
            if (strcmp(optarg, "ferry") != 0 && strcmp(optarg, "mpi") != 0 &&
                strcmp(optarg, "both") != 0) {
                if (rank == 0)
                    fprintf(stderr, "%s: --api is ferry, mpi or both, not %s\n", test->program,
                            optarg);
                return -1;
            }
            o->mpi = strcmp(optarg, "mpi") == 0;
            o->both = strcmp(optarg, "both") == 0;
            break;
        case 'P':
            if (strcmp(optarg, "spin") != 0 && strcmp(optarg, "sleep") != 0) {
                if (rank == 0)
                    fprintf(stderr, "%s: --passive-wait is spin or sleep, not %s\n",
                            test->program, optarg);
                return -1;
            }
            passive_sleeps = strcmp(optarg, "sleep") == 0;
            break;
        case 'h':
            if (rank == 0)
                usage(stdout);
            return 1;
        default:
            if (rank == 0)
                usage(stderr);
            return -1;
        }
    }
    if (optind < argc) {
        if (rank == 0)
            fprintf(stderr, "%s: unexpected argument %s\n", test->program, argv[optind]);
        return -1;
    }
    if ((uint64_t)o->max_size * o->window > ((uint64_t)4 << 30)) {
        if (rank == 0)
            fprintf(stderr, "%s: MAX x window is over 4 GiB per buffer\n", test->program);
        return -1;
    }
    return 0;

err_count:
    if (rank == 0)
        fprintf(stderr, "%s: -%c takes a count, not %s\n", test->program, opt, optarg);
    return -1;
}

static void print_header(int mpi, const char *transport)
{
    if (rank != 0)
        return;
    printf("# OSU %s_%s %s v" OSU_VERSION "\n", mpi ? "MPI" : "Ferry", test->get ? "Get" : "Put",
           test->title);
    if (mpi) {
        printf("# Window creation: MPI_Win_allocate\n");
        printf("# Synchronization: MPI_Win_flush\n");
    } else {
        printf("# Window creation: ferry_alloc\n");
        printf("# Synchronization: ferry_batch_wait\n");
        printf("# Ferry %s, transport %s\n", ferry_version_string(), transport);
    }
    if (passive_sleeps && test->kind != BIBW)
        printf("# Passive rank: sleeps between polls of the closing barrier\n");
    printf("%-*s%*s\n", 10, "# Size", FIELD_WIDTH,
           test->kind == LATENCY ? "Latency (us)" : "Bandwidth (MB/s)");
    fflush(stdout);
}

/* One size's timing, OSU's arithmetic. */
typedef struct osu_point {
    size_t size;
    double seconds;
    unsigned iterations, skip, window;
} osu_point_t;

static osu_point_t point_for(const options_t *o, size_t size)
{
    int large = size > LARGE_MESSAGE_SIZE;
    return (osu_point_t){.size = size,
                         .iterations = large ? o->iterations_large : o->iterations,
                         .skip = large ? o->skip_large : o->skip,
                         .window = test->kind == LATENCY ? 1 : o->window};
}

static void print_result(const osu_point_t *p)
{
    if (rank != 0)
        return;
    double value;
    if (test->kind == LATENCY)
        value = p->seconds * 1e6 / p->iterations;
    else
        value = (double)p->size / 1e6 * p->iterations * p->window / p->seconds *
                (test->kind == BIBW ? 2 : 1);
    printf("%-*zu%*.*f\n", 10, p->size, FIELD_WIDTH, FLOAT_PRECISION, value);
    fflush(stdout);
}

/* Whether rank moves data in this test (rank 0 only, both for bibw). */
static int active(void)
{
    return rank == 0 || test->kind == BIBW;
}

/* The end of a size: *ok_p becomes the AND over both ranks.  With
 * --passive-wait=sleep the rank that moved no data waits by polling a
 * nonblocking collective with naps instead of spinning inside MPI, so that
 * its core is free for the other rank's threads (Ferry's copy helpers; MPI
 * one-sided over shared memory has none and needs no target progress). */
static void end_of_size(int *ok_p)
{
    if (!passive_sleeps) {
        MPI_Allreduce(MPI_IN_PLACE, ok_p, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
        return;
    }
    /* Both ranks the nonblocking one: it matches no blocking collective. */
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, ok_p, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD, &request);
    if (active()) {
        MPI_Wait(&request, MPI_STATUS_IGNORE);
        return;
    }
    for (int done = 0;;) {
        MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        if (done)
            return;
        struct timespec nap = {0, 200000};
        nanosleep(&nap, NULL);
    }
}

/* ---------------- Ferry ---------------- */

typedef struct ferry_side {
    ferry_engine_h engine;
    ferry_segment_h peer;
    ferry_batch_h batch;
    unsigned char *local;    /* sbuf */
    unsigned char *window;   /* what the peer writes or reads */
    uint64_t peer_window;
    ferry_request_t *requests;
} ferry_side_t;

static int ferry_fail(const char *what, ferry_status_t status)
{
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, ferry_status_string(status));
    return -1;
}

/* Submit count requests of size bytes and wait for them. */
static int ferry_round(ferry_side_t *f, size_t size, unsigned count)
{
    for (unsigned j = 0; j < count; j++) {
        f->requests[j] = (ferry_request_t){.opcode = test->get ? FERRY_OP_READ : FERRY_OP_WRITE,
                                           .local = f->local + (size_t)j * size, .target = f->peer,
                                           .target_offset = f->peer_window + (uint64_t)j * size,
                                           .length = size};
    }
    ferry_status_t status = ferry_batch_submit(f->batch, f->requests, count);
    if (status == FERRY_OK)
        status = ferry_batch_wait(f->batch, -1);
    return status == FERRY_OK ? 0 : ferry_fail("transfer", status);
}

static int ferry_setup(ferry_side_t *f, const options_t *o, char *transport, size_t len)
{
    unsigned window = test->kind == LATENCY ? 1 : o->window;
    size_t bytes = o->max_size * window;
    ferry_status_t status = ferry_engine_create(NULL, &f->engine);
    if (status != FERRY_OK)
        return ferry_fail("ferry_engine_create", status);
    /* The peer reaches our window best in memory from ferry_alloc; our own
     * side of each transfer stays in ordinary (registered) heap memory, as
     * OSU's send buffer: with UCX, memory it maps for peers is a shared
     * mapping without transparent huge pages, slower to copy from. */
    if (posix_memalign((void **)&f->local, 1 << 21, bytes) != 0)
        return ferry_fail("posix_memalign", FERRY_ERR_NO_MEMORY);
    status = ferry_register(f->engine, f->local, bytes, "cpu", FERRY_REG_REMOTE);
    if (status == FERRY_OK)
        status = ferry_alloc(f->engine, bytes, "cpu", FERRY_REG_REMOTE, (void **)&f->window);
    if (status != FERRY_OK)
        return ferry_fail("ferry_alloc", status);
    memset(f->local, 'a', bytes);
    memset(f->window, 'b', bytes);
    status = ferry_batch_create(f->engine, window, &f->batch);
    f->requests = calloc(window, sizeof(*f->requests));
    if (status != FERRY_OK || f->requests == NULL)
        return ferry_fail("ferry_batch_create", status ? status : FERRY_ERR_NO_MEMORY);

    /* Names and addresses through MPI: with pmix the peer is "rank:N", but any
     * metadata store works this way. */
    char names[2][256] = {{0}};
    snprintf(names[rank], sizeof(names[0]), "%s", ferry_engine_segment_name(f->engine));
    uint64_t mine = (uint64_t)(uintptr_t)f->window, both[2];
    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, names, sizeof(names[0]), MPI_CHAR,
                  MPI_COMM_WORLD);
    MPI_Allgather(&mine, 1, MPI_UINT64_T, both, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    f->peer_window = both[1 - rank];
    status = ferry_segment_open(f->engine, names[1 - rank], &f->peer);
    if (status != FERRY_OK)
        return ferry_fail(names[1 - rank], status);
    /* One byte first: connections are set up outside the timed loops, and
     * the header can say which transport serves the peer. */
    if (ferry_round(f, 1, 1) != 0)
        return -1;
    ferry_xfer_status_t xs;
    if (ferry_batch_status(f->batch, 0, &xs) == FERRY_OK && xs.transport != NULL)
        snprintf(transport, len, "%s", xs.transport);
    return 0;
}

static void ferry_teardown(ferry_side_t *f)
{
    if (f->engine == NULL)
        return;
    if (f->batch)
        ferry_batch_destroy(f->batch);
    if (f->peer)
        ferry_segment_close(f->engine, f->peer);
    ferry_engine_destroy(f->engine); /* frees what ferry_alloc gave, unregisters local */
    free(f->local);
    free(f->requests);
}

/* Collective: every rank's engine up and connected, or -1 on all. */
static int ferry_start(ferry_side_t *f, const options_t *o, char *transport, size_t len)
{
    if (o->transport != NULL)
        setenv("FERRY_TRANSPORTS", o->transport, 1);
    /* Wait as MPI_Win_flush does: the caller polls until the window is done
     * (ferry_batch_wait drives the transports' progress meanwhile) instead
     * of sleeping after 50 us and leaving the copies to a progress thread
     * that two cores must share with it.  A value given wins. */
    setenv("FERRY_WAIT_SPIN", "1000000", 0);
    int ok = ferry_setup(f, o, transport, len) == 0, all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    return all_ok ? 0 : -1;
}

/* Collective: time one size through Ferry; -1 on every rank if one failed. */
static int ferry_measure(ferry_side_t *f, osu_point_t *p)
{
    int ok = 1;
    double start = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    if (active()) {
        for (unsigned i = 0; i < p->skip + p->iterations && ok; i++) {
            if (i == p->skip)
                start = MPI_Wtime();
            ok = ferry_round(f, p->size, p->window) == 0;
        }
        p->seconds = MPI_Wtime() - start;
    }
    end_of_size(&ok);
    return ok ? 0 : -1;
}

/* ---------------- MPI one-sided, as OSU does it ---------------- */

/* Collective: time one size through MPI one-sided (a window per size). */
static void mpi_measure(osu_point_t *p)
{
    int peer = 1 - rank;
    size_t bytes = p->size * p->window;
    unsigned char *sbuf = malloc(bytes), *base;
    MPI_Win win;
    if (sbuf == NULL) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(sbuf, 'a', bytes);
    MPI_Win_allocate((MPI_Aint)bytes, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    memset(base, 'b', bytes);
    MPI_Barrier(MPI_COMM_WORLD);
    double start = 0;
    if (active()) {
        MPI_Win_lock(MPI_LOCK_SHARED, peer, 0, win);
        for (unsigned i = 0; i < p->skip + p->iterations; i++) {
            if (i == p->skip)
                start = MPI_Wtime();
            for (unsigned j = 0; j < p->window; j++) {
                MPI_Aint disp = (MPI_Aint)(j * p->size);
                if (test->get)
                    MPI_Get(sbuf + j * p->size, (int)p->size, MPI_CHAR, peer, disp,
                            (int)p->size, MPI_CHAR, win);
                else
                    MPI_Put(sbuf + j * p->size, (int)p->size, MPI_CHAR, peer, disp,
                            (int)p->size, MPI_CHAR, win);
            }
            MPI_Win_flush(peer, win);
        }
        p->seconds = MPI_Wtime() - start;
        MPI_Win_unlock(peer, win);
    }
    int ok = 1;
    end_of_size(&ok);
    MPI_Win_free(&win);
    free(sbuf);
}

/*
 * The sweep.  One API: each size printed as it is done.  Both: for each size
 * Ferry then MPI, back to back, so that a machine busy with something else
 * weighs on both alike; the two tables are printed at the end.
 */
static int run(const options_t *o)
{
    int use_ferry = !o->mpi || o->both, use_mpi = o->mpi || o->both;
    ferry_side_t f = {0};
    char transport[64] = "?";
    if (use_ferry && ferry_start(&f, o, transport, sizeof(transport)) != 0) {
        ferry_teardown(&f);
        return -1;
    }
    size_t n = 0;
    for (size_t size = o->min_size; size <= o->max_size; size *= 2)
        n++;
    osu_point_t *ferry_points = calloc(n, sizeof(*ferry_points));
    osu_point_t *mpi_points = calloc(n, sizeof(*mpi_points));
    if (ferry_points == NULL || mpi_points == NULL) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (!o->both)
        print_header(o->mpi, transport);
    int rc = 0;
    size_t i = 0;
    for (size_t size = o->min_size; size <= o->max_size && rc == 0; size *= 2, i++) {
        ferry_points[i] = mpi_points[i] = point_for(o, size);
        if (use_ferry)
            rc = ferry_measure(&f, &ferry_points[i]);
        if (use_mpi && rc == 0)
            mpi_measure(&mpi_points[i]);
        if (!o->both && rc == 0)
            print_result(o->mpi ? &mpi_points[i] : &ferry_points[i]);
    }
    if (o->both && rc == 0) {
        print_header(0, transport);
        for (size_t k = 0; k < n; k++)
            print_result(&ferry_points[k]);
        if (rank == 0)
            printf("\n");
        print_header(1, NULL);
        for (size_t k = 0; k < n; k++)
            print_result(&mpi_points[k]);
    }
    /* The peer may still read our window until both are done. */
    MPI_Barrier(MPI_COMM_WORLD);
    if (use_ferry)
        ferry_teardown(&f);
    free(ferry_points);
    free(mpi_points);
    return rc;
}

int main(int argc, char **argv)
{
    int size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    options_t options;
    int parsed = parse_options(argc, argv, &options);
    if (parsed == 0 && size != 2) {
        if (rank == 0)
            fprintf(stderr, "%s: this test requires exactly two processes\n", test->program);
        parsed = -1;
    }
    int rc = parsed < 0 ? 1 : 0;
    if (parsed == 0)
        rc = run(&options) == 0 ? 0 : 1;
    MPI_Finalize();
    return rc;
}
