/* What mtpx's C kernels share: 8 floats in GCC and Clang vector extensions (one AVX register, two
 * SSE or NEON ones), unaligned loads and stores, dot products and axpy, a vectorizable exp; and
 * parallel_for, which splits work items over POSIX threads. */
#ifndef MTPX_COMMON_H
#define MTPX_COMMON_H
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
#define MAX_VECS 32     /* head dims up to 256 keep a block's output sum in registers / L1 */
#define SCRATCH_FLOATS 16384   /* a work item's scratch up to 64 KB lives on its thread's stack, not the heap */

static inline v8 load8(const float *p) { v8 x; memcpy(&x, p, sizeof x); return x; }
static inline void store8(float *p, v8 x) { memcpy(p, &x, sizeof x); }

/* sum_d a[d] b[d] */
static inline float dot(const float *a, const float *b, int64_t D) {
    int64_t d = 0;
    float r = 0.f;
    if (D >= 8) {
        v8 acc = load8(a) * load8(b);
        for (d = 8; d + 8 <= D; d += 8) acc += load8(a + d) * load8(b + d);
        r = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    }
    for (; d < D; d++) r += a[d] * b[d];
    return r;
}

/* y += p x */
static inline void axpy(float *y, float p, const float *x, int64_t D) {
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) store8(y + d, load8(y + d) + p * load8(x + d));
    for (; d < D; d++) y[d] += p * x[d];
}

/* e^x for x in [-87, 88] (clamped; e^-87 ~ 1.6e-38), Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2,
 * a degree-5 polynomial, about 1 ulp; plain arithmetic, so GCC vectorizes the loops that call it
 * (glibc's expf is a scalar call in them) */
static inline float exp_fast(float x) {
    x = fminf(fmaxf(x, -87.f), 88.f);
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.f;
    int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, sizeof scale);
    return y * scale;
}

/* lanes i0..i7 of the 16 lanes of a then b (GCC's __builtin_shuffle, Clang's __builtin_shufflevector) */
#if defined(__clang__)
#define SHUFFLE8(a, b, i0, i1, i2, i3, i4, i5, i6, i7) __builtin_shufflevector(a, b, i0, i1, i2, i3, i4, i5, i6, i7)
#else
typedef int32_t i8_t __attribute__((vector_size(32)));
#define SHUFFLE8(a, b, i0, i1, i2, i3, i4, i5, i6, i7) __builtin_shuffle(a, b, (i8_t){i0, i1, i2, i3, i4, i5, i6, i7})
#endif

/* the 8 sums of x[0] .. x[7] in one vector (lane u: ((x_u0 + x_u1) + (x_u2 + x_u3)) + ((x_u4 + x_u5) +
 * (x_u6 + x_u7))): three rounds of shuffles and adds, where eight horizontal sums take eight */
static inline v8 hsum8(const v8 x[8]) {
    v8 p[4], q[2];
    for (int u = 0; u < 4; u++)
        p[u] = SHUFFLE8(x[2 * u], x[2 * u + 1], 0, 8, 2, 10, 4, 12, 6, 14)
             + SHUFFLE8(x[2 * u], x[2 * u + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    for (int w = 0; w < 2; w++)
        q[w] = SHUFFLE8(p[2 * w], p[2 * w + 1], 0, 1, 8, 9, 4, 5, 12, 13)
             + SHUFFLE8(p[2 * w], p[2 * w + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    return SHUFFLE8(q[0], q[1], 0, 1, 2, 3, 8, 9, 10, 11) + SHUFFLE8(q[0], q[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

/* return f(a, item, dim) with dim a constant for the common head dims, so that f (inlined) unrolls
 * its loops over dim and keeps its running sums in registers */
#define DISPATCH_DIM(f, a, item, dim)                   \
    switch (dim) {                                      \
        case 32: return f(a, item, 32);                 \
        case 64: return f(a, item, 64);                 \
        case 128: return f(a, item, 128);               \
        case 256: return f(a, item, 256);               \
        default: return f(a, item, dim);                \
    }

typedef int (*item_fn)(const void *ctx, int64_t item);   /* 0, or nonzero on failure */

typedef struct {
    item_fn fn;
    const void *ctx;
    int64_t lo, hi;
    int status;
} span_t;

static void *run_span(void *arg) {
    span_t *s = arg;
    for (int64_t it = s->lo; it < s->hi && !s->status; it++) s->status = s->fn(s->ctx, it);
    return NULL;
}

/* fn(ctx, item) for item in 0 .. items - 1, in num_threads contiguous spans (the caller runs the
 * first; a thread that cannot start has its span run by the caller). Returns the OR of the
 * spans' statuses. */
static int parallel_for(int64_t items, int64_t num_threads, item_fn fn, const void *ctx) {
    if (num_threads > items) num_threads = items;
    if (num_threads < 1) num_threads = 1;
    span_t spans[num_threads];
    pthread_t tids[num_threads];
    int started[num_threads];
    for (int64_t w = 0; w < num_threads; w++) {
        span_t s = {fn, ctx, items * w / num_threads, items * (w + 1) / num_threads, 0};
        spans[w] = s;
        started[w] = w > 0 && pthread_create(&tids[w], NULL, run_span, &spans[w]) == 0;
    }
    for (int64_t w = 0; w < num_threads; w++)
        if (!started[w]) run_span(&spans[w]);
    int status = 0;
    for (int64_t w = 0; w < num_threads; w++) {
        if (started[w]) pthread_join(tids[w], NULL);
        status |= spans[w].status;
    }
    return status;
}

#endif
