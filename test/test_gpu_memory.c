/*
 * Device memory in the engine: locations checked against the pointer,
 * ferry_alloc of device memory, and device buffers over transports that
 * take host memory only (tcp, shm: staged through host buffers), on either
 * side, bytes verified.  The vendor is FERRY_TEST_GPU_KIND (default the
 * test suite's memfd stand-in "testgpu", whose device memory faults on any
 * CPU access; "cuda" on a GPU machine).
 */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/core/core.h"
#include "gpu_vendor.h"
#include "one_request.h"
#include "peer_process.h"
#include "test_pattern.h"

#define MIB ((size_t)1 << 20)

static const ferry_accel_ops_t *vendor;
static char kind[32];
static char device0[48]; /* "<kind>:0" */
static ferry_engine_h engine;

static void find_vendor(void)
{
    vendor = gpu_vendor_find(kind, sizeof(kind), device0, sizeof(device0));
    if (vendor == NULL)
        cr_skip_test("no %s device here (ferry_info -d says why): GPU memory tests skipped", kind);
}

static void setup(void)
{
    find_vendor();
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
}

static void teardown(void)
{
    if (engine)
        ferry_engine_destroy(engine);
    engine = NULL;
}

/* Fill device memory with the pattern, or check it, through a host copy. */
static void device_fill(void *device, size_t length, unsigned seed)
{
    gpu_vendor_fill(vendor, device, length, seed);
}

static size_t device_check(const void *device, size_t length, unsigned seed)
{
    return gpu_vendor_check(vendor, device, length, seed);
}

/* The location the engine publishes for the buffer at addr. */
static void published_location(void *addr, char *out, size_t length)
{
    ferry_descriptor_t *desc;
    out[0] = '\0';
    cr_assert_eq(ferry_engine_local_descriptor(ferry_engine_lookup(engine), &desc, NULL),
                 FERRY_OK);
    for (size_t i = 0; i < desc->n_buffers; i++)
        if (desc->buffers[i].addr == (uintptr_t)addr)
            snprintf(out, length, "%s", desc->buffers[i].location);
    ferry_descriptor_unref(desc);
}

TestSuite(gpu_locations, .init = setup, .fini = teardown, .timeout = 60);

/* A buffer inside an allocation (a caching allocator's block): "*" finds
 * its kind and device; a location that contradicts the pointer is refused. */
Test(gpu_locations, star_detects_device_memory_and_contradictions_are_refused)
{
    void *block;
    cr_assert_eq(vendor->mem_alloc(0, 8 * MIB, &block), FERRY_OK);
    char *inside = (char *)block + 4 * MIB;
    cr_assert_eq(ferry_register(engine, inside, MIB, "*", 0), FERRY_OK);
    char location[64];
    published_location(inside, location, sizeof(location));
    cr_assert_str_eq(location, device0);
    cr_assert_eq(ferry_unregister(engine, inside), FERRY_OK);

    char other[48];
    snprintf(other, sizeof(other), "%s:1", kind);
    cr_assert_eq(ferry_register(engine, inside, MIB, "cpu", 0), FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_register(engine, inside, MIB, other, 0), FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_register(engine, inside, 5 * MIB, device0, 0), FERRY_ERR_OUT_OF_RANGE,
                 "past the allocation's end");
    cr_assert_eq(ferry_register(engine, inside, MIB, device0, 0), FERRY_OK);
    cr_assert_eq(ferry_unregister(engine, inside), FERRY_OK);

    static char host[4096];
    cr_assert_eq(ferry_register(engine, host, sizeof(host), device0, 0),
                 FERRY_ERR_INVALID_PARAM, "host memory is not device memory");
    cr_assert_eq(ferry_register(engine, host, sizeof(host), "*", 0), FERRY_OK);
    published_location(host, location, sizeof(location));
    cr_assert_str_eq(location, "cpu");
    cr_assert_eq(ferry_unregister(engine, host), FERRY_OK);
    vendor->mem_free(block);
}

Test(gpu_locations, ferry_alloc_gives_device_memory)
{
    void *mem = NULL;
    cr_assert_eq(ferry_alloc(engine, 3 * MIB, device0, 0, &mem), FERRY_OK);
    ferry_accel_range_t range;
    cr_assert_eq(vendor->pointer_query(mem, &range), FERRY_OK);
    cr_assert_eq(range.device, 0);
    device_fill(mem, 3 * MIB, 5);
    cr_assert_eq(device_check(mem, 3 * MIB, 5), SIZE_MAX);
    cr_assert_eq(ferry_free(engine, mem), FERRY_OK);

    char absent[48];
    snprintf(absent, sizeof(absent), "%s:%d", kind, vendor->device_count() + 3);
    cr_assert_eq(ferry_alloc(engine, MIB, absent, 0, &mem), FERRY_ERR_INVALID_PARAM);
}

/* Our own segment: the vendor copies between host and device memory. */
Test(gpu_locations, own_segment_copies_device_memory)
{
    void *mem = NULL;
    cr_assert_eq(ferry_alloc(engine, 2 * MIB, device0, 0, &mem), FERRY_OK);
    ferry_segment_h self;
    cr_assert_eq(ferry_segment_open(engine, ferry_engine_segment_name(engine), &self), FERRY_OK);
    unsigned char *host = malloc(2 * MIB);
    test_pattern_fill(host, 2 * MIB, 8);
    cr_assert_eq(one_request(engine, FERRY_OP_WRITE, host, self, (uintptr_t)mem, 2 * MIB, NULL),
                 FERRY_OK);
    cr_assert_eq(device_check(mem, 2 * MIB, 8), SIZE_MAX);
    memset(host, 0, 2 * MIB);
    cr_assert_eq(one_request(engine, FERRY_OP_READ, host, self, (uintptr_t)mem, 2 * MIB, NULL),
                 FERRY_OK);
    cr_assert_eq(test_pattern_check(host, 2 * MIB, 8), SIZE_MAX);
    free(host);
    ferry_segment_close(engine, self);
    cr_assert_eq(ferry_free(engine, mem), FERRY_OK);
}

/* ---- staging: two processes, a transport that takes host memory only ---- */

static peer_process_t peer;
static ferry_segment_h segment;

/* The peer's arena is device memory (remote_device) or host memory;
 * transports: both engines'. */
static void start_pair_at(const char *arena_location, const char *transports);

static void start_pair(int remote_device, const char *transports)
{
    find_vendor(); /* device0, which start_pair_at's own call sets too */
    start_pair_at(remote_device ? device0 : "1", transports);
}

static void start_pair_at(const char *arena_location, const char *transports)
{
    find_vendor();
    setenv("FERRY_TRANSPORTS", transports, 1);
    /* Small staging buffers and a small page-locked bound: several buffers
     * per request, and the pageable fallback, both used. */
    setenv("FERRY_STAGE_CHUNK", "256k", 1);
    setenv("FERRY_STAGE_PINNED_MAX", "512k", 1);
    char alloc[96];
    snprintf(alloc, sizeof(alloc), "FERRY_TEST_PEER_ALLOC=%s", arena_location);
    const char *env[] = {alloc, NULL};
    cr_assert_eq(peer_start(&peer, env), 0, "test peer did not start");
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
}

static void stop_pair(void)
{
    if (engine) {
        ferry_segment_close(engine, segment);
        ferry_engine_destroy(engine);
    }
    engine = NULL;
    peer_stop(&peer);
    unsetenv("FERRY_TRANSPORTS");
    unsetenv("FERRY_STAGE_CHUNK");
    unsetenv("FERRY_STAGE_PINNED_MAX");
    if (getenv("FERRY_CXL_PATH") != NULL)
        unlink(getenv("FERRY_CXL_PATH"));
    unsetenv("FERRY_CXL_PATH");
}

/* Write the pattern from buf (local, host or device) into the peer's
 * arena and read it back into buf, via transport; the peer checks. */
static void write_read(void *buf, int local_device, size_t offset, size_t length,
                       const char *transport, unsigned seed)
{
    if (local_device)
        device_fill(buf, length, seed);
    else
        test_pattern_fill(buf, length, seed);
    cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, buf, segment,
                                       peer.arena + offset, length, transport),
                 FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check %zu %zu %u", offset, length, seed), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "fill %zu %zu %u", offset, length, seed + 1), "OK");
    cr_assert_eq(one_request_served_by(engine, FERRY_OP_READ, buf, segment, peer.arena + offset,
                                       length, transport),
                 FERRY_OK);
    size_t bad = local_device ? device_check(buf, length, seed + 1)
                              : test_pattern_check(buf, length, seed + 1);
    cr_assert_eq(bad, SIZE_MAX, "byte %zu of %zu read back", bad, length);
}

static void *local_buffer(int device, size_t length)
{
    void *buf = NULL;
    cr_assert_eq(ferry_alloc(engine, length, device ? device0 : "cpu", 0, &buf), FERRY_OK);
    return buf;
}

static const size_t lengths[] = {1, 4099, MIB + 3, 5 * MIB};

static void staged_case(int local_device, int remote_device, const char *transport)
{
    start_pair(remote_device, transport);
    void *buf = local_buffer(local_device, 5 * MIB);
    for (size_t i = 0; i < sizeof(lengths) / sizeof(lengths[0]); i++)
        write_read(buf, local_device, 4096 * i + 1, lengths[i], transport, (unsigned)i + 20);
    cr_assert_eq(ferry_free(engine, buf), FERRY_OK);
}

TestSuite(gpu_staging, .fini = stop_pair, .timeout = 120);

Test(gpu_staging, local_device_memory_over_tcp)
{
    staged_case(1, 0, "tcp");
}

Test(gpu_staging, remote_device_memory_over_tcp)
{
    staged_case(0, 1, "tcp");
}

Test(gpu_staging, device_to_device_over_tcp)
{
    staged_case(1, 1, "tcp");
}

Test(gpu_staging, local_device_memory_over_shm)
{
    staged_case(1, 0, "shm");
}

/* shm reaches host memory only: a peer's device buffer is not offered to
 * it, and a request that insists is refused, nothing moved. */
Test(gpu_staging, shm_does_not_reach_remote_device_memory)
{
    start_pair(1, "shm,tcp");
    unsigned char buf[4096];
    test_pattern_fill(buf, sizeof(buf), 3);
    ferry_xfer_status_t xs;
    cr_assert_neq(one_request_via(engine, FERRY_OP_WRITE, buf, segment, peer.arena, sizeof(buf),
                                  "shm", &xs),
                  FERRY_OK);
    cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, buf, segment, peer.arena,
                                       sizeof(buf), "tcp"),
                 FERRY_OK, "tcp serves it (the target stages)");
    cr_assert_str_eq(peer_cmd(&peer, "check 0 4096 3"), "OK");
}

/* A UCX built without support for the device's memory (Debian's) takes
 * host memory only: a local device buffer is staged, a peer's device buffer
 * gets no ucx key (tcp serves it). */
Test(gpu_staging, ucx_without_device_support_declines_device_memory)
{
    find_vendor();
    char path[1024];
    snprintf(path, sizeof(path), "%s/ferry_ucx.so", getenv("FERRY_MODULE_DIR"));
    if (access(path, R_OK) != 0)
        cr_skip_test("the ucx module is not built");
    if (strcmp(kind, "testgpu") != 0)
        cr_skip_test("UCX may serve %s memory itself: this case is for the test device", kind);
    staged_case(1, 0, "ucx");
    stop_pair();
    start_pair(1, "ucx,tcp");
    unsigned char buf[4096];
    test_pattern_fill(buf, sizeof(buf), 4);
    cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, buf, segment, peer.arena,
                                       sizeof(buf), "tcp"),
                 FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check 0 4096 4"), "OK");
}

/* cxl copies with the CPU into the shared window: a local device buffer is
 * staged by the engine, the peer's arena is in the window. */
Test(gpu_staging, local_device_memory_over_cxl)
{
    find_vendor();
    char path[128];
    snprintf(path, sizeof(path), "/dev/shm/ferry-test-gpu-cxl-%d", (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0, "%s", path);
    cr_assert_eq(ftruncate(fd, (off_t)256 * MIB), 0);
    close(fd);
    setenv("FERRY_CXL_PATH", path, 1);
    start_pair_at("cxl", "cxl");
    void *buf = local_buffer(1, 5 * MIB);
    for (size_t i = 0; i < sizeof(lengths) / sizeof(lengths[0]); i++)
        write_read(buf, 1, 4096 * i + 1, lengths[i], "cxl", (unsigned)i + 40);
    cr_assert_eq(ferry_free(engine, buf), FERRY_OK);
}
