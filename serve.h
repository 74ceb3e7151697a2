// serve.h: ninfer-serve, an http/1.1 server speaking openai chat completions, responses and
// legacy completions, and anthropic messages over plain posix sockets. it parses and validates requests, queues them for one
// engine thread, and streams what the engine produces back as json or server-sent events.
//
// defines:
//   engine interface: ServeChat, ServePrompt, ServeSampling, ServeLogprob, ServeEvent,
//                     ServeSink, ServeResult, ServeError, ServeEngine, ServeBackend
//   options:          ServeOptions, serve_parse_args, serve_check_features, serve_usage
//   http:             HttpLimits, HttpRequest, http_line_plausible, http_parse_head, ChunkedDecoder,
//                     chunked_feed, http_status_text
//   output:           utf8_take (hold back a split code point), sse_data, sse_event
//   memory:           the global operator new / delete, ServeOverBudget, ServeMemScope (a
//                     thread's allocation budget for one request), serve_request_budget
//   apis:             ApiRequest, openai_chat_parse, anthropic_parse (json -> ServeChat; every
//                     field used or refused by name), api_check_schema, completions_parse,
//                     responses_parse, the responses store (RespStore)
//   server:           serve_main
//
// depends only on the c/c++ standard library, posix sockets / pthreads, format.h (Json) and
// grammar.h (structured output: schemas are compiled here, so a bad one is a 400 naming the keyword).
// it never includes ninfer.cu or tokenizer.h: ninfer.cu implements ServeEngine and calls
// serve_main from its main when argv[0] is ninfer-serve.
//
// the shape of the server (see shared/docs/server.md for the checklist it follows):
//   - the main thread accepts; one detached thread per connection reads requests, answers
//     /health and /v1/models itself, and tokenizes chat requests (ServeEngine.prepare, or
//     prepare_text for completion prompts; concurrently, each under a memory budget: the request memory section);
//   - before any of that, serve_origin_refused turns away what a browser page could send a
//     local server: a foreign Host (dns rebinding) on a keyless loopback server, a foreign
//     Origin without --cors; POST bodies must be application/json;
//   - --max-concurrency engine threads take queued requests in fifo order, each running one
//     at a time through ServeEngine.generate (the engine interleaves the ones running)
//     (ServeEngine.generate); the queue is bounded (--max-pending-requests, 429 when full)
//     and a request that waits longer than --pending-timeout-ms gets 503;
//   - events flow engine -> connection thread through the job (one mutex for all jobs);
//     the connection thread writes them and polls its socket: a client that goes away sets
//     the job's cancel flag, which the engine reads at the next token;
//   - stop strings, the reasoning/content split and tool-call parsing are the engine's job
//     (tokenizer.h's output parser, reference-engine.md 10): only the engine knows token
//     boundaries, so only it can stop at the right token and count usage exactly. serve.h
//     still never emits a broken code point: a multi-byte sequence split across events is
//     held back per channel until it completes (utf8_take), and ill-formed bytes become
//     U+FFFD, so json output is always valid utf-8 whatever the engine sends.
//
// behaviour contract: stdout stays empty; stderr carries one "listening" line, one line per
// request (no prompt or output text), periodic stats, and errors. exit 0 after a signal.
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <limits.h>
#include <errno.h>
#include <time.h>
#include <signal.h>
#include <fcntl.h>
#include <unistd.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <strings.h>
#include <string>
#include <vector>
#include <deque>
#include <memory>
#include <mutex>
#include <atomic>
#include <condition_variable>
#include <algorithm>
#include <list>
#include <unordered_map>
#include <chrono>
#include <new>
#include <cstddef>
#include <malloc.h>
#include "format.h"
#include "grammar.h"

// ----------------------------------------------------------------------------
// engine interface: what ninfer.cu (or test/serve_fake.cc) implements

// one chat request, validated, in openai shape (anthropic requests are converted to this):
//   messages: [{role: system|developer|user|assistant|tool,
//               content: string | [{type:"text",text} | {type:"image_url",image_url:{url}} | ...] | null,
//               reasoning_content?: string (assistant), tool_calls?: [{id, type:"function",
//               function:{name, arguments?: {...}}}] (assistant; arguments is the json object
//               itself, as the template iterates it: the openai parser decodes the text openai
//               clients send, anthropic's tool_use.input is one already),
//               tool_call_id: string (tool)}]
//   tools:    null, or [{type:"function", function:{name, description?, parameters}}]
struct ServeChat {
    Json messages;
    Json tools;                    // null when the request declares none
    bool enable_thinking = true;   // false renders the non-thinking prompt
    bool preserve_thinking = false;// keep closed-turn reasoning in history
    std::string reasoning_effort;  // "" unless the client asked for one (never "none": that is enable_thinking=false)
};

// what prepare makes and generate consumes. serve.h reads only tokens.size() (usage, context
// check); the rest is the engine's.
struct ServePrompt {
    std::vector<int> tokens;       // the rendered, tokenized prompt
    bool thinking = true;          // the prompt opens a <think> block: output starts on the reasoning channel
    bool tools = false;            // tools were declared: parse tool calls
    bool raw = false;              // a completion (/v1/completions): no template; the output is
                                   // plain content text (no reasoning, no tool calls, only the stop strings)
    std::shared_ptr<void> media;   // the engine's own: the request's preprocessed media (never read here)
    int reuse_boundary = -1;       // the engine's own: the token index where the state is worth keeping
                                   // for a later request (a template boundary; -1: none)
    bool reuse_replay = false;     // the engine's own: keep the state after the response as well
};

// sampler and limits for one request, already resolved (engine preset < flags < request <
// --greedy) and range-checked
struct ServeSampling {
    int max_tokens = 0;            // output limit, > 0 (0 only with prompt_logprobs), already clamped to the context left
    float temperature = 0.6f;      // <= 0: argmax
    float top_p = 0.95f;
    int top_k = 20;                // <= 0: no limit
    float min_p = 0.0f;
    float presence_penalty = 1.0f;
    float frequency_penalty = 0.0f;
    uint64_t seed = 0;
    std::vector<std::pair<int, float>> logit_bias;  // (token id, bias in [-100, 100])
    std::vector<std::string> stop; // content-channel stop strings: generation ends at the
                                   // earliest match, the match is not emitted
    int logprobs = -1;             // >= 0: a SERVE_LOGPROB event for every generated token with
                                   // this many alternatives (<= 20); -1: none
    bool prompt_logprobs = false;  // (with logprobs >= 0) also score the prompt: SERVE_PROMPT_LOGPROBS
                                   // events for prompt tokens 1.. before any output. max_tokens may
                                   // be 0 then (score only)
    std::shared_ptr<const Grammar> grammar;  // structured output: the answer (after the reasoning)
                                   // is constrained to it; the engine ends generation when it is
                                   // complete (finish "stop", or "tool_calls" for a forced call) and
                                   // reports "length" when a limit ends it inside. null: free text
};

// the kinds 0-2 have the values of tokenizer.h's OUT_REASONING / OUT_CONTENT / OUT_TOOL_CALL
enum ServeEventKind { SERVE_REASONING = 0, SERVE_CONTENT = 1, SERVE_TOOL_CALL = 2, SERVE_LOGPROB = 3, SERVE_PROMPT_LOGPROBS = 4 };
// one token's log-probability: log softmax of the model's raw logits (before temperature,
// penalties and bias) over every vocabulary row, and the most likely alternatives among the
// ids the tokenizer can produce, best first (ties: the lower id)
struct ServeLogprob {
    int id = -1;
    float logprob = 0;
    ServeEventKind channel = SERVE_CONTENT;  // generated tokens: the channel the token's text starts in
    std::vector<std::pair<int, float>> top;  // (id, logprob), ServeSampling.logprobs of them
};
struct ServeEvent {
    ServeEventKind kind = SERVE_CONTENT;
    std::string text;              // REASONING / CONTENT: the next bytes of that channel
    std::string tool_name;         // TOOL_CALL: one complete call
    std::string tool_args;         // TOOL_CALL: its arguments, a json object as text
    std::vector<ServeLogprob> logprobs;  // LOGPROB: the token about to be emitted (before its
                                   // text's events; for a raw prompt also a stop id that ended it);
                                   // PROMPT_LOGPROBS: the next prompt tokens in order
};

// how generate talks back. both functions are called on the engine thread only.
struct ServeSink {
    bool (*emit)(void* ctx, const ServeEvent& ev);  // false: the client is gone, stop now
    bool (*cancelled)(void* ctx);  // poll once per token (and per prefill chunk): true = stop now
    void* ctx;
};

// speculative decoding of one generation: NInfer's field names (reference-engine.md 12);
// backend "" = none ran. usage.speculative and the request log carry it.
struct ServeSpecStats {
    std::string backend;           // "mtp"
    int draft_window = 0;          // --draft-tokens
    long rounds = 0, drafted_tokens = 0, accepted_tokens = 0;
    long fallback_steps = 0;       // one-token steps (no room for a round near the context end)
    std::vector<long> accepted_per_position;  // [draft_window]: rounds whose draft k was accepted
};

struct ServeResult {
    std::string finish = "stop";   // "stop" (eos, stop string, cancel) | "length" (max_tokens or
                                   // context full) | "tool_calls"
    std::string stop_string;       // the stop string that ended generation; "" if none
    int prompt_tokens = 0;         // = prompt.tokens.size(); serve.h sets it before generate
    int completion_tokens = 0;     // every sampled id, a withheld stop token included
    int reasoning_tokens = 0;      // of them, the ids whose text started on the reasoning channel
    int cached_tokens = 0;         // prompt tokens continued from a retained prefix instead of prefilled
    std::string cache;             // where that prefix's state came from: "device" | "host" | "miss" (none
                                   // matched) | "off" (--no-prefix-reuse, or a prompt that reuses nothing); "" unknown
    double prefill_s = 0, decode_s = 0;
    ServeSpecStats speculative;
    std::string error;             // non-empty: generation failed (500, or an sse error event)
};

// the speculative object of usage (and, with fallback_steps, of the request log)
static Json serve_spec_json(const ServeSpecStats& s, bool log) {
    Json o = Json::object();
    o.set("backend", Json::string(s.backend));
    o.set("draft_window", Json::integer(s.draft_window));
    o.set("rounds", Json::integer(s.rounds));
    o.set("drafted_tokens", Json::integer(s.drafted_tokens));
    o.set("accepted_tokens", Json::integer(s.accepted_tokens));
    if (log) o.set("fallback_steps", Json::integer(s.fallback_steps));
    Json a = Json::array();
    for (long v : s.accepted_per_position) a.push(Json::integer(v));
    o.set("accepted_per_position", a);
    return o;
}

// openai's usage.prompt_tokens_details: the prompt tokens continued from a retained prefix
// (input_tokens stays the whole prompt in every api, as count_tokens counts it; anthropic's
// cache_read_input_tokens and the responses api's cached_tokens carry the same number)
static Json serve_cached_json(const ServeResult& r) {
    Json d = Json::object();
    d.set("cached_tokens", Json::integer(r.cached_tokens));
    return d;
}

// a request the engine or the parser refuses: status, openai-style code, a fixed message
// (never user bytes), the offending field
struct ServeError {
    int status = 400;
    std::string code = "invalid_request_error";
    std::string message;
    std::string param;
};

struct ServeEngine {
    void* self = nullptr;
    std::string model_id;          // the artifact's identity model id: the default --model-id
    int max_context = 0;           // tokens; prompt + output must fit
    int n_vocab = 0;               // logit_bias and prompt ids must be below it (0: not checked)
    bool vision = false;           // image / video parts accepted (else 400 vision_disabled)
    ServeSampling defaults;        // the model's sampler preset (max_tokens and stop unused)
    // render and tokenize a chat. runs on the connection threads (requests and count_tokens),
    // several at once and while generate runs on the engine thread: it must be thread-safe.
    // it may throw std::bad_alloc (the request's memory budget; serve.h answers 413 or 503).
    // bad input: false and *err (status 400, a code such as unsupported_role,
    // reasoning_effort_not_supported, a one-line message).
    bool (*prepare)(void* self, const ServeChat& chat, ServePrompt* out, ServeError* err) = nullptr;
    // tokenize a completion prompt as it is (no template; out->raw = true), prepare's rules
    bool (*prepare_text)(void* self, const std::string& text, ServePrompt* out, ServeError* err) = nullptr;
    // the raw bytes of one token (possibly part of a utf-8 sequence), for logprobs and echo
    std::string (*token_bytes)(void* self, int id) = nullptr;
    bool logprobs = false;         // generate honours ServeSampling.logprobs (else 400)
    bool structured = false;       // generate honours ServeSampling.grammar (else 400)
    // generate on an engine thread (up to --max-concurrency at once, each with its own request:
    // the engine takes them in turns): emit reasoning / content / tool calls through the sink,
    // stop at eos, a stop string, max_tokens, the context end, or when the sink says so, and
    // fill *out.
    void (*generate)(void* self, const ServePrompt& prompt, const ServeSampling& s,
                     const ServeSink& sink, ServeResult* out) = nullptr;
    void (*close)(void* self) = nullptr;  // optional, at exit
    // optional: the engine's figures since its last call (" key=value" pairs), appended to the
    // stats line; any thread, with the server's lock held (it must not take that lock)
    std::string (*stats)(void* self) = nullptr;
};

struct ServeOptions;
// what serve_main needs from the binary that embeds it
struct ServeBackend {
    // is the feature behind a flag built? called before loading, with the flag and its value
    // as typed: "--spec mtp", "--spec dflash", "--lm-head-draft", "--vision", "--kv-dtype int8",
    // "--kv-dtype fp8", "--kv-capacity", "--preserve-thinking", "--default-thinking-budget",
    // "--context-cost-presets", "--media-cache-mib", "--media-live-mib",
    // "--media-preprocess-threads", "--device-state-slots", "--host-state-slots",
    // "--host-kv-mib", "--max-private-continuations", "--max-shared-prefixes",
    // "--max-long-anchors-per-continuation", "--max-cache-markers-per-request".
    // false -> "ninfer-serve: error: <feature> is not supported yet", exit 1.
    bool (*supports)(const char* feature);
    // load the model (may take long); nullptr and *err on failure
    ServeEngine* (*load)(const char* model_path, const ServeOptions& opt, std::string* err);
};

// ----------------------------------------------------------------------------
// options: NInfer's server flags (reference-engine.md 3.1 and 3.2), plus a few of ours for
// the http layer (timeouts, connection cap), marked "ninfer" in the usage text

struct ServeOptions {
    std::string model_path;
    std::string host = "127.0.0.1";
    int port = 8080;                 // 0: an ephemeral port (printed on the listening line)
    std::string api_key;             // "" = no auth
    std::string model_id;            // "" = the artifact's model id
    int max_context = 8192;
    int prefill_chunk = 1024;        // positive multiple of 128
    int device = 0;
    int max_request_mib = 384;       // body limit, checked before json parsing
    std::string request_log_jsonl;   // "" = off
    std::string kv_dtype = "bf16";   // bf16 | int8 | fp8
    std::string spec;                // "" | mtp | dflash
    int draft_tokens = 0;            // required with --spec
    bool lm_head_draft = false;
    int default_max_tokens = 8192;
    bool vision = false, no_cuda_graph = false, no_prefix_reuse = false, no_thinking = false;
    bool cors = false, greedy = false, preserve_thinking = false;
    // sampler flags; NAN / INT_MIN / has_seed=false when not given (then the engine preset)
    double temperature = NAN, top_p = NAN, min_p = NAN, presence_penalty = NAN, frequency_penalty = NAN;
    int top_k = INT_MIN;
    bool has_seed = false;
    uint64_t seed = 0;
    // v2 capacity and media flags; kept as typed, the engine reads them
    std::string kv_capacity;         // "" = max-context, N or auto
    int max_concurrency = 1;
    int max_pending_requests = 16;
    int pending_timeout_ms = 30000;
    int log_stats_interval_ms = 5000;  // 0 = off
    std::string context_cost_presets;
    int media_cache_mib = 1024, media_live_mib = 2048, media_preprocess_threads = 0;
    int response_store_max_records = 1024, response_store_max_mib = 256;
    int default_thinking_budget = -1;
    int device_state_slots = -1, host_state_slots = 8, host_kv_mib = 8192;
    int max_private_continuations = -1, max_shared_prefixes = -1;
    int max_long_anchors_per_continuation = 2, max_cache_markers_per_request = 4;
    // ninfer's http layer
    int read_timeout_ms = 10000;     // a request's head must arrive within this; its body at >= 1 MiB/s after it
    int idle_timeout_ms = 5000;      // keep-alive: time allowed between requests
    int write_timeout_ms = 30000;    // a blocked write (slow reader) longer than this drops the client
    int drain_timeout_ms = 10000;    // on SIGINT/SIGTERM: time given to running requests
    int max_connections = 256;       // more are answered 503 and closed
    std::vector<std::string> allowed_hosts;  // Host names accepted besides the loopback ones (--allowed-hosts)
    std::vector<std::string> given;  // every flag given, as typed (without values)
    bool has(const char* flag) const {
        for (const auto& g : given) if (g == flag) return true;
        return false;
    }
};

static void serve_usage(FILE* f) {
    fprintf(f,
        "usage: ninfer-serve MODEL.ninfer [options]\n"
        "\n"
        "http:\n"
        "  --host H                      bind address (127.0.0.1; 0.0.0.0 to expose)\n"
        "  --port N                      port, 1..65535 (8080; 0 = any free port, printed at start)\n"
        "  --api-key KEY                 require 'Authorization: Bearer KEY' or 'x-api-key: KEY' (off)\n"
        "  --model-id ID                 public model id; openai requests must name it (the artifact's)\n"
        "  --cors                        allow browsers: Access-Control-Allow-* headers, OPTIONS 204 (off:\n"
        "                                requests with a foreign Origin get 403)\n"
        "  --max-request-mib N           request body limit, 413 above it (384); preparing a request may\n"
        "                                hold 6x its body + 16 MiB more, 413 past that\n"
        "  --max-concurrency N           requests generating at once, 1..64 (1), a lane each: their decode\n"
        "                                tokens batched into one step, a --prefill-chunk piece between steps\n"
        "  --max-pending-requests N      queued requests beyond the running ones, 429 above (16)\n"
        "  --pending-timeout-ms N        a queued request waits at most this, then 503 (30000)\n"
        "  --request-log-jsonl FILE      append structured request events to FILE (off)\n"
        "  --log-stats-interval-ms N     stats line on stderr while busy, 0 = off (5000)\n"
        "  --read-timeout-ms N           ninfer: request head deadline; body at >= 1 MiB/s after it (10000)\n"
        "  --idle-timeout-ms N           ninfer: keep-alive idle time between requests (5000)\n"
        "  --write-timeout-ms N          ninfer: a write blocked this long drops the client (30000)\n"
        "  --drain-timeout-ms N          ninfer: on SIGINT/SIGTERM, time for running requests (10000)\n"
        "  --max-connections N           ninfer: open connections; more get 503 (256)\n"
        "  --allowed-hosts H1,H2         ninfer: Host names accepted besides localhost / 127.0.0.1 / [::1] when\n"
        "                                the server is keyless on loopback (there other Hosts get 403: dns rebinding)\n"
        "model and memory:\n"
        "  --max-context N               context capacity in tokens (8192)\n"
        "  --prefill-chunk N             prefill chunk, a positive multiple of 128 (1024)\n"
        "  --device N                    cuda device (0)\n"
        "  --kv-dtype bf16|int8|fp8      kv cache storage (bf16)\n"
        "  --kv-capacity N|auto          kv pool in tokens (= max-context), shared by the lanes in pages\n"
        "  --spec mtp|dflash             speculative decoding (off); needs --draft-tokens\n"
        "  --draft-tokens N              draft window: mtp 1..5, dflash 1..15\n"
        "  --lm-head-draft               the reduced proposal head for drafts (off; needs --spec)\n"
        "  --vision                      load the vision tower, accept images and video (off)\n"
        "  --no-cuda-graph               eager decode (graphs on)\n"
        "  --no-prefix-reuse             never continue a request from a retained prefix (reuse on; cannot\n"
        "                                be combined with the cache capacity flags)\n"
        "  --device-state-slots N        retained prefix states on the device (= max-concurrency)\n"
        "  --host-state-slots N          pinned host states the device ones spill to (8)\n"
        "  --host-kv-mib N               pinned host memory for retained prefixes' kv rows (8192)\n"
        "  --max-private-continuations N, --max-shared-prefixes N,\n"
        "  --max-long-anchors-per-continuation N (2), --max-cache-markers-per-request N (4)\n"
        "                                NInfer's planner capacities (not supported yet)\n"
        "  --context-cost-presets FILE, --media-cache-mib N (1024), --media-live-mib N (2048),\n"
        "  --media-preprocess-threads N (0 = auto)\n"
        "  --response-store-max-records N  /v1/responses kept for previous_response_id and GET, least\n"
        "                                recently used out first; 0 = none (1024)\n"
        "  --response-store-max-mib N    the memory they may take (256)\n"
        "generation defaults (request fields override them unless --greedy):\n"
        "  --default-max-tokens N        output limit when a request gives none (8192)\n"
        "  --no-thinking                 render the non-thinking prompt by default (thinking on)\n"
        "  --preserve-thinking           keep closed-turn reasoning in history (off)\n"
        "  --default-thinking-budget N   reasoning token budget (none)\n"
        "  --greedy                      argmax for every request (off)\n"
        "  --temperature F (0..2), --top-p F (0..1), --top-k N, --min-p F (0..1),\n"
        "  --presence-penalty F (-2..2), --frequency-penalty F (-2..2), --seed N\n"
        "                                sampler defaults (the model's preset; seed: random per request)\n"
        "  -h, --help                    this text\n"
        "\n"
        "endpoints: POST /v1/chat/completions (logprobs, top_logprobs), /v1/responses,\n"
        "/v1/responses/input_tokens, /v1/completions (text or token-id prompt, echo, logprobs),\n"
        "/v1/messages, /v1/messages/count_tokens; GET/DELETE /v1/responses/{id}, GET\n"
        "/v1/responses/{id}/input_items, GET /health, /v1/models, /v1/models/{id}\n");
}

// strict number parsing: the whole string, inside [lo, hi]
static bool serve_parse_long(const char* s, long long lo, long long hi, long long* out) {
    if (!s || !*s) return false;
    char* end = nullptr; errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) return false;
    *out = v; return true;
}
static bool serve_parse_double(const char* s, double lo, double hi, double* out) {
    if (!s || !*s) return false;
    char* end = nullptr; errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= lo && v <= hi)) return false;
    *out = v; return true;
}

// parse argv (argv[0] is the program). returns 0 to go on, 1 on error (*err says why),
// 2 for --help.
static int serve_parse_args(int argc, char** argv, ServeOptions* o, std::string* err) {
    auto fail = [&](const std::string& m) { *err = m; return 1; };
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i], val;
        bool inline_val = false;
        if (a.size() > 2 && a[0] == '-' && a[1] == '-') {  // --flag=value
            size_t eq = a.find('=');
            if (eq != std::string::npos) { val = a.substr(eq + 1); a = a.substr(0, eq); inline_val = true; }
        }
        if (a == "-h" || a == "--help") return 2;
        if (a.size() < 2 || a[0] != '-') {
            if (!o->model_path.empty()) return fail("unexpected argument '" + a + "' (the model path was already given)");
            o->model_path = a;
            continue;
        }
        bool bad_value = false;
        // the next value: inline or the following argument
        auto value = [&](std::string* out) {
            if (inline_val) { *out = val; return true; }
            if (i + 1 >= argc) return false;
            *out = argv[++i]; return true;
        };
        auto s_ = [&](std::string* dst) {
            std::string v;
            if (!value(&v)) { bad_value = true; return; }
            *dst = v;
        };
        auto i_ = [&](int* dst, long long lo, long long hi) {
            std::string v; long long x;
            if (!value(&v) || !serve_parse_long(v.c_str(), lo, hi, &x)) { bad_value = true; return; }
            *dst = (int)x;
        };
        auto f_ = [&](double* dst, double lo, double hi) {
            std::string v;
            if (!value(&v) || !serve_parse_double(v.c_str(), lo, hi, dst)) bad_value = true;
        };
        auto b_ = [&](bool* dst) {
            if (inline_val) { bad_value = true; return; }
            *dst = true;
        };
        const char* range = "";
        if (a == "--host") s_(&o->host);
        else if (a == "--port") { i_(&o->port, 0, 65535); range = " (0..65535)"; }
        else if (a == "--api-key") {
            s_(&o->api_key);
            if (!bad_value && o->api_key.empty()) return fail("--api-key: the key is empty (that would turn authentication off; leave the flag out for no key)");
        }
        else if (a == "--model-id") s_(&o->model_id);
        else if (a == "--max-context") { i_(&o->max_context, 1, 1 << 20); range = " (1..1048576)"; }
        else if (a == "--prefill-chunk") {
            i_(&o->prefill_chunk, 128, 1 << 20); range = " (a positive multiple of 128)";
            if (!bad_value && o->prefill_chunk % 128) bad_value = true;
        }
        else if (a == "--device") { i_(&o->device, 0, 1023); range = " (>= 0)"; }
        else if (a == "--max-request-mib") { i_(&o->max_request_mib, 1, 65536); range = " (1..65536)"; }
        else if (a == "--request-log-jsonl") s_(&o->request_log_jsonl);
        else if (a == "--kv-dtype") {
            s_(&o->kv_dtype); range = " (bf16, int8 or fp8)";
            if (o->kv_dtype != "bf16" && o->kv_dtype != "int8" && o->kv_dtype != "fp8") bad_value = true;
        }
        else if (a == "--spec") {
            s_(&o->spec); range = " (mtp or dflash)";
            if (o->spec != "mtp" && o->spec != "dflash") bad_value = true;
        }
        else if (a == "--draft-tokens") { i_(&o->draft_tokens, 1, 15); range = " (mtp 1..5, dflash 1..15)"; }
        else if (a == "--lm-head-draft") b_(&o->lm_head_draft);
        else if (a == "--default-max-tokens") { i_(&o->default_max_tokens, 1, 1 << 20); range = " (1..1048576)"; }
        else if (a == "--vision") b_(&o->vision);
        else if (a == "--no-cuda-graph") b_(&o->no_cuda_graph);
        else if (a == "--no-prefix-reuse") b_(&o->no_prefix_reuse);
        else if (a == "--no-thinking") b_(&o->no_thinking);
        else if (a == "--cors") b_(&o->cors);
        else if (a == "--greedy") b_(&o->greedy);
        else if (a == "--preserve-thinking") b_(&o->preserve_thinking);
        else if (a == "--temperature") { f_(&o->temperature, 0, 2); range = " (0..2)"; }
        else if (a == "--top-p") { f_(&o->top_p, 0, 1); range = " (0..1)"; }
        else if (a == "--top-k") { i_(&o->top_k, 0, 1 << 20); range = " (>= 0)"; }
        else if (a == "--min-p") { f_(&o->min_p, 0, 1); range = " (0..1)"; }
        else if (a == "--presence-penalty") { f_(&o->presence_penalty, -2, 2); range = " (-2..2)"; }
        else if (a == "--frequency-penalty") { f_(&o->frequency_penalty, -2, 2); range = " (-2..2)"; }
        else if (a == "--seed") {
            std::string v; range = " (an unsigned 64-bit integer)";
            char* end = nullptr;
            if (!value(&v) || v.empty() || v[0] == '-') bad_value = true;
            else { errno = 0; o->seed = strtoull(v.c_str(), &end, 10); if (errno || *end) bad_value = true; o->has_seed = true; }
        }
        else if (a == "--kv-capacity") {
            s_(&o->kv_capacity); range = " (a token count or auto)";
            long long x;
            if (!bad_value && o->kv_capacity != "auto" && !serve_parse_long(o->kv_capacity.c_str(), 1, 1 << 30, &x)) bad_value = true;
        }
        else if (a == "--max-concurrency") { i_(&o->max_concurrency, 1, 64); range = " (1..64)"; }
        else if (a == "--max-pending-requests") { i_(&o->max_pending_requests, 0, 1 << 20); range = " (>= 0)"; }
        else if (a == "--pending-timeout-ms") { i_(&o->pending_timeout_ms, 1, INT_MAX); range = " (>= 1)"; }
        else if (a == "--log-stats-interval-ms") { i_(&o->log_stats_interval_ms, 0, INT_MAX); range = " (>= 0)"; }
        else if (a == "--context-cost-presets") s_(&o->context_cost_presets);
        else if (a == "--media-cache-mib") { i_(&o->media_cache_mib, 0, 1 << 30); range = " (>= 0)"; }
        else if (a == "--media-live-mib") { i_(&o->media_live_mib, 0, 1 << 30); range = " (>= 0)"; }
        else if (a == "--media-preprocess-threads") { i_(&o->media_preprocess_threads, 0, 16); range = " (0..16)"; }
        else if (a == "--response-store-max-records") { i_(&o->response_store_max_records, 0, 1 << 30); range = " (>= 0)"; }
        else if (a == "--response-store-max-mib") { i_(&o->response_store_max_mib, 0, 1 << 30); range = " (>= 0)"; }
        else if (a == "--default-thinking-budget") { i_(&o->default_thinking_budget, 1, 1 << 30); range = " (>= 1)"; }
        else if (a == "--device-state-slots") { i_(&o->device_state_slots, 0, 1 << 16); range = " (>= 0)"; }
        else if (a == "--host-state-slots") { i_(&o->host_state_slots, 0, 1 << 16); range = " (>= 0)"; }
        else if (a == "--host-kv-mib") { i_(&o->host_kv_mib, 0, 1 << 30); range = " (>= 0)"; }
        else if (a == "--max-private-continuations") { i_(&o->max_private_continuations, 0, 1 << 16); range = " (>= 0)"; }
        else if (a == "--max-shared-prefixes") { i_(&o->max_shared_prefixes, 0, 1 << 16); range = " (>= 0)"; }
        else if (a == "--max-long-anchors-per-continuation") { i_(&o->max_long_anchors_per_continuation, 0, 1 << 16); range = " (>= 0)"; }
        else if (a == "--max-cache-markers-per-request") { i_(&o->max_cache_markers_per_request, 0, 1 << 16); range = " (>= 0)"; }
        else if (a == "--read-timeout-ms") { i_(&o->read_timeout_ms, 1, INT_MAX); range = " (>= 1)"; }
        else if (a == "--idle-timeout-ms") { i_(&o->idle_timeout_ms, 1, INT_MAX); range = " (>= 1)"; }
        else if (a == "--write-timeout-ms") { i_(&o->write_timeout_ms, 1, INT_MAX); range = " (>= 1)"; }
        else if (a == "--drain-timeout-ms") { i_(&o->drain_timeout_ms, 0, INT_MAX); range = " (>= 0)"; }
        else if (a == "--max-connections") { i_(&o->max_connections, 1, 1 << 16); range = " (>= 1)"; }
        else if (a == "--allowed-hosts") {
            std::string v; range = " (a comma-separated list of host names)";
            if (!value(&v)) bad_value = true;
            else
                for (size_t a0 = 0; a0 <= v.size();) {
                    size_t c = std::min(v.find(',', a0), v.size());
                    std::string h;
                    for (char ch : v.substr(a0, c - a0)) if (ch != ' ' && ch != '\t') h.push_back(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
                    if (!h.empty()) o->allowed_hosts.push_back(h);
                    a0 = c + 1;
                }
            if (!bad_value && o->allowed_hosts.empty()) bad_value = true;
        }
        else return fail("unknown option '" + a + "' (ninfer-serve --help lists them)");
        if (bad_value) return fail((a == "--lm-head-draft" || a == "--vision" || a == "--no-cuda-graph" ||
                                    a == "--no-prefix-reuse" || a == "--no-thinking" || a == "--cors" ||
                                    a == "--greedy" || a == "--preserve-thinking")
                                   ? a + " takes no value" : "missing or bad value for " + a + range);
        o->given.push_back(a);
    }
    if (o->model_path.empty()) return fail("no model given (usage: ninfer-serve MODEL.ninfer [options])");
    // combinations
    if (!o->spec.empty() && !o->has("--draft-tokens")) return fail("--spec " + o->spec + " needs --draft-tokens");
    if (o->spec.empty() && o->has("--draft-tokens")) return fail("--draft-tokens needs --spec");
    if (o->spec == "mtp" && o->draft_tokens > 5) return fail("--draft-tokens for --spec mtp is 1..5");
    if (o->spec.empty() && o->lm_head_draft) return fail("--lm-head-draft needs --spec");
    if (o->spec == "dflash" && o->vision) return fail("--spec dflash cannot be combined with --vision");
    static const char* const cache_flags[] = {"--device-state-slots", "--host-state-slots", "--host-kv-mib",
        "--max-private-continuations", "--max-shared-prefixes", "--max-long-anchors-per-continuation",
        "--max-cache-markers-per-request"};
    if (o->no_prefix_reuse)
        for (const char* f : cache_flags)
            if (o->has(f)) return fail(std::string("--no-prefix-reuse cannot be combined with ") + f);
    return 0;
}

// every flag whose feature lives in the engine is checked with the backend before loading;
// features the server itself lacks are refused here. returns false with *err naming the
// first one that is not built.
static bool serve_check_features(const ServeOptions& o, bool (*supports)(const char*), std::string* err) {
    std::vector<std::string> feats;
    if (o.max_concurrency > 1) feats.push_back("--max-concurrency");
    if (!o.spec.empty()) feats.push_back("--spec " + o.spec);
    if (o.lm_head_draft) feats.push_back("--lm-head-draft");
    if (o.vision) feats.push_back("--vision");
    if (o.kv_dtype != "bf16") feats.push_back("--kv-dtype " + o.kv_dtype);
    if (!o.kv_capacity.empty() && o.kv_capacity != std::to_string(o.max_context)) feats.push_back("--kv-capacity");
    if (o.preserve_thinking) feats.push_back("--preserve-thinking");
    for (const char* f : {"--default-thinking-budget", "--context-cost-presets", "--media-cache-mib",
                          "--media-live-mib", "--media-preprocess-threads", "--device-state-slots",
                          "--host-state-slots", "--host-kv-mib", "--max-private-continuations",
                          "--max-shared-prefixes", "--max-long-anchors-per-continuation",
                          "--max-cache-markers-per-request"})
        if (o.has(f)) feats.push_back(f);
    for (const auto& f : feats)
        if (!supports || !supports(f.c_str())) { *err = f + " is not supported yet"; return false; }
    return true;
}

// ----------------------------------------------------------------------------
// http/1.1 request parsing, as pure functions over bytes (test/test_serve.cc feeds them
// byte streams). strict where leniency enables request smuggling: both framings at once,
// odd content-length values, obs-fold, whitespace before a colon, a bare cr.

struct HttpLimits {
    size_t max_head = 64 << 10;    // request line + headers, bytes
    int max_headers = 100;
    uint64_t max_body = 384ull << 20;
};

struct HttpRequest {
    std::string method, target, path, query;
    int minor = 1;                 // HTTP/1.minor
    std::vector<std::pair<std::string, std::string>> headers;  // names lowercased, values trimmed
    int64_t content_length = -1;   // -1: none
    bool chunked = false;
    bool keep_alive = true;
    bool expect_continue = false;
    const std::string* header(const char* name) const {
        for (const auto& h : headers) if (h.first == name) return &h.second;
        return nullptr;
    }
};

static inline bool http_tchar(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || (c && strchr("!#$%&'*+-.^_`|~", c));
}
static inline std::string http_lower(std::string s) {
    for (auto& c : s) if (c >= 'A' && c <= 'Z') c += 32;
    return s;
}
static inline std::string http_trim(const std::string& s) {
    size_t a = 0, b = s.size();
    while (a < b && (s[a] == ' ' || s[a] == '\t')) a++;
    while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t')) b--;
    return s.substr(a, b - a);
}
// split a comma list into lowercased trimmed non-empty tokens
static std::vector<std::string> http_list(const std::string& v) {
    std::vector<std::string> out;
    size_t s = 0;
    for (;;) {
        size_t c = v.find(',', s);
        std::string t = http_lower(http_trim(v.substr(s, c == std::string::npos ? std::string::npos : c - s)));
        if (!t.empty()) out.push_back(t);
        if (c == std::string::npos) break;
        s = c + 1;
    }
    return out;
}

// can buf[0..n), the start of a request line (complete or not), still become "METHOD SP
// target SP HTTP/d.d"? a tls handshake or other binary fails at its first byte, so it is
// answered at once instead of after the read timeout.
static bool http_line_plausible(const char* buf, size_t n) {
    size_t i = 0;
    while (i < n && i <= 20 && http_tchar((unsigned char)buf[i])) i++;  // the method
    if (i == n) return i <= 20;
    if (i == 0 || buf[i] != ' ') return false;
    i++;
    size_t t = i;
    while (i < n && (unsigned char)buf[i] > 0x20 && (unsigned char)buf[i] < 0x7f) i++;  // the target
    if (i == n) return true;
    if (i == t || buf[i] != ' ') return false;
    static const char ver[] = "HTTP/d.d";
    i++;  // past the space
    for (size_t k = 0; k < 8; k++, i++) {
        if (i == n) return true;
        char c = buf[i];
        if (ver[k] == 'd' ? !(c >= '0' && c <= '9') : c != ver[k]) return false;
    }
    if (i == n) return true;
    if (buf[i] == '\r' && ++i == n) return true;
    return buf[i] == '\n';
}

// parse the head of one request in buf[0..n). returns its length (> 0) once complete, 0 when
// more bytes are needed, or -status: 400 (malformed, conflicting framing, a first line that
// cannot be a request line even unfinished), 413 (head too
// large, too many headers, body over the limit), 417 (unknown expectation), 501 (a
// transfer coding other than chunked), 505 (not http/1.x). empty lines before the request
// line are skipped (and counted in the length).
static long http_parse_head(const char* buf, size_t n, const HttpLimits& lim, HttpRequest* rq) {
    size_t p = 0;
    while (p < n && (buf[p] == '\r' || buf[p] == '\n')) {  // stray crlf between requests
        if (buf[p] == '\r' && p + 1 < n && buf[p + 1] != '\n') return -400;
        p++;
        if (p > lim.max_head) return -413;
    }
    size_t start = p;
    {
        const void* nl = memchr(buf + start, '\n', n - start);
        size_t le = nl ? (const char*)nl - buf + 1 : n;
        if (!http_line_plausible(buf + start, le - start)) return -400;
    }
    // find the end of the head: an empty line
    size_t end = 0;
    {
        size_t q = start;
        for (;;) {
            const void* nl = memchr(buf + q, '\n', n - q);
            if (!nl) { if (n - start > lim.max_head) return -413; return 0; }
            size_t e = (const char*)nl - buf;
            size_t len = e - q;
            if (len == 0 || (len == 1 && buf[q] == '\r')) { end = e + 1; break; }
            q = e + 1;
            if (q - start > lim.max_head) return -413;
        }
        if (end - start > lim.max_head) return -413;
    }
    *rq = HttpRequest();
    // split into lines (crlf or lf); a bare cr, a nul or another control byte is malformed
    std::vector<std::string> lines;
    size_t q = start;
    while (q < end) {
        size_t e = (const char*)memchr(buf + q, '\n', end - q) - buf;
        size_t le = e;
        if (le > q && buf[le - 1] == '\r') le--;
        std::string line(buf + q, le - q);
        for (unsigned char c : line) if ((c < 0x20 && c != '\t') || c == 0x7f) return -400;
        lines.push_back(line);
        q = e + 1;
    }
    lines.pop_back();  // the empty line
    if (lines.empty()) return -400;
    // request line: METHOD SP target SP HTTP/1.x
    const std::string& rl = lines[0];
    size_t s1 = rl.find(' '), s2 = s1 == std::string::npos ? s1 : rl.find(' ', s1 + 1);
    if (s1 == std::string::npos || s2 == std::string::npos || rl.find(' ', s2 + 1) != std::string::npos) return -400;
    rq->method = rl.substr(0, s1);
    rq->target = rl.substr(s1 + 1, s2 - s1 - 1);
    std::string ver = rl.substr(s2 + 1);
    if (rq->method.empty() || rq->target.empty()) return -400;
    for (unsigned char c : rq->method) if (!http_tchar(c)) return -400;
    for (unsigned char c : rq->target) if (c <= 0x20 || c >= 0x7f) return -400;
    if (ver.size() != 8 || ver.compare(0, 5, "HTTP/") || ver[6] != '.' || ver[5] < '0' || ver[5] > '9' || ver[7] < '0' || ver[7] > '9') return -400;
    if (ver[5] != '1') return -505;
    rq->minor = ver[7] - '0';
    if (rq->target[0] == '/') {
        size_t qm = rq->target.find('?');
        rq->path = rq->target.substr(0, qm);
        if (qm != std::string::npos) rq->query = rq->target.substr(qm + 1);
    } else if (rq->target == "*") {
        rq->path = "*";
    } else if (!rq->target.compare(0, 7, "http://") || !rq->target.compare(0, 8, "https://")) {  // absolute-form
        size_t sl = rq->target.find('/', rq->target.find("//") + 2);
        std::string t = sl == std::string::npos ? "/" : rq->target.substr(sl);
        size_t qm = t.find('?');
        rq->path = t.substr(0, qm);
        if (qm != std::string::npos) rq->query = t.substr(qm + 1);
    } else return -400;
    // headers
    if ((int)lines.size() - 1 > lim.max_headers) return -413;
    bool te_seen = false;
    std::vector<std::string> te;
    std::string connection;
    for (size_t k = 1; k < lines.size(); k++) {
        const std::string& l = lines[k];
        if (l[0] == ' ' || l[0] == '\t') return -400;  // obs-fold
        size_t c = l.find(':');
        if (c == std::string::npos || c == 0) return -400;
        for (size_t j = 0; j < c; j++) if (!http_tchar((unsigned char)l[j])) return -400;  // also rejects "name :"
        std::string name = http_lower(l.substr(0, c)), value = http_trim(l.substr(c + 1));
        if (name == "content-length") {
            // "5", or a list of equal values "5, 5"; anything else is malformed
            std::vector<std::string> vals = http_list(value);
            if (vals.empty()) return -400;
            for (const auto& t : vals) {
                if (t.find_first_not_of("0123456789") != std::string::npos) return -400;
                if (t.size() > 18) return -413;
                int64_t v = strtoll(t.c_str(), nullptr, 10);
                if (rq->content_length >= 0 && rq->content_length != v) return -400;
                rq->content_length = v;
            }
        } else if (name == "transfer-encoding") {
            te_seen = true;
            for (const auto& t : http_list(value)) te.push_back(t);
        } else if (name == "connection") {
            connection += "," + value;
        } else if (name == "expect") {
            if (http_lower(value) != "100-continue") return -417;
            if (rq->minor >= 1) rq->expect_continue = true;
        }
        rq->headers.emplace_back(name, value);
    }
    if (te_seen) {
        if (rq->content_length >= 0) return -400;         // smuggling: both framings
        for (const auto& t : te) if (t != "chunked") return -501;  // codings we do not implement
        if (te.size() != 1) return -400;                  // none, or chunked applied twice
        if (rq->minor == 0) return -400;                  // http/1.0 has no chunked bodies
        rq->chunked = true;
    }
    if (rq->content_length >= 0 && (uint64_t)rq->content_length > lim.max_body) return -413;
    bool close = false, keep = false;
    for (const auto& t : http_list(connection)) { if (t == "close") close = true; if (t == "keep-alive") keep = true; }
    rq->keep_alive = rq->minor >= 1 ? !close : (keep && !close);
    return (long)end;
}

// incremental chunked-body decoder. strict: hex sizes (no sign, at most 15 digits), crlf
// line ends, chunk extensions skipped, trailers read and dropped.
struct ChunkedDecoder {
    enum { SIZE, EXT, SIZE_LF, DATA, DATA_CR, DATA_LF, TRAILER, TRAILER_LF, DONE } state = SIZE;
    uint64_t size = 0;             // current chunk size / bytes left in it
    int digits = 0;
    size_t line = 0;               // bytes in the current size or trailer line
    size_t trailer = 0;            // trailer bytes so far
};
// feed p[0..n): chunk data is appended to *body. returns 1 when the body is complete (*used
// = bytes consumed, the rest belongs to the next request), 0 when all n bytes were consumed
// and more are needed, -400 (malformed) or -413 (over max_body or the head limit).
static int chunked_feed(ChunkedDecoder* d, const char* p, size_t n, std::string* body,
                        uint64_t max_body, size_t max_line, size_t* used) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)p[i];
        switch (d->state) {
            case ChunkedDecoder::SIZE: {
                int h = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
                if (h >= 0) {
                    if (++d->digits > 15) return -400;
                    d->size = d->size * 16 + h; i++; break;
                }
                if (d->digits == 0) return -400;
                if (c == ';' || c == ' ' || c == '\t') { d->state = ChunkedDecoder::EXT; d->line = 0; i++; break; }
                if (c == '\r') { d->state = ChunkedDecoder::SIZE_LF; i++; break; }
                return -400;
            }
            case ChunkedDecoder::EXT:
                if (c == '\r') { d->state = ChunkedDecoder::SIZE_LF; i++; break; }
                if (c == '\n' || (c < 0x20 && c != '\t') || ++d->line > max_line) return -400;
                i++; break;
            case ChunkedDecoder::SIZE_LF:
                if (c != '\n') return -400;
                i++;
                if (d->size == 0) { d->state = ChunkedDecoder::TRAILER; d->line = 0; break; }
                if (body->size() + d->size > max_body) return -413;
                d->state = ChunkedDecoder::DATA;
                break;
            case ChunkedDecoder::DATA: {
                size_t take = (size_t)std::min<uint64_t>(d->size, n - i);
                body->append(p + i, take);
                i += take; d->size -= take;
                if (d->size == 0) d->state = ChunkedDecoder::DATA_CR;
                break;
            }
            case ChunkedDecoder::DATA_CR:
                if (c != '\r') return -400;
                d->state = ChunkedDecoder::DATA_LF; i++; break;
            case ChunkedDecoder::DATA_LF:
                if (c != '\n') return -400;
                d->state = ChunkedDecoder::SIZE; d->digits = 0; d->size = 0; i++; break;
            case ChunkedDecoder::TRAILER:
                if (c == '\r') { d->state = ChunkedDecoder::TRAILER_LF; i++; break; }
                if (c == '\n' || (c < 0x20 && c != '\t')) return -400;
                d->line++; i++;
                if (++d->trailer > max_line) return -413;
                break;
            case ChunkedDecoder::TRAILER_LF:
                if (c != '\n') return -400;
                i++;
                if (d->line == 0) { d->state = ChunkedDecoder::DONE; *used = i; return 1; }
                d->line = 0; d->state = ChunkedDecoder::TRAILER;
                break;
            case ChunkedDecoder::DONE:
                *used = i; return 1;
        }
    }
    *used = n;
    return d->state == ChunkedDecoder::DONE ? 1 : 0;
}

static const char* http_status_text(int s) {
    switch (s) {
        case 100: return "Continue"; case 200: return "OK"; case 204: return "No Content";
        case 400: return "Bad Request"; case 401: return "Unauthorized"; case 403: return "Forbidden"; case 404: return "Not Found";
        case 405: return "Method Not Allowed"; case 408: return "Request Timeout";
        case 413: return "Content Too Large"; case 415: return "Unsupported Media Type"; case 417: return "Expectation Failed";
        case 429: return "Too Many Requests"; case 500: return "Internal Server Error";
        case 501: return "Not Implemented"; case 503: return "Service Unavailable";
        case 505: return "HTTP Version Not Supported";
    }
    return "Unknown";
}

// ----------------------------------------------------------------------------
// output helpers

// append the complete, well-formed part of *carry + in to *out. an incomplete sequence at
// the end stays in *carry (unless final, when it becomes U+FFFD); ill-formed bytes become
// U+FFFD, one per maximal subpart, so whatever comes in, what goes out is valid utf-8.
static void utf8_take(std::string* carry, const char* in, size_t n, std::string* out, bool final) {
    carry->append(in, n);
    carry->erase(0, utf8_lossy(out, carry->data(), carry->size(), final));  // format.h's repair
}
static std::string utf8_fix(const std::string& s) {
    std::string carry, out;
    utf8_take(&carry, s.data(), s.size(), &out, true);
    return out;
}

// one server-sent event: "data: <json>\n\n", or with an event name
static std::string sse_data(const std::string& json) { return "data: " + json + "\n\n"; }
static std::string sse_event(const char* name, const std::string& json) {
    return std::string("event: ") + name + "\ndata: " + json + "\n\n";
}

// ----------------------------------------------------------------------------
// request memory: a json body costs more than its bytes once parsed, converted, rendered
// and tokenized (a 16 MiB array of zeros is 8M json values of 112 bytes). so every
// allocation of the program goes through the replaceable global operator new / delete
// below, and while a connection thread prepares a request it runs under a budget: the net
// bytes it allocates (what it frees counts back, the body it parses included) may not pass
// serve_request_budget(body). past it the allocation throws ServeOverBudget and the request
// gets 413; a real allocation failure is a plain std::bad_alloc and gets 503. either way
// the request is unwound and the server goes on. a peak per request is then at most the
// body plus its budget: (1 + kServeMemMultiple) x the body + kServeMemFloor.
// these are definitions, not inline: serve.h belongs to one translation unit per binary.

// plain text on the kjv tokenizer (2.4 bytes a token) peaks at 4x (a 63 MiB body) to 6.6x
// (16 MiB) its body, the body included: the json, the converted chat, the rendered prompt,
// the token ids growing (test/bench-notes.md). digits (a token a byte) and words of
// millions of letters need more and get 413.
enum : int64_t {
    kServeMemMultiple = 6,           // budget per body byte
    kServeMemFloor = 16ll << 20,     // plus this for every request (small bodies, word caches)
};
static inline int64_t serve_request_budget(size_t body) { return kServeMemMultiple * (int64_t)body + kServeMemFloor; }

struct ServeOverBudget : std::bad_alloc {
    const char* what() const noexcept override { return "request memory budget exceeded"; }
};

// the calling thread's count: limit < 0 is no budget (nothing is counted)
static thread_local int64_t t_serve_mem_used = 0, t_serve_mem_peak = 0, t_serve_mem_limit = -1;

static inline void* serve_mem_alloc(size_t n, size_t align) {
    if (t_serve_mem_limit >= 0 && t_serve_mem_used + (int64_t)n > t_serve_mem_limit) throw ServeOverBudget();
    void* p = align <= alignof(std::max_align_t) ? malloc(n ? n : 1) : aligned_alloc(align, (n + align - 1) / align * align);
    if (!p) throw std::bad_alloc();
    if (t_serve_mem_limit >= 0) {
        t_serve_mem_used += (int64_t)malloc_usable_size(p);
        if (t_serve_mem_used > t_serve_mem_peak) t_serve_mem_peak = t_serve_mem_used;
    }
    return p;
}
static inline void* serve_mem_alloc_nothrow(size_t n, size_t align) noexcept {
    try { return serve_mem_alloc(n, align); } catch (...) { return nullptr; }
}
static inline void serve_mem_free(void* p) noexcept {
    if (!p) return;
    if (t_serve_mem_limit >= 0) t_serve_mem_used -= (int64_t)malloc_usable_size(p);
    free(p);
}
#ifndef __CUDA_ARCH__  // host code only (nvcc's device pass keeps its own)
void* operator new(size_t n) { return serve_mem_alloc(n, 0); }
void* operator new[](size_t n) { return serve_mem_alloc(n, 0); }
void* operator new(size_t n, std::align_val_t a) { return serve_mem_alloc(n, (size_t)a); }
void* operator new[](size_t n, std::align_val_t a) { return serve_mem_alloc(n, (size_t)a); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return serve_mem_alloc_nothrow(n, 0); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return serve_mem_alloc_nothrow(n, 0); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return serve_mem_alloc_nothrow(n, (size_t)a); }
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return serve_mem_alloc_nothrow(n, (size_t)a); }
void operator delete(void* p) noexcept { serve_mem_free(p); }
void operator delete[](void* p) noexcept { serve_mem_free(p); }
void operator delete(void* p, size_t) noexcept { serve_mem_free(p); }
void operator delete[](void* p, size_t) noexcept { serve_mem_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { serve_mem_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { serve_mem_free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { serve_mem_free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { serve_mem_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { serve_mem_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { serve_mem_free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { serve_mem_free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { serve_mem_free(p); }
#endif

// the budget of the calling thread while it lives (not nested)
struct ServeMemScope {
    explicit ServeMemScope(int64_t limit) { t_serve_mem_used = 0; t_serve_mem_peak = 0; t_serve_mem_limit = limit; }
    ~ServeMemScope() { t_serve_mem_limit = -1; t_serve_mem_used = 0; }
    ServeMemScope(const ServeMemScope&) = delete;
    ServeMemScope& operator=(const ServeMemScope&) = delete;
};

// ----------------------------------------------------------------------------
// request parsing: openai chat completions and anthropic messages into one shape

struct ApiRequest {
    bool anthropic = false;
    std::string model;             // the label the client sent
    ServeChat chat;
    bool stream = false, include_usage = false;
    int max_tokens = 0;            // 0: --default-max-tokens
    double temperature = NAN, top_p = NAN, min_p = NAN, presence = NAN, frequency = NAN;
    int top_k = INT_MIN;
    bool has_seed = false;
    uint64_t seed = 0;
    std::vector<std::pair<int, float>> logit_bias;
    std::vector<std::string> stop;
    std::shared_ptr<const Grammar> grammar;  // structured output or a forced tool call (api_structured)
    const char* grammar_param = nullptr;     // the field that asked for it (errors name it)
    // completions, responses and chat logprobs (see their section)
    int logprobs = -1;             // alternatives per token; -1: no logprobs
    bool max_zero = false;         // max_tokens 0 (completions with echo: score the prompt only)
    bool echo = false;             // completions: the prompt comes back (scored, with logprobs)
    bool raw = false;              // completions: the prompt is raw_text or raw_ids, no template
    bool raw_is_ids = false;
    std::string raw_text;
    std::vector<int> raw_ids;
    Json resp;                     // responses: what the response object echoes, and the input items
};

// what the parsers need to know about the server
struct ApiContext {
    std::string model_id;          // openai requests must name it
    bool thinking = true;          // the default (--no-thinking turns it off)
    bool preserve_thinking = false;
    bool vision = false;
};

static bool api_fail(ServeError* e, const char* param, const std::string& msg,
                     const char* code = "invalid_request_error", int status = 400) {
    e->status = status; e->code = code; e->message = msg; e->param = param ? param : "";
    return false;
}
static bool api_fail(ServeError* e, const std::string& param, const std::string& msg,
                     const char* code = "invalid_request_error", int status = 400) {
    return api_fail(e, param.c_str(), msg, code, status);
}
// "messages[3]": the path of an array element, for error params
static std::string api_at(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

// structured output: a json schema (null: any json value; json_object: any object) or a
// forced call of the named tool (empty: any of them) compiled to the request's grammar. a
// keyword the compiler does not support is a 400 that names it and where it is.
static bool api_schema_grammar(const Json* schema, bool object_only, const char* param, ApiRequest* r, ServeError* e) {
    auto g = std::make_shared<Grammar>();
    std::string err;
    if (object_only) grammar_json_object(g.get());
    else if (!schema_compile(schema ? *schema : Json::object(), g.get(), &err))
        return api_fail(e, param, err.substr(0, 400), "schema_not_supported");
    r->grammar = g;
    r->grammar_param = param;
    return true;
}
// tools: the chat tools ([{type, function: {name, parameters}}], already checked)
static bool api_forced_tool(const Json& tools, const std::string& name, const char* param, ApiRequest* r, ServeError* e) {
    std::vector<ToolSpec> specs;
    for (const Json& t : tools.arr) {
        const Json* f = t.get("function");
        const Json* n = f ? f->get("name") : nullptr;
        if (!n || !n->is_string() || (!name.empty() && n->str != name)) continue;
        const Json* p = f->get("parameters");
        specs.push_back(ToolSpec{n->str, p ? *p : Json()});
    }
    if (specs.empty()) return api_fail(e, param, "tool_choice names a tool that is not in 'tools'");
    auto g = std::make_shared<Grammar>();
    std::string err;
    if (!grammar_tool_call(specs, g.get(), &err)) return api_fail(e, "tools", err.substr(0, 400), "schema_not_supported");
    r->grammar = g;
    r->grammar_param = param;
    return true;
}

// an optional number field: 0 absent (or null), 1 set, -1 wrong type or range
static int api_number(const Json& o, const char* key, double lo, double hi, double* out, ServeError* e) {
    const Json* v = o.get(key);
    if (!v || v->is_null()) return 0;
    if (!v->is_number() || !(v->num >= lo && v->num <= hi)) {
        char m[160]; snprintf(m, sizeof m, "'%s' must be a number in [%g, %g]", key, lo, hi);
        api_fail(e, key, m); return -1;
    }
    *out = v->num; return 1;
}
static int api_int(const Json& o, const char* key, int64_t lo, int64_t hi, int64_t* out, ServeError* e) {
    const Json* v = o.get(key);
    if (!v || v->is_null()) return 0;
    if (!v->is_number() || !v->is_int || v->i < lo || v->i > hi) {
        char m[160]; snprintf(m, sizeof m, "'%s' must be an integer in [%lld, %lld]", key, (long long)lo, (long long)hi);
        api_fail(e, key, m); return -1;
    }
    *out = v->i; return 1;
}
static int api_bool(const Json& o, const char* key, bool* out, ServeError* e) {
    const Json* v = o.get(key);
    if (!v || v->is_null()) return 0;
    if (!v->is_bool()) { api_fail(e, key, std::string("'") + key + "' must be a boolean"); return -1; }
    *out = v->b; return 1;
}

static bool api_known_key(const std::string& k, const char* const* keys) {
    for (; *keys; keys++) if (k == *keys) return true;
    return false;
}
// an object nested in a request takes only the listed keys; others are refused by name
// unless null (sdks serialize unset optional fields as null)
static bool api_only_keys(const Json& o, const char* const* keys, const std::string& where, ServeError* e) {
    for (const auto& kv : o.obj)
        if (!kv.second.is_null() && !api_known_key(kv.first, keys))
            return api_fail(e, where + "." + (kv.first.size() <= 64 ? kv.first : kv.first.substr(0, 64)),
                            "unknown parameter", "unknown_parameter");
    return true;
}

static bool api_tool_name_ok(const std::string& s) {
    if (s.empty() || s.size() > 64) return false;
    for (char c : s) if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
    return true;
}

// a tool's json schema, as far as the renderer and the model depend on it: objects all the
// way down, "type" a json schema type name (or a list of them), "properties" schemas,
// "required" names. the top level describes an object.
static bool api_check_schema(const Json& s, const std::string& where, int depth, ServeError* e) {
    if (depth > 32) return api_fail(e, where, "the schema is nested too deeply");
    if (s.is_bool() && depth > 0) return true;  // true / false schemas
    if (!s.is_object()) return api_fail(e, where, "a json schema must be an object");
    static const char* const types[] = {"object", "array", "string", "number", "integer", "boolean", "null", nullptr};
    if (const Json* t = s.get("type")) {
        bool ok = t->is_string() && api_known_key(t->str, types);
        if (t->is_array() && !t->arr.empty()) {
            ok = true;
            for (const auto& x : t->arr) ok = ok && x.is_string() && api_known_key(x.str, types);
        }
        if (!ok) return api_fail(e, where + ".type", "'type' must be a json schema type name or a list of them");
        if (depth == 0 && !(t->is_string() && t->str == "object")) return api_fail(e, where + ".type", "a tool's parameters must be an object schema");
    }
    if (const Json* p = s.get("properties")) {
        if (!p->is_object()) return api_fail(e, where + ".properties", "'properties' must be an object of schemas");
        for (const auto& kv : p->obj)
            if (!api_check_schema(kv.second, where + ".properties." + kv.first.substr(0, 64), depth + 1, e)) return false;
    }
    if (const Json* r = s.get("required")) {
        if (!r->is_array()) return api_fail(e, where + ".required", "'required' must be an array of property names");
        for (const auto& x : r->arr) if (!x.is_string()) return api_fail(e, where + ".required", "'required' must be an array of property names");
    }
    if (const Json* d = s.get("description"); d && !d->is_string()) return api_fail(e, where + ".description", "'description' must be a string");
    if (const Json* en = s.get("enum"); en && !en->is_array()) return api_fail(e, where + ".enum", "'enum' must be an array");
    if (const Json* it = s.get("items")) {
        if (it->is_array()) { for (size_t i = 0; i < it->arr.size(); i++) if (!api_check_schema(it->arr[i], api_at(where + ".items", i), depth + 1, e)) return false; }
        else if (!api_check_schema(*it, where + ".items", depth + 1, e)) return false;
    }
    for (const char* k : {"anyOf", "oneOf", "allOf"})
        if (const Json* x = s.get(k)) {
            if (!x->is_array()) return api_fail(e, where + "." + k, std::string("'") + k + "' must be an array of schemas");
            for (size_t i = 0; i < x->arr.size(); i++) if (!api_check_schema(x->arr[i], api_at(where + "." + k, i), depth + 1, e)) return false;
        }
    return true;
}

// stop: a string or an array of non-empty strings (at most 16)
static bool api_stop(const Json* v, const char* key, std::vector<std::string>* out, ServeError* e) {
    if (!v || v->is_null()) return true;
    if (v->is_string()) { if (!v->str.empty()) out->push_back(v->str); return true; }
    if (!v->is_array() || v->size() > 16) return api_fail(e, key, std::string("'") + key + "' must be a string or an array of at most 16 strings");
    for (const auto& s : v->arr) {
        if (!s.is_string() || s.str.empty() || s.str.size() > 4096) return api_fail(e, key, std::string("'") + key + "' entries must be non-empty strings");
        out->push_back(s.str);
    }
    return true;
}

// a content part list: text parts always, media only with vision
static bool api_check_parts(const Json& parts, bool vision, bool text_only, const std::string& where, ServeError* e) {
    for (size_t i = 0; i < parts.arr.size(); i++) {
        const Json& p = parts.arr[i];
        std::string at = api_at(where, i);
        const Json* t = p.get("type");
        if (!p.is_object() || !t || !t->is_string()) return api_fail(e, at, "a content part must be an object with a 'type'");
        const std::string& ty = t->str;
        if (ty == "text") {
            const Json* tx = p.get("text");
            if (!tx || !tx->is_string()) return api_fail(e, at + ".text", "a text part needs a string 'text'");
            static const char* const keys[] = {"type", "text", nullptr};
            if (!api_only_keys(p, keys, at, e)) return false;
        } else if (ty == "image_url" || ty == "video_url" || ty == "image" || ty == "video") {
            if (text_only) return api_fail(e, at, "only text parts are allowed here");
            if (!vision) return api_fail(e, at, "images and video need a server started with --vision", "vision_disabled");
        } else {
            return api_fail(e, at + ".type", "unsupported content part type");
        }
    }
    return true;
}

// openai messages, checked and brought into ServeChat's shape in place: tool-call arguments
// sent as json text (the openai spec) become the object they encode.
static bool openai_check_messages(Json* msgs, bool vision, ServeError* e) {
    if (!msgs->is_array() || msgs->arr.empty()) return api_fail(e, "messages", "'messages' must be a non-empty array");
    for (size_t i = 0; i < msgs->arr.size(); i++) {
        Json& m = msgs->arr[i];
        std::string at = api_at("messages", i);
        const Json* role = m.get("role");
        if (!m.is_object() || !role || !role->is_string()) return api_fail(e, at + ".role", "each message must be an object with a string 'role'");
        const std::string r = role->str;
        if (r == "function") return api_fail(e, at + ".role", "role 'function' is not supported; use tools", "unsupported_role");
        if (r != "system" && r != "developer" && r != "user" && r != "assistant" && r != "tool")
            return api_fail(e, at + ".role", "role must be system, developer, user, assistant or tool", "unsupported_role");
        // what the template renders; the sdks' unset fields (null, or an empty annotation list) pass
        static const char* const common[] = {"role", "content", nullptr};
        static const char* const assistant[] = {"role", "content", "reasoning_content", "tool_calls", nullptr};
        static const char* const tool[] = {"role", "content", "tool_call_id", nullptr};
        for (const auto& kv : m.obj) {
            const Json& v = kv.second;
            if (v.is_null() || (kv.first == "annotations" && v.is_array() && v.arr.empty())) continue;
            if (!api_known_key(kv.first, r == "assistant" ? assistant : r == "tool" ? tool : common))
                return api_fail(e, at + "." + (kv.first.size() <= 64 ? kv.first : kv.first.substr(0, 64)),
                                kv.first == "name" ? "message names are not supported (the chat template has no place for them)"
                                                   : "unknown parameter in a message", "unknown_parameter");
        }
        if (r == "tool") {
            const Json* id = m.get("tool_call_id");
            if (!id || !id->is_string() || id->str.empty()) return api_fail(e, at + ".tool_call_id", "a tool message needs the 'tool_call_id' it answers");
        }
        if (r == "assistant") {
            const Json* rc = m.get("reasoning_content");
            if (rc && !rc->is_null() && !rc->is_string()) return api_fail(e, at + ".reasoning_content", "'reasoning_content' must be a string");
            Json* tc = m.get("tool_calls");
            if (tc && !tc->is_null()) {
                if (!tc->is_array()) return api_fail(e, at + ".tool_calls", "'tool_calls' must be an array");
                for (size_t k = 0; k < tc->arr.size(); k++) {
                    Json& call = tc->arr[k];
                    std::string cat = api_at(at + ".tool_calls", k);
                    if (!call.is_object()) return api_fail(e, cat, "a tool call must be an object");
                    static const char* const call_keys[] = {"id", "type", "function", nullptr};
                    if (!api_only_keys(call, call_keys, cat, e)) return false;
                    const Json* ty = call.get("type");
                    if (ty && !ty->is_null() && !(ty->is_string() && ty->str == "function"))
                        return api_fail(e, cat + ".type", "only function tool calls are supported", "tool_type_not_supported");
                    const Json* id = call.get("id");
                    if (id && !id->is_null() && !id->is_string()) return api_fail(e, cat + ".id", "a tool call id must be a string");
                    Json* f = call.get("function");
                    if (!f || !f->is_object()) return api_fail(e, cat + ".function", "a tool call needs a 'function'");
                    static const char* const fn_keys[] = {"name", "arguments", nullptr};
                    if (!api_only_keys(*f, fn_keys, cat + ".function", e)) return false;
                    const Json* nm = f->get("name");
                    if (!nm || !nm->is_string() || nm->str.empty()) return api_fail(e, cat + ".function.name", "a tool call needs function.name");
                    Json* ar = f->get("arguments");
                    if (ar && ar->is_string()) {
                        Json parsed; std::string perr;
                        if (!json_parse(ar->str, &parsed, &perr, 64))
                            return api_fail(e, cat + ".function.arguments", "message " + std::to_string(i) +
                                            ": function.arguments is not valid json (" + perr + ")");
                        if (!parsed.is_object())
                            return api_fail(e, cat + ".function.arguments", "message " + std::to_string(i) +
                                            ": function.arguments must encode a json object");
                        *ar = std::move(parsed);
                    } else if (ar && !ar->is_null() && !ar->is_object()) {
                        return api_fail(e, cat + ".function.arguments", "function.arguments must be a json object or its text");
                    }
                }
            }
        }
        const Json* c = m.get("content");
        if (!c || c->is_null()) {
            if (r == "assistant") continue;  // tool calls or an empty turn
            return api_fail(e, at + ".content", "'content' is required for this role");
        }
        if (c->is_string()) continue;
        if (!c->is_array()) return api_fail(e, at + ".content", "'content' must be a string or an array of parts");
        if (!api_check_parts(*c, vision, r != "user", at + ".content", e)) return false;
    }
    return true;
}

// tools: [{type:"function", function:{name, description?, parameters?}}] -> the same with
// parameters always present; an empty array means none. names are unique.
// *strict: some tool asked for strict: true (honoured only when the call is forced: the
// caller refuses it otherwise)
static bool openai_check_tools(const Json* tools, Json* out, ServeError* e, std::string* strict = nullptr) {
    *out = Json();
    if (!tools || tools->is_null()) return true;
    if (!tools->is_array()) return api_fail(e, "tools", "'tools' must be an array");
    if (tools->arr.empty()) return true;
    *out = Json::array();
    std::vector<std::string> names;
    for (size_t i = 0; i < tools->arr.size(); i++) {
        const Json& t = tools->arr[i];
        std::string at = api_at("tools", i);
        const Json* ty = t.get("type");
        if (!t.is_object() || !ty || !ty->is_string()) return api_fail(e, at + ".type", "each tool must be an object with a 'type'");
        if (ty->str != "function") return api_fail(e, at + ".type", "only function tools are supported", "tool_type_not_supported");
        static const char* const keys[] = {"type", "function", nullptr};
        if (!api_only_keys(t, keys, at, e)) return false;
        const Json* f = t.get("function");
        const Json* nm = f ? f->get("name") : nullptr;
        if (!f || !f->is_object() || !nm || !nm->is_string() || !api_tool_name_ok(nm->str))
            return api_fail(e, at + ".function.name", "function.name must match [A-Za-z0-9_-]{1,64}");
        for (const auto& n : names) if (n == nm->str) return api_fail(e, at + ".function.name", "duplicate tool name");
        names.push_back(nm->str);
        static const char* const fn_keys[] = {"name", "description", "parameters", "strict", nullptr};
        if (!api_only_keys(*f, fn_keys, at + ".function", e)) return false;
        const Json* d = f->get("description");
        if (d && !d->is_null() && !d->is_string()) return api_fail(e, at + ".function.description", "function.description must be a string");
        const Json* p = f->get("parameters");
        if (p && !p->is_null() && !api_check_schema(*p, at + ".function.parameters", 0, e)) return false;
        const Json* st = f->get("strict");
        if (st && !st->is_null() && !st->is_bool()) return api_fail(e, at + ".function.strict", "function.strict must be a boolean");
        if (st && st->is_bool() && st->b) {  // a promise that the arguments match the schema: a forced call keeps it
            if (!strict) return api_fail(e, at + ".function.strict", "strict tool schemas need a forced tool call (tool_choice required or a function)", "strict_not_supported");
            if (strict->empty()) *strict = at + ".function.strict";
        }
        Json fn = *f;  // rendered as the client sent it, as transformers renders a tool list
        if (!p || p->is_null()) {
            Json schema = Json::object();
            schema.set("type", Json::string("object"));
            schema.set("properties", Json::object());
            fn.set("parameters", schema);
        }
        Json tool = Json::object();
        tool.set("type", Json::string("function"));
        tool.set("function", fn);
        out->push(tool);
    }
    return true;
}

// openai tool_choice: auto, none, required, or a named function ({type: function, function:
// {name}} in chat completions; flat {type: function, name} in responses); the last two force a
// call (api_forced_tool). the tools are r->chat.tools, already checked.
static bool api_openai_tool_choice(const Json& tc, bool flat, ApiRequest* r, ServeError* e) {
    if (tc.is_string() && tc.str == "none") { r->chat.tools = Json(); return true; }
    if (tc.is_string() && tc.str == "auto") return true;
    if (tc.is_string() && tc.str == "required") return api_forced_tool(r->chat.tools, "", "tool_choice", r, e);
    if (!tc.is_object()) return api_fail(e, "tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or a function");
    static const char* const chat_keys[] = {"type", "function", nullptr};
    static const char* const flat_keys[] = {"type", "name", nullptr};
    if (!api_only_keys(tc, flat ? flat_keys : chat_keys, "tool_choice", e)) return false;
    const Json* ty = tc.get("type");
    const Json* fn = flat ? &tc : tc.get("function");
    const Json* nm = fn && fn->is_object() ? fn->get("name") : nullptr;
    if (!ty || !ty->is_string() || ty->str != "function" || !nm || !nm->is_string())
        return api_fail(e, "tool_choice", flat ? "a tool_choice object must be {\"type\": \"function\", \"name\": ...}"
                                               : "a tool_choice object must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                        "tool_choice_not_supported");
    return api_forced_tool(r->chat.tools, nm->str, "tool_choice", r, e);
}

// thinking switches from several fields: they must agree
static bool api_merge_switch(int* have, bool v, const char* param, ServeError* e) {
    if (*have >= 0 && *have != (int)v) return api_fail(e, param, "conflicting thinking options", "conflicting_template_option");
    *have = v; return true;
}

// openai's metadata: at most 16 string pairs, keys <= 64 and values <= 512 characters
static bool api_metadata(const Json* md, ServeError* e) {
    if (!md || md->is_null()) return true;
    if (!md->is_object() || md->obj.size() > 16) return api_fail(e, "metadata", "'metadata' must be an object of at most 16 string values");
    for (const auto& kv : md->obj)
        if (kv.first.size() > 64 || !kv.second.is_string() || kv.second.str.size() > 512)
            return api_fail(e, "metadata", "'metadata' keys are at most 64 characters, values strings of at most 512");
    return true;
}

// openai's logit_bias: token id (a decimal string) -> bias in [-100, 100]
static bool api_logit_bias(const Json& body, ApiRequest* r, ServeError* e) {
    const Json* lb = body.get("logit_bias");
    if (!lb || lb->is_null()) return true;
    if (!lb->is_object()) return api_fail(e, "logit_bias", "'logit_bias' must be an object of token id -> bias");
    for (const auto& kv : lb->obj) {
        long long id;
        if (!serve_parse_long(kv.first.c_str(), 0, INT_MAX, &id) || !kv.second.is_number() || !(fabs(kv.second.num) <= 100))
            return api_fail(e, "logit_bias", "'logit_bias' maps token ids to numbers in [-100, 100]");
        r->logit_bias.emplace_back((int)id, (float)kv.second.num);
    }
    return true;
}

// the start of an openai body: an object of known keys naming this server's model
static bool apix_head(const Json& body, const ApiContext& ctx, const char* const* keys, ApiRequest* r, ServeError* e) {
    *r = ApiRequest();
    if (!body.is_object()) return api_fail(e, nullptr, "the request body must be a json object");
    for (const auto& kv : body.obj)
        if (!api_known_key(kv.first, keys)) return api_fail(e, kv.first.size() <= 64 ? kv.first.c_str() : "", "unknown parameter", "unknown_parameter");
    const Json* model = body.get("model");
    if (!model || !model->is_string()) return api_fail(e, "model", "'model' is required");
    if (model->str != ctx.model_id) return api_fail(e, "model", "model not found; GET /v1/models lists the model this server serves", "model_not_found", 404);
    r->model = model->str;
    return true;
}

// POST /v1/chat/completions body -> ApiRequest. every field is used or refused by name.
static bool openai_chat_parse(const Json& body, const ApiContext& ctx, ApiRequest* r, ServeError* e) {
    static const char* const keys[] = {"model", "messages", "tools", "tool_choice", "parallel_tool_calls",
        "stop", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "seed",
        "logit_bias", "n", "stream", "stream_options", "max_tokens", "max_completion_tokens", "enable_thinking",
        "chat_template_kwargs", "preserve_thinking", "reasoning_effort", "response_format", "functions",
        "function_call", "user", "metadata", "store", "service_tier", "logprobs", "top_logprobs", nullptr};
    if (!apix_head(body, ctx, keys, r, e)) return false;
    if (body.get("functions") || body.get("function_call")) return api_fail(e, "functions", "functions / function_call are not supported; use tools", "tools_not_supported");
    const Json* msgs = body.get("messages");
    if (!msgs) return api_fail(e, "messages", "'messages' must be a non-empty array");
    r->chat.messages = *msgs;
    if (!openai_check_messages(&r->chat.messages, ctx.vision, e)) return false;
    std::string strict;
    if (!openai_check_tools(body.get("tools"), &r->chat.tools, e, &strict)) return false;
    if (const Json* tc = body.get("tool_choice"); tc && !tc->is_null()) {
        if (!r->chat.tools.is_array()) return api_fail(e, "tool_choice", "'tool_choice' needs 'tools'");
        if (!api_openai_tool_choice(*tc, false, r, e)) return false;
    }
    if (!strict.empty() && !r->grammar)
        return api_fail(e, strict, "strict tool schemas need a forced tool call (tool_choice required or a function)", "strict_not_supported");
    if (const Json* ptc = body.get("parallel_tool_calls"); ptc && !ptc->is_null()) {
        if (!ptc->is_bool()) return api_fail(e, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
        if (!ptc->b && !r->grammar)  // a forced call is exactly one call
            return api_fail(e, "parallel_tool_calls", "parallel_tool_calls false is supported with a forced tool call only (otherwise the model may call several tools at once)");
    }
    if (!api_stop(body.get("stop"), "stop", &r->stop, e)) return false;
    if (api_number(body, "temperature", 0, 2, &r->temperature, e) < 0) return false;
    if (api_number(body, "top_p", 0, 1, &r->top_p, e) < 0) return false;
    int64_t x;
    int k = api_int(body, "top_k", -1, 1 << 20, &x, e);
    if (k < 0) return false;
    if (k > 0) r->top_k = (int)x;
    if (api_number(body, "min_p", 0, 1, &r->min_p, e) < 0) return false;
    if (api_number(body, "presence_penalty", -2, 2, &r->presence, e) < 0) return false;
    if (api_number(body, "frequency_penalty", -2, 2, &r->frequency, e) < 0) return false;
    k = api_int(body, "seed", 0, INT64_MAX, &x, e);
    if (k < 0) return false;
    if (k > 0) { r->has_seed = true; r->seed = (uint64_t)x; }
    if (!api_logit_bias(body, r, e)) return false;
    k = api_int(body, "n", 1, INT_MAX, &x, e);
    if (k < 0 && e->code == "invalid_request_error") { e->code = "n_not_supported"; return false; }
    if (k > 0 && x != 1) return api_fail(e, "n", "only n = 1 is supported", "n_not_supported");
    if (api_bool(body, "stream", &r->stream, e) < 0) return false;
    if (const Json* so = body.get("stream_options"); so && !so->is_null()) {
        if (!r->stream) return api_fail(e, "stream_options", "'stream_options' is only allowed with 'stream': true");
        if (!so->is_object()) return api_fail(e, "stream_options", "'stream_options' must be an object");
        static const char* const so_keys[] = {"include_usage", "include_obfuscation", nullptr};
        if (!api_only_keys(*so, so_keys, "stream_options", e)) return false;
        if (api_bool(*so, "include_usage", &r->include_usage, e) < 0) { e->param = "stream_options.include_usage"; return false; }
        bool ob = false;
        if (api_bool(*so, "include_obfuscation", &ob, e) < 0) { e->param = "stream_options.include_obfuscation"; return false; }
        if (ob) return api_fail(e, "stream_options.include_obfuscation", "stream obfuscation is not supported");
    }
    int64_t mt = 0;
    k = api_int(body, "max_completion_tokens", 1, INT_MAX, &mt, e);
    if (k < 0) return false;
    if (k == 0) { k = api_int(body, "max_tokens", 1, INT_MAX, &mt, e); if (k < 0) return false; }
    else if (api_int(body, "max_tokens", 1, INT_MAX, &x, e) < 0) return false;
    if (k > 0) r->max_tokens = (int)mt;
    // thinking: enable_thinking, chat_template_kwargs.enable_thinking, reasoning_effort none
    int think = -1, preserve = -1;
    bool b;
    if ((k = api_bool(body, "enable_thinking", &b, e)) < 0) return false;
    if (k > 0 && !api_merge_switch(&think, b, "enable_thinking", e)) return false;
    if ((k = api_bool(body, "preserve_thinking", &b, e)) < 0) return false;
    if (k > 0 && !api_merge_switch(&preserve, b, "preserve_thinking", e)) return false;
    if (const Json* kw = body.get("chat_template_kwargs"); kw && !kw->is_null()) {
        if (!kw->is_object()) return api_fail(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        static const char* const kw_keys[] = {"enable_thinking", "preserve_thinking", nullptr};
        if (!api_only_keys(*kw, kw_keys, "chat_template_kwargs", e)) return false;
        if ((k = api_bool(*kw, "enable_thinking", &b, e)) < 0) { e->param = "chat_template_kwargs.enable_thinking"; return false; }
        if (k > 0 && !api_merge_switch(&think, b, "chat_template_kwargs.enable_thinking", e)) return false;
        if ((k = api_bool(*kw, "preserve_thinking", &b, e)) < 0) { e->param = "chat_template_kwargs.preserve_thinking"; return false; }
        if (k > 0 && !api_merge_switch(&preserve, b, "chat_template_kwargs.preserve_thinking", e)) return false;
    }
    if (const Json* re = body.get("reasoning_effort"); re && !re->is_null()) {
        static const char* const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max", nullptr};
        if (!re->is_string() || !api_known_key(re->str, efforts)) return api_fail(e, "reasoning_effort", "'reasoning_effort' must be none, minimal, low, medium, high, xhigh or max");
        if (re->str == "none") { if (!api_merge_switch(&think, false, "reasoning_effort", e)) return false; }
        else { if (!api_merge_switch(&think, true, "reasoning_effort", e)) return false; r->chat.reasoning_effort = re->str; }
    }
    r->chat.enable_thinking = think >= 0 ? think : ctx.thinking;
    r->chat.preserve_thinking = preserve >= 0 ? preserve : ctx.preserve_thinking;
    if (const Json* rf = body.get("response_format"); rf && !rf->is_null()) {
        const Json* t = rf->is_object() ? rf->get("type") : nullptr;
        if (!t || !t->is_string()) return api_fail(e, "response_format", "'response_format' must be an object with a 'type'");
        if (t->str == "text" || t->str == "json_object") {
            static const char* const rf_keys[] = {"type", nullptr};
            if (!api_only_keys(*rf, rf_keys, "response_format", e)) return false;
        } else if (t->str == "json_schema") {
            static const char* const rf_keys[] = {"type", "json_schema", nullptr};
            if (!api_only_keys(*rf, rf_keys, "response_format", e)) return false;
            const Json* js = rf->get("json_schema");
            if (!js || !js->is_object()) return api_fail(e, "response_format.json_schema", "'json_schema' must be an object with a 'name' and a 'schema'");
            static const char* const js_keys[] = {"name", "description", "schema", "strict", nullptr};
            if (!api_only_keys(*js, js_keys, "response_format.json_schema", e)) return false;
            const Json* nm = js->get("name");
            if (!nm || !nm->is_string()) return api_fail(e, "response_format.json_schema.name", "'name' must be a string");
            const Json* st = js->get("strict");
            if (st && !st->is_null() && !st->is_bool()) return api_fail(e, "response_format.json_schema.strict", "'strict' must be a boolean");
            const Json* sc = js->get("schema");
            if (sc && !sc->is_null() && !sc->is_object()) return api_fail(e, "response_format.json_schema.schema", "'schema' must be a json schema object");
        } else return api_fail(e, "response_format.type", "response_format type must be text, json_object or json_schema", "response_format_not_supported");
        if (t->str != "text" && r->grammar) return api_fail(e, "response_format", "response_format cannot be combined with a forced tool call");
        if (t->str == "json_object" && !api_schema_grammar(nullptr, true, "response_format", r, e)) return false;
        if (t->str == "json_schema") {
            const Json* sc = rf->get("json_schema")->get("schema");
            if (!api_schema_grammar(sc && !sc->is_null() ? sc : nullptr, false, "response_format.json_schema.schema", r, e)) return false;
        }
    }
    // logprobs: true lists each token's logprob; top_logprobs (0..20, needs logprobs) its alternatives
    bool lp = false;
    if (api_bool(body, "logprobs", &lp, e) < 0) return false;
    k = api_int(body, "top_logprobs", 0, 20, &x, e);
    if (k < 0) return false;
    if (k > 0 && !lp) return api_fail(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (lp) r->logprobs = k > 0 ? (int)x : 0;
    // labels for the caller's own bookkeeping: checked, they change nothing here (nor at openai)
    if (const Json* u = body.get("user"); u && !u->is_null() && !u->is_string()) return api_fail(e, "user", "'user' must be a string");
    if (!api_metadata(body.get("metadata"), e)) return false;
    if (const Json* st = body.get("store"); st && !st->is_null()) {
        if (!st->is_bool()) return api_fail(e, "store", "'store' must be a boolean");
        if (st->b) return api_fail(e, "store", "stored completions are not supported");
    }
    if (const Json* sv = body.get("service_tier"); sv && !sv->is_null() && !(sv->is_string() && (sv->str == "auto" || sv->str == "default")))
        return api_fail(e, "service_tier", "only service_tier 'auto' and 'default' are supported");
    return true;
}

// ---- anthropic messages, in parts: system, messages, tools

// anthropic cache_control {type:"ephemeral", ttl?}: a caching hint. the output is the same
// with or without a cache, so it is checked and needs nothing more
static bool anthropic_cache_control(const Json& o, const std::string& where, ServeError* e) {
    const Json* cc = o.get("cache_control");
    if (!cc || cc->is_null()) return true;
    const Json* t = cc->get("type");
    if (!cc->is_object() || !t || !t->is_string() || t->str != "ephemeral") return api_fail(e, where + ".cache_control", "cache_control must be {\"type\": \"ephemeral\"}");
    static const char* const keys[] = {"type", "ttl", nullptr};
    if (!api_only_keys(*cc, keys, where + ".cache_control", e)) return false;
    const Json* ttl = cc->get("ttl");
    if (ttl && !ttl->is_null() && !(ttl->is_string() && (ttl->str == "5m" || ttl->str == "1h"))) return api_fail(e, where + ".cache_control.ttl", "ttl must be 5m or 1h");
    return true;
}

// a text block {type:"text", text, cache_control?, citations?}
static bool anthropic_text_block(const Json& b, const std::string& where, std::string* out, ServeError* e) {
    const Json* t = b.get("type");
    const Json* tx = b.get("text");
    if (!b.is_object() || !t || !t->is_string() || t->str != "text") return api_fail(e, where, "expected a text block");
    if (!tx || !tx->is_string()) return api_fail(e, where + ".text", "a text block needs 'text'");
    static const char* const keys[] = {"type", "text", "cache_control", "citations", nullptr};
    if (!api_only_keys(b, keys, where, e) || !anthropic_cache_control(b, where, e)) return false;
    if (const Json* ci = b.get("citations"); ci && !ci->is_null() && !(ci->is_array() && ci->arr.empty()))
        return api_fail(e, where + ".citations", "citations are not supported");
    *out = tx->str;
    return true;
}

// system: a string or text blocks (joined as paragraphs) -> a leading system message
static bool anthropic_system(const Json* v, Json* msgs, ServeError* e) {
    if (!v || v->is_null()) return true;
    std::string sys;
    if (v->is_string()) sys = v->str;
    else if (!v->is_array()) return api_fail(e, "system", "'system' must be a string or an array of text blocks");
    else
        for (size_t i = 0; i < v->arr.size(); i++) {
            std::string t;
            if (!anthropic_text_block(v->arr[i], api_at("system", i), &t, e)) return false;
            if (i) sys += "\n";  // blocks are separate paragraphs
            sys += t;
        }
    Json m = Json::object();
    m.set("role", Json::string("system"));
    m.set("content", Json::string(sys));
    msgs->push(m);
    return true;
}

// an anthropic image block -> an openai image_url part (data uri or url)
static bool anthropic_image_part(const Json& b, const std::string& where, Json* part, ServeError* e) {
    const Json* src = b.get("source");
    const Json* ty = src ? src->get("type") : nullptr;
    std::string url;
    if (!src || !ty || !ty->is_string()) return api_fail(e, where + ".source", "an image block needs a source");
    if (ty->str == "base64") {
        const Json* mt = src->get("media_type");
        const Json* data = src->get("data");
        if (!mt || !mt->is_string() || !data || !data->is_string()) return api_fail(e, where + ".source", "a base64 image needs media_type and data");
        url = "data:" + mt->str + ";base64," + data->str;
    } else if (ty->str == "url") {
        const Json* u = src->get("url");
        if (!u || !u->is_string()) return api_fail(e, where + ".source.url", "a url image needs a url");
        url = u->str;
    } else return api_fail(e, where + ".source.type", "unsupported image source");
    *part = Json::object();
    part->set("type", Json::string("image_url"));
    Json iu = Json::object();
    iu.set("url", Json::string(url));
    part->set("image_url", iu);
    return true;
}

// a tool_result block -> an openai tool message. content: a string or text blocks; is_error
// marks the text as an error report (the template has no field for it)
static bool anthropic_tool_result(const Json& b, const std::string& where, Json* out, ServeError* e) {
    static const char* const keys[] = {"type", "tool_use_id", "content", "is_error", "cache_control", nullptr};
    if (!api_only_keys(b, keys, where, e) || !anthropic_cache_control(b, where, e)) return false;
    const Json* id = b.get("tool_use_id");
    if (!id || !id->is_string() || id->str.empty()) return api_fail(e, where + ".tool_use_id", "a tool_result needs 'tool_use_id'");
    std::string text;
    const Json* rc = b.get("content");
    if (rc && rc->is_array()) {
        for (size_t k = 0; k < rc->arr.size(); k++) {
            const Json* rt = rc->arr[k].get("type");
            if (rt && rt->is_string() && rt->str == "image")
                return api_fail(e, api_at(where + ".content", k), "images in tool results are not supported");
            std::string t;
            if (!anthropic_text_block(rc->arr[k], api_at(where + ".content", k), &t, e)) return false;
            if (k) text += "\n";
            text += t;
        }
    } else if (rc && rc->is_string()) text = rc->str;
    else if (rc && !rc->is_null()) return api_fail(e, where + ".content", "tool_result content must be a string or text blocks");
    const Json* err = b.get("is_error");
    if (err && !err->is_null() && !err->is_bool()) return api_fail(e, where + ".is_error", "'is_error' must be a boolean");
    if (err && err->is_bool() && err->b) text = "Error: " + text;
    *out = Json::object();
    out->set("role", Json::string("tool"));
    out->set("tool_call_id", Json::string(id->str));
    out->set("content", Json::string(text));
    return true;
}

// messages -> openai-shaped messages appended to *msgs: thinking blocks -> reasoning_content,
// tool_use -> tool_calls (input stays the object it is), tool_result -> tool messages
// (before the user text of the same turn)
static bool anthropic_messages(const Json* in, bool vision, Json* msgs, ServeError* e) {
    if (!in || !in->is_array() || in->arr.empty()) return api_fail(e, "messages", "'messages' must be a non-empty array");
    for (size_t i = 0; i < in->arr.size(); i++) {
        const Json& m = in->arr[i];
        std::string at = api_at("messages", i);
        const Json* role = m.get("role");
        if (!m.is_object() || !role || !role->is_string() || (role->str != "user" && role->str != "assistant"))
            return api_fail(e, at + ".role", "each message needs role 'user' or 'assistant'");
        static const char* const keys[] = {"role", "content", nullptr};
        if (!api_only_keys(m, keys, at, e)) return false;
        const Json* c = m.get("content");
        if (!c || (!c->is_string() && !c->is_array())) return api_fail(e, at + ".content", "'content' must be a string or an array of blocks");
        bool user = role->str == "user";
        if (c->is_string()) {
            Json o = Json::object();
            o.set("role", Json::string(role->str));
            o.set("content", Json::string(c->str));
            msgs->push(o);
            continue;
        }
        Json parts = Json::array(), calls = Json::array();
        std::string text, reasoning;
        std::vector<Json> tool_msgs;
        for (size_t k = 0; k < c->arr.size(); k++) {
            const Json& b = c->arr[k];
            std::string bat = api_at(at + ".content", k);
            const Json* t = b.get("type");
            if (!b.is_object() || !t || !t->is_string()) return api_fail(e, bat + ".type", "each content block needs a 'type'");
            const std::string& ty = t->str;
            if (ty == "text") {
                std::string tx;
                if (!anthropic_text_block(b, bat, &tx, e)) return false;
                if (user) {
                    Json p = Json::object();
                    p.set("type", Json::string("text"));
                    p.set("text", Json::string(tx));
                    parts.push(p);
                } else text += tx;
            } else if (ty == "image" && user) {
                if (!vision) return api_fail(e, bat, "images need a server started with --vision", "vision_disabled");
                static const char* const ikeys[] = {"type", "source", "cache_control", nullptr};
                if (!api_only_keys(b, ikeys, bat, e) || !anthropic_cache_control(b, bat, e)) return false;
                Json p;
                if (!anthropic_image_part(b, bat, &p, e)) return false;
                parts.push(p);
            } else if (ty == "tool_result" && user) {
                Json tm;
                if (!anthropic_tool_result(b, bat, &tm, e)) return false;
                tool_msgs.push_back(tm);
            } else if (ty == "tool_use" && !user) {
                static const char* const ukeys[] = {"type", "id", "name", "input", "cache_control", nullptr};
                if (!api_only_keys(b, ukeys, bat, e) || !anthropic_cache_control(b, bat, e)) return false;
                const Json* id = b.get("id");
                const Json* nm = b.get("name");
                const Json* input = b.get("input");
                if (!id || !id->is_string() || id->str.empty()) return api_fail(e, bat + ".id", "a tool_use needs an 'id'");
                if (!nm || !nm->is_string() || nm->str.empty()) return api_fail(e, bat + ".name", "a tool_use needs 'name'");
                if (input && !input->is_null() && !input->is_object()) return api_fail(e, bat + ".input", "tool_use input must be an object");
                Json call = Json::object();
                call.set("id", Json::string(id->str));
                call.set("type", Json::string("function"));
                Json fn = Json::object();
                fn.set("name", Json::string(nm->str));
                fn.set("arguments", input && input->is_object() ? *input : Json::object());
                call.set("function", fn);
                calls.push(call);
            } else if (ty == "thinking" && !user) {
                static const char* const tkeys[] = {"type", "thinking", "signature", nullptr};
                if (!api_only_keys(b, tkeys, bat, e)) return false;
                const Json* th = b.get("thinking");
                if (!th || !th->is_string()) return api_fail(e, bat + ".thinking", "a thinking block needs 'thinking'");
                reasoning += th->str;
            } else if (ty == "redacted_thinking" && !user) {
                // opaque to us (another model's encrypted reasoning): closed-turn reasoning is
                // dropped from history anyway (reference-engine.md 8)
            } else {
                return api_fail(e, bat + ".type", "unsupported content block type");
            }
        }
        for (auto& tm : tool_msgs) msgs->push(tm);
        Json o = Json::object();
        o.set("role", Json::string(role->str));
        if (user) {
            if (parts.arr.empty()) continue;  // only tool results
            if (parts.arr.size() == 1 && parts.arr[0].get("text")) o.set("content", *parts.arr[0].get("text"));
            else o.set("content", parts);
        } else {
            o.set("content", Json::string(text));
            if (!reasoning.empty()) o.set("reasoning_content", Json::string(reasoning));
            if (!calls.arr.empty()) o.set("tool_calls", calls);
        }
        msgs->push(o);
    }
    return true;
}

// client tools [{name, description?, input_schema, type?:"custom", cache_control?}] -> openai tools
static bool anthropic_tools(const Json* tl, Json* out, ServeError* e) {
    *out = Json();
    if (!tl || tl->is_null()) return true;
    if (!tl->is_array()) return api_fail(e, "tools", "'tools' must be an array");
    if (!tl->arr.empty()) *out = Json::array();
    for (size_t i = 0; i < tl->arr.size(); i++) {
        const Json& t = tl->arr[i];
        std::string at = api_at("tools", i);
        const Json* ty = t.get("type");
        if (!t.is_object()) return api_fail(e, at, "each tool must be an object");
        if (ty && !ty->is_null() && !(ty->is_string() && ty->str == "custom"))
            return api_fail(e, at + ".type", "only client tools are supported", "tool_type_not_supported");
        static const char* const keys[] = {"type", "name", "description", "input_schema", "cache_control", nullptr};
        if (!api_only_keys(t, keys, at, e) || !anthropic_cache_control(t, at, e)) return false;
        const Json* nm = t.get("name");
        if (!nm || !nm->is_string() || !api_tool_name_ok(nm->str)) return api_fail(e, at + ".name", "tool name must match [A-Za-z0-9_-]{1,64}");
        for (const auto& o : out->arr) if (o.get("function")->get("name")->str == nm->str) return api_fail(e, at + ".name", "duplicate tool name");
        const Json* d = t.get("description");
        const Json* sc = t.get("input_schema");
        if (d && !d->is_null() && !d->is_string()) return api_fail(e, at + ".description", "tool description must be a string");
        if (!sc || !sc->is_object()) return api_fail(e, at + ".input_schema", "a tool needs an input_schema object");
        if (!api_check_schema(*sc, at + ".input_schema", 0, e)) return false;
        Json fn = Json::object();
        fn.set("name", Json::string(nm->str));
        if (d && d->is_string()) fn.set("description", *d);
        fn.set("parameters", *sc);
        Json tool = Json::object();
        tool.set("type", Json::string("function"));
        tool.set("function", fn);
        out->push(tool);
    }
    return true;
}

// POST /v1/messages (and count_tokens, with counting = true) body -> ApiRequest in openai
// shape. every field is used or refused by name.
static bool anthropic_parse(const Json& body, const ApiContext& ctx, bool counting, ApiRequest* r, ServeError* e) {
    static const char* const keys[] = {"model", "messages", "system", "max_tokens", "metadata", "stop_sequences",
        "stream", "temperature", "top_p", "top_k", "tools", "tool_choice", "thinking", "service_tier",
        "output_config", "container", "context_management", "cache_control", "inference_geo", "speed",
        "diagnostics", "user_profile_id", "workspace_id", nullptr};
    static const char* const count_keys[] = {"model", "messages", "system", "tools", "tool_choice", "thinking",
        "output_config", "context_management", "cache_control", nullptr};
    *r = ApiRequest();
    r->anthropic = true;
    if (!body.is_object()) return api_fail(e, nullptr, "the request body must be a json object");
    for (const auto& kv : body.obj)
        if (!api_known_key(kv.first, counting ? count_keys : keys))
            return api_fail(e, kv.first.size() <= 64 ? kv.first.c_str() : "", "unknown parameter", "unknown_parameter");
    // platform features this server does not have: refused by name when set
    for (const char* k : {"container", "context_management", "inference_geo", "speed", "diagnostics", "user_profile_id", "workspace_id"})
        if (const Json* v = body.get(k); v && !v->is_null()) return api_fail(e, k, std::string("'") + k + "' is not supported by this server");
    const Json* model = body.get("model");
    if (!model || !model->is_string()) return api_fail(e, "model", "'model' is required");
    r->model = model->str;  // a label only
    if (!anthropic_cache_control(body, "", e)) { e->param = e->param.substr(1); return false; }
    Json msgs = Json::array();
    if (!anthropic_system(body.get("system"), &msgs, e)) return false;
    if (!anthropic_messages(body.get("messages"), ctx.vision, &msgs, e)) return false;
    r->chat.messages = msgs;
    if (!anthropic_tools(body.get("tools"), &r->chat.tools, e)) return false;
    if (const Json* tc = body.get("tool_choice"); tc && !tc->is_null()) {
        const Json* ty = tc->get("type");
        if (!tc->is_object() || !ty || !ty->is_string()) return api_fail(e, "tool_choice", "'tool_choice' must be an object with a 'type'");
        if (!r->chat.tools.is_array()) return api_fail(e, "tool_choice", "'tool_choice' needs 'tools'");
        static const char* const tc_keys[] = {"type", "name", "disable_parallel_tool_use", nullptr};
        if (!api_only_keys(*tc, tc_keys, "tool_choice", e)) return false;
        const Json* dp = tc->get("disable_parallel_tool_use");
        if (dp && !dp->is_null() && !dp->is_bool()) return api_fail(e, "tool_choice.disable_parallel_tool_use", "'disable_parallel_tool_use' must be a boolean");
        const bool single = dp && dp->is_bool() && dp->b;
        const Json* nm = tc->get("name");
        if (ty->str != "tool" && nm && !nm->is_null()) return api_fail(e, "tool_choice.name", "'name' goes with tool_choice type tool only");
        if (ty->str == "none") r->chat.tools = Json();
        else if (ty->str == "any") { if (!api_forced_tool(r->chat.tools, "", "tool_choice", r, e)) return false; }
        else if (ty->str == "tool") {
            if (!nm || !nm->is_string()) return api_fail(e, "tool_choice.name", "tool_choice type tool needs the tool's 'name'");
            if (!api_forced_tool(r->chat.tools, nm->str, "tool_choice.name", r, e)) return false;
        }
        else if (ty->str != "auto") return api_fail(e, "tool_choice.type", "unknown tool_choice type");
        if (single && !r->grammar)  // a forced call is exactly one call
            return api_fail(e, "tool_choice.disable_parallel_tool_use", "disable_parallel_tool_use is supported with tool_choice any / tool only (otherwise the model may call several tools at once)");
    }
    // thinking: {type: "disabled"} turns it off, "enabled" / "adaptive" on
    r->chat.enable_thinking = ctx.thinking;
    r->chat.preserve_thinking = ctx.preserve_thinking;
    if (const Json* th = body.get("thinking"); th && !th->is_null()) {
        const Json* ty = th->get("type");
        if (!th->is_object() || !ty || !ty->is_string()) return api_fail(e, "thinking", "'thinking' must be an object with a 'type'");
        if (ty->str != "enabled" && ty->str != "disabled" && ty->str != "adaptive") return api_fail(e, "thinking.type", "thinking.type must be enabled, disabled or adaptive");
        static const char* const th_keys[] = {"type", "budget_tokens", nullptr};
        if (!api_only_keys(*th, th_keys, "thinking", e)) return false;
        r->chat.enable_thinking = ty->str != "disabled";
        if (const Json* bt = th->get("budget_tokens"); bt && !bt->is_null() && !(bt->is_number() && bt->is_int && bt->i >= 0))
            return api_fail(e, "thinking.budget_tokens", "'budget_tokens' must be a non-negative integer");
    }
    if (const Json* oc = body.get("output_config"); oc && !oc->is_null()) {
        if (!oc->is_object()) return api_fail(e, "output_config", "'output_config' must be an object");
        static const char* const oc_keys[] = {"effort", "format", nullptr};
        if (!api_only_keys(*oc, oc_keys, "output_config", e)) return false;
        if (const Json* f = oc->get("format"); f && !f->is_null()) {
            const Json* ty = f->is_object() ? f->get("type") : nullptr;
            if (!ty || !ty->is_string() || ty->str != "json_schema")
                return api_fail(e, "output_config.format.type", "output_config.format type must be json_schema", "output_format_not_supported");
            static const char* const f_keys[] = {"type", "schema", nullptr};
            if (!api_only_keys(*f, f_keys, "output_config.format", e)) return false;
            const Json* sc = f->get("schema");
            if (!sc || !sc->is_object()) return api_fail(e, "output_config.format.schema", "'schema' must be a json schema object");
            if (r->grammar) return api_fail(e, "output_config.format", "output_config.format cannot be combined with a forced tool call");
            if (!api_schema_grammar(sc, false, "output_config.format.schema", r, e)) return false;
        }
        const Json* ef = oc->get("effort");
        if (ef && !ef->is_null()) {
            if (!ef->is_string()) return api_fail(e, "output_config.effort", "'effort' must be a string");
            r->chat.reasoning_effort = ef->str;
        }
    }
    if (counting) return true;
    int64_t x;
    int k = api_int(body, "max_tokens", 1, INT_MAX, &x, e);
    if (k < 0) return false;
    if (k == 0) return api_fail(e, "max_tokens", "'max_tokens' is required");
    r->max_tokens = (int)x;
    if (const Json* md = body.get("metadata"); md && !md->is_null()) {
        if (!md->is_object()) return api_fail(e, "metadata", "'metadata' must be an object");
        static const char* const md_keys[] = {"user_id", nullptr};
        if (!api_only_keys(*md, md_keys, "metadata", e)) return false;
        const Json* uid = md->get("user_id");
        if (uid && !uid->is_null() && (!uid->is_string() || uid->str.size() > 256)) return api_fail(e, "metadata.user_id", "'user_id' must be a string of at most 256 characters");
    }
    if (const Json* sv = body.get("service_tier"); sv && !sv->is_null() && !(sv->is_string() && (sv->str == "auto" || sv->str == "standard_only")))
        return api_fail(e, "service_tier", "service_tier must be auto or standard_only");
    if (!api_stop(body.get("stop_sequences"), "stop_sequences", &r->stop, e)) return false;
    if (api_number(body, "temperature", 0, 2, &r->temperature, e) < 0) return false;
    if (api_number(body, "top_p", 0, 1, &r->top_p, e) < 0) return false;
    k = api_int(body, "top_k", -1, 1 << 20, &x, e);
    if (k < 0) return false;
    if (k > 0) r->top_k = (int)x;
    if (api_bool(body, "stream", &r->stream, e) < 0) return false;
    return true;
}

// ----------------------------------------------------------------------------
// /v1/completions and /v1/responses: request parsing, and the responses store
//
// completions (openai's legacy api, what evaluation harnesses score with): one prompt, a
// string (tokenized as it is: ServeEngine.prepare_text) or token ids, or a list holding one
// of them; several prompts in one request are refused by name. logprobs N gives each token's
// logprob and its N most likely alternatives; with echo the prompt comes back, scored too
// (its first token has no logprob), and max_tokens may be 0 (score only).
//
// responses (reference-engine.md 7): input items become a chat (messages, reasoning,
// function calls and their outputs) that the engine renders as for chat completions; the
// output is reasoning / message / function_call items. stored responses (store, default
// true) live in a process-local lru bounded by --response-store-max-records and
// --response-store-max-mib; previous_response_id walks the chain of stored responses and puts
// their inputs and outputs first (instructions belong to one request and are not carried).

static std::string serve_rand_hex(int n);  // the runtime's, below

// the sampler fields completions and responses share with chat completions
static bool apix_sampler(const Json& body, ApiRequest* r, ServeError* e) {
    if (api_number(body, "temperature", 0, 2, &r->temperature, e) < 0) return false;
    if (api_number(body, "top_p", 0, 1, &r->top_p, e) < 0) return false;
    if (!body.get("top_k") && !body.get("seed")) return true;
    int64_t x;
    int k = api_int(body, "top_k", -1, 1 << 20, &x, e);
    if (k < 0) return false;
    if (k > 0) r->top_k = (int)x;
    k = api_int(body, "seed", 0, INT64_MAX, &x, e);
    if (k < 0) return false;
    if (k > 0) { r->has_seed = true; r->seed = (uint64_t)x; }
    return true;
}

// a list of token ids: non-empty, every entry an integer id >= 0
static bool apix_ids(const Json& v, std::vector<int>* out) {
    if (!v.is_array() || v.arr.empty()) return false;
    out->clear();
    for (const auto& x : v.arr) {
        if (!x.is_number() || !x.is_int || x.i < 0 || x.i > INT_MAX) return false;
        out->push_back((int)x.i);
    }
    return true;
}


// POST /v1/completions body -> ApiRequest (raw prompt, no chat)
static bool completions_parse(const Json& body, const ApiContext& ctx, ApiRequest* r, ServeError* e) {
    static const char* const keys[] = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p",
        "presence_penalty", "frequency_penalty", "seed", "stop", "echo", "logprobs", "stream", "stream_options", "n",
        "best_of", "logit_bias", "suffix", nullptr};
    if (!apix_head(body, ctx, keys, r, e)) return false;
    const Json* p = body.get("prompt");
    if (!p || p->is_null()) return api_fail(e, "prompt", "'prompt' is required");
    if (p->is_array() && p->arr.size() == 1 && (p->arr[0].is_string() || p->arr[0].is_array())) {
        p = &p->arr[0];  // a batch of one
    } else if (p->is_array() && !p->arr.empty() && (p->arr[0].is_string() || p->arr[0].is_array())) {
        return api_fail(e, "prompt", "one prompt per request: several prompts in one request are not supported");
    }
    r->raw = true;
    if (p->is_string()) r->raw_text = p->str;
    else if (apix_ids(*p, &r->raw_ids)) r->raw_is_ids = true;
    else return api_fail(e, "prompt", "'prompt' must be a string, a non-empty array of token ids, or an array holding one of them");
    if (api_bool(body, "echo", &r->echo, e) < 0) return false;
    int64_t x;
    int k = api_int(body, "max_tokens", 0, INT_MAX, &x, e);
    if (k < 0) return false;
    if (k > 0) { r->max_tokens = (int)x; r->max_zero = x == 0; }
    if (r->max_zero && !r->echo) return api_fail(e, "max_tokens", "'max_tokens' 0 needs 'echo' (the prompt alone is scored)");
    k = api_int(body, "logprobs", 0, 20, &x, e);
    if (k < 0) return false;
    if (k > 0) r->logprobs = (int)x;
    if (!apix_sampler(body, r, e)) return false;
    if (api_number(body, "min_p", 0, 1, &r->min_p, e) < 0) return false;
    if (api_number(body, "presence_penalty", -2, 2, &r->presence, e) < 0) return false;
    if (api_number(body, "frequency_penalty", -2, 2, &r->frequency, e) < 0) return false;
    if (!api_stop(body.get("stop"), "stop", &r->stop, e)) return false;
    if (!api_logit_bias(body, r, e)) return false;
    for (const char* f : {"n", "best_of"}) {
        k = api_int(body, f, 1, INT_MAX, &x, e);
        if (k < 0) { e->code = "n_not_supported"; return false; }
        if (k > 0 && x != 1) return api_fail(e, f, std::string("only ") + f + " = 1 is supported", "n_not_supported");
    }
    if (const Json* sf = body.get("suffix"); sf && !sf->is_null() && !(sf->is_string() && sf->str.empty()))
        return api_fail(e, "suffix", "'suffix' (insertion) is not supported");
    if (api_bool(body, "stream", &r->stream, e) < 0) return false;
    if (const Json* so = body.get("stream_options"); so && !so->is_null()) {
        if (!r->stream) return api_fail(e, "stream_options", "'stream_options' needs 'stream': true");
        if (!so->is_object()) return api_fail(e, "stream_options", "'stream_options' must be an object");
        for (const auto& kv : so->obj)
            if (kv.first != "include_usage") return api_fail(e, "stream_options", "only stream_options.include_usage is supported", "unknown_parameter");
        if (api_bool(*so, "include_usage", &r->include_usage, e) < 0) { e->param = "stream_options.include_usage"; return false; }
    }
    return true;
}

// ---- the responses store

struct RespRecord {
    std::string id, prev;          // prev: its previous_response_id ("" = none)
    Json response;                 // the response object as returned
    Json input;                    // this request's input items (with ids), without instructions
    size_t bytes = 0;              // what the record counts against --response-store-max-mib
};
struct RespStore {
    std::mutex mu;
    std::list<RespRecord> lru;     // most recently used first
    std::unordered_map<std::string, std::list<RespRecord>::iterator> by_id;
    size_t bytes = 0, max_bytes = 0;
    size_t max_records = 0;
};
static RespStore& g_resp = *new RespStore;  // never destroyed, as g_serve

// keep a record, evicting the least recently used ones; false when it alone exceeds the
// budget (it is not kept then)
static bool resp_store_put(RespRecord rec) {
    rec.bytes = json_dump(rec.response).size() + json_dump(rec.input).size() + rec.id.size() + rec.prev.size();
    std::lock_guard<std::mutex> lk(g_resp.mu);
    if (g_resp.max_records == 0 || rec.bytes > g_resp.max_bytes) return false;
    while (!g_resp.lru.empty() && (g_resp.lru.size() + 1 > g_resp.max_records || g_resp.bytes + rec.bytes > g_resp.max_bytes)) {
        g_resp.bytes -= g_resp.lru.back().bytes;
        g_resp.by_id.erase(g_resp.lru.back().id);
        g_resp.lru.pop_back();
    }
    g_resp.bytes += rec.bytes;
    g_resp.lru.push_front(std::move(rec));
    g_resp.by_id[g_resp.lru.front().id] = g_resp.lru.begin();
    return true;
}
// a copy of the record (marked recently used); false when there is none
static bool resp_store_get(const std::string& id, RespRecord* out) {
    std::lock_guard<std::mutex> lk(g_resp.mu);
    auto it = g_resp.by_id.find(id);
    if (it == g_resp.by_id.end()) return false;
    g_resp.lru.splice(g_resp.lru.begin(), g_resp.lru, it->second);
    *out = *it->second;
    return true;
}
static bool resp_store_delete(const std::string& id) {
    std::lock_guard<std::mutex> lk(g_resp.mu);
    auto it = g_resp.by_id.find(id);
    if (it == g_resp.by_id.end()) return false;
    g_resp.bytes -= it->second->bytes;
    g_resp.lru.erase(it->second);
    g_resp.by_id.erase(it);
    return true;
}

// the item history behind previous_response_id: every stored response of the chain, oldest
// first, its input items then its output items
static bool resp_history(const std::string& prev, Json* items, ServeError* e) {
    std::vector<RespRecord> chain;
    for (std::string id = prev; !id.empty();) {
        RespRecord rec;
        if (!resp_store_get(id, &rec))
            return api_fail(e, "previous_response_id", id == prev ? "no stored response has this id (responses are kept in memory, up to --response-store-max-records)"
                                                                  : "a response earlier in this chain is no longer stored", "response_not_found", 404);
        id = rec.prev;
        chain.push_back(std::move(rec));
        if (chain.size() > g_resp.max_records) return api_fail(e, "previous_response_id", "the response chain is longer than the store", "response_not_found", 404);
    }
    *items = Json::array();
    for (size_t k = chain.size(); k-- > 0;) {
        for (const auto& it : chain[k].input.arr) items->push(it);
        if (const Json* out = chain[k].response.get("output")) for (const auto& it : out->arr) items->push(it);
    }
    return true;
}

// ---- responses input items -> chat messages

// the text of a content part list: input_text / output_text parts joined; media become
// image_url parts (with vision) in *parts
static bool resp_content(const Json& c, bool vision, bool assistant, std::string* text, Json* parts, const std::string& where, ServeError* e) {
    text->clear();
    *parts = Json::array();
    bool media = false;
    if (c.is_string()) { *text = c.str; *parts = Json(); return true; }
    if (!c.is_array()) return api_fail(e, (where + ".content").c_str(), "content must be a string or an array of content parts");
    for (const auto& p : c.arr) {
        const Json* t = p.is_object() ? p.get("type") : nullptr;
        if (!t || !t->is_string()) return api_fail(e, (where + ".content").c_str(), "each content part must be an object with a 'type'");
        const Json* tx = p.get("text");
        if (t->str == "input_text" || t->str == "output_text") {
            if (!tx || !tx->is_string()) return api_fail(e, (where + ".content").c_str(), "a text part needs a string 'text'");
            *text += tx->str;
            Json q = Json::object();
            q.set("type", Json::string("text"));
            q.set("text", *tx);
            parts->push(q);
        } else if (t->str == "input_image" && !assistant) {
            if (!vision) return api_fail(e, (where + ".content").c_str(), "images need a server started with --vision", "vision_disabled");
            const Json* url = p.get("image_url");
            if (!url || !url->is_string()) return api_fail(e, (where + ".content").c_str(), "an input_image part needs an 'image_url' (file_id is not supported)");
            Json iu = Json::object();
            iu.set("url", *url);
            Json q = Json::object();
            q.set("type", Json::string("image_url"));
            q.set("image_url", iu);
            parts->push(q);
            media = true;
        } else {
            return api_fail(e, (where + ".content").c_str(), "unsupported content part type (input_text, output_text and input_image are)");
        }
    }
    if (!media) *parts = Json();
    return true;
}

// items (history then this request's input) -> chat messages. reasoning items open an
// assistant turn that the following assistant message and function calls join; a function
// call joins the open assistant turn; anything else closes it. `first` is the index of the
// request's own first item, for error messages.
static bool resp_items_to_chat(const Json& items, size_t first, bool vision, Json* msgs, ServeError* e) {
    static const char* const item_keys[] = {"type", "id", "status", "role", "content", "call_id", "name", "arguments",
        "output", "summary", "encrypted_content", nullptr};
    bool open = false;  // msgs' last message is an assistant turn others may join
    for (size_t i = 0; i < items.arr.size(); i++) {
        const Json& it = items.arr[i];
        std::string where = i >= first ? "input[" + std::to_string(i - first) + "]" : "previous_response_id";
        if (!it.is_object()) return api_fail(e, where.c_str(), "each input item must be an object");
        for (const auto& kv : it.obj)
            if (!api_known_key(kv.first, item_keys)) return api_fail(e, (where + "." + (kv.first.size() <= 64 ? kv.first : "?")).c_str(), "unknown item field", "unknown_parameter");
        const Json* ty = it.get("type");
        std::string type = ty && ty->is_string() ? ty->str : ty ? "?" : "message";
        auto str = [&](const char* k, std::string* out) {
            const Json* v = it.get(k);
            if (!v || !v->is_string() || v->str.empty()) return api_fail(e, (where + "." + k).c_str(), std::string("'") + k + "' must be a non-empty string");
            *out = v->str; return true;
        };
        if (type == "message") {
            const Json* role = it.get("role");
            if (!role || !role->is_string()) return api_fail(e, (where + ".role").c_str(), "a message needs a 'role'");
            const std::string& r = role->str;
            if (r != "user" && r != "assistant" && r != "system" && r != "developer")
                return api_fail(e, (where + ".role").c_str(), "role must be user, assistant, system or developer", "unsupported_role");
            const Json* c = it.get("content");
            if (!c) return api_fail(e, (where + ".content").c_str(), "a message needs 'content'");
            std::string text; Json parts;
            if (!resp_content(*c, vision, r == "assistant", &text, &parts, where, e)) return false;
            if (r == "assistant") {
                Json* last = open ? &msgs->arr.back() : nullptr;
                if (last && last->get("content")->str.empty() && !last->get("tool_calls")) { last->set("content", Json::string(text)); continue; }
                Json m = Json::object();
                m.set("role", Json::string("assistant"));
                m.set("content", Json::string(text));
                msgs->push(m);
                open = true;
                continue;
            }
            Json m = Json::object();
            m.set("role", Json::string(r));
            m.set("content", parts.is_array() ? parts : Json::string(text));
            msgs->push(m);
            open = false;
        } else if (type == "reasoning") {
            const Json* ec = it.get("encrypted_content");
            if (ec && !ec->is_null()) return api_fail(e, (where + ".encrypted_content").c_str(), "encrypted reasoning is not supported");
            const Json* sm = it.get("summary");
            if (sm && !sm->is_null() && !(sm->is_array() && sm->arr.empty()))
                return api_fail(e, (where + ".summary").c_str(), "reasoning summaries are not supported (the raw text is in 'content')");
            std::string text;
            if (const Json* c = it.get("content"); c && !c->is_null()) {
                if (!c->is_array()) return api_fail(e, (where + ".content").c_str(), "reasoning content must be an array of reasoning_text parts");
                for (const auto& p : c->arr) {
                    const Json* t = p.get("type");
                    const Json* tx = p.get("text");
                    if (!t || !t->is_string() || t->str != "reasoning_text" || !tx || !tx->is_string())
                        return api_fail(e, (where + ".content").c_str(), "reasoning content parts are {\"type\":\"reasoning_text\",\"text\":...}");
                    text += tx->str;
                }
            }
            Json m = Json::object();
            m.set("role", Json::string("assistant"));
            m.set("content", Json::string(""));
            m.set("reasoning_content", Json::string(text));
            msgs->push(m);
            open = true;
        } else if (type == "function_call") {
            std::string call_id, name, args;
            if (!str("call_id", &call_id) || !str("name", &name)) return false;
            const Json* a = it.get("arguments");
            if (!a || !a->is_string()) return api_fail(e, (where + ".arguments").c_str(), "'arguments' must be a string (a json object's text)");
            Json obj; std::string jerr;
            if (!json_parse(a->str, &obj, &jerr, 32) || !obj.is_object())
                return api_fail(e, (where + ".arguments").c_str(), "'arguments' is not the text of a json object");
            Json fn = Json::object();
            fn.set("name", Json::string(name));
            fn.set("arguments", obj);
            Json tc = Json::object();
            tc.set("id", Json::string(call_id));
            tc.set("type", Json::string("function"));
            tc.set("function", fn);
            if (!open) {
                Json m = Json::object();
                m.set("role", Json::string("assistant"));
                m.set("content", Json::string(""));
                msgs->push(m);
                open = true;
            }
            Json& last = msgs->arr.back();
            if (!last.get("tool_calls")) last.set("tool_calls", Json::array());
            last.get("tool_calls")->push(tc);
        } else if (type == "function_call_output") {
            std::string call_id;
            if (!str("call_id", &call_id)) return false;
            const Json* o = it.get("output");
            std::string text; Json parts;
            if (!o) return api_fail(e, (where + ".output").c_str(), "a function_call_output needs 'output'");
            if (o->is_string()) text = o->str;
            else if (!resp_content(*o, false, true, &text, &parts, where + ".output", e)) return false;
            Json m = Json::object();
            m.set("role", Json::string("tool"));
            m.set("tool_call_id", Json::string(call_id));
            m.set("content", Json::string(text));
            msgs->push(m);
            open = false;
        } else {
            return api_fail(e, (where + ".type").c_str(), "unsupported input item type (message, reasoning, function_call and function_call_output are)");
        }
    }
    return true;
}

// POST /v1/responses (and /v1/responses/input_tokens, counting) body -> ApiRequest. r->resp
// keeps what the response object echoes and the store keeps: instructions, metadata, store,
// previous_response_id, tools, tool_choice, reasoning, sampler fields, and this request's
// input items.
static bool responses_parse(const Json& body, const ApiContext& ctx, bool counting, ApiRequest* r, ServeError* e) {
    static const char* const keys[] = {"model", "input", "instructions", "previous_response_id", "max_output_tokens",
        "stream", "store", "temperature", "top_p", "metadata", "reasoning", "preserve_thinking", "chat_template_kwargs",
        "text", "tools", "tool_choice", "parallel_tool_calls", "truncation", "top_logprobs", "service_tier", "background",
        "include", nullptr};
    static const char* const count_keys[] = {"model", "input", "instructions", "previous_response_id", "reasoning",
        "preserve_thinking", "chat_template_kwargs", "text", "tools", "tool_choice", "parallel_tool_calls", "truncation", nullptr};
    if (!apix_head(body, ctx, counting ? count_keys : keys, r, e)) return false;
    Json& rs = r->resp = Json::object();
    // input: a string (one user message) or a non-empty item array
    const Json* in = body.get("input");
    Json input = Json::array();
    if (!in || in->is_null()) return api_fail(e, "input", "'input' is required");
    if (in->is_string()) {
        Json m = Json::object();
        m.set("type", Json::string("message"));
        m.set("role", Json::string("user"));
        Json part = Json::object();
        part.set("type", Json::string("input_text"));
        part.set("text", *in);
        Json content = Json::array();
        content.push(part);
        m.set("content", content);
        input.push(m);
    } else if (in->is_array() && !in->arr.empty()) {
        input = *in;
    } else {
        return api_fail(e, "input", "'input' must be a string or a non-empty array of items");
    }
    for (auto& it : input.arr)  // ids for input_items listings, as openai gives them
        if (it.is_object() && !it.get("id")) it.set("id", Json::string("item_" + serve_rand_hex(24)));
    // instructions: a leading developer turn for this request only
    Json msgs = Json::array();
    if (const Json* ins = body.get("instructions"); ins && !ins->is_null()) {
        if (!ins->is_string()) return api_fail(e, "instructions", "'instructions' must be a string");
        Json m = Json::object();
        m.set("role", Json::string("developer"));
        m.set("content", *ins);
        msgs.push(m);
        rs.set("instructions", *ins);
    } else {
        rs.set("instructions", Json());
    }
    Json items = Json::array();
    rs.set("previous_response_id", Json());
    if (const Json* pid = body.get("previous_response_id"); pid && !pid->is_null()) {
        if (!pid->is_string() || pid->str.empty()) return api_fail(e, "previous_response_id", "'previous_response_id' must be a response id");
        if (!resp_history(pid->str, &items, e)) return false;
        rs.set("previous_response_id", *pid);
    }
    size_t first = items.arr.size();
    for (const auto& it : input.arr) items.push(it);
    if (!resp_items_to_chat(items, first, ctx.vision, &msgs, e)) return false;
    bool any = false;
    for (const auto& m : msgs.arr) any = any || m.get("role")->str != "developer";
    if (!any) return api_fail(e, "input", "the input has no turns");
    r->chat.messages = msgs;
    rs.set("input", input);
    // tools: flat function definitions
    Json tools_out = Json::array();
    std::string strict;
    if (const Json* tl = body.get("tools"); tl && !tl->is_null()) {
        if (!tl->is_array()) return api_fail(e, "tools", "'tools' must be an array");
        Json chat_tools = Json::array();
        for (size_t i = 0; i < tl->arr.size(); i++) {
            const Json& t = tl->arr[i];
            std::string where = "tools[" + std::to_string(i) + "]";
            const Json* ty = t.is_object() ? t.get("type") : nullptr;
            if (!ty || !ty->is_string()) return api_fail(e, where.c_str(), "each tool must be an object with a 'type'");
            if (ty->str != "function") return api_fail(e, (where + ".type").c_str(), "only function tools are supported (no hosted, mcp or custom tools)", "tool_type_not_supported");
            for (const auto& kv : t.obj)
                if (kv.first != "type" && kv.first != "name" && kv.first != "description" && kv.first != "parameters" && kv.first != "strict")
                    return api_fail(e, (where + "." + (kv.first.size() <= 64 ? kv.first : "?")).c_str(), "unknown tool field", "unknown_parameter");
            const Json* st = t.get("strict");
            if (st && !st->is_null() && !st->is_bool()) return api_fail(e, (where + ".strict").c_str(), "'strict' must be a boolean");
            if (st && st->is_bool() && st->b && strict.empty()) strict = where + ".strict";  // kept by a forced call only (below)
            Json fn = Json::object();
            for (const char* k : {"name", "description", "parameters"}) if (const Json* v = t.get(k)) fn.set(k, *v);
            Json ct = Json::object();
            ct.set("type", Json::string("function"));
            ct.set("function", fn);
            chat_tools.push(ct);
            Json echo = t;
            if (!echo.get("strict")) echo.set("strict", Json::boolean(false));
            if (!echo.get("parameters") || echo.get("parameters")->is_null()) echo.set("parameters", Json());
            if (!echo.get("description")) echo.set("description", Json());
            tools_out.push(echo);
        }
        if (!openai_check_tools(&chat_tools, &r->chat.tools, e)) return false;
    }
    rs.set("tools", tools_out);
    rs.set("tool_choice", Json::string("auto"));
    if (const Json* tc = body.get("tool_choice"); tc && !tc->is_null()) {
        if (!r->chat.tools.is_array() && !(tc->is_string() && (tc->str == "auto" || tc->str == "none")))
            return api_fail(e, "tool_choice", "'tool_choice' needs 'tools'");
        if (!api_openai_tool_choice(*tc, true, r, e)) return false;
        rs.set("tool_choice", *tc);
    }
    if (!strict.empty() && !r->grammar)
        return api_fail(e, strict, "strict tool schemas need a forced tool call (tool_choice required or a function); send strict: false", "strict_not_supported");
    if (const Json* v = body.get("parallel_tool_calls"); v && !v->is_null() && !(v->is_bool() && (v->b || r->grammar)))
        return api_fail(e, "parallel_tool_calls", "parallel_tool_calls false is supported with a forced tool call only (otherwise the model may call several tools)");
    if (const Json* v = body.get("truncation"); v && !v->is_null() && !(v->is_string() && v->str == "disabled"))
        return api_fail(e, "truncation", "only truncation 'disabled' is supported (a prompt that does not fit is an error)");
    Json text_fmt = Json::object();
    text_fmt.set("type", Json::string("text"));
    if (const Json* tx = body.get("text"); tx && !tx->is_null()) {
        if (!tx->is_object()) return api_fail(e, "text", "'text' must be an object");
        static const char* const tx_keys[] = {"format", "verbosity", nullptr};
        if (!api_only_keys(*tx, tx_keys, "text", e)) return false;
        if (const Json* v = tx->get("verbosity"); v && !v->is_null() && !(v->is_string() && v->str == "medium"))
            return api_fail(e, "text.verbosity", "only text.verbosity 'medium' is supported");
        const Json* f = tx->get("format");
        const Json* ty = f && f->is_object() ? f->get("type") : nullptr;
        if (f && !f->is_null()) {
            if (!ty || !ty->is_string()) return api_fail(e, "text.format", "'text.format' must be an object with a 'type'");
            if (ty->str == "text" || ty->str == "json_object") {
                static const char* const f_keys[] = {"type", nullptr};
                if (!api_only_keys(*f, f_keys, "text.format", e)) return false;
            } else if (ty->str == "json_schema") {
                static const char* const f_keys[] = {"type", "name", "description", "schema", "strict", nullptr};
                if (!api_only_keys(*f, f_keys, "text.format", e)) return false;
                const Json* nm = f->get("name");
                if (!nm || !nm->is_string()) return api_fail(e, "text.format.name", "'name' must be a string");
                const Json* st = f->get("strict");
                if (st && !st->is_null() && !st->is_bool()) return api_fail(e, "text.format.strict", "'strict' must be a boolean");
                const Json* sc = f->get("schema");
                if (!sc || !sc->is_object()) return api_fail(e, "text.format.schema", "'schema' must be a json schema object");
            } else return api_fail(e, "text.format.type", "text.format type must be text, json_object or json_schema", "response_format_not_supported");
            if (ty->str != "text" && r->grammar) return api_fail(e, "text.format", "text.format cannot be combined with a forced tool call");
            if (ty->str == "json_object" && !api_schema_grammar(nullptr, true, "text.format", r, e)) return false;
            if (ty->str == "json_schema" && !api_schema_grammar(f->get("schema"), false, "text.format.schema", r, e)) return false;
            text_fmt = *f;
        }
    }
    rs.set("text_format", text_fmt);
    // thinking: reasoning.effort, preserve_thinking, chat_template_kwargs (as chat completions)
    int think = -1, preserve = -1, k;
    bool b;
    Json reasoning = Json::object();
    reasoning.set("effort", Json());
    reasoning.set("summary", Json());
    if (const Json* re = body.get("reasoning"); re && !re->is_null()) {
        if (!re->is_object()) return api_fail(e, "reasoning", "'reasoning' must be an object");
        for (const auto& kv : re->obj) {
            if (kv.first == "effort") continue;
            if (kv.first == "summary" && kv.second.is_null()) continue;
            return api_fail(e, ("reasoning." + (kv.first.size() <= 64 ? kv.first : "?")).c_str(),
                            kv.first == "summary" ? "reasoning summaries are not supported" : "unknown parameter",
                            kv.first == "summary" ? "invalid_request_error" : "unknown_parameter");
        }
        if (const Json* ef = re->get("effort"); ef && !ef->is_null()) {
            static const char* const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max", nullptr};
            if (!ef->is_string() || !api_known_key(ef->str, efforts)) return api_fail(e, "reasoning.effort", "'reasoning.effort' must be none, minimal, low, medium, high, xhigh or max");
            if (ef->str == "minimal" || ef->str == "high" || ef->str == "max")
                return api_fail(e, "reasoning.effort", "this reasoning effort is not supported", "reasoning_effort_not_supported");
            if (ef->str == "none") think = 0;
            else { think = 1; r->chat.reasoning_effort = ef->str; }
            reasoning.set("effort", *ef);
        }
    }
    rs.set("reasoning", reasoning);
    if ((k = api_bool(body, "preserve_thinking", &b, e)) < 0) return false;
    if (k > 0) preserve = b;
    if (const Json* kw = body.get("chat_template_kwargs"); kw && !kw->is_null()) {
        if (!kw->is_object()) return api_fail(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        for (const auto& kv : kw->obj)
            if (kv.first != "enable_thinking" && kv.first != "preserve_thinking")
                return api_fail(e, "chat_template_kwargs", "only enable_thinking and preserve_thinking are supported", "unknown_parameter");
        if ((k = api_bool(*kw, "enable_thinking", &b, e)) < 0) { e->param = "chat_template_kwargs.enable_thinking"; return false; }
        if (k > 0 && !api_merge_switch(&think, b, "chat_template_kwargs.enable_thinking", e)) return false;
        if ((k = api_bool(*kw, "preserve_thinking", &b, e)) < 0) { e->param = "chat_template_kwargs.preserve_thinking"; return false; }
        if (k > 0 && !api_merge_switch(&preserve, b, "chat_template_kwargs.preserve_thinking", e)) return false;
    }
    r->chat.enable_thinking = think >= 0 ? think : ctx.thinking;
    r->chat.preserve_thinking = preserve >= 0 ? preserve : ctx.preserve_thinking;
    if (counting) return true;
    int64_t x;
    if ((k = api_int(body, "max_output_tokens", 16, INT_MAX, &x, e)) < 0) return false;
    if (k > 0) r->max_tokens = (int)x;
    rs.set("max_output_tokens", k > 0 ? Json::integer(x) : Json());
    if (!apix_sampler(body, r, e)) return false;
    rs.set("temperature", isnan(r->temperature) ? Json() : Json::number(r->temperature));
    rs.set("top_p", isnan(r->top_p) ? Json() : Json::number(r->top_p));
    if (api_bool(body, "stream", &r->stream, e) < 0) return false;
    bool store = true;
    if (api_bool(body, "store", &store, e) < 0) return false;
    rs.set("store", Json::boolean(store));
    Json md = Json::object();
    if (const Json* m = body.get("metadata"); m && !m->is_null()) {
        if (!m->is_object() || m->size() > 16) return api_fail(e, "metadata", "'metadata' must be an object of at most 16 string pairs");
        for (const auto& kv : m->obj)
            if (kv.first.size() > 64 || !kv.second.is_string() || kv.second.str.size() > 512)
                return api_fail(e, "metadata", "'metadata' keys are at most 64 characters, values strings of at most 512");
        md = *m;
    }
    rs.set("metadata", md);
    if ((k = api_int(body, "top_logprobs", 0, 0, &x, e)) < 0) return api_fail(e, "top_logprobs", "only top_logprobs 0 is supported here (chat and legacy completions give logprobs)");
    if (const Json* v = body.get("service_tier"); v && !v->is_null() && !(v->is_string() && (v->str == "auto" || v->str == "default")))
        return api_fail(e, "service_tier", "only service_tier 'auto' or 'default' is supported");
    if (const Json* v = body.get("background"); v && !v->is_null() && !(v->is_bool() && !v->b))
        return api_fail(e, "background", "background responses are not supported");
    if (const Json* v = body.get("include"); v && !v->is_null() && !(v->is_array() && v->arr.empty()))
        return api_fail(e, "include", "'include' must be empty (nothing extra can be included)");
    return true;
}

// ----------------------------------------------------------------------------
// the server runtime: connections, the queue, the engine thread

static double serve_now() {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// one queued generation, shared by its connection thread and the engine thread. everything
// but cancel is guarded by g_serve.mu.
struct ServeJob {
    ServePrompt prompt;
    ServeSampling sampling;
    std::atomic<bool> cancel{false};     // the client is gone, or the server stops
    std::condition_variable cv;          // engine -> connection: started, events, done
    std::deque<ServeEvent> events;
    bool started = false, done = false;
    ServeResult result;
    double t_enqueue = 0, t_start = 0, t_first = 0, t_done = 0;
};

struct ServeState {
    ServeOptions opt;
    ServeEngine* eng = nullptr;
    std::string model_id;                // the public id
    ApiContext api;
    HttpLimits lim;
    int listen_fd = -1;
    int stop_pipe[2] = {-1, -1};         // a byte is written on every signal; never read, so it
                                         // stays readable and wakes every idle poll at once
    std::atomic<int> signals{0};         // 1: drain, 2+: cancel everything now (lock-free: safe in a handler)
    std::atomic<bool> force_cancel{false};
    std::mutex mu;                       // the queue, jobs, counters
    std::condition_variable engine_cv;   // work for the engine thread
    std::condition_variable conns_cv;    // a connection ended
    std::deque<std::shared_ptr<ServeJob>> queue;
    bool engine_exit = false;
    int running = 0;                     // requests generating now (at most --max-concurrency)
    int n_conns = 0;
    std::atomic<int64_t> body_bytes{0};  // request bytes buffered by all connections together;
    int64_t body_budget = 0;             // at most 4x --max-request-mib, else 503
    std::mutex log_mu;
    FILE* jsonl = nullptr;
    long created = 0;                    // unix time at start
    std::atomic<uint64_t> rng{0};
    // stats since the last stats line
    long st_requests = 0, st_prompt = 0, st_completion = 0;
    double st_decode_s = 0;
};
// one server per process (signal handlers need a global). never destroyed: detached
// connection threads may still be finishing when main returns.
static ServeState& g_serve = *new ServeState;

static uint64_t serve_rand() {  // splitmix64 over an atomic counter seeded at start
    uint64_t z = g_serve.rng.fetch_add(0x9E3779B97F4A7C15ull) + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static std::string serve_rand_hex(int n) {
    static const char* hex = "0123456789abcdef";
    std::string s;
    while ((int)s.size() < n) { uint64_t r = serve_rand(); for (int k = 0; k < 16 && (int)s.size() < n; k++) s.push_back(hex[(r >> (4 * k)) & 15]); }
    return s;
}

static bool serve_stopping() { return g_serve.signals > 0; }
static bool serve_cancel_all() { return g_serve.signals > 1 || g_serve.force_cancel.load(); }

// ---- the request log

struct ServeReqLog {
    std::string method, path, id, code, finish, api;
    int status = 0;
    bool stream = false;
    int prompt = -1, completion = -1, cached = -1;
    std::string cache;
    double t0 = 0, queue_s = -1, ttft_s = -1, prefill_s = -1, decode_s = -1;
    ServeSpecStats spec;
    double prepare_mib = -1;       // the most memory the request's preparation held (request memory section)
};

// a printable, bounded copy of a request path for the log
static std::string serve_log_path(const std::string& p) {
    std::string s;
    for (char c : p) { if (s.size() >= 80) { s += "..."; break; } s.push_back((c > 0x20 && c < 0x7f) ? c : '?'); }
    return s.empty() ? "-" : s;
}

static void serve_jsonl(Json ev) {
    if (!g_serve.jsonl) return;
    struct timespec t; clock_gettime(CLOCK_REALTIME, &t);
    Json o = Json::object();
    o.set("schema", Json::string("ninfer_serve_request_log"));
    o.set("version", Json::integer(1));
    o.set("time", Json::number(t.tv_sec + t.tv_nsec * 1e-9));
    for (auto& kv : ev.obj) o.set(kv.first, kv.second);
    std::string s = json_dump(o);
    std::lock_guard<std::mutex> lk(g_serve.log_mu);
    fprintf(g_serve.jsonl, "%s\n", s.c_str());
    fflush(g_serve.jsonl);
}

// one line per request on stderr (and request_done / request_error / request_rejected in
// the jsonl log): status, route, id, token counts, timings, finish reason. never text.
static void serve_log_request(const ServeReqLog& l) {
    double total = serve_now() - l.t0;
    char buf[768];
    int n = snprintf(buf, sizeof buf, "ninfer-serve: %d %s %s", l.status, serve_log_path(l.method).c_str(), serve_log_path(l.path).c_str());
    auto add = [&](const char* fmt, auto... v) { if (n < (int)sizeof buf) n += snprintf(buf + n, sizeof buf - n, fmt, v...); };
    if (!l.id.empty()) add(" id=%s", l.id.c_str());
    if (!l.api.empty()) add(" stream=%d", (int)l.stream);
    if (l.prompt >= 0) add(" prompt=%d", l.prompt);
    if (l.completion >= 0) add(" completion=%d", l.completion);
    if (l.cached >= 0) add(" cached=%d", l.cached);
    if (!l.cache.empty()) add(" cache=%s", l.cache.c_str());
    if (!l.finish.empty()) add(" finish=%s", l.finish.c_str());
    if (!l.code.empty()) add(" code=%s", l.code.c_str());
    if (l.queue_s >= 0) add(" queue_ms=%.1f", l.queue_s * 1e3);
    if (l.ttft_s >= 0) add(" ttft_ms=%.1f", l.ttft_s * 1e3);
    if (l.prefill_s >= 0) add(" prefill_ms=%.1f", l.prefill_s * 1e3);
    if (l.decode_s >= 0) add(" decode_ms=%.1f", l.decode_s * 1e3);
    if (l.decode_s > 0 && l.completion > 1) add(" decode_tok_s=%.1f", (l.completion - 1) / l.decode_s);
    if (!l.spec.backend.empty())
        add(" spec=%s/%d rounds=%ld drafted=%ld accepted=%ld", l.spec.backend.c_str(), l.spec.draft_window, l.spec.rounds,
            l.spec.drafted_tokens, l.spec.accepted_tokens);
    if (l.prepare_mib >= 0) add(" prepare_mib=%.1f", l.prepare_mib);
    add(" total_ms=%.1f", total * 1e3);
    fprintf(stderr, "%s\n", buf);
    if (g_serve.jsonl && !l.api.empty()) {
        Json e = Json::object();
        bool rejected = l.status == 429 || (l.status == 503 && l.prompt >= 0 && l.completion < 0);
        e.set("event", Json::string(l.status == 200 ? "request_done" : rejected ? "request_rejected" : "request_error"));
        if (!l.id.empty()) e.set("id", Json::string(l.id));
        e.set("api", Json::string(l.api));
        e.set("status", Json::integer(l.status));
        if (!l.code.empty()) e.set("code", Json::string(l.code));
        if (!l.finish.empty()) e.set("finish_reason", Json::string(l.finish));
        if (l.prompt >= 0) e.set("prompt_tokens", Json::integer(l.prompt));
        if (l.completion >= 0) e.set("completion_tokens", Json::integer(l.completion));
        if (l.cached >= 0) e.set("cached_tokens", Json::integer(l.cached));
        if (!l.cache.empty()) e.set("cache", Json::string(l.cache));
        Json t = Json::object();
        if (l.queue_s >= 0) t.set("queue", Json::number(l.queue_s));
        if (l.ttft_s >= 0) t.set("ttft", Json::number(l.ttft_s));
        if (l.prefill_s >= 0) t.set("prefill", Json::number(l.prefill_s));
        if (l.decode_s >= 0) t.set("decode", Json::number(l.decode_s));
        t.set("total", Json::number(total));
        e.set("timings_seconds", t);
        if (!l.spec.backend.empty()) e.set("speculative", serve_spec_json(l.spec, true));
        serve_jsonl(e);
    }
}

// ---- the engine thread

static bool serve_job_cancelled(void* ctx) {
    ServeJob* j = (ServeJob*)ctx;
    if (serve_cancel_all()) j->cancel = true;  // remembered: the response says why it ended
    return j->cancel.load();
}
static bool serve_job_emit(void* ctx, const ServeEvent& ev) {
    ServeJob* j = (ServeJob*)ctx;
    {
        std::lock_guard<std::mutex> lk(g_serve.mu);
        if (j->t_first == 0) j->t_first = serve_now();
        j->events.push_back(ev);
    }
    j->cv.notify_all();
    return !serve_job_cancelled(ctx);
}

static void serve_stats_line() {  // called with g_serve.mu held
    ServeState& s = g_serve;
    if (s.st_requests == 0 && !s.running && s.queue.empty()) return;  // quiet when idle
    const std::string eng = s.eng && s.eng->stats ? s.eng->stats(s.eng->self) : std::string();
    fprintf(stderr, "ninfer-serve: stats: requests=%ld prompt_tokens=%ld completion_tokens=%ld decode_tok_s=%.1f running=%d pending=%zu connections=%d%s\n",
            s.st_requests, s.st_prompt, s.st_completion, s.st_decode_s > 0 ? s.st_completion / s.st_decode_s : 0.0,
            s.running, s.queue.size(), s.n_conns, eng.c_str());
    s.st_requests = s.st_prompt = s.st_completion = 0; s.st_decode_s = 0;
}

static void* serve_engine_main(void*) {
    ServeState& s = g_serve;
    std::unique_lock<std::mutex> lk(s.mu);
    for (;;) {
        if (s.queue.empty()) {
            if (s.engine_exit) break;
            s.engine_cv.wait_for(lk, std::chrono::milliseconds(1000));
            continue;
        }
        std::shared_ptr<ServeJob> j = s.queue.front();
        s.queue.pop_front();
        j->started = true; j->t_start = serve_now();
        s.running++;
        j->cv.notify_all();
        lk.unlock();
        ServeResult res;
        res.prompt_tokens = (int)j->prompt.tokens.size();
        if (!serve_job_cancelled(j.get())) {
            ServeSink sink{serve_job_emit, serve_job_cancelled, j.get()};
            try { s.eng->generate(s.eng->self, j->prompt, j->sampling, sink, &res); }
            catch (...) { res.error = "generation failed"; }  // an allocation failure included: this request fails, the next runs
        }
        lk.lock();
        j->result = std::move(res); j->done = true; j->t_done = serve_now();
        s.running--;
        s.st_requests++; s.st_prompt += res.prompt_tokens; s.st_completion += res.completion_tokens; s.st_decode_s += res.decode_s;
        j->cv.notify_all();
    }
    return nullptr;
}

// ---- connections

struct ServeConn {
    int fd = -1;
    int64_t held = 0;              // bytes of g_serve.body_bytes this connection accounts for
    std::string in;                // received bytes not consumed yet
    bool broken = false;           // a write failed or the peer left: no more writes
    bool chunked_out = false;      // the streaming response in progress is chunk-framed
    bool head = false;             // the request is a HEAD: responses carry no body (content-length stays)
    uint64_t written = 0;          // bytes sent on this connection
};

// read what is there into c->in, waiting until the deadline. returns bytes read, 0 at eof or
// a reset, -1 on timeout or a poll error, -2 when idle and the server stops.
static int serve_conn_read(ServeConn* c, double deadline, bool idle) {
    for (;;) {
        double left = deadline - serve_now();
        if (left <= 0) return -1;
        struct pollfd p[2] = {{c->fd, POLLIN, 0}, {g_serve.stop_pipe[0], POLLIN, 0}};
        int r = poll(p, idle ? 2 : 1, (int)std::min(left * 1e3 + 1, 1e9));
        if (r < 0) { if (errno == EINTR) continue; return -1; }
        if (idle && (p[1].revents & POLLIN)) return -2;
        if (r == 0) continue;
        char buf[65536];
        ssize_t k = recv(c->fd, buf, sizeof buf, 0);
        if (k > 0) { c->in.append(buf, k); return (int)k; }
        if (k == 0) return 0;
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        return 0;  // a reset: the peer is gone, as at eof (not a timeout)
    }
}

// write everything or give up: a write that makes no progress for --write-timeout-ms, or
// any socket error (the peer left), marks the connection broken. never raises SIGPIPE.
static bool serve_conn_write(ServeConn* c, const char* p, size_t n) {
    if (c->broken) return false;
    double deadline = serve_now() + g_serve.opt.write_timeout_ms / 1e3;
    while (n > 0) {
        ssize_t k = send(c->fd, p, n, MSG_NOSIGNAL);
        if (k > 0) { p += k; n -= k; c->written += k; deadline = serve_now() + g_serve.opt.write_timeout_ms / 1e3; continue; }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            double left = deadline - serve_now();
            if (left <= 0) { c->broken = true; return false; }
            struct pollfd pf = {c->fd, POLLOUT, 0};
            poll(&pf, 1, (int)(left * 1e3) + 1);
            continue;
        }
        c->broken = true;
        return false;
    }
    return true;
}
static bool serve_conn_write(ServeConn* c, const std::string& s) { return serve_conn_write(c, s.data(), s.size()); }

// has the client gone? (eof or reset; pipelined bytes waiting to be read mean it is alive)
static bool serve_conn_peer_gone(ServeConn* c) {
    if (c->broken) return true;
    char b;
    ssize_t k = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k == 0) return true;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    return false;
}

// close so that the client reads our last response: stop writing, drain what it still sends
// for a moment (closing with unread input would reset the connection), then close
static void serve_conn_close(ServeConn* c) {
    if (c->fd < 0) return;
    shutdown(c->fd, SHUT_WR);
    double deadline = serve_now() + 1.0;
    size_t drained = 0;
    char buf[65536];
    while (drained < (64u << 20)) {
        double left = deadline - serve_now();
        if (left <= 0) break;
        struct pollfd pf = {c->fd, POLLIN, 0};
        if (poll(&pf, 1, (int)(left * 1e3) + 1) <= 0) break;
        ssize_t k = recv(c->fd, buf, sizeof buf, 0);
        if (k <= 0) break;
        drained += k;
    }
    close(c->fd);
    c->fd = -1;
}

// a response head. clen >= 0: content-length; -1: chunked (http/1.1 streams); -2: delimited
// by close (http/1.0 streams)
static std::string http_response_head(int status, const char* ctype, long long clen, bool keep, const std::string& extra = "") {
    std::string h = "HTTP/1.1 " + std::to_string(status) + " " + http_status_text(status) + "\r\n";
    if (ctype) h += std::string("Content-Type: ") + ctype + "\r\n";
    if (clen >= 0) h += "Content-Length: " + std::to_string(clen) + "\r\n";
    else if (clen == -1) h += "Transfer-Encoding: chunked\r\n";
    h += keep ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    if (g_serve.opt.cors)
        h += "Access-Control-Allow-Origin: *\r\n"
             "Access-Control-Allow-Headers: Authorization, Content-Type, x-api-key, anthropic-version\r\n"
             "Access-Control-Allow-Methods: GET, POST, DELETE, OPTIONS\r\n";
    h += extra;
    h += "\r\n";
    return h;
}

static void serve_conn_send(ServeConn* c, int status, const char* ctype, const std::string& body, bool keep,
                      bool head_only = false, const std::string& extra = "") {
    std::string r = http_response_head(status, ctype, (long long)body.size(), keep, extra);
    if (!head_only && !c->head) r += body;
    serve_conn_write(c, r);  // one write: with TCP_NODELAY, head and body leave in one segment
}

// error bodies: openai {"error":{message,type,param,code}}, anthropic {"type":"error","error":{type,message}}
static std::string serve_error_body(bool anthropic, const ServeError& e) {
    Json err = Json::object();
    if (anthropic) {
        const char* t = e.status == 401 ? "authentication_error" : e.status == 404 ? "not_found_error"
                      : e.status == 413 ? "request_too_large" : e.status == 429 ? "rate_limit_error"
                      : e.status == 503 ? "overloaded_error" : e.status >= 500 ? "api_error" : "invalid_request_error";
        err.set("type", Json::string(t));
        // anthropic's own errors name the field first ("max_tokens: Field required")
        err.set("message", Json::string((e.param.empty() ? "" : e.param + ": ") + e.message + " (" + e.code + ")"));
        Json o = Json::object();
        o.set("type", Json::string("error"));
        o.set("error", err);
        return json_dump(o);
    }
    const char* t = e.status == 401 ? "authentication_error" : e.status == 429 ? "rate_limit_error"
                  : e.status >= 500 ? "server_error" : "invalid_request_error";
    err.set("message", Json::string(e.message));
    err.set("type", Json::string(t));
    err.set("param", e.param.empty() ? Json() : Json::string(e.param));
    err.set("code", Json::string(e.code));
    Json o = Json::object();
    o.set("error", err);
    return json_dump(o);
}
static void serve_conn_send_error(ServeConn* c, bool anthropic, const ServeError& e, bool keep, ServeReqLog* lg,
                            const std::string& extra = "") {
    // 429 and 503 are worth a retry: say when (a queue slot frees within about a request)
    std::string ex = extra + ((e.status == 429 || e.status == 503) ? "Retry-After: 1\r\n" : "");
    serve_conn_send(c, e.status, "application/json", serve_error_body(anthropic, e), keep, false, ex);
    if (lg) { lg->status = e.status; lg->code = e.code; }
}
static ServeError serve_make_error(int status, const char* code, const std::string& msg, const char* param = "") {
    ServeError e; e.status = status; e.code = code; e.message = msg; e.param = param; return e;
}
// the error for a framing / limit status found while reading a request
static ServeError http_error(int status) {
    switch (status) {
        case 413: return serve_make_error(413, "request_too_large", "request too large");
        case 503: return serve_make_error(503, "server_overloaded", "too many large requests at once; retry later");
        case 408: return serve_make_error(408, "request_timeout", "the request did not arrive in time");
        case 417: return serve_make_error(417, "invalid_request_error", "only 'Expect: 100-continue' is supported");
        case 501: return serve_make_error(501, "invalid_request_error", "only the chunked transfer coding is supported");
        case 505: return serve_make_error(505, "invalid_request_error", "only HTTP/1.0 and HTTP/1.1 are supported");
    }
    return serve_make_error(400, "invalid_request_error", "malformed http request");
}

// streaming responses: the body is written in pieces, chunk-framed on http/1.1
static bool sse_begin(ServeConn* c, const HttpRequest& rq, bool keep) {
    c->chunked_out = rq.minor >= 1;
    return serve_conn_write(c, http_response_head(200, "text/event-stream", c->chunked_out ? -1 : -2, keep && c->chunked_out,
                                   "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n"));
}
static bool sse_write(ServeConn* c, const std::string& data) {
    if (data.empty()) return true;
    if (!c->chunked_out) return serve_conn_write(c, data);
    char h[32]; snprintf(h, sizeof h, "%zx\r\n", data.size());
    return serve_conn_write(c, h + data + "\r\n");
}
static bool sse_end(ServeConn* c) { return c->chunked_out ? serve_conn_write(c, "0\r\n\r\n") : true; }
// the end of an openai stream: with stream_options.include_usage, `chunk` (a last chunk, not
// null) goes out with no choices and the usage; then [DONE]
static void sse_finish_openai(ServeConn* c, Json chunk, const Json& usage) {
    if (!chunk.is_null()) {
        chunk.set("choices", Json::array());
        chunk.set("usage", usage);
        sse_write(c, sse_data(json_dump(chunk)));
    }
    sse_write(c, "data: [DONE]\n\n");
    sse_end(c);
}

// memory for request bodies is shared: a connection accounts for what it buffers, and
// when all connections together would pass the budget the request gets 503. (one request
// is bounded by --max-request-mib; this bounds many at once.)
static bool serve_hold(ServeConn* c, size_t bytes) {
    int64_t d = (int64_t)bytes - c->held;
    if (d <= 0) return true;
    c->held += d;
    return g_serve.body_bytes.fetch_add(d) + d <= g_serve.body_budget;
}
static void serve_release(ServeConn* c) {
    g_serve.body_bytes.fetch_sub(c->held);
    c->held = 0;
}

// read the body the head announced into *body. returns 0, an http status (400, 408, 413,
// 503), or -1 when the connection died.
static int serve_conn_read_body(ServeConn* c, const HttpRequest& rq, double t0, std::string* body) {
    const double rate = 1 << 20;  // bytes/s a body must keep up after the read timeout
    const double T = g_serve.opt.read_timeout_ms / 1e3;
    if (rq.expect_continue && (rq.chunked || c->in.size() < (size_t)std::max<int64_t>(rq.content_length, 0)))
        if (!serve_conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n")) return -1;
    if (!rq.chunked) {
        size_t need = (size_t)std::max<int64_t>(rq.content_length, 0);
        if (c->in.capacity() < need) c->in.reserve(need);
        while (c->in.size() < need) {
            int r = serve_conn_read(c, t0 + T + c->in.size() / rate, false);
            if (r == -1) return c->in.empty() ? -1 : 408;
            if (r <= 0) return -1;
            if (!serve_hold(c, c->in.size())) return 503;
        }
        if (!serve_hold(c, need)) return 503;
        if (c->in.size() == need) { body->swap(c->in); return 0; }  // the usual case: no copy
        body->assign(c->in, 0, need);
        c->in.erase(0, need);
        c->in.shrink_to_fit();
        return 0;
    }
    ChunkedDecoder d;
    for (;;) {
        size_t used = 0;
        int r = chunked_feed(&d, c->in.data(), c->in.size(), body, g_serve.lim.max_body, 4096, &used);
        if (r < 0) return -r;
        c->in.erase(0, used);
        if (r == 1) return 0;
        int k = serve_conn_read(c, t0 + T + body->size() / rate, false);
        if (k == -1) return 408;
        if (k <= 0) return -1;
        if (!serve_hold(c, body->size() + c->in.size())) return 503;
    }
}

// ---- generation: one request from queue to response

struct ServeGen {
    bool anthropic = false, stream = false, include_usage = false;
    std::string id, model;
    long created = 0;
    int prompt_tokens = 0;
    std::string carry[2];          // a split code point held back, per channel
    std::string text[2];           // reasoning, content (accumulated for the final response)
    struct Call { std::string id, name, args; };
    std::vector<Call> calls;
    int block = -1, block_kind = -1;  // anthropic: the open content block (0 thinking, 1 text, 2 tool)
    // completions, responses and logprobs (their section below)
    int kind = 0;                  // GEN_CHAT (chat completions or anthropic), GEN_COMPLETIONS, GEN_RESPONSES
    int logprobs = -1;             // alternatives per token; -1: no logprobs
    std::vector<Json> lp[2];       // chat: token entries not sent yet (reasoning, content)
    Json c_tokens = Json::array(), c_lps = Json::array(), c_tops = Json::array(), c_offsets = Json::array();
    size_t c_chars = 0;            // completions: code points of the tokens listed so far
    std::string echo_text;         // completions: the prompt, when echoed
    bool echo_pending = false;     // streaming: the echo chunk is not sent yet
    Json resp;                     // responses: ApiRequest.resp
    int seq = 0;                   // responses: the next sse sequence number
    struct RItem { int kind = 0; std::string id, text, call_id, name; bool done = false; };  // kind 0 reasoning, 1 message, 2 call
    std::vector<RItem> items;
};

// the openai response envelope, streamed (object "chat.completion.chunk", choice field
// "delta") or whole ("chat.completion", "message"): {id, object, created, model, choices:
// [{index: 0, <field>: body, logprobs: null, finish_reason}]}
static Json openai_envelope(ServeGen* g, bool chunk, Json body, const char* finish) {
    Json ch = Json::object();
    ch.set("index", Json::integer(0));
    ch.set(chunk ? "delta" : "message", body);
    ch.set("logprobs", Json());
    ch.set("finish_reason", finish ? Json::string(finish) : Json());
    Json choices = Json::array();
    choices.push(ch);
    Json o = Json::object();
    o.set("id", Json::string(g->id));
    o.set("object", Json::string(chunk ? "chat.completion.chunk" : "chat.completion"));
    o.set("created", Json::integer(g->created));
    o.set("model", Json::string(g->model));
    o.set("choices", choices);
    return o;
}
static Json openai_chunk(ServeGen* g, Json delta, const char* finish) {
    Json o = openai_envelope(g, true, delta, finish);
    if (g->include_usage) o.set("usage", Json());
    return o;
}

// ----------------------------------------------------------------------------
// completions, responses and logprobs: the output side. serve_gen_* hand these requests
// (and chat completions' logprobs) to the functions here.

enum { GEN_CHAT = 0, GEN_COMPLETIONS = 1, GEN_RESPONSES = 2 };

static std::string apix_bytes(int id) {
    ServeEngine* en = g_serve.eng;
    return en->token_bytes ? en->token_bytes(en->self, id) : std::string();
}
// code points in a byte string (its lead bytes), for text offsets
static size_t apix_chars(const std::string& b) {
    size_t n = 0;
    for (unsigned char ch : b) n += (ch & 0xC0) != 0x80;
    return n;
}

// ---- chat completions: {token, logprob, bytes, top_logprobs} per token, per channel

static Json chat_token_json(int id, float lp) {
    std::string bytes = apix_bytes(id);
    Json o = Json::object();
    o.set("token", Json::string(utf8_fix(bytes)));
    o.set("logprob", Json::number(lp));
    Json b = Json::array();
    for (unsigned char ch : bytes) b.push(Json::integer(ch));
    o.set("bytes", b);
    return o;
}
static void chat_logprob_add(ServeGen* g, const ServeLogprob& l) {
    if (l.channel != SERVE_REASONING && l.channel != SERVE_CONTENT) return;  // tool-call tokens are not listed
    Json o = chat_token_json(l.id, l.logprob);
    Json top = Json::array();
    for (const auto& t : l.top) top.push(chat_token_json(t.first, t.second));
    o.set("top_logprobs", top);
    g->lp[l.channel == SERVE_REASONING ? 0 : 1].push_back(std::move(o));
}
// the entries not sent yet, as a choice's logprobs: content tokens in "content" (openai's
// field), reasoning tokens in "reasoning_content" (ours, beside the message field of that name)
static Json chat_logprobs_take(ServeGen* g) {
    Json o = Json::object();
    Json a[2] = {Json::array(), Json::array()};
    for (int ch = 0; ch < 2; ch++) { for (auto& x : g->lp[ch]) a[ch].push(std::move(x)); g->lp[ch].clear(); }
    o.set("content", a[1]);
    o.set("refusal", Json());
    if (!a[0].arr.empty()) o.set("reasoning_content", a[0]);
    return o;
}
static void chat_chunk_logprobs(ServeGen* g, Json* chunk) {
    if (g->logprobs < 0) return;
    Json* ch = &chunk->get("choices")->arr[0];
    ch->set("logprobs", chat_logprobs_take(g));
}

// ---- completions: {tokens, token_logprobs, top_logprobs, text_offset}

static void compl_entry(ServeGen* g, int id, const ServeLogprob* l) {
    std::string bytes = apix_bytes(id);
    g->c_tokens.push(Json::string(utf8_fix(bytes)));
    g->c_lps.push(l ? Json::number(l->logprob) : Json());
    Json top = Json();
    if (l) {
        top = Json::object();
        for (const auto& t : l->top) {
            std::string k = utf8_fix(apix_bytes(t.first));
            if (!top.get(k.c_str())) top.set(k, Json::number(t.second));  // two ids, one text: the likelier
        }
    }
    g->c_tops.push(top);
    g->c_offsets.push(Json::integer((int64_t)g->c_chars));
    g->c_chars += apix_chars(bytes);
}
static Json compl_logprobs_take(ServeGen* g) {
    if (g->logprobs < 0) return Json();
    Json o = Json::object();
    o.set("tokens", g->c_tokens);
    o.set("token_logprobs", g->c_lps);
    o.set("top_logprobs", g->c_tops);
    o.set("text_offset", g->c_offsets);
    if (g->stream) g->c_tokens = g->c_lps = g->c_tops = g->c_offsets = Json::array();
    return o;
}
static Json compl_chunk(ServeGen* g, const std::string& text, const char* finish) {
    Json o = openai_chunk(g, Json(), finish);  // a chat chunk's envelope, a completion's choice
    o.set("object", Json::string("text_completion"));
    Json ch = Json::object();
    ch.set("index", Json::integer(0));
    ch.set("text", Json::string(text));
    ch.set("logprobs", compl_logprobs_take(g));
    ch.set("finish_reason", finish ? Json::string(finish) : Json());
    o.get("choices")->arr[0] = ch;
    return o;
}
// streaming with echo: the prompt goes out first, once it is scored (before any output)
static void compl_flush_echo(ServeConn* c, ServeGen* g) {
    if (!g->stream || !g->echo_pending) return;
    g->echo_pending = false;
    sse_write(c, sse_data(json_dump(compl_chunk(g, g->echo_text, nullptr))));
}

// ---- responses: output items and their events

static Json resp_item_json(const ServeGen::RItem& it, bool done) {
    Json o = Json::object();
    const char* status = done ? "completed" : "in_progress";
    if (it.kind == 0) {
        o.set("type", Json::string("reasoning"));
        o.set("id", Json::string(it.id));
        o.set("summary", Json::array());
        Json content = Json::array();
        if (done) {
            Json p = Json::object();
            p.set("type", Json::string("reasoning_text"));
            p.set("text", Json::string(it.text));
            content.push(p);
        }
        o.set("content", content);
        o.set("status", Json::string(status));
    } else if (it.kind == 1) {
        o.set("type", Json::string("message"));
        o.set("id", Json::string(it.id));
        o.set("status", Json::string(status));
        o.set("role", Json::string("assistant"));
        Json content = Json::array();
        if (done) {
            Json p = Json::object();
            p.set("type", Json::string("output_text"));
            p.set("text", Json::string(it.text));
            p.set("annotations", Json::array());
            p.set("logprobs", Json::array());
            content.push(p);
        }
        o.set("content", content);
    } else {
        o.set("type", Json::string("function_call"));
        o.set("id", Json::string(it.id));
        o.set("call_id", Json::string(it.call_id));
        o.set("name", Json::string(it.name));
        o.set("arguments", Json::string(done ? it.text : ""));
        o.set("status", Json::string(status));
    }
    return o;
}
static Json resp_part(int kind, const std::string& text) {
    Json p = Json::object();
    p.set("type", Json::string(kind == 0 ? "reasoning_text" : "output_text"));
    p.set("text", Json::string(text));
    if (kind == 1) { p.set("annotations", Json::array()); p.set("logprobs", Json::array()); }
    return p;
}
// one sse event: event: TYPE, data {type, sequence_number, ...}
static void resp_event(ServeConn* c, ServeGen* g, const char* type, Json fields) {
    Json o = Json::object();
    o.set("type", Json::string(type));
    o.set("sequence_number", Json::integer(g->seq++));
    for (auto& kv : fields.obj) o.set(kv.first, std::move(kv.second));
    sse_write(c, sse_event(type, json_dump(o)));
}
static Json resp_ref(ServeGen* g, bool content) {  // item_id, output_index (, content_index)
    Json o = Json::object();
    o.set("item_id", Json::string(g->items.back().id));
    o.set("output_index", Json::integer((int64_t)g->items.size() - 1));
    if (content) o.set("content_index", Json::integer(0));
    return o;
}
static void resp_close_item(ServeConn* c, ServeGen* g) {
    if (g->items.empty() || g->items.back().done) return;
    ServeGen::RItem& it = g->items.back();
    it.done = true;
    if (!g->stream) return;
    if (it.kind < 2) {
        Json o = resp_ref(g, true);
        o.set("text", Json::string(it.text));
        if (it.kind == 1) o.set("logprobs", Json::array());
        resp_event(c, g, it.kind == 0 ? "response.reasoning_text.done" : "response.output_text.done", o);
        o = resp_ref(g, true);
        o.set("part", resp_part(it.kind, it.text));
        resp_event(c, g, "response.content_part.done", o);
    }
    Json o = Json::object();
    o.set("output_index", Json::integer((int64_t)g->items.size() - 1));
    o.set("item", resp_item_json(it, true));
    resp_event(c, g, "response.output_item.done", o);
}
static void resp_open_item(ServeConn* c, ServeGen* g, int kind, const std::string& call_id = "", const std::string& name = "") {
    resp_close_item(c, g);
    ServeGen::RItem it;
    it.kind = kind;
    it.id = (kind == 0 ? "rs_" : kind == 1 ? "msg_" : "fc_") + serve_rand_hex(24);
    it.call_id = call_id; it.name = name;
    g->items.push_back(it);
    if (!g->stream) return;
    Json o = Json::object();
    o.set("output_index", Json::integer((int64_t)g->items.size() - 1));
    o.set("item", resp_item_json(g->items.back(), false));
    resp_event(c, g, "response.output_item.added", o);
    if (kind < 2) {
        o = resp_ref(g, true);
        o.set("part", resp_part(kind, ""));
        resp_event(c, g, "response.content_part.added", o);
    }
}
static void resp_text(ServeConn* c, ServeGen* g, int ch, const std::string& t) {
    if (g->items.empty() || g->items.back().done || g->items.back().kind != ch) resp_open_item(c, g, ch);
    g->items.back().text += t;
    if (!g->stream) return;
    Json o = resp_ref(g, true);
    o.set("delta", Json::string(t));
    if (ch == 1) o.set("logprobs", Json::array());
    resp_event(c, g, ch == 0 ? "response.reasoning_text.delta" : "response.output_text.delta", o);
}
static void resp_call(ServeConn* c, ServeGen* g, const std::string& call_id, const std::string& name, const std::string& args) {
    resp_open_item(c, g, 2, call_id, name);
    g->items.back().text = args;
    if (g->stream) {
        Json o = resp_ref(g, false);
        o.set("delta", Json::string(args));
        resp_event(c, g, "response.function_call_arguments.delta", o);
        o = resp_ref(g, false);
        o.set("name", Json::string(name));
        o.set("arguments", Json::string(args));
        resp_event(c, g, "response.function_call_arguments.done", o);
    }
    resp_close_item(c, g);
}

// the response object; r: the finished generation (null while in progress)
static Json resp_object(ServeGen* g, const char* status, const ServeResult* r) {
    Json o = Json::object();
    o.set("id", Json::string(g->id));
    o.set("object", Json::string("response"));
    o.set("created_at", Json::integer(g->created));
    o.set("status", Json::string(status));
    o.set("background", Json::boolean(false));
    o.set("error", Json());
    Json inc = Json();
    if (!strcmp(status, "incomplete")) { inc = Json::object(); inc.set("reason", Json::string("max_output_tokens")); }
    o.set("incomplete_details", inc);
    for (const char* k : {"instructions", "max_output_tokens", "metadata"}) o.set(k, *g->resp.get(k));
    o.set("model", Json::string(g->model));
    Json out = Json::array();
    if (r) for (const auto& it : g->items) out.push(resp_item_json(it, true));
    o.set("output", out);
    o.set("parallel_tool_calls", Json::boolean(true));
    for (const char* k : {"previous_response_id", "reasoning"}) o.set(k, *g->resp.get(k));
    o.set("service_tier", Json::string("default"));
    o.set("store", *g->resp.get("store"));
    o.set("temperature", *g->resp.get("temperature"));
    Json text = Json::object();
    if (const Json* tf = g->resp.get("text_format")) text.set("format", *tf);
    else { Json fmt = Json::object(); fmt.set("type", Json::string("text")); text.set("format", fmt); }
    o.set("text", text);
    for (const char* k : {"tool_choice", "tools"}) o.set(k, *g->resp.get(k));
    o.set("top_logprobs", Json::integer(0));
    o.set("top_p", *g->resp.get("top_p"));
    o.set("truncation", Json::string("disabled"));
    Json u = Json();
    if (r) {
        u = Json::object();
        u.set("input_tokens", Json::integer(g->prompt_tokens));
        Json in = Json::object();
        in.set("cached_tokens", Json::integer(r->cached_tokens));
        in.set("cache_write_tokens", Json::integer(0));
        u.set("input_tokens_details", in);
        u.set("output_tokens", Json::integer(r->completion_tokens));
        Json od = Json::object();
        od.set("reasoning_tokens", Json::integer(r->reasoning_tokens));
        u.set("output_tokens_details", od);
        u.set("total_tokens", Json::integer(g->prompt_tokens + r->completion_tokens));
    }
    o.set("usage", u);
    return o;
}

// ---- the serve_gen_* hooks

static void apix_begin(ServeConn* c, ServeGen* g) {
    if (g->kind == GEN_RESPONSES) {
        Json o = Json::object();
        o.set("response", resp_object(g, "in_progress", nullptr));
        resp_event(c, g, "response.created", o);
        o = Json::object();
        o.set("response", resp_object(g, "in_progress", nullptr));
        resp_event(c, g, "response.in_progress", o);
    }  // completions: the first chunk carries text (the echo, or the first output)
}

// a logprob event, or text on a channel (complete code points) for completions / responses
static void apix_logprobs(ServeConn* c, ServeGen* g, const ServeEvent& ev) {
    for (const auto& l : ev.logprobs) {
        if (g->kind == GEN_CHAT) { if (ev.kind == SERVE_LOGPROB) chat_logprob_add(g, l); continue; }
        if (g->kind != GEN_COMPLETIONS) continue;
        if (ev.kind == SERVE_LOGPROB) compl_flush_echo(c, g);
        compl_entry(g, l.id, &l);
    }
}
static void apix_text(ServeConn* c, ServeGen* g, int ch, const std::string& t) {
    if (g->kind == GEN_RESPONSES) { resp_text(c, g, ch, t); return; }
    g->text[1] += t;  // a completion has one channel
    if (!g->stream) return;
    compl_flush_echo(c, g);
    sse_write(c, sse_data(json_dump(compl_chunk(g, t, nullptr))));
}

static void apix_finish(ServeConn* c, ServeGen* g, const ServeResult& r, bool keep) {
    std::string finish = r.finish == "length" ? "length" : "stop";
    if (g->kind == GEN_COMPLETIONS) {
        Json usage = Json::object();
        usage.set("prompt_tokens", Json::integer(g->prompt_tokens));
        usage.set("completion_tokens", Json::integer(r.completion_tokens));
        usage.set("total_tokens", Json::integer(g->prompt_tokens + r.completion_tokens));
        usage.set("prompt_tokens_details", serve_cached_json(r));
        if (g->stream) {
            compl_flush_echo(c, g);
            sse_write(c, sse_data(json_dump(compl_chunk(g, "", finish.c_str()))));
            sse_finish_openai(c, g->include_usage ? compl_chunk(g, "", nullptr) : Json(), usage);
            return;
        }
        Json o = compl_chunk(g, g->echo_text + g->text[1], finish.c_str());
        o.set("usage", usage);
        serve_conn_send(c, 200, "application/json", json_dump(o), keep);
        return;
    }
    resp_close_item(c, g);
    const char* status = r.finish == "length" ? "incomplete" : "completed";
    Json resp = resp_object(g, status, &r);
    if (g->resp.get("store")->b) {
        RespRecord rec;
        rec.id = g->id;
        rec.prev = g->resp.get("previous_response_id")->is_string() ? g->resp.get("previous_response_id")->str : "";
        rec.response = resp;
        rec.input = *g->resp.get("input");
        if (!resp_store_put(std::move(rec))) resp.set("store", Json::boolean(false));  // larger than the whole store
    }
    if (g->stream) {
        Json o = Json::object();
        o.set("response", resp);
        resp_event(c, g, !strcmp(status, "incomplete") ? "response.incomplete" : "response.completed", o);
        sse_end(c);
        return;
    }
    serve_conn_send(c, 200, "application/json", json_dump(resp), keep);
}

// an error after the stream started: response.failed (responses); completions as chat
static bool apix_stream_error(ServeConn* c, ServeGen* g, const ServeError& e) {
    if (g->kind != GEN_RESPONSES) return false;
    Json resp = resp_object(g, "failed", nullptr);
    Json err = Json::object();
    err.set("code", Json::string(e.status >= 500 ? "server_error" : e.code));
    err.set("message", Json::string(e.message));
    resp.set("error", err);
    Json o = Json::object();
    o.set("response", resp);
    resp_event(c, g, "response.failed", o);
    sse_end(c);
    return true;
}


static std::string anthropic_event(const char* type, Json o) {
    Json e = Json::object();
    e.set("type", Json::string(type));
    for (auto& kv : o.obj) e.set(kv.first, kv.second);
    return sse_event(type, json_dump(e));
}
static void anthropic_close_block(ServeConn* c, ServeGen* g) {
    if (g->block < 0 || g->block_kind < 0) return;
    if (g->block_kind == 0) {  // thinking blocks end with their (empty) signature
        Json d = Json::object();
        d.set("type", Json::string("signature_delta"));
        d.set("signature", Json::string(""));
        Json o = Json::object();
        o.set("index", Json::integer(g->block));
        o.set("delta", d);
        sse_write(c, anthropic_event("content_block_delta", o));
    }
    Json o = Json::object();
    o.set("index", Json::integer(g->block));
    sse_write(c, anthropic_event("content_block_stop", o));
    g->block_kind = -1;
}
static void anthropic_open_block(ServeConn* c, ServeGen* g, int kind, Json block) {
    anthropic_close_block(c, g);
    g->block++;
    g->block_kind = kind;
    Json o = Json::object();
    o.set("index", Json::integer(g->block));
    o.set("content_block", block);
    sse_write(c, anthropic_event("content_block_start", o));
}

// text on a channel, already complete code points: stream it or keep it
static void serve_gen_text(ServeConn* c, ServeGen* g, int ch, const std::string& t) {
    if (t.empty()) return;
    if (g->kind != GEN_CHAT) { apix_text(c, g, ch, t); return; }
    g->text[ch] += t;
    if (!g->stream) return;
    if (!g->anthropic) {
        Json d = Json::object();
        d.set(ch == 0 ? "reasoning_content" : "content", Json::string(t));
        Json chunk = openai_chunk(g, d, nullptr);
        chat_chunk_logprobs(g, &chunk);
        sse_write(c, sse_data(json_dump(chunk)));
        return;
    }
    if (g->block_kind != ch) {
        Json b = Json::object();
        b.set("type", Json::string(ch == 0 ? "thinking" : "text"));
        b.set(ch == 0 ? "thinking" : "text", Json::string(""));
        if (ch == 0) b.set("signature", Json::string(""));
        anthropic_open_block(c, g, ch, b);
    }
    Json d = Json::object();
    d.set("type", Json::string(ch == 0 ? "thinking_delta" : "text_delta"));
    d.set(ch == 0 ? "thinking" : "text", Json::string(t));
    Json o = Json::object();
    o.set("index", Json::integer(g->block));
    o.set("delta", d);
    sse_write(c, anthropic_event("content_block_delta", o));
}

static Json serve_args_object(const std::string& args) {
    Json v; std::string err;
    if (json_parse(args, &v, &err) && v.is_object()) return v;
    return Json::object();
}

static void serve_gen_event(ServeConn* c, ServeGen* g, const ServeEvent& ev) {
    if (ev.kind == SERVE_LOGPROB || ev.kind == SERVE_PROMPT_LOGPROBS) { apix_logprobs(c, g, ev); return; }
    if (ev.kind == SERVE_TOOL_CALL) {
        for (int ch = 0; ch < 2; ch++) {  // text before the call is complete
            std::string t;
            utf8_take(&g->carry[ch], "", 0, &t, true);
            serve_gen_text(c, g, ch, t);
        }
        ServeGen::Call call;
        call.id = (g->anthropic ? "toolu_" : "call_") + serve_rand_hex(g->anthropic ? 24 : 16);
        call.name = utf8_fix(ev.tool_name);
        call.args = utf8_fix(ev.tool_args.empty() ? std::string("{}") : ev.tool_args);
        g->calls.push_back(call);
        if (g->kind == GEN_RESPONSES) { resp_call(c, g, call.id, call.name, call.args); return; }
        if (!g->stream) return;
        if (!g->anthropic) {
            Json fn = Json::object();
            fn.set("name", Json::string(call.name));
            fn.set("arguments", Json::string(call.args));
            Json tc = Json::object();
            tc.set("index", Json::integer((int64_t)g->calls.size() - 1));
            tc.set("id", Json::string(call.id));
            tc.set("type", Json::string("function"));
            tc.set("function", fn);
            Json arr = Json::array();
            arr.push(tc);
            Json d = Json::object();
            d.set("tool_calls", arr);
            sse_write(c, sse_data(json_dump(openai_chunk(g, d, nullptr))));
            return;
        }
        Json b = Json::object();
        b.set("type", Json::string("tool_use"));
        b.set("id", Json::string(call.id));
        b.set("name", Json::string(call.name));
        b.set("input", Json::object());
        anthropic_open_block(c, g, 2, b);
        Json d = Json::object();
        d.set("type", Json::string("input_json_delta"));
        d.set("partial_json", Json::string(json_dump(serve_args_object(call.args))));
        Json o = Json::object();
        o.set("index", Json::integer(g->block));
        o.set("delta", d);
        sse_write(c, anthropic_event("content_block_delta", o));
        anthropic_close_block(c, g);
        return;
    }
    int ch = ev.kind == SERVE_REASONING ? 0 : 1;
    std::string t;
    utf8_take(&g->carry[ch], ev.text.data(), ev.text.size(), &t, false);
    serve_gen_text(c, g, ch, t);
}

static const char* anthropic_stop_reason(const ServeResult& r, bool calls) {
    if (calls || r.finish == "tool_calls") return "tool_use";
    if (r.finish == "length") return "max_tokens";
    if (!r.stop_string.empty()) return "stop_sequence";
    return "end_turn";
}

// the end of a generation: flush held bytes, then the closing events or the whole response
static void serve_gen_finish(ServeConn* c, ServeGen* g, const ServeResult& r, bool keep) {
    for (int ch = 0; ch < 2; ch++) {
        std::string t;
        utf8_take(&g->carry[ch], "", 0, &t, true);
        serve_gen_text(c, g, ch, t);
    }
    if (g->kind != GEN_CHAT) { apix_finish(c, g, r, keep); return; }
    std::string finish = r.finish;
    if (!g->calls.empty() && finish == "stop") finish = "tool_calls";
    if (finish != "stop" && finish != "length" && finish != "tool_calls") finish = "stop";
    int completion = r.completion_tokens;
    if (!g->anthropic) {
        Json usage = Json::object();
        usage.set("prompt_tokens", Json::integer(g->prompt_tokens));
        usage.set("completion_tokens", Json::integer(completion));
        usage.set("total_tokens", Json::integer(g->prompt_tokens + completion));
        usage.set("prompt_tokens_details", serve_cached_json(r));
        if (!r.speculative.backend.empty()) usage.set("speculative", serve_spec_json(r.speculative, false));
        if (g->stream) {
            Json last = openai_chunk(g, Json::object(), finish.c_str());
            chat_chunk_logprobs(g, &last);  // tokens whose text was held back
            sse_write(c, sse_data(json_dump(last)));
            sse_finish_openai(c, g->include_usage ? openai_chunk(g, Json::object(), nullptr) : Json(), usage);
            return;
        }
        Json msg = Json::object();
        msg.set("role", Json::string("assistant"));
        msg.set("content", (g->calls.empty() || !g->text[1].empty()) ? Json::string(g->text[1]) : Json());
        if (!g->text[0].empty()) msg.set("reasoning_content", Json::string(g->text[0]));
        if (!g->calls.empty()) {
            Json arr = Json::array();
            for (const auto& call : g->calls) {
                Json fn = Json::object();
                fn.set("name", Json::string(call.name));
                fn.set("arguments", Json::string(call.args));
                Json tc = Json::object();
                tc.set("id", Json::string(call.id));
                tc.set("type", Json::string("function"));
                tc.set("function", fn);
                arr.push(tc);
            }
            msg.set("tool_calls", arr);
        }
        Json o = openai_envelope(g, false, msg, finish.c_str());
        if (g->logprobs >= 0) o.get("choices")->arr[0].set("logprobs", chat_logprobs_take(g));
        o.set("usage", usage);
        serve_conn_send(c, 200, "application/json", json_dump(o), keep);
        return;
    }
    const char* stop_reason = anthropic_stop_reason(r, !g->calls.empty());
    Json stop_seq = r.stop_string.empty() || r.finish == "length" ? Json() : Json::string(utf8_fix(r.stop_string));
    if (g->stream) {
        anthropic_close_block(c, g);
        Json d = Json::object();
        d.set("stop_reason", Json::string(stop_reason));
        d.set("stop_sequence", stop_seq);
        Json u = Json::object();
        u.set("input_tokens", Json::integer(g->prompt_tokens));
        u.set("output_tokens", Json::integer(completion));
        u.set("cache_read_input_tokens", Json::integer(r.cached_tokens));
        if (!r.speculative.backend.empty()) u.set("speculative", serve_spec_json(r.speculative, false));
        Json o = Json::object();
        o.set("delta", d);
        o.set("usage", u);
        sse_write(c, anthropic_event("message_delta", o));
        sse_write(c, anthropic_event("message_stop", Json::object()));
        sse_end(c);
        return;
    }
    Json content = Json::array();
    if (!g->text[0].empty()) {
        Json b = Json::object();
        b.set("type", Json::string("thinking"));
        b.set("thinking", Json::string(g->text[0]));
        b.set("signature", Json::string(""));
        content.push(b);
    }
    if (!g->text[1].empty() || g->calls.empty()) {
        Json b = Json::object();
        b.set("type", Json::string("text"));
        b.set("text", Json::string(g->text[1]));
        content.push(b);
    }
    for (const auto& call : g->calls) {
        Json b = Json::object();
        b.set("type", Json::string("tool_use"));
        b.set("id", Json::string(call.id));
        b.set("name", Json::string(call.name));
        b.set("input", serve_args_object(call.args));
        content.push(b);
    }
    Json u = Json::object();
    u.set("input_tokens", Json::integer(g->prompt_tokens));
    u.set("output_tokens", Json::integer(completion));
    u.set("cache_creation_input_tokens", Json::integer(0));
    u.set("cache_read_input_tokens", Json::integer(r.cached_tokens));
    if (!r.speculative.backend.empty()) u.set("speculative", serve_spec_json(r.speculative, false));
    Json o = Json::object();
    o.set("id", Json::string(g->id));
    o.set("type", Json::string("message"));
    o.set("role", Json::string("assistant"));
    o.set("model", Json::string(g->model));
    o.set("content", content);
    o.set("stop_reason", Json::string(stop_reason));
    o.set("stop_sequence", stop_seq);
    o.set("usage", u);
    serve_conn_send(c, 200, "application/json", json_dump(o), keep);
}

static void serve_gen_begin(ServeConn* c, ServeGen* g) {
    if (g->kind != GEN_CHAT) { apix_begin(c, g); return; }
    if (!g->anthropic) {
        Json d = Json::object();
        d.set("role", Json::string("assistant"));
        d.set("content", Json::string(""));
        sse_write(c, sse_data(json_dump(openai_chunk(g, d, nullptr))));
        return;
    }
    Json u = Json::object();
    u.set("input_tokens", Json::integer(g->prompt_tokens));
    u.set("output_tokens", Json::integer(0));
    Json m = Json::object();
    m.set("id", Json::string(g->id));
    m.set("type", Json::string("message"));
    m.set("role", Json::string("assistant"));
    m.set("model", Json::string(g->model));
    m.set("content", Json::array());
    m.set("stop_reason", Json());
    m.set("stop_sequence", Json());
    m.set("usage", u);
    Json o = Json::object();
    o.set("message", m);
    sse_write(c, anthropic_event("message_start", o));
    sse_write(c, anthropic_event("ping", Json::object()));
}

// an error after the stream started: the status is sent already, so it travels as an event
static void serve_gen_stream_error(ServeConn* c, ServeGen* g, const ServeError& e) {
    if (apix_stream_error(c, g, e)) return;
    if (g->anthropic) {
        std::string b = serve_error_body(true, e);
        sse_write(c, sse_event("error", b));
    } else {
        sse_write(c, sse_data(serve_error_body(false, e)));
    }
    sse_end(c);
}

// the resolved sampler: engine preset < flags < request fields < --greedy
static ServeSampling serve_resolve_sampling(const ApiRequest& ar, int max_tokens) {
    const ServeOptions& o = g_serve.opt;
    ServeSampling s = g_serve.eng->defaults;
    s.stop.clear(); s.logit_bias.clear();
    auto pick = [](float* dst, double flag, double req) { if (!isnan(flag)) *dst = (float)flag; if (!isnan(req)) *dst = (float)req; };
    pick(&s.temperature, o.temperature, ar.temperature);
    pick(&s.top_p, o.top_p, ar.top_p);
    pick(&s.min_p, o.min_p, ar.min_p);
    pick(&s.presence_penalty, o.presence_penalty, ar.presence);
    pick(&s.frequency_penalty, o.frequency_penalty, ar.frequency);
    if (o.top_k != INT_MIN) s.top_k = o.top_k;
    if (ar.top_k != INT_MIN) s.top_k = ar.top_k;
    s.seed = ar.has_seed ? ar.seed : o.has_seed ? o.seed : serve_rand();
    if (o.greedy) { s.temperature = 0; s.top_k = 1; s.top_p = 1; s.min_p = 0; }
    s.stop = ar.stop;
    s.logit_bias = ar.logit_bias;
    s.grammar = ar.grammar;
    s.max_tokens = max_tokens;
    return s;
}

enum { SERVE_ROUTE_NONE, SERVE_ROUTE_HEALTH, SERVE_ROUTE_MODELS, SERVE_ROUTE_MODEL, SERVE_ROUTE_CHAT, SERVE_ROUTE_MESSAGES, SERVE_ROUTE_COUNT,
       SERVE_ROUTE_COMPLETIONS, SERVE_ROUTE_RESPONSES, SERVE_ROUTE_RESPONSES_COUNT, SERVE_ROUTE_RESPONSE };

// parse, validate, render and tokenize one request body on the calling connection thread,
// under the request's memory budget (the request memory section): past it 413, an
// allocation failure 503, anything else thrown 500. requests are prepared concurrently
// (prepare is thread-safe). *body is freed once parsed. false with *e on any failure.
static bool serve_prepare(std::string* body, int route, ApiRequest* ar, ServePrompt* pr, ServeError* e, double* peak_mib) {
    ServeState& s = g_serve;
    size_t body_bytes = body->capacity();
    struct Peak {  // the body is held as well until it is parsed
        double* out; size_t body;
        ~Peak() { *out = (double)(t_serve_mem_peak + (int64_t)body) / (1 << 20); }
    } peak{peak_mib, body_bytes};
    try {
        ServeMemScope budget(serve_request_budget(body->size()));
        {
            Json j; std::string jerr;
            if (!json_parse(*body, &j, &jerr, 64)) {
                *e = serve_make_error(400, "invalid_request_error", ("invalid json: " + jerr).c_str());
                return false;
            }
            std::string().swap(*body);  // the json holds it now
            bool responses = route == SERVE_ROUTE_RESPONSES || route == SERVE_ROUTE_RESPONSES_COUNT;
            bool ok = route == SERVE_ROUTE_MESSAGES || route == SERVE_ROUTE_COUNT ? anthropic_parse(j, s.api, route == SERVE_ROUTE_COUNT, ar, e)
                    : route == SERVE_ROUTE_COMPLETIONS ? completions_parse(j, s.api, ar, e)
                    : responses ? responses_parse(j, s.api, route == SERVE_ROUTE_RESPONSES_COUNT, ar, e)
                    : openai_chat_parse(j, s.api, ar, e);
            if (!ok) return false;
        }  // the json is gone: the chat holds what the prompt needs
        bool ok;
        if (!ar->raw) ok = s.eng->prepare(s.eng->self, ar->chat, pr, e);
        else if (!ar->raw_is_ids) ok = s.eng->prepare_text ? s.eng->prepare_text(s.eng->self, ar->raw_text, pr, e)
                                                           : api_fail(e, "prompt", "this engine takes token id prompts only");
        else { pr->tokens = ar->raw_ids; pr->thinking = pr->tools = false; pr->raw = true; ok = true; }
        if (!ok) {
            if (route == SERVE_ROUTE_RESPONSES || route == SERVE_ROUTE_RESPONSES_COUNT) {  // the engine names chat fields
                if (e->param == "reasoning_effort") e->param = "reasoning.effort";
                if (e->param == "messages") e->param = "input";
            }
            if (e->status < 400) e->status = 400;
            if (e->message.empty()) e->message = "the request could not be rendered";
            return false;
        }
        return true;
    } catch (const ServeOverBudget&) {
        char m[160];
        snprintf(m, sizeof m, "the request needs more memory to prepare than its budget (%dx its body + %d MiB)",
                 (int)kServeMemMultiple, (int)(kServeMemFloor >> 20));
        *e = serve_make_error(413, "request_too_large", m);
    } catch (const std::bad_alloc&) {
        *e = serve_make_error(503, "out_of_memory", "the server is out of memory; retry later");
    } catch (...) {
        *e = serve_make_error(500, "internal_error", "prompt preparation failed");
    }
    *ar = ApiRequest(); *pr = ServePrompt();
    return false;
}

// chat completions, messages and count_tokens. returns whether the connection may be reused.
static bool serve_handle_generate(ServeConn* c, const HttpRequest& rq, int route, std::string* body, bool keep, ServeReqLog* lg) {
    ServeState& s = g_serve;
    bool anth = route == SERVE_ROUTE_MESSAGES || route == SERVE_ROUTE_COUNT;
    lg->api = anth ? "anthropic" : route == SERVE_ROUTE_COMPLETIONS ? "completions"
            : route == SERVE_ROUTE_RESPONSES || route == SERVE_ROUTE_RESPONSES_COUNT ? "responses" : "openai";
    bool counting = route == SERVE_ROUTE_COUNT || route == SERVE_ROUTE_RESPONSES_COUNT;
    ApiRequest ar; ServeError e; ServePrompt pr;
    bool ok = serve_prepare(body, route, &ar, &pr, &e, &lg->prepare_mib);
    if (!ok) { serve_conn_send_error(c, anth, e, keep, lg); return keep; }
    lg->stream = ar.stream;
    int n = (int)pr.tokens.size();
    lg->prompt = n;
    if (counting) {
        Json o = Json::object();
        if (route == SERVE_ROUTE_RESPONSES_COUNT) o.set("object", Json::string("response.input_tokens"));
        o.set("input_tokens", Json::integer(n));
        serve_conn_send(c, 200, "application/json", json_dump(o), keep);
        lg->status = 200;
        return keep;
    }
    int max_ctx = s.eng->max_context > 0 ? s.eng->max_context : s.opt.max_context;
    if (n >= max_ctx) {
        // the numbers: a request that can never fit is told so (a lane holds max-context rows),
        // one that fits waits for a lane under the 429 / 503 rules
        serve_conn_send_error(c, anth, serve_make_error(400, "context_length_exceeded", "the prompt's " + std::to_string(n) +
                                                        " tokens do not fit a sequence of " + std::to_string(max_ctx) +
                                                        " (prompt + at least one output token; see --max-context)",
                                                        ar.raw ? "prompt" : route == SERVE_ROUTE_RESPONSES ? "input" : "messages"), keep, lg);
        return keep;
    }
    if (ar.raw_is_ids)
        for (int id : pr.tokens)
            if (s.eng->n_vocab > 0 && id >= s.eng->n_vocab) {
                serve_conn_send_error(c, anth, serve_make_error(400, "invalid_request_error", "the prompt has a token id outside the vocabulary", "prompt"), keep, lg);
                return keep;
            }
    if (ar.logprobs >= 0 && !s.eng->logprobs) {
        serve_conn_send_error(c, anth, serve_make_error(400, "invalid_request_error", "logprobs are not supported by this engine setup (not with --spec)",
                                                        "logprobs"), keep, lg);
        return keep;
    }
    if (ar.grammar && !s.eng->structured) {
        serve_conn_send_error(c, anth, serve_make_error(400, "invalid_request_error", "structured output and forced tool calls are not supported by "
                                                        "this engine setup (not with --spec)", ar.grammar_param), keep, lg);
        return keep;
    }
    if (ar.grammar && !ar.stop.empty()) {  // a stop string could end the output inside the structure
        serve_conn_send_error(c, anth, serve_make_error(400, "invalid_request_error", "stop strings cannot be combined with structured output or a "
                                                        "forced tool call", anth ? "stop_sequences" : "stop"), keep, lg);
        return keep;
    }
    if ((ar.logprobs >= 0 || (ar.echo && ar.raw_is_ids)) && !s.eng->token_bytes) {
        serve_conn_send_error(c, anth, serve_make_error(400, "invalid_request_error", "this engine gives no token texts (logprobs, echo of ids)",
                                                        ar.logprobs >= 0 ? "logprobs" : "echo"), keep, lg);
        return keep;
    }
    for (const auto& lb : ar.logit_bias)
        if (s.eng->n_vocab > 0 && lb.first >= s.eng->n_vocab) {
            serve_conn_send_error(c, anth, serve_make_error(400, "invalid_request_error", "logit_bias names a token id outside the vocabulary", "logit_bias"), keep, lg);
            return keep;
        }
    int want = ar.max_zero ? 0 : ar.max_tokens > 0 ? ar.max_tokens : s.opt.default_max_tokens;
    auto job = std::make_shared<ServeJob>();
    // however this function is left (an exception included), the engine drops the job
    struct Abandon {
        ServeJob* j;
        ~Abandon() {
            j->cancel = true;
            std::lock_guard<std::mutex> lk(g_serve.mu);
            for (auto it = g_serve.queue.begin(); it != g_serve.queue.end(); ++it)
                if (it->get() == j) { g_serve.queue.erase(it); break; }
        }
    } abandon{job.get()};
    job->sampling = serve_resolve_sampling(ar, std::min(want, max_ctx - n));
    job->sampling.logprobs = ar.logprobs;
    job->sampling.prompt_logprobs = ar.echo && ar.logprobs >= 0;
    ServeGen g;
    g.kind = ar.raw ? GEN_COMPLETIONS : route == SERVE_ROUTE_RESPONSES ? GEN_RESPONSES : GEN_CHAT;
    g.logprobs = ar.logprobs;
    if (ar.echo) {  // the prompt as sent (a text prompt), or its tokens' text
        if (!ar.raw_is_ids) g.echo_text = ar.raw_text;
        else { std::string b; for (int id : pr.tokens) b += apix_bytes(id); g.echo_text = utf8_fix(b); }
        g.echo_pending = true;
        if (ar.logprobs >= 0) compl_entry(&g, pr.tokens[0], nullptr);  // the first token has no logprob
    }
    if (g.kind == GEN_RESPONSES) {
        g.resp = std::move(ar.resp);
        g.resp.set("temperature", Json::number(job->sampling.temperature));
        g.resp.set("top_p", Json::number(job->sampling.top_p));
    }
    job->prompt = std::move(pr);
    g.anthropic = anth; g.stream = ar.stream; g.include_usage = ar.include_usage;
    g.id = anth ? "msg_" + serve_rand_hex(24) : g.kind == GEN_COMPLETIONS ? "cmpl-" + serve_rand_hex(16)
         : g.kind == GEN_RESPONSES ? "resp_" + serve_rand_hex(32) : "chatcmpl-" + serve_rand_hex(16);
    g.model = anth ? ar.model : s.model_id;
    g.created = (long)time(nullptr);
    g.prompt_tokens = n;
    lg->id = g.id;
    // admission: a bounded fifo. the queue's requests beyond the free lanes wait; refused when
    // this one would make more than --max-pending-requests wait (requests queued a moment ago
    // that an idle engine thread has not taken yet are not waiting)
    {
        std::lock_guard<std::mutex> lk(s.mu);
        const int free_lanes = std::max(0, s.opt.max_concurrency - s.running);
        if (serve_stopping()) { e = serve_make_error(503, "server_shutting_down", "the server is shutting down"); ok = false; }
        else if ((int)s.queue.size() + 1 > s.opt.max_pending_requests + free_lanes) {
            e = serve_make_error(429, "server_overloaded", "too many pending requests; retry later"); ok = false;
        } else {
            job->t_enqueue = serve_now();
            s.queue.push_back(job);
            s.engine_cv.notify_one();
        }
    }
    if (!ok) { serve_conn_send_error(c, anth, e, keep && !serve_stopping(), lg); return keep && !serve_stopping(); }
    if (s.jsonl) {
        Json ev = Json::object();
        ev.set("event", Json::string("request_start"));
        ev.set("id", Json::string(g.id));
        ev.set("api", Json::string(lg->api));
        ev.set("stream", Json::boolean(ar.stream));
        ev.set("prompt_tokens", Json::integer(n));
        ev.set("max_tokens", Json::integer(job->sampling.max_tokens));
        serve_jsonl(ev);
    }
    // wait for the engine to take it, watching the client, the pending timeout and shutdown
    int why = 0;  // 503 queue timeout, 499 client gone
    {
        std::unique_lock<std::mutex> lk(s.mu);
        double deadline = job->t_enqueue + s.opt.pending_timeout_ms / 1e3;
        while (!job->started) {
            bool timeout = serve_now() >= deadline, cancel = serve_cancel_all();
            lk.unlock();
            bool gone = serve_conn_peer_gone(c);
            lk.lock();
            if (job->started) break;
            if (timeout || cancel || gone) {
                for (auto it = s.queue.begin(); it != s.queue.end(); ++it)
                    if (it->get() == job.get()) { s.queue.erase(it); break; }
                why = gone ? 499 : 503;
                if (cancel && !gone) e = serve_make_error(503, "server_shutting_down", "the server is shutting down");
                else e = serve_make_error(503, "request_queue_timeout", "the request waited too long in the queue (see --pending-timeout-ms)");
                break;
            }
            job->cv.wait_for(lk, std::chrono::milliseconds(50));
        }
    }
    if (why == 499) { lg->status = 499; lg->code = "client_closed"; return false; }
    if (why == 503) { serve_conn_send_error(c, anth, e, keep, lg); return keep; }
    lg->queue_s = job->t_start - job->t_enqueue;
    if (g.stream) {
        sse_begin(c, rq, keep);
        serve_gen_begin(c, &g);
    }
    // relay events until the engine is done; a client that leaves cancels at the next token
    for (;;) {
        std::deque<ServeEvent> evs;
        bool done;
        {
            std::unique_lock<std::mutex> lk(s.mu);
            if (job->events.empty() && !job->done) job->cv.wait_for(lk, std::chrono::milliseconds(100));
            evs.swap(job->events);
            done = job->done;
        }
        if (!c->broken) for (const auto& ev : evs) serve_gen_event(c, &g, ev);
        if (done) break;
        if (c->broken || serve_conn_peer_gone(c)) { c->broken = true; job->cancel = true; }
        if (serve_cancel_all()) job->cancel = true;
    }
    const ServeResult& r = job->result;
    lg->completion = r.completion_tokens;
    lg->cached = r.cached_tokens;
    lg->cache = r.cache;
    lg->finish = r.finish;
    lg->prefill_s = r.prefill_s; lg->decode_s = r.decode_s;
    lg->spec = r.speculative;
    if (job->t_first > 0) lg->ttft_s = job->t_first - job->t_enqueue;
    if (c->broken) { lg->status = 499; lg->code = "client_closed"; return false; }
    if (!r.error.empty() || (serve_cancel_all() && job->cancel)) {
        ServeError fe = r.error.empty() ? serve_make_error(503, "server_shutting_down", "the server is shutting down; generation stopped")
                                        : serve_make_error(500, "internal_error", "generation failed");
        if (g.stream) { serve_gen_stream_error(c, &g, fe); lg->status = fe.status; lg->code = fe.code; return keep && c->chunked_out; }
        serve_conn_send_error(c, anth, fe, keep, lg);
        return keep;
    }
    serve_gen_finish(c, &g, r, keep);
    lg->status = 200;
    if (g.stream && !c->chunked_out) return false;  // http/1.0: the stream ended with the connection
    return keep && !c->broken;
}

static std::string http_url_decode(const std::string& s) {
    std::string o;
    for (size_t i = 0; i < s.size(); i++) {
        auto hv = [](char ch) { return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1; };
        if (s[i] == '%' && i + 2 < s.size() && hv(s[i + 1]) >= 0 && hv(s[i + 2]) >= 0) { o.push_back((char)(hv(s[i + 1]) * 16 + hv(s[i + 2]))); i += 2; }
        else o.push_back(s[i]);
    }
    return o;
}

// GET / DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items, and the endpoints
// that explicitly fail (POST .../cancel, POST /v1/responses/compact)
static void resp_handle_stored(ServeConn* c, const HttpRequest& rq, bool keep, ServeReqLog* lg) {
    std::string rest = rq.path.substr(14), query = rq.query;  // after "/v1/responses/"
    size_t slash = rest.find('/');
    std::string id = http_url_decode(rest.substr(0, slash)), sub = slash == std::string::npos ? "" : rest.substr(slash + 1);
    bool get = rq.method == "GET" || rq.method == "HEAD";
    auto fail = [&](int st, const char* code, const char* msg, const char* allow = nullptr) {
        serve_conn_send_error(c, false, serve_make_error(st, code, msg), keep, lg, allow ? std::string("Allow: ") + allow + "\r\n" : "");
    };
    if (id == "compact" && sub.empty()) {
        if (rq.method != "POST") return fail(405, "method_not_allowed", "method not allowed for this endpoint", "POST, OPTIONS");
        return fail(400, "compaction_not_supported", "response compaction is not supported");
    }
    if (sub == "cancel") {
        if (rq.method != "POST") return fail(405, "method_not_allowed", "method not allowed for this endpoint", "POST, OPTIONS");
        return fail(400, "invalid_request_error", "only background responses can be cancelled, and background responses are not supported");
    }
    if (!sub.empty() && sub != "input_items") return fail(404, "not_found", "no such endpoint");
    if (sub.empty() ? !(get || rq.method == "DELETE") : !get)
        return fail(405, "method_not_allowed", "method not allowed for this endpoint", sub.empty() ? "GET, HEAD, DELETE, OPTIONS" : "GET, HEAD, OPTIONS");
    if (rq.method == "DELETE") {
        if (!resp_store_delete(id)) return fail(404, "response_not_found", "no stored response has this id");
        Json o = Json::object();
        o.set("id", Json::string(id));
        o.set("object", Json::string("response.deleted"));
        o.set("deleted", Json::boolean(true));
        serve_conn_send(c, 200, "application/json", json_dump(o), keep);
        lg->status = 200;
        return;
    }
    RespRecord rec;
    if (!resp_store_get(id, &rec)) return fail(404, "response_not_found", "no stored response has this id");
    if (sub.empty()) {
        serve_conn_send(c, 200, "application/json", json_dump(rec.response), keep, rq.method == "HEAD");
        lg->status = 200;
        return;
    }
    // input_items: after, limit 1..100 (20), order asc | desc (desc)
    std::string after, order = "desc";
    long long limit = 20;
    for (size_t p = 0; p < query.size();) {
        size_t amp = query.find('&', p);
        std::string kv = query.substr(p, amp == std::string::npos ? std::string::npos : amp - p);
        p = amp == std::string::npos ? query.size() : amp + 1;
        size_t eq = kv.find('=');
        std::string k = kv.substr(0, eq), v = eq == std::string::npos ? "" : http_url_decode(kv.substr(eq + 1));
        if (k == "after") after = v;
        else if (k == "order" && (v == "asc" || v == "desc")) order = v;
        else if (k == "limit" && serve_parse_long(v.c_str(), 1, 100, &limit)) {}
        else if (!k.empty()) return fail(400, "invalid_request_error", "input_items takes after, limit (1..100) and order (asc or desc)");
    }
    std::vector<const Json*> items;
    for (const auto& it : rec.input.arr) items.push_back(&it);
    if (order == "desc") std::reverse(items.begin(), items.end());
    size_t start = 0;
    if (!after.empty()) {
        while (start < items.size() && !(items[start]->get("id") && items[start]->get("id")->str == after)) start++;
        if (start == items.size()) return fail(400, "invalid_request_error", "'after' names no item of this response");
        start++;
    }
    Json data = Json::array();
    for (size_t k = start; k < items.size() && (long long)data.arr.size() < limit; k++) data.push(*items[k]);
    Json o = Json::object();
    o.set("object", Json::string("list"));
    o.set("data", data);
    o.set("first_id", data.arr.empty() ? Json() : *data.arr.front().get("id"));
    o.set("last_id", data.arr.empty() ? Json() : *data.arr.back().get("id"));
    o.set("has_more", Json::boolean(start + data.arr.size() < items.size()));
    serve_conn_send(c, 200, "application/json", json_dump(o), keep, rq.method == "HEAD");
    lg->status = 200;
}

static Json serve_model_object() {
    ServeState& s = g_serve;
    char iso[32];
    time_t t = (time_t)s.created;
    struct tm tm; gmtime_r(&t, &tm);
    strftime(iso, sizeof iso, "%Y-%m-%dT%H:%M:%SZ", &tm);
    Json m = Json::object();  // openai's fields and anthropic's, so both sdks read it
    m.set("id", Json::string(s.model_id));
    m.set("object", Json::string("model"));
    m.set("created", Json::integer(s.created));
    m.set("owned_by", Json::string("ninfer"));
    m.set("type", Json::string("model"));
    m.set("display_name", Json::string(s.model_id));
    m.set("created_at", Json::string(iso));
    m.set("max_context", Json::integer(s.eng->max_context > 0 ? s.eng->max_context : s.opt.max_context));
    return m;
}

// constant-time comparison for the api key
static bool serve_key_equal(const std::string& a, const std::string& b) {
    unsigned char d = a.size() != b.size();
    for (size_t i = 0; i < a.size(); i++) d |= (unsigned char)(a[i] ^ (i < b.size() ? b[i] : 0));
    return d == 0;
}
static bool serve_authorized(const HttpRequest& rq) {
    const std::string& key = g_serve.opt.api_key;
    if (key.empty()) return true;
    if (const std::string* h = rq.header("authorization"))
        if (h->size() > 7 && !strncasecmp(h->c_str(), "Bearer ", 7) && serve_key_equal(http_trim(h->substr(7)), key)) return true;
    if (const std::string* h = rq.header("x-api-key"))
        if (serve_key_equal(*h, key)) return true;
    return false;
}

// the host part of a Host header or an origin's authority: "[::1]:8080" -> "[::1]", "a:1" -> "a"
static std::string serve_host_name(std::string h) {
    h = http_lower(h);
    size_t c = h.rfind(':');
    if (c != std::string::npos && h.find(']', c) == std::string::npos) h.resize(c);
    return h;
}
static bool serve_is_loopback(const std::string& h) {
    if (h == "localhost" || h == "::1" || h == "[::1]") return true;
    struct in_addr a;  // 127.0.0.0/8, written as a dotted quad
    return inet_pton(AF_INET, h.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}
// browser attacks on a local server (issue 11, defect 6). null when the request may go on,
// else "<kind> <message>": h = a malformed Host (400), f = a foreign Host (403), o = a
// foreign Origin (403).
//   - http/1.1 needs exactly one Host (rfc 9112 3.2);
//   - dns rebinding: a page on evil.example whose name now resolves to 127.0.0.1 reaches a
//     keyless loopback server with Host: evil.example. so when the server is keyless and bound
//     to loopback, only loopback names (and --allowed-hosts) are served; --host with another
//     address or --api-key lifts the check (the operator exposed or protected the server);
//   - a cross-origin page could post to the api and read nothing, but still run generations:
//     a request with an Origin other than the server's own needs --cors.
static const char* serve_origin_refused(const HttpRequest& rq) {
    const ServeOptions& o = g_serve.opt;
    int hosts = 0;
    const std::string* host = nullptr;
    for (const auto& h : rq.headers) if (h.first == "host") { hosts++; host = &h.second; }
    if (hosts > 1 || (rq.minor >= 1 && hosts == 0) || (host && host->empty())) return "h HTTP/1.1 requests need exactly one Host header";
    if (host && o.api_key.empty() && serve_is_loopback(serve_host_name(o.host))) {
        std::string name = serve_host_name(*host);
        bool ok = serve_is_loopback(name) || name == http_lower(o.host);
        for (const auto& a : o.allowed_hosts) ok = ok || name == a;
        if (!ok) return "f this server answers loopback host names only (see --allowed-hosts, --host)";
    }
    if (!o.cors) {
        const std::string* origin = rq.header("origin");
        if (origin && !(host && http_lower(*origin) == "http://" + http_lower(*host)))
            return "o cross-origin requests need a server started with --cors";
    }
    return nullptr;
}

// one request whose head is parsed (and consumed from c->in). returns whether to keep the
// connection for another request.
static bool serve_handle_request(ServeConn* c, const HttpRequest& rq, double t0) {
    ServeState& s = g_serve;
    ServeReqLog lg;
    lg.t0 = t0; lg.method = rq.method; lg.path = rq.path;
    bool has_body = rq.chunked || rq.content_length > 0;
    bool keep = rq.keep_alive && !serve_stopping();
    const std::string& p = rq.path;
    int route = p == "/health" ? SERVE_ROUTE_HEALTH : p == "/v1/models" ? SERVE_ROUTE_MODELS
              : !p.compare(0, 11, "/v1/models/") && p.size() > 11 ? SERVE_ROUTE_MODEL
              : p == "/v1/chat/completions" ? SERVE_ROUTE_CHAT : p == "/v1/messages" ? SERVE_ROUTE_MESSAGES
              : p == "/v1/messages/count_tokens" ? SERVE_ROUTE_COUNT : p == "/v1/completions" ? SERVE_ROUTE_COMPLETIONS
              : p == "/v1/responses" ? SERVE_ROUTE_RESPONSES : p == "/v1/responses/input_tokens" ? SERVE_ROUTE_RESPONSES_COUNT
              : !p.compare(0, 14, "/v1/responses/") && p.size() > 14 ? SERVE_ROUTE_RESPONSE : SERVE_ROUTE_NONE;
    bool anth = route == SERVE_ROUTE_MESSAGES || route == SERVE_ROUTE_COUNT;
    bool is_get = rq.method == "GET" || rq.method == "HEAD";
    bool post_route = route == SERVE_ROUTE_CHAT || route == SERVE_ROUTE_MESSAGES || route == SERVE_ROUTE_COUNT
                   || route == SERVE_ROUTE_COMPLETIONS || route == SERVE_ROUTE_RESPONSES || route == SERVE_ROUTE_RESPONSES_COUNT;
    // answered from the head alone: a body already received is skipped; one still on its
    // way is not waited for, and the connection closes
    auto early = [&](const ServeError& e, const std::string& extra = "") {
        bool k = keep && (!has_body || (!rq.chunked && (uint64_t)rq.content_length <= c->in.size()));
        if (k && has_body) c->in.erase(0, (size_t)rq.content_length);
        serve_conn_send_error(c, anth, e, k, &lg, extra);
        serve_log_request(lg);
        return k;
    };
    if (const char* why = serve_origin_refused(rq))
        return early(serve_make_error(why[0] == 'h' ? 400 : 403, why[0] == 'h' ? "invalid_request_error" : why[0] == 'f' ? "host_not_allowed" : "cross_origin_refused",
                                      why + 2));
    if (rq.method == "OPTIONS") {
        serve_conn_send(c, 204, nullptr, "", keep && !has_body, true, "Allow: GET, POST, DELETE, OPTIONS\r\n");
        lg.status = 204; serve_log_request(lg);
        return keep && !has_body;
    }
    if (route == SERVE_ROUTE_NONE) return early(serve_make_error(404, "not_found", "no such endpoint: " + serve_log_path(p)));
    if (route != SERVE_ROUTE_RESPONSE && (post_route ? rq.method != "POST" : !is_get))
        return early(serve_make_error(405, "method_not_allowed", "method not allowed for this endpoint"),
                     post_route ? "Allow: POST, OPTIONS\r\n" : "Allow: GET, HEAD, OPTIONS\r\n");
    if (route != SERVE_ROUTE_HEALTH && !serve_authorized(rq))
        return early(serve_make_error(401, "invalid_api_key", "missing or invalid api key"), "WWW-Authenticate: Bearer\r\n");
    if (post_route && serve_stopping()) return early(serve_make_error(503, "server_shutting_down", "the server is shutting down"));
    if (post_route) {  // json only: a browser's "simple" text/plain or form post is no api call
        const std::string* ct = rq.header("content-type");
        std::string mt = ct ? http_lower(http_trim(ct->substr(0, ct->find(';')))) : "";
        if (mt != "application/json")
            return early(serve_make_error(415, "unsupported_media_type", "request bodies must be Content-Type: application/json"));
    }
    std::string body;
    if (has_body) {
        int r = serve_conn_read_body(c, rq, t0, &body);
        if (r == -1) { lg.status = 499; lg.code = "client_closed"; serve_log_request(lg); return false; }
        if (r > 0) {
            serve_release(c);  // before answering: the client may retry at once
            serve_conn_send_error(c, anth, http_error(r), false, &lg);
            serve_log_request(lg);
            return false;
        }
    }
    bool head_only = rq.method == "HEAD";
    if (route == SERVE_ROUTE_HEALTH) {
        serve_conn_send(c, 200, "application/json", "{\"status\":\"ok\"}", keep, head_only);
        lg.status = 200;
    } else if (route == SERVE_ROUTE_MODELS) {
        Json data = Json::array();
        data.push(serve_model_object());
        Json o = Json::object();
        o.set("object", Json::string("list"));
        o.set("data", data);
        o.set("has_more", Json::boolean(false));
        o.set("first_id", Json::string(s.model_id));
        o.set("last_id", Json::string(s.model_id));
        serve_conn_send(c, 200, "application/json", json_dump(o), keep, head_only);
        lg.status = 200;
    } else if (route == SERVE_ROUTE_MODEL) {
        std::string id = http_url_decode(p.substr(11));
        if (id != s.model_id) serve_conn_send_error(c, false, serve_make_error(404, "model_not_found", "model not found"), keep, &lg);
        else { serve_conn_send(c, 200, "application/json", json_dump(serve_model_object()), keep, head_only); lg.status = 200; }
    } else if (route == SERVE_ROUTE_RESPONSE) {
        resp_handle_stored(c, rq, keep, &lg);
    } else {
        keep = serve_handle_generate(c, rq, route, &body, keep, &lg);
    }
    serve_log_request(lg);
    return keep && !c->broken;
}

// serve_handle_request, with whatever it throws (an allocation failure while it answers,
// e.g. a response too large for the memory left) confined to its request: the client gets
// 500 / 503 if nothing was sent yet (else the connection closes: the framing is lost), and
// the server goes on
static bool serve_handle_request_isolated(ServeConn* c, const HttpRequest& rq, double t0) {
    uint64_t w0 = c->written;
    bool oom = false;
    try { return serve_handle_request(c, rq, t0); }
    catch (const std::bad_alloc&) { oom = true; }
    catch (...) {}
    fprintf(stderr, "ninfer-serve: %d %s %.80s code=%s\n", oom ? 503 : 500, rq.method.c_str(), rq.path.c_str(), oom ? "out_of_memory" : "internal_error");
    if (c->written != w0 || c->broken) return false;
    try {  // the api's own error shape when there is memory for it, else fixed bytes
        bool anth = !rq.path.compare(0, 12, "/v1/messages");
        serve_conn_send_error(c, anth, oom ? serve_make_error(503, "out_of_memory", "the server is out of memory; retry later")
                                           : serve_make_error(500, "internal_error", "the request failed"), false, nullptr);
    } catch (...) {
        if (c->written != w0) return false;
        const char* b = oom ? "{\"error\":{\"message\":\"the server is out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":\"out_of_memory\"}}"
                            : "{\"error\":{\"message\":\"the request failed\",\"type\":\"server_error\",\"param\":null,\"code\":\"internal_error\"}}";
        char h[160];
        int n = snprintf(h, sizeof h, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                         oom ? 503 : 500, http_status_text(oom ? 503 : 500), strlen(b));
        if (serve_conn_write(c, h, (size_t)n)) serve_conn_write(c, b, strlen(b));
    }
    return false;
}

static void serve_conn_serve(ServeConn* c) {
    ServeState& s = g_serve;
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (;;) {
        // wait for the next request (keep-alive idle time); a stop signal closes idle connections
        if (c->in.empty()) {
            if (serve_stopping()) return;
            int r = serve_conn_read(c, serve_now() + s.opt.idle_timeout_ms / 1e3, true);
            if (r <= 0) return;
        }
        double t0 = serve_now();
        HttpRequest rq;
        long hl;
        size_t scanned = 0;  // parse again only when a new line arrived (a head dribbled byte by byte stays linear)
        for (;;) {
            hl = 0;
            // a new line, too much, or the first bytes of a request line (binary is refused at once)
            if (memchr(c->in.data() + scanned, '\n', c->in.size() - scanned) || c->in.size() > s.lim.max_head ||
                (c->in.size() <= 256 && !memchr(c->in.data(), '\n', c->in.size())))
                hl = http_parse_head(c->in.data(), c->in.size(), s.lim, &rq);
            if (hl != 0) break;
            scanned = c->in.size();
            int r = serve_conn_read(c, t0 + s.opt.read_timeout_ms / 1e3, false);
            if (r == -1 && c->in.find_first_not_of("\r\n") != std::string::npos) {  // slow or stalled client
                ServeReqLog lg; lg.t0 = t0; lg.method = "-"; lg.path = "-";
                serve_conn_send_error(c, false, http_error(408), false, &lg);
                serve_log_request(lg);
                return;
            }
            if (r <= 0) return;
        }
        if (hl < 0) {
            c->head = rq.method == "HEAD";
            ServeReqLog lg; lg.t0 = t0; lg.method = rq.method.empty() ? "-" : rq.method; lg.path = rq.path;
            bool anth = !rq.path.compare(0, 12, "/v1/messages");
            serve_conn_send_error(c, anth, http_error((int)-hl), false, &lg);
            serve_log_request(lg);
            return;  // after a parse error the stream is out of sync: close
        }
        c->in.erase(0, (size_t)hl);
        c->head = rq.method == "HEAD";
        bool keep = serve_handle_request_isolated(c, rq, t0);
        serve_release(c);  // the request's body (and the json made from it) are gone now
        if (!keep) return;
    }
}

static void* serve_conn_main(void* arg) {
    ServeConn* c = (ServeConn*)arg;
    try { serve_conn_serve(c); } catch (...) {}  // between requests (reading a head): the connection ends, nothing else
    serve_release(c);
    serve_conn_close(c);
    delete c;
    {
        std::lock_guard<std::mutex> lk(g_serve.mu);
        g_serve.n_conns--;
    }
    g_serve.conns_cv.notify_all();
    return nullptr;
}

static void serve_on_signal(int) {
    g_serve.signals.fetch_add(1);
    char b = 1;
    ssize_t w = write(g_serve.stop_pipe[1], &b, 1);
    (void)w;
}

// ----------------------------------------------------------------------------
// entry point: parse flags, check features, load, listen, serve until a signal

static int serve_main(int argc, char** argv, const ServeBackend& backend) {
    ServeState& s = g_serve;
    ServeOptions& o = s.opt;
    std::string err;
    int pr = serve_parse_args(argc, argv, &o, &err);
    if (pr == 2) { serve_usage(stdout); return 0; }
    if (pr != 0) { fprintf(stderr, "ninfer-serve: error: %s\n", err.c_str()); return 1; }
    if (!serve_check_features(o, backend.supports, &err)) { fprintf(stderr, "ninfer-serve: error: %s\n", err.c_str()); return 1; }
    if (!o.request_log_jsonl.empty()) {
        s.jsonl = fopen(o.request_log_jsonl.c_str(), "a");
        if (!s.jsonl) { fprintf(stderr, "ninfer-serve: error: cannot open %s: %s\n", o.request_log_jsonl.c_str(), strerror(errno)); return 1; }
    }
    signal(SIGPIPE, SIG_IGN);
    {
        uint64_t seed = (uint64_t)time(nullptr) ^ ((uint64_t)getpid() << 32);
        int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) { uint64_t r; if (read(fd, &r, sizeof r) == (ssize_t)sizeof r) seed ^= r; close(fd); }
        s.rng = seed;
    }
    // the model first: the port opens only when requests can be served
    ServeEngine* eng = backend.load(o.model_path.c_str(), o, &err);
    if (!eng) { fprintf(stderr, "ninfer-serve: error: %s\n", err.empty() ? "cannot load the model" : err.c_str()); return 1; }
    s.eng = eng;
    s.model_id = !o.model_id.empty() ? o.model_id : !eng->model_id.empty() ? eng->model_id : "ninfer";
    s.api.model_id = s.model_id;
    s.api.thinking = !o.no_thinking;
    s.api.preserve_thinking = o.preserve_thinking;
    s.api.vision = eng->vision;
    g_resp.max_records = (size_t)o.response_store_max_records;
    g_resp.max_bytes = (size_t)o.response_store_max_mib << 20;
    s.lim.max_body = (uint64_t)o.max_request_mib << 20;
    s.body_budget = 4 * (int64_t)s.lim.max_body;
    s.created = (long)time(nullptr);
    // listen
    struct addrinfo hints, *res = nullptr;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC; hints.ai_socktype = SOCK_STREAM; hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    std::string port = std::to_string(o.port);
    int gai = getaddrinfo(o.host.c_str(), port.c_str(), &hints, &res);
    if (gai != 0) { fprintf(stderr, "ninfer-serve: error: cannot resolve --host %s: %s\n", o.host.c_str(), gai_strerror(gai)); return 1; }
    int lfd = -1, bind_errno = 0;
    for (struct addrinfo* a = res; a && lfd < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) { bind_errno = errno; continue; }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) lfd = fd;
        else { bind_errno = errno; close(fd); }
    }
    freeaddrinfo(res);
    if (lfd < 0) { fprintf(stderr, "ninfer-serve: error: cannot listen on %s:%d: %s\n", o.host.c_str(), o.port, strerror(bind_errno)); return 1; }
    s.listen_fd = lfd;
    struct sockaddr_storage sa; socklen_t sl = sizeof sa;
    int bound_port = o.port;
    if (getsockname(lfd, (struct sockaddr*)&sa, &sl) == 0)
        bound_port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6*)&sa)->sin6_port : ((struct sockaddr_in*)&sa)->sin_port);
    if (pipe2(s.stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) { fprintf(stderr, "ninfer-serve: error: pipe: %s\n", strerror(errno)); return 1; }
    struct sigaction sa_sig;
    memset(&sa_sig, 0, sizeof sa_sig);
    sa_sig.sa_handler = serve_on_signal;  // no SA_RESTART: poll returns EINTR
    sigemptyset(&sa_sig.sa_mask);
    sigaction(SIGINT, &sa_sig, nullptr);
    sigaction(SIGTERM, &sa_sig, nullptr);
    // one engine thread per lane: each takes the next queued request and runs it (the engine
    // interleaves the running ones, ServeEngine.generate)
    std::vector<pthread_t> engine_threads(o.max_concurrency);
    for (pthread_t& t : engine_threads)
        if (pthread_create(&t, nullptr, serve_engine_main, nullptr) != 0) { fprintf(stderr, "ninfer-serve: error: cannot start the engine thread\n"); return 1; }
    fprintf(stderr, "ninfer-serve: listening on http://%s:%d (model %s, max context %d)\n",
            o.host.find(':') != std::string::npos ? ("[" + o.host + "]").c_str() : o.host.c_str(), bound_port,
            s.model_id.c_str(), eng->max_context > 0 ? eng->max_context : o.max_context);
    if (s.jsonl) {
        Json ev = Json::object();
        ev.set("event", Json::string("server_start"));
        ev.set("model_id", Json::string(s.model_id));
        ev.set("host", Json::string(o.host));
        ev.set("port", Json::integer(bound_port));
        ev.set("max_context", Json::integer(eng->max_context));
        ev.set("api_key", Json::string(o.api_key.empty() ? "" : "[redacted]"));
        serve_jsonl(ev);
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    // accept until a signal; this thread logs the stats lines (never busy with a request, so
    // they come on time however loaded the engine threads are), and goes on logging them while
    // the server drains (below)
    const double stats_every = o.log_stats_interval_ms / 1e3;
    double next_stats = serve_now() + stats_every;
    auto stats_due = [&]() {  // called with s.mu held
        if (stats_every > 0 && serve_now() >= next_stats) { serve_stats_line(); next_stats = serve_now() + stats_every; }
    };
    for (;;) {
        int wait_ms = -1;
        if (stats_every > 0) {
            { std::lock_guard<std::mutex> lk(s.mu); stats_due(); }
            wait_ms = (int)std::min(ceil((next_stats - serve_now()) * 1e3), 1e9);
        }
        struct pollfd p[2] = {{lfd, POLLIN, 0}, {s.stop_pipe[0], POLLIN, 0}};
        int r = poll(p, 2, wait_ms);
        if (serve_stopping()) break;
        if (r < 0) { if (errno == EINTR) continue; fprintf(stderr, "ninfer-serve: poll: %s\n", strerror(errno)); break; }
        if (r == 0 || !(p[0].revents & POLLIN)) continue;
        int fd = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) usleep(10000);
            continue;
        }
        bool full;
        {
            std::lock_guard<std::mutex> lk(s.mu);
            full = s.n_conns >= o.max_connections;
            if (!full) s.n_conns++;
        }
        if (full) {  // one best-effort write, no waiting: the main thread never blocks on a client
            std::string b = serve_error_body(false, serve_make_error(503, "server_overloaded", "too many open connections"));
            std::string resp = http_response_head(503, "application/json", (long long)b.size(), false, "Retry-After: 1\r\n") + b;
            ssize_t w = send(fd, resp.data(), resp.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)w;
            close(fd);
            continue;
        }
        ServeConn* c = new (std::nothrow) ServeConn;
        pthread_t t;
        if (c) c->fd = fd;
        if (!c || pthread_create(&t, &attr, serve_conn_main, c) != 0) {
            close(fd); delete c;
            std::lock_guard<std::mutex> lk(s.mu);
            s.n_conns--;
        }
    }
    // drain: no new connections; idle ones close; running and queued requests get
    // --drain-timeout-ms to finish (a second signal cuts it short), then are cancelled
    close(lfd);
    {
        std::unique_lock<std::mutex> lk(s.mu);
        fprintf(stderr, "ninfer-serve: shutting down: %d connection(s), %zu queued, %s\n", s.n_conns, s.queue.size(),
                (std::to_string(s.running) + " running").c_str());
        double deadline = serve_now() + o.drain_timeout_ms / 1e3;
        while (s.n_conns > 0 && serve_now() < deadline && s.signals < 2) { s.conns_cv.wait_for(lk, std::chrono::milliseconds(50)); stats_due(); }
        s.force_cancel = true;
        for (auto& j : s.queue) j->cv.notify_all();
        deadline = serve_now() + 3.0;
        while (s.n_conns > 0 && serve_now() < deadline) { s.conns_cv.wait_for(lk, std::chrono::milliseconds(50)); stats_due(); }
        s.engine_exit = true;
        s.engine_cv.notify_all();
    }
    bool engine_idle;
    {
        std::unique_lock<std::mutex> lk(s.mu);
        double deadline = serve_now() + 2.0;
        while (s.running && serve_now() < deadline) { lk.unlock(); usleep(10000); lk.lock(); }
        engine_idle = !s.running;
    }
    if (engine_idle) {
        for (pthread_t& t : engine_threads) pthread_join(t, nullptr);
        if (eng->close) eng->close(eng->self);
    }
    if (s.jsonl) fclose(s.jsonl);
    fprintf(stderr, "ninfer-serve: stopped\n");
    return 0;
}
