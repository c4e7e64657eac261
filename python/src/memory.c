/*
 * ferry._core.Memory: one registration (of a buffer-protocol object, a
 * __cuda_array_interface__ object or a DLPack tensor) or one allocation
 * from ferry_alloc.  Host memory from alloc exports the buffer protocol, so
 * numpy.frombuffer and memoryview give arrays on it; every such view and
 * every Request on it counts in users, and the memory is not given back
 * while any remains (close() raises BusyError, Engine.close() leaves it).
 */
#include "ferry_py.h"

#include <string.h>

/* DLPack's ABI (dlpack.h, v0.x, which every producer still hands out
 * through __dlpack__): written from the published header's layout. */
typedef struct {
    int32_t device_type;
    int32_t device_id;
} fpy_dl_device_t;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} fpy_dl_dtype_t;

typedef struct {
    void *data;
    fpy_dl_device_t device;
    int32_t ndim;
    fpy_dl_dtype_t dtype;
    int64_t *shape;
    int64_t *strides; /* NULL: compact row-major */
    uint64_t byte_offset;
} fpy_dl_tensor_t;

typedef struct fpy_dl_managed {
    fpy_dl_tensor_t dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct fpy_dl_managed *self);
} fpy_dl_managed_t;

enum {
    FPY_DL_CPU = 1,
    FPY_DL_CUDA = 2,
    FPY_DL_CUDA_HOST = 3,
    FPY_DL_ROCM = 10,
    FPY_DL_ROCM_HOST = 11,
    FPY_DL_CUDA_MANAGED = 13
};

/* Host memory kinds (the buffer protocol applies); others are devices. */
static int location_is_host(const char *location)
{
    return location[0] == '\0' || strncmp(location, "cpu", 3) == 0 ||
           strncmp(location, "cxl", 3) == 0;
}

fpy_memory_t *fpy_memory_new(fpy_engine_t *engine, fpy_mem_kind_t kind)
{
    fpy_memory_t *self = PyObject_New(fpy_memory_t, &fpy_memory_type);
    if (self == NULL)
        return NULL;
    Py_INCREF(engine);
    self->engine = engine;
    fpy_link_init(&self->link, (PyObject *)self);
    self->kind = kind;
    self->live = 0;
    self->addr = NULL;
    self->length = 0;
    self->flags = 0;
    self->readonly = 0;
    self->device = 0;
    self->location[0] = '\0';
    self->users = 0;
    memset(&self->view, 0, sizeof(self->view));
    self->owner = NULL;
    self->dl_managed = NULL;
    self->weakrefs = NULL;
    return self;
}

/* What the Memory holds of the object it registered. */
static void drop_owner(fpy_memory_t *self)
{
    if (self->kind == FPY_MEM_BUFFER && self->view.obj != NULL)
        PyBuffer_Release(&self->view);
    if (self->dl_managed != NULL) {
        fpy_dl_managed_t *managed = self->dl_managed;
        self->dl_managed = NULL;
        if (managed->deleter != NULL) {
            /* a producer's deleter may run Python code: not with an error set */
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            managed->deleter(managed);
            PyErr_Restore(type, value, traceback);
        }
    }
    Py_CLEAR(self->owner);
}

ferry_status_t fpy_memory_release(fpy_memory_t *self)
{
    ferry_status_t status = FERRY_OK;
    fpy_engine_t *engine = self->engine;
    int live = self->live;
    self->live = 0; /* first: a close from another thread meanwhile does nothing */
    if (live && engine->handle != NULL) {
        void *addr = self->addr;
        if (self->kind == FPY_MEM_ALLOC)
            FPY_BLOCKING(engine, status = ferry_free(engine->handle, addr));
        else
            FPY_BLOCKING(engine, status = ferry_unregister(engine->handle, addr));
    }
    drop_owner(self);
    if (self->link.next != &self->link) {
        fpy_link_remove(&self->link);
        fpy_engine_memory_gone(engine);
    }
    return status;
}

static int check_flags(unsigned flags)
{
    if (flags & ~(unsigned)(FERRY_REG_REMOTE | FERRY_REG_DEFER_PUBLISH)) {
        fpy_raise(FERRY_ERR_INVALID_PARAM, "flags 0x%x: REMOTE_READ, REMOTE_WRITE, DEFER_PUBLISH",
                  flags);
        return -1;
    }
    return 0;
}

static unsigned effective_flags(unsigned flags)
{
    return flags & FERRY_REG_REMOTE ? flags : flags | FERRY_REG_REMOTE; /* 0 means REMOTE */
}

/* Register [addr, +length) for self; links it on success. */
static PyObject *memory_register(fpy_memory_t *self, const char *location, unsigned flags)
{
    fpy_engine_t *engine = self->engine;
    if (self->length == 0) {
        Py_DECREF(self);
        return fpy_raise(FERRY_ERR_INVALID_PARAM, "register: an empty buffer");
    }
    if (self->readonly && (flags & FERRY_REG_REMOTE_WRITE)) {
        Py_DECREF(self);
        return fpy_raise(FERRY_ERR_INVALID_PARAM,
                         "register: a read-only buffer cannot take remote writes "
                         "(pass flags=ferry.REMOTE_READ)");
    }
    snprintf(self->location, sizeof(self->location), "%s", location);
    self->flags = flags;
    ferry_status_t status;
    void *addr = self->addr;
    size_t length = self->length;
    FPY_BLOCKING(engine, status = ferry_register(engine->handle, addr, length, location, flags));
    if (status != FERRY_OK) {
        PyObject *result =
            fpy_raise(status, "ferry_register(%zu bytes at %p, \"%s\")", length, addr, location);
        Py_DECREF(self);
        return result;
    }
    self->live = 1;
    fpy_link_add(engine, FPY_MEMORY, &self->link);
    return (PyObject *)self;
}

static int shape_bytes(PyObject *shape, Py_ssize_t itemsize, size_t *bytes_p)
{
    PyObject *fast = PySequence_Fast(shape, "__cuda_array_interface__ shape is a tuple");
    if (fast == NULL)
        return -1;
    size_t bytes = (size_t)itemsize;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
        Py_ssize_t n = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(fast, i), PyExc_OverflowError);
        if (n < 0) {
            Py_DECREF(fast);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a negative dimension");
            return -1;
        }
        bytes *= (size_t)n;
    }
    Py_DECREF(fast);
    *bytes_p = bytes;
    return 0;
}

/* __cuda_array_interface__: {"data": (ptr, readonly), "shape", "typestr",
 * "strides": None (contiguous) or row-major contiguous, "version"}. */
static int from_cuda_array_interface(fpy_memory_t *self, PyObject *interface)
{
    if (!PyDict_Check(interface)) {
        PyErr_SetString(PyExc_TypeError, "__cuda_array_interface__ is not a dict");
        return -1;
    }
    PyObject *data = PyDict_GetItemString(interface, "data");
    PyObject *shape = PyDict_GetItemString(interface, "shape");
    PyObject *typestr = PyDict_GetItemString(interface, "typestr");
    PyObject *strides = PyDict_GetItemString(interface, "strides");
    PyObject *mask = PyDict_GetItemString(interface, "mask");
    if (data == NULL || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2 || shape == NULL ||
        typestr == NULL || !PyUnicode_Check(typestr)) {
        PyErr_SetString(PyExc_ValueError,
                        "__cuda_array_interface__ lacks data (ptr, readonly), shape or typestr");
        return -1;
    }
    if (mask != NULL && mask != Py_None) {
        PyErr_SetString(PyExc_ValueError, "__cuda_array_interface__ with a mask");
        return -1;
    }
    const char *type = PyUnicode_AsUTF8(typestr);
    long itemsize = type != NULL && strlen(type) >= 3 ? strtol(type + 2, NULL, 10) : 0;
    if (itemsize <= 0) {
        PyErr_Format(PyExc_ValueError, "__cuda_array_interface__ typestr %R", typestr);
        return -1;
    }
    size_t bytes;
    if (shape_bytes(shape, itemsize, &bytes) < 0)
        return -1;
    if (strides != NULL && strides != Py_None) {
        /* contiguous row-major strides are allowed, anything else is not */
        PyObject *fast_shape = PySequence_Fast(shape, "shape");
        PyObject *fast_strides = fast_shape ? PySequence_Fast(strides, "strides is a tuple") : NULL;
        int ok = fast_strides != NULL &&
                 PySequence_Fast_GET_SIZE(fast_strides) == PySequence_Fast_GET_SIZE(fast_shape);
        Py_ssize_t expect = itemsize;
        for (Py_ssize_t i = (ok ? PySequence_Fast_GET_SIZE(fast_shape) : 0) - 1; ok && i >= 0;
             i--) {
            Py_ssize_t n = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast_shape, i));
            Py_ssize_t s = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast_strides, i));
            if (n != 1 && s != expect)
                ok = 0;
            expect *= n;
        }
        Py_XDECREF(fast_shape);
        Py_XDECREF(fast_strides);
        if (PyErr_Occurred())
            return -1;
        if (!ok) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__: only contiguous arrays can be registered");
            return -1;
        }
    }
    PyObject *pointer = PyTuple_GET_ITEM(data, 0);
    void *addr = PyLong_AsVoidPtr(pointer);
    if (addr == NULL && PyErr_Occurred())
        return -1;
    int readonly = PyObject_IsTrue(PyTuple_GET_ITEM(data, 1));
    if (readonly < 0)
        return -1;
    self->addr = addr;
    self->length = bytes;
    self->readonly = readonly;
    self->device = 1;
    return 0;
}

/* __dlpack__(): a "dltensor" capsule that we consume (renamed
 * "used_dltensor"), calling its deleter when the registration ends. */
static int from_dlpack(fpy_memory_t *self, PyObject *object, char *location, size_t size)
{
    PyObject *capsule = PyObject_CallMethod(object, "__dlpack__", NULL);
    if (capsule == NULL)
        return -1;
    fpy_dl_managed_t *managed = PyCapsule_GetPointer(capsule, "dltensor");
    if (managed == NULL) {
        Py_DECREF(capsule);
        return -1;
    }
    if (PyCapsule_SetName(capsule, "used_dltensor") < 0) {
        Py_DECREF(capsule);
        return -1;
    }
    self->owner = capsule;
    self->dl_managed = managed;
    const fpy_dl_tensor_t *tensor = &managed->dl_tensor;
    size_t itemsize = ((size_t)tensor->dtype.bits * tensor->dtype.lanes + 7) / 8;
    size_t bytes = itemsize;
    int64_t expect = 1;
    int contiguous = 1;
    for (int32_t i = tensor->ndim - 1; i >= 0; i--) {
        bytes *= (size_t)tensor->shape[i];
        if (tensor->strides != NULL && tensor->shape[i] != 1 && tensor->strides[i] != expect)
            contiguous = 0;
        expect *= tensor->shape[i];
    }
    if (!contiguous) {
        PyErr_SetString(PyExc_ValueError, "__dlpack__: only contiguous tensors can be registered");
        return -1;
    }
    self->addr = (char *)tensor->data + tensor->byte_offset;
    self->length = bytes;
    int32_t id = tensor->device.device_id;
    switch (tensor->device.device_type) {
    case FPY_DL_CPU:
    case FPY_DL_CUDA_HOST:
    case FPY_DL_ROCM_HOST:
        snprintf(location, size, "cpu");
        break;
    case FPY_DL_CUDA:
    case FPY_DL_CUDA_MANAGED:
        snprintf(location, size, "cuda:%d", (int)id);
        self->device = 1;
        break;
    case FPY_DL_ROCM:
        snprintf(location, size, "hip:%d", (int)id);
        self->device = 1;
        break;
    default:
        fpy_raise(FERRY_ERR_UNSUPPORTED, "__dlpack__: device type %d",
                  (int)tensor->device.device_type);
        return -1;
    }
    return 0;
}

/* Engine.register(object, location=None, flags=0) */
static PyObject *memory_register_object(PyObject *cls, PyObject *args, PyObject *kwargs)
{
    (void)cls;
    static char *keywords[] = {"engine", "object", "location", "flags", NULL};
    fpy_engine_t *engine;
    PyObject *object;
    const char *location = NULL;
    unsigned flags = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O|zI:register", keywords, &fpy_engine_type,
                                     &engine, &object, &location, &flags))
        return NULL;
    if (!fpy_engine_usable(engine) || check_flags(flags) < 0)
        return NULL;
    flags = effective_flags(flags);
    if (PyObject_TypeCheck(object, &fpy_memory_type))
        return fpy_raise(FERRY_ERR_INVALID_PARAM, "register: this Memory is registered already");
    char found[72] = "cpu";
    fpy_memory_t *self;
    if (PyObject_CheckBuffer(object)) {
        self = fpy_memory_new(engine, FPY_MEM_BUFFER);
        if (self == NULL)
            return NULL;
        int writable = (flags & FERRY_REG_REMOTE_WRITE) != 0;
        if (PyObject_GetBuffer(object, &self->view,
                               PyBUF_ANY_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
            Py_DECREF(self);
            if (!PyErr_ExceptionMatches(PyExc_BufferError) && /* numpy says ValueError */
                !PyErr_ExceptionMatches(PyExc_ValueError))
                return NULL;
            PyErr_Clear();
            if (writable && PyObject_GetBuffer(object, &self->view, PyBUF_ANY_CONTIGUOUS) == 0) {
                PyBuffer_Release(&self->view);
                return fpy_raise(FERRY_ERR_INVALID_PARAM,
                                 "register: a read-only buffer cannot take remote writes "
                                 "(pass flags=ferry.REMOTE_READ)");
            }
            PyErr_Clear();
            return fpy_raise(FERRY_ERR_INVALID_PARAM, "register: the buffer is not contiguous");
        }
        self->addr = self->view.buf;
        self->length = (size_t)self->view.len;
        self->readonly = self->view.readonly;
    } else if (PyObject_HasAttrString(object, "__cuda_array_interface__")) {
        self = fpy_memory_new(engine, FPY_MEM_CAI);
        if (self == NULL)
            return NULL;
        PyObject *interface = PyObject_GetAttrString(object, "__cuda_array_interface__");
        int rc = interface != NULL ? from_cuda_array_interface(self, interface) : -1;
        Py_XDECREF(interface);
        if (rc < 0) {
            Py_DECREF(self);
            return NULL;
        }
        Py_INCREF(object);
        self->owner = object;
        snprintf(found, sizeof(found), "*"); /* the engine tells device memory from the pointer */
    } else if (PyObject_HasAttrString(object, "__dlpack__")) {
        self = fpy_memory_new(engine, FPY_MEM_DLPACK);
        if (self == NULL)
            return NULL;
        if (from_dlpack(self, object, found, sizeof(found)) < 0) {
            Py_DECREF(self);
            return NULL;
        }
    } else {
        return PyErr_Format(PyExc_TypeError,
                            "register() takes an object with the buffer protocol, "
                            "__cuda_array_interface__ or __dlpack__, not %s",
                            Py_TYPE(object)->tp_name);
    }
    return memory_register(self, location != NULL ? location : found, flags);
}

/* Engine.alloc(nbytes, location="cpu", flags=0) as a Memory */
static PyObject *memory_alloc(PyObject *cls, PyObject *args, PyObject *kwargs)
{
    (void)cls;
    static char *keywords[] = {"engine", "nbytes", "location", "flags", NULL};
    fpy_engine_t *engine;
    Py_ssize_t nbytes;
    const char *location = NULL;
    unsigned flags = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!n|zI:alloc", keywords, &fpy_engine_type,
                                     &engine, &nbytes, &location, &flags))
        return NULL;
    if (!fpy_engine_usable(engine) || check_flags(flags) < 0)
        return NULL;
    flags = effective_flags(flags);
    if (nbytes <= 0)
        return fpy_raise(FERRY_ERR_INVALID_PARAM, "alloc(%zd): the size must be positive", nbytes);
    if (location == NULL)
        location = "cpu";
    fpy_memory_t *self = fpy_memory_new(engine, FPY_MEM_ALLOC);
    if (self == NULL)
        return NULL;
    void *addr = NULL;
    ferry_status_t status;
    FPY_BLOCKING(engine,
                 status = ferry_alloc(engine->handle, (size_t)nbytes, location, flags, &addr));
    if (status != FERRY_OK) {
        Py_DECREF(self);
        return fpy_raise(status, "ferry_alloc(%zd bytes, \"%s\")", nbytes, location);
    }
    self->addr = addr;
    self->length = (size_t)nbytes;
    self->flags = flags;
    self->device = !location_is_host(location);
    snprintf(self->location, sizeof(self->location), "%s", location);
    self->live = 1;
    fpy_link_add(engine, FPY_MEMORY, &self->link);
    return (PyObject *)self;
}

static int memory_usable(fpy_memory_t *self)
{
    if (self->live && self->engine->open)
        return 1;
    fpy_raise_closed(self->live ? "the memory's engine is closed" : "the memory is closed");
    return 0;
}

static PyObject *memory_close(fpy_memory_t *self, PyObject *unused)
{
    (void)unused;
    if (!self->live)
        Py_RETURN_NONE;
    if (self->users > 0)
        return fpy_raise(FERRY_ERR_BUSY,
                         "Memory.close: %zd array(s) or Request(s) still use this memory",
                         self->users);
    ferry_status_t status = fpy_memory_release(self);
    if (status != FERRY_OK)
        return fpy_raise(status, "Memory.close");
    Py_RETURN_NONE;
}

static void memory_dealloc(fpy_memory_t *self)
{
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    fpy_memory_release(self);
    Py_DECREF(self->engine);
    PyObject_Free(self);
}

static int memory_getbuffer(fpy_memory_t *self, Py_buffer *view, int flags)
{
    if (!self->live) {
        PyErr_SetString(PyExc_BufferError, "the memory is closed");
        return -1;
    }
    if (self->device || self->kind != FPY_MEM_ALLOC) {
        PyErr_SetString(PyExc_BufferError, self->kind == FPY_MEM_STORAGE
                                               ? "storage (a file range) has no host buffer"
                                           : self->device ? "device memory has no host buffer"
                                                          : "use the registered object itself");
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->addr, (Py_ssize_t)self->length, 0, flags) <
        0)
        return -1;
    self->users++;
    return 0;
}

void fpy_memory_unuse(fpy_memory_t *self)
{
    /* The engine closed while this was in use: give it back now. */
    if (--self->users == 0 && self->live && !self->engine->open)
        fpy_memory_release(self);
}

static void memory_releasebuffer(fpy_memory_t *self, Py_buffer *view)
{
    (void)view;
    fpy_memory_unuse(self);
}

static PyBufferProcs memory_as_buffer = {
    .bf_getbuffer = (getbufferproc)memory_getbuffer,
    .bf_releasebuffer = (releasebufferproc)memory_releasebuffer,
};

static PyObject *memory_addr(fpy_memory_t *self, void *closure)
{
    (void)closure;
    if (!memory_usable(self))
        return NULL;
    return PyLong_FromVoidPtr(self->addr);
}

static PyObject *memory_nbytes(fpy_memory_t *self, void *closure)
{
    (void)closure;
    return PyLong_FromSize_t(self->length);
}

static PyObject *memory_location(fpy_memory_t *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(self->location);
}

static PyObject *memory_flags(fpy_memory_t *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLong(self->flags);
}

static PyObject *memory_closed(fpy_memory_t *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(!self->live || !self->engine->open);
}

static PyObject *memory_is_device(fpy_memory_t *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->device);
}

/* Device memory from alloc as CUDA arrays of bytes (torch.as_tensor, CuPy). */
static PyObject *memory_cuda_array_interface(fpy_memory_t *self, void *closure)
{
    (void)closure;
    if (!memory_usable(self))
        return NULL;
    if (self->kind != FPY_MEM_ALLOC || strncmp(self->location, "cuda", 4) != 0) {
        PyErr_SetString(PyExc_AttributeError,
                        "__cuda_array_interface__ is only for CUDA memory from alloc");
        return NULL;
    }
    return Py_BuildValue("{s:(Ni),s:(n),s:s,s:O,s:i,s:O}", "data", PyLong_FromVoidPtr(self->addr),
                         0, "shape", (Py_ssize_t)self->length, "typestr", "|u1", "strides", Py_None,
                         "version", 3, "stream", Py_None);
}

static PyObject *memory_repr(fpy_memory_t *self)
{
    return PyUnicode_FromFormat("<ferry.Memory %zu bytes at %p, %s%s>", self->length, self->addr,
                                self->location, self->live ? "" : ", closed");
}

static PyMethodDef memory_methods[] = {
    {"close", (PyCFunction)memory_close, METH_NOARGS,
     "close()\n--\n\nUnregister (waiting for transfers on it, telling peers) or, for memory\n"
     "from alloc, free it.  BusyError while arrays or Requests still use it."},
    {"__enter__", fpy_enter, METH_NOARGS, NULL},
    {"__exit__", fpy_exit, METH_VARARGS, NULL},
    {"_register", (PyCFunction)(void (*)(void))memory_register_object,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS, NULL},
    {"_alloc", (PyCFunction)(void (*)(void))memory_alloc, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     NULL},
    {"_register_storage", (PyCFunction)(void (*)(void))fpy_memory_register_storage,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS, NULL},
    {NULL},
};

static PyGetSetDef memory_getset[] = {
    {"addr", (getter)memory_addr, NULL,
     "The address peers use in requests to this memory (an int).", NULL},
    {"nbytes", (getter)memory_nbytes, NULL, "Its length in bytes.", NULL},
    {"location", (getter)memory_location, NULL,
     "Where it is: \"cpu\", \"cuda:0\", ... (\"*\": detected by the engine).", NULL},
    {"flags", (getter)memory_flags, NULL, "REMOTE_READ | REMOTE_WRITE | DEFER_PUBLISH bits.", NULL},
    {"is_device", (getter)memory_is_device, NULL,
     "True for accelerator memory and storage (no host buffer behind addr).", NULL},
    {"closed", (getter)memory_closed, NULL, "True after close() or its engine's close().", NULL},
    {"__cuda_array_interface__", (getter)memory_cuda_array_interface, NULL,
     "CUDA memory from alloc as a 1-D array of bytes.", NULL},
    {NULL},
};

PyTypeObject fpy_memory_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.Memory",
    .tp_basicsize = sizeof(fpy_memory_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Registered or allocated memory of an engine (from Engine.register or\n"
              "Engine.alloc).  Use it as a request's local buffer; host memory from alloc\n"
              "also exports the buffer protocol (memoryview, numpy.frombuffer).",
    .tp_dealloc = (destructor)memory_dealloc,
    .tp_methods = memory_methods,
    .tp_getset = memory_getset,
    .tp_as_buffer = &memory_as_buffer,
    .tp_repr = (reprfunc)memory_repr,
    .tp_weaklistoffset = offsetof(fpy_memory_t, weakrefs),
};
