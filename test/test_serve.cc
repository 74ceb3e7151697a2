// test_serve: the pure parts of serve.h (http head parsing and chunked decoding over byte
// streams, utf-8 holdback, sse framing, flags, request validation and the anthropic ->
// openai conversion). the sockets, the queue and the sdks are test/test_serve.py's.
#include <gtest/gtest.h>
#include "../serve.h"

static HttpLimits limits() { HttpLimits l; l.max_head = 4096; l.max_headers = 10; l.max_body = 1000; return l; }

static long parse(const std::string& s, HttpRequest* rq) { return http_parse_head(s.data(), s.size(), limits(), rq); }

TEST(HttpHead, Basic) {
    HttpRequest rq;
    std::string s = "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nX-Y:  z \r\n\r\nbody";
    ASSERT_EQ(parse(s, &rq), (long)s.size() - 4);
    EXPECT_EQ(rq.method, "POST");
    EXPECT_EQ(rq.path, "/v1/chat/completions");
    EXPECT_EQ(rq.query, "x=1");
    EXPECT_EQ(rq.content_length, 12);
    EXPECT_FALSE(rq.chunked);
    EXPECT_TRUE(rq.keep_alive);
    ASSERT_NE(rq.header("x-y"), nullptr);
    EXPECT_EQ(*rq.header("x-y"), "z");
}

TEST(HttpHead, EveryPrefixNeedsMore) {
    // fed byte by byte, the parser asks for more until the blank line, then agrees
    std::string s = "GET /health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    for (size_t n = 0; n < s.size(); n++) {
        HttpRequest rq;
        EXPECT_EQ(http_parse_head(s.data(), n, limits(), &rq), 0) << n;
    }
    HttpRequest rq;
    EXPECT_EQ(parse(s, &rq), (long)s.size());
    EXPECT_FALSE(rq.keep_alive);
}

// issue 11, defect 7: bytes that cannot start a request line are refused before the line
// ends (a tls hello has no newline for a long while); every prefix of a real one waits
TEST(HttpHead, ImpossibleFirstLineRefusedAtOnce) {
    const char* bad[] = {"\x16\x03\x01", "\x00", "GET\t/", "GET  /", "GET /a\x01", "GET / HTTX", "GET / HTTP/a", "GET / HTTP/1.1x",
                         "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "{\"model\":1}", "GET / HTTP/1.1\rX"};
    for (const char* b : bad) {
        HttpRequest rq;
        EXPECT_EQ(http_parse_head(b, strlen(b) + (b[0] ? 0 : 1), limits(), &rq), -400) << b;
    }
    for (const char* good : {"POST /v1/chat/completions?x=1 HTTP/1.1\r\n", "OPTIONS * HTTP/1.0\r\n", "GET http://a/b HTTP/1.1\r\n"}) {
        for (size_t n = 0; n < strlen(good); n++) {
            HttpRequest rq;
            EXPECT_EQ(http_parse_head(good, n, limits(), &rq), 0) << good << " at " << n;
        }
    }
}

TEST(HttpHead, LeadingCrlfAndBareLf) {
    HttpRequest rq;
    std::string s = "\r\n\r\nGET /health HTTP/1.1\nHost: a\n\n";
    EXPECT_EQ(parse(s, &rq), (long)s.size());
    EXPECT_EQ(rq.path, "/health");
}

TEST(HttpHead, Versions) {
    HttpRequest rq;
    EXPECT_GT(parse("GET / HTTP/1.0\r\n\r\n", &rq), 0);
    EXPECT_FALSE(rq.keep_alive);
    EXPECT_GT(parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &rq), 0);
    EXPECT_TRUE(rq.keep_alive);
    EXPECT_EQ(parse("GET / HTTP/2.0\r\n\r\n", &rq), -505);
    EXPECT_EQ(parse("GET / HTTP/1.1x\r\n\r\n", &rq), -400);
    EXPECT_EQ(parse("GET / FTP/1.1\r\n\r\n", &rq), -400);
}

TEST(HttpHead, Framing) {
    HttpRequest rq;
    EXPECT_GT(parse("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n", &rq), 0);
    EXPECT_TRUE(rq.chunked);
    EXPECT_GT(parse("POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", &rq), 0);
    EXPECT_EQ(rq.content_length, 5);
    EXPECT_GT(parse("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", &rq), 0);
    const char* bad[] = {
        "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 5, 6\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length:\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
        "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length : 5\r\n\r\n",
        "GET / HTTP/1.1\r\n folded\r\n\r\n",
        "GET / HTTP/1.1\r\nA: b\rc\r\n\r\n",
        "GET / HTTP/1.1\r\nA: b\x01\r\n\r\n",
        "GET / HTTP/1.1\r\nNoColon\r\n\r\n",
        "GET  / HTTP/1.1\r\n\r\n",
        "GET /a b HTTP/1.1\r\n\r\n",
        "G@T / HTTP/1.1\r\n\r\n",
        "GET noslash HTTP/1.1\r\n\r\n",
    };
    for (const char* b : bad) EXPECT_EQ(parse(b, &rq), -400) << b;
    EXPECT_EQ(parse("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", &rq), -501);
    EXPECT_EQ(parse("POST / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n", &rq), (long)strlen("POST / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n"));
    EXPECT_TRUE(rq.expect_continue);
    EXPECT_EQ(parse("POST / HTTP/1.1\r\nExpect: something\r\n\r\n", &rq), -417);
}

TEST(HttpHead, Limits) {
    HttpRequest rq;
    EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", &rq), -413);
    EXPECT_GT(parse("POST / HTTP/1.1\r\nContent-Length: 1000\r\n\r\n", &rq), 0);
    EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", &rq), -413);
    std::string many = "GET / HTTP/1.1\r\n";
    for (int i = 0; i < 11; i++) many += "A" + std::to_string(i) + ": b\r\n";
    EXPECT_EQ(parse(many + "\r\n", &rq), -413);
    // too long, complete or not
    std::string big = "GET / HTTP/1.1\r\nA: " + std::string(5000, 'x');
    EXPECT_EQ(parse(big, &rq), -413);
    EXPECT_EQ(parse(big + "\r\n\r\n", &rq), -413);
    EXPECT_EQ(parse(std::string(5000, '\n'), &rq), -413);
}

TEST(HttpHead, AbsoluteFormAndAsterisk) {
    HttpRequest rq;
    EXPECT_GT(parse("GET http://h:1/v1/models?a HTTP/1.1\r\n\r\n", &rq), 0);
    EXPECT_EQ(rq.path, "/v1/models");
    EXPECT_EQ(rq.query, "a");
    EXPECT_GT(parse("OPTIONS * HTTP/1.1\r\n\r\n", &rq), 0);
    EXPECT_EQ(rq.path, "*");
}

// feed a chunked body in pieces of `step` bytes
static int chunked_all(const std::string& s, size_t step, std::string* body, size_t* consumed, uint64_t max = 1000) {
    ChunkedDecoder d;
    size_t off = 0;
    for (;;) {
        size_t n = std::min(step, s.size() - off), used = 0;
        int r = chunked_feed(&d, s.data() + off, n, body, max, 64, &used);
        off += used;
        if (r != 0) { *consumed = off; return r; }
        if (off >= s.size()) { *consumed = off; return 0; }
    }
}

TEST(Chunked, DecodesInAnyPieces) {
    std::string s = "5\r\nhello\r\nA;ext=\"v\"\r\n, chunked!\r\n0\r\nTrailer: x\r\n\r\nNEXT";
    for (size_t step : {1, 2, 3, 7, 1000}) {
        std::string body; size_t used;
        ASSERT_EQ(chunked_all(s, step, &body, &used), 1) << step;
        EXPECT_EQ(body, "hello, chunked!");
        EXPECT_EQ(s.substr(used), "NEXT") << step;
    }
}

TEST(Chunked, Errors) {
    const char* bad[] = {"x\r\n", "\r\n", "5\nhello\r\n0\r\n\r\n", "5\r\nhelloXX", "-5\r\n",
                         "5 \r\nhello\r\n0\r\n\r\n" /* ok: bws */, "1234567890123456\r\n", "0\r\nA: b\n"};
    for (const char* b : bad) {
        std::string body; size_t used;
        int r = chunked_all(b, 1, &body, &used);
        if (!strcmp(b, "5 \r\nhello\r\n0\r\n\r\n")) EXPECT_EQ(r, 1);
        else EXPECT_EQ(r, -400) << b;
    }
    std::string body; size_t used;
    EXPECT_EQ(chunked_all("3E9\r\n", 1, &body, &used), -413);  // 1001 > max 1000
    EXPECT_EQ(chunked_all("1F4\r\n" + std::string(500, 'a') + "\r\n1F5\r\n", 100, &body, &used), -413);
    EXPECT_EQ(chunked_all("0\r\n" + std::string(100, 'a'), 1, &body, &used), -413);  // trailer over the line limit
    EXPECT_EQ(chunked_all("5\r\nhel", 1, &body, &used), 0);  // incomplete
}

TEST(Utf8Take, HoldsSplitSequences) {
    const std::string text = "a\xC3\xB6" "b\xE4\xBD\xA0\xF0\x9F\x99\x82z";  // a ö b 你 🙂 z
    for (size_t cut = 0; cut <= text.size(); cut++) {
        std::string carry, out;
        utf8_take(&carry, text.data(), cut, &out, false);
        EXPECT_TRUE(utf8_valid(out.data(), out.size()));
        EXPECT_LE(carry.size(), 3u);
        utf8_take(&carry, text.data() + cut, text.size() - cut, &out, true);
        EXPECT_EQ(out, text) << cut;
        EXPECT_TRUE(carry.empty());
    }
    // byte by byte
    std::string carry, out;
    for (char c : text) { utf8_take(&carry, &c, 1, &out, false); EXPECT_TRUE(utf8_valid(out.data(), out.size())); }
    EXPECT_EQ(out, text);
}

TEST(Utf8Take, IllFormedBecomesReplacement) {
    EXPECT_EQ(utf8_fix("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
    EXPECT_EQ(utf8_fix("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");          // overlong
    EXPECT_EQ(utf8_fix("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
    EXPECT_EQ(utf8_fix("\xE4\xBD"), "\xEF\xBF\xBD");                     // truncated at the end
    EXPECT_EQ(utf8_fix("\xE4\xBD" "x"), "\xEF\xBF\xBD" "x");
    std::string carry, out;
    utf8_take(&carry, "\xE4\xBD", 2, &out, false);  // not final: held, nothing out
    EXPECT_EQ(out, "");
    EXPECT_EQ(carry, "\xE4\xBD");
    utf8_take(&carry, "\xFF", 1, &out, false);      // the continuation never came
    EXPECT_EQ(out, "\xEF\xBF\xBD\xEF\xBF\xBD");
    EXPECT_TRUE(carry.empty());
}

TEST(Sse, Framing) {
    EXPECT_EQ(sse_data("{\"a\":1}"), "data: {\"a\":1}\n\n");
    EXPECT_EQ(sse_event("ping", "{\"type\":\"ping\"}"), "event: ping\ndata: {\"type\":\"ping\"}\n\n");
    // json_dump escapes newlines, so a data line never splits
    EXPECT_EQ(sse_data(json_dump(Json::string("a\nb\r\n"))), "data: \"a\\nb\\r\\n\"\n\n");
}

static int args(std::vector<std::string> v, ServeOptions* o, std::string* err) {
    std::vector<char*> a;
    static std::string prog = "ninfer-serve";
    a.push_back(&prog[0]);
    for (auto& s : v) a.push_back(&s[0]);
    *o = ServeOptions();
    return serve_parse_args((int)a.size(), a.data(), o, err);
}

TEST(Flags, ModelCards) {
    ServeOptions o; std::string err;
    ASSERT_EQ(args({"models/qwen3_5_9b.ninfer", "--model-id", "qwen3.5-9b", "--max-context", "16384", "--spec", "mtp",
                    "--draft-tokens", "3"}, &o, &err), 0) << err;
    EXPECT_EQ(o.model_id, "qwen3.5-9b");
    EXPECT_EQ(o.max_context, 16384);
    EXPECT_EQ(o.spec, "mtp");
    EXPECT_EQ(o.draft_tokens, 3);
    EXPECT_EQ(o.host, "127.0.0.1");
    EXPECT_EQ(o.port, 8080);
    EXPECT_FALSE(serve_check_features(o, [](const char*) { return false; }, &err));
    EXPECT_EQ(err, "--spec mtp is not supported yet");
    EXPECT_TRUE(serve_check_features(o, [](const char* f) { return !strcmp(f, "--spec mtp"); }, &err));
    ASSERT_EQ(args({"m", "--host", "0.0.0.0", "--port", "8000", "--vision", "--max-context", "262144", "--kv-capacity",
                    "262144", "--default-max-tokens", "16384", "--max-concurrency", "1", "--device-state-slots", "4",
                    "--host-state-slots", "4", "--host-kv-mib", "8192", "--prefill-chunk", "4096", "--kv-dtype", "fp8",
                    "--spec", "mtp", "--lm-head-draft", "--draft-tokens", "3", "--top-k", "20", "--top-p", "0.95",
                    "--temperature", "0.01", "--preserve-thinking", "--model-id", "Qwen3.5-4B"}, &o, &err), 0) << err;
    EXPECT_EQ(o.kv_dtype, "fp8");
    EXPECT_EQ(o.top_k, 20);
    EXPECT_DOUBLE_EQ(o.temperature, 0.01);
    EXPECT_TRUE(o.preserve_thinking && o.lm_head_draft && o.vision);
    // kv-capacity equal to max-context asks nothing of the engine
    std::vector<std::string> asked;
    static std::vector<std::string>* sink;
    sink = &asked;
    serve_check_features(o, [](const char* f) { sink->push_back(f); return true; }, &err);
    std::vector<std::string> want = {"--spec mtp", "--lm-head-draft", "--vision", "--kv-dtype fp8", "--preserve-thinking",
                                     "--device-state-slots", "--host-state-slots", "--host-kv-mib"};
    EXPECT_EQ(asked, want);
}

TEST(Flags, Errors) {
    ServeOptions o; std::string err;
    EXPECT_EQ(args({"m", "--nope"}, &o, &err), 1);
    EXPECT_EQ(args({"m", "--port", "x"}, &o, &err), 1);
    EXPECT_EQ(args({"m", "--port", "65536"}, &o, &err), 1);
    EXPECT_EQ(args({"m", "--prefill-chunk", "129"}, &o, &err), 1);
    EXPECT_EQ(args({"m", "--seed", "-1"}, &o, &err), 1);
    EXPECT_EQ(args({"m", "--kv-capacity", "lots"}, &o, &err), 1);
    EXPECT_EQ(args({"m", "--vision=1"}, &o, &err), 1);
    EXPECT_EQ(args({"m", "--api-key", ""}, &o, &err), 1);  // an empty key would turn authentication off
    EXPECT_NE(err.find("--api-key"), std::string::npos);
    EXPECT_EQ(args({"m", "--api-key="}, &o, &err), 1);
    EXPECT_EQ(args({"m", "--allowed-hosts", ", ,"}, &o, &err), 1);
    EXPECT_EQ(args({"m", "--allowed-hosts", "A.example, b"}, &o, &err), 0) << err;
    EXPECT_EQ(o.allowed_hosts, (std::vector<std::string>{"a.example", "b"}));
    EXPECT_EQ(args({"m", "n"}, &o, &err), 1);
    EXPECT_EQ(args({}, &o, &err), 1);
    EXPECT_EQ(args({"m", "--help"}, &o, &err), 2);
    EXPECT_EQ(args({"m", "--port=0", "--seed", "18446744073709551615", "--kv-capacity", "auto"}, &o, &err), 0) << err;
    EXPECT_EQ(o.port, 0);
    EXPECT_EQ(o.seed, 18446744073709551615ull);
    EXPECT_TRUE(o.has_seed);
}

static Json J(const char* s) { Json j; std::string err; EXPECT_TRUE(json_parse(s, strlen(s), &j, &err)) << err; return j; }

TEST(OpenAI, ParseAndDefaults) {
    ApiContext ctx; ctx.model_id = "m";
    ApiRequest r; ServeError e;
    ASSERT_TRUE(openai_chat_parse(J(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stop":"x",
        "max_tokens":5,"max_completion_tokens":7,"seed":3,"stream":true,"stream_options":{"include_usage":true},
        "tools":[{"type":"function","function":{"name":"f"}}]})"), ctx, &r, &e)) << e.message;
    EXPECT_EQ(r.max_tokens, 7);  // max_completion_tokens wins
    EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
    EXPECT_TRUE(r.stream && r.include_usage && r.has_seed && r.seed == 3);
    EXPECT_TRUE(r.chat.enable_thinking);
    EXPECT_EQ(json_dump(r.chat.tools), R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}])");
    EXPECT_TRUE(isnan(r.temperature));
    ctx.thinking = false;
    ASSERT_TRUE(openai_chat_parse(J(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})"), ctx, &r, &e));
    EXPECT_FALSE(r.chat.enable_thinking);
    ASSERT_TRUE(openai_chat_parse(J(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":true}})"), ctx, &r, &e));
    EXPECT_TRUE(r.chat.enable_thinking);
}

TEST(OpenAI, Errors) {
    ApiContext ctx; ctx.model_id = "m";
    struct { const char* body; int status; const char* code; } cases[] = {
        {R"([])", 400, "invalid_request_error"},
        {R"({"messages":[{"role":"user","content":"x"}]})", 400, "invalid_request_error"},
        {R"({"model":"other","messages":[{"role":"user","content":"x"}]})", 404, "model_not_found"},
        {R"({"model":"m","messages":[]})", 400, "invalid_request_error"},
        {R"({"model":"m","messages":[{"role":"function","content":"x"}]})", 400, "unsupported_role"},
        {R"({"model":"m","messages":[{"role":"robot","content":"x"}]})", 400, "unsupported_role"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":3})", 400, "n_not_supported"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"functions":[]})", 400, "tools_not_supported"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"})", 400, "invalid_request_error"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"seed":-1})", 400, "invalid_request_error"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1.5})", 400, "invalid_request_error"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"a":1}})", 400, "invalid_request_error"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"whatever":1})", 400, "unknown_parameter"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"enable_thinking":false,"chat_template_kwargs":{"enable_thinking":true}})", 400, "conflicting_template_option"},
        {R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", 400, "vision_disabled"},
        {R"({"model":"m","messages":[{"role":"system","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", 400, "invalid_request_error"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a b"}}]})", 400, "invalid_request_error"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":3})", 400, "invalid_request_error"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", 400, "invalid_request_error"},
    };
    for (const auto& c : cases) {
        ApiRequest r; ServeError e;
        EXPECT_FALSE(openai_chat_parse(J(c.body), ctx, &r, &e)) << c.body;
        EXPECT_EQ(e.status, c.status) << c.body;
        EXPECT_EQ(e.code, c.code) << c.body;
        EXPECT_FALSE(e.message.empty());
    }
}

TEST(OpenAI, ChatLogprobs) {
    ApiContext ctx; ctx.model_id = "m";
    ApiRequest r; ServeError e;
    ASSERT_TRUE(openai_chat_parse(J(R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":4})"), ctx, &r, &e));
    EXPECT_EQ(r.logprobs, 4);
    ASSERT_TRUE(openai_chat_parse(J(R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true})"), ctx, &r, &e));
    EXPECT_EQ(r.logprobs, 0);
    ASSERT_TRUE(openai_chat_parse(J(R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":false})"), ctx, &r, &e));
    EXPECT_EQ(r.logprobs, -1);
}

TEST(Completions, Prompts) {
    ApiContext ctx; ctx.model_id = "m";
    ApiRequest r; ServeError e;
    ASSERT_TRUE(completions_parse(J(R"({"model":"m","prompt":[[5,6,7]],"echo":true,"max_tokens":0,"logprobs":1})"), ctx, &r, &e));
    EXPECT_TRUE(r.raw && r.raw_is_ids && r.echo && r.max_zero);
    EXPECT_EQ(r.raw_ids, (std::vector<int>{5, 6, 7}));
    EXPECT_EQ(r.logprobs, 1);
    ASSERT_TRUE(completions_parse(J(R"({"model":"m","prompt":["abc"],"stop":"x"})"), ctx, &r, &e));
    EXPECT_TRUE(r.raw && !r.raw_is_ids);
    EXPECT_EQ(r.raw_text, "abc");
    EXPECT_EQ(r.stop, (std::vector<std::string>{"x"}));
    EXPECT_FALSE(completions_parse(J(R"({"model":"m","prompt":["a","b"]})"), ctx, &r, &e));
    EXPECT_EQ(e.param, "prompt");
    EXPECT_FALSE(completions_parse(J(R"({"model":"m","prompt":[1,2.5]})"), ctx, &r, &e));
    EXPECT_EQ(e.param, "prompt");
}

TEST(Responses, ItemsBecomeAChat) {
    ApiContext ctx; ctx.model_id = "m";
    ApiRequest r; ServeError e;
    ASSERT_TRUE(responses_parse(J(R"({"model":"m","instructions":"be brief","input":[
        {"role":"user","content":"q"},
        {"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"hm"}]},
        {"type":"message","role":"assistant","content":[{"type":"output_text","text":"looking"}]},
        {"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}"},
        {"type":"function_call","call_id":"c2","name":"g","arguments":"{}"},
        {"type":"function_call_output","call_id":"c1","output":"R1"},
        {"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"R2"}]}],
      "tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{}}}]})"), ctx, false, &r, &e)) << e.message;
    EXPECT_EQ(json_dump(r.chat.messages),
        R"([{"role":"developer","content":"be brief"},{"role":"user","content":"q"},)"
        R"({"role":"assistant","content":"looking","reasoning_content":"hm","tool_calls":[)"
        R"({"id":"c1","type":"function","function":{"name":"f","arguments":{"a":1}}},)"
        R"({"id":"c2","type":"function","function":{"name":"g","arguments":{}}}]},)"
        R"({"role":"tool","tool_call_id":"c1","content":"R1"},{"role":"tool","tool_call_id":"c2","content":"R2"}])");
    EXPECT_EQ(json_dump(r.chat.tools), R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}])");
    EXPECT_EQ(r.resp.get("input")->size(), 7u);  // every input item kept, with an id, for the store
    for (const auto& it : r.resp.get("input")->arr) EXPECT_TRUE(it.get("id") && it.get("id")->is_string());
}

TEST(Responses, StoreEvictsLeastRecentlyUsed) {
    g_resp.max_records = 2; g_resp.max_bytes = 1 << 20;
    auto put = [](const char* id, size_t pad) {
        RespRecord r; r.id = id; r.response = Json::object(); r.response.set("x", Json::string(std::string(pad, 'x')));
        r.input = Json::array();
        return resp_store_put(r);
    };
    RespRecord got;
    EXPECT_TRUE(put("a", 10)); EXPECT_TRUE(put("b", 10));
    EXPECT_TRUE(resp_store_get("a", &got));       // a is now the most recent
    EXPECT_TRUE(put("c", 10));                    // b goes
    EXPECT_FALSE(resp_store_get("b", &got));
    EXPECT_TRUE(resp_store_get("a", &got) && resp_store_get("c", &got));
    EXPECT_FALSE(put("d", 2 << 20));              // larger than the whole budget: not kept, nothing evicted
    EXPECT_TRUE(resp_store_get("a", &got) && resp_store_get("c", &got));
    g_resp.max_bytes = 520;                       // a record of 10 pad bytes counts 21, of 500 511
    EXPECT_TRUE(put("e", 500));                   // by bytes: both others go
    EXPECT_FALSE(resp_store_get("a", &got) || resp_store_get("c", &got));
    EXPECT_TRUE(resp_store_delete("e") && !resp_store_delete("e"));
    EXPECT_EQ(g_resp.bytes, 0u);
}

TEST(Anthropic, ConvertsToOpenAIShape) {
    ApiContext ctx; ctx.model_id = "m";
    ApiRequest r; ServeError e;
    ASSERT_TRUE(anthropic_parse(J(R"({"model":"claude","max_tokens":9,"system":[{"type":"text","text":"S"}],
      "messages":[{"role":"user","content":"q"},
                  {"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"sig"},
                                                 {"type":"text","text":"let me look"},
                                                 {"type":"tool_use","id":"toolu_1","name":"get","input":{"k":1}}]},
                  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"R"}]},
                                            {"type":"text","text":"thanks"}]}],
      "tools":[{"name":"get","description":"d","input_schema":{"type":"object"}}],
      "thinking":{"type":"disabled"},"stop_sequences":["END"]})"), ctx, false, &r, &e)) << e.message;
    EXPECT_EQ(r.model, "claude");
    EXPECT_EQ(r.max_tokens, 9);
    EXPECT_FALSE(r.chat.enable_thinking);
    EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
    EXPECT_EQ(json_dump(r.chat.messages),
        R"([{"role":"system","content":"S"},{"role":"user","content":"q"},)"
        R"({"role":"assistant","content":"let me look","reasoning_content":"hm","tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get","arguments":{"k":1}}}]},)"
        R"({"role":"tool","tool_call_id":"toolu_1","content":"R"},{"role":"user","content":"thanks"}])");
    EXPECT_EQ(json_dump(r.chat.tools), R"([{"type":"function","function":{"name":"get","description":"d","parameters":{"type":"object"}}}])");
}

TEST(Anthropic, Errors) {
    ApiContext ctx; ctx.model_id = "m";
    const char* bad[] = {
        R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}]})",
        R"({"model":"a","max_tokens":0,"messages":[{"role":"user","content":"x"}]})",
        R"({"model":"a","max_tokens":5,"messages":[{"role":"system","content":"x"}]})",
        R"({"model":"a","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA"}}]}]})",
        R"({"model":"a","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document"}]}]})",
        R"({"model":"a","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"bash_20250124","name":"bash"}]})",
        R"({"model":"a","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"any"}})",
        R"({"model":"a","max_tokens":5,"messages":[{"role":"user","content":"x"}],"mystery":true})",
    };
    for (const char* b : bad) {
        ApiRequest r; ServeError e;
        EXPECT_FALSE(anthropic_parse(J(b), ctx, false, &r, &e)) << b;
        EXPECT_EQ(e.status, 400);
    }
    // count_tokens takes no max_tokens and no sampling fields
    ApiRequest r; ServeError e;
    EXPECT_TRUE(anthropic_parse(J(R"({"model":"a","messages":[{"role":"user","content":"x"}]})"), ctx, true, &r, &e));
    EXPECT_FALSE(anthropic_parse(J(R"({"model":"a","max_tokens":3,"messages":[{"role":"user","content":"x"}]})"), ctx, true, &r, &e));
}

// issue 11: nothing accepted and ignored; each refusal names its field
TEST(OpenAI, RefusedByName) {
    ApiContext ctx; ctx.model_id = "m";
    const char* U = R"("model":"m","messages":[{"role":"user","content":"x"}])";
    const char* T = R"("tools":[{"type":"function","function":{"name":"f"}}])";
    struct { std::string body; const char* param; const char* code; } cases[] = {
        {std::string("{") + U + R"(,"user":{"id":1}})", "user", "invalid_request_error"},
        {std::string("{") + U + R"(,"metadata":"x"})", "metadata", "invalid_request_error"},
        {std::string("{") + U + R"(,"stream_options":{"include_usage":true}})", "stream_options", "invalid_request_error"},
        {std::string("{") + U + R"(,"stream":true,"stream_options":{"bogus":1}})", "stream_options.bogus", "unknown_parameter"},
        {std::string("{") + U + R"(,"tool_choice":"auto"})", "tool_choice", "invalid_request_error"},
        {std::string("{") + U + R"(,"tool_choice":"none"})", "tool_choice", "invalid_request_error"},
        {std::string("{") + U + "," + T + R"(,"parallel_tool_calls":false})", "parallel_tool_calls", "invalid_request_error"},
        {std::string("{") + U + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":12}}}]})", "tools[0].function.parameters.type", "invalid_request_error"},
        {std::string("{") + U + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":7}}}}]})", "tools[0].function.parameters.properties.a", "invalid_request_error"},
        {std::string("{") + U + R"(,"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]})", "tools[1].function.name", "invalid_request_error"},
        {std::string("{") + U + R"(,"tools":[{"type":"function","function":{"name":"f","strict":true}}]})", "tools[0].function.strict", "strict_not_supported"},
        {std::string("{") + U + R"(,"tools":[{"type":"function","function":{"name":"f","examples":[]}}]})", "tools[0].function.examples", "unknown_parameter"},
        {std::string("{") + U + R"(,"chat_template_kwargs":{"add_vision_id":true}})", "chat_template_kwargs.add_vision_id", "unknown_parameter"},
        {std::string("{") + U + R"(,"store":true})", "store", "invalid_request_error"},
        {std::string("{") + U + R"(,"service_tier":"flex"})", "service_tier", "invalid_request_error"},
        {std::string("{") + U + R"(,"response_format":{"type":"text","json_schema":{}}})", "response_format.json_schema", "unknown_parameter"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"},{"role":"tool","content":"r"}]})", "messages[1].tool_call_id", "invalid_request_error"},
        {R"({"model":"m","messages":[{"role":"user","content":"x","name":"bob"}]})", "messages[0].name", "unknown_parameter"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":"}}]}]})", "messages[1].tool_calls[0].function.arguments", "invalid_request_error"},
        {R"({"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"[1]"}}]}]})", "messages[1].tool_calls[0].function.arguments", "invalid_request_error"},
        {R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x","cache":1}]}]})", "messages[0].content[0].cache", "unknown_parameter"},        {std::string("{") + U + R"(,"response_format":{"type":"xml"}})", "response_format.type", "response_format_not_supported"},
        {std::string("{") + U + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"array","contains":{}}}}})",
         "response_format.json_schema.schema", "schema_not_supported"},
    };
    for (const auto& c : cases) {
        ApiRequest r; ServeError e;
        EXPECT_FALSE(openai_chat_parse(J(c.body.c_str()), ctx, &r, &e)) << c.body;
        EXPECT_EQ(e.status, 400) << c.body;
        EXPECT_EQ(e.param, c.param) << c.body;
        EXPECT_EQ(e.code, c.code) << c.body;
    }
    // the message index is in the text too, for clients that show only the message
    ApiRequest r; ServeError e;
    EXPECT_FALSE(openai_chat_parse(J(cases[18].body.c_str()), ctx, &r, &e));
    EXPECT_NE(e.message.find("message 1"), std::string::npos) << e.message;
    // what the sdks send back as history passes: null fields, arguments as text -> the object
    ASSERT_TRUE(openai_chat_parse(J(R"({"model":"m","stream":false,"user":"u1","metadata":{"k":"v"},"store":false,
        "messages":[{"role":"user","content":"x"},
        {"role":"assistant","content":null,"refusal":null,"audio":null,"function_call":null,"annotations":[],
         "tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{\"q\": [1, 2]}"}},
                       {"id":"b","type":"function","function":{"name":"f","arguments":"{}"}}]},
        {"role":"tool","tool_call_id":"a","content":"1"},{"role":"tool","tool_call_id":"b","content":"2"}]})"), ctx, &r, &e)) << e.param << ": " << e.message;
    EXPECT_EQ(json_dump(*r.chat.messages.arr[1].get("tool_calls")->arr[0].get("function")->get("arguments")), R"({"q":[1,2]})");
}

TEST(Anthropic, RefusedByName) {
    ApiContext ctx; ctx.model_id = "m";
    const char* U = R"("model":"a","max_tokens":5,"messages":[{"role":"user","content":"x"}])";
    const char* T = R"("tools":[{"name":"f","input_schema":{"type":"object"}}])";
    struct { std::string body; const char* param; } cases[] = {
        {R"({"model":"a","messages":[{"role":"user","content":"x"}]})", "max_tokens"},
        {std::string("{") + U + R"(,"output_config":{"format":{"type":"json_schema"}}})", "output_config.format.schema"},
        {std::string("{") + U + R"(,"output_config":{"format":{"type":"json_schema","schema":{"type":"object","maxProperties":2}}}})", "output_config.format.schema"},
        {std::string("{") + U + R"(,"output_config":{"verbosity":"low"}})", "output_config.verbosity"},
        {std::string("{") + U + R"(,"metadata":"x"})", "metadata"},
        {std::string("{") + U + R"(,"metadata":{"tenant":"x"}})", "metadata.tenant"},
        {std::string("{") + U + R"(,"tool_choice":{"type":"auto"}})", "tool_choice"},
        {std::string("{") + U + "," + T + R"(,"tool_choice":{"type":"auto","disable_parallel_tool_use":true}})", "tool_choice.disable_parallel_tool_use"},
        {std::string("{") + U + R"(,"tools":[{"name":"f","input_schema":{"type":12}}]})", "tools[0].input_schema.type"},
        {std::string("{") + U + R"(,"tools":[{"name":"f","input_schema":{"type":"object"}},{"name":"f","input_schema":{"type":"object"}}]})", "tools[1].name"},
        {std::string("{") + U + R"(,"tools":[{"name":"f","input_schema":{"type":"object"},"strict":true}]})", "tools[0].strict"},
        {std::string("{") + U + R"(,"container":"c1"})", "container"},
        {std::string("{") + U + R"(,"thinking":{"type":"enabled","budget_tokens":10,"display":"x"}})", "thinking.display"},
        {std::string("{") + U + R"(,"thinking":{"type":"sometimes"}})", "thinking.type"},
        {std::string("{") + U + R"(,"cache_control":{"type":"forever"}})", "cache_control"},
        {R"({"model":"a","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"x","citations":[{"a":1}]}]}]})", "messages[0].content[0].citations"},
        {R"({"model":"a","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","is_error":"yes"}]}]})", "messages[0].content[0].is_error"},
        {R"({"model":"a","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{}}]}]}]})", "messages[0].content[0].content[0]"},
        {R"({"model":"a","max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{}}]}]})", "messages[1].content[0].id"},
        {R"({"model":"a","max_tokens":5,"messages":[{"role":"user","content":"x","name":"n"}]})", "messages[0].name"},
    };
    for (const auto& c : cases) {
        ApiRequest r; ServeError e;
        EXPECT_FALSE(anthropic_parse(J(c.body.c_str()), ctx, false, &r, &e)) << c.body;
        EXPECT_EQ(e.status, 400) << c.body;
        EXPECT_EQ(e.param, c.param) << c.body;
        // the error body names the parameter, as openai's param does
        Json b = J(serve_error_body(true, e).c_str());
        EXPECT_EQ(b.get("error")->get("message")->str.compare(0, strlen(c.param) + 2, std::string(c.param) + ": "), 0) << serve_error_body(true, e);
    }
    // tool_result blocks (string, text blocks, is_error), parallel tool_use, cache_control: accepted
    ApiRequest r; ServeError e;
    ASSERT_TRUE(anthropic_parse(J(R"({"model":"a","max_tokens":5,"cache_control":{"type":"ephemeral"},"metadata":{"user_id":"u"},
      "tools":[{"name":"f","input_schema":{"type":"object","properties":{"q":{"type":"string"}}},"cache_control":{"type":"ephemeral","ttl":"1h"}}],
      "messages":[{"role":"user","content":"x"},
        {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{"q":"a"}},{"type":"tool_use","id":"t2","name":"f","input":{"q":"b"}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"A"},
                                  {"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"B1"},{"type":"text","text":"B2"}],"is_error":true}]}]})"),
        ctx, false, &r, &e)) << e.param << ": " << e.message;
    EXPECT_EQ(json_dump(r.chat.messages),
        R"([{"role":"user","content":"x"},{"role":"assistant","content":"","tool_calls":[)"
        R"({"id":"t1","type":"function","function":{"name":"f","arguments":{"q":"a"}}},{"id":"t2","type":"function","function":{"name":"f","arguments":{"q":"b"}}}]},)"
        R"({"role":"tool","tool_call_id":"t1","content":"A"},{"role":"tool","tool_call_id":"t2","content":"Error: B1\nB2"}])");
}

// ---- fuzz: mutated requests never crash a parser and always get a defined answer

static uint64_t fuzz_rng = 0x243F6A8885A308D3ull;
static uint32_t fuzz_next() { fuzz_rng ^= fuzz_rng << 13; fuzz_rng ^= fuzz_rng >> 7; fuzz_rng ^= fuzz_rng << 17; return (uint32_t)fuzz_rng; }
static std::string mutate(std::string s) {
    int n = 1 + fuzz_next() % 4;
    static const char pool[] = "\r\n:; ,\t\"{}[]\\0aZ~\x80\xff\xc3";
    for (int k = 0; k < n && !s.empty(); k++) {
        size_t at = fuzz_next() % s.size();
        switch (fuzz_next() % 4) {
            case 0: s[at] = (char)(fuzz_next() & 0xFF); break;
            case 1: s.insert(at, 1, pool[fuzz_next() % (sizeof pool - 1)]); break;
            case 2: s.erase(at, 1 + fuzz_next() % 3); break;
            case 3: s.insert(at, s.substr(fuzz_next() % s.size(), fuzz_next() % 16)); break;
        }
    }
    return s;
}

// the request memory budget (serve.h): net bytes allocated on this thread, frees counted
// back; past it ServeOverBudget (a std::bad_alloc); nothing is counted outside a scope
TEST(RequestMemory, BudgetCountsNetAllocations) {
    {
        ServeMemScope budget(1 << 20);
        std::vector<char> a(600 << 10);
        EXPECT_THROW(std::vector<char>(600 << 10), ServeOverBudget);
        std::vector<char>().swap(a);
        std::vector<char> b(900 << 10);  // fits once a is freed
        EXPECT_GE(t_serve_mem_peak, 900 << 10);
        std::vector<char>().swap(b);
        // a parse that would pass the budget stops there, whatever it was building
        std::string arr = "[" + std::string(200000, '0');
        for (size_t k = 2; k < arr.size(); k += 2) arr[k] = ',';
        arr += "]";
        Json j; std::string err;
        EXPECT_THROW(json_parse(arr, &j, &err), ServeOverBudget);
    }
    std::vector<char> big(8 << 20);  // no scope, no budget
    EXPECT_EQ(t_serve_mem_limit, -1);
}

TEST(Fuzz, HttpHeadAndChunked) {
    const std::string seeds[] = {
        "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nExpect: 100-continue\r\n\r\n",
        "GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        "POST /v1/messages HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    };
    for (int it = 0; it < 30000; it++) {
        std::string s = mutate(seeds[it % 3]);
        HttpRequest rq;
        long r = http_parse_head(s.data(), s.size(), limits(), &rq);
        ASSERT_TRUE(r == 0 || r == -400 || r == -413 || r == -417 || r == -501 || r == -505 || (r > 0 && (size_t)r <= s.size())) << r;
        if (r > 0) { EXPECT_FALSE(rq.chunked && rq.content_length >= 0); }
    }
    const std::string body = "5\r\nhello\r\n3;x=y\r\nabc\r\n0\r\nT: v\r\n\r\n";
    for (int it = 0; it < 30000; it++) {
        std::string s = mutate(body), out; size_t used = 0;
        int r = chunked_all(s, 1 + fuzz_next() % 8, &out, &used);
        ASSERT_TRUE(r == 0 || r == 1 || r == -400 || r == -413);
        ASSERT_LE(used, s.size());
        ASSERT_LE(out.size(), 1000u);
    }
}

TEST(Fuzz, ApiParsers) {
    const std::string seeds[] = {
        R"({"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":null,"reasoning_content":"r","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"stop":["a"],"temperature":0.5,"stream":true,"stream_options":{"include_usage":true},"chat_template_kwargs":{"enable_thinking":false},"logit_bias":{"1":2}})",
        R"({"model":"m","max_tokens":5,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"thinking","thinking":"t"},{"type":"tool_use","id":"u","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"u","content":"r","is_error":true}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"thinking":{"type":"enabled","budget_tokens":10},"stop_sequences":["x"]})",
    };
    ApiContext ctx; ctx.model_id = "m";
    int parsed = 0, accepted = 0;
    for (int it = 0; it < 20000; it++) {
        std::string s = mutate(seeds[it % 2]);
        Json j; std::string err;
        if (!json_parse(s, &j, &err)) continue;
        parsed++;
        ApiRequest r; ServeError e;
        bool ok = (it % 2 == 0) ? openai_chat_parse(j, ctx, &r, &e) : anthropic_parse(j, ctx, it % 4 == 3, &r, &e);
        if (ok) { accepted++; EXPECT_TRUE(r.chat.messages.is_array()); }
        else { EXPECT_GE(e.status, 400); EXPECT_FALSE(e.message.empty()); EXPECT_TRUE(utf8_valid(e.message.data(), e.message.size())); }
    }
    EXPECT_GT(parsed, 1000);
    EXPECT_GT(accepted, 100);
}
