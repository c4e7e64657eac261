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
 *   raw_long  raw, with keys of RAW_LONG_SIZE (300) bytes: longer than the
 *             first fi_mr_raw_attr the module makes (-FI_ETOOSMALL).
 *   prov_key  FI_MR_PROV_KEY: the shim picks keys (never the requested one).
 *   allocated FI_MR_ALLOCATED: a registration whose pages are not all
 *             backed by memory (mincore: mapped but never touched) is
 *             refused.
 *   offset    no FI_MR_VIRT_ADDR: remote addresses are offsets from the
 *             registered start.  Over a provider that addresses by virtual
 *             address (shm) the shim adds the registered start back; it
 *             learns it from the key, so there offset implies prov_key
 *             (unless raw, whose bytes carry it).
 * A shim_violation fails the operation with -FI_EINVAL and logs one line
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
 * calls are checked or forwarded with the real object), and so are CQs
 * without a wait object (ofi_mr_shim_cq.c: one reader at a time); AV,
 * counter and CQs with a wait fd are the real provider's.  Lifetimes: each
 * wrapper owns its real object and closes it in its close; a domain
 * outlives its endpoints and MRs (the caller's order, as libfabric's).
 */
#include "ofi_mr_shim_impl.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ofi_mr_shim.h"

#define SHIM_EXPORT __attribute__((visibility("default")))

/* What the shim saw, for tests (ferry_ofi_mr_shim_count). */
atomic_ulong count_local_checked, count_bound, count_raw_mapped, count_offsets, count_prov_keys,
    count_violations, count_rma, count_raw_too_small, count_allocated;

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

void shim_violation(const char *fmt, ...)
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

/* The size of the raw keys fi_mr_raw_attr gives: RAW_SIZE, or RAW_LONG_SIZE
 * where FERRY_TEST_OFI_MR_MODE says "raw_long" (longer than the 256 bytes
 * the module's first fi_mr_raw_attr offers: it must ask again with the size
 * the provider answers with -FI_ETOOSMALL).  The bytes past RAW_SIZE are a
 * pattern that fi_mr_map_raw checks. */
static size_t raw_size(void)
{
    const char *text = getenv("FERRY_TEST_OFI_MR_MODE");
    return text != NULL && strstr(text, "raw_long") != NULL ? RAW_LONG_SIZE : RAW_SIZE;
}

static uint8_t raw_pad(size_t at)
{
    return (uint8_t)(at * 7 + 0x5a);
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
        else if (strcmp(word, "raw") == 0 || strcmp(word, "raw_long") == 0)
            mode |= FI_MR_RAW;
        else if (strcmp(word, "prov_key") == 0)
            mode |= FI_MR_PROV_KEY;
        else if (strcmp(word, "allocated") == 0)
            mode |= FI_MR_ALLOCATED;
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

int shim_no_tostr(const struct fid *fid, char *buf, size_t len)
{
    (void)fid, (void)buf, (void)len;
    return -FI_ENOSYS;
}

int shim_no_ops_set(struct fid *fid, const char *name, uint64_t flags, void *ops, void *ctx)
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
    .tostr = shim_no_tostr,
    .ops_set = shim_no_ops_set,
};

static int domain_open(struct fid_fabric *fabric, struct fi_info *info,
                       struct fid_domain **domain_p, void *context);

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
struct fi_info *shim_real_info(const struct fi_info *info, int real_mode)
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
        shim_violation("domain closed with %s still open", d->mrs ? "MRs" : "raw key mappings");
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
        shim_violation("fi_mr_map_raw without FI_MR_RAW");
        return -FI_EINVAL;
    }
    uint64_t real_key, start, base;
    int padded = map->key_size == raw_size();
    for (size_t i = RAW_SIZE; padded && i < map->key_size; i++)
        padded = map->raw_key[i] == raw_pad(i);
    if (!padded || memcmp(map->raw_key, RAW_MAGIC, 8) != 0) {
        shim_violation("fi_mr_map_raw: %zu bytes that fi_mr_raw_attr did not give", map->key_size);
        return -FI_EINVAL;
    }
    memcpy(&real_key, map->raw_key + 8, 8);
    memcpy(&start, map->raw_key + 16, 8);
    memcpy(&base, map->raw_key + 24, 8);
    if (map->base_addr != base) {
        shim_violation("fi_mr_map_raw: base %#llx, fi_mr_raw_attr gave %#llx",
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
        shim_violation("fi_mr_unmap_key: %#llx was not mapped", (unsigned long long)key);
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
    .tostr = shim_no_tostr,
    .ops_set = shim_no_ops_set,
};

static int domain_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av,
                          void *context)
{
    return fi_av_open(((shim_domain_t *)domain)->real, attr, av, context);
}

static int domain_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq,
                          void *context)
{
    return shim_cq_open(((shim_domain_t *)domain)->real, attr, cq, context);
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

static int endpoint2_open(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep_p,
                          uint64_t flags, void *context)
{
    return flags == 0 ? shim_endpoint_open(domain, info, ep_p, context) : -FI_ENOSYS;
}

static struct fi_ops_domain domain_ops = {
    .size = sizeof(struct fi_ops_domain),
    .av_open = domain_av_open,
    .cq_open = domain_cq_open,
    .endpoint = shim_endpoint_open,
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
        shim_violation("fi_mr_bind without FI_MR_ENDPOINT");
        return -FI_EINVAL;
    }
    if (bfid->fclass != FI_CLASS_EP || bfid->ops != &shim_ep_fid_ops || m->enabled) {
        shim_violation("fi_mr_bind: %s", m->enabled ? "already enabled" : "not an endpoint");
        return -FI_EINVAL;
    }
    shim_ep_t *ep = (shim_ep_t *)bfid;
    if (ep->domain != m->domain) {
        shim_violation("fi_mr_bind: an endpoint of another domain");
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
        shim_violation("fi_mr_raw_attr %s", m->real ? "without FI_MR_RAW" : "before fi_mr_enable");
        return -FI_EINVAL;
    }
    size_t size = raw_size();
    if (*attr->key_size < size) {
        *attr->key_size = size;
        atomic_fetch_add(&count_raw_too_small, 1);
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
    for (size_t i = RAW_SIZE; i < size; i++)
        attr->raw_key[i] = raw_pad(i);
    *attr->key_size = size;
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
        shim_violation("fi_mr_enable %s", m->enabled ? "twice" : "before fi_mr_bind");
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
    .tostr = shim_no_tostr,
    .ops_set = shim_no_ops_set,
};

/* FI_MR_ALLOCATED: "registered memory regions must be backed by physical
 * memory pages at the time the registration call is made" (fi_mr(3)).
 * Every page of the range must be resident (mincore), which a buffer
 * mapped but never touched is not. */
static int backed_by_pages(const void *start, size_t length)
{
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t first = (uintptr_t)start & ~(uintptr_t)(page - 1);
    size_t pages = ((uintptr_t)start + length - first + (size_t)page - 1) / (size_t)page;
    unsigned char *resident = malloc(pages ? pages : 1);
    if (resident == NULL)
        return 0;
    int backed = mincore((void *)first, pages * (size_t)page, resident) == 0;
    for (size_t i = 0; backed && i < pages; i++)
        backed = resident[i] & 1;
    free(resident);
    return backed;
}

static int mr_regattr(struct fid *fid, const struct fi_mr_attr *attr, uint64_t flags,
                      struct fid_mr **mr_p)
{
    shim_domain_t *d = (shim_domain_t *)fid;
    (void)flags;
    if (attr->iov_count != 1 || attr->iface != FI_HMEM_SYSTEM)
        return -FI_ENOSYS; /* the module registers one host buffer at a time */
    if (d->mode & FI_MR_ALLOCATED) {
        if (!backed_by_pages(attr->mr_iov[0].iov_base, attr->mr_iov[0].iov_len)) {
            shim_violation("fi_mr_regattr: %zu bytes at %p not all backed by pages "
                           "(FI_MR_ALLOCATED)",
                           attr->mr_iov[0].iov_len, attr->mr_iov[0].iov_base);
            return -FI_EINVAL;
        }
        atomic_fetch_add(&count_allocated, 1);
    }
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
    struct fi_info *real = shim_real_info(info, d->real_mode);
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

/* ---- for tests ---- */

/* How often the shim saw each thing: "local" (local descs checked), "bound"
 * (MRs bound to an endpoint), "raw" (raw keys mapped), "offset" (offsets
 * turned into addresses), "prov_key" (keys picked), "rma" (operations),
 * "raw_too_small" (fi_mr_raw_attr answered -FI_ETOOSMALL), "allocated"
 * (registrations found backed by pages under FI_MR_ALLOCATED),
 * "guarded_cq_reads" (reads of CQs without a wait object), "silenced"
 * (write completions swallowed: ofi_mr_shim_cq.c), "violations".  Found by
 * tests with dlsym, which also tells them the shim is loaded. */
SHIM_EXPORT unsigned long ferry_ofi_mr_shim_count(const char *what)
{
    static const struct {
        const char *name;
        atomic_ulong *count;
    } counts[] = {{"local", &count_local_checked},  {"bound", &count_bound},
                  {"raw", &count_raw_mapped},       {"offset", &count_offsets},
                  {"prov_key", &count_prov_keys},   {"rma", &count_rma},
                  {"raw_too_small", &count_raw_too_small}, {"allocated", &count_allocated},
                  {"guarded_cq_reads", &count_guarded_cq_reads},
                  {"silenced", &count_silenced},
                  {"violations", &count_violations}};
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
        if (strcmp(counts[i].name, what) == 0)
            return atomic_load(counts[i].count);
    return 0;
}
