/*
 * One request to many engines at once (an owner's invalidation to all its
 * subscribers).  Each call is a small state machine over one non-blocking
 * socket, all driven by one poll loop under one deadline, so that the time
 * the whole fan-out takes is bounded by the slowest answer or the timeout,
 * never by the number of peers that do not answer.
 *
 * At most FANOUT_WINDOW calls are open at once; the next starts as one
 * ends.  Thousands of subscribers would otherwise cost as many descriptors
 * at once (past a 1,024 or 4,096 RLIMIT_NOFILE) and a poll() over all of
 * them per wake-up.  Peers that refuse or answer free their slot at once;
 * only a window full of peers that accept and never answer (frozen) holds
 * the rest back, and then until the one deadline: those not started by
 * then say TIMEOUT, as unanswered ones do.
 */
#include "rpc.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef enum call_phase {
    CALL_CONNECTING,
    CALL_READING, /* the request went out whole (it fits a socket buffer) */
    CALL_DONE,
} call_phase_t;

typedef struct call {
    int fd;
    call_phase_t phase;
    uint8_t header[FERRY_RPC_HEADER_SIZE];
    size_t header_got;
    ferry_rpc_header_t reply;
    size_t payload_left; /* of the reply, read and dropped */
} call_t;

#define FANOUT_WINDOW 256

static void call_end(call_t *call, ferry_status_t *status_p, ferry_status_t status)
{
    if (call->fd >= 0)
        close(call->fd);
    call->fd = -1;
    call->phase = CALL_DONE;
    *status_p = status;
}

/* The socket became writable: connected (or failed); send the request. */
static void call_send(call_t *call, const uint8_t *frame, size_t frame_length,
                      ferry_status_t *status_p)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(call->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        call_end(call, status_p, FERRY_ERR_CONNECT);
        return;
    }
    ssize_t sent = send(call->fd, frame, frame_length, MSG_NOSIGNAL);
    if (sent != (ssize_t)frame_length) { /* a fresh socket takes a small frame whole */
        call_end(call, status_p, FERRY_ERR_PEER_FAILED);
        return;
    }
    call->phase = CALL_READING;
}

static void call_read(call_t *call, int type, size_t max_frame, ferry_status_t *status_p)
{
    for (;;) {
        uint8_t sink[4096];
        uint8_t *to = call->header_got < FERRY_RPC_HEADER_SIZE ? call->header + call->header_got
                                                                : sink;
        size_t want = call->header_got < FERRY_RPC_HEADER_SIZE
                          ? FERRY_RPC_HEADER_SIZE - call->header_got
                          : FERRY_MIN(call->payload_left, sizeof(sink));
        if (want == 0)
            break;
        ssize_t got = recv(call->fd, to, want, MSG_DONTWAIT);
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (got <= 0) {
            call_end(call, status_p, FERRY_ERR_PEER_FAILED);
            return;
        }
        if (call->header_got < FERRY_RPC_HEADER_SIZE) {
            call->header_got += (size_t)got;
            if (call->header_got < FERRY_RPC_HEADER_SIZE)
                continue;
            if (ferry_rpc_header_unpack(call->header, max_frame, &call->reply) != FERRY_OK ||
                (call->reply.type != type + 1 && call->reply.type != FERRY_RPC_ERROR_REPLY)) {
                call_end(call, status_p, FERRY_ERR_PROTOCOL);
                return;
            }
            call->payload_left = call->reply.length;
        } else {
            call->payload_left -= (size_t)got;
        }
    }
    call_end(call, status_p,
             call->reply.status < 0 ? (ferry_status_t)call->reply.status : FERRY_OK);
}

void ferry_rpc_call_all(const char *const *endpoints, size_t n, int type, const void *payload,
                        size_t length, unsigned timeout_ms, size_t max_frame,
                        ferry_status_t *statuses)
{
    ferry_rpc_counter_add(FERRY_RPC_COUNT_CALLS_FANNED_OUT, n);
    call_t *calls = calloc(n ? n : 1, sizeof(*calls));
    struct pollfd *fds = calloc(FERRY_MIN(n, (size_t)FANOUT_WINDOW) + 1, sizeof(*fds));
    uint8_t *frame = malloc(FERRY_RPC_HEADER_SIZE + length);
    if (calls == NULL || fds == NULL || frame == NULL || length > UINT32_MAX) {
        for (size_t i = 0; i < n; i++)
            statuses[i] = FERRY_ERR_NO_MEMORY;
        goto out;
    }
    ferry_rpc_header_t header = {.magic = FERRY_RPC_MAGIC, .version = FERRY_RPC_VERSION,
                                 .type = (uint8_t)type, .length = (uint32_t)length};
    ferry_rpc_header_pack(&header, frame);
    if (length)
        memcpy(frame + FERRY_RPC_HEADER_SIZE, payload, length);
    for (size_t i = 0; i < n; i++) {
        statuses[i] = FERRY_ERR_TIMEOUT;
        calls[i].fd = -1;
        calls[i].phase = CALL_DONE;
    }
    /* calls [done_below, started) may be open; every one below done_below has ended */
    size_t started = 0, done_below = 0, open = 0;
    uint64_t deadline = ferry_time_ms() + timeout_ms;
    for (;;) {
        for (; started < n && open < FANOUT_WINDOW; started++) {
            ferry_status_t status =
                ferry_net_connect_begin(endpoints[started], &calls[started].fd);
            if (status != FERRY_OK) {
                statuses[started] = status;
                continue;
            }
            calls[started].phase = CALL_CONNECTING;
            open++;
        }
        while (done_below < started && calls[done_below].phase == CALL_DONE)
            done_below++;
        uint64_t now = ferry_time_ms();
        if (open == 0 || now >= deadline)
            break;
        size_t k = 0;
        for (size_t i = done_below; i < started; i++)
            if (calls[i].phase != CALL_DONE)
                fds[k++] = (struct pollfd){
                    .fd = calls[i].fd,
                    .events = calls[i].phase == CALL_CONNECTING ? POLLOUT : POLLIN};
        int rc = poll(fds, k, (int)FERRY_MIN(deadline - now, (uint64_t)INT_MAX));
        if (rc < 0 && errno != EINTR)
            break;
        k = 0;
        for (size_t i = done_below; rc > 0 && i < started; i++) {
            if (calls[i].phase == CALL_DONE)
                continue;
            short events = fds[k++].revents;
            if (events == 0)
                continue;
            if (calls[i].phase == CALL_CONNECTING)
                call_send(&calls[i], frame, FERRY_RPC_HEADER_SIZE + length, &statuses[i]);
            else
                call_read(&calls[i], type, max_frame, &statuses[i]);
            open -= calls[i].phase == CALL_DONE;
        }
    }
    for (size_t i = done_below; i < started; i++)
        if (calls[i].fd >= 0)
            close(calls[i].fd); /* still unanswered: statuses[i] says TIMEOUT */
out:
    free(calls);
    free(fds);
    free(frame);
}
