#include "ofi_shm_regions.h"

#include <glob.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

size_t ofi_shm_regions_of(pid_t pid, int remove)
{
    char pattern[64];
    snprintf(pattern, sizeof(pattern), "/dev/shm/ferry-%ld-*", (long)pid);
    glob_t found;
    if (glob(pattern, 0, NULL, &found) != 0)
        return 0;
    size_t count = found.gl_pathc;
    for (size_t i = 0; remove && i < count; i++)
        unlink(found.gl_pathv[i]);
    globfree(&found);
    return count;
}

void ofi_kill_peer(peer_process_t *peer)
{
    pid_t pid = peer->pid;
    peer_kill(peer, SIGKILL);
    ofi_shm_regions_of(pid, 1);
}
