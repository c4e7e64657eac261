/*
 * Device memory to and from a peer's storage: the slices whose local
 * buffer is device memory (local_memory takes every accelerator's kind, so
 * the engine hands them over unstaged, local_device set).  Neither I/O
 * engine can take them (a device pointer never reaches a system call), so
 * each is one blocking ferry_storage_device_io (cuFile, or the engine's
 * pinned staging pipelined with the device copies) on threads of their own.
 *
 * The threads are made on the first such slice (an engine that never moves
 * device memory to storage has none): FERRY_FILE_THREADS of them, a fixed
 * number per engine, taking parts from one queue.  A request of at least
 * two PART_CHUNKS staging buffers is cut into parts (up to one per thread,
 * cut at multiples of the staging buffer, so an aligned request stays
 * aligned) that run at once: the storage sees several I/Os in flight and
 * the device copies go on several streams, where one pipeline would have
 * one of each.  The last part to end finishes the op (the first failure
 * is its status).  stop lets the threads finish what is queued (each op
 * ends by exactly one ferry_file_op_finish), then joins them.  Locks:
 * gpu->lock guards the queue and stopping; ferry_file_t.lock guards
 * file->gpu while it is made.  No lock is held across the I/O or
 * slice_done.
 */
#include "file.h"

#include <stdlib.h>

/* A part is at least this many staging buffers: below it, one pipeline. */
#define PART_CHUNKS 4

/* One op's parts, in one allocation; freed by the part that ends last. */
typedef struct gpu_part gpu_part_t;
typedef struct gpu_split {
    ferry_file_op_t *op;
    atomic_uint parts_left;
    atomic_int status; /* FERRY_OK until a part fails */
} gpu_split_t;

struct gpu_part {
    gpu_split_t *split;
    size_t at;     /* of the slice */
    size_t length;
    gpu_part_t *next; /* gpu->lock, in the queue */
};

struct ferry_file_gpu {
    ferry_file_t *file;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    gpu_part_t *head, **tail;
    int stopping;
    unsigned n_threads;
    pthread_t threads[];
};

static void run_part(ferry_file_t *file, gpu_part_t *part)
{
    gpu_split_t *split = part->split;
    ferry_file_op_t *op = split->op;
    const ferry_file_target_t *t = op->target;
    ferry_storage_fds_t fds = {
        .fd = t->fd,
        .fd_direct = t->fd_direct,
        .align = t->key.align,
        .options = t->key.options,
        .path = t->key.path,
    };
    ferry_status_t status = ferry_storage_device_io(file->svc.engine, &fds, op->write,
                                                    (char *)op->slice->local + part->at,
                                                    part->length, op->offset + part->at);
    int ok = FERRY_OK;
    if (status != FERRY_OK)
        atomic_compare_exchange_strong(&split->status, &ok, status);
    if (atomic_fetch_sub(&split->parts_left, 1) == 1) {
        ferry_file_op_finish(file, op, atomic_load(&split->status));
        free(split); /* the parts live in the same allocation */
    }
}

static void *worker(void *arg)
{
    struct ferry_file_gpu *gpu = arg;
    pthread_mutex_lock(&gpu->lock);
    for (;;) {
        while (gpu->head == NULL && !gpu->stopping)
            pthread_cond_wait(&gpu->wake, &gpu->lock);
        gpu_part_t *part = gpu->head;
        if (part == NULL)
            break; /* stopping, and nothing left */
        gpu->head = part->next;
        if (gpu->head == NULL)
            gpu->tail = &gpu->head;
        pthread_mutex_unlock(&gpu->lock);
        run_part(gpu->file, part);
        pthread_mutex_lock(&gpu->lock);
    }
    pthread_mutex_unlock(&gpu->lock);
    return NULL;
}

/* The threads, made once; NULL when they cannot be. */
static struct ferry_file_gpu *gpu_get(ferry_file_t *file)
{
    pthread_mutex_lock(&file->lock);
    struct ferry_file_gpu *gpu = file->gpu;
    if (gpu != NULL) {
        pthread_mutex_unlock(&file->lock);
        return gpu;
    }
    unsigned n = file->settings.threads;
    gpu = calloc(1, sizeof(*gpu) + n * sizeof(pthread_t));
    if (gpu != NULL) {
        gpu->file = file;
        gpu->tail = &gpu->head;
        pthread_mutex_init(&gpu->lock, NULL);
        pthread_cond_init(&gpu->wake, NULL);
        for (; gpu->n_threads < n; gpu->n_threads++)
            if (pthread_create(&gpu->threads[gpu->n_threads], NULL, worker, gpu) != 0)
                break;
        if (gpu->n_threads == 0) {
            ferry_error("file: no thread for device memory I/O could be made");
            pthread_cond_destroy(&gpu->wake);
            pthread_mutex_destroy(&gpu->lock);
            free(gpu);
            gpu = NULL;
        }
    }
    file->gpu = gpu;
    pthread_mutex_unlock(&file->lock);
    return gpu;
}

/* The op cut into its parts, linked by next, or NULL (out of memory). */
static gpu_part_t *split_op(const struct ferry_file_gpu *gpu, ferry_file_op_t *op,
                            size_t chunk)
{
    size_t length = op->slice->length;
    size_t n = length / (PART_CHUNKS * chunk);
    if (n > gpu->n_threads)
        n = gpu->n_threads;
    /* Storage that takes direct I/O only refuses an unaligned request:
     * whole, with one log line, not once per part. */
    const ferry_storage_key_t *key = &op->target->key;
    uint64_t misaligned = (op->offset | length) & (key->align - 1);
    if (n < 2 || (misaligned && (key->options & (FERRY_STORAGE_DIRECT | FERRY_STORAGE_SHARED))))
        n = 1;
    /* Each part a whole number of staging buffers, the last the rest. */
    size_t part_length = (length / n + chunk - 1) / chunk * chunk;
    n = (length + part_length - 1) / part_length; /* rounding up may leave fewer */
    gpu_split_t *split = malloc(sizeof(*split) + n * sizeof(gpu_part_t));
    if (split == NULL)
        return NULL;
    gpu_part_t *parts = (gpu_part_t *)(split + 1);
    split->op = op;
    atomic_init(&split->parts_left, (unsigned)n);
    atomic_init(&split->status, FERRY_OK);
    for (size_t i = 0; i < n; i++) {
        parts[i].split = split;
        parts[i].at = i * part_length;
        parts[i].length = i + 1 < n ? part_length : length - i * part_length;
        parts[i].next = i + 1 < n ? &parts[i + 1] : NULL;
    }
    return parts;
}

void ferry_file_gpu_start(ferry_file_t *file, ferry_file_op_t *ops)
{
    struct ferry_file_gpu *gpu = gpu_get(file);
    size_t chunk = ((ferry_engine_t *)file->svc.engine)->stage.chunk_size;
    gpu_part_t *head = NULL, **tail = &head;
    for (ferry_file_op_t *op = ops, *next; op != NULL; op = next) {
        next = op->next;
        op->next = NULL;
        gpu_part_t *parts = gpu != NULL ? split_op(gpu, op, chunk) : NULL;
        if (parts == NULL) {
            ferry_file_op_finish(file, op, FERRY_ERR_NO_MEMORY);
            continue;
        }
        *tail = parts;
        while (*tail != NULL)
            tail = &(*tail)->next;
    }
    if (head == NULL)
        return;
    pthread_mutex_lock(&gpu->lock);
    *gpu->tail = head;
    gpu->tail = tail;
    pthread_cond_broadcast(&gpu->wake);
    pthread_mutex_unlock(&gpu->lock);
}

void ferry_file_gpu_stop(ferry_file_t *file)
{
    struct ferry_file_gpu *gpu = file->gpu;
    if (gpu == NULL)
        return;
    pthread_mutex_lock(&gpu->lock);
    gpu->stopping = 1;
    pthread_cond_broadcast(&gpu->wake);
    pthread_mutex_unlock(&gpu->lock);
    for (unsigned i = 0; i < gpu->n_threads; i++)
        pthread_join(gpu->threads[i], NULL);
    pthread_cond_destroy(&gpu->wake);
    pthread_mutex_destroy(&gpu->lock);
    free(gpu);
    file->gpu = NULL;
}
