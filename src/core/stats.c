/*
 * Statistics of finished requests (ferry.h, ferry_stats_snapshot).  The
 * counters live per peer and per transport slot: a completion adds to one
 * place (the run's peer, the run's transport) with a few relaxed atomic
 * additions per completion call, and snapshots sum them per transport or
 * per peer.  Peers are never removed while the engine lives: a run may
 * count into its peer after the segment was closed, and a peer opened
 * again finds its history.
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

void ferry_stats_init(ferry_engine_stats_t *stats, int enabled)
{
    pthread_mutex_init(&stats->lock, NULL);
    stats->peers = NULL;
    stats->n_peers = stats->capacity = 0;
    stats->other = NULL;
    stats->enabled = enabled;
}

static void peer_free(ferry_peer_stats_t *peer)
{
    if (peer != NULL)
        free(peer->name);
    free(peer);
}

void ferry_stats_fini(ferry_engine_stats_t *stats)
{
    for (size_t i = 0; i < stats->n_peers; i++)
        peer_free(stats->peers[i]);
    free(stats->peers);
    peer_free(stats->other);
    pthread_mutex_destroy(&stats->lock);
}

static ferry_peer_stats_t *peer_new(const char *name)
{
    ferry_peer_stats_t *peer = calloc(1, sizeof(*peer));
    if (peer != NULL && (peer->name = strdup(name)) == NULL) {
        free(peer);
        peer = NULL;
    }
    return peer;
}

/* Caller holds the lock: the entry of name, made if need be. */
static ferry_peer_stats_t *peer_find_or_add(ferry_engine_stats_t *stats, const char *name)
{
    for (size_t i = 0; i < stats->n_peers; i++)
        if (strcmp(stats->peers[i]->name, name) == 0)
            return stats->peers[i];
    if (stats->n_peers >= FERRY_STATS_PEERS_MAX) {
        if (stats->other == NULL)
            stats->other = peer_new("(other peers)");
        return stats->other;
    }
    if (stats->n_peers == stats->capacity) {
        size_t capacity = stats->capacity ? 2 * stats->capacity : 16;
        ferry_peer_stats_t **grown = realloc(stats->peers, capacity * sizeof(*grown));
        if (grown == NULL)
            return NULL;
        stats->peers = grown;
        stats->capacity = capacity;
    }
    ferry_peer_stats_t *peer = peer_new(name);
    if (peer != NULL)
        stats->peers[stats->n_peers++] = peer;
    return peer;
}

ferry_peer_stats_t *ferry_stats_peer(ferry_engine_stats_t *stats, const char *name)
{
    if (!stats->enabled)
        return NULL;
    pthread_mutex_lock(&stats->lock);
    ferry_peer_stats_t *peer = peer_find_or_add(stats, name);
    pthread_mutex_unlock(&stats->lock);
    if (peer == NULL)
        ferry_warn("statistics: out of memory: requests to \"%s\" are not counted", name);
    return peer;
}

static void counters_add(ferry_stats_t *out, ferry_stats_counters_t *c)
{
    out->failures += atomic_load_explicit(&c->failures, memory_order_relaxed);
    out->bytes += atomic_load_explicit(&c->bytes, memory_order_relaxed);
    for (size_t b = 0; b < FERRY_STATS_BUCKETS; b++) {
        uint64_t n = atomic_load_explicit(&c->latency[b], memory_order_relaxed);
        out->latency[b] += n;
        out->requests += n; /* each request is in one bucket */
    }
}

static void counters_zero(ferry_stats_counters_t *c)
{
    atomic_store_explicit(&c->failures, 0, memory_order_relaxed);
    atomic_store_explicit(&c->bytes, 0, memory_order_relaxed);
    for (size_t b = 0; b < FERRY_STATS_BUCKETS; b++)
        atomic_store_explicit(&c->latency[b], 0, memory_order_relaxed);
}

/* Caller holds the lock: the peers, `other` last when there is one. */
static size_t peers_listed(const ferry_engine_stats_t *stats)
{
    return stats->n_peers + (stats->other != NULL);
}

static ferry_peer_stats_t *peer_at(const ferry_engine_stats_t *stats, size_t i)
{
    return i < stats->n_peers ? stats->peers[i] : stats->other;
}

static void fill_by_peer(ferry_engine_stats_t *stats, ferry_stats_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ferry_peer_stats_t *peer = peer_at(stats, i);
        snprintf(out[i].name, sizeof(out[i].name), "%s", peer->name);
        for (size_t slot = 0; slot < FERRY_STATS_SLOTS; slot++)
            counters_add(&out[i], &peer->by_slot[slot]);
    }
}

static void fill_by_transport(ferry_engine_t *engine, ferry_stats_t *out, size_t n)
{
    ferry_engine_stats_t *stats = &engine->stats;
    for (size_t slot = 0; slot < n; slot++) {
        snprintf(out[slot].name, sizeof(out[slot].name), "%s",
                 slot == 0 ? FERRY_LOCAL_TRANSPORT_NAME
                           : engine->transports[slot - 1].plugin->name);
        for (size_t i = 0; i < peers_listed(stats); i++)
            counters_add(&out[slot], &peer_at(stats, i)->by_slot[slot]);
    }
}

ferry_status_t ferry_stats_snapshot(ferry_engine_h handle, ferry_stats_kind_t kind,
                                    ferry_stats_t *stats, size_t max, size_t *count_p)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    if (count_p == NULL || (stats == NULL && max > 0) ||
        (kind != FERRY_STATS_BY_TRANSPORT && kind != FERRY_STATS_BY_PEER))
        return FERRY_ERR_INVALID_PARAM;
    pthread_mutex_lock(&engine->stats.lock);
    size_t n = kind == FERRY_STATS_BY_PEER ? peers_listed(&engine->stats)
                                           : 1 + engine->n_transports;
    size_t filled = n < max ? n : max;
    if (filled > 0)
        memset(stats, 0, filled * sizeof(*stats));
    if (kind == FERRY_STATS_BY_PEER)
        fill_by_peer(&engine->stats, stats, filled);
    else
        fill_by_transport(engine, stats, filled);
    pthread_mutex_unlock(&engine->stats.lock);
    *count_p = n;
    return FERRY_OK;
}

ferry_status_t ferry_stats_reset(ferry_engine_h handle)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    ferry_engine_stats_t *stats = &engine->stats;
    pthread_mutex_lock(&stats->lock);
    for (size_t i = 0; i < peers_listed(stats); i++)
        for (size_t slot = 0; slot < FERRY_STATS_SLOTS; slot++)
            counters_zero(&peer_at(stats, i)->by_slot[slot]);
    pthread_mutex_unlock(&stats->lock);
    return FERRY_OK;
}

uint64_t ferry_stats_latency_ns(const ferry_stats_t *stats, double q)
{
    if (stats == NULL)
        return 0;
    uint64_t total = 0;
    for (size_t b = 0; b < FERRY_STATS_BUCKETS; b++)
        total += stats->latency[b];
    if (total == 0)
        return 0;
    q = q < 0 ? 0 : q > 1 ? 1 : q;
    /* the rank of the request asked for, 1-based: at least the first */
    uint64_t rank = (uint64_t)(q * (double)total + 0.5);
    if (rank == 0)
        rank = 1;
    uint64_t seen = 0;
    for (size_t b = 0; b < FERRY_STATS_BUCKETS; b++) {
        seen += stats->latency[b];
        if (seen >= rank)
            return (uint64_t)2 << b; /* the bucket's upper edge */
    }
    return (uint64_t)2 << (FERRY_STATS_BUCKETS - 1);
}
