/*
 * An MPI job for test_mpi, started by mpirun or srun --mpi=pmix.  MPI is used
 * for barriers and to share buffer addresses; segments are found through the
 * launcher's PMIx store (the engine picks it by itself) and every byte moves
 * through Ferry.  Each rank prints "rank R: OK" when all its checks passed.
 *
 *   ferry_test_mpi alltoall [SLOT]  every rank WRITEs a pattern into a slot of
 *                                   every other rank's segment ("rank:N") and
 *                                   READs one back; each checks what it got
 *   ferry_test_mpi late             a buffer registered after startup is
 *                                   reached through an already open segment;
 *                                   a second engine is opened by its name
 *   ferry_test_mpi nolauncher       (no launcher) FERRY_METADATA=pmix must
 *                                   fail engine creation cleanly
 */
#include <ferry/ferry.h>
#include <mpi.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_pattern.h"

static int rank, size;

#define CHECK(cond, ...)                                                                      \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__);                    \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fprintf(stderr, "\n");                                                            \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                     \
        }                                                                                     \
    } while (0)

#define CHECK_OK(call)                                                                        \
    do {                                                                                      \
        ferry_status_t s_ = (call);                                                           \
        CHECK(s_ == FERRY_OK, "%s: %s", #call, ferry_status_string(s_));                      \
    } while (0)

/* The seed of the bytes rank `from` writes into rank `to`'s slot `from`. */
static unsigned seed_of(int from, int to)
{
    return (unsigned)(from * 1000 + to + 1);
}

static void transfer(ferry_engine_h engine, ferry_opcode_t op, void *local, ferry_segment_h seg,
                     uint64_t remote, size_t length)
{
    ferry_batch_h batch;
    CHECK_OK(ferry_batch_create(engine, 1, &batch));
    ferry_request_t req = {.opcode = op, .local = local, .target = seg, .target_offset = remote,
                           .length = length};
    CHECK_OK(ferry_batch_submit(batch, &req, 1));
    CHECK_OK(ferry_batch_wait(batch, 60000));
    CHECK_OK(ferry_batch_destroy(batch));
}

static ferry_segment_h open_rank(ferry_engine_h engine, int peer)
{
    char name[32];
    ferry_segment_h seg;
    snprintf(name, sizeof(name), "rank:%d", peer);
    CHECK_OK(ferry_segment_open(engine, name, &seg));
    return seg;
}

static void *alloc_registered(ferry_engine_h engine, size_t length)
{
    void *buffer;
    CHECK_OK(ferry_alloc(engine, length, "cpu", FERRY_REG_REMOTE, &buffer));
    return buffer;
}

/* Everyone's address of their buffer. */
static uint64_t *share_address(void *buffer)
{
    uint64_t mine = (uint64_t)(uintptr_t)buffer, *all = calloc((size_t)size, sizeof(*all));
    CHECK(all != NULL, "out of memory");
    MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    return all;
}

static int alltoall(size_t slot)
{
    ferry_engine_h engine;
    CHECK_OK(ferry_engine_create(NULL, &engine));
    char expect[32];
    snprintf(expect, sizeof(expect), "rank:%d", rank);
    /* No FERRY_METADATA in a PMIx-launched job: pmix, and the rank's name. */
    if (getenv("FERRY_METADATA") == NULL)
        CHECK(strcmp(ferry_engine_segment_name(engine), expect) == 0,
              "segment name %s, expected %s", ferry_engine_segment_name(engine), expect);
    unsigned char *mine = alloc_registered(engine, slot * (size_t)size);
    /* My own slot holds my pattern, for peers to READ. */
    test_pattern_fill(mine + (size_t)rank * slot, slot, seed_of(rank, rank));
    uint64_t *addr = share_address(mine);
    MPI_Barrier(MPI_COMM_WORLD);

    unsigned char *local = malloc(slot);
    CHECK(local != NULL, "out of memory");
    for (int i = 1; i < size; i++) {
        int peer = (rank + i) % size; /* spread the load: not everyone on rank 0 */
        ferry_segment_h seg = open_rank(engine, peer);
        char *json = NULL;
        CHECK_OK(ferry_segment_describe(engine, seg, &json));
        char want[64];
        snprintf(want, sizeof(want), "\"0x%" PRIx64 "\"", addr[peer]);
        CHECK(strstr(json, want) != NULL, "rank %d's descriptor lacks its buffer %s", peer, want);
        free(json);
        test_pattern_fill(local, slot, seed_of(rank, peer));
        transfer(engine, FERRY_OP_WRITE, local, seg, addr[peer] + (size_t)rank * slot, slot);
        memset(local, 0, slot);
        transfer(engine, FERRY_OP_READ, local, seg, addr[peer] + (size_t)peer * slot, slot);
        size_t bad = test_pattern_check(local, slot, seed_of(peer, peer));
        CHECK(bad == SIZE_MAX, "READ from rank %d: byte %zu differs", peer, bad);
        CHECK_OK(ferry_segment_close(engine, seg));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (int from = 0; from < size; from++) {
        if (from == rank)
            continue;
        size_t bad = test_pattern_check(mine + (size_t)from * slot, slot, seed_of(from, rank));
        CHECK(bad == SIZE_MAX, "slot of rank %d: byte %zu differs", from, bad);
    }
    /* Nobody destroys an engine a peer still reads from. */
    MPI_Barrier(MPI_COMM_WORLD);
    free(local);
    free(addr);
    CHECK_OK(ferry_free(engine, mine));
    ferry_engine_destroy(engine);
    return 0;
}

static int late(void)
{
    const size_t length = 1 << 20;
    ferry_engine_h engine;
    CHECK_OK(ferry_engine_create(NULL, &engine));
    unsigned char *first = alloc_registered(engine, 4096);
    MPI_Barrier(MPI_COMM_WORLD);
    int peer = (rank + 1) % size;
    ferry_segment_h seg = open_rank(engine, peer); /* caches the peer's descriptor */
    MPI_Barrier(MPI_COMM_WORLD);

    /* Registered after the peer opened us: it finds it on its next transfer. */
    unsigned char *later = alloc_registered(engine, length);
    uint64_t *addr = share_address(later);
    MPI_Barrier(MPI_COMM_WORLD);
    unsigned char *local = malloc(length);
    CHECK(local != NULL, "out of memory");
    test_pattern_fill(local, length, seed_of(rank, peer));
    transfer(engine, FERRY_OP_WRITE, local, seg, addr[peer], length);
    MPI_Barrier(MPI_COMM_WORLD);
    int from = (rank + size - 1) % size;
    size_t bad = test_pattern_check(later, length, seed_of(from, rank));
    CHECK(bad == SIZE_MAX, "late buffer: byte %zu differs", bad);
    CHECK_OK(ferry_segment_close(engine, seg));

    /* A second engine per process, named: peers open it by that name. */
    char name[64];
    snprintf(name, sizeof(name), "named-%d", rank);
    ferry_config_t config = {.field_mask = FERRY_CONFIG_FIELD_NAME, .name = name};
    ferry_engine_h named;
    CHECK_OK(ferry_engine_create(&config, &named));
    unsigned char *area = alloc_registered(named, 4096);
    uint64_t *area_addr = share_address(area);
    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(name, sizeof(name), "named-%d", peer);
    CHECK_OK(ferry_segment_open(engine, name, &seg));
    test_pattern_fill(local, 4096, seed_of(rank, peer) + 7);
    transfer(engine, FERRY_OP_WRITE, local, seg, area_addr[peer], 4096);
    CHECK_OK(ferry_segment_close(engine, seg));
    /* "rank:N" is still the first engine's segment; past the job: not found. */
    seg = open_rank(engine, peer);
    char *json = NULL;
    CHECK_OK(ferry_segment_describe(engine, seg, &json));
    snprintf(name, sizeof(name), "\"name\":\"rank:%d\"", peer);
    CHECK(strstr(json, name) != NULL, "rank:%d is %s", peer, json);
    free(json);
    CHECK_OK(ferry_segment_close(engine, seg));
    snprintf(name, sizeof(name), "rank:%d", size);
    ferry_status_t status = ferry_segment_open(engine, name, &seg);
    CHECK(status == FERRY_ERR_SEGMENT_NOT_FOUND, "%s: %s", name, ferry_status_string(status));
    /* Another rank's name is refused, with the engine. */
    ferry_engine_h impostor;
    snprintf(name, sizeof(name), "rank:%d", peer);
    config.name = name;
    status = ferry_engine_create(&config, &impostor);
    CHECK(status == FERRY_ERR_INVALID_PARAM, "an engine named %s on rank %d: %s", name, rank,
          ferry_status_string(status));
    MPI_Barrier(MPI_COMM_WORLD);
    bad = test_pattern_check(area, 4096, seed_of(from, rank) + 7);
    CHECK(bad == SIZE_MAX, "named engine: byte %zu differs", bad);
    MPI_Barrier(MPI_COMM_WORLD);

    free(local);
    free(addr);
    free(area_addr);
    ferry_engine_destroy(named);
    CHECK_OK(ferry_free(engine, later));
    CHECK_OK(ferry_free(engine, first));
    ferry_engine_destroy(engine);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "nolauncher") == 0) {
        ferry_config_t config = {.field_mask = FERRY_CONFIG_FIELD_METADATA, .metadata = "pmix"};
        ferry_engine_h engine;
        ferry_status_t status = ferry_engine_create(&config, &engine);
        printf("status %s\n", ferry_status_string(status));
        return status == FERRY_ERR_METADATA ? 0 : 1;
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int rc = 2;
    if (strcmp(mode, "alltoall") == 0)
        rc = alltoall(argc > 2 ? strtoul(argv[2], NULL, 0) : 65536);
    else if (strcmp(mode, "late") == 0)
        rc = late();
    else if (rank == 0)
        fprintf(stderr, "usage: ferry_test_mpi alltoall [SLOT] | late | nolauncher\n");
    if (rc == 0)
        printf("rank %d: OK\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return rc;
}
