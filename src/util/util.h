/* Internal helpers shared by every part of libferry. */
#ifndef FERRY_UTIL_H
#define FERRY_UTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <ferry/lock.h>
#include <ferry/plugin.h>

#define FERRY_HIDDEN __attribute__((visibility("hidden")))
#define FERRY_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define FERRY_MIN(a, b) ((a) < (b) ? (a) : (b))
#define FERRY_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- log.c ---- */
void ferry_log_init(void);

/* A warning about an event that can repeat many times a second (a listener
 * refusing connections): said at most once per interval, with the count. */
typedef struct ferry_log_burst {
    uint64_t said_ms; /* 0: never said */
    unsigned long count;
} ferry_log_burst_t;
/* Counts one event; returns the events to report (this one included) when
 * the warning is due now, else 0. */
unsigned long ferry_log_burst_due(ferry_log_burst_t *burst, uint64_t now_ms,
                                  uint64_t interval_ms);

/* A spinning thread's pause: lets the sibling hyperthread run and the
 * spin end sooner once the awaited store lands. */
static inline void ferry_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* ---- futex.c: sleeping on a 32-bit atomic word (an atomic_int or atomic_uint) ---- */
struct timespec;
/* Sleep while *word == expected, until a wake or the absolute CLOCK_MONOTONIC
 * deadline (NULL: none).  0, or ETIMEDOUT; may return early: look again. */
int ferry_futex_wait(void *word, unsigned expected, const struct timespec *deadline);
/* Wake up to `waiters` threads sleeping on word (INT_MAX: all). */
void ferry_futex_wake(void *word, int waiters);

/* ---- time ---- */
uint64_t ferry_time_ms(void); /* monotonic */
uint64_t ferry_time_us(void); /* monotonic */
uint64_t ferry_time_ns(void); /* monotonic */

/* ---- ticks.c: a cheap clock for intervals (the statistics' latencies) ---- */
#if defined(__x86_64__) && defined(__GNUC__)
#define FERRY_TICKS_HAVE_TSC 1
#else
#define FERRY_TICKS_HAVE_TSC 0
#endif
/* Set once by ferry_ticks_init (before any tick is read, so plain): ticks
 * are TSC counts; the rate to nanoseconds. */
extern int ferry_ticks_tsc;
extern uint64_t ferry_ticks_ns_mult;
/* Measure the rate once per process (a 200 us spin the first time); call
 * before reading ticks. */
void ferry_ticks_init(void);
/* Now, in ticks: only differences mean something (ferry_ticks_to_ns). */
static inline uint64_t ferry_ticks(void)
{
#if FERRY_TICKS_HAVE_TSC
    if (ferry_ticks_tsc)
        return __builtin_ia32_rdtsc();
#endif
    return ferry_time_ns(); /* no TSC to read: ticks are nanoseconds */
}
/* An interval in ticks, in nanoseconds (inline: the statistics convert one
 * per completion call). */
static inline uint64_t ferry_ticks_to_ns(uint64_t ticks)
{
#if FERRY_TICKS_HAVE_TSC
    if (ferry_ticks_tsc)
        return (uint64_t)(((unsigned __int128)ticks * ferry_ticks_ns_mult) >> 32);
#endif
    return ticks;
}

/* ---- deadline_heap.c: the earliest of many deadlines, O(log n) per change ---- */
#define FERRY_DEADLINE_UNQUEUED SIZE_MAX
/* Embedded in the object that has a deadline; start it with
 * FERRY_DEADLINE_ENTRY_INIT (not queued). */
typedef struct ferry_deadline_entry {
    uint64_t deadline;
    size_t index; /* its place in the heap; FERRY_DEADLINE_UNQUEUED: not in it */
} ferry_deadline_entry_t;
#define FERRY_DEADLINE_ENTRY_INIT {.deadline = UINT64_MAX, .index = FERRY_DEADLINE_UNQUEUED}
/* Not thread-safe: one owner (an event loop's thread). */
typedef struct ferry_deadline_heap {
    ferry_deadline_entry_t **entries;
    size_t count;
    size_t capacity; /* entries that may be queued at once */
} ferry_deadline_heap_t;
ferry_status_t ferry_deadline_heap_init(ferry_deadline_heap_t *heap, size_t capacity);
void ferry_deadline_heap_fini(ferry_deadline_heap_t *heap);
/* Queue, move or (UINT64_MAX) remove the entry; never allocates.  At most
 * `capacity` distinct entries may be queued at once. */
void ferry_deadline_heap_set(ferry_deadline_heap_t *heap, ferry_deadline_entry_t *entry,
                             uint64_t deadline);
/* The entry with the earliest deadline; NULL when none is queued. */
ferry_deadline_entry_t *ferry_deadline_heap_top(const ferry_deadline_heap_t *heap);

/* copy.c: ferry_copy_to_peer's threshold (FERRY_COPY_NT_MIN; 0: never). */
void ferry_copy_set_nt_min(size_t bytes);
/* Would ferry_copy_to_peer use non-temporal stores for this copy?  (It
 * remembers dst as this thread's last large destination.) */
int ferry_copy_nt_wanted(const void *dst, size_t length);
/* Copy with non-temporal stores (and a fence) when nt, else memcpy. */
void ferry_copy_piece(void *dst, const void *src, size_t length, int nt);

/* copy_pool.c: the process's copy helpers for ferry_copy_many. */
#define FERRY_COPY_MAX_THREADS 16
/* FERRY_COPY_THREADS: "auto" (1 where the process may use 2 CPUs) or 0..16. */
ferry_status_t ferry_copy_threads_parse(const char *text, unsigned *threads_p);
/* Counted: the first call starts the helpers, the last stop joins them. */
void ferry_copy_helpers_start(unsigned threads, size_t parallel_min);
void ferry_copy_helpers_stop(void);
/* Bytes the helpers copied since the process started (for tests). */
uint64_t ferry_copy_helped_bytes(void);
/* The kernel's boot id (no newline); 0 if unreadable. */
int ferry_boot_id(char *out, size_t len);

/* ---- random.c ---- */
uint64_t ferry_random_u64(void); /* from getrandom(); never 0 */

/* ---- net.c: blocking sockets with deadlines ---- */

/* Split "host:port" (also "[v6]:port"); port 0 if absent and allowed. */
ferry_status_t ferry_net_split(const char *hostport, char *host, size_t hostlen, int *port_p,
                               int port_required);
/* Listen on host:port (port 0 = any); fills the actual port. */
ferry_status_t ferry_net_listen(const char *host, int port, int backlog, int *fd_p,
                                int *port_p);
/* Connect with a timeout; returns a blocking socket with TCP_NODELAY. */
ferry_status_t ferry_net_connect(const char *hostport, unsigned timeout_ms, int *fd_p);
/* Start connecting a non-blocking socket to host:port (its first address);
 * it is connected once writable with SO_ERROR 0. */
ferry_status_t ferry_net_connect_begin(const char *hostport, int *fd_p);
/* A blocking call on fd gives up when no byte moved for timeout_ms (0 = never). */
void ferry_net_set_timeout(int fd, unsigned timeout_ms);
/* Send/receive exactly len bytes.  FERRY_ERR_TIMEOUT when the socket's
 * timeout passed without progress, FERRY_ERR_PEER_FAILED on EOF or reset. */
ferry_status_t ferry_net_send_all(int fd, const void *buf, size_t len);
ferry_status_t ferry_net_sendv_all(int fd, struct iovec *iov, int iovcnt);
ferry_status_t ferry_net_recv_all(int fd, void *buf, size_t len);
/* Drop `sent` bytes from the front of msg's iovec (after a partial sendmsg). */
struct msghdr;
void ferry_net_iov_advance(struct msghdr *msg, size_t sent);
/* Address of this host that peers should use when none was configured. */
void ferry_net_default_host(char *host, size_t len);
/* The host part of a peer's address, so listeners can count connections per
 * source: an IPv4 address and its IPv4-mapped IPv6 form are one source. */
typedef struct ferry_net_source {
    uint8_t bytes[16];
} ferry_net_source_t;
struct sockaddr;
void ferry_net_source_of(const struct sockaddr *addr, ferry_net_source_t *source_p);
/* What a listener holding `open` connections, `open_from_source` of them
 * from a newcomer's address, does to let the newcomer in: nothing, or evict
 * an idle connection of that address (its cap reached: a flood from one
 * address costs only that address), or one of any address (the global cap). */
typedef enum ferry_net_admit {
    FERRY_NET_ADMIT,
    FERRY_NET_EVICT_SAME_SOURCE,
    FERRY_NET_EVICT_ANY,
} ferry_net_admit_t;
ferry_net_admit_t ferry_net_admit(size_t open, size_t open_from_source, size_t max,
                                  size_t max_per_source);
/* Bytes (or an EOF) wait to be read on fd: a connection a listener took for
 * idle has a request in, and must not be evicted. */
int ferry_net_has_input(int fd);

/* ---- handle.c: validated handles ---- */

typedef enum ferry_handle_kind {
    FERRY_HANDLE_ENGINE = 1,
    FERRY_HANDLE_SEGMENT = 2,
    FERRY_HANDLE_BATCH = 3,
} ferry_handle_kind_t;

/* Handles are slot index + generation, never raw pointers, so a freed or
 * foreign handle is detected instead of dereferenced. */
uint64_t ferry_handle_alloc(ferry_handle_kind_t kind, void *object, void *owner);
void ferry_handle_free(uint64_t handle);

/* The slot table, for the lookup below (every API call makes one or more,
 * a ping-pong's write four: inline, they cost a few loads). */
#define FERRY_HANDLE_SLOTS_PER_CHUNK 1024u
#define FERRY_HANDLE_MAX_CHUNKS 1024u
typedef struct ferry_handle_slot {
    _Atomic uint32_t generation; /* odd: in use */
    _Atomic uint32_t kind;
    void *_Atomic object;
    void *_Atomic owner;
    uint32_t next_free;
} ferry_handle_slot_t;
extern ferry_handle_slot_t *_Atomic ferry_handle_chunks[FERRY_HANDLE_MAX_CHUNKS] FERRY_HIDDEN;

/* The object of that kind (and owner, unless NULL) the handle names, or
 * NULL: never a freed object's. */
static inline void *ferry_handle_lookup(uint64_t handle, ferry_handle_kind_t kind, void *owner)
{
    uint32_t index = (uint32_t)handle - 1; /* 0 (never a handle) wraps past the table */
    uint32_t generation = (uint32_t)(handle >> 32);
    if ((generation & 1u) == 0 ||
        index >= FERRY_HANDLE_SLOTS_PER_CHUNK * FERRY_HANDLE_MAX_CHUNKS)
        return NULL;
    ferry_handle_slot_t *chunk = atomic_load_explicit(
        &ferry_handle_chunks[index / FERRY_HANDLE_SLOTS_PER_CHUNK], memory_order_acquire);
    if (chunk == NULL)
        return NULL;
    ferry_handle_slot_t *slot = &chunk[index % FERRY_HANDLE_SLOTS_PER_CHUNK];
    if (atomic_load(&slot->generation) != generation ||
        atomic_load(&slot->kind) != (uint32_t)kind ||
        (owner != NULL && atomic_load(&slot->owner) != owner))
        return NULL;
    void *object = atomic_load(&slot->object);
    /* freed while we looked: the generation moved on */
    return atomic_load(&slot->generation) == generation ? object : NULL;
}

/* ---- location.c: ferry_location_is_host/_cxl (plugin.h) ---- */
/* The grammar ferry_register and ferry_alloc accept: NULL, "" or
 * kind[:qualifier] (ferry.h), at most FERRY_LOCATION_MAX bytes. */
#define FERRY_LOCATION_MAX 64
int ferry_location_valid(const char *location);

/* ---- strings ---- */
char *ferry_strdup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- settings.c ---- */
/* Tables of the core, listed by ferry_info -c. */
typedef struct ferry_settings_table {
    const char *component; /* NULL: FERRY_<name> */
    const char *title;
    const ferry_setting_t *settings;
    size_t count;
} ferry_settings_table_t;
void ferry_settings_print(FILE *out, const ferry_settings_table_t *table);
ferry_status_t ferry_setting_parse_size(const char *text, size_t *value_p);

#endif
