// tests for format.h (json, numbers, the container, row-split decoding) and for the
// artifact -> geometry -> weights binding in ninfer.cu. run from the repo root; the
// synthetic artifacts come from `make models` (convert.py).
#define NINFER_TESTING
#include "../ninfer.cu"
#include <gtest/gtest.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <random>
#include <fstream>
#include <sstream>

// ---- helpers -------------------------------------------------------------------

static std::vector<uint8_t> read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
static bool file_exists(const std::string& p) { struct stat st; return stat(p.c_str(), &st) == 0; }

// assemble a container: prefix, json, zero padding to 4096, payload
static std::vector<uint8_t> make_container(int version, const std::string& json, const std::vector<uint8_t>& payload) {
    std::vector<uint8_t> out = {'N', 'I', 'N', 'F', 'E', 'R', 0, (uint8_t)version};
    uint64_t n = json.size();
    for (int k = 0; k < 8; k++) out.push_back((uint8_t)(n >> (8 * k)));
    out.insert(out.end(), json.begin(), json.end());
    out.resize(align_up(out.size(), 4096), 0);
    out.insert(out.end(), payload.begin(), payload.end());
    return out;
}

static bool open_bytes(const std::vector<uint8_t>& bytes, Artifact* a, std::string* err) {
    return artifact_open_memory(a, bytes.data(), bytes.size(), "mem.ninfer", err);
}

// a small valid v2 directory: one resource, a bf16 matrix, a q5 matrix with a partial group
static std::string base_json() {
    return R"({"identity":{"model_id":"m","weights_id":"w"},"objects":[)"
           R"({"name":"frontend/x","kind":"resource","encoding":"raw-bytes-v1","offset":0,"bytes":10},)"
           R"({"name":"a","kind":"tensor","shape":[4,8],"format":"BF16","layout":"contiguous-le-v1","offset":256,"bytes":64},)"
           R"({"name":"q","kind":"tensor","shape":[2,130],"format":"Q5G64_F16S","layout":"row-split-k128-v1","offset":512,"bytes":528}]})";
}
static std::vector<uint8_t> base_payload() { return std::vector<uint8_t>(512 + 528, 0); }

// ---- json ------------------------------------------------------------------------

TEST(Json, ParsesValuesAndKeepsOrder) {
    Json v; std::string err;
    ASSERT_TRUE(json_parse(R"( {"b":1,"a":[true,false,null,-0.5e3,"x\u00e9\ud83d\ude00"],"c":{}} )", &v, &err)) << err;
    ASSERT_TRUE(v.is_object());
    EXPECT_EQ(v.obj[0].first, "b");
    EXPECT_EQ(v.obj[1].first, "a");
    EXPECT_TRUE(v.get("b")->is_int);
    EXPECT_EQ(v.get("b")->i, 1);
    const Json* a = v.get("a");
    EXPECT_TRUE(a->arr[0].b);
    EXPECT_TRUE(a->arr[2].is_null());
    EXPECT_DOUBLE_EQ(a->arr[3].num, -500.0);
    EXPECT_FALSE(a->arr[3].is_int);
    EXPECT_EQ(a->arr[4].str, "x\xc3\xa9\xf0\x9f\x98\x80");
    EXPECT_EQ(v.get("missing"), nullptr);
}

TEST(Json, ExactIntegers) {
    Json v; std::string err;
    ASSERT_TRUE(json_parse("[9223372036854775807,-9223372036854775808,9223372036854775808,12345678901234567]", &v, &err));
    EXPECT_TRUE(v.arr[0].is_int); EXPECT_EQ(v.arr[0].i, INT64_MAX);
    EXPECT_TRUE(v.arr[1].is_int); EXPECT_EQ(v.arr[1].i, INT64_MIN);
    EXPECT_FALSE(v.arr[2].is_int);  // does not fit: kept as text and double
    EXPECT_EQ(v.arr[2].str, "9223372036854775808");
    EXPECT_EQ(v.arr[3].i, 12345678901234567LL);  // beyond double precision, still exact
}

TEST(Json, RejectsMalformedInput) {
    const char* bad[] = {
        "", "   ", "{", "[1,]", "{\"a\":1,}", "01", "-", "1.", ".5", "1e", "+1", "NaN", "Infinity",
        "[1 2]", "{\"a\" 1}", "{a:1}", "'x'", "\"abc", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"",
        "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"a\tb\"", "tru", "nul", "[1]x", "{}{}", "\"\xff\"",
        "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xe2\x82\"",
    };
    for (const char* s : bad) {
        Json v; std::string err;
        EXPECT_FALSE(json_parse(s, strlen(s), &v, &err)) << "accepted: " << s;
        EXPECT_FALSE(err.empty());
    }
}

TEST(Json, DeepNestingIsAnErrorNotACrash) {
    std::string deep(100000, '[');
    Json v; std::string err;
    EXPECT_FALSE(json_parse(deep, &v, &err));
    EXPECT_NE(err.find("nesting too deep"), std::string::npos);
    std::string ok = std::string(64, '[') + std::string(64, ']');
    EXPECT_TRUE(json_parse(ok, &v, &err, 64)) << err;
    std::string over = std::string(65, '[') + std::string(65, ']');
    EXPECT_FALSE(json_parse(over, &v, &err, 64));
}

TEST(Json, WriterRoundTrips) {
    const char* src = R"({"k":"a\"b\\c\n\u0001\u00e9","n":[1,-2.5,1e300,0],"o":{"z":null,"y":true}})";
    Json v, w; std::string err;
    ASSERT_TRUE(json_parse(src, &v, &err));
    std::string out = json_dump(v);
    EXPECT_EQ(out, "{\"k\":\"a\\\"b\\\\c\\n\\u0001\xc3\xa9\",\"n\":[1,-2.5,1e300,0],\"o\":{\"z\":null,\"y\":true}}");
    ASSERT_TRUE(json_parse(out, &w, &err));
    EXPECT_EQ(json_dump(w), out);
    std::string ascii;
    json_escape(&ascii, std::string("\xc3\xa9\xf0\x9f\x98\x80"), true);
    EXPECT_EQ(ascii, "\"\\u00e9\\ud83d\\ude00\"");
    std::string del;
    json_escape(&del, std::string("a\x7f\x1f"));
    EXPECT_EQ(del, "\"a\x7f\\u001f\"");  // like python's json.dumps: DEL raw, controls escaped
    EXPECT_EQ(json_dump(Json::number(0.1)), "0.1");
    EXPECT_EQ(json_dump(Json::integer(-7)), "-7");
}

// ---- numbers -----------------------------------------------------------------------

TEST(Numbers, F16RoundTripsEveryWord) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = f16_to_f32((uint16_t)h);
        float ref = __half2float(__ushort_as_half((unsigned short)h));
        if (isnan(ref)) { EXPECT_TRUE(isnan(f)); continue; }
        ASSERT_EQ(f, ref) << "word " << h;
        ASSERT_EQ(f32_to_f16(f), (uint16_t)h) << "word " << h;
    }
}

TEST(Numbers, F32ToF16AndBf16RoundNearestEven) {
    std::mt19937 rng(1234);
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = rng();
        float f; memcpy(&f, &u, 4);
        if (isnan(f)) continue;
        uint16_t want = __half_as_ushort(__float2half_rn(f));
        ASSERT_EQ(f32_to_f16(f), want) << "bits " << std::hex << u;
        uint16_t wantb = __bfloat16_as_ushort(__float2bfloat16_rn(f));
        ASSERT_EQ(f32_to_bf16(f), wantb) << "bits " << std::hex << u;
        // values near the fp16 range and the subnormal boundary
        float g = ldexpf((float)(u & 0xfffff) / (1 << 20) + 1.0f, (int)(u >> 28) - 26);
        ASSERT_EQ(f32_to_f16(g), __half_as_ushort(__float2half_rn(g)));
    }
}

// ---- container -----------------------------------------------------------------------

TEST(Container, WorkedSizeExamples) {  // format.md 7.3
    struct { NumFormat f; int64_t n, k; uint64_t bytes; } rows[] = {
        {FMT_Q5, 2, 130, 528}, {FMT_Q6, 248320, 4096, 794624000}, {FMT_Q4, 5120, 4096, 11141120},
        {FMT_Q5, 5120, 4096, 13762560}, {FMT_Q5, 8192, 4096, 22020096}, {FMT_Q4, 24576, 4096, 53477376},
        {FMT_Q5, 4096, 12288, 33030144}, {FMT_W8, 10240, 4096, 44564480}, {FMT_Q4, 131072, 4096, 285212672},
        {FMT_Q5, 1152, 4304, 3290112},
    };
    for (auto& r : rows) {
        uint64_t b = 0;
        ASSERT_TRUE(encoded_size(r.f, LAYOUT_ROW_SPLIT, {r.n, r.k}, &b));
        EXPECT_EQ(b, r.bytes) << format_name(r.f) << " [" << r.n << "," << r.k << "]";
    }
    uint64_t b = 0;
    ASSERT_TRUE(encoded_size(FMT_I32, LAYOUT_CONTIGUOUS, {131072}, &b));
    EXPECT_EQ(b, 524288u);
    ASSERT_TRUE(encoded_size(FMT_BF16, LAYOUT_CONTIGUOUS, {}, &b));  // scalar
    EXPECT_EQ(b, 2u);
    EXPECT_FALSE(encoded_size(FMT_Q4, LAYOUT_ROW_SPLIT, {4, 4, 4}, &b));    // rank 2 only
    EXPECT_FALSE(encoded_size(FMT_Q4, LAYOUT_CONTIGUOUS, {4, 64}, &b));     // not its layout
    EXPECT_FALSE(encoded_size(FMT_BF16, LAYOUT_CONTIGUOUS, {1LL << 40, 1LL << 40}, &b));  // overflow
}

TEST(Container, OpensAValidFile) {
    auto bytes = make_container(2, base_json(), base_payload());
    Artifact a; std::string err;
    ASSERT_TRUE(open_bytes(bytes, &a, &err)) << err;
    EXPECT_EQ(a.version, 2);
    EXPECT_EQ(a.model_id, "m");
    EXPECT_EQ(a.weights_id, "w");
    EXPECT_EQ(a.payload_offset, 4096u);
    ASSERT_EQ(a.objects.size(), 3u);
    const TensorObject* q = artifact_find(&a, "q");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->data, bytes.data() + 4096 + 512);
    EXPECT_EQ(artifact_resource(&a, "frontend/x").size(), 10u);
    // v1: a different magic byte and root
    std::string v1 = base_json();
    v1.replace(0, strlen(R"({"identity":{"model_id":"m","weights_id":"w"},)"), R"({"model_id":"m",)");
    auto b1 = make_container(1, v1, base_payload());
    ASSERT_TRUE(open_bytes(b1, &a, &err)) << err;
    EXPECT_EQ(a.version, 1);
    EXPECT_EQ(a.weights_id, "");
}

// each corruption must fail with one line that names what is wrong
TEST(Container, RejectsCorruptions) {
    struct Case { const char* what; std::string from, to; const char* expect; };
    std::vector<Case> cases = {
        {"unknown format", "\"BF16\"", "\"BF17\"", "unknown numeric format 'BF17'"},
        {"unknown layout", "row-split-k128-v1", "row-split-k64-v1", "unknown tensor layout"},
        {"wrong layout for format", "\"BF16\",\"layout\":\"contiguous-le-v1\"", "\"BF16\",\"layout\":\"row-split-k128-v1\"", "cannot use layout"},
        {"bytes mismatch", "\"bytes\":528", "\"bytes\":527", "needs 528"},
        {"misaligned tensor", "\"offset\":512", "\"offset\":520", "not 256-byte aligned"},
        {"overlap", "\"offset\":512", "\"offset\":256", "overlaps"},
        {"past end", "\"offset\":512", "\"offset\":768", "past the end"},
        {"float offset", "\"offset\":256", "\"offset\":256.0", "offset must be an integer"},
        {"negative offset", "\"offset\":0", "\"offset\":-1", "offset must be an integer"},
        {"zero bytes", "\"bytes\":10", "\"bytes\":0", "bytes must be an integer > 0"},
        {"bool shape", "[4,8]", "[4,true]", "positive integers"},
        {"zero dim", "[4,8]", "[0,8]", "positive integers"},
        {"extra member", "\"kind\":\"tensor\",\"shape\":[4,8]", "\"kind\":\"tensor\",\"x\":1,\"shape\":[4,8]", "exactly the members"},
        {"missing member", ",\"layout\":\"contiguous-le-v1\"", "", "exactly the members"},
        {"null member", "\"format\":\"BF16\"", "\"format\":null", "format and layout must be strings"},
        {"duplicate name", "\"name\":\"q\"", "\"name\":\"a\"", "duplicate object name"},
        {"unknown kind", "\"kind\":\"resource\"", "\"kind\":\"blob\"", "unknown kind"},
        {"unknown encoding", "raw-bytes-v1", "raw-bytes-v2", "unknown resource encoding"},
        {"empty name", "\"name\":\"a\"", "\"name\":\"\"", "name must be a non-empty string"},
        {"identity member", "\"weights_id\":\"w\"", "\"weights_id\":\"w\",\"x\":\"y\"", "identity must have exactly"},
        {"empty weights id", "\"weights_id\":\"w\"", "\"weights_id\":\"\"", "identity must have exactly"},
        {"root member", "\"objects\":[", "\"extra\":1,\"objects\":[", "exactly the members identity and objects"},
        {"not json", "{\"identity\"", "{identity", "not valid json"},
        {"unsupported format", "\"Q5G64_F16S\"", "\"NVFP4\"", "not supported by this build"},
    };
    for (auto& c : cases) {
        std::string js = base_json();
        size_t at = js.find(c.from);
        ASSERT_NE(at, std::string::npos) << c.what;
        js.replace(at, c.from.size(), c.to);
        auto bytes = make_container(2, js, base_payload());
        Artifact a; std::string err;
        EXPECT_FALSE(open_bytes(bytes, &a, &err)) << c.what;
        EXPECT_NE(err.find(c.expect), std::string::npos) << c.what << ": got '" << err << "'";
        EXPECT_EQ(err.find('\n'), std::string::npos) << c.what;
        EXPECT_EQ(err.rfind("mem.ninfer: ", 0), 0u) << c.what << ": " << err;
    }
    // framing
    auto good = make_container(2, base_json(), base_payload());
    Artifact a; std::string err;
    auto b = good; b[0] = 'X';
    EXPECT_FALSE(open_bytes(b, &a, &err)); EXPECT_NE(err.find("bad magic"), std::string::npos);
    b = good; b[7] = 3;
    EXPECT_FALSE(open_bytes(b, &a, &err)); EXPECT_NE(err.find("version 3"), std::string::npos);
    b = good; b[15] = 0x7f;
    EXPECT_FALSE(open_bytes(b, &a, &err)); EXPECT_NE(err.find("json_bytes"), std::string::npos);
    b = good; memset(&b[8], 0, 8);
    EXPECT_FALSE(open_bytes(b, &a, &err)); EXPECT_NE(err.find("json_bytes"), std::string::npos);
    for (size_t n : {0ul, 7ul, 15ul, 16ul, 100ul, 4095ul, 4096ul + 511, good.size() - 1}) {
        std::vector<uint8_t> t(good.begin(), good.begin() + n);
        EXPECT_FALSE(open_bytes(t, &a, &err)) << "truncated to " << n;
        EXPECT_FALSE(err.empty());
    }
}

// ---- row-split decoding (hand-packed) -------------------------------------------------

TEST(RowSplit, DecodesHandPackedGroups) {
    // q5 [2,130]: gpr 4 (k_pad 256), row 0 group 0 lanes get codes -16..15 repeating
    RowSplitGeom g;
    ASSERT_TRUE(row_split_geom(FMT_Q5, 2, 130, &g));
    std::vector<uint8_t> buf(g.bytes, 0);
    int codes[2][256] = {};
    std::mt19937 rng(7);
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 130; j++) codes[r][j] = (int)(rng() % 32) - 16;
    for (int r = 0; r < 2; r++)
        for (int grp = 0; grp < 4; grp++) {
            uint8_t* base = &buf[(r * 4 + grp) * 32];
            uint8_t* high = &buf[g.high_offset + (r * 4 + grp) * 8];
            for (int j = 0; j < 64; j++) {
                int c = codes[r][grp * 64 + j];
                unsigned u = (unsigned)c & 31;
                base[j / 2] |= (u & 15) << ((j & 1) * 4);
                high[j / 8] |= ((u >> 4) & 1) << (j % 8);
            }
            uint16_t s = grp < 3 ? f32_to_f16(0.25f * (grp + 1) * (r + 1)) : 0;
            memcpy(&buf[g.scale_offset + (r * 4 + grp) * 2], &s, 2);
        }
    TensorObject t; t.format = FMT_Q5; t.layout = LAYOUT_ROW_SPLIT; t.shape = {2, 130}; t.data = buf.data();
    Mat m = mat_from(&t);
    float out[130];
    for (int r = 0; r < 2; r++) {
        mat_row_dequant(m, r, out);
        for (int j = 0; j < 130; j++) ASSERT_EQ(out[j], 0.25f * (j / 64 + 1) * (r + 1) * codes[r][j]) << r << "," << j;
    }
    // a row view of the second row decodes the same as row 1 of the parent
    Mat v = mat_rows(m, 1, 1);
    float out2[130];
    mat_row_dequant(v, 0, out2);
    mat_row_dequant(m, 1, out);
    EXPECT_EQ(memcmp(out, out2, sizeof out), 0);
}

TEST(RowSplit, Q6HighBitOrder) {
    // q6: byte 0 of the high plane holds lane0 b4, lane0 b5, lane1 b4, lane1 b5, ...
    uint8_t base[32] = {}, high[16] = {};
    high[0] = 0b10'01'11'10;  // lane0: b4=0 b5=1 (0x20), lane1: 3, lane2: 1, lane3: 2
    base[0] = 0x00; base[1] = 0x00;
    EXPECT_EQ(group_code(FMT_Q6, base, high, 0), -32);  // u = 0x20 -> -32
    EXPECT_EQ(group_code(FMT_Q6, base, high, 1), -16);  // u = 0x30 -> -16
    EXPECT_EQ(group_code(FMT_Q6, base, high, 2), 16);   // u = 0x10
    EXPECT_EQ(group_code(FMT_Q6, base, high, 3), -32);  // u = 0x20
    int8_t w8[32]; for (int j = 0; j < 32; j++) w8[j] = (int8_t)(j * 8 - 127);
    for (int j = 0; j < 32; j++) EXPECT_EQ(group_code(FMT_W8, (const uint8_t*)w8, nullptr, j), j * 8 - 127);
    uint8_t q4[32] = {0x8F};
    EXPECT_EQ(group_code(FMT_Q4, q4, nullptr, 0), -1);
    EXPECT_EQ(group_code(FMT_Q4, q4, nullptr, 1), -8);
}

// ---- synthetic artifacts from convert.py ----------------------------------------------

struct SynthCase { const char* name; int H, L, I, Hq, Hkv, Hk, Hv, vocab; bool tied; int v_depth, v_dim, v_heads, v_inter; };
static const SynthCase kSynth[] = {
    {"tiny", 128, 8, 384, 2, 1, 2, 4, 151936, false, 2, 128, 2, 256},
    {"tiny-gqa1", 128, 8, 256, 4, 2, 2, 2, 151936, true, 2, 128, 2, 256},
    {"tiny-gqa3", 128, 8, 384, 6, 1, 2, 6, 151936, true, 2, 128, 2, 256},
};

TEST(Synthetic, GeometryMatchesTheGenerator) {
    for (const SynthCase& c : kSynth)
        for (const char* suffix : {"", "-bf16"}) {
            std::string path = std::string("build/models/") + c.name + suffix + ".ninfer";
            if (!file_exists(path)) { ADD_FAILURE() << path << " missing (make models)"; continue; }
            Model m; std::string err;
            ASSERT_TRUE(model_open(&m, path.c_str(), &err)) << err;
            const Geometry& g = m.geo;
            EXPECT_EQ(g.H, c.H); EXPECT_EQ(g.L, c.L); EXPECT_EQ(g.I, c.I);
            EXPECT_EQ(g.Hq, c.Hq); EXPECT_EQ(g.Hkv, c.Hkv); EXPECT_EQ(g.head_dim, 256);
            EXPECT_EQ(g.Hk, c.Hk); EXPECT_EQ(g.Hv, c.Hv); EXPECT_EQ(g.dk, 128); EXPECT_EQ(g.conv_k, 4);
            EXPECT_EQ(g.vocab, c.vocab); EXPECT_EQ(g.tied, c.tied);
            EXPECT_EQ(g.n_full, 2); EXPECT_TRUE(g.full[3] && g.full[7] && !g.full[0]);
            EXPECT_TRUE(g.has_mtp); EXPECT_GT(g.draft_rows, 0);
            EXPECT_TRUE(g.has_vision);
            EXPECT_EQ(g.v_depth, c.v_depth); EXPECT_EQ(g.v_dim, c.v_dim); EXPECT_EQ(g.v_heads, c.v_heads);
            EXPECT_EQ(g.v_inter, c.v_inter); EXPECT_EQ(g.v_out, c.H);
            EXPECT_EQ(m.art.weights_id, std::string(*suffix ? "bf16" : "groupwise-int"));
            // the six frontend resources are there
            for (const char* r : kResourceNames) EXPECT_NE(artifact_find(&m.art, r), nullptr) << r;
            model_close(&m);
        }
}

// rebuild a file with its directory edited (objects keep their payload bytes)
static std::vector<uint8_t> edit_directory(const std::vector<uint8_t>& file, void (*edit)(Json* root)) {
    Artifact a; std::string err;
    EXPECT_TRUE(artifact_open_memory(&a, file.data(), file.size(), "x", &err)) << err;
    Json root;
    EXPECT_TRUE(json_parse((const char*)file.data() + 16, a.json_bytes, &root, &err, 16));
    edit(&root);
    std::vector<uint8_t> payload(file.begin() + a.payload_offset, file.end());
    return make_container(a.version, json_dump(root), payload);
}

TEST(Synthetic, InventoryErrorsNameTheObject) {
    std::string path = "build/models/tiny.ninfer";
    if (!file_exists(path)) FAIL() << path << " missing (make models)";
    auto file = read_file(path);
    struct Case { const char* what; void (*edit)(Json*); const char* expect; };
    Case cases[] = {
        {"missing tensor", [](Json* r) {
             auto& o = r->get("objects")->arr;
             for (size_t k = 0; k < o.size(); k++) if (o[k].get("name")->str == "text/layers/2/gdn/norm") { o.erase(o.begin() + k); break; }
         }, "missing tensor 'text/layers/2/gdn/norm'"},
        {"wrong shape", [](Json* r) {
             for (auto& o : r->get("objects")->arr) if (o.get("name")->str == "text/final_norm") {
                 o.get("shape")->arr[0] = Json::integer(64); o.set("bytes", Json::integer(128)); }
         }, "tensor 'text/final_norm' has shape [64], expected [128]"},
        {"stray object", [](Json* r) {
             for (auto& o : r->get("objects")->arr) if (o.get("name")->str == "text/final_norm") o.set("name", Json::string("extra/thing"));
         }, "missing tensor 'text/final_norm'"},
        {"both layer kinds", [](Json* r) {
             for (auto& o : r->get("objects")->arr) if (o.get("name")->str == "text/layers/3/attention/query_norm") o.set("name", Json::string("text/layers/3/gdn/query_key"));
         }, "exactly one of attention/query_key and gdn/query_key"},
    };
    for (auto& c : cases) {
        auto bytes = edit_directory(file, c.edit);
        Artifact a; Geometry g; Weights w; std::string err;
        bool ok = artifact_open_memory(&a, bytes.data(), bytes.size(), "tiny.ninfer", &err) &&
                  geometry_from_artifact(&a, &g, &err) && bind_weights(&a, g, &w, &err);
        EXPECT_FALSE(ok) << c.what;
        EXPECT_NE(err.find(c.expect), std::string::npos) << c.what << ": got '" << err << "'";
        EXPECT_EQ(err.find('\n'), std::string::npos);
    }
}

// random byte flips in the prefix and directory, and truncations: every outcome is a clean
// success or a one-line error; never a crash (run under asan with `make debug` too)
TEST(Synthetic, FuzzNeverCrashes) {
    std::string path = "build/models/tiny.ninfer";
    if (!file_exists(path)) FAIL() << path << " missing (make models)";
    auto file = read_file(path);
    Artifact a0; std::string err;
    ASSERT_TRUE(artifact_open_memory(&a0, file.data(), file.size(), "x", &err));
    size_t head = a0.payload_offset;
    std::mt19937_64 rng(42);
    int opened = 0, failed = 0;
    for (int it = 0; it < 3000; it++) {
        std::vector<std::pair<size_t, uint8_t>> undo;
        size_t n = file.size();
        int mode = it % 3;
        if (mode < 2) {  // flip 1-4 bytes in the header or the json
            int k = 1 + rng() % 4;
            for (int q = 0; q < k; q++) {
                size_t at = rng() % (16 + a0.json_bytes);
                undo.push_back({at, file[at]});
                file[at] = mode == 0 ? (uint8_t)(file[at] ^ (1u << (rng() % 8))) : (uint8_t)"0123456789,:[]{}\"-.e "[rng() % 21];
            }
        } else {
            n = rng() % (head + 1 << 20);  // truncate
            if (n > file.size()) n = file.size() - 1;
        }
        Artifact a; Geometry g; Weights w; std::string e;
        bool ok = artifact_open_memory(&a, file.data(), n, "fuzz.ninfer", &e) && geometry_from_artifact(&a, &g, &e) && bind_weights(&a, g, &w, &e);
        if (ok) opened++;
        else { failed++; ASSERT_FALSE(e.empty()); ASSERT_EQ(e.find('\n'), std::string::npos) << e; }
        for (auto it2 = undo.rbegin(); it2 != undo.rend(); ++it2) file[it2->first] = it2->second;
    }
    EXPECT_GT(failed, 1000);
    printf("fuzz: %d opened, %d rejected cleanly\n", opened, failed);
}

// convert.py's canonical encoder -> our decoder: every format, bit for bit
// (vectors from test/make_format_vectors.py, values computed there independently)
TEST(RoundTrip, ConvertEncodedTensorsDecodeExactly) {
    std::string path = "build/test/format_vectors.ninfer";
    if (!file_exists(path)) FAIL() << path << " missing (make test builds it)";
    Artifact a; std::string err;
    ASSERT_TRUE(artifact_open(&a, path.c_str(), &err)) << err;
    int checked = 0;
    for (const TensorObject& t : a.objects) {
        if (t.name.rfind("t/", 0) != 0) continue;
        const TensorObject* ref = artifact_find(&a, "ref/" + t.name.substr(2));
        ASSERT_NE(ref, nullptr) << t.name;
        Mat m = mat_from(&t);
        const float* want = (const float*)ref->data;
        std::vector<float> row(m.cols);
        for (int64_t r = 0; r < m.rows; r++) {
            mat_row_dequant(m, r, row.data());
            for (int64_t j = 0; j < m.cols; j++)
                ASSERT_EQ(row[j], want[r * m.cols + j]) << t.name << " [" << r << "," << j << "]";
        }
        checked++;
    }
    EXPECT_EQ(checked, 4 * 7 + 3);
    artifact_close(&a);
}
