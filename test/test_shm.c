/* The shm transport (cross-memory attach): failures, the kernel refusing,
 * hosts, and where it stands in the default order.  Plain transfers are
 * test_transfer_shm (test_transfer.c built for shm). */
#include <criterion/criterion.h>
#include <ferry/ferry.h>
#include <ferry/plugin.h>

#include <linux/capability.h>
#include <signal.h>
#include <sys/personality.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "capture_stderr.h"
#include "forged_store.h"
#include "one_request.h"
#include "peer_process.h"
#include "service_process.h"
#include "test_pattern.h"

#define MIB ((size_t)1 << 20)

static ferry_engine_h engine;
static unsigned char *local;
static size_t local_size = 72 * MIB;

static void start(const char *transports)
{
    if (transports != NULL)
        setenv("FERRY_TRANSPORTS", transports, 1); /* peers inherit it */
    else
        unsetenv("FERRY_TRANSPORTS");
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    cr_assert_eq(posix_memalign((void **)&local, 4096, local_size), 0);
    memset(local, 1, local_size);
    cr_assert_eq(ferry_register(engine, local, local_size, "cpu", 0), FERRY_OK);
}

static void stop(void)
{
    if (engine) {
        ferry_unregister(engine, local);
        ferry_engine_destroy(engine);
    }
    engine = NULL;
    free(local);
    local = NULL;
}

TestSuite(shm, .fini = stop, .timeout = 60);

static int all_zero_bytes(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0)
            return 0;
    return 1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One request; returns its status and the transport that served it. */
static ferry_status_t transfer(ferry_opcode_t op, void *buf, ferry_segment_h segment,
                               uint64_t remote, size_t length, char *transport, size_t len)
{
    ferry_xfer_status_t xs;
    ferry_status_t status = one_request(engine, op, buf, segment, remote, length, &xs);
    if (transport != NULL)
        snprintf(transport, len, "%s", xs.transport ? xs.transport : "");
    return status;
}

/* Which transport a same-host write of 1 MiB takes, bytes checked. */
static const char *write_served_by(const char *const *peer_env, int allocated)
{
    static char transport[32];
    peer_process_t peer;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&peer, peer_env), 0);
    uintptr_t remote = peer.arena;
    if (allocated)
        cr_assert_eq(sscanf(peer_cmd(&peer, "alloc %zu", 2 * MIB), "ALLOC %lx", &remote), 1);
    else
        cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", 2 * MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    test_pattern_fill(local, MIB, 17);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, remote, MIB, transport,
                          sizeof(transport)),
                 FERRY_OK);
    memset(local + MIB, 0, MIB);
    cr_assert_eq(transfer(FERRY_OP_READ, local + MIB, segment, remote, MIB, NULL, 0), FERRY_OK);
    cr_assert_eq(test_pattern_check(local + MIB, MIB, 17), SIZE_MAX);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    return transport;
}

Test(shm, killed_peer_fails_at_once_and_others_keep_working)
{
    start("shm");
    peer_process_t victim, bystander;
    ferry_segment_h victim_seg, bystander_seg;
    cr_assert_eq(peer_start(&victim, NULL), 0);
    cr_assert_eq(peer_start(&bystander, NULL), 0);
    cr_assert_str_eq(peer_cmd(&victim, "reg 0 %zu", 64 * MIB), "OK");
    cr_assert_str_eq(peer_cmd(&bystander, "reg 0 %zu", 4 * MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, victim.name, &victim_seg), FERRY_OK);
    cr_assert_eq(ferry_segment_open(engine, bystander.name, &bystander_seg), FERRY_OK);

    /* Write until the victim is gone: copies end the moment it dies. */
    enum { N = 16 };
    ferry_batch_h batch;
    ferry_request_t reqs[N];
    cr_assert_eq(ferry_batch_create(engine, N, &batch), FERRY_OK);
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = local,
                                    .target = victim_seg, .target_offset = victim.arena,
                                    .length = 64 * MIB};
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
    cr_assert_lt(now() - killed, 2.0, "failing took %.2f s", now() - killed);
    for (int i = 0; i < N; i++) { /* every failed one says why: the peer */
        ferry_xfer_status_t xs;
        cr_assert_eq(ferry_batch_status(batch, (size_t)i, &xs), FERRY_OK);
        if (xs.state == FERRY_XFER_FAILED)
            cr_assert_eq(xs.error, FERRY_ERR_PEER_FAILED, "request %d: %s", i,
                         ferry_status_string(xs.error));
    }
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);

    test_pattern_fill(local, 4 * MIB, 8);
    char transport[32];
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, bystander_seg, bystander.arena, 4 * MIB,
                          transport, sizeof(transport)),
                 FERRY_OK);
    cr_assert_str_eq(transport, "shm");
    cr_assert_str_eq(peer_cmd(&bystander, "check 0 %zu 8", 4 * MIB), "OK");
    ferry_segment_close(engine, victim_seg);
    ferry_segment_close(engine, bystander_seg);
    peer_stop(&bystander);
}

/* Drop CAP_SYS_PTRACE from our effective set (this test's process only). */
static void drop_ptrace_capability(void)
{
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    cr_assert_eq(syscall(SYS_capget, &header, data), 0);
    data[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
    cr_assert_eq(syscall(SYS_capset, &header, data), 0);
}

static void write_twice_refused(void *arg)
{
    static const char *const env[] = {"FERRY_TEST_PEER_UNDUMPABLE=1", NULL};
    const char **served = arg;
    *served = write_served_by(env, 0);
    *served = write_served_by(env, 0); /* a second peer: the refusal is logged once */
}

Test(shm, kernel_refusal_falls_through_to_the_next_transport_and_is_logged_once)
{
    drop_ptrace_capability();
    start("shm,tcp");
    const char *served = NULL;
    char *log = capture_stderr(write_twice_refused, &served);
    cr_assert_not_null(log);
    cr_assert_str_eq(served, "tcp");
    const char *line = strstr(log, "refuses cross-memory attach");
    cr_assert_not_null(line, "no log line says why: %s", log);
    cr_assert_null(strstr(line + 1, "refuses cross-memory attach"), "logged twice: %s", log);
    free(log);
}

Test(shm, never_across_hosts)
{
    start("shm,tcp");
    static const char *const other[] = {"FERRY_HOST_ID=another-host", NULL};
    cr_assert_str_eq(write_served_by(other, 0), "tcp");
    setenv("FERRY_HOST_ID", "this-host", 1);
    stop();
    start("shm,tcp");
    static const char *const same[] = {"FERRY_HOST_ID=this-host", NULL};
    cr_assert_str_eq(write_served_by(same, 0), "shm", "equal host identities: same host");
}

/* Every transport found: registered memory of a same-host peer goes by shm
 * (ucx keeps it as a fallback), ferry_alloc memory by ucx when ucx is built
 * (plain stores into the attached segment), else by shm too. */
Test(shm, default_order_on_one_host)
{
    start(NULL);
    cr_assert_str_eq(write_served_by(NULL, 0), "shm");
    const char *allocated = write_served_by(NULL, 1);
    char *plugins = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&plugins, &size);
    ferry_info_print(out, FERRY_INFO_PLUGINS);
    fclose(out);
    int have_ucx = strstr(plugins, "transport ucx") != NULL;
    free(plugins);
    cr_assert_str_eq(allocated, have_ucx ? "ucx" : "shm");
}

/* A request that names its transport: served by it where it reaches the
 * buffer (tcp instead of the default shm), refused where it cannot (shm
 * across hosts, a transport this engine did not enable) with a line saying
 * why, and a batch mixing named and unnamed requests serves each its way. */
typedef struct named_case {
    peer_process_t peer;
    ferry_segment_h segment;
    char served[4][32];
    ferry_status_t refused_status, unknown_status, mixed_status;
} named_case_t;

static void named_requests(void *arg)
{
    named_case_t *c = arg;
    ferry_xfer_status_t xs;
    test_pattern_fill(local, MIB, 5);
    cr_assert_eq(one_request_via(engine, FERRY_OP_WRITE, local, c->segment, c->peer.arena, MIB,
                                 "tcp", &xs),
                 FERRY_OK);
    snprintf(c->served[0], sizeof(c->served[0]), "%s", xs.transport);
    cr_assert_str_eq(peer_cmd(&c->peer, "check 0 %zu 5", MIB), "OK");
    c->unknown_status = one_request_via(engine, FERRY_OP_WRITE, local, c->segment, c->peer.arena,
                                        MIB, "no-such-transport", NULL);

    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, 3, &batch), FERRY_OK);
    test_pattern_fill(local + MIB, 3 * MIB, 6);
    ferry_request_t reqs[3];
    const char *names[3] = {"tcp", NULL, "shm"};
    for (size_t i = 0; i < 3; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = local + (i + 1) * MIB,
                                    .target = c->segment, .target_offset = c->peer.arena +
                                                                           (i + 1) * MIB,
                                    .length = MIB, .transport = names[i]};
    c->mixed_status = ferry_batch_submit(batch, reqs, 3);
    if (c->mixed_status == FERRY_OK)
        c->mixed_status = ferry_batch_wait(batch, 30000);
    for (size_t i = 0; i < 3 && c->mixed_status == FERRY_OK; i++) {
        cr_assert_eq(ferry_batch_status(batch, i, &xs), FERRY_OK);
        snprintf(c->served[i + 1], sizeof(c->served[i + 1]), "%s", xs.transport);
    }
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&c->peer, "check %zu %zu 6", MIB, 3 * MIB), "OK");
}

Test(shm, a_request_can_name_its_transport)
{
    start("shm,tcp");
    named_case_t c;
    cr_assert_eq(peer_start(&c.peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(&c.peer, "reg 0 %zu", 8 * MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, c.peer.name, &c.segment), FERRY_OK);
    char *log = capture_stderr(named_requests, &c);
    cr_assert_not_null(log);
    cr_assert_str_eq(c.served[0], "tcp");
    cr_assert_eq(c.unknown_status, FERRY_ERR_UNSUPPORTED);
    cr_assert_not_null(strstr(log, "\"no-such-transport\" is not enabled"), "%s", log);
    cr_assert_eq(c.mixed_status, FERRY_OK, "%s", ferry_status_string(c.mixed_status));
    cr_assert_str_eq(c.served[1], "tcp");
    cr_assert_str_eq(c.served[2], "shm", "an unnamed request takes the default order");
    cr_assert_str_eq(c.served[3], "shm");
    free(log);
    ferry_segment_close(engine, c.segment);
    peer_stop(&c.peer);
}

static void shm_across_hosts(void *arg)
{
    named_case_t *c = arg;
    c->refused_status = one_request_via(engine, FERRY_OP_WRITE, local, c->segment, c->peer.arena,
                                        4096, "shm", NULL);
}

Test(shm, a_request_naming_a_same_host_transport_across_hosts_is_refused)
{
    start("shm,tcp");
    static const char *const other[] = {"FERRY_HOST_ID=another-host", NULL};
    named_case_t c;
    cr_assert_eq(peer_start(&c.peer, other), 0);
    cr_assert_str_eq(peer_cmd(&c.peer, "reg 0 %zu", MIB), "OK");
    cr_assert_str_eq(peer_cmd(&c.peer, "fill 0 4096 3"), "OK");
    cr_assert_eq(ferry_segment_open(engine, c.peer.name, &c.segment), FERRY_OK);
    char *log = capture_stderr(shm_across_hosts, &c);
    cr_assert_not_null(log);
    cr_assert_eq(c.refused_status, FERRY_ERR_UNSUPPORTED);
    cr_assert_not_null(strstr(log, "asks for transport shm, but it reaches peers on this host"),
                       "%s", log);
    free(log);
    cr_assert_str_eq(peer_cmd(&c.peer, "check 0 4096 3"), "OK", "nothing was written");
    ferry_segment_close(engine, c.segment);
    peer_stop(&c.peer);
}

/* The honest peer's shm endpoint "shm1:<boot>:<ns>:<pid>:<start>:<probe>"
 * as it is in json, and the same with another start time, in forged. */
static void endpoint_with_another_start(const char *json, char *honest, char *forged, size_t size)
{
    const char *at = strstr(json, "shm1:");
    cr_assert_not_null(at, "no shm endpoint in %s", json);
    snprintf(honest, size, "%.*s", (int)strcspn(at, "\""), at);
    const char *field = honest;
    for (int i = 0; i < 4; i++) /* to <start> */
        field = strchr(field, ':') + 1;
    unsigned long long start = strtoull(field, NULL, 10);
    cr_assert_gt(start, 0ull, "%s", honest);
    snprintf(forged, size, "%.*s%llu%s", (int)(field - honest), honest, start + 1,
             strchr(field, ':'));
}

/*
 * pid reuse: a descriptor (here a store entry) whose pid names a live
 * process that started at another time than the one it names is never
 * written, the first write included, and the refresh-and-retry after a
 * failure does not write through the same stale entry either.  Reads get
 * nothing from it.  The honest descriptor of the same process still works.
 */
Test(shm, a_live_pid_with_another_start_time_is_never_written)
{
    /* shm's own look at the process, behind the owner's confirmation,
     * which would refuse this forged descriptor before shm saw it. */
    setenv("FERRY_CONFIRM_DESCRIPTORS", "no", 1);
    service_t metad;
    service_start_forgery_store(&metad);
    start("shm");
    peer_process_t peer;
    static const char *const honest_env[] = {"FERRY_SEGMENT_NAME=honest", NULL};
    cr_assert_eq(peer_start(&peer, honest_env), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "fill 0 %zu 21", MIB), "OK");
    static char json[1 << 17];
    char honest[256], forged[256];
    forged_store_fetch(metad.port, "honest", json, sizeof(json));
    endpoint_with_another_start(json, honest, forged, sizeof(honest));
    forged_store_publish(metad.port, "honest", "reused", honest, forged);

    ferry_segment_h reused, real;
    cr_assert_eq(ferry_segment_open(engine, "reused", &reused), FERRY_OK);
    test_pattern_fill(local, MIB, 22);
    for (int i = 0; i < 3; i++) {
        ferry_status_t status =
            one_request_via(engine, FERRY_OP_WRITE, local, reused, peer.arena, MIB, "shm", NULL);
        cr_assert_neq(status, FERRY_OK, "write %d reached pid %d through %s", i, (int)peer.pid,
                      forged);
        /* past the liveness interval: a later write is a new look */
        usleep(2 * 20 * 1000);
    }
    memset(local + MIB, 0, MIB);
    cr_assert_neq(
        one_request_via(engine, FERRY_OP_READ, local + MIB, reused, peer.arena, MIB, "shm", NULL),
        FERRY_OK);
    cr_assert(all_zero_bytes(local + MIB, MIB), "a read through the stale entry got data");
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 21", MIB), "OK", "the process was written");

    cr_assert_eq(ferry_segment_open(engine, "honest", &real), FERRY_OK);
    cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, local, real, peer.arena, MIB, "shm"),
                 FERRY_OK, "the honest descriptor of the same process");
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 22", MIB), "OK");
    ferry_segment_close(engine, reused);
    ferry_segment_close(engine, real);
    peer_stop(&peer);
    stop(); /* the engine leaves the store before the store goes */
    service_cleanup(&metad);
}

/* Make the next process this one forks get pid (CAP_SYS_ADMIN): 0, or -1. */
static int next_pid_is(pid_t pid)
{
    FILE *file = fopen("/proc/sys/kernel/ns_last_pid", "w");
    if (file == NULL)
        return -1;
    int ok = fprintf(file, "%d", (int)pid - 1) > 0;
    return fclose(file) == 0 && ok ? 0 : -1;
}

/*
 * pid reuse after the first copy: a peer that was written to dies and
 * another process gets its pid, with memory at the same address (no
 * address randomization, the same program).  A write through the dead
 * peer's descriptor must not land in the stranger: shm looks the pid up
 * again before a copy (when the last look is older than a few ms).
 */
Test(shm, a_recycled_pid_is_not_written)
{
    personality(ADDR_NO_RANDOMIZE); /* inherited by the peers */
    start("shm");
    peer_process_t first, stranger;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&first, NULL), 0);
    cr_assert_str_eq(peer_cmd(&first, "reg 0 %zu", MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, first.name, &segment), FERRY_OK);
    test_pattern_fill(local, MIB, 31);
    cr_assert_eq(
        one_request_served_by(engine, FERRY_OP_WRITE, local, segment, first.arena, MIB, "shm"),
        FERRY_OK);
    pid_t pid = first.pid;
    uintptr_t arena = first.arena;
    peer_kill(&first, SIGKILL);

    int reused = 0;
    for (int attempt = 0; attempt < 50 && !reused; attempt++) {
        if (next_pid_is(pid) != 0)
            cr_skip_test("cannot choose the next pid (/proc/sys/kernel/ns_last_pid)");
        cr_assert_eq(peer_start(&stranger, NULL), 0);
        reused = stranger.pid == pid;
        if (!reused)
            peer_stop(&stranger); /* another process took the pid first */
    }
    if (!reused)
        cr_skip_test("pid %d was never given to a new peer (a busy machine)", (int)pid);
    if (stranger.arena != arena)
        cr_skip_test("the new peer's arena is not where the old one's was");
    char before[64];
    snprintf(before, sizeof(before), "%s", peer_cmd(&stranger, "sum 0 %zu", MIB));
    usleep(2 * 20 * 1000); /* past the liveness interval */
    cr_assert_neq(one_request_via(engine, FERRY_OP_WRITE, local, segment, arena, MIB, "shm", NULL),
                  FERRY_OK, "a write reached pid %d, now another process", (int)pid);
    cr_assert_str_eq(peer_cmd(&stranger, "sum 0 %zu", MIB), before,
                     "the process that got the pid was written");
    ferry_segment_close(engine, segment);
    peer_stop(&stranger);
}

/* The look the ofi sweep takes before it blames a silent peer: a process
 * stopped by SIGSTOP is seen stopped, the same process resumed is not, and
 * a process gone is not stopped either. */
Test(shm, stopped_process_is_seen_stopped)
{
    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
        for (;;)
            pause();
    }
    int status;
    cr_assert_eq(ferry_process_stopped(child), 0, "a running child seen stopped");
    kill(child, SIGSTOP);
    cr_assert_eq(waitpid(child, &status, WUNTRACED), child);
    cr_assert(WIFSTOPPED(status));
    cr_assert_eq(ferry_process_stopped(child), 1, "a child stopped by SIGSTOP not seen stopped");
    kill(child, SIGCONT);
    cr_assert_eq(waitpid(child, &status, WCONTINUED), child);
    cr_assert_eq(ferry_process_stopped(child), 0, "a resumed child still seen stopped");
    kill(child, SIGKILL);
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert_eq(ferry_process_stopped(child), 0, "a reaped child seen stopped");
}
