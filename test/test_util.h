// helpers shared by the tests and benches (test_cpu, test_tower, test_kernels, test_gpu,
// bench_gpu): the skip without a gpu, device buffers, random inputs (a fresh seed per run,
// printed; NINFER_SEED=... reproduces), closeness checks, the float64 gated delta rule step,
// the lanes' scheduler against one request at a time. include after ninfer.cu (under
// NINFER_TESTING): they use its CHECK macros, bf16 helpers and engine; a cpu test includes it
// too (nvcc compiles every test, so the cuda types are there; nothing here touches a gpu
// unless called).
#pragma once
#include <gtest/gtest.h>
#include <random>
#include <thread>

// every gpu test starts with this: skipped without a gpu, else the kernels' attributes set
#define NEED_GPU() do { if (gpu_count() == 0) GTEST_SKIP() << "no gpu"; gpu_kernels_init(); } while (0)

// ---- random inputs ----------------------------------------------------------------------

static uint64_t g_seed = 0;
static uint64_t test_seed() {
    if (!g_seed) {
        const char* e = getenv("NINFER_SEED");
        g_seed = e ? strtoull(e, nullptr, 10) : ((uint64_t)std::random_device{}() << 32 | std::random_device{}());
        if (!g_seed) g_seed = 1;
        fprintf(stderr, "ninfer tests: seed %llu (NINFER_SEED=%llu reproduces)\n", (unsigned long long)g_seed, (unsigned long long)g_seed);
    }
    return g_seed;
}
static uint64_t splitmix(uint64_t& s) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t stream) : s(test_seed() ^ (stream * 0xD1B54A32D192ED03ull)) { splitmix(s); }
    uint64_t u64() { return splitmix(s); }
    double uni() { return (u64() >> 11) * (1.0 / 9007199254740992.0); }         // [0,1)
    float uniform(float a, float b) { return a + (b - a) * (float)uni(); }
    int below(int n) { return (int)(u64() % (uint64_t)n); }
    float normal() { double u = uni() + 1e-300, v = uni(); return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v)); }
};
static uint64_t g_stream = 1;  // each call site draws its own stream
static Rng rng() { return Rng(g_stream++); }

static float bfr(float x) { return bf16_to_f32(f32_to_bf16(x)); }
static std::vector<uint16_t> rand_bf16(Rng& r, size_t n, float scale) {
    std::vector<uint16_t> v(n);
    for (auto& x : v) { float f = r.normal() * scale; x = f32_to_bf16(f == 0.f ? scale * 0.5f : f); }
    return v;
}
static std::vector<uint16_t> rand_bf16(std::mt19937_64& r, size_t n, float scale) {  // a fixed stream (whole-model tests)
    std::normal_distribution<float> nd(0.f, scale);
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = f32_to_bf16(nd(r));
    return v;
}
static std::vector<int> random_ids(int n, int domain, uint64_t seed) {
    std::mt19937_64 r(seed);
    std::vector<int> ids(n);
    for (int& id : ids) id = (int)(r() % domain);
    return ids;
}
static std::vector<float> to_f32(const std::vector<uint16_t>& v) {
    std::vector<float> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = bf16_to_f32(v[i]);
    return o;
}

// ---- device buffers -------------------------------------------------------------------

// a device buffer, poisoned with 0xff bytes (nan in bf16 and fp32) when made and on request,
// so an output a kernel does not write fails its check
struct Dev {
    void* p = nullptr; size_t n = 0;
    Dev() {}
    explicit Dev(size_t bytes) : n(bytes) { cudaCheck(cudaMalloc(&p, bytes ? bytes : 1)); cudaCheck(cudaMemset(p, 0xFF, bytes ? bytes : 1)); }
    ~Dev() { if (p) cudaFree(p); }
    Dev(const Dev&) = delete; Dev& operator=(const Dev&) = delete;
    template <typename T> T* as() const { return (T*)p; }
    void poison() { cudaCheck(cudaMemset(p, 0xFF, n)); }
};
template <typename T> static void up(Dev& d, const std::vector<T>& v) { cudaCheck(cudaMemcpy(d.p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice)); }
template <typename T> static Dev* upn(const std::vector<T>& v) { Dev* d = new Dev(v.size() * sizeof(T)); up(*d, v); return d; }
template <typename T> static std::vector<T> down(const Dev& d, size_t n) {
    std::vector<T> v(n);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(v.data(), d.p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// ---- closeness ------------------------------------------------------------------------

static double rel_l2(const float* a, const float* b, size_t n) {  // inf when a holds a nan
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        if (!(d == d)) return INFINITY;
        e += d * d; r += (double)b[i] * b[i];
    }
    return sqrt(e / (r + 1e-300));
}

// bf16 values as ordered integers: the ulp distance between two bf16 words
static int bf16_ulps(uint16_t a, uint16_t b) {
    auto ord = [](uint16_t x) { return (x & 0x8000) ? -(int)(x & 0x7fff) : (int)x; };
    return abs(ord(a) - ord(b));
}
static bool bf16_finite(uint16_t x) { return (x & 0x7f80) != 0x7f80; }

// compare bf16 outputs with a twin that rounds at the same points: every element finite and
// at most max_ulps apart; report how many differ at all
static void expect_bf16_ulps(const char* what, const std::vector<uint16_t>& got, const std::vector<uint16_t>& ref, int max_ulps,
                             double max_diff_frac = 0.02) {
    ASSERT_EQ(got.size(), ref.size());
    size_t bad = 0, diff = 0, shown = 0; int worst = 0;
    for (size_t i = 0; i < got.size(); i++) {
        int u = bf16_finite(got[i]) ? bf16_ulps(got[i], ref[i]) : 1 << 20;
        if (u) diff++;
        worst = std::max(worst, u);
        if (u > max_ulps) {
            if (shown++ < 8) ADD_FAILURE() << what << "[" << i << "]: got " << bf16_to_f32(got[i]) << " want " << bf16_to_f32(ref[i]) << " (" << u << " ulps)";
            bad++;
        }
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements more than " << max_ulps << " ulps off";
    EXPECT_LE((double)diff, max_diff_frac * got.size() + 2) << what << ": " << diff << " of " << got.size() << " differ by an ulp";
    fprintf(stderr, "  %-28s n=%zu  differing=%zu  worst=%d ulp\n", what, got.size(), diff, worst);
}

// |got - ref| <= atol[i] + rtol |ref|, nan never passes
static void expect_close(const char* what, const std::vector<float>& got, const std::vector<double>& ref, const std::vector<double>& atol,
                         double rtol) {
    ASSERT_EQ(got.size(), ref.size());
    size_t bad = 0, shown = 0; double worst = 0, l2e = 0, l2r = 0;
    for (size_t i = 0; i < got.size(); i++) {
        double e = fabs((double)got[i] - ref[i]), tol = atol[i] + rtol * fabs(ref[i]);
        if (!(e <= tol)) {
            if (shown++ < 8) ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << ref[i] << " (tol " << tol << ")";
            bad++;
        }
        if (tol > 0 && e == e) worst = std::max(worst, e / tol);
        l2e += (got[i] - ref[i]) * (got[i] - ref[i]); l2r += ref[i] * ref[i];
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " out of tolerance";
    fprintf(stderr, "  %-28s n=%zu  worst err/tol=%.3f  rel-l2=%.2e\n", what, got.size(), worst, sqrt(l2e / (l2r + 1e-300)));
}

// ---- the float64 gated delta rule (model.md 3.5) ------------------------------------------

// one token of one value head: S <- e^g S, then the delta update with key k (l2-normed),
// value v and beta, and o_j = sum_i S[i][j] q_i (q already times dk^-1/2); orss (nullable)
// gets the root sum of squares of o's terms, the scale of its rounding error. S is [128][128]
// (key dim i, value dim j). both the decode twin and the prefill reference run this.
template <typename V>
static void gdn_ref_step(double* S, const double* q, const double* k, const V& v, double eg, double beta, double* o, double* orss) {
    const int D = 128;
    double m[128] = {};
    for (int i = 0; i < D; i++)
        for (int j = 0; j < D; j++) { S[i * D + j] *= eg; m[j] += S[i * D + j] * k[i]; }
    for (int j = 0; j < D; j++) m[j] = beta * (v(j) - m[j]);
    double oa[128] = {};
    for (int j = 0; j < D; j++) o[j] = 0;
    for (int i = 0; i < D; i++)
        for (int j = 0; j < D; j++) { S[i * D + j] += k[i] * m[j]; const double t = S[i * D + j] * q[i]; o[j] += t; oa[j] += t * t; }
    if (orss) for (int j = 0; j < D; j++) orss[j] = sqrt(oa[j]);
}

// ---- the lanes' scheduler against one request at a time ----------------------------------

// the first index where a and b differ (the shorter one's length when one is a prefix), -1 when equal
// one gpu lanes step, both halves (ninfer.cu's scheduler wakes lanes between them)
static void gpu_decode_lanes(GpuEngine* e, int n, const int* ls, const int* ids, const bool* row_out, int* amax,
                             const Sampler* const* draw = nullptr, const bool* fresh = nullptr) {
    gpu_lanes_launch(e, n, ls, ids, row_out, draw, fresh);
    gpu_lanes_wait(e, n, ls, amax, draw);
}
static int first_difference(const std::vector<int>& a, const std::vector<int>& b) {
    for (size_t s = 0; s < std::min(a.size(), b.size()); s++) if (a[s] != b[s]) return (int)s;
    return a.size() == b.size() ? -1 : (int)std::min(a.size(), b.size());
}

// one request of lanes_match_alone: n tokens after prompt at temperature T (0: greedy), its
// emit cancels after cancel_at tokens (-1: never); stop its stop ids; ref what it gives alone,
// got what it gave on its lane, st its GenStats there, polls how often its cancel poll ran.
// own: the request's sampler is sp (T and the case's sp unused)
struct LaneReq {
    std::vector<int> prompt;
    int n = 0; float T = 0; int cancel_at = -1;
    bool own = false; SamplerParams sp;
    std::vector<int> stop, ref, got;
    GenStats st;
    int polls = 0;
};
// the lanes of one scheduler (lanes[k] is its lane k, one request each) and how they run
struct LanesCase {
    const char* what = "lanes";  // the statistics' label
    LaneSched* ls = nullptr;
    Engine* lanes = nullptr;
    Engine* one = nullptr;        // a one-sequence engine: the references run alone on it (nullptr: rq[k].ref is given)
    SamplerParams sp;             // every request's sampler, at the request's temperature
    int domain = 0;               // the ids it samples from
    int stop_req = -1, stop_at = 0;  // request stop_req stops at the id of its reference's token stop_at
    bool poll_yields = false;     // a cancel poll that hands the turn over (sched_yield), as the server's lane_poll does
    int reserve_extra = 0;        // a gpu lane reserves the pages of prompt + n + reserve_extra rows first, as the server does
    bool batched = true;          // the decode steps must be shared (more decode tokens than steps)
};

// the server's shape on the lanes: each request on its own thread takes its turn (sched_turn),
// resets its lane and generates through engine_generate, whose decode steps the scheduler
// batches; every request's output must equal its reference token for token
static void lanes_match_alone(const LanesCase& c, std::vector<LaneReq>& rq) {
    const int N = (int)rq.size();
    auto sampler = [&](const LaneReq& r, Sampler* smp) {
        SamplerParams sp = c.sp; sp.temperature = r.T;
        sampler_build(smp, r.own ? r.sp : sp, c.domain);
    };
    if (c.one)
        for (int k = 0; k < N; k++) {  // alone; with the stop id, the reference ends before its first place
            LaneReq& r = rq[k];
            Sampler smp; sampler(r, &smp);
            engine_reset(c.one);
            // a sampled lane whose sampler the device's draws cannot take samples its rows on the
            // host (sample()); so does its reference then: the device sampler of a top_k <= 0 row
            // sums in another order than sample() (Sampling.MatchesCpuSampler), so a draw at a
            // near tie may part. everything else is the device's on both sides
            const LanePick lp = lane_pick(&c.lanes[0], &smp, true);
            const bool host = c.one->gpu && c.lanes[0].gpu && !lp.greedy && !lp.drawn;
            if (host) c.one->g->o.tune.force_host_sample = true;
            engine_generate(c.one, &smp, r.prompt, r.n, {}, nullptr, [&](int id) { r.ref.push_back(id); });
            if (host) c.one->g->o.tune.force_host_sample = false;
            if (k == c.stop_req) {
                ASSERT_GT(r.ref.size(), (size_t)c.stop_at) << "request " << k;
                const int id = r.ref[c.stop_at];
                r.stop = {id};
                r.ref.resize(std::find(r.ref.begin(), r.ref.end(), id) - r.ref.begin());
            }
            if (r.cancel_at >= 0) r.ref.resize(r.cancel_at);
        }
    struct Poll { LaneSched* ls; Engine* en; LaneReq* r; };
    auto poll = [](void* ctx) {
        Poll* p = (Poll*)ctx;
        p->r->polls++;
        sched_yield(p->ls, p->en->lane);
        if (p->en->gpu) engine_gpu(p->en);
        return false;
    };
    std::vector<Poll> polls(N);
    std::vector<std::thread> th;
    for (int k = 0; k < N; k++)
        th.emplace_back([&, k] {
            LaneReq& r = rq[k];
            Engine* en = &c.lanes[k];
            polls[k] = Poll{c.ls, en, &r};
            Sampler smp; sampler(r, &smp);
            sched_turn(c.ls, k);
            engine_reset(en);
            if (en->gpu) CHECK(gpu_lane_reserve(engine_gpu(en), k, (int)r.prompt.size() + r.n + c.reserve_extra), "pages");
            r.st = engine_generate(en, &smp, r.prompt, r.n, r.stop, nullptr, [&](int id) {
                r.got.push_back(id);
                return r.cancel_at < 0 || (int)r.got.size() < r.cancel_at;
            }, c.poll_yields ? GenCancel{poll, &polls[k]} : GenCancel());
            sched_turn_end(c.ls, k);
        });
    for (auto& t : th) t.join();
    for (int k = 0; k < N; k++)
        EXPECT_EQ(rq[k].got, rq[k].ref) << c.what << ": request " << k << ", first difference at " << first_difference(rq[k].got, rq[k].ref);
    fprintf(stderr, "  %s: %llu decode steps, %.2f lanes a step, %llu tokens drawn in the steps\n", c.what, (unsigned long long)c.ls->decode_steps,
            c.ls->decode_steps ? (double)c.ls->decode_tokens / c.ls->decode_steps : 0.0, (unsigned long long)c.ls->decode_draws);
    if (c.batched) EXPECT_GT(c.ls->decode_tokens, c.ls->decode_steps) << c.what << ": the decode steps were not batched";
}

// the lanes' draws (sampled lanes draw their next token in the step, LaneSched): 8 requests on
// 8 lanes, greedy ones, sampled ones at several temperatures (the case's top-k 40), one greedy
// with a logit_bias (the draw's k = 1 path), one over the whole domain (top_k 0: on the gpu the
// host samples its rows), one with min_p, top_p, both penalties and a bias; request 2 stops at
// the id of its reference's token 12, request 3 is cancelled after 20 tokens
static std::vector<LaneReq> lanes_draw_requests(int domain) {
    std::vector<LaneReq> rq(8);
    for (int k = 0; k < 8; k++) {
        LaneReq& r = rq[k];
        r.prompt = random_ids(5 + 41 * k, domain, 91 + k);
        r.n = 40 + 12 * k; r.T = k % 4 == 0 ? 0.0f : 0.7f + 0.1f * k; r.cancel_at = k == 3 ? 20 : -1;
    }
    rq[5].own = true; rq[5].sp.temperature = 0; rq[5].sp.logit_bias = {{7, 2.5f}, {domain - 1, 1.0f}, {7, -0.5f}};
    rq[6].own = true; rq[6].sp.temperature = 1.1f; rq[6].sp.top_k = 0; rq[6].sp.seed = 3;
    rq[7].own = true; rq[7].sp.temperature = 0.9f; rq[7].sp.top_k = 64; rq[7].sp.top_p = 0.8f; rq[7].sp.min_p = 0.05f;
    rq[7].sp.presence = 0.5f; rq[7].sp.frequency = 0.4f; rq[7].sp.seed = 17; rq[7].sp.logit_bias = {{3, 1.5f}, {11, -2.0f}};
    return rq;
}
static LanesCase lanes_draw_case(int domain) {
    LanesCase c;
    c.what = "lane draws";
    c.sp.top_k = 40; c.sp.top_p = 0.95f; c.sp.seed = 5; c.domain = domain;
    c.stop_req = 2; c.stop_at = 12;
    return c;
}

// a greedy lane's next token is queued at the end of its step (LaneSched's header), and the
// runner starts the step that takes it at once. when the lane's host work then ends it (here its
// emitter says stop at token `at`), sched_done waits for that step (mode 0: lane 0 alone, the
// emitter returns at once, so the step is in flight or just over; mode 1: beside lane 1, the
// emitter waits until the step ended): either way the lane's position says its state holds the
// token, and continuing from there gives what a sequence fed the same tokens one at a time gives
// (`one`, no scheduler). the token is queued only where the lane asked for its step before the
// step before it ended: a lane whose host work for token at - 1 outlasted that step (a gpu step
// of the kjv is ~0.2 ms) gets token `at` unqueued, and its state then holds the tokens before it
// (checked), so mode 0 runs again, up to 20 times, until token `at` was queued.
// lanes[0], lanes[1]: ls's lanes 0 and 1
static void lanes_queued_token(LaneSched* ls, Engine* lanes, Engine* one, int domain, float T = 0) {
    SamplerParams sp; sp.temperature = T; sp.top_k = 20; sp.seed = 13;  // T > 0: the lanes draw in their steps
    const std::vector<int> pa = random_ids(21, domain, 71), pb = random_ids(9, domain, 72);
    const int at = 10, n = 60;  // the emitter stops at token `at` (0-based): tokens 0..at are emitted
    auto generate = [&](Engine* en, const std::vector<int>& prompt, int max_new, auto emit) {
        Sampler smp; sampler_build(&smp, sp, domain);
        if (en->gpu && en->sched) CHECK(gpu_lane_reserve(engine_gpu(en), en->lane, engine_pos(en) + (int)prompt.size() + max_new), "pages");
        engine_generate(en, &smp, prompt, max_new, {}, nullptr, emit);
    };
    // the reference: tokens 0..at fed back one at a time, then `cont`'s tokens
    std::vector<int> ref, ref_cont;
    engine_reset(one);
    generate(one, pa, n, [&](int id) { ref.push_back(id); return (int)ref.size() < at + 2; });
    ASSERT_EQ((int)ref.size(), at + 2);
    ASSERT_EQ(engine_pos(one), (int)pa.size() + at + 1);
    const std::vector<int> cont = {ref[at + 1], 5, 7};  // the next token, then two more to prefill
    generate(one, cont, 20, [&](int id) { ref_cont.push_back(id); });
    int unqueued = 0;
    for (int mode = 0; mode < 2; mode++) {
        // the lanes: lane 0 stops at token `at`; in mode 1 lane 1 decodes beside it and lane 0's
        // emitter waits until a step took lane 0's queued token
        std::vector<int> got, got_b, got_cont;
        bool queued_at_end = false;  // token `at` was queued when the emitter ended the lane
        std::thread tb;
        if (mode)
            tb = std::thread([&] {
                sched_turn(ls, 1);
                engine_reset(&lanes[1]);
                generate(&lanes[1], pb, n, [&](int id) { got_b.push_back(id); });
                sched_turn_end(ls, 1);
            });
        bool waited = false;
        sched_turn(ls, 0);
        engine_reset(&lanes[0]);
        generate(&lanes[0], pa, n, [&](int id) {
            got.push_back(id);
            if ((int)got.size() < at + 1) return true;
            for (int i = 0; mode && i < 600000 && !waited; i++) {  // a step takes the queued token `at` (30 s at most)
                {
                    std::lock_guard<std::mutex> lk(ls->mu);
                    if (!ls->queued[0]) break;  // not queued: nothing to wait for (handled below)
                    waited = ls->steps[0] != ls->queued_at[0];
                }
                if (!waited) std::this_thread::sleep_for(std::chrono::microseconds(50));
            }
            std::lock_guard<std::mutex> lk(ls->mu);
            queued_at_end = ls->queued[0] != 0;
            return false;
        });
        sched_turn_end(ls, 0);
        if (!queued_at_end) {  // token `at` was not queued: the state holds the tokens before it; run the mode again
            EXPECT_EQ(got, std::vector<int>(ref.begin(), ref.begin() + at + 1)) << "mode " << mode << ", token " << at << " unqueued";
            EXPECT_EQ(engine_pos(&lanes[0]), (int)pa.size() + at) << "mode " << mode << ": token " << at << " unqueued, yet its state moved past it";
            if (mode) tb.join();
            ASSERT_LT(++unqueued, 20) << "token " << at << " was never queued in 20 runs";
            mode--;
            continue;
        }
        if (mode) EXPECT_TRUE(waited) << "no step took lane 0's queued token";
        EXPECT_EQ(got, std::vector<int>(ref.begin(), ref.begin() + at + 1)) << "mode " << mode;
        EXPECT_EQ(engine_pos(&lanes[0]), (int)pa.size() + at + 1) << "mode " << mode << ": the queued token went through a step";
        sched_turn(ls, 0);  // continue lane 0 from what its state holds
        generate(&lanes[0], cont, 20, [&](int id) { got_cont.push_back(id); });
        sched_turn_end(ls, 0);
        if (mode) tb.join();
        EXPECT_EQ(got_cont, ref_cont) << "mode " << mode << ", first difference at " << first_difference(got_cont, ref_cont);
    }
}

// ---- benches --------------------------------------------------------------------------

// copy16_kernel (the copy-bandwidth ceiling) is the product's: ninfer.cu 7.4
