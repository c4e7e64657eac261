/* Key layout, newest descriptor, background thread: see keys.h. */
#include "keys.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int unreserved(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '.' || c == '_' || c == '~' || c == ':' || c == '@';
}

/* Escaped text of s appended at out (room for 3 * strlen(s)); returns the end. */
static char *escape(char *out, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (unreserved(*p)) {
            *out++ = (char)*p;
        } else {
            *out++ = '%';
            *out++ = hex[*p >> 4];
            *out++ = hex[*p & 15];
        }
    }
    return out;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1; /* escape() writes upper case only: anything else is not ours */
}

ferry_status_t ferry_md_keys_init(ferry_md_keys_t *keys, const char *prefix,
                                  const char *cluster)
{
    size_t plen = strlen(prefix), clen = strlen(cluster);
    if (plen > FERRY_MD_NAME_MAX || clen > FERRY_MD_NAME_MAX) {
        ferry_error("FERRY_METADATA_PREFIX or FERRY_METADATA_CLUSTER is longer than %d bytes",
                    FERRY_MD_NAME_MAX);
        return FERRY_ERR_INVALID_PARAM;
    }
    keys->base = malloc(plen + 3 * clen + 3);
    if (keys->base == NULL)
        return FERRY_ERR_NO_MEMORY;
    char *p = keys->base;
    memcpy(p, prefix, plen);
    p += plen;
    if (plen > 0 && prefix[plen - 1] != '/')
        *p++ = '/';
    if (clen > 0) {
        p = escape(p, cluster);
        *p++ = '/';
    }
    *p = '\0';
    keys->base_len = (size_t)(p - keys->base);
    return FERRY_OK;
}

void ferry_md_keys_fini(ferry_md_keys_t *keys)
{
    free(keys->base);
    keys->base = NULL;
}

ferry_status_t ferry_md_key(const ferry_md_keys_t *keys, const char *name, char **key_p)
{
    size_t len = strlen(name);
    if (len == 0 || len > FERRY_MD_NAME_MAX) {
        ferry_error("segment name of %zu bytes: a store takes 1 to %d bytes", len,
                    FERRY_MD_NAME_MAX);
        return FERRY_ERR_INVALID_PARAM;
    }
    char *key = malloc(keys->base_len + 3 * len + 1);
    if (key == NULL)
        return FERRY_ERR_NO_MEMORY;
    memcpy(key, keys->base, keys->base_len);
    *escape(key + keys->base_len, name) = '\0';
    *key_p = key;
    return FERRY_OK;
}

char *ferry_md_key_name(const ferry_md_keys_t *keys, const char *key, size_t length)
{
    if (length <= keys->base_len || memcmp(key, keys->base, keys->base_len) != 0)
        return NULL;
    key += keys->base_len;
    length -= keys->base_len;
    char *name = malloc(length + 1), *out = name;
    if (name == NULL)
        return NULL;
    for (size_t i = 0; i < length; i++) {
        unsigned char c = (unsigned char)key[i];
        if (c == '%') {
            if (i + 2 >= length)
                goto not_ours;
            int hi = hex_value(key[i + 1]), lo = hex_value(key[i + 2]);
            /* escape() never writes %00 nor escapes an unreserved byte */
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0) || unreserved((unsigned)(hi << 4 | lo)))
                goto not_ours;
            *out++ = (char)(hi << 4 | lo);
            i += 2;
        } else if (unreserved(c)) {
            *out++ = (char)c;
        } else {
            goto not_ours; /* another cluster's key ("a/b") or someone else's */
        }
    }
    *out = '\0';
    return name;

not_ours:
    free(name);
    return NULL;
}

char *ferry_md_strcat3(const char *a, const char *b, const char *c)
{
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *out = malloc(la + lb + lc + 1);
    if (out != NULL) {
        memcpy(out, a, la);
        memcpy(out + la, b, lb);
        memcpy(out + la + lb, c, lc + 1);
    }
    return out;
}

uint64_t ferry_md_now_ms(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
}

/* ---- newest descriptor ---- */

void ferry_md_newest_init(ferry_md_newest_t *newest)
{
    memset(newest, 0, sizeof(*newest));
    pthread_mutex_init(&newest->lock, NULL);
}

void ferry_md_newest_fini(ferry_md_newest_t *newest)
{
    free(newest->name);
    free(newest->descriptor);
    pthread_mutex_destroy(&newest->lock);
}

ferry_status_t ferry_md_newest_set(ferry_md_newest_t *newest, const char *name,
                                   const char *descriptor)
{
    char *name_copy = strdup(name), *copy = strdup(descriptor);
    if (name_copy == NULL || copy == NULL) {
        free(name_copy);
        free(copy);
        return FERRY_ERR_NO_MEMORY;
    }
    pthread_mutex_lock(&newest->lock);
    free(newest->name);
    free(newest->descriptor);
    newest->name = name_copy;
    newest->descriptor = copy;
    newest->version++;
    pthread_mutex_unlock(&newest->lock);
    return FERRY_OK;
}

int ferry_md_newest_get(ferry_md_newest_t *newest, char **name_p, char **descriptor_p,
                        uint64_t *version_p)
{
    int found = 0;
    pthread_mutex_lock(&newest->lock);
    if (newest->descriptor != NULL) {
        *name_p = strdup(newest->name);
        *descriptor_p = strdup(newest->descriptor);
        *version_p = newest->version;
        found = *name_p != NULL && *descriptor_p != NULL;
        if (!found) {
            free(*name_p);
            free(*descriptor_p);
        }
    }
    pthread_mutex_unlock(&newest->lock);
    return found;
}

void ferry_md_newest_stored(ferry_md_newest_t *newest, uint64_t version)
{
    pthread_mutex_lock(&newest->lock);
    if (version > newest->stored)
        newest->stored = version;
    pthread_mutex_unlock(&newest->lock);
}

void ferry_md_newest_lost(ferry_md_newest_t *newest)
{
    pthread_mutex_lock(&newest->lock);
    newest->stored = 0;
    pthread_mutex_unlock(&newest->lock);
}

int ferry_md_newest_pending(ferry_md_newest_t *newest)
{
    pthread_mutex_lock(&newest->lock);
    int pending = newest->descriptor != NULL && newest->stored != newest->version;
    pthread_mutex_unlock(&newest->lock);
    return pending;
}

void ferry_md_newest_clear(ferry_md_newest_t *newest)
{
    pthread_mutex_lock(&newest->lock);
    free(newest->name);
    free(newest->descriptor);
    newest->name = newest->descriptor = NULL;
    newest->stored = newest->version;
    pthread_mutex_unlock(&newest->lock);
}

/* ---- background thread ---- */

static void *worker_main(void *arg)
{
    ferry_md_worker_t *worker = arg;
    pthread_mutex_lock(&worker->lock);
    while (!worker->stop) {
        worker->kicked = 0;
        pthread_mutex_unlock(&worker->lock);
        unsigned delay_ms = worker->tick(worker->arg);
        pthread_mutex_lock(&worker->lock);
        struct timespec deadline;
        ferry_deadline_after_ms(&deadline, CLOCK_MONOTONIC, delay_ms);
        while (!worker->stop && !worker->kicked &&
               pthread_cond_timedwait(&worker->cond, &worker->lock, &deadline) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&worker->lock);
    return NULL;
}

ferry_status_t ferry_md_worker_start(ferry_md_worker_t *worker, unsigned (*tick)(void *arg),
                                     void *arg)
{
    pthread_condattr_t attr;
    memset(worker, 0, sizeof(*worker));
    worker->tick = tick;
    worker->arg = arg;
    pthread_mutex_init(&worker->lock, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&worker->cond, &attr);
    pthread_condattr_destroy(&attr);
    int rc = pthread_create(&worker->thread, NULL, worker_main, worker);
    if (rc != 0) {
        ferry_error("cannot start the metadata store's background thread: %s", strerror(rc));
        pthread_cond_destroy(&worker->cond);
        pthread_mutex_destroy(&worker->lock);
        return FERRY_ERR_NO_RESOURCE;
    }
    worker->started = 1;
    return FERRY_OK;
}

void ferry_md_worker_kick(ferry_md_worker_t *worker)
{
    if (!worker->started)
        return;
    pthread_mutex_lock(&worker->lock);
    worker->kicked = 1;
    pthread_cond_signal(&worker->cond);
    pthread_mutex_unlock(&worker->lock);
}

void ferry_md_worker_stop(ferry_md_worker_t *worker)
{
    if (!worker->started)
        return;
    pthread_mutex_lock(&worker->lock);
    worker->stop = 1;
    pthread_cond_signal(&worker->cond);
    pthread_mutex_unlock(&worker->lock);
    pthread_join(worker->thread, NULL);
    pthread_cond_destroy(&worker->cond);
    pthread_mutex_destroy(&worker->lock);
    worker->started = 0;
}

int ferry_md_worker_stopping(ferry_md_worker_t *worker)
{
    pthread_mutex_lock(&worker->lock);
    int stop = worker->stop;
    pthread_mutex_unlock(&worker->lock);
    return stop;
}

/* ---- server liveness ---- */

void ferry_md_health_init(ferry_md_health_t *health)
{
    pthread_mutex_init(&health->lock, NULL);
    health->failed_at = 0;
}

void ferry_md_health_fini(ferry_md_health_t *health)
{
    pthread_mutex_destroy(&health->lock);
}

void ferry_md_health_report(ferry_md_health_t *health, int ok)
{
    pthread_mutex_lock(&health->lock);
    health->failed_at = ok ? 0 : ferry_md_now_ms();
    pthread_mutex_unlock(&health->lock);
}

int ferry_md_health_down(ferry_md_health_t *health, unsigned retry_ms)
{
    pthread_mutex_lock(&health->lock);
    int down = health->failed_at != 0 && ferry_md_now_ms() - health->failed_at < retry_ms;
    pthread_mutex_unlock(&health->lock);
    return down;
}
