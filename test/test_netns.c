/*
 * Hosts in tests: two network namespaces joined by a veth pair, an engine in
 * each (this test's process in the first, a ferry_test_peer in the second),
 * each with its own host identity (FERRY_HOST_ID) and its RPC on its veth
 * address.  Across hosts the bytes must cross the veth (its byte counters
 * grow by at least the payload), by tcp or ucx, and never by a same-host-only
 * transport, although shm would work here (one kernel, one pid namespace).
 * With equal identities the same pair takes shm and the veth stays quiet.
 *
 * Skips where namespaces cannot be made (not root, no iproute2, no
 * CAP_SYS_ADMIN).  Criterion runs each test in a process of its own, so
 * joining a namespace here touches no other test.
 */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "netns_pair.h"
#include "one_request.h"
#include "peer_process.h"
#include "service_process.h"
#include "test_pattern.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static netns_pair_t pair;
static int have_pair;
static peer_process_t peer;
static ferry_engine_h engine;
static ferry_segment_h segment;
static unsigned char *local;
static const size_t local_size = 8 * MIB;

static void stop(void)
{
    if (segment != NULL)
        ferry_segment_close(engine, segment);
    segment = NULL;
    if (engine != NULL)
        ferry_engine_destroy(engine);
    engine = NULL;
    peer_stop(&peer);
    free(local);
    local = NULL;
    if (have_pair)
        netns_pair_destroy(&pair);
    have_pair = 0;
}

TestSuite(netns, .fini = stop, .timeout = 120);

static void set_or_unset(const char *name, const char *value)
{
    if (value != NULL)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

/*
 * The pair made; this process in pair.ns[0] with an engine (host identity
 * host_a, RPC at its veth address), the peer in pair.ns[1] (host_b), both
 * with FERRY_TRANSPORTS=transports; a NULL identity leaves the default
 * (the boot id).  ucx: UCX over TCP on each side's veth.  peer_extra: one
 * more variable for the peer, or NULL.  The peer's arena is registered and
 * its segment open.
 */
static void start(const char *transports, const char *host_a, const char *host_b, int ucx,
                  const char *peer_extra)
{
    char why[512];
    int made = netns_pair_create(&pair, why, sizeof(why));
    if (made == NETNS_UNAVAILABLE) {
        /* Criterion does not print a skip's reason unless verbose. */
        fprintf(stderr, "test_netns: skipped: network namespaces cannot be set up here: %s\n", why);
        cr_skip_test("%s", why);
    }
    cr_assert_eq(made, NETNS_OK, "%s", why);
    have_pair = 1;

    char rpc[2][40], netns_env[64], host_env[160], rpc_env[64], ucx_dev_env[48];
    char asan_env[1200];
    for (int i = 0; i < 2; i++)
        snprintf(rpc[i], sizeof(rpc[i]), "%s:0", pair.ip[i]);
    set_or_unset("FERRY_TRANSPORTS", transports); /* the peer inherits it */
    set_or_unset("FERRY_HOST_ID", host_a);
    setenv("FERRY_RPC_ADDRESS", rpc[0], 1);
    unsetenv("FERRY_TCP_LISTEN_HOST");
    if (ucx) {
        setenv("UCX_TLS", "tcp", 1);
        setenv("UCX_NET_DEVICES", pair.ifname[0], 1);
        setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    }
    cr_assert_eq(netns_enter(pair.ns[0]), 0, "joining %s: %s", pair.ns[0], strerror(errno));
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    cr_assert_eq(posix_memalign((void **)&local, 4096, local_size), 0);
    memset(local, 0, local_size);
    cr_assert_eq(ferry_register(engine, local, local_size, "cpu", 0), FERRY_OK);

    const char *env[7];
    size_t n = 0;
    snprintf(netns_env, sizeof(netns_env), "FERRY_TEST_PEER_NETNS=%s", pair.ns[1]);
    env[n++] = netns_env;
    snprintf(rpc_env, sizeof(rpc_env), "FERRY_RPC_ADDRESS=%s", rpc[1]);
    env[n++] = rpc_env;
    if (host_b != NULL) {
        snprintf(host_env, sizeof(host_env), "FERRY_HOST_ID=%s", host_b);
        env[n++] = host_env;
    }
    if (ucx) {
        snprintf(ucx_dev_env, sizeof(ucx_dev_env), "UCX_NET_DEVICES=%s", pair.ifname[1]);
        env[n++] = ucx_dev_env;
        /* Sanitizer builds: in a peer that used UCX over TCP on a real
         * device (not lo; test_ucx with UCX_NET_DEVICES=eth0 too), GCC 12's
         * LeakSanitizer records a dynamic TLS block with bogus bounds (its
         * __tls_get_addr interceptor guesses them) and its exit scan
         * crashes on it ("Tracer caught signal 11"): no leak check at all.
         * Without that interception the check runs, and finds nothing. */
        const char *given = getenv("ASAN_OPTIONS");
        snprintf(asan_env, sizeof(asan_env), "ASAN_OPTIONS=%s%sintercept_tls_get_addr=0",
                 given ? given : "", given && *given ? ":" : "");
        env[n++] = asan_env;
    }
    if (peer_extra != NULL)
        env[n++] = peer_extra;
    env[n] = NULL;
    cr_assert_eq(peer_start(&peer, env), 0, "the peer did not start in %s", pair.ns[1]);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", 16 * MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
}

/* "host:port" with that host. */
static int has_host(const char *endpoint, const char *host)
{
    size_t n = strlen(host);
    return endpoint != NULL && strncmp(endpoint, host, n) == 0 && endpoint[n] == ':';
}

/* Both engines are reached at their veth addresses: the p2p names (RPC
 * endpoints) and, where tcp is enabled, the peer's tcp listener, which
 * binds the engine's RPC host unless FERRY_TCP_LISTEN_HOST says otherwise
 * and never advertises a wildcard. */
static void check_addresses(const char *host_b)
{
    cr_assert(has_host(ferry_engine_segment_name(engine), pair.ip[0]), "our name %s",
              ferry_engine_segment_name(engine));
    cr_assert(has_host(peer.name, pair.ip[1]), "the peer's name %s", peer.name);
    char *text = NULL;
    cr_assert_eq(ferry_segment_describe(engine, segment, &text), FERRY_OK);
    json_t *desc = json_loads(text, 0, NULL);
    cr_assert_not_null(desc, "%s", text);
    cr_assert(has_host(json_string_value(json_object_get(desc, "rpc")), pair.ip[1]), "%s",
              text);
    if (host_b != NULL)
        cr_assert_str_eq(json_string_value(json_object_get(desc, "host")), host_b);
    json_t *tcp = json_object_get(json_object_get(desc, "transports"), "tcp");
    if (tcp != NULL)
        cr_assert(has_host(json_string_value(tcp), pair.ip[1]), "tcp endpoint in %s", text);
    json_decref(desc);
    free(text);
}

typedef struct link_bytes {
    uint64_t rx[2], tx[2]; /* per veth end, as counted in its namespace */
} link_bytes_t;

static link_bytes_t read_link_bytes(void)
{
    link_bytes_t bytes;
    for (int i = 0; i < 2; i++)
        cr_assert_eq(netns_link_bytes(pair.ns[i], pair.ifname[i], &bytes.rx[i], &bytes.tx[i]),
                     0, "no counters for %s in %s", pair.ifname[i], pair.ns[i]);
    return bytes;
}

/* One request, served by `transport`; returns the bytes the sending end of
 * the veth sent meanwhile.  across: they crossed the veth (the sender's tx
 * and the receiver's rx grew by at least the payload). */
static uint64_t one_transfer(ferry_opcode_t op, size_t local_off, size_t remote_off,
                             size_t length, const char *transport, int across)
{
    link_bytes_t before = read_link_bytes();
    ferry_xfer_status_t xs;
    const char *what = op == FERRY_OP_WRITE ? "write" : "read";
    cr_assert_eq(one_request(engine, op, local + local_off, segment, peer.arena + remote_off,
                             length, &xs),
                 FERRY_OK, "%s of %zu bytes", what, length);
    cr_assert_eq(xs.state, FERRY_XFER_COMPLETED);
    cr_assert_eq(xs.transferred, length);
    cr_assert_str_eq(xs.transport, transport, "%s of %zu bytes served by %s", what, length,
                     xs.transport);
    link_bytes_t after = read_link_bytes();
    int from = op == FERRY_OP_WRITE ? 0 : 1, to = 1 - from;
    uint64_t sent = after.tx[from] - before.tx[from];
    uint64_t received = after.rx[to] - before.rx[to];
    fprintf(stderr, "netns: %s %zu B by %s: %s tx +%" PRIu64 ", %s rx +%" PRIu64 "\n", what,
            length, transport, pair.ifname[from], sent, pair.ifname[to], received);
    if (across) {
        cr_assert_geq(sent, length, "%s of %zu bytes: %s sent only %" PRIu64, what, length,
                      pair.ifname[from], sent);
        cr_assert_geq(received, length, "%s of %zu bytes: %s received only %" PRIu64, what,
                      length, pair.ifname[to], received);
    }
    return sent;
}

/*
 * Write and read back 1 B, 64 KiB and 4 MiB at unaligned offsets, bytes
 * checked on both sides, each served by `transport` (across: over the
 * veth, see one_transfer).  Returns the bytes the veth carried meanwhile,
 * both directions, as the sending ends counted them.
 */
static uint64_t move_bytes(const char *transport, int across)
{
    static const size_t sizes[] = {1, 64 * KIB, 4 * MIB};
    uint64_t wire = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t length = sizes[i], local_off = 3, remote_off = 5 * MIB * i + 7;
        unsigned seed = 40 + (unsigned)i;
        test_pattern_fill(local + local_off, length, seed);
        wire += one_transfer(FERRY_OP_WRITE, local_off, remote_off, length, transport, across);
        cr_assert_str_eq(peer_cmd(&peer, "check %zu %zu %u", remote_off, length, seed), "OK",
                         "bytes written (%zu) differ at the target", length);
        cr_assert_str_eq(peer_cmd(&peer, "fill %zu %zu %u", remote_off, length, seed + 50),
                         "OK");
        memset(local + local_off, 0, length);
        wire += one_transfer(FERRY_OP_READ, local_off, remote_off, length, transport, across);
        cr_assert_eq(test_pattern_check(local + local_off, length, seed + 50), SIZE_MAX,
                     "bytes read (%zu) differ", length);
    }
    return wire;
}

/* Every transport but ucx, in the default order (shm before tcp): shm is
 * skipped across hosts, tcp serves, over the veth. */
Test(netns, tcp_across_hosts)
{
    start("^ucx", "host-a", "host-b", 0, NULL);
    check_addresses("host-b");
    move_bytes("tcp", 1);
}

/* shm named first does not make it cross hosts either.  The peer's tcp
 * listener binds the wildcard and still advertises its veth address. */
Test(netns, tcp_across_hosts_with_shm_listed_first)
{
    start("shm,tcp", "host-a", "host-b", 0, "FERRY_TCP_LISTEN_HOST=0.0.0.0");
    check_addresses("host-b");
    move_bytes("tcp", 1);
}

/* UCX over TCP on the veth. */
Test(netns, ucx_across_hosts)
{
    if (!service_module_built("ucx"))
        cr_skip_test("the ucx module is not built (libucx-dev missing)");
    start("ucx", "host-a", "host-b", 1, NULL);
    check_addresses("host-b");
    move_bytes("ucx", 1);
}

/* libfabric's tcp;ofi_rxm on the veth: each side's endpoint binds its
 * engine's advertised (veth) address, and the bytes cross it.  ofi is
 * opt-in and a software provider only a fallback: FERRY_TRANSPORTS=ofi
 * and FERRY_OFI_PROVIDER name them (both inherited by the peer). */
Test(netns, ofi_across_hosts)
{
    if (!service_module_built("ofi"))
        cr_skip_test("the ofi module is not built (libfabric-dev missing)");
    setenv("FERRY_OFI_PROVIDER", "tcp;ofi_rxm", 1);
    start("ofi", "host-a", "host-b", 0, NULL);
    check_addresses("host-b");
    move_bytes("ofi", 1);
}

/* The same two namespaces with one host identity are one host: shm serves
 * (cross-memory attach), and the veth carries only the control traffic
 * (the descriptor fetch), far less than the payload. */
static void one_host(const char *host_id)
{
    start("shm,tcp", host_id, host_id, 0, NULL);
    check_addresses(host_id);
    uint64_t wire = move_bytes("shm", 0);
    cr_assert_lt(wire, 64 * KIB, "the veth carried %" PRIu64 " bytes", wire);
}

Test(netns, equal_host_identity_takes_shm)
{
    one_host("one-host");
}

/* Without FERRY_HOST_ID both use the boot id: namespaces on one kernel are
 * one host, as they should be (shm works between them). */
Test(netns, default_host_identity_is_the_kernel)
{
    one_host(NULL);
}

/* A storage buffer (ferry_register_storage) of a peer on another host: tcp
 * serves it across the veth, the peer reading and writing its file; the
 * file transport does not take it (that path here is another host's). */
Test(netns, storage_buffer_served_by_tcp_across_hosts)
{
    start("file,tcp", "host-a", "host-b", 0, NULL);
    char path[] = "/tmp/ferry-netns-storage-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)(4 * MIB)), 0);
    uintptr_t addr = 0;
    const char *reply = peer_cmd(&peer, "sreg %zu %zu 0 %s rw", MIB, 2 * MIB, path);
    int registered = sscanf(reply, "SREG %" SCNxPTR, &addr) == 1;
    test_pattern_fill(local, MIB + 3, 61);
    link_bytes_t before = read_link_bytes();
    ferry_xfer_status_t xs = {0};
    ferry_status_t wrote = registered ? one_request(engine, FERRY_OP_WRITE, local, segment,
                                                    addr + 5, MIB + 3, &xs)
                                      : FERRY_ERR_INVALID_PARAM;
    link_bytes_t after = read_link_bytes();
    unsigned char *check = malloc(MIB + 3);
    ssize_t got = pread(fd, check, MIB + 3, (off_t)(MIB + 5));
    size_t bad = test_pattern_check(check, MIB + 3, 61);
    memset(local + 2 * MIB, 0, MIB + 3);
    ferry_status_t read = registered ? one_request(engine, FERRY_OP_READ, local + 2 * MIB,
                                                   segment, addr + 5, MIB + 3, NULL)
                                     : FERRY_ERR_INVALID_PARAM;
    close(fd);
    unlink(path);
    free(check);
    cr_assert(registered, "%s", reply);
    cr_assert_eq(wrote, FERRY_OK);
    cr_assert_str_eq(xs.transport, "tcp");
    cr_assert_geq(after.tx[0] - before.tx[0], MIB, "the write did not cross the veth");
    cr_assert_eq(got, (ssize_t)(MIB + 3));
    cr_assert_eq(bad, SIZE_MAX, "the file holds other bytes at %zu", bad);
    cr_assert_eq(read, FERRY_OK);
    cr_assert_eq(test_pattern_check(local + 2 * MIB, MIB + 3, 61), SIZE_MAX);
}
