// Rotary positions; the backward is the same kernel rotating back.
// Row-major float32, shapes in each comment; compiled at run time by NVRTC.

// rope: rotate x[t, heads*hd] in place (rotate-half pairs), token i at pos[i];
// sign -1 rotates back (the backward: a rotation's transpose is its inverse).
extern "C" __global__ void rope(float* x, const int* pos, int t, int heads, int hd, double theta, float sign) {
    int half = hd / 2;
    long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (idx >= (long)t * heads * half) return;
    int j = idx % half;
    long th = idx / half;
    int i = th / heads;
    double a = pos[i] * pow(theta, -2.0 * j / hd);
    float c = (float)cos(a), s = sign * (float)sin(a);
    float* v = x + th * hd;
    float x0 = v[j], x1 = v[j + half];
    v[j] = x0 * c - x1 * s;
    v[j + half] = x1 * c + x0 * s;
}
