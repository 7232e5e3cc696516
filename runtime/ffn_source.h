/* Where the forward pass gets its FFNs computed: the one seam between the
 * forward (runtime/forward.c) and the place the FFN weights live. Not
 * part of the public API.
 *
 * Two sources, chosen when the engine opens: memory (every weight in the
 * mapping or the resident region) and flash (the offloader: hot neurons in
 * memory, the rest read from the bundle as they are needed). The forward
 * calls them in this order for a pass:
 *
 *   begin_pass
 *   for each layer:  layer_begin, [decode] layer_ahead, attention,
 *                    then each FFN of the layer in layer / expert order:
 *                    decode, prefill, or (prefill, an expert no token
 *                    chose) skip
 *   end_pass         (also when a layer failed)
 *
 * The decode of a source computes the FFN bit for bit as the other does
 * (both run runtime/ffn.h's chunk).
 *
 * Row tables. The gate, up and down row pointer tables of each FFN
 * (eng_ffn's eng_mat.rp) belong to the active source. Memory fills them
 * when the engine opens and never changes them. Flash points them, for
 * each neuron, at its hot segment, a cache slot or a prefill window, as
 * the parts arrive (all through ofl_set_rows, runtime/offload/); a pointer
 * is good while its part is held by the running decode step, or while its
 * window is, in prefill; the others are stale. The forward never reads the
 * FFN tables; the chunk (runtime/ffn.h) reads them through the eng_ffn it
 * is given. Why flash does not keep tables of its own: the chunk takes
 * its rows through the eng_ffn, and a second set of tables (three
 * pointers per neuron of every FFN) would be memory the plan must count
 * for no gain. */
#ifndef PI2_FFN_SOURCE_H
#define PI2_FFN_SOURCE_H

#include "runtime/state.h"

typedef struct ffn_source {
    /* A pass of the forward begins (decode: one token). */
    int (*begin_pass)(pi2_engine *e, bool decode, pi2_err *err);
    /* Every pass, before layer l's attention: the weights the source
     * streams that the layer runs are ready (flash: a streamed layer's
     * attention, and decode's predictors) until the next layer_begin. */
    int (*layer_begin)(pi2_engine *e, int l, bool decode, pi2_err *err);
    /* Decode, before layer l's attention, its residual x [hidden]: a
     * chance to start fetching what layer l's FFN will likely need; layer
     * l's predictors are ready when it returns 0. */
    int (*layer_ahead)(pi2_engine *e, int l, const float *x, pi2_err *err);
    /* out [hidden] = FFN f of the token whose input is quantized in the
     * engine's activation buffers (accumulate: out += w * FFN), over the
     * neurons of `mode`: FFN_PRED the n_sel in e->sel, else every neuron. */
    int (*decode)(pi2_engine *e, const eng_ffn *f, uint32_t n_sel, int mode, float *out, bool accumulate, float w,
                  pi2_err *err);
    /* out [T][hidden] = FFN f of T tokens, dense, their input quantized by
     * the forward (accumulate: out += w * FFN). */
    int (*prefill)(pi2_engine *e, const eng_ffn *f, int T, float *out, bool accumulate, float w, pi2_err *err);
    /* Prefill: FFN f is not computed this pass. */
    int (*skip)(pi2_engine *e, const eng_ffn *f, pi2_err *err);
    /* The pass is over. */
    void (*end_pass)(pi2_engine *e, bool decode);
} ffn_source;

/* Every weight in memory (runtime/ffn_memory.c). */
extern const ffn_source eng_ffn_memory;
/* The offloader's (runtime/offload/offload.c). */
extern const ffn_source eng_ffn_flash;

#endif
