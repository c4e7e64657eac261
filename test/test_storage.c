/* Storage buffers (ferry_register_storage) and the file transport: a
 * ferry_test_peer process owns a file or block device range, this process
 * reads and writes it by the file transport with each I/O engine, bytes
 * checked in the file itself; the keys' checks, NVMe identity against a fake
 * sysfs tree, a killed owner and unregister during I/O. */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "../src/core/core.h"
#include "one_request.h"
#include "peer_process.h"
#include "test_pattern.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define FILE_SIZE (8 * MIB)
#define OFFSET (64 * KIB)       /* of the registered range in the file */
#define RANGE (4 * MIB)

static ferry_engine_h engine;
static unsigned char *local;
static char path[256];
static peer_process_t peer;
static int peer_running;

static void start(const char *io_engine)
{
    setenv("FERRY_FILE_ENGINE", io_engine, 1);
    setenv("FERRY_TRANSPORTS", "file,tcp", 1);
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    cr_assert_eq(posix_memalign((void **)&local, 4096, 2 * RANGE), 0);
    memset(local, 0, 2 * RANGE);
}

static void stop(void)
{
    if (peer_running)
        peer_stop(&peer);
    peer_running = 0;
    if (engine)
        ferry_engine_destroy(engine);
    engine = NULL;
    free(local);
    local = NULL;
    if (path[0] != '\0')
        unlink(path);
    path[0] = '\0';
}

TestSuite(storage, .fini = stop, .timeout = 60);

/* A FILE_SIZE file of zeros in dir. */
static void make_file(const char *dir)
{
    snprintf(path, sizeof(path), "%s/ferry-storage-XXXXXX", dir);
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0, "mkstemp in %s: %s", dir, strerror(errno));
    cr_assert_eq(ftruncate(fd, FILE_SIZE), 0);
    close(fd);
}

static void file_read(const char *file, uint64_t offset, void *buffer, size_t length)
{
    int fd = open(file, O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ferry_storage_full_io(fd, 0, buffer, length, offset, 0), FERRY_OK);
    close(fd);
}

static void file_write(const char *file, uint64_t offset, const void *buffer, size_t length)
{
    int fd = open(file, O_WRONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ferry_storage_full_io(fd, 1, (void *)buffer, length, offset, 0), FERRY_OK);
    close(fd);
}

/* The peer registers [OFFSET, +RANGE) of file (options), we open it. */
static uintptr_t owner_start(const char *file, unsigned options, ferry_segment_h *segment_p)
{
    uintptr_t addr = 0;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    peer_running = 1;
    const char *reply = peer_cmd(&peer, "sreg %zu %zu %u %s rw", OFFSET, RANGE, options, file);
    cr_assert_eq(sscanf(reply, "SREG %" SCNxPTR, &addr), 1, "%s", reply);
    cr_assert_eq(ferry_segment_open(engine, peer.name, segment_p), FERRY_OK);
    return addr;
}

/* Writes and reads, aligned and not (aligned only: the unaligned ones
 * FAIL), each checked in the file itself. */
static void read_write_checked_as(const char *file, unsigned options, int aligned_only)
{
    ferry_segment_h segment;
    uintptr_t addr = owner_start(file, options, &segment);
    static const struct { size_t at, length, local_at; } cases[] = {
        {0, RANGE, 0},                /* aligned: O_DIRECT where the file system has it */
        {4096, 64 * KIB, 4096},       /* aligned */
        {1, 4095, 3},                 /* unaligned everywhere: the page cache */
        {RANGE - 100, 100, 0},        /* the last bytes */
        {12345, MIB + 7, 17},
    };
    unsigned char *check = malloc(RANGE);
    for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        unsigned seed = 100 + i;
        if (aligned_only && (cases[i].at % 4096 || cases[i].length % 4096)) {
            ferry_xfer_status_t xs;
            cr_assert_eq(one_request(engine, FERRY_OP_WRITE, local + cases[i].local_at, segment,
                                     addr + cases[i].at, cases[i].length, &xs),
                         FERRY_ERR_INVALID_PARAM, "case %u", i);
            continue;
        }
        test_pattern_fill(local + cases[i].local_at, cases[i].length, seed);
        cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, local + cases[i].local_at,
                                           segment, addr + cases[i].at, cases[i].length,
                                           "file"),
                     FERRY_OK, "case %u", i);
        file_read(file, OFFSET + cases[i].at, check, cases[i].length);
        cr_assert_eq(test_pattern_check(check, cases[i].length, seed), SIZE_MAX, "case %u", i);
        memset(local + RANGE, 0, RANGE);
        cr_assert_eq(one_request_served_by(engine, FERRY_OP_READ,
                                           local + RANGE + cases[i].local_at, segment,
                                           addr + cases[i].at, cases[i].length, "file"),
                     FERRY_OK, "case %u", i);
        cr_assert_eq(test_pattern_check(local + RANGE + cases[i].local_at, cases[i].length,
                                        seed), SIZE_MAX, "case %u", i);
    }
    /* nothing outside the registered range was touched */
    file_read(file, 0, check, OFFSET);
    for (size_t i = 0; i < OFFSET; i++)
        cr_assert_eq(check[i], 0, "byte %zu before the range", i);
    file_read(file, OFFSET + RANGE, check, FILE_SIZE - OFFSET - RANGE);
    for (size_t i = 0; i < FILE_SIZE - OFFSET - RANGE; i++)
        cr_assert_eq(check[i], 0, "byte %zu after the range", i);
    free(check);
    ferry_segment_close(engine, segment);
}

static void read_write_checked(const char *file, unsigned options)
{
    read_write_checked_as(file, options, 0);
}

Test(storage, tmp_file_uring)
{
    start("uring");
    make_file("/tmp");
    read_write_checked(path, 0);
}

Test(storage, tmp_file_threads)
{
    start("threads");
    make_file("/tmp");
    read_write_checked(path, 0);
}

Test(storage, tmpfs_file_uring)
{
    start("uring");
    make_file("/dev/shm");
    read_write_checked(path, 0);
}

Test(storage, tmpfs_file_threads_durable)
{
    start("threads");
    make_file("/dev/shm");
    read_write_checked(path, FERRY_STORAGE_DURABLE);
}

/* The threads engine's slower paths: no thread spinning for work (each
 * submit wakes sleepers), pages not cached (the inline RWF_NOWAIT read
 * finds nothing to copy and a pool thread reads), and one batch of more
 * ops than threads (taken in shares); bytes checked. */
Test(storage, threads_cold_cache_no_spin)
{
    enum { N = 32, LEN = 1000 };
    setenv("FERRY_FILE_SPIN_US", "0", 1);
    start("threads");
    unsetenv("FERRY_FILE_SPIN_US");
    make_file("/tmp");
    ferry_segment_h segment;
    uintptr_t addr = owner_start(path, 0, &segment);
    unsigned char *pattern = malloc(N * 4096);
    cr_assert_not_null(pattern);
    test_pattern_fill(pattern, N * 4096, 9);
    file_write(path, OFFSET, pattern, N * 4096);
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fdatasync(fd), 0);
    cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
    ferry_request_t reqs[N];
    for (size_t i = 0; i < N; i++) /* unaligned: the page cache */
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_READ, .local = local + i * 4096 + 1,
                                    .target = segment, .target_offset = addr + i * 4096 + 1,
                                    .length = LEN, .transport = "file"};
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, N, &batch), FERRY_OK);
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 10000), FERRY_OK);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    for (size_t i = 0; i < N; i++)
        cr_assert_eq(memcmp(local + i * 4096 + 1, pattern + i * 4096 + 1, LEN), 0, "op %zu", i);
    free(pattern);
    ferry_segment_close(engine, segment);
}

/* Submit one request in a batch of its own and poll its status (no wait,
 * no progress call) until it completes, 5 s at most; the batch is the
 * caller's to destroy. */
static ferry_batch_h submit_and_poll(const ferry_request_t *req)
{
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, 1, &batch), FERRY_OK);
    cr_assert_eq(ferry_batch_submit(batch, req, 1), FERRY_OK);
    ferry_xfer_status_t xs = {0};
    for (int i = 0; i < 50000; i++) { /* 5 s */
        cr_assert_eq(ferry_batch_status(batch, 0, &xs), FERRY_OK);
        if (xs.state != FERRY_XFER_PENDING)
            break;
        usleep(100);
    }
    cr_assert_eq(xs.state, FERRY_XFER_COMPLETED, "state %d error %d", xs.state, xs.error);
    return batch;
}

/* The spinning thread leaves a lone op just queued to its submitter's
 * wait; a submitter that never waits (it polls the status) must still see
 * it done: the spinning thread takes it once it is no longer fresh. */
Test(storage, threads_lone_op_done_without_wait)
{
    enum { LEN = 1000 };
    setenv("FERRY_FILE_SPIN_US", "2000000", 1); /* a thread spins for the whole test */
    start("threads");
    unsetenv("FERRY_FILE_SPIN_US");
    make_file("/tmp");
    ferry_segment_h segment;
    uintptr_t addr = owner_start(path, 0, &segment);
    unsigned char pattern[4096];
    test_pattern_fill(pattern, sizeof(pattern), 11);
    file_write(path, OFFSET, pattern, sizeof(pattern));
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fdatasync(fd), 0);
    cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
    /* unaligned and not cached: queued for a pool thread, not done inline */
    ferry_request_t req = {.opcode = FERRY_OP_READ, .local = local + 1, .target = segment,
                           .target_offset = addr + 1, .length = LEN, .transport = "file"};
    ferry_batch_h batch = submit_and_poll(&req);
    cr_assert_eq(ferry_batch_wait(batch, 10000), FERRY_OK);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    cr_assert_eq(memcmp(local + 1, pattern + 1, LEN), 0);
    ferry_segment_close(engine, segment);
}

Test(storage, buffered_only)
{
    start("uring");
    make_file("/tmp");
    read_write_checked(path, FERRY_STORAGE_BUFFERED);
}

/* Direct only: aligned I/O works, unaligned FAILS, nothing written. */
static void direct_only(const char *io_engine)
{
    start(io_engine);
    make_file("/tmp");
    ferry_segment_h segment;
    uintptr_t addr = owner_start(path, FERRY_STORAGE_DIRECT, &segment);
    test_pattern_fill(local, 64 * KIB, 5);
    cr_assert_eq(one_request(engine, FERRY_OP_WRITE, local, segment, addr, 64 * KIB, NULL),
                 FERRY_OK);
    ferry_xfer_status_t xs;
    cr_assert_eq(one_request(engine, FERRY_OP_WRITE, local + 1, segment, addr + 8192, 4096,
                             &xs), FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(xs.state, FERRY_XFER_FAILED);
    unsigned char check[4096];
    file_read(path, OFFSET + 8192, check, sizeof(check));
    cr_assert_eq(test_pattern_check(check, sizeof(check), 5) == SIZE_MAX, 0);
    file_read(path, OFFSET, local + RANGE, 64 * KIB);
    cr_assert_eq(test_pattern_check(local + RANGE, 64 * KIB, 5), SIZE_MAX);
    ferry_segment_close(engine, segment);
}

Test(storage, direct_only_refuses_unaligned_uring)
{
    direct_only("uring");
}

Test(storage, direct_only_refuses_unaligned_threads)
{
    direct_only("threads");
}

/* Past the end of the registered range: refused before any I/O. */
Test(storage, out_of_range_refused)
{
    start("uring");
    make_file("/tmp");
    ferry_segment_h segment;
    uintptr_t addr = owner_start(path, 0, &segment);
    memset(local, 0xab, 8192);
    cr_assert_neq(one_request(engine, FERRY_OP_WRITE, local, segment, addr + RANGE - 4096, 8192,
                              NULL), FERRY_OK);
    cr_assert_neq(one_request(engine, FERRY_OP_READ, local, segment, addr + RANGE, 1, NULL),
                  FERRY_OK);
    cr_assert_neq(one_request(engine, FERRY_OP_READ, local, segment, addr - 1, 2, NULL),
                  FERRY_OK);
    unsigned char check[8192];
    file_read(path, OFFSET + RANGE - 4096, check, sizeof(check));
    for (size_t i = 0; i < sizeof(check); i++)
        cr_assert_eq(check[i], 0);
    /* tcp's target checks the same bounds */
    cr_assert_neq(one_request_via(engine, FERRY_OP_WRITE, local, segment, addr + RANGE - 4096,
                                  8192, "tcp", NULL), FERRY_OK);
    file_read(path, OFFSET + RANGE - 4096, check, sizeof(check));
    for (size_t i = 0; i < sizeof(check); i++)
        cr_assert_eq(check[i], 0);
    ferry_segment_close(engine, segment);
}

/* The owner on "another host" (its own host identity, env: its other
 * settings after it): the file transport does not reach its file, tcp
 * serves it, the owner doing the I/O.  It registers [OFFSET, +RANGE) of
 * path with options. */
static uintptr_t remote_owner_start(const char *const *env, unsigned options,
                                    ferry_segment_h *segment_p)
{
    const char *all[8] = {"FERRY_HOST_ID=storage-owner-host"};
    for (size_t i = 0; env != NULL && env[i] != NULL && i + 2 < 8; i++)
        all[i + 1] = env[i];
    uintptr_t addr = 0;
    cr_assert_eq(peer_start(&peer, all), 0);
    peer_running = 1;
    const char *reply = peer_cmd(&peer, "sreg %zu %zu %u %s rw", OFFSET, RANGE, options, path);
    cr_assert_eq(sscanf(reply, "SREG %" SCNxPTR, &addr), 1, "%s", reply);
    cr_assert_eq(ferry_segment_open(engine, peer.name, segment_p), FERRY_OK);
    return addr;
}

/* Served writes and reads, whole range, odd offsets and lengths, across
 * the target's 256 KiB chunks, bytes checked in the file and back. */
static void served_checked(const char *const *env, unsigned options)
{
    start("uring");
    make_file("/tmp");
    ferry_segment_h segment;
    uintptr_t addr = remote_owner_start(env, options, &segment);
    unsigned char *check = malloc(RANGE);
    static const struct { size_t at, length; } cases[] = {
        {0, RANGE}, {1, 4095}, {RANGE - 3, 3}, {77777, 3 * MIB}, {256 * KIB - 5, 600 * KIB + 11}};
    for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        test_pattern_fill(local + 5, cases[i].length, 200 + i);
        cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, local + 5, segment,
                                           addr + cases[i].at, cases[i].length, "tcp"),
                     FERRY_OK, "case %u", i);
        file_read(path, OFFSET + cases[i].at, check, cases[i].length);
        cr_assert_eq(test_pattern_check(check, cases[i].length, 200 + i), SIZE_MAX);
        memset(local + RANGE, 0, cases[i].length);
        cr_assert_eq(one_request_served_by(engine, FERRY_OP_READ, local + RANGE, segment,
                                           addr + cases[i].at, cases[i].length, "tcp"),
                     FERRY_OK, "case %u", i);
        cr_assert_eq(test_pattern_check(local + RANGE, cases[i].length, 200 + i), SIZE_MAX);
    }
    cr_assert_neq(one_request(engine, FERRY_OP_READ, local, segment, addr + RANGE - 1, 2, NULL),
                  FERRY_OK);
    free(check);
    ferry_segment_close(engine, segment);
}

Test(storage, other_host_served_by_tcp)
{
    served_checked(NULL, 0);
}

/* Small socket buffers: the mapped sends and the spliced writes stop and
 * resume many times within a request. */
Test(storage, other_host_served_by_tcp_small_socket_buffers)
{
    static const char *const env[] = {"FERRY_TCP_SOCKBUF=16k", NULL};
    served_checked(env, 0);
}

/* The bounce-buffer path of before, still taken for DIRECT storage. */
Test(storage, other_host_served_by_tcp_staged)
{
    static const char *const env[] = {"FERRY_TCP_STORAGE_STAGED=yes", NULL};
    served_checked(env, 0);
}

Test(storage, other_host_served_by_tcp_durable)
{
    served_checked(NULL, FERRY_STORAGE_DURABLE);
}

/* DIRECT storage: the owner asked for no page cache, the staged path
 * serves it (storage_file refuses it). */
Test(storage, other_host_served_by_tcp_direct_storage)
{
    served_checked(NULL, FERRY_STORAGE_DIRECT);
}

/* Storage above the 64 GiB the owner maps: its served reads go by
 * sendfile.  A sparse file; bytes checked at both ends of the range. */
Test(storage, served_by_tcp_unmapped_large_storage)
{
    start("uring");
    make_file("/tmp");
    const uint64_t large = (uint64_t)65 << 30;
    cr_assert_eq(truncate(path, (off_t)large), 0);
    static const char *const env[] = {"FERRY_HOST_ID=storage-owner-host", NULL};
    cr_assert_eq(peer_start(&peer, env), 0);
    peer_running = 1;
    uintptr_t addr = 0;
    const char *reply = peer_cmd(&peer, "sreg 0 %" PRIu64 " 0 %s rw", large, path);
    cr_assert_eq(sscanf(reply, "SREG %" SCNxPTR, &addr), 1, "%s", reply);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    static const uint64_t at[] = {5, ((uint64_t)65 << 30) - 3 * MIB - 7};
    for (unsigned i = 0; i < 2; i++) {
        test_pattern_fill(local, 3 * MIB, 60 + i);
        cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, local, segment, addr + at[i],
                                           3 * MIB, "tcp"), FERRY_OK);
        file_read(path, at[i], local + RANGE, 3 * MIB);
        cr_assert_eq(test_pattern_check(local + RANGE, 3 * MIB, 60 + i), SIZE_MAX);
        memset(local + RANGE, 0, 3 * MIB);
        cr_assert_eq(one_request_served_by(engine, FERRY_OP_READ, local + RANGE, segment,
                                           addr + at[i], 3 * MIB, "tcp"), FERRY_OK);
        cr_assert_eq(test_pattern_check(local + RANGE, 3 * MIB, 60 + i), SIZE_MAX);
    }
    ferry_segment_close(engine, segment);
}

/* A file cut short after its registration: a served read or write past
 * its new end FAILs whole (never a short success, no byte written), what
 * is left still reads. */
Test(storage, served_io_of_truncated_file_fails)
{
    start("uring");
    make_file("/tmp");
    ferry_segment_h segment;
    uintptr_t addr = remote_owner_start(NULL, 0, &segment);
    test_pattern_fill(local, MIB, 41);
    cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, local, segment, addr, MIB, "tcp"),
                 FERRY_OK);
    cr_assert_eq(truncate(path, OFFSET + MIB / 2), 0);
    ferry_xfer_status_t xs;
    memset(local + RANGE, 0, MIB);
    cr_assert_neq(one_request(engine, FERRY_OP_READ, local + RANGE, segment, addr, MIB, &xs),
                  FERRY_OK);
    cr_assert_eq(xs.state, FERRY_XFER_FAILED);
    cr_assert_eq(one_request_served_by(engine, FERRY_OP_READ, local + RANGE, segment, addr,
                                       MIB / 2, "tcp"), FERRY_OK);
    cr_assert_eq(test_pattern_check(local + RANGE, MIB / 2, 41), SIZE_MAX);
    memset(local, 0x77, MIB);
    cr_assert_neq(one_request(engine, FERRY_OP_WRITE, local, segment, addr, MIB, &xs), FERRY_OK);
    cr_assert_eq(xs.state, FERRY_XFER_FAILED);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq((uint64_t)st.st_size, OFFSET + MIB / 2, "the failed write changed the size");
    file_read(path, OFFSET, local + RANGE, MIB / 2);
    cr_assert_eq(test_pattern_check(local + RANGE, MIB / 2, 41), SIZE_MAX,
                 "the failed write landed");
    ferry_segment_close(engine, segment);
}

/* A read-only registration: peers read, writes are refused. */
Test(storage, read_only_refuses_writes)
{
    start("uring");
    make_file("/tmp");
    unsigned char pattern[8192];
    test_pattern_fill(pattern, sizeof(pattern), 9);
    file_write(path, OFFSET, pattern, sizeof(pattern));
    uintptr_t addr = 0;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    peer_running = 1;
    const char *reply = peer_cmd(&peer, "sreg %zu %zu 0 %s r", OFFSET, RANGE, path);
    cr_assert_eq(sscanf(reply, "SREG %" SCNxPTR, &addr), 1, "%s", reply);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    cr_assert_eq(one_request(engine, FERRY_OP_READ, local, segment, addr, 8192, NULL),
                 FERRY_OK);
    cr_assert_eq(test_pattern_check(local, 8192, 9), SIZE_MAX);
    cr_assert_neq(one_request(engine, FERRY_OP_WRITE, local, segment, addr, 8192, NULL),
                  FERRY_OK);
    ferry_segment_close(engine, segment);
}

/* Our own storage buffer: requests to our own segment go to the file. */
Test(storage, own_segment_copies)
{
    start("uring");
    make_file("/dev/shm");
    ferry_storage_region_t region = {.field_mask = FERRY_STORAGE_FIELD_OFFSET,
                                     .path = path, .offset = MIB};
    void *addr = NULL;
    cr_assert_eq(ferry_register_storage(engine, &region, &addr), FERRY_OK);
    ferry_segment_h self;
    cr_assert_eq(ferry_segment_open(engine, ferry_engine_segment_name(engine), &self),
                 FERRY_OK);
    test_pattern_fill(local, 3 * MIB, 4);
    cr_assert_eq(one_request(engine, FERRY_OP_WRITE, local, self, (uintptr_t)addr + 1, 3 * MIB,
                             NULL), FERRY_OK);
    file_read(path, MIB + 1, local + RANGE, 3 * MIB);
    cr_assert_eq(test_pattern_check(local + RANGE, 3 * MIB, 4), SIZE_MAX);
    /* the length ran to the end of the file: one byte more is refused */
    cr_assert_neq(one_request(engine, FERRY_OP_READ, local, self, (uintptr_t)addr + 1,
                              FILE_SIZE - MIB, NULL), FERRY_OK);
    /* the reserved addresses are no memory: registering over them overlaps,
     * and memory cannot pass for storage */
    cr_assert_eq(ferry_register(engine, addr, 4096, "cpu", 0), FERRY_ERR_OVERLAP);
    cr_assert_eq(ferry_register(engine, addr, FILE_SIZE - MIB, "file", 0),
                 FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_register(engine, local, 4096, "file", 0), FERRY_ERR_INVALID_PARAM);
    ferry_segment_close(engine, self);
    cr_assert_eq(ferry_unregister(engine, addr), FERRY_OK);
    cr_assert_eq(ferry_unregister(engine, addr), FERRY_ERR_NOT_REGISTERED);
}

Test(storage, registration_refused_clearly)
{
    start("threads");
    make_file("/tmp");
    void *addr = NULL;
    ferry_storage_region_t region = {.path = "relative/path"};
    cr_assert_eq(ferry_register_storage(engine, &region, &addr), FERRY_ERR_INVALID_PARAM);
    region.path = "/nonexistent/ferry-storage";
    cr_assert_eq(ferry_register_storage(engine, &region, &addr), FERRY_ERR_NOT_FOUND);
    region = (ferry_storage_region_t){.field_mask = FERRY_STORAGE_FIELD_OFFSET |
                                                    FERRY_STORAGE_FIELD_LENGTH,
                                      .path = path, .offset = FILE_SIZE - 10, .length = 11};
    cr_assert_eq(ferry_register_storage(engine, &region, &addr), FERRY_ERR_OUT_OF_RANGE);
    region = (ferry_storage_region_t){.field_mask = FERRY_STORAGE_FIELD_OPTIONS, .path = path,
                                      .options = FERRY_STORAGE_BUFFERED | FERRY_STORAGE_SHARED};
    cr_assert_eq(ferry_register_storage(engine, &region, &addr), FERRY_ERR_INVALID_PARAM);
    region.path = "/dev/shm";
    region.field_mask = 0;
    cr_assert_eq(ferry_register_storage(engine, &region, &addr), FERRY_ERR_INVALID_PARAM);
    cr_assert_null(addr);
}

/* ---- keys: what the decoders refuse ---- */

static ferry_storage_key_t sample_key(void)
{
    ferry_storage_key_t key = {.addr = 0x7f0000000000, .length = 4096, .offset = 512,
                               .align = 512, .options = FERRY_STORAGE_DURABLE,
                               .kind = FERRY_STORAGE_KIND_FILE, .dev = 0x803, .ino = 42};
    strcpy(key.host, "host a;b");
    strcpy(key.path, "/data/with space/%x");
    return key;
}

Test(storage_key, round_trip_and_canonical)
{
    ferry_storage_key_t key = sample_key(), back;
    char *text = ferry_storage_key_format(&key);
    cr_assert_not_null(text);
    const char *why;
    cr_assert_eq(ferry_storage_key_parse(text, &back, &why), FERRY_OK, "%s: %s", text, why);
    cr_assert_str_eq(back.path, key.path);
    cr_assert_str_eq(back.host, key.host);
    cr_assert_eq(back.offset, 512);
    cr_assert_eq(back.ino, 42);
    cr_assert_eq(back.wwid[0], '\0');
    free(text);
}

Test(storage_key, hostile_values_refused)
{
    static const char *const bad[] = {
        "",
        "v2 addr=1000 len=1000 off=0 align=200 opt=0 kind=file host=h dev=1 ino=1 wwid=- path=/f",
        "v1 addr=1000 len=0 off=0 align=200 opt=0 kind=file host=h dev=1 ino=1 wwid=- path=/f",
        "v1 addr=ffffffffffffffff len=2 off=0 align=200 opt=0 kind=file host=h dev=1 ino=1 "
        "wwid=- path=/f",
        "v1 addr=1000 len=10 off=fffffffffffffff9 align=200 opt=0 kind=file host=h dev=1 ino=1 "
        "wwid=- path=/f",
        "v1 addr=1000 len=1000 off=0 align=300 opt=0 kind=file host=h dev=1 ino=1 wwid=- path=/f",
        "v1 addr=1000 len=1000 off=0 align=200000 opt=0 kind=file host=h dev=1 ino=1 wwid=- "
        "path=/f",
        "v1 addr=1000 len=1000 off=0 align=200 opt=10 kind=file host=h dev=1 ino=1 wwid=- path=/f",
        "v1 addr=1000 len=1000 off=0 align=200 opt=0 kind=pipe host=h dev=1 ino=1 wwid=- path=/f",
        "v1 addr=1000 len=1000 off=0 align=200 opt=0 kind=file host=h dev=1 ino=1 wwid=- path=f",
        "v1 addr=1000 len=1000 off=0 align=200 opt=0 kind=file host=h dev=1 ino=1 wwid=- "
        "path=/f%00x",
        "v1 addr=1000 len=1000 off=0 align=200 opt=0 kind=file host=h dev=1 ino=1 wwid=- "
        "path=/f%2",
        "v1 addr=1000 len=1000 off=0 align=200 opt=0 kind=file host=h dev=1 ino=1 wwid=- "
        "path=/%66",
        "v1 addr=01000 len=1000 off=0 align=200 opt=0 kind=file host=h dev=1 ino=1 wwid=- path=/f",
        "v1 addr=1000  len=1000 off=0 align=200 opt=0 kind=file host=h dev=1 ino=1 wwid=- path=/f",
        "v1 addr=1000 len=1000 off=0 align=200 opt=0 kind=file host=h dev=1 ino=1 wwid=- path=/f ",
        "v1 addr=1000 len=1000 off=0 align=200 opt=0 kind=block host=h dev=1 ino=1 wwid=- path=/f",
        "v1 addr=1000 len=1000 off=0 align=200 opt=0 kind=file host=h dev=1 ino=1 path=/f",
    };
    ferry_storage_key_t key;
    const char *why;
    const char *good = "v1 addr=1000 len=1000 off=0 align=200 opt=0 kind=file host=h dev=1 "
                       "ino=1 wwid=- path=/f";
    cr_assert_eq(ferry_storage_key_parse(good, &key, &why), FERRY_OK, "%s", why);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(ferry_storage_key_parse(bad[i], &key, &why), FERRY_ERR_DECODE, "%s",
                     bad[i]);
        cr_assert_not_null(why);
    }
}

/* A JSON descriptor whose storage key disagrees with its buffer. */
Test(storage_key, descriptor_with_bad_key_refused)
{
    static const char *const texts[] = {
        /* the key's addr is not the buffer's */
        "{\"version\":1,\"name\":\"s\",\"generation\":\"0x1\",\"host\":\"h\",\"rpc\":\"127.0.0.1:1\","
        "\"transports\":{\"file\":\"x\"},\"buffers\":[{\"addr\":\"0x1000\",\"length\":\"4096\","
        "\"location\":\"file\",\"access\":\"rw\",\"keys\":{\"file\":\"v1 addr=2000 len=1000 "
        "off=0 align=200 opt=0 kind=file host=h dev=1 ino=1 wwid=- path=/f\"}}],\"files\":[]}",
        /* another host's */
        "{\"version\":1,\"name\":\"s\",\"generation\":\"0x1\",\"host\":\"h\",\"rpc\":\"127.0.0.1:1\","
        "\"transports\":{\"file\":\"x\"},\"buffers\":[{\"addr\":\"0x1000\",\"length\":\"4096\","
        "\"location\":\"file\",\"access\":\"rw\",\"keys\":{\"file\":\"v1 addr=1000 len=1000 "
        "off=0 align=200 opt=0 kind=file host=g dev=1 ino=1 wwid=- path=/f\"}}],\"files\":[]}",
        /* a storage buffer without its key */
        "{\"version\":1,\"name\":\"s\",\"generation\":\"0x1\",\"host\":\"h\",\"rpc\":\"127.0.0.1:1\","
        "\"transports\":{\"file\":\"x\"},\"buffers\":[{\"addr\":\"0x1000\",\"length\":\"4096\","
        "\"location\":\"file\",\"access\":\"rw\",\"keys\":{}}],\"files\":[]}",
    };
    const char *good =
        "{\"version\":1,\"name\":\"s\",\"generation\":\"0x1\",\"host\":\"h\",\"rpc\":\"127.0.0.1:1\","
        "\"transports\":{\"file\":\"x\"},\"buffers\":[{\"addr\":\"0x1000\",\"length\":\"4096\","
        "\"location\":\"file\",\"access\":\"rw\",\"keys\":{\"file\":\"v1 addr=1000 len=1000 "
        "off=0 align=200 opt=0 kind=file host=h dev=1 ino=1 wwid=- path=/f\"}}],\"files\":[]}";
    ferry_descriptor_t *desc = NULL;
    cr_assert_eq(ferry_descriptor_decode(good, strlen(good), &desc), FERRY_OK);
    /* and the compact form carries it the same */
    char *compact = NULL;
    size_t length = 0;
    cr_assert_eq(ferry_descriptor_encode_as(desc, FERRY_DESC_FORM_COMPACT, &compact, &length),
                 FERRY_OK);
    ferry_descriptor_t *again = NULL;
    cr_assert_eq(ferry_descriptor_decode(compact, length, &again), FERRY_OK);
    cr_assert(ferry_descriptor_same(desc, again));
    ferry_descriptor_unref(again);
    free(compact);
    ferry_descriptor_unref(desc);
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        desc = NULL;
        cr_assert_eq(ferry_descriptor_decode(texts[i], strlen(texts[i]), &desc),
                     FERRY_ERR_DECODE, "text %zu", i);
        cr_assert_null(desc);
    }
}

/* ---- NVMe identity: WWIDs from a fake sysfs tree ---- */

static void write_text(const char *file, const char *text)
{
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f, "%s", file);
    fputs(text, f);
    fclose(f);
}

Test(storage_key, wwid_from_fake_sysfs)
{
    char root[] = "/tmp/ferry-sysfs-XXXXXX", dir[512], file[600], found[600];
    cr_assert_not_null(mkdtemp(root));
    /* the owner's side: dev/block/M:m/wwid of its device */
    snprintf(dir, sizeof(dir), "%s/dev", root);
    mkdir(dir, 0755);
    snprintf(dir, sizeof(dir), "%s/dev/block", root);
    mkdir(dir, 0755);
    snprintf(dir, sizeof(dir), "%s/dev/block/259:3", root);
    mkdir(dir, 0755);
    snprintf(file, sizeof(file), "%s/wwid", dir);
    write_text(file, "eui.0025388b91b5f0f1\n");
    char wwid[FERRY_STORAGE_WWID_MAX + 1];
    ferry_storage_wwid_of(root, makedev(259, 3), wwid, sizeof(wwid));
    cr_assert_str_eq(wwid, "eui.0025388b91b5f0f1");
    ferry_storage_wwid_of(root, makedev(259, 4), wwid, sizeof(wwid));
    cr_assert_str_eq(wwid, "");
    /* the peer's side: block/NAME/wwid, the namespace under another name */
    snprintf(dir, sizeof(dir), "%s/block", root);
    mkdir(dir, 0755);
    snprintf(dir, sizeof(dir), "%s/block/nvme1n1", root);
    mkdir(dir, 0755);
    snprintf(file, sizeof(file), "%s/wwid", dir);
    write_text(file, "eui.0025388b91b5f0f1 \n");
    snprintf(dir, sizeof(dir), "%s/block/nvme0n1", root);
    mkdir(dir, 0755);
    snprintf(file, sizeof(file), "%s/wwid", dir);
    write_text(file, "eui.ffff\n");
    cr_assert(ferry_storage_wwid_find(root, "/devroot", "", "eui.0025388b91b5f0f1", found,
                                      sizeof(found)));
    cr_assert_str_eq(found, "/devroot/nvme1n1");
    cr_assert_not(ferry_storage_wwid_find(root, "/dev", "", "eui.1234", found, sizeof(found)));
    cr_assert_not(ferry_storage_wwid_find(root, "/dev", "", "", found, sizeof(found)));
    /* the mapping wins over sysfs (an NVMe-oF attachment under another name) */
    cr_assert(ferry_storage_wwid_find(root, "/dev", "eui.1=/dev/x;eui.0025388b91b5f0f1=/dev/nvme9n1",
                                      "eui.0025388b91b5f0f1", found, sizeof(found)));
    cr_assert_str_eq(found, "/dev/nvme9n1");
    char command[600];
    snprintf(command, sizeof(command), "rm -rf %s", root);
    cr_assert_eq(system(command), 0);
}

/* ---- a loop block device ---- */

static int run_capture(const char *command, char *out, size_t size)
{
    FILE *p = popen(command, "r");
    if (p == NULL)
        return -1;
    out[0] = '\0';
    if (fgets(out, (int)size, p) == NULL)
        out[0] = '\0';
    out[strcspn(out, "\n")] = '\0';
    return pclose(p);
}

static char loop_device[128];

static void loop_detach(void)
{
    stop();
    if (loop_device[0] != '\0') {
        char command[256];
        snprintf(command, sizeof(command), "losetup -d %s", loop_device);
        if (system(command) != 0)
            fprintf(stderr, "test_storage: %s failed\n", command);
    }
    loop_device[0] = '\0';
}

/* A loop device on a new file, or the test skips saying why. */
static void loop_attach(void)
{
    make_file("/tmp");
    char command[512];
    snprintf(command, sizeof(command), "losetup -f --show %s 2>/dev/null", path);
    if (geteuid() != 0 || run_capture(command, loop_device, sizeof(loop_device)) != 0 ||
        loop_device[0] != '/') {
        loop_device[0] = '\0';
        cr_skip_test("cannot attach a loop device here (needs root and /dev/loop-control)");
    }
}

Test(storage, loop_block_device, .fini = loop_detach)
{
    start("uring");
    loop_attach();
    read_write_checked(loop_device, 0);
}

/* The owner's block device has a WWID (a fake sysfs tree says so): the key
 * names it, the initiator finds it by WWID under another name, and the
 * storage counts as shared between hosts (direct, aligned I/O only). */
Test(storage, loop_block_device_by_wwid, .fini = loop_detach)
{
    char root[] = "/tmp/ferry-sysfs-XXXXXX", dir[600], command[700];
    cr_assert_not_null(mkdtemp(root));
    setenv("FERRY_FILE_SYSFS_ROOT", root, 1); /* the peer inherits it */
    setenv("FERRY_FILE_DEV_ROOT", root, 1);
    start("uring");
    loop_attach();
    struct stat st;
    cr_assert_eq(stat(loop_device, &st), 0);
    snprintf(command, sizeof(command),
             "mkdir -p %s/dev/block/%u:%u %s/block/nvme7n1 && echo eui.00ffee0011 > "
             "%s/dev/block/%u:%u/wwid && echo eui.00ffee0011 > %s/block/nvme7n1/wwid && "
             "ln -s %s %s/nvme7n1", root, major(st.st_rdev), minor(st.st_rdev), root, root,
             major(st.st_rdev), minor(st.st_rdev), root, loop_device, root);
    cr_assert_eq(system(command), 0);
    read_write_checked_as(loop_device, 0, 1);
    unsetenv("FERRY_FILE_SYSFS_ROOT");
    unsetenv("FERRY_FILE_DEV_ROOT");
    snprintf(dir, sizeof(dir), "rm -rf %s", root);
    cr_assert_eq(system(dir), 0);
}

/* ---- failures ---- */

Test(storage, killed_owner_fails_requests)
{
    start("uring");
    make_file("/tmp");
    ferry_segment_h segment;
    uintptr_t addr = owner_start(path, 0, &segment);
    cr_assert_eq(one_request(engine, FERRY_OP_WRITE, local, segment, addr, 4096, NULL),
                 FERRY_OK);
    peer_kill(&peer, SIGKILL);
    peer_running = 0;
    usleep(100 * 1000);
    ferry_xfer_status_t xs;
    cr_assert_neq(one_request(engine, FERRY_OP_WRITE, local, segment, addr, 4096, &xs),
                  FERRY_OK);
    cr_assert_eq(xs.state, FERRY_XFER_FAILED);
    ferry_segment_close(engine, segment);
}

typedef struct writer {
    ferry_segment_h segment;
    uintptr_t addr;
    atomic_int stop;
    atomic_long completed;
    ferry_status_t last;
} writer_t;

static void *write_loop(void *arg)
{
    writer_t *w = arg;
    ferry_batch_h batch;
    if (ferry_batch_create(engine, 8, &batch) != FERRY_OK)
        return NULL;
    ferry_request_t reqs[8];
    for (int i = 0; i < 8; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = local + i * 64 * KIB,
                                    .target = w->segment,
                                    .target_offset = w->addr + (uint64_t)i * 64 * KIB,
                                    .length = 64 * KIB};
    while (!atomic_load(&w->stop)) {
        ferry_status_t status = ferry_batch_submit(batch, reqs, 8);
        if (status == FERRY_OK)
            status = ferry_batch_wait(batch, 20000);
        w->last = status;
        if (status != FERRY_OK)
            break;
        atomic_fetch_add(&w->completed, 1);
    }
    ferry_batch_destroy(batch);
    return NULL;
}

/* When the owner's unregister returns, no write of ours lands any more:
 * what we write into the file right after stays.  remote: the owner on
 * "another host", its tcp target writing the file. */
static void unregister_during_io_as(int remote)
{
    start("uring");
    make_file("/tmp");
    writer_t w = {0};
    w.addr = remote ? remote_owner_start(NULL, 0, &w.segment) : owner_start(path, 0, &w.segment);
    memset(local, 0x5a, 8 * 64 * KIB);
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, write_loop, &w), 0);
    while (atomic_load(&w.completed) < 20)
        usleep(1000);
    cr_assert_str_eq(peer_cmd(&peer, "aunreg %" PRIuPTR, w.addr), "OK");
    unsigned char *mine = malloc(8 * 64 * KIB);
    memset(mine, 0xc3, 8 * 64 * KIB);
    file_write(path, OFFSET, mine, 8 * 64 * KIB);
    usleep(200 * 1000);
    atomic_store(&w.stop, 1);
    pthread_join(thread, NULL);
    cr_assert_neq(w.last, FERRY_OK, "writes went on after the unregister");
    file_read(path, OFFSET, local + RANGE, 8 * 64 * KIB);
    cr_assert_eq(memcmp(local + RANGE, mine, 8 * 64 * KIB), 0,
                 "a write landed after the owner's unregister returned");
    free(mine);
    ferry_segment_close(engine, w.segment);
}

Test(storage, unregister_during_io)
{
    unregister_during_io_as(0);
}

Test(storage, unregister_during_served_io)
{
    unregister_during_io_as(1);
}

/* ---- waiting in the ring (README.md, "Waiting in the ring") ---- */

#define BIG (64 * MIB)

/* The peer registers [0, +length) of a new file in /tmp holding a
 * pattern (seed), written through to the disk so that O_DIRECT reads go to
 * it (not to holes, which the file system fills at once). */
static uintptr_t big_owner_start(size_t length, unsigned seed, ferry_segment_h *segment_p)
{
    snprintf(path, sizeof(path), "/tmp/ferry-storage-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    unsigned char *pattern = malloc(length);
    cr_assert_not_null(pattern);
    test_pattern_fill(pattern, length, seed);
    cr_assert_eq(ferry_storage_full_io(fd, 1, pattern, length, 0, 0), FERRY_OK);
    cr_assert_eq(fdatasync(fd), 0);
    close(fd);
    free(pattern);
    uintptr_t addr = 0;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    peer_running = 1;
    const char *reply = peer_cmd(&peer, "sreg 0 %zu 0 %s rw", length, path);
    cr_assert_eq(sscanf(reply, "SREG %" SCNxPTR, &addr), 1, "%s", reply);
    cr_assert_eq(ferry_segment_open(engine, peer.name, segment_p), FERRY_OK);
    return addr;
}

typedef struct caller {
    ferry_segment_h segment;
    uintptr_t addr;        /* this caller's 4 KiB blocks start here */
    unsigned id;
    int failed;            /* the round that failed, plus one */
} caller_t;

/* Rounds of a 4 KiB direct write and its read back, each waited for alone
 * (no spin: each wait sleeps, in the ring or beside its sitter). */
static void *caller_loop(void *arg)
{
    enum { ROUNDS = 100 };
    caller_t *c = arg;
    unsigned char *mine = local + c->id * 2 * 4096, *back = mine + 4096;
    ferry_batch_h batch;
    if (ferry_batch_create(engine, 1, &batch) != FERRY_OK) {
        c->failed = 1;
        return NULL;
    }
    for (unsigned round = 0; round < ROUNDS && !c->failed; round++) {
        unsigned seed = c->id * 1000 + round;
        uint64_t at = c->addr + (uint64_t)(round % 16) * 4096;
        test_pattern_fill(mine, 4096, seed);
        ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = mine, .target = c->segment,
                               .target_offset = at, .length = 4096, .transport = "file"};
        memset(back, 0, 4096);
        if (ferry_batch_submit(batch, &req, 1) != FERRY_OK ||
            ferry_batch_wait(batch, 20000) != FERRY_OK)
            c->failed = (int)round + 1;
        req.opcode = FERRY_OP_READ;
        req.local = back;
        if (!c->failed && (ferry_batch_submit(batch, &req, 1) != FERRY_OK ||
                           ferry_batch_wait(batch, 20000) != FERRY_OK ||
                           test_pattern_check(back, 4096, seed) != SIZE_MAX))
            c->failed = (int)round + 1;
    }
    ferry_batch_destroy(batch);
    return NULL;
}

/* Several callers on one ring: one sits, the others sleep beside it and
 * are woken by whoever reaps their completions, and (a queue of 2) submits
 * wait for room; every byte checked. */
static void several_callers(const char *io_engine)
{
    enum { CALLERS = 4 };
    setenv("FERRY_WAIT_SPIN", "0", 1);
    setenv("FERRY_FILE_QUEUE_DEPTH", "2", 1);
    start(io_engine);
    unsetenv("FERRY_WAIT_SPIN");
    unsetenv("FERRY_FILE_QUEUE_DEPTH");
    make_file("/tmp");
    ferry_segment_h segment;
    uintptr_t addr = owner_start(path, 0, &segment);
    caller_t callers[CALLERS];
    pthread_t threads[CALLERS];
    for (unsigned i = 0; i < CALLERS; i++) {
        callers[i] = (caller_t){.segment = segment, .addr = addr + i * 16 * 4096, .id = i};
        cr_assert_eq(pthread_create(&threads[i], NULL, caller_loop, &callers[i]), 0);
    }
    for (unsigned i = 0; i < CALLERS; i++) {
        pthread_join(threads[i], NULL);
        cr_assert_eq(callers[i].failed, 0, "caller %u: round %d failed", i,
                     callers[i].failed - 1);
    }
    ferry_segment_close(engine, segment);
}

Test(storage, several_callers_one_ring_uring)
{
    several_callers("uring");
}

Test(storage, several_callers_threads)
{
    several_callers("threads");
}

/* A 64 MiB direct read takes milliseconds: a wait of 1 ms, blocked in the
 * ring, returns FERRY_ERR_TIMEOUT and the request goes on; the next wait
 * sees it done, every byte right. */
Test(storage, timeout_while_waiting_in_the_ring)
{
    start("uring");
    ferry_segment_h segment;
    uintptr_t addr = big_owner_start(BIG, 21, &segment);
    unsigned char *buffer;
    cr_assert_eq(posix_memalign((void **)&buffer, 4096, BIG), 0);
    ferry_request_t req = {.opcode = FERRY_OP_READ, .local = buffer, .target = segment,
                           .target_offset = addr, .length = BIG, .transport = "file"};
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, 1, &batch), FERRY_OK);
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_OK);
    uint64_t start_us = ferry_time_us();
    cr_assert_eq(ferry_batch_wait(batch, 1), FERRY_ERR_TIMEOUT);
    cr_assert_lt(ferry_time_us() - start_us, 5000000u, "the 1 ms wait took seconds");
    cr_assert_eq(ferry_batch_wait(batch, 20000), FERRY_OK);
    cr_assert_eq(test_pattern_check(buffer, BIG, 21), SIZE_MAX);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    free(buffer);
    ferry_segment_close(engine, segment);
}

typedef struct big_waiter {
    ferry_segment_h segment;
    uintptr_t addr;
    unsigned char *buffer;
    atomic_int waiting;
    ferry_status_t status;
} big_waiter_t;

static void *big_read_wait(void *arg)
{
    big_waiter_t *b = arg;
    ferry_request_t req = {.opcode = FERRY_OP_READ, .local = b->buffer, .target = b->segment,
                           .target_offset = b->addr, .length = BIG, .transport = "file"};
    ferry_batch_h batch;
    b->status = ferry_batch_create(engine, 1, &batch);
    if (b->status != FERRY_OK)
        return NULL;
    b->status = ferry_batch_submit(batch, &req, 1);
    atomic_store(&b->waiting, 1);
    if (b->status == FERRY_OK)
        b->status = ferry_batch_wait(batch, 20000);
    ferry_batch_destroy(batch);
    return NULL;
}

/* While a thread waits in the ring for a long read, another batch's request
 * completes: the sitter takes its completion and finishes it, so its
 * submitter, which only polls the status (no wait, no progress), sees it. */
Test(storage, waiter_finishes_other_batches)
{
    start("uring");
    big_waiter_t b = {0};
    b.addr = big_owner_start(BIG + 4096, 22, &b.segment);
    cr_assert_eq(posix_memalign((void **)&b.buffer, 4096, BIG), 0);
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, big_read_wait, &b), 0);
    while (!atomic_load(&b.waiting))
        usleep(100);
    ferry_request_t req = {.opcode = FERRY_OP_READ, .local = local, .target = b.segment,
                           .target_offset = b.addr + BIG, .length = 4096, .transport = "file"};
    ferry_batch_h batch = submit_and_poll(&req);
    unsigned char *expect = malloc(BIG + 4096);
    test_pattern_fill(expect, BIG + 4096, 22);
    cr_assert_eq(memcmp(local, expect + BIG, 4096), 0);
    cr_assert_eq(ferry_batch_wait(batch, 1000), FERRY_OK);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    pthread_join(thread, NULL);
    cr_assert_eq(b.status, FERRY_OK);
    cr_assert_eq(memcmp(b.buffer, expect, BIG), 0);
    free(expect);
    free(b.buffer);
    ferry_segment_close(engine, b.segment);
}
