/* Strict JSON member reader; see formats/jsonread.h. One place for the
 * checks and the wording, so every JSON file pi2 reads is refused the same
 * way. */
#include "formats/jsonread.h"
#include "formats/jsonutil.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int pi2_jr_fail(const pi2_jr *r, int code, const char *w, const char *k, const char *fmt, ...)
{
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    w = w ? w : "";
    k = k ? k : "";
    bool dot = *w && *k;
    return pi2_err_set(r->err, code, "%.240s: %s%s%s: %s", r->file, *w || *k ? w : "top level", dot ? "." : "", k,
                       msg);
}

const char *pi2_jr_clean(const char *s, char *buf, size_t cap)
{
    size_t i = 0;
    for (; s[i] && i + 1 < cap; i++)
        buf[i] = (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f ? s[i] : '?';
    buf[i] = 0;
    if (s[i] && cap > 4)
        memcpy(buf + cap - 4, "...", 4);
    return buf;
}

const char *pi2_jr_path(char *buf, size_t cap, const char *w, const char *k)
{
    snprintf(buf, cap, "%s%s%s", w, *w && *k ? "." : "", k);
    return buf;
}

int pi2_jr_keys(const pi2_jr *r, json_t *o, const char *w, const char *const *keys, size_t n, bool all_required)
{
    const char *key;
    json_t *val;
    json_object_foreach(o, key, val) {
        size_t i = 0;
        while (i < n && strcmp(key, keys[i]) != 0)
            i++;
        if (i == n) {
            char buf[64];
            return pi2_jr_fail(r, PI2_EFORMAT, w, pi2_jr_clean(key, buf, sizeof buf), "unknown key");
        }
    }
    for (size_t i = 0; all_required && i < n; i++)
        if (!json_object_get(o, keys[i]))
            return pi2_jr_fail(r, PI2_EFORMAT, w, keys[i], "required key is missing");
    return 0;
}

int pi2_jr_need(const pi2_jr *r, json_t *o, const char *w, const char *k, json_t **v)
{
    *v = json_object_get(o, k);
    if (!*v)
        return pi2_jr_fail(r, PI2_ENOTFOUND, w, k, "required key is missing");
    return 0;
}

int pi2_jr_obj(const pi2_jr *r, json_t *o, const char *w, const char *k, bool nullable, json_t **out)
{
    int rc = pi2_jr_need(r, o, w, k, out);
    if (rc)
        return rc;
    if (nullable && json_is_null(*out)) {
        *out = NULL;
        return 0;
    }
    if (!json_is_object(*out))
        return pi2_jr_fail(r, PI2_EFORMAT, w, k, "expected an object, got %s", pi2_json_type_name(*out));
    return 0;
}

int pi2_jr_elem_obj(const pi2_jr *r, json_t *arr, size_t i, const char *w, json_t **out)
{
    *out = json_array_get(arr, i);
    if (!json_is_object(*out))
        return pi2_jr_fail(r, PI2_EFORMAT, w, NULL, "expected an object, got %s", pi2_json_type_name(*out));
    return 0;
}

int pi2_jr_arr(const pi2_jr *r, json_t *o, const char *w, const char *k, size_t max, json_t **out, size_t *n)
{
    int rc = pi2_jr_need(r, o, w, k, out);
    if (rc)
        return rc;
    if (!json_is_array(*out))
        return pi2_jr_fail(r, PI2_EFORMAT, w, k, "expected an array, got %s", pi2_json_type_name(*out));
    *n = json_array_size(*out);
    if (*n > max)
        return pi2_jr_fail(r, PI2_ERANGE, w, k, "%zu entries, at most %zu allowed here", *n, max);
    return 0;
}

int pi2_jr_int_val(const pi2_jr *r, json_t *v, const char *w, const char *k, long long lo, long long hi,
                   long long *out)
{
    if (!v)
        return pi2_jr_fail(r, PI2_ENOTFOUND, w, k, "required key is missing");
    if (!json_is_integer(v))
        return pi2_jr_fail(r, PI2_EFORMAT, w, k, "expected an integer, got %s", pi2_json_type_name(v));
    long long x = json_integer_value(v);
    if (x < lo || x > hi) {
        if (hi == INT64_MAX)
            return pi2_jr_fail(r, PI2_ERANGE, w, k, "%lld is out of range (must be >= %lld)", x, lo);
        return pi2_jr_fail(r, PI2_ERANGE, w, k, "%lld is out of range [%lld, %lld]", x, lo, hi);
    }
    *out = x;
    return 0;
}

int pi2_jr_int(const pi2_jr *r, json_t *o, const char *w, const char *k, long long lo, long long hi, long long *out)
{
    return pi2_jr_int_val(r, json_object_get(o, k), w, k, lo, hi, out);
}

int pi2_jr_i32(const pi2_jr *r, json_t *o, const char *w, const char *k, long long lo, long long hi, int *out)
{
    long long x;
    int rc = pi2_jr_int(r, o, w, k, lo, hi, &x);
    if (rc == 0)
        *out = (int)x;
    return rc;
}

int pi2_jr_u32(const pi2_jr *r, json_t *o, const char *w, const char *k, uint32_t lo, uint32_t hi, uint32_t *out)
{
    long long x;
    int rc = pi2_jr_int(r, o, w, k, lo, hi, &x);
    if (rc == 0)
        *out = (uint32_t)x;
    return rc;
}

int pi2_jr_u64(const pi2_jr *r, json_t *o, const char *w, const char *k, long long hi, uint64_t *out)
{
    long long x;
    int rc = pi2_jr_int(r, o, w, k, 0, hi, &x);
    if (rc == 0)
        *out = (uint64_t)x;
    return rc;
}

int pi2_jr_real_val(const pi2_jr *r, json_t *v, const char *w, const char *k, double lo, double hi, unsigned flags,
                    double *out)
{
    if (!v) {
        if (!(flags & PI2_JR_OPTIONAL))
            return pi2_jr_fail(r, PI2_ENOTFOUND, w, k, "required key is missing");
        *out = NAN;
        return 0;
    }
    if (json_is_null(v) && (flags & PI2_JR_NULLABLE)) {
        *out = NAN;
        return 0;
    }
    if (!json_is_number(v))
        return pi2_jr_fail(r, PI2_EFORMAT, w, k, "expected a finite number, got %s", pi2_json_type_name(v));
    double x = json_number_value(v);
    bool lo_open = flags & PI2_JR_LO_OPEN, hi_open = flags & PI2_JR_HI_OPEN;
    if (!isfinite(x) || x < lo || x > hi || (lo_open && x == lo) || (hi_open && x == hi)) {
        if (hi == DBL_MAX || hi == FLT_MAX)
            return pi2_jr_fail(r, PI2_ERANGE, w, k, "%g is out of range (must be %s %g)", x, lo_open ? ">" : ">=", lo);
        return pi2_jr_fail(r, PI2_ERANGE, w, k, "%g is out of range %c%g, %g%c", x, lo_open ? '(' : '[', lo, hi,
                           hi_open ? ')' : ']');
    }
    *out = x;
    return 0;
}

int pi2_jr_real(const pi2_jr *r, json_t *o, const char *w, const char *k, double lo, double hi, unsigned flags,
                double *out)
{
    return pi2_jr_real_val(r, json_object_get(o, k), w, k, lo, hi, flags, out);
}

int pi2_jr_float(const pi2_jr *r, json_t *o, const char *w, const char *k, double lo, double hi, float *out)
{
    double x;
    int rc = pi2_jr_real(r, o, w, k, lo < -FLT_MAX ? -FLT_MAX : lo, hi > FLT_MAX ? FLT_MAX : hi, 0, &x);
    if (rc == 0)
        *out = (float)x;
    return rc;
}

int pi2_jr_bool(const pi2_jr *r, json_t *o, const char *w, const char *k, bool *out)
{
    json_t *v;
    int rc = pi2_jr_need(r, o, w, k, &v);
    if (rc)
        return rc;
    if (!json_is_boolean(v))
        return pi2_jr_fail(r, PI2_EFORMAT, w, k, "expected true or false, got %s", pi2_json_type_name(v));
    *out = json_is_true(v);
    return 0;
}

int pi2_jr_bool_or(const pi2_jr *r, json_t *o, const char *w, const char *k, bool def, bool *out)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    return pi2_jr_bool(r, o, w, k, out);
}

int pi2_jr_str(const pi2_jr *r, json_t *o, const char *w, const char *k, size_t cap, const char **out)
{
    json_t *v;
    int rc = pi2_jr_need(r, o, w, k, &v);
    if (rc)
        return rc;
    if (!json_is_string(v))
        return pi2_jr_fail(r, PI2_EFORMAT, w, k, "expected a string, got %s", pi2_json_type_name(v));
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (strlen(s) != n)
        return pi2_jr_fail(r, PI2_EFORMAT, w, k, "string holds a NUL byte");
    if (n >= cap)
        return pi2_jr_fail(r, PI2_ERANGE, w, k, "string of %zu bytes, at most %zu allowed", n, cap - 1);
    *out = s;
    return 0;
}

int pi2_jr_text(const pi2_jr *r, json_t *o, const char *w, const char *k, char *dst, size_t cap)
{
    const char *s;
    int rc = pi2_jr_str(r, o, w, k, cap, &s);
    if (rc)
        return rc;
    if (!*s)
        return pi2_jr_fail(r, PI2_EFORMAT, w, k, "empty string");
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return pi2_jr_fail(r, PI2_EFORMAT, w, k, "string holds a control character");
    memcpy(dst, s, strlen(s) + 1);
    return 0;
}

int pi2_jr_enum(const pi2_jr *r, json_t *o, const char *w, const char *k, const char *const *names, size_t n,
                const char *choices, int *out)
{
    const char *s;
    int rc = pi2_jr_str(r, o, w, k, 64, &s);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++)
        if (names[i] && strcmp(s, names[i]) == 0) {
            *out = (int)i;
            return 0;
        }
    char buf[40];
    return pi2_jr_fail(r, PI2_EUNSUPPORTED, w, k, "unknown value \"%s\" (expected %s)",
                       pi2_jr_clean(s, buf, sizeof buf), choices);
}
