/* PyTorch zip checkpoints: the torch layer over zip.c and pickle.c, and
 * the writer. The contract and the file layout are in torchzip.h.
 *
 * Reader: zip.c walks the zip, pickle.c runs data.pkl; this file checks the
 * torch members (archive folder, version, byteorder) and turns the pickled
 * state dict into tensor views.
 *
 * Writer: zip.c emits the zip; this file serializes the pickle the way
 * Python's pickler serializes the state dict (memo indices in the same
 * order, batches of 1000 SETITEMS), so that Python's own unpickler accepts
 * it. */
#include "formats/pickle.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tkey {
    const uint8_t *s;
    uint32_t n, i;
} tkey;

static int tkey_cmp(const void *pa, const void *pb)
{
    const tkey *a = pa, *b = pb;
    return tz_name_cmp(a->s, a->n, b->s, b->n);
}

/* The top-level dict's keys into keys[0..n): names (no NUL) of tensors,
 * sorted and distinct; *alen gets the bytes their copies take. */
static int pk_keys(pk *k, pv top, tkey *keys, size_t n, size_t *alen)
{
    size_t j = 0;
    *alen = 0;
    for (size_t i = 0; i < k->nitems && j < n; i++) {
        const pitem *it = &k->items[i];
        if (it->dict != top.u)
            continue;
        if (it->k.kind != PV_STR)
            return pk_fail(k, PI2_EUNSUPPORTED, "top-level key is a %s, not a name", pk_kind_name[it->k.kind]);
        if (memchr(k->p0 + it->k.u, 0, it->k.n))
            return pk_fail(k, PI2_EFORMAT, "top-level key '%s' holds a NUL", pk_str(k, it->k).s);
        if (it->v.kind != PV_TENSOR)
            return pk_fail(k, PI2_EUNSUPPORTED, "entry '%s' is a %s, not a tensor (a checkpoint that nests its state "
                           "dict?)", pk_str(k, it->k).s, pk_kind_name[it->v.kind]);
        keys[j] = (tkey){ .s = k->p0 + it->k.u, .n = it->k.n, .i = (uint32_t)i };
        *alen += it->k.n + 1; /* bounded by data.pkl's size */
        j++;
    }
    assert(j == n);
    qsort(keys, n, sizeof *keys, tkey_cmp);
    for (size_t i = 1; i < n; i++)
        if (tkey_cmp(&keys[i - 1], &keys[i]) == 0)
            return pk_fail(k, PI2_EFORMAT, "duplicate key '%s'", tz_show_n(keys[i].s, keys[i].n).s);
    return 0;
}

/* The views of the top-level dict's tensors, in pickle order, names copied
 * into arena. */
static void pk_views(const pk *k, pv top, pi2_st_tensor *t, size_t n, char *arena)
{
    char *a = arena;
    size_t j = 0;
    for (size_t i = 0; i < k->nitems && j < n; i++) {
        const pitem *it = &k->items[i];
        if (it->dict != top.u)
            continue;
        const ptens *pt = &k->tens[it->v.u];
        const pstor *s = &k->stors[pt->stor];
        const zmem *z = &k->m[s->member];
        pi2_st_tensor *o = &t[j++];
        memcpy(a, k->p0 + it->k.u, it->k.n);
        a[it->k.n] = 0;
        o->name = a;
        a += it->k.n + 1;
        o->dtype = s->dt;
        o->ndim = pt->ndim;
        memcpy(o->shape, pt->shape, sizeof o->shape);
        o->nelem = pt->nelem;
        o->nbytes = pt->nelem * pi2_dtype_size(s->dt); /* checked in pk_tensor */
        o->data = k->img + z->off + pt->offset * pi2_dtype_size(s->dt); /* inside the member: checked */
        o->file = k->path;
    }
}

/* The top level: a dict of distinct names to tensors, into views. */
static int pk_result(pk *k, pv top, pi2_st_tensor **out, size_t *count, char **names)
{
    if (top.kind != PV_DICT)
        return pk_fail(k, PI2_EUNSUPPORTED, "the pickle holds a %s, not a dict of name -> tensor",
                       pk_kind_name[top.kind]);
    size_t n = k->dicts[top.u].nitems, alen = 0;
    if (n > PI2_ST_MAX_TENSORS)
        return pk_fail(k, PI2_ERANGE, "%zu top-level entries (limit %u tensors)", n, (unsigned)PI2_ST_MAX_TENSORS);
    tkey *keys = pi2_malloc_array(n, sizeof *keys);
    pi2_st_tensor *t = pi2_calloc_array(n, sizeof *t);
    char *arena = NULL;
    int rc = !keys || !t ? pk_nomem(k) : pk_keys(k, top, keys, n, &alen);
    if (rc == 0 && !(arena = malloc(alen ? alen : 1)))
        rc = pk_nomem(k);
    free(keys);
    if (rc != 0) {
        free(t);
        free(arena);
        return rc;
    }
    pk_views(k, top, t, n, arena);
    *out = t;
    *count = n;
    *names = arena;
    return 0;
}

/* ======================= torch layer ======================= */

bool pi2_tz_is_zip(const void *buf, size_t len)
{
    const uint8_t *b = buf;
    return buf && len >= 4 && b[0] == 'P' && b[1] == 'K' && ((b[2] == 3 && b[3] == 4) || (b[2] == 5 && b[3] == 6));
}

/* A small stored member's bytes, or an error naming why not. */
static int small_member(pk *k, int64_t mi, const uint8_t **p, size_t *n)
{
    const zmem *z = &k->m[mi];
    if (z->method != 0)
        return pi2_err_set(k->err, PI2_EUNSUPPORTED, "%s: member '%s' is compressed (method %u)", k->path,
                           tz_show_n(z->name, z->nlen).s, z->method);
    *p = k->img + z->off;
    *n = (size_t)z->usize;
    return 0;
}

/* One folder holds every member; torch takes its name from the first. */
static int archive_folder(pk *k)
{
    const zmem *m = k->m;
    const uint8_t *slash = memchr(m[0].name, '/', m[0].nlen);
    if (!slash || slash == m[0].name)
        return pi2_err_set(k->err, PI2_EFORMAT, "%s: member '%s' is not inside an archive folder", k->path,
                           tz_show_n(m[0].name, m[0].nlen).s);
    k->prefix = m[0].name;
    k->plen = (size_t)(slash - m[0].name);
    for (size_t i = 0; i < k->nm; i++)
        if (m[i].nlen <= k->plen + 1 || memcmp(m[i].name, k->prefix, k->plen + 1) != 0)
            return pi2_err_set(k->err, PI2_EFORMAT, "%s: member '%s' is outside the archive folder '%s'", k->path,
                               tz_show_n(m[i].name, m[i].nlen).s, tz_show_n(k->prefix, k->plen).s);
    return 0;
}

/* data.pkl, stored and within PI2_TZ_MAX_PICKLE, into k->p0 and k->len. */
static int find_pickle(pk *k)
{
    char pkl[PI2_TZ_MAX_NAME + 16];
    snprintf(pkl, sizeof pkl, "%.*s/data.pkl", (int)k->plen, (const char *)k->prefix);
    k->pkl = tz_show(pkl);
    int64_t mi = pk_member(k, "data.pkl", NULL, 0);
    if (mi < 0)
        return pi2_err_set(k->err, PI2_EFORMAT, "%s: no member '%s' (not a torch.save checkpoint)", k->path,
                           k->pkl.s);
    int rc = small_member(k, mi, &k->p0, &k->len);
    if (rc != 0)
        return rc;
    if (k->m[mi].usize > PI2_TZ_MAX_PICKLE)
        return pi2_err_set(k->err, PI2_ERANGE, "%s: member '%s' is %llu bytes (limit %u)", k->path, k->pkl.s,
                           (unsigned long long)k->m[mi].usize, (unsigned)PI2_TZ_MAX_PICKLE);
    if ((rc = tz_archive_read(k->img, k->img_len, k->path, k->m, k->nm, k->sorted, (size_t)mi, &k->pkl_copy,
                              k->err)) != 0)
        return rc;
    k->p0 = k->pkl_copy;
    return 0;
}

/* The version member: decimal digits, as torch writes and reads it. */
static int check_version(pk *k)
{
    int64_t vi = pk_member(k, "version", NULL, 0);
    if (vi < 0)
        vi = pk_member(k, ".data/version", NULL, 0);
    const uint8_t *vp;
    size_t vn;
    if (vi < 0)
        return pi2_err_set(k->err, PI2_EFORMAT, "%s: no member '%s/version' (not a torch.save checkpoint)", k->path,
                           tz_show_n(k->prefix, k->plen).s);
    int rc = small_member(k, vi, &vp, &vn);
    if (rc != 0)
        return rc;
    size_t digits = 0;
    while (digits < vn && vp[digits] >= '0' && vp[digits] <= '9')
        digits++;
    if (digits == 0 || digits > 20 || vn - digits > 1 || (vn > digits && vp[digits] != '\n'))
        return pi2_err_set(k->err, PI2_EFORMAT, "%s: member '%s' does not hold a version number", k->path,
                           tz_show_n(k->m[vi].name, k->m[vi].nlen).s);
    return 0;
}

/* The byteorder member, when there is one: little-endian storages only. */
static int check_byteorder(pk *k)
{
    int64_t bi = pk_member(k, "byteorder", NULL, 0);
    if (bi < 0)
        return 0;
    const uint8_t *bp;
    size_t bn;
    int rc = small_member(k, bi, &bp, &bn);
    if (rc != 0)
        return rc;
    if (bn == 3 && memcmp(bp, "big", 3) == 0)
        return pi2_err_set(k->err, PI2_EUNSUPPORTED, "%s: storages are big-endian (byteorder 'big')", k->path);
    if (bn != 6 || memcmp(bp, "little", 6) != 0)
        return pi2_err_set(k->err, PI2_EFORMAT, "%s: byteorder member holds '%s', not 'little' or 'big'", k->path,
                           tz_show_n(bp, bn).s);
    return 0;
}

int pi2_tz_parse(const void *buf, size_t len, const char *path, pi2_st_tensor **tensors, size_t *count, char **names,
                 pi2_err *err)
{
    if (tensors)
        *tensors = NULL;
    if (count)
        *count = 0;
    if (names)
        *names = NULL;
    if (!path)
        path = "<buffer>";
    if (!tensors || !count || !names || (!buf && len))
        return pi2_err_set(err, PI2_EINVAL, "%s: pi2_tz_parse: NULL argument", path);
    pk k = { .path = path, .img = buf, .img_len = len, .err = err };
    zmem *m = NULL;
    uint32_t *sorted = NULL;
    size_t nm;
    int rc = tz_zip_walk(buf, len, path, &m, &nm, &sorted, err);
    if (rc != 0)
        return rc;
    k.m = m;
    k.nm = nm;
    k.sorted = sorted;
    if ((rc = archive_folder(&k)) != 0 || (rc = find_pickle(&k)) != 0 || (rc = check_version(&k)) != 0 ||
        (rc = check_byteorder(&k)) != 0)
        goto out;
    k.mem_stor = pi2_calloc_array(nm, sizeof *k.mem_stor);
    if (!k.mem_stor) {
        rc = pk_nomem(&k);
        goto out;
    }
    pv top = { 0 };
    if ((rc = pk_run(&k, &top)) == 0)
        rc = pk_result(&k, top, tensors, count, names);
out:
    pk_free(&k);
    free(m);
    free(sorted);
    return rc;
}

/* ---- pickle emitter: what Python's pickler writes (protocol 2) ---- */

typedef struct pb {
    uint8_t *b;
    size_t n, cap;
    uint32_t memo; /* next memo index */
    bool oom;
} pb;

static void pb_put(pb *b, const void *p, size_t n)
{
    if (b->oom || n == 0)
        return;
    while (b->cap - b->n < n) {
        size_t nc = b->cap ? b->cap * 2 : 4096;
        uint8_t *nb = nc > b->cap ? realloc(b->b, nc) : NULL;
        if (!nb) {
            b->oom = true;
            return;
        }
        b->b = nb;
        b->cap = nc;
    }
    memcpy(b->b + b->n, p, n);
    b->n += n;
}

static void pb_op(pb *b, uint8_t op) { pb_put(b, &op, 1); }

static void pb_op_u32(pb *b, uint8_t op, uint32_t v)
{
    uint8_t x[5] = { op };
    wr32(x + 1, v);
    pb_put(b, x, 5);
}

/* Memoize the value just written; its memo index. */
static uint32_t pb_memoize(pb *b)
{
    uint32_t i = b->memo++;
    if (i < 256) {
        uint8_t x[2] = { OP_BINPUT, (uint8_t)i };
        pb_put(b, x, 2);
    } else {
        pb_op_u32(b, OP_LONG_BINPUT, i);
    }
    return i;
}

static void pb_get(pb *b, uint32_t i)
{
    if (i < 256) {
        uint8_t x[2] = { OP_BINGET, (uint8_t)i };
        pb_put(b, x, 2);
    } else {
        pb_op_u32(b, OP_LONG_BINGET, i);
    }
}

static uint32_t pb_str(pb *b, const char *s, size_t n)
{
    pb_op_u32(b, OP_BINUNICODE, (uint32_t)n);
    pb_put(b, s, n);
    return pb_memoize(b);
}

static uint32_t pb_global(pb *b, const char *mod, const char *name)
{
    pb_op(b, OP_GLOBAL);
    pb_put(b, mod, strlen(mod));
    pb_op(b, '\n');
    pb_put(b, name, strlen(name));
    pb_op(b, '\n');
    return pb_memoize(b);
}

/* As pickle's save_long: BININT1/BININT2/BININT, else LONG1 with the
 * shortest two's complement. */
static void pb_int(pb *b, int64_t v)
{
    uint8_t x[10];
    if (v >= 0 && v <= 0xff) {
        x[0] = OP_BININT1;
        x[1] = (uint8_t)v;
        pb_put(b, x, 2);
    } else if (v >= 0 && v <= 0xffff) {
        x[0] = OP_BININT2;
        wr16(x + 1, (uint16_t)v);
        pb_put(b, x, 3);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        pb_op_u32(b, OP_BININT, (uint32_t)v);
    } else {
        uint64_t u = (uint64_t)v;
        size_t n = 8;
        /* drop top bytes that are pure sign extension of the byte below */
        while (n > 1 && (((u >> (8 * (n - 1))) & 0xff) == (v < 0 ? 0xff : 0)) &&
               (((u >> (8 * (n - 2))) & 0x80) == (v < 0 ? 0x80u : 0)))
            n--;
        x[0] = OP_LONG1;
        x[1] = (uint8_t)n;
        for (size_t i = 0; i < n; i++)
            x[2 + i] = (uint8_t)(u >> (8 * i));
        pb_put(b, x, 2 + n);
    }
}

/* A tuple of ints as save_tuple writes it (the empty one unmemoized). */
static void pb_int_tuple(pb *b, const int64_t *v, int n)
{
    if (n == 0) {
        pb_op(b, OP_EMPTY_TUPLE);
        return;
    }
    if (n > 3)
        pb_op(b, OP_MARK);
    for (int i = 0; i < n; i++)
        pb_int(b, v[i]);
    pb_op(b, n > 3 ? OP_TUPLE : (uint8_t)(OP_TUPLE1 + n - 1));
    pb_memoize(b);
}

typedef struct wt {
    char *name;
    pi2_dtype dt;
    int ndim;
    int64_t shape[PI2_ST_MAX_DIMS];
    uint64_t nbytes, nelem;
} wt;

/* data.pkl for an OrderedDict of tensors, storage i = tensor i. */
static int pb_state_dict(pb *b, const wt *t, size_t n)
{
    const uint32_t NONE_YET = UINT32_MAX; /* memo index of what is not memoized yet */
    uint32_t m_rebuild = NONE_YET, m_storage = NONE_YET, m_cpu = NONE_YET, m_type[8];
    for (size_t i = 0; i < 8; i++)
        m_type[i] = NONE_YET;
    uint8_t proto[2] = { OP_PROTO, 2 };
    pb_put(b, proto, 2);
    uint32_t m_od = pb_global(b, "collections", "OrderedDict");
    pb_op(b, OP_EMPTY_TUPLE);
    pb_op(b, OP_REDUCE);
    pb_memoize(b);
    for (size_t lo = 0; lo < n; lo += 1000) { /* pickle's _batch_setitems */
        size_t hi = n - lo > 1000 ? lo + 1000 : n;
        if (hi - lo > 1)
            pb_op(b, OP_MARK);
        for (size_t i = lo; i < hi; i++) {
            const wt *e = &t[i];
            pb_str(b, e->name, strlen(e->name));
            if (m_rebuild == NONE_YET)
                m_rebuild = pb_global(b, "torch._utils", "_rebuild_tensor_v2");
            else
                pb_get(b, m_rebuild);
            pb_op(b, OP_MARK); /* the 6 arguments */
            pb_op(b, OP_MARK); /* the persistent id */
            if (m_storage == NONE_YET)
                m_storage = pb_str(b, "storage", 7);
            else
                pb_get(b, m_storage);
            if (m_type[e->dt] == NONE_YET)
                m_type[e->dt] = pb_global(b, "torch", pk_storage_name(e->dt));
            else
                pb_get(b, m_type[e->dt]);
            char key[24];
            int kl = snprintf(key, sizeof key, "%zu", i);
            pb_str(b, key, (size_t)kl);
            if (m_cpu == NONE_YET)
                m_cpu = pb_str(b, "cpu", 3);
            else
                pb_get(b, m_cpu);
            pb_int(b, (int64_t)e->nelem);
            pb_op(b, OP_TUPLE);
            pb_memoize(b);
            pb_op(b, OP_BINPERSID);
            pb_int(b, 0); /* storage_offset */
            int64_t stride[PI2_ST_MAX_DIMS];
            int64_t s = 1;
            for (int d = e->ndim; d-- > 0;) {
                stride[d] = s;
                s *= e->shape[d] ? e->shape[d] : 1; /* torch: strides of an empty tensor as if each dim were >= 1 */
            }
            pb_int_tuple(b, e->shape, e->ndim);
            pb_int_tuple(b, stride, e->ndim);
            pb_op(b, OP_NEWFALSE); /* requires_grad */
            pb_get(b, m_od);       /* backward_hooks: OrderedDict() */
            pb_op(b, OP_EMPTY_TUPLE);
            pb_op(b, OP_REDUCE);
            pb_memoize(b);
            pb_op(b, OP_TUPLE);
            pb_memoize(b);
            pb_op(b, OP_REDUCE);
            pb_memoize(b);
        }
        pb_op(b, hi - lo > 1 ? OP_SETITEMS : OP_SETITEM);
    }
    pb_op(b, OP_STOP);
    return b->oom ? PI2_ENOMEM : 0;
}

/* ---- pi2_tz_writer ---- */

struct pi2_tz_writer {
    char *path;
    char *arch; /* archive folder name */
    zw z;
    wt *t;
    size_t n, cap;
    uint32_t *slots; /* name hash: tensor index + 1 */
    size_t nslots;
    uint64_t total, written;
    size_t cur; /* tensor whose storage member is open */
    bool started;
    int failed;
};

void pi2_tz_writer_free(pi2_tz_writer *w)
{
    if (!w)
        return;
    pi2_afile_abort(w->z.af);
    zw_release(&w->z);
    for (size_t i = 0; i < w->n; i++)
        free(w->t[i].name);
    free(w->t);
    free(w->slots);
    free(w->arch);
    free(w->path);
    free(w);
}

/* torch's archive name: the file name without its last extension. */
static char *archive_name(const char *path)
{
    const char *b = path;
    for (const char *s = path; *s; s++)
        if (*s == '/' || *s == '\\')
            b = s + 1;
    size_t n = strlen(b);
    const char *dot = strrchr(b, '.');
    if (dot)
        n = (size_t)(dot - b);
    if (n == 0)
        return pi2_strdup("archive");
    char *r = malloc(n + 1);
    if (r) {
        memcpy(r, b, n);
        r[n] = 0;
    }
    return r;
}

int pi2_tz_writer_create(pi2_tz_writer **out, const char *path, pi2_err *err)
{
    if (!out || !path)
        return pi2_err_set(err, PI2_EINVAL, "pi2_tz_writer_create: NULL argument");
    *out = NULL;
    pi2_tz_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->path = pi2_strdup(path);
        w->arch = archive_name(path);
    }
    if (!w || !w->path || !w->arch) {
        pi2_tz_writer_free(w);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    }
    if (strlen(w->arch) > PI2_TZ_MAX_NAME - 64) {
        pi2_tz_writer_free(w);
        return pi2_err_set(err, PI2_EINVAL, "%s: file name too long for an archive name", path);
    }
    w->z.path = w->path;
    int rc = pi2_afile_open(&w->z.af, path, err);
    if (rc != 0) {
        pi2_tz_writer_free(w);
        return rc;
    }
    *out = w;
    return 0;
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Slot of name in the hash (empty slot if absent). */
static size_t w_slot(const pi2_tz_writer *w, const char *name)
{
    size_t s = (size_t)name_hash(name) & (w->nslots - 1);
    while (w->slots[s] && strcmp(w->t[w->slots[s] - 1].name, name) != 0)
        s = (s + 1) & (w->nslots - 1);
    return s;
}

int pi2_tz_writer_add(pi2_tz_writer *w, const char *name, pi2_dtype dt, int ndim, const int64_t *shape, pi2_err *err)
{
    if (!w || !name || (ndim > 0 && !shape))
        return pi2_err_set(err, PI2_EINVAL, "pi2_tz_writer_add: NULL argument");
    if (w->failed)
        return pi2_err_set(err, w->failed, "%s: writer already failed (%s)", w->path, pi2_strerror(w->failed));
    if (w->started)
        return pi2_err_set(err, PI2_EINVAL, "%s: adding a tensor after data was written", w->path);
    size_t nl = strlen(name);
    if (nl == 0 || nl > PI2_TZ_MAX_STR || !tz_utf8_valid((const uint8_t *)name, nl))
        return pi2_err_set(err, PI2_EINVAL, "%s: invalid tensor name '%s' (empty, too long or not UTF-8)", w->path,
                           tz_show(name).s);
    if (!pi2_dtype_name(dt))
        return pi2_err_set(err, PI2_EINVAL, "%s: tensor '%s': invalid dtype %d", w->path, tz_show(name).s, (int)dt);
    if (ndim < 0 || ndim > PI2_ST_MAX_DIMS)
        return pi2_err_set(err, PI2_EINVAL, "%s: tensor '%s': %d dims (limit %d)", w->path, tz_show(name).s, ndim,
                           PI2_ST_MAX_DIMS);
    if (w->n >= PI2_ST_MAX_TENSORS)
        return pi2_err_set(err, PI2_ERANGE, "%s: too many tensors (limit %u)", w->path, (unsigned)PI2_ST_MAX_TENSORS);
    size_t nelem = 1, nbytes;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return pi2_err_set(err, PI2_EINVAL, "%s: tensor '%s': negative dim %lld", w->path, tz_show(name).s,
                               (long long)shape[i]);
        if ((uint64_t)shape[i] > SIZE_MAX || !pi2_mul_size(nelem, (size_t)shape[i], &nelem))
            return pi2_err_set(err, PI2_ERANGE, "%s: tensor '%s': element count overflows", w->path, tz_show(name).s);
    }
    uint64_t total;
    if (!pi2_mul_size(nelem, pi2_dtype_size(dt), &nbytes) || nelem > (uint64_t)INT64_MAX ||
        __builtin_add_overflow(w->total, (uint64_t)nbytes, &total) || total > (uint64_t)INT64_MAX)
        return pi2_err_set(err, PI2_ERANGE, "%s: tensor '%s': size overflows", w->path, tz_show(name).s);
    if (w->nslots < 2 * (w->n + 1)) {
        size_t ns = w->nslots ? w->nslots * 2 : 64;
        uint32_t *s = pi2_calloc_array(ns, sizeof *s);
        if (!s)
            return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", w->path);
        free(w->slots);
        w->slots = s;
        w->nslots = ns;
        for (size_t i = 0; i < w->n; i++)
            w->slots[w_slot(w, w->t[i].name)] = (uint32_t)(i + 1);
    }
    size_t slot = w_slot(w, name);
    if (w->slots[slot])
        return pi2_err_set(err, PI2_EINVAL, "%s: duplicate tensor '%s'", w->path, tz_show(name).s);
    if (pi2_grow(&w->t, &w->cap, w->n, sizeof *w->t, 16) != 0)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", w->path);
    wt *e = &w->t[w->n];
    memset(e, 0, sizeof *e);
    e->name = pi2_strdup(name);
    if (!e->name)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", w->path);
    e->dt = dt;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        e->shape[i] = shape[i];
    e->nelem = nelem;
    e->nbytes = nbytes;
    w->slots[slot] = (uint32_t)++w->n;
    w->total = total;
    return 0;
}

static int w_small(pi2_tz_writer *w, const char *member, const void *data, size_t n, pi2_err *err)
{
    char name[PI2_TZ_MAX_NAME + 1];
    snprintf(name, sizeof name, "%s/%s", w->arch, member);
    int rc = zw_begin(&w->z, name, n, err);
    if (rc == 0)
        rc = zw_data(&w->z, data, n, err);
    if (rc == 0)
        rc = zw_end(&w->z, err);
    return rc;
}

static int w_begin_storage(pi2_tz_writer *w, pi2_err *err)
{
    char name[PI2_TZ_MAX_NAME + 1];
    snprintf(name, sizeof name, "%s/data/%zu", w->arch, w->cur);
    return zw_begin(&w->z, name, w->t[w->cur].nbytes, err);
}

/* data.pkl and byteorder, then open the first storage. */
static int w_start(pi2_tz_writer *w, pi2_err *err)
{
    w->started = true;
    pb b = { 0 };
    int rc = pb_state_dict(&b, w->t, w->n);
    if (rc != 0)
        rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for data.pkl", w->path);
    if (rc == 0)
        rc = w_small(w, "data.pkl", b.b, b.n, err);
    free(b.b);
    if (rc == 0)
        rc = w_small(w, "byteorder", "little", 6, err);
    w->cur = 0;
    if (rc == 0 && w->n > 0)
        rc = w_begin_storage(w, err);
    return rc;
}

/* Close full storage members and open the next ones until one has room
 * (or all are written). */
static int w_advance(pi2_tz_writer *w, pi2_err *err)
{
    int rc = 0;
    while (rc == 0 && w->cur < w->n && w->z.left == 0) {
        if ((rc = zw_end(&w->z, err)) == 0 && ++w->cur < w->n)
            rc = w_begin_storage(w, err);
    }
    return rc;
}

int pi2_tz_writer_write(pi2_tz_writer *w, const void *data, size_t n, pi2_err *err)
{
    if (!w || (!data && n))
        return pi2_err_set(err, PI2_EINVAL, "pi2_tz_writer_write: NULL argument");
    if (w->failed)
        return pi2_err_set(err, w->failed, "%s: writer already failed (%s)", w->path, pi2_strerror(w->failed));
    int rc = 0;
    if (!w->started && (rc = w_start(w, err)) != 0)
        return w->failed = rc;
    if (n > w->total - w->written)
        return w->failed = pi2_err_set(err, PI2_EINVAL,
                                       "%s: writing %zu bytes at data byte %llu passes the declared total %llu",
                                       w->path, n, (unsigned long long)w->written, (unsigned long long)w->total);
    const uint8_t *p = data;
    while (n > 0) {
        if ((rc = w_advance(w, err)) != 0)
            return w->failed = rc;
        size_t chunk = n < w->z.left ? n : (size_t)w->z.left;
        if ((rc = zw_data(&w->z, p, chunk, err)) != 0)
            return w->failed = rc;
        p += chunk;
        n -= chunk;
        w->written += chunk;
    }
    return 0;
}

int pi2_tz_writer_finish(pi2_tz_writer *w, pi2_err *err)
{
    if (!w)
        return pi2_err_set(err, PI2_EINVAL, "pi2_tz_writer_finish: NULL writer");
    int rc = 0;
    if (w->failed)
        rc = pi2_err_set(err, w->failed, "%s: writer already failed (%s)", w->path, pi2_strerror(w->failed));
    if (rc == 0 && !w->started)
        rc = w_start(w, err);
    if (rc == 0 && w->written != w->total)
        rc = pi2_err_set(err, PI2_EINVAL, "%s: finished after %llu of %llu declared data bytes", w->path,
                         (unsigned long long)w->written, (unsigned long long)w->total);
    if (rc == 0)
        rc = w_advance(w, err); /* closes the last member, opens and closes trailing empty ones */
    if (rc == 0)
        rc = w_small(w, "version", "3\n", 2, err);
    if (rc == 0) {
        /* torch: 20 digits of a hash of the record names, 20 of their CRCs */
        uint64_t h = 0xcbf29ce484222325ull, c = 0;
        for (size_t i = 0; i < w->z.n; i++) {
            h = (h ^ name_hash(w->z.e[i].name)) * 0x100000001b3ull;
            c = c * 31 + w->z.e[i].crc;
        }
        char id[48];
        snprintf(id, sizeof id, "%020llu%020llu", (unsigned long long)h, (unsigned long long)c);
        rc = w_small(w, ".data/serialization_id", id, 40, err);
    }
    if (rc == 0)
        rc = zw_finish(&w->z, err);
    if (rc == 0) {
        rc = pi2_afile_commit(w->z.af, err); /* frees the afile, also on failure */
        w->z.af = NULL;
    }
    pi2_tz_writer_free(w);
    return rc;
}

int pi2_tz_write(const char *path, size_t n, const pi2_tz_item *items, pi2_err *err)
{
    if (!path || (n && !items))
        return pi2_err_set(err, PI2_EINVAL, "pi2_tz_write: NULL argument");
    pi2_tz_writer *w;
    int rc = pi2_tz_writer_create(&w, path, err);
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = pi2_tz_writer_add(w, items[i].name, items[i].dtype, items[i].ndim, items[i].shape, err);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const wt *e = &w->t[i];
        if (e->nbytes && !items[i].data)
            rc = pi2_err_set(err, PI2_EINVAL, "%s: tensor '%s': NULL data", path, tz_show(e->name).s);
        else
            rc = pi2_tz_writer_write(w, items[i].data, (size_t)e->nbytes, err);
    }
    if (rc != 0) {
        pi2_tz_writer_free(w);
        return rc;
    }
    return pi2_tz_writer_finish(w, err);
}

static int cstr_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

int pi2_tz_write_members(const char *path, size_t n, const char *const *names, const void *const *data,
                         const size_t *sizes, pi2_err *err)
{
    if (!path || (n && (!names || !data || !sizes)))
        return pi2_err_set(err, PI2_EINVAL, "pi2_tz_write_members: NULL argument");
    const char **sorted = pi2_malloc_array(n, sizeof *sorted);
    if (!sorted)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (!names[i] || !*names[i] || strlen(names[i]) > PI2_TZ_MAX_NAME || (sizes[i] && !data[i]))
            rc = pi2_err_set(err, PI2_EINVAL, "%s: member %zu: NULL, empty or too long name, or NULL data", path, i);
        sorted[i] = names[i];
    }
    if (rc == 0) {
        qsort(sorted, n, sizeof *sorted, cstr_cmp);
        for (size_t i = 1; i < n && rc == 0; i++)
            if (strcmp(sorted[i - 1], sorted[i]) == 0)
                rc = pi2_err_set(err, PI2_EINVAL, "%s: duplicate member '%s'", path, tz_show(sorted[i]).s);
    }
    free(sorted);
    if (rc != 0)
        return rc;
    zw z = { .path = path };
    rc = pi2_afile_open(&z.af, path, err);
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = zw_begin(&z, names[i], sizes[i], err);
        if (rc == 0)
            rc = zw_data(&z, data[i], sizes[i], err);
        if (rc == 0)
            rc = zw_end(&z, err);
    }
    if (rc == 0)
        rc = zw_finish(&z, err);
    if (rc == 0) {
        rc = pi2_afile_commit(z.af, err);
        z.af = NULL;
    }
    pi2_afile_abort(z.af);
    zw_release(&z);
    return rc;
}
