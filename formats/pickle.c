/* The restricted pickle interpreter that reads a checkpoint's data.pkl.
 * The contract is in torchzip.h; pickle.h is its private interface.
 *
 * It builds inert values only: strings stay (offset, length) pairs in the
 * image, tuples and dicts are indices into flat arrays, a REDUCE is a table
 * lookup that validates a tensor's arguments; nothing is called, imported
 * or copied but the names. Freeing is one free() per array, so no value
 * graph is ever walked recursively and nesting costs no C stack. */
#include "formats/pickle.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    uint8_t op;
    const char *name;
} op_names[] = {
    { OP_MARK, "MARK" }, { OP_STOP, "STOP" }, { OP_POP, "POP" }, { OP_POP_MARK, "POP_MARK" }, { OP_DUP, "DUP" },
    { OP_FLOAT, "FLOAT" }, { OP_INT, "INT" }, { OP_BININT, "BININT" }, { OP_BININT1, "BININT1" },
    { OP_LONG, "LONG" }, { OP_BININT2, "BININT2" }, { OP_NONE, "NONE" }, { OP_PERSID, "PERSID" },
    { OP_BINPERSID, "BINPERSID" }, { OP_REDUCE, "REDUCE" }, { OP_STRING, "STRING" }, { OP_BINSTRING, "BINSTRING" },
    { OP_SHORT_BINSTRING, "SHORT_BINSTRING" }, { OP_UNICODE, "UNICODE" }, { OP_BINUNICODE, "BINUNICODE" },
    { OP_APPEND, "APPEND" }, { OP_BUILD, "BUILD" }, { OP_GLOBAL, "GLOBAL" }, { OP_DICT, "DICT" },
    { OP_EMPTY_DICT, "EMPTY_DICT" }, { OP_APPENDS, "APPENDS" }, { OP_GET, "GET" }, { OP_BINGET, "BINGET" },
    { OP_INST, "INST" }, { OP_LONG_BINGET, "LONG_BINGET" }, { OP_LIST, "LIST" }, { OP_EMPTY_LIST, "EMPTY_LIST" },
    { OP_OBJ, "OBJ" }, { OP_PUT, "PUT" }, { OP_BINPUT, "BINPUT" }, { OP_LONG_BINPUT, "LONG_BINPUT" },
    { OP_SETITEM, "SETITEM" }, { OP_TUPLE, "TUPLE" }, { OP_EMPTY_TUPLE, "EMPTY_TUPLE" }, { OP_SETITEMS, "SETITEMS" },
    { OP_BINFLOAT, "BINFLOAT" }, { OP_PROTO, "PROTO" }, { OP_NEWOBJ, "NEWOBJ" }, { OP_EXT1, "EXT1" },
    { OP_EXT2, "EXT2" }, { OP_EXT4, "EXT4" }, { OP_TUPLE1, "TUPLE1" }, { OP_TUPLE2, "TUPLE2" },
    { OP_TUPLE3, "TUPLE3" }, { OP_NEWTRUE, "NEWTRUE" }, { OP_NEWFALSE, "NEWFALSE" }, { OP_LONG1, "LONG1" },
    { OP_LONG4, "LONG4" }, { OP_BINBYTES, "BINBYTES" }, { OP_SHORT_BINBYTES, "SHORT_BINBYTES" },
    { OP_SHORT_BINUNICODE, "SHORT_BINUNICODE" }, { OP_BINUNICODE8, "BINUNICODE8" }, { OP_BINBYTES8, "BINBYTES8" },
    { OP_EMPTY_SET, "EMPTY_SET" }, { OP_ADDITEMS, "ADDITEMS" }, { OP_FROZENSET, "FROZENSET" },
    { OP_NEWOBJ_EX, "NEWOBJ_EX" }, { OP_STACK_GLOBAL, "STACK_GLOBAL" }, { OP_MEMOIZE, "MEMOIZE" },
    { OP_FRAME, "FRAME" }, { OP_BYTEARRAY8, "BYTEARRAY8" }, { OP_NEXT_BUFFER, "NEXT_BUFFER" },
    { OP_READONLY_BUFFER, "READONLY_BUFFER" },
};

static const char *op_name(uint8_t op)
{
    for (size_t i = 0; i < sizeof op_names / sizeof op_names[0]; i++)
        if (op_names[i].op == op)
            return op_names[i].name;
    return NULL;
}

const char *const pk_kind_name[] = { "None", "bool", "int", "str", "global", "tuple", "list", "dict", "storage",
                                         "tensor" };

static const struct {
    const char *name;
    pi2_dtype dt;
} storage_types[] = {
    { "FloatStorage", PI2_DT_F32 }, { "HalfStorage", PI2_DT_F16 }, { "BFloat16Storage", PI2_DT_BF16 },
    { "CharStorage", PI2_DT_I8 },   { "ByteStorage", PI2_DT_U8 },  { "IntStorage", PI2_DT_I32 },
    { "LongStorage", PI2_DT_I64 },
};

const char *pk_storage_name(pi2_dtype dt)
{
    for (size_t i = 0; i < sizeof storage_types / sizeof storage_types[0]; i++)
        if (storage_types[i].dt == dt)
            return storage_types[i].name;
    return "?";
}

int pk_fail(pk *k, int code, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return pi2_err_set(k->err, code, "%s: %s byte %zu: %s", k->path, k->pkl.s, k->at, msg);
}

int pk_nomem(pk *k)
{
    return pi2_err_set(k->err, PI2_ENOMEM, "%s: out of memory reading %s", k->path, k->pkl.s);
}

/* Spend n objects of the budget. */
static int pk_spend(pk *k, size_t n)
{
    if (n > PI2_TZ_MAX_OBJECTS - k->nobj)
        return pk_fail(k, PI2_ERANGE, "more than %u pickle objects", (unsigned)PI2_TZ_MAX_OBJECTS);
    k->nobj += n;
    return 0;
}

shown pk_str(const pk *k, pv v) { return tz_show_n(k->p0 + v.u, v.n); }

static bool pk_str_is(const pk *k, pv v, const char *s)
{
    return v.kind == PV_STR && v.n == strlen(s) && memcmp(k->p0 + v.u, s, v.n) == 0;
}

static size_t pk_base(const pk *k) { return k->nmarks ? k->marks[k->nmarks - 1] : 0; }

/* At least n values above the last MARK. */
static int pk_need(pk *k, uint8_t op, size_t n)
{
    size_t have = k->sp - pk_base(k);
    if (have < n)
        return pk_fail(k, PI2_EFORMAT, "stack underflow: %s needs %zu values, %zu above the last MARK", op_name(op), n,
                       have);
    return 0;
}

static int pk_push(pk *k, pv v)
{
    if (k->sp >= PI2_TZ_MAX_STACK)
        return pk_fail(k, PI2_ERANGE, "more than %u values on the stack", (unsigned)PI2_TZ_MAX_STACK);
    if (pi2_grow(&k->st, &k->scap, k->sp, sizeof *k->st, 64) != 0)
        return pk_nomem(k);
    k->st[k->sp++] = v;
    return 0;
}

/* The values above the last MARK (count n at st[*from]); pops the MARK. */
static int pk_pop_mark(pk *k, uint8_t op, size_t *from, size_t *n)
{
    if (k->nmarks == 0)
        return pk_fail(k, PI2_EFORMAT, "stack underflow: %s without a MARK", op_name(op));
    *from = k->marks[--k->nmarks];
    *n = k->sp - *from;
    return 0;
}

static int pk_tuple(pk *k, size_t from, size_t n, pv *out)
{
    int rc = pk_spend(k, n ? n : 1);
    if (rc != 0)
        return rc;
    /* pi2_grow doubles once per call: a tuple may need several */
    while (k->kidcap < k->nkids + n)
        if (pi2_grow(&k->kids, &k->kidcap, k->kidcap, sizeof *k->kids, 256) != 0)
            return pk_nomem(k);
    if (n)
        memcpy(k->kids + k->nkids, k->st + from, n * sizeof *k->kids);
    *out = (pv){ .kind = PV_TUPLE, .n = (uint32_t)n, .u = k->nkids };
    k->nkids += n;
    return 0;
}

static int pk_new_dict(pk *k, bool ordered, pv *out)
{
    int rc = pk_spend(k, 1);
    if (rc != 0)
        return rc;
    if (pi2_grow(&k->dicts, &k->dictcap, k->ndicts, sizeof *k->dicts, 16) != 0)
        return pk_nomem(k);
    k->dicts[k->ndicts] = (pdict){ .nitems = 0, .ordered = ordered };
    *out = (pv){ .kind = PV_DICT, .u = k->ndicts++ };
    return 0;
}

static int pk_setitem(pk *k, pv d, pv key, pv val)
{
    if (key.kind == PV_DICT || key.kind == PV_LIST)
        return pk_fail(k, PI2_EFORMAT, "unhashable dict key (a %s)", pk_kind_name[key.kind]);
    int rc = pk_spend(k, 1);
    if (rc != 0)
        return rc;
    if (pi2_grow(&k->items, &k->itemcap, k->nitems, sizeof *k->items, 64) != 0)
        return pk_nomem(k);
    k->items[k->nitems++] = (pitem){ .dict = (uint32_t)d.u, .k = key, .v = val };
    k->dicts[d.u].nitems++;
    return 0;
}

/* The member "<prefix>/<a><b>" (b may hold any bytes), or -1. */
int64_t pk_member(const pk *k, const char *a, const uint8_t *b, size_t blen)
{
    char q[PI2_TZ_MAX_NAME + 1];
    size_t alen = strlen(a);
    if (k->plen + 1 + alen > PI2_TZ_MAX_NAME || blen > PI2_TZ_MAX_NAME - k->plen - 1 - alen)
        return -1;
    memcpy(q, k->prefix, k->plen);
    q[k->plen] = '/';
    memcpy(q + k->plen + 1, a, alen);
    if (blen)
        memcpy(q + k->plen + 1 + alen, b, blen);
    return tz_find(k->m, k->nm, k->sorted, (const uint8_t *)q, k->plen + 1 + alen + blen);
}

static int pk_global(pk *k, const uint8_t *mod, size_t ml, const uint8_t *name, size_t nl, pv *out)
{
#define IS(p, l, s) ((l) == sizeof(s) - 1 && memcmp((p), (s), (l)) == 0)
    *out = (pv){ .kind = PV_GLOBAL };
    if (IS(mod, ml, "collections") && IS(name, nl, "OrderedDict"))
        out->g = G_ODICT;
    else if (IS(mod, ml, "torch._utils") && IS(name, nl, "_rebuild_tensor_v2"))
        out->g = G_REBUILD_V2;
    else if (IS(mod, ml, "torch._utils") && IS(name, nl, "_rebuild_parameter"))
        out->g = G_REBUILD_PARAM;
    else if (IS(mod, ml, "torch")) {
        for (size_t i = 0; i < sizeof storage_types / sizeof storage_types[0]; i++)
            if (nl == strlen(storage_types[i].name) && memcmp(name, storage_types[i].name, nl) == 0)
                out->g = (uint8_t)(G_STORAGE + storage_types[i].dt);
        if (!out->g && nl > 7 && memcmp(name + nl - 7, "Storage", 7) == 0)
            return pk_fail(k, PI2_EUNSUPPORTED,
                           "storage type torch.%s has no pi2 dtype (pi2 reads Float, Half, BFloat16, Char, Byte, "
                           "Int and Long storages)",
                           tz_show_n(name, nl).s);
    }
#undef IS
    if (!out->g)
        return pk_fail(k, PI2_EUNSUPPORTED, "refused global '%s.%s'", tz_show_n(mod, ml).s, tz_show_n(name, nl).s);
    return 0;
}

static const char *global_name(uint8_t g)
{
    switch (g) {
    case G_ODICT: return "collections.OrderedDict";
    case G_REBUILD_V2: return "torch._utils._rebuild_tensor_v2";
    case G_REBUILD_PARAM: return "torch._utils._rebuild_parameter";
    default: return "a torch storage type";
    }
}

/* BINPERSID: ('storage', torch.<T>Storage, key, location, numel). */
static int pk_storage(pk *k, pv pid, pv *out)
{
    if (pid.kind != PV_TUPLE || pid.n == 0)
        return pk_fail(k, PI2_EUNSUPPORTED, "persistent id is a %s, not a storage tuple", pk_kind_name[pid.kind]);
    const pv *t = k->kids + pid.u;
    if (!pk_str_is(k, t[0], "storage"))
        return pk_fail(k, PI2_EUNSUPPORTED, "persistent id of type '%s', not 'storage'",
                       t[0].kind == PV_STR ? pk_str(k, t[0]).s : pk_kind_name[t[0].kind]);
    if (pid.n != 5)
        return pk_fail(k, PI2_EFORMAT, "storage persistent id has %u fields, not 5", pid.n);
    if (t[1].kind != PV_GLOBAL || t[1].g < G_STORAGE)
        return pk_fail(k, PI2_EFORMAT, "storage type is %s, not a storage class",
                       t[1].kind == PV_GLOBAL ? global_name(t[1].g) : pk_kind_name[t[1].kind]);
    if (t[2].kind != PV_STR || t[3].kind != PV_STR || t[4].kind != PV_INT || (int64_t)t[4].u < 0)
        return pk_fail(k, PI2_EFORMAT, "storage persistent id is not (str, type, str key, str location, numel >= 0)");
    pi2_dtype dt = (pi2_dtype)(t[1].g - G_STORAGE);
    uint64_t numel = t[4].u;
    shown key = pk_str(k, t[2]);
    size_t nbytes;
    if (numel > SIZE_MAX || !pi2_mul_size((size_t)numel, pi2_dtype_size(dt), &nbytes))
        return pk_fail(k, PI2_ERANGE, "storage '%s': %llu elements of %s overflow the byte size", key.s,
                       (unsigned long long)numel, pk_storage_name(dt));
    int64_t mi = pk_member(k, "data/", k->p0 + t[2].u, t[2].n);
    if (mi < 0)
        return pk_fail(k, PI2_EFORMAT, "storage '%s': member '%s/data/%s' is missing", key.s,
                       tz_show_n(k->prefix, k->plen).s, key.s);
    const zmem *z = &k->m[mi];
    if (z->method != 0)
        return pk_fail(k, PI2_EUNSUPPORTED, "storage '%s': member '%s' is compressed (method %u; torch stores "
                       "storages uncompressed)", key.s, tz_show_n(z->name, z->nlen).s, z->method);
    if (z->usize != nbytes)
        return pk_fail(k, PI2_EFORMAT, "storage '%s': %s of %llu elements needs %zu bytes but member '%s' holds %llu",
                       key.s, pk_storage_name(dt), (unsigned long long)numel, nbytes, tz_show_n(z->name, z->nlen).s,
                       (unsigned long long)z->usize);
    uint32_t s = k->mem_stor[mi];
    if (s) {
        const pstor *o = &k->stors[s - 1];
        if (o->dt != dt || o->numel != numel)
            return pk_fail(k, PI2_EFORMAT, "storage '%s' declared again as %s of %llu elements (first %s of %llu)",
                           key.s, pk_storage_name(dt), (unsigned long long)numel, pk_storage_name(o->dt),
                           (unsigned long long)o->numel);
        *out = (pv){ .kind = PV_STORAGE, .u = s - 1 };
        return 0;
    }
    int rc = pk_spend(k, 1);
    if (rc != 0)
        return rc;
    if (pi2_grow(&k->stors, &k->storcap, k->nstors, sizeof *k->stors, 16) != 0)
        return pk_nomem(k);
    k->stors[k->nstors] = (pstor){ .member = (uint32_t)mi, .dt = dt, .numel = numel };
    k->mem_stor[mi] = (uint32_t)++k->nstors;
    *out = (pv){ .kind = PV_STORAGE, .u = k->nstors - 1 };
    return 0;
}

static void fmt_dims(char *buf, size_t cap, const pv *v, uint32_t n)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (uint32_t i = 0; i < n && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)v[i].u);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
}

static bool empty_dict(const pk *k, pv v) { return v.kind == PV_DICT && k->dicts[v.u].nitems == 0; }

/* torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride,
 * requires_grad, backward_hooks[, metadata]) */
static int pk_tensor(pk *k, pv args, pv *out)
{
    if (args.n != 6 && args.n != 7)
        return pk_fail(k, PI2_EFORMAT, "_rebuild_tensor_v2 takes 6 or 7 arguments, not %u", args.n);
    const pv *a = k->kids + args.u;
    if (a[0].kind != PV_STORAGE)
        return pk_fail(k, PI2_EFORMAT, "tensor storage is a %s", pk_kind_name[a[0].kind]);
    if (a[1].kind != PV_INT || (int64_t)a[1].u < 0)
        return pk_fail(k, PI2_EFORMAT, "tensor storage_offset is %s", a[1].kind == PV_INT ? "negative" : "not an int");
    if (a[2].kind != PV_TUPLE || a[3].kind != PV_TUPLE)
        return pk_fail(k, PI2_EFORMAT, "tensor size and stride must be tuples (%s, %s)", pk_kind_name[a[2].kind],
                       pk_kind_name[a[3].kind]);
    uint32_t nd = a[2].n;
    if (nd > PI2_ST_MAX_DIMS)
        return pk_fail(k, PI2_ERANGE, "tensor has %u dims (limit %d)", nd, PI2_ST_MAX_DIMS);
    if (a[3].n != nd)
        return pk_fail(k, PI2_EFORMAT, "tensor size has %u dims but its stride %u", nd, a[3].n);
    const pv *size = k->kids + a[2].u, *stride = k->kids + a[3].u;
    const pstor *s = &k->stors[a[0].u];
    ptens t = { .stor = (uint32_t)a[0].u, .ndim = (int)nd, .nelem = 1, .offset = a[1].u };
    for (uint32_t i = 0; i < nd; i++) {
        if (size[i].kind != PV_INT || stride[i].kind != PV_INT)
            return pk_fail(k, PI2_EFORMAT, "tensor size or stride holds a %s",
                           pk_kind_name[size[i].kind != PV_INT ? size[i].kind : stride[i].kind]);
        int64_t d = (int64_t)size[i].u;
        if (d < 0)
            return pk_fail(k, PI2_EFORMAT, "negative tensor size %lld in dim %u", (long long)d, i);
        t.shape[i] = d;
        if ((uint64_t)d > SIZE_MAX || !pi2_mul_size(t.nelem, (size_t)d, &t.nelem))
            return pk_fail(k, PI2_ERANGE, "tensor element count overflows");
    }
    size_t nbytes;
    if (!pi2_mul_size(t.nelem, pi2_dtype_size(s->dt), &nbytes))
        return pk_fail(k, PI2_ERANGE, "tensor byte size overflows");
    if (t.nelem > 0) {
        /* contiguous as torch defines it: dims of size 1 may have any stride */
        uint64_t expect = 1;
        for (uint32_t i = nd; i-- > 0;) {
            if (t.shape[i] == 1)
                continue;
            if ((int64_t)stride[i].u < 0 || stride[i].u != expect) {
                char sz[160], sd[160];
                fmt_dims(sz, sizeof sz, size, nd);
                fmt_dims(sd, sizeof sd, stride, nd);
                return pk_fail(k, PI2_EUNSUPPORTED, "tensor of size %s is not contiguous (stride %s)", sz, sd);
            }
            expect *= (uint64_t)t.shape[i]; /* <= nelem: no overflow */
        }
    }
    if (a[4].kind != PV_BOOL)
        return pk_fail(k, PI2_EFORMAT, "tensor requires_grad is a %s, not a bool", pk_kind_name[a[4].kind]);
    if (a[5].kind != PV_DICT)
        return pk_fail(k, PI2_EFORMAT, "tensor backward_hooks is a %s, not a dict", pk_kind_name[a[5].kind]);
    if (!empty_dict(k, a[5]))
        return pk_fail(k, PI2_EUNSUPPORTED, "tensor has backward hooks");
    if (args.n == 7 && a[6].kind != PV_NONE) {
        if (a[6].kind != PV_DICT)
            return pk_fail(k, PI2_EFORMAT, "tensor metadata is a %s, not a dict", pk_kind_name[a[6].kind]);
        if (!empty_dict(k, a[6]))
            return pk_fail(k, PI2_EUNSUPPORTED, "tensor carries metadata (conjugate or negative bit)");
    }
    if (t.offset > s->numel || t.nelem > s->numel - t.offset) {
        const zmem *z = &k->m[s->member];
        return pk_fail(k, PI2_EFORMAT, "tensor of %zu elements at storage_offset %llu runs past the end of its storage "
                       "'%s' (%llu elements)", t.nelem, (unsigned long long)t.offset, tz_show_n(z->name, z->nlen).s,
                       (unsigned long long)s->numel);
    }
    if (k->ntens >= PI2_ST_MAX_TENSORS)
        return pk_fail(k, PI2_ERANGE, "more than %u tensors", (unsigned)PI2_ST_MAX_TENSORS);
    int rc = pk_spend(k, 1);
    if (rc != 0)
        return rc;
    if (pi2_grow(&k->tens, &k->tenscap, k->ntens, sizeof *k->tens, 16) != 0)
        return pk_nomem(k);
    k->tens[k->ntens] = t;
    *out = (pv){ .kind = PV_TENSOR, .u = k->ntens++ };
    return 0;
}

static int pk_reduce(pk *k, pv fn, pv args, pv *out)
{
    if (fn.kind != PV_GLOBAL)
        return pk_fail(k, PI2_EUNSUPPORTED, "REDUCE of a %s", pk_kind_name[fn.kind]);
    if (args.kind != PV_TUPLE)
        return pk_fail(k, PI2_EFORMAT, "REDUCE arguments are a %s, not a tuple", pk_kind_name[args.kind]);
    const pv *a = args.n ? k->kids + args.u : NULL; /* no items stored yet for () */
    switch (fn.g) {
    case G_ODICT:
        if (args.n != 0)
            return pk_fail(k, PI2_EUNSUPPORTED, "collections.OrderedDict called with %u arguments", args.n);
        return pk_new_dict(k, true, out);
    case G_REBUILD_V2:
        return pk_tensor(k, args, out);
    case G_REBUILD_PARAM:
        if (args.n != 3 || a[0].kind != PV_TENSOR || a[1].kind != PV_BOOL || a[2].kind != PV_DICT)
            return pk_fail(k, PI2_EFORMAT, "_rebuild_parameter takes (tensor, bool, dict)");
        if (!empty_dict(k, a[2]))
            return pk_fail(k, PI2_EUNSUPPORTED, "parameter has backward hooks");
        *out = a[0];
        return 0;
    default:
        return pk_fail(k, PI2_EUNSUPPORTED, "REDUCE of torch.%s", pk_storage_name((pi2_dtype)(fn.g - G_STORAGE)));
    }
}

/* Read one '\n'-terminated GLOBAL operand line. */
static int pk_line(pk *k, pi2_cursor *c, const uint8_t **s, size_t *n)
{
    size_t lim = c->left < PI2_TZ_MAX_STR + 1 ? c->left : PI2_TZ_MAX_STR + 1;
    const uint8_t *nl = memchr(c->p, '\n', lim);
    if (!nl)
        return c->left > PI2_TZ_MAX_STR ? pk_fail(k, PI2_ERANGE, "GLOBAL name longer than %u bytes",
                                                  (unsigned)PI2_TZ_MAX_STR)
                                        : pk_fail(k, PI2_EFORMAT, "GLOBAL operand runs past the end of data.pkl");
    *s = c->p;
    *n = (size_t)(nl - c->p);
    const uint8_t *skip;
    pi2_cursor_take(c, *n + 1, &skip);
    return 0;
}

static int pk_memo_put(pk *k, uint8_t op, uint64_t i)
{
    int rc = pk_need(k, op, 1);
    if (rc != 0)
        return rc;
    if (i < k->nmemo) {
        k->memo[i] = k->st[k->sp - 1];
        return 0;
    }
    if (i > k->nmemo)
        return pk_fail(k, PI2_EFORMAT, "memo index %llu skips past the memo's %zu entries", (unsigned long long)i,
                       k->nmemo);
    if (k->nmemo >= PI2_TZ_MAX_MEMO)
        return pk_fail(k, PI2_ERANGE, "more than %u memo entries", (unsigned)PI2_TZ_MAX_MEMO);
    if (pi2_grow(&k->memo, &k->memocap, k->nmemo, sizeof *k->memo, 64) != 0)
        return pk_nomem(k);
    k->memo[k->nmemo++] = k->st[k->sp - 1];
    return 0;
}

static int pk_memo_get(pk *k, uint64_t i)
{
    if (i >= k->nmemo)
        return pk_fail(k, PI2_EFORMAT, "memo index %llu out of range (%zu entries)", (unsigned long long)i, k->nmemo);
    return pk_push(k, k->memo[i]);
}

/* The operand of n bytes after op. */
static int pk_arg(pk *k, pi2_cursor *c, uint8_t op, size_t n, const uint8_t **q)
{
    if (!pi2_cursor_take(c, n, q))
        return pk_fail(k, PI2_EFORMAT, "%s operand runs past the end of data.pkl", op_name(op));
    return 0;
}

/* PROTO, FRAME, MARK: framing and the MARK stack. */
static int pk_op_frame(pk *k, pi2_cursor *c, uint8_t op)
{
    const uint8_t *q;
    int rc;
    if (op == OP_MARK) {
        if (k->nmarks >= PI2_TZ_MAX_MARKS)
            return pk_fail(k, PI2_ERANGE, "more than %d nested MARKs", PI2_TZ_MAX_MARKS);
        k->marks[k->nmarks++] = k->sp;
        return 0;
    }
    if (op == OP_PROTO) {
        if ((rc = pk_arg(k, c, op, 1, &q)) != 0)
            return rc;
        if (*q > 5)
            return pk_fail(k, PI2_EUNSUPPORTED, "pickle protocol %u (known: 0-5)", *q);
        return 0;
    }
    if ((rc = pk_arg(k, c, op, 8, &q)) != 0) /* FRAME */
        return rc;
    uint64_t fl = rd64(q);
    if (fl > c->left)
        return pk_fail(k, PI2_EFORMAT, "FRAME of %llu bytes runs past the end of data.pkl", (unsigned long long)fl);
    return 0;
}

/* STOP: exactly the result left, nothing after it. */
static int pk_op_stop(pk *k, const pi2_cursor *c, pv *result)
{
    if (k->nmarks)
        return pk_fail(k, PI2_EFORMAT, "STOP with %zu open MARKs", k->nmarks);
    if (k->sp != 1)
        return pk_fail(k, PI2_EFORMAT, "STOP with %zu values on the stack, not 1", k->sp);
    if (c->left)
        return pk_fail(k, PI2_EFORMAT, "%zu bytes after STOP", c->left);
    *result = k->st[0];
    return 0;
}

/* LONG1: a little-endian two's complement integer of up to 8 bytes. */
static int pk_op_long1(pk *k, pi2_cursor *c, uint8_t op)
{
    const uint8_t *q;
    int rc;
    if ((rc = pk_arg(k, c, op, 1, &q)) != 0)
        return rc;
    size_t n = *q;
    if (n > 8)
        return pk_fail(k, PI2_ERANGE, "integer of %zu bytes (limit 8)", n);
    if ((rc = pk_arg(k, c, op, n, &q)) != 0)
        return rc;
    uint64_t u = 0;
    for (size_t i = 0; i < n; i++)
        u |= (uint64_t)q[i] << (8 * i);
    if (n > 0 && n < 8 && (q[n - 1] & 0x80))
        u |= ~(uint64_t)0 << (8 * n); /* sign-extend: two's complement bits */
    return pk_push(k, (pv){ .kind = PV_INT, .u = u });
}

/* BINUNICODE, SHORT_BINUNICODE, BINUNICODE8: a UTF-8 string, kept in place. */
static int pk_op_unicode(pk *k, pi2_cursor *c, uint8_t op)
{
    const uint8_t *q;
    int rc;
    uint64_t n;
    if (op == OP_SHORT_BINUNICODE) {
        if ((rc = pk_arg(k, c, op, 1, &q)) != 0)
            return rc;
        n = *q;
    } else if (op == OP_BINUNICODE) {
        if ((rc = pk_arg(k, c, op, 4, &q)) != 0)
            return rc;
        n = rd32(q);
    } else {
        if ((rc = pk_arg(k, c, op, 8, &q)) != 0)
            return rc;
        n = rd64(q);
    }
    if (n > PI2_TZ_MAX_STR)
        return pk_fail(k, PI2_ERANGE, "string of %llu bytes (limit %u)", (unsigned long long)n,
                       (unsigned)PI2_TZ_MAX_STR);
    if ((rc = pk_arg(k, c, op, (size_t)n, &q)) != 0)
        return rc;
    if (!tz_utf8_valid(q, (size_t)n))
        return pk_fail(k, PI2_EFORMAT, "string is not valid UTF-8");
    return pk_push(k, (pv){ .kind = PV_STR, .n = (uint32_t)n, .u = (uint64_t)(q - k->p0) });
}

/* NONE, NEWTRUE, NEWFALSE, BININT, BININT1, BININT2: the fixed-size scalars. */
static int pk_op_scalar(pk *k, pi2_cursor *c, uint8_t op)
{
    const uint8_t *q;
    int rc;
    switch (op) {
    case OP_NONE:
        return pk_push(k, (pv){ .kind = PV_NONE });
    case OP_NEWTRUE:
    case OP_NEWFALSE:
        return pk_push(k, (pv){ .kind = PV_BOOL, .u = op == OP_NEWTRUE });
    case OP_BININT:
        if ((rc = pk_arg(k, c, op, 4, &q)) != 0)
            return rc;
        return pk_push(k, (pv){ .kind = PV_INT, .u = (uint64_t)((int64_t)(rd32(q) ^ 0x80000000u) - 0x80000000) });
    case OP_BININT1:
        if ((rc = pk_arg(k, c, op, 1, &q)) != 0)
            return rc;
        return pk_push(k, (pv){ .kind = PV_INT, .u = *q });
    default: /* OP_BININT2 */
        if ((rc = pk_arg(k, c, op, 2, &q)) != 0)
            return rc;
        return pk_push(k, (pv){ .kind = PV_INT, .u = rd16(q) });
    }
}

/* BINPUT, LONG_BINPUT, MEMOIZE, BINGET, LONG_BINGET. */
static int pk_op_memo(pk *k, pi2_cursor *c, uint8_t op)
{
    const uint8_t *q;
    int rc;
    switch (op) {
    case OP_MEMOIZE:
        return pk_memo_put(k, op, k->nmemo);
    case OP_BINPUT:
    case OP_BINGET:
        if ((rc = pk_arg(k, c, op, 1, &q)) != 0)
            return rc;
        return op == OP_BINPUT ? pk_memo_put(k, op, *q) : pk_memo_get(k, *q);
    default: /* OP_LONG_BINPUT, OP_LONG_BINGET */
        if ((rc = pk_arg(k, c, op, 4, &q)) != 0)
            return rc;
        return op == OP_LONG_BINPUT ? pk_memo_put(k, op, rd32(q)) : pk_memo_get(k, rd32(q));
    }
}

/* EMPTY_TUPLE, TUPLE, TUPLE1-3, EMPTY_LIST, EMPTY_DICT: new containers. */
static int pk_op_new(pk *k, uint8_t op)
{
    pv v = { 0 };
    int rc;
    size_t from = 0, n = 0;
    switch (op) {
    case OP_EMPTY_DICT:
        if ((rc = pk_new_dict(k, false, &v)) != 0)
            return rc;
        return pk_push(k, v);
    case OP_EMPTY_LIST:
        return pk_push(k, (pv){ .kind = PV_LIST });
    case OP_EMPTY_TUPLE:
        return pk_push(k, (pv){ .kind = PV_TUPLE });
    case OP_TUPLE:
        if ((rc = pk_pop_mark(k, op, &from, &n)) != 0 || (rc = pk_tuple(k, from, n, &v)) != 0)
            return rc;
        k->sp = from;
        return pk_push(k, v);
    default: /* OP_TUPLE1, OP_TUPLE2, OP_TUPLE3 */
        n = (size_t)(op - OP_TUPLE1 + 1);
        if ((rc = pk_need(k, op, n)) != 0 || (rc = pk_tuple(k, k->sp - n, n, &v)) != 0)
            return rc;
        k->sp -= n;
        return pk_push(k, v);
    }
}

/* SETITEM, SETITEMS, APPEND, APPENDS: filling dicts (lists are dropped). */
static int pk_op_fill(pk *k, uint8_t op)
{
    int rc;
    if (op == OP_SETITEM) {
        if ((rc = pk_need(k, op, 3)) != 0)
            return rc;
        pv d = k->st[k->sp - 3];
        if (d.kind != PV_DICT)
            return pk_fail(k, PI2_EFORMAT, "SETITEM on a %s", pk_kind_name[d.kind]);
        if ((rc = pk_setitem(k, d, k->st[k->sp - 2], k->st[k->sp - 1])) != 0)
            return rc;
        k->sp -= 2;
        return 0;
    }
    if (op == OP_APPEND) {
        if ((rc = pk_need(k, op, 2)) != 0)
            return rc;
        if (k->st[k->sp - 2].kind != PV_LIST)
            return pk_fail(k, PI2_EFORMAT, "APPEND on a %s", pk_kind_name[k->st[k->sp - 2].kind]);
        k->sp--;
        return 0;
    }
    size_t from = 0, n = 0; /* SETITEMS, APPENDS */
    if ((rc = pk_pop_mark(k, op, &from, &n)) != 0)
        return rc;
    if (from <= pk_base(k))
        return pk_fail(k, PI2_EFORMAT, "stack underflow: %s has no %s under its MARK", op_name(op),
                       op == OP_SETITEMS ? "dict" : "list");
    pv d = k->st[from - 1];
    if (d.kind != (op == OP_SETITEMS ? PV_DICT : PV_LIST))
        return pk_fail(k, PI2_EFORMAT, "%s on a %s", op_name(op), pk_kind_name[d.kind]);
    if (op == OP_SETITEMS) {
        if (n % 2)
            return pk_fail(k, PI2_EFORMAT, "SETITEMS with an odd number (%zu) of values", n);
        for (size_t i = 0; i < n; i += 2)
            if ((rc = pk_setitem(k, d, k->st[from + i], k->st[from + i + 1])) != 0)
                return rc;
    }
    k->sp = from; /* list items are not kept: no state dict value lives in a list */
    return 0;
}

/* GLOBAL, STACK_GLOBAL: a name from the allowed table. */
static int pk_op_global(pk *k, pi2_cursor *c, uint8_t op)
{
    pv v = { 0 };
    int rc;
    if (op == OP_GLOBAL) {
        const uint8_t *mod, *name;
        size_t ml, nl;
        if ((rc = pk_line(k, c, &mod, &ml)) != 0 || (rc = pk_line(k, c, &name, &nl)) != 0 ||
            (rc = pk_global(k, mod, ml, name, nl, &v)) != 0)
            return rc;
        return pk_push(k, v);
    }
    if ((rc = pk_need(k, op, 2)) != 0)
        return rc;
    pv mod = k->st[k->sp - 2], name = k->st[k->sp - 1];
    if (mod.kind != PV_STR || name.kind != PV_STR)
        return pk_fail(k, PI2_EFORMAT, "STACK_GLOBAL of a %s and a %s", pk_kind_name[mod.kind],
                       pk_kind_name[name.kind]);
    if ((rc = pk_global(k, k->p0 + mod.u, mod.n, k->p0 + name.u, name.n, &v)) != 0)
        return rc;
    k->sp -= 2;
    return pk_push(k, v);
}

/* REDUCE, BUILD, BINPERSID: the objects a state dict is made of. */
static int pk_op_object(pk *k, uint8_t op)
{
    pv v = { 0 };
    int rc;
    if (op == OP_BINPERSID) {
        if ((rc = pk_need(k, op, 1)) != 0 || (rc = pk_storage(k, k->st[k->sp - 1], &v)) != 0)
            return rc;
        k->st[k->sp - 1] = v;
        return 0;
    }
    if ((rc = pk_need(k, op, 2)) != 0)
        return rc;
    if (op == OP_REDUCE) {
        if ((rc = pk_reduce(k, k->st[k->sp - 2], k->st[k->sp - 1], &v)) != 0)
            return rc;
        k->sp -= 2;
        return pk_push(k, v);
    }
    pv obj = k->st[k->sp - 2], state = k->st[k->sp - 1]; /* BUILD */
    if (obj.kind != PV_DICT || !k->dicts[obj.u].ordered)
        return pk_fail(k, PI2_EUNSUPPORTED, "BUILD on a %s",
                       obj.kind == PV_DICT ? "plain dict" : pk_kind_name[obj.kind]);
    if (state.kind != PV_DICT)
        return pk_fail(k, PI2_EUNSUPPORTED, "BUILD of an OrderedDict with a %s state", pk_kind_name[state.kind]);
    k->sp--; /* the state (a module's _metadata) is dropped */
    return 0;
}

/* One opcode other than STOP, by family; the rest are refused. */
static int pk_step(pk *k, pi2_cursor *c, uint8_t op)
{
    switch (op) {
    case OP_PROTO:
    case OP_FRAME:
    case OP_MARK:
        return pk_op_frame(k, c, op);
    case OP_NONE:
    case OP_NEWTRUE:
    case OP_NEWFALSE:
    case OP_BININT:
    case OP_BININT1:
    case OP_BININT2:
        return pk_op_scalar(k, c, op);
    case OP_LONG1:
        return pk_op_long1(k, c, op);
    case OP_BINUNICODE:
    case OP_SHORT_BINUNICODE:
    case OP_BINUNICODE8:
        return pk_op_unicode(k, c, op);
    case OP_BINPUT:
    case OP_LONG_BINPUT:
    case OP_MEMOIZE:
    case OP_BINGET:
    case OP_LONG_BINGET:
        return pk_op_memo(k, c, op);
    case OP_EMPTY_DICT:
    case OP_EMPTY_LIST:
    case OP_EMPTY_TUPLE:
    case OP_TUPLE:
    case OP_TUPLE1:
    case OP_TUPLE2:
    case OP_TUPLE3:
        return pk_op_new(k, op);
    case OP_SETITEM:
    case OP_SETITEMS:
    case OP_APPEND:
    case OP_APPENDS:
        return pk_op_fill(k, op);
    case OP_GLOBAL:
    case OP_STACK_GLOBAL:
        return pk_op_global(k, c, op);
    case OP_REDUCE:
    case OP_BUILD:
    case OP_BINPERSID:
        return pk_op_object(k, op);
    default: {
        const char *nm = op_name(op);
        return nm ? pk_fail(k, PI2_EUNSUPPORTED, "refused opcode %s (0x%02x)", nm, op)
                  : pk_fail(k, PI2_EUNSUPPORTED, "refused opcode 0x%02x (not a pickle opcode)", op);
    }
    }
}

/* Run data.pkl to STOP; *result gets the value it returns. */
int pk_run(pk *k, pv *result)
{
    pi2_cursor c = { k->p0, k->len };
    for (;;) {
        k->at = k->len - c.left;
        const uint8_t *p;
        if (!pi2_cursor_take(&c, 1, &p))
            return pk_fail(k, PI2_EFORMAT, "data.pkl ends without STOP");
        if (*p == OP_STOP)
            return pk_op_stop(k, &c, result);
        int rc = pk_step(k, &c, *p);
        if (rc != 0)
            return rc;
    }
}

void pk_free(pk *k)
{
    free(k->mem_stor);
    free(k->st);
    free(k->memo);
    free(k->kids);
    free(k->dicts);
    free(k->items);
    free(k->stors);
    free(k->tens);
    free(k->pkl_copy);
}
