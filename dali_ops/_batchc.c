/* The native batch builder's common path: one sample's record (as the stream's
 * Iteration.take hands it over) checked and added to a batch in one C call.
 *
 * The C twin of dali_ops/_batch.py (BatchBuilder._add_record and _append) and of
 * dali_ops/_checks.py (check_image), which stay in the tree as the reference:
 * tests/test_dali_batch.py builds every batch both ways, and tests/test_native_batch.py
 * fuzzes this sink against the Python one, requiring the same batches, skips and errors.
 *
 * A Sink is what Iteration.take hands each sample to: called as sink(view, url, record),
 * or, where the chunk's records are the walk's table (asyncstream/shards/_records.h),
 * through the C sink protocol: its `__records_sink__` capsule's sink_row reads the row's
 * fields in place (no Python call, no tuple) and does exactly what the call does, the
 * record tuple built only to hand an uncommon sample to `fallback`. The common
 * sample (its image member found by image_keys' rank, a label of fewer than 19 ASCII
 * digits, an image that passes the precheck) is added here: its image copied into the
 * batch (the DataLoader worker's shared buffer at its next offset, or a new bytes object
 * for the feed thread), its label parsed, its key, URL and json member recorded. Anything
 * else (no image or label, a label that is not plain digits, an image the check refuses,
 * a record not spelled as the stream spells it, offsets outside the view, a shared buffer
 * that must grow) is handed, untouched, to the Python sink (`fallback`), which decides it
 * as before, with the same messages. Nothing is added before that decision, so the Python
 * sink sees the batch exactly as it would have.
 *
 * The "header" precheck (Pillow's Image.open) stays in Python: the sink calls `header`
 * (check_image at that level) once the markers pass, on the same object the Python sink
 * checks (the bytes copy for the feed thread, a view of the ring for a worker).
 *
 * The GIL is released for an image's copy when the copy is long enough to pay for the
 * hand-over (RELEASE_AT bytes); a smaller one is copied with the GIL held.
 *
 * Memory safety: a member's offsets are checked against the view's length before a byte
 * is read; the shared buffer's free room is checked before a byte is written.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_records.h" /* asyncstream/shards: the records table's C sink protocol */

#define EOI_WINDOW 64               /* trailing bytes searched for a JPEG's end marker */
#define LABEL_DIGITS_MAX 18         /* fewer than 19 digits: an int64 always holds them */
#define RELEASE_AT ((Py_ssize_t)1 << 16) /* copies this long run with the GIL released */

enum { LEVEL_NONE = 0, LEVEL_MARKERS = 1, LEVEL_HEADER = 2 };

/* What a sample's add came to. */
enum { ADD_ERROR = -1, ADD_FALLBACK = 0, ADD_DONE = 1 };

/* A member's bytes: `owned` (borrowed bytes) if not NULL, else data[0:size] of the view. */
typedef struct {
    const unsigned char *data;
    Py_ssize_t size;
    Py_ssize_t start; /* in the view (owned == NULL) */
    Py_ssize_t stop;
    PyObject *owned;
} Member;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *keys;       /* the batch's lists, appended to */
    PyObject *urls;
    PyObject *labels;
    PyObject *metas;
    PyObject *spans;      /* each image's (start, stop) in placed */
    PyObject *placed;     /* the batch's BatchBuffer */
    Py_buffer out;        /* placed.data's bytes, while has_out (see place) */
    Py_ssize_t used;      /* placed.used, while has_out */
    int has_out;
    PyObject *image_keys; /* tuple of str */
    PyObject *label_key;  /* str */
    PyObject *meta_key;   /* str */
    PyObject *header;     /* check_image(data, "header"), or None */
    PyObject *fallback;   /* the Python sink: fallback(view, url, record) -> bool */
    int level;
} Sink;

static PyTypeObject SinkType;

static PyObject *USED, *DATA, *PUT; /* BatchBuffer's names, interned by module_exec */

/* The signatures DALI's decoders.image reads, after the JPEG's (checked first). */
static const struct {
    const char *bytes;
    Py_ssize_t size;
} SIGNATURES[] = {
    {"\x89PNG\r\n\x1a\n", 8},
    {"II*\x00", 4},
    {"MM\x00*", 4},
    {"BM", 2},
    {"\x00\x00\x00\x0cjP  \r\n\x87\n", 12},
    {"\xff\x4f\xff\x51", 4},
    {"P1", 2},
    {"P2", 2},
    {"P3", 2},
    {"P4", 2},
    {"P5", 2},
    {"P6", 2},
};

/* Whether data[0:size] passes check_image's "markers" level (its problem is None). */
static int
markers_pass(const unsigned char *data, Py_ssize_t size)
{
    if (size == 0) {
        return 0;
    }
    if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) {
        Py_ssize_t from = size > EOI_WINDOW ? size - EOI_WINDOW : 0;
        for (Py_ssize_t i = size - 2; i >= from; i--) {
            if (data[i] == 0xff && data[i + 1] == 0xd9) {
                return 1;
            }
        }
        return 0;
    }
    if (size >= 12 && memcmp(data, "RIFF", 4) == 0 && memcmp(data + 8, "WEBP", 4) == 0) {
        return 1;
    }
    for (size_t i = 0; i < sizeof(SIGNATURES) / sizeof(SIGNATURES[0]); i++) {
        if (size >= SIGNATURES[i].size &&
            memcmp(data, SIGNATURES[i].bytes, (size_t)SIGNATURES[i].size) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Whether two exact str are equal: 1, 0, or -1 with an exception set. */
static int
same_str(PyObject *a, PyObject *b)
{
    if (a == b) {
        return 1;
    }
    if (PyUnicode_GET_LENGTH(a) != PyUnicode_GET_LENGTH(b)) {
        return 0;
    }
    int compared = PyUnicode_Compare(a, b);
    if (compared == -1 && PyErr_Occurred()) {
        return -1;
    }
    return compared == 0;
}

/* A view offset: an exact int in [0, limit]; 0 (no exception) where it is not one. */
static int
offset(PyObject *value, Py_ssize_t limit, Py_ssize_t *out)
{
    if (!PyLong_CheckExact(value)) {
        return 0;
    }
    Py_ssize_t at = PyLong_AsSsize_t(value);
    if (at == -1 && PyErr_Occurred()) {
        PyErr_Clear(); /* too large for the view: the fallback decides */
        return 0;
    }
    if (at < 0 || at > limit) {
        return 0;
    }
    *out = at;
    return 1;
}

/* The field's member, read from the record's field `field`; ADD_FALLBACK where it is not
 * spelled as the stream spells it (ext, start, stop, owned). */
static int
read_field(PyObject *field, const Py_buffer *view, PyObject **ext, Member *member)
{
    if (!PyTuple_CheckExact(field) || PyTuple_GET_SIZE(field) != 4) {
        return ADD_FALLBACK;
    }
    *ext = PyTuple_GET_ITEM(field, 0);
    if (!PyUnicode_CheckExact(*ext)) {
        return ADD_FALLBACK;
    }
    PyObject *owned = PyTuple_GET_ITEM(field, 3);
    if (owned != Py_None) {
        if (!PyBytes_CheckExact(owned)) {
            return ADD_FALLBACK;
        }
        member->owned = owned;
        member->data = (const unsigned char *)PyBytes_AS_STRING(owned);
        member->size = PyBytes_GET_SIZE(owned);
        member->start = member->stop = 0;
        return ADD_DONE;
    }
    Py_ssize_t start, stop;
    if (view->buf == NULL || !offset(PyTuple_GET_ITEM(field, 1), view->len, &start) ||
        !offset(PyTuple_GET_ITEM(field, 2), view->len, &stop) || stop < start) {
        return ADD_FALLBACK;
    }
    member->owned = NULL;
    member->data = (const unsigned char *)view->buf + start;
    member->size = stop - start;
    member->start = start;
    member->stop = stop;
    return ADD_DONE;
}

/* A field of a row of the records table, read as read_field reads a tuple's field. */
static int
row_field(const AsRecordsRow *row, Py_ssize_t i, const Py_buffer *view, PyObject **ext,
          Member *member)
{
    const AsRecordsField *field = &row->fields[i];
    if (field->ext < 0 || field->ext >= row->nexts) {
        return ADD_FALLBACK;
    }
    *ext = row->exts[field->ext];
    if (!PyUnicode_CheckExact(*ext)) {
        return ADD_FALLBACK;
    }
    if (field->owned != NULL) {
        if (!PyBytes_CheckExact(field->owned)) {
            return ADD_FALLBACK;
        }
        member->owned = field->owned;
        member->data = (const unsigned char *)PyBytes_AS_STRING(field->owned);
        member->size = PyBytes_GET_SIZE(field->owned);
        member->start = member->stop = 0;
        return ADD_DONE;
    }
    Py_ssize_t start = field->start;
    Py_ssize_t stop = field->stop;
    if (view->buf == NULL || start < 0 || start > view->len || stop < 0 || stop > view->len ||
        stop < start) {
        return ADD_FALLBACK;
    }
    member->owned = NULL;
    member->data = (const unsigned char *)view->buf + start;
    member->size = stop - start;
    member->start = start;
    member->stop = stop;
    return ADD_DONE;
}

/* A sample's record as add reads it: a tuple (the sink called from Python), or a row of
 * the records table (the C sink protocol). */
typedef struct {
    PyObject *tuple;          /* (key, offset, *fields), or NULL */
    const AsRecordsRow *row;  /* where tuple is NULL */
} Record;

static Py_ssize_t
record_fields(const Record *record)
{
    return record->tuple != NULL ? PyTuple_GET_SIZE(record->tuple) - 2 : record->row->nfields;
}

static int
record_field(const Record *record, Py_ssize_t i, const Py_buffer *view, PyObject **ext,
             Member *member)
{
    if (record->tuple != NULL) {
        return read_field(PyTuple_GET_ITEM(record->tuple, 2 + i), view, ext, member);
    }
    return row_field(record->row, i, view, ext, member);
}

/* The image's rank among image_keys (the last key equal to ext wins, as the Python
 * builder's dict does), or `none` where it is none of them; -1 on an error. */
static Py_ssize_t
image_rank(Sink *self, PyObject *ext, Py_ssize_t none)
{
    Py_ssize_t rank = none;
    Py_ssize_t count = PyTuple_GET_SIZE(self->image_keys);
    for (Py_ssize_t i = 0; i < count; i++) {
        int same = same_str(ext, PyTuple_GET_ITEM(self->image_keys, i));
        if (same < 0) {
            return -1;
        }
        if (same) {
            rank = i;
        }
    }
    return rank;
}

/* A member as a Python object: its owned bytes (a new reference), or a view of it. */
static PyObject *
member_view(PyObject *view, const Member *member)
{
    if (member->owned != NULL) {
        Py_INCREF(member->owned);
        return member->owned;
    }
    PyObject *start = PyLong_FromSsize_t(member->start);
    PyObject *stop = start == NULL ? NULL : PyLong_FromSsize_t(member->stop);
    PyObject *slice = stop == NULL ? NULL : PySlice_New(start, stop, NULL);
    Py_XDECREF(start);
    Py_XDECREF(stop);
    if (slice == NULL) {
        return NULL;
    }
    PyObject *out = PyObject_GetItem(view, slice);
    Py_DECREF(slice);
    return out;
}

/* The header check of `image`: ADD_DONE where it passes, ADD_FALLBACK where it does not
 * (the fallback says why), ADD_ERROR on an exception. */
static int
header_passes(Sink *self, PyObject *image)
{
    PyObject *problem = PyObject_CallOneArg(self->header, image);
    if (problem == NULL) {
        return ADD_ERROR;
    }
    int passes = problem == Py_None;
    Py_DECREF(problem);
    return passes ? ADD_DONE : ADD_FALLBACK;
}

static void
copy_bytes(unsigned char *to, const unsigned char *from, Py_ssize_t size)
{
    if (size >= RELEASE_AT) {
        Py_BEGIN_ALLOW_THREADS
        memcpy(to, from, (size_t)size);
        Py_END_ALLOW_THREADS
    }
    else if (size > 0) {
        memcpy(to, from, (size_t)size);
    }
}

static int
append_new(PyObject *list, PyObject *item)
{
    if (item == NULL) {
        return -1;
    }
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

/* Let go of the cached view of the batch buffer's bytes (before Python code that may grow
 * or replace the buffer runs, and when the sink goes). */
static void
forget_buffer(Sink *self)
{
    if (self->has_out) {
        PyBuffer_Release(&self->out);
        self->has_out = 0;
    }
}

/* Append start and stop to the flat spans list and make stop the buffer's `used`. */
static int
add_span(Sink *self, Py_ssize_t start, PyObject *stop)
{
    PyObject *first = PyLong_FromSsize_t(start);
    if (first == NULL) {
        return -1;
    }
    int failed = append_new(self->spans, first) < 0 || PyList_Append(self->spans, stop) < 0 ||
                 PyObject_SetAttr(self->placed, USED, stop) < 0;
    return failed ? -1 : 0;
}

/* BatchBuffer.put(image), which takes or grows a buffer: where the cached one has no room.
 * Its (start, stop) goes on the flat spans list. */
static int
put(Sink *self, PyObject *view, const Member *image)
{
    forget_buffer(self);
    PyObject *seen = member_view(view, image);
    if (seen == NULL) {
        return -1;
    }
    PyObject *span = PyObject_CallMethodOneArg(self->placed, PUT, seen);
    Py_DECREF(seen);
    if (span == NULL) {
        return -1;
    }
    int failed = !PyTuple_CheckExact(span) || PyTuple_GET_SIZE(span) != 2;
    if (failed) {
        PyErr_SetString(PyExc_TypeError, "BatchBuffer.put must return (start, stop)");
    }
    failed = failed || PyList_Append(self->spans, PyTuple_GET_ITEM(span, 0)) < 0 ||
             PyList_Append(self->spans, PyTuple_GET_ITEM(span, 1)) < 0;
    Py_DECREF(span);
    return failed ? -1 : 0;
}

/* Copy an image into the batch's buffer: straight into the cached view of its bytes where
 * it has room (the buffer's `used` read once per view), else by BatchBuffer.put. */
static int
place(Sink *self, PyObject *view, const Member *image)
{
    if (!self->has_out) {
        PyObject *data = PyObject_GetAttr(self->placed, DATA);
        if (data == NULL) {
            return -1;
        }
        if (data == Py_None) {
            Py_DECREF(data);
            return put(self, view, image);
        }
        int got = PyObject_GetBuffer(data, &self->out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS);
        Py_DECREF(data);
        if (got < 0) {
            return -1;
        }
        self->has_out = 1;
        PyObject *used_obj = PyObject_GetAttr(self->placed, USED);
        if (used_obj == NULL) {
            return -1;
        }
        self->used = PyLong_AsSsize_t(used_obj);
        Py_DECREF(used_obj);
        if (self->used == -1 && PyErr_Occurred()) {
            return -1;
        }
    }
    Py_ssize_t used = self->used;
    if (used < 0 || used > self->out.len || image->size > self->out.len - used) {
        return put(self, view, image);
    }
    copy_bytes((unsigned char *)self->out.buf + used, image->data, image->size);
    PyObject *stop = PyLong_FromSsize_t(used + image->size);
    if (stop == NULL) {
        return -1;
    }
    int failed = add_span(self, used, stop);
    Py_DECREF(stop);
    if (!failed) {
        self->used = used + image->size;
    }
    return failed;
}

/* Add the sample in one go where it is a common one (ADD_DONE); ADD_FALLBACK, with the
 * batch untouched, where the Python sink must decide it. */
static int
add(Sink *self, PyObject *view, PyObject *url, const Record *record, const Py_buffer *buffer)
{
    Py_ssize_t none = PyTuple_GET_SIZE(self->image_keys);
    Py_ssize_t rank = none;
    Member image = {0}, label = {0}, meta = {0};
    int has_label = 0, has_meta = 0;
    Py_ssize_t count = record_fields(record);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *ext = NULL;
        Member member;
        if (record_field(record, i, buffer, &ext, &member) != ADD_DONE) {
            return ADD_FALLBACK;
        }
        int same = same_str(ext, self->label_key);
        if (same < 0) {
            return ADD_ERROR;
        }
        if (same) {
            label = member;
            has_label = 1;
        }
        else {
            same = same_str(ext, self->meta_key);
            if (same < 0) {
                return ADD_ERROR;
            }
            if (same) {
                meta = member;
                has_meta = 1;
            }
        }
        Py_ssize_t at = image_rank(self, ext, rank);
        if (at < 0) {
            return ADD_ERROR;
        }
        if (at < rank) {
            rank = at;
            image = member;
        }
    }
    if (rank == none || !has_label || label.size == 0 || label.size > LABEL_DIGITS_MAX) {
        return ADD_FALLBACK;
    }
    long long value = 0;
    for (Py_ssize_t i = 0; i < label.size; i++) {
        unsigned char c = label.data[i];
        if (c < '0' || c > '9') {
            return ADD_FALLBACK;
        }
        value = value * 10 + (c - '0');
    }
    if (self->level != LEVEL_NONE && !markers_pass(image.data, image.size)) {
        return ADD_FALLBACK;
    }

    /* checked at the header level on the view the Python sink checks */
    if (self->level == LEVEL_HEADER) {
        PyObject *seen = member_view(view, &image);
        if (seen == NULL) {
            return ADD_ERROR;
        }
        int passes = header_passes(self, seen);
        Py_DECREF(seen);
        if (passes != ADD_DONE) {
            return passes;
        }
    }

    PyObject *meta_obj = Py_None;
    Py_INCREF(meta_obj);
    if (has_meta) {
        Py_DECREF(meta_obj);
        meta_obj = meta.owned != NULL
                       ? Py_NewRef(meta.owned)
                       : PyBytes_FromStringAndSize((const char *)meta.data, meta.size);
        if (meta_obj == NULL) {
            return ADD_ERROR;
        }
    }
    /* in _append's order: key, URL, image, label, json member */
    PyObject *key = record->tuple != NULL ? PyTuple_GET_ITEM(record->tuple, 0) : record->row->key;
    int failed = PyList_Append(self->keys, key) < 0 ||
                 PyList_Append(self->urls, url) < 0;
    failed = failed || place(self, view, &image) < 0;
    failed = failed || append_new(self->labels, PyLong_FromLongLong(value)) < 0 ||
             PyList_Append(self->metas, meta_obj) < 0;
    Py_DECREF(meta_obj);
    return failed ? ADD_ERROR : ADD_DONE;
}

static PyObject *
sink_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Sink *self = (Sink *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 3 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "a Sink takes (view, url, record)");
        return NULL;
    }
    Py_buffer buffer = {0};
    int viewed = PyObject_GetBuffer(args[0], &buffer, PyBUF_SIMPLE) == 0;
    if (!viewed) {
        PyErr_Clear(); /* not a buffer: only owned members are read here */
        buffer.buf = NULL;
        buffer.len = 0;
    }
    int done = ADD_FALLBACK;
    if (PyTuple_CheckExact(args[2]) && PyTuple_GET_SIZE(args[2]) >= 2) {
        Record record = {.tuple = args[2], .row = NULL};
        done = add(self, args[0], args[1], &record, &buffer);
    }
    if (viewed) {
        PyBuffer_Release(&buffer);
    }
    if (done == ADD_ERROR) {
        return NULL;
    }
    if (done == ADD_FALLBACK) {
        forget_buffer(self); /* the Python sink may put into the buffer, or grow it */
        return PyObject_Vectorcall(self->fallback, args, 3, NULL);
    }
    Py_RETURN_TRUE;
}

/* The C sink protocol's entry (see _records.h): exactly what the call does for the record
 * of `row`, the record built as a tuple only for the fallback. */
static int
sink_row(PyObject *op, PyObject *view, const Py_buffer *buffer, PyObject *url,
         const AsRecordsRow *row)
{
    Sink *self = (Sink *)op;
    if (!PyObject_TypeCheck(op, &SinkType) || self->vectorcall == NULL) {
        PyErr_SetString(PyExc_TypeError, "a Sink must be initialized before it is called");
        return -1;
    }
    Record record = {.tuple = NULL, .row = row};
    int done = add(self, view, url, &record, buffer);
    if (done == ADD_ERROR) {
        return -1;
    }
    if (done == ADD_DONE) {
        return 1;
    }
    PyObject *tuple = as_records_row_tuple(row);
    if (tuple == NULL) {
        return -1;
    }
    PyObject *args[3] = {view, url, tuple};
    forget_buffer(self); /* the Python sink may put into the buffer, or grow it */
    PyObject *going = PyObject_Vectorcall(self->fallback, args, 3, NULL);
    Py_DECREF(tuple);
    if (going == NULL) {
        return -1;
    }
    int on = PyObject_IsTrue(going);
    Py_DECREF(going);
    return on;
}

static AsRecordsSink SINK_API = {.row = sink_row};

static PyObject *
sink_records_sink(PyObject *op, void *closure)
{
    (void)op;
    (void)closure;
    return PyCapsule_New(&SINK_API, AS_RECORDS_SINK_CAPSULE, NULL);
}

static PyGetSetDef sink_getset[] = {
    {"__records_sink__", sink_records_sink, NULL,
     "The C sink protocol's capsule (asyncstream/shards/_records.h).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static int
sink_init(PyObject *op, PyObject *args, PyObject *kwargs)
{
    Sink *self = (Sink *)op;
    static char *names[] = {
        "keys", "urls", "labels", "metas", "spans", "placed",
        "image_keys", "label_key", "meta_key", "level", "header", "fallback", NULL,
    };
    PyObject *keys, *urls, *labels, *metas, *spans, *placed;
    PyObject *image_keys, *label_key, *meta_key, *header, *fallback;
    int level;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!O!O!OO!UUiOO:Sink", names,
                                     &PyList_Type, &keys, &PyList_Type, &urls, &PyList_Type,
                                     &labels, &PyList_Type, &metas,
                                     &PyList_Type, &spans, &placed,
                                     &PyTuple_Type, &image_keys, &label_key, &meta_key,
                                     &level, &header, &fallback)) {
        return -1;
    }
    if (placed == Py_None) {
        PyErr_SetString(PyExc_TypeError, "placed must be the batch's BatchBuffer");
        return -1;
    }
    if (!PyUnicode_CheckExact(label_key) || !PyUnicode_CheckExact(meta_key)) {
        PyErr_SetString(PyExc_TypeError, "label_key and meta_key must be str");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(image_keys); i++) {
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(image_keys, i))) {
            PyErr_SetString(PyExc_TypeError, "image_keys must be a tuple of str");
            return -1;
        }
    }
    if (level < LEVEL_NONE || level > LEVEL_HEADER) {
        PyErr_SetString(PyExc_ValueError, "level must be 0 (none), 1 (markers) or 2 (header)");
        return -1;
    }
    if (!PyCallable_Check(fallback) || (level == LEVEL_HEADER && !PyCallable_Check(header))) {
        PyErr_SetString(PyExc_TypeError, "fallback and header must be callable");
        return -1;
    }
    forget_buffer(self);
    Py_XSETREF(self->keys, Py_NewRef(keys));
    Py_XSETREF(self->urls, Py_NewRef(urls));
    Py_XSETREF(self->labels, Py_NewRef(labels));
    Py_XSETREF(self->metas, Py_NewRef(metas));
    Py_XSETREF(self->spans, Py_NewRef(spans));
    Py_XSETREF(self->placed, Py_NewRef(placed));
    Py_XSETREF(self->image_keys, Py_NewRef(image_keys));
    Py_XSETREF(self->label_key, Py_NewRef(label_key));
    Py_XSETREF(self->meta_key, Py_NewRef(meta_key));
    Py_XSETREF(self->header, Py_NewRef(header));
    Py_XSETREF(self->fallback, Py_NewRef(fallback));
    self->level = level;
    self->vectorcall = sink_vectorcall;
    return 0;
}

static int
sink_traverse(PyObject *op, visitproc visit, void *arg)
{
    Sink *self = (Sink *)op;
    Py_VISIT(self->keys);
    Py_VISIT(self->urls);
    Py_VISIT(self->labels);
    Py_VISIT(self->metas);
    Py_VISIT(self->spans);
    Py_VISIT(self->placed);
    Py_VISIT(self->image_keys);
    Py_VISIT(self->label_key);
    Py_VISIT(self->meta_key);
    Py_VISIT(self->header);
    Py_VISIT(self->fallback);
    return 0;
}

static int
sink_clear(PyObject *op)
{
    Sink *self = (Sink *)op;
    forget_buffer(self);
    Py_CLEAR(self->keys);
    Py_CLEAR(self->urls);
    Py_CLEAR(self->labels);
    Py_CLEAR(self->metas);
    Py_CLEAR(self->spans);
    Py_CLEAR(self->placed);
    Py_CLEAR(self->image_keys);
    Py_CLEAR(self->label_key);
    Py_CLEAR(self->meta_key);
    Py_CLEAR(self->header);
    Py_CLEAR(self->fallback);
    return 0;
}

static void
sink_dealloc(PyObject *op)
{
    PyObject_GC_UnTrack(op);
    sink_clear(op);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *
sink_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    (void)args;
    (void)kwargs;
    Sink *self = (Sink *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->vectorcall = NULL; /* set by __init__: a Sink never initialized refuses calls */
    }
    return (PyObject *)self;
}

static PyObject *
sink_call(PyObject *op, PyObject *args, PyObject *kwargs)
{
    Sink *self = (Sink *)op;
    if (self->vectorcall == NULL) {
        PyErr_SetString(PyExc_TypeError, "a Sink must be initialized before it is called");
        return NULL;
    }
    return PyVectorcall_Call(op, args, kwargs);
}

PyDoc_STRVAR(sink_doc,
             "Sink(keys, urls, labels, metas, spans, placed, image_keys,\n"
             "     label_key, meta_key, level, header, fallback)\n"
             "--\n\n"
             "Iteration.take's sink for one batch: sink(view, url, record) adds a common\n"
             "sample to the batch's lists, and hands any other to fallback(view, url, record).");

static PyTypeObject SinkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dali_ops._batchc.Sink",
    .tp_basicsize = sizeof(Sink),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = sink_doc,
    .tp_new = sink_new,
    .tp_init = sink_init,
    .tp_dealloc = sink_dealloc,
    .tp_traverse = sink_traverse,
    .tp_clear = sink_clear,
    .tp_call = sink_call,
    .tp_getset = sink_getset,
    .tp_vectorcall_offset = offsetof(Sink, vectorcall),
};

PyDoc_STRVAR(markers_doc,
             "markers(data, /)\n--\n\n"
             "Whether bytes-like data passes check_image's \"markers\" level.");

static PyObject *
markers(PyObject *module, PyObject *data)
{
    (void)module;
    Py_buffer buffer;
    if (PyObject_GetBuffer(data, &buffer, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    int passes = markers_pass((const unsigned char *)buffer.buf, buffer.len);
    PyBuffer_Release(&buffer);
    return PyBool_FromLong(passes);
}

PyDoc_STRVAR(pad_doc,
             "pad(data, spans, out, /)\n--\n\n"
             "Copy image i, data[spans[i, 0]:spans[i, 1]], to the start of row i of out (n rows\n"
             "of len(out) // n bytes, n = len(spans) // 2, spans int64) and zero the rest of\n"
             "the row, with the GIL released; True. False, with nothing written, unless every\n"
             "image is a JPEG whose end marker lies in its last 64 bytes (a decoder stops\n"
             "there, so it never reads the zeros; a truncated image must fail as it is).\n"
             "Raises ValueError where a span falls outside data or is longer than a row.");

/* Whether data[0:size] is a JPEG that ends (its end marker in the last EOI_WINDOW bytes). */
static int
jpeg_ends(const unsigned char *data, Py_ssize_t size)
{
    return size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff &&
           markers_pass(data, size);
}

static PyObject *
pad(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "pad takes (data, spans, out)");
        return NULL;
    }
    Py_buffer data, spans, out;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &spans, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&spans);
        PyBuffer_Release(&data);
        return NULL;
    }
    const char *problem = NULL;
    Py_ssize_t n = spans.len / (Py_ssize_t)(2 * sizeof(int64_t));
    Py_ssize_t row = n > 0 ? out.len / n : 0;
    if (spans.len % (Py_ssize_t)(2 * sizeof(int64_t)) != 0) {
        problem = "spans must be int64 (start, stop) pairs";
    }
    else if (n > 0 && out.len % n != 0) {
        problem = "out must hold a whole number of rows, one per span";
    }
    const unsigned char *from = (const unsigned char *)data.buf;
    unsigned char *to = (unsigned char *)out.buf;
    int eligible = 1;
    for (Py_ssize_t i = 0; problem == NULL && i < n; i++) {
        int64_t pair[2];
        memcpy(pair, (const char *)spans.buf + i * (Py_ssize_t)sizeof(pair), sizeof(pair));
        if (pair[0] < 0 || pair[0] > pair[1] || pair[1] > (int64_t)data.len) {
            problem = "a span falls outside the data";
        }
        else if (pair[1] - pair[0] > (int64_t)row) {
            problem = "a span is longer than a row";
        }
        else if (!jpeg_ends(from + pair[0], (Py_ssize_t)(pair[1] - pair[0]))) {
            eligible = 0;
        }
    }
    if (problem == NULL && eligible) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t pair[2];
            memcpy(pair, (const char *)spans.buf + i * (Py_ssize_t)sizeof(pair), sizeof(pair));
            Py_ssize_t size = (Py_ssize_t)(pair[1] - pair[0]);
            if (size > 0) {
                memcpy(to + i * row, from + pair[0], (size_t)size);
            }
            memset(to + i * row + size, 0, (size_t)(row - size));
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&spans);
    PyBuffer_Release(&data);
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    return PyBool_FromLong(eligible);
}

static PyMethodDef methods[] = {
    {"markers", markers, METH_O, markers_doc},
    {"pad", (PyCFunction)(void (*)(void))pad, METH_FASTCALL, pad_doc},
    {NULL, NULL, 0, NULL},
};

static int
module_exec(PyObject *module)
{
    if (USED == NULL) {
        USED = PyUnicode_InternFromString("used");
        DATA = PyUnicode_InternFromString("data");
        PUT = PyUnicode_InternFromString("put");
        if (USED == NULL || DATA == NULL || PUT == NULL) {
            return -1;
        }
    }
    if (PyType_Ready(&SinkType) < 0) {
        return -1;
    }
    Py_INCREF(&SinkType);
    if (PyModule_AddObject(module, "Sink", (PyObject *)&SinkType) < 0) {
        Py_DECREF(&SinkType);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, (void *)module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "dali_ops._batchc",
    .m_doc = "The native batch builder: a sample's record checked and added in one call.",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__batchc(void); /* the one symbol exported */

PyMODINIT_FUNC
PyInit__batchc(void)
{
    return PyModuleDef_Init(&module_def);
}
