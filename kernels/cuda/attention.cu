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
