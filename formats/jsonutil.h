/* Small helpers shared by the JSON modules (config, tokenizer, manifest,
 * bundle layout). Only those modules include jansson. */
#ifndef PI2_JSONUTIL_H
#define PI2_JSONUTIL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* "an object", "an array", "a string", "an integer", "a real", "a boolean",
 * "null": the JSON type of v as the error messages name it; "nothing" for a
 * NULL v (a member that is not there). */
const char *pi2_json_type_name(const json_t *v);

/* Shortest decimal that reads back as the same double, spelled as Python's
 * repr (and so HF's json.dumps) does (10000.0, 0.95, 1e-05): fixed notation
 * for exponents in [-4, 16), always with a '.' or an exponent so it stays a
 * JSON real. The one real printer of the hand-written JSON emitters. */
void pi2_json_fmt_real(char *buf, size_t cap, double v);

/* json_real(x) for a finite x, JSON null otherwise (NaN and Inf are not JSON). */
json_t *pi2_json_num(double x);

/* The double to print for a float field: the one with the fewest significant
 * digits (at most 9) that reads back as f the way our readers read it (JSON
 * text -> double -> float), so 1e-6f is written 1e-06 by pi2_json_fmt_real
 * rather than 9.99999997e-07. The two steps differ on purpose: the shortest
 * decimal of (double)f would spell out the float's binary error, so a float
 * field first becomes the short double here, which pi2_json_fmt_real (the
 * shortest that round-trips a double) then prints. The one float printer:
 * the manifest's and the config's float fields go through it. */
double pi2_json_float_value(float f);

/* json_real(pi2_json_float_value(f)) for a finite f, JSON null otherwise. */
json_t *pi2_json_float(float f);

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
