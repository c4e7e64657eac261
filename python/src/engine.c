/*
 * ferry._core.Engine: one ferry_engine_h and the list of what it handed out.
 * Teardown order (also in ferry_py.h): batches, segments, memory, engine.
 */
#include "ferry_py.h"

void fpy_link_init(fpy_link_t *link, PyObject *self)
{
    link->prev = link->next = link;
    link->self = self;
}

void fpy_link_add(fpy_engine_t *engine, int kind, fpy_link_t *link)
{
    fpy_link_t *head = &engine->children[kind];
    link->next = head;
    link->prev = head->prev;
    head->prev->next = link;
    head->prev = link;
}

void fpy_link_remove(fpy_link_t *link)
{
    link->prev->next = link->next;
    link->next->prev = link->prev;
    link->prev = link->next = link;
}

PyObject *fpy_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    Py_INCREF(self);
    return self;
}

PyObject *fpy_exit(PyObject *self, PyObject *args)
{
    (void)args;
    PyObject *result = PyObject_CallMethod(self, "close", NULL);
    if (result == NULL)
        return NULL;
    Py_DECREF(result);
    Py_RETURN_FALSE;
}

int fpy_engine_usable(fpy_engine_t *engine)
{
    if (engine->open)
        return 1;
    fpy_raise_closed("the engine is closed");
    return 0;
}

static PyObject *engine_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    (void)args;
    (void)kwargs;
    fpy_engine_t *self = (fpy_engine_t *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    for (int k = 0; k < FPY_KINDS; k++)
        fpy_link_init(&self->children[k], NULL);
    return (PyObject *)self;
}

/* A config string argument: None leaves the field to its FERRY_* variable. */
static int config_field(PyObject *value, const char **field, uint64_t bit, uint64_t *mask)
{
    if (value == NULL || value == Py_None)
        return 0;
    if (!PyUnicode_Check(value)) {
        PyErr_Format(PyExc_TypeError, "Engine(): configuration values are str or None, not %s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    *field = PyUnicode_AsUTF8(value);
    if (*field == NULL)
        return -1;
    *mask |= bit;
    return 0;
}

static int engine_init(fpy_engine_t *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"name",       "metadata", "rpc_address", "transports",
                               "module_dir", "host_id",  NULL};
    PyObject *values[6] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOOOO:Engine", keywords, &values[0],
                                     &values[1], &values[2], &values[3], &values[4], &values[5]))
        return -1;
    if (self->handle != NULL || self->open) {
        PyErr_SetString(PyExc_RuntimeError, "Engine.__init__ called twice");
        return -1;
    }
    ferry_config_t config = {0};
    const char **fields[6] = {&config.name,       &config.metadata,   &config.rpc_address,
                              &config.transports, &config.module_dir, &config.host_id};
    const uint64_t bits[6] = {FERRY_CONFIG_FIELD_NAME,        FERRY_CONFIG_FIELD_METADATA,
                              FERRY_CONFIG_FIELD_RPC_ADDRESS, FERRY_CONFIG_FIELD_TRANSPORTS,
                              FERRY_CONFIG_FIELD_MODULE_DIR,  FERRY_CONFIG_FIELD_HOST_ID};
    for (int i = 0; i < 6; i++)
        if (config_field(values[i], fields[i], bits[i], &config.field_mask) < 0)
            return -1;
    ferry_status_t status;
    ferry_engine_h handle = NULL;
    FPY_BLOCKING(self, status = ferry_engine_create(&config, &handle));
    if (status != FERRY_OK) {
        fpy_raise(status, "ferry_engine_create");
        return -1;
    }
    self->handle = handle;
    self->open = 1;
    return 0;
}

/* Close every child of one kind (memory still in use stays: *deferred). */
static void close_children(fpy_engine_t *self, int kind, int *deferred)
{
    fpy_link_t *head = &self->children[kind];
    fpy_link_t *link = head->next;
    while (link != head) {
        fpy_link_t *next = link->next;
        ferry_status_t status = FERRY_OK;
        PyObject *child = link->self;
        Py_INCREF(child); /* the release may drop the last reference elsewhere */
        if (kind == FPY_BATCHES)
            status = fpy_batch_release((fpy_batch_t *)child);
        else if (kind == FPY_SEGMENTS)
            status = fpy_segment_release((fpy_segment_t *)child);
        else if (((fpy_memory_t *)child)->users > 0)
            *deferred = 1; /* a view or a request still uses it: it stays */
        else
            status = fpy_memory_release((fpy_memory_t *)child);
        next = link->next == link ? next : link->next; /* unlinked, or still linked */
        Py_DECREF(child);
        (void)status; /* logged by the library; teardown goes on */
        link = next;
    }
}

/* Destroy the library engine: after close() once nothing uses its memory. */
static void engine_destroy(fpy_engine_t *self)
{
    ferry_engine_h handle = self->handle;
    self->handle = NULL;
    if (handle != NULL)
        FPY_BLOCKING(self, ferry_engine_destroy(handle));
}

/* A closed engine whose teardown waited for its memory ends with the last of it. */
void fpy_engine_memory_gone(fpy_engine_t *self)
{
    if (!self->open && self->handle != NULL &&
        self->children[FPY_MEMORY].next == &self->children[FPY_MEMORY])
        engine_destroy(self);
}

static PyObject *engine_close(fpy_engine_t *self, PyObject *unused)
{
    (void)unused;
    if (!self->open)
        Py_RETURN_NONE;
    if (self->calls > 0)
        return fpy_raise(FERRY_ERR_BUSY, "Engine.close: %zd call(s) in progress on other threads",
                         self->calls);
    self->open = 0; /* from here every use raises ClosedError */
    int deferred = 0;
    for (int kind = 0; kind < FPY_KINDS; kind++)
        close_children(self, kind, &deferred);
    if (!deferred)
        engine_destroy(self);
    Py_RETURN_NONE;
}

static void engine_dealloc(fpy_engine_t *self)
{
    /* Children hold references: none is left, unless they are being
     * collected with us, which only unlinks them. */
    for (int kind = 0; kind < FPY_KINDS; kind++)
        while (self->children[kind].next != &self->children[kind])
            fpy_link_remove(self->children[kind].next);
    self->open = 0;
    engine_destroy(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *engine_enter(PyObject *self, PyObject *unused)
{
    if (!fpy_engine_usable((fpy_engine_t *)self))
        return NULL;
    return fpy_enter(self, unused);
}

static PyObject *engine_segment_name(fpy_engine_t *self, void *closure)
{
    (void)closure;
    if (!fpy_engine_usable(self))
        return NULL;
    return PyUnicode_FromString(ferry_engine_segment_name(self->handle));
}

static PyObject *engine_closed(fpy_engine_t *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(!self->open);
}

static PyObject *engine_progress(fpy_engine_t *self, PyObject *unused)
{
    (void)unused;
    if (!fpy_engine_usable(self))
        return NULL;
    unsigned events;
    FPY_BLOCKING(self, events = ferry_engine_progress(self->handle));
    return PyLong_FromUnsignedLong(events);
}

static PyObject *engine_publish(fpy_engine_t *self, PyObject *unused)
{
    (void)unused;
    if (!fpy_engine_usable(self))
        return NULL;
    ferry_status_t status;
    FPY_BLOCKING(self, status = ferry_publish(self->handle));
    if (status != FERRY_OK)
        return fpy_raise(status, "ferry_publish");
    Py_RETURN_NONE;
}

static PyObject *engine_refresh(fpy_engine_t *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"name", NULL};
    const char *name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|z:refresh", keywords, &name))
        return NULL;
    if (!fpy_engine_usable(self))
        return NULL;
    ferry_status_t status;
    FPY_BLOCKING(self, status = ferry_segment_refresh(self->handle, name));
    if (status != FERRY_OK)
        return fpy_raise(status, "ferry_segment_refresh(%s)", name ? name : "all");
    Py_RETURN_NONE;
}

static PyObject *engine_open(fpy_engine_t *self, PyObject *name)
{
    return PyObject_CallFunctionObjArgs((PyObject *)&fpy_segment_type, (PyObject *)self, name,
                                        NULL);
}

/* The message of a notify: bytes, str (UTF-8) or any buffer. */
static int notify_message(PyObject *message, Py_buffer *view)
{
    if (PyUnicode_Check(message)) {
        Py_ssize_t length;
        const char *text = PyUnicode_AsUTF8AndSize(message, &length);
        if (text == NULL)
            return -1;
        return PyBuffer_FillInfo(view, message, (void *)text, length, 1, PyBUF_SIMPLE);
    }
    if (PyObject_GetBuffer(message, view, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "a notify message is bytes, str or a buffer, not %s",
                     Py_TYPE(message)->tp_name);
        return -1;
    }
    if (view->len > FERRY_NOTIFY_MAX) {
        PyBuffer_Release(view);
        fpy_raise(FERRY_ERR_INVALID_PARAM, "notify of %zd bytes (at most %d)", view->len,
                  FERRY_NOTIFY_MAX);
        return -1;
    }
    return 0;
}

static PyObject *engine_notify_send(fpy_engine_t *self, PyObject *args)
{
    PyObject *segment, *message;
    if (!PyArg_ParseTuple(args, "O!O:notify_send", &fpy_segment_type, &segment, &message))
        return NULL;
    ferry_segment_h handle;
    if (!fpy_engine_usable(self) || fpy_segment_of(self, segment, &handle) < 0)
        return NULL;
    Py_buffer view;
    if (notify_message(message, &view) < 0)
        return NULL;
    ferry_status_t status;
    FPY_BLOCKING(self, status = ferry_notify_send(self->handle, handle, view.buf, view.len));
    PyBuffer_Release(&view);
    if (status != FERRY_OK)
        return fpy_raise(status, "ferry_notify_send to %R", ((fpy_segment_t *)segment)->name);
    Py_RETURN_NONE;
}

static PyObject *engine_notify_recv(fpy_engine_t *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"max", NULL};
    Py_ssize_t max = 64;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|n:notify_recv", keywords, &max))
        return NULL;
    if (!fpy_engine_usable(self))
        return NULL;
    if (max <= 0 || max > 4096)
        return fpy_raise(FERRY_ERR_INVALID_PARAM, "notify_recv(max=%zd): 1 to 4096", max);
    ferry_notify_t *notes = PyMem_RawMalloc((size_t)max * sizeof(*notes));
    if (notes == NULL)
        return PyErr_NoMemory();
    size_t count = 0;
    ferry_status_t status;
    FPY_BLOCKING(self, status = ferry_notify_recv(self->handle, notes, (size_t)max, &count));
    PyObject *list = NULL;
    if (status != FERRY_OK) {
        fpy_raise(status, "ferry_notify_recv");
        goto out;
    }
    list = PyList_New((Py_ssize_t)count);
    for (size_t i = 0; list != NULL && i < count; i++) {
        PyObject *item = Py_BuildValue("(sy#)", notes[i].from, (const char *)notes[i].msg,
                                       (Py_ssize_t)notes[i].length);
        if (item == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
out:
    PyMem_RawFree(notes);
    return list;
}

static PyObject *engine_export_blob(fpy_engine_t *self, PyObject *unused)
{
    (void)unused;
    if (!fpy_engine_usable(self))
        return NULL;
    size_t length = 0;
    ferry_status_t status;
    FPY_BLOCKING(self, status = ferry_engine_export_blob(self->handle, NULL, 0, &length));
    /* A registration between the two calls grows it: ask again, with room. */
    for (int attempt = 0; status == FERRY_OK && attempt < 8; attempt++) {
        size_t capacity = length + 4096;
        PyObject *blob = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)capacity);
        if (blob == NULL)
            return NULL;
        char *bytes = PyBytes_AS_STRING(blob);
        FPY_BLOCKING(self,
                     status = ferry_engine_export_blob(self->handle, bytes, capacity, &length));
        if (status == FERRY_OK) {
            if (_PyBytes_Resize(&blob, (Py_ssize_t)length) < 0)
                return NULL;
            return blob;
        }
        Py_DECREF(blob);
        if (status == FERRY_ERR_OUT_OF_RANGE)
            status = FERRY_OK; /* still too small: length has the new size */
    }
    return fpy_raise(status != FERRY_OK ? status : FERRY_ERR_BUSY, "ferry_engine_export_blob");
}

static PyMethodDef engine_methods[] = {
    {"close", (PyCFunction)engine_close, METH_NOARGS,
     "close()\n--\n\nClose the engine: its batches (waiting for requests in flight), segments\n"
     "and registrations, then the library engine.  Memory that an array or a Request\n"
     "still uses stays valid (and registered) until they are gone.  Closing twice is\n"
     "allowed; any other use after close raises ClosedError."},
    {"__enter__", engine_enter, METH_NOARGS, NULL},
    {"__exit__", fpy_exit, METH_VARARGS, NULL},
    {"progress", (PyCFunction)engine_progress, METH_NOARGS,
     "progress() -> int\n--\n\nAdvance transports that progress on the calling thread (ucx);\n"
     "returns the number of events handled.  Optional (see ferry_engine_progress)."},
    {"publish", (PyCFunction)engine_publish, METH_NOARGS,
     "publish()\n--\n\nPublish registrations made with flags including DEFER_PUBLISH."},
    {"refresh", (PyCFunction)(void (*)(void))engine_refresh, METH_VARARGS | METH_KEYWORDS,
     "refresh(name=None)\n--\n\nFetch a segment's descriptor again (None: every open one)."},
    {"open", (PyCFunction)engine_open, METH_O,
     "open(name) -> Segment\n--\n\nOpen a peer's segment by name (p2p: \"host:port\"; pmix:\n"
     "\"rank:N\").  Blocks (GIL released) while the descriptor is fetched."},
    {"notify_send", (PyCFunction)engine_notify_send, METH_VARARGS,
     "notify_send(segment, message)\n--\n\nDeliver message (bytes or str, at most 4096 bytes)\n"
     "to the segment's owner; returns once the owner queued it."},
    {"notify_recv", (PyCFunction)(void (*)(void))engine_notify_recv, METH_VARARGS | METH_KEYWORDS,
     "notify_recv(max=64) -> list[tuple[str, bytes]]\n--\n\nTake up to max queued notifies,\n"
     "oldest first, as (sender's segment name, message); [] when none is queued."},
    {"export_blob", (PyCFunction)engine_export_blob, METH_NOARGS,
     "export_blob() -> bytes\n--\n\nThis engine's segment descriptor as an opaque blob, for\n"
     "applications that pass metadata themselves: a peer opens it with open_blob, without\n"
     "the metadata store.  A snapshot; export again after registering more."},
    {"_stats", (PyCFunction)fpy_engine_stats, METH_O,
     "_stats(kind) -> list[tuple]\n--\n\nferry_stats_snapshot of kind (STATS_BY_*): (name,\n"
     "requests, failures, bytes, latency buckets) per entry.  Use stats()."},
    {"stats_reset", (PyCFunction)fpy_engine_stats_reset, METH_NOARGS,
     "stats_reset()\n--\n\nZero every statistics counter (the peers stay listed)."},
    {NULL},
};

static PyGetSetDef engine_getset[] = {
    {"segment_name", (getter)engine_segment_name, NULL,
     "The name peers open this engine's segment by.", NULL},
    {"closed", (getter)engine_closed, NULL, "True after close().", NULL},
    {NULL},
};

PyTypeObject fpy_engine_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._core.Engine",
    .tp_basicsize = sizeof(fpy_engine_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Engine(*, name=None, metadata=None, rpc_address=None, transports=None,\n"
              "       module_dir=None, host_id=None)\n"
              "--\n\n"
              "A Ferry engine: registers memory, publishes it as this process's segment and\n"
              "moves bytes to and from peers' segments.  Each argument left None comes from\n"
              "its FERRY_* variable (FERRY_SEGMENT_NAME, FERRY_METADATA, FERRY_RPC_ADDRESS,\n"
              "FERRY_TRANSPORTS, FERRY_MODULE_DIR, FERRY_HOST_ID) or its default.",
    .tp_new = engine_new,
    .tp_init = (initproc)engine_init,
    .tp_dealloc = (destructor)engine_dealloc,
    .tp_methods = engine_methods,
    .tp_getset = engine_getset,
    .tp_weaklistoffset = offsetof(fpy_engine_t, weakrefs),
};
