/*
 * The RPC listener under many connections (doc/scale.md): M idle
 * connections held open while C client threads make calls as p2p's
 * descriptor fetch does (connect, one request, one reply, close).  Prints
 * calls per second.  Built on demand (`make bench_rpc_listener`), linked
 * with the internal library, so it measures whichever rpc_server.c that
 * library holds.
 *
 *   bench_rpc_listener IDLE CLIENTS CALLS_PER_CLIENT
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/rpc/rpc.h"

static char endpoint[64];
static int calls_per_client;

static ferry_status_t echo(void *arg, int type, const void *payload, size_t length,
                           int *reply_type_p, void **reply_p, size_t *reply_length_p)
{
    *reply_p = malloc(length ? length : 1);
    if (*reply_p == NULL)
        return FERRY_ERR_NO_MEMORY;
    memcpy(*reply_p, payload, length);
    *reply_length_p = length;
    return FERRY_OK;
}

static void *client(void *arg)
{
    long failed = 0;
    for (int i = 0; i < calls_per_client; i++) {
        void *reply = NULL;
        failed += ferry_rpc_call(endpoint, FERRY_RPC_FETCH, "descriptor?", 11, 5000, 1 << 20,
                                 &reply, NULL) != FERRY_OK;
        free(reply);
    }
    return (void *)failed;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: bench_rpc_listener IDLE CLIENTS CALLS_PER_CLIENT\n");
        return 2;
    }
    int idle = atoi(argv[1]), clients = atoi(argv[2]);
    calls_per_client = atoi(argv[3]);
    ferry_rpc_server_limits_t limits = {.max_frame = 1 << 20, .timeout_ms = 5000,
                                        .idle_timeout_ms = 600000,
                                        .max_conns = (unsigned)idle + 1024,
                                        .max_conns_per_source = (unsigned)idle + 1024};
    ferry_rpc_server_t *server;
    int port;
    if (ferry_rpc_server_start("127.0.0.1", 0, &limits, echo, NULL, &server, &port) != FERRY_OK)
        return 1;
    snprintf(endpoint, sizeof(endpoint), "127.0.0.1:%d", port);
    int *fds = calloc((size_t)idle + 1, sizeof(*fds));
    for (int i = 0; i < idle; i++)
        if (ferry_net_connect(endpoint, 2000, &fds[i]) != FERRY_OK)
            return 1;
    usleep(200 * 1000); /* all accepted */
    pthread_t *threads = calloc((size_t)clients, sizeof(*threads));
    uint64_t start = ferry_time_us();
    for (int i = 0; i < clients; i++)
        pthread_create(&threads[i], NULL, client, NULL);
    long failed = 0;
    for (int i = 0; i < clients; i++) {
        void *result;
        pthread_join(threads[i], &result);
        failed += (long)result;
    }
    double seconds = (ferry_time_us() - start) / 1e6;
    printf("idle=%d clients=%d calls=%d failed=%ld calls_per_s=%.0f\n", idle, clients,
           clients * calls_per_client, failed, clients * calls_per_client / seconds);
    for (int i = 0; i < idle; i++)
        close(fds[i]);
    ferry_rpc_server_stop(server);
    free(fds);
    free(threads);
    return failed != 0;
}
