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
 * CQs with a wait object stay the provider's own: fi_trywait hands them to
 * the provider's utility code, which would take a wrapper for its own.
 */
#include "ofi_mr_shim_impl.h"

#include <unistd.h>

atomic_ulong count_guarded_cq_reads;

typedef struct shim_cq {
    struct fid_cq cq;
    struct fid_cq *real;
    atomic_int inside; /* readers inside a read now */
    unsigned read_us;  /* FERRY_TEST_OFI_CQ_READ_US */
} shim_cq_t;

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
    ssize_t ret = c->real->ops->read(c->real, buf, count);
    reader_leave(c);
    return ret;
}

static ssize_t cq_readfrom(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src)
{
    shim_cq_t *c = (shim_cq_t *)cq;
    reader_enter(c);
    ssize_t ret = c->real->ops->readfrom(c->real, buf, count, src);
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
    c->real = real;
    c->read_us = read_us != NULL ? (unsigned)strtoul(read_us, NULL, 10) : 0;
    atomic_init(&c->inside, 0);
    c->cq.fid.fclass = FI_CLASS_CQ;
    c->cq.fid.context = context;
    c->cq.fid.ops = &cq_fid_ops;
    c->cq.ops = &cq_ops;
    *cq_p = &c->cq;
    return 0;
}

struct fid *shim_cq_real_fid(struct fid *fid)
{
    if (fid != NULL && fid->ops == &cq_fid_ops)
        return &((shim_cq_t *)fid)->real->fid;
    return fid;
}
