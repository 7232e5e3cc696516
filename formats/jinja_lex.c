/* Chat templates: the lexer. Splits the template into data and the tokens
 * of {{ }} and {% %} tags, applying Jinja's whitespace control as Hugging
 * Face configures it (trim_blocks, lstrip_blocks): what Jinja's regular-
 * expression lexer does, written as a scan. */
#include "formats/jinja_internal.h"

#include <string.h>

static jx_tok *push(jx_ctx *c, uint8_t t, size_t pos, const char *s, size_t n)
{
    if (c->n_toks == c->cap_toks) {
        size_t cap = c->cap_toks ? c->cap_toks * 2 : 256;
        jx_tok *nt = jx_alloc(c, cap * sizeof *nt);
        if (c->n_toks)
            memcpy(nt, c->toks, c->n_toks * sizeof *nt);
        c->toks = nt;
        c->cap_toks = cap;
    }
    jx_tok *k = &c->toks[c->n_toks++];
    k->t = t;
    k->pos = pos;
    k->s = s;
    k->n = n;
    k->i = 0;
    return k;
}

static bool at(const jx_ctx *c, size_t p, const char *lit)
{
    size_t n = strlen(lit);
    return p <= c->src_len && c->src_len - p >= n && memcmp(c->src + p, lit, n) == 0;
}

/* Past the whitespace (Python's \s) at p. */
static size_t skip_space(const jx_ctx *c, size_t p)
{
    size_t len;
    while (p < c->src_len && jx_u8_space(c->src + p, c->src_len - p, &len))
        p += len;
    return p;
}

/* Whether src[a..b) is non-empty and all whitespace. */
static bool all_space(const jx_ctx *c, size_t a, size_t b)
{
    if (a >= b)
        return false;
    return skip_space(c, a) >= b;
}

/* Where the next tag starts at or after p ("{{", "{%", "{#"), or src_len. */
static size_t next_tag(const jx_ctx *c, size_t p)
{
    for (;;) {
        const char *q = memchr(c->src + p, '{', c->src_len - p);
        if (!q)
            return c->src_len;
        size_t i = (size_t)(q - c->src);
        if (i + 1 < c->src_len && (q[1] == '{' || q[1] == '%' || q[1] == '#'))
            return i;
        p = i + 1;
    }
}

/* Emit the data src[p..start) before a tag of kind k ('{', '%', '#') with
 * sign ('-', '+' or 0), stripped as Jinja strips it. */
static void emit_data(jx_ctx *c, size_t p, size_t start, char k, char sign)
{
    size_t end = start, len;
    if (sign == '-') {
        while (end > p && jx_u8_space_before(c->src, end, &len) && end - len >= p)
            end -= len;
    } else if (sign != '+' && k != '{') {
        /* lstrip_blocks: spaces alone between the line start and the tag */
        size_t l = end;
        while (l > p && c->src[l - 1] != '\n')
            l--;
        bool line_start = l > p || p == 0 || c->src[p - 1] == '\n';
        if (line_start && all_space(c, l, end))
            end = l;
    }
    if (end > p)
        push(c, T_DATA, p, c->src + p, end - p);
}

/* After a block or comment end at p (past "%}" or "#}"); sign as above. */
static size_t after_block_end(const jx_ctx *c, size_t p, char sign)
{
    if (sign == '-')
        return skip_space(c, p);
    if (sign != '+' && p < c->src_len && c->src[p] == '\n')
        return p + 1; /* trim_blocks */
    return p;
}


static void put_u8(jx_ctx *c, jx_buf *b, uint32_t cp, size_t pos)
{
    char u[4];
    size_t n;
    if (cp > 0x10ffff)
        jx_fail(c, pos, PI2_EFORMAT, "escape beyond U+10FFFF in a string");
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xc0 | cp >> 6);
        u[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | cp >> 12);
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        u[0] = (char)(0xf0 | cp >> 18);
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    jx_buf_add(c, b, u, n);
}

/* One escape at src[p] (just past the backslash); returns the position after
 * it. Python's unicode-escape: unknown escapes stay as written. */
static size_t escape(jx_ctx *c, jx_buf *b, size_t p, size_t end)
{
    static const char from[] = "nrtabfv\\'\"", to[] = "\n\r\t\a\b\f\v\\'\"";
    char ch = c->src[p];
    const char *f = strchr(from, ch);
    if (f && ch) {
        jx_buf_add(c, b, &to[f - from], 1);
        return p + 1;
    }
    if (ch == '\n') /* backslash-newline: a line continuation */
        return p + 1;
    int digits = ch == 'x' ? 2 : ch == 'u' ? 4 : ch == 'U' ? 8 : 0;
    if (digits) {
        uint32_t cp = 0;
        for (int i = 1; i <= digits; i++) {
            int h = p + (size_t)i < end ? pi2_hex_digit(c->src[p + (size_t)i]) : -1;
            if (h < 0)
                jx_fail(c, p - 1, PI2_EFORMAT, "truncated \\%c escape in a string", ch);
            cp = cp * 16 + (uint32_t)h;
        }
        put_u8(c, b, cp, p - 1);
        return p + 1 + (size_t)digits;
    }
    if (ch >= '0' && ch <= '7') {
        uint32_t cp = 0;
        size_t i = 0;
        for (; i < 3 && p + i < end && c->src[p + i] >= '0' && c->src[p + i] <= '7'; i++)
            cp = cp * 8 + (uint32_t)(c->src[p + i] - '0');
        put_u8(c, b, cp, p - 1);
        return p + i;
    }
    if (ch == 'N')
        jx_fail(c, p - 1, PI2_EUNSUPPORTED, "\\N{...} escapes are not supported");
    jx_buf_add(c, b, "\\", 1);
    return p; /* the character itself is copied next */
}

/* A string literal at p (its quote); returns the position after it. */
static size_t lex_string(jx_ctx *c, size_t p)
{
    char q = c->src[p];
    size_t i = p + 1;
    jx_buf b = {0};
    jx_buf_add(c, &b, "", 0);
    for (;;) {
        if (i >= c->src_len)
            jx_fail(c, p, PI2_EFORMAT, "unterminated string");
        char ch = c->src[i];
        if (ch == q)
            break;
        if (ch == '\\' && i + 1 < c->src_len) {
            i = escape(c, &b, i + 1, c->src_len);
            continue;
        }
        jx_buf_add(c, &b, &ch, 1);
        i++;
    }
    push(c, T_STRING, p, b.p, b.n);
    return i + 1;
}

static size_t lex_number(jx_ctx *c, size_t p)
{
    size_t i = p;
    int64_t v = 0;
    while (i < c->src_len && ((c->src[i] >= '0' && c->src[i] <= '9') || (c->src[i] == '_' && i > p))) {
        if (c->src[i] != '_' &&
            (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, c->src[i] - '0', &v)))
            jx_fail(c, p, PI2_ERANGE, "integer literal out of range");
        i++;
    }
    if (i < c->src_len && (c->src[i] == '.' || c->src[i] == 'e' || c->src[i] == 'E') && i + 1 < c->src_len &&
        c->src[i + 1] >= '0' && c->src[i + 1] <= '9')
        jx_fail(c, p, PI2_EUNSUPPORTED, "floating-point numbers are not supported");
    push(c, T_INT, p, c->src + p, i - p)->i = v;
    return i;
}

/* The tokens of one tag from p up to its end ("}}" or "%}" at bracket
 * depth 0); returns the position after the end marker and its stripping. */
static size_t lex_tag(jx_ctx *c, size_t p, char k, size_t start)
{
    char stack[64];
    int depth = 0;
    for (;;) {
        p = skip_space(c, p);
        if (p >= c->src_len)
            jx_fail(c, start, PI2_EFORMAT, "unexpected end of template: the tag is not closed");
        const char *s = c->src + p;
        if (depth == 0) {
            const char *endm = k == '%' ? "%}" : "}}";
            char sign = 0;
            size_t q = p;
            if ((*s == '-' || (*s == '+' && k == '%')) && at(c, p + 1, endm)) {
                sign = *s;
                q++;
            }
            if (at(c, q, endm)) {
                push(c, k == '%' ? T_BLOCK_END : T_VAR_END, p, s, 0);
                q += 2;
                if (k == '%')
                    return after_block_end(c, q, sign);
                return sign == '-' ? skip_space(c, q) : q;
            }
        }
        char ch = *s;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_') {
            size_t i = p;
            while (i < c->src_len && ((c->src[i] >= 'a' && c->src[i] <= 'z') || (c->src[i] >= 'A' && c->src[i] <= 'Z') ||
                                      (c->src[i] >= '0' && c->src[i] <= '9') || c->src[i] == '_'))
                i++;
            push(c, T_NAME, p, s, i - p);
            p = i;
        } else if (ch >= '0' && ch <= '9') {
            p = lex_number(c, p);
        } else if (ch == '\'' || ch == '"') {
            p = lex_string(c, p);
        } else {
            static const char *const two[] = {"==", "!=", "<=", ">=", "//", "**"};
            size_t n = 0;
            for (size_t i = 0; i < sizeof two / sizeof two[0] && !n; i++)
                if (at(c, p, two[i]))
                    n = 2;
            if (!n && strchr("+-*/%~<>=.,:|()[]{}", ch) && ch)
                n = 1;
            if (!n)
                jx_fail(c, p, PI2_EFORMAT, "unexpected character '%c' in a tag", ch >= 0x20 && ch < 0x7f ? ch : '?');
            if (ch == '(' || ch == '[' || ch == '{') {
                if (depth == (int)sizeof stack)
                    jx_fail(c, p, PI2_ERANGE, "brackets nested too deep");
                stack[depth++] = ch == '(' ? ')' : ch == '[' ? ']' : '}';
            } else if (ch == ')' || ch == ']' || ch == '}') {
                if (depth == 0)
                    jx_fail(c, p, PI2_EFORMAT, "unexpected '%c'", ch);
                if (stack[--depth] != ch)
                    jx_fail(c, p, PI2_EFORMAT, "unexpected '%c', expected '%c'", ch, stack[depth]);
            }
            push(c, T_OP, p, s, n);
            p += n;
        }
    }
}

void jx_lex(jx_ctx *c)
{
    size_t p = 0;
    while (p < c->src_len) {
        size_t start = next_tag(c, p);
        if (start == c->src_len) {
            push(c, T_DATA, p, c->src + p, start - p);
            break;
        }
        char k = c->src[start + 1];
        char sign = 0;
        if (start + 2 < c->src_len && (c->src[start + 2] == '-' || (c->src[start + 2] == '+' && k != '{')))
            sign = c->src[start + 2];
        emit_data(c, p, start, k, sign);
        p = start + 2 + (sign ? 1 : 0);
        if (k == '#') {
            const char *e = NULL;
            for (size_t i = p; i + 1 < c->src_len && !e; i++)
                if (c->src[i] == '#' && c->src[i + 1] == '}')
                    e = c->src + i;
            if (!e)
                jx_fail(c, start, PI2_EFORMAT, "missing end of comment tag");
            size_t q = (size_t)(e - c->src);
            char esign = q > p && (c->src[q - 1] == '-' || c->src[q - 1] == '+') ? c->src[q - 1] : 0;
            p = after_block_end(c, q + 2, esign);
            continue;
        }
        push(c, k == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, start, c->src + start, 2);
        p = lex_tag(c, p, k, start);
    }
    push(c, T_EOF, c->src_len, c->src + c->src_len, 0);
}
