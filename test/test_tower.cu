// tests for the vision tower and the multimodal prompt on the cpu reference path (ninfer.cu 4.7,
// 4.8): the tower alone and whole multimodal prompts against hugging face goldens
// (test/golden/hf_vision_tiny_<profile>.{json,f32}, written by test/reference/make_vision_goldens.py),
// hf's own m-rope positions and rope_delta, and the refusals of prompts that do not match their media.
//
// run from the repo root; the artifacts come from `make models` (convert.py --synthetic).
// NINFER_GOLDEN_DIR overrides test/golden.
#define NINFER_TESTING
#include "../ninfer.cu"
#include "test_util.h"
#include <gtest/gtest.h>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <random>

// ---- helpers ---------------------------------------------------------------------------

static bool file_exists(const std::string& p) { struct stat st; return stat(p.c_str(), &st) == 0; }

static std::string golden_dir() {
    const char* d = getenv("NINFER_GOLDEN_DIR");
    return d && *d ? d : "test/golden";
}

static std::string artifact_path(const std::string& profile) {
    return std::string("build/models/tiny") + (profile == "bf16" ? "-bf16" : "") + ".ninfer";
}

static std::vector<int> ints(const Json* a) {
    std::vector<int> v;
    if (a && a->is_array()) for (const Json& x : a->arr) v.push_back((int)x.i);
    return v;
}

// the golden's pixel rows (make_vision_goldens.pixel_rows): splitmix64 seeded by the case and
// the item, the top 24 bits of each output as u * 2^-23 - 1 (exact in fp32)
static std::vector<float> pixel_rows(int case_index, int media_index, size_t n) {
    uint64_t s = ((uint64_t)case_index * 1000 + media_index) * 1000003ull + 17;
    std::vector<float> v(n);
    for (float& x : v) {
        s += 0x9E3779B97F4A7C15ull;
        uint64_t z = s;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        x = (float)((double)(z >> 40) * (1.0 / (1 << 23)) - 1.0);
    }
    return v;
}

// the media of one golden tower case, pixels owned here
struct Media {
    std::vector<std::vector<float>> pixels;
    std::vector<VisionInput> items;
};

static Media tower_media(const Geometry& g, const Json& tc, bool video) {
    Media m;
    const int ci = (int)tc.get("case_index")->i;
    for (const Json& gr : tc.get("grids")->arr) {
        VisionInput in;
        in.video = video;
        in.t = (int)gr.arr[0].i; in.h = (int)gr.arr[1].i; in.w = (int)gr.arr[2].i;
        m.pixels.push_back(pixel_rows(ci, (int)m.items.size(), (size_t)in.t * in.h * in.w * vision_patch_len(g)));
        m.items.push_back(in);
    }
    for (size_t k = 0; k < m.items.size(); k++) m.items[k].pixels = m.pixels[k].data();
    return m;
}

// max |a - b| / max |b|
static double rel_max(const float* a, const float* b, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) { e = std::max(e, (double)fabsf(a[i] - b[i])); r = std::max(r, (double)fabsf(b[i])); }
    return e / r;
}

// one logits row against a golden record (make_goldens.Golden): the top-64 values, the subset
// values when present and max |logit|, within 1e-4 of max |logit|; returns err / maxabs
static double check_record(const Json& rec, const float* row, int vocab, const std::vector<int>& subset, const std::string& what) {
    double maxabs = rec.get("maxabs")->num, err = 0, ours = 0;
    for (int i = 0; i < vocab; i++) ours = std::max(ours, (double)fabsf(row[i]));
    std::vector<int> top = ints(rec.get("top_ids"));
    const Json* vals = rec.get("top_vals");
    EXPECT_EQ(top.size(), vals->arr.size());
    for (size_t i = 0; i < top.size() && i < vals->arr.size(); i++) err = std::max(err, fabs(row[top[i]] - (double)(float)vals->arr[i].num));
    if (const Json* sv = rec.get("sub_vals")) {
        EXPECT_EQ(sv->arr.size(), subset.size());
        for (size_t i = 0; i < subset.size() && i < sv->arr.size(); i++) err = std::max(err, fabs(row[subset[i]] - (double)(float)sv->arr[i].num));
    }
    err = std::max(err, fabs(ours - maxabs));
    EXPECT_LE(err, 1e-4 * maxabs) << what;
    return err / maxabs;
}

class VisionGolden : public ::testing::TestWithParam<const char*> {
  protected:
    Json gold;
    std::vector<float> blob;
    Model m;
    bool opened = false;
    FrontendIds fid;
    void SetUp() override {
        std::string base = golden_dir() + "/hf_vision_tiny_" + GetParam();
        std::ifstream f(base + ".json");
        ASSERT_TRUE(f) << base << ".json missing (test/reference/make_vision_goldens.py)";
        std::stringstream ss; ss << f.rdbuf();
        std::string err;
        ASSERT_TRUE(json_parse(ss.str(), &gold, &err)) << err;
        std::ifstream b(base + ".f32", std::ios::binary | std::ios::ate);
        ASSERT_TRUE(b) << base << ".f32 missing";
        blob.resize((size_t)b.tellg() / 4);
        b.seekg(0);
        b.read((char*)blob.data(), (std::streamsize)blob.size() * 4);
        std::string path = artifact_path(GetParam());
        ASSERT_TRUE(file_exists(path)) << path << " missing (make models)";
        ASSERT_TRUE(model_open(&m, path.c_str(), &err)) << err;
        opened = true;
        ASSERT_TRUE(m.geo.has_vision);
        ASSERT_TRUE(frontend_ids(&m, &fid, &err)) << err;
    }
    void TearDown() override { if (opened) model_close(&m); }
    const float* tensor(const Json& t) { return blob.data() + t.get("offset")->i; }
    // the media of a golden prompt, in prompt order
    Media prompt_media(const Json& p) {
        Media md;
        for (const Json& it : p.get("media")->arr) {
            const Json* tc = gold.get("tower")->get(it.get("tower_case")->str.c_str());
            Media one = tower_media(m.geo, *tc, it.get("kind")->str == "video");
            const int k = (int)it.get("index")->i;
            md.pixels.push_back(std::move(one.pixels[k]));
            md.items.push_back(one.items[k]);
        }
        for (size_t k = 0; k < md.items.size(); k++) md.items[k].pixels = md.pixels[k].data();
        return md;
    }
};

// ---- the tower --------------------------------------------------------------------------------

// every tower case: the input of the first block (patch + position embedding), the last block's
// output and the merged rows against hf. bound 2e-5 of the tensor's max |value|: hf's own fp32
// run sits 1.2e-6 to 1.7e-6 from fp64 on these cases (the golden's noise_floor), and the two
// fp32 computations differ only in summation order.
TEST_P(VisionGolden, TowerMatchesHf) {
    const Geometry& g = m.geo;
    EXPECT_EQ(g.v_depth, (int)gold.get("vision")->get("depth")->i);
    EXPECT_EQ(g.v_dim, (int)gold.get("vision")->get("hidden")->i);
    EXPECT_EQ(g.v_heads, (int)gold.get("vision")->get("heads")->i);
    for (auto& kv : gold.get("tower")->obj) {
        const std::string& name = kv.first;
        const Json& tc = kv.second;
        Media md = tower_media(g, tc, name == "video");
        double sum = 0;
        for (auto& p : md.pixels) for (float x : p) sum += x;
        EXPECT_NEAR(sum, tc.get("pixel_sum")->num, 1e-6 * std::max(1.0, fabs(sum))) << name << ": pixel rows differ from the script's";
        size_t N = 0, M = 0;
        for (auto& in : md.items) { N += (size_t)in.t * in.h * in.w; M += vision_tokens(g, in); }
        std::vector<float> emb(N * g.v_dim), hid(N * g.v_dim), out(M * g.v_out);
        size_t n0 = 0, m0 = 0;
        for (auto& in : md.items) {
            std::string err;
            ASSERT_TRUE(vision_forward_cpu(&m, in, out.data() + m0 * g.v_out, &err, emb.data() + n0 * g.v_dim, hid.data() + n0 * g.v_dim)) << err;
            n0 += (size_t)in.t * in.h * in.w; m0 += vision_tokens(g, in);
        }
        const Json* t = tc.get("tensors");
        ASSERT_EQ((size_t)t->get("embed")->get("count")->i, emb.size()) << name;
        ASSERT_EQ((size_t)t->get("merged")->get("count")->i, out.size()) << name;
        double e_emb = rel_max(emb.data(), tensor(*t->get("embed")), emb.size());
        double e_hid = rel_max(hid.data(), tensor(*t->get("hidden")), hid.size());
        double e_out = rel_max(out.data(), tensor(*t->get("merged")), out.size());
        EXPECT_LE(e_emb, 2e-5) << name << " embed";
        EXPECT_LE(e_hid, 2e-5) << name << " hidden";
        EXPECT_LE(e_out, 2e-5) << name << " merged";
        printf("  %s tower %-10s: max err / max|ref|: embed %.2e, hidden %.2e, merged %.2e\n", GetParam(), name.c_str(), e_emb, e_hid, e_out);
    }
}

// the 9b's tower geometry (Dv 1152, 16 heads of 72, mlp 4304, out 4096), one block, against hf
// (test/golden/hf_vision_9b_tower.*) on weights both sides generate (make_vision_goldens.py:
// v9b_tensors, v9b_values): what the tiny tower (heads of 64, widths that are multiples of 64)
// does not reach. same bound as the tiny tower's (hf's own fp32 run: 1.3e-6..2.1e-6 from fp64).
struct V9bTower {
    Model m;
    std::vector<std::vector<uint16_t>> store;
    int k = 0;
    const uint8_t* gen(int64_t n, double scale) {  // tensor k: bf16(scale u) or, scale < 0, bf16(1 + 0.1 u)
        store.emplace_back(n);
        const uint64_t G = 0x9E3779B97F4A7C15ull, s0 = (uint64_t)(k + 1) * G + 0x5EED;
        for (int64_t i = 0; i < n; i++) {
            uint64_t z = s0 + (uint64_t)(i + 1) * G;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull; z = (z ^ (z >> 27)) * 0x94D049BB133111EBull; z ^= z >> 31;
            const double u = (double)(z >> 40) * (1.0 / (1 << 23)) - 1.0;
            store.back()[i] = f32_to_bf16((float)(scale < 0 ? 1.0 + 0.1 * u : scale * u));
        }
        k++;
        return (const uint8_t*)store.back().data();
    }
    Mat mat(int64_t r, int64_t c, double scale) {
        Mat x; x.format = FMT_BF16; x.rows = r; x.cols = c; x.base_row = c * 2; x.base = gen(r * c, scale); return x;
    }
    Vec vec(int64_t n, double scale) { Vec x; x.format = FMT_BF16; x.n = n; x.p = gen(n, scale); return x; }
    V9bTower() {
        store.reserve(64);
        Geometry& g = m.geo;
        g.has_vision = true; g.v_dim = 1152; g.v_heads = 16; g.v_inter = 4304; g.v_out = 4096; g.v_pos = 2304; g.v_depth = 1; g.H = 4096;
        const int64_t D = 1152, I = 4304, O = 4096;
        VisionWeights& w = m.w.vision;
        w.patch_embedding = mat(D, 1536, 2 / sqrt(1536.0)); w.patch_bias = vec(D, 0.02); w.position_embedding = mat(2304, D, 0.1);
        w.layers.resize(1);
        VisionLayerWeights& L = w.layers[0];
        L.norm1_w = vec(D, -1); L.norm1_b = vec(D, 0.05); L.norm2_w = vec(D, -1); L.norm2_b = vec(D, 0.05);
        L.qkv = mat(3 * D, D, 2 / sqrt((double)D)); L.qkv_bias = vec(3 * D, 0.02);
        L.output = mat(D, D, 2 / sqrt((double)D)); L.output_bias = vec(D, 0.02);
        L.fc1 = mat(I, D, 2 / sqrt((double)D)); L.fc1_bias = vec(I, 0.02);
        L.fc2 = mat(D, I, 2 / sqrt((double)I)); L.fc2_bias = vec(D, 0.02);
        w.merger_norm_w = vec(D, -1); w.merger_norm_b = vec(D, 0.05);
        w.merger_fc1 = mat(4 * D, 4 * D, 2 / sqrt(4.0 * D)); w.merger_fc1_bias = vec(4 * D, 0.02);
        w.merger_fc2 = mat(O, 4 * D, 2 / sqrt(4.0 * D)); w.merger_fc2_bias = vec(O, 0.02);
    }
};

TEST(VisionTower9b, MatchesHf) {
    const std::string base = golden_dir() + "/hf_vision_9b_tower";
    std::ifstream f(base + ".json");
    ASSERT_TRUE(f) << base << ".json missing (test/reference/make_vision_goldens.py)";
    std::stringstream ss; ss << f.rdbuf();
    Json gold; std::string err;
    ASSERT_TRUE(json_parse(ss.str(), &gold, &err)) << err;
    std::ifstream b(base + ".f32", std::ios::binary | std::ios::ate);
    ASSERT_TRUE(b);
    std::vector<float> blob((size_t)b.tellg() / 4);
    b.seekg(0); b.read((char*)blob.data(), (std::streamsize)blob.size() * 4);
    V9bTower t;
    const Geometry& g = t.m.geo;
    for (auto& kv : gold.get("cases")->obj) {
        Media md = tower_media(g, kv.second, kv.first == "video");
        double sum = 0;
        for (auto& p : md.pixels) for (float x : p) sum += x;
        EXPECT_NEAR(sum, kv.second.get("pixel_sum")->num, 1e-6 * std::max(1.0, fabs(sum))) << kv.first;
        const VisionInput& in = md.items[0];
        const int N = in.t * in.h * in.w, M = vision_tokens(g, in);
        std::vector<float> emb((size_t)N * g.v_dim), out((size_t)M * g.v_out);
        ASSERT_TRUE(vision_forward_cpu(&t.m, in, out.data(), &err, emb.data())) << err;
        const Json* je = kv.second.get("embed"); const Json* jm = kv.second.get("merged");
        ASSERT_EQ((size_t)je->get("count")->i, emb.size());
        ASSERT_EQ((size_t)jm->get("count")->i, out.size());
        const double e_emb = rel_max(emb.data(), blob.data() + je->get("offset")->i, emb.size());
        const double e_out = rel_max(out.data(), blob.data() + jm->get("offset")->i, out.size());
        EXPECT_LE(e_emb, 2e-5) << kv.first;
        EXPECT_LE(e_out, 2e-5) << kv.first;
        printf("  9b tower geometry %-5s: max err / max|ref|: embed %.2e, merged %.2e\n", kv.first.c_str(), e_emb, e_out);
    }
}

// ---- the multimodal prompt ---------------------------------------------------------------------

// the pad ids come from the artifact's tokenizer.json, and are the ids hf's config names
TEST_P(VisionGolden, PadIdsFromTheArtifact) {
    EXPECT_EQ(fid.vision.image_pad, (int)gold.get("token_ids")->get("image")->i);
    EXPECT_EQ(fid.vision.video_pad, (int)gold.get("token_ids")->get("video")->i);
}

// m-rope positions and rope_delta equal hf's get_rope_index exactly
TEST_P(VisionGolden, PositionsMatchHf) {
    for (auto& kv : gold.get("prompts")->obj) {
        const Json& p = kv.second;
        Media md = prompt_media(p);
        MmPrompt mp;
        std::string err;
        ASSERT_TRUE(mm_layout(m.geo, fid.vision, ints(p.get("ids")), md.items, &mp, &err)) << kv.first << ": " << err;
        const int L = (int)mp.tokens.size();
        const Json* pos = p.get("positions");
        for (int a = 0; a < 3; a++) {
            std::vector<int> want = ints(&pos->arr[a]);
            EXPECT_EQ(want, std::vector<int>(mp.pos3.begin() + (size_t)a * L, mp.pos3.begin() + (size_t)(a + 1) * L)) << kv.first << " axis " << a;
        }
        EXPECT_EQ(mp.rope_delta, (int)p.get("rope_delta")->i) << kv.first;
        std::vector<int> types = ints(p.get("mm_token_type_ids"));
        for (int i = 0; i < L; i++) EXPECT_EQ(mp.ids[i] < 0, types[i] != 0) << kv.first << " token " << i;
    }
}

// whole multimodal prompts: the logits of every recorded row, then greedy decode through the
// cache (positions by rope_delta) with each step's row; bound 1e-4 of max |logit| (the text
// goldens' bound; hf's own fp32 run sits up to 1.2e-5 from fp64 here). prefilled in one piece
// and again in pieces of 13 tokens (pieces cut through the image runs).
TEST_P(VisionGolden, PromptLogitsAndDecodeMatchHf) {
    const Geometry& g = m.geo;
    const int V = g.vocab, domain = (int)gold.get("token_domain")->i;
    std::vector<int> subset = ints(gold.get("subset_ids"));
    for (int piece : {256, 13}) {
        RunState rs; SeqState st;
        run_build(&rs, g, piece, 256);
        seq_build(&st, g, 256);
        double worst = 0;
        for (auto& kv : gold.get("prompts")->obj) {
            const Json& p = kv.second;
            const std::string what = kv.first + " piece " + std::to_string(piece);
            Media md = prompt_media(p);
            MmPrompt mp;
            std::string err;
            ASSERT_TRUE(mm_prepare_cpu(&m, fid.vision, ints(p.get("ids")), md.items, &mp, &err)) << err;
            const int L = (int)mp.tokens.size();
            std::vector<float> lg((size_t)L * V);
            seq_reset(&st);
            prefill_mm_cpu(&m, &rs, &st, mp, lg.data(), true);
            EXPECT_EQ(st.pos, L);
            EXPECT_EQ(st.rope_delta, mp.rope_delta);
            for (const Json& rec : p.get("records")->arr) {
                const int pos = (int)rec.get("pos")->i;
                worst = std::max(worst, check_record(rec, lg.data() + (size_t)pos * V, V, subset, what + " row " + std::to_string(pos)));
                EXPECT_EQ(argmax(lg.data() + (size_t)pos * V, domain), (int)rec.get("argmax")->i) << what << " row " << pos;
            }
            const Json* dec = p.get("decode");
            std::vector<int> want = ints(dec->get("ids"));
            std::vector<float> row(lg.end() - V, lg.end());
            for (size_t s = 0; s < want.size(); s++) {
                const Json& rec = dec->get("steps")->arr[s];
                worst = std::max(worst, check_record(rec, row.data(), V, subset, what + " decode step " + std::to_string(s)));
                const int id = argmax(row.data(), domain);
                ASSERT_EQ(id, want[s]) << what << " decode step " << s;
                if (s + 1 < want.size()) forward_cpu(&m, &rs, &st, &id, nullptr, nullptr, 1, row.data(), false, nullptr);
            }
        }
        printf("  %s prompts (piece %d): max err / max|logit| = %.2e\n", GetParam(), piece, worst);
        run_free(&rs); seq_free(&st);
    }
}

// a prefill that continues from a reused prefix (st->pos > 0 at the start) gives the same last
// row as the whole prompt
TEST_P(VisionGolden, PrefillContinuesFromAPrefix) {
    const Geometry& g = m.geo;
    const Json& p = *gold.get("prompts")->get("image_video");
    Media md = prompt_media(p);
    MmPrompt mp;
    std::string err;
    ASSERT_TRUE(mm_prepare_cpu(&m, fid.vision, ints(p.get("ids")), md.items, &mp, &err)) << err;
    RunState rs; SeqState st;
    run_build(&rs, g, 64, 128);
    seq_build(&st, g, 128);
    std::vector<float> a(g.vocab), b(g.vocab);
    prefill_mm_cpu(&m, &rs, &st, mp, a.data(), false);
    seq_reset(&st);
    MmPrompt head = mp;  // the first 20 tokens (inside the image run), then the rest
    head.tokens.resize(20); head.ids.resize(20);
    std::vector<int> pos3;
    for (int ax = 0; ax < 3; ax++) pos3.insert(pos3.end(), mp.pos3.begin() + (size_t)ax * mp.tokens.size(), mp.pos3.begin() + (size_t)ax * mp.tokens.size() + 20);
    head.pos3 = pos3;
    prefill_mm_cpu(&m, &rs, &st, head, nullptr, false);
    EXPECT_EQ(st.pos, 20);
    prefill_mm_cpu(&m, &rs, &st, mp, b.data(), false);
    EXPECT_LE(rel_max(b.data(), a.data(), a.size()), 1e-5);
    EXPECT_EQ(st.rope_delta, mp.rope_delta);
    run_free(&rs); seq_free(&st);
}

// prompts that do not match their media are refused with a message, before the tower runs
TEST_P(VisionGolden, MismatchedPromptsAreRefused) {
    const Geometry& g = m.geo;
    const Json& p = *gold.get("prompts")->get("two_images");
    std::vector<int> ids = ints(p.get("ids"));
    Media md = prompt_media(p);
    MmPrompt mp;
    std::string err;
    auto refused = [&](const std::vector<int>& t, const std::vector<VisionInput>& media, const char* want) {
        err.clear();
        EXPECT_FALSE(mm_layout(g, fid.vision, t, media, &mp, &err)) << want;
        EXPECT_NE(err.find(want), std::string::npos) << "got: " << err;
    };
    // one pad too few in the first image's run
    std::vector<int> t = ids;
    t.erase(std::find(t.begin(), t.end(), fid.vision.image_pad));
    refused(t, md.items, "pads, expected");
    // one image missing, one too many
    refused(ids, {md.items[0]}, "more image placeholders");
    std::vector<VisionInput> three = md.items;
    three.push_back(md.items[1]);
    refused(ids, three, "placeholders for 2 of 3 images");
    // a video given where the prompt has image pads
    std::vector<VisionInput> asvideo = md.items;
    asvideo[1].video = true;
    refused(ids, asvideo, "more image placeholders");
    // grids the tower cannot take
    std::vector<VisionInput> odd = md.items;
    odd[0].h = 5;
    refused(ids, odd, "media item 0: media grid (1, 5, 6)");
    odd = md.items; odd[0].t = 0;
    refused(ids, odd, "media item 0: media grid");
    EXPECT_FALSE(vision_forward_cpu(&m, odd[0], nullptr, &err));
}

// the textual placeholder expansion (model.md 6.5): image pads repeated per merged token, a
// video's triple replaced by its timestamped frames ("%.1f" of the time: 0.25 -> "0.2", python's
// round-half-even on the exact binary value, as printf does); the tokenized result is a prompt
// mm_layout accepts, with one vision row per pad
TEST_P(VisionGolden, ExpandTextFollowsTheProcessor) {
    const Geometry& g = m.geo;
    std::vector<VisionItem> items(2);
    items[0].t = 1; items[0].h = 4; items[0].w = 6;
    items[1].video = true; items[1].t = 2; items[1].h = 4; items[1].w = 6; items[1].timestamps = {0.25, 1.75};
    for (VisionItem& it : items) { it.row_len = vision_patch_len(g); it.pixels.assign((size_t)it.rows() * it.row_len, 0.5f); }
    const VisionItem *img = &items[0], *vid = &items[1];
    const int mg = g.v_merge;
    const std::string S = "<|vision_start|>", E = "<|vision_end|>", I = "<|image_pad|>", P = "<|video_pad|>";
    std::string text = "a " + S + I + E + " b: " + S + P + E + "c", out, err;
    ASSERT_TRUE(vision_expand_prompt(text, {img}, {vid}, mg, &out, &err)) << err;
    auto rep = [](const std::string& x, int n) { std::string r; while (n--) r += x; return r; };
    std::string want = "a " + S + rep(I, 6) + E + " b: " + "<0.2 seconds>" + S + rep(P, 6) + E + "<1.8 seconds>" + S + rep(P, 6) + E + "c";
    EXPECT_EQ(out, want);
    // a bare video pad is replaced the same way; an image pad is never a video's
    ASSERT_TRUE(vision_expand_prompt("x" + P + "y", {}, {vid}, mg, &out, &err)) << err;
    EXPECT_EQ(out, "x<0.2 seconds>" + S + rep(P, 6) + E + "<1.8 seconds>" + S + rep(P, 6) + E + "y");
    EXPECT_FALSE(vision_expand_prompt(text, {img}, {}, mg, &out, &err));
    EXPECT_NE(err.find("more video placeholders"), std::string::npos) << err;
    EXPECT_FALSE(vision_expand_prompt(text, {img, img}, {vid}, mg, &out, &err));
    EXPECT_NE(err.find("placeholders for 1 of 2 images"), std::string::npos) << err;
    items[1].timestamps.pop_back();
    EXPECT_FALSE(vision_expand_prompt(text, {img}, {vid}, mg, &out, &err));
    EXPECT_NE(err.find("without frame times"), std::string::npos) << err;
    items[1].timestamps = {0.25, 1.75};
    std::vector<VisionInput> media;
    ASSERT_TRUE(vision_inputs_of(g, items, &media, &err)) << err;
    // tokenized with the artifact's tokenizer: a layout with 6 + 2 * 6 vision rows
    Tokenizer tok;
    std::string tj = artifact_resource(&m.art, "frontend/tokenizer.json");
    ASSERT_TRUE(tokenizer_load(&tok, tj.data(), tj.size(), &err)) << err;
    ASSERT_TRUE(vision_expand_prompt(text, {img}, {vid}, mg, &out, &err)) << err;
    std::vector<int> ids;
    tokenizer_encode(&tok, out, &ids);
    MmPrompt mp;
    ASSERT_TRUE(mm_layout(g, fid.vision, ids, media, &mp, &err)) << err;
    EXPECT_EQ(std::count(mp.ids.begin(), mp.ids.end(), -1), 18);
}

// the engine (cpu path) generates from a multimodal prompt: hf's greedy tokens, prefilled in one
// piece, and in pieces of 13 after a prefix of 20 already in the sequence (prompt = the rest)
TEST_P(VisionGolden, EngineGeneratesFromMedia) {
    const int domain = (int)gold.get("token_domain")->i;
    for (int chunk : {256, 13}) {
        const int prefix = chunk == 256 ? 0 : 20;
        Engine en;
        GpuOpts o; o.max_context = 128; o.prefill_chunk = chunk; o.quiet = true;
        std::string err;
        ASSERT_TRUE(engine_build(&en, &m, false, o, &err)) << err;
        for (auto& kv : gold.get("prompts")->obj) {
            const Json& p = kv.second;
            Media md = prompt_media(p);
            MmPrompt mp;
            ASSERT_TRUE(mm_prepare_cpu(&m, fid.vision, ints(p.get("ids")), md.items, &mp, &err)) << err;
            std::vector<int> want = ints(p.get("decode")->get("ids"));
            {
                engine_reset(&en);
                std::vector<int> rest = mp.tokens;
                if (prefix) {  // the first rows are already in the sequence
                    MmPrompt head = mp;
                    head.tokens.resize(prefix); head.ids.resize(prefix);
                    std::vector<int> p3;
                    for (int a = 0; a < 3; a++)
                        p3.insert(p3.end(), mp.pos3.begin() + (size_t)a * mp.tokens.size(), mp.pos3.begin() + (size_t)a * mp.tokens.size() + prefix);
                    head.pos3 = p3;
                    prefill_mm_cpu(&m, &en.rs, &en.st, head, nullptr, false);
                    rest.erase(rest.begin(), rest.begin() + prefix);
                }
                Sampler smp; SamplerParams sp; sp.temperature = 0;
                sampler_build(&smp, sp, domain);
                std::vector<int> got;
                engine_generate(&en, &smp, rest, (int)want.size(), {}, nullptr, [&](int id) { got.push_back(id); }, GenCancel(), &mp);
                EXPECT_EQ(got, want) << kv.first << " chunk " << chunk << " prefix " << prefix;
                EXPECT_EQ(engine_pos(&en), (int)mp.tokens.size() + (int)want.size() - 1);
            }
        }
        engine_free(&en);
    }
}

// vision.h's preprocessing feeds the tower: a corpus image (test/media) through vision_image with
// the artifact's processor configs, viewed by vision_inputs_of, expanded into a prompt, tokenized
// and generated from on the cpu engine: one pad per merged token, finite rows, and the image
// matters (its mirror image gives other logits)
TEST_P(VisionGolden, PreprocessedImageThroughTheEngine) {
    const Geometry& g = m.geo;
    VisionConfig cfg;
    std::string err;
    ASSERT_TRUE(vision_config_parse(artifact_resource(&m.art, "frontend/preprocessor_config.json"),
                                    artifact_resource(&m.art, "frontend/video_preprocessor_config.json"), &cfg, &err)) << err;
    Image im;
    ASSERT_TRUE(media_image("test/media/jpg_444_53x37.jpg", MediaLimits(), &im, &err)) << err;
    std::vector<VisionItem> items(2);
    ASSERT_TRUE(vision_image(im, cfg, &items[0], &err)) << err;
    Image mirror = im;  // left-right
    for (int y = 0; y < im.h; y++)
        for (int x = 0; x < im.w; x++)
            for (int c = 0; c < 3; c++) mirror.rgb[((size_t)y * im.w + x) * 3 + c] = im.rgb[((size_t)y * im.w + (im.w - 1 - x)) * 3 + c];
    ASSERT_TRUE(vision_image(mirror, cfg, &items[1], &err)) << err;
    std::vector<VisionInput> media;
    ASSERT_TRUE(vision_inputs_of(g, items, &media, &err)) << err;
    Tokenizer tok;
    std::string tj = artifact_resource(&m.art, "frontend/tokenizer.json");
    ASSERT_TRUE(tokenizer_load(&tok, tj.data(), tj.size(), &err)) << err;
    const std::string text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n<|im_start|>assistant\n";
    std::vector<float> last[2];
    for (int k = 0; k < 2; k++) {
        std::string expanded;
        ASSERT_TRUE(vision_expand_prompt(text, {&items[k]}, {}, g.v_merge, &expanded, &err)) << err;
        std::vector<int> ids;
        tokenizer_encode(&tok, expanded, &ids);
        MmPrompt mp;
        ASSERT_TRUE(mm_prepare_cpu(&m, fid.vision, ids, {media[k]}, &mp, &err)) << err;
        EXPECT_EQ(std::count(mp.ids.begin(), mp.ids.end(), -1), items[k].tokens(g.v_merge));
        for (float v : mp.rows) ASSERT_TRUE(std::isfinite(v));
        Engine en;
        GpuOpts o; o.max_context = 512; o.prefill_chunk = 256; o.quiet = true;
        ASSERT_TRUE(engine_build(&en, &m, false, o, &err)) << err;
        Sampler smp; SamplerParams sp; sp.temperature = 0;
        sampler_build(&smp, sp, fid.domain);
        std::vector<int> got;
        engine_generate(&en, &smp, mp.tokens, 2, {}, nullptr, [&](int id) { got.push_back(id); }, GenCancel(), &mp);
        EXPECT_EQ(got.size(), 2u);
        engine_reset(&en);
        last[k].resize(g.vocab);
        prefill_mm_cpu(&m, &en.rs, &en.st, mp, last[k].data(), false);
        for (float v : last[k]) ASSERT_TRUE(std::isfinite(v));
        engine_free(&en);
    }
    EXPECT_GT(rel_l2(last[1].data(), last[0].data(), g.vocab), 1e-3);
    // an item whose rows are not the tower's is refused by name
    items[0].row_len = 768;
    EXPECT_FALSE(vision_inputs_of(g, items, &media, &err));
    EXPECT_NE(err.find("media item 0"), std::string::npos) << err;
}

// the cli end to end (build/test/ninfer --image --prompt --greedy) gives the greedy ids of the
// in-process chain: the corpus image preprocessed, the template's user turn (image first)
// expanded, tokenized, the tower and the engine with the model's stop ids; on the cpu path (--cpu,
// mm_prepare_cpu) and, with a gpu, on the gpu (mm_prepare_gpu: the same kernels, so the same ids).
// the ids are read from --print-token-ids ("[id 'piece']" per generated token on stderr).
static void cli_image_prompt_matches(const Model& m, const FrontendIds& fid, bool gpu) {
    const char* bin = "build/test/ninfer";
    ASSERT_TRUE(file_exists(bin)) << bin << " missing (make build/test/ninfer)";
    const std::string image = "test/media/png_c2_d8.png", question = "What is in the picture?";
    ASSERT_TRUE(file_exists(image));
    const int n_new = 12;
    // in process
    std::string err;
    VisionConfig cfg;
    ASSERT_TRUE(vision_config_parse(artifact_resource(&m.art, "frontend/preprocessor_config.json"),
                                    artifact_resource(&m.art, "frontend/video_preprocessor_config.json"), &cfg, &err)) << err;
    Image im;
    ASSERT_TRUE(media_image(image, MediaLimits(), &im, &err)) << err;
    std::vector<VisionItem> items(1);
    ASSERT_TRUE(vision_image(im, cfg, &items[0], &err)) << err;
    const std::string text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>" + question +
                             "<|im_end|>\n<|im_start|>assistant\n<think>\n";
    std::string expanded;
    ASSERT_TRUE(vision_expand_prompt(text, {&items[0]}, {}, cfg.merge, &expanded, &err)) << err;
    Tokenizer tok;
    std::string tj = artifact_resource(&m.art, "frontend/tokenizer.json");
    ASSERT_TRUE(tokenizer_load(&tok, tj.data(), tj.size(), &err)) << err;
    std::vector<int> ids;
    tokenizer_encode(&tok, expanded, &ids);
    std::vector<VisionInput> media;
    ASSERT_TRUE(vision_inputs_of(m.geo, items, &media, &err)) << err;
    MmPrompt mp;
    if (gpu) {
        GpuVision gv;
        ASSERT_TRUE(gpu_vision_build(&gv, &m, 1024, 0, &err)) << err;
        ASSERT_TRUE(mm_prepare_gpu(&gv, &m, fid.vision, ids, media, &mp, &err)) << err;
        gpu_vision_free(&gv);
    } else {
        ASSERT_TRUE(mm_prepare_cpu(&m, fid.vision, ids, media, &mp, &err)) << err;
    }
    Engine en;
    GpuOpts o; o.max_context = 2048; o.prefill_chunk = 1024; o.quiet = true;
    ASSERT_TRUE(engine_build(&en, &m, gpu, o, &err)) << err;
    Sampler smp; SamplerParams sp; sp.temperature = 0;
    sampler_build(&smp, sp, fid.domain);
    std::vector<int> stops;
    for (int id : fid.stops) if (id >= 0 && id < fid.domain) stops.push_back(id);
    std::vector<int> want;
    engine_generate(&en, &smp, mp.tokens, n_new, stops, nullptr, [&](int id) { want.push_back(id); }, GenCancel(), &mp);
    engine_free(&en);
    ASSERT_FALSE(want.empty());
    // through the cli
    const std::string errf = testing::TempDir() + (gpu ? "cli_image_ids_gpu.txt" : "cli_image_ids.txt");
    const std::string cmd = std::string(bin) + " " + m.art.path + (gpu ? "" : " --cpu") + " --greedy --raw-output --print-token-ids --max-new " +
                            std::to_string(n_new) + " --image " + image + " --prompt '" + question + "' > /dev/null 2> " + errf;
    ASSERT_EQ(system(cmd.c_str()), 0) << cmd;
    std::ifstream f(errf);
    std::stringstream ss; ss << f.rdbuf();
    const std::string log = ss.str();
    std::vector<int> got;
    for (size_t a = log.find("\n["); a != std::string::npos && a < log.size(); ) {  // after the prompt ids line
        a = log.find('[', a);
        if (a == std::string::npos) break;
        got.push_back(atoi(log.c_str() + a + 1));
        a = log.find("'][", a);
        if (a == std::string::npos) break;
        a += 2;
    }
    EXPECT_EQ(got, want) << log;
    // the prompt the cli reports is the in-process one, pads included
    std::string pl = "prompt ids:";
    for (int id : ids) pl += " " + std::to_string(id);
    EXPECT_NE(("\n" + log).find("\n" + pl + "\n"), std::string::npos) << log.substr(0, 400);  // the gpu path logs its upload first
}
TEST_P(VisionGolden, CliImagePromptMatchesTheEngine) { cli_image_prompt_matches(m, fid, false); }
TEST_P(VisionGolden, GpuCliImagePromptMatchesTheEngine) {
    NEED_GPU();
    cli_image_prompt_matches(m, fid, true);
}

// ---- the gpu tower (skipped without a gpu) ------------------------------------------------------
//
// every kernel against its cpu twin (the steps of vision_forward_cpu) on fresh random inputs,
// outputs poisoned (0xff: nan) before each run; then the whole tower against the cpu tower.
// bf16 outputs are compared within one bf16 ulp of the twin's value (2^-7 relative) plus a
// small absolute term: both compute the same fp32 expression in a different order (differences
// ~1e-7 of the terms' size), so the final rounding can land on the neighbouring bf16 value; and
// where the terms cancel (layernorm's x r w against its bias, rope's x0 c against x1 s) the
// result is near zero and that difference is absolute: 1e-5 covers terms up to ~10 (the inputs
// here are O(1); a first h200 run with relative ulps alone failed one layernorm element).

// a typed device buffer on test_util's Dev (poisoned with 0xff when made), filled from a vector
template <typename T> struct Buf {
    Dev d;
    T* p;
    size_t n;
    explicit Buf(size_t n_) : d(n_ * sizeof(T)), p((T*)d.p), n(n_) {}
    Buf(const std::vector<T>& v) : Buf(v.size()) { up(d, v); }
    std::vector<T> get() const { return down<T>(d, n); }
};

// fresh normal inputs each run: the stream mixes test_util's seed (printed; NINFER_SEED reproduces)
static std::vector<float> randn(size_t n, uint64_t stream, float scale = 1.0f) {
    std::mt19937_64 r(stream ^ test_seed());
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(r);
    return v;
}
static std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
    std::vector<uint16_t> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = f32_to_bf16(v[i]);
    return o;
}
static Vec host_vec(const std::vector<uint16_t>& w) { Vec v; v.format = FMT_BF16; v.n = (int64_t)w.size(); v.p = (const uint8_t*)w.data(); return v; }

// count of elements of a (bf16 results) farther than one bf16 ulp (+ abs) from b; nan counts
static size_t ulp_misses(const std::vector<float>& a, const std::vector<float>& b, double abs = 0.0) {
    size_t bad = 0;
    for (size_t i = 0; i < a.size(); i++)
        if (!(fabs((double)a[i] - b[i]) <= fabs((double)b[i]) * (1.0 / 128) + abs)) bad++;
    return bad;
}

static Geometry vis_geo(int D, int heads, int Iv, int out) {
    Geometry g;
    g.has_vision = true; g.v_dim = D; g.v_heads = heads; g.v_inter = Iv; g.v_out = out; g.v_pos = 2304; g.v_depth = 1;
    return g;
}

TEST(VisionGpu, LayerNormMatchesCpu) {
    NEED_GPU();
    for (int n : {128, 1152}) {
        const int T = 37;
        std::vector<float> x = randn((size_t)T * n, 1 + n, 3.0f);
        for (size_t i = 0; i < x.size(); i++) x[i] += 0.5f;  // a mean to remove
        std::vector<uint16_t> w = to_bf16(randn(n, 2, 1.0f)), b = to_bf16(randn(n, 3, 0.1f));
        std::vector<float> want((size_t)T * n);
        layernorm_rows(want.data(), x.data(), host_vec(w), host_vec(b), n, T, 1e-6f, true);
        Buf<float> dx(x); Buf<uint16_t> dw(w), db(b), dy((size_t)T * n);
        vis_layernorm(dx.p, (const bf16_t*)dw.p, (const bf16_t*)db.p, n, T, 1e-6f, (bf16_t*)dy.p, 0);
        EXPECT_EQ(ulp_misses(to_f32(dy.get()), want, 1e-5), 0u) << "n " << n;
    }
}

TEST(VisionGpu, EmbedMatchesCpu) {
    NEED_GPU();
    const int D = 128, t = 2, h = 6, w = 10, N = t * h * w;
    Geometry g = vis_geo(D, 2, 256, 128);
    std::vector<float> y = randn((size_t)N * D, 4);
    std::vector<uint16_t> bias = to_bf16(randn(D, 5, 0.1f)), table = to_bf16(randn((size_t)2304 * D, 6, 0.1f));
    Mat tm; tm.format = FMT_BF16; tm.rows = 2304; tm.cols = D; tm.base = (const uint8_t*)table.data(); tm.base_row = D * 2;
    std::vector<float> pe((size_t)h * w * D), want((size_t)N * D);
    vision_pos_rows(g, tm, h, w, pe.data());
    for (int p = 0; p < N; p++)
        for (int i = 0; i < D; i++) want[(size_t)p * D + i] = (y[(size_t)p * D + i] + bf16_to_f32(bias[i])) + pe[(size_t)(p % (h * w)) * D + i];
    Buf<float> dy(y), dx((size_t)N * D); Buf<uint16_t> db(bias), dt(table);
    vis_embed(dy.p, (const bf16_t*)db.p, (const bf16_t*)dt.p, D, 48, N, h, w, 2, dx.p, 0);
    std::vector<float> got = dx.get();
    EXPECT_LE(rel_max(got.data(), want.data(), got.size()), 1e-6);
    for (float v : got) ASSERT_TRUE(std::isfinite(v));
}

TEST(VisionGpu, QkvRopeMatchesCpu) {
    NEED_GPU();
    for (int D : {128, 1152}) {
        const int nh = D == 128 ? 2 : 16, h = 8, w = 12, t = 2, N = t * h * w, frame = h * w;
        Geometry g = vis_geo(D, nh, 256, 128);
        std::vector<float> y = randn((size_t)N * 3 * D, 7 + D);
        std::vector<uint16_t> bias = to_bf16(randn(3 * D, 8, 0.1f));
        std::vector<float> want = y;
        add_bias(want.data(), 3 * D, host_vec(bias), N);
        vision_rope(g, want.data(), N, w, frame);
        bf16_round(want.data(), want.size());
        Buf<float> dy(y); Buf<uint16_t> db(bias), dq((size_t)N * 3 * D);
        vis_qkv(dy.p, (const bf16_t*)db.p, D, nh, N, w, frame, 2, (bf16_t*)dq.p, 0);
        EXPECT_EQ(ulp_misses(to_f32(dq.get()), want, 1e-5), 0u) << "D " << D;
    }
}

TEST(VisionGpu, AttentionMatchesCpu) {
    NEED_GPU();
    for (int D : {128, 1152}) {
        const int nh = D == 128 ? 2 : 16, frame = 12 * 14, t = 2, N = t * frame;  // 168 rows: two query blocks, a partial key tile
        Geometry g = vis_geo(D, nh, 256, 128);
        std::vector<float> q = randn((size_t)N * 3 * D, 9 + D, 1.5f);
        bf16_round(q.data(), q.size());
        std::vector<float> want((size_t)N * D);
        vision_attention(g, q.data(), N, frame, want.data());
        bf16_round(want.data(), want.size());
        Buf<uint16_t> dq(to_bf16(q)), dout((size_t)N * D);
        vis_attn((const bf16_t*)dq.p, D, nh, N, frame, (bf16_t*)dout.p, 0);
        // the outputs are averages of unit values: an absolute 1e-5 covers the fp32 sums of cancelling terms
        EXPECT_EQ(ulp_misses(to_f32(dout.get()), want, 1e-5), 0u) << "D " << D;
    }
}

TEST(VisionGpu, BiasEpiloguesMatchCpu) {
    NEED_GPU();
    const int n = 96, T = 50;
    std::vector<float> y = randn((size_t)n * T, 10, 2.0f), x0 = randn((size_t)n * T, 11);
    std::vector<uint16_t> b = to_bf16(randn(n, 12, 0.5f));
    Buf<float> dy(y); Buf<uint16_t> db(b);
    for (int mode : {VIS_NONE, VIS_TANH, VIS_ERF, VIS_RESID}) {
        std::vector<float> want(y.size());
        for (size_t e = 0; e < y.size(); e++) {
            const float v = y[e] + bf16_to_f32(b[e % n]);
            want[e] = mode == VIS_RESID ? x0[e] + v : bf16r(mode == VIS_TANH ? gelu_tanh(v) : mode == VIS_ERF ? gelu_erf(v) : v);
        }
        Buf<float> dx(x0); Buf<uint16_t> dout((size_t)n * T);
        vis_bias(dy.p, (const bf16_t*)db.p, n, T, mode, dx.p, (bf16_t*)dout.p, 0);
        if (mode == VIS_RESID) {
            std::vector<float> got = dx.get();
            EXPECT_EQ(0, memcmp(got.data(), want.data(), got.size() * 4));
            continue;
        }
        EXPECT_EQ(ulp_misses(to_f32(dout.get()), want, 1e-6), 0u) << "mode " << mode;
        // rows padded to ldo: the values, then zeros
        const int ldo = n + 40;
        Buf<uint16_t> dpad((size_t)ldo * T);
        vis_bias(dy.p, (const bf16_t*)db.p, n, T, mode, nullptr, (bf16_t*)dpad.p, 0, ldo);
        std::vector<float> got = to_f32(dpad.get()), vals, pads;
        for (int r = 0; r < T; r++)
            for (int c = 0; c < ldo; c++) (c < n ? vals : pads).push_back(got[(size_t)r * ldo + c]);
        EXPECT_EQ(ulp_misses(vals, want, 1e-6), 0u) << "mode " << mode << " ldo " << ldo;
        EXPECT_EQ(ulp_misses(pads, std::vector<float>(pads.size(), 0.0f)), 0u) << "mode " << mode << " padding";
    }
}

// a random grouped matrix in the artifact's row-split layout: random codes everywhere (the
// padding lanes too), scales ~2^-8. host bytes; mat_from views them (or a device copy)
struct RandMat {
    TensorObject t;
    std::vector<uint8_t> bytes;
    RandMat(NumFormat f, int64_t rows, int64_t cols, uint64_t seed) {
        t.format = f; t.shape = {rows, cols}; t.layout = LAYOUT_ROW_SPLIT;
        uint64_t n = 0;
        EXPECT_TRUE(encoded_size(f, t.layout, t.shape, &n));
        bytes.resize(n);
        std::mt19937_64 r(seed);
        for (uint8_t& b : bytes) b = (uint8_t)r();
        Mat m = mat_from(&t, bytes.data());
        uint16_t* sc = (uint16_t*)m.scale;
        for (int64_t i = 0; i < rows * m.gpr; i++) sc[i] = (uint16_t)((sc[i] & 0x03FF) | 0x1C00);
    }
    Mat host() const { return mat_from(&t, bytes.data()); }
};

// products whose k is not a multiple of the gemm's 64 run over the stored padding (vis_linear)
// against zero-padded activation rows, whatever codes the padding holds: against the cpu's
// product over the real k, fp32 outputs within 1e-5 of the row's max (same exact products, fp32
// sums in another order). the 9b's fc2 shape (q5, k 4304) and an odd one.
TEST(VisionGpu, PaddedKProductMatchesCpu) {
    NEED_GPU();
    struct C { NumFormat f; int rows, cols, T; } cases[] = {{FMT_Q5, 64, 4304, 40}, {FMT_Q4, 48, 200, 33}, {FMT_W8, 16, 136, 9}};
    for (const C& c : cases) {
        RandMat rm(c.f, c.rows, c.cols, 21 + c.cols);
        Mat hm = rm.host();
        const int ldx = (int)vis_k(hm);
        EXPECT_EQ(ldx % 64, 0);
        std::vector<float> x((size_t)c.T * ldx, 0.0f);
        std::vector<float> xr = randn((size_t)c.T * c.cols, 22);
        for (int t = 0; t < c.T; t++) for (int k = 0; k < c.cols; k++) x[(size_t)t * ldx + k] = bf16r(xr[(size_t)t * c.cols + k]);
        std::vector<float> want((size_t)c.T * c.rows);
        matmul(want.data(), c.rows, x.data(), ldx, hm, c.T);
        Buf<uint8_t> dw(rm.bytes);
        Mat dm = mat_from(&rm.t, dw.p);
        Buf<uint16_t> dx(to_bf16(x));
        Buf<float> dy((size_t)c.T * c.rows);
        vis_linear(dm, (const bf16_t*)dx.p, ldx, c.T, dy.p, c.rows, 0);
        std::vector<float> got = dy.get();
        for (float v : got) ASSERT_TRUE(std::isfinite(v)) << format_name(c.f);
        EXPECT_LE(rel_max(got.data(), want.data(), got.size()), 1e-5) << format_name(c.f) << " k " << c.cols;
    }
}


// the whole gpu tower on the golden cases against the cpu tower, in fp32 and in its bf16 mode
// (the same rounding points). measured on the h200 (max err / max|ref|, relative l2 of the
// merged rows): vs fp32 3.8e-3..6.2e-3 / 4.3e-3..5.0e-3; vs the bf16 mode 2.9e-3..6.6e-3 /
// 1.5e-3..4.8e-3, hardly closer: this random-weight tower amplifies any perturbation to the
// bf16 noise level (on the cpu, pixels perturbed by 1e-5 relative move the bf16 mode's merged
// rows by 5.5e-3 l2, its last hidden by 3.3e-3; the bf16 mode itself sits 4.8e-3 from fp32), so
// a rounding the two sides take the other way (fp32 sums in another order) is enough. bounds:
// 3e-2 / 1e-2 against the bf16 mode, 6e-2 / 2e-2 against fp32 (the bf16 roundings of every
// product's input, ~2e-3 relative per element, through 2 blocks and the merger).
TEST_P(VisionGolden, GpuTowerMatchesCpu) {
    NEED_GPU();
    const Geometry& g = m.geo;
    GpuVision gv;
    std::string err;
    ASSERT_TRUE(gpu_vision_build(&gv, &m, 1024, 0, &err)) << err;
    for (auto& kv : gold.get("tower")->obj) {
        Media md = tower_media(g, kv.second, kv.first == "video");
        for (size_t k = 0; k < md.items.size(); k++) {
            const VisionInput& in = md.items[k];
            const int M = vision_tokens(g, in);
            std::vector<float> ref32((size_t)M * g.v_out), ref16((size_t)M * g.v_out);
            ASSERT_TRUE(vision_forward_cpu(&m, in, ref32.data(), &err)) << err;
            ASSERT_TRUE(vision_forward_cpu(&m, in, ref16.data(), &err, nullptr, nullptr, true)) << err;
            Buf<uint16_t> out((size_t)M * g.v_out);
            ASSERT_TRUE(gpu_vision_forward(&gv, in, (bf16_t*)out.p, &err)) << err;
            cudaCheck(cudaDeviceSynchronize());
            std::vector<float> got = to_f32(out.get());
            double m16 = rel_max(got.data(), ref16.data(), got.size()), l16 = rel_l2(got.data(), ref16.data(), got.size());
            double m32 = rel_max(got.data(), ref32.data(), got.size()), l32 = rel_l2(got.data(), ref32.data(), got.size());
            printf("  %s gpu tower %s[%zu]: vs cpu bf16 mode max %.2e l2 %.2e; vs cpu fp32 max %.2e l2 %.2e\n", GetParam(), kv.first.c_str(), k,
                   m16, l16, m32, l32);
            EXPECT_TRUE(std::isfinite(l16) && std::isfinite(l32)) << kv.first;
            EXPECT_LE(m16, 3e-2) << kv.first; EXPECT_LE(l16, 1e-2) << kv.first;
            EXPECT_LE(m32, 6e-2) << kv.first; EXPECT_LE(l32, 2e-2) << kv.first;
        }
    }
    std::vector<float> px((size_t)2048 * vision_patch_len(g));
    VisionInput big; big.t = 1; big.h = 32; big.w = 64; big.pixels = px.data();
    Buf<uint16_t> o(16);
    EXPECT_FALSE(gpu_vision_forward(&gv, big, (bf16_t*)o.p, &err));
    EXPECT_NE(err.find("the vision workspace holds 1024"), std::string::npos) << err;
    gpu_vision_free(&gv);
}

// the gpu engine prefills a multimodal prompt (the gpu tower's rows, mm_prepare_gpu; hf's
// positions) and goes on at rope_delta: its prompt logits against the cpu engine's (the cpu
// tower's rows), per row as relative l2, beside the same gpu run without the multimodal prompt
// (pads as tokens, text positions), which shows what a lost row or position costs. measured on
// the h200 (worst row): 8.8e-2 (bf16) and 5.0e-2 (groupwise-int), the control 1.5; the gpu
// text path on tiny already sits ~3e-2 from fp32 (test_gpu: the random model amplifies bf16
// roundings) and here the tower's rows add their own (4.7e-3 l2 from the cpu's). bound 0.2,
// and a fifth of the control.
TEST_P(VisionGolden, GpuEngineGeneratesFromMedia) {
    NEED_GPU();
    const int V = m.geo.vocab, domain = (int)gold.get("token_domain")->i;
    const Json& p = *gold.get("prompts")->get("image_video");
    Media md = prompt_media(p);
    MmPrompt mp;
    std::string err;
    ASSERT_TRUE(mm_prepare_cpu(&m, fid.vision, ints(p.get("ids")), md.items, &mp, &err)) << err;
    const int L = (int)mp.tokens.size();
    GpuVision gv;
    ASSERT_TRUE(gpu_vision_build(&gv, &m, 256, 0, &err)) << err;
    MmPrompt mg;
    ASSERT_TRUE(mm_prepare_gpu(&gv, &m, fid.vision, ints(p.get("ids")), md.items, &mg, &err)) << err;
    gpu_vision_free(&gv);
    EXPECT_EQ(mg.pos3, mp.pos3);
    ASSERT_EQ(mg.rows.size(), mp.rows.size());
    printf("  %s gpu tower rows vs the cpu's: rel l2 %.2e\n", GetParam(), rel_l2(mg.rows.data(), mp.rows.data(), mp.rows.size()));
    std::vector<float> lg[3];
    std::vector<int> ids[3];
    for (int run = 0; run < 3; run++) {  // cpu with media, gpu with media, gpu without
        Engine en;
        GpuOpts o; o.max_context = 128; o.prefill_chunk = 32; o.quiet = true;
        ASSERT_TRUE(engine_build(&en, &m, run > 0, o, &err)) << err;
        Sampler smp; SamplerParams sp; sp.temperature = 0;
        sampler_build(&smp, sp, domain);
        FILE* f = tmpfile();
        ASSERT_TRUE(f);
        GenTap tap;  // the prompt's rows to the file, as --logits-out writes them
        tap.prompt_rows = [](void* fp, const float* lg, int T, int vocab) {
            CHECK(fwrite(lg, sizeof(float) * vocab, T, (FILE*)fp) == (size_t)T, "writing logits");
        };
        tap.ctx = f;
        engine_generate(&en, &smp, mp.tokens, 4, {}, &tap, [&](int id) { ids[run].push_back(id); }, GenCancel(),
                        run == 0 ? &mp : run == 1 ? &mg : nullptr);
        lg[run].resize((size_t)L * V);
        rewind(f);
        ASSERT_EQ(fread(lg[run].data(), sizeof(float) * V, L, f), (size_t)L);
        fclose(f);
        engine_free(&en);
    }
    double d_mm = 0, d_plain = 0;
    for (int r = 0; r < L; r++) {
        const float* c = lg[0].data() + (size_t)r * V;
        d_mm = std::max(d_mm, rel_l2(lg[1].data() + (size_t)r * V, c, V));
        d_plain = std::max(d_plain, rel_l2(lg[2].data() + (size_t)r * V, c, V));
    }
    printf("  %s gpu engine, media prompt of %d rows: worst row rel l2 vs the cpu %.2e (without the media rows and positions: %.2e); "
           "greedy ids %s the cpu's\n", GetParam(), L, d_mm, d_plain, ids[0] == ids[1] ? "equal" : "differ from");
    EXPECT_LE(d_mm, 0.2);
    EXPECT_LE(d_mm, d_plain / 5);
    EXPECT_EQ(ids[0], ints(p.get("decode")->get("ids")));  // the cpu engine: hf's tokens
}

// tower timing at the 9b's vision geometry (depth 27, 1152 wide, 16 heads of 72, mlp 4304,
// out 4096) with random weights in the artifact's formats (format.md 8.5: q6 patch embedding,
// q4 qkv / fc1, q5 output / fc2, w8 merger; bf16 positions, biases, norms): one 1024 x 1024
// image (64 x 64 patches) and a 16-frame video (8 temporal patches of 22 x 40, 640 x 352).
// not a ci test: build/test/test_tower --gtest_also_run_disabled_tests --gtest_filter='*Bench*'
__global__ void bench_fill_kernel(bf16_t* p, int64_t n, uint64_t seed, float scale) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ull + seed;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull; z = (z ^ (z >> 27)) * 0x94D049BB133111EBull; z ^= z >> 31;
        p[i] = __float2bfloat16(((float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale);
    }
}
TEST(VisionGpuBench, DISABLED_Tower9b) {
    NEED_GPU();
    GpuVision v;
    v.geo = vis_geo(1152, 16, 4304, 4096);
    v.geo.v_depth = 27;
    const Geometry& g = v.geo;
    std::vector<void*> allocs;
    uint64_t seed = 1;
    auto buf = [&](int64_t n, float scale) {
        bf16_t* p; cudaCheck(cudaMalloc(&p, n * 2)); allocs.push_back(p);
        bench_fill_kernel<<<1024, 256>>>(p, n, seed++ * 7919, scale);
        return p;
    };
    std::vector<RandMat*> qmats;
    auto qmat = [&](NumFormat f, int64_t r, int64_t c) {
        qmats.push_back(new RandMat(f, r, c, seed++));
        uint8_t* d; cudaCheck(cudaMalloc(&d, qmats.back()->bytes.size())); allocs.push_back(d);
        cudaCheck(cudaMemcpy(d, qmats.back()->bytes.data(), qmats.back()->bytes.size(), cudaMemcpyHostToDevice));
        Mat x = mat_from(&qmats.back()->t, d);
        delete qmats.back(); qmats.pop_back();  // the views keep only device pointers
        return x;
    };
    auto mat = [&](int64_t r, int64_t c) {
        Mat x; x.format = FMT_BF16; x.rows = r; x.cols = c; x.base_row = c * 2; x.base = (const uint8_t*)buf(r * c, 1.0f / sqrtf((float)c)); return x;
    };
    auto vec = [&](int64_t n, float scale) { Vec x; x.format = FMT_BF16; x.n = n; x.p = (const uint8_t*)buf(n, scale); return x; };
    const int64_t D = g.v_dim, Iv = g.v_inter;
    v.w.patch_embedding = qmat(FMT_Q6, D, vision_patch_len(g)); v.w.patch_bias = vec(D, 0.02f); v.w.position_embedding = mat(2304, D);
    v.w.layers.resize(g.v_depth);
    for (VisionLayerWeights& L : v.w.layers) {
        L.qkv = qmat(FMT_Q4, 3 * D, D); L.qkv_bias = vec(3 * D, 0.02f); L.output = qmat(FMT_Q5, D, D); L.output_bias = vec(D, 0.02f);
        L.fc1 = qmat(FMT_Q4, Iv, D); L.fc1_bias = vec(Iv, 0.02f); L.fc2 = qmat(FMT_Q5, D, Iv); L.fc2_bias = vec(D, 0.02f);
        L.norm1_w = vec(D, 1.0f); L.norm1_b = vec(D, 0.05f); L.norm2_w = vec(D, 1.0f); L.norm2_b = vec(D, 0.05f);
    }
    v.w.merger_fc1 = qmat(FMT_W8, 4 * D, 4 * D); v.w.merger_fc1_bias = vec(4 * D, 0.02f); v.w.merger_fc2 = qmat(FMT_W8, g.v_out, 4 * D);
    v.w.merger_fc2_bias = vec(g.v_out, 0.02f); v.w.merger_norm_w = vec(D, 1.0f); v.w.merger_norm_b = vec(D, 0.05f);
    gpu_vision_workspace(&v, 7040);
    cudaCheck(cudaStreamCreate(&v.stream));
    struct Case { const char* name; int t, h, w; } cases[] = {{"image 1024x1024", 1, 64, 64}, {"video 16 frames 640x352", 8, 22, 40}};
    for (const Case& c : cases) {
        const int N = c.t * c.h * c.w;
        std::vector<float> px = randn((size_t)N * vision_patch_len(g), 13, 0.5f);
        VisionInput in; in.video = c.t > 1; in.t = c.t; in.h = c.h; in.w = c.w; in.pixels = px.data();
        Buf<uint16_t> out((size_t)vision_tokens(g, in) * g.v_out);
        std::string err;
        ASSERT_TRUE(gpu_vision_forward(&v, in, (bf16_t*)out.p, &err)) << err;  // warm-up
        cudaCheck(cudaStreamSynchronize(v.stream));
        cudaEvent_t e0, e1;
        cudaCheck(cudaEventCreate(&e0)); cudaCheck(cudaEventCreate(&e1));
        const int reps = 3;
        cudaCheck(cudaEventRecord(e0, v.stream));
        for (int r = 0; r < reps; r++) ASSERT_TRUE(gpu_vision_forward(&v, in, (bf16_t*)out.p, &err)) << err;
        cudaCheck(cudaEventRecord(e1, v.stream));
        cudaCheck(cudaEventSynchronize(e1));
        float ms = 0;
        cudaCheck(cudaEventElapsedTime(&ms, e0, e1));
        std::vector<float> o = to_f32(out.get());
        size_t bad = 0;
        for (float x : o) bad += !std::isfinite(x);
        EXPECT_EQ(bad, 0u);
        printf("  9b vision tower, q4/q5/q6/w8 weights, %s: %d patches -> %d tokens, %.2f ms per item (mean of %d)\n", c.name, N,
               vision_tokens(g, in), ms / reps, reps);
    }
    for (void* p : allocs) cudaFree(p);
    cudaFree(v.ws);
    cudaStreamDestroy(v.stream);
}

INSTANTIATE_TEST_SUITE_P(Hf, VisionGolden, ::testing::Values("bf16", "groupwise-int"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param) == "bf16" ? "bf16" : "groupwise_int"; });

// the media cache (--media-cache-mib): an item the tower encoded before (same grid and pixel
// rows) takes its rows from the cache, identical, without the tower; least recently used
// entries are evicted to stay under the cap; a cap of 0 keeps nothing
TEST(MediaCache, LaterTurnsSkipTheTower) {
    const std::string path = artifact_path("bf16");
    ASSERT_TRUE(file_exists(path)) << path;
    for (int64_t cap_mib : {64, 0}) {
        TextModel t;
        std::string err;
        ASSERT_TRUE(text_model_open(&t, path.c_str(), &err)) << err;
        TextVision v;
        v.cache_cap = cap_mib << 20;
        ASSERT_TRUE(text_vision_open(&t, v, &err)) << err;
        GpuOpts o; o.max_context = 2048; o.quiet = true;
        ASSERT_TRUE(text_model_start(&t, true, o, "test", &err)) << err;
        auto run = [&](std::vector<std::string> images, MmPrompt* mm) {
            std::string parts;
            for (const std::string& im : images) parts += "{\"type\": \"image\", \"image\": \"test/media/" + im + "\"},";
            Json msgs;
            ASSERT_TRUE(json_parse("[{\"role\": \"user\", \"content\": [" + parts + "{\"type\": \"text\", \"text\": \"hi\"}]}]", &msgs, &err)) << err;
            TextRequest rq;
            MediaPrompt mp;
            ChatOptions co;
            ASSERT_TRUE(text_prompt(&t, msgs, nullptr, co, nullptr, &rq, &mp, &err)) << err;
            ASSERT_TRUE(text_media_tower(&t, rq.prompt, mp, mm, &err)) << err;
        };
        MmPrompt a, b, c;
        run({"jpg_444_53x37.jpg"}, &a);
        run({"jpg_444_53x37.jpg"}, &b);  // a later turn with the same image
        if (cap_mib) {
            EXPECT_EQ(t.vis.cache_misses, 1);
            EXPECT_EQ(t.vis.cache_hits, 1);
        } else {
            EXPECT_EQ(t.vis.cache_misses + t.vis.cache_hits, 0);
            EXPECT_TRUE(t.vis.cache.empty());
        }
        EXPECT_EQ(a.rows, b.rows);
        run({"png_c2_d8.png", "jpg_444_53x37.jpg"}, &c);  // one new, one cached
        if (cap_mib) { EXPECT_EQ(t.vis.cache_misses, 2); EXPECT_EQ(t.vis.cache_hits, 2); }
        // the cached rows are the tower's: the image's rows of c are a's
        ASSERT_GE(c.rows.size(), a.rows.size());
        EXPECT_TRUE(std::equal(a.rows.begin(), a.rows.end(), c.rows.end() - (long)a.rows.size()));
        if (cap_mib) {  // a cap holding one item's rows: the older entry goes
            t.vis.cache.clear(); t.vis.cache_bytes = 0;
            t.vis.cache_cap = (int64_t)std::max(a.rows.size(), c.rows.size() - a.rows.size()) * 4;  // either, not both
            t.vis.cache_hits = t.vis.cache_misses = 0;
            MmPrompt d;
            run({"jpg_444_53x37.jpg"}, &d);
            run({"png_c2_d8.png"}, &d);  // evicts the jpeg
            run({"jpg_444_53x37.jpg"}, &d);
            EXPECT_EQ(t.vis.cache_hits, 0);
            EXPECT_LE(t.vis.cache_bytes, t.vis.cache_cap);
            EXPECT_EQ(d.rows, a.rows);
        }
        text_model_close(&t);
    }
}
