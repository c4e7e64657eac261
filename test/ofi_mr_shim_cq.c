/*
 * The shim's guard on completion queues without a wait object (the ofi
 * module's lanes): the module promises one reader at a time per lane CQ
 * (its claim, src/transport/ofi/ofi.h "Lane references"), and that the
 * fence and stop close or drain a CQ only once no reader is inside it.
 * Debian's providers read such a CQ under FI_THREAD_SAFE locks of their
 * own, so a broken promise shows nowhere until a provider that trusts it
 * (FI_THREAD_DOMAIN hardware) frees a CQ under a reader.  The guard counts
 * the readers inside each read: a second one at once, or a close while one
 * is inside, is a shim_violation.
 *
 * FERRY_TEST_OFI_CQ_READ_US (read at each open) keeps every guarded read
 * inside the CQ that many microseconds before it returns, so that a fence
 * meets readers there (a real read takes well under one).
 *
 * FERRY_TEST_OFI_SILENCE_LENGTH (read at each open) makes the CQ swallow
 * the completion of every write of exactly that many bytes posted on an
 * endpoint bound to it: the write lands, the engine never hears of it.
 * That is a peer that stopped answering, as the module sees it, with the
 * peer still serving: a stopped shm peer stands in badly, as libfabric
 * 1.17's shm posts spin for good on a lock in the region of a peer stopped
 * while it holds it (src/transport/ofi/README.md, "Faults").
 *
 * CQs with a wait object stay the provider's own: fi_trywait hands them to
 * the provider's utility code, which would take a wrapper for its own.
 */
#include "ofi_mr_shim_impl.h"

#include <unistd.h>

atomic_ulong count_guarded_cq_reads, count_silenced;

enum { SILENCED_MAX = 1024 }; /* writes posted and not yet swallowed */

typedef struct shim_cq {
    struct fid_cq cq;
    struct fid_cq *real;
    atomic_int inside;     /* readers inside a read now */
    unsigned read_us;      /* FERRY_TEST_OFI_CQ_READ_US */
    size_t entry_size;     /* of the CQ's format; 0: not one we can sift */
    size_t silence_length; /* FERRY_TEST_OFI_SILENCE_LENGTH; 0: none */
    pthread_mutex_t silence_lock;
    void *silenced[SILENCED_MAX]; /* the contexts of writes to swallow */
    atomic_uint silenced_count;
} shim_cq_t;

static shim_cq_t *guarded(struct fid *fid);

int shim_cq_silence(struct fid *cq, void *context, size_t length)
{
    shim_cq_t *c = guarded(cq);
    if (c == NULL || c->silence_length == 0 || length != c->silence_length || context == NULL)
        return 0;
    pthread_mutex_lock(&c->silence_lock);
    unsigned n = atomic_load(&c->silenced_count);
    int noted = n < SILENCED_MAX;
    if (noted) {
        c->silenced[n] = context;
        atomic_store(&c->silenced_count, n + 1);
    }
    pthread_mutex_unlock(&c->silence_lock);
    if (!noted)
        shim_violation("more than %d silenced writes posted at once", SILENCED_MAX);
    return noted;
}

/* Whether context was noted for silence; forgets it. */
static int take_silenced(shim_cq_t *c, void *context)
{
    int found = 0;
    pthread_mutex_lock(&c->silence_lock);
    unsigned n = atomic_load(&c->silenced_count);
    for (unsigned i = 0; i < n && !found; i++) {
        if (c->silenced[i] == context) {
            c->silenced[i] = c->silenced[n - 1];
            atomic_store(&c->silenced_count, n - 1);
            found = 1;
        }
    }
    pthread_mutex_unlock(&c->silence_lock);
    return found;
}

void shim_cq_unsilence(struct fid *cq, void *context)
{
    shim_cq_t *c = guarded(cq);
    if (c != NULL)
        take_silenced(c, context);
}

/* The n entries read less the silenced ones (src, when given, kept in
 * step); -FI_EAGAIN when none is left.  Every format begins with
 * op_context. */
static ssize_t sift(shim_cq_t *c, void *buf, fi_addr_t *src, ssize_t n)
{
    if (n <= 0 || atomic_load(&c->silenced_count) == 0)
        return n;
    char *entries = buf;
    ssize_t kept = 0;
    for (ssize_t i = 0; i < n; i++) {
        char *entry = entries + (size_t)i * c->entry_size;
        if (take_silenced(c, ((struct fi_cq_entry *)entry)->op_context)) {
            atomic_fetch_add(&count_silenced, 1);
            continue;
        }
        if (kept != i) {
            memmove(entries + (size_t)kept * c->entry_size, entry, c->entry_size);
            if (src != NULL)
                src[kept] = src[i];
        }
        kept++;
    }
    return kept != 0 ? kept : -FI_EAGAIN;
}

static void reader_enter(shim_cq_t *c)
{
    if (atomic_fetch_add(&c->inside, 1) != 0)
        shim_violation("two readers inside one lane CQ at once");
    atomic_fetch_add(&count_guarded_cq_reads, 1);
    if (c->read_us != 0)
        usleep(c->read_us);
}

static void reader_leave(shim_cq_t *c)
{
    atomic_fetch_sub(&c->inside, 1);
}

static ssize_t cq_read(struct fid_cq *cq, void *buf, size_t count)
{
    shim_cq_t *c = (shim_cq_t *)cq;
    reader_enter(c);
    ssize_t ret = sift(c, buf, NULL, c->real->ops->read(c->real, buf, count));
    reader_leave(c);
    return ret;
}

static ssize_t cq_readfrom(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src)
{
    shim_cq_t *c = (shim_cq_t *)cq;
    reader_enter(c);
    ssize_t ret = sift(c, buf, src, c->real->ops->readfrom(c->real, buf, count, src));
    reader_leave(c);
    return ret;
}

static ssize_t cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags)
{
    shim_cq_t *c = (shim_cq_t *)cq;
    reader_enter(c);
    ssize_t ret = c->real->ops->readerr(c->real, buf, flags);
    reader_leave(c);
    return ret;
}

static ssize_t cq_sread(struct fid_cq *cq, void *buf, size_t count, const void *cond,
                        int timeout)
{
    shim_cq_t *c = (shim_cq_t *)cq;
    return c->real->ops->sread(c->real, buf, count, cond, timeout);
}

static ssize_t cq_sreadfrom(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src,
                            const void *cond, int timeout)
{
    shim_cq_t *c = (shim_cq_t *)cq;
    return c->real->ops->sreadfrom(c->real, buf, count, src, cond, timeout);
}

static int cq_signal(struct fid_cq *cq)
{
    shim_cq_t *c = (shim_cq_t *)cq;
    return c->real->ops->signal(c->real);
}

static const char *cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data,
                               char *buf, size_t len)
{
    shim_cq_t *c = (shim_cq_t *)cq;
    return c->real->ops->strerror(c->real, prov_errno, err_data, buf, len);
}

static struct fi_ops_cq cq_ops = {
    .size = sizeof(struct fi_ops_cq),
    .read = cq_read,
    .readfrom = cq_readfrom,
    .readerr = cq_readerr,
    .sread = cq_sread,
    .sreadfrom = cq_sreadfrom,
    .signal = cq_signal,
    .strerror = cq_strerror,
};

static int cq_close(struct fid *fid)
{
    shim_cq_t *c = (shim_cq_t *)fid;
    if (atomic_load(&c->inside) != 0)
        shim_violation("fi_close of a lane CQ with a reader inside it");
    int ret = fi_close(&c->real->fid);
    pthread_mutex_destroy(&c->silence_lock);
    free(c);
    return ret;
}

static int cq_bind(struct fid *fid, struct fid *bfid, uint64_t flags)
{
    shim_cq_t *c = (shim_cq_t *)fid;
    return c->real->fid.ops->bind(&c->real->fid, bfid, flags);
}

static int cq_control(struct fid *fid, int command, void *arg)
{
    shim_cq_t *c = (shim_cq_t *)fid;
    return c->real->fid.ops->control(&c->real->fid, command, arg);
}

static int cq_ops_open(struct fid *fid, const char *name, uint64_t flags, void **ops,
                       void *context)
{
    shim_cq_t *c = (shim_cq_t *)fid;
    return c->real->fid.ops->ops_open(&c->real->fid, name, flags, ops, context);
}

static struct fi_ops cq_fid_ops = {
    .size = sizeof(struct fi_ops),
    .close = cq_close,
    .bind = cq_bind,
    .control = cq_control,
    .ops_open = cq_ops_open,
    .tostr = shim_no_tostr,
    .ops_set = shim_no_ops_set,
};

static size_t entry_size(enum fi_cq_format format)
{
    switch (format) {
    case FI_CQ_FORMAT_CONTEXT:
        return sizeof(struct fi_cq_entry);
    case FI_CQ_FORMAT_MSG:
        return sizeof(struct fi_cq_msg_entry);
    case FI_CQ_FORMAT_DATA:
        return sizeof(struct fi_cq_data_entry);
    case FI_CQ_FORMAT_TAGGED:
        return sizeof(struct fi_cq_tagged_entry);
    default:
        return 0; /* FI_CQ_FORMAT_UNSPEC: the provider's choice */
    }
}

int shim_cq_open(struct fid_domain *real_domain, struct fi_cq_attr *attr, struct fid_cq **cq_p,
                 void *context)
{
    struct fid_cq *real = NULL;
    int ret = fi_cq_open(real_domain, attr, &real, context);
    if (ret != 0 || attr == NULL || attr->wait_obj != FI_WAIT_NONE) {
        *cq_p = real;
        return ret;
    }
    shim_cq_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        fi_close(&real->fid);
        return -FI_ENOMEM;
    }
    const char *read_us = getenv("FERRY_TEST_OFI_CQ_READ_US");
    const char *silence = getenv("FERRY_TEST_OFI_SILENCE_LENGTH");
    c->real = real;
    c->read_us = read_us != NULL ? (unsigned)strtoul(read_us, NULL, 10) : 0;
    c->entry_size = entry_size(attr->format);
    c->silence_length = silence != NULL ? strtoull(silence, NULL, 10) : 0;
    if (c->silence_length != 0 && c->entry_size == 0) {
        shim_violation("FERRY_TEST_OFI_SILENCE_LENGTH on a CQ of format %d", (int)attr->format);
        c->silence_length = 0;
    }
    pthread_mutex_init(&c->silence_lock, NULL);
    atomic_init(&c->silenced_count, 0);
    atomic_init(&c->inside, 0);
    c->cq.fid.fclass = FI_CLASS_CQ;
    c->cq.fid.context = context;
    c->cq.fid.ops = &cq_fid_ops;
    c->cq.ops = &cq_ops;
    *cq_p = &c->cq;
    return 0;
}

static shim_cq_t *guarded(struct fid *fid)
{
    return fid != NULL && fid->ops == &cq_fid_ops ? (shim_cq_t *)fid : NULL;
}

struct fid *shim_cq_real_fid(struct fid *fid)
{
    shim_cq_t *c = guarded(fid);
    return c != NULL ? &c->real->fid : fid;
}
