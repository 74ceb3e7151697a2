// kernels the product does not launch, kept for the kernel tests and benches (llm.c's dev/cuda).
// include after ninfer.cu (under NINFER_TESTING): they reuse the product's device helpers.
//   * gemv versions: the product's gemv() (ninfer.cu 7.2) reaches four configurations; the
//     other measured versions of the register kernel, with the row-tile count RT and the
//     offset trick OFFS as parameters, live here with the variant table that test_kernels and
//     the benches index (why each exists and how it measured: test/bench-notes.md, "gemv
//     versions").
//   * the separate kernels attn_prep (ninfer.cu 7.6) fuses: m-rope and the kv append, each
//     tested against its cpu twin, and attn_prep against them (Attention.PrepMatchesSeparateKernels).
//   * the wide gemv's versions (gemv_xp_kernel's: the x prefetched a group ahead, shared in
//     shared memory, more row tiles a warp), with the product's prep, tested bit for bit
//     against it.
//   * the attention split plan the tests choose by hand (the forward's is gpu_attn_plan).
//   * attention decode's version 1 (thread per key, cuda cores), to time against the product.
//   * the wgmma prefill gemm with a __syncthreads a group (gemm_wgmma_sync_kernel), to time
//     against the product's mbarrier stages; with A in registers, a 128 x 128 tile
//     (gemm_wgmma_rs_kernel, sessions 16-22's product), to time against the product's A tile
//     in shared memory.
#pragma once

// the dev kernels' cp.async stages on mbarriers (the ring gemv, the register-A gemm): one
// arrival on bar once every cp.async this thread issued before has landed (the barrier's count
// includes it: .noinc)
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
#endif
}

namespace gemv_dev {

// the A operand: the bf16x2 pair p of one row's raw group data (codes, exact).
// q4/q5/q6: pair p = lanes (i, i+4) of base word p/4 (lanes 0..7 or 8..15 of the thread's 16),
// i = p%4: the shift by 4i brings nibble i to bits 0..3 and nibble i+4 to bits 16..19.
// hs: the high bits pre-spread for the word (see gemv_spread_high), so the same kind of
// shift places them at bit 4 (and 5) of each half.
// OFFS: return code + offset (gemv_offset: 136, 144, 160), the bare magic value; the kernel
// then subtracts offset * sum(x) per group in fp32, which saves the bf16 fma per pair.
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

// a warp's plane pointers: rows g and g+8 of RT tiles, already advanced to the thread's
// share of a group (base + 8t; bf16 + 32t; high + 2t or 4t); rows past the end are clamped
// (read twice, never stored). per stage they move by whole groups, and the D groups of a
// stage are immediate offsets from there.
template <int RT>
struct GemvPtrs { const uint8_t* b[RT][2]; const uint8_t* h[RT][2]; const uint8_t* s[RT][2]; };


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

// one group of RT row tiles: acc += scale * (codes . x) per tile, from the group's b fragments
// and (offset trick) the sums of x over the group for columns 2t, 2t+1 (sx[0], sx[1])
template <int F, int RT, bool OFFS>
__device__ __forceinline__ void gemv_group(const uint32_t (&raw)[RT][2][GemvFmt<F>::RAW], float (&acc)[RT][4],
                                           const uint32_t (&b)[GemvFmt<F>::STEPS][2], const float (&sx)[4]) {
    using Fm = GemvFmt<F>;
#pragma unroll
    for (int i = 0; i < RT; i++) {
        const uint32_t (&r0)[Fm::RAW] = raw[i][0];
        const uint32_t (&r1)[Fm::RAW] = raw[i][1];
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
        gemv_group<F, RT, OFFS>(raw[d], acc, b, sx);
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
        if (row < rows && col < a.C) gemv_store(a, row, col, s);
    }
}

// NW warps share a tile of 16*RT rows and split its groups: warp w takes groups
// [(it*NW + w)*D, +D) for it = 0, 1, ...: the loads of a stage are all issued, then the stage
// is computed (the other warps of the sm keep the memory busy meanwhile). x is loaded when a
// group is computed (an l1 hit once one warp of the sm has touched it).
template <int F, int NW, int D, int RT, bool OFFS, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) gemv_kernel(GemvArgs a) {
    pdl_entry();
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

// ---- gemv versions: the weights through one deep ring a 16-row worker (issue 16, session 17) ----
// gemv_ring_kernel: the products of at most 8 columns from the prepared x of the wide kernel,
// with its arithmetic for one 8-column tile (so its bits are the x-staged kernel's). the idea
// was more bytes in flight than the x-staged kernel's per-warp cp.async stages (~1-3 KB a warp):
//   * a worker is NW warps on one 16-row tile at a time (the matrix's warp split of k); RT
//     workers a block, a grid of at most g_ring_bps blocks an sm; worker w walks tiles w,
//     w + workers, ...
//   * a worker's weights flow through a ring of NS slots, one piece a slot: 16 rows x PG groups
//     of every plane (rows padded so a warp's reads of 8 rows hit distinct banks), copied by
//     every thread of the worker with cp.async and counted on the slot's mbarrier; the ring runs
//     across the worker's tiles, its first NS pieces asked for before griddepcontrol.wait.
//   * warp wt takes group pairs wt, wt + NW, .. of each piece (PG / 2 a multiple of NW); the
//     worker's warps meet on a named barrier after each piece, then refill its slot.
// it lost to the product's kernels on every 9b shape (bench-notes, session 17: gate_up 42.7 vs
// 23.1 us), as did a first form with one bulk copy (cp.async.bulk) a row and plane (65.9 us).
// variants 15-19 of gemv_variant run it; shapes it cannot take run variant 9.
__device__ __forceinline__ void bar_named(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
// the mbarrier helpers (mbar_init, mbar_wait, cp_async_mbar_arrive) are ninfer.cu 7.9's

template <int F, int PG> struct GemvRingLayout {  // one slot: 16 rows x PG groups of each plane
    static constexpr int HB = GemvAsyncLayout<F>::HB;
    static constexpr int RSB = PG * 32 + 32, RSH = HB ? PG * HB + 16 : 0, RSS = PG * 2 + 16;  // bytes a row
    static constexpr int OFF_H = 16 * RSB, OFF_S = OFF_H + 16 * RSH;
    static constexpr int BYTES = (OFF_S + 16 * RSS + 127) / 128 * 128;
};
// group j of a slot for the thread's rows g, g+8 (gemv_stage_group's words)
template <int F, int PG>
__device__ __forceinline__ void gemv_ring_group(uint32_t (&raw)[2][GemvFmt<F>::RAW], const uint8_t* st, int j, int g, int t) {
    using Ly = GemvRingLayout<F, PG>;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        const uint2 v = *(const uint2*)(st + r * Ly::RSB + j * 32 + t * 8);
        raw[h][0] = v.x; raw[h][1] = v.y;
        if constexpr (F == FMT_Q5) raw[h][2] = *(const unsigned short*)(st + Ly::OFF_H + r * Ly::RSH + j * 8 + t * 2);
        else if constexpr (F == FMT_Q6) raw[h][2] = *(const uint32_t*)(st + Ly::OFF_H + r * Ly::RSH + j * 16 + t * 4);
        else raw[h][2] = 0;
        raw[h][3] = *(const unsigned short*)(st + Ly::OFF_S + r * Ly::RSS + j * 2);
    }
}
// dynamic shared memory: the rings [RT][NS][BYTES], then each worker's partial sums [RT][NW][32]
// float4. early: the pdl trigger right after the first copies (else after the last piece)
template <int F, int NW, int RT, int PG, int NS>
__global__ void __launch_bounds__(RT * NW * 32, 1) gemv_ring_kernel(GemvArgs a, const uint4* __restrict__ xp,
                                                                  const float* __restrict__ xps, int cp, int early) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using Fm = GemvFmt<F>;
    using Ly = GemvRingLayout<F, PG>;
    static_assert((PG / 2) % NW == 0, "a piece holds whole rounds of the warps' group pairs");
    constexpr int W = gemv_xs_words(F), NQ4 = W / 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r = warp / NW, wt = warp % NW;
    const Mat& w = a.w;
    const int64_t rows = w.rows, tiles = CEIL_DIV(rows, (int64_t)16);
    const int units = (int)w.gpr, C = a.C, ppt = CEIL_DIV(units, PG);
    const int64_t worker = (int64_t)blockIdx.x * RT + r, workers = (int64_t)gridDim.x * RT;
    const int64_t n_items = worker < tiles ? ((tiles - 1 - worker) / workers + 1) * ppt : 0;
    extern __shared__ __align__(128) uint8_t ring_smem_[];
    uint8_t* ring = ring_smem_ + (size_t)r * NS * Ly::BYTES;
    float4* red = (float4*)(ring_smem_ + (size_t)RT * NS * Ly::BYTES) + r * NW * 32;
    __shared__ __align__(8) uint64_t full[RT][NS];
    if (threadIdx.x == 0) {
        for (int i = 0; i < RT * NS; i++) mbar_init(smem_u32(&full[0][0] + i), NW * 32);
        mbar_init_fence();
    }
    __syncthreads();
    // item i (piece i % ppt of the worker's tile i / ppt) into slot i % NS, by every thread of
    // the worker: 16-byte copies, then one arrival each on the slot's barrier when they land
    const int tw = wt * 32 + lane;
    auto issue = [&](int64_t i) {
        const int64_t tile = worker + (i / ppt) * workers;
        const int u0 = (int)(i % ppt) * PG, ng = min(PG, units - u0);
        const uint32_t st = smem_u32(ring + (size_t)(i % NS) * Ly::BYTES);
        auto rowg = [&](int lr) { const int64_t x = tile * 16 + lr; return x < rows ? x : rows - 1; };  // past the end: never stored
        // a plane of B bytes a group: 16 rows x PG * B / 16 chunks, those past ng skipped
        auto plane = [&](auto bpg, uint32_t dst, const uint8_t* src, int64_t pitch, int rs) {
            constexpr int B = decltype(bpg)::value, CPR = PG * B / 16, N = 16 * CPR;
#pragma unroll
            for (int k = 0; k < (N + NW * 32 - 1) / (NW * 32); k++) {
                const int c = tw + k * NW * 32, lr = c / CPR, ch = c % CPR;
                if (c < N && ch < ng * B / 16) cp_async16(dst + lr * rs + ch * 16, src + rowg(lr) * pitch + (size_t)u0 * B + ch * 16);
            }
        };
        plane(std::integral_constant<int, 32>(), st, w.base, w.base_row, Ly::RSB);
        plane(std::integral_constant<int, 2>(), st + Ly::OFF_S, w.scale, w.scale_row, Ly::RSS);
        if constexpr (Ly::HB != 0) plane(std::integral_constant<int, Ly::HB>(), st + Ly::OFF_H, w.high, w.high_row, Ly::RSH);
        cp_async_mbar_arrive(smem_u32(&full[r][i % NS]));
    };
    for (int64_t i = 0; i < NS && i < n_items; i++) issue(i);
    if (early) pdl_release();  // the grid is resident (at most one wave): dependents may take what is left
    pdl_entry();               // the weights are never written: only the prepared x waits

    // this lane's b words: column g, thread t (+ u * cp * NQ4 * 4 uint4), and its sums
    const uint4* xl = xp + (size_t)g * NQ4 * 4 + t;
    const float* sl = xps + 2 * t;
    const bool xlive = g < C, slive = 2 * t < C;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int64_t i = 0; i < n_items; i++) {
        const int slot = (int)(i % NS), pc = (int)(i % ppt), u0 = pc * PG, ng = min(PG, units - u0);
        mbar_wait(smem_u32(&full[r][slot]), (uint32_t)((i / NS) & 1));
        const uint8_t* st = ring + (size_t)slot * Ly::BYTES;
        for (int q = wt; 2 * q < ng; q += NW) {
#pragma unroll
            for (int d = 0; d < 2; d++) {
                const int j = 2 * q + d, u = u0 + j;
                uint32_t raw[2][Fm::RAW];
                gemv_ring_group<F, PG>(raw, st, j, g, t);
                uint32_t A[GemvWideA<F>::N][4];
                gemv_afrag<F>(raw, A);
                const uint4* xu = xl + (size_t)u * cp * NQ4 * 4;
                uint4 v[NQ4];
#pragma unroll
                for (int q4 = 0; q4 < NQ4; q4++) v[q4] = xlive ? __ldg(xu + q4 * 4) : make_uint4(0, 0, 0, 0);
                const float2 sv = slive ? __ldg((const float2*)(sl + (size_t)u * cp)) : make_float2(0.f, 0.f);
                const float sx[4] = {sv.x, sv.y, sv.x, sv.y};
                uint32_t b[Fm::STEPS][2];
#pragma unroll
                for (int q4 = 0; q4 < NQ4; q4++) {
                    b[2 * q4][0] = v[q4].x; b[2 * q4][1] = v[q4].y;
                    if (2 * q4 + 1 < Fm::STEPS) { b[2 * q4 + 1][0] = v[q4].z; b[2 * q4 + 1][1] = v[q4].w; }
                }
                gemv_tile<F>(A, f16bits2f(raw[0][3]), f16bits2f(raw[1][3]), acc, b, sx);
            }
        }
        bar_named(1 + r, NW * 32);  // every warp of the worker is past the slot
        if (i + NS < n_items) issue(i + NS);
        if (pc == ppt - 1) {  // the tile's last piece: its warps meet as gemv_epilogue's (s = 0, += warp v = 0..NW-1)
            red[wt * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
            bar_named(1 + r, NW * 32);
            const int64_t row0 = (worker + (i / ppt) * workers) * 16;
            for (int idx = wt * 32 + lane; idx < 128; idx += NW * 32) {
                const int ln = idx >> 2, j = idx & 3;
                float s = 0.f;
#pragma unroll
                for (int v = 0; v < NW; v++) s += ((const float*)&red[v * 32 + ln])[j];
                const int64_t row = row0 + (ln >> 2) + (j >= 2 ? 8 : 0);
                const int col = 2 * (ln & 3) + (j & 1);
                if (row < rows && col < C) gemv_store(a, row, col, s);
            }
            // red is written again only after the next piece's barrier, which every reader passes first
            acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
        }
    }
    if (!early) pdl_release();
#endif
}

// the ring kernel's launch: on sm_90+ (g_ring_ok, set by the first variant launch), for matrices
// whose row pieces are all 16-byte aligned: k a multiple of 512, every plane's base and row pitch
static bool g_ring_ok = false;  // the device is sm_90+ (its mbarrier forms)
static int g_ring_bps = 1;     // blocks an sm (the grid is at most g_sms x this)
static int g_ring_early = 1;   // the pdl trigger after the first copies (0: after the last piece)
static bool ring_shape_ok(const Mat& w) {
    auto a16 = [](const void* p, int64_t pitch) { return ((uintptr_t)p & 15) == 0 && pitch % 16 == 0; };
    return format_grouped(w.format) && w.cols % 128 == 0 && w.gpr % 8 == 0 && a16(w.base, w.base_row) && a16(w.scale, w.scale_row) &&
           (!(w.format == FMT_Q5 || w.format == FMT_Q6) || a16(w.high, w.high_row));
}
static bool ring_ok(const Mat& w) { return g_ring_ok && ring_shape_ok(w); }
template <int F, int NW, int RT, int PG, int NS>
static size_t ring_smem() { return (size_t)RT * NS * GemvRingLayout<F, PG>::BYTES + (size_t)RT * NW * 32 * 16; }
template <int F, int NW, int RT, int PG, int NS>
static void ring_go(const GemvArgs& a, const GemvXpIn& in, cudaStream_t stream) {
    const int64_t tiles = CEIL_DIV(a.w.rows, (int64_t)16);
    const unsigned grid = (unsigned)std::min<int64_t>(CEIL_DIV(tiles, (int64_t)RT), (int64_t)g_sms * g_ring_bps);
    launch_k(gemv_ring_kernel<F, NW, RT, PG, NS>, grid, RT * NW * 32, ring_smem<F, NW, RT, PG, NS>(), stream, a, in.xp, in.xps,
             in.cp, g_ring_early);
}
template <int F, int NW, int RT, int PG, int NS>
static void ring_init_one() {
    cudaCheck(cudaFuncSetAttribute(gemv_ring_kernel<F, NW, RT, PG, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)ring_smem<F, NW, RT, PG, NS>()));
}
}  // namespace gemv_dev

// the variants the tests and benches index; gemv() picks one of 2, 7, 8, 9 by shape.
//   register kernel <warps per tile NW, groups per stage D, row tiles RT, offset trick, min blocks/sm>
//     0..5 (3: two row tiles, 4: no offset trick: gemv_dev's versions; 2 is the product's)
//   async kernel <NW, stages S, min blocks/sm> (6, 7); shapes it cannot take run variant 2
//   x-staged kernel <NW, S, min blocks/sm> (8, 9); shapes whose x does not fit run variant 7
//   x-staged, more warps per 16-row tile (the k split over more warps: fewer dependent stages
//   per warp, more bytes in flight for matrices of few tiles): 10 <16, 3, 2>, 11 <16, 2, 2>,
//   12 <8, 4, 3>, 13 <8, 3, 4> (the product's GEMV_XS_8X3_4); 14: 9 with 4 row tiles a block (the
//   product's for several columns of a long matrix before the wide kernel took them)
//   ring kernel <workers RT, groups a piece PG, slots NS> from the prepared x (sm_90+; elsewhere,
//   and for shapes it cannot take, variant 9): 15 <2, 16, 4>, 16 <1, 16, 4>, 17 <2, 16, 3>,
//   18 <2, 32, 3>, 19 <4, 16, 3> (blocks an sm: gemv_dev::g_ring_bps)
static const int GEMV_VARIANTS = 20;
// the dev x-staged variants' launch: the opt-in shared memory once, then gemv_launch's fallbacks
template <int F, int NW, int S, int MINB>
static void gemv_xs_dev_launch(const GemvArgs& a, cudaStream_t stream) {
    const size_t xsb = gemv_xs_bytes((NumFormat)F, (int)a.w.gpr, a.C);
    if (F == FMT_BF16 || gemv_xs_smem<F>(NW, S, xsb) > GEMV_XS_SMEM_MAX || !gemv_async_ok(a.w)) { gemv_launch<F>(GEMV_XS_4X4, a, stream); return; }
    if constexpr (F != FMT_BF16) {
        static bool init = false;
        if (!init) {
            cudaCheck(cudaFuncSetAttribute(gemv_xs_kernel<F, NW, S, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GEMV_XS_SMEM_MAX));
            init = true;
        }
        launch_k(gemv_xs_kernel<F, NW, S, MINB>, (unsigned)CEIL_DIV(a.w.rows, (int64_t)16), NW * 32, gemv_xs_smem<F>(NW, S, xsb), stream, a);
    }
}
// variant 14: 4 row tiles of variant 9 a block (one staged x for 64 rows: the bits of variant 9)
static int gemv_xs_r4_cols(const Mat& w) {
    int c = GEMV_MAX_COLS;
    while (c > 1 && gemv_xs_bytes(w.format, (int)w.gpr, c) > gemv_xs_room(w.format, 4, 4, 4)) c--;
    return c;
}
template <int F>
static void gemv_xs_r4_launch(const GemvArgs& a, cudaStream_t stream) {
    const size_t xsb = gemv_xs_bytes((NumFormat)F, (int)a.w.gpr, a.C);
    if (F == FMT_BF16 || xsb > gemv_xs_room((NumFormat)F, 4, 4, 4) || !gemv_async_ok(a.w)) { gemv_launch<F>(GEMV_ASYNC, a, stream); return; }
    if constexpr (F != FMT_BF16) {
        static bool init = false;
        if (!init) {
            cudaCheck(cudaFuncSetAttribute(gemv_xs_kernel<F, 4, 4, 1, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GEMV_XS_SMEM_MAX));
            init = true;
        }
        launch_k(gemv_xs_kernel<F, 4, 4, 1, 4>, (unsigned)CEIL_DIV(a.w.rows, (int64_t)64), 4 * 4 * 32, gemv_xs_smem<F>(4, 4, xsb, 4), stream, a);
    }
}
// variants 15-19: the ring kernel in the form RT, PG, NS, with the matrix's warp split
template <int F, int RT, int PG, int NS>
static void gemv_ring_launch(const GemvArgs& a, cudaStream_t stream) {
    using namespace gemv_dev;
    static int major = -1;
    if (major < 0) { int dev = 0; cudaCheck(cudaGetDevice(&dev)); cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev)); }
    g_ring_ok = major >= 9;
    if (F == FMT_BF16 || !ring_ok(a.w)) { gemv_launch<F>(GEMV_XS_4X4, a, stream); return; }
    if constexpr (F != FMT_BF16) {
        const GemvKernel k = gemv_pick(a.w);
        auto go = [&](auto nw) {
            constexpr int NW = decltype(nw)::value;
            static bool init = false;
            if (!init) { ring_init_one<F, NW, RT, PG, NS>(); init = true; }
            const GemvXpIn in = gemv_xp_prep<F, NW>(a, stream, false, false);
            ring_go<F, NW, RT, PG, NS>(a, in, stream);
        };
        if (k == GEMV_XS_8X3 || k == GEMV_XS_8X3_4) go(std::integral_constant<int, 8>());
        else go(std::integral_constant<int, 4>());
    }
}
template <int F>
static void gemv_launch_variant(int variant, const GemvArgs& a, cudaStream_t stream) {
    const unsigned t1 = (unsigned)CEIL_DIV(a.w.rows, (int64_t)16), t2 = (unsigned)CEIL_DIV(a.w.rows, (int64_t)32);
    switch (variant) {
        case 0: launch_k(gemv_kernel<F, 8, 2, 3>, t1, 8 * 32, 0, stream, a); break;
        case 1: launch_k(gemv_kernel<F, 8, 4, 2>, t1, 8 * 32, 0, stream, a); break;
        case 2: gemv_launch<F>(GEMV_REGISTER, a, stream); break;
        case 3: launch_k(gemv_dev::gemv_kernel<F, 8, 2, 2, true, 2>, t2, 8 * 32, 0, stream, a); break;
        case 4: launch_k(gemv_dev::gemv_kernel<F, 8, 2, 1, false, 3>, t1, 8 * 32, 0, stream, a); break;
        case 5: launch_k(gemv_kernel<F, 32, 2, 1>, t1, 32 * 32, 0, stream, a); break;
        case 6:
            if (F == FMT_BF16 || !gemv_async_ok(a.w)) { gemv_launch<F>(GEMV_REGISTER, a, stream); break; }
            if constexpr (F != FMT_BF16) launch_k(gemv_async_kernel<F, 4, 4, 8>, t1, 4 * 32, 0, stream, a);
            break;
        case 7: gemv_launch<F>(GEMV_ASYNC, a, stream); break;
        case 8: gemv_launch<F>(GEMV_XS_8X3, a, stream); break;
        case 9: gemv_launch<F>(GEMV_XS_4X4, a, stream); break;
        case 10: gemv_xs_dev_launch<F, 16, 3, 2>(a, stream); break;
        case 11: gemv_xs_dev_launch<F, 16, 2, 2>(a, stream); break;
        case 12: gemv_xs_dev_launch<F, 8, 4, 3>(a, stream); break;
        case 13: gemv_launch<F>(GEMV_XS_8X3_4, a, stream); break;
        case 14: gemv_xs_r4_launch<F>(a, stream); break;
        case 15: gemv_ring_launch<F, 2, 16, 4>(a, stream); break;
        case 16: gemv_ring_launch<F, 1, 16, 4>(a, stream); break;
        case 17: gemv_ring_launch<F, 2, 16, 3>(a, stream); break;
        case 18: gemv_ring_launch<F, 2, 32, 3>(a, stream); break;
        case 19: gemv_ring_launch<F, 4, 16, 3>(a, stream); break;
        default: CHECK(false, "gemv variant %d", variant);
    }
    cudaCheck(cudaGetLastError());
}

// gemv() with the kernel given by its variant number (-1: gemv()'s own pick)
static void gemv_variant(int variant, const Mat& w, const bf16_t* x, int ldx, int C, void* y, int ldy, bool y_f32,
                         const bf16_t* resid, int ldr, cudaStream_t stream, GemvX xt = GemvX()) {
    if (variant < 0) { gemv(w, x, ldx, C, y, ldy, y_f32, resid, ldr, stream, xt); return; }
    CHECK(xt.mode != GEMV_X_GATED, "gemv: the gated norm is the wide kernel's prep's (variant %d)", variant);
    CHECK(xt.mode == GEMV_X_PLAIN || (variant >= 8 && gemv_fusable(w)),
          "gemv: an x transform needs the x-staged kernel (variant %d, %s, k %lld)", variant, format_name(w.format), (long long)w.cols);
    const int cols = variant == 8 ? gemv_launch_cols(w, GEMV_XS_8X3) : variant == 9 ? gemv_launch_cols(w, GEMV_XS_4X4)
                   : variant == 13 ? gemv_launch_cols(w, GEMV_XS_8X3_4) : variant == 14 ? gemv_xs_r4_cols(w) : GEMV_MAX_COLS;
    gemv_each_chunk(w, x, ldx, C, y, ldy, y_f32, resid, ldr, xt, cols, [&](const GemvArgs& a) {
        switch (w.format) {
            case FMT_Q4: gemv_launch_variant<FMT_Q4>(variant, a, stream); break;
            case FMT_Q5: gemv_launch_variant<FMT_Q5>(variant, a, stream); break;
            case FMT_Q6: gemv_launch_variant<FMT_Q6>(variant, a, stream); break;
            case FMT_W8: gemv_launch_variant<FMT_W8>(variant, a, stream); break;
            case FMT_BF16: gemv_launch_variant<FMT_BF16>(variant, a, stream); break;
            default: CHECK(false, "gemv: unsupported weight format %s", format_name(w.format));
        }
    });
}

// ---- the wide kernel's versions (gemv_xp_kernel: several columns a launch, ninfer.cu 7.2) ----
// the product's two kernels (gemv_xp_kernel; gemv_xp_pf_kernel, the x prefetched a group ahead)
// in forms and plans its launcher does not take. the arithmetic is the product's, operation for
// operation, so their columns are the product's bits (Gemv.WideVersionsEqualTheProduct);
// Bench.DISABLED_GemvWideVersions times them.
namespace gemv_dev {
// the product's wide forms (gemv_xp_launch: NT tiles, RW row tiles a warp, S stages) as a tag
// go(Form<NT, RW, S>()), for a version's launcher to instantiate its kernel with plan p's form;
// NT 8 only with one row tile, 4 row tiles with NT 4 only (what gemv_xp_plan gives)
template <int NT_, int RW_, int S_> struct Form { static constexpr int NT = NT_, RW = RW_, S = S_; };
template <typename Go>
static void gemv_xp_forms(const GemvXpPlan& p, Go go) {
    if (p.rw == 4) {
        go(Form<4, 4, 3>());
    } else if (p.rw == 2) {
        switch (p.NT) {
            case 1: go(Form<1, 2, 3>()); break;
            case 2: go(Form<2, 2, 3>()); break;
            default: go(Form<4, 2, 3>()); break;
        }
    } else {
        switch (p.NT) {
            case 1: go(Form<1, 1, 4>()); break;
            case 2: go(Form<2, 1, 4>()); break;
            case 4: go(Form<4, 1, 4>()); break;
            default: go(Form<8, 1, 4>()); break;
        }
    }
}
// one launch of gemv_xp_kernel (PF false) or gemv_xp_pf_kernel (PF true) in the form NT, RW, S,
// its shared memory set at its first launch
template <int F, int NW, int NT, int RW, int S, bool PF>
static void gemv_xp_dev_go(unsigned grid, const GemvArgs& a, const GemvXpIn& in, int cg, int groups, cudaStream_t stream) {
    auto k = PF ? gemv_xp_pf_kernel<F, NW, NT, RW, S, GemvXpMinb<NW, NT, RW>::v> : gemv_xp_kernel<F, NW, NT, RW, S, GemvXpMinb<NW, NT, RW>::v>;
    static bool init = false;
    if (!init) {
        cudaCheck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gemv_xp_smem<F, NW, NT, RW, S>()));
        init = true;
    }
    launch_k(k, grid, NW * 32, gemv_xp_smem<F, NW, NT, RW, S>(), stream, a, in.xp, in.xps, in.cp, cg, groups);
}
// gemv_xp_launch's prep and plan with one kernel in every form: gemv_xp_pf_kernel (pf, version
// 1: also where the product does not take it) or gemv_xp_kernel (version 7: no prefetch, the
// baseline the product's choice was measured against)
template <int F, int NW>
static void gemv_xp_pf_launch(const GemvArgs& a, cudaStream_t stream, bool pf) {
    const GemvXpIn in = gemv_xp_prep<F, NW>(a, stream, false, false);
    const GemvXpPlan p = gemv_xp_plan(a, g_gemv_xp_cols, 1);
    auto go = [&](auto kernel_tag) {
        using K = decltype(kernel_tag);
        if (pf) gemv_xp_dev_go<F, NW, K::NT, K::RW, K::S, true>(p.grid, a, in, p.cc, p.groups, stream);
        else gemv_xp_dev_go<F, NW, K::NT, K::RW, K::S, false>(p.grid, a, in, p.cc, p.groups, stream);
    };
    gemv_xp_forms(p, go);
    cudaCheck(cudaGetLastError());
}

// version 2, x shared in shared memory: blocks of R row sets of the product's warp set (R x NW
// warps, warp (w, r): split w of k for row set r, 1 block an sm at the accumulators' ~255
// registers, the same 8 warps an sm as the product's 2 blocks of 4). the R warps of split w
// read the same x groups, so they copy each stage's x (the column group's b words and sums,
// as laid out in the prepared buffer) into shared memory together, cp.async in the stages the
// weights take, and meet on a named barrier (1 + w) per stage: the x read from l2 once per R
// row sets instead of once per warp. at C = 64 the product's x reads (4 KB a group a warp for
// 32 columns, 4x the q4 weights') are ~80% of its l2 traffic. the arithmetic is the product's.
// only NW = 4 (the 9b's split) and up to 4 column tiles; other shapes run the product.
// the wait counts: the prologue commits S - 1 weight groups, then one group of their x (the x
// is the previous kernel's output: after pdl_entry); iteration 0 waits for all of them, and
// from then on each iteration's group is one stage, weights and x, as the product's.
template <int F, int NT, int RW, int S> struct GemvSxLayout {
    static constexpr int NW = 4, R = 2, D = 2;
    static constexpr int XQ = NT * 8 * (gemv_xs_words(F) / 4) * 4;  // uint4 of b words a group (cg = NT * 8 columns)
    static constexpr int XG = XQ * 16 + NT * 8 * 4;                 // bytes a group: the b words, then the sums
    static constexpr size_t W_BYTES = (size_t)NW * R * S * RW * GemvAsyncLayout<F>::BYTES;
    static constexpr size_t X_BYTES = (size_t)NW * S * D * XG;
    static constexpr size_t RED = (size_t)R * RW * NW * NT * 32 * 16;
    static constexpr size_t SMEM = W_BYTES + X_BYTES > RED ? W_BYTES + X_BYTES : RED;
};
template <int F, int NT, int RW, int S>
__global__ void __launch_bounds__(4 * 2 * 32, 1) gemv_xp_sx_kernel(GemvArgs a, const uint4* __restrict__ xp, const float* __restrict__ xps,
                                                                    int cp, int cg, int groups) {
    using Lx = GemvSxLayout<F, NT, RW, S>;
    constexpr int NW = Lx::NW, R = Lx::R, D = Lx::D;
    const int64_t bset = blockIdx.x / groups;
    const int c0 = (int)(blockIdx.x % groups) * cg;
    a.y = a.y_f32 ? (void*)((float*)a.y + (int64_t)c0 * a.ldy) : (void*)((bf16_t*)a.y + (int64_t)c0 * a.ldy);
    if (a.resid) a.resid += (int64_t)c0 * a.ldr;
    a.C = a.C - c0 < cg ? a.C - c0 : cg;
    if (a.C <= 0) return;
    using Fm = GemvFmt<F>;
    using Ly = GemvAsyncLayout<F>;
    constexpr int W = gemv_xs_words(F), NQ4 = W / 4, SB = RW * Ly::BYTES;
    const int wi = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int warp = wi % NW, rs = wi / NW;  // the k split, the row set
    const Mat& w = a.w;
    const int64_t rows = w.rows;
    const int units = (int)w.gpr, C = a.C;
    const int64_t row0 = (bset * R + rs) * RW * 16;
    extern __shared__ __align__(16) uint8_t sx_smem[];
    uint8_t* sm_w = sx_smem + (size_t)wi * S * SB;
    uint8_t* sm_x = sx_smem + Lx::W_BYTES + (size_t)warp * S * D * Lx::XG;  // the split's x stages
    XpWeights<F, NW, RW, S> ws(w, row0, warp, lane, sm_w);
    const uint32_t xbase = (uint32_t)__cvta_generic_to_shared(sm_x);
    const int n_it = warp * D < units ? (units - warp * D + NW * D - 1) / (NW * D) : 0;
    // the x copies of a stage, shared by the split's R warps: the column group's columns that
    // lie inside the buffer (cp - c0 of them at most; the others are dead columns, never stored)
    const int xcols = min(cg, cp - c0), xq = xcols * NQ4 * 4, xs4 = xcols / 4, tid = rs * 32 + lane;
    uint32_t xslot = 0;
    int ui = warp * D;  // the first group of the next stage whose x is to issue
    auto issue_w = [&]() { ws.issue(); };
    auto issue_x = [&]() {
#pragma unroll
        for (int d = 0; d < D; d++) {
            const uint4* xsrc = xp + ((size_t)(ui + d) * cp + c0) * NQ4 * 4;
            const float* ssrc = xps + (size_t)(ui + d) * cp + c0;
            const uint32_t xd = xbase + xslot + d * Lx::XG;
            for (int i = tid; i < xq + xs4; i += R * 32) {
                if (i < xq) cp_async16(xd + i * 16, xsrc + i);
                else cp_async16(xd + Lx::XQ * 16 + (i - xq) * 16, ssrc + (i - xq) * 4);
            }
        }
        xslot = xslot + D * Lx::XG == S * D * Lx::XG ? 0 : xslot + D * Lx::XG;
        ui += NW * D;
    };
    // the first stages' weights before the wait (as the product), their x after it in one more
    // group: the first stage waits for everything, the later ones as the product's
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < n_it) issue_w();
        cp_async_commit();
    }
    pdl_entry();
#pragma unroll
    for (int s = 0; s < S - 1; s++)
        if (s < n_it) issue_x();
    cp_async_commit();
    float acc[RW][NT][4];
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[r][nt][0] = acc[r][nt][1] = acc[r][nt][2] = acc[r][nt][3] = 0.f;
    uint32_t rslot = 0, rxslot = 0;
    for (int it = 0; it < n_it; it++) {
        if (it == 0) cp_async_wait<0>();
        else cp_async_wait<S - 2>();
        bar_named(1 + warp, R * 32);  // the split's copies of this stage landed; every warp of it is past stage it - 1
        const uint8_t* st = sm_w + rslot;
        const uint8_t* sxg = sm_x + rxslot;
        rslot = rslot + SB == S * SB ? 0 : rslot + SB;
        rxslot = rxslot + D * Lx::XG == S * D * Lx::XG ? 0 : rxslot + D * Lx::XG;
        if (it + S - 1 < n_it) { issue_w(); issue_x(); }
        cp_async_commit();
#pragma unroll
        for (int d = 0; d < D; d++) {
            const uint4* xu = (const uint4*)(sxg + d * Lx::XG) + (size_t)g * NQ4 * 4 + t;
            const float* su = (const float*)(sxg + d * Lx::XG + Lx::XQ * 16) + 2 * t;
            uint32_t A[RW][GemvWideA<F>::N][4];
            float s0[RW], s1[RW];
#pragma unroll
            for (int r = 0; r < RW; r++) {
                uint32_t raw[2][Fm::RAW];
                gemv_stage_group<F>(raw, st + r * Ly::BYTES, d, g, t);
                gemv_afrag<F>(raw, A[r]);
                s0[r] = f16bits2f(raw[0][3]); s1[r] = f16bits2f(raw[1][3]);
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint4 v[NQ4];
                const bool live = nt * 8 + g < C;
#pragma unroll
                for (int q = 0; q < NQ4; q++) v[q] = live ? xu[(size_t)nt * 8 * NQ4 * 4 + q * 4] : make_uint4(0, 0, 0, 0);
                const float2 sv = nt * 8 + 2 * t < C ? *(const float2*)(su + nt * 8) : make_float2(0.f, 0.f);
                const float sx[4] = {sv.x, sv.y, sv.x, sv.y};
                uint32_t b[Fm::STEPS][2];
#pragma unroll
                for (int q = 0; q < NQ4; q++) {
                    b[2 * q][0] = v[q].x; b[2 * q][1] = v[q].y;
                    if (2 * q + 1 < Fm::STEPS) { b[2 * q + 1][0] = v[q].z; b[2 * q + 1][1] = v[q].w; }
                }
#pragma unroll
                for (int r = 0; r < RW; r++) gemv_tile<F>(A[r], s0[r], s1[r], acc[r][nt], b, sx);
            }
        }
    }
    pdl_release();
    cp_async_wait<0>();
    __syncthreads();
    float4* red = (float4*)sx_smem;  // [R][RW][NW][NT][32]
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            red[(((size_t)(rs * RW + r) * NW + warp) * NT + nt) * 32 + lane] = make_float4(acc[r][nt][0], acc[r][nt][1], acc[r][nt][2], acc[r][nt][3]);
    __syncthreads();
    for (int idx = threadIdx.x; idx < R * RW * NT * 128; idx += blockDim.x) {
        const int i = idx / (NT * 128), nt = (idx >> 7) % NT, ln = (idx >> 2) & 31, j = idx & 3;  // i: row set x tile
        float sum = 0.f;
#pragma unroll
        for (int v = 0; v < NW; v++) sum += ((const float*)&red[(((size_t)i * NW + v) * NT + nt) * 32 + ln])[j];
        const int64_t row = bset * R * RW * 16 + 16 * i + (ln >> 2) + (j >= 2 ? 8 : 0);
        const int col = nt * 8 + 2 * (ln & 3) + (j & 1);
        if (row < rows && col < C) gemv_store(a, row, col, sum);
    }
}
template <int F, int NT, int RW, int S>
static void gemv_xp_sx_go(unsigned grid, const GemvArgs& a, const uint4* xp, const float* xps, int cp, int cg, int groups, cudaStream_t stream) {
    using Lx = GemvSxLayout<F, NT, RW, S>;
    static_assert(Lx::SMEM <= 227 * 1024, "version 2's shared memory");
    auto k = gemv_xp_sx_kernel<F, NT, RW, S>;
    static bool init = false;
    if (!init) {
        cudaCheck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Lx::SMEM));
        init = true;
    }
    launch_k(k, grid, Lx::NW * Lx::R * 32, Lx::SMEM, stream, a, xp, xps, cp, cg, groups);
}
// gemv_xp_launch's prep and plan with version 2's blocks (2 row sets of RW tiles, at most 32
// columns); false where version 2 does not apply (8 warps a tile): the caller runs the product
template <int F, int NW>
static bool gemv_xp_sx_launch(const GemvArgs& a, cudaStream_t stream) {
    if (NW != 4) return false;
    const GemvXpIn in = gemv_xp_prep<F, NW>(a, stream, false, false);
    const GemvXpPlan p = gemv_xp_plan(a, std::min(g_gemv_xp_cols, 32), 2, false);  // its kernel has 2 row tiles a warp at most
    auto go = [&](auto kernel_tag) {
        using K = decltype(kernel_tag);
        if constexpr (K::NT <= 4 && K::RW <= 2) gemv_xp_sx_go<F, K::NT, K::RW, K::S>(p.grid, a, in.xp, in.xps, in.cp, p.cc, p.groups, stream);
    };
    gemv_xp_forms(p, go);
    cudaCheck(cudaGetLastError());
    return true;
}

// versions 3..6, more rows a warp: the product's kernel (gemv_xp_kernel, the same bits) in
// forms its plan does not take. the x words a warp loads serve RW row tiles, so the x traffic
// (the rows / (16 RW) row sets each loading all the columns' x from l1 / l2) falls with RW:
// v3 RW 2 up to 64 columns a block (NT 8), v4 RW 4 up to 32, v5 v4 with column groups split
// only below 96 blocks (v3, v4: the product's 132)
// v6 v5's form with version 1's kernel (the x prefetched)
struct XpRowsForm { int rw, most, blocks; bool pf; };
static const XpRowsForm kXpRowsForms[] = {{2, 64, 132, false}, {4, 32, 132, false}, {4, 32, 96, false}, {4, 32, 96, true}};
template <int F, int NW, int RW, bool PF>
static void gemv_xp_rows_launch(const GemvArgs& a, const XpRowsForm& f, cudaStream_t stream) {
    const GemvXpIn in = gemv_xp_prep<F, NW>(a, stream, false, false);
    const int64_t sets = CEIL_DIV(CEIL_DIV(a.w.rows, (int64_t)16), (int64_t)RW);
    int groups = 0, cc = 0;
    auto split = [&](int m) { groups = CEIL_DIV(a.C, m); cc = CEIL_DIV(CEIL_DIV(a.C, groups), 8) * 8; groups = CEIL_DIV(a.C, cc); };
    split(f.most);
    while (sets * groups < f.blocks && cc > 8) split(cc / 2);
    const unsigned grid = (unsigned)(sets * groups);
    if (cc <= 8) gemv_xp_dev_go<F, NW, 1, RW, 3, PF>(grid, a, in, cc, groups, stream);
    else if (cc <= 16) gemv_xp_dev_go<F, NW, 2, RW, 3, PF>(grid, a, in, cc, groups, stream);
    else if (cc <= 32) gemv_xp_dev_go<F, NW, 4, RW, 3, PF>(grid, a, in, cc, groups, stream);
    else if constexpr (RW == 2) gemv_xp_dev_go<F, NW, 8, RW, 3, PF>(grid, a, in, cc, groups, stream);
    else CHECK(false, "wide gemv: %d columns a block with %d row tiles a warp", cc, RW);
    cudaCheck(cudaGetLastError());
}
template <int F, int NW>
static void gemv_xp_rows(const GemvArgs& a, int v, cudaStream_t stream) {
    const XpRowsForm& f = kXpRowsForms[v - 3];
    if (f.rw == 2) gemv_xp_rows_launch<F, NW, 2, false>(a, f, stream);
    else if (f.pf) gemv_xp_rows_launch<F, NW, 4, true>(a, f, stream);
    else gemv_xp_rows_launch<F, NW, 4, false>(a, f, stream);
}

// versions 8..10, persistent (issue 16, session 19): the product's kernel with a grid of at most
// the blocks an sm the occupancy allows, block b taking the work items (row set, column group)
// b, b + gridDim.x, ... in turn. each warp's weight stream runs on across its items: the stages
// of the next item are in flight while this item's last stages compute and the warps meet (the
// partial sums in shared memory of their own, two sets by item parity, so one barrier an item).
// the idea: a product of many row sets (the 9b's gate_up: 768 blocks of ~4 stages a warp, ~3
// waves) then has no ramp and drain a block. the arithmetic is the product's (its bits).
// forms: RW row tiles a warp and S stages (v8: 1, 4; v9: 2, 3; v10: 1, 6)
struct XpPersistForm { int rw, s; };
static const XpPersistForm kXpPersistForms[] = {{1, 4}, {2, 3}, {1, 6}};
template <int F, int NW, int NT, int RW, int S>
static size_t gemv_xp_persist_smem() { return (size_t)NW * S * RW * GemvAsyncLayout<F>::BYTES + 2 * (size_t)RW * NW * NT * 32 * 16; }
template <int F, int NW, int NT, int RW, int S, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) gemv_xp_persist_kernel(GemvArgs a0, const uint4* __restrict__ xp,
                                                                        const float* __restrict__ xps, int cp, int cg, int groups) {
    using Fm = GemvFmt<F>;
    using Ly = GemvAsyncLayout<F>;
    constexpr int D = 2, W = gemv_xs_words(F), NQ4 = W / 4, SB = RW * Ly::BYTES;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const Mat& w = a0.w;
    const int64_t rows = w.rows;
    const int units = (int)w.gpr;
    const int64_t items = CEIL_DIV(CEIL_DIV(rows, (int64_t)16), (int64_t)RW) * groups;
    extern __shared__ __align__(16) uint8_t ps_smem[];
    uint8_t* sm_w = ps_smem + (size_t)warp * S * SB;
    float4* red_sets = (float4*)(ps_smem + (size_t)NW * S * SB);  // [2][RW][NW][NT][32]
    const int n_it = warp * D < units ? (units - warp * D + NW * D - 1) / (NW * D) : 0;
    // the copy cursor: item ij, its stage iit (runs S - 1 stages ahead of the compute)
    int64_t ij = blockIdx.x;
    int iit = 0;
    XpWeights<F, NW, RW, S> ws(w, (ij / groups) * RW * 16, warp, lane, sm_w);
    auto issue = [&]() {
        if (ij >= items || n_it == 0) return;
        ws.issue();
        if (++iit == n_it) {
            iit = 0;
            ij += gridDim.x;
            if (ij < items) {
                XpWeights<F, NW, RW, S> nx(w, (ij / groups) * RW * 16, warp, lane, sm_w);
                nx.slot = ws.slot;
                ws = nx;
            }
        }
    };
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        issue();
        cp_async_commit();
    }
    pdl_entry();
    uint32_t rslot = 0;
    int par = 0;
    for (int64_t j = blockIdx.x; j < items; j += gridDim.x, par ^= 1) {
        const int64_t row0 = (j / groups) * RW * 16;
        const int c0 = (int)(j % groups) * cg;
        GemvArgs a = a0;
        a.y = a.y_f32 ? (void*)((float*)a.y + (int64_t)c0 * a.ldy) : (void*)((bf16_t*)a.y + (int64_t)c0 * a.ldy);
        if (a.resid) a.resid += (int64_t)c0 * a.ldr;
        a.C = a.C - c0 < cg ? a.C - c0 : cg;
        const int C = a.C;
        const uint4* xl = xp + ((size_t)(c0 + g) * NQ4) * 4 + t;
        const float* sl = xps + c0 + 2 * t;
        float acc[RW][NT][4];
#pragma unroll
        for (int r = 0; r < RW; r++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) acc[r][nt][0] = acc[r][nt][1] = acc[r][nt][2] = acc[r][nt][3] = 0.f;
        int ub = warp * D;
        for (int it = 0; it < n_it; it++, ub += NW * D) {
            cp_async_wait<S - 2>();
            __syncwarp();
            const uint8_t* st = sm_w + rslot;
            rslot = rslot + SB == S * SB ? 0 : rslot + SB;
            issue();  // into the slot stage it - 1 was read from (every lane is past it)
            cp_async_commit();
#pragma unroll
            for (int d = 0; d < D; d++) {
                const int u = ub + d;
                const uint4* xu = xl + (size_t)u * cp * NQ4 * 4;
                const float* su = sl + (size_t)u * cp;
                uint32_t A[RW][GemvWideA<F>::N][4];
                float s0[RW], s1[RW];
#pragma unroll
                for (int r = 0; r < RW; r++) {
                    uint32_t raw[2][Fm::RAW];
                    gemv_stage_group<F>(raw, st + r * Ly::BYTES, d, g, t);
                    gemv_afrag<F>(raw, A[r]);
                    s0[r] = f16bits2f(raw[0][3]); s1[r] = f16bits2f(raw[1][3]);
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    uint4 v[NQ4];
                    const bool live = nt * 8 + g < C;
#pragma unroll
                    for (int q = 0; q < NQ4; q++) v[q] = live ? __ldg(xu + (size_t)nt * 8 * NQ4 * 4 + q * 4) : make_uint4(0, 0, 0, 0);
                    const float2 sv = nt * 8 + 2 * t < C ? __ldg((const float2*)(su + nt * 8)) : make_float2(0.f, 0.f);
                    const float sx[4] = {sv.x, sv.y, sv.x, sv.y};
                    uint32_t b[Fm::STEPS][2];
#pragma unroll
                    for (int q = 0; q < NQ4; q++) {
                        b[2 * q][0] = v[q].x; b[2 * q][1] = v[q].y;
                        if (2 * q + 1 < Fm::STEPS) { b[2 * q + 1][0] = v[q].z; b[2 * q + 1][1] = v[q].w; }
                    }
#pragma unroll
                    for (int r = 0; r < RW; r++) gemv_tile<F>(A[r], s0[r], s1[r], acc[r][nt], b, sx);
                }
            }
        }
        if (j + gridDim.x >= items) pdl_release();
        // the warps meet as the product's; the other set is the next item's, so the set this
        // item writes was last read two items ago, before the barrier of the item between
        float4* red = red_sets + (size_t)par * RW * NW * NT * 32;
#pragma unroll
        for (int r = 0; r < RW; r++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                red[((size_t)(r * NW + warp) * NT + nt) * 32 + lane] = make_float4(acc[r][nt][0], acc[r][nt][1], acc[r][nt][2], acc[r][nt][3]);
        __syncthreads();
        for (int idx = threadIdx.x; idx < RW * NT * 128; idx += blockDim.x) {
            const int i = idx / (NT * 128), nt = (idx >> 7) % NT, ln = (idx >> 2) & 31, jj = idx & 3;
            float s = 0.f;
#pragma unroll
            for (int v = 0; v < NW; v++) s += ((const float*)&red[((size_t)(i * NW + v) * NT + nt) * 32 + ln])[jj];
            const int64_t row = row0 + 16 * i + (ln >> 2) + (jj >= 2 ? 8 : 0);
            const int col = nt * 8 + 2 * (ln & 3) + (jj & 1);
            if (row < rows && col < C) gemv_store(a, row, col, s);
        }
    }
    cp_async_wait<0>();
}
template <int F, int NW, int NT, int RW, int S>
static void gemv_xp_persist_go(const GemvArgs& a, const GemvXpIn& in, int cg, int groups, cudaStream_t stream) {
    constexpr int MINB = GemvXpMinb<NW, NT, RW>::v;
    auto k = gemv_xp_persist_kernel<F, NW, NT, RW, S, MINB>;
    const size_t smem = gemv_xp_persist_smem<F, NW, NT, RW, S>();
    static int per_sm = 0, nsm = 0;
    if (!per_sm) {
        cudaCheck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, NW * 32, smem));
        int dev = 0;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
        CHECK(per_sm >= 1, "persistent wide gemv: no block fits an sm");
    }
    const int64_t items = CEIL_DIV(CEIL_DIV(a.w.rows, (int64_t)16), (int64_t)RW) * groups;
    const unsigned grid = (unsigned)std::min<int64_t>(items, (int64_t)per_sm * nsm);
    launch_k(k, grid, NW * 32, smem, stream, a, in.xp, in.xps, in.cp, cg, groups);
}
// versions 8..10: the product's prep and column plan, the form's row tiles and stages; blocks
// of more than 4 column tiles (C > 32 in one group) run the product
template <int F, int NW>
static void gemv_xp_persist(const GemvArgs& a, int v, cudaStream_t stream) {
    const XpPersistForm& f = kXpPersistForms[v - 8];
    const GemvXpPlan p = gemv_xp_plan(a, std::min(g_gemv_xp_cols, 32), 1, false);
    const GemvXpIn in = gemv_xp_prep<F, NW>(a, stream, false, false);
    auto go = [&](auto nt_tag) {
        constexpr int NT = decltype(nt_tag)::value;
        if (f.rw == 2) gemv_xp_persist_go<F, NW, NT, 2, 3>(a, in, p.cc, p.groups, stream);
        else if (f.s == 6) gemv_xp_persist_go<F, NW, NT, 1, 6>(a, in, p.cc, p.groups, stream);
        else gemv_xp_persist_go<F, NW, NT, 1, 4>(a, in, p.cc, p.groups, stream);
    };
    if (p.NT == 1) go(std::integral_constant<int, 1>());
    else if (p.NT == 2) go(std::integral_constant<int, 2>());
    else go(std::integral_constant<int, 4>());
    cudaCheck(cudaGetLastError());
}

// ---- the weights re-tiled (session 24): a warp's stage as one contiguous range ----------------
// the tiled copy of a grouped matrix (k a multiple of 128: whole group pairs): chunk (16-row
// tile T, group pair j) of P bytes at (T * gpr / 2 + j) * P holds the tile's stage as
// GemvAsyncLayout packs it, without the base rows' padding: [16][64] base, [16][2 HB] high,
// [16][4] scales; rows past the end zero, the tiles rounded up to a multiple of 4 (the wide
// kernel's row tiles a warp). so a warp's stage is one contiguous P-byte copy, piece p (16
// bytes) landing at p * 16 + (p < 64 ? (p >> 2) * 16 : 256) of the padded stage.
template <int F> struct TiledFmt {
    static constexpr int HB = GemvAsyncLayout<F>::HB, P = 16 * (64 + 2 * HB + 4), NP = P / 16;
};
static int tiled_chunk_bytes(NumFormat f) { return f == FMT_Q4 ? TiledFmt<FMT_Q4>::P : f == FMT_Q5 ? TiledFmt<FMT_Q5>::P : TiledFmt<FMT_Q6>::P; }
static int64_t tiled_bytes(const Mat& w) { return CEIL_DIV(CEIL_DIV(w.rows, (int64_t)16), (int64_t)4) * 4 * (w.gpr / 2) * tiled_chunk_bytes(w.format); }
// grid (tiles rounded up, pairs): one chunk a block, byte by byte (set-up only)
__global__ void tile_mat_kernel(Mat w, uint8_t* __restrict__ dst, int P, int hb) {
    const int64_t T = blockIdx.x, j = blockIdx.y, pairs = gridDim.y;
    uint8_t* d = dst + (T * pairs + j) * P;
    for (int o = threadIdx.x; o < P; o += blockDim.x) {
        int row, c; const uint8_t* src;
        if (o < 1024) { row = o / 64; c = o % 64; src = w.base + j * 64 + c; }
        else if (o < 1024 + 32 * hb) { const int q = o - 1024; row = q / (2 * hb); c = q % (2 * hb); src = w.high + j * 2 * hb + c; }
        else { const int q = o - 1024 - 32 * hb; row = q / 4; c = q % 4; src = w.scale + j * 4 + c; }
        const int64_t r = T * 16 + row;
        const int64_t stride = o < 1024 ? w.base_row : o < 1024 + 32 * hb ? w.high_row : w.scale_row;
        d[o] = r < w.rows ? src[r * stride] : 0;
    }
}
// the tiled copy of device matrix w (q4 / q5 / q6, cols % 128 == 0) into dst (tiled_bytes(w)):
// the view keeps format, shape and gpr; base is the tiled copy, the planes' pointers are null
static Mat tile_mat(const Mat& w, uint8_t* dst, cudaStream_t stream = 0) {
    CHECK(gemv_async_ok(w) && w.format != FMT_W8, "tile_mat: a q4 / q5 / q6 matrix with k %% 128 == 0");
    const int P = tiled_chunk_bytes(w.format), hb = w.format == FMT_Q5 ? 8 : w.format == FMT_Q6 ? 16 : 0;
    const dim3 grid((unsigned)(tiled_bytes(w) / ((w.gpr / 2) * P)), (unsigned)(w.gpr / 2));
    tile_mat_kernel<<<grid, 128, 0, stream>>>(w, dst, P, hb);
    cudaCheck(cudaGetLastError());
    Mat t = w;
    t.base = dst; t.high = nullptr; t.scale = nullptr;
    t.base_row = t.high_row = t.scale_row = 0;
    return t;
}
// XpWeights over a tiled copy: the same stages in the same slots, CPL 16-byte copies a lane
// (the last one predicated) from one pointer a row tile
template <int F, int NW, int RW, int S> struct XpWeightsTiled {
    using Ly = GemvAsyncLayout<F>;
    using Tf = TiledFmt<F>;
    static constexpr int SB = RW * Ly::BYTES, CPL = (Tf::NP + 31) / 32;
    const uint8_t* src[RW];
    uint32_t base, dst[CPL], slot = 0;
    bool last;
    __device__ __forceinline__ XpWeightsTiled(const Mat& w, int64_t row0, int warp, int lane, uint8_t* sm) {
        const int64_t pairs = w.gpr / 2;
#pragma unroll
        for (int r = 0; r < RW; r++) src[r] = w.base + ((row0 / 16 + r) * pairs + warp) * Tf::P + lane * 16;
        base = (uint32_t)__cvta_generic_to_shared(sm);
#pragma unroll
        for (int i = 0; i < CPL; i++) { const int p = lane + 32 * i; dst[i] = p * 16 + (p < 64 ? (p >> 2) * 16 : 256); }
        last = lane + 32 * (CPL - 1) < Tf::NP;
    }
    __device__ __forceinline__ void issue() {
#pragma unroll
        for (int r = 0; r < RW; r++) {
            const uint32_t st = base + slot + r * Ly::BYTES;
#pragma unroll
            for (int i = 0; i < CPL; i++)
                if (i < CPL - 1 || last) cp_async16(st + dst[i], src[r] + i * 512);
            src[r] += NW * Tf::P;
        }
        slot = slot + SB == S * SB ? 0 : slot + SB;
    }
};
// the memory side alone (Bench.DISABLED_GemvPattern, session 19): the bytes the wide kernel's
// warps copy, in the same stages and waits, with no arithmetic (one word a stage kept live).
// form 0: the product's copy pattern (XpWeights: per warp and stage 16 rows x 64 base bytes,
// 16 high and 4 scale bytes a row); form 1: the same bytes of the block's 16 RW rows (one
// contiguous range a plane) copied 512 bytes a warp instruction, in stages of the same size;
// form 2: the product's pattern on a tiled copy (tile_mat: XpWeightsTiled's copies)
template <int F, int NW, int RW, int S, int FORM>
__global__ void __launch_bounds__(NW * 32, 2) gemv_pattern_kernel(Mat w, uint32_t* __restrict__ sink) {
    using Ly = GemvAsyncLayout<F>;
    constexpr int D = 2, SB = RW * Ly::BYTES;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int units = (int)w.gpr;
    const int64_t row0 = (int64_t)blockIdx.x * RW * 16;
    extern __shared__ __align__(16) uint8_t pt_smem[];
    uint8_t* sm_w = pt_smem + (size_t)warp * S * SB;
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(sm_w);
    const int n_it = warp * D < units ? (units - warp * D + NW * D - 1) / (NW * D) : 0;
    std::conditional_t<FORM == 2, XpWeightsTiled<F, NW, RW, S>, XpWeights<F, NW, RW, S>> ws(w, row0, warp, lane, sm_w);
    // form 1: the block's rows of each plane as one range, the warp's share in n_it pieces
    const int64_t nrows = min((int64_t)RW * 16, w.rows - row0);
    const int64_t pb = nrows * w.base_row, ph = w.high ? nrows * w.high_row : 0, ps = nrows * w.scale_row;
    const int64_t per_w = ((pb + ph + ps + NW - 1) / NW + 15) / 16 * 16;     // bytes a warp
    const int64_t chunk = ((per_w + (n_it > 0 ? n_it : 1) - 1) / (n_it > 0 ? n_it : 1) + 15) / 16 * 16;  // bytes a stage
    int64_t off = (int64_t)warp * per_w, end = min(off + per_w, pb + ph + ps);
    uint32_t wslot = 0;
    auto issue = [&]() {
        if constexpr (FORM != 1) { ws.issue(); return; }
        const int64_t stop = min(off + chunk, end);
        for (int64_t o = off + lane * 16, i = lane; o + 16 <= stop && i * 16 < SB; o += 512, i += 32) {
            const uint8_t* src = o < pb ? w.base + row0 * w.base_row + o
                               : o < pb + ph ? w.high + row0 * w.high_row + (o - pb) : w.scale + row0 * w.scale_row + (o - pb - ph);
            cp_async16(sbase + wslot + (uint32_t)i * 16, src);
        }
        off = stop;
        wslot = wslot + SB == S * SB ? 0 : wslot + SB;
    };
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < n_it) issue();
        cp_async_commit();
    }
    uint32_t keep = 0, rslot = 0;
    for (int it = 0; it < n_it; it++) {
        cp_async_wait<S - 2>();
        __syncwarp();
        keep ^= *(const uint32_t*)(sm_w + rslot + lane * 4);
        rslot = rslot + SB == S * SB ? 0 : rslot + SB;
        __syncwarp();
        if (it + S - 1 < n_it) issue();
        cp_async_commit();
    }
    cp_async_wait<0>();
    if (keep == 0x9e3779b9u) sink[blockIdx.x] = keep;  // never (almost): keeps the reads
}
template <int F, int NW, int RW, int S, int FORM>
static void gemv_pattern_go(const Mat& w, uint32_t* sink, cudaStream_t stream) {
    auto k = gemv_pattern_kernel<F, NW, RW, S, FORM>;
    const size_t smem = (size_t)NW * S * RW * GemvAsyncLayout<F>::BYTES;
    static bool init = false;
    if (!init) { cudaCheck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)); init = true; }
    k<<<(unsigned)CEIL_DIV(CEIL_DIV(w.rows, (int64_t)16), (int64_t)RW), NW * 32, smem, stream>>>(w, sink);
    cudaCheck(cudaGetLastError());
}
// the pattern kernel (form 0, 1, or 2 on a tiled copy) in the product's warp split for w
// (gemv_pick) and the stages of its row tiles a warp (1: 4 stages, 2: 3, as gemv_xp_launch)
template <int F>
static void gemv_pattern(const Mat& w, int form, int rw, uint32_t* sink, cudaStream_t stream) {
    const GemvKernel k = gemv_pick(w);
    const bool nw8 = k == GEMV_XS_8X3_4 || k == GEMV_XS_8X3;
    auto go = [&](auto nw_tag) {
        constexpr int NW = decltype(nw_tag)::value;
        auto by_form = [&](auto rw_tag, auto s_tag) {
            constexpr int RW = decltype(rw_tag)::value, S = decltype(s_tag)::value;
            if (form == 2) gemv_pattern_go<F, NW, RW, S, 2>(w, sink, stream);
            else if (form == 1) gemv_pattern_go<F, NW, RW, S, 1>(w, sink, stream);
            else gemv_pattern_go<F, NW, RW, S, 0>(w, sink, stream);
        };
        if (rw == 2) by_form(std::integral_constant<int, 2>(), std::integral_constant<int, 3>());
        else by_form(std::integral_constant<int, 1>(), std::integral_constant<int, 4>());
    };
    if (nw8) go(std::integral_constant<int, 8>());
    else go(std::integral_constant<int, 4>());
}

// the product's wide kernel on a tiled copy (TILED) or the matrix itself: the same arithmetic,
// the same bits (Gemv.TiledEqualsTheProduct)
template <int F, int NW, int NT, int RW, int S, int MINB, bool TILED>
__global__ void __launch_bounds__(NW * 32, MINB) gemv_xpt_kernel(GemvArgs a, const uint4* __restrict__ xp,
                                                                 const float* __restrict__ xps, int cp, int cg, int groups) {
    using WS = std::conditional_t<TILED, XpWeightsTiled<F, NW, RW, S>, XpWeights<F, NW, RW, S>>;
    if constexpr (NT == 4 && RW <= 2) gemv_xp_pf_block<F, NW, NT, RW, S, WS>(a, xp, xps, cp, cg, groups, blockIdx.x);
    else gemv_xp_block<F, NW, NT, RW, S, WS>(a, xp, xps, cp, cg, groups, blockIdx.x);
}
// minb: the blocks an sm the launch bounds ask for (0: the product's GemvXpMinb; 3 or 4 where
// that is 2: 80 or 64 registers a thread, room for a third or fourth block of 8 warps)
template <int F, int NW, bool TILED>
static void gemv_xpt_launch(const GemvArgs& a, int minb, cudaStream_t stream) {
    const GemvXpIn in = gemv_xp_prep<F, NW>(a, stream, false, false);
    const GemvXpPlan p = gemv_xp_plan(a, g_gemv_xp_cols, 1);
    gemv_xp_form(p, [&](auto nt, auto rw, auto st) {
        constexpr int NT = decltype(nt)::value, RW = decltype(rw)::value, S = decltype(st)::value;
        constexpr int MINB = GemvXpMinb<NW, NT, RW>::v;
        auto go = [&](auto mb_tag) {
            constexpr int MB = decltype(mb_tag)::value;
            auto k = gemv_xpt_kernel<F, NW, NT, RW, S, MB, TILED>;
            const size_t smem = gemv_xp_smem<F, NW, NT, RW, S>();
            static bool init = false;
            if (!init) { cudaCheck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)); init = true; }
            launch_k(k, p.grid, NW * 32, smem, stream, a, in.xp, in.xps, in.cp, p.cc, p.groups);
        };
        if constexpr (MINB == 2 && NW == 8) {
            if (minb == 3) { go(std::integral_constant<int, 3>()); return; }
            if (minb == 4) { go(std::integral_constant<int, 4>()); return; }
        }
        go(std::integral_constant<int, MINB>());
    });
    cudaCheck(cudaGetLastError());
}
// y = W x through the wide kernel (every column count, every x transform) on a tiled copy wt
// (tile_mat) or, tiled false, on the matrix itself; NW as the product's pick for the shape
static void gemv_tiled(bool tiled, const Mat& w, const bf16_t* x, int ldx, int C, void* y, int ldy, bool y_f32,
                       const bf16_t* resid, int ldr, cudaStream_t stream, GemvX xt = GemvX(), int minb = 0) {
    const GemvKernel k = gemv_pick(w);  // the shape alone
    const bool nw8 = k == GEMV_XS_8X3 || k == GEMV_XS_8X3_4;
    gemv_each_chunk(w, x, ldx, C, y, ldy, y_f32, resid, ldr, xt, GEMV_WIDE_COLS, [&](const GemvArgs& a) {
        auto go = [&](auto f_tag) {
            constexpr int F = decltype(f_tag)::value;
            if (tiled) nw8 ? gemv_xpt_launch<F, 8, true>(a, minb, stream) : gemv_xpt_launch<F, 4, true>(a, minb, stream);
            else nw8 ? gemv_xpt_launch<F, 8, false>(a, minb, stream) : gemv_xpt_launch<F, 4, false>(a, minb, stream);
        };
        switch (w.format) {
            case FMT_Q4: go(std::integral_constant<int, FMT_Q4>()); break;
            case FMT_Q5: go(std::integral_constant<int, FMT_Q5>()); break;
            default: go(std::integral_constant<int, FMT_Q6>()); break;
        }
    });
}
}  // namespace gemv_dev

static const int GEMV_WIDE_VERSIONS = 11;
// gemv() with the wide kernel of version v (0: the product's gemv(), 1: x prefetched in every
// form, 2: x shared in shared memory, 3..6: more row tiles a warp, kXpRowsForms, 7: x prefetched
// in no form) where
// gemv() takes the wide kernel; elsewhere gemv() itself
static void gemv_wide_version(int v, const Mat& w, const bf16_t* x, int ldx, int C, void* y, int ldy, bool y_f32,
                              const bf16_t* resid, int ldr, cudaStream_t stream, GemvX xt = GemvX()) {
    // the persistent versions take every column count the x-staged kernel's matrices see
    const bool persist = v >= 8 && gemv_fusable(w);
    if (v == 0 || !(persist || gemv_wide_takes(w, C, xt.mode))) { gemv(w, x, ldx, C, y, ldy, y_f32, resid, ldr, stream, xt); return; }
    CHECK(v >= 1 && v < GEMV_WIDE_VERSIONS, "wide gemv version %d", v);
    const GemvKernel k = gemv_pick(w);
    const bool nw8 = k == GEMV_XS_8X3 || k == GEMV_XS_8X3_4;
    gemv_each_chunk(w, x, ldx, C, y, ldy, y_f32, resid, ldr, xt, persist ? 32 : GEMV_WIDE_COLS, [&](const GemvArgs& a) {
        if (persist) {
            switch (w.format) {
                case FMT_Q4: nw8 ? gemv_dev::gemv_xp_persist<FMT_Q4, 8>(a, v, stream) : gemv_dev::gemv_xp_persist<FMT_Q4, 4>(a, v, stream); break;
                case FMT_Q5: nw8 ? gemv_dev::gemv_xp_persist<FMT_Q5, 8>(a, v, stream) : gemv_dev::gemv_xp_persist<FMT_Q5, 4>(a, v, stream); break;
                case FMT_Q6: nw8 ? gemv_dev::gemv_xp_persist<FMT_Q6, 8>(a, v, stream) : gemv_dev::gemv_xp_persist<FMT_Q6, 4>(a, v, stream); break;
                default: nw8 ? gemv_dev::gemv_xp_persist<FMT_W8, 8>(a, v, stream) : gemv_dev::gemv_xp_persist<FMT_W8, 4>(a, v, stream); break;
            }
            return;
        }
        if (v >= 3 && v <= 6) {
            switch (w.format) {
                case FMT_Q4: nw8 ? gemv_dev::gemv_xp_rows<FMT_Q4, 8>(a, v, stream) : gemv_dev::gemv_xp_rows<FMT_Q4, 4>(a, v, stream); break;
                case FMT_Q5: nw8 ? gemv_dev::gemv_xp_rows<FMT_Q5, 8>(a, v, stream) : gemv_dev::gemv_xp_rows<FMT_Q5, 4>(a, v, stream); break;
                case FMT_Q6: nw8 ? gemv_dev::gemv_xp_rows<FMT_Q6, 8>(a, v, stream) : gemv_dev::gemv_xp_rows<FMT_Q6, 4>(a, v, stream); break;
                default: nw8 ? gemv_dev::gemv_xp_rows<FMT_W8, 8>(a, v, stream) : gemv_dev::gemv_xp_rows<FMT_W8, 4>(a, v, stream); break;
            }
            return;
        }
        if (v == 2) {
            bool ran;
            switch (w.format) {
                case FMT_Q4: ran = !nw8 && gemv_dev::gemv_xp_sx_launch<FMT_Q4, 4>(a, stream); break;
                case FMT_Q5: ran = !nw8 && gemv_dev::gemv_xp_sx_launch<FMT_Q5, 4>(a, stream); break;
                case FMT_Q6: ran = !nw8 && gemv_dev::gemv_xp_sx_launch<FMT_Q6, 4>(a, stream); break;
                default: ran = !nw8 && gemv_dev::gemv_xp_sx_launch<FMT_W8, 4>(a, stream); break;
            }
            if (ran) return;
            GemvArgs b = a;  // the product's kernel for what version 2 does not take
            gemv(b.w, b.x, b.ldx, b.C, b.y, b.ldy, b.y_f32, b.resid, b.ldr, stream, GemvX{b.xmode, b.xw, b.eps});
            return;
        }
        const bool pf = v == 1;
        switch (w.format) {
            case FMT_Q4: nw8 ? gemv_dev::gemv_xp_pf_launch<FMT_Q4, 8>(a, stream, pf) : gemv_dev::gemv_xp_pf_launch<FMT_Q4, 4>(a, stream, pf); break;
            case FMT_Q5: nw8 ? gemv_dev::gemv_xp_pf_launch<FMT_Q5, 8>(a, stream, pf) : gemv_dev::gemv_xp_pf_launch<FMT_Q5, 4>(a, stream, pf); break;
            case FMT_Q6: nw8 ? gemv_dev::gemv_xp_pf_launch<FMT_Q6, 8>(a, stream, pf) : gemv_dev::gemv_xp_pf_launch<FMT_Q6, 4>(a, stream, pf); break;
            default: nw8 ? gemv_dev::gemv_xp_pf_launch<FMT_W8, 8>(a, stream, pf) : gemv_dev::gemv_xp_pf_launch<FMT_W8, 4>(a, stream, pf); break;
        }
    });
}

// ---- the separate attention-input kernels (attn_prep fuses them) ----------------------------

struct RopeArgs {
    bf16_t* x; int ldx;
    int T, nheads, head_dim, half;  // half = rot / 2 (32)
    const int* pos;
    int sec_h, sec_w;               // mrope_section[1], [2]
    float inv_freq[64];
};
__global__ void mrope_kernel(RopeArgs a) {
    pdl_entry_small();
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
static void mrope(bf16_t* x, int ldx, int T, int nheads, int head_dim, int rot, const int* pos, float theta,
                  const int sections[3], cudaStream_t stream) {
    CHECK(rot % 2 == 0 && rot <= 128 && rot <= head_dim, "mrope: bad rotary dim %d", rot);
    RopeArgs a;
    a.x = x; a.ldx = ldx; a.T = T; a.nheads = nheads; a.head_dim = head_dim; a.half = rot / 2; a.pos = pos;
    a.sec_h = sections[1]; a.sec_w = sections[2];
    rope_inv_freq(theta, rot, a.inv_freq);
    int64_t n = (int64_t)T * nheads * a.half;
    launch_k(mrope_kernel, (unsigned)CEIL_DIV(n, (int64_t)EW_THREADS), EW_THREADS, 0, stream, a);
    cudaCheck(cudaGetLastError());
}

// quantizing append: block = (column, kv head), thread = dim; a group of 64 is two warps
template <int KV>
__global__ void __launch_bounds__(ATT_HD) kv_append_q_kernel(const bf16_t* __restrict__ k, int ldk, const bf16_t* __restrict__ v, int ldv,
                                                             void* kc, void* vc, __half* ksc, __half* vsc, int64_t cap,
                                                             const int* __restrict__ pos, int Hkv) {
    pdl_entry_small();
    const int c = blockIdx.x / Hkv, h = blockIdx.x % Hkv, d = threadIdx.x, warp = d >> 5;
    __shared__ float wmax[2][ATT_HD / 32];
    const int64_t p = pos[c];
    if (p < 0 || p >= cap) return;  // the whole block returns together
    const float xk = bf2f(k[(int64_t)c * ldk + h * ATT_HD + d]), xv = bf2f(v[(int64_t)c * ldv + h * ATT_HD + d]);
    float mk = warp_max(fabsf(xk)), mv = warp_max(fabsf(xv));
    if ((d & 31) == 0) { wmax[0][warp] = mk; wmax[1][warp] = mv; }
    __syncthreads();
    const int gw = (d / KV_GROUP) * 2;  // the group's two warps
    mk = fmaxf(wmax[0][gw], wmax[0][gw + 1]);
    mv = fmaxf(wmax[1][gw], wmax[1][gw + 1]);
    const float qmax = KV == KV_INT8 ? 127.f : 448.f;
    const __half hk = __float2half_rn(mk / qmax), hv = __float2half_rn(mv / qmax);
    const float sk = __half2float(hk), sv = __half2float(hv);
    const float ik = sk > 0.f ? 1.f / sk : 0.f, iv = sv > 0.f ? 1.f / sv : 0.f;
    const int64_t row = (int64_t)h * cap + p;
    if constexpr (KV == KV_INT8) {
        ((int8_t*)kc)[row * ATT_HD + d] = (int8_t)fminf(fmaxf(rintf(xk * ik), -127.f), 127.f);
        ((int8_t*)vc)[row * ATT_HD + d] = (int8_t)fminf(fmaxf(rintf(xv * iv), -127.f), 127.f);
    } else {
        ((uint8_t*)kc)[row * ATT_HD + d] = (uint8_t)__nv_cvt_float_to_fp8(xk * ik, __NV_SATFINITE, __NV_E4M3);
        ((uint8_t*)vc)[row * ATT_HD + d] = (uint8_t)__nv_cvt_float_to_fp8(xv * iv, __NV_SATFINITE, __NV_E4M3);
    }
    if (d % KV_GROUP == 0) { ksc[row * KV_GROUPS + d / KV_GROUP] = hk; vsc[row * KV_GROUPS + d / KV_GROUP] = hv; }
}

__global__ void kv_append_kernel(const bf16_t* __restrict__ k, int ldk, const bf16_t* __restrict__ v, int ldv, bf16_t* kc,
                                 bf16_t* vc, int64_t cap, const int* __restrict__ pos, int Hkv) {
    pdl_entry_small();
    int c = blockIdx.x / Hkv, h = blockIdx.x % Hkv, d = threadIdx.x;
    int64_t p = pos[c];
    if (p < 0 || p >= cap) return;
    kc[((int64_t)h * cap + p) * ATT_HD + d] = k[(int64_t)c * ldk + h * ATT_HD + d];
    vc[((int64_t)h * cap + p) * ATT_HD + d] = v[(int64_t)c * ldv + h * ATT_HD + d];
}
// k and v of C columns (head h at k + c*ldk + h*256) into the cache rows pos[c]: bf16 copies,
// int8 / fp8 quantized per 64 elements.
struct KvAppendArgs {
    const bf16_t* k = nullptr; int ldk = 0;
    const bf16_t* v = nullptr; int ldv = 0;
    KvCache c;
    const int* pos = nullptr;  // [C] device
    int C = 0, Hkv = 0;
};
static void kv_append(const KvAppendArgs& a, cudaStream_t stream) {
    const KvCache& c = a.c;
    const unsigned blocks = (unsigned)(a.C * a.Hkv);
    if (c.kv == KV_BF16)
        launch_k(kv_append_kernel, blocks, ATT_HD, 0, stream, a.k, a.ldk, a.v, a.ldv, (bf16_t*)c.kc, (bf16_t*)c.vc, c.cap, a.pos, a.Hkv);
    else if (c.kv == KV_INT8)
        launch_k(kv_append_q_kernel<KV_INT8>, blocks, ATT_HD, 0, stream, a.k, a.ldk, a.v, a.ldv, c.kc, c.vc, c.ksc, c.vsc, c.cap, a.pos, a.Hkv);
    else launch_k(kv_append_q_kernel<KV_FP8>, blocks, ATT_HD, 0, stream, a.k, a.ldk, a.v, a.ldv, c.kc, c.vc, c.ksc, c.vsc, c.cap, a.pos, a.Hkv);
    cudaCheck(cudaGetLastError());
}

// split plan: keys per split (a multiple of ATT_KEYS) for contexts up to max_len in n_splits
static int attn_split_keys(int64_t max_len, int n_splits) {
    int64_t per = CEIL_DIV(max_len, (int64_t)n_splits);
    return (int)(CEIL_DIV(per, (int64_t)ATT_KEYS) * ATT_KEYS);
}

// ---- attention decode, version 1 (the product's until session 14; bench-notes) -------------
// thread-per-key scores over 128-key tiles, a warp's online softmax, p v on the cuda cores
// (one v row a warp load); its combine is one thread per dim over the splits in order. kept to
// time against the tensor-core kernel (Bench.DISABLED_AttnVersions). VB: v rows in flight a
// warp, KU: the score loop's unroll (the product took KU 32 for one sequence, 16 for lanes).
enum { ATT_VB = 8, ATT_KU = 8 };
// queries per warp: the block serves up to 4*QPW queries; KV: the cache format. the softmax
// of query qi is warp qi / QPW's; the p v products are split so that each v row is read once
// a block: warp w takes query group w / KS (4 queries) over key slice w % KS (keys ks, ks + KS,
// ...), and for KS > 1 the slices' sums meet in shared memory at the end (not each warp its own
// queries over every key: that read each v tile once per warp)
template <int QPW, int KV, int VB, int KU>
__global__ void __launch_bounds__(ATT_THREADS) attn_decode_v1_kernel(AttnArgs a) {
    pdl_entry_small();
    constexpr int NQ = 4 * QPW, KS = 4 / QPW;
    const int h = blockIdx.x, sp = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int qg = warp / KS, ks = warp % KS;  // the p v part's query group and key slice
    // the block's columns: all C (one sequence), or lanes: column blockIdx.z alone, with the
    // same arithmetic as a lone launch of that column (only the partials' slots differ)
    const int z = a.lanes ? (int)blockIdx.z : 0, C = a.lanes ? 1 : a.C;
    const bf16_t* qz = a.q + (int64_t)z * a.ldq;
    const int* pos = a.pos + z;
    const int* pages = a.pages ? a.pages + (int64_t)z * a.page_ld : nullptr;
    const int split_keys = a.lanes ? a.split_keys_col[z] : a.split_keys;
    const int G = a.Hq / a.Hkv, nq = G * C, nq_all = G * a.C, q_first = z * G;
    __shared__ __align__(16) float qs[NQ][ATT_HD];
    __shared__ float ps[NQ][ATT_KEYS];
    __shared__ float al[NQ];                                  // each query's rescale of this tile
    __shared__ __align__(16) float red[KS > 1 ? KS * NQ : 1][ATT_HD];  // the key slices' sums
    __shared__ int vis[NQ];
    int lmax = 0;
    for (int c = 0; c < C; c++) lmax = max(lmax, pos[c] + 1);
    for (int i = tid; i < NQ * ATT_HD; i += ATT_THREADS) {
        int qi = i / ATT_HD, d = i % ATT_HD;
        float v = 0.f;
        if (qi < nq) v = bf2f(qz[(int64_t)(qi / G) * a.ldq + (h * G + qi % G) * ATT_HD + d]) * a.scale;
        qs[qi][d] = v;
    }
    if (tid < NQ) vis[tid] = tid < nq ? pos[tid / G] : -1;
    // running softmax state of the queries this warp owns (qi = warp * QPW + k), replicated in
    // lanes; acc: the p v sums of query group qg over key slice ks, lanes over dims
    float m_run[QPW], l_run[QPW], acc[4][8];
#pragma unroll
    for (int k = 0; k < QPW; k++) { m_run[k] = -INFINITY; l_run[k] = 0.f; }
#pragma unroll
    for (int q = 0; q < 4; q++)
#pragma unroll
        for (int d = 0; d < 8; d++) acc[q][d] = 0.f;
    const int64_t hrow = (int64_t)h * a.cap;  // cache row of physical row 0 of this kv head
    const int kbeg = sp * split_keys;
    const int kend = min(kbeg + split_keys, lmax);  // empty: the partial stays m = -inf (skipped)
    __syncthreads();
    for (int k0 = kbeg; k0 < kend; k0 += ATT_KEYS) {
        const int nk = min(ATT_KEYS, kend - k0);
        const int64_t trow = hrow + kv_row(pages, k0);  // the tile's keys are consecutive rows of one page
        // (1) scores, thread = key
        {
            int key = k0 + tid;
            float sc[NQ];
#pragma unroll
            for (int q = 0; q < NQ; q++) sc[q] = 0.f;
            if (tid < nk) {
#pragma unroll KU
                for (int d8 = 0; d8 < ATT_HD / 8; d8++) {
                    KvVec<KV> raw;
                    raw.load(a.kc, a.ksc, trow + tid, d8 * 8);
                    float kf[8];
                    raw.get(kf);
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
            int qi = warp * QPW + k;
            float v0 = ps[qi][lane], v1 = ps[qi][lane + 32], v2 = ps[qi][lane + 64], v3 = ps[qi][lane + 96];
            float cm = warp_max(fmaxf(fmaxf(v0, v1), fmaxf(v2, v3)));
            float mn = fmaxf(m_run[k], cm);
            float alpha = mn == -INFINITY ? 1.f : expf(m_run[k] - mn);
            float e0 = mn == -INFINITY ? 0.f : expf(v0 - mn), e1 = mn == -INFINITY ? 0.f : expf(v1 - mn);
            float e2 = mn == -INFINITY ? 0.f : expf(v2 - mn), e3 = mn == -INFINITY ? 0.f : expf(v3 - mn);
            ps[qi][lane] = e0; ps[qi][lane + 32] = e1; ps[qi][lane + 64] = e2; ps[qi][lane + 96] = e3;
            l_run[k] = l_run[k] * alpha + warp_sum(e0 + e1 + e2 + e3);
            m_run[k] = mn;
            if (lane == 0) al[qi] = alpha;
        }
        __syncthreads();
        // (3) acc = acc * alpha + p v over the warp's key slice, lanes over dims. v rows in
        // batches of VB so that VB loads are in flight, not one
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float alpha = al[qg * 4 + q];
#pragma unroll
            for (int d = 0; d < 8; d++) acc[q][d] *= alpha;
        }
        for (int t0 = ks; t0 < nk; t0 += VB * KS) {
            KvVec<KV> raw[VB];
#pragma unroll
            for (int j = 0; j < VB; j++) {
                if (t0 + j * KS < nk) raw[j].load(a.vc, a.vsc, trow + t0 + j * KS, lane * 8);
                else raw[j].zero();
            }
#pragma unroll
            for (int j = 0; j < VB; j++) {
                const int t = t0 + j * KS;
                float vf[8];
                raw[j].get(vf);
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float p = t < nk ? ps[qg * 4 + q][t] : 0.f;
#pragma unroll
                    for (int d = 0; d < 8; d++) acc[q][d] = fmaf(p, vf[d], acc[q][d]);
                }
            }
        }
        __syncthreads();  // ps and al are rewritten by the next chunk
    }
    // the partials: query qi's p v sum (its key slices added in slice order), m and l
    if constexpr (KS > 1) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            float* r = &red[ks * NQ + qg * 4 + q][lane * 8];
            *(float4*)r = make_float4(acc[q][0], acc[q][1], acc[q][2], acc[q][3]);
            *(float4*)(r + 4) = make_float4(acc[q][4], acc[q][5], acc[q][6], acc[q][7]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int k = 0; k < QPW; k++) {
        int qi = warp * QPW + k;
        if (qi >= nq) continue;
        float o[8];
#pragma unroll
        for (int d = 0; d < 8; d++) o[d] = acc[k][d];  // KS == 1: this warp's group is its own queries
        if constexpr (KS > 1) {
#pragma unroll
            for (int d = 0; d < 8; d++) o[d] = red[qi][lane * 8 + d];
            for (int s2 = 1; s2 < KS; s2++)
#pragma unroll
                for (int d = 0; d < 8; d++) o[d] += red[s2 * NQ + qi][lane * 8 + d];
        }
        int64_t slot = ((int64_t)h * a.n_splits + sp) * nq_all + q_first + qi;
        float* pa = a.part_acc + slot * ATT_HD + lane * 8;
        *(float4*)pa = make_float4(o[0], o[1], o[2], o[3]);
        *(float4*)(pa + 4) = make_float4(o[4], o[5], o[6], o[7]);
        if (lane == 0) { a.part_ml[slot * 2] = m_run[k]; a.part_ml[slot * 2 + 1] = l_run[k]; }
    }
}

// merge the splits of column c, query head hq (block), one thread per dim
__global__ void __launch_bounds__(ATT_HD) attn_combine_v1_kernel(AttnArgs a, const bf16_t* __restrict__ gate, int ldg, bf16_t* y, int ldy) {
    pdl_entry_small();
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

template <int KV, int VB, int KU>
static void attn_decode_v1_launch(int nq, dim3 grid, const AttnArgs& a, cudaStream_t stream) {
    if (nq <= 4) launch_k(attn_decode_v1_kernel<1, KV, VB, KU>, grid, ATT_THREADS, 0, stream, a);
    else if (nq <= 8) launch_k(attn_decode_v1_kernel<2, KV, ATT_VB, ATT_KU>, grid, ATT_THREADS, 0, stream, a);
    else launch_k(attn_decode_v1_kernel<4, KV, ATT_VB, ATT_KU>, grid, ATT_THREADS, 0, stream, a);
}
// attn_decode's contract (ninfer.cu 7.6), version 1's kernels
static void attn_decode_v1(const AttnDecodeArgs& in, cudaStream_t stream) {
    auto decode = [&](int kv, int nq, dim3 grid, const AttnArgs& a, cudaStream_t s) {
        if (in.lanes) {
            if (kv == KV_INT8) attn_decode_v1_launch<KV_INT8, ATT_VB, 16>(nq, grid, a, s);
            else if (kv == KV_FP8) attn_decode_v1_launch<KV_FP8, ATT_VB, 16>(nq, grid, a, s);
            else attn_decode_v1_launch<KV_BF16, ATT_VB, 16>(nq, grid, a, s);
        } else {
            if (kv == KV_INT8) attn_decode_v1_launch<KV_INT8, ATT_VB, 32>(nq, grid, a, s);
            else if (kv == KV_FP8) attn_decode_v1_launch<KV_FP8, ATT_VB, 32>(nq, grid, a, s);
            else attn_decode_v1_launch<KV_BF16, ATT_VB, 32>(nq, grid, a, s);
        }
    };
    attn_decode_with(in, stream, decode, attn_combine_v1_kernel);
}

// ---- the wgmma prefill gemm with A from registers (sessions 16-22's product) -----------------
// a block of two warpgroups over a 128-row x 128-token tile: warpgroup w takes rows 64w..64w+63
// as wgmma's A from registers, each thread decoding its fragment's codes from the raw planes one
// group ahead of the tensor core; the x tile is B in shared memory in WR_STAGES cp.async stages
// on mbarriers. the same arithmetic as the product (each group's partial from zero over the same
// k16 steps, then acc += scale * tmp), so the same bits: Gemm.WgmmaVersionsAgree. it decodes
// every weight for 128 tokens where the product's shared A tile serves 256: 242.5 / 315 / 335
// instructions a warp a group (q4 / q5 / q6) against the product's 218 / 255 / 261 (sass,
// session 22). Bench.DISABLED_GemmVersions times it and its stage forms beside the product.
enum { WR_BM = 128, WR_BN = 128, WR_STAGES = 4, WR_AHEAD = 3 };
static constexpr size_t wr_smem_bytes(int stages) { return (size_t)stages * WR_BN * 128 + 1024; }  // + the 1024-byte alignment
// waits for the group and names its operands (d: the accumulators, a: the A fragments) in the
// wait itself: ptxas then keeps a's registers unreused and d unread until the wgmma is done (an
// empty asm fence around the wait does not reach ptxas, which reused a's registers for the
// next group's decode while the tensor core still read them)
__device__ __forceinline__ void wr_wait0_with(float* d, uint32_t* a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned 0;"
                 : WG_ACC64(d),
                   "+r"(a[0]), "+r"(a[1]), "+r"(a[2]), "+r"(a[3]), "+r"(a[4]), "+r"(a[5]), "+r"(a[6]), "+r"(a[7]), "+r"(a[8]), "+r"(a[9]), "+r"(a[10]), "+r"(a[11]), "+r"(a[12]), "+r"(a[13]), "+r"(a[14]), "+r"(a[15])
                 :: "memory");
#endif
}
// d (64 fp32: m64 x n128) = A (registers, this warp's 16 rows x k16) . B (descriptor) [+ d]
__device__ __forceinline__ void wr_mma_rs(float* d, const uint32_t* a, uint64_t db, int acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,"
        "%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,"
        "%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %69, p, 1, 1, 0;\n}\n"
        : WG_ACC64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(acc), "l"(db));
#else
    __trap();
#endif
}
// one row's raw group: 32 bytes of low codes, the high bits, the fp16 scale
template <int F> struct WrRaw { uint4 b0, b1; uint32_t h[F == FMT_Q6 ? 4 : F == FMT_Q5 ? 2 : 1]; uint32_t sc; };
template <int F>
__device__ __forceinline__ void wr_load(const Mat& w, int64_t row, int kt, WrRaw<F>& r) {
    const uint4* b = (const uint4*)(w.base + row * w.base_row + (int64_t)kt * 32);
    r.b0 = __ldg(b); r.b1 = __ldg(b + 1);
    if constexpr (F == FMT_Q5) {
        const unsigned int* h = (const unsigned int*)(w.high + row * w.high_row + (int64_t)kt * 8);
        r.h[0] = __ldg(h); r.h[1] = __ldg(h + 1);
    }
    if constexpr (F == FMT_Q6) {
        const uint2* h = (const uint2*)(w.high + row * w.high_row + (int64_t)kt * 16);
        uint2 u0 = __ldg(h), u1 = __ldg(h + 1);
        r.h[0] = u0.x; r.h[1] = u0.y; r.h[2] = u1.x; r.h[3] = u1.y;
    }
    r.sc = __ldg((const unsigned short*)(w.scale + row * w.scale_row) + kt);
}
// one row's 8 bf16x2 code pairs of this thread: pair wi holds lanes k, k+1 (k = 8 wi + 2t),
// nibbles 2t, 2t+1 of low word wi = its byte t. sel = t | (4 + t) << 8 puts byte t of the word
// at bits 0-7 and byte t of word >> 4 at bits 16-23, so one mask leaves the two low codes at
// bits 0-3 and 16-19 (prmt, lop3 and the fma a pair; q4's mask and magic in one lop3). q5's high bit of lane k is bit k & 31 of
// h[k >> 5], q6's two at bit 2k & 31 of h[2k >> 5]: after one shift by 2t (4t) a word they sit
// at constant positions. q5: two rotated masks a word put each pair's bits at bit 4 of a byte
// (a rotation: one funnel shift where a shift and a shift back took two),
// one byte of each mask a pair, and one prmt a pair moves them to bits 4 and 20, its other two
// bytes zero (prmt_z: a selector nibble of 8 + i is byte i's sign, and bit 7 of these bytes is
// clear). q6's bit pairs stay on shifts: their prmt form measured 6% slower, in a build whose
// mask was an asm lop3 that also cost q4 7% (bench-notes, session 17; not measured without it).
__device__ __forceinline__ uint32_t prmt_z(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}
template <int F>
__device__ __forceinline__ void wr_decode_row(const WrRaw<F>& r, int t, uint32_t sel, uint32_t* out) {
    const uint32_t w[8] = {r.b0.x, r.b0.y, r.b0.z, r.b0.w, r.b1.x, r.b1.y, r.b1.z, r.b1.w};
    constexpr int NH = F == FMT_Q6 ? 4 : F == FMT_Q5 ? 2 : 1;
    uint32_t hs[NH], hr[NH];  // q6: the shifted words; q5: the first and second lanes' bits at bit 4 of a byte
#pragma unroll
    for (int i = 0; i < NH; i++) {
        if constexpr (F == FMT_Q5) {  // pair m of the word: bits 2t + 8m, 2t + 8m + 1, rotated to bit 4 of byte m
            hs[i] = __funnelshift_l(r.h[i], r.h[i], (4 - 2 * t) & 31) & 0x10101010u;
            hr[i] = __funnelshift_l(r.h[i], r.h[i], (3 - 2 * t) & 31) & 0x10101010u;
        } else {
            hs[i] = F == FMT_Q6 ? r.h[i] >> (4 * t) : 0u; hr[i] = 0u;
        }
    }
#pragma unroll
    for (int wi = 0; wi < 8; wi++) {
        if constexpr (F == FMT_Q4) {  // the mask and gemm_code_pair's magic in one lop3 (ptxas made two)
            out[wi] = bf2_fma(lop3<LOP_AND_XOR>(__byte_perm(w[wi], w[wi] >> 4, sel), 0x000F000Fu, 0x43084308u), BF2(BF_ONE), BF2(BF_M136));
            continue;
        }
        uint32_t p = __byte_perm(w[wi], w[wi] >> 4, sel) & 0x000F000Fu;
        if constexpr (F == FMT_Q5) {
            const uint32_t m = wi & 3;
            p |= prmt_z(hs[wi >> 2], hr[wi >> 2], m | 0x8u << 4 | (4 + m) << 8 | 0x8u << 12);
        }
        if constexpr (F == FMT_Q6) {
            const uint32_t h = hs[wi >> 1];
            const int j = 16 * (wi & 1);
            p |= ((h >> j) & 3u) << 4 | ((h >> (j + 2)) & 3u) << 20;
        }
        out[wi] = gemm_code_pair<F>(p);
    }
}
// a thread's A fragments of one group (4 k16 steps x {row g k lo, row g+8 k lo, row g k hi, row g+8 k hi})
template <int F>
__device__ __forceinline__ void wr_decode(const WrRaw<F>& r0, const WrRaw<F>& r1, int t, uint32_t* a) {
    const uint32_t sel = (uint32_t)t | (uint32_t)(4 + t) << 8;
    uint32_t p0[8], p1[8];
    wr_decode_row<F>(r0, t, sel, p0);
    wr_decode_row<F>(r1, t, sel, p1);
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        a[4 * ks + 0] = p0[2 * ks];
        a[4 * ks + 1] = p1[2 * ks];
        a[4 * ks + 2] = p0[2 * ks + 1];
        a[4 * ks + 3] = p1[2 * ks + 1];
    }
}

// a thread's place in a wgmma gemm block: warp wi of warpgroup wg takes the 16 weight rows from
// n0 (its rows g and g + 8 clamped to the matrix: row0, row1) against tokens m0 .. m0 + WR_BN
struct WrTile {
    int tid, lane, g, t, m0, nk;
    int64_t n0, row0, row1;
};
__device__ __forceinline__ WrTile wr_tile(const GemmArgs& a) {
    WrTile p;
    p.tid = threadIdx.x; p.lane = p.tid & 31; p.g = p.lane >> 2; p.t = p.lane & 3;
    const int wg = p.tid >> 7, wi = (p.tid >> 5) & 3;
    const int64_t N = a.w.rows;
    p.m0 = blockIdx.y * WR_BN;
    p.nk = (int)(a.w.cols / 64);
    p.n0 = (int64_t)blockIdx.x * WR_BM + wg * 64 + wi * 16;
    p.row0 = p.n0 + p.g < N ? p.n0 + p.g : N - 1; p.row1 = p.n0 + p.g + 8 < N ? p.n0 + p.g + 8 : N - 1;
    return p;
}
// the thread's 4 cp.async pieces of an x group (128 tokens x 64 k, 128-byte swizzled): piece i
// is token row r = tid / 8 + 32 i, 16-byte chunk c16 = tid % 8, at r * 128 + ((c16 ^ (r & 7)) << 4)
// in the stage (r & 7 is the same for every i) from x[min(m0 + r, T - 1)][kt * 64 + c16 * 8].
// the offsets are computed once a block: built from tid each group they took ~50 instructions
// of a group's ~280 (sass, session 22). wr_check keeps T * ldx within 32 bits
struct WrXCopy { uint32_t dst; uint32_t off[4]; };
__device__ __forceinline__ WrXCopy wr_xcopy(const GemmArgs& a, const WrTile& p) {
    WrXCopy c;
    const int r = p.tid >> 3, c16 = p.tid & 7;
    c.dst = (uint32_t)(r * 128 + ((c16 ^ (r & 7)) << 4));
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int m = p.m0 + r + 32 * i < a.T ? p.m0 + r + 32 * i : a.T - 1;
        c.off[i] = (uint32_t)m * (uint32_t)a.ldx + (uint32_t)(c16 * 8);
    }
    return c;
}
__device__ __forceinline__ void wr_copy_x(const GemmArgs& a, const WrXCopy& c, uint32_t st, int kt) {
    const bf16_t* x = a.x + (int64_t)kt * 64;
#pragma unroll
    for (int i = 0; i < 4; i++) cp_async16_m(st + c.dst + i * (32 * 128), x + c.off[i]);
}
// the first group decoded into A (its row scales s0, s1) and the second group's words loaded
template <int F>
__device__ __forceinline__ void wr_first(const Mat& w, int64_t row0, int64_t row1, int nk, int t, WrRaw<F>& r0, WrRaw<F>& r1,
                                         uint32_t (&A)[16], float& s0, float& s1) {
    wr_load<F>(w, row0, 0, r0); wr_load<F>(w, row1, 0, r1);
    wr_decode<F>(r0, r1, t, A);
    s0 = f16bits2f(r0.sc); s1 = f16bits2f(r1.sc);
    wr_load<F>(w, row0, nk > 1 ? 1 : 0, r0); wr_load<F>(w, row1, nk > 1 ? 1 : 0, r1);
}
// group kt's 4 wgmmas from A on the x stage whose descriptor's low word is dlo (wg_desc_lo) into
// tmp (its partial, from zero); while they run, group kt + 1 decoded from r0, r1 into An (its
// scales n0, n1) and group kt + 2's words loaded; returns with the wgmmas done. no branch between the wgmma and its wait: ptxas then
// tracks the in-flight registers (the last steps decode and load the last group again, unused)
template <int F>
__device__ __forceinline__ void wr_group(float (&tmp)[64], uint32_t (&A)[16], uint32_t dlo, const Mat& w, int64_t row0, int64_t row1,
                                         int kt, int nk, int t, WrRaw<F>& r0, WrRaw<F>& r1, uint32_t (&An)[16], float& n0, float& n1) {
#pragma unroll
    for (int i = 0; i < 64; i++) wg_keep(tmp[i]);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ks++) wr_mma_rs(tmp, A + 4 * ks, wg_desc(dlo + ks * (32 >> 4)), ks);
    wg_commit();
    wr_decode<F>(r0, r1, t, An);
    n0 = f16bits2f(r0.sc); n1 = f16bits2f(r1.sc);
    const int kn = kt + 2 < nk ? kt + 2 : nk - 1;
    wr_load<F>(w, row0, kn, r0); wr_load<F>(w, row1, kn, r1);
    wr_wait0_with(tmp, A);
}
// S stages asked for AH groups ahead (4 / 3 measured best, session 20; the benches time others)
template <int F, int S = WR_STAGES, int AH = WR_AHEAD>
__global__ void __launch_bounds__(WG_THREADS, 1) gemm_wgmma_rs_kernel(GemmArgs a) {
    pdl_entry();
    extern __shared__ __align__(16) uint8_t wg_smem[];
    __shared__ uint64_t full[S], empty[S];
    const uint32_t sbase = (smem_u32(wg_smem) + 1023) & ~1023u;  // the 128-byte swizzle wants 1024-byte stages
    const uint32_t dlo0 = wg_desc_lo(sbase), full0 = smem_u32(full), empty0 = smem_u32(empty);  // stage s: + s * 8
    const WrTile p = wr_tile(a);
    const WrXCopy xc = wr_xcopy(a, p);
    const int nk = p.nk, t = p.t;
    if (p.tid == 0) {
        for (int s = 0; s < S; s++) { mbar_init(full0 + 8 * s, WG_THREADS); mbar_init(empty0 + 8 * s, WG_THREADS / 32); }
        mbar_init_fence();
    }
    __syncthreads();

    // stage kt: every thread's 4 pieces, counted on full[kt % S]; the stage's previous group
    // (kt - S) must be done in every warp first (empty)
    auto load_x = [&](int kt) {
        if (kt >= nk) return;
        const int s = kt % S, use = kt / S;
        if (use > 0) mbar_wait(empty0 + 8 * s, (uint32_t)((use - 1) & 1));
        wr_copy_x(a, xc, sbase + (uint32_t)s * (WR_BN * 128), kt);
        cp_async_mbar_arrive(full0 + 8 * s);
    };

    float acc[64], tmp[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = tmp[i] = 0.f;
    for (int s = 0; s < AH; s++) load_x(s);
    WrRaw<F> r0, r1;
    // two fragment sets, the loop unrolled by two: a step's wgmma reads one set while the next
    // group decodes into the other, so no instruction defines a register of the wgmma in
    // flight (a copy A = A2 at the end of the step let ptxas merge the two and serialize)
    uint32_t A0[16], A1[16];
    float sa0, sa1, sb0, sb1;  // the row scales of the groups in A0 / A1
    wr_first<F>(a.w, p.row0, p.row1, nk, t, r0, r1, A0, sa0, sa1);
    // group kt from A (scales s0, s1); group kt + 1 decoded into An (scales n0, n1)
    auto step = [&](int kt, uint32_t (&A)[16], float s0, float s1, uint32_t (&An)[16], float& n0, float& n1) {
        const int s = kt % S;
        mbar_wait(full0 + 8 * s, (uint32_t)((kt / S) & 1));
        wg_fence_proxy();  // the stage's cp.async writes (generic proxy), seen through full, before wgmma's reads (async proxy)
        wr_group<F>(tmp, A, dlo0 + (uint32_t)s * (WR_BN * 128 >> 4), a.w, p.row0, p.row1, kt, nk, t, r0, r1, An, n0, n1);
        __syncwarp();
        if (p.lane == 0) mbar_arrive(empty0 + 8 * s);  // this warp is done with stage s
        wg_accumulate(acc, tmp, s0, s1);
        load_x(kt + AH);
    };
    for (int kt = 0; kt < nk; kt += 2) {
        step(kt, A0, sa0, sa1, A1, sb0, sb1);
        if (kt + 1 < nk) step(kt + 1, A1, sb0, sb1, A0, sa0, sa1);
    }
    wg_store(a, acc, p.m0, p.n0, p.g, t);
}

// ---- the wgmma prefill gemm with one __syncthreads a group (session 16-17's product) ----------
// gemm_wgmma_rs_kernel before its stages were tracked by mbarriers: the same arithmetic (its bits
// are the product's), 4 stages asked for 3 groups ahead, both warpgroups meeting at a
// __syncthreads every group (lockstep: one's scaling fma never runs under the other's wgmma).
// Bench.DISABLED_GemmVersions times it beside the product; Gemm.WgmmaVersionsAgree checks it.
enum { WGS_STAGES = 4 };
static const size_t WGS_SMEM = wr_smem_bytes(WGS_STAGES);
template <int F>
__global__ void __launch_bounds__(WG_THREADS, 1) gemm_wgmma_sync_kernel(GemmArgs a) {
    pdl_entry();
    extern __shared__ __align__(16) uint8_t wg_smem[];
    const uint32_t sbase = (smem_u32(wg_smem) + 1023) & ~1023u;  // the 128-byte swizzle wants 1024-byte stages
    const WrTile p = wr_tile(a);
    const WrXCopy xc = wr_xcopy(a, p);
    const int nk = p.nk, t = p.t;

    auto load_x = [&](int kt) {
        if (kt < nk) wr_copy_x(a, xc, sbase + (uint32_t)(kt % WGS_STAGES) * (WR_BN * 128), kt);
        cp_async_commit_m();
    };

    float acc[64], tmp[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = tmp[i] = 0.f;
    for (int s = 0; s < WGS_STAGES - 1; s++) load_x(s);
    WrRaw<F> r0, r1;
    // two fragment sets, the loop unrolled by two: a step's wgmma reads one set while the next
    // group decodes into the other, so no instruction defines a register of the wgmma in
    // flight (a copy A = A2 at the end of the step let ptxas merge the two and serialize)
    uint32_t A0[16], A1[16];
    float sa0, sa1, sb0, sb1;  // the row scales of the groups in A0 / A1
    wr_first<F>(a.w, p.row0, p.row1, nk, t, r0, r1, A0, sa0, sa1);
    // group kt from A (scales s0, s1); group kt + 1 decoded into An (scales n0, n1)
    auto step = [&](int kt, uint32_t (&A)[16], float s0, float s1, uint32_t (&An)[16], float& n0, float& n1) {
        cp_async_wait_m<WGS_STAGES - 2>();
        wg_fence_proxy();  // this thread's cp.async writes (generic proxy) before wgmma's reads (async proxy)
        __syncthreads();   // stage kt is in for every thread; stage kt-1's reader (the last wgmma) is done
        load_x(kt + WGS_STAGES - 1);
        wr_group<F>(tmp, A, wg_desc_lo(sbase) + (uint32_t)(kt % WGS_STAGES) * (WR_BN * 128 >> 4), a.w, p.row0, p.row1, kt, nk, t, r0, r1, An,
                    n0, n1);
        wg_accumulate(acc, tmp, s0, s1);
    };
    for (int kt = 0; kt < nk; kt += 2) {
        step(kt, A0, sa0, sa1, A1, sb0, sb1);
        if (kt + 1 < nk) step(kt + 1, A1, sb0, sb1, A0, sa0, sa1);
    }
    wg_store(a, acc, p.m0, p.n0, p.g, t);
}
// the shared memory opt-in of a wgmma kernel of `smem` bytes, once each
template <typename K>
static void gemm_wgmma_optin(K k, size_t smem) {
    static std::vector<const void*> done;
    if (std::find(done.begin(), done.end(), (const void*)k) != done.end()) return;
    cudaCheck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    done.push_back((const void*)k);
}
// the register-A kernels' x offsets are 32-bit (the product's tma takes any T)
static void wr_check(int T, int ldx) {
    CHECK((int64_t)T * ldx * 2 <= UINT32_MAX, "gemm: %d rows of x at ldx %d (the register-A kernel's byte offsets are 32-bit)", T, ldx);
}
static void gemm_wgmma_sync(const Mat& w, const bf16_t* x, int ldx, int T, void* y, int ldy, bool y_f32, cudaStream_t stream) {
    wr_check(T, ldx);
    GemmArgs a{w, x, ldx, T, y, ldy, y_f32 ? 1 : 0, nullptr, 0};
    dim3 grid((unsigned)CEIL_DIV(w.rows, (int64_t)WR_BM), (unsigned)CEIL_DIV(T, WR_BN));
    auto k = w.format == FMT_Q4 ? gemm_wgmma_sync_kernel<FMT_Q4> : w.format == FMT_Q5 ? gemm_wgmma_sync_kernel<FMT_Q5> : gemm_wgmma_sync_kernel<FMT_Q6>;
    gemm_wgmma_optin(k, WGS_SMEM);
    launch_k(k, grid, dim3(WG_THREADS), WGS_SMEM, stream, a);
    cudaCheck(cudaGetLastError());
}
// the register-A kernel with S stages asked for AH groups ahead (its own form: WR_STAGES, WR_AHEAD)
template <int S, int AH>
static void gemm_wgmma_stages(const Mat& w, const bf16_t* x, int ldx, int T, void* y, int ldy, bool y_f32, cudaStream_t stream) {
    wr_check(T, ldx);
    GemmArgs a{w, x, ldx, T, y, ldy, y_f32 ? 1 : 0, nullptr, 0};
    dim3 grid((unsigned)CEIL_DIV(w.rows, (int64_t)WR_BM), (unsigned)CEIL_DIV(T, WR_BN));
    auto k = w.format == FMT_Q4 ? gemm_wgmma_rs_kernel<FMT_Q4, S, AH> : w.format == FMT_Q5 ? gemm_wgmma_rs_kernel<FMT_Q5, S, AH>
                                                                    : gemm_wgmma_rs_kernel<FMT_Q6, S, AH>;
    gemm_wgmma_optin(k, wr_smem_bytes(S));
    launch_k(k, grid, dim3(WG_THREADS), wr_smem_bytes(S), stream, a);
    cudaCheck(cudaGetLastError());
}
// the register-A kernel's stage forms the bench and the test run: (stages, ahead); 4 / 3 its own
static const int kWgStageForms[][2] = {{4, 3}, {4, 2}, {6, 4}, {8, 4}, {8, 6}};
static void gemm_wgmma_form(int i, const Mat& w, const bf16_t* x, int ldx, int T, void* y, int ldy, bool y_f32, cudaStream_t stream) {
    switch (i) {
        case 0: gemm_wgmma_stages<4, 3>(w, x, ldx, T, y, ldy, y_f32, stream); break;
        case 1: gemm_wgmma_stages<4, 2>(w, x, ldx, T, y, ldy, y_f32, stream); break;
        case 2: gemm_wgmma_stages<6, 4>(w, x, ldx, T, y, ldy, y_f32, stream); break;
        case 3: gemm_wgmma_stages<8, 4>(w, x, ldx, T, y, ldy, y_f32, stream); break;
        default: gemm_wgmma_stages<8, 6>(w, x, ldx, T, y, ldy, y_f32, stream); break;
    }
}
