// tests for vision.h: the decoders against PIL and the preprocessing against hugging face's
// processors, on the committed corpus test/media/ (test/gen_media_corpus.py and
// test/gen_media_preprocess.py made it and its goldens in test/media/golden/), plus hostile
// input. host code only; run from the repo root:
//   make build/test/test_vision && build/test/test_vision
// the max differences printed are the figures for the report (0 means identical).
#include "vision.h"
#include <gtest/gtest.h>
#include <stdio.h>

static const std::string kMedia = "test/media/";
static const std::string kGold = "test/media/golden/";

static std::vector<uint8_t> file_bytes(const std::string& path) {
    std::vector<uint8_t> b;
    std::string err;
    if (!media_read_file(path, 1ll << 30, &b, &err)) ADD_FAILURE() << err;
    return b;
}

static Image load(const std::string& path) {
    Image im;
    std::string err;
    MediaLimits lim;
    EXPECT_TRUE(image_load(path, lim, &im, &err)) << err;
    return im;
}

static int max_diff(const Image& a, const Image& b) {
    if (a.w != b.w || a.h != b.h) return 9999;
    int d = 0;
    for (size_t i = 0; i < a.rgb.size(); i++) d = std::max(d, abs((int)a.rgb[i] - (int)b.rgb[i]));
    return d;
}

static Json load_json(const std::string& path) {
    std::vector<uint8_t> b = file_bytes(path);
    Json j;
    std::string err;
    EXPECT_TRUE(json_parse(std::string(b.begin(), b.end()), &j, &err)) << path << ": " << err;
    return j;
}

static bool one_line(const std::string& s) { return !s.empty() && s.find('\n') == std::string::npos; }

// ---- decoders against PIL -------------------------------------------------------

// every png color type and depth (interlaced too), every deflate strategy, baseline and
// progressive jpeg at each subsampling with and without restart markers, tiny and odd sizes,
// each exif orientation, ppm/pgm: all identical to PIL (jpeg included: libjpeg-turbo's islow
// arithmetic is integer and is reproduced exactly, so the tolerance is 0, not an idct bound)
TEST(Decode, MatchesPil) {
    std::vector<uint8_t> list = file_bytes(kGold + "decode_cases.txt");
    std::string names(list.begin(), list.end());
    int n = 0, worst = 0;
    size_t a = 0;
    while (a < names.size()) {
        size_t b = names.find('\n', a);
        std::string name = names.substr(a, b - a);
        a = b + 1;
        if (name.empty()) continue;
        Image ours = load(kMedia + name), pil = load(kGold + name + ".ppm");
        int d = max_diff(ours, pil);
        EXPECT_EQ(d, 0) << name << ": " << ours.w << "x" << ours.h << " vs PIL " << pil.w << "x" << pil.h;
        worst = std::max(worst, d);
        n++;
    }
    EXPECT_GE(n, 80);
    printf("decode: %d files, max |ours - PIL| = %d\n", n, worst);
}

TEST(Decode, ExifOrientationMovesPixels) {
    // orientation 6 (rotate 90 cw) of a 20x12 picture is 12x20, and its top-left pixel is the
    // source's bottom-left
    Image o1 = load(kMedia + "jpg_exif1.jpg"), o6 = load(kMedia + "jpg_exif6.jpg");
    EXPECT_EQ(o1.w, 20); EXPECT_EQ(o1.h, 12);
    EXPECT_EQ(o6.w, 12); EXPECT_EQ(o6.h, 20);
}

// ---- hostile input --------------------------------------------------------------

static std::vector<uint8_t> png_chunk(const char* type, const std::vector<uint8_t>& d) {
    std::vector<uint8_t> c;
    uint32_t n = (uint32_t)d.size();
    c.push_back(n >> 24); c.push_back(n >> 16); c.push_back(n >> 8); c.push_back(n);
    c.insert(c.end(), type, type + 4);
    c.insert(c.end(), d.begin(), d.end());
    uint32_t crc = png_crc(c.data() + 4, c.size() - 4);
    c.push_back(crc >> 24); c.push_back(crc >> 16); c.push_back(crc >> 8); c.push_back(crc);
    return c;
}
static std::vector<uint8_t> png_with(uint32_t w, uint32_t h, const std::vector<uint8_t>& idat) {
    std::vector<uint8_t> f = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    std::vector<uint8_t> ihdr = {(uint8_t)(w >> 24), (uint8_t)(w >> 16), (uint8_t)(w >> 8), (uint8_t)w,
                                 (uint8_t)(h >> 24), (uint8_t)(h >> 16), (uint8_t)(h >> 8), (uint8_t)h, 8, 2, 0, 0, 0};
    auto add = [&](const std::vector<uint8_t>& c) { f.insert(f.end(), c.begin(), c.end()); };
    add(png_chunk("IHDR", ihdr)); add(png_chunk("IDAT", idat)); add(png_chunk("IEND", {}));
    return f;
}

static std::string decode_err(const std::vector<uint8_t>& f, const MediaLimits& lim = MediaLimits()) {
    Image im;
    std::string err;
    bool ok = image_decode(f.data(), f.size(), lim, &im, &err);
    EXPECT_FALSE(ok);
    EXPECT_TRUE(one_line(err)) << err;
    EXPECT_TRUE(im.rgb.empty());
    return err;
}

TEST(Hostile, DecompressionBombsStopAtTheHeader) {
    // a 100000 x 100000 png and a 65535 x 65535 jpeg: refused by the pixel limit before any allocation
    std::string e = decode_err(png_with(100000, 100000, {0x78, 0x9c, 3, 0, 0, 0, 0, 1}));
    EXPECT_NE(e.find("over the limit of"), std::string::npos) << e;
    std::vector<uint8_t> jpg = {0xff, 0xd8, 0xff, 0xc0, 0, 11, 8, 0xff, 0xff, 0xff, 0xff, 1, 1, 0x11, 0};
    e = decode_err(jpg);
    EXPECT_NE(e.find("over the limit of"), std::string::npos) << e;
    // a limit the caller sets
    MediaLimits small;
    small.max_pixels = 1000;
    e = decode_err(file_bytes(kMedia + "pil_rgb.png"), small);
    EXPECT_NE(e.find("45x67"), std::string::npos) << e;
    small = MediaLimits();
    small.max_bytes = 100;
    e = decode_err(file_bytes(kMedia + "pil_rgb.png"), small);
    EXPECT_NE(e.find("over the limit of 100 bytes"), std::string::npos) << e;
}

TEST(Hostile, InflateIsBoundedByTheHeader) {
    // a 2x2 rgb png needs 2 * (1 + 6) = 14 bytes; a stream that inflates to 1000 zeros is refused
    // as soon as it passes 14, and one that stops short is truncated
    std::vector<uint8_t> z = {0x78, 0x01};  // zlib header, then one stored block of 1000 zeros
    z.push_back(1); z.push_back(1000 & 255); z.push_back(1000 >> 8); z.push_back(~1000 & 255); z.push_back((~1000 >> 8) & 255);
    z.insert(z.end(), 1000, 0);
    z.insert(z.end(), {0, 0, 0, 1});
    std::string e = decode_err(png_with(2, 2, z));
    EXPECT_NE(e.find("more than the 14 bytes"), std::string::npos) << e;
    std::vector<uint8_t> z2 = {0x78, 0x01, 1, 4, 0, 0xfb, 0xff, 0, 0, 0, 0, 0, 0, 0, 1};
    e = decode_err(png_with(2, 2, z2));
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST(Hostile, OversizedAndCorruptChunks) {
    std::vector<uint8_t> f = file_bytes(kMedia + "png_c2_d8.png");
    std::vector<uint8_t> g = f;
    g[8] = 0x80;  // IHDR length 2^31 + 13
    std::string e = decode_err(g);
    EXPECT_NE(e.find("at most 2^31-1"), std::string::npos) << e;
    g = f;
    g[10] = 0x10;  // IHDR length 4109, past the end of the file
    e = decode_err(g);
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
    g = f;
    g[40] ^= 1;  // a byte inside a chunk: the crc catches it
    e = decode_err(g);
    EXPECT_NE(e.find("crc mismatch"), std::string::npos) << e;
}

TEST(Hostile, UnsupportedFormatsAreNamed) {
    auto err_of = [](const std::string& s) {
        std::vector<uint8_t> f(s.begin(), s.end());
        f.resize(64, 0);
        return decode_err(f);
    };
    EXPECT_NE(err_of("GIF89a").find("unsupported image format GIF"), std::string::npos);
    EXPECT_NE(err_of(std::string("RIFF\x10\0\0\0WEBPVP8 ", 16)).find("unsupported image format WebP"), std::string::npos);
    EXPECT_NE(err_of("BM").find("unsupported image format BMP"), std::string::npos);
    EXPECT_NE(err_of(std::string("\0\0\0\x1c" "ftypavif", 12)).find("unsupported image format AVIF"), std::string::npos);
    EXPECT_NE(err_of("hello").find("not an image"), std::string::npos);
    // a lossless jpeg (sof3) and a cmyk one
    std::vector<uint8_t> j = {0xff, 0xd8, 0xff, 0xc3, 0, 11, 8, 0, 8, 0, 8, 1, 1, 0x11, 0};
    EXPECT_NE(decode_err(j).find("lossless"), std::string::npos);
    j = {0xff, 0xd8, 0xff, 0xc0, 0, 20, 8, 0, 8, 0, 8, 4, 1, 0x11, 0, 2, 0x11, 0, 3, 0x11, 0, 4, 0x11, 0};
    EXPECT_NE(decode_err(j).find("CMYK"), std::string::npos);
}

TEST(Hostile, RealFilesOfUnsupportedKinds) {
    MediaLimits lim;
    struct { const char* file; const char* want; } cases[] = {
        {"bad_arith.jpg", "arithmetic-coded jpeg"}, {"bad_cmyk.jpg", "CMYK"}, {"bad.gif", "unsupported image format GIF"}};
    for (auto& c : cases) {
        Image im; std::string err;
        EXPECT_FALSE(image_load(kMedia + c.file, lim, &im, &err)) << c.file;
        EXPECT_NE(err.find(c.want), std::string::npos) << err;
        EXPECT_TRUE(one_line(err));
    }
}

// every corpus file cut at many lengths, and with bytes flipped: never a crash (asan in
// make fuzz-vision), a cut png or jpeg always fails with one line
TEST(Hostile, TruncatedAndMutatedCorpus) {
    const char* files[] = {"png_c6_d16_i.png", "png_c3_d2.png", "jpg_420_prog_rst_53x37.jpg", "jpg_422_53x37.jpg",
                           "jpg_gray_prog.jpg", "p6.ppm", "jpg_exif6.jpg", "png_fixed.png"};
    MediaLimits lim;
    uint64_t s = 0x9e3779b97f4a7c15ull;
    auto rnd = [&]() { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; };
    int cuts = 0, muts = 0, mut_ok = 0;
    for (const char* name : files) {
        std::vector<uint8_t> f = file_bytes(kMedia + name);
        for (size_t n = 0; n < f.size(); n += 1 + f.size() / 97) {
            Image im; std::string err;
            bool ok = image_decode(f.data(), n, lim, &im, &err);
            if (name[0] != 'p' || name[1] != '6') { EXPECT_FALSE(ok) << name << " cut at " << n; }
            if (!ok) { EXPECT_TRUE(one_line(err)) << err; }
            cuts++;
        }
        for (int k = 0; k < 150; k++) {
            std::vector<uint8_t> g = f;
            int flips = 1 + (int)(rnd() % 4);
            for (int i = 0; i < flips; i++) g[rnd() % g.size()] ^= (uint8_t)(1 + rnd() % 255);
            Image im; std::string err;
            bool ok = image_decode(g.data(), g.size(), lim, &im, &err);
            if (ok) { EXPECT_EQ(im.rgb.size(), (size_t)im.w * im.h * 3); mut_ok++; }
            else EXPECT_TRUE(one_line(err)) << err;
            muts++;
        }
    }
    printf("hostile: %d truncations, %d mutations (%d still decoded)\n", cuts, muts, mut_ok);
}

// data uris decode to the file's bytes; http(s) is refused; limits hold before decoding
TEST(References, DataUrisAndPaths) {
    std::vector<uint8_t> f = file_bytes(kMedia + "jpg_422_16x16.jpg");
    static const char* tab = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string b64;
    for (size_t i = 0; i < f.size(); i += 3) {
        uint32_t v = f[i] << 16 | (i + 1 < f.size() ? f[i + 1] << 8 : 0) | (i + 2 < f.size() ? f[i + 2] : 0);
        b64 += tab[v >> 18 & 63]; b64 += tab[v >> 12 & 63];
        b64 += i + 1 < f.size() ? tab[v >> 6 & 63] : '=';
        b64 += i + 2 < f.size() ? tab[v & 63] : '=';
    }
    std::vector<uint8_t> got;
    std::string err;
    ASSERT_TRUE(media_bytes("data:image/jpeg;base64," + b64, 1 << 20, &got, &err)) << err;
    EXPECT_EQ(got, f);
    MediaLimits lim;
    Image a, b;
    ASSERT_TRUE(media_image("data:image/jpeg;base64," + b64, lim, &a, &err)) << err;
    ASSERT_TRUE(media_image("file://" + kMedia + "jpg_422_16x16.jpg", lim, &b, &err)) << err;
    EXPECT_EQ(a.rgb, b.rgb);
    EXPECT_FALSE(media_bytes("https://example.com/cat.png", 1 << 20, &got, &err));
    EXPECT_NE(err.find("not fetched"), std::string::npos);
    EXPECT_FALSE(media_bytes("data:image/png,abc", 1 << 20, &got, &err));
    EXPECT_NE(err.find("only base64"), std::string::npos);
    EXPECT_FALSE(media_bytes("data:image/png;base64,ab$d", 1 << 20, &got, &err));
    EXPECT_NE(err.find("invalid character"), std::string::npos);
    EXPECT_FALSE(media_bytes("data:image/jpeg;base64," + b64, 100, &got, &err));
    EXPECT_NE(err.find("over the limit of 100 bytes"), std::string::npos);
    EXPECT_FALSE(media_image("data:image/gif;base64,R0lGODlhAQABAAAAACw=", lim, &a, &err));
    EXPECT_EQ(err, "data:image/gif;base64: unsupported image format GIF (supported: PNG, JPEG, PPM/PGM)");
}

TEST(References, Sha256) {  // fips 180-4 examples, and a length that needs a second padding block
    auto h = [](const std::string& s) { return sha256_hex((const uint8_t*)s.data(), s.size()); };
    EXPECT_EQ(h(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(h("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(h("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    EXPECT_EQ(h(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// ---- preprocessing against hugging face ----------------------------------------

static VisionConfig config_for(const Json& c, Resample r) {
    VisionConfig v;
    const Json* size = c.get("size");
    if (size) { v.min_pixels = size->get("shortest_edge")->i; v.max_pixels = size->get("longest_edge")->i; }
    v.resample = r;
    return v;
}

// our pixel rows for a (golden) resized image, as the backend normalises
static VisionItem rows_of(const Image& resized, const VisionConfig& c) {
    VisionItem it;
    std::vector<const Image*> fr(c.temporal, &resized);
    vision_patchify(fr, c, c.mean, c.std, c.rescale, c.resample, &it);
    return it;
}

static float max_abs(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return INFINITY;
    float d = 0;
    for (size_t i = 0; i < a.size(); i++) d = std::max(d, fabsf(a[i] - b[i]));
    return d;
}

// each image case, at the artifact's min/max pixels or the case's: grid_thw, the resized image
// and so every pixel value equal to the processor's, for both backends; the processor's
// errors reproduced. also prints ninfer's default (torchvision) against the PIL backend.
TEST(Preprocess, ImagesMatchHf) {
    Json g = load_json(kGold + "preprocess.json");
    int n = 0, errors = 0;
    float worst_own = 0, worst_cross = 0;
    const char* bname[2] = {"tv", "pil"};
    for (const Json& c : g.get("cases")->arr) {
        if (c.get("kind")->str != "image") continue;
        const std::string input = c.get("input")->arr[0].str;
        Image img = load(kMedia + input);
        for (int b = 0; b < 2; b++) {
            const Json* r = c.get(bname[b]);
            VisionConfig cfg = config_for(c, b ? RESAMPLE_PIL : RESAMPLE_TORCHVISION);
            Image ours;
            std::string err;
            bool ok = vision_image_resized(img, cfg, &ours, &err);
            if (const Json* e = r->get("error")) {
                EXPECT_FALSE(ok) << input;
                EXPECT_EQ(err, e->str) << input;
                errors++;
                continue;
            }
            ASSERT_TRUE(ok) << input << ": " << err;
            VisionItem it;
            ASSERT_TRUE(vision_image(img, cfg, &it, &err)) << err;
            const Json& grid = *r->get("grid");
            EXPECT_EQ(it.t, grid.arr[0].i) << input;
            EXPECT_EQ(it.h, grid.arr[1].i) << input;
            EXPECT_EQ(it.w, grid.arr[2].i) << input;
            EXPECT_EQ(it.row_len, 1536);
            if (const Json* crc = r->get("crc32")) {
                EXPECT_EQ(png_crc(ours.rgb.data(), ours.rgb.size()), (uint32_t)crc->i) << input << " " << bname[b];
            } else {
                Image hf = load(kGold + r->get("png")->str);
                float d = max_abs(it.pixels, rows_of(hf, cfg).pixels);
                EXPECT_EQ(d, 0.0f) << input << " " << bname[b] << ": resized differs by " << max_diff(ours, hf) << " (uint8)";
                worst_own = std::max(worst_own, d);
                // ninfer's default against the other backend
                if (b == 1) {
                    VisionConfig tv = config_for(c, RESAMPLE_TORCHVISION);
                    VisionItem mine;
                    ASSERT_TRUE(vision_image(img, tv, &mine, &err));
                    worst_cross = std::max(worst_cross, max_abs(mine.pixels, rows_of(hf, cfg).pixels));
                }
            }
            n++;
        }
    }
    EXPECT_GE(n, 30);
    EXPECT_GE(errors, 6);
    printf("preprocess: %d image results + %d reproduced errors; max |ours - hf| = %g (same backend); "
           "ninfer default (torchvision) vs the PIL backend: max %g (%d uint8 steps)\n",
           n, errors, worst_own, worst_cross, (int)lrintf(worst_cross * 127.5f));
}

// the float32 pixel_values themselves, bit for bit, and the row order (t, bh, bw, ih, iw)
TEST(Preprocess, FullPixelValuesBitExact) {
    Json g = load_json(kGold + "preprocess.json");
    int n = 0;
    for (const Json& c : g.get("cases")->arr) {
        if (c.get("kind")->str != "full") continue;
        VisionConfig cfg = config_for(c, c.get("backend")->str == "pil" ? RESAMPLE_PIL : RESAMPLE_TORCHVISION);
        Image img = load(kMedia + c.get("input")->arr[0].str);
        VisionItem it;
        std::string err;
        ASSERT_TRUE(vision_image(img, cfg, &it, &err)) << err;
        std::vector<uint8_t> raw = file_bytes(kGold + c.get("f32")->str);
        ASSERT_EQ(raw.size(), it.pixels.size() * 4);
        EXPECT_EQ(memcmp(raw.data(), it.pixels.data(), raw.size()), 0) << c.get("backend")->str;
        EXPECT_EQ(it.rows(), c.get("shape")->arr[0].i);
        n++;
    }
    EXPECT_EQ(n, 2);
}

// frame lists: the sampled indices, grid_thw, every pixel value and the timestamps
TEST(Preprocess, VideosMatchHf) {
    Json g = load_json(kGold + "preprocess.json");
    int n = 0;
    for (const Json& c : g.get("cases")->arr) {
        if (c.get("kind")->str != "video") continue;
        const Json& in = *c.get("input");
        const Json& r = *c.get("tv");
        VisionConfig cfg;
        double fps = c.get("video_fps")->num;
        std::vector<int64_t> idx = video_sample_indices((int64_t)in.size(), fps, cfg);
        std::vector<Image> frames;
        for (int64_t i : idx) frames.push_back(load(kMedia + in.arr[i].str));
        VisionItem it;
        std::string err;
        bool ok = vision_video(frames, idx, fps, cfg, &it, &err);
        if (const Json* e = r.get("error")) {
            EXPECT_FALSE(ok);
            EXPECT_EQ(err, e->str);
            n++;
            continue;
        }
        ASSERT_TRUE(ok) << err;
        const Json& want_idx = *r.get("indices");
        ASSERT_EQ(idx.size(), want_idx.size());
        for (size_t i = 0; i < idx.size(); i++) EXPECT_EQ(idx[i], want_idx.arr[i].i);
        EXPECT_EQ(it.t, r.get("grid")->arr[0].i);
        EXPECT_EQ(it.h, r.get("grid")->arr[1].i);
        EXPECT_EQ(it.w, r.get("grid")->arr[2].i);
        const Json& ts = *r.get("timestamps");
        ASSERT_EQ(it.timestamps.size(), ts.size());
        for (size_t i = 0; i < ts.size(); i++) EXPECT_EQ(it.timestamps[i], ts.arr[i].num);
        // the golden frames, stacked: rows of the padded frame sequence
        Image strip = load(kGold + r.get("png")->str);
        const int fh = it.h * cfg.patch, fw = it.w * cfg.patch;
        ASSERT_EQ(strip.h, fh * it.t * cfg.temporal);
        std::vector<Image> hf(it.t * cfg.temporal);
        std::vector<const Image*> fp;
        for (size_t k = 0; k < hf.size(); k++) {
            hf[k].w = fw; hf[k].h = fh;
            hf[k].rgb.assign(strip.rgb.begin() + k * fw * fh * 3, strip.rgb.begin() + (k + 1) * fw * fh * 3);
            fp.push_back(&hf[k]);
        }
        VisionItem want;
        vision_patchify(fp, cfg, cfg.video_mean, cfg.video_std, cfg.video_rescale, RESAMPLE_TORCHVISION, &want);
        EXPECT_EQ(max_abs(it.pixels, want.pixels), 0.0f) << in.arr[0].str;
        n++;
    }
    EXPECT_EQ(n, 6);
}

// the text the processor feeds the tokenizer: two images and a video, timestamps included
TEST(Preprocess, PromptExpansionMatchesHf) {
    Json g = load_json(kGold + "preprocess.json");
    const Json* c = nullptr;
    for (const Json& x : g.get("cases")->arr) if (x.get("kind")->str == "prompt") c = &x;
    ASSERT_TRUE(c);
    VisionConfig cfg;
    std::string err;
    std::vector<VisionItem> im(c->get("images")->size());
    for (size_t i = 0; i < im.size(); i++) ASSERT_TRUE(vision_image(load(kMedia + c->get("images")->arr[i].str), cfg, &im[i], &err)) << err;
    const Json& vf = *c->get("video");
    std::vector<int64_t> idx = video_sample_indices((int64_t)vf.size(), 24, cfg);
    std::vector<Image> frames;
    for (int64_t i : idx) frames.push_back(load(kMedia + vf.arr[i].str));
    VisionItem v;
    ASSERT_TRUE(vision_video(frames, idx, 24, cfg, &v, &err)) << err;
    // the hf divergence (vision_expand_prompt's decision): transformers 5.17 replaces the video
    // pad only, keeping the template's <|vision_start|> / <|vision_end|> around the frames, where
    // model.md 6.5 replaces the triple. 5.17's output is ours on a text whose video triple is
    // wrapped once more, and ours on the plain text is 5.17's without that outer pair.
    const std::string triple = "<|vision_start|><|video_pad|><|vision_end|>", text = c->get("text")->str, hf = c->get("expanded")->str;
    std::string wrapped = text;
    const size_t at = wrapped.find(triple);
    ASSERT_NE(at, std::string::npos);
    wrapped.replace(at, triple.size(), "<|vision_start|>" + triple + "<|vision_end|>");
    std::string out;
    ASSERT_TRUE(vision_expand_prompt(wrapped, {&im[0], &im[1]}, {&v}, cfg.merge, &out, &err)) << err;
    EXPECT_EQ(out, hf);
    ASSERT_TRUE(vision_expand_prompt(text, {&im[0], &im[1]}, {&v}, cfg.merge, &out, &err)) << err;
    const size_t sec = hf.find(" seconds>"), ts = hf.rfind('<', sec);  // the first timestamp; 5.17's outer start before it
    ASSERT_TRUE(sec != std::string::npos && ts >= 16 && hf.compare(ts - 16, 16, "<|vision_start|>") == 0) << hf;
    const size_t vs = ts - 16;
    const size_t ve = hf.find("<|vision_end|><|vision_end|>", vs);
    ASSERT_NE(ve, std::string::npos);
    std::string model_md = hf;
    model_md.erase(ve, 14);  // the outer <|vision_end|>
    model_md.erase(vs, 16);  // the outer <|vision_start|>
    EXPECT_EQ(out, model_md);
    EXPECT_FALSE(vision_expand_prompt(text, {&im[0]}, {&v}, cfg.merge, &out, &err));
    EXPECT_NE(err.find("more image placeholders"), std::string::npos) << err;
    // the conversation's own text (literal spans) holds no placeholder: a user typing
    // "<|image_pad|>" gives no image, and the spans come out where they lie after the expansion
    const std::string typed = "<|image_pad|><|vision_start|><|video_pad|><|vision_end|>";
    const std::string lt = "u:" + typed + "|<|image_pad|>|" + typed;
    VisionSpans lit = {{2, 2 + typed.size()}, {lt.size() - typed.size() + 3, lt.size()}}, lo;  // the second starts inside "<|v..."
    ASSERT_TRUE(vision_expand_prompt(lt, {&im[0]}, {}, cfg.merge, &out, &err, &lit, &lo)) << err;
    std::string pads;
    for (int k = im[0].tokens(cfg.merge); k > 0; k--) pads += "<|image_pad|>";
    EXPECT_EQ(out, "u:" + typed + "|" + pads + "|" + typed);
    ASSERT_EQ(lo.size(), 2u);
    EXPECT_EQ(out.substr(lo[0].first, lo[0].second - lo[0].first), typed);
    EXPECT_EQ(lo[1].second, out.size());
    EXPECT_EQ(out.substr(lo[1].first), typed.substr(3));
    EXPECT_FALSE(vision_expand_prompt(lt, {&im[0]}, {&v}, cfg.merge, &out, &err, &lit, &lo));  // the typed video pad is no video
    EXPECT_FALSE(vision_expand_prompt("x<|image_pad|>", {&im[0], &im[1]}, {}, cfg.merge, &out, &err));
}

TEST(Preprocess, SmartResizeEdges) {
    int h, w;
    std::string err;
    // 1xN upsamples to the min pixels; the aspect ratio limit is the processor's, message included
    ASSERT_TRUE(smart_resize_image(1, 100, 32, 65536, 16777216, &h, &w, &err));
    EXPECT_EQ(h, 32); EXPECT_EQ(w, 2560);
    EXPECT_FALSE(smart_resize_image(1, 201, 32, 65536, 16777216, &h, &w, &err));
    EXPECT_EQ(err, "absolute aspect ratio must be smaller than 200, got 201.0");
    EXPECT_FALSE(smart_resize_image(3, 700, 32, 65536, 16777216, &h, &w, &err));
    EXPECT_EQ(err, "absolute aspect ratio must be smaller than 200, got 233.33333333333334");
    // over max_pixels: floor to the factor
    ASSERT_TRUE(smart_resize_image(3600, 4800, 32, 65536, 16777216, &h, &w, &err));
    EXPECT_EQ(h, 3520); EXPECT_EQ(w, 4704);
    // python's round is half to even: 48 / 32 = 1.5 -> 2, 80 / 32 = 2.5 -> 2
    ASSERT_TRUE(smart_resize_image(48 * 100, 80 * 100, 32, 1, 1ll << 40, &h, &w, &err));
    ASSERT_TRUE(smart_resize_image(48, 80, 32, 1, 1ll << 40, &h, &w, &err));
    EXPECT_EQ(h, 64); EXPECT_EQ(w, 64);
    EXPECT_FALSE(smart_resize_video(1, 40, 40, 2, 32, 4096, 25165824, &h, &w, &err));
    EXPECT_EQ(err, "t:1 must be larger than temporal_factor:2");
}

TEST(Hostile, VideoLimits) {
    std::string list;
    for (int i = 0; i < 30; i++) { char b[64]; snprintf(b, sizeof b, "%stest/media/v30_%03d.png", i ? "," : "", i); list += b; }
    VisionConfig c;
    VisionItem it;
    std::string err;
    MediaLimits lim;
    ASSERT_TRUE(video_load(list, 24, c, lim, &it, &err)) << err;
    EXPECT_EQ(it.t, 2);
    lim.max_frames = 10;
    EXPECT_FALSE(video_load(list, 24, c, lim, &it, &err));
    EXPECT_NE(err.find("30 frames, over the limit of 10"), std::string::npos) << err;
    lim = MediaLimits();
    lim.max_video_seconds = 1;
    EXPECT_FALSE(video_load(list, 24, c, lim, &it, &err));
    EXPECT_NE(err.find("1.25 seconds of video, over the limit of 1.0"), std::string::npos) << err;
    lim = MediaLimits();
    lim.max_video_pixels = 5000;  // 4 sampled frames of 56x40
    EXPECT_FALSE(video_load(list, 24, c, lim, &it, &err));
    EXPECT_NE(err.find("video pixel limit"), std::string::npos) << err;
    EXPECT_FALSE(video_load("https://example.com/v.mp4", 24, c, MediaLimits(), &it, &err));
    EXPECT_NE(err.find("not fetched"), std::string::npos) << err;
    EXPECT_FALSE(video_load("test/media/nonexistent_dir", 24, c, MediaLimits(), &it, &err));
    EXPECT_NE(err.find("cannot open"), std::string::npos) << err;
}

// the thread pool gives what one thread gives, item for item, errors included
TEST(Preprocess, PrepareOnThreadsEqualsSerial) {
    std::vector<MediaJob> a;
    const char* refs[] = {"pp_31x33.png", "jpg_420_53x37.jpg", "pp_1x201.png", "png_c3_d2.png", "bad.gif", "jpg_exif6.jpg"};
    for (const char* r : refs) { MediaJob j; j.ref = kMedia + r; a.push_back(j); }
    MediaJob v; v.video = true;
    for (int i = 0; i < 9; i++) { char b[64]; snprintf(b, sizeof b, "%stest/media/v9_%03d.png", i ? "," : "", i); v.ref += b; }
    a.push_back(v);
    std::vector<MediaJob> b = a;
    VisionConfig c;
    vision_prepare(&a, c, MediaLimits(), 24, 1);
    vision_prepare(&b, c, MediaLimits(), 24, 4);
    for (size_t i = 0; i < a.size(); i++) {
        EXPECT_EQ(a[i].ok, b[i].ok) << a[i].ref;
        EXPECT_EQ(a[i].err, b[i].err);
        EXPECT_EQ(a[i].item.pixels, b[i].item.pixels);
        EXPECT_EQ(a[i].item.timestamps, b[i].item.timestamps);
    }
    EXPECT_FALSE(a[2].ok);
    EXPECT_EQ(a[2].err, kMedia + "pp_1x201.png: absolute aspect ratio must be smaller than 200, got 201.0");
    EXPECT_FALSE(a[4].ok);
    EXPECT_TRUE(a[6].ok && a[6].item.video);
}

TEST(Preprocess, VideoSampling) {
    VisionConfig c;
    // transformers: n = int(total / fps * 2) clamped to [4, 768] and to total; round(linspace)
    std::vector<int64_t> i = video_sample_indices(30, 24, c);
    EXPECT_EQ(i, (std::vector<int64_t>{0, 10, 19, 29}));
    i = video_sample_indices(3, 24, c);
    EXPECT_EQ(i, (std::vector<int64_t>{0, 1, 2}));
    i = video_sample_indices(600, 30, c);  // 20 s at 30 fps: 40 frames
    EXPECT_EQ(i.size(), 40u);
    EXPECT_EQ(i.back(), 599);
    std::vector<double> ts = vision_video_timestamps({0, 10, 19}, 24, 2);  // padded with 19
    ASSERT_EQ(ts.size(), 2u);
    EXPECT_DOUBLE_EQ(ts[0], 5.0 / 24);
    EXPECT_DOUBLE_EQ(ts[1], 19.0 / 24);
}

// ---- the artifact's preprocessor configs ---------------------------------------

TEST(Config, ParsesConvertPyResources) {
    // what convert.py writes (hf_json_bytes of PREPROCESSOR / VIDEO_PREPROCESSOR)
    const char* img = R"({
  "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
  "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Qwen2VLImageProcessorFast",
  "image_std": [0.5, 0.5, 0.5], "merge_size": 2, "patch_size": 16, "processor_class": "Qwen3VLProcessor",
  "resample": 3, "rescale_factor": 0.00392156862745098,
  "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "temporal_patch_size": 2})";
    const char* vid = R"({
  "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true, "do_sample_frames": true,
  "fps": 2.0, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "max_frames": 768, "merge_size": 2,
  "min_frames": 4, "patch_size": 16, "processor_class": "Qwen3VLProcessor", "resample": 3,
  "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 25165824, "shortest_edge": 4096},
  "temporal_patch_size": 2, "video_processor_type": "Qwen3VLVideoProcessor"})";
    VisionConfig c;
    std::string err;
    ASSERT_TRUE(vision_config_parse(img, vid, &c, &err)) << err;
    EXPECT_EQ(c.min_pixels, 65536); EXPECT_EQ(c.max_pixels, 16777216);
    EXPECT_EQ(c.video_min_pixels, 4096); EXPECT_EQ(c.video_max_pixels, 25165824);
    EXPECT_EQ(c.resample, RESAMPLE_TORCHVISION);
    EXPECT_EQ(c.row_len(), 1536);
    // the artifact's own resources, when the test models are built (make models)
    Artifact a;
    if (artifact_open(&a, "build/models/tiny.ninfer", &err)) {
        VisionConfig d;
        EXPECT_TRUE(vision_config_parse(artifact_resource(&a, "frontend/preprocessor_config.json"),
                                        artifact_resource(&a, "frontend/video_preprocessor_config.json"), &d, &err)) << err;
        EXPECT_EQ(d.min_pixels, 65536);
        artifact_close(&a);
    }
    // refused by name
    EXPECT_FALSE(vision_config_parse(R"({"do_resize": false})", "", &c, &err));
    EXPECT_NE(err.find("do_resize"), std::string::npos);
    EXPECT_FALSE(vision_config_parse(R"({"resample": 2})", "", &c, &err));
    EXPECT_NE(err.find("resample"), std::string::npos);
    EXPECT_FALSE(vision_config_parse(R"({"crop_size": 5})", "", &c, &err));
    EXPECT_NE(err.find("crop_size: unknown member"), std::string::npos);
    ASSERT_TRUE(vision_config_parse(R"({"image_processor_type": "Qwen2VLImageProcessorPil", "min_pixels": 100})", "", &c, &err));
    EXPECT_EQ(c.resample, RESAMPLE_PIL);
    EXPECT_EQ(c.min_pixels, 100);
}
