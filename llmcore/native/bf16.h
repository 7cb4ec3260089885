/* bfloat16 <-> float32 for llmcore's C kernels (onerow.c, step.c): a bfloat16 is the top 16
 * bits of a float32, so widening is exact; narrowing rounds to nearest, ties to even, as
 * PyTorch's .to(torch.bfloat16) does, and keeps a NaN a NaN. */
#ifndef LLMCORE_BF16_H
#define LLMCORE_BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t float_to_bf16(float f) {        /* round to nearest, ties to even */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);   /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif
