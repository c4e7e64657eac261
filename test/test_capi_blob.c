/* Segment blobs: export, open without the store, transfers through the
 * segment, how it follows its owner, bounds, and hostile bytes. */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/personality.h>
#include <unistd.h>

#include "../src/core/core.h"
#include "capi_common.h"
#include "capture_stderr.h"
#include "one_request.h"
#include "test_pattern.h"
#include "peer_process.h"

#define KIB ((size_t)1 << 10)

TestSuite(blob, .init = capi_setup, .fini = capi_teardown, .timeout = 60);

/* The peer's blob, through a file; *length_p its size (malloc-ed). */
static unsigned char *peer_blob(peer_process_t *peer, size_t *length_p)
{
    char path[] = "/tmp/ferry-capi-blob-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_str_eq(peer_cmd(peer, "blob %s", path), "OK");
    FILE *file = fopen(path, "rb");
    cr_assert_not_null(file);
    unsigned char *blob = malloc(1 << 20);
    *length_p = fread(blob, 1, 1 << 20, file);
    fclose(file);
    unlink(path);
    cr_assert_gt(*length_p, FERRY_DESC_BLOB_HEADER);
    return blob;
}

/* A peer named so that the p2p store cannot find it: only its blob can. */
static void start_unfindable_peer(peer_process_t *peer, const char *rpc_address)
{
    char address[320];
    snprintf(address, sizeof(address), "FERRY_RPC_ADDRESS=%s", rpc_address);
    const char *env[] = {"FERRY_SEGMENT_NAME=capi-blob-owner", address, NULL};
    cr_assert_eq(peer_start(peer, env), 0);
    cr_assert_str_eq(peer->name, "capi-blob-owner");
}

static ferry_segment_h open_peer_blob(peer_process_t *peer)
{
    size_t length;
    unsigned char *blob = peer_blob(peer, &length);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open_blob(capi_engine, blob, length, &segment), FERRY_OK);
    free(blob);
    return segment;
}

/* An unfindable peer with 64 KiB registered at its arena, opened by blob. */
static ferry_segment_h blob_owner_start(peer_process_t *peer)
{
    start_unfindable_peer(peer, "127.0.0.1:0");
    cr_assert_str_eq(peer_cmd(peer, "reg 0 %zu", 64 * KIB), "OK");
    return open_peer_blob(peer);
}

Test(blob, export_reports_its_size)
{
    static unsigned char buffer[64 * KIB];
    cr_assert_eq(ferry_register(capi_engine, buffer, sizeof(buffer), NULL, 0), FERRY_OK);
    size_t length = 0, again = 0;
    cr_assert_eq(ferry_engine_export_blob(capi_engine, NULL, 0, &length), FERRY_OK);
    cr_assert_gt(length, FERRY_DESC_BLOB_HEADER);
    unsigned char *blob = malloc(length + 8);
    memset(blob, 0xee, length + 8);
    cr_assert_eq(ferry_engine_export_blob(capi_engine, blob, length - 1, &again),
                 FERRY_ERR_OUT_OF_RANGE);
    cr_assert_eq(again, length, "a short buffer is told the size it needs");
    cr_assert_eq(blob[0], 0xee, "and nothing is written into it");
    cr_assert_eq(ferry_engine_export_blob(capi_engine, blob, length + 8, &again), FERRY_OK);
    cr_assert_eq(again, length);
    cr_assert_eq(memcmp(blob, "FERRYB", 6), 0);
    cr_assert_eq(blob[length], 0xee, "nothing past the blob");
    cr_assert_eq(ferry_engine_export_blob(capi_engine, blob, 8, NULL), FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_engine_export_blob(capi_engine, NULL, 8, &again),
                 FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_engine_export_blob(NULL, blob, length, &again),
                 FERRY_ERR_INVALID_HANDLE);
    /* the engine's own blob opens its own segment */
    ferry_segment_h self;
    cr_assert_eq(ferry_segment_open_blob(capi_engine, blob, length, &self), FERRY_OK);
    cr_assert_eq(ferry_segment_close(capi_engine, self), FERRY_OK);
    free(blob);
    cr_assert_eq(ferry_unregister(capi_engine, buffer), FERRY_OK);
}

Test(blob, opens_without_the_store_and_moves_bytes)
{
    peer_process_t peer;
    start_unfindable_peer(&peer, "127.0.0.1:0");
    ferry_segment_h segment;
    cr_assert_neq(ferry_segment_open(capi_engine, peer.name, &segment), FERRY_OK,
                  "the store does not know it");
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", 256 * KIB), "OK");
    segment = open_peer_blob(&peer);
    cr_assert_eq(capi_write(segment, peer.arena, 256 * KIB, 5), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 5", 256 * KIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "fill %zu %zu 6", 64 * KIB, 64 * KIB), "OK");
    memset(capi_local, 0, 64 * KIB);
    cr_assert_eq(one_request(capi_engine, FERRY_OP_READ, capi_local, segment,
                             peer.arena + 64 * KIB, 64 * KIB, NULL),
                 FERRY_OK);
    cr_assert_eq(test_pattern_check(capi_local, 64 * KIB, 6), SIZE_MAX);
    /* a second open of the same blob is the same segment, opened twice */
    ferry_segment_h twice = open_peer_blob(&peer);
    cr_assert_eq(twice, segment);
    cr_assert_eq(ferry_segment_close(capi_engine, twice), FERRY_OK);
    cr_assert_eq(capi_write(segment, peer.arena, 4 * KIB, 7), FERRY_OK);
    cr_assert_eq(ferry_segment_close(capi_engine, segment), FERRY_OK);
    peer_stop(&peer);
}

Test(blob, follows_its_owner_registering_and_unregistering)
{
    peer_process_t peer;
    ferry_segment_h segment = blob_owner_start(&peer);
    /* registered after the blob was made: reached through a refresh from
     * the owner, without a new blob */
    cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu", 128 * KIB, 64 * KIB), "OK");
    cr_assert_eq(capi_write(segment, peer.arena + 128 * KIB, 64 * KIB, 8), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check %zu %zu 8", 128 * KIB, 64 * KIB), "OK");
    /* unregistered after it: refused, and its bytes untouched */
    cr_assert_str_eq(peer_cmd(&peer, "fill 0 %zu 9", 64 * KIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "unreg 0"), "OK");
    cr_assert_neq(capi_write(segment, peer.arena, 64 * KIB, 10), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 9", 64 * KIB), "OK");
    cr_assert_eq(ferry_segment_refresh(capi_engine, peer.name), FERRY_OK);
    ferry_segment_close(capi_engine, segment);
    peer_stop(&peer);
}

Test(blob, a_blob_that_lies_is_bounded_by_the_owner)
{
    peer_process_t peer;
    start_unfindable_peer(&peer, "127.0.0.1:0");
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", 64 * KIB), "OK");
    size_t length;
    unsigned char *blob = peer_blob(&peer, &length);
    /* claim twice the memory the owner registered */
    ferry_descriptor_t *desc;
    cr_assert_eq(ferry_descriptor_blob_decode(blob, length, &desc), FERRY_OK);
    cr_assert_eq(desc->n_buffers, 1);
    desc->buffers[0].length *= 2;
    uint8_t *forged;
    size_t forged_length;
    cr_assert_eq(ferry_descriptor_blob_encode(desc, &forged, &forged_length), FERRY_OK);
    ferry_descriptor_unref(desc);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open_blob(capi_engine, forged, forged_length, &segment), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "fill %zu %zu 11", 64 * KIB, 64 * KIB), "OK");
    cr_assert_neq(capi_write(segment, peer.arena + 64 * KIB, 64 * KIB, 12), FERRY_OK,
                  "past the registered end");
    cr_assert_str_eq(peer_cmd(&peer, "check %zu %zu 11", 64 * KIB, 64 * KIB), "OK",
                     "bytes past the registered end untouched");
    cr_assert_eq(capi_write(segment, peer.arena, 64 * KIB, 13), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 13", 64 * KIB), "OK");
    ferry_segment_close(capi_engine, segment);
    free(forged);
    free(blob);
    peer_stop(&peer);
}

Test(blob, follows_an_owner_restarted_at_its_address)
{
    personality(ADDR_NO_RANDOMIZE); /* the same arena address in both incarnations */
    peer_process_t first, second;
    start_unfindable_peer(&first, "127.0.0.1:0");
    cr_assert_str_eq(peer_cmd(&first, "reg 0 %zu", 64 * KIB), "OK");
    size_t length;
    unsigned char *blob = peer_blob(&first, &length);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open_blob(capi_engine, blob, length, &segment), FERRY_OK);
    ferry_descriptor_t *desc; /* where its RPC listens: the next one listens there */
    cr_assert_eq(ferry_descriptor_blob_decode(blob, length, &desc), FERRY_OK);
    char address[300];
    snprintf(address, sizeof(address), "%s", desc->rpc);
    ferry_descriptor_unref(desc);
    free(blob);
    cr_assert_eq(capi_write(segment, first.arena, 64 * KIB, 14), FERRY_OK);
    peer_kill(&first, SIGKILL);
    start_unfindable_peer(&second, address);
    cr_assert_eq(second.arena, first.arena);
    cr_assert_str_eq(peer_cmd(&second, "reg 0 %zu", 64 * KIB), "OK");
    cr_assert_eq(ferry_segment_probe(capi_engine, segment, 2000), FERRY_ERR_STALE);
    cr_assert_eq(capi_write(segment, second.arena, 64 * KIB, 15), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&second, "check 0 %zu 15", 64 * KIB), "OK");
    ferry_segment_close(capi_engine, segment);
    peer_stop(&second);
}

Test(blob, a_gone_owner_fails_requests_cleanly)
{
    peer_process_t peer;
    ferry_segment_h segment = blob_owner_start(&peer);
    peer_kill(&peer, SIGKILL);
    cr_assert_neq(capi_write(segment, peer.arena, 64 * KIB, 16), FERRY_OK);
    cr_assert_neq(ferry_segment_refresh(capi_engine, peer.name), FERRY_OK);
    ferry_segment_close(capi_engine, segment);
}

/* ---- hostile bytes ---- */

static unsigned char *own_blob(size_t *length_p, void *buffer, size_t size)
{
    cr_assert_eq(ferry_register(capi_engine, buffer, size, NULL, 0), FERRY_OK);
    cr_assert_eq(ferry_engine_export_blob(capi_engine, NULL, 0, length_p), FERRY_OK);
    unsigned char *blob = malloc(*length_p + 1);
    cr_assert_eq(ferry_engine_export_blob(capi_engine, blob, *length_p, length_p), FERRY_OK);
    return blob;
}

static ferry_status_t open_bytes(const unsigned char *bytes, size_t length)
{
    ferry_segment_h segment;
    ferry_status_t status = ferry_segment_open_blob(capi_engine, bytes, length, &segment);
    if (status == FERRY_OK)
        ferry_segment_close(capi_engine, segment);
    return status;
}

typedef struct decode_case {
    const unsigned char *bytes;
    size_t length;
    ferry_status_t status;
} decode_case_t;

static void decode_quietly(void *arg)
{
    decode_case_t *c = arg;
    c->status = open_bytes(c->bytes, c->length);
}

/* Refused with FERRY_ERR_DECODE and exactly one log line. */
static void check_refused(const unsigned char *bytes, size_t length, const char *what)
{
    decode_case_t c = {bytes, length, FERRY_OK};
    char *log = capture_stderr(decode_quietly, &c);
    cr_assert_eq(c.status, FERRY_ERR_DECODE, "%s: %s", what, ferry_status_string(c.status));
    if (log != NULL) {
        size_t lines = 0;
        for (const char *p = log; *p; p++)
            lines += *p == '\n';
        cr_assert_eq(lines, 1, "%s: one log line, got:\n%s", what, log);
        free(log);
    }
}

Test(blob, hostile_blobs_are_refused_clearly)
{
    static unsigned char buffer[4 * KIB];
    size_t length;
    unsigned char *blob = own_blob(&length, buffer, sizeof(buffer));
    unsigned char *bad = malloc(length + 1);
    cr_assert_eq(open_bytes(blob, length), FERRY_OK);
    check_refused(blob, 0, "empty");
    check_refused(blob, 10, "shorter than the header");
    check_refused(blob, length - 1, "cut by one byte");
    memcpy(bad, blob, length);
    bad[length] = '\n';
    check_refused(bad, length + 1, "one byte more");
    memcpy(bad, blob, length);
    bad[0] = 'f';
    check_refused(bad, length, "bad magic");
    memcpy(bad, blob, length);
    bad[7] = 2;
    check_refused(bad, length, "version 2");
    memcpy(bad, blob, length);
    bad[length / 2] ^= 0x20;
    check_refused(bad, length, "a flipped bit");
    check_refused((const unsigned char *)"{\"name\": \"x\"}", 13, "JSON, not a blob");
    /* well wrapped, a broken descriptor inside */
    const char inside[] = "ferry:desc:1\nname 0:\n";
    uint8_t *wrapped;
    size_t wrapped_length;
    cr_assert_eq(ferry_descriptor_blob_wrap(inside, strlen(inside), &wrapped, &wrapped_length),
                 FERRY_OK);
    check_refused(wrapped, wrapped_length, "an empty name inside");
    free(wrapped);
    /* every cut and every single-byte change: refused, never a crash */
    for (size_t cut = 0; cut < length; cut++)
        cr_assert_eq(open_bytes(blob, cut), FERRY_ERR_DECODE, "cut at %zu", cut);
    for (size_t i = 0; i < length; i++) {
        memcpy(bad, blob, length);
        bad[i] ^= 0x01;
        cr_assert_eq(open_bytes(bad, length), FERRY_ERR_DECODE, "byte %zu changed", i);
    }
    cr_assert_eq(ferry_segment_open_blob(capi_engine, NULL, length, &(ferry_segment_h){0}),
                 FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_segment_open_blob(capi_engine, blob, length, NULL),
                 FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_segment_open_blob(NULL, blob, length, &(ferry_segment_h){0}),
                 FERRY_ERR_INVALID_HANDLE);
    free(bad);
    free(blob);
    cr_assert_eq(ferry_unregister(capi_engine, buffer), FERRY_OK);
}
