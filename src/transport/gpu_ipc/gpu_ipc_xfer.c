/*
 * GPU IPC transfers: submit resolves every slice (the peer's allocation
 * opened or found in the cache, the range checked against what the open
 * mapped) before it queues anything, then queues each device's slices as one
 * run: asynchronous copies on one of the device's streams and one event
 * behind them.  A run is finished when its event is passed, found by the
 * progress op (ferry_batch_wait's spin, any thread) or by the one progress
 * thread of the transport, whichever looks first.
 */
#include "gpu_ipc.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- streams and events of a device ---- */

static ferry_status_t device_streams(ferry_gpu_ipc_t *gpu, int device)
{
    ferry_gpu_ipc_device_t *d = &gpu->devices[device];
    if (atomic_load_explicit(&d->ready, memory_order_acquire))
        return FERRY_OK;
    ferry_status_t status = FERRY_OK;
    pthread_mutex_lock(&d->lock);
    while (d->n_streams < gpu->settings.streams && status == FERRY_OK) {
        status = gpu->vendor->stream_create(device, &d->streams[d->n_streams]);
        if (status == FERRY_OK)
            d->n_streams++;
        else
            ferry_error("%s: cannot create a stream on device %d: %s", gpu->vendor->kind,
                        device, ferry_status_string(status));
    }
    if (status == FERRY_OK)
        atomic_store_explicit(&d->ready, 1, memory_order_release);
    pthread_mutex_unlock(&d->lock);
    return status;
}

static ferry_status_t event_get(ferry_gpu_ipc_t *gpu, int device, void **event_p)
{
    ferry_gpu_ipc_device_t *d = &gpu->devices[device];
    pthread_mutex_lock(&d->lock);
    void *event = d->n_events > 0 ? d->events[--d->n_events] : NULL;
    pthread_mutex_unlock(&d->lock);
    if (event != NULL) {
        *event_p = event;
        return FERRY_OK;
    }
    ferry_status_t status = gpu->vendor->event_create(device, event_p);
    if (status != FERRY_OK)
        ferry_error("%s: cannot create an event on device %d: %s", gpu->vendor->kind, device,
                    ferry_status_string(status));
    return status;
}

static void event_put(ferry_gpu_ipc_t *gpu, int device, void *event)
{
    ferry_gpu_ipc_device_t *d = &gpu->devices[device];
    pthread_mutex_lock(&d->lock);
    if (d->n_events == d->events_cap) {
        size_t cap = d->events_cap ? 2 * d->events_cap : 16;
        void **grown = realloc(d->events, cap * sizeof(*grown));
        if (grown != NULL) {
            d->events = grown;
            d->events_cap = cap;
        }
    }
    if (d->n_events < d->events_cap) {
        d->events[d->n_events++] = event;
        event = NULL;
    }
    pthread_mutex_unlock(&d->lock);
    if (event != NULL)
        gpu->vendor->event_destroy(event);
}

void ferry_gpu_ipc_devices_free(ferry_gpu_ipc_t *gpu)
{
    for (int i = 0; i < gpu->n_devices; i++) {
        ferry_gpu_ipc_device_t *d = &gpu->devices[i];
        for (unsigned s = 0; s < d->n_streams; s++)
            gpu->vendor->stream_destroy(d->streams[s]);
        for (size_t e = 0; e < d->n_events; e++)
            gpu->vendor->event_destroy(d->events[e]);
        free(d->events);
        pthread_mutex_destroy(&d->lock);
    }
    free(gpu->devices);
    gpu->devices = NULL;
    gpu->n_devices = 0;
}

/* ---- resolving a slice ---- */

/* Where a slice's remote range is in this process, and the device whose
 * stream copies it. */
typedef struct resolved {
    char *remote;
    int device;
    ferry_gpu_ipc_import_t *import;
} resolved_t;

static int range_inside(uint64_t addr, size_t length, uintptr_t base, size_t limit)
{
    return addr >= base && length <= limit && addr - base <= limit - length;
}

/* A same-process peer: its addresses are ours.  The range must lie in what
 * the key says and in one live allocation of the vendor's. */
static ferry_status_t resolve_self(ferry_gpu_ipc_t *gpu, const ferry_slice_t *s,
                                   const ferry_gpu_ipc_key_t *key, resolved_t *r)
{
    ferry_accel_range_t range;
    if (!range_inside(s->remote_addr, s->length, key->base, key->length) ||
        gpu->vendor->pointer_query((void *)(uintptr_t)s->remote_addr, &range) != FERRY_OK ||
        range.base != key->base ||
        (key->buffer_id != 0 && range.buffer_id != key->buffer_id) ||
        !range_inside(s->remote_addr, s->length, range.base, range.length))
        return FERRY_ERR_OUT_OF_RANGE;
    r->remote = (char *)(uintptr_t)s->remote_addr;
    r->device = range.device >= 0 && range.device < gpu->n_devices ? range.device : 0;
    r->import = NULL;
    return FERRY_OK;
}

static ferry_status_t resolve(ferry_gpu_ipc_t *gpu, ferry_gpu_ipc_peer_t *p,
                              const ferry_slice_t *s, resolved_t *r)
{
    ferry_gpu_ipc_key_t key;
    if (!ferry_gpu_ipc_key_parse(s->remote_key, &key))
        return FERRY_ERR_DECODE;
    if (p->self)
        return resolve_self(gpu, s, &key, r);
    ferry_gpu_ipc_import_t *import;
    ferry_status_t status = ferry_gpu_ipc_import_get(p, s->remote_key, &import);
    if (status != FERRY_OK)
        return status;
    /* What the open mapped bounds the copy, whatever the key claims. */
    size_t limit = FERRY_GPU_IPC_MIN(import->remote_length, import->mapped);
    if (!range_inside(s->remote_addr, s->length, import->remote_base, limit)) {
        ferry_error("%s: [0x%" PRIx64 ", +%zu) of pid %ld is outside its allocation "
                    "[0x%" PRIxPTR ", +%zu) as opened here: refused", gpu->vendor->kind,
                    s->remote_addr, s->length, p->pid, import->remote_base, limit);
        ferry_gpu_ipc_imports_put(p, &import, 1);
        return FERRY_ERR_OUT_OF_RANGE;
    }
    r->remote = import->local_base + (s->remote_addr - import->remote_base);
    r->import = import;
    if (import->device >= 0)
        r->device = import->device;
    else if (s->local_memh != NULL && ((const ferry_gpu_ipc_memh_t *)s->local_memh)->device >= 0)
        r->device = ((const ferry_gpu_ipc_memh_t *)s->local_memh)->device;
    else
        r->device = 0;
    return FERRY_OK;
}

/* ---- finishing runs ---- */

static void run_finish(ferry_gpu_ipc_t *gpu, ferry_gpu_ipc_run_t *run, ferry_status_t event_status)
{
    ferry_gpu_ipc_peer_t *p = run->peer;
    /* The bytes of a dead peer's slices went nowhere anyone reads. */
    int dead = !ferry_gpu_ipc_peer_alive(p, 0);
    if (run->event != NULL)
        event_put(gpu, run->device, run->event);
    ferry_gpu_ipc_imports_put(p, run->imports, run->n_slices);
    size_t k = 0;
    for (ferry_slice_t *s = run->slices, *next; s != NULL; s = next, k++) {
        next = s->next;
        ferry_status_t status = k >= run->failed_from ? run->status : event_status;
        if (dead)
            status = FERRY_ERR_PEER_FAILED;
        if (status != FERRY_OK && !dead)
            ferry_error("%s: %s of [0x%" PRIx64 ", +%zu) at pid %ld failed: %s",
                        gpu->vendor->kind, s->opcode == FERRY_OP_WRITE ? "write" : "read",
                        s->remote_addr, s->length, p->pid, ferry_status_string(status));
        s->next = NULL;
        gpu->svc.slice_done(s, status);
    }
    ferry_gpu_ipc_peer_put(p);
    free(run);
}

/* Unlink the runs whose events are passed (or failed) onto *done.  Caller
 * holds runs_lock. */
static void collect_done(ferry_gpu_ipc_t *gpu, ferry_gpu_ipc_run_t **done,
                         ferry_status_t *statuses, size_t max, size_t *n_p)
{
    ferry_gpu_ipc_run_t **rp = &gpu->runs, *prev = NULL;
    size_t n = 0;
    while (*rp != NULL && n < max) {
        ferry_gpu_ipc_run_t *run = *rp;
        ferry_status_t status = run->event ? gpu->vendor->event_query(run->event) : FERRY_OK;
        if (status == FERRY_INPROGRESS) {
            prev = run;
            rp = &run->next;
            continue;
        }
        *rp = run->next;
        if (gpu->runs_tail == run)
            gpu->runs_tail = prev;
        statuses[n] = status;
        done[n++] = run;
    }
    atomic_fetch_sub(&gpu->in_flight, (unsigned)n);
    *n_p = n;
}

#define DONE_PER_LOOK 64

/* One look at the runs in flight; finishes those done.  wait: take the
 * lock even when another thread holds it (the progress thread). */
static unsigned progress_once(ferry_gpu_ipc_t *gpu, int wait)
{
    ferry_gpu_ipc_run_t *done[DONE_PER_LOOK];
    ferry_status_t statuses[DONE_PER_LOOK];
    size_t n = 0;
    if (wait)
        pthread_mutex_lock(&gpu->runs_lock);
    else if (pthread_mutex_trylock(&gpu->runs_lock) != 0)
        return 0;
    if (gpu->stopping && !wait) {
        pthread_mutex_unlock(&gpu->runs_lock);
        return 0;
    }
    collect_done(gpu, done, statuses, DONE_PER_LOOK, &n);
    if (n > 0)
        gpu->completing++;
    pthread_mutex_unlock(&gpu->runs_lock);
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        run_finish(gpu, done[i], statuses[i]);
    pthread_mutex_lock(&gpu->runs_lock);
    if (--gpu->completing == 0 && gpu->stopping)
        pthread_cond_broadcast(&gpu->runs_cond);
    pthread_mutex_unlock(&gpu->runs_lock);
    return (unsigned)n;
}

unsigned ferry_gpu_ipc_progress(void *ctx)
{
    ferry_gpu_ipc_t *gpu = ctx;
    if (atomic_load_explicit(&gpu->in_flight, memory_order_relaxed) == 0)
        return 0;
    return progress_once(gpu, 0);
}

/* The transport's one thread: sleeps while nothing is in flight, else
 * looks at the events every poll_us. */
static void *progress_thread(void *arg)
{
    ferry_gpu_ipc_t *gpu = arg;
    pthread_mutex_lock(&gpu->runs_lock);
    while (!gpu->stopping) {
        if (gpu->runs == NULL) {
            gpu->thread_sleeping = 1;
            pthread_cond_wait(&gpu->runs_cond, &gpu->runs_lock);
            gpu->thread_sleeping = 0;
            continue;
        }
        pthread_mutex_unlock(&gpu->runs_lock);
        unsigned n = progress_once(gpu, 1);
        pthread_mutex_lock(&gpu->runs_lock);
        if (n == 0 && gpu->runs != NULL && !gpu->stopping) {
            struct timespec deadline;
            ferry_deadline_after_us(&deadline, CLOCK_MONOTONIC, gpu->settings.poll_us);
            pthread_cond_timedwait(&gpu->runs_cond, &gpu->runs_lock, &deadline);
        }
    }
    pthread_mutex_unlock(&gpu->runs_lock);
    return NULL;
}

ferry_status_t ferry_gpu_ipc_thread_start(ferry_gpu_ipc_t *gpu)
{
    int err = pthread_create(&gpu->thread, NULL, progress_thread, gpu);
    if (err != 0) {
        ferry_error("%s: cannot start the progress thread: %s", gpu->vendor->kind,
                    strerror(err));
        return FERRY_ERR_NO_RESOURCE;
    }
    gpu->thread_started = 1;
    return FERRY_OK;
}

/* Stop: no new submit, the thread joined, callers' progress out, then every
 * run still in flight waited for (so that no copy lands after we return)
 * and finished with what its event says. */
void ferry_gpu_ipc_stop(void *ctx)
{
    ferry_gpu_ipc_t *gpu = ctx;
    if (atomic_exchange(&gpu->stopped, 1) != 0)
        return;
    pthread_mutex_lock(&gpu->runs_lock);
    gpu->stopping = 1;
    pthread_cond_broadcast(&gpu->runs_cond);
    pthread_mutex_unlock(&gpu->runs_lock);
    if (gpu->thread_started)
        pthread_join(gpu->thread, NULL);
    gpu->thread_started = 0;
    pthread_mutex_lock(&gpu->runs_lock);
    while (gpu->completing > 0)
        pthread_cond_wait(&gpu->runs_cond, &gpu->runs_lock);
    ferry_gpu_ipc_run_t *runs = gpu->runs;
    gpu->runs = gpu->runs_tail = NULL;
    atomic_store(&gpu->in_flight, 0);
    pthread_mutex_unlock(&gpu->runs_lock);
    for (ferry_gpu_ipc_run_t *next; runs != NULL; runs = next) {
        next = runs->next;
        run_finish(gpu, runs, runs->event ? gpu->vendor->event_wait(runs->event) : FERRY_OK);
    }
}

/* ---- submit ---- */

/* Queue one run's copies and its event; a copy the vendor refuses fails
 * that slice and those after it (the ones before it still run). */
static void run_queue(ferry_gpu_ipc_t *gpu, ferry_gpu_ipc_run_t *run, const resolved_t *res)
{
    ferry_gpu_ipc_device_t *d = &gpu->devices[run->device];
    void *stream = d->streams[atomic_fetch_add(&d->next, 1) % d->n_streams];
    size_t k = 0;
    for (ferry_slice_t *s = run->slices; s != NULL; s = s->next, k++) {
        void *dst = s->opcode == FERRY_OP_WRITE ? res[k].remote : s->local;
        const void *src = s->opcode == FERRY_OP_WRITE ? s->local : res[k].remote;
        ferry_status_t status = gpu->vendor->copy_async(stream, dst, src, s->length);
        if (status != FERRY_OK) {
            run->status = status;
            run->failed_from = k;
            break;
        }
    }
    ferry_status_t status = gpu->vendor->event_record(run->event, stream);
    if (status != FERRY_OK) {
        /* Nothing tells us when the queued copies end: fail every slice now
         * (rare; the vendor said why). */
        ferry_error("%s: cannot record an event on device %d: %s; failing %zu slices",
                    gpu->vendor->kind, run->device, ferry_status_string(status), run->n_slices);
        event_put(gpu, run->device, run->event);
        run->event = NULL;
        run->status = status;
        run->failed_from = 0;
    }
    pthread_mutex_lock(&gpu->runs_lock);
    int stopping = gpu->stopping;
    if (!stopping) {
        run->next = NULL;
        if (gpu->runs_tail != NULL)
            gpu->runs_tail->next = run;
        else
            gpu->runs = run;
        gpu->runs_tail = run;
        atomic_fetch_add(&gpu->in_flight, 1);
        if (gpu->thread_sleeping)
            pthread_cond_signal(&gpu->runs_cond);
    }
    pthread_mutex_unlock(&gpu->runs_lock);
    if (stopping) /* the engine submits while it stops: finish here */
        run_finish(gpu, run, run->event ? gpu->vendor->event_wait(run->event) : FERRY_OK);
}

/* Slices of [first, ...) resolved to device `device`, moved into a run
 * (relinked in their order), with their imports and resolutions. */
static ferry_gpu_ipc_run_t *run_make(ferry_gpu_ipc_peer_t *p, ferry_slice_t **slices,
                                     resolved_t *res, size_t n, int device, resolved_t *run_res,
                                     int *taken)
{
    size_t count = 0;
    for (size_t k = 0; k < n; k++)
        count += !taken[k] && res[k].device == device;
    ferry_gpu_ipc_run_t *run = calloc(1, sizeof(*run) + count * sizeof(run->imports[0]));
    if (run == NULL)
        return NULL;
    ferry_slice_t **tail = &run->slices;
    size_t i = 0;
    for (size_t k = 0; k < n; k++) {
        if (taken[k] || res[k].device != device)
            continue;
        taken[k] = 1;
        *tail = slices[k];
        tail = &slices[k]->next;
        run->imports[i] = res[k].import;
        run_res[i++] = res[k];
    }
    *tail = NULL;
    atomic_fetch_add(&p->refs, 1);
    run->peer = p;
    run->n_slices = count;
    run->device = device;
    run->status = FERRY_OK;
    run->failed_from = count;
    return run;
}

/* Everything a submit allocates, in one block: slices as an array, their
 * resolutions, a scratch copy for the run being queued, taken marks. */
typedef struct submit_state {
    ferry_slice_t **slices;
    resolved_t *res, *run_res;
    int *taken;
    size_t n;
} submit_state_t;

static ferry_status_t state_make(submit_state_t *st, ferry_slice_t *slices)
{
    size_t n = 0;
    for (ferry_slice_t *s = slices; s != NULL; s = s->next)
        n++;
    size_t bytes = n * (sizeof(*st->slices) + 2 * sizeof(*st->res) + sizeof(*st->taken));
    char *block = calloc(1, bytes);
    if (block == NULL)
        return FERRY_ERR_NO_MEMORY;
    st->res = (resolved_t *)block;
    st->run_res = st->res + n;
    st->slices = (ferry_slice_t **)(st->run_res + n);
    st->taken = (int *)(st->slices + n);
    st->n = n;
    size_t k = 0;
    for (ferry_slice_t *s = slices; s != NULL; s = s->next)
        st->slices[k++] = s;
    return FERRY_OK;
}

static ferry_status_t check_slices(const ferry_slice_t *slices)
{
    if (slices == NULL)
        return FERRY_ERR_INVALID_PARAM;
    for (const ferry_slice_t *s = slices; s != NULL; s = s->next)
        if (s->length == 0 || s->local == NULL || s->remote_key == NULL ||
            (s->opcode != FERRY_OP_READ && s->opcode != FERRY_OP_WRITE))
            return FERRY_ERR_INVALID_PARAM;
    return FERRY_OK;
}

/* Resolve every slice, or none (imports taken so far given back). */
static ferry_status_t resolve_all(ferry_gpu_ipc_t *gpu, ferry_gpu_ipc_peer_t *p,
                                  submit_state_t *st)
{
    for (size_t k = 0; k < st->n; k++) {
        size_t taken = k;
        ferry_status_t status = resolve(gpu, p, st->slices[k], &st->res[k]);
        if (status == FERRY_OK) {
            taken = k + 1;
            status = device_streams(gpu, st->res[k].device);
        }
        if (status != FERRY_OK) {
            for (size_t j = 0; j < taken; j++)
                ferry_gpu_ipc_imports_put(p, &st->res[j].import, 1);
            return status;
        }
    }
    return FERRY_OK;
}

ferry_status_t ferry_gpu_ipc_submit(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices)
{
    ferry_gpu_ipc_t *gpu = ctx;
    ferry_status_t status = check_slices(slices);
    if (status != FERRY_OK)
        return status;
    if (atomic_load(&gpu->stopped))
        return FERRY_ERR_CANCELED;
    ferry_gpu_ipc_peer_t *p = ferry_gpu_ipc_peer_get(gpu, peer);
    if (p == NULL)
        return FERRY_ERR_DECODE;
    if (!ferry_gpu_ipc_peer_alive(p, 0)) {
        ferry_gpu_ipc_peer_put(p);
        return FERRY_ERR_PEER_FAILED;
    }
    submit_state_t st;
    status = state_make(&st, slices);
    if (status == FERRY_OK && (status = resolve_all(gpu, p, &st)) != FERRY_OK)
        free(st.res);
    if (status != FERRY_OK) {
        ferry_gpu_ipc_peer_put(p);
        return status;
    }
    /* One run per device, each with its event: made before any is queued,
     * so that a failure here leaves nothing queued. */
    ferry_gpu_ipc_run_t *runs[FERRY_GPU_IPC_MAX_DEVICES];
    resolved_t *run_res[FERRY_GPU_IPC_MAX_DEVICES];
    size_t n_runs = 0, used = 0;
    for (size_t k = 0; k < st.n && status == FERRY_OK; k++) {
        if (st.taken[k])
            continue;
        run_res[n_runs] = st.run_res + used;
        ferry_gpu_ipc_run_t *run = run_make(p, st.slices, st.res, st.n, st.res[k].device,
                                            run_res[n_runs], st.taken);
        if (run == NULL) {
            status = FERRY_ERR_NO_MEMORY;
            break;
        }
        runs[n_runs++] = run;
        used += run->n_slices;
        status = event_get(gpu, run->device, &run->event);
    }
    if (status != FERRY_OK) {
        /* Relink the slices as they came and give everything back. */
        for (size_t k = 0; k < st.n; k++) {
            st.slices[k]->next = k + 1 < st.n ? st.slices[k + 1] : NULL;
            ferry_gpu_ipc_imports_put(p, &st.res[k].import, 1);
        }
        for (size_t r = 0; r < n_runs; r++) {
            if (runs[r]->event != NULL)
                event_put(gpu, runs[r]->device, runs[r]->event);
            ferry_gpu_ipc_peer_put(p);
            free(runs[r]);
        }
        free(st.res);
        ferry_gpu_ipc_peer_put(p);
        return status;
    }
    for (size_t r = 0; r < n_runs; r++)
        run_queue(gpu, runs[r], run_res[r]);
    free(st.res);
    ferry_gpu_ipc_peer_put(p);
    return FERRY_OK;
}
