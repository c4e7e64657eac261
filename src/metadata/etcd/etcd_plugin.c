/* The etcd store: settings, publish / fetch / remove, and the lease keeper. */
#include "etcd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SETTING(name_, default_, doc_, field_, type_)                                          \
    {.name = name_, .default_value = default_, .doc = doc_,                                    \
     .offset = offsetof(etcd_settings_t, field_), .type = type_}

static const ferry_setting_t etcd_settings[] = {
    FERRY_MD_KEY_SETTINGS(etcd_settings_t),
    SETTING("ETCD_TTL", "10s", "TTL of the lease this engine's key is attached to, kept alive "
            "every third of it: a killed process's segment vanishes after this (whole "
            "seconds)", ttl_ms, FERRY_SETTING_TIME_MS),
    SETTING("ETCD_TIMEOUT", "2000ms", "bound on each request to one etcd endpoint (connect "
            "and reply)", timeout_ms, FERRY_SETTING_TIME_MS),
    SETTING("ETCD_RETRY", "500ms", "while etcd is unreachable: how often the background "
            "threads retry", retry_ms, FERRY_SETTING_TIME_MS),
    SETTING("ETCD_TLS", "n", "talk https to every endpoint (implied by FERRY_ETCD_CA or "
            "FERRY_ETCD_CERT)", tls, FERRY_SETTING_BOOL),
    SETTING("ETCD_CA", "", "CA certificate file (PEM) that signed etcd's server certificate; "
            "empty: the system's CAs", ca, FERRY_SETTING_STRING),
    SETTING("ETCD_CERT", "", "client certificate file (PEM) for etcd's --client-cert-auth",
            cert, FERRY_SETTING_STRING),
    SETTING("ETCD_KEY", "", "private key file (PEM) of FERRY_ETCD_CERT", key,
            FERRY_SETTING_STRING),
    SETTING("ETCD_USER", "", "etcd user (auth enabled); empty: no authentication", user,
            FERRY_SETTING_STRING),
    SETTING("ETCD_PASSWORD", "", "password of FERRY_ETCD_USER", password,
            FERRY_SETTING_STRING),
    SETTING("ETCD_WATCH", "y", "watch the segment prefix so cached descriptors of segments "
            "republished or gone are refreshed before use", watch, FERRY_SETTING_BOOL),
};

static unsigned ttl_seconds(const etcd_store_t *store)
{
    unsigned s = (store->settings.ttl_ms + 999) / 1000;
    return s ? s : 1;
}

/* Grant a lease if we hold none; caller holds put_lock. */
static ferry_status_t ensure_lease(etcd_store_t *store, etcd_error_t *error)
{
    if (store->lease != 0)
        return FERRY_OK;
    json_t *reply = NULL;
    char ttl[32];
    snprintf(ttl, sizeof(ttl), "%u", ttl_seconds(store));
    ferry_status_t status = ferry_etcd_call(store, "/v3/lease/grant",
                                            json_pack("{s:s}", "TTL", ttl), &reply, error);
    if (status != FERRY_OK)
        return status;
    store->lease = ferry_etcd_int(reply, "ID");
    int64_t granted = ferry_etcd_int(reply, "TTL");
    json_decref(reply);
    if (store->lease == 0 || granted <= 0) {
        snprintf(error->message, sizeof(error->message), "lease grant without ID or TTL");
        store->lease = 0;
        return FERRY_ERR_METADATA;
    }
    store->lease_ttl_ms = (unsigned)granted * 1000u;
    ferry_debug("etcd %s: lease %llx granted, TTL %lld s", store->uri,
                (unsigned long long)store->lease, (long long)granted);
    return FERRY_OK;
}

static ferry_status_t put(etcd_store_t *store, const char *key, const char *descriptor,
                          etcd_error_t *error)
{
    char lease[32];
    snprintf(lease, sizeof(lease), "%lld", (long long)store->lease);
    json_t *request = json_pack("{s:o, s:o, s:s}", "key", ferry_etcd_b64(key, strlen(key)),
                                "value", ferry_etcd_b64(descriptor, strlen(descriptor)),
                                "lease", lease);
    json_t *reply = NULL;
    ferry_status_t status = ferry_etcd_call(store, "/v3/kv/put", request, &reply, error);
    json_decref(reply);
    return status;
}

/* Store the newest descriptor under our lease; caller holds put_lock. */
static ferry_status_t put_newest_locked(etcd_store_t *store, etcd_error_t *error)
{
    char *name, *descriptor, *key = NULL;
    uint64_t version;
    memset(error, 0, sizeof(*error));
    if (!ferry_md_newest_get(&store->newest, &name, &descriptor, &version))
        return FERRY_OK;
    ferry_status_t status = ferry_md_key(&store->keys, name, &key);
    if (status == FERRY_OK)
        status = ensure_lease(store, error);
    if (status == FERRY_OK) {
        status = put(store, key, descriptor, error);
        if (status != FERRY_OK && error->code == ETCD_CODE_NOT_FOUND) {
            /* etcd no longer has our lease (expired while we were away, or
             * etcd lost its data): a new one, then the same put. */
            ferry_info("etcd %s: lease %llx is gone; granting a new one", store->uri,
                       (unsigned long long)store->lease);
            store->lease = 0;
            status = ensure_lease(store, error);
            if (status == FERRY_OK)
                status = put(store, key, descriptor, error);
        }
    }
    if (status == FERRY_OK)
        ferry_md_newest_stored(&store->newest, version);
    free(key);
    free(name);
    free(descriptor);
    return status;
}

static ferry_status_t etcd_publish(void *ctx, const char *name, const char *descriptor)
{
    etcd_store_t *store = ctx;
    char *key;
    /* A name no key can hold is refused now, not retried forever. */
    ferry_status_t status = ferry_md_key(&store->keys, name, &key);
    if (status != FERRY_OK)
        return status;
    free(key);
    status = ferry_md_newest_set(&store->newest, name, descriptor);
    if (status != FERRY_OK)
        return status;
    pthread_mutex_lock(&store->own_lock);
    if (store->own_name == NULL || strcmp(store->own_name, name) != 0) {
        free(store->own_name);
        store->own_name = strdup(name);
    }
    pthread_mutex_unlock(&store->own_lock);
    if (ferry_md_health_down(&store->health, store->settings.retry_ms)) {
        /* Known down: the keeper retries; registrations do not wait. */
        ferry_md_worker_kick(&store->keeper);
        return FERRY_ERR_METADATA;
    }
    etcd_error_t error;
    pthread_mutex_lock(&store->put_lock);
    status = put_newest_locked(store, &error);
    pthread_mutex_unlock(&store->put_lock);
    ferry_md_health_report(&store->health, status == FERRY_OK || error.http != 0);
    if (status != FERRY_OK) {
        ferry_error("etcd %s: cannot publish segment \"%s\": %s", store->uri, name,
                    error.message);
        ferry_md_worker_kick(&store->keeper);
        if (status != FERRY_ERR_INVALID_PARAM && status != FERRY_ERR_NO_MEMORY)
            status = FERRY_ERR_METADATA;
    }
    return status;
}

static ferry_status_t etcd_fetch(void *ctx, const char *name, char **descriptor_p)
{
    etcd_store_t *store = ctx;
    char *key;
    ferry_status_t status = ferry_md_key(&store->keys, name, &key);
    if (status != FERRY_OK)
        return status;
    etcd_error_t error;
    json_t *reply = NULL;
    status = ferry_etcd_call(store, "/v3/kv/range",
                             json_pack("{s:o}", "key", ferry_etcd_b64(key, strlen(key))), &reply,
                             &error);
    free(key);
    if (status != FERRY_OK) {
        ferry_error("etcd %s: cannot fetch segment \"%s\": %s", store->uri, name,
                    error.message);
        return status;
    }
    size_t length;
    status = ferry_etcd_range_value(reply, descriptor_p, &length);
    if (status == FERRY_ERR_SEGMENT_NOT_FOUND)
        ferry_info("etcd %s has no segment \"%s\"", store->uri, name);
    if (status == FERRY_ERR_DECODE)
        ferry_error("etcd %s: segment \"%s\": the value is not base64", store->uri, name);
    json_decref(reply);
    return status;
}

static ferry_status_t etcd_remove(void *ctx, const char *name)
{
    etcd_store_t *store = ctx;
    char *key;
    ferry_md_newest_clear(&store->newest);
    ferry_status_t status = ferry_md_key(&store->keys, name, &key);
    if (status != FERRY_OK)
        return status;
    etcd_error_t error;
    json_t *reply = NULL;
    pthread_mutex_lock(&store->put_lock); /* after any put in flight */
    status = ferry_etcd_call(store, "/v3/kv/deleterange",
                             json_pack("{s:o}", "key", ferry_etcd_b64(key, strlen(key))), &reply,
                             &error);
    pthread_mutex_unlock(&store->put_lock);
    free(key);
    json_decref(reply);
    if (status != FERRY_OK)
        ferry_warn("etcd %s: cannot delete segment \"%s\" (it goes with its lease): %s",
                   store->uri, name, error.message);
    return status;
}

/* Keep the lease alive: 1 alive, 0 etcd lost it, -1 unreachable. */
static int keep_alive(etcd_store_t *store)
{
    char id[32];
    snprintf(id, sizeof(id), "%lld", (long long)store->lease);
    etcd_error_t error;
    json_t *reply = NULL;
    ferry_status_t status = ferry_etcd_call(store, "/v3/lease/keepalive",
                                            json_pack("{s:s}", "ID", id), &reply, &error);
    if (status != FERRY_OK) {
        if (error.http != 0 && error.code == ETCD_CODE_NOT_FOUND)
            return 0;
        ferry_debug("etcd %s: keepalive: %s", store->uri, error.message);
        return error.http != 0 ? 1 : -1; /* etcd answered: try again next period */
    }
    /* A lease etcd does not know comes back without a TTL. */
    int alive = ferry_etcd_int(reply, "TTL") > 0;
    json_decref(reply);
    return alive;
}

static unsigned etcd_keeper_tick(void *arg)
{
    etcd_store_t *store = arg;
    unsigned retry = store->settings.retry_ms;
    pthread_mutex_lock(&store->put_lock);
    unsigned ttl_ms = store->lease_ttl_ms ? store->lease_ttl_ms : ttl_seconds(store) * 1000u;
    unsigned period = ttl_ms / 3 ? ttl_ms / 3 : 1;
    if (retry > period)
        retry = period;
    if (store->lease != 0) {
        int alive = keep_alive(store);
        if (alive < 0) {
            pthread_mutex_unlock(&store->put_lock);
            ferry_md_health_report(&store->health, 0);
            if (!store->keeper_was_down)
                ferry_warn("etcd %s does not answer; retrying every %u ms", store->uri, retry);
            store->keeper_was_down = 1;
            return retry;
        }
        if (alive == 0) {
            ferry_info("etcd %s lost lease %llx (expired or etcd restarted without its data); "
                       "granting a new one and republishing", store->uri,
                       (unsigned long long)store->lease);
            store->lease = 0;
            ferry_md_newest_lost(&store->newest);
        }
    }
    int republish = ferry_md_newest_pending(&store->newest);
    etcd_error_t error = {0};
    ferry_status_t status = republish ? put_newest_locked(store, &error) : FERRY_OK;
    pthread_mutex_unlock(&store->put_lock);
    if (status != FERRY_OK) {
        /* Unreachable or electing a leader: retry soon.  Refused (too large,
         * no permission): etcd will not change its mind quickly; try again
         * each period. */
        int refused = error.http != 0 && error.code != ETCD_CODE_UNAVAILABLE &&
                      error.code != ETCD_CODE_DEADLINE_EXCEEDED;
        unsigned again = refused ? period : retry;
        ferry_md_health_report(&store->health, error.http != 0);
        if (!store->keeper_was_down)
            ferry_warn("etcd %s does not take this engine's segment yet (%s); retrying every "
                       "%u ms", store->uri, error.message, again);
        store->keeper_was_down = 1;
        return again;
    }
    ferry_md_health_report(&store->health, 1);
    if (republish)
        ferry_info("etcd %s: segment republished", store->uri);
    else if (store->keeper_was_down)
        ferry_info("etcd %s answers again", store->uri);
    store->keeper_was_down = 0;
    return period;
}

static void etcd_free(etcd_store_t *store)
{
    for (size_t i = 0; i < store->n_endpoints; i++)
        free(store->endpoints[i]);
    free(store->endpoints);
    ferry_md_curl_fini(&store->curl);
    ferry_md_keys_fini(&store->keys);
    ferry_md_newest_fini(&store->newest);
    ferry_md_health_fini(&store->health);
    pthread_mutex_destroy(&store->auth_lock);
    pthread_mutex_destroy(&store->put_lock);
    pthread_mutex_destroy(&store->own_lock);
    ferry_settings_release(etcd_settings, FERRY_MD_ARRAY_SIZE(etcd_settings), &store->settings);
    free(store->token);
    free(store->own_name);
    free(store->uri);
    free(store);
}

static ferry_status_t etcd_create(const ferry_metadata_services_t *svc, const char *uri,
                                  void **ctx_p)
{
    etcd_store_t *store = calloc(1, sizeof(*store));
    if (store == NULL)
        return FERRY_ERR_NO_MEMORY;
    store->svc = *svc;
    ferry_status_t status = ferry_settings_read(NULL, etcd_settings,
                                                FERRY_MD_ARRAY_SIZE(etcd_settings),
                                                &store->settings);
    if (status != FERRY_OK) {
        free(store);
        return status;
    }
    pthread_mutex_init(&store->auth_lock, NULL);
    pthread_mutex_init(&store->put_lock, NULL);
    pthread_mutex_init(&store->own_lock, NULL);
    ferry_md_newest_init(&store->newest);
    ferry_md_health_init(&store->health);
    if (store->settings.retry_ms == 0)
        store->settings.retry_ms = 1;
    store->uri = strdup(uri);
    status = store->uri ? ferry_etcd_endpoints_parse(store, uri) : FERRY_ERR_NO_MEMORY;
    if (status == FERRY_OK)
        status = ferry_md_keys_init(&store->keys, store->settings.prefix,
                                    store->settings.cluster);
    if (status == FERRY_OK)
        status = ferry_md_curl_init(&store->curl, store->settings.timeout_ms,
                                    store->settings.ca, store->settings.cert,
                                    store->settings.key);
    if (status == FERRY_OK)
        status = ferry_md_worker_start(&store->keeper, etcd_keeper_tick, store);
    if (status == FERRY_OK && store->settings.watch) {
        status = ferry_etcd_watch_start(store);
        if (status != FERRY_OK)
            ferry_md_worker_stop(&store->keeper);
    }
    if (status != FERRY_OK) {
        etcd_free(store); /* each part is safe to free zeroed */
        return status;
    }
    *ctx_p = store;
    return FERRY_OK;
}

static void etcd_destroy(void *ctx)
{
    etcd_store_t *store = ctx;
    ferry_etcd_watch_stop(store);
    ferry_md_worker_stop(&store->keeper);
    if (store->lease != 0) {
        /* Revoking deletes whatever is still attached; if etcd is away the
         * lease simply expires. */
        char id[32];
        snprintf(id, sizeof(id), "%lld", (long long)store->lease);
        etcd_error_t error;
        json_t *reply = NULL;
        if (ferry_etcd_call(store, "/v3/lease/revoke", json_pack("{s:s}", "ID", id), &reply,
                            &error) == FERRY_OK)
            json_decref(reply);
    }
    etcd_free(store);
}

static void etcd_info(FILE *out)
{
    curl_version_info_data *info = curl_version_info(CURLVERSION_NOW);
    fprintf(out, "          libcurl %s, jansson %s, etcd v3 JSON gateway (etcd >= 3.4)\n",
            info ? info->version : "?", JANSSON_VERSION);
}

static const ferry_metadata_ops_t etcd_ops = {
    .size = sizeof(ferry_metadata_ops_t),
    .create = etcd_create,
    .destroy = etcd_destroy,
    .publish = etcd_publish,
    .fetch = etcd_fetch,
    .remove = etcd_remove,
};

static const ferry_plugin_t etcd_plugin = {
    .abi_version = FERRY_PLUGIN_ABI_VERSION,
    .kind = FERRY_PLUGIN_METADATA,
    .name = "etcd",
    .flags = FERRY_METADATA_COMPACT, /* only Ferry engines read it */
    .description = "etcd v3: etcd://host:port[,host:port...], keys on a lease kept alive, "
                   "watched for changes",
    .settings = etcd_settings,
    .settings_count = FERRY_MD_ARRAY_SIZE(etcd_settings),
    .settings_component = NULL,
    .ops = &etcd_ops,
    .info = etcd_info,
};

__attribute__((visibility("default"))) const ferry_plugin_t *ferry_plugin_entry(void)
{
    return &etcd_plugin;
}
