/*
 * A peer process for multi-process tests.  It starts an engine (settings
 * from FERRY_* variables), allocates an arena, prints
 *   READY <segment name> <arena address hex> <arena size>
 * and then answers one line per command read from stdin:
 *   reg OFF LEN [r|w|rw]  unreg OFF       fill OFF LEN SEED   check OFF LEN SEED
 *   sum OFF LEN           notify MS       quit
 *   notifycheck MS OFF LEN SEED (replies POLLING, then on the notify's arrival
 *     checks the bytes at that moment: NOTIFY <from> <text> OK or BAD <index>)
 *   alloc LEN [LOCATION] (ferry_alloc, "cpu" by default; replies ALLOC <hex address>)
 *   free 0xADDRESS
 *   afill 0xADDRESS LEN SEED   acheck 0xADDRESS LEN SEED (absolute addresses, host or
 *     device memory: device memory is filled and checked through its vendor's copies)
 *   valloc LEN KIND:N (device memory from the vendor itself, not registered: replies
 *     ALLOC <hex address>)   vfree 0xADDRESS
 *   areg 0xADDRESS LEN [r|w|rw]   aunreg 0xADDRESS (absolute addresses, location "*")
 *   blob PATH (ferry_engine_export_blob written to the file PATH)
 * Offsets are relative to the arena.  Replies: OK, ERR <status>, BAD <index>,
 * SUM <hex>, NOTIFY <from> <text>, NONE, ALLOC <hex>.
 * FERRY_TEST_PEER_NETNS=NAME: the peer first joins network namespace NAME
 * (/run/netns/NAME, as `ip netns exec` would), so it is on another "host".
 */
#include <ferry/ferry.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/core/core.h"
#include "../src/util/tsan_annotate.h"
#include "netns_pair.h"
#include "test_pattern.h"

/* The first index in [0, length) where p lacks the pattern, SIZE_MAX if
 * none: the end of every MiB first (the last bytes of a transfer arrive
 * last), so bytes still on their way are seen before they can arrive. */
static size_t late_bytes(const unsigned char *p, size_t length, unsigned seed)
{
    const size_t step = (size_t)1 << 20, tail = 4096;
    for (size_t end = length; end > 0; end = end > step ? end - step : 0) {
        for (size_t i = end > tail ? end - tail : 0; i < end; i++)
            if (p[i] != test_pattern_byte(i, seed))
                return i;
    }
    return test_pattern_check(p, length, seed);
}

/* Poll (without sleeping) for one notify for up to ms; the moment it is
 * here, are the bytes too? */
static void notify_check(ferry_engine_h engine, unsigned long long ms, const unsigned char *p,
                         size_t length, unsigned seed)
{
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    ferry_notify_t msg;
    size_t count = 0;
    for (;;) {
        ferry_notify_recv(engine, &msg, 1, &count);
        if (count)
            break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((unsigned long long)((now.tv_sec - start.tv_sec) * 1000 +
                                 (now.tv_nsec - start.tv_nsec) / 1000000) > ms)
            break;
    }
    size_t bad = count ? late_bytes(p, length, seed) : SIZE_MAX;
    if (count == 0)
        printf("NONE\n");
    else if (bad == SIZE_MAX)
        printf("NOTIFY %s %.*s OK\n", msg.from, (int)msg.length, (char *)msg.msg);
    else
        printf("NOTIFY %s %.*s BAD %zu\n", msg.from, (int)msg.length, (char *)msg.msg, bad);
    fflush(stdout);
}

/* The peer's engine, whose vendors say what memory a pointer is. */
static ferry_engine_h the_engine;

/* The vendor whose device memory p is, NULL for host memory. */
static const ferry_accel_ops_t *device_of(const void *p)
{
    ferry_accel_range_t range;
    return ferry_engine_accel_query(ferry_engine_lookup(the_engine), p, &range);
}

/* What fill, check and sum do, on host memory or (through a host copy)
 * device memory, which the CPU must not touch. */
enum mem_op { MEM_FILL, MEM_CHECK, MEM_SUM, MEM_ZERO };

static uint64_t mem_do_seen(enum mem_op op, unsigned char *p, size_t length, unsigned seed);

static uint64_t mem_do(enum mem_op op, unsigned char *p, size_t length, unsigned seed)
{
    /* The whole of it unseen by ThreadSanitizer, the vendor's copies too
     * (see the arena's comment in main). */
    FERRY_TSAN_IGNORE_BEGIN();
    uint64_t result = mem_do_seen(op, p, length, seed);
    FERRY_TSAN_IGNORE_END();
    return result;
}

static uint64_t mem_do_seen(enum mem_op op, unsigned char *p, size_t length, unsigned seed)
{
    const ferry_accel_ops_t *device = device_of(p);
    unsigned char *host = p;
    if (device != NULL && (host = malloc(length)) == NULL)
        return SIZE_MAX - 1;
    if (device != NULL && op != MEM_FILL && op != MEM_ZERO &&
        device->copy(host, p, length) != FERRY_OK) {
        free(host);
        return SIZE_MAX - 1;
    }
    uint64_t result = 0;
    if (op == MEM_FILL)
        test_pattern_fill(host, length, seed);
    else if (op == MEM_ZERO)
        memset(host, 0, length);
    else if (op == MEM_CHECK)
        result = test_pattern_check(host, length, seed);
    else
        result = test_checksum(host, length);
    if (device != NULL && (op == MEM_FILL || op == MEM_ZERO) &&
        device->copy(p, host, length) != FERRY_OK)
        result = SIZE_MAX - 1;
    if (device != NULL)
        free(host);
    return result;
}

/* The engine's segment blob into the file at path. */
static ferry_status_t write_blob(ferry_engine_h engine, const char *path)
{
    size_t length = 0;
    ferry_status_t status = ferry_engine_export_blob(engine, NULL, 0, &length);
    unsigned char *blob = status == FERRY_OK ? malloc(length) : NULL;
    if (blob == NULL)
        return status != FERRY_OK ? status : FERRY_ERR_NO_MEMORY;
    status = ferry_engine_export_blob(engine, blob, length, &length);
    FILE *file = status == FERRY_OK ? fopen(path, "wb") : NULL;
    if (status == FERRY_OK && file == NULL)
        status = FERRY_ERR_IO;
    if (file != NULL) {
        size_t wrote = fwrite(blob, 1, length, file);
        if (fclose(file) != 0 || wrote != length)
            status = FERRY_ERR_IO;
    }
    free(blob);
    return status;
}

int main(int argc, char **argv)
{
    size_t arena_size = argc > 1 ? strtoull(argv[1], NULL, 0) : ((size_t)80 << 20);
    /* FERRY_TEST_PEER_UNDUMPABLE=1: a process others may not attach to
     * without CAP_SYS_PTRACE (cross-memory attach is refused). */
    const char *undumpable = getenv("FERRY_TEST_PEER_UNDUMPABLE");
    if (undumpable != NULL && strcmp(undumpable, "1") == 0)
        prctl(PR_SET_DUMPABLE, 0);
    const char *netns = getenv("FERRY_TEST_PEER_NETNS");
    if (netns != NULL && *netns != '\0' && netns_enter(netns) != 0) {
        printf("FAILED netns %s: %s\n", netns, strerror(errno));
        return 1;
    }
    /* A heap arena comes before the engine: where it lands then does not
     * depend on what the engine's modules map (a GPU runtime looking for a
     * device), so a restarted peer without address randomization has it
     * where its predecessor had it (test_faults). */
    const char *alloc = getenv("FERRY_TEST_PEER_ALLOC");
    int allocated = alloc != NULL && *alloc != '\0';
    unsigned char *arena = NULL;
    if (!allocated && posix_memalign((void **)&arena, 4096, arena_size) != 0)
        return 1;
    ferry_engine_h engine;
    ferry_status_t status = ferry_engine_create(NULL, &engine);
    if (status != FERRY_OK) {
        printf("FAILED %s\n", ferry_status_string(status));
        return 1;
    }
    the_engine = engine;
    /* FERRY_TEST_PEER_ALLOC=1 (or a location: "cxl"): the arena is one
     * ferry_alloc buffer ("cpu" for 1), registered whole (reg/unreg inside it
     * are refused as overlaps). */
    if (allocated) {
        const char *location = strcmp(alloc, "1") == 0 ? "cpu" : alloc;
        status = ferry_alloc(engine, arena_size, location, FERRY_REG_REMOTE, (void **)&arena);
        if (status != FERRY_OK) {
            printf("FAILED %s\n", ferry_status_string(status));
            return 1;
        }
    }
    /* The arena is written and read by the test's process one-sided (and by
     * our transports' threads serving it) while registered; the commands on
     * stdin order those copies with our fill, check and sum, which
     * ThreadSanitizer cannot follow (util/tsan_annotate.h). */
    mem_do(MEM_ZERO, arena, arena_size, 0);
    printf("READY %s %" PRIxPTR " %zu\n", ferry_engine_segment_name(engine), (uintptr_t)arena,
           arena_size);
    fflush(stdout);

    char line[512];
    while (fgets(line, sizeof(line), stdin)) {
        char cmd[32] = "", mode[8] = "rw";
        unsigned long long a = 0, b = 0, c = 0;
        int n = sscanf(line, "%31s %lli %lli %lli", cmd, (long long *)&a, (long long *)&b,
                       (long long *)&c);
        if (n >= 1 && strcmp(cmd, "reg") == 0) {
            sscanf(line, "%*s %*s %*s %7s", mode);
            unsigned flags = (strchr(mode, 'r') ? FERRY_REG_REMOTE_READ : 0) |
                             (strchr(mode, 'w') ? FERRY_REG_REMOTE_WRITE : 0);
            status = ferry_register(engine, arena + a, (size_t)b, "*", flags);
        } else if (strcmp(cmd, "unreg") == 0) {
            status = ferry_unregister(engine, arena + a);
        } else if (strcmp(cmd, "alloc") == 0 && b == 0) {
            void *mem = NULL;
            char location[32] = "cpu";
            sscanf(line, "%*s %*s %31s", location);
            status = ferry_alloc(engine, (size_t)a, location, FERRY_REG_REMOTE, &mem);
            if (status == FERRY_OK) {
                printf("ALLOC %" PRIxPTR "\n", (uintptr_t)mem);
                fflush(stdout);
                continue;
            }
        } else if (strcmp(cmd, "valloc") == 0 && b == 0) {
            void *mem = NULL;
            char location[32] = "";
            sscanf(line, "%*s %*s %31s", location);
            const ferry_accel_ops_t *vendor = NULL;
            char *colon = strchr(location, ':');
            if (colon != NULL) {
                *colon = '\0';
                vendor = ferry_accel_find(getenv("FERRY_MODULE_DIR"), location);
            }
            status = vendor == NULL ? FERRY_ERR_UNSUPPORTED
                                    : vendor->mem_alloc(atoi(colon + 1), (size_t)a, &mem);
            if (status == FERRY_OK) {
                printf("ALLOC %" PRIxPTR "\n", (uintptr_t)mem);
                fflush(stdout);
                continue;
            }
        } else if (strcmp(cmd, "vfree") == 0) {
            const ferry_accel_ops_t *vendor = device_of((void *)(uintptr_t)a);
            status = vendor == NULL ? FERRY_ERR_INVALID_PARAM : FERRY_OK;
            if (vendor != NULL)
                vendor->mem_free((void *)(uintptr_t)a);
        } else if (strcmp(cmd, "areg") == 0 && n >= 3) {
            sscanf(line, "%*s %*s %*s %7s", mode);
            unsigned flags = (strchr(mode, 'r') ? FERRY_REG_REMOTE_READ : 0) |
                             (strchr(mode, 'w') ? FERRY_REG_REMOTE_WRITE : 0);
            status = ferry_register(engine, (void *)(uintptr_t)a, (size_t)b, "*", flags);
        } else if (strcmp(cmd, "sreg") == 0 && n == 4) {
            /* sreg OFFSET LENGTH OPTIONS PATH [r|w|rw]: a storage buffer */
            char path[300] = "";
            sscanf(line, "%*s %*s %*s %*s %299s %7s", path, mode);
            ferry_storage_region_t region = {
                .field_mask = FERRY_STORAGE_FIELD_OFFSET | FERRY_STORAGE_FIELD_LENGTH |
                              FERRY_STORAGE_FIELD_OPTIONS | FERRY_STORAGE_FIELD_FLAGS,
                .path = path, .offset = a, .length = b, .options = (unsigned)c,
                .flags = (strchr(mode, 'r') ? FERRY_REG_REMOTE_READ : 0) |
                         (strchr(mode, 'w') ? FERRY_REG_REMOTE_WRITE : 0)};
            void *addr = NULL;
            status = ferry_register_storage(engine, &region, &addr);
            if (status == FERRY_OK) {
                printf("SREG %" PRIxPTR "\n", (uintptr_t)addr);
                fflush(stdout);
                continue;
            }
        } else if (strcmp(cmd, "aunreg") == 0) {
            status = ferry_unregister(engine, (void *)(uintptr_t)a);
        } else if (strcmp(cmd, "free") == 0) {
            status = ferry_free(engine, (void *)(uintptr_t)a);
        } else if ((strcmp(cmd, "fill") == 0 && a + b <= arena_size) ||
                   (strcmp(cmd, "afill") == 0 && n == 4)) {
            unsigned char *at = cmd[0] == 'a' ? (unsigned char *)(uintptr_t)a : arena + a;
            status = mem_do(MEM_FILL, at, (size_t)b, (unsigned)c) == 0 ? FERRY_OK : FERRY_ERR_IO;
        } else if ((strcmp(cmd, "check") == 0 && a + b <= arena_size) ||
                   (strcmp(cmd, "acheck") == 0 && n == 4)) {
            unsigned char *at = cmd[0] == 'a' ? (unsigned char *)(uintptr_t)a : arena + a;
            uint64_t bad = mem_do(MEM_CHECK, at, (size_t)b, (unsigned)c);
            if (bad != SIZE_MAX) {
                printf("BAD %llu\n", (unsigned long long)bad);
                fflush(stdout);
                continue;
            }
            status = FERRY_OK;
        } else if (strcmp(cmd, "sum") == 0 && a + b <= arena_size) {
            uint64_t sum = mem_do(MEM_SUM, arena + a, (size_t)b, 0);
            printf("SUM %016" PRIx64 "\n", sum);
            fflush(stdout);
            continue;
        } else if (strcmp(cmd, "notify") == 0) {
            ferry_notify_t msg;
            size_t count = 0;
            for (unsigned long long waited = 0; waited <= a && count == 0; waited += 10) {
                ferry_notify_recv(engine, &msg, 1, &count);
                if (count == 0)
                    usleep(10000);
            }
            if (count)
                printf("NOTIFY %s %.*s\n", msg.from, (int)msg.length, (char *)msg.msg);
            else
                printf("NONE\n");
            fflush(stdout);
            continue;
        } else if (strcmp(cmd, "notifycheck") == 0 && n == 4 && b + c <= arena_size) {
            unsigned seed = 0;
            sscanf(line, "%*s %*s %*s %*s %u", &seed);
            printf("POLLING\n");
            fflush(stdout);
            notify_check(engine, a, arena + b, (size_t)c, seed);
            continue;
        } else if (strcmp(cmd, "blob") == 0) {
            char path[400] = "";
            sscanf(line, "%*s %399s", path);
            status = write_blob(engine, path);
        } else if (strcmp(cmd, "quit") == 0) {
            break;
        } else {
            status = FERRY_ERR_INVALID_PARAM;
        }
        if (status == FERRY_OK)
            printf("OK\n");
        else
            printf("ERR %d %s\n", (int)status, ferry_status_string(status));
        fflush(stdout);
    }
    if (allocated)
        ferry_free(engine, arena);
    ferry_engine_destroy(engine);
    if (!allocated)
        free(arena);
    return 0;
}
