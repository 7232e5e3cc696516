/* Chat templates: the render's arena and errors, values, and how values
 * print (Python's str and repr, HF's tojson). */
#include "formats/jinja_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct jx_chunk {
    jx_chunk *next;
    size_t used, cap;
    max_align_t data[];
};

void jx_fail(jx_ctx *c, size_t pos, int code, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++) /* one line, whatever the template says */
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = ' ';
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos && i < c->src_len; i++) {
        if (c->src[i] == '\n') {
            line++;
            col = 1;
        } else if (((unsigned char)c->src[i] & 0xc0) != 0x80) {
            col++;
        }
    }
    pi2_err_set(&c->err, code, "chat template:%zu:%zu: %s", line, col, msg);
    longjmp(c->jb, 1);
}

void *jx_alloc(jx_ctx *c, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (n == 0)
        n = sizeof(max_align_t);
    jx_chunk *k = c->chunks;
    if (!k || k->cap - k->used < n) {
        size_t cap = n > ((size_t)1 << 20) ? n : ((size_t)1 << 20);
        if (n > JX_MAX_ARENA || c->arena_used + cap > JX_MAX_ARENA)
            jx_fail(c, c->src_len, PI2_ERANGE, "rendering needs more than %zu MiB of memory", JX_MAX_ARENA >> 20);
        k = malloc(sizeof *k + cap);
        if (!k)
            jx_fail(c, c->src_len, PI2_ENOMEM, "out of memory");
        k->next = c->chunks;
        k->used = 0;
        k->cap = cap;
        c->chunks = k;
        c->arena_used += cap;
    }
    void *p = (char *)k->data + k->used;
    k->used += n;
    memset(p, 0, n);
    return p;
}

void jx_arena_free(jx_ctx *c)
{
    while (c->chunks) {
        jx_chunk *k = c->chunks;
        c->chunks = k->next;
        free(k);
    }
    c->arena_used = 0;
}

char *jx_strndup(jx_ctx *c, const char *s, size_t n)
{
    char *p = jx_alloc(c, n + 1);
    memcpy(p, s, n);
    return p;
}

jx_val jx_str(const char *s, size_t n) { return (jx_val){.t = V_STR, .s = s, .n = n}; }
jx_val jx_int(int64_t i) { return (jx_val){.t = V_INT, .u.i = i}; }
jx_val jx_bool(bool b) { return (jx_val){.t = V_BOOL, .u.b = b}; }
jx_val jx_none(void) { return (jx_val){.t = V_NONE}; }
jx_val jx_undef(const char *name) { return (jx_val){.t = V_UNDEF, .s = name}; }

jx_list *jx_list_new(jx_ctx *c, size_t cap)
{
    jx_list *l = jx_alloc(c, sizeof *l);
    if (cap) {
        size_t bytes;
        if (!pi2_mul_size(cap, sizeof(jx_val), &bytes))
            jx_fail(c, c->src_len, PI2_ERANGE, "list too long");
        l->v = jx_alloc(c, bytes);
        l->cap = cap;
    }
    return l;
}

void jx_list_push(jx_ctx *c, jx_list *l, jx_val v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        jx_val *nv = jx_alloc(c, cap * sizeof *nv);
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

jx_dict *jx_dict_new(jx_ctx *c, size_t cap)
{
    jx_dict *d = jx_alloc(c, sizeof *d);
    if (cap) {
        d->k = jx_alloc(c, cap * sizeof(jx_val));
        d->v = jx_alloc(c, cap * sizeof(jx_val));
        d->cap = cap;
    }
    return d;
}

const jx_val *jx_dict_get(const jx_dict *d, const char *k, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == V_STR && d->k[i].n == n && memcmp(d->k[i].s, k, n) == 0)
            return &d->v[i];
    return NULL;
}

void jx_dict_set(jx_ctx *c, jx_dict *d, jx_val k, jx_val v)
{
    jx_cost(c, d->n, c->src_len);
    for (size_t i = 0; i < d->n; i++)
        if (jx_equal(d->k[i], k)) {
            d->v[i] = v;
            return;
        }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        jx_val *nk = jx_alloc(c, cap * sizeof *nk), *nv = jx_alloc(c, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

bool jx_truthy(jx_val v)
{
    switch (v.t) {
    case V_BOOL: return v.u.b;
    case V_INT: return v.u.i != 0;
    case V_STR: return v.n != 0;
    case V_LIST: return v.u.l->n != 0;
    case V_DICT: return v.u.d->n != 0;
    case V_NS: case V_FUNC: case V_LOOP: return true;
    default: return false;
    }
}

static bool numeric(jx_val v) { return v.t == V_INT || v.t == V_BOOL; }
static int64_t num(jx_val v) { return v.t == V_INT ? v.u.i : v.u.b; }

bool jx_equal(jx_val a, jx_val b)
{
    if (numeric(a) && numeric(b))
        return num(a) == num(b);
    if (a.t != b.t)
        return false;
    switch (a.t) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return a.n == b.n && (a.n == 0 || memcmp(a.s, b.s, a.n) == 0);
    case V_LIST:
        if (a.u.l->n != b.u.l->n)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jx_equal(a.u.l->v[i], b.u.l->v[i]))
                return false;
        return true;
    case V_DICT:
        if (a.u.d->n != b.u.d->n)
            return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            const jx_val *o = a.u.d->k[i].t == V_STR ? jx_dict_get(b.u.d, a.u.d->k[i].s, a.u.d->k[i].n) : NULL;
            if (!o || !jx_equal(a.u.d->v[i], *o))
                return false;
        }
        return true;
    case V_NS: return a.u.d == b.u.d;
    case V_FUNC: return a.u.fn == b.u.fn;
    case V_LOOP: return a.u.loop == b.u.loop;
    default: return false;
    }
}

const char *jx_type_name(jx_val v)
{
    static const char *const names[] = {"undefined", "NoneType", "bool", "int", "str", "list", "dict",
                                        "Namespace", "function", "LoopContext"};
    return v.t < sizeof names / sizeof names[0] ? names[v.t] : "?";
}

void jx_buf_add(jx_ctx *c, jx_buf *b, const char *s, size_t n)
{
    if (b->cap - b->n < n + 1 || !b->p) {
        size_t need;
        if (!pi2_add_size(b->n, n + 1, &need) || need > JX_MAX_ARENA)
            jx_fail(c, c->src_len, PI2_ERANGE, "a string of more than %zu MiB", JX_MAX_ARENA >> 20);
        size_t cap = b->cap ? b->cap : 32;
        while (cap < need)
            cap *= 2;
        char *np = jx_alloc(c, cap);
        if (b->n)
            memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jx_buf_str(jx_ctx *c, jx_buf *b, const char *s) { jx_buf_add(c, b, s, strlen(s)); }

jx_val jx_buf_val(jx_buf *b) { return jx_str(b->p ? b->p : "", b->n); }

/* Python's repr of a string: single quotes unless it holds ' and no ". */
static void repr_str(jx_ctx *c, jx_buf *b, const char *s, size_t n)
{
    char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    jx_buf_add(c, b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        if (ch == (unsigned char)q || ch == '\\') {
            esc[0] = '\\';
            esc[1] = (char)ch;
            jx_buf_add(c, b, esc, 2);
        } else if (ch == '\n' || ch == '\r' || ch == '\t') {
            esc[0] = '\\';
            esc[1] = ch == '\n' ? 'n' : ch == '\r' ? 'r' : 't';
            jx_buf_add(c, b, esc, 2);
        } else if (ch < 0x20 || ch == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", ch);
            jx_buf_add(c, b, esc, 4);
        } else if (ch == 0xc2 && i + 1 < n && ((unsigned char)s[i + 1] <= 0xa0 || (unsigned char)s[i + 1] == 0xad)) {
            snprintf(esc, sizeof esc, "\\x%02x", (unsigned char)s[i + 1]); /* C1 controls, NBSP, soft hyphen */
            jx_buf_add(c, b, esc, 4);
            i++;
        } else {
            jx_buf_add(c, b, (const char *)&s[i], 1);
        }
    }
    jx_buf_add(c, b, &q, 1);
}

static void depth_in(jx_ctx *c, size_t pos)
{
    if (++c->depth > JX_MAX_DEPTH)
        jx_fail(c, pos, PI2_ERANGE, "values nested more than %d deep", JX_MAX_DEPTH);
}

void jx_repr(jx_ctx *c, jx_buf *b, jx_val v, size_t pos)
{
    if (v.t == V_STR) {
        repr_str(c, b, v.s, v.n);
    } else if (v.t == V_LIST) {
        depth_in(c, pos);
        jx_buf_add(c, b, v.u.l->tuple ? "(" : "[", 1);
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                jx_buf_add(c, b, ", ", 2);
            jx_repr(c, b, v.u.l->v[i], pos);
        }
        if (v.u.l->tuple)
            jx_buf_str(c, b, v.u.l->n == 1 ? ",)" : ")");
        else
            jx_buf_add(c, b, "]", 1);
        c->depth--;
    } else if (v.t == V_DICT) {
        depth_in(c, pos);
        jx_buf_add(c, b, "{", 1);
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i)
                jx_buf_add(c, b, ", ", 2);
            jx_repr(c, b, v.u.d->k[i], pos);
            jx_buf_add(c, b, ": ", 2);
            jx_repr(c, b, v.u.d->v[i], pos);
        }
        jx_buf_add(c, b, "}", 1);
        c->depth--;
    } else {
        jx_to_str(c, b, v, pos);
    }
}

void jx_to_str(jx_ctx *c, jx_buf *b, jx_val v, size_t pos)
{
    char num[32];
    switch (v.t) {
    case V_UNDEF: return;
    case V_NONE: jx_buf_add(c, b, "None", 4); return;
    case V_BOOL: jx_buf_str(c, b, v.u.b ? "True" : "False"); return;
    case V_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        jx_buf_str(c, b, num);
        return;
    case V_STR: jx_buf_add(c, b, v.s, v.n); return;
    case V_LIST: case V_DICT: jx_repr(c, b, v, pos); return;
    case V_NS: jx_buf_str(c, b, "<Namespace>"); return;
    case V_LOOP: jx_buf_str(c, b, "<LoopContext>"); return;
    default: jx_buf_str(c, b, "<function>"); return;
    }
}

jx_val jx_stringify(jx_ctx *c, jx_val v, size_t pos)
{
    if (v.t == V_STR)
        return v;
    jx_buf b = {0};
    jx_buf_add(c, &b, "", 0);
    jx_to_str(c, &b, v, pos);
    return jx_buf_val(&b);
}

static void json_str(jx_ctx *c, jx_buf *b, const char *s, size_t n)
{
    jx_buf_add(c, b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\')
            continue;
        jx_buf_add(c, b, s + run, i - run);
        run = i + 1;
        char esc[8];
        const char *m = ch == '"' ? "\\\"" : ch == '\\' ? "\\\\" : ch == '\n' ? "\\n" : ch == '\r' ? "\\r"
                      : ch == '\t' ? "\\t" : ch == '\b' ? "\\b" : ch == '\f' ? "\\f" : NULL;
        if (!m) {
            snprintf(esc, sizeof esc, "\\u%04x", ch);
            m = esc;
        }
        jx_buf_str(c, b, m);
    }
    jx_buf_add(c, b, s + run, n - run);
    jx_buf_add(c, b, "\"", 1);
}

static void json_nl(jx_ctx *c, jx_buf *b, int indent, int level)
{
    jx_buf_add(c, b, "\n", 1);
    for (int i = 0; i < indent * level; i++)
        jx_buf_add(c, b, " ", 1);
}

/* Python's sort of string keys: by code point, which UTF-8 byte order keeps. */
static int key_cmp(const jx_val *a, const jx_val *b)
{
    size_t n = a->n < b->n ? a->n : b->n;
    int r = n ? memcmp(a->s, b->s, n) : 0;
    return r ? r : (a->n > b->n) - (a->n < b->n);
}

void jx_tojson(jx_ctx *c, jx_buf *b, jx_val v, int indent, bool sort_keys, int level, size_t pos)
{
    const char *item_sep = indent >= 0 ? "," : ", ";
    switch (v.t) {
    case V_NONE: jx_buf_str(c, b, "null"); return;
    case V_BOOL: jx_buf_str(c, b, v.u.b ? "true" : "false"); return;
    case V_INT: jx_to_str(c, b, v, pos); return;
    case V_STR: json_str(c, b, v.s, v.n); return;
    case V_LIST:
        if (v.u.l->n == 0) {
            jx_buf_str(c, b, "[]");
            return;
        }
        depth_in(c, pos);
        jx_buf_add(c, b, "[", 1);
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                jx_buf_str(c, b, item_sep);
            if (indent >= 0)
                json_nl(c, b, indent, level + 1);
            jx_tojson(c, b, v.u.l->v[i], indent, sort_keys, level + 1, pos);
        }
        if (indent >= 0)
            json_nl(c, b, indent, level);
        jx_buf_add(c, b, "]", 1);
        c->depth--;
        return;
    case V_DICT: case V_NS: {
        jx_dict *d = v.u.d;
        if (d->n == 0) {
            jx_buf_str(c, b, "{}");
            return;
        }
        depth_in(c, pos);
        size_t *order = jx_alloc(c, d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++) {
            order[i] = i;
            if (d->k[i].t != V_STR)
                jx_fail(c, pos, PI2_EFORMAT, "tojson: keys must be strings");
        }
        for (size_t i = 1; sort_keys && i < d->n; i++) /* insertion sort: dicts here are small */
            for (size_t j = i; j > 0 && key_cmp(&d->k[order[j - 1]], &d->k[order[j]]) > 0; j--) {
                size_t t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        jx_buf_add(c, b, "{", 1);
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                jx_buf_str(c, b, item_sep);
            if (indent >= 0)
                json_nl(c, b, indent, level + 1);
            json_str(c, b, d->k[order[i]].s, d->k[order[i]].n);
            jx_buf_add(c, b, ": ", 2);
            jx_tojson(c, b, d->v[order[i]], indent, sort_keys, level + 1, pos);
        }
        if (indent >= 0)
            json_nl(c, b, indent, level);
        jx_buf_add(c, b, "}", 1);
        c->depth--;
        return;
    }
    default: jx_fail(c, pos, PI2_EFORMAT, "tojson: object of type %s is not JSON serializable", jx_type_name(v));
    }
}

/* ---- UTF-8 ---- */
static size_t u8_len(const char *s, size_t n)
{
    unsigned char b = (unsigned char)s[0];
    size_t len = b < 0x80 ? 1 : b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 1;
    if (len > n)
        return 1;
    for (size_t i = 1; i < len; i++)
        if (((unsigned char)s[i] & 0xc0) != 0x80)
            return 1; /* a stray byte counts as one character */
    return len;
}

size_t jx_u8_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i += u8_len(s + i, n - i))
        k++;
    return k;
}

size_t jx_u8_offset(const char *s, size_t n, size_t idx)
{
    size_t i = 0;
    while (idx-- && i < n)
        i += u8_len(s + i, n - i);
    return i;
}

static uint32_t u8_cp(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    if (len == 1)
        return u[0];
    uint32_t cp = u[0] & (0x7f >> len);
    for (size_t i = 1; i < len; i++)
        cp = cp << 6 | (u[i] & 0x3f);
    return cp;
}

static bool cp_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

bool jx_u8_space(const char *s, size_t n, size_t *len)
{
    *len = u8_len(s, n);
    return cp_space(u8_cp(s, *len));
}

bool jx_u8_space_before(const char *s, size_t end, size_t *len)
{
    size_t st = end - 1;
    while (st > 0 && end - st < 4 && ((unsigned char)s[st] & 0xc0) == 0x80)
        st--;
    if (u8_len(s + st, end - st) != end - st)
        st = end - 1;
    *len = end - st;
    return cp_space(u8_cp(s + st, *len));
}

/* Whether the code point at s[0..len) is one of chars (a string). */
static bool in_chars(const jx_val *chars, const char *s, size_t len)
{
    for (size_t i = 0; i < chars->n;) {
        size_t l = u8_len(chars->s + i, chars->n - i);
        if (l == len && memcmp(chars->s + i, s, len) == 0)
            return true;
        i += l;
    }
    return false;
}

jx_val jx_strip(jx_ctx *c, jx_val s, bool left, bool right, const jx_val *chars, size_t pos)
{
    if (s.t != V_STR)
        jx_fail(c, pos, PI2_EFORMAT, "strip on a %s, not a string", jx_type_name(s));
    jx_cost(c, s.n >> 5, pos);
    if (chars && chars->t == V_NONE)
        chars = NULL;
    if (chars && chars->t != V_STR)
        jx_fail(c, pos, PI2_EFORMAT, "strip: the characters must be a string");
    size_t a = 0, e = s.n, len;
    while (left && a < e) {
        len = u8_len(s.s + a, e - a);
        if (chars ? !in_chars(chars, s.s + a, len) : !cp_space(u8_cp(s.s + a, len)))
            break;
        a += len;
    }
    while (right && e > a) {
        bool sp = jx_u8_space_before(s.s, e, &len);
        if (e - len < a)
            break;
        if (chars ? !in_chars(chars, s.s + e - len, len) : !sp)
            break;
        e -= len;
    }
    return jx_str(s.s + a, e - a);
}
