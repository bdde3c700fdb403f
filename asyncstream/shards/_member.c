/* Member: a tar member's bytes gathered across ranges into the bytes object it becomes.
 *
 * The reader (_tar.py, its _Cut) keeps the member a range's end cut as the ranges bring
 * its bytes: add(buffer) copies each range's part into the bytes object, after the last
 * one; take() hands the object out once it is full, and the Member holds nothing after.
 * About one copy of the member's bytes, where gathering parts and joining them copies
 * every byte twice (`python -m bench.tarblocks`).
 *
 * Memory is what arrived, not what the header declared (a hostile header may declare as
 * much as max_sample_bytes allows): the object is allocated at the first add, for at most
 * twice the bytes then in plus GROW_MIN, and grown (_PyBytes_Resize: realloc) to at least
 * double when a part does not fit, never past the member's size. A member cut by a range's
 * end is usually whole with the next range: its rest is at most about its first part
 * plus GROW_MIN, so it is allocated once; where the cut fell near its start, the realloc
 * moves the few bytes that were in.
 *
 * Safety: the bytes object is not visible to Python until take() returns it full, and
 * never written after, so it is immutable to every code that can see it. add refuses
 * more bytes than the member has left (ValueError), take a member not yet full; a
 * copy of 64 KiB or more runs with the GIL released (the source buffer is held, so it
 * cannot go away; the destination is this object's alone, and another thread's add or
 * take meanwhile is refused, BufferError, so nothing resizes or hands it out under the
 * copy).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "_member.h"

#define NOGIL_COPY (64 * 1024) /* copies from this size on release the GIL */
#define GROW_MIN (64 * 1024)   /* allocated beyond twice the bytes in, at the first add */

typedef struct {
    PyObject_HEAD
    PyObject *bytes; /* filled up to `filled`, its length the room so far; NULL before the
                        first add, and once taken */
    Py_ssize_t size;
    Py_ssize_t filled;
    int taken;
    int busy; /* a copy runs without the GIL */
} Member;

/* Refuse a call while another thread's copy runs (0, or -1 with an exception set). */
static int
member_idle(Member *self)
{
    if (self->busy) {
        PyErr_SetString(PyExc_BufferError, "the member is being filled by another thread");
        return -1;
    }
    return 0;
}

static PyObject *
member_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    Py_ssize_t size;
    static char *keywords[] = {"size", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n:Member", keywords, &size)) {
        return NULL;
    }
    if (size < 0) {
        PyErr_Format(PyExc_ValueError, "a member of %zd bytes", size);
        return NULL;
    }
    Member *self = (Member *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->bytes = NULL;
    self->size = size;
    self->filled = 0;
    self->taken = 0;
    self->busy = 0;
    return (PyObject *)self;
}

/* Room for `needed` bytes (0, or -1 with an exception set, the Member then taken). */
static int
member_room(Member *self, Py_ssize_t needed)
{
    Py_ssize_t room = self->bytes == NULL ? 0 : PyBytes_GET_SIZE(self->bytes);
    if (needed <= room && self->bytes != NULL) {
        return 0;
    }
    Py_ssize_t want;
    if (self->bytes == NULL) {
        want = needed > (PY_SSIZE_T_MAX - GROW_MIN) / 2 ? self->size : 2 * needed + GROW_MIN;
    } else {
        want = room > PY_SSIZE_T_MAX / 2 ? self->size : 2 * room;
    }
    if (want > self->size) {
        want = self->size;
    }
    if (want < needed) {
        want = needed;
    }
    if (self->bytes == NULL) {
        self->bytes = PyBytes_FromStringAndSize(NULL, want);
    } else if (_PyBytes_Resize(&self->bytes, want) < 0) {
        self->bytes = NULL; /* freed by the failed resize */
    }
    if (self->bytes == NULL) {
        self->taken = 1;
        return -1;
    }
    return 0;
}

static void
member_dealloc(Member *self)
{
    Py_XDECREF(self->bytes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(member_add_doc,
             "add(data, /)\n--\n\nCopy ``data`` in after the bytes added so far; True once "
             "the member is full. ValueError for more bytes than it has left.");

static PyObject *
member_add(Member *self, PyObject *arg)
{
    if (member_idle(self) < 0) {
        return NULL;
    }
    if (self->taken) {
        PyErr_SetString(PyExc_ValueError, "the member was taken");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (view.len > self->size - self->filled) {
        PyErr_Format(PyExc_ValueError, "%zd bytes for a member with %zd left", view.len,
                     self->size - self->filled);
        PyBuffer_Release(&view);
        return NULL;
    }
    if (member_room(self, self->filled + view.len) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    char *to = PyBytes_AS_STRING(self->bytes) + self->filled;
    if (view.len >= NOGIL_COPY) {
        self->busy = 1;
        Py_BEGIN_ALLOW_THREADS
        memcpy(to, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
        self->busy = 0;
    } else if (view.len > 0) {
        memcpy(to, view.buf, (size_t)view.len);
    }
    self->filled += view.len;
    PyBuffer_Release(&view);
    return PyBool_FromLong(self->filled == self->size);
}

PyDoc_STRVAR(member_take_doc,
             "take(/)\n--\n\nThe member's bytes, once full; the Member holds nothing after. "
             "ValueError before.");

static PyObject *
member_take(Member *self, PyObject *Py_UNUSED(ignored))
{
    if (member_idle(self) < 0) {
        return NULL;
    }
    if (self->taken) {
        PyErr_SetString(PyExc_ValueError, "the member was taken");
        return NULL;
    }
    if (self->filled != self->size) {
        PyErr_Format(PyExc_ValueError, "the member has %zd of its %zd bytes", self->filled,
                     self->size);
        return NULL;
    }
    if (member_room(self, self->size) < 0) { /* a member of 0 bytes: never added to */
        return NULL;
    }
    PyObject *bytes = self->bytes; /* its length is the member's: room is never past it */
    self->bytes = NULL;
    self->taken = 1;
    return bytes;
}

static PyObject *
member_missing(Member *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->size - self->filled);
}

static PyMethodDef member_methods[] = {
    {"add", (PyCFunction)member_add, METH_O, member_add_doc},
    {"take", (PyCFunction)member_take, METH_NOARGS, member_take_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef member_getset[] = {
    {"missing", (getter)member_missing, NULL, "Bytes the member still lacks.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject MemberType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncstream.shards._tarwalk.Member",
    .tp_basicsize = sizeof(Member),
    .tp_dealloc = (destructor)member_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR("Member(size)\n--\n\nA tar member's bytes, gathered across ranges "
                        "into the bytes object it becomes."),
    .tp_methods = member_methods,
    .tp_getset = member_getset,
    .tp_new = member_new,
};

int
member_module_exec(PyObject *module)
{
    if (PyType_Ready(&MemberType) < 0) {
        return -1;
    }
    Py_INCREF(&MemberType);
    if (PyModule_AddObject(module, "Member", (PyObject *)&MemberType) < 0) {
        Py_DECREF(&MemberType);
        return -1;
    }
    return 0;
}
