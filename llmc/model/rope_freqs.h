/*
 * rope_freqs.h: RoPE's inverse frequencies from the model's description, as HF
 * computes them in float32, for the GPU's table (kernels/rope.h) and the CPU
 * reference. Writes only inv_freq.
 */
#ifndef LLMC_ROPE_FREQS_H
#define LLMC_ROPE_FREQS_H

#include <math.h>

#include "llmc/model/llama_config.h"

/*
 * RoPE inverse frequencies, head_dim/2 of them, exactly as HF computes them in
 * float32: inv_freq[i] = theta^(-2i/D); with Llama 3.1 scaling, wavelengths
 * 2*pi/inv_freq above original_max_pos/low_freq_factor are divided by factor,
 * those below original_max_pos/high_freq_factor kept, and those between
 * interpolated smoothly.
 */
static inline void llama_rope_inv_freq(const LlamaConfig *c, float *inv_freq)
{
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float exponent = (float)(2 * i) / (float)c->head_dim;
        float f = 1.0f / powf(c->rope_theta, exponent);
        if (c->rope_scaling_llama3) {
            float old_len = (float)c->rope_original_max_pos;
            float low_wavelen = old_len / c->rope_low_freq_factor;
            float high_wavelen = old_len / c->rope_high_freq_factor;
            float wavelen = 2.0f * (float)M_PI / f;
            if (wavelen > low_wavelen) {
                f = f / c->rope_factor;
            } else if (!(wavelen < high_wavelen)) {
                float smooth = (old_len / wavelen - c->rope_low_freq_factor) /
                               (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1.0f - smooth) * f / c->rope_factor + smooth * f;
            }
        }
        inv_freq[i] = f;
    }
}

#endif /* LLMC_ROPE_FREQS_H */
