/*
 * Change records of the server-backed stores (etcd, redis): what
 * publish_changes hands the store (include/ferry/plugin.h, doc/metadata.md
 * "Incremental refresh").  Compiled into each module, like keys.c.
 *
 * On the server, beside a segment's key, a store keeps the records (one per
 * revision, opaque texts) and a head: the generation and the newest
 * revision.  The descriptor under the key itself is a checkpoint, written
 * now and then (the engine decides when: plugin.h); the records after it
 * bring a reader to the head.  A write stores the records not written yet
 * and the head (and, when it is a checkpoint, the descriptor) in one
 * request, or in order.  A reader trusts the head: records missing below it
 * mean "fetch whole", never "nothing changed".
 *
 * The records since the last checkpoint stay here after they are written:
 * a server that lost its data gets the checkpoint, those records and the
 * head again (the keeper), so a reader that fetches whole then still
 * reaches the head.  When the records cannot be complete (a revision with
 * no record, another generation), the next write first deletes every record
 * on the server (`restart`), and the engine writes a checkpoint at that
 * revision.
 *
 * Lock: `lock` guards everything here; no network call is made with it.
 */
#ifndef FERRY_METADATA_MD_RECORDS_H
#define FERRY_METADATA_MD_RECORDS_H

#include <ferry/plugin.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* Records kept since the last checkpoint; past this publish_changes says
 * FERRY_ERR_NO_RESOURCE and the engine writes a checkpoint (it writes one
 * well before: engine_publish.c). */
#define FERRY_MD_RECORDS_KEPT_MAX 256
/* Old records are deleted when this many revisions fell off the owner's
 * log since the last deletion: one extra delete per so many publishes. */
#define FERRY_MD_RECORDS_PRUNE_EVERY 64
/* What a server may hold above a reader. */
#define FERRY_MD_RECORDS_FETCH_MAX (FERRY_MD_RECORDS_KEPT_MAX + FERRY_MD_RECORDS_PRUNE_EVERY)
/* "<hex generation> <hex revision>": the head's text (etcd's value). */
#define FERRY_MD_HEAD_MAX 40

typedef struct ferry_md_record {
    uint64_t revision;
    char *text;
} ferry_md_record_t;

typedef struct ferry_md_records {
    pthread_mutex_t lock;
    ferry_md_record_t *kept;    /* since the checkpoint, revisions ascending */
    size_t n_kept;
    size_t n_written;           /* the first n_written of kept are on the server */
    uint64_t generation;
    uint64_t newest;            /* 0: publish_changes never called */
    uint64_t head_written;      /* the newest revision the server's head says */
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
/* publish_changes' arguments (text NULL: no record for revision).
 * FERRY_ERR_NO_RESOURCE: too many since the checkpoint (kept as a gap). */
ferry_status_t ferry_md_records_add(ferry_md_records_t *records, uint64_t generation,
                                    uint64_t revision, uint64_t oldest, const char *text);
/* The descriptor being published is the checkpoint at the newest revision:
 * the records up to it need not be kept. */
void ferry_md_records_checkpoint(ferry_md_records_t *records);
/* Whether something is not on the server yet. */
int ferry_md_records_pending(ferry_md_records_t *records);
/* 0 when there is nothing to write (publish_changes never called); all:
 * every kept record (after a loss), else those not written yet. */
int ferry_md_records_take(ferry_md_records_t *records, ferry_md_records_batch_t *batch);
/* The server took batch. */
void ferry_md_records_written(ferry_md_records_t *records, const ferry_md_records_batch_t *batch);
void ferry_md_records_batch_fini(ferry_md_records_batch_t *batch);
/* The server lost what it had (restart, expiry, lease): delete what may
 * be left and write the kept records again. */
void ferry_md_records_lost(ferry_md_records_t *records);
/* The segment is removed: forget everything. */
void ferry_md_records_clear(ferry_md_records_t *records);

void ferry_md_head_format(char *out, uint64_t generation, uint64_t newest);
/* 1 when text (length bytes) is a head. */
int ferry_md_head_parse(const char *text, size_t length, uint64_t *generation_p,
                        uint64_t *newest_p);

#endif
