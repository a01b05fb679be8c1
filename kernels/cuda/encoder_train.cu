// The backward ops of bidirectional encoders (kernels.EncoderTrainer), and
// their attention with dropout on its probabilities: SimCSE's training
// step on the GPU. Row-major float32; the CPU backend's versions
// (kernels/cpu/encoder_backward.go) are the reference.

// layernorm_backward: for y = x̂ w + b, x̂ = (x - mean) rstd per row of d:
// dx += rstd (g - mean(g) - x̂ mean(g x̂)) with g = dy w; dw += dy x̂ and
// db += dy (atomics across rows). One block of 256 a row; dx, dw or db may
// be null. Shared memory: a float a thread (the reductions).
extern "C" __global__ void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                                              const float* w, int d, float eps) {
    float* s = sh;
    long o = (long)blockIdx.x * d;
    float acc = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) acc += x[o + i];
    float mean = block_sum(acc, s) / d;
    float v = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float c = x[o + i] - mean;
        v += c * c;
    }
    float rstd = rsqrtf(block_sum(v, s) / d + eps);
    float mg = 0.f, mgh = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float g = dy[o + i] * w[i], h = (x[o + i] - mean) * rstd;
        mg += g;
        mgh += g * h;
    }
    mg = block_sum(mg, s) / d;
    mgh = block_sum(mgh, s) / d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float g = dy[o + i] * w[i], h = (x[o + i] - mean) * rstd;
        if (dx) dx[o + i] += rstd * (g - mg - h * mgh);
        if (dw) atomicAdd(dw + i, dy[o + i] * h);
        if (db) atomicAdd(db + i, dy[o + i]);
    }
}

// gelu_backward: dx += dy GELU'(x), erf or (approx) tanh GELU.
extern "C" __global__ void gelu_backward(float* dx, const float* dy, const float* x, long n, int approx) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i], g;
    if (approx) {
        const float c = 0.7978845608028654f;
        float th = tanhf(c * (v + 0.044715f * v * v * v));
        g = 0.5f * (1.f + th) + 0.5f * v * (1.f - th * th) * c * (1.f + 3.f * 0.044715f * v * v);
    } else {
        g = 0.5f * (1.f + erff(v * 0.7071067811865476f)) + v * expf(-0.5f * v * v) * 0.3989422804014327f;
    }
    dx[i] += dy[i] * g;
}

// tanh_backward: dx += dy (1 - y^2), y = tanh(x).
extern "C" __global__ void tanh_backward(float* dx, const float* dy, const float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) dx[i] += dy[i] * (1.f - y[i] * y[i]);
}

// segment_mean_backward: dx[r, :] += dy[s, :] / n_s for the rows r of
// segment s; one block a segment.
extern "C" __global__ void segment_mean_backward(float* dx, const float* dy, const int* bounds, int d) {
    int lo = bounds[blockIdx.x], hi = bounds[blockIdx.x + 1];
    float inv = 1.f / (float)(hi - lo);
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float g = dy[(long)blockIdx.x * d + c] * inv;
        for (int r = lo; r < hi; r++) dx[(long)r * d + c] += g;
    }
}

// seg_probs: p[j - lo] = softmax over keys lo..hi-1 of q_i k_j / sqrt(hd),
// head h, into shared memory; then the dropout factor (keep/(1-p), or 0)
// of each into c when c is not null. The block's threads share the keys.
__device__ void seg_probs(float* p, float* c, float* red, const float* q, const float* k, int i, int h, int lo, int hi,
                          int heads, int hd, int t, unsigned long long seed, unsigned long long thr, float inv) {
    long w = (long)heads * hd;
    const float* qi = q + i * w + (long)h * hd;
    float scale = rsqrtf((float)hd), m = NEG_INF;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        const float* kj = k + j * w + (long)h * hd;
        float a = 0.f;
        for (int e = 0; e < hd; e++) a += qi[e] * kj[e];
        p[j - lo] = a * scale;
        m = fmaxf(m, a * scale);
    }
    m = block_max(m, red);
    float z = 0.f;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        float e = expf(p[j - lo] - m);
        p[j - lo] = e;
        z += e;
    }
    z = block_sum(z, red);
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        p[j - lo] /= z;
        if (c) {
            unsigned long long ctr = ((unsigned long long)i * heads + h) * (unsigned long long)t + j;
            c[j - lo] = keep(seed, (long)ctr, thr) ? inv : 0.f;
        }
    }
    __syncthreads();
}

// segment_attention_drop: out_i = sum_j p_ij c_ij v_j over query i's
// segment span[2i]..span[2i+1]-1 with c the dropout factor (the mask of
// kernels.AttentionDropoutCounter). One block per (row, head); shared
// memory 2 floats per key of the longest segment, plus one a thread.
extern "C" __global__ void segment_attention_drop(float* out, const float* q, const float* k, const float* v,
                                                  const int* span, int heads, int hd, int t, int longest,
                                                  unsigned long long seed, unsigned long long thr, float inv) {
    float *p = sh, *c = sh + longest, *red = sh + 2 * longest;
    int i = blockIdx.x / heads, h = blockIdx.x % heads;
    int lo = span[2 * i], hi = span[2 * i + 1];
    seg_probs(p, c, red, q, k, i, h, lo, hi, heads, hd, t, seed, thr, inv);
    long w = (long)heads * hd;
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float a = 0.f;
        for (int j = lo; j < hi; j++) a += p[j - lo] * c[j - lo] * v[j * w + (long)h * hd + e];
        out[i * w + (long)h * hd + e] = a;
    }
}

// segment_attention_backward: with dP_j = c_j dout_i v_j and
// D = sum_j p_j dP_j: dq_i += scale sum_j p_j (dP_j - D) k_j,
// dk_j += scale p_j (dP_j - D) q_i, dv_j += p_j c_j dout_i (atomics across
// the segment's rows). One block per (row, head); shared memory 3 floats
// per key of the longest segment, plus one a thread.
extern "C" __global__ void segment_attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                                      const float* q, const float* k, const float* v,
                                                      const int* span, int heads, int hd, int t, int longest,
                                                      unsigned long long seed, unsigned long long thr, float inv) {
    float *p = sh, *c = sh + longest, *dp = sh + 2 * longest, *red = sh + 3 * longest;
    int i = blockIdx.x / heads, h = blockIdx.x % heads;
    int lo = span[2 * i], hi = span[2 * i + 1];
    seg_probs(p, c, red, q, k, i, h, lo, hi, heads, hd, t, seed, thr, inv);
    long w = (long)heads * hd, oi = i * w + (long)h * hd;
    float D = 0.f;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        const float* vj = v + j * w + (long)h * hd;
        float a = 0.f;
        for (int e = 0; e < hd; e++) a += dout[oi + e] * vj[e];
        dp[j - lo] = c[j - lo] * a;
        D += p[j - lo] * dp[j - lo];
    }
    D = block_sum(D, red);
    float scale = rsqrtf((float)hd);
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        dp[j - lo] = p[j - lo] * (dp[j - lo] - D) * scale; // now dS_j
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < (hi - lo) * hd; idx += blockDim.x) {
        int jj = idx / hd, e = idx % hd;
        long oj = (long)(lo + jj) * w + (long)h * hd + e;
        if (dk) atomicAdd(dk + oj, dp[jj] * q[oi + e]);
        if (dv && c[jj] != 0.f) atomicAdd(dv + oj, p[jj] * c[jj] * dout[oi + e]);
    }
    if (dq) {
        for (int e = threadIdx.x; e < hd; e += blockDim.x) {
            float a = 0.f;
            for (int j = lo; j < hi; j++) a += dp[j - lo] * k[j * w + (long)h * hd + e];
            dq[oi + e] += a;
        }
    }
}
