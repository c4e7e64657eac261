/*
 * The ofi (libfabric) transport: two-process transfers over tcp;ofi_rxm
 * and shm, keys through the descriptor, forged descriptors, unregistered
 * buffers, killed, frozen and restarted peers, settings and ferry_info.
 * (Across two network namespaces: test_netns, ofi_across_hosts.)
 *
 * Every test sets FERRY_* variables before it starts peers or the engine:
 * peers inherit the environment, and Criterion runs each test in a process
 * of its own.  ofi is opt-in and software providers are only a fallback,
 * so the tests name both the transport and the provider.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ferry/ferry.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <time.h>
#include <unistd.h>

#include "capture_stderr.h"
#include "ofi_shm_regions.h"
#include "one_request.h"
#include "peer_process.h"
#include "put_get.h"
#include "service_process.h"
#include "test_pattern.h"

#define MIB ((size_t)1 << 20)
#define TCP "tcp;ofi_rxm"
#define SHM "shm"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static ferry_engine_h engine;
/* A peer the test stopped (SIGSTOP): killed by stop() even when an
 * assertion ended the test first, so that no frozen process outlives it. */
static pid_t stopped_peer;
static unsigned char *local;
static size_t local_size = 72 * MIB;

static void skip_unless_built(void)
{
    if (!service_module_built("ofi"))
        cr_skip_test("the ofi module is not built (libfabric-dev missing)");
}

/* Engine and peers use ofi through provider, with FERRY_OFI_TIMEOUT
 * timeout_ms. */
static void start_with_timeout(const char *provider, const char *timeout_ms)
{
    skip_unless_built();
    setenv("FERRY_TRANSPORTS", "ofi", 1);
    setenv("FERRY_OFI_PROVIDER", provider, 1);
    setenv("FERRY_OFI_TIMEOUT", timeout_ms, 1);
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    cr_assert_eq(posix_memalign((void **)&local, 4096, local_size), 0);
    memset(local, 1, local_size);
}

static void start(const char *provider)
{
    start_with_timeout(provider, "2000"); /* tight, yet above a loaded host's stalls */
}

static void stop(void)
{
    if (stopped_peer > 0) {
        kill(stopped_peer, SIGKILL);
        ofi_shm_regions_of(stopped_peer, 1);
    }
    stopped_peer = 0;
    if (engine)
        ferry_engine_destroy(engine);
    engine = NULL;
    free(local);
    local = NULL;
}

TestSuite(ofi, .fini = stop, .timeout = 120);

static ferry_status_t transfer(ferry_opcode_t op, void *buf, ferry_segment_h segment,
                               uint64_t remote, size_t length, const char *want_transport)
{
    return one_request_served_by(engine, op, buf, segment, remote, length, want_transport);
}

/* Write then read back 1 B .. 64 MiB at unaligned offsets, bytes checked on
 * both sides; the local buffer registered or not; a batch of 64. */
static void put_get(const char *provider)
{
    start(provider);
    peer_process_t peer;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&peer, NULL), 0, "test peer did not start");
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", 70 * MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    cr_assert_eq(ferry_register(engine, local, local_size, "cpu", 0), FERRY_OK);
    static const size_t sizes[] = {1, 7, 4096, 65537, MIB + 3, 64 * MIB};
    put_get_sizes(engine, &peer, segment, local, sizes, sizeof(sizes) / sizeof(sizes[0]), "ofi");
    put_get_unregistered(engine, &peer, segment, "ofi");
    put_get_batch(engine, &peer, segment, local, "ofi");
    cr_assert_eq(ferry_unregister(engine, local), FERRY_OK);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

Test(ofi, put_get_over_tcp_rxm_1B_to_64MiB)
{
    put_get(TCP);
}

Test(ofi, put_get_over_shm_1B_to_64MiB)
{
    put_get(SHM);
}

/* Small slices and a window of 2: many more operations than the window,
 * each waiting for room, and transmit-complete writes. */
Test(ofi, small_slices_through_a_small_window)
{
    setenv("FERRY_OFI_SLICE_SIZE", "4k", 1);
    setenv("FERRY_OFI_WINDOW", "2", 1);
    setenv("FERRY_OFI_COMPLETION", "transmit", 1);
    put_get(TCP);
}

/* The key and the endpoint are text in the descriptor, and work. */
Test(ofi, key_and_endpoint_survive_the_descriptor_round_trip)
{
    start(TCP);
    peer_process_t peer;
    ferry_segment_h segment;
    char *json;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    cr_assert_eq(ferry_segment_describe(engine, segment, &json), FERRY_OK);
    cr_assert_not_null(strstr(json, "\"ofi\":\"ofi1:tcp;ofi_rxm:"), "no ofi endpoint in %s",
                       json);
    const char *keys = strstr(json, "\"keys\"");
    cr_assert_not_null(keys);
    cr_assert_not_null(strstr(keys, "\"ofi\":\"o1:"), "no ofi key in %s", json);
    free(json);
    test_pattern_fill(local, MIB, 3);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, peer.arena, MIB, "ofi"), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 3", MIB), "OK");
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

/* Put into the store a copy of segment "honest"'s descriptor named
 * "forged" whose buffer of honest_length bytes claims 1 GiB instead. */
static void publish_forged(const service_t *metad, size_t honest_length)
{
    static char json[1 << 16];
    size_t length;
    cr_assert_eq(http_call(metad->port, "GET", "/metadata?key=ferry%2Fsegments%2Fhonest", NULL,
                           NULL, 0, json, sizeof(json), &length),
                 200);
    char buffer_length[32];
    static char forged[1 << 17];
    snprintf(buffer_length, sizeof(buffer_length), "\"length\":\"%zu\"", honest_length);
    char *name = strstr(json, "\"name\":\"honest\"");
    char *buffer = strstr(json, buffer_length);
    cr_assert(name != NULL && buffer != NULL, "unexpected descriptor %s", json);
    *name = '\0';
    *buffer = '\0';
    int n = snprintf(forged, sizeof(forged), "%s\"name\":\"forged\"%.*s\"length\":\"1073741824\"%s",
                     json, (int)(buffer - name - strlen("\"name\":\"honest\"")),
                     name + strlen("\"name\":\"honest\""), buffer + strlen(buffer_length));
    cr_assert(n > 0 && (size_t)n < sizeof(forged));
    cr_assert_eq(http_call(metad->port, "PUT", "/metadata?key=ferry%2Fsegments%2Fforged", NULL,
                           forged, strlen(forged), NULL, 0, NULL),
                 200);
}

/* A descriptor whose buffer claims 1 GiB where 1 MiB is registered:
 * confirm: the owner's confirmation refuses it (the engine's check);
 * without it, the transport's own check against the key's registered
 * length refuses it.  Either way before anything is posted: the memory
 * past the registration is untouched, and writes inside it work. */
static void forged_descriptor(int confirm)
{
    skip_unless_built();
    setenv("FERRY_CONFIRM_DESCRIPTORS", confirm ? "yes" : "no", 1);
    service_t metad;
    service_start_forgery_store(&metad);
    start(TCP);
    peer_process_t peer;
    static const char *const honest_env[] = {"FERRY_SEGMENT_NAME=honest", NULL};
    cr_assert_eq(peer_start(&peer, honest_env), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "fill %zu %zu 21", MIB, MIB), "OK");
    char before[64];
    snprintf(before, sizeof(before), "%s", peer_cmd(&peer, "sum %zu %zu", MIB, MIB));
    publish_forged(&metad, MIB);

    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, "forged", &segment), FERRY_OK);
    for (size_t length = 1; length <= 256 * 1024; length *= 8) {
        test_pattern_fill(local, length, (unsigned)length);
        if (!confirm) {
            cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, peer.arena + 64, length, "ofi"),
                         FERRY_OK, "%zu bytes inside the registration", length);
            cr_assert_str_eq(peer_cmd(&peer, "check 64 %zu %zu", length, length), "OK");
        }
        cr_assert_neq(transfer(FERRY_OP_WRITE, local, segment, peer.arena + MIB + 4096, length,
                               NULL),
                      FERRY_OK, "%zu bytes past the registration", length);
        size_t across = length < 2 ? 2 : length;
        cr_assert_neq(transfer(FERRY_OP_WRITE, local, segment, peer.arena + MIB - 1, across, NULL),
                      FERRY_OK, "%zu bytes across its end", across);
        cr_assert_neq(transfer(FERRY_OP_READ, local, segment, peer.arena + MIB + 4096, length,
                               NULL),
                      FERRY_OK, "a read of %zu bytes past the registration", length);
    }
    cr_assert_str_eq(peer_cmd(&peer, "sum %zu %zu", MIB, MIB), before,
                     "memory outside the registration changed");
    /* The honest segment still works. */
    ferry_segment_h honest;
    cr_assert_eq(ferry_segment_open(engine, "honest", &honest), FERRY_OK);
    test_pattern_fill(local, MIB, 5);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, honest, peer.arena, MIB, "ofi"), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 5", MIB), "OK");
    ferry_segment_close(engine, honest);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    stop(); /* the engine leaves the store before the store goes */
    service_cleanup(&metad);
}

Test(ofi, forged_descriptor_refused_by_the_owners_confirmation)
{
    forged_descriptor(1);
}

Test(ofi, forged_descriptor_refused_by_the_key_before_anything_is_posted)
{
    forged_descriptor(0);
}

/* After the target unregisters a buffer, requests to it are refused and
 * no memory outside live registrations changes. */
static void unregistered_buffer(const char *provider)
{
    start(provider);
    put_get_refused_after_unregister(engine, local, "ofi");
}

Test(ofi, unregistered_buffer_is_refused_and_untouched_over_tcp_rxm)
{
    unregistered_buffer(TCP);
}

Test(ofi, unregistered_buffer_is_refused_and_untouched_over_shm)
{
    unregistered_buffer(SHM);
}

struct killer {
    peer_process_t *victim;
    int sig;
    unsigned delay_ms;
    double at;
};

static void *kill_later(void *arg)
{
    struct killer *k = arg;
    usleep(k->delay_ms * 1000);
    k->at = now();
    if (k->sig == SIGSTOP)
        stopped_peer = k->victim->pid;
    kill(k->victim->pid, k->sig);
    return NULL;
}

/* A victim peer (victim_length registered, written to once) and a
 * bystander (4 MiB registered), both opened. */
static void open_victim_and_bystander(peer_process_t *victim, ferry_segment_h *victim_seg,
                                      size_t victim_length, peer_process_t *bystander,
                                      ferry_segment_h *bystander_seg)
{
    cr_assert_eq(peer_start(victim, NULL), 0);
    cr_assert_eq(peer_start(bystander, NULL), 0);
    cr_assert_str_eq(peer_cmd(victim, "reg 0 %zu", victim_length), "OK");
    cr_assert_str_eq(peer_cmd(bystander, "reg 0 %zu", 4 * MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, victim->name, victim_seg), FERRY_OK);
    cr_assert_eq(ferry_segment_open(engine, bystander->name, bystander_seg), FERRY_OK);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, *victim_seg, victim->arena, 4096, "ofi"),
                 FERRY_OK);
}

/* Other peers are unaffected by the victim's failure; then both go (a
 * victim stopped by sig is killed too). */
static void bystander_served_then_stop_both(peer_process_t *victim, ferry_segment_h victim_seg,
                                            int sig, peer_process_t *bystander,
                                            ferry_segment_h bystander_seg)
{
    test_pattern_fill(local, 4 * MIB, 8);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, bystander_seg, bystander->arena, 4 * MIB, "ofi"),
                 FERRY_OK);
    cr_assert_str_eq(peer_cmd(bystander, "check 0 %zu 8", 4 * MIB), "OK");
    if (sig != SIGKILL)
        kill(victim->pid, SIGKILL);
    ofi_kill_peer(victim);
    ferry_segment_close(engine, victim_seg);
    ferry_segment_close(engine, bystander_seg);
    peer_stop(bystander);
}

/* Batches of 64 large writes (or reads) to a victim, hurt while they run:
 * they FAIL with FERRY_ERR_PEER_FAILED within the bound, and another peer
 * still works. */
static void check_failure_within_bound(const char *provider, int sig, ferry_opcode_t op)
{
    start(provider);
    peer_process_t victim, bystander;
    ferry_segment_h victim_seg, bystander_seg;
    open_victim_and_bystander(&victim, &victim_seg, 64 * MIB, &bystander, &bystander_seg);

    enum { N = 64 };
    ferry_batch_h batch;
    ferry_request_t reqs[N];
    cr_assert_eq(ferry_batch_create(engine, N, &batch), FERRY_OK);
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){.opcode = op, .local = local, .target = victim_seg,
                                    .target_offset = victim.arena, .length = 64 * MIB};
    struct killer k = {.victim = &victim, .sig = sig, .delay_ms = 100};
    pthread_t thread;
    pthread_create(&thread, NULL, kill_later, &k);
    double begin = now();
    ferry_status_t status;
    do {
        status = ferry_batch_submit(batch, reqs, N);
        if (status == FERRY_OK)
            status = ferry_batch_wait(batch, 20000);
    } while (status == FERRY_OK && now() - begin < 15.0);
    double failed_at = now();
    pthread_join(thread, NULL); /* k.at is the killer's until it is joined */
    double elapsed = failed_at - k.at;
    cr_assert_neq(status, FERRY_OK, "requests cannot keep succeeding once the peer is gone");
    cr_assert_neq(status, FERRY_ERR_TIMEOUT, "requests must FAIL, not hang");
    cr_assert_lt(elapsed, 5.0, "failure took %.2f s (bound: FERRY_OFI_TIMEOUT=2 s)", elapsed);
    cr_assert_gt(put_get_count_peer_failed(batch, N), 0);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);

    /* Other peers are unaffected. */
    bystander_served_then_stop_both(&victim, victim_seg, sig, &bystander, bystander_seg);
}

Test(ofi, killed_peer_fails_in_flight_writes_over_tcp_rxm)
{
    check_failure_within_bound(TCP, SIGKILL, FERRY_OP_WRITE);
}

Test(ofi, killed_peer_fails_in_flight_reads_over_tcp_rxm)
{
    check_failure_within_bound(TCP, SIGKILL, FERRY_OP_READ);
}

Test(ofi, frozen_peer_fails_in_flight_writes_within_timeout_over_tcp_rxm)
{
    check_failure_within_bound(TCP, SIGSTOP, FERRY_OP_WRITE);
}

Test(ofi, frozen_peer_fails_in_flight_reads_within_timeout_over_tcp_rxm)
{
    check_failure_within_bound(TCP, SIGSTOP, FERRY_OP_READ);
}

/* shm: no fault while the peer serves.  libfabric 1.17's shm provider
 * posts under a spin lock in the peer's region, which the peer holds while
 * it copies for its queue: a peer killed or stopped then leaves the post
 * spinning for good, and a stopped one until it goes on (README.md,
 * "Faults").  A peer killed before the requests is seen dead (its pidfd)
 * before anything is posted to it. */
static void killed_peer_over_shm(void)
{
    const int sig = SIGKILL;
    start(SHM);
    peer_process_t victim, bystander;
    ferry_segment_h victim_seg, bystander_seg;
    open_victim_and_bystander(&victim, &victim_seg, 4 * MIB, &bystander, &bystander_seg);
    cr_assert_eq(peer_kill_unreaped(&victim), 0);
    enum { N = 16 };
    ferry_request_t reqs[N];
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){.opcode = i % 2 ? FERRY_OP_READ : FERRY_OP_WRITE,
                                    .local = local + i * 256 * 1024, .target = victim_seg,
                                    .target_offset = victim.arena + i * 256 * 1024,
                                    .length = 256 * 1024};
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, N, &batch), FERRY_OK);
    double begin = now();
    ferry_status_t status = ferry_batch_submit(batch, reqs, N);
    if (status == FERRY_OK)
        status = ferry_batch_wait(batch, 20000);
    double elapsed = now() - begin;
    cr_assert_neq(status, FERRY_OK);
    cr_assert_neq(status, FERRY_ERR_TIMEOUT, "requests must FAIL, not hang");
    cr_assert_lt(elapsed, 5.0, "failure took %.2f s (bound: FERRY_OFI_TIMEOUT=2 s)", elapsed);
    for (int i = 0; i < N; i++) {
        ferry_xfer_status_t xs;
        cr_assert_eq(ferry_batch_status(batch, (size_t)i, &xs), FERRY_OK);
        cr_assert_eq(xs.state, FERRY_XFER_FAILED, "request %d", i);
        cr_assert_eq(xs.error, FERRY_ERR_PEER_FAILED, "request %d: %s", i,
                     ferry_status_string(xs.error));
    }
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    bystander_served_then_stop_both(&victim, victim_seg, sig, &bystander, bystander_seg);
}

Test(ofi, killed_peer_fails_requests_at_once_over_shm)
{
    killed_peer_over_shm();
}


/* A peer (1 MiB registered, written to) that dies and starts again under
 * the same name (its RPC address) with its arena at the same place: the
 * cached descriptor names the dead incarnation's endpoint; the engine
 * notices and reaches the new one with no user action. */
static void restarted_peer(const char *provider)
{
    personality(ADDR_NO_RANDOMIZE);
    /* A deadline far above the bound below: noticing the dead incarnation
     * must not wait for it (a 2 s deadline and a 2 s bound failed once
     * under ThreadSanitizer on a loaded host). */
    start_with_timeout(provider, "30000");
    peer_process_t first, second;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&first, NULL), 0);
    cr_assert_str_eq(peer_cmd(&first, "reg 0 %zu", MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, first.name, &segment), FERRY_OK);
    test_pattern_fill(local, MIB, 1);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, first.arena, MIB, "ofi"), FERRY_OK);
    ofi_kill_peer(&first);
    char address[64];
    snprintf(address, sizeof(address), "FERRY_RPC_ADDRESS=127.0.0.1:%d", peer_port(&first));
    const char *env[] = {address, NULL};
    cr_assert_eq(peer_start(&second, env), 0);
    cr_assert_str_eq(second.name, first.name, "the restarted peer keeps its name");
    cr_assert_eq(second.arena, first.arena, "no address randomization, the same arena");
    cr_assert_str_eq(peer_cmd(&second, "reg 0 %zu", MIB), "OK");

    double start_time = now();
    test_pattern_fill(local, MIB, 2);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, second.arena, MIB, "ofi"), FERRY_OK);
    cr_assert_lt(now() - start_time, 15.0,
                 "the dead incarnation was noticed at once, not at FERRY_OFI_TIMEOUT");
    cr_assert_str_eq(peer_cmd(&second, "check 0 %zu 2", MIB), "OK");
    ferry_segment_close(engine, segment);
    peer_stop(&second);
}

Test(ofi, restarted_peer_is_reached_again_over_tcp_rxm)
{
    restarted_peer(TCP);
}

Test(ofi, restarted_peer_is_reached_again_over_shm)
{
    restarted_peer(SHM);
}

static const char *info_output(const char *env, const char *args)
{
    static char output[1 << 16];
    char command[1024];
    const char *info = getenv("FERRY_INFO");
    cr_assert_not_null(info);
    snprintf(command, sizeof(command), "%s %s %s 2>&1", env, info, args);
    FILE *pipe = popen(command, "r");
    cr_assert_not_null(pipe);
    size_t n = fread(output, 1, sizeof(output) - 1, pipe);
    output[n] = '\0';
    pclose(pipe);
    return output;
}

/* ferry_info: libfabric's version, the providers it sees, which are
 * software, the one in use, the warning about real hardware, the settings. */
Test(ofi, ferry_info_shows_the_providers)
{
    skip_unless_built();
    const char *output = info_output("FERRY_OFI_PROVIDER=shm", "; $FERRY_INFO -c");
    const char *expected[] = {"transport ofi", "ofi: libfabric 1.", "tcp;ofi_rxm", "shm",
                              "software", "ofi: in use: shm (software", "real hardware",
                              "FERRY_OFI_PROVIDER=", "FERRY_OFI_TIMEOUT=",
                              "FERRY_OFI_SLICE_SIZE=", "FERRY_OFI_COMPLETION=delivery"};
    for (size_t i = 0; i < sizeof(expected) / sizeof(expected[0]); i++)
        cr_assert(strstr(output, expected[i]) != NULL, "missing %s in:\n%s", expected[i],
                  output);
    cr_assert_not_null(strstr(info_output("", ""), "ofi: in use: none"),
                       "no hardware provider here: ofi stays off by default");
}

/* A named provider that is not there: engine creation fails, naming it
 * and listing what libfabric sees. */
static void create_engine(void *arg)
{
    *(ferry_status_t *)arg = ferry_engine_create(NULL, &engine);
}

Test(ofi, missing_provider_is_named_with_the_ones_libfabric_sees)
{
    skip_unless_built();
    setenv("FERRY_TRANSPORTS", "ofi", 1);
    setenv("FERRY_OFI_PROVIDER", "nosuch", 1);
    ferry_status_t status = FERRY_OK;
    char *log = capture_stderr(create_engine, &status);
    cr_assert_neq(status, FERRY_OK);
    engine = NULL;
    cr_assert_not_null(strstr(log, "FERRY_OFI_PROVIDER=nosuch"), "%s", log);
    cr_assert_not_null(strstr(log, "it sees: "), "%s", log);
    cr_assert_not_null(strstr(log, "tcp;ofi_rxm"), "%s", log);
    free(log);
}

/* Without a provider named and no hardware, ofi stays off: silently by
 * default, an error when FERRY_TRANSPORTS asks for it. */
Test(ofi, off_without_hardware_unless_named)
{
    skip_unless_built();
    unsetenv("FERRY_OFI_PROVIDER");
    unsetenv("FERRY_TRANSPORTS");
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    ferry_engine_destroy(engine);
    engine = NULL;
    setenv("FERRY_TRANSPORTS", "ofi", 1);
    cr_assert_neq(ferry_engine_create(NULL, &engine), FERRY_OK);
    engine = NULL;
}

Test(ofi, bad_setting_fails_engine_creation)
{
    skip_unless_built();
    setenv("FERRY_TRANSPORTS", "ofi", 1);
    setenv("FERRY_OFI_PROVIDER", TCP, 1);
    setenv("FERRY_OFI_COMPLETION", "sometimes", 1);
    cr_assert_neq(ferry_engine_create(NULL, &engine), FERRY_OK);
    engine = NULL;
}

/* FERRY_OFI_FD_SPIN takes auto (the default) or microseconds up to 1 s;
 * anything else fails engine creation. */
Test(ofi, fd_spin_takes_auto_or_microseconds)
{
    skip_unless_built();
    setenv("FERRY_TRANSPORTS", "ofi", 1);
    setenv("FERRY_OFI_PROVIDER", TCP, 1);
    const char *good[] = {"auto", "AUTO", "0", "250", "1000000"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        setenv("FERRY_OFI_FD_SPIN", good[i], 1);
        cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK, "FD_SPIN=%s", good[i]);
        ferry_engine_destroy(engine);
        engine = NULL;
    }
    const char *bad[] = {"fast", "-1", "1000001", "12us", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        setenv("FERRY_OFI_FD_SPIN", bad[i], 1);
        cr_assert_neq(ferry_engine_create(NULL, &engine), FERRY_OK, "FD_SPIN=%s", bad[i]);
        engine = NULL;
    }
}

/* A killed process leaves its shm region in /dev/shm, under a name that
 * libfabric 1.17 derives from the pid; the next process given that pid
 * must still start (the module names its endpoints itself). */
Test(ofi, stale_shm_region_of_a_dead_process_with_our_pid_is_no_obstacle)
{
    skip_unless_built();
    char stale[2][64];
    for (int i = 0; i < 2; i++) {
        snprintf(stale[i], sizeof(stale[i]), "/dev/shm/%ld:0:%d", (long)getpid(), i);
        int fd = open(stale[i], O_CREAT | O_EXCL | O_RDWR, 0600);
        cr_assert_geq(fd, 0, "%s: %s", stale[i], strerror(errno));
        cr_assert_eq(ftruncate(fd, 4096), 0);
        close(fd);
    }
    setenv("FERRY_TRANSPORTS", "ofi", 1);
    setenv("FERRY_OFI_PROVIDER", "shm", 1);
    ferry_status_t status = ferry_engine_create(NULL, &engine);
    for (int i = 0; i < 2; i++)
        unlink(stale[i]);
    cr_assert_eq(status, FERRY_OK, "%s", ferry_status_string(status));
}

/* ---- one lane for every peer (ofi_lane.c) ---- */

static long rss_kib(void)
{
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (status != NULL && fgets(line, sizeof(line), status) != NULL)
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    if (status != NULL)
        fclose(status);
    return kib;
}

/* FERRY_TEST_OFI_PEERS peers (8) from one process: 1 MiB written to each
 * and read back in one batch, bytes checked; the engine's memory does not
 * grow with the peers (one target endpoint and one lane, not an endpoint
 * per peer: that was 87 MiB each on rxm).  The RSS goes to the log. */
static void many_peers(const char *provider)
{
    const char *wanted = getenv("FERRY_TEST_OFI_PEERS");
    unsigned n = wanted != NULL ? (unsigned)atoi(wanted) : 8;
    cr_assert(n >= 1 && n <= 64);
    /* Peers cheap to run: rxm's receive pool cut down (README.md), unless
     * the caller chose (both sides must agree: with another buffer size
     * rxm refused every post to the peer).  Peers inherit it. */
    setenv("FI_OFI_RXM_MSG_RX_SIZE", "128", 0);
    setenv("FI_OFI_RXM_BUFFER_SIZE", "4096", 0);
    long before = rss_kib();
    start(provider);
    long engine_kib = rss_kib() - before - (long)(local_size >> 10);
    peer_process_t *peers = calloc(n, sizeof(*peers));
    ferry_segment_h *segments = calloc(n, sizeof(*segments));
    ferry_request_t *reqs = calloc(2 * n, sizeof(*reqs));
    cr_assert(peers != NULL && segments != NULL && reqs != NULL);
    for (unsigned i = 0; i < n; i++) {
        cr_assert_eq(peer_start(&peers[i], NULL), 0, "peer %u did not start", i);
        cr_assert_str_eq(peer_cmd(&peers[i], "reg 0 %zu", MIB), "OK");
        cr_assert_eq(ferry_segment_open(engine, peers[i].name, &segments[i]), FERRY_OK);
        test_pattern_fill(local + i * MIB, MIB, 40 + i);
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = local + i * MIB,
                                    .target = segments[i], .target_offset = peers[i].arena,
                                    .length = MIB};
    }
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, 2 * n, &batch), FERRY_OK);
    cr_assert_eq(ferry_batch_submit(batch, reqs, n), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK);
    for (unsigned i = 0; i < n; i++) {
        cr_assert_str_eq(peer_cmd(&peers[i], "check 0 %zu %u", MIB, 40 + i), "OK", "peer %u", i);
        reqs[i].opcode = FERRY_OP_READ;
        reqs[i].local = local + (size_t)(n + i) * MIB;
    }
    cr_assert_eq(ferry_batch_submit(batch, reqs, n), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK);
    for (unsigned i = 0; i < n; i++)
        cr_assert_eq(test_pattern_check(local + (size_t)(n + i) * MIB, MIB, 40 + i), SIZE_MAX,
                     "read back from peer %u", i);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    long total_kib = rss_kib() - before - (long)(local_size >> 10);
    fprintf(stderr, "ofi: %s, %u peers: engine RSS %ld KiB after create, %ld KiB with every "
            "peer connected (FI_OFI_RXM_MSG_RX_SIZE=%s, FI_OFI_RXM_BUFFER_SIZE=%s)\n", provider, n,
            engine_kib, total_kib, getenv("FI_OFI_RXM_MSG_RX_SIZE"),
            getenv("FI_OFI_RXM_BUFFER_SIZE"));
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    /* two endpoints at most: rxm's defaults cost ~93 MiB each (the
     * sanitizers' shadow memory would swamp it) */
    cr_assert_lt(total_kib, 300 * 1024, "%ld KiB for %u peers", total_kib, n);
#endif
    for (unsigned i = 0; i < n; i++) {
        ferry_segment_close(engine, segments[i]);
        peer_stop(&peers[i]);
    }
    free(reqs);
    free(segments);
    free(peers);
}

Test(ofi, many_peers_share_one_lane_over_tcp_rxm)
{
    many_peers(TCP);
}

Test(ofi, many_peers_share_one_lane_over_shm)
{
    many_peers(SHM);
}

enum { HEALTHY = 3, HEALTHY_LENGTH = 4 << 20 };

/* One round for the healthy peers: two 4 MiB writes to each, then the
 * same read back, bytes checked on both sides. */
static void healthy_round(peer_process_t *healthy, ferry_segment_h *segments, unsigned round)
{
    ferry_request_t reqs[2 * HEALTHY];
    unsigned char *source = local + 16 * MIB, *sink = local + 48 * MIB;
    for (unsigned i = 0; i < HEALTHY; i++) {
        test_pattern_fill(source + i * HEALTHY_LENGTH, HEALTHY_LENGTH, round * 16 + i);
        for (unsigned half = 0; half < 2; half++)
            reqs[2 * i + half] = (ferry_request_t){
                .opcode = FERRY_OP_WRITE,
                .local = source + i * HEALTHY_LENGTH + half * (HEALTHY_LENGTH / 2),
                .target = segments[i],
                .target_offset = healthy[i].arena + half * (HEALTHY_LENGTH / 2),
                .length = HEALTHY_LENGTH / 2};
    }
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, 2 * HEALTHY, &batch), FERRY_OK);
    cr_assert_eq(ferry_batch_submit(batch, reqs, 2 * HEALTHY), FERRY_OK);
    ferry_status_t status = ferry_batch_wait(batch, 20000);
    cr_assert_eq(status, FERRY_OK, "round %u: %s", round, ferry_status_string(status));
    for (unsigned i = 0; i < HEALTHY; i++) {
        cr_assert_str_eq(peer_cmd(&healthy[i], "check 0 %d %u", HEALTHY_LENGTH, round * 16 + i),
                         "OK", "round %u, peer %u", round, i);
        for (unsigned half = 0; half < 2; half++) {
            reqs[2 * i + half].opcode = FERRY_OP_READ;
            reqs[2 * i + half].local = sink + i * HEALTHY_LENGTH + half * (HEALTHY_LENGTH / 2);
        }
    }
    memset(sink, 0, HEALTHY * HEALTHY_LENGTH);
    cr_assert_eq(ferry_batch_submit(batch, reqs, 2 * HEALTHY), FERRY_OK);
    status = ferry_batch_wait(batch, 20000);
    cr_assert_eq(status, FERRY_OK, "round %u: %s", round, ferry_status_string(status));
    for (unsigned i = 0; i < HEALTHY; i++)
        cr_assert_eq(test_pattern_check(sink + i * HEALTHY_LENGTH, HEALTHY_LENGTH,
                                        round * 16 + i), SIZE_MAX, "round %u, read of peer %u",
                     round, i);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
}

/* Waits for the victim's batch on a thread of its own, so that the time
 * of its failure is not the end of whichever healthy round runs then. */
struct victim_wait {
    ferry_batch_h batch;
    ferry_status_t status;
    double done_at;
    atomic_int done;
};

static void *wait_for_victim(void *arg)
{
    struct victim_wait *w = arg;
    w->status = ferry_batch_wait(w->batch, 30000);
    w->done_at = now();
    atomic_store(&w->done, 1);
    return NULL;
}

/* A victim among HEALTHY peers, all on the one lane: 16 writes of 16 MiB
 * to the victim in flight when it is hurt (frozen: nothing ever completes;
 * killed: rxm resets, shm says nothing), while rounds to the healthy ones
 * go on.  The victim's requests FAIL within the bound; every healthy
 * round completes with its bytes checked, those caught by the fence too
 * (posted again on a fresh lane), and after it. */
static void victim_among_healthy(const char *provider, int sig)
{
    start(provider);
    peer_process_t victim, healthy[HEALTHY];
    ferry_segment_h victim_seg, segments[HEALTHY];
    cr_assert_eq(peer_start(&victim, NULL), 0);
    cr_assert_str_eq(peer_cmd(&victim, "reg 0 %zu", 64 * MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, victim.name, &victim_seg), FERRY_OK);
    for (unsigned i = 0; i < HEALTHY; i++) {
        cr_assert_eq(peer_start(&healthy[i], NULL), 0);
        cr_assert_str_eq(peer_cmd(&healthy[i], "reg 0 %d", HEALTHY_LENGTH), "OK");
        cr_assert_eq(ferry_segment_open(engine, healthy[i].name, &segments[i]), FERRY_OK);
    }
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, victim_seg, victim.arena, 4096, "ofi"),
                 FERRY_OK);
    healthy_round(healthy, segments, 0);

    enum { N = 16 };
    ferry_request_t reqs[N];
    /* the source is local's first 16 MiB, which no healthy round touches */
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = local,
                                    .target = victim_seg,
                                    .target_offset = victim.arena + (size_t)(i % 4) * 16 * MIB,
                                    .length = 16 * MIB};
    ferry_batch_h victim_batch;
    cr_assert_eq(ferry_batch_create(engine, N, &victim_batch), FERRY_OK);
    /* shm (1.17) posts under a spin lock in the peer's region: a peer
     * killed while it holds it leaves our post spinning for good (seen
     * under ThreadSanitizer; README.md, "Faults").  So a shm victim dies
     * before its requests, as in killed_peer_over_shm; its pidfd says so. */
    int kill_first = sig == SIGKILL && strcmp(provider, SHM) == 0;
    if (kill_first)
        cr_assert_eq(peer_kill_unreaped(&victim), 0);
    if (sig == SIGSTOP) {
        stopped_peer = victim.pid;
        kill(victim.pid, SIGSTOP); /* before: every write is surely caught */
    }
    double hurt_at = now();
    cr_assert_eq(ferry_batch_submit(victim_batch, reqs, N), FERRY_OK);
    if (sig == SIGKILL && !kill_first) {
        usleep(20 * 1000);
        hurt_at = now();
        kill(victim.pid, SIGKILL);
    }
    struct victim_wait wait = {.batch = victim_batch};
    pthread_t waiter;
    cr_assert_eq(pthread_create(&waiter, NULL, wait_for_victim, &wait), 0);
    unsigned round = 1;
    while (!atomic_load(&wait.done) && now() - hurt_at < 15.0)
        healthy_round(healthy, segments, round++);
    pthread_join(waiter, NULL);
    double elapsed = wait.done_at - hurt_at;
    cr_assert_neq(wait.status, FERRY_ERR_TIMEOUT, "the victim's requests must FAIL, not hang");
    cr_assert_lt(elapsed, 5.0, "failure took %.2f s (bound: FERRY_OFI_TIMEOUT=2 s)", elapsed);
    int failed = put_get_count_peer_failed(victim_batch, N);
    cr_assert_gt(failed, 0);
    cr_assert_eq(ferry_batch_destroy(victim_batch), FERRY_OK);
    fprintf(stderr, "ofi: %s, victim %s: %d of %d failed after %.2f s; %u healthy rounds\n",
            provider, sig == SIGSTOP ? "frozen" : "killed", failed, N, elapsed, round - 1);
    for (unsigned more = 0; more < 2; more++)
        healthy_round(healthy, segments, round++);

    if (sig != SIGKILL)
        kill(victim.pid, SIGKILL);
    ofi_kill_peer(&victim);
    ferry_segment_close(engine, victim_seg);
    for (unsigned i = 0; i < HEALTHY; i++) {
        ferry_segment_close(engine, segments[i]);
        peer_stop(&healthy[i]);
    }
}

Test(ofi, frozen_peer_among_healthy_ones_over_tcp_rxm)
{
    victim_among_healthy(TCP, SIGSTOP);
}

/* shm (1.17) posts under a spin lock in the peer's region, which the
 * peer's own progress takes too: a victim stopped while it holds that
 * lock leaves our next post to it spinning for good, inside libfabric,
 * with the lane's read lock held (README.md, "Faults").  That hung this
 * test in 2 of some 20 loaded runs (load 11 and 45; 120 s timeout), a
 * hazard of the provider that no bound of ours can end, so the test runs
 * only when asked: FERRY_TEST_OFI_SHM_FREEZE=1. */
Test(ofi, frozen_peer_among_healthy_ones_over_shm)
{
    if (getenv("FERRY_TEST_OFI_SHM_FREEZE") == NULL)
        cr_skip_test("shm (libfabric 1.17) can hang a post to a peer stopped holding its "
                     "region's lock; FERRY_TEST_OFI_SHM_FREEZE=1 runs it");
    victim_among_healthy(SHM, SIGSTOP);
}

Test(ofi, killed_peer_among_healthy_ones_over_tcp_rxm)
{
    victim_among_healthy(TCP, SIGKILL);
}

Test(ofi, killed_peer_among_healthy_ones_over_shm)
{
    victim_among_healthy(SHM, SIGKILL);
}

/* What the engine's shm endpoints made in /dev/shm goes with the engine. */
Test(ofi, engine_leaves_nothing_in_dev_shm)
{
    start(SHM);
    peer_process_t peer;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, peer.arena, MIB, "ofi"), FERRY_OK);
    cr_assert_gt(ofi_shm_regions_of(getpid(), 0), 0, "no region under our pid: names changed?");
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    ferry_engine_destroy(engine);
    engine = NULL;
    cr_assert_eq(ofi_shm_regions_of(getpid(), 0), 0, "regions left in /dev/shm");
}
