/*
 * Validated handles.  A handle is (generation << 32 | slot + 1); the slot
 * array only grows, so looking up a freed or random handle reads a live slot
 * whose generation or kind does not match, and never follows a dangling
 * pointer.  Allocation takes a mutex; lookup (util.h) takes none.
 */
#include "util.h"

#include <stdlib.h>

#define SLOTS_PER_CHUNK FERRY_HANDLE_SLOTS_PER_CHUNK
#define MAX_CHUNKS FERRY_HANDLE_MAX_CHUNKS

typedef ferry_handle_slot_t handle_slot_t;

ferry_handle_slot_t *_Atomic ferry_handle_chunks[MAX_CHUNKS];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER; /* chunks growth, free list */
static uint32_t free_head = UINT32_MAX;
static uint32_t slots_used;

static handle_slot_t *slot_at(uint32_t index)
{
    if (index >= SLOTS_PER_CHUNK * MAX_CHUNKS)
        return NULL;
    handle_slot_t *chunk = atomic_load(&ferry_handle_chunks[index / SLOTS_PER_CHUNK]);
    return chunk ? &chunk[index % SLOTS_PER_CHUNK] : NULL;
}

uint64_t ferry_handle_alloc(ferry_handle_kind_t kind, void *object, void *owner)
{
    uint32_t index;
    pthread_mutex_lock(&table_lock);
    if (free_head != UINT32_MAX) {
        index = free_head;
        free_head = slot_at(index)->next_free;
    } else {
        index = slots_used;
        if (index >= SLOTS_PER_CHUNK * MAX_CHUNKS) {
            pthread_mutex_unlock(&table_lock);
            return 0;
        }
        if (index % SLOTS_PER_CHUNK == 0) {
            handle_slot_t *chunk = calloc(SLOTS_PER_CHUNK, sizeof(*chunk));
            if (chunk == NULL) {
                pthread_mutex_unlock(&table_lock);
                return 0;
            }
            atomic_store(&ferry_handle_chunks[index / SLOTS_PER_CHUNK], chunk);
        }
        slots_used++;
    }
    handle_slot_t *slot = slot_at(index);
    atomic_store(&slot->object, object);
    atomic_store(&slot->owner, owner);
    atomic_store(&slot->kind, (uint32_t)kind);
    uint32_t generation = atomic_load(&slot->generation) + 1; /* becomes odd */
    atomic_store(&slot->generation, generation);
    pthread_mutex_unlock(&table_lock);
    return ((uint64_t)generation << 32) | (uint64_t)(index + 1);
}

void ferry_handle_free(uint64_t handle)
{
    uint32_t low = (uint32_t)handle;
    pthread_mutex_lock(&table_lock);
    handle_slot_t *slot = low ? slot_at(low - 1) : NULL;
    if (slot != NULL && atomic_load(&slot->generation) == (uint32_t)(handle >> 32)) {
        atomic_store(&slot->generation, (uint32_t)(handle >> 32) + 1); /* even: free */
        atomic_store(&slot->object, NULL);
        slot->next_free = free_head;
        free_head = low - 1;
    }
    pthread_mutex_unlock(&table_lock);
}
