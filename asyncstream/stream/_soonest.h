/* What _nextc.c registers of _soonest.c (the prefetch ranking): one extension, two files. */
#ifndef ASYNCSTREAM_SOONEST_H
#define ASYNCSTREAM_SOONEST_H

#include <Python.h>

#if defined(__GNUC__)
#define TABLE_HIDDEN __attribute__((visibility("hidden")))
#else
#define TABLE_HIDDEN
#endif

/* soonest(lanes, upcoming, window, budget): see _soonest.c (METH_FASTCALL). */
TABLE_HIDDEN PyObject *soonest_rank(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif
