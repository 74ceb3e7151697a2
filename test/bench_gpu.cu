// bench_gpu: prefill and decode speed of the gpu path, llama-bench style (reference-engine.md
// 18.7: ppN = a prompt of N tokens from an empty context, tgN = N greedy decode tokens), timed
// with cuda events, and the fraction of the memory roofline for decode: bytes one decode token
// must read (every resident weight matrix once, the deltanet states read and written, the kv
// rows at the mean context) / copy bandwidth measured here, in the same run, by a 16-byte
// copy kernel over 2 x 1 GiB (bytes read + written).
//
//   build/test/bench_gpu MODEL [--bench pp512,pp4096,tg128,tg128@4096] [--reps N] [--sample]
//                        [--prefill-chunk N] [--kv-dtype bf16|int8|fp8] [--no-cuda-graph] [--device N]
//
// --sample: tgN samples with the cli's defaults (temperature 0.6, top_k 20, top_p 0.95,
// presence 1.0) instead of greedy, each token counted for the penalties as generate_gpu does;
// on the device (sample_gpu). the launch knobs come from the environment as for the cli
// (GpuTuning: NINFER_PDL=0, NINFER_FORK=0, NINFER_GDN_CHUNKED=N).
//
// decode steps are timed as the cli runs them (generate_gpu): stage the step's inputs, replay
// the bucket's graph, pick on the device, the id to the host (one step ahead of the host). the first
// run of each test is a warm-up (graph capture, first-touch), then the median of --reps runs.
#define NINFER_TESTING
#include "../ninfer.cu"
#include "test_util.h"
#include <random>
#include <functional>

static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

static float copy_bandwidth_gbs(cudaStream_t s) {
    const size_t n = 1ull << 30;
    void *a, *b;
    cudaCheck(cudaMalloc(&a, n)); cudaCheck(cudaMalloc(&b, n));
    cudaCheck(cudaMemsetAsync(a, 1, n, s));
    int sms = 0; cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaEvent_t e0, e1; cudaCheck(cudaEventCreate(&e0)); cudaCheck(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int r = 0; r < 12; r++) {
        cudaCheck(cudaEventRecord(e0, s));
        copy16_kernel<<<sms * 8, 512, 0, s>>>((const uint4*)a, (uint4*)b, n / 16);
        cudaCheck(cudaEventRecord(e1, s));
        cudaCheck(cudaEventSynchronize(e1));
        float t; cudaCheck(cudaEventElapsedTime(&t, e0, e1));
        if (r >= 2) ms.push_back(t);
    }
    cudaCheck(cudaFree(a)); cudaCheck(cudaFree(b));
    return (float)(2.0 * n / (median(ms) * 1e-3) / 1e9);
}

int main(int argc, char** argv) {
    const char* path = nullptr;
    std::string spec = "pp512,pp4096,tg128";
    int reps = 3, chunk = 0;
    bool sampled = false;
    GpuOpts o;
    o.tune = gpu_tuning_from_env();  // NINFER_PDL=0 etc., as the cli reads them
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (gpu_parse_flag(argc, argv, &i, &o)) continue;
        if (!strcmp(a, "--bench") && i + 1 < argc) spec = argv[++i];
        else if (!strcmp(a, "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--prefill-chunk") && i + 1 < argc) chunk = atoi(argv[++i]);
        else if (!strcmp(a, "--sample")) sampled = true;
        else if (a[0] != '-' && !path) path = a;
        else { fprintf(stderr, "usage: bench_gpu MODEL [--bench pp512,pp4096,tg128] [--reps N] [--sample] [--prefill-chunk N] [--kv-dtype T] [--no-cuda-graph]\n"); return 1; }
    }
    if (!path) { fprintf(stderr, "bench_gpu: give a model\n"); return 1; }
    if (gpu_count() == 0) { fprintf(stderr, "bench_gpu: no gpu\n"); return 1; }
    struct Test { bool pp; int n, depth; std::string name; };
    std::vector<Test> tests;
    int max_pp = 1, need_ctx = 1;
    for (size_t p = 0; p < spec.size();) {
        size_t q = spec.find(',', p); if (q == std::string::npos) q = spec.size();
        std::string t = spec.substr(p, q - p);
        Test x; x.name = t; x.depth = 0;
        x.pp = t.rfind("pp", 0) == 0;
        if (!x.pp && t.rfind("tg", 0) != 0) { fprintf(stderr, "bench_gpu: bad test '%s'\n", t.c_str()); return 1; }
        x.n = atoi(t.c_str() + 2);
        size_t at = t.find('@'); if (at != std::string::npos) x.depth = atoi(t.c_str() + at + 1);
        if (x.n <= 0) { fprintf(stderr, "bench_gpu: bad test '%s'\n", t.c_str()); return 1; }
        if (x.pp) max_pp = std::max(max_pp, x.n);
        need_ctx = std::max(need_ctx, x.depth + x.n + 1);
        tests.push_back(x);
        p = q + 1;
    }
    Model m; std::string err;
    if (!model_open(&m, path, &err)) { fprintf(stderr, "bench_gpu: %s\n", err.c_str()); return 1; }
    o.max_context = std::max(need_ctx, 64) + 64;
    o.prefill_chunk = chunk > 0 ? chunk : max_pp;
    double t0 = now_s();
    GpuEngine* e = gpu_build(&m, o, &err);
    if (!e) { fprintf(stderr, "bench_gpu: %s\n", err.c_str()); return 1; }
    fprintf(stderr, "bench_gpu: engine built in %.2f s (capacity %d, prefill chunk %d, kv %s, graphs %s)\n", now_s() - t0, e->capacity,
            e->T_max, kv_dtype_name(o.kv), o.graphs ? "on" : "off");
    printf("config     kv %s, graphs %s, pdl %s, fork %s, gdn chunked from %d tokens, prefill chunk %d\n", kv_dtype_name(o.kv),
           o.graphs ? "on" : "off", g_launch_pdl ? "on" : "off", o.tune.fork ? "on" : "off", o.tune.gdn_chunked_min, e->T_max);
    const Geometry& g = m.geo;
    cudaDeviceProp prop; cudaCheck(cudaGetDeviceProperties(&prop, e->device));
    const float bw = copy_bandwidth_gbs(e->stream);

    // bytes a decode token reads: resident weights (the embedding: one row, unless it is also
    // the head), deltanet states read + written, kv rows (added per test at its mean context)
    double wbytes = 0;
    const TensorObject* emb = artifact_find(&m.art, "text/token_embedding");
    for (const auto& s : e->spans) wbytes += s.bytes;
    if (!g.tied) wbytes -= emb->bytes - (double)emb->bytes / g.vocab;
    const double gdn_bytes = 2.0 * g.n_gdn * ((double)g.Hv * g.dk * g.dv * 4 + 3.0 * g.conv_dim * 2);
    const double kv_per_row = (double)gpu_kv_bytes_per_row(g, o.kv);

    cudaEvent_t e0, e1; cudaCheck(cudaEventCreate(&e0)); cudaCheck(cudaEventCreate(&e1));
    std::mt19937_64 rng(1);
    std::vector<int> ids(std::max(need_ctx, 2));
    for (int& id : ids) id = (int)(rng() % e->domain);
    Sampler smp; SamplerParams sp;  // --sample: the defaults
    if (!sampled) sp.temperature = 0;
    sampler_build(&smp, sp, e->domain);
    printf("decoding   %s\n", !sampled ? "greedy (argmax on the device)" : "sampled on the device (sample_gpu)");
    printf("model      %s (%s)\n", m.art.model_id.c_str(), path);
    printf("device     %s, %d SMs; copy bandwidth %.0f GB/s (read + write, 2 x 1 GiB)\n", prop.name, prop.multiProcessorCount, bw);
    printf("resident   %.3f GB weights; decode reads %.3f GB weights + %.1f MB deltanet state per token (+ %.1f KB kv per context token)\n",
           e->arena_bytes / 1e9, wbytes / 1e9, gdn_bytes / 1e6, kv_per_row / 1e3);
    printf("%-14s %10s %12s %10s\n", "test", "ms", "tok/s", "roofline");
    for (const Test& t : tests) {
        std::vector<float> ms;
        for (int r = 0; r <= reps; r++) {
            gpu_reset(e);
            float el = 0;
            if (t.pp) {
                cudaCheck(cudaEventRecord(e0, e->stream));
                for (int i = 0; i < t.n; i += e->T_max) gpu_forward(e, ids.data() + i, nullptr, nullptr, std::min(e->T_max, t.n - i), nullptr, false);
                cudaCheck(cudaEventRecord(e1, e->stream));
                cudaCheck(cudaEventSynchronize(e1));
            } else {
                int pre = std::max(1, t.depth);
                for (int i = 0; i < pre; i += e->T_max) gpu_forward(e, ids.data() + i, nullptr, nullptr, std::min(e->T_max, pre - i), nullptr, false);
                sampler_build(&smp, sp, e->domain);  // fresh counts each run
                cudaCheck(cudaStreamSynchronize(e->stream));
                // the cli's loop (generate_gpu, continuing the sequence: an empty prompt): the
                // pick from the prefill's logits, then t.n decode steps and their picks
                cudaCheck(cudaEventRecord(e0, e->stream));
                GenStats gs = generate_gpu(e, &smp, {}, t.n + 1, {}, nullptr, [](int) {});
                cudaCheck(cudaEventRecord(e1, e->stream));
                cudaCheck(cudaEventSynchronize(e1));
                CHECK(gs.generated == t.n + 1, "decode stopped after %d tokens", gs.generated);
            }
            cudaCheck(cudaEventElapsedTime(&el, e0, e1));
            if (r > 0) ms.push_back(el);
        }
        float med = median(ms);
        double tps = t.n / (med * 1e-3);
        if (t.pp) {
            printf("%-14s %10.2f %12.1f %10s\n", t.name.c_str(), med, tps, "-");
        } else {
            double ctx = std::max(1, t.depth) + t.n / 2.0;
            double bytes = wbytes + gdn_bytes + kv_per_row * ctx;
            printf("%-14s %10.2f %12.1f %9.1f%%   (%.3f GB/token: %.0f GB/s)\n", t.name.c_str(), med, tps, 100.0 * bytes * tps / 1e9 / bw, bytes / 1e9,
                   bytes * tps / 1e9);
        }
        fflush(stdout);
    }
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
        int kernels = 0, fused_norms = 0, fused_swiglu = 0;
        // as the step runs them: a product that reads a norm of x (nw) or swiglu of gate_up
        // makes it while staging x where the x-staged kernel takes it (gpu_layer)
        auto mm = [&](const Mat& w, const Vec* nw, bool fused, bool sw = false) {
            GemvX xt;
            const bf16_t* x = e->xb;
            int ldx = (int)w.cols <= g.H ? g.H : (int)w.cols;
            if (fused) {
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
                mm(lw.gdn.output, nullptr, false);
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
        printf("decode     matrices only: %d products (%d with a fused norm, %d with fused swiglu), %.3f GB, %.3f ms (%.0f GB/s, %.1f%% of copy)\n",
               kernels, fused_norms, fused_swiglu, mbytes / 1e9, t_mm, mbytes / 1e9 / (t_mm * 1e-3), 100.0 * mbytes / 1e9 / (t_mm * 1e-3) / bw);
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
        const int C = g.conv_dim, vd = g.Hv * g.dv, LU = C + vd, qd = g.Hq * g.head_dim, ld = qd + g.Hkv * g.head_dim;
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
            {"gated_rmsnorm", g.n_gdn, [&](cudaStream_t s) { gated_rmsnorm(e->core, vd, e->u + C, LU, e->gn, vd, (const bf16_t*)wg.gdn.norm.p, g.dv, 1, g.Hv, g.eps, s); }},
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
    model_close(&m);
    return 0;
}
