/* Paged causal attention of short query windows (decode, verification), float32, on the CPU:
 * mtpx/attention/cpu_kernel.py calls it (mtpx/kernels/build.py builds it); mtpx/attention/torch_backend.py's
 * `cached_attention` (gather, then scaled_dot_product_attention) is its reference.
 *
 * q      [B, T, H, D]   contiguous
 * kc, vc [NB, S, Hkv, D] contiguous: the paged cache, read in place (no gather)
 * block_table [B, >= blocks read], row stride bt_stride (elements)
 * positions [B, T] int64, valid [B, T] uint8 (0: padding, attends position 0 only)
 * out    [B, T, H, D]   written
 *
 * Query (b, t, h) attends the keys of positions 0 .. positions[b, t] of request b with kv head
 * h / (H / Hkv) (grouped-query heads as repeat_interleave) and scale `scale`: a softmax over the
 * scores, then the weighted sum of the values, in one pass over the blocks with a running
 * maximum and sum (the online softmax of Milakov & Gimelshein 2018, as FlashAttention). One work
 * item is a request; each block's keys and values are read once, front to back, for all T x H
 * queries that share them, while the next block is prefetched. Items are split over
 * `num_threads` POSIX threads.
 */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct {
    const float *q, *kc, *vc;
    const int64_t *block_table, *positions;
    const uint8_t *valid;
    float *out;
    int64_t B, T, H, Hkv, D, S, bt_stride;
    float scale;
} job_t;


/* Every line of n floats at p, into the cache ahead of its use. */
static inline void prefetch_span(const float *p, int64_t n) {
    for (int64_t off = 0; off < n; off += 16) __builtin_prefetch(p + off);
}

/* One request: all its heads, so that each block's keys and values (S x Hkv x D floats each) are
 * read once, front to back, while the next block (or the next request's first) is prefetched.
 * Inlined with D a constant for the common head dims, so that the loops over D unroll and the
 * running sums stay in registers. */
static inline __attribute__((always_inline)) int attend_d(const job_t *a, int64_t b, const int64_t D) {
    const int64_t G = a->H / a->Hkv, T = a->T, S = a->S, H = a->H, NQ = T * H, row = a->Hkv * D;
    const int64_t *bt = a->block_table + b * a->bt_stride;
    const int vec = D % 8 == 0 && D <= 8 * MAX_VECS;
    /* per query (t, h), i = t H + h: scaled q, running max m, running sum l, running output acc
     * (online softmax) */
    float *buf = malloc(sizeof(float) * (size_t)(2 * NQ * D + 2 * NQ + S + 8));
    int64_t *n_of = malloc(sizeof(int64_t) * (size_t)NQ);
    if (!buf || !n_of) { free(buf); free(n_of); return 1; }
    float *qs = buf, *acc = qs + NQ * D, *m = acc + NQ * D, *l = m + NQ, *sc = l + NQ;
    int64_t nmax = 1;
    for (int64_t t = 0; t < T; t++) {
        int64_t n = a->valid[b * T + t] ? a->positions[b * T + t] + 1 : 1;
        if (n > nmax) nmax = n;
        for (int64_t h = 0; h < H; h++) {
            int64_t i = t * H + h;
            const float *qr = a->q + (b * NQ + i) * D;
            for (int64_t d = 0; d < D; d++) qs[i * D + d] = qr[d] * a->scale;
            n_of[i] = n;
            m[i] = -FLT_MAX;
            l[i] = 0.f;
        }
    }
    memset(acc, 0, sizeof(float) * (size_t)(NQ * D));
    const int64_t nblocks = (nmax + S - 1) / S, block = S * row;
    for (int64_t blk = 0; blk < nblocks; blk++) {
        const float *kblk = a->kc + bt[blk] * block, *vblk = a->vc + bt[blk] * block;
        const int64_t next = blk + 1 < nblocks ? bt[blk + 1] : b + 1 < a->B ? bt[a->bt_stride] : -1;
        const float *kn = next >= 0 ? a->kc + next * block : NULL, *vn = next >= 0 ? a->vc + next * block : NULL;
        const int64_t share = (block + NQ - 1) / NQ;   /* each query's share of the next block's floats */
        for (int64_t i = 0; i < NQ; i++) {
            if (kn && i * share < block) {
                int64_t n = block - i * share < share ? block - i * share : share;
                prefetch_span(kn + i * share, n);
                prefetch_span(vn + i * share, n);
            }
            int64_t cnt = n_of[i] - blk * S;
            if (cnt <= 0) continue;
            if (cnt > S) cnt = S;
            const int64_t hk = (i % H) / G;
            const float *qi = qs + i * D, *kb = kblk + hk * D, *vb = vblk + hk * D;
            int64_t jj = 0;
            if (vec) {           /* 8 keys at a time: 8 independent sums, not one dependent chain */
                for (; jj + 8 <= cnt; jj += 8) {
                    v8 s8[8] = {0};
                    for (int64_t c = 0; c < D / 8; c++) {
                        v8 qc = load8(qi + 8 * c);
                        for (int u = 0; u < 8; u++) s8[u] += qc * load8(kb + (jj + u) * row + 8 * c);
                    }
                    store8(sc + jj, hsum8(s8));
                }
            }
            for (; jj < cnt; jj++) sc[jj] = dot(qi, kb + jj * row, D);
            float bm = sc[0];
            for (jj = 1; jj < cnt; jj++) bm = sc[jj] > bm ? sc[jj] : bm;
            float *ai = acc + i * D;
            if (bm > m[i]) {                          /* a new maximum: rescale what was summed */
                float r = expf(m[i] - bm);
                l[i] *= r;
                for (int64_t d = 0; d < D; d++) ai[d] *= r;
                m[i] = bm;
            }
            for (jj = 0; jj < cnt; jj++) sc[jj] = exp_fast(sc[jj] - m[i]);
            for (jj = 0; jj < cnt; jj++) l[i] += sc[jj];
            if (vec) {                                /* the block's sum in registers */
                v8 av[MAX_VECS];
                for (int64_t c = 0; c < D / 8; c++) av[c] = load8(ai + 8 * c);
                for (jj = 0; jj < cnt; jj++) {
                    const float *vr = vb + jj * row;
                    for (int64_t c = 0; c < D / 8; c++) av[c] += sc[jj] * load8(vr + 8 * c);
                }
                for (int64_t c = 0; c < D / 8; c++) store8(ai + 8 * c, av[c]);
            } else {
                for (jj = 0; jj < cnt; jj++) axpy(ai, sc[jj], vb + jj * row, D);
            }
        }
    }
    for (int64_t i = 0; i < NQ; i++) {
        float inv = 1.f / l[i], *o = a->out + (b * NQ + i) * D;
        for (int64_t d = 0; d < D; d++) o[d] = acc[i * D + d] * inv;
    }
    free(buf);
    free(n_of);
    return 0;
}

static int attend(const void *ctx, int64_t item) {
    const job_t *a = ctx;
    DISPATCH_DIM(attend_d, a, item, a->D)
}

/* Returns 0, or 1 when memory ran out (out is then incomplete). */
int paged_attention(const float *q, const float *kc, const float *vc, const int64_t *block_table,
                    int64_t bt_stride, const int64_t *positions, const uint8_t *valid, float *out,
                    int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t S, float scale,
                    int64_t num_threads) {
    job_t job = {q, kc, vc, block_table, positions, valid, out, B, T, H, Hkv, D, S, bt_stride, scale};
    return parallel_for(B, num_threads, attend, &job);
}
