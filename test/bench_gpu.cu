// bench_gpu: where a decode step's time goes on the gpu path, which ninfer-bench (the product's
// benchmark: pp / tg / pp+tg rows with tok/s, GB/s and the copy fraction) does not show: the
// bucket-0 step graph replayed back to back (device time, no host round trip), a graph of only
// the step's matrix products (the same gemv calls, fused norms and swiglu as the step makes
// them), and each kind of small kernel alone in a graph as many times as a step runs it.
//
//   build/test/bench_gpu MODEL [--kv-dtype bf16|int8|fp8] [--no-cuda-graph] [--device N]
//
// the launch knobs come from the environment as for the cli (GpuTuning: NINFER_PDL=0,
// NINFER_FORK=0, NINFER_GEMV_OCC_ROWS=N, NINFER_ATT_SPLITS=N, ...).
#define NINFER_TESTING
#include "../ninfer.cu"
#include "test_util.h"
#include <cuda_profiler_api.h>
#include <random>
#include <functional>

int main(int argc, char** argv) {
    const char* path = nullptr;
    GpuOpts o;
    o.tune = gpu_tuning_from_env();  // NINFER_PDL=0 etc., as the cli reads them
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (gpu_parse_flag(argc, argv, &i, &o)) continue;
        if (a[0] != '-' && !path) path = a;
        else { fprintf(stderr, "usage: bench_gpu MODEL [--kv-dtype T] [--no-cuda-graph] [--device N]\n"); return 1; }
    }
    if (!path) { fprintf(stderr, "bench_gpu: give a model\n"); return 1; }
    if (gpu_count() == 0) { fprintf(stderr, "bench_gpu: no gpu\n"); return 1; }
    Model m; std::string err;
    if (!model_open(&m, path, &err)) { fprintf(stderr, "bench_gpu: %s\n", err.c_str()); return 1; }
    o.max_context = 256;
    o.prefill_chunk = 64;
    o.quiet = true;
    GpuEngine* e = gpu_build(&m, o, &err);
    if (!e) { fprintf(stderr, "bench_gpu: %s\n", err.c_str()); return 1; }
    printf("config     kv %s, graphs %s, pdl %s, fork %s, gemv occupancy rows %d\n", kv_dtype_name(o.kv), o.graphs ? "on" : "off",
           g_launch_pdl ? "on" : "off", o.tune.fork ? "on" : "off", g_gemv_occ_rows);
    const Geometry& g = m.geo;
    const double bw = gpu_copy_bandwidth(e);
    printf("model      %s (%s); copy bandwidth %.0f GB/s\n", m.art.model_id.c_str(), path, bw);
    cudaEvent_t e0, e1; cudaCheck(cudaEventCreate(&e0)); cudaCheck(cudaEventCreate(&e1));
    std::mt19937_64 rng(1);
    std::vector<int> ids(64);
    for (int& id : ids) id = (int)(rng() % e->domain);
    Sampler smp; SamplerParams sp;
    sp.temperature = 0;
    sampler_build(&smp, sp, e->domain);
    // decode breakdown (bucket 0): the step graph replayed back to back (device time, no host
    // round trip), and a graph of only the step's matrix products (the same gemv calls)
    {
        gpu_reset(e);
        gpu_forward(e, ids.data(), nullptr, nullptr, 1, nullptr, false);
        gpu_decode(e, ids[1]);  // captures bucket 0's graph when graphs are on
        auto time_graph = [&](cudaGraphExec_t gx, int n) {
            cudaCheck(cudaGraphLaunch(gx, e->stream));
            cudaCheck(cudaEventRecord(e0, e->stream));
            for (int r = 0; r < n; r++) cudaCheck(cudaGraphLaunch(gx, e->stream));
            cudaCheck(cudaEventRecord(e1, e->stream));
            cudaCheck(cudaEventSynchronize(e1));
            float t; cudaCheck(cudaEventElapsedTime(&t, e0, e1));
            return t / n;
        };
        double mbytes = 0;
        cudaGraph_t gr;
        cudaCheck(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeThreadLocal));
        int kernels = 0, fused_norms = 0, fused_swiglu = 0, fused_gated = 0;
        // as the step runs them: a product that reads a norm of x (nw) or swiglu of gate_up
        // makes it while staging x where the x-staged kernel takes it (gpu_layer)
        const int LU = g.conv_dim + g.Hv * g.dv;
        auto mm = [&](const Mat& w, const Vec* nw, bool fused, bool sw = false, bool gated = false) {
            GemvX xt;
            const bf16_t* x = e->xb;
            int ldx = (int)w.cols <= g.H ? g.H : (int)w.cols;
            if (fused && gated) {
                xt.mode = GEMV_X_GATED; xt.w = (const bf16_t*)nw->p; xt.eps = g.eps; xt.z = e->u + g.conv_dim; xt.ldz = LU;
                x = e->core; ldx = (int)w.cols; fused_gated++;
            } else if (fused) {
                if (sw) { xt.mode = GEMV_X_SWIGLU; x = e->gu; ldx = 2 * g.I; fused_swiglu++; }
                else { xt.mode = GEMV_X_RMS; xt.w = (const bf16_t*)nw->p; xt.eps = g.eps; x = e->x; fused_norms++; }
            }
            linear(w, x, ldx, 1, e->logits, (int)w.rows, false, nullptr, 0, e->stream, xt);
            RowSplitGeom rg;
            mbytes += w.format == FMT_BF16 ? (double)w.rows * w.cols * 2 : (row_split_geom(w.format, w.rows, w.cols, &rg), (double)rg.bytes);
            kernels++;
        };
        for (int l = 0; l < g.L; l++) {
            const LayerWeights& lw = e->w.layers[l];
            const LayerFuse fu = gpu_layer_fuse(e, lw, 1, true);  // the decode step's choices
            if (lw.full) {
                mm(lw.attn.query_key, &lw.input_norm, fu.input_norm); mm(lw.attn.gate_value, &lw.input_norm, fu.input_norm);
                mm(lw.attn.output, nullptr, false);
            } else {
                mm(lw.gdn.query_key, &lw.input_norm, fu.input_norm); mm(lw.gdn.value_z, &lw.input_norm, fu.input_norm);
                if (e->ab[l].rows) mm(e->ab[l], nullptr, false); else { mm(lw.gdn.a_proj, nullptr, false); mm(lw.gdn.b_proj, nullptr, false); }
                mm(lw.gdn.output, &lw.gdn.norm, fu.gated, false, true);
            }
            mm(lw.gate_up, &lw.post_norm, fu.post_norm); mm(lw.down, nullptr, fu.swiglu, true);
        }
        mm(e->w.output_head, &e->w.final_norm, gpu_head_fuse(e, 1, true));
        cudaCheck(cudaStreamEndCapture(e->stream, &gr));
        cudaGraphExec_t gx;
        cudaCheck(cudaGraphInstantiate(&gx, gr, 0));
        float t_mm = time_graph(gx, 50);
        cudaCheck(cudaGraphExecDestroy(gx)); cudaCheck(cudaGraphDestroy(gr));
        if (e->graph[0]) {
            float t_step = time_graph(e->graph[0], 50);
            printf("decode     step graph %.3f ms/token on the device (%.1f tok/s without host round trips)\n", t_step, 1e3 / t_step);
        }
        printf("decode     matrices only: %d products (%d with a fused norm, %d with fused swiglu, %d with the gated norm), %.3f GB, %.3f ms (%.0f GB/s, %.1f%% of copy)\n",
               kernels, fused_norms, fused_swiglu, fused_gated, mbytes / 1e9, t_mm, mbytes / 1e9 / (t_mm * 1e-3), 100.0 * mbytes / 1e9 / (t_mm * 1e-3) / bw);
        // rmsnorm kernels left in the step: 2 per layer + the final one, less those the products
        // make themselves (a layer's input norm counts once however many products fuse it)
        int norm_kernels = 0;
        for (int l = 0; l < g.L; l++) {
            const LayerFuse fu = gpu_layer_fuse(e, e->w.layers[l], 1, true);
            norm_kernels += (!fu.input_norm || !g.full[l]) + !fu.post_norm;  // gdn: the a/b branch keeps one
        }
        norm_kernels += !gpu_head_fuse(e, 1, true);
        const int swiglu_kernels = g.L - fused_swiglu;
        // the small kernels of a step, each kind alone in a graph as many times as a step runs it
        int l_gdn = 0, l_full = 0;
        while (g.full[l_gdn]) l_gdn++;
        while (!g.full[l_full]) l_full++;
        const LayerWeights& wg = e->w.layers[l_gdn]; const LayerWeights& wf = e->w.layers[l_full];
        const int C = g.conv_dim, vd = g.Hv * g.dv, qd = g.Hq * g.head_dim, ld = qd + g.Hkv * g.head_dim;
        int ns, sk; gpu_attn_plan(0, &ns, &sk);
        struct Kind { const char* name; int count; std::function<void(cudaStream_t)> f; };
        std::vector<Kind> kinds = {
            {"rmsnorm (row of H)", norm_kernels, [&](cudaStream_t s) { rmsnorm(e->x, g.H, e->xb, g.H, (const bf16_t*)e->w.final_norm.p, g.H, 1, 1, g.eps, false, s); }},
            {"conv_step", g.n_gdn, [&](cudaStream_t s) { conv_step(e->u, LU, (const bf16_t*)wg.gdn.convolution.p, e->conv[l_gdn], e->conv_slot, e->dec.slots, e->cy, C, 1, C, s); }},
            {"gdn_step", g.n_gdn, [&](cudaStream_t s) {
                GdnStepArgs a; a.qkv = e->cy; a.ldqkv = C; a.a = e->pab; a.b = e->pab + g.Hv; a.ldab = 2 * g.Hv;
                a.a_log = (const float*)wg.gdn.a_log.p; a.dt_bias = (const float*)wg.gdn.dt_bias.p; a.state = e->rec[l_gdn];
                a.slot_stride = e->rec_slot; a.slots = e->dec.slots; a.out = e->core; a.ldo = vd; a.C = 1; a.Hk = g.Hk; a.Hv = g.Hv;
                gdn_step(a, s); }},
            {"gated_rmsnorm", g.n_gdn - fused_gated, [&](cudaStream_t s) { gated_rmsnorm(e->core, vd, e->u + C, LU, e->gn, vd, (const bf16_t*)wg.gdn.norm.p, g.dv, 1, g.Hv, g.eps, s); }},
            {"swiglu", swiglu_kernels, [&](cudaStream_t s) { swiglu(e->gu, 2 * g.I, e->hb, g.I, g.I, 1, s); }},
            {"attn_prep", g.n_full, [&](cudaStream_t s) {
                AttnPrepArgs ap;
                ap.qk = e->qk; ap.ldqk = ld; ap.v = e->gv + qd; ap.ldv = ld; ap.qw = (const bf16_t*)wf.attn.query_norm.p;
                ap.kw = (const bf16_t*)wf.attn.key_norm.p; ap.pos3 = e->dec.pos3; ap.kvpos = e->dec.kvpos; ap.c = gpu_kv_cache(e, l_full);
                ap.C = 1; ap.Hq = g.Hq; ap.Hkv = g.Hkv; ap.rot = g.rope_dim; ap.theta = g.rope_theta; ap.sections = g.mrope_section; ap.eps = g.eps;
                attn_prep(ap, s); }},
            {"attn_decode+combine", g.n_full, [&](cudaStream_t s) {
                AttnDecodeArgs ad;
                ad.c = gpu_kv_cache(e, l_full); ad.q = e->qk; ad.ldq = ld; ad.pos = e->dec.kvpos; ad.C = 1; ad.Hq = g.Hq; ad.Hkv = g.Hkv;
                ad.n_splits = ns; ad.split_keys = sk; ad.scratch = e->attn_scr; ad.gate = e->gv; ad.ldg = ld; ad.y = e->att; ad.ldy = qd;
                attn_decode(ad, s); }},
            {"embed + argmax", 1, [&](cudaStream_t s) {
                embed_gather(e->w.token_embedding, e->dec.ids, 1, e->ovr, g.H, e->x, g.H, s);
                argmax<float>(e->logits, g.vocab, e->domain, 1, e->amax_scr, e->dec.out, s); }},
            {"sample_gpu (defaults)", 1, [&](cudaStream_t s) { sample_gpu(e->logits, SamplerParams(), e->smp, 0, RNG_DECODE, s); }},
        };
        {   // the sampler reads the counts: a fresh sampler's zeros
            Sampler fresh; sampler_build(&fresh, SamplerParams(), e->domain);
            gpu_sampler_bind(e, &fresh);
            cudaCheck(cudaStreamSynchronize(e->stream));
            e->smp_bound = nullptr;
        }
        double total = 0;
        for (const Kind& k : kinds) {
            if (k.count == 0) continue;
            cudaGraph_t gk;
            cudaCheck(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeThreadLocal));
            for (int r = 0; r < k.count; r++) k.f(e->stream);
            cudaCheck(cudaStreamEndCapture(e->stream, &gk));
            cudaGraphExec_t xk;
            cudaCheck(cudaGraphInstantiate(&xk, gk, 0));
            float t = time_graph(xk, 20);
            cudaCheck(cudaGraphExecDestroy(xk)); cudaCheck(cudaGraphDestroy(gk));
            if (strncmp(k.name, "sample_gpu", 10)) total += t;  // not part of a greedy step
            printf("decode       %-22s x%-3d %.3f ms (%.2f us each)\n", k.name, k.count, t, 1e3 * t / k.count);
        }
        printf("decode     small kernels alone: %.3f ms per token\n", total);
    }
    // smoke: a short greedy generation
    gpu_reset(e);
    std::vector<int> out;
    GenStats s = generate_gpu(e, &smp, std::vector<int>(ids.begin(), ids.begin() + 16), 24, {}, nullptr, [&](int id) { out.push_back(id); });
    printf("generate   16-token prompt -> %d tokens:", s.generated);
    for (int id : out) printf(" %d", id);
    printf("\n");
    size_t fr, tot; cudaCheck(cudaMemGetInfo(&fr, &tot));
    printf("memory     %.2f GiB in use of %.2f\n", gib(tot - fr), gib(tot));
    gpu_free(e);
    // lanes (issue 14): one gpu_decode_lanes step of n lanes, host wall time per step (its graph
    // replayed, the argmax ids back), and the cuda-event time of the same graph replayed back to
    // back; at a 128-token context, then at ~640 (512 more tokens prefilled into every lane: the
    // served load's 512-token prompts, where attention reads 5x the keys)
    {
        GpuOpts ol = o;
        ol.lanes = LANES_MAX; ol.max_context = 1024; ol.kv_capacity = LANES_MAX * 1024; ol.prefill_chunk = 512;
        GpuEngine* le = gpu_build(&m, ol, &err);
        if (!le) { fprintf(stderr, "bench_gpu: %s\n", err.c_str()); return 1; }
        std::vector<int> lp(512), ls(LANES_MAX), lid(LANES_MAX), am(LANES_MAX);
        for (int& id : lp) id = (int)(rng() % le->domain);
        auto fill = [&](int T) {  // T more prompt tokens into every lane
            for (int l = 0; l < LANES_MAX; l++) {
                gpu_lane_select(le, l);
                gpu_lane_reserve(le, l, 1024);
                gpu_forward(le, lp.data(), nullptr, nullptr, T, nullptr, false);
                ls[l] = l; lid[l] = lp[l];
            }
        };
        for (int ctx : {128, 640}) {
            fill(ctx == 128 ? 128 : 512);
            for (int n = ctx == 128 ? 1 : 16; n <= LANES_MAX; n *= 2) {
                for (int w = 0; w < 2; w++) gpu_decode_lanes(le, n, ls.data(), lid.data(), nullptr, am.data());  // capture, warm
                const int reps = 10;
                const double t0 = now_s();
                for (int r = 0; r < reps; r++) gpu_decode_lanes(le, n, ls.data(), lid.data(), nullptr, am.data());
                const double ms = (now_s() - t0) * 1e3 / reps;
                int bi = 0;
                while ((1 << bi) < n) bi++;
                const int b = gpu_bucket_of(le->lanes[0].pos + 1);
                float dev = -1;
                if (le->lane_graph[bi][b]) {
                    cudaCheck(cudaEventRecord(e0, le->stream));
                    for (int r = 0; r < reps; r++) cudaCheck(cudaGraphLaunch(le->lane_graph[bi][b], le->stream));
                    cudaCheck(cudaEventRecord(e1, le->stream));
                    cudaCheck(cudaEventSynchronize(e1));
                    cudaCheck(cudaEventElapsedTime(&dev, e0, e1));
                    dev /= reps;
                }
                printf("lanes      %2d lanes at %4d: %.3f ms a step (device %.3f ms), %.0f tok/s in all\n", n, le->lanes[0].pos, ms, dev,
                       n / ms * 1e3);
                // NINFER_PROFILE_LANES=1: one more step of 64 lanes at ~640 between cudaProfilerStart
                // and Stop (ncu --profile-from-start off: its kernels alone)
                if (n == LANES_MAX && ctx == 640 && getenv("NINFER_PROFILE_LANES")) {
                    cudaCheck(cudaProfilerStart());
                    gpu_decode_lanes(le, n, ls.data(), lid.data(), nullptr, am.data());
                    cudaCheck(cudaProfilerStop());
                }
            }
        }
        gpu_free(le);
    }
    model_close(&m);
    return 0;
}
