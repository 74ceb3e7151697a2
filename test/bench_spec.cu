// bench_spec: what an mtp round would cost on the gpu, from the pieces the gpu path has, and
// whether its verification columns are bit for bit one-token steps (what a lossless greedy
// round needs). the gpu round itself is not built (ninfer refuses --spec mtp on the gpu); this
// measures the design's inputs (test/bench-notes.md):
//   step      one plain decode step: embed -> layers -> head -> argmax, graph replay
//   verify    the same for K+1 columns (the decode path with a deltanet snapshot per column)
//   mtp1      one mtp draft step: embed, the two norms, input_projection (W8 [H, 2H]), the mtp
//             layer (one full-attention decoder layer, W8), final norm, the head (the full Q6
//             head or the Q4 draft head), argmax; graph replay
//   realign   the mtp layer on K+1 columns, the head on one row
// round(K) = verify + realign + (K-1) mtp1. every piece is a captured graph replayed --reps
// times, timed with events (device time; the host's few bytes per round are not in it).
// the mtp weights and the draft head are copied to the device here (ninfer leaves them in
// the file); the mtp layer reuses a main full layer's kv cache (the values do not matter for
// time). the column check: a (K+1)-column call's logits against K+1 one-token calls from the
// same state (max |diff| / max |logit|, argmax agreement, bitwise equality).
//
//   build/test/bench_spec MODEL [--draft-tokens K] [--context N] [--reps N]
#define NINFER_TESTING
#include "../ninfer.cu"
#include <random>

static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

// the objects whose names start with one of `prefixes`, copied to one device block; views of
// the mapping inside them are rebased with rebase()
struct DevCopy {
    const uint8_t* lo = nullptr; const uint8_t* hi = nullptr;
    uint8_t* dev = nullptr;
    const uint8_t* rebase(const uint8_t* p) const { return p && p >= lo && p < hi ? dev + (p - lo) : p; }
    void mat(Mat* m) const { m->base = rebase(m->base); m->high = rebase(m->high); m->scale = rebase(m->scale); }
    void vec(Vec* v) const { v->p = rebase(v->p); }
};
static DevCopy dev_copy(const Artifact* a, std::initializer_list<const char*> prefixes) {
    DevCopy c;
    for (const TensorObject& t : a->objects) {
        bool want = false;
        for (const char* p : prefixes) want |= t.name.rfind(p, 0) == 0;
        if (!want || t.resource) continue;
        if (!c.lo || t.data < c.lo) c.lo = t.data;
        if (!c.hi || t.data + t.bytes > c.hi) c.hi = t.data + t.bytes;
    }
    CHECK(c.lo, "no objects to copy");
    cudaCheck(cudaMalloc(&c.dev, c.hi - c.lo));
    cudaCheck(cudaMemcpy(c.dev, c.lo, c.hi - c.lo, cudaMemcpyHostToDevice));
    return c;
}

int main(int argc, char** argv) {
    const char* path = nullptr;
    int K = 3, ctx = 1024, reps = 50;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--draft-tokens") && i + 1 < argc) K = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--context") && i + 1 < argc) ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !path) path = argv[i];
        else { fprintf(stderr, "usage: bench_spec MODEL [--draft-tokens K] [--context N] [--reps N]\n"); return 1; }
    }
    if (!path || K < 1 || K > 5) { fprintf(stderr, "bench_spec: give a model (and K in 1..5)\n"); return 1; }
    if (gpu_count() == 0) { fprintf(stderr, "bench_spec: no gpu\n"); return 1; }
    Model m; std::string err;
    if (!model_open(&m, path, &err)) { fprintf(stderr, "%s\n", err.c_str()); return 1; }
    const Geometry& g = m.geo;
    if (!g.has_mtp) { fprintf(stderr, "bench_spec: %s has no mtp module\n", path); return 1; }
    GpuOpts o; o.max_context = 2 * ctx; o.prefill_chunk = 512; o.gdn_slots = K + 3; o.quiet = false;
    GpuEngine* e = gpu_build(&m, o, &err);
    if (!e) { fprintf(stderr, "%s\n", err.c_str()); return 1; }
    const int H = g.H, C = K + 1;
    cudaStream_t s = e->stream;

    // the mtp and the draft head on the device
    DevCopy dc = dev_copy(&m.art, {"mtp/", "text/draft_head"});
    MtpWeights mw = m.w.mtp;
    dc.mat(&mw.input_projection); dc.vec(&mw.embedding_norm); dc.vec(&mw.hidden_norm); dc.vec(&mw.final_norm);
    LayerWeights& ml = mw.layer;
    dc.vec(&ml.input_norm); dc.vec(&ml.post_norm); dc.mat(&ml.gate_up); dc.mat(&ml.down);
    dc.mat(&ml.attn.query_key); dc.mat(&ml.attn.gate_value); dc.vec(&ml.attn.query_norm); dc.vec(&ml.attn.key_norm); dc.mat(&ml.attn.output);
    Mat draft = m.w.draft_head;
    if (g.draft_rows) dc.mat(&draft);
    bf16_t* mtp_in; bf16_t* hid;
    cudaCheck(cudaMalloc(&mtp_in, (size_t)DEC_COLS * 2 * H * 2));
    cudaCheck(cudaMalloc(&hid, (size_t)DEC_COLS * H * 2));
    cudaCheck(cudaMemset(hid, 0x3c, (size_t)DEC_COLS * H * 2));  // ~1.0 in bf16: any finite input will do
    int lf = -1;
    for (int l = 0; l < g.L && lf < 0; l++) if (g.full[l]) lf = l;

    // a context of ctx tokens
    std::mt19937_64 rng(1);
    std::vector<int> ids(ctx + 64);
    for (int& id : ids) id = (int)(rng() % e->domain);
    for (int i = 0; i < ctx; i += 512) gpu_forward(e, ids.data() + i, nullptr, nullptr, std::min(512, ctx - i), nullptr, false);
    cudaCheck(cudaStreamSynchronize(s));
    const int bucket = gpu_bucket_of(e->pos + C);
    int n_splits = 0, split_keys = 0;
    gpu_attn_plan(bucket, &n_splits, &split_keys);

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
        printf("  %-34s %8.3f ms\n", name, md);
        return md;
    };
    // the step inputs for C columns at the context end (snapshots into slots 1..C; the live slot stays)
    std::vector<int> snaps(C);
    for (int t = 0; t < C; t++) snaps[t] = 1 + t;
    auto stage = [&](int T) { gpu_stage_inputs(e, true, ids.data() + ctx, nullptr, T, T == 1 ? nullptr : snaps.data()); cudaCheck(cudaStreamSynchronize(s)); };
    // the mtp on T columns of e->dec, its head on the last (the full head or the draft head)
    auto mtp_forward = [&](int T, bool use_draft) {
        const LayerWeights saved = e->w.layers[lf];
        embed_gather(e->w.token_embedding, e->dec.ids, T, e->ovr, H, e->x, H, s);
        rmsnorm(e->x, H, mtp_in, 2 * H, (const bf16_t*)mw.embedding_norm.p, H, T, 1, g.eps, false, s);
        rmsnorm(hid, H, mtp_in + H, 2 * H, (const bf16_t*)mw.hidden_norm.p, H, T, 1, g.eps, false, s);
        linear(mw.input_projection, mtp_in, 2 * H, T, e->x, H, false, nullptr, 0, s);
        e->w.layers[lf] = ml;
        gpu_layer(e, lf, T, e->dec, true, 0, n_splits, split_keys);
        e->w.layers[lf] = saved;
        rmsnorm(e->x + (size_t)(T - 1) * H, H, e->xb, H, (const bf16_t*)mw.final_norm.p, H, 1, 1, g.eps, false, s);
        const Mat& head = use_draft ? draft : e->w.output_head;
        linear(head, e->xb, H, 1, e->logits, (int)head.rows, true, nullptr, 0, s);
        argmax<float>(e->logits, head.rows, use_draft ? (int)head.rows : e->domain, 1, e->amax_scr, e->dec.out, s);
    };

    printf("bench_spec %s: context %d, K = %d (%d verification columns), bucket %d (%d splits of %d keys)\n", path, ctx, K, C, bucket,
           n_splits, split_keys);
    stage(1);
    const float step = timed("step (1 column)", [&] { gpu_model(e, 1, e->dec, true, 0, gpu_bucket_of(e->pos + 1), HEAD_ALL, true); });
    stage(C);
    const float verify = timed("verify (K+1 columns, snapshots)", [&] { gpu_model(e, C, e->dec, true, 0, bucket, HEAD_ALL, true); });
    stage(1);
    const float mtp1 = timed("mtp1, full head", [&] { mtp_forward(1, false); });
    const float mtp1d = g.draft_rows ? timed("mtp1, draft head", [&] { mtp_forward(1, true); }) : 0.f;
    stage(C);
    const float realign = timed("realign (K+1 columns), full head", [&] { mtp_forward(C, false); });
    const float realignd = g.draft_rows ? timed("realign (K+1 columns), draft head", [&] { mtp_forward(C, true); }) : 0.f;
    const float round_f = verify + realign + (K - 1) * mtp1, round_d = verify + realignd + (K - 1) * mtp1d;
    printf("  round K=%d, full head:  %.3f ms = %.2fx a step\n", K, round_f, round_f / step);
    if (g.draft_rows) printf("  round K=%d, draft head: %.3f ms = %.2fx a step\n", K, round_d, round_d / step);
    const float best = g.draft_rows ? round_d : round_f;
    for (double acc : {0.84, 0.507}) {
        const double tpr = 1 + K * acc;  // tokens per round at this acceptance (accepted / drafted)
        printf("  at acceptance %.3f (%.2f tokens/round): %.1f tok/s vs %.1f plain = %.2fx\n", acc, tpr, tpr / best * 1e3, 1e3 / step,
               tpr / best * step);
    }

    // the column check: C columns in one call vs C one-token calls from the same state
    const int V = g.vocab;
    std::vector<float> multi((size_t)C * V), one((size_t)C * V);
    const int p0 = e->pos, live = e->slot;
    gpu_forward(e, ids.data() + ctx, nullptr, nullptr, C, multi.data(), true, snaps.data());
    gpu_restore(e, live, p0);
    for (int t = 0; t < C; t++) {
        gpu_forward(e, ids.data() + ctx + t, nullptr, nullptr, 1, one.data() + (size_t)t * V, false);
    }
    int same_argmax = 0; bool bitwise = true; double worst = 0;
    for (int t = 0; t < C; t++) {
        const float* a = multi.data() + (size_t)t * V; const float* b = one.data() + (size_t)t * V;
        double err = 0, mx = 0;
        for (int v = 0; v < V; v++) { err = std::max(err, (double)fabsf(a[v] - b[v])); mx = std::max(mx, (double)fabsf(b[v])); }
        bitwise &= memcmp(a, b, (size_t)V * 4) == 0;
        worst = std::max(worst, err / mx);
        same_argmax += argmax(a, e->domain) == argmax(b, e->domain);
    }
    printf("  columns: %d-column call vs one-token calls: max |diff| / max |logit| %.2e, argmax equal %d/%d, bitwise %s\n", C, worst,
           same_argmax, C, bitwise ? "yes" : "no");
    cudaCheck(cudaFree(dc.dev)); cudaCheck(cudaFree(mtp_in)); cudaCheck(cudaFree(hid));
    gpu_free(e);
    model_close(&m);
    return 0;
}
