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
 * scores (normalised once the row is complete, not online: the windows are short), then the
 * weighted sum of the values. One work item is a request; each block's keys and values are read
 * from memory once, for all its queries. Items are split over `num_threads` POSIX threads.
 *
 * `paged_tree_attention` is the same with a tree mask (mtpx/attention/tree_attention.py, whose
 * gather and masked SDPA is its reference): ancestors [B, T, NT] uint8, base, prefix_end [B] int64;
 * query (b, t) attends the positions p < prefix_end[b] and the positions base[b] + j with
 * ancestors[b, t, j] (0 <= j < NT), each read up to its last allowed position; masked keys get
 * weight 0 (excluded from the softmax's max and sum). `positions` is not read there.
 */
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
    const uint8_t *anc;                    /* NULL: causal; else the tree mask (module doc) */
    const int64_t *base, *prefix_end;
    int64_t NT;
} job_t;

/* Whether query row (b, t) of a tree mask may read position p (module doc). */
static inline int allowed(const job_t *a, int64_t b, int64_t t, int64_t p) {
    const int64_t j = p - a->base[b];
    return p < a->prefix_end[b] || (j >= 0 && j < a->NT && a->anc[(b * a->T + t) * a->NT + j]);
}

/* Positions read by query row (b, t): up to its last allowed position (at least position 0). */
static int64_t reach(const job_t *a, int64_t b, int64_t t) {
    if (!a->valid[b * a->T + t]) return 1;
    if (!a->anc) return a->positions[b * a->T + t] + 1;
    int64_t n = a->prefix_end[b] > 1 ? a->prefix_end[b] : 1;
    for (int64_t j = 0; j < a->NT; j++)
        if (a->anc[(b * a->T + t) * a->NT + j] && a->base[b] + j + 1 > n) n = a->base[b] + j + 1;
    return n;
}

/* The softmax of the n scores si of query row (b, t) in place; masked positions (tree mask) get 0. */
static void softmax_row(const job_t *a, int64_t b, int64_t t, float *si, int64_t n) {
    float mx = -3.0e38f, l = 0.f;
    if (!a->anc) {
        for (int64_t j = 0; j < n; j++) mx = si[j] > mx ? si[j] : mx;
        for (int64_t j = 0; j < n; j++) si[j] = exp_fast(si[j] - mx);
    } else {
        for (int64_t j = 0; j < n; j++) if (allowed(a, b, t, j) && si[j] > mx) mx = si[j];
        for (int64_t j = 0; j < n; j++) si[j] = allowed(a, b, t, j) ? exp_fast(si[j] - mx) : 0.f;
    }
    for (int64_t j = 0; j < n; j++) l += si[j];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (int64_t j = 0; j < n; j++) si[j] *= inv;
}


/* Every line of n floats at p, into the L2 cache ahead of its use (prefetcht1). Prefetches into
 * L1 (prefetcht0) wait on its few miss buffers: with the blocks scattered in memory, where the
 * hardware prefetcher does not follow, that kernel read 9 GB/s, this one 20 GB/s
 * (experiments/lean_step/floor_2x). */
static inline void prefetch_span(const float *p, int64_t n) {
    for (int64_t off = 0; off < n; off += 16) __builtin_prefetch(p + off, 0, 2);
}

static inline int h_first(int64_t i, int64_t H) { return i % H == 0; }

#define AHEAD 2      /* blocks prefetched ahead of the one read (1 and 3 measured slower) */

/* The blocks request b reads: those of its largest valid position (at least position 0). */
static int64_t blocks_of(const job_t *a, int64_t b) {
    int64_t nmax = 1;
    for (int64_t t = 0; t < a->T; t++) {
        const int64_t n = reach(a, b, t);
        nmax = n > nmax ? n : nmax;
    }
    return (nmax + a->S - 1) / a->S;
}

/* One request. Two passes over its blocks, each block's keys (then values) read once for all the
 * T x H queries that attend it, the block AHEAD on prefetched a share per query (a burst of
 * prefetches stalls the loads behind it): the scores of every query, the softmax of each query's
 * row, then the weighted sums of the values. Inlined with D a constant for the common head
 * dims, so that the loops over D unroll. */
static inline __attribute__((always_inline)) int attend_d(const job_t *a, int64_t b, const int64_t D) {
    const int64_t G = a->H / a->Hkv, T = a->T, S = a->S, H = a->H, NQ = T * H, row = a->Hkv * D;
    const int64_t *bt = a->block_table + b * a->bt_stride, block = S * row;
    const int vec = D % 8 == 0 && D <= 8 * MAX_VECS;
    const int64_t nblocks = blocks_of(a, b), L = nblocks * S;
    const int64_t next_blocks = b + 1 < a->B ? blocks_of(a, b + 1) : 0;
    /* per query i = t H + h: its scores (L), its scaled q (D), its output sum (D) */
    float *buf = malloc(sizeof(float) * (size_t)(NQ * (L + 2 * D) + 8));
    int64_t *n_of = malloc(sizeof(int64_t) * (size_t)NQ);
    if (!buf || !n_of) { free(buf); free(n_of); return 1; }
    float *sc = buf, *qs = sc + NQ * L, *acc = qs + NQ * D;
    for (int64_t i = 0; i < NQ; i++) {
        const int64_t t = i / H;
        n_of[i] = h_first(i, H) ? reach(a, b, t) : n_of[i - 1];
        const float *qr = a->q + (b * NQ + i) * D;
        for (int64_t d = 0; d < D; d++) qs[i * D + d] = qr[d] * a->scale;
    }
    memset(acc, 0, sizeof(float) * (size_t)(NQ * D));
    const int64_t share = (block + NQ - 1) / NQ;     /* each query's share of the next block's floats */
    for (int pass = 0; pass < 2; pass++) {           /* 0: scores over the keys, 1: sums of the values */
        const float *cache = pass == 0 ? a->kc : a->vc;
        for (int64_t blk = 0; blk < nblocks; blk++) {
            /* the block AHEAD blocks on in reading order: this pass's, then the values after the
             * keys, then the next request's keys after the values */
            const int64_t ahead = blk + AHEAD;
            const float *nx = NULL;
            if (ahead < nblocks)
                nx = cache + bt[ahead] * block;
            else if (pass == 0 && ahead - nblocks < nblocks)
                nx = a->vc + bt[ahead - nblocks] * block;
            else if (pass == 1 && ahead - nblocks < next_blocks)
                nx = a->kc + a->block_table[(b + 1) * a->bt_stride + ahead - nblocks] * block;
            const float *cb = cache + bt[blk] * block;
            for (int64_t i = 0; i < NQ; i++) {
                if (nx && i * share < block) prefetch_span(nx + i * share, block - i * share < share ? block - i * share : share);
                int64_t cnt = n_of[i] - blk * S;
                if (cnt <= 0) continue;
                if (cnt > S) cnt = S;
                const float *rows = cb + ((i % H) / G) * D;
                float *s = sc + i * L + blk * S;
                if (pass == 0) {
                    const float *qi = qs + i * D;
                    int64_t jj = 0;
                    if (vec)     /* 8 keys at a time: 8 independent sums, not one dependent chain */
                        for (; jj + 8 <= cnt; jj += 8) {
                            v8 s8[8] = {0};
                            for (int64_t c = 0; c < D / 8; c++) {
                                v8 qc = load8(qi + 8 * c);
                                for (int u = 0; u < 8; u++) s8[u] += qc * load8(rows + (jj + u) * row + 8 * c);
                            }
                            store8(s + jj, hsum8(s8));
                        }
                    for (; jj < cnt; jj++) s[jj] = dot(qi, rows + jj * row, D);
                    if (blk + 1 == (n_of[i] + S - 1) / S)       /* the row is complete: its softmax */
                        softmax_row(a, b, i / H, sc + i * L, n_of[i]);
                } else if (vec) {                    /* the block's sum in registers */
                    float *ai = acc + i * D;
                    v8 av[MAX_VECS];
                    for (int64_t c = 0; c < D / 8; c++) av[c] = load8(ai + 8 * c);
                    for (int64_t jj = 0; jj < cnt; jj++)
                        for (int64_t c = 0; c < D / 8; c++) av[c] += s[jj] * load8(rows + jj * row + 8 * c);
                    for (int64_t c = 0; c < D / 8; c++) store8(ai + 8 * c, av[c]);
                } else {
                    for (int64_t jj = 0; jj < cnt; jj++) axpy(acc + i * D, s[jj], rows + jj * row, D);
                }
            }
        }
    }
    memcpy(a->out + b * NQ * D, acc, sizeof(float) * (size_t)(NQ * D));
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
    job_t job = {q, kc, vc, block_table, positions, valid, out, B, T, H, Hkv, D, S, bt_stride, scale,
                 NULL, NULL, NULL, 0};
    return parallel_for(B, num_threads, attend, &job);
}

/* The tree-masked variant (module doc). Returns 0, or 1 when memory ran out. */
int paged_tree_attention(const float *q, const float *kc, const float *vc, const int64_t *block_table,
                         int64_t bt_stride, const uint8_t *anc, const int64_t *base, const int64_t *prefix_end,
                         int64_t NT, const uint8_t *valid, float *out, int64_t B, int64_t T, int64_t H,
                         int64_t Hkv, int64_t D, int64_t S, float scale, int64_t num_threads) {
    job_t job = {q, kc, vc, block_table, NULL, valid, out, B, T, H, Hkv, D, S, bt_stride, scale,
                 anc, base, prefix_end, NT};
    return parallel_for(B, num_threads, attend, &job);
}
