/*
 * Device memory to and from storage: a request whose local buffer is device
 * memory and whose target is a storage buffer this process reaches itself
 * (its own, or a same-host peer's the file transport opened).  Two ways:
 *
 *  - cuFile (cufile.c, cuda memory only): the whole range in one call; in
 *    native mode the storage DMAs into GPU memory.
 *  - pinned staging: pread into a page-locked buffer of the engine's stage
 *    pool and a host-to-device copy, or the reverse; stage.c's stage_in and
 *    stage_out pipeline it over two buffers, so the device copy of one
 *    overlaps the file I/O of the next.  The same pool and lanes as every
 *    other staged transfer: no second pool.
 *
 * FERRY_STORAGE_GPU chooses: cufile, staging, or auto, which takes cuFile
 * only where it runs native.  In compatibility mode cuFile itself reads
 * into host buffers and copies, as staging does, but one call at a time
 * and through its own buffers: the issue asks for staging "where cuFile is
 * absent or slower", and which is faster there has not been measured yet
 * (contrib/gpu-check.sh measures it).
 *
 * Direct I/O: as the file transport's (its README): an I/O whose file
 * offset, length and buffer are aligned to the key's alignment goes to the
 * O_DIRECT descriptor where there is one; otherwise the page cache, unless
 * the storage takes direct I/O only (DIRECT, SHARED): then it FAILS.
 * Staging decides per chunk (its buffers are page-aligned); cuFile for the
 * whole range (the device pointer's alignment counts).
 */
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

typedef enum gpu_path { PATH_STAGING, PATH_CUFILE } gpu_path_t;

ferry_status_t ferry_storage_gpu_check(const char *mode)
{
    if (strcmp(mode, "auto") == 0 || strcmp(mode, "cufile") == 0 ||
        strcmp(mode, "staging") == 0)
        return FERRY_OK;
    ferry_error("FERRY_STORAGE_GPU=\"%.64s\": not auto, cufile or staging", mode);
    return FERRY_ERR_INVALID_PARAM;
}

static int aligned(uint64_t value, uint32_t align)
{
    return align == 0 || (value & (align - 1)) == 0;
}

/* The descriptor for an I/O of [offset, +length) from or to buffer, or -1
 * (logged) when the storage takes direct I/O only and this one cannot be. */
static int choose_fd(const ferry_storage_fds_t *fds, uint64_t buffer, size_t length,
                     uint64_t offset)
{
    int fits = aligned(offset, fds->align) && aligned(length, fds->align) &&
               aligned(buffer, fds->align);
    if (fits && fds->fd_direct >= 0)
        return fds->fd_direct;
    if (!(fds->options & (FERRY_STORAGE_DIRECT | FERRY_STORAGE_SHARED)) && fds->fd >= 0)
        return fds->fd;
    ferry_error("storage %s: a %zu-byte I/O of device memory at offset %llu %s; this storage "
                "allows direct I/O only, aligned to %u", fds->path, length,
                (unsigned long long)offset,
                fits ? "cannot be direct here (no O_DIRECT)" : "is not aligned", fds->align);
    return -1;
}

/* Which way, for device memory of vendor; FERRY_ERR_UNSUPPORTED (logged)
 * when cuFile is forced and cannot serve it. */
static ferry_status_t choose_path(const ferry_engine_t *engine, const ferry_accel_ops_t *vendor,
                                  gpu_path_t *path_p)
{
    const char *mode = engine->settings.storage_gpu;
    int cuda = strcmp(vendor->kind, "cuda") == 0;
    *path_p = PATH_STAGING;
    if (strcmp(mode, "staging") == 0)
        return FERRY_OK;
    if (strcmp(mode, "cufile") != 0) { /* auto */
        if (cuda && ferry_cufile_load(NULL) == FERRY_CUFILE_NATIVE)
            *path_p = PATH_CUFILE;
        return FERRY_OK;
    }
    const char *why;
    if (!cuda) {
        ferry_error("FERRY_STORAGE_GPU=cufile: cuFile moves cuda memory only; this is %s memory",
                    vendor->kind);
        return FERRY_ERR_UNSUPPORTED;
    }
    if (ferry_cufile_load(&why) == FERRY_CUFILE_ABSENT) {
        ferry_error("FERRY_STORAGE_GPU=cufile: %s", why);
        return FERRY_ERR_UNSUPPORTED;
    }
    *path_p = PATH_CUFILE;
    return FERRY_OK;
}

/* One staged run: where the next chunk goes in the file. */
typedef struct staged_io {
    const ferry_storage_fds_t *fds;
    uint64_t offset;
    int rw_flags;
} staged_io_t;

/* stage_in's fill: the next chunk read from the file. */
static ferry_status_t read_chunk(void *arg, void *buffer, size_t length)
{
    staged_io_t *io = arg;
    int fd = choose_fd(io->fds, (uint64_t)(uintptr_t)buffer, length, io->offset);
    if (fd < 0)
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = ferry_storage_full_io(fd, 0, buffer, length, io->offset, 0);
    io->offset += length;
    return status;
}

/* stage_out's drain: the next chunk written to the file. */
static ferry_status_t write_chunk(void *arg, const void *buffer, size_t length)
{
    staged_io_t *io = arg;
    int fd = choose_fd(io->fds, (uint64_t)(uintptr_t)buffer, length, io->offset);
    if (fd < 0)
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = ferry_storage_full_io(fd, 1, (void *)buffer, length, io->offset,
                                                  io->rw_flags);
    io->offset += length;
    return status;
}

/* cuFile wants an O_DIRECT descriptor to go native; one that has only a
 * page-cache one (the owner's own) opens the same file again with
 * O_DIRECT through /proc/self/fd for an aligned I/O.  -1: none. */
static int reopen_direct(const ferry_storage_fds_t *fds, int write)
{
    char name[64];
    snprintf(name, sizeof(name), "/proc/self/fd/%d", fds->fd);
    return open(name, (write ? O_RDWR : O_RDONLY) | O_DIRECT | O_CLOEXEC);
}

static ferry_status_t cufile_io(const ferry_storage_fds_t *fds, int write, void *device,
                                size_t length, uint64_t offset)
{
    ferry_storage_fds_t own = *fds;
    int opened = -1;
    if (own.fd_direct < 0 && !(own.options & FERRY_STORAGE_BUFFERED) && own.fd >= 0 &&
        aligned(offset, own.align) && aligned(length, own.align) &&
        aligned((uint64_t)(uintptr_t)device, own.align))
        own.fd_direct = opened = reopen_direct(fds, write);
    int fd = choose_fd(&own, (uint64_t)(uintptr_t)device, length, offset);
    ferry_status_t status = fd < 0 ? FERRY_ERR_INVALID_PARAM
                                   : ferry_cufile_io(fd, write, device, length, offset);
    /* cuFile has no per-write flag: a durable write is synced after. */
    if (status == FERRY_OK && write && (own.options & FERRY_STORAGE_DURABLE) &&
        fdatasync(fd) != 0) {
        ferry_error("storage %s: fdatasync after a cuFile write: %s", fds->path,
                    strerror(errno));
        status = FERRY_ERR_IO;
    }
    if (opened >= 0)
        close(opened);
    return status;
}

ferry_status_t ferry_storage_device_io(ferry_engine_t *engine, const ferry_storage_fds_t *fds,
                                       int write, void *device, size_t length, uint64_t offset)
{
    ferry_accel_range_t range;
    const ferry_accel_ops_t *vendor = ferry_engine_accel_query(engine, device, &range);
    if (vendor == NULL) {
        ferry_error("storage %s: %p is no accelerator's device memory", fds->path, device);
        return FERRY_ERR_INVALID_PARAM;
    }
    gpu_path_t path;
    ferry_status_t status = choose_path(engine, vendor, &path);
    if (status != FERRY_OK)
        return status;
    if (path == PATH_CUFILE)
        return cufile_io(fds, write, device, length, offset);
    staged_io_t io = {
        .fds = fds,
        .offset = offset,
        .rw_flags = write && (fds->options & FERRY_STORAGE_DURABLE) ? RWF_DSYNC : 0,
    };
    if (write)
        return ferry_engine_stage_out(engine, NULL, device, length, write_chunk, &io);
    return ferry_engine_stage_in(engine, NULL, device, length, read_chunk, &io);
}

ferry_status_t ferry_storage_copy_device(ferry_engine_t *engine, const ferry_storage_t *storage,
                                         ferry_opcode_t opcode, uint64_t addr, void *device,
                                         size_t length)
{
    const ferry_storage_key_t *key = &storage->key;
    ferry_storage_fds_t fds = {
        .fd = storage->fd,
        .fd_direct = -1,
        .align = key->align,
        /* The owner's descriptor is page-cache I/O: direct-only storage
         * still takes it here, as ferry_storage_copy does. */
        .options = key->options & ~(unsigned)(FERRY_STORAGE_DIRECT | FERRY_STORAGE_SHARED),
        .path = key->path,
    };
    return ferry_storage_device_io(engine, &fds, opcode == FERRY_OP_WRITE, device, length,
                                   key->offset + (addr - key->addr));
}
