/* The gated delta rule over a tree of tokens, per (request, head), node after node from its
 * parent's state, float32, on the CPU: mtpx/models/gdn_kernel.py `tree` calls it;
 * mtpx.models.tree_forward.tree_delta_rule (the recurrent form's ops, level by level) is its
 * reference. Node t of request b starts from the state after node parents[b, t] (S0[b] for a
 * root, parents -1); parents come before their children.
 *
 * q, k [B, T, H, dk] (before the l2 norm; q is then scaled by dk^-0.5), v [B, T, H, dv], g, beta
 * [B, T, H] contiguous; S0 [B, H, dk, dv]; parents [B, T] int64. Out: o [B, T, H, dv] and ssm
 * [B, T, H, dk, dv], the state after each node. A padding node (g = beta = 0) keeps its parent's
 * state, as in the reference.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct {
    const float *q, *k, *v, *g, *beta, *S0;
    const int64_t *parents;
    float *o, *ssm;
    int64_t B, T, H, dk, dv;
} tree_t;

static inline __attribute__((always_inline)) int tree_d(const tree_t *a, int64_t item, const int64_t dv) {
    const int64_t b = item / a->H, h = item % a->H, T = a->T, H = a->H, dk = a->dk;
    float qn[dk], kn[dk], delta[dv];
    const float qscale = 1.f / sqrtf((float)dk);
    for (int64_t t = 0; t < T; t++) {
        const int64_t tok = (b * T + t) * H + h, p = a->parents[b * T + t];
        const float *q = a->q + tok * dk, *k = a->k + tok * dk, *v = a->v + tok * dv;
        const float *S = p < 0 ? a->S0 + (b * H + h) * dk * dv : a->ssm + ((b * T + p) * H + h) * dk * dv;
        float *So = a->ssm + tok * dk * dv, *o = a->o + tok * dv;
        float sq = 0.f, sk = 0.f;
        for (int64_t d = 0; d < dk; d++) { sq += q[d] * q[d]; sk += k[d] * k[d]; }
        const float rq = qscale / sqrtf(sq + 1e-6f), rk = 1.f / sqrtf(sk + 1e-6f);
        for (int64_t d = 0; d < dk; d++) { qn[d] = q[d] * rq; kn[d] = k[d] * rk; }
        const float beta = a->beta[tok], alpha = expf(a->g[tok]);
        memset(delta, 0, sizeof(float) * (size_t)dv);
        for (int64_t d = 0; d < dk; d++)
            for (int64_t e = 0; e < dv; e++) delta[e] += kn[d] * S[d * dv + e];
        for (int64_t e = 0; e < dv; e++) delta[e] = (v[e] - alpha * delta[e]) * beta;
        memset(o, 0, sizeof(float) * (size_t)dv);
        for (int64_t d = 0; d < dk; d++) {
            const float *Sd = S + d * dv;
            float *Sod = So + d * dv;
            for (int64_t e = 0; e < dv; e++) {
                Sod[e] = alpha * Sd[e] + kn[d] * delta[e];
                o[e] += qn[d] * Sod[e];
            }
        }
    }
    return 0;
}

static int tree_item(const void *ctx, int64_t item) {
    const tree_t *a = ctx;
    DISPATCH_DIM(tree_d, a, item, a->dv)
}

/* Returns 0. */
int gdn_tree(const float *q, const float *k, const float *v, const float *g, const float *beta, const float *S0,
             const int64_t *parents, float *o, float *ssm, int64_t B, int64_t T, int64_t H, int64_t dk, int64_t dv,
             int64_t num_threads) {
    tree_t job = {q, k, v, g, beta, S0, parents, o, ssm, B, T, H, dk, dv};
    return parallel_for(B * H, num_threads, tree_item, &job);
}
