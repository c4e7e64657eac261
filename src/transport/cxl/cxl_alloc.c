/*
 * The window's allocation table: whole chunks for ferry_alloc(..., "cxl"),
 * first fit; freeing waits for initiators still copying; when the window is
 * full, allocations of processes that are gone (same kernel and pid
 * namespace: a pid means nothing elsewhere) are reclaimed.  Writers hold the
 * header's robust mutex; initiators only read (see cxl.h for the order).
 */
#include "cxl.h"
#include "../../util/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RELAXED memory_order_relaxed

/* FNV-1a: the boot id and pid namespace of a process, in 64 bits. */
static uint64_t hash_text(const char *text, size_t length)
{
    uint64_t hash = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < length; i++)
        hash = (hash ^ (unsigned char)text[i]) * 0x100000001b3ull;
    return hash ? hash : 1;
}

void ferry_cxl_owner_init(ferry_cxl_owner_t *owner, uint64_t generation)
{
    char identity[192];
    ferry_process_identity(identity, sizeof(identity)); /* boot id:pid ns:pid:start */
    const char *colon = strchr(identity, ':');
    colon = colon ? strchr(colon + 1, ':') : NULL;
    owner->kernel = hash_text(identity, colon ? (size_t)(colon - identity) : strlen(identity));
    owner->pid = (uint32_t)getpid();
    owner->start_time = ferry_process_start_time((long)owner->pid);
    owner->generation = generation;
}

static void set_chunks(ferry_cxl_window_t *window, uint32_t first, uint32_t count,
                       const ferry_cxl_owner_t *owner)
{
    for (uint32_t i = first; i < first + count; i++) {
        ferry_cxl_chunk_t *c = &window->table[i];
        atomic_store_explicit(&c->kernel, owner ? owner->kernel : 0, RELAXED);
        atomic_store_explicit(&c->start_time, owner ? owner->start_time : 0, RELAXED);
        atomic_store_explicit(&c->pid, owner ? owner->pid : 0, RELAXED);
        atomic_store_explicit(&c->first, owner ? first : 0, RELAXED);
        atomic_store_explicit(&c->count, owner ? count : 0, RELAXED);
    }
}

/* Owners change first chunk last when made (initiators check it) and first
 * chunk first when going away. */
static void set_owner(ferry_cxl_window_t *window, uint32_t first, uint32_t count, uint64_t owner)
{
    if (owner == FERRY_CXL_OWNER_DRAINING)
        atomic_store(&window->table[first].owner, owner);
    for (uint32_t i = first + 1; i < first + count; i++)
        atomic_store(&window->table[i].owner, owner);
    atomic_store(&window->table[first].owner, owner);
}

static void clear_chunks(ferry_cxl_window_t *window, uint32_t first, uint32_t count)
{
    set_owner(window, first, count, FERRY_CXL_OWNER_DRAINING);
    set_chunks(window, first, count, NULL);
    atomic_store(&window->table[first].users, 0);
    set_owner(window, first, count, FERRY_CXL_OWNER_FREE);
}

void ferry_cxl_table_format(ferry_cxl_window_t *window)
{
    memset((void *)window->table, 0, (size_t)window->n_chunks * sizeof(ferry_cxl_chunk_t));
    ferry_cxl_owner_t nobody = {0};
    set_chunks(window, 0, window->reserved_chunks, &nobody);
    set_owner(window, 0, window->reserved_chunks, FERRY_CXL_OWNER_HEADER);
}

/* The allocation whose first chunk is i, if the table says so consistently. */
static int is_first_chunk(const ferry_cxl_window_t *window, uint32_t i, uint32_t *count_p)
{
    const ferry_cxl_chunk_t *c = &window->table[i];
    uint64_t owner = atomic_load(&c->owner);
    uint32_t count = atomic_load_explicit(&c->count, RELAXED);
    if (owner == FERRY_CXL_OWNER_FREE || owner == FERRY_CXL_OWNER_HEADER ||
        atomic_load_explicit(&c->first, RELAXED) != i || count == 0 ||
        count > window->n_chunks - i)
        return 0;
    *count_p = count;
    return 1;
}

/* A holder of the table's lock died half-way through a change: drop every
 * chunk that does not belong, consistently, to one allocation. */
static void table_repair(ferry_cxl_window_t *window)
{
    uint32_t dropped = 0;
    for (uint32_t i = window->reserved_chunks; i < window->n_chunks; i++) {
        uint64_t owner = atomic_load(&window->table[i].owner);
        if (owner == FERRY_CXL_OWNER_FREE)
            continue;
        uint32_t first = atomic_load_explicit(&window->table[i].first, RELAXED), count = 0;
        int intact = first >= window->reserved_chunks && first <= i &&
                     is_first_chunk(window, first, &count) && i - first < count &&
                     atomic_load(&window->table[first].owner) == owner;
        if (!intact) {
            clear_chunks(window, i, 1);
            dropped++;
        }
    }
    for (uint32_t i = window->reserved_chunks, count; i < window->n_chunks; i++) {
        if (!is_first_chunk(window, i, &count))
            continue;
        uint32_t j = i + 1;
        while (j < i + count && atomic_load_explicit(&window->table[j].first, RELAXED) == i)
            j++;
        if (j < i + count) {
            for (uint32_t k = i; k < i + count; k++)
                if (atomic_load_explicit(&window->table[k].first, RELAXED) == i) {
                    clear_chunks(window, k, 1);
                    dropped++;
                }
        }
    }
    ferry_warn("cxl: an engine died while changing the allocation table of %s; repaired it "
               "(%u chunk(s) dropped)", window->path, dropped);
}

static ferry_status_t table_lock(ferry_cxl_window_t *window)
{
    int rc = pthread_mutex_lock(&window->header->lock);
    if (rc == EOWNERDEAD) {
        table_repair(window);
        pthread_mutex_consistent(&window->header->lock);
        return FERRY_OK;
    }
    if (rc != 0) {
        ferry_error("cxl: cannot lock the allocation table of %s: %s", window->path,
                    strerror(rc));
        return FERRY_ERR_IO;
    }
    return FERRY_OK;
}

static void table_unlock(ferry_cxl_window_t *window)
{
    pthread_mutex_unlock(&window->header->lock);
}

/* First fit; caller holds the lock.  Returns the number of chunks in use. */
static uint32_t find_free(const ferry_cxl_window_t *window, uint32_t count, uint32_t *first_p)
{
    uint32_t run = 0, used = 0;
    *first_p = UINT32_MAX;
    for (uint32_t i = window->reserved_chunks; i < window->n_chunks; i++) {
        if (atomic_load_explicit(&window->table[i].owner, RELAXED) != FERRY_CXL_OWNER_FREE) {
            run = 0;
            used++;
            continue;
        }
        if (++run == count && *first_p == UINT32_MAX)
            *first_p = i + 1 - count;
    }
    return used;
}

/* Wait until no initiator copies into the allocation at first (bounded: an
 * initiator that died mid-copy never lets go). */
static void drain(ferry_cxl_window_t *window, uint32_t first, uint64_t deadline)
{
    _Atomic int32_t *users = &window->table[first].users;
    struct timespec pause = {.tv_sec = 0, .tv_nsec = 50000};
    while (atomic_load(users) > 0 && ferry_time_ms() < deadline)
        nanosleep(&pause, NULL);
    if (atomic_load(users) > 0)
        ferry_warn("cxl: a peer still copies into window offset 0x%zx of %s after %d ms (died "
                   "mid-copy?); freeing the chunks anyway", (size_t)first << window->chunk_shift,
                   window->path, FERRY_CXL_DRAIN_MS);
}

/* What an allocation that is being taken away looked like, to clear it only
 * if nobody else did it (and reused the chunks) in the meantime. */
typedef struct retiring {
    uint32_t first, count, pid;
    uint64_t start_time;
} retiring_t;

static int still_retiring(const ferry_cxl_window_t *window, const retiring_t *r)
{
    const ferry_cxl_chunk_t *c = &window->table[r->first];
    uint32_t count;
    return is_first_chunk(window, r->first, &count) && count == r->count &&
           atomic_load(&c->owner) == FERRY_CXL_OWNER_DRAINING &&
           atomic_load_explicit(&c->pid, RELAXED) == r->pid &&
           atomic_load_explicit(&c->start_time, RELAXED) == r->start_time;
}

/* Mark draining (locked), wait for copies (unlocked), clear (locked). */
static uint32_t retire(ferry_cxl_window_t *window, retiring_t *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        set_owner(window, list[i].first, list[i].count, FERRY_CXL_OWNER_DRAINING);
    table_unlock(window);
    uint64_t deadline = ferry_time_ms() + FERRY_CXL_DRAIN_MS;
    for (size_t i = 0; i < n; i++)
        drain(window, list[i].first, deadline);
    uint32_t freed = 0;
    if (table_lock(window) != FERRY_OK)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (!still_retiring(window, &list[i]))
            continue;
        clear_chunks(window, list[i].first, list[i].count);
        freed += list[i].count;
    }
    table_unlock(window);
    return freed;
}

static retiring_t retiring_of(const ferry_cxl_window_t *window, uint32_t first, uint32_t count)
{
    const ferry_cxl_chunk_t *c = &window->table[first];
    return (retiring_t){first, count, atomic_load_explicit(&c->pid, RELAXED),
                        atomic_load_explicit(&c->start_time, RELAXED)};
}

/* Allocations of processes that are gone; returns the chunks freed. */
static uint32_t reclaim(ferry_cxl_t *cxl)
{
    ferry_cxl_window_t *window = &cxl->window;
    retiring_t *list = malloc(window->n_chunks * sizeof(*list));
    if (list == NULL || table_lock(window) != FERRY_OK) {
        free(list);
        return 0;
    }
    size_t n = 0;
    for (uint32_t i = window->reserved_chunks, count; i < window->n_chunks; i++) {
        if (!is_first_chunk(window, i, &count))
            continue;
        const ferry_cxl_chunk_t *c = &window->table[i];
        retiring_t r = retiring_of(window, i, count);
        if (atomic_load_explicit(&c->kernel, RELAXED) == cxl->self.kernel &&
            !ferry_process_alive((long)r.pid, (unsigned long long)r.start_time))
            list[n++] = r;
        i += count - 1;
    }
    uint32_t freed = n ? retire(window, list, n) : 0;
    if (n == 0)
        table_unlock(window);
    if (freed)
        ferry_info("cxl: reclaimed %zu allocation(s), %u chunk(s), of processes that are gone "
                   "from the window in %s", n, freed, window->path);
    free(list);
    return freed;
}

ferry_status_t ferry_cxl_chunks_alloc(ferry_cxl_t *cxl, size_t length, ferry_cxl_mem_t *mem)
{
    ferry_cxl_window_t *window = &cxl->window;
    uint32_t usable = window->n_chunks - window->reserved_chunks, used = 0;
    size_t want = (length >> window->chunk_shift) + ((length & (window->chunk_size - 1)) != 0);
    if (want > usable) {
        ferry_error("cxl: %zu bytes are more than the window in %s holds (%zu)", length,
                    window->path, (size_t)usable << window->chunk_shift);
        return FERRY_ERR_NO_MEMORY;
    }
    uint32_t count = (uint32_t)want;
    for (int attempt = 0; attempt < 2; attempt++) {
        ferry_status_t status = table_lock(window);
        if (status != FERRY_OK)
            return status;
        uint32_t first;
        used = find_free(window, count, &first);
        if (first != UINT32_MAX) {
            set_chunks(window, first, count, &cxl->self);
            set_owner(window, first, count, cxl->self.generation);
            table_unlock(window);
            mem->first = first;
            mem->count = count;
            return FERRY_OK;
        }
        table_unlock(window);
        if (attempt == 0 && reclaim(cxl) == 0)
            break;
    }
    ferry_error("cxl: the window in %s is full: no %u free chunks in a row for %zu bytes (%u of "
                "%u chunks in use, after reclaiming those of processes that are gone)",
                window->path, count, length, used, usable);
    return FERRY_ERR_NO_MEMORY;
}

void ferry_cxl_chunks_free(ferry_cxl_t *cxl, const ferry_cxl_mem_t *mem)
{
    ferry_cxl_window_t *window = &cxl->window;
    if (table_lock(window) != FERRY_OK)
        return;
    uint32_t count;
    if (!is_first_chunk(window, mem->first, &count) || count != mem->count ||
        atomic_load(&window->table[mem->first].owner) != cxl->self.generation) {
        table_unlock(window);
        ferry_warn("cxl: the chunks at window offset 0x%zx of %s are no longer this engine's; "
                   "left as they are", (size_t)mem->first << window->chunk_shift, window->path);
        return;
    }
    retiring_t r = retiring_of(window, mem->first, mem->count);
    retire(window, &r, 1);
}

ferry_status_t ferry_cxl_range_acquire(ferry_cxl_window_t *window, uint64_t offset,
                                       uint64_t length, uint64_t generation, uint32_t *hold_p)
{
    if (length == 0 || offset >= window->size || length > window->size - offset ||
        generation == FERRY_CXL_OWNER_FREE || generation >= FERRY_CXL_OWNER_DRAINING)
        return FERRY_ERR_OUT_OF_RANGE;
    uint64_t c0 = offset >> window->chunk_shift, c1 = (offset + length - 1) >> window->chunk_shift;
    if (c1 >= window->n_chunks)
        return FERRY_ERR_OUT_OF_RANGE; /* the tail after the last whole chunk */
    uint32_t first = atomic_load_explicit(&window->table[c0].first, RELAXED);
    if (first > c0)
        return FERRY_ERR_OUT_OF_RANGE;
    ferry_cxl_chunk_t *c = &window->table[first];
    /* Counted before the owner is looked at: a free either sees us, or we
     * see it marking the allocation draining. */
    atomic_fetch_add(&c->users, 1);
    if (atomic_load(&c->owner) != generation ||
        atomic_load_explicit(&c->first, RELAXED) != first ||
        c1 - first >= atomic_load_explicit(&c->count, RELAXED)) {
        atomic_fetch_sub(&c->users, 1);
        return FERRY_ERR_OUT_OF_RANGE;
    }
    *hold_p = first;
    return FERRY_OK;
}

void ferry_cxl_range_release(ferry_cxl_window_t *window, uint32_t hold)
{
    atomic_fetch_sub(&window->table[hold].users, 1);
}
