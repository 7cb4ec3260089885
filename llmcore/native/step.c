/* One decode step of a GPT at batch 1 in C: every block and the head for one new token.
 *
 * At batch 1 a decode step's matrix products read the weights once and are bound by memory
 * (onerow.c). What is left of the step is a few thousand numbers of arithmetic: LayerNorm,
 * attention of one query over the cached keys, GELU, the residual additions. In PyTorch that is
 * some 25 operators a block, each paying Python's and the dispatcher's few microseconds: on
 * GPT-2 small about 2.3 ms a step, a third of a w8a8 step. Here a step is one call: the same
 * operations, in the same order and with the same roundings as llmcore.fastpath.FastGPT's
 * block, on the products of onerow.c (or, for float32, the model's own (d_in, d_out)
 * matrices). The same function takes n tokens at once (llmcore_gpt_tokens): a prompt, whose
 * products pay off here only where one call multiplies all its rows (bfloat16 on AMX, amx.c;
 * llmcore/onerow_step.py sends no other prompt). Chapter 13.
 *
 * A matrix is described by struct llmcore_matrix: its kind says which kernel reads it and
 * the dtype of its activations (float32 for KIND_FP32 and KIND_W8A8, bfloat16 for the others:
 * a product's input is rounded to bfloat16 and its bfloat16 output widened, as the PyTorch
 * path's .to(dtype) does). The residual stream is float32; the KV cache holds the activations'
 * dtype. Compiled with onerow.c into one library by llmcore/onerow.py; called by
 * llmcore/onerow_step.py, which checks every pointer's tensor once, when it is built.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bf16.h"

enum { KIND_FP32 = 0, KIND_W8A8 = 1, KIND_INT8 = 2, KIND_BF16 = 3, KIND_INT4 = 4 };

typedef struct {
    long kind, d_in, d_out, group;
    const void *w;               /* codes or values */
    const void *a, *b;           /* w8a8: row sums, scale; int8: scale; int4: scale, offset */
    const void *bias;            /* (d_out,) in the activations' dtype, or NULL */
} llmcore_matrix;

typedef struct {
    const float *ln_1_scale, *ln_1_shift;
    llmcore_matrix qkv, o;
    const float *ln_2_scale, *ln_2_shift;
    llmcore_matrix up, down;
} llmcore_gpt_block;

typedef struct {
    long layers, d, heads, kv_heads, d_head, vocab;
    float eps;
    const float *token_embedding, *position_embedding;     /* (vocab, d), (positions, d) */
    const llmcore_gpt_block *blocks;
    const float *ln_f_scale, *ln_f_shift;
    llmcore_matrix head;
} llmcore_gpt;

int llmcore_w8a8_onerow(const int8_t *, const int32_t *, const float *, const float *,
                        const float *, float *, long, long);
int llmcore_int8_onerow(const int8_t *, const uint16_t *, const uint16_t *, const uint16_t *,
                        uint16_t *, long, long);
int llmcore_bf16_onerow(const uint16_t *, const uint16_t *, const uint16_t *, uint16_t *, long,
                        long);
int llmcore_bf16_rows_amx(const uint16_t *, const uint16_t *, const uint16_t *, uint16_t *,
                          long, long, long);
extern const long llmcore_amx_rows;          /* the most rows llmcore_bf16_rows_amx takes */
int llmcore_int4_rows(const uint32_t *, const uint16_t *, const uint16_t *, const uint16_t *,
                      const uint16_t *, uint16_t *, long, long, long, long);

#define FP32_ROWS 16                 /* float32 rows read at once */
#define FP32_AHEAD 512               /* bytes ahead in each float32 row */
#define ATTEND_ALONE_BELOW 65536     /* attention's multiply-adds a thread does alone */

/* y (d_out,) = x (d_in,) @ w (d_in, d_out) + bias (NULL: none), all float32, w row-major as
 * the model stores it. Each thread takes a band of rows and reads it front to back, FP32_ROWS
 * rows at a time (one load and store of its partial sums for FP32_ROWS multiply-adds, and
 * FP32_ROWS places in memory read at once: GPT-2 small's matrices streamed 1.1x as fast with
 * 16 as with 4, measured together), asking for each row's bytes FP32_AHEAD bytes before they
 * are needed; the threads' partial sums are added at the end. Each thread adds its rows in
 * order whatever FP32_ROWS is. Returns 0, or -1 without memory for them. */
int llmcore_fp32_onerow(const float *w, const float *bias, const float *x, float *y,
                        long d_out, long d_in) {
    const int threads = omp_get_max_threads();
    const long stride = (d_out + 15) / 16 * 16;
    float *partial = aligned_alloc(64, sizeof(float) * (size_t)(threads * stride));
    if (!partial) return -1;
    #pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        const long per = (d_in / FP32_ROWS + n - 1) / n * FP32_ROWS;
        const long i0 = t * per < d_in ? t * per : d_in;
        const long i1 = i0 + per < d_in && t < n - 1 ? i0 + per : d_in;
        float *acc = partial + t * stride;
        memset(acc, 0, sizeof(float) * (size_t)stride);
        for (long i = i0; i < i1; i += FP32_ROWS) {
            const long rows = i1 - i < FP32_ROWS ? i1 - i : FP32_ROWS;
            const float *row[FP32_ROWS];
            __m512 xi[FP32_ROWS];
            for (long r = 0; r < FP32_ROWS; r++) {
                row[r] = w + (i + (r < rows ? r : 0)) * d_out;
                xi[r] = _mm512_set1_ps(r < rows ? x[i + r] : 0.f);
            }
            for (long j = 0; j < d_out; j += 16) {
                const __mmask16 m = first_lanes(d_out - j);
                __m512 a = _mm512_load_ps(acc + j);
                for (int r = 0; r < FP32_ROWS; r++) {
                    _mm_prefetch((const char *)(row[r] + j) + FP32_AHEAD, _MM_HINT_T0);
                    a = _mm512_fmadd_ps(xi[r], _mm512_maskz_loadu_ps(m, row[r] + j), a);
                }
                _mm512_store_ps(acc + j, a);
            }
        }
    }
    for (long j = 0; j < d_out; j++) {
        float total = 0.f;
        for (int t = 0; t < threads; t++) total += partial[t * stride + j];
        y[j] = bias ? total + bias[j] : total;
    }
    free(partial);
    return 0;
}

static inline int bf16_activations(long kind) {
    return kind == KIND_INT8 || kind == KIND_BF16 || kind == KIND_INT4;
}

/* y (d_out,) float32 = x (d_in,) float32 @ m: bfloat16 kinds round x to bfloat16 first and give
 * bfloat16 results (widened exactly). scratch: d_in + d_out uint16. Returns the kernel's
 * status (0, or -1 without memory). */
static int product(const llmcore_matrix *m, const float *x, float *y, uint16_t *scratch) {
    const long n = m->d_out, k = m->d_in;
    if (m->kind == KIND_FP32)
        return llmcore_fp32_onerow(m->w, m->bias, x, y, n, k);
    if (m->kind == KIND_W8A8)
        return llmcore_w8a8_onerow(m->w, m->a, m->b, m->bias, x, y, n, k);
    uint16_t *xb = scratch, *yb = scratch + k;
    narrow_to_bf16(x, xb, k);
    int status = 0;
    if (m->kind == KIND_INT8)
        status = llmcore_int8_onerow(m->w, m->a, m->bias, xb, yb, n, k);
    else if (m->kind == KIND_BF16)
        status = llmcore_bf16_onerow(m->w, m->bias, xb, yb, n, k);
    else
        status = llmcore_int4_rows(m->w, m->a, m->b, m->bias, xb, yb, 1, n, k, m->group);
    widen_from_bf16(yb, y, n);
    return status;
}

/* y (n, d_out) = x (n, d_in) @ m, row by row as product() does: one row is product()'s; a
 * bfloat16 matrix takes up to llmcore_amx_rows rows at a time on AMX (amx.c: each weight read
 * once for all of them; the caller has checked that this process may use AMX); another kind
 * takes its rows one at a time. scratch: llmcore_amx_rows (d_in + d_out) uint16. Returns 0,
 * or -1. */
static int product_rows(const llmcore_matrix *m, const float *x, float *y, long n,
                        uint16_t *scratch) {
    const long d_out = m->d_out, k = m->d_in;
    if (m->kind != KIND_BF16 || n == 1) {
        int status = 0;
        for (long r = 0; r < n && !status; r++)
            status = product(m, x + r * k, y + r * d_out, scratch);
        return status;
    }
    int status = 0;
    for (long r0 = 0; r0 < n && !status; r0 += llmcore_amx_rows) {
        const long rows = n - r0 < llmcore_amx_rows ? n - r0 : llmcore_amx_rows;
        uint16_t *xb = scratch, *yb = scratch + rows * k;
        narrow_to_bf16(x + r0 * k, xb, rows * k);
        status = llmcore_bf16_rows_amx(m->w, m->bias, xb, yb, rows, d_out, k);
        widen_from_bf16(yb, y + r0 * d_out, rows * d_out);
    }
    return status;
}

/* out (d,) = LayerNorm(x (d,)): (x - mean) / sqrt(var + eps) * scale + shift, float32, the
 * variance the mean of squared deviations. */
static void layer_norm(const float *x, const float *scale, const float *shift, float eps,
                       long d, float *out) {
    double total = 0.0;
    for (long i = 0; i < d; i++) total += x[i];
    const float mean = (float)(total / d);
    double squares = 0.0;
    for (long i = 0; i < d; i++) {
        const float c = x[i] - mean;
        squares += (double)c * c;
    }
    const float inverse = 1.f / sqrtf((float)(squares / d) + eps);
    for (long i = 0; i < d; i++) out[i] = (x[i] - mean) * inverse * scale[i] + shift[i];
}

/* exp(v) for 16 floats: 2^(v log2 e) as 2^n 2^f, n an integer and |f| <= 1/2, 2^f by a
 * polynomial of degree 6 (relative error about 2e-7); inf past 88.7, 0 below -103. */
static inline __m512 exp16(__m512 v) {
    const __m512 t = _mm512_mul_ps(_mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-104.f)),
                                                 _mm512_set1_ps(89.f)),
                                   _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945f));
    __m512 p = _mm512_set1_ps(1.f / 720.f);              /* e^(f ln 2) by its Taylor series */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 120.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 24.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 6.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    const __m512 e = _mm512_scalef_ps(p, n);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), e, v);   /* NaN */
}

/* GELU's tanh form, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), written as
 * x / (1 + exp(-2u)) (the same function), in place on x (n,); rounded to bfloat16 when the
 * activations are. */
static void gelu_tanh(float *x, long n, int bf16) {
    const __m512 c = _mm512_set1_ps(-2.f * 0.7978845608028654f);
    for (long i = 0; i < n; i += 16) {
        const __mmask16 t = first_lanes(n - i);
        const __m512 v = _mm512_maskz_loadu_ps(t, x + i);
        const __m512 inner = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(v, v), v),
                                             _mm512_set1_ps(0.044715f), v);
        const __m512 g = _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.f),
                                                        exp16(_mm512_mul_ps(c, inner))));
        _mm512_mask_storeu_ps(x + i, t, g);
    }
    if (bf16)
        round_to_bf16(x, n);
}

/* One query's attention in one layer: q (heads, d_head), the new k, v (kv_heads, d_head)
 * written at row `start` of keys, values (kv_heads, cap, d_head), float32 or (bf16) bfloat16;
 * each head attends over rows 0 .. start (softmax of q.k / sqrt(d_head), float32) into out
 * (heads, d_head), rounded to bfloat16 when the cache holds bfloat16. scores: (heads, cap)
 * float32 scratch. */
static void attend(const llmcore_gpt *g, const float *q, const float *k, const float *v,
                   void *keys, void *values, long cap, int bf16, long start, float *out,
                   float *scores) {
    const long dh = g->d_head, group = g->heads / g->kv_heads;
    for (long h = 0; h < g->kv_heads; h++)
        for (long i = 0; i < dh; i++) {
            const long at = (h * cap + start) * dh + i;
            if (bf16) {
                ((uint16_t *)keys)[at] = float_to_bf16(k[h * dh + i]);
                ((uint16_t *)values)[at] = float_to_bf16(v[h * dh + i]);
            } else {
                ((float *)keys)[at] = k[h * dh + i];
                ((float *)values)[at] = v[h * dh + i];
            }
        }
    const long n = start + 1;
    const float scale = 1.f / sqrtf((float)dh);
    #pragma omp parallel for schedule(static) if (n * dh * g->heads >= ATTEND_ALONE_BELOW)
    for (long h = 0; h < g->heads; h++) {
        const long rows = (h / group) * cap * dh;       /* this head's K/V rows begin */
        float *s = scores + h * cap, most = -INFINITY;
        for (long j = 0; j < n; j++) {
            __m512 dot = _mm512_setzero_ps();
            for (long i = 0; i < dh; i += 16) {
                const __mmask16 t = first_lanes(dh - i);
                dot = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(t, q + h * dh + i),
                                      load_floats(keys, rows + j * dh + i, t, bf16), dot);
            }
            s[j] = _mm512_reduce_add_ps(dot) * scale;
            most = s[j] > most ? s[j] : most;
        }
        float total = 0.f;
        for (long j = 0; j < n; j += 16) {
            const __mmask16 t = first_lanes(n - j);
            const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, s + j),
                                                 _mm512_set1_ps(most)));
            _mm512_mask_storeu_ps(s + j, t, e);
            total += _mm512_mask_reduce_add_ps(t, e);
        }
        float *o = out + h * dh;
        for (long i = 0; i < dh; i += 16) {
            const __mmask16 t = first_lanes(dh - i);
            __m512 sum = _mm512_setzero_ps();
            for (long j = 0; j < n; j++)
                sum = _mm512_fmadd_ps(_mm512_set1_ps(s[j]),
                                      load_floats(values, rows + j * dh + i, t, bf16), sum);
            sum = _mm512_div_ps(sum, _mm512_set1_ps(total));
            _mm512_mask_storeu_ps(o + i, t, sum);
        }
        if (bf16)
            round_to_bf16(o, dh);
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A timed product of n rows: its seconds added to *spent when spent is not NULL. */
static int timed(const llmcore_matrix *m, const float *x, float *y, long n, uint16_t *scratch,
                 double *spent) {
    if (!spent) return product_rows(m, x, y, n, scratch);
    const double begin = now();
    const int status = product_rows(m, x, y, n, scratch);
    *spent += now() - begin;
    return status;
}

/* n tokens through every block and the head (a prompt, or n = 1: one decode step): token
 * i at position + i, its K and V written at row start + i of the cache keys, values (layers,
 * kv_heads, capacity, d_head), float32 or (bf16_cache) bfloat16, each token attending over
 * the rows up to its own (the causal rule); the last token's logits into logits (vocab,)
 * float32. Each token's row takes the same operations as it would alone, but for the
 * products, which take all n rows at once (product_rows). product_seconds: NULL, or where the
 * seconds spent in the matrix products are added. Returns 0, -1 without memory. */
int llmcore_gpt_tokens(const llmcore_gpt *g, void *keys, void *values, long capacity,
                       long bf16_cache, const int64_t *tokens, long n, long position,
                       long start, float *logits, double *product_seconds) {
    const long d = g->d, dh = g->d_head;
    const long q_width = g->heads * dh, kv_width = g->kv_heads * dh;
    long widest = 0;                                   /* the widest product, in or out */
    for (long l = 0; l < g->layers; l++) {
        const llmcore_matrix *ms[4] = {&g->blocks[l].qkv, &g->blocks[l].o, &g->blocks[l].up,
                                       &g->blocks[l].down};
        for (int i = 0; i < 4; i++)
            widest = ms[i]->d_out > widest ? ms[i]->d_out : widest;
    }
    widest = widest > d ? widest : d;
    const long out_row = q_width > d ? q_width : d;
    const long rows_at_once = n < llmcore_amx_rows ? n : llmcore_amx_rows;
    float *x = malloc(sizeof(float) * (size_t)(n * d));
    float *normed = malloc(sizeof(float) * (size_t)(n * d));
    float *wide = malloc(sizeof(float) * (size_t)(n * widest));
    float *out = malloc(sizeof(float) * (size_t)(n * out_row));
    float *scores = malloc(sizeof(float) * (size_t)(g->heads * capacity));
    const long layer_size = g->kv_heads * capacity * dh * (bf16_cache ? 2 : 4);   /* bytes */
    uint16_t *scratch = malloc(sizeof(uint16_t) * (size_t)(
        rows_at_once * 2 * (widest > g->vocab ? widest : g->vocab) + d));
    int status = (x && normed && wide && out && scores && scratch) ? 0 : -1;
    for (long r = 0; r < n && !status; r++) {
        const float *te = g->token_embedding + tokens[r] * d;
        const float *pe = g->position_embedding + (position + r) * d;
        for (long i = 0; i < d; i++) x[r * d + i] = te[i] + pe[i];
    }
    for (long l = 0; l < g->layers && !status; l++) {
        const llmcore_gpt_block *b = &g->blocks[l];
        const int bf16 = bf16_activations(b->qkv.kind);
        const long qkv_width = b->qkv.d_out, f = b->up.d_out;
        for (long r = 0; r < n; r++)
            layer_norm(x + r * d, b->ln_1_scale, b->ln_1_shift, g->eps, d, normed + r * d);
        status |= timed(&b->qkv, normed, wide, n, scratch, product_seconds);
        for (long r = 0; r < n && !status; r++) {             /* token r sees rows <= its own */
            const float *qkv = wide + r * qkv_width;
            attend(g, qkv, qkv + q_width, qkv + q_width + kv_width,
                   (char *)keys + l * layer_size, (char *)values + l * layer_size, capacity,
                   (int)bf16_cache, start + r, out + r * q_width, scores);
        }
        status |= timed(&b->o, out, normed, n, scratch, product_seconds);
        for (long i = 0; i < n * d; i++) x[i] += normed[i];
        for (long r = 0; r < n; r++)
            layer_norm(x + r * d, b->ln_2_scale, b->ln_2_shift, g->eps, d, normed + r * d);
        status |= timed(&b->up, normed, wide, n, scratch, product_seconds);
        gelu_tanh(wide, n * f, bf16);
        status |= timed(&b->down, wide, normed, n, scratch, product_seconds);
        for (long i = 0; i < n * d; i++) x[i] += normed[i];
    }
    if (!status) {
        layer_norm(x + (n - 1) * d, g->ln_f_scale, g->ln_f_shift, g->eps, d, normed);
        status |= timed(&g->head, normed, logits, 1, scratch, product_seconds);
    }
    free(x); free(normed); free(wide); free(out); free(scores); free(scratch);
    return status;
}

/* One decode step: llmcore_gpt_tokens for the one token `token`. */
int llmcore_gpt_step(const llmcore_gpt *g, void *keys, void *values, long capacity,
                     long bf16_cache, long token, long position, long start, float *logits,
                     double *product_seconds) {
    const int64_t one = token;
    return llmcore_gpt_tokens(g, keys, values, capacity, bf16_cache, &one, 1, position, start,
                              logits, product_seconds);
}
