/* Chat templates: the parser, tokens to a syntax tree, by recursive descent
 * with Jinja's precedence (lowest first): conditional expression, or, and,
 * not, comparisons (in, not in), + -, ~, * / // %, **, unary - +, then a
 * primary with its postfixes (.attr, [item], [a:b:c], (call)), filters
 * (|name) and tests (is [not] name). */
#include "formats/jinja_internal.h"

#include <string.h>

static jx_tok *cur(jx_ctx *c) { return &c->toks[c->tp]; }

static jx_tok *next(jx_ctx *c)
{
    jx_tok *t = &c->toks[c->tp];
    if (t->t != T_EOF)
        c->tp++;
    return t;
}

static bool is_op(const jx_tok *t, const char *op)
{
    return t->t == T_OP && t->n == strlen(op) && memcmp(t->s, op, t->n) == 0;
}

static bool is_name(const jx_tok *t, const char *name)
{
    return t->t == T_NAME && t->n == strlen(name) && memcmp(t->s, name, t->n) == 0;
}

static const char *tok_desc(jx_ctx *c, const jx_tok *t)
{
    switch (t->t) {
    case T_EOF: return "end of template";
    case T_VAR_END: return "end of print statement";
    case T_BLOCK_END: return "end of statement block";
    case T_STRING: return "string";
    case T_INT: return "integer";
    case T_DATA: return "template data";
    default: break;
    }
    size_t n = t->n > 40 ? 40 : t->n;
    char *s = jx_alloc(c, n + 3);
    s[0] = '\'';
    memcpy(s + 1, t->s, n);
    s[n + 1] = '\'';
    return s;
}

static void expect_op(jx_ctx *c, const char *op)
{
    if (!is_op(cur(c), op))
        jx_fail(c, cur(c)->pos, PI2_EFORMAT, "expected '%s', got %s", op, tok_desc(c, cur(c)));
    next(c);
}

static const char *expect_name(jx_ctx *c)
{
    jx_tok *t = cur(c);
    if (t->t != T_NAME)
        jx_fail(c, t->pos, PI2_EFORMAT, "expected a name, got %s", tok_desc(c, t));
    next(c);
    return jx_strndup(c, t->s, t->n);
}

static void expect(jx_ctx *c, uint8_t type)
{
    if (cur(c)->t != type)
        jx_fail(c, cur(c)->pos, PI2_EFORMAT, "expected %s, got %s",
                type == T_BLOCK_END ? "end of statement block" : "end of print statement", tok_desc(c, cur(c)));
    next(c);
}

static void enter(jx_ctx *c, size_t pos)
{
    if (++c->depth > JX_MAX_DEPTH)
        jx_fail(c, pos, PI2_ERANGE, "template nested more than %d deep", JX_MAX_DEPTH);
}

static jx_expr *node(jx_ctx *c, uint8_t k, size_t pos)
{
    jx_expr *e = jx_alloc(c, sizeof *e);
    e->k = k;
    e->pos = pos;
    return e;
}

/* A growable array of expression pointers (and keywords). */
typedef struct {
    jx_expr **v;
    const char **kw;
    size_t n, cap;
} elist;

static void epush(jx_ctx *c, elist *l, jx_expr *e, const char *kw)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jx_expr **nv = jx_alloc(c, cap * sizeof *nv);
        const char **nk = jx_alloc(c, cap * sizeof *nk);
        if (l->n) {
            memcpy(nv, l->v, l->n * sizeof *nv);
            memcpy(nk, l->kw, l->n * sizeof *nk);
        }
        l->v = nv;
        l->kw = nk;
        l->cap = cap;
    }
    l->v[l->n] = e;
    l->kw[l->n++] = kw;
}

static void set_args(jx_expr *e, const elist *l)
{
    e->args = l->v;
    e->kw = l->kw;
    e->n_args = l->n;
}

static jx_expr *parse_expr(jx_ctx *c);
static jx_expr *parse_or(jx_ctx *c);
static jx_expr *parse_unary(jx_ctx *c, bool with_filter);

/* "(" args ")" with keyword arguments (name=value) after positional ones. */
static void parse_call_args(jx_ctx *c, elist *l)
{
    size_t first = l->n; /* a filter's or test's subject is already in l */
    expect_op(c, "(");
    while (!is_op(cur(c), ")")) {
        if (l->n > first)
            expect_op(c, ",");
        if (is_op(cur(c), ")"))
            break;
        const char *kw = NULL;
        if (cur(c)->t == T_NAME && is_op(&c->toks[c->tp + 1], "=")) {
            kw = expect_name(c);
            next(c);
        } else if (l->n > first && l->kw[l->n - 1]) {
            jx_fail(c, cur(c)->pos, PI2_EFORMAT, "a positional argument after a keyword argument");
        }
        epush(c, l, parse_expr(c), kw);
    }
    next(c);
}

static jx_expr *parse_list(jx_ctx *c, const char *close, size_t pos)
{
    jx_expr *e = node(c, E_LIST, pos);
    elist l = {0};
    while (!is_op(cur(c), close)) {
        if (l.n)
            expect_op(c, ",");
        if (is_op(cur(c), close))
            break;
        epush(c, &l, parse_expr(c), NULL);
    }
    next(c);
    set_args(e, &l);
    return e;
}

static jx_expr *parse_primary(jx_ctx *c)
{
    jx_tok *t = next(c);
    jx_expr *e;
    if (t->t == T_NAME) {
        static const char *const tf[] = {"true", "True", "false", "False", "none", "None"};
        for (size_t i = 0; i < 6; i++)
            if (is_name(t, tf[i])) {
                e = node(c, E_LIT, t->pos);
                e->lit = i < 4 ? jx_bool(i < 2) : jx_none();
                return e;
            }
        e = node(c, E_NAME, t->pos);
        e->name = jx_strndup(c, t->s, t->n);
        return e;
    }
    if (t->t == T_STRING) {
        e = node(c, E_LIT, t->pos);
        e->lit = jx_str(t->s, t->n);
        if (cur(c)->t == T_STRING) { /* adjacent literals concatenate */
            jx_buf b = {0};
            jx_buf_add(c, &b, t->s, t->n);
            while (cur(c)->t == T_STRING) {
                jx_tok *u = next(c);
                jx_buf_add(c, &b, u->s, u->n);
            }
            e->lit = jx_buf_val(&b);
        }
        return e;
    }
    if (t->t == T_INT) {
        e = node(c, E_LIT, t->pos);
        e->lit = jx_int(t->i);
        return e;
    }
    if (is_op(t, "(")) {
        if (is_op(cur(c), ")")) { /* the empty tuple */
            e = parse_list(c, ")", t->pos);
            e->tuple = true;
            return e;
        }
        e = parse_expr(c);
        if (is_op(cur(c), ",")) { /* a tuple */
            jx_expr *l = node(c, E_LIST, t->pos);
            l->tuple = true;
            elist items = {0};
            epush(c, &items, e, NULL);
            while (is_op(cur(c), ",")) {
                next(c);
                if (is_op(cur(c), ")"))
                    break;
                epush(c, &items, parse_expr(c), NULL);
            }
            set_args(l, &items);
            e = l;
        }
        expect_op(c, ")");
        return e;
    }
    if (is_op(t, "["))
        return parse_list(c, "]", t->pos);
    if (is_op(t, "{")) {
        e = node(c, E_DICT, t->pos);
        elist l = {0};
        while (!is_op(cur(c), "}")) {
            if (l.n)
                expect_op(c, ",");
            if (is_op(cur(c), "}"))
                break;
            epush(c, &l, parse_expr(c), NULL);
            expect_op(c, ":");
            epush(c, &l, parse_expr(c), NULL);
        }
        next(c);
        set_args(e, &l);
        return e;
    }
    jx_fail(c, t->pos, PI2_EFORMAT, "unexpected %s", tok_desc(c, t));
}

/* [a], [a:b], [a:b:c] after obj. */
static jx_expr *parse_subscript(jx_ctx *c, jx_expr *obj, size_t pos)
{
    jx_expr *parts[3] = {NULL, NULL, NULL};
    int n = 0;
    bool slice = false;
    for (;;) {
        if (!is_op(cur(c), ":") && !is_op(cur(c), "]"))
            parts[n] = parse_expr(c);
        if (is_op(cur(c), ":")) {
            if (n == 2)
                jx_fail(c, cur(c)->pos, PI2_EFORMAT, "too many ':' in a slice");
            slice = true;
            n++;
            next(c);
            continue;
        }
        break;
    }
    expect_op(c, "]");
    if (!slice) {
        if (!parts[0])
            jx_fail(c, pos, PI2_EFORMAT, "empty subscript");
        jx_expr *e = node(c, E_ITEM, pos);
        e->a = obj;
        e->b = parts[0];
        return e;
    }
    jx_expr *e = node(c, E_SLICE, pos);
    e->a = obj;
    e->b = parts[0];
    e->c = parts[1];
    e->args = jx_alloc(c, sizeof *e->args);
    e->args[0] = parts[2];
    return e;
}

static jx_expr *parse_postfix(jx_ctx *c, jx_expr *e)
{
    for (;;) {
        jx_tok *t = cur(c);
        if (is_op(t, ".")) {
            next(c);
            jx_tok *a = next(c);
            if (a->t == T_INT) { /* x.0 is x[0] */
                jx_expr *i = node(c, E_ITEM, t->pos);
                i->a = e;
                i->b = node(c, E_LIT, a->pos);
                i->b->lit = jx_int(a->i);
                e = i;
                continue;
            }
            if (a->t != T_NAME)
                jx_fail(c, a->pos, PI2_EFORMAT, "expected an attribute name, got %s", tok_desc(c, a));
            jx_expr *x = node(c, E_ATTR, t->pos);
            x->a = e;
            x->name = jx_strndup(c, a->s, a->n);
            e = x;
        } else if (is_op(t, "[")) {
            next(c);
            e = parse_subscript(c, e, t->pos);
        } else if (is_op(t, "(")) {
            jx_expr *x = node(c, E_CALL, e->pos); /* errors point at the callee */
            elist l = {0};
            parse_call_args(c, &l);
            x->a = e;
            set_args(x, &l);
            e = x;
        } else {
            return e;
        }
    }
}

/* `name` or `name(args)` after | or is. */
static void parse_filter_name(jx_ctx *c, jx_expr *x, bool test)
{
    x->name = expect_name(c);
    while (is_op(cur(c), ".")) { /* dotted names: one name here */
        next(c);
        const char *more = expect_name(c);
        size_t a = strlen(x->name), b = strlen(more);
        char *nm = jx_alloc(c, a + b + 2);
        memcpy(nm, x->name, a);
        nm[a] = '.';
        memcpy(nm + a + 1, more, b);
        x->name = nm;
    }
    elist l = {0};
    epush(c, &l, x->a, NULL);
    jx_tok *t = cur(c);
    if (is_op(t, "(")) {
        parse_call_args(c, &l);
    } else if (test &&
               (t->t == T_NAME || t->t == T_STRING || t->t == T_INT || is_op(t, "(") || is_op(t, "[") || is_op(t, "{")) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
        if (is_name(t, "is"))
            jx_fail(c, t->pos, PI2_EFORMAT, "you cannot chain multiple tests with is");
        epush(c, &l, parse_postfix(c, parse_primary(c)), NULL);
    }
    set_args(x, &l);
}

static jx_expr *parse_filter_expr(jx_ctx *c, jx_expr *e)
{
    for (;;) {
        jx_tok *t = cur(c);
        if (is_op(t, "|")) {
            next(c);
            jx_expr *x = node(c, E_FILTER, t->pos);
            x->a = e;
            parse_filter_name(c, x, false);
            e = x;
        } else if (is_name(t, "is")) {
            next(c);
            jx_expr *x = node(c, E_TEST, t->pos);
            if (is_name(cur(c), "not")) {
                next(c);
                x->neg = true;
            }
            x->a = e;
            parse_filter_name(c, x, true);
            e = x;
        } else if (is_op(t, "(")) {
            jx_expr *x = node(c, E_CALL, t->pos);
            elist l = {0};
            parse_call_args(c, &l);
            x->a = e;
            set_args(x, &l);
            e = x;
        } else {
            return e;
        }
    }
}

static jx_expr *parse_unary(jx_ctx *c, bool with_filter)
{
    jx_tok *t = cur(c);
    enter(c, t->pos);
    jx_expr *e;
    if (is_op(t, "-") || is_op(t, "+")) {
        next(c);
        e = node(c, is_op(t, "-") ? E_NEG : E_POS, t->pos);
        e->a = parse_unary(c, false);
    } else {
        e = parse_primary(c);
    }
    e = parse_postfix(c, e);
    if (with_filter)
        e = parse_filter_expr(c, e);
    c->depth--;
    return e;
}

static jx_expr *binary(jx_ctx *c, uint8_t op, jx_expr *a, jx_expr *b, size_t pos)
{
    jx_expr *e = node(c, E_BIN, pos);
    e->op = op;
    e->a = a;
    e->b = b;
    return e;
}

static jx_expr *parse_pow(jx_ctx *c)
{
    jx_expr *e = parse_unary(c, true);
    while (is_op(cur(c), "**")) {
        size_t pos = next(c)->pos;
        e = binary(c, OP_POW, e, parse_unary(c, true), pos);
    }
    return e;
}

static jx_expr *parse_math2(jx_ctx *c)
{
    jx_expr *e = parse_pow(c);
    for (;;) {
        jx_tok *t = cur(c);
        uint8_t op = is_op(t, "*") ? OP_MUL : is_op(t, "/") ? OP_DIV : is_op(t, "//") ? OP_FLOORDIV
                   : is_op(t, "%") ? OP_MOD : 255;
        if (op == 255)
            return e;
        next(c);
        e = binary(c, op, e, parse_pow(c), t->pos);
    }
}

static jx_expr *parse_concat(jx_ctx *c)
{
    jx_expr *e = parse_math2(c);
    if (!is_op(cur(c), "~"))
        return e;
    jx_expr *x = node(c, E_CONCAT, cur(c)->pos);
    elist l = {0};
    epush(c, &l, e, NULL);
    while (is_op(cur(c), "~")) {
        next(c);
        epush(c, &l, parse_math2(c), NULL);
    }
    set_args(x, &l);
    return x;
}

static jx_expr *parse_math1(jx_ctx *c)
{
    jx_expr *e = parse_concat(c);
    for (;;) {
        jx_tok *t = cur(c);
        if (!is_op(t, "+") && !is_op(t, "-"))
            return e;
        next(c);
        e = binary(c, is_op(t, "+") ? OP_ADD : OP_SUB, e, parse_concat(c), t->pos);
    }
}

static jx_expr *parse_compare(jx_ctx *c)
{
    jx_expr *e = parse_math1(c);
    jx_expr *x = NULL;
    elist l = {0};
    uint8_t ops[64];
    for (;;) {
        jx_tok *t = cur(c);
        uint8_t op = is_op(t, "==") ? OP_EQ : is_op(t, "!=") ? OP_NE : is_op(t, "<") ? OP_LT : is_op(t, "<=") ? OP_LE
                   : is_op(t, ">") ? OP_GT : is_op(t, ">=") ? OP_GE : is_name(t, "in") ? OP_IN : 255;
        if (op == 255 && is_name(t, "not") && is_name(&c->toks[c->tp + 1], "in")) {
            op = OP_NOTIN;
            next(c);
        }
        if (op == 255)
            break;
        next(c);
        if (!x) {
            x = node(c, E_CMP, t->pos);
            epush(c, &l, e, NULL);
        }
        if (l.n > sizeof ops)
            jx_fail(c, t->pos, PI2_ERANGE, "too many chained comparisons");
        ops[l.n - 1] = op;
        epush(c, &l, parse_math1(c), NULL);
    }
    if (!x)
        return e;
    set_args(x, &l);
    x->ops = jx_alloc(c, l.n - 1);
    memcpy(x->ops, ops, l.n - 1);
    return x;
}

static jx_expr *parse_not(jx_ctx *c)
{
    jx_tok *t = cur(c);
    if (is_name(t, "not")) {
        next(c);
        enter(c, t->pos);
        jx_expr *e = node(c, E_NOT, t->pos);
        e->a = parse_not(c);
        c->depth--;
        return e;
    }
    return parse_compare(c);
}

static jx_expr *parse_and(jx_ctx *c)
{
    jx_expr *e = parse_not(c);
    while (is_name(cur(c), "and")) {
        jx_expr *x = node(c, E_AND, next(c)->pos);
        x->a = e;
        x->b = parse_not(c);
        e = x;
    }
    return e;
}

static jx_expr *parse_or(jx_ctx *c)
{
    jx_expr *e = parse_and(c);
    while (is_name(cur(c), "or")) {
        jx_expr *x = node(c, E_OR, next(c)->pos);
        x->a = e;
        x->b = parse_and(c);
        e = x;
    }
    return e;
}

static jx_expr *parse_expr(jx_ctx *c)
{
    enter(c, cur(c)->pos);
    jx_expr *e = parse_or(c);
    while (is_name(cur(c), "if")) {
        jx_expr *x = node(c, E_COND, next(c)->pos);
        x->a = e;
        x->b = parse_or(c);
        if (is_name(cur(c), "else")) {
            next(c);
            x->c = parse_expr(c);
        }
        e = x;
    }
    c->depth--;
    return e;
}

/* ---- statements ---- */
static jx_stmt *stmt(jx_ctx *c, uint8_t k, size_t pos)
{
    jx_stmt *s = jx_alloc(c, sizeof *s);
    s->k = k;
    s->pos = pos;
    return s;
}

/* Statements up to a block tag whose name is one of ends (NULL-terminated
 * list; NULL: the end of the template). Leaves the tag's name current. */
static jx_body parse_body(jx_ctx *c, const char *const *ends, size_t open_pos, const char *what);

static void parse_if(jx_ctx *c, jx_stmt *s)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    s->e = parse_expr(c);
    expect(c, T_BLOCK_END);
    s->body = parse_body(c, ends, s->pos, "if");
    jx_tok *t = next(c);
    if (is_name(t, "elif")) {
        jx_stmt *e = stmt(c, S_IF, t->pos);
        enter(c, t->pos);
        parse_if(c, e);
        c->depth--;
        s->orelse.v = jx_alloc(c, sizeof *s->orelse.v);
        s->orelse.v[0] = e;
        s->orelse.n = 1;
        return;
    }
    if (is_name(t, "else")) {
        static const char *const end[] = {"endif", NULL};
        expect(c, T_BLOCK_END);
        s->orelse = parse_body(c, end, s->pos, "if");
        next(c);
    }
    expect(c, T_BLOCK_END);
}

static void parse_for(jx_ctx *c, jx_stmt *s)
{
    static const char *const ends[] = {"else", "endfor", NULL};
    s->names[s->n_names++] = expect_name(c);
    if (is_op(cur(c), ",")) {
        next(c);
        s->names[s->n_names++] = expect_name(c);
        if (is_op(cur(c), ","))
            jx_fail(c, cur(c)->pos, PI2_EUNSUPPORTED, "for loops unpack at most two names");
    }
    if (!is_name(cur(c), "in"))
        jx_fail(c, cur(c)->pos, PI2_EFORMAT, "expected 'in', got %s", tok_desc(c, cur(c)));
    next(c);
    s->e = parse_or(c);
    if (is_name(cur(c), "if")) {
        next(c);
        s->cond = parse_expr(c);
    }
    if (is_name(cur(c), "recursive"))
        jx_fail(c, cur(c)->pos, PI2_EUNSUPPORTED, "recursive loops are not supported");
    expect(c, T_BLOCK_END);
    c->loops++;
    s->body = parse_body(c, ends, s->pos, "for");
    c->loops--;
    if (is_name(next(c), "else")) {
        static const char *const end[] = {"endfor", NULL};
        expect(c, T_BLOCK_END);
        s->orelse = parse_body(c, end, s->pos, "for");
        next(c);
    }
    expect(c, T_BLOCK_END);
}

static void parse_set(jx_ctx *c, jx_stmt *s)
{
    s->names[s->n_names++] = expect_name(c);
    if (is_op(cur(c), ".")) {
        next(c);
        s->names[s->n_names++] = expect_name(c);
        s->k = S_SET_ATTR;
    } else if (is_op(cur(c), ",")) {
        jx_fail(c, cur(c)->pos, PI2_EUNSUPPORTED, "set with several names is not supported");
    }
    if (cur(c)->t == T_BLOCK_END && s->k == S_SET) { /* {% set x %}...{% endset %} */
        static const char *const end[] = {"endset", NULL};
        next(c);
        s->k = S_SET_BLOCK;
        s->body = parse_body(c, end, s->pos, "set");
        next(c);
        expect(c, T_BLOCK_END);
        return;
    }
    expect_op(c, "=");
    s->e = parse_expr(c);
    if (is_op(cur(c), ",")) { /* set x = a, b: a tuple */
        jx_expr *l = node(c, E_LIST, s->e->pos);
        l->tuple = true;
        elist items = {0};
        epush(c, &items, s->e, NULL);
        while (is_op(cur(c), ",")) {
            next(c);
            if (cur(c)->t == T_BLOCK_END)
                break;
            epush(c, &items, parse_expr(c), NULL);
        }
        set_args(l, &items);
        s->e = l;
    }
    expect(c, T_BLOCK_END);
}

static jx_stmt *parse_tag(jx_ctx *c, jx_tok *t)
{
    jx_tok *name = next(c);
    jx_stmt *s;
    if (name->t != T_NAME)
        jx_fail(c, name->pos, PI2_EFORMAT, "expected a statement name, got %s", tok_desc(c, name));
    enter(c, name->pos);
    if (is_name(name, "if")) {
        s = stmt(c, S_IF, t->pos);
        parse_if(c, s);
    } else if (is_name(name, "for")) {
        s = stmt(c, S_FOR, t->pos);
        parse_for(c, s);
    } else if (is_name(name, "set")) {
        s = stmt(c, S_SET, t->pos);
        parse_set(c, s);
    } else if (is_name(name, "break") || is_name(name, "continue")) {
        if (c->loops == 0)
            jx_fail(c, name->pos, PI2_EFORMAT, "'%s' outside loop", is_name(name, "break") ? "break" : "continue");
        s = stmt(c, is_name(name, "break") ? S_BREAK : S_CONTINUE, t->pos);
        expect(c, T_BLOCK_END);
    } else if (is_name(name, "generation")) { /* HF's marker of assistant text: renders its body */
        static const char *const end[] = {"endgeneration", NULL};
        s = stmt(c, S_BLOCK, t->pos);
        expect(c, T_BLOCK_END);
        s->body = parse_body(c, end, s->pos, "generation");
        next(c);
        expect(c, T_BLOCK_END);
    } else {
        static const char *const known[] = {"macro", "call", "filter", "include", "import", "from", "extends",
                                            "block", "raw", "with", "autoescape", "do"};
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            if (is_name(name, known[i]))
                jx_fail(c, name->pos, PI2_EUNSUPPORTED, "the '%s' tag is not supported", known[i]);
        jx_fail(c, name->pos, PI2_EFORMAT, "unknown tag %s", tok_desc(c, name));
    }
    c->depth--;
    return s;
}

static jx_body parse_body(jx_ctx *c, const char *const *ends, size_t open_pos, const char *what)
{
    jx_body b = {0};
    size_t cap = 0;
    for (;;) {
        jx_tok *t = cur(c);
        jx_stmt *s;
        if (t->t == T_EOF) {
            if (ends)
                jx_fail(c, open_pos, PI2_EFORMAT, "unexpected end of template: the '%s' block is not closed", what);
            return b;
        }
        next(c);
        if (t->t == T_DATA) {
            s = stmt(c, S_DATA, t->pos);
            s->text = t->s;
            s->text_len = t->n;
        } else if (t->t == T_VAR_BEGIN) {
            s = stmt(c, S_OUT, t->pos);
            s->e = parse_expr(c);
            expect(c, T_VAR_END);
        } else if (t->t == T_BLOCK_BEGIN) {
            for (size_t i = 0; ends && ends[i]; i++)
                if (is_name(cur(c), ends[i]))
                    return b;
            static const char *const stray[] = {"endif", "endfor", "elif", "else", "endset", "endgeneration"};
            for (size_t i = 0; i < sizeof stray / sizeof stray[0]; i++)
                if (is_name(cur(c), stray[i]))
                    jx_fail(c, cur(c)->pos, PI2_EFORMAT, "unexpected '%s'", stray[i]);
            s = parse_tag(c, t);
        } else {
            jx_fail(c, t->pos, PI2_EFORMAT, "unexpected %s", tok_desc(c, t));
        }
        if (b.n == cap) {
            cap = cap ? cap * 2 : 8;
            jx_stmt **nv = jx_alloc(c, cap * sizeof *nv);
            if (b.n)
                memcpy(nv, b.v, b.n * sizeof *nv);
            b.v = nv;
        }
        b.v[b.n++] = s;
    }
}

jx_body jx_parse(jx_ctx *c)
{
    c->tp = 0;
    c->depth = 0;
    return parse_body(c, NULL, 0, NULL);
}
