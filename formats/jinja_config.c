/* Chat templates: what tokenizer_config.json says about them (the
 * chat_template and the bos and eos tokens it renders with). */
#include "formats/jinja_internal.h"
#include "formats/jsonread.h"

#include <stdlib.h>
#include <string.h>

/* tokenizer_config.json files carry the whole added-token table: allow them room. */
#define CONFIG_MAX_BYTES ((size_t)64 << 20)

void pi2_jinja_config_free(pi2_chat_config *cc)
{
    if (!cc)
        return;
    free(cc->chat_template);
    free(cc->bos_token);
    free(cc->eos_token);
    memset(cc, 0, sizeof *cc);
}

/* A token: a string, {"content": string, ...} (an AddedToken), or null. */
static int read_token(const pi2_jr *r, json_t *root, const char *k, char **out)
{
    json_t *v = json_object_get(root, k);
    const char *s;
    int rc;
    if (!v || json_is_null(v))
        return 0;
    if (json_is_object(v))
        rc = pi2_jr_str(r, v, k, "content", 4096, &s);
    else
        rc = pi2_jr_str(r, root, "", k, 4096, &s);
    if (rc)
        return rc;
    *out = pi2_strdup(s);
    return *out ? 0 : pi2_err_set(r->err, PI2_ENOMEM, "%s: out of memory", r->file);
}

/* chat_template: a string, or a list of {"name", "template"} of which HF
 * takes the one named "default". */
static int read_template(const pi2_jr *r, json_t *root, char **out)
{
    json_t *v = json_object_get(root, "chat_template");
    const char *s = NULL;
    int rc = 0;
    if (!v || json_is_null(v))
        return 0;
    if (json_is_array(v)) {
        size_t n;
        json_t *arr;
        if ((rc = pi2_jr_arr(r, root, "", "chat_template", 1024, &arr, &n)) != 0)
            return rc;
        for (size_t i = 0; i < n && !s; i++) {
            char w[48];
            json_t *e;
            const char *name;
            snprintf(w, sizeof w, "chat_template[%zu]", i);
            if ((rc = pi2_jr_elem_obj(r, arr, i, w, &e)) != 0 || (rc = pi2_jr_str(r, e, w, "name", 256, &name)) != 0)
                return rc;
            if (strcmp(name, "default") == 0 && (rc = pi2_jr_str(r, e, w, "template", JX_MAX_TEMPLATE + 1, &s)) != 0)
                return rc;
        }
        if (!s)
            return pi2_jr_fail(r, PI2_EUNSUPPORTED, "", "chat_template", "several templates and none named \"default\"");
    } else if ((rc = pi2_jr_str(r, root, "", "chat_template", JX_MAX_TEMPLATE + 1, &s)) != 0) {
        return rc;
    }
    *out = pi2_strdup(s);
    return *out ? 0 : pi2_err_set(r->err, PI2_ENOMEM, "%s: out of memory", r->file);
}

int pi2_jinja_config_parse(const char *json, size_t len, const char *file, pi2_chat_config *out, pi2_err *err)
{
    memset(out, 0, sizeof *out);
    json_error_t je;
    /* Integers as reals: Llama-2-era files say "model_max_length":
     * 1000000000000000019884624838656 (int(1e30)), past any C integer. */
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &je);
    if (!root)
        return pi2_err_set(err, PI2_EFORMAT, "%s: not valid JSON (line %d: %s)", file, je.line, je.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return pi2_err_set(err, PI2_EFORMAT, "%s: not a JSON object", file);
    }
    pi2_jr r = {file, err};
    int rc = read_template(&r, root, &out->chat_template);
    if (!rc)
        rc = read_token(&r, root, "bos_token", &out->bos_token);
    if (!rc)
        rc = read_token(&r, root, "eos_token", &out->eos_token);
    json_decref(root);
    if (rc)
        pi2_jinja_config_free(out);
    return rc;
}

int pi2_jinja_config_read(const char *path, pi2_chat_config *out, pi2_err *err)
{
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    int rc = pi2_read_file(path, CONFIG_MAX_BYTES, &text, &len, err);
    if (rc)
        return rc;
    rc = pi2_jinja_config_parse(text, len, path, out, err);
    free(text);
    return rc;
}
