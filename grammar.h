// grammar.h: constrained decoding. a byte-level context-free grammar, the compilers that make
// one (json schema, a small gbnf-like syntax, "any json object", the template's tool-call xml),
// and the matcher that turns a grammar state into a mask over a tokenizer's vocabulary.
//
// defines:
//   grammar:  Grammar (rules of alternatives over byte sets), GrammarBuilder, grammar_check
//   utf-8:    code point ranges -> byte-range sequences (gb_cp_set)
//   gbnf:     grammar_parse_gbnf (the --grammar FILE syntax below)
//   schema:   schema_compile (json schema -> Grammar), grammar_json_object, grammar_tool_call
//   matcher:  GrammarVocab (the vocabulary as a byte trie), vocab_build, GrammarMatcher,
//             matcher_init, matcher_mask, matcher_accept, matcher_accept_bytes, matcher_done
//
// depends only on the standard library and format.h (Json).
//
// json schema: the supported keywords (anything else in a schema object is refused by name,
// so a request never gets output that silently ignores part of its schema):
//   type (a name or an array of names), enum, const (their values written as compact json),
//   object: properties, required, additionalProperties (false, true or a schema; absent with
//     properties: only the declared properties are generated, which every validator accepts;
//     absent without properties: any members). properties come out in the schema's order;
//     required ones always, optional ones may be left out.
//   array: items (a schema or false), prefixItems, minItems, maxItems.
//   string: minLength, maxLength (code points), pattern (the regex subset below), format
//     (date-time, date, time, uuid, email); pattern, format and lengths do not combine.
//   number / integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers, integer
//     valued; a bounded number has no exponent). integers are written without a fraction.
//   boolean, null, anyOf, oneOf (as anyOf: the branches should not overlap), allOf with one
//     schema, $ref to "#", "#/$defs/..", "#/definitions/.." or any local json pointer
//     (recursion included), $defs / definitions.
//   annotations, accepted and not enforced: title, description, default, examples, $schema,
//     $id, $comment, deprecated, readOnly, writeOnly, discriminator.
//   boolean schemas: true (any value); false is unsatisfiable (an error).
// whitespace: between tokens the model may write nothing, one space, or a newline and up to
// GRAMMAR_WS spaces / tabs (pretty-printing 8 levels deep at two spaces), and up to 4 spaces / newlines
// before the value; a model that would pad without end cannot.
//
// the pattern subset (json schema patterns are searches: an unanchored side gets ".*"):
//   literals (utf-8 included), ".", [classes] with ranges and [^negation], \d \w \s \D \W
//   \S (ascii: \d is [0-9]), escapes \n \r \t \f \v \xHH \uHHHH and escaped punctuation,
//   groups ( ) and (?: ), alternation |, quantifiers * + ? {n} {n,} {n,m} (a lazy ? suffix
//   is accepted: it matches the same strings), ^ at the start and $ at the end of a top-level
//   branch. refused: backreferences, lookaround, \b \B, possessive quantifiers, named groups.
//   negated classes and \D \W \S match ascii only; "." matches anything but \n and \r.
//
// the gbnf-like syntax (--grammar FILE), llama.cpp's shape:
//   rule ::= alternatives          one or more rules; "root" is where the output starts
//   "literal"  [a-z0-9_] [^"\\]  .   literals (escapes \n \r \t \\ \" \] \xHH \uHHHH), code
//                                   point classes, any code point
//   name  ( ... )  a | b  x* x+ x? x{m} x{m,} x{m,n}   references, groups, alternation, repeats
//   # comment to the end of the line. left recursion is refused.
#pragma once
#include <stdint.h>
#include <string.h>
#include <string>
#include <vector>
#include <array>
#include <unordered_map>
#include <algorithm>
#include <memory>
#include <functional>
#include <stdlib.h>
#include <math.h>
#include "format.h"

enum { GRAMMAR_WS = 16, GRAMMAR_LEAD_WS = 4, GRAMMAR_MAX_ELEMS = 4 << 20, GRAMMAR_MAX_REPEAT = 100000 };

// ----------------------------------------------------------------------------
// grammar: rules of alternatives; an alternative is a sequence of elements in `el` ended by
// GE_END. elements are byte sets (GE_CHARS: sets[v]) or rule references (GE_REF: rule v).

enum { GE_END = 0, GE_CHARS = 1, GE_REF = 2 };
struct GElem { int kind = GE_END; int v = 0; };
typedef std::array<uint64_t, 4> ByteSet;  // 256 bits
static inline bool byteset_has(const ByteSet& s, int b) { return (s[b >> 6] >> (b & 63)) & 1; }
static inline void byteset_add(ByteSet* s, int lo, int hi) { for (int b = lo; b <= hi; b++) (*s)[b >> 6] |= 1ull << (b & 63); }

struct Grammar {
    std::vector<GElem> el;                // every alternative, each ended by GE_END
    std::vector<std::vector<int>> alts;   // rule -> offsets of its alternatives in el
    std::vector<std::string> names;       // rule -> name (diagnostics)
    std::vector<ByteSet> sets;
    int root = -1;
};

typedef std::vector<GElem> GSeq;

// builds a Grammar; every helper returns a sequence to splice into an alternative
struct GrammarBuilder {
    Grammar g;
    std::unordered_map<std::string, int> set_ids;
    bool overflow = false;
    int rule(const std::string& name) { g.alts.emplace_back(); g.names.push_back(name); return (int)g.alts.size() - 1; }
    void add(int r, const GSeq& s) {
        if (g.el.size() + s.size() + 1 > GRAMMAR_MAX_ELEMS) { overflow = true; return; }
        g.alts[r].push_back((int)g.el.size());
        g.el.insert(g.el.end(), s.begin(), s.end());
        g.el.push_back(GElem{GE_END, 0});
    }
    GElem chars(const ByteSet& s) {
        std::string key((const char*)s.data(), sizeof(ByteSet));
        auto it = set_ids.find(key);
        if (it != set_ids.end()) return GElem{GE_CHARS, it->second};
        g.sets.push_back(s);
        set_ids[key] = (int)g.sets.size() - 1;
        return GElem{GE_CHARS, (int)g.sets.size() - 1};
    }
    GElem range(int lo, int hi) { ByteSet s = {}; byteset_add(&s, lo, hi); return chars(s); }
    static GElem ref(int r) { return GElem{GE_REF, r}; }
    GSeq lit(const std::string& bytes) { GSeq s; for (unsigned char c : bytes) s.push_back(range(c, c)); return s; }
    // a rule of alternatives, as one reference
    GSeq alt(const std::vector<GSeq>& options, const char* name = "alt") {
        int r = rule(name);
        for (const auto& o : options) add(r, o);
        return GSeq{ref(r)};
    }
    GSeq opt(const GSeq& x) { return alt({x, GSeq()}, "opt"); }
    GSeq star(const GSeq& x) {  // r ::= x r | (empty): a tail call, so the stack stays flat
        int r = rule("star");
        GSeq s = x; s.push_back(ref(r));
        add(r, s); add(r, GSeq());
        return GSeq{ref(r)};
    }
    // x{lo,hi}; hi < 0: unbounded
    GSeq rep(const GSeq& x, int lo, int hi) {
        GSeq s;
        if ((uint64_t)x.size() * (uint64_t)std::max(lo, 0) + g.el.size() > GRAMMAR_MAX_ELEMS ||
            (hi > lo && (uint64_t)(hi - lo) * (x.size() + 2) + g.el.size() > GRAMMAR_MAX_ELEMS)) { overflow = true; return s; }
        for (int i = 0; i < lo; i++) s.insert(s.end(), x.begin(), x.end());
        if (hi < 0) { GSeq t = star(x); s.insert(s.end(), t.begin(), t.end()); return s; }
        GSeq tail;  // (x (x (...)?)?)? with hi - lo levels
        for (int i = lo; i < hi; i++) {
            int r = rule("rep");
            GSeq a = x; a.insert(a.end(), tail.begin(), tail.end());
            add(r, a); add(r, GSeq());
            tail = GSeq{ref(r)};
        }
        s.insert(s.end(), tail.begin(), tail.end());
        return s;
    }
};
static inline GSeq operator+(GSeq a, const GSeq& b) { a.insert(a.end(), b.begin(), b.end()); return a; }

// undefined rules and left recursion (a rule reaching itself without consuming a byte would
// make the matcher loop): false and *err naming the rule
static inline bool grammar_check(const Grammar& g, std::string* err) {
    const int R = (int)g.alts.size();
    if (g.root < 0 || g.root >= R) { *err = "the grammar has no root rule"; return false; }
    for (int r = 0; r < R; r++)
        if (g.alts[r].empty()) { *err = "rule '" + g.names[r] + "' has no alternatives (undefined?)"; return false; }
    std::vector<char> nullable(R, 0);
    for (bool changed = true; changed;) {
        changed = false;
        for (int r = 0; r < R; r++) {
            if (nullable[r]) continue;
            for (int a : g.alts[r]) {
                bool all = true;
                for (int p = a; g.el[p].kind != GE_END && all; p++) all = g.el[p].kind == GE_REF && nullable[g.el[p].v];
                if (all) { nullable[r] = 1; changed = true; break; }
            }
        }
    }
    // left edges r -> s: s at a position of r's alternative reached without a byte
    std::vector<std::vector<int>> left(R);
    for (int r = 0; r < R; r++)
        for (int a : g.alts[r])
            for (int p = a; g.el[p].kind == GE_REF; p++) { left[r].push_back(g.el[p].v); if (!nullable[g.el[p].v]) break; }
    std::vector<char> color(R, 0);  // 0 new, 1 on the path, 2 done
    for (int s0 = 0; s0 < R; s0++) {
        if (color[s0]) continue;
        std::vector<std::pair<int, size_t>> st{{s0, 0}};
        color[s0] = 1;
        while (!st.empty()) {
            auto& [r, k] = st.back();
            if (k == left[r].size()) { color[r] = 2; st.pop_back(); continue; }
            int s = left[r][k++];
            if (color[s] == 1) { *err = "rule '" + g.names[s] + "' is left-recursive"; return false; }
            if (!color[s]) { color[s] = 1; st.push_back({s, 0}); }
        }
    }
    return true;
}

// ----------------------------------------------------------------------------
// utf-8: a set of code point ranges as alternatives of byte-range sequences (surrogates are
// never code points here). the split is the classic one: cut a range at the encoded-length
// boundaries, then wherever lo and hi differ above a continuation byte without being aligned.

typedef std::vector<std::pair<uint32_t, uint32_t>> CpRanges;

static inline int gb_utf8(uint32_t cp, uint8_t* b) {
    if (cp < 0x80) { b[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { b[0] = 0xC0 | (cp >> 6); b[1] = 0x80 | (cp & 63); return 2; }
    if (cp < 0x10000) { b[0] = 0xE0 | (cp >> 12); b[1] = 0x80 | ((cp >> 6) & 63); b[2] = 0x80 | (cp & 63); return 3; }
    b[0] = 0xF0 | (cp >> 18); b[1] = 0x80 | ((cp >> 12) & 63); b[2] = 0x80 | ((cp >> 6) & 63); b[3] = 0x80 | (cp & 63); return 4;
}
static inline void gb_utf8_split(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
    if (lo > hi) return;
    if (lo <= 0xDFFF && hi >= 0xD800) {  // no surrogates
        if (lo < 0xD800) gb_utf8_split(lo, 0xD7FF, out);
        if (hi > 0xDFFF) gb_utf8_split(0xE000, hi, out);
        return;
    }
    for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu})
        if (lo <= edge && hi > edge) { gb_utf8_split(lo, edge, out); gb_utf8_split(edge + 1, hi, out); return; }
    uint8_t a[4], b[4];
    int n = gb_utf8(lo, a);
    gb_utf8(hi, b);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) { gb_utf8_split(lo, lo | m, out); gb_utf8_split((lo | m) + 1, hi, out); return; }
            if ((hi & m) != m) { gb_utf8_split(lo, (hi & ~m) - 1, out); gb_utf8_split(hi & ~m, hi, out); return; }
        }
    }
    std::vector<std::pair<uint8_t, uint8_t>> seq;
    for (int i = 0; i < n; i++) seq.push_back({a[i], b[i]});
    out->push_back(seq);
}
// normalise: sorted, merged, clipped to the code point space
static inline CpRanges cp_normalise(CpRanges r) {
    std::sort(r.begin(), r.end());
    CpRanges o;
    for (auto& x : r) {
        if (x.first > 0x10FFFF || x.first > x.second) continue;
        x.second = std::min<uint32_t>(x.second, 0x10FFFF);
        if (!o.empty() && x.first <= o.back().second + 1) o.back().second = std::max(o.back().second, x.second);
        else o.push_back(x);
    }
    return o;
}
static inline CpRanges cp_complement(const CpRanges& r0) {
    CpRanges r = cp_normalise(r0), o;
    uint32_t next = 0;
    for (auto& x : r) { if (x.first > next) o.push_back({next, x.first - 1}); next = x.second + 1; }
    if (next <= 0x10FFFF) o.push_back({next, 0x10FFFF});
    return o;
}
// one element or a rule: every code point of the set, utf-8 encoded
static inline GSeq gb_cp_set(GrammarBuilder* b, const CpRanges& r0) {
    CpRanges r = cp_normalise(r0);
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    for (auto& x : r) gb_utf8_split(x.first, x.second, &seqs);
    ByteSet one = {};
    bool any_one = false;
    std::vector<GSeq> options;
    for (auto& s : seqs) {
        if (s.size() == 1) { byteset_add(&one, s[0].first, s[0].second); any_one = true; continue; }
        GSeq q;
        for (auto& p : s) q.push_back(b->range(p.first, p.second));
        options.push_back(q);
    }
    if (any_one) options.insert(options.begin(), GSeq{b->chars(one)});
    if (options.size() == 1) return options[0];
    return b->alt(options, "cpset");
}

// ----------------------------------------------------------------------------
// gbnf: the --grammar FILE syntax (the header says what it is)

struct GbnfParser {
    const char* p; const char* end;
    GrammarBuilder* b;
    std::unordered_map<std::string, int> rules;
    std::string err;
    int line = 1;
    bool fail(const std::string& what) { if (err.empty()) err = "line " + std::to_string(line) + ": " + what; return false; }
    void ws(bool newlines) {
        for (;;) {
            while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || (newlines && *p == '\n'))) { if (*p == '\n') line++; p++; }
            if (p < end && *p == '#') { while (p < end && *p != '\n') p++; continue; }
            break;
        }
    }
    static bool name_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; }
    std::string name() { const char* s = p; while (p < end && name_char(*p)) p++; return std::string(s, p); }
    int rule_of(const std::string& n) {
        auto it = rules.find(n);
        if (it != rules.end()) return it->second;
        int r = b->rule(n);
        rules[n] = r;
        return r;
    }
    bool hexn(int n, uint32_t* v) {
        *v = 0;
        for (int i = 0; i < n; i++) {
            if (p >= end) return fail("a short hex escape");
            char c = *p++;
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) return fail("a bad hex escape");
            *v = *v * 16 + d;
        }
        return true;
    }
    // one code point of a literal or class (escapes decoded)
    bool cp(uint32_t* v) {
        if (p >= end) return fail("unexpected end of the grammar");
        unsigned char c = *p;
        if (c == '\n') return fail("a newline inside a literal or class");
        if (c == '\\') {
            p++;
            if (p >= end) return fail("a dangling backslash");
            char e = *p++;
            switch (e) {
                case 'n': *v = '\n'; return true;
                case 'r': *v = '\r'; return true;
                case 't': *v = '\t'; return true;
                case 'x': return hexn(2, v);
                case 'u': return hexn(4, v);
                case 'U': return hexn(8, v);
                case '\\': case '"': case '[': case ']': case '-': case '^': *v = (unsigned char)e; return true;
                default: return fail(std::string("unknown escape \\") + e);
            }
        }
        // a utf-8 sequence
        int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!n || p + n > end || !utf8_valid(p, n)) return fail("invalid utf-8");
        *v = n == 1 ? c : n == 2 ? c & 31 : n == 3 ? c & 15 : c & 7;
        for (int i = 1; i < n; i++) *v = (*v << 6) | (p[i] & 63);
        p += n;
        return true;
    }
    bool alternatives(std::vector<GSeq>* out, int depth) {
        if (depth > 100) return fail("groups nested deeper than 100");
        if (b->overflow) return fail("the grammar is too large");
        out->push_back(GSeq());
        for (;;) {
            ws(depth > 0);
            if (p >= end) return true;
            char c = *p;
            if (c == '\n') {  // a rule goes on over lines while the next line does not start a rule
                const char* save = p; int save_line = line;
                ws(true);
                const char* q = p;
                std::string n = name();
                ws(false);
                bool starts = !n.empty() && end - p >= 3 && memcmp(p, "::=", 3) == 0;
                p = q;
                if (starts || p >= end) { p = save; line = save_line; return true; }
                continue;
            }
            if (c == '|') { p++; out->push_back(GSeq()); continue; }
            if (c == ')') { if (!depth) return fail("unbalanced ')'"); return true; }
            GSeq item;
            if (c == '"') {
                p++;
                while (p < end && *p != '"') {
                    uint32_t v;
                    if (!cp(&v)) return false;
                    uint8_t bb[4]; int n = gb_utf8(v, bb);
                    for (int i = 0; i < n; i++) item.push_back(b->range(bb[i], bb[i]));
                }
                if (p >= end) return fail("an unterminated literal");
                p++;
            } else if (c == '[') {
                p++;
                bool neg = p < end && *p == '^';
                if (neg) p++;
                CpRanges r;
                while (p < end && *p != ']') {
                    uint32_t lo, hi;
                    if (!cp(&lo)) return false;
                    hi = lo;
                    if (p + 1 < end && *p == '-' && p[1] != ']') { p++; if (!cp(&hi)) return false; }
                    if (hi < lo) return fail("a class range out of order");
                    r.push_back({lo, hi});
                }
                if (p >= end) return fail("an unterminated class");
                p++;
                if (neg) r = cp_complement(r);
                if (cp_normalise(r).empty()) return fail("an empty class");
                item = gb_cp_set(b, r);
            } else if (c == '.') {
                p++;
                item = gb_cp_set(b, {{0, 0x10FFFF}});
            } else if (c == '(') {
                p++;
                std::vector<GSeq> inner;
                if (!alternatives(&inner, depth + 1)) return false;
                if (p >= end || *p != ')') return fail("a '(' without ')'");
                p++;
                item = b->alt(inner, "group");
            } else if (name_char(c)) {
                std::string n = name();
                item = GSeq{GrammarBuilder::ref(rule_of(n))};
            } else {
                return fail(std::string("unexpected '") + c + "'");
            }
            // a repeat
            if (p < end && (*p == '*' || *p == '+' || *p == '?')) {
                char q = *p++;
                item = q == '*' ? b->rep(item, 0, -1) : q == '+' ? b->rep(item, 1, -1) : b->rep(item, 0, 1);
            } else if (p < end && *p == '{') {
                p++;
                auto num = [&](int* v) {
                    if (p >= end || *p < '0' || *p > '9') return false;
                    long x = 0;
                    while (p < end && *p >= '0' && *p <= '9') { x = x * 10 + (*p++ - '0'); if (x > GRAMMAR_MAX_REPEAT) return false; }
                    *v = (int)x; return true;
                };
                int lo = 0, hi = 0;
                if (!num(&lo)) return fail("a bad repeat count (0.." + std::to_string(GRAMMAR_MAX_REPEAT) + ")");
                hi = lo;
                if (p < end && *p == ',') { p++; hi = -1; if (p < end && *p != '}' && !num(&hi)) return fail("a bad repeat count"); }
                if (p >= end || *p != '}') return fail("a '{' repeat without '}'");
                p++;
                if (hi >= 0 && hi < lo) return fail("a repeat {m,n} with n < m");
                item = b->rep(item, lo, hi);
            }
            out->back().insert(out->back().end(), item.begin(), item.end());
        }
    }
};

// the --grammar FILE text -> *g; false and a one-line *err (with the line number)
static inline bool grammar_parse_gbnf(const std::string& text, Grammar* g, std::string* err) {
    GrammarBuilder b;
    GbnfParser P{text.data(), text.data() + text.size(), &b};
    std::vector<char> defined;
    for (;;) {
        P.ws(true);
        if (P.p >= P.end) break;
        std::string n = P.name();
        if (n.empty()) { P.fail(std::string("expected a rule name, found '") + *P.p + "'"); break; }
        P.ws(false);
        if (P.end - P.p < 3 || memcmp(P.p, "::=", 3) != 0) { P.fail("expected '::=' after '" + n + "'"); break; }
        P.p += 3;
        int r = P.rule_of(n);
        if ((int)defined.size() <= r) defined.resize(r + 1, 0);
        if (defined[r]) { P.fail("rule '" + n + "' is defined twice"); break; }
        defined[r] = 1;
        std::vector<GSeq> alts;
        if (!P.alternatives(&alts, 0)) break;
        for (auto& a : alts) b.add(r, a);
    }
    if (!P.err.empty()) { *err = P.err; return false; }
    if (b.overflow) { *err = "the grammar is too large"; return false; }
    auto it = P.rules.find("root");
    if (it == P.rules.end()) { *err = "the grammar has no 'root' rule"; return false; }
    b.g.root = it->second;
    for (auto& kv : P.rules)
        if ((int)defined.size() <= kv.second || !defined[kv.second]) { *err = "rule '" + kv.first + "' is used but not defined"; return false; }
    if (!grammar_check(b.g, err)) return false;
    *g = std::move(b.g);
    return true;
}

// ----------------------------------------------------------------------------
// schema: json schema -> Grammar (the header lists the keywords). every compile_* returns the
// sequence for one value; on error it sets err (naming the keyword and where it is) and
// returns an empty sequence.

struct SchemaCompiler {
    GrammarBuilder b;
    const Json* root = nullptr;
    std::string err;
    std::unordered_map<std::string, int> refs;  // json pointer -> its rule
    int r_ws = -1, r_char = -1, r_string = -1, r_value = -1, r_number = -1, r_int = -1;
    int depth = 0;

    bool fail(const std::string& path, const std::string& what) {
        if (err.empty()) err = (path.empty() ? std::string("schema") : "schema at " + path) + ": " + what;
        return false;
    }
    GSeq ws() { return GSeq{GrammarBuilder::ref(r_ws)}; }
    GSeq digits(int lo, int hi) { return b.rep(GSeq{b.range('0', '9')}, lo, hi); }

    void build_common() {
        // between tokens: nothing, one space, or one newline and an indentation
        r_ws = b.rule("ws");
        ByteSet w = {}; byteset_add(&w, ' ', ' '); byteset_add(&w, '\t', '\t');
        b.add(r_ws, GSeq());
        b.add(r_ws, b.lit(" "));
        b.add(r_ws, b.lit("\n") + b.rep(GSeq{b.chars(w)}, 0, GRAMMAR_WS));
        // one json string character: raw (no quote, backslash or control) or an escape
        r_char = b.rule("char");
        b.add(r_char, gb_cp_set(&b, {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}}));
        ByteSet e = {};
        for (char c : std::string("\"\\/bfnrt")) byteset_add(&e, (unsigned char)c, (unsigned char)c);
        b.add(r_char, GSeq{b.range('\\', '\\'), b.chars(e)});
        ByteSet hex = {}; byteset_add(&hex, '0', '9'); byteset_add(&hex, 'a', 'f'); byteset_add(&hex, 'A', 'F');
        ByteSet h1 = {}; byteset_add(&h1, '0', '9'); byteset_add(&h1, 'a', 'c'); byteset_add(&h1, 'A', 'C');
        ByteSet h2 = {}; byteset_add(&h2, 'e', 'f'); byteset_add(&h2, 'E', 'F'); byteset_add(&h2, 'd', 'd'); byteset_add(&h2, 'D', 'D');
        GElem H = b.chars(hex);
        // \uXXXX without surrogates: [0-9a-cA-C]XXX | [dD][0-7]XX | [eEfF]XXX
        ByteSet eF = {}; byteset_add(&eF, 'e', 'f'); byteset_add(&eF, 'E', 'F');
        ByteSet dD = {}; byteset_add(&dD, 'd', 'd'); byteset_add(&dD, 'D', 'D');
        (void)h2;
        GSeq u = GSeq{b.range('\\', '\\'), b.range('u', 'u')} +
                 b.alt({GSeq{b.chars(h1), H, H, H}, GSeq{b.chars(dD), b.range('0', '7'), H, H}, GSeq{b.chars(eF), H, H, H}}, "u4");
        b.add(r_char, u);
        r_string = b.rule("string");
        b.add(r_string, b.lit("\"") + b.star(GSeq{GrammarBuilder::ref(r_char)}) + b.lit("\""));
        r_int = b.rule("integer");
        b.add(r_int, b.opt(b.lit("-")) + b.alt({b.lit("0"), GSeq{b.range('1', '9')} + digits(0, -1)}, "int"));
        r_number = b.rule("number");
        ByteSet eE = {}; byteset_add(&eE, 'e', 'e'); byteset_add(&eE, 'E', 'E');
        ByteSet pm = {}; byteset_add(&pm, '+', '+'); byteset_add(&pm, '-', '-');
        b.add(r_number, GSeq{GrammarBuilder::ref(r_int)} + b.opt(b.lit(".") + digits(1, -1)) +
                            b.opt(GSeq{b.chars(eE)} + b.opt(GSeq{b.chars(pm)}) + digits(1, -1)));
        // any json value
        r_value = b.rule("value");
        int r_obj = b.rule("object"), r_arr = b.rule("array");
        GSeq V{GrammarBuilder::ref(r_value)}, S{GrammarBuilder::ref(r_string)};
        GSeq member = S + ws() + b.lit(":") + ws() + V + ws();
        b.add(r_obj, b.lit("{") + ws() + b.opt(member + b.star(b.lit(",") + ws() + member)) + b.lit("}"));
        b.add(r_arr, b.lit("[") + ws() + b.opt(V + ws() + b.star(b.lit(",") + ws() + V + ws())) + b.lit("]"));
        for (int r : {r_obj, r_arr, r_string, r_number}) b.add(r_value, GSeq{GrammarBuilder::ref(r)});
        for (const char* l : {"true", "false", "null"}) b.add(r_value, b.lit(l));
    }

    // the schema a local reference points at (json pointer with ~0 ~1)
    const Json* resolve(const std::string& ref) {
        if (ref.empty() || ref[0] != '#') return nullptr;
        const Json* at = root;
        size_t i = 1;
        if (i < ref.size() && ref[i] != '/') return nullptr;
        while (at && i < ref.size()) {
            size_t j = ref.find('/', i + 1);
            std::string tok = ref.substr(i + 1, (j == std::string::npos ? ref.size() : j) - i - 1), t;
            for (size_t k = 0; k < tok.size(); k++) {
                if (tok[k] == '~' && k + 1 < tok.size() && (tok[k + 1] == '0' || tok[k + 1] == '1')) { t += tok[k + 1] == '0' ? '~' : '/'; k++; }
                else t += tok[k];
            }
            if (at->is_object()) at = at->get(t.c_str());
            else if (at->is_array()) {
                char* e = nullptr; long n = strtol(t.c_str(), &e, 10);
                at = !t.empty() && *e == 0 && n >= 0 && (size_t)n < at->arr.size() ? &at->arr[n] : nullptr;
            } else at = nullptr;
            i = j == std::string::npos ? ref.size() : j;
        }
        return at;
    }

    static bool is_annotation(const std::string& k) {
        static const char* const a[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                                        "readOnly", "writeOnly", "discriminator", "$defs", "definitions", nullptr};
        for (int i = 0; a[i]; i++) if (k == a[i]) return true;
        return false;
    }
    static bool known(const std::string& k) {
        static const char* const a[] = {"type", "enum", "const", "properties", "required", "additionalProperties", "items",
                                        "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format",
                                        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf",
                                        "$ref", nullptr};
        for (int i = 0; a[i]; i++) if (k == a[i]) return true;
        return is_annotation(k);
    }

    bool count(const Json& s, const char* key, const std::string& path, int* v) {
        const Json* x = s.get(key);
        if (!x) return true;
        if (!x->is_number() || !x->is_int || x->i < 0) return fail(path, std::string("'") + key + "' must be a non-negative integer");
        if (x->i > GRAMMAR_MAX_REPEAT) return fail(path, std::string("'") + key + "' over " + std::to_string(GRAMMAR_MAX_REPEAT) + " is not supported");
        *v = (int)x->i;
        return true;
    }

    // a json value's compact text (enum / const literals)
    GSeq literal(const Json& v) { std::string t; json_write(&t, v); return b.lit(t); }

    GSeq compile(const Json& s, const std::string& path) {
        if (b.overflow) fail(path, "the schema's grammar is too large");
        if (!err.empty()) return GSeq();
        if (++depth > 64) { fail(path, "nesting deeper than 64 schemas"); return GSeq(); }
        GSeq out = compile_inner(s, path);
        depth--;
        return out;
    }

    GSeq compile_inner(const Json& s, const std::string& path) {
        if (s.is_bool()) {
            if (s.b) return GSeq{GrammarBuilder::ref(r_value)};
            fail(path, "the schema false matches nothing");
            return GSeq();
        }
        if (!s.is_object()) { fail(path, "a schema must be an object or a boolean"); return GSeq(); }
        for (auto& kv : s.obj)
            if (!known(kv.first)) { fail(path, "unsupported keyword '" + kv.first + "'"); return GSeq(); }
        auto others = [&](std::initializer_list<const char*> allowed) -> const char* {  // a keyword beside these, not an annotation
            for (auto& kv : s.obj) {
                if (is_annotation(kv.first)) continue;
                bool ok = false;
                for (const char* a : allowed) ok = ok || kv.first == a;
                if (!ok) return kv.first.c_str();
            }
            return nullptr;
        };
        if (const Json* ref = s.get("$ref")) {
            if (!ref->is_string()) { fail(path, "'$ref' must be a string"); return GSeq(); }
            if (const char* o = others({"$ref"})) { fail(path, std::string("'$ref' with a sibling keyword ('") + o + "') is not supported"); return GSeq(); }
            auto it = refs.find(ref->str);
            if (it != refs.end()) return GSeq{GrammarBuilder::ref(it->second)};
            const Json* t = resolve(ref->str);
            if (!t) { fail(path, "'$ref' " + ref->str + " does not resolve (only local references are supported)"); return GSeq(); }
            int r = b.rule("ref " + ref->str);
            refs[ref->str] = r;
            GSeq body = compile(*t, ref->str);
            if (!err.empty()) return GSeq();
            b.add(r, body);
            return GSeq{GrammarBuilder::ref(r)};
        }
        for (const char* comb : {"anyOf", "oneOf", "allOf"}) {
            const Json* a = s.get(comb);
            if (!a) continue;
            if (!a->is_array() || a->arr.empty()) { fail(path, std::string("'") + comb + "' must be a non-empty array"); return GSeq(); }
            if (const char* o = others({comb})) { fail(path, std::string("'") + comb + "' with a sibling keyword ('" + o + "') is not supported"); return GSeq(); }
            if (!strcmp(comb, "allOf")) {
                if (a->arr.size() != 1) { fail(path, "'allOf' with more than one schema is not supported"); return GSeq(); }
                return compile(a->arr[0], path + "/allOf/0");
            }
            std::vector<GSeq> opts;
            for (size_t i = 0; i < a->arr.size(); i++) {
                opts.push_back(compile(a->arr[i], path + "/" + comb + "/" + std::to_string(i)));
                if (!err.empty()) return GSeq();
            }
            return b.alt(opts, comb);
        }
        const Json* en = s.get("enum");
        const Json* cn = s.get("const");
        if (en || cn) {
            if (const char* o = others({"enum", "const", "type"})) { fail(path, std::string("'enum' / 'const' with '") + o + "' is not supported"); return GSeq(); }
            std::vector<const Json*> vals;
            if (cn) vals.push_back(cn);
            else {
                if (!en->is_array() || en->arr.empty()) { fail(path, "'enum' must be a non-empty array"); return GSeq(); }
                for (const Json& v : en->arr) vals.push_back(&v);
            }
            std::vector<GSeq> opts;
            for (const Json* v : vals) if (type_allows(s, *v)) opts.push_back(literal(*v));
            if (en && cn) { fail(path, "'enum' with 'const' is not supported"); return GSeq(); }
            if (opts.empty()) { fail(path, "no 'enum' / 'const' value has the schema's type"); return GSeq(); }
            return b.alt(opts, "enum");
        }
        // the types: given, or implied by the keywords (none: any value)
        std::vector<std::string> types;
        if (const Json* t = s.get("type")) {
            if (t->is_string()) types.push_back(t->str);
            else if (t->is_array() && !t->arr.empty()) {
                for (const Json& x : t->arr) { if (!x.is_string()) { fail(path, "'type' entries must be strings"); return GSeq(); } types.push_back(x.str); }
            } else { fail(path, "'type' must be a string or a non-empty array of strings"); return GSeq(); }
        } else {
            for (const char* k : {"properties", "required", "additionalProperties"}) if (s.get(k)) { types = {"object"}; break; }
            for (const char* k : {"items", "prefixItems", "minItems", "maxItems"}) if (s.get(k)) types.push_back("array");
            for (const char* k : {"minLength", "maxLength", "pattern", "format"}) if (s.get(k)) { types.push_back("string"); break; }
            for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) if (s.get(k)) { types.push_back("number"); break; }
            types.erase(std::unique(types.begin(), types.end()), types.end());
            if (types.size() > 1) { fail(path, "keywords of several types without 'type'"); return GSeq(); }
            if (types.empty()) return GSeq{GrammarBuilder::ref(r_value)};
        }
        std::vector<GSeq> opts;
        for (const std::string& t : types) {
            if (t == "object") opts.push_back(compile_object(s, path));
            else if (t == "array") opts.push_back(compile_array(s, path));
            else if (t == "string") opts.push_back(compile_string(s, path));
            else if (t == "number" || t == "integer") opts.push_back(compile_number(s, path, t == "integer"));
            else if (t == "boolean") opts.push_back(b.alt({b.lit("true"), b.lit("false")}, "boolean"));
            else if (t == "null") opts.push_back(b.lit("null"));
            else { fail(path, "unknown type '" + t + "'"); return GSeq(); }
            if (!err.empty()) return GSeq();
        }
        return opts.size() == 1 ? opts[0] : b.alt(opts, "types");
    }

    static bool type_allows(const Json& s, const Json& v) {
        const Json* t = s.get("type");
        if (!t) return true;
        auto one = [&](const std::string& n) {
            if (n == "object") return v.is_object();
            if (n == "array") return v.is_array();
            if (n == "string") return v.is_string();
            if (n == "number") return v.is_number();
            if (n == "integer") return v.is_number() && (v.is_int || (std::isfinite(v.num) && v.num == (double)(int64_t)v.num));
            if (n == "boolean") return v.is_bool();
            if (n == "null") return v.is_null();
            return false;
        };
        if (t->is_string()) return one(t->str);
        if (t->is_array()) for (const Json& x : t->arr) if (x.is_string() && one(x.str)) return true;
        return false;
    }

    // a key that is none of `names` (additional properties): a json string of printable ascii
    // without escapes, steered around the named keys by a trie over their bytes
    GSeq key_except(const std::vector<std::string>& names) {
        ByteSet kc = {}; byteset_add(&kc, 0x20, 0x7E);
        kc['"' >> 6] &= ~(1ull << ('"' & 63)); kc['\\' >> 6] &= ~(1ull << ('\\' & 63));
        int r_free = b.rule("key-free");
        b.add(r_free, b.star(GSeq{b.chars(kc)}) + b.lit("\""));
        std::vector<std::string> ns = names;
        std::sort(ns.begin(), ns.end());
        ns.erase(std::unique(ns.begin(), ns.end()), ns.end());
        // node for prefix `pre` over the sorted names [lo, hi) sharing it
        std::vector<std::string> stack;
        std::function<int(const std::string&, size_t, size_t)> node = [&](const std::string& pre, size_t lo, size_t hi) -> int {
            int r = b.rule("key-trie");
            bool full = false;
            ByteSet other = kc;
            for (size_t i = lo; i < hi;) {
                if (ns[i].size() == pre.size()) { full = true; i++; continue; }
                unsigned char c = ns[i][pre.size()];
                size_t j = i;
                while (j < hi && ns[j].size() > pre.size() && (unsigned char)ns[j][pre.size()] == c) j++;
                if (byteset_has(kc, c)) {
                    other[c >> 6] &= ~(1ull << (c & 63));
                    b.add(r, GSeq{b.range(c, c), GrammarBuilder::ref(node(pre + (char)c, i, j))});
                }
                i = j;
            }
            if (!full) b.add(r, b.lit("\""));
            bool any = false;
            for (auto w : other) any = any || w;
            if (any) b.add(r, GSeq{b.chars(other), GrammarBuilder::ref(r_free)});
            return r;
        };
        return b.lit("\"") + GSeq{GrammarBuilder::ref(node("", 0, ns.size()))};
    }

    GSeq compile_object(const Json& s, const std::string& path) {
        const Json* props = s.get("properties");
        const Json* req = s.get("required");
        const Json* add = s.get("additionalProperties");
        if (props && !props->is_object()) { fail(path, "'properties' must be an object"); return GSeq(); }
        if (req && !req->is_array()) { fail(path, "'required' must be an array"); return GSeq(); }
        std::vector<std::string> names;
        std::vector<GSeq> kvs;
        std::vector<char> required;
        if (props)
            for (auto& kv : props->obj) {
                if (std::find(names.begin(), names.end(), kv.first) != names.end()) { fail(path, "property '" + kv.first + "' is listed twice"); return GSeq(); }
                names.push_back(kv.first);
                std::string key;
                json_escape(&key, kv.first);
                GSeq v = compile(kv.second, path + "/properties/" + kv.first);
                if (!err.empty()) return GSeq();
                kvs.push_back(b.lit(key) + ws() + b.lit(":") + ws() + v + ws());
                required.push_back(0);
            }
        if (req)
            for (const Json& r : req->arr) {
                if (!r.is_string()) { fail(path, "'required' entries must be strings"); return GSeq(); }
                auto it = std::find(names.begin(), names.end(), r.str);
                if (it == names.end()) { fail(path, "required property '" + r.str + "' is not in 'properties' (not supported)"); return GSeq(); }
                required[it - names.begin()] = 1;
            }
        // additional members: additionalProperties true / a schema, or absent without properties
        GSeq addkv;
        bool extra = false;
        if (add && add->is_bool()) extra = add->b;
        else if (add) extra = true;
        else extra = names.empty();
        if (extra) {
            GSeq v = add && !add->is_bool() ? compile(*add, path + "/additionalProperties") : GSeq{GrammarBuilder::ref(r_value)};
            if (!err.empty()) return GSeq();
            addkv = key_except(names) + ws() + b.lit(":") + ws() + v + ws();
        }
        const int n = (int)names.size();
        // S[i]: members i.. with none written yet; K[i]: members i.. after one was written
        std::vector<int> S(n + 1), K(n + 1);
        for (int i = 0; i <= n; i++) { S[i] = b.rule("obj-s"); K[i] = b.rule("obj-k"); }
        if (extra) {
            int r_more = b.rule("obj-more");  // (, member)*
            b.add(r_more, b.lit(",") + ws() + addkv + GSeq{GrammarBuilder::ref(r_more)});
            b.add(r_more, GSeq());
            b.add(S[n], addkv + GSeq{GrammarBuilder::ref(r_more)});
            b.add(S[n], GSeq());
            b.add(K[n], GSeq{GrammarBuilder::ref(r_more)});
        } else {
            b.add(S[n], GSeq());
            b.add(K[n], GSeq());
        }
        for (int i = n - 1; i >= 0; i--) {
            b.add(S[i], kvs[i] + GSeq{GrammarBuilder::ref(K[i + 1])});
            if (!required[i]) b.add(S[i], GSeq{GrammarBuilder::ref(S[i + 1])});
            b.add(K[i], b.lit(",") + ws() + kvs[i] + GSeq{GrammarBuilder::ref(K[i + 1])});
            if (!required[i]) b.add(K[i], GSeq{GrammarBuilder::ref(K[i + 1])});
        }
        return b.lit("{") + ws() + GSeq{GrammarBuilder::ref(S[0])} + b.lit("}");
    }

    GSeq compile_array(const Json& s, const std::string& path) {
        int lo = 0, hi = -1;
        if (!count(s, "minItems", path, &lo) || !count(s, "maxItems", path, &hi)) return GSeq();
        if (!s.get("maxItems")) hi = -1;
        std::vector<GSeq> prefix;
        if (const Json* pi = s.get("prefixItems")) {
            if (!pi->is_array()) { fail(path, "'prefixItems' must be an array"); return GSeq(); }
            for (size_t i = 0; i < pi->arr.size(); i++) {
                prefix.push_back(compile(pi->arr[i], path + "/prefixItems/" + std::to_string(i)));
                if (!err.empty()) return GSeq();
            }
        }
        const Json* it = s.get("items");
        GSeq tail;
        bool has_tail = true;
        if (it && it->is_array()) { fail(path, "'items' as an array is not supported (use 'prefixItems')"); return GSeq(); }
        if (it && it->is_bool() && !it->b) has_tail = false;
        else if (it) { tail = compile(*it, path + "/items"); if (!err.empty()) return GSeq(); }
        else if (!prefix.empty()) has_tail = false;  // only the listed items: a subset every validator accepts
        else tail = GSeq{GrammarBuilder::ref(r_value)};
        const int k = (int)prefix.size();
        if (!has_tail) hi = hi < 0 ? k : std::min(hi, k);
        if (hi >= 0 && lo > hi) { fail(path, "'minItems' is more than the items allowed"); return GSeq(); }
        auto item = [&](int i) { return i < k ? prefix[i] : tail; };
        // A[i]: the rest after i items (i >= 1); past max(k, lo) with no upper bound, one loop
        const int last = std::max(k, lo);
        const int top = hi >= 0 ? hi : last + 1;
        if (top > GRAMMAR_MAX_REPEAT) { fail(path, "too many items"); return GSeq(); }
        std::vector<int> A(top + 1);
        for (int i = 1; i <= top; i++) A[i] = b.rule("arr");
        for (int i = top; i >= 1; i--) {
            if (hi < 0 && i == top) {  // the open loop: (, item)*
                b.add(A[i], b.lit(",") + ws() + tail + ws() + GSeq{GrammarBuilder::ref(A[i])});
                b.add(A[i], GSeq());
                continue;
            }
            if (i < top) b.add(A[i], b.lit(",") + ws() + item(i) + ws() + GSeq{GrammarBuilder::ref(A[i + 1])});
            if (i >= lo) b.add(A[i], GSeq());
        }
        if (top == 0) return b.lit("[") + ws() + b.lit("]");
        GSeq first = item(0) + ws() + GSeq{GrammarBuilder::ref(A[1])};
        return b.lit("[") + ws() + (lo == 0 ? b.alt({first, GSeq()}, "arr0") : first) + b.lit("]");
    }

    // ---- strings: lengths, formats and patterns
    GSeq jchar_set(const CpRanges& r0) {  // json text of one character from the set
        CpRanges r = cp_normalise(r0), raw;
        auto has = [&](uint32_t c) { for (auto& x : r) if (c >= x.first && c <= x.second) return true; return false; };
        // raw: everything but the quote, the backslash and controls
        for (auto& x : r) {
            uint32_t a = std::max<uint32_t>(x.first, 0x20), z = x.second;
            for (uint32_t cut : {0x22u, 0x5Cu})
                if (a <= cut && cut <= z) { if (a < cut) raw.push_back({a, cut - 1}); a = cut + 1; }
            if (a <= z) raw.push_back({a, z});
        }
        std::vector<GSeq> opts;
        if (!cp_normalise(raw).empty()) opts.push_back(gb_cp_set(&b, raw));
        if (has('"')) opts.push_back(b.lit("\\\""));
        if (has('\\')) opts.push_back(b.lit("\\\\"));
        static const char hexd[] = "0123456789abcdef";
        for (uint32_t c = 0; c < 0x20; c++) {
            if (!has(c)) continue;
            const char* sh = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : nullptr;
            if (sh) opts.push_back(b.lit(sh));
            else { std::string u = "\\u00"; u += hexd[c >> 4]; u += hexd[c & 15]; opts.push_back(b.lit(u)); }
        }
        if (opts.empty()) return GSeq();
        return opts.size() == 1 ? opts[0] : b.alt(opts, "jchar");
    }
    GSeq quoted(const GSeq& body) { return b.lit("\"") + body + b.lit("\""); }

    GSeq compile_string(const Json& s, const std::string& path) {
        int lo = 0, hi = -1;
        if (!count(s, "minLength", path, &lo) || !count(s, "maxLength", path, &hi)) return GSeq();
        if (!s.get("maxLength")) hi = -1;
        const Json* pat = s.get("pattern");
        const Json* fmt = s.get("format");
        int parts = (pat ? 1 : 0) + (fmt ? 1 : 0) + (s.get("minLength") || s.get("maxLength") ? 1 : 0);
        if (parts > 1) { fail(path, "'pattern', 'format' and 'minLength' / 'maxLength' do not combine (not supported)"); return GSeq(); }
        if (fmt) {
            if (!fmt->is_string()) { fail(path, "'format' must be a string"); return GSeq(); }
            return compile_format(fmt->str, path);
        }
        if (pat) {
            if (!pat->is_string()) { fail(path, "'pattern' must be a string"); return GSeq(); }
            return compile_pattern(pat->str, path);
        }
        if (hi >= 0 && lo > hi) { fail(path, "'minLength' is more than 'maxLength'"); return GSeq(); }
        if (lo == 0 && hi < 0) return GSeq{GrammarBuilder::ref(r_string)};
        return quoted(b.rep(GSeq{GrammarBuilder::ref(r_char)}, lo, hi));
    }

    GSeq two(int lo, int hi) {  // two digits lo..hi (both < 100)
        std::vector<GSeq> o;
        for (int t = lo / 10; t <= hi / 10; t++) {
            int a = t == lo / 10 ? lo % 10 : 0, z = t == hi / 10 ? hi % 10 : 9;
            o.push_back(GSeq{b.range('0' + t, '0' + t), b.range('0' + a, '0' + z)});
        }
        return o.size() == 1 ? o[0] : b.alt(o, "2d");
    }
    GSeq date() {
        GSeq year = GSeq{b.range('1', '2')} + digits(3, 3);
        // days per month (february to 28: every year then has them)
        GSeq m31 = b.alt({b.lit("01"), b.lit("03"), b.lit("05"), b.lit("07"), b.lit("08"), b.lit("10"), b.lit("12")}, "m31");
        GSeq m30 = b.alt({b.lit("04"), b.lit("06"), b.lit("09"), b.lit("11")}, "m30");
        GSeq md = b.alt({m31 + b.lit("-") + two(1, 31), m30 + b.lit("-") + two(1, 30), b.lit("02-") + two(1, 28)}, "md");
        return year + b.lit("-") + md;
    }
    GSeq time() {
        GSeq t = two(0, 23) + b.lit(":") + two(0, 59) + b.lit(":") + two(0, 59) + b.opt(b.lit(".") + digits(1, 6));
        ByteSet pm = {}; byteset_add(&pm, '+', '+'); byteset_add(&pm, '-', '-');
        return t + b.alt({b.lit("Z"), GSeq{b.chars(pm)} + two(0, 23) + b.lit(":") + two(0, 59)}, "tz");
    }
    GSeq compile_format(const std::string& f, const std::string& path) {
        if (f == "date") return quoted(date());
        if (f == "time") return quoted(time());
        if (f == "date-time") return quoted(date() + b.lit("T") + time());
        if (f == "uuid") {
            ByteSet hx = {}; byteset_add(&hx, '0', '9'); byteset_add(&hx, 'a', 'f');
            GSeq H{b.chars(hx)};
            return quoted(b.rep(H, 8, 8) + b.lit("-") + b.rep(H, 4, 4) + b.lit("-") + b.rep(H, 4, 4) + b.lit("-") + b.rep(H, 4, 4) +
                          b.lit("-") + b.rep(H, 12, 12));
        }
        if (f == "email") {
            ByteSet lc = {}; byteset_add(&lc, 'a', 'z'); byteset_add(&lc, 'A', 'Z'); byteset_add(&lc, '0', '9');
            ByteSet local = lc; for (char c : std::string("._%+-")) byteset_add(&local, c, c);
            ByteSet dom = lc; byteset_add(&dom, '-', '-');
            GSeq label = b.rep(GSeq{b.chars(dom)}, 1, 63);
            return quoted(b.rep(GSeq{b.chars(local)}, 1, 64) + b.lit("@") + label + b.rep(b.lit(".") + label, 1, 4));
        }
        fail(path, "unsupported format '" + f + "' (date-time, date, time, uuid, email are)");
        return GSeq();
    }

    // ---- the pattern subset (the header says which)
    struct Re {
        SchemaCompiler* c; const std::string& s; size_t i = 0; std::string path;
        bool fail(const std::string& w) { return c->fail(path, "pattern: " + w); }
        bool at(char ch) const { return i < s.size() && s[i] == ch; }
        bool cp(uint32_t* v) {  // one utf-8 code point of the pattern text
            unsigned char ch = s[i];
            int n = ch < 0x80 ? 1 : (ch >> 5) == 6 ? 2 : (ch >> 4) == 14 ? 3 : (ch >> 3) == 30 ? 4 : 0;
            if (!n || i + n > s.size() || !utf8_valid(s.data() + i, n)) return fail("invalid utf-8");
            *v = n == 1 ? ch : n == 2 ? ch & 31 : n == 3 ? ch & 15 : ch & 7;
            for (int k = 1; k < n; k++) *v = (*v << 6) | (s[i + k] & 63);
            i += n;
            return true;
        }
        bool hex(int n, uint32_t* v) {
            *v = 0;
            for (int k = 0; k < n; k++) {
                if (i >= s.size()) return fail("a short hex escape");
                char ch = s[i++];
                int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
                if (d < 0) return fail("a bad hex escape");
                *v = *v * 16 + d;
            }
            return true;
        }
        // an escape after the backslash: a set (classes) or one code point
        bool escape(CpRanges* set) {
            if (i >= s.size()) return fail("a dangling backslash");
            char e = s[i++];
            static const CpRanges digit = {{'0', '9'}}, word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}},
                                  space = {{'\t', '\r'}, {' ', ' '}};
            auto ascii_not = [](const CpRanges& r) { CpRanges o = cp_complement(r), a; for (auto& x : o) if (x.first < 0x80) a.push_back({x.first, std::min<uint32_t>(x.second, 0x7F)}); return a; };
            uint32_t v;
            switch (e) {
                case 'd': *set = digit; return true;
                case 'w': *set = word; return true;
                case 's': *set = space; return true;
                case 'D': *set = ascii_not(digit); return true;
                case 'W': *set = ascii_not(word); return true;
                case 'S': *set = ascii_not(space); return true;
                case 'n': *set = {{'\n', '\n'}}; return true;
                case 'r': *set = {{'\r', '\r'}}; return true;
                case 't': *set = {{'\t', '\t'}}; return true;
                case 'f': *set = {{'\f', '\f'}}; return true;
                case 'v': *set = {{'\v', '\v'}}; return true;
                case 'x': if (!hex(2, &v)) return false; *set = {{v, v}}; return true;
                case 'u': if (!hex(4, &v)) return false; *set = {{v, v}}; return true;
                default:
                    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
                        return fail(std::string("the escape \\") + e + " is not supported");
                    *set = {{(uint32_t)(unsigned char)e, (uint32_t)(unsigned char)e}};
                    return true;
            }
        }
        bool cls(CpRanges* set) {  // after '['
            bool neg = at('^');
            if (neg) i++;
            CpRanges r;
            bool first = true;
            while (i < s.size() && (s[i] != ']' || first)) {
                first = false;
                CpRanges one;
                if (s[i] == '\\') { i++; if (!escape(&one)) return false; }
                else if (s[i] == '[' && i + 1 < s.size() && s[i + 1] == ':') return fail("posix classes are not supported");
                else { uint32_t v = 0; if (!cp(&v)) return false; one = {{v, v}}; }
                if (one.size() == 1 && one[0].first == one[0].second && i + 1 < s.size() && s[i] == '-' && s[i + 1] != ']') {
                    i++;
                    CpRanges two;
                    if (s[i] == '\\') { i++; if (!escape(&two)) return false; }
                    else { uint32_t v = 0; if (!cp(&v)) return false; two = {{v, v}}; }
                    if (two.size() != 1 || two[0].first != two[0].second || two[0].first < one[0].first) return fail("a bad class range");
                    r.push_back({one[0].first, two[0].first});
                } else r.insert(r.end(), one.begin(), one.end());
            }
            if (i >= s.size()) return fail("an unterminated class");
            i++;
            if (neg) {  // ascii only, as \D \W \S
                CpRanges o = cp_complement(r), a;
                for (auto& x : o) if (x.first < 0x80) a.push_back({x.first, std::min<uint32_t>(x.second, 0x7F)});
                r = a;
            }
            *set = r;
            return true;
        }
        int depth = 0;
        bool alternation(std::vector<GSeq>* out, bool top) {
            if (++depth > 100) return fail("groups nested deeper than 100");
            if (c->b.overflow) return fail("the pattern is too large");
            for (;;) {
                GSeq seq;
                bool anchored_start = false, anchored_end = false;
                if (top && at('^')) { i++; anchored_start = true; }
                if (!concat(&seq, top, &anchored_end)) return false;
                if (top) {
                    GSeq any = c->b.star(c->jchar_set({{0, 0x10FFFF}}));
                    if (!anchored_start) seq = any + seq;
                    if (!anchored_end) seq = seq + any;
                }
                out->push_back(seq);
                if (at('|')) { i++; continue; }
                depth--;
                return true;
            }
        }
        bool concat(GSeq* seq, bool top, bool* anchored_end) {
            while (i < s.size() && s[i] != '|' && s[i] != ')') {
                char ch = s[i];
                GSeq item;
                if (ch == '$') {
                    i++;
                    if (!top || (i < s.size() && s[i] != '|')) return fail("'$' is supported only at the end");
                    *anchored_end = true;
                    return true;
                }
                if (ch == '^') return fail("'^' is supported only at the start");
                if (ch == '(') {
                    i++;
                    if (at('?')) {
                        if (i + 1 < s.size() && s[i + 1] == ':') i += 2;
                        else return fail("lookaround and named groups are not supported");
                    }
                    std::vector<GSeq> inner;
                    if (!alternation(&inner, false)) return false;
                    if (!at(')')) return fail("a '(' without ')'");
                    i++;
                    item = c->b.alt(inner, "re-group");
                } else if (ch == '[') {
                    i++;
                    CpRanges set;
                    if (!cls(&set)) return false;
                    item = c->jchar_set(set);
                    if (item.empty()) return fail("an empty class");
                } else if (ch == '.') {
                    i++;
                    item = c->jchar_set({{0, 9}, {11, 12}, {14, 0x10FFFF}});
                } else if (ch == '\\') {
                    i++;
                    CpRanges set;
                    if (!escape(&set)) return false;
                    item = c->jchar_set(set);
                } else if (ch == '*' || ch == '+' || ch == '?' || ch == '{') {
                    return fail(std::string("nothing to repeat before '") + ch + "'");
                } else {
                    uint32_t v;
                    if (!cp(&v)) return false;
                    item = c->jchar_set({{v, v}});
                }
                // quantifier
                int lo = 1, hi = 1;
                if (at('*')) { lo = 0; hi = -1; i++; }
                else if (at('+')) { lo = 1; hi = -1; i++; }
                else if (at('?')) { lo = 0; hi = 1; i++; }
                else if (at('{')) {
                    size_t save = i++;
                    auto num = [&](int* v) {
                        if (i >= s.size() || s[i] < '0' || s[i] > '9') return false;
                        long x = 0;
                        while (i < s.size() && s[i] >= '0' && s[i] <= '9') { x = x * 10 + (s[i++] - '0'); if (x > 10000) return false; }
                        *v = (int)x; return true;
                    };
                    if (!num(&lo)) { i = save; return fail("a bad {m,n} repeat (counts up to 10000)"); }
                    hi = lo;
                    if (at(',')) { i++; hi = -1; if (!at('}') && !num(&hi)) return fail("a bad {m,n} repeat"); }
                    if (!at('}')) return fail("a '{' repeat without '}'");
                    i++;
                    if (hi >= 0 && hi < lo) return fail("a repeat {m,n} with n < m");
                }
                if (at('+')) return fail("possessive quantifiers are not supported");
                if (at('?') && !(lo == 1 && hi == 1)) i++;  // lazy: the same strings
                if (!(lo == 1 && hi == 1)) item = c->b.rep(item, lo, hi);
                seq->insert(seq->end(), item.begin(), item.end());
            }
            return true;
        }
    };
    GSeq compile_pattern(const std::string& pat, const std::string& path) {
        Re re{this, pat, 0, path};
        std::vector<GSeq> alts;
        if (!re.alternation(&alts, true)) return GSeq();
        if (re.i < pat.size()) { fail(path, "pattern: unbalanced ')'"); return GSeq(); }
        return quoted(alts.size() == 1 ? alts[0] : b.alt(alts, "re"));
    }

    // ---- numbers: decimal ranges of the integer part, exact
    // decimal strings of equal length from lo to hi (no leading-zero rule: callers handle it)
    GSeq same_len(const std::string& lo, const std::string& hi) {
        if (lo.empty()) return GSeq();
        if (lo == hi) return b.lit(lo);
        if (lo[0] == hi[0]) return b.lit(lo.substr(0, 1)) + same_len(lo.substr(1), hi.substr(1));
        const size_t n = lo.size() - 1;
        std::vector<GSeq> o;
        o.push_back(b.lit(lo.substr(0, 1)) + same_len(lo.substr(1), std::string(n, '9')));
        if (lo[0] + 1 <= hi[0] - 1) o.push_back(GSeq{b.range(lo[0] + 1, hi[0] - 1)} + digits((int)n, (int)n));
        o.push_back(b.lit(hi.substr(0, 1)) + same_len(std::string(n, '0'), hi.substr(1)));
        return b.alt(o, "digits");
    }
    // non-negative integers in [lo, hi] without leading zeros; hi < 0: no upper bound
    GSeq int_range(int64_t lo, int64_t hi) {
        std::vector<GSeq> o;
        std::string L = std::to_string(lo);
        const int maxlen = hi < 0 ? 19 : (int)std::to_string(hi).size();
        for (int len = (int)L.size(); len <= maxlen; len++) {
            int64_t p10 = 1;
            for (int k = 1; k < len; k++) p10 *= 10;
            int64_t a = std::max<int64_t>(lo, len == 1 ? 0 : p10);
            int64_t z = len == 19 ? INT64_MAX : p10 * 10 - 1;
            if (hi >= 0) z = std::min(z, hi);
            if (a > z) continue;
            if (hi < 0 && a == (len == 1 ? 0 : p10) && len > (int)L.size()) {  // every longer number
                o.push_back(GSeq{b.range('1', '9')} + digits(len - 1, -1));
                break;
            }
            o.push_back(same_len(std::to_string(a), std::to_string(z)));
            if (hi < 0 && len == (int)L.size()) {  // then every number with more digits
                o.push_back(GSeq{b.range('1', '9')} + digits(len, -1));
                break;
            }
        }
        if (o.empty()) return GSeq();
        return o.size() == 1 ? o[0] : b.alt(o, "range");
    }
    // the magnitude m >= 0 of a number with lo (<=, or < when lo_x) m (<=, or < when hi_x) hi;
    // hi < 0: no upper bound. integer: no fraction
    GSeq magnitude(int64_t lo, bool lo_x, int64_t hi, bool hi_x, bool integer) {
        std::vector<GSeq> o;
        if (integer) {
            int64_t a = lo + (lo_x ? 1 : 0), z = hi < 0 ? -1 : hi - (hi_x ? 1 : 0);
            if (hi >= 0 && a > z) return GSeq();
            GSeq r = int_range(a, z);
            return r;
        }
        GSeq frac_any = b.opt(b.lit(".") + digits(1, -1));
        GSeq frac_zero = b.opt(b.lit(".") + b.rep(b.lit("0"), 1, -1));
        GSeq frac_nz = b.lit(".") + b.rep(b.lit("0"), 0, -1) + GSeq{b.range('1', '9')} + digits(0, -1);
        if (hi >= 0 && (lo > hi || (lo == hi && (lo_x || hi_x)))) return GSeq();
        if (hi >= 0 && lo == hi) return b.lit(std::to_string(lo)) + frac_zero;
        // integer part strictly between: any fraction
        if (hi < 0 || lo + 1 <= hi - 1) o.push_back(int_range(lo + 1, hi < 0 ? -1 : hi - 1) + frac_any);
        o.push_back(b.lit(std::to_string(lo)) + (lo_x ? frac_nz : frac_any));
        if (hi >= 0 && !hi_x) o.push_back(b.lit(std::to_string(hi)) + frac_zero);
        return b.alt(o, "mag");
    }
    bool bound(const Json& s, const char* key, const std::string& path, bool* has, int64_t* v) {
        const Json* x = s.get(key);
        *has = false;
        if (!x) return true;
        if (x->is_bool()) return fail(path, std::string("boolean '") + key + "' (draft 4) is not supported");
        if (!x->is_number()) return fail(path, std::string("'") + key + "' must be a number");
        if (!x->is_int) {
            if (!(x->num == (double)(int64_t)x->num) || fabs(x->num) > 1e15) return fail(path, std::string("'") + key + "' must be an integer value (fractional bounds are not supported)");
            *v = (int64_t)x->num;
        } else *v = x->i;
        if (*v > 1000000000000000000ll || *v < -1000000000000000000ll) return fail(path, std::string("'") + key + "' beyond 1e18 is not supported");
        *has = true;
        return true;
    }
    GSeq compile_number(const Json& s, const std::string& path, bool integer) {
        bool hmin, hmax, hxmin, hxmax;
        int64_t mn = 0, mx = 0, xmn = 0, xmx = 0;
        if (!bound(s, "minimum", path, &hmin, &mn) || !bound(s, "maximum", path, &hmax, &mx) ||
            !bound(s, "exclusiveMinimum", path, &hxmin, &xmn) || !bound(s, "exclusiveMaximum", path, &hxmax, &xmx)) return GSeq();
        if (!hmin && !hmax && !hxmin && !hxmax) return GSeq{GrammarBuilder::ref(integer ? r_int : r_number)};
        // the tighter of each pair
        bool has_lo = hmin || hxmin, lo_x = false, has_hi = hmax || hxmax, hi_x = false;
        int64_t lo = 0, hi = 0;
        if (hmin) lo = mn;
        if (hxmin && (!hmin || xmn >= mn)) { lo = xmn; lo_x = true; }
        if (hmax) hi = mx;
        if (hxmax && (!hmax || xmx <= mx)) { hi = xmx; hi_x = true; }
        std::vector<GSeq> o;
        // non-negative half: m in [max(lo, 0), hi]
        if (!has_hi || hi > 0 || (hi == 0 && !hi_x)) {
            int64_t a = has_lo && lo >= 0 ? lo : 0;
            bool ax = has_lo && lo >= 0 ? lo_x : false;
            GSeq m = magnitude(a, ax, has_hi ? hi : -1, has_hi ? hi_x : false, integer);
            if (!m.empty()) o.push_back(m);
        }
        // negative half: x = -m, m in (0 or -hi, -lo]
        if (!has_lo || lo < 0) {
            int64_t a = has_hi && hi < 0 ? -hi : 0;
            bool ax = has_hi && hi < 0 ? hi_x : true;  // m > 0 (zero is the other half)
            GSeq m = magnitude(a, ax, has_lo ? -lo : -1, has_lo ? lo_x : false, integer);
            if (!m.empty()) o.push_back(b.lit("-") + m);
        }
        if (o.empty()) { fail(path, "the bounds leave no number"); return GSeq(); }
        return o.size() == 1 ? o[0] : b.alt(o, "bounded");
    }

    bool finish(const GSeq& value, bool lead, Grammar* g, std::string* e) {
        if (!err.empty()) { *e = err; return false; }
        int r = b.rule("root");
        ByteSet w = {}; byteset_add(&w, ' ', ' '); byteset_add(&w, '\n', '\n');
        b.add(r, (lead ? b.rep(GSeq{b.chars(w)}, 0, GRAMMAR_LEAD_WS) : GSeq()) + value);
        if (b.overflow) { *e = "schema: the grammar is too large"; return false; }
        b.g.root = r;
        if (!grammar_check(b.g, e)) return false;
        *g = std::move(b.g);
        return true;
    }
};

// a json schema -> *g (the value, after up to GRAMMAR_LEAD_WS leading spaces or newlines);
// false and a one-line *err naming the keyword and its place
static inline bool schema_compile(const Json& schema, Grammar* g, std::string* err) {
    SchemaCompiler c;
    c.root = &schema;
    c.build_common();
    GSeq v = c.compile(schema, "");
    return c.finish(v, true, g, err);
}

// response_format json_object: any json object
static inline void grammar_json_object(Grammar* g) {
    SchemaCompiler c;
    c.build_common();
    Json s = Json::object();
    s.set("type", Json::string("object"));
    c.root = &s;
    std::string err;
    GSeq v = c.compile(s, "");
    c.finish(v, true, g, &err);
}

// a forced tool call: one call of one of `tools` ({name, parameters}) in the qwen3.5 template's
// xml form, each parameter's value the json text of its schema (tokenizer.h's tool_call_parse
// reads a value that parses as json as that json, so a string comes back a string):
//   <tool_call>\n<function=NAME>\n(<parameter=KEY>\nVALUE\n</parameter>\n)*</function>\n</tool_call>
// parameters follow the schema's property order; required ones always, optional ones may be
// left out; nothing undeclared. false and *err for a schema the compiler refuses.
struct ToolSpec { std::string name; Json parameters; };
static inline bool grammar_tool_call(const std::vector<ToolSpec>& tools, Grammar* g, std::string* err) {
    std::vector<GSeq> calls;
    SchemaCompiler c;
    c.build_common();
    for (size_t t = 0; t < tools.size(); t++) {
        const Json& p = tools[t].parameters;
        c.root = &p;
        c.refs.clear();  // references are local to each tool's schema
        const std::string where = "tools[" + std::to_string(t) + "].parameters";
        if (!p.is_null() && !p.is_object()) { *err = where + ": must be an object schema"; return false; }
        const Json* props = p.is_object() ? p.get("properties") : nullptr;
        const Json* req = p.is_object() ? p.get("required") : nullptr;
        if (p.is_object())
            for (auto& kv : p.obj)
                if (kv.first != "type" && kv.first != "properties" && kv.first != "required" && kv.first != "additionalProperties" &&
                    !SchemaCompiler::is_annotation(kv.first)) { *err = where + ": unsupported keyword '" + kv.first + "' at the top of a tool's parameters"; return false; }
        if (const Json* ty = p.is_object() ? p.get("type") : nullptr; ty && !(ty->is_string() && ty->str == "object")) {
            *err = where + ": the parameters schema must have type object"; return false;
        }
        if (props && !props->is_object()) { *err = where + ": 'properties' must be an object"; return false; }
        std::string name_err;
        if (tools[t].name.empty() || tools[t].name.find_first_of("<>\n") != std::string::npos) { *err = where + ": a tool name without '<', '>' or newlines is needed"; return false; }
        GSeq body = c.b.lit("<tool_call>\n<function=" + tools[t].name + ">\n");
        // the parameters, in order; P[i]: parameters i..
        std::vector<std::string> names;
        std::vector<GSeq> vals;
        std::vector<char> required;
        if (props)
            for (auto& kv : props->obj) {
                if (kv.first.empty() || kv.first.find_first_of("<>\n") != std::string::npos) { *err = where + ": parameter names may not hold '<', '>' or newlines"; return false; }
                names.push_back(kv.first);
                vals.push_back(c.compile(kv.second, "#/properties/" + kv.first));
                if (!c.err.empty()) { *err = where + ": " + c.err; return false; }
                required.push_back(0);
            }
        if (req && req->is_array())
            for (const Json& r : req->arr) {
                auto it = r.is_string() ? std::find(names.begin(), names.end(), r.str) : names.end();
                if (it == names.end()) { *err = where + ": a 'required' entry is not in 'properties'"; return false; }
                required[it - names.begin()] = 1;
            }
        GSeq rest;
        for (int i = (int)names.size() - 1; i >= 0; i--) {
            GSeq one = c.b.lit("<parameter=" + names[i] + ">\n") + vals[i] + c.b.lit("\n</parameter>\n") + rest;
            rest = required[i] ? one : c.b.alt({one, rest}, "param");
        }
        calls.push_back(body + rest + c.b.lit("</function>\n</tool_call>"));
    }
    if (calls.empty()) { *err = "no tools to call"; return false; }
    return c.finish(calls.size() == 1 ? calls[0] : c.b.alt(calls, "calls"), true, g, err);
}

// ----------------------------------------------------------------------------
// matcher: the grammar's state is a set of stacks; a stack is a chain of nodes (position in
// el, parent node), interned, so equal stacks are one id and a state is a sorted id list,
// interned too. a node on top of a state always sits at a GE_CHARS element; NODE_ACCEPT is the
// empty stack (the output may end here). a step over one byte keeps the stacks whose top set
// holds it, each advanced past the element and expanded again down to byte sets (a reference
// that ends its alternative returns straight to the parent: right recursion keeps the stack
// flat). transitions (state, byte) -> state are cached per state, so walking the vocabulary's
// trie costs a table lookup per trie edge once a state has been seen; masks are cached per
// state.

// the vocabulary as a byte trie: node 0 the root, the children of a node consecutive ids
struct GrammarVocab {
    int n = 0;                        // token ids [0, n)
    int words = 0;                    // mask words: ceil(n / 32)
    std::vector<int> stops;           // allowed where the grammar may end
    std::vector<int32_t> first_child, n_child, tok_beg, tok_end;  // [nodes]
    std::vector<uint8_t> byte;        // [nodes] the edge into the node
    std::vector<int32_t> toks;        // the ids ending at each node: toks[tok_beg[n]..tok_end[n])
    std::vector<std::string> bytes;   // [n] each id's bytes ("" = never allowed)
};

// bytes[id]: a token's bytes; empty = never allowed by a grammar (control tokens, padding)
static inline void vocab_build(GrammarVocab* v, const std::vector<std::string>& bytes, const std::vector<int>& stops) {
    *v = GrammarVocab();
    v->n = (int)bytes.size();
    v->words = (v->n + 31) / 32;
    v->stops = stops;
    v->bytes = bytes;
    std::vector<int32_t> ids;
    for (int i = 0; i < v->n; i++) if (!bytes[i].empty()) ids.push_back(i);
    std::sort(ids.begin(), ids.end(), [&](int a, int b) { return bytes[a] < bytes[b] || (bytes[a] == bytes[b] && a < b); });
    // node = (range [lo, hi) of ids sharing a prefix of length d); built breadth-first so each
    // node's children get consecutive ids
    struct Pending { int node, lo, hi, d; };
    std::vector<Pending> q{{0, 0, (int)ids.size(), 0}};
    v->first_child.push_back(0); v->n_child.push_back(0); v->tok_beg.push_back(0); v->tok_end.push_back(0); v->byte.push_back(0);
    for (size_t qi = 0; qi < q.size(); qi++) {
        Pending p = q[qi];
        int i = p.lo;
        v->tok_beg[p.node] = (int)v->toks.size();
        while (i < p.hi && (int)bytes[ids[i]].size() == p.d) v->toks.push_back(ids[i++]);
        v->tok_end[p.node] = (int)v->toks.size();
        v->first_child[p.node] = (int)v->byte.size();
        while (i < p.hi) {
            unsigned char c = bytes[ids[i]][p.d];
            int j = i;
            while (j < p.hi && (unsigned char)bytes[ids[j]][p.d] == c) j++;
            int child = (int)v->byte.size();
            v->first_child.push_back(0); v->n_child.push_back(0); v->tok_beg.push_back(0); v->tok_end.push_back(0); v->byte.push_back(c);
            q.push_back({child, i, j, p.d + 1});
            i = j;
        }
        v->n_child[p.node] = (int)v->byte.size() - v->first_child[p.node];
    }
}

enum { NODE_ACCEPT = 0, GM_MAX_STACKS = 4096, GM_MAX_STATES = 32768, GM_MASK_SLOTS = 256 };

struct GrammarMatcher {
    std::shared_ptr<const Grammar> g;
    const GrammarVocab* v = nullptr;
    // interned stacks: node k = (pos, parent); node 0 is the empty stack
    std::vector<int32_t> node_pos, node_parent;
    std::unordered_map<uint64_t, int32_t> node_ids;
    // interned states: sorted node lists; state 0 is the dead (empty) state
    std::vector<std::vector<int32_t>> states;
    std::unordered_map<std::string, int32_t> state_ids;
    std::vector<int32_t> trans;       // [states * 256] -1: not computed yet
    std::unordered_map<int32_t, int32_t> mask_slot;  // state -> slot in masks
    std::vector<uint32_t> masks;      // [slots * words]
    std::vector<int32_t> slot_state;
    int state = 0;                    // the current state
    std::string err;                  // the first failure (too many stacks or states)
    std::vector<int32_t> scratch;
    std::vector<std::pair<int32_t, int32_t>> walk;  // the trie walk's stack
    long mask_hits = 0, mask_misses = 0;
};

static inline int32_t gm_node(GrammarMatcher* m, int32_t pos, int32_t parent) {
    uint64_t key = (uint64_t)(uint32_t)pos << 32 | (uint32_t)(parent + 1);
    auto it = m->node_ids.find(key);
    if (it != m->node_ids.end()) return it->second;
    int32_t id = (int32_t)m->node_pos.size();
    m->node_pos.push_back(pos); m->node_parent.push_back(parent);
    m->node_ids.emplace(key, id);
    return id;
}
// expand position pos (with return chain `parent`, -1: none) down to byte sets into out
static inline void gm_expand(GrammarMatcher* m, int32_t pos, int32_t parent, std::vector<int32_t>* out, int depth) {
    const Grammar& g = *m->g;
    if (depth > 10000) { if (m->err.empty()) m->err = "grammar expansion too deep"; return; }
    const GElem& e = g.el[pos];
    if (e.kind == GE_END) {
        if (parent < 0) out->push_back(NODE_ACCEPT);
        else gm_expand(m, m->node_pos[parent], m->node_parent[parent], out, depth + 1);
    } else if (e.kind == GE_CHARS) {
        out->push_back(gm_node(m, pos, parent));
    } else {
        int32_t ret = g.el[pos + 1].kind == GE_END ? parent : gm_node(m, pos + 1, parent);
        for (int a : g.alts[e.v]) gm_expand(m, a, ret, out, depth + 1);
    }
}
static inline int32_t gm_intern(GrammarMatcher* m, std::vector<int32_t>* nodes) {
    std::sort(nodes->begin(), nodes->end());
    nodes->erase(std::unique(nodes->begin(), nodes->end()), nodes->end());
    if (nodes->empty()) return 0;
    if (nodes->size() > GM_MAX_STACKS) { if (m->err.empty()) m->err = "the grammar state holds too many stacks (ambiguous grammar)"; return 0; }
    std::string key((const char*)nodes->data(), nodes->size() * 4);
    auto it = m->state_ids.find(key);
    if (it != m->state_ids.end()) return it->second;
    int32_t id = (int32_t)m->states.size();
    m->states.push_back(*nodes);
    m->state_ids.emplace(std::move(key), id);
    m->trans.resize((size_t)m->states.size() * 256, -1);
    return id;
}
// drop the state tables (kept: the nodes and the current state's stacks), when they grow past
// GM_MAX_STATES; the cost is recomputing transitions and masks
static inline void gm_compact(GrammarMatcher* m) {
    std::vector<int32_t> cur = m->states[m->state];
    m->states.assign(1, std::vector<int32_t>());
    m->state_ids.clear();
    m->trans.assign(256, -1);
    m->mask_slot.clear();
    m->slot_state.clear();
    m->state = gm_intern(m, &cur);
}
static inline int32_t gm_step(GrammarMatcher* m, int32_t s, int byte) {
    int32_t& t = m->trans[(size_t)s * 256 + byte];
    if (t >= 0) return t;
    std::vector<int32_t> out;
    const Grammar& g = *m->g;
    for (int32_t n : m->states[s]) {
        if (n == NODE_ACCEPT) continue;
        int32_t pos = m->node_pos[n];
        if (byteset_has(g.sets[g.el[pos].v], byte)) gm_expand(m, pos + 1, m->node_parent[n], &out, 0);
    }
    int32_t r = gm_intern(m, &out);
    m->trans[(size_t)s * 256 + byte] = r;  // trans may have grown: index again
    return r;
}

// a matcher at the start of grammar g over vocabulary v
static inline bool matcher_init(GrammarMatcher* m, std::shared_ptr<const Grammar> g, const GrammarVocab* v, std::string* err) {
    *m = GrammarMatcher();
    m->g = std::move(g);
    m->v = v;
    m->node_pos.push_back(-1); m->node_parent.push_back(-1);  // NODE_ACCEPT
    m->states.emplace_back();
    m->trans.assign(256, -1);
    std::vector<int32_t> start;
    for (int a : m->g->alts[m->g->root]) gm_expand(m, a, -1, &start, 0);
    m->state = gm_intern(m, &start);
    if (!m->err.empty() || !m->state) { *err = m->err.empty() ? "the grammar matches nothing" : m->err; return false; }
    return true;
}
static inline bool matcher_accepting(const GrammarMatcher* m) {
    const auto& s = m->states[m->state];
    return !s.empty() && s[0] == NODE_ACCEPT;
}
// the output is complete and nothing may follow
static inline bool matcher_done(const GrammarMatcher* m) {
    const auto& s = m->states[m->state];
    return s.size() == 1 && s[0] == NODE_ACCEPT;
}
// feed bytes; false (state unchanged) if they leave the grammar
static inline bool matcher_accept_bytes(GrammarMatcher* m, const std::string& bytes) {
    int32_t s = m->state;
    for (unsigned char c : bytes) { s = gm_step(m, s, c); if (!s) return false; }
    m->state = s;
    return true;
}

// the allowed tokens of the current state: bit id of the returned [v->words] words. the
// stop ids are allowed where the grammar may end. cached per state.
static inline const uint32_t* matcher_mask(GrammarMatcher* m) {
    if (m->states.size() > GM_MAX_STATES) gm_compact(m);
    const GrammarVocab& v = *m->v;
    auto it = m->mask_slot.find(m->state);
    if (it != m->mask_slot.end()) { m->mask_hits++; return m->masks.data() + (size_t)it->second * v.words; }
    m->mask_misses++;
    int slot;
    if ((int)m->slot_state.size() < GM_MASK_SLOTS) {
        slot = (int)m->slot_state.size();
        m->slot_state.push_back(m->state);
        m->masks.resize((size_t)(slot + 1) * v.words);
    } else {  // full: reuse a slot chosen by the state id (cheap, no bookkeeping)
        slot = m->state % GM_MASK_SLOTS;
        m->mask_slot.erase(m->slot_state[slot]);
        m->slot_state[slot] = m->state;
    }
    m->mask_slot[m->state] = slot;
    uint32_t* mask = m->masks.data() + (size_t)slot * v.words;
    memset(mask, 0, (size_t)v.words * 4);
    auto& w = m->walk;
    w.clear();
    w.push_back({0, m->state});
    while (!w.empty()) {
        auto [node, s] = w.back();
        w.pop_back();
        const int32_t c0 = v.first_child[node], c1 = c0 + v.n_child[node];
        for (int32_t c = c0; c < c1; c++) {
            int32_t ns = m->trans[(size_t)s * 256 + v.byte[c]];
            if (ns < 0) ns = gm_step(m, s, v.byte[c]);
            if (!ns) continue;
            for (int32_t k = v.tok_beg[c]; k < v.tok_end[c]; k++) mask[v.toks[k] >> 5] |= 1u << (v.toks[k] & 31);
            if (v.n_child[c]) w.push_back({c, ns});
        }
    }
    if (matcher_accepting(m))
        for (int id : v.stops) if (id >= 0 && id < v.n) mask[id >> 5] |= 1u << (id & 31);
    return mask;
}
static inline bool mask_has(const uint32_t* mask, int id) { return (mask[id >> 5] >> (id & 31)) & 1; }

// take token id: false if the grammar does not allow it (state unchanged). a stop id is
// taken only where the grammar may end.
static inline bool matcher_accept(GrammarMatcher* m, int id) {
    for (int s : m->v->stops) if (s == id) return matcher_accepting(m);
    if (id < 0 || id >= m->v->n || m->v->bytes[id].empty()) return false;
    return matcher_accept_bytes(m, m->v->bytes[id]);
}
