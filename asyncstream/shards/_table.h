/* What _tarwalk.c uses of the Records table (_records.c): one extension, two files.
 * Not read by any other extension; see _records.h for the layout and the sink protocol.
 */
#ifndef ASYNCSTREAM_TABLE_H
#define ASYNCSTREAM_TABLE_H

#include <Python.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define TABLE_HIDDEN __attribute__((visibility("hidden")))
#else
#define TABLE_HIDDEN
#endif

/* A field as the walk holds it before its sample is added: strong references. */
typedef struct {
    PyObject *ext;   /* str */
    Py_ssize_t start;
    Py_ssize_t stop;
    PyObject *owned; /* bytes, or NULL */
} TableField;

/* A new, empty Records (NULL with an exception set). */
TABLE_HIDDEN PyObject *table_new(void);

/* Add a row to the Records `table` (0, or -1 with an exception set); the table takes its
 * own references to key, the extensions and the owned bytes. */
TABLE_HIDDEN int table_add(PyObject *table, PyObject *key, int64_t offset,
                           const TableField *fields, Py_ssize_t count);

/* Register Records and `deliver` on the module (0, or -1). */
TABLE_HIDDEN int table_module_exec(PyObject *module);

#endif
