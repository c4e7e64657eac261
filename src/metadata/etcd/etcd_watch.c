/*
 * The watch on the segment prefix.  One thread per store:
 *
 *   sync:   range the prefix (keys only) and compare with what it saw last
 *           time; every segment put, changed or deleted meanwhile is
 *           reported (this is what catches up after etcd restarted, even
 *           without its data, when revisions start over);
 *   stream: watch from the range's revision + 1 and report each event,
 *           until the stream breaks (etcd went away) or is canceled;
 *
 * and again, every FERRY_ETCD_RETRY while etcd is unreachable.  Reporting
 * is svc->segment_changed(engine, name) for every segment but this
 * engine's own; no lock of the store is held while calling it.  The thread
 * waits in curl_multi_poll, which ferry_etcd_watch_stop wakes.
 */
#include "etcd.h"

#include <stdlib.h>
#include <string.h>

typedef struct stream {
    etcd_store_t *store;
    char *line;
    size_t length, capacity;
    int broken;       /* canceled or an error: sync again */
} stream_t;

static int is_own(etcd_store_t *store, const char *name)
{
    pthread_mutex_lock(&store->own_lock);
    int own = store->own_name != NULL && strcmp(store->own_name, name) == 0;
    pthread_mutex_unlock(&store->own_lock);
    return own;
}

static void report(etcd_store_t *store, const char *name)
{
    if (is_own(store, name))
        return;
    ferry_debug("etcd %s: segment \"%s\" changed", store->uri, name);
    store->svc.segment_changed(store->svc.engine, name);
}

/* ---- the sorted view of the prefix ---- */

static int by_name(const void *a, const void *b)
{
    return strcmp(((const etcd_seen_t *)a)->name, ((const etcd_seen_t *)b)->name);
}

static etcd_seen_t *seen_find(etcd_seen_t *seen, size_t count, const char *name)
{
    etcd_seen_t probe = {.name = (char *)name};
    return bsearch(&probe, seen, count, sizeof(*seen), by_name);
}

static void seen_free(etcd_seen_t *seen, size_t count)
{
    for (size_t i = 0; i < count; i++)
        free(seen[i].name);
    free(seen);
}

/* Insert or update; removal when mod_revision < 0.  name is taken over. */
static void seen_update(etcd_store_t *store, char *name, int64_t mod_revision)
{
    etcd_seen_t *found = seen_find(store->seen, store->n_seen, name);
    if (found != NULL) {
        if (mod_revision >= 0) {
            found->mod_revision = mod_revision;
        } else {
            free(found->name);
            size_t index = (size_t)(found - store->seen);
            memmove(found, found + 1, (store->n_seen - index - 1) * sizeof(*found));
            store->n_seen--;
        }
        free(name);
        return;
    }
    if (mod_revision < 0) {
        free(name);
        return;
    }
    if (store->n_seen == store->seen_capacity) {
        size_t capacity = store->seen_capacity ? 2 * store->seen_capacity : 64;
        etcd_seen_t *grown = realloc(store->seen, capacity * sizeof(*grown));
        if (grown == NULL) {
            free(name);
            return; /* a later sync reports it */
        }
        store->seen = grown;
        store->seen_capacity = capacity;
    }
    size_t index = 0;
    while (index < store->n_seen && strcmp(store->seen[index].name, name) < 0)
        index++;
    memmove(store->seen + index + 1, store->seen + index,
            (store->n_seen - index) * sizeof(*store->seen));
    store->seen[index] = (etcd_seen_t){.name = name, .mod_revision = mod_revision};
    store->n_seen++;
}

#define HEAD_SUFFIX "/changes/head"

/* Segment name of a base64 key from etcd, or NULL when it is none of ours.
 * A segment's change head (etcd_changes.c) counts as the segment: an owner
 * that publishes a change record and no new checkpoint writes only that
 * (*head_p set), and its readers must hear of it. */
static char *key_name(etcd_store_t *store, const json_t *kv, int *head_p)
{
    const json_t *key = json_object_get(kv, "key");
    char *raw;
    size_t length, suffix = strlen(HEAD_SUFFIX);
    *head_p = 0;
    if (!json_is_string(key) || ferry_etcd_unb64(json_string_value(key), &raw, &length) !=
                                    FERRY_OK)
        return NULL;
    char *name = ferry_md_key_name(&store->keys, raw, length);
    if (name == NULL && length > suffix && memcmp(raw + length - suffix, HEAD_SUFFIX, suffix) == 0) {
        name = ferry_md_key_name(&store->keys, raw, length - suffix);
        *head_p = name != NULL;
    }
    free(raw);
    return name;
}

/* One entry per segment: the newest of its key's and its head's revisions. */
static size_t merge_heads(etcd_seen_t *fresh, size_t n)
{
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (kept > 0 && strcmp(fresh[kept - 1].name, fresh[i].name) == 0) {
            if (fresh[i].mod_revision > fresh[kept - 1].mod_revision)
                fresh[kept - 1].mod_revision = fresh[i].mod_revision;
            free(fresh[i].name);
        } else {
            fresh[kept++] = fresh[i];
        }
    }
    return kept;
}

static json_t *prefix_request(etcd_store_t *store)
{
    size_t end_length;
    char *end = ferry_etcd_prefix_end(store->keys.base, store->keys.base_len, &end_length);
    if (end == NULL)
        return NULL;
    json_t *request = json_pack("{s:o, s:o}", "key",
                                ferry_etcd_b64(store->keys.base, store->keys.base_len),
                                "range_end", ferry_etcd_b64(end, end_length));
    free(end);
    return request;
}

/* Range the prefix; report what changed since the last view.  Fills the
 * revision to watch from. */
static ferry_status_t sync_view(etcd_store_t *store, int64_t *revision_p)
{
    json_t *request = prefix_request(store);
    if (request != NULL)
        json_object_set_new(request, "keys_only", json_true());
    json_t *reply = NULL;
    etcd_error_t error;
    ferry_status_t status = ferry_etcd_call(store, "/v3/kv/range", request, &reply, &error);
    if (status != FERRY_OK) {
        ferry_debug("etcd %s: watch sync: %s", store->uri, error.message);
        return status;
    }
    const json_t *kvs = json_object_get(reply, "kvs");
    size_t count = json_array_size(kvs), n = 0;
    etcd_seen_t *fresh = calloc(count + 1, sizeof(*fresh));
    if (fresh == NULL) {
        json_decref(reply);
        return FERRY_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < count; i++) {
        const json_t *kv = json_array_get(kvs, i);
        int head;
        char *name = key_name(store, kv, &head);
        if (name != NULL)
            fresh[n++] = (etcd_seen_t){name, ferry_etcd_int(kv, "mod_revision")};
    }
    *revision_p = ferry_etcd_int(json_object_get(reply, "header"), "revision");
    json_decref(reply);
    qsort(fresh, n, sizeof(*fresh), by_name);
    n = merge_heads(fresh, n);
    if (store->synced) {
        for (size_t i = 0; i < n; i++) {
            etcd_seen_t *old = seen_find(store->seen, store->n_seen, fresh[i].name);
            if (old == NULL || old->mod_revision != fresh[i].mod_revision)
                report(store, fresh[i].name);
        }
        for (size_t i = 0; i < store->n_seen; i++)
            if (seen_find(fresh, n, store->seen[i].name) == NULL)
                report(store, store->seen[i].name);
    }
    seen_free(store->seen, store->n_seen);
    store->seen = fresh;
    store->n_seen = n;
    store->seen_capacity = count + 1;
    store->synced = 1;
    return FERRY_OK;
}

/* One message of the stream: {"result":{"header":..,"events":[..]}}. */
static void on_message(stream_t *stream, const char *text, size_t length)
{
    etcd_store_t *store = stream->store;
    json_t *root = json_loadb(text, length, 0, NULL);
    const json_t *result = json_object_get(root, "result");
    if (!json_is_object(result)) {
        /* {"error":{...}}: refused (a token that died with an etcd restart
         * included); the next sync authenticates again if need be. */
        ferry_debug("etcd %s: watch stream: %.200s", store->uri, text);
        if (strstr(text, "auth") != NULL)
            ferry_etcd_auth_reset(store);
        stream->broken = 1;
        json_decref(root);
        return;
    }
    if (json_is_true(json_object_get(result, "canceled"))) {
        ferry_debug("etcd %s: watch canceled: %.200s", store->uri, text);
        stream->broken = 1;
    }
    const json_t *events = json_object_get(result, "events");
    for (size_t i = 0; i < json_array_size(events); i++) {
        const json_t *event = json_array_get(events, i);
        const json_t *kv = json_object_get(event, "kv");
        int head;
        char *name = key_name(store, kv, &head);
        if (name == NULL)
            continue;
        /* A PUT has no "type": it is enum value 0, left out. */
        const json_t *type = json_object_get(event, "type");
        int deleted = json_is_string(type) && strcmp(json_string_value(type), "DELETE") == 0;
        report(store, name);
        if (head && deleted)
            free(name); /* records restarting; the segment's key says whether it is gone */
        else
            seen_update(store, name, deleted ? -1 : ferry_etcd_int(kv, "mod_revision"));
    }
    json_decref(root);
}

static size_t on_data(char *data, size_t size, size_t count, void *arg)
{
    stream_t *stream = arg;
    size_t n = size * count;
    for (size_t i = 0; i < n; i++) {
        if (data[i] == '\n') {
            if (stream->length > 0)
                on_message(stream, stream->line, stream->length);
            stream->length = 0;
            continue;
        }
        if (stream->length + 1 >= stream->capacity) {
            size_t capacity = stream->capacity ? 2 * stream->capacity : 4096;
            char *line = capacity <= ((size_t)256 << 20) ? realloc(stream->line, capacity)
                                                         : NULL;
            if (line == NULL)
                return 0; /* abort; the next sync catches up */
            stream->line = line;
            stream->capacity = capacity;
        }
        stream->line[stream->length++] = data[i];
        stream->line[stream->length] = '\0';
    }
    return stream->broken ? 0 : n;
}

/* Watch from revision until the stream ends or we are told to stop. */
static void run_stream(etcd_store_t *store, int64_t revision)
{
    char from[32];
    snprintf(from, sizeof(from), "%lld", (long long)revision);
    json_t *create = prefix_request(store);
    if (create == NULL)
        return;
    json_object_set_new(create, "start_revision", json_string(from));
    json_t *request = json_pack("{s:o}", "create_request", create);
    char *body = request ? json_dumps(request, JSON_COMPACT) : NULL;
    json_decref(request);
    char *url = ferry_md_strcat3(store->endpoints[atomic_load(&store->preferred)],
                                 "/v3/watch", "");
    char *auth = ferry_etcd_auth_header(store);
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (auth != NULL && headers != NULL)
        curl_slist_append(headers, auth);
    CURL *curl = curl_easy_init();
    stream_t stream = {.store = store};
    if (body == NULL || url == NULL || headers == NULL || curl == NULL)
        goto out_free;

    ferry_md_curl_common(&store->curl, curl);
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &stream);
    /* The stream is idle while nothing changes: no total timeout, but TCP
     * keepalive finds a peer that vanished without closing. */
    curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(curl, CURLOPT_TCP_KEEPIDLE, 5L);
    curl_easy_setopt(curl, CURLOPT_TCP_KEEPINTVL, 5L);
    curl_multi_add_handle(store->multi, curl);
    int running = 1;
    while (running && !atomic_load(&store->watch_stop)) {
        if (curl_multi_perform(store->multi, &running) != CURLM_OK)
            break;
        if (running)
            curl_multi_poll(store->multi, NULL, 0, 1000, NULL);
    }
    long http = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http);
    if (http == 401)
        ferry_etcd_auth_reset(store);
    curl_multi_remove_handle(store->multi, curl);

out_free:
    if (curl)
        curl_easy_cleanup(curl);
    curl_slist_free_all(headers);
    free(auth);
    free(url);
    free(body);
    free(stream.line);
}

static void *watch_main(void *arg)
{
    etcd_store_t *store = arg;
    while (!atomic_load(&store->watch_stop)) {
        int64_t revision = 0;
        if (sync_view(store, &revision) == FERRY_OK)
            run_stream(store, revision + 1);
        if (atomic_load(&store->watch_stop))
            break;
        /* etcd went away or canceled the watch: wait a little, sync again. */
        curl_multi_poll(store->multi, NULL, 0, (int)store->settings.retry_ms, NULL);
    }
    return NULL;
}

ferry_status_t ferry_etcd_watch_start(etcd_store_t *store)
{
    store->multi = curl_multi_init();
    if (store->multi == NULL)
        return FERRY_ERR_NO_MEMORY;
    atomic_store(&store->watch_stop, 0);
    int rc = pthread_create(&store->watch_thread, NULL, watch_main, store);
    if (rc != 0) {
        ferry_error("etcd %s: cannot start the watch thread: %s", store->uri, strerror(rc));
        curl_multi_cleanup(store->multi);
        store->multi = NULL;
        return FERRY_ERR_NO_RESOURCE;
    }
    store->watching = 1;
    return FERRY_OK;
}

void ferry_etcd_watch_stop(etcd_store_t *store)
{
    if (!store->watching)
        return;
    atomic_store(&store->watch_stop, 1);
    curl_multi_wakeup(store->multi);
    pthread_join(store->watch_thread, NULL);
    curl_multi_cleanup(store->multi);
    store->multi = NULL;
    store->watching = 0;
    seen_free(store->seen, store->n_seen);
    store->seen = NULL;
    store->n_seen = store->seen_capacity = 0;
}
