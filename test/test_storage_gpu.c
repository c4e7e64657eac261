/* Device memory to and from storage buffers (issue 21, item 5): the
 * engine's own storage, a same-host peer's through the file transport, and
 * another host's through tcp, 1 B to 5 MiB, aligned and unaligned, bytes
 * checked in the file itself and back on the device; FERRY_STORAGE_GPU's
 * choices, cuFile forced where it cannot serve, direct-only storage.  The
 * device is FERRY_TEST_GPU_KIND (default the suite's memfd stand-in
 * "testgpu", whose device memory faults on any CPU access; "cuda" on a GPU
 * machine, where FERRY_STORAGE_GPU=cufile runs cuFile itself). */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/core/core.h"
#include "capture_stderr.h"
#include "gpu_vendor.h"
#include "one_request.h"
#include "peer_process.h"
#include "test_pattern.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define FILE_SIZE (12 * MIB)
#define OFFSET (64 * KIB) /* of the registered range in the file */
#define RANGE (8 * MIB)
#define DEVICE_LENGTH (6 * MIB)

static const ferry_accel_ops_t *vendor;
static char kind[32];
static char device0[48];
static ferry_engine_h engine;
static void *device;
static char path[256];
static peer_process_t peer;
static int peer_running;

static void find_vendor(void)
{
    vendor = gpu_vendor_find(kind, sizeof(kind), device0, sizeof(device0));
    if (vendor == NULL)
        cr_skip_test("no %s device here (ferry_info -d says why): GPU storage tests skipped", kind);
}

/* A FILE_SIZE file of zeros in dir. */
static void make_file(const char *dir)
{
    snprintf(path, sizeof(path), "%s/ferry-storage-gpu-XXXXXX", dir);
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0, "mkstemp in %s: %s", dir, strerror(errno));
    cr_assert_eq(ftruncate(fd, FILE_SIZE), 0);
    close(fd);
}

/* The engine, with FERRY_STORAGE_GPU=mode and small staging buffers (a
 * request takes several, and the page-locked bound is passed: pageable
 * buffers used too), and a device buffer. */
static void start(const char *mode)
{
    find_vendor();
    setenv("FERRY_STORAGE_GPU", mode, 1);
    setenv("FERRY_STAGE_CHUNK", "256k", 1);
    setenv("FERRY_STAGE_PINNED_MAX", "512k", 1);
    setenv("FERRY_TRANSPORTS", "file,tcp", 1);
    make_file("/tmp");
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    cr_assert_eq(ferry_alloc(engine, DEVICE_LENGTH, device0, 0, &device), FERRY_OK);
}

static void stop(void)
{
    if (peer_running)
        peer_stop(&peer);
    peer_running = 0;
    if (engine) {
        if (device)
            ferry_free(engine, device);
        ferry_engine_destroy(engine);
    }
    engine = NULL;
    device = NULL;
    if (path[0] != '\0')
        unlink(path);
    path[0] = '\0';
    unsetenv("FERRY_STORAGE_GPU");
    unsetenv("FERRY_STAGE_CHUNK");
    unsetenv("FERRY_STAGE_PINNED_MAX");
    unsetenv("FERRY_TRANSPORTS");
}

TestSuite(storage_gpu, .fini = stop, .timeout = 120);

static void file_io(int write, uint64_t offset, void *buffer, size_t length)
{
    int fd = open(path, write ? O_WRONLY : O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ferry_storage_full_io(fd, write, buffer, length, offset, 0), FERRY_OK);
    close(fd);
}

/* Nothing was written to [offset, +length) of the file (it was zeros). */
static void file_untouched(uint64_t offset, size_t length)
{
    unsigned char *check = malloc(length);
    file_io(0, offset, check, length);
    for (size_t i = 0; i < length; i++)
        cr_assert_eq(check[i], 0, "byte %zu written", i);
    free(check);
}

static void device_fill(void *device, size_t length, unsigned seed)
{
    gpu_vendor_fill(vendor, device, length, seed);
}

static size_t device_check(const void *device, size_t length, unsigned seed)
{
    return gpu_vendor_check(vendor, device, length, seed);
}

/* Where in the buffer, how long, and where in the device buffer: aligned
 * (direct I/O where the file system takes it) and not. */
static const struct {
    size_t at, length, device_at;
} cases[] = {
    {0, 1, 0},
    {4096, 4096, 4096},          /* one aligned page */
    {1, 4095, 3},                /* unaligned everywhere */
    {64 * KIB, 256 * KIB, 0},    /* exactly one staging buffer */
    {12345, MIB + 7, 17},        /* several buffers, unaligned */
    {MIB, 5 * MIB, 0},           /* aligned, many buffers */
    {RANGE - 100, 100, 4096},    /* the last bytes */
};

/* Write each case from device memory into [addr + at, ...) of segment and
 * read it back into zeroed device memory; the file holds the bytes. */
static void write_read_cases(ferry_segment_h segment, uintptr_t addr, const char *transport)
{
    unsigned char *check = malloc(RANGE);
    for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t at = cases[i].at, length = cases[i].length;
        char *local = (char *)device + cases[i].device_at;
        unsigned seed = 300 + i;
        device_fill(local, length, seed);
        cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, local, segment, addr + at,
                                           length, transport),
                     FERRY_OK, "write case %u", i);
        file_io(0, OFFSET + at, check, length);
        cr_assert_eq(test_pattern_check(check, length, seed), SIZE_MAX,
                     "case %u: the file holds the bytes", i);
        /* The file changes under us; a read brings the new bytes. */
        test_pattern_fill(check, length, seed + 50);
        file_io(1, OFFSET + at, check, length);
        device_fill(local, length, 7); /* not the pattern */
        cr_assert_eq(one_request_served_by(engine, FERRY_OP_READ, local, segment, addr + at,
                                           length, transport),
                     FERRY_OK, "read case %u", i);
        size_t bad = device_check(local, length, seed + 50);
        cr_assert_eq(bad, SIZE_MAX, "case %u: byte %zu of %zu read onto the device", i, bad,
                     length);
    }
    free(check);
}

/* The peer registers [OFFSET, +RANGE) of the file; env: its environment. */
static uintptr_t owner_start(const char *const *env, unsigned options, ferry_segment_h *seg_p)
{
    uintptr_t addr = 0;
    cr_assert_eq(peer_start(&peer, env), 0, "test peer did not start");
    peer_running = 1;
    const char *reply = peer_cmd(&peer, "sreg %zu %zu %u %s rw", OFFSET, RANGE, options, path);
    cr_assert_eq(sscanf(reply, "SREG %" SCNxPTR, &addr), 1, "%s", reply);
    cr_assert_eq(ferry_segment_open(engine, peer.name, seg_p), FERRY_OK);
    return addr;
}

static void own_storage(const char *mode)
{
    start(mode);
    ferry_storage_region_t region = {.field_mask = FERRY_STORAGE_FIELD_OFFSET |
                                                   FERRY_STORAGE_FIELD_LENGTH,
                                     .path = path, .offset = OFFSET, .length = RANGE};
    void *addr = NULL;
    cr_assert_eq(ferry_register_storage(engine, &region, &addr), FERRY_OK);
    ferry_segment_h self;
    cr_assert_eq(ferry_segment_open(engine, ferry_engine_segment_name(engine), &self), FERRY_OK);
    write_read_cases(self, (uintptr_t)addr, NULL);
    /* Past the registered range: refused, nothing moved. */
    cr_assert_neq(one_request(engine, FERRY_OP_READ, device, self, (uintptr_t)addr + RANGE - 1,
                              2, NULL),
                  FERRY_OK);
    ferry_segment_close(engine, self);
    cr_assert_eq(ferry_unregister(engine, addr), FERRY_OK);
}

/* A peer owns the storage (env: its environment); transport serves it. */
static void peer_storage(const char *mode, const char *const *env, const char *transport)
{
    start(mode);
    ferry_segment_h segment;
    uintptr_t addr = owner_start(env, 0, &segment);
    write_read_cases(segment, addr, transport);
    ferry_segment_close(engine, segment);
}

Test(storage_gpu, own_storage_staging)
{
    own_storage("staging");
}

Test(storage_gpu, own_storage_auto)
{
    own_storage("auto");
}

Test(storage_gpu, same_host_peer_by_file_staging)
{
    peer_storage("staging", NULL, "file");
}

Test(storage_gpu, same_host_peer_by_file_auto)
{
    peer_storage("auto", NULL, "file");
}

/* The owner on "another host": the file transport does not reach its file,
 * tcp serves it (the owner does the I/O; this side stages the device). */
Test(storage_gpu, other_host_peer_by_tcp)
{
    static const char *const env[] = {"FERRY_HOST_ID=storage-gpu-owner-host", NULL};
    peer_storage("auto", env, "tcp");
}

/* Storage registered for direct I/O only: an unaligned I/O of device
 * memory FAILS before any byte moves; an aligned one goes (O_DIRECT) where
 * the file system takes it. */
Test(storage_gpu, direct_only_refuses_unaligned)
{
    start("staging");
    ferry_segment_h segment;
    uintptr_t addr = owner_start(NULL, FERRY_STORAGE_DIRECT, &segment);
    device_fill(device, 8192, 11);
    ferry_xfer_status_t xs;
    cr_assert_neq(one_request(engine, FERRY_OP_WRITE, device, segment, addr + 1, 4095, &xs),
                  FERRY_OK);
    cr_assert_eq(xs.error, FERRY_ERR_INVALID_PARAM);
    /* Big enough to be cut into parts (file_gpu.c), but refused whole. */
    cr_assert_neq(one_request(engine, FERRY_OP_WRITE, device, segment, addr + 1, 3 * MIB, &xs),
                  FERRY_OK);
    cr_assert_eq(xs.error, FERRY_ERR_INVALID_PARAM);
    file_untouched(OFFSET, 3 * MIB + 4096);
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0) {
        ferry_segment_close(engine, segment);
        cr_skip_test("no O_DIRECT on /tmp: the aligned case cannot run");
    }
    close(fd);
    cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, device, segment, addr, 8192,
                                       "file"),
                 FERRY_OK);
    unsigned char check[8192];
    file_io(0, OFFSET, check, sizeof(check));
    cr_assert_eq(test_pattern_check(check, sizeof(check), 11), SIZE_MAX);
    ferry_segment_close(engine, segment);
}

/* FERRY_STORAGE_GPU=cufile where cuFile cannot serve (no libcufile, or
 * memory that is not cuda's): the request FAILS with a line that says
 * why, nothing written. */
static ferry_segment_h forced_segment;
static uintptr_t forced_addr;
static ferry_status_t forced_status;

static void forced_write(void *arg)
{
    (void)arg;
    ferry_xfer_status_t xs;
    one_request(engine, FERRY_OP_WRITE, device, forced_segment, forced_addr, 4096, &xs);
    forced_status = xs.error;
}

Test(storage_gpu, cufile_forced_where_it_cannot_serve)
{
    find_vendor();
    const char *why = NULL;
    if (strcmp(kind, "cuda") == 0 && ferry_cufile_load(&why) != FERRY_CUFILE_ABSENT)
        cr_skip_test("cuFile serves cuda memory here: the forced path works (see the cuFile "
                     "tests of contrib/gpu-check.sh)");
    start("cufile");
    forced_addr = owner_start(NULL, 0, &forced_segment);
    device_fill(device, 4096, 12);
    char *log = capture_stderr(forced_write, NULL);
    cr_assert_eq(forced_status, FERRY_ERR_UNSUPPORTED);
    cr_assert_not_null(log);
    cr_assert(strstr(log, "FERRY_STORAGE_GPU=cufile") != NULL, "the log says why: %s", log);
    free(log);
    file_untouched(OFFSET, 4096);
    ferry_segment_close(engine, forced_segment);
}

Test(storage_gpu, unknown_setting_refused)
{
    setenv("FERRY_STORAGE_GPU", "gds", 1);
    ferry_engine_h e = NULL;
    cr_assert_eq(ferry_engine_create(NULL, &e), FERRY_ERR_INVALID_PARAM);
    cr_assert_null(e);
}

/* With cuda and cuFile on the GPU machine: the cuFile path itself, own and
 * same-host storage (compatibility mode there: no nvidia-fs). */
Test(storage_gpu, cufile_own_and_peer)
{
    find_vendor();
    const char *why = NULL;
    if (strcmp(kind, "cuda") != 0 || ferry_cufile_load(&why) == FERRY_CUFILE_ABSENT)
        cr_skip_test("cuFile needs cuda memory and libcufile: %s",
                     strcmp(kind, "cuda") != 0 ? "the device is not cuda" : why);
    own_storage("cufile");
    stop();
    peer_storage("cufile", NULL, "file");
}
