/* Chat templates: the evaluator. Expressions evaluate to values in the
 * arena; statements append to the output. Scopes follow Jinja: a for loop
 * gets a fresh scope on each iteration (a `set` inside a loop is gone
 * after the iteration; namespaces carry values out), if blocks share the
 * scope around them. */
#include "formats/jinja_internal.h"

#include <stdlib.h>
#include <string.h>

enum { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE };

void jx_step(jx_ctx *c, size_t pos)
{
    if (++c->steps > JX_MAX_STEPS)
        jx_fail(c, pos, PI2_ERANGE, "rendering takes more than %d steps", JX_MAX_STEPS);
}

void jx_cost(jx_ctx *c, size_t steps, size_t pos)
{
    if (steps > JX_MAX_STEPS || (c->steps += steps) > JX_MAX_STEPS)
        jx_fail(c, pos, PI2_ERANGE, "rendering takes more than %d steps", JX_MAX_STEPS);
}

/* The cost of comparing or searching v. */
static size_t size_cost(jx_val v)
{
    return v.t == V_STR ? v.n >> 5 : v.t == V_LIST ? v.u.l->n : v.t == V_DICT ? v.u.d->n : 0;
}

static jx_val lookup(jx_ctx *c, const char *name, size_t pos)
{
    for (jx_frame *f = c->frame; f; f = f->up)
        jx_cost(c, f->n >> 3, pos);
    for (jx_frame *f = c->frame; f; f = f->up)
        for (size_t i = f->n; i-- > 0;)
            if (strcmp(f->names[i], name) == 0)
                return f->vals[i];
    return jx_undef(name);
}

static void assign(jx_ctx *c, jx_frame *f, const char *name, jx_val v)
{
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->names[i], name) == 0) {
            f->vals[i] = v;
            return;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        const char **nn = jx_alloc(c, cap * sizeof *nn);
        jx_val *nv = jx_alloc(c, cap * sizeof *nv);
        if (f->n) {
            memcpy(nn, f->names, f->n * sizeof *nn);
            memcpy(nv, f->vals, f->n * sizeof *nv);
        }
        f->names = nn;
        f->vals = nv;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
}

static jx_val eval(jx_ctx *c, const jx_expr *e);

static int64_t need_int(jx_ctx *c, jx_val v, size_t pos, const char *what)
{
    if (v.t == V_INT)
        return v.u.i;
    if (v.t == V_BOOL)
        return v.u.b;
    jx_fail(c, pos, PI2_EFORMAT, "%s must be an integer, not %s", what, jx_type_name(v));
}

/* Python's floor division and modulo. */
static int64_t floordiv(jx_ctx *c, int64_t a, int64_t b, bool mod, size_t pos)
{
    if (b == 0)
        jx_fail(c, pos, PI2_EFORMAT, "integer division or modulo by zero");
    if (a == INT64_MIN && b == -1) {
        if (mod)
            return 0;
        jx_fail(c, pos, PI2_ERANGE, "integer overflow");
    }
    int64_t q = a / b, r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) {
        q--;
        r += b;
    }
    return mod ? r : q;
}

/* s * k for strings and lists (k <= 0: empty). */
static jx_val repeat(jx_ctx *c, jx_val s, int64_t k, size_t pos)
{
    if (k <= 0)
        return s.t == V_STR ? jx_str("", 0) : (jx_val){.t = V_LIST, .u.l = jx_list_new(c, 0)};
    size_t unit = s.t == V_STR ? s.n : s.u.l->n * sizeof(jx_val), total;
    if (!pi2_mul_size(unit, (size_t)k, &total) || total > JX_MAX_ARENA)
        jx_fail(c, pos, PI2_ERANGE, "repetition too large");
    if (s.t == V_STR) {
        jx_buf b = {0};
        jx_buf_add(c, &b, "", 0);
        for (int64_t i = 0; i < k; i++)
            jx_buf_add(c, &b, s.s, s.n);
        return jx_buf_val(&b);
    }
    jx_list *l = jx_list_new(c, s.u.l->n * (size_t)k);
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < s.u.l->n; j++)
            jx_list_push(c, l, s.u.l->v[j]);
    return (jx_val){.t = V_LIST, .u.l = l};
}

static jx_val binop(jx_ctx *c, uint8_t op, jx_val a, jx_val b, size_t pos)
{
    static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**"};
    bool ints = (a.t == V_INT || a.t == V_BOOL) && (b.t == V_INT || b.t == V_BOOL);
    if (a.t == V_UNDEF || b.t == V_UNDEF)
        jx_fail(c, pos, PI2_EFORMAT, "'%s' is undefined", a.t == V_UNDEF ? (a.s ? a.s : "value") : (b.s ? b.s : "value"));
    if (op == OP_DIV)
        jx_fail(c, pos, PI2_EUNSUPPORTED, "'/' makes a float: floats are not supported (use '//')");
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR) {
        jx_buf buf = {0};
        jx_buf_add(c, &buf, a.s, a.n);
        jx_buf_add(c, &buf, b.s, b.n);
        return jx_buf_val(&buf);
    }
    if (op == OP_ADD && a.t == V_LIST && b.t == V_LIST) {
        jx_list *l = jx_list_new(c, a.u.l->n + b.u.l->n);
        for (size_t i = 0; i < a.u.l->n; i++)
            jx_list_push(c, l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++)
            jx_list_push(c, l, b.u.l->v[i]);
        return (jx_val){.t = V_LIST, .u.l = l};
    }
    if (op == OP_MUL && (a.t == V_STR || a.t == V_LIST) && (b.t == V_INT || b.t == V_BOOL))
        return repeat(c, a, need_int(c, b, pos, "a repeat count"), pos);
    if (op == OP_MUL && (b.t == V_STR || b.t == V_LIST) && (a.t == V_INT || a.t == V_BOOL))
        return repeat(c, b, need_int(c, a, pos, "a repeat count"), pos);
    if (!ints)
        jx_fail(c, pos, PI2_EFORMAT, "unsupported operand types for %s: '%s' and '%s'", sym[op], jx_type_name(a),
                jx_type_name(b));
    int64_t x = need_int(c, a, pos, "operand"), y = need_int(c, b, pos, "operand"), r = 0;
    bool ovf = false;
    switch (op) {
    case OP_ADD: ovf = __builtin_add_overflow(x, y, &r); break;
    case OP_SUB: ovf = __builtin_sub_overflow(x, y, &r); break;
    case OP_MUL: ovf = __builtin_mul_overflow(x, y, &r); break;
    case OP_FLOORDIV: r = floordiv(c, x, y, false, pos); break;
    case OP_MOD: r = floordiv(c, x, y, true, pos); break;
    case OP_POW:
        if (y < 0)
            jx_fail(c, pos, PI2_EUNSUPPORTED, "a negative power makes a float: floats are not supported");
        r = 1;
        for (int64_t base = x, k = y; k > 0 && !ovf;) { /* by squaring */
            if (k & 1)
                ovf = __builtin_mul_overflow(r, base, &r);
            k >>= 1;
            if (k && !ovf)
                ovf = __builtin_mul_overflow(base, base, &base);
        }
        break;
    default: break;
    }
    if (ovf)
        jx_fail(c, pos, PI2_ERANGE, "integer overflow");
    return jx_int(r);
}

/* Python ordering of two values (ints, strings, lists); a type error else. */
static int order(jx_ctx *c, jx_val a, jx_val b, size_t pos)
{
    if ((a.t == V_INT || a.t == V_BOOL) && (b.t == V_INT || b.t == V_BOOL)) {
        int64_t x = need_int(c, a, pos, ""), y = need_int(c, b, pos, "");
        return (x > y) - (x < y);
    }
    if (a.t == V_STR && b.t == V_STR) {
        size_t n = a.n < b.n ? a.n : b.n;
        int r = n ? memcmp(a.s, b.s, n) : 0;
        return r ? (r > 0) - (r < 0) : (a.n > b.n) - (a.n < b.n);
    }
    if (a.t == V_LIST && b.t == V_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++)
            if (!jx_equal(a.u.l->v[i], b.u.l->v[i]))
                return order(c, a.u.l->v[i], b.u.l->v[i], pos);
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    jx_fail(c, pos, PI2_EFORMAT, "'<' not supported between instances of '%s' and '%s'", jx_type_name(a),
            jx_type_name(b));
}

static bool contains(jx_ctx *c, jx_val hay, jx_val x, size_t pos)
{
    jx_cost(c, size_cost(hay) + size_cost(x), pos);
    if (hay.t == V_UNDEF) /* iterates as empty */
        return false;
    if (hay.t == V_STR) {
        if (x.t != V_STR)
            jx_fail(c, pos, PI2_EFORMAT, "'in <string>' requires string as left operand, not %s", jx_type_name(x));
        return x.n == 0 || memmem(hay.s, hay.n, x.s, x.n) != NULL;
    }
    if (hay.t == V_LIST) {
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (jx_equal(hay.u.l->v[i], x))
                return true;
        return false;
    }
    if (hay.t == V_DICT || hay.t == V_NS) {
        for (size_t i = 0; i < hay.u.d->n; i++)
            if (jx_equal(hay.u.d->k[i], x))
                return true;
        return false;
    }
    jx_fail(c, pos, PI2_EFORMAT, "argument of type '%s' is not iterable", jx_type_name(hay));
}

static bool compare(jx_ctx *c, uint8_t op, jx_val a, jx_val b, size_t pos)
{
    if (op != OP_IN && op != OP_NOTIN)
        jx_cost(c, size_cost(a) + size_cost(b), pos);
    switch (op) {
    case OP_EQ: return jx_equal(a, b);
    case OP_NE: return !jx_equal(a, b);
    case OP_LT: return order(c, a, b, pos) < 0;
    case OP_LE: return order(c, a, b, pos) <= 0;
    case OP_GT: return order(c, a, b, pos) > 0;
    case OP_GE: return order(c, a, b, pos) >= 0;
    case OP_IN: return contains(c, b, a, pos);
    default: return !contains(c, b, a, pos);
    }
}

/* Python index i of a sequence of n items (negative from the end); false
 * when out of range. */
static bool norm_index(int64_t i, size_t n, size_t *out)
{
    if (i < 0)
        i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n)
        return false;
    *out = (size_t)i;
    return true;
}

static jx_val item(jx_ctx *c, jx_val v, jx_val k, size_t pos)
{
    if (v.t == V_UNDEF)
        jx_fail(c, pos, PI2_EFORMAT, "'%s' is undefined", v.s ? v.s : "value");
    if (k.t == V_STR && (v.t == V_DICT || v.t == V_NS || v.t == V_LOOP))
        return jx_getattr(c, v, k.s, k.n, pos);
    if ((k.t == V_INT || k.t == V_BOOL) && (v.t == V_LIST || v.t == V_STR)) {
        size_t i;
        if (v.t == V_LIST) {
            if (!norm_index(need_int(c, k, pos, "an index"), v.u.l->n, &i))
                return jx_undef(NULL);
            return v.u.l->v[i];
        }
        jx_cost(c, v.n >> 5, pos);
        if (!norm_index(need_int(c, k, pos, "an index"), jx_u8_count(v.s, v.n), &i))
            return jx_undef(NULL);
        size_t a = jx_u8_offset(v.s, v.n, i), b = jx_u8_offset(v.s, v.n, i + 1);
        return jx_str(v.s + a, b - a);
    }
    if (k.t == V_STR && v.t == V_STR) /* a method name: only callable */
        return jx_undef(NULL);
    if (v.t == V_DICT) {
        for (size_t i = 0; i < v.u.d->n; i++)
            if (jx_equal(v.u.d->k[i], k))
                return v.u.d->v[i];
        return jx_undef(NULL);
    }
    return jx_undef(NULL); /* as Jinja: none[0], 5[0] are undefined */
}

/* Python slice bounds of one part (start or stop) for n items. */
static int64_t slice_bound(int64_t x, int64_t n, int64_t step)
{
    if (x < 0) {
        x += n;
        if (x < 0)
            x = step < 0 ? -1 : 0;
    } else if (x >= n) {
        x = step < 0 ? n - 1 : n;
    }
    return x;
}

static jx_val slice(jx_ctx *c, const jx_expr *e)
{
    jx_val v = eval(c, e->a);
    if (v.t != V_LIST && v.t != V_STR)
        jx_fail(c, e->pos, PI2_EFORMAT, "cannot slice a %s", jx_type_name(v));
    jx_val p[3] = {jx_none(), jx_none(), jx_none()};
    const jx_expr *parts[3] = {e->b, e->c, e->args[0]};
    for (int i = 0; i < 3; i++)
        if (parts[i])
            p[i] = eval(c, parts[i]);
    int64_t step = p[2].t == V_NONE ? 1 : need_int(c, p[2], e->pos, "a slice step");
    if (step == 0)
        jx_fail(c, e->pos, PI2_EFORMAT, "slice step cannot be zero");
    jx_cost(c, size_cost(v), e->pos);
    int64_t n = (int64_t)(v.t == V_LIST ? v.u.l->n : jx_u8_count(v.s, v.n));
    int64_t a = p[0].t == V_NONE ? (step < 0 ? n - 1 : 0) : slice_bound(need_int(c, p[0], e->pos, "a slice bound"), n, step);
    int64_t b = p[1].t == V_NONE ? (step < 0 ? -1 : n) : slice_bound(need_int(c, p[1], e->pos, "a slice bound"), n, step);
    if (v.t == V_STR && step == 1) {
        if (b <= a)
            return jx_str("", 0);
        size_t x = jx_u8_offset(v.s, v.n, (size_t)a), y = jx_u8_offset(v.s, v.n, (size_t)b);
        return jx_str(v.s + x, y - x);
    }
    jx_list *l = jx_list_new(c, 0);
    jx_buf buf = {0};
    jx_buf_add(c, &buf, "", 0);
    /* how many items, without overflowing a + k * step */
    uint64_t ust = step > 0 ? (uint64_t)step : (uint64_t)0 - (uint64_t)step;
    uint64_t span = step > 0 ? (b > a ? (uint64_t)(b - a) : 0) : (a > b ? (uint64_t)(a - b) : 0);
    uint64_t cnt = span ? (span - 1) / ust + 1 : 0;
    for (uint64_t k = 0; k < cnt; k++) {
        int64_t i = step > 0 ? a + (int64_t)(k * ust) : a - (int64_t)(k * ust);
        if (v.t == V_LIST) {
            jx_list_push(c, l, v.u.l->v[i]);
        } else {
            size_t x = jx_u8_offset(v.s, v.n, (size_t)i), y = jx_u8_offset(v.s, v.n, (size_t)i + 1);
            jx_buf_add(c, &buf, v.s + x, y - x);
        }
        jx_step(c, e->pos);
    }
    return v.t == V_LIST ? (jx_val){.t = V_LIST, .u.l = l} : jx_buf_val(&buf);
}

/* Arguments args[from..] of e, evaluated. */
static jx_val *eval_args(jx_ctx *c, const jx_expr *e, size_t from)
{
    size_t n = e->n_args - from;
    jx_val *v = jx_alloc(c, (n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = eval(c, e->args[from + i]);
    return v;
}

static jx_val call(jx_ctx *c, const jx_expr *e)
{
    jx_val *args = NULL;
    if (e->a->k == E_ATTR) { /* obj.method(args) */
        jx_val obj = eval(c, e->a->a);
        jx_val out;
        args = eval_args(c, e, 0);
        if (jx_method(c, e->pos, obj, e->a->name, args, e->kw, e->n_args, &out))
            return out;
    }
    jx_val f = eval(c, e->a);
    if (f.t != V_FUNC) {
        if (f.t == V_UNDEF)
            jx_fail(c, e->pos, PI2_EFORMAT, "'%s' is undefined", f.s ? f.s : e->a->k == E_ATTR ? e->a->name : "value");
        jx_fail(c, e->pos, PI2_EFORMAT, "'%s' object is not callable", jx_type_name(f));
    }
    if (!args)
        args = eval_args(c, e, 0);
    return jx_call_fn(c, e->pos, f.u.fn, args, e->kw, e->n_args);
}

static jx_val eval_inner(jx_ctx *c, const jx_expr *e)
{
    jx_val a, b;
    switch (e->k) {
    case E_LIT: return e->lit;
    case E_NAME: return lookup(c, e->name, e->pos);
    case E_LIST: {
        jx_list *l = jx_list_new(c, e->n_args);
        l->tuple = e->tuple;
        for (size_t i = 0; i < e->n_args; i++)
            jx_list_push(c, l, eval(c, e->args[i]));
        return (jx_val){.t = V_LIST, .u.l = l};
    }
    case E_DICT: {
        jx_dict *d = jx_dict_new(c, e->n_args / 2);
        for (size_t i = 0; i + 1 < e->n_args; i += 2) {
            jx_val k = eval(c, e->args[i]);
            if (k.t != V_STR && k.t != V_INT && k.t != V_BOOL && k.t != V_NONE)
                jx_fail(c, e->args[i]->pos, PI2_EFORMAT, "unhashable type: '%s'", jx_type_name(k));
            jx_dict_set(c, d, k, eval(c, e->args[i + 1]));
        }
        return (jx_val){.t = V_DICT, .u.d = d};
    }
    case E_ATTR: return jx_getattr(c, eval(c, e->a), e->name, strlen(e->name), e->pos);
    case E_ITEM: a = eval(c, e->a); return item(c, a, eval(c, e->b), e->pos);
    case E_SLICE: return slice(c, e);
    case E_CALL: return call(c, e);
    case E_FILTER: a = eval(c, e->args[0]); return jx_filter(c, e, a, eval_args(c, e, 1), e->kw + 1, e->n_args - 1);
    case E_TEST:
        a = eval(c, e->args[0]);
        return jx_bool(jx_test(c, e, a, eval_args(c, e, 1), e->n_args - 1) != e->neg);
    case E_NOT: return jx_bool(!jx_truthy(eval(c, e->a)));
    case E_NEG: case E_POS:
        a = eval(c, e->a);
        if (e->k == E_POS)
            return jx_int(need_int(c, a, e->pos, "the operand of unary +"));
        return binop(c, OP_SUB, jx_int(0), jx_int(need_int(c, a, e->pos, "the operand of unary -")), e->pos);
    case E_BIN: a = eval(c, e->a); b = eval(c, e->b); return binop(c, e->op, a, b, e->pos);
    case E_AND: a = eval(c, e->a); return jx_truthy(a) ? eval(c, e->b) : a;
    case E_OR: a = eval(c, e->a); return jx_truthy(a) ? a : eval(c, e->b);
    case E_COND:
        if (jx_truthy(eval(c, e->b)))
            return eval(c, e->a);
        return e->c ? eval(c, e->c) : jx_undef(NULL);
    case E_CMP:
        a = eval(c, e->args[0]);
        for (size_t i = 1; i < e->n_args; i++) {
            b = eval(c, e->args[i]);
            if (!compare(c, e->ops[i - 1], a, b, e->pos))
                return jx_bool(false);
            a = b;
        }
        return jx_bool(true);
    case E_CONCAT: {
        jx_buf buf = {0};
        jx_buf_add(c, &buf, "", 0);
        for (size_t i = 0; i < e->n_args; i++)
            jx_to_str(c, &buf, eval(c, e->args[i]), e->pos);
        return jx_buf_val(&buf);
    }
    default: jx_fail(c, e->pos, PI2_EFORMAT, "bad expression");
    }
}

static jx_val eval(jx_ctx *c, const jx_expr *e)
{
    jx_step(c, e->pos);
    if (++c->depth > 4 * JX_MAX_DEPTH)
        jx_fail(c, e->pos, PI2_ERANGE, "expression nested too deep");
    jx_val v = eval_inner(c, e);
    c->depth--;
    return v;
}

static void emit(jx_ctx *c, const char *s, size_t n, size_t pos)
{
    if (n > JX_MAX_OUTPUT - c->out_len)
        jx_fail(c, pos, PI2_ERANGE, "output longer than %d MiB", JX_MAX_OUTPUT >> 20);
    if (c->out_cap - c->out_len < n + 1) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap - c->out_len < n + 1)
            cap *= 2;
        char *p = realloc(c->out, cap);
        if (!p)
            jx_fail(c, pos, PI2_ENOMEM, "out of memory");
        c->out = p;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, s, n);
    c->out_len += n;
    c->out[c->out_len] = 0;
}

static int exec_body(jx_ctx *c, const jx_body *b);

static int exec_for(jx_ctx *c, const jx_stmt *s)
{
    jx_list *src = jx_iterate(c, eval(c, s->e), s->e->pos);
    jx_frame f = {.up = c->frame};
    jx_list *items = src;
    if (s->cond) { /* `for x in xs if cond`: loop.* count the kept items */
        items = jx_list_new(c, 0);
        c->frame = &f;
        for (size_t i = 0; i < src->n; i++) {
            f.n = 0;
            assign(c, &f, s->names[0], src->v[i]);
            if (jx_truthy(eval(c, s->cond)))
                jx_list_push(c, items, src->v[i]);
        }
        c->frame = f.up;
    }
    jx_loop loop = {.items = items};
    jx_loop *outer = c->loop;
    int flow = FLOW_NEXT;
    for (size_t i = 0; i < items->n; i++) {
        if (++c->iters > JX_MAX_ITERS)
            jx_fail(c, s->pos, PI2_ERANGE, "more than %d loop iterations", JX_MAX_ITERS);
        f.n = 0;
        loop.i0 = i;
        if (s->n_names == 2) {
            jx_val pair = items->v[i];
            jx_list *pl = pair.t == V_LIST ? pair.u.l : NULL;
            if (!pl || pl->n != 2)
                jx_fail(c, s->pos, PI2_EFORMAT, "cannot unpack a %s into two names", jx_type_name(pair));
            assign(c, &f, s->names[0], pl->v[0]);
            assign(c, &f, s->names[1], pl->v[1]);
        } else {
            assign(c, &f, s->names[0], items->v[i]);
        }
        assign(c, &f, "loop", (jx_val){.t = V_LOOP, .u.loop = &loop});
        c->frame = &f;
        c->loop = &loop;
        flow = exec_body(c, &s->body);
        c->frame = f.up;
        c->loop = outer;
        if (flow == FLOW_BREAK)
            break;
    }
    if (items->n == 0)
        return exec_body(c, &s->orelse);
    return FLOW_NEXT;
}

static int exec_stmt(jx_ctx *c, const jx_stmt *s)
{
    jx_step(c, s->pos);
    switch (s->k) {
    case S_DATA: emit(c, s->text, s->text_len, s->pos); return FLOW_NEXT;
    case S_OUT: {
        jx_val v = eval(c, s->e);
        if (v.t == V_STR) {
            emit(c, v.s, v.n, s->pos);
        } else {
            jx_val t = jx_stringify(c, v, s->pos);
            emit(c, t.s, t.n, s->pos);
        }
        return FLOW_NEXT;
    }
    case S_IF: return exec_body(c, jx_truthy(eval(c, s->e)) ? &s->body : &s->orelse);
    case S_FOR: return exec_for(c, s);
    case S_SET: assign(c, c->frame, s->names[0], eval(c, s->e)); return FLOW_NEXT;
    case S_SET_ATTR: {
        jx_val ns = lookup(c, s->names[0], s->pos);
        if (ns.t != V_NS)
            jx_fail(c, s->pos, PI2_EFORMAT, "cannot assign attribute on non-namespace object");
        jx_dict_set(c, ns.u.d, jx_str(s->names[1], strlen(s->names[1])), eval(c, s->e));
        return FLOW_NEXT;
    }
    case S_SET_BLOCK: {
        /* render the body on its own, then bind it */
        size_t mark = c->out_len;
        int flow = exec_body(c, &s->body);
        jx_val v = jx_str(jx_strndup(c, c->out + mark, c->out_len - mark), c->out_len - mark);
        c->out_len = mark;
        if (c->out)
            c->out[mark] = 0;
        assign(c, c->frame, s->names[0], v);
        return flow;
    }
    case S_BREAK: return FLOW_BREAK;
    case S_CONTINUE: return FLOW_CONTINUE;
    case S_BLOCK: return exec_body(c, &s->body);
    default: return FLOW_NEXT;
    }
}

static int exec_body(jx_ctx *c, const jx_body *b)
{
    if (++c->depth > JX_MAX_DEPTH * 2)
        jx_fail(c, b->n ? b->v[0]->pos : 0, PI2_ERANGE, "blocks nested too deep");
    for (size_t i = 0; i < b->n; i++) {
        int flow = exec_stmt(c, b->v[i]);
        if (flow != FLOW_NEXT) {
            c->depth--;
            return flow;
        }
    }
    c->depth--;
    return FLOW_NEXT;
}

void jx_exec(jx_ctx *c, const jx_body *b)
{
    c->depth = 0;
    int flow = exec_body(c, b);
    (void)flow; /* a break outside a loop ends the template, as in Jinja's loopcontrols */
}
