/*
 * The tcp transport plugin: settings, the transport object's life cycle and
 * the calls that need no network (keys, reachability, slice size).
 * Always built into libferry; the fallback every other transport beats.
 */
#include "tcp.h"

#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const ferry_setting_t tcp_settings[] = {
    {"LISTEN_HOST", "", "address the tcp listener binds (empty: the engine's advertised host)",
     offsetof(ferry_tcp_settings_t, listen_host), FERRY_SETTING_STRING},
    {"SLICE_SIZE", "1m", "requests are cut into slices of this size (at least 4k)",
     offsetof(ferry_tcp_settings_t, slice_size), FERRY_SETTING_SIZE},
    {"CONNECTIONS", "0", "most sockets per peer (0..64; 0: twice IO_THREADS); a peer starts "
     "with one and opens another while more than 2 slices per socket are outstanding",
     offsetof(ferry_tcp_settings_t, connections), FERRY_SETTING_UINT},
    {"IO_THREADS", "0", "I/O threads serving every tcp socket of the engine (0..256; 0: half "
     "the CPUs the process may run on, 2..8)",
     offsetof(ferry_tcp_settings_t, io_threads), FERRY_SETTING_UINT},
    {"TIMEOUT", "5000", "a peer that moves no byte this long while requests are outstanding "
     "fails; the listener closes a connection whose request header took longer",
     offsetof(ferry_tcp_settings_t, timeout_ms), FERRY_SETTING_TIME_MS},
    {"CONNECT_TIMEOUT", "2000", "limit for connecting and the HELLO exchange",
     offsetof(ferry_tcp_settings_t, connect_timeout_ms), FERRY_SETTING_TIME_MS},
    {"MAX_SLICE", "64m", "largest slice this engine accepts from a peer (at least SLICE_SIZE)",
     offsetof(ferry_tcp_settings_t, max_slice), FERRY_SETTING_SIZE},
    {"SOCKBUF", "0", "socket send/receive buffer size (0: kernel autotuning)",
     offsetof(ferry_tcp_settings_t, sockbuf), FERRY_SETTING_SIZE},
    {"IDLE_TIMEOUT", "60s", "the listener closes a connection with no request this long (0: "
     "never); initiators reconnect, dropping a connection idle for half the target's",
     offsetof(ferry_tcp_settings_t, idle_timeout_ms), FERRY_SETTING_TIME_MS},
    {"MAX_CONNS", "1024", "connections the listener keeps; past it a new one "
     "evicts the one idle longest, or is closed when none is idle",
     offsetof(ferry_tcp_settings_t, max_conns), FERRY_SETTING_UINT},
    {"MAX_CONNS_PER_SOURCE", "256", "connections the listener keeps from one address; past it a "
     "new one evicts that address's connection idle longest",
     offsetof(ferry_tcp_settings_t, max_conns_per_source), FERRY_SETTING_UINT},
    {"STORAGE_STAGED", "no", "yes: the target serves storage buffers through one bounce "
     "buffer per request, read or received whole, then sent or written (no: sent from and "
     "received into a shared mapping of the file, above 64g by sendfile and splice; DIRECT "
     "and SHARED storage is always staged)",
     offsetof(ferry_tcp_settings_t, storage_staged), FERRY_SETTING_BOOL},
};

void ferry_tcp_tune_socket(const ferry_tcp_t *tcp, int fd)
{
    if (tcp->settings.sockbuf == 0)
        return;
    int size = (int)tcp->settings.sockbuf;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size)) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size)) != 0)
        ferry_warn("tcp: cannot set socket buffers to %d bytes: %s", size, strerror(errno));
}

static ferry_status_t check_settings(const ferry_tcp_settings_t *s)
{
    if (s->slice_size < 4096) {
        ferry_error("FERRY_TCP_SLICE_SIZE=%zu is below the minimum of 4k", s->slice_size);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (s->max_slice < s->slice_size) {
        ferry_error("FERRY_TCP_MAX_SLICE=%zu is below FERRY_TCP_SLICE_SIZE=%zu", s->max_slice,
                    s->slice_size);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (s->connections > FERRY_TCP_MAX_PEER_CONNS) {
        ferry_error("FERRY_TCP_CONNECTIONS=%u is not within 0..%d", s->connections,
                    FERRY_TCP_MAX_PEER_CONNS);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (s->io_threads > 256) {
        ferry_error("FERRY_TCP_IO_THREADS=%u is not within 0..256", s->io_threads);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (s->sockbuf > INT_MAX) {
        ferry_error("FERRY_TCP_SOCKBUF=%zu is too large", s->sockbuf);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (s->max_conns < 1 || s->max_conns > 65536) {
        ferry_error("FERRY_TCP_MAX_CONNS=%u is not within 1..65536", s->max_conns);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (s->max_conns_per_source < 1) {
        ferry_error("FERRY_TCP_MAX_CONNS_PER_SOURCE must be at least 1");
        return FERRY_ERR_INVALID_PARAM;
    }
    return FERRY_OK;
}

static int is_wildcard(const char *host)
{
    return strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0;
}

/* The engine's stop: no request is served or in flight after it, and no
 * thread of ours is left to call the engine (each step does nothing the
 * second time, when destroy repeats it).  The order is tcp.h's. */
static void tcp_stop(void *ctx)
{
    ferry_tcp_t *tcp = ctx;
    ferry_tcp_target_stop(tcp);
    ferry_tcp_peers_destroy(tcp);
    ferry_tcp_workers_stop(tcp);
}

static void tcp_destroy(void *ctx)
{
    ferry_tcp_t *tcp = ctx;
    if (tcp == NULL)
        return;
    tcp_stop(tcp);
    ferry_tcp_workers_free(tcp);
    pthread_cond_destroy(&tcp->settled);
    pthread_mutex_destroy(&tcp->lock);
    pthread_mutex_destroy(&tcp->target_lock);
    ferry_settings_release(tcp_settings, FERRY_ARRAY_SIZE(tcp_settings), &tcp->settings);
    free(tcp->address);
    free(tcp);
}

static ferry_status_t tcp_create(const ferry_transport_services_t *svc, void **ctx_p)
{
    if (svc == NULL || svc->size < offsetof(ferry_transport_services_t, peer_seen) ||
        svc->access_acquire == NULL || svc->access_release == NULL || svc->slice_done == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_tcp_t *tcp = calloc(1, sizeof(*tcp));
    if (tcp == NULL)
        return FERRY_ERR_NO_MEMORY;
    memcpy(&tcp->svc, svc, FERRY_MIN(svc->size, sizeof(tcp->svc)));
    tcp->svc.size = sizeof(tcp->svc);
    tcp->listen_fd = -1;
    pthread_mutex_init(&tcp->lock, NULL);
    pthread_mutex_init(&tcp->target_lock, NULL);
    pthread_cond_init(&tcp->settled, NULL);

    ferry_status_t status =
        ferry_settings_read("TCP", tcp_settings, FERRY_ARRAY_SIZE(tcp_settings), &tcp->settings);
    if (status != FERRY_OK)
        goto err_free;
    status = check_settings(&tcp->settings);
    if (status != FERRY_OK)
        goto err_release_settings;
    tcp->n_workers = tcp->settings.io_threads ? tcp->settings.io_threads : ferry_tcp_auto_threads();
    tcp->max_peer_conns = tcp->settings.connections
                              ? tcp->settings.connections
                              : FERRY_MIN(2 * tcp->n_workers, (unsigned)FERRY_TCP_MAX_PEER_CONNS);
    status = ferry_tcp_workers_start(tcp);
    if (status != FERRY_OK)
        goto err_stop_workers;

    /* Bind where the engine says peers reach it unless told otherwise; a
     * wildcard bind still advertises a routable host. */
    char fallback[256];
    const char *advertise = svc->advertise_host;
    if (advertise == NULL || *advertise == '\0') {
        ferry_net_default_host(fallback, sizeof(fallback));
        advertise = fallback;
    }
    const char *host = *tcp->settings.listen_host ? tcp->settings.listen_host : advertise;
    int port;
    status = ferry_tcp_target_start(tcp, host, &port);
    if (status != FERRY_OK)
        goto err_stop_target;
    const char *shown = is_wildcard(host) ? advertise : host;
    tcp->address = strchr(shown, ':') ? ferry_strdup_printf("[%s]:%d", shown, port)
                                      : ferry_strdup_printf("%s:%d", shown, port);
    if (tcp->address == NULL) {
        tcp_destroy(tcp);
        return FERRY_ERR_NO_MEMORY;
    }
    ferry_debug("tcp: listening at %s (slices %zu, %u I/O threads, up to %u connections per "
                "peer)", tcp->address, tcp->settings.slice_size, tcp->n_workers,
                tcp->max_peer_conns);
    *ctx_p = tcp;
    return FERRY_OK;

err_stop_target:
    ferry_tcp_target_stop(tcp);
err_stop_workers:
    ferry_tcp_workers_stop(tcp);
    ferry_tcp_workers_free(tcp);
err_release_settings:
    ferry_settings_release(tcp_settings, FERRY_ARRAY_SIZE(tcp_settings), &tcp->settings);
err_free:
    pthread_cond_destroy(&tcp->settled);
    pthread_mutex_destroy(&tcp->lock);
    pthread_mutex_destroy(&tcp->target_lock);
    free(tcp);
    return status;
}

static ferry_status_t tcp_address(void *ctx, char **endpoint_p)
{
    ferry_tcp_t *tcp = ctx;
    *endpoint_p = strdup(tcp->address);
    return *endpoint_p ? FERRY_OK : FERRY_ERR_NO_MEMORY;
}

/* TCP moves bytes with plain syscalls: no keys, no pinning.  Whether a peer
 * may touch a range is decided per request by access_acquire. */
static ferry_status_t tcp_mem_register(void *ctx, void *addr, size_t length, const char *location,
                                       char **key_p, void **memh_p)
{
    *key_p = strdup("");
    *memh_p = NULL;
    return *key_p ? FERRY_OK : FERRY_ERR_NO_MEMORY;
}

static void tcp_mem_deregister(void *ctx, void *memh)
{
}

/* Any memory the engine knows: device memory (an accelerator's that is
 * usable, the only kind the engine asks about) moves through the engine's
 * staging buffers on the connection's I/O thread (slice->local_device),
 * pipelined with the socket. */
static int tcp_local_memory(void *ctx, const char *location)
{
    (void)ctx;
    (void)location;
    return 1;
}

static int tcp_reaches(void *ctx, const ferry_peer_t *peer, const char *remote_key)
{
    return peer != NULL && peer->endpoint != NULL && *peer->endpoint != '\0';
}

static size_t tcp_slice_size(void *ctx)
{
    return ((ferry_tcp_t *)ctx)->settings.slice_size;
}

static void tcp_info(FILE *out)
{
    fprintf(out, "tcp: wire protocol version %d, built in\n", FERRY_TCP_VERSION);
}

static const ferry_transport_ops_t tcp_ops = {
    .size = sizeof(ferry_transport_ops_t),
    .create = tcp_create,
    .destroy = tcp_destroy,
    .address = tcp_address,
    .mem_register = tcp_mem_register,
    .mem_deregister = tcp_mem_deregister,
    .reaches = tcp_reaches,
    .submit = ferry_tcp_submit,
    .peer_forget = ferry_tcp_peer_forget,
    .slice_size = tcp_slice_size,
    .stop = tcp_stop,
    .local_memory = tcp_local_memory,
    .cancel = ferry_tcp_cancel,
};

static const ferry_plugin_t tcp_plugin = {
    .abi_version = FERRY_PLUGIN_ABI_VERSION,
    .kind = FERRY_PLUGIN_TRANSPORT,
    .name = "tcp",
    .description = "native TCP sockets; no staging copies, any host",
    .priority = 10,
    .flags = FERRY_TRANSPORT_SERVES_STORAGE,
    .settings = tcp_settings,
    .settings_count = FERRY_ARRAY_SIZE(tcp_settings),
    .settings_component = "TCP",
    .ops = &tcp_ops,
    .info = tcp_info,
};

const ferry_plugin_t *ferry_tcp_plugin(void)
{
    return &tcp_plugin;
}
