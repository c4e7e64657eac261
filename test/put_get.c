#include "put_get.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "one_request.h"
#include "test_pattern.h"

#define MIB ((size_t)1 << 20)

void put_get_sizes(ferry_engine_h engine, peer_process_t *peer, ferry_segment_h segment,
                   unsigned char *local, const size_t *sizes, size_t count, const char *transport)
{
    for (size_t i = 0; i < count; i++) {
        size_t length = sizes[i], local_off = 3, remote_off = 5 + i; /* deliberately unaligned */
        unsigned seed = 100 + (unsigned)i;
        test_pattern_fill(local + local_off, length, seed);
        cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, local + local_off, segment,
                                           peer->arena + remote_off, length, transport),
                     FERRY_OK, "write of %zu bytes", length);
        cr_assert_str_eq(peer_cmd(peer, "check %zu %zu %u", remote_off, length, seed), "OK",
                         "bytes written (%zu) differ at the target", length);
        cr_assert_str_eq(peer_cmd(peer, "fill %zu %zu %u", remote_off, length, seed + 50), "OK");
        memset(local + local_off, 0, length);
        /* The bytes on either side stay as they were: a copy of exactly length. */
        local[local_off - 1] = local[local_off + length] = 0xa5;
        cr_assert_eq(one_request_served_by(engine, FERRY_OP_READ, local + local_off, segment,
                                           peer->arena + remote_off, length, transport),
                     FERRY_OK, "read of %zu bytes", length);
        cr_assert_eq(test_pattern_check(local + local_off, length, seed + 50), SIZE_MAX,
                     "bytes read (%zu) differ", length);
        cr_assert(local[local_off - 1] == 0xa5 && local[local_off + length] == 0xa5,
                  "a read of %zu bytes wrote past its range", length);
    }
}

void put_get_unregistered(ferry_engine_h engine, peer_process_t *peer, ferry_segment_h segment,
                          const char *transport)
{
    unsigned char *plain = malloc(MIB + 1);
    cr_assert_not_null(plain);
    test_pattern_fill(plain, MIB + 1, 7);
    cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, plain, segment, peer->arena + 1,
                                       MIB + 1, transport),
                 FERRY_OK);
    cr_assert_str_eq(peer_cmd(peer, "check 1 %zu 7", MIB + 1), "OK");
    memset(plain, 0, MIB + 1);
    cr_assert_eq(one_request_served_by(engine, FERRY_OP_READ, plain, segment, peer->arena + 1,
                                       MIB + 1, transport),
                 FERRY_OK);
    cr_assert_eq(test_pattern_check(plain, MIB + 1, 7), SIZE_MAX);
    free(plain);
}

void put_get_batch(ferry_engine_h engine, peer_process_t *peer, ferry_segment_h segment,
                   unsigned char *local, const char *transport)
{
    enum { N = 64 };
    ferry_request_t reqs[N];
    ferry_batch_h batch;
    test_pattern_fill(local, 32 * 4096, 9);
    cr_assert_str_eq(peer_cmd(peer, "fill %zu %zu 10", 32 * MIB, (size_t)32 * 4096), "OK");
    for (int i = 0; i < N; i++) {
        int write = i % 2 == 0;
        size_t k = (size_t)i / 2;
        reqs[i] =
            (ferry_request_t){.opcode = write ? FERRY_OP_WRITE : FERRY_OP_READ,
                              .local = write ? local + k * 4096 : local + MIB + k * 4096,
                              .target = segment,
                              .target_offset = peer->arena + (write ? 0 : 32 * MIB) + k * 4096,
                              .length = 4096};
    }
    cr_assert_eq(ferry_batch_create(engine, N, &batch), FERRY_OK);
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK);
    for (size_t i = 0; transport != NULL && i < N; i++) {
        ferry_xfer_status_t xs;
        cr_assert_eq(ferry_batch_status(batch, i, &xs), FERRY_OK);
        cr_assert_str_eq(xs.transport, transport, "request %zu served by %s", i, xs.transport);
    }
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    cr_assert_str_eq(peer_cmd(peer, "check 0 %zu 9", (size_t)32 * 4096), "OK");
    cr_assert_eq(test_pattern_check(local + MIB, 32 * 4096, 10), SIZE_MAX);
}

void put_get_after_free(ferry_engine_h engine, peer_process_t *peer, unsigned char *local,
                        const char *location, const char *transport)
{
    ferry_segment_h segment;
    uintptr_t first, second;
    cr_assert_eq(sscanf(peer_cmd(peer, "alloc %zu %s", 4 * MIB, location), "ALLOC %lx", &first), 1);
    cr_assert_eq(sscanf(peer_cmd(peer, "alloc %zu %s", 4 * MIB, location), "ALLOC %lx", &second),
                 1);
    cr_assert_eq(ferry_segment_open(engine, peer->name, &segment), FERRY_OK);
    test_pattern_fill(local, 4 * MIB, 41);
    cr_assert_eq(
        one_request_served_by(engine, FERRY_OP_WRITE, local, segment, first, 4 * MIB, transport),
        FERRY_OK);
    cr_assert_eq(
        one_request_served_by(engine, FERRY_OP_WRITE, local, segment, second, 4 * MIB, transport),
        FERRY_OK);
    cr_assert_str_eq(peer_cmd(peer, "free 0x%lx", (unsigned long)first), "OK");
    cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, local, segment, first, 4096, NULL),
                 FERRY_ERR_OUT_OF_RANGE, "a write to the freed buffer is refused");
    memset(local + 4 * MIB, 0, 4 * MIB);
    cr_assert_eq(one_request_served_by(engine, FERRY_OP_READ, local + 4 * MIB, segment, second,
                                       4 * MIB, transport),
                 FERRY_OK, "the other buffer still works");
    cr_assert_eq(test_pattern_check(local + 4 * MIB, 4 * MIB, 41), SIZE_MAX);
    ferry_segment_close(engine, segment);
}

void put_get_refused_after_unregister(ferry_engine_h engine, unsigned char *local,
                                      const char *transport)
{
    peer_process_t peer;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    for (size_t i = 0; i < 2; i++) /* two registrations: the second goes */
        cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu", i * MIB, MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    test_pattern_fill(local, MIB, 11);
    cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, local, segment, peer.arena + MIB,
                                       MIB, transport),
                 FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "unreg %zu", MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "fill %zu %zu 12", MIB, 2 * MIB), "OK");
    char before[64];
    snprintf(before, sizeof(before), "%s", peer_cmd(&peer, "sum %zu %zu", MIB, 2 * MIB));
    test_pattern_fill(local, MIB, 13);
    cr_assert_eq(one_request(engine, FERRY_OP_WRITE, local, segment, peer.arena + MIB, 100, NULL),
                 FERRY_ERR_OUT_OF_RANGE, "a write to the unregistered buffer is refused");
    cr_assert_eq(one_request(engine, FERRY_OP_READ, local, segment, peer.arena + MIB, 100, NULL),
                 FERRY_ERR_OUT_OF_RANGE, "a read of the unregistered buffer is refused");
    cr_assert_eq(one_request(engine, FERRY_OP_WRITE, local, segment, peer.arena + MIB - 8, 16,
                             NULL),
                 FERRY_ERR_OUT_OF_RANGE, "a write across the end of a buffer is refused");
    cr_assert_eq(one_request_served_by(engine, FERRY_OP_WRITE, local, segment, peer.arena, MIB,
                                       transport),
                 FERRY_OK, "the live buffer still works");
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 13", MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "sum %zu %zu", MIB, 2 * MIB), before,
                     "memory outside the live registrations changed");
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

int put_get_count_peer_failed(ferry_batch_h batch, int count)
{
    int failed = 0;
    for (int i = 0; i < count; i++) {
        ferry_xfer_status_t xs;
        cr_assert_eq(ferry_batch_status(batch, (size_t)i, &xs), FERRY_OK);
        cr_assert(xs.state == FERRY_XFER_COMPLETED || xs.state == FERRY_XFER_FAILED);
        if (xs.state == FERRY_XFER_FAILED) {
            failed++;
            cr_assert_eq(xs.error, FERRY_ERR_PEER_FAILED, "request %d: %s", i,
                         ferry_status_string(xs.error));
        }
    }
    return failed;
}
