/* Fuzz target: config.json reader (pi2_config_parse), and on success the
 * round trip through pi2_config_format and a second parse. */
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
                d2.vocab != d.vocab || d2.n_experts != d.n_experts || d2.n_eos != d.n_eos)
                abort();
            free(text);
        }
    }
    free(buf);
    return 0;
}
