/* safetensors reader (the writer is safetensors_write.c). The contract and
 * the on-disk layout are in safetensors.h; this file explains the why.
 *
 * Reader: the whole file is mapped; the 8-byte length is read through the
 * bounded cursor, the header is parsed by jansson (duplicate keys rejected),
 * every entry is validated on its own, then the entries are sorted by offset
 * and must tile the data buffer exactly, as the reference Rust implementation
 * requires. Names and metadata strings are copied into one arena per file so
 * the JSON tree can be dropped right after parsing. Lookup is an
 * open-addressing hash table over all shards (also how a tensor present in
 * two shards is caught).
 *
 * PyTorch zips (pytorch_model-*.bin, model_{L}.pt) are recognised by their
 * first bytes and parsed by formats/torchzip.c into the same views; the
 * shard then owns the names block it returns. Everything else about shards,
 * lookup and conversion is shared.
 */
#include "formats/safetensors.h"
#include "formats/safetensors_internal.h"
#include "formats/jsonread.h"
#include "formats/torchzip.h"

#include <sys/mman.h>
#include <unistd.h>

#include <assert.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- message helpers ---- */

static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++) {
        if (i == PI2_ST_MAX_DIMS) {
            n += (size_t)snprintf(buf + n, cap - n, ", ...");
            break;
        }
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    }
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

static char *join_alloc(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name), n;
    if (!pi2_add_size(a, b, &n) || !pi2_add_size(n, 2, &n))
        return NULL;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* ---- reader ---- */

typedef struct st_shard {
    char *path;       /* owned; tensors' `file` points here */
    const char *base; /* plain file name inside path */
    pi2_map map;      /* zeroed for in-memory images */
    char *arena;      /* names and metadata strings */
} st_shard;

struct pi2_st {
    st_shard *shards;
    size_t nshards;
    pi2_st_tensor *t;
    size_t n;
    const char **meta; /* key, value pairs in file order */
    size_t nmeta;
    uint32_t *slots; /* tensor index + 1, 0 = empty */
    size_t mask;
};

typedef struct entry {
    const char *name; /* borrowed from the JSON tree */
    pi2_dtype dt;
    int ndim;
    int64_t shape[PI2_ST_MAX_DIMS];
    size_t nelem, nbytes;
    uint64_t begin, end;
} entry;

static int entry_cmp(const void *pa, const void *pb)
{
    const entry *a = pa, *b = pb;
    if (a->begin != b->begin)
        return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end)
        return a->end < b->end ? -1 : 1;
    return strcmp(a->name, b->name);
}

/* Element i of array arr, an integer >= 0; where "tensor 'a': shape[1]". */
static int get_index(const char *path, const char *name, json_t *arr, const char *key, size_t i, uint64_t *out,
                     pi2_err *err)
{
    char where[sizeof(shown) + 48];
    snprintf(where, sizeof where, "tensor '%s': %s[%zu]", show(name).s, key, i);
    long long x;
    int rc = pi2_jr_int_val(&(pi2_jr){path, err}, json_array_get(arr, i), where, NULL, 0, INT64_MAX, &x);
    if (rc == 0)
        *out = (uint64_t)x;
    return rc;
}

/* Validate one header entry on its own (everything but the tiling). */
static int parse_entry(const char *path, const char *name, json_t *v, size_t dlen, entry *e, pi2_err *err)
{
    if (!json_is_object(v))
        return pi2_err_set(err, PI2_EFORMAT, "%s: tensor '%s': entry is not a JSON object", path, show(name).s);
    e->name = name;
    json_t *jdt = json_object_get(v, "dtype"), *jsh = json_object_get(v, "shape"),
           *joff = json_object_get(v, "data_offsets");
    if (!json_is_string(jdt))
        return pi2_err_set(err, PI2_EFORMAT, "%s: tensor '%s': %s", path, show(name).s,
                           jdt ? "dtype is not a string" : "missing dtype");
    if (pi2_dtype_parse(json_string_value(jdt), &e->dt) != 0)
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: tensor '%s': unsupported dtype '%s'", path, show(name).s,
                           show(json_string_value(jdt)).s);
    if (!json_is_array(jsh))
        return pi2_err_set(err, PI2_EFORMAT, "%s: tensor '%s': %s", path, show(name).s,
                           jsh ? "shape is not an array" : "missing shape");
    size_t nd = json_array_size(jsh);
    if (nd > PI2_ST_MAX_DIMS)
        return pi2_err_set(err, PI2_ERANGE, "%s: tensor '%s': too many dims (%zu > %d)", path, show(name).s, nd,
                           PI2_ST_MAX_DIMS);
    e->ndim = (int)nd;
    size_t nelem = 1;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        int rc = get_index(path, name, jsh, "shape", i, &d, err);
        if (rc)
            return rc;
        e->shape[i] = (int64_t)d;
        if (d > SIZE_MAX || !pi2_mul_size(nelem, (size_t)d, &nelem))
            return pi2_err_set(err, PI2_ERANGE, "%s: tensor '%s': element count overflows", path, show(name).s);
    }
    e->nelem = nelem;
    if (!pi2_mul_size(nelem, pi2_dtype_size(e->dt), &e->nbytes))
        return pi2_err_set(err, PI2_ERANGE, "%s: tensor '%s': byte size overflows", path, show(name).s);
    if (!json_is_array(joff) || json_array_size(joff) != 2)
        return pi2_err_set(err, PI2_EFORMAT, "%s: tensor '%s': %s", path, show(name).s,
                           joff ? "data_offsets is not [begin, end] of non-negative integers" : "missing data_offsets");
    int rc = get_index(path, name, joff, "data_offsets", 0, &e->begin, err);
    if (rc == 0)
        rc = get_index(path, name, joff, "data_offsets", 1, &e->end, err);
    if (rc)
        return rc;
    if (e->begin > e->end)
        return pi2_err_set(err, PI2_EFORMAT, "%s: tensor '%s': data_offsets begin %llu > end %llu", path, show(name).s,
                           (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end > dlen)
        return pi2_err_set(err, PI2_EFORMAT, "%s: tensor '%s': data_offsets end %llu is past the data size %zu", path,
                           show(name).s, (unsigned long long)e->end, dlen);
    if (e->end - e->begin != e->nbytes) {
        char sh[256];
        fmt_shape(sh, sizeof sh, e->ndim, e->shape);
        return pi2_err_set(err, PI2_EFORMAT,
                           "%s: tensor '%s': data_offsets span %llu bytes but %s %s needs %zu bytes", path,
                           show(name).s, (unsigned long long)(e->end - e->begin), pi2_dtype_name(e->dt), sh, e->nbytes);
    }
    return 0;
}

/* A PyTorch zip image into shard `sh`: its views and names come whole from
 * torchzip; the shard owns the names. */
static int parse_torch(pi2_st *st, st_shard *sh, const uint8_t *buf, size_t len, pi2_err *err)
{
    pi2_st_tensor *t;
    size_t n;
    int rc = pi2_tz_parse(buf, len, sh->path, &t, &n, &sh->arena, err);
    if (rc != 0)
        return rc;
    if (n > PI2_ST_MAX_TENSORS - st->n) {
        free(t);
        return pi2_err_set(err, PI2_ERANGE, "%s: too many tensors (%zu, limit %u)", sh->path, st->n + n,
                           (unsigned)PI2_ST_MAX_TENSORS);
    }
    pi2_st_tensor *nt = realloc(st->t, (st->n + n ? st->n + n : 1) * sizeof *nt);
    if (!nt) {
        free(t);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", sh->path);
    }
    st->t = nt;
    if (n)
        memcpy(st->t + st->n, t, n * sizeof *t);
    st->n += n;
    free(t);
    return 0;
}

/* The 8-byte header length and the header it announces; the data buffer is
 * what follows. */
static int split_image(const char *path, const uint8_t *buf, size_t len, const uint8_t **hdr, uint64_t *hlen,
                       const uint8_t **data, size_t *dlen, pi2_err *err)
{
    pi2_cursor c = { buf, len };
    if (!pi2_cursor_u64le(&c, hlen))
        return pi2_err_set(err, PI2_EFORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length", path, len);
    if (*hlen > PI2_ST_MAX_HEADER)
        return pi2_err_set(err, PI2_ERANGE, "%s: header length %llu exceeds the limit of %u bytes", path,
                           (unsigned long long)*hlen, (unsigned)PI2_ST_MAX_HEADER);
    if (!pi2_cursor_take(&c, (size_t)*hlen, hdr))
        return pi2_err_set(err, PI2_EFORMAT, "%s: header length %llu runs past the end of the file (%zu bytes left)",
                           path, (unsigned long long)*hlen, c.left);
    *data = c.p;
    *dlen = c.left;
    return 0;
}

/* __metadata__: an object of strings; counts them and adds their bytes to
 * *arena_len. */
static int check_meta(const char *path, json_t *jmeta, size_t *nmeta, size_t *arena_len, pi2_err *err)
{
    if (!json_is_object(jmeta))
        return pi2_err_set(err, PI2_EFORMAT, "%s: __metadata__ is not a JSON object", path);
    const char *k;
    json_t *v;
    json_object_foreach(jmeta, k, v)
    {
        if (!json_is_string(v))
            return pi2_err_set(err, PI2_EFORMAT, "%s: __metadata__ value of '%s' is not a string", path, show(k).s);
        /* sizes are bounded by the header length, itself capped: no overflow */
        *arena_len += strlen(k) + 1 + json_string_length(v) + 1;
        (*nmeta)++;
    }
    return 0;
}

/* Every tensor entry of the header into ents (ntens of them), adding the
 * names' bytes to *arena_len. */
static int parse_entries(const char *path, json_t *root, json_t *jmeta, size_t dlen, entry *ents, size_t ntens,
                         size_t *arena_len, pi2_err *err)
{
    size_t k = 0;
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v)
    {
        if (v == jmeta)
            continue;
        int rc = parse_entry(path, name, v, dlen, &ents[k], err);
        if (rc != 0)
            return rc;
        *arena_len += strlen(name) + 1;
        k++;
    }
    assert(k == ntens);
    (void)ntens;
    return 0;
}

/* Sorted by offset, the entries must tile the data buffer exactly: no
 * overlap, no gap, no trailing bytes. */
static int check_tiling(const char *path, entry *ents, size_t ntens, size_t dlen, pi2_err *err)
{
    qsort(ents, ntens, sizeof *ents, entry_cmp);
    uint64_t pos = 0;
    for (size_t k = 0; k < ntens; k++) {
        const entry *e = &ents[k];
        if (e->begin < pos)
            return pi2_err_set(err, PI2_EFORMAT,
                               "%s: tensor '%s' (bytes %llu..%llu) overlaps tensor '%s' (ends at %llu)", path,
                               show(e->name).s, (unsigned long long)e->begin, (unsigned long long)e->end,
                               show(ents[k - 1].name).s, (unsigned long long)pos);
        if (e->begin > pos)
            return pi2_err_set(err, PI2_EFORMAT, "%s: gap of unused data bytes %llu..%llu before tensor '%s'", path,
                               (unsigned long long)pos, (unsigned long long)e->begin, show(e->name).s);
        pos = e->end;
    }
    if (pos != dlen)
        return pi2_err_set(err, PI2_EFORMAT, "%s: %llu trailing bytes after the last tensor (data is %zu bytes)", path,
                           (unsigned long long)(dlen - pos), dlen);
    return 0;
}

/* The validated header, copied out of the JSON tree: metadata and names
 * into the shard's arena, views appended to st. */
static int copy_out(pi2_st *st, st_shard *sh, json_t *jmeta, const entry *ents, size_t ntens, size_t nmeta,
                    size_t arena_len, const uint8_t *data, pi2_err *err)
{
    sh->arena = malloc(arena_len ? arena_len : 1);
    pi2_st_tensor *nt = realloc(st->t, (st->n + ntens ? st->n + ntens : 1) * sizeof *nt);
    const char **nm = nmeta ? realloc(st->meta, (st->nmeta + nmeta) * 2 * sizeof *nm) : st->meta;
    if (nt)
        st->t = nt;
    if (nm)
        st->meta = nm;
    if (!sh->arena || !nt || (nmeta && !nm))
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", sh->path);
    char *a = sh->arena;
    if (jmeta) {
        const char *mk;
        json_t *v;
        json_object_foreach(jmeta, mk, v)
        {
            size_t kl = strlen(mk) + 1, vl = json_string_length(v);
            memcpy(a, mk, kl);
            st->meta[2 * st->nmeta] = a;
            a += kl;
            memcpy(a, json_string_value(v), vl);
            a[vl] = 0;
            st->meta[2 * st->nmeta + 1] = a;
            a += vl + 1;
            st->nmeta++;
        }
    }
    for (size_t k = 0; k < ntens; k++) {
        const entry *e = &ents[k];
        pi2_st_tensor *t = &st->t[st->n++];
        size_t nl = strlen(e->name) + 1;
        memcpy(a, e->name, nl);
        t->name = a;
        a += nl;
        t->dtype = e->dt;
        t->ndim = e->ndim;
        memset(t->shape, 0, sizeof t->shape);
        memcpy(t->shape, e->shape, (size_t)e->ndim * sizeof e->shape[0]);
        t->nelem = e->nelem;
        t->nbytes = e->nbytes;
        t->data = data + e->begin;
        t->file = sh->path;
    }
    return 0;
}

/* Parse one safetensors image (or PyTorch zip) into shard `sh` (already
 * appended to st), appending its tensors and metadata to st. On failure st
 * may hold a partial shard; the caller closes it. */
static int parse_image(pi2_st *st, st_shard *sh, const uint8_t *buf, size_t len, pi2_err *err)
{
    const char *path = sh->path;
    if (pi2_tz_is_zip(buf, len))
        return parse_torch(st, sh, buf, len, err);
    /* torch.save before 1.6 (or with _use_new_zipfile_serialization=False):
     * a pickle that starts with its magic number as a 10-byte LONG1 */
    static const uint8_t legacy[4] = { 0x80, 0x02, 0x8a, 0x0a };
    if (len >= sizeof legacy && memcmp(buf, legacy, sizeof legacy) == 0)
        return pi2_err_set(err, PI2_EUNSUPPORTED,
                           "%s: legacy PyTorch file (torch.save before 1.6): pi2 reads the zip format and safetensors",
                           path);
    const uint8_t *hdr = NULL, *data = NULL;
    uint64_t hlen = 0;
    size_t dlen = 0;
    int rc = split_image(path, buf, len, &hdr, &hlen, &data, &dlen, err);
    if (rc != 0)
        return rc;

    json_error_t je;
    json_t *root = json_loadb((const char *)hdr, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return pi2_err_set(err, PI2_EFORMAT, "%s: header is not valid JSON: %s (header byte %d)", path,
                           show(je.text).s, je.position);
    entry *ents = NULL;
    if (!json_is_object(root)) {
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: header is not a JSON object", path);
        goto out;
    }
    json_t *jmeta = json_object_get(root, "__metadata__");
    size_t ntens = json_object_size(root) - (jmeta ? 1 : 0);
    if (ntens > PI2_ST_MAX_TENSORS || st->n + ntens > PI2_ST_MAX_TENSORS) {
        rc = pi2_err_set(err, PI2_ERANGE, "%s: too many tensors (%zu, limit %u)", path, st->n + ntens,
                         (unsigned)PI2_ST_MAX_TENSORS);
        goto out;
    }
    size_t nmeta = 0, arena_len = 0;
    if (jmeta && (rc = check_meta(path, jmeta, &nmeta, &arena_len, err)) != 0)
        goto out;
    ents = pi2_calloc_array(ntens, sizeof *ents);
    if (!ents) {
        rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for %zu tensors", path, ntens);
        goto out;
    }
    if ((rc = parse_entries(path, root, jmeta, dlen, ents, ntens, &arena_len, err)) != 0 ||
        (rc = check_tiling(path, ents, ntens, dlen, err)) != 0)
        goto out;
    rc = copy_out(st, sh, jmeta, ents, ntens, nmeta, arena_len, data, err);
out:
    free(ents);
    json_decref(root);
    return rc;
}

static uint64_t hash_name(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Build the name table; a name seen twice (only possible across shards, as
 * one header rejects duplicate keys) is an error. */
static int build_hash(pi2_st *st, pi2_err *err)
{
    size_t cap = 16;
    while (cap < 2 * st->n)
        cap *= 2;
    st->slots = calloc(cap, sizeof *st->slots);
    if (!st->slots)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the tensor table",
                           st->nshards ? st->shards[0].path : "safetensors");
    st->mask = cap - 1;
    for (size_t i = 0; i < st->n; i++) {
        size_t s = (size_t)hash_name(st->t[i].name) & st->mask;
        while (st->slots[s]) {
            const pi2_st_tensor *o = &st->t[st->slots[s] - 1];
            if (strcmp(o->name, st->t[i].name) == 0)
                return pi2_err_set(err, PI2_EFORMAT, "%s: tensor '%s' is also stored in %s", st->t[i].file,
                                   show(st->t[i].name).s, o->file);
            s = (s + 1) & st->mask;
        }
        st->slots[s] = (uint32_t)(i + 1);
    }
    return 0;
}

static st_shard *add_shard(pi2_st *st, const char *path, pi2_err *err)
{
    st_shard *ns = realloc(st->shards, (st->nshards + 1) * sizeof *ns);
    if (!ns) {
        pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    st->shards = ns;
    st_shard *sh = &ns[st->nshards];
    memset(sh, 0, sizeof *sh);
    sh->path = pi2_strdup(path);
    if (!sh->path) {
        pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    const char *slash = strrchr(sh->path, '/');
    sh->base = slash ? slash + 1 : sh->path;
    st->nshards++;
    return sh;
}

static pi2_st *st_new(void) { return calloc(1, sizeof(pi2_st)); }

void pi2_st_close(pi2_st *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->nshards; i++) {
        pi2_map_close(&st->shards[i].map);
        free(st->shards[i].arena);
        free(st->shards[i].path);
    }
    free(st->shards);
    free(st->t);
    free(st->meta);
    free(st->slots);
    free(st);
}

static int open_file(pi2_st *st, const char *path, pi2_err *err)
{
    st_shard *sh = add_shard(st, path, err);
    if (!sh)
        return PI2_ENOMEM;
    int rc = pi2_map_open(&sh->map, path, err);
    if (rc != 0)
        return rc;
    return parse_image(st, sh, sh->map.data, sh->map.size, err);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The index file's JSON: an object with an object weight_map and, if
 * present, an object metadata. *root is the caller's to release. */
static int load_index(const char *path, json_t **root, json_t **wm, pi2_err *err)
{
    char *text = NULL;
    size_t len;
    int rc = pi2_read_file(path, PI2_ST_MAX_HEADER, &text, &len, err);
    if (rc != 0)
        return rc;
    json_error_t je;
    *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!*root)
        return pi2_err_set(err, PI2_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)", path, show(je.text).s,
                           je.line, je.column);
    *wm = json_object_get(*root, "weight_map");
    json_t *meta = json_object_get(*root, "metadata");
    if (!json_is_object(*root) || !json_is_object(*wm))
        return pi2_err_set(err, PI2_EFORMAT, "%s: %s", path,
                           !json_is_object(*root) ? "not a JSON object"
                           : *wm                  ? "weight_map is not a JSON object"
                                                  : "missing weight_map");
    if (meta && !json_is_object(meta))
        return pi2_err_set(err, PI2_EFORMAT, "%s: metadata is not a JSON object", path);
    return 0;
}

/* The weight_map's shard names, each a plain file name, sorted (repeats
 * kept). shards[] borrows from wm. */
static int index_shards(const char *path, json_t *wm, const char **shards, size_t *ns, pi2_err *err)
{
    *ns = 0;
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v)
    {
        const char *s = json_string_value(v);
        if (!s)
            return pi2_err_set(err, PI2_EFORMAT, "%s: weight_map entry '%s' is not a string", path, show(name).s);
        if (!plain_name(s))
            return pi2_err_set(err, PI2_EFORMAT, "%s: weight_map entry '%s': shard '%s' is not a plain file name",
                               path, show(name).s, show(s).s);
        shards[(*ns)++] = s;
    }
    qsort(shards, *ns, sizeof *shards, cmp_str);
    return 0;
}

/* Each distinct shard of the sorted list, opened from the index's folder. */
static int open_shards(pi2_st *st, const char *path, const char *const *shards, size_t ns, pi2_err *err)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : pi2_strdup(".");
    if (!dir)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    int rc = 0;
    for (size_t i = 0; i < ns && rc == 0; i++) {
        if (i > 0 && strcmp(shards[i], shards[i - 1]) == 0)
            continue;
        char *spath = join_alloc(dir, shards[i]);
        rc = spath ? open_file(st, spath, err) : pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
        free(spath);
    }
    free(dir);
    return rc;
}

/* Every weight_map entry names a tensor stored in the shard it names. */
static int check_weight_map(const pi2_st *st, const char *path, json_t *wm, pi2_err *err)
{
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v)
    {
        const char *s = json_string_value(v);
        const pi2_st_tensor *t = pi2_st_find(st, name);
        if (!t)
            return pi2_err_set(err, PI2_EFORMAT, "%s: tensor '%s' is listed in weight_map but absent from shard '%s'",
                               path, show(name).s, show(s).s);
        const char *tb = strrchr(t->file, '/');
        tb = tb ? tb + 1 : t->file;
        if (strcmp(tb, s) != 0)
            return pi2_err_set(err, PI2_EFORMAT, "%s: tensor '%s' is mapped to shard '%s' but stored in '%s'", path,
                               show(name).s, show(s).s, show(tb).s);
    }
    return 0;
}

static int open_index(pi2_st *st, const char *path, pi2_err *err)
{
    json_t *root = NULL, *wm = NULL;
    const char **shards = NULL;
    int rc = load_index(path, &root, &wm, err);
    if (rc != 0)
        goto out;
    size_t nwm = json_object_size(wm), ns;
    if (nwm == 0 || nwm > PI2_ST_MAX_TENSORS) {
        rc = pi2_err_set(err, nwm ? PI2_ERANGE : PI2_EFORMAT, "%s: weight_map has %zu entries (need 1..%u)", path, nwm,
                         (unsigned)PI2_ST_MAX_TENSORS);
        goto out;
    }
    shards = pi2_malloc_array(nwm, sizeof *shards);
    if (!shards) {
        rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    if ((rc = index_shards(path, wm, shards, &ns, err)) == 0 && (rc = open_shards(st, path, shards, ns, err)) == 0 &&
        (rc = build_hash(st, err)) == 0)
        rc = check_weight_map(st, path, wm, err);
out:
    free(shards);
    json_decref(root);
    return rc;
}

static bool is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

int pi2_st_open(pi2_st **out, const char *path, pi2_err *err)
{
    if (!out)
        return pi2_err_set(err, PI2_EINVAL, "pi2_st_open: NULL output");
    *out = NULL;
    if (!path)
        return pi2_err_set(err, PI2_EINVAL, "pi2_st_open: NULL path");
    pi2_st *st = st_new();
    if (!st)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    int rc;
    if (pi2_is_dir(path)) {
        /* in this order: the first present is read */
        static const char *const files[] = { "model.safetensors.index.json", "model.safetensors",
                                             "pytorch_model.bin.index.json", "pytorch_model.bin" };
        char *f = NULL;
        bool found = false;
        for (size_t i = 0; i < sizeof files / sizeof files[0] && !found; i++) {
            free(f);
            if (!(f = join_alloc(path, files[i])))
                break;
            found = is_file(f);
        }
        if (!f)
            rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
        else if (!found)
            rc = pi2_err_set(err, PI2_ENOTFOUND,
                             "%s: directory holds none of model.safetensors.index.json, model.safetensors, "
                             "pytorch_model.bin.index.json, pytorch_model.bin",
                             path);
        else
            rc = ends_with(f, ".json") ? open_index(st, f, err) : open_file(st, f, err);
        free(f);
        /* open_index builds the table itself (it needs it to check the map) */
        if (rc == 0 && !st->slots)
            rc = build_hash(st, err);
    } else if (ends_with(path, ".json")) {
        rc = open_index(st, path, err);
    } else {
        rc = open_file(st, path, err);
        if (rc == 0)
            rc = build_hash(st, err);
    }
    if (rc != 0) {
        pi2_st_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

int pi2_st_open_buffer(pi2_st **out, const void *buf, size_t len, const char *name, pi2_err *err)
{
    if (!name)
        name = "<buffer>";
    if (!out)
        return pi2_err_set(err, PI2_EINVAL, "%s: NULL output", name);
    *out = NULL;
    if (!buf && len)
        return pi2_err_set(err, PI2_EINVAL, "%s: NULL buffer", name);
    pi2_st *st = st_new();
    if (!st)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", name);
    st_shard *sh = add_shard(st, name, err);
    int rc = sh ? parse_image(st, sh, buf, len, err) : PI2_ENOMEM;
    if (rc == 0)
        rc = build_hash(st, err);
    if (rc != 0) {
        pi2_st_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

size_t pi2_st_count(const pi2_st *st) { return st ? st->n : 0; }

const pi2_st_tensor *pi2_st_at(const pi2_st *st, size_t i) { return st && i < st->n ? &st->t[i] : NULL; }

const pi2_st_tensor *pi2_st_find(const pi2_st *st, const char *name)
{
    if (!st || !name || !st->slots)
        return NULL;
    size_t s = (size_t)hash_name(name) & st->mask;
    while (st->slots[s]) {
        const pi2_st_tensor *t = &st->t[st->slots[s] - 1];
        if (strcmp(t->name, name) == 0)
            return t;
        s = (s + 1) & st->mask;
    }
    return NULL;
}

const char *pi2_st_metadata(const pi2_st *st, const char *key)
{
    if (!st || !key)
        return NULL;
    for (size_t i = 0; i < st->nmeta; i++)
        if (strcmp(st->meta[2 * i], key) == 0)
            return st->meta[2 * i + 1];
    return NULL;
}

/* Little-endian loads through bytes: the data may be unaligned, and this
 * stays correct on any host. */
static inline uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

float pi2_st_get_f32(const pi2_st_tensor *t, size_t i)
{
    assert(t && i < t->nelem);
    const uint8_t *p = (const uint8_t *)t->data + i * pi2_dtype_size(t->dtype);
    switch (t->dtype) {
    case PI2_DT_F32: {
        union { uint32_t u; float f; } v = { .u = ld32(p) };
        return v.f;
    }
    case PI2_DT_F16: return pi2_f16_to_f32(ld16(p));
    case PI2_DT_BF16: return pi2_bf16_to_f32(ld16(p));
    case PI2_DT_I8: return (float)(int8_t)p[0];
    case PI2_DT_U8: return (float)p[0];
    case PI2_DT_I32: return (float)(int32_t)ld32(p);
    case PI2_DT_I64: return (float)(int64_t)((uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32);
    }
    return 0.0f;
}

int pi2_st_to_f32(const pi2_st_tensor *t, float *out, size_t n, pi2_err *err)
{
    if (!t || (!out && n))
        return pi2_err_set(err, PI2_EINVAL, "pi2_st_to_f32: NULL argument");
    if (n != t->nelem)
        return pi2_err_set(err, PI2_EINVAL, "%s: tensor '%s' has %zu elements, destination holds %zu", t->file,
                           show(t->name).s, t->nelem, n);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (t->dtype == PI2_DT_F32) {
        if (n)
            memcpy(out, t->data, n * sizeof *out);
        return 0;
    }
#endif
    for (size_t i = 0; i < n; i++)
        out[i] = pi2_st_get_f32(t, i);
    return 0;
}

int pi2_st_expect_shape(const pi2_st_tensor *t, int ndim, const int64_t *shape, pi2_err *err)
{
    if (!t)
        return pi2_err_set(err, PI2_EINVAL, "pi2_st_expect_shape: NULL tensor");
    bool same = ndim == t->ndim && (ndim == 0 || shape);
    for (int i = 0; same && i < ndim; i++)
        same = shape[i] == t->shape[i];
    if (same)
        return 0;
    char have[256], want[256];
    fmt_shape(have, sizeof have, t->ndim, t->shape);
    if (shape && ndim >= 0)
        fmt_shape(want, sizeof want, ndim, shape);
    else
        snprintf(want, sizeof want, "(%d dims)", ndim);
    return pi2_err_set(err, PI2_ESHAPE, "%s: tensor '%s' has shape %s, expected %s", t->file, show(t->name).s, have,
                       want);
}

void pi2_st_release(const pi2_st_tensor *t)
{
    if (!t || t->nbytes < (1u << 20))
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)t->data + page - 1) & ~(page - 1);
    uintptr_t b = ((uintptr_t)t->data + t->nbytes) & ~(page - 1);
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED); /* advisory: failure is harmless */
}
