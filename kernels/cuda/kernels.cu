// agemem CUDA kernels: the forward ops of the Qwen engine. Row-major float32;
// shapes in each comment. Compiled at run time by NVRTC.

#define NEG_INF __int_as_float(0xff800000)

// Block reduction helpers over blockDim.x threads (a power of two <= 1024).
__device__ float block_sum(float v, float* s) {
    s[threadIdx.x] = v;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) s[threadIdx.x] += s[threadIdx.x + o];
        __syncthreads();
    }
    float r = s[0];
    __syncthreads();
    return r;
}

__device__ float block_max(float v, float* s) {
    s[threadIdx.x] = v;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) s[threadIdx.x] = fmaxf(s[threadIdx.x], s[threadIdx.x + o]);
        __syncthreads();
    }
    float r = s[0];
    __syncthreads();
    return r;
}

// row_lse: log(sum exp(row[0..d-1])) over the block, max-shifted.
__device__ float row_lse(const float* row, int d, float* s) {
    float m = NEG_INF;
    for (int i = threadIdx.x; i < d; i += blockDim.x) m = fmaxf(m, row[i]);
    m = block_max(m, s);
    float z = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) z += expf(row[i] - m);
    return m + logf(block_sum(z, s));
}

// rmsnorm: y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w; one block a row of d.
extern "C" __global__ void rmsnorm(float* y, const float* x, const float* w, int d, float eps) {
    __shared__ float s[256];
    const float* xr = x + (long)blockIdx.x * d;
    float* yr = y + (long)blockIdx.x * d;
    float acc = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) acc += xr[i] * xr[i];
    float inv = rsqrtf(block_sum(acc, s) / d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

// rope: rotate x[t, heads*hd] in place (rotate-half pairs), token i at pos[i];
// sign -1 rotates back (the backward: a rotation's transpose is its inverse).
extern "C" __global__ void rope(float* x, const int* pos, int t, int heads, int hd, double theta, float sign) {
    int half = hd / 2;
    long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (idx >= (long)t * heads * half) return;
    int j = idx % half;
    long th = idx / half;
    int i = th / heads;
    double a = pos[i] * pow(theta, -2.0 * j / hd);
    float c = (float)cos(a), s = sign * (float)sin(a);
    float* v = x + th * hd;
    float x0 = v[j], x1 = v[j + half];
    v[j] = x0 * c - x1 * s;
    v[j + half] = x1 * c + x0 * s;
}

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

// attention: causal GQA. q, out [t, heads*hd] for positions start..start+t-1;
// kc, vc [maxT, kvheads*hd]; valid (nullable) masks cache positions.
// Dynamic shared memory: (nwarps * (hd + 2)) floats.
extern "C" __global__ void attention(float* out, const float* q, const float* kc, const float* vc,
                                     const int* valid, const int* span, int start, int heads, int kvheads, int hd) {
    extern __shared__ float sh[];
    int i = blockIdx.x / heads, h = blockIdx.x % heads;
    int kvh = h / (heads / kvheads);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int per = (hd + 31) / 32;
    const float* qr = q + ((long)i * heads + h) * hd;
    float scale = rsqrtf((float)hd);
    float qv[ATT_MAXD], acc[ATT_MAXD];
    for (int r = 0; r < per; r++) {
        int d = lane + 32 * r;
        qv[r] = d < hd ? qr[d] * scale : 0.f;
        acc[r] = 0.f;
    }
    // Causal: keys 0..start+i; with span (bidirectional encoders over packed
    // sequences): keys span[2i]..span[2i+1]-1, the query's own sequence.
    int jlo = 0, jhi = start + i + 1;
    if (span) { jlo = span[2 * i]; jhi = span[2 * i + 1]; }
    float m = NEG_INF, l = 0.f;
    for (int j = jlo + warp; j < jhi; j += nw) {
        if (valid && !valid[j]) continue;
        const float* kr = kc + ((long)j * kvheads + kvh) * hd;
        const float* vr = vc + ((long)j * kvheads + kvh) * hd;
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
    float* o = out + ((long)i * heads + h) * hd;
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
    extern __shared__ float sh[];
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

// silu_mul: out = silu(gate) * up.
extern "C" __global__ void silu_mul(float* out, const float* gate, const float* up, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        out[i] = g / (1.f + expf(-g)) * up[i];
    }
}

// add: y += x.
extern "C" __global__ void add(float* y, const float* x, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

// bias_add: y[r, c] += b[c] for rows of n.
extern "C" __global__ void bias_add(float* y, const float* b, long total, int n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < total) y[i] += b[i % n];
}

// embedding: out[i, :] = table[ids[i], :] (float32 table).
extern "C" __global__ void embedding_f32(float* out, const float* table, const int* ids, int d) {
    const float* row = table + (long)ids[blockIdx.x] * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) out[(long)blockIdx.x * d + c] = row[c];
}

// widen_bf16: out[i] = float(bf16 bits in[i]).
extern "C" __global__ void widen_bf16(float* out, const unsigned short* in, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = __int_as_float(((unsigned int)in[i]) << 16);
}

// softmax / log_softmax over rows of d; one block a row.
extern "C" __global__ void softmax_rows(float* y, const float* x, int d, int logp) {
    __shared__ float s[256];
    const float* xr = x + (long)blockIdx.x * d;
    float* yr = y + (long)blockIdx.x * d;
    float lz = row_lse(xr, d, s);
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = logp ? xr[i] - lz : expf(xr[i] - lz);
}

// narrow_bf16: out[i] = bf16(in[i]), round to nearest even (NaN stays NaN).
extern "C" __global__ void narrow_bf16(unsigned short* out, const float* in, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned int u = __float_as_uint(in[i]);
    if ((u & 0x7fffffff) > 0x7f800000) { out[i] = (unsigned short)((u >> 16) | 0x40); return; }
    u += 0x7fff + ((u >> 16) & 1);
    out[i] = (unsigned short)(u >> 16);
}

// embedding_bf16: out[i, :] = float(table[ids[i], :]) for a bf16 table.
extern "C" __global__ void embedding_bf16(float* out, const unsigned short* table, const int* ids, int d) {
    const unsigned short* row = table + (long)ids[blockIdx.x] * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x)
        out[(long)blockIdx.x * d + c] = __int_as_float(((unsigned int)row[c]) << 16);
}

// topk_select: top-k of row slices. vals is [rows, rowLen]; each row is cut
// into chunks of chunkLen, one block per (row, chunk), and each block writes
// the k best (value, index) of its chunk, best first (ties: lower index), to
// out[(row * chunks + chunk) * k]. idxs, if not null, gives each value's
// original index (the second pass over first-pass winners). One thread per
// strided slice keeps a sorted local top-k; thread 0 merges them. k <= 64.
#define MAXK 64
__device__ bool better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

extern "C" __global__ void topk_select(const float* vals, const int* idxs, long rowLen, long chunkLen, int k,
                                       int* out_idx, float* out_val) {
    extern __shared__ float smem[];
    float* cv = smem;                          // [blockDim.x * k] values
    int* ci = (int*)(smem + blockDim.x * k);   // [blockDim.x * k] indices
    long chunks = (rowLen + chunkLen - 1) / chunkLen;
    long row = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
    long lo = chunk * chunkLen, hi = min(rowLen, lo + chunkLen);
    const float* v = vals + row * rowLen;
    const int* ix = idxs ? idxs + row * rowLen : 0;
    float lv[MAXK];
    int li[MAXK];
    int cnt = 0;
    for (long j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        float x = v[j];
        int id = ix ? ix[j] : (int)j;
        if (id < 0) continue;  // an empty slot from the first pass
        if (cnt == k && !better(x, id, lv[k - 1], li[k - 1])) continue;
        int p = cnt < k ? cnt++ : k - 1;
        while (p > 0 && better(x, id, lv[p - 1], li[p - 1])) { lv[p] = lv[p - 1]; li[p] = li[p - 1]; p--; }
        lv[p] = x; li[p] = id;
    }
    for (int i = 0; i < k; i++) {
        cv[threadIdx.x * k + i] = i < cnt ? lv[i] : NEG_INF;
        ci[threadIdx.x * k + i] = i < cnt ? li[i] : -1;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    cnt = 0;
    for (int c = 0; c < blockDim.x * k; c++) {
        float x = cv[c]; int id = ci[c];
        if (id < 0) continue;
        if (cnt == k && !better(x, id, lv[k - 1], li[k - 1])) continue;
        int p = cnt < k ? cnt++ : k - 1;
        while (p > 0 && better(x, id, lv[p - 1], li[p - 1])) { lv[p] = lv[p - 1]; li[p] = li[p - 1]; p--; }
        lv[p] = x; li[p] = id;
    }
    long o = (row * chunks + chunk) * k;
    for (int i = 0; i < k; i++) {
        out_idx[o + i] = i < cnt ? li[i] : -1;
        out_val[o + i] = i < cnt ? lv[i] : NEG_INF;
    }
}

// ---- Training: the backward of each op (gradients accumulate, +=), the
// fused optimiser step and the reductions clipping needs.

// rmsnorm_backward: for y = x r w, r = rsqrt(mean(x^2) + eps) per row of d:
// dx += r (dy w) - x r^3 / d sum(dy w x), dw += dy x r (atomics across rows).
// One block a row; dx or dw may be null.
extern "C" __global__ void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                                            int d, float eps) {
    __shared__ float s[256];
    long o = (long)blockIdx.x * d;
    float ss = 0.f, dot = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float xv = x[o + i];
        ss += xv * xv;
        dot += dy[o + i] * w[i] * xv;
    }
    ss = block_sum(ss, s);
    dot = block_sum(dot, s);
    float inv = rsqrtf(ss / d + eps);
    float c = dot * inv * inv * inv / d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        if (dx) dx[o + i] += dy[o + i] * w[i] * inv - x[o + i] * c;
        if (dw) atomicAdd(dw + i, dy[o + i] * x[o + i] * inv);
    }
}

// silu_mul_backward: out = silu(g) u: dg += dy u s (1 + g (1 - s)), du += dy silu(g).
extern "C" __global__ void silu_mul_backward(float* dg, float* du, const float* dy, const float* g, const float* u, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gv = g[i], s = 1.f / (1.f + expf(-gv));
    if (dg) dg[i] += dy[i] * u[i] * s * (1.f + gv * (1.f - s));
    if (du) du[i] += dy[i] * gv * s;
}

// embedding_backward: dtable[ids[i], :] += dy[i, :]; one block a row.
extern "C" __global__ void embedding_backward(float* dtable, const float* dy, const int* ids, int d) {
    float* dst = dtable + (long)ids[blockIdx.x] * d;
    const float* src = dy + (long)blockIdx.x * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) atomicAdd(dst + c, src[c]);
}

// col_sum: db[n] += sum over m rows of dy[m, n] (a bias gradient).
extern "C" __global__ void col_sum(float* db, const float* dy, int m, int n) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    float a = 0.f;
    for (int i = 0; i < m; i++) a += dy[(long)i * n + j];
    db[j] += a;
}

// logprob: out[i] = logits[i, t] - logsumexp(logits[i, :]), t = targets[i]
// (0 where t < 0), and ent[i] (nullable) the row's entropy; one block a
// row of v. With dlogits (backward):
// dlogits[i, :] += dout[i] (onehot(t) - softmax(logits[i, :])).
extern "C" __global__ void logprob(float* out, float* ent, float* dlogits, const float* dout, const float* logits,
                                   const int* targets, int v) {
    __shared__ float s[256];
    const float* row = logits + (long)blockIdx.x * v;
    int t = targets[blockIdx.x];
    float lse = row_lse(row, v, s);
    if (!dlogits) {
        if (ent) {  // H = lse - sum p x
            float px = 0.f;
            for (int j = threadIdx.x; j < v; j += blockDim.x) px += expf(row[j] - lse) * row[j];
            px = block_sum(px, s);
            if (threadIdx.x == 0) ent[blockIdx.x] = lse - px;
        }
        if (threadIdx.x == 0) out[blockIdx.x] = t < 0 ? 0.f : row[t] - lse;
        return;
    }
    float g = dout[blockIdx.x];
    if (t < 0 || g == 0.f) return;
    float* d = dlogits + (long)blockIdx.x * v;
    for (int j = threadIdx.x; j < v; j += blockDim.x) d[j] += g * ((j == t ? 1.f : 0.f) - expf(row[j] - lse));
}

// add_scaled: y += s x.
extern "C" __global__ void add_scaled(float* y, const float* x, float s, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] += s * x[i];
}

// mul: y = a * b, elementwise.
extern "C" __global__ void mul(float* y, const float* a, const float* b, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] * b[i];
}

// sum_squares: acc[0] += sum x^2 (grid-stride, one atomic a block).
extern "C" __global__ void sum_squares(float* acc, const float* x, long n) {
    __shared__ float s[256];
    float a = 0.f;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) a += x[i] * x[i];
    a = block_sum(a, s);
    if (threadIdx.x == 0) atomicAdd(acc, a);
}

// adamw: one fused AdamW step (PyTorch's, decoupled decay) in double
// arithmetic, the gradient first scaled to clip the global norm
// sqrt(sumsq[0]) to maxnorm (sumsq null or maxnorm <= 0: no clipping).
//   w = w decay - lr (m / bc1) / (sqrt(v / bc2) + eps)
extern "C" __global__ void adamw(float* w, const float* g, float* m, float* v, long n, double lr, double b1,
                                 double b2, double eps, double decay, double bc1, double bc2,
                                 const float* sumsq, double maxnorm) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    double scale = 1.0;
    if (sumsq && maxnorm > 0) {
        double norm = sqrt((double)sumsq[0]);
        if (norm > maxnorm) scale = maxnorm / (norm + 1e-6);
    }
    double gv = (double)g[i] * scale;
    double mi = b1 * m[i] + (1 - b1) * gv;
    double vi = b2 * v[i] + (1 - b2) * gv * gv;
    m[i] = (float)mi;
    v[i] = (float)vi;
    w[i] = (float)((double)w[i] * decay - lr * (mi / bc1) / (sqrt(vi / bc2) + eps));
}

// The forward ops of bidirectional encoders (BERT, RoBERTa).

// layernorm: y[r, :] = (x[r, :] - mean) * rsqrt(var + eps) * w + b (biased
// variance, two passes); one block of 256 a row of d.
extern "C" __global__ void layernorm(float* y, const float* x, const float* w, const float* b, int d, float eps) {
    __shared__ float s[256];
    const float* xr = x + (long)blockIdx.x * d;
    float* yr = y + (long)blockIdx.x * d;
    float acc = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) acc += xr[i];
    float mean = block_sum(acc, s) / d;
    float v = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float c = xr[i] - mean;
        v += c * c;
    }
    float inv = rsqrtf(block_sum(v, s) / d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

// gelu: y = x * Phi(x) (erf), or with approx the tanh approximation.
extern "C" __global__ void gelu(float* y, const float* x, long n, int approx) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    y[i] = approx ? 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))
                  : 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
}

// act_tanh: y = tanh(x) (BERT's pooler).
extern "C" __global__ void act_tanh(float* y, const float* x, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = tanhf(x[i]);
}

// segment_mean: out[s, :] = mean of x[bounds[s]..bounds[s+1]-1, :], rows of d;
// one block a segment.
extern "C" __global__ void segment_mean(float* out, const float* x, const int* bounds, int d) {
    int lo = bounds[blockIdx.x], hi = bounds[blockIdx.x + 1];
    float inv = 1.f / (float)(hi - lo);
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float a = 0.f;
        for (int r = lo; r < hi; r++) a += x[(long)r * d + c];
        out[(long)blockIdx.x * d + c] = a * inv;
    }
}

// policy_gradient: step-wise GRPO's per-token objective (kernels.Trainer's
// PolicyGradient): dlogp[i] = w[i] * (dl/dlogp + beta * dkl/dlogp) with the
// clipped surrogate l and k3 kl; stats[0..3] += sum w*l, sum w*kl, clipped
// tokens, sum ent. old or ent may be null. Blocks of 256.
extern "C" __global__ void policy_gradient(float* dlogp, float* stats, const float* logp, const float* ent,
                                           const float* old, const float* ref, const float* adv, const float* w,
                                           int n, float clip, float beta) {
    __shared__ float s[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float l = 0.f, kl = 0.f, cl = 0.f, e = 0.f;
    if (i < n) {
        float lp = logp[i], a = adv[i];
        float rho = old ? expf(lp - old[i]) : 1.f;
        float un = rho * a, g = -un;
        float c = fminf(fmaxf(rho, 1.f - clip), 1.f + clip) * a;
        l = -un;
        if (c < un) { l = -c; g = 0.f; cl = 1.f; }
        float d = ref[i] - lp, ed = expf(d);
        dlogp[i] = w[i] * (g + beta * (1.f - ed));
        l *= w[i];
        kl = w[i] * (ed - d - 1.f);
        if (ent) e = ent[i];
    }
    l = block_sum(l, s);
    kl = block_sum(kl, s);
    cl = block_sum(cl, s);
    e = block_sum(e, s);
    if (threadIdx.x == 0) {
        atomicAdd(stats, l);
        atomicAdd(stats + 1, kl);
        atomicAdd(stats + 2, cl);
        atomicAdd(stats + 3, e);
    }
}
