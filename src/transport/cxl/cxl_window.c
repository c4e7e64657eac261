/*
 * The cxl window: open FERRY_CXL_PATH, learn its size, map it, and either
 * format its header (the first engine on an all-zero window) or check the
 * one another engine wrote.  Every failure is one error line naming the path
 * and the reason, and fails ferry_engine_create: the user asked for the
 * window.  Never FERRY_ERR_UNSUPPORTED here: that would skip the transport
 * without a word.
 */
#include "cxl.h"
#include "../../util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(ferry_cxl_header_t) <= FERRY_CXL_HEADER_BYTES, "the header fits its page");
_Static_assert(sizeof(ferry_cxl_chunk_t) == 40, "the table layout is version 1's");

#define ZERO_HINT "zero its first 4 KiB to start over: dd if=/dev/zero of=%s bs=4096 count=1 " \
                  "conv=notrunc"

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* A DAX device answers neither st_size nor BLKGETSIZE64: sysfs has its size. */
static int char_device_size(const struct stat *st, uint64_t *size_p)
{
    char path[96];
    snprintf(path, sizeof(path), "/sys/dev/char/%u:%u/size", major(st->st_rdev),
             minor(st->st_rdev));
    FILE *file = fopen(path, "r");
    unsigned long long size = 0;
    int ok = file != NULL && fscanf(file, "%llu", &size) == 1;
    if (file)
        fclose(file);
    *size_p = size;
    return ok;
}

static ferry_status_t device_size(ferry_cxl_window_t *window, uint64_t *size_p)
{
    struct stat st;
    if (fstat(window->fd, &st) != 0) {
        ferry_error("cxl: FERRY_CXL_PATH=%s: fstat failed: %s", window->path, strerror(errno));
        return FERRY_ERR_IO;
    }
    if (S_ISREG(st.st_mode)) {
        window->is_file = 1;
        *size_p = (uint64_t)st.st_size;
        return FERRY_OK;
    }
    if (S_ISBLK(st.st_mode)) {
        if (ioctl(window->fd, BLKGETSIZE64, size_p) == 0)
            return FERRY_OK;
        ferry_error("cxl: FERRY_CXL_PATH=%s: BLKGETSIZE64 failed: %s", window->path,
                    strerror(errno));
        return FERRY_ERR_IO;
    }
    if (S_ISCHR(st.st_mode)) {
        if (char_device_size(&st, size_p))
            return FERRY_OK;
        ferry_error("cxl: FERRY_CXL_PATH=%s: a character device without a size in "
                    "/sys/dev/char/%u:%u/size (not a DAX device?)", window->path,
                    major(st.st_rdev), minor(st.st_rdev));
        return FERRY_ERR_INVALID_PARAM;
    }
    ferry_error("cxl: FERRY_CXL_PATH=%s is not a DAX device, a block device nor a regular file",
                window->path);
    return FERRY_ERR_INVALID_PARAM;
}

/* The chunk size and table that a window of that size gets: a function of
 * the size alone, so every engine computes the same layout. */
static void geometry(ferry_cxl_window_t *window, size_t size)
{
    size_t chunk = FERRY_CXL_MIN_CHUNK;
    while (size / chunk > FERRY_CXL_MAX_CHUNKS)
        chunk <<= 1;
    window->size = size;
    window->chunk_size = chunk;
    window->chunk_shift = (unsigned)__builtin_ctzll(chunk);
    window->n_chunks = (uint32_t)(size / chunk);
    size_t used = FERRY_CXL_HEADER_BYTES + (size_t)window->n_chunks * sizeof(ferry_cxl_chunk_t);
    window->reserved_chunks = (uint32_t)((used + chunk - 1) / chunk);
}

static int header_rest_is_zero(const ferry_cxl_window_t *window)
{
    const unsigned char *p = window->base;
    for (size_t i = sizeof(uint64_t); i < FERRY_CXL_HEADER_BYTES; i++)
        if (p[i] != 0)
            return 0;
    return 1;
}

static void id_to_hex(const uint8_t *id, char *hex)
{
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", id[i]);
}

/* We won the race from zero to FORMATTING: write the header, then say READY. */
static ferry_status_t format(ferry_cxl_window_t *window)
{
    ferry_cxl_header_t *h = window->header;
    h->version = FERRY_CXL_LAYOUT_VERSION;
    h->entry_size = sizeof(ferry_cxl_chunk_t);
    h->window_size = window->size;
    h->chunk_size = window->chunk_size;
    h->n_chunks = window->n_chunks;
    h->table_offset = FERRY_CXL_HEADER_BYTES;
    h->reserved_chunks = window->reserved_chunks;
    uint64_t id[2] = {ferry_random_u64(), ferry_random_u64()};
    memcpy(h->id, id, sizeof(h->id));
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    int rc = pthread_mutex_init(&h->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    if (rc != 0) {
        /* Back to all zero, so that another engine may try. */
        memset((unsigned char *)h + sizeof(uint64_t), 0, sizeof(*h) - sizeof(uint64_t));
        atomic_store(&h->state, 0);
        ferry_error("cxl: FERRY_CXL_PATH=%s: cannot make the window's lock: %s", window->path,
                    strerror(rc));
        return FERRY_ERR_NO_RESOURCE;
    }
    ferry_cxl_table_format(window);
    atomic_store(&h->state, FERRY_CXL_MAGIC);
    ferry_info("cxl: formatted the window in %s: %zu bytes, %u chunks of %zu", window->path,
               window->size, window->n_chunks, window->chunk_size);
    return FERRY_OK;
}

/* The header another engine wrote must describe exactly the window we map. */
static ferry_status_t validate(ferry_cxl_window_t *window, const char *size_source)
{
    const ferry_cxl_header_t *h = window->header;
    if (h->version != FERRY_CXL_LAYOUT_VERSION || h->entry_size != sizeof(ferry_cxl_chunk_t)) {
        ferry_error("cxl: FERRY_CXL_PATH=%s holds a window of layout version %u; this Ferry "
                    "reads version %d (" ZERO_HINT ")", window->path, h->version,
                    FERRY_CXL_LAYOUT_VERSION, window->path);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (h->window_size != window->size) {
        ferry_error("cxl: FERRY_CXL_PATH=%s changed size: its window was formatted for %" PRIu64
                    " bytes, %s is %zu now (" ZERO_HINT ")", window->path, h->window_size,
                    size_source, window->size, window->path);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (h->chunk_size != window->chunk_size || h->n_chunks != window->n_chunks ||
        h->table_offset != FERRY_CXL_HEADER_BYTES ||
        h->reserved_chunks != window->reserved_chunks) {
        ferry_error("cxl: FERRY_CXL_PATH=%s: the window header is corrupt (chunks of %" PRIu64
                    ", %" PRIu64 " chunks; expected %zu, %u) (" ZERO_HINT ")", window->path,
                    h->chunk_size, h->n_chunks, window->chunk_size, window->n_chunks,
                    window->path);
        return FERRY_ERR_INVALID_PARAM;
    }
    return FERRY_OK;
}

/*
 * Zero -> FORMATTING -> MAGIC, by compare-and-swap on the state word: of
 * engines starting at once, one formats and the others wait (bounded).  A
 * state word of zero in front of other bytes that are not is a foreign
 * header, unless it is an engine that just won the swap: look again a little
 * later before saying so.
 */
static ferry_status_t attach(ferry_cxl_window_t *window, const char *size_source)
{
    ferry_cxl_header_t *h = window->header;
    uint64_t deadline = ferry_time_ms() + FERRY_CXL_FORMAT_WAIT_MS;
    int nonzero_seen = 0;
    for (;;) {
        uint64_t state = atomic_load(&h->state);
        if (state == FERRY_CXL_MAGIC)
            return validate(window, size_source);
        if (state == 0 && !header_rest_is_zero(window)) {
            if (++nonzero_seen < 3) {
                sleep_ms(5);
                continue;
            }
            state = ~0ull; /* foreign */
        }
        if (state == 0) {
            uint64_t expected = 0;
            if (atomic_compare_exchange_strong(&h->state, &expected, FERRY_CXL_FORMATTING))
                return format(window);
            continue;
        }
        if (state != FERRY_CXL_FORMATTING) {
            ferry_error("cxl: FERRY_CXL_PATH=%s does not start with a Ferry window header "
                        "(neither zero nor ours); if it may be overwritten, " ZERO_HINT,
                        window->path, window->path);
            return FERRY_ERR_INVALID_PARAM;
        }
        if (ferry_time_ms() > deadline) {
            ferry_error("cxl: FERRY_CXL_PATH=%s: another engine began formatting the window "
                        "and did not finish in %d ms (it died?); " ZERO_HINT, window->path,
                        FERRY_CXL_FORMAT_WAIT_MS, window->path);
            return FERRY_ERR_TIMEOUT;
        }
        sleep_ms(1);
    }
}

static ferry_status_t open_failed(const char *path, int err)
{
    if (err == ENOENT)
        ferry_error("cxl: FERRY_CXL_PATH=%s does not exist (Ferry never creates the window; a "
                    "test window: truncate -s 1G /dev/shm/ferry-cxl)", path);
    else
        ferry_error("cxl: FERRY_CXL_PATH=%s cannot be opened: %s", path, strerror(err));
    return FERRY_ERR_IO;
}

ferry_status_t ferry_cxl_window_open(ferry_cxl_window_t *window,
                                     const ferry_cxl_settings_t *settings)
{
    memset(window, 0, sizeof(*window));
    window->path = settings->path;
    window->fd = open(settings->path, O_RDWR | O_CLOEXEC);
    if (window->fd < 0)
        return open_failed(settings->path, errno);
    uint64_t available;
    ferry_status_t status = device_size(window, &available);
    if (status != FERRY_OK)
        goto err_close;
    status = FERRY_ERR_INVALID_PARAM;
    if (settings->size > available) {
        ferry_error("cxl: FERRY_CXL_PATH=%s is too small: %" PRIu64 " bytes, FERRY_CXL_SIZE "
                    "asks for %zu", settings->path, available, settings->size);
        goto err_close;
    }
    if (available > SIZE_MAX) {
        ferry_error("cxl: FERRY_CXL_PATH=%s: %" PRIu64 " bytes do not fit the address space",
                    settings->path, available);
        goto err_close;
    }
    geometry(window, settings->size ? settings->size : (size_t)available);
    if (window->n_chunks <= window->reserved_chunks) {
        ferry_error("cxl: FERRY_CXL_PATH=%s: a window of %zu bytes is too small (header and "
                    "table need %zu, and at least one chunk of %zu more)", settings->path,
                    window->size, (size_t)window->reserved_chunks * window->chunk_size,
                    window->chunk_size);
        goto err_close;
    }
    void *base = mmap(NULL, window->size, PROT_READ | PROT_WRITE, MAP_SHARED, window->fd, 0);
    if (base == MAP_FAILED) {
        ferry_error("cxl: FERRY_CXL_PATH=%s: mmap of %zu bytes failed: %s (a DAX device maps "
                    "in multiples of its alignment, usually 2 MiB: see FERRY_CXL_SIZE)",
                    settings->path, window->size, strerror(errno));
        status = FERRY_ERR_IO;
        goto err_close;
    }
    window->base = base;
    window->header = base;
    window->table = (ferry_cxl_chunk_t *)(window->base + FERRY_CXL_HEADER_BYTES);
    status = attach(window, settings->size ? "FERRY_CXL_SIZE" : "the file");
    if (status != FERRY_OK) {
        ferry_cxl_window_close(window);
        return status;
    }
    id_to_hex(window->header->id, window->id);
    atomic_store(&window->size_checked_ms, ferry_time_ms());
    return FERRY_OK;

err_close:
    close(window->fd);
    window->fd = -1;
    return status;
}

void ferry_cxl_window_close(ferry_cxl_window_t *window)
{
    if (window->base != NULL)
        munmap(window->base, window->size);
    if (window->fd >= 0)
        close(window->fd);
    window->base = NULL;
    window->fd = -1;
}

int ferry_cxl_window_intact(ferry_cxl_window_t *window)
{
    if (!window->is_file)
        return 1; /* a device does not shrink */
    if (atomic_load_explicit(&window->shrunk, memory_order_relaxed))
        return 0;
    uint64_t now = ferry_time_ms();
    if (now - atomic_load(&window->size_checked_ms) < FERRY_CXL_SIZE_CHECK_MS)
        return 1;
    atomic_store(&window->size_checked_ms, now);
    struct stat st;
    if (fstat(window->fd, &st) != 0 || (uint64_t)st.st_size >= window->size)
        return 1;
    if (atomic_exchange(&window->shrunk, 1) == 0)
        ferry_error("cxl: the window file %s changed size: %lld bytes now, the window is %zu; "
                    "no more transfers through it", window->path, (long long)st.st_size,
                    window->size);
    return 0;
}

/* The first page of path, read without mapping all of it; a DAX device does
 * not read(): map its first 2 MiB (its usual alignment) instead. */
static int read_header_page(const char *path, unsigned char *page, char *why, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, len, "%s", strerror(errno));
        return 0;
    }
    ssize_t n = pread(fd, page, FERRY_CXL_HEADER_BYTES, 0);
    if (n != FERRY_CXL_HEADER_BYTES) {
        void *map = mmap(NULL, (size_t)2 << 20, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
            snprintf(why, len, "%s", n < 0 ? strerror(errno) : "shorter than 4 KiB");
            close(fd);
            return 0;
        }
        memcpy(page, map, FERRY_CXL_HEADER_BYTES);
        munmap(map, (size_t)2 << 20);
    }
    close(fd);
    return 1;
}

void ferry_cxl_window_describe(FILE *out, const ferry_cxl_settings_t *settings)
{
    if (settings->path == NULL || settings->path[0] == '\0') {
        fprintf(out, "cxl: not configured (FERRY_CXL_PATH is empty), built in\n");
        return;
    }
    static _Alignas(ferry_cxl_header_t) unsigned char page[FERRY_CXL_HEADER_BYTES];
    char why[128];
    if (!read_header_page(settings->path, page, why, sizeof(why))) {
        fprintf(out, "cxl: window %s: %s\n", settings->path, why);
        return;
    }
    const ferry_cxl_header_t *h = (const ferry_cxl_header_t *)page;
    uint64_t state = atomic_load(&h->state);
    char id[33];
    id_to_hex(h->id, id);
    if (state == FERRY_CXL_MAGIC)
        fprintf(out, "cxl: window %s, %" PRIu64 " bytes (FERRY_CXL_SIZE %zu), %" PRIu64
                " chunks of %" PRIu64 ", id %s, layout %u\n", settings->path, h->window_size,
                settings->size, h->n_chunks, h->chunk_size, id, h->version);
    else if (state == 0)
        fprintf(out, "cxl: window %s (FERRY_CXL_SIZE %zu): not formatted yet; the first engine "
                "formats it\n", settings->path, settings->size);
    else
        fprintf(out, "cxl: window %s: not a Ferry window (neither zero nor ours)\n",
                settings->path);
}
