/* Blocking TCP helpers with bounded waits, used by RPC and the tcp transport. */
#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

ferry_status_t ferry_net_split(const char *hostport, char *host, size_t hostlen, int *port_p,
                               int port_required)
{
    const char *colon;
    const char *host_begin = hostport;
    size_t host_len;
    if (hostport == NULL || *hostport == '\0')
        return FERRY_ERR_INVALID_PARAM;
    if (*hostport == '[') {
        const char *close = strchr(hostport, ']');
        if (close == NULL)
            return FERRY_ERR_INVALID_PARAM;
        host_begin = hostport + 1;
        host_len = (size_t)(close - host_begin);
        colon = close[1] == ':' ? close + 1 : NULL;
        if (close[1] != '\0' && colon == NULL)
            return FERRY_ERR_INVALID_PARAM;
    } else {
        colon = strrchr(hostport, ':');
        host_len = colon ? (size_t)(colon - hostport) : strlen(hostport);
    }
    if (host_len == 0 || host_len >= hostlen)
        return FERRY_ERR_INVALID_PARAM;
    memcpy(host, host_begin, host_len);
    host[host_len] = '\0';
    if (colon == NULL) {
        if (port_required)
            return FERRY_ERR_INVALID_PARAM;
        *port_p = 0;
        return FERRY_OK;
    }
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end != '\0' || port < 0 || port > 65535)
        return FERRY_ERR_INVALID_PARAM;
    *port_p = (int)port;
    return FERRY_OK;
}

static ferry_status_t resolve(const char *host, int port, int passive, struct addrinfo **res_p)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    if (passive)
        hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(host, service, &hints, res_p);
    if (rc != 0) {
        ferry_error("cannot resolve %s: %s", host, gai_strerror(rc));
        return FERRY_ERR_CONNECT;
    }
    return FERRY_OK;
}

ferry_status_t ferry_net_listen(const char *host, int port, int backlog, int *fd_p, int *port_p)
{
    struct addrinfo *res;
    ferry_status_t status = resolve(host, port, 1, &res);
    if (status != FERRY_OK)
        return status;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        ferry_error("socket: %s", strerror(errno));
        freeaddrinfo(res);
        return FERRY_ERR_IO;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, backlog) != 0) {
        ferry_error("cannot listen on %s:%d: %s", host, port, strerror(errno));
        freeaddrinfo(res);
        close(fd);
        return FERRY_ERR_IO;
    }
    freeaddrinfo(res);
    struct sockaddr_storage addr;
    socklen_t addrlen = sizeof(addr);
    getsockname(fd, (struct sockaddr *)&addr, &addrlen);
    *port_p = ntohs(addr.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&addr)->sin6_port
                                               : ((struct sockaddr_in *)&addr)->sin_port);
    *fd_p = fd;
    return FERRY_OK;
}

static ferry_status_t connect_one(const struct addrinfo *ai, unsigned timeout_ms, int *fd_p)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return FERRY_ERR_IO;
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
        /* An interrupted poll must neither pass for a connection (SO_ERROR is
         * still 0 then) nor restart the full timeout. */
        uint64_t deadline = ferry_time_ms() + timeout_ms;
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        do {
            int wait_ms = -1;
            if (timeout_ms) {
                uint64_t now = ferry_time_ms();
                wait_ms = now < deadline ? (int)(deadline - now) : 0;
            }
            rc = poll(&pfd, 1, wait_ms);
        } while (rc < 0 && errno == EINTR);
        if (rc <= 0) {
            close(fd);
            return rc == 0 ? FERRY_ERR_TIMEOUT : FERRY_ERR_IO;
        }
        int err = 0;
        socklen_t errlen = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &errlen);
        rc = err ? -1 : 0;
        errno = err;
    }
    if (rc != 0) {
        int saved = errno; /* ferry_net_connect reports why */
        close(fd);
        errno = saved;
        return FERRY_ERR_CONNECT;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *fd_p = fd;
    return FERRY_OK;
}

ferry_status_t ferry_net_connect(const char *hostport, unsigned timeout_ms, int *fd_p)
{
    char host[256];
    int port;
    if (ferry_net_split(hostport, host, sizeof(host), &port, 1) != FERRY_OK) {
        ferry_error("\"%s\" is not host:port", hostport);
        return FERRY_ERR_INVALID_PARAM;
    }
    struct addrinfo *res;
    ferry_status_t status = resolve(host, port, 0, &res);
    if (status != FERRY_OK)
        return status;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        status = connect_one(ai, timeout_ms, fd_p);
        if (status == FERRY_OK)
            break;
    }
    int saved = errno;
    freeaddrinfo(res);
    errno = saved;
    if (status != FERRY_OK)
        ferry_debug("connect to %s: %s (%s)", hostport, ferry_status_string(status),
                    strerror(errno));
    return status;
}

ferry_status_t ferry_net_connect_begin(const char *hostport, int *fd_p)
{
    char host[256];
    int port;
    if (ferry_net_split(hostport, host, sizeof(host), &port, 1) != FERRY_OK)
        return FERRY_ERR_INVALID_PARAM;
    struct addrinfo *res;
    ferry_status_t status = resolve(host, port, 0, &res);
    if (status != FERRY_OK)
        return status;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    status = fd < 0 ? FERRY_ERR_IO : FERRY_OK;
    if (status == FERRY_OK && connect(fd, res->ai_addr, res->ai_addrlen) != 0 &&
        errno != EINPROGRESS) {
        close(fd);
        status = FERRY_ERR_CONNECT;
    }
    freeaddrinfo(res);
    if (status == FERRY_OK) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        *fd_p = fd;
    }
    return status;
}

void ferry_net_set_timeout(int fd, unsigned timeout_ms)
{
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

static ferry_status_t io_error(ssize_t rc)
{
    if (rc == 0)
        return FERRY_ERR_PEER_FAILED;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        return FERRY_ERR_TIMEOUT;
    return FERRY_ERR_PEER_FAILED;
}

void ferry_net_iov_advance(struct msghdr *msg, size_t sent)
{
    while (msg->msg_iovlen > 0 && sent >= msg->msg_iov->iov_len) {
        sent -= msg->msg_iov->iov_len;
        msg->msg_iov++;
        msg->msg_iovlen--;
    }
    if (msg->msg_iovlen > 0) {
        msg->msg_iov->iov_base = (char *)msg->msg_iov->iov_base + sent;
        msg->msg_iov->iov_len -= sent;
    }
}

ferry_status_t ferry_net_sendv_all(int fd, struct iovec *iov, int iovcnt)
{
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
    while (msg.msg_iovlen > 0) {
        ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent <= 0)
            return io_error(sent < 0 ? -1 : 0);
        ferry_net_iov_advance(&msg, (size_t)sent);
    }
    return FERRY_OK;
}

ferry_status_t ferry_net_send_all(int fd, const void *buf, size_t len)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return ferry_net_sendv_all(fd, &iov, 1);
}

ferry_status_t ferry_net_recv_all(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len > 0) {
        ssize_t got = recv(fd, p, len, MSG_WAITALL);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return io_error(got);
        p += got;
        len -= (size_t)got;
    }
    return FERRY_OK;
}

void ferry_net_default_host(char *host, size_t len)
{
    char name[256];
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    snprintf(host, len, "127.0.0.1");
    if (gethostname(name, sizeof(name)) != 0 || getaddrinfo(name, NULL, &hints, &res) != 0)
        return;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        char text[INET_ADDRSTRLEN];
        struct sockaddr_in *sin = (struct sockaddr_in *)ai->ai_addr;
        if (inet_ntop(AF_INET, &sin->sin_addr, text, sizeof(text)) != NULL) {
            snprintf(host, len, "%s", text);
            break;
        }
    }
    freeaddrinfo(res);
}

void ferry_net_source_of(const struct sockaddr *addr, ferry_net_source_t *source_p)
{
    /* IPv4 as its IPv4-mapped IPv6 form (::ffff:a.b.c.d); other families as
     * all zeros, one source (a listener here only accepts IPv4 and IPv6). */
    memset(source_p, 0, sizeof(*source_p));
    if (addr->sa_family == AF_INET6) {
        memcpy(source_p->bytes, &((const struct sockaddr_in6 *)addr)->sin6_addr, 16);
    } else if (addr->sa_family == AF_INET) {
        source_p->bytes[10] = source_p->bytes[11] = 0xff;
        memcpy(source_p->bytes + 12, &((const struct sockaddr_in *)addr)->sin_addr, 4);
    }
}

ferry_net_admit_t ferry_net_admit(size_t open, size_t open_from_source, size_t max,
                                  size_t max_per_source)
{
    if (open_from_source >= max_per_source)
        return FERRY_NET_EVICT_SAME_SOURCE;
    return open >= max ? FERRY_NET_EVICT_ANY : FERRY_NET_ADMIT;
}

int ferry_net_has_input(int fd)
{
    char byte;
    ssize_t got;
    do {
        got = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    } while (got < 0 && errno == EINTR);
    return got > 0;
}
