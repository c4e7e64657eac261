/*
 * ferry._core: the module.  The types are in their own files; this file
 * adds the constants and the library-wide calls (version, status text,
 * ferry_info's text).
 */
#include "ferry_py.h"

#include <stdlib.h>

int fpy_batch_types_init(PyObject *module);

static PyObject *core_version(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyUnicode_FromString(ferry_version_string());
}

static PyObject *core_status_string(PyObject *module, PyObject *arg)
{
    (void)module;
    long status = PyLong_AsLong(arg);
    if (status == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(ferry_status_string((ferry_status_t)status));
}

/* ferry_info_print's text (INFO_* bits) as a str. */
static PyObject *core_info(PyObject *module, PyObject *arg)
{
    (void)module;
    unsigned long what = PyLong_AsUnsignedLong(arg);
    if (what == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    if (out == NULL)
        return PyErr_SetFromErrno(PyExc_OSError);
    PyThreadState *saved = PyEval_SaveThread();
    ferry_info_print(out, (unsigned)what);
    fclose(out);
    PyEval_RestoreThread(saved);
    PyObject *result = PyUnicode_DecodeUTF8(text, (Py_ssize_t)size, "replace");
    free(text);
    return result;
}

static PyMethodDef core_functions[] = {
    {"version", core_version, METH_NOARGS, "version() -> str\n--\n\nThe library's version."},
    {"status_string", core_status_string, METH_O,
     "status_string(status) -> str\n--\n\nShort text for a ferry_status_t value."},
    {"info", core_info, METH_O,
     "info(what) -> str\n--\n\nWhat ferry_info prints for the INFO_* bits in what."},
    {"stats_latency_ns", fpy_stats_latency_ns, METH_VARARGS,
     "stats_latency_ns(buckets, q) -> int\n--\n\nferry_stats_latency_ns: the latency (ns) under\n"
     "which a fraction q of an entry's requests finished (0 when it counted none)."},
    {NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ferry._core",
    .m_doc = "The C types behind the ferry package (use ferry, not this module).",
    .m_size = -1,
    .m_methods = core_functions,
};

static int add_type(PyObject *module, PyTypeObject *type, const char *name)
{
    if (PyType_Ready(type) < 0)
        return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__core(void)
{
    PyObject *module = PyModule_Create(&core_module);
    if (module == NULL)
        return NULL;
    static const struct {
        const char *name;
        long value;
    } constants[] = {
        {"READ", FERRY_OP_READ},
        {"WRITE", FERRY_OP_WRITE},
        {"REMOTE_READ", FERRY_REG_REMOTE_READ},
        {"REMOTE_WRITE", FERRY_REG_REMOTE_WRITE},
        {"REMOTE", FERRY_REG_REMOTE},
        {"DEFER_PUBLISH", FERRY_REG_DEFER_PUBLISH},
        {"NOTIFY_MAX", FERRY_NOTIFY_MAX},
        {"INFO_VERSION", FERRY_INFO_VERSION},
        {"INFO_PLUGINS", FERRY_INFO_PLUGINS},
        {"INFO_SETTINGS", FERRY_INFO_SETTINGS},
        {"INFO_DEVICES", FERRY_INFO_DEVICES},
        {"INFO_COUNTERS", FERRY_INFO_COUNTERS},
        {"STATS_BY_TRANSPORT", FERRY_STATS_BY_TRANSPORT},
        {"STATS_BY_PEER", FERRY_STATS_BY_PEER},
        {"STATS_BUCKETS", FERRY_STATS_BUCKETS},
        {"STORAGE_BUFFERED", FERRY_STORAGE_BUFFERED},
        {"STORAGE_DIRECT", FERRY_STORAGE_DIRECT},
        {"STORAGE_DURABLE", FERRY_STORAGE_DURABLE},
        {"STORAGE_SHARED", FERRY_STORAGE_SHARED},
    };
    for (size_t i = 0; i < sizeof(constants) / sizeof(constants[0]); i++)
        if (PyModule_AddIntConstant(module, constants[i].name, constants[i].value) < 0)
            goto err;
    if (fpy_errors_init() < 0 || add_type(module, &fpy_engine_type, "Engine") < 0 ||
        add_type(module, &fpy_memory_type, "Memory") < 0 ||
        add_type(module, &fpy_segment_type, "Segment") < 0 ||
        add_type(module, &fpy_request_type, "Request") < 0 ||
        add_type(module, &fpy_batch_type, "Batch") < 0 || fpy_batch_types_init(module) < 0)
        goto err;
    return module;
err:
    Py_DECREF(module);
    return NULL;
}
