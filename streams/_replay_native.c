/*
 * The replay's native path: NodeGpuSample records read straight from archive blocks into the
 * window accumulators of peerwatch.streams.windows, without building a Python object per
 * sample (see peerwatch.streams.windows_native, which drives it).
 *
 * SampleIndex: the samples of one replay hour. add_block() walks a block (bounds-checked, with a
 * field program compiled from the schema) and records (event time, node id, block, offset) per
 * sample; sort() puts them in replay order (time, node name, read order).
 *
 * Windows: the state of WindowAggregator (open windows, counter memory, cached owners per
 * node) in C structs. feed() aggregates samples of a SampleIndex exactly as
 * WindowAggregator.add_batch does (same operations in the same order, so the same doubles);
 * it stops after a sample whose XIDs or lateness Python must handle, or where the pipeline
 * closes windows. Values the Python ints could hold but int64 or doubles could not represent
 * exactly raise OverflowError: the caller then replays through the Python path instead.
 */
#include "avro_reader.h"
#include <stdlib.h>

/* Field value kinds of a compiled program. */
enum { P_SKIP = 0, P_LONG = 1, P_FLOAT = 2, P_DOUBLE = 3, P_BOOL = 4, P_STRING = 5, P_ENUM = 6 };

/* Roles of NodeGpuSample fields. */
enum { S_NONE = 0, S_NODE = 1, S_TS = 2, S_GPUS = 3, S_XIDS = 4 };

/* Roles of GpuReading fields. */
enum {
    G_NONE = 0, G_INDEX, G_UUID, G_STATE, G_CLK, G_CLK_MAX, G_REASONS, G_CAP_NS, G_SLOW_NS,
    G_SWTH_NS, G_HWTH_NS, G_BRAKE_NS, G_POWER, G_PLIMIT, G_ENERGY, G_TEMP, G_UTIL, G_SM,
    G_ECC_U, G_REMAP_P, G_REMAP_F, G_PCIE_REPLAY, G_WIDTH, G_WIDTH_MAX, G_NVL_REPLAY,
    G_NVL_RECOVERY, G_NVL_CRC, G_ROLES
};

#define THROTTLE_BITS (0x8 | 0x20 | 0x40 | 0x80)
#define POWER_CAP_BIT 0x4
#define EXACT_LIMIT ((int64_t)1 << 53) /* ints a double holds exactly */
#define FAR_PAST (-((int64_t)1 << 62))

typedef struct {
    int kind;        /* P_* of the value, or of the non-null branch of a [null, X] union */
    int role;
    int null_branch; /* -1: not a union */
    Py_ssize_t nsym; /* enum symbols */
    PyObject *plan;  /* P_SKIP: the plan to step over (a reference held by the program) */
} Field;

typedef struct {
    Field *f;
    Py_ssize_t n;
} Program;

typedef struct {
    int present;
    int is_float;
    int64_t i;
    double f;
    Py_ssize_t off, len;
} Val;

/* ---- programs ------------------------------------------------------------------------------ */

static void program_free(Program *p) {
    for (Py_ssize_t i = 0; i < p->n; i++) Py_XDECREF(p->f[i].plan);
    PyMem_Free(p->f);
    p->f = NULL;
    p->n = 0;
}

/* A program from a tuple of (role, kind, null_branch, nsym, plan) tuples. */
static int program_init(Program *p, PyObject *spec, int max_role) {
    if (!PyTuple_Check(spec)) {
        PyErr_SetString(PyExc_TypeError, "program: a tuple of field tuples");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(spec);
    p->f = PyMem_Calloc(n ? n : 1, sizeof(Field));
    if (p->f == NULL) return PyErr_NoMemory(), -1;
    p->n = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(spec, i);
        Field *fd = &p->f[i];
        PyObject *plan;
        if (!PyTuple_Check(t)
            || !PyArg_ParseTuple(t, "iiinO", &fd->role, &fd->kind, &fd->null_branch, &fd->nsym,
                                 &plan))
            goto fail;
        if (fd->role < 0 || fd->role >= max_role || fd->kind < P_SKIP || fd->kind > P_ENUM
            || fd->null_branch < -1 || fd->null_branch > 1) {
            PyErr_SetString(PyExc_ValueError, "program: bad field");
            goto fail;
        }
        Py_INCREF(plan);
        fd->plan = plan;
    }
    return 0;
fail:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "program: bad field tuple");
    program_free(p);
    return -1;
}

/* One field's value at buf[*pos] (any kind but P_SKIP) into v, or stepped over when v is NULL:
   bounds, union branches, enum ranges and booleans checked. NULL, or what is wrong. The
   position is a local of the caller's loop: this is most of a replay's reading. */
static inline const char *field_at(const Field *fd, const unsigned char *buf, Py_ssize_t *at,
                                   Py_ssize_t len, Val *v) {
    Py_ssize_t pos = *at;
    const char *err = NULL;
    if (fd->null_branch >= 0) {
        if (pos >= len) return "truncated union branch";
        unsigned char c = buf[pos++];
        if (c > 2 || c == 1) return "bad union branch"; /* zig-zag branch 0 or 1 */
        if ((c >> 1) == fd->null_branch) {
            if (v != NULL) v->present = 0;
            *at = pos;
            return NULL;
        }
    }
    int64_t n = 0;
    switch (fd->kind) {
    case P_LONG:
    case P_ENUM:
        if ((err = varint_at(buf, &pos, len, &n)) != NULL) return err;
        if (fd->kind == P_ENUM && (n < 0 || n >= fd->nsym)) return "enum index out of range";
        if (v != NULL) {
            v->present = 1;
            v->is_float = 0;
            v->i = n;
        }
        break;
    case P_BOOL:
        if (pos >= len) return "truncated boolean";
        if (buf[pos] > 1) return "bad boolean";
        if (v != NULL) {
            v->present = 1;
            v->is_float = 0;
            v->i = buf[pos];
        }
        pos++;
        break;
    case P_FLOAT:
    case P_DOUBLE: {
        Py_ssize_t size = fd->kind == P_FLOAT ? 4 : 8;
        if (len - pos < size) return "truncated float";
        if (v != NULL) {
            const char *p = (const char *)buf + pos;
            v->f = size == 4 ? PyFloat_Unpack4(p, 1) : PyFloat_Unpack8(p, 1);
            if (v->f == -1.0 && PyErr_Occurred()) return "bad float";
            v->present = 1;
            v->is_float = 1;
        }
        pos += size;
        break;
    }
    case P_STRING:
        if ((err = varint_at(buf, &pos, len, &n)) != NULL) return err;
        if (n < 0 || n > len - pos) return "bad length";
        if (v != NULL) {
            v->present = 1;
            v->off = pos;
            v->len = (Py_ssize_t)n;
        }
        pos += (Py_ssize_t)n;
        break;
    default:
        return "bad field kind";
    }
    *at = pos;
    return NULL;
}

/* One field at r into v (NULL: stepped over); P_SKIP fields walk their plan. 0 or -1. */
static int read_field(Reader *r, const Field *fd, Val *v) {
    if (fd->kind == P_SKIP) {
        if (v != NULL) v->present = 0;
        return skip_value(r, fd->plan, 1);
    }
    const char *err = field_at(fd, r->buf, &r->pos, r->len, v);
    return err != NULL ? bad(err) : 0;
}

/* One record of `item` at r: the values of role fields into vals (vals NULL: all stepped
   over), with the position kept in a local (r is written back once). */
static int record_fields(Reader *r, const Program *item, Val *vals) {
    const unsigned char *buf = r->buf;
    Py_ssize_t pos = r->pos, len = r->len;
    for (Py_ssize_t i = 0; i < item->n; i++) {
        const Field *fd = &item->f[i];
        Val *v = vals != NULL && fd->role ? &vals[fd->role] : NULL;
        if (fd->kind == P_SKIP) {
            r->pos = pos;
            if (read_field(r, fd, v) < 0) return -1;
            pos = r->pos;
            continue;
        }
        const char *err = field_at(fd, buf, &pos, len, v);
        if (err != NULL) {
            r->pos = pos;
            return bad(err);
        }
    }
    r->pos = pos;
    return 0;
}

/* Items of an array of records read with `item` (each item's values go to vals, then to visit
   when given); returns the item count or -1. */
typedef int (*visit_fn)(void *ctx, Val *vals);

static Py_ssize_t read_array(Reader *r, const Program *item, Val *vals, Py_ssize_t nvals,
                             visit_fn visit, void *ctx) {
    Py_ssize_t total = 0;
    while (1) {
        Py_ssize_t n = next_block(r);
        if (n < 0) return -1;
        if (n == 0) return total;
        for (Py_ssize_t k = 0; k < n; k++) {
            if (visit == NULL) { /* only stepping over */
                if (record_fields(r, item, NULL) < 0) return -1;
                total++;
                continue;
            }
            for (Py_ssize_t j = 0; j < nvals; j++) vals[j].present = 0;
            if (record_fields(r, item, vals) < 0) return -1;
            if (visit(ctx, vals) < 0) return -1;
            total++;
        }
    }
}

/* Grows *arr (zero-filled) to hold at least need items of size; -1 with MemoryError. */
static int grow(void **arr, Py_ssize_t *cap, Py_ssize_t need, size_t size) {
    if (need <= *cap) return 0;
    Py_ssize_t cap2 = *cap ? *cap : 4;
    while (cap2 < need) cap2 *= 2;
    void *p = PyMem_Realloc(*arr, cap2 * size);
    if (p == NULL) return PyErr_NoMemory(), -1;
    memset((char *)p + *cap * size, 0, (cap2 - *cap) * size);
    *arr = p;
    *cap = cap2;
    return 0;
}

/* ---- SampleIndex --------------------------------------------------------------------------- */

typedef struct {
    int64_t ts;
    int64_t seq;
    Py_ssize_t off;
    int32_t node;
    int32_t block;
} Entry;

typedef struct {
    PyObject_HEAD
    Program top;
    Program gpu;
    Py_ssize_t xid_item; /* index of the xids field in top, -1 if none */
    Program xid;         /* XidEvent fields (all skipped) */
    int64_t lost_state;  /* enum index of LOST, -1 if none */
    PyObject *blocks;    /* list of bytes (None once compact() dropped every sample of one) */
    Py_ssize_t *refs;    /* per block: samples still held */
    Py_ssize_t cap_refs;
    Entry *e;            /* [released, sorted | pending, in read order] */
    Py_ssize_t n, cap;
    Py_ssize_t n_rel;    /* entries released (sorted, consumable) */
    int64_t next_seq;    /* read order of the next sample */
    int64_t released_below; /* every sample under this time is released; later ones must not be */
    int has_max;
    int64_t max_ts;      /* highest time added */
} SampleIndex;

static PyTypeObject SampleIndexType;

/* Steps over one sample at r (validating it); fills node (new reference) and ts. */
static int scan_sample(SampleIndex *ix, Reader *r, PyObject **node, int64_t *ts) {
    Val v = {0}, gv[G_ROLES];
    int have_ts = 0;
    *node = NULL;
    for (Py_ssize_t i = 0; i < ix->top.n; i++) {
        const Field *fd = &ix->top.f[i];
        if (fd->role == S_GPUS) {
            if (read_array(r, &ix->gpu, gv, G_ROLES, NULL, NULL) < 0) goto fail;
        } else if (fd->role == S_XIDS) {
            Val xv[1];
            if (read_array(r, &ix->xid, xv, 0, NULL, NULL) < 0) goto fail;
        } else if (fd->role == S_NONE) {
            if (read_field(r, fd, NULL) < 0) goto fail;
        } else {
            if (read_field(r, fd, &v) < 0) goto fail;
            if (fd->role == S_NODE && v.present) {
                Py_XDECREF(*node);
                *node = PyUnicode_DecodeUTF8((const char *)r->buf + v.off, v.len, NULL);
                if (*node == NULL) goto fail;
            } else if (fd->role == S_TS && v.present) {
                *ts = v.i;
                have_ts = 1;
            }
        }
    }
    if (*node == NULL || !have_ts) {
        bad("sample without node or ts_ms");
        goto fail;
    }
    return 0;
fail:
    Py_CLEAR(*node);
    return -1;
}

static int SampleIndex_init(SampleIndex *self, PyObject *args, PyObject *kw) {
    PyObject *top, *gpu, *xid;
    long long lost;
    if (!PyArg_ParseTuple(args, "OOOL", &top, &gpu, &xid, &lost)) return -1;
    program_free(&self->top);
    program_free(&self->gpu);
    program_free(&self->xid);
    if (program_init(&self->top, top, S_XIDS + 1) < 0) return -1;
    if (program_init(&self->gpu, gpu, G_ROLES) < 0) return -1;
    if (program_init(&self->xid, xid, 1) < 0) return -1;
    self->lost_state = lost;
    self->xid_item = -1;
    int seen_node = 0, seen_ts = 0, seen_gpus = 0;
    for (Py_ssize_t i = 0; i < self->top.n; i++) {
        int role = self->top.f[i].role;
        if ((role == S_NODE || role == S_TS) && self->top.f[i].kind == P_SKIP) {
            PyErr_SetString(PyExc_ValueError, "program: node and ts_ms must be primitive");
            return -1;
        }
        if (role == S_NODE) seen_node = 1;
        if (role == S_TS) seen_ts = 1;
        if (role == S_GPUS) {
            if (!seen_node || !seen_ts) {
                PyErr_SetString(PyExc_ValueError, "program: node and ts_ms must precede gpus");
                return -1;
            }
            seen_gpus = 1;
        }
        if (role == S_XIDS) {
            if (!seen_gpus) {
                PyErr_SetString(PyExc_ValueError, "program: xids must follow gpus");
                return -1;
            }
            self->xid_item = i;
        }
    }
    if (!seen_gpus) {
        PyErr_SetString(PyExc_ValueError, "program: no gpus field");
        return -1;
    }
    Py_XSETREF(self->blocks, PyList_New(0));
    self->n = self->n_rel = 0;
    self->next_seq = 0;
    self->released_below = FAR_PAST;
    self->has_max = 0;
    return self->blocks == NULL ? -1 : 0;
}

static void SampleIndex_dealloc(SampleIndex *self) {
    program_free(&self->top);
    program_free(&self->gpu);
    program_free(&self->xid);
    Py_XDECREF(self->blocks);
    PyMem_Free(self->e);
    PyMem_Free(self->refs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Unordered; /* exception: a sample older than what was already released */

/* add_block(data, count, from_ms, to_ms, node_ids, keep) -> samples added. All or nothing: a
   malformed block raises ValueError and adds none of its samples; a sample under
   released_below (see release()) raises Unordered. */
static PyObject *SampleIndex_add_block(SampleIndex *self, PyObject *args) {
    PyObject *data, *node_ids, *keep;
    Py_ssize_t count;
    long long lo, hi;
    if (!PyArg_ParseTuple(args, "SnLLO!O", &data, &count, &lo, &hi, &PyDict_Type, &node_ids,
                          &keep))
        return NULL;
    if (keep != Py_None && !PyAnySet_Check(keep)) {
        PyErr_SetString(PyExc_TypeError, "keep: a set or None");
        return NULL;
    }
    Py_ssize_t block = PyList_GET_SIZE(self->blocks);
    if (block > INT32_MAX) return PyErr_Format(PyExc_OverflowError, "too many blocks");
    Py_ssize_t before = self->n;
    int64_t seq0 = self->next_seq;
    int64_t max_ts = self->max_ts;
    int has_max = self->has_max;
    Reader r = {(const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), 0};
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t start = r.pos;
        PyObject *node;
        int64_t ts = 0;
        if (scan_sample(self, &r, &node, &ts) < 0) goto fail;
        int wanted = ts >= lo && ts < hi;
        if (wanted && keep != Py_None) {
            wanted = PySet_Contains(keep, node);
            if (wanted < 0) {
                Py_DECREF(node);
                goto fail;
            }
        }
        if (!wanted) {
            Py_DECREF(node);
            continue;
        }
        if (ts < self->released_below) {
            Py_DECREF(node);
            PyErr_Format(Unordered, "a sample at %lld after samples up to %lld were released",
                         (long long)ts, (long long)self->released_below);
            goto fail;
        }
        PyObject *id = PyDict_GetItemWithError(node_ids, node);
        long node_id;
        if (id == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(node);
                goto fail;
            }
            node_id = (long)PyDict_GET_SIZE(node_ids);
            PyObject *nid = PyLong_FromLong(node_id);
            int rc = nid == NULL ? -1 : PyDict_SetItem(node_ids, node, nid);
            Py_XDECREF(nid);
            if (rc < 0) {
                Py_DECREF(node);
                goto fail;
            }
        } else {
            node_id = PyLong_AsLong(id);
        }
        Py_DECREF(node);
        if (node_id < 0 || node_id > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "node ids: ints from 0");
            goto fail;
        }
        if (self->n == self->cap) {
            Py_ssize_t cap = self->cap ? self->cap * 2 : 4096;
            Entry *e = PyMem_Realloc(self->e, cap * sizeof(Entry));
            if (e == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            self->e = e;
            self->cap = cap;
        }
        Entry *e = &self->e[self->n];
        e->ts = ts;
        e->seq = self->next_seq++;
        e->off = start;
        e->node = (int32_t)node_id;
        e->block = (int32_t)block;
        self->n++;
        if (!has_max || ts > max_ts) {
            max_ts = ts;
            has_max = 1;
        }
    }
    if (r.pos != r.len) {
        PyErr_Format(PyExc_ValueError, "%zd trailing bytes in a block", r.len - r.pos);
        goto fail;
    }
    if (grow((void **)&self->refs, &self->cap_refs, block + 1, sizeof(Py_ssize_t)) < 0) goto fail;
    if (PyList_Append(self->blocks, self->n > before ? data : Py_None) < 0) goto fail;
    self->refs[block] = self->n - before;
    self->max_ts = max_ts;
    self->has_max = has_max;
    return PyLong_FromSsize_t(self->n - before);
fail:
    self->n = before;
    self->next_seq = seq0;
    return NULL;
}

static const int32_t *sort_ranks; /* during sort() only (the GIL is held) */

static int entry_cmp(const void *pa, const void *pb) {
    const Entry *a = pa, *b = pb;
    if (a->ts != b->ts) return a->ts < b->ts ? -1 : 1;
    int32_t ra = sort_ranks[a->node], rb = sort_ranks[b->node];
    if (ra != rb) return ra < rb ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* release(threshold, ranks): the pending samples under threshold join the released ones, in
   replay order (time, then ranks[node id], the rank of the node's name, then read order);
   returns how many are released. Samples under threshold may not be added any more. */
static PyObject *SampleIndex_release(SampleIndex *self, PyObject *args) {
    long long threshold;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "Ly*", &threshold, &view)) return NULL;
    Py_ssize_t nranks = view.len / (Py_ssize_t)sizeof(int32_t);
    for (Py_ssize_t i = self->n_rel; i < self->n; i++) {
        if (self->e[i].node >= nranks) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "ranks: fewer than node ids");
            return NULL;
        }
    }
    /* Pending entries under the threshold to the front of the pending part, then sorted. */
    Py_ssize_t k = self->n_rel;
    for (Py_ssize_t i = self->n_rel; i < self->n; i++) {
        if (self->e[i].ts < threshold) {
            Entry tmp = self->e[k];
            self->e[k++] = self->e[i];
            self->e[i] = tmp;
        }
    }
    sort_ranks = (const int32_t *)view.buf;
    qsort(self->e + self->n_rel, (size_t)(k - self->n_rel), sizeof(Entry), entry_cmp);
    sort_ranks = NULL;
    PyBuffer_Release(&view);
    Py_ssize_t got = k - self->n_rel;
    self->n_rel = k;
    if (threshold > self->released_below) self->released_below = threshold;
    return PyLong_FromSsize_t(got);
}

/* compact(upto): forget the released samples at positions < upto (consumed); blocks left
   without samples are dropped. Positions after them move down by upto. */
static PyObject *SampleIndex_compact(SampleIndex *self, PyObject *arg) {
    Py_ssize_t upto = PyLong_AsSsize_t(arg);
    if (upto == -1 && PyErr_Occurred()) return NULL;
    if (upto < 0 || upto > self->n_rel) {
        PyErr_SetString(PyExc_IndexError, "compact: beyond the released samples");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < upto; i++) {
        int32_t b = self->e[i].block;
        if (--self->refs[b] == 0) {
            Py_INCREF(Py_None);
            if (PyList_SetItem(self->blocks, b, Py_None) < 0) return NULL;
        }
    }
    memmove(self->e, self->e + upto, (size_t)(self->n - upto) * sizeof(Entry));
    self->n -= upto;
    self->n_rel -= upto;
    Py_RETURN_NONE;
}

static PyObject *SampleIndex_get_pending(SampleIndex *self, void *closure) {
    return PyLong_FromSsize_t(self->n - self->n_rel);
}

static PyObject *SampleIndex_get_max_ts(SampleIndex *self, void *closure) {
    if (!self->has_max) Py_RETURN_NONE;
    return PyLong_FromLongLong(self->max_ts);
}

static PyObject *SampleIndex_get_released_below(SampleIndex *self, void *closure) {
    return PyLong_FromLongLong(self->released_below);
}

static PyGetSetDef SampleIndex_getset[] = {
    {"pending", (getter)SampleIndex_get_pending, NULL, "samples added, not yet released", NULL},
    {"max_ts", (getter)SampleIndex_get_max_ts, NULL, "highest sample time added, or None", NULL},
    {"released_below", (getter)SampleIndex_get_released_below, NULL,
     "every sample under this time is released", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* bisect(ts) -> the first position whose time is >= ts (after sort). */
static PyObject *SampleIndex_bisect(SampleIndex *self, PyObject *arg) {
    long long ts = PyLong_AsLongLong(arg);
    if (ts == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t lo = 0, hi = self->n_rel;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (self->e[mid].ts < ts) lo = mid + 1;
        else hi = mid;
    }
    return PyLong_FromSsize_t(lo);
}

static int check_pos(SampleIndex *self, Py_ssize_t i) {
    if (i < 0 || i >= self->n) {
        PyErr_SetString(PyExc_IndexError, "sample position out of range");
        return -1;
    }
    return 0;
}

/* location(i) -> (block bytes, offset, node id, ts) of the sample at position i. */
static PyObject *SampleIndex_location(SampleIndex *self, PyObject *arg) {
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (check_pos(self, i) < 0) return NULL;
    Entry *e = &self->e[i];
    return Py_BuildValue("(OnlL)", PyList_GET_ITEM(self->blocks, e->block), e->off, (long)e->node,
                         (long long)e->ts);
}

/* len(): the released samples (positions a SampleRun may use). */
static Py_ssize_t SampleIndex_len(SampleIndex *self) { return self->n_rel; }

static PyMethodDef SampleIndex_methods[] = {
    {"add_block", (PyCFunction)SampleIndex_add_block, METH_VARARGS,
     "add_block(data, count, from_ms, to_ms, node_ids, keep) -> samples added"},
    {"release", (PyCFunction)SampleIndex_release, METH_VARARGS,
     "release(threshold, ranks) -> samples released, in replay order"},
    {"compact", (PyCFunction)SampleIndex_compact, METH_O,
     "compact(upto): forget consumed samples, drop emptied blocks"},
    {"bisect", (PyCFunction)SampleIndex_bisect, METH_O, "bisect(ts) -> first position >= ts"},
    {"location", (PyCFunction)SampleIndex_location, METH_O,
     "location(i) -> (block, offset, node id, ts)"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods SampleIndex_seq = {.sq_length = (lenfunc)SampleIndex_len};

static PyTypeObject SampleIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "peerwatch.streams._replay_native.SampleIndex",
    .tp_basicsize = sizeof(SampleIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SampleIndex(top, gpu, xid, lost_state): the samples of a replay hour",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)SampleIndex_init,
    .tp_dealloc = (destructor)SampleIndex_dealloc,
    .tp_methods = SampleIndex_methods,
    .tp_getset = SampleIndex_getset,
    .tp_as_sequence = &SampleIndex_seq,
};

/* ---- Windows ------------------------------------------------------------------------------- */

enum { H_ENERGY = 1, H_THR = 2, H_CAP = 4, H_ECC = 8, H_NVL = 16, H_PCIE = 32 };

typedef struct {
    int32_t idx;
    int has; /* H_* */
    int64_t ts, energy, thr, cap, ecc, nvl, pcie;
} Prev;

typedef struct {
    int32_t job, idx;
    PyObject *uuid; /* NULL = None */
    int64_t n, clk_n, sm_n, pw_n, pr_n, energy_n;
    double clk_s, sm_s, pw_s, pr_s;
    int has_temp, has_wmin, has_wmax;
    int64_t temp, wmin, wmax;
    int64_t energy, thr_ns, thr_dt, cap_ns, cap_dt, bits_n, thr_bits, cap_bits, ecc, nvl, pcie;
    int remap_p, remap_f, lost;
    int64_t *xids;
    Py_ssize_t nx, capx;
} Acc;

typedef struct {
    int64_t start;
    Acc *a;
    Py_ssize_t n, cap;
} Bucket;

typedef struct {
    int valid, hi_open;
    int64_t lo, hi;
    int32_t *own_idx, *own_job;
    Py_ssize_t n_own;
    int32_t idle_job;
    Prev *prev;
    Py_ssize_t n_prev, cap_prev;
    Bucket *b;
    Py_ssize_t n_b, cap_b;
} Node;

typedef struct {
    PyObject_HEAD
    int64_t window_ms;
    int idle;
    PyObject *segment; /* (node id, ts) -> (((gpu, job id), ...), lo, hi or None, idle job id) */
    PyObject *jobs;    /* list: job id -> job name (grown by the caller) */
    PyTypeObject *acc_type; /* a tuple subclass with the acc fields (a namedtuple) */
    Node *nodes;
    Py_ssize_t n_nodes;
    int has_max;
    int64_t max_ts, readings, unattributed;
} Windows;

static void acc_clear(Acc *a) {
    Py_CLEAR(a->uuid);
    PyMem_Free(a->xids);
    a->xids = NULL;
}

static void bucket_clear(Bucket *b) {
    for (Py_ssize_t i = 0; i < b->n; i++) acc_clear(&b->a[i]);
    PyMem_Free(b->a);
    b->a = NULL;
    b->n = b->cap = 0;
}

static void node_clear(Node *ns) {
    for (Py_ssize_t i = 0; i < ns->n_b; i++) bucket_clear(&ns->b[i]);
    PyMem_Free(ns->b);
    PyMem_Free(ns->prev);
    PyMem_Free(ns->own_idx);
    PyMem_Free(ns->own_job);
    memset(ns, 0, sizeof(Node));
}


static Node *node_at(Windows *self, int32_t id) {
    if (id >= self->n_nodes && grow((void **)&self->nodes, &self->n_nodes, id + 1, sizeof(Node)) < 0)
        return NULL;
    return &self->nodes[id];
}

static int64_t floor_mod(int64_t a, int64_t m) {
    int64_t r = a % m;
    return r < 0 ? r + m : r;
}

/* The bucket of window `start` (created when absent); its index, or -1. */
static Py_ssize_t bucket_of(Node *ns, int64_t start) {
    for (Py_ssize_t i = 0; i < ns->n_b; i++)
        if (ns->b[i].start == start) return i;
    if (grow((void **)&ns->b, &ns->cap_b, ns->n_b + 1, sizeof(Bucket)) < 0) return -1;
    Bucket *b = &ns->b[ns->n_b];
    memset(b, 0, sizeof(Bucket));
    b->start = start;
    return ns->n_b++;
}

/* The acc of (job, idx) in b; created (with uuid, a new reference or NULL) when absent. */
static Acc *acc_of(Bucket *b, int32_t job, int32_t idx, PyObject *uuid, int *created) {
    *created = 0;
    for (Py_ssize_t i = 0; i < b->n; i++)
        if (b->a[i].idx == idx && b->a[i].job == job) return &b->a[i];
    if (grow((void **)&b->a, &b->cap, b->n + 1, sizeof(Acc)) < 0) return NULL;
    Acc *a = &b->a[b->n++];
    memset(a, 0, sizeof(Acc));
    a->job = job;
    a->idx = idx;
    *created = 1;
    return a;
}

static Prev *prev_of(Node *ns, int32_t idx) {
    for (Py_ssize_t i = 0; i < ns->n_prev; i++)
        if (ns->prev[i].idx == idx) return &ns->prev[i];
    if (grow((void **)&ns->prev, &ns->cap_prev, ns->n_prev + 1, sizeof(Prev)) < 0) return NULL;
    Prev *p = &ns->prev[ns->n_prev++];
    memset(p, 0, sizeof(Prev));
    p->idx = idx;
    p->ts = -1;
    return p;
}

static int lookup_segment(Windows *self, Node *ns, int32_t node_id, int64_t ts) {
    PyObject *res = PyObject_CallFunction(self->segment, "lL", (long)node_id, (long long)ts);
    if (res == NULL) return -1;
    PyObject *pairs, *hi;
    long long lo;
    int idle;
    if (!PyArg_ParseTuple(res, "O!LOi", &PyTuple_Type, &pairs, &lo, &hi, &idle)) {
        Py_DECREF(res);
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(pairs);
    int32_t *oi = PyMem_Malloc((n ? n : 1) * sizeof(int32_t));
    int32_t *oj = PyMem_Malloc((n ? n : 1) * sizeof(int32_t));
    if (oi == NULL || oj == NULL) {
        PyMem_Free(oi);
        PyMem_Free(oj);
        Py_DECREF(res);
        return PyErr_NoMemory(), -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int gi, gj;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(pairs, i), "ii", &gi, &gj)) {
            PyMem_Free(oi);
            PyMem_Free(oj);
            Py_DECREF(res);
            return -1;
        }
        oi[i] = gi;
        oj[i] = gj;
    }
    long long hv = 0;
    if (hi != Py_None) {
        hv = PyLong_AsLongLong(hi);
        if (hv == -1 && PyErr_Occurred()) {
            PyMem_Free(oi);
            PyMem_Free(oj);
            Py_DECREF(res);
            return -1;
        }
    }
    PyMem_Free(ns->own_idx);
    PyMem_Free(ns->own_job);
    ns->own_idx = oi;
    ns->own_job = oj;
    ns->n_own = n;
    ns->lo = lo;
    ns->hi = hv;
    ns->hi_open = hi == Py_None;
    ns->idle_job = idle;
    ns->valid = 1;
    Py_DECREF(res);
    return 0;
}

#define OVERFLOW() (PyErr_SetString(PyExc_OverflowError, "value beyond the native aggregator"), -1)
#define ADD(dst, v)                                                                             \
    do {                                                                                        \
        if (__builtin_add_overflow((dst), (v), &(dst))) return OVERFLOW();                      \
    } while (0)

static int64_t delta(int64_t new, int64_t old, int *err) {
    int64_t d;
    if (new < old) return new; /* a reset counter restarts at zero */
    if (__builtin_sub_overflow(new, old, &d)) *err = 1;
    return d;
}

/* Sums of the present values of roles (None when none is present); -1 on overflow. */
static int sum_roles(const Val *v, const int *roles, int n, int *has, int64_t *out) {
    *has = 0;
    *out = 0;
    for (int i = 0; i < n; i++) {
        if (!v[roles[i]].present) continue;
        if (*has) ADD(*out, v[roles[i]].i);
        else *out = v[roles[i]].i;
        *has = 1;
    }
    return 0;
}

typedef struct {
    Windows *w;
    SampleIndex *ix;
    Node *ns;
    Bucket *bucket;
    const unsigned char *buf;
    int64_t ts;
} GpuCtx;

static int exact(int64_t v) { return v > -EXACT_LIMIT && v < EXACT_LIMIT; }

/* One GPU reading: WindowAggregator.add_batch's inner loop, step for step. */
static int add_gpu(void *vctx, Val *v) {
    GpuCtx *c = vctx;
    Windows *w = c->w;
    Node *ns = c->ns;
    int64_t ts = c->ts;
    if (!v[G_INDEX].present) return bad("GPU reading without index");
    if (v[G_INDEX].i < INT32_MIN || v[G_INDEX].i > INT32_MAX) return OVERFLOW();
    int32_t idx = (int32_t)v[G_INDEX].i;
    w->readings++;
    Prev *p = prev_of(ns, idx);
    if (p == NULL) return -1;
    int32_t owner = -1;
    for (Py_ssize_t i = 0; i < ns->n_own; i++) {
        if (ns->own_idx[i] == idx) {
            owner = ns->own_job[i];
            break;
        }
    }
    if (owner < 0 && w->idle) owner = ns->idle_job;
    Acc *acc = NULL;
    if (owner >= 0) {
        int created;
        acc = acc_of(c->bucket, owner, idx, NULL, &created);
        if (acc == NULL) return -1;
        if (created && v[G_UUID].present) {
            acc->uuid = PyUnicode_DecodeUTF8((const char *)c->buf + v[G_UUID].off,
                                             v[G_UUID].len, NULL);
            if (acc->uuid == NULL) return -1;
        }
        acc->n++;
    } else {
        w->unattributed++;
    }
    if (v[G_STATE].present && v[G_STATE].i == c->ix->lost_state) {
        if (acc != NULL) acc->lost = 1;
        return 0; /* every quantity is null; keep the counters of the last good read */
    }
    static const int thr_roles[] = {G_SLOW_NS, G_SWTH_NS, G_HWTH_NS, G_BRAKE_NS};
    static const int nvl_roles[] = {G_NVL_REPLAY, G_NVL_RECOVERY, G_NVL_CRC};
    int has_thr, has_nvl;
    int64_t thr, nvl;
    if (sum_roles(v, thr_roles, 4, &has_thr, &thr) < 0) return -1;
    if (sum_roles(v, nvl_roles, 3, &has_nvl, &nvl) < 0) return -1;
    const Val *energy = &v[G_ENERGY], *cap = &v[G_CAP_NS], *ecc = &v[G_ECC_U];
    const Val *pcie = &v[G_PCIE_REPLAY];
    if (acc != NULL) {
        const Val *clk = &v[G_CLK], *mx = &v[G_CLK_MAX];
        if (clk->present && mx->present && mx->i != 0) {
            if (!exact(clk->i) || !exact(mx->i)) return OVERFLOW();
            acc->clk_s += (double)clk->i / (double)mx->i;
            acc->clk_n++;
        }
        const Val *sm = v[G_SM].present ? &v[G_SM] : &v[G_UTIL];
        if (sm->present) {
            if (!sm->is_float && !exact(sm->i)) return OVERFLOW();
            acc->sm_s += sm->is_float ? sm->f : (double)sm->i;
            acc->sm_n++;
        }
        const Val *pw = &v[G_POWER];
        if (pw->present) {
            if (!exact(pw->i)) return OVERFLOW();
            acc->pw_s += (double)pw->i;
            acc->pw_n++;
            const Val *lim = &v[G_PLIMIT];
            if (lim->present && lim->i != 0) {
                if (!exact(lim->i)) return OVERFLOW();
                acc->pr_s += (double)pw->i / (double)lim->i;
                acc->pr_n++;
            }
        }
        const Val *t = &v[G_TEMP];
        if (t->present && (!acc->has_temp || t->i > acc->temp)) {
            acc->temp = t->i;
            acc->has_temp = 1;
        }
        const Val *reasons = &v[G_REASONS];
        if (reasons->present) {
            acc->bits_n++;
            if (reasons->i & THROTTLE_BITS) acc->thr_bits++;
            if (reasons->i & POWER_CAP_BIT) acc->cap_bits++;
        }
        const Val *wd = &v[G_WIDTH];
        if (wd->present && (!acc->has_wmin || wd->i < acc->wmin)) {
            acc->wmin = wd->i;
            acc->has_wmin = 1;
        }
        wd = &v[G_WIDTH_MAX];
        if (wd->present && (!acc->has_wmax || wd->i > acc->wmax)) {
            acc->wmax = wd->i;
            acc->has_wmax = 1;
        }
        if (v[G_REMAP_P].present && v[G_REMAP_P].i) acc->remap_p = 1;
        if (v[G_REMAP_F].present && v[G_REMAP_F].i) acc->remap_f = 1;
        if (ts > p->ts && p->ts >= 0) {
            int64_t dt_ns, d;
            int err = 0;
            if (__builtin_sub_overflow(ts, p->ts, &dt_ns)
                || __builtin_mul_overflow(dt_ns, (int64_t)1000000, &dt_ns))
                return OVERFLOW();
            if (energy->present && (p->has & H_ENERGY)) {
                ADD(acc->energy, delta(energy->i, p->energy, &err));
                acc->energy_n++;
            }
            if (has_thr && (p->has & H_THR)) {
                if (__builtin_sub_overflow(thr, p->thr, &d)) return OVERFLOW();
                ADD(acc->thr_ns, d < 0 ? 0 : d > dt_ns ? dt_ns : d);
                ADD(acc->thr_dt, dt_ns);
            }
            if (cap->present && (p->has & H_CAP)) {
                if (__builtin_sub_overflow(cap->i, p->cap, &d)) return OVERFLOW();
                ADD(acc->cap_ns, d < 0 ? 0 : d > dt_ns ? dt_ns : d);
                ADD(acc->cap_dt, dt_ns);
            }
            if (ecc->present && (p->has & H_ECC) && ecc->i != p->ecc)
                ADD(acc->ecc, delta(ecc->i, p->ecc, &err));
            if (has_nvl && (p->has & H_NVL) && nvl != p->nvl)
                ADD(acc->nvl, delta(nvl, p->nvl, &err));
            if (pcie->present && (p->has & H_PCIE) && pcie->i != p->pcie)
                ADD(acc->pcie, delta(pcie->i, p->pcie, &err));
            if (err) return OVERFLOW();
        }
    }
    if (ts > p->ts) {
        p->ts = ts;
        p->has = (energy->present ? H_ENERGY : 0) | (has_thr ? H_THR : 0)
                 | (cap->present ? H_CAP : 0) | (ecc->present ? H_ECC : 0)
                 | (has_nvl ? H_NVL : 0) | (pcie->present ? H_PCIE : 0);
        p->energy = energy->i;
        p->thr = thr;
        p->cap = cap->i;
        p->ecc = ecc->i;
        p->nvl = nvl;
        p->pcie = pcie->i;
    }
    return 0;
}

/* One sample (not late): node state, owners, bucket, then every GPU; *xids = its XID count. */
static int add_sample(Windows *self, SampleIndex *ix, Entry *e, Py_ssize_t *xids) {
    PyObject *block = PyList_GET_ITEM(ix->blocks, e->block);
    Reader r = {(const unsigned char *)PyBytes_AS_STRING(block), PyBytes_GET_SIZE(block), e->off};
    int64_t ts = e->ts;
    if (!self->has_max || ts > self->max_ts) {
        self->max_ts = ts;
        self->has_max = 1;
    }
    Node *ns = node_at(self, e->node);
    if (ns == NULL) return -1;
    if (!ns->valid || ts < ns->lo || (!ns->hi_open && ts >= ns->hi)) {
        if (lookup_segment(self, ns, e->node, ts) < 0) return -1;
    }
    Py_ssize_t bi = bucket_of(ns, ts - floor_mod(ts, self->window_ms));
    if (bi < 0) return -1;
    GpuCtx ctx = {self, ix, ns, &ns->b[bi], r.buf, ts};
    Val gv[G_ROLES];
    *xids = 0;
    for (Py_ssize_t i = 0; i < ix->top.n; i++) {
        const Field *fd = &ix->top.f[i];
        if (fd->role == S_GPUS) {
            if (read_array(&r, &ix->gpu, gv, G_ROLES, add_gpu, &ctx) < 0) return -1;
        } else if (fd->role == S_XIDS) {
            Val xv[1];
            *xids = read_array(&r, &ix->xid, xv, 0, NULL, NULL);
            if (*xids < 0) return -1;
            return 0; /* nothing after the xids is used */
        } else if (read_field(&r, fd, NULL) < 0) {
            return -1; /* node and ts_ms are known from the index */
        }
    }
    return 0;
}

static int Windows_init(Windows *self, PyObject *args, PyObject *kw) {
    long long window_ms;
    int idle;
    PyObject *segment, *jobs, *acc_type;
    if (!PyArg_ParseTuple(args, "LpOO!O!", &window_ms, &idle, &segment, &PyList_Type, &jobs,
                          &PyType_Type, &acc_type))
        return -1;
    if (!PyType_IsSubtype((PyTypeObject *)acc_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "acc_type: a tuple subclass");
        return -1;
    }
    if (window_ms <= 0) {
        PyErr_SetString(PyExc_ValueError, "window_ms must be > 0");
        return -1;
    }
    self->window_ms = window_ms;
    self->idle = idle;
    Py_INCREF(segment);
    Py_XSETREF(self->segment, segment);
    Py_INCREF(jobs);
    Py_XSETREF(self->jobs, jobs);
    Py_INCREF(acc_type);
    Py_XSETREF(self->acc_type, (PyTypeObject *)acc_type);
    return 0;
}

static void Windows_dealloc(Windows *self) {
    for (Py_ssize_t i = 0; i < self->n_nodes; i++) node_clear(&self->nodes[i]);
    PyMem_Free(self->nodes);
    Py_XDECREF(self->segment);
    Py_XDECREF(self->jobs);
    Py_XDECREF(self->acc_type);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

enum { F_DRAIN = 1, F_XIDS = 2, F_LATE = 4 };

/* feed(index, lo, hi, closed, next_close, max_batch, count) -> (pos, count, flags).
   Takes the samples at positions lo.. of the index as Pipeline.feed takes them one by one, and
   returns after the first one that is late (F_LATE: not aggregated), carries XIDs (F_XIDS), or
   makes the pipeline drain (F_DRAIN: ts >= next_close or count >= max_batch), else at hi. */
static PyObject *Windows_feed(Windows *self, PyObject *args) {
    SampleIndex *ix;
    Py_ssize_t lo, hi, max_batch, count;
    long long closed, next_close;
    if (!PyArg_ParseTuple(args, "O!nnLLnn", &SampleIndexType, &ix, &lo, &hi, &closed,
                          &next_close, &max_batch, &count))
        return NULL;
    if (lo < 0 || hi > ix->n_rel || lo > hi) {
        PyErr_SetString(PyExc_IndexError, "feed: positions outside the index");
        return NULL;
    }
    int flags = 0;
    Py_ssize_t pos = lo;
    while (pos < hi && !flags) {
        Entry *e = &ix->e[pos++];
        count++;
        if (e->ts < closed) {
            flags |= F_LATE;
        } else {
            Py_ssize_t xids;
            if (add_sample(self, ix, e, &xids) < 0) return NULL;
            if (xids) flags |= F_XIDS;
        }
        if (e->ts >= next_close || count >= max_batch) flags |= F_DRAIN;
    }
    return Py_BuildValue("(nni)", pos, count, flags);
}

/* add_xid(node id, window start, job id, gpu index, xid): WindowAggregator._put_xid. */
static PyObject *Windows_add_xid(Windows *self, PyObject *args) {
    int node_id, job, idx;
    long long start, xid;
    if (!PyArg_ParseTuple(args, "iLiiL", &node_id, &start, &job, &idx, &xid)) return NULL;
    if (node_id < 0) return PyErr_Format(PyExc_ValueError, "bad node id");
    Node *ns = node_at(self, node_id);
    if (ns == NULL) return NULL;
    Py_ssize_t bi = bucket_of(ns, start);
    if (bi < 0) return NULL;
    int created;
    Acc *a = acc_of(&ns->b[bi], job, idx, NULL, &created);
    if (a == NULL) return NULL;
    if (grow((void **)&a->xids, &a->capx, a->nx + 1, sizeof(int64_t)) < 0) return NULL;
    a->xids[a->nx++] = xid;
    Py_RETURN_NONE;
}

static PyObject *opt_long(int has, int64_t v) {
    if (has) return PyLong_FromLongLong(v);
    Py_RETURN_NONE;
}

/* (node id, start, acc) with acc an acc_type of WindowAggregator's _ACC_FIELDS. */
static PyObject *acc_tuple(Windows *self, int32_t node, int64_t start, Acc *a) {
    if (a->job < 0 || a->job >= PyList_GET_SIZE(self->jobs)) {
        PyErr_SetString(PyExc_IndexError, "job id without a name");
        return NULL;
    }
    PyObject *xids = PyList_New(a->nx);
    if (xids == NULL) return NULL;
    for (Py_ssize_t i = 0; i < a->nx; i++) {
        PyObject *x = PyLong_FromLongLong(a->xids[i]);
        if (x == NULL) {
            Py_DECREF(xids);
            return NULL;
        }
        PyList_SET_ITEM(xids, i, x);
    }
    PyObject *values = Py_BuildValue(
        "(OiOLdLdLdLdLNLLLLLLLLLLLLNNNNNN)", PyList_GET_ITEM(self->jobs, a->job), a->idx,
        a->uuid ? a->uuid : Py_None, (long long)a->n, a->clk_s, (long long)a->clk_n, a->sm_s,
        (long long)a->sm_n, a->pw_s, (long long)a->pw_n, a->pr_s, (long long)a->pr_n,
        opt_long(a->has_temp, a->temp), (long long)a->energy, (long long)a->energy_n,
        (long long)a->thr_ns, (long long)a->thr_dt, (long long)a->cap_ns, (long long)a->cap_dt,
        (long long)a->bits_n, (long long)a->thr_bits, (long long)a->cap_bits, (long long)a->ecc,
        (long long)a->nvl, (long long)a->pcie, opt_long(a->has_wmin, a->wmin),
        opt_long(a->has_wmax, a->wmax), PyBool_FromLong(a->remap_p),
        PyBool_FromLong(a->remap_f), PyBool_FromLong(a->lost), xids);
    if (values == NULL) return NULL;
    PyObject *args = PyTuple_Pack(1, values);
    Py_DECREF(values);
    if (args == NULL) return NULL;
    PyObject *acc = PyTuple_Type.tp_new(self->acc_type, args, NULL);
    Py_DECREF(args);
    if (acc == NULL) return NULL;
    return Py_BuildValue("(lLN)", (long)node, (long long)start, acc);
}

/* pop(watermark) -> (node id, start, acc) of every window ending at or before watermark (None:
   every window), removed from the state. */
static PyObject *Windows_pop(Windows *self, PyObject *arg) {
    int all = arg == Py_None;
    long long wm = 0;
    if (!all) {
        wm = PyLong_AsLongLong(arg);
        if (wm == -1 && PyErr_Occurred()) return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (Py_ssize_t ni = 0; ni < self->n_nodes; ni++) {
        Node *ns = &self->nodes[ni];
        Py_ssize_t keep = 0;
        for (Py_ssize_t bi = 0; bi < ns->n_b; bi++) {
            Bucket *b = &ns->b[bi];
            if (!all && b->start + self->window_ms > wm) {
                ns->b[keep++] = *b;
                continue;
            }
            for (Py_ssize_t ai = 0; ai < b->n; ai++) {
                PyObject *t = acc_tuple(self, (int32_t)ni, b->start, &b->a[ai]);
                if (t == NULL || PyList_Append(out, t) < 0) {
                    Py_XDECREF(t);
                    Py_DECREF(out);
                    return NULL; /* state left as it was for the buckets not yet popped */
                }
                Py_DECREF(t);
            }
            bucket_clear(b);
        }
        ns->n_b = keep;
    }
    return out;
}

static PyObject *Windows_invalidate(Windows *self, PyObject *unused) {
    for (Py_ssize_t i = 0; i < self->n_nodes; i++) self->nodes[i].valid = 0;
    Py_RETURN_NONE;
}

static PyObject *Windows_get_max_ts(Windows *self, void *closure) {
    return opt_long(self->has_max, self->max_ts);
}

static PyObject *Windows_get_readings(Windows *self, void *closure) {
    return PyLong_FromLongLong(self->readings);
}

static PyObject *Windows_get_unattributed(Windows *self, void *closure) {
    return PyLong_FromLongLong(self->unattributed);
}

static PyGetSetDef Windows_getset[] = {
    {"max_ts", (getter)Windows_get_max_ts, NULL, "highest sample time aggregated, or None", NULL},
    {"readings", (getter)Windows_get_readings, NULL, "GPU readings aggregated", NULL},
    {"unattributed", (getter)Windows_get_unattributed, NULL, "readings without an owner", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Windows_methods[] = {
    {"feed", (PyCFunction)Windows_feed, METH_VARARGS,
     "feed(index, lo, hi, closed, next_close, max_batch, count) -> (pos, count, flags)"},
    {"add_xid", (PyCFunction)Windows_add_xid, METH_VARARGS,
     "add_xid(node id, window start, job id, gpu index, xid)"},
    {"pop", (PyCFunction)Windows_pop, METH_O, "pop(watermark or None) -> (node id, start, acc) tuples"},
    {"invalidate", (PyCFunction)Windows_invalidate, METH_NOARGS,
     "forget every cached owner segment (the allocations changed)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WindowsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "peerwatch.streams._replay_native.Windows",
    .tp_basicsize = sizeof(Windows),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Windows(window_ms, idle_jobs, segment, jobs, acc_type): WindowAggregator's state in C",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Windows_init,
    .tp_dealloc = (destructor)Windows_dealloc,
    .tp_methods = Windows_methods,
    .tp_getset = Windows_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_replay_native",
    "The replay's native sample path (see peerwatch.streams.windows_native).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__replay_native(void) {
    if (PyType_Ready(&SampleIndexType) < 0 || PyType_Ready(&WindowsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Unordered = PyErr_NewException("peerwatch.streams._replay_native.Unordered",
                                   PyExc_ValueError, NULL);
    if (Unordered == NULL || PyModule_AddObjectRef(m, "Unordered", Unordered) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&SampleIndexType);
    Py_INCREF(&WindowsType);
    if (PyModule_AddObject(m, "SampleIndex", (PyObject *)&SampleIndexType) < 0
        || PyModule_AddObject(m, "Windows", (PyObject *)&WindowsType) < 0
        || PyModule_AddIntConstant(m, "F_DRAIN", F_DRAIN) < 0
        || PyModule_AddIntConstant(m, "F_XIDS", F_XIDS) < 0
        || PyModule_AddIntConstant(m, "F_LATE", F_LATE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
