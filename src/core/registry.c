/*
 * The registry: this engine's registered ranges, ordered by address in a
 * balanced tree, so that lookup, insert and remove are O(log n).  Transfers hold an entry through
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
    ferry_storage_close(entry->storage);
    free(entry->location);
    free(entry);
}

/* ---- the ordered set: an AVL tree threaded through the entries (their
 * tree_* fields), keyed by start address; ranges never overlap, so starts
 * are unique.  Every operation walks one root-to-leaf path: O(log n). ---- */

static int height(const ferry_reg_entry_t *node)
{
    return node ? node->tree_height : 0;
}

static void update(ferry_reg_entry_t *node)
{
    int left = height(node->tree_child[0]), right = height(node->tree_child[1]);
    node->tree_height = 1 + (left > right ? left : right);
}

/* The child on side `up` (0 left, 1 right) takes node's place, node goes
 * down on the other side; returns the subtree's new root. */
static ferry_reg_entry_t *rotate(ferry_reg_entry_t *node, int up)
{
    ferry_reg_entry_t *child = node->tree_child[up];
    node->tree_child[up] = child->tree_child[!up];
    child->tree_child[!up] = node;
    update(node);
    update(child);
    return child;
}

/* The subtree rooted at node, its heights differing by at most one again. */
static ferry_reg_entry_t *balance(ferry_reg_entry_t *node)
{
    update(node);
    int tilt = height(node->tree_child[0]) - height(node->tree_child[1]);
    if (tilt >= -1 && tilt <= 1)
        return node;
    int heavy = tilt < 0;
    ferry_reg_entry_t *child = node->tree_child[heavy];
    if (height(child->tree_child[heavy]) < height(child->tree_child[!heavy]))
        node->tree_child[heavy] = rotate(child, !heavy); /* the inner grandchild first */
    return rotate(node, heavy);
}

static ferry_reg_entry_t *tree_insert(ferry_reg_entry_t *root, ferry_reg_entry_t *entry)
{
    if (root == NULL) {
        entry->tree_child[0] = entry->tree_child[1] = NULL;
        entry->tree_height = 1;
        return entry;
    }
    if (entry->addr < root->addr)
        root->tree_child[0] = tree_insert(root->tree_child[0], entry);
    else
        root->tree_child[1] = tree_insert(root->tree_child[1], entry);
    return balance(root);
}

/* Detach the subtree's leftmost entry (*min_p); returns what is left. */
static ferry_reg_entry_t *tree_remove_min(ferry_reg_entry_t *root, ferry_reg_entry_t **min_p)
{
    if (root->tree_child[0] == NULL) {
        *min_p = root;
        return root->tree_child[1];
    }
    root->tree_child[0] = tree_remove_min(root->tree_child[0], min_p);
    return balance(root);
}

static ferry_reg_entry_t *tree_remove(ferry_reg_entry_t *root, ferry_reg_entry_t *entry,
                                      int *found_p)
{
    if (root == NULL)
        return NULL;
    if (entry->addr < root->addr) {
        root->tree_child[0] = tree_remove(root->tree_child[0], entry, found_p);
    } else if (entry->addr > root->addr) {
        root->tree_child[1] = tree_remove(root->tree_child[1], entry, found_p);
    } else if (root == entry) {
        *found_p = 1;
        if (root->tree_child[1] == NULL)
            return root->tree_child[0];
        /* Its successor takes its place (the entries are the nodes). */
        ferry_reg_entry_t *successor;
        ferry_reg_entry_t *right = tree_remove_min(root->tree_child[1], &successor);
        successor->tree_child[0] = root->tree_child[0];
        successor->tree_child[1] = right;
        return balance(successor);
    }
    return balance(root);
}

/* The last entry starting at or before addr, or NULL. */
static ferry_reg_entry_t *floor_entry(const ferry_registry_t *registry, uintptr_t addr)
{
    ferry_reg_entry_t *found = NULL;
    for (ferry_reg_entry_t *node = registry->root; node != NULL;) {
        if (node->addr <= addr) {
            found = node;
            node = node->tree_child[1];
        } else {
            node = node->tree_child[0];
        }
    }
    return found;
}

/* The first entry starting after addr, or NULL. */
static ferry_reg_entry_t *higher_entry(const ferry_registry_t *registry, uintptr_t addr)
{
    ferry_reg_entry_t *found = NULL;
    for (ferry_reg_entry_t *node = registry->root; node != NULL;) {
        if (node->addr > addr) {
            found = node;
            node = node->tree_child[0];
        } else {
            node = node->tree_child[1];
        }
    }
    return found;
}

static void iter_push_left(ferry_registry_iter_t *it, ferry_reg_entry_t *node)
{
    for (; node != NULL; node = node->tree_child[0])
        it->stack[it->depth++] = node;
}

void ferry_registry_iter_init(ferry_registry_iter_t *it, const ferry_registry_t *registry)
{
    it->depth = 0;
    iter_push_left(it, registry->root);
}

ferry_reg_entry_t *ferry_registry_iter_next(ferry_registry_iter_t *it)
{
    if (it->depth == 0)
        return NULL;
    ferry_reg_entry_t *node = it->stack[--it->depth];
    iter_push_left(it, node->tree_child[1]);
    return node;
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
    /* Only the floor entry and the next one can overlap a new range. */
    ferry_reg_entry_t *near[2] = {floor_entry(registry, addr), higher_entry(registry, addr)};
    for (size_t i = 0; i < 2 && status == FERRY_OK && *entry_p == NULL; i++) {
        ferry_reg_entry_t *entry = near[i];
        if (entry != NULL && entry->addr == addr && entry->length == length)
            *entry_p = entry;
        else if (entry != NULL && overlaps(entry, addr, length))
            status = FERRY_ERR_OVERLAP;
    }
    pthread_rwlock_unlock(&registry->lock);
    return status;
}

ferry_status_t ferry_registry_insert(ferry_registry_t *registry, ferry_reg_entry_t *entry)
{
    pthread_rwlock_wrlock(&registry->lock);
    registry->root = tree_insert(registry->root, entry);
    registry->count++;
    pthread_rwlock_unlock(&registry->lock);
    return FERRY_OK;
}

ferry_reg_entry_t *ferry_registry_find_start(ferry_registry_t *registry, uintptr_t addr)
{
    pthread_rwlock_rdlock(&registry->lock);
    ferry_reg_entry_t *entry = floor_entry(registry, addr);
    if (entry != NULL && entry->addr != addr)
        entry = NULL;
    pthread_rwlock_unlock(&registry->lock);
    return entry;
}

void ferry_registry_remove(ferry_registry_t *registry, ferry_reg_entry_t *entry)
{
    pthread_rwlock_wrlock(&registry->lock);
    atomic_fetch_or(&entry->holds, FERRY_REG_DYING);
    int found = 0;
    registry->root = tree_remove(registry->root, entry, &found);
    registry->count -= (size_t)found;
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
    ferry_reg_entry_t *candidate = floor_entry(registry, addr);
    if (candidate != NULL && addr + length <= candidate->addr + candidate->length &&
        (candidate->flags & need) == need && ferry_reg_entry_hold(candidate))
        entry = candidate;
    pthread_rwlock_unlock(&registry->lock);
    return entry;
}

void ferry_registry_release_n(ferry_registry_t *registry, ferry_reg_entry_t *entry,
                              unsigned holds)
{
    /* From here on the entry may be gone. */
    if (atomic_fetch_sub(&entry->holds, holds) == (FERRY_REG_DYING | holds)) {
        pthread_mutex_lock(&registry->drain_lock);
        pthread_cond_broadcast(&registry->drained);
        pthread_mutex_unlock(&registry->drain_lock);
    }
}

void ferry_registry_release(ferry_registry_t *registry, ferry_reg_entry_t *entry)
{
    ferry_registry_release_n(registry, entry, 1);
}
