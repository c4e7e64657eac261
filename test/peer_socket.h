/* What the kernel holds for a test peer: the bytes that reached its TCP
 * sockets and that it has not read.  A frozen peer's count grows only when
 * an initiator has put a request's bytes on the wire, which is what a test
 * of "partly on the wire" must see before it goes on. */
#ifndef FERRY_TEST_PEER_SOCKET_H
#define FERRY_TEST_PEER_SOCKET_H

#include <stddef.h>
#include <sys/types.h>

/* Bytes waiting in the receive queues of pid's TCP sockets (IPv4 and IPv6,
 * this network namespace), from /proc/net/tcp{,6}; 0 when there are none
 * or /proc cannot be read. */
size_t peer_socket_unread(pid_t pid);
/* Wait (polling, at most timeout_s) until peer_socket_unread(pid) reaches
 * at_least; returns that count, 0 when the time ran out. */
size_t peer_socket_wait_unread(pid_t pid, size_t at_least, double timeout_s);

#endif
