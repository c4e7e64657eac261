#include "netns_pair.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define IP_TIMEOUT_MS 10000
#define NETNS_DIR "/run/netns"
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* iproute2's ip: PATH first, then where Debian puts it. */
static const char *ip_program(void)
{
    static char path[512];
    const char *env = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof(dirs), "%s:/usr/sbin:/sbin:/usr/bin:/bin", env ? env : "");
    char *save = NULL;
    for (char *dir = strtok_r(dirs, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        snprintf(path, sizeof(path), "%s/ip", dir);
        if (access(path, X_OK) == 0)
            return path;
    }
    return NULL;
}

/* Wait (bounded by deadline) for pid; SIGKILL it past the deadline.
 * Its exit status, or -1 when it was killed or did not exit normally. */
static int reap(pid_t pid, long deadline)
{
    int status;
    for (;;) {
        pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (done < 0 && errno != EINTR)
            return -1;
        if (now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(2000);
    }
}

/* Whether this thread is in namespace fd (kind: "net", "mnt"); yes for -1. */
static int in_ns(int fd, const char *kind)
{
    char path[64];
    struct stat ours, theirs;
    snprintf(path, sizeof(path), "/proc/thread-self/ns/%s", kind);
    return fd < 0 || (fstat(fd, &theirs) == 0 && stat(path, &ours) == 0 &&
                      ours.st_dev == theirs.st_dev && ours.st_ino == theirs.st_ino);
}

/* Run `ip ARGS` (ARGS split at spaces) in the creator's namespaces, output
 * (stdout and stderr, trimmed) into out.  Its exit status, -1 if it did not
 * run or ran past IP_TIMEOUT_MS. */
static int run_ip(const netns_pair_t *pair, char *out, size_t out_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int run_ip(const netns_pair_t *pair, char *out, size_t out_len, const char *fmt, ...)
{
    char line[512], *argv[24];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    const char *program = ip_program();
    size_t argc = 0;
    argv[argc++] = (char *)"ip";
    char *save = NULL;
    for (char *arg = strtok_r(line, " ", &save); arg && argc + 1 < ARRAY_LEN(argv);
         arg = strtok_r(NULL, " ", &save))
        argv[argc++] = arg;
    argv[argc] = NULL;
    out[0] = '\0';
    int net = in_ns(pair->root_net, "net") ? -1 : pair->root_net;
    int mnt = in_ns(pair->root_mnt, "mnt") ? -1 : pair->root_mnt;
    int fds[2];
    if (program == NULL || pipe2(fds, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        /* From the machine's namespaces: a namespace's mount is removed only
         * there (this process may sit in a private mount namespace). */
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        if ((net >= 0 && setns(net, CLONE_NEWNET) != 0) ||
            (mnt >= 0 && setns(mnt, CLONE_NEWNS) != 0)) {
            dprintf(2, "setns: %s", strerror(errno));
            _exit(126);
        }
        execv(program, argv);
        dprintf(2, "%s: %s", program, strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    long deadline = now_ms() + IP_TIMEOUT_MS;
    size_t n = 0;
    for (;;) {
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        long left = deadline - now_ms();
        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
            break;
        char chunk[256];
        ssize_t got = read(fds[0], chunk, sizeof(chunk));
        if (got <= 0)
            break;
        size_t room = out_len - 1 - n, keep = (size_t)got < room ? (size_t)got : room;
        memcpy(out + n, chunk, keep);
        n += keep;
    }
    close(fds[0]);
    out[n] = '\0';
    out[strcspn(out, "\n")] = '\0';
    return reap(pid, deadline);
}

/* Whether pid names a live process (a zombie is gone: its namespaces are
 * nobody's any more, however long its parent takes to reap it). */
static int alive(long pid)
{
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        return 0;
    char path[64], stat[256] = "";
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *file = fopen(path, "r");
    if (file == NULL)
        return 0;
    int got = fgets(stat, sizeof(stat), file) != NULL;
    fclose(file);
    const char *state = strrchr(stat, ')'); /* "pid (comm) S ..." */
    return !got || state == NULL || state[1] == '\0' || state[2] != 'Z';
}

/* What a run whose process is gone left behind: NAME<pid>SUFFIX entries of
 * dir, removed with `ip <remove> NAME`.  Our own pid counts as gone: a pid
 * reused since that run must not make our names collide. */
static void remove_stale(const netns_pair_t *pair, const char *dir, const char *prefix,
                         const char *remove)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    size_t prefix_len = strlen(prefix);
    struct dirent *entry;
    while ((entry = readdir(d)) != NULL) {
        if (strncmp(entry->d_name, prefix, prefix_len) != 0)
            continue;
        char *end;
        long pid = strtol(entry->d_name + prefix_len, &end, 10);
        if (end == entry->d_name + prefix_len || pid <= 0)
            continue;
        if (pid != getpid() && alive(pid))
            continue;
        char out[256];
        run_ip(pair, out, sizeof(out), "%s %s", remove, entry->d_name);
    }
    closedir(d);
}

/* Whether a process can have mounts of its own, as ip -n and netns_enter
 * need: a child unshares its mount namespace and makes / a slave of the
 * machine's.  In a chroot whose / is not a mount point that fails (EINVAL).
 * 0, or the errno. */
static int private_mounts_work(void)
{
    pid_t pid = fork();
    if (pid < 0)
        return errno;
    if (pid == 0) {
        if (unshare(CLONE_NEWNS) != 0 || mount("", "/", NULL, MS_SLAVE | MS_REC, NULL) != 0)
            _exit(errno > 0 && errno < 256 ? errno : 255);
        _exit(0);
    }
    int status = reap(pid, now_ms() + IP_TIMEOUT_MS);
    return status == 0 ? 0 : status > 0 ? status : EIO;
}

int netns_pair_create(netns_pair_t *pair, char *why, size_t why_len)
{
    memset(pair, 0, sizeof(*pair));
    pair->root_net = pair->root_mnt = -1;
    if (geteuid() != 0) {
        snprintf(why, why_len, "not root: network namespaces need CAP_SYS_ADMIN");
        return NETNS_UNAVAILABLE;
    }
    if (ip_program() == NULL) {
        snprintf(why, why_len, "ip (iproute2) is not installed");
        return NETNS_UNAVAILABLE;
    }
    pair->root_net = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    pair->root_mnt = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    if (pair->root_net < 0 || pair->root_mnt < 0) {
        snprintf(why, why_len, "/proc/self/ns: %s", strerror(errno));
        netns_pair_destroy(pair);
        return NETNS_UNAVAILABLE;
    }
    int err = private_mounts_work();
    if (err != 0) {
        snprintf(why, why_len,
                 "no mounts of its own for a namespace (mount --make-rslave /: "
                 "%s; a chroot's / that is not a mount point)",
                 strerror(err));
        netns_pair_destroy(pair);
        return NETNS_UNAVAILABLE;
    }
    remove_stale(pair, NETNS_DIR, NETNS_PAIR_PREFIX, "netns del");
    remove_stale(pair, "/sys/class/net", NETNS_VETH_PREFIX, "link del");

    int pid = (int)getpid();
    for (int i = 0; i < 2; i++) {
        snprintf(pair->ns[i], sizeof(pair->ns[i]), NETNS_PAIR_PREFIX "%d-%c", pid, 'a' + i);
        snprintf(pair->ifname[i], sizeof(pair->ifname[i]), NETNS_VETH_PREFIX "%d%c", pid,
                 'a' + i);
        snprintf(pair->ip[i], sizeof(pair->ip[i]), "10.254.87.%d", i + 1);
    }
    char out[256];
    for (int i = 0; i < 2; i++, pair->made++) {
        if (run_ip(pair, out, sizeof(out), "netns add %s", pair->ns[i]) != 0) {
            snprintf(why, why_len, "ip netns add failed (no CAP_SYS_ADMIN?): %s", out);
            netns_pair_destroy(pair);
            return NETNS_UNAVAILABLE;
        }
    }
    if (run_ip(pair, out, sizeof(out), "link add %s type veth peer name %s", pair->ifname[0],
               pair->ifname[1]) != 0) {
        snprintf(why, why_len, "ip link add ... type veth failed: %s", out);
        netns_pair_destroy(pair);
        return NETNS_UNAVAILABLE;
    }
    for (int i = 0; i < 2; i++) {
        const char *ns = pair->ns[i], *dev = pair->ifname[i];
        if (run_ip(pair, out, sizeof(out), "link set %s netns %s", dev, ns) != 0 ||
            run_ip(pair, out, sizeof(out), "-n %s addr add %s/30 dev %s", ns, pair->ip[i],
                   dev) != 0 ||
            run_ip(pair, out, sizeof(out), "-n %s link set lo up", ns) != 0 ||
            run_ip(pair, out, sizeof(out), "-n %s link set %s up", ns, dev) != 0) {
            snprintf(why, why_len, "setting up %s in %s: %s", dev, ns, out);
            netns_pair_destroy(pair);
            return NETNS_FAILED;
        }
    }
    /* "link set up" returns before the carrier is: a library that lists
     * running interfaces (UCX) would not see the veth yet. */
    for (int i = 0; i < 2; i++) {
        long deadline = now_ms() + IP_TIMEOUT_MS;
        while (run_ip(pair, out, sizeof(out), "-n %s link show dev %s", pair->ns[i],
                      pair->ifname[i]) != 0 ||
               strstr(out, "LOWER_UP") == NULL) {
            if (now_ms() > deadline) {
                snprintf(why, why_len, "%s in %s never came up: %s", pair->ifname[i],
                         pair->ns[i], out);
                netns_pair_destroy(pair);
                return NETNS_FAILED;
            }
            usleep(10000);
        }
    }
    return NETNS_OK;
}

void netns_pair_destroy(netns_pair_t *pair)
{
    char out[256];
    if (pair->made > 0) {
        /* Deleting one end deletes both, at once; a namespace itself goes
         * only when nothing holds it any more.  Where the veth never left
         * the machine's namespace, it is deleted there. */
        if (run_ip(pair, out, sizeof(out), "-n %s link del %s", pair->ns[0],
                   pair->ifname[0]) != 0)
            run_ip(pair, out, sizeof(out), "link del %s", pair->ifname[0]);
        for (int i = pair->made - 1; i >= 0; i--)
            run_ip(pair, out, sizeof(out), "netns del %s", pair->ns[i]);
        pair->made = 0;
    }
    if (pair->root_net >= 0)
        close(pair->root_net);
    if (pair->root_mnt >= 0)
        close(pair->root_mnt);
    pair->root_net = pair->root_mnt = -1;
}

static int join_net(const char *name)
{
    char path[256];
    snprintf(path, sizeof(path), NETNS_DIR "/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = setns(fd, CLONE_NEWNET);
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

int netns_enter(const char *name)
{
    if (join_net(name) != 0 || unshare(CLONE_NEWNS) != 0)
        return -1;
    /* Our mounts must not reach the machine's (what ip netns exec does). */
    if (mount("", "/", NULL, MS_SLAVE | MS_REC, NULL) != 0)
        return -1;
    umount2("/sys", MNT_DETACH);
    return mount(name, "/sys", "sysfs", 0, NULL);
}

typedef struct link_query {
    const char *ns, *ifname;
    uint64_t rx, tx;
    int rc;
} link_query_t;

static void *read_link_bytes(void *arg)
{
    link_query_t *q = arg;
    q->rc = -1;
    if (join_net(q->ns) != 0)
        return NULL;
    FILE *file = fopen("/proc/thread-self/net/dev", "r");
    if (file == NULL)
        return NULL;
    char line[512];
    while (q->rc != 0 && fgets(line, sizeof(line), file) != NULL) {
        char *colon = strchr(line, ':');
        if (colon == NULL)
            continue;
        *colon = '\0';
        const char *name = line + strspn(line, " ");
        if (strcmp(name, q->ifname) == 0 &&
            sscanf(colon + 1, "%" SCNu64 " %*u %*u %*u %*u %*u %*u %*u %" SCNu64, &q->rx,
                   &q->tx) == 2)
            q->rc = 0;
    }
    fclose(file);
    return NULL;
}

int netns_link_bytes(const char *ns, const char *ifname, uint64_t *rx_p, uint64_t *tx_p)
{
    /* setns(CLONE_NEWNET) moves only the calling thread: a thread of its
     * own joins the namespace and dies with it. */
    link_query_t q = {.ns = ns, .ifname = ifname, .rc = -1};
    pthread_t thread;
    if (pthread_create(&thread, NULL, read_link_bytes, &q) != 0)
        return -1;
    pthread_join(thread, NULL);
    *rx_p = q.rx;
    *tx_p = q.tx;
    return q.rc;
}
