/*
 * ferry_metad: Ferry's HTTP metadata server (libmicrohttpd).
 *
 *   GET    /metadata?key=K   200 and the value, 404 when K is not stored (HEAD too)
 *   PUT    /metadata?key=K   store the body (POST too); 413 over --max-body
 *   DELETE /metadata?key=K   200, or 404 when K is not stored
 *   GET    /health           200 {"status":"ok","keys":N,"bytes":B,"requests":{"get":G,
 *                             "put":P,"delete":D,"other":O}} (requests on /metadata)
 *
 * the protocol of Mooncake's HTTP metadata server, so its clients work
 * against it.  Values are opaque bytes.  With --persist=FILE every change is
 * written to FILE (a new file, fsync, rename) before it is acknowledged, and
 * FILE is loaded at start, so a restart, even after SIGKILL, loses nothing
 * acknowledged.  Concurrent changes share one write (group commit).
 * SIGTERM or SIGINT stops it cleanly.
 */
#include <config.h>

#include <microhttpd.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tool_args.h"

#define PERSIST_MAGIC "ferry_metad 1\n"
/* 413: its MHD_HTTP_ name changed across libmicrohttpd versions */
#define HTTP_TOO_LARGE 413

/* ---------------- the key-value table ---------------- */

typedef struct entry {
    char *key;
    char *value;
    size_t length;
    uint64_t hash;
    struct entry *next;
} entry_t;

/* lock protects everything; version counts changes (for persistence). */
typedef struct table {
    pthread_rwlock_t lock;
    entry_t **buckets;
    size_t n_buckets;
    size_t count;
    size_t bytes;
    uint64_t version;
} table_t;

static table_t table;

static uint64_t hash_key(const char *key)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return h;
}

static int table_init(void)
{
    pthread_rwlock_init(&table.lock, NULL);
    table.n_buckets = 256;
    table.buckets = calloc(table.n_buckets, sizeof(*table.buckets));
    return table.buckets ? 0 : -1;
}

static void table_fini(void)
{
    for (size_t i = 0; i < table.n_buckets; i++) {
        for (entry_t *e = table.buckets[i], *next; e; e = next) {
            next = e->next;
            free(e->key);
            free(e->value);
            free(e);
        }
    }
    free(table.buckets);
    pthread_rwlock_destroy(&table.lock);
}

/* Caller holds the lock. */
static entry_t **table_slot(const char *key, uint64_t h)
{
    entry_t **slot = &table.buckets[h % table.n_buckets];
    while (*slot && ((*slot)->hash != h || strcmp((*slot)->key, key) != 0))
        slot = &(*slot)->next;
    return slot;
}

static void table_grow(void)
{
    size_t n = table.n_buckets * 2;
    entry_t **buckets = calloc(n, sizeof(*buckets));
    if (buckets == NULL)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < table.n_buckets; i++) {
        for (entry_t *e = table.buckets[i], *next; e; e = next) {
            next = e->next;
            e->next = buckets[e->hash % n];
            buckets[e->hash % n] = e;
        }
    }
    free(table.buckets);
    table.buckets = buckets;
    table.n_buckets = n;
}

/* Takes value over.  Returns the new table version, 0 when out of memory. */
static uint64_t table_put(const char *key, char *value, size_t length)
{
    uint64_t h = hash_key(key), version = 0;
    pthread_rwlock_wrlock(&table.lock);
    entry_t **slot = table_slot(key, h);
    if (*slot != NULL) {
        table.bytes -= (*slot)->length;
        free((*slot)->value);
        (*slot)->value = value;
        (*slot)->length = length;
    } else {
        entry_t *e = calloc(1, sizeof(*e));
        char *copy = strdup(key);
        if (e == NULL || copy == NULL) {
            free(e);
            free(copy);
            free(value);
            pthread_rwlock_unlock(&table.lock);
            return 0;
        }
        *e = (entry_t){.key = copy, .value = value, .length = length, .hash = h};
        *slot = e;
        table.count++;
        table.bytes += strlen(copy);
        if (table.count > 2 * table.n_buckets)
            table_grow();
    }
    table.bytes += length;
    version = ++table.version;
    pthread_rwlock_unlock(&table.lock);
    return version;
}

/* Returns the new table version, 0 when the key was not there. */
static uint64_t table_delete(const char *key)
{
    uint64_t h = hash_key(key), version = 0;
    pthread_rwlock_wrlock(&table.lock);
    entry_t **slot = table_slot(key, h);
    if (*slot != NULL) {
        entry_t *e = *slot;
        *slot = e->next;
        table.count--;
        table.bytes -= e->length + strlen(e->key);
        free(e->key);
        free(e->value);
        free(e);
        version = ++table.version;
    }
    pthread_rwlock_unlock(&table.lock);
    return version;
}

/* ---------------- persistence ---------------- */

static const char *persist_path;
static pthread_mutex_t persist_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t persist_done = PTHREAD_COND_INITIALIZER;
static int persist_writing;     /* persist_lock */
static uint64_t persist_version; /* persist_lock: the table version on disk */

/* The whole table as the file's bytes (malloc-ed), and its version. */
static char *snapshot(size_t *length_p, uint64_t *version_p)
{
    pthread_rwlock_rdlock(&table.lock);
    size_t size = strlen(PERSIST_MAGIC) + 32 + table.bytes + table.count * 48;
    char *buffer = malloc(size), *p = buffer;
    if (buffer != NULL) {
        p += sprintf(p, "%s%zu\n", PERSIST_MAGIC, table.count);
        for (size_t i = 0; i < table.n_buckets; i++) {
            for (entry_t *e = table.buckets[i]; e; e = e->next) {
                size_t klen = strlen(e->key);
                p += sprintf(p, "%zu %zu\n", klen, e->length);
                memcpy(p, e->key, klen);
                p += klen;
                memcpy(p, e->value, e->length);
                p += e->length;
                *p++ = '\n';
            }
        }
        *length_p = (size_t)(p - buffer);
        *version_p = table.version;
    }
    pthread_rwlock_unlock(&table.lock);
    return buffer;
}

static int write_all(int fd, const char *data, size_t length)
{
    while (length > 0) {
        ssize_t n = write(fd, data, length);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        data += n;
        length -= (size_t)n;
    }
    return 0;
}

/* Write the file atomically: a new file beside it, fsync, rename, fsync the
 * directory.  A crash leaves the old file or the new one, never half. */
static int write_file(const char *data, size_t length)
{
    char tmp[4096], dir[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", persist_path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "ferry_metad: cannot write %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    if (write_all(fd, data, length) != 0 || fsync(fd) != 0) {
        fprintf(stderr, "ferry_metad: cannot write %s: %s\n", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return -1;
    }
    close(fd);
    if (rename(tmp, persist_path) != 0) {
        fprintf(stderr, "ferry_metad: cannot rename %s to %s: %s\n", tmp, persist_path,
                strerror(errno));
        unlink(tmp);
        return -1;
    }
    snprintf(dir, sizeof(dir), "%s", persist_path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else if (slash != NULL)
        *slash = '\0';
    else
        snprintf(dir, sizeof(dir), ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

/* Return once the table at `version` (or later) is on disk; -1 if writing
 * failed.  One thread writes for all waiting ones. */
static int persist(uint64_t version)
{
    if (persist_path == NULL)
        return 0;
    int rc = 0;
    pthread_mutex_lock(&persist_lock);
    while (persist_version < version) {
        if (persist_writing) {
            pthread_cond_wait(&persist_done, &persist_lock);
            continue;
        }
        persist_writing = 1;
        pthread_mutex_unlock(&persist_lock);
        size_t length = 0;
        uint64_t taken = 0;
        char *data = snapshot(&length, &taken);
        rc = data ? write_file(data, length) : -1;
        free(data);
        pthread_mutex_lock(&persist_lock);
        persist_writing = 0;
        if (rc == 0 && taken > persist_version)
            persist_version = taken;
        pthread_cond_broadcast(&persist_done);
        if (rc != 0)
            break;
    }
    pthread_mutex_unlock(&persist_lock);
    return rc;
}

static int load_file(void)
{
    FILE *file = fopen(persist_path, "rb");
    if (file == NULL) {
        if (errno == ENOENT)
            return 0; /* first start: created on the first change */
        fprintf(stderr, "ferry_metad: cannot read %s: %s\n", persist_path, strerror(errno));
        return -1;
    }
    char magic[sizeof(PERSIST_MAGIC)] = "";
    size_t count = 0, i = 0;
    int bad = fread(magic, 1, strlen(PERSIST_MAGIC), file) != strlen(PERSIST_MAGIC) ||
              strcmp(magic, PERSIST_MAGIC) != 0 || fscanf(file, "%zu", &count) != 1 ||
              fgetc(file) != '\n';
    for (; !bad && i < count; i++) {
        size_t klen, vlen;
        if (fscanf(file, "%zu %zu", &klen, &vlen) != 2 || fgetc(file) != '\n' ||
            klen == 0 || klen > ((size_t)1 << 20) || vlen > ((size_t)1 << 34)) {
            bad = 1;
            break;
        }
        char *key = malloc(klen + 1), *value = malloc(vlen + 1);
        if (key == NULL || value == NULL || fread(key, 1, klen, file) != klen ||
            fread(value, 1, vlen, file) != vlen || fgetc(file) != '\n' ||
            memchr(key, '\0', klen) != NULL) {
            free(key);
            free(value);
            bad = 1;
            break;
        }
        key[klen] = '\0';
        value[vlen] = '\0';
        bad = table_put(key, value, vlen) == 0;
        free(key);
    }
    if (!bad && fgetc(file) != EOF)
        bad = 1;
    fclose(file);
    if (bad) {
        fprintf(stderr, "ferry_metad: %s is not a ferry_metad file or is damaged (at entry %zu "
                "of %zu); refusing to start rather than lose it\n", persist_path, i, count);
        return -1;
    }
    persist_version = table.version;
    return 0;
}

/* ---------------- HTTP ---------------- */

static size_t max_body = (size_t)64 << 20;

typedef struct request {
    char *body;
    size_t length, capacity;
    int too_large;
} request_t;

static enum MHD_Result reply(struct MHD_Connection *connection, unsigned code, const char *type,
                             const void *data, size_t length)
{
    struct MHD_Response *response = MHD_create_response_from_buffer(length, (void *)data,
                                                                    MHD_RESPMEM_MUST_COPY);
    if (response == NULL)
        return MHD_NO;
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD, PUT, POST, DELETE");
    enum MHD_Result result = MHD_queue_response(connection, code, response);
    MHD_destroy_response(response);
    return result;
}

static enum MHD_Result text(struct MHD_Connection *connection, unsigned code, const char *msg)
{
    return reply(connection, code, "text/plain", msg, strlen(msg));
}

static enum MHD_Result too_large(struct MHD_Connection *connection)
{
    char msg[96];
    snprintf(msg, sizeof(msg), "body larger than %zu bytes\n", max_body);
    return text(connection, HTTP_TOO_LARGE, msg);
}

/* Requests answered on /metadata since start, by method, for capacity
 * planning (doc/scale.md counts a job's requests with them).  Relaxed:
 * MHD's threads add, /health reads a close-enough sum. */
enum { COUNT_GET, COUNT_PUT, COUNT_DELETE, COUNT_OTHER, COUNT_MAX };
static atomic_ullong served[COUNT_MAX];

static void count_request(int which)
{
    atomic_fetch_add_explicit(&served[which], 1, memory_order_relaxed);
}

static enum MHD_Result on_health(struct MHD_Connection *connection)
{
    char body[256];
    unsigned long long n[COUNT_MAX];
    for (int i = 0; i < COUNT_MAX; i++)
        n[i] = atomic_load_explicit(&served[i], memory_order_relaxed);
    pthread_rwlock_rdlock(&table.lock);
    snprintf(body, sizeof(body), "{\"status\":\"ok\",\"keys\":%zu,\"bytes\":%zu,"
             "\"requests\":{\"get\":%llu,\"put\":%llu,\"delete\":%llu,\"other\":%llu}}\n",
             table.count, table.bytes, n[COUNT_GET], n[COUNT_PUT], n[COUNT_DELETE],
             n[COUNT_OTHER]);
    pthread_rwlock_unlock(&table.lock);
    return reply(connection, MHD_HTTP_OK, "application/json", body, strlen(body));
}

static enum MHD_Result on_get(struct MHD_Connection *connection, const char *key)
{
    uint64_t h = hash_key(key);
    pthread_rwlock_rdlock(&table.lock);
    entry_t *e = *table_slot(key, h);
    enum MHD_Result result = e ? reply(connection, MHD_HTTP_OK, "application/json", e->value,
                                       e->length)
                               : text(connection, MHD_HTTP_NOT_FOUND, "metadata not found\n");
    pthread_rwlock_unlock(&table.lock);
    return result;
}

static enum MHD_Result on_put(struct MHD_Connection *connection, const char *key,
                              request_t *req)
{
    char *value = req->body ? req->body : calloc(1, 1);
    size_t length = req->length;
    req->body = NULL;
    uint64_t version = value ? table_put(key, value, length) : 0;
    if (version == 0)
        return text(connection, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    if (persist(version) != 0)
        return text(connection, MHD_HTTP_INTERNAL_SERVER_ERROR,
                    "stored, but not persisted: see the server's log\n");
    return text(connection, MHD_HTTP_OK, "metadata updated\n");
}

static enum MHD_Result on_delete(struct MHD_Connection *connection, const char *key)
{
    uint64_t version = table_delete(key);
    if (version == 0)
        return text(connection, MHD_HTTP_NOT_FOUND, "metadata not found\n");
    if (persist(version) != 0)
        return text(connection, MHD_HTTP_INTERNAL_SERVER_ERROR,
                    "deleted, but not persisted: see the server's log\n");
    return text(connection, MHD_HTTP_OK, "metadata deleted\n");
}

static int is_method(const char *method, const char *want)
{
    return strcmp(method, want) == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *connection, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **state)
{
    request_t *req = *state;
    int writes = is_method(method, "PUT") || is_method(method, "POST");
    if (req == NULL) {
        /* Headers only so far. */
        req = calloc(1, sizeof(*req));
        if (req == NULL)
            return MHD_NO;
        *state = req;
        const char *declared = MHD_lookup_connection_value(connection, MHD_HEADER_KIND,
                                                           MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (writes && declared != NULL && strtoull(declared, NULL, 10) > max_body) {
            /* Refused before reading it; MHD closes the connection after. */
            req->too_large = 1;
            return too_large(connection);
        }
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (req->too_large || !writes)
            return MHD_YES; /* discarded */
        if (req->length + n > max_body) {
            req->too_large = 1; /* chunked, with no length announced */
            free(req->body);
            req->body = NULL;
            return MHD_YES;
        }
        if (req->length + n + 1 > req->capacity) {
            size_t capacity = req->capacity ? req->capacity : 4096;
            while (capacity < req->length + n + 1)
                capacity *= 2;
            char *body = realloc(req->body, capacity);
            if (body == NULL)
                return MHD_NO;
            req->body = body;
            req->capacity = capacity;
        }
        memcpy(req->body + req->length, upload_data, n);
        req->length += n;
        req->body[req->length] = '\0';
        return MHD_YES;
    }
    if (req->too_large)
        return too_large(connection);

    if (strcmp(url, "/health") == 0) {
        if (is_method(method, "GET") || is_method(method, "HEAD"))
            return on_health(connection);
        return text(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "GET only\n");
    }
    if (strcmp(url, "/metadata") != 0)
        return text(connection, MHD_HTTP_NOT_FOUND, "no such path: use /metadata?key=K\n");
    const char *key = MHD_lookup_connection_value(connection, MHD_GET_ARGUMENT_KIND, "key");
    if (key == NULL || *key == '\0')
        return text(connection, MHD_HTTP_BAD_REQUEST, "missing ?key=K\n");
    if (is_method(method, "GET") || is_method(method, "HEAD")) {
        count_request(COUNT_GET);
        return on_get(connection, key);
    }
    if (writes) {
        count_request(COUNT_PUT);
        return on_put(connection, key, req);
    }
    if (is_method(method, "DELETE")) {
        count_request(COUNT_DELETE);
        return on_delete(connection, key);
    }
    count_request(COUNT_OTHER);
    return text(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "GET, PUT, POST or DELETE\n");
}

static void on_completed(void *cls, struct MHD_Connection *connection, void **state,
                         enum MHD_RequestTerminationCode code)
{
    request_t *req = *state;
    if (req != NULL) {
        free(req->body);
        free(req);
        *state = NULL;
    }
}

/* ---------------- main ---------------- */

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: ferry_metad [--listen=HOST:PORT] [--persist=FILE] [options]\n"
            "  --listen=HOST:PORT   address to serve (default 127.0.0.1:8080; port 0: any free\n"
            "                       port; [v6addr]:PORT for IPv6; 0.0.0.0 for every address)\n"
            "  --persist=FILE       keep the table in FILE: loaded at start, rewritten\n"
            "                       atomically before each change is acknowledged\n"
            "  --max-body=BYTES     largest value accepted (default 64m; k/m/g suffixes)\n"
            "  --threads=N          request threads (default 4)\n"
            "  --version            print the version\n"
            "Serves GET/PUT/DELETE /metadata?key=K (404 for a missing key) and GET /health.\n"
            "Prints \"ferry_metad: listening on HOST:PORT\" once ready; SIGTERM or SIGINT stops "
            "it.\n");
}

/* Bind and listen on "host:port" ("[v6]:port"); fills the text to print. */
static int open_listener(const char *listen_on, char *shown, size_t shown_len, int *family_p)
{
    char host[256];
    const char *port;
    if (listen_on[0] == '[') {
        const char *close = strchr(listen_on, ']');
        if (close == NULL || close[1] != ':' || (size_t)(close - listen_on) >= sizeof(host))
            return -1;
        snprintf(host, sizeof(host), "%.*s", (int)(close - listen_on - 1), listen_on + 1);
        port = close + 2;
    } else {
        const char *colon = strrchr(listen_on, ':');
        if (colon == NULL || (size_t)(colon - listen_on) >= sizeof(host))
            return -1;
        snprintf(host, sizeof(host), "%.*s", (int)(colon - listen_on), listen_on);
        port = colon + 1;
    }
    char *end;
    long number = strtol(port, &end, 10);
    if (*port == '\0' || *end != '\0' || number < 0 || number > 65535)
        return -1;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *list;
    int rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &list);
    if (rc != 0) {
        fprintf(stderr, "ferry_metad: %s: %s\n", listen_on, gai_strerror(rc));
        return -2;
    }
    int fd = -1;
    for (struct addrinfo *ai = list; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
            close(fd);
            fd = -1;
            continue;
        }
        *family_p = ai->ai_family;
    }
    freeaddrinfo(list);
    if (fd < 0) {
        fprintf(stderr, "ferry_metad: cannot listen on %s: %s\n", listen_on, strerror(errno));
        return -2;
    }
    struct sockaddr_storage addr;
    socklen_t len = sizeof(addr);
    char numeric[128] = "", service[16] = "";
    getsockname(fd, (struct sockaddr *)&addr, &len);
    getnameinfo((struct sockaddr *)&addr, len, numeric, sizeof(numeric), service,
                sizeof(service), NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(shown, shown_len, *family_p == AF_INET6 ? "[%s]:%s" : "%s:%s", numeric, service);
    return fd;
}

int main(int argc, char **argv)
{
    static const struct option options[] = {
        {"listen", required_argument, NULL, 'l'}, {"persist", required_argument, NULL, 'p'},
        {"max-body", required_argument, NULL, 'b'}, {"threads", required_argument, NULL, 't'},
        {"version", no_argument, NULL, 'v'},      {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *listen_on = "127.0.0.1:8080";
    unsigned threads = 4;
    int opt;
    char *end;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (opt) {
        case 'l': listen_on = optarg; break;
        case 'p': persist_path = optarg; break;
        case 'b':
            if (ferry_tool_parse_size(optarg, &max_body) != 0) {
                fprintf(stderr, "ferry_metad: bad --max-body %s\n", optarg);
                return 2;
            }
            break;
        case 't':
            threads = (unsigned)strtoul(optarg, &end, 10);
            if (*end != '\0' || threads == 0 || threads > 256) {
                fprintf(stderr, "ferry_metad: --threads is 1..256\n");
                return 2;
            }
            break;
        case 'v': printf("ferry_metad %s\n", PACKAGE_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ferry_metad: unexpected argument %s\n", argv[optind]);
        return 2;
    }
    if (table_init() != 0 || (persist_path != NULL && load_file() != 0))
        return 1;

    char shown[200];
    int family = AF_INET;
    int fd = open_listener(listen_on, shown, sizeof(shown), &family);
    if (fd == -1) {
        fprintf(stderr, "ferry_metad: --listen=%s is not HOST:PORT\n", listen_on);
        return 2;
    }
    if (fd < 0)
        return 1;

    /* Every thread, MHD's included, inherits this mask: only sigwait below
     * sees SIGTERM and SIGINT. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    size_t loaded = table.count; /* before MHD's threads may change it */
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG |
                     (family == AF_INET6 ? MHD_USE_IPv6 : 0);
    struct MHD_Daemon *daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, NULL, MHD_OPTION_LISTEN_SOCKET, fd,
        MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_END);
    if (daemon == NULL) {
        fprintf(stderr, "ferry_metad: libmicrohttpd does not start on %s\n", shown);
        close(fd);
        return 1;
    }
    printf("ferry_metad: listening on %s\n", shown);
    fflush(stdout);
    if (persist_path != NULL)
        fprintf(stderr, "ferry_metad: %zu key(s) from %s\n", loaded, persist_path);

    int sig = 0;
    while (sigwait(&stop_signals, &sig) != 0)
        ;
    MHD_stop_daemon(daemon); /* closes the listening socket too */
    /* Every acknowledged change is on disk already; this catches nothing but
     * keeps the file's version current. */
    int rc = persist(table.version);
    fprintf(stderr, "ferry_metad: stopped (%s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    table_fini();
    return rc == 0 ? 0 : 1;
}
