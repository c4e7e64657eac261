/* Talking to etcd's JSON gateway: endpoints, failover, auth, base64. */
#include "etcd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The largest reply taken: a 64 MiB descriptor in base64, in JSON. */
#define ETCD_MAX_REPLY ((size_t)96 << 20)

ferry_status_t ferry_etcd_endpoints_parse(etcd_store_t *store, const char *uri)
{
    const char *list = strncmp(uri, "etcd://", 7) == 0 ? uri + 7 : NULL;
    if (list == NULL || *list == '\0')
        goto err_syntax;
    int tls = store->settings.tls || (store->settings.ca && *store->settings.ca) ||
              (store->settings.cert && *store->settings.cert);
    size_t count = 1;
    for (const char *p = list; *p; p++)
        count += *p == ',';
    store->endpoints = calloc(count, sizeof(char *));
    if (store->endpoints == NULL)
        return FERRY_ERR_NO_MEMORY;
    for (const char *p = list; *p != '\0';) {
        size_t n = strcspn(p, ",");
        if (n == 0 || memchr(p, '/', n) != NULL || memchr(p, '@', n) != NULL)
            goto err_syntax;
        /* A bare host gets etcd's client port; "[v6]" alone too. */
        const char *close = memchr(p, ']', n);
        const char *colon = memchr(close ? close : p, ':', n - (size_t)((close ? close : p) - p));
        char *endpoint = malloc(n + 16);
        if (endpoint == NULL)
            return FERRY_ERR_NO_MEMORY;
        snprintf(endpoint, n + 16, "%s://%.*s%s", tls ? "https" : "http", (int)n, p,
                 colon ? "" : ":2379");
        store->endpoints[store->n_endpoints++] = endpoint;
        p += n + (p[n] == ',');
    }
    if (store->n_endpoints == 0)
        goto err_syntax;
    return FERRY_OK;

err_syntax:
    ferry_error("metadata URI \"%s\" is not etcd://host:port[,host:port...]", uri);
    return FERRY_ERR_INVALID_PARAM;
}

/* POST body to path on the endpoints in turn, from the preferred one.
 * FERRY_OK when one answered (any HTTP status). */
static ferry_status_t post(etcd_store_t *store, const char *path, const char *header,
                           const char *body, ferry_md_reply_t *reply, etcd_error_t *error)
{
    size_t first = atomic_load(&store->preferred);
    ferry_status_t status = FERRY_ERR_METADATA;
    error->message[0] = '\0';
    for (size_t i = 0; i < store->n_endpoints; i++) {
        size_t index = (first + i) % store->n_endpoints;
        char *url = ferry_md_strcat3(store->endpoints[index], path, "");
        if (url == NULL)
            return FERRY_ERR_NO_MEMORY;
        status = ferry_md_curl_request(&store->curl, "POST", url, header, body, strlen(body),
                                       ETCD_MAX_REPLY, reply);
        free(url);
        if (status == FERRY_OK) {
            if (index != first) {
                ferry_info("etcd: %s answers (failover from %s)", store->endpoints[index],
                           store->endpoints[first]);
                atomic_store(&store->preferred, index);
            }
            return FERRY_OK;
        }
        size_t used = strlen(error->message);
        snprintf(error->message + used, sizeof(error->message) - used, "%s%s: %s",
                 used ? "; " : "", store->endpoints[index], reply->error);
    }
    error->http = 0;
    error->code = 0;
    return status;
}

/* Fill error from an etcd error reply: {"error":"..","message":"..","code":N}
 * or, on streams, {"error":{"grpc_code":N,"message":".."}}. */
static void parse_error(const json_t *reply, long http, etcd_error_t *error)
{
    error->http = http;
    error->code = 0;
    snprintf(error->message, sizeof(error->message), "HTTP %ld", http);
    const json_t *inner = json_object_get(reply, "error");
    const json_t *from = json_is_object(inner) ? inner : reply;
    const json_t *code = json_object_get(from, json_is_object(inner) ? "grpc_code" : "code");
    const json_t *message = json_object_get(from, "message");
    if (!json_is_string(message))
        message = json_object_get(from, "error");
    if (json_is_integer(code))
        error->code = (int)json_integer_value(code);
    if (json_is_string(message))
        snprintf(error->message, sizeof(error->message), "%s", json_string_value(message));
}

static int auth_failure(const etcd_error_t *error)
{
    return error->code == ETCD_CODE_UNAUTHENTICATED ||
           strstr(error->message, "user name is empty") != NULL ||
           strstr(error->message, "auth token") != NULL;
}

static ferry_status_t authenticate(etcd_store_t *store, etcd_error_t *error)
{
    json_t *request = json_pack("{s:s, s:s}", "name", store->settings.user, "password",
                                store->settings.password ? store->settings.password : "");
    char *body = request ? json_dumps(request, JSON_COMPACT) : NULL;
    json_decref(request);
    if (body == NULL)
        return FERRY_ERR_NO_MEMORY;
    ferry_md_reply_t reply;
    ferry_status_t status = post(store, "/v3/auth/authenticate", NULL, body, &reply, error);
    free(body);
    if (status != FERRY_OK)
        return status;
    json_t *root = json_loadb(reply.body, reply.length, 0, NULL);
    const json_t *token = json_object_get(root, "token");
    if (reply.code == 200 && json_is_string(token)) {
        pthread_mutex_lock(&store->auth_lock);
        free(store->token);
        store->token = strdup(json_string_value(token));
        pthread_mutex_unlock(&store->auth_lock);
    } else {
        parse_error(root, reply.code, error);
        ferry_error("etcd %s: user \"%s\" cannot authenticate: %s", store->uri,
                    store->settings.user, error->message);
        status = FERRY_ERR_METADATA;
    }
    json_decref(root);
    ferry_md_reply_free(&reply);
    return status;
}

char *ferry_etcd_auth_header(etcd_store_t *store)
{
    char *header = NULL;
    if (store->settings.user == NULL || *store->settings.user == '\0')
        return NULL;
    pthread_mutex_lock(&store->auth_lock);
    if (store->token != NULL)
        header = ferry_md_strcat3("Authorization: ", store->token, "");
    pthread_mutex_unlock(&store->auth_lock);
    return header;
}

void ferry_etcd_auth_reset(etcd_store_t *store)
{
    pthread_mutex_lock(&store->auth_lock);
    free(store->token);
    store->token = NULL;
    pthread_mutex_unlock(&store->auth_lock);
}

ferry_status_t ferry_etcd_call(etcd_store_t *store, const char *path, json_t *request,
                               json_t **reply_p, etcd_error_t *error)
{
    char *body = request ? json_dumps(request, JSON_COMPACT) : NULL;
    json_decref(request);
    memset(error, 0, sizeof(*error));
    if (body == NULL)
        return FERRY_ERR_NO_MEMORY;
    int with_auth = store->settings.user != NULL && *store->settings.user != '\0';
    ferry_status_t status = FERRY_ERR_METADATA;
    /* Tokens die with an etcd restart or after --auth-token-ttl idle:
     * authenticate again once when etcd refuses one. */
    for (int attempt = 0; attempt < 2; attempt++) {
        char *header = ferry_etcd_auth_header(store);
        if (with_auth && header == NULL) {
            status = authenticate(store, error);
            if (status != FERRY_OK)
                break;
            header = ferry_etcd_auth_header(store);
        }
        ferry_md_reply_t reply;
        status = post(store, path, header, body, &reply, error);
        free(header);
        if (status != FERRY_OK)
            break;
        long http = reply.code;
        status = ferry_etcd_reply_parse(http, reply.body, reply.length, reply_p, error);
        ferry_md_reply_free(&reply);
        if (status == FERRY_OK) {
            free(body);
            return FERRY_OK;
        }
        if (status == FERRY_ERR_DECODE) {
            status = http == 200 ? FERRY_ERR_DECODE : FERRY_ERR_METADATA;
            break;
        }
        if (!with_auth || attempt > 0 || !auth_failure(error))
            break;
        ferry_etcd_auth_reset(store);
    }
    free(body);
    return status;
}

ferry_status_t ferry_etcd_reply_parse(long http, const char *body, size_t length,
                                      json_t **reply_p, etcd_error_t *error)
{
    json_t *root = json_loadb(body, length, 0, NULL);
    if (root == NULL || !json_is_object(root)) {
        snprintf(error->message, sizeof(error->message), "HTTP %ld, not JSON: %.100s", http,
                 body);
        error->http = http;
        json_decref(root);
        return FERRY_ERR_DECODE;
    }
    const json_t *result = json_object_get(root, "result");
    if (http == 200 && json_object_get(root, "error") == NULL) {
        if (json_is_object(result)) {
            json_t *unwrapped = json_incref((json_t *)result);
            json_decref(root);
            root = unwrapped;
        }
        *reply_p = root;
        return FERRY_OK;
    }
    parse_error(root, http, error);
    json_decref(root);
    return FERRY_ERR_METADATA;
}

ferry_status_t ferry_etcd_range_value(const json_t *reply, char **value_p, size_t *length_p)
{
    const json_t *kvs = json_object_get(reply, "kvs");
    if (kvs == NULL || json_array_size(kvs) == 0)
        return FERRY_ERR_SEGMENT_NOT_FOUND;
    /* An empty value is left out of the reply: it decodes as "". */
    const json_t *value = json_object_get(json_array_get(kvs, 0), "value");
    if (value != NULL && !json_is_string(value))
        return FERRY_ERR_DECODE;
    return ferry_etcd_unb64(value ? json_string_value(value) : "", value_p, length_p);
}

/* ---- base64 and gateway integers ---- */

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

json_t *ferry_etcd_b64(const void *data, size_t length)
{
    const unsigned char *in = data;
    char *out = malloc(4 * ((length + 2) / 3) + 1), *p = out;
    if (out == NULL)
        return NULL;
    size_t i = 0;
    for (; i + 2 < length; i += 3) {
        unsigned v = (unsigned)in[i] << 16 | (unsigned)in[i + 1] << 8 | in[i + 2];
        *p++ = b64_alphabet[v >> 18];
        *p++ = b64_alphabet[(v >> 12) & 63];
        *p++ = b64_alphabet[(v >> 6) & 63];
        *p++ = b64_alphabet[v & 63];
    }
    if (i < length) {
        unsigned v = (unsigned)in[i] << 16 | (i + 1 < length ? (unsigned)in[i + 1] << 8 : 0);
        *p++ = b64_alphabet[v >> 18];
        *p++ = b64_alphabet[(v >> 12) & 63];
        *p++ = i + 1 < length ? b64_alphabet[(v >> 6) & 63] : '=';
        *p++ = '=';
    }
    *p = '\0';
    json_t *string = json_stringn(out, (size_t)(p - out));
    free(out);
    return string;
}

static int b64_value(char c)
{
    const char *at = c ? strchr(b64_alphabet, c) : NULL;
    return at ? (int)(at - b64_alphabet) : -1;
}

ferry_status_t ferry_etcd_unb64(const char *text, char **data_p, size_t *length_p)
{
    size_t len = strlen(text);
    if (len % 4 != 0)
        return FERRY_ERR_DECODE;
    unsigned char *out = malloc(len / 4 * 3 + 1);
    size_t n = 0;
    if (out == NULL)
        return FERRY_ERR_NO_MEMORY;
    for (size_t i = 0; i < len; i += 4) {
        int v[4];
        int pad = 0;
        for (int j = 0; j < 4; j++) {
            if (text[i + j] == '=' && i + 4 == len && j >= 2) {
                v[j] = 0;
                pad++;
            } else if (pad > 0 || (v[j] = b64_value(text[i + j])) < 0) {
                free(out);
                return FERRY_ERR_DECODE;
            }
        }
        unsigned bits = (unsigned)v[0] << 18 | (unsigned)v[1] << 12 | (unsigned)v[2] << 6 |
                        (unsigned)v[3];
        out[n++] = (unsigned char)(bits >> 16);
        if (pad < 2)
            out[n++] = (unsigned char)(bits >> 8);
        if (pad < 1)
            out[n++] = (unsigned char)bits;
    }
    out[n] = '\0';
    *data_p = (char *)out;
    *length_p = n;
    return FERRY_OK;
}

int64_t ferry_etcd_int(const json_t *object, const char *field)
{
    const json_t *value = json_object_get(object, field);
    if (json_is_integer(value))
        return (int64_t)json_integer_value(value);
    if (json_is_string(value))
        return (int64_t)strtoll(json_string_value(value), NULL, 10);
    return 0;
}

char *ferry_etcd_prefix_end(const char *prefix, size_t length, size_t *end_length_p)
{
    char *end = malloc(length + 1);
    if (end == NULL)
        return NULL;
    memcpy(end, prefix, length);
    /* The smallest key greater than every key with this prefix: increment
     * the last byte that is not 0xff, dropping those after it. */
    while (length > 0 && (unsigned char)end[length - 1] == 0xff)
        length--;
    if (length == 0) {
        end[0] = '\0'; /* "\0": every key (etcd's convention) */
        *end_length_p = 1;
        return end;
    }
    end[length - 1] = (char)((unsigned char)end[length - 1] + 1);
    *end_length_p = length;
    return end;
}
