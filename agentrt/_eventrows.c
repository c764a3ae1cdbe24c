/* agentrt._eventrows: a page of events from a cursor's rows, without a second
 * object per row.
 *
 * The follower's page read (Store.list_events_after) builds an event from
 * each row apsw returns. Built in Python, every event is a second tuple: a
 * new object allocated, six items copied, the row freed, about a seventh of
 * the page's cost measured against a bare apsw loop (bench/bench_store.py).
 * An event is a tuple subclass with the very layout of a tuple (no __dict__,
 * no __weakref__, __slots__ = ()), so a row nobody else holds becomes the
 * event by taking the event class as its type, which is all that differs
 * between the two. A row someone else also holds is copied instead, so no
 * reference anyone has ever changes type.
 *
 * Optional, like agentrt._jsonlpage: agentrt/store/pages.py reads the same
 * page without it (see there).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define EVENT_FIELDS 6

static destructor class_statement_dealloc; /* a class statement's, read at import */

/* Whether every class from ``type`` up to tuple frees its instances as a class
 * statement's does, handing the tuple to tuple's own release. A struct
 * sequence (os.stat_result, time.struct_time) has a tuple's layout too, but
 * frees the number of fields its type declares, not the tuple's length. */
static int
dies_as_a_tuple(PyTypeObject *type)
{
    for (PyTypeObject *t = type; t != &PyTuple_Type; t = t->tp_base)
        if (t == NULL || t->tp_dealloc != class_statement_dealloc)
            return 0;
    return type->tp_free == PyObject_GC_Del;
}

/* Whether ``cls`` is a tuple subclass a tuple may turn into: a heap type with
 * exactly a tuple's memory layout and nothing run when an instance dies but
 * what runs for a tuple. */
static int
takes_tuple_layout(PyObject *cls)
{
    if (!PyType_Check(cls))
        return 0;
    PyTypeObject *type = (PyTypeObject *)cls;
    unsigned long managed = 0; /* a dict or weakref kept before the object (3.11+) */
#ifdef Py_TPFLAGS_MANAGED_DICT
    managed |= Py_TPFLAGS_MANAGED_DICT;
#endif
#ifdef Py_TPFLAGS_MANAGED_WEAKREF
    managed |= Py_TPFLAGS_MANAGED_WEAKREF;
#endif
    return (type->tp_flags & Py_TPFLAGS_HEAPTYPE)
           && !(type->tp_flags & managed)
           && PyType_IsSubtype(type, &PyTuple_Type)
           && type->tp_basicsize == PyTuple_Type.tp_basicsize
           && type->tp_itemsize == PyTuple_Type.tp_itemsize
           && type->tp_dictoffset == 0
           && type->tp_weaklistoffset == 0
           && type->tp_finalize == NULL
           && type->tp_del == NULL
           && dies_as_a_tuple(type);
}

/* Whether a row holds an event's stored fields in the runtime's own types:
 * (int, str, str, str, str, bytes), each exactly that type. */
static int
is_event_row(PyObject *row)
{
    if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != EVENT_FIELDS
            || !PyLong_CheckExact(PyTuple_GET_ITEM(row, 0))
            || !PyBytes_CheckExact(PyTuple_GET_ITEM(row, EVENT_FIELDS - 1)))
        return 0;
    for (Py_ssize_t i = 1; i < EVENT_FIELDS - 1; i++)
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(row, i)))
            return 0;
    return 1;
}

/* The row as an instance of ``type``: the row itself when this is its only
 * reference, else a copy. Steals the reference to ``row``.
 *
 * The event is left out of the garbage collector, as CPython leaves out a
 * plain tuple of atoms at its first collection: it holds only an int, str
 * and bytes, so it can never be part of a cycle. Tracked, a page's events
 * outlive a young collection and are traversed again by the older ones:
 * measured at 0.85x of the bare loop's rows per second of CPU time, against
 * 1.00x untracked (the instructions differ by 0.5%). */
static PyObject *
as_event(PyObject *row, PyTypeObject *type)
{
    PyObject *event;
#ifndef Py_GIL_DISABLED
    if (Py_REFCNT(row) == 1) {
        Py_INCREF(type); /* an instance of a heap type holds its type */
        Py_SET_TYPE(row, type);
        event = row;
    }
    else
#endif
    {
        event = type->tp_alloc(type, EVENT_FIELDS);
        if (event != NULL) {
            for (Py_ssize_t i = 0; i < EVENT_FIELDS; i++) {
                PyObject *item = PyTuple_GET_ITEM(row, i);
                Py_INCREF(item);
                PyTuple_SET_ITEM(event, i, item);
            }
        }
        Py_DECREF(row);
        if (event == NULL)
            return NULL;
    }
    PyObject_GC_UnTrack(event);
    return event;
}

PyDoc_STRVAR(events_of_doc,
"events_of(rows, cls, /)\n--\n\n"
"A list of ``cls`` with the fields of each row, or None as soon as a row is\n"
"not exactly (int, str, str, str, str, bytes). ``cls`` must be a tuple\n"
"subclass with a tuple's layout (``__slots__ = ()``).");

static PyObject *
events_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "events_of takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!takes_tuple_layout(args[1])) {
        PyErr_SetString(PyExc_TypeError, "events_of: cls must be a tuple subclass "
                        "made by class statements, with __slots__ = () and no __del__");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[1];
    PyObject *rows = PyObject_GetIter(args[0]);
    if (rows == NULL)
        return NULL;
    PyObject *events = PyList_New(0);
    if (events == NULL) {
        Py_DECREF(rows);
        return NULL;
    }
    PyObject *row;
    while ((row = PyIter_Next(rows)) != NULL) {
        if (!is_event_row(row)) {
            Py_DECREF(row);
            Py_DECREF(rows);
            Py_DECREF(events);
            Py_RETURN_NONE;
        }
        PyObject *event = as_event(row, type);
        if (event == NULL || PyList_Append(events, event) < 0) {
            Py_XDECREF(event);
            Py_DECREF(rows);
            Py_DECREF(events);
            return NULL;
        }
        Py_DECREF(event);
    }
    Py_DECREF(rows);
    if (PyErr_Occurred()) {
        Py_DECREF(events);
        return NULL;
    }
    return events;
}

static PyMethodDef eventrows_methods[] = {
    {"events_of", (PyCFunction)(void (*)(void))events_of, METH_FASTCALL, events_of_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef eventrows_module = {
    PyModuleDef_HEAD_INIT, "agentrt._eventrows",
    "A page of events from a cursor's rows, without a second object per row.",
    0, eventrows_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__eventrows(void)
{
    PyObject *probe = PyObject_CallFunction((PyObject *)&PyType_Type, "s(O){}",
                                            "probe", (PyObject *)&PyTuple_Type);
    if (probe == NULL)
        return NULL;
    class_statement_dealloc = ((PyTypeObject *)probe)->tp_dealloc;
    Py_DECREF(probe);
    return PyModule_Create(&eventrows_module);
}
