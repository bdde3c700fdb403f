/* The native tar walk: runs of plain members of a range, found, checked, named and
 * grouped into samples in one call, on the range's bytes in place.
 *
 * The C twin of asyncstream/shards/_tarfast.py (RangeWalker.walk), which stays in the tree
 * as its reference: tests/test_tarfast.py and tests/test_native_tar.py read every input
 * both ways and require the same samples, offsets, bytes and errors.
 *
 * A header is *plain* when the general parser (_tarentry.py) would read it as this walk
 * does: type '0', '\0' or '7'; a size of 11 octal digits then NUL or space; the checksum
 * spelled "%06o\0 " and equal to the unsigned byte sum (the field counted as 8 spaces);
 * its data inside the range and the shard. A ustar name prefix is joined as tarfile joins
 * it. The walk stops *before* the first header it cannot vouch for, or whose name it
 * does not split exactly as webdataset does (no leading '_', no newline, a dot after the
 * last slash with a byte between them, an extension not starting with '_' once lower-
 * cased), or that repeats a field of its sample; the general parser reads that header,
 * with its own errors.
 *
 * Two phases per batch of headers: the headers are found and checked with the GIL
 * released (the loop over bytes: 512 per header), then named and grouped into samples
 * with the GIL held, each added to a Records table (_records.c): a key str per sample, no
 * Python object per field. Batches double in size, so a walk that stops early (a name
 * the general parser must read) costs a bounded amount of wasted scanning.
 *
 * Memory safety: every read is bounded by `limit`, which is checked against the buffer's
 * length before anything is read; sizes are read once into locals.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "_table.h"
#include "_member.h"

#define BLOCK 512
#define AHEAD 2048 /* bytes asked for ahead of the next header (prefetch_ahead) */
#define NAME_FIELD 100
#define PREFIX_AT 345
#define PREFIX_FIELD 155
#define JOINED_MAX (PREFIX_FIELD + 1 + NAME_FIELD)
#define FIRST_BATCH 64
#define EXT_CACHE 8
#define EXT_CACHED_MAX 24

typedef struct {
    Py_ssize_t entry; /* where its entry begins: its header, or a PAX header before it */
    Py_ssize_t head;  /* its own header, relative to the range */
    Py_ssize_t size;  /* its data's size */
} Member;

/* Why a scan ended: a header not plain by type or limits (the general parser reads it,
 * the walk may go on after it), a header the check refused (the rest of the range is left
 * to the general parser), the batch is full, or a plain header whose data the range's end
 * cuts (inside the shard: the walk names it, and the reader gathers its bytes). */
enum { ENDED_PLAIN, ENDED_REFUSED, ENDED_BATCH, ENDED_CUT };

static int
octal_digit(unsigned char c)
{
    return c >= '0' && c <= '7';
}

/* Whether the size field of the header at h is 11 octal digits then NUL or space. */
static int
size_spelled(const unsigned char *h)
{
    for (int i = 124; i < 135; i++) {
        if (!octal_digit(h[i])) {
            return 0;
        }
    }
    return h[135] == 0 || h[135] == ' ';
}

/* The size field of the header at h, where size_spelled(h). */
static Py_ssize_t
size_of(const unsigned char *h)
{
    Py_ssize_t size = 0;
    for (int i = 124; i < 135; i++) {
        size = (size << 3) | (h[i] - '0');
    }
    return size;
}

/* Whether the checksum of the header at h is "%06o\0 " of its unsigned byte sum, the
 * field counted as 8 spaces (at most 512 * 255: six octal digits always hold it). */
/* The unsigned sum of a block's bytes (at most 512 * 255). With SSE2 (every x86-64), 16
 * bytes a step by PSADBW, a third of the time the compiler's own loop takes. */
static unsigned
block_sum(const unsigned char *h)
{
#if defined(__SSE2__)
    const __m128i zero = _mm_setzero_si128();
    __m128i acc = _mm_setzero_si128();
    for (int i = 0; i < BLOCK; i += 16) {
        __m128i bytes = _mm_loadu_si128((const __m128i *)(const void *)(h + i));
        acc = _mm_add_epi64(acc, _mm_sad_epu8(bytes, zero));
    }
    return (unsigned)_mm_cvtsi128_si32(acc) +
           (unsigned)_mm_cvtsi128_si32(_mm_unpackhi_epi64(acc, acc));
#else
    unsigned total = 0;
    for (int i = 0; i < BLOCK; i++) {
        total += h[i];
    }
    return total;
#endif
}

static int
summed(const unsigned char *h)
{
    unsigned total = block_sum(h);
    unsigned field = 0;
    for (int i = 148; i < 156; i++) {
        field += h[i];
    }
    unsigned value = total - field + 8 * ' ';
    if (h[154] != 0 || h[155] != ' ') {
        return 0;
    }
    for (int i = 153; i >= 148; i--) {
        if (h[i] != (unsigned char)('0' + (value & 7))) {
            return 0;
        }
        value >>= 3;
    }
    return value == 0;
}

/* PAX records whose keywords name nothing a sample holds (the general parser reads them and
 * changes nothing: _tarheaders.chain_effects): what tarfile, and so webdataset's
 * TarWriter, writes for a fractional mtime, and GNU tar's posix format for its times. */
static const char *const NOOP_KEYWORDS[] = {"mtime", "atime", "ctime", "uid",
                                            "gid",   "uname", "gname"};

static int
noop_keyword(const unsigned char *k, Py_ssize_t len)
{
    for (size_t i = 0; i < sizeof(NOOP_KEYWORDS) / sizeof(NOOP_KEYWORDS[0]); i++) {
        const char *name = NOOP_KEYWORDS[i];
        if ((Py_ssize_t)strlen(name) == len && memcmp(k, name, (size_t)len) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Whether the PAX payload p[0:n] is records as _tarheaders.pax_records reads them
 * ("%d %s=%s\n", up to a NUL where a record would begin), each of a no-op keyword. */
static int
pax_noop(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n && p[i] != 0) {
        Py_ssize_t end = n - i > 21 ? i + 21 : n; /* the space within 21 bytes */
        Py_ssize_t space = i;
        while (space < end && p[space] != ' ') {
            space++;
        }
        if (space == end || space == i) {
            return 0;
        }
        Py_ssize_t length = 0;
        for (Py_ssize_t j = i; j < space; j++) {
            if (p[j] < '0' || p[j] > '9' || length > n) {
                return 0;
            }
            length = length * 10 + (p[j] - '0');
        }
        if (length > n - i) {
            return 0;
        }
        Py_ssize_t stop = i + length;
        Py_ssize_t equal = space + 1;
        while (equal < stop && p[equal] != '=') {
            equal++;
        }
        if (equal >= stop || equal == space + 1 || p[stop - 1] != '\n') {
            return 0;
        }
        if (!noop_keyword(p + space + 1, equal - space - 1)) {
            return 0;
        }
        i = stop;
    }
    return 1;
}

/* The header of the member after the PAX header at `at` (inside the range), where that
 * PAX header is plain (size and checksum spelled as a plain header's), holds one block
 * of records at most, all of no-op keywords, and the member's header is in the range:
 * the member is then read as if the PAX header were not there, but that its entry, and
 * so its sample, begins at `at`. Else -1: the general parser reads the entry. */
static Py_ssize_t
pax_member(const unsigned char *data, Py_ssize_t at, Py_ssize_t limit)
{
    const unsigned char *h = data + at;
    if (!size_spelled(h) || !summed(h)) {
        return -1;
    }
    Py_ssize_t size = size_of(h);
    if (size > BLOCK) {
        return -1;
    }
    Py_ssize_t head = at + BLOCK + ((size + BLOCK - 1) & ~(Py_ssize_t)(BLOCK - 1));
    if (head > limit - BLOCK || !pax_noop(h + BLOCK, size)) {
        return -1;
    }
    return head;
}

/* Ask for the header at `at` (when inside the range) to be brought into the cache: the
 * walk is bound by memory, a header per member read from DRAM. No read happens here. */
static void
prefetch_header(const unsigned char *data, Py_ssize_t at, Py_ssize_t limit)
{
#if defined(__GNUC__) || defined(__clang__)
    if (at >= 0 && at <= limit - BLOCK) {
        for (int line = 0; line < BLOCK; line += 64) {
            __builtin_prefetch(data + at + line);
        }
    }
#else
    (void)data;
    (void)at;
    (void)limit;
#endif
}

/* Ask for the blocks of the AHEAD bytes after `at` not yet asked for (those from `asked`
 * on; `at` is a header's place, so every block boundary after it may be one) to be
 * brought into the cache, the two lines of each that hold a header's size and type: where
 * members are small, the headers after the next one lie there, and their reads then
 * overlap instead of waiting one after the other (a header's place is known only once the
 * one before it is read). Where members are large, a few lines of data are asked for in
 * vain per member. Returns the new `asked`. */
static Py_ssize_t
prefetch_ahead(const unsigned char *data, Py_ssize_t at, Py_ssize_t asked, Py_ssize_t limit)
{
#if defined(__GNUC__) || defined(__clang__)
    Py_ssize_t from = asked > at ? asked : at;
    Py_ssize_t to = at + AHEAD;
    if (to > limit - BLOCK) {
        to = limit - BLOCK;
    }
    for (Py_ssize_t p = from; p < to; p += BLOCK) {
        /* the lines of a header's size and type fields: enough to find the next one */
        __builtin_prefetch(data + p + 64);
        __builtin_prefetch(data + p + 128);
    }
    return to > from ? to : from;
#else
    (void)data;
    (void)at;
    (void)limit;
    return asked;
#endif
}

/* Up to `most` plain headers from *rel on, into out; *rel ends at the first entry not
 * taken. Ended by ENDED_CUT, `cut` is the member whose entry begins at *rel, whose header
 * is plain and whose data runs past `limit` but not past `stop`. Runs without the GIL. */
static int
scan(const unsigned char *data, Py_ssize_t *rel, Py_ssize_t limit, Py_ssize_t stop,
     Member *out, Py_ssize_t most, Py_ssize_t *count, Member *cut)
{
    Py_ssize_t at = *rel;
    Py_ssize_t n = 0;
    Py_ssize_t asked = at; /* the blocks before it were asked for (prefetch_ahead) */
    int ended = ENDED_BATCH;
    while (n < most) {
        if (at > limit - BLOCK) {
            ended = ENDED_PLAIN;
            break;
        }
        const unsigned char *h = data + at;
        unsigned char flag = h[156];
        Py_ssize_t head = at; /* the member's own header */
        if (flag == 'x') {
            head = pax_member(data, at, limit);
            if (head < 0) {
                ended = ENDED_PLAIN;
                break;
            }
            h = data + head;
            flag = h[156];
        }
        if (flag != '0' && flag != 0 && flag != '7') {
            ended = ENDED_PLAIN;
            break;
        }
        if (!size_spelled(h)) { /* the end of the archive, or the general parser's */
            ended = ENDED_PLAIN;
            break;
        }
        Py_ssize_t size = size_of(h);
        Py_ssize_t start = head + BLOCK;
        Py_ssize_t after = start + ((size + BLOCK - 1) & ~(Py_ssize_t)(BLOCK - 1));
        prefetch_header(data, after, limit); /* read while this one's sum is taken */
        asked = prefetch_ahead(data, after, asked, limit);
        if (!summed(h)) {
            ended = ENDED_REFUSED;
            break;
        }
        if (size > limit - start || after > stop) {
            ended = after > stop ? ENDED_PLAIN : ENDED_CUT;
            cut->entry = at;
            cut->head = head;
            cut->size = size;
            break;
        }
        out[n].entry = at;
        out[n].head = head;
        out[n].size = size;
        n++;
        at = after;
    }
    *rel = at;
    *count = n;
    return ended;
}

/* An extension's field name, remembered for the walk: the bytes decoded as tarfile
 * decodes names and lower-cased, or Py_None where the general parser names it. */
typedef struct {
    unsigned char raw[EXT_CACHED_MAX];
    Py_ssize_t len;
    PyObject *name;
} Ext;

typedef struct {
    Ext entries[EXT_CACHE];
    int used;
} Exts;

static void
exts_clear(Exts *exts)
{
    for (int i = 0; i < exts->used; i++) {
        Py_CLEAR(exts->entries[i].name);
    }
    exts->used = 0;
}

/* A new reference to the field name of `raw` (Py_None: not this walk's to name), or NULL
 * with an exception set. */
static PyObject *
ext_name(Exts *exts, const unsigned char *raw, Py_ssize_t len)
{
    int ascii = 1;
    int upper = 0;
    if (len <= EXT_CACHED_MAX) {
        for (int i = 0; i < exts->used; i++) {
            Ext *e = &exts->entries[i];
            if (e->len == len && memcmp(e->raw, raw, (size_t)len) == 0) {
                return Py_NewRef(e->name);
            }
        }
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        ascii &= raw[i] < 0x80;
        upper |= raw[i] >= 'A' && raw[i] <= 'Z';
    }
    PyObject *name = PyUnicode_DecodeUTF8((const char *)raw, len, "surrogateescape");
    if (name == NULL) {
        return NULL;
    }
    if (!ascii || upper) {
        PyObject *lower = PyObject_CallMethod(name, "lower", NULL);
        Py_DECREF(name);
        if (lower == NULL) {
            return NULL;
        }
        name = lower;
    }
    if (PyUnicode_GET_LENGTH(name) > 0 && PyUnicode_READ_CHAR(name, 0) == '_') {
        Py_SETREF(name, Py_NewRef(Py_None));
    }
    if (len <= EXT_CACHED_MAX && exts->used < EXT_CACHE) {
        Ext *e = &exts->entries[exts->used++];
        memcpy(e->raw, raw, (size_t)len);
        e->len = len;
        e->name = Py_NewRef(name);
    }
    return name;
}

/* The sample in progress: its key (as bytes and as str), first header, fields so far. */
typedef struct {
    PyObject *key;         /* str; NULL when there is no sample in progress */
    PyObject *key_bytes;   /* the pending key's bytes, when the key came with `pending` */
    const char *current;   /* the key's bytes: key_bytes' or `buf`'s */
    Py_ssize_t current_len;
    char buf[JOINED_MAX];
    Py_ssize_t offset;
    TableField *fields;    /* nfields of them, holding references to ext and owned */
    Py_ssize_t nfields;
    Py_ssize_t fields_cap;
    int owned;             /* whether the fields are copies (a sample carried in) */
} Sample;

static void
fields_clear(Sample *s)
{
    for (Py_ssize_t i = 0; i < s->nfields; i++) {
        Py_DECREF(s->fields[i].ext);
        Py_XDECREF(s->fields[i].owned);
    }
    s->nfields = 0;
}

static void
sample_clear(Sample *s)
{
    Py_CLEAR(s->key);
    Py_CLEAR(s->key_bytes);
    fields_clear(s);
    PyMem_Free(s->fields);
    s->fields = NULL;
    s->fields_cap = 0;
}

/* Whether the sample in progress holds a field named `ext` (-1: error). */
static int
has_field(Sample *s, PyObject *ext)
{
    for (Py_ssize_t i = 0; i < s->nfields; i++) {
        PyObject *have = s->fields[i].ext;
        if (have == ext) {
            return 1;
        }
        int same = PyObject_RichCompareBool(have, ext, Py_EQ);
        if (same != 0) {
            return same;
        }
    }
    return 0;
}

/* The sample in progress, added to the table `records` (0, or -1 on error). */
static int
flush(Sample *s, PyObject *records)
{
    return table_add(records, s->key, (int64_t)s->offset, s->fields, s->nfields);
}

/* A field of the sample in progress; takes the reference to `owned` (NULL: none). */
static int
add_field(Sample *s, PyObject *ext, Py_ssize_t start, Py_ssize_t stop, PyObject *owned)
{
    if (s->nfields == s->fields_cap) {
        if (s->fields_cap > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)sizeof(TableField)) {
            Py_XDECREF(owned);
            PyErr_NoMemory();
            return -1;
        }
        Py_ssize_t cap = s->fields_cap < 8 ? 8 : 2 * s->fields_cap;
        TableField *more = PyMem_Realloc(s->fields, (size_t)cap * sizeof(TableField));
        if (more == NULL) {
            Py_XDECREF(owned);
            PyErr_NoMemory();
            return -1;
        }
        s->fields = more;
        s->fields_cap = cap;
    }
    TableField *f = &s->fields[s->nfields++];
    Py_INCREF(ext);
    f->ext = ext;
    f->start = start;
    f->stop = stop;
    f->owned = owned;
    return 0;
}

/* A member of the range as a field of the sample in progress (copied if it is owned). */
static int
append_field(Sample *s, PyObject *ext, const unsigned char *data, Py_ssize_t start,
             Py_ssize_t stop)
{
    if (s->owned) {
        PyObject *owned = PyBytes_FromStringAndSize((const char *)data + start, stop - start);
        if (owned == NULL) {
            return -1;
        }
        return add_field(s, ext, 0, 0, owned);
    }
    return add_field(s, ext, start, stop, NULL);
}

/* The name of the member whose header is at h, up to its first NUL; a ustar prefix joined
 * with '/' as tarfile joins it (into buf). */
static const unsigned char *
member_name(const unsigned char *h, unsigned char *buf, Py_ssize_t *len)
{
    const unsigned char *nul = memchr(h, 0, NAME_FIELD);
    Py_ssize_t n = nul == NULL ? NAME_FIELD : nul - h;
    if (h[PREFIX_AT] == 0) {
        *len = n;
        return h;
    }
    const unsigned char *prefix = h + PREFIX_AT;
    nul = memchr(prefix, 0, PREFIX_FIELD);
    Py_ssize_t p = nul == NULL ? PREFIX_FIELD : nul - prefix;
    memcpy(buf, prefix, (size_t)p);
    buf[p] = '/';
    memcpy(buf + p + 1, h, (size_t)n);
    *len = p + 1 + n;
    return buf;
}

/* Whether name (len bytes) splits as webdataset splits it, key up to *dot. */
static int
split(const unsigned char *name, Py_ssize_t len, Py_ssize_t *dot)
{
    if (len == 0 || name[0] == '_' || memchr(name, '\n', (size_t)len) != NULL) {
        return 0;
    }
    Py_ssize_t slash = -1;
    for (Py_ssize_t i = len - 1; i >= 0; i--) {
        if (name[i] == '/') {
            slash = i;
            break;
        }
    }
    const unsigned char *d = memchr(name + slash + 1, '.', (size_t)(len - slash - 1));
    if (d == NULL || d - name < slash + 2) {
        return 0;
    }
    *dot = d - name;
    return 1;
}

/* Group the members of a batch into samples; returns the index of the member the walk
 * stops before (count if none), or -1 on error. */
static Py_ssize_t
group(Sample *s, Exts *exts, const unsigned char *data, const Member *members,
      Py_ssize_t count, Py_ssize_t doff, PyObject *records)
{
    unsigned char joined[JOINED_MAX];
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t head = members[i].head;
        Py_ssize_t start = head + BLOCK;
        Py_ssize_t len;
        const unsigned char *name = member_name(data + head, joined, &len);
        PyObject *ext = NULL;
        Py_ssize_t cut = s->current_len + 1;
        if (s->key != NULL && len >= cut && name[s->current_len] == '.'
            && memcmp(name, s->current, (size_t)s->current_len) == 0) {
            /* the next member of the current sample, likely */
            const unsigned char *tail = name + cut;
            Py_ssize_t tail_len = len - cut;
            if (memchr(tail, '/', (size_t)tail_len) == NULL
                && memchr(tail, '\n', (size_t)tail_len) == NULL) {
                ext = ext_name(exts, tail, tail_len);
                if (ext == NULL) {
                    return -1;
                }
                if (ext == Py_None) {
                    Py_CLEAR(ext);
                }
            }
        }
        if (ext != NULL) {
            int seen = has_field(s, ext);
            if (seen != 0) {
                Py_DECREF(ext);
                return seen < 0 ? -1 : i;
            }
        } else {
            Py_ssize_t dot;
            if (!split(name, len, &dot)) {
                return i;
            }
            ext = ext_name(exts, name + dot + 1, len - dot - 1);
            if (ext == NULL) {
                return -1;
            }
            if (ext == Py_None) {
                Py_DECREF(ext);
                return i;
            }
            if (s->key == NULL || dot != s->current_len
                || memcmp(name, s->current, (size_t)dot) != 0) {
                if (s->key != NULL && flush(s, records) < 0) {
                    Py_DECREF(ext);
                    return -1;
                }
                PyObject *key = PyUnicode_DecodeUTF8((const char *)name, dot,
                                                     "surrogateescape");
                if (key == NULL) {
                    Py_DECREF(ext);
                    return -1;
                }
                Py_XSETREF(s->key, key);
                fields_clear(s);
                Py_CLEAR(s->key_bytes);
                memcpy(s->buf, name, (size_t)dot);
                s->current = s->buf;
                s->current_len = dot;
                s->offset = doff + members[i].entry;
                s->owned = 0;
            } else {
                int seen = has_field(s, ext);
                if (seen != 0) { /* a duplicate: the general parser names it */
                    Py_DECREF(ext);
                    return seen < 0 ? -1 : i;
                }
            }
        }
        int failed = append_field(s, ext, data, start, start + members[i].size);
        Py_DECREF(ext);
        if (failed) {
            return -1;
        }
    }
    return count;
}

/* Take the sample in progress from `pending` ((key, offset, fields) or None). */
static int
sample_from(Sample *s, PyObject *pending, Py_ssize_t doff)
{
    memset(s, 0, sizeof(*s));
    if (pending == Py_None) {
        return 0;
    }
    PyObject *key;
    PyObject *fields;
    if (!PyArg_ParseTuple(pending, "UnO!;pending must be (key, offset, fields)", &key,
                          &s->offset, &PyList_Type, &fields)) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(fields); i++) {
        PyObject *field = PyList_GET_ITEM(fields, i);
        if (!PyTuple_Check(field) || PyTuple_GET_SIZE(field) != 4 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(field, 0))) {
            PyErr_SetString(PyExc_TypeError, "a pending field must be a 4-tuple");
            return -1;
        }
        PyObject *owned = PyTuple_GET_ITEM(field, 3);
        if (owned != Py_None && !PyBytes_Check(owned)) {
            PyErr_SetString(PyExc_TypeError, "a pending field owns bytes or None");
            return -1;
        }
        Py_ssize_t start = PyLong_AsSsize_t(PyTuple_GET_ITEM(field, 1));
        Py_ssize_t stop = start == -1 && PyErr_Occurred()
                              ? -1
                              : PyLong_AsSsize_t(PyTuple_GET_ITEM(field, 2));
        if (PyErr_Occurred()) {
            return -1;
        }
        if (add_field(s, PyTuple_GET_ITEM(field, 0), start, stop,
                      owned == Py_None ? NULL : Py_NewRef(owned)) < 0) {
            return -1;
        }
    }
    s->key_bytes = PyUnicode_AsEncodedString(key, "utf-8", "surrogateescape");
    if (s->key_bytes == NULL) {
        return -1;
    }
    s->key = Py_NewRef(key);
    s->current = PyBytes_AS_STRING(s->key_bytes);
    s->current_len = PyBytes_GET_SIZE(s->key_bytes);
    s->owned = s->offset < doff; /* a sample carried into this range keeps owning bytes */
    return 0;
}

/* The sample in progress as `pending`: (key, offset, [(ext, start, stop, owned)...]). */
static PyObject *
sample_tail(const Sample *s)
{
    PyObject *fields = PyList_New(s->nfields);
    if (fields == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < s->nfields; i++) {
        const TableField *f = &s->fields[i];
        PyObject *field = Py_BuildValue("(OnnO)", f->ext, f->start, f->stop,
                                        f->owned == NULL ? Py_None : f->owned);
        if (field == NULL) {
            Py_DECREF(fields);
            return NULL;
        }
        PyList_SET_ITEM(fields, i, field);
    }
    return Py_BuildValue("(OnN)", s->key, s->offset, fields);
}

PyDoc_STRVAR(walk_doc,
"walk(data, rel, limit, stop, doff, pending)\n"
"--\n"
"\n"
"The run of plain members at ``rel``, as ``RangeWalker.walk`` reads it.\n");

/* The member `cut`, whose data the range cuts, named as the next member of the sample in
 * progress (the sample it begins is then in progress, the one before flushed): its field
 * name (a new reference), or NULL with no error where the walk would stop before it, or
 * NULL with an error set. It is grouped as an empty member, whose field is then taken
 * off again: one naming, the walk's. */
static PyObject *
cut_member(Sample *s, Exts *exts, const unsigned char *data, const Member *cut,
           Py_ssize_t doff, PyObject *records)
{
    Member empty = {.entry = cut->entry, .head = cut->head, .size = 0};
    Py_ssize_t taken = group(s, exts, data, &empty, 1, doff, records);
    if (taken != 1) {
        return NULL;
    }
    TableField *f = &s->fields[--s->nfields];
    Py_XDECREF(f->owned);
    return f->ext; /* the field's reference, handed over */
}

static PyObject *
walk(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *source;
    PyObject *pending;
    Py_ssize_t rel, limit, stop, doff;
    if (!PyArg_ParseTuple(args, "OnnnnO:walk", &source, &rel, &limit, &stop, &doff,
                          &pending)) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(source, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    PyObject *records = NULL;
    PyObject *cut = NULL; /* (field name, size, data) of the member the range's end cuts */
    Member *members = NULL;
    Exts exts = {.used = 0};
    Sample s;
    if (sample_from(&s, pending, doff) < 0) {
        goto done;
    }
    if (rel < 0 || limit < 0 || limit > view.len || stop < 0) {
        PyErr_Format(PyExc_ValueError,
                     "walk: bad bounds rel=%zd limit=%zd stop=%zd for %zd bytes", rel,
                     limit, stop, view.len);
        goto done;
    }
    records = table_new();
    if (records == NULL) {
        goto done;
    }
    const unsigned char *data = view.buf;
    Py_ssize_t batch = FIRST_BATCH;
    int again = 1;
    for (;;) {
        Member *more = PyMem_RawRealloc(members, (size_t)batch * sizeof(Member));
        if (more == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        members = more;
        Py_ssize_t count;
        Py_ssize_t next = rel;
        Member cut_at = {.entry = -1, .head = -1, .size = -1};
        int ended;
        Py_BEGIN_ALLOW_THREADS
        ended = scan(data, &next, limit, stop, members, batch, &count, &cut_at);
        Py_END_ALLOW_THREADS
        Py_ssize_t taken = group(&s, &exts, data, members, count, doff, records);
        if (taken < 0) {
            goto done;
        }
        if (taken < count) {
            rel = members[taken].entry;
            break;
        }
        rel = next;
        if (ended == ENDED_CUT) {
            PyObject *ext = cut_member(&s, &exts, data, &cut_at, doff, records);
            if (ext == NULL && PyErr_Occurred()) {
                goto done;
            }
            if (ext != NULL) {
                cut = Py_BuildValue("(Nnn)", ext, cut_at.size, cut_at.head + BLOCK);
                if (cut == NULL) {
                    goto done;
                }
            }
        }
        if (ended != ENDED_BATCH) {
            again = ended != ENDED_REFUSED;
            break;
        }
        if (batch < (1 << 16)) {
            batch *= 2;
        }
    }
    PyObject *tail;
    if (s.key == NULL) {
        tail = Py_NewRef(Py_None);
    } else {
        tail = sample_tail(&s);
        if (tail == NULL) {
            goto done;
        }
    }
    result = Py_BuildValue("(nNOOO)", rel, tail, records, again ? Py_True : Py_False,
                           cut == NULL ? Py_None : cut);
done:
    Py_XDECREF(cut);
    PyMem_RawFree(members);
    exts_clear(&exts);
    sample_clear(&s);
    Py_XDECREF(records);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, walk_doc},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, (void *)table_module_exec},
    {Py_mod_exec, (void *)member_module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "asyncstream.shards._tarwalk",
    .m_doc = "The native tar walk: runs of plain members found, checked and grouped.",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__tarwalk(void); /* the one symbol exported */

PyMODINIT_FUNC
PyInit__tarwalk(void)
{
    return PyModuleDef_Init(&module_def);
}
