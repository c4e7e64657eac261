/*
 * Submit: each slice is checked against its key (inside the range, the
 * target reachable and writable, the owner alive), given the descriptor
 * its alignment allows, and handed to the I/O engine; a slice refused here
 * finishes at once, before any I/O.  Short transfers go on from where they
 * stopped (ferry_file_op_advance); a read that meets the end of the file
 * FAILS, never counts as success.
 */
#include "file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static ferry_file_op_t *op_alloc(ferry_file_t *file)
{
    pthread_mutex_lock(&file->op_lock);
    ferry_file_op_t *op = file->free_ops;
    if (op != NULL) {
        file->free_ops = op->next;
        file->n_free_ops--;
    }
    pthread_mutex_unlock(&file->op_lock);
    return op != NULL ? op : malloc(sizeof(*op));
}

static void op_free(ferry_file_t *file, ferry_file_op_t *op)
{
    pthread_mutex_lock(&file->op_lock);
    if (file->n_free_ops < FERRY_FILE_OP_CACHE) {
        op->next = file->free_ops;
        file->free_ops = op;
        file->n_free_ops++;
        op = NULL;
    }
    pthread_mutex_unlock(&file->op_lock);
    free(op);
}

void ferry_file_ops_free(ferry_file_t *file)
{
    for (ferry_file_op_t *op = file->free_ops, *next; op != NULL; op = next) {
        next = op->next;
        free(op);
    }
    file->free_ops = NULL;
    file->n_free_ops = 0;
}

void ferry_file_op_finish(ferry_file_t *file, ferry_file_op_t *op, ferry_status_t status)
{
    ferry_slice_t *slice = op->slice;
    int outside_engine = slice->local_device; /* file_gpu.c's: no event in the engine */
    ferry_file_target_put(op->target);
    op_free(file, op);
    slice->next = NULL;
    file->svc.slice_done(slice, status);
    /* after slice_done: a waiter blocked in the engine then sees it done */
    if (outside_engine && file->io->kick != NULL)
        file->io->kick(file->io_engine);
}

ferry_status_t ferry_file_op_advance(ferry_file_op_t *op, long n)
{
    if (n == -EINTR || n == -EAGAIN)
        return FERRY_INPROGRESS;
    if (n <= 0) {
        ferry_error("file: %s of %zu bytes at offset %llu of %s: %s",
                    op->write ? "write" : "read", op->left, (unsigned long long)op->offset,
                    op->target->key.path, n == 0 ? "the file ends first" : strerror((int)-n));
        return FERRY_ERR_IO;
    }
    if ((size_t)n > op->left)
        return FERRY_ERR_IO; /* the kernel never says so; no overrun counted as done */
    op->buffer += n;
    op->left -= (size_t)n;
    op->offset += (uint64_t)n;
    return op->left == 0 ? FERRY_OK : FERRY_INPROGRESS;
}

static int aligned(uint64_t value, uint32_t align)
{
    return (value & (align - 1)) == 0;
}

/* The descriptor for this I/O, or -1 with *status_p saying why none. */
static int choose_fd(ferry_file_target_t *t, const ferry_slice_t *slice, uint64_t offset,
                     ferry_status_t *status_p)
{
    const ferry_storage_key_t *key = &t->key;
    int fits = aligned(offset, key->align) && aligned(slice->length, key->align) &&
               aligned((uint64_t)(uintptr_t)slice->local, key->align);
    if (fits && t->fd_direct >= 0)
        return t->fd_direct;
    if (!(key->options & (FERRY_STORAGE_DIRECT | FERRY_STORAGE_SHARED)))
        return t->fd;
    if (!atomic_exchange(&t->unaligned_logged, 1))
        ferry_error("file: %s: a %zu-byte I/O at offset %llu (local %p) %s; this storage "
                    "allows direct I/O only (%s), aligned to %u", key->path, slice->length,
                    (unsigned long long)offset, slice->local,
                    fits ? "cannot be direct here (no O_DIRECT)" : "is not aligned",
                    key->options & FERRY_STORAGE_SHARED ? "shared between hosts"
                                                        : "FERRY_STORAGE_DIRECT",
                    key->align);
    *status_p = FERRY_ERR_INVALID_PARAM;
    return -1;
}

/* A checked op for the slice, or NULL with *status_p. */
static ferry_file_op_t *make_op(ferry_file_t *file, ferry_file_target_t *t,
                                ferry_slice_t *slice, ferry_status_t *status_p)
{
    const ferry_storage_key_t *key = &t->key;
    int write = slice->opcode == FERRY_OP_WRITE;
    if (!t->reachable) {
        *status_p = FERRY_ERR_UNSUPPORTED;
        return NULL;
    }
    if (slice->remote_addr < key->addr || slice->length > key->length ||
        slice->remote_addr - key->addr > key->length - slice->length) {
        ferry_error("file: refused [0x%llx, +%zu): outside the storage buffer [0x%llx, +%llu)",
                    (unsigned long long)slice->remote_addr, slice->length,
                    (unsigned long long)key->addr, (unsigned long long)key->length);
        *status_p = FERRY_ERR_OUT_OF_RANGE;
        return NULL;
    }
    if (write && !t->writable) {
        ferry_error("file: %s is not writable here", key->path);
        *status_p = FERRY_ERR_REMOTE_REFUSED;
        return NULL;
    }
    if (!ferry_file_target_owner_alive(file, t)) {
        *status_p = FERRY_ERR_PEER_FAILED;
        return NULL;
    }
    uint64_t offset = key->offset + (slice->remote_addr - key->addr);
    /* Device memory: file_gpu.c chooses per I/O (its buffers are not the
     * slice's). */
    int fd = slice->local_device ? -1 : choose_fd(t, slice, offset, status_p);
    if (fd < 0 && !slice->local_device)
        return NULL;
    ferry_file_op_t *op = op_alloc(file);
    if (op == NULL) {
        *status_p = FERRY_ERR_NO_MEMORY;
        return NULL;
    }
    *op = (ferry_file_op_t){
        .slice = slice,
        .target = t,
        .fd = fd,
        .write = write,
        .rw_flags = write && (key->options & FERRY_STORAGE_DURABLE) ? RWF_DSYNC : 0,
        .buffer = slice->local,
        .left = slice->length,
        .offset = offset,
    };
    return op;
}

ferry_status_t ferry_file_submit(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices)
{
    ferry_file_t *file = ctx;
    ferry_file_op_t *ops = NULL, **tail = &ops;
    ferry_file_op_t *device_ops = NULL, **device_tail = &device_ops;
    ferry_file_target_t *t = NULL;
    const char *t_key = NULL;
    for (ferry_slice_t *slice = slices, *next; slice != NULL; slice = next) {
        next = slice->next;
        slice->next = NULL;
        /* a run of slices of one buffer shares the lookup */
        if (t == NULL || slice->remote_key != t_key) {
            if (t != NULL)
                ferry_file_target_put(t);
            t = ferry_file_target_get(file, peer, slice->remote_key);
            t_key = slice->remote_key;
        }
        ferry_status_t status = FERRY_ERR_NO_MEMORY;
        ferry_file_op_t *op = t != NULL ? make_op(file, t, slice, &status) : NULL;
        if (op == NULL) {
            file->svc.slice_done(slice, status);
            continue;
        }
        atomic_fetch_add(&t->refs, 1); /* the op's */
        if (slice->local_device) {
            *device_tail = op;
            device_tail = &op->next;
            continue;
        }
        *tail = op;
        tail = &op->next;
    }
    if (t != NULL)
        ferry_file_target_put(t);
    if (ops != NULL)
        file->io->start(file->io_engine, ops);
    if (device_ops != NULL)
        ferry_file_gpu_start(file, device_ops);
    return FERRY_OK;
}
