/* Internals of the chat-template interpreter (formats/jinja*.c), shared by
 * the lexer, parser, values and evaluator; nothing outside formats/jinja*.c
 * includes this.
 *
 * One render owns one jx_ctx. Everything it allocates (tokens, syntax tree,
 * values) lives in the context's arena, freed at once at the end; a failure
 * anywhere longjmps back to pi2_jinja_render with the error set, which is
 * why no function here returns a status. */
#ifndef PI2_JINJA_INTERNAL_H
#define PI2_JINJA_INTERNAL_H

#include "formats/jinja.h"

#include <setjmp.h>
#include <stdint.h>

enum {
    JX_MAX_TEMPLATE = 1 << 20,
    JX_MAX_DEPTH = 200,
    JX_MAX_RANGE = 100000,
    JX_MAX_ITERS = 1000000,
    JX_MAX_STEPS = 50000000,
    JX_MAX_OUTPUT = 16 << 20,
};
#define JX_MAX_ARENA ((size_t)256 << 20)

/* ---- values ---- */
enum jx_vt { V_UNDEF, V_NONE, V_BOOL, V_INT, V_STR, V_LIST, V_DICT, V_NS, V_FUNC, V_LOOP };
enum jx_fn { FN_RAISE, FN_RANGE, FN_NAMESPACE };

typedef struct jx_list jx_list;
typedef struct jx_dict jx_dict;
typedef struct jx_loop jx_loop;

typedef struct jx_val {
    uint8_t t;
    union {
        bool b;
        int64_t i;
        int fn;
        jx_list *l;
        jx_dict *d;
        jx_loop *loop;
    } u;
    const char *s; /* V_STR text (not NUL-terminated); V_UNDEF: the name, for messages */
    size_t n;      /* V_STR bytes */
} jx_val;

struct jx_list {
    jx_val *v;
    size_t n, cap;
    bool tuple; /* prints as (a, b): items() pairs and tuple literals */
};
struct jx_dict { /* insertion order; keys are strings; linear lookup (small dicts) */
    jx_val *k, *v;
    size_t n, cap;
};
struct jx_loop {
    jx_list *items; /* what the loop runs over (after its `if`) */
    size_t i0;      /* index0 */
};

/* ---- tokens ---- */
enum jx_tt { T_EOF, T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_OP };

typedef struct jx_tok {
    uint8_t t;
    size_t pos;    /* byte offset in the template */
    const char *s; /* name, operator, data or decoded string */
    size_t n;
    int64_t i; /* T_INT */
} jx_tok;

/* ---- syntax tree ---- */
enum jx_ek {
    E_LIT, E_NAME, E_LIST, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST,
    E_NOT, E_NEG, E_POS, E_BIN, E_AND, E_OR, E_COND, E_CMP, E_CONCAT,
};
/* E_BIN / E_CMP operators */
enum jx_op { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE,
             OP_IN, OP_NOTIN };

typedef struct jx_expr jx_expr;
struct jx_expr {
    uint8_t k;
    uint8_t op;
    bool neg;        /* E_TEST: `is not` */
    size_t pos;
    jx_val lit;      /* E_LIT */
    const char *name; /* E_NAME, E_ATTR, E_FILTER, E_TEST (NUL-terminated, arena) */
    jx_expr *a, *b, *c; /* operands; E_SLICE: object a, start b, stop c, step args[0] */
    bool tuple;       /* E_LIST: written as a tuple */
    jx_expr **args;   /* E_LIST items, E_DICT key/value pairs, call/filter/test arguments, E_CMP operands */
    const char **kw;  /* keyword of each argument, NULL when positional */
    uint8_t *ops;     /* E_CMP operators (n_args - 1) */
    size_t n_args;
};

enum jx_sk { S_DATA, S_OUT, S_IF, S_FOR, S_SET, S_SET_ATTR, S_SET_BLOCK, S_BREAK, S_CONTINUE, S_BLOCK };

typedef struct jx_stmt jx_stmt;
typedef struct jx_body {
    jx_stmt **v;
    size_t n;
} jx_body;

struct jx_stmt {
    uint8_t k;
    size_t pos;
    const char *text; /* S_DATA */
    size_t text_len;
    jx_expr *e;       /* S_OUT, S_SET value, S_IF condition, S_FOR iterable */
    jx_expr *cond;    /* S_FOR `if` filter */
    const char *names[2]; /* S_FOR targets, S_SET* name (and S_SET_ATTR attribute) */
    int n_names;
    jx_body body, orelse; /* S_IF: then / else (an elif is an S_IF alone in orelse) */
};

/* ---- a render ---- */
typedef struct jx_frame jx_frame;
struct jx_frame {
    jx_frame *up;
    const char **names;
    jx_val *vals;
    size_t n, cap;
};

typedef struct jx_chunk jx_chunk;

typedef struct jx_ctx {
    jmp_buf jb;
    pi2_err err; /* the first failure (copied to the caller's) */
    const char *src; /* the normalized template */
    size_t src_len;
    jx_chunk *chunks;
    size_t arena_used;
    /* lexer output */
    jx_tok *toks;
    size_t n_toks, cap_toks, tp;
    int depth;
    int loops; /* parser: for loops open around the current statement */
    uint64_t steps, iters;
    /* rendering */
    jx_frame *frame;
    jx_loop *loop; /* innermost loop, or NULL */
    char *out;     /* malloc'd (not in the arena: it is the result) */
    size_t out_len, out_cap;
} jx_ctx;

/* Set "chat template:L:C: msg" with code and unwind to the render's entry. */
_Noreturn void jx_fail(jx_ctx *c, size_t pos, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Zeroed arena memory (never NULL: failure unwinds with PI2_ENOMEM/ERANGE). */
void *jx_alloc(jx_ctx *c, size_t n);
void jx_arena_free(jx_ctx *c);
char *jx_strndup(jx_ctx *c, const char *s, size_t n);

void jx_lex(jx_ctx *c); /* c->src -> c->toks */
jx_body jx_parse(jx_ctx *c); /* c->toks -> the template's statements */
void jx_exec(jx_ctx *c, const jx_body *b);

/* values (jinja_value.c) */
jx_val jx_str(const char *s, size_t n);
jx_val jx_int(int64_t i);
jx_val jx_bool(bool b);
jx_val jx_none(void);
jx_val jx_undef(const char *name);
jx_list *jx_list_new(jx_ctx *c, size_t cap);
void jx_list_push(jx_ctx *c, jx_list *l, jx_val v);
jx_dict *jx_dict_new(jx_ctx *c, size_t cap);
void jx_dict_set(jx_ctx *c, jx_dict *d, jx_val k, jx_val v);
const jx_val *jx_dict_get(const jx_dict *d, const char *k, size_t n);
bool jx_truthy(jx_val v);
bool jx_equal(jx_val a, jx_val b);
const char *jx_type_name(jx_val v);
/* Growable byte buffer in the arena. */
typedef struct jx_buf {
    char *p;
    size_t n, cap;
} jx_buf;
void jx_buf_add(jx_ctx *c, jx_buf *b, const char *s, size_t n);
void jx_buf_str(jx_ctx *c, jx_buf *b, const char *s); /* NUL-terminated s */
jx_val jx_buf_val(jx_buf *b);
/* Python's str(v) (undefined: "") and repr(v), appended to b. */
void jx_to_str(jx_ctx *c, jx_buf *b, jx_val v, size_t pos);
void jx_repr(jx_ctx *c, jx_buf *b, jx_val v, size_t pos);
jx_val jx_stringify(jx_ctx *c, jx_val v, size_t pos);
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: none), sort_keys). */
void jx_tojson(jx_ctx *c, jx_buf *b, jx_val v, int indent, bool sort_keys, int level, size_t pos);
/* UTF-8 helpers: code points in s; the byte offset of code point i (i <= count). */
size_t jx_u8_count(const char *s, size_t n);
size_t jx_u8_offset(const char *s, size_t n, size_t i);
/* Python's str.isspace for the code point at s (its length in *len). */
bool jx_u8_space(const char *s, size_t n, size_t *len);
bool jx_u8_space_before(const char *s, size_t end, size_t *len); /* the code point ending at end */
jx_val jx_strip(jx_ctx *c, jx_val s, bool left, bool right, const jx_val *chars, size_t pos);

/* built-ins (jinja_builtin.c) */
jx_val jx_filter(jx_ctx *c, const jx_expr *e, jx_val v, jx_val *args, const char **kw, size_t n);
bool jx_test(jx_ctx *c, const jx_expr *e, jx_val v, jx_val *args, size_t n);
/* obj.name(args) for str and dict methods; false when obj has no such method. */
bool jx_method(jx_ctx *c, size_t pos, jx_val obj, const char *name, jx_val *args, const char **kw, size_t n,
               jx_val *out);
jx_val jx_call_fn(jx_ctx *c, size_t pos, int fn, jx_val *args, const char **kw, size_t n);
/* The items a for loop or a filter runs over (strings: one per code point,
 * dicts: keys, undefined: none); a type error otherwise. */
jx_list *jx_iterate(jx_ctx *c, jx_val v, size_t pos);
/* Attribute or item `name` of v (undefined when missing; a type error on
 * undefined/none). */
jx_val jx_getattr(jx_ctx *c, jx_val v, const char *name, size_t n, size_t pos);
void jx_step(jx_ctx *c, size_t pos);
/* Charge `steps` more (work proportional to a size: scanning a long string
 * costs a step per 32 bytes), so that no template runs long without
 * reaching the step limit. */
void jx_cost(jx_ctx *c, size_t steps, size_t pos);

#endif
