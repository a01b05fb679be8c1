// Nearest neighbours: top-k selection over row slices.
// Row-major float32, shapes in each comment; compiled at run time by NVRTC.

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
