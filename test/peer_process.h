/* Drive a ferry_test_peer process from a test. */
#ifndef FERRY_TEST_PEER_PROCESS_H
#define FERRY_TEST_PEER_PROCESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct peer_process {
    pid_t pid;
    int to_peer;
    int from_peer;
    char name[256];     /* its segment name */
    uintptr_t arena;    /* its arena address (in its address space) */
    size_t arena_size;
    char reply[512];
} peer_process_t;

/* env: NULL-terminated "NAME=value" strings added to the peer's environment. */
int peer_start(peer_process_t *peer, const char *const *env);
/* Send one command line, wait (bounded) for one reply line; returns reply. */
const char *peer_cmd(peer_process_t *peer, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The next reply line of a command that answers more than one (bounded). */
const char *peer_reply(peer_process_t *peer);
void peer_kill(peer_process_t *peer, int sig);
/* SIGKILL, then wait until the peer has exited, leaving it unreaped (a
 * zombie: its pid names it still, its memory is gone, its pidfd reads
 * ready); peer_kill reaps it.  A sleep after kill was not enough: a
 * sanitizer's process took longer than 50 ms to exit on a loaded host, and
 * a read posted meanwhile copied from its memory.  0, or -1 (errno). */
int peer_kill_unreaped(peer_process_t *peer);
void peer_stop(peer_process_t *peer);
/* The RPC port inside a p2p name "host:port". */
int peer_port(const peer_process_t *peer);

#endif
