/*
 * ferry_bench_scale's coordination: an allgather of one fixed-size blob per
 * process, which is also its barrier.  Under an MPI launcher it is
 * MPI_Allgather; otherwise the command forks its processes and stays behind
 * as a relay over one socketpair per child:
 *
 *   child -> parent   u64 length, then the blob
 *   parent -> child   u64 length (processes x the blob's), then every blob
 *
 * The parent forks before any engine or thread exists.  A child that dies,
 * sends a blob of another length, or does not answer within the timeout
 * ends the run: the parent kills every child (none outlives it:
 * PR_SET_PDEATHSIG) and reports the failure.  After its last exchange a
 * child closes its socket and exits; its exit status is its verdict.
 */
#include <config.h>

#include "ferry_bench_scale.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef FERRY_SCALE_MPI
#include <mpi.h>
#endif

struct scale_coord {
    int rank;
    int size;
    int mpi;
    int fd; /* a child's end of its socketpair */
};

static int io_all(int fd, void *data, size_t length, int writing, int timeout_ms)
{
    unsigned char *p = data;
    while (length > 0) {
        struct pollfd pfd = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
        int ready = poll(&pfd, 1, timeout_ms);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0)
            return -1; /* timed out, or poll failed */
        ssize_t done = writing ? send(fd, p, length, MSG_NOSIGNAL) : recv(fd, p, length, 0);
        if (done < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (done <= 0)
            return -1;
        p += done;
        length -= (size_t)done;
    }
    return 0;
}

/* The parent's part: relay rounds until every child has closed its end.
 * Returns 0 when all exchanges went through. */
static int relay(const int *fds, int processes, unsigned timeout_s)
{
    int timeout_ms = timeout_s ? (int)(timeout_s * 1000) : -1;
    unsigned char *all = NULL;
    int ok = 1;
    for (int round = 0; ok; round++) {
        uint64_t length = 0;
        int ended = 0;
        for (int i = 0; i < processes && ok; i++) {
            uint64_t got;
            struct pollfd pfd = {.fd = fds[i], .events = POLLIN};
            char peek;
            if (poll(&pfd, 1, timeout_ms) == 1 && recv(fds[i], &peek, 1, MSG_PEEK) == 0) {
                ended++; /* closed: done, or dead (its exit status says) */
                continue;
            }
            if (io_all(fds[i], &got, sizeof(got), 0, timeout_ms) != 0 ||
                (i - ended > 0 && got != length) || got > ((uint64_t)1 << 30) / processes) {
                fprintf(stderr, "ferry_bench_scale: process %d failed in exchange %d (no "
                        "answer in time, died, or sent a blob of another length)\n", i, round);
                ok = 0;
                break;
            }
            if (i - ended == 0) {
                length = got;
                free(all);
                all = malloc(length * (uint64_t)processes + 1);
                if (all == NULL) {
                    fprintf(stderr, "ferry_bench_scale: out of memory\n");
                    ok = 0;
                    break;
                }
            }
            if (io_all(fds[i], all + (size_t)length * (size_t)i, length, 0, timeout_ms) != 0) {
                fprintf(stderr, "ferry_bench_scale: process %d died in exchange %d\n", i,
                        round);
                ok = 0;
            }
        }
        if (!ok)
            break;
        if (ended == processes)
            break; /* all finished */
        if (ended > 0) {
            fprintf(stderr, "ferry_bench_scale: %d of %d processes ended before exchange %d\n",
                    ended, processes, round);
            ok = 0;
            break;
        }
        uint64_t total = length * (uint64_t)processes;
        for (int i = 0; i < processes && ok; i++) {
            if (io_all(fds[i], &total, sizeof(total), 1, timeout_ms) != 0 ||
                io_all(fds[i], all, (size_t)total, 1, timeout_ms) != 0) {
                fprintf(stderr, "ferry_bench_scale: process %d died in exchange %d\n", i,
                        round);
                ok = 0;
            }
        }
    }
    free(all);
    return ok ? 0 : -1;
}

static int fork_children(int processes, unsigned timeout_s, scale_coord_t *coord,
                         int *failed_p)
{
    int *fds = calloc((size_t)processes, sizeof(*fds));
    pid_t *pids = calloc((size_t)processes, sizeof(*pids));
    if (fds == NULL || pids == NULL) {
        fprintf(stderr, "ferry_bench_scale: out of memory\n");
        free(fds);
        free(pids);
        return -1;
    }
    fflush(NULL); /* nothing buffered is written twice */
    pid_t parent = getpid();
    int started = 0;
    for (; started < processes; started++) {
        int pair[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
            fprintf(stderr, "ferry_bench_scale: socketpair: %s\n", strerror(errno));
            break;
        }
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "ferry_bench_scale: fork: %s\n", strerror(errno));
            close(pair[0]);
            close(pair[1]);
            break;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(1); /* the parent is gone already */
            for (int i = 0; i < started; i++)
                close(fds[i]);
            close(pair[0]);
            free(fds);
            free(pids);
            coord->rank = started;
            coord->size = processes;
            coord->fd = pair[1];
            return 0;
        }
        close(pair[1]);
        fds[started] = pair[0];
        pids[started] = pid;
    }
    int failed = started < processes || relay(fds, started, timeout_s) != 0;
    for (int i = 0; i < started; i++) {
        if (failed)
            kill(pids[i], SIGKILL);
        close(fds[i]);
    }
    for (int i = 0; i < started; i++) {
        int status = 0;
        while (waitpid(pids[i], &status, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (!failed)
                fprintf(stderr, "ferry_bench_scale: process %d %s %d\n", i,
                        WIFEXITED(status) ? "exited with" : "killed by signal",
                        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            failed = 1;
        }
    }
    free(fds);
    free(pids);
    *failed_p = failed;
    return 1;
}

int scale_coord_under_launcher(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMIX_RANK") != NULL;
}

int scale_coord_start(int *argc_p, char ***argv_p, int processes, unsigned timeout_s,
                      scale_coord_t **coord_p, int *failed_p)
{
    scale_coord_t *coord = calloc(1, sizeof(*coord));
    if (coord == NULL)
        return -1;
    *coord_p = coord;
    coord->fd = -1;
#ifdef FERRY_SCALE_MPI
    if (scale_coord_under_launcher()) {
        MPI_Init(argc_p, argv_p);
        MPI_Comm_rank(MPI_COMM_WORLD, &coord->rank);
        MPI_Comm_size(MPI_COMM_WORLD, &coord->size);
        coord->mpi = 1;
        return 0;
    }
#else
    (void)argc_p;
    (void)argv_p;
    if (scale_coord_under_launcher())
        fprintf(stderr, "ferry_bench_scale: built without MPI: forking %d processes of its "
                "own under this launcher\n", processes);
#endif
    int rc = fork_children(processes, timeout_s, coord, failed_p);
    if (rc != 0) {
        free(coord);
        *coord_p = NULL;
    }
    return rc;
}

int scale_coord_rank(const scale_coord_t *coord)
{
    return coord->rank;
}

int scale_coord_size(const scale_coord_t *coord)
{
    return coord->size;
}

int scale_coord_is_mpi(const scale_coord_t *coord)
{
    return coord->mpi;
}

int scale_coord_allgather(scale_coord_t *coord, const void *mine, size_t length, void *all)
{
#ifdef FERRY_SCALE_MPI
    if (coord->mpi)
        return MPI_Allgather(mine, (int)length, MPI_BYTE, all, (int)length, MPI_BYTE,
                             MPI_COMM_WORLD) == MPI_SUCCESS ? 0 : -1;
#endif
    uint64_t header = length, total = 0;
    if (io_all(coord->fd, &header, sizeof(header), 1, -1) != 0 ||
        io_all(coord->fd, (void *)mine, length, 1, -1) != 0 ||
        io_all(coord->fd, &total, sizeof(total), 0, -1) != 0 ||
        total != length * (uint64_t)coord->size || io_all(coord->fd, all, total, 0, -1) != 0) {
        fprintf(stderr, "ferry_bench_scale: process %d lost the coordinator\n", coord->rank);
        return -1;
    }
    return 0;
}

void scale_coord_finish(scale_coord_t *coord, int failed)
{
#ifdef FERRY_SCALE_MPI
    if (coord->mpi) {
        MPI_Finalize();
        free(coord);
        return;
    }
#endif
    close(coord->fd);
    free(coord);
    exit(failed ? 1 : 0);
}
