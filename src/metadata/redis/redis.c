/*
 * redis metadata store (hiredis 0.14): one string key per segment, written
 * with SET ... PX <FERRY_REDIS_TTL>.  A background thread renews the expiry
 * (PEXPIRE) every third of the TTL: that is the engine's liveness, so a
 * killed process's segment disappears after the TTL.  When PEXPIRE finds the
 * key gone (a restarted server, an expiry missed while the process was
 * stopped) or a SET failed, the thread stores the newest descriptor again.
 *
 * Connections are pooled; the pool lock is held only to take or give back a
 * connection.  A pooled connection that fails (the server restarted since it
 * was opened) is dropped and the command retried once on a new connection.
 *
 * Change records (md_records.h): one sorted set per segment, K/changes/log
 * beside the segment's key K (the '/' makes it no segment key of the
 * layout), holding the records scored by revision and the head
 * "head:<hex generation>" scored by the newest revision, with the
 * descriptor's expiry.  One key rather than one per revision: a reader
 * gets the records above its revision and the head with one
 * ZRANGEBYSCORE (per-revision keys would need the newest revision first,
 * for an MGET), and the keeper renews one more key, not hundreds.  A
 * write is one pipeline: DEL (restart), ZADD of the records and the head
 * (one command, so no reader sees the head without them), ZREMRANGEBYSCORE
 * (old records), PEXPIRE, then the SET of the descriptor.
 */
#include "../keys.h"
#include "redis.h"

#include <inttypes.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define REDIS_POOL 8

typedef struct redis_settings {
    char *prefix;
    char *cluster;
    unsigned ttl_ms;
    unsigned timeout_ms;
    unsigned retry_ms;
} redis_settings_t;

#define SETTING(name_, default_, doc_, field_, type_)                                          \
    {.name = name_, .default_value = default_, .doc = doc_,                                    \
     .offset = offsetof(redis_settings_t, field_), .type = type_}

static const ferry_setting_t redis_settings[] = {
    FERRY_MD_KEY_SETTINGS(redis_settings_t),
    SETTING("REDIS_TTL", "10s", "expiry of this engine's key in redis, renewed every third of "
            "it: a killed process's segment vanishes after this", ttl_ms,
            FERRY_SETTING_TIME_MS),
    SETTING("REDIS_TIMEOUT", "2000ms", "bound on connecting to redis and on each command",
            timeout_ms, FERRY_SETTING_TIME_MS),
    SETTING("REDIS_RETRY", "500ms", "while redis is unreachable: how often the background "
            "thread retries", retry_ms, FERRY_SETTING_TIME_MS),
};

typedef struct redis_store {
    ferry_metadata_services_t svc;
    redis_settings_t settings;
    ferry_md_keys_t keys;
    char host[256];
    int port;
    char *user;       /* NULL: none */
    char *password;   /* NULL: none */
    int db;
    char where[300];  /* host:port/db, for messages (never the password) */
    pthread_mutex_t pool_lock; /* idle, n_idle */
    redisContext *idle[REDIS_POOL];
    size_t n_idle;
    pthread_mutex_t put_lock; /* serializes writes of our key: an older
                               * descriptor never overwrites a newer one */
    ferry_md_newest_t newest;
    ferry_md_records_t records; /* written with the newest descriptor */
    ferry_md_health_t health;
    ferry_md_worker_t worker;
    int was_down;             /* worker thread only */
} redis_store_t;

/* ---- URI: redis://[user:pass@]host[:port][/db] ---- */

static char *percent_decode(const char *text, size_t length)
{
    char *out = malloc(length + 1), *p = out;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < length; i++) {
        unsigned hi, lo;
        if (text[i] == '%' && i + 2 < length && sscanf(text + i + 1, "%1x%1x", &hi, &lo) == 2) {
            *p++ = (char)(hi << 4 | lo);
            i += 2;
        } else {
            *p++ = text[i];
        }
    }
    *p = '\0';
    return out;
}

static ferry_status_t parse_uri(redis_store_t *store, const char *uri)
{
    const char *p = strncmp(uri, "redis://", 8) == 0 ? uri + 8 : NULL;
    if (p == NULL || *p == '\0')
        goto err_syntax;
    const char *at = strrchr(p, '@');
    if (at != NULL) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (colon == NULL) /* "redis://pass@host": a password alone */
            colon = p - 1;
        if (colon >= p)
            store->user = percent_decode(p, (size_t)(colon - p));
        store->password = percent_decode(colon + 1, (size_t)(at - colon - 1));
        if ((colon >= p && store->user == NULL) || store->password == NULL)
            return FERRY_ERR_NO_MEMORY;
        if (store->user != NULL && store->user[0] == '\0') {
            free(store->user); /* "redis://:pass@host" */
            store->user = NULL;
        }
        p = at + 1;
    }
    size_t hostlen;
    const char *rest;
    if (*p == '[') {
        const char *close = strchr(p, ']');
        if (close == NULL)
            goto err_syntax;
        hostlen = (size_t)(close - p - 1);
        if (hostlen == 0 || hostlen >= sizeof(store->host))
            goto err_syntax;
        memcpy(store->host, p + 1, hostlen);
        rest = close + 1;
    } else {
        hostlen = strcspn(p, ":/");
        if (hostlen == 0 || hostlen >= sizeof(store->host))
            goto err_syntax;
        memcpy(store->host, p, hostlen);
        rest = p + hostlen;
    }
    store->port = 6379;
    char *end;
    if (*rest == ':') {
        long port = strtol(rest + 1, &end, 10);
        if (end == rest + 1 || port <= 0 || port > 65535)
            goto err_syntax;
        store->port = (int)port;
        rest = end;
    }
    if (*rest == '/' && rest[1] != '\0') {
        long db = strtol(rest + 1, &end, 10);
        if (end == rest + 1 || *end != '\0' || db < 0 || db > 1000000)
            goto err_syntax;
        store->db = (int)db;
        rest = end;
    } else if (*rest == '/') {
        rest++;
    }
    if (*rest != '\0')
        goto err_syntax;
    snprintf(store->where, sizeof(store->where), "%s%s%s:%d/%d", strchr(store->host, ':') ? "["
             : "", store->host, strchr(store->host, ':') ? "]" : "", store->port, store->db);
    return FERRY_OK;

err_syntax:
    ferry_error("metadata URI \"%s\" is not redis://[user:password@]host[:port][/db]", uri);
    return FERRY_ERR_INVALID_PARAM;
}

/* ---- connections ---- */

static struct timeval timeval_ms(unsigned ms)
{
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (long)(ms % 1000) * 1000};
}

static redisContext *connect_one(redis_store_t *store, char *why, size_t whylen)
{
    redisContext *c = redisConnectWithTimeout(store->host, store->port,
                                              timeval_ms(store->settings.timeout_ms));
    if (c == NULL || c->err) {
        snprintf(why, whylen, "connect: %s", c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, timeval_ms(store->settings.timeout_ms));
    redisEnableKeepAlive(c);
    redisReply *reply = NULL;
    if (store->password != NULL) {
        /* hiredis 0.14 has no AUTH helper: send the command; Redis 6 ACLs take
         * "AUTH user password", older servers only "AUTH password". */
        if (store->user != NULL)
            reply = redisCommand(c, "AUTH %s %s", store->user, store->password);
        else
            reply = redisCommand(c, "AUTH %s", store->password);
        if (!ferry_redis_reply_ok(reply, why, whylen)) {
            if (reply == NULL)
                snprintf(why, whylen, "AUTH: %s", c->errstr);
            goto err_free;
        }
        freeReplyObject(reply);
    }
    if (store->db != 0) {
        reply = redisCommand(c, "SELECT %d", store->db);
        if (!ferry_redis_reply_ok(reply, why, whylen)) {
            if (reply == NULL)
                snprintf(why, whylen, "SELECT: %s", c->errstr);
            goto err_free;
        }
        freeReplyObject(reply);
    }
    return c;

err_free:
    if (reply)
        freeReplyObject(reply);
    redisFree(c);
    return NULL;
}

static redisContext *take(redis_store_t *store, int *reused_p, char *why, size_t whylen)
{
    redisContext *c = NULL;
    pthread_mutex_lock(&store->pool_lock);
    if (store->n_idle > 0)
        c = store->idle[--store->n_idle];
    pthread_mutex_unlock(&store->pool_lock);
    *reused_p = c != NULL;
    return c ? c : connect_one(store, why, whylen);
}

static void give_back(redis_store_t *store, redisContext *c)
{
    pthread_mutex_lock(&store->pool_lock);
    if (store->n_idle < REDIS_POOL) {
        store->idle[store->n_idle++] = c;
        c = NULL;
    }
    pthread_mutex_unlock(&store->pool_lock);
    if (c)
        redisFree(c);
}

/*
 * One command.  FERRY_OK with *reply_p when redis answered (an error reply
 * included); FERRY_ERR_METADATA when it could not be reached, why saying so.
 */
static ferry_status_t command(redis_store_t *store, int argc, const char **argv,
                              const size_t *lengths, redisReply **reply_p, char *why,
                              size_t whylen)
{
    for (;;) {
        int reused;
        redisContext *c = take(store, &reused, why, whylen);
        if (c == NULL)
            return FERRY_ERR_METADATA;
        redisReply *reply = redisCommandArgv(c, argc, argv, lengths);
        if (reply == NULL || c->err) {
            snprintf(why, whylen, "%s", c->err ? c->errstr : "no reply");
            if (reply)
                freeReplyObject(reply);
            redisFree(c);
            if (reused)
                continue; /* opened before a server restart: try a fresh one */
            return FERRY_ERR_METADATA;
        }
        give_back(store, c);
        *reply_p = reply;
        return FERRY_OK;
    }
}

/*
 * Commands in one round trip, replies[] filled (each to be freed).
 * FERRY_OK when redis answered all of them (error replies included).
 */
static ferry_status_t pipeline(redis_store_t *store, size_t n, const int *argcs,
                               const char *const *const *argvs, const size_t *const *lengths,
                               redisReply **replies, char *why, size_t whylen)
{
    for (;;) {
        int reused;
        redisContext *c = take(store, &reused, why, whylen);
        if (c == NULL)
            return FERRY_ERR_METADATA;
        size_t got = 0;
        int sent = 1;
        for (size_t i = 0; i < n && sent; i++)
            sent = redisAppendCommandArgv(c, argcs[i], (const char **)argvs[i], lengths[i]) ==
                   REDIS_OK;
        while (sent && got < n && redisGetReply(c, (void **)&replies[got]) == REDIS_OK &&
               replies[got] != NULL)
            got++;
        if (got == n && !c->err) {
            give_back(store, c);
            return FERRY_OK;
        }
        snprintf(why, whylen, "%s", c->err ? c->errstr : "no reply");
        for (size_t i = 0; i < got; i++)
            freeReplyObject(replies[i]);
        redisFree(c);
        if (!reused)
            return FERRY_ERR_METADATA;
    }
}

/* The change records waiting, then the descriptor (set: its SET's argv,
 * whose reply goes to *set_reply_p), or the records alone (set NULL).
 * FERRY_OK when redis answered (and, records alone, took them); *reached_p
 * whether it answered at all. */
static ferry_status_t write_with_changes(redis_store_t *store, const char *key, const char **set,
                                         const char *ttl, redisReply **set_reply_p,
                                         int *reached_p, char *why, size_t whylen)
{
    ferry_md_records_batch_t batch;
    int changes = ferry_md_records_take(&store->records, &batch);
    ferry_redis_write_t w = {0};
    redisReply *replies[5] = {0};
    ferry_status_t status = changes < 0 ? FERRY_ERR_NO_MEMORY : FERRY_OK;
    if (changes > 0 && !ferry_redis_write_changes(&w, key, ttl, &batch))
        status = FERRY_ERR_NO_MEMORY;
    if (status == FERRY_OK && set != NULL && !ferry_redis_write_add(&w, 5, set))
        status = FERRY_ERR_NO_MEMORY;
    if (status == FERRY_ERR_NO_MEMORY)
        snprintf(why, whylen, "out of memory");
    if (status == FERRY_OK && w.n > 0)
        status = pipeline(store, w.n, w.argcs, (const char *const *const *)w.argvs,
                          (const size_t *const *)w.lengths, replies, why, whylen);
    *reached_p = status == FERRY_OK;
    size_t n_log = set != NULL && w.n > 0 ? w.n - 1 : w.n;
    int log_failed = 0;
    for (size_t i = 0; status == FERRY_OK && i < n_log; i++) {
        if (replies[i]->type == REDIS_REPLY_ERROR && !log_failed) {
            ferry_warn("redis %s: the change log %s refused a write (%s); readers fetch whole "
                       "descriptors until it takes one", store->where, w.log, replies[i]->str);
            log_failed = 1;
        }
        freeReplyObject(replies[i]);
    }
    if (status == FERRY_OK && set != NULL)
        *set_reply_p = replies[w.n - 1];
    if (log_failed) {
        /* The descriptor went on without its records: no head may stay
         * that says "nothing changed" to a reader behind it. */
        const char *argv[] = {"DEL", w.log};
        size_t lengths[] = {3, strlen(w.log)};
        redisReply *reply = NULL;
        if (command(store, 2, argv, lengths, &reply, why, whylen) == FERRY_OK)
            freeReplyObject(reply);
        ferry_md_records_lost(&store->records);
        if (set == NULL) {
            snprintf(why, whylen, "the change log refused a write");
            status = FERRY_ERR_METADATA;
        }
    } else if (changes > 0 && status == FERRY_OK &&
               (set == NULL || ferry_redis_reply_ok(*set_reply_p, why, whylen))) {
        ferry_md_records_written(&store->records, &batch);
    }
    ferry_redis_write_fini(&w);
    if (changes > 0)
        ferry_md_records_batch_fini(&batch);
    return status;
}

/* ---- operations ---- */

static ferry_status_t set_newest(redis_store_t *store, int quiet)
{
    char *name, *descriptor, *key = NULL, why[256] = "", ttl[32];
    uint64_t version;
    pthread_mutex_lock(&store->put_lock);
    if (!ferry_md_newest_get(&store->newest, &name, &descriptor, &version)) {
        pthread_mutex_unlock(&store->put_lock);
        return FERRY_OK;
    }
    ferry_status_t status = ferry_md_key(&store->keys, name, &key);
    redisReply *reply = NULL;
    int reached = 0;
    if (status == FERRY_OK) {
        snprintf(ttl, sizeof(ttl), "%u", store->settings.ttl_ms ? store->settings.ttl_ms : 1);
        const char *argv[] = {"SET", key, descriptor, "PX", ttl};
        status = write_with_changes(store, key, argv, ttl, &reply, &reached, why, sizeof(why));
        if (status == FERRY_OK && ferry_redis_reply_ok(reply, why, sizeof(why)))
            ferry_md_newest_stored(&store->newest, version);
        else if (status == FERRY_OK)
            status = FERRY_ERR_METADATA;
    }
    pthread_mutex_unlock(&store->put_lock);
    if (status != FERRY_OK && !quiet)
        ferry_error("redis %s: cannot publish segment \"%s\": %s", store->where, name, why);
    if (reply)
        freeReplyObject(reply);
    ferry_md_health_report(&store->health, reached);
    free(key);
    free(name);
    free(descriptor);
    return status == FERRY_ERR_INVALID_PARAM ? status : status ? FERRY_ERR_METADATA : FERRY_OK;
}

static ferry_status_t redis_publish(void *ctx, const char *name, const char *descriptor)
{
    redis_store_t *store = ctx;
    char *key;
    /* A name no key can hold is refused now, not retried forever. */
    ferry_status_t status = ferry_md_key(&store->keys, name, &key);
    if (status != FERRY_OK)
        return status;
    free(key);
    status = ferry_md_newest_set(&store->newest, name, descriptor);
    if (status != FERRY_OK)
        return status;
    ferry_md_records_checkpoint(&store->records);
    if (ferry_md_health_down(&store->health, store->settings.retry_ms)) {
        ferry_md_worker_kick(&store->worker); /* keeps trying; registration goes on */
        return FERRY_ERR_METADATA;
    }
    status = set_newest(store, 0);
    if (status != FERRY_OK)
        ferry_md_worker_kick(&store->worker);
    return status;
}

static ferry_status_t redis_fetch(void *ctx, const char *name, char **descriptor_p)
{
    redis_store_t *store = ctx;
    char *key, why[256] = "";
    ferry_status_t status = ferry_md_key(&store->keys, name, &key);
    if (status != FERRY_OK)
        return status;
    const char *argv[] = {"GET", key};
    size_t lengths[] = {3, strlen(key)};
    redisReply *reply = NULL;
    status = command(store, 2, argv, lengths, &reply, why, sizeof(why));
    free(key);
    if (status != FERRY_OK) {
        ferry_error("redis %s: cannot fetch segment \"%s\": %s", store->where, name, why);
        return FERRY_ERR_METADATA;
    }
    status = ferry_redis_value(reply, descriptor_p, why, sizeof(why));
    if (status == FERRY_ERR_SEGMENT_NOT_FOUND)
        ferry_info("redis %s has no segment \"%s\"", store->where, name);
    else if (status == FERRY_ERR_METADATA || status == FERRY_ERR_DECODE)
        ferry_error("redis %s: segment \"%s\": %s", store->where, name, why);
    freeReplyObject(reply);
    return status;
}

static ferry_status_t redis_publish_changes(void *ctx, const char *name, uint64_t generation,
                                            uint64_t revision, uint64_t oldest,
                                            const char *text)
{
    redis_store_t *store = ctx;
    char *key, why[256] = "", ttl[32];
    ferry_status_t status = ferry_md_records_add(&store->records, generation, revision, oldest,
                                                 text);
    if (status != FERRY_OK || text == NULL)
        return status == FERRY_OK ? FERRY_ERR_NO_RESOURCE : status; /* a checkpoint follows */
    if (ferry_md_health_down(&store->health, store->settings.retry_ms)) {
        ferry_md_worker_kick(&store->worker);
        return FERRY_ERR_METADATA;
    }
    if ((status = ferry_md_key(&store->keys, name, &key)) != FERRY_OK)
        return status;
    snprintf(ttl, sizeof(ttl), "%u", store->settings.ttl_ms ? store->settings.ttl_ms : 1);
    int reached;
    pthread_mutex_lock(&store->put_lock);
    status = write_with_changes(store, key, NULL, ttl, NULL, &reached, why, sizeof(why));
    pthread_mutex_unlock(&store->put_lock);
    ferry_md_health_report(&store->health, reached);
    if (status != FERRY_OK) {
        ferry_error("redis %s: cannot publish the changes of segment \"%s\": %s", store->where,
                    name, why);
        ferry_md_worker_kick(&store->worker);
    }
    free(key);
    return status == FERRY_ERR_NO_MEMORY ? status : status ? FERRY_ERR_METADATA : FERRY_OK;
}

#define FETCH_MAX FERRY_MD_RECORDS_FETCH_MAX

static ferry_status_t redis_fetch_changes(void *ctx, const char *name, uint64_t since,
                                          uint64_t *generation_p, uint64_t *newest_p,
                                          char ***records_p, size_t *count_p)
{
    redis_store_t *store = ctx;
    char *key, *log = NULL, why[256] = "", from[24];
    *records_p = NULL;
    *count_p = 0;
    ferry_status_t status = ferry_md_key(&store->keys, name, &key);
    if (status != FERRY_OK)
        return status;
    char **records = calloc(FETCH_MAX, sizeof(*records));
    if (records == NULL || (log = ferry_redis_log_key(key)) == NULL) {
        free(records);
        free(key);
        return FERRY_ERR_NO_MEMORY;
    }
    /* from `since` itself: the head is there when nothing changed */
    snprintf(from, sizeof(from), "%" PRIu64, since);
    const char *argv[] = {"ZRANGEBYSCORE", log, from, "+inf", "WITHSCORES"};
    size_t lengths[] = {13, strlen(log), strlen(from), 4, 10};
    redisReply *reply = NULL;
    status = command(store, 5, argv, lengths, &reply, why, sizeof(why));
    if (status == FERRY_OK) {
        status = ferry_redis_changes(reply, since, generation_p, newest_p, records, FETCH_MAX,
                                     count_p, why, sizeof(why));
        freeReplyObject(reply);
    }
    if (status == FERRY_OK) {
        *records_p = records;
    } else {
        for (size_t i = 0; i < *count_p; i++)
            free(records[i]);
        *count_p = 0;
        if (status != FERRY_ERR_SEGMENT_NOT_FOUND)
            ferry_error("redis %s: cannot fetch the changes of segment \"%s\": %s",
                        store->where, name, why);
        free(records);
    }
    free(log);
    free(key);
    return status;
}

static ferry_status_t redis_remove(void *ctx, const char *name)
{
    redis_store_t *store = ctx;
    char *key, why[256] = "";
    ferry_md_newest_clear(&store->newest);
    ferry_status_t status = ferry_md_key(&store->keys, name, &key);
    if (status != FERRY_OK)
        return status;
    char *log = ferry_redis_log_key(key);
    const char *argv[] = {"DEL", key, log};
    size_t lengths[] = {3, strlen(key), log ? strlen(log) : 0};
    redisReply *reply = NULL;
    pthread_mutex_lock(&store->put_lock); /* after any SET in flight */
    ferry_md_records_clear(&store->records);
    status = command(store, log ? 3 : 2, argv, lengths, &reply, why, sizeof(why));
    pthread_mutex_unlock(&store->put_lock);
    free(log);
    free(key);
    if (status != FERRY_OK) {
        ferry_warn("redis %s: cannot delete segment \"%s\" (it expires by itself): %s",
                   store->where, name, why);
        return FERRY_ERR_METADATA;
    }
    freeReplyObject(reply);
    return FERRY_OK;
}

/* Renew our key's expiry: 1 renewed, 0 the key is gone, -1 unreachable. */
static int renew(redis_store_t *store)
{
    char *name, *descriptor, *key, why[256] = "", ttl[32];
    uint64_t version;
    if (!ferry_md_newest_get(&store->newest, &name, &descriptor, &version))
        return 1;
    int result = -1;
    if (ferry_md_key(&store->keys, name, &key) == FERRY_OK) {
        snprintf(ttl, sizeof(ttl), "%u", store->settings.ttl_ms ? store->settings.ttl_ms : 1);
        /* the change log beside it, in the same round trip */
        char *log = ferry_redis_log_key(key);
        const char *descriptor_argv[] = {"PEXPIRE", key, ttl}, *log_argv[] = {"PEXPIRE", log, ttl};
        size_t descriptor_lengths[] = {7, strlen(key), strlen(ttl)};
        size_t log_lengths[] = {7, log ? strlen(log) : 0, strlen(ttl)};
        const int argcs[] = {3, 3};
        const char *const *argvs[] = {descriptor_argv, log_argv};
        const size_t *const lengths[] = {descriptor_lengths, log_lengths};
        redisReply *replies[2];
        if (log != NULL && pipeline(store, 2, argcs, argvs, lengths, replies, why,
                                    sizeof(why)) == FERRY_OK) {
            result = ferry_redis_renewed(replies[0]);
            freeReplyObject(replies[0]);
            freeReplyObject(replies[1]);
        }
        free(log);
        free(key);
    }
    free(name);
    free(descriptor);
    return result;
}

static unsigned redis_tick(void *arg)
{
    redis_store_t *store = arg;
    unsigned period = store->settings.ttl_ms / 3 ? store->settings.ttl_ms / 3 : 1;
    int republish = ferry_md_newest_pending(&store->newest) ||
                    ferry_md_records_pending(&store->records);
    if (!republish) {
        int renewed = renew(store);
        if (renewed < 0) {
            ferry_md_health_report(&store->health, 0);
            if (!store->was_down)
                ferry_warn("redis %s does not answer; retrying every %u ms", store->where,
                           store->settings.retry_ms);
            store->was_down = 1;
            return store->settings.retry_ms;
        }
        if (renewed == 0) {
            ferry_info("redis %s lost this engine's segment (restart or expiry); "
                       "republishing", store->where);
            ferry_md_newest_lost(&store->newest);
            ferry_md_records_lost(&store->records);
            republish = 1;
        }
    }
    if (republish) {
        if (set_newest(store, 1) != FERRY_OK) {
            if (!store->was_down)
                ferry_warn("redis %s does not take this engine's segment yet; retrying every "
                           "%u ms", store->where, store->settings.retry_ms);
            store->was_down = 1;
            return store->settings.retry_ms;
        }
        ferry_info("redis %s: segment republished", store->where);
    } else if (store->was_down) {
        ferry_info("redis %s answers again", store->where);
    }
    ferry_md_health_report(&store->health, 1);
    store->was_down = 0;
    return period;
}

static void redis_free(redis_store_t *store)
{
    for (size_t i = 0; i < store->n_idle; i++)
        redisFree(store->idle[i]);
    ferry_md_keys_fini(&store->keys);
    ferry_md_newest_fini(&store->newest);
    ferry_md_records_fini(&store->records);
    ferry_md_health_fini(&store->health);
    pthread_mutex_destroy(&store->pool_lock);
    pthread_mutex_destroy(&store->put_lock);
    ferry_settings_release(redis_settings, FERRY_MD_ARRAY_SIZE(redis_settings),
                           &store->settings);
    free(store->user);
    free(store->password);
    free(store);
}

static ferry_status_t redis_create(const ferry_metadata_services_t *svc, const char *uri,
                                   void **ctx_p)
{
    redis_store_t *store = calloc(1, sizeof(*store));
    if (store == NULL)
        return FERRY_ERR_NO_MEMORY;
    store->svc = *svc;
    ferry_status_t status = ferry_settings_read(NULL, redis_settings,
                                                FERRY_MD_ARRAY_SIZE(redis_settings),
                                                &store->settings);
    if (status != FERRY_OK) {
        free(store);
        return status;
    }
    pthread_mutex_init(&store->pool_lock, NULL);
    pthread_mutex_init(&store->put_lock, NULL);
    ferry_md_newest_init(&store->newest);
    ferry_md_records_init(&store->records);
    ferry_md_health_init(&store->health);
    if (store->settings.retry_ms == 0)
        store->settings.retry_ms = 1;
    status = parse_uri(store, uri);
    if (status == FERRY_OK)
        status = ferry_md_keys_init(&store->keys, store->settings.prefix,
                                    store->settings.cluster);
    if (status == FERRY_OK)
        status = ferry_md_worker_start(&store->worker, redis_tick, store);
    if (status != FERRY_OK) {
        redis_free(store);
        return status;
    }
    *ctx_p = store;
    return FERRY_OK;
}

static void redis_destroy(void *ctx)
{
    redis_store_t *store = ctx;
    ferry_md_worker_stop(&store->worker);
    redis_free(store);
}

static void redis_info(FILE *out)
{
    fprintf(out, "          hiredis %d.%d.%d\n", HIREDIS_MAJOR, HIREDIS_MINOR, HIREDIS_PATCH);
}

static const ferry_metadata_ops_t redis_ops = {
    .size = sizeof(ferry_metadata_ops_t),
    .create = redis_create,
    .destroy = redis_destroy,
    .publish = redis_publish,
    .fetch = redis_fetch,
    .remove = redis_remove,
    .publish_changes = redis_publish_changes,
    .fetch_changes = redis_fetch_changes,
};

static const ferry_plugin_t redis_plugin = {
    .abi_version = FERRY_PLUGIN_ABI_VERSION,
    .kind = FERRY_PLUGIN_METADATA,
    .name = "redis",
    .flags = FERRY_METADATA_COMPACT, /* only Ferry engines read it */
    .description = "redis server: redis://[user:password@]host:port[/db], keys expire unless "
                   "renewed",
    .settings = redis_settings,
    .settings_count = FERRY_MD_ARRAY_SIZE(redis_settings),
    .settings_component = NULL,
    .ops = &redis_ops,
    .info = redis_info,
};

__attribute__((visibility("default"))) const ferry_plugin_t *ferry_plugin_entry(void)
{
    return &redis_plugin;
}
