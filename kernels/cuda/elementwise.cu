// Elementwise ops and their backward: SwiGLU, adds, scaling, the
// encoders' activations, bf16 conversions, bias gradients.
// Row-major float32, shapes in each comment; compiled at run time by NVRTC.

// silu_mul: out = silu(gate) * up.
extern "C" __global__ void silu_mul(float* out, const float* gate, const float* up, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        out[i] = g / (1.f + expf(-g)) * up[i];
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

// add: y += x.
extern "C" __global__ void add(float* y, const float* x, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

// The kernels over the big activations (add_scaled, the dropouts, narrow_bf16)
// take four consecutive elements a thread, launched over ceil(n/4)
// threads: 16-byte loads and stores where the pointers allow (the same for
// the whole launch), else one element at a time.
#define ALIGNED(p, a) ((((unsigned long long)(p)) & ((a) - 1)) == 0)

// add_scaled: y += s x.
extern "C" __global__ void add_scaled(float* y, const float* x, float s, long n) {
    long i = 4 * (blockIdx.x * (long)blockDim.x + threadIdx.x);
    if (i >= n) return;
    if (i + 4 <= n && ALIGNED(y, 16) && ALIGNED(x, 16)) {
        float4 a = *(float4*)(y + i), b = *(const float4*)(x + i);
        a.x += s * b.x;
        a.y += s * b.y;
        a.z += s * b.z;
        a.w += s * b.w;
        *(float4*)(y + i) = a;
        return;
    }
    for (long j = i; j < i + 4 && j < n; j++) y[j] += s * x[j];
}

// drop4: x's four elements from i as dropout keeps or zeroes them.
__device__ __forceinline__ float4 drop4(float4 v, long i, unsigned long long seed, unsigned long long thr, float scale) {
    v.x = keep(seed, i, thr) ? v.x * scale : 0.f;
    v.y = keep(seed, i + 1, thr) ? v.y * scale : 0.f;
    v.z = keep(seed, i + 2, thr) ? v.z * scale : 0.f;
    v.w = keep(seed, i + 3, thr) ? v.w * scale : 0.f;
    return v;
}

// dropout: y = x * scale where element i is kept, else 0 (y may be x).
extern "C" __global__ void dropout(float* y, const float* x, long n, unsigned long long seed,
                                   unsigned long long thr, float scale) {
    long i = 4 * (blockIdx.x * (long)blockDim.x + threadIdx.x);
    if (i >= n) return;
    if (i + 4 <= n && ALIGNED(y, 16) && ALIGNED(x, 16)) {
        *(float4*)(y + i) = drop4(*(const float4*)(x + i), i, seed, thr, scale);
        return;
    }
    for (long j = i; j < i + 4 && j < n; j++) y[j] = keep(seed, j, thr) ? x[j] * scale : 0.f;
}

// dropout_bf16: y = bf16(dropout(x)), LoRA's dropped-out input made its
// GEMM's bf16 operand in one pass (dropout, then narrow_bf16, read and
// write it twice).
extern "C" __global__ void dropout_bf16(unsigned short* y, const float* x, long n, unsigned long long seed,
                                        unsigned long long thr, float scale) {
    long i = 4 * (blockIdx.x * (long)blockDim.x + threadIdx.x);
    if (i >= n) return;
    if (i + 4 <= n && ALIGNED(x, 16) && ALIGNED(y, 8)) {
        float4 v = drop4(*(const float4*)(x + i), i, seed, thr, scale);
        uint2 o;
        o.x = (unsigned)to_bf16(v.x) | ((unsigned)to_bf16(v.y) << 16);
        o.y = (unsigned)to_bf16(v.z) | ((unsigned)to_bf16(v.w) << 16);
        *(uint2*)(y + i) = o;
        return;
    }
    for (long j = i; j < i + 4 && j < n; j++) y[j] = to_bf16(keep(seed, j, thr) ? x[j] * scale : 0.f);
}

// dropout_add: y += dropout(x), the backward of LoRA's dropout added into
// its input's gradient in one pass.
extern "C" __global__ void dropout_add(float* y, const float* x, long n, unsigned long long seed,
                                       unsigned long long thr, float scale) {
    long i = 4 * (blockIdx.x * (long)blockDim.x + threadIdx.x);
    if (i >= n) return;
    if (i + 4 <= n && ALIGNED(y, 16) && ALIGNED(x, 16)) {
        float4 a = *(float4*)(y + i), b = drop4(*(const float4*)(x + i), i, seed, thr, scale);
        a.x += b.x;
        a.y += b.y;
        a.z += b.z;
        a.w += b.w;
        *(float4*)(y + i) = a;
        return;
    }
    for (long j = i; j < i + 4 && j < n; j++) y[j] += keep(seed, j, thr) ? x[j] * scale : 0.f;
}

// bias_add: y[r, c] += b[c] for rows of n.
extern "C" __global__ void bias_add(float* y, const float* b, long total, int n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < total) y[i] += b[i % n];
}

// col_sum: db[n] += sum over m rows of dy[m, n] (a bias gradient).
extern "C" __global__ void col_sum(float* db, const float* dy, int m, int n) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    float a = 0.f;
    for (int i = 0; i < m; i++) a += dy[(long)i * n + j];
    db[j] += a;
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

// widen_bf16: out[i] = float(bf16 bits in[i]).
extern "C" __global__ void widen_bf16(float* out, const unsigned short* in, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = __int_as_float(((unsigned int)in[i]) << 16);
}

// narrow_bf16: out[i] = bf16(in[i]), four elements a thread as add_scaled.
extern "C" __global__ void narrow_bf16(unsigned short* out, const float* in, long n) {
    long i = 4 * (blockIdx.x * (long)blockDim.x + threadIdx.x);
    if (i >= n) return;
    if (i + 4 <= n && ALIGNED(in, 16) && ALIGNED(out, 8)) {
        float4 v = *(const float4*)(in + i);
        uint2 o;
        o.x = (unsigned)to_bf16(v.x) | ((unsigned)to_bf16(v.y) << 16);
        o.y = (unsigned)to_bf16(v.z) | ((unsigned)to_bf16(v.w) << 16);
        *(uint2*)(out + i) = o;
        return;
    }
    for (long j = i; j < i + 4 && j < n; j++) out[j] = to_bf16(in[j]);
}

// dequant_q8_bf16: out[i] = bf16(d[i/32]·q[i]), a Q8_0 matrix (GGUF's
// blocks of 32 int8 values and one scale) widened for a bf16 GEMM.
extern "C" __global__ void dequant_q8_bf16(unsigned short* out, const signed char* q, const float* d, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = to_bf16(d[i >> 5] * (float)q[i]);
}
