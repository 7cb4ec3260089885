/* llmcore's bfloat16 product of a few rows on AMX, Intel's tile unit: a prompt in "bf16".
 *
 * One row of a decode step reads each weight once and does one multiply-add with it: the
 * product is bound by the bytes it reads (onerow.c). A prompt of m rows does m multiply-adds
 * per weight, and from a few rows on, AVX-512's multiply-adds bind it instead (onerow.c's
 * llmcore_bf16_rows). AMX's TDPBF16PS multiplies a 16 x 32 tile of bfloat16 by a 32 x 16 one
 * into a 16 x 16 tile of float32 sums in one instruction, 8192 multiply-adds: the weights are
 * read once, at memory speed, for up to 96 rows.
 *
 * The weights are the one-row kernels' own (d_out, d_in) bfloat16 rows: 16 outputs' rows, 32
 * values each, are a tile A as they lie in memory (a row stride of d_in values). The rows of x
 * are laid out once per call as tiles B, "VNNI" pairs: tile (g, c) row p holds, for each of
 * 16 rows j of group g, the pair x[16g + j][32c + 2p], x[16g + j][32c + 2p + 1]. Then
 * C[i][j] += A B sums W[n0 + i][32c ..] . x[16g + j][32c ..]: C is y's block transposed.
 * Both layouts are a 16 x 16 transposition of 32-bit words, done in registers (transpose16).
 * Each thread reads several blocks of W at once (llmcore_bf16_rows_amx). Float32 sums, each
 * subnormal taken as zero, one rounding to bfloat16 at the end; the order of the sums is the
 * hardware's, so a row's last bit may differ from the one-row kernel's.
 *
 * Linux lends a process AMX's registers only once asked (arch_prctl ARCH_REQ_XCOMP_PERM):
 * llmcore_amx_ready asks, and llmcore/onerow.py uses this kernel only where it said yes.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "bf16.h"
#include "runs.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE 16                            /* rows of a tile; 64 bytes a row */
#define CHUNK 32                           /* bfloat16 values in a tile row */
#define SUM_TILES 6                        /* tiles 2..7 hold sums; 0 is A, 1 is B */
#define GROUPS_AT_MOST SUM_TILES           /* groups of 16 rows of x, a sum tile each */

const long llmcore_amx_rows = GROUPS_AT_MOST * TILE;  /* the most rows a call takes */

/* 0 once Linux lets this process use AMX's tile registers, -1 where it will not. */
int llmcore_amx_ready(void) {
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 0 : -1;
}

struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Every tile 16 rows of 64 bytes: A (tile 0), B (tile 1), sums (tiles 2..7). */
static void configure_tiles(void) {
    struct tile_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; t++) {
        config.rows[t] = TILE;
        config.colsb[t] = 64;
    }
    _tile_loadconfig(&config);
}

/* The 16 x 16 matrix of 32-bit words whose row i is r[i], transposed: t[j] is its column j.
 * Four rounds of 16 shuffles: pairs of rows, then of pairs, then 128-bit lanes twice. */
static inline void transpose16(const __m512i r[16], __m512i t[16]) {
    __m512i a[16], b[16];
    for (int i = 0; i < 16; i += 2) {              /* a: words of rows i, i + 1 interleaved */
        a[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        a[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int q = 0; q < 16; q += 4)                /* b[q + e]: word 4L + e of rows q .. q+3 */
        for (int h = 0; h < 2; h++) {
            b[q + 2 * h] = _mm512_unpacklo_epi64(a[q + h], a[q + 2 + h]);
            b[q + 2 * h + 1] = _mm512_unpackhi_epi64(a[q + h], a[q + 2 + h]);
        }
    for (int e = 0; e < 4; e++) {                  /* column 4L + e, lane L of each quarter */
        const __m512i low01 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0x44);
        const __m512i high01 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0xee);
        const __m512i low23 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0x44);
        const __m512i high23 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0xee);
        t[e] = _mm512_shuffle_i32x4(low01, low23, 0x88);
        t[4 + e] = _mm512_shuffle_i32x4(low01, low23, 0xdd);
        t[8 + e] = _mm512_shuffle_i32x4(high01, high23, 0x88);
        t[12 + e] = _mm512_shuffle_i32x4(high01, high23, 0xdd);
    }
}

/* x (m, k) bfloat16 -> its B tiles: (groups, chunks, 16 pairs p, 16 rows j, 2) bfloat16,
 * zeros past m and past k. Chunk c of rows 16g .. 16g + 15 is a 16 x 16 matrix of pairs
 * (row j, pair p); tile (g, c) is that matrix transposed. */
static void vnni_tiles(const uint16_t *x, uint16_t *tiles, long m, long k, long groups,
                       long chunks) {
    for (long g = 0; g < groups; g++)
        for (long c = 0; c < chunks; c++) {
            const long i = c * CHUNK;
            const __mmask32 t = k - i >= CHUNK ? ~(__mmask32)0
                                               : (((__mmask32)1 << (k - i)) - 1);
            __m512i rows[TILE], pairs[TILE];
            for (long j = 0; j < TILE; j++)
                rows[j] = g * TILE + j < m
                          ? _mm512_maskz_loadu_epi16(t, x + (g * TILE + j) * k + i)
                          : _mm512_setzero_si512();
            transpose16(rows, pairs);
            __m512i *tile = (__m512i *)(tiles + (g * chunks + c) * TILE * TILE * 2);
            for (long p = 0; p < TILE; p++) _mm512_store_si512(tile + p, pairs[p]);
        }
}

/* Tiles 2..7 hold sums: a tile is named by a literal number, so these take the number and
 * switch on it (one branch beside an instruction of 16 x 16 x 32 multiply-adds). */
static inline void zero_sums(long t) {
    switch (t) {
    case 2: _tile_zero(2); break;  case 3: _tile_zero(3); break;
    case 4: _tile_zero(4); break;  case 5: _tile_zero(5); break;
    case 6: _tile_zero(6); break;  default: _tile_zero(7); break;
    }
}

static inline void add_product(long t) {                  /* sums t += tile 0 . tile 1 */
    switch (t) {
    case 2: _tile_dpbf16ps(2, 0, 1); break;  case 3: _tile_dpbf16ps(3, 0, 1); break;
    case 4: _tile_dpbf16ps(4, 0, 1); break;  case 5: _tile_dpbf16ps(5, 0, 1); break;
    case 6: _tile_dpbf16ps(6, 0, 1); break;  default: _tile_dpbf16ps(7, 0, 1); break;
    }
}

static inline void store_sums(long t, float *to) {
    switch (t) {
    case 2: _tile_stored(2, to, 64); break;  case 3: _tile_stored(3, to, 64); break;
    case 4: _tile_stored(4, to, 64); break;  case 5: _tile_stored(5, to, 64); break;
    case 6: _tile_stored(6, to, 64); break;  default: _tile_stored(7, to, 64); break;
    }
}

/* The sums of `streams` blocks of W (tiles A at a[s], stride[s] bytes apart) by each of
 * `groups` groups of x's B tiles (b): block s and group g in sum tile 2 + s * groups + g,
 * over the chunks in order. Inlined with groups and streams constant, so that every tile
 * number is one (the switches fold away). */
static inline __attribute__((always_inline)) void multiply_blocks(
        const char *const *a, const long *stride, const uint16_t *b, long chunks,
        const long groups, const long streams) {
    for (long t = 0; t < streams * groups; t++) zero_sums(2 + t);
    for (long c = 0; c < chunks; c++) {
        if (groups == 1) _tile_loadd(1, b + c * TILE * TILE * 2, 64);
        for (long s = 0; s < streams; s++) {
            _tile_loadd(0, a[s] + c * CHUNK * 2, stride[s]);
            for (long g = 0; g < groups; g++) {
                if (groups > 1) _tile_loadd(1, b + (g * chunks + c) * TILE * TILE * 2, 64);
                add_product(2 + s * groups + g);
            }
        }
    }
}

/* Where block blk's 16 rows of W begin as tiles A, and their stride in bytes: W's own rows,
 * or, for a block whose rows run past W's end or past k, a zero-padded copy in *padded
 * (TILE * chunks * CHUNK values, allocated at its first use). NULL without memory. */
static const char *block_tiles(const uint16_t *w, long blk, long n_out, long k, long chunks,
                               uint16_t **padded, long *stride) {
    const long n0 = blk * TILE, rows = n_out - n0 < TILE ? n_out - n0 : TILE;
    if (rows == TILE && k % CHUNK == 0) {
        *stride = k * 2;
        return (const char *)(w + n0 * k);
    }
    if (!*padded) *padded = aligned_alloc(64, (size_t)(TILE * chunks * CHUNK) * 2);
    if (!*padded) return NULL;
    memset(*padded, 0, (size_t)(TILE * chunks * CHUNK) * 2);
    for (long i = 0; i < rows; i++)
        memcpy(*padded + i * chunks * CHUNK, w + (n0 + i) * k, (size_t)k * 2);
    *stride = chunks * CHUNK * 2;
    return (const char *)*padded;
}

/* Block blk of y: sums (groups, 16 outputs i, 16 rows j) float32, each group's transposed
 * to rows of y, + bias, rounded to bfloat16 into out (m, n_out) at outputs 16 blk ..
 * 16 blk + 15. */
static void write_block(const float *sums, const uint16_t *bias, uint16_t *out, long blk,
                        long m, long n_out, long groups) {
    const long n0 = blk * TILE, rows = n_out - n0 < TILE ? n_out - n0 : TILE;
    const __mmask16 lanes = (__mmask16)((1u << rows) - 1);
    const __m512 added = bias ? load_bf16s(bias + n0, lanes) : _mm512_setzero_ps();
    for (long g = 0; g < groups; g++) {
        __m512i by_output[TILE], by_row[TILE];
        for (long i = 0; i < TILE; i++)
            by_output[i] = _mm512_load_si512(sums + (g * TILE + i) * TILE);
        transpose16(by_output, by_row);
        for (long j = 0; j < TILE && g * TILE + j < m; j++) {
            /* row 16g + j of y, outputs n0 .. n0 + 15 */
            __m512 y = _mm512_castsi512_ps(by_row[j]);
            if (bias) y = _mm512_add_ps(y, added);
            _mm512_mask_storeu_epi16(out + (g * TILE + j) * n_out + n0, (__mmask32)lanes,
                                     _mm512_castsi256_si512(floats_to_bf16(y)));
        }
    }
}

/* out (m, n_out) bfloat16 = x (m, k) bfloat16 @ W + bias: w (n_out, k) bfloat16, each output's
 * weights in one row (onerow.c's layout), bias (n_out,) bfloat16 or NULL, 1 <= m <= 96.
 * Returns 0, or -1 without memory (for the tiles of x, or a padded block).
 *
 * W is read in blocks of 16 outputs. Each thread takes a share of the blocks and reads
 * SUM_TILES / groups runs of its share at once (runs.h's my_runs), each block with a sum tile
 * per group of rows: a prompt of up to 16 rows reads six places in memory at once (GPT-2
 * small's 49 matrices for 16 rows in 8.2 ms, 30 GB/s, against 10.1 ms reading one block at a
 * time and laying out x and y with gathers and scatters, measured together).
 * Each block's sums are the same instructions in the same order whichever blocks it is read
 * with: the numbers do not depend on the runs. */
int llmcore_bf16_rows_amx(const uint16_t *w, const uint16_t *bias, const uint16_t *x,
                          uint16_t *out, long m, long n_out, long k) {
    const long groups = (m + TILE - 1) / TILE, chunks = (k + CHUNK - 1) / CHUNK;
    const long blocks = (n_out + TILE - 1) / TILE;
    if (groups > GROUPS_AT_MOST) return -1;
    const long streams = SUM_TILES / groups;             /* blocks read at once */
    uint16_t *b = aligned_alloc(64, (size_t)(groups * chunks * TILE * TILE * 2) * 2);
    if (!b) return -1;
    vnni_tiles(x, b, m, k, groups, chunks);
    int failed = 0;
    #pragma omp parallel
    {
        uint16_t *padded[SUM_TILES] = {NULL};           /* for blocks past W's edges */
        float *sums = aligned_alloc(64, sizeof(float) * GROUPS_AT_MOST * TILE * TILE);
        int ok = sums != NULL;
        configure_tiles();
        long first, end, run;
        my_runs(blocks, streams, &first, &end, &run);
        for (long r = 0; r < run && ok; r++) {
            const char *a[SUM_TILES];
            long stride[SUM_TILES];
            for (long s = 0; s < streams && ok; s++) {
                a[s] = block_tiles(w, row_to_read(first, end, run, s, r), n_out, k, chunks,
                                   &padded[s], &stride[s]);
                ok = a[s] != NULL;
            }
            if (!ok) break;
            switch (groups) {                    /* constants, for multiply_blocks */
            case 1: multiply_blocks(a, stride, b, chunks, 1, 6); break;
            case 2: multiply_blocks(a, stride, b, chunks, 2, 3); break;
            case 3: multiply_blocks(a, stride, b, chunks, 3, 2); break;
            case 4: multiply_blocks(a, stride, b, chunks, 4, 1); break;
            case 5: multiply_blocks(a, stride, b, chunks, 5, 1); break;
            default: multiply_blocks(a, stride, b, chunks, 6, 1); break;
            }
            for (long s = 0; s < streams; s++) {
                const long blk = run_row(first, end, run, s, r);
                if (blk < 0) continue;                   /* a block read twice, stored once */
                for (long g = 0; g < groups; g++)
                    store_sums(2 + s * groups + g, sums + g * TILE * TILE);
                write_block(sums, bias, out, blk, m, n_out, groups);
            }
        }
        if (!ok) {
            #pragma omp atomic write
            failed = 1;
        }
        _tile_release();
        for (long s = 0; s < SUM_TILES; s++) free(padded[s]);
        free(sums);
    }
    free(b);
    return failed ? -1 : 0;
}
