/* Control-plane RPC between engines: length-prefixed, versioned frames over
 * TCP.  One request and one reply per frame pair; a frame larger than the
 * bound, a bad magic or version, or a frame that does not arrive in time
 * closes that connection only. */
#ifndef FERRY_RPC_H
#define FERRY_RPC_H

#include "../util/util.h"

#define FERRY_RPC_MAGIC 0x46525259u /* "FRRY" */
#define FERRY_RPC_VERSION 1
#define FERRY_RPC_HEADER_SIZE 16

typedef enum ferry_rpc_type {
    FERRY_RPC_FETCH = 1,          /* str name, str requester rpc [, u64 accept, u64 generation,
                                     u64 revision] -> descriptor text, or changes since the
                                     revision (ferry_rpc_fetch_t) */
    FERRY_RPC_FETCH_REPLY = 2,
    FERRY_RPC_NOTIFY = 3,         /* str from, bytes msg -> empty */
    FERRY_RPC_NOTIFY_ACK = 4,
    FERRY_RPC_PROBE = 5,          /* empty -> u64 generation, str name */
    FERRY_RPC_PROBE_REPLY = 6,
    FERRY_RPC_INVALIDATE = 7,     /* str name, u64 generation -> empty */
    FERRY_RPC_INVALIDATE_ACK = 8,
    FERRY_RPC_ERROR_REPLY = 9,    /* status in header, empty payload */
} ferry_rpc_type_t;

/* Header on the wire, big-endian: magic u32, version u8, type u8,
 * reserved u16 (0), status i32, payload length u32. */
typedef struct ferry_rpc_header {
    uint32_t magic;
    uint8_t version;
    uint8_t type;
    uint16_t reserved;
    int32_t status;
    uint32_t length;
} ferry_rpc_header_t;

void ferry_rpc_header_pack(const ferry_rpc_header_t *header, uint8_t out[FERRY_RPC_HEADER_SIZE]);
/* FERRY_ERR_PROTOCOL on bad magic/version/reserved, a type outside 1..9 or
 * length > max_frame. */
ferry_status_t ferry_rpc_header_unpack(const uint8_t in[FERRY_RPC_HEADER_SIZE],
                                       size_t max_frame, ferry_rpc_header_t *header);

/* Handler run by the server thread for each request; must not block on the
 * network.  payload is never NULL.  *reply_p is malloc-ed (or NULL); the
 * returned status goes into the reply header.  A reply type left unset is
 * the request type + 1 (FERRY_RPC_ERROR_REPLY when the handler failed); a
 * reply over max_frame becomes an error reply (FERRY_ERR_NO_RESOURCE). */
typedef ferry_status_t (*ferry_rpc_handler_fn)(void *arg, int type, const void *payload,
                                               size_t length, int *reply_type_p,
                                               void **reply_p, size_t *reply_length_p);

typedef struct ferry_rpc_server ferry_rpc_server_t;

/* What one client may cost the server.  A connection is idle between
 * frames with no reply queued; only idle ones are evicted.  A new
 * connection beyond max_conns_per_source (same source address) or
 * max_conns evicts the one idle longest (of that source, else of all);
 * when none is idle, the new one is closed. */
typedef struct ferry_rpc_server_limits {
    size_t max_frame;
    unsigned timeout_ms;      /* a frame completes, a reply moves, within it; 0: no limit */
    unsigned idle_timeout_ms; /* an idle connection closes after it; 0: never */
    unsigned max_conns;       /* at least 1 */
    unsigned max_conns_per_source; /* 0: max_conns */
} ferry_rpc_server_limits_t;

ferry_status_t ferry_rpc_server_start(const char *host, int port,
                                      const ferry_rpc_server_limits_t *limits,
                                      ferry_rpc_handler_fn handler, void *arg,
                                      ferry_rpc_server_t **server_p, int *port_p);
void ferry_rpc_server_stop(ferry_rpc_server_t *server);

/* Connect, send one request, read one reply, close.  Every step bounded by
 * timeout_ms (0: no limit).  A connection closed before a byte of the reply
 * (the server evicted it unread) is tried once more.  A reply whose header status is an error returns
 * that status; the reply type must be the request type + 1.  *reply_p gets
 * one extra NUL byte past *reply_length_p so text replies are C strings. */
ferry_status_t ferry_rpc_call(const char *endpoint, int type, const void *payload,
                              size_t length, unsigned timeout_ms, size_t max_frame,
                              void **reply_p, size_t *reply_length_p);

/* rpc_fanout.c: the same request to every endpoint at once, all answers
 * awaited together for timeout_ms in all (not per endpoint); statuses[i]
 * is endpoint i's: FERRY_OK for a reply of the right type, the reply's
 * error status, or why none came.  Replies' payloads are read and dropped.
 * One thread, non-blocking sockets: n unanswered endpoints cost one bound,
 * not n; at most 256 sockets open at once, the next starting as one ends. */
void ferry_rpc_call_all(const char *const *endpoints, size_t n, int type, const void *payload,
                        size_t length, unsigned timeout_ms, size_t max_frame,
                        ferry_status_t *statuses);

/* ---- rpc_counters.c: what this process's RPC did, for ferry_info_print's
 * FERRY_INFO_COUNTERS (benchmarks count a store's requests with them).
 * Process-wide, relaxed atomics: control plane, never a hot path. ---- */
typedef enum ferry_rpc_count {
    FERRY_RPC_COUNT_SERVED_FETCH,      /* requests served, by type */
    FERRY_RPC_COUNT_SERVED_NOTIFY,
    FERRY_RPC_COUNT_SERVED_PROBE,
    FERRY_RPC_COUNT_SERVED_INVALIDATE,
    FERRY_RPC_COUNT_SERVED_OTHER,      /* a type that is no request: an error reply */
    FERRY_RPC_COUNT_ACCEPTED,          /* connections the listeners took */
    FERRY_RPC_COUNT_EVICTED,           /* idle ones closed for a newcomer */
    FERRY_RPC_COUNT_REFUSED,           /* newcomers closed: caps reached, none idle */
    FERRY_RPC_COUNT_CALLS,             /* ferry_rpc_call: requests made */
    FERRY_RPC_COUNT_CALLS_FANNED_OUT,  /* ferry_rpc_call_all: endpoints asked */
    FERRY_RPC_COUNT_MAX
} ferry_rpc_count_t;
void ferry_rpc_counter_add(ferry_rpc_count_t which, uint64_t n);
uint64_t ferry_rpc_counter_get(ferry_rpc_count_t which);
/* "rpc.served.fetch", ...; NULL past the last. */
const char *ferry_rpc_counter_name(ferry_rpc_count_t which);

/* ---- wire.c: payload encoding (big-endian, length-prefixed strings) ---- */

typedef struct ferry_wire_writer {
    uint8_t *data;
    size_t length;
    size_t capacity;
    int failed;
} ferry_wire_writer_t;

void ferry_wire_put_u64(ferry_wire_writer_t *writer, uint64_t value);
void ferry_wire_put_bytes(ferry_wire_writer_t *writer, const void *data, size_t length);
void ferry_wire_put_str(ferry_wire_writer_t *writer, const char *text);

typedef struct ferry_wire_reader {
    const uint8_t *data;
    size_t length;
    size_t offset;
    int failed;
} ferry_wire_reader_t;

uint64_t ferry_wire_get_u64(ferry_wire_reader_t *reader);
/* Points into the payload; *length_p bytes. NULL and failed on truncation. */
const void *ferry_wire_get_bytes(ferry_wire_reader_t *reader, size_t *length_p);
/* Copies into out (NUL-terminated); fails when it does not fit or holds NUL. */
void ferry_wire_get_str(ferry_wire_reader_t *reader, char *out, size_t out_size);

/* ---- rpc_message.c: the requests' payloads, written and read in one place ---- */

typedef struct ferry_rpc_fetch {
    char name[1024]; /* the segment ("": whatever this engine's is) */
    char from[300];  /* the caller's RPC host:port, for invalidations */
    /* Optional, after the two strings (an older engine sends neither and
     * ignores them): 0 when absent.  accept: FERRY_RPC_ACCEPT_* bits; with
     * CHANGES, the caller holds generation's revision and takes the
     * changes since (doc/metadata.md, "Incremental refresh"). */
    int extended;
    uint64_t accept;
    uint64_t generation;
    uint64_t revision;
} ferry_rpc_fetch_t;

enum {
    FERRY_RPC_ACCEPT_COMPACT = 1u << 0, /* the compact descriptor form */
    FERRY_RPC_ACCEPT_CHANGES = 1u << 1, /* a change set instead of the descriptor */
};

typedef struct ferry_rpc_notify {
    char from[256];
    const void *msg; /* read: points into the payload */
    size_t length;
} ferry_rpc_notify_t;

typedef struct ferry_rpc_invalidate {
    char name[1024];
    uint64_t generation;
} ferry_rpc_invalidate_t;

typedef struct ferry_rpc_probe_reply {
    uint64_t generation;
    char name[1024];
} ferry_rpc_probe_reply_t;

/* Writers take the fields (strings of any length: a reader's bound refuses
 * what it cannot hold) and leave *out empty on FERRY_ERR_NO_MEMORY.
 * Readers: FERRY_ERR_PROTOCOL on a truncated or malformed payload, or a
 * string past its buffer. */
ferry_status_t ferry_rpc_fetch_write(ferry_wire_writer_t *out, const char *name, const char *from);
/* With the optional fields (m->extended ignored: always written). */
ferry_status_t ferry_rpc_fetch_since_write(ferry_wire_writer_t *out, const ferry_rpc_fetch_t *m);
ferry_status_t ferry_rpc_fetch_read(ferry_wire_reader_t *in, ferry_rpc_fetch_t *m);
ferry_status_t ferry_rpc_notify_write(ferry_wire_writer_t *out, const char *from,
                                      const void *msg, size_t length);
ferry_status_t ferry_rpc_notify_read(ferry_wire_reader_t *in, ferry_rpc_notify_t *m);
ferry_status_t ferry_rpc_invalidate_write(ferry_wire_writer_t *out, const char *name,
                                          uint64_t generation);
ferry_status_t ferry_rpc_invalidate_read(ferry_wire_reader_t *in, ferry_rpc_invalidate_t *m);
ferry_status_t ferry_rpc_probe_reply_write(ferry_wire_writer_t *out, uint64_t generation,
                                           const char *name);
ferry_status_t ferry_rpc_probe_reply_read(ferry_wire_reader_t *in, ferry_rpc_probe_reply_t *m);

#endif
