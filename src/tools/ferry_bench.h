/* ferry_bench's parts in other files. */
#ifndef FERRY_BENCH_H
#define FERRY_BENCH_H

#include <ferry/ferry.h>

/* ferry_bench_samples.c: the clock, and latency samples in microseconds. */
typedef struct ferry_bench_samples {
    double *values;
    size_t count, capacity;
} ferry_bench_samples_t;

double ferry_bench_now(void); /* seconds, monotonic */
void ferry_bench_samples_add(ferry_bench_samples_t *s, double value);
/* Move from's samples into into (from is emptied). */
void ferry_bench_samples_merge(ferry_bench_samples_t *into, ferry_bench_samples_t *from);
/* Sorts the samples; 0 and 0 when there are none. */
void ferry_bench_samples_summary(ferry_bench_samples_t *s, double *median_p, double *p99_p);
void ferry_bench_samples_free(ferry_bench_samples_t *s);

/* --pingpong: where the send block starts in a side's buffer, past the
 * receive block at 0 and in other cache lines (the peer writes the receive
 * block while this side writes its send block: sharing a line would make
 * every round trip pay for moving it back and forth); the buffer holds
 * ferry_bench_pingpong_size(block) bytes. */
size_t ferry_bench_pingpong_stride(size_t block);
size_t ferry_bench_pingpong_size(size_t block);
/* Initiator side: buffer (ferry_bench_pingpong_size(block), registered for
 * remote writes) exchanges writes with the target's buffer at remote for duration
 * seconds; prints the PINGPONG line.  0 on success. */
int ferry_bench_pingpong_initiator(ferry_engine_h engine, ferry_segment_h segment,
                                   uint64_t remote, unsigned char *buffer, size_t block,
                                   double duration);
/* Target side: answer the exchange a "PINGPONG ..." notify asks for, with
 * buffer (size bytes) as the receive and send blocks; 0 when the notify is
 * something else or the exchange ended well. */
int ferry_bench_pingpong_target(ferry_engine_h engine, const ferry_notify_t *hello,
                                unsigned char *buffer, size_t size);

/* --metadata-ops: control-plane latency, in ferry_bench_metadata.c */
int ferry_bench_metadata_main(int argc, char **argv);

#endif
