/* One decode step of a Llama-family model for a batch of sequences, one new token each.
 *
 * Why native: on a CPU a decode step of a 135M model is ~40 small PyTorch ops per layer,
 * each costing microseconds of dispatch, plus weight-bound matmuls. Here the whole step
 * (RMSNorm, q/k/v, RoPE, K/V write, paged attention, o, MLP, residuals, final norm) runs
 * in one call, on int8 weights (one scale per group of input features of an output
 * channel) with float32 activations.
 *
 * Threads: a small pool of its own (below) whose workers spin briefly between steps and
 * meet at spinning barriers. OpenMP's barriers sleep as soon as the
 * process has more OpenMP threads than cores (any other thread that ran a PyTorch op),
 * and a step has ~9 barriers a layer: with them a step took 12 ms instead of 5.
 *
 * Layouts follow engine/: projection weights row-major `[out, in]`, q/k/v and gate/up
 * fused; each layer's KV pool `[kv_heads, slots, head_dim]` in bf16 or float32. The
 * caller (engine/native_decode.py) checks shapes; this file trusts them.
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __x86_64__
#include <immintrin.h> /* _mm_pause everywhere; AVX-512 or AVX2 where the CPU has it */
#endif

typedef struct {
    const int8_t *weight; /* [out, in] */
    const float *scale;   /* [out, in / group] */
    const float *bias;    /* [out] or NULL */
    int64_t out, in, group;
} Projection;

typedef struct {
    const float *input_norm; /* [hidden] */
    const float *post_norm;  /* [hidden] */
    Projection qkv, o, gate_up, down;
    void *k_cache, *v_cache; /* [kv_heads, slots, head_dim] */
} Layer;

typedef struct {
    int64_t num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate;
    int64_t num_slots, kv_bf16;
    float eps;
    const float *cos, *sin; /* [max_positions, head_dim] */
    const float *final_norm;
    Projection lm_head;
    const Layer *layers;
} Model;

/* Bump with any change to a struct above or to an exported function's signature, and
 * ABI_VERSION in engine/native_library.py with it. */
#define BASTION_ABI_VERSION 3

/* What engine/native_library.py checks before it calls anything else: the ABI version,
 * then the sizes of the structs it mirrors by hand with ctypes. A build that answers
 * otherwise (stale, or from another source) is rebuilt, never called. */
void bastion_abi(int64_t out[4]) {
    out[0] = BASTION_ABI_VERSION;
    out[1] = (int64_t)sizeof(Projection);
    out[2] = (int64_t)sizeof(Layer);
    out[3] = (int64_t)sizeof(Model);
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* round to nearest even */
}

/* Activations are quantized per token to int16 before each projection: the int8 x int16
 * products then run on AVX-512 VNNI (32 multiply-adds per instruction, exact int32 sums),
 * and 13-15 bits per activation keep more precision than bf16's 8. `limit` keeps every
 * int32 sum from overflowing: K * 127 * limit < 2^31. */
static int32_t activation_limit(int64_t K) {
    int64_t limit = 2147483647LL / (127LL * K);
    return (int32_t)(limit > 32767 ? 32767 : limit);
}

static void quantize_row(const float *x, int64_t K, int32_t limit, int16_t *q, float *scale) {
    float peak = 0.0f;
    for (int64_t k = 0; k < K; k++) peak = fmaxf(peak, fabsf(x[k]));
    float step = peak > 0.0f ? peak / (float)limit : 1.0f, inv = 1.0f / step;
    for (int64_t k = 0; k < K; k++) q[k] = (int16_t)lrintf(x[k] * inv);
    *scale = step;
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
/* Packed [out / 16][in / 2][16][2]: one 32-byte load holds 16 output rows' weights for a pair
 * of features, and lane r of the widened vector holds row r's pair. Broadcasting a token's
 * activation pair to every lane, vpdpwssd adds both products into row r's lane, so the
 * rows' sums stay in lanes: a scale group ends with one fma for 16 rows (a [4 rows x 32
 * features] tile needed one a row, as many as its multiply-adds), and no horizontal sum. */
#define PACK_ROWS 16
#define PACK_DEPTH 2
#define SCALES_PACKED 1
#define TILE_OUT PACK_ROWS
/* Tokens per tile: 8 keep 16 int32 and 8 float32 sums in registers, and each widened
 * weight vector serves all 8. Against tiles of 32 rows by 4 tokens, a step of 8 rows of one
 * sequence took 15.2-16.5 ms against 17.6-19.7 (a row alone 6.1-6.3 against 7.7-7.9). */
#define TILE_TOKENS 8
#define PREFETCH_BYTES 1024
/* Rows n0 .. n0 + 15 for NB <= TILE_TOKENS tokens. The scales are packed like the
 * weights, [out / 16][groups][16]. Exact int32 sums within a scale group (two sets, so
 * that successive multiply-adds do not wait on each other), scaled into float32 at its
 * end. */
static inline __attribute__((always_inline)) void tile(
    const Projection *p, int64_t n0, const int16_t *xq, const float *xs, int64_t b0, int NB,
    float *y, int64_t ldy) {
    const int64_t K = p->in, G = p->group, groups = K / G;
    const int8_t *w = p->weight + n0 * K;
    const float *scale = p->scale + n0 * groups;
    __m512 sum[TILE_TOKENS];
    for (int j = 0; j < NB; j++) sum[j] = _mm512_setzero_ps();
    for (int64_t g = 0, k = 0; g < groups; g++) {
        __m512i even[TILE_TOKENS], odd[TILE_TOKENS];
        for (int j = 0; j < NB; j++) even[j] = odd[j] = _mm512_setzero_si512();
        for (const int64_t end = k + G; k < end; k += 4) {
            const int8_t *at = w + k * PACK_ROWS;
            _mm_prefetch((const char *)(at + PREFETCH_BYTES), _MM_HINT_T0);
            const __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)at));
            const __m512i w1 =
                _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(at + 32)));
            for (int j = 0; j < NB; j++) {
                int32_t pair0, pair1;
                memcpy(&pair0, xq + (b0 + j) * K + k, sizeof pair0);
                memcpy(&pair1, xq + (b0 + j) * K + k + 2, sizeof pair1);
                even[j] = _mm512_dpwssd_epi32(even[j], w0, _mm512_set1_epi32(pair0));
                odd[j] = _mm512_dpwssd_epi32(odd[j], w1, _mm512_set1_epi32(pair1));
            }
        }
        const __m512 s = _mm512_loadu_ps(scale + g * PACK_ROWS);
        for (int j = 0; j < NB; j++)
            sum[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(even[j], odd[j])), s,
                                     sum[j]);
    }
    const __m512 bias = p->bias ? _mm512_loadu_ps(p->bias + n0) : _mm512_setzero_ps();
    for (int j = 0; j < NB; j++)
        _mm512_storeu_ps(y + (b0 + j) * ldy + n0,
                         _mm512_fmadd_ps(sum[j], _mm512_set1_ps(xs[b0 + j]), bias));
}
#define FAST_TILES 1
#elif defined(__AVX2__) && defined(__FMA__)
/* The AVX-512 layout with 8 rows: packed [out / 8][in / 2][8][2], so a 16-byte load widened
 * to int16 holds 8 output rows' weights for a pair of features, lane r row r's pair.
 * Broadcasting a token's activation pair to every lane, vpmaddwd adds both products into
 * row r's lane: the rows' sums stay in lanes, each widened weight vector serves every
 * token of the tile, and there is no horizontal sum. Against tiles of 4 rows by 2 tokens
 * with the sums across lanes (AMD EPYC, Zen 3, 2 threads, 600 tokens of context), a step
 * of 16 sequences took 59 ms against 80, and 8 rows of one sequence 19 against 32. */
#define PACK_ROWS 8
#define PACK_DEPTH 2
#define SCALES_PACKED 1
#define TILE_OUT PACK_ROWS
/* Tokens per tile: 8 int32 sums and the weight and activation vectors fit the 16 registers;
 * the float32 sums are touched once a scale group. */
#define TILE_TOKENS 8
#define PREFETCH_BYTES 512
/* Rows n0 .. n0 + 7 for NB <= TILE_TOKENS tokens. The scales are packed like the weights,
 * [out / 8][groups][8]. Exact int32 sums within a scale group, scaled into float32 at its
 * end. */
static inline __attribute__((always_inline)) void tile(
    const Projection *p, int64_t n0, const int16_t *xq, const float *xs, int64_t b0, int NB,
    float *y, int64_t ldy) {
    const int64_t K = p->in, G = p->group, groups = K / G;
    const int8_t *w = p->weight + n0 * K;
    const float *scale = p->scale + n0 * groups;
    __m256 sum[TILE_TOKENS];
    for (int j = 0; j < NB; j++) sum[j] = _mm256_setzero_ps();
    for (int64_t g = 0, k = 0; g < groups; g++) {
        __m256i acc[TILE_TOKENS];
        for (int j = 0; j < NB; j++) acc[j] = _mm256_setzero_si256();
        for (const int64_t end = k + G; k < end; k += 4) {
            const int8_t *at = w + k * PACK_ROWS;
            _mm_prefetch((const char *)(at + PREFETCH_BYTES), _MM_HINT_T0);
            const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)at));
            const __m256i w1 =
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(at + 16)));
            for (int j = 0; j < NB; j++) {
                int32_t pair0, pair1;
                memcpy(&pair0, xq + (b0 + j) * K + k, sizeof pair0);
                memcpy(&pair1, xq + (b0 + j) * K + k + 2, sizeof pair1);
                const __m256i both =
                    _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_set1_epi32(pair0)),
                                     _mm256_madd_epi16(w1, _mm256_set1_epi32(pair1)));
                acc[j] = _mm256_add_epi32(acc[j], both);
            }
        }
        const __m256 s = _mm256_loadu_ps(scale + g * PACK_ROWS);
        for (int j = 0; j < NB; j++)
            sum[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[j]), s, sum[j]);
    }
    const __m256 bias = p->bias ? _mm256_loadu_ps(p->bias + n0) : _mm256_setzero_ps();
    for (int j = 0; j < NB; j++)
        _mm256_storeu_ps(y + (b0 + j) * ldy + n0,
                         _mm256_fmadd_ps(sum[j], _mm256_set1_ps(xs[b0 + j]), bias));
}
#define FAST_TILES 1
#endif

/* How packed weights are laid out: [out / rows][in / depth][rows][depth] int8 weights,
 * then whether the scales are packed as [out / rows][in / group][rows] (else [out][in /
 * group]). All 0 where every projection stays row-major. */
void bastion_pack_shape(int64_t shape[3]) {
#ifdef FAST_TILES
    shape[0] = PACK_ROWS;
    shape[1] = PACK_DEPTH;
    shape[2] = SCALES_PACKED;
#else
    shape[0] = shape[1] = shape[2] = 0;
#endif
}

/* Whether a projection of this shape must be packed (else row-major). */
int bastion_packed_layout(int64_t out, int64_t in, int64_t group) {
#ifdef FAST_TILES
    /* A tile steps through a scale group 4 features at a time. */
    return out % TILE_OUT == 0 && in % group == 0 && group % 32 == 0;
#else
    (void)out;
    (void)in;
    (void)group;
    return 0;
#endif
}

/* The part [*lo, *hi) of `total` items that thread `tid` of `n` takes. */
static void span(int tid, int n, int64_t total, int64_t *lo, int64_t *hi) {
    *lo = total * tid / n;
    *hi = total * (tid + 1) / n;
}

/* y[b * ldy + n] = dot(W[n], xq[b]) * xs[b] + bias[n], W[n]'s groups scaled, for this
 * thread's share of the rows of W; xq, xs are the activations quantized by quantize_row. */
static void project(const Projection *p, const int16_t *xq, const float *xs, int64_t batch,
                    float *y, int64_t ldy, int tid, int threads) {
    const int64_t N = p->out, K = p->in;
    int64_t lo, hi;
#ifdef FAST_TILES
    if (bastion_packed_layout(N, K, p->group)) {
        span(tid, threads, N / TILE_OUT, &lo, &hi);
        for (int64_t n0 = lo * TILE_OUT; n0 < hi * TILE_OUT; n0 += TILE_OUT) {
            int64_t b0 = 0;
            for (; b0 + TILE_TOKENS <= batch; b0 += TILE_TOKENS)
                tile(p, n0, xq, xs, b0, TILE_TOKENS, y, ldy);
            /* The rest in one pass, NB a constant in each inlined call. */
#define REST(n) case n: tile(p, n0, xq, xs, b0, n, y, ldy); break
            _Static_assert(TILE_TOKENS == 8, "a rest case per count");
            switch (batch - b0) {
            REST(7); REST(6); REST(5); REST(4); REST(3); REST(2); REST(1);
            default: break;
            }
#undef REST
        }
        return;
    }
#endif
    const int64_t G = p->group, groups = K / G;
    span(tid, threads, N, &lo, &hi);
    for (int64_t n = lo; n < hi; n++) {
        const int8_t *w = p->weight + n * K;
        for (int64_t b = 0; b < batch; b++) {
            const int16_t *xb = xq + b * K;
            float sum = 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                int32_t acc = 0;
                for (int64_t k = g * G; k < (g + 1) * G; k++) acc += (int32_t)w[k] * (int32_t)xb[k];
                sum += (float)acc * p->scale[n * groups + g];
            }
            y[b * ldy + n] = sum * xs[b] + (p->bias ? p->bias[n] : 0.0f);
        }
    }
}

static void rms_norm(const float *x, const float *weight, int64_t n, float eps, float *out) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += x[i] * x[i];
    float inv = 1.0f / sqrtf(sum / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = weight[i] * (x[i] * inv);
}

/* HF's rotate_half RoPE on one head, in place. */
static void rope(float *x, const float *cos, const float *sin, int64_t dim) {
    int64_t half = dim / 2;
    for (int64_t i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

static void cache_store(void *cache, int64_t bf16, int64_t row, const float *x, int64_t dim) {
    if (bf16) {
        uint16_t *dst = (uint16_t *)cache + row * dim;
        for (int64_t i = 0; i < dim; i++) dst[i] = float_to_bf16(x[i]);
    } else {
        memcpy((float *)cache + row * dim, x, (size_t)dim * sizeof(float));
    }
}

static inline float cache_value(const void *cache, int64_t bf16, int64_t index) {
    return bf16 ? bf16_to_float(((const uint16_t *)cache)[index]) : ((const float *)cache)[index];
}

#ifdef __AVX512F__
/* e^x to float precision (Cephes' polynomial), 16 lanes. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

static inline __mmask16 tail_mask(int64_t remaining) {
    return remaining >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << remaining) - 1u);
}
#elif defined(__AVX2__) && defined(__FMA__)
/* e^x to float precision (exp16's polynomial), 8 lanes; 2^n built in the exponent bits,
 * which the clamp keeps normal. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i two_n = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(two_n));
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* The sum of v's 8 lanes. */
static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

/* s[0:n] <- softmax(s[0:n]) */
static void softmax(float *s, int64_t n) {
    float peak = -INFINITY, total = 0.0f;
    for (int64_t t = 0; t < n; t++) peak = fmaxf(peak, s[t]);
#ifdef __AVX512F__
    __m512 sum = _mm512_setzero_ps(), top = _mm512_set1_ps(peak);
    for (int64_t t = 0; t < n; t += 16) {
        __mmask16 mask = tail_mask(n - t);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, s + t), top));
        _mm512_mask_storeu_ps(s + t, mask, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(mask, e));
    }
    total = _mm512_reduce_add_ps(sum);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 sum = _mm256_setzero_ps(), top = _mm256_set1_ps(peak);
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), top));
        _mm256_storeu_ps(s + t, e);
        sum = _mm256_add_ps(sum, e);
    }
    total = sum8(sum);
    for (; t < n; t++) total += (s[t] = expf(s[t] - peak));
#else
    for (int64_t t = 0; t < n; t++) total += (s[t] = expf(s[t] - peak));
#endif
    float inv = 1.0f / total;
    for (int64_t t = 0; t < n; t++) s[t] *= inv;
}

/* silu(gate) * up, n values. */
static void swiglu(const float *gate, const float *up, float *out, int64_t n) {
    int64_t i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(silu, _mm512_loadu_ps(up + i)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define MAX_GROUP 16
#define MAX_HEAD_DIM 256
/* Sums of the lanes of a, b, c, d, in that order. */
static inline __m128 sum4x16(__m512 a, __m512 b, __m512 c, __m512 d) {
    /* 128-bit blocks: [a0+a2, a1+a3, b0+b2, b1+b3] and the same of c, d; then each block
     * the four lanes of one input's partial sums; then each lane of a block their total. */
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    __m512 all = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88),
                               _mm512_shuffle_f32x4(ab, cd, 0xDD));
    all = _mm512_add_ps(all, _mm512_permute_ps(all, 0x4E));
    all = _mm512_add_ps(all, _mm512_permute_ps(all, 0xB1));
    const __m512i firsts = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, all));
}

/* Scores of `group` query heads against a bf16 K head, two bf16 products per lane; four
 * positions' lanes summed together (a horizontal sum each cost more than its products). */
static void scores_bf16(const float *q, int64_t group, int64_t D, const uint16_t *k_head,
                        const int64_t *slots, int64_t len, float scale, float *s) {
    __m512bh qv[MAX_GROUP][MAX_HEAD_DIM / 32];
    const int64_t nv = D / 32;
    for (int64_t i = 0; i < group; i++)
        for (int64_t v = 0; v < nv; v++) {
            const float *src = q + i * D + v * 32;
            qv[i][v] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src));
        }
    const __m128 scale4 = _mm_set1_ps(scale);
    int64_t t = 0;
    for (; t + 4 <= len; t += 4) {
        const uint16_t *key[4];
        for (int u = 0; u < 4; u++) key[u] = k_head + slots[t + u] * D;
        for (int64_t i = 0; i < group; i++) {
            __m512 acc[4];
            for (int u = 0; u < 4; u++) {
                acc[u] = _mm512_setzero_ps();
                for (int64_t v = 0; v < nv; v++)
                    acc[u] = _mm512_dpbf16_ps(
                        acc[u], qv[i][v], (__m512bh)_mm512_loadu_si512(key[u] + v * 32));
            }
            _mm_storeu_ps(s + i * len + t,
                          _mm_mul_ps(sum4x16(acc[0], acc[1], acc[2], acc[3]), scale4));
        }
    }
    for (; t < len; t++) {
        const uint16_t *key = k_head + slots[t] * D;
        for (int64_t i = 0; i < group; i++) {
            __m512 acc = _mm512_setzero_ps();
            for (int64_t v = 0; v < nv; v++)
                acc = _mm512_dpbf16_ps(acc, qv[i][v], (__m512bh)_mm512_loadu_si512(key + v * 32));
            s[i * len + t] = _mm512_reduce_add_ps(acc) * scale;
        }
    }
}

/* out[h] += sum_t p[h][t] * V[slots[t]] over HEADS heads and CHUNKS * 16 dimensions from
 * `first`, the sums in registers across all positions. */
static inline __attribute__((always_inline)) void mix_block(
    const float *p, int64_t D, const uint16_t *v_head, const int64_t *slots, int64_t len,
    float *out, int64_t first, const int HEADS, const int CHUNKS) {
    __m512 acc[4][4];
    for (int h = 0; h < HEADS; h++)
        for (int c = 0; c < CHUNKS; c++) acc[h][c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < len; t++) {
        const uint16_t *value = v_head + slots[t] * D + first;
        __m512 v[4];
        for (int c = 0; c < CHUNKS; c++)
            v[c] = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(value + 16 * c))),
                16));
        for (int h = 0; h < HEADS; h++) {
            const __m512 weight = _mm512_set1_ps(p[h * len + t]);
            for (int c = 0; c < CHUNKS; c++) acc[h][c] = _mm512_fmadd_ps(weight, v[c], acc[h][c]);
        }
    }
    for (int h = 0; h < HEADS; h++)
        for (int c = 0; c < CHUNKS; c++) _mm512_storeu_ps(out + h * D + first + 16 * c, acc[h][c]);
}

/* The same, CHUNKS fixed and the heads' count a constant in each call. */
static inline __attribute__((always_inline)) void mix_heads(
    const float *p, int64_t heads, int64_t D, const uint16_t *v_head, const int64_t *slots,
    int64_t len, float *out, int64_t first, const int CHUNKS) {
    switch (heads) {
    case 1: mix_block(p, D, v_head, slots, len, out, first, 1, CHUNKS); break;
    case 2: mix_block(p, D, v_head, slots, len, out, first, 2, CHUNKS); break;
    case 3: mix_block(p, D, v_head, slots, len, out, first, 3, CHUNKS); break;
    default: mix_block(p, D, v_head, slots, len, out, first, 4, CHUNKS); break;
    }
}

/* out[i] = sum_t p[i][t] * V[slots[t]] for each of `group` heads, bf16 V: up to 4 heads by
 * 64 dimensions at a time, so that the sums stay in registers (16 of them) while the V
 * rows stream past; D % 32 == 0. */
static void mix_bf16(const float *p, int64_t group, int64_t D, const uint16_t *v_head,
                     const int64_t *slots, int64_t len, float *out) {
    for (int64_t h = 0; h < group; h += 4) {
        const int64_t heads = group - h < 4 ? group - h : 4;
        const float *ph = p + h * len;
        float *oh = out + h * D;
        int64_t first = 0;
        for (; first + 64 <= D; first += 64)
            mix_heads(ph, heads, D, v_head, slots, len, oh, first, 4);
        if (first < D) mix_heads(ph, heads, D, v_head, slots, len, oh, first, 2);
    }
}
#define FAST_ATTENTION 1
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* Sums of the lanes of a, b, c, d, in that order. */
static inline __m128 sum4x8(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* Scores of `group` query heads against a float32 K head; four positions' lanes summed
 * together, as scores_bf16 does. D % 8 == 0. */
static void scores_f32(const float *q, int64_t group, int64_t D, const float *k_head,
                       const int64_t *slots, int64_t len, float scale, float *s) {
    const __m128 scale4 = _mm_set1_ps(scale);
    int64_t t = 0;
    for (; t + 4 <= len; t += 4) {
        const float *key[4];
        for (int u = 0; u < 4; u++) key[u] = k_head + slots[t + u] * D;
        for (int64_t i = 0; i < group; i++) {
            const float *qi = q + i * D;
            __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                             _mm256_setzero_ps()};
            for (int64_t d = 0; d < D; d += 8) {
                const __m256 qd = _mm256_loadu_ps(qi + d);
                for (int u = 0; u < 4; u++)
                    acc[u] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(key[u] + d), acc[u]);
            }
            _mm_storeu_ps(s + i * len + t,
                          _mm_mul_ps(sum4x8(acc[0], acc[1], acc[2], acc[3]), scale4));
        }
    }
    for (; t < len; t++) {
        const float *key = k_head + slots[t] * D;
        for (int64_t i = 0; i < group; i++) {
            __m256 acc = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 8)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i * D + d), _mm256_loadu_ps(key + d),
                                      acc);
            s[i * len + t] = sum8(acc) * scale;
        }
    }
}

/* out[h] = sum_t p[h][t] * V[slots[t]] over HEADS heads and CHUNKS * 8 dimensions from
 * `first`: the sums stay in registers (at most 8 of the 16) while the V rows stream past. */
static inline __attribute__((always_inline)) void mix_block_f32(
    const float *p, int64_t D, const float *v_head, const int64_t *slots, int64_t len,
    float *out, int64_t first, const int HEADS, const int CHUNKS) {
    __m256 acc[2][4];
    for (int h = 0; h < HEADS; h++)
        for (int c = 0; c < CHUNKS; c++) acc[h][c] = _mm256_setzero_ps();
    for (int64_t t = 0; t < len; t++) {
        const float *value = v_head + slots[t] * D + first;
        __m256 v[4];
        for (int c = 0; c < CHUNKS; c++) v[c] = _mm256_loadu_ps(value + 8 * c);
        for (int h = 0; h < HEADS; h++) {
            const __m256 weight = _mm256_set1_ps(p[h * len + t]);
            for (int c = 0; c < CHUNKS; c++) acc[h][c] = _mm256_fmadd_ps(weight, v[c], acc[h][c]);
        }
    }
    for (int h = 0; h < HEADS; h++)
        for (int c = 0; c < CHUNKS; c++) _mm256_storeu_ps(out + h * D + first + 8 * c, acc[h][c]);
}

/* The same for 1 or 2 heads, CHUNKS a constant in each call. */
static inline __attribute__((always_inline)) void mix_heads_f32(
    const float *p, int64_t heads, int64_t D, const float *v_head, const int64_t *slots,
    int64_t len, float *out, int64_t first, const int CHUNKS) {
    if (heads == 1) mix_block_f32(p, D, v_head, slots, len, out, first, 1, CHUNKS);
    else mix_block_f32(p, D, v_head, slots, len, out, first, 2, CHUNKS);
}

/* out[i] = sum_t p[i][t] * V[slots[t]] for each of `group` heads, float32 V: 2 heads by 32
 * dimensions at a time, then the rest by 16 and 8; D % 8 == 0. */
static void mix_f32(const float *p, int64_t group, int64_t D, const float *v_head,
                    const int64_t *slots, int64_t len, float *out) {
    for (int64_t h = 0; h < group; h += 2) {
        const int64_t heads = group - h < 2 ? group - h : 2;
        const float *ph = p + h * len;
        float *oh = out + h * D;
        int64_t first = 0;
        for (; first + 32 <= D; first += 32)
            mix_heads_f32(ph, heads, D, v_head, slots, len, oh, first, 4);
        for (; first + 16 <= D; first += 16)
            mix_heads_f32(ph, heads, D, v_head, slots, len, oh, first, 2);
        for (; first < D; first += 8) mix_heads_f32(ph, heads, D, v_head, slots, len, oh, first, 1);
    }
}
#define FAST_ATTENTION_F32 1
#endif

/* Attention of one sequence's `group` query heads (q, out: [group, D]) over K/V head `g`. */
static void attend(const Model *m, const Layer *layer, int64_t g, const float *q, int64_t group,
                   const int64_t *slots, int64_t len, float *s, float *out) {
    const int64_t D = m->head_dim, base = g * m->num_slots;
    const float scale = 1.0f / sqrtf((float)D);
#ifdef FAST_ATTENTION
    if (m->kv_bf16 && D % 32 == 0 && D <= MAX_HEAD_DIM && group <= MAX_GROUP) {
        const uint16_t *k_head = (const uint16_t *)layer->k_cache + base * D;
        const uint16_t *v_head = (const uint16_t *)layer->v_cache + base * D;
        scores_bf16(q, group, D, k_head, slots, len, scale, s);
        for (int64_t i = 0; i < group; i++) softmax(s + i * len, len);
        mix_bf16(s, group, D, v_head, slots, len, out);
        return;
    }
#endif
#ifdef FAST_ATTENTION_F32
    if (!m->kv_bf16 && D % 8 == 0) {
        const float *k_head = (const float *)layer->k_cache + base * D;
        const float *v_head = (const float *)layer->v_cache + base * D;
        scores_f32(q, group, D, k_head, slots, len, scale, s);
        for (int64_t i = 0; i < group; i++) softmax(s + i * len, len);
        mix_f32(s, group, D, v_head, slots, len, out);
        return;
    }
#endif
    for (int64_t i = 0; i < group; i++) {
        float *si = s + i * len, *oi = out + i * D;
        for (int64_t t = 0; t < len; t++) {
            float acc = 0.0f;
            for (int64_t d = 0; d < D; d++)
                acc += q[i * D + d] * cache_value(layer->k_cache, m->kv_bf16, (base + slots[t]) * D + d);
            si[t] = acc * scale;
        }
        softmax(si, len);
        memset(oi, 0, sizeof(float) * D);
        for (int64_t t = 0; t < len; t++)
            for (int64_t d = 0; d < D; d++)
                oi[d] += si[t] * cache_value(layer->v_cache, m->kv_bf16, (base + slots[t]) * D + d);
    }
}

/* ---- the thread pool ---- */

#define MAX_THREADS 256
#define SPIN_ROUNDS 20000 /* ~0.1-1 ms of pauses before a waiting thread yields or sleeps */

typedef struct Step Step;
static void run_step(Step *step, int tid, int threads);

static struct {
    pthread_mutex_t lock; /* held by the step that owns the pool */
    pthread_mutex_t sleep_lock;
    pthread_cond_t wake;
    atomic_uint_fast64_t generation; /* bumped to hand the workers a step */
    atomic_int done;                 /* workers finished with the current step */
    atomic_int arrived;              /* the barrier's count */
    atomic_uint_fast64_t barrier_generation;
    uint64_t start_generation; /* the generation before the step that started a worker */
    int workers;  /* started so far */
    int active;   /* threads in the current step, the caller included */
    Step *step;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER,
          .sleep_lock = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER};

static inline void pause_cpu(void) {
#ifdef __x86_64__
    _mm_pause();
#endif
}

/* Waits for *value to differ from `seen`: spin, then yield the core. */
static uint64_t await_change(atomic_uint_fast64_t *value, uint64_t seen) {
    uint64_t now;
    for (int round = 0; (now = atomic_load_explicit(value, memory_order_acquire)) == seen;
         round++) {
        if (round < SPIN_ROUNDS) pause_cpu();
        else sched_yield();
    }
    return now;
}

static void barrier(int threads) {
    if (threads == 1) return;
    uint64_t generation = atomic_load_explicit(&pool.barrier_generation, memory_order_acquire);
    if (atomic_fetch_add_explicit(&pool.arrived, 1, memory_order_acq_rel) == threads - 1) {
        atomic_store_explicit(&pool.arrived, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&pool.barrier_generation, 1, memory_order_release);
    } else {
        await_change(&pool.barrier_generation, generation);
    }
}

static void *worker_main(void *arg) {
    int tid = (int)(intptr_t)arg;
    /* Not pool.generation: the step that started this thread may have bumped it already. */
    uint64_t seen = pool.start_generation;
    for (;;) {
        uint64_t now = seen;
        for (int round = 0; round < SPIN_ROUNDS && now == seen; round++) {
            pause_cpu();
            now = atomic_load_explicit(&pool.generation, memory_order_acquire);
        }
        if (now == seen) { /* idle: sleep until the next step */
            pthread_mutex_lock(&pool.sleep_lock);
            while ((now = atomic_load(&pool.generation)) == seen)
                pthread_cond_wait(&pool.wake, &pool.sleep_lock);
            pthread_mutex_unlock(&pool.sleep_lock);
        }
        seen = now;
        if (tid < pool.active) run_step(pool.step, tid, pool.active);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_acq_rel);
    }
    return NULL;
}

/* A forked child has none of the parent's workers: it starts its own. */
static void forget_workers(void) {
    pthread_mutex_init(&pool.lock, NULL);
    pthread_mutex_init(&pool.sleep_lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pool.workers = 0;
}

__attribute__((constructor)) static void install_fork_handler(void) {
    pthread_atfork(NULL, NULL, forget_workers);
}

/* Runs `step` on `threads` threads (the caller is thread 0). Only one step at a time owns
 * the pool; a concurrent caller (another engine) runs its step on its own thread. */
static void run_parallel(Step *step, int threads) {
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads <= 1 || pthread_mutex_trylock(&pool.lock) != 0) {
        run_step(step, 0, 1);
        return;
    }
    pool.start_generation = atomic_load(&pool.generation);
    while (pool.workers < threads - 1) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, worker_main, (void *)(intptr_t)(pool.workers + 1)))
            break;
        pthread_detach(thread);
        pool.workers++;
    }
    if (threads > pool.workers + 1) threads = pool.workers + 1;
    pool.step = step;
    pool.active = threads;
    atomic_store(&pool.done, 0);
    pthread_mutex_lock(&pool.sleep_lock);
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.sleep_lock);
    run_step(step, 0, threads);
    for (int round = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < pool.workers;
         round++) {
        if (round < SPIN_ROUNDS) pause_cpu();
        else sched_yield();
    }
    pthread_mutex_unlock(&pool.lock);
}

/* ---- the step ---- */

struct Step {
    const Model *m;
    int64_t batch, width;
    int shared_context; /* rows of one sequence: a draft's K/V is stored before attention */
    float *hidden;
    const int64_t *positions, *context_slots;
    const int64_t *logit_rows; /* ascending; the rows whose logits are wanted */
    int64_t num_logit_rows;
    float *logits;
    float *x, *qkv, *attn, *gate_up, *delta, *scores, *xs;
    int16_t *xq;
};

/* Norm (when `norm` is given) then quantize this thread's share of the first `rows` rows
 * of `x`. */
static void prepare_rows(const Step *st, const float *x, int64_t rows, int64_t K,
                         const float *norm, int tid, int threads) {
    int64_t lo, hi;
    span(tid, threads, rows, &lo, &hi);
    const int32_t limit = activation_limit(K);
    for (int64_t b = lo; b < hi; b++) {
        const float *row = x + b * K;
        if (norm) {
            rms_norm(row, norm, K, st->m->eps, st->x + b * K);
            row = st->x + b * K;
        }
        quantize_row(row, K, limit, st->xq + b * K, st->xs + b);
    }
}

static void run_step(Step *st, int tid, int threads) {
    const Model *m = st->m;
    const int64_t H = m->hidden, D = m->head_dim, NH = m->num_heads, NKV = m->num_kv_heads;
    const int64_t I = m->intermediate, QKV = (NH + 2 * NKV) * D, group = NH / NKV;
    const int64_t batch = st->batch, width = st->width;
    int64_t lo, hi;
    for (int64_t l = 0; l < m->num_layers; l++) {
        const Layer *layer = &m->layers[l];
        prepare_rows(st, st->hidden, batch, H, layer->input_norm, tid, threads);
        barrier(threads);
        project(&layer->qkv, st->xq, st->xs, batch, st->qkv, QKV, tid, threads);
        barrier(threads);
        /* One (row, K/V head) per item: rotate its query heads and its key, store the new
         * key and value; then attend. Rows of one sequence at successive positions (a
         * speculative draft being verified) attend to each other's new K/V, so every row
         * stores before any attends. */
        span(tid, threads, batch * NKV, &lo, &hi);
        for (int64_t item = lo; item < hi; item++) {
            int64_t b = item / NKV, g = item % NKV, position = st->positions[b];
            const float *cos = m->cos + position * D, *sin = m->sin + position * D;
            float *row = st->qkv + b * QKV, *k = row + (NH + g) * D;
            const int64_t *slots = st->context_slots + b * width;
            for (int64_t h = g * group; h < (g + 1) * group; h++) rope(row + h * D, cos, sin, D);
            rope(k, cos, sin, D);
            int64_t cache_row = g * m->num_slots + slots[position];
            cache_store(layer->k_cache, m->kv_bf16, cache_row, k, D);
            cache_store(layer->v_cache, m->kv_bf16, cache_row, row + (NH + NKV + g) * D, D);
        }
        if (st->shared_context) barrier(threads);
        for (int64_t item = lo; item < hi; item++) {
            int64_t b = item / NKV, g = item % NKV, position = st->positions[b];
            float *row = st->qkv + b * QKV;
            attend(m, layer, g, row + g * group * D, group, st->context_slots + b * width,
                   position + 1, st->scores + item * group * width,
                   st->attn + b * NH * D + g * group * D);
        }
        barrier(threads);
        prepare_rows(st, st->attn, batch, NH * D, NULL, tid, threads);
        barrier(threads);
        project(&layer->o, st->xq, st->xs, batch, st->delta, H, tid, threads);
        barrier(threads);
        span(tid, threads, batch, &lo, &hi);
        for (int64_t b = lo; b < hi; b++)
            for (int64_t i = 0; i < H; i++) st->hidden[b * H + i] += st->delta[b * H + i];
        prepare_rows(st, st->hidden, batch, H, layer->post_norm, tid, threads);
        barrier(threads);
        project(&layer->gate_up, st->xq, st->xs, batch, st->gate_up, 2 * I, tid, threads);
        barrier(threads);
        for (int64_t b = lo; b < hi; b++) {
            float *act = st->gate_up + b * 2 * I; /* silu(gate) * up, over the gate half */
            swiglu(act, act + I, act, I);
            quantize_row(act, I, activation_limit(I), st->xq + b * I, st->xs + b);
        }
        barrier(threads);
        project(&layer->down, st->xq, st->xs, batch, st->delta, H, tid, threads);
        barrier(threads);
        for (int64_t b = lo; b < hi; b++)
            for (int64_t i = 0; i < H; i++) st->hidden[b * H + i] += st->delta[b * H + i];
    }
    /* Only the wanted rows go through the vocabulary projection (a fifth of a row's
     * multiply-adds): a prompt chunk's rows but its last want none. Moved up in place,
     * which the ascending order makes safe. */
    const int64_t wanted = st->num_logit_rows;
    barrier(threads); /* every thread's rows are final */
    if (tid == 0)
        for (int64_t i = 0; i < wanted; i++)
            if (st->logit_rows[i] != i)
                memcpy(st->hidden + i * H, st->hidden + st->logit_rows[i] * H, sizeof(float) * H);
    barrier(threads);
    prepare_rows(st, st->hidden, wanted, H, m->final_norm, tid, threads);
    barrier(threads);
    project(&m->lm_head, st->xq, st->xs, wanted, st->logits, m->lm_head.out, tid, threads);
}

/* hidden: [batch, hidden], the new tokens' embeddings (overwritten). context_slots:
 * [batch, width], row b holding the slots of positions 0..positions[b] (the new token's
 * slot last). Several rows may be one sequence at successive positions (a draft being
 * verified, causal within the draft). logit_rows: the num_logit_rows rows, ascending, whose
 * logits are wanted. logits: [num_logit_rows, vocab] out. Returns 0, or 1 when scratch memory
 * ran out. */
int bastion_decode_step(const Model *m, int64_t batch, float *hidden, const int64_t *positions,
                        const int64_t *context_slots, int64_t width,
                        const int64_t *logit_rows, int64_t num_logit_rows, float *logits,
                        int threads) {
    const int64_t H = m->hidden, D = m->head_dim, NH = m->num_heads, NKV = m->num_kv_heads;
    const int64_t I = m->intermediate, QKV = (NH + 2 * NKV) * D;
    int64_t widest = I > H ? I : H;
    if (NH * D > widest) widest = NH * D;
    Step st = {.m = m, .batch = batch, .width = width, .hidden = hidden,
               .positions = positions, .context_slots = context_slots,
               .logit_rows = logit_rows, .num_logit_rows = num_logit_rows, .logits = logits};
    st.x = malloc(sizeof(float) * batch * H);
    st.qkv = malloc(sizeof(float) * batch * QKV);
    st.attn = malloc(sizeof(float) * batch * NH * D);
    st.gate_up = malloc(sizeof(float) * batch * 2 * I);
    st.delta = malloc(sizeof(float) * batch * H);
    st.scores = malloc(sizeof(float) * batch * NH * width);
    st.xq = malloc(sizeof(int16_t) * batch * widest);
    st.xs = malloc(sizeof(float) * batch);
    /* Rows whose contexts start at the same slot may be one sequence's draft positions (or
     * sequences sharing a cached prefix, where the extra barrier is merely unneeded). */
    for (int64_t b = 1; b < batch && !st.shared_context; b++)
        for (int64_t a = 0; a < b; a++)
            if (context_slots[a * width] == context_slots[b * width]) {
                st.shared_context = 1;
                break;
            }
    int failed = !st.x || !st.qkv || !st.attn || !st.gate_up || !st.delta || !st.scores ||
                 !st.xq || !st.xs;
    if (!failed) run_parallel(&st, threads);
    free(st.x); free(st.qkv); free(st.attn); free(st.gate_up); free(st.delta); free(st.scores);
    free(st.xq); free(st.xs);
    return failed;
}
