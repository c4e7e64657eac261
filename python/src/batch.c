/*
 * ferry._core.Batch: a ferry_batch_h and the Requests of its round.  What a
 * request in flight points at stays alive: the Requests are kept (keep) until
 * a wait saw them finish; a batch given back (close, collection, its
 * engine's close) first waits for what is in flight.
 */
#include "ferry_py.h"

#include <math.h>

static PyTypeObject *status_type; /* TransferStatus, a struct sequence */

static PyStructSequence_Field status_fields[] = {
    {"state", "WAITING (0), PENDING (1), COMPLETED (2), FAILED (3) or CANCELLED (4): "
              "ferry.State"},
    {"error", "why it FAILED or was CANCELLED: a ferry_status_t value (0 otherwise)"},
    {"transferred", "bytes moved (its length once COMPLETED)"},
    {"transport", "the transport that served it, or None"},
    {NULL, NULL},
};

static PyStructSequence_Desc status_desc = {
    "ferry.TransferStatus",
    "The state of one request of a batch (Batch.status).",
    status_fields,
    4,
};

int fpy_batch_types_init(PyObject *module)
{
    status_type = PyStructSequence_NewType(&status_desc);
    if (status_type == NULL)
        return -1;
    Py_INCREF(status_type);
    return PyModule_AddObject(module, "TransferStatus", (PyObject *)status_type);
}

static PyObject *batch_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"engine", "max_requests", NULL};
    fpy_engine_t *engine;
    Py_ssize_t max = 128;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!|n:Batch", keywords, &fpy_engine_type,
                                     &engine, &max))
        return NULL;
    if (!fpy_engine_usable(engine))
        return NULL;
    if (max <= 0 || max > (1 << 24))
        return fpy_raise(FERRY_ERR_INVALID_PARAM, "Batch(max_requests=%zd): 1 to %d", max, 1 << 24);
    fpy_batch_t *self = (fpy_batch_t *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(engine);
    self->engine = engine;
    fpy_link_init(&self->link, (PyObject *)self);
    self->max = (size_t)max;
    self->keep = PyList_New(0);
    self->scratch = PyMem_RawCalloc((size_t)max, sizeof(ferry_request_t));
    if (self->keep == NULL || self->scratch == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    ferry_status_t status = ferry_batch_create(engine->handle, (size_t)max, &self->handle);
    if (status != FERRY_OK) {
        self->handle = NULL;
        Py_DECREF(self);
        return fpy_raise(status, "ferry_batch_create(%zd)", max);
    }
    fpy_link_add(engine, FPY_BATCHES, &self->link);
    return (PyObject *)self;
}

ferry_status_t fpy_batch_release(fpy_batch_t *self)
{
    ferry_status_t status = FERRY_OK;
    fpy_engine_t *engine = self->engine;
    if (self->handle != NULL) {
        ferry_batch_h handle = self->handle;
        self->handle = NULL;
        /* What is in flight finishes first (the transports bound it). */
        FPY_BLOCKING(engine, {
            ferry_batch_wait(handle, -1);
            status = ferry_batch_destroy(handle);
        });
    }
    if (self->keep != NULL)
        PyList_SetSlice(self->keep, 0, PyList_GET_SIZE(self->keep), NULL);
    fpy_link_remove(&self->link);
    return status;
}

static int batch_usable(fpy_batch_t *self)
{
    if (!fpy_engine_usable(self->engine))
        return 0;
    if (self->handle != NULL)
        return 1;
    fpy_raise_closed("the batch is closed");
    return 0;
}

/* Forget the kept Requests when nothing of the round is in flight. */
static void keep_trim(fpy_batch_t *self)
{
    ferry_xfer_status_t status;
    for (size_t i = 0; ferry_batch_status(self->handle, i, &status) == FERRY_OK; i++)
        if (status.state == FERRY_XFER_PENDING)
            return;
    PyList_SetSlice(self->keep, 0, PyList_GET_SIZE(self->keep), NULL);
}

/* One request of a submit into *out; a tuple is made a Request first (kept
 * in *made).  0, or -1 with an exception. */
static int request_of(fpy_batch_t *self, PyObject *item, ferry_request_t *out, PyObject **made)
{
    *made = NULL;
    if (!PyObject_TypeCheck(item, &fpy_request_type)) {
        if (!PyTuple_Check(item)) {
            PyErr_Format(PyExc_TypeError,
                         "submit() takes Requests or (op, local, segment, remote[, length]) "
                         "tuples, not %s",
                         Py_TYPE(item)->tp_name);
            return -1;
        }
        item = *made = PyObject_Call((PyObject *)&fpy_request_type, item, NULL);
        if (item == NULL)
            return -1;
    }
    fpy_request_t *request = (fpy_request_t *)item;
    fpy_segment_t *segment = request->segment;
    if (segment->engine != self->engine) {
        fpy_raise(FERRY_ERR_INVALID_HANDLE, "submit: segment %R belongs to another engine",
                  segment->name);
        return -1;
    }
    if (segment->handle == NULL) {
        fpy_raise_closed("submit: the request's segment is closed");
        return -1;
    }
    if (request->memory != NULL && !request->memory->live) {
        fpy_raise_closed("submit: the request's local Memory is closed");
        return -1;
    }
    *out = request->req;
    out->target = segment->handle;
    return 0;
}

static PyObject *batch_submit(fpy_batch_t *self, PyObject *requests)
{
    if (!batch_usable(self))
        return NULL;
    PyObject *fast = NULL;
    PyObject *const *items;
    Py_ssize_t count;
    if (PyObject_TypeCheck(requests, &fpy_request_type)) {
        items = &requests;
        count = 1;
    } else {
        fast = PySequence_Fast(requests, "submit() takes a Request or a sequence of them");
        if (fast == NULL)
            return NULL;
        items = PySequence_Fast_ITEMS(fast);
        count = PySequence_Fast_GET_SIZE(fast);
    }
    PyObject *result = NULL;
    ferry_request_t *reqs = self->scratch;
    int own_scratch = 0, claimed_scratch = 0;
    if (count == 0 || (size_t)count > self->max) {
        fpy_raise(count ? FERRY_ERR_TOO_MANY : FERRY_ERR_INVALID_PARAM,
                  "submit of %zd requests to a batch of %zu", count, self->max);
        goto out;
    }
    if (self->scratch_busy) { /* another thread is inside a submit of this batch */
        reqs = PyMem_RawMalloc((size_t)count * sizeof(*reqs));
        if (reqs == NULL) {
            PyErr_NoMemory();
            goto out;
        }
        own_scratch = 1;
    } else {
        self->scratch_busy = claimed_scratch = 1; /* until the library has the requests */
    }
    if ((size_t)(PyList_GET_SIZE(self->keep) + count) > self->max)
        keep_trim(self);
    Py_ssize_t kept_before = PyList_GET_SIZE(self->keep);
    self->submitting++; /* from the first kept request to the library's answer */
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *made;
        if (request_of(self, items[i], &reqs[i], &made) < 0 ||
            PyList_Append(self->keep, made != NULL ? made : items[i]) < 0) {
            Py_XDECREF(made);
            goto out_unkeep;
        }
        Py_XDECREF(made);
    }
    ferry_status_t status;
    ferry_batch_h handle = self->handle;
    self->calls++;
    FPY_BLOCKING(self->engine, status = ferry_batch_submit(handle, reqs, (size_t)count));
    self->calls--;
    if (status != FERRY_OK) {
        fpy_raise(status, "ferry_batch_submit of %zd request(s)", count);
        goto out_unkeep;
    }
    result = Py_None;
    Py_INCREF(result);
    goto out_submitted;
out_unkeep: /* nothing was queued: keep none of them */
    PyList_SetSlice(self->keep, kept_before, PyList_GET_SIZE(self->keep), NULL);
out_submitted:
    self->submitting--;
out:
    if (own_scratch)
        PyMem_RawFree(reqs);
    if (claimed_scratch)
        self->scratch_busy = 0;
    Py_XDECREF(fast);
    return result;
}

/* timeout in seconds (None: no limit) as ferry_batch_wait's milliseconds */
static int timeout_ms_of(PyObject *timeout, int *ms_p)
{
    if (timeout == NULL || timeout == Py_None) {
        *ms_p = -1;
        return 0;
    }
    double seconds = PyFloat_AsDouble(timeout);
    if (seconds == -1.0 && PyErr_Occurred())
        return -1;
    if (!(seconds >= 0) || seconds > 2e6) {
        fpy_raise(FERRY_ERR_INVALID_PARAM, "timeout %R: seconds from 0 to 2e6, or None", timeout);
        return -1;
    }
    *ms_p = (int)ceil(seconds * 1000.0);
    return 0;
}

static PyObject *batch_wait(fpy_batch_t *self, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    PyObject *timeout = NULL;
    if (nargs > 1 || (kwnames != NULL && (PyTuple_GET_SIZE(kwnames) != 1 || nargs != 0 ||
                                          !PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0)) ||
                                          PyUnicode_CompareWithASCIIString(
                                              PyTuple_GET_ITEM(kwnames, 0), "timeout") != 0))) {
        PyErr_SetString(PyExc_TypeError, "wait(timeout=None) takes one argument, timeout");
        return NULL;
    }
    if (nargs == 1 || kwnames != NULL)
        timeout = args[0];
    int ms;
    if (!batch_usable(self) || timeout_ms_of(timeout, &ms) < 0)
        return NULL;
    ferry_status_t status;
    ferry_batch_h handle = self->handle;
    self->calls++;
    FPY_BLOCKING(self->engine, status = ferry_batch_wait(handle, ms));
    self->calls--;
    if (status == FERRY_ERR_TIMEOUT)
        return fpy_raise(status, "ferry_batch_wait(%d ms): requests still in flight", ms);
    /* Every request finished: what they used may go, unless another thread
     * is submitting more to this batch right now (those are kept too). */
    if (PyList_GET_SIZE(self->keep) > 0 && self->submitting == 0)
        PyList_SetSlice(self->keep, 0, PyList_GET_SIZE(self->keep), NULL);
    if (status != FERRY_OK)
        return fpy_raise(status, "ferry_batch_wait: a request failed");
    Py_RETURN_NONE;
}

static PyObject *batch_status(fpy_batch_t *self, PyObject *index_obj)
{
    Py_ssize_t index = PyNumber_AsSsize_t(index_obj, PyExc_IndexError);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    if (!batch_usable(self))
        return NULL;
    ferry_xfer_status_t st;
    ferry_status_t status =
        index < 0 ? FERRY_ERR_INVALID_PARAM : ferry_batch_status(self->handle, (size_t)index, &st);
    if (status == FERRY_ERR_INVALID_PARAM)
        return fpy_raise(FERRY_ERR_OUT_OF_RANGE, "Batch.status(%zd): no such request this round",
                         index);
    if (status != FERRY_OK)
        return fpy_raise(status, "ferry_batch_status(%zd)", index);
    PyObject *result = PyStructSequence_New(status_type);
    if (result == NULL)
        return NULL;
    PyStructSequence_SET_ITEM(result, 0, PyLong_FromLong(st.state));
    PyStructSequence_SET_ITEM(result, 1, PyLong_FromLong(st.error));
    PyStructSequence_SET_ITEM(result, 2, PyLong_FromSize_t(st.transferred));
    PyObject *transport = st.transport ? PyUnicode_FromString(st.transport) : Py_None;
    if (transport == Py_None)
        Py_INCREF(transport);
    PyStructSequence_SET_ITEM(result, 3, transport);
    for (int i = 0; i < 4; i++)
        if (PyStructSequence_GET_ITEM(result, i) == NULL) {
            Py_DECREF(result);
            return NULL;
        }
    return result;
}

static PyObject *batch_notify(fpy_batch_t *self, PyObject *args)
{
    PyObject *segment;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "O!s*:notify", &fpy_segment_type, &segment, &view))
        return NULL;
    ferry_segment_h handle;
    PyObject *result = NULL;
    if (batch_usable(self) && fpy_segment_of(self->engine, segment, &handle) == 0) {
        ferry_status_t status;
        ferry_batch_h batch = self->handle;
        self->calls++;
        FPY_BLOCKING(self->engine,
                     status = ferry_batch_notify(batch, handle, view.buf, (size_t)view.len));
        self->calls--;
        if (status != FERRY_OK)
            fpy_raise(status, "ferry_batch_notify (%zd bytes)", view.len);
        else
            result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&view);
    return result;
}

static PyObject *batch_cancel(fpy_batch_t *self, PyObject *unused)
{
    (void)unused;
    if (!batch_usable(self))
        return NULL;
    ferry_status_t status;
    ferry_batch_h handle = self->handle;
    self->calls++;
    FPY_BLOCKING(self->engine, status = ferry_batch_cancel(handle));
    self->calls--;
    if (status != FERRY_OK)
        return fpy_raise(status, "ferry_batch_cancel");
    Py_RETURN_NONE;
}

static PyObject *batch_close(fpy_batch_t *self, PyObject *unused)
{
    (void)unused;
    if (self->handle == NULL)
        Py_RETURN_NONE;
    if (self->calls > 0)
        return fpy_raise(FERRY_ERR_BUSY, "Batch.close: a call on this batch is in progress on "
                                         "another thread");
    ferry_status_t status = fpy_batch_release(self);
    if (status != FERRY_OK)
        return fpy_raise(status, "ferry_batch_destroy");
    Py_RETURN_NONE;
}

static void batch_dealloc(fpy_batch_t *self)
{
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    if (self->engine != NULL) {
        fpy_batch_release(self);
        Py_DECREF(self->engine);
    }
    Py_XDECREF(self->keep);
    Py_XDECREF(self->dict);
    PyMem_RawFree(self->scratch);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *batch_closed(fpy_batch_t *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->handle == NULL || !self->engine->open);
}

static PyObject *batch_max_requests(fpy_batch_t *self, void *closure)
{
    (void)closure;
    return PyLong_FromSize_t(self->max);
}

static PyMethodDef batch_methods[] = {
    {"submit", (PyCFunction)batch_submit, METH_O,
     "submit(requests)\n--\n\nQueue a Request, or a sequence of Requests or (op, local,\n"
     "segment, remote[, length[, offset[, transport]]]) tuples.  All are checked before any\n"
     "is queued: one bad request raises and queues nothing.  The batch can be submitted\n"
     "again once its requests finished (and more while they are in flight, up to\n"
     "max_requests in all)."},
    {"wait", (PyCFunction)(void (*)(void))batch_wait, METH_FASTCALL | METH_KEYWORDS,
     "wait(timeout=None)\n--\n\nWait (GIL released) until every submitted request finished.\n"
     "Raises TransferTimeout after timeout seconds (None: no limit but the transports'),\n"
     "or the error of the first request that failed."},
    {"status", (PyCFunction)batch_status, METH_O,
     "status(index) -> TransferStatus\n--\n\nThe state of request index (0-based, counted "
     "from\nthe first submit of the round)."},
    {"notify", (PyCFunction)batch_notify, METH_VARARGS,
     "notify(segment, message)\n--\n\nAttach a notify (bytes or str): delivered to the\n"
     "segment's owner after all of the batch's data, when the batch completes (by wait)."},
    {"cancel", (PyCFunction)batch_cancel, METH_NOARGS,
     "cancel()\n--\n\nCancel the unfinished requests, best effort: each ends CANCELLED\n"
     "(none of its bytes land afterwards) or in its true final state.  A no-op when\n"
     "nothing is in flight.  wait() then raises PeerError (FERRY_ERR_CANCELED) when the\n"
     "first unsuccessful request was cancelled; wait before reusing the Requests' buffers\n"
     "of requests that did not end CANCELLED."},
    {"close", (PyCFunction)batch_close, METH_NOARGS,
     "close()\n--\n\nWait for requests in flight, then destroy the batch."},
    {"__enter__", fpy_enter, METH_NOARGS, NULL},
    {"__exit__", fpy_exit, METH_VARARGS, NULL},
    {NULL},
};

static PyGetSetDef batch_getset[] = {
    {"closed", (getter)batch_closed, NULL, "True after close() or its engine's close().", NULL},
    {"max_requests", (getter)batch_max_requests, NULL, "Requests a round can hold.", NULL},
    {NULL},
};

PyTypeObject fpy_batch_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._core.Batch",
    .tp_basicsize = sizeof(fpy_batch_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Batch(engine, max_requests=128)\n--\n\nA batch of requests submitted and waited "
              "together.",
    .tp_new = batch_new,
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_methods = batch_methods,
    .tp_getset = batch_getset,
    .tp_dictoffset = offsetof(fpy_batch_t, dict),
    .tp_weaklistoffset = offsetof(fpy_batch_t, weakrefs),
};
