/*
 * Ferry statuses as Python exceptions.  The classes live in ferry._errors
 * (Python, so that their docstrings and hierarchy read as Python); the two
 * factories are looked up once, at import.
 */
#include "ferry_py.h"

#include <stdarg.h>

static PyObject *make_error; /* ferry._errors.make_error(status, message) */
static PyObject *make_closed;

int fpy_errors_init(void)
{
    PyObject *module = PyImport_ImportModule("ferry._errors");
    if (module == NULL)
        return -1;
    make_error = PyObject_GetAttrString(module, "make_error");
    make_closed = PyObject_GetAttrString(module, "make_closed");
    Py_DECREF(module);
    return make_error != NULL && make_closed != NULL ? 0 : -1;
}

static PyObject *raise_made(PyObject *exception)
{
    if (exception != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exception), exception);
        Py_DECREF(exception);
    }
    return NULL;
}

PyObject *fpy_raise(ferry_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *what = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (what == NULL)
        return NULL;
    PyObject *message = PyUnicode_FromFormat("%U: %s", what, ferry_status_string(status));
    Py_DECREF(what);
    if (message == NULL)
        return NULL;
    PyObject *exception = PyObject_CallFunction(make_error, "iN", (int)status, message);
    return raise_made(exception);
}

PyObject *fpy_raise_closed(const char *what)
{
    return raise_made(PyObject_CallFunction(make_closed, "s", what));
}
