/* Records: a chunk's samples as one compact table, and `deliver`, take's loop in C.
 *
 * Layout (see _records.h for the types a sink reads):
 *   rows[nrows]     key (a str, the one object per sample), offset (int64), the span
 *                   [first, first + count) of the field table;
 *   fields[nfields] ext (an index into exts), start, stop (Py_ssize_t), owned (a bytes
 *                   object, or NULL: the member is view[start:stop] of the chunk's view);
 *   exts[nexts]     the table's extension strs, each once (looked up by identity first:
 *                   the walk hands the same object for the same extension; then by value
 *                   through `ext_index`, a dict, so a shard of ever new extensions costs
 *                   one dict look-up per field, not a scan).
 * The native walk fills it with no Python object per field; the general parser's rare
 * records (pax, GNU long names, sparse members, names the walk refuses) are appended as
 * tuples (append, extend), so that a chunk's records are one object.
 *
 * To Python it is the list of tuples it replaces: len(records), records[i] (negative too;
 * the tuple (key, offset, *(ext, start, stop, owned)) built on demand), iteration.
 * records.sample(i, view, url, views=False) builds the dict the stream's plain iteration
 * hands out; deliver(lanes, indices, samples, sink) is Iteration.take's loop: each drawn
 * sample handed to the sink, a C sink (the protocol of _records.h) with no Python call.
 *
 * Memory safety: every index is checked (a row against nrows, a field's ext against
 * nexts when it is added); a member's bytes are read only after its [start, stop) is
 * clamped to the view's length as Python's slicing clamps it. While C code holds
 * pointers into the arrays and may run Python code (a sink's fallback, a hash), the table
 * counts a reader and refuses to grow (BufferError), so the arrays never move under it. The table holds no
 * container (str, bytes), so it cannot be part of a reference cycle and is not tracked by
 * the garbage collector.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "_records.h"
#include "_table.h"

#define EXT_SCAN 16 /* extensions compared by identity before the dict is asked */

typedef struct {
    PyObject *key;
    int64_t offset;
    Py_ssize_t first;
    Py_ssize_t count;
} Row;

typedef struct {
    PyObject_HEAD
    Row *rows;
    Py_ssize_t nrows;
    Py_ssize_t rows_cap;
    AsRecordsField *fields;
    Py_ssize_t nfields;
    Py_ssize_t fields_cap;
    PyObject **exts;
    Py_ssize_t nexts;
    Py_ssize_t exts_cap;
    PyObject *ext_index; /* dict: ext -> its index; NULL until the first extension */
    Py_ssize_t readers;  /* C code holding pointers into rows/fields: no row added then */
} Records;

static PyTypeObject RecordsType;
static PyObject *KEY_NAME; /* "__key__" */
static PyObject *URL_NAME; /* "__url__" */

/* Room for `need` items of `size` bytes in *array (0, or -1 with MemoryError). */
static int
grow(void **array, Py_ssize_t *cap, Py_ssize_t need, size_t size)
{
    if (need <= *cap) {
        return 0;
    }
    Py_ssize_t next = *cap < 16 ? 16 : *cap;
    while (next < need) {
        next = next > PY_SSIZE_T_MAX / 2 ? need : next * 2;
    }
    if ((size_t)next > (size_t)PY_SSIZE_T_MAX / size) {
        PyErr_NoMemory();
        return -1;
    }
    void *more = PyMem_Realloc(*array, (size_t)next * size);
    if (more == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *array = more;
    *cap = next;
    return 0;
}

/* The index of extension `ext` (a str) in the table, added if new; -1 on an error. */
static Py_ssize_t
ext_index(Records *self, PyObject *ext)
{
    Py_ssize_t scan = self->nexts < EXT_SCAN ? self->nexts : EXT_SCAN;
    for (Py_ssize_t i = 0; i < scan; i++) {
        if (self->exts[i] == ext) {
            return i;
        }
    }
    if (!PyUnicode_Check(ext)) {
        PyErr_SetString(PyExc_TypeError, "a record field's extension must be a str");
        return -1;
    }
    if (self->ext_index == NULL) {
        self->ext_index = PyDict_New();
        if (self->ext_index == NULL) {
            return -1;
        }
    }
    PyObject *found = PyDict_GetItemWithError(self->ext_index, ext);
    if (found != NULL) {
        return PyLong_AsSsize_t(found);
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    if (grow((void **)&self->exts, &self->exts_cap, self->nexts + 1, sizeof(PyObject *)) < 0) {
        return -1;
    }
    Py_ssize_t at = self->nexts;
    PyObject *number = PyLong_FromSsize_t(at);
    if (number == NULL) {
        return -1;
    }
    int failed = PyDict_SetItem(self->ext_index, ext, number);
    Py_DECREF(number);
    if (failed < 0) {
        return -1;
    }
    Py_INCREF(ext);
    self->exts[at] = ext;
    self->nexts = at + 1;
    return at;
}

/* Whether rows may be added now (0), or not while C code reads the table (-1, with
 * BufferError): code that Python runs in the middle of a read (a sink, a hash) could
 * otherwise move the arrays under it. */
static int
writable(const Records *self)
{
    if (self->readers > 0) {
        PyErr_SetString(PyExc_BufferError, "records cannot grow while they are being read");
        return -1;
    }
    return 0;
}

/* Room for a row of `count` fields (0, or -1). */
static int
reserve(Records *self, Py_ssize_t count)
{
    if (writable(self) < 0) {
        return -1;
    }
    if (count < 0 || count > PY_SSIZE_T_MAX - self->nfields) {
        PyErr_NoMemory();
        return -1;
    }
    if (grow((void **)&self->rows, &self->rows_cap, self->nrows + 1, sizeof(Row)) < 0) {
        return -1;
    }
    return grow((void **)&self->fields, &self->fields_cap, self->nfields + count,
                sizeof(AsRecordsField));
}

int
table_add(PyObject *table, PyObject *key, int64_t offset, const TableField *fields,
          Py_ssize_t count)
{
    Records *self = (Records *)table;
    if (reserve(self, count) < 0) {
        return -1;
    }
    AsRecordsField *out = self->fields + self->nfields;
    /* An extension's look-up may run Python code (a str subclass's hash): the table is
     * read-only meanwhile, so `out` stays where it is. */
    self->readers++;
    for (Py_ssize_t i = 0; i < count; i++) { /* nothing kept before every ext is found */
        Py_ssize_t ext = ext_index(self, fields[i].ext);
        if (ext < 0) {
            self->readers--;
            return -1;
        }
        out[i].ext = ext;
    }
    self->readers--;
    for (Py_ssize_t i = 0; i < count; i++) {
        out[i].start = fields[i].start;
        out[i].stop = fields[i].stop;
        out[i].owned = fields[i].owned;
        Py_XINCREF(out[i].owned);
    }
    Row *row = &self->rows[self->nrows];
    Py_INCREF(key);
    row->key = key;
    row->offset = offset;
    row->first = self->nfields;
    row->count = count;
    self->nfields += count;
    self->nrows += 1;
    return 0;
}

PyObject *
table_new(void)
{
    return PyObject_CallNoArgs((PyObject *)&RecordsType);
}

static AsRecordsRow
row_view(const Records *self, Py_ssize_t i)
{
    const Row *row = &self->rows[i];
    AsRecordsRow view = {
        .key = row->key,
        .offset = row->offset,
        .fields = self->fields + row->first,
        .nfields = row->count,
        .exts = self->exts,
        .nexts = self->nexts,
    };
    return view;
}

/* A row's index from a Python index (negative from the end); -1 with IndexError. */
static Py_ssize_t
row_at(const Records *self, Py_ssize_t i)
{
    if (i < 0) {
        i += self->nrows;
    }
    if (i < 0 || i >= self->nrows) {
        PyErr_SetString(PyExc_IndexError, "records index out of range");
        return -1;
    }
    return i;
}

/* ------------------------------------------------------------------ the Python type */

static void
records_dealloc(PyObject *op)
{
    Records *self = (Records *)op;
    for (Py_ssize_t i = 0; i < self->nrows; i++) {
        Py_DECREF(self->rows[i].key);
    }
    for (Py_ssize_t i = 0; i < self->nfields; i++) {
        Py_XDECREF(self->fields[i].owned);
    }
    for (Py_ssize_t i = 0; i < self->nexts; i++) {
        Py_DECREF(self->exts[i]);
    }
    Py_XDECREF(self->ext_index);
    PyMem_Free(self->rows);
    PyMem_Free(self->fields);
    PyMem_Free(self->exts);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *
records_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if ((args != NULL && PyTuple_GET_SIZE(args) != 0) ||
        (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Records() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0); /* zeroed: an empty table */
}

static Py_ssize_t
records_length(PyObject *op)
{
    return ((Records *)op)->nrows;
}

static PyObject *
records_item(PyObject *op, Py_ssize_t i)
{
    Records *self = (Records *)op;
    if (i < 0 || i >= self->nrows) { /* PySequence_GetItem has added len to a negative i */
        PyErr_SetString(PyExc_IndexError, "records index out of range");
        return NULL;
    }
    AsRecordsRow row = row_view(self, i);
    self->readers++;
    PyObject *record = as_records_row_tuple(&row);
    self->readers--;
    return record;
}

/* Add the record `record`, a tuple (key, offset, *(ext, start, stop, owned)). */
static int
append_tuple(Records *self, PyObject *record)
{
    if (writable(self) < 0) {
        return -1;
    }
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 2) {
        PyErr_SetString(PyExc_TypeError, "a record must be a tuple (key, offset, *fields)");
        return -1;
    }
    PyObject *key = PyTuple_GET_ITEM(record, 0);
    PyObject *offset_obj = PyTuple_GET_ITEM(record, 1);
    if (!PyUnicode_Check(key) || !PyLong_Check(offset_obj)) {
        PyErr_SetString(PyExc_TypeError, "a record must start with a str key and an int offset");
        return -1;
    }
    long long offset = PyLong_AsLongLong(offset_obj);
    if (offset == -1 && PyErr_Occurred()) {
        return -1;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(record) - 2;
    TableField *fields = PyMem_Calloc(count > 0 ? (size_t)count : 1, sizeof(TableField));
    if (fields == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int failed = 0;
    for (Py_ssize_t i = 0; i < count && !failed; i++) {
        PyObject *field = PyTuple_GET_ITEM(record, 2 + i);
        if (!PyTuple_Check(field) || PyTuple_GET_SIZE(field) != 4 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(field, 0)) ||
            !PyLong_Check(PyTuple_GET_ITEM(field, 1)) ||
            !PyLong_Check(PyTuple_GET_ITEM(field, 2)) ||
            (PyTuple_GET_ITEM(field, 3) != Py_None &&
             !PyBytes_Check(PyTuple_GET_ITEM(field, 3)))) {
            PyErr_SetString(PyExc_TypeError,
                            "a record field must be (str, int, int, bytes or None)");
            failed = 1;
            break;
        }
        fields[i].ext = PyTuple_GET_ITEM(field, 0);
        fields[i].start = PyLong_AsSsize_t(PyTuple_GET_ITEM(field, 1));
        fields[i].stop = PyLong_AsSsize_t(PyTuple_GET_ITEM(field, 2));
        PyObject *owned = PyTuple_GET_ITEM(field, 3);
        fields[i].owned = owned == Py_None ? NULL : owned;
        failed = PyErr_Occurred() != NULL;
    }
    if (!failed) {
        failed = table_add((PyObject *)self, key, (int64_t)offset, fields, count) < 0;
    }
    PyMem_Free(fields);
    return failed ? -1 : 0;
}

static int extend_rows(Records *self, Records *other);

/* Add every row of another table (its extensions mapped to this one's). */
static int
extend_table(Records *self, Records *other)
{
    if (writable(self) < 0) {
        return -1;
    }
    if (other->nrows == 0) {
        return 0;
    }
    /* Both read-only while the extensions are looked up (Python code may run). */
    self->readers++;
    other->readers++;
    int failed = extend_rows(self, other);
    self->readers--;
    other->readers--;
    return failed;
}

/* extend_table's work, with both tables marked read (their arrays grow only here). */
static int
extend_rows(Records *self, Records *other)
{
    Py_ssize_t *map = PyMem_Calloc(other->nexts > 0 ? (size_t)other->nexts : 1,
                                   sizeof(Py_ssize_t));
    if (map == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < other->nexts; i++) {
        map[i] = ext_index(self, other->exts[i]);
        if (map[i] < 0) {
            PyMem_Free(map);
            return -1;
        }
    }
    /* `other` may be `self`: its sizes read once, before anything is added */
    Py_ssize_t nrows = other->nrows;
    Py_ssize_t nfields = other->nfields;
    if (nrows > PY_SSIZE_T_MAX - self->nrows || nfields > PY_SSIZE_T_MAX - self->nfields ||
        grow((void **)&self->rows, &self->rows_cap, self->nrows + nrows, sizeof(Row)) < 0 ||
        grow((void **)&self->fields, &self->fields_cap, self->nfields + nfields,
             sizeof(AsRecordsField)) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        PyMem_Free(map);
        return -1;
    }
    Py_ssize_t base = self->nfields;
    for (Py_ssize_t i = 0; i < nfields; i++) {
        AsRecordsField field = other->fields[i];
        field.ext = map[field.ext];
        Py_XINCREF(field.owned);
        self->fields[base + i] = field;
    }
    for (Py_ssize_t i = 0; i < nrows; i++) {
        Row row = other->rows[i];
        Py_INCREF(row.key);
        row.first += base;
        self->rows[self->nrows + i] = row;
    }
    self->nfields += nfields;
    self->nrows += nrows;
    PyMem_Free(map);
    return 0;
}

static int
extend(Records *self, PyObject *items)
{
    if (Py_IS_TYPE(items, &RecordsType)) {
        return extend_table(self, (Records *)items);
    }
    PyObject *seq = PySequence_Fast(items, "extend takes Records or an iterable of records");
    if (seq == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        if (append_tuple(self, PySequence_Fast_GET_ITEM(seq, i)) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

static PyObject *
records_append(PyObject *op, PyObject *record)
{
    if (append_tuple((Records *)op, record) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
records_extend(PyObject *op, PyObject *items)
{
    if (extend((Records *)op, items) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
records_inplace_concat(PyObject *op, PyObject *items)
{
    if (extend((Records *)op, items) < 0) {
        return NULL;
    }
    return Py_NewRef(op);
}

/* The dict of row i: {"__key__": key, "__url__": url, ext: bytes or view slice...}. */
/* `bytes` (where not `views`) are copied from `given` if not NULL (view's bytes, held by
 * the caller), else from view's buffer, taken here when first needed. */
static PyObject *
sample_dict(Records *self, Py_ssize_t i, PyObject *view, const Py_buffer *given, PyObject *url,
            int views)
{
    const Row *row = &self->rows[i];
    const AsRecordsField *fields = self->fields + row->first;
    Py_buffer buffer = {0};
    int viewed = 0;
    const Py_buffer *bytes = given;
    PyObject *out = PyDict_New();
    if (out == NULL) {
        return NULL;
    }
    if (PyDict_SetItem(out, KEY_NAME, row->key) < 0 || PyDict_SetItem(out, URL_NAME, url) < 0) {
        goto failed;
    }
    for (Py_ssize_t j = 0; j < row->count; j++) {
        const AsRecordsField *f = &fields[j];
        PyObject *value;
        if (f->owned != NULL) {
            value = Py_NewRef(f->owned);
        }
        else if (views) {
            value = PySequence_GetSlice(view, f->start, f->stop);
        }
        else {
            if (bytes == NULL) {
                if (PyObject_GetBuffer(view, &buffer, PyBUF_SIMPLE) < 0) {
                    goto failed;
                }
                viewed = 1;
                bytes = &buffer;
            }
            Py_ssize_t start = f->start;
            Py_ssize_t stop = f->stop;
            Py_ssize_t size = PySlice_AdjustIndices(bytes->len, &start, &stop, 1);
            value = PyBytes_FromStringAndSize((const char *)bytes->buf + start, size);
        }
        if (value == NULL) {
            goto failed;
        }
        int set = PyDict_SetItem(out, self->exts[f->ext], value);
        Py_DECREF(value);
        if (set < 0) {
            goto failed;
        }
    }
    if (viewed) {
        PyBuffer_Release(&buffer);
    }
    return out;
failed:
    if (viewed) {
        PyBuffer_Release(&buffer);
    }
    Py_DECREF(out);
    return NULL;
}

PyDoc_STRVAR(records_sample_doc,
"sample(i, view, url, views=False, /)\n"
"--\n"
"\n"
"Record ``i`` as the stream's dict: ``__key__``, ``__url__`` and each member, as\n"
"``bytes`` copied from ``view`` (``views``: a slice of ``view``) or the bytes it owns.");

static PyObject *
records_sample(PyObject *op, PyObject *const *args, Py_ssize_t nargs)
{
    Records *self = (Records *)op;
    if (nargs < 3 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "sample takes (i, view, url, views=False)");
        return NULL;
    }
    Py_ssize_t i = PyNumber_AsSsize_t(args[0], PyExc_IndexError);
    if (i == -1 && PyErr_Occurred()) {
        return NULL;
    }
    i = row_at(self, i);
    if (i < 0) {
        return NULL;
    }
    int views = 0;
    if (nargs == 4) {
        views = PyObject_IsTrue(args[3]);
        if (views < 0) {
            return NULL;
        }
    }
    self->readers++;
    PyObject *out = sample_dict(self, i, args[1], NULL, args[2], views);
    self->readers--;
    return out;
}

PyDoc_STRVAR(records_members_doc,
"members(count, /)\n"
"--\n"
"\n"
"The keys of the first ``count`` samples (all, where there are fewer), and the\n"
"extensions of each one's members, in order: ``(keys, exts)``, a list of str and a\n"
"list of tuples of str. What the member-order look takes, with no record tuple made.");

static PyObject *
records_members(PyObject *op, PyObject *arg)
{
    Records *self = (Records *)op;
    Py_ssize_t count = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (count == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "members: count must be >= 0");
        return NULL;
    }
    Py_ssize_t n = count < self->nrows ? count : self->nrows;
    PyObject *keys = PyList_New(n);
    PyObject *exts = PyList_New(n);
    if (keys == NULL || exts == NULL) {
        goto failed;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const Row *row = &self->rows[i];
        PyObject *names = PyTuple_New(row->count);
        if (names == NULL) {
            goto failed;
        }
        for (Py_ssize_t j = 0; j < row->count; j++) {
            Py_ssize_t ext = self->fields[row->first + j].ext;
            if (ext < 0 || ext >= self->nexts) {
                Py_DECREF(names);
                PyErr_SetString(PyExc_SystemError, "a record field names no extension");
                goto failed;
            }
            Py_INCREF(self->exts[ext]);
            PyTuple_SET_ITEM(names, j, self->exts[ext]);
        }
        Py_INCREF(row->key);
        PyList_SET_ITEM(keys, i, row->key);
        PyList_SET_ITEM(exts, i, names);
    }
    PyObject *out = PyTuple_Pack(2, keys, exts);
    Py_DECREF(keys);
    Py_DECREF(exts);
    return out;
failed:
    Py_XDECREF(keys);
    Py_XDECREF(exts);
    return NULL;
}

static PyMethodDef records_methods[] = {
    {"append", records_append, METH_O, "append(record, /)\n--\n\nAdd a record tuple."},
    {"extend", records_extend, METH_O,
     "extend(records, /)\n--\n\nAdd every record of a Records or an iterable of tuples."},
    {"sample", (PyCFunction)(void (*)(void))records_sample, METH_FASTCALL,
     records_sample_doc},
    {"members", records_members, METH_O, records_members_doc},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods records_as_sequence = {
    .sq_length = records_length,
    .sq_item = records_item,
    .sq_inplace_concat = records_inplace_concat,
};

PyDoc_STRVAR(records_doc,
"Records()\n"
"--\n"
"\n"
"A chunk's samples as one table: to Python, the list of record tuples\n"
"``(key, offset, *(ext, start, stop, owned))`` it replaces.");

static PyTypeObject RecordsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncstream.shards._tarwalk.Records",
    .tp_basicsize = sizeof(Records),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = records_doc,
    .tp_new = records_new,
    .tp_dealloc = records_dealloc,
    .tp_as_sequence = &records_as_sequence,
    .tp_methods = records_methods,
};

/* ------------------------------------------------------------------ deliver */

/* A lane of deliver's `lanes`, read when first drawn from. */
typedef struct {
    PyObject *lane;    /* strong: the (records, view, url, first) tuple */
    PyObject *records; /* borrowed from lane, as are view and url */
    PyObject *view;
    PyObject *url;
    Py_ssize_t first;
    int read;
    int viewed;        /* buffer holds view's bytes */
    Py_buffer buffer;
} Lane;

static int
lane_read(Lane *lane, PyObject *item)
{
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4) {
        PyErr_SetString(PyExc_TypeError, "a lane must be (records, view, url, first)");
        return -1;
    }
    Py_ssize_t first = PyNumber_AsSsize_t(PyTuple_GET_ITEM(item, 3), PyExc_OverflowError);
    if (first == -1 && PyErr_Occurred()) {
        return -1;
    }
    Py_INCREF(item);
    lane->lane = item;
    lane->records = PyTuple_GET_ITEM(item, 0);
    lane->view = PyTuple_GET_ITEM(item, 1);
    lane->url = PyTuple_GET_ITEM(item, 2);
    lane->first = first;
    lane->read = 1;
    return 0;
}

/* The lane's view as bytes, taken once: 0, or -1 where the view exports none (no
 * exception: only owned members can then be read). */
static int
lane_bytes(Lane *lane)
{
    if (!lane->viewed) {
        if (PyObject_GetBuffer(lane->view, &lane->buffer, PyBUF_SIMPLE) == 0) {
            lane->viewed = 1;
        }
        else {
            PyErr_Clear();
            lane->buffer.buf = NULL;
            lane->buffer.len = 0;
            return -1;
        }
    }
    return 0;
}

/* The exception set, taken as an object with its traceback (never NULL). */
static PyObject *
take_error(void)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (value == NULL) {
        value = PyObject_CallOneArg(PyExc_SystemError, Py_None);
    }
    else if (traceback != NULL) {
        PyException_SetTraceback(value, traceback);
    }
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    return value;
}

/* The C sink of `sink`, or NULL (a Python sink; no exception); -1 in *error on one. */
static const AsRecordsSink *
c_sink(PyObject *sink, PyObject **capsule, int *error)
{
    *capsule = PyObject_GetAttrString(sink, "__records_sink__");
    if (*capsule == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            return NULL;
        }
        *error = -1;
        return NULL;
    }
    const AsRecordsSink *api = PyCapsule_GetPointer(*capsule, AS_RECORDS_SINK_CAPSULE);
    if (api == NULL || api->row == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "__records_sink__ holds no row function");
        }
        *error = -1;
        return NULL;
    }
    return api;
}

/* One drawn sample handed to the sink: 1 to go on, 0 to stop, -1 on an error. */
static int
hand(Lane *lane, Py_ssize_t row, PyObject *sink, const AsRecordsSink *api)
{
    int table = Py_IS_TYPE(lane->records, &RecordsType);
    if (table && api != NULL) {
        Records *records = (Records *)lane->records;
        row = row_at(records, row);
        if (row < 0) {
            return -1;
        }
        (void)lane_bytes(lane); /* not a buffer: only owned members are read */
        AsRecordsRow view = row_view(records, row);
        records->readers++;
        int going = api->row(sink, lane->view, &lane->buffer, lane->url, &view);
        records->readers--;
        return going;
    }
    PyObject *record = PySequence_GetItem(lane->records, row);
    if (record == NULL) {
        return -1;
    }
    PyObject *args[3] = {lane->view, lane->url, record};
    PyObject *going = PyObject_Vectorcall(sink, args, 3, NULL);
    Py_DECREF(record);
    if (going == NULL) {
        return -1;
    }
    int on = PyObject_IsTrue(going);
    Py_DECREF(going);
    return on;
}

/* A run of draws as deliver and dicts read it: draw k is sample samples[k] of lane
 * indices[k], lanes[i] being (records, view, url, first), each lane read when first drawn
 * from. */
typedef struct {
    PyObject *lanes;   /* borrowed: the list */
    PyObject *indices; /* strong: PySequence_Fast */
    PyObject *samples;
    Lane *read;
    Py_ssize_t nlanes;
    Py_ssize_t n;
} Draws;

static void
draws_free(Draws *d)
{
    if (d->read != NULL) {
        for (Py_ssize_t i = 0; i < d->nlanes; i++) {
            if (d->read[i].viewed) {
                PyBuffer_Release(&d->read[i].buffer);
            }
            Py_XDECREF(d->read[i].lane);
        }
        PyMem_Free(d->read);
        d->read = NULL;
    }
    Py_CLEAR(d->indices);
    Py_CLEAR(d->samples);
}

static int
draws_open(Draws *d, PyObject *lanes, PyObject *indices, PyObject *samples)
{
    memset(d, 0, sizeof(*d));
    if (!PyList_Check(lanes)) {
        PyErr_SetString(PyExc_TypeError, "lanes must be a list");
        return -1;
    }
    d->lanes = lanes;
    d->indices = PySequence_Fast(indices, "indices must be a sequence");
    if (d->indices == NULL) {
        return -1;
    }
    d->samples = PySequence_Fast(samples, "samples must be a sequence");
    if (d->samples == NULL) {
        draws_free(d);
        return -1;
    }
    d->nlanes = PyList_GET_SIZE(lanes);
    d->n = PySequence_Fast_GET_SIZE(d->indices);
    if (PySequence_Fast_GET_SIZE(d->samples) != d->n) {
        PyErr_SetString(PyExc_ValueError, "indices and samples differ in length");
        draws_free(d);
        return -1;
    }
    d->read = PyMem_Calloc(d->nlanes > 0 ? (size_t)d->nlanes : 1, sizeof(Lane));
    if (d->read == NULL) {
        PyErr_NoMemory();
        draws_free(d);
        return -1;
    }
    return 0;
}

/* Draw k's lane (read on first use) into *lane and its row in the lane's records into
 * *row; with an exception set, -1 where the draw is unreadable (its lane or numbers) and
 * -2 where its sample is out of the records' range (as a row_at refusal). */
static int
draws_at(Draws *d, Py_ssize_t k, Lane **lane, Py_ssize_t *row)
{
    Py_ssize_t index = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(d->indices, k),
                                          PyExc_IndexError);
    Py_ssize_t sample = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(d->samples, k),
                                           PyExc_IndexError);
    if (PyErr_Occurred()) {
        return -1;
    }
    /* The lanes list is read again at each draw: a Python sink could change it. */
    if (index < 0 || index >= d->nlanes || index >= PyList_GET_SIZE(d->lanes)) {
        PyErr_SetString(PyExc_IndexError, "a draw's lane is out of range");
        return -1;
    }
    Lane *at = &d->read[index];
    if (!at->read && lane_read(at, PyList_GET_ITEM(d->lanes, index)) < 0) {
        return -1;
    }
    if ((at->first > 0 && sample < PY_SSIZE_T_MIN + at->first) ||
        (at->first < 0 && sample > PY_SSIZE_T_MAX + at->first)) {
        PyErr_SetString(PyExc_IndexError, "records index out of range");
        return -2;
    }
    *lane = at;
    *row = sample - at->first;
    return 0;
}

/* Ask for what a run will read to be brought into the cache, a block of draws at a time,
 * in three sweeps: each draw's row of its table, then the row's fields, then (`data`: the
 * bytes are to be copied) the first bytes of each member. The run's samples lie at random
 * places of the window's tables and chunks: the reads then wait for memory about once a
 * sweep instead of once a draw. Reads nothing it has not asked for a sweep before, raises
 * nothing: a draw it cannot read is left to the loop that hands it out. */
#define PREFETCH_BLOCK 64
static void
prefetch_run(Draws *d, int data)
{
#if defined(__GNUC__) || defined(__clang__)
    const Records *tables[PREFETCH_BLOCK];
    const Lane *lanes[PREFETCH_BLOCK];
    Py_ssize_t rows[PREFETCH_BLOCK];
    for (Py_ssize_t k0 = 0; k0 < d->n; k0 += PREFETCH_BLOCK) {
        int m = 0;
        for (Py_ssize_t k = k0; k < d->n && k < k0 + PREFETCH_BLOCK; k++) {
            Py_ssize_t index = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(d->indices, k));
            Py_ssize_t sample = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(d->samples, k));
            if ((index == -1 || sample == -1) && PyErr_Occurred()) {
                PyErr_Clear();
                continue;
            }
            if (index < 0 || index >= d->nlanes || index >= PyList_GET_SIZE(d->lanes)) {
                continue;
            }
            Lane *lane = &d->read[index];
            if (!lane->read && lane_read(lane, PyList_GET_ITEM(d->lanes, index)) < 0) {
                PyErr_Clear();
                continue;
            }
            if (!Py_IS_TYPE(lane->records, &RecordsType) || (data && lane_bytes(lane) < 0)) {
                continue;
            }
            const Records *records = (const Records *)lane->records;
            if (sample < 0 || sample - lane->first < 0 ||
                sample - lane->first >= records->nrows) {
                continue;
            }
            tables[m] = records;
            lanes[m] = lane;
            rows[m] = sample - lane->first;
            __builtin_prefetch(&records->rows[rows[m]]);
            m++;
        }
        for (int i = 0; i < m; i++) {
            const Row *r = &tables[i]->rows[rows[i]];
            if (r->count > 0) {
                __builtin_prefetch(&tables[i]->fields[r->first]);
                __builtin_prefetch(&tables[i]->fields[r->first + r->count - 1]);
            }
        }
        for (int i = 0; data && i < m; i++) {
            const Row *r = &tables[i]->rows[rows[i]];
            for (Py_ssize_t j = 0; j < r->count; j++) {
                const AsRecordsField *f = &tables[i]->fields[r->first + j];
                if (f->owned == NULL && f->start >= 0 && f->start < f->stop &&
                    f->stop <= lanes[i]->buffer.len) {
                    __builtin_prefetch((const char *)lanes[i]->buffer.buf + f->start);
                }
            }
        }
    }
#else
    (void)d;
    (void)data;
#endif
}

PyDoc_STRVAR(deliver_doc,
"deliver(lanes, indices, samples, sink, /)\n"
"--\n"
"\n"
"Hand each drawn sample to ``sink`` as ``EpochRun.take`` does: draw ``k`` is sample\n"
"``samples[k]`` of lane ``indices[k]``, ``lanes`` holding ``(records, view, url,\n"
"first)``. Returns ``(taken, going, error)``: the samples handed over (the one the sink\n"
"raised on counted), whether the sink asked for more, and what it raised (or None).");

static PyObject *
deliver(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "deliver takes (lanes, indices, samples, sink)");
        return NULL;
    }
    PyObject *sink = args[3];
    Draws draws;
    if (draws_open(&draws, args[0], args[1], args[2]) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    PyObject *capsule = NULL;
    int error = 0;
    const AsRecordsSink *api = c_sink(sink, &capsule, &error);
    if (error) {
        goto done;
    }
    Py_ssize_t taken = 0;
    int going = 1;
    PyObject *raised = NULL;
    prefetch_run(&draws, 0); /* a C sink reads the bytes itself, when it copies them */
    for (Py_ssize_t k = 0; k < draws.n && going > 0; k++) {
        Lane *lane;
        Py_ssize_t row;
        int at = draws_at(&draws, k, &lane, &row);
        if (at == -1) {
            raised = take_error();
            break;
        }
        taken++; /* counted before the sink sees it, as take counts it emitted */
        going = at < 0 ? -1 : hand(lane, row, sink, api);
        if (going < 0) {
            raised = take_error();
        }
    }
    result = Py_BuildValue("(nON)", taken, going > 0 && raised == NULL ? Py_True : Py_False,
                           raised == NULL ? Py_NewRef(Py_None) : raised);
done:
    draws_free(&draws);
    Py_XDECREF(capsule);
    return result;
}

PyDoc_STRVAR(dicts_doc,
"dicts(lanes, indices, samples, views, fallback, /)\n"
"--\n"
"\n"
"The dicts of a run of draws (as ``Emit.run`` builds them), **last first**: draw ``k``\n"
"is sample ``samples[k]`` of lane ``indices[k]``, ``lanes`` holding ``(records, view,\n"
"url, first)``. A lane whose records are not a native table is built by\n"
"``fallback(records, i, view, url, views)``.");

static PyObject *
dicts(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "dicts takes (lanes, indices, samples, views, fallback)");
        return NULL;
    }
    int views = PyObject_IsTrue(args[3]);
    if (views < 0) {
        return NULL;
    }
    PyObject *fallback = args[4];
    Draws draws;
    if (draws_open(&draws, args[0], args[1], args[2]) < 0) {
        return NULL;
    }
    PyObject *out = PyList_New(draws.n);
    if (out == NULL) {
        draws_free(&draws);
        return NULL;
    }
    prefetch_run(&draws, !views);
    for (Py_ssize_t k = 0; k < draws.n; k++) {
        Lane *lane;
        Py_ssize_t row;
        if (draws_at(&draws, k, &lane, &row) < 0) {
            goto failed;
        }
        PyObject *built;
        if (Py_IS_TYPE(lane->records, &RecordsType)) {
            Records *records = (Records *)lane->records;
            row = row_at(records, row);
            if (row < 0) {
                goto failed;
            }
            const Py_buffer *bytes = NULL;
            if (!views && lane_bytes(lane) == 0) {
                bytes = &lane->buffer;
            }
            records->readers++;
            built = sample_dict(records, row, lane->view, bytes, lane->url, views);
            records->readers--;
        }
        else {
            PyObject *i = PyLong_FromSsize_t(row);
            if (i == NULL) {
                goto failed;
            }
            PyObject *call[5] = {lane->records, i, lane->view, lane->url,
                                 views ? Py_True : Py_False};
            built = PyObject_Vectorcall(fallback, call, 5, NULL);
            Py_DECREF(i);
        }
        if (built == NULL) {
            goto failed;
        }
        PyList_SET_ITEM(out, draws.n - 1 - k, built);
    }
    draws_free(&draws);
    return out;
failed:
    draws_free(&draws);
    Py_DECREF(out); /* the slots not yet set are NULL, which list_dealloc skips */
    return NULL;
}

static PyMethodDef table_functions[] = {
    {"deliver", (PyCFunction)(void (*)(void))deliver, METH_FASTCALL, deliver_doc},
    {"dicts", (PyCFunction)(void (*)(void))dicts, METH_FASTCALL, dicts_doc},
    {NULL, NULL, 0, NULL},
};

int
table_module_exec(PyObject *module)
{
    if (KEY_NAME == NULL) {
        KEY_NAME = PyUnicode_InternFromString("__key__");
        URL_NAME = PyUnicode_InternFromString("__url__");
        if (KEY_NAME == NULL || URL_NAME == NULL) {
            return -1;
        }
    }
    if (PyType_Ready(&RecordsType) < 0) {
        return -1;
    }
    Py_INCREF(&RecordsType);
    if (PyModule_AddObject(module, "Records", (PyObject *)&RecordsType) < 0) {
        Py_DECREF(&RecordsType);
        return -1;
    }
    return PyModule_AddFunctions(module, table_functions);
}
