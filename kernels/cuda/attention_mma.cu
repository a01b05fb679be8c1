// Tensor-core attention: the tiled kernels' plan (attention.cu) on
// mma.sync.m16n8k16 with bf16 operands and f32 accumulation, as
// FlashAttention-2 runs it. Used in BF16 mode on sm_80 and later for head
// dimensions that are multiples of 16 up to 128; the float32 kernels serve
// everything else. q, k, v and dout arrive as bf16 copies (the GEMMs'
// operand rounding), so a tile is staged by 16-byte asynchronous copies
// (cp.async) into one of two shared buffers while the warps work on the
// other, and fragments leave shared memory by ldmatrix (.trans where a
// product reads a tile down its columns). A warp owns 16 rows of each
// product; a product's f32 accumulator fragments are reused in registers
// as the next product's operand (scores -> probabilities -> P.V). Scores
// are kept in log2 units (exp2). The backward keeps the three passes
// without atomics (row log-sum-exps, unless the forward kept them; dq by
// query blocks; dk and dv by key blocks), so a training step stays
// deterministic. Query blocks run longest first, so that causal attention's
// unequal blocks do not leave a tail.
//
// Fragment layouts of m16n8k16 (PTX ISA), g = lane/4, c = lane%4, each
// register two bf16 with the lower column (or row) in the low half:
//   A 16x16: a[0] (row g, cols 2c, 2c+1), a[1] (row g+8, same cols),
//            a[2] (row g, cols 2c+8, 2c+9), a[3] (row g+8, same cols)
//   B 16x8:  b0 (rows 2c, 2c+1, col g), b1 (rows 2c+8, 2c+9, col g)
//   C 16x8:  c[0], c[1] (row g, cols 2c, 2c+1), c[2], c[3] (row g+8)
// ldmatrix.x4: lane l gives the address of row l%8 of matrix l/8; register
// i receives matrix i's (row g, cols 2c, 2c+1), with .trans its (rows 2c,
// 2c+1, col g).

#define MMA_MAXK 8   // k-steps of 16 over head_dim: hd <= 128
#define MMA_MAXN 16  // n-tiles of 8 over head_dim
#define MMA_BQ 64    // query rows a block (4 warps of 16): forward and dq
#define MMA_BK 64    // keys a tile in the forward; keys a block in dk/dv
#define MMA_BKQ 32   // keys a tile in the dq pass
#define MMA_QT 32    // queries a tile in the dk/dv pass
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

extern __shared__ __align__(16) unsigned short shb[];

// pack2: lo and hi rounded to bf16 (to nearest even) in one register, lo
// in the low half: one cvt on sm_80 and later, where to_bf16's integer
// rounding took a handful of instructions a value.
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
#if defined(AGEMEM_EMULATE) || __CUDA_ARCH__ < 800
    return (unsigned)to_bf16(lo) | ((unsigned)to_bf16(hi) << 16);
#else
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#endif
}

// ex2: 2^x by the SFU alone (ex2.approx.ftz, as FlashAttention-2's
// fast-math exp2f), results below 2^-126 flushed to zero: the
// probabilities they would be are below anything a bf16 P or an f32 sum
// of them at least 1 keeps. exp2f adds a denormal guard of three
// instructions a value.
__device__ __forceinline__ float ex2(float x) {
#if defined(AGEMEM_EMULATE)
    float r = exp2f(x);
    return r < 1.17549435e-38f ? 0.f : r;
#else
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
#endif
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

#if !defined(AGEMEM_EMULATE)
// shared_addr: p's address in the shared window, as ldmatrix and cp.async take it.
__device__ __forceinline__ unsigned shared_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\n" : "=r"(a) : "l"(p));
    return a;
}
#endif

// ldsm: four 8x8 bf16 matrices from shared memory by ldmatrix (T: .trans).
template <bool T>
__device__ __forceinline__ void ldsm(unsigned r[4], const unsigned short* p) {
#if defined(AGEMEM_EMULATE)
    ldsm_emulated(r, p, T);
#elif __CUDA_ARCH__ >= 800
    if (T)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_addr(p)));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_addr(p)));
#else
    __trap();
#endif
}

// The lane's row and column offsets of ldsm for the three ways the kernels
// read a tile: two n-tiles of B at one k-step from rows that are the
// product's columns (b_rows: K for Q.K^T), two n-tiles of B from rows that
// are its k dimension (bt_rows, with .trans: V for P.V), and an A fragment
// (a_rows: K for K.Q^T).
__device__ __forceinline__ int b_row(int lane) { return (lane & 7) + ((lane >> 4) << 3); }
__device__ __forceinline__ int b_col(int lane) { return ((lane >> 3) & 1) << 3; }
__device__ __forceinline__ int bt_row(int lane) { return (lane & 7) + (((lane >> 3) & 1) << 3); }
__device__ __forceinline__ int bt_col(int lane) { return (lane >> 4) << 3; }
#define a_row bt_row
#define a_col bt_col

// cp16: 16 bytes from global to shared memory, asynchronously (zeros when
// !ok; src stays a valid address then).
__device__ __forceinline__ void cp16(unsigned short* dst, const unsigned short* src, bool ok) {
#if defined(AGEMEM_EMULATE)
    cp16_emulated(dst, src, ok); // lands at the cp_wait that covers it
#elif __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_addr(dst)), "l"(src), "r"(ok ? 16 : 0));
#else
    __trap();
#endif
}

__device__ __forceinline__ void cp_commit() {
#if defined(AGEMEM_EMULATE)
    cp_commit_emulated();
#elif __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// cp_wait<N>: this thread's copies but the N most recent groups have landed.
template <int N>
__device__ __forceinline__ void cp_wait() {
#if defined(AGEMEM_EMULATE)
    cp_wait_emulated(N);
#elif __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Stager is a thread's share of staging a tile of rows hd wide by 16-byte
// copies: chunk e = threadIdx.x + k*blockDim.x of a tile is row e/(hd/8),
// chunk e%(hd/8) of it, stepped without dividing again. With the head
// dimension HD known when compiled (and the kernels' 128 threads), a
// thread's chunks are column c of rows r, r + 128/(HD/8), ...: as many
// for every thread, an unrolled run of copies.
template <int HD>
struct Stager {
    int r, c, dr, dc, cpr;
};

template <int HD>
__device__ __forceinline__ Stager<HD> stager(int hd) {
    Stager<HD> s;
    s.cpr = hd >> 3;
    s.r = threadIdx.x / s.cpr;
    s.c = threadIdx.x - s.r * s.cpr;
    s.dr = blockDim.x / s.cpr;
    s.dc = blockDim.x - s.dr * s.cpr;
    return s;
}

// stage: rows r0..r0+n-1 of x (bf16, ld apart) into s [n][sp] by
// asynchronous 16-byte copies; rows at or past lim are zeros.
template <int HD>
__device__ __forceinline__ void stage(const Stager<HD>& st, unsigned short* s, int sp, const unsigned short* x, long ld, int r0, int n, int lim) {
    // Every tile's rows (MMA_BK, MMA_BKQ, MMA_QT) a multiple of the rows
    // the 128 threads copy at once, else some rows would not be staged.
    static_assert(HD == 0 || (MMA_BK % (HD ? 1024 / HD : 1) == 0 && MMA_BKQ % (HD ? 1024 / HD : 1) == 0 &&
                              MMA_QT % (HD ? 1024 / HD : 1) == 0),
                  "a head dimension whose staging rows do not divide the tiles");
    if (HD) {
        const int dr = 128 / (HD ? HD / 8 : 1);
        const int col = st.c << 3;
#pragma unroll
        for (int k = 0; k < n / dr; k++) {
            int r = st.r + k * dr, i = r0 + r;
            cp16(s + r * sp + col, x + (long)min(i, lim - 1) * ld + col, i < lim);
        }
    } else {
        for (int r = st.r, c = st.c; r < n;) {
            int i = r0 + r;
            cp16(s + r * sp + (c << 3), x + (long)min(i, lim - 1) * ld + (c << 3), i < lim);
            r += st.dr;
            c += st.dc;
            if (c >= st.cpr) {
                c -= st.cpr;
                r++;
            }
        }
    }
}

// stage_kv: K and V (unless !with_v) rows jt*rows.. of a tile into buffer
// jt%2 at shb (K, then V tile = rows*sp values on); a group of copies.
template <int HD>
__device__ __forceinline__ void stage_kv(const Stager<HD>& st, int jt, int rows, int sp, const unsigned short* kb,
                                         const unsigned short* vb, long kld, int nk, bool with_v) {
    unsigned short* ks = shb + 2 * (jt & 1) * rows * sp;
    stage(st, ks, sp, kb, kld, jt * rows, rows, nk);
    if (with_v) stage(st, ks + rows * sp, sp, vb, kld, jt * rows, rows, nk);
    cp_commit();
}

// next_kv: waits until tile jt has landed for every thread of the block,
// having started tile jt+1's copies into the other buffer.
template <int HD>
__device__ __forceinline__ void next_kv(const Stager<HD>& st, int jt, int ntiles, int rows, int sp, const unsigned short* kb,
                                        const unsigned short* vb, long kld, int nk, bool with_v) {
    if (jt + 1 < ntiles) {
        stage_kv(st, jt + 1, rows, sp, kb, vb, kld, nk, with_v);
        cp_wait<1>();
    } else {
        cp_wait<0>();
    }
    __syncthreads();
}

// a_from_c: the A fragment of a 16-column k-step made of two C fragments
// (n-tiles lo and hi): a product's output becomes the next one's operand.
__device__ __forceinline__ void a_from_c(unsigned a[4], const float lo[4], const float hi[4]) {
    a[0] = pack2(lo[0], lo[1]);
    a[1] = pack2(lo[2], lo[3]);
    a[2] = pack2(hi[0], hi[1]);
    a[3] = pack2(hi[2], hi[3]);
}

// load_a: the A fragments (k-steps over hd) of rows r0..r0+15 of x (bf16,
// rows ld apart) from global memory; rows at or past lim are zeros.
__device__ __forceinline__ void load_a(unsigned a[MMA_MAXK][4], const unsigned short* x, long ld, int r0, int lim, int hd) {
    int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int kx = 0; kx < MMA_MAXK; kx++)
#pragma unroll
        for (int f = 0; f < 4; f++) {
            int r = r0 + g + 8 * (f & 1), d = kx * 16 + 2 * c + 8 * (f >> 1);
            a[kx][f] = kx * 16 < hd && r < lim ? *(const unsigned*)(x + r * ld + d) : 0u;
        }
}

// zero: n accumulator fragments (n a constant: they stay in registers).
__device__ __forceinline__ void zero(float (*c)[4], int n) {
#pragma unroll
    for (int i = 0; i < n; i++) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.f;
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffff, v, 1);
    return v + __shfl_xor_sync(0xffffffff, v, 2);
}

// attention_mma: causal GQA for queries start..start+t-1 (q [t][heads*hd],
// k and v [start+t][kvheads*hd], bf16). out (f32) gets the values unless
// lse_only; lse, when not null, the rows' natural log-sum-exps of the
// scaled scores. Grid (ceil(t/MMA_BQ), heads), 128 threads. Dynamic shared
// memory: 4*MMA_BK*(hd+8) bf16 (K and V, two buffers each). Three blocks
// an SM (at most 170 registers a thread) hide one another's latency.
template <int HD>
__device__ __forceinline__ void attention_mma_impl(float* out, float* lse, const unsigned short* q, const unsigned short* k, const unsigned short* v, int t,
    int start, int heads, int kvheads, int hd_, int lse_only) {
    const int hd = HD ? HD : hd_; // HD: the head dimension known when compiled
    int h = blockIdx.y, kvh = h / (heads / kvheads);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    int sp = hd + 8, nks = hd / 16, nds = hd / 8, tile = MMA_BK * sp, nk = start + t;
    int i0 = (gridDim.x - 1 - blockIdx.x) * MMA_BQ, iw = i0 + warp * 16;
    long qld = (long)heads * hd, kld = (long)kvheads * hd;
    const unsigned short *kb = k + kvh * hd, *vb = v + kvh * hd;
    float sl2 = rsqrtf((float)hd) * LOG2E;
    Stager<HD> st = stager<HD>(hd);
    unsigned qa[MMA_MAXK][4];
    load_a(qa, q + h * hd, qld, iw, t, hd);
    float o[MMA_MAXN][4];
    zero(o, MMA_MAXN);
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    int last = start + min(i0 + MMA_BQ, t) - 1; // the block's last key
    int wlast = start + min(iw + 16, t) - 1;    // the warp's
    int ntiles = last / MMA_BK + 1;
    // Tile jt's K at shb + 2*(jt%2)*tile, its V right after.
    stage_kv(st, 0, MMA_BK, sp, kb, vb, kld, nk, !lse_only);
    for (int jt = 0; jt < ntiles; jt++) {
        int j0 = jt * MMA_BK;
        const unsigned short* ks = shb + 2 * (jt & 1) * tile;
        const unsigned short* vs = ks + tile;
        next_kv(st, jt, ntiles, MMA_BK, sp, kb, vb, kld, nk, !lse_only);
        if (iw < t && j0 <= wlast) { // uniform per warp
            float s[8][4];
            zero(s, 8);
#pragma unroll
            for (int kx = 0; kx < MMA_MAXK; kx++) {
                if (kx >= nks) break;
#pragma unroll
                for (int nt = 0; nt < 8; nt += 2) {
                    unsigned b[4];
                    ldsm<false>(b, ks + (nt * 8 + b_row(lane)) * sp + kx * 16 + b_col(lane));
                    mma16816(s[nt], qa[kx], b[0], b[1]);
                    mma16816(s[nt + 1], qa[kx], b[2], b[3]);
                }
            }
            // Only a tile reaching past the warp's first row needs the mask
            // (a branch the whole warp takes or skips).
            if (j0 + MMA_BK - 1 > start + iw) {
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (j0 + nt * 8 + 2 * c + (e & 1) > start + iw + g + 8 * (e >> 1)) s[nt][e] = NEG_INF;
            }
            // The row maxima of the raw scores: scaling by sl2 > 0 keeps
            // the maximum, so the scale joins the exponent's FMA.
            float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
            float cr[2], mb[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mn = fmaxf(m[r], quad_max(mx[r]) * sl2);
                mb[r] = mn == NEG_INF ? 0.f : mn; // a row with no key yet: keep zeros
                cr[r] = ex2(m[r] - mb[r]);
                m[r] = mn;
                l[r] *= cr[r];
            }
            // The probabilities, packed as P.V's A fragments at once (half
            // the registers of the f32 scores).
            unsigned pa[4][4];
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[nt][e] = ex2(fmaf(s[nt][e], sl2, -mb[e >> 1]));
                    l[e >> 1] += s[nt][e];
                }
                if (nt & 1) a_from_c(pa[nt >> 1], s[nt - 1], s[nt]);
            }
            if (!lse_only) {
#pragma unroll
                for (int n = 0; n < MMA_MAXN; n++) {
                    o[n][0] *= cr[0];
                    o[n][1] *= cr[0];
                    o[n][2] *= cr[1];
                    o[n][3] *= cr[1];
                }
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
#pragma unroll
                    for (int n = 0; n < MMA_MAXN; n += 2) {
                        if (n >= nds) break;
                        unsigned b[4];
                        ldsm<true>(b, vs + (kk * 16 + bt_row(lane)) * sp + n * 8 + bt_col(lane));
                        mma16816(o[n], pa[kk], b[0], b[1]);
                        mma16816(o[n + 1], pa[kk], b[2], b[3]);
                    }
                }
            }
        }
        __syncthreads(); // tile jt's buffers are free for tile jt+2
    }
    if (iw >= t) return;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float L = quad_sum(l[r]);
        int i = iw + g + 8 * r;
        if (i >= t) continue;
        if (lse && c == 0) lse[(long)i * heads + h] = m[r] * LN2 + logf(L);
        if (lse_only) continue;
        float inv = 1.f / L;
        float* orow = out + i * qld + h * hd + 2 * c;
#pragma unroll
        for (int n = 0; n < MMA_MAXN; n++)
            if (n < nds) *(float2*)(orow + n * 8) = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
}

// attention_mma_dq: dq += scale sum_j ds_ij k_j with ds = p (dout.v_j - D),
// p = exp(scale q.k_j - lse), as attention_bwd_dq (q, k, v, dout bf16).
// Grid (ceil(t/MMA_BQ), heads), 128 threads. Dynamic shared memory:
// 4*MMA_BKQ*(hd+8) bf16.
template <int HD>
__device__ __forceinline__ void attention_mma_dq_impl(float* dq, const unsigned short* q, const unsigned short* k, const unsigned short* v,
    const unsigned short* dout, const float* lse, const float* D, int t, int start, int heads, int kvheads, int hd_) {
    const int hd = HD ? HD : hd_; // HD: the head dimension known when compiled
    int h = blockIdx.y, kvh = h / (heads / kvheads);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    int sp = hd + 8, nks = hd / 16, nds = hd / 8, tile = MMA_BKQ * sp, nk = start + t;
    int i0 = (gridDim.x - 1 - blockIdx.x) * MMA_BQ, iw = i0 + warp * 16;
    long qld = (long)heads * hd, kld = (long)kvheads * hd;
    const unsigned short *kb = k + kvh * hd, *vb = v + kvh * hd;
    float scale = rsqrtf((float)hd), sl2 = scale * LOG2E;
    Stager<HD> st = stager<HD>(hd);
    unsigned qa[MMA_MAXK][4], ga[MMA_MAXK][4];
    load_a(qa, q + h * hd, qld, iw, t, hd);
    load_a(ga, dout + h * hd, qld, iw, t, hd);
    float L2[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int i = iw + g + 8 * r;
        L2[r] = i < t ? lse[(long)i * heads + h] * LOG2E : 0.f;
        Dr[r] = i < t ? D[(long)i * heads + h] : 0.f;
    }
    float acc[MMA_MAXN][4];
    zero(acc, MMA_MAXN);
    int last = start + min(i0 + MMA_BQ, t) - 1, wlast = start + min(iw + 16, t) - 1;
    int ntiles = last / MMA_BKQ + 1;
    stage_kv(st, 0, MMA_BKQ, sp, kb, vb, kld, nk, true);
    for (int jt = 0; jt < ntiles; jt++) {
        int j0 = jt * MMA_BKQ;
        const unsigned short* ks = shb + 2 * (jt & 1) * tile;
        const unsigned short* vs = ks + tile;
        next_kv(st, jt, ntiles, MMA_BKQ, sp, kb, vb, kld, nk, true);
        if (iw < t && j0 <= wlast) {
            float s[4][4], dp[4][4];
            zero(s, 4);
            zero(dp, 4);
#pragma unroll
            for (int kx = 0; kx < MMA_MAXK; kx++) {
                if (kx >= nks) break;
#pragma unroll
                for (int nt = 0; nt < 4; nt += 2) {
                    int o0 = (nt * 8 + b_row(lane)) * sp + kx * 16 + b_col(lane);
                    unsigned b[4];
                    ldsm<false>(b, ks + o0);
                    mma16816(s[nt], qa[kx], b[0], b[1]);
                    mma16816(s[nt + 1], qa[kx], b[2], b[3]);
                    ldsm<false>(b, vs + o0);
                    mma16816(dp[nt], ga[kx], b[0], b[1]);
                    mma16816(dp[nt + 1], ga[kx], b[2], b[3]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = e >> 1;
                    s[nt][e] = ex2(fmaf(s[nt][e], sl2, -L2[r])) * (dp[nt][e] - Dr[r]); // ds
                }
            if (j0 + MMA_BKQ - 1 > start + iw) { // the diagonal tile: its masked scores
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (j0 + nt * 8 + 2 * c + (e & 1) > start + iw + g + 8 * (e >> 1)) s[nt][e] = 0.f;
            }
#pragma unroll
            for (int kk = 0; kk < 2; kk++) {
                unsigned da[4];
                a_from_c(da, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
                for (int n = 0; n < MMA_MAXN; n += 2) {
                    if (n >= nds) break;
                    unsigned b[4];
                    ldsm<true>(b, ks + (kk * 16 + bt_row(lane)) * sp + n * 8 + bt_col(lane));
                    mma16816(acc[n], da, b[0], b[1]);
                    mma16816(acc[n + 1], da, b[2], b[3]);
                }
            }
        }
        __syncthreads();
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

// stage_q: query tile i0.. of head h for attention_mma_dkv: q and dout rows
// into qs and gs by asynchronous copies, the rows' lse (log2 units) and D
// into ls and Ds.
template <int HD>
__device__ __forceinline__ void stage_q(const Stager<HD>& st, unsigned short* qs, unsigned short* gs, float* ls, float* Ds,
                                        const unsigned short* q, const unsigned short* dout, const float* lse,
                                        const float* D, int h, int i0, int t, int heads, int hd) {
    long qld = (long)heads * hd;
    int sp = hd + 8;
    stage(st, qs, sp, q + h * hd, qld, i0, MMA_QT, t);
    stage(st, gs, sp, dout + h * hd, qld, i0, MMA_QT, t);
    if (threadIdx.x < MMA_QT) {
        int i = i0 + threadIdx.x;
        ls[threadIdx.x] = i < t ? lse[(long)i * heads + h] * LOG2E : 0.f;
        Ds[threadIdx.x] = i < t ? D[(long)i * heads + h] : 0.f;
    }
}

// attention_mma_dkv: for the keys of a block and kv head kvh, over the
// heads of its group and the queries that see them: dv += p dout_i,
// dk += scale ds q_i, as attention_bwd_dkv (q, k, v, dout bf16). Grid
// (ceil((start+t)/MMA_BK), kvheads), 128 threads (16 keys a warp). Dynamic
// shared memory: (2*MMA_BK + 4*MMA_QT)*(hd+8) bf16 (K, V, and two buffers
// of q and dout tiles) and 4*MMA_QT floats.
template <int HD>
__device__ __forceinline__ void attention_mma_dkv_impl(float* dk, float* dv, const unsigned short* q, const unsigned short* k, const unsigned short* v,
    const unsigned short* dout, const float* lse, const float* D, int t, int start, int heads, int kvheads, int hd_) {
    const int hd = HD ? HD : hd_; // HD: the head dimension known when compiled
    int kvh = blockIdx.y, group = heads / kvheads;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    int sp = hd + 8, nks = hd / 16, nds = hd / 8, nk = start + t;
    int jb = blockIdx.x * MMA_BK, jw = jb + warp * 16;
    long kld = (long)kvheads * hd;
    float scale = rsqrtf((float)hd), sl2 = scale * LOG2E;
    Stager<HD> st = stager<HD>(hd);
    unsigned short* ks = shb;              // [MMA_BK][sp]
    unsigned short* vs = ks + MMA_BK * sp; // [MMA_BK][sp]
    unsigned short* qt = vs + MMA_BK * sp; // buffer b: q [MMA_QT][sp] at qt + 2*b*MMA_QT*sp, dout after it
    float* lt = (float*)(qt + 4 * MMA_QT * sp); // buffer b: lse at lt + 2*b*MMA_QT, D after it
    stage(st, ks, sp, k + kvh * hd, kld, jb, MMA_BK, nk);
    stage(st, vs, sp, v + kvh * hd, kld, jb, MMA_BK, nk);
    float dka[MMA_MAXN][4], dva[MMA_MAXN][4];
    zero(dka, MMA_MAXN);
    zero(dva, MMA_MAXN);
    int ilo = max(0, jb - start); // the first query any of the block's keys is seen by
    int nq = (t - ilo + MMA_QT - 1) / MMA_QT, ntot = group * nq;
    stage_q(st, qt, qt + MMA_QT * sp, lt, lt + MMA_QT, q, dout, lse, D, kvh * group, ilo, t, heads, hd);
    cp_commit();
    // Tile it is the group's head gi, queries i0..: the next tile's head
    // and first query follow by counting (no division a tile).
    int gi = 0, i0 = ilo, iend = ilo + nq * MMA_QT;
    for (int it = 0; it < ntot; it++) {
        int b = it & 1;
        const unsigned short* qs = qt + 2 * b * MMA_QT * sp;
        const unsigned short* gs = qs + MMA_QT * sp;
        const float* ls = lt + 2 * b * MMA_QT;
        const float* Ds = ls + MMA_QT;
        int gn = gi, in = i0 + MMA_QT;
        if (in == iend) gn++, in = ilo;
        if (it + 1 < ntot) {
            int bn = b ^ 1;
            unsigned short* qn = qt + 2 * bn * MMA_QT * sp;
            stage_q(st, qn, qn + MMA_QT * sp, lt + 2 * bn * MMA_QT, lt + 2 * bn * MMA_QT + MMA_QT, q, dout, lse, D,
                    kvh * group + gn, in, t, heads, hd);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        if (jw < nk && jw <= start + min(i0 + MMA_QT, t) - 1) { // some query of the tile sees the warp's keys
            float st[4][4], dpt[4][4];
            zero(st, 4);
            zero(dpt, 4);
#pragma unroll
            for (int kx = 0; kx < MMA_MAXK; kx++) {
                if (kx >= nks) break;
                unsigned ka[4], va[4];
                int ao = (warp * 16 + a_row(lane)) * sp + kx * 16 + a_col(lane);
                ldsm<false>(ka, ks + ao);
                ldsm<false>(va, vs + ao);
#pragma unroll
                for (int nt = 0; nt < 4; nt += 2) {
                    int o0 = (nt * 8 + b_row(lane)) * sp + kx * 16 + b_col(lane);
                    unsigned bb[4];
                    ldsm<false>(bb, qs + o0);
                    mma16816(st[nt], ka, bb[0], bb[1]);
                    mma16816(st[nt + 1], ka, bb[2], bb[3]);
                    ldsm<false>(bb, gs + o0);
                    mma16816(dpt[nt], va, bb[0], bb[1]);
                    mma16816(dpt[nt + 1], va, bb[2], bb[3]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int il = nt * 8 + 2 * c + (e & 1);
                    float p = ex2(fmaf(st[nt][e], sl2, -ls[il]));
                    dpt[nt][e] = p * (dpt[nt][e] - Ds[il]); // ds
                    st[nt][e] = p;
                }
            // A tile past the last query, or whose first query comes before
            // the warp's last key: the pairs outside the causal triangle.
            if (i0 + MMA_QT > t || jw + 15 > start + i0) {
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int j = jw + g + 8 * (e >> 1), i = i0 + nt * 8 + 2 * c + (e & 1);
                        if (i >= t || j > start + i) st[nt][e] = dpt[nt][e] = 0.f;
                    }
            }
#pragma unroll
            for (int kk = 0; kk < 2; kk++) {
                unsigned pa[4], da[4];
                a_from_c(pa, st[2 * kk], st[2 * kk + 1]);
                a_from_c(da, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
                for (int n = 0; n < MMA_MAXN; n += 2) {
                    if (n >= nds) break;
                    int o0 = (kk * 16 + bt_row(lane)) * sp + n * 8 + bt_col(lane);
                    unsigned bb[4];
                    ldsm<true>(bb, gs + o0);
                    mma16816(dva[n], pa, bb[0], bb[1]);
                    mma16816(dva[n + 1], pa, bb[2], bb[3]);
                    ldsm<true>(bb, qs + o0);
                    mma16816(dka[n], da, bb[0], bb[1]);
                    mma16816(dka[n + 1], da, bb[2], bb[3]);
                }
            }
        }
        __syncthreads(); // buffer b is free for tile it+2
        gi = gn;
        i0 = in;
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
                *(float2*)(kr + n * 8) = make_float2(a.x + scale * dka[n][2 * r], a.y + scale * dka[n][2 * r + 1]);
                *(float2*)(vr + n * 8) = make_float2(b.x + dva[n][2 * r], b.y + dva[n][2 * r + 1]);
            }
    }
}

// The kernels: each for any head dimension the plan takes (hd a multiple
// of 16 up to 128), and compiled for 64 and 128, where the k-step and
// n-tile loops over hd unroll into straight code that ptxas schedules
// across (Backend.mmaKernel picks).
extern "C" __global__ void __launch_bounds__(128, 3) attention_mma(float* out, float* lse, const unsigned short* q, const unsigned short* k, const unsigned short* v, int t,
    int start, int heads, int kvheads, int hd, int lse_only) {
    attention_mma_impl<0>(out, lse, q, k, v, t, start, heads, kvheads, hd, lse_only);
}

extern "C" __global__ void __launch_bounds__(128, 3) attention_mma_hd64(float* out, float* lse, const unsigned short* q, const unsigned short* k, const unsigned short* v, int t,
    int start, int heads, int kvheads, int hd, int lse_only) {
    attention_mma_impl<64>(out, lse, q, k, v, t, start, heads, kvheads, hd, lse_only);
}

extern "C" __global__ void __launch_bounds__(128, 3) attention_mma_hd128(float* out, float* lse, const unsigned short* q, const unsigned short* k, const unsigned short* v, int t,
    int start, int heads, int kvheads, int hd, int lse_only) {
    attention_mma_impl<128>(out, lse, q, k, v, t, start, heads, kvheads, hd, lse_only);
}

extern "C" __global__ void attention_mma_dq(float* dq, const unsigned short* q, const unsigned short* k, const unsigned short* v,
    const unsigned short* dout, const float* lse, const float* D, int t, int start, int heads, int kvheads, int hd) {
    attention_mma_dq_impl<0>(dq, q, k, v, dout, lse, D, t, start, heads, kvheads, hd);
}

extern "C" __global__ void attention_mma_dq_hd64(float* dq, const unsigned short* q, const unsigned short* k, const unsigned short* v,
    const unsigned short* dout, const float* lse, const float* D, int t, int start, int heads, int kvheads, int hd) {
    attention_mma_dq_impl<64>(dq, q, k, v, dout, lse, D, t, start, heads, kvheads, hd);
}

extern "C" __global__ void attention_mma_dq_hd128(float* dq, const unsigned short* q, const unsigned short* k, const unsigned short* v,
    const unsigned short* dout, const float* lse, const float* D, int t, int start, int heads, int kvheads, int hd) {
    attention_mma_dq_impl<128>(dq, q, k, v, dout, lse, D, t, start, heads, kvheads, hd);
}

extern "C" __global__ void attention_mma_dkv(float* dk, float* dv, const unsigned short* q, const unsigned short* k, const unsigned short* v,
    const unsigned short* dout, const float* lse, const float* D, int t, int start, int heads, int kvheads, int hd) {
    attention_mma_dkv_impl<0>(dk, dv, q, k, v, dout, lse, D, t, start, heads, kvheads, hd);
}

extern "C" __global__ void attention_mma_dkv_hd64(float* dk, float* dv, const unsigned short* q, const unsigned short* k, const unsigned short* v,
    const unsigned short* dout, const float* lse, const float* D, int t, int start, int heads, int kvheads, int hd) {
    attention_mma_dkv_impl<64>(dk, dv, q, k, v, dout, lse, D, t, start, heads, kvheads, hd);
}

extern "C" __global__ void attention_mma_dkv_hd128(float* dk, float* dv, const unsigned short* q, const unsigned short* k, const unsigned short* v,
    const unsigned short* dout, const float* lse, const float* D, int t, int start, int heads, int kvheads, int hd) {
    attention_mma_dkv_impl<128>(dk, dv, q, k, v, dout, lse, D, t, start, heads, kvheads, hd);
}
