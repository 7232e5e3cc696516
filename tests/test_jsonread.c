/* formats/jsonread: each getter accepts what its contract allows and refuses
 * the rest with the exact code and a one-line "<file>: <path>: <problem>". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "formats/jsonread.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static json_t *parse(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!j)
        fail_msg("%s: %s", text, je.text);
    return j;
}

/* Checks the failure, then clears err for the next one (the first error set
 * wins). */
static void expect(int rc, pi2_err *err, int code, const char *msg)
{
    assert_int_equal(rc, code);
    assert_int_equal(err->code, code);
    assert_string_equal(err->msg, msg);
    pi2_err_clear(err);
}

static void test_paths(void **state)
{
    (void)state;
    pi2_err err = { 0 };
    pi2_jr r = { "f.json", &err };
    expect(pi2_jr_fail(&r, PI2_EFORMAT, "", NULL, "bad"), &err, PI2_EFORMAT, "f.json: top level: bad");
    expect(pi2_jr_fail(&r, PI2_EFORMAT, "", "k", "bad"), &err, PI2_EFORMAT, "f.json: k: bad");
    expect(pi2_jr_fail(&r, PI2_EFORMAT, "a[1]", NULL, "bad"), &err, PI2_EFORMAT, "f.json: a[1]: bad");
    expect(pi2_jr_fail(&r, PI2_EFORMAT, "a[1]", "k", "bad"), &err, PI2_EFORMAT, "f.json: a[1].k: bad");
    char buf[8];
    assert_string_equal(pi2_jr_clean("a\nb", buf, sizeof buf), "a?b");
    assert_string_equal(pi2_jr_clean("abcdefghij", buf, sizeof buf), "abcd...");
    assert_string_equal(pi2_jr_path(buf, sizeof buf, "", "k"), "k");
}

static void test_keys_and_containers(void **state)
{
    (void)state;
    pi2_err err = { 0 };
    pi2_jr r = { "f.json", &err };
    json_t *o = parse("{\"a\": 1, \"o\": {}, \"n\": null, \"l\": [1, 2, 3], \"zz\\u0001\": 0}");
    static const char *const keys[] = { "a", "o", "n", "l", "x" };
    expect(PI2_JR_KEYS(&r, o, "w", keys, false), &err, PI2_EFORMAT, "f.json: w.zz?: unknown key");
    json_object_del(o, "zz\x01");
    assert_int_equal(PI2_JR_KEYS(&r, o, "w", keys, false), 0);
    expect(PI2_JR_KEYS(&r, o, "w", keys, true), &err, PI2_EFORMAT, "f.json: w.x: required key is missing");

    json_t *v;
    size_t n;
    assert_int_equal(pi2_jr_obj(&r, o, "", "o", false, &v), 0);
    assert_int_equal(pi2_jr_obj(&r, o, "", "n", true, &v), 0);
    assert_null(v);
    expect(pi2_jr_obj(&r, o, "", "n", false, &v), &err, PI2_EFORMAT, "f.json: n: expected an object, got null");
    expect(pi2_jr_obj(&r, o, "", "x", false, &v), &err, PI2_ENOTFOUND, "f.json: x: required key is missing");
    assert_int_equal(pi2_jr_arr(&r, o, "", "l", 3, &v, &n), 0);
    assert_int_equal(n, 3);
    expect(pi2_jr_arr(&r, o, "", "l", 2, &v, &n), &err, PI2_ERANGE, "f.json: l: 3 entries, at most 2 allowed here");
    expect(pi2_jr_elem_obj(&r, v, 0, "l[0]", &v), &err, PI2_EFORMAT,
           "f.json: l[0]: expected an object, got an integer");
    json_decref(o);
}

static void test_numbers(void **state)
{
    (void)state;
    pi2_err err = { 0 };
    pi2_jr r = { "f.json", &err };
    json_t *o = parse("{\"i\": 7, \"r\": 0.5, \"z\": 0, \"one\": 1, \"s\": \"x\", \"n\": null}");
    long long x;
    int i32;
    uint64_t u;
    double d;
    float f;
    assert_int_equal(pi2_jr_int(&r, o, "", "i", 1, 7, &x), 0);
    assert_int_equal(x, 7);
    expect(pi2_jr_int(&r, o, "", "i", 1, 6, &x), &err, PI2_ERANGE, "f.json: i: 7 is out of range [1, 6]");
    expect(pi2_jr_int(&r, o, "", "i", 8, INT64_MAX, &x), &err, PI2_ERANGE,
           "f.json: i: 7 is out of range (must be >= 8)");
    expect(pi2_jr_int(&r, o, "", "r", 0, 9, &x), &err, PI2_EFORMAT, "f.json: r: expected an integer, got a real");
    assert_int_equal(pi2_jr_i32(&r, o, "", "i", 0, 9, &i32), 0);
    assert_int_equal(i32, 7);
    assert_int_equal(pi2_jr_u64(&r, o, "", "i", 9, &u), 0);
    assert_int_equal(u, 7);
    uint32_t u32;
    assert_int_equal(pi2_jr_u32(&r, o, "", "i", 7, UINT32_MAX, &u32), 0);
    assert_int_equal(u32, 7);
    expect(pi2_jr_u32(&r, o, "", "z", 1, 9, &u32), &err, PI2_ERANGE, "f.json: z: 0 is out of range [1, 9]");
    assert_int_equal(pi2_jr_int_val(&r, json_object_get(o, "i"), "a[2]", NULL, 0, 9, &x), 0);
    assert_int_equal(x, 7);
    expect(pi2_jr_int_val(&r, json_object_get(o, "n"), "a[2]", NULL, 0, 9, &x), &err, PI2_EFORMAT,
           "f.json: a[2]: expected an integer, got null");
    expect(pi2_jr_int_val(&r, NULL, "v", "k", 0, 9, &x), &err, PI2_ENOTFOUND, "f.json: v.k: required key is missing");

    assert_int_equal(pi2_jr_real(&r, o, "", "i", 0, 7, 0, &d), 0); /* an integer is a number */
    assert_true(d == 7.0);
    expect(pi2_jr_real(&r, o, "", "z", 0, 1, PI2_JR_LO_OPEN, &d), &err, PI2_ERANGE,
           "f.json: z: 0 is out of range (0, 1]");
    expect(pi2_jr_real(&r, o, "", "one", 0, 1, PI2_JR_HI_OPEN, &d), &err, PI2_ERANGE,
           "f.json: one: 1 is out of range [0, 1)");
    expect(pi2_jr_real(&r, o, "", "z", 0, DBL_MAX, PI2_JR_LO_OPEN, &d), &err, PI2_ERANGE,
           "f.json: z: 0 is out of range (must be > 0)");
    expect(pi2_jr_real(&r, o, "", "s", 0, 1, 0, &d), &err, PI2_EFORMAT,
           "f.json: s: expected a finite number, got a string");
    expect(pi2_jr_real(&r, o, "", "n", 0, 1, 0, &d), &err, PI2_EFORMAT,
           "f.json: n: expected a finite number, got null");
    assert_int_equal(pi2_jr_real(&r, o, "", "n", 0, 1, PI2_JR_NULLABLE, &d), 0);
    assert_true(isnan(d));
    expect(pi2_jr_real(&r, o, "", "x", 0, 1, 0, &d), &err, PI2_ENOTFOUND, "f.json: x: required key is missing");
    assert_int_equal(pi2_jr_real(&r, o, "", "x", 0, 1, PI2_JR_OPTIONAL, &d), 0);
    assert_true(isnan(d));
    expect(pi2_jr_real_val(&r, json_object_get(o, "s"), "p[1]", NULL, 0, 1, 0, &d), &err, PI2_EFORMAT,
           "f.json: p[1]: expected a finite number, got a string");
    assert_int_equal(pi2_jr_float(&r, o, "", "r", -FLT_MAX, FLT_MAX, &f), 0);
    assert_true(f == 0.5f);
    json_decref(o);
}

static void test_strings(void **state)
{
    (void)state;
    pi2_err err = { 0 };
    pi2_jr r = { "f.json", &err };
    json_t *o = parse("{\"b\": true, \"s\": \"q8\", \"e\": \"\", \"c\": \"a\\tb\", \"z\": \"a\\u0000b\", \"i\": 1}");
    bool b;
    const char *s;
    char dst[4];
    int k;
    assert_int_equal(pi2_jr_bool(&r, o, "", "b", &b), 0);
    assert_true(b);
    expect(pi2_jr_bool(&r, o, "", "i", &b), &err, PI2_EFORMAT, "f.json: i: expected true or false, got an integer");
    assert_int_equal(pi2_jr_bool_or(&r, o, "", "b", false, &b), 0);
    assert_true(b);
    assert_int_equal(pi2_jr_bool_or(&r, o, "", "none", true, &b), 0); /* absent: the default */
    assert_true(b);
    expect(pi2_jr_bool_or(&r, o, "", "i", true, &b), &err, PI2_EFORMAT,
           "f.json: i: expected true or false, got an integer");
    assert_int_equal(pi2_jr_str(&r, o, "", "s", 3, &s), 0);
    assert_string_equal(s, "q8");
    expect(pi2_jr_str(&r, o, "", "s", 2, &s), &err, PI2_ERANGE, "f.json: s: string of 2 bytes, at most 1 allowed");
    expect(pi2_jr_str(&r, o, "", "z", 9, &s), &err, PI2_EFORMAT, "f.json: z: string holds a NUL byte");
    expect(pi2_jr_str(&r, o, "", "i", 9, &s), &err, PI2_EFORMAT, "f.json: i: expected a string, got an integer");
    assert_int_equal(pi2_jr_text(&r, o, "", "s", dst, sizeof dst), 0);
    assert_string_equal(dst, "q8");
    expect(pi2_jr_text(&r, o, "", "e", dst, sizeof dst), &err, PI2_EFORMAT, "f.json: e: empty string");
    expect(pi2_jr_text(&r, o, "", "c", dst, sizeof dst), &err, PI2_EFORMAT,
           "f.json: c: string holds a control character");
    static const char *const names[] = { "q4", NULL, "q8" };
    assert_int_equal(pi2_jr_enum(&r, o, "", "s", names, 3, "q4 or q8", &k), 0);
    assert_int_equal(k, 2);
    expect(pi2_jr_enum(&r, o, "", "c", names, 3, "q4 or q8", &k), &err, PI2_EUNSUPPORTED,
           "f.json: c: unknown value \"a?b\" (expected q4 or q8)");
    json_decref(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_keys_and_containers),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
