/* A linear layer over a few rows, float32, on the CPU (nn.Linear's y = x w^T + b): mtpx/models/linear.py
 * calls it through mtpx/models/cpu_ops.py; F.linear is its reference.
 *
 * With few rows a linear layer reads its weight once and does little arithmetic per weight, so
 * its time is the weight's read from memory. The BLAS behind F.linear packs the weight and reads
 * it at a fraction of the core's bandwidth there (a [1, 128] x [128, 384] product took 24 us with
 * the weight in memory, against 8 us here; experiments/lean_step/floor_2x). This kernel works 8
 * output features at a time: their 8 weight rows (8 I floats) stay in L1 while every input row
 * runs over them, 8 running sums of 8 lanes reduced together (hsum8), and the weight 16 KB ahead
 * is prefetched into L2. Each output is the same sums in the same order whatever the number of
 * rows, so a row's result does not depend on the batch it is in.
 *
 * x [M, I] (row stride x_stride, unit stride over I); w [O, I] contiguous; bias [O] or NULL;
 * y [M, O] contiguous. Work is split over num_threads POSIX threads by blocks of 8 outputs
 * (mtpx calls it with one: cpu_ops._linear_fits leaves larger products to the BLAS's threads).
 */
#include <stdint.h>
#include <string.h>

#include "common.h"

#define PREFETCH_AHEAD 4096     /* floats of weight prefetched ahead of the block in use (16 KB) */

typedef struct {
    const float *x, *w, *bias;
    float *y;
    int64_t x_stride, M, O, I;
} lin_t;

static int block(const void *ctx, int64_t item) {
    const lin_t *a = ctx;
    const int64_t I = a->I, O = a->O, o = item * 8, n = O - o < 8 ? O - o : 8, I8 = I - I % 8;
    const float *wb = a->w + o * I;
    const float *end = a->w + O * I;
    for (int64_t p = 0; p < n * I; p += 16)
        if (wb + PREFETCH_AHEAD + p < end) __builtin_prefetch(wb + PREFETCH_AHEAD + p, 0, 2);
    for (int64_t m = 0; m < a->M; m++) {
        const float *xm = a->x + m * a->x_stride;
        float *ym = a->y + m * O + o;
        if (n == 8) {
            v8 acc[8] = {{0}};
            for (int64_t i = 0; i < I8; i += 8) {
                const v8 xv = load8(xm + i);
                for (int j = 0; j < 8; j++) acc[j] += xv * load8(wb + j * I + i);
            }
            v8 s = hsum8(acc);
            for (int64_t i = I8; i < I; i++)              /* the last I % 8 inputs */
                for (int j = 0; j < 8; j++) s[j] += xm[i] * wb[j * I + i];
            if (a->bias) s += load8(a->bias + o);
            store8(ym, s);
        } else {                                          /* the last O % 8 outputs */
            for (int j = 0; j < n; j++) ym[j] = dot(xm, wb + j * I, I) + (a->bias ? a->bias[o + j] : 0.f);
        }
    }
    return 0;
}

/* Returns 0. */
int linear(const float *x, int64_t x_stride, const float *w, const float *bias, float *y, int64_t M, int64_t O,
           int64_t I, int64_t num_threads) {
    lin_t a = {x, w, bias, y, x_stride, M, O, I};
    return parallel_for((O + 7) / 8, num_threads, block, &a);
}
