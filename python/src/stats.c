/*
 * Statistics of an engine (ferry_stats_snapshot, ferry_stats_reset,
 * ferry_stats_latency_ns) for Engine.stats and ferry.Stats.  An entry comes
 * to Python as a tuple (name, requests, failures, bytes, latency buckets);
 * ferry.Stats (ferry/__init__.py) wraps it and asks _core.stats_latency_ns
 * for quantiles, so the library's bucket arithmetic is the only one.
 */
#include "ferry_py.h"

#include <string.h>

static PyObject *entry_tuple(const ferry_stats_t *entry)
{
    PyObject *buckets = PyTuple_New(FERRY_STATS_BUCKETS);
    if (buckets == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < FERRY_STATS_BUCKETS; i++) {
        PyObject *count = PyLong_FromUnsignedLongLong(entry->latency[i]);
        if (count == NULL) {
            Py_DECREF(buckets);
            return NULL;
        }
        PyTuple_SET_ITEM(buckets, i, count);
    }
    return Py_BuildValue("(sKKKN)", entry->name, (unsigned long long)entry->requests,
                         (unsigned long long)entry->failures, (unsigned long long)entry->bytes,
                         buckets);
}

/* Engine._stats(kind): the entries of one kind, as tuples. */
PyObject *fpy_engine_stats(fpy_engine_t *self, PyObject *kind_obj)
{
    long kind = PyLong_AsLong(kind_obj);
    if (kind == -1 && PyErr_Occurred())
        return NULL;
    if (kind != FERRY_STATS_BY_TRANSPORT && kind != FERRY_STATS_BY_PEER)
        return fpy_raise(FERRY_ERR_INVALID_PARAM, "stats kind %ld: 0 (transport) or 1 (peer)",
                         kind);
    if (!fpy_engine_usable(self))
        return NULL;
    ferry_stats_t *entries = NULL;
    size_t count = 0, max = 0;
    ferry_status_t status;
    /* The peer list only grows: ask for its size, then retry with room to spare. */
    for (;;) {
        FPY_BLOCKING(self, status = ferry_stats_snapshot(self->handle, (ferry_stats_kind_t)kind,
                                                         entries, max, &count));
        if (status != FERRY_OK || count <= max)
            break;
        PyMem_RawFree(entries);
        max = count + 8;
        entries = PyMem_RawMalloc(max * sizeof(*entries));
        if (entries == NULL)
            return PyErr_NoMemory();
    }
    PyObject *list = NULL;
    if (status != FERRY_OK) {
        fpy_raise(status, "ferry_stats_snapshot");
        goto out;
    }
    list = PyList_New((Py_ssize_t)count);
    for (size_t i = 0; list != NULL && i < count; i++) {
        PyObject *item = entry_tuple(&entries[i]);
        if (item == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
out:
    PyMem_RawFree(entries);
    return list;
}

PyObject *fpy_engine_stats_reset(fpy_engine_t *self, PyObject *unused)
{
    (void)unused;
    if (!fpy_engine_usable(self))
        return NULL;
    ferry_status_t status;
    FPY_BLOCKING(self, status = ferry_stats_reset(self->handle));
    if (status != FERRY_OK)
        return fpy_raise(status, "ferry_stats_reset");
    Py_RETURN_NONE;
}

/* _core.stats_latency_ns(buckets, q): the library's quantile of an entry. */
PyObject *fpy_stats_latency_ns(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *buckets;
    double q;
    if (!PyArg_ParseTuple(args, "Od:stats_latency_ns", &buckets, &q))
        return NULL;
    if (!(q >= 0.0 && q <= 1.0))
        return fpy_raise(FERRY_ERR_INVALID_PARAM, "latency quantile %g: 0 to 1", q);
    PyObject *fast = PySequence_Fast(buckets, "latency buckets are a sequence of ints");
    if (fast == NULL)
        return NULL;
    if (PySequence_Fast_GET_SIZE(fast) != FERRY_STATS_BUCKETS) {
        Py_DECREF(fast);
        return fpy_raise(FERRY_ERR_INVALID_PARAM, "latency buckets: %d of them",
                         FERRY_STATS_BUCKETS);
    }
    ferry_stats_t entry;
    memset(&entry, 0, sizeof(entry));
    for (Py_ssize_t i = 0; i < FERRY_STATS_BUCKETS; i++) {
        entry.latency[i] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (entry.latency[i] == (uint64_t)-1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return NULL;
        }
        entry.requests += entry.latency[i];
    }
    Py_DECREF(fast);
    return PyLong_FromUnsignedLongLong(ferry_stats_latency_ns(&entry, q));
}
