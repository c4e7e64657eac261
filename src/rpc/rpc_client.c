/*
 * RPC client: one connection per call.  Calls are rare (descriptor fetch,
 * notify, probe), so a fresh connection costs little and leaves no state to
 * go stale when a peer restarts.
 *
 * A connection the server closes before a byte of the reply is sent again
 * once, on a new connection: the server closes a connection it has not read
 * a request from (evicted as idle when its caps are reached, rpc_server.c),
 * and a request it did read is answered before it closes, so the request
 * was not served and sending it again does not serve it twice.
 */
#include "rpc.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Receive exactly len bytes before deadline_ms (0: no deadline).  Unlike a
 * socket timeout, which restarts with every byte, this bounds the whole step,
 * so a peer trickling a byte at a time cannot stretch the call.  *got_p (if
 * not NULL): the bytes that did arrive. */
static ferry_status_t recv_by(int fd, void *buf, size_t len, uint64_t deadline_ms, size_t *got_p)
{
    uint8_t *at = buf;
    if (got_p != NULL)
        *got_p = 0;
    while (len > 0) {
        int wait_ms = -1;
        if (deadline_ms != 0) {
            uint64_t now = ferry_time_ms();
            if (now >= deadline_ms)
                return FERRY_ERR_TIMEOUT;
            wait_ms = (int)FERRY_MIN(deadline_ms - now, (uint64_t)INT_MAX);
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int rc = poll(&pfd, 1, wait_ms);
        if (rc < 0 && errno != EINTR)
            return FERRY_ERR_IO;
        if (rc <= 0)
            continue;
        ssize_t got = recv(fd, at, len, MSG_DONTWAIT);
        if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (got <= 0)
            return FERRY_ERR_PEER_FAILED;
        at += got;
        len -= (size_t)got;
        if (got_p != NULL)
            *got_p += (size_t)got;
    }
    return FERRY_OK;
}

static uint64_t deadline_after(unsigned timeout_ms)
{
    return timeout_ms ? ferry_time_ms() + timeout_ms : 0;
}

/* Only the matching reply or an error reply answers a request; anything else
 * would be read as the wrong message by a caller that cannot see the type. */
static int reply_type_ok(int request_type, int reply_type)
{
    if (reply_type == FERRY_RPC_ERROR_REPLY)
        return 1;
    switch (request_type) {
    case FERRY_RPC_FETCH:
    case FERRY_RPC_NOTIFY:
    case FERRY_RPC_PROBE:
    case FERRY_RPC_INVALIDATE:
        return reply_type == request_type + 1;
    default:
        return 1;
    }
}

/* One connection, one request, one reply header and payload.  *unanswered_p:
 * the server closed before the first byte of a reply. */
static ferry_status_t call_once(const char *endpoint, int type, const void *payload,
                                size_t length, unsigned timeout_ms, size_t limit,
                                ferry_rpc_header_t *header_p, uint8_t **reply_p,
                                int *unanswered_p)
{
    int fd;
    uint8_t *reply = NULL;
    *unanswered_p = 0;
    ferry_status_t status = ferry_net_connect(endpoint, timeout_ms, &fd);
    if (status != FERRY_OK)
        return status;
    ferry_net_set_timeout(fd, timeout_ms);

    ferry_rpc_header_t header = {.magic = FERRY_RPC_MAGIC, .version = FERRY_RPC_VERSION,
                                 .type = (uint8_t)type, .length = (uint32_t)length};
    uint8_t header_bytes[FERRY_RPC_HEADER_SIZE];
    ferry_rpc_header_pack(&header, header_bytes);
    struct iovec iov[2] = {{header_bytes, sizeof(header_bytes)}, {(void *)payload, length}};
    status = ferry_net_sendv_all(fd, iov, length ? 2 : 1);
    if (status != FERRY_OK) {
        ferry_debug("RPC to %s: send: %s", endpoint, ferry_status_string(status));
        *unanswered_p = status == FERRY_ERR_PEER_FAILED;
        goto err_close;
    }

    size_t got;
    status = recv_by(fd, header_bytes, sizeof(header_bytes), deadline_after(timeout_ms), &got);
    if (status != FERRY_OK) {
        ferry_debug("RPC to %s: reply header: %s", endpoint, ferry_status_string(status));
        *unanswered_p = status == FERRY_ERR_PEER_FAILED && got == 0;
        goto err_close;
    }
    status = ferry_rpc_header_unpack(header_bytes, limit, &header);
    if (status != FERRY_OK || !reply_type_ok(type, header.type) ||
        (header.type == FERRY_RPC_ERROR_REPLY && header.status >= 0)) {
        ferry_warn("RPC to %s: bad reply header (magic 0x%08x version %u type %u length %u "
                   "status %d)", endpoint, header.magic, header.version, header.type,
                   header.length, (int)header.status);
        status = FERRY_ERR_PROTOCOL;
        goto err_close;
    }

    /* One byte more, zeroed, so a text reply is also a C string. */
    reply = malloc((size_t)header.length + 1);
    if (reply == NULL) {
        status = FERRY_ERR_NO_MEMORY;
        goto err_close;
    }
    status = recv_by(fd, reply, header.length, deadline_after(timeout_ms), NULL);
    if (status != FERRY_OK) {
        ferry_debug("RPC to %s: reply payload: %s", endpoint, ferry_status_string(status));
        goto err_free_reply;
    }
    reply[header.length] = '\0';
    close(fd);
    *header_p = header;
    *reply_p = reply;
    return FERRY_OK;

err_free_reply:
    free(reply);
err_close:
    close(fd);
    return status;
}

ferry_status_t ferry_rpc_call(const char *endpoint, int type, const void *payload,
                              size_t length, unsigned timeout_ms, size_t max_frame,
                              void **reply_p, size_t *reply_length_p)
{
    if (reply_p != NULL)
        *reply_p = NULL;
    if (reply_length_p != NULL)
        *reply_length_p = 0;
    if (endpoint == NULL || type < FERRY_RPC_FETCH || type > FERRY_RPC_ERROR_REPLY ||
        (payload == NULL && length > 0))
        return FERRY_ERR_INVALID_PARAM;
    ferry_rpc_counter_add(FERRY_RPC_COUNT_CALLS, 1);
    size_t limit = FERRY_MIN(max_frame, (size_t)UINT32_MAX);
    if (length > limit) {
        ferry_error("RPC request of %zu bytes to %s exceeds the %zu-byte frame limit", length,
                    endpoint, limit);
        return FERRY_ERR_INVALID_PARAM;
    }

    ferry_rpc_header_t header;
    uint8_t *reply = NULL;
    int unanswered;
    ferry_status_t status = call_once(endpoint, type, payload, length, timeout_ms, limit,
                                      &header, &reply, &unanswered);
    if (status != FERRY_OK && unanswered) {
        ferry_debug("RPC to %s: closed before a reply; sending again", endpoint);
        status = call_once(endpoint, type, payload, length, timeout_ms, limit, &header, &reply,
                           &unanswered);
    }
    if (status != FERRY_OK)
        return status;
    if (header.status < 0) {
        free(reply);
        return (ferry_status_t)header.status;
    }
    if (reply_p != NULL)
        *reply_p = reply;
    else
        free(reply);
    if (reply_length_p != NULL)
        *reply_length_p = header.length;
    return FERRY_OK;
}
