/* Tokenizer from a Hugging Face tokenizer.json (BPE model).
 *
 * Supported, with the semantics of the HF `tokenizers` library:
 *   normalizer:    null, Sequence, Prepend, Replace (String pattern);
 *                  any other normalizer is PI2_EUNSUPPORTED at load.
 *   pre_tokenizer: null, Metaspace (replacement, prepend_scheme
 *                  always|first|never, split), Sequence of those.
 *   model:         BPE; merges as "a b" strings or ["a","b"] pairs, applied
 *                  by rank; byte_fallback (<0xXX> tokens); unk_token with
 *                  fuse_unk; ignore_merges.
 *   added_tokens:  matched in the raw text before normalization (longest
 *                  match first), never split by BPE.
 *   decoder:       Sequence, Replace (String), ByteFallback, Fuse, Strip,
 *                  Metaspace.
 * Encoding does not add BOS/EOS: callers prepend pi2_tok_bos() as the model
 * wants (HF's post_processor is not applied).
 *
 * Details that follow HF and matter to callers:
 *   - Added tokens with "normalized": true (as in the tinystories files) are,
 *     as in HF, matched in the normalized text against their normalized form
 *     (e.g. "▁<|end_story|>" under a Prepend "▁" normalizer); those with
 *     "normalized": false are matched in the raw text. lstrip/rstrip are
 *     honoured; single_word is PI2_EUNSUPPORTED at load.
 *   - The normalizer runs separately on each piece between added tokens, so
 *     a Prepend "▁" applies after every such token (HF does the same).
 *   - An added token already in the model vocab must carry its vocab id; one
 *     outside it must carry the next free id (vocab size, then +1 ...), as HF
 *     assigns them; otherwise PI2_EFORMAT. Vocab ids must be exactly
 *     0..n-1 (dense, no duplicates). Merges naming a token missing from the
 *     vocab are PI2_EFORMAT (HF refuses them at load too).
 *   - BPE dropout, continuing_subword_prefix, end_of_word_suffix, Regex
 *     patterns and models other than BPE are PI2_EUNSUPPORTED.
 *   - Decoding skips ids outside the vocabulary, as HF does. Added tokens
 *     decode to their content, passed through the decoder chain, as in HF
 *     tokenizers up to 0.22 (0.23 decodes "normalized": true added tokens
 *     through their normalized form, e.g. " <|end_story|>" with a leading
 *     space, and then fails to skip them as special: not copied).
 *   - A loaded pi2_tok is read-only: encode/decode/find may run from
 *     several threads at once. A stream borrows its pi2_tok (free the
 *     stream first) and is for one thread.
 *   - bos: the first SpecialToken before the sequence in the post_processor's
 *     TemplateProcessing "single" template (also inside a Sequence of
 *     processors), else "<s>". eos: "</s>", else the special added token
 *     with id bos+1 if its content looks like an end token (starts with
 *     "</" or contains "end"/"eos", any case): tinystories gives bos 1
 *     "<|start_story|>", eos 2 "<|end_story|>".
 *   - Limits (beyond them PI2_ERANGE): file 512 MiB, vocab 4M entries,
 *     merges 8M, added tokens 1M, one piece or pattern 16 KiB, 64 steps per
 *     normalizer/pre_tokenizer/decoder, Sequences nested 8 deep, Strip
 *     start/stop 4096. Duplicate JSON keys anywhere are PI2_EFORMAT.
 *   - The streaming decoder holds a run of byte-fallback tokens until the
 *     run ends (HF decodes a run as a whole: any invalid byte turns every
 *     byte of the run into U+FFFD), and after a Fuse it holds what a later
 *     step may still change (a partial Replace pattern, trailing Strip
 *     characters).
 */
#ifndef PI2_TOKENIZER_H
#define PI2_TOKENIZER_H

#include "formats/common.h"

typedef struct pi2_tok pi2_tok;

/* Load from a tokenizer.json file (or a directory holding one). Caller owns
 * *out (pi2_tok_free). */
int pi2_tok_load(pi2_tok **out, const char *path, pi2_err *err);
/* Load from JSON text; `name` used in messages. */
int pi2_tok_load_mem(pi2_tok **out, const char *json, size_t len, const char *name, pi2_err *err);
/* NULL is a no-op. */
void pi2_tok_free(pi2_tok *t);

int pi2_tok_vocab_size(const pi2_tok *t);
/* Special ids from added tokens / config conventions; -1 when unknown.
 * bos: "<s>" or a token named in the post_processor template; eos: "</s>" or
 * the added special token following bos; callers with a config.json should
 * prefer its ids. */
int pi2_tok_bos(const pi2_tok *t);
int pi2_tok_eos(const pi2_tok *t);
/* Token string as stored in the vocab (e.g. "▁the", "<0x0A>"), NULL if out
 * of range. */
const char *pi2_tok_piece(const pi2_tok *t, int id);
/* Id of an exact piece, or -1. */
int pi2_tok_find(const pi2_tok *t, const char *piece);

/* True when id is a special added token. */
bool pi2_tok_is_special(const pi2_tok *t, int id);
/* Id of the model's unk_token, or -1. */
int pi2_tok_unk(const pi2_tok *t);

/* Encode `len` bytes of UTF-8 text. Sets *ids (caller frees) and *n.
 * Invalid UTF-8 bytes are encoded through byte fallback (or unk).
 * On success *ids is never NULL, even when *n is 0; on failure it is NULL.
 * PI2_ENOTFOUND when a character needs the unk_token and the vocab lacks it. */
int pi2_tok_encode(const pi2_tok *t, const char *text, size_t len, int32_t **ids, size_t *n, pi2_err *err);

/* Decode a whole id sequence to a NUL-terminated UTF-8 string (caller
 * frees), exactly as HF `decode(ids, skip_special_tokens=False)` would.
 * Special added tokens are skipped when skip_special is true. */
int pi2_tok_decode(const pi2_tok *t, const int32_t *ids, size_t n, bool skip_special, char **out, pi2_err *err);

/* The same, also giving the length: the text can hold NUL bytes (from a
 * "<0x00>" byte-fallback token), which a C string would cut short. */
int pi2_tok_decode_len(const pi2_tok *t, const int32_t *ids, size_t n, bool skip_special, char **out, size_t *len,
                       pi2_err *err);

/* Streaming decoder: push ids one at a time, get back the bytes that are now
 * final (complete UTF-8 sequences; a multi-byte character split over
 * byte-fallback tokens is held until complete). The concatenation of all
 * pushes plus the flush equals pi2_tok_decode of the whole sequence. */
typedef struct pi2_tok_stream pi2_tok_stream;
int pi2_tok_stream_create(pi2_tok_stream **out, const pi2_tok *t, bool skip_special, pi2_err *err);
void pi2_tok_stream_free(pi2_tok_stream *s);
/* Returns a pointer to `*len` bytes valid until the next call (not
 * NUL-terminated). */
int pi2_tok_stream_push(pi2_tok_stream *s, int32_t id, const char **bytes, size_t *len, pi2_err *err);
int pi2_tok_stream_flush(pi2_tok_stream *s, const char **bytes, size_t *len, pi2_err *err);
/* The stream continues a sequence whose first tokens were output another
 * way (a prompt printed as given): what the decoder does only at a
 * sequence's start (Strip's leading characters, Metaspace's first-token
 * space, no joining space before the first token) is not done. Call it
 * before the first push; nothing is held from the earlier tokens. */
void pi2_tok_stream_continue(pi2_tok_stream *s);

/* After a flush the stream starts over (ready for a new sequence). */

#endif
