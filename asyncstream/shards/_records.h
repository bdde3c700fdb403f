/* The records of a chunk as one compact table, and the C sink protocol that reads them.
 *
 * Records (asyncstream.shards._tarwalk.Records, implemented in _records.c) is what the
 * native tar walk fills in place of a list of tuples: one row per sample (its key as a
 * str, the offset of its first header, a span of the field table) and one field per
 * member (the index of its extension in the table's small list of extension strs, the
 * member's [start, stop) in the chunk's view, or the bytes it owns). Python sees the list
 * it replaces: len(), records[i] (the tuple (key, offset, *(ext, start, stop, owned)),
 * built on demand), iteration.
 *
 * The C sink protocol: an object that Iteration.take may hand records to without a Python
 * call exposes, as its attribute `__records_sink__`, a PyCapsule named
 * AS_RECORDS_SINK_CAPSULE holding an AsRecordsSink. `deliver` (in _records.c) calls its
 * `row` with a borrowed view of each drawn sample's row; the sink returns 1 to go on, 0
 * to stop, -1 with an exception set. A sink that needs the record as Python sees it (an
 * uncommon sample handed to Python code) builds it with as_records_row_tuple. Everything
 * in a row view is borrowed and valid only during the call.
 *
 * This header is read by two extensions (the shards one and dali_ops._batchc): only types
 * and static inline functions here, nothing that needs linking across them.
 */
#ifndef ASYNCSTREAM_RECORDS_H
#define ASYNCSTREAM_RECORDS_H

#include <Python.h>
#include <stdint.h>

#define AS_RECORDS_SINK_CAPSULE "asyncstream.shards._tarwalk.records_sink"

/* A member of a sample: its bytes are `owned` (a bytes object) if not NULL, else
 * view[start:stop] of the chunk's view. `ext` indexes the table's extension list. */
typedef struct {
    Py_ssize_t ext;
    Py_ssize_t start;
    Py_ssize_t stop;
    PyObject *owned;
} AsRecordsField;

/* One sample as a sink sees it; every pointer borrowed. exts[fields[i].ext] is a str
 * (the table checks each index when the field is added: 0 <= ext < nexts). */
typedef struct {
    PyObject *key;
    int64_t offset;
    const AsRecordsField *fields;
    Py_ssize_t nfields;
    PyObject *const *exts;
    Py_ssize_t nexts;
} AsRecordsRow;

/* `sink` is the object that exposed the capsule; `view` the chunk's view and `buffer`
 * its bytes (buffer->buf is NULL where the view exports none); `url` the shard's. */
typedef int (*AsRecordsRowFn)(PyObject *sink, PyObject *view, const Py_buffer *buffer,
                              PyObject *url, const AsRecordsRow *row);

typedef struct {
    AsRecordsRowFn row;
} AsRecordsSink;

/* The record of `row` as Python sees it: (key, offset, *(ext, start, stop, owned)), a new
 * reference (NULL with an exception set). */
static inline PyObject *
as_records_row_tuple(const AsRecordsRow *row)
{
    PyObject *record = PyTuple_New(2 + row->nfields);
    if (record == NULL) {
        return NULL;
    }
    PyObject *offset = PyLong_FromLongLong((long long)row->offset);
    if (offset == NULL) {
        Py_DECREF(record);
        return NULL;
    }
    Py_INCREF(row->key);
    PyTuple_SET_ITEM(record, 0, row->key);
    PyTuple_SET_ITEM(record, 1, offset);
    for (Py_ssize_t i = 0; i < row->nfields; i++) {
        const AsRecordsField *f = &row->fields[i];
        if (f->ext < 0 || f->ext >= row->nexts) {
            Py_DECREF(record);
            PyErr_SetString(PyExc_SystemError, "a record field names no extension");
            return NULL;
        }
        PyObject *field = PyTuple_New(4);
        PyObject *start = PyLong_FromSsize_t(f->start);
        PyObject *stop = PyLong_FromSsize_t(f->stop);
        if (field == NULL || start == NULL || stop == NULL) {
            Py_XDECREF(field);
            Py_XDECREF(start);
            Py_XDECREF(stop);
            Py_DECREF(record);
            return NULL;
        }
        PyObject *ext = row->exts[f->ext];
        PyObject *owned = f->owned == NULL ? Py_None : f->owned;
        Py_INCREF(ext);
        Py_INCREF(owned);
        PyTuple_SET_ITEM(field, 0, ext);
        PyTuple_SET_ITEM(field, 1, start);
        PyTuple_SET_ITEM(field, 2, stop);
        PyTuple_SET_ITEM(field, 3, owned);
        PyTuple_SET_ITEM(record, 2 + i, field);
    }
    return record;
}

#endif
