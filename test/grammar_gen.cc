// grammar_gen: the compiler's side of test/test_structured.py, and the mask-cost bench.
//
//   grammar_gen gen CORPUS.json N SEED
//       for each {"name", "schema"} of the corpus, one json line: {"name", "error"} when the
//       compiler refuses it, else {"name", "samples": [N texts]}: random walks through the
//       grammar (uniform over the allowed bytes, stopping where it may with a chance that
//       grows with the length; past 400 bytes the shortest completion), which the jsonschema
//       package then validates
//   grammar_gen bench TOKENIZER.json ROWS SCHEMA.json DOC.json [REPEAT]
//       the constraint's cost per token over the tokenizer's vocabulary padded to ROWS ids
//       (the real 248,320-row shape): DOC (a document of the schema) tokenized, each token's
//       mask computed (cold: every state new; warm: the same document again, masks cached)
//       and the token taken. prints one json line of timings.
#include <stdio.h>
#include <random>
#include <chrono>
#include <deque>
#include <map>
#include "grammar.h"
#include "tokenizer.h"

static std::string slurp(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "grammar_gen: cannot open %s\n", path); exit(1); }
    std::string s;
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    fclose(f);
    return s;
}

// the shortest byte string from the matcher's state to an accepting one (breadth-first)
static bool complete(GrammarMatcher* m, std::string* out) {
    std::map<int32_t, std::pair<int32_t, int>> from;  // state -> (previous, byte)
    std::deque<int32_t> q{m->state};
    from[m->state] = {-1, -1};
    while (!q.empty() && from.size() < 200000) {
        int32_t s = q.front();
        q.pop_front();
        const auto& nodes = m->states[s];
        if (!nodes.empty() && nodes[0] == NODE_ACCEPT) {
            std::string path;
            for (int32_t x = s; from[x].first >= 0; x = from[x].first) path += (char)from[x].second;
            std::reverse(path.begin(), path.end());
            *out = path;
            return true;
        }
        for (int b = 0; b < 256; b++) {
            int32_t t = gm_step(m, s, b);
            if (t && !from.count(t)) { from[t] = {s, b}; q.push_back(t); }
        }
    }
    return false;
}

static int gen(const char* corpus, int n, unsigned seed) {
    Json c;
    std::string err;
    if (!json_parse(slurp(corpus), &c, &err, 256) || !c.is_array()) { fprintf(stderr, "grammar_gen: %s: %s\n", corpus, err.c_str()); return 1; }
    GrammarVocab v;  // one token per byte: the walk chooses bytes
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; b++) bytes.push_back(std::string(1, (char)b));
    vocab_build(&v, bytes, {});
    std::mt19937 rng(seed);
    for (const Json& e : c.arr) {
        Json line = Json::object();
        line.set("name", *e.get("name"));
        auto g = std::make_shared<Grammar>();
        if (!schema_compile(*e.get("schema"), g.get(), &err)) {
            line.set("error", Json::string(err));
        } else {
            Json samples = Json::array();
            for (int k = 0; k < n; k++) {
                GrammarMatcher m;
                if (!matcher_init(&m, g, &v, &err)) { line.set("error", Json::string(err)); break; }
                std::string text;
                for (;;) {
                    if (matcher_accepting(&m) && (matcher_done(&m) || rng() % 1000 < 20 + text.size())) break;
                    if (text.size() > 400) {
                        std::string rest;
                        if (!complete(&m, &rest)) { text += "<<no completion>>"; break; }
                        text += rest;
                        break;
                    }
                    int allowed[256], na = 0;
                    for (int b = 0; b < 256; b++) if (gm_step(&m, m.state, b)) allowed[na++] = b;
                    if (!na) { text += "<<dead end>>"; break; }
                    // printable ascii three times as likely: readable samples, all bytes still reached
                    int pick = allowed[rng() % na];
                    for (int t = 0; t < 2 && !(pick >= 0x20 && pick < 0x7F); t++) pick = allowed[rng() % na];
                    std::string one(1, (char)pick);
                    matcher_accept_bytes(&m, one);
                    text += one;
                }
                if (!m.err.empty()) text += "<<" + m.err + ">>";
                std::string safe;
                utf8_lossy(&safe, text.data(), text.size());
                samples.push(Json::string(safe));
            }
            if (!line.get("error")) line.set("samples", samples);
        }
        std::string out;
        json_write(&out, line);
        printf("%s\n", out.c_str());
    }
    return 0;
}

static int bench(const char* tok_path, int rows, const char* schema_path, const char* doc_path, int repeat) {
    std::string tj = slurp(tok_path), err;
    Tokenizer tok;
    if (!tokenizer_load(&tok, tj.data(), tj.size(), &err)) { fprintf(stderr, "grammar_gen: %s\n", err.c_str()); return 1; }
    std::vector<std::string> bytes(std::max(rows, tok.n_vocab));
    for (int id = 0; id < tok.n_vocab; id++) if (!tokenizer_is_special(&tok, id)) bytes[id] = tokenizer_token_bytes(&tok, id);
    auto t0 = std::chrono::steady_clock::now();
    GrammarVocab v;
    int eos = tokenizer_find(&tok, "<|im_end|>");
    vocab_build(&v, bytes, {eos});
    double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Json schema;
    if (!json_parse(slurp(schema_path), &schema, &err)) { fprintf(stderr, "grammar_gen: %s: %s\n", schema_path, err.c_str()); return 1; }
    auto g = std::make_shared<Grammar>();
    if (!schema_compile(schema, g.get(), &err)) { fprintf(stderr, "grammar_gen: %s\n", err.c_str()); return 1; }
    std::string doc = slurp(doc_path);
    while (!doc.empty() && (doc.back() == '\n' || doc.back() == ' ')) doc.pop_back();
    std::vector<int> ids;
    tokenizer_encode(&tok, doc, &ids);
    GrammarMatcher m;
    if (!matcher_init(&m, g, &v, &err)) { fprintf(stderr, "grammar_gen: %s\n", err.c_str()); return 1; }
    std::vector<double> cold, warm;
    for (int pass = 0; pass < 1 + repeat; pass++) {
        GrammarMatcher fresh;
        if (pass) {  // the same document again through the cached states (a new matcher would drop them)
            m.state = 0;
            std::vector<int32_t> start;
            for (int a : m.g->alts[m.g->root]) gm_expand(&m, a, -1, &start, 0);
            m.state = gm_intern(&m, &start);
        }
        for (int id : ids) {
            auto a = std::chrono::steady_clock::now();
            const uint32_t* mask = matcher_mask(&m);
            double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
            (pass ? warm : cold).push_back(dt);
            if (!mask_has(mask, id)) { fprintf(stderr, "grammar_gen: token %d of the document is masked\n", id); return 1; }
            matcher_accept(&m, id);
        }
        if (!matcher_accepting(&m)) { fprintf(stderr, "grammar_gen: the document does not complete the schema\n"); return 1; }
    }
    auto stats = [](std::vector<double> x) {
        std::sort(x.begin(), x.end());
        double sum = 0;
        for (double d : x) sum += d;
        Json o = Json::object();
        o.set("mean_ms", Json::number(x.empty() ? 0 : 1e3 * sum / x.size()));
        o.set("p50_ms", Json::number(x.empty() ? 0 : 1e3 * x[x.size() / 2]));
        o.set("max_ms", Json::number(x.empty() ? 0 : 1e3 * x.back()));
        return o;
    };
    Json o = Json::object();
    o.set("vocab_rows", Json::integer((int64_t)bytes.size()));
    o.set("trie_nodes", Json::integer((int64_t)v.byte.size()));
    o.set("trie_build_s", Json::number(build_s));
    o.set("grammar_rules", Json::integer((int64_t)g->alts.size()));
    o.set("tokens", Json::integer((int64_t)ids.size()));
    o.set("states", Json::integer((int64_t)m.states.size()));
    o.set("cold", stats(cold));
    o.set("warm", stats(warm));
    std::string out;
    json_write(&out, o);
    printf("%s\n", out.c_str());
    return 0;
}

int main(int argc, char** argv) {
    if (argc >= 5 && !strcmp(argv[1], "gen")) return gen(argv[2], atoi(argv[3]), (unsigned)atoi(argv[4]));
    if (argc >= 6 && !strcmp(argv[1], "bench")) return bench(argv[2], atoi(argv[3]), argv[4], argv[5], argc > 6 ? atoi(argv[6]) : 1);
    fprintf(stderr, "usage: grammar_gen gen CORPUS.json N SEED | bench TOKENIZER.json ROWS SCHEMA.json DOC.json [REPEAT]\n");
    return 1;
}
