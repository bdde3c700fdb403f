/* The stream's per-sample hand-out in C: the stall meter's core and the fast path of the
 * iterator's next().
 *
 * Meter is the core of asyncstream.stream._stall.StallMeter (its Python reference is
 * _stall._MeterCore): the epoch's waited/worked/calls, the loop's last return, and the
 * last `window` calls' (waited, worked) in a ring of doubles instead of a deque of tuples.
 * Its clock is time.perf_counter's own (the same readings as Python's).
 *
 * Handout is the base of asyncstream.stream._iteration.Iteration. Its tp_iternext hands
 * out the next of the samples the run drew ahead (the `_ready` list, popped from its end)
 * when nothing else is to be done: the one-reader token is in place, the iterator is
 * neither closed nor replaced, the epoch has begun (`_on_begin` is None) and the meter, if
 * any, is a Meter. Every other case calls the subclass's `_next_slow()`, today's Python
 * method, which does the same checks and raises what they raise. The fast path runs no
 * Python code and keeps the GIL throughout, so no other thread can come between its
 * check of the token and the pop.
 *
 * soonest() (in _soonest.c, the same extension) is the prefetch stage's ranking.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_soonest.h"

/* ------------------------------------------------------------------ the clock */

/* time.perf_counter(), read as Python reads it. */
static double
perf_counter(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t t;
    (void)PyTime_PerfCounterRaw(&t);
    return PyTime_AsSecondsDouble(t);
#else
    return _PyTime_AsSecondsDouble(_PyTime_GetPerfCounter());
#endif
}

/* ------------------------------------------------------------------ Meter */

typedef struct {
    PyObject_HEAD
    double waited; /* this epoch */
    double worked;
    Py_ssize_t calls;
    double pending_work; /* begin()'s, for end() */
    double left;         /* when the last next() returned, if has_left */
    int has_left;
    Py_ssize_t window; /* the ring: the last `window` calls' (waited, worked) */
    Py_ssize_t held;   /* how many it holds */
    Py_ssize_t next;   /* where the next goes */
    double *ring;
} Meter;

static PyTypeObject MeterType;

/* One call: `waited` in it, `worked` before it, ended at `now`. */
static void
meter_push(Meter *m, double waited, double worked, double now)
{
    m->waited += waited;
    m->worked += worked;
    m->calls++;
    m->ring[2 * m->next] = waited;
    m->ring[2 * m->next + 1] = worked;
    m->next = (m->next + 1) % m->window;
    if (m->held < m->window) {
        m->held++;
    }
    m->left = now;
    m->has_left = 1;
}

/* One call that asked at `started` and had its item at `now`. */
static void
meter_add(Meter *m, double started, double now)
{
    meter_push(m, now - started, m->has_left ? started - m->left : 0.0, now);
}

static int
meter_init(PyObject *op, PyObject *args, PyObject *kwargs)
{
    Meter *m = (Meter *)op;
    static char *names[] = {"window", NULL};
    Py_ssize_t window = 200;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|n:Meter", names, &window)) {
        return -1;
    }
    if (window < 1 || window > PY_SSIZE_T_MAX / (Py_ssize_t)(2 * sizeof(double))) {
        PyErr_Format(PyExc_ValueError, "window must be an integer >= 1, got %zd", window);
        return -1;
    }
    double *ring = PyMem_Calloc((size_t)window * 2, sizeof(double));
    if (ring == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(m->ring);
    m->ring = ring;
    m->window = window;
    m->held = m->next = 0;
    m->waited = m->worked = m->pending_work = m->left = 0.0;
    m->calls = 0;
    m->has_left = 0;
    return 0;
}

static void
meter_dealloc(PyObject *op)
{
    Meter *m = (Meter *)op;
    PyMem_Free(m->ring);
    Py_TYPE(op)->tp_free(op);
}

/* The meter's ring is read only after __init__: a subclass that never called it has none. */
static int
meter_ready(Meter *m)
{
    if (m->ring == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the meter was not initialised");
        return -1;
    }
    return 0;
}

static PyObject *
meter_begin(PyObject *op, PyObject *unused)
{
    (void)unused;
    Meter *m = (Meter *)op;
    double now = perf_counter();
    m->pending_work = m->has_left ? now - m->left : 0.0;
    return PyFloat_FromDouble(now);
}

static PyObject *
meter_end(PyObject *op, PyObject *arg)
{
    Meter *m = (Meter *)op;
    double started = PyFloat_AsDouble(arg);
    if (started == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (meter_ready(m) < 0) {
        return NULL;
    }
    double now = perf_counter();
    meter_push(m, now - started, m->pending_work, now);
    Py_RETURN_NONE;
}

static PyObject *
meter_record(PyObject *op, PyObject *const *args, Py_ssize_t nargs)
{
    Meter *m = (Meter *)op;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "record takes (started, now)");
        return NULL;
    }
    double started = PyFloat_AsDouble(args[0]);
    if (started == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    double now = PyFloat_AsDouble(args[1]);
    if (now == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (meter_ready(m) < 0) {
        return NULL;
    }
    meter_add(m, started, now);
    Py_RETURN_NONE;
}

static PyObject *
meter_timed(PyObject *op, PyObject *produce)
{
    Meter *m = (Meter *)op;
    if (meter_ready(m) < 0) {
        return NULL;
    }
    double started = perf_counter();
    PyObject *out = PyObject_CallNoArgs(produce);
    meter_add(m, started, perf_counter()); /* also when it raised */
    return out;
}

static PyObject *
meter_new_epoch(PyObject *op, PyObject *unused)
{
    (void)unused;
    Meter *m = (Meter *)op;
    m->has_left = 0;
    m->waited = m->worked = 0.0;
    m->calls = 0;
    Py_RETURN_NONE;
}

static PyObject *
meter_pause(PyObject *op, PyObject *unused)
{
    (void)unused;
    ((Meter *)op)->has_left = 0;
    Py_RETURN_NONE;
}

static PyObject *
meter_recent(PyObject *op, PyObject *unused)
{
    (void)unused;
    Meter *m = (Meter *)op;
    double waited = 0.0;
    double worked = 0.0;
    /* oldest first, as the deque of the reference sums them */
    Py_ssize_t at = m->held < m->window ? 0 : m->next;
    for (Py_ssize_t i = 0; i < m->held; i++) {
        Py_ssize_t k = (at + i) % m->window;
        waited += m->ring[2 * k];
        worked += m->ring[2 * k + 1];
    }
    return Py_BuildValue("(ddn)", waited, worked, m->held);
}

/* (window, waited, worked, calls, pending_work, last_return, recent), the recent calls
 * as a list of (waited, worked), oldest first: what pickle carries to a worker. */
static PyObject *
meter_getstate(PyObject *op, PyObject *unused)
{
    (void)unused;
    Meter *m = (Meter *)op;
    if (meter_ready(m) < 0) {
        return NULL;
    }
    PyObject *recent = PyList_New(m->held);
    if (recent == NULL) {
        return NULL;
    }
    Py_ssize_t at = m->held < m->window ? 0 : m->next;
    for (Py_ssize_t i = 0; i < m->held; i++) {
        Py_ssize_t k = (at + i) % m->window;
        PyObject *pair = Py_BuildValue("(dd)", m->ring[2 * k], m->ring[2 * k + 1]);
        if (pair == NULL) {
            Py_DECREF(recent);
            return NULL;
        }
        PyList_SET_ITEM(recent, i, pair);
    }
    PyObject *left = m->has_left ? PyFloat_FromDouble(m->left) : Py_NewRef(Py_None);
    if (left == NULL) {
        Py_DECREF(recent);
        return NULL;
    }
    return Py_BuildValue("(nddndNN)", m->window, m->waited, m->worked, m->calls,
                         m->pending_work, left, recent);
}

static PyObject *
meter_setstate(PyObject *op, PyObject *state)
{
    Meter *m = (Meter *)op;
    Py_ssize_t window, calls;
    double waited, worked, pending;
    PyObject *left, *recent;
    if (!PyArg_ParseTuple(state, "nddndOO!:__setstate__", &window, &waited, &worked, &calls,
                          &pending, &left, &PyList_Type, &recent)) {
        return NULL;
    }
    PyObject *args = Py_BuildValue("(n)", window);
    if (args == NULL) {
        return NULL;
    }
    int init = meter_init(op, args, NULL);
    Py_DECREF(args);
    if (init < 0) {
        return NULL;
    }
    if (left != Py_None) {
        m->left = PyFloat_AsDouble(left);
        if (m->left == -1.0 && PyErr_Occurred()) {
            return NULL;
        }
        m->has_left = 1;
    }
    Py_ssize_t n = PyList_GET_SIZE(recent);
    for (Py_ssize_t i = n > window ? n - window : 0; i < n; i++) {
        double w, k;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(recent, i), "dd", &w, &k)) {
            return NULL;
        }
        m->ring[2 * m->next] = w;
        m->ring[2 * m->next + 1] = k;
        m->next = (m->next + 1) % m->window;
        if (m->held < m->window) {
            m->held++;
        }
    }
    m->waited = waited;
    m->worked = worked;
    m->calls = calls;
    m->pending_work = pending;
    Py_RETURN_NONE;
}

static PyObject *
meter_get_left(PyObject *op, void *closure)
{
    (void)closure;
    Meter *m = (Meter *)op;
    if (!m->has_left) {
        Py_RETURN_NONE;
    }
    return PyFloat_FromDouble(m->left);
}

static PyMethodDef meter_methods[] = {
    {"begin", meter_begin, METH_NOARGS,
     "begin()\n--\n\nThe loop asks for the next item; returns the time, for end()."},
    {"end", meter_end, METH_O,
     "end(started, /)\n--\n\nThe loop has its item after asking at ``started``."},
    {"record", (PyCFunction)(void (*)(void))meter_record, METH_FASTCALL,
     "record(started, now, /)\n--\n\nOne call that asked at ``started`` and had its item "
     "at ``now``."},
    {"timed", meter_timed, METH_O,
     "timed(produce, /)\n--\n\n``produce()``, counted as the wait of one call."},
    {"new_epoch", meter_new_epoch, METH_NOARGS,
     "new_epoch()\n--\n\nStart counting a new epoch."},
    {"pause", meter_pause, METH_NOARGS,
     "pause()\n--\n\nStop counting the loop's work until the next call."},
    {"__getstate__", meter_getstate, METH_NOARGS, "The meter's figures, for pickle."},
    {"__setstate__", meter_setstate, METH_O, "The figures __getstate__ gave back."},
    {"recent", meter_recent, METH_NOARGS,
     "recent()\n--\n\n``(waited, worked, calls)`` over the last ``window`` calls."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef meter_members[] = {
    {"waited", T_DOUBLE, offsetof(Meter, waited), 0, "seconds waited this epoch"},
    {"worked", T_DOUBLE, offsetof(Meter, worked), 0, "seconds worked this epoch"},
    {"calls", T_PYSSIZET, offsetof(Meter, calls), 0, "calls this epoch"},
    {"window", T_PYSSIZET, offsetof(Meter, window), READONLY, "the recent calls kept"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef meter_getset[] = {
    {"last_return", meter_get_left, NULL, "when the last call returned, or None", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject MeterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncstream.stream._nextc.Meter",
    .tp_basicsize = sizeof(Meter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Meter(window=200)\n--\n\nThe stall meter's core (see _stall._MeterCore).",
    .tp_new = PyType_GenericNew,
    .tp_init = meter_init,
    .tp_dealloc = meter_dealloc,
    .tp_methods = meter_methods,
    .tp_members = meter_members,
    .tp_getset = meter_getset,
};

/* ------------------------------------------------------------------ Handout */

typedef struct {
    PyObject_HEAD
    PyObject *ready;    /* the run's drawn-ahead samples, last first (a list) */
    PyObject *token;    /* the one-reader token: a list holding it, or empty */
    PyObject *meter;    /* None or a meter */
    PyObject *on_begin; /* None once the epoch has begun */
    char closed;
    char replaced;
} Handout;

static PyObject *SLOW_NAME;

static PyObject *
handout_next(PyObject *op)
{
    Handout *self = (Handout *)op;
    PyObject *ready = self->ready;
    PyObject *meter = self->meter;
    if (ready != NULL && PyList_CheckExact(ready) && PyList_GET_SIZE(ready) > 0 &&
        self->token != NULL && PyList_CheckExact(self->token) &&
        PyList_GET_SIZE(self->token) == 1 && !self->closed && !self->replaced &&
        self->on_begin == Py_None &&
        (meter == Py_None || (meter != NULL && PyObject_TypeCheck(meter, &MeterType) &&
                              ((Meter *)meter)->ring != NULL))) {
        double started = meter == Py_None ? 0.0 : perf_counter();
        Py_ssize_t last = PyList_GET_SIZE(ready) - 1;
        PyObject *sample = Py_NewRef(PyList_GET_ITEM(ready, last));
        if (PyList_SetSlice(ready, last, last + 1, NULL) < 0) { /* never runs Python code */
            Py_DECREF(sample);
            return NULL;
        }
        if (meter != Py_None) {
            meter_add((Meter *)meter, started, perf_counter());
        }
        return sample;
    }
    return PyObject_CallMethodNoArgs(op, SLOW_NAME);
}

static int
handout_traverse(PyObject *op, visitproc visit, void *arg)
{
    Handout *self = (Handout *)op;
    Py_VISIT(self->ready);
    Py_VISIT(self->token);
    Py_VISIT(self->meter);
    Py_VISIT(self->on_begin);
    return 0;
}

static int
handout_clear(PyObject *op)
{
    Handout *self = (Handout *)op;
    Py_CLEAR(self->ready);
    Py_CLEAR(self->token);
    Py_CLEAR(self->meter);
    Py_CLEAR(self->on_begin);
    return 0;
}

/* A static type: a Python subclass's dealloc (subtype_dealloc) drops its type's reference. */
static void
handout_dealloc(PyObject *op)
{
    PyObject_GC_UnTrack(op);
    (void)handout_clear(op);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *
handout_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    (void)args;
    (void)kwargs;
    Handout *self = (Handout *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->meter = Py_NewRef(Py_None);
    self->on_begin = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static PyMemberDef handout_members[] = {
    {"_ready", T_OBJECT, offsetof(Handout, ready), 0, "the run's samples drawn ahead"},
    {"_token", T_OBJECT, offsetof(Handout, token), 0, "the one-reader token's list"},
    {"meter", T_OBJECT, offsetof(Handout, meter), 0, "the stall meter, or None"},
    {"_on_begin", T_OBJECT, offsetof(Handout, on_begin), 0, "called at the first sample"},
    {"closed", T_BOOL, offsetof(Handout, closed), 0, "ended by close()"},
    {"replaced", T_BOOL, offsetof(Handout, replaced), 0, "ended by a newer iterator"},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *
handout_iter(PyObject *op)
{
    return Py_NewRef(op);
}

static PyTypeObject HandoutType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncstream.stream._nextc.Handout",
    .tp_basicsize = sizeof(Handout),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fast path of Iteration.__next__ (see _iteration.Iteration).",
    .tp_new = handout_new,
    .tp_dealloc = handout_dealloc,
    .tp_traverse = handout_traverse,
    .tp_clear = handout_clear,
    .tp_iter = handout_iter,
    .tp_iternext = handout_next,
    .tp_members = handout_members,
};

/* ------------------------------------------------------------------ module */

static PyObject *
clock_now(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyFloat_FromDouble(perf_counter());
}

static PyMethodDef nextc_functions[] = {
    {"clock", clock_now, METH_NOARGS, "clock()\n--\n\nThe meter's clock: time.perf_counter()."},
    {"soonest", (PyCFunction)(void (*)(void))soonest_rank, METH_FASTCALL,
     "soonest(lanes, upcoming, window, budget, /)\n--\n\nThe prefetch ranking "
     "(asyncstream.stream._prefetch): the budget chunks needed soonest, (position, chunk)."},
    {NULL, NULL, 0, NULL},
};

static int
nextc_exec(PyObject *module)
{
    if (SLOW_NAME == NULL) {
        SLOW_NAME = PyUnicode_InternFromString("_next_slow");
        if (SLOW_NAME == NULL) {
            return -1;
        }
    }
    if (PyType_Ready(&MeterType) < 0 || PyType_Ready(&HandoutType) < 0) {
        return -1;
    }
    if (PyModule_AddObjectRef(module, "Meter", (PyObject *)&MeterType) < 0 ||
        PyModule_AddObjectRef(module, "Handout", (PyObject *)&HandoutType) < 0) {
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot nextc_slots[] = {
    {Py_mod_exec, (void *)nextc_exec},
    {0, NULL},
};

static struct PyModuleDef nextc_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "asyncstream.stream._nextc",
    .m_doc = "The stream's per-sample hand-out (the stall meter's core, next()'s fast path) "
             "and the prefetch ranking.",
    .m_size = 0,
    .m_methods = nextc_functions,
    .m_slots = nextc_slots,
};

PyMODINIT_FUNC PyInit__nextc(void);

PyMODINIT_FUNC
PyInit__nextc(void)
{
    return PyModuleDef_Init(&nextc_module);
}
