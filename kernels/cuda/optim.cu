// The optimiser: the global gradient norm and a fused, clipped AdamW.
// Row-major float32, shapes in each comment; compiled at run time by NVRTC.

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
