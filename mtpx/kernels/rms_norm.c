/* RMSNorm of rows in one call, with the residual add before it fused in (vLLM's fused_add_rms_norm):
 * mtpx/models/norm.py's RMSNorm for float32 rows:
 *
 *     s   = x + residual              (when residual is given; written to sum_out)
 *     y   = s * (1 / sqrt(sum_d s[d]^2 / dim + eps))
 *     out = y * (1 + weight)          (unit_offset: Qwen3-Next's zero-centred weight)
 *         = weight * y                (else: Llama's)
 *
 * The sum of squares is ordered differently from torch's reduction (8 lanes, then pairs), and
 * -ffast-math may reassociate the products: results agree with torch's to float32 rounding.
 * Rows are independent: a row's result does not depend on the other rows or their number. */
#include <math.h>

#include "common.h"

typedef struct {
    const float *x, *residual, *weight;
    float *sum_out, *out;
    int64_t x_stride, residual_stride, sum_stride, out_stride, dim, unit_offset;
    float eps;
} norm_t;

static inline int norm_row(const norm_t *a, int64_t r, int64_t D) {
    const float *x = a->x + r * a->x_stride, *w = a->weight;
    float *o = a->out + r * a->out_stride;
    if (a->residual) {                  /* s = x + residual, kept for the caller's next add */
        const float *res = a->residual + r * a->residual_stride;
        float *s = a->sum_out + r * a->sum_stride;
        int64_t d = 0;
        for (; d + 8 <= D; d += 8) store8(s + d, load8(x + d) + load8(res + d));
        for (; d < D; d++) s[d] = x[d] + res[d];
        x = s;
    }
    float ss = dot(x, x, D);
    float inv = 1.f / sqrtf(ss / (float)D + a->eps);
    int64_t d = 0;
    if (a->unit_offset) {
        for (; d + 8 <= D; d += 8) store8(o + d, (load8(x + d) * inv) * (load8(w + d) + 1.f));
        for (; d < D; d++) o[d] = (x[d] * inv) * (w[d] + 1.f);
    } else {
        for (; d + 8 <= D; d += 8) store8(o + d, load8(w + d) * (load8(x + d) * inv));
        for (; d < D; d++) o[d] = w[d] * (x[d] * inv);
    }
    return 0;
}

static int norm_item(const void *ctx, int64_t r) {
    const norm_t *a = ctx;
    DISPATCH_DIM(norm_row, a, r, a->dim)
}

/* rows x dim floats: x (row stride x_stride), residual (NULL: none) and sum_out, weight [dim],
 * out; returns 0. */
int rms_norm(const float *x, int64_t x_stride, const float *residual, int64_t residual_stride, float *sum_out,
             int64_t sum_stride, const float *weight, int64_t unit_offset, float eps, float *out, int64_t out_stride,
             int64_t rows, int64_t dim, int64_t num_threads) {
    norm_t a = {x, residual, weight, sum_out, out, x_stride, residual_stride, sum_stride, out_stride, dim,
                unit_offset, eps};
    return parallel_for(rows, num_threads, norm_item, &a);
}
