/*
 * A binary min-heap of deadlines, for an event loop that must know its
 * next timeout without looking at every object it serves: the earliest is
 * at the top, and moving one object's deadline costs O(log n).
 *
 * The heap holds pointers to entries embedded in the caller's objects; an
 * entry knows its own position, so it can be moved or removed in place.
 * The capacity is fixed at init, so setting a deadline never allocates
 * (and never fails).
 */
#include "util.h"

#include <stdlib.h>

ferry_status_t ferry_deadline_heap_init(ferry_deadline_heap_t *heap, size_t capacity)
{
    heap->entries = calloc(FERRY_MAX(capacity, (size_t)1), sizeof(*heap->entries));
    heap->count = 0;
    heap->capacity = capacity;
    return heap->entries == NULL ? FERRY_ERR_NO_MEMORY : FERRY_OK;
}

void ferry_deadline_heap_fini(ferry_deadline_heap_t *heap)
{
    free(heap->entries);
    heap->entries = NULL;
    heap->count = heap->capacity = 0;
}

static void place(ferry_deadline_heap_t *heap, size_t index, ferry_deadline_entry_t *entry)
{
    heap->entries[index] = entry;
    entry->index = index;
}

static void sift_up(ferry_deadline_heap_t *heap, size_t index)
{
    ferry_deadline_entry_t *entry = heap->entries[index];
    while (index > 0) {
        size_t parent = (index - 1) / 2;
        if (heap->entries[parent]->deadline <= entry->deadline)
            break;
        place(heap, index, heap->entries[parent]);
        index = parent;
    }
    place(heap, index, entry);
}

static void sift_down(ferry_deadline_heap_t *heap, size_t index)
{
    ferry_deadline_entry_t *entry = heap->entries[index];
    for (;;) {
        size_t child = 2 * index + 1;
        if (child >= heap->count)
            break;
        if (child + 1 < heap->count &&
            heap->entries[child + 1]->deadline < heap->entries[child]->deadline)
            child++;
        if (entry->deadline <= heap->entries[child]->deadline)
            break;
        place(heap, index, heap->entries[child]);
        index = child;
    }
    place(heap, index, entry);
}

void ferry_deadline_heap_set(ferry_deadline_heap_t *heap, ferry_deadline_entry_t *entry,
                             uint64_t deadline)
{
    int queued = entry->index != FERRY_DEADLINE_UNQUEUED;
    if (deadline == UINT64_MAX) {
        if (!queued)
            return;
        size_t index = entry->index;
        ferry_deadline_entry_t *last = heap->entries[--heap->count];
        entry->index = FERRY_DEADLINE_UNQUEUED;
        entry->deadline = UINT64_MAX;
        if (last == entry)
            return;
        place(heap, index, last);
        sift_up(heap, index);
        sift_down(heap, last->index);
        return;
    }
    entry->deadline = deadline;
    if (!queued) {
        /* Every object of the caller's has at most one entry, and the
         * capacity counts them all. */
        place(heap, heap->count++, entry);
        sift_up(heap, entry->index);
        return;
    }
    sift_up(heap, entry->index);
    sift_down(heap, entry->index);
}

ferry_deadline_entry_t *ferry_deadline_heap_top(const ferry_deadline_heap_t *heap)
{
    return heap->count > 0 ? heap->entries[0] : NULL;
}
