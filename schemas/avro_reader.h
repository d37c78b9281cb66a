/*
 * Avro binary reading for schemas/_avro_native.c: a bounds-checked reader over a buffer, zig-zag
 * varints, block counts, UTF-8 validation, and stepping over one value of a *plan* (see
 * peerwatch.schemas.native) without building it.
 */
#ifndef PEERWATCH_AVRO_READER_H
#define PEERWATCH_AVRO_READER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum {
    K_NULL = 0, K_BOOL = 1, K_LONG = 2, K_FLOAT = 3, K_DOUBLE = 4, K_STRING = 5, K_BYTES = 6,
    K_ENUM = 7, K_ARRAY = 8, K_MAP = 9, K_UNION = 10, K_RECORD = 11
};

#define MAX_DEPTH 64

static int bad(const char *what) {
    PyErr_SetString(PyExc_ValueError, what);
    return -1;
}

typedef struct {
    const unsigned char *buf;
    Py_ssize_t len;
    Py_ssize_t pos;
    /* Invalid UTF-8 in a string: an error (0), or counted in text_errors and read on (1), so a
       caller can drop the one record and keep reading the ones after it. A lenient reader
       likewise counts in value_errors (and reads on) the other values whose extent is known:
       a boolean byte above 1, a long whose varint ends within 10 bytes but does not fit 64
       bits. Lengths, counts, union branches and enum indexes are never lenient: past them,
       where the record ends is not known. */
    int lenient_text;
    Py_ssize_t text_errors;
    Py_ssize_t value_errors;
} Reader;

/* Whether s[0:n] is valid UTF-8 as Python's strict decoder takes it (no overlong forms, no
   surrogates, nothing above U+10FFFF). */
static int utf8_ok(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (n - i >= 8) { /* eight ASCII bytes at once (each is valid on its own) */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        Py_ssize_t extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
        if (c < 0xC2 || c > 0xF4 || n - i <= extra) return 0;
        unsigned char c1 = s[i + 1];
        for (Py_ssize_t k = 1; k <= extra; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0) || (c == 0xF0 && c1 < 0x90)
            || (c == 0xF4 && c1 >= 0x90))
            return 0;
        i += extra + 1;
    }
    return 1;
}

/* A string's bytes checked as UTF-8 (see lenient_text): 0, or -1 with ValueError. */
static int check_text(Reader *r, const unsigned char *s, Py_ssize_t n) {
    if (utf8_ok(s, n)) return 0;
    if (!r->lenient_text) return bad("invalid UTF-8 in a string");
    r->text_errors++;
    return 0;
}


/* A zig-zag varint of at most 64 bits at buf[*pos]; NULL (and *pos moved past it), or what is
   wrong: the input ends inside it, or it does not fit 64 bits (a 10th byte above 1). */
static inline const char *varint_at(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t len,
                                    int64_t *out) {
    Py_ssize_t p = *pos, lim = len - p < 10 ? len - p : 10;
    uint64_t acc = 0;
    if (lim == 10) { /* ten bytes left: no varint can run past the end (the same values) */
#pragma GCC unroll 9
        for (int k = 0; k < 9; k++) {
            unsigned char b = buf[p + k];
            acc |= (uint64_t)(b & 0x7F) << (7 * k);
            if (b < 0x80) {
                *pos = p + k + 1;
                *out = (int64_t)(acc >> 1) ^ -(int64_t)(acc & 1);
                return NULL;
            }
        }
        if (buf[p + 9] > 1) return "varint does not fit 64 bits";
        acc |= (uint64_t)buf[p + 9] << 63;
        *pos = p + 10;
        *out = (int64_t)(acc >> 1) ^ -(int64_t)(acc & 1);
        return NULL;
    }
    for (int k = 0;; k++) {
        if (k >= lim) return lim < 10 ? "truncated varint" : "varint does not fit 64 bits";
        unsigned char b = buf[p + k];
        if (k == 9 && b > 1) return "varint does not fit 64 bits";
        acc |= (uint64_t)(b & 0x7F) << (7 * k);
        if (b < 0x80) {
            *pos = p + k + 1;
            *out = (int64_t)(acc >> 1) ^ -(int64_t)(acc & 1);
            return NULL;
        }
    }
}

/* Zig-zag varint of at most 64 bits; -1 with ValueError on truncation or overflow. */
static inline int read_long(Reader *r, int64_t *out) {
    const char *err = varint_at(r->buf, &r->pos, r->len, out);
    return err != NULL ? bad(err) : 0;
}

/* A long value (not a length or a count): read_long, but a lenient reader takes a varint that
   ends at its 10th byte without fitting 64 bits as a value error (see Reader), read as 0. */
static inline int read_value_long(Reader *r, int64_t *out) {
    Py_ssize_t at = r->pos;
    const char *err = varint_at(r->buf, &r->pos, r->len, out);
    if (err == NULL) return 0;
    /* varint_at fails past nine continuation bytes only: the 10th byte tells where it ends */
    if (r->lenient_text && r->len - at >= 10 && r->buf[at + 9] < 0x80) {
        r->pos = at + 10;
        *out = 0;
        r->value_errors++;
        return 0;
    }
    return bad(err);
}

/* A boolean byte: 0 or 1; above 1 an error, or a value error of a lenient reader (read as 0). */
static inline int read_bool(Reader *r, int64_t *out) {
    if (r->pos >= r->len) return bad("truncated boolean");
    unsigned char c = r->buf[r->pos];
    if (c > 1) {
        if (!r->lenient_text) return bad("bad boolean");
        r->value_errors++;
        c = 0;
    }
    r->pos++;
    *out = c;
    return 0;
}

static int read_length(Reader *r, Py_ssize_t *out) {
    int64_t n;
    if (read_long(r, &n) < 0) return -1;
    if (n < 0 || n > (int64_t)(r->len - r->pos)) return bad("bad length");
    *out = (Py_ssize_t)n;
    return 0;
}

static int plan_parts(PyObject *plan, long *kind, PyObject **a, PyObject **b) {
    if (!PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) != 3) {
        PyErr_SetString(PyExc_TypeError, "plan nodes are (kind, a, b) tuples");
        return -1;
    }
    *kind = PyLong_AsLong(PyTuple_GET_ITEM(plan, 0));
    if (*kind == -1 && PyErr_Occurred()) return -1;
    *a = PyTuple_GET_ITEM(plan, 1);
    *b = PyTuple_GET_ITEM(plan, 2);
    return 0;
}

/* Block-encoded arrays and maps: returns the next block's item count (0 ends), -1 on error. */
static Py_ssize_t next_block(Reader *r) {
    int64_t n;
    if (read_long(r, &n) < 0) return -1;
    if (n < 0) {
        int64_t size;
        if (n == INT64_MIN) return bad("bad block count");
        n = -n;
        if (read_long(r, &size) < 0) return -1;
    }
    /* Items of our schemas take at least one byte each: a count beyond the bytes left is bad
       (and never makes us allocate for it). */
    if (n > (int64_t)(r->len - r->pos)) return bad("block count beyond the buffer");
    return (Py_ssize_t)n;
}

/* Step over one value without building it: 0 or -1. Refuses what decoding refuses (bounds,
   varints, booleans, union branches, enum indexes, invalid UTF-8 in strings) unless the reader
   is lenient_text: then it refuses only what leaves the value's end unknown (see Reader). */
static int skip_value(Reader *r, PyObject *plan, int depth) {
    long kind;
    PyObject *a, *b;
    if (depth > MAX_DEPTH) return bad("plan nested too deeply");
    if (plan_parts(plan, &kind, &a, &b) < 0) return -1;
    switch (kind) {
    case K_NULL:
        return 0;
    case K_BOOL: {
        int64_t v;
        return read_bool(r, &v);
    }
    case K_LONG: {
        int64_t v;
        return read_value_long(r, &v);
    }
    case K_ENUM: {
        int64_t i;
        if (!PyTuple_Check(a)) {
            PyErr_SetString(PyExc_TypeError, "enum plan: symbols tuple");
            return -1;
        }
        if (read_long(r, &i) < 0) return -1;
        if (i < 0 || i >= PyTuple_GET_SIZE(a)) return bad("enum index out of range");
        return 0;
    }
    case K_FLOAT:
    case K_DOUBLE: {
        Py_ssize_t n = kind == K_FLOAT ? 4 : 8;
        if (r->len - r->pos < n) return bad("truncated float");
        r->pos += n;
        return 0;
    }
    case K_STRING:
    case K_BYTES: {
        Py_ssize_t len;
        if (read_length(r, &len) < 0) return -1;
        if (kind == K_STRING && check_text(r, r->buf + r->pos, len) < 0) return -1;
        r->pos += len;
        return 0;
    }
    case K_ARRAY:
    case K_MAP:
        while (1) {
            Py_ssize_t n = next_block(r);
            if (n < 0) return -1;
            if (n == 0) return 0;
            for (Py_ssize_t i = 0; i < n; i++) {
                if (kind == K_MAP) {
                    Py_ssize_t len;
                    if (read_length(r, &len) < 0) return -1;
                    if (check_text(r, r->buf + r->pos, len) < 0) return -1;
                    r->pos += len;
                }
                if (skip_value(r, a, depth + 1) < 0) return -1;
            }
        }
    case K_UNION: {
        if (!PyTuple_Check(a)) {
            PyErr_SetString(PyExc_TypeError, "union plan: branches tuple");
            return -1;
        }
        if (r->pos >= r->len) return bad("truncated union branch");
        unsigned char c = r->buf[r->pos++];
        if (c >= 0x80) return bad("bad union branch");
        int64_t i = (int64_t)(c >> 1) ^ -(int64_t)(c & 1);
        if (i < 0 || i >= PyTuple_GET_SIZE(a)) return bad("bad union branch");
        return skip_value(r, PyTuple_GET_ITEM(a, (Py_ssize_t)i), depth + 1);
    }
    case K_RECORD: {
        if (!PyTuple_Check(b)) {
            PyErr_SetString(PyExc_TypeError, "record plan: plans tuple");
            return -1;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(b); i++) {
            if (skip_value(r, PyTuple_GET_ITEM(b, i), depth + 1) < 0) return -1;
        }
        return 0;
    }
    default:
        PyErr_Format(PyExc_TypeError, "unknown plan kind %ld", kind);
        return -1;
    }
}

#endif
