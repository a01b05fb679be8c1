// Embedding lookups (f32 and bf16 tables), their backward, and pooling.
// Row-major float32, shapes in each comment; compiled at run time by NVRTC.

// embedding: out[i, :] = table[ids[i], :] (float32 table).
extern "C" __global__ void embedding_f32(float* out, const float* table, const int* ids, int d) {
    const float* row = table + (long)ids[blockIdx.x] * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) out[(long)blockIdx.x * d + c] = row[c];
}

// embedding_bf16: out[i, :] = float(table[ids[i], :]) for a bf16 table.
extern "C" __global__ void embedding_bf16(float* out, const unsigned short* table, const int* ids, int d) {
    const unsigned short* row = table + (long)ids[blockIdx.x] * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x)
        out[(long)blockIdx.x * d + c] = __int_as_float(((unsigned int)row[c]) << 16);
}

// embedding_backward: dtable[ids[i], :] += dy[i, :]; one block a row.
extern "C" __global__ void embedding_backward(float* dtable, const float* dy, const int* ids, int d) {
    float* dst = dtable + (long)ids[blockIdx.x] * d;
    const float* src = dy + (long)blockIdx.x * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) atomicAdd(dst + c, src[c]);
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
