/*
 * The string pool of decoded and built descriptors: every buffer's location,
 * keys array and key strings come from a few large chunks instead of three
 * or more malloc() calls per buffer, which dominated decoding a segment of
 * many buffers.  A pool is shared by reference: a descriptor made by
 * applying changes to another (descriptor_changes.c) keeps its
 * predecessor's pool (as its new pool's parent) for the buffers it copied.
 *
 * Holders of a reference: each descriptor whose buffers point into it
 * (ferry_descriptor_t.pool, dropped by the descriptor's last unref) and
 * each child pool (parent, dropped when the child is freed).  Memory is
 * never handed back piecemeal: a pool lives as long as its longest holder.
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

#define POOL_FIRST_CHUNK ((size_t)16 << 10)
#define POOL_LARGEST_CHUNK ((size_t)4 << 20)

typedef struct pool_chunk {
    struct pool_chunk *next;
    size_t used, capacity;
    max_align_t data[]; /* capacity bytes */
} pool_chunk_t;

struct ferry_desc_pool {
    atomic_uint refs;
    ferry_desc_pool_t *parent;
    unsigned depth; /* ancestors: bounds the chain (FERRY_DESC_POOL_DEPTH_MAX) */
    pool_chunk_t *chunks; /* the newest first: allocations come from it */
    size_t next_capacity;
};

ferry_desc_pool_t *ferry_desc_pool_new(ferry_desc_pool_t *parent)
{
    ferry_desc_pool_t *pool = calloc(1, sizeof(*pool));
    if (pool == NULL)
        return NULL;
    atomic_init(&pool->refs, 1);
    pool->parent = ferry_desc_pool_ref(parent);
    pool->depth = parent ? parent->depth + 1 : 0;
    pool->next_capacity = POOL_FIRST_CHUNK;
    return pool;
}

ferry_desc_pool_t *ferry_desc_pool_ref(ferry_desc_pool_t *pool)
{
    if (pool != NULL)
        atomic_fetch_add_explicit(&pool->refs, 1, memory_order_relaxed);
    return pool;
}

void ferry_desc_pool_unref(ferry_desc_pool_t *pool)
{
    /* A loop, not recursion: a long chain of parents frees in constant stack. */
    while (pool != NULL &&
           atomic_fetch_sub_explicit(&pool->refs, 1, memory_order_acq_rel) == 1) {
        ferry_desc_pool_t *parent = pool->parent;
        for (pool_chunk_t *chunk = pool->chunks, *next; chunk; chunk = next) {
            next = chunk->next;
            free(chunk);
        }
        free(pool);
        pool = parent;
    }
}

unsigned ferry_desc_pool_depth(const ferry_desc_pool_t *pool)
{
    return pool ? pool->depth : 0;
}

void ferry_desc_pool_reserve(ferry_desc_pool_t *pool, size_t bytes)
{
    /* One chunk sized for a whole decode, when the text's length says how
     * much it needs; the pool only grows, so a hint too small costs nothing. */
    if (bytes > pool->next_capacity)
        pool->next_capacity = bytes;
}

void *ferry_desc_pool_alloc(ferry_desc_pool_t *pool, size_t size)
{
    /* Strings (ferry_desc_pool_bytes) leave `used` anywhere: align it. */
    const size_t align = sizeof(max_align_t);
    pool_chunk_t *chunk = pool->chunks;
    size_t start = chunk ? (chunk->used + align - 1) & ~(align - 1) : 0;
    if (chunk == NULL || start > chunk->capacity || chunk->capacity - start < size) {
        size_t capacity = pool->next_capacity > size ? pool->next_capacity : size;
        chunk = malloc(sizeof(*chunk) + capacity);
        if (chunk == NULL)
            return NULL;
        chunk->capacity = capacity;
        chunk->next = pool->chunks;
        pool->chunks = chunk;
        if (pool->next_capacity < POOL_LARGEST_CHUNK)
            pool->next_capacity *= 2;
        start = 0;
    }
    chunk->used = start + size;
    return (char *)chunk->data + start;
}

char *ferry_desc_pool_strndup(ferry_desc_pool_t *pool, const char *text, size_t length)
{
    char *copy = ferry_desc_pool_bytes(pool, length + 1);
    if (copy == NULL)
        return NULL;
    memcpy(copy, text, length);
    copy[length] = '\0';
    return copy;
}

void *ferry_desc_pool_bytes(ferry_desc_pool_t *pool, size_t size)
{
    /* Strings need no alignment: packed end to end in the current chunk. */
    pool_chunk_t *chunk = pool->chunks;
    if (chunk != NULL && chunk->capacity - chunk->used >= size) {
        void *memory = (char *)chunk->data + chunk->used;
        chunk->used += size;
        return memory;
    }
    return ferry_desc_pool_alloc(pool, size);
}
