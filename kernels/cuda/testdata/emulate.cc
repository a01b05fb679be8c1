// emulate.cc runs attention kernels (attention.cu, attention_mma.cu) on the
// CPU, each GPU thread an OS thread: __syncthreads is a barrier of the block's 128
// threads, a warp's shuffles and mma.sync meet at a barrier of its 32, and
// mma.sync assembles A and B from every lane's fragment registers as the
// PTX ISA lays them out ("Matrix Fragments for mma.m16n8k16 with floating
// point type") and gives each lane its C elements. TestMMAAttentionEmulated
// builds it with the kernels' own source, so their indexing, masking and
// online softmax are checked on machines without a GPU; that the hardware
// lays fragments out as the ISA says is checked on a GPU
// (TestMMAAttentionMatchesFloat32).
//
// Usage: emulate mma IN OUT (mma-early: cp.async landing at once, as below).
// IN: int32 t, start, heads, kvheads, hd, then
// float32 q, k, v, dout. OUT: float32 out, lse, dq, dk, dv.
// emulate rows IN OUT (the attention kernel: a block per query row and
// head). IN: int32 t, start, heads, kvheads, hd, maxT, valid[maxT] (1, 0;
// all -1: no mask), span[2t] (all -1: causal), then float32 q, kc, vc.
// OUT: float32 out.
// emulate paged IN OUT (attention_paged). IN: int32 t, start, heads,
// kvheads, hd, poolRows, rows[start+t], then float32 q, kpool, vpool.
// OUT: float32 out.
// emulate elementwise IN OUT (add_scaled, dropout, narrow_bf16,
// dropout_bf16, dropout_add). IN: int32 n, off, then float32 x, y [off+n]
// (the kernels get x+off, y+off: off 1 misaligns them). OUT: float32
// y + 0.5 x, dropout(x) with p 0.25 and seed 12345, bf16(x) widened,
// bf16(dropout(x)) widened and y + dropout(x), each n long.
// emulate encoder IN OUT (encoder_train.cu). IN: int32 t, heads, hd,
// nseg, bounds[nseg+1], then float32 q, k, v, dout, x, dy [t][heads*hd],
// w [heads*hd], dpool [nseg][heads*hd]. OUT: float32 out, dq, dk, dv of
// the segment attention with dropout 0.3 (seed 99), then dx, dw, db of
// layernorm_backward (x, w, dy, eps 1e-5), dx of gelu_backward (erf,
// then tanh) and of tanh_backward (y = x), and segment_mean_backward's dx.
// emulate decode IN OUT (cache_append and attention_batch). IN: int32 n,
// heads, kvheads, hd, maxT, pos[n], dst[n], off[n], L, rows[L] (the
// kernels' tables), then float32 q, k, v (n rows each) and the caches kc,
// vc ([n][maxT] rows; a paged one's rows in its own order). OUT: float32
// out, kc, vc.
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

struct uint3_ { unsigned x = 0, y = 0, z = 0; };
static thread_local uint3_ threadIdx, blockIdx;
static uint3_ blockDim, gridDim;

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
#define AGEMEM_EMULATE 1

struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
using std::max;
using std::min;

struct Warp {
    std::barrier<> bar{32};
    float xch[32];
    unsigned A[32][4], B[32][2];
    const unsigned short* P[32];
};
static thread_local Warp* warp_;
static thread_local int lane_;
static std::barrier<>* block_;

static void __syncthreads() { block_->arrive_and_wait(); }
static void __trap() { abort(); }

static float shfl_from(float v, int src) {
    warp_->xch[lane_] = v;
    warp_->bar.arrive_and_wait();
    float r = warp_->xch[src & 31];
    warp_->bar.arrive_and_wait();
    return r;
}
static float __shfl_xor_sync(unsigned, float v, int o) { return shfl_from(v, lane_ ^ o); }
static float __shfl_sync(unsigned, float v, int src) { return shfl_from(v, src); }

static std::mutex atomics_;
static float atomicAdd(float* p, float v) {
    std::lock_guard<std::mutex> g(atomics_);
    float old = *p;
    *p = old + v;
    return old;
}

static float bf(unsigned h) {
    unsigned u = h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void mma16816_emulated(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    Warp* w = warp_;
    for (int i = 0; i < 4; i++) w->A[lane_][i] = a[i];
    w->B[lane_][0] = b0;
    w->B[lane_][1] = b1;
    w->bar.arrive_and_wait();
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, t = l & 3;
        for (int e = 0; e < 8; e++) { // a_e: register e/2, half e%2
            int row = g + ((e & 2) ? 8 : 0), col = 2 * t + (e & 1) + (e >= 4 ? 8 : 0);
            unsigned r = w->A[l][e / 2];
            A[row][col] = bf((e & 1) ? r >> 16 : r & 0xffff);
        }
        for (int e = 0; e < 4; e++) { // b_e: register e/2, half e%2
            int row = 2 * t + (e & 1) + (e >= 2 ? 8 : 0);
            unsigned r = e < 2 ? w->B[l][0] : w->B[l][1];
            B[row][g] = bf((e & 1) ? r >> 16 : r & 0xffff);
        }
    }
    w->bar.arrive_and_wait(); // every lane has read before any writes again
    int g = lane_ >> 2, t = lane_ & 3;
    for (int e = 0; e < 4; e++) {
        int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
        double s = c[e];
        for (int k = 0; k < 16; k++) s += (double)A[row][k] * B[k][col];
        c[e] = (float)s;
    }
}

// ldsm_emulated: ldmatrix.x4 (trans: .trans). Lane l gives the address of
// row l%8 of matrix l/8; register i receives matrix i's (row g, cols 2c,
// 2c+1), or with trans its (rows 2c, 2c+1, col g), as the PTX ISA's
// "Warp-level matrix load instruction: ldmatrix" lays them out.
static void ldsm_emulated(unsigned r[4], const unsigned short* p, bool trans) {
    Warp* w = warp_;
    w->P[lane_] = p;
    w->bar.arrive_and_wait();
    int g = lane_ >> 2, c = lane_ & 3;
    for (int i = 0; i < 4; i++) {
        const unsigned short* lo = trans ? w->P[i * 8 + 2 * c] + g : w->P[i * 8 + g] + 2 * c;
        const unsigned short* hi = trans ? w->P[i * 8 + 2 * c + 1] + g : lo + 1;
        r[i] = (unsigned)*lo | ((unsigned)*hi << 16);
    }
    w->bar.arrive_and_wait();
}

// cp.async lands as late as the PTX ISA lets it (mode mma): a thread's
// copies are held until a cp.async.wait_group covers their commit group,
// so a kernel that reads a tile before waiting for it (or before the
// barrier after every thread's wait) reads the tile before, and fails its
// test. Mode mma-early lands each copy as it is issued, so a kernel that
// refills a buffer some warp is still reading (a barrier missing before
// the refill) fails instead.
static bool cp_early_;
struct PendingCopy {
    unsigned short* dst;
    const unsigned short* src;
    bool ok;
};
static thread_local std::vector<PendingCopy> cp_open_;
static thread_local std::vector<std::vector<PendingCopy>> cp_groups_;
static void cp_land(const PendingCopy& c) {
    if (c.ok) memcpy(c.dst, c.src, 16);
    else memset(c.dst, 0, 16);
}
static void cp16_emulated(unsigned short* dst, const unsigned short* src, bool ok) {
    if (cp_early_) cp_land({dst, src, ok});
    else cp_open_.push_back({dst, src, ok});
}
static void cp_commit_emulated() {
    cp_groups_.push_back(std::move(cp_open_));
    cp_open_.clear();
}
static void cp_wait_emulated(int n) {
    while ((int)cp_groups_.size() > n) {
        for (auto& c : cp_groups_.front()) cp_land(c);
        cp_groups_.erase(cp_groups_.begin());
    }
}

#include "common.cuh"
#include "attention.cu"
#include "attention_mma.cu"
#include "elementwise.cu"
#include "embedding.cu"
#include "encoder_train.cu"

alignas(16) unsigned short shb[1 << 16];
alignas(16) float sh[1 << 15];

// launch runs kernel over grid (gx, gy) with 128 threads a block, one
// block at a time.
template <typename F>
static void launch(int gx, int gy, F kernel) {
    blockDim.x = 128;
    gridDim.x = gx;
    gridDim.y = gy;
    for (int by = 0; by < gy; by++)
        for (int bx = 0; bx < gx; bx++) {
            std::barrier<> block(128);
            block_ = &block;
            std::vector<Warp> warps(4);
            std::vector<std::thread> ts;
            for (int i = 0; i < 128; i++)
                ts.emplace_back([&, i] {
                    threadIdx.x = i;
                    blockIdx.x = bx;
                    blockIdx.y = by;
                    warp_ = &warps[i / 32];
                    lane_ = i % 32;
                    kernel();
                    // An exited thread no longer holds barriers up.
                    warp_->bar.arrive_and_drop();
                    block_->arrive_and_drop();
                });
            for (auto& th : ts) th.join();
        }
}

// readall fills each of xs from f.
static bool readall(FILE* f, std::initializer_list<std::vector<float>*> xs) {
    for (auto* x : xs)
        if (fread(x->data(), 4, x->size(), f) != x->size()) return false;
    return true;
}

// narrow: x as bf16 (the kernels' inputs in BF16 mode, from narrow_bf16).
static std::vector<unsigned short> narrow(const std::vector<float>& x) {
    std::vector<unsigned short> b(x.size());
    for (size_t i = 0; i < x.size(); i++) b[i] = to_bf16(x[i]);
    return b;
}

static int mma(FILE* in, FILE* o) {
    int dims[5];
    if (fread(dims, 4, 5, in) != 5) return 3;
    int t = dims[0], start = dims[1], heads = dims[2], kvheads = dims[3], hd = dims[4], nk = start + t;
    std::vector<float> q(t * heads * hd), k(nk * kvheads * hd), v(k.size()), dout(q.size());
    if (!readall(in, {&q, &k, &v, &dout})) return 3;
    std::vector<float> out(q.size()), lse(t * heads), lse2(t * heads), D(t * heads), dq(q.size()), dk(k.size()), dv(k.size());
    auto qb = narrow(q), kb = narrow(k), vb = narrow(v), gb = narrow(dout);
    int nqb = (t + MMA_BQ - 1) / MMA_BQ;
    // The training forward keeps the lse beside the values; the backward
    // without it runs the lse pass alone, which must agree to the bit.
    // The kernels the backend launches for hd (Backend.mmaKernel): those
    // compiled for 64 and 128, else those that take any.
    auto fwd = hd == 64 ? attention_mma_hd64 : hd == 128 ? attention_mma_hd128 : attention_mma;
    auto dqk = hd == 64 ? attention_mma_dq_hd64 : hd == 128 ? attention_mma_dq_hd128 : attention_mma_dq;
    auto dkvk = hd == 64 ? attention_mma_dkv_hd64 : hd == 128 ? attention_mma_dkv_hd128 : attention_mma_dkv;
    launch(nqb, heads, [&] { fwd(out.data(), lse.data(), qb.data(), kb.data(), vb.data(), t, start, heads, kvheads, hd, 0); });
    launch(nqb, heads, [&] { fwd(nullptr, lse2.data(), qb.data(), kb.data(), vb.data(), t, start, heads, kvheads, hd, 1); });
    if (memcmp(lse.data(), lse2.data(), 4 * lse.size()) != 0) {
        fprintf(stderr, "the lse pass differs from the forward's lse\n");
        return 5;
    }
    for (int r = 0; r < t * heads; r++) { // attention_rowdot
        double a = 0;
        for (int d = 0; d < hd; d++) a += (double)dout[r * hd + d] * out[r * hd + d];
        D[r] = (float)a;
    }
    launch(nqb, heads, [&] { dqk(dq.data(), qb.data(), kb.data(), vb.data(), gb.data(), lse.data(), D.data(), t, start, heads, kvheads, hd); });
    launch((nk + MMA_BK - 1) / MMA_BK, kvheads, [&] {
        dkvk(dk.data(), dv.data(), qb.data(), kb.data(), vb.data(), gb.data(), lse.data(), D.data(), t, start, heads, kvheads, hd);
    });
    for (auto* x : {&out, &lse, &dq, &dk, &dv}) fwrite(x->data(), 4, x->size(), o);
    return 0;
}

static int elementwise(FILE* in, FILE* o) {
    int dims[2];
    if (fread(dims, 4, 2, in) != 2) return 3;
    int n = dims[0], off = dims[1];
    std::vector<float> x(off + n), y(off + n), d(off + n);
    if (!readall(in, {&x, &y})) return 3;
    std::vector<float> ya = y; // dropout_add's y
    std::vector<unsigned short> b(off + n), db(off + n);
    int g = (n + 3) / 4, nb = (g + 127) / 128;
    launch(nb, 1, [&] { add_scaled(y.data() + off, x.data() + off, 0.5f, n); });
    unsigned long long thr = (unsigned long long)(0.25 * 18446744073709551616.0);
    launch(nb, 1, [&] { dropout(d.data() + off, x.data() + off, n, 12345, thr, 1 / 0.75f); });
    launch(nb, 1, [&] { narrow_bf16(b.data() + off, x.data() + off, n); });
    launch(nb, 1, [&] { dropout_bf16(db.data() + off, x.data() + off, n, 12345, thr, 1 / 0.75f); });
    launch(nb, 1, [&] { dropout_add(ya.data() + off, x.data() + off, n, 12345, thr, 1 / 0.75f); });
    std::vector<float> w(n), wd(n);
    for (int i = 0; i < n; i++) w[i] = bf(b[off + i]), wd[i] = bf(db[off + i]);
    fwrite(y.data() + off, 4, n, o);
    fwrite(d.data() + off, 4, n, o);
    fwrite(w.data(), 4, n, o);
    fwrite(wd.data(), 4, n, o);
    fwrite(ya.data() + off, 4, n, o);
    return 0;
}

static int encoder(FILE* in, FILE* o) {
    int dims[4];
    if (fread(dims, 4, 4, in) != 4) return 3;
    int t = dims[0], heads = dims[1], hd = dims[2], nseg = dims[3], d = heads * hd;
    std::vector<int> bounds(nseg + 1), span(2 * t);
    if (fread(bounds.data(), 4, nseg + 1, in) != (size_t)(nseg + 1)) return 3;
    int longest = 0;
    for (int s = 0; s < nseg; s++) {
        longest = std::max(longest, bounds[s + 1] - bounds[s]);
        for (int i = bounds[s]; i < bounds[s + 1]; i++) span[2 * i] = bounds[s], span[2 * i + 1] = bounds[s + 1];
    }
    std::vector<float> q(t * d), k(q.size()), v(q.size()), dout(q.size()), x(q.size()), dy(q.size()), w(d), dpool(nseg * d);
    if (!readall(in, {&q, &k, &v, &dout, &x, &dy, &w, &dpool})) return 3;
    std::vector<float> out(q.size()), dq(q.size()), dk(q.size()), dv(q.size()), dx(q.size()), dw(d), db(d), ge(q.size()),
        gt(q.size()), th(q.size()), dm(q.size());
    unsigned long long thr = (unsigned long long)(0.3 * 18446744073709551616.0);
    float inv = 1 / 0.7f;
    launch(t * heads, 1, [&] { segment_attention_drop(out.data(), q.data(), k.data(), v.data(), span.data(), heads, hd, t, longest, 99, thr, inv); });
    launch(t * heads, 1, [&] {
        segment_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), span.data(), heads, hd, t,
                                   longest, 99, thr, inv);
    });
    launch(t, 1, [&] { layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), d, 1e-5f); });
    int nb = (t * d + 127) / 128;
    launch(nb, 1, [&] { gelu_backward(ge.data(), dy.data(), x.data(), t * d, 0); });
    launch(nb, 1, [&] { gelu_backward(gt.data(), dy.data(), x.data(), t * d, 1); });
    launch(nb, 1, [&] { tanh_backward(th.data(), dy.data(), x.data(), t * d); });
    launch(nseg, 1, [&] { segment_mean_backward(dm.data(), dpool.data(), bounds.data(), d); });
    for (auto* r : {&out, &dq, &dk, &dv, &dx, &dw, &db, &ge, &gt, &th, &dm}) fwrite(r->data(), 4, r->size(), o);
    return 0;
}

static int decode(FILE* in, FILE* o) {
    int dims[5];
    if (fread(dims, 4, 5, in) != 5) return 3;
    int n = dims[0], heads = dims[1], kvheads = dims[2], hd = dims[3], maxT = dims[4], kw = kvheads * hd;
    std::vector<int> pos(n), dst(n), off(n);
    int L;
    if (fread(pos.data(), 4, n, in) != (size_t)n || fread(dst.data(), 4, n, in) != (size_t)n ||
        fread(off.data(), 4, n, in) != (size_t)n || fread(&L, 4, 1, in) != 1)
        return 3;
    std::vector<int> rowsFlat(L + 1);
    if (L > 0 && fread(rowsFlat.data(), 4, L, in) != (size_t)L) return 3;
    std::vector<float> q(n * heads * hd), k(n * kw), v(k.size()), kc(n * maxT * kw), vc(kc.size()), out(q.size());
    if (!readall(in, {&q, &k, &v, &kc, &vc})) return 3;
    std::vector<unsigned long long> kcs(n), vcs(n);
    for (int r = 0; r < n; r++) {
        kcs[r] = (unsigned long long)(kc.data() + (long)r * maxT * kw);
        vcs[r] = (unsigned long long)(vc.data() + (long)r * maxT * kw);
    }
    launch(n, 1, [&] { cache_append(kcs.data(), vcs.data(), k.data(), v.data(), dst.data(), kw); });
    launch(n * heads, 1, [&] {
        attention_batch(out.data(), q.data(), kcs.data(), vcs.data(), rowsFlat.data(), off.data(), pos.data(), heads, kvheads, hd);
    });
    for (auto* x : {&out, &kc, &vc}) fwrite(x->data(), 4, x->size(), o);
    return 0;
}

static int rows(FILE* in, FILE* o) {
    int dims[6];
    if (fread(dims, 4, 6, in) != 6) return 3;
    int t = dims[0], start = dims[1], heads = dims[2], kvheads = dims[3], hd = dims[4], maxT = dims[5];
    std::vector<int> valid(maxT), span(2 * t);
    if (fread(valid.data(), 4, maxT, in) != (size_t)maxT || fread(span.data(), 4, 2 * t, in) != (size_t)(2 * t)) return 3;
    std::vector<float> q(t * heads * hd), kc(maxT * kvheads * hd), vc(kc.size()), out(q.size());
    if (!readall(in, {&q, &kc, &vc})) return 3;
    const int* vp = valid[0] < 0 ? nullptr : valid.data();
    const int* sp = span[0] < 0 ? nullptr : span.data();
    launch(t * heads, 1, [&] { attention(out.data(), q.data(), kc.data(), vc.data(), vp, sp, start, heads, kvheads, hd); });
    fwrite(out.data(), 4, out.size(), o);
    return 0;
}

static int paged(FILE* in, FILE* o) {
    int dims[6];
    if (fread(dims, 4, 6, in) != 6) return 3;
    int t = dims[0], start = dims[1], heads = dims[2], kvheads = dims[3], hd = dims[4], poolRows = dims[5];
    std::vector<int> rowsOf(start + t);
    if (fread(rowsOf.data(), 4, rowsOf.size(), in) != rowsOf.size()) return 3;
    std::vector<float> q(t * heads * hd), kp(poolRows * kvheads * hd), vp(kp.size()), out(q.size());
    if (!readall(in, {&q, &kp, &vp})) return 3;
    launch(t * heads, 1, [&] { attention_paged(out.data(), q.data(), kp.data(), vp.data(), rowsOf.data(), start, heads, kvheads, hd); });
    fwrite(out.data(), 4, out.size(), o);
    return 0;
}

int main(int argc, char** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: emulate mma|mma-early|elementwise|encoder|decode|rows|paged IN OUT\n");
        return 2;
    }
    FILE* in = fopen(argv[2], "rb");
    FILE* o = fopen(argv[3], "wb");
    if (!in || !o) return 3;
    std::string mode = argv[1];
    if (mode == "mma-early") {
        cp_early_ = true;
        mode = "mma";
    }
    int rc = mode == "mma" ? mma(in, o) : mode == "elementwise" ? elementwise(in, o) : mode == "encoder" ? encoder(in, o) : mode == "decode" ? decode(in, o) : mode == "rows" ? rows(in, o) : mode == "paged" ? paged(in, o) : 2;
    fclose(in);
    return fclose(o) == 0 ? rc : 4;
}
