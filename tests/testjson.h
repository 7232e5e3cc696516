/* JSON helpers for the golden tests (EXPECTED.json, manifests). */
#ifndef PI2_TESTJSON_H
#define PI2_TESTJSON_H

#include "tests/testutil.h"

#include <jansson.h>

/* Parse a JSON file or fail the test naming it. Caller json_decref()s. */
static inline json_t *load_json(const char *path)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        fail_msg("%s: %s", path, je.text);
    return j;
}

/* Integer element i of a JSON array, asserting its type. */
static inline int jint(json_t *a, size_t i)
{
    json_t *v = json_array_get(a, i);
    assert_true(json_is_integer(v));
    return (int)json_integer_value(v);
}

#endif
