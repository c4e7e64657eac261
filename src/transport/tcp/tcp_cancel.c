/*
 * ferry_batch_cancel's part in tcp: a slice still in a connection's queue
 * has not been written to the socket (batch_start_locked moves slices from
 * the queue to the in-flight FIFO under peer->lock before it writes a
 * byte), so taking it out of the queue under that lock keeps every one of
 * its bytes off the wire.  Slices in flight are left alone: a WRITE's bytes
 * may be in the peer's socket already, and a READ's answer is read straight
 * into its buffer; they end with their response or the connection's
 * failure.
 */
#include "tcp.h"

#include <stdlib.h>

/* The peers of the table, each with a reference; *count_p of them. */
static ferry_tcp_peer_t **peers_held(ferry_tcp_t *tcp, size_t *count_p)
{
    size_t count = 0, capacity = 16;
    ferry_tcp_peer_t **held = malloc(capacity * sizeof(*held));
    pthread_mutex_lock(&tcp->lock);
    for (size_t b = 0; held != NULL && b < FERRY_TCP_PEER_BUCKETS; b++) {
        for (ferry_tcp_peer_t *peer = tcp->buckets[b]; peer != NULL; peer = peer->next) {
            if (count == capacity) {
                ferry_tcp_peer_t **grown = realloc(held, 2 * capacity * sizeof(*held));
                if (grown == NULL)
                    break; /* those held so far are cancelled; the rest finish */
                held = grown;
                capacity *= 2;
            }
            ferry_tcp_peer_ref(peer);
            held[count++] = peer;
        }
    }
    pthread_mutex_unlock(&tcp->lock);
    *count_p = count;
    return held;
}

/* Unlink the conn's queued slices owned in [lo, hi) onto *out; peer->lock
 * held.  The queue keeps its order. */
static void conn_take_queued(ferry_tcp_peer_t *peer, ferry_tcp_conn_t *conn, const void *lo,
                             const void *hi, ferry_slice_t ***out)
{
    ferry_slice_t **link = &conn->queue_head, *last = NULL;
    while (*link != NULL) {
        ferry_slice_t *slice = *link;
        const char *owner = slice->owner;
        if (owner < (const char *)lo || owner >= (const char *)hi) {
            last = slice;
            link = &slice->next;
            continue;
        }
        *link = slice->next;
        conn->outstanding -= slice->length;
        peer->outstanding -= slice->length;
        slice->next = NULL;
        **out = slice;
        *out = &slice->next;
    }
    conn->queue_tail = last;
}

void ferry_tcp_cancel(void *ctx, const void *owner_lo, const void *owner_hi)
{
    ferry_tcp_t *tcp = ctx;
    size_t count;
    ferry_tcp_peer_t **held = peers_held(tcp, &count);
    ferry_slice_t *cancelled = NULL, **tail = &cancelled;
    for (size_t i = 0; i < count; i++) {
        ferry_tcp_peer_t *peer = held[i];
        pthread_mutex_lock(&peer->lock);
        for (unsigned c = 0; c < FERRY_TCP_MAX_PEER_CONNS; c++) {
            ferry_tcp_conn_t *conn = peer->conns[c];
            if (conn != NULL && !conn->closed)
                conn_take_queued(peer, conn, owner_lo, owner_hi, &tail);
        }
        pthread_mutex_unlock(&peer->lock);
        ferry_tcp_peer_unref(peer);
    }
    free(held);
    if (cancelled != NULL)
        ferry_transport_slices_done(&tcp->svc, cancelled, FERRY_ERR_CANCELED);
}
