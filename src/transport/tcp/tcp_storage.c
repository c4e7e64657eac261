/*
 * tcp target side: a storage buffer served through the page cache, its
 * bytes moved by the kernel instead of a bounce buffer per request.
 *
 * The staged path (the services' stage_in and stage_out, kept for storage
 * registered DIRECT or SHARED and for FERRY_TCP_STORAGE_SENDFILE=0) reads
 * a whole request into one buffer and only then sends it, or receives it
 * whole and only then writes it: two copies on the target's thread, one
 * after the other, and the I/O thread blocked meanwhile.  Here:
 *  - a READ goes from the file to the socket with sendfile: the page
 *    cache's pages go to the socket without a copy through user space, in
 *    steps on the non-blocking socket like a memory READ's sendmsg;
 *  - a WRITE's payload is received into a FERRY_TCP_STORAGE_CHUNK buffer
 *    that is written with pwrite when full, when the payload ends, or when
 *    the socket has nothing more for now (the pwrite then overlaps the
 *    sender refilling the socket), so the copy into the page cache reads
 *    a buffer still in the cache.
 * The descriptor is the owner's (storage_file), borrowed while the
 * connection holds the access token: unregister waits for that token, so
 * no served byte is written after ferry_unregister returns.
 */
#include "tcp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/uio.h>

int ferry_tcp_storage_open(ferry_tcp_target_conn_t *conn)
{
    ferry_tcp_t *tcp = conn->tcp;
    conn->file_fd = -1;
    if (!tcp->settings.storage_sendfile || !FERRY_TRANSPORT_SERVICES_HAS(&tcp->svc, storage_file))
        return 0;
    int fd = -1, write_flags = 0;
    uint64_t offset = 0;
    if (tcp->svc.storage_file(tcp->svc.engine, conn->token, conn->addr, &fd, &offset,
                              &write_flags) != FERRY_OK)
        return 0;
    if (conn->op == FERRY_TCP_OP_WRITE && conn->chunk == NULL &&
        (conn->chunk = malloc(FERRY_TCP_STORAGE_CHUNK)) == NULL)
        return 0; /* the staged path allocates less at a time */
    conn->file_fd = fd;
    conn->file_offset = offset;
    conn->file_write_flags = write_flags;
    conn->file_left = conn->op == FERRY_TCP_OP_READ ? conn->length : 0;
    conn->chunk_len = 0;
    return 1;
}

ferry_status_t ferry_tcp_storage_check(const ferry_tcp_target_conn_t *conn)
{
    struct stat st;
    if (fstat(conn->file_fd, &st) != 0) {
        ferry_error("tcp: a served storage READ: fstat: %s", strerror(errno));
        return FERRY_ERR_IO;
    }
    /* A block device keeps its size; a file may have been truncated since
     * its registration: the READ fails whole rather than short. */
    if (S_ISREG(st.st_mode) && (uint64_t)st.st_size < conn->file_offset + conn->length) {
        ferry_error("tcp: a served %llu-byte storage READ at file offset %llu: the file ends "
                    "at %llu", (unsigned long long)conn->length,
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

ferry_status_t ferry_tcp_storage_flush(ferry_tcp_target_conn_t *conn)
{
    size_t done = 0;
    while (done < conn->chunk_len) {
        struct iovec iov = {conn->chunk + done, conn->chunk_len - done};
        ssize_t n = pwritev2(conn->file_fd, &iov, 1, (off_t)(conn->file_offset + done),
                             conn->file_write_flags);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0) {
            ferry_error("tcp: a served storage WRITE: pwrite of %zu bytes at file offset %llu: "
                        "%s", conn->chunk_len - done,
                        (unsigned long long)(conn->file_offset + done),
                        n == 0 ? "nothing written" : strerror(errno));
            return FERRY_ERR_IO;
        }
        done += (size_t)n;
    }
    conn->file_offset += done;
    conn->chunk_len = 0;
    return FERRY_OK;
}
