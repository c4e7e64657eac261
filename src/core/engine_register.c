/*
 * Registration: ranges enter the registry, every transport registers them,
 * the descriptor is rebuilt and published.  Unregister runs the same steps
 * backwards and then tells the peers that use this segment.
 */
#include "core.h"
#include "../rpc/rpc.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <unistd.h>

static unsigned normalize_flags(unsigned flags)
{
    if ((flags & FERRY_REG_REMOTE) == 0)
        flags |= FERRY_REG_REMOTE;
    return flags;
}

/* The allocating transport (ferry_alloc) lets go last: its memh frees the
 * memory the others still describe. */
static void transports_deregister(ferry_engine_t *engine, ferry_reg_entry_t *entry)
{
    int owner = entry->allocated ? entry->alloc_transport : FERRY_ALLOC_HEAP;
    for (size_t i = 0; i < engine->n_transports; i++) {
        if (entry->memh[i] != NULL && (int)i != owner)
            engine->transports[i].ops->mem_deregister(engine->transports[i].ctx,
                                                      entry->memh[i]);
        if ((int)i != owner)
            entry->memh[i] = NULL;
    }
    if (owner >= 0) {
        engine->transports[owner].ops->mem_deregister(engine->transports[owner].ctx,
                                                      entry->memh[owner]);
        entry->memh[owner] = NULL;
    } else if (owner == FERRY_ALLOC_DEVICE) {
        entry->accel->mem_free((void *)entry->addr);
    } else if (entry->allocated) {
        free((void *)entry->addr);
    }
    entry->allocated = 0;
}

/* A storage buffer goes to the transports that reach storage only, with
 * the storage key: a memory transport would serve the reserved addresses
 * (PROT_NONE) as memory. */
static ferry_status_t storage_register(ferry_engine_t *engine, ferry_reg_entry_t *entry)
{
    for (size_t i = 0; i < engine->n_transports; i++) {
        ferry_transport_instance_t *tp = &engine->transports[i];
        if (tp->plugin->flags & FERRY_TRANSPORT_SERVES_STORAGE) {
            /* its target does the file's I/O for peers (stage_in, stage_out) */
            ferry_status_t status = tp->ops->mem_register(tp->ctx, (void *)entry->addr,
                                                          entry->length, entry->location,
                                                          &entry->keys[i], &entry->memh[i]);
            if (status != FERRY_OK && status != FERRY_ERR_UNSUPPORTED)
                return status;
            continue;
        }
        if (!(tp->plugin->flags & FERRY_TRANSPORT_STORAGE))
            continue;
        entry->keys[i] = strdup(entry->storage->key_text);
        if (entry->keys[i] == NULL)
            return FERRY_ERR_NO_MEMORY;
    }
    return FERRY_OK;
}

/* Every transport but the one that allocated the range (already done). */
static ferry_status_t transports_register(ferry_engine_t *engine, ferry_reg_entry_t *entry)
{
    if (entry->storage != NULL)
        return storage_register(engine, entry);
    for (size_t i = 0; i < engine->n_transports; i++) {
        ferry_transport_instance_t *tp = &engine->transports[i];
        if (entry->allocated && (int)i == entry->alloc_transport)
            continue;
        ferry_status_t status = tp->ops->mem_register(tp->ctx, (void *)entry->addr,
                                                      entry->length, entry->location,
                                                      &entry->keys[i], &entry->memh[i]);
        if (status == FERRY_ERR_UNSUPPORTED) {
            /* Not memory this transport reaches (device memory for most):
             * published without its key, so peers pick another. */
            free(entry->keys[i]);
            entry->keys[i] = NULL;
            entry->memh[i] = NULL;
            continue;
        }
        if (status != FERRY_OK) {
            ferry_error("transport %s cannot register [%p, +%zu) at %s: %s", tp->plugin->name,
                        (void *)entry->addr, entry->length, entry->location,
                        ferry_status_string(status));
            return status;
        }
    }
    return FERRY_OK;
}

static const char *access_name(unsigned flags)
{
    switch (flags & FERRY_REG_REMOTE) {
    case FERRY_REG_REMOTE_READ:
        return "r";
    case FERRY_REG_REMOTE_WRITE:
        return "w";
    default:
        return "rw";
    }
}

/* Adds one range or one reference; caller holds register_lock. */
static ferry_status_t register_one(ferry_engine_t *engine, const ferry_region_t *region,
                                   unsigned flags, ferry_reg_entry_t **entry_p, int *added_p)
{
    ferry_reg_entry_t *entry;
    uintptr_t addr = (uintptr_t)region->addr;
    *added_p = 0;
    if (region->addr == NULL || region->length == 0 || addr + region->length < addr) {
        ferry_error("register [%p, +%zu): NULL address, zero length or wrap-around",
                    region->addr, region->length);
        return FERRY_ERR_INVALID_PARAM;
    }
    const char *location = region->location && *region->location ? region->location : "cpu";
    if (strcmp(location, "*") != 0 && !ferry_location_valid(location)) {
        ferry_error("register [%p, +%zu): location \"%.64s%s\" is not kind[:qualifier] (e.g. "
                    "cpu, cpu:1, cuda:0) of at most %d bytes", region->addr, region->length,
                    location, strlen(location) > 64 ? "..." : "", FERRY_LOCATION_MAX);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (ferry_location_is_kind(location, FERRY_STORAGE_LOCATION)) {
        ferry_error("register [%p, +%zu): location \"%s\" is storage's; register a file or "
                    "block device with ferry_register_storage", region->addr, region->length,
                    location);
        return FERRY_ERR_INVALID_PARAM;
    }
    char resolved[FERRY_LOCATION_MAX + 1];
    const ferry_accel_ops_t *accel;
    ferry_status_t status = ferry_engine_location_resolve(engine, region->addr, region->length,
                                                          location, resolved, sizeof(resolved),
                                                          &accel);
    if (status != FERRY_OK)
        return status;
    location = resolved;
    status = ferry_registry_check(&engine->registry, addr, region->length, &entry);
    if (status == FERRY_ERR_OVERLAP) {
        ferry_error("register [%p, +%zu): partially overlaps a registered range",
                    region->addr, region->length);
        return status;
    }
    if (entry != NULL && (entry->flags != flags || strcmp(entry->location, location) != 0)) {
        ferry_error("register [%p, +%zu): already registered with access %s at %s; unregister "
                    "it first to register it with access %s at %s", region->addr,
                    region->length, access_name(entry->flags), entry->location,
                    access_name(flags), location);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (entry != NULL) {
        entry->refs++;
        *entry_p = entry;
        return FERRY_OK;
    }
    entry = ferry_reg_entry_new(addr, region->length, location, flags);
    if (entry == NULL)
        return FERRY_ERR_NO_MEMORY;
    entry->accel = accel;
    entry->epoch = ++engine->register_epoch;
    status = transports_register(engine, entry);
    if (status == FERRY_OK)
        status = ferry_registry_insert(&engine->registry, entry);
    if (status != FERRY_OK) {
        transports_deregister(engine, entry);
        ferry_reg_entry_free(entry);
        return status;
    }
    ferry_engine_changes_added(engine, entry);
    *entry_p = entry;
    *added_p = 1;
    return FERRY_OK;
}

/* Undo a reference taken by register_one; caller holds register_lock. */
static void unregister_one(ferry_engine_t *engine, ferry_reg_entry_t *entry)
{
    if (--entry->refs > 0)
        return;
    ferry_engine_changes_removed(engine, entry);
    ferry_registry_remove(&engine->registry, entry);
    ferry_batch_forget_entry(engine, entry);
    ferry_registry_drain(&engine->registry, entry);
    transports_deregister(engine, entry);
    ferry_reg_entry_free(entry);
}

/* A new entry (storage, allocated memory) into the transports and the
 * registry, then published unless deferred; *addr_p its address.  On
 * failure the entry is freed.  what: the log line's verb. */
static ferry_status_t enter_new_entry(ferry_engine_t *engine, ferry_reg_entry_t *entry,
                                      unsigned flags, const char *what, void **addr_p)
{
    pthread_mutex_lock(&engine->register_lock);
    entry->epoch = ++engine->register_epoch;
    ferry_status_t status = transports_register(engine, entry);
    if (status == FERRY_OK)
        status = ferry_registry_insert(&engine->registry, entry);
    if (status != FERRY_OK) {
        pthread_mutex_unlock(&engine->register_lock);
        transports_deregister(engine, entry);
        ferry_reg_entry_free(entry);
        return status;
    }
    ferry_engine_changes_added(engine, entry);
    if (!(flags & FERRY_REG_DEFER_PUBLISH)) {
        ferry_status_t published = ferry_engine_publish_locked(engine);
        if (published != FERRY_OK)
            ferry_warn("%s, but publishing segment %s failed: %s", what, engine->name,
                       ferry_status_string(published));
    }
    *addr_p = (void *)entry->addr;
    pthread_mutex_unlock(&engine->register_lock);
    return FERRY_OK;
}

ferry_status_t ferry_register_batch(ferry_engine_h handle, const ferry_region_t *regions,
                                    size_t count, unsigned flags)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    if (regions == NULL || count == 0)
        return FERRY_ERR_INVALID_PARAM;
    ferry_reg_entry_t **done = calloc(count, sizeof(*done));
    if (done == NULL)
        return FERRY_ERR_NO_MEMORY;
    flags = normalize_flags(flags);
    ferry_status_t status = FERRY_OK;
    size_t n = 0;
    pthread_mutex_lock(&engine->register_lock);
    for (; n < count; n++) {
        int added;
        status = register_one(engine, &regions[n], flags & FERRY_REG_REMOTE, &done[n], &added);
        if (status != FERRY_OK)
            break;
    }
    if (status != FERRY_OK) {
        /* All or nothing: drop what this call took, newest first. */
        while (n-- > 0)
            unregister_one(engine, done[n]);
    } else if (!(flags & FERRY_REG_DEFER_PUBLISH)) {
        ferry_status_t published = ferry_engine_publish_locked(engine);
        if (published != FERRY_OK)
            ferry_warn("registered, but publishing segment %s failed: %s", engine->name,
                       ferry_status_string(published));
    }
    pthread_mutex_unlock(&engine->register_lock);
    free(done);
    return status;
}

/* Where WWIDs of block devices are read (tests point it at a fake tree);
 * the file transport's table documents it (FERRY_FILE_SYSFS_ROOT). */
typedef struct storage_settings {
    char *sysfs_root;
} storage_settings_t;

static const ferry_setting_t storage_settings_table[] = {
    {"SYSFS_ROOT", "/sys", "where block devices' WWIDs are read", 
     offsetof(storage_settings_t, sysfs_root), FERRY_SETTING_STRING},
};

ferry_status_t ferry_register_storage(ferry_engine_h handle, const ferry_storage_region_t *region,
                                      void **addr_p)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    if (addr_p == NULL || region == NULL)
        return FERRY_ERR_INVALID_PARAM;
    *addr_p = NULL;
    unsigned flags = normalize_flags(region->field_mask & FERRY_STORAGE_FIELD_FLAGS
                                         ? region->flags
                                         : FERRY_REG_REMOTE);
    storage_settings_t settings = {0};
    ferry_status_t status = ferry_settings_read("FILE", storage_settings_table, 1, &settings);
    ferry_storage_t *storage = NULL;
    if (status == FERRY_OK)
        status = ferry_storage_open(region, flags, engine->host_id, settings.sysfs_root,
                                    &storage);
    ferry_settings_release(storage_settings_table, 1, &settings);
    if (status != FERRY_OK)
        return status;
    ferry_reg_entry_t *entry = ferry_reg_entry_new(storage->key.addr, storage->reserved_length,
                                                   FERRY_STORAGE_LOCATION,
                                                   flags & FERRY_REG_REMOTE);
    if (entry == NULL) {
        ferry_storage_close(storage);
        return FERRY_ERR_NO_MEMORY;
    }
    entry->storage = storage;
    return enter_new_entry(engine, entry, flags, "registered storage", addr_p);
}

ferry_status_t ferry_register(ferry_engine_h handle, void *addr, size_t length,
                              const char *location, unsigned flags)
{
    ferry_region_t region = {.addr = addr, .length = length, .location = location};
    return ferry_register_batch(handle, &region, 1, flags);
}

/* Page-aligned heap memory; from 2 MiB up aligned to 2 MiB and backed by
 * transparent huge pages where the kernel has them (THP "madvise" is
 * Debian's default): a peer's cross-memory attach then pins one huge page
 * where it would pin 512 small ones, and copies miss the TLB less. */
static ferry_status_t heap_alloc(size_t length, void **addr_p)
{
    const size_t huge = (size_t)2 << 20;
    size_t align = length >= huge ? huge : (size_t)sysconf(_SC_PAGESIZE);
    if (posix_memalign(addr_p, align, length) != 0)
        return FERRY_ERR_NO_MEMORY;
    if (align == huge && madvise(*addr_p, length & ~(huge - 1), MADV_HUGEPAGE) != 0)
        ferry_debug("madvise(MADV_HUGEPAGE) of %zu bytes: %s", length, strerror(errno));
    return FERRY_OK;
}

/* Memory from the first transport (highest priority) that allocates for
 * that location, else page-aligned heap memory for the host.  A transport's
 * failure other than "not my kind of memory" is what the caller hears when
 * nothing else provides the memory (the CXL window full, say). */
static ferry_status_t allocate_entry(ferry_engine_t *engine, size_t length,
                                     const char *location, unsigned flags,
                                     ferry_reg_entry_t **entry_p)
{
    ferry_reg_entry_t *entry = ferry_reg_entry_new(0, length, location, flags);
    *entry_p = entry;
    if (entry == NULL)
        return FERRY_ERR_NO_MEMORY;
    entry->allocated = 1;
    /* A device location: its vendor's memory, or its vendor's refusal. */
    void *device = NULL;
    ferry_status_t status = ferry_engine_device_alloc(engine, location, length, &device,
                                                      &entry->accel);
    if (status == FERRY_OK) {
        entry->addr = (uintptr_t)device;
        entry->alloc_transport = FERRY_ALLOC_DEVICE;
        return FERRY_OK;
    }
    if (entry->accel != NULL)
        goto err_free;
    ferry_status_t failed = FERRY_ERR_UNSUPPORTED;
    for (size_t i = 0; i < engine->n_transports; i++) {
        ferry_transport_instance_t *tp = &engine->transports[i];
        if (!FERRY_TRANSPORT_OPS_HAS(tp->ops, mem_alloc))
            continue;
        void *addr = NULL;
        ferry_status_t status = tp->ops->mem_alloc(tp->ctx, length, entry->location, &addr,
                                                   &entry->keys[i], &entry->memh[i]);
        if (status == FERRY_OK) {
            entry->addr = (uintptr_t)addr;
            entry->alloc_transport = (int)i;
            return FERRY_OK;
        }
        free(entry->keys[i]);
        entry->keys[i] = NULL;
        entry->memh[i] = NULL;
        if (status != FERRY_ERR_UNSUPPORTED) {
            ferry_warn("transport %s cannot allocate %zu bytes at %s: %s", tp->plugin->name,
                       length, entry->location, ferry_status_string(status));
            failed = status;
        }
    }
    status = failed;
    /* Host memory, but never the CXL window's: "cxl" memory from the heap
     * would be reachable by nothing that the user asked for. */
    if (ferry_location_is_host(entry->location) && !ferry_location_is_cxl(entry->location)) {
        void *addr = NULL;
        if (heap_alloc(length, &addr) == FERRY_OK) {
            entry->addr = (uintptr_t)addr;
            entry->alloc_transport = FERRY_ALLOC_HEAP;
            return FERRY_OK;
        }
        ferry_error("allocate %zu bytes at %s: out of memory", length, entry->location);
        status = FERRY_ERR_NO_MEMORY;
    } else if (status == FERRY_ERR_UNSUPPORTED && ferry_location_is_cxl(entry->location)) {
        ferry_error("allocate %zu bytes at %s: the cxl transport is not running (no window: "
                    "set FERRY_CXL_PATH; or FERRY_TRANSPORTS leaves it out)", length,
                    entry->location);
    } else if (status == FERRY_ERR_UNSUPPORTED) {
        ferry_error("allocate %zu bytes at %s: no transport or accelerator module provides such "
                    "memory (ferry_info lists the devices)", length, entry->location);
    }
err_free:
    entry->allocated = 0;
    ferry_reg_entry_free(entry);
    *entry_p = NULL;
    return status;
}

ferry_status_t ferry_alloc(ferry_engine_h handle, size_t length, const char *location,
                           unsigned flags, void **addr_p)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    if (addr_p == NULL || length == 0)
        return FERRY_ERR_INVALID_PARAM;
    *addr_p = NULL;
    if (!ferry_location_valid(location)) {
        ferry_error("allocate %zu bytes: location \"%.64s\" is not kind[:qualifier] of at most "
                    "%d bytes", length, location, FERRY_LOCATION_MAX);
        return FERRY_ERR_INVALID_PARAM;
    }
    flags = normalize_flags(flags);
    ferry_reg_entry_t *entry;
    ferry_status_t status = allocate_entry(engine, length, location, flags & FERRY_REG_REMOTE,
                                           &entry);
    if (status != FERRY_OK)
        return status;
    return enter_new_entry(engine, entry, flags, "allocated", addr_p);
}

/* Tell every subscriber at once, under one bound for all: a peer that
 * does not answer costs the bound once, however many there are.  A peer
 * that cannot hear us is gone (it refetches when it returns): forgotten. */
static void invalidate_peers(ferry_engine_t *engine)
{
    ferry_wire_writer_t writer = {0};
    ferry_status_t written = ferry_rpc_invalidate_write(&writer, engine->name,
                                                        engine->generation);
    /* Copy the list: the calls below must not run under subscribers_lock. */
    pthread_mutex_lock(&engine->subscribers_lock);
    size_t count = 0;
    char **targets = calloc(engine->n_subscribers + 1, sizeof(*targets));
    for (ferry_subscriber_t *s = engine->subscribers; s && targets; s = s->next)
        if ((targets[count] = strdup(s->rpc)) != NULL)
            count++;
    pthread_mutex_unlock(&engine->subscribers_lock);
    ferry_status_t *statuses = calloc(count + 1, sizeof(*statuses));
    if (written != FERRY_OK || targets == NULL || statuses == NULL) {
        ferry_error("unregister: out of memory; %zu peer(s) not told", count);
        count = 0;
    }
    ferry_rpc_call_all((const char *const *)targets, count, FERRY_RPC_INVALIDATE, writer.data,
                       writer.length, engine->settings.invalidate_timeout_ms,
                       engine->settings.rpc_max_frame, statuses);
    for (size_t i = 0; i < count; i++) {
        if (statuses[i] != FERRY_OK) {
            ferry_info("peer %s did not take the invalidation (%s); forgetting it", targets[i],
                       ferry_status_string(statuses[i]));
            ferry_engine_peer_forget_rpc(engine, targets[i]);
        }
    }
    for (size_t i = 0; targets != NULL && i < count; i++)
        free(targets[i]);
    free(targets);
    free(statuses);
    free(writer.data);
}

/* ferry_unregister (freeing 0) and ferry_free (freeing 1): the same steps,
 * with the rule that ferry_alloc memory leaves only through ferry_free. */
static ferry_status_t release_range(ferry_engine_h handle, void *addr, int freeing)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    const char *call = freeing ? "free" : "unregister";
    pthread_mutex_lock(&engine->register_lock);
    ferry_reg_entry_t *entry = ferry_registry_find_start(&engine->registry, (uintptr_t)addr);
    ferry_status_t status = FERRY_OK;
    if (entry == NULL) {
        ferry_error("%s %p: no registered range starts there", call, addr);
        status = FERRY_ERR_NOT_REGISTERED;
    } else if (freeing && !entry->allocated) {
        ferry_error("free %p: not memory from ferry_alloc (use ferry_unregister)", addr);
        status = FERRY_ERR_INVALID_PARAM;
    } else if (freeing && entry->refs > 1) {
        ferry_error("free %p: still registered %u more time(s); unregister those first", addr,
                    entry->refs - 1);
        status = FERRY_ERR_BUSY;
    } else if (!freeing && entry->allocated && entry->refs == 1) {
        ferry_error("unregister %p: memory from ferry_alloc; release it with ferry_free", addr);
        status = FERRY_ERR_INVALID_PARAM;
    }
    if (status != FERRY_OK) {
        pthread_mutex_unlock(&engine->register_lock);
        return status;
    }
    int last = entry->refs == 1;
    unregister_one(engine, entry);
    status = last ? ferry_engine_publish_locked(engine) : FERRY_OK;
    pthread_mutex_unlock(&engine->register_lock);
    if (last)
        invalidate_peers(engine);
    if (status != FERRY_OK)
        ferry_warn("%s done, but publishing segment %s failed: %s", call, engine->name,
                   ferry_status_string(status));
    return FERRY_OK;
}

ferry_status_t ferry_unregister(ferry_engine_h handle, void *addr)
{
    return release_range(handle, addr, 0);
}

ferry_status_t ferry_free(ferry_engine_h handle, void *addr)
{
    return release_range(handle, addr, 1);
}

ferry_status_t ferry_publish(ferry_engine_h handle)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    pthread_mutex_lock(&engine->register_lock);
    ferry_status_t status = ferry_engine_publish_locked(engine);
    pthread_mutex_unlock(&engine->register_lock);
    return status;
}

ferry_status_t ferry_engine_access_acquire(void *arg, uint64_t addr, uint64_t length,
                                           ferry_access_t access, void **token_p)
{
    ferry_engine_t *engine = arg;
    unsigned need = (access & FERRY_ACCESS_WRITE ? FERRY_REG_REMOTE_WRITE : 0) |
                    (access & FERRY_ACCESS_READ ? FERRY_REG_REMOTE_READ : 0);
    if (addr > UINTPTR_MAX || length > SIZE_MAX)
        return FERRY_ERR_OUT_OF_RANGE;
    ferry_reg_entry_t *entry = ferry_registry_acquire(&engine->registry, (uintptr_t)addr,
                                                      (size_t)length, need);
    if (entry != NULL && entry->storage != NULL && !(access & FERRY_ACCESS_STORAGE)) {
        /* Its addresses are no memory: a transport serving memory must
         * not touch them (the file transport does the I/O itself). */
        ferry_registry_release(&engine->registry, entry);
        ferry_warn("refused a remote %s of [0x%llx, +%llu): a storage buffer, which this "
                   "transport does not serve", access & FERRY_ACCESS_WRITE ? "write" : "read",
                   (unsigned long long)addr, (unsigned long long)length);
        return FERRY_ERR_UNSUPPORTED;
    }
    if (entry == NULL) {
        ferry_warn("refused a remote %s of [0x%llx, +%llu): not inside a registered, "
                   "remote-%s buffer", access & FERRY_ACCESS_WRITE ? "write" : "read",
                   (unsigned long long)addr, (unsigned long long)length,
                   access & FERRY_ACCESS_WRITE ? "writable" : "readable");
        return FERRY_ERR_OUT_OF_RANGE;
    }
    *token_p = entry;
    return FERRY_OK;
}

void ferry_engine_access_release(void *arg, void *token)
{
    ferry_engine_t *engine = arg;
    ferry_registry_release(&engine->registry, token);
}

ferry_status_t ferry_engine_subscribe(ferry_engine_t *engine, const char *rpc)
{
    if (rpc == NULL || *rpc == '\0' || strcmp(rpc, engine->rpc_endpoint) == 0)
        return FERRY_OK;
    ferry_status_t status = FERRY_OK;
    pthread_mutex_lock(&engine->subscribers_lock);
    ferry_subscriber_t *s = engine->subscribers;
    while (s && strcmp(s->rpc, rpc) != 0)
        s = s->next;
    if (s == NULL && engine->n_subscribers >= engine->settings.subscribers_max) {
        status = FERRY_ERR_NO_RESOURCE;
    } else if (s == NULL && (s = calloc(1, sizeof(*s))) != NULL) {
        if ((s->rpc = strdup(rpc)) != NULL) {
            s->next = engine->subscribers;
            engine->subscribers = s;
            engine->n_subscribers++;
        } else {
            free(s);
            status = FERRY_ERR_NO_MEMORY;
        }
    } else if (s == NULL) {
        status = FERRY_ERR_NO_MEMORY;
    }
    pthread_mutex_unlock(&engine->subscribers_lock);
    if (status == FERRY_ERR_NO_RESOURCE)
        ferry_warn("peer %s is not taken as a subscriber: %u already (FERRY_SUBSCRIBERS_MAX); "
                   "those that do not answer an invalidation leave the list", rpc,
                   engine->settings.subscribers_max);
    return status;
}

void ferry_engine_peer_seen(void *arg, const char *rpc)
{
    ferry_engine_subscribe(arg, rpc); /* a transport's peer: it logged why not */
}

void ferry_engine_peer_forget_rpc(ferry_engine_t *engine, const char *rpc)
{
    pthread_mutex_lock(&engine->subscribers_lock);
    for (ferry_subscriber_t **p = &engine->subscribers; *p; p = &(*p)->next) {
        if (strcmp((*p)->rpc, rpc) == 0) {
            ferry_subscriber_t *gone = *p;
            *p = gone->next;
            engine->n_subscribers--;
            free(gone->rpc);
            free(gone);
            break;
        }
    }
    pthread_mutex_unlock(&engine->subscribers_lock);
}

void ferry_engine_deregister_all(ferry_engine_t *engine)
{
    ferry_registry_t *registry = &engine->registry;
    /* Nothing registers any more: the root, each time, is as good as any. */
    while (registry->root != NULL) {
        ferry_reg_entry_t *entry = registry->root;
        ferry_registry_remove(registry, entry);
        ferry_registry_drain(registry, entry);
        transports_deregister(engine, entry);
        ferry_reg_entry_free(entry);
    }
}
