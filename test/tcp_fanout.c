/*
 * Threads, descriptors and memory of a process whose one engine writes to
 * many peers over tcp (issue 19): PEERS target engines and one initiator
 * engine in this process, the initiator opens every target's segment and
 * writes SIZE bytes to each.  Public API only, so the same source builds
 * against an older libferry for a before/after comparison
 * (contrib/bench-tcp-fanout.sh).
 * Usage: tcp_fanout [PEERS (default 100)] [SIZE (default 65536)]
 * Prints one line: RESULT peers=.. threads_before=.. threads_after=..
 *   fds_before=.. fds_after=.. rss_kib_before=.. rss_kib_after=.. seconds=..
 * ("before": every engine created and every segment opened; "after": one
 * write to each peer done, the connections idle and open).
 */
#include <ferry/ferry.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long count_entries(const char *path)
{
    DIR *dir = opendir(path);
    if (dir == NULL)
        return -1;
    long n = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(dir);
    return n;
}

static long rss_kib(void)
{
    FILE *file = fopen("/proc/self/statm", "r");
    long size = 0, resident = 0;
    if (file != NULL) {
        if (fscanf(file, "%ld %ld", &size, &resident) != 2)
            resident = 0;
        fclose(file);
    }
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, ferry_status_t status)
{
    fprintf(stderr, "tcp_fanout: %s: %s\n", what, ferry_status_string(status));
    exit(1);
}

int main(int argc, char **argv)
{
    int peers = argc > 1 ? atoi(argv[1]) : 100;
    size_t size = argc > 2 ? strtoul(argv[2], NULL, 0) : 65536;
    if (peers < 1 || size == 0) {
        fprintf(stderr, "usage: tcp_fanout [PEERS] [SIZE]\n");
        return 2;
    }
    setenv("FERRY_TRANSPORTS", "tcp", 0);
    ferry_engine_h *targets = calloc((size_t)peers, sizeof(*targets));
    ferry_segment_h *segments = calloc((size_t)peers, sizeof(*segments));
    unsigned char **arenas = calloc((size_t)peers, sizeof(*arenas));
    unsigned char *local = malloc(size);
    memset(local, 7, size);
    ferry_engine_h initiator;
    ferry_status_t status = ferry_engine_create(NULL, &initiator);
    if (status != FERRY_OK)
        die("initiator engine", status);
    for (int i = 0; i < peers; i++) {
        if ((status = ferry_engine_create(NULL, &targets[i])) != FERRY_OK)
            die("target engine", status);
        arenas[i] = calloc(1, size);
        status = ferry_register(targets[i], arenas[i], size, "cpu",
                                FERRY_REG_REMOTE_READ | FERRY_REG_REMOTE_WRITE);
        if (status != FERRY_OK)
            die("register", status);
    }
    for (int i = 0; i < peers; i++) {
        status = ferry_segment_open(initiator, ferry_engine_segment_name(targets[i]), &segments[i]);
        if (status != FERRY_OK)
            die("segment open", status);
    }
    long threads_before = count_entries("/proc/self/task");
    long fds_before = count_entries("/proc/self/fd");
    long rss_before = rss_kib();

    double start = now();
    ferry_batch_h batch;
    if ((status = ferry_batch_create(initiator, (size_t)peers, &batch)) != FERRY_OK)
        die("batch", status);
    ferry_request_t *reqs = calloc((size_t)peers, sizeof(*reqs));
    for (int i = 0; i < peers; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = local,
                                    .target = segments[i],
                                    .target_offset = (uint64_t)(uintptr_t)arenas[i],
                                    .length = size};
    if ((status = ferry_batch_submit(batch, reqs, (size_t)peers)) != FERRY_OK)
        die("submit", status);
    if ((status = ferry_batch_wait(batch, 60000)) != FERRY_OK)
        die("wait", status);
    double seconds = now() - start;
    ferry_batch_destroy(batch);
    for (int i = 0; i < peers; i++) {
        if (arenas[i][size - 1] != 7)
            die("data check", FERRY_ERR_IO);
    }
    long threads_after = count_entries("/proc/self/task");
    long fds_after = count_entries("/proc/self/fd");
    long rss_after = rss_kib();
    printf("RESULT peers=%d threads_before=%ld threads_after=%ld fds_before=%ld fds_after=%ld "
           "rss_kib_before=%ld rss_kib_after=%ld seconds=%.3f\n",
           peers, threads_before, threads_after, fds_before, fds_after, rss_before, rss_after,
           seconds);
    for (int i = 0; i < peers; i++)
        ferry_segment_close(initiator, segments[i]);
    ferry_engine_destroy(initiator);
    for (int i = 0; i < peers; i++) {
        ferry_engine_destroy(targets[i]);
        free(arenas[i]);
    }
    free(reqs);
    free(local);
    free(arenas);
    free(segments);
    free(targets);
    return 0;
}
