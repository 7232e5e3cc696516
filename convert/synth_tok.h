/* Synthetic tokenizer: a valid Llama-style BPE tokenizer.json built from a
 * fixed English word list, for the model generator (convert/synth.h), the
 * tests and the fuzz seeds. formats/tokenizer.h reads what it writes. */
#ifndef PI2_SYNTH_TOK_H
#define PI2_SYNTH_TOK_H

#include "formats/common.h"

/* Write a synthetic but valid Llama-style BPE tokenizer.json with exactly
 * `vocab_size` tokens (>= 300): <unk>=0, <s>=1, </s>=2, the 256 byte-fallback
 * tokens <0x00>..<0xFF>, the printable ASCII characters and "▁", then merged
 * word pieces built from a fixed English word list (deterministic from
 * `seed`), with Prepend/Replace normalizer and the usual decoder. Atomic.
 * Details: the three specials are special added tokens ("normalized":
 * false); single characters come letters first, so a small vocab still
 * spells words; the first merges spell each of ~330 built-in words as "▁w",
 * "▁wo", ... so with vocab_size >= 1168 every one of them encodes to a single
 * token; filler merges (pieces of at most 16 bytes, "▁" only at the start)
 * follow, random from `seed`; merges are written as "a b" strings, the
 * post_processor is a TemplateProcessing with <s>. Errors: PI2_EINVAL for a
 * size outside 300..4194304, I/O errors from the atomic writer (nothing is
 * left at `path` on failure). */
int pi2_tok_write_synthetic(const char *path, int vocab_size, uint64_t seed, pi2_err *err);
/* The same with n_added (0..1024) more special added tokens after the
 * vocabulary, ids vocab_size .. vocab_size + n_added - 1, listed in
 * "added_tokens" only (as HF writes tokens added to a trained vocabulary,
 * e.g. ChatML's <|im_end|> = 32000, <|im_start|> = 32001 after a Llama
 * vocabulary of 32000). PI2_EINVAL also for an empty or over-64-byte one. */
int pi2_tok_write_synthetic_added(const char *path, int vocab_size, int n_added, const char *const *added,
                                  uint64_t seed, pi2_err *err);

#endif
