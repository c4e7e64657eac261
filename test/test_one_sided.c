/*
 * One-sided transports (the initiator copies, the target checks nothing):
 * the unregister rule and the trust rule.
 *  - When the owner's ferry_unregister returns, no copy into the range is
 *    in flight and none can start: writers racing an unregister never
 *    touch the range afterwards, with p2p metadata and with a shared store
 *    (whose peers must become the owner's subscribers by themselves).
 *  - A descriptor forged in a shared store does not steer one-sided
 *    copies: its owner does not confirm it.
 */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/rpc/rpc.h"
#include "one_request.h"
#include "peer_process.h"
#include "service_process.h"
#include "test_clock.h"
#include "test_pattern.h"
#include "unregister_race.h"

#define MIB ((size_t)1 << 20)

static void teardown(void)
{
    service_cleanup_all();
}

TestSuite(one_sided, .fini = teardown, .timeout = 180);

/* ---- writers racing an unregister ---- */

/* The peer's first MiBs, written via that one-sided transport while the
 * peer unregisters them (unregister_race.c). */
static void unregister_under_writers_via(const char *transports, const char *via)
{
    setenv("FERRY_TRANSPORTS", transports, 1); /* the peer inherits it */
    ferry_engine_h engine;
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    peer_process_t peer;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", UNREGISTER_RACE_RANGE), "OK");
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    unregister_under_writers(engine, segment, &peer, peer.arena, via);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    ferry_engine_destroy(engine);
}

Test(one_sided, no_write_lands_after_unregister_with_p2p_metadata)
{
    unsetenv("FERRY_METADATA");
    unregister_under_writers_via("shm,tcp", "shm");
}

/* With a shared store nobody fetches from the owner: the writers must
 * make themselves known to it before their first copy. */
Test(one_sided, no_write_lands_after_unregister_with_a_shared_store)
{
    const char *missing = service_missing(SERVICE_METAD);
    if (missing != NULL)
        cr_skip_test("%s", missing);
    service_t metad;
    cr_assert_eq(service_start(&metad, SERVICE_METAD, NULL), 0);
    setenv("FERRY_METADATA", metad.uri, 1);
    unregister_under_writers_via("shm,tcp", "shm");
    service_cleanup(&metad);
}

static void use_ucx_shm(void);

Test(one_sided, no_ucx_write_lands_after_unregister)
{
    use_ucx_shm();
    unsetenv("FERRY_METADATA");
    unregister_under_writers_via("ucx,tcp", "ucx");
}

/* ---- descriptors forged in a shared store ---- */

/* The store's descriptor of the honest peer, its first buffer's length and
 * access replaced, published under name. */
static void publish_forged(const service_t *metad, const char *name, size_t honest_length,
                           const char *honest_access)
{
    static char json[1 << 17], forged[1 << 17];
    size_t length;
    cr_assert_eq(http_call(metad->port, "GET", "/metadata?key=ferry%2Fsegments%2Fhonest", NULL,
                           NULL, 0, json, sizeof(json), &length),
                 200);
    char find[64], with[64];
    snprintf(find, sizeof(find), "\"length\":\"%zu\",", honest_length);
    snprintf(with, sizeof(with), "\"length\":\"%zu\",", (size_t)1 << 30);
    char *at = strstr(json, find);
    cr_assert_not_null(at, "no %s in %s", find, json);
    int n = snprintf(forged, sizeof(forged), "%.*s%s%s", (int)(at - json), json, with,
                     at + strlen(find));
    cr_assert(n > 0 && (size_t)n < sizeof(forged));
    snprintf(find, sizeof(find), "\"access\":\"%s\"", honest_access);
    at = strstr(forged, find);
    cr_assert_not_null(at, "no %s in %s", find, forged);
    snprintf(json, sizeof(json), "%.*s\"access\":\"rw\"%s", (int)(at - forged), forged,
             at + strlen(find));
    if (strcmp(name, "honest") != 0) {
        at = strstr(json, "\"name\":\"honest\"");
        cr_assert_not_null(at);
        snprintf(forged, sizeof(forged), "%.*s\"name\":\"%s\"%s", (int)(at - json), json, name,
                 at + strlen("\"name\":\"honest\""));
        snprintf(json, sizeof(json), "%s", forged);
    }
    char target[128];
    snprintf(target, sizeof(target), "/metadata?key=ferry%%2Fsegments%%2F%s", name);
    cr_assert_eq(http_call(metad->port, "PUT", target, NULL, json, strlen(json), NULL, 0, NULL),
                 200);
}

/* Through transport (one-sided) the forged buffer is not reached at all;
 * through the engine's choice the target's own check refuses it. */
static void forged_is_refused(ferry_engine_h engine, peer_process_t *peer, const char *name,
                              const char *transport)
{
    ferry_segment_h segment;
    unsigned char local[4096];
    test_pattern_fill(local, sizeof(local), 5);
    char before[64];
    snprintf(before, sizeof(before), "%s", peer_cmd(peer, "sum 0 %zu", 4 * MIB));
    cr_assert_eq(ferry_segment_open(engine, name, &segment), FERRY_OK);
    const struct {
        uint64_t offset;
        const char *what;
    } targets[] = {{2 * MIB, "past the registration"}, {64, "into the read-only buffer"}};
    for (size_t i = 0; i < 2; i++)
        for (int named = 0; named < 2; named++)
            cr_assert_neq(one_request_via(engine, FERRY_OP_WRITE, local, segment,
                                          peer->arena + targets[i].offset, sizeof(local),
                                          named ? transport : NULL, NULL),
                          FERRY_OK, "%s: a write %s via %s", name, targets[i].what,
                          named ? transport : "the engine's choice");
    cr_assert_str_eq(peer_cmd(peer, "sum 0 %zu", 4 * MIB), before, "%s: memory changed", name);
    ferry_segment_close(engine, segment);
}

static void forged_store_entries(const char *transports, const char *one_sided,
                                 const char *const *peer_env)
{
    service_t metad;
    service_start_forgery_store(&metad);
    setenv("FERRY_TRANSPORTS", transports, 1);
    ferry_engine_h engine;
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    peer_process_t peer;
    cr_assert_eq(peer_start(&peer, peer_env), 0);
    cr_assert_str_eq(peer_cmd(&peer, "fill 0 %zu 4", 4 * MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu r", MIB), "OK");

    /* Honest: reads over the one-sided transport work. */
    ferry_segment_h segment;
    unsigned char local[4096];
    cr_assert_eq(ferry_segment_open(engine, "honest", &segment), FERRY_OK);
    cr_assert_eq(one_request_via(engine, FERRY_OP_READ, local, segment, peer.arena,
                                 sizeof(local), one_sided, NULL),
                 FERRY_OK, "an honest read via %s", one_sided);
    cr_assert_eq(test_pattern_check(local, sizeof(local), 4), SIZE_MAX);
    ferry_segment_close(engine, segment);

    publish_forged(&metad, "forged", MIB, "r"); /* another name, the owner's endpoints */
    forged_is_refused(engine, &peer, "forged", one_sided);
    publish_forged(&metad, "honest", MIB, "r"); /* the owner's own entry, overwritten */
    ferry_segment_refresh(engine, "honest");
    forged_is_refused(engine, &peer, "honest", one_sided);
    peer_stop(&peer);
    ferry_engine_destroy(engine); /* the engine leaves the store before the store goes */
    service_cleanup(&metad);
}

Test(one_sided, a_forged_store_entry_does_not_steer_shm)
{
    static const char *const env[] = {"FERRY_SEGMENT_NAME=honest", NULL};
    forged_store_entries("shm,tcp", "shm", env);
}

/* UCX over shared memory, for the same-host cases; skips without the module. */
static void use_ucx_shm(void)
{
    if (!service_module_built("ucx"))
        cr_skip_test("the ucx module is not built");
    setenv("UCX_TLS", "sm,self", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
}

Test(one_sided, a_forged_store_entry_does_not_steer_ucx)
{
    use_ucx_shm();
    static const char *const env[] = {"FERRY_SEGMENT_NAME=honest", NULL};
    forged_store_entries("ucx,tcp", "ucx", env);
}

/* A UCX rkey lets whoever holds it read the buffer: a write-only buffer is
 * published without one, so peers reading the store learn no key to it. */
Test(one_sided, a_write_only_buffer_gets_no_ucx_key)
{
    use_ucx_shm();
    setenv("FERRY_TRANSPORTS", "ucx,tcp", 1);
    unsetenv("FERRY_METADATA");
    ferry_engine_h engine;
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    peer_process_t peer;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu w", MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu rw", MIB, MIB), "OK");
    ferry_segment_h segment;
    char *json;
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    cr_assert_eq(ferry_segment_describe(engine, segment, &json), FERRY_OK);
    const char *write_only = strstr(json, "\"access\":\"w\"");
    const char *read_write = strstr(json, "\"access\":\"rw\"");
    cr_assert(write_only != NULL && read_write != NULL, "%s", json);
    /* Each buffer's keys follow its access. */
    const char *keys = strstr(write_only, "\"keys\":{");
    cr_assert_not_null(keys);
    cr_assert(strstr(keys, "\"ucx\"") == NULL || strstr(keys, "\"ucx\"") > strchr(keys, '}'),
              "the write-only buffer has a ucx key: %s", json);
    keys = strstr(read_write, "\"keys\":{");
    cr_assert(keys != NULL && strstr(keys, "\"ucx\"") != NULL &&
                  strstr(keys, "\"ucx\"") < strchr(keys, '}'),
              "the read-write buffer lost its ucx key: %s", json);
    free(json);
    unsigned char local[4096];
    test_pattern_fill(local, sizeof(local), 3);
    cr_assert_eq(one_request_via(engine, FERRY_OP_WRITE, local, segment, peer.arena + 64,
                                 sizeof(local), "tcp", NULL),
                 FERRY_OK, "the write-only buffer takes writes");
    cr_assert_str_eq(peer_cmd(&peer, "check 64 %zu 3", sizeof(local)), "OK");
    cr_assert_neq(one_request_via(engine, FERRY_OP_READ, local, segment, peer.arena + 64,
                                  sizeof(local), "ucx", NULL),
                  FERRY_OK, "a read via ucx");
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    ferry_engine_destroy(engine);
}

/* ---- the owner's side: subscribers ---- */

/* A FETCH of engine's segment that names `from` as the caller's RPC. */
static ferry_status_t fetch_as(ferry_engine_h engine, const char *from)
{
    const char *self = ferry_engine_segment_name(engine);
    ferry_wire_writer_t out = {0};
    cr_assert_eq(ferry_rpc_fetch_write(&out, self, from), FERRY_OK);
    void *reply = NULL;
    size_t length;
    ferry_status_t status = ferry_rpc_call(self, FERRY_RPC_FETCH, out.data, out.length, 2000,
                                           1 << 20, &reply, &length);
    free(reply);
    free(out.data);
    return status;
}

/* A listener that takes connections (the kernel does) and never answers. */
static int mute_listener(char *endpoint, size_t size)
{
    int fd, port;
    cr_assert_eq(ferry_net_listen("127.0.0.1", 0, 16, &fd, &port), FERRY_OK);
    snprintf(endpoint, size, "127.0.0.1:%d", port);
    return fd;
}

/* Forged FETCH frames name listeners that never answer: the owner's next
 * unregister tells all subscribers at once under one bound and drops the
 * mute ones; the list has a bound. */
Test(one_sided, mute_subscribers_cost_one_bound_and_leave_the_list)
{
    setenv("FERRY_INVALIDATE_TIMEOUT", "1000ms", 1);
    setenv("FERRY_SUBSCRIBERS_MAX", "10", 1);
    unsetenv("FERRY_METADATA");
    setenv("FERRY_TRANSPORTS", "tcp", 1);
    ferry_engine_h owner;
    cr_assert_eq(ferry_engine_create(NULL, &owner), FERRY_OK);
    enum { MUTE = 8 };
    int fds[MUTE + 3];
    char endpoints[MUTE + 3][64];
    for (int i = 0; i < MUTE + 3; i++)
        fds[i] = mute_listener(endpoints[i], sizeof(endpoints[i]));
    for (int i = 0; i < MUTE; i++)
        cr_assert_eq(fetch_as(owner, endpoints[i]), FERRY_OK);
    static char buffer[4096];
    cr_assert_eq(ferry_register(owner, buffer, sizeof(buffer), "cpu", 0), FERRY_OK);
    double start = test_now();
    cr_assert_eq(ferry_unregister(owner, buffer), FERRY_OK);
    double took = test_now() - start;
    cr_assert_lt(took, 3.0, "%d mute subscribers took %.1f s (bound: 1 s for all)", MUTE, took);
    cr_assert_gt(took, 0.5, "the mute subscribers were waited for (%.2f s)", took);
    /* They are gone: the next unregister waits for nobody. */
    cr_assert_eq(ferry_register(owner, buffer, sizeof(buffer), "cpu", 0), FERRY_OK);
    start = test_now();
    cr_assert_eq(ferry_unregister(owner, buffer), FERRY_OK);
    cr_assert_lt(test_now() - start, 0.5, "dropped subscribers were asked again");
    /* The bound: 10 subscribers, the 11th is refused. */
    for (int i = 0; i < 10; i++) {
        char name[64];
        snprintf(name, sizeof(name), "127.0.0.1:%d", 1000 + i);
        cr_assert_eq(fetch_as(owner, name), FERRY_OK);
    }
    cr_assert_eq(fetch_as(owner, endpoints[MUTE]), FERRY_ERR_NO_RESOURCE);
    cr_assert_eq(fetch_as(owner, "127.0.0.1:1000"), FERRY_OK, "a known subscriber again");
    for (int i = 0; i < MUTE + 3; i++)
        close(fds[i]);
    ferry_engine_destroy(owner);
}
