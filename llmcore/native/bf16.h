/* bfloat16 <-> float32 for llmcore's C kernels (onerow.c, step.c, amx.c): a bfloat16 is the
 * top 16 bits of a float32, so widening is exact; narrowing rounds to nearest, ties to even,
 * as PyTorch's .to(torch.bfloat16) does, and keeps a NaN a NaN. One number at a time, or 16
 * at a time with AVX-512 (the same bits). */
#ifndef LLMCORE_BF16_H
#define LLMCORE_BF16_H

#include <immintrin.h>
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

/* float_to_bf16 of 16 floats at once. */
static inline __m256i floats_to_bf16(__m512 f) {
    const __m512i u = _mm512_castps_si512(f);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), u,
                             _mm512_set1_epi32(0x400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

/* bf16_to_float of 16 bfloat16s at once. */
static inline __m512 bf16_to_floats(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The first `left` of 16 lanes (all 16 from 16 on): the mask of a vector's tail. */
static inline __mmask16 first_lanes(long left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}

/* 16 bfloat16s at x widened (a mask t of them, zeros elsewhere). */
static inline __m512 load_bf16s(const uint16_t *x, __mmask16 t) {
    return bf16_to_floats(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16((__mmask32)t, x)));
}

/* 16 floats of x from element i on (a mask t of them): x float32, or (bf16) bfloat16 widened. */
static inline __m512 load_floats(const void *x, long i, __mmask16 t, int bf16) {
    return bf16 ? load_bf16s((const uint16_t *)x + i, t)
                : _mm512_maskz_loadu_ps(t, (const float *)x + i);
}

/* out (n,) bfloat16 = x (n,) float32 rounded, 16 at a time. */
static inline void narrow_to_bf16(const float *x, uint16_t *out, long n) {
    for (long i = 0; i < n; i += 16) {
        const __mmask16 t = first_lanes(n - i);
        _mm512_mask_storeu_epi16(out + i, (__mmask32)t, _mm512_castsi256_si512(
            floats_to_bf16(_mm512_maskz_loadu_ps(t, x + i))));
    }
}

/* out (n,) float32 = x (n,) bfloat16 widened, 16 at a time. */
static inline void widen_from_bf16(const uint16_t *x, float *out, long n) {
    for (long i = 0; i < n; i += 16) {
        const __mmask16 t = first_lanes(n - i);
        _mm512_mask_storeu_ps(out + i, t, load_bf16s(x + i, t));
    }
}

/* x (n,) float32 rounded to bfloat16 in place (and kept as float32). */
static inline void round_to_bf16(float *x, long n) {
    for (long i = 0; i < n; i += 16) {
        const __mmask16 t = first_lanes(n - i);
        _mm512_mask_storeu_ps(x + i, t, bf16_to_floats(floats_to_bf16(
            _mm512_maskz_loadu_ps(t, x + i))));
    }
}

#endif
