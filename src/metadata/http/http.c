/*
 * http metadata store: descriptors kept by an HTTP key-value server, the
 * protocol of Mooncake's HTTP metadata server, which ferry_metad also
 * speaks: GET / PUT / DELETE <url>?key=K, 404 for a missing key.
 *
 * The server keeps no liveness: a killed engine's descriptor stays until
 * someone deletes it.  A background thread republishes this engine's newest
 * descriptor when a PUT failed, and checks every FERRY_HTTP_REFRESH that the
 * server still has it (a restarted server without persistence has not).
 */
#include "../keys.h"
#include "../md_curl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The decoder refuses larger descriptors anyway. */
#define HTTP_MAX_REPLY ((size_t)64 << 20)

typedef struct http_settings {
    char *prefix;
    char *cluster;
    unsigned timeout_ms;
    unsigned retry_ms;
    unsigned refresh_ms;
} http_settings_t;

#define SETTING(name_, default_, doc_, field_, type_)                                          \
    {.name = name_, .default_value = default_, .doc = doc_,                                    \
     .offset = offsetof(http_settings_t, field_), .type = type_}

static const ferry_setting_t http_settings[] = {
    FERRY_MD_KEY_SETTINGS(http_settings_t),
    SETTING("HTTP_TIMEOUT", "2000ms", "bound on each request to the http metadata server "
            "(connect and reply)", timeout_ms, FERRY_SETTING_TIME_MS),
    SETTING("HTTP_RETRY", "500ms", "while the http metadata server is unreachable: how often "
            "the background thread retries", retry_ms, FERRY_SETTING_TIME_MS),
    SETTING("HTTP_REFRESH", "2000ms", "how often the background thread checks that the server "
            "still has this engine's descriptor (republishes it if not)", refresh_ms,
            FERRY_SETTING_TIME_MS),
};

typedef struct http_store {
    ferry_metadata_services_t svc;
    http_settings_t settings;
    ferry_md_keys_t keys;
    ferry_md_curl_t curl;
    char *uri;               /* as configured, for messages */
    char *url;               /* the metadata URL, "?key=" or "&key=" appended */
    pthread_mutex_t put_lock; /* serializes writes of our key, so an older
                               * descriptor never overwrites a newer one */
    ferry_md_newest_t newest;
    ferry_md_health_t health;
    ferry_md_worker_t worker;
    uint64_t checked_at;     /* worker thread only */
    int no_head;             /* worker thread only: the server refused HEAD */
    int was_down;            /* worker thread only */
} http_store_t;

/* The request URL for a segment (malloc-ed). */
static ferry_status_t key_url(http_store_t *store, const char *name, char **url_p)
{
    char *key;
    ferry_status_t status = ferry_md_key(&store->keys, name, &key);
    if (status != FERRY_OK)
        return status;
    char *escaped = ferry_md_url_escape(key);
    free(key);
    if (escaped == NULL)
        return FERRY_ERR_NO_MEMORY;
    size_t len = strlen(store->url) + strlen(escaped) + 1;
    *url_p = malloc(len);
    if (*url_p != NULL)
        snprintf(*url_p, len, "%s%s", store->url, escaped);
    free(escaped);
    return *url_p ? FERRY_OK : FERRY_ERR_NO_MEMORY;
}

static ferry_status_t request(http_store_t *store, const char *method, const char *name,
                              const char *body, ferry_md_reply_t *reply)
{
    char *url;
    ferry_status_t status = key_url(store, name, &url);
    if (status != FERRY_OK)
        return status;
    status = ferry_md_curl_request(&store->curl, method, url, body ? "Content-Type: "
                                   "application/json" : NULL, body, body ? strlen(body) : 0,
                                   HTTP_MAX_REPLY, reply);
    free(url);
    return status;
}

/* PUT the newest descriptor; quiet: the caller logs. */
static ferry_status_t store_newest(http_store_t *store, int quiet)
{
    char *name, *descriptor;
    uint64_t version;
    ferry_md_reply_t reply;
    pthread_mutex_lock(&store->put_lock);
    if (!ferry_md_newest_get(&store->newest, &name, &descriptor, &version)) {
        pthread_mutex_unlock(&store->put_lock);
        return FERRY_OK;
    }
    ferry_status_t status = request(store, "PUT", name, descriptor, &reply);
    int reached = status == FERRY_OK;
    if (status == FERRY_OK) {
        if (reply.code >= 200 && reply.code < 300) {
            ferry_md_newest_stored(&store->newest, version);
        } else {
            if (!quiet)
                ferry_error("http metadata server %s refused segment \"%s\": HTTP %ld %.200s",
                            store->uri, name, reply.code, reply.body);
            status = FERRY_ERR_METADATA;
        }
        ferry_md_reply_free(&reply);
    } else if (!quiet) {
        ferry_error("http metadata server %s: cannot publish segment \"%s\": %s", store->uri,
                    name, reply.error);
        status = FERRY_ERR_METADATA;
    }
    pthread_mutex_unlock(&store->put_lock);
    ferry_md_health_report(&store->health, reached);
    free(name);
    free(descriptor);
    return status;
}

static ferry_status_t http_publish(void *ctx, const char *name, const char *descriptor)
{
    http_store_t *store = ctx;
    char *key;
    /* A name no key can hold is refused now, not retried forever. */
    ferry_status_t status = ferry_md_key(&store->keys, name, &key);
    if (status != FERRY_OK)
        return status;
    free(key);
    status = ferry_md_newest_set(&store->newest, name, descriptor);
    if (status != FERRY_OK)
        return status;
    if (ferry_md_health_down(&store->health, store->settings.retry_ms)) {
        /* Known down: do not make every registration wait for a timeout. */
        ferry_md_worker_kick(&store->worker);
        return FERRY_ERR_METADATA;
    }
    status = store_newest(store, 0);
    if (status != FERRY_OK)
        ferry_md_worker_kick(&store->worker);
    return status;
}

static ferry_status_t http_fetch(void *ctx, const char *name, char **descriptor_p)
{
    http_store_t *store = ctx;
    ferry_md_reply_t reply;
    ferry_status_t status = request(store, "GET", name, NULL, &reply);
    if (status != FERRY_OK) {
        ferry_error("http metadata server %s: cannot fetch segment \"%s\": %s", store->uri,
                    name, reply.error);
        return status == FERRY_ERR_NO_MEMORY ? status : FERRY_ERR_METADATA;
    }
    if (reply.code == 200) {
        *descriptor_p = reply.body; /* NUL-terminated */
        return FERRY_OK;
    }
    if (reply.code == 404) {
        ferry_info("http metadata server %s has no segment \"%s\"", store->uri, name);
        status = FERRY_ERR_SEGMENT_NOT_FOUND;
    } else {
        ferry_error("http metadata server %s: segment \"%s\": HTTP %ld %.200s", store->uri,
                    name, reply.code, reply.body);
        status = FERRY_ERR_METADATA;
    }
    ferry_md_reply_free(&reply);
    return status;
}

static ferry_status_t http_remove(void *ctx, const char *name)
{
    http_store_t *store = ctx;
    ferry_md_reply_t reply;
    ferry_md_newest_clear(&store->newest);
    pthread_mutex_lock(&store->put_lock); /* after any republish in flight */
    ferry_status_t status = request(store, "DELETE", name, NULL, &reply);
    pthread_mutex_unlock(&store->put_lock);
    if (status != FERRY_OK) {
        ferry_warn("http metadata server %s: cannot delete segment \"%s\": %s", store->uri,
                   name, reply.error);
        return FERRY_ERR_METADATA;
    }
    if (reply.code != 404 && (reply.code < 200 || reply.code >= 300)) {
        ferry_warn("http metadata server %s: deleting segment \"%s\": HTTP %ld", store->uri,
                   name, reply.code);
        status = FERRY_ERR_METADATA;
    }
    ferry_md_reply_free(&reply);
    return status;
}

/* Does the server still hold our segment?  1 yes, 0 no, -1 unreachable. */
static int still_stored(http_store_t *store)
{
    char *name, *descriptor;
    uint64_t version;
    if (!ferry_md_newest_get(&store->newest, &name, &descriptor, &version))
        return 1;
    ferry_md_reply_t reply;
    int held = -1;
    /* HEAD: the answer without the descriptor.  A server that does not know
     * HEAD (405, 501) is asked with GET from then on. */
    if (!store->no_head && request(store, "HEAD", name, NULL, &reply) == FERRY_OK) {
        if (reply.code == 405 || reply.code == 501)
            store->no_head = 1;
        else
            held = reply.code != 404;
        ferry_md_reply_free(&reply);
    }
    if (store->no_head && request(store, "GET", name, NULL, &reply) == FERRY_OK) {
        held = reply.code != 404;
        ferry_md_reply_free(&reply);
    }
    free(name);
    free(descriptor);
    return held;
}

static unsigned http_tick(void *arg)
{
    http_store_t *store = arg;
    uint64_t now = ferry_md_now_ms();
    int republish = ferry_md_newest_pending(&store->newest);
    if (!republish && now - store->checked_at >= store->settings.refresh_ms) {
        store->checked_at = now;
        int held = still_stored(store);
        if (held < 0) {
            ferry_md_health_report(&store->health, 0);
            if (!store->was_down)
                ferry_warn("http metadata server %s does not answer; retrying every %u ms",
                           store->uri, store->settings.retry_ms);
            store->was_down = 1;
            return store->settings.retry_ms;
        }
        if (!held) {
            ferry_info("http metadata server %s lost this engine's segment; republishing",
                       store->uri);
            ferry_md_newest_lost(&store->newest);
            republish = 1;
        }
    }
    if (republish) {
        if (store_newest(store, 1) != FERRY_OK) {
            if (!store->was_down)
                ferry_warn("http metadata server %s does not take this engine's segment yet; "
                           "retrying every %u ms", store->uri, store->settings.retry_ms);
            store->was_down = 1;
            return store->settings.retry_ms;
        }
        ferry_info("http metadata server %s: segment republished", store->uri);
    } else if (store->was_down) {
        ferry_info("http metadata server %s answers again", store->uri);
    }
    store->was_down = 0;
    return store->settings.refresh_ms < store->settings.retry_ms ? store->settings.refresh_ms
                                                                 : store->settings.retry_ms;
}

static void http_free(http_store_t *store)
{
    ferry_md_curl_fini(&store->curl);
    ferry_md_keys_fini(&store->keys);
    ferry_md_newest_fini(&store->newest);
    ferry_md_health_fini(&store->health);
    pthread_mutex_destroy(&store->put_lock);
    ferry_settings_release(http_settings, FERRY_MD_ARRAY_SIZE(http_settings), &store->settings);
    free(store->url);
    free(store->uri);
    free(store);
}

static ferry_status_t http_create(const ferry_metadata_services_t *svc, const char *uri,
                                  void **ctx_p)
{
    const char *host = strncmp(uri, "http://", 7) == 0 ? uri + 7 : NULL;
    if (host == NULL || *host == '\0' || *host == '/') {
        ferry_error("metadata URI \"%s\" is not http://host:port/path", uri);
        return FERRY_ERR_INVALID_PARAM;
    }
    http_store_t *store = calloc(1, sizeof(*store));
    if (store == NULL)
        return FERRY_ERR_NO_MEMORY;
    store->svc = *svc;
    ferry_status_t status = ferry_settings_read(NULL, http_settings,
                                                FERRY_MD_ARRAY_SIZE(http_settings),
                                                &store->settings);
    if (status != FERRY_OK) {
        free(store);
        return status;
    }
    pthread_mutex_init(&store->put_lock, NULL);
    ferry_md_newest_init(&store->newest);
    ferry_md_health_init(&store->health);
    if (store->settings.retry_ms == 0)
        store->settings.retry_ms = 1;
    if (store->settings.refresh_ms == 0)
        store->settings.refresh_ms = 1;
    /* "http://h:p" alone means Mooncake's default path. */
    const char *path = strchr(host, '/');
    store->uri = strdup(uri);
    store->url = ferry_md_strcat3(uri, path ? "" : "/metadata", strchr(uri, '?') ? "&key=" :
                                  "?key=");
    if (store->url == NULL || store->uri == NULL)
        status = FERRY_ERR_NO_MEMORY;
    if (status == FERRY_OK)
        status = ferry_md_keys_init(&store->keys, store->settings.prefix,
                                    store->settings.cluster);
    if (status == FERRY_OK)
        status = ferry_md_curl_init(&store->curl, store->settings.timeout_ms, NULL, NULL, NULL);
    if (status == FERRY_OK)
        status = ferry_md_worker_start(&store->worker, http_tick, store);
    if (status != FERRY_OK) {
        http_free(store);
        return status;
    }
    *ctx_p = store;
    return FERRY_OK;
}

static void http_destroy(void *ctx)
{
    http_store_t *store = ctx;
    ferry_md_worker_stop(&store->worker);
    http_free(store);
}

static void http_info(FILE *out)
{
    curl_version_info_data *info = curl_version_info(CURLVERSION_NOW);
    fprintf(out, "          libcurl %s\n", info ? info->version : "?");
}

static const ferry_metadata_ops_t http_ops = {
    .size = sizeof(ferry_metadata_ops_t),
    .create = http_create,
    .destroy = http_destroy,
    .publish = http_publish,
    .fetch = http_fetch,
    .remove = http_remove,
};

static const ferry_plugin_t http_plugin = {
    .abi_version = FERRY_PLUGIN_ABI_VERSION,
    .kind = FERRY_PLUGIN_METADATA,
    .name = "http",
    .description = "HTTP key-value server (ferry_metad or Mooncake's): http://host:port/metadata",
    .settings = http_settings,
    .settings_count = FERRY_MD_ARRAY_SIZE(http_settings),
    .settings_component = NULL,
    .ops = &http_ops,
    .info = http_info,
};

__attribute__((visibility("default"))) const ferry_plugin_t *ferry_plugin_entry(void)
{
    return &http_plugin;
}
