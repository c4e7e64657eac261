/*
 * Metadata stores against real servers: etcd, redis-server and ferry_metad,
 * each started by the test on free loopback ports (service_process.c).
 * A part whose server or module is not there is skipped.
 */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "peer_process.h"
#include "service_process.h"
#include "test_pattern.h"

#define MIB ((size_t)1 << 20)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void setup(void)
{
    /* Inherited by the peer processes too. */
    setenv("FERRY_TRANSPORTS", "tcp", 1);
    setenv("FERRY_TCP_TIMEOUT", "2000", 1);
    setenv("FERRY_ETCD_TIMEOUT", "1000ms", 1);
    setenv("FERRY_REDIS_TIMEOUT", "1000ms", 1);
    setenv("FERRY_HTTP_TIMEOUT", "1000ms", 1);
    setenv("FERRY_ETCD_RETRY", "200ms", 1);
    setenv("FERRY_REDIS_RETRY", "200ms", 1);
    setenv("FERRY_HTTP_RETRY", "200ms", 1);
    setenv("FERRY_HTTP_REFRESH", "300ms", 1);
    setenv("FERRY_REDIS_TTL", "3s", 1);
}

TestSuite(metadata, .init = setup, .fini = service_cleanup_all, .timeout = 90);

static void require(service_kind_t kind)
{
    const char *missing = service_missing(kind);
    if (missing != NULL)
        cr_skip_test("%s", missing);
}

static ferry_engine_h engine_on(const char *uri, const char *name)
{
    ferry_config_t config = {.field_mask = FERRY_CONFIG_FIELD_METADATA, .metadata = uri};
    if (name != NULL) {
        config.field_mask |= FERRY_CONFIG_FIELD_NAME;
        config.name = name;
    }
    ferry_engine_h engine;
    ferry_status_t status = ferry_engine_create(&config, &engine);
    cr_assert_eq(status, FERRY_OK, "engine on %s: %s", uri, ferry_status_string(status));
    return engine;
}

static void start_peer(peer_process_t *peer, const char *uri, const char *name,
                       const char *more)
{
    static char env[3][512];
    snprintf(env[0], sizeof(env[0]), "FERRY_METADATA=%s", uri);
    snprintf(env[1], sizeof(env[1]), "FERRY_SEGMENT_NAME=%s", name);
    snprintf(env[2], sizeof(env[2]), "%s", more ? more : "FERRY_LOG_LEVEL=error");
    const char *list[] = {env[0], env[1], env[2], NULL};
    cr_assert_eq(peer_start(peer, list), 0, "peer %s did not start on %s", name, uri);
    cr_assert_str_eq(peer->name, name);
}

/* WRITE len bytes of pattern seed to the peer's arena at off; check there. */
static ferry_status_t write_to(ferry_engine_h engine, ferry_segment_h segment,
                               peer_process_t *peer, size_t off, size_t len, unsigned seed)
{
    static unsigned char *local;
    if (local == NULL)
        cr_assert_eq(posix_memalign((void **)&local, 4096, 4 * MIB), 0);
    test_pattern_fill(local, len, seed);
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, 1, &batch), FERRY_OK);
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = local, .target = segment,
                           .target_offset = peer->arena + off, .length = len};
    ferry_status_t status = ferry_batch_submit(batch, &req, 1);
    if (status == FERRY_OK)
        status = ferry_batch_wait(batch, 20000);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    if (status == FERRY_OK)
        cr_assert_str_eq(peer_cmd(peer, "check %zu %zu %u", off, len, seed), "OK");
    return status;
}

static int is_metadata_error(ferry_status_t status)
{
    return status <= FERRY_ERR_METADATA && status > FERRY_ERR_TIMEOUT;
}

/* Open (uncached: nobody else holds it), describe, close.  The descriptor
 * JSON goes to json (may be NULL). */
static ferry_status_t open_once(ferry_engine_h engine, const char *name, char *json, size_t len)
{
    ferry_segment_h segment;
    ferry_status_t status = ferry_segment_open(engine, name, &segment);
    if (status != FERRY_OK)
        return status;
    char *text = NULL;
    status = ferry_segment_describe(engine, segment, &text);
    if (status == FERRY_OK && json)
        snprintf(json, len, "%s", text);
    free(text);
    ferry_segment_close(engine, segment);
    return status;
}

/* Poll until `name` opens and its descriptor holds `addr` (0: anything). */
static int wait_published(ferry_engine_h engine, const char *name, uintptr_t addr,
                          double timeout_s)
{
    static char json[1 << 16];
    char want[64];
    snprintf(want, sizeof(want), "\"0x%" PRIxPTR "\"", addr);
    for (double end = now() + timeout_s; now() < end; usleep(50000))
        if (open_once(engine, name, json, sizeof(json)) == FERRY_OK &&
            (addr == 0 || strstr(json, want) != NULL))
            return 1;
    return 0;
}

/* Poll until opening `name` says it does not exist. */
static double wait_gone(ferry_engine_h engine, const char *name, double timeout_s)
{
    double start = now();
    for (double end = start + timeout_s; now() < end; usleep(50000))
        if (open_once(engine, name, NULL, 0) == FERRY_ERR_SEGMENT_NOT_FOUND)
            return now() - start;
    return -1;
}

/* ---------------- two processes find each other ---------------- */

static void find_each_other(const char *uri)
{
    peer_process_t peer;
    /* '/', ':', '@' and '%' in a name: the key layout escapes them. */
    char name[128];
    snprintf(name, sizeof(name), "job-%d/rank:0@gpu%%1", (int)getpid());
    start_peer(&peer, uri, name, NULL);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");

    ferry_engine_h engine = engine_on(uri, "tester");
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, name, &segment), FERRY_OK);
    cr_assert_eq(write_to(engine, segment, &peer, 0, MIB, 7), FERRY_OK);
    ferry_segment_close(engine, segment);

    /* A clean exit removes the segment from the store. */
    peer_stop(&peer);
    cr_assert_eq(open_once(engine, name, NULL, 0), FERRY_ERR_SEGMENT_NOT_FOUND);
    ferry_engine_destroy(engine);
}

Test(metadata, etcd_two_processes_find_each_other_with_failover)
{
    require(SERVICE_ETCD);
    service_t etcd;
    cr_assert_eq(service_start(&etcd, SERVICE_ETCD, NULL), 0);
    /* The first endpoint is dead: every client fails over to the second. */
    char uri[256];
    snprintf(uri, sizeof(uri), "etcd://127.0.0.1:%d,127.0.0.1:%d", service_free_port(),
             etcd.port);
    find_each_other(uri);
    service_cleanup(&etcd);
}

Test(metadata, redis_two_processes_find_each_other)
{
    require(SERVICE_REDIS);
    service_t redis;
    cr_assert_eq(service_start(&redis, SERVICE_REDIS, NULL), 0);
    find_each_other(redis.uri);
    service_cleanup(&redis);
}

Test(metadata, http_two_processes_find_each_other_through_ferry_metad)
{
    require(SERVICE_METAD);
    service_t metad;
    cr_assert_eq(service_start(&metad, SERVICE_METAD, NULL), 0);
    find_each_other(metad.uri);
    service_cleanup(&metad);
}

/* ---------------- the store goes down and comes back ---------------- */

/*
 * P and Q are peers, E this process's engine, O an observer whose opens are
 * never cached.  The server is killed; while it is down an uncached open
 * fails fast with a metadata error, an open segment keeps moving data, and
 * registrations (E's and P's) still succeed.  After the restart every
 * segment is there again with its newest buffers, without any user action.
 */
static void survive_restart(service_t *svc, int keep_data)
{
    peer_process_t p, q;
    char p_name[64], q_name[64];
    snprintf(p_name, sizeof(p_name), "p-%d", (int)getpid());
    snprintf(q_name, sizeof(q_name), "q-%d", (int)getpid());
    start_peer(&p, svc->uri, p_name, NULL);
    start_peer(&q, svc->uri, q_name, NULL);
    cr_assert_str_eq(peer_cmd(&p, "reg 0 %zu", MIB), "OK");
    cr_assert_str_eq(peer_cmd(&q, "reg 0 %zu", MIB), "OK");

    char e_name[64];
    snprintf(e_name, sizeof(e_name), "e-%d", (int)getpid());
    ferry_engine_h e = engine_on(svc->uri, e_name);
    ferry_engine_h o = engine_on(svc->uri, "observer");
    unsigned char *mine;
    cr_assert_eq(posix_memalign((void **)&mine, 4096, 2 * MIB), 0);
    cr_assert_eq(ferry_register(e, mine, MIB, "cpu", 0), FERRY_OK);
    ferry_segment_h to_p;
    cr_assert_eq(ferry_segment_open(e, p_name, &to_p), FERRY_OK);
    cr_assert_eq(write_to(e, to_p, &p, 0, MIB, 1), FERRY_OK);

    service_stop(svc, SIGKILL);

    double start = now();
    ferry_status_t status = ferry_segment_open(o, "never-published", &(ferry_segment_h){0});
    double took = now() - start;
    cr_assert(is_metadata_error(status) && status != FERRY_ERR_SEGMENT_NOT_FOUND,
              "store down: open gave %s", ferry_status_string(status));
    cr_assert_lt(took, 3.0, "a failed open took %.2f s (bound: FERRY_*_TIMEOUT=1 s)", took);
    cr_assert_eq(write_to(e, to_p, &p, 0, MIB, 2), FERRY_OK, "data moves without the store");
    start = now();
    cr_assert_eq(ferry_register(e, mine + MIB, MIB, "cpu", 0), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&p, "reg %zu %zu", MIB, MIB), "OK");
    cr_assert_lt(now() - start, 5.0, "registration waited for the store");
    /* Registered all the same, but ferry_publish tells the truth. */
    status = ferry_publish(e);
    cr_assert(is_metadata_error(status), "store down: ferry_publish gave %s",
              ferry_status_string(status));

    cr_assert_eq(service_restart(svc, keep_data), 0);
    start = now();
    while ((status = ferry_publish(e)) != FERRY_OK && now() - start < 10.0)
        usleep(100000);
    cr_assert_eq(status, FERRY_OK, "store back: ferry_publish gave %s",
                 ferry_status_string(status));

    /* Republished with what changed while the store was down... */
    cr_assert(wait_published(o, p_name, p.arena + MIB, 10.0), "P's newest descriptor");
    cr_assert(wait_published(o, e_name, (uintptr_t)(mine + MIB), 10.0), "E's newest");
    /* ...and what did not change is not lost either. */
    cr_assert(wait_published(o, q_name, q.arena, 10.0), "Q's segment");
    /* The open handle reaches the new range: it refreshes on the miss. */
    cr_assert_eq(write_to(e, to_p, &p, MIB, MIB, 3), FERRY_OK);

    ferry_segment_close(e, to_p);
    peer_stop(&p);
    peer_stop(&q);
    ferry_engine_destroy(o);
    ferry_engine_destroy(e);
    free(mine);
}

Test(metadata, etcd_restart_loses_nothing)
{
    require(SERVICE_ETCD);
    service_t etcd;
    cr_assert_eq(service_start(&etcd, SERVICE_ETCD, NULL), 0);
    survive_restart(&etcd, 1);
    service_cleanup(&etcd);
}

Test(metadata, redis_restart_without_persistence_loses_nothing)
{
    require(SERVICE_REDIS);
    service_t redis;
    cr_assert_eq(service_start(&redis, SERVICE_REDIS, NULL), 0);
    survive_restart(&redis, 0);
    service_cleanup(&redis);
}

Test(metadata, ferry_metad_restart_without_persistence_loses_nothing)
{
    require(SERVICE_METAD);
    service_t metad;
    cr_assert_eq(service_start(&metad, SERVICE_METAD, NULL), 0);
    survive_restart(&metad, 0);
    service_cleanup(&metad);
}

/* ---------------- liveness: a killed process's segment goes ---------------- */

static void killed_owner_vanishes(const char *uri, const char *ttl_setting, double ttl_s,
                                  int watched)
{
    peer_process_t peer;
    char name[64];
    snprintf(name, sizeof(name), "doomed-%d", (int)getpid());
    start_peer(&peer, uri, name, ttl_setting);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    ferry_engine_h holder = engine_on(uri, "holder");
    ferry_engine_h observer = engine_on(uri, "observer");
    ferry_segment_h held;
    cr_assert_eq(ferry_segment_open(holder, name, &held), FERRY_OK);
    /* Kept alive: still there after more than one TTL. */
    usleep((useconds_t)(ttl_s * 1.5e6));
    cr_assert_eq(open_once(observer, name, NULL, 0), FERRY_OK);

    peer_kill(&peer, SIGKILL);
    double gone = wait_gone(observer, name, ttl_s + 5.0);
    cr_assert(gone >= 0, "the killed process's segment is still there");
    cr_assert_lt(gone, ttl_s + 3.0, "it took %.2f s (TTL %.1f s)", gone, ttl_s);
    if (watched) {
        /* The watch saw the lease's keys go: the cached copy is stale. */
        char *json = NULL;
        ferry_status_t status = FERRY_OK;
        for (double end = now() + 2.0; status == FERRY_OK && now() < end; usleep(20000)) {
            status = ferry_segment_describe(holder, held, &json);
            free(json);
            json = NULL;
        }
        cr_assert_eq(status, FERRY_ERR_SEGMENT_NOT_FOUND);
    }
    ferry_segment_close(holder, held);
    ferry_engine_destroy(observer);
    ferry_engine_destroy(holder);
}

Test(metadata, etcd_killed_process_vanishes_after_lease_ttl)
{
    require(SERVICE_ETCD);
    service_t etcd;
    cr_assert_eq(service_start(&etcd, SERVICE_ETCD, NULL), 0);
    killed_owner_vanishes(etcd.uri, "FERRY_ETCD_TTL=2s", 2.0, 1);
    service_cleanup(&etcd);
}

Test(metadata, redis_killed_process_vanishes_after_ttl)
{
    require(SERVICE_REDIS);
    service_t redis;
    cr_assert_eq(service_start(&redis, SERVICE_REDIS, NULL), 0);
    killed_owner_vanishes(redis.uri, "FERRY_REDIS_TTL=1500ms", 1.5, 0);
    service_cleanup(&redis);
}

/* The engine renews its key's expiry (every third of the TTL): over three
 * TTLs and a half, looked at every 50 ms, the key's remaining time keeps
 * going back up, and the key is there at every look.  An expiry only
 * looked at, not renewed, lets the key lapse each TTL until the engine
 * puts it again (three lapses here), and its remaining time runs down.
 * One lapse is forgiven when the key is back within a renewal period and
 * a retry: a host that stalls longer than the TTL's slack (2 s TTL, a
 * renewal every 667 ms: 1.3 s; a loaded CI machine once did) loses the
 * key through no fault of the engine, which must then put it back. */
Test(metadata, redis_expiry_is_renewed_not_lost)
{
    require(SERVICE_REDIS);
    service_t redis;
    cr_assert_eq(service_start(&redis, SERVICE_REDIS, NULL), 0);
    setenv("FERRY_REDIS_TTL", "2s", 1);
    ferry_engine_h engine = engine_on(redis.uri, "renewed");
    const char *pttl[] = {"PTTL", "ferry/segments/renewed"};
    char out[64];
    int looks = 0, lapses = 0, renewals = 0;
    long last_left = -2;
    double lapsed_at = 0, last_seen = now();
    for (double end = now() + 7.0; now() < end; usleep(50000), looks++) {
        cr_assert_eq(redis_call(redis.port, 2, pttl, NULL, out, sizeof(out), NULL), ':');
        long left = atol(out);
        double at = now();
        cr_assert_neq(left, -1, "the key has no expiry");
        if (left == -2) {
            if (lapsed_at == 0) {
                lapses++;
                lapsed_at = at;
                cr_log_warn("the key lapsed after %d looks, %.0f ms after it was last seen",
                            looks, (at - last_seen) * 1000);
            }
            cr_assert_leq(lapses, 1, "the key lapsed a second time, after %d looks", looks);
            cr_assert_lt(at - lapsed_at, 1.5, "the key is not put back after a lapse");
            continue;
        }
        lapsed_at = 0;
        last_seen = at;
        if (last_left >= 0 && left > last_left)
            renewals++;
        last_left = left;
    }
    /* 10 renewals in 7 s; half of them, however the host stalls */
    cr_assert_geq(renewals, 5, "the key's expiry was renewed %d times in 7 s", renewals);
    ferry_engine_destroy(engine);
    service_cleanup(&redis);
}

/* etcd restarted without its data: the lease is regranted (the segment is
 * back, on a live lease: it still goes away when its owner is killed). */
Test(metadata, etcd_data_loss_regrants_the_lease)
{
    require(SERVICE_ETCD);
    service_t etcd;
    cr_assert_eq(service_start(&etcd, SERVICE_ETCD, NULL), 0);
    peer_process_t peer;
    start_peer(&peer, etcd.uri, "phoenix", "FERRY_ETCD_TTL=2s");
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    ferry_engine_h engine = engine_on(etcd.uri, "watcher");
    cr_assert_eq(open_once(engine, "phoenix", NULL, 0), FERRY_OK);

    cr_assert_eq(service_restart(&etcd, 0), 0);
    cr_assert(wait_published(engine, "phoenix", peer.arena, 10.0), "not republished");
    peer_kill(&peer, SIGKILL);
    double gone = wait_gone(engine, "phoenix", 7.0);
    cr_assert(gone >= 0 && gone < 5.0, "no live lease behind the republished key (%.2f s)",
              gone);
    ferry_engine_destroy(engine);
    service_cleanup(&etcd);
}

/* The watch: a cached descriptor follows its owner's republish, with no
 * refresh and no transfer asking for it; and a deleted segment is seen. */
Test(metadata, etcd_watch_invalidates_cached_descriptors)
{
    require(SERVICE_ETCD);
    service_t etcd;
    cr_assert_eq(service_start(&etcd, SERVICE_ETCD, NULL), 0);
    peer_process_t peer;
    start_peer(&peer, etcd.uri, "watched", NULL);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    ferry_engine_h engine = engine_on(etcd.uri, "watcher");
    ferry_segment_h held;
    cr_assert_eq(ferry_segment_open(engine, "watched", &held), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu", MIB, MIB), "OK");

    char want[64];
    snprintf(want, sizeof(want), "\"0x%" PRIxPTR "\"", peer.arena + MIB);
    /* 20 s: on a loaded 2-core CI host the watch event has taken over 5 s. */
    int seen = 0;
    for (double end = now() + 20.0; !seen && now() < end; usleep(20000)) {
        char *json = NULL;
        cr_assert_eq(ferry_segment_describe(engine, held, &json), FERRY_OK);
        seen = strstr(json, want) != NULL;
        free(json);
    }
    cr_assert(seen, "the cached descriptor never showed the new buffer");

    peer_stop(&peer); /* deletes its key */
    ferry_status_t status = FERRY_OK;
    for (double end = now() + 20.0; status == FERRY_OK && now() < end; usleep(20000)) {
        char *json = NULL;
        status = ferry_segment_describe(engine, held, &json);
        free(json);
    }
    cr_assert_eq(status, FERRY_ERR_SEGMENT_NOT_FOUND, "the deletion was not seen");
    ferry_segment_close(engine, held);
    ferry_engine_destroy(engine);
    service_cleanup(&etcd);
}

/* ---------------- etcd authentication ---------------- */

static int etcd_post_reply(int port, const char *path, const char *json, char *out, size_t size)
{
    return http_call(port, "POST", path, "Content-Type: application/json\r\n", json, strlen(json),
                     out, size, NULL);
}

static int etcd_post(int port, const char *path, const char *json)
{
    char out[4096];
    return etcd_post_reply(port, path, json, out, sizeof(out));
}

/* The decimal string value of field in etcd's JSON reply (0 if absent). */
static long long etcd_field(const char *json, const char *field)
{
    char quoted[64];
    snprintf(quoted, sizeof(quoted), "\"%s\":\"", field);
    const char *at = strstr(json, quoted);
    return at ? strtoll(at + strlen(quoted), NULL, 10) : 0;
}

/*
 * The engine keeps its lease alive: over three TTLs its key stays on the
 * same lease and is never put again (same mod_revision), and the lease
 * has time left.  A lease that were only looked at would expire each TTL
 * and be granted anew with the key republished, which a reader hardly
 * notices (the segment is back within a period).
 */
Test(metadata, etcd_lease_is_kept_alive_not_regranted)
{
    require(SERVICE_ETCD);
    service_t etcd;
    cr_assert_eq(service_start(&etcd, SERVICE_ETCD, NULL), 0);
    setenv("FERRY_ETCD_TTL", "2s", 1);
    ferry_engine_h engine = engine_on(etcd.uri, "kept");
    char key64[128], range[256], reply[8192];
    base64_encode("ferry/segments/kept", strlen("ferry/segments/kept"), key64);
    snprintf(range, sizeof(range), "{\"key\":\"%s\"}", key64);
    cr_assert_eq(etcd_post_reply(etcd.port, "/v3/kv/range", range, reply, sizeof(reply)), 200);
    long long lease = etcd_field(reply, "lease"), revision = etcd_field(reply, "mod_revision");
    cr_assert(lease != 0 && revision != 0, "the key has no lease: %s", reply);

    sleep(7); /* three TTLs and a half */
    cr_assert_eq(etcd_post_reply(etcd.port, "/v3/kv/range", range, reply, sizeof(reply)), 200);
    cr_assert_eq(etcd_field(reply, "lease"), lease, "the lease was granted again: %s", reply);
    cr_assert_eq(etcd_field(reply, "mod_revision"), revision, "the key was put again: %s", reply);
    char id[64];
    snprintf(id, sizeof(id), "{\"ID\":\"%lld\"}", lease);
    cr_assert_eq(etcd_post_reply(etcd.port, "/v3/lease/timetolive", id, reply, sizeof(reply)), 200);
    cr_assert_gt(etcd_field(reply, "TTL"), 0, "the lease has no time left: %s", reply);
    ferry_engine_destroy(engine);
    service_cleanup(&etcd);
}

Test(metadata, etcd_user_and_password)
{
    require(SERVICE_ETCD);
    service_t etcd;
    cr_assert_eq(service_start(&etcd, SERVICE_ETCD, NULL), 0);
    cr_assert_eq(etcd_post(etcd.port, "/v3/auth/user/add",
                           "{\"name\":\"root\",\"password\":\"s3cret\"}"), 200);
    cr_assert_eq(etcd_post(etcd.port, "/v3/auth/role/add", "{\"name\":\"root\"}"), 200);
    cr_assert_eq(etcd_post(etcd.port, "/v3/auth/user/grant",
                           "{\"user\":\"root\",\"role\":\"root\"}"), 200);
    cr_assert_eq(etcd_post(etcd.port, "/v3/auth/enable", "{}"), 200);

    setenv("FERRY_ETCD_USER", "root", 1);
    setenv("FERRY_ETCD_PASSWORD", "s3cret", 1);
    /* etcd checks a password with bcrypt, which took over 2 s on a loaded
     * 2-core host (test runs in parallel): this test is about credentials,
     * not the bound. */
    setenv("FERRY_ETCD_TIMEOUT", "15000ms", 1);
    ferry_engine_h owner = engine_on(etcd.uri, "guarded");
    unsigned char *buffer = NULL;
    cr_assert_eq(posix_memalign((void **)&buffer, 4096, MIB), 0);
    cr_assert_eq(ferry_register(owner, buffer, MIB, "cpu", 0), FERRY_OK);
    ferry_engine_h reader = engine_on(etcd.uri, "reader");
    cr_assert_eq(open_once(reader, "guarded", NULL, 0), FERRY_OK);

    /* A restart voids etcd's tokens: the store authenticates again. */
    cr_assert_eq(service_restart(&etcd, 1), 0);
    cr_assert(wait_published(reader, "guarded", (uintptr_t)buffer, 10.0));

    unsetenv("FERRY_ETCD_USER");
    unsetenv("FERRY_ETCD_PASSWORD");
    ferry_engine_h stranger = engine_on(etcd.uri, "stranger");
    ferry_status_t status = open_once(stranger, "guarded", NULL, 0);
    cr_assert(is_metadata_error(status) && status != FERRY_ERR_SEGMENT_NOT_FOUND,
              "no credentials: %s", ferry_status_string(status));
    ferry_engine_destroy(stranger);
    ferry_engine_destroy(reader);
    ferry_engine_destroy(owner);
    unsetenv("FERRY_ETCD_TIMEOUT");
    free(buffer);
    service_cleanup(&etcd);
}

/* ---------------- etcd over TLS ---------------- */

Test(metadata, etcd_over_tls)
{
    require(SERVICE_ETCD);
    if (system("command -v openssl >/dev/null 2>&1") != 0)
        cr_skip_test("openssl is not installed (needed to make test certificates)");
    char dir[] = "/tmp/ferry-md-tls-XXXXXX", command[2048];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(command, sizeof(command),
             "cd %s && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt "
             "-days 1 -subj /CN=ferry-test-ca && openssl req -newkey rsa:2048 -nodes "
             "-keyout server.key -out server.csr -subj /CN=127.0.0.1 && "
             "printf 'subjectAltName=IP:127.0.0.1\\n' > san.cnf && openssl x509 -req -in "
             "server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 1 "
             "-extfile san.cnf",
             dir);
    cr_assert_eq(system(command), 0, "openssl failed");
    char cert[300], key[300], ca[300];
    snprintf(cert, sizeof(cert), "--cert-file=%s/server.crt", dir);
    snprintf(key, sizeof(key), "--key-file=%s/server.key", dir);
    snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
    const char *extra[] = {cert, key, NULL};
    service_t etcd;
    cr_assert_eq(service_start(&etcd, SERVICE_ETCD, extra), 0);

    setenv("FERRY_ETCD_CA", ca, 1);
    ferry_engine_h owner = engine_on(etcd.uri, "private");
    ferry_engine_h reader = engine_on(etcd.uri, "reader");
    cr_assert_eq(open_once(reader, "private", NULL, 0), FERRY_OK);
    ferry_engine_destroy(reader);
    ferry_engine_destroy(owner);
    /* Without the CA the server's certificate is not trusted. */
    unsetenv("FERRY_ETCD_CA");
    setenv("FERRY_ETCD_TLS", "y", 1);
    ferry_engine_h stranger = engine_on(etcd.uri, "stranger");
    cr_assert(is_metadata_error(open_once(stranger, "private", NULL, 0)));
    ferry_engine_destroy(stranger);
    unsetenv("FERRY_ETCD_TLS");
    service_cleanup(&etcd);
    snprintf(command, sizeof(command), "rm -rf %s", dir);
    cr_assert_eq(system(command), 0);
}

/* ---------------- garbage in the store, and the key layout ---------------- */

static void expect_decode_error(const char *uri, const char *name)
{
    ferry_engine_h engine = engine_on(uri, "reader");
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, name, &segment), FERRY_ERR_DECODE, "%s", name);
    ferry_engine_destroy(engine);
}

static const char *const garbage[] = {
    "not json at all",
    "{\"version\":1,\"name\":\"x\"}",
    "[1,2,3",
    "\xff\xfe\x01garbage",
};

Test(metadata, etcd_garbage_is_a_decode_error)
{
    require(SERVICE_ETCD);
    service_t etcd;
    cr_assert_eq(service_start(&etcd, SERVICE_ETCD, NULL), 0);
    for (size_t i = 0; i < sizeof(garbage) / sizeof(garbage[0]); i++) {
        char key[128], key64[256], value64[256], json[700], name[32];
        snprintf(name, sizeof(name), "junk-%zu", i);
        snprintf(key, sizeof(key), "ferry/segments/%s", name);
        base64_encode(key, strlen(key), key64);
        base64_encode(garbage[i], strlen(garbage[i]), value64);
        snprintf(json, sizeof(json), "{\"key\":\"%s\",\"value\":\"%s\"}", key64, value64);
        cr_assert_eq(etcd_post(etcd.port, "/v3/kv/put", json), 200);
        expect_decode_error(etcd.uri, name);
    }
    /* An empty value (left out of etcd's reply) too. */
    char key64[128], json[256];
    base64_encode("ferry/segments/empty", 20, key64);
    snprintf(json, sizeof(json), "{\"key\":\"%s\"}", key64);
    cr_assert_eq(etcd_post(etcd.port, "/v3/kv/put", json), 200);
    expect_decode_error(etcd.uri, "empty");
    service_cleanup(&etcd);
}

Test(metadata, redis_garbage_is_a_decode_error_and_keys_follow_the_layout)
{
    require(SERVICE_REDIS);
    service_t redis;
    cr_assert_eq(service_start(&redis, SERVICE_REDIS, NULL), 0);
    for (size_t i = 0; i < sizeof(garbage) / sizeof(garbage[0]); i++) {
        char key[128], name[32], out[64];
        snprintf(name, sizeof(name), "junk-%zu", i);
        snprintf(key, sizeof(key), "ferry/segments/%s", name);
        const char *set[] = {"SET", key, garbage[i]};
        cr_assert_eq(redis_call(redis.port, 3, set, NULL, out, sizeof(out), NULL), '+');
        expect_decode_error(redis.uri, name);
    }
    /* A value that is no string (a list) is refused, not crashed on. */
    const char *push[] = {"RPUSH", "ferry/segments/listy", "a"};
    cr_assert_eq(redis_call(redis.port, 3, push, NULL, NULL, 0, NULL), ':');
    ferry_engine_h reader = engine_on(redis.uri, "reader");
    ferry_segment_h segment;
    ferry_status_t status = ferry_segment_open(reader, "listy", &segment);
    cr_assert(status == FERRY_ERR_DECODE || is_metadata_error(status));

    /* Layout: prefix, cluster id, escaped name. */
    setenv("FERRY_METADATA_CLUSTER", "blue team", 1);
    ferry_engine_h owner = engine_on(redis.uri, "odd name/with%chars");
    char value[1 << 14];
    long length;
    const char *get[] = {"GET", "ferry/segments/blue%20team/odd%20name%2Fwith%25chars"};
    cr_assert_eq(redis_call(redis.port, 2, get, NULL, value, sizeof(value), &length), '$');
    cr_assert_gt(length, 0, "no key at the documented place");
    /* redis holds the compact form (FERRY_DESCRIPTOR_FORMAT=auto) */
    cr_assert(strncmp(value, "ferry:desc:1\nname 13:odd name/with%chars\n", 41) == 0, "%s",
              value);
    /* Another cluster does not see it; the same one does. */
    cr_assert_eq(open_once(reader, "odd name/with%chars", NULL, 0),
                 FERRY_ERR_SEGMENT_NOT_FOUND);
    ferry_engine_h same = engine_on(redis.uri, "same-cluster");
    cr_assert_eq(open_once(same, "odd name/with%chars", NULL, 0), FERRY_OK);
    unsetenv("FERRY_METADATA_CLUSTER");
    ferry_engine_destroy(same);
    ferry_engine_destroy(owner);
    ferry_engine_destroy(reader);
    service_cleanup(&redis);
}

Test(metadata, redis_password_and_database)
{
    require(SERVICE_REDIS);
    const char *extra[] = {"--requirepass", "pa:ss@word", NULL};
    service_t redis;
    cr_assert_eq(service_start(&redis, SERVICE_REDIS, extra), 0);
    char uri[256];
    /* ':' and '@' in the password are percent-encoded in the URI. */
    snprintf(uri, sizeof(uri), "redis://default:pa%%3Ass%%40word@127.0.0.1:%d/3", redis.port);
    find_each_other(uri);

    ferry_engine_h owner = engine_on(uri, "in-db-3");
    char out[64];
    const char *auth[] = {"AUTH", "pa:ss@word"};
    cr_assert_eq(redis_call(redis.port, 2, auth, NULL, out, sizeof(out), NULL), '+');
    snprintf(uri, sizeof(uri), "redis://:wrong@127.0.0.1:%d/3", redis.port);
    ferry_engine_h stranger = engine_on(uri, "stranger");
    ferry_status_t status = open_once(stranger, "in-db-3", NULL, 0);
    cr_assert(is_metadata_error(status) && status != FERRY_ERR_SEGMENT_NOT_FOUND,
              "wrong password: %s", ferry_status_string(status));
    ferry_engine_destroy(stranger);
    snprintf(uri, sizeof(uri), "redis://:pa%%3Ass%%40word@127.0.0.1:%d/0", redis.port);
    ferry_engine_h other_db = engine_on(uri, "db-0");
    cr_assert_eq(open_once(other_db, "in-db-3", NULL, 0), FERRY_ERR_SEGMENT_NOT_FOUND);
    ferry_engine_destroy(other_db);
    ferry_engine_destroy(owner);
    service_cleanup(&redis);
}

Test(metadata, http_garbage_is_a_decode_error_and_keys_follow_the_layout)
{
    require(SERVICE_METAD);
    service_t metad;
    cr_assert_eq(service_start(&metad, SERVICE_METAD, NULL), 0);
    for (size_t i = 0; i < sizeof(garbage) / sizeof(garbage[0]); i++) {
        char target[128], name[32];
        snprintf(name, sizeof(name), "junk-%zu", i);
        snprintf(target, sizeof(target), "/metadata?key=ferry%%2Fsegments%%2F%s", name);
        cr_assert_eq(http_call(metad.port, "PUT", target, NULL, garbage[i], strlen(garbage[i]),
                               NULL, 0, NULL), 200);
        expect_decode_error(metad.uri, name);
    }
    ferry_engine_h owner = engine_on(metad.uri, "odd name/with%chars");
    static char value[1 << 14];
    /* key ferry/segments/odd%20name%2Fwith%25chars, URL-encoded in the query */
    cr_assert_eq(http_call(metad.port, "GET",
                           "/metadata?key=ferry%2Fsegments%2Fodd%2520name%252Fwith%2525chars",
                           NULL, NULL, 0, value, sizeof(value), NULL), 200);
    /* http keeps JSON (FERRY_DESCRIPTOR_FORMAT=auto): Mooncake's server shows it */
    cr_assert(strstr(value, "\"name\":\"odd name/with%chars\"") != NULL, "%s", value);
    ferry_engine_destroy(owner);
    service_cleanup(&metad);
}

/* ---------------- ferry_metad itself ---------------- */

Test(metadata, ferry_metad_protocol)
{
    require(SERVICE_METAD);
    service_t metad;
    cr_assert_eq(service_start(&metad, SERVICE_METAD, NULL), 0);
    char out[4096];
    size_t length;
    int port = metad.port;
    cr_assert_eq(http_call(port, "GET", "/health", NULL, NULL, 0, out, sizeof(out), NULL), 200);
    cr_assert(strstr(out, "\"status\":\"ok\"") != NULL, "%s", out);
    cr_assert_eq(http_call(port, "GET", "/metadata?key=a", NULL, NULL, 0, out, sizeof(out),
                           NULL), 404);
    cr_assert_eq(http_call(port, "PUT", "/metadata?key=a", NULL, "{\"x\":1}", 7, out,
                           sizeof(out), NULL), 200);
    cr_assert_eq(http_call(port, "GET", "/metadata?key=a", NULL, NULL, 0, out, sizeof(out),
                           &length), 200);
    cr_assert_eq(length, 7);
    cr_assert_str_eq(out, "{\"x\":1}");
    /* Values are bytes, NULs included; POST stores too. */
    const char binary[] = {'b', 0, 'i', '\n', (char)0xff};
    cr_assert_eq(http_call(port, "POST", "/metadata?key=b%2Fc", NULL, binary, sizeof(binary),
                           NULL, 0, NULL), 200);
    cr_assert_eq(http_call(port, "GET", "/metadata?key=b%2Fc", NULL, NULL, 0, out, sizeof(out),
                           &length), 200);
    cr_assert_eq(length, sizeof(binary));
    cr_assert_eq(memcmp(out, binary, sizeof(binary)), 0);
    cr_assert_eq(http_call(port, "HEAD", "/metadata?key=b%2Fc", NULL, NULL, 0, NULL, 0, NULL),
                 200);
    cr_assert_eq(http_call(port, "HEAD", "/metadata?key=nope", NULL, NULL, 0, NULL, 0, NULL),
                 404);
    cr_assert_eq(http_call(port, "DELETE", "/metadata?key=a", NULL, NULL, 0, NULL, 0, NULL),
                 200);
    cr_assert_eq(http_call(port, "DELETE", "/metadata?key=a", NULL, NULL, 0, NULL, 0, NULL),
                 404);
    cr_assert_eq(http_call(port, "GET", "/metadata?key=a", NULL, NULL, 0, NULL, 0, NULL), 404);
    cr_assert_eq(http_call(port, "GET", "/metadata", NULL, NULL, 0, NULL, 0, NULL), 400);
    cr_assert_eq(http_call(port, "GET", "/elsewhere", NULL, NULL, 0, NULL, 0, NULL), 404);
    cr_assert_eq(http_call(port, "PATCH", "/metadata?key=a", NULL, NULL, 0, NULL, 0, NULL),
                 405);
    cr_assert_eq(http_call(port, "GET", "/health", NULL, NULL, 0, out, sizeof(out), NULL), 200);
    cr_assert(strstr(out, "\"keys\":1") != NULL, "%s", out);
    /* SIGTERM: a clean exit. */
    cr_assert_eq(service_stop(&metad, SIGTERM), 0);
    service_cleanup(&metad);
}

Test(metadata, ferry_metad_bounds_the_body)
{
    require(SERVICE_METAD);
    const char *extra[] = {"--max-body=1k", NULL};
    service_t metad;
    cr_assert_eq(service_start(&metad, SERVICE_METAD, extra), 0);
    static char big[4096];
    memset(big, 'x', sizeof(big));
    cr_assert_eq(http_call(metad.port, "PUT", "/metadata?key=k", NULL, big, 1024, NULL, 0,
                           NULL), 200);
    cr_assert_eq(http_call(metad.port, "PUT", "/metadata?key=k", NULL, big, 1025, NULL, 0,
                           NULL), 413);
    /* Chunked, with no length announced: refused once it passes the bound. */
    static char chunked[8192];
    int n = snprintf(chunked, sizeof(chunked), "%x\r\n", 3000);
    memset(chunked + n, 'y', 3000);
    n += 3000;
    n += snprintf(chunked + n, sizeof(chunked) - (size_t)n, "\r\n0\r\n\r\n");
    cr_assert_eq(http_call(metad.port, "PUT", "/metadata?key=k",
                           "Transfer-Encoding: chunked\r\n", chunked, (size_t)n, NULL, 0, NULL),
                 413);
    /* The accepted value is intact and the server still serves. */
    size_t length;
    static char out[4096];
    cr_assert_eq(http_call(metad.port, "GET", "/metadata?key=k", NULL, NULL, 0, out,
                           sizeof(out), &length), 200);
    cr_assert_eq(length, 1024);
    service_cleanup(&metad);
}

Test(metadata, ferry_metad_persists_across_restart)
{
    require(SERVICE_METAD);
    char path[240];
    service_t metad;
    /* The file goes in the service's own directory: start once to get it. */
    cr_assert_eq(service_start(&metad, SERVICE_METAD, NULL), 0);
    snprintf(path, sizeof(path), "--persist=%.200s/metad.db", metad.dir);
    snprintf(metad.extra[0], sizeof(metad.extra[0]), "%s", path);
    metad.n_extra = 1;
    cr_assert_eq(service_restart(&metad, 1), 0);

    const char binary[] = {'v', 0, '\n', '7'};
    int port = metad.port;
    cr_assert_eq(http_call(port, "PUT", "/metadata?key=kept", NULL, binary, sizeof(binary),
                           NULL, 0, NULL), 200);
    cr_assert_eq(http_call(port, "PUT", "/metadata?key=gone", NULL, "x", 1, NULL, 0, NULL),
                 200);
    cr_assert_eq(http_call(port, "DELETE", "/metadata?key=gone", NULL, NULL, 0, NULL, 0, NULL),
                 200);
    /* SIGKILL: only what was acknowledged, all of it. */
    cr_assert_eq(service_restart(&metad, 1), 0);
    char out[64];
    size_t length;
    cr_assert_eq(http_call(metad.port, "GET", "/metadata?key=kept", NULL, NULL, 0, out,
                           sizeof(out), &length), 200);
    cr_assert_eq(length, sizeof(binary));
    cr_assert_eq(memcmp(out, binary, sizeof(binary)), 0);
    cr_assert_eq(http_call(metad.port, "GET", "/metadata?key=gone", NULL, NULL, 0, NULL, 0,
                           NULL), 404);
    /* A segment published through it survives a restart too. */
    ferry_engine_h owner = engine_on(metad.uri, "durable");
    cr_assert_eq(service_stop(&metad, SIGTERM), 0);
    cr_assert_eq(service_restart(&metad, 1), 0);
    ferry_engine_h reader = engine_on(metad.uri, "reader");
    cr_assert_eq(open_once(reader, "durable", NULL, 0), FERRY_OK);
    ferry_engine_destroy(reader);
    ferry_engine_destroy(owner);
    service_stop(&metad, SIGTERM);

    /* No temporary file is left behind; a damaged file stops the server. */
    char command[700];
    snprintf(command, sizeof(command), "ls %s | grep -q tmp", metad.dir);
    cr_assert_neq(system(command), 0, "a temporary file was left in %s", metad.dir);
    snprintf(command, sizeof(command), "printf 'ferry_metad 1\\n5\\n3 1\\nabc' > %s/metad.db",
             metad.dir);
    cr_assert_eq(system(command), 0);
    cr_assert_neq(service_restart(&metad, 1), 0, "started on a damaged file");
    service_cleanup(&metad);
}
