/*
 * The cxl transport: two processes moving bytes through a shared window (a
 * file on /dev/shm standing in for a CXL DAX device), which buffers it
 * reaches and which it does not, windows that make ferry_engine_create
 * fail, forged and stale keys, freed buffers, reclaiming the chunks of a
 * killed peer, and engines formatting one window at once.
 *
 * Each test makes its own window files (named after its pid: Criterion runs
 * every test in a process of its own) and removes them in the suite's fini.
 * FERRY_* variables are set before peers start: they inherit them.
 */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "capture_stderr.h"
#include "one_request.h"
#include "put_get.h"
#include "peer_process.h"
#include "service_process.h"
#include "test_pattern.h"
#include "../src/transport/cxl/cxl.h"

#define MIB         ((size_t)1 << 20)
#define WINDOW_SIZE (256 * MIB)

static ferry_engine_h engine;
static char window_path[128], other_path[128];

static void make_window(const char *path, size_t size)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0, "%s", path);
    cr_assert_eq(ftruncate(fd, (off_t)size), 0);
    close(fd);
}

/* A fresh window (zero) in FERRY_CXL_PATH and the transports engines use. */
static void setup_window(size_t size, const char *transports)
{
    snprintf(window_path, sizeof(window_path), "/dev/shm/ferry-test-cxl-%d", (int)getpid());
    snprintf(other_path, sizeof(other_path), "/dev/shm/ferry-test-cxl-%d-other", (int)getpid());
    make_window(window_path, size);
    setenv("FERRY_CXL_PATH", window_path, 1);
    unsetenv("FERRY_CXL_SIZE");
    setenv("FERRY_TRANSPORTS", transports, 1);
}

static void start(size_t size, const char *transports)
{
    setup_window(size, transports);
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
}

static void stop(void)
{
    if (engine)
        ferry_engine_destroy(engine);
    engine = NULL;
    if (window_path[0])
        unlink(window_path);
    if (other_path[0])
        unlink(other_path);
    service_cleanup_all();
}

TestSuite(cxl, .fini = stop, .timeout = 60);

/* One request; checks the transport that served it when it completed. */
static ferry_status_t transfer(ferry_opcode_t op, void *buf, ferry_segment_h segment,
                               uint64_t remote, size_t length, const char *want_transport)
{
    return one_request_served_by(engine, op, buf, segment, remote, length, want_transport);
}

/* The window file as the test sees it (read-only), to check bytes that no
 * engine should have touched. */
static const unsigned char *map_window(const char *path, size_t size)
{
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    void *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    cr_assert_neq(map, MAP_FAILED);
    return map;
}

static int all_zero(const unsigned char *p, size_t length)
{
    for (size_t i = 0; i < length; i++)
        if (p[i] != 0)
            return 0;
    return 1;
}

/* The cxl key ("<offset>@<addr>") of the buffer at addr in a descriptor's
 * JSON; returns a pointer to its first character, or NULL. */
static char *cxl_key_of(char *json, uintptr_t addr)
{
    char needle[64];
    snprintf(needle, sizeof(needle), "\"addr\":\"0x%" PRIxPTR "\"", addr);
    char *buffer = strstr(json, needle);
    char *key = buffer ? strstr(buffer, "\"cxl\":\"") : NULL;
    char *next = buffer ? strstr(buffer + 1, "\"addr\":") : NULL;
    if (key == NULL || (next != NULL && key > next))
        return NULL;
    return key + strlen("\"cxl\":\"");
}

/* The window offset of a buffer of our own engine, from its descriptor. */
static uint64_t own_window_offset(void *addr)
{
    ferry_segment_h self;
    char *json;
    cr_assert_eq(ferry_segment_open(engine, ferry_engine_segment_name(engine), &self), FERRY_OK);
    cr_assert_eq(ferry_segment_describe(engine, self, &json), FERRY_OK);
    char *key = cxl_key_of(json, (uintptr_t)addr);
    uint64_t offset = 0, at = 0;
    cr_assert(key != NULL && sscanf(key, "%" SCNx64 "@%" SCNx64, &offset, &at) == 2, "%s", json);
    cr_assert_eq(at, (uint64_t)(uintptr_t)addr);
    free(json);
    ferry_segment_close(engine, self);
    return offset;
}

/* Write then read back sizes 1 B .. 16 MiB at unaligned offsets of a peer's
 * arena in the window, bytes checked on both sides; local buffers in the
 * window too, and one plain heap buffer. */
Test(cxl, two_processes_write_and_read_through_the_window)
{
    start(WINDOW_SIZE, "cxl,shm");
    peer_process_t peer;
    ferry_segment_h segment;
    static const char *const env[] = {"FERRY_TEST_PEER_ALLOC=cxl", NULL};
    cr_assert_eq(peer_start(&peer, env), 0, "test peer did not start");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    unsigned char *local;
    cr_assert_eq(ferry_alloc(engine, 20 * MIB, "cxl", 0, (void **)&local), FERRY_OK);

    static const size_t sizes[] = {1, 7, 4096, 65537, MIB + 3, 16 * MIB};
    put_get_sizes(engine, &peer, segment, local, sizes, sizeof(sizes) / sizeof(sizes[0]), "cxl");
    put_get_unregistered(engine, &peer, segment, "cxl"); /* a local buffer outside the window */
    put_get_batch(engine, &peer, segment, local, "cxl"); /* one submit for the run */
    cr_assert_eq(ferry_free(engine, local), FERRY_OK);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

/* Registered heap memory is outside the window: no cxl key, so shm serves
 * it; with cxl alone nothing does. */
Test(cxl, a_buffer_outside_the_window_is_not_reached_by_cxl)
{
    start(WINDOW_SIZE, "cxl,shm");
    peer_process_t peer;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", 4 * MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    char *json;
    cr_assert_eq(ferry_segment_describe(engine, segment, &json), FERRY_OK);
    cr_assert_null(cxl_key_of(json, peer.arena), "a cxl key for heap memory: %s", json);
    free(json);
    unsigned char *local = malloc(4 * MIB);
    cr_assert_not_null(local);
    test_pattern_fill(local, 4 * MIB, 3);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, peer.arena, 4 * MIB, "shm"), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 3", 4 * MIB), "OK");
    memset(local, 0, 4 * MIB);
    cr_assert_eq(transfer(FERRY_OP_READ, local, segment, peer.arena, 4 * MIB, "shm"), FERRY_OK);
    cr_assert_eq(test_pattern_check(local, 4 * MIB, 3), SIZE_MAX);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    ferry_engine_destroy(engine);

    setenv("FERRY_TRANSPORTS", "cxl", 1);
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    cr_assert_eq(peer_start(&peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", 4 * MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, peer.arena, 4096, NULL),
                 FERRY_ERR_UNSUPPORTED, "cxl alone does not reach heap memory");
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    free(local);
}

/* "cpu" memory never comes from the window; "cxl" memory does, and without
 * a window "cxl" is refused with a message. */
static void alloc_without_window(void *arg)
{
    void *p;
    *(ferry_status_t *)arg = ferry_alloc(engine, MIB, "cxl", 0, &p);
}

Test(cxl, locations_cpu_and_cxl)
{
    start(WINDOW_SIZE, "cxl,shm,tcp");
    void *cpu, *cxl, *numbered;
    cr_assert_eq(ferry_alloc(engine, MIB, "cpu", 0, &cpu), FERRY_OK);
    cr_assert_eq(ferry_alloc(engine, MIB, "cxl", 0, &cxl), FERRY_OK);
    cr_assert_eq(ferry_alloc(engine, MIB, "cxl:0", 0, &numbered), FERRY_OK);
    ferry_segment_h self;
    char *json;
    cr_assert_eq(ferry_segment_open(engine, ferry_engine_segment_name(engine), &self), FERRY_OK);
    cr_assert_eq(ferry_segment_describe(engine, self, &json), FERRY_OK);
    cr_assert_null(cxl_key_of(json, (uintptr_t)cpu), "cpu memory in the window: %s", json);
    cr_assert_not_null(cxl_key_of(json, (uintptr_t)cxl), "%s", json);
    cr_assert_not_null(cxl_key_of(json, (uintptr_t)numbered), "%s", json);
    free(json);
    ferry_segment_close(engine, self);
    cr_assert_eq(ferry_free(engine, cpu), FERRY_OK);
    cr_assert_eq(ferry_free(engine, cxl), FERRY_OK);
    cr_assert_eq(ferry_free(engine, numbered), FERRY_OK);
    ferry_engine_destroy(engine);

    /* No window: the transport is not started, and "cxl" memory is refused. */
    unsetenv("FERRY_CXL_PATH");
    unsetenv("FERRY_TRANSPORTS");
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    ferry_status_t status = FERRY_OK;
    char *log = capture_stderr(alloc_without_window, &status);
    cr_assert_eq(status, FERRY_ERR_UNSUPPORTED);
    cr_assert(strstr(log, "FERRY_CXL_PATH") != NULL, "no hint: %s", log);
    free(log);
}

struct create_args {
    ferry_status_t status;
};

static void create_engine(void *arg)
{
    struct create_args *args = arg;
    ferry_engine_h e = NULL;
    args->status = ferry_engine_create(NULL, &e);
    if (args->status == FERRY_OK)
        ferry_engine_destroy(e);
}

/* ferry_engine_create fails, with a log naming the path and what. */
static void create_fails(const char *path, const char *why)
{
    struct create_args args;
    char *log = capture_stderr(create_engine, &args);
    cr_assert_not_null(log);
    cr_assert_neq(args.status, FERRY_OK, "created an engine on a bad window (%s)", why);
    cr_assert(strstr(log, why) != NULL, "no \"%s\" in: %s", why, log);
    if (path != NULL)
        cr_assert(strstr(log, path) != NULL, "the path is not named: %s", log);
    free(log);
}

Test(cxl, bad_windows_fail_engine_create_with_a_clear_message)
{
    setup_window(64 * MIB, "cxl,shm");
    char path[160];

    /* Not there: Ferry never creates the file. */
    snprintf(path, sizeof(path), "%s-missing", window_path);
    setenv("FERRY_CXL_PATH", path, 1);
    create_fails(path, "does not exist");

    /* Smaller than FERRY_CXL_SIZE. */
    setenv("FERRY_CXL_PATH", window_path, 1);
    setenv("FERRY_CXL_SIZE", "128m", 1);
    create_fails(window_path, "too small");
    unsetenv("FERRY_CXL_SIZE");

    /* Formatted at 64 MiB, then grown; or mapped with another FERRY_CXL_SIZE. */
    struct create_args args;
    create_engine(&args);
    cr_assert_eq(args.status, FERRY_OK, "a fresh window");
    cr_assert_eq(truncate(window_path, 96 * MIB), 0);
    create_fails(window_path, "changed size");
    setenv("FERRY_CXL_SIZE", "32m", 1);
    create_fails(window_path, "changed size");
    setenv("FERRY_CXL_SIZE", "64m", 1);
    create_engine(&args);
    cr_assert_eq(args.status, FERRY_OK, "the first 64 MiB are the window it was");
    unsetenv("FERRY_CXL_SIZE");

    /* Somebody else's bytes at the start: in the state word, or after it. */
    make_window(window_path, 64 * MIB);
    int fd = open(window_path, O_WRONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, "not ferry", 9, 0), 9);
    close(fd);
    create_fails(window_path, "not start with a Ferry window header");
    make_window(window_path, 64 * MIB);
    fd = open(window_path, O_WRONLY);
    cr_assert_eq(pwrite(fd, "x", 1, 1000), 1);
    close(fd);
    create_fails(window_path, "not start with a Ferry window header");

    /* Too small to hold a table and one chunk. */
    make_window(window_path, 8192);
    create_fails(window_path, "too small");

    /* Named in FERRY_TRANSPORTS while not configured. */
    unsetenv("FERRY_CXL_PATH");
    create_fails(NULL, "transport cxl is not configured");

    /* A device that is no window at all. */
    setenv("FERRY_CXL_PATH", "/dev/null", 1);
    create_fails("/dev/null", "/dev/null");
    unsetenv("FERRY_CXL_PATH");
}

/* Not configured and not named: not started, and not a word about it. */
Test(cxl, not_configured_is_silent)
{
    unsetenv("FERRY_CXL_PATH");
    unsetenv("FERRY_TRANSPORTS");
    struct create_args args;
    char *log = capture_stderr(create_engine, &args);
    cr_assert_eq(args.status, FERRY_OK);
    cr_assert_str_eq(log, "", "said: %s", log);
    free(log);
}

/* Publish the descriptor json (named honest) again as name, its cxl key of
 * the buffer at addr replaced by key (NULL: unchanged) and every occurrence
 * of from (if not NULL) by to. */
static void publish_forged(int port, const char *json, const char *name, uintptr_t addr,
                           const char *key, const char *from, const char *to)
{
    static char text[1 << 17], forged[1 << 17];
    snprintf(text, sizeof(text), "%s", json);
    char *name_at = strstr(text, "\"name\":\"honest\"");
    cr_assert_not_null(name_at);
    char *value = key ? cxl_key_of(text, addr) : NULL;
    cr_assert(key == NULL || value != NULL, "no cxl key for 0x%lx in %s", (unsigned long)addr,
              text);
    /* name first: it comes before the buffers */
    int n =
        snprintf(forged, sizeof(forged), "%.*s\"name\":\"%s\"", (int)(name_at - text), text, name);
    const char *rest = name_at + strlen("\"name\":\"honest\"");
    if (value != NULL) {
        n += snprintf(forged + n, sizeof(forged) - (size_t)n, "%.*s%s", (int)(value - rest), rest,
                      key);
        rest = value + strcspn(value, "\"");
    }
    snprintf(forged + n, sizeof(forged) - (size_t)n, "%s", rest);
    if (from != NULL) {
        char *hit = strstr(forged, from);
        cr_assert_not_null(hit, "no %s in %s", from, forged);
        snprintf(text, sizeof(text), "%.*s%s%s", (int)(hit - forged), forged, to,
                 hit + strlen(from));
        snprintf(forged, sizeof(forged), "%s", text);
    }
    char target[128];
    snprintf(target, sizeof(target), "/metadata?key=ferry%%2Fsegments%%2F%s", name);
    cr_assert_eq(http_call(port, "PUT", target, NULL, forged, strlen(forged), NULL, 0, NULL), 200);
}

static void fetch_honest(int port, char *json, size_t size)
{
    size_t length;
    cr_assert_eq(http_call(port, "GET", "/metadata?key=ferry%2Fsegments%2Fhonest", NULL, NULL, 0,
                           json, size, &length),
                 200);
}

/* A forged write and read to name: refused, before touching anything. */
static void refused(const char *name, uintptr_t remote, unsigned char *local)
{
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, name, &segment), FERRY_OK);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, remote, 64 * 1024, NULL),
                 FERRY_ERR_OUT_OF_RANGE, "%s: the write is refused", name);
    cr_assert_eq(transfer(FERRY_OP_READ, local, segment, remote, 64 * 1024, NULL),
                 FERRY_ERR_OUT_OF_RANGE, "%s: the read is refused", name);
    ferry_segment_close(engine, segment);
}

struct resized_args {
    uintptr_t remote;
    unsigned char *local;
    const char *served[2];
};

static void write_resized_twice(void *arg)
{
    struct resized_args *args = arg;
    static char served[2][32];
    for (int i = 0; i < 2; i++) {
        ferry_segment_h segment;
        ferry_xfer_status_t xs;
        cr_assert_eq(ferry_segment_open(engine, "resized", &segment), FERRY_OK);
        cr_assert_eq(
            one_request(engine, FERRY_OP_WRITE, args->local, segment, args->remote, 4096, &xs),
            FERRY_OK);
        snprintf(served[i], sizeof(served[i]), "%s", xs.transport);
        args->served[i] = served[i];
        ferry_segment_close(engine, segment);
        ferry_segment_refresh(engine, "resized");
    }
}

/*
 * Descriptors from a metadata store the test writes to: keys that point past
 * the window, into another engine's chunks or into free chunks are refused
 * (nothing written there); a stale key to freed chunks too; the same window
 * id with another size is not reached by cxl.
 */
Test(cxl, forged_and_stale_keys_are_refused_and_nothing_outside_is_written)
{
    /* The transport's own checks, behind the owner's confirmation, which
     * would refuse these forged descriptors before any of them is used. */
    setenv("FERRY_CONFIRM_DESCRIPTORS", "no", 1);
    service_t metad;
    service_start_forgery_store(&metad);
    start(WINDOW_SIZE, "cxl,shm");
    peer_process_t peer;
    static const char *const env[] = {"FERRY_TEST_PEER_ALLOC=cxl", "FERRY_SEGMENT_NAME=honest",
                                      NULL};
    cr_assert_eq(peer_start(&peer, env), 0);
    unsigned char *victim, *local = malloc(64 * 1024);
    cr_assert_not_null(local);
    cr_assert_eq(ferry_alloc(engine, MIB, "cxl", 0, (void **)&victim), FERRY_OK);
    test_pattern_fill(victim, MIB, 77);
    test_pattern_fill(local, 64 * 1024, 5);
    cr_assert_str_eq(peer_cmd(&peer, "fill 0 %zu 66", peer.arena_size), "OK");
    uint64_t victim_off = own_window_offset(victim);
    uint64_t free_off = WINDOW_SIZE - 8 * MIB; /* nobody allocated the end of the window */
    const unsigned char *window = map_window(window_path, WINDOW_SIZE);
    static char json[1 << 17];
    fetch_honest(metad.port, json, sizeof(json));
    char key[64];

    snprintf(key, sizeof(key), "%" PRIx64 "@%lx", (uint64_t)(WINDOW_SIZE - 4096),
             (unsigned long)peer.arena);
    publish_forged(metad.port, json, "past", peer.arena, key, NULL, NULL);
    refused("past", peer.arena, local);
    snprintf(key, sizeof(key), "%" PRIx64 "@%lx", victim_off, (unsigned long)peer.arena);
    publish_forged(metad.port, json, "other", peer.arena, key, NULL, NULL);
    refused("other", peer.arena, local);
    snprintf(key, sizeof(key), "%" PRIx64 "@%lx", free_off, (unsigned long)peer.arena);
    publish_forged(metad.port, json, "free", peer.arena, key, NULL, NULL);
    refused("free", peer.arena, local);
    snprintf(key, sizeof(key), "ffffffffffffff00@%lx", (unsigned long)peer.arena);
    publish_forged(metad.port, json, "wrap", peer.arena, key, NULL, NULL);
    refused("wrap", peer.arena + MIB, local);
    cr_assert_eq(test_pattern_check(victim, MIB, 77), SIZE_MAX, "another engine's chunks");
    cr_assert(all_zero(window + free_off, 64 * 1024), "free chunks were written");
    cr_assert(all_zero(window + WINDOW_SIZE - 4096, 4096), "the window's end was written");
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 66", peer.arena_size), "OK");

    /* Stale: a copy of the descriptor nobody invalidates, after the free. */
    uintptr_t doomed;
    cr_assert_eq(sscanf(peer_cmd(&peer, "alloc %zu cxl", MIB), "ALLOC %lx", &doomed), 1);
    fetch_honest(metad.port, json, sizeof(json));
    publish_forged(metad.port, json, "stale", 0, NULL, NULL, NULL);
    ferry_segment_h stale;
    cr_assert_eq(ferry_segment_open(engine, "stale", &stale), FERRY_OK);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, stale, doomed, 64 * 1024, "cxl"), FERRY_OK);
    uint64_t doomed_off;
    char *doomed_key = cxl_key_of(json, doomed);
    cr_assert(doomed_key && sscanf(doomed_key, "%" SCNx64 "@", &doomed_off) == 1);
    cr_assert_str_eq(peer_cmd(&peer, "free 0x%lx", (unsigned long)doomed), "OK");
    test_pattern_fill(local, 64 * 1024, 6);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, stale, doomed, 64 * 1024, NULL),
                 FERRY_ERR_OUT_OF_RANGE, "a write to freed chunks is refused");
    cr_assert_eq(test_pattern_check(window + doomed_off, 64 * 1024, 5), SIZE_MAX,
                 "the freed chunks were written");
    ferry_segment_close(engine, stale);

    /* The same window id, another size: not cxl (shm serves it), said once. */
    char from[80], to[80];
    const char *endpoint = strstr(json, "\"cxl\":\"cxl1:");
    cr_assert_not_null(endpoint);
    snprintf(from, sizeof(from), ":%zu:", WINDOW_SIZE);
    snprintf(to, sizeof(to), ":%zu:", 2 * WINDOW_SIZE);
    publish_forged(metad.port, json, "resized", 0, NULL, from, to);
    struct resized_args args = {.remote = peer.arena, .local = local};
    char *log = capture_stderr(write_resized_twice, &args);
    cr_assert_str_eq(args.served[0], "shm");
    cr_assert_str_eq(args.served[1], "shm");
    const char *line = strstr(log, "changed size");
    cr_assert_not_null(line, "not said: %s", log);
    cr_assert_null(strstr(line + 1, "changed size"), "said twice: %s", log);
    free(log);

    munmap((void *)window, WINDOW_SIZE);
    free(local);
    peer_stop(&peer);
    stop(); /* the engine leaves the store before the store goes */
    service_cleanup(&metad);
}

/*
 * A copy that starts in an allocation's last chunk and ends in the next
 * one (free here), sent because a forged descriptor says the buffer is
 * longer: the window's own bounds (the allocation's chunk count) refuse
 * it, and neither chunk changes.
 */
Test(cxl, a_copy_across_the_end_of_an_allocation_is_refused)
{
    /* The window's own bounds, behind the owner's confirmation, which
     * would refuse this forged descriptor before it is used. */
    setenv("FERRY_CONFIRM_DESCRIPTORS", "no", 1);
    service_t metad;
    service_start_forgery_store(&metad);
    start(WINDOW_SIZE, "cxl");
    peer_process_t peer;
    static const char *const env[] = {"FERRY_TEST_PEER_ALLOC=cxl", "FERRY_SEGMENT_NAME=honest",
                                      NULL};
    cr_assert_eq(peer_start(&peer, env), 0);
    cr_assert_str_eq(peer_cmd(&peer, "fill 0 %zu 66", peer.arena_size), "OK");
    static char json[1 << 17];
    fetch_honest(metad.port, json, sizeof(json));
    uint64_t off;
    const char *key = cxl_key_of(json, peer.arena);
    cr_assert(key != NULL && sscanf(key, "%" SCNx64 "@", &off) == 1, "%s", json);
    char from[64], to[64];
    snprintf(from, sizeof(from), "\"length\":\"%zu\"", peer.arena_size);
    snprintf(to, sizeof(to), "\"length\":\"%zu\"", peer.arena_size + 64 * 1024);
    publish_forged(metad.port, json, "longer", 0, NULL, from, to);
    const unsigned char *window = map_window(window_path, WINDOW_SIZE);
    const unsigned char *after = window + off + peer.arena_size;
    cr_assert(all_zero(after, 64 * 1024), "the chunks after the allocation are not free");

    unsigned char *local = malloc(8192);
    cr_assert_not_null(local);
    test_pattern_fill(local, 8192, 5);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, "longer", &segment), FERRY_OK);
    cr_assert_eq(
        transfer(FERRY_OP_WRITE, local, segment, peer.arena + peer.arena_size - 4096, 8192, NULL),
        FERRY_ERR_OUT_OF_RANGE, "a write across the allocation's end");
    cr_assert(all_zero(after, 64 * 1024), "the chunk after the allocation was written");
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 66", peer.arena_size), "OK",
                     "the allocation's last chunk was written");
    ferry_segment_close(engine, segment);
    munmap((void *)window, WINDOW_SIZE);
    free(local);
    peer_stop(&peer);
    stop(); /* the engine leaves the store before the store goes */
    service_cleanup(&metad);
}

/* Through the p2p store the owner tells us it freed the buffer: the next
 * request finds it gone; the other buffer goes on. */
Test(cxl, a_freed_buffer_is_refused_and_others_work)
{
    start(WINDOW_SIZE, "cxl,shm");
    peer_process_t peer;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    unsigned char *local = malloc(8 * MIB);
    cr_assert_not_null(local);
    put_get_after_free(engine, &peer, local, "cxl", "cxl");
    peer_stop(&peer);
    free(local);
}

static void alloc_in_full_window(void *arg)
{
    void *p = NULL;
    *(ferry_status_t *)arg = ferry_alloc(engine, 100 * MIB, "cxl", 0, &p);
}

/* Two peers hold 160 MiB of a 256 MiB window: 100 MiB more do not fit, until
 * one of them is killed; the other one's chunks stay its own. */
Test(cxl, a_killed_peers_chunks_are_reclaimed_when_the_window_is_full)
{
    start(WINDOW_SIZE, "cxl,shm");
    peer_process_t alive, victim;
    static const char *const env[] = {"FERRY_TEST_PEER_ALLOC=cxl", NULL};
    cr_assert_eq(peer_start(&alive, env), 0);
    cr_assert_eq(peer_start(&victim, env), 0);
    ferry_status_t status = FERRY_OK;
    char *log = capture_stderr(alloc_in_full_window, &status);
    cr_assert_eq(status, FERRY_ERR_NO_MEMORY);
    cr_assert(strstr(log, "is full") != NULL && strstr(log, window_path) != NULL, "%s", log);
    free(log);

    peer_kill(&victim, SIGKILL);
    void *big;
    cr_assert_eq(ferry_alloc(engine, 100 * MIB, "cxl", 0, &big), FERRY_OK,
                 "the killed peer's chunks were not reclaimed");
    memset(big, 0x5a, 100 * MIB);

    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, alive.name, &segment), FERRY_OK);
    test_pattern_fill(big, MIB, 12);
    cr_assert_eq(transfer(FERRY_OP_WRITE, big, segment, alive.arena, MIB, "cxl"), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&alive, "check 0 %zu 12", MIB), "OK");
    ferry_segment_close(engine, segment);
    cr_assert_eq(ferry_free(engine, big), FERRY_OK);
    peer_stop(&alive);
}

/* A peer that maps another window: cxl does not reach it, shm does. */
Test(cxl, a_peer_in_another_window_is_not_reached_by_cxl)
{
    start(WINDOW_SIZE, "cxl,shm");
    make_window(other_path, 128 * MIB);
    char path_env[200];
    snprintf(path_env, sizeof(path_env), "FERRY_CXL_PATH=%s", other_path);
    const char *const env[] = {"FERRY_TEST_PEER_ALLOC=cxl", path_env, NULL};
    peer_process_t peer;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&peer, env), 0);
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    unsigned char *local;
    cr_assert_eq(ferry_alloc(engine, MIB, "cxl", 0, (void **)&local), FERRY_OK);
    test_pattern_fill(local, MIB, 21);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, peer.arena + 17, MIB, "shm"), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check 17 %zu 21", MIB), "OK");
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    cr_assert_eq(ferry_free(engine, local), FERRY_OK);
}

/* The window file shrinks under the mapping: transfers are refused (a copy
 * into the missing part would raise SIGBUS). */
Test(cxl, a_window_file_that_shrinks_is_refused)
{
    start(WINDOW_SIZE, "cxl");
    peer_process_t peer;
    ferry_segment_h segment;
    static const char *const env[] = {"FERRY_TEST_PEER_ALLOC=cxl", NULL};
    cr_assert_eq(peer_start(&peer, env), 0);
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    unsigned char *local = malloc(MIB);
    cr_assert_not_null(local);
    test_pattern_fill(local, MIB, 2);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, peer.arena, MIB, "cxl"), FERRY_OK);
    cr_assert_eq(truncate(window_path, WINDOW_SIZE / 2), 0);
    usleep(50 * 1000); /* past the 20 ms between looks */
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, peer.arena, MIB, NULL), FERRY_ERR_IO);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    free(local);
}

/* Engines that map a zero window at once: one formats it, the others wait
 * for it and use the same window (they reach each other through it). */
enum { RACERS = 4 };
static ferry_engine_h racers[RACERS];

static void *race_create(void *arg)
{
    ferry_engine_h *e = arg;
    return (void *)(intptr_t)ferry_engine_create(NULL, e);
}

Test(cxl, engines_starting_at_once_format_the_window_once)
{
    setup_window(WINDOW_SIZE, "cxl");
    pthread_t threads[RACERS];
    for (int i = 0; i < RACERS; i++)
        cr_assert_eq(pthread_create(&threads[i], NULL, race_create, &racers[i]), 0);
    for (int i = 0; i < RACERS; i++) {
        void *status;
        pthread_join(threads[i], &status);
        cr_assert_eq((ferry_status_t)(intptr_t)status, FERRY_OK, "engine %d", i);
    }
    unsigned char *buffers[RACERS];
    for (int i = 0; i < RACERS; i++)
        cr_assert_eq(ferry_alloc(racers[i], MIB, "cxl", 0, (void **)&buffers[i]), FERRY_OK);
    engine = racers[0];
    for (int i = 1; i < RACERS; i++) {
        ferry_segment_h segment;
        cr_assert_eq(ferry_segment_open(engine, ferry_engine_segment_name(racers[i]), &segment),
                     FERRY_OK);
        test_pattern_fill(buffers[0], MIB, 30 + (unsigned)i);
        cr_assert_eq(
            transfer(FERRY_OP_WRITE, buffers[0], segment, (uintptr_t)buffers[i], MIB, "cxl"),
            FERRY_OK);
        cr_assert_eq(test_pattern_check(buffers[i], MIB, 30 + (unsigned)i), SIZE_MAX);
        ferry_segment_close(engine, segment);
    }
    for (int i = 1; i < RACERS; i++)
        ferry_engine_destroy(racers[i]);
}

/* An engine killed while it held the table's lock, half-way through a
 * change: the next engine repairs the table and goes on. */
Test(cxl, an_engine_killed_holding_the_table_lock_does_not_wedge_the_window)
{
    start(WINDOW_SIZE, "cxl");
    void *kept;
    cr_assert_eq(ferry_alloc(engine, MIB, "cxl", 0, &kept), FERRY_OK);
    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
        int fd = open(window_path, O_RDWR);
        unsigned char *base = mmap(NULL, WINDOW_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (fd < 0 || base == MAP_FAILED)
            _exit(1);
        ferry_cxl_header_t *h = (ferry_cxl_header_t *)base;
        ferry_cxl_chunk_t *table = (ferry_cxl_chunk_t *)(base + h->table_offset);
        if (pthread_mutex_lock(&h->lock) != 0)
            _exit(2);
        /* a chunk claimed for an allocation whose first chunk was never written */
        uint32_t c = (uint32_t)h->reserved_chunks + 1000;
        atomic_store(&table[c].first, c - 1);
        atomic_store(&table[c].count, 2);
        atomic_store(&table[c].owner, 12345);
        _exit(0); /* holding the lock */
    }
    int status;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    ferry_status_t allocated = FERRY_ERR_IO;
    char *log = capture_stderr(alloc_in_full_window, &allocated);
    cr_assert_eq(allocated, FERRY_OK, "%s", log);
    cr_assert(strstr(log, "repaired") != NULL, "no word about the repair: %s", log);
    free(log);
    cr_assert_eq(ferry_free(engine, kept), FERRY_OK);
}

/* An engine that began formatting and never finished: the others give up
 * after a bounded wait, saying so. */
Test(cxl, a_window_left_half_formatted_fails_after_a_bounded_wait)
{
    setup_window(64 * MIB, "cxl");
    int fd = open(window_path, O_WRONLY);
    cr_assert_geq(fd, 0);
    uint64_t formatting = FERRY_CXL_FORMATTING;
    cr_assert_eq(pwrite(fd, &formatting, sizeof(formatting), 0), (ssize_t)sizeof(formatting));
    close(fd);
    create_fails(window_path, "did not finish");
}
