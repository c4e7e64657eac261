/*
 * shm transfers: consecutive slices of one direction go to the kernel
 * together, up to SHM_IOV_BATCH per process_vm_writev/readv (a system call
 * per slice cost 64 B writes nine tenths of their time); what a call left
 * undone, and a slice alone, is one call per slice (repeated for a partial
 * copy), which says why it failed.  Done in the caller's thread; every
 * slice is finished before submit returns.
 */
#include "shm.h"
#include "../../util/util.h"

#include <errno.h>
#include <string.h>
#include <sys/uio.h>

static ferry_status_t copy_status(int err)
{
    switch (err) {
    case ESRCH:
        return FERRY_ERR_PEER_FAILED; /* the process is gone */
    case EPERM:
        return FERRY_ERR_UNSUPPORTED; /* the kernel stopped letting us attach */
    case EFAULT:
        return FERRY_ERR_OUT_OF_RANGE; /* the peer has no such memory (any more) */
    case ENOMEM:
        return FERRY_ERR_NO_MEMORY;
    default:
        return FERRY_ERR_IO;
    }
}

static ferry_status_t copy_slice(const ferry_shm_peer_t *p, const ferry_slice_t *s)
{
    size_t done = 0;
    while (done < s->length) {
        struct iovec local = {(char *)s->local + done, s->length - done};
        struct iovec remote = {(void *)(uintptr_t)(s->remote_addr + done), s->length - done};
        ssize_t n = s->opcode == FERRY_OP_WRITE
                        ? process_vm_writev((pid_t)p->pid, &local, 1, &remote, 1, 0)
                        : process_vm_readv((pid_t)p->pid, &local, 1, &remote, 1, 0);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        /* 0 bytes: the first remote page is not there */
        return copy_status(n < 0 ? errno : EFAULT);
    }
    return FERRY_OK;
}

#define SHM_IOV_BATCH 64

/* Copy s and the slices after it that go the same way, at most
 * SHM_IOV_BATCH, with one system call: how many of them it copied in full
 * from s on (0 when there is no second one; the rest is copy_slice's: a
 * slice the call copied in part is copied again, whole). */
static size_t copy_batch(const ferry_shm_peer_t *p, const ferry_slice_t *s)
{
    struct iovec local[SHM_IOV_BATCH], remote[SHM_IOV_BATCH];
    size_t n = 0;
    for (const ferry_slice_t *t = s; t != NULL && n < SHM_IOV_BATCH && t->opcode == s->opcode;
         t = t->next, n++) {
        local[n] = (struct iovec){t->local, t->length};
        remote[n] = (struct iovec){(void *)(uintptr_t)t->remote_addr, t->length};
    }
    if (n < 2)
        return 0;
    ssize_t copied;
    do {
        copied = s->opcode == FERRY_OP_WRITE
                     ? process_vm_writev((pid_t)p->pid, local, n, remote, n, 0)
                     : process_vm_readv((pid_t)p->pid, local, n, remote, n, 0);
    } while (copied < 0 && errno == EINTR);
    size_t full = 0;
    for (size_t left = copied > 0 ? (size_t)copied : 0; full < n && left >= local[full].iov_len;
         full++)
        left -= local[full].iov_len;
    return full;
}

ferry_status_t ferry_shm_submit(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices)
{
    ferry_shm_t *shm = ctx;
    if (slices == NULL)
        return FERRY_ERR_INVALID_PARAM;
    for (ferry_slice_t *s = slices; s != NULL; s = s->next)
        if (s->length == 0 || s->local == NULL ||
            (s->opcode != FERRY_OP_READ && s->opcode != FERRY_OP_WRITE))
            return FERRY_ERR_INVALID_PARAM;
    ferry_shm_peer_t *p = ferry_shm_peer_get(shm, peer);
    if (p == NULL)
        return FERRY_ERR_DECODE;
    if (!p->usable) {
        /* A dead peer is a failed peer, not a refusal to attach. */
        ferry_status_t status = p->gone ? FERRY_ERR_PEER_FAILED : FERRY_ERR_UNSUPPORTED;
        ferry_shm_peer_put(p);
        return status;
    }
    /* Is the pid still that process?  A copy into a recycled pid would
     * write into a stranger (looked up at most every few milliseconds). */
    uint64_t now = ferry_time_ms();
    if (now - atomic_load(&p->checked_ms) >= FERRY_SHM_LIVENESS_MS) {
        atomic_store(&p->checked_ms, now);
        if (!ferry_process_alive(p->pid, p->start_time)) {
            ferry_warn("shm: peer %s (pid %ld) is gone; failing its requests", peer->name,
                       p->pid);
            ferry_shm_peer_put(p);
            return FERRY_ERR_PEER_FAILED;
        }
    }
    /* Until one slice is done, a failure queues nothing (the engine may
     * refresh and retry); after that, each slice reports its own result. */
    size_t batched = copy_batch(p, slices); /* slices copied already, from this one on */
    ferry_status_t first = batched > 0 ? FERRY_OK : copy_slice(p, slices);
    if (first != FERRY_OK) {
        ferry_shm_peer_put(p);
        return first;
    }
    batched = batched > 0 ? batched - 1 : 0;
    /* The slices finish in runs of one result, a call per run (one, as a
     * rule): the engine settles a run's requests together. */
    ferry_slice_t *run = slices, *last = NULL;
    ferry_status_t run_status = FERRY_OK;
    for (ferry_slice_t *s = slices; s != NULL; last = s, s = s->next) {
        ferry_status_t status = FERRY_OK;
        if (s != slices && batched == 0)
            batched = copy_batch(p, s);
        if (s != slices && batched > 0)
            batched--;
        else if (s != slices)
            status = copy_slice(p, s);
        if (status != FERRY_OK)
            ferry_error("shm: %s of [0x%llx, +%zu) at %s failed: %s",
                        s->opcode == FERRY_OP_WRITE ? "write" : "read",
                        (unsigned long long)s->remote_addr, s->length, peer->name,
                        ferry_status_string(status));
        if (status != run_status) {
            last->next = NULL;
            ferry_transport_slices_done(&shm->svc, run, run_status);
            run = s;
            run_status = status;
        }
    }
    ferry_transport_slices_done(&shm->svc, run, run_status);
    ferry_shm_peer_put(p);
    return FERRY_OK;
}
