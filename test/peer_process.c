#include "peer_process.h"

#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define REPLY_TIMEOUT_MS 30000

static int read_line(peer_process_t *peer, char *out, size_t len)
{
    size_t n = 0;
    while (n + 1 < len) {
        struct pollfd pfd = {.fd = peer->from_peer, .events = POLLIN};
        if (poll(&pfd, 1, REPLY_TIMEOUT_MS) <= 0)
            break;
        char c;
        if (read(peer->from_peer, &c, 1) != 1)
            break;
        if (c == '\n') {
            out[n] = '\0';
            return 0;
        }
        out[n++] = c;
    }
    out[n] = '\0';
    return -1;
}

int peer_start(peer_process_t *peer, const char *const *env)
{
    int to_child[2], from_child[2];
    const char *program = getenv("FERRY_TEST_PEER");
    memset(peer, 0, sizeof(*peer));
    if (program == NULL || pipe(to_child) || pipe(from_child))
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        close(to_child[1]);
        close(from_child[0]);
        for (size_t i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        execl(program, program, (char *)NULL);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    peer->pid = pid;
    peer->to_peer = to_child[1];
    peer->from_peer = from_child[0];
    char line[512];
    if (read_line(peer, line, sizeof(line)) != 0 ||
        sscanf(line, "READY %255s %lx %zu", peer->name, &peer->arena, &peer->arena_size) != 3) {
        peer_kill(peer, SIGKILL);
        return -1;
    }
    return 0;
}

const char *peer_cmd(peer_process_t *peer, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    line[n++] = '\n';
    if (write(peer->to_peer, line, (size_t)n) != n || read_line(peer, peer->reply,
                                                                sizeof(peer->reply)) != 0)
        snprintf(peer->reply, sizeof(peer->reply), "NO REPLY");
    return peer->reply;
}

const char *peer_reply(peer_process_t *peer)
{
    if (read_line(peer, peer->reply, sizeof(peer->reply)) != 0)
        snprintf(peer->reply, sizeof(peer->reply), "NO REPLY");
    return peer->reply;
}

void peer_kill(peer_process_t *peer, int sig)
{
    if (peer->pid <= 0)
        return;
    kill(peer->pid, sig);
    if (sig == SIGKILL || sig == SIGTERM) {
        waitpid(peer->pid, NULL, 0);
        peer->pid = 0;
        close(peer->to_peer);
        close(peer->from_peer);
    }
}

int peer_kill_unreaped(peer_process_t *peer)
{
    if (peer->pid <= 0)
        return -1;
    kill(peer->pid, SIGKILL);
    siginfo_t info;
    return waitid(P_PID, (id_t)peer->pid, &info, WEXITED | WNOWAIT);
}

void peer_stop(peer_process_t *peer)
{
    if (peer->pid <= 0)
        return;
    peer_cmd(peer, "quit");
    close(peer->to_peer);
    close(peer->from_peer);
    int status;
    for (int i = 0; i < 500; i++) {
        if (waitpid(peer->pid, &status, WNOHANG) == peer->pid) {
            peer->pid = 0;
            return;
        }
        usleep(10000);
    }
    kill(peer->pid, SIGKILL);
    waitpid(peer->pid, &status, 0);
    peer->pid = 0;
}

int peer_port(const peer_process_t *peer)
{
    const char *colon = strrchr(peer->name, ':');
    return colon ? atoi(colon + 1) : -1;
}
