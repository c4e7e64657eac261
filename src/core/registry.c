/*
 * The registry: this engine's registered ranges, sorted by address so that
 * every lookup is a binary search.  Transfers hold an entry through
 * `holds`; unregister first removes the entry from the ordered set and marks
 * it dying (no new transfer can find or hold it), then waits for the holds
 * to drop to zero, then frees it.  The dying mark and the count share one
 * word: a release reads nothing of the entry after its decrement, and the
 * one that leaves a dying entry with no hold wakes the drain through the
 * registry's own condition variable, which outlives every entry.
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

void ferry_registry_init(ferry_registry_t *registry)
{
    memset(registry, 0, sizeof(*registry));
    pthread_rwlock_init(&registry->lock, NULL);
    pthread_mutex_init(&registry->drain_lock, NULL);
    pthread_cond_init(&registry->drained, NULL);
}

void ferry_registry_fini(ferry_registry_t *registry)
{
    free(registry->entries);
    pthread_rwlock_destroy(&registry->lock);
    pthread_mutex_destroy(&registry->drain_lock);
    pthread_cond_destroy(&registry->drained);
}

ferry_reg_entry_t *ferry_reg_entry_new(uintptr_t addr, size_t length, const char *location,
                                       unsigned flags)
{
    ferry_reg_entry_t *entry = calloc(1, sizeof(*entry));
    if (entry == NULL)
        return NULL;
    entry->location = strdup(location ? location : "cpu");
    if (entry->location == NULL) {
        free(entry);
        return NULL;
    }
    entry->addr = addr;
    entry->length = length;
    entry->flags = flags;
    entry->refs = 1;
    entry->alloc_transport = FERRY_ALLOC_HEAP;
    return entry;
}

void ferry_reg_entry_free(ferry_reg_entry_t *entry)
{
    if (entry == NULL)
        return;
    for (size_t i = 0; i < FERRY_MAX_TRANSPORTS; i++)
        free(entry->keys[i]);
    free(entry->location);
    free(entry);
}

/* Index of the last entry whose addr <= addr, or -1. Caller holds the lock. */
static ptrdiff_t floor_index(const ferry_registry_t *registry, uintptr_t addr)
{
    ptrdiff_t low = 0, high = (ptrdiff_t)registry->count - 1, found = -1;
    while (low <= high) {
        ptrdiff_t mid = low + (high - low) / 2;
        if (registry->entries[mid]->addr <= addr) {
            found = mid;
            low = mid + 1;
        } else {
            high = mid - 1;
        }
    }
    return found;
}

static int overlaps(const ferry_reg_entry_t *entry, uintptr_t addr, size_t length)
{
    return entry->addr < addr + length && addr < entry->addr + entry->length;
}

ferry_status_t ferry_registry_check(ferry_registry_t *registry, uintptr_t addr, size_t length,
                                    ferry_reg_entry_t **entry_p)
{
    ferry_status_t status = FERRY_OK;
    *entry_p = NULL;
    pthread_rwlock_rdlock(&registry->lock);
    ptrdiff_t index = floor_index(registry, addr);
    /* Only the floor entry and its successor can overlap a new range. */
    for (ptrdiff_t i = index < 0 ? 0 : index; i <= index + 1 && i < (ptrdiff_t)registry->count;
         i++) {
        ferry_reg_entry_t *entry = registry->entries[i];
        if (entry->addr == addr && entry->length == length) {
            *entry_p = entry;
            break;
        }
        if (overlaps(entry, addr, length)) {
            status = FERRY_ERR_OVERLAP;
            break;
        }
    }
    pthread_rwlock_unlock(&registry->lock);
    return status;
}

ferry_status_t ferry_registry_insert(ferry_registry_t *registry, ferry_reg_entry_t *entry)
{
    ferry_status_t status = FERRY_OK;
    pthread_rwlock_wrlock(&registry->lock);
    if (registry->count == registry->capacity) {
        size_t capacity = registry->capacity ? registry->capacity * 2 : 64;
        ferry_reg_entry_t **entries = realloc(registry->entries, capacity * sizeof(*entries));
        if (entries == NULL) {
            status = FERRY_ERR_NO_MEMORY;
            goto out_unlock;
        }
        registry->entries = entries;
        registry->capacity = capacity;
    }
    size_t at = (size_t)(floor_index(registry, entry->addr) + 1);
    memmove(&registry->entries[at + 1], &registry->entries[at],
            (registry->count - at) * sizeof(*registry->entries));
    registry->entries[at] = entry;
    registry->count++;
out_unlock:
    pthread_rwlock_unlock(&registry->lock);
    return status;
}

ferry_reg_entry_t *ferry_registry_find_start(ferry_registry_t *registry, uintptr_t addr)
{
    pthread_rwlock_rdlock(&registry->lock);
    ptrdiff_t index = floor_index(registry, addr);
    ferry_reg_entry_t *entry =
        (index >= 0 && registry->entries[index]->addr == addr) ? registry->entries[index] : NULL;
    pthread_rwlock_unlock(&registry->lock);
    return entry;
}

void ferry_registry_remove(ferry_registry_t *registry, ferry_reg_entry_t *entry)
{
    pthread_rwlock_wrlock(&registry->lock);
    atomic_fetch_or(&entry->holds, FERRY_REG_DYING);
    ptrdiff_t index = floor_index(registry, entry->addr);
    if (index >= 0 && registry->entries[index] == entry) {
        memmove(&registry->entries[index], &registry->entries[index + 1],
                (registry->count - (size_t)index - 1) * sizeof(*registry->entries));
        registry->count--;
    }
    pthread_rwlock_unlock(&registry->lock);
}

void ferry_registry_drain(ferry_registry_t *registry, ferry_reg_entry_t *entry)
{
    pthread_mutex_lock(&registry->drain_lock);
    while (atomic_load(&entry->holds) != FERRY_REG_DYING)
        pthread_cond_wait(&registry->drained, &registry->drain_lock);
    pthread_mutex_unlock(&registry->drain_lock);
}

ferry_reg_entry_t *ferry_registry_acquire(ferry_registry_t *registry, uintptr_t addr,
                                          size_t length, unsigned need)
{
    ferry_reg_entry_t *entry = NULL;
    if (length == 0 || addr + length < addr)
        return NULL;
    pthread_rwlock_rdlock(&registry->lock);
    ptrdiff_t index = floor_index(registry, addr);
    if (index >= 0) {
        ferry_reg_entry_t *candidate = registry->entries[index];
        if (addr + length <= candidate->addr + candidate->length &&
            (candidate->flags & need) == need && ferry_reg_entry_hold(candidate))
            entry = candidate;
    }
    pthread_rwlock_unlock(&registry->lock);
    return entry;
}

void ferry_registry_release(ferry_registry_t *registry, ferry_reg_entry_t *entry)
{
    /* From here on the entry may be gone. */
    if (atomic_fetch_sub(&entry->holds, 1) == (FERRY_REG_DYING | 1)) {
        pthread_mutex_lock(&registry->drain_lock);
        pthread_cond_broadcast(&registry->drained);
        pthread_mutex_unlock(&registry->drain_lock);
    }
}
