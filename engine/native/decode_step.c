/* One decode step of a Llama-family model for a batch of sequences, one new token each.
 *
 * Why native: on a CPU a decode step of a 135M model is ~40 small PyTorch ops per layer,
 * each costing microseconds of dispatch, plus weight-bound matmuls. Here the whole step
 * (RMSNorm, q/k/v, RoPE, K/V write, paged attention, o, MLP, residuals, final norm) runs
 * in one call and one OpenMP parallel region, on int8 weights (one scale per output
 * channel) with float32 activations.
 *
 * Layouts follow engine/: projection weights row-major `[out, in]`, q/k/v and gate/up
 * fused; each layer's KV pool `[kv_heads, slots, head_dim]` in bf16 or float32. The
 * caller (engine/native_decode.py) checks shapes; this file trusts them.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef struct {
    const int8_t *weight; /* [out, in] */
    const float *scale;   /* [out] */
    const float *bias;    /* [out] or NULL */
    int64_t out, in;
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
#define TILE_ROWS 4
#define TILE_DEPTH 32
#define PREFETCH_BYTES 1024
/* A tile of 4 weight rows by NB tokens: each weight vector is loaded and widened once. The
 * weights are packed tile by tile ([out / 4][in / 32][4][32], see bastion_packed_layout), so
 * that one tile's bytes are one sequential stream. */
static inline __attribute__((always_inline)) void tile(
    const Projection *p, int64_t n0, const int16_t *xq, const float *xs, int64_t b0, int NB,
    float *y, int64_t ldy) {
    const int64_t K = p->in;
    __m512i acc[TILE_ROWS][4];
    for (int i = 0; i < TILE_ROWS; i++)
        for (int j = 0; j < NB; j++) acc[i][j] = _mm512_setzero_si512();
    const int8_t *w = p->weight + n0 * K;
    for (int64_t k = 0; k < K; k += TILE_DEPTH, w += TILE_ROWS * TILE_DEPTH) {
        _mm_prefetch((const char *)(w + PREFETCH_BYTES), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + PREFETCH_BYTES + 64), _MM_HINT_T0);
        __m512i wv[TILE_ROWS];
        for (int i = 0; i < TILE_ROWS; i++)
            wv[i] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w + i * TILE_DEPTH)));
        for (int j = 0; j < NB; j++) {
            __m512i xv = _mm512_loadu_si512((const void *)(xq + (b0 + j) * K + k));
            for (int i = 0; i < TILE_ROWS; i++)
                acc[i][j] = _mm512_dpwssd_epi32(acc[i][j], wv[i], xv);
        }
    }
    for (int i = 0; i < TILE_ROWS; i++) {
        float s = p->scale[n0 + i], b = p->bias ? p->bias[n0 + i] : 0.0f;
        for (int j = 0; j < NB; j++)
            y[(b0 + j) * ldy + n0 + i] =
                (float)_mm512_reduce_add_epi32(acc[i][j]) * (s * xs[b0 + j]) + b;
    }
}
#define FAST_TILES 1
#endif

/* Whether a projection of this shape must be packed tile by tile (else row-major). */
int bastion_packed_layout(int64_t out, int64_t in) {
#ifdef FAST_TILES
    return out % TILE_ROWS == 0 && in % TILE_DEPTH == 0;
#else
    (void)out;
    (void)in;
    return 0;
#endif
}

/* y[b * ldy + n] = scale[n] * dot(W[n], x[b]) + bias[n], rows of W shared among threads.
 * xq, xs: scratch for the quantized activations ([batch, in] and [batch]). */
static void project(const Projection *p, const float *x, int64_t ldx, int64_t batch, float *y,
                    int64_t ldy, int16_t *xq, float *xs) {
    const int64_t N = p->out, K = p->in;
    const int32_t limit = activation_limit(K);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < batch; b++) quantize_row(x + b * ldx, K, limit, xq + b * K, xs + b);
#ifdef FAST_TILES
    if (bastion_packed_layout(N, K)) {
#pragma omp for schedule(static)
        for (int64_t n0 = 0; n0 < N; n0 += TILE_ROWS) {
            int64_t b0 = 0;
            for (; b0 + 4 <= batch; b0 += 4) tile(p, n0, xq, xs, b0, 4, y, ldy);
            for (; b0 < batch; b0++) tile(p, n0, xq, xs, b0, 1, y, ldy);
        }
        return;
    }
#endif
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const int8_t *w = p->weight + n * K;
        for (int64_t b = 0; b < batch; b++) {
            const int16_t *xb = xq + b * K;
            int32_t acc = 0;
            for (int64_t k = 0; k < K; k++) acc += (int32_t)w[k] * (int32_t)xb[k];
            y[b * ldy + n] = (float)acc * (p->scale[n] * xs[b]) + (p->bias ? p->bias[n] : 0.0f);
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
#endif
    for (; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define MAX_GROUP 16
#define MAX_HEAD_DIM 256
/* Scores of `group` query heads against a bf16 K head, two bf16 products per lane. */
static void scores_bf16(const float *q, int64_t group, int64_t D, const uint16_t *k_head,
                        const int64_t *slots, int64_t len, float scale, float *s) {
    __m512bh qv[MAX_GROUP][MAX_HEAD_DIM / 32];
    const int64_t nv = D / 32;
    for (int64_t i = 0; i < group; i++)
        for (int64_t v = 0; v < nv; v++) {
            const float *src = q + i * D + v * 32;
            qv[i][v] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src));
        }
    for (int64_t t = 0; t < len; t++) {
        const uint16_t *key = k_head + slots[t] * D;
        __m512bh kv[MAX_HEAD_DIM / 32];
        for (int64_t v = 0; v < nv; v++) kv[v] = (__m512bh)_mm512_loadu_si512(key + v * 32);
        for (int64_t i = 0; i < group; i++) {
            __m512 acc = _mm512_setzero_ps();
            for (int64_t v = 0; v < nv; v++) acc = _mm512_dpbf16_ps(acc, qv[i][v], kv[v]);
            s[i * len + t] = _mm512_reduce_add_ps(acc) * scale;
        }
    }
}

/* out[i] = sum_t p[i][t] * V[slots[t]] for each of `group` heads, bf16 V. */
static void mix_bf16(const float *p, int64_t group, int64_t D, const uint16_t *v_head,
                     const int64_t *slots, int64_t len, float *out) {
    memset(out, 0, sizeof(float) * group * D);
    for (int64_t t = 0; t < len; t++) {
        const uint16_t *value = v_head + slots[t] * D;
        for (int64_t c = 0; c < D; c += 16) {
            __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(value + c))), 16));
            for (int64_t i = 0; i < group; i++) {
                float *o = out + i * D + c;
                _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_set1_ps(p[i * len + t]), v,
                                                    _mm512_loadu_ps(o)));
            }
        }
    }
}
#define FAST_ATTENTION 1
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

/* hidden: [batch, hidden], the new tokens' embeddings (overwritten). context_slots:
 * [batch, width], row b holding the slots of positions 0..positions[b] (the new token's
 * slot last). logits: [batch, vocab] out. Returns 0, or 1 when scratch memory ran out. */
int bastion_decode_step(const Model *m, int64_t batch, float *hidden, const int64_t *positions,
                        const int64_t *context_slots, int64_t width, float *logits,
                        int threads) {
    const int64_t H = m->hidden, D = m->head_dim, NH = m->num_heads, NKV = m->num_kv_heads;
    const int64_t I = m->intermediate, QKV = (NH + 2 * NKV) * D, group = NH / NKV;
    const int64_t widest = I > H ? I : H;
    float *x = malloc(sizeof(float) * batch * H);
    float *qkv = malloc(sizeof(float) * batch * QKV);
    float *attn = malloc(sizeof(float) * batch * NH * D);
    float *gate_up = malloc(sizeof(float) * batch * 2 * I);
    float *act = malloc(sizeof(float) * batch * I);
    float *delta = malloc(sizeof(float) * batch * widest);
    float *scores = malloc(sizeof(float) * batch * NH * width);
    int16_t *xq = malloc(sizeof(int16_t) * batch * (widest > NH * D ? widest : NH * D));
    float *xs = malloc(sizeof(float) * batch);
    int failed = !x || !qkv || !attn || !gate_up || !act || !delta || !scores || !xq || !xs;
    if (!failed) {
#pragma omp parallel num_threads(threads)
        {
            for (int64_t l = 0; l < m->num_layers; l++) {
                const Layer *layer = &m->layers[l];
#pragma omp for schedule(static)
                for (int64_t b = 0; b < batch; b++)
                    rms_norm(hidden + b * H, layer->input_norm, H, m->eps, x + b * H);
                project(&layer->qkv, x, H, batch, qkv, QKV, xq, xs);
#pragma omp for schedule(static)
                for (int64_t b = 0; b < batch; b++) {
                    const float *cos = m->cos + positions[b] * D, *sin = m->sin + positions[b] * D;
                    float *row = qkv + b * QKV;
                    for (int64_t h = 0; h < NH + NKV; h++) rope(row + h * D, cos, sin, D);
                    int64_t slot = context_slots[b * width + positions[b]];
                    for (int64_t g = 0; g < NKV; g++) {
                        int64_t cache_row = g * m->num_slots + slot;
                        cache_store(layer->k_cache, m->kv_bf16, cache_row, row + (NH + g) * D, D);
                        cache_store(layer->v_cache, m->kv_bf16, cache_row,
                                    row + (NH + NKV + g) * D, D);
                    }
                }
                /* One (sequence, K/V head) per item; the barrier above made every new K/V
                 * visible. */
#pragma omp for schedule(dynamic, 1)
                for (int64_t item = 0; item < batch * NKV; item++) {
                    int64_t b = item / NKV, g = item % NKV;
                    attend(m, layer, g, qkv + b * QKV + g * group * D, group,
                           context_slots + b * width, positions[b] + 1,
                           scores + item * group * width, attn + b * NH * D + g * group * D);
                }
                project(&layer->o, attn, NH * D, batch, delta, H, xq, xs);
#pragma omp for schedule(static)
                for (int64_t b = 0; b < batch; b++) {
                    for (int64_t i = 0; i < H; i++) hidden[b * H + i] += delta[b * H + i];
                    rms_norm(hidden + b * H, layer->post_norm, H, m->eps, x + b * H);
                }
                project(&layer->gate_up, x, H, batch, gate_up, 2 * I, xq, xs);
#pragma omp for schedule(static)
                for (int64_t b = 0; b < batch; b++)
                    swiglu(gate_up + b * 2 * I, gate_up + b * 2 * I + I, act + b * I, I);
                project(&layer->down, act, I, batch, delta, H, xq, xs);
#pragma omp for schedule(static)
                for (int64_t b = 0; b < batch; b++) {
                    for (int64_t i = 0; i < H; i++) hidden[b * H + i] += delta[b * H + i];
                    if (l == m->num_layers - 1)
                        rms_norm(hidden + b * H, m->final_norm, H, m->eps, x + b * H);
                }
            }
            project(&m->lm_head, x, H, batch, logits, m->lm_head.out, xq, xs);
        }
    }
    free(x); free(qkv); free(attn); free(gate_up); free(act); free(delta); free(scores);
    free(xq); free(xs);
    return failed;
}
