/*
 * fp8_tool: float32 values (little-endian, from stdin) to their E4M3 and E5M2
 * codes by llmc/kernels/fp8.h, two bytes per value on stdout, for tests/test_fp8.py.
 */
#include <stdio.h>

#include "llmc/kernels/fp8.h"

int main(void)
{
    float x;
    while (fread(&x, sizeof(x), 1, stdin) == 1) {
        uint8_t out[2] = {fp8_from_float(x, FP8_E4M3), fp8_from_float(x, FP8_E5M2)};
        if (fwrite(out, 1, 2, stdout) != 2)
            return 1;
    }
    return ferror(stdin) ? 1 : 0;
}
