/*
 * The test suite's accelerator vendor "testgpu": device memory without a
 * device, so that every GPU path of the engine runs in `make check`.
 *
 * An allocation is a memfd mapped twice:
 *   - the "device view", PROT_NONE: its address is the device pointer users
 *     and the engine see, so any CPU dereference of device memory by the
 *     engine faults (the bug the test wants to catch) instead of working by
 *     luck as it would with host memory;
 *   - the shadow, read-write: only this vendor's copies touch it.
 * A table of allocations (our own and those opened from peers) translates a
 * device-view address to its shadow; any other address is host memory and
 * is used as it is (unified addressing, like CUDA's).
 *
 * IPC: the handle names the memfd's descriptor number in the owner; the
 * opener takes a copy of that descriptor with pidfd_open + pidfd_getfd
 * (same-uid processes, so the owner allows any same-uid tracer at init for
 * Yama's ptrace_scope 1).  The memfd is named after the physical device and
 * the owner's buffer id, which lets the opener tell a live allocation from a
 * descriptor number the owner has since reused.
 *
 * Streams are worker threads with a queue of copies and event marks, so a
 * copy_async really completes later, on another thread.
 *
 * Settings (opt-in: a build of the suite must not grow test devices in
 * every engine): FERRY_TESTGPU_DEVICES=N physical devices,
 * FERRY_TESTGPU_VISIBLE_DEVICES="1,0" maps ordinals to physical devices as
 * CUDA_VISIBLE_DEVICES does; UUIDs stay with the physical device.
 *
 * Locks: table_lock guards the allocation table and the buffer id counter;
 * a stream's lock guards its queue and stop flag; an event's lock guards its
 * recorded/passed counters.  No lock is held across a copy.
 */
#include <ferry/accel.h>
#include <ferry/plugin.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#endif
#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif
#ifndef PR_SET_PTRACER_ANY
#define PR_SET_PTRACER_ANY ((unsigned long)-1)
#endif

#define TG_MAX_DEVICES  16
#define TG_MEMFD_PREFIX "ferry-testgpu:"

/* ---- settings and devices ---- */

typedef struct tg_settings {
    unsigned devices;
    char *visible;
} tg_settings_t;

static const ferry_setting_t tg_settings_table[] = {
    {"DEVICES", "0", "number of testgpu test devices (0: the vendor is off)",
     offsetof(tg_settings_t, devices), FERRY_SETTING_UINT},
    {"VISIBLE_DEVICES", "",
     "physical testgpu devices this process sees, in ordinal order (\"1,0\")",
     offsetof(tg_settings_t, visible), FERRY_SETTING_STRING},
};
#define TG_SETTINGS_COUNT (sizeof(tg_settings_table) / sizeof(tg_settings_table[0]))

static pthread_once_t tg_once = PTHREAD_ONCE_INIT;
static ferry_status_t tg_init_status;
static char tg_init_why[200];
static int tg_count;                    /* visible devices */
static int tg_physical[TG_MAX_DEVICES]; /* ordinal -> physical index */
static char tg_boot[9];                 /* 8 hex digits of the boot id */
static size_t tg_page;

/* ---- the allocation table ---- */

typedef struct tg_alloc {
    uintptr_t view;    /* the device pointer (PROT_NONE) */
    char *shadow;      /* where the bytes are accessed */
    size_t length;     /* both mappings' length (whole pages) */
    int device;        /* ordinal in this process */
    int physical;      /* physical device index */
    uint64_t id;       /* this process's buffer id */
    uint64_t owner_id; /* the owner's buffer id (== id for our own) */
    int fd;            /* the memfd, open while the allocation lives here */
    int opened;        /* 1: opened from a peer (ipc_close), 0: ours (mem_free) */
} tg_alloc_t;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static tg_alloc_t **table;
static size_t table_count, table_capacity;
static uint64_t next_buffer_id = 1;

static int table_add(tg_alloc_t *a)
{
    pthread_mutex_lock(&table_lock);
    if (table_count == table_capacity) {
        size_t capacity = table_capacity ? table_capacity * 2 : 16;
        tg_alloc_t **grown = realloc(table, capacity * sizeof(*grown));
        if (grown == NULL) {
            pthread_mutex_unlock(&table_lock);
            return -1;
        }
        table = grown;
        table_capacity = capacity;
    }
    if (a->id == 0)
        a->id = next_buffer_id++;
    table[table_count++] = a;
    pthread_mutex_unlock(&table_lock);
    return 0;
}

/* Called with table_lock held. */
static tg_alloc_t *table_find_locked(uintptr_t address)
{
    for (size_t i = 0; i < table_count; i++) {
        if (address >= table[i]->view && address - table[i]->view < table[i]->length)
            return table[i];
    }
    return NULL;
}

/* Unlink the entry that starts at view (and is of the given origin), or NULL. */
static tg_alloc_t *table_remove(uintptr_t view, int opened)
{
    tg_alloc_t *found = NULL;
    pthread_mutex_lock(&table_lock);
    for (size_t i = 0; i < table_count; i++) {
        if (table[i]->view == view && table[i]->opened == opened) {
            found = table[i];
            table[i] = table[--table_count];
            break;
        }
    }
    pthread_mutex_unlock(&table_lock);
    return found;
}

/* Map fd twice (view + shadow) into an entry like the template, and put it
 * in the table.  fd belongs to the entry from here on, failure included. */
static ferry_status_t alloc_enter(int fd, size_t length, const tg_alloc_t *template,
                                  tg_alloc_t **alloc_p)
{
    tg_alloc_t *a = malloc(sizeof(*a));
    if (a == NULL)
        goto err_close;
    void *view = mmap(NULL, length, PROT_NONE, MAP_SHARED, fd, 0);
    if (view == MAP_FAILED) {
        ferry_error("testgpu: mmap of the device view (%zu B): %s", length, strerror(errno));
        goto err_free;
    }
    void *shadow = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (shadow == MAP_FAILED) {
        ferry_error("testgpu: mmap of the shadow (%zu B): %s", length, strerror(errno));
        goto err_unmap_view;
    }
    *a = *template;
    a->view = (uintptr_t)view;
    a->shadow = shadow;
    a->length = length;
    a->fd = fd;
    if (table_add(a) != 0)
        goto err_unmap_shadow;
    *alloc_p = a;
    return FERRY_OK;

err_unmap_shadow:
    munmap(shadow, length);
err_unmap_view:
    munmap(view, length);
err_free:
    free(a);
err_close:
    close(fd);
    return FERRY_ERR_NO_RESOURCE;
}

/* mem_free and ipc_close: unlink, then unmap (the caller's copies are done). */
static void alloc_leave(void *view, int opened)
{
    if (view == NULL)
        return;
    tg_alloc_t *a = table_remove((uintptr_t)view, opened);
    if (a == NULL) {
        ferry_error("testgpu: %s of %p, which is no %s", opened ? "ipc_close" : "mem_free", view,
                    opened ? "opened allocation" : "allocation of ours");
        return;
    }
    munmap((void *)a->view, a->length);
    munmap(a->shadow, a->length);
    close(a->fd);
    free(a);
}

/* Where the vendor's copy reads or writes [ptr, ptr+length): the shadow for
 * device memory, ptr itself for host memory.  A range that starts in an
 * allocation and runs past its end is refused (a GPU would fault). */
static ferry_status_t translate(const void *ptr, size_t length, void **out_p)
{
    uintptr_t address = (uintptr_t)ptr;
    pthread_mutex_lock(&table_lock);
    tg_alloc_t *a = table_find_locked(address);
    if (a == NULL) {
        pthread_mutex_unlock(&table_lock);
        *out_p = (void *)ptr;
        return FERRY_OK;
    }
    size_t offset = address - a->view;
    if (length > a->length - offset) {
        pthread_mutex_unlock(&table_lock);
        ferry_error("testgpu: copy of %zu B at %p runs past its allocation (%zu B at %#" PRIxPTR
                    ")",
                    length, ptr, a->length, a->view);
        return FERRY_ERR_OUT_OF_RANGE;
    }
    *out_p = a->shadow + offset;
    pthread_mutex_unlock(&table_lock);
    return FERRY_OK;
}

/* Both ends of a copy. */
static ferry_status_t translate_copy(void *dst, const void *src, size_t length, void **to_p,
                                     void **from_p)
{
    if (length > 0 && (dst == NULL || src == NULL))
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = translate(dst, length, to_p);
    return status == FERRY_OK ? translate(src, length, from_p) : status;
}

/* ---- init and devices ---- */

static int parse_visible(const char *text, unsigned physical_count)
{
    if (text == NULL || text[0] == '\0') {
        for (unsigned i = 0; i < physical_count; i++)
            tg_physical[i] = (int)i;
        return (int)physical_count;
    }
    int count = 0;
    const char *p = text;
    while (*p != '\0') {
        char *end;
        errno = 0;
        long index = strtol(p, &end, 10);
        /* Like CUDA_VISIBLE_DEVICES: the list stops at the first bad entry. */
        if (end == p || errno != 0 || index < 0 || index >= (long)physical_count ||
            count == TG_MAX_DEVICES)
            break;
        tg_physical[count++] = (int)index;
        p = end;
        if (*p != ',')
            break;
        p++;
    }
    return count;
}

static void read_boot_id(void)
{
    char text[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        if (fgets(text, sizeof(text), f) == NULL)
            text[0] = '\0';
        fclose(f);
    }
    size_t n = 0;
    for (const char *p = text; *p != '\0' && n < 8; p++) {
        if ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))
            tg_boot[n++] = *p;
    }
    while (n < 8)
        tg_boot[n++] = '0';
    tg_boot[8] = '\0';
}

static void tg_init_once(void)
{
    tg_settings_t settings = {0};
    long page = sysconf(_SC_PAGESIZE);
    tg_page = page > 0 ? (size_t)page : 4096;
    if (ferry_settings_read("TESTGPU", tg_settings_table, TG_SETTINGS_COUNT, &settings) !=
        FERRY_OK) {
        snprintf(tg_init_why, sizeof(tg_init_why),
                 "testgpu: FERRY_TESTGPU_DEVICES or FERRY_TESTGPU_VISIBLE_DEVICES is invalid");
        tg_init_status = FERRY_ERR_UNSUPPORTED;
        return;
    }
    if (settings.devices == 0) {
        snprintf(tg_init_why, sizeof(tg_init_why),
                 "testgpu: set FERRY_TESTGPU_DEVICES=N to use the test devices");
        tg_init_status = FERRY_ERR_UNSUPPORTED;
        goto out;
    }
    unsigned physical = settings.devices < TG_MAX_DEVICES ? settings.devices : TG_MAX_DEVICES;
    tg_count = parse_visible(settings.visible, physical);
    if (tg_count == 0) {
        snprintf(tg_init_why, sizeof(tg_init_why),
                 "testgpu: no device (FERRY_TESTGPU_VISIBLE_DEVICES=\"%s\" names none of %u)",
                 settings.visible, physical);
        tg_init_status = FERRY_ERR_UNSUPPORTED;
        goto out;
    }
    read_boot_id();
    /* Peers of the same uid take our memfds with pidfd_getfd, which Yama's
     * ptrace_scope 1 allows only to a tracer we name; best effort (no Yama:
     * nothing to do). */
    (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    tg_init_status = FERRY_OK;
out:
    ferry_settings_release(tg_settings_table, TG_SETTINGS_COUNT, &settings);
}

static ferry_status_t tg_init(char *why, size_t why_length)
{
    pthread_once(&tg_once, tg_init_once);
    if (tg_init_status != FERRY_OK && why != NULL && why_length > 0)
        snprintf(why, why_length, "%s", tg_init_why);
    return tg_init_status;
}

static int tg_ready(void)
{
    pthread_once(&tg_once, tg_init_once);
    return tg_init_status == FERRY_OK;
}

static int tg_device_count(void)
{
    return tg_ready() ? tg_count : 0;
}

static int device_valid(int device)
{
    return tg_ready() && device >= 0 && device < tg_count;
}

static ferry_status_t tg_device_uuid(int device, char *uuid, size_t length)
{
    if (!device_valid(device) || uuid == NULL)
        return FERRY_ERR_INVALID_PARAM;
    int n = snprintf(uuid, length, "TESTGPU-%s-%d", tg_boot, tg_physical[device]);
    return n >= 0 && (size_t)n < length ? FERRY_OK : FERRY_ERR_INVALID_PARAM;
}

static ferry_status_t tg_device_describe(int device, char *text, size_t length)
{
    if (!device_valid(device) || text == NULL)
        return FERRY_ERR_INVALID_PARAM;
    snprintf(text, length,
             "testgpu physical device %d: memfd memory (no device), handles: memfd by pidfd_getfd",
             tg_physical[device]);
    return FERRY_OK;
}

/* The ordinal of a physical device here, -1 when this process does not see it. */
static int ordinal_of(int physical)
{
    for (int i = 0; i < tg_count; i++) {
        if (tg_physical[i] == physical)
            return i;
    }
    return -1;
}

/* ---- memory ---- */

static ferry_status_t tg_pointer_query(const void *ptr, ferry_accel_range_t *range_p)
{
    if (!tg_ready())
        return FERRY_ERR_NOT_FOUND;
    ferry_status_t status = FERRY_ERR_NOT_FOUND;
    pthread_mutex_lock(&table_lock);
    tg_alloc_t *a = table_find_locked((uintptr_t)ptr);
    if (a != NULL) {
        if (range_p != NULL)
            *range_p = (ferry_accel_range_t){a->view, a->length, a->device, a->id};
        status = FERRY_OK;
    }
    pthread_mutex_unlock(&table_lock);
    return status;
}

static ferry_status_t tg_mem_alloc(int device, size_t length, void **ptr_p)
{
    if (!device_valid(device) || length == 0 || ptr_p == NULL || length > SIZE_MAX - tg_page)
        return FERRY_ERR_INVALID_PARAM;
    size_t rounded = (length + tg_page - 1) / tg_page * tg_page;

    /* The memfd's name carries the buffer id, so take it first. */
    pthread_mutex_lock(&table_lock);
    uint64_t id = next_buffer_id++;
    pthread_mutex_unlock(&table_lock);

    char name[64];
    snprintf(name, sizeof(name), TG_MEMFD_PREFIX "%d:%" PRIu64, tg_physical[device], id);
    int fd = (int)syscall(SYS_memfd_create, name, MFD_CLOEXEC);
    if (fd < 0) {
        ferry_error("testgpu: memfd_create: %s", strerror(errno));
        return FERRY_ERR_NO_RESOURCE;
    }
    if (ftruncate(fd, (off_t)rounded) != 0) {
        ferry_error("testgpu: ftruncate of the memfd to %zu B: %s", rounded, strerror(errno));
        close(fd);
        return FERRY_ERR_NO_MEMORY;
    }
    tg_alloc_t template = {.device = device,
                           .physical = tg_physical[device],
                           .id = id,
                           .owner_id = id},
               *a;
    ferry_status_t status = alloc_enter(fd, rounded, &template, &a);
    if (status != FERRY_OK)
        return status;
    *ptr_p = (void *)a->view;
    return FERRY_OK;
}

static void tg_mem_free(void *ptr)
{
    alloc_leave(ptr, 0);
}

/* Host memory with its length in a page in front (host_free needs it). */
static ferry_status_t tg_host_alloc(size_t length, void **ptr_p)
{
    if (tg_page == 0)
        pthread_once(&tg_once, tg_init_once);
    if (length == 0 || ptr_p == NULL || length > SIZE_MAX - 2 * tg_page)
        return FERRY_ERR_INVALID_PARAM;
    size_t total = (length + tg_page - 1) / tg_page * tg_page + tg_page;
    char *block = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) {
        ferry_error("testgpu: host_alloc of %zu B: %s", length, strerror(errno));
        return FERRY_ERR_NO_MEMORY;
    }
    *(size_t *)block = total;
    (void)mlock(block + tg_page, total - tg_page); /* pinned if the limit allows */
    *ptr_p = block + tg_page;
    return FERRY_OK;
}

static void tg_host_free(void *ptr)
{
    if (ptr == NULL)
        return;
    char *block = (char *)ptr - tg_page;
    munmap(block, *(size_t *)block);
}

/* ---- IPC ---- */

static ferry_status_t tg_ipc_export(const ferry_accel_range_t *range, char *handle, size_t length)
{
    if (range == NULL || handle == NULL)
        return FERRY_ERR_INVALID_PARAM;
    pthread_mutex_lock(&table_lock);
    tg_alloc_t *a = table_find_locked(range->base);
    int fd = -1;
    size_t mapped = 0;
    uint64_t id = 0;
    if (a != NULL && !a->opened) {
        fd = a->fd;
        mapped = a->length;
        id = a->id;
    }
    pthread_mutex_unlock(&table_lock);
    if (fd < 0)
        return FERRY_ERR_NOT_FOUND;
    int n = snprintf(handle, length, "memfd:%d:%zu:%" PRIu64, fd, mapped, id);
    return n >= 0 && (size_t)n < length ? FERRY_OK : FERRY_ERR_INVALID_PARAM;
}

/* Whether our copy of a peer's descriptor is the testgpu memfd of the
 * owner's buffer owner_id; *physical_p from its name. */
static int memfd_is_ours(int fd, uint64_t owner_id, int *physical_p)
{
    char link[64], target[256];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof(target) - 1);
    if (n <= 0)
        return 0;
    target[n] = '\0';
    const char *prefix = "/memfd:" TG_MEMFD_PREFIX;
    if (strncmp(target, prefix, strlen(prefix)) != 0)
        return 0;
    int physical;
    uint64_t id;
    if (sscanf(target + strlen(prefix), "%d:%" SCNu64, &physical, &id) != 2 || id != owner_id)
        return 0;
    *physical_p = physical;
    return 1;
}

static ferry_status_t tg_ipc_open(const char *handle, long owner_pid, int device, void **base_p,
                                  size_t *length_p, void **opened_p)
{
    if (!tg_ready())
        return FERRY_ERR_UNSUPPORTED;
    int remote_fd;
    size_t claimed;
    uint64_t owner_id;
    int consumed = 0;
    if (handle == NULL ||
        sscanf(handle, "memfd:%d:%zu:%" SCNu64 "%n", &remote_fd, &claimed, &owner_id, &consumed) !=
            3 ||
        handle[consumed] != '\0' || remote_fd < 0 || owner_pid <= 0 || owner_pid > INT_MAX)
        return FERRY_ERR_INVALID_PARAM;
    if (device >= tg_count || device < -1)
        return FERRY_ERR_INVALID_PARAM;

    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)owner_pid, 0);
    if (pidfd < 0) {
        if (errno == ESRCH)
            return FERRY_ERR_STALE;
        ferry_error("testgpu: pidfd_open(%ld): %s", owner_pid, strerror(errno));
        return FERRY_ERR_IO;
    }
    int fd = (int)syscall(SYS_pidfd_getfd, pidfd, remote_fd, 0);
    int getfd_errno = errno;
    close(pidfd);
    if (fd < 0) {
        if (getfd_errno == EBADF || getfd_errno == ESRCH)
            return FERRY_ERR_STALE;
        ferry_error("testgpu: pidfd_getfd(pid %ld, fd %d): %s", owner_pid, remote_fd,
                    strerror(getfd_errno));
        return getfd_errno == EPERM ? FERRY_ERR_REMOTE_REFUSED : FERRY_ERR_IO;
    }
    /* The owner may have freed the allocation and reused the number for
     * another file or allocation: only the memfd of the named buffer is
     * taken, and with its true length. */
    int physical = -1;
    struct stat st;
    if (!memfd_is_ours(fd, owner_id, &physical) || fstat(fd, &st) != 0 || st.st_size <= 0) {
        close(fd);
        return FERRY_ERR_STALE;
    }
    /* Our ordinal of the owner's device; one we do not see counts as the
     * device the copies are issued on. */
    int ordinal = ordinal_of(physical);
    tg_alloc_t template = {.device = ordinal >= 0 ? ordinal : (device >= 0 ? device : 0),
                           .physical = physical,
                           .owner_id = owner_id,
                           .opened = 1},
               *a;
    ferry_status_t status = alloc_enter(fd, (size_t)st.st_size, &template, &a);
    if (status != FERRY_OK)
        return status;
    if (claimed != a->length)
        ferry_debug("testgpu: handle claims %zu B, the memfd has %zu B", claimed, a->length);
    *base_p = (void *)a->view;
    *length_p = a->length;
    *opened_p = (void *)a->view;
    return FERRY_OK;
}

static void tg_ipc_close(void *opened)
{
    alloc_leave(opened, 1);
}

/* ---- streams and events ---- */

typedef struct tg_event {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint64_t recorded; /* marks put in a stream */
    uint64_t passed;   /* the latest mark a stream has reached */
    /* Holders: the creator (until event_destroy) and each mark in a queue
     * (until its worker passes it): an event may be destroyed with a mark
     * still queued, as CUDA allows. */
    atomic_int refs;
} tg_event_t;

typedef enum { TG_ITEM_COPY, TG_ITEM_MARK } tg_item_kind_t;

typedef struct tg_item {
    struct tg_item *next;
    tg_item_kind_t kind;
    void *dst;
    const void *src;
    size_t length;
    tg_event_t *event;
    uint64_t mark;
} tg_item_t;

typedef struct tg_stream {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    tg_item_t *head, *tail;
    int stop;
} tg_stream_t;

static void event_put(tg_event_t *e)
{
    if (atomic_fetch_sub(&e->refs, 1) == 1) {
        pthread_cond_destroy(&e->cond);
        pthread_mutex_destroy(&e->lock);
        free(e);
    }
}

static void *stream_worker(void *arg)
{
    tg_stream_t *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (s->head == NULL && !s->stop)
            pthread_cond_wait(&s->cond, &s->lock);
        tg_item_t *item = s->head;
        if (item == NULL)
            break; /* stopping and drained */
        s->head = item->next;
        if (s->head == NULL)
            s->tail = NULL;
        pthread_mutex_unlock(&s->lock);
        if (item->kind == TG_ITEM_COPY) {
            memmove(item->dst, item->src, item->length);
        } else {
            tg_event_t *e = item->event;
            pthread_mutex_lock(&e->lock);
            if (item->mark > e->passed)
                e->passed = item->mark;
            pthread_cond_broadcast(&e->cond);
            pthread_mutex_unlock(&e->lock);
            event_put(e);
        }
        free(item);
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static void stream_push(tg_stream_t *s, tg_item_t *item)
{
    item->next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->tail != NULL)
        s->tail->next = item;
    else
        s->head = item;
    s->tail = item;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

static ferry_status_t tg_stream_create(int device, void **stream_p)
{
    if (!device_valid(device) || stream_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    tg_stream_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return FERRY_ERR_NO_MEMORY;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    int rc = pthread_create(&s->thread, NULL, stream_worker, s);
    if (rc != 0) {
        ferry_error("testgpu: stream thread: %s", strerror(rc));
        pthread_cond_destroy(&s->cond);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return FERRY_ERR_NO_RESOURCE;
    }
    *stream_p = s;
    return FERRY_OK;
}

/* Work already queued finishes first (a destroyed CUDA stream's does too). */
static void tg_stream_destroy(void *stream)
{
    tg_stream_t *s = stream;
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static ferry_status_t tg_copy_async(void *stream, void *dst, const void *src, size_t length)
{
    if (stream == NULL)
        return FERRY_ERR_INVALID_PARAM;
    void *to, *from;
    ferry_status_t status = translate_copy(dst, src, length, &to, &from);
    if (status != FERRY_OK)
        return status;
    tg_item_t *item = calloc(1, sizeof(*item));
    if (item == NULL)
        return FERRY_ERR_NO_MEMORY;
    item->kind = TG_ITEM_COPY;
    item->dst = to;
    item->src = from;
    item->length = length;
    stream_push(stream, item);
    return FERRY_OK;
}

static ferry_status_t tg_event_create(int device, void **event_p)
{
    if (!device_valid(device) || event_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    tg_event_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return FERRY_ERR_NO_MEMORY;
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->cond, NULL);
    atomic_init(&e->refs, 1);
    *event_p = e;
    return FERRY_OK;
}

static void tg_event_destroy(void *event)
{
    if (event != NULL)
        event_put(event);
}

static ferry_status_t tg_event_record(void *event, void *stream)
{
    tg_event_t *e = event;
    if (e == NULL || stream == NULL)
        return FERRY_ERR_INVALID_PARAM;
    tg_item_t *item = calloc(1, sizeof(*item));
    if (item == NULL)
        return FERRY_ERR_NO_MEMORY;
    pthread_mutex_lock(&e->lock);
    item->mark = ++e->recorded;
    pthread_mutex_unlock(&e->lock);
    atomic_fetch_add(&e->refs, 1);
    item->kind = TG_ITEM_MARK;
    item->event = e;
    stream_push(stream, item);
    return FERRY_OK;
}

static ferry_status_t tg_event_query(void *event)
{
    tg_event_t *e = event;
    if (e == NULL)
        return FERRY_ERR_INVALID_PARAM;
    pthread_mutex_lock(&e->lock);
    ferry_status_t status = e->passed >= e->recorded ? FERRY_OK : FERRY_INPROGRESS;
    pthread_mutex_unlock(&e->lock);
    return status;
}

static ferry_status_t tg_event_wait(void *event)
{
    tg_event_t *e = event;
    if (e == NULL)
        return FERRY_ERR_INVALID_PARAM;
    pthread_mutex_lock(&e->lock);
    uint64_t target = e->recorded; /* the latest record when the wait began */
    while (e->passed < target)
        pthread_cond_wait(&e->cond, &e->lock);
    pthread_mutex_unlock(&e->lock);
    return FERRY_OK;
}

static ferry_status_t tg_copy(void *dst, const void *src, size_t length)
{
    void *to, *from;
    ferry_status_t status = translate_copy(dst, src, length, &to, &from);
    if (status != FERRY_OK)
        return status;
    memmove(to, from, length);
    return FERRY_OK;
}

static const ferry_accel_ops_t tg_ops = {
    .size = sizeof(ferry_accel_ops_t),
    .kind = "testgpu",
    .hardware_note = "test stand-in: memfd memory, no device",
    .init = tg_init,
    .device_count = tg_device_count,
    .device_uuid = tg_device_uuid,
    .device_describe = tg_device_describe,
    .pointer_query = tg_pointer_query,
    .mem_alloc = tg_mem_alloc,
    .mem_free = tg_mem_free,
    .host_alloc = tg_host_alloc,
    .host_free = tg_host_free,
    .ipc_export = tg_ipc_export,
    .ipc_open = tg_ipc_open,
    .ipc_close = tg_ipc_close,
    .stream_create = tg_stream_create,
    .stream_destroy = tg_stream_destroy,
    .copy_async = tg_copy_async,
    .event_create = tg_event_create,
    .event_destroy = tg_event_destroy,
    .event_record = tg_event_record,
    .event_query = tg_event_query,
    .event_wait = tg_event_wait,
    .copy = tg_copy,
};

const ferry_accel_ops_t *ferry_gpu_ipc_vendor(void);

const ferry_accel_ops_t *ferry_gpu_ipc_vendor(void)
{
    return &tg_ops;
}
