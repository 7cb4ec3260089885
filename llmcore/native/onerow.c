/* llmcore's one-row kernels: y = x W for a single row x, each weight read once.
 *
 * A decode step at batch 1 multiplies one row by every matrix of the model: a matrix-vector
 * product, bound by the bytes it reads. These kernels read a matrix stored as (d_out, d_in):
 * each output's weights in one row (int8 codes or bfloat16 values), its sum over that row,
 * the outputs shared among the threads, each thread reading several runs of its rows at once
 * (my_runs), and they ask the CPU to fetch each row's bytes STREAM_AHEAD bytes before they
 * are needed (a loop over one row keeps too few loads in flight to stream memory at its full
 * rate on its own). Chapter 13.
 *
 *   llmcore_w8a8_onerow: int8 codes x int8 activations (AVX-512 VNNI), the activations rounded
 *       as llmcore.lowbit's "w8a8" rounds one row: codes nearbyint(x / (r / 64)) for r =
 *       max |x|, sent unsigned (+64); the integer sums are exact.
 *   llmcore_int8_onerow: int8 codes x bfloat16 activations, float32 sums (AVX-512), the
 *       "int8" precision's weight-only product.
 *   llmcore_bf16_onerow: bfloat16 weights x bfloat16 activations, float32 sums (AVX512-BF16),
 *       the "bf16" precision's product.
 *   llmcore_int4_rows: int4 codes in groups x bfloat16 activations, float32 sums (AVX-512),
 *       the "int4" precision's weight-only product, for one row or several.
 *
 * Compiled and loaded by llmcore/onerow.py, which checks every operand before a call.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "runs.h"

#define PREFETCH_AHEAD 8192          /* bytes ahead in each weight row (int4, several rows) */
#define STREAMS 8                    /* runs of rows a core reads at once (my_runs) */
#define INT8_STREAMS 4               /* for the int8 kernel (four sums a row) */
#define STREAM_AHEAD 4096            /* bytes ahead in each run */
#define LANE 64                      /* int8 codes in one 512-bit load */

int llmcore_onerow_version(void) { return 11; }

static inline __mmask64 tail_mask(long k, long end) {
    long left = end - k;
    return left >= LANE ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
}

/* w8a8's step for one row x (k,): r / 64 for r = max |x| (exact: r / 2^6), 0 for a row of
 * zeros, NaN for a row with an inf or a NaN. */
static float w8a8_step(const float *x, long k) {
    __m512 most = _mm512_setzero_ps();
    __mmask16 unordered = 0;                                   /* a NaN seen */
    for (long i = 0; i < k; i += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(first_lanes(k - i), x + i);
        unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        most = _mm512_max_ps(most, _mm512_abs_ps(v));
    }
    const float r = _mm512_reduce_max_ps(most);
    return (unordered || !(r < INFINITY)) ? NAN : (float)((double)r / 64.0);
}

/* codes (k,) int8 = nearbyint(x / step), -64..64, for a step > 0 of w8a8_step: x times the
 * step's inverse, rounded to nearest even (fbgemm's rounding). */
static void w8a8_round(const float *x, long k, float step, int8_t *codes) {
    const __m512 inverse = _mm512_set1_ps(1.f / step);
    for (long i = 0; i < k; i += 16) {
        const __mmask16 t = first_lanes(k - i);
        const __m512 scaled = _mm512_mul_ps(_mm512_maskz_loadu_ps(t, x + i), inverse);
        const __m512i c = _mm512_cvtps_epi32(_mm512_roundscale_ps(
            scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm512_mask_cvtsepi32_storeu_epi8(codes + i, t, c);
    }
}

/* out (n_out,) = x (k,) float32 @ W + bias: w (n_out, k) int8 codes, scale (n_out,) float32,
 * row_sums (n_out,) the sums of each row's codes, bias (n_out,) float32 or NULL. A row of
 * zeros gives the bias; a row with an inf or a NaN gives NaN. Returns 0, or -1 without
 * memory for the activations' codes. */
int llmcore_w8a8_onerow(const int8_t *w, const int32_t *row_sums, const float *scale,
                        const float *bias, const float *x, float *out, long n_out, long k) {
    const float step = w8a8_step(x, k);
    if (!(step > 0.f)) {                               /* NaN: an inf or a NaN; 0: zeros */
        for (long n = 0; n < n_out; n++) out[n] = step == 0.f ? (bias ? bias[n] : 0.f) : NAN;
        return 0;
    }
    const long padded = (k + LANE - 1) / LANE * LANE;
    int8_t *codes = aligned_alloc(LANE, (size_t)padded);
    if (!codes) return -1;
    w8a8_round(x, k, step, codes);
    memset(codes + k, 0, (size_t)(padded - k));
    const __m512i offset = _mm512_set1_epi8(64);  /* VNNI multiplies unsigned codes: +64 */
    #pragma omp parallel
    {
        long first, end, run;
        my_runs(n_out, STREAMS, &first, &end, &run);
        for (long r = 0; r < run; r++) {
            __m512i acc[STREAMS];
            const int8_t *row[STREAMS];
            for (long s = 0; s < STREAMS; s++) {
                acc[s] = _mm512_setzero_si512();
                row[s] = w + row_to_read(first, end, run, s, r) * k;
            }
            for (long i = 0; i < padded; i += LANE) {
                const __mmask64 m = tail_mask(i, k);
                const __m512i a = _mm512_add_epi8(_mm512_load_si512((const void *)(codes + i)),
                                                  offset);
                for (long s = 0; s < STREAMS; s++) {
                    _mm_prefetch((const char *)(row[s] + i + STREAM_AHEAD), _MM_HINT_T0);
                    acc[s] = _mm512_dpbusd_epi32(acc[s], a,
                                                 _mm512_maskz_loadu_epi8(m, row[s] + i));
                }
            }
            for (long s = 0; s < STREAMS; s++) {
                const long n = run_row(first, end, run, s, r);
                if (n < 0) break;
                const int32_t sum = _mm512_reduce_add_epi32(acc[s]) - 64 * row_sums[n];
                const float y = (float)sum * (step * scale[n]);
                out[n] = bias ? y + bias[n] : y;
            }
        }
    }
    free(codes);
    return 0;
}

/* Several rows, w8a8 (a prompt, or a batch): each row of x (m, k) float32 rounded as
 * llmcore_w8a8_onerow rounds it, into codes (m, k) int8 (-64..64, signed: the integer product
 * is torch._int_mm's) and steps (m,) float32 (r / 64; 0 for a row of zeros, NaN for a row
 * with an inf or a NaN, whose outputs are then NaN). */
void llmcore_w8a8_round_rows(const float *x, int8_t *codes, float *steps, long m, long k) {
    #pragma omp parallel for schedule(static)
    for (long row = 0; row < m; row++) {
        const float step = w8a8_step(x + row * k, k);
        if (step > 0.f)
            w8a8_round(x + row * k, k, step, codes + row * k);
        else                                            /* zeros, or an inf or a NaN */
            memset(codes + row * k, 0, (size_t)k);
        steps[row] = step;
    }
}

/* out (m, n) float32 = sums (m, n) int32 * (steps[i] * scale[j]) + bias[j] (bias may be
 * NULL): the float32 operations llmcore_w8a8_onerow does after its integer sums (a product,
 * then the bias added: no fused multiply-add), so that a row gives the same numbers alone
 * and in a batch. */
void llmcore_w8a8_scale_rows(const int32_t *sums, const float *steps, const float *scale,
                             const float *bias, float *out, long m, long n) {
    const long chunk = 1024;                              /* columns a thread takes at once */
    const long chunks = (n + chunk - 1) / chunk;
    #pragma omp parallel for schedule(static)
    for (long job = 0; job < m * chunks; job++) {
        const long row = job / chunks, j0 = (job % chunks) * chunk;
        const long j1 = j0 + chunk < n ? j0 + chunk : n;
        const __m512 step = _mm512_set1_ps(steps[row]);
        for (long j = j0; j < j1; j += 16) {
            const __mmask16 t = first_lanes(j1 - j);
            const __m512 s = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(t, sums + row * n + j));
            __m512 y = _mm512_mul_ps(s, _mm512_mul_ps(step, _mm512_maskz_loadu_ps(t, scale + j)));
            if (bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(t, bias + j));
            _mm512_mask_storeu_ps(out + row * n + j, t, y);
        }
    }
}

/* out (n_out,) bfloat16 = x (k,) bfloat16 @ W + bias: w (n_out, k) bfloat16, bias (n_out,)
 * bfloat16 or NULL. AVX512-BF16's dot product multiplies pairs of bfloat16 and adds them to
 * float32 sums (inputs and results below float32's normal range count as zero); one rounding
 * to bfloat16 at the end. One row of each of STREAMS runs at a time (my_runs). */
int llmcore_bf16_onerow(const uint16_t *w, const uint16_t *bias, const uint16_t *x,
                        uint16_t *out, long n_out, long k) {
    const long half = LANE / 2;                       /* bfloat16 values in one load */
    #pragma omp parallel
    {
        long first, end, run;
        my_runs(n_out, STREAMS, &first, &end, &run);
        for (long r = 0; r < run; r++) {
            __m512 acc[STREAMS];
            const uint16_t *row[STREAMS];
            for (long s = 0; s < STREAMS; s++) {
                acc[s] = _mm512_setzero_ps();
                row[s] = w + row_to_read(first, end, run, s, r) * k;
            }
            for (long i = 0; i < k; i += half) {
                const __mmask32 m = k - i >= half ? ~(__mmask32)0
                                                  : (((__mmask32)1 << (k - i)) - 1);
                const __m512bh a = (__m512bh)_mm512_maskz_loadu_epi16(m, x + i);
                for (long s = 0; s < STREAMS; s++) {
                    _mm_prefetch((const char *)(row[s] + i) + STREAM_AHEAD, _MM_HINT_T0);
                    acc[s] = _mm512_dpbf16_ps(acc[s], a,
                                              (__m512bh)_mm512_maskz_loadu_epi16(m, row[s] + i));
                }
            }
            for (long s = 0; s < STREAMS; s++) {
                const long n = run_row(first, end, run, s, r);
                if (n < 0) break;
                const float y = _mm512_reduce_add_ps(acc[s]);
                out[n] = float_to_bf16(bias ? y + bf16_to_float(bias[n]) : y);
            }
        }
    }
    return 0;
}

/* AVX512-BF16's dot product, vdpbf16ps, adds to each float32 lane the products of its odd
 * pair of bfloat16 and then of its even pair, each rounded once (a product of two bfloat16
 * is exact in float32), subnormal inputs and results taken as zero. The same two fused
 * multiply-adds on the halves widened to float32 give the same sums for normal numbers, and
 * run four times as many multiply-adds a cycle on the course's Xeon (vdpbf16ps: one in two
 * cycles; vfmadd: two a cycle): the kernel for a few rows, whose products are the work. */
static inline __m512 odd_half(__m512i v) {                 /* the high bfloat16 of each lane */
    return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}
static inline __m512 even_half(__m512i v) {                /* the low bfloat16 of each lane */
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

/* `rows` rows of x times four outputs' rows of W (row[0..3], k bfloat16 each): acc[r][j]
 * the float32 sums llmcore_bf16_onerow makes of the same row and output, in the same order
 * (chunks of 32 values, odd then even halves), each chunk of x widened as it is read. `rows`
 * is 1 to 4, a constant where it is inlined. */
static inline __attribute__((always_inline)) void bf16_four_outputs(
        const uint16_t *const *row, const uint16_t *x, long k, long chunks, __m512 acc[4][4],
        const int rows) {
    const long half = LANE / 2;
    __m512 a[4][4];                         /* in registers: acc is written once, at the end */
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < 4; j++) a[r][j] = _mm512_setzero_ps();
    for (long c = 0; c < chunks; c++) {
        const long i = c * half;
        const __mmask32 m = k - i >= half ? ~(__mmask32)0 : (((__mmask32)1 << (k - i)) - 1);
        __m512 wo[4], we[4];
        for (int j = 0; j < 4; j++) {
            _mm_prefetch((const char *)(row[j] + i) + PREFETCH_AHEAD, _MM_HINT_T0);
            const __m512i v = _mm512_maskz_loadu_epi16(m, row[j] + i);
            wo[j] = odd_half(v);
            we[j] = even_half(v);
        }
        for (int r = 0; r < rows; r++) {
            const __m512i xv = _mm512_maskz_loadu_epi16(m, x + r * k + i);
            const __m512 xo = odd_half(xv), xe = even_half(xv);
            for (int j = 0; j < 4; j++) {
                a[r][j] = _mm512_fmadd_ps(xo, wo[j], a[r][j]);
                a[r][j] = _mm512_fmadd_ps(xe, we[j], a[r][j]);
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = a[r][j];
}

/* out (m, n_out) bfloat16 = x (m, k) bfloat16 @ W + bias, W and bias as llmcore_bf16_onerow
 * takes them: a few rows (a prompt), four outputs' weights read from memory once for all the
 * rows and widened once, four rows at a time; every row's sums are those llmcore_bf16_onerow
 * makes of it alone (normal numbers: see odd_half). Returns 0. */
int llmcore_bf16_rows(const uint16_t *w, const uint16_t *bias, const uint16_t *x,
                      uint16_t *out, long m, long n_out, long k) {
    const long chunks = (k + LANE / 2 - 1) / (LANE / 2);
    const long blocks = (n_out + 3) / 4;
    #pragma omp parallel for schedule(static)
    for (long blk = 0; blk < blocks; blk++) {
        const long n0 = blk * 4, outputs = n_out - n0 < 4 ? n_out - n0 : 4;
        const uint16_t *row[4];
        for (long j = 0; j < 4; j++) row[j] = w + (n0 + (j < outputs ? j : 0)) * k;
        for (long r0 = 0; r0 < m;) {
            const int rows = m - r0 >= 4 ? 4 : 1;
            const uint16_t *xr = x + r0 * k;
            __m512 acc[4][4];
            if (rows == 4)
                bf16_four_outputs(row, xr, k, chunks, acc, 4);
            else
                bf16_four_outputs(row, xr, k, chunks, acc, 1);
            for (int r = 0; r < rows; r++)
                for (long j = 0; j < outputs; j++) {
                    const float y = _mm512_reduce_add_ps(acc[r][j]);
                    out[(r0 + r) * n_out + n0 + j] = float_to_bf16(
                        bias ? y + bf16_to_float(bias[n0 + j]) : y);
                }
            r0 += rows;
        }
    }
    return 0;
}

/* The index of each row's first largest value, x (m, v) float32 (bf16 = 0) or bfloat16
 * (bf16 = 1) -> out (m,) int64, a NaN counting as larger than any number (the first NaN):
 * torch.argmax's answer, found in two passes over the row (its largest value, then where it
 * first is), the greedy pick of a step's logits. */
void llmcore_argmax_rows(const void *x, int64_t *out, long m, long v, int bf16) {
    for (long r = 0; r < m; r++) {
        const void *row = bf16 ? (const void *)((const uint16_t *)x + r * v)
                               : (const void *)((const float *)x + r * v);
        __m512 most = _mm512_set1_ps(-INFINITY);
        __mmask16 nan = 0;
        long i = 0;
        for (; i < v && !nan; i += 16) {
            const __mmask16 t = first_lanes(v - i);
            const __m512 a = load_floats(row, i, t, bf16);
            nan = _mm512_mask_cmp_ps_mask(t, a, a, _CMP_UNORD_Q);
            most = _mm512_mask_max_ps(most, t, most, a);
        }
        long found = 0;
        if (nan) {                                   /* the first NaN, in the last 16 read */
            found = i - 16 + __builtin_ctz(nan);
        } else {
            const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(most));
            for (long j = 0; j < v; j += 16) {
                const __mmask16 t = first_lanes(v - j);
                const __mmask16 hit = _mm512_mask_cmp_ps_mask(t, load_floats(row, j, t, bf16),
                                                              top, _CMP_EQ_OQ);
                if (hit) { found = j + __builtin_ctz(hit); break; }
            }
        }
        out[r] = found;
    }
}

/* out (n_out,) bfloat16 = x (k,) bfloat16 @ W + bias: w (n_out, k) int8 codes, scale (n_out,)
 * and bias (n_out,) bfloat16 (bias may be NULL); float32 sums, one rounding to bfloat16.
 * Returns 0, or -1 without memory for the widened activations. */
int llmcore_int8_onerow(const int8_t *w, const uint16_t *scale, const uint16_t *bias,
                        const uint16_t *x, uint16_t *out, long n_out, long k) {
    const long padded = (k + LANE - 1) / LANE * LANE;
    float *xf = aligned_alloc(LANE, (size_t)padded * sizeof(float));
    if (!xf) return -1;
    for (long i = 0; i < k; i++) xf[i] = bf16_to_float(x[i]);
    for (long i = k; i < padded; i++) xf[i] = 0.f;
    #pragma omp parallel
    {
        long first, end, run;
        my_runs(n_out, INT8_STREAMS, &first, &end, &run);
        for (long r = 0; r < run; r++) {
            __m512 acc[INT8_STREAMS][4];          /* four sums a row, added at the end */
            const int8_t *row[INT8_STREAMS];
            for (long s = 0; s < INT8_STREAMS; s++) {
                for (int j = 0; j < 4; j++) acc[s][j] = _mm512_setzero_ps();
                row[s] = w + row_to_read(first, end, run, s, r) * k;
            }
            for (long i = 0; i < padded; i += LANE) {
                for (long s = 0; s < INT8_STREAMS; s++) {
                    _mm_prefetch((const char *)(row[s] + i + STREAM_AHEAD), _MM_HINT_T0);
                    __m128i part[4];
                    if (k - i >= LANE) {          /* 16 codes a load, widened as loaded */
                        for (int j = 0; j < 4; j++)
                            part[j] = _mm_loadu_si128((const void *)(row[s] + i + 16 * j));
                    } else {                      /* the tail: one masked load */
                        const __m512i v = _mm512_maskz_loadu_epi8(tail_mask(i, k), row[s] + i);
                        part[0] = _mm512_castsi512_si128(v);
                        part[1] = _mm512_extracti32x4_epi32(v, 1);
                        part[2] = _mm512_extracti32x4_epi32(v, 2);
                        part[3] = _mm512_extracti32x4_epi32(v, 3);
                    }
                    for (int j = 0; j < 4; j++)
                        acc[s][j] = _mm512_fmadd_ps(
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(part[j])),
                            _mm512_load_ps(xf + i + 16 * j), acc[s][j]);
                }
            }
            for (long s = 0; s < INT8_STREAMS; s++) {
                const long n = run_row(first, end, run, s, r);
                if (n < 0) break;
                const float y = _mm512_reduce_add_ps(
                                    _mm512_add_ps(_mm512_add_ps(acc[s][0], acc[s][1]),
                                                  _mm512_add_ps(acc[s][2], acc[s][3])))
                                * bf16_to_float(scale[n]);
                out[n] = float_to_bf16(bias ? y + bf16_to_float(bias[n]) : y);
            }
        }
    }
    free(xf);
    return 0;
}

/* The int4 kernel reads W in tiles of 16 outputs, one output per 32-bit lane, the lanes of a
 * tile side by side: codes (tiles, k / 8, 16) uint32, word [t][i][l] holding the eight codes
 * k = 8i .. 8i + 7 of output 16t + l, code 8i + q in bits 4q .. 4q + 3. A code becomes its
 * value code - 8 by a table lookup (vpermps reads the low four bits of each lane), so one
 * shift and one lookup give sixteen weights, one fused multiply-add takes them. */
#define INT4_TILE 16

static inline __m512 int4_values(void) {               /* code c -> c - 8, exact */
    float values[16];
    for (int c = 0; c < 16; c++) values[c] = (float)(c - 8);
    return _mm512_loadu_ps(values);
}

static inline __m512 bf16x16_to_float(const uint16_t *h) {
    return bf16_to_floats(_mm256_loadu_si256((const void *)h));
}

/* `rows` rows x[r] (k,) float32 (1 to 4: a constant where it is inlined) times one tile: for
 * each row 16 float32 sums into acc[r], per group of `group` rows of W the activations times
 * (code - 8), times the group's scale, plus its offset times the group's sum of activations
 * (sums[r]). Each shifted and looked-up word serves every row; each row's own operations are
 * the same whatever `rows` is. */
static inline __attribute__((always_inline)) void int4_tile_rows(
        const uint32_t *tile, const float *const *x, const float *const *sums,
        const uint16_t *scale, const uint16_t *offset, long groups, long group, __m512 table,
        __m512 *acc, const int rows) {
    const long words = group / 8;
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (long g = 0; g < groups; g++) {
        __m512 part[4][4];
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < 4; j++) part[r][j] = _mm512_setzero_ps();
        for (long i = g * words; i < (g + 1) * words; i++) {
            _mm_prefetch((const char *)(tile + INT4_TILE * i) + PREFETCH_AHEAD, _MM_HINT_T0);
            const __m512i word = _mm512_loadu_si512((const void *)(tile + INT4_TILE * i));
            for (int q = 0; q < 8; q++) {
                const __m512 w = _mm512_permutexvar_ps(_mm512_srli_epi32(word, 4 * q), table);
                for (int r = 0; r < rows; r++)
                    part[r][q & 3] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[r][8 * i + q]),
                                                     part[r][q & 3]);
            }
        }
        const __m512 s = bf16x16_to_float(scale + INT4_TILE * g);
        const __m512 o = bf16x16_to_float(offset + INT4_TILE * g);
        for (int r = 0; r < rows; r++) {
            const __m512 dot = _mm512_add_ps(_mm512_add_ps(part[r][0], part[r][1]),
                                             _mm512_add_ps(part[r][2], part[r][3]));
            acc[r] = _mm512_fmadd_ps(dot, s, acc[r]);
            acc[r] = _mm512_fmadd_ps(o, _mm512_set1_ps(sums[r][g]), acc[r]);
        }
    }
}

/* out (m, n_out) bfloat16 = x (m, k) bfloat16 @ W + bias: W as int4 codes (the tiles above),
 * w = (code - 8) * scale + offset, scale and offset (tiles, k / group, 16) bfloat16 per group
 * of `group` rows (a multiple of 8) and output, bias (n_out,) bfloat16 or NULL; float32 sums,
 * one rounding to bfloat16. One row streams the codes, each read once; several rows take a
 * tile four rows at a time, each code decoded once for the four, with each row's operations
 * those of a row alone: a row gives the same numbers alone and in a batch. Returns 0, or -1
 * without memory. */
int llmcore_int4_rows(const uint32_t *codes, const uint16_t *scale, const uint16_t *offset,
                      const uint16_t *bias, const uint16_t *x, uint16_t *out, long m,
                      long n_out, long k, long group) {
    const long groups = k / group, tiles = (n_out + INT4_TILE - 1) / INT4_TILE;
    const long stride = k + groups;                 /* a row in float32, then its groups' sums */
    float *xf = aligned_alloc(LANE, (size_t)(m * stride) * sizeof(float));
    if (!xf) return -1;
    for (long r = 0; r < m; r++) {
        float *xr = xf + r * stride, *sums = xr + k;
        for (long g = 0; g < groups; g++) {
            float total = 0.f;
            for (long i = g * group; i < (g + 1) * group; i++) {
                xr[i] = bf16_to_float(x[r * k + i]);
                total += xr[i];
            }
            sums[g] = total;
        }
    }
    const __m512 table = int4_values();
    #pragma omp parallel for schedule(static)
    for (long t = 0; t < tiles; t++) {
        const uint32_t *tile = codes + t * (k / 8) * INT4_TILE;
        const uint16_t *ts = scale + t * groups * INT4_TILE;
        const uint16_t *to = offset + t * groups * INT4_TILE;
        const long n0 = INT4_TILE * t;
        const long lanes = n_out - n0 < INT4_TILE ? n_out - n0 : INT4_TILE;
        for (long r0 = 0; r0 < m;) {
            const int rows = m - r0 >= 4 ? 4 : 1;
            const float *xs[4], *sums[4];
            for (int r = 0; r < rows; r++) {
                xs[r] = xf + (r0 + r) * stride;
                sums[r] = xs[r] + k;
            }
            __m512 acc[4];
            if (rows == 4)
                int4_tile_rows(tile, xs, sums, ts, to, groups, group, table, acc, 4);
            else
                int4_tile_rows(tile, xs, sums, ts, to, groups, group, table, acc, 1);
            for (int r = 0; r < rows; r++) {
                float y[INT4_TILE];
                _mm512_storeu_ps(y, acc[r]);
                for (long l = 0; l < lanes; l++)
                    out[(r0 + r) * n_out + n0 + l] = float_to_bf16(
                        bias ? y[l] + bf16_to_float(bias[n0 + l]) : y[l]);
            }
            r0 += rows;
        }
    }
    free(xf);
    return 0;
}
