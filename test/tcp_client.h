/* A raw client of the tcp transport's wire format (src/transport/tcp/tcp.h),
 * for tests that play a hostile or half-finished initiator. */
#ifndef FERRY_TEST_TCP_CLIENT_H
#define FERRY_TEST_TCP_CLIENT_H

#include <stddef.h>
#include <stdint.h>

/* A blocking socket connected to "a.b.c.d:port", receives time out after
 * 5 s; source: a local IPv4 address to connect from (NULL: the kernel's
 * choice). */
int tcp_client_connect_from(const char *source, const char *hostport);
int tcp_client_connect(const char *hostport);
/* 0 when all len bytes arrived, -1 otherwise. */
int tcp_client_recv(int fd, void *buf, size_t len);
/* Send a HELLO for that generation; the status in the target's answer, or
 * -1000 when none came. */
int tcp_client_hello(int fd, uint64_t generation);
/* Send one REQUEST header (a WRITE's payload is the caller's to send). */
void tcp_client_request(int fd, int op, uint64_t id, uint64_t addr, uint64_t length);
/* The status of the RESPONSE to id, or -1000 when none came. */
int tcp_client_response(int fd, uint64_t id);
/* Whether the target closed (or reset) the connection: a read sees its
 * end.  A read that timed out is a target still waiting for more, not a
 * close. */
int tcp_client_closed(int fd);
/* The same without waiting. */
int tcp_client_closed_already(int fd);
/* The tcp endpoint and generation in a descriptor's JSON (from
 * ferry_segment_describe). */
void tcp_client_target_of(const char *json, char *endpoint, size_t size, uint64_t *generation_p);

#endif
