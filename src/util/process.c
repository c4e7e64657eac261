/*
 * Who a process is, to a peer on the same kernel: boot id, pid namespace,
 * pid and start time.  Transports that reach a peer's memory through the
 * kernel or through shared memory use it to see at once that the peer is
 * gone (or that its pid now names another process).
 */
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ferry_boot_id(char *out, size_t len)
{
    FILE *file = fopen("/proc/sys/kernel/random/boot_id", "r");
    int ok = file != NULL && fgets(out, (int)len, file) != NULL;
    if (file)
        fclose(file);
    if (!ok) {
        out[0] = '\0';
        return 0;
    }
    out[strcspn(out, "\n")] = '\0';
    return 1;
}

/* /proc/<pid>/stat into text; returns its command's closing parenthesis
 * (") S 1 ...": field 3, the state, at [2]), or NULL. */
static const char *process_stat(long pid, char *text, size_t size)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *file = fopen(path, "r");
    if (file == NULL)
        return NULL;
    size_t n = fread(text, 1, size - 1, file);
    fclose(file);
    text[n] = '\0';
    const char *p = strrchr(text, ')');
    return p != NULL && p[1] == ' ' && p[2] != '\0' ? p : NULL;
}

unsigned long long ferry_process_start_time(long pid)
{
    char text[1024];
    const char *p = process_stat(pid, text, sizeof(text));
    /* Field 22 (starttime), counted after the state.  A zombie is as gone
     * as a reaped process. */
    if (p == NULL || p[2] == 'Z' || p[2] == 'X')
        return 0;
    for (int field = 2; p != NULL && field < 22; field++)
        p = strchr(p + 1, ' ');
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

int ferry_process_stopped(long pid)
{
    char text[1024];
    const char *p = process_stat(pid, text, sizeof(text));
    return p != NULL && (p[2] == 'T' || p[2] == 't');
}

static unsigned long long pid_namespace(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (unsigned long long)st.st_ino : 0;
}

void ferry_process_identity(char *out, size_t len)
{
    char boot[64];
    if (!ferry_boot_id(boot, sizeof(boot)))
        snprintf(boot, sizeof(boot), "-");
    boot[strcspn(boot, ":")] = '\0';
    long pid = (long)getpid();
    snprintf(out, len, "%s:%llu:%ld:%llu", boot, pid_namespace(), pid,
             ferry_process_start_time(pid));
}

const char *ferry_process_identity_parse(const char *identity, long *pid_p,
                                         unsigned long long *start_p)
{
    const char *field[4], *p = identity;
    for (int i = 0; i < 4; i++) {
        field[i] = p;
        p = strchr(p, ':');
        if (p == NULL)
            return NULL;
        p++;
    }
    *pid_p = 0;
    *start_p = 0;
    /* Only a process of our own kernel and pid namespace is one we can
     * look at (not one in another container, nor on another host). */
    char ours[160];
    ferry_process_identity(ours, sizeof(ours));
    size_t shared = (size_t)(field[2] - field[0]); /* "<boot id>:<pid ns>:" */
    if (strncmp(ours, field[0], shared) == 0 && field[0][0] != '-') {
        char *end;
        long pid = strtol(field[2], &end, 10);
        if (*end == ':' && pid > 0) {
            *pid_p = pid;
            *start_p = strtoull(field[3], NULL, 10);
        }
    }
    return p;
}

int ferry_process_alive(long pid, unsigned long long start_time)
{
    unsigned long long now = ferry_process_start_time(pid);
    return now != 0 && (start_time == 0 || now == start_time);
}
