/* A raw client of the tcp transport's wire format, for tests. */
#include "tcp_client.h"

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "../src/transport/tcp/tcp.h"

int tcp_client_connect_from(const char *source, const char *hostport)
{
    char host[64];
    const char *colon = strrchr(hostport, ':');
    cr_assert_not_null(colon, "no port in %s", hostport);
    snprintf(host, sizeof(host), "%.*s", (int)(colon - hostport), hostport);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(atoi(colon + 1))};
    inet_pton(AF_INET, host, &sin.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    if (source != NULL) {
        struct sockaddr_in from = {.sin_family = AF_INET};
        inet_pton(AF_INET, source, &from.sin_addr);
        cr_assert_eq(bind(fd, (struct sockaddr *)&from, sizeof(from)), 0, "bind %s", source);
    }
    cr_assert_eq(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0, "connect to %s",
                 hostport);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

int tcp_client_connect(const char *hostport)
{
    return tcp_client_connect_from(NULL, hostport);
}

int tcp_client_recv(int fd, void *buf, size_t len)
{
    return recv(fd, buf, len, MSG_WAITALL) == (ssize_t)len ? 0 : -1;
}

int tcp_client_hello(int fd, uint64_t generation)
{
    unsigned char msg[FERRY_TCP_HELLO_SIZE] = {0}, ack[FERRY_TCP_ACK_SIZE];
    ferry_tcp_put32(msg, FERRY_TCP_MAGIC);
    ferry_tcp_put16(msg + 4, FERRY_TCP_VERSION);
    ferry_tcp_put64(msg + 8, generation);
    ferry_tcp_put16(msg + 16, 0);
    cr_assert_eq(send(fd, msg, sizeof(msg), MSG_NOSIGNAL), (ssize_t)sizeof(msg));
    if (tcp_client_recv(fd, ack, sizeof(ack)) != 0)
        return -1000;
    return (int32_t)ferry_tcp_get32(ack + 8);
}

void tcp_client_request(int fd, int op, uint64_t id, uint64_t addr, uint64_t length)
{
    unsigned char msg[FERRY_TCP_REQUEST_SIZE] = {0};
    msg[0] = (unsigned char)op;
    ferry_tcp_put64(msg + 8, id);
    ferry_tcp_put64(msg + 16, addr);
    ferry_tcp_put64(msg + 24, length);
    cr_assert_eq(send(fd, msg, sizeof(msg), MSG_NOSIGNAL), (ssize_t)sizeof(msg));
}

int tcp_client_response(int fd, uint64_t id)
{
    unsigned char msg[FERRY_TCP_RESPONSE_SIZE];
    if (tcp_client_recv(fd, msg, sizeof(msg)) != 0)
        return -1000;
    cr_assert_eq(ferry_tcp_get64(msg), id);
    return (int32_t)ferry_tcp_get32(msg + 8);
}

int tcp_client_closed(int fd)
{
    char c;
    ssize_t n = recv(fd, &c, 1, 0);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

int tcp_client_closed_already(int fd)
{
    char c;
    ssize_t got = recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
    return got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

void tcp_client_target_of(const char *json, char *endpoint, size_t size, uint64_t *generation_p)
{
    const char *tcp = strstr(json, "\"tcp\":\"");
    const char *generation = strstr(json, "\"generation\":\"");
    cr_assert(tcp != NULL && generation != NULL, "no tcp endpoint or generation in %s", json);
    snprintf(endpoint, size, "%.*s", (int)strcspn(tcp + 7, "\""), tcp + 7);
    *generation_p = strtoull(generation + 14, NULL, 16);
}
