/* The native window draw: a run of draws of the window shuffle in one call, on the lanes'
 * lists of samples in place.
 *
 * The C twin of asyncstream/order/_shuffle.py (WindowShuffle.draw with the shuffle on and
 * no blend), which stays in the tree as its reference: tests/test_native_draw.py drives
 * both side by side and requires the same (lane, sample) of every draw and the same state
 * after it.
 *
 * Draw d takes the random numbers splitmix64(key + 2d) and splitmix64(key + 2d + 1)
 * (arithmetic modulo 2^64, as the Python masks it): the first picks the lane, uniformly
 * over the resident samples ("samples": the lane holding the r-th sample in lane order)
 * or over the lanes ("shards"); the second picks the sample within the lane. A number r
 * below a bound b is the high half of the 128-bit product r * b (Lemire's multiply-shift,
 * Python's `(r * b) >> 64`). The sample is removed by swap-remove: the lane's last sample
 * takes its place and the list shrinks by one, as `items[pick] = items[-1]; items.pop()`.
 *
 * The run stops after n draws, or after the draw that empties a lane (the driver must
 * refill or close it before the next draw). The caller limits n to the draws before a lane
 * must open. Nothing in the loop runs Python code (no call out, no object freed, no
 * allocation the garbage collector watches), so the lanes cannot change under it; the
 * lists are checked once, before the first draw, and nothing is changed before they are.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

static uint64_t
splitmix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* The high 64 bits of the 128-bit product a * b, from 32-bit halves (portable C11). */
static uint64_t
mulhi(uint64_t a, uint64_t b)
{
    uint64_t a_lo = a & 0xFFFFFFFFULL, a_hi = a >> 32;
    uint64_t b_lo = b & 0xFFFFFFFFULL, b_hi = b >> 32;
    uint64_t lo_lo = a_lo * b_lo, lo_hi = a_lo * b_hi, hi_lo = a_hi * b_lo;
    uint64_t mid = (lo_lo >> 32) + (lo_hi & 0xFFFFFFFFULL) + (hi_lo & 0xFFFFFFFFULL);
    return a_hi * b_hi + (lo_hi >> 32) + (hi_lo >> 32) + (mid >> 32);
}

/* An int in [0, 2^64) as uint64_t; -1 with an exception for anything else. */
static int
as_u64(PyObject *obj, const char *what, uint64_t *out)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", what);
        return -1;
    }
    unsigned long long value = PyLong_AsUnsignedLongLong(obj);
    if (value == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "%s must be in [0, 2**64)", what);
        return -1;
    }
    *out = (uint64_t)value;
    return 0;
}

PyDoc_STRVAR(below_doc,
             "below(key, n, bound, /)\n--\n\n"
             "A uniform integer in [0, bound) for random number n of key: "
             "(splitmix64(key + n) * bound) >> 64, as _shuffle._below.");

static PyObject *
below(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *key_obj, *n_obj, *bound_obj;
    uint64_t key, n, bound;
    if (!PyArg_ParseTuple(args, "OOO:below", &key_obj, &n_obj, &bound_obj)) {
        return NULL;
    }
    if (as_u64(key_obj, "key", &key) < 0 || as_u64(n_obj, "n", &n) < 0 ||
        as_u64(bound_obj, "bound", &bound) < 0) {
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(mulhi(splitmix(key + n), bound));
}

/* The lists of the lanes, checked: each a list, none empty. Their sizes into sizes. */
static int
lane_sizes(PyObject *lists, Py_ssize_t lanes, Py_ssize_t *sizes, uint64_t *total)
{
    uint64_t sum = 0;
    for (Py_ssize_t i = 0; i < lanes; i++) {
        PyObject *items = PyList_GET_ITEM(lists, i);
        if (!PyList_CheckExact(items)) {
            PyErr_Format(PyExc_TypeError, "lane %zd's samples must be a list", i);
            return -1;
        }
        sizes[i] = PyList_GET_SIZE(items);
        if (sizes[i] == 0) {
            PyErr_Format(PyExc_ValueError, "lane %zd is empty: it needs a refill first", i);
            return -1;
        }
        sum += (uint64_t)sizes[i];
    }
    *total = sum;
    return 0;
}

/* Remove items[pick] by swap-remove; the caller holds its own reference to it. */
static int
swap_remove(PyObject *items, Py_ssize_t pick, Py_ssize_t size)
{
    if (pick != size - 1) {
        PyObject *last = PyList_GET_ITEM(items, size - 1);
        PyObject *taken = PyList_GET_ITEM(items, pick);
        Py_INCREF(last);
        PyList_SET_ITEM(items, pick, last);
        Py_DECREF(taken); /* not its last reference: the caller holds one */
    }
    return PyList_SetSlice(items, size - 1, size, NULL);
}

PyDoc_STRVAR(draw_doc,
             "draw(lists, key, draws, n, shards, /)\n--\n\n"
             "Up to n draws of the window shuffle from draw number `draws` on, over the "
             "lanes' lists of samples (changed in place): ([lane index, ...], [sample, ...]). "
             "Stops after a draw that empties a lane. `shards`: pick lanes uniformly, else "
             "by resident samples.");

static PyObject *
draw(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *lists, *key_obj, *draws_obj;
    Py_ssize_t n;
    int shards;
    uint64_t key, draws;
    if (!PyArg_ParseTuple(args, "O!OOnp:draw", &PyList_Type, &lists, &key_obj, &draws_obj, &n,
                          &shards)) {
        return NULL;
    }
    if (as_u64(key_obj, "key", &key) < 0 || as_u64(draws_obj, "draws", &draws) < 0) {
        return NULL;
    }
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        return NULL;
    }
    Py_ssize_t lanes = PyList_GET_SIZE(lists);
    if (n == 0) {
        return Py_BuildValue("([][])");
    }
    if (lanes == 0) {
        PyErr_SetString(PyExc_ValueError, "no lane to draw from");
        return NULL;
    }
    Py_ssize_t *sizes = PyMem_New(Py_ssize_t, lanes);
    if (sizes == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *indices = NULL, *samples = NULL, *result = NULL;
    uint64_t total;
    if (lane_sizes(lists, lanes, sizes, &total) < 0) {
        goto done;
    }
    Py_ssize_t most = (uint64_t)n < total ? n : (Py_ssize_t)total;
    indices = PyList_New(most);
    samples = PyList_New(most);
    if (indices == NULL || samples == NULL) {
        goto done;
    }
    Py_ssize_t k = 0;
    while (k < most) {
        uint64_t x = key + 2 * (draws + (uint64_t)k);
        uint64_t r = splitmix(x);
        Py_ssize_t index;
        if (shards) {
            index = (Py_ssize_t)mulhi(r, (uint64_t)lanes);
        } else {
            uint64_t at = mulhi(r, total);
            index = 0;
            while (at >= (uint64_t)sizes[index]) { /* at < total: ends at the last lane */
                at -= (uint64_t)sizes[index];
                index++;
            }
        }
        PyObject *items = PyList_GET_ITEM(lists, index);
        Py_ssize_t size = sizes[index];
        Py_ssize_t pick = (Py_ssize_t)mulhi(splitmix(x + 1), (uint64_t)size);
        PyObject *lane = PyLong_FromSsize_t(index);
        if (lane == NULL) {
            goto done;
        }
        PyObject *item = PyList_GET_ITEM(items, pick);
        Py_INCREF(item);
        PyList_SET_ITEM(indices, k, lane);
        PyList_SET_ITEM(samples, k, item);
        k++;
        if (swap_remove(items, pick, size) < 0) {
            goto done;
        }
        sizes[index] = size - 1;
        total--;
        if (size == 1) {
            break;
        }
    }
    if (k < most) { /* the unused tail (NULL slots) cut off */
        if (PyList_SetSlice(indices, k, most, NULL) < 0 ||
            PyList_SetSlice(samples, k, most, NULL) < 0) {
            goto done;
        }
    }
    result = PyTuple_Pack(2, indices, samples);
done:
    PyMem_Free(sizes);
    Py_XDECREF(indices);
    Py_XDECREF(samples);
    return result;
}

static PyMethodDef methods[] = {
    {"draw", draw, METH_VARARGS, draw_doc},
    {"below", below, METH_VARARGS, below_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "asyncstream.order._drawc",
    .m_doc = "The native window draw: runs of draws of the window shuffle.",
    .m_size = 0,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__drawc(void); /* the one symbol exported */

PyMODINIT_FUNC
PyInit__drawc(void)
{
    return PyModuleDef_Init(&module_def);
}
