// RMSNorm (the decoder) and LayerNorm (encoders), each beside its backward.
// Row-major float32, shapes in each comment; compiled at run time by NVRTC.

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
