/* Fuzz target: config.json reader (pi2_config_parse), and on success the
 * round trip through pi2_config_format and a second parse (every field,
 * FATReLU's threshold and rope_scaling included), and the RoPE frequencies
 * at the last position the model runs. */
#include "formats/hfconfig.h"
#include "tests/fuzz/fuzz_util.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pi2_model_desc d, d2;
    pi2_err err = {0};
    char *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    if (pi2_config_parse(buf, size, "config.json", &d, &err) == 0) {
        char name[128];
        (void)pi2_arch_name(d.arch);
        (void)pi2_act_name(d.act);
        (void)pi2_arch_class(d.arch);
        (void)pi2_tensor_name(name, sizeof name, &d, PI2_T_GATE, d.n_layers - 1, d.n_experts - 1);
        (void)pi2_tensor_name(name, sizeof name, &d, PI2_T_ROUTER, 0, 0);
        char *text = NULL;
        size_t len = 0;
        if (pi2_config_format(&d, "float32", &text, &len, &err) == 0) {
            /* What we write must read back as the same model. */
            if (pi2_config_parse(text, len, "config.json (formatted)", &d2, &err) != 0 || d2.arch != d.arch ||
                d2.act != d.act || d2.hidden != d.hidden || d2.n_ff != d.n_ff || d2.n_layers != d.n_layers ||
                d2.n_heads != d.n_heads || d2.n_kv_heads != d.n_kv_heads || d2.head_dim != d.head_dim ||
                d2.vocab != d.vocab || d2.n_experts != d.n_experts || d2.n_eos != d.n_eos ||
                d2.act_param != d.act_param || d2.rope.type != d.rope.type || d2.rope.factor != d.rope.factor ||
                d2.rope.low_freq_factor != d.rope.low_freq_factor ||
                d2.rope.high_freq_factor != d.rope.high_freq_factor || d2.rope.orig_max_pos != d.rope.orig_max_pos)
                abort();
            for (int i = 0; i < d.n_eos; i++)
                if (d2.eos_ids[i] != d.eos_ids[i])
                    abort();
            /* the model math the config implies stays finite */
            float inv[64];
            if (d.head_dim <= 128) {
                int ctx = pi2_desc_max_ctx(&d);
                if (ctx < d.max_pos)
                    abort();
                pi2_rope_inv_freq(&d, ctx - 1, inv);
                for (int i = 0; i < d.head_dim / 2; i++)
                    if (!(inv[i] >= 0.0f)) /* NaN too */
                        abort();
            }
            free(text);
        }
    }
    free(buf);
    return 0;
}
