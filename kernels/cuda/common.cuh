// Shared by every kernel file: reductions over a block and a warp.

#define NEG_INF __int_as_float(0xff800000)

// The launch's dynamic shared memory as floats, for the kernels that size
// it at launch (declared once: a declaration in each kernel draws NVRTC's
// linkage warning, #1556).
extern __shared__ float sh[];

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

// to_bf16: the bf16 bits of x, round to nearest even (NaN stays NaN).
__device__ unsigned short to_bf16(float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffff) > 0x7f800000) return (unsigned short)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (unsigned short)(u >> 16);
}

// keep: element i survives dropout (kernels/dropout.go's DropoutBits:
// splitmix64 of the element's counter, at least thr).
__device__ __forceinline__ bool keep(unsigned long long seed, long i, unsigned long long thr) {
    unsigned long long z = seed + (unsigned long long)(i + 1) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return z >= thr;
}
