/* Fuzz target: tokenizer.json reader (pi2_tok_load_mem); on success, encode
 * a fixed set of strings and a slice of the input taken as text, decode the
 * ids whole and through the streaming decoder (which must agree), and decode
 * ids around the vocabulary's edges. */
#include "formats/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

#include <string.h>

#define TEXT_SLICE 256 /* bytes of the input encoded as text */

static const char *const texts[] = {
    "",
    " ",
    "Once upon a time, there was a little girl named Lily.",
    "<s>hello</s> <|end_story|> <unk>",
    "caf\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x98\x80 \xe4\xb8\xad\xe6\x96\x87",
    "\xff\xfe bad utf-8 \xc3 \x80\xe2\x82",
    "a\nb\tc  d   \r\n",
    "\xe2\x96\x81\xe2\x96\x81\xe2\x96\x81",
};

/* Decode ids whole and streamed; the concatenation of the stream must equal
 * the whole decode (a contract of tokenizer.h). */
static void check_decode(const pi2_tok *t, const int32_t *ids, size_t n, bool skip)
{
    pi2_err err = {0};
    char *whole = NULL;
    size_t wlen = 0;
    int rc = pi2_tok_decode_len(t, ids, n, skip, &whole, &wlen, &err);
    char *plain = NULL;
    if (pi2_tok_decode(t, ids, n, skip, &plain, &err) == 0)
        free(plain);
    pi2_tok_stream *s = NULL;
    if (pi2_tok_stream_create(&s, t, skip, &err) != 0) {
        free(whole);
        return;
    }
    char *acc = malloc(1);
    size_t alen = 0;
    int src = 0;
    for (size_t i = 0; i <= n && acc && src == 0; i++) {
        const char *b = NULL;
        size_t bl = 0;
        src = i < n ? pi2_tok_stream_push(s, ids[i], &b, &bl, &err) : pi2_tok_stream_flush(s, &b, &bl, &err);
        if (src == 0 && bl) {
            char *na = realloc(acc, alen + bl);
            if (!na) {
                free(acc);
                acc = NULL;
                break;
            }
            acc = na;
            memcpy(acc + alen, b, bl);
            alen += bl;
        }
    }
    if (rc == 0 && src == 0 && acc && (alen != wlen || memcmp(acc, whole, wlen) != 0)) {
        fprintf(stderr, "stream decode differs from decode: %zu vs %zu bytes\n", alen, wlen);
        abort();
    }
    free(acc);
    free(whole);
    pi2_tok_stream_free(s);
}

static void encode_decode(const pi2_tok *t, const char *text, size_t len)
{
    pi2_err err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    if (pi2_tok_encode(t, text, len, &ids, &n, &err) != 0)
        return;
    int v = pi2_tok_vocab_size(t);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (v > 0 && ids[i] >= v + (1 << 20)))
            abort(); /* encode only gives ids of the vocab or of added tokens */
    check_decode(t, ids, n, false);
    check_decode(t, ids, n, true);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pi2_tok *t = NULL;
    pi2_err err = {0};
    char *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    if (pi2_tok_load_mem(&t, buf, size, "tokenizer.json", &err) == 0) {
        int v = pi2_tok_vocab_size(t);
        (void)pi2_tok_bos(t);
        (void)pi2_tok_eos(t);
        (void)pi2_tok_unk(t);
        (void)pi2_tok_is_special(t, 0);
        (void)pi2_tok_is_special(t, -1);
        const char *p = pi2_tok_piece(t, 0);
        if (p && pi2_tok_find(t, p) < 0)
            abort();
        (void)pi2_tok_piece(t, v);
        (void)pi2_tok_piece(t, -1);
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
            encode_decode(t, texts[i], strlen(texts[i]));
        /* The input itself as text: its tail (the head is JSON syntax). */
        size_t sl = size < TEXT_SLICE ? size : TEXT_SLICE;
        encode_decode(t, buf + size - sl, sl);
        /* Ids at the vocabulary's edges, and outside it. */
        int32_t edge[] = {0, 1, 2, v - 1, v, v + 1, -1, INT32_MAX, 3, 3, 0};
        check_decode(t, edge, sizeof edge / sizeof edge[0], false);
        check_decode(t, edge, sizeof edge / sizeof edge[0], true);
        pi2_tok_free(t);
    }
    free(buf);
    return 0;
}
