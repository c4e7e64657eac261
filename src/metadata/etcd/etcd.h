/*
 * etcd metadata store, over etcd's v3 JSON gateway (/v3/...) with libcurl
 * and jansson.  On that gateway keys and values are base64, 64-bit integers
 * are JSON strings, and zero or false fields are left out of replies.
 *
 *   etcd_plugin.c  the store: publish, fetch, remove, the lease keeper
 *   etcd_client.c  endpoints with failover, authentication, JSON calls, base64
 *   etcd_watch.c   the watch on the segment prefix that invalidates caches
 *   etcd_changes.c change records beside the descriptor (incremental refresh)
 *
 * Each engine attaches its key to a lease of FERRY_ETCD_TTL that a
 * background thread keeps alive, so a killed process's segment disappears
 * after the TTL.  That thread also regrants a lease etcd lost and stores the
 * newest descriptor again when etcd missed it (see the republish contract
 * in ferry/plugin.h).
 */
#ifndef FERRY_METADATA_ETCD_H
#define FERRY_METADATA_ETCD_H

#include "../keys.h"
#include "../md_curl.h"
#include "../md_records.h"

#include <jansson.h>
#include <stdatomic.h>

/* etcd's gRPC status codes that matter here */
#define ETCD_CODE_INVALID_ARGUMENT 3
#define ETCD_CODE_DEADLINE_EXCEEDED 4
#define ETCD_CODE_NOT_FOUND 5
#define ETCD_CODE_UNAVAILABLE 14 /* no leader yet, leader changed */
#define ETCD_CODE_UNAUTHENTICATED 16

typedef struct etcd_settings {
    char *prefix;
    char *cluster;
    unsigned ttl_ms;
    unsigned timeout_ms;
    unsigned retry_ms;
    int tls;
    char *ca;
    char *cert;
    char *key;
    char *user;
    char *password;
    int watch;
} etcd_settings_t;

/* What etcd said when a call failed. */
typedef struct etcd_error {
    long http;         /* 0: no etcd endpoint answered */
    int code;          /* gRPC status code from the gateway */
    char message[512];
} etcd_error_t;

/* One entry of the watch's view of the prefix: a segment and its revision. */
typedef struct etcd_seen {
    char *name;
    int64_t mod_revision;
} etcd_seen_t;

typedef struct etcd_store {
    ferry_metadata_services_t svc;
    etcd_settings_t settings;
    ferry_md_keys_t keys;
    ferry_md_curl_t curl;
    char *uri;                 /* for messages */
    char **endpoints;          /* "http://host:port", "https://..." */
    size_t n_endpoints;
    atomic_size_t preferred;   /* the endpoint that answered last */

    pthread_mutex_t auth_lock; /* token */
    char *token;               /* from /v3/auth/authenticate; NULL: none yet */

    /* put_lock serializes lease changes and writes of our key, so an older
     * descriptor never overwrites a newer one.  It is held across the etcd
     * call on purpose; no engine lock is ever held with it. */
    pthread_mutex_t put_lock;
    int64_t lease;             /* put_lock; 0: none granted */
    unsigned lease_ttl_ms;     /* put_lock; what etcd granted */
    ferry_md_newest_t newest;
    ferry_md_records_t records; /* written with the newest descriptor */
    ferry_md_health_t health;
    ferry_md_worker_t keeper;
    int keeper_was_down;       /* keeper thread only */

    pthread_mutex_t own_lock;  /* own_name */
    char *own_name;            /* this engine's segment: the watch skips it */

    /* the watch thread's own state */
    pthread_t watch_thread;
    int watching;
    atomic_int watch_stop;
    void *multi;               /* CURLM *, woken to stop the thread */
    etcd_seen_t *seen;         /* sorted by name */
    size_t n_seen, seen_capacity;
    int synced;                /* seen reflects etcd at least once */
} etcd_store_t;

/* etcd_client.c */
ferry_status_t ferry_etcd_endpoints_parse(etcd_store_t *store, const char *uri);
/*
 * POST a JSON request (taken over, decref-ed) to path on the first endpoint
 * that answers, authenticating first when a user is configured.  A
 * streaming reply's "result" is unwrapped.  FERRY_OK with *reply_p on
 * success; FERRY_ERR_METADATA with *error filled otherwise; FERRY_ERR_DECODE
 * when etcd's reply is not JSON.
 */
ferry_status_t ferry_etcd_call(etcd_store_t *store, const char *path, json_t *request,
                               json_t **reply_p, etcd_error_t *error);
/*
 * What ferry_etcd_call makes of an answer (body: NUL-terminated, length
 * bytes): FERRY_OK with *reply_p when http is 200 and the JSON object holds
 * no "error"; FERRY_ERR_METADATA with *error filled for an error reply;
 * FERRY_ERR_DECODE when the body is not a JSON object.
 */
ferry_status_t ferry_etcd_reply_parse(long http, const char *body, size_t length,
                                      json_t **reply_p, etcd_error_t *error);
/* The first value of a range reply, base64-decoded (malloc-ed, NUL-terminated):
 * FERRY_ERR_SEGMENT_NOT_FOUND when it holds no key, FERRY_ERR_DECODE when
 * the value is not base64 text. */
ferry_status_t ferry_etcd_range_value(const json_t *reply, char **value_p, size_t *length_p);
/* "Authorization: <token>" (malloc-ed), or NULL when no user is configured. */
char *ferry_etcd_auth_header(etcd_store_t *store);
/* After an auth failure: drop the token so the next call authenticates. */
void ferry_etcd_auth_reset(etcd_store_t *store);
json_t *ferry_etcd_b64(const void *data, size_t length);
/* Decoded bytes, NUL-terminated (malloc-ed). */
ferry_status_t ferry_etcd_unb64(const char *text, char **data_p, size_t *length_p);
/* A gateway int64: a JSON string or number; 0 when absent. */
int64_t ferry_etcd_int(const json_t *object, const char *field);
/* range_end that covers every key starting with prefix (malloc-ed). */
char *ferry_etcd_prefix_end(const char *prefix, size_t length, size_t *end_length_p);

/* etcd_changes.c */
/* One transaction: batch's records, its head and the descriptor (NULL:
 * none, records only) under key, on store->lease (caller holds put_lock);
 * a restart deletes the old records first. */
ferry_status_t ferry_etcd_put_with_changes(etcd_store_t *store, const char *key,
                                           const char *descriptor,
                                           const ferry_md_records_batch_t *batch,
                                           etcd_error_t *error);
/* The fetch_changes op (include/ferry/plugin.h). */
ferry_status_t ferry_etcd_fetch_changes(void *ctx, const char *name, uint64_t since,
                                        uint64_t *generation_p, uint64_t *newest_p,
                                        char ***records_p, size_t *count_p);
/* Delete every record of key (the segment is removed). */
void ferry_etcd_delete_changes(etcd_store_t *store, const char *key);

/* etcd_watch.c */
ferry_status_t ferry_etcd_watch_start(etcd_store_t *store);
void ferry_etcd_watch_stop(etcd_store_t *store);

#endif
