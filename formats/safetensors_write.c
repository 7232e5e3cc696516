/* safetensors streaming writer and index writer. The contract and the
 * on-disk layout are in safetensors.h; this file explains the why.
 *
 * Tensors are declared first so the header (with every data offset)
 * can be written before the first data byte; data is then streamed through
 * a pi2_afile, so nothing but the header lives in memory and the target path
 * only ever holds a complete file.
 */
#include "formats/safetensors.h"
#include "formats/safetensors_internal.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct pi2_st_writer {
    char *path;
    pi2_afile *af;
    json_t *tensors; /* name -> entry, in declaration (= data) order */
    json_t *meta;
    uint64_t total, written;
    bool started;
    int failed; /* sticky: a data-stream error poisons the writer */
};

void pi2_st_writer_free(pi2_st_writer *w)
{
    if (!w)
        return;
    pi2_afile_abort(w->af);
    json_decref(w->tensors);
    json_decref(w->meta);
    free(w->path);
    free(w);
}

int pi2_st_writer_create(pi2_st_writer **out, const char *path, pi2_err *err)
{
    if (!out || !path)
        return pi2_err_set(err, PI2_EINVAL, "pi2_st_writer_create: NULL argument");
    *out = NULL;
    pi2_st_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->path = pi2_strdup(path);
        w->tensors = json_object();
        w->meta = json_object();
    }
    if (!w || !w->path || !w->tensors || !w->meta) {
        pi2_st_writer_free(w);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    }
    int rc = pi2_afile_open(&w->af, path, err);
    if (rc != 0) {
        pi2_st_writer_free(w);
        return rc;
    }
    *out = w;
    return 0;
}

static int writer_usable(pi2_st_writer *w, const char *what, pi2_err *err)
{
    if (w->failed)
        return pi2_err_set(err, w->failed, "%s: writer already failed (%s)", w->path, pi2_strerror(w->failed));
    if (w->started)
        return pi2_err_set(err, PI2_EINVAL, "%s: %s after data was written", w->path, what);
    return 0;
}

int pi2_st_writer_add(pi2_st_writer *w, const char *name, pi2_dtype dt, int ndim, const int64_t *shape,
                      pi2_err *err)
{
    if (!w || !name || (ndim > 0 && !shape))
        return pi2_err_set(err, PI2_EINVAL, "pi2_st_writer_add: NULL argument");
    int rc = writer_usable(w, "adding a tensor", err);
    if (rc != 0)
        return rc;
    if (!*name || strcmp(name, "__metadata__") == 0)
        return pi2_err_set(err, PI2_EINVAL, "%s: invalid tensor name '%s'", w->path, show(name).s);
    if (!pi2_dtype_name(dt))
        return pi2_err_set(err, PI2_EINVAL, "%s: tensor '%s': invalid dtype %d", w->path, show(name).s, (int)dt);
    if (ndim < 0 || ndim > PI2_ST_MAX_DIMS)
        return pi2_err_set(err, PI2_EINVAL, "%s: tensor '%s': %d dims (limit %d)", w->path, show(name).s, ndim,
                           PI2_ST_MAX_DIMS);
    if (json_object_size(w->tensors) >= PI2_ST_MAX_TENSORS)
        return pi2_err_set(err, PI2_ERANGE, "%s: too many tensors (limit %u)", w->path, (unsigned)PI2_ST_MAX_TENSORS);
    if (json_object_get(w->tensors, name))
        return pi2_err_set(err, PI2_EINVAL, "%s: duplicate tensor '%s'", w->path, show(name).s);
    size_t nelem = 1, nbytes;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return pi2_err_set(err, PI2_EINVAL, "%s: tensor '%s': negative dim %lld", w->path, show(name).s,
                               (long long)shape[i]);
        if ((uint64_t)shape[i] > SIZE_MAX || !pi2_mul_size(nelem, (size_t)shape[i], &nelem))
            return pi2_err_set(err, PI2_ERANGE, "%s: tensor '%s': element count overflows", w->path, show(name).s);
    }
    uint64_t end;
    if (!pi2_mul_size(nelem, pi2_dtype_size(dt), &nbytes) || __builtin_add_overflow(w->total, (uint64_t)nbytes, &end) ||
        end > (uint64_t)INT64_MAX)
        return pi2_err_set(err, PI2_ERANGE, "%s: tensor '%s': size overflows", w->path, show(name).s);
    json_t *jsh = json_array(), *e = json_object();
    bool ok = jsh && e;
    for (int i = 0; ok && i < ndim; i++)
        ok = json_array_append_new(jsh, json_integer((json_int_t)shape[i])) == 0;
    json_t *off = json_pack("[II]", (json_int_t)w->total, (json_int_t)end);
    ok = ok && off && json_object_set_new(e, "dtype", json_string(pi2_dtype_name(dt))) == 0 &&
         json_object_set(e, "shape", jsh) == 0 && json_object_set(e, "data_offsets", off) == 0;
    json_decref(jsh);
    json_decref(off);
    if (!ok) {
        json_decref(e);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", w->path);
    }
    if (json_object_set_new(w->tensors, name, e) != 0) /* consumes e */
        return pi2_err_set(err, PI2_EINVAL, "%s: tensor name '%s' is not valid UTF-8", w->path, show(name).s);
    w->total = end;
    return 0;
}

int pi2_st_writer_meta(pi2_st_writer *w, const char *key, const char *value, pi2_err *err)
{
    if (!w || !key || !value)
        return pi2_err_set(err, PI2_EINVAL, "pi2_st_writer_meta: NULL argument");
    int rc = writer_usable(w, "adding metadata", err);
    if (rc != 0)
        return rc;
    json_t *v = json_string(value);
    if (!v || json_object_set_new(w->meta, key, v) != 0)
        return pi2_err_set(err, PI2_EINVAL, "%s: metadata '%s' is not valid UTF-8", w->path, show(key).s);
    return 0;
}

static int writer_header(pi2_st_writer *w, pi2_err *err)
{
    w->started = true;
    json_t *root = json_object();
    int rc = 0;
    bool ok = root != NULL;
    if (ok && json_object_size(w->meta))
        ok = json_object_set(root, "__metadata__", w->meta) == 0;
    const char *k;
    json_t *v;
    if (ok) {
        json_object_foreach(w->tensors, k, v)
        {
            if (json_object_set(root, k, v) != 0) {
                ok = false;
                break;
            }
        }
    }
    char *s = ok ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!s)
        return w->failed = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the header", w->path);
    /* Pad with spaces to a multiple of 8 so the data (and every F32/I64
     * tensor whose offset is aligned) starts 8-aligned in a mapping. */
    size_t len = strlen(s), padded = (len + 7) & ~(size_t)7;
    if (padded > PI2_ST_MAX_HEADER) {
        free(s);
        return w->failed = pi2_err_set(err, PI2_ERANGE, "%s: header of %zu bytes exceeds the limit of %u", w->path,
                                       padded, (unsigned)PI2_ST_MAX_HEADER);
    }
    uint8_t *buf = malloc(8 + padded);
    if (!buf) {
        free(s);
        return w->failed = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the header", w->path);
    }
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, s, len);
    memset(buf + 8 + len, ' ', padded - len);
    free(s);
    rc = pi2_afile_write(w->af, buf, 8 + padded, err);
    free(buf);
    if (rc != 0)
        w->failed = rc;
    return rc;
}

int pi2_st_writer_write(pi2_st_writer *w, const void *data, size_t n, pi2_err *err)
{
    if (!w || (!data && n))
        return pi2_err_set(err, PI2_EINVAL, "pi2_st_writer_write: NULL argument");
    if (w->failed)
        return pi2_err_set(err, w->failed, "%s: writer already failed (%s)", w->path, pi2_strerror(w->failed));
    int rc;
    if (!w->started && (rc = writer_header(w, err)) != 0)
        return rc;
    if (n > w->total - w->written)
        return w->failed = pi2_err_set(err, PI2_EINVAL,
                                       "%s: writing %zu bytes at data byte %llu passes the declared total %llu",
                                       w->path, n, (unsigned long long)w->written, (unsigned long long)w->total);
    rc = pi2_afile_write(w->af, data, n, err);
    if (rc != 0)
        return w->failed = rc;
    w->written += n;
    return 0;
}

int pi2_st_writer_finish(pi2_st_writer *w, pi2_err *err)
{
    if (!w)
        return pi2_err_set(err, PI2_EINVAL, "pi2_st_writer_finish: NULL writer");
    int rc = 0;
    if (w->failed)
        rc = pi2_err_set(err, w->failed, "%s: writer already failed (%s)", w->path, pi2_strerror(w->failed));
    if (rc == 0 && !w->started)
        rc = writer_header(w, err);
    if (rc == 0 && w->written != w->total)
        rc = pi2_err_set(err, PI2_EINVAL, "%s: finished after %llu of %llu declared data bytes", w->path,
                         (unsigned long long)w->written, (unsigned long long)w->total);
    if (rc == 0) {
        rc = pi2_afile_commit(w->af, err); /* frees the afile, also on failure */
        w->af = NULL;
    }
    pi2_st_writer_free(w);
    return rc;
}

int pi2_st_write_index(const char *path, size_t n, const char *const *names, const char *const *shard_files,
                       uint64_t total_size, pi2_err *err)
{
    if (!path || (n && (!names || !shard_files)))
        return pi2_err_set(err, PI2_EINVAL, "pi2_st_write_index: NULL argument");
    if (n == 0)
        return pi2_err_set(err, PI2_EINVAL, "%s: an index needs at least one tensor", path);
    if (total_size > (uint64_t)INT64_MAX)
        return pi2_err_set(err, PI2_ERANGE, "%s: total_size %llu too large", path, (unsigned long long)total_size);
    json_t *root = json_object(), *meta = json_object(), *wm = json_object();
    int rc = 0;
    if (!root || !meta || !wm || json_object_set_new(meta, "total_size", json_integer((json_int_t)total_size)) != 0) {
        rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (!names[i] || !plain_name(shard_files[i])) {
            rc = pi2_err_set(err, PI2_EINVAL, "%s: entry %zu: shard '%s' is not a plain file name", path, i,
                             show(shard_files[i]).s);
            goto out;
        }
        if (json_object_get(wm, names[i])) {
            rc = pi2_err_set(err, PI2_EINVAL, "%s: duplicate tensor '%s'", path, show(names[i]).s);
            goto out;
        }
        json_t *s = json_string(shard_files[i]);
        if (!s || json_object_set_new(wm, names[i], s) != 0) {
            rc = pi2_err_set(err, PI2_EINVAL, "%s: entry %zu ('%s') is not valid UTF-8", path, i, show(names[i]).s);
            goto out;
        }
    }
    if (json_object_set(root, "metadata", meta) != 0 || json_object_set(root, "weight_map", wm) != 0) {
        rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    char *s = json_dumps(root, JSON_INDENT(2));
    if (!s) {
        rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    pi2_afile *af;
    rc = pi2_afile_open(&af, path, err);
    if (rc == 0) {
        rc = pi2_afile_write(af, s, strlen(s), err);
        if (rc == 0)
            rc = pi2_afile_write(af, "\n", 1, err);
        if (rc == 0)
            rc = pi2_afile_commit(af, err);
        else
            pi2_afile_abort(af);
    }
    free(s);
out:
    json_decref(root);
    json_decref(meta);
    json_decref(wm);
    return rc;
}
