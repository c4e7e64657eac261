/*
 * Metadata servers for tests: etcd, redis-server and ferry_metad started on
 * free loopback ports with their data in a fresh temporary directory,
 * stopped by PID.  A server dies with the test process that started it.
 * Also tiny raw clients (HTTP/1.1 and RESP) so tests can poke the servers
 * without the code under test.
 */
#ifndef FERRY_TEST_SERVICE_PROCESS_H
#define FERRY_TEST_SERVICE_PROCESS_H

#include <stddef.h>
#include <sys/types.h>

typedef enum service_kind {
    SERVICE_ETCD,
    SERVICE_REDIS,
    SERVICE_METAD,
} service_kind_t;

typedef struct service {
    service_kind_t kind;
    pid_t pid;
    int port;            /* client port */
    int peer_port;       /* etcd's raft port */
    int metrics_port;    /* etcd's plain-http /health, also when clients use TLS */
    char dir[256];       /* temporary data directory, removed by service_cleanup */
    char uri[512];       /* FERRY_METADATA for it */
    char extra[8][256];  /* extra command-line arguments, kept for restarts */
    int n_extra;
    int tls;             /* etcd serves https (extra holds the cert options) */
} service_t;

/* Whether modules/ferry_NAME.so is in FERRY_MODULE_DIR (built). */
int service_module_built(const char *name);
/* NULL when the server (and the store's module) is available, else why not. */
const char *service_missing(service_kind_t kind);
/* Start it; extra: NULL-terminated arguments appended to its command line.
 * 0 once it answers, -1 otherwise. */
int service_start(service_t *svc, service_kind_t kind, const char *const *extra);
/* ferry_metad, started for a test that serves forged descriptors from it,
 * with FERRY_METADATA pointing at it; skips the test when ferry_metad or
 * the http module is not built. */
void service_start_forgery_store(service_t *svc);
/* Kill it by PID with sig and reap it; returns its exit status (or
 * 128 + signal). */
int service_stop(service_t *svc, int sig);
/* Start it again on the same port; keep_data 0 starts from an empty data
 * directory (a server that lost its data). */
int service_restart(service_t *svc, int keep_data);
/* Stop it if running and remove its directory. */
void service_cleanup(service_t *svc);
/* Every server still running and every directory still there: for a
 * suite's fini, after a test that failed half-way. */
void service_cleanup_all(void);
/* A free loopback TCP port. */
int service_free_port(void);

/* One HTTP/1.1 request to 127.0.0.1:port; returns the status code (-1: no
 * answer).  The body (de-chunked) goes to out (NUL-terminated), its length
 * to *length_p.  headers: extra header lines ending in \r\n, or NULL. */
int http_call(int port, const char *method, const char *target, const char *headers,
              const void *body, size_t length, char *out, size_t out_size, size_t *length_p);
/* One redis command; returns the reply's type byte ('+', '-', ':', '$', '*')
 * or -1.  A bulk reply's bytes go to out (length to *length_p; -1 for nil). */
int redis_call(int port, int argc, const char *const *argv, const size_t *lengths, char *out,
               size_t out_size, long *length_p);
/* base64 of data (for etcd's JSON gateway), NUL-terminated in out. */
void base64_encode(const void *data, size_t length, char *out);

#endif
