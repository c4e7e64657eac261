/*
 * The cxl transport plugin: settings, the transport object's life cycle,
 * keys, memory from the window, reachability.  Built into libferry (no
 * dependency) and opt-in: with FERRY_CXL_PATH empty it is not started, and
 * nothing is said; with it set, any problem with the window fails the engine.
 * Its priority puts it first among the host transports: a copy into mapped
 * memory needs no system call and no peer.
 */
#include "cxl.h"
#include "../../util/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ferry_setting_t cxl_settings[] = {
    {"PATH", "", "the shared window: a DAX device (/dev/dax0.0), a block device or a file made "
     "beforehand (truncate -s 1G /dev/shm/ferry-cxl); empty: no cxl transport",
     offsetof(ferry_cxl_settings_t, path), FERRY_SETTING_STRING},
    {"SIZE", "0", "bytes of FERRY_CXL_PATH the window uses, from its start (0: all of it; a "
     "smaller device or file is an error)", offsetof(ferry_cxl_settings_t, size),
     FERRY_SETTING_SIZE},
};

static void cxl_destroy(void *ctx)
{
    ferry_cxl_t *cxl = ctx;
    if (cxl == NULL)
        return;
    ferry_cxl_window_close(&cxl->window);
    ferry_settings_release(cxl_settings, FERRY_ARRAY_SIZE(cxl_settings), &cxl->settings);
    free(cxl->address);
    free(cxl);
}

static ferry_status_t cxl_create(const ferry_transport_services_t *svc, void **ctx_p)
{
    if (svc == NULL || svc->slice_done == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_cxl_t *cxl = calloc(1, sizeof(*cxl));
    if (cxl == NULL)
        return FERRY_ERR_NO_MEMORY;
    memcpy(&cxl->svc, svc, FERRY_MIN(svc->size, sizeof(cxl->svc)));
    cxl->svc.size = sizeof(cxl->svc);
    cxl->window.fd = -1;
    ferry_status_t status = ferry_settings_read("CXL", cxl_settings,
                                                FERRY_ARRAY_SIZE(cxl_settings), &cxl->settings);
    if (status == FERRY_OK && cxl->settings.path[0] == '\0')
        status = FERRY_ERR_UNSUPPORTED; /* not configured: not wanted, and not an error */
    if (status == FERRY_OK)
        status = ferry_cxl_window_open(&cxl->window, &cxl->settings);
    if (status != FERRY_OK) {
        cxl_destroy(cxl);
        return status;
    }
    ferry_cxl_owner_init(&cxl->self, svc->generation);
    cxl->address = ferry_strdup_printf(FERRY_CXL_ENDPOINT_PREFIX "%s:%zu:%zu", cxl->window.id,
                                       cxl->window.size, cxl->window.chunk_size);
    if (cxl->address == NULL) {
        cxl_destroy(cxl);
        return FERRY_ERR_NO_MEMORY;
    }
    ferry_info("cxl: window %s, %zu bytes, id %s", cxl->window.path, cxl->window.size,
               cxl->window.id);
    *ctx_p = cxl;
    return FERRY_OK;
}

static ferry_status_t cxl_address(void *ctx, char **endpoint_p)
{
    *endpoint_p = strdup(((ferry_cxl_t *)ctx)->address);
    return *endpoint_p ? FERRY_OK : FERRY_ERR_NO_MEMORY;
}

static ferry_status_t make_key(const ferry_cxl_t *cxl, uint64_t offset, char **key_p)
{
    *key_p = ferry_strdup_printf("%" PRIx64 "@%" PRIxPTR, offset,
                                 (uintptr_t)(cxl->window.base + offset));
    return *key_p ? FERRY_OK : FERRY_ERR_NO_MEMORY;
}

/* A range inside one of this engine's allocations in its mapping of the
 * window gets a key; any other range is not CXL-reachable (no key), since
 * peers refuse to touch chunks that are not ours. */
static ferry_status_t cxl_mem_register(void *ctx, void *addr, size_t length,
                                       const char *location, char **key_p, void **memh_p)
{
    ferry_cxl_t *cxl = ctx;
    ferry_cxl_window_t *window = &cxl->window;
    uintptr_t start = (uintptr_t)window->base, at = (uintptr_t)addr;
    uint32_t hold;
    *key_p = NULL;
    *memh_p = NULL;
    if (at < start || at - start >= window->size ||
        ferry_cxl_range_acquire(window, at - start, length, cxl->self.generation, &hold) !=
            FERRY_OK)
        return FERRY_OK;
    ferry_cxl_range_release(window, hold);
    return make_key(cxl, at - start, key_p);
}

static ferry_status_t cxl_mem_alloc(void *ctx, size_t length, const char *location,
                                    void **addr_p, char **key_p, void **memh_p)
{
    ferry_cxl_t *cxl = ctx;
    if (!ferry_location_is_cxl(location))
        return FERRY_ERR_UNSUPPORTED; /* "cpu" memory is never the window's */
    ferry_cxl_mem_t *mem = malloc(sizeof(*mem));
    if (mem == NULL)
        return FERRY_ERR_NO_MEMORY;
    ferry_status_t status = ferry_cxl_chunks_alloc(cxl, length, mem);
    uint64_t offset = status == FERRY_OK ? (uint64_t)mem->first << cxl->window.chunk_shift : 0;
    if (status == FERRY_OK && (status = make_key(cxl, offset, key_p)) != FERRY_OK)
        ferry_cxl_chunks_free(cxl, mem);
    if (status != FERRY_OK) {
        free(mem);
        return status;
    }
    *addr_p = cxl->window.base + offset;
    *memh_p = mem;
    return FERRY_OK;
}

static void cxl_mem_deregister(void *ctx, void *memh)
{
    if (memh == NULL)
        return; /* registered, not allocated: nothing to give back */
    ferry_cxl_chunks_free(ctx, memh);
    free(memh);
}

/* Everything before the size: "cxl1:<id>:". */
static size_t identity_length(void)
{
    return strlen(FERRY_CXL_ENDPOINT_PREFIX) + 32 + 1;
}

static int cxl_reaches(void *ctx, const ferry_peer_t *peer, const char *remote_key)
{
    ferry_cxl_t *cxl = ctx;
    uint64_t offset, addr;
    if (peer == NULL || !peer->same_host || peer->endpoint == NULL ||
        !ferry_cxl_key_parse(remote_key, &offset, &addr))
        return FERRY_REACH_NO;
    if (strcmp(peer->endpoint, cxl->address) == 0)
        return FERRY_REACH_YES;
    /* The same window id with another size: one of us mapped a window that
     * was resized (or FERRY_CXL_SIZE differs) after the other checked it. */
    if (strncmp(peer->endpoint, cxl->address, identity_length()) == 0 &&
        atomic_exchange(&cxl->resized_logged, 1) == 0)
        ferry_warn("cxl: peer %s maps window %s as %s, we as %s: the window changed size; cxl "
                   "does not serve that peer", peer->name, cxl->window.id, peer->endpoint,
                   cxl->address);
    return FERRY_REACH_NO;
}

static void cxl_peer_forget(void *ctx, const ferry_peer_t *peer)
{
    /* Nothing is kept per peer: each request is checked against the table. */
}

static size_t cxl_slice_size(void *ctx)
{
    return 0; /* one memcpy per request */
}

static void cxl_info(FILE *out)
{
    ferry_cxl_settings_t settings;
    if (ferry_settings_read("CXL", cxl_settings, FERRY_ARRAY_SIZE(cxl_settings), &settings) !=
        FERRY_OK) {
        fprintf(out, "cxl: the FERRY_CXL_* settings do not parse\n");
        return;
    }
    ferry_cxl_window_describe(out, &settings);
    ferry_settings_release(cxl_settings, FERRY_ARRAY_SIZE(cxl_settings), &settings);
}

static const ferry_transport_ops_t cxl_ops = {
    .size = sizeof(ferry_transport_ops_t),
    .create = cxl_create,
    .destroy = cxl_destroy,
    .address = cxl_address,
    .mem_register = cxl_mem_register,
    .mem_deregister = cxl_mem_deregister,
    .reaches = cxl_reaches,
    .submit = ferry_cxl_submit,
    .peer_forget = cxl_peer_forget,
    .slice_size = cxl_slice_size,
    .mem_alloc = cxl_mem_alloc,
};

static const ferry_plugin_t cxl_plugin = {
    .abi_version = FERRY_PLUGIN_ABI_VERSION,
    .kind = FERRY_PLUGIN_TRANSPORT,
    .name = "cxl",
    .description = "same-host copies through a shared memory window (CXL DAX device or file); "
                   "opt-in: FERRY_CXL_PATH",
    .priority = 40,
    .flags = FERRY_TRANSPORT_SAME_HOST_ONLY | FERRY_TRANSPORT_OPT_IN |
             FERRY_TRANSPORT_ONE_SIDED,
    .settings = cxl_settings,
    .settings_count = FERRY_ARRAY_SIZE(cxl_settings),
    .settings_component = "CXL",
    .ops = &cxl_ops,
    .info = cxl_info,
};

const ferry_plugin_t *ferry_cxl_plugin(void)
{
    return &cxl_plugin;
}
