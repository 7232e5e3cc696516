/* PyTorch zip checkpoints (torch.save since 1.6: pytorch_model-*.bin shards,
 * PowerInfer model_{L}.pt predictors): a reader that never executes
 * anything, and a writer for test fixtures.
 *
 * Most callers want pi2_st_open (formats/safetensors.h), which reads these
 * files into the same tensor views as safetensors; this header carries the
 * format, the reader's rules and the writer.
 *
 * File layout, as torch.save writes it (miniz in zip64 mode). "A" is the
 * archive name: torch's file name without its last extension ("model_3" for
 * model_3.pt), or "archive" when saved to a stream. Integers little-endian.
 *   for each member, in order:
 *     local header  30 bytes: "PK\3\4", version needed, flags (bit 3: sizes
 *                   and CRC follow the data; bit 11: UTF-8 name), method 0
 *                   (stored), DOS time, DOS date, CRC-32, sizes (0 when
 *                   bit 3), name length, extra length
 *     name          "A/<member>"
 *     extra         records (u16 id, u16 length, bytes): a zip64 record
 *                   (id 1) when the size or the header offset is >= 4 GiB,
 *                   then "FB" + length + 'Z' bytes so that the data starts
 *                   on a multiple of 64 bytes (PI2_TZ_ALIGN)
 *     data          the member's bytes, stored
 *     descriptor    when bit 3 and the member is not empty: "PK\7\8",
 *                   CRC-32, compressed and uncompressed size (u32 each,
 *                   u64 each when the local header has a zip64 record)
 *   central directory: per member a 46-byte header ("PK\1\2", versions,
 *                   flags, method, time, date, CRC-32, sizes, name length,
 *                   extra length, comment length, disk, attributes, local
 *                   header offset; sizes and offset 0xffffffff with a zip64
 *                   record in the extra when >= 4 GiB), name, extra, comment
 *   zip64 end of central directory record ("PK\6\6", 56 bytes) and locator
 *                   ("PK\6\7", 20 bytes); torch always writes them
 *   end of central directory record ("PK\5\6", 22 bytes + comment)
 * Members (every name starts with "A/"):
 *   A/data.pkl      pickle of the state dict (below)
 *   A/byteorder     "little" (torch >= 2.1; absent means little)
 *   A/data/<key>    the raw little-endian bytes of storage <key> ("0", ...)
 *   A/version       the format version in decimal, "3\n" (or A/.data/version)
 *   others          (A/.data/serialization_id, A/.format_version, ...) ignored
 * data.pkl is a pickle (protocol 2 as torch.save writes it; 3-5 are read
 * too) of a dict or collections.OrderedDict (a module's state_dict, maybe
 * with its _metadata attribute set by BUILD) mapping names to tensors, each
 *   torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride,
 *                                   requires_grad, backward_hooks[, metadata])
 * or torch._utils._rebuild_parameter(tensor, requires_grad, backward_hooks),
 * where storage is a persistent id (BINPERSID) of the tuple
 *   ('storage', torch.<Type>Storage, key, location, numel)
 * and numel counts elements of the storage's dtype:
 *   FloatStorage F32, HalfStorage F16, BFloat16Storage BF16, CharStorage I8,
 *   ByteStorage U8, IntStorage I32, LongStorage I64.
 *
 * The walker and libarchive (the project's archive library). The walker
 * (zip.c) finds each member's data offset, so tensors point into the
 * mapping, and gives a strict verdict on hostile input: libarchive reports
 * no data offsets, its streaming zip reader finds the end of a bit-3 stored
 * member by scanning the data for a descriptor (all 9 GB of a shard), and
 * its seekable reader takes a member's name from the local header even when
 * the central directory names it otherwise. Once the walker has accepted an
 * image, libarchive's seekable reader reads the same bytes (zip_archive.c):
 * it must list exactly the walker's members with their sizes, and data.pkl
 * is taken from it, CRC-32 checked, and must equal the bytes at the walker's
 * offset. Storages are skipped by seeking, not read. The writer is our own:
 * libarchive cannot emit torch's padding records.
 *
 * Reader rules. Zip: an end record ending exactly at the end of the file
 * (comment included), single disk; a zip64 locator right before it, when
 * present, whose record's values agree with the end record's (or these are
 * saturated: 0xffff / 0xffffffff; saturated without a locator is refused);
 * the central directory exactly between its offset and the zip64 record (or
 * end record), its entries filling it exactly; per entry: not encrypted,
 * name of 1..PI2_TZ_MAX_NAME bytes without NUL, zip64 record present for
 * every saturated field, extra records tiling the extra field, stored
 * entries with equal sizes; the local header before the central directory
 * with the same flags, method, name and (unless bit 3; then 0 or the same)
 * CRC and sizes; the data inside the file and before the central directory;
 * no two members overlapping, no two with the same name; at most
 * PI2_TZ_MAX_MEMBERS members. data.pkl's CRC-32 is checked (by libarchive);
 * the storages' are not (that would read every byte of the file). Torch
 * layer: one archive folder holding every member;
 * A/data.pkl stored and at most PI2_TZ_MAX_PICKLE bytes; A/version (or
 * A/.data/version) stored, 1-20 decimal digits and an optional newline;
 * A/byteorder, if present, "little". Storages: the member A/data/<key>
 * exists, is stored and holds exactly numel * element size bytes; a key
 * referenced twice names the same dtype and numel. Tensors: size and stride
 * tuples of the same length, at most PI2_ST_MAX_DIMS, sizes >= 0, element
 * count and byte size not overflowing; contiguous row-major (the stride of
 * every dim of size > 1 is the product of the sizes after it; empty tensors
 * are always contiguous, as in torch); storage_offset >= 0 and
 * storage_offset + element count <= the storage's numel; requires_grad a
 * bool; backward_hooks and metadata (if present) empty dicts (metadata may
 * also be None). The top level: a dict whose keys are distinct strings
 * without NUL and whose values are tensors, at most PI2_ST_MAX_TENSORS.
 * A tensor's data points into the caller's buffer at the storage's data
 * plus storage_offset elements; nothing is copied.
 *
 * The pickle interpreter knows these opcodes and no others: PROTO (<= 5),
 * FRAME, STOP, MARK, EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE, TUPLE, TUPLE1-3,
 * BININT, BININT1, BININT2, LONG1 (<= 8 bytes), BINUNICODE, SHORT_BINUNICODE,
 * BINUNICODE8 (valid UTF-8, <= PI2_TZ_MAX_STR bytes), BINPUT, LONG_BINPUT,
 * MEMOIZE, BINGET, LONG_BINGET, NONE, NEWTRUE, NEWFALSE, SETITEM, SETITEMS
 * (on dicts), APPEND, APPENDS (on lists), GLOBAL and STACK_GLOBAL (only
 * collections.OrderedDict, torch._utils._rebuild_tensor_v2,
 * torch._utils._rebuild_parameter and the seven storage types above), REDUCE
 * (only of those three callables, with the arguments above; OrderedDict with
 * none), BUILD (only on an OrderedDict made by REDUCE, with a dict state,
 * which is dropped), BINPERSID (only the storage tuple). Python semantics are
 * kept where they matter: MARK hides the stack below it, memo entries are
 * shared references (a dict filled after it was memoized is the same dict).
 * Memo indices must be dense, as every pickler writes them (a PUT index is at
 * most the memo's length). After STOP: no open MARK, exactly one value on
 * the stack, no bytes left in data.pkl.
 *
 * Reader error codes (pi2_tz_parse; messages are one line, "<file>: ..."
 * naming the member and the data.pkl byte offset when the pickle is at fault,
 * the opcode or the global name when one is refused):
 *   PI2_EFORMAT      malformed or lying contents: no end record (not a zip,
 *                    truncated), bad signatures or lengths, records past
 *                    their area, local header disagreeing with the central
 *                    directory, overlapping or duplicate members, members
 *                    outside one folder, data.pkl/version missing, bad
 *                    version or byteorder text, storage member missing or of
 *                    the wrong size, a storage key declared twice
 *                    differently, a tensor past the end of its storage,
 *                    negative size or storage_offset, stride/size length
 *                    mismatch, mistyped arguments, stack underflow (MARK
 *                    included), memo index out of range, odd SETITEMS,
 *                    invalid UTF-8, pickle without STOP or with bytes after
 *                    it, duplicate or NUL-holding keys
 *   PI2_EUNSUPPORTED well-formed but refused: an unknown opcode, a global
 *                    outside the allow-list (os.system, builtins.eval, ...),
 *                    a storage type pi2 has no dtype for (DoubleStorage,
 *                    BoolStorage, ...), REDUCE of anything else or with other
 *                    arguments, BUILD on anything else, a persistent id that
 *                    is not a storage, a compressed or encrypted member that
 *                    must be read, multi-disk zips, pickle protocol > 5,
 *                    big-endian storages, a non-contiguous tensor, backward
 *                    hooks or tensor metadata (conj/neg bits), a top level
 *                    that is not a dict of name -> tensor (a training
 *                    checkpoint that nests the state dict, a list, ...)
 *   PI2_ERANGE       a limit: more than PI2_TZ_MAX_MEMBERS members, data.pkl
 *                    above PI2_TZ_MAX_PICKLE, more than PI2_TZ_MAX_OBJECTS
 *                    pickle objects, PI2_TZ_MAX_MEMO memo entries,
 *                    PI2_TZ_MAX_STACK stack values, PI2_TZ_MAX_MARKS open
 *                    MARKs, a string above PI2_TZ_MAX_STR bytes, an integer
 *                    above 8 bytes, more than PI2_ST_MAX_DIMS dims or
 *                    PI2_ST_MAX_TENSORS tensors, an element count or byte
 *                    size overflowing
 *   PI2_ENOMEM       allocation failed
 * The caps bound the work and memory of a hostile file: every pickle object
 * costs at least one byte of data.pkl and at most 40 bytes of heap (a tensor
 * 88), a memo entry or stack value 16, so the interpreter never holds more
 * than about 250 MB, whatever the file. A genuine state dict spends about 20
 * objects and 8 memo entries per tensor: the caps admit some 200 thousand
 * tensors per file (published shards hold a few thousand).
 */
#ifndef PI2_TORCHZIP_H
#define PI2_TORCHZIP_H

#include "formats/tensor.h"

#define PI2_TZ_ALIGN 64u                          /* storage data alignment in the file (writer) */
#define PI2_TZ_MAX_NAME 4096u                     /* longest zip member name (bytes) */
#define PI2_TZ_MAX_MEMBERS (PI2_ST_MAX_TENSORS + 64u)
#define PI2_TZ_MAX_PICKLE (64u << 20)             /* data.pkl bytes */
#define PI2_TZ_MAX_OBJECTS (1u << 22)             /* tuples, tuple items, dicts, dict items, storages, tensors */
#define PI2_TZ_MAX_MEMO (1u << 22)                /* memo entries */
#define PI2_TZ_MAX_STACK (1u << 16)               /* values on the stack */
#define PI2_TZ_MAX_MARKS 64                       /* open MARKs (nesting) */
#define PI2_TZ_MAX_STR (1u << 16)                 /* bytes of one string */

/* True when buf starts like a zip ("PK\3\4", or "PK\5\6" for an empty one). */
bool pi2_tz_is_zip(const void *buf, size_t len);

/* Parse the PyTorch zip image buf[0..len) (the mapping of `path`, which is
 * used in messages and as each tensor's `file`). On success *tensors holds
 * *count views in the state dict's order and *names their NUL-terminated
 * names; the caller frees both with free(). Views point into buf, which
 * must outlive them. On failure *tensors, *count and *names are zeroed.
 * Errors: see the top of this header. */
int pi2_tz_parse(const void *buf, size_t len, const char *path, pi2_st_tensor **tensors, size_t *count,
                 char **names, pi2_err *err);

/* ---- writer (test fixtures) ----
 * Writes a genuine PyTorch zip state dict, as torch.save(OrderedDict) in
 * torch 2.x lays it out: A/data.pkl (protocol 2, the same globals, memo and
 * persistent ids), A/byteorder, one storage per tensor A/data/0, A/data/1,
 * ... (in declaration order; torch orders them as strings, 0, 1, 10, ...),
 * A/version "3\n", A/.data/serialization_id; every member stored, its data
 * 64-aligned by an "FB" record, followed by a descriptor, CRCs computed,
 * zip64 end records; DOS time fixed at 1980-01-01 so output is reproducible.
 * The archive name A is the final path's file name without its last
 * extension, "archive" when that is empty. The file appears at `path` only
 * after a successful finish (temp file, fsync, rename).
 *
 * Usage: create; add every tensor (name, dtype, shape) in the order their
 * data will follow; write the data bytes in that order with any chunking;
 * finish. Only the names and shapes are held in memory.
 * Errors: PI2_EINVAL for NULL or bad arguments (empty, duplicate or non-UTF-8
 * name, bad dtype, negative dim, > PI2_ST_MAX_DIMS dims, add after the first
 * write, writing past the declared total, finishing short), PI2_ERANGE for
 * size overflow or more than PI2_ST_MAX_TENSORS tensors; I/O errors
 * (PI2_EIO, PI2_ENOSPC). Argument errors in add leave the writer unchanged;
 * a failed write poisons it (later calls return the same code). */
typedef struct pi2_tz_writer pi2_tz_writer;

int pi2_tz_writer_create(pi2_tz_writer **out, const char *path, pi2_err *err);
int pi2_tz_writer_add(pi2_tz_writer *w, const char *name, pi2_dtype dt, int ndim, const int64_t *shape,
                      pi2_err *err);
int pi2_tz_writer_write(pi2_tz_writer *w, const void *data, size_t n, pi2_err *err);
/* All declared bytes must have been written. Frees w on success and failure. */
int pi2_tz_writer_finish(pi2_tz_writer *w, pi2_err *err);
/* Abandon: removes the temporary file. NULL is a no-op. */
void pi2_tz_writer_free(pi2_tz_writer *w);

/* One tensor held in memory: nelem(shape) * dtype size bytes at data. */
typedef struct pi2_tz_item {
    const char *name;
    pi2_dtype dtype;
    int ndim;
    int64_t shape[PI2_ST_MAX_DIMS];
    const void *data;
} pi2_tz_item;

/* create + add + write + finish for n tensors in memory, e.g. a PowerInfer
 * predictor file:
 *   pi2_tz_item it[2] = {
 *       {"fc1.weight", PI2_DT_F16, 2, {rank, hidden}, fc1},
 *       {"fc2.weight", PI2_DT_F16, 2, {n_ff, rank}, fc2}};
 *   pi2_tz_write("pred/model_0.pt", 2, it, &err);
 * For a ReluLLaMA shard, write pytorch_model-0000N-of-0000M.bin files and a
 * pytorch_model.bin.index.json with pi2_st_write_index. */
int pi2_tz_write(const char *path, size_t n, const pi2_tz_item *items, pi2_err *err);

/* A zip laid out as the writer above lays it out (stored, 64-aligned,
 * descriptors, zip64 end records) holding n members named names[i]
 * verbatim (full names, e.g. "A/data.pkl") with contents data[i][0..sizes[i]).
 * For fixtures that need a hand-made data.pkl. PI2_EINVAL for NULL, empty,
 * too long or duplicate names. */
int pi2_tz_write_members(const char *path, size_t n, const char *const *names, const void *const *data,
                         const size_t *sizes, pi2_err *err);

#endif
