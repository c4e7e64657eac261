/*
 * Storage buffers, the owner's side: open and check the region, reserve the
 * addresses peers name it by, make the key the descriptor carries.
 *
 * The addresses are a PROT_NONE, MAP_NORESERVE anonymous mapping of the
 * region's length: no memory, but an address range no memory registration
 * can overlap, so the registry's overlap and refcount rules hold unchanged
 * and target_offset keeps one meaning.  Nothing ever reads or writes it:
 * the engine's copies to its own segment and the transports go to the file
 * (the memory transports never get a storage buffer, engine_register.c).
 */
#include "core.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

static size_t map_skip(const ferry_storage_t *storage);

/* Direct-I/O alignment where the kernel does not say (no STATX_DIOALIGN):
 * a page satisfies every device and file system. */
#define DEFAULT_ALIGN 4096u

/* The size of the file or device, its direct-I/O alignment. */
static ferry_status_t measure(int fd, const struct stat *st, const char *path, uint64_t *size_p,
                              uint32_t *align_p)
{
    *align_p = DEFAULT_ALIGN;
    if (S_ISBLK(st->st_mode)) {
        int sector = 0;
        if (ioctl(fd, BLKGETSIZE64, size_p) != 0) {
            ferry_error("register storage %s: BLKGETSIZE64: %s", path, strerror(errno));
            return FERRY_ERR_IO;
        }
        if (ioctl(fd, BLKSSZGET, &sector) == 0 && sector > 0 &&
            (uint64_t)sector <= FERRY_STORAGE_ALIGN_MAX && !(sector & (sector - 1)))
            *align_p = (uint32_t)sector;
        return FERRY_OK;
    }
    *size_p = (uint64_t)st->st_size;
#ifdef STATX_DIOALIGN
    struct statx stx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
        (stx.stx_mask & STATX_DIOALIGN) && stx.stx_dio_offset_align != 0) {
        uint32_t align = stx.stx_dio_offset_align > stx.stx_dio_mem_align
                             ? stx.stx_dio_offset_align
                             : stx.stx_dio_mem_align;
        if (align <= FERRY_STORAGE_ALIGN_MAX && !(align & (align - 1)))
            *align_p = align;
    }
#endif
    return FERRY_OK;
}

void ferry_storage_wwid_of(const char *sysfs_root, uint64_t rdev, char *out, size_t size)
{
    char path[FERRY_STORAGE_PATH_MAX];
    out[0] = '\0';
    snprintf(path, sizeof(path), "%s/dev/block/%u:%u/wwid", sysfs_root, major(rdev),
             minor(rdev));
    FILE *file = fopen(path, "re");
    if (file == NULL)
        return;
    if (fgets(out, (int)size, file) == NULL)
        out[0] = '\0';
    fclose(file);
    size_t n = strlen(out);
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' '))
        out[--n] = '\0';
}

static ferry_status_t check_region(const ferry_storage_region_t *region, unsigned flags)
{
    if (region == NULL || region->path == NULL || region->path[0] != '/') {
        ferry_error("register storage: the path must be given, and absolute (peers open it)");
        return FERRY_ERR_INVALID_PARAM;
    }
    if (strlen(region->path) > FERRY_STORAGE_PATH_MAX) {
        ferry_error("register storage: path longer than %d bytes", FERRY_STORAGE_PATH_MAX);
        return FERRY_ERR_INVALID_PARAM;
    }
    unsigned options = region->field_mask & FERRY_STORAGE_FIELD_OPTIONS ? region->options : 0;
    if (options & ~(unsigned)(FERRY_STORAGE_BUFFERED | FERRY_STORAGE_DIRECT |
                              FERRY_STORAGE_DURABLE | FERRY_STORAGE_SHARED)) {
        ferry_error("register storage %s: unknown option bits 0x%x", region->path, options);
        return FERRY_ERR_INVALID_PARAM;
    }
    if ((options & FERRY_STORAGE_BUFFERED) &&
        (options & (FERRY_STORAGE_DIRECT | FERRY_STORAGE_SHARED))) {
        ferry_error("register storage %s: BUFFERED contradicts DIRECT and SHARED",
                    region->path);
        return FERRY_ERR_INVALID_PARAM;
    }
    if ((flags & FERRY_REG_REMOTE) == 0) {
        ferry_error("register storage %s: flags allow peers neither to read nor to write",
                    region->path);
        return FERRY_ERR_INVALID_PARAM;
    }
    return FERRY_OK;
}

/* Open, measure and identify; fills key (all but addr) and *fd_p. */
static ferry_status_t open_region(const ferry_storage_region_t *region, unsigned flags,
                                  const char *sysfs_root, ferry_storage_key_t *key, int *fd_p)
{
    int mode = flags & FERRY_REG_REMOTE_WRITE ? O_RDWR : O_RDONLY;
    int fd = open(region->path, mode | O_CLOEXEC);
    if (fd < 0) {
        ferry_error("register storage %s: open: %s", region->path, strerror(errno));
        return errno == ENOENT ? FERRY_ERR_NOT_FOUND
               : errno == EISDIR ? FERRY_ERR_INVALID_PARAM
                                 : FERRY_ERR_IO;
    }
    struct stat st;
    uint64_t size = 0;
    ferry_status_t status = fstat(fd, &st) == 0 ? FERRY_OK : FERRY_ERR_IO;
    if (status == FERRY_OK && !S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
        ferry_error("register storage %s: neither a regular file nor a block device",
                    region->path);
        status = FERRY_ERR_INVALID_PARAM;
    }
    if (status == FERRY_OK)
        status = measure(fd, &st, region->path, &size, &key->align);
    key->offset = region->field_mask & FERRY_STORAGE_FIELD_OFFSET ? region->offset : 0;
    key->length = region->field_mask & FERRY_STORAGE_FIELD_LENGTH ? region->length
                                                                   : size - FERRY_MIN(size,
                                                                                     key->offset);
    if (status == FERRY_OK && (key->length == 0 || key->offset > size ||
                               key->length > size - key->offset)) {
        ferry_error("register storage %s: [%llu, +%llu) is empty or past its end (%llu bytes)",
                    region->path, (unsigned long long)key->offset,
                    (unsigned long long)key->length, (unsigned long long)size);
        status = FERRY_ERR_OUT_OF_RANGE;
    }
    if (status != FERRY_OK) {
        close(fd);
        return status;
    }
    key->options = region->field_mask & FERRY_STORAGE_FIELD_OPTIONS ? region->options : 0;
    if (S_ISBLK(st.st_mode)) {
        key->kind = FERRY_STORAGE_KIND_BLOCK;
        key->dev = (uint64_t)st.st_rdev;
        ferry_storage_wwid_of(sysfs_root, key->dev, key->wwid, sizeof(key->wwid));
        if (key->wwid[0] != '\0' && !(key->options & FERRY_STORAGE_BUFFERED))
            key->options |= FERRY_STORAGE_SHARED;
    } else {
        key->kind = FERRY_STORAGE_KIND_FILE;
        key->dev = (uint64_t)st.st_dev;
        key->ino = (uint64_t)st.st_ino;
    }
    snprintf(key->path, sizeof(key->path), "%s", region->path);
    *fd_p = fd;
    return FERRY_OK;
}

ferry_status_t ferry_storage_open(const ferry_storage_region_t *region, unsigned flags,
                                  const char *host, const char *sysfs_root,
                                  ferry_storage_t **storage_p)
{
    *storage_p = NULL;
    ferry_status_t status = check_region(region, flags);
    if (status != FERRY_OK)
        return status;
    ferry_storage_t *storage = calloc(1, sizeof(*storage));
    if (storage == NULL)
        return FERRY_ERR_NO_MEMORY;
    storage->fd = -1;
    storage->writable = (flags & FERRY_REG_REMOTE_WRITE) != 0;
    snprintf(storage->key.host, sizeof(storage->key.host), "%s", host);
    status = open_region(region, flags, sysfs_root, &storage->key, &storage->fd);
    if (status != FERRY_OK)
        goto err_free;
    if (storage->key.length > SIZE_MAX - 4096) {
        status = FERRY_ERR_OUT_OF_RANGE;
        goto err_close;
    }
    storage->reserved_length = (size_t)storage->key.length;
    storage->reserved = mmap(NULL, storage->reserved_length, PROT_NONE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (storage->reserved == MAP_FAILED) {
        ferry_error("register storage %s: reserving %zu bytes of addresses: %s", region->path,
                    storage->reserved_length, strerror(errno));
        storage->reserved = NULL;
        status = FERRY_ERR_NO_MEMORY;
        goto err_close;
    }
    storage->key.addr = (uint64_t)(uintptr_t)storage->reserved;
    storage->key_text = ferry_storage_key_format(&storage->key);
    if (storage->key_text == NULL) {
        status = FERRY_ERR_NO_MEMORY;
        goto err_close;
    }
    *storage_p = storage;
    return FERRY_OK;
err_close:
    ferry_storage_close(storage);
    return status;
err_free:
    free(storage);
    return status;
}

void ferry_storage_close(ferry_storage_t *storage)
{
    if (storage == NULL)
        return;
    if (storage->reserved != NULL)
        munmap(storage->reserved, storage->reserved_length);
    void *mapped = atomic_load(&storage->mapped);
    if (mapped != NULL && mapped != MAP_FAILED)
        munmap(mapped, storage->reserved_length + map_skip(storage));
    if (storage->fd >= 0)
        close(storage->fd);
    free(storage->key_text);
    free(storage);
}

ferry_status_t ferry_storage_full_io(int fd, int write, void *buffer, size_t length,
                                     uint64_t offset, int rw_flags)
{
    char *p = buffer;
    while (length > 0) {
        struct iovec iov = {.iov_base = p, .iov_len = length};
        ssize_t n = write ? pwritev2(fd, &iov, 1, (off_t)offset, rw_flags)
                          : preadv2(fd, &iov, 1, (off_t)offset, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0) {
            ferry_error("storage: %s of %zu bytes at offset %llu: %s", write ? "pwrite" : "pread",
                        length, (unsigned long long)offset,
                        n == 0 ? "the file ends first" : strerror(errno));
            return FERRY_ERR_IO;
        }
        p += n;
        length -= (size_t)n;
        offset += (uint64_t)n;
    }
    return FERRY_OK;
}

ferry_status_t ferry_storage_copy(const ferry_storage_t *storage, ferry_opcode_t opcode,
                                  uint64_t addr, void *local, size_t length)
{
    uint64_t offset = storage->key.offset + (addr - storage->key.addr);
    int durable = (storage->key.options & FERRY_STORAGE_DURABLE) ? RWF_DSYNC : 0;
    return ferry_storage_full_io(storage->fd, opcode == FERRY_OP_WRITE, local, length, offset,
                                 opcode == FERRY_OP_WRITE ? durable : 0);
}

/* "WWID=PATH[;WWID=PATH...]": the path mapped to wwid, into path[size]. */
static int map_find(const char *map, const char *wwid, char *path, size_t size)
{
    size_t n = strlen(wwid);
    for (const char *p = map; p != NULL && *p != '\0';) {
        const char *end = strchr(p, ';');
        size_t item = end ? (size_t)(end - p) : strlen(p);
        if (item > n + 1 && strncmp(p, wwid, n) == 0 && p[n] == '=') {
            snprintf(path, size, "%.*s", (int)(item - n - 1), p + n + 1);
            return 1;
        }
        p = end ? end + 1 : NULL;
    }
    return 0;
}

int ferry_storage_wwid_find(const char *sysfs_root, const char *dev_root, const char *map,
                            const char *wwid, char *path, size_t size)
{
    if (wwid[0] == '\0')
        return 0;
    if (map_find(map, wwid, path, size))
        return 1;
    char dir_path[FERRY_STORAGE_PATH_MAX];
    snprintf(dir_path, sizeof(dir_path), "%s/block", sysfs_root);
    DIR *dir = opendir(dir_path);
    if (dir == NULL)
        return 0;
    int found = 0;
    for (struct dirent *d; !found && (d = readdir(dir)) != NULL;) {
        if (d->d_name[0] == '.')
            continue;
        char file_path[FERRY_STORAGE_PATH_MAX + 300], text[FERRY_STORAGE_WWID_MAX + 2];
        snprintf(file_path, sizeof(file_path), "%s/%s/wwid", dir_path, d->d_name);
        FILE *file = fopen(file_path, "re");
        if (file == NULL)
            continue;
        if (fgets(text, sizeof(text), file) != NULL) {
            text[strcspn(text, "\n")] = '\0';
            size_t n = strlen(text);
            while (n > 0 && text[n - 1] == ' ')
                text[--n] = '\0';
            if (strcmp(text, wwid) == 0) {
                snprintf(path, size, "%s/%s", dev_root, d->d_name);
                found = 1;
            }
        }
        fclose(file);
    }
    closedir(dir);
    return found;
}

/* The bounce buffer of a served request: a socket's worth per step, and
 * one allocation per request at most. */
#define STAGE_CHUNK ((size_t)1 << 20)

ferry_status_t ferry_storage_stage_in(const ferry_storage_t *storage, uint64_t addr,
                                      size_t length,
                                      ferry_status_t (*fill)(void *arg, void *buffer,
                                                             size_t length),
                                      void *arg)
{
    char *buffer = malloc(FERRY_MIN(length, STAGE_CHUNK));
    if (buffer == NULL)
        return FERRY_ERR_NO_MEMORY;
    ferry_status_t status = FERRY_OK;
    for (size_t done = 0; status == FERRY_OK && done < length;) {
        size_t n = FERRY_MIN(length - done, STAGE_CHUNK);
        status = fill(arg, buffer, n);
        if (status == FERRY_OK)
            status = ferry_storage_copy(storage, FERRY_OP_WRITE, addr + done, buffer, n);
        done += n;
    }
    free(buffer);
    return status;
}

ferry_status_t ferry_storage_stage_out(const ferry_storage_t *storage, uint64_t addr,
                                       size_t length,
                                       ferry_status_t (*drain)(void *arg, const void *buffer,
                                                               size_t length),
                                       void *arg)
{
    char *buffer = malloc(FERRY_MIN(length, STAGE_CHUNK));
    if (buffer == NULL)
        return FERRY_ERR_NO_MEMORY;
    ferry_status_t status = FERRY_OK;
    for (size_t done = 0; status == FERRY_OK && done < length;) {
        size_t n = FERRY_MIN(length - done, STAGE_CHUNK);
        status = ferry_storage_copy(storage, FERRY_OP_READ, addr + done, buffer, n);
        if (status == FERRY_OK)
            status = drain(arg, buffer, n);
        done += n;
    }
    free(buffer);
    return status;
}

/* Larger ranges are not mapped: the page tables of what peers read would
 * stay until unregister (2 MiB per GiB); sendfile serves them. */
#define MAP_MAX ((uint64_t)64 << 30)

static size_t map_skip(const ferry_storage_t *storage)
{
    return (size_t)(storage->key.offset % (uint64_t)sysconf(_SC_PAGESIZE));
}

/* The range's mapping, made by the first caller (concurrent first
 * callers: one mapping wins, the others are unmapped); NULL: none. */
static char *storage_mapped(ferry_storage_t *storage)
{
    void *mapped = atomic_load_explicit(&storage->mapped, memory_order_acquire);
    if (mapped == NULL) {
        size_t skip = map_skip(storage);
        void *made = MAP_FAILED;
        /* writable where peers may write (the descriptor is O_RDWR then) */
        int prot = PROT_READ | (storage->writable ? PROT_WRITE : 0);
        if (storage->key.length <= MAP_MAX)
            made = mmap(NULL, storage->reserved_length + skip, prot, MAP_SHARED, storage->fd,
                        (off_t)(storage->key.offset - skip));
        if (made == MAP_FAILED)
            ferry_debug("storage %s: not mapped (%s): tcp serves it by sendfile and splice",
                        storage->key.path, storage->key.length > MAP_MAX ? "too large"
                                                                         : strerror(errno));
        if (atomic_compare_exchange_strong_explicit(&storage->mapped, &mapped, made,
                                                    memory_order_acq_rel,
                                                    memory_order_acquire)) {
            mapped = made;
        } else if (made != MAP_FAILED) {
            munmap(made, storage->reserved_length + skip);
        }
    }
    return mapped == MAP_FAILED ? NULL : (char *)mapped + map_skip(storage);
}

ferry_status_t ferry_engine_storage_file(void *engine, void *token, uint64_t addr,
                                         ferry_storage_file_t *file)
{
    (void)engine;
    memset(file, 0, sizeof(*file));
    ferry_reg_entry_t *entry = token;
    ferry_storage_t *storage = entry != NULL ? entry->storage : NULL;
    /* DIRECT and SHARED storage keeps the staged path (stage_in,
     * stage_out): the owner asked for no page cache, which sendfile and
     * the mapping cannot avoid, and the staged path is where O_DIRECT
     * belongs. */
    if (storage == NULL ||
        (storage->key.options & (FERRY_STORAGE_DIRECT | FERRY_STORAGE_SHARED)))
        return FERRY_ERR_UNSUPPORTED;
    file->fd = storage->fd;
    file->offset = storage->key.offset + (addr - storage->key.addr);
    file->write_flags = (storage->key.options & FERRY_STORAGE_DURABLE) ? RWF_DSYNC : 0;
    char *mapped = storage_mapped(storage);
    if (mapped == NULL)
        return FERRY_OK;
    file->mapped = mapped + (addr - storage->key.addr);
    /* a durable write is pwritev2's (RWF_DSYNC), not a store to the page cache */
    if (storage->writable && !(storage->key.options & FERRY_STORAGE_DURABLE))
        file->mapped_writable = mapped + (addr - storage->key.addr);
    return FERRY_OK;
}
