/*
 * The cxl transport: same-host transfers through a shared memory window that
 * every engine maps MAP_SHARED from FERRY_CXL_PATH (a DAX device such as
 * /dev/dax0.0 on a CXL host, a block device, or a file, e.g. on /dev/shm).
 * A transfer is a memcpy between the caller's buffer and the window, in the
 * caller's thread; no system call, no thread, no connection.
 *
 * Window layout (every integer native-endian: one host, one architecture):
 *   [0, 4 KiB)          ferry_cxl_header_t, the rest of the page zero
 *   [4 KiB, ...)        the allocation table: one ferry_cxl_chunk_t per chunk
 *   the first chunks    covered by header and table, owned by FERRY_CXL_OWNER_HEADER
 *   the other chunks    handed out by ferry_alloc(..., "cxl", ...), whole chunks,
 *                       contiguous; the tail after the last whole chunk is unused
 * The chunk size is a power of two, at least 4 KiB, so that the table has at
 * most FERRY_CXL_MAX_CHUNKS entries.
 *
 * Identity: the endpoint string is
 *   cxl1:<window id, 32 hex digits>:<window size>:<chunk size>
 * and every engine on one window publishes the same one: a peer is reached
 * when its string equals ours.  A buffer's key is "<window offset hex>@<its
 * address hex>", so a peer's remote_addr maps to the window offset
 * off + (remote_addr - addr).
 *
 * Bounds: the window is shared, so nothing the kernel does stops a stray
 * copy.  Before each slice the initiator checks that [o, o+len) lies in the
 * window and inside one allocation whose owner is the peer's generation
 * (FERRY_ERR_OUT_OF_RANGE otherwise, nothing touched): a stale key (freed
 * chunks) or a key pointing past the window or into another engine's chunks
 * is refused.  While it copies it holds the allocation (`users` of its first
 * chunk); freeing waits (bounded) until no initiator holds it.
 *
 * Locks: the table changes only under the header's process-shared robust
 * mutex (a holder that died leaves it EOWNERDEAD: the next one repairs the
 * table).  Initiators read it without the mutex: an allocation's owner is
 * stored last when it is made and first when it is freed, and `users` and
 * `owner` are sequentially consistent, so an initiator either sees the chunk
 * going away or is waited for.  ferry_cxl_t is immutable after create except
 * for the atomics.
 */
#ifndef FERRY_CXL_H
#define FERRY_CXL_H

#include <ferry/plugin.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#define FERRY_CXL_ENDPOINT_PREFIX "cxl1:"
#define FERRY_CXL_MAGIC 0x4c58435952524546ull      /* "FERRYCXL" in memory */
#define FERRY_CXL_FORMATTING 0x544d465952524546ull /* "FERRYFMT": an engine formats it */
#define FERRY_CXL_LAYOUT_VERSION 1
#define FERRY_CXL_HEADER_BYTES 4096 /* zero before the first engine formats the window */
#define FERRY_CXL_MIN_CHUNK ((size_t)4096)
#define FERRY_CXL_MAX_CHUNKS ((size_t)65536)
/* Chunk owners that are no engine generation. */
#define FERRY_CXL_OWNER_FREE 0ull
#define FERRY_CXL_OWNER_HEADER UINT64_MAX           /* header and table */
#define FERRY_CXL_OWNER_DRAINING (UINT64_MAX - 1)   /* being freed: no new copies */
/* How long an engine waits for another one to finish formatting the window. */
#define FERRY_CXL_FORMAT_WAIT_MS 5000
/* How long freeing waits for initiators still copying into the allocation. */
#define FERRY_CXL_DRAIN_MS 2000
/* A regular file is fstat-ed before a transfer when the last look is this
 * old: a file truncated under the mapping would raise SIGBUS on access. */
#define FERRY_CXL_SIZE_CHECK_MS 20

typedef struct ferry_cxl_settings {
    char *path;
    size_t size;
} ferry_cxl_settings_t;

/* One chunk of the window; in the window, shared by every engine.  Only the
 * first chunk's users counts; pid, start_time and kernel say whether the
 * owner process is gone (reclaim). */
typedef struct ferry_cxl_chunk {
    _Atomic uint64_t owner;      /* engine generation, or FERRY_CXL_OWNER_* */
    _Atomic uint64_t kernel;     /* hash of the owner's boot id and pid namespace */
    _Atomic uint64_t start_time; /* the owner process's start time (clock ticks) */
    _Atomic uint32_t pid;
    _Atomic uint32_t first;      /* the allocation's first chunk */
    _Atomic uint32_t count;      /* the allocation's chunk count */
    _Atomic int32_t users;       /* first chunk: initiators copying into it now */
} ferry_cxl_chunk_t;

/* The start of the window; written once by the engine that formats it. */
typedef struct ferry_cxl_header {
    _Atomic uint64_t state; /* 0, FERRY_CXL_FORMATTING or FERRY_CXL_MAGIC */
    uint32_t version;       /* FERRY_CXL_LAYOUT_VERSION */
    uint32_t entry_size;    /* sizeof(ferry_cxl_chunk_t) */
    uint64_t window_size;
    uint64_t chunk_size;
    uint64_t n_chunks;
    uint64_t table_offset;
    uint64_t reserved_chunks; /* header and table */
    uint8_t id[16];           /* random: a reformatted window is another window */
    pthread_mutex_t lock;     /* process-shared, robust: the table's writers */
} ferry_cxl_header_t;

/* This engine's mapping of the window. */
typedef struct ferry_cxl_window {
    const char *path;         /* the settings' string */
    int fd;
    int is_file;              /* a regular file: it can shrink under the mapping */
    unsigned char *base;
    size_t size;
    size_t chunk_size;
    unsigned chunk_shift;
    uint32_t n_chunks;
    uint32_t reserved_chunks;
    ferry_cxl_header_t *header;
    ferry_cxl_chunk_t *table;
    char id[33];              /* hex */
    atomic_uint_fast64_t size_checked_ms;
    atomic_int shrunk;        /* the file is smaller than the window: no more transfers */
} ferry_cxl_window_t;

/* Who owns the allocations this engine makes. */
typedef struct ferry_cxl_owner {
    uint64_t generation;
    uint64_t kernel;
    uint64_t start_time;
    uint32_t pid;
} ferry_cxl_owner_t;

typedef struct ferry_cxl {
    ferry_transport_services_t svc;
    ferry_cxl_settings_t settings;
    ferry_cxl_window_t window;
    ferry_cxl_owner_t self;
    char *address;
    atomic_int resized_logged; /* "window changed size" is said once */
} ferry_cxl_t;

/* An allocation of this engine (the memh of ferry_alloc memory). */
typedef struct ferry_cxl_mem {
    uint32_t first;
    uint32_t count;
} ferry_cxl_mem_t;

/* cxl_window.c */
/* Map the window and format it, or check the format another engine wrote;
 * every failure logged once, naming the path. */
ferry_status_t ferry_cxl_window_open(ferry_cxl_window_t *window,
                                     const ferry_cxl_settings_t *settings);
void ferry_cxl_window_close(ferry_cxl_window_t *window);
/* 0 when the window's file shrank below the window (logged once). */
int ferry_cxl_window_intact(ferry_cxl_window_t *window);
/* One line for ferry_info: the window configured in the environment. */
void ferry_cxl_window_describe(FILE *out, const ferry_cxl_settings_t *settings);

/* cxl_alloc.c */
void ferry_cxl_owner_init(ferry_cxl_owner_t *owner, uint64_t generation);
/* A freshly formatted table: every chunk free but the header's. */
void ferry_cxl_table_format(ferry_cxl_window_t *window);
/* Whole chunks for length bytes; reclaims the allocations of processes that
 * are gone when the window is full (FERRY_ERR_NO_MEMORY, logged). */
ferry_status_t ferry_cxl_chunks_alloc(ferry_cxl_t *cxl, size_t length, ferry_cxl_mem_t *mem);
/* Waits (bounded) for initiators still copying, then frees the chunks. */
void ferry_cxl_chunks_free(ferry_cxl_t *cxl, const ferry_cxl_mem_t *mem);
/* Hold [offset, offset+length) of the window for a copy when it lies inside
 * one allocation owned by generation; FERRY_ERR_OUT_OF_RANGE otherwise. */
ferry_status_t ferry_cxl_range_acquire(ferry_cxl_window_t *window, uint64_t offset,
                                       uint64_t length, uint64_t generation, uint32_t *hold_p);
void ferry_cxl_range_release(ferry_cxl_window_t *window, uint32_t hold);

/* cxl_xfer.c */
/* "<offset hex>@<addr hex>"; 0 if malformed. */
int ferry_cxl_key_parse(const char *key, uint64_t *offset_p, uint64_t *addr_p);
ferry_status_t ferry_cxl_submit(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices);

const ferry_plugin_t *ferry_cxl_plugin(void);

#endif
