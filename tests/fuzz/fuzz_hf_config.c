/*
 * fuzz_hf_config.c: libFuzzer target for llmc/formats/hf_config.h's reader of HF
 * config.json files: any text must give a LlamaConfig that llama_config_check
 * accepts (sizes within bounds, so a parameter layout can be built from it,
 * which this target does) or an error naming the file; never a crash.
 * Build and run: make test-fuzz (tests/fuzz/run.sh).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "llmc/formats/hf_config.h"
#include "llmc/model/param_layout.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    LlamaConfig c;
    HfTokenIds ids;
    char err[1024];
    if (hf_config_parse_try((const char *)data, size, "config.json", &c, &ids, err, sizeof(err)) != 0) {
        if (strstr(err, "'config.json'") == NULL)
            abort(); /* every error names the file */
        return 0;
    }
    char why[512];
    if (llama_config_check(&c, why, sizeof(why)) != 0 || ids.n_eos > HF_MAX_EOS_IDS)
        abort();
    if (c.n_layer <= 8 && (int64_t)c.vocab_size * c.d_model < ((int64_t)1 << 26)) {
        ParamLayout layout = llama_param_layout(&c); /* the sizes multiply without overflow */
        if (layout.total <= 0)
            abort();
        llama_param_layout_free(&layout);
    }
    return 0;
}
