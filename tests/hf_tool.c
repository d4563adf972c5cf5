/*
 * hf_tool.c: the C side of tests/test_hf.py, which makes HF model directories
 * and texts in Python (safetensors, tiktoken) and checks what the trainers'
 * shared code makes of them:
 *
 *   hf_tool load DIR OUT.f32      the model of DIR (llmc/formats/hf_model.h): prints its
 *                                 config as key=value lines and writes the fp32
 *                                 weights in layout order to OUT.f32; on an error
 *                                 prints the message to stderr and exits 1
 *   hf_tool config FILE           the LlamaConfig of an HF config.json (llmc/formats/hf_config.h),
 *                                 as key=value lines
 *   hf_tool encode TOKENIZER FILE the ids of FILE's text (llmc/formats/tokenizer.h), one
 *                                 line, space-separated; exits 1 unless they
 *                                 decode to the text again
 *
 * Build: make tests/hf_tool.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/formats/hf_model.h"
#include "llmc/model/llama_config.h"
#include "llmc/formats/tokenizer.h"
#include "llmc/common/utils.h"
#include "llmc/model/param_layout.h"

static void print_config(const LlamaConfig *c, const HfTokenIds *ids)
{
    for (int i = 0; i < LLAMA_CONFIG_N_FIELDS; i++) {
        char value[64];
        config_field_format(value, sizeof(value), c, &LLAMA_CONFIG_FIELDS[i], 0);
        printf("%s=%s\n", LLAMA_CONFIG_FIELDS[i].member, value);
    }
    printf("bos_id=%d\nn_eos=%d\n", ids->bos_id, ids->n_eos);
}

static int load(const char *dir, const char *out_path)
{
    HfTokenIds ids;
    LlamaConfig c = model_config_load(dir, &ids);
    ParamLayout layout = llama_param_layout(&c);
    float *params = (float *)malloc_check((size_t)layout.total * sizeof(float), "weights");
    model_weights_load(dir, &layout, params);
    print_config(&c, &ids);
    FILE *f = fopen_check(out_path, "wb");
    fwrite_check(params, sizeof(float), (size_t)layout.total, f, "weights");
    fclose(f);
    free(params);
    llama_param_layout_free(&layout);
    return 0;
}

static int encode(const char *tokenizer_path, const char *text_path)
{
    char err[2048];
    Tokenizer t;
    if (tokenizer_load_try(&t, tokenizer_path, err, sizeof(err)) != 0)
        FAIL("%s", err);
    FILE *f = fopen_check(text_path, "rb");
    int64_t size = file_size_check(f);
    char *text = (char *)malloc_check((size_t)size + 1, "text");
    fread_check(text, 1, (size_t)size, f, "text");
    fclose(f);
    text[size] = '\0';
    int *ids = (int *)malloc_check(sizeof(int) * (size_t)(size + 1), "ids");
    int n = tokenizer_encode(&t, text, ids);
    for (int i = 0; i < n; i++)
        printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    char *back = tokenizer_decode(&t, ids, n);
    int same = strcmp(back, text) == 0;
    if (!same)
        fprintf(stderr, "hf_tool: the %d ids do not decode to the text again\n", n);
    free(back);
    free(ids);
    free(text);
    tokenizer_free(&t);
    return same ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "load") == 0)
        return load(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "encode") == 0)
        return encode(argv[2], argv[3]);
    if (argc == 3 && strcmp(argv[1], "config") == 0) {
        LlamaConfig c;
        HfTokenIds ids;
        char err[2048];
        if (hf_config_read_try(argv[2], &c, &ids, err, sizeof(err)) != 0)
            FAIL("%s", err);
        print_config(&c, &ids);
        return 0;
    }
    fprintf(stderr, "usage: %s load DIR OUT.f32 | config FILE | encode TOKENIZER FILE\n", argv[0]);
    return 2;
}
