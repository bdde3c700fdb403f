/* soonest(): the prefetch stage's ranking in C. Its Python reference is
 * asyncstream.stream._prefetch._soonest; tests/test_prefetch.py compares the two.
 *
 * Each open lane and each piece still to open is a run of chunks whose need times grow by
 * a fixed step (its Ahead: position, first chunk, samples per chunk, stop, tail). A piece
 * takes the lane that frees first (a heap of the lanes' finish times); the runs are then
 * merged on a heap keyed by (need time, position, chunk), the first `budget` chunks
 * named. Positions are distinct across runs, so that key orders every chunk as Python's
 * tuple comparison of the reference's heap entries does, and the arithmetic is the
 * reference's, in doubles: the same list, chunk for chunk.
 *
 * Over 64 lanes, once every few 1 MiB blocks, the reference cost 45 us a ranking
 * (`python -m bench.samplecost --many --defaults --paths take --steps`).
 *
 * Malformed input (a lane that is not (int, Ahead or None), an Ahead of another length)
 * is a TypeError; a number beyond 64 bits an OverflowError (the caller then runs the
 * reference, whose ints have no bound).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_soonest.h"

typedef struct {
    double t; /* need time of the run's next chunk */
    long long position;
    long long chunk;
    double start;
    long long first;
    double per;
    long long stop;
} Run;

/* a sorts before b in the merge (the reference's tuple order: t, position, chunk) */
static int
run_less(const Run *a, const Run *b)
{
    if (a->t != b->t) {
        return a->t < b->t;
    }
    if (a->position != b->position) {
        return a->position < b->position;
    }
    return a->chunk < b->chunk;
}

static void
run_sift_down(Run *heap, Py_ssize_t n, Py_ssize_t i)
{
    for (;;) {
        Py_ssize_t left = 2 * i + 1, least = i;
        if (left < n && run_less(&heap[left], &heap[least])) {
            least = left;
        }
        if (left + 1 < n && run_less(&heap[left + 1], &heap[least])) {
            least = left + 1;
        }
        if (least == i) {
            return;
        }
        Run swap = heap[i];
        heap[i] = heap[least];
        heap[least] = swap;
        i = least;
    }
}

static void
time_sift_down(double *heap, Py_ssize_t n, Py_ssize_t i)
{
    for (;;) {
        Py_ssize_t left = 2 * i + 1, least = i;
        if (left < n && heap[left] < heap[least]) {
            least = left;
        }
        if (left + 1 < n && heap[left + 1] < heap[least]) {
            least = left + 1;
        }
        if (least == i) {
            return;
        }
        double swap = heap[i];
        heap[i] = heap[least];
        heap[least] = swap;
        i = least;
    }
}

/* An Ahead's fields (0, or -1 with an exception set). */
static int
read_ahead(PyObject *ahead, long long *position, long long *first, double *per,
           long long *stop, long long *tail)
{
    if (!PyTuple_Check(ahead) || PyTuple_GET_SIZE(ahead) != 5) {
        PyErr_SetString(PyExc_TypeError, "soonest: an Ahead is a tuple of 5 fields");
        return -1;
    }
    *position = PyLong_AsLongLong(PyTuple_GET_ITEM(ahead, 0));
    *first = PyLong_AsLongLong(PyTuple_GET_ITEM(ahead, 1));
    *per = PyFloat_AsDouble(PyTuple_GET_ITEM(ahead, 2));
    *stop = PyLong_AsLongLong(PyTuple_GET_ITEM(ahead, 3));
    *tail = PyLong_AsLongLong(PyTuple_GET_ITEM(ahead, 4));
    return PyErr_Occurred() ? -1 : 0;
}

/* soonest(lanes, upcoming, window, budget) -> [(position, chunk), ...] */
TABLE_HIDDEN PyObject *
soonest_rank(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "soonest(lanes, upcoming, window, budget)");
        return NULL;
    }
    PyObject *lanes = PySequence_Fast(args[0], "soonest: lanes must be a sequence");
    if (lanes == NULL) {
        return NULL;
    }
    PyObject *upcoming = PySequence_Fast(args[1], "soonest: upcoming must be a sequence");
    if (upcoming == NULL) {
        Py_DECREF(lanes);
        return NULL;
    }
    Py_ssize_t window = PyLong_AsSsize_t(args[2]);
    Py_ssize_t budget = PyLong_AsSsize_t(args[3]);
    PyObject *wanted = NULL;
    Run *runs = NULL;
    double *finish = NULL;
    if (PyErr_Occurred()) {
        goto done;
    }
    Py_ssize_t n_lanes = PySequence_Fast_GET_SIZE(lanes);
    Py_ssize_t n_up = PySequence_Fast_GET_SIZE(upcoming);
    if (budget < 0) {
        budget = 0;
    }
    if (n_up > budget) {
        n_up = budget;
    }
    Py_ssize_t n_finish = n_lanes > window ? n_lanes : window;
    runs = PyMem_Malloc(sizeof(Run) * (size_t)(n_lanes + n_up + 1));
    finish = PyMem_Malloc(sizeof(double) * (size_t)(n_finish + 1));
    if (runs == NULL || finish == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t n_runs = 0;
    for (Py_ssize_t i = 0; i < n_lanes; i++) {
        PyObject *lane = PySequence_Fast_GET_ITEM(lanes, i);
        if (!PyTuple_Check(lane) || PyTuple_GET_SIZE(lane) != 2) {
            PyErr_SetString(PyExc_TypeError, "soonest: a lane is (resident, Ahead or None)");
            goto done;
        }
        long long resident = PyLong_AsLongLong(PyTuple_GET_ITEM(lane, 0));
        if (resident == -1 && PyErr_Occurred()) {
            goto done;
        }
        double t = (double)resident;
        PyObject *ahead = PyTuple_GET_ITEM(lane, 1);
        if (ahead != Py_None) {
            Run *run = &runs[n_runs++];
            long long tail;
            if (read_ahead(ahead, &run->position, &run->first, &run->per, &run->stop, &tail) <
                0) {
                goto done;
            }
            run->t = run->start = t;
            run->chunk = run->first;
            t += (double)tail;
        }
        finish[i] = t;
    }
    for (Py_ssize_t i = n_lanes; i < n_finish; i++) {
        finish[i] = 0.0;
    }
    for (Py_ssize_t i = n_finish / 2 - 1; i >= 0; i--) {
        time_sift_down(finish, n_finish, i);
    }
    if (n_finish == 0 && n_up > 0) { /* no lane at all: the reference's heappop fails */
        PyErr_SetString(PyExc_IndexError, "index out of range");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_up; i++) {
        Run *run = &runs[n_runs++];
        long long first, count;
        if (read_ahead(PySequence_Fast_GET_ITEM(upcoming, i), &run->position, &first, &run->per,
                       &run->stop, &count) < 0) {
            goto done;
        }
        /* the reference: t = heappop(finish); ...; heappush(finish, t + count): the least
         * replaced, as one heapreplace (the same values; their order is not looked at) */
        double t = finish[0];
        run->t = run->start = t;
        run->first = run->chunk = 0;
        finish[0] = t + (double)count;
        time_sift_down(finish, n_finish, 0);
    }
    for (Py_ssize_t i = n_runs / 2 - 1; i >= 0; i--) {
        run_sift_down(runs, n_runs, i);
    }
    wanted = PyList_New(0);
    if (wanted == NULL) {
        goto done;
    }
    while (n_runs > 0 && PyList_GET_SIZE(wanted) < budget) {
        Run *top = &runs[0];
        PyObject *key = Py_BuildValue("(LL)", top->position, top->chunk);
        if (key == NULL || PyList_Append(wanted, key) < 0) {
            Py_XDECREF(key);
            Py_CLEAR(wanted);
            goto done;
        }
        Py_DECREF(key);
        top->chunk += 1;
        if (top->chunk < top->stop) {
            top->t = top->start + (double)(top->chunk - top->first) * top->per;
        } else {
            runs[0] = runs[--n_runs];
        }
        run_sift_down(runs, n_runs, 0);
    }
done:
    PyMem_Free(runs);
    PyMem_Free(finish);
    Py_DECREF(lanes);
    Py_DECREF(upcoming);
    return wanted;
}
