// Tensor-core attention: the tiled kernels' plan (attention.cu) on
// mma.sync.m16n8k16 with bf16 operands and f32 accumulation, as
// FlashAttention-2 runs it. Used in BF16 mode on sm_80 and later for head
// dimensions that are multiples of 16 up to 128; the float32 kernels serve
// everything else. A warp owns 16 rows of each product; a product's f32
// accumulator fragments are reused in registers as the next product's
// operand (scores -> probabilities -> P.V); K, V, Q and dout tiles are
// staged in shared memory as bf16. The backward keeps the three passes
// without atomics (row log-sum-exps, dq by query blocks, dk and dv by key
// blocks), so a training step stays deterministic.
//
// Fragment layouts of m16n8k16 (PTX ISA), g = lane/4, c = lane%4, each
// register two bf16 with the lower column (or row) in the low half:
//   A 16x16: a[0] (row g, cols 2c, 2c+1), a[1] (row g+8, same cols),
//            a[2] (row g, cols 2c+8, 2c+9), a[3] (row g+8, same cols)
//   B 16x8:  b0 (rows 2c, 2c+1, col g), b1 (rows 2c+8, 2c+9, col g)
//   C 16x8:  c[0], c[1] (row g, cols 2c, 2c+1), c[2], c[3] (row g+8)

#define MMA_MAXK 8   // k-steps of 16 over head_dim: hd <= 128
#define MMA_MAXN 16  // n-tiles of 8 over head_dim
#define MMA_BQ 64    // query rows a block (4 warps of 16): forward and dq
#define MMA_BK 64    // keys a tile in the forward; keys a block in dk/dv
#define MMA_BKQ 32   // keys a tile in the dq pass
#define MMA_QT 16    // queries a tile in the dk/dv pass

extern __shared__ __align__(16) unsigned short shb[];

__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    return (unsigned)to_bf16(lo) | ((unsigned)to_bf16(hi) << 16);
}

// mma16816: c += a . b (16x16 bf16 times 16x8 bf16, f32 accumulators).
__device__ __forceinline__ void mma16816(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
#if defined(AGEMEM_EMULATE)
    mma16816_emulated(c, a, b0, b1); // testdata/emulate.cc runs these kernels on the CPU
#elif __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap(); // launched on sm_80 and later only (Backend.mmaAttention)
#endif
}

// ld32: s[o] and s[o+1] (one row, two columns) as one register.
__device__ __forceinline__ unsigned ld32(const unsigned short* s, int o) { return *(const unsigned*)(s + o); }

// ld_col2: s[o] and s[o+stride] (two rows, one column) as one register.
__device__ __forceinline__ unsigned ld_col2(const unsigned short* s, int o, int stride) {
    return (unsigned)s[o] | ((unsigned)s[o + stride] << 16);
}

// a_from_c: the A fragment of a 16-column k-step made of two C fragments
// (n-tiles lo and hi): a product's output becomes the next one's operand.
__device__ __forceinline__ void a_from_c(unsigned a[4], const float lo[4], const float hi[4]) {
    a[0] = pack2(lo[0], lo[1]);
    a[1] = pack2(lo[2], lo[3]);
    a[2] = pack2(hi[0], hi[1]);
    a[3] = pack2(hi[2], hi[3]);
}

// frag_a: the A fragment of rows r0..r0+15, columns k0..k0+15 of s.
__device__ __forceinline__ void frag_a(unsigned a[4], const unsigned short* s, int sp, int r0, int k0) {
    int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const unsigned short* p = s + (r0 + g) * sp + k0 + 2 * c;
    a[0] = ld32(p, 0);
    a[1] = ld32(p, 8 * sp);
    a[2] = ld32(p, 8);
    a[3] = ld32(p, 8 * sp + 8);
}

// load_a: the A fragments (k-steps over hd) of rows r0..r0+15 of x, rows
// ld floats apart, times mul; rows at or past lim are zeros.
__device__ __forceinline__ void load_a(unsigned a[MMA_MAXK][4], const float* x, long ld, int r0, int lim, int hd, float mul) {
    int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int kx = 0; kx < MMA_MAXK; kx++) {
#pragma unroll
        for (int f = 0; f < 4; f++) {
            int r = r0 + g + 8 * (f & 1), d = kx * 16 + 2 * c + 8 * (f >> 1);
            float2 v = make_float2(0.f, 0.f);
            if (kx * 16 < hd && r < lim) v = *(const float2*)(x + r * ld + d);
            a[kx][f] = pack2(v.x * mul, v.y * mul);
        }
    }
}

// stage_rows: rows r0..r0+n-1 of x (ld floats apart, hd wide) times mul
// into s [n][sp] as bf16; rows at or past lim are zeros.
__device__ void stage_rows(unsigned short* s, int sp, const float* x, long ld, int r0, int n, int lim, int hd, float mul) {
    int half = hd >> 1;
    for (int e = threadIdx.x; e < n * half; e += blockDim.x) {
        int r = e / half, d = 2 * (e - r * half), i = r0 + r;
        float2 v = make_float2(0.f, 0.f);
        if (i < lim) v = *(const float2*)(x + i * ld + d);
        *(unsigned*)(s + r * sp + d) = pack2(v.x * mul, v.y * mul);
    }
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffff, v, 1);
    return v + __shfl_xor_sync(0xffffffff, v, 2);
}

// attention_mma: causal GQA for queries start..start+t-1, as
// attention_tiled (the same arguments; lse_only: the row log-sum-exps
// alone). Grid (ceil(t/MMA_BQ), heads), 128 threads. Dynamic shared
// memory: 2*MMA_BK*(hd+8) bf16.
extern "C" __global__ void attention_mma(float* out, float* lse, const float* q, const float* k, const float* v,
                                         int t, int start, int heads, int kvheads, int hd, int lse_only) {
    int h = blockIdx.y, kvh = h / (heads / kvheads);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    int sp = hd + 8, nks = hd / 16, nds = hd / 8;
    unsigned short* ks = shb;             // [MMA_BK][sp]
    unsigned short* vs = ks + MMA_BK * sp; // [MMA_BK][sp]
    int i0 = blockIdx.x * MMA_BQ, iw = i0 + warp * 16;
    long qld = (long)heads * hd, kld = (long)kvheads * hd;
    float scale = rsqrtf((float)hd);
    unsigned qa[MMA_MAXK][4];
    load_a(qa, q + h * hd, qld, iw, t, hd, scale);
    float o[MMA_MAXN][4];
#pragma unroll
    for (int n = 0; n < MMA_MAXN; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    int last = start + min(i0 + MMA_BQ, t) - 1;  // the block's last key
    int wlast = start + min(iw + 16, t) - 1;     // the warp's
    for (int j0 = 0; j0 <= last; j0 += MMA_BK) {
        __syncthreads(); // the previous tile is consumed
        stage_rows(ks, sp, k + kvh * hd, kld, j0, MMA_BK, start + t, hd, 1.f);
        if (!lse_only) stage_rows(vs, sp, v + kvh * hd, kld, j0, MMA_BK, start + t, hd, 1.f);
        __syncthreads();
        if (iw >= t || j0 > wlast) continue; // uniform per warp
        float s[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
            for (int kx = 0; kx < MMA_MAXK; kx++) {
                if (kx >= nks) break;
                const unsigned short* kr = ks + (nt * 8 + g) * sp + kx * 16 + 2 * c;
                mma16816(s[nt], qa[kx], ld32(kr, 0), ld32(kr, 8));
            }
        }
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int j = j0 + nt * 8 + 2 * c + (e & 1), i = iw + g + 8 * (e >> 1);
                if (i >= t || j > start + i) s[nt][e] = NEG_INF;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
            }
        float cr[2], mb[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mn = fmaxf(m[r], quad_max(mx[r]));
            mb[r] = mn == NEG_INF ? 0.f : mn; // a row with no key yet: keep zeros
            cr[r] = expf(m[r] - mb[r]);
            m[r] = mn;
            l[r] *= cr[r];
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[nt][e] = expf(s[nt][e] - mb[e >> 1]);
                l[e >> 1] += s[nt][e];
            }
        if (lse_only) continue;
#pragma unroll
        for (int n = 0; n < MMA_MAXN; n++) {
            o[n][0] *= cr[0];
            o[n][1] *= cr[0];
            o[n][2] *= cr[1];
            o[n][3] *= cr[1];
        }
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            unsigned pa[4];
            a_from_c(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int n = 0; n < MMA_MAXN; n++) {
                if (n >= nds) break;
                int o0 = (kk * 16 + 2 * c) * sp + n * 8 + g;
                mma16816(o[n], pa, ld_col2(vs, o0, sp), ld_col2(vs, o0 + 8 * sp, sp));
            }
        }
    }
    if (iw >= t) return;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float L = quad_sum(l[r]);
        int i = iw + g + 8 * r;
        if (i >= t) continue;
        if (lse && c == 0) lse[(long)i * heads + h] = m[r] + logf(L);
        if (lse_only) continue;
        float inv = 1.f / L;
        float* orow = out + i * qld + h * hd + 2 * c;
#pragma unroll
        for (int n = 0; n < MMA_MAXN; n++)
            if (n < nds) *(float2*)(orow + n * 8) = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
}

// attention_mma_dq: dq += scale sum_j ds_ij k_j with ds = p (dout.v_j - D),
// p = exp(scale q.k_j - lse), as attention_bwd_dq. Grid (ceil(t/MMA_BQ),
// heads), 128 threads. Dynamic shared memory: 2*MMA_BKQ*(hd+8) bf16.
extern "C" __global__ void attention_mma_dq(float* dq, const float* q, const float* k, const float* v,
                                            const float* dout, const float* lse, const float* D,
                                            int t, int start, int heads, int kvheads, int hd) {
    int h = blockIdx.y, kvh = h / (heads / kvheads);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    int sp = hd + 8, nks = hd / 16, nds = hd / 8;
    unsigned short* ks = shb;              // [MMA_BKQ][sp]
    unsigned short* vs = ks + MMA_BKQ * sp; // [MMA_BKQ][sp]
    int i0 = blockIdx.x * MMA_BQ, iw = i0 + warp * 16;
    long qld = (long)heads * hd, kld = (long)kvheads * hd;
    float scale = rsqrtf((float)hd);
    unsigned qa[MMA_MAXK][4], ga[MMA_MAXK][4];
    load_a(qa, q + h * hd, qld, iw, t, hd, scale);
    load_a(ga, dout + h * hd, qld, iw, t, hd, 1.f);
    float L[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int i = iw + g + 8 * r;
        L[r] = i < t ? lse[(long)i * heads + h] : 0.f;
        Dr[r] = i < t ? D[(long)i * heads + h] : 0.f;
    }
    float acc[MMA_MAXN][4];
#pragma unroll
    for (int n = 0; n < MMA_MAXN; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    int last = start + min(i0 + MMA_BQ, t) - 1, wlast = start + min(iw + 16, t) - 1;
    for (int j0 = 0; j0 <= last; j0 += MMA_BKQ) {
        __syncthreads();
        stage_rows(ks, sp, k + kvh * hd, kld, j0, MMA_BKQ, start + t, hd, 1.f);
        stage_rows(vs, sp, v + kvh * hd, kld, j0, MMA_BKQ, start + t, hd, 1.f);
        __syncthreads();
        if (iw >= t || j0 > wlast) continue;
        float s[4][4], dp[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
            dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] = 0.f;
#pragma unroll
            for (int kx = 0; kx < MMA_MAXK; kx++) {
                if (kx >= nks) break;
                int o0 = (nt * 8 + g) * sp + kx * 16 + 2 * c;
                mma16816(s[nt], qa[kx], ld32(ks, o0), ld32(ks, o0 + 8));
                mma16816(dp[nt], ga[kx], ld32(vs, o0), ld32(vs, o0 + 8));
            }
        }
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int j = j0 + nt * 8 + 2 * c + (e & 1), i = iw + g + 8 * (e >> 1), r = e >> 1;
                float p = i < t && j <= start + i ? expf(s[nt][e] - L[r]) : 0.f;
                s[nt][e] = p * (dp[nt][e] - Dr[r]); // ds
            }
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            unsigned da[4];
            a_from_c(da, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int n = 0; n < MMA_MAXN; n++) {
                if (n >= nds) break;
                int o0 = (kk * 16 + 2 * c) * sp + n * 8 + g;
                mma16816(acc[n], da, ld_col2(ks, o0, sp), ld_col2(ks, o0 + 8 * sp, sp));
            }
        }
    }
    if (iw >= t) return;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int i = iw + g + 8 * r;
        if (i >= t) continue;
        float* row = dq + i * qld + h * hd + 2 * c;
#pragma unroll
        for (int n = 0; n < MMA_MAXN; n++)
            if (n < nds) {
                float2 w = *(float2*)(row + n * 8);
                *(float2*)(row + n * 8) = make_float2(w.x + scale * acc[n][2 * r], w.y + scale * acc[n][2 * r + 1]);
            }
    }
}

// attention_mma_dkv: for the keys of a block and kv head kvh, over the
// heads of its group and the queries that see them: dv += p dout_i,
// dk += scale ds q_i, as attention_bwd_dkv. Grid (ceil((start+t)/MMA_BK),
// kvheads), 128 threads (16 keys a warp). Dynamic shared memory:
// (2*MMA_BK + 2*MMA_QT)*(hd+8) bf16 and 2*MMA_QT floats.
extern "C" __global__ void attention_mma_dkv(float* dk, float* dv, const float* q, const float* k, const float* v,
                                             const float* dout, const float* lse, const float* D,
                                             int t, int start, int heads, int kvheads, int hd) {
    int kvh = blockIdx.y, group = heads / kvheads;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    int sp = hd + 8, nks = hd / 16, nds = hd / 8, nk = start + t;
    int jb = blockIdx.x * MMA_BK, jw = jb + warp * 16;
    long qld = (long)heads * hd, kld = (long)kvheads * hd;
    float scale = rsqrtf((float)hd);
    unsigned short* ks = shb;              // [MMA_BK][sp]
    unsigned short* vs = ks + MMA_BK * sp;  // [MMA_BK][sp]
    unsigned short* qs = vs + MMA_BK * sp;  // [MMA_QT][sp], pre-scaled
    unsigned short* gs = qs + MMA_QT * sp;  // [MMA_QT][sp] dout
    float* ls = (float*)(gs + MMA_QT * sp); // [MMA_QT] lse
    float* Ds = ls + MMA_QT;                // [MMA_QT] D
    stage_rows(ks, sp, k + kvh * hd, kld, jb, MMA_BK, nk, hd, 1.f);
    stage_rows(vs, sp, v + kvh * hd, kld, jb, MMA_BK, nk, hd, 1.f);
    float dka[MMA_MAXN][4], dva[MMA_MAXN][4];
#pragma unroll
    for (int n = 0; n < MMA_MAXN; n++) {
        dka[n][0] = dka[n][1] = dka[n][2] = dka[n][3] = 0.f;
        dva[n][0] = dva[n][1] = dva[n][2] = dva[n][3] = 0.f;
    }
    int ilo = max(0, jb - start); // the first query any of the block's keys is seen by
    for (int gi = 0; gi < group; gi++) {
        int h = kvh * group + gi;
        for (int i0 = ilo; i0 < t; i0 += MMA_QT) {
            __syncthreads();
            stage_rows(qs, sp, q + h * hd, qld, i0, MMA_QT, t, hd, scale);
            stage_rows(gs, sp, dout + h * hd, qld, i0, MMA_QT, t, hd, 1.f);
            if (threadIdx.x < MMA_QT) {
                int i = i0 + threadIdx.x;
                ls[threadIdx.x] = i < t ? lse[(long)i * heads + h] : 0.f;
                Ds[threadIdx.x] = i < t ? D[(long)i * heads + h] : 0.f;
            }
            __syncthreads();
            if (jw >= nk || jw > start + min(i0 + MMA_QT, t) - 1) continue; // no query of the tile sees the warp's keys
            float st[2][4], dpt[2][4];
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                st[nt][0] = st[nt][1] = st[nt][2] = st[nt][3] = 0.f;
                dpt[nt][0] = dpt[nt][1] = dpt[nt][2] = dpt[nt][3] = 0.f;
            }
#pragma unroll
            for (int kx = 0; kx < MMA_MAXK; kx++) {
                if (kx >= nks) break;
                unsigned ka[4], va[4];
                frag_a(ka, ks, sp, warp * 16, kx * 16);
                frag_a(va, vs, sp, warp * 16, kx * 16);
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    int o0 = (nt * 8 + g) * sp + kx * 16 + 2 * c;
                    mma16816(st[nt], ka, ld32(qs, o0), ld32(qs, o0 + 8));
                    mma16816(dpt[nt], va, ld32(gs, o0), ld32(gs, o0 + 8));
                }
            }
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int j = jw + g + 8 * (e >> 1), il = nt * 8 + 2 * c + (e & 1), i = i0 + il;
                    float p = i < t && j < nk && j <= start + i ? expf(st[nt][e] - ls[il]) : 0.f;
                    dpt[nt][e] = p * (dpt[nt][e] - Ds[il]); // ds
                    st[nt][e] = p;
                }
            unsigned pa[4], da[4];
            a_from_c(pa, st[0], st[1]);
            a_from_c(da, dpt[0], dpt[1]);
#pragma unroll
            for (int n = 0; n < MMA_MAXN; n++) {
                if (n >= nds) break;
                int o0 = 2 * c * sp + n * 8 + g;
                mma16816(dva[n], pa, ld_col2(gs, o0, sp), ld_col2(gs, o0 + 8 * sp, sp));
                mma16816(dka[n], da, ld_col2(qs, o0, sp), ld_col2(qs, o0 + 8 * sp, sp));
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int j = jw + g + 8 * r;
        if (j >= nk) continue;
        float* kr = dk + j * kld + kvh * hd + 2 * c;
        float* vr = dv + j * kld + kvh * hd + 2 * c;
#pragma unroll
        for (int n = 0; n < MMA_MAXN; n++)
            if (n < nds) {
                float2 a = *(float2*)(kr + n * 8), b = *(float2*)(vr + n * 8);
                *(float2*)(kr + n * 8) = make_float2(a.x + dka[n][2 * r], a.y + dka[n][2 * r + 1]);
                *(float2*)(vr + n * 8) = make_float2(b.x + dva[n][2 * r], b.y + dva[n][2 * r + 1]);
            }
    }
}
