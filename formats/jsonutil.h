/* Small helpers shared by the JSON modules (config, tokenizer, manifest,
 * bundle layout). Only those modules include jansson. */
#ifndef PI2_JSONUTIL_H
#define PI2_JSONUTIL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* "an object", "an array", "a string", "an integer", "a real", "a boolean",
 * "null": the JSON type of v as the error messages name it. */
const char *pi2_json_type_name(const json_t *v);

/* Growing text buffer for the JSON writers (kept NUL-terminated); after an
 * allocation failure every call is a no-op and `failed` stays set. */
typedef struct pi2_sbuf {
    char *p;
    size_t len, cap;
    bool failed;
} pi2_sbuf;
void pi2_sb_put(pi2_sbuf *b, const char *s, size_t n);
void pi2_sb_str(pi2_sbuf *b, const char *s);
void pi2_sb_indent(pi2_sbuf *b, int depth); /* two spaces per level */

#endif
