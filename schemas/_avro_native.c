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

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)(void (*)(void))py_decode, METH_FASTCALL,
     "decode(plan, buffer, offset) -> (value, end offset); ValueError on malformed bytes."},
    {"skip", (PyCFunction)(void (*)(void))py_skip, METH_FASTCALL,
     "skip(plan, buffer, offset) -> end offset of the value there, built nothing."},
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
