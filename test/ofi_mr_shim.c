/*
 * A stand-in for the libfabric providers that demand memory-registration
 * modes Debian's 1.17 providers never ask for (EFA, verbs;ofi_rxm, cxi,
 * opx do): an LD_PRELOAD library that makes tcp;ofi_rxm and shm return
 * those modes from fi_getinfo and then holds the ofi module to them, while
 * the real provider underneath still moves the bytes between processes.
 *
 * FERRY_TEST_OFI_MR_MODE (read at each fi_getinfo) lists what to demand,
 * comma-separated:
 *   local     FI_MR_LOCAL: each fi_writemsg/fi_readmsg's local desc must be
 *             the fi_mr_desc of a live MR of this domain that covers the
 *             local buffer with the access the operation needs.
 *   endpoint  FI_MR_ENDPOINT: an MR exists for the real provider only after
 *             fi_mr_bind to an endpoint and fi_mr_enable (before that its
 *             key names nothing at the target), and as a local desc it is
 *             accepted only on that endpoint.  Closing the endpoint kills
 *             the MRs bound to it.
 *   raw       FI_MR_RAW: fi_mr_key is FI_KEY_NOTAVAIL; the key travels as
 *             fi_mr_raw_attr's bytes and an operation must use the key that
 *             fi_mr_map_raw gave, until fi_mr_unmap_key; fi_mr_map_raw
 *             must get the base fi_mr_raw_attr gave (0 with offsets).
 *   prov_key  FI_MR_PROV_KEY: the shim picks keys (never the requested one).
 *   offset    no FI_MR_VIRT_ADDR: remote addresses are offsets from the
 *             registered start.  Over a provider that addresses by virtual
 *             address (shm) the shim adds the registered start back; it
 *             learns it from the key, so there offset implies prov_key
 *             (unless raw, whose bytes carry it).
 * A violation fails the operation with -FI_EINVAL and logs one line
 * ("ofi-mr-shim: ...") on stderr, and in FERRY_TEST_OFI_MR_VIOLATIONS/<pid>
 * where that folder is set (the test's view of its peers).  What the shim saw is counted
 * (ferry_ofi_mr_shim_count) so that a test can tell the modes were used.
 *
 * Why a preloaded library and not an external provider (FI_PROVIDER_PATH):
 * a provider that layers over tcp;ofi_rxm or shm needs libfabric's private
 * utility headers (ofi_util.h, the hook framework), which Debian does not
 * install; the public fid tables are all a wrapper needs.  The ofi module
 * calls fi_getinfo and fi_fabric through its normal link, so preloading
 * them reaches it; every other call goes through the fid tables wrapped
 * here.
 *
 * Object wrappers: fabric -> domain -> endpoint and MR are ours (their
 * calls are checked or forwarded with the real object); AV, CQ, counter
 * are the real provider's (nothing to enforce there).  Lifetimes: each
 * wrapper owns its real object and closes it in its close; a domain
 * outlives its endpoints and MRs (the caller's order, as libfabric's).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ofi_mr_shim.h"

#define SHIM_EXPORT    __attribute__((visibility("default")))
#define RAW_MAGIC      "FMRSHIM1"
#define RAW_SIZE       32              /* magic, real key, registered start, base */
#define MAPPED_KEY_TAG (0xb5ULL << 56) /* keys fi_mr_map_raw hands out */
#define ADDRESS_BITS   48              /* user addresses on x86-64 and arm64 */
#define ADDRESS_MASK   ((1ULL << ADDRESS_BITS) - 1)

/* What the shim saw, for tests (ferry_ofi_mr_shim_count). */
static atomic_ulong count_local_checked, count_bound, count_raw_mapped, count_offsets,
    count_prov_keys, count_violations, count_rma;

/* ---- modes ---- */

/* The real provider's mr_mode, per provider name, as fi_getinfo saw it:
 * fi_domain and fi_endpoint get infos carrying the demanded mode and hand
 * the real provider its own. */
#define MAX_PROVIDERS 32
static pthread_mutex_t real_modes_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char name[64];
    int mode;
} real_modes[MAX_PROVIDERS];

static void real_mode_remember(const char *name, int mode)
{
    pthread_mutex_lock(&real_modes_lock);
    for (int i = 0; i < MAX_PROVIDERS; i++)
        if (real_modes[i].name[0] == '\0' || strcmp(real_modes[i].name, name) == 0) {
            snprintf(real_modes[i].name, sizeof(real_modes[i].name), "%s", name);
            real_modes[i].mode = mode;
            break;
        }
    pthread_mutex_unlock(&real_modes_lock);
}

static int real_mode_of(const char *name, int fallback)
{
    int mode = fallback;
    pthread_mutex_lock(&real_modes_lock);
    for (int i = 0; i < MAX_PROVIDERS && real_modes[i].name[0] != '\0'; i++)
        if (strcmp(real_modes[i].name, name) == 0)
            mode = real_modes[i].mode;
    pthread_mutex_unlock(&real_modes_lock);
    return mode;
}

static unsigned violations_logged;

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...)
{
    atomic_fetch_add(&count_violations, 1);
    if (__atomic_fetch_add(&violations_logged, 1, __ATOMIC_RELAXED) >= 20)
        return; /* a broken module would flood the log: the count says the rest */
    char line[256];
    va_list args;
    va_start(args, fmt);
    vsnprintf(line, sizeof(line), fmt, args);
    va_end(args);
    fprintf(stderr, "ofi-mr-shim: %s\n", line);
    /* Peers' stderr is nobody's to read: the test reads this folder. */
    const char *folder = getenv("FERRY_TEST_OFI_MR_VIOLATIONS");
    if (folder == NULL || folder[0] == '\0')
        return;
    char path[512];
    snprintf(path, sizeof(path), "%s/%ld", folder, (long)getpid());
    FILE *file = fopen(path, "a");
    if (file != NULL) {
        fprintf(file, "%s\n", line);
        fclose(file);
    }
}

/* FERRY_TEST_OFI_MR_MODE as mr_mode bits to add; *offset_p: remove VIRT_ADDR. */
static int demanded_mode(int *offset_p)
{
    const char *text = getenv("FERRY_TEST_OFI_MR_MODE");
    int mode = 0;
    *offset_p = 0;
    if (text == NULL)
        return 0;
    char copy[256];
    snprintf(copy, sizeof(copy), "%s", text);
    char *save = NULL;
    for (char *word = strtok_r(copy, ", ", &save); word; word = strtok_r(NULL, ", ", &save)) {
        if (strcmp(word, "local") == 0)
            mode |= FI_MR_LOCAL;
        else if (strcmp(word, "endpoint") == 0)
            mode |= FI_MR_ENDPOINT;
        else if (strcmp(word, "raw") == 0)
            mode |= FI_MR_RAW;
        else if (strcmp(word, "prov_key") == 0)
            mode |= FI_MR_PROV_KEY;
        else if (strcmp(word, "offset") == 0)
            *offset_p = 1;
        else
            fprintf(stderr, "ofi-mr-shim: FERRY_TEST_OFI_MR_MODE: unknown mode '%s'\n", word);
    }
    return mode;
}

/* ---- the interposed entry points ---- */

typedef int (*getinfo_fn)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *,
                          struct fi_info **);
typedef int (*fabric_fn)(struct fi_fabric_attr *, struct fid_fabric **, void *);

/* libfabric's own: after the shim in the global scope, or (the module
 * loads it RTLD_LOCAL, out of RTLD_NEXT's sight) through its handle. */
static void *real_symbol(const char *name)
{
    void *fn = dlsym(RTLD_NEXT, name);
    if (fn == NULL) {
        void *library = dlopen("libfabric.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (library == NULL)
            library = dlopen("libfabric.so.1", RTLD_NOW);
        fn = library != NULL ? dlsym(library, name) : NULL;
    }
    if (fn == NULL)
        fprintf(stderr, "ofi-mr-shim: no libfabric %s after the shim: %s\n", name, dlerror());
    return fn;
}

/* Whether the call comes from libfabric itself: ofi_rxm opens its core
 * provider (tcp) through fi_getinfo and fi_fabric, which reach the shim
 * too; those are the real provider's business and pass untouched. */
static int called_by_libfabric(const void *caller)
{
    Dl_info where;
    return dladdr(caller, &where) != 0 && where.dli_fname != NULL &&
           strstr(where.dli_fname, "libfabric.so") != NULL;
}

SHIM_EXPORT int fi_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
                           const struct fi_info *hints, struct fi_info **info)
{
    getinfo_fn real = (getinfo_fn)real_symbol("fi_getinfo");
    if (real == NULL)
        return -FI_ENOSYS;
    int ret = real(version, node, service, flags, hints, info);
    int offset;
    int add = demanded_mode(&offset);
    if (ret != 0 || (add == 0 && !offset) || called_by_libfabric(__builtin_return_address(0)))
        return ret;
    int honoured = hints != NULL && hints->domain_attr != NULL ? hints->domain_attr->mr_mode : 0;
    struct fi_info **link = info;
    while (*link != NULL) {
        struct fi_info *i = *link;
        int real_mode = i->domain_attr->mr_mode;
        int mode = real_mode | add;
        if (offset && (real_mode & FI_MR_VIRT_ADDR) && !(mode & FI_MR_RAW))
            mode |= FI_MR_PROV_KEY; /* the key carries the start (top of file) */
        if (offset)
            mode &= ~FI_MR_VIRT_ADDR;
        /* A caller that does not offer a mode the provider needs gets no
         * info of it, as from a real provider. */
        int needed = mode & (FI_MR_LOCAL | FI_MR_ENDPOINT | FI_MR_RAW | FI_MR_PROV_KEY);
        if ((honoured & needed) != needed) {
            *link = i->next;
            i->next = NULL;
            fi_freeinfo(i);
            continue;
        }
        real_mode_remember(i->fabric_attr->prov_name, real_mode);
        i->domain_attr->mr_mode = mode;
        link = &i->next;
    }
    if (*info == NULL)
        return -FI_ENODATA;
    return 0;
}

/* ---- fabric ---- */

typedef struct shim_fabric {
    struct fid_fabric fabric; /* first: what the caller holds */
    struct fid_fabric *real;
} shim_fabric_t;

typedef struct shim_domain shim_domain_t;

typedef struct shim_ep {
    struct fid_ep ep;
    struct fid_ep *real;
    shim_domain_t *domain;
    uint64_t serial; /* MRs bound to it name it by serial, not by address */
} shim_ep_t;

typedef struct shim_mr {
    struct fid_mr mr;
    struct fid_mr *real; /* NULL under FI_MR_ENDPOINT until enabled, or killed */
    shim_domain_t *domain;
    uintptr_t start;
    size_t length;
    uint64_t access;
    uint64_t key;      /* the key peers use (real key: the same value) */
    uint64_t bound_ep; /* serial, 0: none */
    int enabled;
    int killed;           /* its endpoint closed */
    struct shim_mr *next; /* domain->mrs */
} shim_mr_t;

typedef struct raw_mapping {
    uint64_t mapped;
    uint64_t real_key;
    uint64_t start;
    struct raw_mapping *next;
} raw_mapping_t;

struct shim_domain {
    struct fid_domain domain;
    struct fid_domain *real;
    int mode;             /* what the caller was told */
    int real_mode;        /* what the provider wants */
    pthread_mutex_t lock; /* mrs, mappings, serials */
    shim_mr_t *mrs;       /* live MRs: a desc is one of them or nothing */
    raw_mapping_t *mappings;
    uint64_t next_serial;
    uint64_t next_prov_key;
};

static int fabric_close(struct fid *fid)
{
    shim_fabric_t *f = (shim_fabric_t *)fid;
    int ret = fi_close(&f->real->fid);
    if (ret == 0)
        free(f);
    return ret;
}

static int fabric_bind(struct fid *fid, struct fid *bfid, uint64_t flags)
{
    shim_fabric_t *f = (shim_fabric_t *)fid;
    return f->real->fid.ops->bind(&f->real->fid, bfid, flags);
}

static int fabric_control(struct fid *fid, int command, void *arg)
{
    shim_fabric_t *f = (shim_fabric_t *)fid;
    return f->real->fid.ops->control(&f->real->fid, command, arg);
}

static int fabric_ops_open(struct fid *fid, const char *name, uint64_t flags, void **ops,
                           void *context)
{
    shim_fabric_t *f = (shim_fabric_t *)fid;
    return f->real->fid.ops->ops_open(&f->real->fid, name, flags, ops, context);
}

static int no_tostr(const struct fid *fid, char *buf, size_t len)
{
    (void)fid, (void)buf, (void)len;
    return -FI_ENOSYS;
}

static int no_ops_set(struct fid *fid, const char *name, uint64_t flags, void *ops, void *ctx)
{
    (void)fid, (void)name, (void)flags, (void)ops, (void)ctx;
    return -FI_ENOSYS;
}

static struct fi_ops fabric_fid_ops = {
    .size = sizeof(struct fi_ops),
    .close = fabric_close,
    .bind = fabric_bind,
    .control = fabric_control,
    .ops_open = fabric_ops_open,
    .tostr = no_tostr,
    .ops_set = no_ops_set,
};

static int domain_open(struct fid_fabric *fabric, struct fi_info *info,
                       struct fid_domain **domain_p, void *context);
static struct fi_ops ep_fid_ops;

static int domain2_open(struct fid_fabric *fabric, struct fi_info *info,
                        struct fid_domain **domain_p, uint64_t flags, void *context)
{
    return flags == 0 ? domain_open(fabric, info, domain_p, context) : -FI_ENOSYS;
}

static int fabric_passive_ep(struct fid_fabric *fabric, struct fi_info *info, struct fid_pep **pep,
                             void *context)
{
    shim_fabric_t *f = (shim_fabric_t *)fabric;
    return fi_passive_ep(f->real, info, pep, context);
}

static int fabric_eq_open(struct fid_fabric *fabric, struct fi_eq_attr *attr, struct fid_eq **eq,
                          void *context)
{
    shim_fabric_t *f = (shim_fabric_t *)fabric;
    return fi_eq_open(f->real, attr, eq, context);
}

static int fabric_wait_open(struct fid_fabric *fabric, struct fi_wait_attr *attr,
                            struct fid_wait **waitset)
{
    shim_fabric_t *f = (shim_fabric_t *)fabric;
    return fi_wait_open(f->real, attr, waitset);
}

/* The fids are the real provider's CQs and counters (not wrapped). */
static int fabric_trywait(struct fid_fabric *fabric, struct fid **fids, int count)
{
    shim_fabric_t *f = (shim_fabric_t *)fabric;
    return fi_trywait(f->real, fids, count);
}

static struct fi_ops_fabric fabric_ops = {
    .size = sizeof(struct fi_ops_fabric),
    .domain = domain_open,
    .passive_ep = fabric_passive_ep,
    .eq_open = fabric_eq_open,
    .wait_open = fabric_wait_open,
    .trywait = fabric_trywait,
    .domain2 = domain2_open,
};

SHIM_EXPORT int fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric_p, void *context)
{
    fabric_fn real = (fabric_fn)real_symbol("fi_fabric");
    if (real == NULL)
        return -FI_ENOSYS;
    if (called_by_libfabric(__builtin_return_address(0)))
        return real(attr, fabric_p, context);
    shim_fabric_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return -FI_ENOMEM;
    int ret = real(attr, &f->real, context);
    if (ret != 0) {
        free(f);
        return ret;
    }
    f->fabric = *f->real;
    f->fabric.fid.ops = &fabric_fid_ops;
    f->fabric.ops = &fabric_ops;
    *fabric_p = &f->fabric;
    return 0;
}

/* ---- domain ---- */

/* A copy of info carrying the real provider's mode (freed by the caller). */
static struct fi_info *real_info(const struct fi_info *info, int real_mode)
{
    struct fi_info *copy = fi_dupinfo(info);
    if (copy != NULL)
        copy->domain_attr->mr_mode = real_mode;
    return copy;
}

static int domain_close(struct fid *fid)
{
    shim_domain_t *d = (shim_domain_t *)fid;
    if (d->mrs != NULL || d->mappings != NULL) {
        violation("domain closed with %s still open", d->mrs ? "MRs" : "raw key mappings");
        return -FI_EBUSY;
    }
    int ret = fi_close(&d->real->fid);
    if (ret != 0)
        return ret;
    while (d->mappings != NULL) {
        raw_mapping_t *m = d->mappings;
        d->mappings = m->next;
        free(m);
    }
    pthread_mutex_destroy(&d->lock);
    free(d);
    return 0;
}

static int domain_bind(struct fid *fid, struct fid *bfid, uint64_t flags)
{
    shim_domain_t *d = (shim_domain_t *)fid;
    return d->real->fid.ops->bind(&d->real->fid, bfid, flags);
}

static int map_raw(shim_domain_t *d, struct fi_mr_map_raw *map)
{
    if (!(d->mode & FI_MR_RAW)) {
        violation("fi_mr_map_raw without FI_MR_RAW");
        return -FI_EINVAL;
    }
    uint64_t real_key, start, base;
    if (map->key_size != RAW_SIZE || memcmp(map->raw_key, RAW_MAGIC, 8) != 0) {
        violation("fi_mr_map_raw: %zu bytes that fi_mr_raw_attr did not give", map->key_size);
        return -FI_EINVAL;
    }
    memcpy(&real_key, map->raw_key + 8, 8);
    memcpy(&start, map->raw_key + 16, 8);
    memcpy(&base, map->raw_key + 24, 8);
    if (map->base_addr != base) {
        violation("fi_mr_map_raw: base %#llx, fi_mr_raw_attr gave %#llx",
                  (unsigned long long)map->base_addr, (unsigned long long)base);
        return -FI_EINVAL;
    }
    raw_mapping_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return -FI_ENOMEM;
    m->real_key = real_key;
    m->start = start;
    pthread_mutex_lock(&d->lock);
    m->mapped = MAPPED_KEY_TAG | ++d->next_serial;
    m->next = d->mappings;
    d->mappings = m;
    pthread_mutex_unlock(&d->lock);
    *map->key = m->mapped;
    atomic_fetch_add(&count_raw_mapped, 1);
    return 0;
}

static int unmap_key(shim_domain_t *d, uint64_t key)
{
    pthread_mutex_lock(&d->lock);
    raw_mapping_t **link = &d->mappings;
    while (*link != NULL && (*link)->mapped != key)
        link = &(*link)->next;
    raw_mapping_t *m = *link;
    if (m != NULL)
        *link = m->next;
    pthread_mutex_unlock(&d->lock);
    if (m == NULL) {
        violation("fi_mr_unmap_key: %#llx was not mapped", (unsigned long long)key);
        return -FI_ENOKEY;
    }
    free(m);
    return 0;
}

static int domain_control(struct fid *fid, int command, void *arg)
{
    shim_domain_t *d = (shim_domain_t *)fid;
    if (command == FI_MAP_RAW_MR)
        return map_raw(d, arg);
    if (command == FI_UNMAP_KEY)
        return unmap_key(d, *(uint64_t *)arg);
    return d->real->fid.ops->control(&d->real->fid, command, arg);
}

static int domain_ops_open(struct fid *fid, const char *name, uint64_t flags, void **ops,
                           void *context)
{
    shim_domain_t *d = (shim_domain_t *)fid;
    return d->real->fid.ops->ops_open(&d->real->fid, name, flags, ops, context);
}

static struct fi_ops domain_fid_ops = {
    .size = sizeof(struct fi_ops),
    .close = domain_close,
    .bind = domain_bind,
    .control = domain_control,
    .ops_open = domain_ops_open,
    .tostr = no_tostr,
    .ops_set = no_ops_set,
};

static int domain_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av,
                          void *context)
{
    return fi_av_open(((shim_domain_t *)domain)->real, attr, av, context);
}

static int domain_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq,
                          void *context)
{
    return fi_cq_open(((shim_domain_t *)domain)->real, attr, cq, context);
}

static int domain_cntr_open(struct fid_domain *domain, struct fi_cntr_attr *attr,
                            struct fid_cntr **cntr, void *context)
{
    return fi_cntr_open(((shim_domain_t *)domain)->real, attr, cntr, context);
}

static int domain_poll_open(struct fid_domain *domain, struct fi_poll_attr *attr,
                            struct fid_poll **pollset)
{
    return fi_poll_open(((shim_domain_t *)domain)->real, attr, pollset);
}

static int no_scalable_ep(struct fid_domain *domain, struct fi_info *info, struct fid_ep **sep,
                          void *context)
{
    (void)domain, (void)info, (void)sep, (void)context;
    return -FI_ENOSYS;
}

static int no_stx_ctx(struct fid_domain *domain, struct fi_tx_attr *attr, struct fid_stx **stx,
                      void *context)
{
    (void)domain, (void)attr, (void)stx, (void)context;
    return -FI_ENOSYS;
}

static int no_srx_ctx(struct fid_domain *domain, struct fi_rx_attr *attr, struct fid_ep **rx_ep,
                      void *context)
{
    (void)domain, (void)attr, (void)rx_ep, (void)context;
    return -FI_ENOSYS;
}

static int no_query_atomic(struct fid_domain *domain, enum fi_datatype datatype, enum fi_op op,
                           struct fi_atomic_attr *attr, uint64_t flags)
{
    (void)domain, (void)datatype, (void)op, (void)attr, (void)flags;
    return -FI_ENOSYS;
}

static int no_query_collective(struct fid_domain *domain, enum fi_collective_op coll,
                               struct fi_collective_attr *attr, uint64_t flags)
{
    (void)domain, (void)coll, (void)attr, (void)flags;
    return -FI_ENOSYS;
}

static int endpoint_open(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep_p,
                         void *context);

static int endpoint2_open(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep_p,
                          uint64_t flags, void *context)
{
    return flags == 0 ? endpoint_open(domain, info, ep_p, context) : -FI_ENOSYS;
}

static struct fi_ops_domain domain_ops = {
    .size = sizeof(struct fi_ops_domain),
    .av_open = domain_av_open,
    .cq_open = domain_cq_open,
    .endpoint = endpoint_open,
    .scalable_ep = no_scalable_ep,
    .cntr_open = domain_cntr_open,
    .poll_open = domain_poll_open,
    .stx_ctx = no_stx_ctx,
    .srx_ctx = no_srx_ctx,
    .query_atomic = no_query_atomic,
    .query_collective = no_query_collective,
    .endpoint2 = endpoint2_open,
};

/* ---- memory registration ---- */

static int mr_regattr(struct fid *fid, const struct fi_mr_attr *attr, uint64_t flags,
                      struct fid_mr **mr_p);

static int mr_reg(struct fid *fid, const void *buf, size_t len, uint64_t access, uint64_t offset,
                  uint64_t requested_key, uint64_t flags, struct fid_mr **mr_p, void *context)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct fi_mr_attr attr = {.mr_iov = &iov,
                              .iov_count = 1,
                              .access = access,
                              .offset = offset,
                              .requested_key = requested_key,
                              .context = context};
    return mr_regattr(fid, &attr, flags, mr_p);
}

static int mr_regv(struct fid *fid, const struct iovec *iov, size_t count, uint64_t access,
                   uint64_t offset, uint64_t requested_key, uint64_t flags, struct fid_mr **mr_p,
                   void *context)
{
    struct fi_mr_attr attr = {.mr_iov = iov,
                              .iov_count = count,
                              .access = access,
                              .offset = offset,
                              .requested_key = requested_key,
                              .context = context};
    return mr_regattr(fid, &attr, flags, mr_p);
}

static struct fi_ops_mr domain_mr_ops = {
    .size = sizeof(struct fi_ops_mr),
    .reg = mr_reg,
    .regv = mr_regv,
    .regattr = mr_regattr,
};

/* Register with the real provider: the MR becomes usable (its key names
 * it at the target, its desc is accepted locally).  Caller: d->lock not held. */
static int mr_make_real(shim_mr_t *m)
{
    struct iovec iov = {.iov_base = (void *)m->start, .iov_len = m->length};
    struct fi_mr_attr attr = {
        .mr_iov = &iov, .iov_count = 1, .access = m->access, .requested_key = m->key};
    struct fid_mr *real = NULL;
    int ret = fi_mr_regattr(m->domain->real, &attr, 0, &real);
    if (ret != 0)
        return ret;
    pthread_mutex_lock(&m->domain->lock); /* other threads' posts look at m->real */
    m->real = real;
    pthread_mutex_unlock(&m->domain->lock);
    m->mr.key = (m->domain->mode & FI_MR_RAW) ? FI_KEY_NOTAVAIL : m->key;
    m->mr.mem_desc = m;
    return 0;
}

static int mr_close(struct fid *fid)
{
    shim_mr_t *m = (shim_mr_t *)fid;
    shim_domain_t *d = m->domain;
    pthread_mutex_lock(&d->lock);
    shim_mr_t **link = &d->mrs;
    while (*link != NULL && *link != m)
        link = &(*link)->next;
    if (*link != NULL)
        *link = m->next;
    struct fid_mr *real = m->real; /* unlinked: no post finds it any more */
    pthread_mutex_unlock(&d->lock);
    int ret = real != NULL ? fi_close(&real->fid) : 0;
    free(m);
    return ret;
}

static int mr_bind(struct fid *fid, struct fid *bfid, uint64_t flags)
{
    shim_mr_t *m = (shim_mr_t *)fid;
    (void)flags;
    if (!(m->domain->mode & FI_MR_ENDPOINT)) {
        violation("fi_mr_bind without FI_MR_ENDPOINT");
        return -FI_EINVAL;
    }
    if (bfid->fclass != FI_CLASS_EP || bfid->ops != &ep_fid_ops || m->enabled) {
        violation("fi_mr_bind: %s", m->enabled ? "already enabled" : "not an endpoint");
        return -FI_EINVAL;
    }
    shim_ep_t *ep = (shim_ep_t *)bfid;
    if (ep->domain != m->domain) {
        violation("fi_mr_bind: an endpoint of another domain");
        return -FI_EINVAL;
    }
    pthread_mutex_lock(&m->domain->lock);
    m->bound_ep = ep->serial;
    pthread_mutex_unlock(&m->domain->lock);
    atomic_fetch_add(&count_bound, 1);
    return 0;
}

static int mr_raw_attr(shim_mr_t *m, struct fi_mr_raw_attr *attr)
{
    if (!(m->domain->mode & FI_MR_RAW) || m->real == NULL) {
        violation("fi_mr_raw_attr %s", m->real ? "without FI_MR_RAW" : "before fi_mr_enable");
        return -FI_EINVAL;
    }
    if (*attr->key_size < RAW_SIZE) {
        *attr->key_size = RAW_SIZE;
        return -FI_ETOOSMALL;
    }
    /* The base peers address the MR from: its start, or 0 where
     * addresses are offsets (fi_mr(3): "accessible by peers starting at a
     * base address of 0"); fi_mr_map_raw must be given the same. */
    uint64_t start = m->start;
    uint64_t base = (m->domain->mode & FI_MR_VIRT_ADDR) ? start : 0;
    memcpy(attr->raw_key, RAW_MAGIC, 8);
    memcpy(attr->raw_key + 8, &m->key, 8);
    memcpy(attr->raw_key + 16, &start, 8);
    memcpy(attr->raw_key + 24, &base, 8);
    *attr->key_size = RAW_SIZE;
    *attr->base_addr = base;
    return 0;
}

static int mr_control(struct fid *fid, int command, void *arg)
{
    shim_mr_t *m = (shim_mr_t *)fid;
    if (command == FI_GET_RAW_MR)
        return mr_raw_attr(m, arg);
    if (command != FI_ENABLE)
        return -FI_ENOSYS;
    if (!(m->domain->mode & FI_MR_ENDPOINT))
        return 0;
    if (m->bound_ep == 0 || m->enabled) {
        violation("fi_mr_enable %s", m->enabled ? "twice" : "before fi_mr_bind");
        return -FI_EINVAL;
    }
    int ret = mr_make_real(m);
    m->enabled = ret == 0;
    return ret;
}

static int mr_no_ops_open(struct fid *fid, const char *name, uint64_t flags, void **ops,
                          void *context)
{
    (void)fid, (void)name, (void)flags, (void)ops, (void)context;
    return -FI_ENOSYS;
}

static struct fi_ops mr_fid_ops = {
    .size = sizeof(struct fi_ops),
    .close = mr_close,
    .bind = mr_bind,
    .control = mr_control,
    .ops_open = mr_no_ops_open,
    .tostr = no_tostr,
    .ops_set = no_ops_set,
};

static int mr_regattr(struct fid *fid, const struct fi_mr_attr *attr, uint64_t flags,
                      struct fid_mr **mr_p)
{
    shim_domain_t *d = (shim_domain_t *)fid;
    (void)flags;
    if (attr->iov_count != 1 || attr->iface != FI_HMEM_SYSTEM)
        return -FI_ENOSYS; /* the module registers one host buffer at a time */
    shim_mr_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return -FI_ENOMEM;
    m->mr.fid.fclass = FI_CLASS_MR;
    m->mr.fid.context = attr->context;
    m->mr.fid.ops = &mr_fid_ops;
    m->mr.key = FI_KEY_NOTAVAIL; /* until it is usable */
    m->domain = d;
    m->start = (uintptr_t)attr->mr_iov[0].iov_base;
    m->length = attr->mr_iov[0].iov_len;
    m->access = attr->access;
    m->key = attr->requested_key;
    if (d->mode & FI_MR_PROV_KEY) {
        /* Ours, never the requested one: a counter above the start, which
         * is what lets offsets be turned back into addresses (top). */
        pthread_mutex_lock(&d->lock);
        m->key = (++d->next_prov_key << ADDRESS_BITS) | (m->start & ADDRESS_MASK);
        pthread_mutex_unlock(&d->lock);
        atomic_fetch_add(&count_prov_keys, 1);
    }
    int ret = (d->mode & FI_MR_ENDPOINT) ? 0 : mr_make_real(m);
    if (ret != 0) {
        free(m);
        return ret;
    }
    pthread_mutex_lock(&d->lock);
    m->next = d->mrs;
    d->mrs = m;
    pthread_mutex_unlock(&d->lock);
    *mr_p = &m->mr;
    return 0;
}

static int domain_open(struct fid_fabric *fabric, struct fi_info *info,
                       struct fid_domain **domain_p, void *context)
{
    shim_fabric_t *f = (shim_fabric_t *)fabric;
    shim_domain_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return -FI_ENOMEM;
    d->mode = info->domain_attr->mr_mode;
    d->real_mode = real_mode_of(info->fabric_attr->prov_name, d->mode);
    struct fi_info *real = real_info(info, d->real_mode);
    if (real == NULL) {
        free(d);
        return -FI_ENOMEM;
    }
    int ret = fi_domain(f->real, real, &d->real, context);
    fi_freeinfo(real);
    if (ret != 0) {
        free(d);
        return ret;
    }
    pthread_mutex_init(&d->lock, NULL);
    d->domain.fid = d->real->fid;
    d->domain.fid.ops = &domain_fid_ops;
    d->domain.ops = &domain_ops;
    d->domain.mr = &domain_mr_ops;
    *domain_p = &d->domain;
    return 0;
}

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
    return ep->real->fid.ops->bind(&ep->real->fid, bfid, flags);
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

static struct fi_ops ep_fid_ops = {
    .size = sizeof(struct fi_ops),
    .close = ep_close,
    .bind = ep_bind,
    .control = ep_control,
    .ops_open = ep_ops_open,
    .tostr = no_tostr,
    .ops_set = no_ops_set,
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
 * provider's desc, or -FI_EINVAL after a violation (caller: d->lock held). */
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
        violation("%s: local desc %p is no live MR (FI_MR_LOCAL)", what, desc);
        return -FI_EINVAL;
    }
    if (m->real == NULL) {
        violation("%s: local MR %s", what, m->killed ? "of a closed endpoint" : "not enabled");
        return -FI_EINVAL;
    }
    if ((d->mode & FI_MR_ENDPOINT) && m->bound_ep != ep->serial) {
        violation("%s: local MR bound to another endpoint (FI_MR_ENDPOINT)", what);
        return -FI_EINVAL;
    }
    if (start < m->start || len > m->length || start - m->start > m->length - len) {
        violation("%s: %zu bytes at %#lx outside the local MR [%#lx, +%zu)", what, len,
                  (unsigned long)start, (unsigned long)m->start, m->length);
        return -FI_EINVAL;
    }
    if (!(m->access & access)) {
        violation("%s: local MR without %s access", what, access == FI_WRITE ? "write" : "read");
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
            violation("%s: key %#llx is no fi_mr_map_raw key (FI_MR_RAW)", what,
                      (unsigned long long)iov->key);
            return -FI_EINVAL;
        }
        real_p->key = m->real_key;
        start = m->start;
        have_start = 1;
    } else if (d->mode & FI_MR_PROV_KEY) {
        if (iov->key == FI_KEY_NOTAVAIL || (iov->key >> ADDRESS_BITS) == 0) {
            violation("%s: key %#llx is not one the provider gave (FI_MR_PROV_KEY)", what,
                      (unsigned long long)iov->key);
            return -FI_EINVAL;
        }
        start = iov->key & ADDRESS_MASK;
        have_start = 1;
    }
    if (!(d->mode & FI_MR_VIRT_ADDR) && (d->real_mode & FI_MR_VIRT_ADDR)) {
        if (!have_start) {
            violation("%s: offset addressing with no start known", what);
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
    return write ? fi_writemsg(ep->real, &real, flags) : fi_readmsg(ep->real, &real, flags);
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

static int endpoint_open(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep_p,
                         void *context)
{
    shim_domain_t *d = (shim_domain_t *)domain;
    shim_ep_t *ep = calloc(1, sizeof(*ep));
    if (ep == NULL)
        return -FI_ENOMEM;
    struct fi_info *real = real_info(info, d->real_mode);
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
    ep->ep.fid.ops = &ep_fid_ops;
    ep->ep.ops = &ep_ops;
    ep->ep.cm = &ep_cm_ops;
    ep->ep.rma = &ep_rma_ops;
    /* Messages, tagged, atomics, collectives: the module uses none, and a
     * call would need the real endpoint; NULL makes a misuse plain. */
    *ep_p = &ep->ep;
    return 0;
}

/* ---- for tests ---- */

/* How often the shim saw each thing: "local" (local descs checked), "bound"
 * (MRs bound to an endpoint), "raw" (raw keys mapped), "offset" (offsets
 * turned into addresses), "prov_key" (keys picked), "rma" (operations),
 * "violations".  Found by tests with dlsym, which also tells them the shim
 * is loaded. */
SHIM_EXPORT unsigned long ferry_ofi_mr_shim_count(const char *what)
{
    static const struct {
        const char *name;
        atomic_ulong *count;
    } counts[] = {{"local", &count_local_checked},  {"bound", &count_bound},
                  {"raw", &count_raw_mapped},       {"offset", &count_offsets},
                  {"prov_key", &count_prov_keys},   {"rma", &count_rma},
                  {"violations", &count_violations}};
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
        if (strcmp(counts[i].name, what) == 0)
            return atomic_load(counts[i].count);
    return 0;
}
