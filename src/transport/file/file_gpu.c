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
 * number per engine, taking ops from one queue.  stop lets them finish
 * what is queued (each op ends by exactly one ferry_file_op_finish), then
 * joins them.  Locks: gpu->lock guards the queue and stopping;
 * ferry_file_t.lock guards file->gpu while it is made.  No lock is held
 * across the I/O or slice_done.
 */
#include "file.h"

#include <stdlib.h>

struct ferry_file_gpu {
    ferry_file_t *file;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    ferry_file_op_t *head, **tail;
    int stopping;
    unsigned n_threads;
    pthread_t threads[];
};

static void run_op(ferry_file_t *file, ferry_file_op_t *op)
{
    const ferry_file_target_t *t = op->target;
    ferry_storage_fds_t fds = {
        .fd = t->fd,
        .fd_direct = t->fd_direct,
        .align = t->key.align,
        .options = t->key.options,
        .path = t->key.path,
    };
    ferry_status_t status = ferry_storage_device_io(file->svc.engine, &fds, op->write,
                                                    op->slice->local, op->slice->length,
                                                    op->offset);
    ferry_file_op_finish(file, op, status);
}

static void *worker(void *arg)
{
    struct ferry_file_gpu *gpu = arg;
    pthread_mutex_lock(&gpu->lock);
    for (;;) {
        while (gpu->head == NULL && !gpu->stopping)
            pthread_cond_wait(&gpu->wake, &gpu->lock);
        ferry_file_op_t *op = gpu->head;
        if (op == NULL)
            break; /* stopping, and nothing left */
        gpu->head = op->next;
        if (gpu->head == NULL)
            gpu->tail = &gpu->head;
        pthread_mutex_unlock(&gpu->lock);
        op->next = NULL;
        run_op(gpu->file, op);
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

void ferry_file_gpu_start(ferry_file_t *file, ferry_file_op_t *ops)
{
    struct ferry_file_gpu *gpu = gpu_get(file);
    if (gpu == NULL) {
        for (ferry_file_op_t *op = ops, *next; op != NULL; op = next) {
            next = op->next;
            ferry_file_op_finish(file, op, FERRY_ERR_NO_MEMORY);
        }
        return;
    }
    ferry_file_op_t *last = ops;
    while (last->next != NULL)
        last = last->next;
    pthread_mutex_lock(&gpu->lock);
    *gpu->tail = ops;
    gpu->tail = &last->next;
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
