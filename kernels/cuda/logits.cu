// Softmax, the learned tokens' log-probabilities (forward and backward in
// one kernel) and the policy-gradient loss built on them.
// Row-major float32, shapes in each comment; compiled at run time by NVRTC.

// softmax / log_softmax over rows of d; one block a row.
extern "C" __global__ void softmax_rows(float* y, const float* x, int d, int logp) {
    __shared__ float s[256];
    const float* xr = x + (long)blockIdx.x * d;
    float* yr = y + (long)blockIdx.x * d;
    float lz = row_lse(xr, d, s);
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = logp ? xr[i] - lz : expf(xr[i] - lz);
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

// policy_gradient: step-wise GRPO's per-token objective (kernels.PolicyGradienter's
// PolicyGradient): dlogp[i] = w[i] * (dl/dlogp + beta * dkl/dlogp) with the
// clipped surrogate l and k3 kl; stats[0..3] += sum w*l, sum w*kl, clipped
// tokens, sum ent. old, ref or ent may be null (no ref: no KL term, rl.beta 0).
// Blocks of 256.
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
        float d = ref ? ref[i] - lp : 0.f, ed = expf(d);
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
