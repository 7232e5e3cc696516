#include "formats/jsonutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *pi2_json_type_name(const json_t *v)
{
    if (!v)
        return "nothing";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

void pi2_json_fmt_real(char *buf, size_t cap, double v)
{
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(buf, cap, "%.*e", prec - 1, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    snprintf(buf, cap, "%.*e", prec - 1, v);
    const char *e = strchr(buf, 'e');
    int exp = e ? atoi(e + 1) : 0;
    if (exp >= -4 && exp < 16) {
        int decimals = prec - 1 - exp;
        snprintf(buf, cap, "%.*f", decimals > 0 ? decimals : 0, v);
        if (!strchr(buf, '.'))
            strncat(buf, ".0", cap - strlen(buf) - 1);
    }
}

json_t *pi2_json_num(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* Nine significant digits always read back as the float (for a finite f), so
 * the loop ends there; the cast of strtod, not strtof, is the test because a
 * reader parses the double first (the two can differ by double rounding). */
double pi2_json_float_value(float f)
{
    char buf[40];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        double d = strtod(buf, NULL);
        if ((float)d == f)
            return d;
    }
    return (double)f;
}

json_t *pi2_json_float(float f) { return isfinite(f) ? json_real(pi2_json_float_value(f)) : json_null(); }

void pi2_sb_put(pi2_sbuf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < b->len + n + 1)
            nc *= 2;
        char *p = realloc(b->p, nc);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void pi2_sb_str(pi2_sbuf *b, const char *s) { pi2_sb_put(b, s, strlen(s)); }

void pi2_sb_indent(pi2_sbuf *b, int depth)
{
    for (int i = 0; i < depth; i++)
        pi2_sb_put(b, "  ", 2);
}
