/*
 * ferry._core.Segment: a peer's segment (or this engine's own) opened by
 * name.  Requests name it as their target.
 */
#include "ferry_py.h"

int fpy_segment_of(fpy_engine_t *engine, PyObject *object, ferry_segment_h *handle_p)
{
    if (!PyObject_TypeCheck(object, &fpy_segment_type)) {
        PyErr_Format(PyExc_TypeError, "a Segment is needed, not %s", Py_TYPE(object)->tp_name);
        return -1;
    }
    fpy_segment_t *segment = (fpy_segment_t *)object;
    if (segment->engine != engine) {
        fpy_raise(FERRY_ERR_INVALID_HANDLE, "segment %R belongs to another engine", segment->name);
        return -1;
    }
    if (segment->handle == NULL) {
        fpy_raise_closed("the segment is closed");
        return -1;
    }
    *handle_p = segment->handle;
    return 0;
}

/* A Segment object of engine, not yet open (handle NULL, not linked). */
static fpy_segment_t *segment_alloc(PyTypeObject *type, fpy_engine_t *engine, PyObject *name)
{
    fpy_segment_t *self = (fpy_segment_t *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(engine);
    self->engine = engine;
    Py_INCREF(name);
    self->name = name;
    fpy_link_init(&self->link, (PyObject *)self);
    return self;
}

static PyObject *segment_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"engine", "name", NULL};
    fpy_engine_t *engine;
    PyObject *name;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!U:Segment", keywords, &fpy_engine_type,
                                     &engine, &name))
        return NULL;
    if (!fpy_engine_usable(engine))
        return NULL;
    const char *text = PyUnicode_AsUTF8(name);
    if (text == NULL)
        return NULL;
    fpy_segment_t *self = segment_alloc(type, engine, name);
    if (self == NULL)
        return NULL;
    ferry_status_t status;
    ferry_segment_h handle = NULL;
    FPY_BLOCKING(engine, status = ferry_segment_open(engine->handle, text, &handle));
    if (status != FERRY_OK) {
        Py_DECREF(self);
        return fpy_raise(status, "ferry_segment_open(%R)", name);
    }
    self->handle = handle;
    fpy_link_add(engine, FPY_SEGMENTS, &self->link);
    return (PyObject *)self;
}

/* The "name" of a segment's descriptor: a blob's segment is known by it. */
static PyObject *described_name(fpy_engine_t *engine, ferry_segment_h handle)
{
    char *json = NULL;
    ferry_status_t status;
    FPY_BLOCKING(engine, status = ferry_segment_describe(engine->handle, handle, &json));
    if (status != FERRY_OK)
        return fpy_raise(status, "ferry_segment_describe of a blob's segment");
    PyObject *module = PyImport_ImportModule("json");
    PyObject *described = module ? PyObject_CallMethod(module, "loads", "s", json) : NULL;
    free(json);
    Py_XDECREF(module);
    if (described == NULL)
        return NULL;
    PyObject *name = PyDict_Check(described) ? PyDict_GetItemString(described, "name") : NULL;
    if (name == NULL || !PyUnicode_Check(name)) {
        Py_DECREF(described);
        return fpy_raise(FERRY_ERR_DECODE, "a blob's segment descriptor names no segment");
    }
    Py_INCREF(name);
    Py_DECREF(described);
    return name;
}

/* Segment._open_blob(engine, blob): ferry_segment_open_blob, no store lookup. */
static PyObject *segment_open_blob(PyObject *cls, PyObject *args)
{
    fpy_engine_t *engine;
    Py_buffer blob;
    if (!PyArg_ParseTuple(args, "O!y*:open_blob", &fpy_engine_type, &engine, &blob))
        return NULL;
    if (!fpy_engine_usable(engine)) {
        PyBuffer_Release(&blob);
        return NULL;
    }
    ferry_status_t status;
    ferry_segment_h handle = NULL;
    size_t length = (size_t)blob.len;
    FPY_BLOCKING(engine,
                 status = ferry_segment_open_blob(engine->handle, blob.buf, length, &handle));
    PyBuffer_Release(&blob);
    if (status != FERRY_OK)
        return fpy_raise(status, "ferry_segment_open_blob(%zu bytes)", length);
    PyObject *name = described_name(engine, handle);
    fpy_segment_t *self = name ? segment_alloc((PyTypeObject *)cls, engine, name) : NULL;
    Py_XDECREF(name);
    if (self == NULL) {
        FPY_BLOCKING(engine, ferry_segment_close(engine->handle, handle));
        return NULL;
    }
    self->handle = handle;
    fpy_link_add(engine, FPY_SEGMENTS, &self->link);
    return (PyObject *)self;
}

ferry_status_t fpy_segment_release(fpy_segment_t *self)
{
    ferry_status_t status = FERRY_OK;
    fpy_engine_t *engine = self->engine;
    ferry_segment_h handle = self->handle;
    self->handle = NULL; /* first: a close from another thread meanwhile does nothing */
    if (handle != NULL && engine->handle != NULL)
        FPY_BLOCKING(engine, status = ferry_segment_close(engine->handle, handle));
    fpy_link_remove(&self->link);
    return status;
}

static PyObject *segment_close(fpy_segment_t *self, PyObject *unused)
{
    (void)unused;
    if (self->handle == NULL)
        Py_RETURN_NONE;
    ferry_status_t status = fpy_segment_release(self);
    if (status != FERRY_OK)
        return fpy_raise(status, "ferry_segment_close(%R)", self->name);
    Py_RETURN_NONE;
}

static void segment_dealloc(fpy_segment_t *self)
{
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    if (self->engine != NULL) {
        fpy_segment_release(self);
        Py_DECREF(self->engine);
    }
    Py_XDECREF(self->name);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int segment_usable(fpy_segment_t *self)
{
    if (!fpy_engine_usable(self->engine))
        return 0;
    if (self->handle != NULL)
        return 1;
    fpy_raise_closed("the segment is closed");
    return 0;
}

static PyObject *segment_describe_json(fpy_segment_t *self, PyObject *unused)
{
    (void)unused;
    if (!segment_usable(self))
        return NULL;
    char *json = NULL;
    ferry_status_t status;
    ferry_segment_h handle = self->handle;
    fpy_engine_t *engine = self->engine;
    FPY_BLOCKING(engine, status = ferry_segment_describe(engine->handle, handle, &json));
    if (status != FERRY_OK)
        return fpy_raise(status, "ferry_segment_describe(%R)", self->name);
    PyObject *text = PyUnicode_FromString(json);
    free(json);
    return text;
}

static PyObject *segment_refresh(fpy_segment_t *self, PyObject *unused)
{
    (void)unused;
    if (!segment_usable(self))
        return NULL;
    const char *name = PyUnicode_AsUTF8(self->name);
    if (name == NULL)
        return NULL;
    ferry_status_t status;
    fpy_engine_t *engine = self->engine;
    FPY_BLOCKING(engine, status = ferry_segment_refresh(engine->handle, name));
    if (status != FERRY_OK)
        return fpy_raise(status, "ferry_segment_refresh(%R)", self->name);
    Py_RETURN_NONE;
}

static PyObject *segment_probe(fpy_segment_t *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"timeout", NULL};
    PyObject *timeout = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:probe", keywords, &timeout))
        return NULL;
    int timeout_ms = 0; /* None: FERRY_RPC_TIMEOUT */
    if (timeout != Py_None) {
        double seconds = PyFloat_AsDouble(timeout);
        if (seconds == -1.0 && PyErr_Occurred())
            return NULL;
        if (!(seconds > 0) || seconds > 86400.0)
            return fpy_raise(FERRY_ERR_INVALID_PARAM,
                             "probe(timeout=%R): seconds, above 0 and at most a day", timeout);
        timeout_ms = seconds * 1000.0 < 1.0 ? 1 : (int)(seconds * 1000.0);
    }
    if (!segment_usable(self))
        return NULL;
    ferry_status_t status;
    ferry_segment_h handle = self->handle;
    fpy_engine_t *engine = self->engine;
    FPY_BLOCKING(engine, status = ferry_segment_probe(engine->handle, handle, timeout_ms));
    if (status != FERRY_OK)
        return fpy_raise(status, "ferry_segment_probe(%R)", self->name);
    Py_RETURN_NONE;
}

static PyObject *segment_closed(fpy_segment_t *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->handle == NULL || !self->engine->open);
}

static PyObject *segment_repr(fpy_segment_t *self)
{
    return PyUnicode_FromFormat("<ferry.Segment %R%s>", self->name,
                                self->handle == NULL ? " closed" : "");
}

static PyMethodDef segment_methods[] = {
    {"close", (PyCFunction)segment_close, METH_NOARGS,
     "close()\n--\n\nClose the segment (requests to it can no longer be submitted)."},
    {"describe_json", (PyCFunction)segment_describe_json, METH_NOARGS,
     "describe_json() -> str\n--\n\nThe segment's decoded descriptor as JSON text."},
    {"refresh", (PyCFunction)segment_refresh, METH_NOARGS,
     "refresh()\n--\n\nFetch the segment's descriptor again."},
    {"probe", (PyCFunction)(void (*)(void))segment_probe, METH_VARARGS | METH_KEYWORDS,
     "probe(timeout=None)\n--\n\nAsk the segment's owner whether it is alive (GIL released):\n"
     "returns None when it answered, raises PeerError (a dead peer, at once), TransferTimeout\n"
     "(no answer within timeout seconds; None: FERRY_RPC_TIMEOUT) or MetadataError\n"
     "(FERRY_ERR_STALE: the owner restarted).  Takes at most about 3x timeout."},
    {"_open_blob", (PyCFunction)segment_open_blob, METH_VARARGS | METH_CLASS,
     "_open_blob(engine, blob)\n--\n\nOpen the segment a blob describes (Engine.open_blob)."},
    {"__enter__", fpy_enter, METH_NOARGS, NULL},
    {"__exit__", fpy_exit, METH_VARARGS, NULL},
    {NULL},
};

static PyMemberDef segment_members[] = {
    {"name", T_OBJECT, offsetof(fpy_segment_t, name), READONLY, "The name it was opened by."},
    {NULL},
};

static PyGetSetDef segment_getset[] = {
    {"closed", (getter)segment_closed, NULL, "True after close() or its engine's close().", NULL},
    {NULL},
};

PyTypeObject fpy_segment_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._core.Segment",
    .tp_basicsize = sizeof(fpy_segment_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Segment(engine, name)\n--\n\nA segment opened by name (Engine.open): the target "
              "of requests.",
    .tp_new = segment_new,
    .tp_dealloc = (destructor)segment_dealloc,
    .tp_methods = segment_methods,
    .tp_members = segment_members,
    .tp_getset = segment_getset,
    .tp_repr = (reprfunc)segment_repr,
    .tp_weaklistoffset = offsetof(fpy_segment_t, weakrefs),
};
