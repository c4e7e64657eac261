/*
 * ferry._core: the CPython types behind the `ferry` package (one object per
 * file: engine.c, memory.c, segment.c, request.c, batch.c; module.c and
 * errors.c glue them).
 *
 * Lifetimes.  Every object an engine hands out (Memory, Segment, Batch)
 * holds a strong reference to its Engine, and links itself into the
 * engine's list of its kind; the engine holds no reference to them (no
 * cycle: collection never needs the GC).  Engine.close() closes its
 * children first, in this order: batches (waiting for requests in flight),
 * segments, memory; then the library engine.  Memory still used by a Python
 * view (an array from alloc) or by a Request stays registered; the library
 * engine is then destroyed when the last of those goes and the Engine object
 * with it (its memory stays valid until then, so no view ever dangles).
 * A Request holds a reference to its Memory (counted in Memory.users) or a
 * buffer view of its local object, and to its Segment; a Batch keeps the
 * requests of the round in flight alive until they finished.
 *
 * Threads.  The GIL is released around every call that can block (open,
 * register, unregister, submit, wait, notify, create, destroy).  While one
 * runs, engine->calls > 0 and Engine.close() refuses (BusyError), and so
 * does Batch.close() while a call on that batch runs (batch->calls): nothing
 * is freed under a call in progress on another thread.  Memory and Segment
 * mark themselves closed before they call the library, so a second close
 * from another thread does nothing.
 */
#ifndef FERRY_PY_H
#define FERRY_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <ferry/ferry.h>

/* A child's link in its engine's list (borrowed: the child owns the engine,
 * not the other way round).  An unlinked node points at itself. */
typedef struct fpy_link {
    struct fpy_link *prev, *next;
    PyObject *self;
} fpy_link_t;

enum { FPY_BATCHES, FPY_SEGMENTS, FPY_MEMORY, FPY_KINDS };

typedef struct fpy_engine {
    PyObject ob_base;               /* PyObject_HEAD, spelled out for clang-format */
    ferry_engine_h handle;          /* NULL once the library engine is destroyed */
    int open;                       /* 0 from close(): every use raises ClosedError */
    Py_ssize_t calls;               /* calls with the GIL released (close refuses while > 0) */
    fpy_link_t children[FPY_KINDS]; /* list heads, one per kind, in closing order */
    PyObject *weakrefs;
} fpy_engine_t;

/* How a Memory came to be, which decides how it is given back. */
typedef enum {
    FPY_MEM_BUFFER,  /* ferry_register of a buffer-protocol object (view held) */
    FPY_MEM_CAI,     /* ferry_register of a __cuda_array_interface__ object (ref held) */
    FPY_MEM_DLPACK,  /* ferry_register of a DLPack tensor (managed tensor held) */
    FPY_MEM_ALLOC,   /* ferry_alloc; ferry_free gives it back */
    FPY_MEM_STORAGE, /* ferry_register_storage: a file range at a PROT_NONE address */
} fpy_mem_kind_t;

typedef struct fpy_memory {
    PyObject ob_base;
    fpy_engine_t *engine; /* strong */
    fpy_link_t link;
    fpy_mem_kind_t kind;
    int live; /* registered or allocated, not yet given back */
    void *addr;
    size_t length;
    unsigned flags;
    int readonly; /* remote write refused, never a read destination */
    int device;   /* not host memory: no buffer protocol */
    char location[72];
    Py_ssize_t users; /* buffer views exported + Requests using it */
    Py_buffer view;   /* FPY_MEM_BUFFER: the registered object's view */
    PyObject *owner;  /* FPY_MEM_CAI: the object; FPY_MEM_DLPACK: the capsule */
    void *dl_managed; /* FPY_MEM_DLPACK: DLManagedTensor, deleted on release */
    PyObject *weakrefs;
} fpy_memory_t;

typedef struct fpy_segment {
    PyObject ob_base;
    fpy_engine_t *engine; /* strong */
    fpy_link_t link;
    ferry_segment_h handle; /* NULL once closed */
    PyObject *name;
    PyObject *weakrefs;
} fpy_segment_t;

typedef struct fpy_request {
    PyObject ob_base;
    ferry_request_t req;    /* target is filled from segment at submit */
    fpy_segment_t *segment; /* strong */
    fpy_memory_t *memory;   /* strong, counted in memory->users; or NULL */
    Py_buffer view;         /* the local object's view when memory is NULL */
    int has_view;
    PyObject *transport; /* str or NULL; req.transport points into it */
} fpy_request_t;

typedef struct fpy_batch {
    PyObject ob_base;
    fpy_engine_t *engine; /* strong */
    fpy_link_t link;
    ferry_batch_h handle; /* NULL once closed */
    size_t max;
    ferry_request_t *scratch; /* max entries: the requests of one submit */
    int scratch_busy;         /* a submit on another thread uses scratch */
    int submitting;           /* submits inside the library (GIL released) */
    Py_ssize_t calls;         /* its calls in progress (GIL released): close refuses */
    PyObject *keep;           /* list: the Requests of the round, alive while in flight */
    int round_done;           /* wait() saw every request finish */
    PyObject *dict;           /* for Python subclasses' attributes */
    PyObject *weakrefs;
} fpy_batch_t;

extern PyTypeObject fpy_engine_type, fpy_memory_type, fpy_segment_type, fpy_request_type,
    fpy_batch_type;

/* errors.c: raise the exception class of a Ferry status (family classes from
 * ferry._errors), with "what: message (FERRY_ERR_X)". Return NULL. */
PyObject *fpy_raise(ferry_status_t status, const char *fmt, ...);
/* ClosedError for an object used after close(). */
PyObject *fpy_raise_closed(const char *what);
int fpy_errors_init(void);

/* engine.c */
int fpy_engine_usable(fpy_engine_t *engine); /* 0 and ClosedError when closed */
void fpy_link_init(fpy_link_t *link, PyObject *self);
void fpy_link_add(fpy_engine_t *engine, int kind, fpy_link_t *link);
void fpy_link_remove(fpy_link_t *link);
/* __enter__ returning self and __exit__ calling self.close(), for every type. */
PyObject *fpy_enter(PyObject *self, PyObject *unused);
PyObject *fpy_exit(PyObject *self, PyObject *args);
/* After a Memory left the list: a closed engine waiting for it is destroyed. */
void fpy_engine_memory_gone(fpy_engine_t *engine);
/* The handle of a Segment of this engine; -1 with ClosedError/ArgumentError. */
int fpy_segment_of(fpy_engine_t *engine, PyObject *object, ferry_segment_h *handle_p);

/* A call into the library with the GIL released, counted on the engine. */
#define FPY_BLOCKING(engine, statement)                                                            \
    do {                                                                                           \
        (engine)->calls++;                                                                         \
        PyThreadState *fpy_saved_ = PyEval_SaveThread();                                           \
        statement;                                                                                 \
        PyEval_RestoreThread(fpy_saved_);                                                          \
        (engine)->calls--;                                                                         \
    } while (0)

/* memory.c: give the registration or allocation back (GIL released inside). */
ferry_status_t fpy_memory_release(fpy_memory_t *memory);
/* One user (a view, a Request) fewer. */
void fpy_memory_unuse(fpy_memory_t *memory);
/* segment.c / batch.c: the same for the engine's teardown. */
ferry_status_t fpy_segment_release(fpy_segment_t *segment);
ferry_status_t fpy_batch_release(fpy_batch_t *batch);

/* memory.c: a new Memory of engine, not yet registered (live 0, not linked). */
fpy_memory_t *fpy_memory_new(fpy_engine_t *engine, fpy_mem_kind_t kind);
/* storage.c: Memory._register_storage (Engine.register_storage). */
PyObject *fpy_memory_register_storage(PyObject *cls, PyObject *args, PyObject *kwargs);
/* stats.c: Engine._stats, Engine.stats_reset, _core.stats_latency_ns. */
PyObject *fpy_engine_stats(fpy_engine_t *self, PyObject *kind);
PyObject *fpy_engine_stats_reset(fpy_engine_t *self, PyObject *unused);
PyObject *fpy_stats_latency_ns(PyObject *module, PyObject *args);

/* The opcode of a request whose local buffer must be writable. */
#define FPY_WRITES_LOCAL(op) ((op) == FERRY_OP_READ)

#endif
