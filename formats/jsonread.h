/* pi2 strict JSON reader: reads one member of a parsed jansson object with
 * its type and range checked, for every JSON file pi2 reads (manifest.json
 * and its bundle object, hardware profiles, plans and calibrations, HF
 * config.json, tokenizer.json, safetensors headers).
 *
 * Every failure sets one line in r->err and returns its code:
 *
 *     <file>: <path>: <problem>
 *
 * where <path> is "<w>.<k>" ("<w>" or "<k>" alone when the other is empty,
 * "top level" when both are): w names the object being read the way a
 * reader would write it ("", "config", "tensors[3]", "storage.random[0]"),
 * k the member. Untrusted text is shown through pi2_jr_clean.
 *
 * Codes: PI2_ENOTFOUND for a missing required member (PI2_EFORMAT when it is
 * found missing by pi2_jr_keys with all_required), PI2_EFORMAT for a wrong
 * type, a NUL or control byte, an unknown member; PI2_ERANGE for a value or
 * count out of range; PI2_EUNSUPPORTED for an enum name not in the list.
 *
 * Nothing is allocated: strings returned point into the jansson tree and live
 * as long as it. Only the JSON modules include this header. */
#ifndef PI2_JSONREAD_H
#define PI2_JSONREAD_H

#include "formats/common.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pi2_jr {
    const char *file; /* names the document in messages (a path or "manifest") */
    pi2_err *err;
} pi2_jr;

/* Sets "<file>: <path>: <fmt...>" (see above) and returns code. */
int pi2_jr_fail(const pi2_jr *r, int code, const char *w, const char *k, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* A printable one-line copy of untrusted text s into buf[cap] (bytes outside
 * 0x20..0x7e become '?', a cut copy ends in "..."); returns buf. */
const char *pi2_jr_clean(const char *s, char *buf, size_t cap);

/* "w.k" (or the one that is not empty) into buf[cap]; returns buf. */
const char *pi2_jr_path(char *buf, size_t cap, const char *w, const char *k);

/* Every member of o is one of keys[n] ("unknown key" otherwise); with
 * all_required, each of keys[n] is also present (PI2_EFORMAT). */
int pi2_jr_keys(const pi2_jr *r, json_t *o, const char *w, const char *const *keys, size_t n, bool all_required);
#define PI2_JR_KEYS(r, o, w, keys, all) pi2_jr_keys((r), (o), (w), (keys), sizeof(keys) / sizeof((keys)[0]), (all))

/* Member k, which must be present. */
int pi2_jr_need(const pi2_jr *r, json_t *o, const char *w, const char *k, json_t **v);

/* An object; with nullable, JSON null gives *out = NULL. */
int pi2_jr_obj(const pi2_jr *r, json_t *o, const char *w, const char *k, bool nullable, json_t **out);

/* Element i of array arr, which must be an object; w names the element
 * ("tensors[3]"). */
int pi2_jr_elem_obj(const pi2_jr *r, json_t *arr, size_t i, const char *w, json_t **out);

/* An array of at most max entries; *n gets its size. */
int pi2_jr_arr(const pi2_jr *r, json_t *o, const char *w, const char *k, size_t max, json_t **out, size_t *n);

/* An integer in [lo, hi]; the message shows "(must be >= lo)" when hi is
 * INT64_MAX. The i32, u32 and u64 forms narrow a range that fits them.
 * pi2_jr_int_val checks a value already fetched (v NULL when missing), e.g.
 * an array element or an object member met while iterating. */
int pi2_jr_int(const pi2_jr *r, json_t *o, const char *w, const char *k, long long lo, long long hi, long long *out);
int pi2_jr_int_val(const pi2_jr *r, json_t *v, const char *w, const char *k, long long lo, long long hi,
                   long long *out);
int pi2_jr_i32(const pi2_jr *r, json_t *o, const char *w, const char *k, long long lo, long long hi, int *out);
int pi2_jr_u32(const pi2_jr *r, json_t *o, const char *w, const char *k, uint32_t lo, uint32_t hi, uint32_t *out);
int pi2_jr_u64(const pi2_jr *r, json_t *o, const char *w, const char *k, long long hi, uint64_t *out);

/* Flags of pi2_jr_real. */
enum {
    PI2_JR_LO_OPEN = 1,  /* lo itself is out of range */
    PI2_JR_HI_OPEN = 2,  /* hi itself is out of range */
    PI2_JR_NULLABLE = 4, /* JSON null reads as NaN */
    PI2_JR_OPTIONAL = 8, /* a missing member reads as NaN */
};

/* A finite number (integer or real) in [lo, hi], either bound open by the
 * flags. The message shows "(must be > lo)" or "(must be >= lo)" when hi is
 * DBL_MAX or FLT_MAX. pi2_jr_real_val checks a value already fetched (v NULL
 * when missing), e.g. an array element with w "k[i]" and k NULL. */
int pi2_jr_real(const pi2_jr *r, json_t *o, const char *w, const char *k, double lo, double hi, unsigned flags,
                double *out);
int pi2_jr_real_val(const pi2_jr *r, json_t *v, const char *w, const char *k, double lo, double hi, unsigned flags,
                    double *out);

/* A number in the closed [lo, hi] (within the float range), as a float. */
int pi2_jr_float(const pi2_jr *r, json_t *o, const char *w, const char *k, double lo, double hi, float *out);

/* true or false. pi2_jr_bool_or reads an absent member or JSON null as def. */
int pi2_jr_bool(const pi2_jr *r, json_t *o, const char *w, const char *k, bool *out);
int pi2_jr_bool_or(const pi2_jr *r, json_t *o, const char *w, const char *k, bool def, bool *out);

/* A string shorter than cap bytes, without NUL bytes. */
int pi2_jr_str(const pi2_jr *r, json_t *o, const char *w, const char *k, size_t cap, const char **out);

/* Free text copied into dst[cap]: 1..cap-1 bytes, no control characters. */
int pi2_jr_text(const pi2_jr *r, json_t *o, const char *w, const char *k, char *dst, size_t cap);

/* A string that is one of names[n] (NULL entries never match): *out gets its
 * index. choices spells the accepted names for the message ("q4 or q8"). */
int pi2_jr_enum(const pi2_jr *r, json_t *o, const char *w, const char *k, const char *const *names, size_t n,
                const char *choices, int *out);

#endif
