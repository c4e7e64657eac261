/*
 * Staging: device memory moved by a transport that takes host memory only
 * (tcp, shm, cxl, a UCX without GPU support) goes through page-locked host
 * buffers of the engine's pool.  Two users:
 *  - the initiator (batch.c): each slice of a request whose local buffer is
 *    device memory gets a buffer; a WRITE fills it from the device before
 *    the slice goes, a READ empties it onto the device when the slice is
 *    done;
 *  - a target-checked transport (tcp) writing into or reading from a
 *    registered device buffer: stage_in / stage_out, two buffers at a time,
 *    so the device copy of one overlaps the socket's work on the other.
 *
 * The pool: buffers of FERRY_STAGE_CHUNK bytes, page-locked by the vendor
 * up to FERRY_STAGE_PINNED_MAX bytes in all, plain heap memory past it (it
 * works, at pageable speed), kept on a free list under lock until the
 * engine goes.  Lanes (a stream and two events of one vendor) are pooled
 * the same way: creating them costs more than a small copy.
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

struct ferry_stage_chunk {
    void *buffer;
    const ferry_accel_ops_t *vendor; /* whose host_free releases it; NULL: heap */
    struct ferry_stage_chunk *next;  /* pool lock, on the free list */
};

typedef struct stage_lane {
    const ferry_accel_ops_t *vendor;
    void *stream;
    void *event[2];
    struct stage_lane *next;
} stage_lane_t;

void ferry_stage_pool_init(ferry_stage_pool_t *pool, size_t chunk_size, size_t pinned_max)
{
    memset(pool, 0, sizeof(*pool));
    pthread_mutex_init(&pool->lock, NULL);
    pool->chunk_size = chunk_size < 4096 ? 4096 : chunk_size;
    pool->pinned_max = pinned_max;
}

void ferry_stage_pool_fini(ferry_stage_pool_t *pool)
{
    for (ferry_stage_chunk_t *c = pool->chunks, *next; c; c = next) {
        next = c->next;
        if (c->vendor)
            c->vendor->host_free(c->buffer);
        else
            free(c->buffer);
        free(c);
    }
    for (stage_lane_t *l = pool->lanes, *next; l; l = next) {
        next = l->next;
        for (int i = 0; i < 2; i++)
            if (l->event[i])
                l->vendor->event_destroy(l->event[i]);
        if (l->stream)
            l->vendor->stream_destroy(l->stream);
        free(l);
    }
    pthread_mutex_destroy(&pool->lock);
}

ferry_stage_chunk_t *ferry_stage_get(ferry_engine_t *engine, const ferry_accel_ops_t *vendor)
{
    ferry_stage_pool_t *pool = &engine->stage;
    pthread_mutex_lock(&pool->lock);
    ferry_stage_chunk_t *chunk = pool->chunks;
    if (chunk != NULL)
        pool->chunks = chunk->next;
    int may_pin = chunk == NULL && pool->pinned + pool->chunk_size <= pool->pinned_max;
    if (may_pin)
        pool->pinned += pool->chunk_size; /* reserved; given back if pinning fails */
    pthread_mutex_unlock(&pool->lock);
    if (chunk != NULL)
        return chunk;
    if ((chunk = calloc(1, sizeof(*chunk))) == NULL)
        return NULL;
    if (may_pin && vendor->host_alloc(pool->chunk_size, &chunk->buffer) == FERRY_OK) {
        chunk->vendor = vendor;
        return chunk;
    }
    if (may_pin) {
        pthread_mutex_lock(&pool->lock);
        pool->pinned -= pool->chunk_size;
        pthread_mutex_unlock(&pool->lock);
    }
    if (posix_memalign(&chunk->buffer, 4096, pool->chunk_size) != 0) {
        free(chunk);
        return NULL;
    }
    return chunk;
}

void ferry_stage_put(ferry_engine_t *engine, ferry_stage_chunk_t *chunk)
{
    ferry_stage_pool_t *pool = &engine->stage;
    pthread_mutex_lock(&pool->lock);
    chunk->next = pool->chunks;
    pool->chunks = chunk;
    pthread_mutex_unlock(&pool->lock);
}

void *ferry_stage_buffer(const ferry_stage_chunk_t *chunk)
{
    return chunk->buffer;
}

static stage_lane_t *lane_get(ferry_engine_t *engine, const ferry_accel_ops_t *vendor,
                              int device)
{
    ferry_stage_pool_t *pool = &engine->stage;
    pthread_mutex_lock(&pool->lock);
    stage_lane_t **p = &pool->lanes;
    while (*p && (*p)->vendor != vendor)
        p = &(*p)->next;
    stage_lane_t *lane = *p;
    if (lane)
        *p = lane->next;
    pthread_mutex_unlock(&pool->lock);
    if (lane != NULL)
        return lane;
    if ((lane = calloc(1, sizeof(*lane))) == NULL)
        return NULL;
    lane->vendor = vendor;
    if (vendor->stream_create(device, &lane->stream) == FERRY_OK &&
        vendor->event_create(device, &lane->event[0]) == FERRY_OK &&
        vendor->event_create(device, &lane->event[1]) == FERRY_OK)
        return lane;
    ferry_error("staging: %s streams or events cannot be created", vendor->kind);
    for (int i = 0; i < 2; i++)
        if (lane->event[i])
            vendor->event_destroy(lane->event[i]);
    if (lane->stream)
        vendor->stream_destroy(lane->stream);
    free(lane);
    return NULL;
}

static void lane_put(ferry_engine_t *engine, stage_lane_t *lane)
{
    ferry_stage_pool_t *pool = &engine->stage;
    pthread_mutex_lock(&pool->lock);
    lane->next = pool->lanes;
    pool->lanes = lane;
    pthread_mutex_unlock(&pool->lock);
}

/* What one stage_in or stage_out uses: a lane and two buffers. */
typedef struct stage_run {
    ferry_engine_t *engine;
    const ferry_accel_ops_t *vendor;
    stage_lane_t *lane;
    ferry_stage_chunk_t *chunk[2];
    int busy[2]; /* a copy into or out of chunk[i] is queued behind event[i] */
} stage_run_t;

/* token: the registry entry of the device range, or NULL: the vendor is
 * the one whose memory device is. */
static ferry_status_t run_open(ferry_engine_t *engine, const ferry_reg_entry_t *entry,
                               const void *device_memory, stage_run_t *run)
{
    memset(run, 0, sizeof(*run));
    run->engine = engine;
    ferry_accel_range_t range;
    if (entry != NULL) {
        run->vendor = entry->accel;
        device_memory = (const void *)entry->addr;
    } else {
        run->vendor = ferry_engine_accel_query(engine, device_memory, &range);
    }
    if (run->vendor == NULL) {
        ferry_error("staging: %p is no accelerator's device memory", device_memory);
        return FERRY_ERR_INVALID_PARAM;
    }
    int device = run->vendor->pointer_query(device_memory, &range) == FERRY_OK ? range.device
                                                                             : 0;
    run->lane = lane_get(engine, run->vendor, device);
    run->chunk[0] = ferry_stage_get(engine, run->vendor);
    run->chunk[1] = ferry_stage_get(engine, run->vendor);
    if (run->lane && run->chunk[0] && run->chunk[1])
        return FERRY_OK;
    return FERRY_ERR_NO_MEMORY;
}

/* Wait for the copy behind buffer i, if any. */
static ferry_status_t run_wait(stage_run_t *run, int i)
{
    if (!run->busy[i])
        return FERRY_OK;
    run->busy[i] = 0;
    return run->vendor->event_wait(run->lane->event[i]);
}

static ferry_status_t run_copy(stage_run_t *run, int i, void *dst, const void *src, size_t n)
{
    ferry_status_t status = run->vendor->copy_async(run->lane->stream, dst, src, n);
    if (status == FERRY_OK)
        status = run->vendor->event_record(run->lane->event[i], run->lane->stream);
    run->busy[i] = status == FERRY_OK;
    return status;
}

/* Every queued copy waited for (no buffer goes back while the device may
 * still use it), then the lane and buffers go back. */
static ferry_status_t run_close(stage_run_t *run, ferry_status_t status)
{
    for (int i = 0; i < 2; i++) {
        ferry_status_t waited = run_wait(run, i);
        if (status == FERRY_OK)
            status = waited;
        if (run->chunk[i])
            ferry_stage_put(run->engine, run->chunk[i]);
    }
    if (run->lane)
        lane_put(run->engine, run->lane);
    return status;
}

ferry_status_t ferry_engine_stage_in(void *arg, void *token, void *dst, size_t length,
                                     ferry_status_t (*fill)(void *arg, void *buffer,
                                                            size_t length),
                                     void *fill_arg)
{
    ferry_engine_t *engine = arg;
    const ferry_reg_entry_t *entry = token;
    if (entry != NULL && entry->storage != NULL)
        return ferry_storage_stage_in(entry->storage, (uint64_t)(uintptr_t)dst, length, fill,
                                      fill_arg);
    stage_run_t run;
    ferry_status_t status = run_open(engine, token, dst, &run);
    size_t chunk = engine->stage.chunk_size;
    for (size_t offset = 0, i = 0; status == FERRY_OK && offset < length; i ^= 1) {
        size_t n = FERRY_MIN(chunk, length - offset);
        status = run_wait(&run, (int)i);
        if (status == FERRY_OK)
            status = fill(fill_arg, run.chunk[i]->buffer, n);
        if (status == FERRY_OK)
            status = run_copy(&run, (int)i, (char *)dst + offset, run.chunk[i]->buffer, n);
        offset += n;
    }
    return run_close(&run, status);
}

ferry_status_t ferry_engine_stage_out(void *arg, void *token, const void *src, size_t length,
                                      ferry_status_t (*drain)(void *arg, const void *buffer,
                                                              size_t length),
                                      void *drain_arg)
{
    ferry_engine_t *engine = arg;
    const ferry_reg_entry_t *entry = token;
    if (entry != NULL && entry->storage != NULL)
        return ferry_storage_stage_out(entry->storage, (uint64_t)(uintptr_t)src, length, drain,
                                       drain_arg);
    stage_run_t run;
    ferry_status_t status = run_open(engine, token, src, &run);
    size_t chunk = engine->stage.chunk_size;
    size_t n = FERRY_MIN(chunk, length);
    if (status == FERRY_OK)
        status = run_copy(&run, 0, run.chunk[0]->buffer, src, n);
    for (size_t offset = 0, i = 0; status == FERRY_OK && offset < length; i ^= 1) {
        size_t next = offset + n;
        size_t next_n = next < length ? FERRY_MIN(chunk, length - next) : 0;
        /* The next buffer fills from the device while this one drains. */
        if (next_n > 0)
            status = run_copy(&run, (int)(i ^ 1), run.chunk[i ^ 1]->buffer,
                              (const char *)src + next, next_n);
        if (status == FERRY_OK)
            status = run_wait(&run, (int)i);
        if (status == FERRY_OK)
            status = drain(drain_arg, run.chunk[i]->buffer, n);
        offset = next;
        n = next_n;
    }
    return run_close(&run, status);
}

int ferry_engine_access_is_device(void *engine, void *token)
{
    (void)engine;
    const ferry_reg_entry_t *entry = token;
    return entry->accel != NULL || entry->storage != NULL;
}
