// Flash-style attention and its backward.
// Row-major float32, shapes in each comment; compiled at run time by NVRTC.

// Attention is flash-style: no score matrix is materialised, whatever the
// prompt's length. One block per (token, head); each warp walks every
// nw-th key with an online softmax (a running max m, normaliser l and
// weighted sum of values in registers, lanes splitting the head's
// dimensions), and the warps' partial results are merged at the end.
#define ATT_MAXD 8  // head dimensions per lane: head_dim <= 256

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

// attend_row: one query row's attention (one head) over keys jlo..jhi-1 of
// kc, vc (rows kvheads*hd wide, this head's kv head kvh), position j's in
// row rows[j] (a paged cache's block table; nullable: row j), valid
// (nullable) masking positions; qr unscaled, o its output row. The block's
// warps split the keys. Dynamic shared memory: (nwarps * (hd + 2)) floats.
__device__ void attend_row(float* o, const float* qr, const float* kc, const float* vc, const int* rows,
                           const int* valid, int jlo, int jhi, int kvheads, int kvh, int hd) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int per = (hd + 31) / 32;
    float scale = rsqrtf((float)hd);
    float qv[ATT_MAXD], acc[ATT_MAXD];
    for (int r = 0; r < per; r++) {
        int d = lane + 32 * r;
        qv[r] = d < hd ? qr[d] * scale : 0.f;
        acc[r] = 0.f;
    }
    float m = NEG_INF, l = 0.f;
    for (int j = jlo + warp; j < jhi; j += nw) {
        if (valid && !valid[j]) continue;
        long row = rows ? rows[j] : j;
        const float* kr = kc + (row * kvheads + kvh) * hd;
        const float* vr = vc + (row * kvheads + kvh) * hd;
        float s = 0.f;
        for (int r = 0; r < per; r++) {
            int d = lane + 32 * r;
            if (d < hd) s += qv[r] * kr[d];
        }
        s = warp_sum(s);
        float mn = fmaxf(m, s);
        float c = expf(m - mn), p = expf(s - mn);
        l = l * c + p;
        for (int r = 0; r < per; r++) {
            int d = lane + 32 * r;
            acc[r] = acc[r] * c + (d < hd ? p * vr[d] : 0.f);
        }
        m = mn;
    }
    float* sm = sh;            // [nw] maxima
    float* sl = sh + nw;       // [nw] normalisers
    float* sacc = sh + 2 * nw; // [nw][hd] partial sums
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
    for (int r = 0; r < per; r++) {
        int d = lane + 32 * r;
        if (d < hd) sacc[warp * hd + d] = acc[r];
    }
    __syncthreads();
    float M = NEG_INF;
    for (int w = 0; w < nw; w++) M = fmaxf(M, sm[w]);
    float L = 0.f;
    for (int w = 0; w < nw; w++) L += sm[w] == NEG_INF ? 0.f : sl[w] * expf(sm[w] - M);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        if (M == NEG_INF) {  // every key masked: zeros, not NaN
            o[d] = 0.f;
            continue;
        }
        float a = 0.f;
        for (int w = 0; w < nw; w++)
            if (sm[w] != NEG_INF) a += sacc[w * hd + d] * expf(sm[w] - M);
        o[d] = a / L;
    }
}

// attention: causal GQA. q, out [t, heads*hd] for positions start..start+t-1;
// kc, vc [maxT, kvheads*hd]; valid (nullable) masks cache positions.
// One block per (token, head).
extern "C" __global__ void attention(float* out, const float* q, const float* kc, const float* vc,
                                     const int* valid, const int* span, int start, int heads, int kvheads, int hd) {
    int i = blockIdx.x / heads, h = blockIdx.x % heads;
    long o = ((long)i * heads + h) * hd;
    // Causal: keys 0..start+i; with span (bidirectional encoders over packed
    // sequences): keys span[2i]..span[2i+1]-1, the query's own sequence.
    int jlo = 0, jhi = start + i + 1;
    if (span) { jlo = span[2 * i]; jhi = span[2 * i + 1]; }
    attend_row(out + o, q + o, kc, vc, 0, valid, jlo, jhi, kvheads, h / (heads / kvheads), hd);
}

// attention_paged: attention (causal, no mask) over a paged cache,
// position j's key and value in row rows[j] of kpool and vpool: read where
// they lie, without gathering them first. One block per (token, head).
extern "C" __global__ void attention_paged(float* out, const float* q, const float* kpool, const float* vpool,
                                           const int* rows, int start, int heads, int kvheads, int hd) {
    int i = blockIdx.x / heads, h = blockIdx.x % heads;
    long o = ((long)i * heads + h) * hd;
    attend_row(out + o, q + o, kpool, vpool, rows, 0, 0, start + i + 1, kvheads, h / (heads / kvheads), hd);
}

// cache_append: a decode step of several sequences writes its keys and
// values: row r of k and v ([rows, width]) goes to row dst[r] of the caches
// (or pools) kcs[r], vcs[r] (device addresses). One block a row.
extern "C" __global__ void cache_append(const unsigned long long* kcs, const unsigned long long* vcs, const float* k,
                                        const float* v, const int* dst, int width) {
    int r = blockIdx.x;
    float* kd = (float*)kcs[r] + (long)dst[r] * width;
    float* vd = (float*)vcs[r] + (long)dst[r] * width;
    for (int d = threadIdx.x; d < width; d += blockDim.x) {
        kd[d] = k[(long)r * width + d];
        vd[d] = v[(long)r * width + d];
    }
}

// attention_batch: that step's attention in one launch, where a launch
// per sequence left the GPU idle between them: row r of q (sequence r, at
// position pos[r]) attends causally over positions 0..pos[r] of its
// caches, position j in row j, or for a paged cache (off[r] >= 0) in row
// rows[off[r] + j] of its pool. One block per (row, head).
extern "C" __global__ void attention_batch(float* out, const float* q, const unsigned long long* kcs,
                                           const unsigned long long* vcs, const int* rows, const int* off,
                                           const int* pos, int heads, int kvheads, int hd) {
    int r = blockIdx.x / heads, h = blockIdx.x % heads;
    long o = ((long)r * heads + h) * hd;
    attend_row(out + o, q + o, (const float*)kcs[r], (const float*)vcs[r], off[r] < 0 ? 0 : rows + off[r], 0, 0,
               pos[r] + 1, kvheads, h / (heads / kvheads), hd);
}

// attention_backward: gradients of attention (no mask) given dout and the
// forward's out. k, v, dk, dv [start+t, kvheads*hd]; q, dq, dout, out
// [t, heads*hd]. Flash-style: pass 1 recomputes the row's log-sum-exp with
// an online softmax, pass 2 walks the keys again:
//   p = exp(s - lse), dp = dout.v, ds = p (dp - D), D = dout.out
//   dq += scale sum ds k,  dk += scale ds q,  dv += p dout   (atomics)
// Dynamic shared memory: (nwarps * (hd + 2)) floats.
extern "C" __global__ void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                              const float* q, const float* k, const float* v,
                                              int start, int heads, int kvheads, int hd) {
    int i = blockIdx.x / heads, h = blockIdx.x % heads;
    int kvh = h / (heads / kvheads);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int per = (hd + 31) / 32;
    long qo = ((long)i * heads + h) * hd;
    float scale = rsqrtf((float)hd);
    float qv[ATT_MAXD], go[ATT_MAXD], dqa[ATT_MAXD];
    float D = 0.f;
    for (int r = 0; r < per; r++) {
        int d = lane + 32 * r;
        qv[r] = d < hd ? q[qo + d] : 0.f;
        go[r] = d < hd ? dout[qo + d] : 0.f;
        D += d < hd ? go[r] * out[qo + d] : 0.f;
        dqa[r] = 0.f;
    }
    D = warp_sum(D);
    float m = NEG_INF, l = 0.f;
    for (int j = warp; j <= start + i; j += nw) {
        const float* kr = k + ((long)j * kvheads + kvh) * hd;
        float s = 0.f;
        for (int r = 0; r < per; r++) {
            int d = lane + 32 * r;
            if (d < hd) s += qv[r] * kr[d];
        }
        s = warp_sum(s) * scale;
        float mn = fmaxf(m, s);
        l = l * expf(m - mn) + expf(s - mn);
        m = mn;
    }
    float* sm = sh;
    float* sl = sh + nw;
    float* sacc = sh + 2 * nw;
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
    __syncthreads();
    float M = NEG_INF, L = 0.f;
    for (int w = 0; w < nw; w++) M = fmaxf(M, sm[w]);
    for (int w = 0; w < nw; w++) L += sm[w] == NEG_INF ? 0.f : sl[w] * expf(sm[w] - M);
    float lse = M + logf(L);
    for (int j = warp; j <= start + i; j += nw) {
        long ko = ((long)j * kvheads + kvh) * hd;
        float s = 0.f, dp = 0.f;
        for (int r = 0; r < per; r++) {
            int d = lane + 32 * r;
            if (d < hd) {
                s += qv[r] * k[ko + d];
                dp += go[r] * v[ko + d];
            }
        }
        s = warp_sum(s) * scale;
        dp = warp_sum(dp);
        float p = expf(s - lse);
        float ds = p * (dp - D);
        for (int r = 0; r < per; r++) {
            int d = lane + 32 * r;
            if (d < hd) {
                dqa[r] += ds * k[ko + d];
                atomicAdd(dk + ko + d, ds * scale * qv[r]);
                atomicAdd(dv + ko + d, p * go[r]);
            }
        }
    }
    for (int r = 0; r < per; r++) {
        int d = lane + 32 * r;
        if (d < hd) sacc[warp * hd + d] = dqa[r];
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f;
        for (int w = 0; w < nw; w++) a += sacc[w * hd + d];
        dq[qo + d] += scale * a;
    }
}

// Tiled attention for prompts and training (no mask, head_dim <= 128): the
// kernels above give each query its own pass over every key in global
// memory, and their backward adds into dk and dv with an atomic per
// (query, key, dimension), which at 10k-token contexts is most of a
// training step. Here a block of ATT_NQ queries (one a warp) shares each
// tile of 32 keys staged in shared memory. For the scores a lane owns a
// key (or, for dk/dv, a query) and takes whole dot products; for the
// weighted sums a lane owns head dimensions and the weights come by
// shuffle, so each tile costs a handful of warp reductions, not one per
// key. The backward is three passes with no atomics: the row
// log-sum-exps (attention_tiled with lse_only), dq by query blocks, and dk
// and dv by key blocks, each summing over its kv head's group of heads.
// Padded rows (stride hd|1) keep a lane's row reads in distinct banks.
#define ATT_NQ 8

__device__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

// dot of a padded shared row with a broadcast shared vector.
__device__ float sdot(const float* row, const float* vec, int hd) {
    float a = 0.f;
    for (int d = 0; d < hd; d++) a += row[d] * vec[d];
    return a;
}

// load_kv_tile stages keys j0..j0+31 of kv head kvh (zeros past last) in
// shared memory, key rows kstride apart and value rows vstride apart.
__device__ void load_kv_tile(float* ks, int kstride, float* vs, int vstride, const float* k, const float* v,
                             int j0, int last, int kvheads, int kvh, int hd) {
    for (int x = threadIdx.x; x < 32 * hd; x += blockDim.x) {
        int r = x / hd, d = x - r * hd, j = j0 + r;
        float kv = 0.f, vv = 0.f;
        if (j <= last) {
            long o = ((long)j * kvheads + kvh) * hd + d;
            kv = k[o];
            vv = v[o];
        }
        ks[r * kstride + d] = kv;
        vs[r * vstride + d] = vv;
    }
}

// add_weighted_rows: acc (this lane's head dimensions lane, lane+32, ...)
// += sum over the first n rows of w_jj * rows[jj], where lane jj holds w.
// Inlined, so acc stays in registers.
__device__ __forceinline__ void add_weighted_rows(float acc[4], float w, const float* rows, int stride, int n, int hd, int lane) {
    for (int jj = 0; jj < n; jj++) {
        float wj = __shfl_sync(0xffffffff, w, jj);
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int d = lane + 32 * r;
            if (d < hd) acc[r] += wj * rows[jj * stride + d];
        }
    }
}

// attention_tiled: causal GQA for queries start..start+t-1. q, out [t,
// heads*hd]; k, v [start+t, kvheads*hd]; lse (nullable) [t, heads] gets
// each row's log-sum-exp of the scaled scores; lse_only skips the values.
// Grid (ceil(t/ATT_NQ), heads), ATT_NQ warps. Dynamic shared memory:
// (32*(hd|1) + 32*hd + ATT_NQ*hd) floats.
extern "C" __global__ void attention_tiled(float* out, float* lse, const float* q, const float* k, const float* v,
                                           int t, int start, int heads, int kvheads, int hd, int lse_only) {
    int h = blockIdx.y, kvh = h / (heads / kvheads);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int i0 = blockIdx.x * ATT_NQ, i = i0 + warp;
    int kp = hd | 1;
    float* ks = sh;           // [32][kp]
    float* vs = ks + 32 * kp; // [32][hd]
    float* qs = vs + 32 * hd; // [ATT_NQ][hd], pre-scaled
    float scale = rsqrtf((float)hd);
    bool live = i < t;
    for (int d = lane; d < hd; d += 32) qs[warp * hd + d] = live ? q[((long)i * heads + h) * hd + d] * scale : 0.f;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    float m = NEG_INF, l = 0.f;
    int last = start + min(i0 + ATT_NQ, t) - 1; // the block's last key
    int mine = start + i;                      // this warp's last key
    for (int j0 = 0; j0 <= last; j0 += 32) {
        __syncthreads(); // the previous tile is consumed
        load_kv_tile(ks, kp, vs, hd, k, v, j0, last, kvheads, kvh, hd);
        __syncthreads();
        if (!live || j0 > mine) continue; // uniform per warp; the loop bound is per block
        int j = j0 + lane;
        float s = j <= mine ? sdot(ks + lane * kp, qs + warp * hd, hd) : NEG_INF;
        float mn = fmaxf(m, warp_max(s)); // finite: key j0 <= mine is in the tile
        float p = j <= mine ? expf(s - mn) : 0.f;
        float c = expf(m - mn);
        l = l * c + warp_sum(p);
        m = mn;
        if (lse_only) continue;
        int nj = min(32, mine - j0 + 1);
#pragma unroll
        for (int r = 0; r < 4; r++) acc[r] *= c;
        add_weighted_rows(acc, p, vs, hd, nj, hd, lane);
    }
    if (!live) return;
    if (lse && lane == 0) lse[(long)i * heads + h] = m + logf(l);
    if (lse_only) return;
#pragma unroll
    for (int r = 0; r < 4; r++) {
        int d = lane + 32 * r;
        if (d < hd) out[((long)i * heads + h) * hd + d] = acc[r] / l;
    }
}

// attention_rowdot: D[r] = sum_d dout[r,d] out[r,d] over rows of hd; a warp
// a row.
extern "C" __global__ void attention_rowdot(float* D, const float* dout, const float* out, int rows, int hd) {
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return;
    float a = 0.f;
    for (int d = lane; d < hd; d += 32) a += dout[(long)r * hd + d] * out[(long)r * hd + d];
    a = warp_sum(a);
    if (lane == 0) D[r] = a;
}

// attention_bwd_dq: dq += scale sum_j ds_ij k_j, ds = p (dout.v_j - D),
// p = exp(scale q.k_j - lse). Grid (ceil(t/ATT_NQ), heads), ATT_NQ warps.
// Dynamic shared memory: (64*(hd|1) + 2*ATT_NQ*hd) floats.
extern "C" __global__ void attention_bwd_dq(float* dq, const float* q, const float* k, const float* v,
                                            const float* dout, const float* lse, const float* D,
                                            int t, int start, int heads, int kvheads, int hd) {
    int h = blockIdx.y, kvh = h / (heads / kvheads);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int i0 = blockIdx.x * ATT_NQ, i = i0 + warp;
    int kp = hd | 1;
    float* ks = sh;            // [32][kp]
    float* vs = ks + 32 * kp;  // [32][kp]
    float* qs = vs + 32 * kp;  // [ATT_NQ][hd], pre-scaled
    float* gs = qs + ATT_NQ * hd; // [ATT_NQ][hd] dout
    float scale = rsqrtf((float)hd);
    bool live = i < t;
    long qo = ((long)i * heads + h) * hd;
    for (int d = lane; d < hd; d += 32) {
        qs[warp * hd + d] = live ? q[qo + d] * scale : 0.f;
        gs[warp * hd + d] = live ? dout[qo + d] : 0.f;
    }
    float L = live ? lse[(long)i * heads + h] : 0.f, Dr = live ? D[(long)i * heads + h] : 0.f;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    int last = start + min(i0 + ATT_NQ, t) - 1, mine = start + i;
    for (int j0 = 0; j0 <= last; j0 += 32) {
        __syncthreads();
        load_kv_tile(ks, kp, vs, kp, k, v, j0, last, kvheads, kvh, hd);
        __syncthreads();
        if (!live || j0 > mine) continue;
        int j = j0 + lane;
        float ds = 0.f;
        if (j <= mine) {
            float p = expf(sdot(ks + lane * kp, qs + warp * hd, hd) - L);
            ds = p * (sdot(vs + lane * kp, gs + warp * hd, hd) - Dr);
        }
        int nj = min(32, mine - j0 + 1);
        add_weighted_rows(acc, ds, ks, kp, nj, hd, lane);
    }
    if (!live) return;
#pragma unroll
    for (int r = 0; r < 4; r++) {
        int d = lane + 32 * r;
        if (d < hd) dq[qo + d] += scale * acc[r];
    }
}

// attention_bwd_dkv: for key j of kv head kvh, over the heads of its group
// and the queries i with start+i >= j: dv += p dout_i, dk += scale ds q_i.
// Grid (ceil((start+t)/ATT_NQ), kvheads), ATT_NQ warps (a key each).
// Dynamic shared memory: (64*(hd|1) + 2*ATT_NQ*hd + 64) floats.
extern "C" __global__ void attention_bwd_dkv(float* dk, float* dv, const float* q, const float* k, const float* v,
                                             const float* dout, const float* lse, const float* D,
                                             int t, int start, int heads, int kvheads, int hd) {
    int kvh = blockIdx.y, group = heads / kvheads;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int nk = start + t;
    int jb = blockIdx.x * ATT_NQ, j = jb + warp;
    int qp = hd | 1;
    float* qs = sh;                // [32][qp] queries, pre-scaled
    float* gs = qs + 32 * qp;      // [32][qp] dout
    float* ks = gs + 32 * qp;      // [ATT_NQ][hd]
    float* vs = ks + ATT_NQ * hd;  // [ATT_NQ][hd]
    float* ls = vs + ATT_NQ * hd;  // [32] lse
    float* Ds = ls + 32;           // [32] D
    float scale = rsqrtf((float)hd);
    bool live = j < nk;
    long ko = ((long)j * kvheads + kvh) * hd;
    for (int d = lane; d < hd; d += 32) {
        ks[warp * hd + d] = live ? k[ko + d] : 0.f;
        vs[warp * hd + d] = live ? v[ko + d] : 0.f;
    }
    float dka[4] = {0.f, 0.f, 0.f, 0.f}, dva[4] = {0.f, 0.f, 0.f, 0.f};
    int ilo = max(0, jb - start); // the first query any of the block's keys sees
    for (int g = 0; g < group; g++) {
        int h = kvh * group + g;
        for (int i0 = ilo; i0 < t; i0 += 32) {
            __syncthreads();
            for (int x = threadIdx.x; x < 32 * hd; x += blockDim.x) {
                int r = x / hd, d = x - r * hd, i = i0 + r;
                float qv = 0.f, gv = 0.f;
                if (i < t) {
                    long o = ((long)i * heads + h) * hd + d;
                    qv = q[o] * scale;
                    gv = dout[o];
                }
                qs[r * qp + d] = qv;
                gs[r * qp + d] = gv;
            }
            if (threadIdx.x < 32) {
                int i = i0 + threadIdx.x;
                ls[threadIdx.x] = i < t ? lse[(long)i * heads + h] : 0.f;
                Ds[threadIdx.x] = i < t ? D[(long)i * heads + h] : 0.f;
            }
            __syncthreads();
            if (!live) continue;
            int i = i0 + lane;
            float p = 0.f, ds = 0.f;
            if (i < t && start + i >= j) {
                p = expf(sdot(qs + lane * qp, ks + warp * hd, hd) - ls[lane]);
                ds = p * (sdot(gs + lane * qp, vs + warp * hd, hd) - Ds[lane]);
            }
            int ni = min(32, t - i0);
            for (int ii = 0; ii < ni; ii++) {
                float pw = __shfl_sync(0xffffffff, p, ii), dw = __shfl_sync(0xffffffff, ds, ii);
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    int d = lane + 32 * r;
                    if (d < hd) {
                        dva[r] += pw * gs[ii * qp + d];
                        dka[r] += dw * qs[ii * qp + d]; // q pre-scaled: this is scale ds q
                    }
                }
            }
        }
    }
    if (!live) return;
#pragma unroll
    for (int r = 0; r < 4; r++) {
        int d = lane + 32 * r;
        if (d < hd) {
            dk[ko + d] += dka[r];
            dv[ko + d] += dva[r];
        }
    }
}
