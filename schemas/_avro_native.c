/*
 * Avro binary decoding in C: the optional accelerator of peerwatch.schemas.codec.
 *
 * Python builds a *plan* from a schema (peerwatch.schemas.native.plan_of): nested tuples
 * (kind, a, b) with the record field names, enum symbols and union branches baked in.
 * decode(plan, buffer, offset) walks the plan over the bytes and returns (value, end offset),
 * building exactly the objects the generated Python reader (compiled.py) builds: dicts for
 * records, lists for arrays, dicts for maps, str for strings and enum symbols, bytes, int,
 * float, bool, None. Every read is bounds-checked; malformed bytes raise ValueError (or
 * UnicodeDecodeError from the strict UTF-8 decoder) and never read past the buffer.
 *
 * The plan comes only from our own shipped schema files; it is validated as it is walked
 * (a malformed plan raises TypeError rather than crashing).
 */
#include "avro_reader.h"

static PyObject *decode_value(Reader *r, PyObject *plan, int depth);

static PyObject *decode_record(Reader *r, PyObject *names, PyObject *plans, int depth) {
    if (!PyTuple_Check(names) || !PyTuple_Check(plans)
        || PyTuple_GET_SIZE(names) != PyTuple_GET_SIZE(plans)) {
        PyErr_SetString(PyExc_TypeError, "record plan: names and plans tuples of one length");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    /* Sized for all fields at once: a 42-field record would otherwise be resized three times. */
    PyObject *d = _PyDict_NewPresized(n);
    if (d == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = decode_value(r, PyTuple_GET_ITEM(plans, i), depth + 1);
        if (v == NULL || PyDict_SetItem(d, PyTuple_GET_ITEM(names, i), v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

static PyObject *decode_array(Reader *r, PyObject *item_plan, int depth) {
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    while (1) {
        Py_ssize_t n = next_block(r);
        if (n < 0) goto fail;
        if (n == 0) break;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *v = decode_value(r, item_plan, depth + 1);
            if (v == NULL) goto fail;
            int rc = PyList_Append(list, v);
            Py_DECREF(v);
            if (rc < 0) goto fail;
        }
    }
    return list;
fail:
    Py_DECREF(list);
    return NULL;
}

static PyObject *decode_map(Reader *r, PyObject *value_plan, int depth) {
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    while (1) {
        Py_ssize_t n = next_block(r);
        if (n < 0) goto fail;
        if (n == 0) break;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t len;
            if (read_length(r, &len) < 0) goto fail;
            PyObject *k = PyUnicode_DecodeUTF8((const char *)r->buf + r->pos, len, NULL);
            if (k == NULL) goto fail;
            r->pos += len;
            PyObject *v = decode_value(r, value_plan, depth + 1);
            if (v == NULL) {
                Py_DECREF(k);
                goto fail;
            }
            int rc = PyDict_SetItem(d, k, v);
            Py_DECREF(k);
            Py_DECREF(v);
            if (rc < 0) goto fail;
        }
    }
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

static PyObject *decode_value(Reader *r, PyObject *plan, int depth) {
    long kind;
    PyObject *a, *b;
    if (depth > MAX_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "plan nested too deeply");
        return NULL;
    }
    if (plan_parts(plan, &kind, &a, &b) < 0) return NULL;
    switch (kind) {
    case K_NULL:
        Py_RETURN_NONE;
    case K_BOOL: {
        if (r->pos >= r->len) return bad("truncated boolean"), NULL;
        unsigned char c = r->buf[r->pos++];
        if (c == 1) Py_RETURN_TRUE;
        if (c == 0) Py_RETURN_FALSE;
        return bad("bad boolean"), NULL;
    }
    case K_LONG: {
        int64_t v;
        if (read_long(r, &v) < 0) return NULL;
        return PyLong_FromLongLong(v);
    }
    case K_FLOAT: {
        if (r->len - r->pos < 4) return bad("truncated float"), NULL;
        double v = PyFloat_Unpack4((const char *)r->buf + r->pos, 1);
        if (v == -1.0 && PyErr_Occurred()) return NULL;
        r->pos += 4;
        return PyFloat_FromDouble(v);
    }
    case K_DOUBLE: {
        if (r->len - r->pos < 8) return bad("truncated double"), NULL;
        double v = PyFloat_Unpack8((const char *)r->buf + r->pos, 1);
        if (v == -1.0 && PyErr_Occurred()) return NULL;
        r->pos += 8;
        return PyFloat_FromDouble(v);
    }
    case K_STRING:
    case K_BYTES: {
        Py_ssize_t len;
        if (read_length(r, &len) < 0) return NULL;
        const char *p = (const char *)r->buf + r->pos;
        r->pos += len;
        return kind == K_STRING ? PyUnicode_DecodeUTF8(p, len, NULL)
                                : PyBytes_FromStringAndSize(p, len);
    }
    case K_ENUM: {
        int64_t i;
        if (!PyTuple_Check(a)) {
            PyErr_SetString(PyExc_TypeError, "enum plan: symbols tuple");
            return NULL;
        }
        if (read_long(r, &i) < 0) return NULL;
        if (i < 0 || i >= PyTuple_GET_SIZE(a)) return bad("enum index out of range"), NULL;
        PyObject *s = PyTuple_GET_ITEM(a, (Py_ssize_t)i);
        Py_INCREF(s);
        return s;
    }
    case K_ARRAY:
        return decode_array(r, a, depth);
    case K_MAP:
        return decode_map(r, a, depth);
    case K_UNION: {
        int64_t i;
        if (!PyTuple_Check(a)) {
            PyErr_SetString(PyExc_TypeError, "union plan: branches tuple");
            return NULL;
        }
        /* One byte, as the Python reader takes it: our unions have at most 64 branches, so a
           longer (non-canonical) index is refused rather than accepted. */
        if (r->pos >= r->len) return bad("truncated union branch"), NULL;
        unsigned char c = r->buf[r->pos++];
        if (c >= 0x80) return bad("bad union branch"), NULL;
        i = (int64_t)(c >> 1) ^ -(int64_t)(c & 1);
        if (i < 0 || i >= PyTuple_GET_SIZE(a)) return bad("bad union branch"), NULL;
        return decode_value(r, PyTuple_GET_ITEM(a, (Py_ssize_t)i), depth + 1);
    }
    case K_RECORD:
        return decode_record(r, a, b, depth);
    default:
        PyErr_Format(PyExc_TypeError, "unknown plan kind %ld", kind);
        return NULL;
    }
}

/* The (plan, buffer, offset) arguments of decode and skip: fills the view (release it) and a
   Reader at the offset; -1 with an exception set otherwise. */
static int open_call(PyObject *const *args, Py_ssize_t nargs, const char *usage, Py_buffer *view,
                     Reader *r) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    Py_ssize_t offset = PyLong_AsSsize_t(args[2]);
    if (offset == -1 && PyErr_Occurred()) return -1;
    if (PyObject_GetBuffer(args[1], view, PyBUF_SIMPLE) < 0) return -1;
    if (offset < 0 || offset > view->len) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "offset outside the buffer");
        return -1;
    }
    r->buf = (const unsigned char *)view->buf;
    r->len = view->len;
    r->pos = offset;
    r->lenient_text = 0;
    r->text_errors = 0;
    r->value_errors = 0;
    return 0;
}

static PyObject *py_skip(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    Py_buffer view;
    Reader r;
    if (open_call(args, nargs, "skip(plan, buffer, offset)", &view, &r) < 0) return NULL;
    PyObject *result = skip_value(&r, args[0], 0) == 0 ? PyLong_FromSsize_t(r.pos) : NULL;
    PyBuffer_Release(&view);
    return result;
}

/* skip_lenient(plan, buffer, offset): where one value ends, stepping over the faults a lenient
   reader counts (see Reader): where a record that did not decode ends, so that the records
   after it in a block can still be read (as decode_columns reads them). */
static PyObject *py_skip_lenient(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    Py_buffer view;
    Reader r;
    if (open_call(args, nargs, "skip_lenient(plan, buffer, offset)", &view, &r) < 0) return NULL;
    r.lenient_text = 1;
    PyObject *result = skip_value(&r, args[0], 0) == 0 ? PyLong_FromSsize_t(r.pos) : NULL;
    PyBuffer_Release(&view);
    return result;
}

static PyObject *py_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    Py_buffer view;
    Reader r;
    if (open_call(args, nargs, "decode(plan, buffer, offset)", &view, &r) < 0) return NULL;
    PyObject *value = decode_value(&r, args[0], 0);
    PyObject *result = value != NULL ? Py_BuildValue("(Nn)", value, r.pos) : NULL;
    PyBuffer_Release(&view);
    return result;
}

/* ---- Columns: the selected fields of many records, flattened (peerwatch.schemas.columns) ----
 *
 * decode_columns(program, ncols, source, offset, count, strings) reads records with a *column
 * program* made in Python from a plan and a TableSpec (peerwatch.schemas.native.column_program):
 * per record level, one op per field in schema order,
 *   (OP_SKIP, 0, 0, plan)             step over the value (strings still checked as UTF-8)
 *   (OP_VALUE, column, 0, plan)       a long/int/boolean/enum (int64) or float/double (float64),
 *                                     or a string (int64 code in the dict ``strings``), or one
 *                                     of these in a [null, X] union (then valid may be 0)
 *   (OP_TABLE, table, 0, program)     an array of records: one row per item in that table;
 * ``ncols`` is the column count of each table (table 0 is the records themselves).
 * ``source`` is a list of buffers, one record each at ``offset`` that must end it exactly (Kafka
 * messages), or one buffer of ``count`` records one after the other from ``offset`` (an archive
 * block). A record that cannot be read leaves no row: in a list it is reported and the next one
 * read; in a block, a record with invalid UTF-8 or another value fault a lenient Reader steps
 * over is dropped and the next read (its bytes were whole), any other fault ends the block. Returns (tables, bad, end): per table
 * (rows, parent, values, valid) as bytes (int64/float64 per row; valid: one uint8 per column
 * per row, row by row: a row's flags sit together, so a record writes one stream of flags
 * beside its value columns, not one per column),
 * bad = [(record number, reason)], end = the offset after the last record read (block).
 */
enum { OP_SKIP = 0, OP_VALUE = 1, OP_TABLE = 2 };

/* A column's bytes, written in place in the bytes object handed out at the end (no copy):
   ``cap`` bytes, cut to the rows written when handed out. */
typedef struct {
    PyObject *obj; /* a bytes object of ``cap`` bytes (NULL: none yet) */
    char *data;
    Py_ssize_t cap;
} Buf;

/* At least ``bytes`` bytes (doubling), the new ones zero when ``zero`` (else as they come: a
   value column's cell of a row is always written, its zero for a null included). */
static int grow_to(Buf *b, Py_ssize_t bytes, int zero) {
    if (bytes <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < bytes) cap *= 2;
    if (b->obj == NULL) {
        b->obj = PyBytes_FromStringAndSize(NULL, cap);
    } else if (_PyBytes_Resize(&b->obj, cap) < 0) {
        b->obj = NULL; /* freed by the resize */
    }
    if (b->obj == NULL) {
        b->data = NULL;
        b->cap = 0;
        return -1;
    }
    b->data = PyBytes_AS_STRING(b->obj);
    if (zero) memset(b->data + b->cap, 0, (size_t)(cap - b->cap));
    b->cap = cap;
    return 0;
}

/* The first ``used`` bytes as a bytes object (the buffer's own, cut to size: new reference);
   the buffer is empty after. */
static PyObject *buf_take(Buf *b, Py_ssize_t used) {
    PyObject *obj = b->obj;
    b->obj = NULL;
    b->data = NULL;
    b->cap = 0;
    if (obj == NULL) return PyBytes_FromStringAndSize(NULL, 0);
    if (_PyBytes_Resize(&obj, used) < 0) return NULL;
    return obj;
}

typedef struct {
    Py_ssize_t rows, cap; /* every buffer below holds cap rows (valid: zero past rows) */
    Py_ssize_t first_cap; /* the capacity of the first allocation (a hint, or 64) */
    Py_ssize_t ncols;
    Buf parent;
    Buf *values; /* 8 bytes a row */
    Buf valid;   /* ncols bytes a row, row-major */
} Tab;

/* Recently coded short strings (node names, UUIDs recur in every batch): bytes -> code without
   building a str and asking the dict. A cache belongs to one ``strings`` dict (it holds a
   reference) and lives across calls (a capsule from ``string_cache``), or one call only. Its
   entries stay true because ``strings`` only grows: a code is the string's insertion position,
   never changed (the contract of peerwatch.schemas.columns); a dict found smaller than at the
   end of the last call empties the cache. Input bytes only ever hit an entry of the very same
   bytes (compared whole); a collision is a miss, answered by the dict. */
#define CACHE_SLOTS_ONE_CALL 4096
#define CACHE_BYTES 56
#define CACHE_CAPSULE "peerwatch.string_cache"
typedef struct {
    int64_t code;
    Py_ssize_t len1; /* the string's length + 1; 0: empty slot */
    unsigned char bytes[CACHE_BYTES];
} CacheEntry;

/* A string by its code: the same entries indexed by code instead of by hash. Codes are
   insertion positions, so strings first seen together (a node's name and its GPUs' UUIDs) sit
   together here, and the next string of a column is often the code after the last one, or as
   far from it as the last step was: guesses read memory next to what was just read, where a
   hash lookup reads anywhere in a table far larger than the processor's caches. */
typedef struct {
    Py_ssize_t len1; /* the string's length + 1; 0: not known */
    unsigned char bytes[CACHE_BYTES];
} CodeEntry;

typedef struct {
    PyObject *strings; /* strong reference */
    Py_ssize_t seen;   /* the dict's size at the end of the last call */
    size_t mask;       /* slots - 1 (a power of two) */
    CacheEntry *slots; /* zeroed: pages a cache never touches cost nothing */
    CodeEntry *by_code; /* by_code[code] for code < n_codes (zeroed when grown) */
    Py_ssize_t n_codes;
} StringCache;

static StringCache *cache_new(PyObject *strings, size_t slots) {
    StringCache *c = PyMem_Calloc(1, sizeof(StringCache));
    if (c == NULL) return (StringCache *)PyErr_NoMemory();
    c->slots = PyMem_Calloc(slots, sizeof(CacheEntry));
    if (c->slots == NULL) {
        PyMem_Free(c);
        return (StringCache *)PyErr_NoMemory();
    }
    Py_INCREF(strings);
    c->strings = strings;
    c->mask = slots - 1;
    return c;
}

/* Forgets every entry (the dict did not only grow). */
static void cache_clear(StringCache *c) {
    memset(c->slots, 0, (c->mask + 1) * sizeof(CacheEntry));
    if (c->n_codes > 0) memset(c->by_code, 0, (size_t)c->n_codes * sizeof(CodeEntry));
}

/* Notes the bytes of ``code`` (short strings only) unless known: a code's bytes never change.
   A failed growth only loses the note. */
static void by_code_note(StringCache *c, int64_t code, const unsigned char *p, Py_ssize_t len) {
    if (code < 0 || len > CACHE_BYTES || code >= ((Py_ssize_t)1 << 40)) return;
    if (code < c->n_codes && c->by_code[code].len1 != 0) return;
    if (code >= c->n_codes) {
        Py_ssize_t n = c->n_codes ? c->n_codes : 1024;
        while (n <= code) n *= 2;
        CodeEntry *grown = PyMem_Realloc(c->by_code, (size_t)n * sizeof(CodeEntry));
        if (grown == NULL) return;
        memset(grown + c->n_codes, 0, (size_t)(n - c->n_codes) * sizeof(CodeEntry));
        c->by_code = grown;
        c->n_codes = n;
    }
    CodeEntry *e = &c->by_code[code];
    memcpy(e->bytes, p, (size_t)len);
    e->len1 = len + 1;
}

/* Whether ``code`` is known to be exactly these bytes. */
static inline int by_code_is(const StringCache *c, int64_t code, const unsigned char *p,
                             Py_ssize_t len) {
    if (code < 0 || code >= c->n_codes) return 0;
    const CodeEntry *e = &c->by_code[code];
    return e->len1 == len + 1 && memcmp(e->bytes, p, (size_t)len) == 0;
}

static void cache_free(StringCache *c) {
    if (c == NULL) return;
    Py_XDECREF(c->strings);
    PyMem_Free(c->by_code);
    PyMem_Free(c->slots);
    PyMem_Free(c);
}

static void cache_capsule_free(PyObject *capsule) {
    cache_free(PyCapsule_GetPointer(capsule, CACHE_CAPSULE));
}

/* A hash of a short byte string, eight bytes a step (an index into the cache, nothing more). */
static inline uint64_t bytes_hash(const unsigned char *p, Py_ssize_t len) {
    uint64_t h = (uint64_t)len * 0x9E3779B97F4A7C15ull, w;
    for (; len >= 8; p += 8, len -= 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    if (len > 0) {
        w = 0;
        memcpy(&w, p, (size_t)len);
        h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    }
    return h ^ (h >> 29);
}

typedef struct {
    Tab *tabs;
    Py_ssize_t ntabs;
    PyObject *strings;
    StringCache *cache;
} Cols;

static int add_row(Tab *t, int64_t parent) {
    if (t->rows == t->cap) {
        Py_ssize_t cap = t->cap ? 2 * t->cap : t->first_cap;
        if (grow_to(&t->parent, cap * 8, 0) < 0) return -1;
        for (Py_ssize_t c = 0; c < t->ncols; c++)
            if (grow_to(&t->values[c], cap * 8, 0) < 0) return -1;
        if (grow_to(&t->valid, cap * t->ncols, 1) < 0) return -1;
        t->cap = cap;
    }
    memcpy(t->parent.data + t->rows * 8, &parent, 8);
    t->rows++;
    return 0;
}

/* The last two codes a string column gave in this call (guesses for its next one). */
typedef struct {
    int64_t last, step;
} Guess;

/* A code found by the hash cache or the dict: noted by code, and the column's guesses moved. */
static void found_code(StringCache *cache, Guess *g, int64_t code, const unsigned char *p,
                       Py_ssize_t len) {
    by_code_note(cache, code, p, len);
    if (g->last >= 0) g->step = code - g->last;
    g->last = code;
}

static int string_code(Cols *cols, Reader *r, Py_ssize_t len, int64_t *code, Guess *g) {
    const unsigned char *p = r->buf + r->pos;
    r->pos += len;
    CacheEntry *slot = NULL;
    StringCache *cache = cols->cache;
    if (len <= CACHE_BYTES) {
        if (g->last >= 0) {
            if (by_code_is(cache, g->last + 1, p, len)) {
                *code = g->last + 1;
                g->step = 1;
                g->last = *code;
                return 0;
            }
            if (g->step != 1 && by_code_is(cache, g->last + g->step, p, len)) {
                *code = g->last + g->step;
                g->last = *code;
                return 0;
            }
        }
        slot = &cache->slots[bytes_hash(p, len) & cache->mask];
        if (slot->len1 == len + 1 && memcmp(slot->bytes, p, (size_t)len) == 0) {
            *code = slot->code;
            found_code(cache, g, *code, p, len);
            return 0;
        }
    }
    if (!utf8_ok(p, len)) {
        *code = 0;
        return check_text(r, p, len);
    }
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, len, NULL);
    if (s == NULL) return -1;
    PyObject *known = PyDict_GetItemWithError(cols->strings, s);
    if (known != NULL) {
        *code = PyLong_AsLongLong(known);
    } else if (PyErr_Occurred()) {
        *code = -1;
    } else {
        *code = (int64_t)PyDict_GET_SIZE(cols->strings);
        PyObject *v = PyLong_FromLongLong(*code);
        if (v == NULL || PyDict_SetItem(cols->strings, s, v) < 0) *code = -1;
        Py_XDECREF(v);
    }
    Py_DECREF(s);
    if (*code == -1 && PyErr_Occurred()) return -1;
    if (slot != NULL) {
        memcpy(slot->bytes, p, (size_t)len);
        slot->len1 = len + 1;
        slot->code = *code;
        found_code(cache, g, *code, p, len);
    }
    return 0;
}

/* The column program compiled once per call into C structs, so that the per-record walk reads
   no Python object (the program tuple, which owns every plan here, outlives the call). */
typedef struct Prog Prog;
typedef struct {
    int what;          /* OP_SKIP, OP_VALUE, OP_TABLE */
    Py_ssize_t arg;    /* the column (OP_VALUE) or table (OP_TABLE) */
    int null_branch;   /* the null branch of a [null, X] union, else -1 */
    long kind;         /* K_* of X; -1: step over ``plan`` with skip_value */
    Py_ssize_t nsym;   /* enum symbols */
    PyObject *plan;    /* borrowed */
    Prog *child;       /* OP_TABLE: the items' program */
    Guess guess;       /* OP_VALUE of a string: see string_code */
} Op;

struct Prog {
    Py_ssize_t nops;
    Op *ops;
};

static void prog_free(Prog *p) {
    if (p == NULL) return;
    for (Py_ssize_t i = 0; i < p->nops; i++) prog_free(p->ops[i].child);
    PyMem_Free(p->ops);
    PyMem_Free(p);
}

/* Fills kind, null_branch and nsym of ``op`` from ``plan``: a scalar, or a [null, scalar] union;
   anything else is stepped over as a whole (kind -1). */
static int op_kind(Op *op, PyObject *plan) {
    long kind;
    PyObject *a, *b;
    if (plan_parts(plan, &kind, &a, &b) < 0) return -1;
    if (kind == K_UNION && PyTuple_Check(a) && PyTuple_GET_SIZE(a) == 2) {
        long k0, k1;
        PyObject *a0, *b0, *a1, *b1;
        if (plan_parts(PyTuple_GET_ITEM(a, 0), &k0, &a0, &b0) < 0
            || plan_parts(PyTuple_GET_ITEM(a, 1), &k1, &a1, &b1) < 0)
            return -1;
        if (k0 == K_NULL || k1 == K_NULL) {
            op->null_branch = k0 == K_NULL ? 0 : 1;
            kind = k0 == K_NULL ? k1 : k0;
            a = k0 == K_NULL ? a1 : a0;
        }
    }
    if (kind > K_ENUM) {
        op->kind = -1;
        op->null_branch = -1;
        return 0;
    }
    if (kind == K_ENUM) {
        if (!PyTuple_Check(a)) {
            PyErr_SetString(PyExc_TypeError, "enum plan: symbols tuple");
            return -1;
        }
        op->nsym = PyTuple_GET_SIZE(a);
    }
    op->kind = kind;
    return 0;
}

static Prog *prog_compile(PyObject *ops, const Cols *cols, Py_ssize_t ti, int depth) {
    if (depth > MAX_DEPTH || !PyTuple_Check(ops) || ti < 0 || ti >= cols->ntabs) {
        PyErr_SetString(PyExc_TypeError, "column program: a tuple of ops and a table in range");
        return NULL;
    }
    Prog *p = PyMem_Calloc(1, sizeof(Prog));
    if (p == NULL) return (Prog *)PyErr_NoMemory();
    p->nops = PyTuple_GET_SIZE(ops);
    p->ops = PyMem_Calloc((size_t)p->nops + 1, sizeof(Op));
    if (p->ops == NULL) {
        PyMem_Free(p);
        return (Prog *)PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < p->nops; i++) {
        PyObject *t = PyTuple_GET_ITEM(ops, i);
        Op *op = &p->ops[i];
        op->guess.last = -1;
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4) {
            PyErr_SetString(PyExc_TypeError, "column program: ops are 4-tuples");
            goto fail;
        }
        op->what = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
        op->arg = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 1));
        op->null_branch = -1;
        op->plan = PyTuple_GET_ITEM(t, 3);
        if (PyErr_Occurred()) goto fail;
        if (op->what == OP_TABLE) {
            op->child = prog_compile(op->plan, cols, op->arg, depth + 1);
            if (op->child == NULL) goto fail;
        } else if (op->what == OP_SKIP || op->what == OP_VALUE) {
            if (op_kind(op, op->plan) < 0) goto fail;
            if (op->what == OP_VALUE
                && (op->kind < K_BOOL || op->kind == K_BYTES || op->arg < 0
                    || op->arg >= cols->tabs[ti].ncols)) {
                PyErr_SetString(PyExc_TypeError, "column program: a value op needs a scalar "
                                                 "and a column in range");
                goto fail;
            }
        } else {
            PyErr_Format(PyExc_TypeError, "column program: unknown op %d", op->what);
            goto fail;
        }
    }
    return p;
fail:
    prog_free(p);
    return NULL;
}

/* One field by its op: into row ``row`` of table ``t`` (OP_VALUE) or stepped over. */
static int read_op(Cols *cols, Reader *r, Op *op, Tab *t, Py_ssize_t row, int depth) {
    if (op->kind < 0) return skip_value(r, op->plan, depth + 1);
    if (op->null_branch >= 0) {
        if (r->pos >= r->len) return bad("truncated union branch");
        unsigned char c = r->buf[r->pos++];
        if (c != 0 && c != 2) return bad("bad union branch");
        if ((c >> 1) == op->null_branch) { /* valid stays 0; the value is 0 */
            if (op->what == OP_VALUE) memset(t->values[op->arg].data + row * 8, 0, 8);
            return 0;
        }
    }
    int64_t iv = 0;
    double dv;
    switch (op->kind) {
    case K_NULL:
        return 0;
    case K_LONG:
        if (read_value_long(r, &iv) < 0) return -1;
        break;
    case K_BOOL:
        if (read_bool(r, &iv) < 0) return -1;
        break;
    case K_ENUM:
        if (read_long(r, &iv) < 0) return -1;
        if (iv < 0 || iv >= op->nsym) return bad("enum index out of range");
        break;
    case K_FLOAT:
    case K_DOUBLE: {
        Py_ssize_t n = op->kind == K_FLOAT ? 4 : 8;
        if (r->len - r->pos < n) return bad("truncated float");
        if (op->what == OP_SKIP) {
            r->pos += n;
            return 0;
        }
        dv = op->kind == K_FLOAT ? PyFloat_Unpack4((const char *)r->buf + r->pos, 1)
                                 : PyFloat_Unpack8((const char *)r->buf + r->pos, 1);
        if (dv == -1.0 && PyErr_Occurred()) return -1;
        r->pos += n;
        memcpy(t->values[op->arg].data + row * 8, &dv, 8);
        t->valid.data[row * t->ncols + op->arg] = 1;
        return 0;
    }
    case K_STRING:
    case K_BYTES: {
        Py_ssize_t len;
        if (read_length(r, &len) < 0) return -1;
        if (op->what == OP_VALUE) {
            if (string_code(cols, r, len, &iv, &op->guess) < 0) return -1;
            break;
        }
        if (op->kind == K_STRING && check_text(r, r->buf + r->pos, len) < 0) return -1;
        r->pos += len;
        return 0;
    }
    default:
        return bad("column program: unknown kind");
    }
    if (op->what == OP_SKIP) return 0;
    memcpy(t->values[op->arg].data + row * 8, &iv, 8);
    t->valid.data[row * t->ncols + op->arg] = 1;
    return 0;
}

static int read_level(Cols *cols, Reader *r, Prog *prog, Py_ssize_t ti, int64_t parent,
                      int depth) {
    if (depth > MAX_DEPTH) return bad("plan nested too deeply");
    Tab *t = &cols->tabs[ti];
    Py_ssize_t row = t->rows;
    if (add_row(t, parent) < 0) return -1;
    for (Py_ssize_t i = 0; i < prog->nops; i++) {
        Op *op = &prog->ops[i];
        if (op->what != OP_TABLE) {
            if (read_op(cols, r, op, t, row, depth) < 0) return -1;
            continue;
        }
        while (1) {
            Py_ssize_t n = next_block(r);
            if (n < 0) return -1;
            if (n == 0) break;
            for (Py_ssize_t k = 0; k < n; k++)
                if (read_level(cols, r, op->child, op->arg, (int64_t)row, depth + 1) < 0)
                    return -1;
            t = &cols->tabs[ti];
        }
    }
    return 0;
}

static void rollback(Cols *cols, const Py_ssize_t *saved) {
    for (Py_ssize_t k = 0; k < cols->ntabs; k++) {
        Tab *t = &cols->tabs[k];
        Py_ssize_t from = saved[k], n = t->rows - saved[k];
        if (n <= 0) continue;
        /* the flags past ``rows`` stay zero (the next rows' values are all written anew) */
        if (t->ncols > 0) memset(t->valid.data + from * t->ncols, 0, (size_t)(n * t->ncols));
        t->rows = from;
    }
}

/* One record from r->pos: 0; -1 (ValueError: the bytes are malformed, or another error); -2
   (ValueError: read whole, but a string is not UTF-8 or another value is out of range (see
   Reader), so the next record can still be read). On failure every table is cut back to where
   it was: no row of the record is kept. */
static int read_record(Cols *cols, Reader *r, Prog *program, Py_ssize_t *saved) {
    for (Py_ssize_t k = 0; k < cols->ntabs; k++) saved[k] = cols->tabs[k].rows;
    r->text_errors = r->value_errors = 0;
    int rc = read_level(cols, r, program, 0, -1, 0);
    if (rc == 0 && r->text_errors) rc = bad("invalid UTF-8 in a string") - 1;
    else if (rc == 0 && r->value_errors)
        rc = bad("a boolean byte above 1 or a long over 64 bits") - 1;
    if (rc < 0) rollback(cols, saved);
    return rc;
}

/* Appends (record number, the pending exception's text) to ``bad`` and clears it; -1 when the
   exception is not a decoding fault (memory, a malformed program): that one propagates. */
static int note_bad(PyObject *bad_list, Py_ssize_t i) {
    if (!PyErr_ExceptionMatches(PyExc_ValueError)) return -1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *text = value != NULL ? PyObject_Str(value) : PyUnicode_FromString("malformed");
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (text == NULL) return -1;
    PyObject *item = Py_BuildValue("(nN)", i, text);
    if (item == NULL) return -1;
    int rc = PyList_Append(bad_list, item);
    Py_DECREF(item);
    return rc;
}

static PyObject *tables_out(Cols *cols) {
    PyObject *out = PyList_New(cols->ntabs);
    if (out == NULL) return NULL;
    for (Py_ssize_t k = 0; k < cols->ntabs; k++) {
        Tab *t = &cols->tabs[k];
        PyObject *values = PyList_New(t->ncols);
        PyObject *valid = buf_take(&t->valid, t->rows * t->ncols);
        PyObject *parent = buf_take(&t->parent, t->rows * 8);
        if (values == NULL || valid == NULL || parent == NULL) goto fail;
        for (Py_ssize_t c = 0; c < t->ncols; c++) {
            PyObject *v = buf_take(&t->values[c], t->rows * 8);
            if (v == NULL) goto fail;
            PyList_SET_ITEM(values, c, v);
        }
        PyList_SET_ITEM(out, k, Py_BuildValue("(nNNN)", t->rows, parent, values, valid));
        if (PyList_GET_ITEM(out, k) == NULL) goto fail_out;
        continue;
    fail:
        Py_XDECREF(values);
        Py_XDECREF(valid);
        Py_XDECREF(parent);
    fail_out:
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static void cols_free(Cols *cols) {
    if (cols->tabs == NULL) return;
    for (Py_ssize_t k = 0; k < cols->ntabs; k++) {
        Tab *t = &cols->tabs[k];
        Py_XDECREF(t->parent.obj);
        for (Py_ssize_t c = 0; c < t->ncols && t->values != NULL; c++)
            Py_XDECREF(t->values[c].obj);
        PyMem_Free(t->values);
        Py_XDECREF(t->valid.obj);
    }
    PyMem_Free(cols->tabs);
    cols->tabs = NULL;
}

/* The first capacity of each table from ``hints`` (a tuple of row counts, one per table: what
   the caller expects, e.g. the rows of its last call), so a block's columns are allocated once
   instead of grown by doubling from 64 rows. A hint only sizes the first allocation (the
   tables still grow past it), and is bounded by the input's bytes (a row takes at least one
   unless its record holds no value) and by MAX_HINT_ROWS: a hint can cost memory, never a
   result. */
#define MAX_HINT_ROWS ((Py_ssize_t)1 << 22)
/* The bytes of a buffer (bytes, a memoryview of shared memory...); 0 for anything else. */
static Py_ssize_t buffer_bytes(PyObject *obj) {
    if (PyBytes_Check(obj)) return PyBytes_GET_SIZE(obj);
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* not a buffer: the decoding refuses it, not the hint */
        return 0;
    }
    Py_ssize_t n = view.len;
    PyBuffer_Release(&view);
    return n;
}
static int hint_capacities(Cols *cols, PyObject *hints, PyObject *source) {
    if (!PyTuple_Check(hints) || PyTuple_GET_SIZE(hints) != cols->ntabs) {
        PyErr_SetString(PyExc_TypeError, "decode_columns: hints, one row count per table");
        return -1;
    }
    Py_ssize_t bound = 0;
    if (PyList_Check(source)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(source); i++)
            bound += buffer_bytes(PyList_GET_ITEM(source, i));
    } else {
        bound = buffer_bytes(source);
    }
    if (bound > MAX_HINT_ROWS) bound = MAX_HINT_ROWS;
    for (Py_ssize_t k = 0; k < cols->ntabs; k++) {
        Py_ssize_t want = PyLong_AsSsize_t(PyTuple_GET_ITEM(hints, k));
        if (want == -1 && PyErr_Occurred()) return -1;
        if (want > bound) want = bound;
        if (want > cols->tabs[k].first_cap) cols->tabs[k].first_cap = want;
    }
    return 0;
}

static PyObject *py_decode_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 6 || nargs > 8) {
        PyErr_SetString(PyExc_TypeError, "decode_columns(program, ncols, source, offset, count, "
                                         "strings[, cache[, hints]])");
        return NULL;
    }
    PyObject *program = args[0], *ncols = args[1], *source = args[2], *strings = args[5];
    Py_ssize_t offset = PyLong_AsSsize_t(args[3]), count = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (!PyTuple_Check(ncols) || PyTuple_GET_SIZE(ncols) < 1 || !PyDict_Check(strings)
        || offset < 0 || count < 0) {
        PyErr_SetString(PyExc_TypeError, "decode_columns: bad arguments");
        return NULL;
    }
    Cols cols = {NULL, PyTuple_GET_SIZE(ncols), strings, NULL};
    Prog *prog = NULL;
    PyObject *result = NULL, *bad_list = NULL, *tables = NULL;
    Py_ssize_t *saved = NULL, end = offset;
    cols.tabs = PyMem_Calloc((size_t)cols.ntabs, sizeof(Tab));
    StringCache *own_cache = NULL;
    if (nargs >= 7 && args[6] != Py_None) {
        cols.cache = PyCapsule_GetPointer(args[6], CACHE_CAPSULE);
        if (cols.cache == NULL) goto done;
        if (cols.cache->strings != strings) {
            cols.cache = NULL;
            PyErr_SetString(PyExc_TypeError, "decode_columns: a cache of another strings dict");
            goto done;
        }
        if (PyDict_GET_SIZE(strings) < cols.cache->seen) /* not grown only: start again */
            cache_clear(cols.cache);
    } else {
        cols.cache = own_cache = cache_new(strings, CACHE_SLOTS_ONE_CALL);
        if (cols.cache == NULL) goto done;
    }
    saved = PyMem_Calloc((size_t)cols.ntabs, sizeof(Py_ssize_t));
    if (cols.tabs == NULL || saved == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < cols.ntabs; k++) {
        Tab *t = &cols.tabs[k];
        t->ncols = PyLong_AsSsize_t(PyTuple_GET_ITEM(ncols, k));
        if (t->ncols < 0 || t->ncols > 4096) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "decode_columns: ncols");
            goto done;
        }
        t->values = PyMem_Calloc((size_t)t->ncols + 1, sizeof(Buf));
        if (t->values == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        t->first_cap = 64;
    }
    if (nargs == 8 && args[7] != Py_None && hint_capacities(&cols, args[7], source) < 0)
        goto done;
    prog = prog_compile(program, &cols, 0, 0);
    if (prog == NULL) goto done;
    bad_list = PyList_New(0);
    if (bad_list == NULL) goto done;
    if (PyList_Check(source) || PyTuple_Check(source)) {
        PyObject *seq = PySequence_Fast(source, "decode_columns: source");
        if (seq == NULL) goto done;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_buffer view;
            if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &view, PyBUF_SIMPLE) < 0) {
                Py_DECREF(seq);
                goto done;
            }
            Reader r = {(const unsigned char *)view.buf, view.len, offset, 1, 0, 0};
            int rc = offset > view.len ? bad("record shorter than its header")
                                       : read_record(&cols, &r, prog, saved);
            if (rc == 0 && r.pos != r.len) {
                rc = bad("trailing bytes after the record");
                rollback(&cols, saved);
            }
            PyBuffer_Release(&view);
            if (rc < 0 && note_bad(bad_list, i) < 0) {
                Py_DECREF(seq);
                goto done;
            }
        }
        Py_DECREF(seq);
    } else {
        Py_buffer view;
        if (PyObject_GetBuffer(source, &view, PyBUF_SIMPLE) < 0) goto done;
        Reader r = {(const unsigned char *)view.buf, view.len, offset, 1, 0, 0};
        if (offset > view.len) count = 0;
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_ssize_t at = r.pos;
            int rc = read_record(&cols, &r, prog, saved);
            if (rc < 0) {
                int recoverable = rc == -2;
                if (note_bad(bad_list, i) < 0) {
                    PyBuffer_Release(&view);
                    goto done;
                }
                if (!recoverable) {
                    r.pos = at;
                    break;
                }
            }
        }
        end = r.pos;
        PyBuffer_Release(&view);
    }
    tables = tables_out(&cols);
    if (tables != NULL) result = Py_BuildValue("(NOn)", tables, bad_list, end);
done:
    if (cols.cache != NULL) cols.cache->seen = PyDict_GET_SIZE(strings);
    Py_XDECREF(bad_list);
    prog_free(prog);
    cache_free(own_cache);
    cols_free(&cols);
    PyMem_Free(saved);
    return result;
}

static PyObject *py_string_cache(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    Py_ssize_t slots = nargs == 2 ? PyLong_AsSsize_t(args[1]) : -1;
    if (nargs != 2 || !PyDict_Check(args[0]) || slots < 1 || slots > (1 << 24)
        || (slots & (slots - 1)) != 0) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError,
                            "string_cache(strings, slots): a dict and a power of two <= 2**24");
        }
        return NULL;
    }
    StringCache *c = cache_new(args[0], (size_t)slots);
    if (c == NULL) return NULL;
    PyObject *capsule = PyCapsule_New(c, CACHE_CAPSULE, cache_capsule_free);
    if (capsule == NULL) cache_free(c);
    return capsule;
}

static PyMethodDef methods[] = {
    {"string_cache", (PyCFunction)(void (*)(void))py_string_cache, METH_FASTCALL,
     "string_cache(strings, slots) -> a cache of string codes for decode_columns, bound to the "
     "dict ``strings`` (which must only grow)."},
    {"decode", (PyCFunction)(void (*)(void))py_decode, METH_FASTCALL,
     "decode(plan, buffer, offset) -> (value, end offset); ValueError on malformed bytes."},
    {"skip", (PyCFunction)(void (*)(void))py_skip, METH_FASTCALL,
     "skip(plan, buffer, offset) -> end offset of the value there, built nothing."},
    {"skip_lenient", (PyCFunction)(void (*)(void))py_skip_lenient, METH_FASTCALL,
     "skip_lenient(plan, buffer, offset) -> end offset of the value there, stepping over "
     "invalid UTF-8, boolean bytes above 1 and longs over 64 bits."},
    {"decode_columns", (PyCFunction)(void (*)(void))py_decode_columns, METH_FASTCALL,
     "decode_columns(program, ncols, source, offset, count, strings[, cache]) -> (tables, bad, "
     "end)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_avro_native",
    "Avro binary decoding in C (see peerwatch.schemas.native).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__avro_native(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "PLAN_VERSION", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
