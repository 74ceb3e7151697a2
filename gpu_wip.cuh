// gpu_wip.cuh: staging area for ninfer.cu's gpu sections (kernels, gpu forward). included
// once, from ninfer.cu, after the cpu reference; folded into ninfer.cu when it lands.
//
// defines (the kernel layer; every kernel is `op_kernel` + one host launcher `op(...)`):
//   helpers:    bf16_t, CEIL_DIV, SlotMap semantics, warp/block reductions
//   gemv:       quantized / bf16 matrix times a few activation columns (decode), tensor cores
//   norms:      rmsnorm (1+w and plain), gated_rmsnorm (x silu(z)), l2norm
//   elementwise: swiglu, embed_gather (any weight format, per-token overrides), mrope
//   gdn:        conv_step / conv_prefill / conv_state_update, gdn_gates, gdn_step (recurrent decode)
//   attention:  kv_append (bf16), attn_decode (split-k over context, gqa) + attn_combine (x sigmoid gate)
//   sampling:   argmax (two-stage, lowest id on ties)
//
// conventions (all kernels):
//   activations are [columns][features], features fastest, with a row stride `ld` in elements;
//   a "column" is one token (decode batches a few: mtp verification, several sequences).
//   activations are bf16 with fp32 math inside; the rounding points follow model.md 8 and are
//   stated per kernel, so the cpu twins in test/test_kernels.cu can round at the same places.
//   weights are read in their stored format (format.md 6-7) through `Mat` views; nothing is
//   dequantized into a copy.
//   state slots (gdn recurrent state, conv state): one layer's state for slot s lives at
//   base + s * slot_stride. decode kernels take a device array `slots` of 2*C ints: slots[c] is
//   the slot column c reads its state from (-1: continue from column c-1's result; at column 0,
//   -1 means a zero state), slots[C + c] the slot it writes its state after column c to (-1:
//   don't write). so mtp verification reads slot i once and snapshots every column into its own
//   slot (model.md 5.3), plain decode reads and writes one slot in place, and C independent
//   sequences each read and write their own. the slots live on the device, so a cuda graph
//   replays with whatever slots the previous step chose.
#pragma once
#include <cuda_bf16.h>  // defines: __nv_bfloat16, __float2bfloat16, __bfloat162float
#include <cuda_fp16.h>  // defines: __half2float, __ushort_as_half

typedef __nv_bfloat16 bf16_t;

#ifndef CEIL_DIV
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
#endif

// ----------------------------------------------------------------------------
// device helpers

__device__ __forceinline__ float bf2f(bf16_t x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16_t f2bf(float x) { return __float2bfloat16(x); }  // round to nearest even
__device__ __forceinline__ float bfround(float x) { return __bfloat162float(__float2bfloat16(x)); }
__device__ __forceinline__ float f16bits2f(uint32_t u) { return __half2float(__ushort_as_half((unsigned short)u)); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// sum over the block (blockDim.x a multiple of 32); every thread gets the result
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float sh[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // sh may still be read by a previous call
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.f;
    return warp_sum(v);
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }
// torch's softplus: linear above 20
__device__ __forceinline__ float softplus_f(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// ----------------------------------------------------------------------------
// gemv: y[c][r] = sum_k W[r,k] x[c][k] for c < C (1..8 per launch), decode's matrix op
//
// batch-1 decode reads every weight byte once per token, so this kernel is a memory stream:
// the target is the copy bandwidth. the design, and why:
//   * tensor cores do the dot products: mma.sync m16n8k16 bf16 -> fp32, with the weight tile
//     as A (16 rows x 16 k) and the activation columns as B (16 k x 8 columns). codes become
//     exact bf16 values in registers with one or two integer ops per pair (the "magic number"
//     trick: a 7-bit integer ored into the mantissa of bf16 128.0 is 128 + that integer
//     exactly, and one bf16x2 fma removes the 128 and the sign offset). the conversion costs
//     ~1.5 instructions per weight whatever C is, so 1..8 columns cost the same time.
//   * the quad of threads that shares an mma row covers exactly one quantization group per
//     mma chain (each thread 16 lanes = 8 bytes of q4/q5/q6 codes, 8 lanes of w8), so a
//     group's partial dot comes out of the tensor core unscaled and is scaled once in fp32:
//     acc += fp16_scale * mma(codes, x). the k order inside a group is permuted (pairs of
//     lanes i, i+4 share a register, which is what one shift + mask gives); x is permuted the
//     same way when its fragment is built, so the sum is unchanged.
//   * a block is NW warps on one 16-row tile (RT tiles with RT > 1); the warps split the k
//     groups (warp w takes groups [w*D, w*D+D), then +NW*D, ...) so a 4096-row matrix still
//     fills the machine. partial sums meet in shared memory at the end.
//   * two ways to get the weights in: the register kernel issues all loads of a stage (D
//     groups, ld.global.nc.L1::no_allocate, immediate offsets, no guards on whole stages) and
//     then computes it; the async kernel copies 16-row x 2-group tiles into per-warp shared
//     memory with cp.async, S stages deep, so the next stages are in flight while one is
//     computed without holding registers. x is read when a group is computed (l1 hits).
//   * the offset trick (OFFS): the magic values are code + 136/144/160 (q4/q5/q6); instead of
//     a bf16 subtract per pair, one more mma with A = 1 gives sum(x) per group and the fp32
//     epilogue subtracts offset * sum(x) (w8: lo + 128 and hi + 136 in two accumulators).
//   * where the time goes (ncu, bench-notes): ~0.2 instructions per weight byte; the register
//     kernel waits on memory latency (long scoreboard), the async one is issue-bound. the
//     next step is fewer instructions per byte (two row tiles per warp in the async kernel).
// numerics: products exact (bf16 x small integer), sums fp32 (tensor-core accumulation within
// a group, fp32 fma across groups and warps; the offset trick cancels ~5 bits of a group's
// fp32 sum, still ~1e-6 of sum |w x|: measured rel-l2 ~8e-8 vs float64 on fp32 outputs).
// y is fp32, or bf16 (one rounding); with a
// residual, y = bf16(resid + bf16(Wx)), the two roundings hf makes (model.md 4.3).
// requirements: x 16-byte aligned with ldx % 8 == 0 (activations are allocated that way);
// bf16 weights need cols % 8 == 0. x[c][k] for k >= cols is never read, so a padded tail
// of any content (even nan) is safe; padding groups of the row-split layout have scale 0.

enum { GEMV_MAX_COLS = 8 };  // columns per launch (the mma n); more run in chunks

struct GemvArgs {
    Mat w;                    // device view, any of q4/q5/q6/w8 row-split or bf16 contiguous
    const bf16_t* x; int ldx; // x[c*ldx + k]
    int C;                    // columns, 1..8
    void* y; int ldy;         // y[c*ldy + r], bf16 or fp32
    int y_f32;
    const bf16_t* resid; int ldr;  // optional residual (may alias y)
};

__device__ __forceinline__ uint2 ldg_stream_u2(const void* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ uint4 ldg_stream_u4(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ldg_stream_u32(const void* p) {
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ldg_stream_u16(const void* p) {
    unsigned short v;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

// d = f(a, b, c) bitwise, f given by its truth table on a = 0xF0, b = 0xCC, c = 0xAA
template <uint32_t LUT>
__device__ __forceinline__ uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(LUT));
    return d;
}
enum : uint32_t { LOP_AND_OR = 0xEA,   // (a & b) | c
                  LOP_AND_XOR = 0x6A,  // (a & b) ^ c
                  LOP_SELECT = 0xE4 }; // c ? a : b, per bit

// d = a * b + c on bf16x2 words (exact for the small integers used here)
__device__ __forceinline__ uint32_t bf2_fma(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// bf16x2 constants (low and high half equal)
#define BF2(h) (((uint32_t)(h) << 16) | (uint32_t)(h))
enum : uint32_t {
    BF_ONE = 0x3F80, BF_16 = 0x4180,
    BF_M128 = 0xC300, BF_M136 = 0xC308, BF_M144 = 0xC310, BF_M160 = 0xC320, BF_M2176 = 0xC508,
};

// per-format constants. G: lanes per group; LPT: lanes one thread holds per group (a quad
// covers a group); STEPS: mma k16 steps per group; RAW: 32-bit words of raw data per row per
// group; units per row = groups (bf16: 64-lane pseudo-groups, no scale).
template <int F> struct GemvFmt {
    static constexpr int G = F == FMT_W8 ? 32 : 64;
    static constexpr int LPT = G / 4;
    static constexpr int STEPS = LPT / 4;
    static constexpr int RAW = F == FMT_BF16 ? 8 : 4;  // base words (2 or 8), high word, scale word
    static constexpr bool SCALED = F != FMT_BF16;
};

// the A operand: the bf16x2 pair p of one row's raw group data (codes, exact).
// q4/q5/q6: pair p = lanes (i, i+4) of base word p/4 (lanes 0..7 or 8..15 of the thread's 16),
// i = p%4: the shift by 4i brings nibble i to bits 0..3 and nibble i+4 to bits 16..19.
// hs: the high bits pre-spread for the word (see gemv_spread_high), so the same kind of
// shift places them at bit 4 (and 5) of each half.
// OFFS: return code + offset (gemv_offset: 136, 144, 160), the bare magic value; the kernel
// then subtracts offset * sum(x) per group in fp32, which saves the bf16 fma per pair.
template <int F> struct GemvOffset { static constexpr float v = F == FMT_Q4 ? 136.f : F == FMT_Q5 ? 144.f : F == FMT_Q6 ? 160.f : 0.f; };
template <int F, bool OFFS>
__device__ __forceinline__ uint32_t gemv_pair(const uint32_t (&r)[GemvFmt<F>::RAW], uint32_t hs0, uint32_t hs1, int p) {
    if constexpr (F == FMT_BF16) {
        return r[p];
    } else {
        uint32_t w = p < 4 ? r[0] : r[1];
        int i = p & 3;
        uint32_t v, off;
        if constexpr (F == FMT_Q4) {
            v = lop3<LOP_AND_XOR>(w >> (4 * i), 0x000F000Fu, 0x43084308u);  // 128 + (u ^ 8) = code + 136
            off = BF2(BF_M136);
        } else if constexpr (F == FMT_Q5) {
            // two lop3: the high bits (sign already flipped) with the magic exponent, then the
            // nibbles selected in by mask: 128 + (u ^ 16) = code + 144
            uint32_t hs = p < 4 ? hs0 : hs1;
            uint32_t hm = lop3<LOP_AND_OR>(hs >> i, 0x00100010u, 0x43004300u);
            v = lop3<LOP_SELECT>(w >> (4 * i), hm, 0x000F000Fu);
            off = BF2(BF_M144);
        } else {  // q6: 128 + (u ^ 32) = code + 160
            uint32_t hs = p < 4 ? hs0 : hs1;
            uint32_t hm = lop3<LOP_AND_OR>(hs >> (2 * i), 0x00300030u, 0x43004300u);
            v = lop3<LOP_SELECT>(w >> (4 * i), hm, 0x000F000Fu);
            off = BF2(BF_M160);
        }
        return OFFS ? v : bf2_fma(v, BF2(BF_ONE), off);
    }
}

// q5: high bits of lanes 0..7 of the thread's 16 (hw bits 0..7), copied to bits 4..11 and
// 16..23 so that (hs >> i) has lane i at bit 4 and lane i+4 at bit 20; inverted, which is the
// u ^ 16 of the offset-binary code (bit 4 is the sign bit of a 5-bit code).
// q6: 2-bit fields of lanes 0..3 to bits 4..11 and of lanes 4..7 to bits 20..27, so that
// (hs >> 2i) has lane i's field at bits 4..5 and lane i+4's at 20..21; the upper bit of each
// field (the sign bit, bit 5 of the code) flipped: u ^ 32.
template <int F>
__device__ __forceinline__ void gemv_spread_high(uint32_t hw, uint32_t& hs0, uint32_t& hs1) {
    if constexpr (F == FMT_Q5) {
        hs0 = ~((hw & 0xFFu) * 0x00010010u);
        hs1 = ~(((hw >> 8) & 0xFFu) * 0x00010010u);
    } else if constexpr (F == FMT_Q6) {
        hs0 = (__byte_perm(hw, 0, 0x4140) << 4) ^ 0x0AA00AA0u;
        hs1 = (__byte_perm(hw, 0, 0x4342) << 4) ^ 0x0AA00AA0u;
    } else {
        hs0 = hs1 = 0;
    }
}

// w8: one byte per lane; code = 16*hi + lo with hi = byte >> 4 (signed), lo = byte & 15.
// pair j of a word = its bytes (j, j+2): lanes (0,2), (1,3) of word 0, (4,6), (5,7) of word 1.
// lo and 16*hi are each exact in bf16. OFFS: lo + 128 and hi + 136 (not times 16).
template <bool OFFS>
__device__ __forceinline__ void gemv_pair_w8(uint32_t w, int j, uint32_t& lo, uint32_t& hi) {
    uint32_t l = lop3<LOP_AND_OR>(w >> (8 * j), 0x000F000Fu, 0x43004300u);       // 128 + lo
    uint32_t h = lop3<LOP_AND_XOR>(w >> (8 * j + 4), 0x000F000Fu, 0x43084308u);  // 128 + (hi ^ 8) = hi + 136
    if (OFFS) { lo = l; hi = h; return; }
    lo = bf2_fma(l, BF2(BF_ONE), BF2(BF_M128));
    hi = bf2_fma(h, BF2(BF_16), BF2(BF_M2176));                        // 16 * (hi + 136) - 2176
}

// the B operand for step s from the thread's x values (its LPT lanes of the group, as uint4s
// of 8 bf16): q/bf16 need pairs matching gemv_pair's lane order.
template <int F>
__device__ __forceinline__ void gemv_xfrag(const uint4 (&x)[2], int s, uint32_t& b0, uint32_t& b1) {
    if constexpr (F == FMT_BF16) {
        const uint4& v = x[s >> 1];
        b0 = (s & 1) ? v.z : v.x;
        b1 = (s & 1) ? v.w : v.y;
    } else if constexpr (F == FMT_W8) {
        // step s: lanes (4s, 4s+2) and (4s+1, 4s+3)
        const uint4& v = x[0];
        uint32_t w0 = s ? v.z : v.x, w1 = s ? v.w : v.y;
        b0 = __byte_perm(w0, w1, 0x5410);
        b1 = __byte_perm(w0, w1, 0x7632);
    } else {
        // step s: pair 2s = lanes (a, a+4), pair 2s+1 = (a+1, a+5), a = 2s (s<2) or 8+2(s-2)
        const uint4& v = x[s >> 1];
        uint32_t w0 = (s & 1) ? v.y : v.x, w1 = (s & 1) ? v.w : v.z;
        b0 = __byte_perm(w0, w1, 0x5410);
        b1 = __byte_perm(w0, w1, 0x7632);
    }
}

// a warp's plane pointers: rows g and g+8 of RT tiles, already advanced to the thread's
// share of a group (base + 8t; bf16 + 32t; high + 2t or 4t); rows past the end are clamped
// (read twice, never stored). per stage they move by whole groups, and the D groups of a
// stage are immediate offsets from there.
template <int RT>
struct GemvPtrs { const uint8_t* b[RT][2]; const uint8_t* h[RT][2]; const uint8_t* s[RT][2]; };

template <int F> struct GemvStride {  // bytes per group in each plane
    static constexpr int B = F == FMT_BF16 ? 128 : 32;
    static constexpr int H = F == FMT_Q5 ? 8 : F == FMT_Q6 ? 16 : 0;
};

// the raw words of groups [ub, ub+D) for the warp's rows. FAST: all D groups lie inside k
// (no guards); else groups past `units` are skipped and bf16's partial last group is
// zero-filled past k.
template <int F, int D, int RT, bool FAST>
__device__ __forceinline__ void gemv_load(uint32_t (&raw)[D][RT][2][GemvFmt<F>::RAW], const GemvPtrs<RT>& P, int ub, int units,
                                          int t, int64_t K) {
    using Sd = GemvStride<F>;
#pragma unroll
    for (int i = 0; i < RT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint8_t* b = P.b[i][h] + (size_t)ub * Sd::B;
            if constexpr (F == FMT_BF16) {
#pragma unroll
                for (int d = 0; d < D; d++) {
                    uint4 x0 = make_uint4(0, 0, 0, 0), x1 = make_uint4(0, 0, 0, 0);
                    int64_t k0 = (int64_t)(ub + d) * 64 + t * 16;
                    if (FAST || k0 + 16 <= K) { x0 = ldg_stream_u4(b + d * Sd::B); x1 = ldg_stream_u4(b + d * Sd::B + 16); }
                    else if (k0 + 8 <= K) x0 = ldg_stream_u4(b + d * Sd::B);  // cols % 8 == 0
                    uint32_t* r = raw[d][i][h];
                    r[0] = x0.x; r[1] = x0.y; r[2] = x0.z; r[3] = x0.w; r[4] = x1.x; r[5] = x1.y; r[6] = x1.z; r[7] = x1.w;
                }
            } else {
                const uint8_t* hp = Sd::H ? P.h[i][h] + (size_t)ub * Sd::H : nullptr;
                const uint8_t* sp = P.s[i][h] + (size_t)ub * 2;
#pragma unroll
                for (int d = 0; d < D; d++) {
                    if (!FAST && ub + d >= units) continue;
                    uint2 v = ldg_stream_u2(b + d * Sd::B);
                    raw[d][i][h][0] = v.x; raw[d][i][h][1] = v.y;
                    if constexpr (F == FMT_Q5) raw[d][i][h][2] = ldg_stream_u16(hp + d * Sd::H);
                    else if constexpr (F == FMT_Q6) raw[d][i][h][2] = ldg_stream_u32(hp + d * Sd::H);
                    else raw[d][i][h][2] = 0;
                    // scales: two groups per 32-bit load (ub is even when D is, and the scale
                    // rows are 4-byte aligned: groups per row are even)
                    if (FAST && D % 2 == 0) {
                        if (d % 2 == 0) {
                            uint32_t s2 = ldg_stream_u32(sp + d * 2);
                            raw[d][i][h][3] = s2 & 0xFFFFu;
                            raw[d + (d + 1 < D ? 1 : 0)][i][h][3] = s2 >> 16;
                        }
                    } else {
                        raw[d][i][h][3] = ldg_stream_u16(sp + d * 2);
                    }
                }
            }
        }
}

// x for group u: the thread's LPT lanes of its column (zeros for lanes past k or columns >= C)
template <int F, bool FAST>
__device__ __forceinline__ void gemv_load_x(uint4 (&xr)[2], const bf16_t* xq, bool xcol, int u, int t, int64_t K) {
    using Fm = GemvFmt<F>;
    constexpr int NX = Fm::LPT / 8;
    xr[0] = xr[1] = make_uint4(0, 0, 0, 0);
    if (!xcol) return;
#pragma unroll
    for (int q = 0; q < NX; q++) {
        if (FAST) { xr[q] = __ldg((const uint4*)(xq + (size_t)u * Fm::G + 8 * q)); continue; }
        int64_t k = (int64_t)u * Fm::G + t * Fm::LPT + 8 * q;
        if (k + 8 <= K) xr[q] = __ldg((const uint4*)(xq + (size_t)u * Fm::G + 8 * q));
        else if (k < K) {  // the partial chunk at the end of k (odd sizes only)
            const unsigned short* xs = (const unsigned short*)(xq + (size_t)u * Fm::G + 8 * q);
            uint32_t e[8];
            for (int j = 0; j < 8; j++) e[j] = k + j < K ? xs[j] : 0;
            xr[q] = make_uint4(e[0] | e[1] << 16, e[2] | e[3] << 16, e[4] | e[5] << 16, e[6] | e[7] << 16);
        }
    }
}

template <int F, int D, int RT, bool OFFS, bool FAST>
__device__ __forceinline__ void gemv_compute(const uint32_t (&raw)[D][RT][2][GemvFmt<F>::RAW], float (&acc)[RT][4], const bf16_t* xq,
                                             bool xcol, int ub, int units, int t, int64_t K) {
    using Fm = GemvFmt<F>;
#pragma unroll
    for (int d = 0; d < D; d++) {
        if (!FAST && ub + d >= units) continue;
        uint4 xr[2];
        gemv_load_x<F, FAST>(xr, xq, xcol, ub + d, t, K);
        uint32_t b[Fm::STEPS][2];
#pragma unroll
        for (int s = 0; s < Fm::STEPS; s++) gemv_xfrag<F>(xr, s, b[s][0], b[s][1]);
        // sum of x over the group per column (the offsets' correction): one mma with A = 1
        float sx[4] = {0.f, 0.f, 0.f, 0.f};
        if constexpr (OFFS && Fm::SCALED) {
            const uint32_t one = BF2(BF_ONE);
#pragma unroll
            for (int s = 0; s < Fm::STEPS; s++) mma_bf16_16816(sx, one, one, one, one, b[s][0], b[s][1]);
        }
#pragma unroll
        for (int i = 0; i < RT; i++) {
            const uint32_t (&r0)[Fm::RAW] = raw[d][i][0];
            const uint32_t (&r1)[Fm::RAW] = raw[d][i][1];
            if constexpr (F == FMT_BF16) {
#pragma unroll
                for (int s = 0; s < Fm::STEPS; s++) mma_bf16_16816(acc[i], r0[2 * s], r1[2 * s], r0[2 * s + 1], r1[2 * s + 1], b[s][0], b[s][1]);
            } else {
                float dd[4] = {0.f, 0.f, 0.f, 0.f};
                float s0 = f16bits2f(r0[3]), s1 = f16bits2f(r1[3]);
                if constexpr (F == FMT_W8) {
                    float dh[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                    for (int s = 0; s < Fm::STEPS; s++) {
                        uint32_t lo[4], hi[4];  // pairs 2s, 2s+1 of rows g, g+8, in a-register order
                        gemv_pair_w8<OFFS>(r0[s], 0, lo[0], hi[0]);
                        gemv_pair_w8<OFFS>(r1[s], 0, lo[1], hi[1]);
                        gemv_pair_w8<OFFS>(r0[s], 1, lo[2], hi[2]);
                        gemv_pair_w8<OFFS>(r1[s], 1, lo[3], hi[3]);
                        mma_bf16_16816(dd, lo[0], lo[1], lo[2], lo[3], b[s][0], b[s][1]);
                        mma_bf16_16816(OFFS ? dh : dd, hi[0], hi[1], hi[2], hi[3], b[s][0], b[s][1]);
                    }
                    if constexpr (OFFS) {  // lo + 16 hi - (128 + 16*136) sum(x)
#pragma unroll
                        for (int j = 0; j < 4; j++) dd[j] = fmaf(16.f, dh[j], fmaf(-2304.f, sx[j & 1], dd[j]));
                    }
                } else {
                    uint32_t hs[2][2];
#pragma unroll
                    for (int h = 0; h < 2; h++) gemv_spread_high<F>((h ? r1 : r0)[2], hs[h][0], hs[h][1]);
#pragma unroll
                    for (int s = 0; s < Fm::STEPS; s++)
                        mma_bf16_16816(dd, gemv_pair<F, OFFS>(r0, hs[0][0], hs[0][1], 2 * s), gemv_pair<F, OFFS>(r1, hs[1][0], hs[1][1], 2 * s),
                                       gemv_pair<F, OFFS>(r0, hs[0][0], hs[0][1], 2 * s + 1),
                                       gemv_pair<F, OFFS>(r1, hs[1][0], hs[1][1], 2 * s + 1), b[s][0], b[s][1]);
                    if constexpr (OFFS) {
#pragma unroll
                        for (int j = 0; j < 4; j++) dd[j] = fmaf(-GemvOffset<F>::v, sx[j & 1], dd[j]);
                    }
                }
                acc[i][0] = fmaf(s0, dd[0], acc[i][0]);
                acc[i][1] = fmaf(s0, dd[1], acc[i][1]);
                acc[i][2] = fmaf(s1, dd[2], acc[i][2]);
                acc[i][3] = fmaf(s1, dd[3], acc[i][3]);
            }
        }
    }
}

// the warps' partial sums meet in shared memory; thread (g,t) holds rows g, g+8 and columns
// 2t, 2t+1 of each tile (the mma accumulator layout). then one thread per output element adds
// the residual, rounds and stores.
template <int NW, int RT>
__device__ __forceinline__ void gemv_epilogue(const GemvArgs& a, const float (&acc)[RT][4], int64_t row0, int warp, int lane) {
    const int64_t rows = a.w.rows;
    __shared__ float4 red[NW][RT * 32];
#pragma unroll
    for (int i = 0; i < RT; i++) red[warp][i * 32 + lane] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    __syncthreads();
    for (int idx = threadIdx.x; idx < RT * 128; idx += NW * 32) {
        int i = idx >> 7, ln = (idx >> 2) & 31, j = idx & 3;
        float s = 0.f;
#pragma unroll
        for (int v = 0; v < NW; v++) s += ((const float*)&red[v][i * 32 + ln])[j];
        int64_t row = row0 + 16 * i + (ln >> 2) + (j >= 2 ? 8 : 0);
        int col = 2 * (ln & 3) + (j & 1);
        if (row < rows && col < a.C) {
            if (a.y_f32) {
                if (a.resid) s += bf2f(a.resid[(int64_t)col * a.ldr + row]);
                ((float*)a.y)[(int64_t)col * a.ldy + row] = s;
            } else {
                float v = a.resid ? bf2f(a.resid[(int64_t)col * a.ldr + row]) + bfround(s) : s;
                ((bf16_t*)a.y)[(int64_t)col * a.ldy + row] = f2bf(v);
            }
        }
    }
}

// NW warps share a tile of 16*RT rows and split its groups: warp w takes groups
// [(it*NW + w)*D, +D) for it = 0, 1, ...: the loads of a stage are all issued, then the stage
// is computed (the other warps of the sm keep the memory busy meanwhile). x is loaded when a
// group is computed (an l1 hit once one warp of the sm has touched it).
template <int F, int NW, int D, int RT, bool OFFS, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) gemv_kernel(GemvArgs a) {
    using Fm = GemvFmt<F>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const Mat& w = a.w;
    const int64_t rows = w.rows, K = w.cols;
    const int units = F == FMT_BF16 ? (int)CEIL_DIV(K, (int64_t)64) : (int)w.gpr;
    const int full_units = (int)(K / Fm::G);  // groups with every lane inside k
    const int64_t row0 = (int64_t)blockIdx.x * 16 * RT;

    GemvPtrs<RT> P;
#pragma unroll
    for (int i = 0; i < RT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int64_t r = row0 + 16 * i + g + 8 * h;
            r = r < rows ? r : rows - 1;
            P.b[i][h] = w.base + r * w.base_row + t * (F == FMT_BF16 ? 32 : 8);
            P.h[i][h] = Fm::SCALED && GemvStride<F>::H ? w.high + r * w.high_row + t * (GemvStride<F>::H / 4) : nullptr;
            P.s[i][h] = Fm::SCALED ? w.scale + r * w.scale_row : nullptr;
        }
    const bool xcol = g < a.C;  // this lane's B column
    const bf16_t* xq = a.x + (int64_t)(xcol ? g : 0) * a.ldx + t * Fm::LPT;

    float acc[RT][4];
#pragma unroll
    for (int i = 0; i < RT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    uint32_t raw[D][RT][2][Fm::RAW];
    for (int ub = warp * D; ub < units; ub += NW * D) {
        if (ub + D <= full_units) {
            gemv_load<F, D, RT, true>(raw, P, ub, units, t, K);
            gemv_compute<F, D, RT, OFFS, true>(raw, acc, xq, xcol, ub, units, t, K);
        } else {
            gemv_load<F, D, RT, false>(raw, P, ub, units, t, K);
            gemv_compute<F, D, RT, OFFS, false>(raw, acc, xq, xcol, ub, units, t, K);
        }
    }

    gemv_epilogue<NW, RT>(a, acc, row0, warp, lane);
}

// the same computation with the weights streamed through shared memory by cp.async, S stages
// deep per warp: the copies of the next S-1 stages are in flight while a stage is computed, and
// they hold no registers, so a few warps per sm keep enough bytes in flight (the register
// kernel above stalls on memory latency: ncu, bench-notes). each warp runs its own pipeline
// over its own slots (no block barrier until the epilogue). 16-row tiles only (RT = 1), D = 2
// groups per stage, and only shapes whose groups are all full (k a multiple of the group;
// the launcher falls back otherwise). grouped formats only.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

template <int F> struct GemvAsyncLayout {  // one stage of one warp: 16 rows x 2 groups
    static constexpr int HB = F == FMT_Q5 ? 8 : F == FMT_Q6 ? 16 : 0;  // high bytes per group
    static constexpr int RS_B = 2 * 32 + 16;     // base bytes per row, padded (bank spread), 16-aligned
    static constexpr int RS_H = 2 * HB;          // 0, 16 or 32
    static constexpr int RS_S = 4;               // two fp16 scales
    static constexpr int OFF_H = 16 * RS_B, OFF_S = OFF_H + 16 * RS_H;
    static constexpr int BYTES = (OFF_S + 16 * RS_S + 15) / 16 * 16;
};

template <int F, int NW, int S, bool OFFS, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) gemv_async_kernel(GemvArgs a) {
    using Fm = GemvFmt<F>;
    using Ly = GemvAsyncLayout<F>;
    constexpr int D = 2;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const Mat& w = a.w;
    const int64_t rows = w.rows, K = w.cols;
    const int units = (int)w.gpr;
    const int64_t row0 = (int64_t)blockIdx.x * 16;
    __shared__ __align__(16) uint8_t sm[NW][S][Ly::BYTES];
    auto rowc = [&](int r) { int64_t x = row0 + r; return x < rows ? x : rows - 1; };
    // copy duties of this lane for one stage: base chunks (rows g, g+8; 16-byte column t of
    // the 64 bytes of two groups), high bytes (q5: row `lane` < 16, 16 bytes; q6: row lane/2,
    // half lane&1), scales (row lane-16 for lanes 16..31, 4 bytes)
    const uint8_t* src_b0 = w.base + rowc(g) * w.base_row + t * 16;
    const uint8_t* src_b1 = w.base + rowc(g + 8) * w.base_row + t * 16;
    const uint8_t* src_h = nullptr;
    if (Ly::HB == 8 && lane < 16) src_h = w.high + rowc(lane) * w.high_row;
    if (Ly::HB == 16) src_h = w.high + rowc(lane >> 1) * w.high_row + (lane & 1) * 16;
    const uint8_t* src_s = lane >= 16 ? w.scale + rowc(lane - 16) * w.scale_row : nullptr;
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(&sm[warp][0][0]);
    const uint32_t dst_b0 = g * Ly::RS_B + t * 16, dst_b1 = (g + 8) * Ly::RS_B + t * 16;
    const uint32_t dst_h = Ly::HB == 8 ? Ly::OFF_H + lane * 16 : Ly::OFF_H + (lane >> 1) * 32 + (lane & 1) * 16;
    const uint32_t dst_s = Ly::OFF_S + (lane - 16) * 4;

    const int n_it = warp * D < units ? (units - warp * D + NW * D - 1) / (NW * D) : 0;
    auto issue = [&](int it) {
        const int ub = (it * NW + warp) * D;
        const uint32_t slot = sbase + (it % S) * Ly::BYTES;
        cp_async16(slot + dst_b0, src_b0 + (size_t)ub * 32);
        cp_async16(slot + dst_b1, src_b1 + (size_t)ub * 32);
        if (Ly::HB == 16 || (Ly::HB == 8 && lane < 16)) cp_async16(slot + dst_h, src_h + (size_t)ub * Ly::HB);
        if (lane >= 16) cp_async4(slot + dst_s, src_s + (size_t)ub * 2);
    };
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < n_it) issue(s);
        cp_async_commit();
    }
    const bool xcol = g < a.C;
    const bf16_t* xq = a.x + (int64_t)(xcol ? g : 0) * a.ldx + t * Fm::LPT;
    float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
    for (int it = 0; it < n_it; it++) {
        cp_async_wait<S - 2>();
        __syncwarp();
        const uint8_t* st = &sm[warp][it % S][0];
        uint32_t raw[D][1][2][Fm::RAW];
#pragma unroll
        for (int d = 0; d < D; d++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = g + 8 * h;
                uint2 v = *(const uint2*)(st + r * Ly::RS_B + d * 32 + t * 8);
                raw[d][0][h][0] = v.x; raw[d][0][h][1] = v.y;
                if constexpr (F == FMT_Q5) raw[d][0][h][2] = *(const unsigned short*)(st + Ly::OFF_H + r * Ly::RS_H + d * 8 + t * 2);
                else if constexpr (F == FMT_Q6) raw[d][0][h][2] = *(const uint32_t*)(st + Ly::OFF_H + r * Ly::RS_H + d * 16 + t * 4);
                else raw[d][0][h][2] = 0;
                raw[d][0][h][3] = *(const unsigned short*)(st + Ly::OFF_S + r * Ly::RS_S + d * 2);
            }
        const int ub = (it * NW + warp) * D;
        gemv_compute<F, D, 1, OFFS, true>(raw, acc, xq, xcol, ub, units, t, K);
        if (it + S - 1 < n_it) issue(it + S - 1);
        cp_async_commit();
    }
    cp_async_wait<0>();
    gemv_epilogue<NW, 1>(a, acc, row0, warp, lane);
}
// k a multiple of 128: no padding groups (whose x would be read unguarded) and an even group
// count (two groups per stage; 4-byte aligned scale pairs)
template <int F>
static bool gemv_async_ok(const Mat& w) {
    return format_grouped(w.format) && w.cols % 128 == 0;
}

// kernel variants for tests and benches; gemv() picks one by shape (gemv_auto_variant).
//   register kernel <warps per tile NW, groups per stage D, row tiles RT, offset trick, min blocks/sm>
//   async kernel <NW, stages S, offset trick, min blocks/sm>; shapes it cannot take run variant 2
static const int GEMV_VARIANTS = 8;
template <int F>
static void gemv_launch_variant(int variant, const GemvArgs& a, cudaStream_t stream) {
    int64_t rows = a.w.rows;
    unsigned t1 = (unsigned)CEIL_DIV(rows, (int64_t)16), t2 = (unsigned)CEIL_DIV(rows, (int64_t)32);
    if (variant >= 6 && !(F != FMT_BF16 && gemv_async_ok<F>(a.w))) variant = 2;
    switch (variant) {
        case 0: gemv_kernel<F, 8, 2, 1, true, 3><<<t1, 8 * 32, 0, stream>>>(a); break;
        case 1: gemv_kernel<F, 8, 4, 1, true, 2><<<t1, 8 * 32, 0, stream>>>(a); break;
        case 2: gemv_kernel<F, 16, 2, 1, true, 2><<<t1, 16 * 32, 0, stream>>>(a); break;
        case 3: gemv_kernel<F, 8, 2, 2, true, 2><<<t2, 8 * 32, 0, stream>>>(a); break;
        case 4: gemv_kernel<F, 8, 2, 1, false, 3><<<t1, 8 * 32, 0, stream>>>(a); break;
        case 5: gemv_kernel<F, 32, 2, 1, true, 1><<<t1, 32 * 32, 0, stream>>>(a); break;
        case 6: if constexpr (F != FMT_BF16) gemv_async_kernel<F, 4, 4, true, 8><<<t1, 4 * 32, 0, stream>>>(a); break;
        case 7: if constexpr (F != FMT_BF16) gemv_async_kernel<F, 8, 3, true, 4><<<t1, 8 * 32, 0, stream>>>(a); break;
        default: CHECK(false, "gemv variant %d", variant);
    }
    cudaCheck(cudaGetLastError());
}
// picked from the h200 measurements (test/bench-notes.md, run 5): q4 has the cheapest code
// conversion and does best in the register kernel; q5/q6/w8 and the big head stream best
// through the cp.async pipeline. every variant this can return passes the same tests.
static int gemv_auto_variant(const Mat& w) {
    if (w.rows >= 65536 || w.format == FMT_W8) return 6;  // output head, mtp: async, 4 warps x 4 stages
    if (w.format == FMT_Q4) return w.rows > 4096 ? 4 : 1;  // register kernel (no offset trick / 4 groups per stage)
    return 7;                                              // async, 8 warps x 3 stages (bf16 and odd k: variant 2)
}

// y[c][r] (+)= W x[c] for c < C; C > 8 runs in chunks of 8 columns. y_f32 picks fp32 output;
// resid (nullable, may equal y) adds a bf16 residual. all pointers are device pointers.
static void gemv_variant(int variant, const Mat& w, const bf16_t* x, int ldx, int C, void* y, int ldy, bool y_f32,
                         const bf16_t* resid, int ldr, cudaStream_t stream) {
    CHECK(w.rows > 0 && w.cols > 0 && C >= 1, "gemv: empty shape");
    if (variant < 0) variant = gemv_auto_variant(w);
    CHECK(ldx % 8 == 0 && ((uintptr_t)x & 15) == 0, "gemv: x must be 16-byte aligned with ldx %% 8 == 0 (ldx %d)", ldx);
    CHECK(w.format != FMT_BF16 || w.cols % 8 == 0, "gemv: bf16 weights need cols %% 8 == 0 (cols %lld)", (long long)w.cols);
    for (int c0 = 0; c0 < C; c0 += GEMV_MAX_COLS) {
        GemvArgs a;
        a.w = w;
        a.x = x + (int64_t)c0 * ldx; a.ldx = ldx;
        a.C = C - c0 < GEMV_MAX_COLS ? C - c0 : GEMV_MAX_COLS;
        a.y = y_f32 ? (void*)((float*)y + (int64_t)c0 * ldy) : (void*)((bf16_t*)y + (int64_t)c0 * ldy);
        a.ldy = ldy; a.y_f32 = y_f32;
        a.resid = resid ? resid + (int64_t)c0 * ldr : nullptr; a.ldr = ldr;
        switch (w.format) {
            case FMT_Q4: gemv_launch_variant<FMT_Q4>(variant, a, stream); break;
            case FMT_Q5: gemv_launch_variant<FMT_Q5>(variant, a, stream); break;
            case FMT_Q6: gemv_launch_variant<FMT_Q6>(variant, a, stream); break;
            case FMT_W8: gemv_launch_variant<FMT_W8>(variant, a, stream); break;
            case FMT_BF16: gemv_launch_variant<FMT_BF16>(variant, a, stream); break;
            default: CHECK(false, "gemv: unsupported weight format %s", format_name(w.format));
        }
    }
}
static void gemv(const Mat& w, const bf16_t* x, int ldx, int C, void* y, int ldy, bool y_f32, const bf16_t* resid,
                 int ldr, cudaStream_t stream) {
    gemv_variant(gemv_auto_variant(w), w, x, ldx, C, y, ldy, y_f32, resid, ldr, stream);
}

// ----------------------------------------------------------------------------
// norms
//
// one block of NORM_THREADS per row; a row is one token's vector (heads == 1) or one head of it
// (q/k norm over 256, the gdn gated norm over 128): row r is token r / heads, head r % heads,
// at x + token*ldx + head*n. two passes over the row (the second hits l1), so y may alias x.

enum { NORM_THREADS = 128 };

// y = bf16( x * rsqrt(mean(x^2) + eps) * (1 + w) ), all fp32 (model.md 4.1); plain_w: * w
// (used by no text norm of qwen3.5, kept for the vision tower and tests)
__global__ void __launch_bounds__(NORM_THREADS) rmsnorm_kernel(const bf16_t* x, int ldx, bf16_t* y, int ldy,
                                                               const bf16_t* __restrict__ w, int n, int heads, float eps, int plain_w) {
    int r = blockIdx.x, tok = r / heads, hd = r % heads;
    const bf16_t* xr = x + (int64_t)tok * ldx + (int64_t)hd * n;
    bf16_t* yr = y + (int64_t)tok * ldy + (int64_t)hd * n;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) { float v = bf2f(xr[i]); ss += v * v; }
    ss = block_sum(ss);
    float inv = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        float wv = bf2f(w[i]);
        yr[i] = f2bf(bf2f(xr[i]) * inv * (plain_w ? wv : 1.f + wv));
    }
}
static void rmsnorm(const bf16_t* x, int ldx, bf16_t* y, int ldy, const bf16_t* w, int n, int rows, int heads, float eps,
                    bool plain_w, cudaStream_t stream) {
    CHECK(rows % heads == 0, "rmsnorm: rows %d not a multiple of heads %d", rows, heads);
    rmsnorm_kernel<<<rows, NORM_THREADS, 0, stream>>>(x, ldx, y, ldy, w, n, heads, eps, plain_w ? 1 : 0);
    cudaCheck(cudaGetLastError());
}

// gdn output norm per value head (model.md 3.8), with hf's roundings:
//   nrm = bf16(o * rsqrt(mean(o^2) + eps)); p = bf16(w * nrm); y = bf16(p * silu(z))  (silu in fp32)
// o: [T][heads*n] (ldo), z: [T][heads*n] (ldz), w plain (no 1+w)
__global__ void __launch_bounds__(NORM_THREADS) gated_rmsnorm_kernel(const bf16_t* __restrict__ o, int ldo, const bf16_t* __restrict__ z,
                                                                     int ldz, bf16_t* y, int ldy, const bf16_t* __restrict__ w, int n,
                                                                     int heads, float eps) {
    int r = blockIdx.x, tok = r / heads, hd = r % heads;
    const bf16_t* orow = o + (int64_t)tok * ldo + (int64_t)hd * n;
    const bf16_t* zrow = z + (int64_t)tok * ldz + (int64_t)hd * n;
    bf16_t* yrow = y + (int64_t)tok * ldy + (int64_t)hd * n;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) { float v = bf2f(orow[i]); ss += v * v; }
    ss = block_sum(ss);
    float inv = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        float nrm = bfround(bf2f(orow[i]) * inv);
        float p = bfround(bf2f(w[i]) * nrm);
        yrow[i] = f2bf(p * silu_f(bf2f(zrow[i])));
    }
}
static void gated_rmsnorm(const bf16_t* o, int ldo, const bf16_t* z, int ldz, bf16_t* y, int ldy, const bf16_t* w, int n,
                          int T, int heads, float eps, cudaStream_t stream) {
    gated_rmsnorm_kernel<<<T * heads, NORM_THREADS, 0, stream>>>(o, ldo, z, ldz, y, ldy, w, n, heads, eps);
    cudaCheck(cudaGetLastError());
}

// l2 norm per head (model.md 3.4): y = x * rsqrt(sum(x^2) + eps) * scale, fp32 in and out of
// the math, fp32 out (what the chunked gdn consumes). one warp per row of n (<= 1024).
enum { L2_THREADS = 128 };
__global__ void __launch_bounds__(L2_THREADS) l2norm_kernel(const bf16_t* __restrict__ x, int ldx, float* y, int ldy, int n, int rows,
                                                            int heads, float eps, float scale) {
    int r = blockIdx.x * (L2_THREADS / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return;
    int tok = r / heads, hd = r % heads;
    const bf16_t* xr = x + (int64_t)tok * ldx + (int64_t)hd * n;
    float* yr = y + (int64_t)tok * ldy + (int64_t)hd * n;
    float ss = 0.f;
    for (int i = lane; i < n; i += 32) { float v = bf2f(xr[i]); ss += v * v; }
    ss = warp_sum(ss);
    float inv = rsqrtf(ss + eps) * scale;
    for (int i = lane; i < n; i += 32) yr[i] = bf2f(xr[i]) * inv;
}
static void l2norm(const bf16_t* x, int ldx, float* y, int ldy, int n, int T, int heads, float eps, float scale,
                   cudaStream_t stream) {
    int rows = T * heads;
    l2norm_kernel<<<CEIL_DIV(rows, L2_THREADS / 32), L2_THREADS, 0, stream>>>(x, ldx, y, ldy, n, rows, heads, eps, scale);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// elementwise

enum { EW_THREADS = 256 };

// mlp activation (model.md 4.2) with hf's bf16 roundings: y = bf16( bf16(silu(gate)) * up ).
// gu: [T][2I] = [gate | up] (the fused gate_up gemv output), y: [T][I]
__global__ void swiglu_kernel(const bf16_t* __restrict__ gu, int ldgu, bf16_t* y, int ldy, int I, int T) {
    int64_t idx = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x;
    if (idx >= (int64_t)I * T) return;
    int t = (int)(idx / I), i = (int)(idx % I);
    const bf16_t* row = gu + (int64_t)t * ldgu;
    y[(int64_t)t * ldy + i] = f2bf(bfround(silu_f(bf2f(row[i]))) * bf2f(row[I + i]));
}
static void swiglu(const bf16_t* gu, int ldgu, bf16_t* y, int ldy, int I, int T, cudaStream_t stream) {
    swiglu_kernel<<<(unsigned)CEIL_DIV((int64_t)I * T, (int64_t)EW_THREADS), EW_THREADS, 0, stream>>>(gu, ldgu, y, ldy, I, T);
    cudaCheck(cudaGetLastError());
}

// lane j of a group of a grouped format: the signed code (device twin of format.h group_code)
__device__ __forceinline__ int dev_group_code(int f, const uint8_t* base, const uint8_t* high, int j) {
    if (f == FMT_W8) return (int8_t)base[j];
    int u = (base[j >> 1] >> ((j & 1) * 4)) & 0xF;
    int b = 4;
    if (f == FMT_Q5) { u |= ((high[j >> 3] >> (j & 7)) & 1) << 4; b = 5; }
    else if (f == FMT_Q6) { u |= ((high[j >> 2] >> ((j & 3) * 2)) & 3) << 4; b = 6; }
    return (u ^ (1 << (b - 1))) - (1 << (b - 1));
}

// embedding rows (model.md 4.4), from any stored format: y[t] = bf16(scale * code) (bf16
// weights copy exactly). ids[t] >= 0 gathers that row; ids[t] < 0 copies row (-1 - ids[t])
// of `ovr` instead (per-token embedding overrides: vision features, mtp inputs).
__global__ void embed_gather_kernel(Mat w, const int* __restrict__ ids, const bf16_t* __restrict__ ovr, int ldo, bf16_t* y, int ldy) {
    int t = blockIdx.y;
    int64_t k = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x;
    if (k >= w.cols) return;
    int id = ids[t];
    bf16_t* yr = y + (int64_t)t * ldy;
    if (id < 0) { yr[k] = ovr[(int64_t)(-1 - id) * ldo + k]; return; }
    if (id >= w.rows) id = (int)w.rows - 1;  // out-of-range ids are the caller's bug; never read outside
    if (w.format == FMT_BF16) { yr[k] = ((const bf16_t*)(w.base + (int64_t)id * w.base_row))[k]; return; }
    int G = w.format == FMT_W8 ? 32 : 64, hb = w.format == FMT_Q5 ? 8 : w.format == FMT_Q6 ? 16 : 0;
    int64_t grp = k / G; int j = (int)(k % G);
    const uint8_t* base = w.base + (int64_t)id * w.base_row + grp * 32;
    const uint8_t* high = w.high + (int64_t)id * w.high_row + grp * hb;
    float s = f16bits2f(((const unsigned short*)(w.scale + (int64_t)id * w.scale_row))[grp]);
    yr[k] = f2bf(s * (float)dev_group_code(w.format, base, high, j));
}
static void embed_gather(const Mat& w, const int* ids, int T, const bf16_t* ovr, int ldo, bf16_t* y, int ldy, cudaStream_t stream) {
    CHECK(w.format == FMT_BF16 || format_grouped(w.format), "embed_gather: unsupported format %s", format_name(w.format));
    dim3 grid((unsigned)CEIL_DIV(w.cols, (int64_t)EW_THREADS), T);
    embed_gather_kernel<<<grid, EW_THREADS, 0, stream>>>(w, ids, ovr, ldo, y, ldy);
    cudaCheck(cudaGetLastError());
}

// partial interleaved m-rope (model.md 2.3), in place on nheads heads of head_dim per token:
// dims [0, rot) rotate as rotate_half pairs (i, i+rot/2); the rest pass through. pair i uses
// position axis T/H/W by the interleaved rule of mrope_section; angle = pos[t][axis] *
// inv_freq[i] in fp32; cos/sin rounded to bf16, products and sum rounded to bf16 as hf does:
//   x'_i = bf16( bf16(x_i c) - bf16(x_{i+h} s) ),  x'_{i+h} = bf16( bf16(x_{i+h} c) + bf16(x_i s) )
// pos: device [T][3] int32 (text: all three equal).
struct RopeArgs {
    bf16_t* x; int ldx;
    int T, nheads, head_dim, half;  // half = rot / 2 (32)
    const int* pos;
    int sec_h, sec_w;               // mrope_section[1], [2]
    float inv_freq[64];
};
__global__ void mrope_kernel(RopeArgs a) {
    int64_t idx = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x;
    if (idx >= (int64_t)a.T * a.nheads * a.half) return;
    int i = (int)(idx % a.half);
    int64_t th = idx / a.half;
    int t = (int)(th / a.nheads), hd = (int)(th % a.nheads);
    int axis = (i % 3 == 1 && i < 3 * a.sec_h) ? 1 : (i % 3 == 2 && i < 3 * a.sec_w) ? 2 : 0;
    float ang = (float)a.pos[t * 3 + axis] * a.inv_freq[i];
    float sn, cs;
    sincosf(ang, &sn, &cs);
    float c = bfround(cs), s = bfround(sn);
    bf16_t* p = a.x + (int64_t)t * a.ldx + (int64_t)hd * a.head_dim;
    float x1 = bf2f(p[i]), x2 = bf2f(p[i + a.half]);
    p[i] = f2bf(bfround(x1 * c) - bfround(x2 * s));
    p[i + a.half] = f2bf(bfround(x2 * c) + bfround(x1 * s));
}
// inv_freq_j = 1 / theta^(2j/rot) in fp32, as hf builds it
static void rope_inv_freq(float theta, int rot, float* out) {
    for (int j = 0; j < rot / 2; j++) out[j] = 1.0f / powf(theta, (float)(2 * j) / (float)rot);
}
static void mrope(bf16_t* x, int ldx, int T, int nheads, int head_dim, int rot, const int* pos, float theta,
                  const int sections[3], cudaStream_t stream) {
    CHECK(rot % 2 == 0 && rot <= 128 && rot <= head_dim, "mrope: bad rotary dim %d", rot);
    RopeArgs a;
    a.x = x; a.ldx = ldx; a.T = T; a.nheads = nheads; a.head_dim = head_dim; a.half = rot / 2; a.pos = pos;
    a.sec_h = sections[1]; a.sec_w = sections[2];
    rope_inv_freq(theta, rot, a.inv_freq);
    int64_t n = (int64_t)T * nheads * a.half;
    mrope_kernel<<<(unsigned)CEIL_DIV(n, (int64_t)EW_THREADS), EW_THREADS, 0, stream>>>(a);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// gated deltanet: causal conv, gates, recurrent step
//
// conv state per slot: the last 3 raw in_proj_qkv outputs (model.md 3.7), stored tap-major
// [3][conv_dim] bf16 (oldest first) so that a warp reads 64 consecutive bytes per tap. the
// conv weight is the artifact's [4][conv_dim] (tap 3 multiplies the current token).
// numerics: y = bf16( silu( sum_tau w_tau u_tau ) ) with the sum and silu in fp32 (one
// rounding, as the fused causal_conv1d kernel does; hf's torch fallback rounds the conv
// output to bf16 before the silu as well).

enum { CONV_THREADS = 128, CONV_TOKENS = 16 };

struct ConvStepArgs {
    const bf16_t* u; int ldu;          // [C][conv_dim] raw projections
    const bf16_t* w;                   // [4][conv_dim]
    bf16_t* state; int64_t slot_stride;  // slot s at state + s*slot_stride: [3][conv_dim]
    const int* slots;                  // [2C], see the header
    bf16_t* y; int ldy;                // [C][conv_dim]
    int C, conv_dim;
};
// decode: one thread per channel runs the C columns in order
__global__ void __launch_bounds__(CONV_THREADS) conv_step_kernel(ConvStepArgs a) {
    int ch = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (ch >= a.conv_dim) return;
    int D = a.conv_dim;
    float w0 = bf2f(a.w[ch]), w1 = bf2f(a.w[D + ch]), w2 = bf2f(a.w[2 * D + ch]), w3 = bf2f(a.w[3 * D + ch]);
    float s0 = 0.f, s1 = 0.f, s2 = 0.f;  // u_{t-3}, u_{t-2}, u_{t-1}
    for (int c = 0; c < a.C; c++) {
        int sin = a.slots[c], sout = a.slots[a.C + c];
        if (sin >= 0) {
            const bf16_t* st = a.state + sin * a.slot_stride;
            s0 = bf2f(st[ch]); s1 = bf2f(st[D + ch]); s2 = bf2f(st[2 * D + ch]);
        }
        float u = bf2f(a.u[(int64_t)c * a.ldu + ch]);
        float acc = fmaf(w3, u, fmaf(w2, s2, fmaf(w1, s1, w0 * s0)));
        a.y[(int64_t)c * a.ldy + ch] = f2bf(silu_f(acc));
        s0 = s1; s1 = s2; s2 = u;
        if (sout >= 0) {
            bf16_t* st = a.state + sout * a.slot_stride;
            st[ch] = f2bf(s0); st[D + ch] = f2bf(s1); st[2 * D + ch] = f2bf(s2);
        }
    }
}
static void conv_step(const bf16_t* u, int ldu, const bf16_t* w, bf16_t* state, int64_t slot_stride, const int* slots,
                      bf16_t* y, int ldy, int C, int conv_dim, cudaStream_t stream) {
    ConvStepArgs a{u, ldu, w, state, slot_stride, slots, y, ldy, C, conv_dim};
    conv_step_kernel<<<CEIL_DIV(conv_dim, CONV_THREADS), CONV_THREADS, 0, stream>>>(a);
    cudaCheck(cudaGetLastError());
}

// prefill: T tokens, each thread one channel and CONV_TOKENS consecutive tokens. inputs
// before the first token come from state_in (nullptr: zeros). the state is not touched here
// (blocks of later tokens may still read state_in); conv_state_update writes it afterwards.
__global__ void __launch_bounds__(CONV_THREADS) conv_prefill_kernel(const bf16_t* __restrict__ u, int ldu, const bf16_t* __restrict__ w,
                                                                    const bf16_t* state_in, bf16_t* y, int ldy, int T, int conv_dim) {
    int ch = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (ch >= conv_dim) return;
    int D = conv_dim;
    int t0 = blockIdx.y * CONV_TOKENS;
    float w0 = bf2f(w[ch]), w1 = bf2f(w[D + ch]), w2 = bf2f(w[2 * D + ch]), w3 = bf2f(w[3 * D + ch]);
    auto in = [&](int t) -> float {
        if (t >= 0) return bf2f(u[(int64_t)t * ldu + ch]);
        return state_in ? bf2f(state_in[(3 + t) * D + ch]) : 0.f;
    };
    float s0 = in(t0 - 3), s1 = in(t0 - 2), s2 = in(t0 - 1);
    int t1 = t0 + CONV_TOKENS < T ? t0 + CONV_TOKENS : T;
    for (int t = t0; t < t1; t++) {
        float x = in(t);
        float acc = fmaf(w3, x, fmaf(w2, s2, fmaf(w1, s1, w0 * s0)));
        y[(int64_t)t * ldy + ch] = f2bf(silu_f(acc));
        s0 = s1; s1 = s2; s2 = x;
    }
}
// the state after T tokens: the last 3 raw inputs (left-filled from state_in when T < 3)
__global__ void conv_state_update_kernel(const bf16_t* __restrict__ u, int ldu, const bf16_t* state_in, bf16_t* state_out, int T,
                                         int conv_dim) {
    int ch = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (ch >= conv_dim) return;
    float v[3];
    for (int j = 0; j < 3; j++) {
        int t = T - 3 + j;
        v[j] = t >= 0 ? bf2f(u[(int64_t)t * ldu + ch]) : state_in ? bf2f(state_in[(3 + t) * conv_dim + ch]) : 0.f;
    }
    for (int j = 0; j < 3; j++) state_out[j * conv_dim + ch] = f2bf(v[j]);
}
static void conv_prefill(const bf16_t* u, int ldu, const bf16_t* w, const bf16_t* state_in, bf16_t* state_out, bf16_t* y,
                         int ldy, int T, int conv_dim, cudaStream_t stream) {
    dim3 grid(CEIL_DIV(conv_dim, CONV_THREADS), CEIL_DIV(T, CONV_TOKENS));
    conv_prefill_kernel<<<grid, CONV_THREADS, 0, stream>>>(u, ldu, w, state_in, y, ldy, T, conv_dim);
    cudaCheck(cudaGetLastError());
    if (state_out) {
        conv_state_update_kernel<<<CEIL_DIV(conv_dim, CONV_THREADS), CONV_THREADS, 0, stream>>>(u, ldu, state_in, state_out, T, conv_dim);
        cudaCheck(cudaGetLastError());
    }
}

// gdn gates (model.md 3.3), shared by the standalone kernel and the fused decode step:
//   beta = bf16(sigmoid(b)) (hf computes it in the activation dtype), g = -exp(A_log) *
//   softplus(a + dt_bias) in fp32 (a_log, dt_bias are stored fp32)
__device__ __forceinline__ void gdn_gate_math(float a, float b, float a_log, float dt_bias, float& beta, float& g) {
    beta = bfround(sigmoid_f(b));
    g = -expf(a_log) * softplus_f(a + dt_bias);
}
// a, b: [T][*] bf16 projection outputs (lda, ldb); beta, g: [T][Hv] fp32
__global__ void gdn_gates_kernel(const bf16_t* __restrict__ a, int lda, const bf16_t* __restrict__ b, int ldb, const float* __restrict__ a_log,
                                 const float* __restrict__ dt_bias, float* beta, float* g, int T, int Hv) {
    int idx = blockIdx.x * EW_THREADS + threadIdx.x;
    if (idx >= T * Hv) return;
    int t = idx / Hv, h = idx % Hv;
    float be, gg;
    gdn_gate_math(bf2f(a[(int64_t)t * lda + h]), bf2f(b[(int64_t)t * ldb + h]), a_log[h], dt_bias[h], be, gg);
    beta[idx] = be; g[idx] = gg;
}
static void gdn_gates(const bf16_t* a, int lda, const bf16_t* b, int ldb, const float* a_log, const float* dt_bias,
                      float* beta, float* g, int T, int Hv, cudaStream_t stream) {
    gdn_gates_kernel<<<CEIL_DIV(T * Hv, EW_THREADS), EW_THREADS, 0, stream>>>(a, lda, b, ldb, a_log, dt_bias, beta, g, T, Hv);
    cudaCheck(cudaGetLastError());
}

// recurrent gated delta rule, C columns of decode (model.md 3.5), fused with the l2 norm and
// q scaling of q, k (3.4) and the gates (3.3). state fp32 [Hv][dk][dv] per slot (dk = dv =
// 128), read and written through the slot map (header).
// parallelisation: the dv columns of a head are independent (m_j, delta_j, o_j only need
// column j of S), so block (head h, 32 columns) keeps its 128 x 32 slice of S in registers:
// warp w holds rows [32w, 32w+32) of column j0 + lane (32 floats per thread, coalesced 128-byte
// rows). per column: S *= e^g; m = S^T k; delta = beta (v - m); S += k delta^T; o = S^T q.
// output o: bf16 [C][Hv*dv] (hf casts the fp32 core output once).
enum { GDN_D = 128, GDN_COLS = 32, GDN_THREADS = 128 };
struct GdnStepArgs {
    const bf16_t* qkv; int ldqkv;   // conv output [C][conv_dim]: q heads | k heads | v heads
    const bf16_t* a; const bf16_t* b; int ldab;  // [C][Hv] gate projections (bf16)
    const float* a_log; const float* dt_bias;     // [Hv]
    float* state; int64_t slot_stride;            // slot s at state + s*slot_stride
    const int* slots;                             // [2C]
    bf16_t* out; int ldo;                         // [C][Hv*dv]
    int C, Hk, Hv;
};
__global__ void __launch_bounds__(GDN_THREADS) gdn_step_kernel(GdnStepArgs a) {
    const int h = blockIdx.x, j = blockIdx.y * GDN_COLS + (threadIdx.x & 31);
    const int warp = threadIdx.x >> 5, tid = threadIdx.x, i0 = warp * 32;
    const int hk = h / (a.Hv / a.Hk);
    __shared__ float qs[GDN_D], ks[GDN_D], part[4][32];
    float s[32];
#pragma unroll
    for (int r = 0; r < 32; r++) s[r] = 0.f;
    const float a_log = a.a_log[h], dt_bias = a.dt_bias[h];
    for (int c = 0; c < a.C; c++) {
        int sin = a.slots[c], sout = a.slots[a.C + c];
        if (sin >= 0) {
            const float* S = a.state + sin * a.slot_stride + ((int64_t)h * GDN_D + i0) * GDN_D + j;
#pragma unroll
            for (int r = 0; r < 32; r++) s[r] = S[r * GDN_D];
        }
        const bf16_t* row = a.qkv + (int64_t)c * a.ldqkv;
        float qv = bf2f(row[hk * GDN_D + tid]);
        float kv = bf2f(row[(a.Hk + hk) * GDN_D + tid]);
        float qq = block_sum(qv * qv);
        float kk = block_sum(kv * kv);
        qs[tid] = qv * rsqrtf(qq + 1e-6f) * 0.08838834764831845f;  // dk^-1/2
        ks[tid] = kv * rsqrtf(kk + 1e-6f);
        float beta, g;
        gdn_gate_math(bf2f(a.a[(int64_t)c * a.ldab + h]), bf2f(a.b[(int64_t)c * a.ldab + h]), a_log, dt_bias, beta, g);
        float eg = expf(g);
        __syncthreads();
        float m = 0.f;
#pragma unroll
        for (int r = 0; r < 32; r++) { s[r] *= eg; m = fmaf(s[r], ks[i0 + r], m); }
        part[warp][threadIdx.x & 31] = m;
        __syncthreads();
        m = part[0][tid & 31] + part[1][tid & 31] + part[2][tid & 31] + part[3][tid & 31];
        float vj = bf2f(row[(2 * a.Hk) * GDN_D + h * GDN_D + j]);
        float delta = beta * (vj - m);
        float o = 0.f;
#pragma unroll
        for (int r = 0; r < 32; r++) { s[r] = fmaf(ks[i0 + r], delta, s[r]); o = fmaf(s[r], qs[i0 + r], o); }
        __syncthreads();  // everyone has read part (m)
        part[warp][tid & 31] = o;
        __syncthreads();
        if (warp == 0) a.out[(int64_t)c * a.ldo + h * GDN_D + j] = f2bf(part[0][tid] + part[1][tid] + part[2][tid] + part[3][tid]);
        if (sout >= 0) {
            float* S = a.state + sout * a.slot_stride + ((int64_t)h * GDN_D + i0) * GDN_D + j;
#pragma unroll
            for (int r = 0; r < 32; r++) S[r * GDN_D] = s[r];
        }
        __syncthreads();  // qs, ks, part are reused by the next column
    }
}
static void gdn_step(const GdnStepArgs& a, cudaStream_t stream) {
    CHECK(a.Hv % a.Hk == 0, "gdn_step: Hv %d not a multiple of Hk %d", a.Hv, a.Hk);
    dim3 grid(a.Hv, GDN_D / GDN_COLS);
    gdn_step_kernel<<<grid, GDN_THREADS, 0, stream>>>(a);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// attention decode (model.md 2.4): bf16 kv cache, split-k over the context, gqa
//
// cache per layer: K and V [Hkv][cap][256] bf16 (position-addressed; rows past the visible
// length are never read, so they may hold anything). kv_append writes the C new columns at
// their positions first; then column c attends to keys 0..pos[c] (mtp verification: the
// draft columns see each other causally).
// attn_decode: block (kv head h, split sp) handles keys [sp*split_keys, +split_keys) for all
// G*C queries of that kv head, 128 keys at a time: (1) thread = key: scores for every query
// (q in shared memory, broadcast reads; no shuffles), (2) warp w owns queries w, w+4, ..:
// online softmax over the 128 scores, (3) lanes over dims (8 each, 16-byte v rows): acc +=
// p v. the partial (m, l, acc) of each split goes to scratch; attn_combine merges the splits,
// normalizes, rounds to bf16 and applies the output gate: y = bf16(o * bf16(sigmoid(gate))).
// scores are fp32 (q*k products of bf16, scale 1/16 exact); p and the sums fp32.

enum { ATT_HD = 256, ATT_KEYS = 128, ATT_THREADS = 128, ATT_MAX_Q = 16 };

__global__ void kv_append_kernel(const bf16_t* __restrict__ k, int ldk, const bf16_t* __restrict__ v, int ldv, bf16_t* kc,
                                 bf16_t* vc, int64_t cap, const int* __restrict__ pos, int Hkv) {
    int c = blockIdx.x / Hkv, h = blockIdx.x % Hkv, d = threadIdx.x;
    int64_t p = pos[c];
    if (p < 0 || p >= cap) return;
    kc[((int64_t)h * cap + p) * ATT_HD + d] = k[(int64_t)c * ldk + h * ATT_HD + d];
    vc[((int64_t)h * cap + p) * ATT_HD + d] = v[(int64_t)c * ldv + h * ATT_HD + d];
}
static void kv_append(const bf16_t* k, int ldk, const bf16_t* v, int ldv, bf16_t* kc, bf16_t* vc, int64_t cap,
                      const int* pos, int C, int Hkv, cudaStream_t stream) {
    kv_append_kernel<<<C * Hkv, ATT_HD, 0, stream>>>(k, ldk, v, ldv, kc, vc, cap, pos, Hkv);
    cudaCheck(cudaGetLastError());
}

struct AttnArgs {
    const bf16_t* q; int ldq;         // column c, head hq at q + c*ldq + hq*256 (normed, roped)
    const bf16_t* kc; const bf16_t* vc; int64_t cap;
    const int* pos;                   // [C] device
    int C, Hq, Hkv;
    int n_splits, split_keys;         // split_keys a multiple of ATT_KEYS
    float* part_acc;                  // [Hkv][n_splits][G*C][256]
    float* part_ml;                   // [Hkv][n_splits][G*C][2]
    float scale;
};
template <int QPW>  // queries per warp: the block serves up to 4*QPW queries
__global__ void __launch_bounds__(ATT_THREADS) attn_decode_kernel(AttnArgs a) {
    constexpr int NQ = 4 * QPW;
    const int h = blockIdx.x, sp = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int G = a.Hq / a.Hkv, nq = G * a.C;
    __shared__ __align__(16) float qs[NQ][ATT_HD];
    __shared__ float ps[NQ][ATT_KEYS];
    __shared__ int vis[NQ];
    int lmax = 0;
    for (int c = 0; c < a.C; c++) lmax = max(lmax, a.pos[c] + 1);
    for (int i = tid; i < NQ * ATT_HD; i += ATT_THREADS) {
        int qi = i / ATT_HD, d = i % ATT_HD;
        float v = 0.f;
        if (qi < nq) v = bf2f(a.q[(int64_t)(qi / G) * a.ldq + (h * G + qi % G) * ATT_HD + d]) * a.scale;
        qs[qi][d] = v;
    }
    if (tid < NQ) vis[tid] = tid < nq ? a.pos[tid / G] : -1;
    // running softmax state of the queries this warp owns (qi = warp + 4k), replicated in lanes
    float m_run[QPW], l_run[QPW], acc[QPW][8];
#pragma unroll
    for (int k = 0; k < QPW; k++) {
        m_run[k] = -INFINITY; l_run[k] = 0.f;
#pragma unroll
        for (int d = 0; d < 8; d++) acc[k][d] = 0.f;
    }
    const bf16_t* kbase = a.kc + (int64_t)h * a.cap * ATT_HD;
    const bf16_t* vbase = a.vc + (int64_t)h * a.cap * ATT_HD;
    const int kbeg = sp * a.split_keys;
    const int kend = min(kbeg + a.split_keys, lmax);
    __syncthreads();
    for (int k0 = kbeg; k0 < kend; k0 += ATT_KEYS) {
        const int nk = min(ATT_KEYS, kend - k0);
        // (1) scores, thread = key
        {
            int key = k0 + tid;
            float sc[NQ];
#pragma unroll
            for (int q = 0; q < NQ; q++) sc[q] = 0.f;
            if (tid < nk) {
                const uint4* kr = (const uint4*)(kbase + (int64_t)key * ATT_HD);
#pragma unroll 8
                for (int d8 = 0; d8 < ATT_HD / 8; d8++) {
                    uint4 raw = kr[d8];
                    float kf[8];
                    const __nv_bfloat162* p2 = (const __nv_bfloat162*)&raw;
#pragma unroll
                    for (int e = 0; e < 4; e++) { float2 f = __bfloat1622float2(p2[e]); kf[2 * e] = f.x; kf[2 * e + 1] = f.y; }
#pragma unroll
                    for (int q = 0; q < NQ; q++) {
                        const float4 qa = *(const float4*)&qs[q][d8 * 8], qb = *(const float4*)&qs[q][d8 * 8 + 4];
                        sc[q] = fmaf(qa.x, kf[0], fmaf(qa.y, kf[1], fmaf(qa.z, kf[2], fmaf(qa.w, kf[3], sc[q]))));
                        sc[q] = fmaf(qb.x, kf[4], fmaf(qb.y, kf[5], fmaf(qb.z, kf[6], fmaf(qb.w, kf[7], sc[q]))));
                    }
                }
            }
#pragma unroll
            for (int q = 0; q < NQ; q++) ps[q][tid] = (tid < nk && key <= vis[q]) ? sc[q] : -INFINITY;
        }
        __syncthreads();
        // (2) online softmax per owned query
#pragma unroll
        for (int k = 0; k < QPW; k++) {
            int qi = warp + 4 * k;
            float v0 = ps[qi][lane], v1 = ps[qi][lane + 32], v2 = ps[qi][lane + 64], v3 = ps[qi][lane + 96];
            float cm = warp_max(fmaxf(fmaxf(v0, v1), fmaxf(v2, v3)));
            float mn = fmaxf(m_run[k], cm);
            float alpha = mn == -INFINITY ? 1.f : expf(m_run[k] - mn);
            float e0 = mn == -INFINITY ? 0.f : expf(v0 - mn), e1 = mn == -INFINITY ? 0.f : expf(v1 - mn);
            float e2 = mn == -INFINITY ? 0.f : expf(v2 - mn), e3 = mn == -INFINITY ? 0.f : expf(v3 - mn);
            ps[qi][lane] = e0; ps[qi][lane + 32] = e1; ps[qi][lane + 64] = e2; ps[qi][lane + 96] = e3;
            l_run[k] = l_run[k] * alpha + warp_sum(e0 + e1 + e2 + e3);
            m_run[k] = mn;
#pragma unroll
            for (int d = 0; d < 8; d++) acc[k][d] *= alpha;
        }
        __syncwarp();
        // (3) acc += p v, lanes over dims; each warp reads only the probabilities it wrote.
        // v rows in batches of 8 so that 8 loads are in flight, not one
        for (int t0 = 0; t0 < nk; t0 += 8) {
            uint4 raw[8];
#pragma unroll
            for (int j = 0; j < 8; j++)
                raw[j] = t0 + j < nk ? *(const uint4*)(vbase + (int64_t)(k0 + t0 + j) * ATT_HD + lane * 8) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float vf[8];
                const __nv_bfloat162* p2 = (const __nv_bfloat162*)&raw[j];
#pragma unroll
                for (int e = 0; e < 4; e++) { float2 f = __bfloat1622float2(p2[e]); vf[2 * e] = f.x; vf[2 * e + 1] = f.y; }
#pragma unroll
                for (int k = 0; k < QPW; k++) {
                    float p = t0 + j < nk ? ps[warp + 4 * k][t0 + j] : 0.f;
#pragma unroll
                    for (int d = 0; d < 8; d++) acc[k][d] = fmaf(p, vf[d], acc[k][d]);
                }
            }
        }
        __syncthreads();  // ps is rewritten by the next chunk
    }
#pragma unroll
    for (int k = 0; k < QPW; k++) {
        int qi = warp + 4 * k;
        if (qi >= nq) continue;
        int64_t slot = ((int64_t)h * a.n_splits + sp) * nq + qi;
        float* pa = a.part_acc + slot * ATT_HD + lane * 8;
        *(float4*)pa = make_float4(acc[k][0], acc[k][1], acc[k][2], acc[k][3]);
        *(float4*)(pa + 4) = make_float4(acc[k][4], acc[k][5], acc[k][6], acc[k][7]);
        if (lane == 0) { a.part_ml[slot * 2] = m_run[k]; a.part_ml[slot * 2 + 1] = l_run[k]; }
    }
}

// merge the splits of column c, query head hq (block), one thread per dim
__global__ void __launch_bounds__(ATT_HD) attn_combine_kernel(AttnArgs a, const bf16_t* __restrict__ gate, int ldg, bf16_t* y, int ldy) {
    const int c = blockIdx.x / a.Hq, hq = blockIdx.x % a.Hq, d = threadIdx.x;
    const int G = a.Hq / a.Hkv, nq = G * a.C, h = hq / G, qi = c * G + hq % G;
    float M = -INFINITY;
    for (int s = 0; s < a.n_splits; s++) M = fmaxf(M, a.part_ml[(((int64_t)h * a.n_splits + s) * nq + qi) * 2]);
    float L = 0.f, o = 0.f;
    if (M != -INFINITY) {
        for (int s = 0; s < a.n_splits; s++) {
            int64_t slot = ((int64_t)h * a.n_splits + s) * nq + qi;
            float m = a.part_ml[slot * 2];
            if (m == -INFINITY) continue;
            float e = expf(m - M);
            L = fmaf(a.part_ml[slot * 2 + 1], e, L);
            o = fmaf(a.part_acc[slot * ATT_HD + d], e, o);
        }
    }
    float out = L > 0.f ? o / L : 0.f;
    if (gate) out = bfround(out) * bfround(sigmoid_f(bf2f(gate[(int64_t)c * ldg + hq * ATT_HD + d])));
    y[(int64_t)c * ldy + hq * ATT_HD + d] = f2bf(out);
}

// scratch floats attn_decode needs for (Hkv, n_splits, queries per launch)
static size_t attn_scratch_floats(int Hq, int Hkv, int n_splits) {
    int G = Hq / Hkv, cols = ATT_MAX_Q / G;
    return (size_t)Hkv * n_splits * (G * cols) * (ATT_HD + 2);
}
// split plan: keys per split (a multiple of ATT_KEYS) for contexts up to max_len in n_splits
static int attn_split_keys(int64_t max_len, int n_splits) {
    int64_t per = CEIL_DIV(max_len, (int64_t)n_splits);
    return (int)(CEIL_DIV(per, (int64_t)ATT_KEYS) * ATT_KEYS);
}
// y[c] = gate-scaled attention of the C columns (q heads of column c at q + c*ldq), keys 0..pos[c].
// n_splits * split_keys must cover the longest visible context. scratch: attn_scratch_floats.
// gate: nullable [C][Hq*256] (ldg). columns go in launches of ATT_MAX_Q / G.
static void attn_decode(const bf16_t* q, int ldq, const bf16_t* kc, const bf16_t* vc, int64_t cap, const int* pos, int C,
                        int Hq, int Hkv, int n_splits, int split_keys, float* scratch, const bf16_t* gate, int ldg, bf16_t* y,
                        int ldy, cudaStream_t stream) {
    CHECK(Hq % Hkv == 0 && split_keys % ATT_KEYS == 0 && n_splits > 0, "attn_decode: bad arguments");
    int G = Hq / Hkv, cols = ATT_MAX_Q / G;
    CHECK(cols >= 1, "attn_decode: %d query heads per kv head is more than %d", G, ATT_MAX_Q);
    for (int c0 = 0; c0 < C; c0 += cols) {
        AttnArgs a;
        a.q = q + (int64_t)c0 * ldq; a.ldq = ldq; a.kc = kc; a.vc = vc; a.cap = cap; a.pos = pos + c0;
        a.C = C - c0 < cols ? C - c0 : cols; a.Hq = Hq; a.Hkv = Hkv;
        a.n_splits = n_splits; a.split_keys = split_keys;
        a.part_acc = scratch;
        a.part_ml = scratch + (size_t)Hkv * n_splits * (G * cols) * ATT_HD;
        a.scale = 1.0f / sqrtf((float)ATT_HD);
        int nq = G * a.C;
        dim3 grid(Hkv, n_splits);
        if (nq <= 4) attn_decode_kernel<1><<<grid, ATT_THREADS, 0, stream>>>(a);
        else if (nq <= 8) attn_decode_kernel<2><<<grid, ATT_THREADS, 0, stream>>>(a);
        else attn_decode_kernel<4><<<grid, ATT_THREADS, 0, stream>>>(a);
        cudaCheck(cudaGetLastError());
        attn_combine_kernel<<<a.C * Hq, ATT_HD, 0, stream>>>(a, gate ? gate + (int64_t)c0 * ldg : nullptr, ldg,
                                                              y + (int64_t)c0 * ldy, ldy);
        cudaCheck(cudaGetLastError());
    }
}

// ----------------------------------------------------------------------------
// argmax over the first n logits of each of C columns (greedy sampling), lowest id on ties;
// nan never wins. stage 1: ARGMAX_BLOCKS blocks per column each reduce a strided slice;
// stage 2: one warp per column merges them. logits fp32 or bf16.

enum { ARGMAX_THREADS = 256, ARGMAX_BLOCKS = 64 };

__device__ __forceinline__ void argmax_merge(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i) || (v != v && v2 == v2)) { v = v2; i = i2; }
}
template <typename T>
__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_stage1_kernel(const T* __restrict__ logits, int64_t ld, int n, float* pv, int* pi) {
    const int c = blockIdx.y;
    const T* row = logits + (int64_t)c * ld;
    float v = -INFINITY; int idx = INT32_MAX;
    for (int k = blockIdx.x * ARGMAX_THREADS + threadIdx.x; k < n; k += ARGMAX_BLOCKS * ARGMAX_THREADS) {
        float x;
        if constexpr (sizeof(T) == 2) x = bf2f(row[k]); else x = row[k];
        if (x == x) argmax_merge(v, idx, x, k);
    }
    for (int o = 16; o; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, v, o); int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        argmax_merge(v, idx, v2, i2);
    }
    __shared__ float sv[ARGMAX_THREADS / 32]; __shared__ int si[ARGMAX_THREADS / 32];
    if ((threadIdx.x & 31) == 0) { sv[threadIdx.x >> 5] = v; si[threadIdx.x >> 5] = idx; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_THREADS / 32; w++) argmax_merge(v, idx, sv[w], si[w]);
        pv[c * ARGMAX_BLOCKS + blockIdx.x] = v; pi[c * ARGMAX_BLOCKS + blockIdx.x] = idx;
    }
}
__global__ void argmax_stage2_kernel(const float* __restrict__ pv, const int* __restrict__ pi, int* out) {
    const int c = blockIdx.x, lane = threadIdx.x;
    float v = -INFINITY; int idx = INT32_MAX;
    for (int k = lane; k < ARGMAX_BLOCKS; k += 32) argmax_merge(v, idx, pv[c * ARGMAX_BLOCKS + k], pi[c * ARGMAX_BLOCKS + k]);
    for (int o = 16; o; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, v, o); int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        argmax_merge(v, idx, v2, i2);
    }
    if (lane == 0) out[c] = idx == INT32_MAX ? 0 : idx;
}
// scratch: ARGMAX_BLOCKS * C floats + as many ints (argmax_scratch_bytes)
static size_t argmax_scratch_bytes(int C) { return (size_t)C * ARGMAX_BLOCKS * 8; }
template <typename T>
static void argmax(const T* logits, int64_t ld, int n, int C, void* scratch, int* out, cudaStream_t stream) {
    float* pv = (float*)scratch; int* pi = (int*)(pv + (size_t)C * ARGMAX_BLOCKS);
    argmax_stage1_kernel<T><<<dim3(ARGMAX_BLOCKS, C), ARGMAX_THREADS, 0, stream>>>(logits, ld, n, pv, pi);
    cudaCheck(cudaGetLastError());
    argmax_stage2_kernel<<<C, 32, 0, stream>>>(pv, pi, out);
    cudaCheck(cudaGetLastError());
}
