/*
 * libcurl for the etcd and http stores (compiled into each module).
 * Easy handles are pooled so requests reuse their connections: a handle is
 * used by one thread at a time, and the pool lock is held only to take or
 * give back a handle, never across a request.
 */
#ifndef FERRY_METADATA_MD_CURL_H
#define FERRY_METADATA_MD_CURL_H

#include <ferry/plugin.h>

#include <curl/curl.h>
#include <pthread.h>

#define FERRY_MD_CURL_POOL 16

typedef struct ferry_md_curl {
    pthread_mutex_t lock; /* idle, n_idle */
    CURL *idle[FERRY_MD_CURL_POOL];
    size_t n_idle;
    unsigned timeout_ms;
    /* borrowed from the store's settings; empty or NULL: unused */
    const char *ca, *cert, *key;
} ferry_md_curl_t;

typedef struct ferry_md_reply {
    long code;     /* HTTP status; 0 when no answer came */
    char *body;    /* NUL-terminated (malloc-ed), also when empty */
    size_t length;
    char error[CURL_ERROR_SIZE + 64]; /* why, when the request failed */
} ferry_md_reply_t;

ferry_status_t ferry_md_curl_init(ferry_md_curl_t *pool, unsigned timeout_ms, const char *ca,
                                  const char *cert, const char *key);
void ferry_md_curl_fini(ferry_md_curl_t *pool);
/* The options every request shares: TLS files, no signals, no proxy from the
 * environment, connect timeout.  Used for streaming requests too. */
void ferry_md_curl_common(ferry_md_curl_t *pool, CURL *curl);
/*
 * One request, bounded by the pool's timeout.  FERRY_OK when the server
 * answered (whatever the status code); FERRY_ERR_METADATA when it could not
 * be reached, did not answer in time, or its reply exceeded max_reply bytes,
 * with reply->error saying why.  header: one extra header line or NULL.
 */
ferry_status_t ferry_md_curl_request(ferry_md_curl_t *pool, const char *method, const char *url,
                                     const char *header, const void *body, size_t length,
                                     size_t max_reply, ferry_md_reply_t *reply);
void ferry_md_reply_free(ferry_md_reply_t *reply);
/* curl_easy_escape without a handle (malloc-ed, free() it). */
char *ferry_md_url_escape(const char *text);

#endif
