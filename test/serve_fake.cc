// serve_fake: ninfer-serve (serve.h) driving a deterministic fake engine, so the server's
// http, api and queueing behaviour is tested without a model. test/test_serve.py runs it
// (or the real build/test/ninfer-serve, see NINFER_SERVE_CMD there).
//
// the fake "tokenizer": prepare renders a chatml-like prompt and every utf-8 byte of it is
// one token. for plain text messages the rendering is
//     for each message:  "<|im_start|>" role "\n" content "<|im_end|>\n"
//     then:              "<|im_start|>assistant\n<think>\n"              (thinking)
//                     or "<|im_start|>assistant\n<think>\n\n</think>\n\n"  (no thinking)
// so a test can compute prompt_tokens exactly. tools go in a leading system block, tool
// results in "<tool_response>" user turns, assistant history with its reasoning and calls.
//
// the fake "model": generate reads its script from the last user turn of the prompt.
//   default        reasoning "Let me think." (4 tokens) when thinking, then a silent
//                  </think> token, then content "Hello, wörld! 你好 🙂 done." in 15 tokens,
//                  two of the characters split across tokens (as byte-level bpe does),
//                  then a silent eos token: 15 (+5 with thinking) + 1 completion tokens
//   tools declared (and the last turn is not a tool result): reasoning, then one call of the
//                  first tool with {"<its first property>": "Paris"}, then eos; the call
//                  counts 10 tokens
//   a tool result  content "Result: " + the result text, one token per byte, then eos
//   [[echo]]       content = the last user text without directives, one token per byte
//   [[tokens=N]]   content = N tokens "w0 w1 w2 ..." (each " wK" one token), then eos;
//                  with [[pad=K]] each token carries K dots more (big writes)
//   [[delay=MS]]   sleep MS milliseconds per token (for cancel / queue tests)
//   [[fail]]       fail after 2 tokens (an engine error mid-stream)
//   [[params]]     content = the resolved sampler as json (precedence tests)
//   [[prepare_ms=MS]] anywhere in the prompt: prepare sleeps MS milliseconds (requests
//                  prepared concurrently, test_serve_robust.py)
// a completion prompt (prepare_text, or token ids) is bytes too, and its whole text is read
// for the directives. logprobs: every scripted step is one token whose id is its first byte
// (a tool call: '<'), logprob -0.5, alternatives id, id+1, ... (mod 256) at -0.5, -1.5, ...;
// a prompt token k gets logprob -1/k.
// stop strings are applied to the content channel the way reference-engine.md 10 says: the
// longest suffix that could start a stop string is held back, the earliest match ends
// generation and is not emitted. max_tokens counts every token, silent ones included.
//
// environment: SERVE_FAKE_FEATURES ("all" or a comma list of feature strings such as
// "--spec mtp,--vision") answers the capability query; SERVE_FAKE_MODEL_ID sets the model
// id (default "fake-model"); SERVE_FAKE_VISION=1 accepts media parts.
#include "../serve.h"
#include <sys/stat.h>

struct FakeEngine {
    ServeEngine eng;
};

static std::string fake_text(const Json* content) {
    if (!content || content->is_null()) return "";
    if (content->is_string()) return content->str;
    std::string s;
    for (const auto& p : content->arr) {
        const Json* t = p.get("type");
        if (t && t->is_string() && t->str == "text") s += p.get("text")->str;
        else s += "[media]";
    }
    return s;
}

static bool fake_prepare(void*, const ServeChat& chat, ServePrompt* out, ServeError* err) {
    if (!chat.reasoning_effort.empty()) {
        err->code = "reasoning_effort_not_supported";
        err->message = "this model's template has no reasoning effort";
        err->param = "reasoning_effort";
        return false;
    }
    // preserve_thinking: this template keeps every turn's reasoning anyway
    const auto& msgs = chat.messages.arr;
    std::string r;
    size_t first = 0;
    bool tools = chat.tools.is_array() && !chat.tools.arr.empty();
    if (tools) {
        r += "<|im_start|>system\n# Tools\n<tools>\n";
        for (const auto& t : chat.tools.arr) r += json_dump(*t.get("function")) + "\n";
        r += "</tools>";
        if (!msgs.empty() && msgs[0].get("role")->str == "system") { r += "\n\n" + fake_text(msgs[0].get("content")); first = 1; }
        r += "<|im_end|>\n";
    }
    for (size_t k = first; k < msgs.size(); k++) {
        const Json& m = msgs[k];
        std::string role = m.get("role")->str;
        if (role == "tool") {
            r += "<|im_start|>user\n<tool_response>\n" + fake_text(m.get("content")) + "\n</tool_response><|im_end|>\n";
        } else if (role == "assistant") {
            r += "<|im_start|>assistant\n";
            const Json* rc = m.get("reasoning_content");
            if (rc && rc->is_string() && !rc->str.empty()) r += "<think>\n" + rc->str + "\n</think>\n\n";
            r += fake_text(m.get("content"));
            if (const Json* tc = m.get("tool_calls"); tc && tc->is_array())
                for (const auto& call : tc->arr) {
                    const Json* f = call.get("function");
                    const Json* a = f->get("arguments");
                    r += "<tool_call>\n{\"name\":" + json_dump(*f->get("name")) + ",\"arguments\":" +
                         (a ? (a->is_string() ? a->str : json_dump(*a)) : std::string("{}")) + "}\n</tool_call>";
                }
            r += "<|im_end|>\n";
        } else {
            if (role == "developer") role = "system";
            r += "<|im_start|>" + role + "\n" + fake_text(m.get("content")) + "<|im_end|>\n";
        }
    }
    r += chat.enable_thinking ? "<|im_start|>assistant\n<think>\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    if (size_t d = r.find("[[prepare_ms="); d != std::string::npos) usleep(atoi(r.c_str() + d + 13) * 1000);
    out->tokens.assign(r.begin(), r.end());
    for (auto& t : out->tokens) t &= 0xFF;
    out->thinking = chat.enable_thinking;
    out->tools = tools;
    return true;
}

// one scripted step: a token on a channel (-1 silent, 0 reasoning, 1 content, 3 content
// exempt from stop strings), or a tool call (2)
struct FakeStep { int ch; std::string text, tool_name, tool_args; int cost = 1; };

static double fake_now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static void fake_generate(void*, const ServePrompt& prompt, const ServeSampling& s, const ServeSink& sink, ServeResult* out) {
    double t0 = fake_now();
    std::string text(prompt.tokens.begin(), prompt.tokens.end());
    // the last user turn
    std::string user;
    size_t at = text.rfind("<|im_start|>user\n");
    if (at != std::string::npos) {
        size_t b = at + 17, e = text.find("<|im_end|>", b);
        user = text.substr(b, e == std::string::npos ? std::string::npos : e - b);
    }
    if (prompt.raw) user = text;
    bool tool_result = !user.compare(0, 16, "<tool_response>\n");
    auto directive = [&](const char* name, std::string* val) {
        std::string key = std::string("[[") + name;
        size_t p = user.find(key);
        if (p == std::string::npos) return false;
        size_t e = user.find("]]", p);
        if (e == std::string::npos) return false;
        std::string body = user.substr(p + key.size(), e - p - key.size());
        if (val) *val = body.size() > 0 && body[0] == '=' ? body.substr(1) : "";
        return true;
    };
    std::string v;
    int delay_ms = directive("delay", &v) ? atoi(v.c_str()) : 0;
    std::vector<FakeStep> script;
    if (prompt.thinking) {
        for (const char* p : {"Let", " me", " think", "."}) script.push_back({0, p});
        script.push_back({-1, "</think>"});
    }
    if (tool_result) {
        size_t b = 16, e = user.find("\n</tool_response>");
        std::string res = "Result: " + user.substr(b, e == std::string::npos ? std::string::npos : e - b);
        for (char c : res) script.push_back({1, std::string(1, c)});
    } else if (directive("echo", nullptr)) {
        std::string u = user;
        for (size_t p; (p = u.find("[[")) != std::string::npos;) {
            size_t e = u.find("]]", p);
            if (e == std::string::npos) break;
            u.erase(p, e + 2 - p);
        }
        for (char c : u) script.push_back({1, std::string(1, c)});
    } else if (directive("tokens", &v)) {
        int n = atoi(v.c_str());
        std::string pad = directive("pad", &v) ? std::string(atoi(v.c_str()), '.') : "";
        for (int k = 0; k < n; k++) script.push_back({1, (k ? " w" : "w") + std::to_string(k) + pad});
    } else if (directive("params", nullptr)) {
        auto num = [](float x) { char b[32]; snprintf(b, sizeof b, "%g", x); return Json::number(atof(b)); };
        Json o = Json::object();
        o.set("temperature", num(s.temperature));
        o.set("top_p", num(s.top_p));
        o.set("top_k", Json::integer(s.top_k));
        o.set("min_p", num(s.min_p));
        o.set("presence_penalty", num(s.presence_penalty));
        o.set("frequency_penalty", num(s.frequency_penalty));
        o.set("seed", Json::string(std::to_string(s.seed)));
        o.set("max_tokens", Json::integer(s.max_tokens));
        Json stop = Json::array();
        for (const auto& x : s.stop) stop.push(Json::string(x));
        o.set("stop", stop);
        Json lb = Json::array();
        for (const auto& x : s.logit_bias) { Json p = Json::array(); p.push(Json::integer(x.first)); p.push(num(x.second)); lb.push(p); }
        o.set("logit_bias", lb);
        script.push_back({3, json_dump(o)});  // not subject to the stop strings it lists
    } else if (prompt.tools) {
        // the first tool and its first property, from the rendered <tools> block
        size_t b = text.find("<tools>\n") + 8, e = text.find('\n', b);
        Json fn; std::string err;
        std::string args = "{}";
        if (json_parse(text.substr(b, e - b), &fn, &err)) {
            const Json* props = fn.get("parameters") ? fn.get("parameters")->get("properties") : nullptr;
            if (props && props->is_object() && !props->obj.empty()) {
                Json a = Json::object();
                a.set(props->obj[0].first, Json::string("Paris"));
                args = json_dump(a);
            }
            FakeStep st{2, "", fn.get("name")->str, args};
            st.cost = 10;
            script.push_back(st);
        }
    } else {
        for (const char* p : {"Hello", ",", " w", "\xC3", "\xB6rld", "!", " ", "\xE4\xBD", "\xA0\xE5", "\xA5\xBD",
                              " ", "\xF0\x9F", "\x99\x82", " done", "."})
            script.push_back({1, p});
    }
    bool fail = directive("fail", nullptr);
    out->prompt_tokens = (int)prompt.tokens.size();
    out->finish = "stop";
    if (s.logprobs >= 0 && s.prompt_logprobs && prompt.tokens.size() > 1) {
        ServeEvent ev; ev.kind = SERVE_PROMPT_LOGPROBS;
        for (size_t k = 1; k < prompt.tokens.size(); k++) {
            ServeLogprob l; l.id = prompt.tokens[k]; l.logprob = -1.0f / k;
            for (int a = 0; a < s.logprobs; a++) l.top.push_back({(l.id + a) & 255, -1.0f / k - a});
            ev.logprobs.push_back(l);
        }
        sink.emit(sink.ctx, ev);
    }
    out->prefill_s = fake_now() - t0;
    double t1 = fake_now();
    int count = 0;
    std::string pending;  // content held back: it could be the start of a stop string
    bool ended = false, called = false;
    auto emit = [&](ServeEventKind k, const std::string& t) {
        if (t.empty() && k != SERVE_TOOL_CALL) return true;
        ServeEvent ev; ev.kind = k; ev.text = t;
        return sink.emit(sink.ctx, ev);
    };
    for (const auto& st : script) {
        if (sink.cancelled(sink.ctx)) { ended = true; break; }
        if (count + st.cost > s.max_tokens) { out->finish = "length"; count = s.max_tokens; ended = true; break; }
        if (fail && count >= 2) { out->error = "fake engine failure"; ended = true; break; }
        if (delay_ms > 0) usleep(delay_ms * 1000);
        count += st.cost;
        if (st.ch == 0) out->reasoning_tokens += st.cost;
        if (s.logprobs >= 0) {
            ServeEvent ev; ev.kind = SERVE_LOGPROB;
            ServeLogprob l;
            l.id = st.ch == 2 ? '<' : st.text.empty() ? 0 : (unsigned char)st.text[0];
            l.logprob = -0.5f;
            l.channel = st.ch == 0 ? SERVE_REASONING : st.ch == 2 ? SERVE_TOOL_CALL : SERVE_CONTENT;
            if (st.ch == -1) l.channel = SERVE_REASONING;  // </think>: read on the reasoning channel
            for (int a = 0; a < s.logprobs; a++) l.top.push_back({(l.id + a) & 255, -0.5f - a});
            ev.logprobs.push_back(l);
            sink.emit(sink.ctx, ev);
        }
        bool alive = true;
        if (st.ch == 0) alive = emit(SERVE_REASONING, st.text);
        else if (st.ch == 3) alive = emit(SERVE_CONTENT, st.text);
        else if (st.ch == 2) {
            ServeEvent ev; ev.kind = SERVE_TOOL_CALL; ev.tool_name = st.tool_name; ev.tool_args = st.tool_args;
            alive = sink.emit(sink.ctx, ev);
            called = true;
        } else if (st.ch == 1) {
            pending += st.text;
            size_t best = std::string::npos; const std::string* hit = nullptr;
            for (const auto& x : s.stop) {
                size_t p = pending.find(x);
                if (p != std::string::npos && p < best) { best = p; hit = &x; }
            }
            if (hit) {
                emit(SERVE_CONTENT, pending.substr(0, best));
                out->stop_string = *hit;
                pending.clear();
                ended = true;
                break;
            }
            size_t keep = 0;
            for (const auto& x : s.stop)
                for (size_t l = std::min(x.size() - 1, pending.size()); l > keep; l--)
                    if (!pending.compare(pending.size() - l, l, x, 0, l)) { keep = l; break; }
            alive = emit(SERVE_CONTENT, pending.substr(0, pending.size() - keep));
            pending.erase(0, pending.size() - keep);
        }
        if (!alive) { ended = true; break; }
    }
    if (!ended) {
        if (count >= s.max_tokens) out->finish = "length";
        else count++;  // the eos token: counted, not shown
    }
    if (out->stop_string.empty() && out->error.empty()) emit(SERVE_CONTENT, pending);
    if (called && out->finish == "stop") out->finish = "tool_calls";
    out->completion_tokens = count;
    out->decode_s = fake_now() - t1;
}

static bool fake_prepare_text(void*, const std::string& text, ServePrompt* out, ServeError* err) {
    if (text.empty()) { err->param = "prompt"; err->message = "the prompt has no tokens"; return false; }
    out->tokens.assign(text.begin(), text.end());
    for (auto& t : out->tokens) t &= 0xFF;
    out->thinking = out->tools = false;
    out->raw = true;
    return true;
}
static std::string fake_token_bytes(void*, int id) { return id >= 0 && id < 256 ? std::string(1, (char)id) : std::string(); }

static bool fake_supports(const char* feature) {
    const char* env = getenv("SERVE_FAKE_FEATURES");
    if (!env) return false;
    std::string list = std::string(",") + env + ",";
    return list == ",all," || list.find(std::string(",") + feature + ",") != std::string::npos;
}

static ServeEngine* fake_load(const char* path, const ServeOptions& o, std::string* err) {
    struct stat st;
    if (strcmp(path, "fake") != 0 && stat(path, &st) != 0) { *err = std::string("cannot open ") + path; return nullptr; }
    FakeEngine* f = new FakeEngine;
    f->eng.self = f;
    const char* id = getenv("SERVE_FAKE_MODEL_ID");
    f->eng.model_id = id ? id : "fake-model";
    f->eng.max_context = o.max_context;
    f->eng.n_vocab = 256;  // one token per byte
    const char* vis = getenv("SERVE_FAKE_VISION");
    f->eng.vision = vis && !strcmp(vis, "1");
    f->eng.prepare = fake_prepare;
    f->eng.prepare_text = fake_prepare_text;
    f->eng.token_bytes = fake_token_bytes;
    f->eng.logprobs = true;
    f->eng.generate = fake_generate;
    return &f->eng;
}

int main(int argc, char** argv) {
    ServeBackend b{fake_supports, fake_load};
    return serve_main(argc, argv, b);
}
