/* pi2 bundle reader: open, check the signature and structure, verify
 * digests, look up neurons, print a summary. See bundle/bundle.h. */
#include "bundle/bundle.h"
#include "formats/pool.h"

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct pi2_bundle {
    char *path;
    pi2_ctr *ctr;
    pi2_manifest *mf;
    pi2_bundle_layout *lay;
    pi2_bundle_sig sig;
    const pi2_ctr_member **ffn_m;  /* [n_ffn] */
    const pi2_ctr_member **perm_m; /* [n_ffn] */
};

pi2_bundle_sig pi2_bundle_sig_status(const pi2_bundle *b) { return b->sig; }
const pi2_manifest *pi2_bundle_manifest(const pi2_bundle *b) { return b->mf; }
const pi2_bundle_layout *pi2_bundle_layout_get(const pi2_bundle *b) { return b->lay; }
const pi2_ctr *pi2_bundle_container(const pi2_bundle *b) { return b->ctr; }

void pi2_bundle_close(pi2_bundle *b)
{
    if (!b)
        return;
    free(b->ffn_m);
    free(b->perm_m);
    pi2_bl_free(b->lay);
    pi2_manifest_free(b->mf);
    pi2_ctr_close(b->ctr);
    free(b->path);
    free(b);
}

const uint32_t *pi2_bundle_perm(const pi2_bundle *b, size_t ffn)
{
    if (!b || ffn >= b->lay->n_ffn)
        return NULL;
    return (const uint32_t *)(const void *)b->perm_m[ffn]->data; /* 4096-aligned member */
}

/* The fingerprint of the key the (not yet trusted) manifest text names as
 * "signer", if it names one other than `raw`: a bounded scan for the key
 * and a fixed-size hex string, nothing parsed. 0 if found and different. */
static int signer_hint(const uint8_t *text, size_t n, const uint8_t raw[PI2_SIGN_PUBKEY_LEN], char want[17])
{
    const uint8_t *p = memmem(text, n, "\"signer\"", 8);
    if (!p)
        return -1;
    size_t i = (size_t)(p - text) + 8;
    while (i < n && (text[i] == ' ' || text[i] == ':'))
        i++;
    if (i >= n || text[i] != '"' || n - i - 1 < 64)
        return -1;
    char hex[PI2_SHA256_HEX_LEN];
    uint8_t sraw[PI2_SIGN_PUBKEY_LEN];
    memcpy(hex, text + i + 1, 64);
    hex[64] = 0;
    if (pi2_sha256_parse_hex(hex, sraw, NULL) != 0 || memcmp(sraw, raw, PI2_SIGN_PUBKEY_LEN) == 0)
        return -1;
    pi2_bundle_key_fingerprint(sraw, want);
    return 0;
}

/* Step 3 of pi2_bundle_open: the signature over the manifest bytes. */
static int check_signature(pi2_bundle *b, const pi2_ctr_member *mj, const pi2_ctr_member *ms,
                           const pi2_bundle_open_opts *o, pi2_err *err)
{
    const char *p = b->path;
    if (!ms) {
        if (!o->allow_unsigned)
            return pi2_err_set(err, PI2_ESIG, "%s: the container is unsigned (no %s)", p, PI2_MF_SIG_NAME);
        b->sig = PI2_BUNDLE_SIG_UNSIGNED;
        return 0;
    }
    if (ms->size != PI2_SIG_LEN)
        return pi2_err_set(err, PI2_ESIG, "%s: %s holds %llu bytes, an Ed25519 signature is %d", p, PI2_MF_SIG_NAME,
                           (unsigned long long)ms->size, PI2_SIG_LEN);
    if (o->skip_signature) {
        b->sig = PI2_BUNDLE_SIG_UNCHECKED;
        return 0;
    }
    if (!o->pubkey)
        return pi2_err_set(err, PI2_EINVAL, "%s: signed container: a public key is needed to verify it", p);
    pi2_err e2 = { 0 };
    int rc = pi2_sign_verify(o->pubkey, mj->data, (size_t)mj->size, ms->data, (size_t)ms->size, &e2);
    if (rc == 0) {
        b->sig = PI2_BUNDLE_SIG_VERIFIED;
        return 0;
    }
    if (rc != PI2_ESIG)
        return pi2_err_set(err, rc, "%s", e2.msg);
    /* Say whether another key signed it: the manifest names its signer. The
     * text is untrusted here, so only a fixed-size hex string is taken. */
    uint8_t raw[PI2_SIGN_PUBKEY_LEN] = { 0 };
    char have[17], want[17] = "";
    if (pi2_sign_key_raw_public(o->pubkey, raw, NULL) == 0)
        pi2_bundle_key_fingerprint(raw, have);
    else
        snprintf(have, sizeof have, "?");
    if (signer_hint(mj->data, (size_t)mj->size, raw, want) != 0)
        want[0] = 0;
    if (want[0])
        return pi2_err_set(err, PI2_ESIG, "%s: %s does not verify: the manifest says another key (%s) signed it, not "
                                          "the given public key (%s); give the signer's public key",
                           p, PI2_MF_SIG_NAME, want, have);
    return pi2_err_set(err, PI2_ESIG, "%s: %s does not verify with key %s: the manifest was modified or the "
                                      "signature is corrupt", p, PI2_MF_SIG_NAME, have);
}

/* Step 5: the section table against the file. */
static int check_sections(pi2_bundle *b, bool has_sig, pi2_err *err)
{
    const pi2_manifest *m = b->mf;
    struct stat st;
    uint64_t fsize = stat(b->path, &st) == 0 ? (uint64_t)st.st_size : UINT64_MAX;
    for (size_t i = 0; i < m->n_sections; i++) {
        const pi2_ctr_section *s = &m->sections[i];
        if (s->offset > fsize || s->size > fsize - s->offset)
            return pi2_err_set(err, PI2_EFORMAT, "%s: section %s (offset %llu, %llu bytes) points outside the file "
                                                 "(%llu bytes)", b->path, s->name, (unsigned long long)s->offset,
                               (unsigned long long)s->size, (unsigned long long)fsize);
        const pi2_ctr_member *c = pi2_ctr_find(b->ctr, s->name);
        if (!c)
            return pi2_err_set(err, PI2_EFORMAT, "%s: section %s is not a member of the file", b->path, s->name);
        if (c->offset != s->offset || c->size != s->size)
            return pi2_err_set(err, PI2_EFORMAT, "%s: section %s: manifest says offset %llu, %llu bytes; the file "
                                                 "holds it at offset %llu, %llu bytes", b->path, s->name,
                               (unsigned long long)s->offset, (unsigned long long)s->size,
                               (unsigned long long)c->offset, (unsigned long long)c->size);
    }
    size_t want = m->n_sections + 1 + (has_sig ? 1 : 0);
    if (pi2_ctr_count(b->ctr) != want) {
        /* name the first member the manifest does not list */
        for (size_t i = 0; i < pi2_ctr_count(b->ctr); i++) {
            const char *n = pi2_ctr_at(b->ctr, i)->name;
            if (strcmp(n, PI2_MF_NAME) != 0 && strcmp(n, PI2_MF_SIG_NAME) != 0 && !pi2_manifest_find_section(m, n))
                return pi2_err_set(err, PI2_EFORMAT, "%s: member %s is not listed in the manifest", b->path, n);
        }
        return pi2_err_set(err, PI2_EFORMAT, "%s: %zu members, the manifest lists %zu", b->path,
                           pi2_ctr_count(b->ctr), want);
    }
    return 0;
}

/* Step 6 and the member lookups the accessors use. */
static int check_ffns(pi2_bundle *b, pi2_err *err)
{
    const pi2_bundle_layout *l = b->lay;
    size_t n = l->n_ffn;
    b->ffn_m = pi2_calloc_array(n ? n : 1, sizeof *b->ffn_m);
    b->perm_m = pi2_calloc_array(n ? n : 1, sizeof *b->perm_m);
    if (!b->ffn_m || !b->perm_m)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", b->path);
    for (size_t i = 0; i < n; i++) {
        const pi2_bl_ffn *f = &l->ffn[i];
        b->ffn_m[i] = pi2_ctr_find(b->ctr, f->ffn);
        b->perm_m[i] = pi2_ctr_find(b->ctr, f->perm);
        const pi2_ctr_section *ps = pi2_manifest_find_section(b->mf, f->perm);
        if (!b->ffn_m[i] || !b->perm_m[i] || !ps)
            return pi2_err_set(err, PI2_EFORMAT, "%s: members of layer %d expert %d missing", b->path, f->layer,
                               f->expert);
        int rc = pi2_ctr_verify_member(b->ctr, b->perm_m[i], ps->sha256, err);
        if (rc)
            return rc;
        char what[300];
        snprintf(what, sizeof what, "%s: %s", b->path, f->perm);
        if ((rc = pi2_bl_check_perm(pi2_bundle_perm(b, i), f->neurons, what, err)))
            return rc;
    }
    return 0;
}

static int not_bundled(const char *path, const pi2_manifest *mf, pi2_err *err)
{
    return pi2_err_set(err, PI2_EFORMAT, "%s: not a bundled model (kind %s); run pi2-bundle on it first", path,
                       pi2_manifest_kind_name(mf->kind));
}

int pi2_bundle_open_failed(const char *path, int rc, pi2_err *err)
{
    pi2_ctr *c = NULL;
    pi2_manifest *mf = NULL;
    pi2_err pe = {0};
    const pi2_ctr_member *mj = pi2_ctr_open(&c, path, &pe) == 0 ? pi2_ctr_find(c, PI2_MF_NAME) : NULL;
    char name[4200];
    snprintf(name, sizeof name, "%s:%s", path, PI2_MF_NAME);
    if (mj && pi2_manifest_parse((const char *)mj->data, (size_t)mj->size, name, &mf, &pe) == 0 &&
        mf->kind != PI2_MF_BUNDLED) {
        pi2_err fresh = {0};
        if (err)
            *err = fresh;
        rc = not_bundled(path, mf, err);
    }
    pi2_manifest_free(mf);
    pi2_ctr_close(c);
    return rc;
}

int pi2_bundle_open(pi2_bundle **out, const char *path, const pi2_bundle_open_opts *o, pi2_err *err)
{
    if (out)
        *out = NULL;
    pi2_bundle_open_opts none = { 0 };
    if (!o)
        o = &none;
    if (!out || !path)
        return pi2_err_set(err, PI2_EINVAL, "bundle: NULL argument");
    pi2_bundle *b = calloc(1, sizeof *b);
    if (!b || !(b->path = pi2_strdup(path))) {
        free(b);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    }
    int rc = o->huge_pages ? pi2_ctr_open_huge(&b->ctr, path, err) : pi2_ctr_open(&b->ctr, path, err);
    const pi2_ctr_member *mj = rc ? NULL : pi2_ctr_find(b->ctr, PI2_MF_NAME);
    const pi2_ctr_member *ms = rc ? NULL : pi2_ctr_find(b->ctr, PI2_MF_SIG_NAME);
    if (rc == 0 && !mj)
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: no %s: not a pi2 model", path, PI2_MF_NAME);
    if (rc == 0)
        rc = check_signature(b, mj, ms, o, err);
    if (rc == 0) {
        char name[4200];
        snprintf(name, sizeof name, "%s:%s", path, PI2_MF_NAME);
        rc = pi2_manifest_parse((const char *)mj->data, (size_t)mj->size, name, &b->mf, err);
        if (rc == 0 && b->mf->kind != PI2_MF_BUNDLED)
            rc = not_bundled(path, b->mf, err);
        if (rc == 0)
            rc = pi2_bundle_layout_parse(b->mf, name, &b->lay, err);
    }
    if (rc == 0 && ms && !b->lay->signer[0])
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: %s present but the manifest names no signer", path, PI2_MF_SIG_NAME);
    if (rc == 0 && !ms && b->lay->signer[0] && !o->allow_unsigned)
        rc = pi2_err_set(err, PI2_ESIG, "%s: the manifest names a signer but %s is missing", path, PI2_MF_SIG_NAME);
    if (rc == 0)
        rc = check_sections(b, ms != NULL, err);
    if (rc == 0)
        rc = check_ffns(b, err);
    if (rc) {
        pi2_bundle_close(b);
        return rc;
    }
    *out = b;
    return 0;
}

/* ---- verification ---- */

/* Drop the pages of a verified member from this process (advisory): a
 * whole-model verify then stays small. Only whole pages inside the member. */
static void drop_pages(const pi2_ctr_member *m)
{
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0 || !m->data)
        return;
    uintptr_t a = ((uintptr_t)m->data + (uintptr_t)ps - 1) / (uintptr_t)ps * (uintptr_t)ps;
    uintptr_t e = ((uintptr_t)m->data + (uintptr_t)m->size) / (uintptr_t)ps * (uintptr_t)ps;
    if (e > a)
        madvise((void *)a, e - a, MADV_DONTNEED);
}

typedef struct vjob {
    const pi2_bundle *b;
    size_t *idx;          /* section indices to check, file order */
    size_t n;
    pthread_mutex_t mu;
    size_t next;
    size_t first_bad;     /* lowest failing position, n if none */
    pi2_err err;
    int rc;
    uint64_t bytes;
    bool drop;
    const uint8_t *copy;  /* hash here instead of the mapping: the file's [0, copy_len) */
    uint64_t copy_len;
    const char *const *skip; /* sections the caller checks apart */
    size_t n_skip;
    size_t window; /* > 0: members hashed in windows of this many bytes, each dropped once hashed */
    int fd;        /* the file, for dropping windows from the page cache (-1: none) */
} vjob;

static bool skipped(const vjob *v, const char *name)
{
    for (size_t i = 0; i < v->n_skip; i++)
        if (strcmp(v->skip[i], name) == 0)
            return true;
    return false;
}

/* Section s checked against its bytes in v->copy. */
static int verify_in_copy(const vjob *v, const pi2_ctr_section *s, pi2_err *e)
{
    if (s->offset > v->copy_len || s->size > v->copy_len - s->offset)
        return pi2_err_set(e, PI2_EFORMAT, "%s: member %s lies past the %llu bytes read", v->b->path, s->name,
                           (unsigned long long)v->copy_len);
    uint8_t dg[PI2_SHA256_LEN];
    int rc = pi2_sha256(v->copy + s->offset, (size_t)s->size, dg, e);
    if (rc)
        return rc;
    if (memcmp(dg, s->sha256, sizeof dg) != 0)
        return pi2_err_set(e, PI2_ESIG,
                           "%s: member %s does not match its SHA-256 in the signed manifest (corrupt or altered file)",
                           v->b->path, s->name);
    return 0;
}

static void verify_worker(void *arg, int tid, int nthreads)
{
    (void)tid;
    (void)nthreads;
    vjob *v = arg;
    for (;;) {
        pthread_mutex_lock(&v->mu);
        size_t i = v->next++;
        bool done = i >= v->n || i > v->first_bad;
        pthread_mutex_unlock(&v->mu);
        if (done)
            break;
        const pi2_ctr_section *s = &v->b->mf->sections[v->idx[i]];
        const pi2_ctr_member *m = v->copy ? NULL : pi2_ctr_find(v->b->ctr, s->name);
        pi2_err e = { 0 };
        int rc = v->copy ? verify_in_copy(v, s, &e)
                 : m     ? pi2_ctr_verify_member_dropping(v->b->ctr, m, s->sha256, v->fd, v->window, &e)
                         : pi2_err_set(&e, PI2_EFORMAT, "%s: section %s missing", v->b->path, s->name);
        if (m && v->drop)
            drop_pages(m);
        pthread_mutex_lock(&v->mu);
        v->bytes += s->size;
        if (rc && i < v->first_bad) {
            v->first_bad = i;
            v->rc = rc;
            v->err = e;
        }
        pthread_mutex_unlock(&v->mu);
    }
}

/* The sections v.b's check covers, hashed on two threads. */
static int verify_run(vjob v, bool resident_only, uint64_t *done, pi2_err *err)
{
    const pi2_bundle *b = v.b;
    const pi2_manifest *m = b->mf;
    v.idx = pi2_malloc_array(m->n_sections ? m->n_sections : 1, sizeof *v.idx);
    if (!v.idx)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", b->path);
    size_t r = 0;
    for (size_t i = 0; i < m->n_sections; i++) {
        bool resident = r < b->lay->n_resident && strcmp(b->lay->resident[r], m->sections[i].name) == 0;
        r += resident;
        if ((resident || !resident_only) && !skipped(&v, m->sections[i].name))
            v.idx[v.n++] = i;
    }
    v.first_bad = v.n;
    pthread_mutex_init(&v.mu, NULL);
    /* sections are taken from a shared counter: any thread may take any */
    pi2_pool *pool = NULL;
    if (sysconf(_SC_NPROCESSORS_ONLN) > 1 && pi2_pool_create(&pool, PI2_BUNDLE_VERIFY_THREADS, NULL) != 0)
        pool = NULL;
    if (pool)
        pi2_pool_run_shared(pool, verify_worker, &v);
    else
        verify_worker(&v, 0, 1);
    pi2_pool_free(pool);
    pthread_mutex_destroy(&v.mu);
    free(v.idx);
    if (done)
        *done = v.bytes;
    if (v.rc)
        return pi2_err_set(err, v.rc, "%s", v.err.msg);
    return 0;
}

int pi2_bundle_verify(const pi2_bundle *b, bool resident_only, uint64_t *done, pi2_err *err)
{
    vjob v = { .b = b, .drop = !resident_only, .fd = -1 };
    return verify_run(v, resident_only, done, err);
}

int pi2_bundle_recheck(const pi2_bundle *b, pi2_err *err)
{
    /* the page cache of the file the mapping shows: by path (a file renamed
     * over it since is another file, whose pages are left alone) */
    int fd = open(pi2_ctr_path(b->ctr), O_RDONLY | O_CLOEXEC);
    vjob v = { .b = b, .window = PI2_BUNDLE_RECHECK_WINDOW, .fd = fd };
    int rc = verify_run(v, true, NULL, err);
    if (fd >= 0)
        close(fd);
    return rc;
}

int pi2_bundle_verify_copy(const pi2_bundle *b, const uint8_t *copy, uint64_t len, pi2_err *err)
{
    vjob v = { .b = b, .copy = copy, .copy_len = len };
    return verify_run(v, true, NULL, err);
}

int pi2_bundle_verify_copy_except(const pi2_bundle *b, const uint8_t *copy, uint64_t len, const char *const *skip,
                                  size_t n_skip, pi2_err *err)
{
    vjob v = { .b = b, .copy = copy, .copy_len = len, .skip = skip, .n_skip = n_skip };
    return verify_run(v, true, NULL, err);
}

int pi2_bundle_get_neuron(const pi2_bundle *b, size_t ffn, uint32_t i, pi2_bundle_neuron *out, pi2_err *err)
{
    if (!b || ffn >= b->lay->n_ffn || i >= b->lay->ffn[ffn].neurons)
        return pi2_err_set(err, PI2_ERANGE, "bundle: neuron %u of FFN %zu out of range", i, ffn);
    const pi2_bl_ffn *f = &b->lay->ffn[ffn];
    pi2_bl_rows at;
    pi2_bl_neuron_rows(f, b->lay->row_bytes, b->lay->pay_bytes, b->lay->two_phase, i, &at);
    for (int k = 0; k < 3; k++) {
        out->payload[k] = b->ffn_m[ffn]->data + at.pay[k];
        out->scales[k] = (const uint16_t *)(const void *)(b->ffn_m[ffn]->data + at.sc[k]); /* even offset: aligned */
    }
    out->original = pi2_bundle_perm(b, ffn)[i];
    return 0;
}

/* ---- inspect ---- */

static void minmax(double x, double *lo, double *hi, double *sum)
{
    if (isnan(x))
        return;
    *lo = x < *lo ? x : *lo;
    *hi = x > *hi ? x : *hi;
    *sum += x;
}

/* A token's text for a one-line report: quoted, quotes, backslashes and
 * control bytes escaped, at most ~40 bytes. */
static void put_piece(FILE *out, const char *p)
{
    fputc('"', out);
    for (int n = 0; p && *p && n < 40; p++, n++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            fprintf(out, "\\x%02x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}

/* End of turn and vocabulary: every id that ends generation with its text
 * from the container's tokenizer, and the padded rows past the tokenizer. */
static void inspect_tokens(const pi2_bundle *b, FILE *out)
{
    const pi2_model_desc *d = &b->mf->config;
    const pi2_ctr_member *tm = pi2_ctr_find(b->ctr, b->mf->tokenizer);
    pi2_tok *tok = NULL;
    pi2_err sub = { 0 };
    if (tm)
        pi2_tok_load_mem(&tok, (const char *)tm->data, (size_t)tm->size, b->mf->tokenizer, &sub);
    fprintf(out, "tokens:     end of turn");
    for (int k = 0; k < d->n_eos; k++) {
        fprintf(out, "%s %d ", k ? "," : "", d->eos_ids[k]);
        put_piece(out, tok ? pi2_tok_piece(tok, d->eos_ids[k]) : NULL);
    }
    if (d->n_eos == 0)
        fprintf(out, " none");
    if (d->bos_id >= 0) {
        fprintf(out, "; BOS %d ", d->bos_id);
        put_piece(out, tok ? pi2_tok_piece(tok, d->bos_id) : NULL);
        fprintf(out, " ends it too");
    }
    if (tok) {
        int n = pi2_tok_vocab_size(tok);
        fprintf(out, "; tokenizer %d of %d ids", n, d->vocab);
        if (n < d->vocab)
            fprintf(out, " (%d padded rows, never output)", d->vocab - n);
    } else {
        fprintf(out, "; tokenizer unreadable: %s", tm ? sub.msg : "no member");
    }
    fputc('\n', out);
    pi2_tok_free(tok);
}

/* The model line of inspect: shape, experts, activation, rope. */
static void inspect_model(const pi2_model_desc *d, FILE *out)
{
    fprintf(out, "model:      %s (%s), hidden %d, ffn %d, %d layers, %d heads (%d kv), vocab %d", pi2_arch_name(d->arch),
            pi2_act_name(d->act), d->hidden, d->n_ff, d->n_layers, d->n_heads, d->n_kv_heads, d->vocab);
    if (pi2_desc_is_moe(d))
        fprintf(out, ", %d experts (top %d)", d->n_experts, d->n_experts_used);
    if (d->act == PI2_ACT_FATRELU)
        fprintf(out, ", gate threshold %g", (double)d->act_param);
    if (d->rope.type != PI2_ROPE_DEFAULT)
        fprintf(out, ", rope %s x%g", pi2_rope_type_name(d->rope.type), d->rope.factor);
    fputc('\n', out);
}

/* The sizes, layout and order lines of inspect. */
static void inspect_layout(const pi2_manifest *m, const pi2_bundle_layout *l, FILE *out)
{
    uint64_t total = 0, hot = 0, cold = 0;
    for (size_t i = 0; i < m->n_sections; i++)
        total += m->sections[i].size;
    double eff = 0, eff_f = 0, hn = 0, nn = 0;
    int n_eff = 0;
    for (size_t i = 0; i < l->n_ffn; i++) {
        hot += l->ffn[i].hot_size;
        cold += l->ffn[i].cold_size;
        hn += l->ffn[i].hot_neurons;
        nn += l->ffn[i].neurons;
        if (!isnan(l->ffn[i].read_eff) && !isnan(l->ffn[i].read_eff_freq)) {
            eff += l->ffn[i].read_eff;
            eff_f += l->ffn[i].read_eff_freq;
            n_eff++;
        }
    }
    fprintf(out, "sizes:      %.2f MB in %zu sections: resident %.2f MB (%zu sections), hot %.2f MB, cold %.2f MB\n",
            total / 1e6, m->n_sections, (total - hot - cold) / 1e6, l->n_resident, hot / 1e6, cold / 1e6);
    const pi2_bl_ffn *f0 = &l->ffn[0];
    fprintf(out, "layout:     %s, io unit %u KiB, %u neurons per group, slot %llu bytes",
            l->two_phase ? "two-phase (gates, then up+down)" : "one-phase (gate|up|down)", l->io_unit / 1024,
            f0->group, (unsigned long long)f0->slot_bytes);
    if (l->two_phase)
        fprintf(out, " (gate part %llu: %llu a neuron, its gate row with the up and down scales; up+down %llu)",
                (unsigned long long)f0->gate_part, (unsigned long long)f0->gate_bytes,
                (unsigned long long)f0->bundle_bytes);
    fprintf(out, "\norder:      %s; hot %.1f%% of neurons (", pi2_bl_order_name(f0->order), nn > 0 ? 100 * hn / nn : 0.0);
    if (isnan(l->hot_share))
        fprintf(out, "frequency >= %g)", l->hot_min_freq);
    else
        fprintf(out, "share %g)", l->hot_share);
    if (n_eff)
        fprintf(out, "; cold read efficiency %.3f (frequency order %.3f)", eff / n_eff, eff_f / n_eff);
    fprintf(out, "\n");
}

/* The predictors line of inspect: count, source, input, stored types,
 * recall and precision ranges. */
static void inspect_predictors(const pi2_manifest *m, FILE *out)
{
    double rlo = INFINITY, rhi = -INFINITY, rs = 0, plo = INFINITY, phi = -INFINITY, ps = 0, pa = 0;
    uint64_t bytes = 0;
    int np = 0, imported = 0, prenorm = 0, ndt[4] = {0};
    for (size_t i = 0; i < m->n_layers; i++) {
        const pi2_mf_layer *e = &m->layers[i];
        if (!e->has_predictor)
            continue;
        np++;
        imported += e->predictor.imported;
        prenorm += e->predictor.input == PI2_PRED_IN_PRENORM;
        ndt[(unsigned)e->predictor.dtype < 4 ? e->predictor.dtype : 0]++;
        minmax(e->predictor.report.recall, &rlo, &rhi, &rs);
        minmax(e->predictor.report.precision, &plo, &phi, &ps);
        pa += isnan(e->predictor.report.pred_active_frac) ? 0 : e->predictor.report.pred_active_frac;
        bytes += e->predictor.report.bytes_q8;
    }
    char stored[32] = "";
    static const pi2_mf_pdtype order[4] = {PI2_MF_PRED_F16, PI2_MF_PRED_F32, PI2_MF_PRED_Q8, PI2_MF_PRED_Q4};
    for (int k = 0; k < 4; k++) /* the dtypes present, "/"-joined: "f16", "f16/f32", "q4" */
        if (ndt[order[k]])
            snprintf(stored + strlen(stored), sizeof stored - strlen(stored), "%s%s", stored[0] ? "/" : "",
                     pi2_mf_pred_dtype_name(order[k]));
    if (np)
        fprintf(out,
                "predictors: %d (%s; reading %s; stored %s), recall %.3f..%.3f (target %g), precision %.3f..%.3f, "
                "predicted active %.1f%%, %.2f MB as q8\n",
                np, imported == np ? "imported" : imported ? "imported/trained" : "trained",
                prenorm == np ? "the pre-norm residual" : prenorm ? "pre-norm / normed" : "the normed FFN input",
                stored, rlo, rhi, m->recall_target, plo, phi, 100 * pa / np,
                bytes / 1e6);
    else
        fprintf(out, "predictors: none (sparsity mode %s)\n", pi2_manifest_mode_name(m->sparsity_mode));
}

/* The profile line of inspect. */
static void inspect_profile(const pi2_manifest *m, FILE *out)
{
    double alo = INFINITY, ahi = -INFINITY, as = 0, hlo = INFINITY, hhi = -INFINITY, hs = 0, ts = 0;
    for (size_t i = 0; i < m->n_profile; i++) {
        minmax(m->profile[i].active_frac, &alo, &ahi, &as);
        minmax(m->profile[i].hot_share, &hlo, &hhi, &hs);
        ts += m->profile[i].top10_share;
    }
    if (m->n_profile) {
        double n = (double)m->n_profile;
        fprintf(out, "profile:    %llu tokens; active per token %.1f%% (%.1f..%.1f%%); firing on > half the tokens "
                     "%.1f%%; top 10%% of neurons carry %.0f%% of activations\n",
                (unsigned long long)m->profile_tokens, 100 * as / n, 100 * alo, 100 * ahi, 100 * hs / n, 100 * ts / n);
    } else {
        fprintf(out, "profile:    none\n");
    }
}

int pi2_bundle_inspect(const pi2_bundle *b, FILE *out, pi2_err *err)
{
    const pi2_manifest *m = b->mf;
    const pi2_bundle_layout *l = b->lay;
    const pi2_model_desc *d = &m->config;
    char fp[17] = "";
    uint8_t raw[PI2_SIGN_PUBKEY_LEN];
    if (l->signer[0] && pi2_sha256_parse_hex(l->signer, raw, NULL) == 0)
        pi2_bundle_key_fingerprint(raw, fp);
    fprintf(out, "%s: bundled pi2 model (format %d), from %s\n", b->path, PI2_MF_VERSION, m->source);
    switch (b->sig) {
    case PI2_BUNDLE_SIG_VERIFIED: fprintf(out, "signature:  verified, Ed25519 key %s\n", fp); break;
    case PI2_BUNDLE_SIG_UNSIGNED: fprintf(out, "signature:  UNSIGNED (nothing vouches for this file)\n"); break;
    case PI2_BUNDLE_SIG_UNCHECKED:
        fprintf(out, "signature:  signed by Ed25519 key %s (not checked here: that needs the signer's public key)\n",
                fp);
        break;
    }
    inspect_model(d, out);
    inspect_tokens(b, out);
    fprintf(out, "quant:      ffn %s, other %s, groups of %d, fp16 scales (the FFN's in its slots)\n",
            pi2_q_type_name(m->quant_ffn), pi2_q_type_name(m->quant_other), PI2_Q_GROUP);
    inspect_layout(m, l, out);
    inspect_predictors(m, out);
    inspect_profile(m, out);
    return ferror(out) ? pi2_err_set(err, PI2_EIO, "inspect: write error") : 0;
}
