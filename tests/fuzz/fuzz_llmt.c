/*
 * fuzz_llmt.c: libFuzzer target for the .llmt readers: llmc/formats/tensorfile.h's
 * header and index, llama_config_from_tensorfile_try's config metadata and
 * llmt_weights_try's tensors (llmc/formats/hf_model.h), as --init-from reads a
 * weights file. Any file must be refused with a message naming it, or give
 * tensors whose bytes can all be read, and a config from which a parameter
 * layout is built and filled; never a crash, an overflow or a read past the
 * file. The input is written to a file first (the readers work on paths).
 * Build and run: make test-fuzz (tests/fuzz/run.sh).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "llmc/formats/hf_model.h"
#include "llmc/formats/llmt_config.h"
#include "llmc/model/param_layout.h"
#include "tests/fuzz/fuzz_file.h"

static const char *path;

static void expect_named(const char *err)
{
    if (strstr(err, path) == NULL)
        abort(); /* every error names the file */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    path = fuzz_file_path("weights.llmt");
    fuzz_write_file(path, data, size);
    TensorFile tf;
    char err[2048];
    if (tensorfile_open_try(&tf, path, err, sizeof(err)) != 0) {
        expect_named(err);
        return 0;
    }
    for (int i = 0; i < tf.n_tensors; i++) {
        const TensorEntry *e = &tf.tensors[i];
        if (e->numel <= (1 << 20) && tensorfile_find(&tf, e->name) == e) {
            void *out = malloc((size_t)(e->nbytes > 0 ? e->nbytes : 1));
            if (tensorfile_read_try(&tf, e->name, e->dtype, e->numel, out, err, sizeof(err)) != 0)
                abort(); /* a checked index promises the bytes are there */
            free(out);
        }
    }
    LlamaConfig c;
    if (llama_config_from_tensorfile_try(&tf, &c, err, sizeof(err)) != 0) {
        expect_named(err);
    } else if (c.n_layer <= 8 && (int64_t)c.vocab_size * c.d_model < ((int64_t)1 << 22)) {
        ParamLayout layout = llama_param_layout(&c);
        if (layout.total <= (1 << 22)) {
            float *params = (float *)malloc((size_t)layout.total * sizeof(float));
            if (llmt_weights_try(&tf, &layout, params, err, sizeof(err)) != 0)
                expect_named(err);
            free(params);
        }
        llama_param_layout_free(&layout);
    }
    tensorfile_close(&tf);
    return 0;
}
