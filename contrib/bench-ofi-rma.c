/*
 * bench-ofi-rma: a bare libfabric RMA loop, the baseline the ofi transport is
 * measured against (contrib/bench-ofi-vs-bare.sh, issue 20).  libfabric and
 * libc (and the tools' option parser), no libferry: what it costs is the
 * provider's cost alone.
 *
 * Two processes on this host: the program forks before it touches libfabric;
 * the parent is the initiator, the child the target (as ferry_bench --spawn
 * starts them; shm's cross-memory copies go the same way round).  The child
 * opens its endpoint, fills and registers its buffer and sends its address,
 * the buffer's remote base and its key through a socketpair; then it only
 * drives its completion queue (tcp;ofi_rxm and shm progress manually, so a
 * target that does not read its CQ acknowledges nothing) until the parent
 * closes the socket.
 *
 * What it measures, matched to ferry_bench (src/tools/ferry_bench*.c):
 *  - bandwidth (default): blocks of --block-size move in batches of
 *    --batch-size, each batch waited for as a whole before the next starts,
 *    as ferry_bench --batch-size=N with its default --window=1 does (one
 *    batch submitted, ferry_batch_wait, the next).  Inside a batch at most
 *    --window operations are outstanding, which is what the ofi transport's
 *    window does with a batch's slices.  Blocks wrap around a buffer of
 *    --buffer-size on each side (default: batch x block, at most 64 MiB,
 *    ferry_bench's default).  Runs --duration seconds per size; GB/s is
 *    1e9 bytes per second, the batches still in flight at the end counted,
 *    as in ferry_bench.
 *  - --latency: one operation of --block-size at a time, timed from post to
 *    its completion (for a delivery-complete write: the data is in the
 *    target's memory); a sample is the mean of 32 consecutive operations
 *    and the median and 99th percentile of the samples are printed, which
 *    is exactly what ferry_bench --latency prints (it also reads the clock
 *    once per 32 requests).  ferry_bench --pingpong (half a round trip of
 *    writes) has no counterpart here.
 *  - Completion level: writes go with FI_DELIVERY_COMPLETE, the ofi
 *    transport's default (Debian's 1.17 providers report some failed writes
 *    as done under transmit-complete); --transmit-complete takes
 *    FI_TRANSMIT_COMPLETE instead.  Reads complete when the data is local.
 *  - One initiator thread, one endpoint, one completion queue; the domain
 *    is opened FI_THREAD_DOMAIN (--threading=safe asks FI_THREAD_SAFE, which
 *    a transport with a progress thread beside the caller's needs: the
 *    difference is the provider's locking).
 *  - Both CQs have no wait object; --target-wait=fd gives the target's one
 *    an fd (FI_WAIT_FD), as the ofi transport's target CQ has so that its
 *    idle thread can sleep: on tcp;ofi_rxm the provider's reads of such a
 *    CQ cost more.
 * Before each size is timed, one block is written, read back elsewhere and
 * compared: the bytes are checked once per size, never inside the timing.
 *
 * Memory registration honours what the provider asks for: FI_MR_VIRT_ADDR
 * (remote addresses are virtual addresses, else offsets into the region),
 * FI_MR_PROV_KEY (the provider's key, else one we choose), FI_MR_ENDPOINT
 * (bind the region to the endpoint and enable it), FI_MR_LOCAL (local
 * buffers registered, their descriptors passed).  FI_MR_RAW and FI_MR_HMEM
 * are not offered: a provider that needs them is not found.
 *
 * Example: bench-ofi-rma --provider='tcp;ofi_rxm' --operation=read -b 64k,1m -B 32
 *          bench-ofi-rma --provider=shm --latency
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "tool_args.h" /* the size and count parsers of Ferry's tools (libc only) */

#define MAX_SIZES       16
#define MAX_ADDRESS     256
#define LATENCY_GROUP   32      /* operations per latency sample, as ferry_bench */
#define STALL_LIMIT_S   10.0    /* no completion for this long: the peer is gone */
#define CQ_BURST        32
#define TARGET_KEY      0xf0f1  /* the keys we choose when the provider does not */
#define INITIATOR_KEY   0xf0f2
/* The ofi transport's default window (FERRY_OFI_WINDOW) and ferry_bench's
 * default batch: the same numbers here, so both sides run alike unasked. */
#define DEFAULT_WINDOW  64
#define DEFAULT_BATCH   128

typedef struct options {
    const char *provider;
    int write;
    size_t sizes[MAX_SIZES];
    unsigned n_sizes;
    size_t batch;
    unsigned window;
    size_t buffer_size;      /* 0: per size, batch x block capped at 64 MiB */
    size_t slice_size;       /* 0: one operation per block */
    double duration;
    int latency;
    int transmit_complete;
    int thread_safe;
    int yield;               /* --idle=yield: sched_yield when a CQ read finds nothing */
    int target_wait_fd;      /* --target-wait=fd: the target's CQ with FI_WAIT_FD */
} options_t;

/* One side's libfabric objects.  Opened in the order of the fields and
 * closed in the reverse order (side_close: libfabric refuses to close a
 * parent while its children live), the buffer freed after everything that
 * could touch it is closed. */
typedef struct side {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_cq *cq;
    struct fid_av *av;
    struct fid_ep *ep;
    unsigned char *buffer;
    size_t length;
    struct fid_mr *mr;
    void *desc;              /* the buffer's descriptor when FI_MR_LOCAL, else NULL */
} side_t;

/* What the target tells the initiator. */
typedef struct target_info {
    uint64_t base;           /* remote address of the buffer's first byte */
    uint64_t key;
    uint64_t length;
    uint32_t address_length;
    unsigned char address[MAX_ADDRESS];
} target_info_t;

/* An operation's context: FI_CONTEXT2 space the provider may use, and our
 * free-list link.  Completions can arrive out of order, so contexts come
 * from a free list, never a ring. */
typedef struct op_context {
    struct fi_context2 fi;
    struct op_context *next_free;
} op_context_t;

typedef struct initiator {
    const options_t *opts;
    side_t side;
    fi_addr_t peer;
    target_info_t target;
    uint64_t write_flags;
    unsigned window;         /* opts->window, bounded by the tx queue */
    size_t max_op;           /* the largest operation: slice size or max_msg_size */
    op_context_t *contexts;
    op_context_t *free_contexts;
    unsigned in_flight;
} initiator_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static unsigned char pattern(size_t offset, unsigned seed)
{
    return (unsigned char)((offset * 131u + seed * 17u + 7u) >> 3);
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "bench-ofi-rma[%d]: %s: %s\n", (int)getpid(), what,
            fi_strerror(rc < 0 ? -rc : rc));
    return -1;
}

/* Page-aligned, from 2 MiB up on transparent huge pages: the memory
 * ferry_alloc gives ferry_bench's default --memory=ferry. */
static unsigned char *buffer_alloc(size_t length)
{
    const size_t huge = (size_t)2 << 20;
    size_t align = length >= huge ? huge : (size_t)sysconf(_SC_PAGESIZE);
    void *p;
    if (posix_memalign(&p, align, length) != 0)
        return NULL;
    if (align == huge)
        (void)madvise(p, length & ~(huge - 1), MADV_HUGEPAGE); /* best effort */
    return p;
}

static struct fi_info *make_hints(const options_t *o)
{
    struct fi_info *hints = fi_allocinfo();
    if (hints == NULL)
        return NULL;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                                  FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->threading = o->thread_safe ? FI_THREAD_SAFE : FI_THREAD_DOMAIN;
    /* The ofi transport's hint too (the flags of each write say it anyway). */
    hints->tx_attr->op_flags = o->transmit_complete ? FI_TRANSMIT_COMPLETE : FI_DELIVERY_COMPLETE;
    hints->fabric_attr->prov_name = strdup(o->provider);
    if (hints->fabric_attr->prov_name == NULL) {
        fi_freeinfo(hints);
        return NULL;
    }
    return hints;
}

/* Register the side's buffer under the provider's MR mode. */
static int register_buffer(side_t *s, uint64_t access, uint64_t requested_key)
{
    int mode = s->info->domain_attr->mr_mode;
    int rc = fi_mr_reg(s->domain, s->buffer, s->length, access, 0, requested_key, 0, &s->mr,
                       NULL);
    if (rc)
        return fail("fi_mr_reg", rc);
    if (mode & FI_MR_ENDPOINT) {
        if ((rc = fi_mr_bind(s->mr, &s->ep->fid, 0)) != 0)
            return fail("fi_mr_bind", rc);
        if ((rc = fi_mr_enable(s->mr)) != 0)
            return fail("fi_mr_enable", rc);
    }
    s->desc = (mode & FI_MR_LOCAL) ? fi_mr_desc(s->mr) : NULL;
    return 0;
}

static void side_close(side_t *s)
{
    if (s->mr)
        fi_close(&s->mr->fid);
    if (s->ep)
        fi_close(&s->ep->fid);
    if (s->av)
        fi_close(&s->av->fid);
    if (s->cq)
        fi_close(&s->cq->fid);
    if (s->domain)
        fi_close(&s->domain->fid);
    if (s->fabric)
        fi_close(&s->fabric->fid);
    if (s->info)
        fi_freeinfo(s->info);
    free(s->buffer);
    *s = (side_t){0};
}

/* Endpoint, queues and a registered buffer of length bytes.  0, or -1 after
 * a message (the caller closes what was opened). */
static int side_open(side_t *s, const options_t *o, size_t length, uint64_t access,
                     uint64_t requested_key)
{
    struct fi_info *hints = make_hints(o);
    if (hints == NULL)
        return fail("fi_allocinfo", FI_ENOMEM);
    int rc = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), NULL, NULL, 0, hints,
                        &s->info);
    fi_freeinfo(hints);
    if (rc) {
        fprintf(stderr, "bench-ofi-rma: no provider \"%s\" with FI_EP_RDM and FI_RMA (%s); "
                "fi_info -l lists what is there\n", o->provider, fi_strerror(-rc));
        return -1;
    }
    if ((rc = fi_fabric(s->info->fabric_attr, &s->fabric, NULL)) != 0)
        return fail("fi_fabric", rc);
    if ((rc = fi_domain(s->fabric, s->info, &s->domain, NULL)) != 0)
        return fail("fi_domain", rc);
    int wait_fd = (access & FI_REMOTE_WRITE) != 0 && o->target_wait_fd; /* the target */
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT,
                                 .wait_obj = wait_fd ? FI_WAIT_FD : FI_WAIT_NONE};
    if ((rc = fi_cq_open(s->domain, &cq_attr, &s->cq, NULL)) != 0)
        return fail("fi_cq_open", rc);
    struct fi_av_attr av_attr = {.type = FI_AV_UNSPEC};
    if ((rc = fi_av_open(s->domain, &av_attr, &s->av, NULL)) != 0)
        return fail("fi_av_open", rc);
    if ((rc = fi_endpoint(s->domain, s->info, &s->ep, NULL)) != 0)
        return fail("fi_endpoint", rc);
    if ((rc = fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV)) != 0)
        return fail("fi_ep_bind (cq)", rc);
    if ((rc = fi_ep_bind(s->ep, &s->av->fid, 0)) != 0)
        return fail("fi_ep_bind (av)", rc);
    if ((rc = fi_enable(s->ep)) != 0)
        return fail("fi_enable", rc);
    s->length = length;
    if ((s->buffer = buffer_alloc(length)) == NULL)
        return fail("buffer", FI_ENOMEM);
    memset(s->buffer, 0, length);
    return register_buffer(s, access, requested_key);
}

/* After fi_cq_read said -FI_EAVAIL: print the failed operation's error. */
static void report_cq_error(struct fid_cq *cq)
{
    struct fi_cq_err_entry err = {0};
    if (fi_cq_readerr(cq, &err, 0) == 1)
        fprintf(stderr, "bench-ofi-rma[%d]: operation failed: %s (%s)\n", (int)getpid(),
                fi_strerror(err.err), fi_cq_strerror(cq, err.prov_errno, err.err_data, NULL, 0));
    else
        fprintf(stderr, "bench-ofi-rma[%d]: an operation failed\n", (int)getpid());
}

/* Read what the completion queue holds into entries (CQ_BURST of them).
 * The number of completions, or -1 after a message. */
static int cq_reap(struct fid_cq *cq, struct fi_cq_entry *entries)
{
    ssize_t n = fi_cq_read(cq, entries, CQ_BURST);
    if (n >= 0)
        return (int)n;
    if (n == -FI_EAGAIN)
        return 0;
    if (n == -FI_EAVAIL)
        report_cq_error(cq);
    else
        fail("fi_cq_read", (int)n);
    return -1;
}

/* ---- target ---- */

/* All of length bytes through the socketpair (sending or receiving): 0, or
 * -1 when the peer hung up or the socket failed. */
static int socket_all(int fd, void *data, size_t length, int sending)
{
    unsigned char *p = data;
    while (length > 0) {
        ssize_t n = sending ? send(fd, p, length, MSG_NOSIGNAL) : recv(fd, p, length, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        length -= (size_t)n;
    }
    return 0;
}

/* The target posts nothing; it reads its CQ, which is what makes rxm and shm
 * serve the initiator's operations, until the initiator hangs up. */
static int run_target(const options_t *o, size_t length, int sock)
{
    side_t s = {0};
    target_info_t info = {0};
    int rc = side_open(&s, o, length, FI_REMOTE_READ | FI_REMOTE_WRITE, TARGET_KEY);
    if (rc == 0) {
        for (size_t i = 0; i < length; i++)
            s.buffer[i] = pattern(i, 0);
        size_t address_length = sizeof(info.address);
        int err = fi_getname(&s.ep->fid, info.address, &address_length);
        if (err)
            rc = fail("fi_getname", err);
        info.address_length = (uint32_t)address_length;
        info.base = (s.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? (uintptr_t)s.buffer : 0;
        info.key = fi_mr_key(s.mr);
        info.length = length;
    }
    /* On failure the initiator reads EOF and says the target did not start. */
    if (rc == 0 && socket_all(sock, &info, sizeof(info), 1) != 0)
        rc = -1;
    struct fi_cq_entry entries[CQ_BURST];
    for (unsigned spins = 0; rc == 0; spins++) {
        int n = cq_reap(s.cq, entries);
        if (n < 0)
            rc = -1;
        else if (n == 0 && o->yield)
            sched_yield();
        if ((spins & 1023) == 0) {
            struct pollfd pfd = {.fd = sock, .events = POLLIN};
            if (poll(&pfd, 1, 0) > 0)
                break; /* the initiator closed the socket: done */
        }
    }
    side_close(&s);
    return rc;
}

/* ---- initiator ---- */

static void contexts_reset(initiator_t *in)
{
    in->free_contexts = NULL;
    for (unsigned i = 0; i < in->window; i++) {
        in->contexts[i].next_free = in->free_contexts;
        in->free_contexts = &in->contexts[i];
    }
    in->in_flight = 0;
}

/* Drive the CQ once; completed contexts go back to the free list.  The
 * number completed, or -1. */
static int reap(initiator_t *in)
{
    struct fi_cq_entry entries[CQ_BURST];
    int n = cq_reap(in->side.cq, entries);
    for (int i = 0; i < n; i++) {
        op_context_t *c = entries[i].op_context;
        c->next_free = in->free_contexts;
        in->free_contexts = c;
    }
    if (n > 0)
        in->in_flight -= (unsigned)n;
    return n;
}

/* Post one operation: 0, 1 when the provider has no room now (-FI_EAGAIN:
 * reap and try again), -1 on an error. */
static int post(initiator_t *in, int write, size_t local_offset, size_t remote_offset,
                size_t length)
{
    op_context_t *c = in->free_contexts;
    if (c == NULL)
        return 1;
    struct iovec iov = {.iov_base = in->side.buffer + local_offset, .iov_len = length};
    struct fi_rma_iov rma = {.addr = in->target.base + remote_offset, .len = length,
                             .key = in->target.key};
    void *desc = in->side.desc;
    struct fi_msg_rma msg = {.msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = in->peer,
                             .rma_iov = &rma, .rma_iov_count = 1, .context = c};
    ssize_t rc = write ? fi_writemsg(in->side.ep, &msg, FI_COMPLETION | in->write_flags)
                       : fi_readmsg(in->side.ep, &msg, FI_COMPLETION);
    if (rc == -FI_EAGAIN)
        return 1;
    if (rc)
        return fail(write ? "fi_writemsg" : "fi_readmsg", (int)rc);
    in->free_contexts = c->next_free;
    in->in_flight++;
    return 0;
}

/* Reap until in_flight is at most `until`; -1 when the provider fails or
 * nothing completes for STALL_LIMIT_S. */
static int drain(initiator_t *in, unsigned until)
{
    double limit = 0;
    for (unsigned spins = 1; in->in_flight > until; spins++) {
        int n = reap(in);
        if (n < 0)
            return -1;
        if (n > 0) {
            limit = 0;
            continue;
        }
        if (in->opts->yield)
            sched_yield();
        if ((spins & 4095) == 0) {
            double now = now_s();
            if (limit == 0) {
                limit = now + STALL_LIMIT_S;
            } else if (now > limit) {
                fprintf(stderr, "bench-ofi-rma: nothing completed for %.0f s\n", STALL_LIMIT_S);
                return -1;
            }
        }
    }
    return 0;
}

/* One block [local_offset, +length) to or from the target's remote_offset,
 * as operations of at most max_op bytes, at most window outstanding; does
 * not wait for them. */
static int post_block(initiator_t *in, int write, size_t local_offset, size_t remote_offset,
                      size_t length)
{
    for (size_t done = 0; done < length;) {
        size_t part = length - done < in->max_op ? length - done : in->max_op;
        int rc = post(in, write, local_offset + done, remote_offset + done, part);
        if (rc < 0)
            return -1;
        if (rc == 0) {
            done += part;
        } else if (in->in_flight > 0) {
            if (drain(in, in->in_flight - 1) != 0) /* window full: one completion, again */
                return -1;
        } else if (reap(in) < 0) { /* the provider is busy with nothing of ours: progress */
            return -1;
        }
    }
    return 0;
}

/* Write a pattern from the local buffer into the target's block at 0, read
 * it back into the check area past the local buffer, compare. */
static int check_bytes(initiator_t *in, size_t block, size_t check_offset, unsigned seed)
{
    for (size_t i = 0; i < block; i++) {
        in->side.buffer[i] = pattern(i, seed);
        in->side.buffer[check_offset + i] = 0;
    }
    if (post_block(in, 1, 0, 0, block) || drain(in, 0) ||
        post_block(in, 0, check_offset, 0, block) || drain(in, 0))
        return -1;
    for (size_t i = 0; i < block; i++) {
        if (in->side.buffer[check_offset + i] != pattern(i, seed)) {
            fprintf(stderr, "bench-ofi-rma: check failed: block of %zu B, byte %zu is 0x%02x, "
                    "want 0x%02x\n", block, i, in->side.buffer[check_offset + i],
                    pattern(i, seed));
            return -1;
        }
    }
    return 0;
}

static size_t buffer_for(const options_t *o, size_t block)
{
    size_t want = o->buffer_size;
    if (want == 0) {
        want = o->batch * block;
        if (want > ((size_t)64 << 20))
            want = (size_t)64 << 20;
    }
    return want < block ? block : want;
}

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static const char *op_name(const options_t *o)
{
    return o->write ? "write" : "read";
}

static const char *completion_name(const initiator_t *in, int write)
{
    if (!write)
        return "local";
    return in->opts->transmit_complete ? "transmit" : "delivery";
}

static int run_bandwidth(initiator_t *in, size_t block)
{
    const options_t *o = in->opts;
    size_t buffer = buffer_for(o, block), slots = buffer / block, next = 0;
    uint64_t bytes = 0, batches = 0;
    double begin = now_s(), end = begin + o->duration;
    do {
        for (size_t i = 0; i < o->batch; i++, next++) {
            size_t offset = (next % slots) * block;
            if (post_block(in, o->write, offset, offset, block))
                return -1;
        }
        if (drain(in, 0))
            return -1;
        bytes += (uint64_t)o->batch * block;
        batches++;
    } while (now_s() < end);
    double seconds = now_s() - begin;
    printf("bench-ofi-rma: %s, provider %s, block %zu B, batch %zu, window %u, buffer %zu B, "
           "%s-complete, %.2f s: %.3f GB/s\n", op_name(o), in->side.info->fabric_attr->prov_name,
           block, o->batch, in->window, buffer, completion_name(in, o->write), seconds,
           bytes / seconds / 1e9);
    printf("RESULT operation=%s provider=%s block_size=%zu batch_size=%zu window=%u "
           "buffer_size=%zu seconds=%.3f bytes=%" PRIu64 " batches=%" PRIu64 " gbps=%.4f "
           "requests_per_s=%.0f completion=%s threading=%s idle=%s target_wait=%s verified=once "
           "status=ok\n",
           op_name(o), in->side.info->fabric_attr->prov_name, block, o->batch, in->window,
           buffer, seconds, bytes, batches, bytes / seconds / 1e9,
           (double)batches * o->batch / seconds, completion_name(in, o->write),
           o->thread_safe ? "safe" : "domain", o->yield ? "yield" : "spin",
           o->target_wait_fd ? "fd" : "none");
    return 0;
}

static int run_latency(initiator_t *in, size_t block)
{
    const options_t *o = in->opts;
    size_t capacity = 1024, count = 0;
    double *samples = malloc(capacity * sizeof(*samples));
    if (samples == NULL)
        return -1;
    double begin = now_s(), end = begin + o->duration, group = begin;
    int rc = 0;
    for (unsigned in_group = 0; rc == 0;) {
        if (post_block(in, o->write, 0, 0, block) || drain(in, 0)) {
            rc = -1;
            break;
        }
        if (++in_group < LATENCY_GROUP)
            continue;
        double now = now_s();
        if (count == capacity) {
            double *more = realloc(samples, 2 * capacity * sizeof(*samples));
            if (more == NULL) {
                rc = -1;
                break;
            }
            samples = more;
            capacity *= 2;
        }
        samples[count++] = (now - group) * 1e6 / LATENCY_GROUP;
        group = now;
        in_group = 0;
        if (now >= end)
            break;
    }
    if (rc == 0 && count > 0) {
        qsort(samples, count, sizeof(*samples), compare_double);
        double median = count % 2 ? samples[count / 2]
                                  : (samples[count / 2 - 1] + samples[count / 2]) / 2;
        double p99 = samples[(size_t)((count - 1) * 0.99)];
        printf("bench-ofi-rma: %s latency, provider %s, block %zu B, %s-complete: median "
               "%.2f us, 99th percentile %.2f us, %zu operations\n", op_name(o),
               in->side.info->fabric_attr->prov_name, block, completion_name(in, o->write),
               median, p99, count * LATENCY_GROUP);
        printf("LATENCY operation=%s provider=%s block_size=%zu median_us=%.3f p99_us=%.3f "
               "samples=%zu completion=%s threading=%s idle=%s target_wait=%s\n", op_name(o),
               in->side.info->fabric_attr->prov_name, block, median, p99, count,
               completion_name(in, o->write), o->thread_safe ? "safe" : "domain",
               o->yield ? "yield" : "spin", o->target_wait_fd ? "fd" : "none");
    }
    free(samples);
    return rc;
}

static int run_initiator(const options_t *o, size_t length, size_t max_block, int sock)
{
    initiator_t in = {.opts = o};
    if (socket_all(sock, &in.target, sizeof(in.target), 0) != 0) {
        fprintf(stderr, "bench-ofi-rma: the target did not start\n");
        return -1;
    }
    /* The local buffer has a check area of max_block bytes past its end. */
    int rc = side_open(&in.side, o, length + max_block, FI_READ | FI_WRITE, INITIATOR_KEY);
    if (rc == 0 && fi_av_insert(in.side.av, in.target.address, 1, &in.peer, 0, NULL) != 1)
        rc = fail("fi_av_insert", FI_EINVAL);
    if (rc == 0) {
        size_t tx_size = in.side.info->tx_attr->size;
        in.window = tx_size > 0 && tx_size < o->window ? (unsigned)tx_size : o->window;
        in.max_op = in.side.info->ep_attr->max_msg_size;
        if (o->slice_size > 0 && o->slice_size < in.max_op)
            in.max_op = o->slice_size;
        in.write_flags = o->transmit_complete ? FI_TRANSMIT_COMPLETE : FI_DELIVERY_COMPLETE;
        in.contexts = calloc(in.window, sizeof(*in.contexts));
        if (in.contexts == NULL)
            rc = fail("contexts", FI_ENOMEM);
    }
    if (rc == 0) {
        fprintf(stderr, "bench-ofi-rma: provider %s, fabric %s, mr_mode 0x%x, tx queue %zu, "
                "window %u, largest operation %zu B\n", in.side.info->fabric_attr->prov_name,
                in.side.info->fabric_attr->name, (unsigned)in.side.info->domain_attr->mr_mode,
                in.side.info->tx_attr->size, in.window, in.max_op);
    }
    for (unsigned i = 0; rc == 0 && i < o->n_sizes; i++) {
        size_t block = o->sizes[i];
        contexts_reset(&in);
        rc = check_bytes(&in, block, length, i + 1);
        if (rc == 0)
            rc = o->latency ? run_latency(&in, block) : run_bandwidth(&in, block);
        fflush(stdout);
    }
    /* Operations left by a failure must end before their buffers go. */
    if (rc != 0 && in.side.cq != NULL)
        (void)drain(&in, 0);
    free(in.contexts);
    side_close(&in.side);
    return rc;
}

/* ---- the initiator's watchdogs ---- */

/* Set once the initiator has hung up: the target's exit is then expected. */
static volatile sig_atomic_t initiator_done;

static void say_and_exit(const char *message, size_t length)
{
    ssize_t ignored = write(2, message, length);
    (void)ignored;
    _exit(1);
}

/* A target that dies mid-run can leave shm's shared region locked (seen
 * with 1.17: the initiator then spins in fi_writemsg forever), so its death
 * ends the run here rather than through libfabric. */
static void on_target_exit(int sig)
{
    static const char message[] = "bench-ofi-rma: the target died during the run\n";
    (void)sig;
    if (!initiator_done)
        say_and_exit(message, sizeof(message) - 1);
}

/* The last bound, for a target that is alive but frozen. */
static void on_alarm(int sig)
{
    static const char message[] = "bench-ofi-rma: the run took far longer than asked\n";
    (void)sig;
    say_and_exit(message, sizeof(message) - 1);
}

/* ---- command line ---- */

static int parse_sizes(char *list, options_t *o)
{
    o->n_sizes = 0;
    for (char *save, *item = strtok_r(list, ",", &save); item; item = strtok_r(NULL, ",", &save))
        if (o->n_sizes == MAX_SIZES || ferry_tool_parse_size(item, &o->sizes[o->n_sizes]) != 0 ||
            o->sizes[o->n_sizes++] == 0)
            return -1;
    return o->n_sizes > 0 ? 0 : -1;
}

/* An option that is one of two words: 0 and *second_p, or -1 after a message. */
static int one_of(const char *option, const char *value, const char *first, const char *second,
                  int *second_p)
{
    if (strcmp(value, first) && strcmp(value, second)) {
        fprintf(stderr, "bench-ofi-rma: --%s is %s or %s, not %s\n", option, first, second, value);
        return -1;
    }
    *second_p = strcmp(value, second) == 0;
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out,
        "Usage: bench-ofi-rma [options]   (forks a target and measures RMA against it)\n"
        "  -p, --provider=NAME     libfabric provider (default tcp;ofi_rxm; shm, ...)\n"
        "  --operation=OP          write (default) or read\n"
        "  -b, --block-size=LIST   bytes per operation, comma-separated sizes with k/m/g\n"
        "                          (default 64k; 8 with --latency)\n"
        "  -B, --batch-size=N      blocks per batch, each batch waited for whole (default %d,\n"
        "                          ferry_bench's)\n"
        "  -w, --window=N          operations outstanding at most (default %d, the ofi\n"
        "                          transport's; bounded by the provider's tx queue)\n"
        "  --buffer-size=BYTES     buffer on each side (default batch x block, at most 64m)\n"
        "  --slice-size=BYTES      split blocks into operations of at most this size\n"
        "  -d, --duration=SECONDS  per block size (default 5)\n"
        "  --latency               one operation at a time, post to completion; median and\n"
        "                          99th percentile of 32-operation means, in microseconds\n"
        "  --transmit-complete     writes complete at FI_TRANSMIT_COMPLETE, not\n"
        "                          FI_DELIVERY_COMPLETE\n"
        "  --threading=MODE        domain (default: FI_THREAD_DOMAIN) or safe (FI_THREAD_SAFE)\n"
        "  --target-wait=MODE      the target CQ's wait object: none (default) or fd\n"
        "                          (FI_WAIT_FD, as the ofi transport's target CQ, where the\n"
        "                          provider has one: tcp;ofi_rxm, not shm)\n"
        "  --idle=MODE             what a side does when its CQ has nothing: spin (default)\n"
        "                          or yield (sched_yield: for a machine with more runnable\n"
        "                          processes than cores)\n",
        DEFAULT_BATCH, DEFAULT_WINDOW);
}

static int parse_options(int argc, char **argv, options_t *o)
{
    static const struct option long_options[] = {
        {"provider", required_argument, NULL, 'p'},  {"operation", required_argument, NULL, 'o'},
        {"block-size", required_argument, NULL, 'b'}, {"batch-size", required_argument, NULL, 'B'},
        {"window", required_argument, NULL, 'w'},    {"buffer-size", required_argument, NULL, 'S'},
        {"slice-size", required_argument, NULL, 's'}, {"duration", required_argument, NULL, 'd'},
        {"latency", no_argument, NULL, 'L'},         {"transmit-complete", no_argument, NULL, 'T'},
        {"threading", required_argument, NULL, 't'}, {"idle", required_argument, NULL, 'i'},
        {"target-wait", required_argument, NULL, 'W'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (options_t){.provider = "tcp;ofi_rxm", .write = 1, .batch = DEFAULT_BATCH,
                     .window = DEFAULT_WINDOW, .duration = 5.0};
    char *sizes = NULL, *end;
    unsigned batch = DEFAULT_BATCH;
    int opt, is_read;
    while ((opt = getopt_long(argc, argv, "hp:b:B:w:d:", long_options, NULL)) != -1) {
        switch (opt) {
        case 'p': o->provider = optarg; break;
        case 'b': sizes = optarg; break;
        case 'L': o->latency = 1; break;
        case 'T': o->transmit_complete = 1; break;
        case 'o':
            if (one_of("operation", optarg, "write", "read", &is_read))
                return -1;
            o->write = !is_read;
            break;
        case 't':
            if (one_of("threading", optarg, "domain", "safe", &o->thread_safe))
                return -1;
            break;
        case 'i':
            if (one_of("idle", optarg, "spin", "yield", &o->yield))
                return -1;
            break;
        case 'W':
            if (one_of("target-wait", optarg, "none", "fd", &o->target_wait_fd))
                return -1;
            break;
        case 'B':
        case 'w':
            if (ferry_tool_parse_count(optarg, 1, 1u << 20, opt == 'B' ? &batch : &o->window)) {
                fprintf(stderr, "bench-ofi-rma: --%s is 1..%u\n",
                        opt == 'B' ? "batch-size" : "window", 1u << 20);
                return -1;
            }
            if (opt == 'B')
                o->batch = batch;
            break;
        case 'S':
        case 's':
            if (ferry_tool_parse_size(optarg, opt == 'S' ? &o->buffer_size : &o->slice_size)) {
                fprintf(stderr, "bench-ofi-rma: bad --%s %s\n",
                        opt == 'S' ? "buffer-size" : "slice-size", optarg);
                return -1;
            }
            break;
        case 'd':
            o->duration = strtod(optarg, &end);
            if (*end || !(o->duration >= 0)) {
                fprintf(stderr, "bench-ofi-rma: bad --duration %s\n", optarg);
                return -1;
            }
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench-ofi-rma: unexpected argument %s\n", argv[optind]);
        return -1;
    }
    char fallback[8];
    snprintf(fallback, sizeof(fallback), "%s", o->latency ? "8" : "64k");
    if (parse_sizes(sizes ? sizes : fallback, o) != 0) {
        fprintf(stderr, "bench-ofi-rma: bad --block-size (sizes > 0, at most %d)\n", MAX_SIZES);
        return -1;
    }
    if (o->latency)
        o->batch = 1;
    return 0;
}

int main(int argc, char **argv)
{
    options_t o;
    if (parse_options(argc, argv, &o) != 0)
        return 2;
    size_t length = 0, max_block = 0;
    for (unsigned i = 0; i < o.n_sizes; i++) {
        size_t b = buffer_for(&o, o.sizes[i]);
        length = b > length ? b : length;
        max_block = o.sizes[i] > max_block ? o.sizes[i] : max_block;
    }
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) {
        perror("bench-ofi-rma: socketpair");
        return 1;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("bench-ofi-rma: fork");
        return 1;
    }
    if (pid == 0) {
        close(pair[0]);
        _exit(run_target(&o, length, pair[1]) == 0 ? 0 : 1);
    }
    close(pair[1]);
    signal(SIGCHLD, on_target_exit);
    signal(SIGALRM, on_alarm);
    alarm((unsigned)(o.duration * o.n_sizes) + 60 + (unsigned)(length >> 24));
    int rc = run_initiator(&o, length, max_block, pair[0]);
    initiator_done = 1;
    close(pair[0]); /* the target sees the hang-up and closes */
    int wstatus = 0;
    if (waitpid(pid, &wstatus, 0) != pid || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
        fprintf(stderr, "bench-ofi-rma: the target failed\n");
        rc = -1;
    }
    return rc == 0 ? 0 : 1;
}
