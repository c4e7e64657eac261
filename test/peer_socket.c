/* peer_socket.h: a process's sockets are the "socket:[inode]" links in
 * /proc/PID/fd; /proc/net/tcp lists every TCP socket of the namespace with
 * its inode and "tx_queue:rx_queue" in hex. */
#include "peer_socket.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "test_clock.h"

enum { MAX_SOCKETS = 256 };

/* The inodes of pid's sockets; their count. */
static size_t socket_inodes(pid_t pid, unsigned long *inodes, size_t max)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    if (dir == NULL)
        return 0;
    size_t count = 0;
    struct dirent *entry;
    while (count < max && (entry = readdir(dir)) != NULL) {
        char target[64];
        ssize_t n = readlinkat(dirfd(dir), entry->d_name, target, sizeof(target) - 1);
        if (n <= 0)
            continue;
        target[n] = '\0';
        unsigned long inode;
        if (sscanf(target, "socket:[%lu]", &inode) == 1)
            inodes[count++] = inode;
    }
    closedir(dir);
    return count;
}

/* The receive-queue bytes of the sockets in table whose inode is listed. */
static size_t table_unread(const char *table, const unsigned long *inodes, size_t count)
{
    FILE *in = fopen(table, "r");
    if (in == NULL)
        return 0;
    char line[512];
    size_t unread = 0;
    if (fgets(line, sizeof(line), in) == NULL) { /* the heading */
        fclose(in);
        return 0;
    }
    while (fgets(line, sizeof(line), in) != NULL) {
        /* sl local rem st tx_queue:rx_queue tr:when retrnsmt uid timeout inode */
        unsigned long rx, inode;
        if (sscanf(line, "%*s %*s %*s %*s %*x:%lx %*s %*s %*s %*s %lu", &rx, &inode) != 2)
            continue;
        for (size_t i = 0; i < count; i++)
            if (inodes[i] == inode)
                unread += rx;
    }
    fclose(in);
    return unread;
}

size_t peer_socket_unread(pid_t pid)
{
    unsigned long inodes[MAX_SOCKETS];
    size_t count = socket_inodes(pid, inodes, MAX_SOCKETS);
    if (count == 0)
        return 0;
    return table_unread("/proc/net/tcp", inodes, count) +
           table_unread("/proc/net/tcp6", inodes, count);
}

size_t peer_socket_wait_unread(pid_t pid, size_t at_least, double timeout_s)
{
    struct timespec nap = {0, 2000000};
    double end = test_now() + timeout_s;
    do {
        size_t unread = peer_socket_unread(pid);
        if (unread >= at_least)
            return unread;
        nanosleep(&nap, NULL);
    } while (test_now() < end);
    return 0;
}
