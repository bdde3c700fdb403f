/* The native window draw: a run of draws of the window shuffle in one call, on the lanes'
 * lists of samples in place.
 *
 * The C twin of asyncstream/order/_shuffle.py (WindowShuffle.draw with the shuffle on:
 * `draw` without a blend, `draw_blend` with one, Blend.choose of _mix.py included), which
 * stays in the tree as its reference: tests/test_native_draw.py drives both side by side
 * and requires the same (lane, sample) of every draw and the same state after it.
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
 *
 * With a blend, draw d first picks the source (Blend.choose: a smooth weighted round robin
 * over the sources with an open lane, each weighted by totals - drawn), then the lane
 * among that source's lanes with splitmix64(key + 2d) (uniformly over the source's resident
 * samples, or over its lanes), then the sample as above. The blend's drawn and credit are
 * Python ints: they are read into int64_t once a run and written back after it; a choice
 * whose numbers would leave int64_t ends the run before it (OverflowError where that is
 * the first draw, nothing changed: the caller makes it in Python, on unbounded ints).
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
        if (items == lists) {
            PyErr_Format(PyExc_ValueError, "lane %zd's samples are the list of lanes", i);
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
        if (PyList_GET_SIZE(items) != size) { /* one list given as two lanes */
            PyErr_Format(PyExc_ValueError, "lane %zd's list is another lane's too", index);
            goto done;
        }
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

/* An int list's entries as int64_t; -1 with an exception (OverflowError: beyond 64 bits). */
static int
int64s(PyObject *list, const char *what, int64_t *out)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        PyObject *obj = PyList_GET_ITEM(list, i);
        if (!PyLong_Check(obj)) {
            PyErr_Format(PyExc_TypeError, "the blend's %s must be ints", what);
            return -1;
        }
        long long value = PyLong_AsLongLong(obj);
        if (value == -1 && PyErr_Occurred()) {
            PyErr_Format(PyExc_OverflowError, "the blend's %s must fit in 64 bits", what);
            return -1;
        }
        out[i] = (int64_t)value;
    }
    return 0;
}

/* a + b into *out; 0 where it overflows int64_t (nothing written then). */
static int
add64(int64_t a, int64_t b, int64_t *out)
{
    if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)) {
        return 0;
    }
    *out = a + b;
    return 1;
}

/* Blend.choose over the `count` groups of `available`, on totals, drawn and credit: the
 * smooth weighted round robin, each group weighted by totals - drawn (all alike where no
 * weight is positive), ties to the earlier group. Checked first, then changed: the pick,
 * or -1 with nothing changed where a number would leave int64_t. `weights`: scratch. */
static Py_ssize_t
choose(const Py_ssize_t *available, Py_ssize_t count, const int64_t *totals, int64_t *drawn,
       int64_t *credit, int64_t *weights)
{
    int any = 0;
    for (Py_ssize_t a = 0; a < count; a++) {
        Py_ssize_t i = available[a];
        if (drawn[i] == INT64_MIN || !add64(totals[i], -drawn[i], &weights[a])) {
            return -1;
        }
        any |= weights[a] > 0;
    }
    int64_t total = 0, best = 0, sum;
    Py_ssize_t pick = -1;
    for (Py_ssize_t a = 0; a < count; a++) {
        int64_t w = any ? weights[a] : 1;
        weights[a] = w;
        if (w <= 0) {
            continue;
        }
        if (!add64(total, w, &total) || !add64(credit[available[a]], w, &sum)) {
            return -1;
        }
        if (pick < 0 || sum > best) {
            pick = available[a];
            best = sum;
        }
    }
    if (pick < 0 || !add64(best, -total, &sum) || drawn[pick] == INT64_MAX) {
        return -1; /* -total: total > 0, so no overflow in the negation */
    }
    for (Py_ssize_t a = 0; a < count; a++) {
        if (weights[a] > 0) {
            credit[available[a]] += weights[a];
        }
    }
    credit[pick] -= total;
    drawn[pick]++;
    return pick;
}

/* The ints of values into list (same length), each replacing the old entry. */
static int
store64(PyObject *list, const int64_t *values)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        PyObject *obj = PyLong_FromLongLong((long long)values[i]);
        if (obj == NULL) {
            return -1;
        }
        if (PyList_SetItem(list, i, obj) < 0) { /* steals obj; the old int: no finalizer */
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(draw_blend_doc,
             "draw_blend(lists, groups, totals, drawn, credit, key, draws, n, shards, /)\n--\n\n"
             "As draw, with a blend: each draw's source first (Blend.choose among the groups "
             "with a lane, on totals, drawn and credit; drawn and credit are updated in "
             "place), then one of that source's lanes (groups: each lane's source). "
             "OverflowError, with nothing changed, where the blend's numbers leave 64 bits "
             "before the first draw.");

static PyObject *
draw_blend(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *lists, *groups_obj, *totals_obj, *drawn_obj, *credit_obj, *key_obj, *draws_obj;
    Py_ssize_t n;
    int shards;
    uint64_t key, draws;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!OOnp:draw_blend", &PyList_Type, &lists, &PyList_Type,
                          &groups_obj, &PyList_Type, &totals_obj, &PyList_Type, &drawn_obj,
                          &PyList_Type, &credit_obj, &key_obj, &draws_obj, &n, &shards)) {
        return NULL;
    }
    if (as_u64(key_obj, "key", &key) < 0 || as_u64(draws_obj, "draws", &draws) < 0) {
        return NULL;
    }
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        return NULL;
    }
    Py_ssize_t lanes = PyList_GET_SIZE(lists), sources = PyList_GET_SIZE(totals_obj);
    if (PyList_GET_SIZE(groups_obj) != lanes) {
        PyErr_SetString(PyExc_ValueError, "groups needs one entry per lane");
        return NULL;
    }
    if (PyList_GET_SIZE(drawn_obj) != sources || PyList_GET_SIZE(credit_obj) != sources) {
        PyErr_SetString(PyExc_ValueError, "a blend's drawn and credit need one entry per source");
        return NULL;
    }
    if (n == 0) {
        return Py_BuildValue("([][])");
    }
    if (lanes == 0) {
        PyErr_SetString(PyExc_ValueError, "no lane to draw from");
        return NULL;
    }
    /* One block: sizes, group, order (lanes by group) per lane; per source, its numbers,
     * first lane in order, open lanes, resident samples, and the available ones. */
    Py_ssize_t *sizes = PyMem_New(Py_ssize_t, 3 * lanes + 4 * sources);
    int64_t *numbers = PyMem_New(int64_t, 4 * sources);
    uint64_t *resident = PyMem_New(uint64_t, sources);
    PyObject *indices = NULL, *samples = NULL, *result = NULL;
    if (sizes == NULL || numbers == NULL || resident == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t *group = sizes + lanes, *order = group + lanes, *first = order + lanes;
    Py_ssize_t *opened = first + sources, *fill = opened + sources, *available = fill + sources;
    int64_t *totals = numbers, *drawn = totals + sources, *credit = drawn + sources;
    int64_t *weights = credit + sources;
    uint64_t total;
    if (lane_sizes(lists, lanes, sizes, &total) < 0) {
        goto done;
    }
    for (Py_ssize_t g = 0; g < sources; g++) {
        opened[g] = 0;
        resident[g] = 0;
    }
    for (Py_ssize_t i = 0; i < lanes; i++) {
        PyObject *obj = PyList_GET_ITEM(groups_obj, i);
        Py_ssize_t g = PyLong_Check(obj) ? PyLong_AsSsize_t(obj) : -1;
        if (g == -1 && PyErr_Occurred()) {
            PyErr_Clear();
        }
        if (g < 0 || g >= sources) {
            PyErr_Format(PyExc_ValueError, "lane %zd's group is not a source of the blend", i);
            goto done;
        }
        group[i] = g;
        opened[g]++;
        resident[g] += (uint64_t)sizes[i];
    }
    if (int64s(totals_obj, "totals", totals) < 0 || int64s(drawn_obj, "drawn", drawn) < 0 ||
        int64s(credit_obj, "credit", credit) < 0) {
        goto done;
    }
    Py_ssize_t count = 0, at_order = 0;
    for (Py_ssize_t g = 0; g < sources; g++) {
        first[g] = fill[g] = at_order;
        at_order += opened[g];
        if (opened[g] > 0) {
            available[count++] = g;
        }
    }
    for (Py_ssize_t i = 0; i < lanes; i++) {
        order[fill[group[i]]++] = i;
    }
    Py_ssize_t most = (uint64_t)n < total ? n : (Py_ssize_t)total;
    indices = PyList_New(most);
    samples = PyList_New(most);
    if (indices == NULL || samples == NULL) {
        goto done;
    }
    Py_ssize_t k = 0;
    int overflow = 0;
    while (k < most) {
        Py_ssize_t g = choose(available, count, totals, drawn, credit, weights);
        if (g < 0) {
            overflow = 1; /* this draw is Python's to make, on its unbounded ints */
            break;
        }
        uint64_t x = key + 2 * (draws + (uint64_t)k);
        uint64_t r = splitmix(x);
        const Py_ssize_t *among = order + first[g];
        Py_ssize_t index;
        if (shards) {
            index = among[mulhi(r, (uint64_t)opened[g])];
        } else {
            uint64_t at = mulhi(r, resident[g]);
            index = *among;
            while (at >= (uint64_t)sizes[index]) { /* at < resident[g]: ends in the group */
                at -= (uint64_t)sizes[index];
                index = *++among;
            }
        }
        PyObject *items = PyList_GET_ITEM(lists, index);
        Py_ssize_t size = sizes[index];
        if (PyList_GET_SIZE(items) != size) { /* one list given as two lanes */
            PyErr_Format(PyExc_ValueError, "lane %zd's list is another lane's too", index);
            goto done;
        }
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
        resident[g]--;
        if (size == 1) {
            break;
        }
    }
    if (overflow && k == 0) {
        PyErr_SetString(PyExc_OverflowError, "the blend's numbers leave 64 bits: nothing drawn");
        goto done;
    }
    if (store64(drawn_obj, drawn) < 0 || store64(credit_obj, credit) < 0) {
        goto done;
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
    PyMem_Free(numbers);
    PyMem_Free(resident);
    Py_XDECREF(indices);
    Py_XDECREF(samples);
    return result;
}

static PyMethodDef methods[] = {
    {"draw", draw, METH_VARARGS, draw_doc},
    {"draw_blend", draw_blend, METH_VARARGS, draw_blend_doc},
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
