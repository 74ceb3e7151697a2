// format.h: the bytes of a .ninfer artifact, and the one JSON reader/writer of the project.
//
// defines:
//   json:      Json (a parsed value, member order kept), json_parse, json_write, json_escape,
//              utf8_valid, utf8_encode, utf8_lossy (ill-formed bytes -> U+FFFD, streaming or final)
//   numbers:   bf16_to_f32, f32_to_bf16, f16_to_f32, f32_to_f16
//   container: NumFormat, Layout, TensorObject (directory entry), Artifact (mmap'd file),
//              artifact_open, artifact_close, artifact_find, encoded_size, format_name, ...
//   weights:   Mat (a 2-d weight view: row-split planes or a contiguous matrix), mat_from,
//              mat_rows (row view of a fused parent), mat_row_dequant, mat_row_dot
//
// the container is specified in shared/docs/format.md (v2, and v1 which differs only by the
// magic and the json root). nothing here knows about the model: names like
// "text/layers/0/input_norm" are the model's business (ninfer.cu).
//
// errors: the reader never throws and never crashes on bad input; every failure is one line
// in *err naming the file and the object, and a false return.
#pragma once
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <stdio.h>
#include <math.h>
#include <string>
#include <vector>
#include <utility>
#include <unordered_map>
#include <charconv>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>

// ----------------------------------------------------------------------------
// utf-8

// true if s[0..n) is well-formed utf-8 (no overlongs, no surrogates, <= U+10FFFF)
static inline bool utf8_valid(const char* s, size_t n) {
    const unsigned char* p = (const unsigned char*)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) { i++; continue; }
        int len; unsigned cp;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
        else return false;
        if (i + len > n) return false;
        for (int k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return false;
        if (cp >= 0xD800 && cp <= 0xDFFF) return false;
        i += len;
    }
    return true;
}

// append s[0..n) to out with every ill-formed sequence replaced by U+FFFD, one per maximal
// subpart (unicode's recommended practice; what rust's String::from_utf8_lossy and python's
// bytes.decode('utf-8', 'replace') do, hence what hf tokenizers sees). with final=false a
// truncated but still possible sequence at the end is not consumed: returns the number of
// bytes consumed (== n when final).
static inline size_t utf8_lossy(std::string* out, const char* s, size_t n, bool final = true) {
    const unsigned char* p = (const unsigned char*)s;
    size_t i = 0;
    while (i < n) {
        size_t run = i;  // copy ascii runs at once
        while (i < n && p[i] < 0x80) i++;
        if (i > run) out->append(s + run, i - run);
        if (i >= n) break;
        unsigned c = p[i];
        int len; unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else { out->append("\xEF\xBF\xBD"); i++; continue; }
        int k = 1;
        while (k < len && i + k < n) {
            unsigned b = p[i + k];
            if (k == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) break;
            k++;
        }
        if (k == len) { out->append(s + i, len); i += len; continue; }
        if (i + k >= n && !final) return i;  // a possible sequence cut by the end: keep it
        out->append("\xEF\xBF\xBD");
        i += k;
    }
    return n;
}

// append the utf-8 encoding of code point cp (assumed valid) to out
static inline void utf8_encode(std::string* out, uint32_t cp) {
    if (cp < 0x80) out->push_back((char)cp);
    else if (cp < 0x800) { out->push_back((char)(0xC0 | (cp >> 6))); out->push_back((char)(0x80 | (cp & 0x3F))); }
    else if (cp < 0x10000) {
        out->push_back((char)(0xE0 | (cp >> 12))); out->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    } else {
        out->push_back((char)(0xF0 | (cp >> 18))); out->push_back((char)(0x80 | ((cp >> 12) & 0x3F)));
        out->push_back((char)(0x80 | ((cp >> 6) & 0x3F))); out->push_back((char)(0x80 | (cp & 0x3F)));
    }
}

// ----------------------------------------------------------------------------
// json

enum JsonType { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT };

// a parsed json value. objects keep their members in source order (chat templates print
// tools with their key order). numbers keep their source text, so integers are exact and a
// writer can reproduce them; `is_int` is set when the text is an integer that fits int64.
struct Json {
    JsonType type = JSON_NULL;
    bool b = false;
    double num = 0;
    bool is_int = false;
    int64_t i = 0;
    std::string str;  // the string value, or the number's source text
    std::vector<Json> arr;
    std::vector<std::pair<std::string, Json>> obj;

    bool is_null() const { return type == JSON_NULL; }
    bool is_bool() const { return type == JSON_BOOL; }
    bool is_number() const { return type == JSON_NUMBER; }
    bool is_string() const { return type == JSON_STRING; }
    bool is_array() const { return type == JSON_ARRAY; }
    bool is_object() const { return type == JSON_OBJECT; }
    // member lookup; the last duplicate wins, as in python's json. nullptr when absent
    // or when this is not an object.
    const Json* get(const char* key) const {
        if (type != JSON_OBJECT) return nullptr;
        for (size_t k = obj.size(); k-- > 0;) if (obj[k].first == key) return &obj[k].second;
        return nullptr;
    }
    Json* get(const char* key) { return const_cast<Json*>(static_cast<const Json*>(this)->get(key)); }
    size_t size() const { return type == JSON_ARRAY ? arr.size() : type == JSON_OBJECT ? obj.size() : 0; }
    // builders, for writers
    static Json null_() { return Json(); }
    static Json boolean(bool v) { Json j; j.type = JSON_BOOL; j.b = v; return j; }
    static Json string(std::string s) { Json j; j.type = JSON_STRING; j.str = std::move(s); return j; }
    static Json integer(int64_t v) {
        Json j; j.type = JSON_NUMBER; j.is_int = true; j.i = v; j.num = (double)v; j.str = std::to_string(v); return j;
    }
    static Json number(double v) {  // shortest text that round-trips
        Json j; j.type = JSON_NUMBER; j.num = v;
        char buf[64]; auto r = std::to_chars(buf, buf + sizeof buf, v);
        j.str.assign(buf, r.ptr);
        if (!isfinite(v)) j.str = "null";  // json has no inf/nan
        return j;
    }
    static Json array() { Json j; j.type = JSON_ARRAY; return j; }
    static Json object() { Json j; j.type = JSON_OBJECT; return j; }
    Json& push(Json v) { arr.push_back(std::move(v)); return arr.back(); }
    Json& set(const std::string& key, Json v) {  // replaces an existing member, else appends
        for (auto& kv : obj) if (kv.first == key) { kv.second = std::move(v); return kv.second; }
        obj.emplace_back(key, std::move(v)); return obj.back().second;
    }
};

// recursive-descent parser over a byte span. rfc 8259 strictly: no comments, no trailing
// commas, no leading zeros, no nan; strings must be valid utf-8 and \u escapes must form
// valid code points (a high surrogate must be followed by a low one). nesting deeper than
// max_depth is an error, not a stack overflow.
struct JsonParser {
    const char* p; const char* end; const char* start;
    int max_depth; std::string* err;
    bool fail(const char* what) {
        if (err) {
            char buf[160]; snprintf(buf, sizeof buf, "%s at byte %zu", what, (size_t)(p - start));
            *err = buf;
        }
        return false;
    }
    void ws() { while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++; }
    bool lit(const char* s, size_t n) {
        if ((size_t)(end - p) < n || memcmp(p, s, n) != 0) return fail("invalid literal");
        p += n; return true;
    }
    bool hex4(uint32_t* v) {
        if (end - p < 4) return fail("truncated \\u escape");
        uint32_t x = 0;
        for (int k = 0; k < 4; k++) {
            char c = p[k]; x <<= 4;
            if (c >= '0' && c <= '9') x |= c - '0';
            else if (c >= 'a' && c <= 'f') x |= c - 'a' + 10;
            else if (c >= 'A' && c <= 'F') x |= c - 'A' + 10;
            else return fail("bad \\u escape");
        }
        p += 4; *v = x; return true;
    }
    bool string(std::string* out) {
        p++;  // opening quote
        out->clear();
        for (;;) {
            const char* run = p;  // copy runs of plain bytes at once
            while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) p++;
            if (p > run) {
                if (!utf8_valid(run, p - run)) { p = run; return fail("invalid utf-8 in string"); }
                out->append(run, p - run);
            }
            if (p >= end) return fail("unterminated string");
            char c = *p;
            if (c == '"') { p++; return true; }
            if ((unsigned char)c < 0x20) return fail("control character in string");
            p++;  // backslash
            if (p >= end) return fail("unterminated escape");
            char e = *p++;
            switch (e) {
                case '"': out->push_back('"'); break;
                case '\\': out->push_back('\\'); break;
                case '/': out->push_back('/'); break;
                case 'b': out->push_back('\b'); break;
                case 'f': out->push_back('\f'); break;
                case 'n': out->push_back('\n'); break;
                case 'r': out->push_back('\r'); break;
                case 't': out->push_back('\t'); break;
                case 'u': {
                    uint32_t cp;
                    if (!hex4(&cp)) return false;
                    if (cp >= 0xDC00 && cp <= 0xDFFF) return fail("unpaired low surrogate");
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        uint32_t lo;
                        if (end - p < 2 || p[0] != '\\' || p[1] != 'u') return fail("unpaired high surrogate");
                        p += 2;
                        if (!hex4(&lo)) return false;
                        if (lo < 0xDC00 || lo > 0xDFFF) return fail("unpaired high surrogate");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    }
                    utf8_encode(out, cp);
                    break;
                }
                default: p--; return fail("bad escape");
            }
        }
    }
    bool number(Json* v) {
        const char* s = p;
        bool integral = true;
        if (p < end && *p == '-') p++;
        if (p >= end) return fail("bad number");
        if (*p == '0') p++;
        else if (*p >= '1' && *p <= '9') while (p < end && *p >= '0' && *p <= '9') p++;
        else return fail("bad number");
        if (p < end && *p == '.') {
            integral = false; p++;
            if (p >= end || *p < '0' || *p > '9') return fail("bad number");
            while (p < end && *p >= '0' && *p <= '9') p++;
        }
        if (p < end && (*p == 'e' || *p == 'E')) {
            integral = false; p++;
            if (p < end && (*p == '+' || *p == '-')) p++;
            if (p >= end || *p < '0' || *p > '9') return fail("bad number");
            while (p < end && *p >= '0' && *p <= '9') p++;
        }
        v->type = JSON_NUMBER;
        v->str.assign(s, p - s);
        auto r = std::from_chars(s, p, v->num);  // out of range leaves num as +-inf semantics below
        if (r.ec == std::errc::result_out_of_range) v->num = (*s == '-') ? -HUGE_VAL : HUGE_VAL;
        if (integral) {
            auto ri = std::from_chars(s, p, v->i);
            v->is_int = (ri.ec == std::errc() && ri.ptr == p);
        }
        return true;
    }
    bool value(Json* v, int depth) {
        ws();
        if (p >= end) return fail("unexpected end of input");
        char c = *p;
        if (c == '{' || c == '[') {
            if (depth >= max_depth) return fail("nesting too deep");
            p++;
            bool is_obj = (c == '{');
            v->type = is_obj ? JSON_OBJECT : JSON_ARRAY;
            ws();
            if (p < end && *p == (is_obj ? '}' : ']')) { p++; return true; }
            for (;;) {
                ws();
                if (is_obj) {
                    if (p >= end || *p != '"') return fail("expected a member name");
                    std::string key;
                    if (!string(&key)) return false;
                    ws();
                    if (p >= end || *p != ':') return fail("expected ':'");
                    p++;
                    v->obj.emplace_back(std::move(key), Json());
                    if (!value(&v->obj.back().second, depth + 1)) return false;
                } else {
                    v->arr.emplace_back();
                    if (!value(&v->arr.back(), depth + 1)) return false;
                }
                ws();
                if (p >= end) return fail("unexpected end of input");
                if (*p == ',') { p++; continue; }
                if (*p == (is_obj ? '}' : ']')) { p++; return true; }
                return fail(is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
            }
        }
        if (c == '"') { v->type = JSON_STRING; return string(&v->str); }
        if (c == 't') { v->type = JSON_BOOL; v->b = true; return lit("true", 4); }
        if (c == 'f') { v->type = JSON_BOOL; v->b = false; return lit("false", 5); }
        if (c == 'n') { v->type = JSON_NULL; return lit("null", 4); }
        if (c == '-' || (c >= '0' && c <= '9')) return number(v);
        return fail("unexpected character");
    }
};

// parse exactly one json value from text[0..n) (surrounding whitespace allowed)
static inline bool json_parse(const char* text, size_t n, Json* out, std::string* err, int max_depth = 64) {
    JsonParser ps{text, text + n, text, max_depth, err};
    *out = Json();
    if (!ps.value(out, 0)) return false;
    ps.ws();
    if (ps.p != ps.end) return ps.fail("trailing characters after json value");
    return true;
}
static inline bool json_parse(const std::string& text, Json* out, std::string* err, int max_depth = 64) {
    return json_parse(text.data(), text.size(), out, err, max_depth);
}

// append s as a quoted json string. control characters are escaped; with ascii_only every
// non-ascii code point becomes \uXXXX (surrogate pairs above the bmp). s must be valid utf-8.
static inline void json_escape(std::string* out, const char* s, size_t n, bool ascii_only = false) {
    static const char* hex = "0123456789abcdef";
    out->push_back('"');
    const unsigned char* u = (const unsigned char*)s;
    for (size_t k = 0; k < n; k++) {
        unsigned char c = u[k];
        switch (c) {
            case '"': out->append("\\\""); continue;
            case '\\': out->append("\\\\"); continue;
            case '\n': out->append("\\n"); continue;
            case '\r': out->append("\\r"); continue;
            case '\t': out->append("\\t"); continue;
            case '\b': out->append("\\b"); continue;
            case '\f': out->append("\\f"); continue;
        }
        if (c < 0x20) {  // as python's json.dumps: DEL (0x7f) stays as it is
            out->append("\\u00"); out->push_back(hex[c >> 4]); out->push_back(hex[c & 15]);
        } else if (c < 0x80 || !ascii_only) {
            out->push_back((char)c);
        } else {  // decode one code point, write \u escapes
            int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            uint32_t cp = c & (len == 4 ? 0x07 : len == 3 ? 0x0F : 0x1F);
            for (int j = 1; j < len && k + j < n; j++) cp = (cp << 6) | (u[k + j] & 0x3F);
            k += len - 1;
            auto emit = [&](uint32_t w) {
                out->append("\\u");
                for (int sh = 12; sh >= 0; sh -= 4) out->push_back(hex[(w >> sh) & 15]);
            };
            if (cp >= 0x10000) { cp -= 0x10000; emit(0xD800 + (cp >> 10)); emit(0xDC00 + (cp & 0x3FF)); }
            else emit(cp);
        }
    }
    out->push_back('"');
}
static inline void json_escape(std::string* out, const std::string& s, bool ascii_only = false) {
    json_escape(out, s.data(), s.size(), ascii_only);
}

// compact writer (no spaces), member order kept. numbers are written from their text.
static inline void json_write(std::string* out, const Json& v, bool ascii_only = false) {
    switch (v.type) {
        case JSON_NULL: out->append("null"); break;
        case JSON_BOOL: out->append(v.b ? "true" : "false"); break;
        case JSON_NUMBER: out->append(v.str.empty() ? "0" : v.str); break;
        case JSON_STRING: json_escape(out, v.str, ascii_only); break;
        case JSON_ARRAY:
            out->push_back('[');
            for (size_t k = 0; k < v.arr.size(); k++) { if (k) out->push_back(','); json_write(out, v.arr[k], ascii_only); }
            out->push_back(']');
            break;
        case JSON_OBJECT:
            out->push_back('{');
            for (size_t k = 0; k < v.obj.size(); k++) {
                if (k) out->push_back(',');
                json_escape(out, v.obj[k].first, ascii_only);
                out->push_back(':');
                json_write(out, v.obj[k].second, ascii_only);
            }
            out->push_back('}');
            break;
    }
}
static inline std::string json_dump(const Json& v) { std::string s; json_write(&s, v); return s; }

// ----------------------------------------------------------------------------
// numbers: bf16, fp16 <-> fp32 on the host (round to nearest even)

static inline float bf16_to_f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);  // quiet nan
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) u = sign;
        else {  // subnormal: value = man * 2^-24, exact in fp32
            float f = (float)man * 5.9604644775390625e-8f;
            memcpy(&u, &f, 4); u |= sign;
        }
    } else if (exp == 31) u = sign | 0x7f800000 | (man << 13);
    else u = sign | ((exp + 112) << 23) | (man << 13);
    float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t f32_to_f16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffff;
    if (a > 0x7f800000) return sign | 0x7e00;           // nan
    if (a >= 0x477ff000) return sign | 0x7c00;          // rounds to inf (>= 65520)
    if (a < 0x38800000) {                               // subnormal or zero in fp16
        float af; memcpy(&af, &a, 4);
        float q = af * 16777216.0f;                     // in units of 2^-24, exact scaling
        uint32_t r = (uint32_t)nearbyintf(q);           // rne (default rounding mode)
        return sign | (uint16_t)r;
    }
    uint32_t man = a & 0x7fffff, exp = (a >> 23) - 112;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return sign | (uint16_t)h;
}

// ----------------------------------------------------------------------------
// container: registries, sizes, the directory, the mmap'd file

enum NumFormat { FMT_BF16, FMT_FP32, FMT_I32, FMT_Q4, FMT_Q5, FMT_Q6, FMT_W8, FMT_NVFP4, FMT_FP8_ROW, FMT_COUNT };
enum Layout { LAYOUT_CONTIGUOUS, LAYOUT_ROW_SPLIT, LAYOUT_BLOCKSCALE, LAYOUT_ROW_SCALE, LAYOUT_RAW, LAYOUT_COUNT };

static const char* const kFormatNames[FMT_COUNT] = {
    "BF16", "FP32", "I32", "Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S", "NVFP4", "FP8_E4M3FN_ROW_BF16S"};
static const char* const kLayoutNames[LAYOUT_COUNT] = {
    "contiguous-le-v1", "row-split-k128-v1", "blockscale-k16-m128x4-v1", "row-scale-v1", "raw-bytes-v1"};

static inline const char* format_name(NumFormat f) { return kFormatNames[f]; }
static inline const char* layout_name(Layout l) { return kLayoutNames[l]; }
static inline bool format_grouped(NumFormat f) { return f == FMT_Q4 || f == FMT_Q5 || f == FMT_Q6 || f == FMT_W8; }
// per-format constants of the grouped formats (format.md 6.2, 7.2)
static inline int group_size(NumFormat f) { return f == FMT_W8 ? 32 : 64; }
static inline int code_bits(NumFormat f) { return f == FMT_Q4 ? 4 : f == FMT_Q5 ? 5 : f == FMT_Q6 ? 6 : 8; }
static inline int high_bytes(NumFormat f) { return f == FMT_Q5 ? 8 : f == FMT_Q6 ? 16 : 0; }
static inline int word_bytes(NumFormat f) { return f == FMT_BF16 ? 2 : 4; }
static inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// plane geometry of a row-split-k128-v1 tensor [n, k] (format.md 7.2)
struct RowSplitGeom {  // zero-initialized so a failed geometry reads as empty
    uint64_t k_pad = 0, gpr = 0;    // padded k, groups per row
    uint64_t base_row = 0, high_row = 0;  // bytes per row in the base and high planes
    uint64_t high_offset = 0, scale_offset = 0, bytes = 0;
};
// false on overflow
static inline bool row_split_geom(NumFormat f, uint64_t n, uint64_t k, RowSplitGeom* g) {
    if (k > (1ull << 40) || n > (1ull << 40)) return false;
    g->k_pad = align_up(k, 128);
    g->gpr = g->k_pad / group_size(f);
    g->base_row = g->gpr * 32;
    g->high_row = g->gpr * high_bytes(f);
    uint64_t base = n * g->base_row, high = n * g->high_row, scales = n * g->gpr * 2;
    if (n && base / n != g->base_row) return false;
    g->high_offset = align_up(base, 256);
    g->scale_offset = g->high_offset + align_up(high, 256);
    g->bytes = g->scale_offset + scales;
    return true;
}

// encoded byte size of (format, layout, shape); false when the combination is not one this
// reader can size (unknown layout, wrong rank) or the arithmetic overflows.
static inline bool encoded_size(NumFormat f, Layout l, const std::vector<int64_t>& shape, uint64_t* bytes) {
    if (l == LAYOUT_CONTIGUOUS) {
        if (format_grouped(f) || f == FMT_NVFP4 || f == FMT_FP8_ROW || shape.size() > 16) return false;
        uint64_t n = 1;
        for (int64_t d : shape) {
            if (d <= 0 || (uint64_t)d > (1ull << 40) / 1) return false;
            if (n > (1ull << 50) / (uint64_t)d) return false;
            n *= (uint64_t)d;
        }
        *bytes = n * word_bytes(f);
        return true;
    }
    if (l == LAYOUT_ROW_SPLIT) {
        if (!format_grouped(f) || shape.size() != 2) return false;
        RowSplitGeom g;
        if (!row_split_geom(f, shape[0], shape[1], &g)) return false;
        *bytes = g.bytes;
        return true;
    }
    return false;  // nvfp4 / fp8 layouts are registered but not implemented here
}

// one directory entry. `data` points into the mapping (nothing is copied at open).
struct TensorObject {
    std::string name;
    bool resource = false;
    NumFormat format = FMT_BF16;     // tensors only
    Layout layout = LAYOUT_RAW;
    std::vector<int64_t> shape;      // logical ninfer shape
    uint64_t offset = 0, bytes = 0;  // offset is relative to the payload
    const uint8_t* data = nullptr;
    int64_t numel() const { int64_t n = 1; for (int64_t d : shape) n *= d; return n; }
};

struct Artifact {
    std::string path;
    int version = 0;                  // container version, 1 or 2
    std::string model_id, weights_id; // weights_id is empty for v1
    const uint8_t* map = nullptr;     // the whole file, read-only
    bool owns_map = false;            // map came from mmap (else borrowed memory)
    uint64_t file_size = 0;
    uint64_t json_bytes = 0, payload_offset = 0;
    std::vector<TensorObject> objects;               // in file order
    std::unordered_map<std::string, size_t> index;   // name -> objects[i]
};

static inline const TensorObject* artifact_find(const Artifact* a, const std::string& name) {
    auto it = a->index.find(name);
    return it == a->index.end() ? nullptr : &a->objects[it->second];
}

static inline void artifact_close(Artifact* a) {
    if (a->map && a->owns_map) munmap((void*)a->map, a->file_size);
    *a = Artifact();
}

// validate the json directory against the closed schema (format.md 3) and the payload
// geometry (format.md 5). `file_size` bounds the objects. on failure *err is one line.
static inline bool artifact_parse_directory(Artifact* a, const char* json, size_t n, std::string* err) {
    const std::string& path = a->path;
    auto bad = [&](const std::string& what) { *err = path + ": " + what; return false; };
    Json root; std::string jerr;
    if (!json_parse(json, n, &root, &jerr, 16)) return bad("json directory is not valid json: " + jerr);
    if (!root.is_object()) return bad("json directory is not an object");
    auto nonempty_string = [](const Json* j) { return j && j->is_string() && !j->str.empty(); };
    // root members
    if (a->version == 1) {
        if (root.size() != 2 || !root.get("model_id") || !root.get("objects"))
            return bad("v1 directory must have exactly the members model_id and objects");
        if (!nonempty_string(root.get("model_id"))) return bad("model_id must be a non-empty string");
        a->model_id = root.get("model_id")->str;
    } else {
        if (root.size() != 2 || !root.get("identity") || !root.get("objects"))
            return bad("v2 directory must have exactly the members identity and objects");
        const Json* id = root.get("identity");
        if (!id->is_object() || id->size() != 2 || !nonempty_string(id->get("model_id")) || !nonempty_string(id->get("weights_id")))
            return bad("identity must have exactly the non-empty strings model_id and weights_id");
        a->model_id = id->get("model_id")->str;
        a->weights_id = id->get("weights_id")->str;
    }
    const Json* objs = root.get("objects");
    if (!objs->is_array() || objs->arr.empty()) return bad("objects must be a non-empty array");
    uint64_t payload_bytes = a->file_size - a->payload_offset;
    uint64_t cursor = 0;
    a->objects.reserve(objs->arr.size());
    for (size_t k = 0; k < objs->arr.size(); k++) {
        const Json& o = objs->arr[k];
        std::string where = "object " + std::to_string(k);
        if (!o.is_object()) return bad(where + ": not a json object");
        const Json* name = o.get("name");
        if (!nonempty_string(name)) return bad(where + ": name must be a non-empty string");
        where = "object '" + name->str + "'";
        TensorObject t;
        t.name = name->str;
        const Json* kind = o.get("kind");
        if (!kind || !kind->is_string()) return bad(where + ": kind must be a string");
        auto get_u64 = [&](const char* key, uint64_t* v) {
            const Json* j = o.get(key);
            if (!j || !j->is_number() || !j->is_int || j->i < 0) return false;
            *v = (uint64_t)j->i; return true;
        };
        if (kind->str == "tensor") {
            static const char* keys[] = {"name", "kind", "shape", "format", "layout", "offset", "bytes"};
            if (o.size() != 7) return bad(where + ": a tensor must have exactly the members name, kind, shape, format, layout, offset, bytes");
            for (const char* key : keys) if (!o.get(key)) return bad(where + ": missing member '" + key + "'");
            const Json* shape = o.get("shape");
            if (!shape->is_array()) return bad(where + ": shape must be an array");
            for (const Json& d : shape->arr) {
                if (!d.is_number() || !d.is_int || d.i <= 0) return bad(where + ": shape entries must be positive integers");
                t.shape.push_back(d.i);
            }
            const Json* fmt = o.get("format"); const Json* lay = o.get("layout");
            if (!fmt->is_string() || !lay->is_string()) return bad(where + ": format and layout must be strings");
            int fi = -1, li = -1;
            for (int q = 0; q < FMT_COUNT; q++) if (fmt->str == kFormatNames[q]) fi = q;
            for (int q = 0; q < LAYOUT_COUNT; q++) if (lay->str == kLayoutNames[q]) li = q;
            if (fi < 0) return bad(where + ": unknown numeric format '" + fmt->str + "'");
            if (li < 0 || li == LAYOUT_RAW) return bad(where + ": unknown tensor layout '" + lay->str + "'");
            t.format = (NumFormat)fi; t.layout = (Layout)li;
            bool canon = format_grouped(t.format) ? t.layout == LAYOUT_ROW_SPLIT
                       : (t.format == FMT_BF16 || t.format == FMT_FP32 || t.format == FMT_I32) ? t.layout == LAYOUT_CONTIGUOUS : true;
            if (!canon) return bad(where + ": format " + fmt->str + " cannot use layout " + lay->str);
            if (t.format == FMT_NVFP4 || t.format == FMT_FP8_ROW)
                return bad(where + ": format " + fmt->str + " is registered but not supported by this build");
        } else if (kind->str == "resource") {
            if (o.size() != 5 || !o.get("encoding") || !o.get("offset") || !o.get("bytes"))
                return bad(where + ": a resource must have exactly the members name, kind, encoding, offset, bytes");
            const Json* enc = o.get("encoding");
            if (!enc->is_string() || enc->str != "raw-bytes-v1") return bad(where + ": unknown resource encoding");
            t.resource = true;
        } else {
            return bad(where + ": unknown kind '" + kind->str + "'");
        }
        if (!get_u64("offset", &t.offset)) return bad(where + ": offset must be an integer >= 0");
        if (!get_u64("bytes", &t.bytes) || t.bytes == 0) return bad(where + ": bytes must be an integer > 0");
        if (!t.resource) {
            uint64_t want;
            if (!encoded_size(t.format, t.layout, t.shape, &want))
                return bad(where + ": shape does not fit format " + std::string(format_name(t.format)) + " / " + layout_name(t.layout));
            if (want != t.bytes)
                return bad(where + ": bytes is " + std::to_string(t.bytes) + " but " + format_name(t.format) + " " +
                           layout_name(t.layout) + " needs " + std::to_string(want));
            if (t.offset % 256 != 0) return bad(where + ": tensor offset " + std::to_string(t.offset) + " is not 256-byte aligned");
        }
        if (t.offset < cursor) return bad(where + ": overlaps the previous object or is out of order (offset " +
                                          std::to_string(t.offset) + " < " + std::to_string(cursor) + ")");
        if (t.offset > payload_bytes || t.bytes > payload_bytes - t.offset)
            return bad(where + ": extends past the end of the file (truncated?)");
        cursor = t.offset + t.bytes;
        if (a->index.count(t.name)) return bad(where + ": duplicate object name");
        t.data = a->map + a->payload_offset + t.offset;
        a->index[t.name] = a->objects.size();
        a->objects.push_back(std::move(t));
    }
    return true;
}

// validate the prefix and the directory of a.map[0..file_size) (format.md 2, 3, 5)
static inline bool artifact_parse(Artifact* a, std::string* err) {
    if (a->file_size < 16) { *err = a->path + ": too short to be a .ninfer artifact (" + std::to_string(a->file_size) + " bytes)"; return false; }
    static const uint8_t magic[7] = {'N', 'I', 'N', 'F', 'E', 'R', 0};
    if (memcmp(a->map, magic, 7) != 0) { *err = a->path + ": not a .ninfer artifact (bad magic; expected NINFER\\0 + version 1 or 2)"; return false; }
    a->version = a->map[7];
    if (a->version != 1 && a->version != 2) {
        *err = a->path + ": unsupported .ninfer container version " + std::to_string(a->version) + " (this build reads v2 and v1)";
        return false;
    }
    uint64_t jb = 0;
    for (int k = 0; k < 8; k++) jb |= (uint64_t)a->map[8 + k] << (8 * k);
    if (jb == 0 || jb > a->file_size - 16) { *err = a->path + ": json_bytes " + std::to_string(jb) + " is zero or past the end of the file (truncated?)"; return false; }
    if (jb > (256ull << 20)) { *err = a->path + ": json directory of " + std::to_string(jb) + " bytes is implausibly large"; return false; }
    a->json_bytes = jb;
    a->payload_offset = align_up(16 + jb, 4096);
    if (a->payload_offset > a->file_size) { *err = a->path + ": file ends before the payload starts (truncated)"; return false; }
    return artifact_parse_directory(a, (const char*)a->map + 16, jb, err);
}

// open and validate an artifact. the file is mmap'd read-only; nothing is copied.
static inline bool artifact_open(Artifact* a, const char* path, std::string* err) {
    *a = Artifact();
    a->path = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { *err = std::string(path) + ": cannot open: " + strerror(errno); return false; }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) { close(fd); *err = std::string(path) + ": not a regular file"; return false; }
    a->file_size = (uint64_t)st.st_size;
    if (a->file_size == 0) { close(fd); *err = std::string(path) + ": empty file, not a .ninfer artifact"; return false; }
    void* m = mmap(nullptr, a->file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) { *err = std::string(path) + ": mmap failed: " + strerror(errno); return false; }
    a->map = (const uint8_t*)m;
    a->owns_map = true;
    if (!artifact_parse(a, err)) { artifact_close(a); return false; }
    return true;
}

// the same over bytes already in memory (tests, fuzzing); the caller keeps them alive
static inline bool artifact_open_memory(Artifact* a, const uint8_t* bytes, size_t n, const char* name, std::string* err) {
    *a = Artifact();
    a->path = name; a->map = bytes; a->file_size = n;
    if (!artifact_parse(a, err)) { artifact_close(a); return false; }
    return true;
}

// the bytes of a resource object as a string (empty when absent)
static inline std::string artifact_resource(const Artifact* a, const std::string& name) {
    const TensorObject* t = artifact_find(a, name);
    if (!t || !t->resource) return std::string();
    return std::string((const char*)t->data, t->bytes);
}

// ----------------------------------------------------------------------------
// weights: a 2-d view of a stored matrix, and row decoding
//
// Mat covers every matrix the model multiplies with: row-split grouped formats (three
// planes) and contiguous bf16 / fp32. a row view of a fused parent (e.g. the key rows of
// attention/query_key) is the same struct with the plane pointers advanced, so views cost
// nothing and work the same for host and device pointers.

struct Mat {
    NumFormat format = FMT_BF16;
    int64_t rows = 0, cols = 0;    // logical [rows, cols]; cols is k
    int64_t gpr = 0;               // groups per row (grouped formats)
    const uint8_t* base = nullptr; // grouped: base plane; contiguous: the words
    const uint8_t* high = nullptr; // grouped q5/q6: high-bit plane
    const uint8_t* scale = nullptr;// grouped: fp16 scales
    int64_t base_row = 0, high_row = 0, scale_row = 0;  // bytes per row in each plane
};

// view of a whole 2-d tensor object; data may be rebased (e.g. onto a device copy)
static inline Mat mat_from(const TensorObject* t, const uint8_t* data = nullptr) {
    Mat m;
    if (!data) data = t->data;
    m.format = t->format;
    m.rows = t->shape.size() == 2 ? t->shape[0] : 1;
    m.cols = t->shape.empty() ? 1 : t->shape.back();
    if (format_grouped(t->format)) {
        RowSplitGeom g;
        row_split_geom(t->format, m.rows, m.cols, &g);
        m.gpr = g.gpr;
        m.base = data; m.high = data + g.high_offset; m.scale = data + g.scale_offset;
        m.base_row = g.base_row; m.high_row = g.high_row; m.scale_row = g.gpr * 2;
    } else {
        m.base = data; m.base_row = m.cols * word_bytes(t->format);
    }
    return m;
}

// rows [r0, r0+n) of m
static inline Mat mat_rows(Mat m, int64_t r0, int64_t n) {
    m.base += r0 * m.base_row;
    if (m.high) m.high += r0 * m.high_row;
    if (m.scale) m.scale += r0 * m.scale_row;
    m.rows = n;
    return m;
}

// decode lane j of one group of a grouped format into its signed code
static inline int group_code(NumFormat f, const uint8_t* base, const uint8_t* high, int j) {
    if (f == FMT_W8) return (int8_t)base[j];
    int u = (base[j >> 1] >> ((j & 1) * 4)) & 0xF;
    if (f == FMT_Q5) u |= ((high[j >> 3] >> (j & 7)) & 1) << 4;
    else if (f == FMT_Q6) u |= ((high[j >> 2] >> ((j & 3) * 2)) & 3) << 4;
    int b = code_bits(f);
    return (u ^ (1 << (b - 1))) - (1 << (b - 1));  // sign-extend from b bits
}

// dequantize row r of m into out[0..cols)
static inline void mat_row_dequant(const Mat& m, int64_t r, float* out) {
    if (m.format == FMT_BF16) {
        const uint16_t* w = (const uint16_t*)(m.base + r * m.base_row);
        for (int64_t j = 0; j < m.cols; j++) out[j] = bf16_to_f32(w[j]);
        return;
    }
    if (m.format == FMT_FP32) { memcpy(out, m.base + r * m.base_row, m.cols * 4); return; }
    if (m.format == FMT_I32) {
        const int32_t* w = (const int32_t*)(m.base + r * m.base_row);
        for (int64_t j = 0; j < m.cols; j++) out[j] = (float)w[j];
        return;
    }
    int G = group_size(m.format), hb = high_bytes(m.format);
    const uint8_t* base = m.base + r * m.base_row;
    const uint8_t* high = m.high + r * m.high_row;
    const uint16_t* sc = (const uint16_t*)(m.scale + r * m.scale_row);
    for (int64_t g = 0; g * G < m.cols; g++) {
        float s = f16_to_f32(sc[g]);
        int64_t n = m.cols - g * G < G ? m.cols - g * G : G;
        for (int j = 0; j < n; j++) out[g * G + j] = s * (float)group_code(m.format, base + g * 32, high + g * hb, j);
    }
}
