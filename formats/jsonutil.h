/* Small helpers shared by the JSON modules (config, tokenizer, manifest,
 * bundle layout). Only those modules include jansson. */
#ifndef PI2_JSONUTIL_H
#define PI2_JSONUTIL_H

#include <jansson.h>

/* "an object", "an array", "a string", "an integer", "a real", "a boolean",
 * "null": the JSON type of v as the error messages name it. */
const char *pi2_json_type_name(const json_t *v);

#endif
