// vision.h: media in, patch rows out. decoders for png, jpeg and ppm/pgm (no library), exif
// orientation, and the qwen3.5 (qwen3-vl style) preprocessing of hugging face's processors:
// smart_resize, antialiased bicubic resampling, rescale + normalize, patch rows, temporal
// pairing, video frame sampling and timestamps. host code only.
//
// defines (sections in dependency order; grep for the banner "// === name"):
//   limits        MediaLimits (bytes, pixels, frames; the cli and server fill it once), Image (rgb8)
//   inflate       zlib_inflate (rfc 1950/1951, the output bounded by the caller)
//   exif          exif_orientation, image_orient (PIL's exif_transpose)
//   png, jpeg, ppm / pgm   png_decode, jpeg_decode, ppm_decode (internal: they throw MediaError)
//   decode        image_sniff, image_decode, media_read_file, image_load
//   references    media_bytes / media_image (a path, file:// or a base64 data: uri), base64_decode
//   digest        sha256_hex (the content digest a media cache keys on)
//   preprocessing VisionConfig + vision_config_parse (the artifact's preprocessor configs),
//                 smart_resize_image / _video, image_resize (torchvision or PIL rounding),
//                 VisionItem (patch rows + grid_thw + timestamps), vision_image_resized,
//                 vision_image, vision_patchify
//   video         video_sample_indices, vision_video_timestamps, vision_video, video_load (a
//                 directory of frames, a comma-separated list, or a file through an ffmpeg on PATH)
//   host threads  MediaJob, vision_prepare (a request's media on a pool of std::threads)
//   prompt        vision_expand_prompt (the processor's pad-token expansion, timestamps included)
//
// the tower's input is a VisionItem: pixels (t*h*w rows of 1536 floats) in (t, bh, bw, ih, iw)
// row order, each row (c, tp, ph, pw) as the conv3d weight [Dv, 3, 2, 16, 16] flattens, and
// grid_thw (t, h, w) in 16-pixel patches; tokens = t*h*w/4. every function is reentrant (no
// mutable state), so a request's media can be decoded and preprocessed on host threads.
//
// the math is in shared/docs/model.md 6.1-6.2; the references are PIL (decoding: every pixel
// identical; for jpeg that means libjpeg-turbo's islow idct + fancy upsampling, which is what
// PIL runs) and transformers' Qwen2VLImageProcessor (torchvision, its default),
// Qwen2VLImageProcessorPil and Qwen3VLVideoProcessor: test/gen_media_corpus.py makes the
// corpus and goldens, test/test_vision.cc checks them (identical, bit for bit).
//
// errors: nothing here crashes or allocates without a bound on bad input. every failure is one
// line in *err (what, where, what was expected) and a false return. inside the decoders a
// failure throws a private MediaError that the public entry points catch: the decoders are
// deep loops over untrusted bytes and an early return at every read would bury the logic.
// no exception leaves this header.
#pragma once
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <stdio.h>
#include <stdarg.h>
#include <math.h>
#include <string>
#include <vector>
#include <algorithm>
#include <charconv>
#include <atomic>
#include <thread>
#include <dirent.h>
#include <unistd.h>
#include <sys/stat.h>
#include <errno.h>
#include <ctype.h>
#include "format.h"  // defines: Json, json_parse (the preprocessor configs)

// === limits =====================================================================

// what one request may cost. defaults are NInfer's vision budgets (reference-engine.md 17):
// 64 Mi decoded pixels per image, 128 Mi per video, 256 MiB of media bytes, 100,000 source
// frames. a decoder checks the header's dimensions against these before it allocates.
struct MediaLimits {
    int64_t max_bytes = 256ll << 20;          // one file's encoded bytes
    int64_t max_pixels = 64ll << 20;          // one decoded image (width * height)
    int64_t max_video_pixels = 128ll << 20;   // the decoded frames of one video, summed
    int64_t max_frames = 100000;              // source frames of one video
    double max_video_seconds = 600;           // length of one video (source frames / frame rate)
};

// an 8-bit rgb image, rows top to bottom, 3 bytes per pixel
struct Image {
    int w = 0, h = 0;
    std::vector<uint8_t> rgb;  // (h, w, 3)
};

struct MediaError { std::string msg; };
static inline void media_fail(const char* fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static inline void media_fail(const char* fmt, ...) {
    char buf[512];
    va_list ap; va_start(ap, fmt); vsnprintf(buf, sizeof buf, fmt, ap); va_end(ap);
    throw MediaError{buf};
}

// === inflate ====================================================================
//
// rfc 1951 with the rfc 1950 wrapper (adler-32 checked). the output buffer is sized by the
// caller from the image header, and producing a byte more than that is an error: a
// decompression bomb costs at most the bytes its header declared, which the limits bound.

struct Huffman {
    // canonical code: codes of up to 9 bits through a 512-entry table indexed by the next 9
    // input bits (lsb first), entry = symbol << 4 | length (0: longer code or none); longer
    // codes bit by bit from the counts. building costs O(512 + n) so a stream of tiny
    // dynamic blocks cannot make table building the bottleneck.
    uint32_t fast[512];
    uint16_t count[16], symbol[320];
    void build(const uint8_t* lens, int n, const char* what) {
        memset(count, 0, sizeof count);
        for (int i = 0; i < n; i++) count[lens[i]]++;
        count[0] = 0;
        int left = 1;  // kraft: an over-subscribed code is corrupt; an incomplete one is allowed
        for (int l = 1; l < 16; l++) { left <<= 1; left -= count[l]; if (left < 0) media_fail("deflate: over-subscribed %s code", what); }
        int offs[16]; offs[1] = 0;
        for (int l = 1; l < 15; l++) offs[l + 1] = offs[l] + count[l];
        int next[16]; int code = 0;
        for (int l = 1; l < 16; l++) { code = (code + count[l - 1]) << 1; next[l] = code; }
        memset(fast, 0, sizeof fast);
        for (int s = 0; s < n; s++) {
            int l = lens[s];
            if (!l) continue;
            symbol[offs[l]++] = (uint16_t)s;
            int c = next[l]++;
            if (l > 9) continue;
            int r = 0;
            for (int b = 0; b < l; b++) r |= ((c >> b) & 1) << (l - 1 - b);  // codes are msb first
            for (int i = r; i < 512; i += 1 << l) fast[i] = (uint32_t)s << 4 | (uint32_t)l;
        }
    }
};

struct BitIn {  // lsb-first bit reader over a byte span; reads past the end are an error
    const uint8_t* p; size_t n, pos = 0; uint64_t bits = 0; int have = 0;
    BitIn(const uint8_t* d, size_t len) : p(d), n(len) {}
    void fill() { while (have <= 56) { uint64_t b = pos < n ? p[pos] : 0; pos++; bits |= b << have; have += 8; } }
    uint32_t peek(int k) { if (have < k) fill(); return (uint32_t)(bits & ((1ull << k) - 1)); }
    void drop(int k) {
        bits >>= k; have -= k;
        if (pos > n && (int64_t)(pos - n) * 8 > have) media_fail("deflate: compressed data ends early (truncated)");
    }
    uint32_t get(int k) { if (!k) return 0; uint32_t v = peek(k); drop(k); return v; }
    int sym(const Huffman& h) {
        uint32_t bits15 = peek(15), e = h.fast[bits15 & 511];
        if (e) { drop(e & 15); return (int)(e >> 4); }
        int code = 0, first = 0, index = 0;  // canonical decode, one bit at a time
        for (int l = 1; l < 16; l++) {
            code |= (bits15 >> (l - 1)) & 1;
            int c = h.count[l];
            if (code - first < c) { drop(l); return h.symbol[index + code - first]; }
            index += c; first += c; first <<= 1; code <<= 1;
        }
        media_fail("deflate: invalid huffman code");
    }
    void align() { drop(have & 7); }
    size_t consumed() const { return pos - have / 8; }  // whole bytes read (after align)
    size_t restart() { align(); pos = consumed(); bits = 0; have = 0; return pos; }  // to a byte boundary
};

// inflates the zlib stream src into exactly out_n bytes at out; false with *err otherwise
static inline void zlib_inflate_raw(const uint8_t* src, size_t n, uint8_t* out, size_t out_n) {
    if (n < 6) media_fail("zlib: stream of %zu bytes is too short", n);
    int cmf = src[0], flg = src[1];
    if ((cmf & 15) != 8 || (cmf >> 4) > 7) media_fail("zlib: compression method %d (window %d) is not deflate", cmf & 15, cmf >> 4);
    if ((cmf * 256 + flg) % 31) media_fail("zlib: header check bits are wrong");
    if (flg & 32) media_fail("zlib: a preset dictionary is not allowed here");
    BitIn in(src + 2, n - 2);
    size_t o = 0;
    static const uint16_t lbase[29] = {3,4,5,6,7,8,9,10,11,13,15,17,19,23,27,31,35,43,51,59,67,83,99,115,131,163,195,227,258};
    static const uint8_t lext[29] = {0,0,0,0,0,0,0,0,1,1,1,1,2,2,2,2,3,3,3,3,4,4,4,4,5,5,5,5,0};
    static const uint16_t dbase[30] = {1,2,3,4,5,7,9,13,17,25,33,49,65,97,129,193,257,385,513,769,1025,1537,2049,3073,4097,6145,8193,12289,16385,24577};
    static const uint8_t dext[30] = {0,0,0,0,1,1,2,2,3,3,4,4,5,5,6,6,7,7,8,8,9,9,10,10,11,11,12,12,13,13};
    Huffman lit, dist, fixed_lit, fixed_dist;
    bool fixed_built = false;
    for (;;) {
        int final = (int)in.get(1), type = (int)in.get(2);
        if (type == 0) {
            size_t at = in.restart();  // byte-aligned now: LEN, NLEN, then LEN raw bytes
            if (in.n - at < 4) media_fail("deflate: stored block header truncated");
            uint32_t len = in.p[at] | in.p[at + 1] << 8, nlen = in.p[at + 2] | in.p[at + 3] << 8;
            if ((len ^ 0xffff) != nlen) media_fail("deflate: stored block length check fails");
            if (in.n - at - 4 < len) media_fail("deflate: stored block truncated");
            if (len > out_n - o) media_fail("zlib: the data inflates to more than the %zu bytes the image holds", out_n);
            memcpy(out + o, in.p + at + 4, len); o += len;
            in.pos = at + 4 + len;
        } else if (type == 3) {
            media_fail("deflate: block type 3 is reserved");
        } else {
            const Huffman *L, *D;
            if (type == 1) {
                if (!fixed_built) {
                    uint8_t l[288], d[30];
                    for (int i = 0; i < 288; i++) l[i] = i < 144 ? 8 : i < 256 ? 9 : i < 280 ? 7 : 8;
                    for (int i = 0; i < 30; i++) d[i] = 5;
                    fixed_lit.build(l, 288, "literal/length"); fixed_dist.build(d, 30, "distance");
                    fixed_built = true;
                }
                L = &fixed_lit; D = &fixed_dist;
            } else {
                int hlit = (int)in.get(5) + 257, hdist = (int)in.get(5) + 1, hclen = (int)in.get(4) + 4;
                if (hlit > 286 || hdist > 30) media_fail("deflate: %d literal or %d distance codes (at most 286, 30)", hlit, hdist);
                static const uint8_t ord[19] = {16,17,18,0,8,7,9,6,10,5,11,4,12,3,13,2,14,1,15};
                uint8_t cl[19] = {0};
                for (int i = 0; i < hclen; i++) cl[ord[i]] = (uint8_t)in.get(3);
                Huffman ch; ch.build(cl, 19, "code length");
                uint8_t lens[316] = {0};
                int k = 0;
                while (k < hlit + hdist) {
                    int s = in.sym(ch);
                    if (s < 16) lens[k++] = (uint8_t)s;
                    else {
                        int rep, v = 0;
                        if (s == 16) { if (!k) media_fail("deflate: repeat with no previous length"); v = lens[k - 1]; rep = 3 + (int)in.get(2); }
                        else if (s == 17) rep = 3 + (int)in.get(3);
                        else rep = 11 + (int)in.get(7);
                        if (k + rep > hlit + hdist) media_fail("deflate: code lengths overrun");
                        while (rep--) lens[k++] = (uint8_t)v;
                    }
                }
                if (!lens[256]) media_fail("deflate: no end-of-block code");
                lit.build(lens, hlit, "literal/length"); dist.build(lens + hlit, hdist, "distance");
                L = &lit; D = &dist;
            }
            for (;;) {
                int s = in.sym(*L);
                if (s < 256) {
                    if (o >= out_n) media_fail("zlib: the data inflates to more than the %zu bytes the image holds", out_n);
                    out[o++] = (uint8_t)s;
                } else if (s == 256) break;
                else {
                    s -= 257;
                    if (s >= 29) media_fail("deflate: invalid length symbol");
                    size_t len = lbase[s] + in.get(lext[s]);
                    int ds = in.sym(*D);
                    if (ds >= 30) media_fail("deflate: invalid distance symbol");
                    size_t d = dbase[ds] + in.get(dext[ds]);
                    if (d > o) media_fail("deflate: distance %zu reaches before the start of the data", d);
                    if (len > out_n - o) media_fail("zlib: the data inflates to more than the %zu bytes the image holds", out_n);
                    for (size_t i = 0; i < len; i++, o++) out[o] = out[o - d];
                }
            }
        }
        if (final) break;
    }
    if (o != out_n) media_fail("zlib: the data inflates to %zu bytes, the image needs %zu (truncated)", o, out_n);
    size_t at = 2 + in.restart();
    if (n < at + 4) media_fail("zlib: adler-32 checksum missing (truncated)");
    uint32_t want = (uint32_t)src[at] << 24 | src[at + 1] << 16 | src[at + 2] << 8 | src[at + 3];
    uint32_t a = 1, b = 0;
    for (size_t i = 0; i < out_n;) {
        size_t m = std::min(out_n - i, (size_t)5552);
        for (size_t j = 0; j < m; j++) { a += out[i + j]; b += a; }
        a %= 65521; b %= 65521; i += m;
    }
    if ((b << 16 | a) != want) media_fail("zlib: adler-32 checksum mismatch (corrupt data)");
}

// the public form: false and one line in *err on bad data
static inline bool zlib_inflate(const uint8_t* src, size_t n, uint8_t* out, size_t out_n, std::string* err) {
    try { zlib_inflate_raw(src, n, out, out_n); return true; }
    catch (const MediaError& e) { *err = e.msg; return false; }
}

// === exif orientation ===========================================================
//
// the orientation tag (0x0112) of a tiff-structured exif block, 1..8, else 1. PIL's
// ImageOps.exif_transpose (what hugging face's load_image runs) reads the same tag of ifd0.

static inline int exif_orientation(const uint8_t* t, size_t n) {
    if (n < 8) return 1;
    bool le = t[0] == 'I' && t[1] == 'I';
    if (!le && !(t[0] == 'M' && t[1] == 'M')) return 1;
    auto u16 = [&](size_t o) -> uint32_t { return le ? t[o] | t[o + 1] << 8 : t[o] << 8 | t[o + 1]; };
    auto u32 = [&](size_t o) -> uint32_t { return le ? u16(o) | u16(o + 2) << 16 : u16(o) << 16 | u16(o + 2); };
    if (u16(2) != 42) return 1;
    size_t ifd = u32(4);
    if (ifd > n - 2) return 1;
    size_t cnt = u16(ifd);
    for (size_t i = 0; i < cnt; i++) {
        size_t e = ifd + 2 + 12 * i;
        if (e + 12 > n) return 1;
        if (u16(e) == 0x0112 && u16(e + 2) == 3 && u32(e + 4) >= 1) {  // SHORT, the value inline
            uint32_t v = u16(e + 8);
            return v >= 1 && v <= 8 ? (int)v : 1;
        }
    }
    return 1;
}

// applies an exif orientation as PIL's exif_transpose does: 2 mirror, 3 rotate 180, 4 flip,
// 5 transpose, 6 rotate 90 clockwise, 7 transverse, 8 rotate 90 counter-clockwise
static inline void image_orient(Image* im, int o) {
    if (o <= 1 || o > 8) return;
    const int w = im->w, h = im->h;
    const bool swap = o >= 5;
    const int W = swap ? h : w, H = swap ? w : h;
    std::vector<uint8_t> out((size_t)W * H * 3);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            int sx, sy;  // the source pixel of output (x, y)
            switch (o) {
                case 2: sx = w - 1 - x; sy = y; break;
                case 3: sx = w - 1 - x; sy = h - 1 - y; break;
                case 4: sx = x; sy = h - 1 - y; break;
                case 5: sx = y; sy = x; break;
                case 6: sx = y; sy = h - 1 - x; break;
                case 7: sx = w - 1 - y; sy = h - 1 - x; break;
                default: sx = w - 1 - y; sy = x; break;  // 8
            }
            memcpy(&out[((size_t)y * W + x) * 3], &im->rgb[((size_t)sy * w + sx) * 3], 3);
        }
    im->w = W; im->h = H; im->rgb.swap(out);
}

static inline void check_dims(const char* fmt, int64_t w, int64_t h, const MediaLimits& lim) {
    if (w <= 0 || h <= 0) media_fail("%s: image size %lldx%lld is empty", fmt, (long long)w, (long long)h);
    if (w > (1 << 30) || h > (1 << 30) || w * h > lim.max_pixels)
        media_fail("%s: image size %lldx%lld is over the limit of %lld pixels (a decompression bomb?)", fmt,
                   (long long)w, (long long)h, (long long)lim.max_pixels);
}

// === png ========================================================================
//
// every color type and bit depth, palette (+ tRNS), adam7 interlace; chunk crcs and the zlib
// stream's adler-32 are checked. the output is what PIL's convert("RGB") gives, alpha and
// transparency dropped, 16-bit samples by their high byte, with one decision of ours:
// 16-bit grayscale is its high byte too, where PIL clamps the 16-bit value to 255 (its I;16
// to RGB conversion), which would turn a real 16-bit scan white.

struct PngCrcTable {
    uint32_t t[256];
    PngCrcTable() {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
            t[i] = c;
        }
    }
};

static inline uint32_t png_crc(const uint8_t* p, size_t n) {
    static const PngCrcTable table;  // a magic static: thread-safe initialisation
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = table.t[(c ^ p[i]) & 255] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

static inline void png_decode(const uint8_t* d, size_t n, const MediaLimits& lim, Image* out, int* orientation) {
    auto be32 = [](const uint8_t* p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; };
    size_t pos = 8;
    int64_t w = 0, h = 0;
    int depth = 0, ctype = -1, interlace = 0;
    std::vector<uint8_t> idat, plte;
    bool seen_ihdr = false, seen_iend = false, idat_done = false;
    while (pos < n) {
        if (n - pos < 12) media_fail("png: chunk header at byte %zu is truncated", pos);
        uint32_t len = be32(d + pos);
        char type[5] = {(char)d[pos + 4], (char)d[pos + 5], (char)d[pos + 6], (char)d[pos + 7], 0};
        for (int i = 0; i < 4; i++)
            if (!((type[i] >= 'A' && type[i] <= 'Z') || (type[i] >= 'a' && type[i] <= 'z'))) media_fail("png: chunk at byte %zu has an invalid type", pos);
        if (len > 0x7fffffffu) media_fail("png: chunk %s at byte %zu declares %u bytes (at most 2^31-1)", type, pos, len);
        if (len > n - pos - 12) media_fail("png: chunk %s at byte %zu declares %u bytes, the file has %zu left (truncated)", type, pos, len, n - pos - 12);
        const uint8_t* c = d + pos + 8;
        if (png_crc(d + pos + 4, len + 4) != be32(c + len)) media_fail("png: chunk %s at byte %zu: crc mismatch (corrupt file)", type, pos);
        if (!seen_ihdr && strcmp(type, "IHDR")) media_fail("png: the first chunk is %s, expected IHDR", type);
        if (!strcmp(type, "IHDR")) {
            if (seen_ihdr) media_fail("png: a second IHDR chunk");
            if (len != 13) media_fail("png: IHDR has %u bytes, expected 13", len);
            seen_ihdr = true;
            w = be32(c); h = be32(c + 4); depth = c[8]; ctype = c[9]; interlace = c[12];
            if (w > 0x7fffffff || h > 0x7fffffff) media_fail("png: image size %lldx%lld is out of range", (long long)w, (long long)h);
            bool ok = (ctype == 0 && (depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16)) ||
                      (ctype == 3 && (depth == 1 || depth == 2 || depth == 4 || depth == 8)) ||
                      ((ctype == 2 || ctype == 4 || ctype == 6) && (depth == 8 || depth == 16));
            if (!ok) media_fail("png: color type %d with bit depth %d is not a valid combination", ctype, depth);
            if (c[10] || c[11]) media_fail("png: compression method %d / filter method %d (expected 0 / 0)", c[10], c[11]);
            if (interlace > 1) media_fail("png: interlace method %d (expected 0 or 1)", interlace);
            check_dims("png", w, h, lim);
        } else if (!strcmp(type, "PLTE")) {
            if (len % 3 || len == 0 || len > 768) media_fail("png: PLTE has %u bytes (a multiple of 3, at most 768)", len);
            if (!idat.empty()) media_fail("png: PLTE after IDAT");
            plte.assign(c, c + len);
        } else if (!strcmp(type, "IDAT")) {
            if (idat_done) media_fail("png: IDAT chunks are not consecutive");
            idat.insert(idat.end(), c, c + len);
        } else if (!strcmp(type, "IEND")) {
            seen_iend = true;
            break;
        } else if (!strcmp(type, "eXIf")) {  // a tiff block; some writers (PIL) put jpeg's "Exif\0\0" first
            bool pre = len >= 6 && !memcmp(c, "Exif\0\0", 6);
            *orientation = exif_orientation(c + (pre ? 6 : 0), len - (pre ? 6 : 0));
        } else if (type[0] >= 'A' && type[0] <= 'Z') {
            media_fail("png: unknown critical chunk %s", type);
        }
        if (!idat.empty() && strcmp(type, "IDAT")) idat_done = true;
        pos += 12 + (size_t)len;
    }
    if (!seen_ihdr) media_fail("png: no IHDR chunk");
    if (idat.empty()) media_fail("png: no IDAT chunk (no image data)");
    if (!seen_iend) media_fail("png: no IEND chunk (truncated file)");
    if (ctype == 3 && plte.empty()) media_fail("png: a palette image without a PLTE chunk");
    const int ch = ctype == 0 ? 1 : ctype == 2 ? 3 : ctype == 3 ? 1 : ctype == 4 ? 2 : 4;
    const int bits = ch * depth, bpp = std::max(1, bits / 8);
    static const int ax0[7] = {0, 4, 0, 2, 0, 1, 0}, ay0[7] = {0, 0, 4, 0, 2, 0, 1};
    static const int adx[7] = {8, 8, 4, 4, 2, 2, 1}, ady[7] = {8, 8, 8, 4, 4, 2, 2};
    const int passes = interlace ? 7 : 1;
    int64_t pw[7], ph[7];
    size_t total = 0;
    for (int p = 0; p < passes; p++) {
        pw[p] = interlace ? (w - ax0[p] + adx[p] - 1) / adx[p] : w;
        ph[p] = interlace ? (h - ay0[p] + ady[p] - 1) / ady[p] : h;
        if (pw[p] > 0 && ph[p] > 0) total += (size_t)ph[p] * (1 + (size_t)((pw[p] * bits + 7) / 8));
    }
    std::vector<uint8_t> raw(total);
    zlib_inflate_raw(idat.data(), idat.size(), raw.data(), raw.size());
    out->w = (int)w; out->h = (int)h;
    out->rgb.assign((size_t)w * h * 3, 0);
    const size_t npal = plte.size() / 3;
    uint8_t* q = raw.data();
    std::vector<uint8_t> prev;
    for (int p = 0; p < passes; p++) {
        if (pw[p] <= 0 || ph[p] <= 0) continue;
        const size_t rb = (size_t)((pw[p] * bits + 7) / 8);
        prev.assign(rb, 0);
        for (int64_t y = 0; y < ph[p]; y++, q += 1 + rb) {
            uint8_t f = q[0], *r = q + 1;
            if (f > 4) media_fail("png: row %lld has filter type %d (0..4)", (long long)y, f);
            for (size_t i = 0; i < rb; i++) {
                int a = i >= (size_t)bpp ? r[i - bpp] : 0, b = prev[i], cc = i >= (size_t)bpp ? prev[i - bpp] : 0;
                int v = r[i];
                if (f == 1) v += a;
                else if (f == 2) v += b;
                else if (f == 3) v += (a + b) >> 1;
                else if (f == 4) {
                    int pp = a + b - cc, pa = abs(pp - a), pb = abs(pp - b), pc = abs(pp - cc);
                    v += pa <= pb && pa <= pc ? a : pb <= pc ? b : cc;
                }
                r[i] = (uint8_t)v;
            }
            memcpy(prev.data(), r, rb);
            const int64_t oy = interlace ? ay0[p] + y * ady[p] : y;
            for (int64_t x = 0; x < pw[p]; x++) {
                const int64_t ox = interlace ? ax0[p] + x * adx[p] : x;
                uint8_t* o = &out->rgb[((size_t)oy * w + ox) * 3];
                auto sample = [&](int k) -> int {  // channel k of pixel x, scaled to 8 bits
                    if (depth == 8) return r[x * ch + k];
                    if (depth == 16) return r[(x * ch + k) * 2];  // the high byte
                    int64_t bit = x * depth;
                    int v = (r[bit >> 3] >> (8 - depth - (bit & 7))) & ((1 << depth) - 1);
                    return ctype == 3 ? v : v * 255 / ((1 << depth) - 1);
                };
                if (ctype == 3) {
                    size_t idx = (size_t)sample(0);
                    if (idx < npal) memcpy(o, &plte[idx * 3], 3);  // an index past the palette is black, as in PIL
                } else if (ch <= 2) {
                    o[0] = o[1] = o[2] = (uint8_t)sample(0);
                } else {
                    o[0] = (uint8_t)sample(0); o[1] = (uint8_t)sample(1); o[2] = (uint8_t)sample(2);
                }
            }
        }
    }
}

// === jpeg =======================================================================
//
// baseline and extended (sof0/sof1) and progressive (sof2) huffman jpeg, 8-bit, 1 or 3
// components at any integral sampling, restart markers. the arithmetic is libjpeg-turbo's
// default decode, which is what PIL runs: the islow integer idct (jidctint.c's constants and
// rounding), its range limiting, "fancy" triangular upsampling for h2v1, h2v2 and h1v2
// chroma (plain replication when the chroma is at most 2 samples wide, or for other ratios),
// and the fixed-point ycc->rgb tables of jdcolor.c. so the output matches PIL exactly on
// valid files (test/test_vision.cc asserts a tolerance of 0); on corrupt entropy data
// both fill with zeros from the marker on, as libjpeg does.

struct JpegHuff {
    uint16_t fast[512];         // next 9 bits (msb first) -> symbol << 4 | length, 0: slow path
    int32_t maxcode[18], valptr[17], mincode[17];
    uint8_t vals[256];
    bool defined = false;
    void build(const uint8_t* counts, const uint8_t* v, int nv) {
        memcpy(vals, v, nv);
        int code = 0, k = 0;
        memset(fast, 0, sizeof fast);
        for (int l = 1; l <= 16; l++) {
            valptr[l] = k; mincode[l] = code;
            for (int i = 0; i < counts[l - 1]; i++, k++, code++) {
                // as libjpeg: the codes of a length must end below all-ones
                if (code + 1 >= (1 << l)) media_fail("jpeg: huffman table is over-subscribed");
                if (l <= 9)
                    for (int j = 0; j < 1 << (9 - l); j++) fast[(code << (9 - l)) | j] = (uint16_t)(vals[k] << 4 | l);
            }
            maxcode[l] = counts[l - 1] ? code - 1 : -1;
            code <<= 1;
        }
        maxcode[17] = 0x7fffffff;
        defined = true;
    }
};

struct JpegBits {  // msb-first entropy-coded bits; 0xff00 is a data 0xff; at a marker, zeros
    const uint8_t* p; size_t n, pos; uint32_t buf = 0; int cnt = 0; bool at_marker = false;
    void fill() {
        while (cnt <= 24) {
            uint32_t b = 0;
            if (!at_marker) {
                if (pos >= n) media_fail("jpeg: entropy-coded data ends early (truncated file)");
                b = p[pos];
                if (b == 0xff) {
                    if (pos + 1 >= n) media_fail("jpeg: entropy-coded data ends early (truncated file)");
                    if (p[pos + 1] == 0) pos += 2;
                    else { at_marker = true; b = 0; }
                } else pos++;
            }
            buf |= b << (24 - cnt); cnt += 8;
        }
    }
    int get(int k) {  // k <= 16
        if (!k) return 0;
        if (cnt < k) fill();
        int v = (int)(buf >> (32 - k));
        buf <<= k; cnt -= k;
        return v;
    }
    int decode(const JpegHuff& h) {
        if (cnt < 16) fill();
        uint32_t e = h.fast[buf >> 23];
        if (e) { buf <<= e & 15; cnt -= e & 15; return (int)(e >> 4); }
        int l = 10, code = (int)(buf >> 22);
        while (l <= 16 && code > h.maxcode[l]) { l++; code = (int)(buf >> (32 - l)); }
        if (l > 16) media_fail("jpeg: invalid huffman code (corrupt data)");
        buf <<= l; cnt -= l;
        return h.vals[h.valptr[l] + code - h.mincode[l]];
    }
    static int extend(int v, int s) { return s && v < (1 << (s - 1)) ? v - (1 << s) + 1 : v; }
    int receive(int s) { return extend(get(s), s); }
    void reset() { buf = 0; cnt = 0; at_marker = false; }
};

struct JpegComp {
    int id = 0, h = 1, v = 1, tq = 0;
    int bw = 0, bh = 0;   // blocks per row / column in the mcu-padded layout
    int dw = 0, dh = 0;   // downsampled size: ceil(W * h / hmax), ceil(H * v / vmax)
    int td = 0, ta = 0, pred = 0;
    std::vector<int16_t> coef;  // (bh, bw, 64), natural order
};

// zigzag -> natural order, padded so a corrupt run past 63 lands on 63 (as libjpeg's table)
static const uint8_t kJpegNatural[80] = {
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6, 7, 14, 21, 28,
    35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
    63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63};

// jidctint.c's jpeg_idct_islow: two 1-d passes (columns, then rows) of the same butterfly
// with 13-bit constants, 2 extra bits kept after pass 1, the output through the 1024-entry
// range-limit table (a clamp for sums in [-512, 511], wrapping beyond, as libjpeg's table)
static inline void jpeg_idct_1d(const int64_t x[8], int64_t y[8]) {
    enum { CB = 13 };
    const int64_t F0298 = 2446, F0390 = 3196, F0541 = 4433, F0765 = 6270, F0899 = 7373, F1175 = 9633, F1501 = 12299,
                  F1847 = 15137, F1961 = 16069, F2053 = 16819, F2562 = 20995, F3072 = 25172;
    int64_t z2 = x[2], z3 = x[6];  // even part
    int64_t z1 = (z2 + z3) * F0541;
    int64_t tmp2 = z1 + z3 * -F1847, tmp3 = z1 + z2 * F0765;
    int64_t tmp0 = (x[0] + x[4]) * (1 << CB), tmp1 = (x[0] - x[4]) * (1 << CB);
    int64_t t10 = tmp0 + tmp3, t13 = tmp0 - tmp3, t11 = tmp1 + tmp2, t12 = tmp1 - tmp2;
    tmp0 = x[7]; tmp1 = x[5]; tmp2 = x[3]; tmp3 = x[1];  // odd part
    z1 = tmp0 + tmp3; z2 = tmp1 + tmp2; z3 = tmp0 + tmp2; int64_t z4 = tmp1 + tmp3;
    int64_t z5 = (z3 + z4) * F1175;
    tmp0 *= F0298; tmp1 *= F2053; tmp2 *= F3072; tmp3 *= F1501;
    z1 *= -F0899; z2 *= -F2562; z3 *= -F1961; z4 *= -F0390;
    z3 += z5; z4 += z5;
    tmp0 += z1 + z3; tmp1 += z2 + z4; tmp2 += z2 + z3; tmp3 += z1 + z4;
    y[0] = t10 + tmp3; y[7] = t10 - tmp3; y[1] = t11 + tmp2; y[6] = t11 - tmp2;
    y[2] = t12 + tmp1; y[5] = t12 - tmp1; y[3] = t13 + tmp0; y[4] = t13 - tmp0;
}

static inline void jpeg_idct_islow(const int16_t* in, const uint16_t* q, uint8_t* out, int stride) {
    enum { CB = 13, P1 = 2 };
    int32_t ws[64];
    auto descale = [](int64_t x, int n) { return (x + ((int64_t)1 << (n - 1))) >> n; };
    int64_t x[8], y[8];
    for (int c = 0; c < 8; c++) {
        const int16_t* ip = in + c;
        if (!ip[8] && !ip[16] && !ip[24] && !ip[32] && !ip[40] && !ip[48] && !ip[56]) {  // dc only (libjpeg's shortcut, same result)
            int32_t dc = (int32_t)((int64_t)ip[0] * q[c] * (1 << P1));
            for (int r = 0; r < 8; r++) ws[r * 8 + c] = dc;
            continue;
        }
        for (int r = 0; r < 8; r++) x[r] = (int64_t)ip[8 * r] * q[8 * r + c];
        jpeg_idct_1d(x, y);
        for (int r = 0; r < 8; r++) ws[r * 8 + c] = (int32_t)descale(y[r], CB - P1);
    }
    auto limit = [](int64_t v) -> uint8_t {
        int m = (int)(v & 1023);
        return m < 128 ? (uint8_t)(m + 128) : m < 512 ? 255 : m < 896 ? 0 : (uint8_t)(m - 896);
    };
    for (int r = 0; r < 8; r++) {
        for (int k = 0; k < 8; k++) x[k] = ws[r * 8 + k];
        jpeg_idct_1d(x, y);
        uint8_t* o = out + (size_t)r * stride;
        for (int k = 0; k < 8; k++) o[k] = limit(descale(y[k], CB + P1 + 3));
    }
}

static inline void jpeg_decode(const uint8_t* d, size_t n, const MediaLimits& lim, Image* out, int* orientation) {
    JpegHuff dc[4], ac[4];
    uint16_t qt[4][64];
    bool qdef[4] = {false, false, false, false};
    std::vector<JpegComp> comps;
    int W = 0, H = 0, hmax = 1, vmax = 1, mcux = 0, mcuy = 0, restart = 0, adobe = -1, scans = 0;
    bool progressive = false, jfif = false, seen_exif = false, frame = false, eoi = false;
    size_t pos = 2;
    auto be16 = [&](size_t o) { return (int)(d[o] << 8 | d[o + 1]); };
    while (pos < n && !eoi) {
        if (d[pos] != 0xff) media_fail("jpeg: expected a marker at byte %zu, found 0x%02x", pos, d[pos]);
        while (pos < n && d[pos] == 0xff) pos++;  // fill bytes
        if (pos >= n) break;
        int m = d[pos++];
        if (m == 0xd9) { eoi = true; break; }
        if (m >= 0xd0 && m <= 0xd7) continue;  // a stray restart marker
        if (m == 0x01 || m == 0) continue;
        if (n - pos < 2) media_fail("jpeg: marker 0x%02x at byte %zu is truncated", m, pos - 1);
        size_t len = (size_t)be16(pos);
        if (len < 2 || len > n - pos) media_fail("jpeg: marker 0x%02x at byte %zu declares %zu bytes, %zu are left (truncated)", m, pos - 1, len, n - pos);
        const uint8_t* s = d + pos + 2;
        const size_t sl = len - 2;
        if (m == 0xc0 || m == 0xc1 || m == 0xc2) {
            if (frame) media_fail("jpeg: a second frame header (multi-frame jpeg is not supported)");
            frame = true; progressive = m == 0xc2;
            if (sl < 6) media_fail("jpeg: frame header truncated");
            if (s[0] != 8) media_fail("jpeg: %d-bit samples (only 8-bit jpeg is supported)", s[0]);
            H = s[1] << 8 | s[2]; W = s[3] << 8 | s[4];
            int nc = s[5];
            if (H == 0) media_fail("jpeg: image height 0 (a DNL marker height is not supported)");
            check_dims("jpeg", W, H, lim);
            if (nc == 4) media_fail("jpeg: 4-component (CMYK/YCCK) jpeg is not supported");
            if (nc != 1 && nc != 3) media_fail("jpeg: %d components (1 or 3 are supported)", nc);
            if (sl < 6 + 3 * (size_t)nc) media_fail("jpeg: frame header truncated");
            for (int i = 0; i < nc; i++) {
                JpegComp c;
                c.id = s[6 + 3 * i]; c.h = s[7 + 3 * i] >> 4; c.v = s[7 + 3 * i] & 15; c.tq = s[8 + 3 * i];
                if (c.h < 1 || c.h > 4 || c.v < 1 || c.v > 4) media_fail("jpeg: component %d has sampling %dx%d (1..4)", c.id, c.h, c.v);
                if (c.tq > 3) media_fail("jpeg: component %d uses quantization table %d (0..3)", c.id, c.tq);
                for (auto& o : comps) if (o.id == c.id) media_fail("jpeg: duplicate component id %d", c.id);
                hmax = std::max(hmax, c.h); vmax = std::max(vmax, c.v);
                comps.push_back(c);
            }
            mcux = (W + 8 * hmax - 1) / (8 * hmax); mcuy = (H + 8 * vmax - 1) / (8 * vmax);
            for (auto& c : comps) {
                if (hmax % c.h || vmax % c.v) media_fail("jpeg: fractional sampling (%dx%d of %dx%d) is not supported", c.h, c.v, hmax, vmax);
                c.bw = mcux * c.h; c.bh = mcuy * c.v;
                c.dw = (int)(((int64_t)W * c.h + hmax - 1) / hmax); c.dh = (int)(((int64_t)H * c.v + vmax - 1) / vmax);
                c.coef.assign((size_t)c.bw * c.bh * 64, 0);
            }
        } else if ((m >= 0xc3 && m <= 0xcf) && m != 0xc4 && m != 0xc8 && m != 0xcc) {
            media_fail("jpeg: %s jpeg (marker 0x%02x) is not supported (baseline and progressive huffman only)",
                       m == 0xc3 || m == 0xc7 || m == 0xcb || m == 0xcf ? "lossless" : m >= 0xc9 ? "arithmetic-coded" : "hierarchical", m);
        } else if (m == 0xc4) {
            size_t o = 0;
            while (o < sl) {
                if (sl - o < 17) media_fail("jpeg: huffman table truncated");
                int tc = s[o] >> 4, th = s[o] & 15;
                if (tc > 1 || th > 3) media_fail("jpeg: huffman table class %d id %d (0..1, 0..3)", tc, th);
                int total = 0;
                for (int i = 0; i < 16; i++) total += s[o + 1 + i];
                if (total > 256 || sl - o - 17 < (size_t)total) media_fail("jpeg: huffman table with %d codes is truncated or too large", total);
                (tc ? ac : dc)[th].build(s + o + 1, s + o + 17, total);
                o += 17 + total;
            }
        } else if (m == 0xdb) {
            size_t o = 0;
            while (o < sl) {
                int pq = s[o] >> 4, tq = s[o] & 15;
                if (pq > 1 || tq > 3) media_fail("jpeg: quantization table precision %d id %d (0..1, 0..3)", pq, tq);
                size_t need = 1 + 64 * (pq + 1);
                if (sl - o < need) media_fail("jpeg: quantization table truncated");
                for (int i = 0; i < 64; i++) qt[tq][kJpegNatural[i]] = pq ? (uint16_t)(s[o + 1 + 2 * i] << 8 | s[o + 2 + 2 * i]) : s[o + 1 + i];
                qdef[tq] = true;
                o += need;
            }
        } else if (m == 0xdd) {
            if (sl < 2) media_fail("jpeg: restart interval marker truncated");
            restart = s[0] << 8 | s[1];
        } else if (m == 0xdc) {
            media_fail("jpeg: a DNL marker (height defined later) is not supported");
        } else if (m == 0xe0) {
            if (sl >= 5 && !memcmp(s, "JFIF\0", 5)) jfif = true;
        } else if (m == 0xe1) {
            if (!seen_exif && sl >= 6 && !memcmp(s, "Exif\0\0", 6)) { seen_exif = true; *orientation = exif_orientation(s + 6, sl - 6); }
        } else if (m == 0xee) {
            if (sl >= 12 && !memcmp(s, "Adobe", 5)) adobe = s[11];
        } else if (m == 0xda) {
            if (!frame) media_fail("jpeg: scan before the frame header");
            if (sl < 1) media_fail("jpeg: scan header truncated");
            int ns = s[0];
            if (ns < 1 || ns > 4 || sl < 4 + 2 * (size_t)ns) media_fail("jpeg: scan header with %d components is malformed", ns);
            std::vector<JpegComp*> sc;
            for (int i = 0; i < ns; i++) {
                JpegComp* c = nullptr;
                for (auto& o : comps) if (o.id == s[1 + 2 * i]) c = &o;
                if (!c) media_fail("jpeg: scan names component %d, which the frame does not have", s[1 + 2 * i]);
                for (auto* o : sc) if (o == c) media_fail("jpeg: scan names component %d twice", c->id);
                c->td = s[2 + 2 * i] >> 4; c->ta = s[2 + 2 * i] & 15;
                if (c->td > 3 || c->ta > 3) media_fail("jpeg: scan uses huffman table %d/%d (0..3)", c->td, c->ta);
                sc.push_back(c);
            }
            int Ss = s[1 + 2 * ns], Se = s[2 + 2 * ns], Ah = s[3 + 2 * ns] >> 4, Al = s[3 + 2 * ns] & 15;
            if (progressive) {
                bool okp = Ss <= Se && Se <= 63 && Ah <= 13 && Al <= 13 && ((Ss == 0) == (Se == 0)) && (Ss == 0 || ns == 1);
                if (!okp) media_fail("jpeg: progressive scan parameters Ss=%d Se=%d Ah=%d Al=%d are invalid", Ss, Se, Ah, Al);
            } else {
                Ss = 0; Se = 63; Ah = Al = 0;
            }
            const bool dc_scan = Ss == 0;
            for (auto* c : sc) {
                if (dc_scan && Ah == 0 && !dc[c->td].defined) media_fail("jpeg: scan uses undefined dc huffman table %d", c->td);
                if ((!progressive || Ss > 0) && !ac[c->ta].defined) media_fail("jpeg: scan uses undefined ac huffman table %d", c->ta);
                c->pred = 0;
            }
            JpegBits b{d, n, pos + len};
            int eobrun = 0, rst_next = 0;
            const bool single = ns == 1;
            // a non-interleaved scan covers the component's own blocks, an interleaved one mcus
            const int ux = single ? (sc[0]->dw + 7) / 8 : mcux, uy = single ? (sc[0]->dh + 7) / 8 : mcuy;
            const int64_t units = (int64_t)ux * uy;
            int64_t todo = restart;
            auto block = [&](JpegComp* c, int bx, int by) {
                int16_t* blk = &c->coef[((size_t)by * c->bw + bx) * 64];
                if (!progressive) {
                    int t = b.decode(dc[c->td]);
                    if (t > 11) media_fail("jpeg: dc magnitude category %d (corrupt data)", t);
                    c->pred = (int)((unsigned)c->pred + (unsigned)b.receive(t));  // wraps as libjpeg's int would, without ub
                    blk[0] = (int16_t)c->pred;
                    for (int k = 1; k < 64; k++) {
                        int rs = b.decode(ac[c->ta]), r = rs >> 4, sz = rs & 15;
                        if (sz) { k += r; blk[kJpegNatural[k]] = (int16_t)b.receive(sz); }
                        else if (r == 15) k += 15;
                        else break;
                    }
                } else if (dc_scan) {
                    if (Ah == 0) {
                        int t = b.decode(dc[c->td]);
                        if (t > 11) media_fail("jpeg: dc magnitude category %d (corrupt data)", t);
                        c->pred = (int)((unsigned)c->pred + (unsigned)b.receive(t));  // wraps as libjpeg's int would, without ub
                        blk[0] = (int16_t)(int)((unsigned)c->pred << Al);
                    } else if (b.get(1)) {
                        blk[0] = (int16_t)(blk[0] | (1 << Al));
                    }
                } else if (Ah == 0) {
                    if (eobrun > 0) { eobrun--; return; }
                    for (int k = Ss; k <= Se; k++) {
                        int rs = b.decode(ac[c->ta]), r = rs >> 4, sz = rs & 15;
                        if (sz) { k += r; blk[kJpegNatural[k]] = (int16_t)(int)((unsigned)b.receive(sz) << Al); }
                        else if (r == 15) k += 15;
                        else { eobrun = (1 << r) - 1; if (r) eobrun += b.get(r); break; }
                    }
                } else {
                    const int p1 = 1 << Al, m1 = -(1 << Al);
                    int k = Ss;
                    auto refine = [&](int16_t* co) {
                        if (b.get(1) && (*co & p1) == 0) *co = (int16_t)(*co >= 0 ? *co + p1 : *co + m1);
                    };
                    if (eobrun == 0) {
                        for (; k <= Se; k++) {
                            int rs = b.decode(ac[c->ta]), r = rs >> 4, sz = rs & 15, val = 0;
                            if (sz) val = b.get(1) ? p1 : m1;  // a size other than 1 is corrupt; libjpeg goes on too
                            else if (r != 15) { eobrun = 1 << r; if (r) eobrun += b.get(r); break; }
                            do {
                                int16_t* co = &blk[kJpegNatural[k]];
                                if (*co != 0) refine(co);
                                else if (--r < 0) break;
                                k++;
                            } while (k <= Se);
                            if (sz) blk[kJpegNatural[k]] = (int16_t)val;
                        }
                    }
                    if (eobrun > 0) {
                        for (; k <= Se; k++) { int16_t* co = &blk[kJpegNatural[k]]; if (*co != 0) refine(co); }
                        eobrun--;
                    }
                }
            };
            for (int64_t u = 0; u < units; u++) {
                if (restart && todo == 0) {  // an RSTn must be next
                    b.reset();
                    size_t q = b.pos;
                    while (q < n && d[q] == 0xff) q++;
                    if (q >= n) media_fail("jpeg: entropy-coded data ends early (truncated file)");
                    if (d[q] != 0xd0 + rst_next) media_fail("jpeg: expected restart marker RST%d at byte %zu, found 0x%02x", rst_next, q, d[q]);
                    b.pos = q + 1;
                    rst_next = (rst_next + 1) & 7;
                    for (auto* c : sc) c->pred = 0;
                    eobrun = 0; todo = restart;
                }
                const int mx = (int)(u % ux), my = (int)(u / ux);
                if (single) block(sc[0], mx, my);
                else
                    for (auto* c : sc)
                        for (int y = 0; y < c->v; y++)
                            for (int x = 0; x < c->h; x++) block(c, mx * c->h + x, my * c->v + y);
                if (restart) todo--;
            }
            // the scan ends at the next marker; skip what is left of its entropy-coded bytes
            size_t q = b.pos;
            while (q + 1 < n && !(d[q] == 0xff && d[q + 1] != 0 && !(d[q + 1] >= 0xd0 && d[q + 1] <= 0xd7))) q++;
            if (q + 1 >= n) media_fail("jpeg: no marker after scan %d (truncated file)", scans + 1);
            pos = q;
            scans++;
            continue;
        }
        pos += len;
    }
    if (!frame) media_fail("jpeg: no frame header (SOF) before the end of the file");
    if (!scans) media_fail("jpeg: no scan (SOS): no image data");
    if (!eoi) media_fail("jpeg: no EOI marker (truncated file)");
    // idct every block into the component planes (bw*8 x bh*8, edge blocks included)
    std::vector<std::vector<uint8_t>> plane(comps.size());
    for (size_t ci = 0; ci < comps.size(); ci++) {
        JpegComp& c = comps[ci];
        if (!qdef[c.tq]) media_fail("jpeg: component %d uses undefined quantization table %d", c.id, c.tq);
        const int stride = c.bw * 8;
        plane[ci].assign((size_t)stride * c.bh * 8, 0);
        for (int by = 0; by < c.bh; by++)
            for (int bx = 0; bx < c.bw; bx++)
                jpeg_idct_islow(&c.coef[((size_t)by * c.bw + bx) * 64], qt[c.tq], &plane[ci][(size_t)by * 8 * stride + bx * 8], stride);
        std::vector<int16_t>().swap(c.coef);
    }
    // upsample each component to the full size (jdsample.c): triangular for 2x1, 2x2 and 1x2
    // when the component is over 2 samples wide, else replication
    std::vector<std::vector<uint8_t>> full(comps.size());
    for (size_t ci = 0; ci < comps.size(); ci++) {
        JpegComp& c = comps[ci];
        const int fx = hmax / c.h, fy = vmax / c.v, stride = c.bw * 8;
        const uint8_t* P = plane[ci].data();
        std::vector<uint8_t>& F = full[ci];
        F.assign((size_t)W * H, 0);
        auto at = [&](int x, int y) -> int { return P[(size_t)y * stride + x]; };
        for (int y = 0; y < H; y++) {
            uint8_t* o = &F[(size_t)y * W];
            const int sy = y / fy;
            if (fx == 1 && fy == 1) { memcpy(o, P + (size_t)y * stride, W); continue; }
            if (fx == 2 && fy == 1 && c.dw > 2) {
                for (int x = 0; x < W; x++) {
                    int i = x >> 1, v = at(i, sy) * 3;
                    if (x & 1) o[x] = (uint8_t)(i == c.dw - 1 ? at(i, sy) : (v + at(i + 1, sy) + 2) >> 2);
                    else o[x] = (uint8_t)(i == 0 ? at(0, sy) : (v + at(i - 1, sy) + 1) >> 2);
                }
            } else if (fx == 2 && fy == 2 && c.dw > 2) {
                const int ny = (y & 1) ? std::min(sy + 1, c.dh - 1) : std::max(sy - 1, 0);  // the nearer neighbour row
                auto col = [&](int i) { return at(i, sy) * 3 + at(i, ny); };
                for (int x = 0; x < W; x++) {
                    int i = x >> 1, t = col(i);
                    if (x & 1) o[x] = (uint8_t)(i == c.dw - 1 ? (t * 4 + 7) >> 4 : (t * 3 + col(i + 1) + 7) >> 4);
                    else o[x] = (uint8_t)(i == 0 ? (t * 4 + 8) >> 4 : (t * 3 + col(i - 1) + 8) >> 4);
                }
            } else if (fx == 1 && fy == 2) {
                const int ny = (y & 1) ? std::min(sy + 1, c.dh - 1) : std::max(sy - 1, 0);
                const int bias = (y & 1) ? 2 : 1;
                for (int x = 0; x < W; x++) o[x] = (uint8_t)((at(x, sy) * 3 + at(x, ny) + bias) >> 2);
            } else {
                for (int x = 0; x < W; x++) o[x] = (uint8_t)at(x / fx, sy);
            }
        }
        std::vector<uint8_t>().swap(plane[ci]);
    }
    out->w = W; out->h = H;
    out->rgb.resize((size_t)W * H * 3);
    // color: libjpeg's default (jdapimin.c): jfif -> ycc; adobe transform 0 -> rgb; component
    // ids 'R','G','B' without either -> rgb; else ycc
    bool rgb = false;
    if (comps.size() == 3 && !jfif) {
        if (adobe >= 0) rgb = adobe == 0;
        else rgb = comps[0].id == 'R' && comps[1].id == 'G' && comps[2].id == 'B';
    }
    const size_t np = (size_t)W * H;
    if (comps.size() == 1) {
        for (size_t i = 0; i < np; i++) out->rgb[3 * i] = out->rgb[3 * i + 1] = out->rgb[3 * i + 2] = full[0][i];
    } else if (rgb) {
        for (size_t i = 0; i < np; i++) for (int k = 0; k < 3; k++) out->rgb[3 * i + k] = full[k][i];
    } else {
        // jdcolor.c: 16-bit fixed point, FIX(x) = x * 65536 + 0.5
        int crr[256], cbb[256]; int32_t crg[256], cbg[256];
        for (int i = 0; i < 256; i++) {
            int x = i - 128;
            crr[i] = (int)((91881 * (int64_t)x + 32768) >> 16);
            cbb[i] = (int)((116130 * (int64_t)x + 32768) >> 16);
            crg[i] = -46802 * x;
            cbg[i] = -22554 * x + 32768;
        }
        auto clamp8 = [](int v) { return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); };
        for (size_t i = 0; i < np; i++) {
            int y = full[0][i], cb = full[1][i], cr = full[2][i];
            out->rgb[3 * i] = clamp8(y + crr[cr]);
            out->rgb[3 * i + 1] = clamp8(y + ((cbg[cb] + crg[cr]) >> 16));
            out->rgb[3 * i + 2] = clamp8(y + cbb[cb]);
        }
    }
}

// === ppm / pgm ==================================================================
//
// netpbm P2/P5 (gray) and P3/P6 (rgb), ascii or binary, maxval 1..65535. samples are scaled
// to 8 bits as v * 255 / maxval rounded (16-bit samples the same way).

static inline void ppm_decode(const uint8_t* d, size_t n, const MediaLimits& lim, Image* out) {
    const int kind = d[1] - '0';  // 2, 3, 5, 6
    size_t pos = 2;
    auto token = [&](const char* what) -> int64_t {
        for (;;) {
            while (pos < n && (d[pos] == ' ' || d[pos] == '\t' || d[pos] == '\n' || d[pos] == '\r' || d[pos] == '\f' || d[pos] == '\v')) pos++;
            if (pos < n && d[pos] == '#') { while (pos < n && d[pos] != '\n' && d[pos] != '\r') pos++; continue; }
            break;
        }
        if (pos >= n) media_fail("ppm: the file ends before the %s (truncated)", what);
        if (d[pos] < '0' || d[pos] > '9') media_fail("ppm: expected a number for the %s at byte %zu", what, pos);
        int64_t v = 0;
        while (pos < n && d[pos] >= '0' && d[pos] <= '9') { v = v * 10 + (d[pos++] - '0'); if (v > (1ll << 40)) media_fail("ppm: the %s is too large", what); }
        return v;
    };
    int64_t w = token("width"), h = token("height"), maxval = token("maxval");
    if (maxval < 1 || maxval > 65535) media_fail("ppm: maxval %lld (1..65535)", (long long)maxval);
    check_dims("ppm", w, h, lim);
    const int ch = kind == 3 || kind == 6 ? 3 : 1;
    const size_t ns = (size_t)w * h * ch;
    const bool wide = maxval > 255;
    if (kind >= 5) {
        if (pos >= n) media_fail("ppm: no pixel data (truncated)");
        pos++;  // exactly one whitespace byte after maxval
        if ((n - pos) / (wide ? 2 : 1) < ns) media_fail("ppm: pixel data has %zu bytes, %zu expected (truncated)", n - pos, ns * (wide ? 2 : 1));
    }
    out->w = (int)w; out->h = (int)h;
    out->rgb.resize((size_t)w * h * 3);
    for (size_t i = 0; i < ns; i++) {
        int64_t v;
        if (kind >= 5) v = wide ? (d[pos + 2 * i] << 8 | d[pos + 2 * i + 1]) : d[pos + i];
        else v = token("sample");
        if (v > maxval) media_fail("ppm: sample %zu is %lld, over the maxval %lld", i, (long long)v, (long long)maxval);
        uint8_t s = (uint8_t)(maxval == 255 ? v : (v * 255 + maxval / 2) / maxval);
        if (ch == 3) out->rgb[i] = s;
        else out->rgb[3 * i] = out->rgb[3 * i + 1] = out->rgb[3 * i + 2] = s;
    }
}

// === decode: sniff the format, decode, orient ===================================

enum ImageFormat { IMG_UNKNOWN, IMG_PNG, IMG_JPEG, IMG_PPM };

// the format of a file by its first bytes; the name of a recognised but unsupported format
// goes to *unsupported
static inline ImageFormat image_sniff(const uint8_t* d, size_t n, const char** unsupported) {
    *unsupported = nullptr;
    // a literal's bytes at offset `at` (sizeof, not strlen: several signatures hold zero bytes)
    auto at_is = [&](size_t at, const char* s, size_t k) { return n >= at + k && !memcmp(d + at, s, k); };
#define is(at, lit) at_is(at, lit, sizeof(lit) - 1)
    if (is(0, "\x89PNG\r\n\x1a\n")) return IMG_PNG;
    if (n >= 3 && d[0] == 0xff && d[1] == 0xd8 && d[2] == 0xff) return IMG_JPEG;
    if (n >= 3 && d[0] == 'P' && (d[1] == '2' || d[1] == '3' || d[1] == '5' || d[1] == '6') &&
        (d[2] == ' ' || d[2] == '\n' || d[2] == '\r' || d[2] == '\t' || d[2] == '#')) return IMG_PPM;
    if (is(0, "GIF87a") || is(0, "GIF89a")) *unsupported = "GIF";
    else if (is(0, "RIFF") && is(8, "WEBP")) *unsupported = "WebP";
    else if (is(0, "BM")) *unsupported = "BMP";
    else if (is(0, "II*\0") || is(0, "MM\0*")) *unsupported = "TIFF";
    else if (is(4, "ftypavif") || is(4, "ftypavis")) *unsupported = "AVIF";
    else if (is(4, "ftyphei") || is(4, "ftypmif1") || is(4, "ftypmsf1") || is(4, "ftyphev")) *unsupported = "HEIF";
    else if (is(0, "\x00\x00\x00\x0cjP  ") || is(0, "\xff\x4f\xff\x51")) *unsupported = "JPEG 2000";
    else if (is(0, "\xff\x0a") || is(0, "\x00\x00\x00\x0cJXL ")) *unsupported = "JPEG XL";
    else if (is(0, "qoif")) *unsupported = "QOI";
    else if (is(0, "\x00\x00\x01\x00")) *unsupported = "ICO";
    else if (n >= 2 && d[0] == 'P' && (d[1] == '1' || d[1] == '4' || d[1] == '7')) *unsupported = "PBM/PAM";
    else if (is(0, "8BPS")) *unsupported = "PSD";
    else if (is(0, "%PDF")) *unsupported = "PDF";
    else if (is(0, "<svg") || is(0, "<?xml")) *unsupported = "SVG";
#undef is
    return IMG_UNKNOWN;
}

static inline const char* image_format_name(ImageFormat f) {
    return f == IMG_PNG ? "png" : f == IMG_JPEG ? "jpeg" : f == IMG_PPM ? "ppm" : "unknown";
}

// decodes an encoded image to rgb8 with its exif orientation applied (as hugging face's
// load_image does through PIL). `what` names the source in the error (a path, "image 2").
static inline bool image_decode(const uint8_t* d, size_t n, const MediaLimits& lim, Image* out, std::string* err,
                                const char* what = "image") {
    try {
        if ((int64_t)n > lim.max_bytes)
            media_fail("%zu bytes, over the limit of %lld bytes", n, (long long)lim.max_bytes);
        const char* unsup;
        ImageFormat f = image_sniff(d, n, &unsup);
        if (unsup) media_fail("unsupported image format %s (supported: PNG, JPEG, PPM/PGM)", unsup);
        if (f == IMG_UNKNOWN) media_fail("not an image in a known format (supported: PNG, JPEG, PPM/PGM)");
        int orientation = 1;
        *out = Image();
        if (f == IMG_PNG) png_decode(d, n, lim, out, &orientation);
        else if (f == IMG_JPEG) jpeg_decode(d, n, lim, out, &orientation);
        else ppm_decode(d, n, lim, out);
        image_orient(out, orientation);
        return true;
    } catch (const MediaError& e) {
        *err = std::string(what) + ": " + e.msg;
        *out = Image();
        return false;
    } catch (const std::bad_alloc&) {
        *err = std::string(what) + ": out of memory decoding the image";
        *out = Image();
        return false;
    }
}

// reads a whole file, refusing one over max_bytes before reading it
static inline bool media_read_file(const std::string& path, int64_t max_bytes, std::vector<uint8_t>* out, std::string* err) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) { *err = path + ": cannot open: " + strerror(errno); return false; }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) { fclose(f); *err = path + ": is a directory, not an image file"; return false; }
    out->clear();
    uint8_t buf[1 << 16];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) {
        if ((int64_t)(out->size() + k) > max_bytes) {
            fclose(f);
            *err = path + ": over the limit of " + std::to_string(max_bytes) + " bytes";
            return false;
        }
        out->insert(out->end(), buf, buf + k);
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) { *err = path + ": read error"; return false; }
    return true;
}

static inline bool image_load(const std::string& path, const MediaLimits& lim, Image* out, std::string* err) {
    std::vector<uint8_t> bytes;
    if (!media_read_file(path, lim.max_bytes, &bytes, err)) return false;
    return image_decode(bytes.data(), bytes.size(), lim, out, err, path.c_str());
}

// === media references: paths and data uris =====================================
//
// what a chat message's image / video part names: a data uri ("data:image/png;base64,...",
// base64 only), a file:// url or a local path. http(s) urls are refused: ninfer fetches
// nothing over the network.

static inline bool base64_decode(const char* s, size_t n, std::vector<uint8_t>* out, std::string* err) {
    out->clear();
    out->reserve(n / 4 * 3);
    uint32_t acc = 0;
    int bits = 0, pad = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int v;
        if (c >= 'A' && c <= 'Z') v = c - 'A';
        else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
        else if (c >= '0' && c <= '9') v = c - '0' + 52;
        else if (c == '+' || c == '-') v = 62;   // standard and url-safe alphabets
        else if (c == '/' || c == '_') v = 63;
        else if (c == '=') { pad++; continue; }
        else if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
        else { *err = "base64: invalid character at offset " + std::to_string(i); return false; }
        if (pad) { *err = "base64: data after the '=' padding"; return false; }
        acc = acc << 6 | (uint32_t)v; bits += 6;
        if (bits >= 8) { bits -= 8; out->push_back((uint8_t)(acc >> bits)); }
    }
    if (bits >= 6 || pad > 2) { *err = "base64: truncated data"; return false; }
    return true;
}

// the bytes a media reference names, at most max_bytes of them
static inline bool media_bytes(const std::string& ref, int64_t max_bytes, std::vector<uint8_t>* out, std::string* err) {
    if (ref.rfind("data:", 0) == 0) {
        size_t comma = ref.find(',');
        if (comma == std::string::npos) { *err = "data uri: no ',' before the data"; return false; }
        std::string meta = ref.substr(5, comma - 5);
        if (meta.size() < 7 || meta.compare(meta.size() - 7, 7, ";base64") != 0) {
            *err = "data uri '" + meta.substr(0, 64) + "': only base64 data uris are supported";
            return false;
        }
        if ((int64_t)((ref.size() - comma - 1) / 4 * 3) > max_bytes + 3) {
            *err = "data uri: the data is over the limit of " + std::to_string(max_bytes) + " bytes";
            return false;
        }
        if (!base64_decode(ref.data() + comma + 1, ref.size() - comma - 1, out, err)) { *err = "data uri: " + *err; return false; }
        if ((int64_t)out->size() > max_bytes) { *err = "data uri: the data is over the limit of " + std::to_string(max_bytes) + " bytes"; return false; }
        return true;
    }
    if (ref.rfind("http://", 0) == 0 || ref.rfind("https://", 0) == 0) {
        *err = ref.substr(0, 80) + ": http(s) urls are not fetched (ninfer reads local files and data: uris only)";
        return false;
    }
    return media_read_file(ref.rfind("file://", 0) == 0 ? ref.substr(7) : ref, max_bytes, out, err);
}

// how an error names a reference: a data uri by its head only
static inline std::string media_label(const std::string& ref) {
    return ref.rfind("data:", 0) == 0 ? ref.substr(0, std::min(ref.find(','), (size_t)40)) : ref;
}

// an image from a reference (see media_bytes)
static inline bool media_image(const std::string& ref, const MediaLimits& lim, Image* out, std::string* err) {
    std::vector<uint8_t> b;
    if (!media_bytes(ref, lim.max_bytes, &b, err)) return false;
    return image_decode(b.data(), b.size(), lim, out, err, media_label(ref).c_str());
}

// === content digest =============================================================
//
// sha-256 (fips 180-4) of a file's bytes: the key of a media cache (the same picture in a
// later turn is not encoded again) and NInfer's media digest.

static inline std::string sha256_hex(const uint8_t* data, size_t n) {
    static const uint32_t K[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01,
        0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc,
        0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
        0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08,
        0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
        0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    auto rotr = [](uint32_t x, int r) { return x >> r | x << (32 - r); };
    auto block = [&](const uint8_t* p) {
        uint32_t w[64];
        for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4 * i] << 24 | p[4 * i + 1] << 16 | p[4 * i + 2] << 8 | p[4 * i + 3];
        for (int i = 16; i < 64; i++) {
            uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
            uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
        for (int i = 0; i < 64; i++) {
            uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
            uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
        }
        h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
    };
    size_t i = 0;
    for (; i + 64 <= n; i += 64) block(data + i);
    uint8_t tail[128] = {0};
    size_t r = n - i;
    memcpy(tail, data + i, r);
    tail[r] = 0x80;
    size_t tl = r + 1 + 8 <= 64 ? 64 : 128;
    uint64_t bits = (uint64_t)n * 8;
    for (int k = 0; k < 8; k++) tail[tl - 1 - k] = (uint8_t)(bits >> (8 * k));
    block(tail);
    if (tl == 128) block(tail + 64);
    char hex[65];
    for (int k = 0; k < 8; k++) snprintf(hex + 8 * k, 9, "%08x", h[k]);
    return std::string(hex, 64);
}

// === preprocessing: config ======================================================
//
// the artifact's frontend/preprocessor_config.json and frontend/video_preprocessor_config.json
// (convert.py writes them; model.md 6.1-6.2). every member is honoured or refused by name.

enum Resample {
    RESAMPLE_TORCHVISION,  // Qwen2VLImageProcessor, transformers' default: torch's uint8 antialiased bicubic
    RESAMPLE_PIL,          // Qwen2VLImageProcessorPil: PIL's Image.resize(BICUBIC) (pillow >= 13 pass order)
};

struct VisionConfig {
    int patch = 16, merge = 2, temporal = 2;      // patch_size, merge_size, temporal_patch_size
    int64_t min_pixels = 65536, max_pixels = 16777216;             // image size {shortest_edge, longest_edge}
    float mean[3] = {0.5f, 0.5f, 0.5f}, std[3] = {0.5f, 0.5f, 0.5f};
    double rescale = 0.00392156862745098;
    Resample resample = RESAMPLE_TORCHVISION;
    // video (the video processor is torchvision-only in transformers)
    int64_t video_min_pixels = 4096, video_max_pixels = 25165824;
    float video_mean[3] = {0.5f, 0.5f, 0.5f}, video_std[3] = {0.5f, 0.5f, 0.5f};
    double video_rescale = 0.00392156862745098;
    double fps = 2.0;                             // frames sampled per second of video
    int min_frames = 4, max_frames = 768;
    int factor() const { return patch * merge; }
    int row_len() const { return 3 * temporal * patch * patch; }  // values in one patch row
};

static inline bool vision_config_one(const std::string& text, bool video, VisionConfig* c, std::string* err) {
    const char* file = video ? "video_preprocessor_config.json" : "preprocessor_config.json";
    Json j;
    if (!json_parse(text, &j, err)) { *err = std::string(file) + ": " + *err; return false; }
    if (!j.is_object()) { *err = std::string(file) + ": not a json object"; return false; }
    auto bad = [&](const std::string& key, const std::string& why) { *err = std::string(file) + ": " + key + ": " + why; return false; };
    auto num = [&](const Json& v, double* out) { if (!v.is_number()) return false; *out = v.num; return true; };
    int64_t mn = -1, mx = -1, smin = -1, smax = -1;
    for (auto& kv : j.obj) {
        const std::string& k = kv.first;
        const Json& v = kv.second;
        double x;
        if (k == "do_convert_rgb" || k == "do_normalize" || k == "do_rescale" || k == "do_resize" || (video && k == "do_sample_frames")) {
            if (!v.is_bool()) return bad(k, "expected true or false");
            if (!v.b) return bad(k, "false is not supported (ninfer always does this step)");
        } else if (k == "image_mean" || k == "image_std") {
            if (!v.is_array() || v.size() != 3) return bad(k, "expected 3 numbers");
            float* dst = k == "image_mean" ? (video ? c->video_mean : c->mean) : (video ? c->video_std : c->std);
            for (int i = 0; i < 3; i++) {
                if (!num(v.arr[i], &x) || (k == "image_std" && !(x > 0))) return bad(k, "expected 3 numbers (std > 0)");
                dst[i] = (float)x;
            }
        } else if (k == "rescale_factor") {
            if (!num(v, &x) || !(x > 0)) return bad(k, "expected a positive number");
            (video ? c->video_rescale : c->rescale) = x;
        } else if (k == "patch_size" || k == "merge_size" || k == "temporal_patch_size") {
            if (!v.is_number() || !v.is_int || v.i < 1 || v.i > 64) return bad(k, "expected an integer in [1, 64]");
            int want = k == "patch_size" ? c->patch : k == "merge_size" ? c->merge : c->temporal;
            if (video && v.i != want) return bad(k, "differs from the image processor's (" + std::to_string(want) + ")");
            (k == "patch_size" ? c->patch : k == "merge_size" ? c->merge : c->temporal) = (int)v.i;
        } else if (k == "resample") {
            if (!v.is_number() || !v.is_int || v.i != 3) return bad(k, "only 3 (bicubic) is supported");
        } else if (k == "size") {
            const Json* se = v.get("shortest_edge");
            const Json* le = v.get("longest_edge");
            if (!v.is_object() || v.size() != 2 || !se || !le || !se->is_int || !le->is_int || se->i < 1 || le->i < se->i)
                return bad(k, "expected {\"shortest_edge\": min pixels, \"longest_edge\": max pixels} with 1 <= min <= max");
            smin = se->i; smax = le->i;
        } else if (k == "min_pixels" || k == "max_pixels") {
            if (!v.is_int || v.i < 1) return bad(k, "expected a positive integer");
            (k == "min_pixels" ? mn : mx) = v.i;
        } else if (!video && k == "image_processor_type") {
            if (!v.is_string()) return bad(k, "expected a string");
            if (v.str == "Qwen2VLImageProcessorPil") c->resample = RESAMPLE_PIL;
            else if (v.str == "Qwen2VLImageProcessorFast" || v.str == "Qwen2VLImageProcessor") c->resample = RESAMPLE_TORCHVISION;
            else return bad(k, "'" + v.str + "' is not a qwen2-vl image processor");
        } else if (video && k == "video_processor_type") {
            if (!v.is_string() || (v.str != "Qwen3VLVideoProcessor" && v.str != "Qwen2VLVideoProcessor")) return bad(k, "expected Qwen3VLVideoProcessor");
        } else if (video && k == "fps") {
            if (!num(v, &x) || !(x > 0) || x > 1000) return bad(k, "expected a number in (0, 1000]");
            c->fps = x;
        } else if (video && (k == "min_frames" || k == "max_frames")) {
            if (!v.is_int || v.i < 1 || v.i > 100000) return bad(k, "expected an integer in [1, 100000]");
            (k == "min_frames" ? c->min_frames : c->max_frames) = (int)v.i;
        } else if (k == "processor_class") {
            // which python class bundles the processors: nothing to honour here
        } else {
            return bad(k, "unknown member (not supported by ninfer's preprocessing)");
        }
    }
    // transformers' __init__: min_pixels / max_pixels override the size dict
    if (mn >= 0) smin = mn;
    if (mx >= 0) smax = mx;
    if (smin >= 0) (video ? c->video_min_pixels : c->min_pixels) = smin;
    if (smax >= 0) (video ? c->video_max_pixels : c->max_pixels) = smax;
    if (video && c->min_frames > c->max_frames) return bad("min_frames", "is over max_frames");
    return true;
}

// both resources; an empty string keeps that processor's defaults (the values of model.md 6.1-6.2)
static inline bool vision_config_parse(const std::string& image_json, const std::string& video_json, VisionConfig* c, std::string* err) {
    *c = VisionConfig();
    if (!image_json.empty() && !vision_config_one(image_json, false, c, err)) return false;
    if (!video_json.empty() && !vision_config_one(video_json, true, c, err)) return false;
    return true;
}

// === preprocessing: smart_resize ================================================
//
// transformers' smart_resize (qwen2_vl image, qwen3_vl video): the nearest multiple of the
// factor (python's round: half to even), then scaled into [min, max] pixels keeping the aspect
// ratio. the processors' own errors are reproduced, message for message.

static inline double py_round(double x) { return std::nearbyint(x); }  // the default fenv: half to even

// python's repr of a float in the range the messages need (below 1e16): shortest round trip
static inline std::string py_repr(double x) {
    char b[64];
    auto r = std::to_chars(b, b + sizeof b, x, std::chars_format::fixed);
    std::string s(b, r.ptr);
    if (s.find('.') == std::string::npos) s += ".0";
    return s;
}

static inline bool aspect_ok(int64_t h, int64_t w, std::string* err) {
    double ar = (double)std::max(h, w) / (double)std::min(h, w);
    if (ar > 200) { *err = "absolute aspect ratio must be smaller than 200, got " + py_repr(ar); return false; }
    return true;
}

// the shared core: t frames (1 for an image) whose count rounds to tb (1 for an image)
static inline bool smart_resize_core(int64_t t, double tb, int64_t h, int64_t w, int factor, int64_t min_pixels,
                                     int64_t max_pixels, int* out_h, int* out_w, std::string* err) {
    if (!aspect_ok(h, w, err)) return false;
    double hb = py_round((double)h / factor) * factor, wb = py_round((double)w / factor) * factor;
    if (tb * hb * wb > (double)max_pixels) {
        double beta = sqrt((double)(t * h * w) / (double)max_pixels);
        hb = std::max((double)factor, floor((double)h / beta / factor) * factor);
        wb = std::max((double)factor, floor((double)w / beta / factor) * factor);
    } else if (tb * hb * wb < (double)min_pixels) {
        double beta = sqrt((double)min_pixels / (double)(t * h * w));
        hb = ceil((double)h * beta / factor) * factor;
        wb = ceil((double)w * beta / factor) * factor;
    }
    if (hb < factor || wb < factor || hb > (1 << 20) || wb > (1 << 20)) {
        char b[160]; snprintf(b, sizeof b, "smart_resize of %lldx%lld gives %.0fx%.0f pixels, outside [%d, %d]",
                              (long long)w, (long long)h, wb, hb, factor, 1 << 20);
        *err = b; return false;
    }
    *out_h = (int)hb; *out_w = (int)wb;
    return true;
}

static inline bool smart_resize_image(int64_t h, int64_t w, int factor, int64_t min_pixels, int64_t max_pixels,
                                      int* out_h, int* out_w, std::string* err) {
    return smart_resize_core(1, 1.0, h, w, factor, min_pixels, max_pixels, out_h, out_w, err);
}

// the video form also scales a side under the factor up first (python: int(height * scale))
static inline bool smart_resize_video(int64_t t, int64_t h, int64_t w, int tfactor, int factor, int64_t min_pixels,
                                      int64_t max_pixels, int* out_h, int* out_w, std::string* err) {
    if (t < tfactor) { *err = "t:" + std::to_string(t) + " must be larger than temporal_factor:" + std::to_string(tfactor); return false; }
    if (h < factor || w < factor) {
        double scale = std::max((double)factor / h, (double)factor / w);
        h = (int64_t)((double)h * scale); w = (int64_t)((double)w * scale);
    }
    return smart_resize_core(t, py_round((double)t / tfactor) * tfactor, h, w, factor, min_pixels, max_pixels, out_h, out_w, err);
}

// === preprocessing: antialiased bicubic resampling ==============================
//
// both references are separable filters with Keys' cubic (a = -0.5) stretched by the scale
// when shrinking (antialiasing), coefficients normalised to sum 1, fixed-point on uint8 with a
// uint8 image between the passes. they differ in the fixed point and the pass order:
//   PIL: 22-bit coefficients; horizontal pass first unless the height shrinks by more than
//        twice the width's shrink in pixels (pillow 13, Resample.c), then vertical first.
//   torchvision (torch's uint8 aa kernel on cpu): 16-bit coefficients at the largest
//        precision that keeps the biggest one under 2^15; always horizontal first.
// one pass is skipped when that dimension keeps its size (both references do).

struct ResampleTaps {
    std::vector<int> start, count;   // per output sample: first input sample and tap count
    std::vector<int32_t> w;          // (out, ksize) fixed-point weights
    int ksize = 0, prec = 0;
};

static inline double keys_cubic(double x) {
    const double a = -0.5;
    if (x < 0) x = -x;
    if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
    return 0;
}

static inline ResampleTaps resample_taps(int in, int out, Resample mode) {
    ResampleTaps t;
    const double scale = (double)in / out, fs = std::max(scale, 1.0), support = 2.0 * fs, inv = 1.0 / fs;
    t.ksize = (int)ceil(support) * 2 + 1;
    t.start.resize(out); t.count.resize(out);
    std::vector<double> k((size_t)out * t.ksize, 0.0);
    double wmax = 0;
    for (int i = 0; i < out; i++) {
        const double center = (i + 0.5) * scale;
        int lo = (int)(center - support + 0.5), hi = (int)(center + support + 0.5);
        if (lo < 0) lo = 0;
        if (hi > in) hi = in;
        const int n = std::min(hi - lo, t.ksize);
        double* ki = &k[(size_t)i * t.ksize];
        double sum = 0;
        for (int j = 0; j < n; j++) { ki[j] = keys_cubic((j + lo - center + 0.5) * inv); sum += ki[j]; }
        if (sum != 0) for (int j = 0; j < n; j++) ki[j] /= sum;
        for (int j = 0; j < n; j++) wmax = std::max(wmax, ki[j]);
        t.start[i] = lo; t.count[i] = n;
    }
    if (mode == RESAMPLE_PIL) t.prec = 22;
    else {
        for (t.prec = 0; t.prec < 22; t.prec++)
            if ((int)(0.5 + wmax * (1 << (t.prec + 1))) >= (1 << 15)) break;
    }
    t.w.resize(k.size());
    for (size_t i = 0; i < k.size(); i++) t.w[i] = (int32_t)(k[i] * (1 << t.prec) + (k[i] < 0 ? -0.5 : 0.5));
    return t;
}

// one pass along x (horizontal) or y over an rgb8 image. int32 sums, as both references: the
// coefficients' absolute sum stays under 1.3 * 2^prec, so 255 times it fits (prec <= 22)
static inline void resample_pass(const uint8_t* src, int w, int h, uint8_t* dst, int ow, int oh, const ResampleTaps& t, bool horizontal) {
    const int32_t half = t.prec ? 1 << (t.prec - 1) : 0;
    auto clip = [&](int32_t v) -> uint8_t { v >>= t.prec; return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); };
    if (horizontal) {
        for (int y = 0; y < oh; y++) {
            const uint8_t* row = src + (size_t)y * w * 3;
            uint8_t* o = dst + (size_t)y * ow * 3;
            for (int x = 0; x < ow; x++, o += 3) {
                const int32_t* k = &t.w[(size_t)x * t.ksize];
                const uint8_t* p = row + (size_t)t.start[x] * 3;
                int32_t a0 = half, a1 = half, a2 = half;
                for (int j = 0; j < t.count[x]; j++, p += 3) { a0 += p[0] * k[j]; a1 += p[1] * k[j]; a2 += p[2] * k[j]; }
                o[0] = clip(a0); o[1] = clip(a1); o[2] = clip(a2);
            }
        }
    } else {
        std::vector<int32_t> acc((size_t)ow * 3);
        for (int y = 0; y < oh; y++) {
            std::fill(acc.begin(), acc.end(), half);
            const int32_t* k = &t.w[(size_t)y * t.ksize];
            for (int j = 0; j < t.count[y]; j++) {
                const uint8_t* p = src + (size_t)(t.start[y] + j) * w * 3;
                const int32_t kj = k[j];
                for (size_t i = 0; i < acc.size(); i++) acc[i] += p[i] * kj;
            }
            uint8_t* o = dst + (size_t)y * ow * 3;
            for (size_t i = 0; i < acc.size(); i++) o[i] = clip(acc[i]);
        }
    }
    (void)h;
}

static inline void image_resize(const Image& in, int ow, int oh, Resample mode, Image* out) {
    const bool nh = ow != in.w, nv = oh != in.h;
    const bool vertical_first = mode == RESAMPLE_PIL && nh && nv && in.h - oh > 0 && (int64_t)(in.h - oh) > 2 * (int64_t)(in.w - ow);
    const Image* cur = &in;
    Image bufs[2];
    int which = 0;
    auto pass = [&](bool horizontal) {
        Image& o = bufs[which++];
        o.w = horizontal ? ow : cur->w; o.h = horizontal ? cur->h : oh;
        o.rgb.resize((size_t)o.w * o.h * 3);
        ResampleTaps t = resample_taps(horizontal ? cur->w : cur->h, horizontal ? ow : oh, mode);
        resample_pass(cur->rgb.data(), cur->w, cur->h, o.rgb.data(), o.w, o.h, t, horizontal);
        cur = &o;
    };
    if (vertical_first) { pass(false); pass(true); }
    else { if (nh) pass(true); if (nv) pass(false); }
    if (cur == &in) *out = in;
    else *out = std::move(*const_cast<Image*>(cur));
}

// === preprocessing: patch rows ==================================================
//
// one media item as the tower takes it: patch rows in (t, bh, bw, ih, iw) order (2x2 merge
// blocks of 16x16 patches, row-major), each row (c=3, tp=temporal, ph, pw) flattened, the
// layout of the conv3d weight [Dv, 3, 2, 16, 16]. an image is one temporal patch whose two
// frames are the same picture.

struct VisionItem {
    bool video = false;
    int t = 0, h = 0, w = 0;          // grid_thw: temporal patches, patch rows, patch columns
    int row_len = 0;                  // 3 * temporal * patch * patch (1536)
    std::vector<float> pixels;        // (t * h * w, row_len)
    std::vector<double> timestamps;   // video: seconds per temporal patch, the "<%.1f seconds>" of the prompt
    int rows() const { return t * h * w; }
    int tokens(int merge) const { return t * h * w / (merge * merge); }  // image/video pad tokens
};

// normalised value of an 8-bit sample, with the reference's float rounding: torchvision fuses
// rescale and normalize into (p - mean/s) / (std/s) in float32; the PIL backend rescales in
// float64, rounds to float32, then (x - mean) / std in float32
static inline float vision_normalize(int p, double rescale, float mean, float std, Resample mode) {
    if (mode == RESAMPLE_TORCHVISION) {
        const float m = mean * (float)(1.0 / rescale), s = std * (float)(1.0 / rescale);
        return ((float)p - m) / s;
    }
    const float x = (float)((double)p * rescale);
    return (x - mean) / std;
}

// frames: resized rgb8 frames of one item, frames.size() == t * temporal
static inline void vision_patchify(const std::vector<const Image*>& frames, const VisionConfig& c, const float* mean,
                                   const float* std, double rescale, Resample mode, VisionItem* it) {
    const int P = c.patch, M = c.merge, T = c.temporal;
    const int W = frames[0]->w, H = frames[0]->h;
    it->t = (int)frames.size() / T; it->h = H / P; it->w = W / P; it->row_len = c.row_len();
    it->pixels.resize((size_t)it->rows() * it->row_len);
    float lut[3][256];
    for (int ch = 0; ch < 3; ch++) for (int p = 0; p < 256; p++) lut[ch][p] = vision_normalize(p, rescale, mean[ch], std[ch], mode);
    float* o = it->pixels.data();
    for (int gt = 0; gt < it->t; gt++)
        for (int bh = 0; bh < it->h / M; bh++)
            for (int bw = 0; bw < it->w / M; bw++)
                for (int ih = 0; ih < M; ih++)
                    for (int iw = 0; iw < M; iw++) {
                        const int y0 = (bh * M + ih) * P, x0 = (bw * M + iw) * P;
                        for (int ch = 0; ch < 3; ch++)
                            for (int tp = 0; tp < T; tp++) {
                                const Image* f = frames[(size_t)gt * T + tp];
                                for (int y = 0; y < P; y++) {
                                    const uint8_t* src = &f->rgb[((size_t)(y0 + y) * W + x0) * 3 + ch];
                                    for (int x = 0; x < P; x++) *o++ = lut[ch][src[3 * x]];
                                }
                            }
                    }
}

// an image resized as the processor does before it normalises (smart_resize with the image
// min/max pixels, then the configured resampling)
static inline bool vision_image_resized(const Image& img, const VisionConfig& c, Image* out, std::string* err) {
    int oh, ow;
    if (!smart_resize_image(img.h, img.w, c.factor(), c.min_pixels, c.max_pixels, &oh, &ow, err)) return false;
    image_resize(img, ow, oh, c.resample, out);
    return true;
}

// one image: resized, normalised, in patch rows
static inline bool vision_image(const Image& img, const VisionConfig& c, VisionItem* it, std::string* err) {
    Image r;
    if (!vision_image_resized(img, c, &r, err)) return false;
    std::vector<const Image*> frames(c.temporal, &r);
    *it = VisionItem();
    vision_patchify(frames, c, c.mean, c.std, c.rescale, c.resample, it);
    return true;
}

// === video ======================================================================
//
// Qwen3VLVideoProcessor.sample_frames with fps sampling: n = int(total / video_fps * fps),
// clamped to [min_frames, max_frames] and to total, indices round(linspace(0, total-1, n)).
// a directory or list of frames has no frame rate; transformers then assumes 24, and so
// does ninfer unless told (--video-fps).

static inline std::vector<int64_t> video_sample_indices(int64_t total, double video_fps, const VisionConfig& c) {
    int64_t n = (int64_t)((double)total / video_fps * c.fps);
    n = std::min(std::max(n, (int64_t)c.min_frames), std::min((int64_t)c.max_frames, total));
    std::vector<int64_t> idx((size_t)std::max<int64_t>(n, 0));
    for (int64_t i = 0; i < n; i++) {
        // numpy.linspace: start + i * step, the last one exactly stop
        double v = n == 1 ? 0.0 : i == n - 1 ? (double)(total - 1) : i * ((double)(total - 1) / (double)(n - 1));
        idx[i] = (int64_t)py_round(v);
    }
    return idx;
}

// Qwen3VLProcessor._calculate_timestamps: the indices padded to a multiple of temporal with the
// last one, each index / video_fps, the mean of each temporal patch's first and last
static inline std::vector<double> vision_video_timestamps(std::vector<int64_t> idx, double video_fps, int temporal) {
    while (!idx.empty() && idx.size() % temporal) idx.push_back(idx.back());
    std::vector<double> ts;
    for (size_t i = 0; i + temporal <= idx.size(); i += temporal)
        ts.push_back(((double)idx[i] / video_fps + (double)idx[i + temporal - 1] / video_fps) / 2);
    return ts;
}

// the sampled frames of one video (all the same size): smart_resize over the frame count,
// resample each (torchvision), pad to a multiple of temporal with the last frame, patch rows
static inline bool vision_video(const std::vector<Image>& frames, const std::vector<int64_t>& indices, double video_fps,
                                const VisionConfig& c, VisionItem* it, std::string* err) {
    if (frames.empty()) { *err = "the video has no frames"; return false; }
    for (size_t i = 1; i < frames.size(); i++)
        if (frames[i].w != frames[0].w || frames[i].h != frames[0].h) {
            *err = "frame " + std::to_string(i) + " is " + std::to_string(frames[i].w) + "x" + std::to_string(frames[i].h) +
                   ", frame 0 is " + std::to_string(frames[0].w) + "x" + std::to_string(frames[0].h) + " (a video's frames must have one size)";
            return false;
        }
    int oh, ow;
    if (!smart_resize_video((int64_t)frames.size(), frames[0].h, frames[0].w, c.temporal, c.factor(), c.video_min_pixels,
                            c.video_max_pixels, &oh, &ow, err)) return false;
    std::vector<Image> rs(frames.size());
    for (size_t i = 0; i < frames.size(); i++) image_resize(frames[i], ow, oh, RESAMPLE_TORCHVISION, &rs[i]);
    std::vector<const Image*> fp;
    for (auto& r : rs) fp.push_back(&r);
    while (fp.size() % c.temporal) fp.push_back(fp.back());
    *it = VisionItem();
    it->video = true;
    vision_patchify(fp, c, c.video_mean, c.video_std, c.video_rescale, RESAMPLE_TORCHVISION, it);
    it->timestamps = vision_video_timestamps(indices, video_fps, c.temporal);
    return true;
}

// === video: frames from a directory, a list, or a file through ffmpeg ==========
//
// spec: a directory (its files sorted by name, hidden ones skipped), a comma-separated list of
// image files (in that order), or a video file (a path, file:// or a base64 data: uri, which
// goes to a temporary file), decoded by an `ffmpeg` found on PATH (never linked; popen with the
// path quoted). http(s) is refused. frames are counted first, then only the sampled ones
// are decoded. `frames_fps` is the frame rate of a directory or list (transformers assumes 24);
// a video file's own rate comes from ffmpeg.

static inline std::string shell_quote(const std::string& s) {
    std::string o = "'";
    for (char ch : s) { if (ch == '\'') o += "'\\''"; else o += ch; }
    return o + "'";
}

static inline std::string find_on_path(const char* exe) {
    const char* p = getenv("PATH");
    std::string path = p ? p : "";
    size_t a = 0;
    while (a <= path.size()) {
        size_t b = path.find(':', a);
        if (b == std::string::npos) b = path.size();
        std::string dir = path.substr(a, b - a);
        if (dir.empty()) dir = ".";
        std::string f = dir + "/" + exe;
        struct stat st;
        if (stat(f.c_str(), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111)) return f;
        a = b + 1;
    }
    return "";
}

// runs a command, collecting its stdout up to max_bytes; false when it fails or says too much
static inline bool run_capture(const std::string& cmd, size_t max_bytes, std::vector<uint8_t>* out, int* status) {
    FILE* f = popen(cmd.c_str(), "r");
    if (!f) return false;
    out->clear();
    uint8_t buf[1 << 16];
    size_t k;
    bool over = false;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) {
        if (out->size() + k > max_bytes) { over = true; break; }
        out->insert(out->end(), buf, buf + k);
    }
    if (over) while (fread(buf, 1, sizeof buf, f) > 0) {}
    *status = pclose(f);
    return !over;
}

struct VideoSource {
    std::vector<std::string> files;   // frames as image files, or
    std::string video;                // a video file for ffmpeg
    std::string ffmpeg;
    std::string tmp;                  // a data: uri's bytes, in a temporary file removed with this
    VideoSource() = default;
    VideoSource(const VideoSource&) = delete;
    VideoSource& operator=(const VideoSource&) = delete;
    ~VideoSource() { if (!tmp.empty()) unlink(tmp.c_str()); }
};

// a video data: uri (base64) goes to a temporary file for ffmpeg
static inline bool video_from_data_uri(const std::string& uri, int64_t max_bytes, VideoSource* src, std::string* err) {
    std::vector<uint8_t> b;
    if (!media_bytes(uri, max_bytes, &b, err)) return false;
    const char* dir = getenv("TMPDIR");
    std::string path = std::string(dir && *dir ? dir : "/tmp") + "/ninfer-video-XXXXXX";
    std::vector<char> name(path.begin(), path.end());
    name.push_back(0);
    int fd = mkstemp(name.data());
    if (fd < 0) { *err = "video data uri: cannot create a temporary file in " + path + ": " + strerror(errno); return false; }
    src->tmp = name.data();
    size_t off = 0;
    while (off < b.size()) {
        ssize_t k = write(fd, b.data() + off, b.size() - off);
        if (k <= 0) { close(fd); *err = "video data uri: cannot write " + src->tmp + ": " + strerror(errno); return false; }
        off += (size_t)k;
    }
    close(fd);
    src->video = src->tmp;
    return true;
}

static inline bool video_open(const std::string& spec_in, const MediaLimits& lim, VideoSource* src, std::string* err) {
    src->files.clear(); src->video.clear();
    std::string spec = spec_in.rfind("file://", 0) == 0 ? spec_in.substr(7) : spec_in;
    if (spec.rfind("http://", 0) == 0 || spec.rfind("https://", 0) == 0) {
        *err = spec.substr(0, 80) + ": http(s) urls are not fetched (ninfer reads local files and data: uris only)";
        return false;
    }
    if (spec.rfind("data:", 0) == 0) {
        if (!video_from_data_uri(spec, lim.max_bytes, src, err)) return false;
    } else if (spec.find(',') != std::string::npos) {
        size_t a = 0;
        while (a <= spec.size()) {
            size_t b = spec.find(',', a);
            if (b == std::string::npos) b = spec.size();
            if (b == a) { *err = spec + ": an empty name in the list of frames"; return false; }
            src->files.push_back(spec.substr(a, b - a));
            a = b + 1;
        }
        return true;
    }
    struct stat st;
    if (!src->video.empty()) {
        // the data uri's temporary file
    } else if (stat(spec.c_str(), &st) != 0) {
        *err = spec + ": cannot open: " + strerror(errno); return false;
    } else if (S_ISDIR(st.st_mode)) {
        DIR* d = opendir(spec.c_str());
        if (!d) { *err = spec + ": cannot open the directory: " + strerror(errno); return false; }
        while (struct dirent* e = readdir(d)) {
            if (e->d_name[0] == '.') continue;
            std::string f = spec + "/" + e->d_name;
            struct stat fs;
            if (stat(f.c_str(), &fs) == 0 && S_ISREG(fs.st_mode)) src->files.push_back(f);
        }
        closedir(d);
        std::sort(src->files.begin(), src->files.end());
        if (src->files.empty()) { *err = spec + ": the directory has no frame files"; return false; }
        return true;
    } else {
        int64_t size = (int64_t)st.st_size;
        if (size > lim.max_bytes) { *err = spec + ": " + std::to_string(size) + " bytes, over the limit of " + std::to_string(lim.max_bytes) + " bytes"; return false; }
        src->video = spec;
    }
    src->ffmpeg = find_on_path("ffmpeg");
    if (src->ffmpeg.empty()) {
        *err = media_label(spec) + ": decoding a video file needs an ffmpeg on PATH, and there is none (give a directory of frames or a comma-separated list of images instead)";
        return false;
    }
    return true;
}

// frame count and rate of a video file: ffmpeg copies the video stream's packets to nowhere
// and reports the count (-progress), and prints the stream's rate in its header
static inline bool ffmpeg_probe(const VideoSource& s, int64_t* frames, double* fps, std::string* err) {
    std::string cmd = shell_quote(s.ffmpeg) + " -nostdin -hide_banner -i " + shell_quote(s.video) +
                      " -map 0:v:0 -c copy -f null -progress pipe:1 - 2>&1";
    std::vector<uint8_t> out;
    int status = 0;
    if (!run_capture(cmd, 1 << 24, &out, &status)) { *err = s.video + ": ffmpeg could not be run"; return false; }
    std::string text(out.begin(), out.end());
    *frames = -1; *fps = 0;
    for (size_t a = 0; a < text.size();) {
        size_t b = text.find('\n', a);
        if (b == std::string::npos) b = text.size();
        std::string line = text.substr(a, b - a);
        a = b + 1;
        if (line.rfind("frame=", 0) == 0) *frames = strtoll(line.c_str() + 6, nullptr, 10);
        size_t v = line.find("Video:");
        if (v != std::string::npos && *fps == 0) {
            size_t f = line.find(" fps", v);
            if (f != std::string::npos) {
                size_t st = line.rfind(' ', f - 1);
                *fps = strtod(line.c_str() + st + 1, nullptr);
            }
        }
    }
    if (status != 0 || *frames < 0) {
        std::string last = text.substr(0, std::min<size_t>(text.size(), 400));
        for (char& ch : last) if (ch == '\n' || ch == '\r') ch = ' ';
        *err = s.video + ": ffmpeg cannot read it as a video: " + last;
        return false;
    }
    if (*frames == 0) { *err = s.video + ": the video has no frames"; return false; }
    if (!(*fps > 0)) { *err = s.video + ": ffmpeg reports no frame rate"; return false; }
    return true;
}

// the sampled frames of a video file: ffmpeg selects them by index and writes them as a
// stream of binary ppm images (rgb24)
static inline bool ffmpeg_frames(const VideoSource& s, const std::vector<int64_t>& idx, const MediaLimits& lim,
                                 std::vector<Image>* frames, std::string* err) {
    std::string sel;
    for (size_t i = 0; i < idx.size(); i++) {
        if (i && idx[i] == idx[i - 1]) continue;
        sel += (sel.empty() ? "" : "+") + std::string("eq(n\\,") + std::to_string(idx[i]) + ")";
    }
    std::string cmd = shell_quote(s.ffmpeg) + " -nostdin -v error -i " + shell_quote(s.video) + " -map 0:v:0 -vf " +
                      shell_quote("select=" + sel) + " -fps_mode passthrough -f image2pipe -c:v ppm -pix_fmt rgb24 -";
    std::vector<uint8_t> out;
    int status = 0;
    size_t cap = (size_t)std::min<int64_t>(lim.max_video_pixels * 3 + (int64_t)idx.size() * 64, (int64_t)1 << 40);
    if (!run_capture(cmd, cap, &out, &status)) { *err = s.video + ": the sampled frames are over the video pixel limit of " + std::to_string(lim.max_video_pixels); return false; }
    if (status != 0) { *err = s.video + ": ffmpeg failed decoding the frames"; return false; }
    std::vector<Image> uniq;
    size_t pos = 0;
    while (pos < out.size()) {
        // one ppm: "P6\n<w> <h>\n255\n" + w*h*3 bytes
        size_t p = pos; int fields = 0; int64_t v[3] = {0, 0, 0};
        if (out.size() - pos < 2 || out[pos] != 'P' || out[pos + 1] != '6') break;
        p += 2;
        while (fields < 3 && p < out.size()) {
            while (p < out.size() && isspace(out[p])) p++;
            int64_t x = 0; bool any = false;
            while (p < out.size() && isdigit(out[p]) && x < (1ll << 31)) { x = x * 10 + (out[p++] - '0'); any = true; }
            if (!any) break;
            v[fields++] = x;
        }
        if (fields < 3 || p >= out.size() || v[2] != 255 || v[0] <= 0 || v[1] <= 0) break;
        p++;
        size_t nb = (size_t)(v[0] * v[1] * 3);
        if (out.size() - p < nb) break;
        Image im; std::string e;
        if (!image_decode(&out[pos], p + nb - pos, lim, &im, &e, s.video.c_str())) { *err = e; return false; }
        uniq.push_back(std::move(im));
        pos = p + nb;
    }
    // map back onto the indices (repeated indices share a frame)
    frames->clear();
    size_t u = 0;
    for (size_t i = 0; i < idx.size(); i++) {
        if (i && idx[i] == idx[i - 1]) { frames->push_back(frames->back()); continue; }
        if (u >= uniq.size()) { *err = s.video + ": ffmpeg gave " + std::to_string(uniq.size()) + " frames, " + std::to_string(i + 1) + "+ were asked for"; return false; }
        frames->push_back(std::move(uniq[u++]));
    }
    return true;
}

// a whole video item from a spec (see video_open)
static inline bool video_load(const std::string& spec, double frames_fps, const VisionConfig& c, const MediaLimits& lim,
                              VisionItem* it, std::string* err) {
    VideoSource src;
    if (!video_open(spec, lim, &src, err)) return false;
    int64_t total;
    double fps = frames_fps;
    if (src.video.empty()) total = (int64_t)src.files.size();
    else if (!ffmpeg_probe(src, &total, &fps, err)) return false;
    const std::string what = media_label(spec);
    if (total > lim.max_frames) {
        *err = what + ": " + std::to_string(total) + " frames, over the limit of " + std::to_string(lim.max_frames);
        return false;
    }
    if ((double)total / fps > lim.max_video_seconds) {
        *err = what + ": " + py_repr((double)total / fps) + " seconds of video, over the limit of " + py_repr(lim.max_video_seconds);
        return false;
    }
    std::vector<int64_t> idx = video_sample_indices(total, fps, c);
    std::vector<Image> frames;
    if (src.video.empty()) {
        int64_t pixels = 0;
        for (int64_t i : idx) {
            Image im;
            if (!image_load(src.files[(size_t)i], lim, &im, err)) return false;
            pixels += (int64_t)im.w * im.h;
            if (pixels > lim.max_video_pixels) {
                *err = spec + ": the sampled frames have over " + std::to_string(lim.max_video_pixels) + " pixels (the video pixel limit)";
                return false;
            }
            frames.push_back(std::move(im));
        }
    } else if (!ffmpeg_frames(src, idx, lim, &frames, err)) {
        return false;
    }
    if (!vision_video(frames, idx, fps, c, it, err)) { *err = what + ": " + *err; return false; }
    return true;
}

// === preparing a request's media on host threads ===============================
//
// every item of a request decoded and preprocessed on up to `threads` std::threads (the
// functions above share nothing), so a server can run this beside the gpu. results land in
// each job in order; a failed item keeps its one-line error.

struct MediaJob {
    bool video = false;
    std::string ref;        // an image reference (media_image) or a video spec (video_load)
    VisionItem item;        // out
    bool ok = false;        // out
    std::string err;        // out, when !ok
};

static inline void vision_prepare(std::vector<MediaJob>* jobs, const VisionConfig& c, const MediaLimits& lim, double frames_fps,
                                  int threads) {
    std::atomic<size_t> next{0};
    auto work = [&]() {
        for (size_t i; (i = next++) < jobs->size();) {
            MediaJob& j = (*jobs)[i];
            Image im;
            if (j.video) j.ok = video_load(j.ref, frames_fps, c, lim, &j.item, &j.err);
            else if (!(j.ok = media_image(j.ref, lim, &im, &j.err))) {}  // the error names the reference
            else if (!(j.ok = vision_image(im, c, &j.item, &j.err))) j.err = media_label(j.ref) + ": " + j.err;
        }
    };
    const int n = std::max(1, std::min(threads, (int)jobs->size()));
    std::vector<std::thread> pool;
    for (int t = 1; t < n; t++) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
}

// === prompt expansion ===========================================================
//
// the processor's text expansion after the chat template (model.md 6.5), the one copy the cli,
// the server and the tests use: the k-th <|image_pad|> becomes the k-th image's t*h*w/4 pads;
// the k-th video's <|vision_start|><|video_pad|><|vision_end|> triple becomes, for each temporal
// patch f, "<%.1f seconds>" (its timestamp, ordinary text) + <|vision_start|> + h*w/4
// <|video_pad|> + <|vision_end|>. a bare <|video_pad|> (no triple around it) is replaced the same
// way. decision: model.md 6.5, transformers 4.x and the qwen team's processor (what the model was
// trained with) replace the whole triple; transformers 5.17's base processor replaces the pad
// only, so the template's own start/end stay around the frames (an hf divergence:
// test_vision's PromptExpansionMatchesHf accounts for it by name).
// literal: byte ranges [first, second) of text that are the conversation's own words
// (tokenizer.h's TextSpans, in order and disjoint): a user who types "<|image_pad|>" is not
// giving an image, so nothing inside them is a placeholder; out_literal gets them as they lie
// in *out.

typedef std::vector<std::pair<size_t, size_t>> VisionSpans;

static inline bool vision_expand_prompt(const std::string& text, const std::vector<const VisionItem*>& images,
                                        const std::vector<const VisionItem*>& videos, int merge, std::string* out,
                                        std::string* err, const VisionSpans* literal = nullptr,
                                        VisionSpans* out_literal = nullptr) {
    static const std::string kImage = "<|image_pad|>", kVideo = "<|video_pad|>", kStart = "<|vision_start|>", kEnd = "<|vision_end|>";
    static const std::string kTriple = kStart + kVideo + kEnd;
    for (size_t k = 0; k < videos.size(); k++)
        if (videos[k]->timestamps.size() != (size_t)videos[k]->t) {
            *err = "video " + std::to_string(k) + ": " + std::to_string(videos[k]->timestamps.size()) + " frame times for " +
                   std::to_string(videos[k]->t) + " temporal patches (a video without frame times)";
            return false;
        }
    out->clear();
    if (out_literal) out_literal->clear();
    size_t ni = 0, nv = 0, k = 0;
    const size_t nk = literal ? literal->size() : 0;
    for (size_t i = 0; i < text.size();) {
        while (k < nk && (*literal)[k].second <= i) k++;
        if (k < nk && (*literal)[k].first <= i) {  // the conversation's text, as it is
            const size_t b = std::min((*literal)[k].second, text.size()), o = out->size();
            out->append(text, i, b - i);
            if (out_literal) out_literal->emplace_back(o, out->size());
            i = b;
            continue;
        }
        const size_t limit = k < nk ? (*literal)[k].first : text.size();  // a placeholder ends before the next span
        auto at = [&](const std::string& x) { return i + x.size() <= limit && text.compare(i, x.size(), x) == 0; };
        if (text[i] != '<') { out->push_back(text[i++]); continue; }
        const bool triple = at(kTriple);
        if (at(kImage)) {
            if (ni == images.size()) { *err = "the prompt has more image placeholders than the " + std::to_string(images.size()) + " images given"; return false; }
            for (int k = images[ni++]->tokens(merge); k > 0; k--) out->append(kImage);
            i += kImage.size();
        } else if (triple || at(kVideo)) {
            if (nv == videos.size()) { *err = "the prompt has more video placeholders than the " + std::to_string(videos.size()) + " videos given"; return false; }
            const VisionItem& it = *videos[nv++];
            const int per = it.h * it.w / (merge * merge);
            for (int f = 0; f < it.t; f++) {
                char ts[64];
                snprintf(ts, sizeof ts, "<%.1f seconds>", it.timestamps[f]);
                out->append(ts).append(kStart);
                for (int k = 0; k < per; k++) out->append(kVideo);
                out->append(kEnd);
            }
            i += triple ? kTriple.size() : kVideo.size();
        } else {
            out->push_back(text[i++]);
        }
    }
    if (ni != images.size() || nv != videos.size()) {
        *err = "the prompt has placeholders for " + std::to_string(ni) + " of " + std::to_string(images.size()) + " images and " +
               std::to_string(nv) + " of " + std::to_string(videos.size()) + " videos";
        return false;
    }
    return true;
}
