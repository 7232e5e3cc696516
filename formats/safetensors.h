/* Tensor checkpoint reader (safetensors and PyTorch zip files, mmap, single
 * file or sharded) and streaming safetensors writer.
 *
 * File layout (https://huggingface.co/docs/safetensors):
 *   u64 LE  N            header length in bytes (capped at PI2_ST_MAX_HEADER)
 *   N bytes              UTF-8 JSON object:
 *                          "<name>": {"dtype": "F32"|"F16"|"BF16"|"I8"|"U8"|"I32"|"I64",
 *                                     "shape": [d0, d1, ...],
 *                                     "data_offsets": [begin, end]}
 *                          "__metadata__": {"k": "string", ...}   (optional)
 *   data                 the byte buffer; offsets are relative to its start.
 * Validation is strict: known dtype, non-negative shape whose element count
 * times the dtype size equals end-begin (overflow-checked), begin <= end,
 * offsets inside the file, tensors sorted by offset covering the buffer
 * exactly with no gap or overlap (as the reference implementation requires),
 * no duplicate names, at most PI2_ST_MAX_DIMS dims and PI2_ST_MAX_TENSORS
 * tensors. The header may be padded with trailing spaces (the writer pads it
 * to a multiple of 8 so the data starts 8-aligned); extra keys inside a
 * tensor entry are ignored, as the reference implementation does.
 *
 * Reader error codes (messages are "<file>: <problem>", naming the tensor
 * when one is at fault):
 *   PI2_EFORMAT      malformed or lying contents: file shorter than 8 bytes,
 *                    header length past the end of the file, invalid JSON,
 *                    duplicate names, non-object header/entry/__metadata__,
 *                    missing or mistyped dtype/shape/data_offsets, negative or
 *                    non-integer dims, offsets out of order/out of the file,
 *                    span != nelem*size, gaps, overlaps, trailing bytes; for an
 *                    index: bad JSON, missing weight_map, shard names that are
 *                    not plain file names, mapped tensors absent from their
 *                    shard or stored in another, a tensor in two shards
 *   PI2_ERANGE       a limit is exceeded: header length > PI2_ST_MAX_HEADER,
 *                    > PI2_ST_MAX_DIMS dims, > PI2_ST_MAX_TENSORS tensors,
 *                    element count or byte size overflowing size_t
 *   PI2_EUNSUPPORTED a dtype other than the seven below (F64, BOOL, F8_*, ...)
 *   PI2_ENOTFOUND    missing file or shard, directory with neither file
 *   PI2_EIO/ENOMEM   open/map/allocation failures
 *
 * PyTorch zip files (torch.save since 1.6: pytorch_model-*.bin shards,
 * model_{L}.pt predictors) are read too: a file whose first bytes are a zip
 * signature ("PK\3\4", "PK\5\6") is parsed by formats/torchzip.h into the
 * same views, with data pointing into the mapping (nothing is copied or
 * executed; the pickle is interpreted by a restricted machine). Its layout,
 * rules and error codes (PI2_EFORMAT, PI2_EUNSUPPORTED, PI2_ERANGE as above:
 * malformed or lying, refused, over a limit) are in torchzip.h. Such files
 * have no __metadata__. A legacy torch.save file (a bare pickle, before 1.6)
 * is PI2_EUNSUPPORTED.
 *
 * Sharded models: "model.safetensors.index.json" = {"metadata": {...},
 * "weight_map": {"<tensor>": "<shard file>", ...}}. Every tensor named in the
 * map must be found in its shard; shard names must be plain file names in the
 * same directory; a tensor may not appear in two shards. Shards are opened
 * in file-name order; a tensor stored in a shard but absent from the map is
 * still loaded (it is part of that file); one mapped to shard A but stored in
 * B is an error. The index's own "metadata" is not exposed (pi2_st_metadata
 * reads the shards' __metadata__). "pytorch_model.bin.index.json" has the
 * same shape and is read the same way; its shards (.bin) may be either
 * format, as may those of any index.
 */
#ifndef PI2_SAFETENSORS_H
#define PI2_SAFETENSORS_H

#include "formats/common.h"
#include "formats/tensor.h"

#define PI2_ST_MAX_HEADER (100u * 1024 * 1024) /* as the reference implementation */
typedef struct pi2_st pi2_st;

/* Open `path`: a .safetensors or PyTorch zip file, an index (*.json), or a
 * directory holding one of, looked up in this order, model.safetensors.index.json,
 * model.safetensors, pytorch_model.bin.index.json, pytorch_model.bin (the
 * first present is read; PI2_ENOTFOUND if none is). The files are mapped
 * read-only; on success the caller owns *out (pi2_st_close). */
int pi2_st_open(pi2_st **out, const char *path, pi2_err *err);

/* Parse an in-memory safetensors or PyTorch zip image (not copied: `buf`
 * must outlive the result). `name` is used in messages. For tests and
 * fuzzing. */
int pi2_st_open_buffer(pi2_st **out, const void *buf, size_t len, const char *name, pi2_err *err);

/* NULL is a no-op. */
void pi2_st_close(pi2_st *st);

size_t pi2_st_count(const pi2_st *st);
/* i < count; order: by shard, then by offset (a PyTorch zip's tensors in
 * its state dict's order). */
const pi2_st_tensor *pi2_st_at(const pi2_st *st, size_t i);
/* NULL if absent. */
const pi2_st_tensor *pi2_st_find(const pi2_st *st, const char *name);
/* Value of a __metadata__ key from the first file holding it, or NULL. */
const char *pi2_st_metadata(const pi2_st *st, const char *key);

/* Read element i of a float tensor (F32/F16/BF16) as f32. No bounds check
 * beyond an assert: callers validate shapes first. */
float pi2_st_get_f32(const pi2_st_tensor *t, size_t i);

/* Convert a whole tensor of any dtype to f32 into out[0..n); n must equal
 * t->nelem (PI2_EINVAL otherwise). F32 on a little-endian host is a memcpy. */
int pi2_st_to_f32(const pi2_st_tensor *t, float *out, size_t n, pi2_err *err);

/* Tell the kernel this process is done with the tensor's pages for now
 * (madvise MADV_DONTNEED on the whole pages inside its byte span): they stay
 * in the page cache but leave this process's resident set, so streaming a
 * model larger than memory through the mapping keeps RSS flat. The data stays
 * readable (pages fault back in). Tensors under 1 MiB are left alone. */
void pi2_st_release(const pi2_st_tensor *t);

/* Check a tensor's shape: PI2_ESHAPE with a message naming the tensor and
 * both shapes when it differs. ndim entries of `shape`. */
int pi2_st_expect_shape(const pi2_st_tensor *t, int ndim, const int64_t *shape, pi2_err *err);

/* ---- streaming writer ----
 * Usage: create; add every tensor (name, dtype, shape) in the order their
 * data will follow; then write the data bytes in that order with any chunking;
 * finish (fsync + rename). Nothing but the header is held in memory.
 * The file appears at `path` only after a successful finish. */
typedef struct pi2_st_writer pi2_st_writer;

int pi2_st_writer_create(pi2_st_writer **out, const char *path, pi2_err *err);
int pi2_st_writer_add(pi2_st_writer *w, const char *name, pi2_dtype dt, int ndim, const int64_t *shape,
                      pi2_err *err);
/* Optional __metadata__ entry; before the first write. */
int pi2_st_writer_meta(pi2_st_writer *w, const char *key, const char *value, pi2_err *err);
/* Data bytes; the first call writes the header. Writing past the declared
 * total is PI2_EINVAL. A failed write (past the total, I/O, PI2_ENOSPC)
 * poisons the writer: later writes and finish return the same code. Argument
 * errors in add/meta (duplicate name, bad dtype/dims: PI2_EINVAL; size
 * overflow: PI2_ERANGE) leave the writer unchanged. */
int pi2_st_writer_write(pi2_st_writer *w, const void *data, size_t n, pi2_err *err);
/* All declared bytes must have been written (PI2_EINVAL otherwise, and no
 * file appears at the path). Frees w on success and failure. */
int pi2_st_writer_finish(pi2_st_writer *w, pi2_err *err);
/* Abandon: removes the temporary file. NULL is a no-op. */
void pi2_st_writer_free(pi2_st_writer *w);

/* Write "model.safetensors.index.json" at `path` (atomically): weight_map
 * maps names[i] -> shard_files[i] (plain file names); metadata.total_size. */
int pi2_st_write_index(const char *path, size_t n, const char *const *names, const char *const *shard_files,
                       uint64_t total_size, pi2_err *err);

#endif
