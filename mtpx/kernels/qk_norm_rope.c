/* The query and key heads of an attention layer made ready in one call: each head's RMSNorm
 * (Qwen3's and Qwen3-Next's q_norm / k_norm, optional) and then partial rotary embedding, float32
 * tokens of mtpx/models/attention.py's GatedAttention; `RMSNorm` (mtpx/models/norm.py) and
 * `apply_rope` (mtpx/models/rope.py) are the reference:
 *
 *     y      = x * (1 / sqrt(sum_d x[d]^2 / D + eps)), then y (1 + w) (unit_offset) or w y
 *     out[i] = y[i] cos[i] - y[i + R/2] sin[i]             i <  R/2   (rotate_half pairing)
 *     out[i] = y[i] cos[i] + y[i - R/2] sin[i]             R/2 <= i < R
 *     out[i] = y[i]                                        R <= i < D
 *
 * q [N, H, D] and k [N, Hkv, D] with any token and head strides (unit stride over D: q may be
 * a view of q_proj's interleaved query / gate output); cos, sin [N, R] contiguous; q_out
 * [N, H, D] and k_out [N, Hkv, D] contiguous. Tokens are independent of each other and their
 * number; results agree with the torch ops' to float32 rounding (sums ordered in 8 lanes). */
#include <math.h>
#include <stdint.h>

#include "common.h"

typedef struct {
    const float *q, *k, *q_w, *k_w, *cos, *sin;
    float *q_out, *k_out;
    int64_t q_tok, q_head, k_tok, k_head, H, Hkv, D, R, unit_offset;
    float eps;
} qk_t;

static inline __attribute__((always_inline)) void head(const qk_t *a, const float *x, const float *w, const float *c,
                                                       const float *s, float *o, const int64_t D) {
    float y[D];
    if (w) {
        const float inv = 1.f / sqrtf(dot(x, x, D) / (float)D + a->eps);
        for (int64_t d = 0; d < D; d++) y[d] = a->unit_offset ? (x[d] * inv) * (w[d] + 1.f) : w[d] * (x[d] * inv);
    } else {
        for (int64_t d = 0; d < D; d++) y[d] = x[d];
    }
    const int64_t R = a->R, half = R / 2;
    for (int64_t i = 0; i < half; i++) {
        o[i] = y[i] * c[i] - y[i + half] * s[i];
        o[i + half] = y[i + half] * c[i + half] + y[i] * s[i + half];
    }
    for (int64_t d = R; d < D; d++) o[d] = y[d];
}

static inline __attribute__((always_inline)) int token_d(const qk_t *a, int64_t n, const int64_t D) {
    const float *c = a->cos + n * a->R, *s = a->sin + n * a->R;
    for (int64_t h = 0; h < a->H; h++)
        head(a, a->q + n * a->q_tok + h * a->q_head, a->q_w, c, s, a->q_out + (n * a->H + h) * D, D);
    for (int64_t h = 0; h < a->Hkv; h++)
        head(a, a->k + n * a->k_tok + h * a->k_head, a->k_w, c, s, a->k_out + (n * a->Hkv + h) * D, D);
    return 0;
}

static int token(const void *ctx, int64_t n) {
    const qk_t *a = ctx;
    DISPATCH_DIM(token_d, a, n, a->D)
}

/* N tokens (above); q_w, k_w [D] or NULL (no norm); returns 0. */
int qk_norm_rope(const float *q, int64_t q_tok, int64_t q_head, const float *k, int64_t k_tok, int64_t k_head,
                 const float *q_w, const float *k_w, int64_t unit_offset, float eps, const float *cos, const float *sin,
                 float *q_out, float *k_out, int64_t N, int64_t H, int64_t Hkv, int64_t D, int64_t R,
                 int64_t num_threads) {
    qk_t a = {q, k, q_w, k_w, cos, sin, q_out, k_out, q_tok, q_head, k_tok, k_head, H, Hkv, D, R, unit_offset, eps};
    return parallel_for(N, num_threads, token, &a);
}
