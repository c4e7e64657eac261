/*
 * Engine.register_storage: a range of a file or block device registered as
 * a storage buffer (ferry_register_storage) that peers READ and WRITE like
 * memory.  It comes back as a Memory of kind FPY_MEM_STORAGE: its addr is a
 * reserved PROT_NONE range, never memory, so it exports no buffer and is no
 * local buffer of a request; close() (or collection, or the engine's close)
 * unregisters it as any registration.
 */
#include "ferry_py.h"

#include <string.h>

/* The options a caller may pass (ferry.STORAGE_*). */
#define FPY_STORAGE_OPTIONS                                                                        \
    (FERRY_STORAGE_BUFFERED | FERRY_STORAGE_DIRECT | FERRY_STORAGE_DURABLE | FERRY_STORAGE_SHARED)

/* Memory._register_storage(engine, path, offset=0, length=None, flags=0, options=0) */
PyObject *fpy_memory_register_storage(PyObject *cls, PyObject *args, PyObject *kwargs)
{
    (void)cls;
    static char *keywords[] = {"engine", "path", "offset", "length", "flags", "options", NULL};
    fpy_engine_t *engine;
    PyObject *path_obj, *length_obj = Py_None;
    unsigned long long offset = 0;
    unsigned flags = 0, options = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O&|KOII:register_storage", keywords,
                                     &fpy_engine_type, &engine, PyUnicode_FSConverter, &path_obj,
                                     &offset, &length_obj, &flags, &options))
        return NULL;
    PyObject *result = NULL;
    ferry_storage_region_t region = {0};
    region.path = PyBytes_AS_STRING(path_obj);
    region.offset = offset;
    region.field_mask =
        FERRY_STORAGE_FIELD_OFFSET | FERRY_STORAGE_FIELD_FLAGS | FERRY_STORAGE_FIELD_OPTIONS;
    if (length_obj != Py_None) {
        region.length = PyLong_AsUnsignedLongLong(length_obj);
        if (region.length == (uint64_t)-1 && PyErr_Occurred())
            goto out;
        region.field_mask |= FERRY_STORAGE_FIELD_LENGTH;
    }
    if (flags & ~(unsigned)(FERRY_REG_REMOTE | FERRY_REG_DEFER_PUBLISH)) {
        fpy_raise(FERRY_ERR_INVALID_PARAM, "flags 0x%x: REMOTE_READ, REMOTE_WRITE, DEFER_PUBLISH",
                  flags);
        goto out;
    }
    if (options & ~(unsigned)FPY_STORAGE_OPTIONS) {
        fpy_raise(FERRY_ERR_INVALID_PARAM,
                  "options 0x%x: STORAGE_BUFFERED, _DIRECT, _DURABLE, _SHARED", options);
        goto out;
    }
    region.flags = flags & FERRY_REG_REMOTE ? flags : flags | FERRY_REG_REMOTE;
    region.options = options;
    if (!fpy_engine_usable(engine))
        goto out;
    fpy_memory_t *self = fpy_memory_new(engine, FPY_MEM_STORAGE);
    if (self == NULL)
        goto out;
    void *addr = NULL;
    ferry_status_t status;
    FPY_BLOCKING(engine, status = ferry_register_storage(engine->handle, &region, &addr));
    if (status != FERRY_OK) {
        Py_DECREF(self);
        fpy_raise(status, "ferry_register_storage(%R)", path_obj);
        goto out;
    }
    self->addr = addr;
    /* the length the library took (the default runs to the end of the file) */
    self->length = (size_t)region.length;
    if (length_obj == Py_None) {
        PyObject *os = PyImport_ImportModule("os");
        PyObject *size = os ? PyObject_CallMethod(os, "stat", "O", path_obj) : NULL;
        PyObject *bytes = size ? PyObject_GetAttrString(size, "st_size") : NULL;
        unsigned long long total = bytes ? PyLong_AsUnsignedLongLong(bytes) : 0;
        Py_XDECREF(bytes);
        Py_XDECREF(size);
        Py_XDECREF(os);
        PyErr_Clear(); /* a block device's st_size is 0: the length stays unknown (0) */
        self->length = total > offset ? (size_t)(total - offset) : 0;
    }
    self->flags = region.flags;
    self->device = 1; /* no host buffer behind addr */
    snprintf(self->location, sizeof(self->location), "file");
    self->live = 1;
    fpy_link_add(engine, FPY_MEMORY, &self->link);
    result = (PyObject *)self;
out:
    Py_DECREF(path_obj);
    return result;
}
