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

// rope: rotate x[t, heads*hd] in place (rotate-half pairs), token i at pos[i].
extern "C" __global__ void rope(float* x, const int* pos, int t, int heads, int hd, double theta) {
    int half = hd / 2;
    long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (idx >= (long)t * heads * half) return;
    int j = idx % half;
    long th = idx / half;
    int i = th / heads;
    double a = pos[i] * pow(theta, -2.0 * j / hd);
    float c = (float)cos(a), s = (float)sin(a);
    float* v = x + th * hd;
    float x0 = v[j], x1 = v[j + half];
    v[j] = x0 * c - x1 * s;
    v[j + half] = x1 * c + x0 * s;
}

// attention: causal GQA. q, out [t, heads*hd] for positions start..start+t-1;
// kc, vc [maxT, kvheads*hd]; valid (nullable) masks cache positions.
// One block per (token, head); scores live in dynamic shared memory.
extern "C" __global__ void attention(float* out, const float* q, const float* kc, const float* vc,
                                     const int* valid, int start, int heads, int kvheads, int hd) {
    extern __shared__ float sc[];  // [start + t] scores, then blockDim.x scratch
    int i = blockIdx.x / heads, h = blockIdx.x % heads;
    int kvh = h / (heads / kvheads);
    int n = start + i + 1;
    float* red = sc + n;
    const float* qv = q + ((long)i * heads + h) * hd;
    float scale = rsqrtf((float)hd);
    float m = NEG_INF;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float s = NEG_INF;
        if (!valid || valid[j]) {
            const float* kv = kc + ((long)j * kvheads + kvh) * hd;
            s = 0.f;
            for (int x = 0; x < hd; x++) s += qv[x] * kv[x];
            s *= scale;
        }
        sc[j] = s;
        m = fmaxf(m, s);
    }
    m = block_max(m, red);
    float* o = out + ((long)i * heads + h) * hd;
    if (m == NEG_INF) {  // every key masked: zeros, not NaN
        for (int x = threadIdx.x; x < hd; x += blockDim.x) o[x] = 0.f;
        return;
    }
    float z = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float e = expf(sc[j] - m);
        sc[j] = e;
        z += e;
    }
    z = block_sum(z, red);
    for (int x = threadIdx.x; x < hd; x += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < n; j++) acc += sc[j] * vc[((long)j * kvheads + kvh) * hd + x];
        o[x] = acc / z;
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
    float m = NEG_INF;
    for (int i = threadIdx.x; i < d; i += blockDim.x) m = fmaxf(m, xr[i]);
    m = block_max(m, s);
    float z = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) z += expf(xr[i] - m);
    z = block_sum(z, s);
    float lz = m + logf(z);
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
