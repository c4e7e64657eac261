/* Pooled libcurl requests for the etcd and http stores: see md_curl.h. */
#include "md_curl.h"

#include <stdlib.h>
#include <string.h>

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_status;

static void global_init(void)
{
    /* Never cleaned up: the module stays loaded for the process's life. */
    global_status = curl_global_init(CURL_GLOBAL_DEFAULT);
}

ferry_status_t ferry_md_curl_init(ferry_md_curl_t *pool, unsigned timeout_ms, const char *ca,
                                  const char *cert, const char *key)
{
    pthread_once(&global_once, global_init);
    if (global_status != CURLE_OK) {
        ferry_error("libcurl does not initialize: %s", curl_easy_strerror(global_status));
        return FERRY_ERR_NO_RESOURCE;
    }
    memset(pool, 0, sizeof(*pool));
    pthread_mutex_init(&pool->lock, NULL);
    pool->timeout_ms = timeout_ms ? timeout_ms : 1;
    pool->ca = ca;
    pool->cert = cert;
    pool->key = key;
    return FERRY_OK;
}

void ferry_md_curl_fini(ferry_md_curl_t *pool)
{
    for (size_t i = 0; i < pool->n_idle; i++)
        curl_easy_cleanup(pool->idle[i]);
    pool->n_idle = 0;
    pthread_mutex_destroy(&pool->lock);
}

static CURL *take(ferry_md_curl_t *pool)
{
    CURL *curl = NULL;
    pthread_mutex_lock(&pool->lock);
    if (pool->n_idle > 0)
        curl = pool->idle[--pool->n_idle];
    pthread_mutex_unlock(&pool->lock);
    if (curl == NULL)
        curl = curl_easy_init();
    else
        curl_easy_reset(curl); /* keeps its connection */
    return curl;
}

static void give_back(ferry_md_curl_t *pool, CURL *curl)
{
    pthread_mutex_lock(&pool->lock);
    if (pool->n_idle < FERRY_MD_CURL_POOL) {
        pool->idle[pool->n_idle++] = curl;
        curl = NULL;
    }
    pthread_mutex_unlock(&pool->lock);
    if (curl)
        curl_easy_cleanup(curl);
}

static int set(const char *value)
{
    return value != NULL && *value != '\0';
}

void ferry_md_curl_common(ferry_md_curl_t *pool, CURL *curl)
{
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    /* Metadata servers are inside the cluster: an http_proxy meant for the
     * outside world must not capture them. */
    curl_easy_setopt(curl, CURLOPT_PROXY, "");
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, (long)pool->timeout_ms);
    curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
    if (set(pool->ca))
        curl_easy_setopt(curl, CURLOPT_CAINFO, pool->ca);
    if (set(pool->cert))
        curl_easy_setopt(curl, CURLOPT_SSLCERT, pool->cert);
    if (set(pool->key))
        curl_easy_setopt(curl, CURLOPT_SSLKEY, pool->key);
}

typedef struct sink {
    ferry_md_reply_t *reply;
    size_t capacity;
    size_t max;
    int overflow;
} sink_t;

static size_t on_data(char *data, size_t size, size_t count, void *arg)
{
    sink_t *sink = arg;
    ferry_md_reply_t *reply = sink->reply;
    size_t n = size * count;
    if (reply->length + n > sink->max) {
        sink->overflow = 1;
        return 0; /* aborts the transfer */
    }
    if (reply->length + n + 1 > sink->capacity) {
        size_t capacity = sink->capacity ? sink->capacity : 1024;
        while (capacity < reply->length + n + 1)
            capacity *= 2;
        char *body = realloc(reply->body, capacity);
        if (body == NULL)
            return 0;
        reply->body = body;
        sink->capacity = capacity;
    }
    memcpy(reply->body + reply->length, data, n);
    reply->length += n;
    reply->body[reply->length] = '\0';
    return n;
}

ferry_status_t ferry_md_curl_request(ferry_md_curl_t *pool, const char *method, const char *url,
                                     const char *header, const void *body, size_t length,
                                     size_t max_reply, ferry_md_reply_t *reply)
{
    memset(reply, 0, sizeof(*reply));
    CURL *curl = take(pool);
    if (curl == NULL) {
        snprintf(reply->error, sizeof(reply->error), "curl_easy_init failed");
        return FERRY_ERR_NO_MEMORY;
    }
    sink_t sink = {.reply = reply, .max = max_reply};
    char error[CURL_ERROR_SIZE] = "";
    /* "Expect:" keeps curl from waiting a second for "100 Continue" on
     * large bodies. */
    struct curl_slist *headers = curl_slist_append(NULL, "Expect:");
    if (header != NULL && headers != NULL) {
        struct curl_slist *more = curl_slist_append(headers, header);
        if (more == NULL) {
            curl_slist_free_all(headers);
            headers = NULL;
        }
    }
    ferry_md_curl_common(pool, curl);
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)pool->timeout_ms);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    if (strcmp(method, "HEAD") == 0) {
        curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    } else if (strcmp(method, "GET") != 0 && strcmp(method, "DELETE") != 0) {
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)length);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body ? body : "");
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "POST") != 0 && strcmp(method, "HEAD") != 0)
        curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
    CURLcode rc = headers ? curl_easy_perform(curl) : CURLE_OUT_OF_MEMORY;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply->code);
    curl_slist_free_all(headers);
    /* The pool outlives this call; the error buffer does not. */
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, NULL);
    give_back(pool, curl);

    if (reply->body == NULL && rc == CURLE_OK) {
        reply->body = calloc(1, 1);
        if (reply->body == NULL)
            rc = CURLE_OUT_OF_MEMORY;
    }
    if (rc == CURLE_OK)
        return FERRY_OK;
    if (sink.overflow)
        snprintf(reply->error, sizeof(reply->error), "reply larger than %zu bytes", max_reply);
    else
        snprintf(reply->error, sizeof(reply->error), "%s", error[0] ? error :
                 curl_easy_strerror(rc));
    ferry_md_reply_free(reply);
    reply->code = 0;
    return rc == CURLE_OUT_OF_MEMORY ? FERRY_ERR_NO_MEMORY : FERRY_ERR_METADATA;
}

void ferry_md_reply_free(ferry_md_reply_t *reply)
{
    free(reply->body);
    reply->body = NULL;
    reply->length = 0;
}

char *ferry_md_url_escape(const char *text)
{
    static const char hex[] = "0123456789ABCDEF";
    char *out = malloc(3 * strlen(text) + 1), *p = out;
    if (out == NULL)
        return NULL;
    for (const unsigned char *s = (const unsigned char *)text; *s; s++) {
        unsigned char c = *s;
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
            c == '-' || c == '.' || c == '_' || c == '~') {
            *p++ = (char)c;
        } else {
            *p++ = '%';
            *p++ = hex[c >> 4];
            *p++ = hex[c & 15];
        }
    }
    *p = '\0';
    return out;
}
