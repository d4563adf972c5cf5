/*
 * fuzz_safetensors.c: libFuzzer target for llmc/formats/safetensors.h's reader: any
 * file must be refused with a message naming it, or give tensors that tile
 * the data, each of whose F32, BF16 or F16 values can then be read; never a
 * crash, an overflow or a read past the file. The input is written to a file
 * first (the reader works on paths).
 * Build and run: make test-fuzz (tests/fuzz/run.sh).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "llmc/formats/safetensors.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file_path("model.safetensors");
    fuzz_write_file(path, data, size);
    SafetensorsFile sf;
    char err[1024];
    if (safetensors_open(&sf, path, err, sizeof(err)) != 0) {
        if (strstr(err, path) == NULL)
            abort();
        return 0;
    }
    for (int i = 0; i < sf.n_tensors; i++) {
        const SafetensorsTensor *t = &sf.tensors[i];
        if (t->begin < 0 || t->end < t->begin || sf.data_start + t->end > sf.file_size)
            abort();
        if (safetensors_dtype_readable(t->dtype) && t->numel <= (1 << 20)) {
            float *out = (float *)malloc(sizeof(float) * (size_t)(t->numel > 0 ? t->numel : 1));
            if (safetensors_read_f32(&sf, t, out, err, sizeof(err)) != 0)
                abort(); /* a checked header promises the bytes are there */
            free(out);
        }
    }
    safetensors_close(&sf);
    return 0;
}
