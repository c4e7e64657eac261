/* Two-process checks shared by the transport suites: write, then read
 * back, bytes verified on both sides, each request served by the transport
 * named (NULL: any). */
#ifndef FERRY_TEST_PUT_GET_H
#define FERRY_TEST_PUT_GET_H

#include <ferry/ferry.h>

#include "peer_process.h"

/* Each size at unaligned offsets: local + 3, the peer's arena + 5 + i. */
void put_get_sizes(ferry_engine_h engine, peer_process_t *peer, ferry_segment_h segment,
                   unsigned char *local, const size_t *sizes, size_t count,
                   const char *transport);
/* 1 MiB + 1 byte from a heap buffer that is not registered. */
void put_get_unregistered(ferry_engine_h engine, peer_process_t *peer, ferry_segment_h segment,
                          const char *transport);
/* 64 requests of 4 KiB in one batch, writes from local to the arena's start
 * and reads from arena + 32 MiB into local + 1 MiB, interleaved. */
void put_get_batch(ferry_engine_h engine, peer_process_t *peer, ferry_segment_h segment,
                   unsigned char *local, const char *transport);
/* Two buffers of 4 MiB from the peer's ferry_alloc at location: once the
 * peer frees the first, a request to it is refused and the second still
 * works.  local: 8 MiB. */
void put_get_after_free(ferry_engine_h engine, peer_process_t *peer, unsigned char *local,
                        const char *location, const char *transport);
/* A peer registers two buffers of 1 MiB and unregisters the second: a write
 * to it, a read of it and a write across the first one's end are refused
 * (FERRY_ERR_OUT_OF_RANGE) with no memory outside live registrations
 * changed, and the first still works.  local: 1 MiB. */
void put_get_refused_after_unregister(ferry_engine_h engine, unsigned char *local,
                                      const char *transport);
/* Every request of the batch COMPLETED or FAILED with
 * FERRY_ERR_PEER_FAILED; returns how many failed. */
int put_get_count_peer_failed(ferry_batch_h batch, int count);

#endif
