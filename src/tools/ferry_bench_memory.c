/*
 * ferry_bench's buffers: where they come from (--memory, --local-memory,
 * --remote-memory) and how the benchmark fills and checks them.
 *
 * Device memory (cuda:N, hip:N, testgpu:N: any location that is not host
 * memory) is never touched by the CPU here: it may not be mapped in this
 * process at all (testgpu maps it PROT_NONE so that a dereference crashes).
 * Bytes go in and out of it through the public API only, as a user's
 * program would move them: a host buffer of this process and a transfer
 * within the engine's own segment, which the engine serves with the
 * device's own copy.
 */
#include "ferry_bench.h"
#include "../util/tsan_annotate.h"

#include <ferry/plugin.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Own-segment copies go through a host buffer of this size at most. */
#define STAGING_MAX ((size_t)4 << 20)

/* "file:PATH": a storage buffer (ferry_register_storage) of the file or
 * block device at PATH; its addresses are no memory, so it is filled and
 * checked through the engine, as device memory is. */
static const char *storage_path(const char *memory)
{
    return strncmp(memory, "file:", 5) == 0 ? memory + 5 : NULL;
}

int ferry_bench_memory_is_storage(const char *memory)
{
    return storage_path(memory) != NULL;
}

/* PATH's first size bytes, registered; a regular file is made or grown to
 * that size first. */
static ferry_status_t storage_acquire(ferry_engine_h engine, const char *path, size_t size,
                                      void **addr_p)
{
    struct stat st;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "ferry_bench: %s: %s\n", path, strerror(errno));
        return FERRY_ERR_IO;
    }
    int grown = fstat(fd, &st) == 0 && (!S_ISREG(st.st_mode) || (size_t)st.st_size >= size ||
                                        ftruncate(fd, (off_t)size) == 0);
    close(fd);
    if (!grown) {
        fprintf(stderr, "ferry_bench: %s: cannot make it %zu bytes\n", path, size);
        return FERRY_ERR_IO;
    }
    ferry_storage_region_t region = {.field_mask = FERRY_STORAGE_FIELD_LENGTH, .path = path,
                                     .length = size};
    return ferry_register_storage(engine, &region, addr_p);
}

int ferry_bench_memory_valid(const char *memory)
{
    if (strcmp(memory, "heap") == 0 || strcmp(memory, "ferry") == 0)
        return 1;
    if (storage_path(memory) != NULL)
        return storage_path(memory)[0] == '/';
    /* kind[:qualifier], the syntax ferry_alloc takes; "*" (detect from the
     * pointer) names no memory to allocate. */
    size_t i = 0;
    while ((memory[i] >= 'a' && memory[i] <= 'z') ||
           (i > 0 && ((memory[i] >= '0' && memory[i] <= '9') || memory[i] == '_')))
        i++;
    if (i == 0)
        return 0;
    if (memory[i] == '\0')
        return 1;
    if (memory[i] != ':' || memory[i + 1] == '\0')
        return 0;
    return strspn(memory + i + 1, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                  "0123456789_.-") == strlen(memory + i + 1);
}

const char *ferry_bench_memory_location(const char *memory)
{
    return strcmp(memory, "heap") == 0 || strcmp(memory, "ferry") == 0 ? "cpu" : memory;
}

int ferry_bench_memory_is_device(const char *memory)
{
    return !ferry_location_is_host(ferry_bench_memory_location(memory));
}

unsigned char *ferry_bench_buffer_acquire(ferry_engine_h engine, const char *memory, size_t size)
{
    void *p = NULL;
    ferry_status_t status;
    if (storage_path(memory) != NULL) {
        status = storage_acquire(engine, storage_path(memory), size, &p);
    } else if (strcmp(memory, "heap") != 0) {
        status =
            ferry_alloc(engine, size, ferry_bench_memory_location(memory), FERRY_REG_REMOTE, &p);
    } else if (posix_memalign(&p, 4096, size) != 0) {
        p = NULL;
        status = FERRY_ERR_NO_MEMORY;
    } else if ((status = ferry_register(engine, p, size, "cpu", FERRY_REG_REMOTE)) != FERRY_OK) {
        free(p);
    }
    if (status != FERRY_OK) {
        fprintf(stderr, "ferry_bench: cannot get a registered buffer of %zu bytes at %s: %s\n",
                size, ferry_bench_memory_location(memory), ferry_status_string(status));
        return NULL;
    }
    return p;
}

void ferry_bench_buffer_release(ferry_engine_h engine, const char *memory, unsigned char *buffer)
{
    if (storage_path(memory) != NULL) {
        ferry_unregister(engine, buffer);
    } else if (strcmp(memory, "heap") != 0) {
        ferry_free(engine, buffer);
    } else {
        ferry_unregister(engine, buffer);
        free(buffer);
    }
}

ferry_status_t ferry_bench_self_open(ferry_bench_self_t *self, ferry_engine_h engine)
{
    *self = (ferry_bench_self_t){.engine = engine};
    ferry_status_t status =
        ferry_segment_open(engine, ferry_engine_segment_name(engine), &self->segment);
    if (status != FERRY_OK)
        return status;
    status = ferry_batch_create(engine, 1, &self->batch);
    if (status != FERRY_OK)
        ferry_segment_close(engine, self->segment);
    return status;
}

void ferry_bench_self_close(ferry_bench_self_t *self)
{
    if (self->engine == NULL)
        return;
    ferry_batch_destroy(self->batch);
    ferry_segment_close(self->engine, self->segment);
    *self = (ferry_bench_self_t){0};
}

/* One request into (WRITE) or out of (READ) our own segment. */
static ferry_status_t self_copy(ferry_bench_self_t *self, ferry_opcode_t opcode, void *host,
                                const void *device, size_t length)
{
    ferry_request_t req = {.opcode = opcode,
                           .local = host,
                           .target = self->segment,
                           .target_offset = (uint64_t)(uintptr_t)device,
                           .length = length};
    ferry_status_t status = ferry_batch_submit(self->batch, &req, 1);
    return status == FERRY_OK ? ferry_batch_wait(self->batch, -1) : status;
}

ferry_status_t ferry_bench_put(ferry_bench_self_t *self, const char *memory, void *dst,
                               const void *src, size_t length)
{
    if (!ferry_bench_memory_is_device(memory)) {
        memcpy(dst, src, length);
        return FERRY_OK;
    }
    return self_copy(self, FERRY_OP_WRITE, (void *)src, dst, length);
}

ferry_status_t ferry_bench_get(ferry_bench_self_t *self, const char *memory, void *dst,
                               const void *src, size_t length)
{
    if (!ferry_bench_memory_is_device(memory)) {
        memcpy(dst, src, length);
        return FERRY_OK;
    }
    return self_copy(self, FERRY_OP_READ, dst, src, length);
}

ferry_status_t ferry_bench_fill(ferry_bench_self_t *self, const char *memory, unsigned char *buffer,
                                size_t length, unsigned char (*byte)(size_t index, void *arg),
                                void *arg)
{
    if (!ferry_bench_memory_is_device(memory)) {
        /* The target fills its buffer before it prints its segment, which
         * the initiator waits for before it reads: ordered through another
         * process, which ThreadSanitizer cannot follow (util/tsan_annotate.h). */
        FERRY_TSAN_IGNORE_BEGIN();
        for (size_t i = 0; i < length; i++)
            buffer[i] = byte(i, arg);
        FERRY_TSAN_IGNORE_END();
        return FERRY_OK;
    }
    size_t chunk = length < STAGING_MAX ? length : STAGING_MAX;
    unsigned char *staging = malloc(chunk);
    if (staging == NULL)
        return FERRY_ERR_NO_MEMORY;
    ferry_status_t status = FERRY_OK;
    for (size_t done = 0; done < length && status == FERRY_OK; done += chunk) {
        size_t n = length - done < chunk ? length - done : chunk;
        for (size_t i = 0; i < n; i++)
            staging[i] = byte(done + i, arg);
        status = self_copy(self, FERRY_OP_WRITE, staging, buffer + done, n);
    }
    free(staging);
    if (status == FERRY_OK && storage_path(memory) != NULL) {
        /* The fill's dirty pages written back and dropped now, not during
         * the measurement (fio's layout does the same before its run). */
        int fd = open(storage_path(memory), O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            fdatasync(fd);
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
    }
    return status;
}
