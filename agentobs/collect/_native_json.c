/* The native OTLP decoder's hottest loops in C (agentobs/collect/otlp_native.py; docs/collectors.md, part H).
 *
 * json_join builds, for each parent (a span, a resource, an array value), the JSON text of its children in
 * one pass over Arrow/NumPy buffers: `open` child "," child ... `close`, each child a label (a key's
 * `"key":`, already JSON, or nothing) and a value:
 *
 *   kind 0 null, 1 a string of (s_off, s_data) written between quotes and escaped as msgspec's JSON encoder
 *   escapes it (the Python path's encoder: '"', '\\' and the control characters below 0x20, nothing else),
 *   2 an int64 of `ints` in decimal, 3 a text of (t_off, t_data) written as it is (a double as msgspec writes
 *   it, an array's JSON), 4 true, 5 false.
 *
 * It returns (offsets, data): the int32 offsets (n + 1) and the bytes of a string array, for
 * pyarrow.StringArray.from_buffers. group_codes groups the attributes by key code (the key -> row pivot)
 * and finds repeated keys; hex_ids writes binary ids as hex.
 *
 * Every index and offset read is checked against its buffer first (a bad one raises ValueError and nothing
 * is returned); the loops run without the GIL. No state outside a call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define API_VERSION 2

/* bytes msgspec writes for a byte of a string: 1 as is, 2 a short escape, 6 \u00XX */
static const unsigned char ESC_LEN[256] = {
    6, 6, 6, 6, 6, 6, 6, 6, 2, 2, 2, 6, 2, 2, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6,
    1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
};

typedef struct {
    const int64_t *child_off; Py_ssize_t n;      /* parents; child_off has n + 1 entries */
    const int64_t *codes; Py_ssize_t m;          /* children; codes NULL: no labels */
    const int32_t *lab_off; Py_ssize_t nlab; const char *lab_data; Py_ssize_t lab_len;
    const int8_t *kind; const int64_t *ref;
    const int32_t *s_off; Py_ssize_t ns; const char *s_data; Py_ssize_t s_len;
    const int64_t *ints; Py_ssize_t ni;
    const int32_t *t_off; Py_ssize_t nt; const char *t_data; Py_ssize_t t_len;
    const char *open; Py_ssize_t open_len; const char *close; Py_ssize_t close_len;
} Job;

/* a string array's element: its [start, end) in data, checked */
static int elem(const int32_t *off, Py_ssize_t count, Py_ssize_t data_len, int64_t i, int32_t *a, int32_t *b) {
    if (i < 0 || i >= count) return 0;
    *a = off[i];
    *b = off[i + 1];
    return *a >= 0 && *a <= *b && *b <= data_len;
}

static Py_ssize_t int_len(int64_t v) {
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    Py_ssize_t k = v < 0 ? 2 : 1;
    while (u >= 10) { u /= 10; k++; }
    return k;
}

static char *write_int(char *w, int64_t v) {
    char tmp[24];
    int k = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do { tmp[k++] = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) *w++ = '-';
    while (k) *w++ = tmp[--k];
    return w;
}

/* the length of the run at p (before e) with no byte to escape: 8 bytes a step while no byte of the word is
 * below 0x20, '"' or '\\' (exact tests for "some byte is zero / below n"), then byte by byte */
static Py_ssize_t clean_run(const unsigned char *p, const unsigned char *e) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    const unsigned char *q = p;
    while (e - q >= 8) {
        uint64_t x, xq, xb;
        memcpy(&x, q, 8);
        xq = x ^ (ones * '"');
        xb = x ^ (ones * '\\');
        if (((x - ones * 0x20) & ~x & highs) | ((xq - ones) & ~xq & highs) | ((xb - ones) & ~xb & highs)) break;
        q += 8;
    }
    while (q < e && ESC_LEN[*q] == 1) q++;
    return q - p;
}

static Py_ssize_t str_len(const unsigned char *p, const unsigned char *e) {
    Py_ssize_t total = 2;
    while (p < e) {
        Py_ssize_t k = clean_run(p, e);
        total += k;
        p += k;
        if (p < e) total += ESC_LEN[*p++];
    }
    return total;
}

/* the string between quotes and escaped into w, or NULL when it does not fit before end */
static char *write_str(char *w, char *end, const unsigned char *p, const unsigned char *e) {
    static const char hex[] = "0123456789abcdef";
    if (end - w < 2) return NULL;
    *w++ = '"';
    while (p < e) {
        Py_ssize_t k = clean_run(p, e);
        if (end - w < k + 1) return NULL;
        memcpy(w, p, (size_t)k);
        w += k;
        p += k;
        if (p == e) break;
        unsigned char c = *p++;
        if (end - w < ESC_LEN[c] + 1) return NULL;  /* the escape, and the closing quote still to come */
        switch (ESC_LEN[c]) {
        case 2:
            *w++ = '\\';
            *w++ = c == '"' ? '"' : c == '\\' ? '\\' : c == '\b' ? 'b' : c == '\t' ? 't' : c == '\n' ? 'n'
                 : c == '\f' ? 'f' : 'r';
            break;
        default:
            memcpy(w, "\\u00", 4);
            w[4] = hex[c >> 4];
            w[5] = hex[c & 15];
            w += 6;
        }
    }
    *w++ = '"';
    return w;
}

/* Pass 1: check every index and compute each parent's end offset into out_off (n + 1). Returns 0, or an error
 * code with *where the child (or parent) at fault. */
static int measure(const Job *j, int32_t *out_off, Py_ssize_t *where) {
    int64_t total = 0;
    out_off[0] = 0;
    for (Py_ssize_t p = 0; p < j->n; p++) {
        int64_t c0 = j->child_off[p], c1 = j->child_off[p + 1];
        *where = p;
        if (c0 < 0 || c1 < c0 || c1 > j->m) return 1;
        total += j->open_len + j->close_len + (c1 > c0 ? c1 - c0 - 1 : 0);
        for (int64_t c = c0; c < c1; c++) {
            int32_t a, b;
            int64_t r = j->ref[c];
            *where = (Py_ssize_t)c;
            if (j->codes) {
                if (!elem(j->lab_off, j->nlab, j->lab_len, j->codes[c], &a, &b)) return 2;
                total += b - a;
            }
            switch (j->kind[c]) {
            case 0: total += 4; break;
            case 1:
                if (!elem(j->s_off, j->ns, j->s_len, r, &a, &b)) return 3;
                total += str_len((const unsigned char *)j->s_data + a, (const unsigned char *)j->s_data + b);
                break;
            case 2:
                if (r < 0 || r >= j->ni) return 3;
                total += int_len(j->ints[r]);
                break;
            case 3:
                if (!elem(j->t_off, j->nt, j->t_len, r, &a, &b)) return 3;
                total += b - a;
                break;
            case 4: total += 4; break;
            case 5: total += 5; break;
            default: return 4;
            }
            if (total > INT32_MAX) return 5;
        }
        if (total > INT32_MAX) return 5;
        out_off[p + 1] = (int32_t)total;
    }
    return 0;
}

/* copy len bytes to w unless they do not fit before end (then w = NULL) */
#define PUT(src, len) do { \
        Py_ssize_t n_ = (Py_ssize_t)(len); \
        if (!w || n_ < 0 || end - w < n_) { w = NULL; break; } \
        memcpy(w, (src), (size_t)n_); \
        w += n_; \
    } while (0)

/* Pass 2: the text, into out (out_off[n] bytes, the sizes pass 1 measured). Every index is checked again and
 * every write bounded, so buffers changed since pass 1 cannot make it read or write outside them: 0, or -1 when
 * the text came out otherwise than measured. */
static int fill(const Job *j, const int32_t *out_off, char *out) {
    char *w = out, *end = out + out_off[j->n];
    for (Py_ssize_t p = 0; p < j->n && w; p++) {
        int64_t c0 = j->child_off[p], c1 = j->child_off[p + 1];
        if (c0 < 0 || c1 < c0 || c1 > j->m) return -1;
        PUT(j->open, j->open_len);
        for (int64_t c = c0; c < c1 && w; c++) {
            int64_t r = j->ref[c];
            int32_t a, b;
            if (c > c0) PUT(",", 1);
            if (j->codes) {
                if (!elem(j->lab_off, j->nlab, j->lab_len, j->codes[c], &a, &b)) return -1;
                PUT(j->lab_data + a, b - a);
            }
            switch (j->kind[c]) {
            case 0: PUT("null", 4); break;
            case 1:
                if (!elem(j->s_off, j->ns, j->s_len, r, &a, &b)) return -1;
                if (w) w = write_str(w, end, (const unsigned char *)j->s_data + a, (const unsigned char *)j->s_data + b);
                break;
            case 2: {
                char tmp[24];
                if (r < 0 || r >= j->ni) return -1;
                PUT(tmp, write_int(tmp, j->ints[r]) - tmp);
                break;
            }
            case 3:
                if (!elem(j->t_off, j->nt, j->t_len, r, &a, &b)) return -1;
                PUT(j->t_data + a, b - a);
                break;
            case 4: PUT("true", 4); break;
            case 5: PUT("false", 5); break;
            default: return -1;
            }
        }
        PUT(j->close, j->close_len);
        if (w && w - out != out_off[p + 1]) return -1;
    }
    return w == end ? 0 : -1;
}

/* element count of an aligned buffer of `size`-byte items, or -1 (and an error set) */
static Py_ssize_t items(const Py_buffer *b, Py_ssize_t size, const char *name) {
    if (b->len % size || (uintptr_t)b->buf % (uintptr_t)size) {
        PyErr_Format(PyExc_ValueError, "%s (%zd bytes) is not an aligned array of %zd-byte items", name,
                     b->len, size);
        return -1;
    }
    return b->len / size;
}

/* the entries of a string array's offsets buffer: -1 when not int32 with at least one entry */
static Py_ssize_t str_count(const Py_buffer *b, const char *name) {
    Py_ssize_t k = items(b, 4, name);
    if (k == 0) {
        PyErr_Format(PyExc_ValueError, "%s is empty (an offsets buffer has n + 1 entries)", name);
        return -1;
    }
    return k < 0 ? -1 : k - 1;
}

static PyObject *json_join(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer bo, bc, blo, bld, bk, br, bso, bsd, bi, bto, btd, bop, bcl;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*y*y*y*y*y*:json_join", &bo, &bc, &blo, &bld, &bk, &br, &bso,
                          &bsd, &bi, &bto, &btd, &bop, &bcl))
        return NULL;
    Py_buffer *all[] = {&bo, &bc, &blo, &bld, &bk, &br, &bso, &bsd, &bi, &bto, &btd, &bop, &bcl};
    PyObject *res = NULL, *off = NULL, *data = NULL;
    Job j;
    Py_ssize_t no = items(&bo, 8, "json_join: child_off");
    if (no < 0) goto done;
    if (no == 0) {
        PyErr_SetString(PyExc_ValueError, "json_join: child_off is empty (it has n + 1 entries)");
        goto done;
    }
    j.child_off = bo.buf; j.n = no - 1;
    j.kind = bk.buf; j.m = bk.len;
    j.ref = br.buf;
    if (items(&br, 8, "json_join: ref") != j.m) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "json_join: ref has %zd entries, kind %zd", br.len / 8, j.m);
        goto done;
    }
    Py_ssize_t nc = items(&bc, 8, "json_join: codes");
    if (nc < 0) goto done;
    if (nc && nc != j.m) {
        PyErr_Format(PyExc_ValueError, "json_join: codes has %zd entries, kind %zd (0: no labels)", nc, j.m);
        goto done;
    }
    j.codes = nc ? bc.buf : NULL;
    if ((j.nlab = str_count(&blo, "json_join: label offsets")) < 0
        || (j.ns = str_count(&bso, "json_join: string offsets")) < 0
        || (j.nt = str_count(&bto, "json_join: text offsets")) < 0 || (j.ni = items(&bi, 8, "json_join: ints")) < 0)
        goto done;
    j.lab_off = blo.buf; j.lab_data = bld.buf; j.lab_len = bld.len;
    j.s_off = bso.buf; j.s_data = bsd.buf; j.s_len = bsd.len;
    j.ints = bi.buf;
    j.t_off = bto.buf; j.t_data = btd.buf; j.t_len = btd.len;
    j.open = bop.buf; j.open_len = bop.len; j.close = bcl.buf; j.close_len = bcl.len;

    off = PyBytes_FromStringAndSize(NULL, (j.n + 1) * 4);
    if (!off) goto done;
    int32_t *out_off = (int32_t *)PyBytes_AS_STRING(off);
    Py_ssize_t where = 0;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = measure(&j, out_off, &where);
    Py_END_ALLOW_THREADS
    if (err) {
        static const char *what[] = {"", "child_off out of order or beyond the children at parent",
                                     "label code out of range at child", "value index out of range at child",
                                     "unknown value kind at child", "text over 2 GiB at child"};
        PyErr_Format(err == 5 ? PyExc_OverflowError : PyExc_ValueError, "json_join: %s %zd", what[err], where);
        goto done;
    }
    data = PyBytes_FromStringAndSize(NULL, out_off[j.n]);
    if (!data) goto done;
    char *out = PyBytes_AS_STRING(data);
    Py_BEGIN_ALLOW_THREADS
    err = fill(&j, out_off, out);
    Py_END_ALLOW_THREADS
    if (err) {
        PyErr_SetString(PyExc_ValueError, "json_join: the buffers changed during the call");
        goto done;
    }
    res = PyTuple_Pack(2, off, data);
done:
    Py_XDECREF(off);
    Py_XDECREF(data);
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        PyBuffer_Release(all[k]);
    return res;
}

/* group_codes(child_off, codes, nd) -> (order, start, dup): the children grouped by key code, each group in
 * child order (a counting sort: order[start[k]:start[k + 1]] are the children of code k), and per parent
 * whether a code occurs twice among its children (a repeated key). */
static PyObject *group_codes(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer bo, bc;
    Py_ssize_t nd;
    if (!PyArg_ParseTuple(args, "y*y*n:group_codes", &bo, &bc, &nd))
        return NULL;
    PyObject *res = NULL, *order = NULL, *start = NULL, *dup = NULL;
    int64_t *stamp = NULL;
    Py_ssize_t no = items(&bo, 8, "group_codes: child_off"), m = items(&bc, 8, "group_codes: codes");
    if (no < 0 || m < 0) goto done;
    if (no == 0 || nd < 0 || nd > m) {
        PyErr_SetString(PyExc_ValueError, "group_codes: child_off is empty, or nd negative or more than the children");
        goto done;
    }
    const int64_t *off = bo.buf, *codes = bc.buf;
    Py_ssize_t n = no - 1, bad = -1;
    order = PyBytes_FromStringAndSize(NULL, m * 8);
    start = PyBytes_FromStringAndSize(NULL, (nd + 1) * 8);
    dup = PyBytes_FromStringAndSize(NULL, n);
    stamp = PyMem_Malloc((size_t)(nd ? nd : 1) * sizeof(int64_t));
    if (!order || !start || !dup || !stamp) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *o = (int64_t *)PyBytes_AS_STRING(order), *st = (int64_t *)PyBytes_AS_STRING(start);
    char *d = PyBytes_AS_STRING(dup);
    Py_BEGIN_ALLOW_THREADS
    /* every value read is checked where it is used, so nothing is read or written outside the buffers even if they
     * change during the call (bad: the parent, or n + 1 + the child, at fault; -2: the codes changed) */
    memset(st, 0, (size_t)(nd + 1) * 8);
    for (Py_ssize_t c = 0; c < m && bad == -1; c++) {
        int64_t k = codes[c];
        if (k < 0 || k >= nd) bad = n + 1 + c;
        else st[k + 1]++;
    }
    for (Py_ssize_t k = 0; k < nd; k++) st[k + 1] += st[k];
    for (Py_ssize_t k = 0; k < nd; k++) stamp[k] = st[k];  /* the next free slot of each code */
    for (Py_ssize_t c = 0; c < m && bad == -1; c++) {
        int64_t k = codes[c];
        if (k < 0 || k >= nd || stamp[k] >= st[k + 1]) bad = -2;
        else o[stamp[k]++] = c;
    }
    for (Py_ssize_t k = 0; k < nd; k++) stamp[k] = -1;  /* now: the last parent each code was seen in */
    for (Py_ssize_t p = 0; p < n && bad == -1; p++) {
        int64_t a = off[p], e = off[p + 1];
        d[p] = 0;
        if (a < 0 || e < a || e > m || (p == n - 1 && e != m)) { bad = p; break; }
        for (int64_t c = a; c < e; c++) {
            int64_t k = codes[c];
            if (k < 0 || k >= nd) { bad = -2; break; }
            if (stamp[k] == p) d[p] = 1;
            stamp[k] = p;
        }
    }
    Py_END_ALLOW_THREADS
    if (bad != -1) {
        if (bad == -2)
            PyErr_SetString(PyExc_ValueError, "group_codes: the codes changed during the call");
        else if (bad <= n)
            PyErr_Format(PyExc_ValueError, "group_codes: child_off out of order or not covering the %zd children at "
                         "parent %zd", m, bad);
        else
            PyErr_Format(PyExc_ValueError, "group_codes: code out of range (0..%zd) at child %zd", nd - 1, bad - n - 1);
        goto done;
    }
    res = PyTuple_Pack(3, order, start, dup);
done:
    Py_XDECREF(order);
    Py_XDECREF(start);
    Py_XDECREF(dup);
    PyMem_Free(stamp);
    PyBuffer_Release(&bo);
    PyBuffer_Release(&bc);
    return res;
}

/* hex_ids(offsets, data, nbytes) -> (text, bad): each binary id of a string/binary array (int32 offsets, n + 1)
 * as 2 * nbytes lower-case hex digits (an id of another length: zeros), and per id 1 when its length is not
 * nbytes, 2 when it is all zeros, 0 when good (otlp_native._hex_ids). */
static PyObject *hex_ids(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer bo, bd;
    Py_ssize_t nb;
    if (!PyArg_ParseTuple(args, "y*y*n:hex_ids", &bo, &bd, &nb))
        return NULL;
    static const char hex[] = "0123456789abcdef";
    PyObject *res = NULL, *text = NULL, *bad = NULL;
    Py_ssize_t n = str_count(&bo, "hex_ids: offsets"), at = -1;
    if (n < 0) goto done;
    if (nb <= 0 || nb > 64) {
        PyErr_Format(PyExc_ValueError, "hex_ids: nbytes %zd is not in 1..64", nb);
        goto done;
    }
    const int32_t *off = bo.buf;
    const unsigned char *data = bd.buf;
    text = PyBytes_FromStringAndSize(NULL, n * 2 * nb);
    bad = PyBytes_FromStringAndSize(NULL, n);
    if (!text || !bad) goto done;
    char *w = PyBytes_AS_STRING(text), *b = PyBytes_AS_STRING(bad);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t a = off[i], e = off[i + 1];
        if (a < 0 || e < a || e > bd.len) { at = i; break; }
        if (e - a != nb) {
            memset(w, '0', (size_t)(2 * nb));
            b[i] = 1;
        } else {
            unsigned char any = 0;
            for (Py_ssize_t k = 0; k < nb; k++) {
                any |= data[a + k];
                w[2 * k] = hex[data[a + k] >> 4];
                w[2 * k + 1] = hex[data[a + k] & 15];
            }
            b[i] = any ? 0 : 2;
        }
        w += 2 * nb;
    }
    Py_END_ALLOW_THREADS
    if (at >= 0) {
        PyErr_Format(PyExc_ValueError, "hex_ids: offsets out of order or beyond the data at id %zd", at);
        goto done;
    }
    res = PyTuple_Pack(2, text, bad);
done:
    Py_XDECREF(text);
    Py_XDECREF(bad);
    PyBuffer_Release(&bo);
    PyBuffer_Release(&bd);
    return res;
}

static PyMethodDef methods[] = {
    {"json_join", json_join, METH_VARARGS,
     "json_join(child_off, codes, lab_off, lab_data, kind, ref, s_off, s_data, ints, t_off, t_data, open, close)"
     " -> (int32 offsets, data): the JSON text per parent (see the source's header)."},
    {"group_codes", group_codes, METH_VARARGS,
     "group_codes(child_off, codes, nd) -> (order, start, dup): children grouped by code; repeated codes per parent."},
    {"hex_ids", hex_ids, METH_VARARGS,
     "hex_ids(offsets, data, nbytes) -> (hex text, bad): binary ids as hex; 1 wrong length, 2 all zeros."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native_json",
                                    "The native decoder's attribute JSON in C (otlp_native.py).", 0, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native_json(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "API_VERSION", API_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
