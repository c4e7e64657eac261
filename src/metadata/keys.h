/*
 * Helpers shared by the server-backed metadata stores (etcd, redis, http).
 * This file is compiled into each module: a module may only call libferry's
 * exported API, so nothing here lives in libferry.
 *
 * Key layout (doc/metadata.md):
 *   <prefix><cluster>/<escaped segment name>    FERRY_METADATA_CLUSTER set
 *   <prefix><escaped segment name>              otherwise
 * The prefix (FERRY_METADATA_PREFIX, default "ferry/segments/") is used as
 * given, with a '/' appended when it does not end in one.  The cluster id and
 * the name are escaped: bytes outside [A-Za-z0-9._~:@-] become %XX, so any
 * name is one valid key with no '/' inside, and a key maps back to one name.
 */
#ifndef FERRY_METADATA_KEYS_H
#define FERRY_METADATA_KEYS_H

#include <ferry/plugin.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define FERRY_MD_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
/* Longest segment name a store accepts (escaped, it may triple). */
#define FERRY_MD_NAME_MAX 1024

/* Table entries for the two layout settings; type_ has char *prefix, *cluster.
 * The stores' tables have no component, so these read FERRY_METADATA_*. */
#define FERRY_MD_KEY_SETTINGS(type_)                                                          \
    {.name = "METADATA_PREFIX", .default_value = "ferry/segments/",                          \
     .doc = "key prefix of segment descriptors in etcd, redis and http stores",              \
     .offset = offsetof(type_, prefix), .type = FERRY_SETTING_STRING},                        \
    {.name = "METADATA_CLUSTER", .default_value = "",                                        \
     .doc = "cluster id: engines see only segments published with the same id",              \
     .offset = offsetof(type_, cluster), .type = FERRY_SETTING_STRING}

typedef struct ferry_md_keys {
    char *base;      /* every segment key starts with it */
    size_t base_len;
} ferry_md_keys_t;

ferry_status_t ferry_md_keys_init(ferry_md_keys_t *keys, const char *prefix,
                                  const char *cluster);
void ferry_md_keys_fini(ferry_md_keys_t *keys);
/* The key of a segment name (malloc-ed); FERRY_ERR_INVALID_PARAM for an
 * empty or over-long name. */
ferry_status_t ferry_md_key(const ferry_md_keys_t *keys, const char *name, char **key_p);
/* The segment name of a key (malloc-ed), or NULL when the key is not one of
 * this layout's segment keys. */
char *ferry_md_key_name(const ferry_md_keys_t *keys, const char *key, size_t length);

/* a + b + c, malloc-ed */
char *ferry_md_strcat3(const char *a, const char *b, const char *c);

/* ---- clock ---- */
uint64_t ferry_md_now_ms(void); /* monotonic */

/* ---- the newest descriptor this engine published ----
 * A store keeps it so that a background thread can hand it to a server that
 * missed it (down, restarted, lost its data).  `version` counts publishes;
 * `stored` is the last version a server took. */
typedef struct ferry_md_newest {
    pthread_mutex_t lock;
    char *name;
    char *descriptor;
    uint64_t version;
    uint64_t stored;
} ferry_md_newest_t;

void ferry_md_newest_init(ferry_md_newest_t *newest);
void ferry_md_newest_fini(ferry_md_newest_t *newest);
ferry_status_t ferry_md_newest_set(ferry_md_newest_t *newest, const char *name,
                                   const char *descriptor);
/* Copies of the newest name and descriptor and their version; 0 when none
 * (never published, or removed). */
int ferry_md_newest_get(ferry_md_newest_t *newest, char **name_p, char **descriptor_p,
                        uint64_t *version_p);
void ferry_md_newest_stored(ferry_md_newest_t *newest, uint64_t version);
/* The server lost it (restart, expiry): the next tick stores it again. */
void ferry_md_newest_lost(ferry_md_newest_t *newest);
int ferry_md_newest_pending(ferry_md_newest_t *newest);
/* The engine removed its segment: nothing is republished after this. */
void ferry_md_newest_clear(ferry_md_newest_t *newest);

/* ---- a background thread ----
 * Calls tick(arg) now and then; tick returns the delay in ms until the next
 * call.  kick() runs it again soon, stop() ends it and joins. */
typedef struct ferry_md_worker {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int started, stop, kicked;
    unsigned (*tick)(void *arg);
    void *arg;
} ferry_md_worker_t;

ferry_status_t ferry_md_worker_start(ferry_md_worker_t *worker, unsigned (*tick)(void *arg),
                                     void *arg);
void ferry_md_worker_kick(ferry_md_worker_t *worker);
void ferry_md_worker_stop(ferry_md_worker_t *worker);
int ferry_md_worker_stopping(ferry_md_worker_t *worker);

/* ---- server liveness, for "fail fast while the server is down" ----
 * After a failed call the store skips further calls from the API (publish
 * keeps the descriptor and returns FERRY_ERR_METADATA at once) until
 * retry_ms passed; the background thread keeps trying meanwhile. */
typedef struct ferry_md_health {
    pthread_mutex_t lock;
    uint64_t failed_at; /* 0: the last call succeeded */
} ferry_md_health_t;

void ferry_md_health_init(ferry_md_health_t *health);
void ferry_md_health_fini(ferry_md_health_t *health);
void ferry_md_health_report(ferry_md_health_t *health, int ok);
/* 1 when a call failed less than retry_ms ago. */
int ferry_md_health_down(ferry_md_health_t *health, unsigned retry_ms);

#endif
