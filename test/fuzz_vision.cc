// a mutation fuzzer for vision.h's decoders, built with asan + ubsan (make fuzz-vision).
//   build/test/fuzz_vision ITERS FILE...
// each file is decoded as is, then ITERS times mutated (bit flips, byte sets, chunk-length and
// marker-length edits, cuts, duplicated and deleted spans; png crcs mostly made valid again)
// and decoded again, and the decoded
// images preprocessed at a small size: any crash, leak, overflow or undefined behaviour stops
// the run; a failure must be one line. deterministic (a fixed xorshift seed per file).
#include "vision.h"

// rewrites every png chunk's crc, so a mutation reaches inflate, the filters and the pixel
// code instead of stopping at the first crc check
static void fix_png_crcs(std::vector<uint8_t>& g) {
    if (g.size() < 8 || g[0] != 0x89 || g[1] != 'P') return;
    size_t pos = 8;
    while (pos + 12 <= g.size()) {
        uint32_t len = (uint32_t)g[pos] << 24 | g[pos + 1] << 16 | g[pos + 2] << 8 | g[pos + 3];
        if (len > g.size() - pos - 12) return;
        uint32_t crc = png_crc(&g[pos + 4], len + 4);
        for (int i = 0; i < 4; i++) g[pos + 8 + len + i] = (uint8_t)(crc >> (24 - 8 * i));
        pos += 12 + (size_t)len;
    }
}

int main(int argc, char** argv) {
    if (argc < 3) { fprintf(stderr, "usage: fuzz_vision ITERS FILE...\n"); return 2; }
    const long iters = strtol(argv[1], nullptr, 10);
    MediaLimits lim;
    lim.max_pixels = 1 << 22;  // keeps a mutated header's allocation small under asan
    VisionConfig cfg;
    cfg.min_pixels = 1024; cfg.max_pixels = 8192;
    long runs = 0, decoded = 0;
    for (int fi = 2; fi < argc; fi++) {
        std::vector<uint8_t> orig;
        std::string err;
        if (!media_read_file(argv[fi], 1 << 26, &orig, &err)) { fprintf(stderr, "%s\n", err.c_str()); return 2; }
        uint64_t s = 0x9e3779b97f4a7c15ull ^ (uint64_t)fi * 0x100000001b3ull;
        auto rnd = [&]() { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; };
        for (long it = 0; it <= iters; it++) {
            std::vector<uint8_t> g = orig;
            if (it > 0) {
                int edits = 1 + (int)(rnd() % 6);
                for (int e = 0; e < edits && !g.empty(); e++) {
                    size_t at = rnd() % g.size();
                    switch (rnd() % 7) {
                        case 0: g[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
                        case 1: g[at] = (uint8_t)rnd(); break;
                        case 2: g[at] = (rnd() & 1) ? 0xff : 0x00; break;
                        case 3: g.resize(at); break;
                        case 4: {  // duplicate a span
                            size_t n = std::min(g.size() - at, (size_t)(rnd() % 64));
                            std::vector<uint8_t> span(g.begin() + at, g.begin() + at + n);
                            g.insert(g.begin() + rnd() % (g.size() + 1), span.begin(), span.end());
                            break;
                        }
                        case 5: g.erase(g.begin() + at, g.begin() + std::min(g.size(), at + (size_t)(rnd() % 64))); break;
                        default:  // a big-endian 16/32-bit length or dimension field
                            if (at + 4 <= g.size()) { g[at] = (uint8_t)rnd(); g[at + 1] = (uint8_t)rnd(); }
                            break;
                    }
                }
            }
            if (rnd() % 4) fix_png_crcs(g);
            Image im;
            runs++;
            if (image_decode(g.data(), g.size(), lim, &im, &err)) {
                decoded++;
                if (im.rgb.size() != (size_t)im.w * im.h * 3) { fprintf(stderr, "%s: bad image size\n", argv[fi]); return 1; }
                VisionItem v;
                if ((int64_t)im.w * im.h <= 1 << 16 && vision_image(im, cfg, &v, &err) && v.pixels.size() != (size_t)v.rows() * 1536) {
                    fprintf(stderr, "%s: bad row count\n", argv[fi]);
                    return 1;
                }
            } else if (err.empty() || err.find('\n') != std::string::npos) {
                fprintf(stderr, "%s: the error is not one line: '%s'\n", argv[fi], err.c_str());
                return 1;
            }
        }
    }
    printf("fuzz_vision: %ld decodes of %d files (%ld decoded, the rest refused with one line), no sanitizer report\n",
           runs, argc - 2, decoded);
    return 0;
}
