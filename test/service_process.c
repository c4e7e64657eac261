#include "service_process.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define START_TIMEOUT_MS 20000

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static int in_path(const char *program, char *path, size_t len)
{
    const char *dirs = getenv("PATH");
    char copy[4096];
    snprintf(copy, sizeof(copy), "%s", dirs ? dirs : "/usr/bin:/bin");
    /* Debian puts etcd and redis-server in /usr/bin; sbin too for safety. */
    strncat(copy, ":/usr/sbin:/usr/bin", sizeof(copy) - strlen(copy) - 1);
    char *save = NULL;
    for (char *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        snprintf(path, len, "%s/%s", dir, program);
        if (access(path, X_OK) == 0)
            return 1;
    }
    return 0;
}

int service_module_built(const char *name)
{
    char path[1024];
    const char *dir = getenv("FERRY_MODULE_DIR");
    snprintf(path, sizeof(path), "%s/ferry_%s.so", dir ? dir : ".", name);
    return access(path, R_OK) == 0;
}

const char *service_missing(service_kind_t kind)
{
    char path[1024];
    switch (kind) {
    case SERVICE_ETCD:
        if (!service_module_built("etcd"))
            return "the etcd module is not built (libcurl missing)";
        return in_path("etcd", path, sizeof(path)) ? NULL : "etcd is not installed";
    case SERVICE_REDIS:
        if (!service_module_built("redis"))
            return "the redis module is not built (hiredis missing)";
        return in_path("redis-server", path, sizeof(path)) ? NULL
                                                           : "redis-server is not installed";
    case SERVICE_METAD: {
        if (!service_module_built("http"))
            return "the http module is not built (libcurl missing)";
        const char *metad = getenv("FERRY_METAD");
        return metad && access(metad, X_OK) == 0 ? NULL : "ferry_metad is not built";
    }
    }
    return "unknown service";
}

int service_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(addr);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(addr.sin_port);
}

static int connect_port(int port, int timeout_ms)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    return fd;
}

static int send_all(int fd, const void *data, size_t length)
{
    const char *p = data;
    while (length > 0) {
        ssize_t n = send(fd, p, length, MSG_NOSIGNAL);
        if (n <= 0)
            return -1;
        p += n;
        length -= (size_t)n;
    }
    return 0;
}

/* ---- HTTP ---- */

int http_call(int port, const char *method, const char *target, const char *headers,
              const void *body, size_t length, char *out, size_t out_size, size_t *length_p)
{
    int fd = connect_port(port, 5000);
    if (fd < 0)
        return -1;
    char head[2048];
    int n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n%s"
                     "Content-Length: %zu\r\n\r\n",
                     method, target, port, headers ? headers : "", length);
    /* A chunked request carries its own framing in headers and body. */
    if (headers && strstr(headers, "Transfer-Encoding: chunked"))
        n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n%s\r\n",
                     method, target, port, headers);
    size_t cap = 1 << 20, got = 0;
    char *raw = malloc(cap);
    int status = -1;
    if (raw == NULL || send_all(fd, head, (size_t)n) != 0)
        goto out;
    /* The server may answer (413) and close before taking the whole body. */
    if (length > 0)
        send_all(fd, body, length);
    for (;;) {
        if (got + 1 >= cap) {
            char *grown = realloc(raw, cap * 2);
            if (grown == NULL)
                goto out;
            raw = grown;
            cap *= 2;
        }
        ssize_t r = recv(fd, raw + got, cap - got - 1, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    raw[got] = '\0';
    if (sscanf(raw, "HTTP/1.%*d %d", &status) != 1) {
        status = -1;
        goto out;
    }
    char *start = strstr(raw, "\r\n\r\n");
    size_t body_length = 0;
    if (start != NULL) {
        *start = '\0';
        start += 4;
        int chunked = strcasestr(raw, "transfer-encoding: chunked") != NULL;
        char *dst = out;
        if (!chunked) {
            body_length = got - (size_t)(start - raw);
            if (out && out_size)
                memcpy(dst, start, body_length < out_size ? body_length : out_size - 1);
        } else {
            char *p = start;
            for (;;) {
                char *end;
                unsigned long chunk = strtoul(p, &end, 16);
                char *data = strstr(end, "\r\n");
                if (chunk == 0 || data == NULL)
                    break;
                data += 2;
                if (out && body_length + chunk < out_size)
                    memcpy(out + body_length, data, chunk);
                body_length += chunk;
                p = data + chunk + 2;
                if (p > raw + got)
                    break;
            }
        }
    }
    if (out && out_size)
        out[body_length < out_size ? body_length : out_size - 1] = '\0';
    if (length_p)
        *length_p = body_length;
out:
    free(raw);
    close(fd);
    return status;
}

/* ---- RESP ---- */

static int read_line(int fd, char *line, size_t len)
{
    size_t n = 0;
    while (n + 1 < len) {
        char c;
        if (recv(fd, &c, 1, 0) != 1)
            return -1;
        if (c == '\n' && n > 0 && line[n - 1] == '\r') {
            line[n - 1] = '\0';
            return 0;
        }
        line[n++] = c;
    }
    return -1;
}

int redis_call(int port, int argc, const char *const *argv, const size_t *lengths, char *out,
               size_t out_size, long *length_p)
{
    int fd = connect_port(port, 5000);
    if (fd < 0)
        return -1;
    char head[64];
    int type = -1;
    snprintf(head, sizeof(head), "*%d\r\n", argc);
    if (send_all(fd, head, strlen(head)) != 0)
        goto out;
    for (int i = 0; i < argc; i++) {
        size_t len = lengths ? lengths[i] : strlen(argv[i]);
        snprintf(head, sizeof(head), "$%zu\r\n", len);
        if (send_all(fd, head, strlen(head)) || send_all(fd, argv[i], len) ||
            send_all(fd, "\r\n", 2))
            goto out;
    }
    char line[4096];
    if (read_line(fd, line, sizeof(line)) != 0)
        goto out;
    type = line[0];
    if (length_p)
        *length_p = -1;
    if (type == '$') {
        long len = atol(line + 1);
        if (length_p)
            *length_p = len;
        size_t got = 0;
        while (len > 0 && got < (size_t)len + 2) {
            char c;
            if (recv(fd, &c, 1, 0) != 1)
                break;
            if (out && got + 1 < out_size)
                out[got] = c;
            got++;
        }
        if (out && out_size)
            out[len > 0 && (size_t)len < out_size ? (size_t)len : 0] = '\0';
    } else if (out && out_size) {
        snprintf(out, out_size, "%s", line + 1);
    }
out:
    close(fd);
    return type;
}

void base64_encode(const void *data, size_t length, char *out)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *in = data;
    size_t i = 0;
    for (; i + 2 < length; i += 3) {
        unsigned v = (unsigned)in[i] << 16 | (unsigned)in[i + 1] << 8 | in[i + 2];
        *out++ = a[v >> 18];
        *out++ = a[(v >> 12) & 63];
        *out++ = a[(v >> 6) & 63];
        *out++ = a[v & 63];
    }
    if (i < length) {
        unsigned v = (unsigned)in[i] << 16 | (i + 1 < length ? (unsigned)in[i + 1] << 8 : 0);
        *out++ = a[v >> 18];
        *out++ = a[(v >> 12) & 63];
        *out++ = i + 1 < length ? a[(v >> 6) & 63] : '=';
        *out++ = '=';
    }
    *out = '\0';
}

/* ---- processes ---- */

/* What is running or on disk, by data directory, so service_cleanup_all
 * can clean up after a test that stopped half-way (its service_t is gone). */
static struct {
    char dir[256];
    pid_t pid;
} started[16];

static void track(const service_t *svc)
{
    int free_slot = -1;
    for (int i = 0; i < 16; i++) {
        if (started[i].dir[0] && strcmp(started[i].dir, svc->dir) == 0) {
            started[i].pid = svc->pid;
            return;
        }
        if (!started[i].dir[0] && free_slot < 0)
            free_slot = i;
    }
    if (free_slot >= 0) {
        snprintf(started[free_slot].dir, sizeof(started[free_slot].dir), "%s", svc->dir);
        started[free_slot].pid = svc->pid;
    }
}

static void untrack(const char *dir)
{
    for (int i = 0; i < 16; i++)
        if (started[i].dir[0] && strcmp(started[i].dir, dir) == 0)
            started[i].dir[0] = '\0';
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void remove_tree(const char *dir)
{
    if (dir[0] != '\0')
        nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* fork + exec argv with stdout to out_fd (or the log) and stderr to the log. */
static pid_t spawn(char *const *argv, const char *log, int out_fd)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    /* The server must not outlive a test that crashed. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
        dup2(out_fd >= 0 ? out_fd : fd, 1);
        dup2(fd, 2);
    }
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0)
        dup2(null, 0);
    execvp(argv[0], argv);
    _exit(127);
}

static int exited(service_t *svc)
{
    int status;
    if (waitpid(svc->pid, &status, WNOHANG) == svc->pid) {
        svc->pid = 0;
        track(svc);
        return 1;
    }
    return 0;
}

static int wait_ready(service_t *svc)
{
    long deadline = now_ms() + START_TIMEOUT_MS;
    char out[512];
    while (now_ms() < deadline) {
        if (exited(svc))
            return -1;
        if (svc->kind == SERVICE_ETCD) {
            /* /health on the metrics port is plain http even when clients
             * use TLS, and says true only once a leader is elected. */
            if (http_call(svc->metrics_port, "GET", "/health", NULL, NULL, 0, out, sizeof(out),
                          NULL) == 200 &&
                strstr(out, "true"))
                return 0;
        } else if (svc->kind == SERVICE_REDIS) {
            const char *ping[] = {"PING"};
            int type = redis_call(svc->port, 1, ping, NULL, out, sizeof(out), NULL);
            if (type == '+' || (type == '-' && strstr(out, "NOAUTH")))
                return 0;
        }
        usleep(50000);
    }
    return -1;
}

static int launch(service_t *svc)
{
    char log[600], a[16][600];
    char *argv[40];
    int n = 0;
    if (svc->kind == SERVICE_ETCD) {
        const char *scheme = svc->tls ? "https" : "http";
        snprintf(log, sizeof(log), "%s/etcd.log", svc->dir);
        argv[n++] = "etcd";
        argv[n++] = "--name=ferry-test";
        snprintf(a[0], sizeof(a[0]), "--data-dir=%s/etcd", svc->dir);
        snprintf(a[1], sizeof(a[1]), "--listen-client-urls=%s://127.0.0.1:%d", scheme,
                 svc->port);
        snprintf(a[2], sizeof(a[2]), "--advertise-client-urls=%s://127.0.0.1:%d", scheme,
                 svc->port);
        snprintf(a[3], sizeof(a[3]), "--listen-peer-urls=http://127.0.0.1:%d", svc->peer_port);
        snprintf(a[4], sizeof(a[4]), "--initial-advertise-peer-urls=http://127.0.0.1:%d",
                 svc->peer_port);
        snprintf(a[5], sizeof(a[5]), "--initial-cluster=ferry-test=http://127.0.0.1:%d",
                 svc->peer_port);
        snprintf(a[6], sizeof(a[6]), "--listen-metrics-urls=http://127.0.0.1:%d",
                 svc->metrics_port);
        for (int i = 0; i < 7; i++)
            argv[n++] = a[i];
        argv[n++] = "--heartbeat-interval=50";
        argv[n++] = "--election-timeout=500";
        argv[n++] = "--log-level=warn";
        argv[n++] = "--logger=zap";
    } else if (svc->kind == SERVICE_REDIS) {
        snprintf(log, sizeof(log), "%s/redis.log", svc->dir);
        argv[n++] = "redis-server";
        /* one argument per word: redis-server joins them into a config */
        argv[n++] = "--port";
        snprintf(a[0], sizeof(a[0]), "%d", svc->port);
        argv[n++] = a[0];
        argv[n++] = "--bind";
        argv[n++] = "127.0.0.1";
        argv[n++] = "--save";
        argv[n++] = "";
        argv[n++] = "--appendonly";
        argv[n++] = "no";
        argv[n++] = "--protected-mode";
        argv[n++] = "no";
        argv[n++] = "--daemonize";
        argv[n++] = "no";
        argv[n++] = "--dir";
        argv[n++] = svc->dir;
    } else {
        snprintf(log, sizeof(log), "%s/metad.log", svc->dir);
        argv[n++] = getenv("FERRY_METAD");
        snprintf(a[0], sizeof(a[0]), "--listen=127.0.0.1:%d", svc->port);
        argv[n++] = a[0];
    }
    for (int i = 0; i < svc->n_extra; i++)
        argv[n++] = svc->extra[i];
    argv[n] = NULL;

    int pipe_fd[2] = {-1, -1};
    if (svc->kind == SERVICE_METAD && pipe(pipe_fd) != 0)
        return -1;
    svc->pid = spawn(argv, log, pipe_fd[1]);
    if (svc->pid < 0)
        return -1;
    track(svc);
    if (svc->kind != SERVICE_METAD)
        return wait_ready(svc);

    /* ferry_metad says where it listens. */
    close(pipe_fd[1]);
    char line[256];
    size_t len = 0;
    int rc = -1;
    long deadline = now_ms() + START_TIMEOUT_MS;
    while (len + 1 < sizeof(line) && now_ms() < deadline) {
        struct pollfd pfd = {.fd = pipe_fd[0], .events = POLLIN};
        if (poll(&pfd, 1, 200) <= 0)
            continue;
        if (read(pipe_fd[0], &line[len], 1) != 1)
            break;
        if (line[len] == '\n') {
            line[len] = '\0';
            int port;
            if (sscanf(line, "ferry_metad: listening on 127.0.0.1:%d", &port) == 1) {
                svc->port = port;
                rc = 0;
            }
            break;
        }
        len++;
    }
    close(pipe_fd[0]);
    if (rc != 0) {
        service_stop(svc, SIGKILL);
        return -1;
    }
    snprintf(svc->uri, sizeof(svc->uri), "http://127.0.0.1:%d/metadata", svc->port);
    return 0;
}

int service_start(service_t *svc, service_kind_t kind, const char *const *extra)
{
    memset(svc, 0, sizeof(*svc));
    svc->kind = kind;
    snprintf(svc->dir, sizeof(svc->dir), "/tmp/ferry-md-test-XXXXXX");
    if (mkdtemp(svc->dir) == NULL) {
        svc->dir[0] = '\0';
        return -1;
    }
    for (int i = 0; extra && extra[i] && i < 8; i++) {
        snprintf(svc->extra[i], sizeof(svc->extra[i]), "%s", extra[i]);
        svc->n_extra++;
        if (strncmp(extra[i], "--cert-file", 11) == 0)
            svc->tls = 1;
    }
    /* A port picked free may be taken before the server binds it: retry. */
    for (int attempt = 0; attempt < 3; attempt++) {
        svc->port = kind == SERVICE_METAD ? 0 : service_free_port();
        if (kind == SERVICE_ETCD) {
            svc->peer_port = service_free_port();
            svc->metrics_port = service_free_port();
            if (svc->peer_port == svc->port || svc->metrics_port == svc->port ||
                svc->metrics_port == svc->peer_port)
                continue;
        }
        if (launch(svc) == 0) {
            if (kind == SERVICE_ETCD)
                snprintf(svc->uri, sizeof(svc->uri), "etcd://127.0.0.1:%d", svc->port);
            else if (kind == SERVICE_REDIS)
                snprintf(svc->uri, sizeof(svc->uri), "redis://127.0.0.1:%d", svc->port);
            return 0;
        }
        if (svc->pid > 0)
            service_stop(svc, SIGKILL);
    }
    return -1;
}

int service_stop(service_t *svc, int sig)
{
    if (svc->pid <= 0)
        return -1;
    kill(svc->pid, sig);
    int status = 0;
    waitpid(svc->pid, &status, 0);
    svc->pid = 0;
    track(svc);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int service_restart(service_t *svc, int keep_data)
{
    if (svc->pid > 0)
        service_stop(svc, SIGKILL);
    if (!keep_data) {
        char sub[300];
        snprintf(sub, sizeof(sub), "%s/etcd", svc->dir);
        remove_tree(sub);
    }
    /* Same port: clients reconnect to where the server was. */
    for (int attempt = 0; attempt < 20; attempt++) {
        if (launch(svc) == 0)
            return 0;
        usleep(100000);
    }
    return -1;
}

void service_cleanup(service_t *svc)
{
    if (svc->pid > 0)
        service_stop(svc, SIGKILL);
    untrack(svc->dir);
    remove_tree(svc->dir);
    svc->dir[0] = '\0';
}

void service_cleanup_all(void)
{
    for (int i = 0; i < 16; i++) {
        if (!started[i].dir[0])
            continue;
        if (started[i].pid > 0) {
            kill(started[i].pid, SIGKILL);
            waitpid(started[i].pid, NULL, 0);
        }
        remove_tree(started[i].dir);
        started[i].dir[0] = '\0';
    }
}

void service_start_forgery_store(service_t *svc)
{
    const char *missing = service_missing(SERVICE_METAD);
    if (missing != NULL)
        cr_skip_test("%s", missing);
    cr_assert_eq(service_start(svc, SERVICE_METAD, NULL), 0);
    setenv("FERRY_METADATA", svc->uri, 1);
}
