// grammar.h: the json schema compiler, the gbnf parser and the matcher, against independent
// oracles: integer / number bounds against the arithmetic predicate over every value of a
// window, patterns against std::regex (ecmascript search) on the decoded strings, token
// masks against feeding each token's bytes one by one, the tool-call grammar against
// tokenizer.h's parser, utf-8 ranges against the encoder. the jsonschema package checks
// the compiler's outputs over the schema corpus (test/test_structured.py).
#include <gtest/gtest.h>
#include <regex>
#include <random>
#include "grammar.h"
#include "tokenizer.h"

static std::shared_ptr<Grammar> compile(const std::string& schema, std::string* err = nullptr) {
    Json j;
    std::string e;
    EXPECT_TRUE(json_parse(schema, &j, &e)) << schema;
    auto g = std::make_shared<Grammar>();
    bool ok = schema_compile(j, g.get(), &e);
    if (err) *err = e;
    if (!ok) return nullptr;
    return g;
}

// a byte vocabulary: every single byte is a token (id = byte)
static const GrammarVocab& byte_vocab() {
    static GrammarVocab v = [] {
        GrammarVocab x;
        std::vector<std::string> b;
        for (int c = 0; c < 256; c++) b.push_back(std::string(1, (char)c));
        vocab_build(&x, b, {});
        return x;
    }();
    return v;
}

// the whole text is in the language
static bool accepts(const std::shared_ptr<Grammar>& g, const std::string& text) {
    GrammarMatcher m;
    std::string err;
    EXPECT_TRUE(matcher_init(&m, g, &byte_vocab(), &err)) << err;
    return matcher_accept_bytes(&m, text) && matcher_accepting(&m);
}

TEST(SchemaCompile, IntegerBoundsExhaustive) {
    struct B { const char* kw; };
    const char* cases[] = {
        R"({"type":"integer","minimum":0})", R"({"type":"integer","minimum":-17,"maximum":123})",
        R"({"type":"integer","exclusiveMinimum":-1,"exclusiveMaximum":100})", R"({"type":"integer","maximum":-5})",
        R"({"type":"integer","minimum":7,"maximum":7})", R"({"type":"integer","minimum":99,"maximum":1000})",
        R"({"type":"integer","minimum":-250})", R"({"type":"integer","exclusiveMaximum":0})", R"({"type":"integer","minimum":10})"};
    for (const char* c : cases) {
        Json j; std::string e;
        ASSERT_TRUE(json_parse(c, strlen(c), &j, &e));
        auto g = compile(c);
        ASSERT_TRUE(g) << c;
        auto num = [&](const char* k, int64_t dflt) { const Json* x = j.get(k); return x ? x->i : dflt; };
        int64_t lo = std::max(num("minimum", INT64_MIN), j.get("exclusiveMinimum") ? num("exclusiveMinimum", 0) + 1 : INT64_MIN);
        int64_t hi = std::min(num("maximum", INT64_MAX), j.get("exclusiveMaximum") ? num("exclusiveMaximum", 0) - 1 : INT64_MAX);
        for (int64_t v = -1100; v <= 1100; v++)
            EXPECT_EQ(accepts(g, std::to_string(v)), v >= lo && v <= hi) << c << " value " << v;
        EXPECT_FALSE(accepts(g, "007")) << c;  // never leading zeros
        EXPECT_FALSE(accepts(g, "1.5")) << c;
    }
}

TEST(SchemaCompile, NumberBoundsAgainstArithmetic) {
    const char* cases[] = {R"({"type":"number","minimum":0,"maximum":10})", R"({"type":"number","exclusiveMinimum":2,"maximum":5})",
                           R"({"type":"number","minimum":-3,"exclusiveMaximum":3})", R"({"type":"number","exclusiveMinimum":-1})",
                           R"({"type":"number","maximum":-2})"};
    std::vector<std::string> texts;
    for (int i = -60; i <= 120; i++) {
        texts.push_back(std::to_string(i / 10) + (i < 0 && i > -10 ? "" : ""));
        char b[32];
        snprintf(b, sizeof b, "%.1f", i / 10.0); texts.push_back(b);
        snprintf(b, sizeof b, "%.2f", i / 10.0 + 0.05); texts.push_back(b);
        snprintf(b, sizeof b, "%.3f", i / 10.0); texts.push_back(b);
    }
    texts.push_back("-0"); texts.push_back("-0.0"); texts.push_back("5.000"); texts.push_back("2.0000001");
    for (const char* c : cases) {
        Json j; std::string e;
        ASSERT_TRUE(json_parse(c, strlen(c), &j, &e));
        auto g = compile(c);
        ASSERT_TRUE(g) << c;
        for (const std::string& t : texts) {
            Json v;
            if (!json_parse(t, &v, &e)) continue;
            double x = v.num;
            if (t[0] == '-' && x == 0) { EXPECT_FALSE(accepts(g, t)) << t; continue; }  // negative zero is never generated (a subset)
            bool ok = true;
            if (const Json* b = j.get("minimum")) ok = ok && x >= b->num;
            if (const Json* b = j.get("maximum")) ok = ok && x <= b->num;
            if (const Json* b = j.get("exclusiveMinimum")) ok = ok && x > b->num;
            if (const Json* b = j.get("exclusiveMaximum")) ok = ok && x < b->num;
            EXPECT_EQ(accepts(g, t), ok) << c << " text " << t;
        }
    }
}

TEST(SchemaCompile, ObjectOrderAndRequired) {
    auto g = compile(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},
                         "required":["a","c"],"additionalProperties":false})");
    ASSERT_TRUE(g);
    EXPECT_TRUE(accepts(g, R"({"a":1,"c":true})"));
    EXPECT_TRUE(accepts(g, R"({"a":1,"b":"x","c":false})"));
    EXPECT_TRUE(accepts(g, "{\n  \"a\": 1,\n  \"b\": \"x\",\n  \"c\": false\n}"));
    EXPECT_FALSE(accepts(g, R"({"c":true,"a":1})"));     // schema order
    EXPECT_FALSE(accepts(g, R"({"a":1})"));              // c is required
    EXPECT_FALSE(accepts(g, R"({"a":1,"c":true,"d":1})"));  // nothing undeclared
    EXPECT_FALSE(accepts(g, R"({"a":1,,"c":true})"));
    EXPECT_FALSE(accepts(g, R"({"a":1,"c":true,})"));
    // all optional: the empty object and any ordered subset
    auto o = compile(R"({"type":"object","properties":{"x":{"type":"null"},"y":{"type":"null"}}})");
    ASSERT_TRUE(o);
    for (const char* t : {"{}", R"({"x":null})", R"({"y":null})", R"({"x":null,"y":null})"}) EXPECT_TRUE(accepts(o, t)) << t;
    EXPECT_FALSE(accepts(o, R"({"y":null,"x":null})"));
    EXPECT_FALSE(accepts(o, R"({,"y":null})"));
}

TEST(SchemaCompile, AdditionalPropertiesSkipNamedKeys) {
    auto g = compile(R"({"type":"object","properties":{"id":{"type":"integer"}},"additionalProperties":{"type":"string"}})");
    ASSERT_TRUE(g);
    EXPECT_TRUE(accepts(g, R"({"id":1,"name":"x","i":"y","idx":"z"})"));
    EXPECT_TRUE(accepts(g, R"({"name":"x"})"));
    EXPECT_FALSE(accepts(g, R"({"id":1,"id":"x"})"));  // a named key never takes the additional schema
    EXPECT_FALSE(accepts(g, R"({"name":1})"));
    auto any = compile(R"({"type":"object"})");
    EXPECT_TRUE(accepts(any, R"({"k":[1,{"z":null}],"v":"s"})"));
}

TEST(SchemaCompile, ArraysPrefixAndCounts) {
    auto g = compile(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})");
    ASSERT_TRUE(g);
    EXPECT_FALSE(accepts(g, "[]")); EXPECT_FALSE(accepts(g, "[1]"));
    EXPECT_TRUE(accepts(g, "[1,2]")); EXPECT_TRUE(accepts(g, "[1, 2, 3]")); EXPECT_FALSE(accepts(g, "[1,2,3,4]"));
    auto p = compile(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"boolean"}],"items":{"type":"null"}})");
    ASSERT_TRUE(p);
    for (const char* t : {"[]", R"(["a"])", R"(["a",true])", R"(["a",true,null,null])"}) EXPECT_TRUE(accepts(p, t)) << t;
    EXPECT_FALSE(accepts(p, "[true]")); EXPECT_FALSE(accepts(p, R"(["a",true,1])"));
    auto closed = compile(R"({"prefixItems":[{"type":"integer"}],"items":false,"minItems":1})");
    ASSERT_TRUE(closed);
    EXPECT_TRUE(accepts(closed, "[5]")); EXPECT_FALSE(accepts(closed, "[5,6]")); EXPECT_FALSE(accepts(closed, "[]"));
}

TEST(SchemaCompile, RecursionAndRefs) {
    auto g = compile(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
        "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"})");
    ASSERT_TRUE(g);
    EXPECT_TRUE(accepts(g, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
    EXPECT_FALSE(accepts(g, R"({"v":1,"kids":[{"w":2}]})"));
    auto root = compile(R"({"type":["array","integer"],"items":{"$ref":"#"}})");
    ASSERT_TRUE(root);
    EXPECT_TRUE(accepts(root, "[1,[2,[3,[]]]]")); EXPECT_FALSE(accepts(root, "[1,\"x\"]"));
}

TEST(SchemaCompile, StringsLengthsEnumsFormats) {
    auto g = compile(R"({"type":"string","minLength":2,"maxLength":3})");
    EXPECT_FALSE(accepts(g, "\"a\"")); EXPECT_TRUE(accepts(g, "\"ab\"")); EXPECT_TRUE(accepts(g, "\"a\\u00e9\\n\""));
    EXPECT_TRUE(accepts(g, "\"\xc3\xa9\xe2\x82\xac\"")); EXPECT_FALSE(accepts(g, "\"abcd\""));
    EXPECT_FALSE(accepts(g, "\"\\ud800x\""));  // no lone surrogates
    auto e = compile(R"({"enum":["red","green",1,null,{"a":[1]}]})");
    for (const char* t : {"\"red\"", "\"green\"", "1", "null", R"({"a":[1]})"}) EXPECT_TRUE(accepts(e, t)) << t;
    EXPECT_FALSE(accepts(e, "\"blue\""));
    auto te = compile(R"({"type":"string","enum":["a",1]})");  // the type filters the values
    EXPECT_TRUE(accepts(te, "\"a\"")); EXPECT_FALSE(accepts(te, "1"));
    auto d = compile(R"({"type":"string","format":"date"})");
    EXPECT_TRUE(accepts(d, "\"2024-02-28\"")); EXPECT_FALSE(accepts(d, "\"2024-02-30\"")); EXPECT_FALSE(accepts(d, "\"2024-13-01\""));
    auto dt = compile(R"({"type":"string","format":"date-time"})");
    EXPECT_TRUE(accepts(dt, "\"2024-05-06T07:08:09.123Z\"")); EXPECT_TRUE(accepts(dt, "\"1999-12-31T23:59:59+05:30\""));
    EXPECT_FALSE(accepts(dt, "\"1999-12-31T24:00:00Z\""));
    auto u = compile(R"({"type":"string","format":"uuid"})");
    EXPECT_TRUE(accepts(u, "\"123e4567-e89b-12d3-a456-426614174000\"")); EXPECT_FALSE(accepts(u, "\"123e4567e89b12d3a456426614174000\""));
}

// patterns: the grammar's strings, decoded, against std::regex_search (ecmascript), for
// candidates from the pattern's own alphabet
TEST(SchemaCompile, PatternsAgainstStdRegex) {
    const char* pats[] = {"^[a-z]+$", "^\\d{3}-\\d{4}$", "ab", "^(foo|bar)+baz?$", "^[A-Z][a-z]*( [A-Z][a-z]*)*$", "^x{2,3}$",
                          "^[^0-9]+$", "^(?:\\+|-)?\\d+(\\.\\d{1,2})?$", "c$", "^\\w+@\\w+\\.com$", "^[a\\-z]$", "^.$"};
    std::mt19937 rng(7);
    const std::string alpha = "abcfoxrzAZ09-+.@ _m\n";
    for (const char* p : pats) {
        std::string schema = "{\"type\":\"string\",\"pattern\":";
        json_escape(&schema, p);
        schema += "}";
        std::string err;
        auto g = compile(schema, &err);
        ASSERT_TRUE(g) << p << ": " << err;
        std::regex re(p, std::regex::ECMAScript);
        std::vector<std::string> cands = {"", "abc", "123-4567", "foobarbaz", "fooba", "Hello World", "xx", "xxx", "xxxx", "-12.5", "+3",
                                          "1.234", "abc", "ac", "me@site.com", "a", "-", "z", "b", "\n", "q"};
        for (int k = 0; k < 400; k++) {
            std::string s;
            int n = rng() % 8;
            for (int i = 0; i < n; i++) s += alpha[rng() % alpha.size()];
            cands.push_back(s);
        }
        for (const std::string& s : cands) {
            std::string q = "\"";
            json_escape(&q, s);
            q += "\"";
            // json_escape writes the quotes itself
            EXPECT_EQ(accepts(g, q.substr(1, q.size() - 2)), std::regex_search(s, re)) << "pattern " << p << " string '" << s << "'";
        }
    }
}

TEST(SchemaCompile, RefusesUnsupportedByName) {
    struct C { const char* schema; const char* names; };
    C cases[] = {{R"J({"type":"object","minProperties":1})J", "minProperties"},
                 {R"J({"type":"array","uniqueItems":true})J", "uniqueItems"},
                 {R"J({"type":"number","multipleOf":3})J", "multipleOf"},
                 {R"J({"type":"string","format":"ipv4"})J", "ipv4"},
                 {R"J({"type":"object","properties":{"a":{"type":"string","pattern":"(?=x)"}}})J", "lookaround"},
                 {R"J({"type":"string","pattern":"(a)\\1"})J", "\\1"},
                 {R"J({"allOf":[{"type":"string"},{"maxLength":3}]})J", "allOf"},
                 {R"J({"$ref":"http://example.com/s.json"})J", "$ref"},
                 {R"J({"type":"object","patternProperties":{"^x":{}}})J", "patternProperties"},
                 {R"J({"type":"integer","minimum":0.5})J", "minimum"},
                 {R"J({"type":"object","properties":{"a":{"not":{}}}})J", "'not'"},
                 {R"J(false)J", "matches nothing"}};
    for (const C& c : cases) {
        std::string err;
        EXPECT_FALSE(compile(c.schema, &err)) << c.schema;
        EXPECT_NE(err.find(c.names), std::string::npos) << c.schema << " -> " << err;
    }
    std::string err;
    compile(R"({"type":"object","properties":{"a":{"not":{}}}})", &err);
    EXPECT_NE(err.find("/properties/a"), std::string::npos) << err;  // and where it is
}

TEST(Gbnf, ParsesAndRefuses) {
    Grammar g;
    std::string err;
    const char* text = "# a tiny language\nroot ::= greeting (\" \" name)? \"!\"\ngreeting ::= \"hi\" | \"hello\"\n"
                       "name ::= [A-Z] [a-z]{1,5}\n  | \"\\u00e9t\\u00e9\"\n";
    ASSERT_TRUE(grammar_parse_gbnf(text, &g, &err)) << err;
    auto gp = std::make_shared<Grammar>(g);
    for (const char* t : {"hi!", "hello Bob!", "hi \xc3\xa9t\xc3\xa9!"}) EXPECT_TRUE(accepts(gp, t)) << t;
    for (const char* t : {"hi", "hey!", "hello B!", "hello Bobbbbbb!"}) EXPECT_FALSE(accepts(gp, t)) << t;
    EXPECT_FALSE(grammar_parse_gbnf("root ::= a\n", &g, &err)); EXPECT_NE(err.find("'a'"), std::string::npos) << err;
    EXPECT_FALSE(grammar_parse_gbnf("root ::= root \"x\" | \"y\"\n", &g, &err)); EXPECT_NE(err.find("left-recursive"), std::string::npos) << err;
    EXPECT_FALSE(grammar_parse_gbnf("start ::= \"x\"\n", &g, &err)); EXPECT_NE(err.find("root"), std::string::npos) << err;
    EXPECT_FALSE(grammar_parse_gbnf("root ::= \"x\n", &g, &err)); EXPECT_NE(err.find("line 1"), std::string::npos) << err;
    EXPECT_FALSE(grammar_parse_gbnf("root ::= [b-a]\n", &g, &err));
    EXPECT_FALSE(grammar_parse_gbnf("root ::= \"x\"{3,2}\n", &g, &err));
    // any code point, and a negated class over utf-8
    ASSERT_TRUE(grammar_parse_gbnf("root ::= [^a] .\n", &g, &err)) << err;
    auto n = std::make_shared<Grammar>(g);
    EXPECT_TRUE(accepts(n, "\xe2\x82\xac" "a")); EXPECT_FALSE(accepts(n, "ab")); EXPECT_FALSE(accepts(n, "\xed\xa0\x80" "a"));
}

TEST(Utf8, CodePointSetsAreExact) {
    std::mt19937 rng(3);
    for (int trial = 0; trial < 40; trial++) {
        uint32_t a = rng() % 0x110000, b = rng() % 0x110000;
        if (trial % 4 == 0) { a = rng() % 0x900; b = a + rng() % 0x300; }
        if (a > b) std::swap(a, b);
        GrammarBuilder bl;
        int r = bl.rule("root");
        bl.add(r, gb_cp_set(&bl, {{a, b}}));
        bl.g.root = r;
        auto g = std::make_shared<Grammar>(std::move(bl.g));
        for (int k = 0; k < 300; k++) {
            uint32_t c = k < 100 ? a + rng() % (b - a + 1) : k < 110 ? (k & 1 ? a : b) : rng() % 0x110000;
            if (c >= 0xD800 && c <= 0xDFFF) continue;
            uint8_t by[4];
            int n = gb_utf8(c, by);
            EXPECT_EQ(accepts(g, std::string((char*)by, n)), c >= a && c <= b) << std::hex << a << ".." << b << " cp " << c;
        }
    }
}

// the mask of every state along a document equals feeding each token's bytes one by one, for
// a vocabulary whose tokens span several grammar symbols
TEST(Matcher, MaskEqualsBruteForce) {
    std::vector<std::string> vocab = {"{", "}", "\"", ":", ",", " ", "\n", "{\"", "\":", "\": ", "\",", "\"}", "},", "}}", "[", "]", "[{",
                                      "name", "na", "me", "age", "1", "12", "0", "-", "true", "false", "null", "tr", "ue", "\"name\":",
                                      "a", "b", "ab", "\\", "\\n", "\xc3", "\xa9", "\xc3\xa9", "x", "  ", "\n  ", ".", "5", "e", "E",
                                      "<|im_end|>"};
    for (int c = 0x20; c < 0x7F; c++) vocab.insert(vocab.end() - 1, std::string(1, (char)c));  // complete, as byte-level bpe is
    std::vector<std::string> bytes = vocab;
    bytes.back() = "";  // a control token: only as a stop id
    GrammarVocab v;
    vocab_build(&v, bytes, {(int)vocab.size() - 1});
    auto g = compile(R"({"type":"object","properties":{"name":{"type":"string","maxLength":4},"age":{"type":"integer","minimum":0},
                         "tags":{"type":"array","items":{"type":"boolean"}}},"required":["name"],"additionalProperties":false})");
    ASSERT_TRUE(g);
    std::mt19937 rng(11);
    for (int run = 0; run < 30; run++) {
        GrammarMatcher m;
        std::string err;
        ASSERT_TRUE(matcher_init(&m, g, &v, &err));
        for (int step = 0; step < 40; step++) {
            const uint32_t* mask = matcher_mask(&m);
            std::vector<int> allowed;
            for (int id = 0; id < v.n; id++) {
                bool brute;
                if (id == v.n - 1) brute = matcher_accepting(&m);
                else { GrammarMatcher c = m; brute = matcher_accept_bytes(&c, bytes[id]); }
                EXPECT_EQ(mask_has(mask, id), brute) << "run " << run << " step " << step << " token '" << vocab[id] << "'";
                if (brute) allowed.push_back(id);
            }
            ASSERT_FALSE(allowed.empty());
            int id = allowed[rng() % allowed.size()];
            if (id == v.n - 1) { EXPECT_TRUE(matcher_accept(&m, id)); break; }
            ASSERT_TRUE(matcher_accept(&m, id));
            if (matcher_done(&m)) break;
        }
    }
    // the mask cache: a state seen before costs a lookup
    GrammarMatcher m;
    std::string err;
    ASSERT_TRUE(matcher_init(&m, g, &v, &err));
    matcher_mask(&m); matcher_mask(&m);
    EXPECT_EQ(m.mask_misses, 1); EXPECT_EQ(m.mask_hits, 1);
}

// the forced tool call: the grammar's call parses (tokenizer.h) into arguments of the schema
TEST(ToolCall, GrammarMatchesTemplateParser) {
    Json params;
    std::string e;
    ASSERT_TRUE(json_parse(R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer","minimum":1,"maximum":7},
                               "units":{"enum":["c","f"]}},"required":["city","days"]})", &params, &e));
    Grammar g0;
    ASSERT_TRUE(grammar_tool_call({{"get_weather", params}, {"noop", Json()}}, &g0, &e)) << e;
    auto g = std::make_shared<Grammar>(g0);
    const std::string call = "<tool_call>\n<function=get_weather>\n<parameter=city>\n\"Paris\"\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
                             "</function>\n</tool_call>";
    EXPECT_TRUE(accepts(g, call));
    EXPECT_TRUE(accepts(g, "\n\n<tool_call>\n<function=noop>\n</function>\n</tool_call>"));
    EXPECT_FALSE(accepts(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\n\"Paris\"\n</parameter>\n</function>\n</tool_call>"));
    EXPECT_FALSE(accepts(g, "<tool_call>\n<function=other>\n</function>\n</tool_call>"));
    std::string name, args;
    ASSERT_TRUE(tool_call_parse(call, &name, &args));
    EXPECT_EQ(name, "get_weather");
    EXPECT_EQ(args, R"({"city":"Paris","days":3})");
    Json bad;
    ASSERT_TRUE(json_parse(R"({"type":"object","properties":{"a":{"type":"string","format":"hostname"}}})", &bad, &e));
    EXPECT_FALSE(grammar_tool_call({{"t", bad}}, &g0, &e));
    EXPECT_NE(e.find("hostname"), std::string::npos) << e;
}

// hostile input never crashes and never runs away: random grammars, patterns and schemas are
// compiled or refused with a message; huge repeats and deep nesting are refused by size
TEST(Hostile, RandomInputsCompileOrFailCleanly) {
    std::mt19937 rng(5);
    const std::string gb = "root ::= \"ab\\|[^]-.()*+?{},0123 9#\n\tx_";
    const std::string re = "ab\\dwsDWS.[]^-$()|*+?{},019:=!<>u\"\xc3\xa9";
    int ok = 0, refused = 0;
    for (int k = 0; k < 3000; k++) {
        std::string t = k % 2 ? "root ::= " : "";
        int n = 1 + rng() % 40;
        for (int i = 0; i < n; i++) t += gb[rng() % gb.size()];
        Grammar g;
        std::string err;
        if (grammar_parse_gbnf(t, &g, &err)) {
            ok++;
            auto gp = std::make_shared<Grammar>(std::move(g));
            GrammarMatcher m;
            if (matcher_init(&m, gp, &byte_vocab(), &err)) { matcher_accept_bytes(&m, "ab"); matcher_mask(&m); }
        } else { refused++; EXPECT_FALSE(err.empty()); }
        std::string p;
        for (int i = 0; i < n; i++) p += re[rng() % re.size()];
        Json s = Json::object();
        s.set("type", Json::string("string"));
        s.set("pattern", Json::string(p));
        auto sg = std::make_shared<Grammar>();
        if (schema_compile(s, sg.get(), &err)) { GrammarMatcher m; if (matcher_init(&m, sg, &byte_vocab(), &err)) matcher_mask(&m); }
        else EXPECT_NE(err.find("pattern"), std::string::npos) << p << ": " << err;
    }
    EXPECT_GT(ok, 10); EXPECT_GT(refused, 100);
    std::string err;
    Grammar g;
    // a repeat of a group repeats a reference: 10^10 bytes of language in 2 x 10^5 elements
    ASSERT_TRUE(grammar_parse_gbnf("root ::= (\"a\"{100000}){100000}\n", &g, &err)) << err;
    EXPECT_LT(g.el.size(), 300000u);
    EXPECT_FALSE(grammar_parse_gbnf("root ::= " + std::string(500, '(') + "\"a\"" + std::string(500, ')') + "\n", &g, &err));
    // past GRAMMAR_MAX_ELEMS: refused by size, before the memory is taken
    EXPECT_FALSE(grammar_parse_gbnf("root ::= x{100000}\nx ::= " + std::string("\"") + std::string(60, 'a') + "\"{0,100000}\n", &g, &err));
    EXPECT_NE(err.find("too large"), std::string::npos) << err;
    EXPECT_FALSE(compile(R"({"type":"array","items":{"type":"string","maxLength":100000},"minItems":100000})", &err));
    std::string deep = "{\"type\":\"array\",\"items\":";
    std::string nested;
    for (int i = 0; i < 70; i++) nested += deep;
    nested += "{}";
    for (int i = 0; i < 70; i++) nested += "}";
    Json j;
    ASSERT_TRUE(json_parse(nested, &j, &err, 256));
    auto gg = std::make_shared<Grammar>();
    EXPECT_FALSE(schema_compile(j, gg.get(), &err)); EXPECT_NE(err.find("deeper than 64"), std::string::npos) << err;
}
