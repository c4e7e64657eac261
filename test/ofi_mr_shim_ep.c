/*
 * The MR-mode stand-in's endpoints (see ofi_mr_shim.c): every call is
 * forwarded to the real provider's endpoint, and each RMA is checked
 * against the modes its domain demands first (local desc, raw key mapping,
 * offsets), then posted with the real desc, key and address.
 */
#include "ofi_mr_shim_impl.h"

/* ---- endpoint ---- */

static int ep_close(struct fid *fid)
{
    shim_ep_t *ep = (shim_ep_t *)fid;
    shim_domain_t *d = ep->domain;
    int ret = fi_close(&ep->real->fid);
    if (ret != 0)
        return ret;
    /* Its MRs die with it: a key of one names nothing any more. */
    pthread_mutex_lock(&d->lock);
    for (shim_mr_t *m = d->mrs; m != NULL; m = m->next)
        if (m->bound_ep == ep->serial && m->real != NULL) {
            fi_close(&m->real->fid);
            m->real = NULL;
            m->killed = 1;
        }
    pthread_mutex_unlock(&d->lock);
    free(ep);
    return 0;
}

static int ep_bind(struct fid *fid, struct fid *bfid, uint64_t flags)
{
    shim_ep_t *ep = (shim_ep_t *)fid;
    if (bfid != NULL && bfid->fclass == FI_CLASS_CQ && (flags & FI_TRANSMIT))
        ep->cq = bfid;
    return ep->real->fid.ops->bind(&ep->real->fid, shim_cq_real_fid(bfid), flags);
}

static int ep_control(struct fid *fid, int command, void *arg)
{
    shim_ep_t *ep = (shim_ep_t *)fid;
    return ep->real->fid.ops->control(&ep->real->fid, command, arg);
}

static int ep_ops_open(struct fid *fid, const char *name, uint64_t flags, void **ops, void *context)
{
    shim_ep_t *ep = (shim_ep_t *)fid;
    return ep->real->fid.ops->ops_open(&ep->real->fid, name, flags, ops, context);
}

struct fi_ops shim_ep_fid_ops = {
    .size = sizeof(struct fi_ops),
    .close = ep_close,
    .bind = ep_bind,
    .control = ep_control,
    .ops_open = ep_ops_open,
    .tostr = shim_no_tostr,
    .ops_set = shim_no_ops_set,
};

static ssize_t ep_cancel(fid_t fid, void *context)
{
    return fi_cancel(&((shim_ep_t *)fid)->real->fid, context);
}

static int ep_getopt(fid_t fid, int level, int optname, void *optval, size_t *optlen)
{
    return fi_getopt(&((shim_ep_t *)fid)->real->fid, level, optname, optval, optlen);
}

static int ep_setopt(fid_t fid, int level, int optname, const void *optval, size_t optlen)
{
    return fi_setopt(&((shim_ep_t *)fid)->real->fid, level, optname, optval, optlen);
}

static int no_tx_ctx(struct fid_ep *sep, int index, struct fi_tx_attr *attr, struct fid_ep **tx_ep,
                     void *context)
{
    (void)sep, (void)index, (void)attr, (void)tx_ep, (void)context;
    return -FI_ENOSYS;
}

static int no_rx_ctx(struct fid_ep *sep, int index, struct fi_rx_attr *attr, struct fid_ep **rx_ep,
                     void *context)
{
    (void)sep, (void)index, (void)attr, (void)rx_ep, (void)context;
    return -FI_ENOSYS;
}

static ssize_t ep_rx_size_left(struct fid_ep *ep)
{
    struct fid_ep *real = ((shim_ep_t *)ep)->real;
    return real->ops->rx_size_left(real);
}

static ssize_t ep_tx_size_left(struct fid_ep *ep)
{
    struct fid_ep *real = ((shim_ep_t *)ep)->real;
    return real->ops->tx_size_left(real);
}

static struct fi_ops_ep ep_ops = {
    .size = sizeof(struct fi_ops_ep),
    .cancel = ep_cancel,
    .getopt = ep_getopt,
    .setopt = ep_setopt,
    .tx_ctx = no_tx_ctx,
    .rx_ctx = no_rx_ctx,
    .rx_size_left = ep_rx_size_left,
    .tx_size_left = ep_tx_size_left,
};

static int ep_setname(fid_t fid, void *addr, size_t addrlen)
{
    return fi_setname(&((shim_ep_t *)fid)->real->fid, addr, addrlen);
}

static int ep_getname(fid_t fid, void *addr, size_t *addrlen)
{
    return fi_getname(&((shim_ep_t *)fid)->real->fid, addr, addrlen);
}

static int ep_getpeer(struct fid_ep *ep, void *addr, size_t *addrlen)
{
    return fi_getpeer(((shim_ep_t *)ep)->real, addr, addrlen);
}

static int no_connect(struct fid_ep *ep, const void *addr, const void *param, size_t len)
{
    (void)ep, (void)addr, (void)param, (void)len;
    return -FI_ENOSYS;
}

static int no_listen(struct fid_pep *pep)
{
    (void)pep;
    return -FI_ENOSYS;
}

static int no_accept(struct fid_ep *ep, const void *param, size_t len)
{
    (void)ep, (void)param, (void)len;
    return -FI_ENOSYS;
}

static int no_reject(struct fid_pep *pep, fid_t handle, const void *param, size_t len)
{
    (void)pep, (void)handle, (void)param, (void)len;
    return -FI_ENOSYS;
}

static int no_shutdown(struct fid_ep *ep, uint64_t flags)
{
    (void)ep, (void)flags;
    return -FI_ENOSYS;
}

static int no_join(struct fid_ep *ep, const void *addr, uint64_t flags, struct fid_mc **mc,
                   void *context)
{
    (void)ep, (void)addr, (void)flags, (void)mc, (void)context;
    return -FI_ENOSYS;
}

static struct fi_ops_cm ep_cm_ops = {
    .size = sizeof(struct fi_ops_cm),
    .setname = ep_setname,
    .getname = ep_getname,
    .getpeer = ep_getpeer,
    .connect = no_connect,
    .listen = no_listen,
    .accept = no_accept,
    .reject = no_reject,
    .shutdown = no_shutdown,
    .join = no_join,
};

/* The local desc of an operation on ep over [buf, buf + len): the real
 * provider's desc, or -FI_EINVAL after a shim_violation (caller: d->lock held). */
static int local_desc(shim_ep_t *ep, void *desc, const void *buf, size_t len, uint64_t access,
                      const char *what, void **real_desc_p)
{
    shim_domain_t *d = ep->domain;
    shim_mr_t *m = d->mrs;
    while (m != NULL && (void *)m != desc)
        m = m->next;
    *real_desc_p = m != NULL && m->real != NULL ? fi_mr_desc(m->real) : NULL;
    if (!(d->mode & FI_MR_LOCAL))
        return 0;
    atomic_fetch_add(&count_local_checked, 1);
    uintptr_t start = (uintptr_t)buf;
    if (m == NULL) {
        shim_violation("%s: local desc %p is no live MR (FI_MR_LOCAL)", what, desc);
        return -FI_EINVAL;
    }
    if (m->real == NULL) {
        shim_violation("%s: local MR %s", what, m->killed ? "of a closed endpoint" : "not enabled");
        return -FI_EINVAL;
    }
    if ((d->mode & FI_MR_ENDPOINT) && m->bound_ep != ep->serial) {
        shim_violation("%s: local MR bound to another endpoint (FI_MR_ENDPOINT)", what);
        return -FI_EINVAL;
    }
    if (start < m->start || len > m->length || start - m->start > m->length - len) {
        shim_violation("%s: %zu bytes at %#lx outside the local MR [%#lx, +%zu)", what, len,
                       (unsigned long)start, (unsigned long)m->start, m->length);
        return -FI_EINVAL;
    }
    if (!(m->access & access)) {
        shim_violation("%s: local MR without %s access", what,
                       access == FI_WRITE ? "write" : "read");
        return -FI_EINVAL;
    }
    return 0;
}

/* The real key and address of a remote iov (caller: d->lock held). */
static int remote_iov(shim_domain_t *d, const struct fi_rma_iov *iov, const char *what,
                      struct fi_rma_iov *real_p)
{
    *real_p = *iov;
    uint64_t start = 0;
    int have_start = 0;
    if (d->mode & FI_MR_RAW) {
        raw_mapping_t *m = d->mappings;
        while (m != NULL && m->mapped != iov->key)
            m = m->next;
        if (m == NULL) {
            shim_violation("%s: key %#llx is no fi_mr_map_raw key (FI_MR_RAW)", what,
                           (unsigned long long)iov->key);
            return -FI_EINVAL;
        }
        real_p->key = m->real_key;
        start = m->start;
        have_start = 1;
    } else if (d->mode & FI_MR_PROV_KEY) {
        if (iov->key == FI_KEY_NOTAVAIL || (iov->key >> ADDRESS_BITS) == 0) {
            shim_violation("%s: key %#llx is not one the provider gave (FI_MR_PROV_KEY)", what,
                           (unsigned long long)iov->key);
            return -FI_EINVAL;
        }
        start = iov->key & ADDRESS_MASK;
        have_start = 1;
    }
    if (!(d->mode & FI_MR_VIRT_ADDR) && (d->real_mode & FI_MR_VIRT_ADDR)) {
        if (!have_start) {
            shim_violation("%s: offset addressing with no start known", what);
            return -FI_EINVAL;
        }
        /* An address given where an offset is due lands past the MR: the
         * real provider refuses it (its key check covers the range). */
        real_p->addr = start + iov->addr;
        atomic_fetch_add(&count_offsets, 1);
    }
    return 0;
}

#define MAX_IOV 4

static ssize_t rma_msg(struct fid_ep *fep, const struct fi_msg_rma *msg, uint64_t flags, int write)
{
    shim_ep_t *ep = (shim_ep_t *)fep;
    shim_domain_t *d = ep->domain;
    const char *what = write ? "fi_writemsg" : "fi_readmsg";
    if (msg->iov_count > MAX_IOV || msg->rma_iov_count > MAX_IOV)
        return -FI_EINVAL;
    void *descs[MAX_IOV];
    struct fi_rma_iov rma[MAX_IOV];
    struct fi_msg_rma real = *msg;
    atomic_fetch_add(&count_rma, 1);
    pthread_mutex_lock(&d->lock);
    int ret = 0;
    for (size_t i = 0; ret == 0 && i < msg->iov_count; i++)
        ret = local_desc(ep, msg->desc != NULL ? msg->desc[i] : NULL, msg->msg_iov[i].iov_base,
                         msg->msg_iov[i].iov_len, write ? FI_WRITE : FI_READ, what, &descs[i]);
    for (size_t i = 0; ret == 0 && i < msg->rma_iov_count; i++)
        ret = remote_iov(d, &msg->rma_iov[i], what, &rma[i]);
    pthread_mutex_unlock(&d->lock);
    if (ret != 0)
        return ret;
    real.desc = descs;
    real.rma_iov = rma;
    if (!write)
        return fi_readmsg(ep->real, &real, flags);
    size_t length = 0;
    for (size_t i = 0; i < msg->iov_count; i++)
        length += msg->msg_iov[i].iov_len;
    /* noted before the post: its completion can be read before it returns */
    int silenced = shim_cq_silence(ep->cq, msg->context, length);
    ssize_t posted = fi_writemsg(ep->real, &real, flags);
    if (posted != 0 && silenced)
        shim_cq_unsilence(ep->cq, msg->context);
    return posted;
}

static ssize_t ep_readmsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags)
{
    return rma_msg(ep, msg, flags, 0);
}

static ssize_t ep_writemsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags)
{
    return rma_msg(ep, msg, flags, 1);
}

/* The short forms, through the checked message form (the ep's op_flags
 * are what the short forms use: FI_COMPLETION where asked at bind). */
static ssize_t ep_read(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src,
                       uint64_t addr, uint64_t key, void *context)
{
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct fi_rma_iov rma = {.addr = addr, .len = len, .key = key};
    struct fi_msg_rma msg = {.msg_iov = &iov,
                             .desc = &desc,
                             .iov_count = 1,
                             .addr = src,
                             .rma_iov = &rma,
                             .rma_iov_count = 1,
                             .context = context};
    return rma_msg(ep, &msg, FI_COMPLETION, 0);
}

static ssize_t ep_write(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest,
                        uint64_t addr, uint64_t key, void *context)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct fi_rma_iov rma = {.addr = addr, .len = len, .key = key};
    struct fi_msg_rma msg = {.msg_iov = &iov,
                             .desc = &desc,
                             .iov_count = 1,
                             .addr = dest,
                             .rma_iov = &rma,
                             .rma_iov_count = 1,
                             .context = context};
    return rma_msg(ep, &msg, FI_COMPLETION, 1);
}

static ssize_t no_readv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count,
                        fi_addr_t src, uint64_t addr, uint64_t key, void *context)
{
    (void)ep, (void)iov, (void)desc, (void)count, (void)src, (void)addr, (void)key;
    (void)context;
    return -FI_ENOSYS;
}

static ssize_t no_writev(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count,
                         fi_addr_t dest, uint64_t addr, uint64_t key, void *context)
{
    (void)ep, (void)iov, (void)desc, (void)count, (void)dest, (void)addr, (void)key;
    (void)context;
    return -FI_ENOSYS;
}

static ssize_t no_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest,
                         uint64_t addr, uint64_t key)
{
    (void)ep, (void)buf, (void)len, (void)dest, (void)addr, (void)key;
    return -FI_ENOSYS;
}

static ssize_t no_writedata(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                            uint64_t data, fi_addr_t dest, uint64_t addr, uint64_t key,
                            void *context)
{
    (void)ep, (void)buf, (void)len, (void)desc, (void)data, (void)dest, (void)addr, (void)key;
    (void)context;
    return -FI_ENOSYS;
}

static ssize_t no_injectdata(struct fid_ep *ep, const void *buf, size_t len, uint64_t data,
                             fi_addr_t dest, uint64_t addr, uint64_t key)
{
    (void)ep, (void)buf, (void)len, (void)data, (void)dest, (void)addr, (void)key;
    return -FI_ENOSYS;
}

static struct fi_ops_rma ep_rma_ops = {
    .size = sizeof(struct fi_ops_rma),
    .read = ep_read,
    .readv = no_readv,
    .readmsg = ep_readmsg,
    .write = ep_write,
    .writev = no_writev,
    .writemsg = ep_writemsg,
    .inject = no_inject,
    .writedata = no_writedata,
    .injectdata = no_injectdata,
};

int shim_endpoint_open(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep_p,
                       void *context)
{
    shim_domain_t *d = (shim_domain_t *)domain;
    shim_ep_t *ep = calloc(1, sizeof(*ep));
    if (ep == NULL)
        return -FI_ENOMEM;
    struct fi_info *real = shim_real_info(info, d->real_mode);
    if (real == NULL) {
        free(ep);
        return -FI_ENOMEM;
    }
    int ret = fi_endpoint(d->real, real, &ep->real, context);
    fi_freeinfo(real);
    if (ret != 0) {
        free(ep);
        return ret;
    }
    ep->domain = d;
    pthread_mutex_lock(&d->lock);
    ep->serial = ++d->next_serial;
    pthread_mutex_unlock(&d->lock);
    ep->ep.fid = ep->real->fid;
    ep->ep.fid.ops = &shim_ep_fid_ops;
    ep->ep.ops = &ep_ops;
    ep->ep.cm = &ep_cm_ops;
    ep->ep.rma = &ep_rma_ops;
    /* Messages, tagged, atomics, collectives: the module uses none, and a
     * call would need the real endpoint; NULL makes a misuse plain. */
    *ep_p = &ep->ep;
    return 0;
}
