/*
 * ferry._core.Request: one prepared READ or WRITE, made once and submitted
 * as often as wanted (a loop that re-submits the same requests pays no
 * argument parsing).  It keeps its local buffer alive: a Memory (counted in
 * its users) or a view of a buffer-protocol object (a bytearray under a view
 * cannot be resized), and its Segment.
 */
#include "ferry_py.h"

static PyObject *request_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"op",     "local",  "segment",   "remote",
                               "length", "offset", "transport", NULL};
    int op;
    PyObject *local, *segment, *length_obj = Py_None, *transport = Py_None;
    unsigned long long remote;
    Py_ssize_t offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iOO!K|OnO:Request", keywords, &op, &local,
                                     &fpy_segment_type, &segment, &remote, &length_obj, &offset,
                                     &transport))
        return NULL;
    if (op != FERRY_OP_READ && op != FERRY_OP_WRITE)
        return fpy_raise(FERRY_ERR_INVALID_PARAM, "Request: op %d is neither READ nor WRITE", op);
    if (transport != Py_None && !PyUnicode_Check(transport))
        return PyErr_Format(PyExc_TypeError, "Request: transport is a str or None, not %s",
                            Py_TYPE(transport)->tp_name);
    fpy_request_t *self = (fpy_request_t *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(segment);
    self->segment = (fpy_segment_t *)segment;
    char *base;
    size_t size;
    if (PyObject_TypeCheck(local, &fpy_memory_type)) {
        fpy_memory_t *memory = (fpy_memory_t *)local;
        if (!memory->live) {
            Py_DECREF(self);
            return fpy_raise_closed("Request: the local Memory is closed");
        }
        if (memory->kind == FPY_MEM_STORAGE) { /* PROT_NONE: a peer's target, not a source */
            Py_DECREF(self);
            return fpy_raise(FERRY_ERR_INVALID_PARAM,
                             "Request: storage memory is a target for peers, not a local buffer");
        }
        if (FPY_WRITES_LOCAL(op) && memory->readonly) {
            Py_DECREF(self);
            return fpy_raise(FERRY_ERR_INVALID_PARAM, "Request: a READ into read-only memory");
        }
        Py_INCREF(memory);
        memory->users++;
        self->memory = memory;
        base = memory->addr;
        size = memory->length;
    } else {
        int flags = PyBUF_ANY_CONTIGUOUS | (FPY_WRITES_LOCAL(op) ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(local, &self->view, flags) < 0) {
            Py_DECREF(self);
            if (!PyErr_ExceptionMatches(PyExc_BufferError) && /* numpy says ValueError */
                !PyErr_ExceptionMatches(PyExc_ValueError) && PyObject_CheckBuffer(local))
                return NULL;
            PyErr_Clear();
            if (!PyObject_CheckBuffer(local))
                return PyErr_Format(PyExc_TypeError,
                                    "Request: local is a Memory or a buffer (bytearray, numpy "
                                    "array, memoryview), not %s",
                                    Py_TYPE(local)->tp_name);
            return fpy_raise(FERRY_ERR_INVALID_PARAM,
                             FPY_WRITES_LOCAL(op) ? "Request: a READ needs a writable, contiguous "
                                                    "local buffer"
                                                  : "Request: the local buffer is not contiguous");
        }
        self->has_view = 1;
        base = self->view.buf;
        size = (size_t)self->view.len;
    }
    size_t length;
    if (length_obj == Py_None) {
        length = offset >= 0 && (size_t)offset <= size ? size - (size_t)offset : 0;
    } else {
        Py_ssize_t n = PyNumber_AsSsize_t(length_obj, PyExc_OverflowError);
        if (n == -1 && PyErr_Occurred()) {
            Py_DECREF(self);
            return NULL;
        }
        length = n < 0 ? SIZE_MAX : (size_t)n;
    }
    if (offset < 0 || (size_t)offset > size || length > size - (size_t)offset || length == 0) {
        Py_DECREF(self);
        return fpy_raise(FERRY_ERR_OUT_OF_RANGE,
                         "Request: %zu bytes at offset %zd of a local buffer of %zu bytes",
                         length == SIZE_MAX ? 0 : length, offset, size);
    }
    if (transport != Py_None) {
        Py_INCREF(transport);
        self->transport = transport;
        if ((self->req.transport = PyUnicode_AsUTF8(transport)) == NULL) {
            Py_DECREF(self);
            return NULL;
        }
    }
    self->req.opcode = (ferry_opcode_t)op;
    self->req.local = base + offset;
    self->req.target_offset = remote;
    self->req.length = length;
    return (PyObject *)self;
}

static void request_dealloc(fpy_request_t *self)
{
    if (self->has_view)
        PyBuffer_Release(&self->view);
    if (self->memory != NULL) {
        fpy_memory_unuse(self->memory);
        Py_DECREF(self->memory);
    }
    Py_XDECREF(self->segment);
    Py_XDECREF(self->transport);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *request_op(fpy_request_t *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(self->req.opcode);
}

static PyObject *request_remote(fpy_request_t *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(self->req.target_offset);
}

static PyObject *request_length(fpy_request_t *self, void *closure)
{
    (void)closure;
    return PyLong_FromSize_t(self->req.length);
}

static PyObject *request_local_addr(fpy_request_t *self, void *closure)
{
    (void)closure;
    return PyLong_FromVoidPtr(self->req.local);
}

static PyObject *request_repr(fpy_request_t *self)
{
    return PyUnicode_FromFormat("<ferry.Request %s %zu bytes %p -> %R @ 0x%llx>",
                                self->req.opcode == FERRY_OP_READ ? "READ" : "WRITE",
                                self->req.length, self->req.local, self->segment->name,
                                (unsigned long long)self->req.target_offset);
}

static PyMemberDef request_members[] = {
    {"segment", T_OBJECT, offsetof(fpy_request_t, segment), READONLY, "The target Segment."},
    {"transport", T_OBJECT, offsetof(fpy_request_t, transport), READONLY,
     "The transport it asks for, or None (the engine picks)."},
    {NULL},
};

static PyGetSetDef request_getset[] = {
    {"op", (getter)request_op, NULL, "READ (remote to local) or WRITE (local to remote).", NULL},
    {"remote", (getter)request_remote, NULL, "The address in the target segment.", NULL},
    {"length", (getter)request_length, NULL, "Bytes to move.", NULL},
    {"local_addr", (getter)request_local_addr, NULL, "The local address (an int).", NULL},
    {NULL},
};

PyTypeObject fpy_request_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.Request",
    .tp_basicsize = sizeof(fpy_request_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Request(op, local, segment, remote, length=None, offset=0, transport=None)\n--\n\n"
              "One transfer: op READ (segment to local) or WRITE (local to segment) of\n"
              "length bytes (default: the rest of local after offset) between local[offset:]\n"
              "and address remote of segment.  local is a Memory or any contiguous buffer\n"
              "(writable for READ).  transport None lets the engine pick; a name (\"tcp\",\n"
              "\"shm\", ...) makes that transport serve it.  Build once, submit many times.",
    .tp_new = request_new,
    .tp_dealloc = (destructor)request_dealloc,
    .tp_members = request_members,
    .tp_getset = request_getset,
    .tp_repr = (reprfunc)request_repr,
};
