/* Chat templates: the built-in filters, tests, methods and functions, with
 * the semantics of Jinja 3 and Python's str and dict, as far as published
 * chat templates use them. */
#include "formats/jinja_internal.h"

#include <stdlib.h>
#include <string.h>

static jx_val list_val(jx_list *l) { return (jx_val){.t = V_LIST, .u.l = l}; }

static bool name_is(const char *a, const char *s, size_t n) { return strlen(a) == n && memcmp(a, s, n) == 0; }

jx_val jx_getattr(jx_ctx *c, jx_val v, const char *name, size_t n, size_t pos)
{
    if (v.t == V_UNDEF)
        jx_fail(c, pos, PI2_EFORMAT, "'%s' is undefined", v.s ? v.s : "value");
    if (v.t == V_DICT || v.t == V_NS) {
        jx_cost(c, v.u.d->n >> 3, pos);
        const jx_val *r = jx_dict_get(v.u.d, name, n);
        return r ? *r : jx_undef(NULL);
    }
    if (v.t == V_LOOP) {
        const jx_loop *l = v.u.loop;
        size_t len = l->items->n, i = l->i0;
        if (name_is("index", name, n)) return jx_int((int64_t)i + 1);
        if (name_is("index0", name, n)) return jx_int((int64_t)i);
        if (name_is("revindex", name, n)) return jx_int((int64_t)(len - i));
        if (name_is("revindex0", name, n)) return jx_int((int64_t)(len - i - 1));
        if (name_is("first", name, n)) return jx_bool(i == 0);
        if (name_is("last", name, n)) return jx_bool(i + 1 == len);
        if (name_is("length", name, n)) return jx_int((int64_t)len);
        if (name_is("depth", name, n)) return jx_int(1);
        if (name_is("depth0", name, n)) return jx_int(0);
        if (name_is("previtem", name, n)) return i > 0 ? l->items->v[i - 1] : jx_undef("previtem");
        if (name_is("nextitem", name, n)) return i + 1 < len ? l->items->v[i + 1] : jx_undef("nextitem");
    }
    return jx_undef(NULL);
}

jx_list *jx_iterate(jx_ctx *c, jx_val v, size_t pos)
{
    jx_list *l;
    switch (v.t) {
    case V_UNDEF: return jx_list_new(c, 0);
    case V_LIST: return v.u.l;
    case V_DICT: case V_NS:
        l = jx_list_new(c, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++)
            jx_list_push(c, l, v.u.d->k[i]);
        return l;
    case V_STR:
        l = jx_list_new(c, 0);
        for (size_t i = 0; i < v.n;) {
            size_t e = i + jx_u8_offset(v.s + i, v.n - i, 1);
            jx_list_push(c, l, jx_str(v.s + i, e - i));
            i = e;
        }
        return l;
    default: jx_fail(c, pos, PI2_EFORMAT, "'%s' object is not iterable", jx_type_name(v));
    }
}

/* ---- strings ---- */
static char up(char ch) { return ch >= 'a' && ch <= 'z' ? (char)(ch - 32) : ch; }
static char low(char ch) { return ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch; }
static bool alpha(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); }

static jx_val need_str(jx_ctx *c, jx_val v, size_t pos, const char *what)
{
    if (v.t != V_STR)
        jx_fail(c, pos, PI2_EFORMAT, "%s needs a string, not %s", what, jx_type_name(v));
    return v;
}

/* mode: 'u' upper, 'l' lower, 'c' capitalize, 't' Python's str.title,
 * 'T' Jinja's title filter (words start after '-', whitespace or an opening bracket). */
static jx_val recase(jx_ctx *c, jx_val s, char mode, size_t pos)
{
    need_str(c, s, pos, "case mapping");
    char *o = jx_alloc(c, s.n + 1);
    bool prev_cased = false, word_start = true;
    for (size_t i = 0; i < s.n; i++) {
        char ch = s.s[i];
        switch (mode) {
        case 'u': o[i] = up(ch); break;
        case 'l': o[i] = low(ch); break;
        case 'c': o[i] = i == 0 ? up(ch) : low(ch); break;
        case 't':
            o[i] = prev_cased ? low(ch) : up(ch);
            prev_cased = alpha(ch) || ((unsigned char)ch >= 0x80 && prev_cased);
            break;
        default:
            o[i] = word_start ? up(ch) : low(ch);
            word_start = strchr("- \t\n\r\f\v([{<", ch) != NULL && ch;
            break;
        }
    }
    return jx_str(o, s.n);
}

static bool has_prefix(jx_val s, jx_val p, bool suffix)
{
    if (p.n > s.n)
        return false;
    return p.n == 0 || memcmp(s.s + (suffix ? s.n - p.n : 0), p.s, p.n) == 0;
}

static jx_val replace(jx_ctx *c, jx_val s, jx_val a, jx_val b, int64_t count, size_t pos)
{
    need_str(c, s, pos, "replace");
    need_str(c, a, pos, "replace");
    b = jx_stringify(c, b, pos);
    jx_buf o = {0};
    jx_buf_add(c, &o, "", 0);
    size_t i = 0;
    int64_t done = 0;
    if (a.n == 0) { /* between every character, as Python */
        for (;;) {
            if (count < 0 || done < count) {
                jx_buf_add(c, &o, b.s, b.n);
                done++;
            }
            if (i >= s.n)
                break;
            size_t e = i + jx_u8_offset(s.s + i, s.n - i, 1);
            jx_buf_add(c, &o, s.s + i, e - i);
            i = e;
            jx_step(c, pos);
        }
        return jx_buf_val(&o);
    }
    while (i < s.n) {
        if ((count < 0 || done < count) && s.n - i >= a.n && memcmp(s.s + i, a.s, a.n) == 0) {
            jx_buf_add(c, &o, b.s, b.n);
            i += a.n;
            done++;
        } else {
            jx_buf_add(c, &o, s.s + i, 1);
            i++;
        }
    }
    return jx_buf_val(&o);
}

/* Python's str.split(sep=None, maxsplit=-1). */
static jx_val split(jx_ctx *c, jx_val s, const jx_val *sep, int64_t maxsplit, size_t pos)
{
    need_str(c, s, pos, "split");
    jx_list *l = jx_list_new(c, 0);
    size_t i = 0, len;
    if (!sep || sep->t == V_NONE) {
        for (;;) {
            while (i < s.n && jx_u8_space(s.s + i, s.n - i, &len))
                i += len;
            if (i >= s.n)
                break;
            size_t st = i;
            if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                jx_list_push(c, l, jx_str(s.s + st, s.n - st)); /* the rest, as it is */
                break;
            }
            while (i < s.n && !jx_u8_space(s.s + i, s.n - i, &len))
                i += len;
            jx_list_push(c, l, jx_str(s.s + st, i - st));
        }
        return list_val(l);
    }
    need_str(c, *sep, pos, "split");
    if (sep->n == 0)
        jx_fail(c, pos, PI2_EFORMAT, "empty separator");
    size_t st = 0;
    while (i + sep->n <= s.n) {
        if ((maxsplit < 0 || (int64_t)l->n < maxsplit) && memcmp(s.s + i, sep->s, sep->n) == 0) {
            jx_list_push(c, l, jx_str(s.s + st, i - st));
            i += sep->n;
            st = i;
        } else {
            i++;
        }
    }
    jx_list_push(c, l, jx_str(s.s + st, s.n - st));
    return list_val(l);
}

/* ---- arguments ---- */
typedef struct {
    jx_ctx *c;
    size_t pos;
    const char *what;
    jx_val *args;
    const char **kw;
    size_t n;
} argv_t;

/* Argument i by position or by keyword name; NULL when not given. */
static const jx_val *arg(const argv_t *a, size_t i, const char *name)
{
    if (i < a->n && !a->kw[i])
        return &a->args[i];
    for (size_t k = 0; k < a->n; k++)
        if (a->kw[k] && name && strcmp(a->kw[k], name) == 0)
            return &a->args[k];
    return NULL;
}

static void max_args(const argv_t *a, size_t n)
{
    if (a->n > n)
        jx_fail(a->c, a->pos, PI2_EFORMAT, "%s takes at most %zu argument%s", a->what, n, n == 1 ? "" : "s");
}

static int64_t int_arg(const argv_t *a, size_t i, const char *name, int64_t def)
{
    const jx_val *v = arg(a, i, name);
    if (!v || v->t == V_NONE)
        return def;
    if (v->t != V_INT && v->t != V_BOOL)
        jx_fail(a->c, a->pos, PI2_EFORMAT, "%s: '%s' must be an integer", a->what, name);
    return v->t == V_INT ? v->u.i : v->u.b;
}

static bool method_str(const argv_t *a, jx_val s, const char *m, jx_val *out)
{
    jx_ctx *c = a->c;
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        max_args(a, 1);
        *out = jx_strip(c, s, m[0] != 'r', m[0] != 'l', arg(a, 0, "chars"), a->pos);
    } else if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize")) {
        max_args(a, 0);
        *out = recase(c, s, m[0] == 'u' ? 'u' : m[0] == 'l' ? 'l' : m[0] == 't' ? 't' : 'c', a->pos);
    } else if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        const jx_val *p = arg(a, 0, NULL);
        max_args(a, 1);
        if (!p)
            jx_fail(c, a->pos, PI2_EFORMAT, "%s needs an argument", m);
        bool r = false;
        if (p->t == V_LIST) {
            for (size_t i = 0; i < p->u.l->n && !r; i++)
                r = has_prefix(s, need_str(c, p->u.l->v[i], a->pos, m), m[0] == 'e');
        } else {
            r = has_prefix(s, need_str(c, *p, a->pos, m), m[0] == 'e');
        }
        *out = jx_bool(r);
    } else if (!strcmp(m, "split")) {
        max_args(a, 2);
        *out = split(c, s, arg(a, 0, "sep"), int_arg(a, 1, "maxsplit", -1), a->pos);
    } else if (!strcmp(m, "replace")) {
        const jx_val *x = arg(a, 0, NULL), *y = arg(a, 1, NULL);
        max_args(a, 3);
        if (!x || !y)
            jx_fail(c, a->pos, PI2_EFORMAT, "replace needs two arguments");
        *out = replace(c, s, *x, *y, int_arg(a, 2, "count", -1), a->pos);
    } else {
        return false;
    }
    return true;
}

static bool method_dict(const argv_t *a, jx_val d, const char *m, jx_val *out)
{
    jx_ctx *c = a->c;
    jx_dict *dd = d.u.d;
    if (!strcmp(m, "get")) {
        const jx_val *k = arg(a, 0, NULL), *def = arg(a, 1, NULL);
        max_args(a, 2);
        if (!k)
            jx_fail(c, a->pos, PI2_EFORMAT, "get needs a key");
        *out = def ? *def : jx_none();
        for (size_t i = 0; i < dd->n; i++)
            if (jx_equal(dd->k[i], *k))
                *out = dd->v[i];
    } else if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
        max_args(a, 0);
        jx_list *l = jx_list_new(c, dd->n);
        for (size_t i = 0; i < dd->n; i++) {
            if (m[0] == 'i') {
                jx_list *p = jx_list_new(c, 2);
                p->tuple = true;
                jx_list_push(c, p, dd->k[i]);
                jx_list_push(c, p, dd->v[i]);
                jx_list_push(c, l, list_val(p));
            } else {
                jx_list_push(c, l, m[0] == 'k' ? dd->k[i] : dd->v[i]);
            }
        }
        *out = list_val(l);
    } else {
        return false;
    }
    return true;
}

bool jx_method(jx_ctx *c, size_t pos, jx_val obj, const char *name, jx_val *args, const char **kw, size_t n,
               jx_val *out)
{
    argv_t a = {c, pos, name, args, kw, n};
    if (obj.t == V_STR)
        return method_str(&a, obj, name, out);
    if (obj.t == V_DICT) /* methods win over keys for `.`, as in Jinja */
        return method_dict(&a, obj, name, out);
    if (obj.t == V_LOOP && !strcmp(name, "cycle")) {
        if (n == 0)
            jx_fail(c, pos, PI2_EFORMAT, "no items for cycling given");
        *out = args[obj.u.loop->i0 % n];
        return true;
    }
    if (obj.t == V_LIST && (!strcmp(name, "append") || !strcmp(name, "pop") || !strcmp(name, "extend") ||
                            !strcmp(name, "insert") || !strcmp(name, "remove") || !strcmp(name, "clear")))
        jx_fail(c, pos, PI2_EFORMAT, "a list cannot be changed in a chat template (%s)", name);
    return false;
}

jx_val jx_call_fn(jx_ctx *c, size_t pos, int fn, jx_val *args, const char **kw, size_t n)
{
    argv_t a = {c, pos, fn == FN_RAISE ? "raise_exception" : fn == FN_RANGE ? "range" : "namespace", args, kw, n};
    if (fn == FN_RAISE) {
        jx_val m = n ? jx_stringify(c, args[0], pos) : jx_str("", 0);
        jx_fail(c, pos, PI2_EINVAL, "%.*s", (int)(m.n > 300 ? 300 : m.n), m.s);
    }
    if (fn == FN_RANGE) {
        max_args(&a, 3);
        if (n == 0)
            jx_fail(c, pos, PI2_EFORMAT, "range expected at least 1 argument");
        int64_t lo = 0, hi, step = 1;
        if (n == 1) {
            hi = int_arg(&a, 0, "stop", 0);
        } else {
            lo = int_arg(&a, 0, "start", 0);
            hi = int_arg(&a, 1, "stop", 0);
            step = int_arg(&a, 2, "step", 1);
        }
        if (step == 0)
            jx_fail(c, pos, PI2_EFORMAT, "range() arg 3 must not be zero");
        /* the number of items, computed without overflow */
        bool up_ = step > 0;
        uint64_t span = up_ ? (hi > lo ? (uint64_t)hi - (uint64_t)lo : 0) : (lo > hi ? (uint64_t)lo - (uint64_t)hi : 0);
        uint64_t st = up_ ? (uint64_t)step : (uint64_t)0 - (uint64_t)step;
        uint64_t cnt = span / st + (span % st != 0);
        if (cnt > JX_MAX_RANGE)
            jx_fail(c, pos, PI2_ERANGE, "range too big (at most %d items)", JX_MAX_RANGE);
        jx_list *l = jx_list_new(c, (size_t)cnt);
        int64_t x = lo;
        for (uint64_t i = 0; i < cnt; i++) {
            jx_list_push(c, l, jx_int(x));
            if (i + 1 < cnt) /* x stays between lo and hi */
                x += step;
        }
        return list_val(l);
    }
    /* namespace(key=value, ...) or namespace(dict) */
    jx_dict *d = jx_dict_new(c, n);
    for (size_t i = 0; i < n; i++) {
        if (kw[i]) {
            jx_dict_set(c, d, jx_str(kw[i], strlen(kw[i])), args[i]);
        } else if (args[i].t == V_DICT) {
            for (size_t k = 0; k < args[i].u.d->n; k++)
                jx_dict_set(c, d, args[i].u.d->k[k], args[i].u.d->v[k]);
        } else {
            jx_fail(c, pos, PI2_EFORMAT, "namespace takes keyword arguments or a dict");
        }
    }
    return (jx_val){.t = V_NS, .u.d = d};
}

/* ---- tests ---- */
static bool run_test(jx_ctx *c, const char *name, size_t pos, jx_val v, jx_val *args, size_t n)
{
    const jx_val *x = n ? &args[0] : NULL;
    bool isint = v.t == V_INT;
#define T(s) (!strcmp(name, s))
    if (T("defined")) return v.t != V_UNDEF;
    if (T("undefined")) return v.t == V_UNDEF;
    if (T("none")) return v.t == V_NONE;
    if (T("string")) return v.t == V_STR;
    if (T("number") || T("integer")) return isint;
    if (T("float")) return false;
    if (T("boolean")) return v.t == V_BOOL;
    if (T("true")) return v.t == V_BOOL && v.u.b;
    if (T("false")) return v.t == V_BOOL && !v.u.b;
    if (T("mapping")) return v.t == V_DICT;
    if (T("sequence")) return v.t == V_STR || v.t == V_LIST || v.t == V_DICT || v.t == V_UNDEF;
    if (T("iterable")) return v.t == V_STR || v.t == V_LIST || v.t == V_DICT || v.t == V_NS || v.t == V_UNDEF;
    if (T("callable")) return v.t == V_FUNC;
    if (T("lower") || T("upper")) {
        if (v.t != V_STR)
            jx_fail(c, pos, PI2_EFORMAT, "test '%s' needs a string", name);
        bool cased = false;
        for (size_t i = 0; i < v.n; i++) {
            if (alpha(v.s[i]))
                cased = true;
            if ((T("lower") && v.s[i] >= 'A' && v.s[i] <= 'Z') || (T("upper") && v.s[i] >= 'a' && v.s[i] <= 'z'))
                return false;
        }
        return cased;
    }
    if (T("even") || T("odd") || T("divisibleby")) {
        if (v.t != V_INT && v.t != V_BOOL)
            jx_fail(c, pos, PI2_EFORMAT, "test '%s' needs an integer, not %s", name, jx_type_name(v));
        int64_t i = v.t == V_INT ? v.u.i : v.u.b;
        if (T("even")) return i % 2 == 0;
        if (T("odd")) return i % 2 != 0;
        if (!x || (x->t != V_INT) || x->u.i == 0)
            jx_fail(c, pos, PI2_EFORMAT, "divisibleby needs a nonzero integer");
        return x->u.i == -1 || i % x->u.i == 0;
    }
    if (!x && (T("eq") || T("equalto") || T("ne") || T("lt") || T("le") || T("gt") || T("ge") || T("in") ||
               T("sameas") || T("==") || T("!=")))
        jx_fail(c, pos, PI2_EFORMAT, "test '%s' needs an argument", name);
    if (T("eq") || T("equalto") || T("==")) return jx_equal(v, *x);
    if (T("ne") || T("!=")) return !jx_equal(v, *x);
    if (T("sameas")) return jx_equal(v, *x) && v.t == x->t && (v.t != V_STR || v.s == x->s);
    if (T("in")) {
        jx_cost(c, x->t == V_STR ? x->n >> 5 : x->t == V_LIST ? x->u.l->n : 0, pos);
        if (x->t == V_LIST || x->t == V_DICT || x->t == V_STR) {
            jx_list *l = jx_iterate(c, *x, pos);
            if (x->t == V_STR && v.t == V_STR)
                return v.n == 0 || memmem(x->s, x->n, v.s, v.n) != NULL;
            for (size_t i = 0; i < l->n; i++)
                if (jx_equal(l->v[i], v))
                    return true;
            return false;
        }
        jx_fail(c, pos, PI2_EFORMAT, "test 'in' needs a container");
    }
    if (T("lt") || T("le") || T("gt") || T("ge")) {
        if (!(v.t == V_INT && x->t == V_INT) && !(v.t == V_STR && x->t == V_STR))
            jx_fail(c, pos, PI2_EFORMAT, "test '%s' compares integers or strings", name);
        int r;
        if (v.t == V_INT) {
            r = (v.u.i > x->u.i) - (v.u.i < x->u.i);
        } else {
            size_t m = v.n < x->n ? v.n : x->n;
            r = m ? memcmp(v.s, x->s, m) : 0;
            r = r ? (r > 0) - (r < 0) : (v.n > x->n) - (v.n < x->n);
        }
        return T("lt") ? r < 0 : T("le") ? r <= 0 : T("gt") ? r > 0 : r >= 0;
    }
#undef T
    jx_fail(c, pos, PI2_EFORMAT, "no test named '%s'", name);
}

bool jx_test(jx_ctx *c, const jx_expr *e, jx_val v, jx_val *args, size_t n)
{
    return run_test(c, e->name, e->pos, v, args, n);
}

/* ---- filters ---- */
static jx_val filt_select(jx_ctx *c, const argv_t *a, jx_val v, bool attr, bool reject)
{
    jx_list *src = jx_iterate(c, v, a->pos), *out = jx_list_new(c, 0);
    size_t first = attr ? 1 : 0;
    const jx_val *an = attr ? arg(a, 0, NULL) : NULL;
    if (attr && (!an || an->t != V_STR))
        jx_fail(c, a->pos, PI2_EFORMAT, "%s needs an attribute name", a->what);
    const jx_val *tn = arg(a, first, NULL);
    if (tn && tn->t != V_STR)
        jx_fail(c, a->pos, PI2_EFORMAT, "%s: the test must be named by a string", a->what);
    char *test = tn ? jx_strndup(c, tn->s, tn->n) : NULL;
    for (size_t i = 0; i < src->n; i++) {
        jx_val x = src->v[i];
        if (attr) {
            x = x.t == V_DICT || x.t == V_NS || x.t == V_LOOP ? jx_getattr(c, x, an->s, an->n, a->pos) : jx_undef(NULL);
            /* Jinja reads a dotted attribute path as nested lookups */
            if (memchr(an->s, '.', an->n)) {
                x = src->v[i];
                for (size_t p = 0; p < an->n;) {
                    const char *d = memchr(an->s + p, '.', an->n - p);
                    size_t e = d ? (size_t)(d - an->s) : an->n;
                    x = x.t == V_DICT ? jx_getattr(c, x, an->s + p, e - p, a->pos) : jx_undef(NULL);
                    p = e + 1;
                }
            }
        }
        size_t nt = a->n > first + 1 ? a->n - first - 1 : 0;
        bool ok = test ? run_test(c, test, a->pos, x, a->args + first + 1, nt) : jx_truthy(x);
        if (ok != reject)
            jx_list_push(c, out, src->v[i]);
        jx_step(c, a->pos);
    }
    return list_val(out);
}

static jx_val filt_join(jx_ctx *c, const argv_t *a, jx_val v)
{
    const jx_val *sep = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
    jx_list *l = jx_iterate(c, v, a->pos);
    jx_buf b = {0};
    jx_buf_add(c, &b, "", 0);
    jx_val s = sep ? jx_stringify(c, *sep, a->pos) : jx_str("", 0);
    for (size_t i = 0; i < l->n; i++) {
        if (i)
            jx_buf_add(c, &b, s.s, s.n);
        jx_val x = l->v[i];
        if (attr) {
            jx_val an = jx_stringify(c, *attr, a->pos);
            x = jx_getattr(c, x, an.s, an.n, a->pos);
        }
        jx_to_str(c, &b, x, a->pos);
    }
    return jx_buf_val(&b);
}

static jx_val filt_map(jx_ctx *c, const argv_t *a, jx_val v)
{
    const jx_val *attr = arg(a, 99, "attribute"), *def = arg(a, 99, "default");
    jx_list *src = jx_iterate(c, v, a->pos), *out = jx_list_new(c, src->n);
    if (!attr)
        jx_fail(c, a->pos, PI2_EUNSUPPORTED, "map is supported with attribute= only");
    jx_val an = jx_stringify(c, *attr, a->pos);
    for (size_t i = 0; i < src->n; i++) {
        jx_val x = jx_getattr(c, src->v[i], an.s, an.n, a->pos);
        jx_list_push(c, out, x.t == V_UNDEF && def ? *def : x);
    }
    return list_val(out);
}

static jx_val filt_tojson(jx_ctx *c, const argv_t *a, jx_val v)
{
    const jx_val *ind = arg(a, 1, "indent"), *sk = arg(a, 4, "sort_keys"), *sep = arg(a, 3, "separators");
    const jx_val *asc = arg(a, 0, "ensure_ascii");
    if (asc && jx_truthy(*asc))
        jx_fail(c, a->pos, PI2_EUNSUPPORTED, "tojson: ensure_ascii is not supported");
    if (sep && sep->t != V_NONE)
        jx_fail(c, a->pos, PI2_EUNSUPPORTED, "tojson: separators are not supported");
    int indent = -1;
    if (ind && ind->t != V_NONE) {
        if (ind->t != V_INT || ind->u.i < 0 || ind->u.i > 64)
            jx_fail(c, a->pos, PI2_EUNSUPPORTED, "tojson: indent must be an integer 0..64");
        indent = (int)ind->u.i;
    }
    jx_buf b = {0};
    jx_buf_add(c, &b, "", 0);
    int saved = c->depth;
    jx_tojson(c, &b, v, indent, sk && jx_truthy(*sk), 0, a->pos);
    c->depth = saved;
    return jx_buf_val(&b);
}

static jx_val filt_length(jx_ctx *c, size_t pos, jx_val v)
{
    switch (v.t) {
    case V_STR: jx_cost(c, v.n >> 5, pos); return jx_int((int64_t)jx_u8_count(v.s, v.n));
    case V_LIST: return jx_int((int64_t)v.u.l->n);
    case V_DICT: case V_NS: return jx_int((int64_t)v.u.d->n);
    case V_UNDEF: return jx_int(0);
    default: jx_fail(c, pos, PI2_EFORMAT, "object of type '%s' has no len()", jx_type_name(v));
    }
}

static jx_val filt_int(jx_ctx *c, const argv_t *a, jx_val v)
{
    int64_t def = int_arg(a, 0, "default", 0);
    if (v.t == V_INT)
        return v;
    if (v.t == V_BOOL)
        return jx_int(v.u.b);
    if (v.t != V_STR)
        return jx_int(def);
    jx_val s = jx_strip(c, v, true, true, NULL, a->pos);
    char buf[32];
    if (s.n == 0 || s.n >= sizeof buf)
        return jx_int(def);
    memcpy(buf, s.s, s.n);
    buf[s.n] = 0;
    char *end;
    long long r = strtoll(buf, &end, 10);
    return *end ? jx_int(def) : jx_int(r);
}

static jx_val filt_reverse(jx_ctx *c, size_t pos, jx_val v)
{
    jx_list *l = jx_iterate(c, v, pos), *out = jx_list_new(c, l->n);
    for (size_t i = l->n; i-- > 0;)
        jx_list_push(c, out, l->v[i]);
    if (v.t != V_STR)
        return list_val(out);
    jx_buf b = {0};
    jx_buf_add(c, &b, "", 0);
    for (size_t i = 0; i < out->n; i++)
        jx_buf_add(c, &b, out->v[i].s, out->v[i].n);
    return jx_buf_val(&b);
}

jx_val jx_filter(jx_ctx *c, const jx_expr *e, jx_val v, jx_val *args, const char **kw, size_t n)
{
    const char *f = e->name;
    argv_t a = {c, e->pos, f, args, kw, n};
#define F(s) (!strcmp(f, s))
    if (F("trim")) { max_args(&a, 1); return jx_strip(c, jx_stringify(c, v, e->pos), true, true, arg(&a, 0, "chars"), e->pos); }
    if (F("length") || F("count")) return filt_length(c, e->pos, v);
    if (F("upper")) return recase(c, jx_stringify(c, v, e->pos), 'u', e->pos);
    if (F("lower")) return recase(c, jx_stringify(c, v, e->pos), 'l', e->pos);
    if (F("capitalize")) return recase(c, jx_stringify(c, v, e->pos), 'c', e->pos);
    if (F("title")) return recase(c, jx_stringify(c, v, e->pos), 'T', e->pos);
    if (F("string")) return jx_stringify(c, v, e->pos);
    if (F("safe") || F("e") || F("escape") || F("forceescape")) {
        if (!F("safe"))
            jx_fail(c, e->pos, PI2_EUNSUPPORTED, "filter '%s' is not supported", f);
        return v;
    }
    if (F("tojson")) return filt_tojson(c, &a, v);
    if (F("int")) return filt_int(c, &a, v);
    if (F("abs")) {
        if (v.t != V_INT || v.u.i == INT64_MIN)
            jx_fail(c, e->pos, PI2_EFORMAT, "abs needs an integer");
        return jx_int(v.u.i < 0 ? -v.u.i : v.u.i);
    }
    if (F("list")) return list_val(jx_iterate(c, v, e->pos));
    if (F("first") || F("last")) {
        jx_list *l = jx_iterate(c, v, e->pos);
        if (l->n == 0)
            return jx_undef(NULL);
        return F("first") ? l->v[0] : l->v[l->n - 1];
    }
    if (F("join")) return filt_join(c, &a, v);
    if (F("default") || F("d")) {
        const jx_val *def = arg(&a, 0, "default_value"), *boolean = arg(&a, 1, "boolean");
        bool use = v.t == V_UNDEF || (boolean && jx_truthy(*boolean) && !jx_truthy(v));
        return use ? (def ? *def : jx_str("", 0)) : v;
    }
    if (F("replace")) {
        const jx_val *x = arg(&a, 0, "old"), *y = arg(&a, 1, "new");
        if (!x || !y)
            jx_fail(c, e->pos, PI2_EFORMAT, "replace needs two arguments");
        return replace(c, jx_stringify(c, v, e->pos), jx_stringify(c, *x, e->pos), *y, int_arg(&a, 2, "count", -1), e->pos);
    }
    if (F("reverse")) return filt_reverse(c, e->pos, v);
    if (F("items")) {
        if (v.t == V_UNDEF)
            return list_val(jx_list_new(c, 0));
        if (v.t != V_DICT)
            jx_fail(c, e->pos, PI2_EFORMAT, "items needs a mapping, not %s", jx_type_name(v));
        jx_val out;
        argv_t none = {c, e->pos, "items", NULL, NULL, 0};
        method_dict(&none, v, "items", &out);
        return out;
    }
    if (F("select") || F("reject")) return filt_select(c, &a, v, false, F("reject"));
    if (F("selectattr") || F("rejectattr")) return filt_select(c, &a, v, true, F("rejectattr"));
    if (F("map")) return filt_map(c, &a, v);
#undef F
    jx_fail(c, e->pos, PI2_EFORMAT, "no filter named '%s'", f);
}
