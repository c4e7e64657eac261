/*
 * The shm transport plugin: same-host transfers by cross-memory attach.
 * Built into libferry (no dependency); never chosen across hosts.  Its
 * priority puts it after ucx, which copies into memory UCX attached
 * (ferry_alloc buffers) without a system call, and before tcp.
 */
#include "shm.h"
#include "../../util/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The byte peers read once to learn whether the kernel lets them attach. */
static const char probe_byte = 'F';

static void shm_destroy(void *ctx)
{
    ferry_shm_t *shm = ctx;
    if (shm == NULL)
        return;
    ferry_shm_peers_free(shm);
    pthread_mutex_destroy(&shm->lock);
    free(shm->address);
    free(shm);
}

static ferry_status_t shm_create(const ferry_transport_services_t *svc, void **ctx_p)
{
    if (svc == NULL || svc->slice_done == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_shm_t *shm = calloc(1, sizeof(*shm));
    if (shm == NULL)
        return FERRY_ERR_NO_MEMORY;
    memcpy(&shm->svc, svc, FERRY_MIN(svc->size, sizeof(shm->svc)));
    shm->svc.size = sizeof(shm->svc);
    pthread_mutex_init(&shm->lock, NULL);
    char identity[192];
    ferry_process_identity(identity, sizeof(identity));
    shm->address = ferry_strdup_printf(FERRY_SHM_ENDPOINT_PREFIX "%s:%" PRIxPTR, identity,
                                       (uintptr_t)&probe_byte);
    if (shm->address == NULL) {
        shm_destroy(shm);
        return FERRY_ERR_NO_MEMORY;
    }
    *ctx_p = shm;
    return FERRY_OK;
}

static ferry_status_t shm_address(void *ctx, char **endpoint_p)
{
    *endpoint_p = strdup(((ferry_shm_t *)ctx)->address);
    return *endpoint_p ? FERRY_OK : FERRY_ERR_NO_MEMORY;
}

/* The kernel needs no registration; the key only says "shm reaches it". */
static ferry_status_t shm_mem_register(void *ctx, void *addr, size_t length,
                                       const char *location, char **key_p, void **memh_p)
{
    *memh_p = NULL;
    *key_p = NULL;
    /* Device memory is not reachable through another process's page tables;
     * host memory is, the CXL window's included. */
    if (!ferry_location_is_host(location))
        return FERRY_OK;
    *key_p = strdup("");
    return *key_p ? FERRY_OK : FERRY_ERR_NO_MEMORY;
}

static void shm_mem_deregister(void *ctx, void *memh)
{
}

static int shm_reaches(void *ctx, const ferry_peer_t *peer, const char *remote_key)
{
    if (peer == NULL || !peer->same_host || remote_key == NULL)
        return FERRY_REACH_NO;
    ferry_shm_peer_t *p = ferry_shm_peer_get(ctx, peer);
    int usable = p != NULL && p->usable;
    if (p != NULL)
        ferry_shm_peer_put(p);
    return usable ? FERRY_REACH_YES : FERRY_REACH_NO;
}

static size_t shm_slice_size(void *ctx)
{
    return 0; /* one system call per request: the kernel copies any size */
}

static void shm_info(FILE *out)
{
    fprintf(out, "shm: cross-memory attach (process_vm_writev/readv), built in\n");
}

static const ferry_transport_ops_t shm_ops = {
    .size = sizeof(ferry_transport_ops_t),
    .create = shm_create,
    .destroy = shm_destroy,
    .address = shm_address,
    .mem_register = shm_mem_register,
    .mem_deregister = shm_mem_deregister,
    .reaches = shm_reaches,
    .submit = ferry_shm_submit,
    .peer_forget = ferry_shm_peer_forget,
    .slice_size = shm_slice_size,
};

static const ferry_plugin_t shm_plugin = {
    .abi_version = FERRY_PLUGIN_ABI_VERSION,
    .kind = FERRY_PLUGIN_TRANSPORT,
    .name = "shm",
    .description = "same-host cross-memory attach (process_vm_writev/readv); no dependency",
    .priority = 20,
    .flags = FERRY_TRANSPORT_SAME_HOST_ONLY | FERRY_TRANSPORT_ONE_SIDED,
    .ops = &shm_ops,
    .info = shm_info,
};

const ferry_plugin_t *ferry_shm_plugin(void)
{
    return &shm_plugin;
}
