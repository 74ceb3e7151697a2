// bench_spec: what the gpu mtp round costs against one plain decode step, from the product's
// own pieces (generate_spec_gpu's functions), each captured once as a graph and replayed --reps
// times, device time by events (median):
//   step      one plain decode step: gpu_model on one column (the decode graph's body)
//   verify    gpu_spec_verify on K+1 columns: the decode path with a deltanet snapshot per
//             column, then the columns' final-normed hidden rows
//   realign   spec_greedy + gpu_spec_realign: the commit, the mtp on K+1 rows, the K drafts
//             (the full head or, with --lm-head-draft, the Q4 draft head)
//   round     verify + realign in one graph: a greedy round's device time
// then end to end on a random prompt: generate_gpu and generate_spec_gpu, decode tok/s (a random
// synthetic model accepts ~no drafts: the worst case, one token per round), and the column
// check: the K+1-column verify's logits against K+1 one-token steps from the same state
// (bitwise, what lossless greedy needs).
//
//   build/test/bench_spec MODEL [--draft-tokens K] [--lm-head-draft] [--context N] [--reps N]
#define NINFER_TESTING
#include "../ninfer.cu"
#include <random>

static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

int main(int argc, char** argv) {
    const char* path = nullptr;
    int K = 3, ctx = 1024, reps = 50;
    bool lmh = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--draft-tokens") && i + 1 < argc) K = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--context") && i + 1 < argc) ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lm-head-draft")) lmh = true;
        else if (argv[i][0] != '-' && !path) path = argv[i];
        else { fprintf(stderr, "usage: bench_spec MODEL [--draft-tokens K] [--lm-head-draft] [--context N] [--reps N]\n"); return 1; }
    }
    if (!path || K < 1 || K > SPEC_MAX_K) { fprintf(stderr, "bench_spec: give a model (and K in 1..%d)\n", SPEC_MAX_K); return 1; }
    if (gpu_count() == 0) { fprintf(stderr, "bench_spec: no gpu\n"); return 1; }
    Model m; std::string err;
    if (!model_open(&m, path, &err)) { fprintf(stderr, "%s\n", err.c_str()); return 1; }
    GpuOpts o; o.max_context = 2 * ctx + 512; o.prefill_chunk = 512; o.quiet = false; o.gdn_slots = K + 3;  // + 2 for the column check
    o.tune = gpu_tuning_from_env();  // the NINFER_* measurement knobs
    Engine en;
    if (!engine_build(&en, &m, true, o, &err, SpecOpts{K, lmh})) { fprintf(stderr, "%s\n", err.c_str()); return 1; }
    GpuEngine* e = en.g;
    const int C = K + 1;
    cudaStream_t s = e->stream;

    // a context of ctx tokens
    std::mt19937_64 rng(1);
    std::vector<int> ids(ctx + 64);
    for (int& id : ids) id = (int)(rng() % e->domain);
    for (int i = 0; i < ctx; i += 512) gpu_forward(e, ids.data() + i, nullptr, nullptr, std::min(512, ctx - i), nullptr, false);
    cudaCheck(cudaStreamSynchronize(s));
    const int b = gpu_bucket_of(e->pos + 1);

    cudaEvent_t e0, e1;
    cudaCheck(cudaEventCreate(&e0)); cudaCheck(cudaEventCreate(&e1));
    auto timed = [&](const char* name, auto body) {  // capture body once, replay: median ms
        cudaGraph_t gr; cudaGraphExec_t ex;
        cudaCheck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        body();
        cudaCheck(cudaStreamEndCapture(s, &gr));
        cudaCheck(cudaGraphInstantiate(&ex, gr, 0));
        std::vector<float> ms;
        for (int r = 0; r < reps + 3; r++) {
            cudaCheck(cudaEventRecord(e0, s));
            cudaCheck(cudaGraphLaunch(ex, s));
            cudaCheck(cudaEventRecord(e1, s));
            cudaCheck(cudaEventSynchronize(e1));
            float t; cudaCheck(cudaEventElapsedTime(&t, e0, e1));
            if (r >= 3) ms.push_back(t);
        }
        cudaCheck(cudaGraphExecDestroy(ex)); cudaCheck(cudaGraphDestroy(gr));
        float md = median(ms);
        printf("  %-40s %8.3f ms\n", name, md);
        return md;
    };
    std::vector<int> snaps(C);
    for (int t = 0; t < C; t++) snaps[t] = t == 0 ? e->slot : (t <= e->slot ? t - 1 : t);
    auto stage = [&](int T) {
        gpu_stage_inputs(e, true, ids.data() + ctx, nullptr, T, T == 1 ? nullptr : snaps.data());
        gpu_spec_stage(e, e->mtp.re, e->mtp.h_blk + SPEC_BLK_INTS, nullptr, T, e->pos);
        if (K > 1) gpu_spec_stage(e, e->mtp.ds, e->mtp.h_blk + SPEC_BLK_INTS + 8 * DEC_COLS, nullptr, K - 1, e->pos + 1);
        cudaCheck(cudaStreamSynchronize(s));
    };
    auto greedy = [&] { launch_k(spec_greedy_kernel, 1, 32, 0, s, (const int*)e->dec.ids, (const int*)e->dec.out, C - 1, e->mtp.blk); };

    printf("bench_spec %s: context %d, K = %d (%d verification columns), %s, bucket %d\n", path, ctx, K, C,
           lmh ? "drafts by the draft head (--lm-head-draft)" : "drafts by the full head", b);
    stage(1);
    const float step = timed("step (1 column)", [&] { gpu_model(e, 1, e->dec, true, 0, b, HEAD_ALL, true); });
    stage(C);
    const float verify = timed("verify (K+1 columns, snapshots, hidden)", [&] { gpu_spec_verify(e, C, b); });
    const float realign = timed("accept + realign (K+1 rows) + K drafts", [&] { greedy(); gpu_spec_realign(e, C, b); });
    const float round = timed("round (one graph)", [&] { gpu_spec_verify(e, C, b); greedy(); gpu_spec_realign(e, C, b); });
    printf("  round K=%d: %.3f ms = %.2fx a step (verify %.2fx, mtp part %.2fx)\n", K, round, round / step, verify / step, realign / step);
    for (double acc : {0.84, 0.507}) {
        const double tpr = 1 + K * acc;  // tokens per round at this acceptance (accepted / drafted)
        printf("  at acceptance %.3f (%.2f tokens/round): %.1f tok/s vs %.1f plain = %.2fx (device time)\n", acc, tpr, tpr / round * 1e3,
               1e3 / step, tpr / round * step);
    }

    // the column check: C columns in one call vs C one-token calls from the same state
    const int V = m.geo.vocab;
    std::vector<float> multi((size_t)C * V), one((size_t)C * V);
    const int p0 = e->pos, live = e->slot;
    std::vector<int> snap2(C);
    for (int t = 0; t < C; t++) snap2[t] = 2 + t;  // leave the live slot as it is
    gpu_forward(e, ids.data() + ctx, nullptr, nullptr, C, multi.data(), true, snap2.data());
    e->slot = live; e->pos = p0;
    for (int t = 0; t < C; t++) gpu_forward(e, ids.data() + ctx + t, nullptr, nullptr, 1, one.data() + (size_t)t * V, false);
    int same_argmax = 0; bool bitwise = true; double worst = 0;
    for (int t = 0; t < C; t++) {
        const float* a = multi.data() + (size_t)t * V; const float* r = one.data() + (size_t)t * V;
        double d = 0, mx = 0;
        for (int v = 0; v < V; v++) { d = std::max(d, (double)fabsf(a[v] - r[v])); mx = std::max(mx, (double)fabsf(r[v])); }
        bitwise &= memcmp(a, r, (size_t)V * 4) == 0;
        worst = std::max(worst, d / mx);
        same_argmax += argmax(a, e->domain) == argmax(r, e->domain);
    }
    printf("  columns: %d-column call vs one-token calls: max |diff| / max |logit| %.2e, argmax equal %d/%d, bitwise %s\n", C, worst,
           same_argmax, C, bitwise ? "yes" : "no");

    // end to end: plain and speculative decoding of 256 tokens after a 512-token prompt, greedy
    // and sampled (ninfer's default sampler; the speculative draws on the device, then on the host)
    std::vector<int> prompt(ids.begin(), ids.begin() + 512);
    Sampler smp;
    for (int mode = 0; mode < 5; mode++) {
        const bool spec = mode == 1 || mode >= 3, sampled = mode >= 2, host = mode == 4;
        SamplerParams sp;
        if (!sampled) sp.temperature = 0.0f;
        e->o.tune.force_host_sample = host;
        gpu_reset(e);
        sampler_build(&smp, sp, e->domain);
        std::vector<int> out;
        GenStats st = spec ? generate_spec_gpu(e, &smp, prompt, 256, {}, [&](int id) { out.push_back(id); })
                           : generate_gpu(e, &smp, prompt, 256, {}, nullptr, [&](int id) { out.push_back(id); });
        printf("  end to end %-8s %s: %d tokens in %.3f s = %.1f tok/s", sampled ? (host ? "sampled*" : "sampled") : "greedy",
               spec ? "generate_spec_gpu" : "generate_gpu     ", st.generated, st.decode_s, st.generated / st.decode_s);
        if (spec) printf(" (%ld rounds, %ld of %ld drafts accepted, %.2f tokens/round)", st.spec.rounds, st.spec.accepted, st.spec.drafted,
                         (double)st.generated / std::max(1L, st.spec.rounds + st.spec.fallback_steps));
        printf("%s\n", host ? " [* the speculative draws on the host: force_host_sample]" : "");
    }
    e->o.tune.force_host_sample = false;
    engine_free(&en);
    model_close(&m);
    return 0;
}
