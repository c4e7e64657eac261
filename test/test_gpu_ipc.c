/*
 * The GPU IPC transport (<kind>_ipc) between real processes: keys, buffers
 * inside an allocation, the import cache, forged keys, address reuse,
 * invalidation, dead and restarted peers, same-process peers and devices
 * numbered differently.  The kind comes from FERRY_TEST_GPU_KIND (default
 * testgpu, the suite's memfd vendor; the GPU machine's check sets cuda); a
 * kind with no device skips every test with one line.
 */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/core/core.h"
#include "forged_store.h"
#include "one_request.h"
#include "peer_process.h"
#include "service_process.h"
#include "test_pattern.h"
#include "unregister_race.h"

#define MIB ((size_t)1 << 20)

static const char *kind;
static char transport[64], location[64];
static const ferry_accel_ops_t *vendor;
static ferry_engine_h engine;

static void teardown(void)
{
    if (engine != NULL)
        ferry_engine_destroy(engine);
    engine = NULL;
    service_cleanup_all();
}

TestSuite(gpu_ipc, .fini = teardown, .timeout = 120);

/* The vendor, or skip; then FERRY_TRANSPORTS for us and our peers. */
static void use_gpu(void)
{
    kind = getenv("FERRY_TEST_GPU_KIND");
    if (kind == NULL || *kind == '\0')
        kind = "testgpu";
    if (strcmp(kind, "testgpu") == 0) {
        setenv("FERRY_TESTGPU_DEVICES", "2", 1);
        unsetenv("FERRY_TESTGPU_VISIBLE_DEVICES");
    }
    snprintf(transport, sizeof(transport), "%s_ipc", kind);
    snprintf(location, sizeof(location), "%s:0", kind);
    vendor = ferry_accel_find(getenv("FERRY_MODULE_DIR"), kind);
    if (vendor == NULL)
        cr_skip_test("no %s device here (or its module is not built): GPU IPC tests skipped",
                     kind);
    char transports[128];
    snprintf(transports, sizeof(transports), "%s,tcp", transport);
    setenv("FERRY_TRANSPORTS", transports, 1);
}

static void start_engine(void)
{
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Device memory in the peer, not registered: its address. */
static uintptr_t peer_valloc(peer_process_t *peer, size_t length, int device)
{
    uintptr_t at = 0;
    const char *reply = peer_cmd(peer, "valloc %zu %s:%d", length, kind, device);
    cr_assert_eq(sscanf(reply, "ALLOC %" SCNxPTR, &at), 1, "valloc: %s", reply);
    return at;
}

/* Device memory in the peer on its device 0, registered whole. */
static uintptr_t peer_device_buffer(peer_process_t *peer, size_t length)
{
    uintptr_t a = peer_valloc(peer, length, 0);
    cr_assert_str_eq(peer_cmd(peer, "areg 0x%" PRIxPTR " %zu", a, length), "OK");
    return a;
}

/* The process's count of peer allocations the transport opened (device -1),
 * closed (device -2), or opened with our device ordinal d, from ferry_info's
 * line. */
static unsigned long opens(int device)
{
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    cr_assert_not_null(out);
    ferry_info_print(out, FERRY_INFO_PLUGINS);
    fclose(out);
    char needle[128];
    if (device < 0)
        snprintf(needle, sizeof(needle), "%s: GPU IPC transport", transport);
    else
        snprintf(needle, sizeof(needle), "opens on device %d: ", device);
    const char *at = strstr(text, needle);
    unsigned long n = 0;
    if (device < 0) {
        cr_assert_not_null(at, "no \"%s\" in ferry_info's output:\n%s", needle, text);
        const char *word = device == -1 ? "opened " : "closed ";
        at = strstr(at, word);
        cr_assert(at != NULL && sscanf(at + strlen(word), "%lu", &n) == 1);
    } else if (at != NULL) {
        n = strtoul(at + strlen(needle), NULL, 10);
    }
    free(text);
    return n;
}

static ferry_status_t xfer(ferry_opcode_t op, void *local, ferry_segment_h segment,
                           uintptr_t remote, size_t length)
{
    return one_request_via(engine, op, local, segment, remote, length, transport, NULL);
}

Test(gpu_ipc, keys_name_the_allocation_and_a_buffer_inside_it_maps_at_its_offset)
{
    use_gpu();
    start_engine();
    peer_process_t peer;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    uintptr_t a = peer_valloc(&peer, 16 * MIB, 0);
    cr_assert_str_eq(peer_cmd(&peer, "afill 0x%" PRIxPTR " %zu 3", a + 4 * MIB, MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "afill 0x%" PRIxPTR " %zu 4", a + 6 * MIB, 2 * MIB), "OK");
    /* A buffer 4 MiB into the allocation, as a caching allocator hands out. */
    cr_assert_str_eq(peer_cmd(&peer, "areg 0x%" PRIxPTR " %zu", a + 4 * MIB, 4 * MIB), "OK");
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    char *json = NULL;
    cr_assert_eq(ferry_segment_describe(engine, segment, &json), FERRY_OK);
    char want[128];
    snprintf(want, sizeof(want), "\"%s\":\"gpuipc1:%" PRIxPTR ":%zx:", transport, a, 16 * MIB);
    cr_assert_not_null(strstr(json, want), "no key for the allocation (%s) in %s", want, json);
    free(json);

    unsigned char *local = malloc(2 * MIB);
    cr_assert_not_null(local);
    test_pattern_fill(local, MIB, 7);
    cr_assert_eq(xfer(FERRY_OP_WRITE, local, segment, a + 5 * MIB, MIB), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "acheck 0x%" PRIxPTR " %zu 7", a + 5 * MIB, MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "acheck 0x%" PRIxPTR " %zu 3", a + 4 * MIB, MIB), "OK",
                     "the write landed before its offset");
    cr_assert_str_eq(peer_cmd(&peer, "acheck 0x%" PRIxPTR " %zu 4", a + 6 * MIB, 2 * MIB), "OK",
                     "the write landed past its end");
    memset(local + MIB, 0, MIB);
    cr_assert_eq(xfer(FERRY_OP_READ, local + MIB, segment, a + 6 * MIB, MIB), FERRY_OK);
    cr_assert_eq(test_pattern_check(local + MIB, MIB, 4), SIZE_MAX, "read the wrong bytes");
    free(local);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

Test(gpu_ipc, one_import_for_ten_thousand_writes_from_device_memory)
{
    use_gpu();
    start_engine();
    peer_process_t peer;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    enum { BATCH = 100, ROUNDS = 100, PIECE = 4096 };
    uintptr_t a = peer_device_buffer(&peer, BATCH * PIECE);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    void *local = NULL;
    cr_assert_eq(ferry_alloc(engine, BATCH * PIECE, location, 0, &local), FERRY_OK);
    unsigned char *host = malloc(BATCH * PIECE);
    cr_assert_not_null(host);
    test_pattern_fill(host, BATCH * PIECE, 11);
    cr_assert_eq(vendor->copy(local, host, BATCH * PIECE), FERRY_OK);

    unsigned long before = opens(-1);
    ferry_batch_h batch;
    ferry_request_t reqs[BATCH];
    cr_assert_eq(ferry_batch_create(engine, BATCH, &batch), FERRY_OK);
    for (int i = 0; i < BATCH; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE,
                                    .local = (char *)local + (size_t)i * PIECE,
                                    .target = segment, .target_offset = a + (size_t)i * PIECE,
                                    .length = PIECE, .transport = transport};
    for (int round = 0; round < ROUNDS; round++) {
        cr_assert_eq(ferry_batch_submit(batch, reqs, BATCH), FERRY_OK);
        cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK, "round %d", round);
    }
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    cr_assert_eq(opens(-1) - before, 1, "%lu opens for %d writes to one allocation",
                 opens(-1) - before, BATCH * ROUNDS);
    cr_assert_str_eq(peer_cmd(&peer, "acheck 0x%" PRIxPTR " %d 11", a, BATCH * PIECE), "OK");
    free(host);
    ferry_free(engine, local);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

/* A descriptor whose key claims more than the allocation (and whose buffer
 * the engine therefore lets a request reach): the transport refuses what
 * lies past what the open mapped, and writes nothing. */
Test(gpu_ipc, a_forged_key_past_the_allocation_is_refused_and_nothing_is_written)
{
    use_gpu();
    /* The transport's own check, behind the owner's confirmation, which
     * would refuse this forged descriptor before it got there. */
    setenv("FERRY_CONFIRM_DESCRIPTORS", "no", 1);
    service_t metad;
    service_start_forgery_store(&metad);
    start_engine();
    peer_process_t peer;
    static const char *const env[] = {"FERRY_SEGMENT_NAME=honest", NULL};
    cr_assert_eq(peer_start(&peer, env), 0);
    uintptr_t a = peer_valloc(&peer, 4 * MIB, 0);
    cr_assert_str_eq(peer_cmd(&peer, "afill 0x%" PRIxPTR " %zu 5", a, 4 * MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "areg 0x%" PRIxPTR " %zu", a, 4 * MIB), "OK");
    char find[128], replace[128];
    snprintf(find, sizeof(find), "gpuipc1:%" PRIxPTR ":%zx:", a, 4 * MIB);
    snprintf(replace, sizeof(replace), "gpuipc1:%" PRIxPTR ":%zx:", a, 64 * MIB);
    forged_store_publish(metad.port, "honest", "half", find, replace);
    snprintf(find, sizeof(find), "\"length\":\"%zu\"", 4 * MIB);
    snprintf(replace, sizeof(replace), "\"length\":\"%zu\"", 64 * MIB);
    forged_store_publish(metad.port, "half", "forged", find, replace);

    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, "forged", &segment), FERRY_OK);
    unsigned char *local = malloc(2 * MIB);
    cr_assert_not_null(local);
    test_pattern_fill(local, 2 * MIB, 6);
    cr_assert_neq(xfer(FERRY_OP_WRITE, local, segment, a + 4 * MIB - 4096, 8192), FERRY_OK,
                  "a write across the allocation's end");
    cr_assert_neq(xfer(FERRY_OP_WRITE, local, segment, a + 8 * MIB, MIB), FERRY_OK,
                  "a write past the allocation");
    cr_assert_neq(xfer(FERRY_OP_READ, local, segment, a + 4 * MIB, 4096), FERRY_OK,
                  "a read past the allocation");
    cr_assert_str_eq(peer_cmd(&peer, "acheck 0x%" PRIxPTR " %zu 5", a, 4 * MIB), "OK",
                     "the allocation was written");
    /* Inside the allocation the forged key still opens the real one. */
    cr_assert_eq(xfer(FERRY_OP_WRITE, local, segment, a, MIB), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "acheck 0x%" PRIxPTR " %zu 6", a, MIB), "OK");
    free(local);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    ferry_engine_destroy(engine); /* it leaves the store before the store goes */
    engine = NULL;
    service_cleanup(&metad);
    unsetenv("FERRY_CONFIRM_DESCRIPTORS");
}

/* The owner frees an allocation and makes another at the same address: our
 * writes land in the new one (a new import), never in the old mapping. */
Test(gpu_ipc, an_allocation_made_again_at_a_freed_address_is_opened_anew)
{
    use_gpu();
    start_engine();
    peer_process_t peer;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    uintptr_t a = peer_device_buffer(&peer, 4 * MIB);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    unsigned char *local = malloc(4 * MIB);
    cr_assert_not_null(local);
    test_pattern_fill(local, 4 * MIB, 1);
    cr_assert_eq(xfer(FERRY_OP_WRITE, local, segment, a, 4 * MIB), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "acheck 0x%" PRIxPTR " %zu 1", a, 4 * MIB), "OK");
    unsigned long before = opens(-1), closed = opens(-2);

    cr_assert_str_eq(peer_cmd(&peer, "aunreg 0x%" PRIxPTR, a), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "vfree 0x%" PRIxPTR, a), "OK");
    uintptr_t b = peer_valloc(&peer, 4 * MIB, 0);
    if (b != a)
        cr_log_warn("the vendor did not reuse the freed address (0x%" PRIxPTR " then 0x%" PRIxPTR
                    "): the test checks a new allocation only", a, b);
    cr_assert_str_eq(peer_cmd(&peer, "afill 0x%" PRIxPTR " %zu 9", b, 4 * MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "areg 0x%" PRIxPTR " %zu", b, 4 * MIB), "OK");
    cr_assert_eq(ferry_segment_refresh(engine, peer.name), FERRY_OK);
    test_pattern_fill(local, 4 * MIB, 2);
    cr_assert_eq(xfer(FERRY_OP_WRITE, local, segment, b, 4 * MIB), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "acheck 0x%" PRIxPTR " %zu 2", b, 4 * MIB), "OK",
                     "the write did not land in the new allocation");
    cr_assert_eq(opens(-1) - before, 1, "the new allocation was not opened (once)");
    /* The owner's unregister told us (peer_changed): the old mapping, which
     * would keep the freed memory alive, is closed. */
    cr_assert_geq(opens(-2) - closed, 1, "the freed allocation is still open here");
    free(local);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

/* ---- writers racing an unregister (unregister_race.c) ---- */

Test(gpu_ipc, no_write_lands_after_unregister_returns)
{
    use_gpu();
    start_engine();
    peer_process_t peer;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    uintptr_t a = peer_device_buffer(&peer, UNREGISTER_RACE_RANGE);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    unregister_under_writers(engine, segment, &peer, a, transport);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

Test(gpu_ipc, a_killed_peer_fails_within_the_bound)
{
    use_gpu();
    start_engine();
    peer_process_t victim;
    cr_assert_eq(peer_start(&victim, NULL), 0);
    uintptr_t a = peer_device_buffer(&victim, 64 * MIB);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, victim.name, &segment), FERRY_OK);
    enum { N = 16 };
    unsigned char *local = malloc(4 * MIB);
    cr_assert_not_null(local);
    memset(local, 0x5a, 4 * MIB);
    ferry_batch_h batch;
    ferry_request_t reqs[N];
    cr_assert_eq(ferry_batch_create(engine, N, &batch), FERRY_OK);
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = local,
                                    .target = segment, .target_offset = a + (size_t)i * 4 * MIB,
                                    .length = 4 * MIB, .transport = transport};
    double killed = 0, begin = now();
    ferry_status_t status;
    int rounds = 0;
    do {
        if (++rounds == 3) {
            killed = now();
            peer_kill(&victim, SIGKILL);
        }
        status = ferry_batch_submit(batch, reqs, N);
        if (status == FERRY_OK)
            status = ferry_batch_wait(batch, 20000);
    } while (status == FERRY_OK && now() - begin < 15.0);
    cr_assert_gt(killed, 0, "the victim was never killed");
    cr_assert_eq(status, FERRY_ERR_PEER_FAILED, "%s", ferry_status_string(status));
    cr_assert_lt(now() - killed, 2.0, "the failure took %.2f s", now() - killed);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    free(local);
    ferry_segment_close(engine, segment);
    peer_stop(&victim);
}

Test(gpu_ipc, a_restarted_peer_is_reached_again)
{
    use_gpu();
    const char *missing = service_missing(SERVICE_METAD);
    if (missing != NULL)
        cr_skip_test("%s", missing);
    service_t metad;
    cr_assert_eq(service_start(&metad, SERVICE_METAD, NULL), 0);
    setenv("FERRY_METADATA", metad.uri, 1);
    start_engine();
    static const char *const env[] = {"FERRY_SEGMENT_NAME=phoenix", NULL};
    peer_process_t peer;
    cr_assert_eq(peer_start(&peer, env), 0);
    uintptr_t a = peer_device_buffer(&peer, 2 * MIB);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, "phoenix", &segment), FERRY_OK);
    unsigned char *local = malloc(2 * MIB);
    cr_assert_not_null(local);
    test_pattern_fill(local, 2 * MIB, 12);
    cr_assert_eq(xfer(FERRY_OP_WRITE, local, segment, a, 2 * MIB), FERRY_OK);
    peer_kill(&peer, SIGKILL);
    peer_stop(&peer);
    /* The transport looks at a peer at most every 20 ms: within that, a
     * write may still land in the dead peer's memory, which we hold open. */
    usleep(50000);
    cr_assert_neq(xfer(FERRY_OP_WRITE, local, segment, a, 2 * MIB), FERRY_OK,
                  "a write to the dead peer succeeded");

    cr_assert_eq(peer_start(&peer, env), 0);
    uintptr_t b = peer_device_buffer(&peer, 2 * MIB);
    cr_assert_eq(ferry_segment_refresh(engine, "phoenix"), FERRY_OK);
    test_pattern_fill(local, 2 * MIB, 13);
    cr_assert_eq(xfer(FERRY_OP_WRITE, local, segment, b, 2 * MIB), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "acheck 0x%" PRIxPTR " %zu 13", b, 2 * MIB), "OK");
    free(local);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    ferry_engine_destroy(engine);
    engine = NULL;
    service_cleanup(&metad);
    unsetenv("FERRY_METADATA");
}

/* Two engines of one process: the copy uses the owner's addresses, no open. */
Test(gpu_ipc, a_same_process_peer_is_copied_directly)
{
    use_gpu();
    unsetenv("FERRY_METADATA");
    start_engine();
    ferry_engine_h owner;
    cr_assert_eq(ferry_engine_create(NULL, &owner), FERRY_OK);
    void *remote = NULL;
    cr_assert_eq(ferry_alloc(owner, 2 * MIB, location, FERRY_REG_REMOTE, &remote), FERRY_OK);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, ferry_engine_segment_name(owner), &segment),
                 FERRY_OK);
    unsigned char *local = malloc(4 * MIB);
    cr_assert_not_null(local);
    test_pattern_fill(local, 2 * MIB, 14);
    unsigned long before = opens(-1);
    cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, local, segment,
                                       (uintptr_t)remote, 2 * MIB, transport),
                 FERRY_OK);
    memset(local + 2 * MIB, 0, 2 * MIB);
    cr_assert_eq(vendor->copy(local + 2 * MIB, remote, 2 * MIB), FERRY_OK);
    cr_assert_eq(test_pattern_check(local + 2 * MIB, 2 * MIB, 14), SIZE_MAX);
    memset(local + 2 * MIB, 0, 2 * MIB);
    cr_assert_eq(xfer(FERRY_OP_READ, local + 2 * MIB, segment, (uintptr_t)remote, 2 * MIB),
                 FERRY_OK);
    cr_assert_eq(test_pattern_check(local + 2 * MIB, 2 * MIB, 14), SIZE_MAX);
    cr_assert_eq(opens(-1), before, "a same-process peer's allocation was opened");
    free(local);
    ferry_segment_close(engine, segment);
    ferry_free(owner, remote);
    ferry_engine_destroy(owner);
}

/* The peer numbers the devices the other way round: its device 0 is our
 * device 1 (same UUID), and the import is made on ours. */
Test(gpu_ipc, a_peer_device_is_matched_by_uuid_not_by_number)
{
    use_gpu();
    if (strcmp(kind, "testgpu") != 0 || vendor->device_count() < 2)
        cr_skip_test("needs two %s devices numbered differently (testgpu only)", kind);
    start_engine();
    peer_process_t peer;
    static const char *const env[] = {"FERRY_TESTGPU_VISIBLE_DEVICES=1,0", NULL};
    cr_assert_eq(peer_start(&peer, env), 0);
    uintptr_t on0 = peer_valloc(&peer, MIB, 0), on1 = peer_valloc(&peer, MIB, 1);
    cr_assert_str_eq(peer_cmd(&peer, "areg 0x%" PRIxPTR " %zu", on0, MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "areg 0x%" PRIxPTR " %zu", on1, MIB), "OK");
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    unsigned char *local = malloc(MIB);
    cr_assert_not_null(local);
    unsigned long d0 = opens(0), d1 = opens(1);
    test_pattern_fill(local, MIB, 15);
    cr_assert_eq(xfer(FERRY_OP_WRITE, local, segment, on0, MIB), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "acheck 0x%" PRIxPTR " %zu 15", on0, MIB), "OK");
    cr_assert_eq(opens(1), d1 + 1, "the peer's device 0 was not opened as our device 1");
    cr_assert_eq(opens(0), d0);
    test_pattern_fill(local, MIB, 16);
    cr_assert_eq(xfer(FERRY_OP_WRITE, local, segment, on1, MIB), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "acheck 0x%" PRIxPTR " %zu 16", on1, MIB), "OK");
    cr_assert_eq(opens(0), d0 + 1, "the peer's device 1 was not opened as our device 0");
    free(local);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

/* Teardown with copies in flight: stop waits for them (no copy lands in
 * freed memory, no slice finishes after it) and the imports are closed. */
Test(gpu_ipc, engine_destroy_with_copies_in_flight)
{
    use_gpu();
    start_engine();
    peer_process_t peer;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    enum { N = 16 };
    uintptr_t a = peer_device_buffer(&peer, N * 4 * MIB);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    void *local = NULL;
    cr_assert_eq(ferry_alloc(engine, 4 * MIB, location, 0, &local), FERRY_OK);
    unsigned long closed = opens(-2);
    ferry_batch_h batch;
    ferry_request_t reqs[N];
    cr_assert_eq(ferry_batch_create(engine, N, &batch), FERRY_OK);
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = local, .target = segment,
                                    .target_offset = a + (size_t)i * 4 * MIB,
                                    .length = 4 * MIB, .transport = transport};
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    double start = now();
    ferry_engine_destroy(engine); /* the batch, the buffer and the transport with it */
    engine = NULL;
    cr_assert_lt(now() - start, 10.0, "teardown took %.1f s", now() - start);
    cr_assert_geq(opens(-2) - closed, 1, "the peer's allocation is still open after teardown");
    peer_stop(&peer);
}

/* ---- threads racing the first open of one allocation ---- */

enum { RACERS = 8 };

typedef struct racer {
    ferry_segment_h segment;
    uintptr_t remote;
    unsigned char *local;
    pthread_barrier_t *start;
    ferry_status_t status;
    pthread_t thread;
} racer_t;

static void *race_write(void *arg)
{
    racer_t *r = arg;
    pthread_barrier_wait(r->start);
    r->status = xfer(FERRY_OP_WRITE, r->local, r->segment, r->remote, 64 * 1024);
    return NULL;
}

Test(gpu_ipc, threads_that_miss_the_cache_together_open_the_allocation_once)
{
    use_gpu();
    start_engine();
    peer_process_t peer;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    uintptr_t a = peer_valloc(&peer, RACERS * 64 * 1024, 0), first = peer_valloc(&peer, MIB, 0);
    cr_assert_str_eq(peer_cmd(&peer, "areg 0x%" PRIxPTR " %d", a, RACERS * 64 * 1024), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "areg 0x%" PRIxPTR " %zu", first, MIB), "OK");
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    unsigned char *local = malloc(RACERS * 64 * 1024);
    cr_assert_not_null(local);
    /* The descriptor confirmed and the peer known: the racers meet only at
     * the open of a. */
    cr_assert_eq(xfer(FERRY_OP_WRITE, local, segment, first, 4096), FERRY_OK);
    test_pattern_fill(local, RACERS * 64 * 1024, 17);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, RACERS);
    racer_t racers[RACERS];
    unsigned long before = opens(-1);
    for (int i = 0; i < RACERS; i++) {
        racers[i] = (racer_t){.segment = segment, .remote = a + (size_t)i * 64 * 1024,
                              .local = local + (size_t)i * 64 * 1024, .start = &start};
        cr_assert_eq(pthread_create(&racers[i].thread, NULL, race_write, &racers[i]), 0);
    }
    for (int i = 0; i < RACERS; i++) {
        pthread_join(racers[i].thread, NULL);
        cr_assert_eq(racers[i].status, FERRY_OK, "racer %d", i);
    }
    pthread_barrier_destroy(&start);
    cr_assert_eq(opens(-1) - before, 1, "%lu opens of one allocation", opens(-1) - before);
    cr_assert_str_eq(peer_cmd(&peer, "acheck 0x%" PRIxPTR " %d 17", a, RACERS * 64 * 1024),
                     "OK");
    free(local);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}
