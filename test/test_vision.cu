// tests for the vision tower and the multimodal prompt on the cpu reference path (ninfer.cu 4.7,
// 4.8): the tower alone and whole multimodal prompts against hugging face goldens
// (test/golden/hf_vision_tiny_<profile>.{json,f32}, written by test/reference/make_vision_goldens.py),
// hf's own m-rope positions and rope_delta, and the refusals of prompts that do not match their media.
//
// run from the repo root; the artifacts come from `make models` (convert.py --synthetic).
// NINFER_GOLDEN_DIR overrides test/golden.
#define NINFER_TESTING
#include "../ninfer.cu"
#include <gtest/gtest.h>
#include <fstream>
#include <sstream>
#include <sys/stat.h>

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
    std::vector<float> px((size_t)2 * 4 * 6 * vision_patch_len(g), 0.5f);
    const double secs[2] = {0.25, 1.75};
    VisionInput img, vid;
    img.t = 1; img.h = 4; img.w = 6; img.pixels = px.data();
    vid.video = true; vid.t = 2; vid.h = 4; vid.w = 6; vid.pixels = px.data(); vid.seconds = secs;
    const std::string S = "<|vision_start|>", E = "<|vision_end|>", I = "<|image_pad|>", P = "<|video_pad|>";
    std::string text = "a " + S + I + E + " b: " + S + P + E + "c", out, err;
    ASSERT_TRUE(mm_expand_text(g, text, {img, vid}, &out, &err)) << err;
    auto rep = [](const std::string& x, int n) { std::string r; while (n--) r += x; return r; };
    std::string want = "a " + S + rep(I, 6) + E + " b: " + "<0.2 seconds>" + S + rep(P, 6) + E + "<1.8 seconds>" + S + rep(P, 6) + E + "c";
    EXPECT_EQ(out, want);
    // a bare video pad is replaced the same way; an image pad is never a video's
    ASSERT_TRUE(mm_expand_text(g, "x" + P + "y", {vid}, &out, &err)) << err;
    EXPECT_EQ(out, "x<0.2 seconds>" + S + rep(P, 6) + E + "<1.8 seconds>" + S + rep(P, 6) + E + "y");
    EXPECT_FALSE(mm_expand_text(g, text, {img}, &out, &err));
    EXPECT_NE(err.find("more video placeholders"), std::string::npos) << err;
    EXPECT_FALSE(mm_expand_text(g, text, {img, vid, img}, &out, &err));
    EXPECT_NE(err.find("placeholders for 1 of 2 images"), std::string::npos) << err;
    vid.seconds = nullptr;
    EXPECT_FALSE(mm_expand_text(g, text, {img, vid}, &out, &err));
    EXPECT_NE(err.find("without frame times"), std::string::npos) << err;
    vid.seconds = secs;
    // tokenized with the artifact's tokenizer: a layout with 6 + 2 * 6 vision rows
    Tokenizer tok;
    std::string tj = artifact_resource(&m.art, "frontend/tokenizer.json");
    ASSERT_TRUE(tokenizer_load(&tok, tj.data(), tj.size(), &err)) << err;
    ASSERT_TRUE(mm_expand_text(g, text, {img, vid}, &out, &err)) << err;
    std::vector<int> ids;
    tokenizer_encode(&tok, out, &ids);
    MmPrompt mp;
    ASSERT_TRUE(mm_layout(g, fid.vision, ids, {img, vid}, &mp, &err)) << err;
    EXPECT_EQ(std::count(mp.ids.begin(), mp.ids.end(), -1), 18);
}

INSTANTIATE_TEST_SUITE_P(Hf, VisionGolden, ::testing::Values("bf16", "groupwise-int"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param) == "bf16" ? "bf16" : "groupwise_int"; });
