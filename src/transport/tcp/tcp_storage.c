/*
 * tcp target side: a storage buffer served through the page cache, its
 * bytes moved by the kernel instead of a bounce buffer per request.
 *
 * The staged path (the services' stage_in and stage_out, kept for storage
 * registered DIRECT or SHARED and for FERRY_TCP_STORAGE_STAGED=yes) reads
 * a whole request into one buffer and only then sends it, or receives it
 * whole and only then writes it: two copies on the target's thread, one
 * after the other, and the I/O thread blocked meanwhile.  Here, in steps
 * on the non-blocking socket like memory:
 *  - the engine maps the storage range MAP_SHARED (storage_file's
 *    `mapped`: made on the first served request, kept until unregister,
 *    writable where peers may write), and a READ is sent from it, a WRITE
 *    received into it, exactly as for memory: one copy between the page
 *    cache and the socket, done before the access is released.  Only
 *    system calls touch the mapping (a file cut short makes them fail
 *    with EFAULT; a CPU load would be SIGBUS), and every request first
 *    checks the file still holds its range;
 *  - storage the engine does not map (above 64 GiB, or mmap refused): a
 *    READ goes by sendfile (the page cache's pages go to the socket, no
 *    copy), a WRITE's payload is spliced from the socket into a pipe of
 *    FERRY_TCP_STORAGE_CHUNK bytes (the socket's pages move) and from
 *    there into the file (one copy);
 *  - durable storage (RWF_DSYNC is pwritev2's, not a store's): a WRITE's
 *    payload is received into a chunk of that size and written with
 *    pwritev2.
 * Pipe and chunk are written when full, when the payload ends, or when
 * the socket has nothing more for now (the write then overlaps the sender
 * refilling the socket).
 * Why (doc/performance.md, "tcp serving storage, second round"): through
 * the mapping READs and WRITEs run at 0.95-1.1x of memory's speed;
 * sendfile reached 0.7-0.8x (a page-cache lookup and a page reference per
 * 4 KiB, on both sides of the loopback), a pread into a 256 KiB chunk then
 * a send 0.6x, as the staged path, a mapping made per request 0.5x;
 * splice WRITEs 0.6-0.7x.
 *
 * The descriptor is the owner's (storage_file), borrowed while the
 * connection holds the access token: unregister waits for that token, so
 * no served byte is written to the file after ferry_unregister returns,
 * and a mapped READ's bytes are copied before (the mapping goes with the
 * storage, after the last token).  A sendfile READ differs
 * in one way: the socket holds the page cache's pages, so its bytes are
 * fixed when the peer receives them, not when the token is released; a
 * READ in flight across the owner's unregister may return bytes written
 * to the range after unregister returned (README of the file transport,
 * "Limits").
 */
#include "tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* Where a WRITE's payload waits: a pipe (splice: the socket's pages move
 * into it, then are copied once into the page cache) unless writes must
 * be durable (RWF_DSYNC is pwritev2's) or no pipe can be had; else chunk. */
static int payload_buffer(ferry_tcp_target_conn_t *conn, int write_flags)
{
    int want_pipe = write_flags == 0;
    if (want_pipe && conn->pipe_fds[0] < 0 && pipe2(conn->pipe_fds, O_CLOEXEC) != 0) {
        conn->pipe_fds[0] = conn->pipe_fds[1] = -1;
        want_pipe = 0;
    }
    if (want_pipe) {
        int size = fcntl(conn->pipe_fds[1], F_GETPIPE_SZ);
        if (size < (int)FERRY_TCP_STORAGE_CHUNK)
            size = fcntl(conn->pipe_fds[1], F_SETPIPE_SZ, (int)FERRY_TCP_STORAGE_CHUNK);
        if (size <= 0)
            size = fcntl(conn->pipe_fds[1], F_GETPIPE_SZ);
        conn->into_pipe = 1;
        conn->pending_max = size > 0 ? (size_t)size : 4096;
        return 1;
    }
    if (conn->chunk == NULL && (conn->chunk = malloc(FERRY_TCP_STORAGE_CHUNK)) == NULL)
        return 0; /* the staged path allocates less at a time */
    conn->into_pipe = 0;
    conn->pending_max = FERRY_TCP_STORAGE_CHUNK;
    return 1;
}

int ferry_tcp_storage_open(ferry_tcp_target_conn_t *conn)
{
    ferry_tcp_t *tcp = conn->tcp;
    conn->file_fd = -1;
    conn->file_mapped = NULL;
    conn->file_mapped_writable = NULL;
    if (tcp->settings.storage_staged || !FERRY_TRANSPORT_SERVICES_HAS(&tcp->svc, storage_file))
        return 0;
    ferry_storage_file_t file = {.fd = -1};
    if (tcp->svc.storage_file(tcp->svc.engine, conn->token, conn->addr, &file) != FERRY_OK)
        return 0;
    if (conn->op == FERRY_TCP_OP_WRITE && file.mapped_writable == NULL &&
        !payload_buffer(conn, file.write_flags))
        return 0;
    conn->file_fd = file.fd;
    conn->file_offset = file.offset;
    conn->file_write_flags = file.write_flags;
    conn->file_mapped = conn->op == FERRY_TCP_OP_READ ? file.mapped : NULL;
    conn->file_mapped_writable = conn->op == FERRY_TCP_OP_WRITE ? file.mapped_writable : NULL;
    /* a mapped READ is sent like memory; sendfile moves the others */
    conn->file_left = conn->op == FERRY_TCP_OP_READ && file.mapped == NULL ? conn->length : 0;
    conn->pending = 0;
    return 1;
}

void ferry_tcp_storage_free(ferry_tcp_target_conn_t *conn)
{
    for (int i = 0; i < 2; i++)
        if (conn->pipe_fds[i] >= 0)
            close(conn->pipe_fds[i]);
    conn->pipe_fds[0] = conn->pipe_fds[1] = -1;
    free(conn->chunk);
    conn->chunk = NULL;
}

ssize_t ferry_tcp_storage_recv(ferry_tcp_target_conn_t *conn, size_t want)
{
    want = FERRY_MIN(want, conn->pending_max - conn->pending);
    ssize_t got = conn->into_pipe ? splice(conn->fd, NULL, conn->pipe_fds[1], NULL, want,
                                           SPLICE_F_MOVE | SPLICE_F_NONBLOCK)
                                  : recv(conn->fd, conn->chunk + conn->pending, want,
                                         MSG_DONTWAIT);
    if (got > 0)
        conn->pending += (size_t)got;
    return got;
}

ferry_status_t ferry_tcp_storage_check(const ferry_tcp_target_conn_t *conn)
{
    struct stat st;
    if (fstat(conn->file_fd, &st) != 0) {
        ferry_error("tcp: a served storage request: fstat: %s", strerror(errno));
        return FERRY_ERR_IO;
    }
    /* A block device keeps its size; a file may have been cut short since
     * its registration: a READ fails whole rather than short, a WRITE
     * into the mapping would fault past the end. */
    if (S_ISREG(st.st_mode) && (uint64_t)st.st_size < conn->file_offset + conn->length) {
        ferry_error("tcp: a served %llu-byte storage %s at file offset %llu: the file ends "
                    "at %llu", (unsigned long long)conn->length,
                    conn->op == FERRY_TCP_OP_WRITE ? "WRITE" : "READ",
                    (unsigned long long)conn->file_offset, (unsigned long long)st.st_size);
        return FERRY_ERR_IO;
    }
    return FERRY_OK;
}

ssize_t ferry_tcp_storage_send(ferry_tcp_target_conn_t *conn, size_t max)
{
    off_t offset = (off_t)conn->file_offset;
    size_t want = (size_t)FERRY_MIN(conn->file_left, (uint64_t)max);
    ssize_t sent = sendfile(conn->fd, conn->file_fd, &offset, want);
    if (sent > 0) {
        conn->file_offset += (uint64_t)sent;
        conn->file_left -= (uint64_t)sent;
    }
    return sent;
}

/* The pipe's bytes into the file.  A failure leaves bytes in the pipe:
 * it is closed, and the next WRITE makes another. */
static ferry_status_t flush_pipe(ferry_tcp_target_conn_t *conn)
{
    while (conn->pending > 0) {
        loff_t offset = (loff_t)conn->file_offset;
        ssize_t n = splice(conn->pipe_fds[0], NULL, conn->file_fd, &offset, conn->pending,
                           SPLICE_F_MOVE);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            ferry_error("tcp: a served storage WRITE: splice of %zu bytes to file offset %llu: "
                        "%s", conn->pending, (unsigned long long)conn->file_offset,
                        n == 0 ? "nothing written" : strerror(errno));
            for (int i = 0; i < 2; i++)
                close(conn->pipe_fds[i]);
            conn->pipe_fds[0] = conn->pipe_fds[1] = -1;
            conn->pending = 0;
            return FERRY_ERR_IO;
        }
        conn->file_offset += (uint64_t)n;
        conn->pending -= (size_t)n;
    }
    return FERRY_OK;
}

ferry_status_t ferry_tcp_storage_flush(ferry_tcp_target_conn_t *conn)
{
    if (conn->into_pipe)
        return flush_pipe(conn);
    size_t done = 0;
    while (done < conn->pending) {
        struct iovec iov = {conn->chunk + done, conn->pending - done};
        ssize_t n = pwritev2(conn->file_fd, &iov, 1, (off_t)(conn->file_offset + done),
                             conn->file_write_flags);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0) {
            ferry_error("tcp: a served storage WRITE: pwrite of %zu bytes at file offset %llu: "
                        "%s", conn->pending - done,
                        (unsigned long long)(conn->file_offset + done),
                        n == 0 ? "nothing written" : strerror(errno));
            conn->pending = 0;
            return FERRY_ERR_IO;
        }
        done += (size_t)n;
    }
    conn->file_offset += done;
    conn->pending = 0;
    return FERRY_OK;
}
