/*
 * What the two halves of the MR-mode stand-in share: ofi_mr_shim.c
 * (fi_getinfo, fabric, domain, MRs) and ofi_mr_shim_ep.c (endpoints and
 * the checks of each RMA).  Not for tests: they use ofi_mr_shim.h.
 */
#ifndef FERRY_TEST_OFI_MR_SHIM_IMPL_H
#define FERRY_TEST_OFI_MR_SHIM_IMPL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RAW_MAGIC      "FMRSHIM1"
#define RAW_SIZE       32              /* magic, real key, registered start, base */
#define RAW_LONG_SIZE  300             /* "raw_long": RAW_SIZE, then a pattern */
#define MAPPED_KEY_TAG (0xb5ULL << 56) /* keys fi_mr_map_raw hands out */
#define ADDRESS_BITS   48              /* user addresses on x86-64 and arm64 */
#define ADDRESS_MASK   ((1ULL << ADDRESS_BITS) - 1)

/* What the shim saw (ofi_mr_shim.c, ferry_ofi_mr_shim_count). */
extern atomic_ulong count_local_checked, count_bound, count_raw_mapped, count_offsets,
    count_prov_keys, count_violations, count_rma, count_raw_too_small, count_allocated;
/* Reads of lane CQs the guard saw (ofi_mr_shim_cq.c). */
extern atomic_ulong count_guarded_cq_reads, count_silenced;

typedef struct shim_domain shim_domain_t;

typedef struct shim_ep {
    struct fid_ep ep;
    struct fid_ep *real;
    shim_domain_t *domain;
    uint64_t serial; /* MRs bound to it name it by serial, not by address */
    struct fid *cq;  /* bound for transmits (a guarded CQ silences writes) */
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

/* Count a violation and log one line (stderr, and FERRY_TEST_OFI_MR_VIOLATIONS). */
void shim_violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int shim_no_tostr(const struct fid *fid, char *buf, size_t len);
int shim_no_ops_set(struct fid *fid, const char *name, uint64_t flags, void *ops, void *ctx);
/* A copy of info carrying the real provider's mode (freed by the caller). */
struct fi_info *shim_real_info(const struct fi_info *info, int real_mode);

/* ---- ofi_mr_shim_ep.c ---- */
/* The domain's endpoint op: ours around the real provider's. */
int shim_endpoint_open(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep_p,
                       void *context);
/* Our endpoints' fid ops: mr_bind tells an endpoint of ours by them. */
extern struct fi_ops shim_ep_fid_ops;

/* ---- ofi_mr_shim_cq.c ---- */
/* The domain's cq_open: a CQ without a wait object comes back guarded (one
 * reader at a time, no close under a reader), any other as the provider's. */
int shim_cq_open(struct fid_domain *real_domain, struct fi_cq_attr *attr, struct fid_cq **cq_p,
                 void *context);
/* The provider's fid behind a guarded CQ (what the provider's binds need),
 * or fid itself. */
struct fid *shim_cq_real_fid(struct fid *fid);
/* Before a write of length bytes is posted on an endpoint bound to cq:
 * whether cq is to swallow its completion (FERRY_TEST_OFI_SILENCE_LENGTH),
 * noted then under context; shim_cq_unsilence forgets it (the post was
 * refused). */
int shim_cq_silence(struct fid *cq, void *context, size_t length);
void shim_cq_unsilence(struct fid *cq, void *context);

#endif
