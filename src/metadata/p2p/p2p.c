/*
 * p2p metadata: no server.  Each engine serves its own descriptor over its
 * RPC listener, so a segment name is the owner's RPC address "host:port",
 * or "name@host:port" to also check the owner's chosen name.  Publishing
 * is therefore free and nothing outlives the owner.
 */
#include "../../core/core.h"

#include <stdlib.h>
#include <string.h>

typedef struct p2p_store {
    ferry_metadata_services_t svc;
} p2p_store_t;

static ferry_status_t p2p_create(const ferry_metadata_services_t *svc, const char *uri,
                                 void **ctx_p)
{
    if (strcmp(uri, "p2p") != 0 && strcmp(uri, "p2p://") != 0) {
        ferry_error("metadata URI \"%s\": the p2p store takes no address (use \"p2p\")", uri);
        return FERRY_ERR_INVALID_PARAM;
    }
    p2p_store_t *store = calloc(1, sizeof(*store));
    if (store == NULL)
        return FERRY_ERR_NO_MEMORY;
    store->svc = *svc;
    *ctx_p = store;
    return FERRY_OK;
}

static void p2p_destroy(void *ctx)
{
    free(ctx);
}

static ferry_status_t p2p_publish(void *ctx, const char *name, const char *descriptor)
{
    return FERRY_OK; /* the engine's RPC listener serves the newest descriptor */
}

static ferry_status_t p2p_fetch(void *ctx, const char *name, char **descriptor_p)
{
    p2p_store_t *store = ctx;
    const char *at = strrchr(name, '@');
    const char *endpoint = at ? at + 1 : name;
    char wanted[1024] = "";
    if (at != NULL) {
        size_t len = (size_t)(at - name);
        if (len >= sizeof(wanted))
            return FERRY_ERR_INVALID_PARAM;
        memcpy(wanted, name, len);
        wanted[len] = '\0';
    }
    if (strchr(endpoint, ':') == NULL) {
        ferry_error("p2p segment \"%s\" is not host:port or name@host:port", name);
        return FERRY_ERR_INVALID_PARAM;
    }
    ferry_status_t status = store->svc.rpc_fetch(store->svc.engine, endpoint, wanted,
                                                 descriptor_p);
    if (status == FERRY_ERR_CONNECT || status == FERRY_ERR_TIMEOUT)
        ferry_error("p2p segment \"%s\": its owner at %s does not answer (%s)", name, endpoint,
                    ferry_status_string(status));
    else if (status != FERRY_OK)
        ferry_error("p2p segment \"%s\": the engine at %s says: %s", name, endpoint,
                    ferry_status_string(status));
    return status;
}

static ferry_status_t p2p_remove(void *ctx, const char *name)
{
    return FERRY_OK;
}

static ferry_status_t p2p_default_name(void *ctx, char **name_p)
{
    p2p_store_t *store = ctx;
    *name_p = strdup(store->svc.rpc_endpoint);
    return *name_p ? FERRY_OK : FERRY_ERR_NO_MEMORY;
}

static const ferry_metadata_ops_t p2p_ops = {
    .size = sizeof(ferry_metadata_ops_t),
    .create = p2p_create,
    .destroy = p2p_destroy,
    .publish = p2p_publish,
    .fetch = p2p_fetch,
    .remove = p2p_remove,
    .default_name = p2p_default_name,
};

static const ferry_plugin_t p2p_plugin = {
    .abi_version = FERRY_PLUGIN_ABI_VERSION,
    .kind = FERRY_PLUGIN_METADATA,
    .name = "p2p",
    .flags = FERRY_METADATA_OWNER_SERVES,
    .description = "serverless: descriptors fetched from their owner over RPC (default outside "
                   "PMIx jobs)",
    .ops = &p2p_ops,
};

const ferry_plugin_t *ferry_p2p_plugin(void)
{
    return &p2p_plugin;
}
