/*
 * Buffer keys and the import cache: each peer allocation is opened once per
 * peer incarnation and kept until the owner says its memory changed
 * (peer_changed), the peer is forgotten or found dead, and no slice uses it.
 * The cache is keyed by the whole key text: an allocation made again at a
 * freed one's address has another handle or buffer id, so it is another
 * entry, never the old mapping.
 */
#include "gpu_ipc.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A hex field ending at ':'; advances *p past the ':'. */
static int hex_field(const char **p, uint64_t *value_p)
{
    const char *s = *p;
    uint64_t value = 0;
    size_t digits = 0;
    for (; *s != ':'; s++, digits++) {
        int d;
        if (*s >= '0' && *s <= '9')
            d = *s - '0';
        else if (*s >= 'a' && *s <= 'f')
            d = *s - 'a' + 10;
        else
            return 0;
        if (digits == 16)
            return 0;
        value = value << 4 | (uint64_t)d;
    }
    if (digits == 0)
        return 0;
    *value_p = value;
    *p = s + 1;
    return 1;
}

int ferry_gpu_ipc_key_parse(const char *key, ferry_gpu_ipc_key_t *parsed)
{
    size_t prefix = strlen(FERRY_GPU_IPC_PREFIX);
    if (key == NULL || strncmp(key, FERRY_GPU_IPC_PREFIX, prefix) != 0)
        return 0;
    const char *p = key + prefix;
    uint64_t base, length, id;
    if (!hex_field(&p, &base) || !hex_field(&p, &length) || !hex_field(&p, &id) ||
        length == 0 || base + length < base || base > UINTPTR_MAX || length > SIZE_MAX)
        return 0;
    const char *colon = strchr(p, ':');
    if (colon == NULL || colon == p || colon[1] == '\0')
        return 0;
    parsed->base = (uintptr_t)base;
    parsed->length = (size_t)length;
    parsed->buffer_id = id;
    parsed->uuid = p;
    parsed->uuid_length = (size_t)(colon - p);
    parsed->handle = colon + 1;
    return 1;
}

ferry_status_t ferry_gpu_ipc_key_make(const ferry_accel_range_t *range, const char *uuid,
                                      const char *handle, char **key_p)
{
    char *key = NULL;
    if (asprintf(&key, FERRY_GPU_IPC_PREFIX "%" PRIxPTR ":%zx:%" PRIx64 ":%s:%s", range->base,
                 range->length, range->buffer_id, uuid, handle) < 0)
        return FERRY_ERR_NO_MEMORY;
    *key_p = key;
    return FERRY_OK;
}

static uint64_t key_hash(const char *key)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *key != '\0'; key++)
        h = (h ^ (unsigned char)*key) * 1099511628211ull;
    return h;
}

static void import_close(ferry_gpu_ipc_peer_t *p, ferry_gpu_ipc_import_t *import)
{
    p->gpu->vendor->ipc_close(import->opened);
    atomic_fetch_add(&ferry_gpu_ipc_closes, 1);
    free(import->key);
    free(import);
}

/* Caller holds p->lock.  A stale entry still in use that a new slice
 * names is live again: the owner still publishes its key after the change,
 * so the allocation is still there (opening it a second time would map it
 * twice). */
static ferry_gpu_ipc_import_t *import_find(ferry_gpu_ipc_peer_t *p, const char *key,
                                           uint64_t hash)
{
    for (ferry_gpu_ipc_import_t *i = p->imports; i != NULL; i = i->next)
        if (i->hash == hash && strcmp(i->key, key) == 0) {
            i->stale = 0;
            return i;
        }
    return NULL;
}

/* Open the allocation with the device whose UUID the key names if we see
 * it, else let the vendor choose. */
static ferry_status_t import_open(ferry_gpu_ipc_peer_t *p, const char *key, uint64_t hash,
                                  ferry_gpu_ipc_import_t **import_p)
{
    ferry_gpu_ipc_t *gpu = p->gpu;
    ferry_gpu_ipc_key_t parsed;
    if (!ferry_gpu_ipc_key_parse(key, &parsed))
        return FERRY_ERR_DECODE;
    ferry_gpu_ipc_import_t *import = calloc(1, sizeof(*import));
    if (import == NULL || (import->key = strdup(key)) == NULL) {
        free(import);
        return FERRY_ERR_NO_MEMORY;
    }
    import->hash = hash;
    import->remote_base = parsed.base;
    import->remote_length = parsed.length;
    import->device = ferry_gpu_ipc_device_by_uuid(gpu, parsed.uuid, parsed.uuid_length);
    void *base = NULL;
    ferry_status_t status = gpu->vendor->ipc_open(parsed.handle, p->pid, import->device, &base,
                                                  &import->mapped, &import->opened);
    if (status != FERRY_OK) {
        ferry_error("%s: cannot open allocation 0x%" PRIxPTR " (+%zu) of pid %ld: %s",
                    gpu->vendor->kind, parsed.base, parsed.length, p->pid,
                    ferry_status_string(status));
        free(import->key);
        free(import);
        return status;
    }
    import->local_base = base;
    atomic_fetch_add(&ferry_gpu_ipc_opens, 1);
    atomic_fetch_add(&ferry_gpu_ipc_opens_on[1 + import->device], 1);
    *import_p = import;
    return FERRY_OK;
}

/* Caller holds p->lock. */
static ferry_gpu_ipc_import_t *import_use(ferry_gpu_ipc_peer_t *p, const char *key, uint64_t hash)
{
    ferry_gpu_ipc_import_t *import = import_find(p, key, hash);
    if (import != NULL)
        import->users++;
    return import;
}

ferry_status_t ferry_gpu_ipc_import_get(ferry_gpu_ipc_peer_t *p, const char *key,
                                        ferry_gpu_ipc_import_t **import_p)
{
    if (atomic_load(&p->gone))
        return FERRY_ERR_PEER_FAILED;
    uint64_t hash = key_hash(key);
    pthread_mutex_lock(&p->lock);
    ferry_gpu_ipc_import_t *import = import_use(p, key, hash);
    pthread_mutex_unlock(&p->lock);
    if (import != NULL) {
        *import_p = import;
        return FERRY_OK;
    }
    /* Opening can take long (a first open maps the peer's memory): not
     * under the peer's lock, which every submit to it takes, but under
     * open_lock, so that two threads never open one handle twice. */
    pthread_mutex_lock(&p->open_lock);
    pthread_mutex_lock(&p->lock);
    import = import_use(p, key, hash);
    pthread_mutex_unlock(&p->lock);
    ferry_status_t status = FERRY_OK;
    if (import == NULL && (status = import_open(p, key, hash, &import)) == FERRY_OK) {
        pthread_mutex_lock(&p->lock);
        /* A peer found dead meanwhile closed what it had opened: do not
         * add to it. */
        int gone = atomic_load(&p->gone);
        if (!gone) {
            import->users = 1;
            import->next = p->imports;
            p->imports = import;
        }
        pthread_mutex_unlock(&p->lock);
        if (gone) {
            import_close(p, import);
            status = FERRY_ERR_PEER_FAILED;
        }
    }
    pthread_mutex_unlock(&p->open_lock);
    if (status == FERRY_OK)
        *import_p = import;
    return status;
}

/* Caller holds p->lock: unlink the stale unused imports onto *closing. */
static void collect_unused_stale(ferry_gpu_ipc_peer_t *p, ferry_gpu_ipc_import_t **closing)
{
    for (ferry_gpu_ipc_import_t **ip = &p->imports; *ip != NULL;) {
        ferry_gpu_ipc_import_t *i = *ip;
        if (i->stale && i->users == 0) {
            *ip = i->next;
            i->next = *closing;
            *closing = i;
        } else {
            ip = &i->next;
        }
    }
}

static void close_all(ferry_gpu_ipc_peer_t *p, ferry_gpu_ipc_import_t *closing)
{
    for (ferry_gpu_ipc_import_t *next; closing != NULL; closing = next) {
        next = closing->next;
        import_close(p, closing);
    }
}

void ferry_gpu_ipc_imports_put(ferry_gpu_ipc_peer_t *p, ferry_gpu_ipc_import_t **imports,
                               size_t count)
{
    ferry_gpu_ipc_import_t *closing = NULL;
    int any_stale = 0;
    pthread_mutex_lock(&p->lock);
    for (size_t k = 0; k < count; k++)
        if (imports[k] != NULL) {
            imports[k]->users--;
            any_stale |= imports[k]->stale && imports[k]->users == 0;
        }
    if (any_stale)
        collect_unused_stale(p, &closing);
    pthread_mutex_unlock(&p->lock);
    close_all(p, closing);
}

void ferry_gpu_ipc_imports_stale(ferry_gpu_ipc_peer_t *p)
{
    ferry_gpu_ipc_import_t *closing = NULL;
    pthread_mutex_lock(&p->lock);
    for (ferry_gpu_ipc_import_t *i = p->imports; i != NULL; i = i->next)
        i->stale = 1;
    collect_unused_stale(p, &closing);
    pthread_mutex_unlock(&p->lock);
    close_all(p, closing);
}

void ferry_gpu_ipc_imports_free(ferry_gpu_ipc_peer_t *p)
{
    ferry_gpu_ipc_import_t *closing = p->imports;
    p->imports = NULL;
    close_all(p, closing);
}
