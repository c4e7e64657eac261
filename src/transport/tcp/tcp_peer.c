/*
 * tcp initiator side: peers, how many connections each has, and submit.
 *
 * submit() only queues: each slice goes to the live connection with the
 * fewest outstanding bytes, whose I/O thread writes it (tcp_conn.c).  A peer
 * starts with one connection; when the bytes outstanding to it, this submit
 * included, exceed two slices per live connection, the submit opens one more
 * first (up to the bound in tcp.h), so the sockets follow the parallelism
 * asked for: threads submitting at once, or deep batches.  When any
 * connection of a peer breaks, the whole peer fails: every socket is shut
 * down and each connection's thread finishes what it still holds.
 *
 * A connection that ends with nothing queued or in flight is no failure: the
 * target closed it idle (its IDLE_TIMEOUT, or an eviction), or it was
 * retired at half the target's idle timeout so that no request can be on
 * its way when the target closes it.  The next submit opens a new one.
 */
#include "tcp.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---------------- the peer object ---------------- */

void ferry_tcp_peer_ref(ferry_tcp_peer_t *peer)
{
    atomic_fetch_add(&peer->refs, 1);
}

void ferry_tcp_peer_unref(ferry_tcp_peer_t *peer)
{
    if (atomic_fetch_sub(&peer->refs, 1) != 1)
        return;
    /* Every installed connection held a reference until it closed. */
    for (unsigned i = 0; i < FERRY_TCP_MAX_PEER_CONNS; i++)
        free(peer->conns[i]);
    pthread_cond_destroy(&peer->changed);
    pthread_mutex_destroy(&peer->lock);
    free(peer->endpoint);
    free(peer);
}

static ferry_tcp_peer_t *peer_new(ferry_tcp_t *tcp, const ferry_peer_t *desc)
{
    ferry_tcp_peer_t *peer = calloc(1, sizeof(*peer));
    if (peer == NULL)
        return NULL;
    peer->tcp = tcp;
    peer->endpoint = strdup(desc->endpoint);
    peer->generation = desc->generation;
    peer->state = FERRY_TCP_PEER_CONNECTING;
    if (peer->endpoint == NULL) {
        free(peer);
        return NULL;
    }
    atomic_init(&peer->refs, 1);
    pthread_mutex_init(&peer->lock, NULL);
    pthread_cond_init(&peer->changed, NULL);
    return peer;
}

/* Every connection dead with `status` and shut down, so its thread wakes
 * and closes it; the first status set wins.  peer->lock held. */
static void peer_shutdown_locked(ferry_tcp_peer_t *peer, ferry_status_t status)
{
    for (unsigned i = 0; i < FERRY_TCP_MAX_PEER_CONNS; i++) {
        ferry_tcp_conn_t *conn = peer->conns[i];
        if (conn == NULL || conn->closed)
            continue;
        if (!conn->dead) {
            conn->dead = 1;
            conn->fail_status = status;
        }
        shutdown(conn->fd, SHUT_RDWR); /* closed only under this lock */
    }
}

void ferry_tcp_peer_fail(ferry_tcp_peer_t *peer, ferry_status_t why, const char *what)
{
    ferry_tcp_t *tcp = peer->tcp;
    pthread_mutex_lock(&peer->lock);
    int first = !peer->failing;
    peer->failing = 1;
    size_t outstanding = peer->outstanding;
    peer_shutdown_locked(peer, FERRY_ERR_PEER_FAILED);
    pthread_mutex_unlock(&peer->lock);
    if (!first)
        return;
    if (outstanding > 0)
        ferry_warn("tcp: peer %s (generation %016llx) failed while %s: %s; failing %zu "
                   "outstanding bytes",
                   peer->endpoint, (unsigned long long)peer->generation, what,
                   ferry_status_string(why), outstanding);
    else /* an idle peer that went away, e.g. its engine was destroyed */
        ferry_debug("tcp: idle peer %s (generation %016llx) closed: %s", peer->endpoint,
                    (unsigned long long)peer->generation, ferry_status_string(why));
    pthread_mutex_lock(&tcp->lock);
    if (peer->state == FERRY_TCP_PEER_READY)
        peer->state = FERRY_TCP_PEER_FAILED;
    pthread_mutex_unlock(&tcp->lock);
}

/* Our own shutdown (forget, stop): no failure to report.  Waits until every
 * connection has finished its slices, unless called on an I/O thread (from
 * a completion), which must not wait for itself: they finish just after.
 * Drops the caller's reference. */
static void peer_stop(ferry_tcp_peer_t *peer)
{
    pthread_mutex_lock(&peer->lock);
    peer->failing = 1;
    peer_shutdown_locked(peer, FERRY_ERR_CANCELED);
    while (ferry_tcp_worker_self() == NULL && (peer->n_open > 0 || peer->opening))
        pthread_cond_wait(&peer->changed, &peer->lock);
    pthread_mutex_unlock(&peer->lock);
    ferry_tcp_peer_unref(peer);
}

/* ---------------- connections ---------------- */

/* Open one more connection on the calling thread and hand it to an I/O
 * thread.  The first one also learns the target's limits. */
static ferry_status_t peer_open_conn(ferry_tcp_peer_t *peer, int first)
{
    ferry_tcp_t *tcp = peer->tcp;
    int fd;
    uint64_t max_slice;
    unsigned idle_timeout;
    ferry_status_t status = ferry_tcp_conn_open(tcp, peer, &fd, &max_slice, &idle_timeout);
    if (status != FERRY_OK)
        return status;
    if (first) {
        peer->max_slice = max_slice;
        peer->idle_timeout_ms = idle_timeout;
    }
    ferry_tcp_conn_t *conn = NULL;
    pthread_mutex_lock(&peer->lock);
    unsigned slot = FERRY_TCP_MAX_PEER_CONNS;
    for (unsigned i = 0; i < FERRY_TCP_MAX_PEER_CONNS && slot == FERRY_TCP_MAX_PEER_CONNS; i++) {
        if (peer->conns[i] == NULL || peer->conns[i]->closed)
            slot = i;
    }
    if (!peer->failing && slot < FERRY_TCP_MAX_PEER_CONNS) {
        free(peer->conns[slot]); /* closed: its thread is done with it */
        peer->conns[slot] = conn = calloc(1, sizeof(*conn));
    }
    if (conn != NULL) {
        conn->peer = peer;
        conn->worker = ferry_tcp_worker_next(tcp);
        conn->fd = fd;
        conn->index = slot;
        atomic_init(&conn->last_activity_ms, ferry_time_ms());
        peer->n_open++;
        ferry_tcp_peer_ref(peer); /* the connection's, until it closes */
    }
    status = conn != NULL ? FERRY_OK : peer->failing ? FERRY_ERR_PEER_FAILED : FERRY_ERR_NO_MEMORY;
    pthread_mutex_unlock(&peer->lock);
    if (conn == NULL) {
        close(fd);
        return status;
    }
    pthread_mutex_lock(&tcp->lock);
    tcp->conns_open++;
    pthread_mutex_unlock(&tcp->lock);
    ferry_tcp_conn_adopt(conn);
    return FERRY_OK;
}

/* Live connections; one idle past half the target's idle timeout is retired
 * on the way (its thread closes it).  peer->lock held. */
static unsigned count_live_locked(ferry_tcp_peer_t *peer)
{
    unsigned live = 0, idle_timeout = peer->idle_timeout_ms;
    uint64_t now = 0;
    for (unsigned i = 0; i < FERRY_TCP_MAX_PEER_CONNS; i++) {
        ferry_tcp_conn_t *conn = peer->conns[i];
        if (conn == NULL || conn->dead)
            continue;
        if (idle_timeout != 0 && conn->outstanding == 0) {
            now = now ? now : ferry_time_ms();
            uint64_t last = atomic_load(&conn->last_activity_ms);
            if (now > last && now - last >= idle_timeout / 2) {
                conn->dead = conn->closed_idle = 1;
                conn->fail_status = FERRY_ERR_CANCELED;
                shutdown(conn->fd, SHUT_RDWR);
                continue;
            }
        }
        live++;
    }
    return live;
}

/* How many connections the outstanding bytes ask for: one per two slices. */
static unsigned wanted_conns(const ferry_tcp_peer_t *peer, size_t adding)
{
    const ferry_tcp_t *tcp = peer->tcp;
    size_t per_conn = 2 * tcp->settings.slice_size;
    size_t want = (peer->outstanding + adding + per_conn - 1) / per_conn;
    return (unsigned)FERRY_MAX((size_t)1, FERRY_MIN(want, (size_t)tcp->max_peer_conns));
}

/* Enough live connections for what is outstanding plus `adding` bytes: one
 * more is opened when the bytes ask for it and nobody is opening one; with
 * none live, wait for whoever opens.  The live count; 0 with *status_p set
 * when none could be had.  peer->lock held (released while connecting). */
static unsigned ensure_conns_locked(ferry_tcp_peer_t *peer, size_t adding,
                                    ferry_status_t *status_p)
{
    unsigned live = count_live_locked(peer);
    for (;;) {
        if (peer->failing) {
            *status_p = FERRY_ERR_PEER_FAILED;
            return 0;
        }
        int more = live < wanted_conns(peer, adding);
        if ((live == 0 || more) && !peer->opening) {
            peer->opening = 1;
            pthread_mutex_unlock(&peer->lock);
            ferry_status_t status = peer_open_conn(peer, 0);
            pthread_mutex_lock(&peer->lock);
            peer->opening = 0;
            pthread_cond_broadcast(&peer->changed);
            unsigned before = live;
            live = count_live_locked(peer);
            if (status != FERRY_OK && live == 0) {
                *status_p = status;
                return 0;
            }
            if (status != FERRY_OK || live <= before) {
                if (status != FERRY_OK)
                    ferry_debug("tcp: another connection to %s failed: %s; using %u",
                                peer->endpoint, ferry_status_string(status), live);
                return live; /* no second try in this submit */
            }
            continue;
        }
        if (live > 0)
            return live;
        pthread_cond_wait(&peer->changed, &peer->lock);
        live = count_live_locked(peer);
    }
}

/* Queue every slice on the peer's live connections, or none. */
static ferry_status_t peer_queue(ferry_tcp_peer_t *peer, ferry_slice_t *slices, size_t bytes)
{
    ferry_status_t status = FERRY_OK;
    pthread_mutex_lock(&peer->lock);
    if (ensure_conns_locked(peer, bytes, &status) == 0) {
        pthread_mutex_unlock(&peer->lock);
        return status;
    }
    for (ferry_slice_t *s = slices, *next; s != NULL; s = next) {
        next = s->next;
        s->next = NULL;
        ferry_tcp_conn_t *best = NULL;
        for (unsigned i = 0; i < FERRY_TCP_MAX_PEER_CONNS; i++) {
            ferry_tcp_conn_t *conn = peer->conns[i];
            if (conn != NULL && !conn->dead &&
                (best == NULL || conn->outstanding < best->outstanding))
                best = conn;
        }
        if (best->outstanding == 0) /* the quiet-time clock starts with the first slice */
            atomic_store(&best->last_activity_ms, ferry_time_ms());
        best->outstanding += s->length;
        peer->outstanding += s->length;
        if (best->queue_tail != NULL)
            best->queue_tail->next = s;
        else
            best->queue_head = s;
        best->queue_tail = s;
        ferry_tcp_conn_arm_locked(best);
    }
    pthread_mutex_unlock(&peer->lock);
    return FERRY_OK;
}

/* ---------------- the peer table (tcp->lock) ---------------- */

static ferry_tcp_peer_t **table_slot(ferry_tcp_t *tcp, const char *endpoint, uint64_t generation)
{
    uint64_t hash = 1469598103934665603ull ^ generation; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)endpoint; *p; p++)
        hash = (hash ^ *p) * 1099511628211ull;
    ferry_tcp_peer_t **pp = &tcp->buckets[hash % FERRY_TCP_PEER_BUCKETS];
    while (*pp != NULL &&
           ((*pp)->generation != generation || strcmp((*pp)->endpoint, endpoint) != 0))
        pp = &(*pp)->next;
    return pp;
}

/* Out of the table (if still there); 1: the caller drops the table's reference. */
static int peer_retire_locked(ferry_tcp_t *tcp, ferry_tcp_peer_t *peer)
{
    ferry_tcp_peer_t **pp = table_slot(tcp, peer->endpoint, peer->generation);
    if (*pp != peer)
        return 0;
    *pp = peer->next;
    peer->state = FERRY_TCP_PEER_GONE;
    return 1;
}

static void peer_retire(ferry_tcp_t *tcp, ferry_tcp_peer_t *peer)
{
    pthread_mutex_lock(&tcp->lock);
    int retired = peer_retire_locked(tcp, peer);
    pthread_mutex_unlock(&tcp->lock);
    if (retired)
        ferry_tcp_peer_unref(peer);
}

/* A new peer's first connection, opened by the submit that created it. */
static ferry_status_t peer_connect(ferry_tcp_t *tcp, ferry_tcp_peer_t *peer)
{
    ferry_status_t status = peer_open_conn(peer, 1);
    pthread_mutex_lock(&tcp->lock);
    if (status == FERRY_OK) {
        /* the connection may have broken already; peer_fail could not mark it */
        pthread_mutex_lock(&peer->lock);
        int failing = peer->failing;
        pthread_mutex_unlock(&peer->lock);
        peer->state = failing ? FERRY_TCP_PEER_FAILED : FERRY_TCP_PEER_READY;
        ferry_debug("tcp: connected to %s (generation %016llx)", peer->endpoint,
                    (unsigned long long)peer->generation);
    } else {
        *table_slot(tcp, peer->endpoint, peer->generation) = peer->next;
        peer->state = FERRY_TCP_PEER_GONE;
        peer->connect_status = status;
        atomic_fetch_sub(&peer->refs, 1); /* the table's; the caller's is still held */
    }
    pthread_cond_broadcast(&tcp->settled);
    pthread_mutex_unlock(&tcp->lock);
    return status;
}

/* A READY peer for desc, referenced; connects it first if needed. */
static ferry_status_t peer_get(ferry_tcp_t *tcp, const ferry_peer_t *desc,
                               ferry_tcp_peer_t **peer_p)
{
    pthread_mutex_lock(&tcp->lock);
    if (tcp->stopped) {
        pthread_mutex_unlock(&tcp->lock);
        return FERRY_ERR_CANCELED;
    }
    ferry_status_t status = FERRY_OK;
    ferry_tcp_peer_t **slot = table_slot(tcp, desc->endpoint, desc->generation);
    ferry_tcp_peer_t *peer = *slot;
    if (peer != NULL && peer->state == FERRY_TCP_PEER_FAILED) {
        /* Said once, so the engine refreshes and retries; that retry (or
         * the next submit) connects afresh. */
        int retired = peer_retire_locked(tcp, peer);
        pthread_mutex_unlock(&tcp->lock);
        if (retired)
            ferry_tcp_peer_unref(peer);
        return FERRY_ERR_PEER_FAILED;
    }
    if (peer != NULL) {
        ferry_tcp_peer_ref(peer);
        while (peer->state == FERRY_TCP_PEER_CONNECTING)
            pthread_cond_wait(&tcp->settled, &tcp->lock);
        if (peer->state == FERRY_TCP_PEER_FAILED)
            status = FERRY_ERR_PEER_FAILED;
        else if (peer->state == FERRY_TCP_PEER_GONE)
            status = peer->connect_status;
        pthread_mutex_unlock(&tcp->lock);
    } else {
        if ((peer = peer_new(tcp, desc)) == NULL) {
            pthread_mutex_unlock(&tcp->lock);
            return FERRY_ERR_NO_MEMORY;
        }
        atomic_store(&peer->refs, 2); /* the table's and ours */
        *slot = peer;
        pthread_mutex_unlock(&tcp->lock);
        status = peer_connect(tcp, peer);
    }
    if (status != FERRY_OK) {
        ferry_tcp_peer_unref(peer);
        return status;
    }
    *peer_p = peer;
    return FERRY_OK;
}

ferry_status_t ferry_tcp_submit(void *ctx, const ferry_peer_t *desc, ferry_slice_t *slices)
{
    ferry_tcp_t *tcp = ctx;
    if (desc == NULL || desc->endpoint == NULL || *desc->endpoint == '\0' || slices == NULL)
        return FERRY_ERR_INVALID_PARAM;
    size_t bytes = 0;
    for (ferry_slice_t *s = slices; s != NULL; s = s->next) {
        if (s->length == 0 || s->local == NULL ||
            (s->opcode != FERRY_OP_READ && s->opcode != FERRY_OP_WRITE))
            return FERRY_ERR_INVALID_PARAM;
        bytes += s->length;
    }
    ferry_tcp_peer_t *peer;
    ferry_status_t status = peer_get(tcp, desc, &peer);
    if (status != FERRY_OK)
        return status;
    for (ferry_slice_t *s = slices; s != NULL; s = s->next) {
        if (s->length > peer->max_slice) {
            ferry_error("tcp: a %zu-byte slice exceeds the %llu bytes %s accepts "
                        "(FERRY_TCP_MAX_SLICE there, FERRY_TCP_SLICE_SIZE here)",
                        s->length, (unsigned long long)peer->max_slice, peer->endpoint);
            ferry_tcp_peer_unref(peer);
            return FERRY_ERR_INVALID_PARAM;
        }
    }
    status = peer_queue(peer, slices, bytes);
    if (status != FERRY_OK && status != FERRY_ERR_STALE && status != FERRY_ERR_NO_MEMORY) {
        /* This submit was told; the next connects afresh. */
        peer_retire(tcp, peer);
        if (status != FERRY_ERR_CONNECT)
            status = FERRY_ERR_PEER_FAILED;
    } else if (status == FERRY_ERR_STALE) {
        peer_retire(tcp, peer);
    }
    ferry_tcp_peer_unref(peer);
    return status;
}

/* ---------------- forgetting ---------------- */

void ferry_tcp_peer_forget(void *ctx, const ferry_peer_t *desc)
{
    ferry_tcp_t *tcp = ctx;
    if (desc == NULL || desc->endpoint == NULL)
        return;
    ferry_tcp_peer_t *peer;
    pthread_mutex_lock(&tcp->lock);
    for (;;) {
        ferry_tcp_peer_t **slot = table_slot(tcp, desc->endpoint, desc->generation);
        peer = *slot;
        if (peer == NULL || peer->state != FERRY_TCP_PEER_CONNECTING)
            break;
        pthread_cond_wait(&tcp->settled, &tcp->lock); /* then look again */
    }
    if (peer != NULL) {
        *table_slot(tcp, desc->endpoint, desc->generation) = peer->next;
        peer->state = FERRY_TCP_PEER_GONE;
    }
    pthread_mutex_unlock(&tcp->lock);
    if (peer != NULL) {
        ferry_debug("tcp: forgetting %s (generation %016llx)", peer->endpoint,
                    (unsigned long long)peer->generation);
        peer_stop(peer); /* drops the table's reference */
    }
}

void ferry_tcp_peers_destroy(ferry_tcp_t *tcp)
{
    ferry_tcp_peer_t *all = NULL;
    pthread_mutex_lock(&tcp->lock);
    tcp->stopped = 1;
    for (size_t b = 0; b < FERRY_TCP_PEER_BUCKETS; b++) {
        while (tcp->buckets[b] != NULL) {
            ferry_tcp_peer_t *peer = tcp->buckets[b];
            if (peer->state == FERRY_TCP_PEER_CONNECTING) {
                /* a submit still connecting would be the engine's bug; wait it out */
                pthread_cond_wait(&tcp->settled, &tcp->lock);
                continue;
            }
            tcp->buckets[b] = peer->next;
            peer->state = FERRY_TCP_PEER_GONE;
            peer->next = all;
            all = peer;
        }
    }
    pthread_mutex_unlock(&tcp->lock);
    while (all != NULL) {
        ferry_tcp_peer_t *next = all->next;
        peer_stop(all);
        all = next;
    }
    /* Peers that failed left the table with their connections closing. */
    pthread_mutex_lock(&tcp->lock);
    while (tcp->conns_open > 0 && ferry_tcp_worker_self() == NULL)
        pthread_cond_wait(&tcp->settled, &tcp->lock);
    pthread_mutex_unlock(&tcp->lock);
}
