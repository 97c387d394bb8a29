/* One token of a Gated DeltaNet layer per request, float32, on the CPU, between its input and
 * output projections: mtpx/models/gdn_kernel.py calls it (mtpx/kernels/build.py builds it);
 * GatedDeltaNet.forward's torch ops (mtpx/models/deltanet.py, mtpx/models/gated_delta_rule.py)
 * are its reference. Per request b, in the order of that reference:
 *
 *   q, k, v, z, b, a  Hugging Face Qwen3-Next's per-key-head grouping of qkvz and ba
 *   conv              silu(depthwise causal conv) over the stored K-1 inputs and q|k|v; the
 *                     stored inputs shift by one (conv_state, in place)
 *   beta, g           sigmoid(b), -exp(A_log) softplus(a + dt_bias)
 *   q, k              l2-normalised (x rsqrt(sum x^2 + 1e-6)), q scaled by Dk^-0.5; a key head
 *                     serves nv / nk value heads
 *   S                 alpha S + beta k (v - alpha S^T k)^T, alpha = exp(g) (ssm, in place)
 *   o                 S^T q, then RMSNormGated: o rsqrt(mean o^2 + eps) norm_w silu(z)
 *
 * qkvz [B, 2 nk dk + 2 nv dv] (row stride qkvz_stride), ba [B, 2 nv] (row stride ba_stride);
 * conv_w [C, K], C = 2 nk dk + nv dv; conv_state [R, C, K-1] and ssm [R, nv, dk, dv] read at
 * rows [B]; valid [B] uint8 (0: padding); A_log, dt_bias [nv]; norm_w [dv]; out [B, nv dv].
 * The new states go to conv_out and ssm_out: at rows[b] when out_by_batch is 0 (in place when
 * they are conv_state and ssm; padding rows are then left untouched), else at row b of
 * [B, C, K-1] and [B, nv, dk, dv] tensors (padding rows get their state unchanged). Requests are
 * split over num_threads POSIX threads (their rows are distinct, or padding, which writes
 * nothing in place).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct {
    const float *qkvz, *ba, *conv_w;
    const float *conv_state, *ssm;
    float *conv_out, *ssm_out;
    int64_t out_by_batch;
    const int64_t *rows;
    const uint8_t *valid;
    const float *A_log, *dt_bias, *norm_w;
    float eps;
    float *out;
    int64_t qkvz_stride, ba_stride, nk, nv, dk, dv, K, B;
} gdn_t;

/* exp_fast (common.h), not expf: plain arithmetic, so that the loops over silu vectorize */
static inline float silu(float x) { return x / (1.f + exp_fast(-x)); }
static inline float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }   /* F.softplus */

/* conv[c] = mixed[c] w[c, K-1] + sum_j st[c, j] w[c, j], the conv's sums before silu; inlined with K
 * a constant where it is 4, so that the taps unroll and the loop over channels vectorizes */
static inline __attribute__((always_inline)) void conv_sums(float *restrict conv, const float *restrict mixed,
                                                            const float *restrict st, const float *restrict w,
                                                            int64_t C, const int64_t K) {
    for (int64_t c = 0; c < C; c++) {
        float acc = mixed[c] * w[c * K + K - 1];
        for (int64_t j = 0; j < K - 1; j++) acc += st[c * (K - 1) + j] * w[c * K + j];
        conv[c] = acc;
    }
}

static inline __attribute__((always_inline)) int step_d(const gdn_t *a, int64_t b, const int64_t dv) {
    const int64_t nk = a->nk, nv = a->nv, dk = a->dk, K = a->K, r = nv / nk;
    const int64_t C = 2 * nk * dk + nv * dv, group = 2 * dk + 2 * r * dv;
    const float *x = a->qkvz + b * a->qkvz_stride, *ba = a->ba + b * a->ba_stride;
    const int valid = a->valid[b];
    const size_t need = (size_t)(2 * C + 2 * dk + 2 * dv);
    float small[need <= SCRATCH_FLOATS ? need : 1];  /* the scratch on the stack, where it is small */
    float *buf = need <= SCRATCH_FLOATS ? small : malloc(sizeof(float) * need);
    if (!buf) return 1;
    float *mixed = buf, *conv = mixed + C, *qn = conv + C, *kn = qn + dk, *kv = kn + dk, *o = kv + dv;
    /* q | k | v in conv channel order, from the per-key-head grouping [q, k, v (r heads), z (r heads)] */
    for (int64_t i = 0; i < nk; i++) {
        memcpy(mixed + i * dk, x + i * group, sizeof(float) * (size_t)dk);
        memcpy(mixed + nk * dk + i * dk, x + i * group + dk, sizeof(float) * (size_t)dk);
        memcpy(mixed + 2 * nk * dk + i * r * dv, x + i * group + 2 * dk, sizeof(float) * (size_t)(r * dv));
    }
    const int64_t orow = a->out_by_batch ? b : a->rows[b];
    const int copy = a->out_by_batch;                /* padding rows still get their state */
    const int64_t K1 = K - 1, n = C * K1;
    const float *cs = a->conv_state + a->rows[b] * n;
    float *cso = a->conv_out + orow * n;
    if (K == 4)                                      /* the common width, its taps constants */
        conv_sums(conv, mixed, cs, a->conv_w, C, 4);
    else
        conv_sums(conv, mixed, cs, a->conv_w, C, K);
    for (int64_t c = 0; c < C; c++) conv[c] = silu(conv[c]);
    /* the next request's conv inputs come into the cache while this one computes, a line at a time
     * (a burst of prefetches stalls the loads behind it); its ssm rows, read front to back, the
     * hardware prefetches by itself (prefetching them too measured slower) */
    const int64_t nrow = b + 1 < a->B ? a->rows[b + 1] : -1;
    const float *cs_next = nrow >= 0 ? a->conv_state + nrow * n : NULL;
    const int64_t lines = cs_next ? (n + 15) / 16 : 0;
    if (valid && K1 > 0) {
        /* each channel's K-1 inputs shift by one: the flat [C, K-1] block moves down a float
         * (memmove: in place when conv_out is conv_state), then each channel's last is its input */
        memmove(cso, cs + 1, sizeof(float) * (size_t)(n - 1));
        for (int64_t c = 0; c < C; c++) {
            if (c < lines) __builtin_prefetch(cs_next + 16 * c);
            cso[c * K1 + K1 - 1] = mixed[c];
        }
    } else if (copy) {
        memcpy(cso, cs, sizeof(float) * (size_t)n);
    }
    const float qscale = 1.f / sqrtf((float)dk);
    for (int64_t h = 0; h < nv; h++) {
        const int64_t kh = h / r, j = h % r;
        const float *q = conv + kh * dk, *k = conv + nk * dk + kh * dk, *v = conv + 2 * nk * dk + h * dv;
        const float *z = x + kh * group + 2 * dk + r * dv + j * dv;
        float sq = 0.f, sk = 0.f;
        for (int64_t d = 0; d < dk; d++) { sq += q[d] * q[d]; sk += k[d] * k[d]; }
        const float rq = qscale / sqrtf(sq + 1e-6f), rk = 1.f / sqrtf(sk + 1e-6f);
        for (int64_t d = 0; d < dk; d++) { qn[d] = q[d] * rq; kn[d] = k[d] * rk; }
        const float *S = a->ssm + (a->rows[b] * nv + h) * dk * dv;
        float *So = a->ssm_out + (orow * nv + h) * dk * dv;
        memset(o, 0, sizeof(float) * (size_t)dv);
        if (valid) {
            const float beta = 1.f / (1.f + expf(-ba[kh * 2 * r + j]));
            const float g = -expf(a->A_log[h]) * softplus(ba[kh * 2 * r + r + j] + a->dt_bias[h]);
            const float alpha = expf(g);
            if (dv % 8 == 0 && dv <= 8 * MAX_VECS) {  /* the same sums, with kv and o in registers */
                /* two running sums per vector (even and odd d), so that twice the multiply-adds
                 * are in flight (one chain per vector waited on each add's latency) */
                v8 kvv[MAX_VECS], kv1[MAX_VECS], ov[MAX_VECS], ov1[MAX_VECS];
                for (int64_t c = 0; c < dv / 8; c++) kvv[c] = kv1[c] = ov[c] = ov1[c] = (v8){0};
                int64_t d = 0;
                for (; d + 1 < dk; d += 2)
                    for (int64_t c = 0; c < dv / 8; c++) {
                        kvv[c] += kn[d] * load8(S + d * dv + 8 * c);
                        kv1[c] += kn[d + 1] * load8(S + (d + 1) * dv + 8 * c);
                    }
                for (; d < dk; d++)
                    for (int64_t c = 0; c < dv / 8; c++) kvv[c] += kn[d] * load8(S + d * dv + 8 * c);
                for (int64_t c = 0; c < dv / 8; c++) kvv[c] = (load8(v + 8 * c) - alpha * (kvv[c] + kv1[c])) * beta;
                for (d = 0; d + 1 < dk; d += 2) {
                    for (int64_t c = 0; c < dv / 8; c++) {
                        v8 s0 = alpha * load8(S + d * dv + 8 * c) + kn[d] * kvv[c];
                        v8 s1 = alpha * load8(S + (d + 1) * dv + 8 * c) + kn[d + 1] * kvv[c];
                        store8(So + d * dv + 8 * c, s0);
                        store8(So + (d + 1) * dv + 8 * c, s1);
                        ov[c] += qn[d] * s0;
                        ov1[c] += qn[d + 1] * s1;
                    }
                }
                for (; d < dk; d++)
                    for (int64_t c = 0; c < dv / 8; c++) {
                        v8 sn = alpha * load8(S + d * dv + 8 * c) + kn[d] * kvv[c];
                        store8(So + d * dv + 8 * c, sn);
                        ov[c] += qn[d] * sn;
                    }
                for (int64_t c = 0; c < dv / 8; c++) store8(o + 8 * c, ov[c] + ov1[c]);
            } else {
            memset(kv, 0, sizeof(float) * (size_t)dv);
            for (int64_t d = 0; d < dk; d++)
                for (int64_t e = 0; e < dv; e++) kv[e] += kn[d] * S[d * dv + e];
            for (int64_t e = 0; e < dv; e++) kv[e] = (v[e] - alpha * kv[e]) * beta;      /* delta */
            for (int64_t d = 0; d < dk; d++) {
                const float *Sd = S + d * dv;
                float *Sod = So + d * dv;
                for (int64_t e = 0; e < dv; e++) {
                    Sod[e] = alpha * Sd[e] + kn[d] * kv[e];
                    o[e] += qn[d] * Sod[e];
                }
            }
            }
        } else {
            for (int64_t d = 0; d < dk; d++)
                for (int64_t e = 0; e < dv; e++) o[e] += qn[d] * S[d * dv + e];
            if (copy) memcpy(So, S, sizeof(float) * (size_t)(dk * dv));
        }
        float ss = 0.f;
        for (int64_t e = 0; e < dv; e++) ss += o[e] * o[e];
        const float rn = 1.f / sqrtf(ss / (float)dv + a->eps);
        float *out = a->out + (b * nv + h) * dv;
        for (int64_t e = 0; e < dv; e++) out[e] = silu(z[e]);
        for (int64_t e = 0; e < dv; e++) out[e] = a->norm_w[e] * (o[e] * rn) * out[e];
    }
    if (buf != small) free(buf);
    return 0;
}

static int step(const void *ctx, int64_t b) {
    const gdn_t *a = ctx;
    DISPATCH_DIM(step_d, a, b, a->dv)
}

/* Returns 0, or 1 when memory ran out (some requests are then not updated). */
int gdn_decode(const float *qkvz, int64_t qkvz_stride, const float *ba, int64_t ba_stride, const float *conv_w,
               const float *conv_state, const float *ssm, float *conv_out, float *ssm_out, int64_t out_by_batch,
               const int64_t *rows, const uint8_t *valid, const float *A_log, const float *dt_bias,
               const float *norm_w, float eps, float *out, int64_t B, int64_t nk, int64_t nv, int64_t dk,
               int64_t dv, int64_t K, int64_t num_threads) {
    gdn_t job = {qkvz, ba, conv_w, conv_state, ssm, conv_out, ssm_out, out_by_batch, rows, valid, A_log, dt_bias,
                 norm_w, eps, out, qkvz_stride, ba_stride, nk, nv, dk, dv, K, B};
    return parallel_for(B, num_threads, step, &job);
}

/* The gated delta rule over a verification window, per (request, head), token after token from
 * the state before the window: mtpx/models/gdn_kernel.py `window` calls it;
 * mtpx.models.gated_delta_rule.window_gated_delta_rule is its reference. It keeps what that one
 * keeps (mtpx.cache.state.WindowStates): the l2-normalised keys, v_new_t = beta_t (v_t - alpha_t
 * S_{t-1}^T k_t) (the recurrence's delta, which equals the chunked form's v_new) and G, the
 * cumulative log decay, so S_t = exp(G_t) S_0 + sum_{j<=t} exp(G_t - G_j) k_j v_new_j^T.
 *
 * q, k [B, T, H, dk], v [B, T, H, dv], g, beta [B, T, H] contiguous (q, k before the l2 norm; q
 * is then scaled by dk^-0.5); S0 [B, H, dk, dv]; valid [B, T] uint8 or NULL (all valid). Out: o
 * [B, T, H, dv]; kn [B, H, T, dk]; v_new [B, H, T, dv]; G [B, H, T].
 *
 * A padding token (valid 0; its g and beta are 0, so the state stays) is not computed: its o, kn
 * and v_new are 0 and its G the one before it, so a window costs its real tokens (a ragged step's
 * rows verify different numbers of drafts on one padded grid) and the kept states are what the
 * reference keeps for every token a commit can select (v_new of a padding token is 0 there too).
 */
typedef struct {
    const float *q, *k, *v, *g, *beta, *S0;
    const uint8_t *valid;
    float *o, *kn, *v_new, *G;
    int64_t B, T, H, dk, dv;
} window_t;

static inline __attribute__((always_inline)) int window_d(const window_t *a, int64_t item, const int64_t dv) {
    const int64_t b = item / a->H, h = item % a->H, T = a->T, H = a->H, dk = a->dk;
    float *S = malloc(sizeof(float) * (size_t)(dk * dv + dk + dv));
    if (!S) return 1;
    float *qn = S + dk * dv, *delta = qn + dk;
    memcpy(S, a->S0 + (b * H + h) * dk * dv, sizeof(float) * (size_t)(dk * dv));
    const float qscale = 1.f / sqrtf((float)dk);
    float Gt = 0.f;
    for (int64_t t = 0; t < T; t++) {
        const int64_t tok = (b * T + t) * H + h;
        const float *q = a->q + tok * dk, *k = a->k + tok * dk, *v = a->v + tok * dv;
        float *kn = a->kn + ((b * H + h) * T + t) * dk, *vn = a->v_new + ((b * H + h) * T + t) * dv;
        float *o = a->o + tok * dv;
        if (a->valid && !a->valid[b * T + t]) {
            memset(o, 0, sizeof(float) * (size_t)dv);
            memset(kn, 0, sizeof(float) * (size_t)dk);
            memset(vn, 0, sizeof(float) * (size_t)dv);
            a->G[(b * H + h) * T + t] = Gt;
            continue;
        }
        float sq = 0.f, sk = 0.f;
        for (int64_t d = 0; d < dk; d++) { sq += q[d] * q[d]; sk += k[d] * k[d]; }
        const float rq = qscale / sqrtf(sq + 1e-6f), rk = 1.f / sqrtf(sk + 1e-6f);
        for (int64_t d = 0; d < dk; d++) { qn[d] = q[d] * rq; kn[d] = k[d] * rk; }
        const float g = a->g[tok], beta = a->beta[tok], alpha = expf(g);
        Gt += g;
        a->G[(b * H + h) * T + t] = Gt;
        memset(delta, 0, sizeof(float) * (size_t)dv);
        for (int64_t d = 0; d < dk; d++)
            for (int64_t e = 0; e < dv; e++) delta[e] += kn[d] * S[d * dv + e];
        for (int64_t e = 0; e < dv; e++) { delta[e] = (v[e] - alpha * delta[e]) * beta; vn[e] = delta[e]; }
        memset(o, 0, sizeof(float) * (size_t)dv);
        for (int64_t d = 0; d < dk; d++) {
            float *Sd = S + d * dv;
            for (int64_t e = 0; e < dv; e++) {
                Sd[e] = alpha * Sd[e] + kn[d] * delta[e];
                o[e] += qn[d] * Sd[e];
            }
        }
    }
    free(S);
    return 0;
}

static int window_item(const void *ctx, int64_t item) {
    const window_t *a = ctx;
    DISPATCH_DIM(window_d, a, item, a->dv)
}

/* Returns 0, or 1 when memory ran out. */
int gdn_window(const float *q, const float *k, const float *v, const float *g, const float *beta, const float *S0,
               const uint8_t *valid, float *o, float *kn, float *v_new, float *G, int64_t B, int64_t T, int64_t H,
               int64_t dk, int64_t dv, int64_t num_threads) {
    window_t job = {q, k, v, g, beta, S0, valid, o, kn, v_new, G, B, T, H, dk, dv};
    return parallel_for(B * H, num_threads, window_item, &job);
}
