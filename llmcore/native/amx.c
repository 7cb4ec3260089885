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
 * Float32 sums, each subnormal taken as zero, one rounding to bfloat16 at the end; the order
 * of the sums is the hardware's, so a row's last bit may differ from the one-row kernel's.
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

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE 16                            /* rows of a tile; 64 bytes a row */
#define CHUNK 32                           /* bfloat16 values in a tile row */
#define GROUPS_AT_MOST 6                   /* tiles 2..7 hold one group of 16 rows each */
#define AMX_AHEAD_BLOCKS 4                 /* blocks of 16 rows a thread fetches ahead */

/* 0 once Linux lets this process use AMX's tile registers, -1 where it will not. */
int llmcore_amx_ready(void) {
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 0 : -1;
}

struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Every tile 16 rows of 64 bytes: A (tile 0), B (tile 1), C of each group (tiles 2..7). */
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

/* float_to_bf16 (bf16.h) of 16 floats at once: round to nearest, ties to even, a NaN kept a
 * NaN. */
static inline __m256i floats_to_bf16(__m512 f) {
    const __m512i u = _mm512_castps_si512(f);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), u,
                             _mm512_set1_epi32(0x400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

/* x (m, k) bfloat16 -> its B tiles: (groups, chunks, 16 pairs p, 16 rows j, 2) bfloat16,
 * zeros past m and past k. Row 16g + j's chunk c is 16 pairs; pair p goes to row p of tile
 * (g, c), column j: one scatter of 16 32-bit words 64 bytes apart. */
static void vnni_tiles(const uint16_t *x, uint16_t *tiles, long m, long k, long groups,
                       long chunks) {
    memset(tiles, 0, (size_t)(groups * chunks * TILE * TILE * 2) * sizeof(uint16_t));
    const __m512i rows_apart = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32(TILE));
    for (long r = 0; r < m; r++) {
        const long g = r / TILE, j = r % TILE;
        for (long c = 0; c < chunks; c++) {
            const long i = c * CHUNK;
            const __mmask32 t = k - i >= CHUNK ? ~(__mmask32)0
                                               : (((__mmask32)1 << (k - i)) - 1);
            const __m512i pairs = _mm512_maskz_loadu_epi16(t, x + r * k + i);
            _mm512_i32scatter_epi32(tiles + ((g * chunks + c) * TILE * TILE + j) * 2,
                                    rows_apart, pairs, 4);
        }
    }
}

/* Group G's sums live in tile T = G + 2 (a tile is named by a literal number). */
#define DOT_GROUP(G, T) do { if ((G) < groups) {                                           \
        _tile_loadd(1, b + ((G) * chunks + c) * TILE * TILE * 2, 64);                      \
        _tile_dpbf16ps(T, 0, 1); } } while (0)
#define ZERO_GROUP(G, T) do { if ((G) < groups) _tile_zero(T); } while (0)
#define STORE_GROUP(G, T) do { if ((G) < groups)                                          \
        _tile_stored(T, sums + (G) * TILE * TILE, 64); } while (0)

/* out (m, n_out) bfloat16 = x (m, k) bfloat16 @ W + bias: w (n_out, k) bfloat16, each output's
 * weights in one row (onerow.c's layout), bias (n_out,) bfloat16 or NULL, 1 <= m <= 96.
 * Returns 0, or -1 without memory for the tiles of x. */
int llmcore_bf16_rows_amx(const uint16_t *w, const uint16_t *bias, const uint16_t *x,
                          uint16_t *out, long m, long n_out, long k) {
    const long groups = (m + TILE - 1) / TILE, chunks = (k + CHUNK - 1) / CHUNK;
    const long blocks = (n_out + TILE - 1) / TILE;
    if (groups > GROUPS_AT_MOST) return -1;
    uint16_t *b = aligned_alloc(64, (size_t)(groups * chunks * TILE * TILE * 2) * 2);
    if (!b) return -1;
    vnni_tiles(x, b, m, k, groups, chunks);
    int failed = 0;
    #pragma omp parallel
    {
        /* a block whose rows run past W's end or past k is copied here first, zero-padded */
        uint16_t *padded = aligned_alloc(64, (size_t)(TILE * chunks * CHUNK) * 2);
        float *sums = aligned_alloc(64, sizeof(float) * GROUPS_AT_MOST * TILE * TILE);
        if (!padded || !sums) {
            #pragma omp atomic write
            failed = 1;
        }
        configure_tiles();
        #pragma omp for schedule(static)
        for (long blk = 0; blk < blocks; blk++) {
            if (!padded || !sums) continue;
            const long n0 = blk * TILE, rows = n_out - n0 < TILE ? n_out - n0 : TILE;
            const uint16_t *a = w + n0 * k;
            long stride = k * 2;
            if (rows < TILE || k % CHUNK) {
                memset(padded, 0, (size_t)(TILE * chunks * CHUNK) * 2);
                for (long i = 0; i < rows; i++)
                    memcpy(padded + i * chunks * CHUNK, w + (n0 + i) * k, (size_t)k * 2);
                a = padded;
                stride = chunks * CHUNK * 2;
            }
            const char *ahead = (const char *)(w + (n0 + AMX_AHEAD_BLOCKS * TILE) * k);
            const long ahead_bytes = n0 + (AMX_AHEAD_BLOCKS + 1) * TILE <= n_out
                                     ? TILE * k * 2 : 0;
            ZERO_GROUP(0, 2); ZERO_GROUP(1, 3); ZERO_GROUP(2, 4);
            ZERO_GROUP(3, 5); ZERO_GROUP(4, 6); ZERO_GROUP(5, 7);
            for (long c = 0; c < chunks; c++) {
                for (long l = 0; l < 16; l++) {          /* the next block, 1 KiB a chunk */
                    const long at = (c * 16 + l) * 64;
                    if (at < ahead_bytes) _mm_prefetch(ahead + at, _MM_HINT_T0);
                }
                _tile_loadd(0, (const char *)a + c * CHUNK * 2, stride);
                DOT_GROUP(0, 2); DOT_GROUP(1, 3); DOT_GROUP(2, 4);
                DOT_GROUP(3, 5); DOT_GROUP(4, 6); DOT_GROUP(5, 7);
            }
            STORE_GROUP(0, 2); STORE_GROUP(1, 3); STORE_GROUP(2, 4);
            STORE_GROUP(3, 5); STORE_GROUP(4, 6); STORE_GROUP(5, 7);
            const __mmask16 lanes = (__mmask16)((1u << rows) - 1);
            const __m512 added = bias ? _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(
                    (__mmask32)lanes, bias + n0))), 16)) : _mm512_setzero_ps();
            const __m512i column = _mm512_mullo_epi32(
                _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                _mm512_set1_epi32(TILE));
            for (long g = 0; g < groups; g++)
                for (long j = 0; j < TILE && g * TILE + j < m; j++) {
                    /* row 16g + j of y: column j of group g's sums, outputs n0 .. n0 + 15 */
                    __m512 y = _mm512_i32gather_ps(column, sums + g * TILE * TILE + j, 4);
                    if (bias) y = _mm512_add_ps(y, added);
                    _mm512_mask_storeu_epi16(out + (g * TILE + j) * n_out + n0, (__mmask32)lanes,
                                             _mm512_castsi256_si512(floats_to_bf16(y)));
                }
        }
        _tile_release();
        free(padded);
        free(sums);
    }
    free(b);
    return failed ? -1 : 0;
}
