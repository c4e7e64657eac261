/*
 * Change records of the server-backed stores (etcd, redis): what
 * publish_changes hands the store, kept until a write of the descriptor
 * takes it along (include/ferry/plugin.h, doc/metadata.md "Incremental
 * refresh").  Compiled into each module, like keys.c.
 *
 * On the server, beside a segment's key, a store keeps the records (one per
 * revision, opaque texts) and a head: the generation and the newest
 * revision.  A write stores, in this order or at once, the pending
 * records, the head, the descriptor.  A reader trusts the head: records
 * missing below it mean "fetch whole", never "nothing changed".  So
 * whenever the server's records may be incomplete (a revision without a
 * record, records lost with the server's data, too many waiting while it
 * was down, another generation), the next write first deletes them all
 * (`restart`) and writes the head alone: every reader behind it fetches
 * whole once.
 *
 * Lock: `lock` guards everything here; no network call is made with it.
 */
#ifndef FERRY_METADATA_MD_RECORDS_H
#define FERRY_METADATA_MD_RECORDS_H

#include <ferry/plugin.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* Records waiting while the server is away; past this the next write
 * restarts instead (the owner's log holds at most 256 steps too). */
#define FERRY_MD_RECORDS_PENDING_MAX 256
/* Old records are deleted when this many revisions fell off the owner's
 * log since the last deletion: one extra delete per so many publishes. */
#define FERRY_MD_RECORDS_PRUNE_EVERY 64
/* "<hex generation> <hex revision>": the head's text (etcd's value). */
#define FERRY_MD_HEAD_MAX 40

typedef struct ferry_md_record {
    uint64_t revision;
    char *text;
} ferry_md_record_t;

typedef struct ferry_md_records {
    pthread_mutex_t lock;
    ferry_md_record_t *pending; /* not written yet, revisions ascending */
    size_t n_pending;
    uint64_t generation;
    uint64_t newest;            /* 0: publish_changes never called */
    uint64_t oldest;            /* records below it may go */
    uint64_t pruned;            /* records below it were deleted */
    uint64_t restarts, restarts_done; /* differ: the next write restarts */
} ferry_md_records_t;

/* What one write carries: a copy, so the write runs without the lock. */
typedef struct ferry_md_records_batch {
    ferry_md_record_t *records;
    size_t n_records;
    uint64_t generation, newest;
    uint64_t prune_below;       /* 0: no deletion of old records */
    int restart;                /* delete every record first */
    uint64_t restarts;
} ferry_md_records_batch_t;

void ferry_md_records_init(ferry_md_records_t *records);
void ferry_md_records_fini(ferry_md_records_t *records);
/* publish_changes' arguments (text NULL: no record for revision). */
ferry_status_t ferry_md_records_add(ferry_md_records_t *records, uint64_t generation,
                                    uint64_t revision, uint64_t oldest, const char *text);
/* 0 when there is nothing to write (publish_changes never called). */
int ferry_md_records_take(ferry_md_records_t *records, ferry_md_records_batch_t *batch);
/* The server took batch: its records leave the pending list. */
void ferry_md_records_written(ferry_md_records_t *records, const ferry_md_records_batch_t *batch);
void ferry_md_records_batch_fini(ferry_md_records_batch_t *batch);
/* The server lost what it had (restart, expiry, lease): restart. */
void ferry_md_records_lost(ferry_md_records_t *records);
/* The segment is removed: forget everything. */
void ferry_md_records_clear(ferry_md_records_t *records);

void ferry_md_head_format(char *out, uint64_t generation, uint64_t newest);
/* 1 when text (length bytes) is a head. */
int ferry_md_head_parse(const char *text, size_t length, uint64_t *generation_p,
                        uint64_t *newest_p);

#endif
