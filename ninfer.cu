// ninfer: inference for the Qwen3.5 dense family (hybrid gated deltanet + gated attention)
// from .ninfer artifacts, in one cuda translation unit. the text model runs on the gpu (and
// on the cpu reference path); mtp speculative decoding (--spec mtp) runs on both paths
// (generate_spec_cpu, generate_spec_gpu; multimodal prompts decode without it); many users at
// once (--max-concurrency: batched decode on the gpu); the vision tower and multimodal prompts run on both paths
// (vision_forward_cpu / gpu_vision_forward, mm_prepare_*, engine_generate with an MmPrompt),
// fed by the cli (--image, --video, --messages parts) and the server (--vision).
//
// contents (sections are in dependency order; grep for the banner "// === N.")
//   1. includes and checks   CHECK macros, cuda error checks, timers
//   2. geometry              the model's dimensions, read from the artifact's tensor shapes
//   3. weights               plain structs of views into the mmap'd artifact; the binder
//                            that validates the whole inventory
//   4. reference path (cpu)  the model math in fp32, the oracle for every kernel (and, for
//                            the tests, a bf16 mode that rounds where the gpu path does):
//                            4.1 row decode + matmul, 4.2 norms, 4.3 SeqState (kv, conv and
//                            recurrent state slots, mtp kv; snapshot/restore) and RunState, 4.4 attention
//                            with m-rope, 4.5 gated deltanet (conv, chunked + recurrent delta
//                            rule; per-column state slots), 4.6 mlp, layer, forward_cpu (and its
//                            verification mode), mtp_forward_cpu, prefill_cpu,
//                            4.7 the vision tower (vision_forward_cpu), 4.8 the multimodal
//                            prompt (placeholder expansion, vision rows, m-rope positions,
//                            rope_delta, prefill_mm_cpu)
//   5. sampler               greedy / temperature / top-k / top-p / min-p / penalties, a
//                            constraint's mask (Sampler.mask, first of all),
//                            counter-based rng, the arithmetic shared with the gpu sampler,
//                            speculative sampling of one verification column (sample_spec)
//   6. generation (cpu)      token domain and stop ids from the artifact, the generation
//                            loop with its tap (prompt logits, sampled rows) and its
//                            constraint (GenConstraint: grammar.h's matcher), logprobs,
//                            mtp speculative decoding (the round: generate_spec_cpu),
//                            perplexity
//   7. kernels               the gpu kernel layer, decode ops first, then the prefill ops:
//                            7.1 device helpers, launch_k + pdl, 7.2 gemv (quantized, tensor
//                            cores; gemv2: a pair of products of one x in one launch),
//                            7.3 norms, 7.4 elementwise (swiglu, embed gather, m-rope,
//                            the copy-bandwidth kernel),
//                            7.5 deltanet decode (conv, gates, gdn_step with state slots),
//                            7.6 attention decode (bf16 / int8 / fp8 kv, attn_prep, split-k),
//                            7.7 argmax, 7.8 sampling on the device (mask_logits, one
//                            speculative verification column: sample_spec_kernel, the
//                            lanes' draws: sample_lanes), 7.9 shared-memory matrix
//                            helpers (ldmatrix, cp.async, mbarriers, tma), 7.10 gemm
//                            (mma.sync; wgmma on sm_90a, x by tma, stages on mbarriers;
//                            gate_up's swiglu epilogue: gemm_swiglu) + linear, 7.11
//                            deltanet prefill (recurrent),
//                            7.12 deltanet prefill (chunked, tf32), 7.13 flash prefill, init,
//                            7.14 the vision tower's kernels (positions, layernorm, 2-d rope,
//                            per-frame attention, epilogues, products over the padded k),
//                            7.15 the mtp round's bookkeeping (accept, commit, drafts)
//   8. gpu forward           GpuTuning / GpuOpts, loading into one device arena, sequence
//                            state (lanes: per-lane slot groups, the paged kv pool, lane
//                            select), the forward pass, cuda graph decode, the batched decode
//                            of the lanes (gpu_decode_lanes), generate_gpu, the mtp
//                            round (gpu_mtp, generate_spec_gpu), perplexity_gpu, the copy
//                            bandwidth, state images and kv rows through pinned host memory
//                            (prefix reuse); the vision tower on the device
//                            (GpuVision: its own weight arena and workspace, only when asked;
//                            mm_prepare_gpu)
//   9. engine                one sequence on either path (cpu reference or gpu), engine_start;
//                            the lanes' scheduler (LaneSched: exclusive pieces and batched
//                            decode steps, generate_lane); prefix reuse (PrefixCache: retained
//                            prefixes in device / host state-slot tiers, prefix_prepare /
//                            prefix_finish)
//  10. info                  --info: identity, geometry, object classes, resources
//  11. text and serving      chat template -> tokens -> Engine -> reasoning / content / tool
//                            calls with stop strings; media in a conversation (chat_media,
//                            text_prompt, the tower with its media cache); serve.h's engine
//                            interface (chat and completion prompts, per-token logprobs,
//                            prompt scoring, --max-concurrency lanes with admission by kv pages,
//                            the memory plan)
//  12. cli                   gpu_parse_flag (bench_gpu shares it), then argument parsing and
//                            one runner per mode, ninfer-bench (llama-bench's pp / tg rows on
//                            either path), main (left out when NINFER_TESTING)
//
// the model math is in shared/docs/model.md, the container in shared/docs/format.md.
// user-facing contract: stdout carries only generated text or the requested diagnostic
// output; progress, stats and errors go to stderr; exit code 0 only on success.

// === 1. includes and checks ==================================================

#include <stdio.h>     // defines: printf, fprintf
#include <stdlib.h>    // defines: exit, strtoll, getenv
#include <stdint.h>    // defines: int64_t, uint16_t
#include <stdarg.h>    // defines: va_list
#include <string.h>    // defines: strcmp, memcpy
#include <math.h>      // defines: expf, sqrtf
#include <time.h>      // defines: clock_gettime
#include <ctype.h>     // defines: isspace
#include <errno.h>     // defines: errno
#include <dirent.h>    // defines: opendir, readdir (the "did you mean" of a mistyped model path)
#include <strings.h>   // defines: strcasecmp
#include <sys/stat.h>  // defines: stat, S_ISDIR
#include <string>      // defines: std::string
#include <vector>      // defines: std::vector
#include <algorithm>   // defines: std::sort, std::max
#include <type_traits> // defines: std::is_void_v
#include <list>        // defines: std::list (the retained prefixes)
#include <random>      // defines: std::mt19937_64 (ninfer-bench's prompt ids)
#ifdef _OPENMP
#include <omp.h>       // defines: omp_get_max_threads
#endif
#include <cuda_runtime.h>  // defines: cudaGetDeviceCount, cudaMalloc
#include <cudaTypedefs.h>  // defines: CUtensorMap, PFN_cuTensorMapEncodeTiled (the driver call through cudart's entry point)
#include <cuda_bf16.h>  // defines: __nv_bfloat16, __float2bfloat16, __bfloat162float
#include <cuda_fp16.h>  // defines: __half2float, __ushort_as_half
#include <cuda_fp8.h>   // defines: __nv_cvt_float_to_fp8, __nv_cvt_fp8x2_to_halfraw2
#include "format.h"    // defines: Json, Artifact, artifact_open, artifact_find, Mat, mat_from, mat_rows
#include "tokenizer.h" // defines: Tokenizer, tokenizer_encode, tokenizer_decode, chat_render, TextOut, OutEvent
#include "serve.h"     // defines: serve_main, ServeBackend, ServeEngine (the http server)
#include "vision.h"    // defines: Image, image_load, VisionConfig, VisionItem, vision_image, video_load, MediaLimits
#include "grammar.h"   // defines: Grammar, schema_compile, grammar_parse_gbnf, GrammarVocab, GrammarMatcher, matcher_mask

// fail fast with the location; for conditions that are bugs or unrecoverable states.
// bad *input* never reaches these: it is reported with a one-line message and exit 1.
#define CHECK(cond, ...) do { if (!(cond)) { \
    fprintf(stderr, "ninfer: %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); exit(EXIT_FAILURE); } } while (0)
#define cudaCheck(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "ninfer: %s:%d: cuda error: %s (%s)\n", __FILE__, __LINE__, cudaGetErrorString(e_), #call); \
    exit(EXIT_FAILURE); } } while (0)

// a user-facing error: one line on stderr, exit 1
static void die(const char* fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char* fmt, ...) {
    va_list ap; va_start(ap, fmt);
    fprintf(stderr, "ninfer: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(EXIT_FAILURE);
}

static double now_s() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

// number of usable cuda devices; 0 on a machine without a gpu or driver
static int gpu_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
    return n;
}

// === 2. geometry =============================================================
//
// ninfer reads the geometry from tensor shapes (format.md 14), so one binary serves every
// size. what shapes cannot give (the family constants, the vision head count) comes from
// the small table below and is checked against the shapes.

enum { MAX_LAYERS = 256 };

struct Geometry {
    int H = 0;            // hidden size, e.g. 4096
    int L = 0;            // decoder layers, e.g. 32
    int I = 0;            // mlp intermediate size, e.g. 12288
    int vocab = 0;        // embedding / head rows, e.g. 248320
    bool tied = false;    // no separate output head: the head is the embedding
    // full attention
    int Hq = 0, Hkv = 0, head_dim = 0;   // e.g. 16, 4, 256
    // gated deltanet
    int Hk = 0, Hv = 0, dk = 0, dv = 0;  // e.g. 16, 32, 128, 128
    int conv_dim = 0, conv_k = 0;        // 2*Hk*dk + Hv*dv, 4
    bool full[MAX_LAYERS] = {};          // layer l is full attention (else gdn)
    int n_full = 0, n_gdn = 0;
    // family constants (model.md 0, 2.3)
    float eps = 1e-6f;
    float rope_theta = 1e7f;
    int rope_dim = 64;                   // rotated dims per head = head_dim * 0.25
    int mrope_section[3] = {11, 11, 10};
    // optional parts
    bool has_mtp = false;
    int draft_rows = 0;                  // 0: no draft (proposal) head
    bool has_vision = false;
    int v_depth = 0, v_dim = 0, v_heads = 0, v_inter = 0, v_out = 0;  // e.g. 27, 1152, 16, 4304, 4096
    int v_patch = 16, v_temporal = 2, v_merge = 2, v_pos = 0;         // v_pos: 2304 learned positions
};

// vision heads are not recoverable from shapes (model.md 1.2): keyed by the tower width.
// 128 is our synthetic `tiny` tower (convert.py --synthetic).
static int vision_heads_for_width(int dv) {
    switch (dv) {
        case 128: return 2;    // synthetic tiny, head dim 64
        case 768: return 12;   // 0.8b
        case 1024: return 16;  // 2b, 4b
        case 1152: return 16;  // 9b, 27b (head dim 72)
        default: return 0;
    }
}

// shape of a tensor object, or an empty vector when absent
static std::vector<int64_t> shape_of(const Artifact* a, const std::string& name) {
    const TensorObject* t = artifact_find(a, name);
    return t && !t->resource ? t->shape : std::vector<int64_t>();
}

static bool geometry_from_artifact(const Artifact* a, Geometry* g, std::string* err) {
    auto bad = [&](const std::string& what) { *err = a->path + ": " + what; return false; };
    auto need = [&](const std::string& name, size_t rank, std::vector<int64_t>* s) {
        *s = shape_of(a, name);
        if (s->empty()) { bad("missing tensor '" + name + "'"); return false; }
        if (s->size() != rank) { bad("tensor '" + name + "' has rank " + std::to_string(s->size()) + ", expected " + std::to_string(rank)); return false; }
        return true;
    };
    *g = Geometry();
    std::vector<int64_t> s;
    if (!need("text/token_embedding", 2, &s)) return false;
    g->vocab = (int)s[0]; g->H = (int)s[1];
    while (artifact_find(a, "text/layers/" + std::to_string(g->L) + "/input_norm")) {
        if (++g->L > MAX_LAYERS) return bad("more than " + std::to_string(MAX_LAYERS) + " layers");
    }
    if (g->L == 0) return bad("no decoder layers (missing tensor 'text/layers/0/input_norm')");
    for (int l = 0; l < g->L; l++) {
        std::string p = "text/layers/" + std::to_string(l) + "/";
        bool fa = artifact_find(a, p + "attention/query_key") != nullptr;
        bool gd = artifact_find(a, p + "gdn/query_key") != nullptr;
        if (fa == gd) return bad("layer " + std::to_string(l) + " must have exactly one of attention/query_key and gdn/query_key");
        g->full[l] = fa;
        (fa ? g->n_full : g->n_gdn)++;
    }
    // full attention dims from the first full layer
    for (int l = 0; l < g->L; l++) {
        if (!g->full[l]) continue;
        std::string p = "text/layers/" + std::to_string(l) + "/attention/";
        std::vector<int64_t> qn, o, qk;
        if (!need(p + "query_norm", 1, &qn) || !need(p + "output", 2, &o) || !need(p + "query_key", 2, &qk)) return false;
        g->head_dim = (int)qn[0];
        if (o[1] % g->head_dim) return bad("tensor '" + p + "output' width is not a multiple of head_dim");
        g->Hq = (int)(o[1] / g->head_dim);
        int64_t kv_rows = qk[0] - (int64_t)g->Hq * g->head_dim;
        if (kv_rows <= 0 || kv_rows % g->head_dim) return bad("tensor '" + p + "query_key' rows do not split into query and key heads");
        g->Hkv = (int)(kv_rows / g->head_dim);
        break;
    }
    for (int l = 0; l < g->L; l++) {
        if (g->full[l]) continue;
        std::string p = "text/layers/" + std::to_string(l) + "/gdn/";
        std::vector<int64_t> al, nm, qk, cv;
        if (!need(p + "a_log", 1, &al) || !need(p + "norm", 1, &nm) || !need(p + "query_key", 2, &qk) || !need(p + "convolution", 2, &cv)) return false;
        g->Hv = (int)al[0]; g->dk = g->dv = (int)nm[0];
        if (qk[0] % (2 * g->dk)) return bad("tensor '" + p + "query_key' rows are not a multiple of 2*dk");
        g->Hk = (int)(qk[0] / (2 * g->dk));
        g->conv_k = (int)cv[0]; g->conv_dim = (int)cv[1];
        if (g->conv_dim != 2 * g->Hk * g->dk + g->Hv * g->dv) return bad("tensor '" + p + "convolution' width is not 2*Hk*dk + Hv*dv");
        break;
    }
    if (!need("text/layers/0/mlp/down", 2, &s)) return false;
    g->I = (int)s[1];
    g->tied = artifact_find(a, "text/output_head") == nullptr;
    g->has_mtp = artifact_find(a, "mtp/input_projection") != nullptr;
    if (artifact_find(a, "text/draft_head")) {
        if (!need("text/draft_head", 2, &s)) return false;
        g->draft_rows = (int)s[0];
    }
    g->has_vision = artifact_find(a, "vision/patch_embedding") != nullptr;
    if (g->has_vision) {
        if (!need("vision/patch_embedding", 2, &s)) return false;
        g->v_dim = (int)s[0];
        while (artifact_find(a, "vision/layers/" + std::to_string(g->v_depth) + "/attention/qkv")) g->v_depth++;
        if (!need("vision/layers/0/mlp/fc1", 2, &s)) return false;
        g->v_inter = (int)s[0];
        if (!need("vision/merger/fc2", 2, &s)) return false;
        g->v_out = (int)s[0];
        if (!need("vision/position_embedding", 2, &s)) return false;
        g->v_pos = (int)s[0];
        g->v_heads = vision_heads_for_width(g->v_dim);
        if (!g->v_heads) return bad("unknown vision tower width " + std::to_string(g->v_dim) + ": its head count is not in ninfer's table (known widths: 768, 1024, 1152)");
        const int vd = g->v_dim / g->v_heads;
        if (g->v_dim % g->v_heads || vd % 4 || vd > 128) return bad("vision head dim " + std::to_string(vd) + " is not a multiple of 4 up to 128 (the 2-d rotary splits it in quarters)");
        int side = (int)lround(sqrt((double)g->v_pos));
        if (side < 2 || side * side != g->v_pos) return bad("vision/position_embedding has " + std::to_string(g->v_pos) + " rows, not a square grid");
    }
    // the engine's fixed inner sizes (style.md 14): check them here, once
    if (g->n_full == 0 || g->n_gdn == 0) return bad("expected both full-attention and gated-deltanet layers");
    if (g->head_dim != 256) return bad("full-attention head_dim is " + std::to_string(g->head_dim) + ", expected 256 for the qwen3.5 family");
    if (g->dk != 128) return bad("gated-deltanet head dim is " + std::to_string(g->dk) + ", expected 128");
    if (g->conv_k != 4) return bad("gated-deltanet conv kernel is " + std::to_string(g->conv_k) + ", expected 4");
    if (g->Hq % g->Hkv) return bad("query heads " + std::to_string(g->Hq) + " not a multiple of kv heads " + std::to_string(g->Hkv));
    if (g->Hv % g->Hk) return bad("gdn value heads " + std::to_string(g->Hv) + " not a multiple of key heads " + std::to_string(g->Hk));
    if (g->has_vision && g->v_out != g->H) return bad("vision merger output " + std::to_string(g->v_out) + " != hidden size " + std::to_string(g->H));
    g->rope_dim = g->head_dim / 4;
    return true;
}

// === 3. weights ==============================================================
//
// every weight is a view into the mmap'd artifact (or, on the gpu, into one device arena
// laid out the same way). fused parents are kept whole: the forward multiplies by the
// parent once and splits the output (e.g. query_key -> [q | k]).

struct Vec {  // a 1-d bf16 or fp32 tensor
    NumFormat format = FMT_BF16;
    int64_t n = 0;
    const uint8_t* p = nullptr;
    float at(int64_t i) const { return format == FMT_FP32 ? ((const float*)p)[i] : bf16_to_f32(((const uint16_t*)p)[i]); }
};

struct AttnWeights {  // gated full attention (model.md 2)
    Mat query_key;    // (Hq*hd + Hkv*hd, H): [q heads | k heads]
    Mat gate_value;   // (Hq*hd + Hkv*hd, H): [gate heads | v heads]
    Vec query_norm;   // (hd,)
    Vec key_norm;     // (hd,)
    Mat output;       // (H, Hq*hd)
};

struct GdnWeights {   // gated deltanet (model.md 3)
    Vec a_log;        // (Hv,) fp32
    Vec dt_bias;      // (Hv,) fp32
    Vec convolution;  // (conv_k, conv_dim) tap-major; the last tap multiplies the current token
    Mat a_proj;       // (Hv, H)
    Mat b_proj;       // (Hv, H)
    Mat query_key;    // (2*Hk*dk, H): [q heads | k heads]
    Mat value_z;      // (2*Hv*dv, H): [v heads | z heads]
    Vec norm;         // (dv,) plain weight (no 1+w)
    Mat output;       // (H, Hv*dv)
};

struct LayerWeights {
    bool full;
    Vec input_norm;   // (H,) zero-centred: x * (1 + w)
    AttnWeights attn; // when full
    GdnWeights gdn;   // when !full
    Vec post_norm;    // (H,)
    Mat gate_up;      // (2I, H): [gate | up]
    Mat down;         // (H, I)
};

struct MtpWeights {   // model.md 5: one full-attention layer fed by [norm(emb) | norm(hidden)]
    Mat input_projection;  // (H, 2H)
    Vec embedding_norm, hidden_norm;  // (H,)
    LayerWeights layer;    // full attention (query_key_gate_value split into the two parents)
    Vec final_norm;        // (H,)
};

struct VisionLayerWeights {
    Mat qkv; Vec qkv_bias;        // (3Dv, Dv)
    Mat output; Vec output_bias;  // (Dv, Dv)
    Mat fc1; Vec fc1_bias;        // (Iv, Dv)
    Mat fc2; Vec fc2_bias;        // (Dv, Iv)
    Vec norm1_w, norm1_b, norm2_w, norm2_b;  // (Dv,)
};

struct VisionWeights {
    Mat patch_embedding; Vec patch_bias;  // (Dv, 3*2*16*16)
    Mat position_embedding;               // (2304, Dv) bf16
    std::vector<VisionLayerWeights> layers;
    Mat merger_fc1; Vec merger_fc1_bias;  // (4Dv, 4Dv)
    Mat merger_fc2; Vec merger_fc2_bias;  // (O, 4Dv)
    Vec merger_norm_w, merger_norm_b;     // (Dv,)
};

struct Weights {
    Mat token_embedding;             // (vocab, H)
    std::vector<LayerWeights> layers;
    Vec final_norm;                  // (H,)
    Mat output_head;                 // (vocab, H); the embedding when tied
    Mat draft_head;                  // (draft_rows, H), optional
    const int32_t* draft_ids = nullptr;  // (draft_rows,) row -> token id
    MtpWeights mtp;                  // when geometry.has_mtp
    VisionWeights vision;            // when geometry.has_vision
};

// the binder: look up every object the geometry implies, check its shape and format, and
// make views. `base` rebases the views (nullptr: the mapping itself). the whole inventory is
// validated even for parts that will not be used, as NInfer does.
struct Binder {
    const Artifact* a;
    std::string* err;
    bool ok = true;
    const TensorObject* find(const std::string& name, std::vector<int64_t> shape) {
        if (!ok) return nullptr;
        const TensorObject* t = artifact_find(a, name);
        if (!t || t->resource) { *err = a->path + ": missing tensor '" + name + "'"; ok = false; return nullptr; }
        if (t->shape != shape) {
            std::string got, want;
            for (auto d : t->shape) got += (got.empty() ? "" : ",") + std::to_string(d);
            for (auto d : shape) want += (want.empty() ? "" : ",") + std::to_string(d);
            *err = a->path + ": tensor '" + name + "' has shape [" + got + "], expected [" + want + "]";
            ok = false; return nullptr;
        }
        return t;
    }
    Mat mat(const std::string& name, int64_t rows, int64_t cols) {
        const TensorObject* t = find(name, {rows, cols});
        if (!t) return Mat();
        if (t->format == FMT_I32) { *err = a->path + ": tensor '" + name + "' is I32, expected a weight format"; ok = false; return Mat(); }
        return mat_from(t);
    }
    Vec vec(const std::string& name, int64_t n, bool allow_fp32 = true) {
        const TensorObject* t = find(name, {n});
        if (!t) return Vec();
        if (!(t->format == FMT_BF16 || (allow_fp32 && t->format == FMT_FP32))) {
            *err = a->path + ": tensor '" + name + "' has format " + format_name(t->format) + ", expected BF16" + (allow_fp32 ? " or FP32" : "");
            ok = false; return Vec();
        }
        Vec v; v.format = t->format; v.n = n; v.p = t->data; return v;
    }
    Vec vec2(const std::string& name, int64_t r, int64_t c) {  // 2-d bf16 stored contiguously
        const TensorObject* t = find(name, {r, c});
        if (!t) return Vec();
        if (t->format != FMT_BF16) { *err = a->path + ": tensor '" + name + "' must be BF16"; ok = false; return Vec(); }
        Vec v; v.format = FMT_BF16; v.n = r * c; v.p = t->data; return v;
    }
};

static void bind_attention(Binder& b, const Geometry& g, const std::string& p, AttnWeights* w) {
    int64_t q = (int64_t)g.Hq * g.head_dim, kv = (int64_t)g.Hkv * g.head_dim;
    w->query_key = b.mat(p + "query_key", q + kv, g.H);
    w->gate_value = b.mat(p + "gate_value", q + kv, g.H);
    w->query_norm = b.vec(p + "query_norm", g.head_dim);
    w->key_norm = b.vec(p + "key_norm", g.head_dim);
    w->output = b.mat(p + "output", g.H, q);
}

static void bind_mlp(Binder& b, const Geometry& g, const std::string& p, LayerWeights* w) {
    w->post_norm = b.vec(p + "post_attention_norm", g.H);
    w->gate_up = b.mat(p + "mlp/gate_up", 2LL * g.I, g.H);
    w->down = b.mat(p + "mlp/down", g.H, g.I);
}

static bool bind_weights(const Artifact* a, const Geometry& g, Weights* w, std::string* err) {
    Binder b{a, err};
    *w = Weights();
    w->token_embedding = b.mat("text/token_embedding", g.vocab, g.H);
    w->layers.resize(g.L);
    for (int l = 0; l < g.L; l++) {
        std::string p = "text/layers/" + std::to_string(l) + "/";
        LayerWeights* lw = &w->layers[l];
        lw->full = g.full[l];
        lw->input_norm = b.vec(p + "input_norm", g.H);
        if (lw->full) {
            bind_attention(b, g, p + "attention/", &lw->attn);
        } else {
            GdnWeights* d = &lw->gdn;
            std::string q = p + "gdn/";
            d->a_log = b.vec(q + "a_log", g.Hv);
            d->dt_bias = b.vec(q + "dt_bias", g.Hv);
            d->convolution = b.vec2(q + "convolution", g.conv_k, g.conv_dim);
            d->a_proj = b.mat(q + "a_projection", g.Hv, g.H);
            d->b_proj = b.mat(q + "b_projection", g.Hv, g.H);
            d->query_key = b.mat(q + "query_key", 2LL * g.Hk * g.dk, g.H);
            d->value_z = b.mat(q + "value_z", 2LL * g.Hv * g.dv, g.H);
            d->norm = b.vec(q + "norm", g.dv);
            d->output = b.mat(q + "output", g.H, (int64_t)g.Hv * g.dv);
        }
        bind_mlp(b, g, p, lw);
    }
    w->final_norm = b.vec("text/final_norm", g.H);
    w->output_head = g.tied ? w->token_embedding : b.mat("text/output_head", g.vocab, g.H);
    if (g.draft_rows) {
        w->draft_head = b.mat("text/draft_head", g.draft_rows, g.H);
        const TensorObject* ids = b.find("text/draft_head_token_ids", {g.draft_rows});
        if (ids && ids->format != FMT_I32) { *err = a->path + ": tensor 'text/draft_head_token_ids' must be I32"; b.ok = false; }
        if (b.ok) {
            w->draft_ids = (const int32_t*)ids->data;
            for (int r = 0; r < g.draft_rows; r++)
                if (w->draft_ids[r] < 0 || w->draft_ids[r] >= g.vocab) {
                    *err = a->path + ": tensor 'text/draft_head_token_ids' row " + std::to_string(r) + " holds id " +
                           std::to_string(w->draft_ids[r]) + ", outside [0, " + std::to_string(g.vocab) + ")";
                    b.ok = false; break;
                }
        }
    }
    if (g.has_mtp) {
        MtpWeights* m = &w->mtp;
        m->input_projection = b.mat("mtp/input_projection", g.H, 2LL * g.H);
        m->embedding_norm = b.vec("mtp/embedding_norm", g.H);
        m->hidden_norm = b.vec("mtp/hidden_norm", g.H);
        m->layer.full = true;
        m->layer.input_norm = b.vec("mtp/layer/input_norm", g.H);
        // the mtp stores one [q | k | gate | v] parent; split it into the two parents the
        // main layers have, so one attention path serves both
        int64_t q = (int64_t)g.Hq * g.head_dim, kv = (int64_t)g.Hkv * g.head_dim;
        Mat qkgv = b.mat("mtp/layer/attention/query_key_gate_value", 2 * (q + kv), g.H);
        if (b.ok) {
            m->layer.attn.query_key = mat_rows(qkgv, 0, q + kv);
            m->layer.attn.gate_value = mat_rows(qkgv, q + kv, q + kv);
        }
        m->layer.attn.query_norm = b.vec("mtp/layer/attention/query_norm", g.head_dim);
        m->layer.attn.key_norm = b.vec("mtp/layer/attention/key_norm", g.head_dim);
        m->layer.attn.output = b.mat("mtp/layer/attention/output", g.H, q);
        bind_mlp(b, g, "mtp/layer/", &m->layer);
        m->final_norm = b.vec("mtp/final_norm", g.H);
    }
    if (g.has_vision) {
        VisionWeights* v = &w->vision;
        int64_t D = g.v_dim, Iv = g.v_inter;
        int64_t patch = 3LL * g.v_temporal * g.v_patch * g.v_patch;
        v->patch_embedding = b.mat("vision/patch_embedding", D, patch);
        v->patch_bias = b.vec("vision/patch_embedding_bias", D);
        v->position_embedding = b.mat("vision/position_embedding", g.v_pos, D);
        v->layers.resize(g.v_depth);
        for (int l = 0; l < g.v_depth; l++) {
            std::string p = "vision/layers/" + std::to_string(l) + "/";
            VisionLayerWeights* vl = &v->layers[l];
            vl->qkv = b.mat(p + "attention/qkv", 3 * D, D);
            vl->qkv_bias = b.vec(p + "attention/qkv_bias", 3 * D);
            vl->output = b.mat(p + "attention/output", D, D);
            vl->output_bias = b.vec(p + "attention/output_bias", D);
            vl->fc1 = b.mat(p + "mlp/fc1", Iv, D);
            vl->fc1_bias = b.vec(p + "mlp/fc1_bias", Iv);
            vl->fc2 = b.mat(p + "mlp/fc2", D, Iv);
            vl->fc2_bias = b.vec(p + "mlp/fc2_bias", D);
            vl->norm1_w = b.vec(p + "norm1/weight", D);
            vl->norm1_b = b.vec(p + "norm1/bias", D);
            vl->norm2_w = b.vec(p + "norm2/weight", D);
            vl->norm2_b = b.vec(p + "norm2/bias", D);
        }
        v->merger_fc1 = b.mat("vision/merger/fc1", 4 * D, 4 * D);
        v->merger_fc1_bias = b.vec("vision/merger/fc1_bias", 4 * D);
        v->merger_fc2 = b.mat("vision/merger/fc2", g.v_out, 4 * D);
        v->merger_fc2_bias = b.vec("vision/merger/fc2_bias", g.v_out);
        v->merger_norm_w = b.vec("vision/merger/norm/weight", D);
        v->merger_norm_b = b.vec("vision/merger/norm/bias", D);
    }
    if (!b.ok) return false;
    // every tensor in the file must be one the binder knows: an unconsumed object means
    // the file and this build disagree about the inventory
    size_t expected = 0;
    for (const TensorObject& t : a->objects) if (!t.resource) expected++;
    size_t bound = 2 + g.L * 4 + (g.tied ? 0 : 1) + (g.draft_rows ? 2 : 0) + (g.has_mtp ? 12 : 0);  // embedding, final norm; per layer two norms, gate_up, down
    for (int l = 0; l < g.L; l++) bound += g.full[l] ? 5 : 9;
    if (g.has_vision) bound += 3 + 12 * g.v_depth + 6;
    if (bound != expected) {
        // name the first object the binder does not know
        for (const TensorObject& t : a->objects) {
            if (t.resource) continue;
            const std::string& n = t.name;
            bool known = n.rfind("text/", 0) == 0 || n.rfind("mtp/", 0) == 0 || n.rfind("vision/", 0) == 0;
            if (!known) { *err = a->path + ": unknown object '" + n + "' (not part of the qwen3.5 dense inventory)"; return false; }
        }
        *err = a->path + ": the file holds " + std::to_string(expected) + " tensors but the inventory for this geometry has " +
               std::to_string(bound) + " (extra or stray objects)";
        return false;
    }
    return true;
}

// everything ninfer knows about one opened artifact
struct Model {
    Artifact art;
    Geometry geo;
    Weights w;
};

// a path that does not exist but names a file beside it in another case (the 4b card downloads
// qwen3_5_4B.ninfer and runs models/qwen3_5_4b.ninfer): " (did you mean 'models/qwen3_5_4B.ninfer'?)"
static std::string path_case_hint(const char* path) {
    struct stat st;
    if (stat(path, &st) == 0 || errno != ENOENT) return "";
    std::string p = path;
    size_t sl = p.rfind('/');
    std::string dir = sl == std::string::npos ? "." : sl == 0 ? "/" : p.substr(0, sl);
    std::string base = sl == std::string::npos ? p : p.substr(sl + 1);
    DIR* d = opendir(dir.c_str());
    if (!d) return "";
    std::string hint;
    while (struct dirent* e = readdir(d))
        if (!strcasecmp(e->d_name, base.c_str())) { hint = " (did you mean '" + (sl == std::string::npos ? "" : p.substr(0, sl + 1)) + e->d_name + "'?)"; break; }
    closedir(d);
    return hint;
}

static bool model_open(Model* m, const char* path, std::string* err) {
    if (!artifact_open(&m->art, path, err)) { *err += path_case_hint(path); return false; }
    if (!geometry_from_artifact(&m->art, &m->geo, err)) return false;
    if (!bind_weights(&m->art, m->geo, &m->w, err)) return false;
    return true;
}

static void model_close(Model* m) { artifact_close(&m->art); }


// === 4. reference path (cpu) ==================================================
//
// the readable statement of the model math (model.md 2-5), and the oracle every gpu kernel is
// tested against. float32 throughout: weights are decoded exactly from the mmap'd artifact a
// row at a time (bf16 -> fp32, or fp16 scale * integer code, both exact in fp32), activations
// and sums are fp32, the deltanet state is fp32. nothing is rounded to bf16 (outside the
// tests' bf16 mode, at the end of this header): what this matches is hugging face in float32
// with the artifact's weights (bf16 values or dequantized codes).
//
// one forward call runs a piece of T tokens of one sequence through the text model:
//
//   x = token_embedding[ids]                 (no scaling; rows may be given by the caller)
//   for each layer l:
//     x += mixer(rmsnorm(x; 1 + input_norm))   gated attention (4.4) or gated deltanet (4.5)
//     x += mlp(rmsnorm(x; 1 + post_norm))      swiglu (4.6)
//   h = rmsnorm(x; 1 + final_norm), logits = head(h)   (head = embedding when tied)
//
// the deltanet uses its chunked form (model.md 3.6) for pieces of more than one token and its
// recurrent form (3.5) for single tokens; the two are tested to agree. everything a sequence
// carries from one call to the next (kv cache rows, conv windows, recurrent states, position)
// lives in one block, SeqState, so it can be snapshot and restored with one memcpy. the
// scratch activations of a call live in RunState. both are allocated once; nothing is
// allocated per token.
//
// parallelism is plain openmp: over output rows in the products, over heads in attention and
// the deltanet. results do not depend on the thread count.
//
// images and videos (4.7, 4.8) go through the vision tower one item at a time, the same way
// (fp32, exact weights); its output rows replace the pad tokens' embeddings (forward_cpu's
// embed_override) and the prompt gets explicit 3-axis m-rope positions (pos3), then rope_delta.
// the tower reads its weights only when it runs: without media they are never touched.
//
// bf16 mode (RunState::bf16, off by default; tests only). the gpu path keeps activations in
// bf16 and so rounds at about a dozen points per layer; on chaotic models (the random
// synthetic ones) that alone moves the logits past any useful bound from the fp32 math. with
// the flag set, this path rounds to bf16 at exactly the points where the gpu forward
// (section 8, gpu_layer / gpu_model) rounds, and keeps fp32 where it does, so the gpu can be
// held to it tightly (test_gpu); the default fp32 path is unchanged bit for bit. the points:
//   embedding rows; every norm's output (input, post, final, q/k) as bf16(x r (1 + w));
//   every projection's output; residual adds as bf16(x + bf16(W h)); logits stay fp32
//   attention: rope on bf16 with bf16 cos/sin, bf16(bf16(x1 c) -+ bf16(x2 s)); the kv cache
//     holds those bf16 values; output bf16(bf16(o) * bf16(sigmoid(gate))). pieces of more
//     than BF16_DECODE_COLS tokens (the gpu's flash prefill) multiply V by bf16 softmax
//     weights, tile by tile with a running max; shorter pieces (split-k decode) keep them fp32
//   deltanet: conv output bf16(silu(sum)) (conv window: the raw bf16 inputs); l2-normed q, k
//     and the gate g fp32, beta = bf16(sigmoid(b)); state fp32; core output bf16; gated norm
//     bf16(bf16(w bf16(o r)) silu(z))
//   mlp: bf16(bf16(silu(gate)) * up)
// the sums themselves are fp32 in a different order than the gpu's, so a rounding can still
// land on the other side now and then. the mtp module is not emulated (the gpu has no mtp).

// ---- 4.1 products with stored weights --------------------------------------------------

enum { KBLOCK = 1024 };  // columns decoded at a time; a multiple of every group size (32, 64)
// below about this many multiply-adds a loop runs on one thread: waking the team costs more
// than it saves (and much more on a busy machine)
enum : int64_t { PARALLEL_MIN = 1 << 20 };
// the hot loops are compiled twice, for avx2 and for any x86-64, and the loader picks one
// (gcc function multiversioning): the build stays portable and the decode + dot of the
// weights runs 8 floats wide where it can. the sum order, hence fp32 rounding, may differ
// between the two versions; on one machine it is always the same.
#define HOT_LOOP __attribute__((target_clones("avx2", "default")))

// decode columns [k0, k0+n) of row r of m into out[0..n), exactly. k0 is a multiple of
// KBLOCK, so decoding always starts on a group boundary. inlined into its callers (a call
// per row would cost as much as decoding a short row).
__attribute__((always_inline)) static inline void row_decode(const Mat& m, int64_t r, int64_t k0, int64_t n, float* out) {
    if (m.format == FMT_BF16) {
        const uint16_t* w = (const uint16_t*)(m.base + r * m.base_row) + k0;
        for (int64_t j = 0; j < n; j++) out[j] = bf16_to_f32(w[j]);
        return;
    }
    if (m.format == FMT_FP32) { memcpy(out, (const float*)(m.base + r * m.base_row) + k0, n * 4); return; }
    CHECK(format_grouped(m.format), "row_decode: format %s is not a weight format", format_name(m.format));
    // grouped (format.md 7.2): per group 32 base bytes (two 4-bit lanes per byte, or one
    // signed byte per lane for w8), a high-bit stream for q5/q6, one fp16 scale.
    const int G = group_size(m.format), hb = high_bytes(m.format), bits = code_bits(m.format);
    const uint8_t* base = m.base + r * m.base_row;
    const uint8_t* high = m.high + r * m.high_row;
    const uint16_t* scales = (const uint16_t*)(m.scale + r * m.scale_row);
    for (int64_t g = k0 / G; g * G < k0 + n; g++) {
        const uint8_t* b = base + g * 32;
        const uint8_t* h = high + g * hb;
        uint8_t u[64];  // the b-bit two's-complement words of the group's lanes
        // (the inner loops have constant trip counts: they unroll into constant shifts, and
        // the compiler vectorizes them; a per-lane formula with variable shifts would not)
        if (m.format == FMT_W8) {
            memcpy(u, b, 32);
        } else if (m.format == FMT_Q4) {
            for (int j = 0; j < 32; j++) { u[2 * j] = b[j] & 15; u[2 * j + 1] = b[j] >> 4; }
        } else if (m.format == FMT_Q5) {  // lanes 8i..8i+7: base bytes 4i..4i+3, bit 4 from high byte i
            for (int i = 0; i < 8; i++)
                for (int k = 0; k < 8; k++)
                    u[8 * i + k] = ((b[4 * i + k / 2] >> (4 * (k & 1))) & 15) | (((h[i] >> k) & 1) << 4);
        } else {                          // q6, lanes 4i..4i+3: base bytes 2i, 2i+1, bits 4-5 from high byte i
            for (int i = 0; i < 16; i++)
                for (int k = 0; k < 4; k++)
                    u[4 * i + k] = ((b[2 * i + k / 2] >> (4 * (k & 1))) & 15) | (((h[i] >> (2 * k)) & 3) << 4);
        }
        const float s = f16_to_f32(scales[g]);
        const int sh = 32 - bits;  // sign-extend from b bits
        float* o = out + (g * G - k0);
        int64_t cnt = k0 + n - g * G < G ? k0 + n - g * G : G;
        for (int j = 0; j < cnt; j++) o[j] = s * (float)((int32_t)((uint32_t)u[j] << sh) >> sh);
    }
}

static inline float dot(const float* a, const float* b, int64_t n) {
    float s = 0.0f;
    #pragma omp simd reduction(+:s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// y[t, r] = W[r, :] . x[t, :] for t < T, r < W.rows. x rows have stride ldx (>= W.cols),
// y rows stride ldy (>= W.rows). each weight row is decoded once and used for all T tokens,
// so one product costs one pass over the weights whatever T is; and every (t, r) is summed in
// the same order whatever T is, so splitting a prefill does not change these results.
HOT_LOOP static void matmul(float* y, int64_t ldy, const float* x, int64_t ldx, const Mat& W, int T) {
    #pragma omp parallel for schedule(static) if (W.rows * W.cols * T >= PARALLEL_MIN)
    for (int64_t r = 0; r < W.rows; r++) {
        float w[KBLOCK];
        for (int64_t k0 = 0; k0 < W.cols; k0 += KBLOCK) {
            int64_t n = W.cols - k0 < KBLOCK ? W.cols - k0 : KBLOCK;
            row_decode(W, r, k0, n, w);
            for (int t = 0; t < T; t++) {
                float s = dot(w, x + t * ldx + k0, n);
                y[t * ldy + r] = k0 ? y[t * ldy + r] + s : s;
            }
        }
    }
}

// ---- 4.2 elementwise pieces and norms ----------------------------------------------------

static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float silu(float x) { return x * sigmoid(x); }
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }  // torch's threshold

// bf16 mode (see the section header): round to the nearest bf16, kept in fp32
static inline float bf16r(float x) { return bf16_to_f32(f32_to_bf16(x)); }
static void bf16_round(float* x, size_t n) { for (size_t i = 0; i < n; i++) x[i] = bf16r(x[i]); }

// zero-centred rmsnorm (model.md 4.1): out = x / sqrt(mean(x^2) + eps) * (1 + w). in place ok.
static void rmsnorm(float* out, const float* x, const Vec& w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * r) * (1.0f + w.at(i));
}

// the deltanet's q/k normalisation (model.md 3.4): x / sqrt(sum(x^2) + eps), eps on the sum
static void l2norm(float* x, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss + eps);
    for (int i = 0; i < n; i++) x[i] *= r;
}

// ---- 4.3 sequence state and scratch ----------------------------------------------------
//
// SeqState is everything a sequence carries between forward calls, in one float block:
//   per full-attention layer: key and value cache rows [capacity, Hkv, head_dim] (k after
//     norm and rope, v as projected; model.md 2.4)
//   per deltanet layer: gdn_slots slots of conv window [conv_dim, 3] (the last three raw
//     in_proj_qkv outputs, oldest first; 3.7) and recurrent state [Hv, dk, dv] (3.5); `slot`
//     is the live one (conv[l], rec[l] point at it). one slot without speculation; with mtp
//     K+1, one per verification column (model.md 5.3: column t writes its state to slot t, the
//     accepted count picks the slot the sequence continues from: no copy, no recomputation)
//   the mtp layer's own key/value cache (model.md 5.1), only when speculation is on
// a copy of the block plus the scalars is a complete snapshot (prefix reuse). kv rows are
// position-addressed: restoring an older snapshot and writing again simply overwrites the
// rows past its position (and so do the rows a rejected draft left).

struct SeqState {
    int capacity = 0;     // kv rows, = --max-context
    int pos = 0;          // tokens processed: the next kv row
    int rope_delta = 0;   // m-rope: a text token at kv row p rotates by position p + rope_delta (model.md 6.7)
    int mtp_pos = 0;      // rows in the mtp kv cache
    int gdn_slots = 1, slot = 0;             // deltanet state slots, the live one
    size_t conv_n = 0, rec_n = 0;            // floats per slot of one layer
    size_t n_floats = 0;
    float* block = nullptr;                  // the one allocation; the views below point into it
    float* key[MAX_LAYERS] = {};             // full layers: [capacity, Hkv, hd]
    float* value[MAX_LAYERS] = {};
    float* conv0[MAX_LAYERS] = {};           // gdn layers: [gdn_slots, conv_dim, 3]
    float* rec0[MAX_LAYERS] = {};            // gdn layers: [gdn_slots, Hv, dk, dv]
    float* conv[MAX_LAYERS] = {};            // the live slot's views
    float* rec[MAX_LAYERS] = {};
    float* mtp_key = nullptr, *mtp_value = nullptr;  // [capacity, Hkv, hd]
};

// make slot k the live one
static void seq_set_slot(SeqState* s, int k) {
    CHECK(k >= 0 && k < s->gdn_slots, "gdn slot %d of %d", k, s->gdn_slots);
    s->slot = k;
    for (int l = 0; l < MAX_LAYERS; l++)
        if (s->conv0[l]) { s->conv[l] = s->conv0[l] + k * s->conv_n; s->rec[l] = s->rec0[l] + k * s->rec_n; }
}

// mtp: the mtp layer's kv cache (no --spec: not allocated, as NInfer keeps nothing of the mtp
// part resident then)
static void seq_build(SeqState* s, const Geometry& g, int capacity, int gdn_slots = 1, bool mtp = true) {
    CHECK(capacity > 0 && gdn_slots >= 1, "capacity %d, %d gdn slots", capacity, gdn_slots);
    *s = SeqState();
    s->capacity = capacity;
    s->gdn_slots = gdn_slots;
    size_t kv = (size_t)capacity * g.Hkv * g.head_dim;
    s->conv_n = (size_t)g.conv_dim * 3; s->rec_n = (size_t)g.Hv * g.dk * g.dv;
    const bool with_mtp = mtp && g.has_mtp;
    s->n_floats = (size_t)g.n_full * 2 * kv + (size_t)g.n_gdn * gdn_slots * (s->conv_n + s->rec_n) + (with_mtp ? 2 * kv : 0);
    s->block = (float*)calloc(s->n_floats, sizeof(float));
    CHECK(s->block, "out of memory for the sequence state (%zu MiB)", s->n_floats * 4 >> 20);
    float* p = s->block;
    for (int l = 0; l < g.L; l++) {
        if (g.full[l]) { s->key[l] = p; p += kv; s->value[l] = p; p += kv; }
        else { s->conv0[l] = p; p += gdn_slots * s->conv_n; s->rec0[l] = p; p += gdn_slots * s->rec_n; }
    }
    if (with_mtp) { s->mtp_key = p; p += kv; s->mtp_value = p; p += kv; }
    seq_set_slot(s, 0);
}

static void seq_free(SeqState* s) { free(s->block); *s = SeqState(); }

// forget the sequence: position 0, zero conv and recurrent states (kv rows are overwritten)
static void seq_reset(SeqState* s) {
    memset(s->block, 0, s->n_floats * sizeof(float));
    s->pos = s->rope_delta = s->mtp_pos = 0;
    seq_set_slot(s, 0);
}

// dst := src. both were built for the same model, capacity and slots (dst keeps its own block).
static void seq_copy(SeqState* dst, const SeqState* src) {
    CHECK(dst->n_floats == src->n_floats && dst->capacity == src->capacity && dst->gdn_slots == src->gdn_slots,
          "seq_copy between different shapes");
    memcpy(dst->block, src->block, src->n_floats * sizeof(float));
    dst->pos = src->pos; dst->rope_delta = src->rope_delta; dst->mtp_pos = src->mtp_pos;
    seq_set_slot(dst, src->slot);
}
// ([[maybe_unused]]: callers so far are the tests; prefix reuse comes later)
[[maybe_unused]] static void seq_snapshot(const SeqState* s, SeqState* snap) { seq_copy(snap, s); }
[[maybe_unused]] static void seq_restore(SeqState* s, const SeqState* snap) { seq_copy(s, snap); }

// the activations of one forward call of up to T_max tokens, allocated once
enum { GDN_CHUNK = 64 };  // chunk length of the chunked delta rule (model.md 3.6)

struct RunState {
    int T_max = 0;          // most tokens per forward call (the prefill piece)
    int capacity = 0;       // kv rows (sizes the attention scores)
    float* x = nullptr;     // [T, H] the residual stream
    float* xb = nullptr;    // [T, H] normed input of a block; after the layers, the final hidden
    float* out = nullptr;   // [T, H] output of a block
    float* qk = nullptr;    // [T, (Hq+Hkv)*hd] query | key rows
    float* gv = nullptr;    // [T, (Hq+Hkv)*hd] gate | value rows
    float* att = nullptr;   // [T, Hq*hd] attention output per head, gated
    float* scores = nullptr;// [Hq, capacity]
    float* qkv = nullptr;   // [T, conv_dim] raw in_proj_qkv output (the conv input)
    float* conv = nullptr;  // [T, conv_dim] after conv + silu: q | k | v
    float* z = nullptr;     // [T, Hv*dv] output gate
    float* ga = nullptr;    // [T, Hv] in_proj_a, then the log-decay g
    float* gb = nullptr;    // [T, Hv] in_proj_b, then beta
    float* core = nullptr;  // [T, Hv*dv] delta rule output, then gated-normed
    float* chunk = nullptr; // [Hv, GDN_CHUNK*(GDN_CHUNK+2+dk+dv)] chunked delta rule scratch per head
    float* mlp = nullptr;   // [T, 2I] gate | up
    float* hb = nullptr;    // [T, I] silu(gate) * up
    float* mtp_in = nullptr;// [T, 2H] mtp: [norm(embedding) | norm(hidden)]
    float* rope_cos = nullptr, *rope_sin = nullptr;  // [T, rope_dim/2] per token
    float inv_freq[64] = {};  // rope_dim/2 frequencies (model.md 2.3)
    bool bf16 = false;        // round activations where the gpu path does (section header); set after run_build
};

// bf16 mode: the gpu runs pieces of more than this many tokens through its prefill kernels,
// whose flash attention takes the softmax weights of each tile of this many keys as bf16
// (test_gpu asserts both equal DEC_COLS and FA_BK)
enum { BF16_DECODE_COLS = 8, BF16_FLASH_KEYS = 64 };

static size_t gdn_chunk_scratch(const Geometry& g) { return (size_t)GDN_CHUNK * (GDN_CHUNK + 2 + g.dk + g.dv); }

static void run_build(RunState* r, const Geometry& g, int T_max, int capacity) {
    CHECK(T_max > 0 && capacity > 0, "T_max %d capacity %d", T_max, capacity);
    CHECK(g.rope_dim / 2 <= 64, "rope dim %d", g.rope_dim);
    *r = RunState();
    r->T_max = T_max; r->capacity = capacity;
    size_t T = T_max, qkd = (size_t)(g.Hq + g.Hkv) * g.head_dim;
    size_t sizes[] = {
        T * g.H, T * g.H, T * g.H, T * qkd, T * qkd, T * g.Hq * g.head_dim, (size_t)g.Hq * capacity,
        T * g.conv_dim, T * g.conv_dim, T * g.Hv * g.dv, T * g.Hv, T * g.Hv, T * g.Hv * g.dv,
        (size_t)g.Hv * gdn_chunk_scratch(g), T * 2 * g.I, T * g.I, T * 2 * g.H, T * g.rope_dim / 2, T * g.rope_dim / 2};
    float** views[] = {&r->x, &r->xb, &r->out, &r->qk, &r->gv, &r->att, &r->scores, &r->qkv, &r->conv, &r->z,
                       &r->ga, &r->gb, &r->core, &r->chunk, &r->mlp, &r->hb, &r->mtp_in, &r->rope_cos, &r->rope_sin};
    static_assert(sizeof sizes / sizeof sizes[0] == sizeof views / sizeof views[0], "one size per view");
    size_t n = 0;
    for (size_t s : sizes) n += s;
    float* p = (float*)calloc(n, sizeof(float));
    CHECK(p, "out of memory for the cpu activations (%zu MiB)", n * 4 >> 20);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) { *views[k] = p; p += sizes[k]; }
    // inv_freq_j = 1 / theta^(2j / rope_dim), in fp32 as hf computes it
    for (int j = 0; j < g.rope_dim / 2; j++) r->inv_freq[j] = 1.0f / powf(g.rope_theta, (float)(2 * j) / (float)g.rope_dim);
}

static void run_free(RunState* r) { free(r->x); *r = RunState(); }

// ---- 4.4 gated full attention (model.md 2) ---------------------------------------------

// cos/sin of every rotated frequency for T tokens. pos3 is [3, T] (axes t, h, w; model.md
// 6.7) or null for text, where all three axes are base + t. interleaved m-rope (2.3): with
// mrope_section [11, 11, 10], frequency j takes axis h when j % 3 == 1 and j < 33, axis w
// when j % 3 == 2 and j < 30, else axis t.
static void rope_tables(RunState* r, const Geometry& g, const int* pos3, int base, int T) {
    const int half = g.rope_dim / 2;
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < half; j++) {
            int axis = 0;
            if (j % 3 == 1 && j < 3 * g.mrope_section[1]) axis = 1;
            else if (j % 3 == 2 && j < 3 * g.mrope_section[2]) axis = 2;
            int p = pos3 ? pos3[axis * T + t] : base + t;
            float phi = (float)p * r->inv_freq[j];
            r->rope_cos[t * half + j] = cosf(phi);
            r->rope_sin[t * half + j] = sinf(phi);
        }
    }
}

// rotate the first rope_dim dims of one head, rotate_half (neox) style; the rest pass.
// bf16 mode: cos, sin and each product rounded, then the sum (hf in bf16; mrope_kernel)
static void rope_apply(float* x, const float* cos, const float* sin, int half, bool bf16) {
    for (int i = 0; i < half; i++) {
        float x0 = x[i], x1 = x[i + half];
        if (bf16) {
            const float c = bf16r(cos[i]), s = bf16r(sin[i]);
            x[i] = bf16r(bf16r(x0 * c) - bf16r(x1 * s));
            x[i + half] = bf16r(bf16r(x1 * c) + bf16r(x0 * s));
            continue;
        }
        x[i] = x0 * cos[i] - x1 * sin[i];
        x[i + half] = x1 * cos[i] + x0 * sin[i];
    }
}

// attention over T new tokens whose kv rows start at row0. reads r->xb, writes r->out.
static void attention_cpu(const Geometry& g, RunState* r, const AttnWeights& w, float* kcache, float* vcache, int row0, int T) {
    const int hd = g.head_dim, half = g.rope_dim / 2;
    const int qd = g.Hq * hd, kvd = g.Hkv * hd, ld = qd + kvd;
    // 1. projections: [q | k] and [gate | v] (the artifact already de-interleaved q and gate)
    matmul(r->qk, ld, r->xb, g.H, w.query_key, T);
    matmul(r->gv, ld, r->xb, g.H, w.gate_value, T);
    if (r->bf16) { bf16_round(r->qk, (size_t)T * ld); bf16_round(r->gv, (size_t)T * ld); }
    // 2. per-head q/k rmsnorm (1+w), then rope; k and v go to the cache
    #pragma omp parallel for schedule(static) if ((int64_t)T * ld * 8 >= PARALLEL_MIN)
    for (int t = 0; t < T; t++) {
        const float* c = r->rope_cos + t * half; const float* s = r->rope_sin + t * half;
        for (int h = 0; h < g.Hq; h++) {
            float* q = r->qk + (size_t)t * ld + h * hd;
            rmsnorm(q, q, w.query_norm, hd, g.eps);
            if (r->bf16) bf16_round(q, hd);
            rope_apply(q, c, s, half, r->bf16);
        }
        for (int h = 0; h < g.Hkv; h++) {
            float* k = r->qk + (size_t)t * ld + qd + h * hd;
            rmsnorm(k, k, w.key_norm, hd, g.eps);
            if (r->bf16) bf16_round(k, hd);
            rope_apply(k, c, s, half, r->bf16);
            memcpy(kcache + ((size_t)(row0 + t) * g.Hkv + h) * hd, k, hd * sizeof(float));
            memcpy(vcache + ((size_t)(row0 + t) * g.Hkv + h) * hd, r->gv + (size_t)t * ld + qd + h * hd, hd * sizeof(float));
        }
    }
    // 3. causal softmax attention, query head h reading kv head h / (Hq/Hkv); then the
    //    sigmoid output gate
    const float scale = 1.0f / sqrtf((float)hd);
    const bool flash = r->bf16 && T > BF16_DECODE_COLS;  // bf16 mode, a gpu prefill piece
    #pragma omp parallel for schedule(static) if ((int64_t)T * (row0 + T) * qd * 2 >= PARALLEL_MIN)
    for (int h = 0; h < g.Hq; h++) {
        const int kvh = h / (g.Hq / g.Hkv);
        float* sc = r->scores + (size_t)h * r->capacity;
        for (int t = 0; t < T; t++) {
            const float* q = r->qk + (size_t)t * ld + h * hd;
            const int n = row0 + t + 1;  // rows visible to this token
            float mx = -INFINITY;
            for (int j = 0; j < n; j++) {
                sc[j] = dot(q, kcache + ((size_t)j * g.Hkv + kvh) * hd, hd) * scale;
                mx = sc[j] > mx ? sc[j] : mx;
            }
            float* o = r->att + (size_t)t * qd + h * hd;
            for (int d = 0; d < hd; d++) o[d] = 0.0f;
            if (flash) {
                // flash_prefill's arithmetic: keys in tiles from row 0 with a running max m;
                // o = sum_tiles alpha-rescaled sum bf16(e^(s - m)) v, over the fp32 sum of the
                // unrounded weights
                float m = -INFINITY, l = 0.0f;
                for (int k0 = 0; k0 < n; k0 += BF16_FLASH_KEYS) {
                    const int k1 = n - k0 < BF16_FLASH_KEYS ? n : k0 + BF16_FLASH_KEYS;
                    float tmx = -INFINITY;
                    for (int j = k0; j < k1; j++) tmx = sc[j] > tmx ? sc[j] : tmx;
                    const float mn = tmx > m ? tmx : m, alpha = expf(m - mn);
                    m = mn;
                    float ls = 0.0f;
                    for (int d = 0; d < hd; d++) o[d] *= alpha;
                    for (int j = k0; j < k1; j++) {
                        const float p = expf(sc[j] - m), pb = bf16r(p);
                        ls += p;
                        const float* v = vcache + ((size_t)j * g.Hkv + kvh) * hd;
                        for (int d = 0; d < hd; d++) o[d] += pb * v[d];
                    }
                    l = l * alpha + ls;
                }
                const float inv = 1.0f / l;
                for (int d = 0; d < hd; d++) o[d] *= inv;
            } else {
                float sum = 0.0f;
                for (int j = 0; j < n; j++) { sc[j] = expf(sc[j] - mx); sum += sc[j]; }
                for (int j = 0; j < n; j++) {
                    const float p = sc[j] / sum;
                    const float* v = vcache + ((size_t)j * g.Hkv + kvh) * hd;
                    for (int d = 0; d < hd; d++) o[d] += p * v[d];
                }
            }
            const float* gate = r->gv + (size_t)t * ld + h * hd;
            if (r->bf16) for (int d = 0; d < hd; d++) o[d] = bf16r(bf16r(o[d]) * bf16r(sigmoid(gate[d])));
            else for (int d = 0; d < hd; d++) o[d] *= sigmoid(gate[d]);
        }
    }
    // 4. output projection
    matmul(r->out, g.H, r->att, qd, w.output, T);
}

// ---- 4.5 gated deltanet (model.md 3) -----------------------------------------------------

// causal depthwise conv, kernel 4, then silu (3.2), over T tokens of C channels. the window
// before the first token comes from state [C, 3] (oldest first), which then takes the last
// three raw inputs. w is tap-major [4, C]; tap 3 multiplies the current token.
static void gdn_conv(float* y, const float* u, float* state, const Vec& w, int T, int C) {
    #pragma omp parallel for schedule(static) if ((int64_t)T * C * 4 >= PARALLEL_MIN)
    for (int c = 0; c < C; c++) {
        float* st = state + (size_t)c * 3;
        auto in = [&](int s) { return s >= 0 ? u[(size_t)s * C + c] : st[3 + s]; };  // s >= -3
        for (int t = 0; t < T; t++) {
            float acc = 0.0f;
            for (int tau = 0; tau < 4; tau++) acc += w.at((int64_t)tau * C + c) * in(t - 3 + tau);
            y[(size_t)t * C + c] = silu(acc);
        }
        for (int i = 0; i < 3; i++) st[i] = in(T - 3 + i);  // reads column i+T >= i: not yet overwritten
    }
}

// gdn_conv for verification columns: the window before column 0 from state_in, and the window
// after column t written to slot t (slots of `stride` floats from slot0). y is what gdn_conv
// gives, bit for bit (the same sum per token).
static void gdn_conv_snap(float* y, const float* u, const float* state_in, float* slot0, size_t stride, const Vec& w, int T, int C) {
    #pragma omp parallel for schedule(static) if ((int64_t)T * C * 4 >= PARALLEL_MIN)
    for (int c = 0; c < C; c++) {
        const float* st = state_in + (size_t)c * 3;
        auto in = [&](int s) { return s >= 0 ? u[(size_t)s * C + c] : st[3 + s]; };  // s >= -3
        float win[3] = {in(-3), in(-2), in(-1)};  // state_in may be one of the slots written below
        auto in2 = [&](int s) { return s >= 0 ? u[(size_t)s * C + c] : win[3 + s]; };
        for (int t = 0; t < T; t++) {
            float acc = 0.0f;
            for (int tau = 0; tau < 4; tau++) acc += w.at((int64_t)tau * C + c) * in2(t - 3 + tau);
            y[(size_t)t * C + c] = silu(acc);
        }
        for (int t = 0; t < T; t++)
            for (int i = 0; i < 3; i++) slot0[t * stride + (size_t)c * 3 + i] = in2(t - 2 + i);
    }
}

// one token of the gated delta rule for one value head (3.5), state [dk, dv] from S_in to S
// (the same buffer for an update in place; a verification column writes its own slot):
//   S <- e^g S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q
static void gdn_recurrent_step(const float* S_in, float* S, const float* q, const float* k, const float* v, float g, float beta,
                               float* o, int dk, int dv) {
    float decay = expf(g);
    float m[128];
    CHECK(dv <= 128, "dv %d", dv);
    for (int j = 0; j < dv; j++) m[j] = 0.0f;
    for (int i = 0; i < dk; i++) {
        const float* Ii = S_in + (size_t)i * dv;
        float* Si = S + (size_t)i * dv;
        for (int j = 0; j < dv; j++) { Si[j] = Ii[j] * decay; m[j] += Si[j] * k[i]; }
    }
    for (int j = 0; j < dv; j++) m[j] = beta * (v[j] - m[j]);  // m becomes delta
    for (int j = 0; j < dv; j++) o[j] = 0.0f;
    for (int i = 0; i < dk; i++) {
        float* Si = S + (size_t)i * dv;
        for (int j = 0; j < dv; j++) { Si[j] += k[i] * m[j]; o[j] += Si[j] * q[i]; }
    }
}
static void gdn_recurrent_step(float* S, const float* q, const float* k, const float* v, float g, float beta, float* o, int dk, int dv) {
    gdn_recurrent_step(S, S, q, k, v, g, beta, o, dk, dv);
}

// the same recurrence over T tokens in chunks of 64 (3.6, the wy/ut form hf's torch path
// uses): equal to T recurrent steps up to fp32 rounding, with matrix products in place of
// the serial scan inside a chunk. token t's q, k, v are at q + t*ldq (etc.); g, beta at
// t*ldg; o at t*ldo. scratch holds gdn_chunk_scratch floats.
static void gdn_chunked(float* S, const float* q, const float* k, const float* v, int ldq, const float* g,
                        const float* beta, int ldg, float* o, int ldo, int T, int dk, int dv, float* scratch) {
    const int C = GDN_CHUNK;
    float* A = scratch;             // [C, C]: A, then T = (I + A)^-1 (strictly lower part)
    float* G = A + C * C;           // [C] cumulative log-decay within the chunk, Gamma
    float* E = G + C;               // [C] e^Gamma, then e^(Gamma_last - Gamma)
    float* W = E + C;               // [C, dk] decayed keys
    float* U = W + (size_t)C * dk;  // [C, dv] pseudo-values, then the corrected values
    for (int c0 = 0; c0 < T; c0 += C) {
        const int n = T - c0 < C ? T - c0 : C;
        auto K = [&](int r) { return k + (size_t)(c0 + r) * ldq; };
        auto Q = [&](int r) { return q + (size_t)(c0 + r) * ldq; };
        auto V = [&](int r) { return v + (size_t)(c0 + r) * ldq; };
        auto B = [&](int r) { return beta[(size_t)(c0 + r) * ldg]; };
        // 1. Gamma_r = sum_{s <= r} g_s
        float acc = 0.0f;
        for (int r = 0; r < n; r++) { acc += g[(size_t)(c0 + r) * ldg]; G[r] = acc; E[r] = expf(acc); }
        // 2-3. T = (I + A)^-1 with A[r][s] = beta_r (k_r . k_s) e^(G_r - G_s) for s < r, by
        //      forward substitution: T[r][s] = -A[r][s] - sum_{s<m<r} A[r][m] T[m][s]. row r is
        //      first filled with -A[r][:], then finished in place in increasing s (T[r][s]
        //      only reads -A[r][m] for m > s, not yet overwritten). T's unit diagonal is implicit.
        for (int r = 0; r < n; r++) {
            float* Ar = A + r * C;
            for (int s = 0; s < r; s++) Ar[s] = -(B(r) * dot(K(r), K(s), dk)) * expf(G[r] - G[s]);
            for (int s = 0; s < r; s++) {
                float t = Ar[s];
                for (int m = s + 1; m < r; m++) t += Ar[m] * A[m * C + s];
                Ar[s] = t;
            }
        }
        // 4. U = T diag(beta) V, W = T diag(beta e^Gamma) K
        for (int r = 0; r < n; r++) {
            float* Ur = U + (size_t)r * dv; float* Wr = W + (size_t)r * dk;
            for (int j = 0; j < dv; j++) Ur[j] = B(r) * V(r)[j];
            for (int i = 0; i < dk; i++) Wr[i] = B(r) * E[r] * K(r)[i];
            for (int s = 0; s < r; s++) {
                const float a = A[r * C + s] * B(s), b = A[r * C + s] * B(s) * E[s];
                for (int j = 0; j < dv; j++) Ur[j] += a * V(s)[j];
                for (int i = 0; i < dk; i++) Wr[i] += b * K(s)[i];
            }
        }
        // 5. corrected values V_new = U - W S_in (in U)
        for (int r = 0; r < n; r++) {
            float* Ur = U + (size_t)r * dv; const float* Wr = W + (size_t)r * dk;
            for (int i = 0; i < dk; i++) {
                const float* Si = S + (size_t)i * dv;
                for (int j = 0; j < dv; j++) Ur[j] -= Wr[i] * Si[j];
            }
        }
        // 6. O_r = e^Gamma_r q_r S_in + sum_{s <= r} (q_r . k_s) e^(Gamma_r - Gamma_s) V_new_s
        for (int r = 0; r < n; r++) {
            float* Or = o + (size_t)(c0 + r) * ldo;
            for (int j = 0; j < dv; j++) Or[j] = 0.0f;
            for (int i = 0; i < dk; i++) {
                const float qi = Q(r)[i] * E[r]; const float* Si = S + (size_t)i * dv;
                for (int j = 0; j < dv; j++) Or[j] += qi * Si[j];
            }
            for (int s = 0; s <= r; s++) {
                const float a = dot(Q(r), K(s), dk) * expf(G[r] - G[s]); const float* Us = U + (size_t)s * dv;
                for (int j = 0; j < dv; j++) Or[j] += a * Us[j];
            }
        }
        // 7. S_out = e^Gamma_last S_in + sum_s e^(Gamma_last - Gamma_s) k_s V_new_s^T
        const float dlast = E[n - 1];
        for (int s = 0; s < n; s++) E[s] = expf(G[n - 1] - G[s]);
        for (int i = 0; i < dk; i++) {
            float* Si = S + (size_t)i * dv;
            for (int j = 0; j < dv; j++) Si[j] *= dlast;
            for (int s = 0; s < n; s++) {
                const float a = E[s] * K(s)[i]; const float* Us = U + (size_t)s * dv;
                for (int j = 0; j < dv; j++) Si[j] += a * Us[j];
            }
        }
    }
}

// the state slots of one deltanet layer, for verification columns: column t writes slot t
struct GdnSnap {
    float* conv0; size_t conv_n;  // [slots][conv_dim, 3]
    float* rec0; size_t rec_n;    // [slots][Hv, dk, dv]
};

// a deltanet layer over T tokens (3.9). reads r->xb, writes r->out; conv_state [conv_dim, 3]
// and S [Hv, dk, dv] carry over between calls. snap (verification): the states are read from
// conv_state / S and the state after column t goes to slot t; the delta rule then runs its
// recurrent form column by column, so each column is bit for bit a one-token call.
static void gdn_cpu(const Geometry& g, RunState* r, const GdnWeights& w, float* conv_state, float* S, int T, const GdnSnap* snap = nullptr) {
    const int C = g.conv_dim, kd = g.Hk * g.dk, vd = g.Hv * g.dv;
    // 1. projections: u = [q | k | v] (the conv input), z, a, b
    matmul(r->qkv, C, r->xb, g.H, w.query_key, T);
    matmul(r->qkv + 2 * kd, C, r->xb, g.H, mat_rows(w.value_z, 0, vd), T);
    matmul(r->z, vd, r->xb, g.H, mat_rows(w.value_z, vd, vd), T);
    matmul(r->ga, g.Hv, r->xb, g.H, w.a_proj, T);
    matmul(r->gb, g.Hv, r->xb, g.H, w.b_proj, T);
    if (r->bf16) {
        bf16_round(r->qkv, (size_t)T * C); bf16_round(r->z, (size_t)T * vd);
        bf16_round(r->ga, (size_t)T * g.Hv); bf16_round(r->gb, (size_t)T * g.Hv);
    }
    // 2. causal conv + silu, carrying the conv window
    if (snap) gdn_conv_snap(r->conv, r->qkv, conv_state, snap->conv0, snap->conv_n, w.convolution, T, C);
    else gdn_conv(r->conv, r->qkv, conv_state, w.convolution, T, C);
    if (r->bf16) bf16_round(r->conv, (size_t)T * C);
    // 3-4. l2-normalise q and k per head, scale q; gates beta = sigmoid(b) and
    //      g = -exp(A_log) softplus(a + dt_bias)
    const float qscale = 1.0f / sqrtf((float)g.dk);
    for (int t = 0; t < T; t++) {
        float* row = r->conv + (size_t)t * C;
        for (int h = 0; h < 2 * g.Hk; h++) l2norm(row + h * g.dk, g.dk, 1e-6f);
        for (int i = 0; i < kd; i++) row[i] *= qscale;
        for (int h = 0; h < g.Hv; h++) {
            float* a = r->ga + (size_t)t * g.Hv + h; float* b = r->gb + (size_t)t * g.Hv + h;
            *a = -expf(w.a_log.at(h)) * softplus(*a + w.dt_bias.at(h));
            *b = r->bf16 ? bf16r(sigmoid(*b)) : sigmoid(*b);
        }
    }
    // 5. the delta rule per value head; value head h reads key head h / (Hv/Hk)
    #pragma omp parallel for schedule(static) if ((int64_t)T * g.Hv * g.dk * g.dv * 3 >= PARALLEL_MIN)
    for (int h = 0; h < g.Hv; h++) {
        const int kh = h / (g.Hv / g.Hk);
        const float* q = r->conv + kh * g.dk;
        const float* k = r->conv + kd + kh * g.dk;
        const float* v = r->conv + 2 * kd + h * g.dv;
        float* Sh = S + (size_t)h * g.dk * g.dv;
        float* o = r->core + h * g.dv;
        if (snap) {
            const size_t hs = (size_t)h * g.dk * g.dv;
            for (int t = 0; t < T; t++)
                gdn_recurrent_step(t ? snap->rec0 + (t - 1) * snap->rec_n + hs : Sh, snap->rec0 + t * snap->rec_n + hs,
                                   q + (size_t)t * C, k + (size_t)t * C, v + (size_t)t * C, r->ga[(size_t)t * g.Hv + h],
                                   r->gb[(size_t)t * g.Hv + h], o + (size_t)t * vd, g.dk, g.dv);
        } else if (T == 1) gdn_recurrent_step(Sh, q, k, v, r->ga[h], r->gb[h], o, g.dk, g.dv);
        else gdn_chunked(Sh, q, k, v, C, r->ga + h, r->gb + h, g.Hv, o, vd, T, g.dk, g.dv, r->chunk + h * gdn_chunk_scratch(g));
    }
    if (r->bf16) bf16_round(r->core, (size_t)T * vd);
    // 6. gated rmsnorm per head (plain w, 3.8): o / rms(o) * w * silu(z); then the output projection
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < g.Hv; h++) {
            float* o = r->core + (size_t)t * vd + h * g.dv;
            const float* z = r->z + (size_t)t * vd + h * g.dv;
            float ss = 0.0f;
            for (int j = 0; j < g.dv; j++) ss += o[j] * o[j];
            const float rs = 1.0f / sqrtf(ss / g.dv + g.eps);
            if (r->bf16) for (int j = 0; j < g.dv; j++) o[j] = bf16r(bf16r(w.norm.at(j) * bf16r(o[j] * rs)) * silu(z[j]));
            else for (int j = 0; j < g.dv; j++) o[j] = (w.norm.at(j) * (o[j] * rs)) * silu(z[j]);
        }
    }
    matmul(r->out, g.H, r->core, vd, w.output, T);
}

// ---- 4.6 mlp, layer, forward -------------------------------------------------------------

// swiglu (4.2): down(silu(gate x) * up x). reads r->xb, writes r->out
static void mlp_cpu(const Geometry& g, RunState* r, const LayerWeights& w, int T) {
    matmul(r->mlp, 2 * g.I, r->xb, g.H, w.gate_up, T);
    if (r->bf16) bf16_round(r->mlp, (size_t)T * 2 * g.I);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < g.I; i++) {
            const float gt = r->mlp[(size_t)t * 2 * g.I + i], up = r->mlp[(size_t)t * 2 * g.I + g.I + i];
            r->hb[(size_t)t * g.I + i] = r->bf16 ? bf16r(bf16r(silu(gt)) * up) : silu(gt) * up;
        }
    matmul(r->out, g.H, r->hb, g.I, w.down, T);
}

// x += y (n floats); bf16 mode: x = bf16(x + bf16(y)), hf's two roundings (model.md 4.3)
static void residual_add(const RunState* r, float* x, const float* y, size_t n) {
    if (r->bf16) for (size_t i = 0; i < n; i++) x[i] = bf16r(x[i] + bf16r(y[i]));
    else for (size_t i = 0; i < n; i++) x[i] += y[i];
}

// the norm of each of the T rows of r->x into r->xb (bf16 mode: rounded)
static void norm_rows(const Geometry& g, RunState* r, const Vec& w, int T) {
    for (int t = 0; t < T; t++) rmsnorm(r->xb + (size_t)t * g.H, r->x + (size_t)t * g.H, w, g.H, g.eps);
    if (r->bf16) bf16_round(r->xb, (size_t)T * g.H);
}

// one decoder layer (4.3) on r->x [T, H]. full layers use kcache/vcache from kv row row0 on;
// deltanet layers use conv_state and S.
static void layer_cpu(const Geometry& g, RunState* r, const LayerWeights& w, float* kcache, float* vcache,
                      float* conv_state, float* S, int row0, int T, const GdnSnap* snap = nullptr) {
    norm_rows(g, r, w.input_norm, T);
    if (w.full) attention_cpu(g, r, w.attn, kcache, vcache, row0, T);
    else gdn_cpu(g, r, w.gdn, conv_state, S, T, snap);
    residual_add(r, r->x, r->out, (size_t)T * g.H);
    norm_rows(g, r, w.post_norm, T);
    mlp_cpu(g, r, w, T);
    residual_add(r, r->x, r->out, (size_t)T * g.H);
}

// rows of x: the embedding of ids[t], or row t of embed_override where ids is null or
// ids[t] < 0 (how the vision tower's outputs replace placeholder tokens, model.md 6.6)
static void embed_cpu(const Model* m, float* x, const int* ids, const float* embed_override, int T) {
    const int H = m->geo.H;
    for (int t = 0; t < T; t++) {
        float* row = x + (size_t)t * H;
        if (embed_override && (!ids || ids[t] < 0)) { memcpy(row, embed_override + (size_t)t * H, H * sizeof(float)); continue; }
        CHECK(ids && ids[t] >= 0 && ids[t] < m->geo.vocab, "token id %d outside the embedding", ids ? ids[t] : -1);
        for (int64_t k0 = 0; k0 < H; k0 += KBLOCK)
            row_decode(m->w.token_embedding, ids[t], k0, H - k0 < KBLOCK ? H - k0 : KBLOCK, row + k0);
    }
}

// final norm of the T rows of r->x into r->xb (and hidden_out), then the head: logits of all
// T rows ([T, vocab]) or of the last one ([vocab])
static void head_cpu(const Model* m, RunState* r, const Vec& norm, int T, float* logits, bool all_logits, float* hidden_out) {
    const Geometry& g = m->geo;
    norm_rows(g, r, norm, T);
    if (hidden_out) memcpy(hidden_out, r->xb, (size_t)T * g.H * sizeof(float));
    if (!logits) return;
    if (all_logits) matmul(logits, g.vocab, r->xb, g.H, m->w.output_head, T);
    else matmul(logits, g.vocab, r->xb + (size_t)(T - 1) * g.H, g.H, m->w.output_head, 1);
}

// the text model on T tokens of a sequence, continuing from st (model.md 4.4; appendix b).
//   ids             [T] token ids (may be null, or < 0 per row, with embed_override)
//   embed_override  [T, H] or null: input rows that replace the embedding (vision)
//   pos3            [3, T] m-rope positions or null: text positions st->pos + t + rope_delta
//   logits          [T, vocab] when all_logits, else [vocab] for the last token; may be null
//   hidden_out      [T, H] final-normed hidden (what the head and the mtp read), or null
// T > 1 runs the chunked deltanet, T == 1 the recurrent one. st->pos advances by T.
// snap (mtp verification, T <= st->gdn_slots): the deltanet runs column by column from the
// live slot and leaves the state after column t in slot t (the caller picks the live slot
// after accepting), so every column's logits equal a one-token call's bit for bit.
static void forward_cpu(const Model* m, RunState* r, SeqState* st, const int* ids, const float* embed_override,
                        const int* pos3, int T, float* logits, bool all_logits, float* hidden_out, bool snap = false) {
    const Geometry& g = m->geo;
    CHECK(T >= 1 && T <= r->T_max, "forward of %d tokens (at most %d per call)", T, r->T_max);
    CHECK(r->capacity >= st->capacity, "run state for %d rows, sequence of %d", r->capacity, st->capacity);
    CHECK(st->pos + T <= st->capacity, "context overflow: %d + %d > %d", st->pos, T, st->capacity);
    embed_cpu(m, r->x, ids, embed_override, T);
    if (r->bf16) bf16_round(r->x, (size_t)T * g.H);
    rope_tables(r, g, pos3, st->pos + st->rope_delta, T);
    CHECK(!snap || T <= st->gdn_slots, "verification of %d columns with %d state slots", T, st->gdn_slots);
    for (int l = 0; l < g.L; l++) {
        GdnSnap sn{st->conv0[l], st->conv_n, st->rec0[l], st->rec_n};
        layer_cpu(g, r, m->w.layers[l], st->key[l], st->value[l], st->conv[l], st->rec[l], st->pos, T, snap && !g.full[l] ? &sn : nullptr);
    }
    head_cpu(m, r, m->w.final_norm, T, logits, all_logits, hidden_out);
    st->pos += T;
}

// the mtp module on T rows (model.md 5.1). row t pairs the token ids[t] (= x_{p+1}) with the
// main model's final-normed hidden hidden[t] (= h_p, or the mtp's own previous hidden when
// drafting further) at position p = st->mtp_pos + t (+ rope_delta; or pos3):
//   c = input_projection([rmsnorm(embed(x_{p+1})) | rmsnorm(h_p)])   (embedding first)
//   c = decoder layer (full attention with the mtp's own kv cache, mlp)
//   hidden_out = rmsnorm(c; 1 + mtp final_norm), logits = head(hidden_out) (draft for x_{p+2})
// st->mtp_pos advances by T.
static void mtp_forward_cpu(const Model* m, RunState* r, SeqState* st, const int* ids, const float* embed_override,
                            const float* hidden, const int* pos3, int T, float* logits, bool all_logits, float* hidden_out) {
    const Geometry& g = m->geo;
    const MtpWeights& w = m->w.mtp;
    CHECK(g.has_mtp && st->mtp_key, "the model has no mtp module, or the sequence no mtp kv cache");
    CHECK(T >= 1 && T <= r->T_max, "mtp forward of %d rows (at most %d per call)", T, r->T_max);
    CHECK(st->mtp_pos + T <= st->capacity, "mtp context overflow: %d + %d > %d", st->mtp_pos, T, st->capacity);
    embed_cpu(m, r->x, ids, embed_override, T);
    for (int t = 0; t < T; t++) {
        rmsnorm(r->mtp_in + (size_t)t * 2 * g.H, r->x + (size_t)t * g.H, w.embedding_norm, g.H, g.eps);
        rmsnorm(r->mtp_in + (size_t)t * 2 * g.H + g.H, hidden + (size_t)t * g.H, w.hidden_norm, g.H, g.eps);
    }
    matmul(r->x, g.H, r->mtp_in, 2 * g.H, w.input_projection, T);
    rope_tables(r, g, pos3, st->mtp_pos + st->rope_delta, T);
    layer_cpu(g, r, w.layer, st->mtp_key, st->mtp_value, nullptr, nullptr, st->mtp_pos, T);
    head_cpu(m, r, w.final_norm, T, logits, all_logits, hidden_out);
    st->mtp_pos += T;
}

// a whole prompt, in pieces of at most r->T_max tokens (--prefill-chunk): the same results as
// one piece up to fp32 rounding. logits as in forward_cpu (all rows, or the last row's).
[[maybe_unused]] static void prefill_cpu(const Model* m, RunState* r, SeqState* st, const int* ids, int n, float* logits, bool all_logits,
                        float* hidden_out) {
    for (int i = 0; i < n; i += r->T_max) {
        int T = n - i < r->T_max ? n - i : r->T_max;
        bool last = i + T == n;
        float* lg = all_logits ? (logits ? logits + (size_t)i * m->geo.vocab : nullptr) : (last ? logits : nullptr);
        forward_cpu(m, r, st, ids + i, nullptr, nullptr, T, lg, all_logits, hidden_out ? hidden_out + (size_t)i * m->geo.H : nullptr);
    }
}

// ---- 4.7 vision tower (model.md 6.3) -------------------------------------------------------
//
// one image or video (a media item) through the tower, in fp32 with the stored weights decoded
// exactly, as the text path does. N = t*h*w patches, Dv wide, nh heads of d = Dv/nh:
//   x = patch_embedding . pixel_row + bias        the conv3d over one 3 x 2 x 16 x 16 patch
//   x += bilinear(position_embedding; row, col)   the 48 x 48 learned grid resampled to h x w
//                                                 (align corners; 4 taps, weights as hf's fp32 ones)
//   per block: x += proj(attn(LN1(x))),  x += fc2(gelu_tanh(fc1(LN2(x))))
//     attention is non-causal within each temporal patch (h*w patches) and never across; q and
//     k are rotated over the whole head by the patch's (row, col): the first d/4 frequencies
//     by row, the next d/4 by col (axial 2-d rope, theta 1e4, rotate_half pairs i, i + d/2)
//   out = fc2(gelu(fc1([LN(x) of the 4 patches of a 2x2 block])))   exact (erf) gelu here
// patch rows arrive 2x2-block-major ((t, bh, bw, ih, iw), model.md 6.1), so a merge block is 4
// consecutive rows and the merger's concatenation is a reshape. hf runs every item of a request
// in one call with block-diagonal attention; all the other steps are per patch, so one item at a
// time gives the same rows (make_vision_goldens.py checks this on hf itself).

// one media item as preprocessing hands it over (vision.h): the patch rows and the grid
struct VisionInput {
    bool video = false;            // frames of a video (video pads) or an image (image pads)
    int t = 0, h = 0, w = 0;       // grid_thw: temporal patches, patch rows, patch columns
    const float* pixels = nullptr; // [t*h*w, 3 * v_temporal * v_patch^2] patch rows
    const double* seconds = nullptr; // video: [t] the time of each temporal patch (model.md 6.2)
};

static int vision_patch_len(const Geometry& g) { return 3 * g.v_temporal * g.v_patch * g.v_patch; }

// views of vision.h's preprocessed items (their rows and times stay where they are), checked
// against the tower's patch row; false with *err naming the item
static bool vision_inputs_of(const Geometry& g, const std::vector<VisionItem>& items, std::vector<VisionInput>* out, std::string* err) {
    out->clear();
    for (size_t k = 0; k < items.size(); k++) {
        const VisionItem& it = items[k];
        const bool rows_ok = it.row_len == 3 * g.v_temporal * g.v_patch * g.v_patch && it.pixels.size() == (size_t)it.rows() * it.row_len;
        if (!rows_ok || (it.video && it.timestamps.size() != (size_t)it.t)) {
            *err = "media item " + std::to_string(k) + ": " + std::to_string(it.pixels.size()) + " values in rows of " + std::to_string(it.row_len) +
                   " with " + std::to_string(it.timestamps.size()) + " times for grid (" + std::to_string(it.t) + ", " + std::to_string(it.h) +
                   ", " + std::to_string(it.w) + "); the tower takes rows of " + std::to_string(vision_patch_len(g));
            return false;
        }
        VisionInput in;
        in.video = it.video; in.t = it.t; in.h = it.h; in.w = it.w; in.pixels = it.pixels.data();
        in.seconds = it.video ? it.timestamps.data() : nullptr;
        out->push_back(in);
    }
    return true;
}
static int vision_tokens(const Geometry& g, const VisionInput& in) { return in.t * in.h * in.w / (g.v_merge * g.v_merge); }

// a grid the tower can take (bad input, not a bug: the grid comes from a request)
static bool vision_input_ok(const Geometry& g, const VisionInput& in, std::string* err) {
    const int m = g.v_merge;
    if (!g.has_vision) { *err = "the model has no vision tower"; return false; }
    if (in.t < 1 || in.h < m || in.w < m || in.h % m || in.w % m || (int64_t)in.t * in.h * in.w > (1 << 24)) {
        *err = "media grid (" + std::to_string(in.t) + ", " + std::to_string(in.h) + ", " + std::to_string(in.w) +
               ") is not t >= 1 by positive multiples of " + std::to_string(m) + " patches (at most 2^24 patches)";
        return false;
    }
    if (!in.pixels) { *err = "media item without pixel rows"; return false; }
    return true;
}

// LayerNorm with bias over n values (eps on the variance); in place ok
static void layernorm(float* out, const float* x, const Vec& w, const Vec& b, int n, float eps) {
    float mean = 0.0f, var = 0.0f;
    for (int i = 0; i < n; i++) mean += x[i];
    mean /= n;
    for (int i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    const float r = 1.0f / sqrtf(var / n + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] - mean) * r * w.at(i) + b.at(i);
}

static inline float gelu_tanh(float x) { return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))); }
static inline float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

// y[t, :] += b for T rows of stride ld
static void add_bias(float* y, int64_t ld, const Vec& b, int T) {
    for (int t = 0; t < T; t++) for (int64_t i = 0; i < b.n; i++) y[t * ld + i] += b.at(i);
}

// taps and weights of one axis of the position-embedding resampling: target index i of n onto
// `side` learned entries, align corners (hf's vision_utils: src = i (side-1) / max(n-1, 1))
static void pos_axis(int i, int n, int side, int tap[2], float wt[2]) {
    const float src = (float)i * (float)(side - 1) / (float)std::max(n - 1, 1);
    const float f = floorf(src);
    for (int o = 0; o < 2; o++) {
        tap[o] = std::min(std::max((int)f + o, 0), side - 1);
        wt[o] = std::max(0.0f, 1.0f - fabsf(src - f - (float)o));
    }
}

// (row, col) in the patch grid of patch p of a frame, rows being 2x2-block-major
static void patch_row_col(int p, int w, int m, int* row, int* col) {
    const int bw = w / m;
    *row = p / (m * m * bw) * m + (p / m) % m;
    *col = (p / (m * m)) % bw * m + p % m;
}

// the learned position rows of one h x w frame: pe [h*w, Dv] in patch-row order
static void vision_pos_rows(const Geometry& g, const Mat& table, int h, int w, float* pe) {
    const int D = g.v_dim, side = (int)lround(sqrt((double)g.v_pos));
    std::vector<float> e(D);
    for (int p = 0; p < h * w; p++) {
        int row, col, th[2], tw[2];
        float wh[2], ww[2];
        patch_row_col(p, w, g.v_merge, &row, &col);
        pos_axis(row, h, side, th, wh);
        pos_axis(col, w, side, tw, ww);
        float* r = pe + (size_t)p * D;
        for (int i = 0; i < D; i++) r[i] = 0.0f;
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++) {
                const float wt = wh[a] * ww[b];
                for (int64_t k0 = 0; k0 < D; k0 += KBLOCK)
                    row_decode(table, th[a] * side + tw[b], k0, std::min<int64_t>(KBLOCK, D - k0), e.data() + k0);
                for (int i = 0; i < D; i++) r[i] += e[i] * wt;
            }
    }
}

// the 2-d rotary frequencies f_i = 1e4^(-2i / (d/2)), i < d/4 (model.md 6.3; hf's axial rope)
static float vision_rope_freq(int d, int i) { return 1.0f / powf(10000.0f, (float)(2 * i) / (float)(d / 2)); }

// q and k of N patch rows [N, 3Dv] ([q heads | k heads | v heads]) rotated in place by each
// patch's (row, col) in its frame: angles [row f_0..f_{d/4-1} | col f_0..], pairs (i, i + d/2)
static void vision_rope(const Geometry& g, float* qkv, int N, int w, int frame) {
    const int D = g.v_dim, nh = g.v_heads, d = D / nh, q4 = d / 4;
    float cs[64], sn[64];
    for (int p = 0; p < N; p++) {
        int row, col;
        patch_row_col(p % frame, w, g.v_merge, &row, &col);
        for (int i = 0; i < q4; i++) {
            const float f = vision_rope_freq(d, i), a = (float)row * f, b = (float)col * f;
            cs[i] = cosf(a); sn[i] = sinf(a); cs[q4 + i] = cosf(b); sn[q4 + i] = sinf(b);
        }
        for (int h = 0; h < 2 * nh; h++) rope_apply(qkv + (size_t)p * 3 * D + h * d, cs, sn, d / 2, false);
    }
}

// non-causal attention within each frame (frame consecutive rows) of N rows of qkv [N, 3Dv]:
// att [N, Dv], heads side by side, scale d^-1/2, softmax in fp32
static void vision_attention(const Geometry& g, const float* qkv, int N, int frame, float* att) {
    const int D = g.v_dim, nh = g.v_heads, d = D / nh;
    const float scale = 1.0f / sqrtf((float)d);
    #pragma omp parallel if ((int64_t)N * frame * D >= PARALLEL_MIN)
    {
        std::vector<float> sc(frame);
        #pragma omp for schedule(static)
        for (int64_t qi = 0; qi < (int64_t)N * nh; qi++) {
            const int p = (int)(qi / nh), h = (int)(qi % nh), f0 = p / frame * frame;
            const float* q = qkv + (size_t)p * 3 * D + h * d;
            float mx = -INFINITY, sum = 0.0f;
            for (int j = 0; j < frame; j++) {
                sc[j] = dot(q, qkv + (size_t)(f0 + j) * 3 * D + D + h * d, d) * scale;
                mx = std::max(mx, sc[j]);
            }
            for (int j = 0; j < frame; j++) { sc[j] = expf(sc[j] - mx); sum += sc[j]; }
            float* o = att + (size_t)p * D + h * d;
            for (int i = 0; i < d; i++) o[i] = 0.0f;
            for (int j = 0; j < frame; j++) {
                const float pj = sc[j] / sum;
                const float* v = qkv + (size_t)(f0 + j) * 3 * D + 2 * D + h * d;
                for (int i = 0; i < d; i++) o[i] += pj * v[i];
            }
        }
    }
}

// LayerNorm of each of T rows of n floats (stride n); bf16: the outputs rounded (a product's input)
static void layernorm_rows(float* y, const float* x, const Vec& w, const Vec& b, int n, int T, float eps, bool bf16) {
    for (int t = 0; t < T; t++) layernorm(y + (size_t)t * n, x + (size_t)t * n, w, b, n, eps);
    if (bf16) bf16_round(y, (size_t)T * n);
}

// the tower on one item. out [tokens, v_out]; embed_out and hidden_out [N, Dv] (the input of
// the first block and the output of the last), each may be null. bf16 (tests: the gpu tower's
// oracle): round where the gpu tower does, i.e. every product's input (pixels, layernorm
// outputs, rotated q / k and v, attention output, gelu outputs) and the output rows; the
// residual stream, the position rows and every product's output stay fp32 there too.
// scratch is allocated here, once per item (activations of N rows; nothing per token).
static bool vision_forward_cpu(const Model* m, const VisionInput& in, float* out, std::string* err,
                               float* embed_out = nullptr, float* hidden_out = nullptr, bool bf16 = false) {
    const Geometry& g = m->geo;
    const VisionWeights& w = m->w.vision;
    if (!vision_input_ok(g, in, err)) return false;
    const int N = in.t * in.h * in.w, frame = in.h * in.w, D = g.v_dim, mg = g.v_merge, P = vision_patch_len(g);
    std::vector<float> x((size_t)N * D), xb((size_t)N * D), qkv((size_t)N * 3 * D), att((size_t)N * D),
        mlp((size_t)N * std::max(g.v_inter, D)), pix;
    const float* pixels = in.pixels;
    if (bf16) { pix.assign(in.pixels, in.pixels + (size_t)N * P); bf16_round(pix.data(), pix.size()); pixels = pix.data(); }
    // 1-2. patch embedding, plus the learned positions (the same rows for every frame)
    matmul(x.data(), D, pixels, P, w.patch_embedding, N);
    add_bias(x.data(), D, w.patch_bias, N);
    vision_pos_rows(g, w.position_embedding, in.h, in.w, xb.data());
    for (int p = 0; p < N; p++)
        for (int i = 0; i < D; i++) x[(size_t)p * D + i] += xb[(size_t)(p % frame) * D + i];
    if (embed_out) memcpy(embed_out, x.data(), (size_t)N * D * sizeof(float));
    // 3-4. the blocks, with the 2-d rotary on q and k
    for (const VisionLayerWeights& L : w.layers) {
        layernorm_rows(xb.data(), x.data(), L.norm1_w, L.norm1_b, D, N, g.eps, bf16);
        matmul(qkv.data(), 3 * D, xb.data(), D, L.qkv, N);
        add_bias(qkv.data(), 3 * D, L.qkv_bias, N);
        vision_rope(g, qkv.data(), N, in.w, frame);
        if (bf16) bf16_round(qkv.data(), qkv.size());
        vision_attention(g, qkv.data(), N, frame, att.data());
        if (bf16) bf16_round(att.data(), att.size());
        matmul(xb.data(), D, att.data(), D, L.output, N);
        add_bias(xb.data(), D, L.output_bias, N);
        for (size_t i = 0; i < (size_t)N * D; i++) x[i] += xb[i];
        layernorm_rows(xb.data(), x.data(), L.norm2_w, L.norm2_b, D, N, g.eps, bf16);
        matmul(mlp.data(), g.v_inter, xb.data(), D, L.fc1, N);
        add_bias(mlp.data(), g.v_inter, L.fc1_bias, N);
        for (size_t i = 0; i < (size_t)N * g.v_inter; i++) mlp[i] = bf16 ? bf16r(gelu_tanh(mlp[i])) : gelu_tanh(mlp[i]);
        matmul(xb.data(), D, mlp.data(), g.v_inter, L.fc2, N);
        add_bias(xb.data(), D, L.fc2_bias, N);
        for (size_t i = 0; i < (size_t)N * D; i++) x[i] += xb[i];
    }
    if (hidden_out) memcpy(hidden_out, x.data(), (size_t)N * D * sizeof(float));
    // 5. the merger: LN per patch, 4 consecutive rows as one [4 Dv] row, fc1, gelu, fc2
    const int M = N / (mg * mg), W4 = D * mg * mg;
    layernorm_rows(xb.data(), x.data(), w.merger_norm_w, w.merger_norm_b, D, N, g.eps, bf16);
    matmul(att.data(), W4, xb.data(), W4, w.merger_fc1, M);  // att: N*D = M*W4 floats
    add_bias(att.data(), W4, w.merger_fc1_bias, M);
    for (size_t i = 0; i < (size_t)M * W4; i++) att[i] = bf16 ? bf16r(gelu_erf(att[i])) : gelu_erf(att[i]);
    matmul(out, g.v_out, att.data(), W4, w.merger_fc2, M);
    add_bias(out, g.v_out, w.merger_fc2_bias, M);
    if (bf16) bf16_round(out, (size_t)M * g.v_out);
    return true;
}

// ---- 4.8 the multimodal prompt: vision rows and m-rope positions (model.md 6.5-6.7) ----------
//
// the rendered chat template holds one <|image_pad|> per image and one
// <|vision_start|><|video_pad|><|vision_end|> per video. before tokenizing, vision.h's
// vision_expand_prompt repeats each image pad once per merged token and replaces each video's
// triple by its timestamped frames (model.md 6.5; the decision about transformers 5.17, which
// keeps the outer start/end, is recorded there). the expansion is textual, as the processor's.
// the tokenized, expanded prompt then gets (mm_layout, mm_prepare_cpu):
//   rows    the tower's outputs replace the pad embeddings, images in order on image pads and
//           videos in order on video pads (hf's masked_scatter)
//   pos3    text: all three axes the running position cur, then cur += 1. a run of pads of one
//           image (or one temporal patch of a video) with merged grid gh x gw: token (t, i, j)
//           gets (cur + t, cur + i, cur + j) (t = 0 for a video frame), then cur += max(gh, gw)
//   delta   rope_delta = max(pos3) + 1 - L: decoding token p then rotates by p + delta
// hf groups tokens into runs by token type, so a pad run must hold exactly one image's tokens
// (or one frame's); anything else is refused as hf would fail on it.

struct VisionTokenIds { int image_pad = -1, video_pad = -1; };

struct MmPrompt {
    std::vector<int> tokens;   // [L] the prompt, pads included
    std::vector<int> ids;      // [L] tokens with -1 on vision rows (forward_cpu's override rows)
    std::vector<float> rows;   // [vision rows, H] the tower's outputs, in sequence order
    std::vector<int> pos3;     // [3, L] m-rope positions (axes t, h, w)
    int rope_delta = 0;
};

// check the pads of `tokens` against the media and compute the positions; no tower yet.
// media are in prompt order (images and videos each keep their own order).
static bool mm_layout(const Geometry& g, const VisionTokenIds& vt, const std::vector<int>& tokens,
                      const std::vector<VisionInput>& media, MmPrompt* p, std::string* err) {
    const int L = (int)tokens.size(), mg = g.v_merge;
    p->tokens = tokens; p->ids = tokens; p->pos3.assign((size_t)3 * L, 0); p->rows.clear();
    std::vector<int> images, videos;
    for (int k = 0; k < (int)media.size(); k++) {
        if (!vision_input_ok(g, media[k], err)) { *err = "media item " + std::to_string(k) + ": " + *err; return false; }
        (media[k].video ? videos : images).push_back(k);
    }
    size_t ni = 0, nv = 0;
    int vframe = 0;  // next temporal patch of videos[nv]
    int64_t cur = 0, top = -1;
    for (int i = 0; i < L;) {
        const bool img = tokens[i] == vt.image_pad, vid = tokens[i] == vt.video_pad;
        if (!img && !vid) {
            for (int a = 0; a < 3; a++) p->pos3[(size_t)a * L + i] = (int)cur;
            top = std::max(top, cur++);
            i++;
            continue;
        }
        int n = 0;
        while (i + n < L && tokens[i + n] == tokens[i]) n++;
        const VisionInput* in;
        if (img) {
            if (ni == images.size()) { *err = "the prompt has more image placeholders than the " + std::to_string(images.size()) + " images given"; return false; }
            in = &media[images[ni++]];
        } else {
            if (nv == videos.size()) { *err = "the prompt has more video frame placeholders than the videos given provide"; return false; }
            in = &media[videos[nv]];
        }
        const int gh = in->h / mg, gw = in->w / mg, want = img ? in->t * gh * gw : gh * gw;
        if (n != want) {
            *err = std::string(img ? "image" : "video frame") + " placeholder run at token " + std::to_string(i) + " has " +
                   std::to_string(n) + " pads, expected " + std::to_string(want) + " for its grid (" + std::to_string(in->t) +
                   ", " + std::to_string(in->h) + ", " + std::to_string(in->w) + ")";
            return false;
        }
        for (int k = 0; k < n; k++) {
            const int64_t pt = cur + k / (gh * gw), ph = cur + k / gw % gh, pw = cur + k % gw;
            p->pos3[i + k] = (int)pt; p->pos3[(size_t)L + i + k] = (int)ph; p->pos3[(size_t)2 * L + i + k] = (int)pw;
            top = std::max(top, std::max(pt, std::max(ph, pw)));
            p->ids[i + k] = -1;
        }
        cur += std::max(gh, gw);
        if (vid && ++vframe == in->t) { nv++; vframe = 0; }
        i += n;
    }
    if (ni != images.size() || nv != videos.size() || vframe) {
        *err = "the prompt has placeholders for " + std::to_string(ni) + " of " + std::to_string(images.size()) + " images and " +
               std::to_string(nv) + " of " + std::to_string(videos.size()) + " whole videos";
        return false;
    }
    if (top >= INT32_MAX / 2) { *err = "m-rope positions overflow"; return false; }
    p->rope_delta = (int)(top + 1 - L);
    return true;
}

// the whole multimodal prompt: layout, then the tower on each item (tower(in, out [tokens, H],
// err): the cpu's or the gpu's), its rows put in sequence order. the pixel rows are only read here.
template <typename Tower>
static bool mm_prepare(const Model* m, const VisionTokenIds& vt, const std::vector<int>& tokens, const std::vector<VisionInput>& media,
                       MmPrompt* p, std::string* err, Tower tower) {
    const Geometry& g = m->geo;
    if (!mm_layout(g, vt, tokens, media, p, err)) return false;
    // tower outputs per item, then scatter: the k-th image pad run takes the k-th image, video
    // pads take the videos' tokens in order
    std::vector<std::vector<float>> outs(media.size());
    for (size_t k = 0; k < media.size(); k++) {
        outs[k].resize((size_t)vision_tokens(g, media[k]) * g.H);
        if (!tower(media[k], outs[k].data(), err)) { *err = "media item " + std::to_string(k) + ": " + *err; return false; }
    }
    std::vector<size_t> next(media.size(), 0);  // rows of each item taken so far
    size_t ni = 0, nv = 0;
    std::vector<int> images, videos;
    for (int k = 0; k < (int)media.size(); k++) (media[k].video ? videos : images).push_back(k);
    for (size_t i = 0; i < p->tokens.size(); i++) {
        if (p->ids[i] >= 0) continue;
        const bool img = p->tokens[i] == vt.image_pad;
        // the current item of the kind: advance once its rows are used up
        size_t& n = img ? ni : nv;
        const std::vector<int>& list = img ? images : videos;
        if (next[list[n]] == (size_t)vision_tokens(g, media[list[n]])) n++;
        const int k = list[n];
        const float* row = outs[k].data() + next[k]++ * g.H;
        p->rows.insert(p->rows.end(), row, row + g.H);
    }
    return true;
}
// mm_prepare_cpu / mm_prepare_gpu / prefill_mm_cpu are the tests' entry points (maybe_unused in
// the product): the cli and the server go through text_media_tower, the same mm_prepare with the
// media cache in front of the tower, and engine_generate
[[maybe_unused]] static bool mm_prepare_cpu(const Model* m, const VisionTokenIds& vt, const std::vector<int>& tokens,
                           const std::vector<VisionInput>& media, MmPrompt* p, std::string* err) {
    return mm_prepare(m, vt, tokens, media, p, err,
                      [&](const VisionInput& in, float* out, std::string* e) { return vision_forward_cpu(m, in, out, e); });
}

// the inputs of a multimodal prompt's prefill, piece by piece in order from row `start` (0, or
// the end of a prefix already in the sequence): the ids (-1 on vision rows), the piece's
// override rows and its [3, T] positions. the buffers are allocated once per prompt.
struct MmPieces {
    const MmPrompt* p;
    int H;
    size_t vrow = 0;           // vision rows before the next piece
    std::vector<float> ovr;    // [T_max, H]
    std::vector<int> pos;      // [3, T_max]
    MmPieces(const MmPrompt* p_, int start, int T_max, int H_) : p(p_), H(H_), ovr((size_t)T_max * H_), pos((size_t)3 * T_max) {
        if (p) for (int i = 0; i < start; i++) vrow += p->ids[i] < 0;
    }
    // rows [i, i + T) of the prompt
    void piece(int i, int T, const int** ids, const float** rows, const int** pos3) {
        const int L = (int)p->tokens.size();
        CHECK(i >= 0 && i + T <= L && (size_t)T * H <= ovr.size(), "multimodal piece [%d, %d) of %d rows", i, i + T, L);
        for (int t = 0; t < T; t++) {
            if (p->ids[i + t] < 0) memcpy(ovr.data() + (size_t)t * H, p->rows.data() + vrow++ * H, H * sizeof(float));
            for (int a = 0; a < 3; a++) pos[(size_t)a * T + t] = p->pos3[(size_t)a * L + i + t];
        }
        *ids = p->ids.data() + i; *rows = ovr.data(); *pos3 = pos.data();
    }
};

// a generation prompt against its multimodal description: the sequence holds the first `pos`
// tokens of mm's prompt and `prompt` is the rest
static void mm_check_prompt(const MmPrompt* mm, int pos, const std::vector<int>& prompt) {
    CHECK(mm->tokens.size() == pos + prompt.size() && std::equal(prompt.begin(), prompt.end(), mm->tokens.begin() + pos),
          "the prompt (%zu tokens after %d) is not the rest of its multimodal prompt (%zu tokens)", prompt.size(), pos, mm->tokens.size());
}

// prefill a multimodal prompt from st->pos on (0, or the end of a reused prefix), in pieces of
// at most r->T_max tokens; then set the sequence's rope_delta for decoding. logits as in
// forward_cpu: all rows of the prefilled part ([L - st->pos, vocab]) or the last row.
[[maybe_unused]] static void prefill_mm_cpu(const Model* m, RunState* r, SeqState* st, const MmPrompt& p, float* logits, bool all_logits) {
    const int L = (int)p.tokens.size();
    CHECK(st->pos < L, "prefill from %d of a %d-token prompt", st->pos, L);
    const int start = st->pos;
    MmPieces pc(&p, start, r->T_max, m->geo.H);
    for (int i = start; i < L;) {
        const int T = std::min(r->T_max, L - i);
        const int* ids; const float* rows; const int* pos3;
        pc.piece(i, T, &ids, &rows, &pos3);
        const bool last = i + T == L;
        float* lg = all_logits ? (logits ? logits + (size_t)(i - start) * m->geo.vocab : nullptr) : (last ? logits : nullptr);
        forward_cpu(m, r, st, ids, rows, pos3, T, lg, all_logits, nullptr);
        i += T;
    }
    st->rope_delta = p.rope_delta;
}

// === 5. sampler ==============================================================
//
// NInfer's semantics (reference-engine.md 16.5), over the token domain only (the ids the
// tokenizer can produce; the embedding has padding rows past it, model.md 4.4):
//   temperature <= 0 (or --greedy): argmax of the raw logits, lowest id on ties
//   otherwise: adj = logit - presence*[count > 0] - frequency*count, counts over the tokens
//     generated so far; candidates sorted by adj descending (ties: lower id first); keep the
//     top_k (<= 0: all. NInfer caps its candidate set at 20; we do not); weights
//     w = exp(adj/T - max); min_p drops the tail below min_p * max weight; top_p keeps the
//     shortest prefix reaching top_p of the candidates' total weight; renormalise; draw.
// the random number is counter-based, a hash of (seed, position, purpose): no mutable rng
// state, so a run is reproducible from its seed and a snapshot/restore replays exactly.
// the gpu path runs the same semantics on the device (sample_gpu, section 7) with the same
// arithmetic helpers below, so for a top_k in 1..8192 it picks what sample() picks.

struct SamplerParams {
    float temperature = 0.6f;  // <= 0: greedy
    float top_p = 0.95f;
    int top_k = 20;            // <= 0: no limit
    float min_p = 0.0f;
    float presence = 1.0f;     // presence penalty
    float frequency = 0.0f;    // frequency penalty
    uint64_t seed = 0;
    std::vector<std::pair<int, float>> logit_bias;  // (id, added to its logit) before anything else, greedy too
};

// the purpose key: the first token after a prefill, later tokens; speculative decoding's
// acceptance test, its draw from the residual on a rejection, its bonus token (16.5)
enum { RNG_PREFILL = 0, RNG_DECODE = 1, RNG_SPEC_ACCEPT = 2, RNG_SPEC_CORRECTION = 3, RNG_SPEC_BONUS = 4 };

struct Sampler {
    SamplerParams p;
    int domain = 0;                         // sample ids [0, domain)
    std::vector<int> counts;                // [domain] times each id was generated
    std::vector<std::pair<float, int>> cand;  // scratch: (adjusted logit, id)
    std::vector<float> biased;              // scratch: logits + logit_bias
    std::vector<float> w;                   // scratch: the kept candidates' weights (sampler_dist)
    const uint32_t* mask = nullptr;         // the constraint's allowed ids for the next pick (bit id; null: all):
                                            // the others' logits become -inf before anything else, greedy too
};

// d draws as s would from here on (its parameters and counts; not s's scratch, nor its mask).
// d's vectors keep their capacity: a copy into the same Sampler allocates once
static void sampler_copy(Sampler* d, const Sampler& s) {
    d->p = s.p; d->domain = s.domain;
    d->counts.assign(s.counts.begin(), s.counts.end());
    d->mask = nullptr;
}

static void sampler_build(Sampler* s, const SamplerParams& p, int domain) {
    s->p = p; s->domain = domain;
    s->counts.assign(domain, 0);
    s->cand.reserve(domain);
}

// record a generated token (for the penalties)
static void sampler_accept(Sampler* s, int id) { if (id >= 0 && id < s->domain) s->counts[id]++; }

// the rng is shared with the gpu sampler (section 7), so both draw the same number
__host__ __device__ static inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
// uniform in [0, 1) from (seed, position, purpose)
__host__ __device__ static inline float rng_uniform(uint64_t seed, uint64_t position, int purpose) {
    uint64_t x = splitmix64(splitmix64(splitmix64(seed) ^ position) ^ (uint64_t)purpose);
    return (float)(x >> 40) * (1.0f / 16777216.0f);
}

// the sampler's arithmetic, one function for the cpu and the gpu so that both compute the same
// bits (the gpu sampler must pick what sample() picks from the same logits). two things would
// otherwise differ: nvcc contracts a*b+c into one fma on the device (one rounding instead of
// two), so the device side spells every operation with a round-to-nearest intrinsic; and
// cuda's expf is not glibc's (up to 2 ulp apart), so the weights use sampler_exp below, the
// same operations on both sides. the host side relies on the host compiler not contracting:
// true for the x86-64 baseline this builds for (no fma instructions); a build with -mfma
// takes the `volatile` form, which keeps every rounding.
#if defined(__CUDA_ARCH__)
#define SMP_FMUL(a, b) __fmul_rn(a, b)
#define SMP_FADD(a, b) __fadd_rn(a, b)
#define SMP_FSUB(a, b) __fsub_rn(a, b)
#define SMP_DMUL(a, b) __dmul_rn(a, b)
#define SMP_DADD(a, b) __dadd_rn(a, b)
#elif defined(__FMA__) || defined(__FP_FAST_FMA)
static inline float smp_round(float x) { volatile float v = x; return v; }
static inline double smp_round(double x) { volatile double v = x; return v; }
#define SMP_FMUL(a, b) smp_round((float)(a) * (float)(b))
#define SMP_FADD(a, b) smp_round((float)(a) + (float)(b))
#define SMP_FSUB(a, b) smp_round((float)(a) - (float)(b))
#define SMP_DMUL(a, b) smp_round((double)(a) * (double)(b))
#define SMP_DADD(a, b) smp_round((double)(a) + (double)(b))
#else
#define SMP_FMUL(a, b) ((float)(a) * (float)(b))
#define SMP_FADD(a, b) ((float)(a) + (float)(b))
#define SMP_FSUB(a, b) ((float)(a) - (float)(b))
#define SMP_DMUL(a, b) ((double)(a) * (double)(b))
#define SMP_DADD(a, b) ((double)(a) + (double)(b))
#endif

// exp(x) in fp32 for the sampler's weights: x = k ln2 + r with |r| <= ln2/2 (k rounded to
// nearest by the 1.5 * 2^52 trick), exp(r) by its taylor series to r^9 in double (relative
// error < 1e-11, so the fp32 result is the correctly rounded exp(x) except within 1e-11 of a
// rounding midpoint), times 2^k. plain ieee operations only: the same bits on cpu and gpu.
__host__ __device__ static inline float sampler_exp(float x) {
    if (x != x) return x;
    if (x < -104.0f) return 0.0f;       // below 2^-150: rounds to zero in fp32
    if (x > 89.0f) return INFINITY;     // above fp32's range
    const double shift = 6755399441055744.0;  // 1.5 * 2^52
    double k = SMP_DADD(SMP_DADD(SMP_DMUL((double)x, 1.4426950408889634), shift), -shift);
    double r = SMP_DADD((double)x, SMP_DMUL(-k, 0.6931471805599453));  // |k| <= 150: error ~1e-14
    double p = 1.0 / 362880;  // 1/9!
    const double c[9] = {1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0};
    for (int i = 0; i < 9; i++) p = SMP_DADD(SMP_DMUL(p, r), c[i]);
    union { uint64_t u; double d; } two_k;
    two_k.u = (uint64_t)((int64_t)k + 1023) << 52;
    double y = SMP_DMUL(p, two_k.d);  // exact: a power of two within double's range
#if defined(__CUDA_ARCH__)
    return __double2float_rn(y);
#else
    return (float)y;
#endif
}
// a penalised logit: adj = logit - (presence + frequency * count) for a generated id
__host__ __device__ static inline float sampler_penalise(float logit, float presence, float frequency, int count) {
    return count ? SMP_FSUB(logit, SMP_FADD(presence, SMP_FMUL(frequency, (float)count))) : logit;
}
// a candidate's weight relative to the best: exp(adj / T - top), top = best adj / T
__host__ __device__ static inline float sampler_weight(float adj, float inv_t, float top) {
    return sampler_exp(SMP_FSUB(SMP_FMUL(adj, inv_t), top));
}

static int argmax(const float* x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;  // strict: the lowest id wins ties
    return best;
}

// the distribution sample() draws from: the kept candidates s->cand[0..keep) with weights
// s->w[0..keep) (relative to the best) and their total `mass`, the draw walking them in that
// order. returns keep; 0 for greedy (temperature <= 0), where *greedy_id is the argmax.
static size_t sampler_dist(Sampler* s, const float* logits, float* mass_out, int* greedy_id) {
    const SamplerParams& p = s->p;
    if (!p.logit_bias.empty() || s->mask) {
        s->biased.assign(logits, logits + s->domain);
        if (s->mask)
            for (int i = 0; i < s->domain; i++) if (!((s->mask[i >> 5] >> (i & 31)) & 1)) s->biased[i] = -INFINITY;
        for (const auto& b : p.logit_bias) if (b.first >= 0 && b.first < s->domain) s->biased[b.first] = SMP_FADD(s->biased[b.first], b.second);
        logits = s->biased.data();
    }
    if (p.temperature <= 0.0f) { *greedy_id = argmax(logits, s->domain); return 0; }
    auto& c = s->cand;
    auto before = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    // the candidates c[0..n) are sorted only as far as needed: c[0..sorted) is the sorted head
    c.clear();
    size_t n, sorted = 0;
    if (p.top_k > 0 && p.top_k < s->domain) {
        // the best top_k in one pass (the set and order sorting them all gives): a heap of them
        // with the worst on top, which a later id replaces only when its value is greater (the
        // ids come in ascending order, so on a tie the earlier id stays before it). 3x faster
        // than collecting every candidate first at the 248k vocabulary (test/bench-notes.md)
        const int k = p.top_k;
        for (int i = 0; i < k; i++) c.emplace_back(sampler_penalise(logits[i], p.presence, p.frequency, s->counts[i]), i);
        std::make_heap(c.begin(), c.end(), before);
        for (int i = k; i < s->domain; i++) {
            const float v = sampler_penalise(logits[i], p.presence, p.frequency, s->counts[i]);
            if (!(v > c.front().first)) continue;
            std::pop_heap(c.begin(), c.end(), before);
            c.back() = std::make_pair(v, i);
            std::push_heap(c.begin(), c.end(), before);
        }
        std::sort_heap(c.begin(), c.end(), before);
        n = sorted = (size_t)k;
    } else {
        for (int i = 0; i < s->domain; i++) c.emplace_back(sampler_penalise(logits[i], p.presence, p.frequency, s->counts[i]), i);
        n = c.size();
    }
    auto sort_upto = [&](size_t k) {
        k = std::min(k, n);
        if (k > sorted) { std::partial_sort(c.begin() + sorted, c.begin() + k, c.begin() + n, before); sorted = k; }
    };
    sort_upto(1);
    // weights relative to the best candidate: w = exp(adj/T - max)
    const float inv_t = 1.0f / p.temperature, top = SMP_FMUL(c[0].first, inv_t);
    auto weight = [&](size_t i) { return sampler_weight(c[i].first, inv_t, top); };
    float total = 0.0f;
    size_t above_min_p = 0;  // the candidates with w >= min_p (the best has w = 1): a sorted prefix
    for (size_t i = 0; i < n; i++) { float w = weight(i); total = SMP_FADD(total, w); above_min_p += w >= p.min_p; }
    size_t keep = p.min_p > 0.0f ? std::max<size_t>(above_min_p, 1) : n;
    if (p.top_p < 1.0f) {  // the shortest sorted prefix reaching top_p of the total
        float cum = 0.0f;
        size_t k = 0;
        const float thr = SMP_FMUL(p.top_p, total);
        for (size_t chunk = 64; k < n && (k == 0 || cum < thr); chunk *= 4) {
            sort_upto(k + chunk);
            while (k < sorted && (k == 0 || cum < thr)) cum = SMP_FADD(cum, weight(k++));
        }
        keep = std::min(keep, k);
    }
    if (keep < n) sort_upto(keep);  // the kept set is the best `keep` (the draw walks them in array order)
    s->w.resize(keep);
    float mass = 0.0f;
    for (size_t i = 0; i < keep; i++) { s->w[i] = weight(i); mass = SMP_FADD(mass, s->w[i]); }
    *mass_out = mass;
    return keep;
}

// the draw: u in [0, mass) walks the kept candidates, skipping id `skip` (-1: none)
static int sampler_draw(const Sampler* s, size_t keep, float mass, uint64_t position, int purpose, int skip) {
    float u = SMP_FMUL(rng_uniform(s->p.seed, position, purpose), mass);
    int last = -1;
    for (size_t i = 0; i < keep; i++) {
        if (s->cand[i].second == skip) continue;
        if (s->w[i] > 0.0f || last < 0) last = s->cand[i].second;
        u = SMP_FSUB(u, s->w[i]);
        if (u < 0.0f) return s->cand[i].second;
    }
    return last;  // u landed on the rounding edge: the last candidate of nonzero weight (never a masked id)
}

// pick the next token from logits [>= domain] for sequence position `position`
static int sample(Sampler* s, const float* logits, uint64_t position, int purpose) {
    float mass = 0.0f;
    int greedy = -1;
    const size_t keep = sampler_dist(s, logits, &mass, &greedy);
    if (!keep) return greedy;
    return sampler_draw(s, keep, mass, position, purpose, -1);
}

// speculative sampling of one verification column (reference-engine.md 16.4) with a one-hot
// draft d: accept d with probability p(d) (the target's probability under sample()'s
// distribution), else draw from the residual p - onehot(d), i.e. p without d renormalised.
// the output is then distributed exactly as sample()'s (p(d) + (1 - p(d)) * 0 for d, and
// (1 - p(d)) p(x) / (1 - p(d)) for x != d). greedy: accepted iff d is the argmax, else the
// argmax. returns the token; *accepted says whether it is the draft.
static int sample_spec(Sampler* s, const float* logits, int d, uint64_t position, bool* accepted) {
    float mass = 0.0f;
    int greedy = -1;
    const size_t keep = sampler_dist(s, logits, &mass, &greedy);
    if (!keep) { *accepted = greedy == d; return greedy; }
    float wd = 0.0f, rest = 0.0f;  // the draft's weight, and the others' in draw order
    for (size_t i = 0; i < keep; i++) {
        if (s->cand[i].second == d) wd = s->w[i];
        else rest = SMP_FADD(rest, s->w[i]);
    }
    // u < wd / mass, without the division
    *accepted = wd > 0.0f && (rest == 0.0f || SMP_FMUL(rng_uniform(s->p.seed, position, RNG_SPEC_ACCEPT), mass) < wd);
    if (*accepted) return d;
    return sampler_draw(s, keep, rest, position, RNG_SPEC_CORRECTION, d);
}

// === 6. generation (cpu) =====================================================
//
// what the cli runs on the reference path: the token domain and stop ids from the artifact's
// frontend resources, a generation loop (whose tap gives --logits-out and the server's
// logprobs), and --perplexity.

// what generation needs from the artifact's frontend resources (never hard-coded ids):
//   domain  the ids the tokenizer can produce: 1 + the largest id of tokenizer.json (model.vocab
//           and added_tokens), at most the embedding rows; all rows when there is no tokenizer.
//           for qwen3.5 this is 248077 of 248320 rows.
//   stops   the default stop ids: generation_config.json eos_token_id (an int or a list), and
//           tokenizer_config.json's eos_token looked up in tokenizer.json
//   vision  the ids of <|image_pad|> and <|video_pad|> in tokenizer.json (-1 when absent)
struct FrontendIds {
    int domain = 0;
    std::vector<int> stops;
    VisionTokenIds vision;
};

static bool frontend_ids(const Model* m, FrontendIds* f, std::string* err) {
    *f = FrontendIds();
    f->domain = m->geo.vocab;
    auto parse = [&](const char* name, Json* j) {  // false on bad json; an absent resource is {}
        std::string text = artifact_resource(&m->art, name), jerr;
        if (text.empty()) { *j = Json::object(); return true; }
        if (json_parse(text, j, &jerr) && j->is_object()) return true;
        *err = m->art.path + ": " + name + ": " + (jerr.empty() ? "not a json object" : jerr);
        return false;
    };
    Json tok, tok_config, gen;
    if (!parse("frontend/tokenizer.json", &tok) || !parse("frontend/tokenizer_config.json", &tok_config) ||
        !parse("frontend/generation_config.json", &gen)) return false;
    // the domain, and an id lookup by token text
    const Json* model = tok.get("model");
    const Json* vocab = model ? model->get("vocab") : nullptr;
    const Json* added = tok.get("added_tokens");
    int64_t top = -1;
    if (vocab && vocab->is_object())
        for (auto& kv : vocab->obj) if (kv.second.is_int) top = std::max(top, kv.second.i);
    if (added && added->is_array())
        for (const Json& t : added->arr) if (t.get("id") && t.get("id")->is_int) top = std::max(top, t.get("id")->i);
    if (top >= 0) f->domain = (int)std::min<int64_t>(top + 1, m->geo.vocab);
    else if (tok.size()) { *err = m->art.path + ": frontend/tokenizer.json has no model.vocab or added_tokens ids"; return false; }
    auto id_of = [&](const std::string& text) -> int64_t {
        if (added && added->is_array())
            for (const Json& t : added->arr)
                if (t.get("content") && t.get("content")->str == text && t.get("id") && t.get("id")->is_int) return t.get("id")->i;
        const Json* v = vocab ? vocab->get(text.c_str()) : nullptr;
        return v && v->is_int ? v->i : -1;
    };
    f->vision.image_pad = (int)id_of("<|image_pad|>");
    f->vision.video_pad = (int)id_of("<|video_pad|>");
    // generation_config eos_token_id
    if (const Json* eos = gen.get("eos_token_id"); eos && !eos->is_null()) {
        std::vector<const Json*> list;
        if (eos->is_array()) for (const Json& e : eos->arr) list.push_back(&e);
        else list.push_back(eos);
        for (const Json* e : list) {
            if (!e->is_int) { *err = m->art.path + ": frontend/generation_config.json: eos_token_id must be an integer or a list of integers"; return false; }
            f->stops.push_back((int)e->i);
        }
    }
    // tokenizer_config eos_token: a string, or {"content": ...}
    if (const Json* eos = tok_config.get("eos_token"); eos && !eos->is_null()) {
        const Json* text = eos->is_object() ? eos->get("content") : eos;
        int64_t id = text && text->is_string() ? id_of(text->str) : -1;
        if (id >= 0 && std::find(f->stops.begin(), f->stops.end(), (int)id) == f->stops.end()) f->stops.push_back((int)id);
    }
    return true;
}

// token ids separated by commas and/or whitespace; false if anything else is there
static bool parse_ids(const char* s, std::vector<int>* ids) {
    ids->clear();
    while (*s) {
        if (*s == ',' || isspace((unsigned char)*s)) { s++; continue; }
        if (*s < '0' || *s > '9') return false;
        long long v = 0;
        while (*s >= '0' && *s <= '9') { v = v * 10 + (*s++ - '0'); if (v > INT32_MAX) return false; }
        if (*s && *s != ',' && !isspace((unsigned char)*s)) return false;
        ids->push_back((int)v);
    }
    return true;
}

// tokens per forward call when every row's logits are kept: the prefill piece, but at most
// ~256 MiB of logits (a 1024-token piece of a 248320-row vocabulary would be 1 GiB)
static int logits_piece(const RunState* r, int vocab) {
    return (int)std::max<int64_t>(1, std::min<int64_t>(r->T_max, (256ll << 20) / ((int64_t)vocab * 4)));
}

// mtp speculative decoding (generate_spec_cpu below; the server's usage.speculative)
enum { SPEC_MAX_K = 5 };             // --draft-tokens for mtp: 1..5 (NInfer's range)
struct SpecOpts {
    int K = 0;                       // --draft-tokens; 0: no speculation
    bool lm_head_draft = false;      // drafts scored by the artifact's proposal head (its id remap)
};
struct SpecStats {
    int K = 0;                       // the draft window; 0: no speculation ran
    long rounds = 0, drafted = 0, accepted = 0;
    long fallback_steps = 0;         // one-token steps: near the context end (no room for a round), at a gpu bucket boundary, or a multimodal prompt
    long per_position[SPEC_MAX_K] = {};  // rounds whose draft k was accepted
};

struct GenStats {
    int prompt = 0, generated = 0;   // generated counts emitted ids (a stop id is not emitted)
    double prefill_s = 0, decode_s = 0;
    bool stopped = false; int stop_id = -1;  // ended on a stop id
    bool cancelled = false;          // the emitter asked to stop (stop string, client gone)
    bool complete = false;           // a constraint's structure was completed: generation ended there
    SpecStats spec;
};

// constrained decoding (grammar.h): while open, each pick is masked to the ids the matcher
// allows (the mask applies before the sampler's other stages, on the cpu and the gpu alike) and
// each generated id advances it; when the structure is complete generation ends (GenStats.
// complete), without sampling a stop id. with thinking on it opens after `open_id` (</think>),
// so the reasoning is free and the answer is constrained.
struct GenConstraint {
    GrammarMatcher* m = nullptr;     // null: no constraint
    int open_id = -1;                // opens after this id; -1: open from the first token
    bool open = false;               // set by constraint_start from open_id
};
static void constraint_start(GenConstraint* c) { if (c) c->open = c->m && c->open_id < 0; }
// the mask of the next pick, null when unconstrained (or not open yet)
static const uint32_t* constraint_mask(GenConstraint* c) { return c && c->open ? matcher_mask(c->m) : nullptr; }
// a generated (not a stop) id; true when the structure is complete
static bool constraint_take(GenConstraint* c, int id) {
    if (!c || !c->m) return false;
    if (!c->open) { c->open = id == c->open_id; return false; }
    CHECK(matcher_accept(c->m, id), "constrained pick %d is outside the grammar", id);  // the mask allowed it
    return matcher_done(c->m);
}

// a cancel poll for the prefill: called before each prefill piece, true ends generation
// there (the server's client left). emit's false return covers the decode steps.
struct GenCancel {
    bool (*fn)(void*) = nullptr;
    void* ctx = nullptr;
    bool operator()() const { return fn && fn(ctx); }
};

// emitters may return void (always go on) or bool (false: stop after this id)
template <typename Emit>
static bool emit_more(Emit& emit, int id) {
    if constexpr (std::is_void_v<decltype(emit(id))>) { emit(id); return true; }
    else return emit(id);
}

// a sampled token, in every generation loop (generate_cpu, generate_gpu, generate_lane and the
// mtp rounds): a stop id ends generation and is not emitted (s.stopped); any other id is
// recorded by the sampler (`accept`: sampler_accept, or on the gpu the device sampler's too),
// counted, advances the constraint (s.complete; gc may be null) and is emitted (the emitter's
// false: s.cancelled). false: generation ends with this id. the caller checks max_new and the
// capacity.
template <typename Emit, typename Accept>
static bool gen_take(GenStats* s, int id, const std::vector<int>& stop_ids, GenConstraint* gc, Emit& emit, Accept accept) {
    if (std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) { s->stopped = true; s->stop_id = id; return false; }
    accept();
    s->generated++;
    s->complete = constraint_take(gc, id);
    if (!emit_more(emit, id)) { s->cancelled = true; return false; }  // a stop string, or the client left
    return !s->complete;
}

// what a generation reports besides the ids, for --logits-out and the server's logprobs.
// prompt_rows gets the prompt's logits, every row, piece by piece in order ([T, vocab] fp32);
// sampled gets the logits each sampled id was drawn from ([vocab]: the model's raw output,
// before temperature, penalties and bias), just before the id is emitted; a stop id too
// (then nothing is emitted after it).
// null callbacks are not called. asking for prompt rows prefills in pieces of at most
// logits_piece rows; on the gpu, asking for sampled rows copies one row to the host per token
// and turns the step-ahead pipelining off.
struct GenTap {
    void (*prompt_rows)(void* ctx, const float* logits, int T, int vocab) = nullptr;
    void (*sampled)(void* ctx, const float* logits, int vocab, int id) = nullptr;
    void* ctx = nullptr;
};

// the prefill of a generation (generate_cpu, generate_gpu, generate_lane): the sequence holds
// `base` tokens and `prompt` is the rest, in pieces of at most `piece` tokens; with mm the rest
// of that multimodal prompt (mm_check_prompt), each piece with its vision rows and m-rope
// positions (MmPieces, allocated once here). stop(i) is asked before the piece at prompt index
// i (true: the prefill ends there, and this returns false); forward(ids, rows, pos3, T, last)
// runs a piece (rows, pos3 null for text; last: the prompt's final piece). the caller sets the
// sequence's rope_delta after it.
template <typename Stop, typename Forward>
static bool prefill_pieces(const std::vector<int>& prompt, int base, int piece, int H, const MmPrompt* mm, Stop stop, Forward forward) {
    if (mm) mm_check_prompt(mm, base, prompt);
    MmPieces pc(mm, base, mm ? piece : 0, H);
    const int n = (int)prompt.size();
    for (int i = 0; i < n; i += piece) {
        if (stop(i)) return false;
        const int T = std::min(piece, n - i);
        const int* ids = prompt.data() + i; const float* rows = nullptr; const int* pos3 = nullptr;
        if (mm) pc.piece(base + i, T, &ids, &rows, &pos3);
        forward(ids, rows, pos3, T, i + T == n);
    }
    return true;
}

// generate up to max_new tokens after the prompt. each id is passed to emit as it is
// sampled (emit may return false to end generation there); a stop id ends generation and is
// not emitted. generation also ends when the sequence reaches its capacity. tap (may be
// null): the prompt's logits and the sampled rows, as GenTap says.
// cancel is polled before each prefill piece: when it says stop, nothing is sampled and the
// sequence holds the pieces prefilled so far (s.cancelled).
// mm (nullable): the prompt is the rest of this multimodal prompt (mm_check_prompt); its vision
// rows and m-rope positions are prefilled, and decoding goes on at its rope_delta.
// gc (nullable): the constraint (GenConstraint).
template <typename Emit>
static GenStats generate_cpu(const Model* m, RunState* r, SeqState* st, Sampler* smp, const std::vector<int>& prompt,
                             int max_new, const std::vector<int>& stop_ids, const GenTap* tap, Emit emit,
                             const GenCancel& cancel = GenCancel(), const MmPrompt* mm = nullptr, GenConstraint* gc = nullptr) {
    const Geometry& g = m->geo;
    GenStats s;
    s.prompt = (int)prompt.size();
    const bool all_rows = tap && tap->prompt_rows;
    const int piece = all_rows ? logits_piece(r, g.vocab) : r->T_max;
    std::vector<float> logits((size_t)g.vocab * (all_rows ? piece : 1));
    double t0 = now_s();
    const bool prefilled = prefill_pieces(prompt, st->pos, piece, g.H, mm, [&](int) { return cancel(); },
                                          [&](const int* ids, const float* rows, const int* pos3, int T, bool last) {
        forward_cpu(m, r, st, ids, rows, pos3, T, logits.data(), all_rows, nullptr);
        if (!all_rows) return;
        tap->prompt_rows(tap->ctx, logits.data(), T, g.vocab);
        if (last) memmove(logits.data(), logits.data() + (size_t)(T - 1) * g.vocab, sizeof(float) * g.vocab);
    });
    if (!prefilled) { s.cancelled = true; s.prefill_s = now_s() - t0; return s; }
    if (mm) st->rope_delta = mm->rope_delta;
    s.prefill_s = now_s() - t0;
    t0 = now_s();
    constraint_start(gc);
    for (int n = 0; n < max_new; n++) {
        smp->mask = constraint_mask(gc);
        int id = sample(smp, logits.data(), st->pos, n == 0 ? RNG_PREFILL : RNG_DECODE);
        smp->mask = nullptr;
        if (tap && tap->sampled) tap->sampled(tap->ctx, logits.data(), g.vocab, id);
        if (!gen_take(&s, id, stop_ids, gc, emit, [&] { sampler_accept(smp, id); })) break;
        if (n + 1 == max_new || st->pos == st->capacity) break;  // done, or no room to feed it back
        forward_cpu(m, r, st, &id, nullptr, nullptr, 1, logits.data(), false, nullptr);
    }
    s.decode_s = now_s() - t0;
    return s;
}

// the log-probability of `id` under one row of logits, log softmax over all `vocab` rows in
// double (token_nll's normalisation), and the `top_n` most likely ids below `domain` (the ids
// the tokenizer can produce) with theirs, best first, ties to the lower id. for the server's
// logprobs; no allocation beyond *top.
static float token_logprobs(const float* lg, int vocab, int domain, int id, int top_n, std::vector<std::pair<int, float>>* top) {
    float mx = lg[argmax(lg, vocab)];
    double sum = 0.0;
    for (int v = 0; v < vocab; v++) sum += exp((double)(lg[v] - mx));
    const double lse = log(sum) + mx;
    top->clear();
    if (top_n > 0) {  // insertion into a short sorted list, one pass over the domain
        top->reserve(top_n + 1);
        for (int v = 0; v < domain; v++) {
            if ((int)top->size() == top_n && !(lg[v] > top->back().second)) continue;
            auto at = top->end();
            while (at != top->begin() && lg[v] > (at - 1)->second) --at;
            top->insert(at, {v, lg[v]});
            if ((int)top->size() > top_n) top->pop_back();
        }
        for (auto& t : *top) t.second = (float)((double)t.second - lse);
    }
    return (float)((double)lg[id] - lse);
}

// ---- mtp speculative decoding -------------------------------------------------------------
//
// one round (model.md 5.2, reference-engine.md 16.4), at a boundary where the sequence holds
// n0 tokens, the token x at index n0 is sampled but not yet fed, and the mtp has proposed
// d1..dK for indices n0+1..n0+K:
//   1. verify: the target runs [x, d1..dK] as K+1 columns at kv rows n0..n0+K; column t leaves
//      its deltanet state in slot t (forward_cpu's snap)
//   2. accept, column by column: column i < K tests d_{i+1} against the target's column-i
//      distribution (greedy: equal to the argmax; sampling: sample_spec), the first rejection
//      ends the round with the corrected token, and if all K pass column K gives a bonus token.
//      every token goes through the stop ids, the emitter and the limits as it is produced; a
//      stop, limit or cancel at column c commits exactly columns 0..c
//   3. commit: A accepted drafts -> len = n0 + A + 1, live slot A (no copy, no recomputation);
//      the kv rows past it are overwritten by the next round
//   4. realign: the mtp runs the A+1 true rows [d1..dA, t*] x hidden of columns 0..A (its kv
//      rows from n0 on; the draft rows of the previous round are overwritten), draft 1 is the
//      argmax of the proposal head on the last row, drafts 2..K are autoregressive mtp steps
//      (input: the previous draft and the mtp's own hidden, one position on), whose kv rows are
//      again overwritten by the next realignment
// greedy, every emitted token is the target's argmax given exactly the tokens before it, and
// every verification column computes bit for bit what a one-token forward computes (products
// sum each column in the same order whatever T is, attention per column, the deltanet
// recurrent per column): the output is token for token plain decoding's. sampling draws each
// token from the target distribution (sample_spec), with the rng keyed by purpose.
// where no round fits before the context end (len + K + 1 > capacity) it decodes one token at
// a time, as NInfer does.

// test hook: replaces the mtp's draft k (1..K) for sequence index idx (tests force right and
// wrong drafts through it); null in the product
typedef int (*DraftHook)(void* ctx, int idx, int k, int proposed);

struct SpecState {
    SpecOpts o;
    int rows = 0;               // max(T_max, K+1)
    std::vector<float> hid;     // [rows, H] main hidden: the last prefill piece, then the verify columns
    std::vector<float> mh;      // [rows, H] mtp hidden rows
    std::vector<float> lg;      // [K+1, vocab] verify logits
    std::vector<float> dl;      // [vocab or draft rows] proposal logits
    std::vector<int> ids;       // [rows]
    int drafts[SPEC_MAX_K] = {};
    int rid[SPEC_MAX_K + 1] = {};  // the realignment's ids
    DraftHook hook = nullptr; void* hook_ctx = nullptr;
};

static void spec_build(SpecState* sp, const Geometry& g, const SpecOpts& o, int T_max) {
    CHECK(o.K >= 1 && o.K <= SPEC_MAX_K, "draft window %d", o.K);
    *sp = SpecState();
    sp->o = o;
    sp->rows = std::max(T_max, o.K + 1);
    sp->hid.assign((size_t)sp->rows * g.H, 0.0f);
    sp->mh.assign((size_t)sp->rows * g.H, 0.0f);
    sp->lg.assign((size_t)(o.K + 1) * g.vocab, 0.0f);
    sp->dl.assign(o.lm_head_draft ? g.draft_rows : g.vocab, 0.0f);
    sp->ids.assign(sp->rows, 0);
}

// what --spec mtp (and --lm-head-draft) need from the artifact; false with a one-line *err
static bool spec_check(const Model* m, const SpecOpts& o, std::string* err) {
    if (!o.K) return true;
    if (!m->geo.has_mtp) { *err = m->art.path + ": --spec mtp needs the mtp module (mtp/* tensors), which this artifact does not have"; return false; }
    if (o.lm_head_draft && !m->geo.draft_rows) {
        *err = m->art.path + ": --lm-head-draft needs a draft head (text/draft_head, text/draft_head_token_ids), which this artifact does not have";
        return false;
    }
    return true;
}

// the draft from one mtp hidden row: the argmax of the proposal head, the full head over the
// token domain or the draft head's rows mapped through its ids (lowest row on ties)
static int spec_propose(const Model* m, SpecState* sp, const float* h, int domain) {
    const Geometry& g = m->geo;
    if (sp->o.lm_head_draft) {
        matmul(sp->dl.data(), g.draft_rows, h, g.H, m->w.draft_head, 1);
        return m->w.draft_ids[argmax(sp->dl.data(), g.draft_rows)];
    }
    matmul(sp->dl.data(), g.vocab, h, g.H, m->w.output_head, 1);
    return argmax(sp->dl.data(), domain);
}

// the mtp's T true rows from st->mtp_pos on (row p: ids[t] = token p+1, hid[t] = main hidden p),
// ending at st->pos; then the K drafts for indices pos+1..pos+K into sp->drafts
static void spec_draft(const Model* m, RunState* r, SeqState* st, SpecState* sp, const int* ids, const float* hid, int T, int domain) {
    const int H = m->geo.H, K = sp->o.K;
    CHECK(st->mtp_pos + T == st->pos, "mtp rows %d + %d, sequence %d", st->mtp_pos, T, st->pos);
    mtp_forward_cpu(m, r, st, ids, nullptr, hid, nullptr, T, nullptr, false, sp->mh.data());
    float* h = sp->mh.data() + (size_t)(T - 1) * H;
    for (int k = 1; k <= K; k++) {
        int d = spec_propose(m, sp, h, domain);
        if (sp->hook) d = sp->hook(sp->hook_ctx, st->pos + k, k, d);
        sp->drafts[k - 1] = d;
        if (k < K) mtp_forward_cpu(m, r, st, &d, nullptr, h, nullptr, 1, nullptr, false, h);
    }
    st->mtp_pos = st->pos;  // the draft rows are overwritten by the next realignment
}

// generate_cpu's contract with mtp speculation (the section's header; cancel is polled between
// prefill pieces, the emitter's false ends a round as a stop does); st was built with K+1
// gdn slots and an mtp kv cache, r with T_max >= K+1, and st's mtp rows match its tokens
template <typename Emit>
static GenStats generate_spec_cpu(const Model* m, RunState* r, SeqState* st, SpecState* sp, Sampler* smp, const std::vector<int>& prompt,
                                  int max_new, const std::vector<int>& stop_ids, Emit emit, const GenCancel& cancel = GenCancel()) {
    const Geometry& g = m->geo;
    const int K = sp->o.K, n = (int)prompt.size();
    CHECK(st->gdn_slots >= K + 1 && r->T_max >= K + 1 && sp->rows >= r->T_max, "speculation state for K=%d", K);
    CHECK(st->mtp_pos == st->pos, "mtp rows %d, sequence %d", st->mtp_pos, st->pos);
    GenStats s;
    s.prompt = n;
    s.spec.K = K;
    float* lg0 = sp->lg.data();
    double t0 = now_s();
    // prefill: each piece's hidden rows feed the mtp rows of the same positions (row p pairs
    // token p+1 with hidden p: NInfer fills the mtp kv during prefill); the last piece's rows
    // wait for the first sampled token
    int last0 = 0, lastT = 0;
    for (int i = 0; i < n; i += r->T_max) {
        if (cancel()) { s.cancelled = true; s.prefill_s = now_s() - t0; return s; }
        const int T = std::min(r->T_max, n - i);
        forward_cpu(m, r, st, prompt.data() + i, nullptr, nullptr, T, lg0, false, sp->hid.data());
        if (i + T < n) { mtp_forward_cpu(m, r, st, prompt.data() + i + 1, nullptr, sp->hid.data(), nullptr, T, nullptr, false, nullptr); continue; }
        last0 = i; lastT = T;
    }
    s.prefill_s = now_s() - t0;
    t0 = now_s();
    auto take = [&](int id) { return gen_take(&s, id, stop_ids, nullptr, emit, [&] { sampler_accept(smp, id); }) && s.generated < max_new; };
    if (max_new <= 0 || n == 0) { s.decode_s = now_s() - t0; return s; }
    int x = sample(smp, lg0, st->pos, RNG_PREFILL);
    bool go = take(x) && st->pos < st->capacity;
    bool rounds = go && st->pos + K + 1 <= st->capacity;
    if (rounds) {
        for (int t = 0; t + 1 < lastT; t++) sp->ids[t] = prompt[last0 + t + 1];
        sp->ids[lastT - 1] = x;
        spec_draft(m, r, st, sp, sp->ids.data(), sp->hid.data(), lastT, smp->domain);
    }
    while (go) {
        if (!rounds) {  // no room for a round: one token at a time
            forward_cpu(m, r, st, &x, nullptr, nullptr, 1, lg0, false, nullptr);
            s.spec.fallback_steps++;
            x = sample(smp, lg0, st->pos, RNG_DECODE);
            go = take(x) && st->pos < st->capacity;
            continue;
        }
        // 1. verify
        const int n0 = st->pos;
        sp->ids[0] = x;
        for (int k = 0; k < K; k++) sp->ids[k + 1] = sp->drafts[k];
        forward_cpu(m, r, st, sp->ids.data(), nullptr, nullptr, K + 1, sp->lg.data(), true, sp->hid.data(), true);
        s.spec.rounds++;
        s.spec.drafted += K;
        // 2. accept; the token of column c is at sequence index n0 + c + 1
        int c = 0;
        for (;; c++) {
            const float* lg = sp->lg.data() + (size_t)c * g.vocab;
            bool acc = false;
            x = c < K ? sample_spec(smp, lg, sp->drafts[c], n0 + c + 1, &acc) : sample(smp, lg, n0 + c + 1, RNG_SPEC_BONUS);
            if (acc) { s.spec.accepted++; s.spec.per_position[c]++; }
            if (!take(x)) { go = false; break; }
            if (!acc) break;  // the correction, or the bonus (c == K)
        }
        // 3. commit columns 0..c: A = c accepted drafts were fed
        st->pos = n0 + c + 1;
        seq_set_slot(st, c);
        if (!go || st->pos == st->capacity) break;
        // 4. realign the mtp on the true rows and draft the next round
        rounds = st->pos + K + 1 <= st->capacity;
        if (!rounds) continue;
        for (int t = 0; t < c; t++) sp->rid[t] = sp->drafts[t];
        sp->rid[c] = x;
        spec_draft(m, r, st, sp, sp->rid, sp->hid.data(), c + 1, smp->domain);
    }
    s.decode_s = now_s() - t0;
    return s;
}

// -log softmax(logits)[target] over all rows, in double (the cpu and gpu perplexity share it)
static double token_nll(const float* lg, int vocab, int target) {
    float mx = lg[argmax(lg, vocab)];
    double sum = 0.0;
    for (int v = 0; v < vocab; v++) sum += exp((double)(lg[v] - mx));
    return log(sum) + mx - lg[target];
}

// mean negative log-likelihood over a token sequence, NInfer-style perplexity: the ids are
// cut into non-overlapping windows of `window` tokens; in each window every token after the
// first is scored given the window's prefix (a fresh sequence per window). returns the total
// nll and the number of scored tokens; ppl = exp(nll / n). both paths run this loop: reset()
// starts a fresh sequence, forward(ids, T, logits) runs T tokens with every row's logits
// (at most `piece` per call).
template <typename Reset, typename Forward>
static double perplexity_windows(const std::vector<int>& ids, int window, int piece, int vocab, int64_t* scored, Reset reset,
                                 Forward forward) {
    std::vector<float> logits((size_t)piece * vocab);
    double nll = 0.0;
    *scored = 0;
    for (size_t w0 = 0; w0 < ids.size(); w0 += window) {
        int n = (int)std::min<size_t>(window, ids.size() - w0);
        reset();
        for (int i = 0; i < n; i += piece) {
            int T = std::min(piece, n - i);
            forward(ids.data() + w0 + i, T, logits.data());
            for (int t = 0; t < T && i + t + 1 < n; t++) {  // row t predicts token i+t+1 of the window
                nll += token_nll(logits.data() + (size_t)t * vocab, vocab, ids[w0 + i + t + 1]);
                (*scored)++;
            }
        }
    }
    return nll;
}
static double perplexity_cpu(const Model* m, RunState* r, SeqState* st, const std::vector<int>& ids, int window, int64_t* scored) {
    return perplexity_windows(ids, window, logits_piece(r, m->geo.vocab), m->geo.vocab, scored, [&] { seq_reset(st); },
                              [&](const int* x, int T, float* lg) { forward_cpu(m, r, st, x, nullptr, nullptr, T, lg, true, nullptr); });
}

// === 7. kernels ==============================================================
//
// every kernel is `op_kernel` + one host launcher `op(...)`; the table of contents lists the
// subsections (decode ops 7.2-7.8, then the prefill ops 7.9-7.13; the vision tower's 7.14).
//
// conventions (all kernels):
//   activations are [columns][features], features fastest, with a row stride `ld` in elements;
//   a "column" is one token (decode batches a few: mtp verification, several sequences).
//   activations are bf16 with fp32 math inside; the rounding points follow model.md 8 and are
//   stated per kernel, so the cpu twins in test/test_kernels.cu can round at the same places.
//   weights are read in their stored format (format.md 6-7) through `Mat` views; nothing is
//   dequantized into a copy.
//   state slots (gdn recurrent state, conv state): one layer's state for slot s lives at
//   base + s * slot_stride. decode kernels take a device array `slots` of 2*C ints: slots[c] is
//   the slot column c reads its state from (-1: continue from column c-1's result; at column 0,
//   -1 means a zero state), slots[C + c] the slot it writes its state after column c to (-1:
//   don't write). so mtp verification reads slot i once and snapshots every column into its own
//   slot (model.md 5.3), plain decode reads and writes one slot in place, and C independent
//   sequences each read and write their own. the slots live on the device, so a cuda graph
//   replays with whatever slots the previous step chose.

typedef __nv_bfloat16 bf16_t;

#ifndef CEIL_DIV
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
#endif

// ---- 7.1 device helpers ---------------------------------------------------------------------

__device__ __forceinline__ float bf2f(bf16_t x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16_t f2bf(float x) { return __float2bfloat16(x); }  // round to nearest even
__device__ __forceinline__ float bfround(float x) { return __bfloat162float(__float2bfloat16(x)); }
__device__ __forceinline__ float f16bits2f(uint32_t u) { return __half2float(__ushort_as_half((unsigned short)u)); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// sum over the block (blockDim.x a multiple of 32); every thread gets the result
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float sh[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // sh may still be read by a previous call
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.f;
    return warp_sum(v);
}

// programmatic dependent launch (hopper): every kernel of this file calls pdl_entry() before
// it reads what an earlier kernel wrote or writes what one reads (griddepcontrol.wait: the
// kernels it depends on have finished and their writes are visible); with the launch
// attribute the next kernel's blocks can be placed while this one runs, which shortens the
// gaps between the ~300 kernels of a decode step. launched without the attribute (GpuTuning::pdl
// off, or before sm_90) it is a no-op. on by default: faster on sm_90 with the triggers below
// (small kernels after their wait, gemvs after their main loop, the x-staged gemv's weight
// prefetch before its wait); triggering at every kernel's entry was slower (test/bench-notes.md,
// session 2).
__device__ __forceinline__ void pdl_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// the trigger: griddepcontrol.launch_dependents lets the next kernel's blocks be placed once
// every block of this grid has issued it (or exited); without it that happens at the end.
// small kernels (a grid of at most one block per sm) trigger right after their wait: the next
// gemv's blocks then take the idle sms and start streaming their weights (which no kernel
// writes) before they wait for this kernel's output. a bigger grid does not trigger early,
// because the early dependents would take slots its own later blocks need (measured for the
// gemv chain, bench-notes). the gemvs trigger after their main loop (gemv_xs_kernel).
__device__ __forceinline__ void pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_entry_small() {
    pdl_entry();
    uint32_t nsm;
    asm("mov.u32 %0, %%nsmid;" : "=r"(nsm));
    if (gridDim.x * gridDim.y * gridDim.z <= nsm) pdl_release();
}
static bool g_launch_pdl = false;  // launch with the programmatic-serialization attribute (gpu_kernels_init: sm_90+ and GpuTuning::pdl)
template <typename... KArgs, typename... Args>
static void launch_k(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid; cfg.blockDim = block; cfg.dynamicSmemBytes = smem; cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr; cfg.numAttrs = g_launch_pdl ? 1 : 0;
    cudaCheck(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }
// torch's softplus: linear above 20
__device__ __forceinline__ float softplus_f(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// ---- 7.2 gemv (decode products) -------------------------------------------------------------
// gemv: y[c][r] = sum_k W[r,k] x[c][k] for c < C (1..8 a block; the wide kernel below: up
// to 64), decode's matrix op
//
// batch-1 decode reads every weight byte once per token, so this kernel is a memory stream:
// the target is the copy bandwidth. the design, and why:
//   * tensor cores do the dot products: mma.sync m16n8k16 bf16 -> fp32, with the weight tile
//     as A (16 rows x 16 k) and the activation columns as B (16 k x 8 columns). codes become
//     exact bf16 values in registers with one or two integer ops per pair (the "magic number"
//     trick: a 7-bit integer ored into the mantissa of bf16 128.0 is 128 + that integer
//     exactly, and one bf16x2 fma removes the 128 and the sign offset). the conversion costs
//     ~1.5 instructions per weight whatever C is, so 1..8 columns cost the same time.
//   * the quad of threads that shares an mma row covers exactly one quantization group per
//     mma chain (each thread 16 lanes = 8 bytes of q4/q5/q6 codes, 8 lanes of w8), so a
//     group's partial dot comes out of the tensor core unscaled and is scaled once in fp32:
//     acc += fp16_scale * mma(codes, x). the k order inside a group is permuted (pairs of
//     lanes i, i+4 share a register, which is what one shift + mask gives); x is permuted the
//     same way when its fragment is built, so the sum is unchanged.
//   * a block is NW warps on one 16-row tile; the warps split the k
//     groups (warp w takes groups [w*D, w*D+D), then +NW*D, ...) so a 4096-row matrix still
//     fills the machine. partial sums meet in shared memory at the end.
//   * two ways to get the weights in: the register kernel issues all loads of a stage (D
//     groups, ld.global.nc.L1::no_allocate, immediate offsets, no guards on whole stages) and
//     then computes it; the async kernel copies 16-row x 2-group tiles into per-warp shared
//     memory with cp.async, S stages deep, so the next stages are in flight while one is
//     computed without holding registers. x is read when a group is computed (l1 hits).
//   * the offset trick: the magic values are code + 136/144/160 (q4/q5/q6); instead of
//     a bf16 subtract per pair, one more mma with A = 1 gives sum(x) per group and the fp32
//     epilogue subtracts offset * sum(x) (w8: lo + 128 and hi + 136 in two accumulators).
//   * where the time goes (ncu): the register kernel waits on memory latency, the async one
//     is issue-bound (test/bench-notes.md, "gemv versions").
// numerics: products exact (bf16 x small integer), sums fp32 (tensor-core accumulation within
// a group, fp32 fma across groups and warps; the offset trick cancels ~5 bits of a group's
// fp32 sum, still ~1e-6 of sum |w x|: measured rel-l2 ~8e-8 vs float64 on fp32 outputs).
// y is fp32, or bf16 (one rounding); with a
// residual, y = bf16(resid + bf16(Wx)), the two roundings hf makes (model.md 4.3).
// requirements: x 16-byte aligned with ldx % 8 == 0 (activations are allocated that way);
// bf16 weights need cols % 8 == 0. x[c][k] for k >= cols is never read, so a padded tail
// of any content (even nan) is safe; padding groups of the row-split layout have scale 0.

enum { GEMV_MAX_COLS = 8 };  // columns per launch (the mma n); more run on the wide kernel, or in chunks

struct GemvArgs {
    Mat w;                    // device view, any of q4/q5/q6/w8 row-split or bf16 contiguous
    const bf16_t* x; int ldx; // x[c*ldx + k]
    int C;                    // columns, 1..8 (register / async kernels: up to 64, 8 a block row)
    void* y; int ldy;         // y[c*ldy + r], bf16 or fp32
    int y_f32;
    const bf16_t* resid; int ldr;  // optional residual (may alias y)
    // x-staged kernel only (gemv_fusable): what x is made from while it is staged, so the
    // decode step needs no separate kernel for it. GEMV_X_RMS: x is the residual stream and the
    // product reads bf16(x * rsqrt(mean(x^2) + eps) * (1 + xw)) (rmsnorm_kernel's math);
    // GEMV_X_SWIGLU: x is [gate | up] (up at + cols) and the product reads
    // bf16(bf16(silu(gate)) * up) (swiglu_kernel's math). GEMV_X_GATED (the wide kernel's
    // prep only): x is the deltanet's core output, and the product reads the gated norm of each
    // 128-wide head with the gate z (xz, ldz) and the norm weight xw (gated_rmsnorm_kernel's math).
    int xmode; const bf16_t* xw; float eps;
    const bf16_t* xz; int ldz;
};
enum { GEMV_X_PLAIN = 0, GEMV_X_RMS = 1, GEMV_X_SWIGLU = 2, GEMV_X_GATED = 3 };

__device__ __forceinline__ uint2 ldg_stream_u2(const void* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ uint4 ldg_stream_u4(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ldg_stream_u32(const void* p) {
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ldg_stream_u16(const void* p) {
    unsigned short v;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

// d = f(a, b, c) bitwise, f given by its truth table on a = 0xF0, b = 0xCC, c = 0xAA
template <uint32_t LUT>
__device__ __forceinline__ uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(LUT));
    return d;
}
enum : uint32_t { LOP_AND_OR = 0xEA,   // (a & b) | c
                  LOP_AND_XOR = 0x6A,  // (a & b) ^ c
                  LOP_SELECT = 0xE4 }; // c ? a : b, per bit

// d = a * b + c on bf16x2 words (exact for the small integers used here)
__device__ __forceinline__ uint32_t bf2_fma(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// bf16x2 constants (low and high half equal)
#define BF2(h) (((uint32_t)(h) << 16) | (uint32_t)(h))
enum : uint32_t {
    BF_ONE = 0x3F80, BF_16 = 0x4180,
    BF_M128 = 0xC300, BF_M136 = 0xC308, BF_M144 = 0xC310, BF_M160 = 0xC320, BF_M2176 = 0xC508,
};

// per-format constants. G: lanes per group; LPT: lanes one thread holds per group (a quad
// covers a group); STEPS: mma k16 steps per group; RAW: 32-bit words of raw data per row per
// group; units per row = groups (bf16: 64-lane pseudo-groups, no scale).
template <int F> struct GemvFmt {
    static constexpr int G = F == FMT_W8 ? 32 : 64;
    static constexpr int LPT = G / 4;
    static constexpr int STEPS = LPT / 4;
    static constexpr int RAW = F == FMT_BF16 ? 8 : 4;  // base words (2 or 8), high word, scale word
    static constexpr bool SCALED = F != FMT_BF16;
};

// the A operand: the bf16x2 pair p of one row's raw group data (codes, exact).
// q4/q5/q6: pair p = lanes (i, i+4) of base word p/4 (lanes 0..7 or 8..15 of the thread's 16),
// i = p%4: the shift by 4i brings nibble i to bits 0..3 and nibble i+4 to bits 16..19.
// hs: the high bits pre-spread for the word (see gemv_spread_high), so the same kind of
// shift places them at bit 4 (and 5) of each half.
// the offset trick: the pair is code + offset (GemvOffset: 136, 144, 160), the bare magic
// value; the kernel subtracts offset * sum(x) per group in fp32, which saves a bf16 fma per
// pair (the version without it is test/dev_kernels.cuh's variant 4).
template <int F> struct GemvOffset { static constexpr float v = F == FMT_Q4 ? 136.f : F == FMT_Q5 ? 144.f : F == FMT_Q6 ? 160.f : 0.f; };
template <int F>
__device__ __forceinline__ uint32_t gemv_pair(const uint32_t (&r)[GemvFmt<F>::RAW], uint32_t hs0, uint32_t hs1, int p) {
    if constexpr (F == FMT_BF16) {
        return r[p];
    } else {
        uint32_t w = p < 4 ? r[0] : r[1];
        int i = p & 3;
        if constexpr (F == FMT_Q4) {
            return lop3<LOP_AND_XOR>(w >> (4 * i), 0x000F000Fu, 0x43084308u);  // 128 + (u ^ 8) = code + 136
        } else if constexpr (F == FMT_Q5) {
            // two lop3: the high bits (sign already flipped) with the magic exponent, then the
            // nibbles selected in by mask: 128 + (u ^ 16) = code + 144
            uint32_t hs = p < 4 ? hs0 : hs1;
            uint32_t hm = lop3<LOP_AND_OR>(hs >> i, 0x00100010u, 0x43004300u);
            return lop3<LOP_SELECT>(w >> (4 * i), hm, 0x000F000Fu);
        } else {  // q6: 128 + (u ^ 32) = code + 160
            uint32_t hs = p < 4 ? hs0 : hs1;
            uint32_t hm = lop3<LOP_AND_OR>(hs >> (2 * i), 0x00300030u, 0x43004300u);
            return lop3<LOP_SELECT>(w >> (4 * i), hm, 0x000F000Fu);
        }
    }
}

// q5: high bits of lanes 0..7 of the thread's 16 (hw bits 0..7), copied to bits 4..11 and
// 16..23 so that (hs >> i) has lane i at bit 4 and lane i+4 at bit 20; inverted, which is the
// u ^ 16 of the offset-binary code (bit 4 is the sign bit of a 5-bit code).
// q6: 2-bit fields of lanes 0..3 to bits 4..11 and of lanes 4..7 to bits 20..27, so that
// (hs >> 2i) has lane i's field at bits 4..5 and lane i+4's at 20..21; the upper bit of each
// field (the sign bit, bit 5 of the code) flipped: u ^ 32.
template <int F>
__device__ __forceinline__ void gemv_spread_high(uint32_t hw, uint32_t& hs0, uint32_t& hs1) {
    if constexpr (F == FMT_Q5) {
        hs0 = ~((hw & 0xFFu) * 0x00010010u);
        hs1 = ~(((hw >> 8) & 0xFFu) * 0x00010010u);
    } else if constexpr (F == FMT_Q6) {
        hs0 = (__byte_perm(hw, 0, 0x4140) << 4) ^ 0x0AA00AA0u;
        hs1 = (__byte_perm(hw, 0, 0x4342) << 4) ^ 0x0AA00AA0u;
    } else {
        hs0 = hs1 = 0;
    }
}

// w8: one byte per lane; code = 16*hi + lo with hi = byte >> 4 (signed), lo = byte & 15.
// pair j of a word = its bytes (j, j+2): lanes (0,2), (1,3) of word 0, (4,6), (5,7) of word 1.
// with the offset trick: lo + 128 and hi + 136 (not times 16), both exact in bf16.
__device__ __forceinline__ void gemv_pair_w8(uint32_t w, int j, uint32_t& lo, uint32_t& hi) {
    lo = lop3<LOP_AND_OR>(w >> (8 * j), 0x000F000Fu, 0x43004300u);       // 128 + lo
    hi = lop3<LOP_AND_XOR>(w >> (8 * j + 4), 0x000F000Fu, 0x43084308u);  // 128 + (hi ^ 8) = hi + 136
}

// the B operand for step s from the thread's x values (its LPT lanes of the group, as uint4s
// of 8 bf16): q/bf16 need pairs matching gemv_pair's lane order.
template <int F>
__device__ __forceinline__ void gemv_xfrag(const uint4 (&x)[2], int s, uint32_t& b0, uint32_t& b1) {
    if constexpr (F == FMT_BF16) {
        const uint4& v = x[s >> 1];
        b0 = (s & 1) ? v.z : v.x;
        b1 = (s & 1) ? v.w : v.y;
    } else if constexpr (F == FMT_W8) {
        // step s: lanes (4s, 4s+2) and (4s+1, 4s+3)
        const uint4& v = x[0];
        uint32_t w0 = s ? v.z : v.x, w1 = s ? v.w : v.y;
        b0 = __byte_perm(w0, w1, 0x5410);
        b1 = __byte_perm(w0, w1, 0x7632);
    } else {
        // step s: pair 2s = lanes (a, a+4), pair 2s+1 = (a+1, a+5), a = 2s (s<2) or 8+2(s-2)
        const uint4& v = x[s >> 1];
        uint32_t w0 = (s & 1) ? v.y : v.x, w1 = (s & 1) ? v.w : v.z;
        b0 = __byte_perm(w0, w1, 0x5410);
        b1 = __byte_perm(w0, w1, 0x7632);
    }
}

// a warp's plane pointers: rows g and g+8 of its 16-row tile, already advanced to the thread's
// share of a group (base + 8t; bf16 + 32t; high + 2t or 4t); rows past the end are clamped
// (read twice, never stored). per stage they move by whole groups, and the D groups of a
// stage are immediate offsets from there.
struct GemvPtrs { const uint8_t* b[2]; const uint8_t* h[2]; const uint8_t* s[2]; };

template <int F> struct GemvStride {  // bytes per group in each plane
    static constexpr int B = F == FMT_BF16 ? 128 : 32;
    static constexpr int H = F == FMT_Q5 ? 8 : F == FMT_Q6 ? 16 : 0;
};

// the raw words of groups [ub, ub+D) for the warp's rows. FAST: all D groups lie inside k
// (no guards); else groups past `units` are skipped and bf16's partial last group is
// zero-filled past k.
template <int F, int D, bool FAST>
__device__ __forceinline__ void gemv_load(uint32_t (&raw)[D][2][GemvFmt<F>::RAW], const GemvPtrs& P, int ub, int units, int t,
                                          int64_t K) {
    using Sd = GemvStride<F>;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint8_t* b = P.b[h] + (size_t)ub * Sd::B;
        if constexpr (F == FMT_BF16) {
#pragma unroll
            for (int d = 0; d < D; d++) {
                uint4 x0 = make_uint4(0, 0, 0, 0), x1 = make_uint4(0, 0, 0, 0);
                int64_t k0 = (int64_t)(ub + d) * 64 + t * 16;
                if (FAST || k0 + 16 <= K) { x0 = ldg_stream_u4(b + d * Sd::B); x1 = ldg_stream_u4(b + d * Sd::B + 16); }
                else if (k0 + 8 <= K) x0 = ldg_stream_u4(b + d * Sd::B);  // cols % 8 == 0
                uint32_t* r = raw[d][h];
                r[0] = x0.x; r[1] = x0.y; r[2] = x0.z; r[3] = x0.w; r[4] = x1.x; r[5] = x1.y; r[6] = x1.z; r[7] = x1.w;
            }
        } else {
            const uint8_t* hp = Sd::H ? P.h[h] + (size_t)ub * Sd::H : nullptr;
            const uint8_t* sp = P.s[h] + (size_t)ub * 2;
#pragma unroll
            for (int d = 0; d < D; d++) {
                if (!FAST && ub + d >= units) continue;
                uint2 v = ldg_stream_u2(b + d * Sd::B);
                raw[d][h][0] = v.x; raw[d][h][1] = v.y;
                if constexpr (F == FMT_Q5) raw[d][h][2] = ldg_stream_u16(hp + d * Sd::H);
                else if constexpr (F == FMT_Q6) raw[d][h][2] = ldg_stream_u32(hp + d * Sd::H);
                else raw[d][h][2] = 0;
                // scales: two groups per 32-bit load (ub is even when D is, and the scale
                // rows are 4-byte aligned: groups per row are even)
                if (FAST && D % 2 == 0) {
                    if (d % 2 == 0) {
                        uint32_t s2 = ldg_stream_u32(sp + d * 2);
                        raw[d][h][3] = s2 & 0xFFFFu;
                        raw[d + (d + 1 < D ? 1 : 0)][h][3] = s2 >> 16;
                    }
                } else {
                    raw[d][h][3] = ldg_stream_u16(sp + d * 2);
                }
            }
        }
    }
}

// x for group u: the thread's LPT lanes of its column (zeros for lanes past k or columns >= C)
template <int F, bool FAST>
__device__ __forceinline__ void gemv_load_x(uint4 (&xr)[2], const bf16_t* xq, bool xcol, int u, int t, int64_t K) {
    using Fm = GemvFmt<F>;
    constexpr int NX = Fm::LPT / 8;
    xr[0] = xr[1] = make_uint4(0, 0, 0, 0);
    if (!xcol) return;
#pragma unroll
    for (int q = 0; q < NX; q++) {
        if (FAST) { xr[q] = __ldg((const uint4*)(xq + (size_t)u * Fm::G + 8 * q)); continue; }
        int64_t k = (int64_t)u * Fm::G + t * Fm::LPT + 8 * q;
        if (k + 8 <= K) xr[q] = __ldg((const uint4*)(xq + (size_t)u * Fm::G + 8 * q));
        else if (k < K) {  // the partial chunk at the end of k (odd sizes only)
            const unsigned short* xs = (const unsigned short*)(xq + (size_t)u * Fm::G + 8 * q);
            uint32_t e[8];
            for (int j = 0; j < 8; j++) e[j] = k + j < K ? xs[j] : 0;
            xr[q] = make_uint4(e[0] | e[1] << 16, e[2] | e[3] << 16, e[4] | e[5] << 16, e[6] | e[7] << 16);
        }
    }
}

// one group of the warp's tile: acc += scale * (codes . x), from the group's b fragments and
// (offset trick) the sums of x over the group for columns 2t, 2t+1 (sx[0], sx[1])
template <int F>
__device__ __forceinline__ void gemv_group(const uint32_t (&raw)[2][GemvFmt<F>::RAW], float (&acc)[4],
                                           const uint32_t (&b)[GemvFmt<F>::STEPS][2], const float (&sx)[4]) {
    using Fm = GemvFmt<F>;
    const uint32_t (&r0)[Fm::RAW] = raw[0];
    const uint32_t (&r1)[Fm::RAW] = raw[1];
    if constexpr (F == FMT_BF16) {
#pragma unroll
        for (int s = 0; s < Fm::STEPS; s++) mma_bf16_16816(acc, r0[2 * s], r1[2 * s], r0[2 * s + 1], r1[2 * s + 1], b[s][0], b[s][1]);
    } else {
        float dd[4] = {0.f, 0.f, 0.f, 0.f};
        float s0 = f16bits2f(r0[3]), s1 = f16bits2f(r1[3]);
        if constexpr (F == FMT_W8) {
            float dh[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int s = 0; s < Fm::STEPS; s++) {
                uint32_t lo[4], hi[4];  // pairs 2s, 2s+1 of rows g, g+8, in a-register order
                gemv_pair_w8(r0[s], 0, lo[0], hi[0]);
                gemv_pair_w8(r1[s], 0, lo[1], hi[1]);
                gemv_pair_w8(r0[s], 1, lo[2], hi[2]);
                gemv_pair_w8(r1[s], 1, lo[3], hi[3]);
                mma_bf16_16816(dd, lo[0], lo[1], lo[2], lo[3], b[s][0], b[s][1]);
                mma_bf16_16816(dh, hi[0], hi[1], hi[2], hi[3], b[s][0], b[s][1]);
            }
            // lo + 16 hi - (128 + 16*136) sum(x)
#pragma unroll
            for (int j = 0; j < 4; j++) dd[j] = fmaf(16.f, dh[j], fmaf(-2304.f, sx[j & 1], dd[j]));
        } else {
            uint32_t hs[2][2];
#pragma unroll
            for (int h = 0; h < 2; h++) gemv_spread_high<F>((h ? r1 : r0)[2], hs[h][0], hs[h][1]);
#pragma unroll
            for (int s = 0; s < Fm::STEPS; s++)
                mma_bf16_16816(dd, gemv_pair<F>(r0, hs[0][0], hs[0][1], 2 * s), gemv_pair<F>(r1, hs[1][0], hs[1][1], 2 * s),
                               gemv_pair<F>(r0, hs[0][0], hs[0][1], 2 * s + 1), gemv_pair<F>(r1, hs[1][0], hs[1][1], 2 * s + 1),
                               b[s][0], b[s][1]);
#pragma unroll
            for (int j = 0; j < 4; j++) dd[j] = fmaf(-GemvOffset<F>::v, sx[j & 1], dd[j]);
        }
        acc[0] = fmaf(s0, dd[0], acc[0]);
        acc[1] = fmaf(s0, dd[1], acc[1]);
        acc[2] = fmaf(s1, dd[2], acc[2]);
        acc[3] = fmaf(s1, dd[3], acc[3]);
    }
}

template <int F, int D, bool FAST>
__device__ __forceinline__ void gemv_compute(const uint32_t (&raw)[D][2][GemvFmt<F>::RAW], float (&acc)[4], const bf16_t* xq,
                                             bool xcol, int ub, int units, int t, int64_t K) {
    using Fm = GemvFmt<F>;
#pragma unroll
    for (int d = 0; d < D; d++) {
        if (!FAST && ub + d >= units) continue;
        uint4 xr[2];
        gemv_load_x<F, FAST>(xr, xq, xcol, ub + d, t, K);
        uint32_t b[Fm::STEPS][2];
#pragma unroll
        for (int s = 0; s < Fm::STEPS; s++) gemv_xfrag<F>(xr, s, b[s][0], b[s][1]);
        // sum of x over the group per column (the offsets' correction): one mma with A = 1
        float sx[4] = {0.f, 0.f, 0.f, 0.f};
        if constexpr (Fm::SCALED) {
            const uint32_t one = BF2(BF_ONE);
#pragma unroll
            for (int s = 0; s < Fm::STEPS; s++) mma_bf16_16816(sx, one, one, one, one, b[s][0], b[s][1]);
        }
        gemv_group<F>(raw[d], acc, b, sx);
    }
}

// y[col][row] = s (+ the residual: fp32 out adds it in fp32; bf16 out adds it to the bf16 of s)
__device__ __forceinline__ void gemv_store(const GemvArgs& a, int64_t row, int col, float s) {
    if (a.y_f32) {
        if (a.resid) s += bf2f(a.resid[(int64_t)col * a.ldr + row]);
        ((float*)a.y)[(int64_t)col * a.ldy + row] = s;
    } else {
        float v = a.resid ? bf2f(a.resid[(int64_t)col * a.ldr + row]) + bfround(s) : s;
        ((bf16_t*)a.y)[(int64_t)col * a.ldy + row] = f2bf(v);
    }
}

// the warps' partial sums meet in shared memory; thread (g,t) holds rows g, g+8 and columns
// 2t, 2t+1 of the tile (the mma accumulator layout). then one thread per output element adds
// the residual, rounds and stores. the tile index i (always 0: one 16-row tile) stays in the
// index arithmetic on purpose: without it ptxas schedules the whole x-staged kernel
// differently and a 9b decode step measured 0.6% slower (h200, test/bench-notes.md, the
// tuning switches); with it the sass of every gemv kernel is the measured one's.
// RT row tiles per block (warps [r*NW, r*NW+NW) on tile r, rows row0 + 16r..): each tile's
// warps meet in the same order whatever RT is
template <int NW, int RT = 1>
__device__ __forceinline__ void gemv_epilogue(const GemvArgs& a, const float (&acc)[4], int64_t row0, int warp, int lane) {
    const int64_t rows = a.w.rows;
    __shared__ float4 red[RT * NW][32];
    red[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    for (int idx = threadIdx.x; idx < RT * 128; idx += RT * NW * 32) {
        int i = idx >> 7, ln = (idx >> 2) & 31, j = idx & 3;
        float s = 0.f;
#pragma unroll
        for (int v = 0; v < NW; v++) s += ((const float*)&red[i * NW + v][ln])[j];
        int64_t row = row0 + 16 * i + (ln >> 2) + (j >= 2 ? 8 : 0);
        int col = 2 * (ln & 3) + (j & 1);
        if (row < rows && col < a.C) gemv_store(a, row, col, s);
    }
}

// NW warps share a 16-row tile and split its groups: warp w takes groups [(it*NW + w)*D, +D)
// for it = 0, 1, ...: the loads of a stage are all issued, then the stage is computed (the
// other warps of the sm keep the memory busy meanwhile). x is loaded when a group is computed
// (an l1 hit once one warp of the sm has touched it).
// the register and async kernels take up to GEMV_WIDE_COLS columns a launch: block row y runs
// columns [8y, 8y + 8) exactly as a launch of those columns alone (g_gemv_ychunks)
__device__ __forceinline__ GemvArgs gemv_col_chunk(const GemvArgs& a0) {
    GemvArgs a = a0;
    const int c0 = (int)blockIdx.y * GEMV_MAX_COLS;
    a.x += (int64_t)c0 * a.ldx;
    a.y = a.y_f32 ? (void*)((float*)a.y + (int64_t)c0 * a.ldy) : (void*)((bf16_t*)a.y + (int64_t)c0 * a.ldy);
    if (a.resid) a.resid += (int64_t)c0 * a.ldr;
    a.C = a.C - c0 < GEMV_MAX_COLS ? a.C - c0 : GEMV_MAX_COLS;
    return a;
}
template <int F, int NW, int D, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) gemv_kernel(GemvArgs a0) {
    const GemvArgs a = gemv_col_chunk(a0);
    pdl_entry();
    using Fm = GemvFmt<F>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const Mat& w = a.w;
    const int64_t rows = w.rows, K = w.cols;
    const int units = F == FMT_BF16 ? (int)CEIL_DIV(K, (int64_t)64) : (int)w.gpr;
    const int full_units = (int)(K / Fm::G);  // groups with every lane inside k
    const int64_t row0 = (int64_t)blockIdx.x * 16;

    GemvPtrs P;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int64_t r = row0 + g + 8 * h;
        r = r < rows ? r : rows - 1;
        P.b[h] = w.base + r * w.base_row + t * (F == FMT_BF16 ? 32 : 8);
        P.h[h] = Fm::SCALED && GemvStride<F>::H ? w.high + r * w.high_row + t * (GemvStride<F>::H / 4) : nullptr;
        P.s[h] = Fm::SCALED ? w.scale + r * w.scale_row : nullptr;
    }
    const bool xcol = g < a.C;  // this lane's B column
    const bf16_t* xq = a.x + (int64_t)(xcol ? g : 0) * a.ldx + t * Fm::LPT;

    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    uint32_t raw[D][2][Fm::RAW];
    for (int ub = warp * D; ub < units; ub += NW * D) {
        if (ub + D <= full_units) {
            gemv_load<F, D, true>(raw, P, ub, units, t, K);
            gemv_compute<F, D, true>(raw, acc, xq, xcol, ub, units, t, K);
        } else {
            gemv_load<F, D, false>(raw, P, ub, units, t, K);
            gemv_compute<F, D, false>(raw, acc, xq, xcol, ub, units, t, K);
        }
    }

    gemv_epilogue<NW>(a, acc, row0, warp, lane);
}

// the same computation with the weights streamed through shared memory by cp.async, S stages
// deep per warp: the copies of the next S-1 stages are in flight while a stage is computed, and
// they hold no registers, so a few warps per sm keep enough bytes in flight (the register
// kernel above stalls on memory latency: ncu, bench-notes). each warp runs its own pipeline
// over its own slots (no block barrier until the epilogue). 16-row tiles, D = 2
// groups per stage, and only shapes whose groups are all full (k a multiple of the group;
// the launcher falls back otherwise). grouped formats only.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

template <int F> struct GemvAsyncLayout {  // one stage of one warp: 16 rows x 2 groups
    static constexpr int HB = F == FMT_Q5 ? 8 : F == FMT_Q6 ? 16 : 0;  // high bytes per group
    static constexpr int RS_B = 2 * 32 + 16;     // base bytes per row, padded (bank spread), 16-aligned
    static constexpr int RS_H = 2 * HB;          // 0, 16 or 32
    static constexpr int RS_S = 4;               // two fp16 scales
    static constexpr int OFF_H = 16 * RS_B, OFF_S = OFF_H + 16 * RS_H;
    static constexpr int BYTES = (OFF_S + 16 * RS_S + 15) / 16 * 16;
};

// the raw words of a stage's two groups for the thread's rows g, g+8, from the warp's slot
template <int F>
__device__ __forceinline__ void gemv_stage_read(uint32_t (&raw)[2][2][GemvFmt<F>::RAW], const uint8_t* st, int g, int t) {
    using Ly = GemvAsyncLayout<F>;
#pragma unroll
    for (int d = 0; d < 2; d++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = g + 8 * h;
            uint2 v = *(const uint2*)(st + r * Ly::RS_B + d * 32 + t * 8);
            raw[d][h][0] = v.x; raw[d][h][1] = v.y;
            if constexpr (F == FMT_Q5) raw[d][h][2] = *(const unsigned short*)(st + Ly::OFF_H + r * Ly::RS_H + d * 8 + t * 2);
            else if constexpr (F == FMT_Q6) raw[d][h][2] = *(const uint32_t*)(st + Ly::OFF_H + r * Ly::RS_H + d * 16 + t * 4);
            else raw[d][h][2] = 0;
            raw[d][h][3] = *(const unsigned short*)(st + Ly::OFF_S + r * Ly::RS_S + d * 2);
        }
}

template <int F, int NW, int S, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) gemv_async_kernel(GemvArgs a0) {
    const GemvArgs a = gemv_col_chunk(a0);
    pdl_entry();
    using Fm = GemvFmt<F>;
    using Ly = GemvAsyncLayout<F>;
    constexpr int D = 2;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const Mat& w = a.w;
    const int64_t rows = w.rows, K = w.cols;
    const int units = (int)w.gpr;
    const int64_t row0 = (int64_t)blockIdx.x * 16;
    __shared__ __align__(16) uint8_t sm[NW][S][Ly::BYTES];
    auto rowc = [&](int r) { int64_t x = row0 + r; return x < rows ? x : rows - 1; };
    // copy duties of this lane for one stage: base chunks (rows g, g+8; 16-byte column t of
    // the 64 bytes of two groups), high bytes (q5: row `lane` < 16, 16 bytes; q6: row lane/2,
    // half lane&1), scales (row lane-16 for lanes 16..31, 4 bytes)
    const uint8_t* src_b0 = w.base + rowc(g) * w.base_row + t * 16;
    const uint8_t* src_b1 = w.base + rowc(g + 8) * w.base_row + t * 16;
    const uint8_t* src_h = nullptr;
    if (Ly::HB == 8 && lane < 16) src_h = w.high + rowc(lane) * w.high_row;
    if (Ly::HB == 16) src_h = w.high + rowc(lane >> 1) * w.high_row + (lane & 1) * 16;
    const uint8_t* src_s = lane >= 16 ? w.scale + rowc(lane - 16) * w.scale_row : nullptr;
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(&sm[warp][0][0]);
    const uint32_t dst_b0 = g * Ly::RS_B + t * 16, dst_b1 = (g + 8) * Ly::RS_B + t * 16;
    const uint32_t dst_h = Ly::HB == 8 ? Ly::OFF_H + lane * 16 : Ly::OFF_H + (lane >> 1) * 32 + (lane & 1) * 16;
    const uint32_t dst_s = Ly::OFF_S + (lane - 16) * 4;

    const int n_it = warp * D < units ? (units - warp * D + NW * D - 1) / (NW * D) : 0;
    auto issue = [&](int it) {
        const int ub = (it * NW + warp) * D;
        const uint32_t slot = sbase + (it % S) * Ly::BYTES;
        cp_async16(slot + dst_b0, src_b0 + (size_t)ub * 32);
        cp_async16(slot + dst_b1, src_b1 + (size_t)ub * 32);
        if (Ly::HB == 16 || (Ly::HB == 8 && lane < 16)) cp_async16(slot + dst_h, src_h + (size_t)ub * Ly::HB);
        if (lane >= 16) cp_async4(slot + dst_s, src_s + (size_t)ub * 2);
    };
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < n_it) issue(s);
        cp_async_commit();
    }
    const bool xcol = g < a.C;
    const bf16_t* xq = a.x + (int64_t)(xcol ? g : 0) * a.ldx + t * Fm::LPT;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int it = 0; it < n_it; it++) {
        cp_async_wait<S - 2>();
        __syncwarp();
        const uint8_t* st = &sm[warp][it % S][0];
        uint32_t raw[D][2][Fm::RAW];
        gemv_stage_read<F>(raw, st, g, t);
        const int ub = (it * NW + warp) * D;
        gemv_compute<F, D, true>(raw, acc, xq, xcol, ub, units, t, K);
        if (it + S - 1 < n_it) issue(it + S - 1);
        cp_async_commit();
    }
    cp_async_wait<0>();
    gemv_epilogue<NW>(a, acc, row0, warp, lane);
}
// the async kernel with x staged once per block in shared memory, in b-fragment order, with
// the per-group sums of x the offset trick needs. in the kernels above the x side of a group
// (two global loads, 8 byte permutes, 4 mma for sum(x)) and the copy addresses recomputed per
// stage were ~40% of the instructions (sass of the q4 async kernel: 245 per 2-group stage,
// of which 16 prmt, 8 sum mma, 12 constant moves, ~45 address ops), and the kernel is
// issue-bound. here a group's x is two 16-byte shared loads plus one 8-byte load of its sums,
// and a stage's copies advance four pointers by constants. the block's first S-1 weight stages
// are issued before x is staged, so the two latencies overlap.
// shared memory (dynamic): the weight stages, then x (gemv_xs_bytes): [C][units][4 t][W]
// words (W = gemv_xs_words: 2 * STEPS b words per thread and group), then sums [units][8]
// fp32 (columns >= C are never written: they feed only accumulator columns the epilogue drops).
__host__ __device__ constexpr int gemv_xs_words(int f) { return 2 * (f == FMT_W8 ? GemvFmt<FMT_W8>::STEPS : GemvFmt<FMT_Q4>::STEPS); }
static size_t gemv_xs_bytes(NumFormat f, int units, int C) {
    return (size_t)C * units * 4 * gemv_xs_words(f) * 4 + (size_t)units * 8 * 4;
}
template <int F> static size_t gemv_xs_smem(int NW, int S, size_t xsb, int RT = 1) { return (size_t)RT * NW * S * GemvAsyncLayout<F>::BYTES + xsb; }
enum { GEMV_XS_SMEM_MAX = 160 * 1024 };  // the opt-in (the largest variant: 8 warps x 3 q6 stages + x)
// RT > 1: RT row tiles of NW warps each share one staged x (rt_ok: the staged x is then read
// from l2 once per RT tiles, which is what several columns need; each tile sums exactly as a
// one-tile block does, so RT never changes a bit of y).
template <int F, int NW, int S, int MINB, int RT = 1>
__global__ void __launch_bounds__(RT * NW * 32, MINB) gemv_xs_kernel(GemvArgs a) {
    using Fm = GemvFmt<F>;
    using Ly = GemvAsyncLayout<F>;
    constexpr int D = 2, W = gemv_xs_words(F);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wt = warp % NW;  // the warp within its row tile
    const Mat& w = a.w;
    const int64_t rows = w.rows;
    const int units = (int)w.gpr, C = a.C;
    const int64_t rowb = (int64_t)blockIdx.x * RT * 16, row0 = rowb + (int64_t)(warp / NW) * 16;
    extern __shared__ __align__(16) uint8_t xs_smem[];  // the weight stages [RT*NW][S][BYTES], then x
    uint8_t* sm_w = xs_smem + (size_t)warp * S * Ly::BYTES;
    uint32_t* xs = (uint32_t*)(xs_smem + RT * NW * S * Ly::BYTES);  // [C][units][4][W] words, then sums
    float* xsum = (float*)(xs + (size_t)C * units * 4 * W);
    auto rowc = [&](int r) { int64_t x = row0 + r; return x < rows ? x : rows - 1; };

    // this lane's copy duties (as in gemv_async_kernel), as pointers that move by a constant
    const uint8_t* src_b0 = w.base + rowc(g) * w.base_row + t * 16 + (size_t)wt * D * 32;
    const uint8_t* src_b1 = w.base + rowc(g + 8) * w.base_row + t * 16 + (size_t)wt * D * 32;
    const uint8_t* src_h = nullptr;
    if (Ly::HB == 8) src_h = w.high + rowc(lane & 15) * w.high_row + (size_t)wt * D * Ly::HB;
    if (Ly::HB == 16) src_h = w.high + rowc(lane >> 1) * w.high_row + (lane & 1) * 16 + (size_t)wt * D * Ly::HB;
    const uint8_t* src_s = w.scale + rowc(lane & 15) * w.scale_row + (size_t)wt * D * 2;
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(sm_w);
    const uint32_t dst_b0 = g * Ly::RS_B + t * 16, dst_b1 = (g + 8) * Ly::RS_B + t * 16;
    const uint32_t dst_h = Ly::HB == 8 ? Ly::OFF_H + lane * 16 : Ly::OFF_H + (lane >> 1) * 32 + (lane & 1) * 16;
    const uint32_t dst_s = Ly::OFF_S + (lane - 16) * 4;
    const int n_it = wt * D < units ? (units - wt * D + NW * D - 1) / (NW * D) : 0;
    uint32_t wslot = 0;  // byte offset of the stage slot the next copies go to
    auto issue = [&]() {
        const uint32_t slot = sbase + wslot;
        cp_async16(slot + dst_b0, src_b0);
        cp_async16(slot + dst_b1, src_b1);
        if (Ly::HB == 16 || (Ly::HB == 8 && lane < 16)) cp_async16(slot + dst_h, src_h);
        if (lane >= 16) cp_async4(slot + dst_s, src_s);
        src_b0 += NW * D * 32; src_b1 += NW * D * 32; src_s += NW * D * 2;
        if (Ly::HB) src_h += NW * D * Ly::HB;
        wslot = wslot + Ly::BYTES == S * Ly::BYTES ? 0 : wslot + Ly::BYTES;
    };
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < n_it) issue();
        cp_async_commit();
    }
    pdl_entry();  // weights are never written: only x and y wait for the previous kernel

    // rmsnorm'd x: each column's 1 / rms first (the same fp32 math as rmsnorm_kernel; the sum
    // runs in another order, so a bf16 of x can differ in the last place now and then). the
    // first tile's threads sum, as a one-tile block's do (the others add zeros: the same bits)
    __shared__ float inv_rms[GEMV_MAX_COLS];
    if (a.xmode == GEMV_X_RMS) {
        const int K = (int)w.cols;
        for (int c = 0; c < C; c++) {
            const bf16_t* xc = a.x + (int64_t)c * a.ldx;
            float ss = 0.f;
            for (int k = threadIdx.x * 8; k < K && threadIdx.x < NW * 32; k += NW * 32 * 8) {
                uint4 v = __ldg((const uint4*)(xc + k));
                const bf16_t* e = (const bf16_t*)&v;
#pragma unroll
                for (int j = 0; j < 8; j++) ss += bf2f(e[j]) * bf2f(e[j]);
            }
            ss = block_sum(ss);
            if (threadIdx.x == 0) inv_rms[c] = rsqrtf(ss / (float)K + a.eps);
        }
        __syncthreads();
    }

    // stage x: entry (c, u, t) = the thread t's lanes of group u of column c, permuted into the
    // b words of its steps; the quad of t's sums its lanes for the group's sum(x)
    const int n_x = C * units * 4;
    for (int i0 = 0; i0 < n_x; i0 += RT * NW * 32) {
        const int i = i0 + threadIdx.x;
        float part = 0.f;
        if (i < n_x) {
            const int tt = i & 3, cu = i >> 2, c = cu / units, u = cu - c * units;
            const int64_t k0 = (int64_t)u * Fm::G + tt * Fm::LPT;
            const bf16_t* src = a.x + (int64_t)c * a.ldx + k0;
            uint4 xr[2];
#pragma unroll
            for (int q = 0; q < 2; q++) {
                if (q * 8 >= Fm::LPT) { xr[q] = make_uint4(0, 0, 0, 0); continue; }
                uint4 v = __ldg((const uint4*)src + q);
                if (a.xmode != GEMV_X_PLAIN) {
                    bf16_t* e = (bf16_t*)&v;
                    if (a.xmode == GEMV_X_RMS) {
                        uint4 wv = __ldg((const uint4*)(a.xw + k0) + q);
                        const bf16_t* we = (const bf16_t*)&wv;
#pragma unroll
                        for (int j = 0; j < 8; j++) e[j] = f2bf(bf2f(e[j]) * inv_rms[c] * (1.f + bf2f(we[j])));
                    } else {
                        uint4 uv = __ldg((const uint4*)(src + w.cols) + q);
                        const bf16_t* ue = (const bf16_t*)&uv;
#pragma unroll
                        for (int j = 0; j < 8; j++) e[j] = f2bf(bfround(silu_f(bf2f(e[j]))) * bf2f(ue[j]));
                    }
                }
                xr[q] = v;
            }
            uint32_t bw[W];
#pragma unroll
            for (int s = 0; s < Fm::STEPS; s++) gemv_xfrag<F>(xr, s, bw[2 * s], bw[2 * s + 1]);
            uint4* dst = (uint4*)(xs + (size_t)i * W);
#pragma unroll
            for (int q = 0; q < W / 4; q++) dst[q] = make_uint4(bw[4 * q], bw[4 * q + 1], bw[4 * q + 2], bw[4 * q + 3]);
            const bf16_t* xe = (const bf16_t*)xr;
#pragma unroll
            for (int j = 0; j < Fm::LPT; j++) part += bf2f(xe[j]);
        }
        part += __shfl_xor_sync(0xffffffffu, part, 1);
        part += __shfl_xor_sync(0xffffffffu, part, 2);
        if (i < n_x && (i & 3) == 0) { const int cu = i >> 2, c = cu / units; xsum[(cu - c * units) * 8 + c] = part; }
    }
    __syncthreads();

    const bool xcol = g < C;
    const uint32_t* xw = xs + (size_t)(xcol ? g : 0) * units * 4 * W + t * W;  // + u * 4 * W
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    uint32_t rslot = 0;
    int ub = wt * D;
    for (int it = 0; it < n_it; it++, ub += NW * D) {
        cp_async_wait<S - 2>();
        __syncwarp();
        const uint8_t* st = sm_w + rslot;
        rslot = rslot + Ly::BYTES == S * Ly::BYTES ? 0 : rslot + Ly::BYTES;
        uint32_t raw[D][2][Fm::RAW];
        gemv_stage_read<F>(raw, st, g, t);
#pragma unroll
        for (int d = 0; d < D; d++) {
            uint32_t b[Fm::STEPS][2];
            if (xcol) {
                const uint4* p = (const uint4*)(xw + (size_t)(ub + d) * 4 * W);
#pragma unroll
                for (int q = 0; q < W / 4; q++) {
                    uint4 v = p[q];
                    b[2 * q][0] = v.x; b[2 * q][1] = v.y;
                    if (2 * q + 1 < Fm::STEPS) { b[2 * q + 1][0] = v.z; b[2 * q + 1][1] = v.w; }
                }
            } else {
#pragma unroll
                for (int s = 0; s < Fm::STEPS; s++) b[s][0] = b[s][1] = 0;
            }
            const float2 sv = *(const float2*)(xsum + (ub + d) * 8 + 2 * t);
            const float sx[4] = {sv.x, sv.y, sv.x, sv.y};
            gemv_group<F>(raw[d], acc, b, sx);
        }
        if (it + S - 1 < n_it) issue();
        cp_async_commit();
    }
    pdl_release();  // the next kernel's blocks may take the sms this grid leaves
    cp_async_wait<0>();
    gemv_epilogue<NW, RT>(a, acc, rowb, warp, lane);
}

// ---- wide products: more columns than the staged x of gemv_xs_kernel holds ------------------
// a batched decode step runs up to 64 columns (one per lane) through each matrix. in launches
// of <= 8 columns every launch streams all the weights again; the wide kernel (gemv_xp_kernel,
// below) converts a weight fragment once and runs it against NT 8-column tiles (one mma chain
// per tile), so one pass over the weights serves all the columns. the bits: a tile's columns see
// exactly the arithmetic of the x-staged kernel of the same NW (the same warp split of k, D = 2
// groups a stage in the same order, per group dd = mma chain from zero, the offset fma, acc =
// fma(scale, dd, acc), the warps meeting in order v = 0..NW-1, the same staged x and sums, and
// the same 1 / rms from the same reduction tree), and the mma columns are independent: column c
// of a C-column product is bit for bit its one-column product. the pipeline depth S and the row
// tiles a warp RW change no bit (each tile's warps sum as a one-tile block's, the A fragments of
// its rows against the same b fragments).
enum { GEMV_WIDE_COLS = 64 };                  // columns per launch (NT <= 8 tiles)
static int g_gemv_ychunks = 1;                 // the register and async kernels: 1 one launch of up to 64 columns, 0 launches of 8

// the A fragments of one group (rows g, g+8), converted once for all the column tiles: q
// formats STEPS x 4 pairs in mma order; w8 the lo pairs then the hi pairs (2 * STEPS x 4)
template <int F> struct GemvWideA { static constexpr int N = F == FMT_W8 ? 2 * GemvFmt<F>::STEPS : GemvFmt<F>::STEPS; };
template <int F>
__device__ __forceinline__ void gemv_afrag(const uint32_t (&raw)[2][GemvFmt<F>::RAW], uint32_t (&A)[GemvWideA<F>::N][4]) {
    using Fm = GemvFmt<F>;
    const uint32_t (&r0)[Fm::RAW] = raw[0];
    const uint32_t (&r1)[Fm::RAW] = raw[1];
    if constexpr (F == FMT_W8) {
#pragma unroll
        for (int s = 0; s < Fm::STEPS; s++) {
            gemv_pair_w8(r0[s], 0, A[s][0], A[Fm::STEPS + s][0]);
            gemv_pair_w8(r1[s], 0, A[s][1], A[Fm::STEPS + s][1]);
            gemv_pair_w8(r0[s], 1, A[s][2], A[Fm::STEPS + s][2]);
            gemv_pair_w8(r1[s], 1, A[s][3], A[Fm::STEPS + s][3]);
        }
    } else {
        uint32_t hs[2][2];
#pragma unroll
        for (int h = 0; h < 2; h++) gemv_spread_high<F>((h ? r1 : r0)[2], hs[h][0], hs[h][1]);
#pragma unroll
        for (int s = 0; s < Fm::STEPS; s++) {
            A[s][0] = gemv_pair<F>(r0, hs[0][0], hs[0][1], 2 * s);
            A[s][1] = gemv_pair<F>(r1, hs[1][0], hs[1][1], 2 * s);
            A[s][2] = gemv_pair<F>(r0, hs[0][0], hs[0][1], 2 * s + 1);
            A[s][3] = gemv_pair<F>(r1, hs[1][0], hs[1][1], 2 * s + 1);
        }
    }
}
// one column tile of one group: gemv_group's arithmetic on converted fragments
template <int F>
__device__ __forceinline__ void gemv_tile(const uint32_t (&A)[GemvWideA<F>::N][4], float s0, float s1, float (&acc)[4],
                                          const uint32_t (&b)[GemvFmt<F>::STEPS][2], const float (&sx)[4]) {
    using Fm = GemvFmt<F>;
    float dd[4] = {0.f, 0.f, 0.f, 0.f};
    if constexpr (F == FMT_W8) {
        float dh[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int s = 0; s < Fm::STEPS; s++) {
            mma_bf16_16816(dd, A[s][0], A[s][1], A[s][2], A[s][3], b[s][0], b[s][1]);
            mma_bf16_16816(dh, A[Fm::STEPS + s][0], A[Fm::STEPS + s][1], A[Fm::STEPS + s][2], A[Fm::STEPS + s][3], b[s][0], b[s][1]);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) dd[j] = fmaf(16.f, dh[j], fmaf(-2304.f, sx[j & 1], dd[j]));
    } else {
#pragma unroll
        for (int s = 0; s < Fm::STEPS; s++) mma_bf16_16816(dd, A[s][0], A[s][1], A[s][2], A[s][3], b[s][0], b[s][1]);
#pragma unroll
        for (int j = 0; j < 4; j++) dd[j] = fmaf(-GemvOffset<F>::v, sx[j & 1], dd[j]);
    }
    acc[0] = fmaf(s0, dd[0], acc[0]);
    acc[1] = fmaf(s0, dd[1], acc[1]);
    acc[2] = fmaf(s1, dd[2], acc[2]);
    acc[3] = fmaf(s1, dd[3], acc[3]);
}

// the prepared x: one small kernel (gemv_xprep_kernel) writes x once per product in b-fragment
// order with its per-group sums, exactly the entries gemv_xs_kernel stages (the same transform,
// the same 1 / rms tree: one block of the matrix's NW warps a column, and the same quad sums),
// and the product's warps read their fragments from there (l1 / l2 hits) with no shared x and
// no barrier: blocks of one warp set, several an sm, each warp streaming its weights through
// cp.async stages as gemv_xs_kernel's (a version that staged x in k-slices in every block, one
// block an sm, measured 1.7x slower at 16 columns: test/bench-notes.md, issue 14).
// layout: xp [units][cp][NQ4][4 t] uint4 (NQ4 = W / 4: the thread's b words of a group), so a
// warp's load of one q covers 64 contiguous bytes a column; sums xps [units][cp] fp32; cp = C
// rounded up to 8 (the tile loads read whole 8-column tiles; columns >= C are masked).
enum { GEMV_XP_STREAMS = 8,          // streams with a reserved buffer (the engine's two, tests')
       GEMV_XP_MAX_K = 32768 };      // the longest rows the buffer holds at GEMV_WIDE_COLS columns
static int g_gemv_xp_rw = 2;         // row tiles a warp where the grid allows (1 or 2)
static int g_gemv_xp_cols = 32;      // the most columns a block (8, 16, 32 or 64; RW 2 at most 32)
static int g_gemv_xp_blocks = 132;   // blocks the launch aims at before it shrinks column groups / row tiles
// past 32 columns, products of at least this many weights (rows x k; 0: none) take 4 row tiles
// a warp where that leaves 96 blocks: each warp's x words then serve 64 rows, half the x
// traffic (h200, 64 columns: 9b gate_up 91.2 -> 77.4 us, down 59.8 -> 53.3, head 1051 -> 950,
// value_z 39.0 -> 34.8; the 4096 x 4096 products slower, 21.0 -> 25.9: test/bench-notes.md,
// issue 14)
static int64_t g_gemv_xp_rw4_min = (int64_t)32 << 20;
// from how many columns the prepared x takes a product that the x-staged kernel could: products
// with a fused transform from 1 (its prep computes 1 / rms once, where the x-staged kernel's
// blocks each sum it), plain ones from 2 (h200, the 9b chain, bench-notes issue 14: fused C = 1
// 3.09 -> 2.82 ms, tg128 306 -> 323 tok/s; plain C = 1 2.84 either way, C = 2 2.94 -> 2.85,
// C = 4 2.99 -> 2.90)
static int g_gemv_xp_from = 1, g_gemv_xp_plain_from = 2;
// what a buffer holds: the prep that wrote it last (the product's x, transform, k, b-word
// layout and 1 / rms tree); a product whose caller says its x is the previous product's
// (GemvX::again) reads it as it is when its own prep would write the same bits
struct GemvXpKey {
    const bf16_t* x; int ldx, C, xmode; const bf16_t* xw; float eps; int64_t k; bool w8; int nw; const bf16_t* xz; int ldz;
    bool operator==(const GemvXpKey& o) const {
        return x == o.x && ldx == o.ldx && C == o.C && xmode == o.xmode && xw == o.xw && eps == o.eps && k == o.k && w8 == o.w8 &&
               nw == o.nw && xz == o.xz && ldz == o.ldz;
    }
};
struct GemvXpBuf { cudaStream_t s; uint8_t* p; bool used; bool held; GemvXpKey key; };
static GemvXpBuf g_gemv_xpbuf[GEMV_XP_STREAMS];
static size_t gemv_xp_buf_bytes() {
    // the larger of the group sizes' needs: q formats 128 bytes a (unit, column) over k / 64
    // units, w8 64 bytes over k / 32; then the sums (k / 32 units at most)
    const size_t units = GEMV_XP_MAX_K / 32, cols = GEMV_WIDE_COLS;
    return units * cols * 64 + units * cols * 4;
}
// a buffer for the wide products launched on stream s (once per stream, before any capture:
// a capture must not allocate); gemv_xp_release gives it back when the stream goes
static void gemv_xp_reserve(cudaStream_t s) {
    for (auto& b : g_gemv_xpbuf) if (b.used && b.s == s) return;
    for (auto& b : g_gemv_xpbuf)
        if (!b.used) {
            if (!b.p) cudaCheck(cudaMalloc(&b.p, gemv_xp_buf_bytes()));
            b.s = s; b.used = true; b.held = false;
            return;
        }
    CHECK(false, "gemv: more than %d streams with a prepared-x buffer", (int)GEMV_XP_STREAMS);
}
static void gemv_xp_release(cudaStream_t s) {
    for (auto& b : g_gemv_xpbuf) if (b.used && b.s == s) b.used = false;  // the memory stays for the next stream
}
static GemvXpBuf& gemv_xp_buffer(cudaStream_t s) {
    for (auto& b : g_gemv_xpbuf) if (b.used && b.s == s) return b;
    CHECK(false, "gemv: a wide product on a stream with no prepared-x buffer (gemv_xp_reserve)");
    return g_gemv_xpbuf[0];
}
// a product on stream s that is not a wide one: the next wide product is not "the previous one's"
static void gemv_xp_forget(cudaStream_t s) {
    for (auto& b : g_gemv_xpbuf) if (b.used && b.s == s) b.held = false;
}

// GEMV_X_GATED: 1 / rms of the 128-wide head whose LPT entries this thread holds (xr), bit for
// bit gated_rmsnorm_kernel's: its sum of squares (each 32-entry slice's shuffle tree, then
// (w0 + w2) + (w1 + w3) of the slices, block_sum's over 128 threads of one entry) replayed on the head's
// 128 / LPT consecutive threads of the warp, an entry's partner at offset m a thread m / LPT
// away (m >= LPT) or in the thread's own entries
enum { GEMV_GATED_N = 128 };
template <int LPT>
__device__ __forceinline__ float gemv_gated_inv(const uint4 (&xr)[2], float eps) {
    static_assert(GEMV_GATED_N % LPT == 0 && 32 % LPT == 0, "gated norm: whole heads of whole threads");
    const bf16_t* e = (const bf16_t*)xr;
    float sq[LPT];
#pragma unroll
    for (int j = 0; j < LPT; j++) { const float v = bf2f(e[j]); sq[j] = v * v; }
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) {
        if (m >= LPT) {
#pragma unroll
            for (int j = 0; j < LPT; j++) sq[j] += __shfl_xor_sync(0xffffffffu, sq[j], m / LPT);
        } else {
            float t[LPT];
#pragma unroll
            for (int j = 0; j < LPT; j++) t[j] = sq[j] + sq[j ^ m];
#pragma unroll
            for (int j = 0; j < LPT; j++) sq[j] = t[j];
        }
    }
    constexpr int TPW = 32 / LPT;  // threads a 32-entry slice
    float ss = sq[0];
    ss += __shfl_xor_sync(0xffffffffu, ss, 2 * TPW);
    ss += __shfl_xor_sync(0xffffffffu, ss, TPW);
    return rsqrtf(ss / (float)GEMV_GATED_N + eps);
}

// grid (C, chunks): block (c, y) prepares column c's entries [y * blockDim.x, ...) step
// chunks * blockDim.x; blockDim.x = NW * 32 of the matrix's x-staged kernel, so block_sum is
// that kernel's 1 / rms tree (its threads >= NW * 32 add zeros: the same bits)
template <int F, bool GATED>
__global__ void __launch_bounds__(256) gemv_xprep_kernel(GemvArgs a, uint4* xp, float* xps, int cp) {
    using Fm = GemvFmt<F>;
    constexpr int W = gemv_xs_words(F), NQ4 = W / 4;
    const int c = blockIdx.x, units = (int)a.w.gpr, K = (int)a.w.cols;
    const bf16_t* xc = a.x + (int64_t)c * a.ldx;
    pdl_entry_small();  // x is the previous kernel's output; xp may be what the previous product read
    float inv = 0.f;
    if (a.xmode == GEMV_X_RMS) {
        float ss = 0.f;
        for (int k = threadIdx.x * 8; k < K; k += blockDim.x * 8) {
            uint4 v = __ldg((const uint4*)(xc + k));
            const bf16_t* e = (const bf16_t*)&v;
#pragma unroll
            for (int j = 0; j < 8; j++) ss += bf2f(e[j]) * bf2f(e[j]);
        }
        ss = block_sum(ss);
        inv = rsqrtf(ss / (float)K + a.eps);
    }
    const int n_x = units * 4;
    for (int i0 = blockIdx.y * blockDim.x; i0 < n_x; i0 += gridDim.y * blockDim.x) {
        const int i = i0 + threadIdx.x, tt = i & 3, u = i >> 2;
        const bool live = i < n_x;
        const int64_t k0 = (int64_t)u * Fm::G + tt * Fm::LPT;
        const bf16_t* src = xc + k0;
        uint4 xr[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
#pragma unroll
        for (int q = 0; q < 2; q++)
            if (live && q * 8 < Fm::LPT) xr[q] = __ldg((const uint4*)src + q);
        if constexpr (GATED) {  // every lane: the head's sum of squares is a shuffle tree
            const float ginv = gemv_gated_inv<Fm::LPT>(xr, a.eps);
            const bf16_t* zc = a.xz + (int64_t)c * a.ldz + k0;
            const bf16_t* gw = a.xw + (k0 & (GEMV_GATED_N - 1));
#pragma unroll
            for (int q = 0; q < 2; q++) {
                if (!live || q * 8 >= Fm::LPT) continue;
                const uint4 zv = __ldg((const uint4*)zc + q), wv = __ldg((const uint4*)gw + q);
                bf16_t* e = (bf16_t*)&xr[q];
                const bf16_t* ze = (const bf16_t*)&zv;
                const bf16_t* we = (const bf16_t*)&wv;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float nrm = bfround(bf2f(e[j]) * ginv);
                    const float pw = bfround(bf2f(we[j]) * nrm);
                    e[j] = f2bf(pw * silu_f(bf2f(ze[j])));
                }
            }
        }
        float part = 0.f;
        if (live) {
#pragma unroll
            for (int q = 0; q < 2; q++) {
                if (q * 8 >= Fm::LPT) continue;
                bf16_t* e = (bf16_t*)&xr[q];
                if (a.xmode == GEMV_X_RMS) {
                    const uint4 wv = __ldg((const uint4*)(a.xw + k0) + q);
                    const bf16_t* we = (const bf16_t*)&wv;
#pragma unroll
                    for (int j = 0; j < 8; j++) e[j] = f2bf(bf2f(e[j]) * inv * (1.f + bf2f(we[j])));
                } else if (a.xmode == GEMV_X_SWIGLU) {
                    const uint4 uv = __ldg((const uint4*)(src + K) + q);
                    const bf16_t* ue = (const bf16_t*)&uv;
#pragma unroll
                    for (int j = 0; j < 8; j++) e[j] = f2bf(bfround(silu_f(bf2f(e[j]))) * bf2f(ue[j]));
                }
            }
            uint32_t bw[W];
#pragma unroll
            for (int s = 0; s < Fm::STEPS; s++) gemv_xfrag<F>(xr, s, bw[2 * s], bw[2 * s + 1]);
            uint4* dst = xp + ((size_t)u * cp + c) * NQ4 * 4 + tt;
#pragma unroll
            for (int q = 0; q < NQ4; q++) dst[q * 4] = make_uint4(bw[4 * q], bw[4 * q + 1], bw[4 * q + 2], bw[4 * q + 3]);
            const bf16_t* xe = (const bf16_t*)xr;
#pragma unroll
            for (int j = 0; j < Fm::LPT; j++) part += bf2f(xe[j]);
        }
        part += __shfl_xor_sync(0xffffffffu, part, 1);
        part += __shfl_xor_sync(0xffffffffu, part, 2);
        if (live && tt == 0) xps[(size_t)u * cp + c] = part;
    }
}

// one group d of a stage for the thread's rows g, g+8 (gemv_stage_read's reads, a group at a time)
template <int F>
__device__ __forceinline__ void gemv_stage_group(uint32_t (&raw)[2][GemvFmt<F>::RAW], const uint8_t* st, int d, int g, int t) {
    using Ly = GemvAsyncLayout<F>;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        uint2 v = *(const uint2*)(st + r * Ly::RS_B + d * 32 + t * 8);
        raw[h][0] = v.x; raw[h][1] = v.y;
        if constexpr (F == FMT_Q5) raw[h][2] = *(const unsigned short*)(st + Ly::OFF_H + r * Ly::RS_H + d * 8 + t * 2);
        else if constexpr (F == FMT_Q6) raw[h][2] = *(const uint32_t*)(st + Ly::OFF_H + r * Ly::RS_H + d * 16 + t * 4);
        else raw[h][2] = 0;
        raw[h][3] = *(const unsigned short*)(st + Ly::OFF_S + r * Ly::RS_S + d * 2);
    }
}

// a warp's weight stream in the wide kernel: gemv_xp_kernel's copy duties for its RW row tiles
// from row0 (split `warp` of NW, D = 2 groups a stage) into its ring of S stages at sm
template <int F, int NW, int RW, int S> struct XpWeights {
    using Ly = GemvAsyncLayout<F>;
    static constexpr int D = 2, SB = RW * Ly::BYTES;
    const uint8_t *b0[RW], *b1[RW], *h[RW], *sc[RW];
    uint32_t base, d_b0, d_b1, d_h, d_s, slot = 0;
    int lane;
    __device__ __forceinline__ XpWeights(const Mat& w, int64_t row0, int warp, int lane_, uint8_t* sm) : lane(lane_) {
        const int g = lane >> 2, t = lane & 3;
        auto rowc = [&](int r) { int64_t x = row0 + r; return x < w.rows ? x : w.rows - 1; };
#pragma unroll
        for (int r = 0; r < RW; r++) {
            b0[r] = w.base + rowc(16 * r + g) * w.base_row + t * 16 + (size_t)warp * D * 32;
            b1[r] = w.base + rowc(16 * r + g + 8) * w.base_row + t * 16 + (size_t)warp * D * 32;
            h[r] = nullptr;
            if (Ly::HB == 8) h[r] = w.high + rowc(16 * r + (lane & 15)) * w.high_row + (size_t)warp * D * Ly::HB;
            if (Ly::HB == 16) h[r] = w.high + rowc(16 * r + (lane >> 1)) * w.high_row + (lane & 1) * 16 + (size_t)warp * D * Ly::HB;
            sc[r] = w.scale + rowc(16 * r + (lane & 15)) * w.scale_row + (size_t)warp * D * 2;
        }
        base = (uint32_t)__cvta_generic_to_shared(sm);
        d_b0 = g * Ly::RS_B + t * 16; d_b1 = (g + 8) * Ly::RS_B + t * 16;
        d_h = Ly::HB == 8 ? Ly::OFF_H + lane * 16 : Ly::OFF_H + (lane >> 1) * 32 + (lane & 1) * 16;
        d_s = Ly::OFF_S + (lane - 16) * 4;
    }
    // the copies of the next stage into the next slot
    __device__ __forceinline__ void issue() {
#pragma unroll
        for (int r = 0; r < RW; r++) {
            const uint32_t st = base + slot + r * Ly::BYTES;
            cp_async16(st + d_b0, b0[r]);
            cp_async16(st + d_b1, b1[r]);
            if (Ly::HB == 16 || (Ly::HB == 8 && lane < 16)) cp_async16(st + d_h, h[r]);
            if (lane >= 16) cp_async4(st + d_s, sc[r]);
            b0[r] += NW * D * 32; b1[r] += NW * D * 32; sc[r] += NW * D * 2;
            if (Ly::HB) h[r] += NW * D * Ly::HB;
        }
        slot = slot + SB == S * SB ? 0 : slot + SB;
    }
};

// one warp set of NW warps a block, RW row tiles a warp, NT 8-column tiles of the block's
// column group (block b: row set b / groups, columns [cg * (b % groups), + cg)). dynamic shared
// memory: the weight stages [NW][S][RW][BYTES]; after the main loop the partial sums
// [RW][NW][NT][32] float4 reuse it.
// the body of block bid (gemv_xp_kernel: blockIdx.x; a pair's launch, gemv_xp2_kernel: its
// block within its matrix's blocks). WS: the warp's weight stream (XpWeights)
template <int F, int NW, int NT, int RW, int S, class WS = XpWeights<F, NW, RW, S>>
__device__ __forceinline__ void gemv_xp_block(GemvArgs a, const uint4* __restrict__ xp, const float* __restrict__ xps, int cp,
                                              int cg, int groups, unsigned bid) {
    const int64_t rset = bid / groups;
    const int c0 = (int)(bid % groups) * cg;
    a.y = a.y_f32 ? (void*)((float*)a.y + (int64_t)c0 * a.ldy) : (void*)((bf16_t*)a.y + (int64_t)c0 * a.ldy);
    if (a.resid) a.resid += (int64_t)c0 * a.ldr;
    a.C = a.C - c0 < cg ? a.C - c0 : cg;
    if (a.C <= 0) return;  // never taken (groups = ceil(C / cg)), but ptxas builds the measured sass from it
    using Fm = GemvFmt<F>;
    using Ly = GemvAsyncLayout<F>;
    constexpr int D = 2, W = gemv_xs_words(F), NQ4 = W / 4, SB = RW * Ly::BYTES;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const Mat& w = a.w;
    const int64_t rows = w.rows;
    const int units = (int)w.gpr, C = a.C;
    const int64_t row0 = rset * RW * 16;
    extern __shared__ __align__(16) uint8_t xp_smem[];
    uint8_t* sm_w = xp_smem + (size_t)warp * S * SB;
    WS ws(w, row0, warp, lane, sm_w);  // this lane's copy duties (XpWeights: as gemv_xs_kernel's)
    const int n_it = warp * D < units ? (units - warp * D + NW * D - 1) / (NW * D) : 0;
    auto issue = [&]() { ws.issue(); };
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < n_it) issue();
        cp_async_commit();
    }
    pdl_entry();  // the weights are never written: only the prepared x waits

    // this lane's b words: column c0 + 8 nt + g, thread t (+ u * cp * NQ4 * 4 uint4)
    const uint4* xl = xp + ((size_t)(c0 + g) * NQ4) * 4 + t;
    const float* sl = xps + c0 + 2 * t;
    float acc[RW][NT][4];
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[r][nt][0] = acc[r][nt][1] = acc[r][nt][2] = acc[r][nt][3] = 0.f;
    uint32_t rslot = 0;
    int ub = warp * D;
    for (int it = 0; it < n_it; it++, ub += NW * D) {
        cp_async_wait<S - 2>();
        __syncwarp();
        const uint8_t* st = sm_w + rslot;
        rslot = rslot + SB == S * SB ? 0 : rslot + SB;
        // the copies of stage it + S - 1 go to the slot stage it - 1 was read from (every lane
        // is past it: the wait's __syncwarp), so they fly while this stage is computed
        if (it + S - 1 < n_it) issue();
        cp_async_commit();
#pragma unroll
        for (int d = 0; d < D; d++) {
            const int u = ub + d;
            const uint4* xu = xl + (size_t)u * cp * NQ4 * 4;
            const float* su = sl + (size_t)u * cp;
            uint32_t A[RW][GemvWideA<F>::N][4];
            float s0[RW], s1[RW];
#pragma unroll
            for (int r = 0; r < RW; r++) {
                uint32_t raw[2][Fm::RAW];
                gemv_stage_group<F>(raw, st + r * Ly::BYTES, d, g, t);
                gemv_afrag<F>(raw, A[r]);
                s0[r] = f16bits2f(raw[0][3]); s1[r] = f16bits2f(raw[1][3]);
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint4 v[NQ4];
                const bool live = nt * 8 + g < C;
#pragma unroll
                for (int q = 0; q < NQ4; q++) v[q] = live ? __ldg(xu + (size_t)nt * 8 * NQ4 * 4 + q * 4) : make_uint4(0, 0, 0, 0);
                const float2 sv = nt * 8 + 2 * t < C ? __ldg((const float2*)(su + nt * 8)) : make_float2(0.f, 0.f);
                const float sx[4] = {sv.x, sv.y, sv.x, sv.y};
                uint32_t b[Fm::STEPS][2];
#pragma unroll
                for (int q = 0; q < NQ4; q++) {
                    b[2 * q][0] = v[q].x; b[2 * q][1] = v[q].y;
                    if (2 * q + 1 < Fm::STEPS) { b[2 * q + 1][0] = v[q].z; b[2 * q + 1][1] = v[q].w; }
                }
#pragma unroll
                for (int r = 0; r < RW; r++) gemv_tile<F>(A[r], s0[r], s1[r], acc[r][nt], b, sx);
            }
        }
    }
    pdl_release();
    cp_async_wait<0>();
    __syncthreads();  // the partial sums take the shared memory over

    // the warps meet as gemv_epilogue's (per tile and column: s = 0, += warp v = 0..NW-1)
    float4* red = (float4*)xp_smem;  // [RW tiles][NW][NT][32]
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            red[((size_t)(r * NW + warp) * NT + nt) * 32 + lane] = make_float4(acc[r][nt][0], acc[r][nt][1], acc[r][nt][2], acc[r][nt][3]);
    __syncthreads();
    for (int idx = threadIdx.x; idx < RW * NT * 128; idx += blockDim.x) {
        const int i = idx / (NT * 128), nt = (idx >> 7) % NT, ln = (idx >> 2) & 31, j = idx & 3;
        float s = 0.f;
#pragma unroll
        for (int v = 0; v < NW; v++) s += ((const float*)&red[((size_t)(i * NW + v) * NT + nt) * 32 + ln])[j];
        const int64_t row = row0 + 16 * i + (ln >> 2) + (j >= 2 ? 8 : 0);
        const int col = nt * 8 + 2 * (ln & 3) + (j & 1);
        if (row < rows && col < C) gemv_store(a, row, col, s);
    }
}

// the wide kernel with each group's b words and sums loaded one group ahead (a register double
// buffer: group u + 1's x loads fly while group u's mmas run; gemv_xp_kernel loads a group's x
// from l1 / l2 right before its mmas), the same arithmetic operation for operation (its columns
// are gemv_xp_kernel's bits). the launcher takes it for blocks of 32 columns (4 tiles) with 1-2
// row tiles a warp, where it was faster (the 9b's products at 32 columns: 5.40 -> 5.25 ms a
// chain); at 8-16 columns it was slower, and with 4 row tiles its buffers spill (bench-notes,
// session 13).
template <int F, int NW, int NT, int RW, int S, class WS = XpWeights<F, NW, RW, S>>
__device__ __forceinline__ void gemv_xp_pf_block(GemvArgs a, const uint4* __restrict__ xp, const float* __restrict__ xps, int cp,
                                                 int cg, int groups, unsigned bid) {
    const int64_t rset = bid / groups;
    const int c0 = (int)(bid % groups) * cg;
    a.y = a.y_f32 ? (void*)((float*)a.y + (int64_t)c0 * a.ldy) : (void*)((bf16_t*)a.y + (int64_t)c0 * a.ldy);
    if (a.resid) a.resid += (int64_t)c0 * a.ldr;
    a.C = a.C - c0 < cg ? a.C - c0 : cg;
    if (a.C <= 0) return;
    using Fm = GemvFmt<F>;
    using Ly = GemvAsyncLayout<F>;
    constexpr int D = 2, W = gemv_xs_words(F), NQ4 = W / 4, SB = RW * Ly::BYTES;
    static_assert(D == 2, "the double buffer alternates within a stage's two groups");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const Mat& w = a.w;
    const int64_t rows = w.rows;
    const int units = (int)w.gpr, C = a.C;
    const int64_t row0 = rset * RW * 16;
    extern __shared__ __align__(16) uint8_t xp_smem[];
    uint8_t* sm_w = xp_smem + (size_t)warp * S * SB;
    WS ws(w, row0, warp, lane, sm_w);
    const int n_it = warp * D < units ? (units - warp * D + NW * D - 1) / (NW * D) : 0;
    auto issue = [&]() { ws.issue(); };
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < n_it) issue();
        cp_async_commit();
    }
    pdl_entry();
    const uint4* xl = xp + ((size_t)(c0 + g) * NQ4) * 4 + t;
    const float* sl = xps + c0 + 2 * t;
    // group u's b words and sums for every tile of the column group
    auto load_x = [&](int u, uint4 (&v)[NT][NQ4], float2 (&sv)[NT]) {
        const uint4* xu = xl + (size_t)u * cp * NQ4 * 4;
        const float* su = sl + (size_t)u * cp;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const bool live = nt * 8 + g < C;
#pragma unroll
            for (int q = 0; q < NQ4; q++) v[nt][q] = live ? __ldg(xu + (size_t)nt * 8 * NQ4 * 4 + q * 4) : make_uint4(0, 0, 0, 0);
            sv[nt] = nt * 8 + 2 * t < C ? __ldg((const float2*)(su + nt * 8)) : make_float2(0.f, 0.f);
        }
    };
    uint4 xv0[NT][NQ4], xv1[NT][NQ4];
    float2 xs0[NT], xs1[NT];
    if (n_it > 0) load_x(warp * D, xv0, xs0);
    float acc[RW][NT][4];
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[r][nt][0] = acc[r][nt][1] = acc[r][nt][2] = acc[r][nt][3] = 0.f;
    // one group's mmas from its x (v, sv), as the product's loop body
    auto group = [&](const uint8_t* st, int d, const uint4 (&v)[NT][NQ4], const float2 (&sv)[NT]) {
        uint32_t A[RW][GemvWideA<F>::N][4];
        float s0[RW], s1[RW];
#pragma unroll
        for (int r = 0; r < RW; r++) {
            uint32_t raw[2][Fm::RAW];
            gemv_stage_group<F>(raw, st + r * Ly::BYTES, d, g, t);
            gemv_afrag<F>(raw, A[r]);
            s0[r] = f16bits2f(raw[0][3]); s1[r] = f16bits2f(raw[1][3]);
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const float sx[4] = {sv[nt].x, sv[nt].y, sv[nt].x, sv[nt].y};
            uint32_t b[Fm::STEPS][2];
#pragma unroll
            for (int q = 0; q < NQ4; q++) {
                b[2 * q][0] = v[nt][q].x; b[2 * q][1] = v[nt][q].y;
                if (2 * q + 1 < Fm::STEPS) { b[2 * q + 1][0] = v[nt][q].z; b[2 * q + 1][1] = v[nt][q].w; }
            }
#pragma unroll
            for (int r = 0; r < RW; r++) gemv_tile<F>(A[r], s0[r], s1[r], acc[r][nt], b, sx);
        }
    };
    uint32_t rslot = 0;
    int ub = warp * D;
    for (int it = 0; it < n_it; it++, ub += NW * D) {
        cp_async_wait<S - 2>();
        __syncwarp();
        const uint8_t* st = sm_w + rslot;
        rslot = rslot + SB == S * SB ? 0 : rslot + SB;
        if (it + S - 1 < n_it) issue();
        cp_async_commit();
        load_x(ub + 1, xv1, xs1);                              // group ub + 1 flies while ub's mmas run
        group(st, 0, xv0, xs0);
        if (it + 1 < n_it) load_x(ub + NW * D, xv0, xs0);      // the next stage's first group
        group(st, 1, xv1, xs1);
    }
    pdl_release();
    cp_async_wait<0>();
    __syncthreads();
    float4* red = (float4*)xp_smem;
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            red[((size_t)(r * NW + warp) * NT + nt) * 32 + lane] = make_float4(acc[r][nt][0], acc[r][nt][1], acc[r][nt][2], acc[r][nt][3]);
    __syncthreads();
    for (int idx = threadIdx.x; idx < RW * NT * 128; idx += blockDim.x) {
        const int i = idx / (NT * 128), nt = (idx >> 7) % NT, ln = (idx >> 2) & 31, j = idx & 3;
        float s = 0.f;
#pragma unroll
        for (int v = 0; v < NW; v++) s += ((const float*)&red[((size_t)(i * NW + v) * NT + nt) * 32 + ln])[j];
        const int64_t row = row0 + 16 * i + (ln >> 2) + (j >= 2 ? 8 : 0);
        const int col = nt * 8 + 2 * (ln & 3) + (j & 1);
        if (row < rows && col < C) gemv_store(a, row, col, s);
    }
}

// one product: block b of the grid (row sets x column groups) is gemv_xp_block's b
template <int F, int NW, int NT, int RW, int S, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) gemv_xp_kernel(GemvArgs a, const uint4* __restrict__ xp,
                                                                const float* __restrict__ xps, int cp, int cg, int groups) {
    gemv_xp_block<F, NW, NT, RW, S>(a, xp, xps, cp, cg, groups, blockIdx.x);
}
template <int F, int NW, int NT, int RW, int S, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) gemv_xp_pf_kernel(GemvArgs a, const uint4* __restrict__ xp,
                                                                   const float* __restrict__ xps, int cp, int cg, int groups) {
    gemv_xp_pf_block<F, NW, NT, RW, S>(a, xp, xps, cp, cg, groups, blockIdx.x);
}
// a pair: two products of one prepared x in one launch (the deltanet's query_key and value_z,
// attention's query_key and gate_value, as NInfer's linear_pair). blocks [0, nb1) are the first
// product's, the rest the second's, each block exactly the one of its own product's launch in
// the same form (so the same bits); the pair pays one launch's ramp and tail instead of two
template <int F1, int F2, int NW, int NT, int RW, int S, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) gemv_xp2_kernel(GemvArgs a1, GemvArgs a2, unsigned nb1, const uint4* __restrict__ xp,
                                                                 const float* __restrict__ xps, int cp, int cg, int groups) {
    constexpr bool PF = NT == 4 && RW <= 2;  // gemv_xp_go's choice of body
    if (blockIdx.x < nb1) {
        if constexpr (PF) gemv_xp_pf_block<F1, NW, NT, RW, S>(a1, xp, xps, cp, cg, groups, blockIdx.x);
        else gemv_xp_block<F1, NW, NT, RW, S>(a1, xp, xps, cp, cg, groups, blockIdx.x);
    } else {
        if constexpr (PF) gemv_xp_pf_block<F2, NW, NT, RW, S>(a2, xp, xps, cp, cg, groups, blockIdx.x - nb1);
        else gemv_xp_block<F2, NW, NT, RW, S>(a2, xp, xps, cp, cg, groups, blockIdx.x - nb1);
    }
}

// blocks an sm the registers allow (65536 / (NW * 32 * MINB) a thread): 128 registers up to
// 2 tiles of accumulators (NT * RW), ~170 (NW 4) or 255 (NW 8) at 4, 255 at 8 (they spill at 128)
template <int NW, int NT, int RW> struct GemvXpMinb {
    static constexpr int v = NT * RW >= 8 ? 256 / (NW * 32) : NT * RW == 4 ? (NW == 4 ? 3 : 1) : 512 / (NW * 32);
};
template <int F, int NW, int NT, int RW, int S>
static size_t gemv_xp_smem() {
    return std::max((size_t)NW * S * RW * GemvAsyncLayout<F>::BYTES, (size_t)RW * NW * NT * 32 * 16);
}
// one launch of the form NT, RW, S: gemv_xp_pf_kernel for 4 tiles with 1-2 row tiles a warp,
// else gemv_xp_kernel
template <int F, int NW, int NT, int RW, int S>
static void gemv_xp_go(unsigned grid, const GemvArgs& a, const uint4* xp, const float* xps, int cp, int cg, int groups,
                       cudaStream_t stream) {
    constexpr int MINB = GemvXpMinb<NW, NT, RW>::v;
    const size_t smem = gemv_xp_smem<F, NW, NT, RW, S>();
    if constexpr (NT == 4 && RW <= 2) launch_k(gemv_xp_pf_kernel<F, NW, NT, RW, S, MINB>, grid, NW * 32, smem, stream, a, xp, xps, cp, cg, groups);
    else launch_k(gemv_xp_kernel<F, NW, NT, RW, S, MINB>, grid, NW * 32, smem, stream, a, xp, xps, cp, cg, groups);
}
// a wide product's prepared x in the stream's buffer (gemv_xprep_kernel; not run again where
// `again` and the buffer holds this very prep): its b words, sums and padded column count.
// record false: the buffer's key is dropped (a test's kernel version that no product follows)
struct GemvXpIn { const uint4* xp; const float* xps; int cp; };
template <int F, int NW>
static GemvXpIn gemv_xp_prep(const GemvArgs& a, cudaStream_t stream, bool again, bool record = true) {
    CHECK(a.C >= 1 && a.C <= GEMV_WIDE_COLS, "gemv: %d columns per wide launch", a.C);
    CHECK(a.w.cols <= GEMV_XP_MAX_K, "gemv: rows of %lld columns for the prepared x (at most %d)", (long long)a.w.cols,
          (int)GEMV_XP_MAX_K);
    constexpr int W = gemv_xs_words(F);
    const int units = (int)a.w.gpr, cp = (a.C + 7) / 8 * 8;
    GemvXpBuf& xb = gemv_xp_buffer(stream);
    uint4* xp = (uint4*)xb.p;
    float* xps = (float*)(xb.p + (size_t)units * cp * W * 16);  // after xp: 16 W bytes a (unit, column)
    // the q formats share G, LPT and gemv_xfrag: one prep serves a q4 and a q5 matrix alike
    const GemvXpKey key = {a.x, a.ldx, a.C, a.xmode, a.xw, a.eps, a.w.cols, F == FMT_W8, NW, a.xz, a.ldz};
    if (!(again && xb.held && xb.key == key)) {
        const int chunks = std::max(1, std::min(8, CEIL_DIV(units * 4, NW * 32)));
        launch_k(a.xmode == GEMV_X_GATED ? gemv_xprep_kernel<F, true> : gemv_xprep_kernel<F, false>, dim3((unsigned)a.C, (unsigned)chunks),
                 NW * 32, 0, stream, a, xp, xps, cp);
        cudaCheck(cudaGetLastError());
    }
    xb.key = key; xb.held = record;
    return {xp, xps, cp};
}
// a wide launch's shape: column groups of cc columns, whole 8-column tiles (balanced: the last
// group is the short one), of at most `most` columns; rw row tiles a warp (2 where the grid
// keeps g_gemv_xp_blocks blocks and a block has at most 32 columns, 4 where rw4 and
// g_gemv_xp_rw4_min say); row_sets row sets of rw tiles a block; NT 8-column tiles a block
struct GemvXpPlan { int groups, cc, rw, NT; unsigned grid; };
static GemvXpPlan gemv_xp_plan(const GemvArgs& a, int most, int row_sets, bool rw4 = true) {
    const int64_t tiles = CEIL_DIV(a.w.rows, (int64_t)16);
    GemvXpPlan p;
    auto split = [&](int m) { p.groups = CEIL_DIV(a.C, m); p.cc = CEIL_DIV(CEIL_DIV(a.C, p.groups), 8) * 8; p.groups = CEIL_DIV(a.C, p.cc); };
    split(std::min(most, (int)GEMV_WIDE_COLS));
    p.rw = g_gemv_xp_rw >= 2 && p.cc <= 32 && CEIL_DIV(tiles, (int64_t)2 * row_sets) * p.groups >= g_gemv_xp_blocks ? 2 : 1;
    if (rw4 && p.rw == 2 && a.C > 32 && g_gemv_xp_rw4_min > 0 && a.w.rows * a.w.cols >= g_gemv_xp_rw4_min &&
        CEIL_DIV(tiles, (int64_t)4 * row_sets) * p.groups >= 96)
        p.rw = 4;
    // few blocks: smaller column groups (each reads the weights again, from l2: the blocks of
    // one row set run together)
    while (p.rw < 4 && CEIL_DIV(tiles, (int64_t)p.rw * row_sets) * p.groups < g_gemv_xp_blocks && p.cc > 8) split(p.cc / 2);
    p.NT = p.cc <= 8 ? 1 : p.cc <= 16 ? 2 : p.cc <= 32 ? 4 : 8;
    p.grid = (unsigned)(CEIL_DIV(tiles, (int64_t)p.rw * row_sets) * p.groups);
    return p;
}
// go(NT, RW, S) (std::integral_constant tags) for the plan's form: 4 row tiles a warp with 4
// column tiles; 2 row tiles with 1, 2 or 4 column tiles, 3 stages; 1 row tile with 1-8, 4 stages
template <typename Go>
static void gemv_xp_form(const GemvXpPlan& p, Go go) {
    using I1 = std::integral_constant<int, 1>; using I2 = std::integral_constant<int, 2>;
    using I3 = std::integral_constant<int, 3>; using I4 = std::integral_constant<int, 4>;
    using I8 = std::integral_constant<int, 8>;
    if (p.rw == 4) go(I4(), I4(), I3());  // cc > 16: C > 32 in at most 32-column groups
    else if (p.rw == 2) p.NT == 1 ? go(I1(), I2(), I3()) : p.NT == 2 ? go(I2(), I2(), I3()) : go(I4(), I2(), I3());
    else p.NT == 1 ? go(I1(), I1(), I4()) : p.NT == 2 ? go(I2(), I1(), I4()) : p.NT == 4 ? go(I4(), I1(), I4()) : go(I8(), I1(), I4());
}
// the product of a.C columns on a matrix whose kernel is the x-staged one of NW warps a tile:
// the prep, then the product in gemv_xp_plan's shape
template <int F, int NW>
static void gemv_xp_launch(const GemvArgs& a, cudaStream_t stream, bool again) {
    const GemvXpIn in = gemv_xp_prep<F, NW>(a, stream, again);
    const GemvXpPlan p = gemv_xp_plan(a, g_gemv_xp_cols, 1);
    gemv_xp_form(p, [&](auto nt, auto rw, auto st) {
        gemv_xp_go<F, NW, decltype(nt)::value, decltype(rw)::value, decltype(st)::value>(p.grid, a, in.xp, in.xps, in.cp, p.cc, p.groups, stream);
    });
    cudaCheck(cudaGetLastError());
}
// a pair (gemv_xp2_kernel): the prep once, then both products in one grid, in the form the plan
// gives their rows together (a form changes no bit); blocks of a1 first
template <int F1, int F2, int NW>
static void gemv_xp2_launch(const GemvArgs& a1, const GemvArgs& a2, cudaStream_t stream, bool again) {
    const GemvXpIn in = gemv_xp_prep<F1, NW>(a1, stream, again);
    const int64_t tiles1 = CEIL_DIV(a1.w.rows, (int64_t)16), tiles2 = CEIL_DIV(a2.w.rows, (int64_t)16);
    GemvArgs both = a1;
    both.w.rows = 16 * (tiles1 + tiles2);
    const GemvXpPlan p = gemv_xp_plan(both, g_gemv_xp_cols, 1);
    gemv_xp_form(p, [&](auto nt, auto rw, auto st) {
        constexpr int NT = decltype(nt)::value, RW = decltype(rw)::value, S = decltype(st)::value;
        constexpr int MINB = GemvXpMinb<NW, NT, RW>::v;
        const size_t smem = std::max(gemv_xp_smem<F1, NW, NT, RW, S>(), gemv_xp_smem<F2, NW, NT, RW, S>());
        const unsigned nb1 = (unsigned)(CEIL_DIV(tiles1, (int64_t)RW) * p.groups), nb2 = (unsigned)(CEIL_DIV(tiles2, (int64_t)RW) * p.groups);
        launch_k(gemv_xp2_kernel<F1, F2, NW, NT, RW, S, MINB>, nb1 + nb2, NW * 32, smem, stream, a1, a2, nb1, in.xp, in.xps, in.cp,
                 p.cc, p.groups);
    });
    cudaCheck(cudaGetLastError());
}
// the shared memory of the kernel gemv_xp_go launches in the form NT, RW, S
template <int F, int NW, int NT, int RW, int S>
static void gemv_xp_init_one() {
    constexpr int MINB = GemvXpMinb<NW, NT, RW>::v;
    const int smem = (int)gemv_xp_smem<F, NW, NT, RW, S>();
    if constexpr (NT == 4 && RW <= 2) cudaCheck(cudaFuncSetAttribute(gemv_xp_pf_kernel<F, NW, NT, RW, S, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    else cudaCheck(cudaFuncSetAttribute(gemv_xp_kernel<F, NW, NT, RW, S, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
}
// go(NT, RW, S) for every form gemv_xp_form picks
template <typename Go>
static void gemv_xp_form_each(Go go) {
    const int forms[][2] = {{4, 4}, {2, 1}, {2, 2}, {2, 4}, {1, 1}, {1, 2}, {1, 4}, {1, 8}};  // (rw, NT)
    for (const auto& f : forms) {
        GemvXpPlan p = {};
        p.rw = f[0]; p.NT = f[1];
        gemv_xp_form(p, go);
    }
}
template <int F, int NW>
static void gemv_xp_init_nw() {
    gemv_xp_form_each([](auto nt, auto rw, auto st) { gemv_xp_init_one<F, NW, decltype(nt)::value, decltype(rw)::value, decltype(st)::value>(); });
}
template <int F>
static void gemv_xp_init() { gemv_xp_init_nw<F, 4>(); gemv_xp_init_nw<F, 8>(); }
// the pairs' kernels (gemv2: q4 then q5, 8 warps a tile), every form
static void gemv_xp2_init() {
    gemv_xp_form_each([](auto nt, auto rw, auto st) {
        constexpr int F1 = FMT_Q4, F2 = FMT_Q5, NW = 8, NT = decltype(nt)::value, RW = decltype(rw)::value, S = decltype(st)::value;
        const int smem = (int)std::max(gemv_xp_smem<F1, NW, NT, RW, S>(), gemv_xp_smem<F2, NW, NT, RW, S>());
        cudaCheck(cudaFuncSetAttribute(gemv_xp2_kernel<F1, F2, NW, NT, RW, S, GemvXpMinb<NW, NT, RW>::v>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    });
}

// k a multiple of 128: no padding groups (whose x would be read unguarded) and an even group
// count (two groups per stage; 4-byte aligned scale pairs)
static bool gemv_async_ok(const Mat& w) { return format_grouped(w.format) && w.cols % 128 == 0; }

// the kernels gemv() launches, picked from the h200 measurements (test/bench-notes.md,
// "gemv versions", sessions 2 and 17): the x-staged kernel for every grouped format (8 warps x 3
// stages at 4 blocks an sm up to GEMV_OCC_ROWS rows; beyond, 4 warps x 4 stages, or 8 x 3 for
// long rows, where 4 warps per 16 rows leave too few blocks in flight); bf16 and shapes the
// x-staged kernel cannot take: the register kernel. the other measured versions
// are test/dev_kernels.cuh's (tests and benches index all of them by number).
// a column's sum depends on the kernel's split of k among the warps of a row tile and on
// nothing else: the mma columns are independent. so that split is a function of the matrix
// alone, never of the column count (gemv_pick; the 4-tile form of variant 9 sums each tile as
// variant 9 does), and a product of C columns gives each column bit for bit what a one-column
// product gives it: what makes an mtp verification column a one-token step (model.md 5.3) and
// a batched lane a lone sequence. the wide kernel (gemv_xp_kernel: the same sums, 8-column
// tiles against one weight fragment) takes these matrices' products from 1 column with a fused
// transform, from 2 without, and always past what the staged x holds (gemv_wide_takes).
enum GemvKernel {
    GEMV_REGISTER,  // gemv_kernel <16 warps, 2 groups per stage, 2 blocks/sm>   (variant 2)
    GEMV_ASYNC,     // gemv_async_kernel <8 warps, 3 stages, 4 blocks/sm>        (variant 7)
    GEMV_XS_8X3,    // gemv_xs_kernel <8 warps, 3 stages, 3 blocks/sm>           (variant 8)
    GEMV_XS_4X4,    // gemv_xs_kernel <4 warps, 4 stages, 6 blocks/sm>           (variant 9)
    GEMV_XS_8X3_4,  // gemv_xs_kernel <8 warps, 3 stages, 4 blocks/sm>           (variant 13)
};
// matrices of at most this many rows take GEMV_XS_8X3_4 whatever the columns (GpuTuning::
// gemv_occ_rows; 0: off): 8 warps a 16-row tile (its wide kernel and prep too), 32 warps per
// sm instead of 24 (the 64-register cap costs these kernels no spill), so matrices of few
// 16-row tiles keep more weight stages in flight (a 4096-row product at 4 warps a tile runs ~8
// warps an sm: ncu, bench-notes session 17). tg128 on the h200 (issue 16): 0.8b and 4b 8.7% and
// 2.1% faster at 16384 rows (session 2); with the prep and the wide kernel taking the fused
// products, 9b 335.7 -> 349.4 at 16384 and 350.8 at 32768 (gate_up too), 4b 469.2 -> 472.1 at
// 32768 (session 17)
enum { GEMV_OCC_ROWS = 32768 };
static int g_gemv_occ_rows = GEMV_OCC_ROWS;
static bool gemv_xs_kernel_k(GemvKernel k) { return k == GEMV_XS_8X3 || k == GEMV_XS_4X4 || k == GEMV_XS_8X3_4; }
// the staged x the x-staged kernel of NW warps, S stages, RT row tiles may take next to its
// weight stages (the opt-in limit)
static size_t gemv_xs_room(NumFormat f, int NW, int S, int RT = 1) {
    size_t stage = f == FMT_Q4 ? GemvAsyncLayout<FMT_Q4>::BYTES : f == FMT_Q5 ? GemvAsyncLayout<FMT_Q5>::BYTES
                 : f == FMT_Q6 ? GemvAsyncLayout<FMT_Q6>::BYTES : GemvAsyncLayout<FMT_W8>::BYTES;
    return GEMV_XS_SMEM_MAX - (size_t)RT * NW * S * stage;
}
static size_t gemv_xs_room(NumFormat f, GemvKernel k) {
    const bool w8 = k == GEMV_XS_8X3 || k == GEMV_XS_8X3_4;
    return gemv_xs_room(f, w8 ? 8 : 4, w8 ? 3 : 4);
}
// the kernel of a matrix (for every column count)
static GemvKernel gemv_pick(const Mat& w) {
    if (w.format == FMT_BF16 || !gemv_async_ok(w)) return GEMV_REGISTER;
    const GemvKernel k = w.rows <= g_gemv_occ_rows ? GEMV_XS_8X3_4 : w.cols > 8192 ? GEMV_XS_8X3 : GEMV_XS_4X4;
    return gemv_xs_bytes(w.format, (int)w.gpr, 1) <= gemv_xs_room(w.format, k) ? k : GEMV_ASYNC;
}
// columns per launch of kernel k: what the staged x holds (x-staged kernels), else GEMV_MAX_COLS
static int gemv_launch_cols(const Mat& w, GemvKernel k) {
    if (!gemv_xs_kernel_k(k)) return GEMV_MAX_COLS;
    int c = GEMV_MAX_COLS;
    while (c > 1 && gemv_xs_bytes(w.format, (int)w.gpr, c) > gemv_xs_room(w.format, k)) c--;
    return c;
}
// the kernel for one launch (the chosen one must take the shape: gemv_pick's rule, or a
// test's explicit pick of a kernel that can)
template <int F>
static void gemv_launch(GemvKernel k, const GemvArgs& a, cudaStream_t stream) {
    const unsigned tiles = (unsigned)CEIL_DIV(a.w.rows, (int64_t)16);
    const size_t xsb = gemv_xs_bytes((NumFormat)F, (int)a.w.gpr, a.C);
    if (gemv_xs_kernel_k(k) && (F == FMT_BF16 || xsb > gemv_xs_room((NumFormat)F, k))) k = GEMV_ASYNC;
    if (k != GEMV_REGISTER && !(F != FMT_BF16 && gemv_async_ok(a.w))) k = GEMV_REGISTER;
    CHECK(a.xmode != GEMV_X_GATED, "gemv: the gated norm is the wide kernel's prep's (not kernel %d's)", (int)k);
    // the register and async kernels: blockIdx.y picks 8 of up to GEMV_WIDE_COLS columns
    CHECK(a.C <= GEMV_MAX_COLS || k == GEMV_REGISTER || k == GEMV_ASYNC, "gemv: %d columns for an x-staged launch", a.C);
    const dim3 rgrid(tiles, (unsigned)CEIL_DIV(a.C, (int)GEMV_MAX_COLS));
    if constexpr (F == FMT_BF16) {
        launch_k(gemv_kernel<F, 16, 2, 2>, rgrid, 16 * 32, 0, stream, a);
    } else {
        switch (k) {
            case GEMV_REGISTER: launch_k(gemv_kernel<F, 16, 2, 2>, rgrid, 16 * 32, 0, stream, a); break;
            case GEMV_ASYNC: launch_k(gemv_async_kernel<F, 8, 3, 4>, rgrid, 8 * 32, 0, stream, a); break;
            case GEMV_XS_8X3: launch_k(gemv_xs_kernel<F, 8, 3, 3>, tiles, 8 * 32, gemv_xs_smem<F>(8, 3, xsb), stream, a); break;
            case GEMV_XS_4X4: launch_k(gemv_xs_kernel<F, 4, 4, 6>, tiles, 4 * 32, gemv_xs_smem<F>(4, 4, xsb), stream, a); break;
            case GEMV_XS_8X3_4: launch_k(gemv_xs_kernel<F, 8, 3, 4>, tiles, 8 * 32, gemv_xs_smem<F>(8, 3, xsb), stream, a); break;
        }
    }
    cudaCheck(cudaGetLastError());
}

// what x is made from while the x-staged kernel stages it (GemvArgs::xmode)
// again: the caller's word that x is the previous product's on this stream, transform and all,
// and nothing wrote it since: a wide product then reads the prepared x that product left
// z, ldz: GEMV_X_GATED's gate
struct GemvX {
    int mode = GEMV_X_PLAIN; const bf16_t* w = nullptr; float eps = 0.f; bool again = false;
    const bf16_t* z = nullptr; int ldz = 0;
};
// the x-staged kernel takes this matrix, so its products can fuse an x transform (any C: the
// columns run in launches of gemv_launch_cols)
static bool gemv_fusable(const Mat& w) {
    return format_grouped(w.format) && gemv_xs_kernel_k(gemv_pick(w));
}

// the launches of one product: columns in chunks of `cols`, `launch(args)` runs one
template <typename Launch>
static void gemv_each_chunk(const Mat& w, const bf16_t* x, int ldx, int C, void* y, int ldy, bool y_f32, const bf16_t* resid,
                            int ldr, GemvX xt, int cols, Launch launch) {
    CHECK(w.rows > 0 && w.cols > 0 && C >= 1, "gemv: empty shape");
    CHECK(ldx % 8 == 0 && ((uintptr_t)x & 15) == 0, "gemv: x must be 16-byte aligned with ldx %% 8 == 0 (ldx %d)", ldx);
    CHECK(w.format != FMT_BF16 || w.cols % 8 == 0, "gemv: bf16 weights need cols %% 8 == 0 (cols %lld)", (long long)w.cols);
    CHECK(cols >= 1 && cols <= GEMV_WIDE_COLS, "gemv: %d columns per launch", cols);
    CHECK(xt.mode != GEMV_X_GATED || (xt.z && ((uintptr_t)xt.z & 15) == 0 && xt.ldz % 8 == 0 && w.cols % GEMV_GATED_N == 0),
          "gemv: a gated norm of %lld columns in heads of %d needs its gate 16-byte aligned with ldz %% 8 == 0 (gate %s, ldz %d)",
          (long long)w.cols, (int)GEMV_GATED_N, xt.z ? "given" : "missing", xt.ldz);
    for (int c0 = 0; c0 < C; c0 += cols) {
        GemvArgs a;
        a.w = w;
        a.x = x + (int64_t)c0 * ldx; a.ldx = ldx;
        a.C = C - c0 < cols ? C - c0 : cols;
        a.y = y_f32 ? (void*)((float*)y + (int64_t)c0 * ldy) : (void*)((bf16_t*)y + (int64_t)c0 * ldy);
        a.ldy = ldy; a.y_f32 = y_f32;
        a.resid = resid ? resid + (int64_t)c0 * ldr : nullptr; a.ldr = ldr;
        a.xmode = xt.mode; a.xw = xt.w; a.eps = xt.eps;
        a.xz = xt.z ? xt.z + (int64_t)c0 * xt.ldz : nullptr; a.ldz = xt.ldz;
        launch(a);
    }
}

// y[c][r] (+)= W x[c] for c < C. on the x-staged kernels' matrices the wide kernel takes the
// product (64 columns a launch) from g_gemv_xp_from / g_gemv_xp_plain_from columns, and always
// past what the staged x holds; on the others 64 columns a launch in 8-column block rows
// (g_gemv_ychunks 0: launches of 8). y_f32 picks fp32 output; resid (nullable, may equal y)
// adds a bf16 residual. all pointers are device pointers.
static bool gemv_wide_takes(const Mat& w, int C, int xmode) {
    const GemvKernel k = gemv_pick(w);
    if (xmode == GEMV_X_GATED) return gemv_xs_kernel_k(k);  // the prep alone makes it
    const int xp_from = xmode == GEMV_X_PLAIN ? g_gemv_xp_plain_from : g_gemv_xp_from;
    return gemv_xs_kernel_k(k) && (C > gemv_launch_cols(w, k) || (xp_from >= 1 && C >= xp_from));
}
static void gemv(const Mat& w, const bf16_t* x, int ldx, int C, void* y, int ldy, bool y_f32, const bf16_t* resid,
                 int ldr, cudaStream_t stream, GemvX xt = GemvX()) {
    CHECK(xt.mode == GEMV_X_PLAIN || gemv_fusable(w), "gemv: an x transform needs the x-staged kernel (%s, k %lld)",
          format_name(w.format), (long long)w.cols);
    const GemvKernel k = gemv_pick(w);
    if (gemv_wide_takes(w, C, xt.mode)) {
        const bool nw8 = k == GEMV_XS_8X3 || k == GEMV_XS_8X3_4;
        gemv_each_chunk(w, x, ldx, C, y, ldy, y_f32, resid, ldr, xt, GEMV_WIDE_COLS, [&](const GemvArgs& a) {
            switch (w.format) {
                case FMT_Q4: nw8 ? gemv_xp_launch<FMT_Q4, 8>(a, stream, xt.again) : gemv_xp_launch<FMT_Q4, 4>(a, stream, xt.again); break;
                case FMT_Q5: nw8 ? gemv_xp_launch<FMT_Q5, 8>(a, stream, xt.again) : gemv_xp_launch<FMT_Q5, 4>(a, stream, xt.again); break;
                case FMT_Q6: nw8 ? gemv_xp_launch<FMT_Q6, 8>(a, stream, xt.again) : gemv_xp_launch<FMT_Q6, 4>(a, stream, xt.again); break;
                default: nw8 ? gemv_xp_launch<FMT_W8, 8>(a, stream, xt.again) : gemv_xp_launch<FMT_W8, 4>(a, stream, xt.again); break;
            }
        });
        return;
    }
    gemv_xp_forget(stream);
    const int cols = gemv_xs_kernel_k(k) ? gemv_launch_cols(w, k) : g_gemv_ychunks ? (int)GEMV_WIDE_COLS : (int)GEMV_MAX_COLS;
    gemv_each_chunk(w, x, ldx, C, y, ldy, y_f32, resid, ldr, xt, cols, [&](const GemvArgs& a) {
        switch (w.format) {
            case FMT_Q4: gemv_launch<FMT_Q4>(k, a, stream); break;
            case FMT_Q5: gemv_launch<FMT_Q5>(k, a, stream); break;
            case FMT_Q6: gemv_launch<FMT_Q6>(k, a, stream); break;
            case FMT_W8: gemv_launch<FMT_W8>(k, a, stream); break;
            case FMT_BF16: gemv_launch<FMT_BF16>(k, a, stream); break;
            default: CHECK(false, "gemv: unsupported weight format %s", format_name(w.format));
        }
    });
}

// a pair of products of one x in one launch (gemv_xp2_kernel): y1 = W1 x, y2 = W2 x, bf16 out, no
// residual, with the bits of the two gemv() calls. it takes (gemv2_ok) W1 q4 and W2 q5 (the input
// projections' pairs) of the same k, both wide products of 8 warps a tile with the transform
static bool gemv2_ok(const Mat& w1, const Mat& w2, int C, int xmode) {
    auto nw8 = [](const Mat& w) { const GemvKernel k = gemv_pick(w); return k == GEMV_XS_8X3 || k == GEMV_XS_8X3_4; };
    return w1.format == FMT_Q4 && w2.format == FMT_Q5 && w1.cols == w2.cols && C <= GEMV_WIDE_COLS && xmode != GEMV_X_GATED &&
           gemv_wide_takes(w1, C, xmode) && gemv_wide_takes(w2, C, xmode) && nw8(w1) && nw8(w2);
}
static void gemv2(const Mat& w1, void* y1, int ldy1, const Mat& w2, void* y2, int ldy2, const bf16_t* x, int ldx, int C,
                  cudaStream_t stream, GemvX xt = GemvX()) {
    CHECK(gemv2_ok(w1, w2, C, xt.mode), "gemv2: not a pair it takes (%s %lldx%lld, %s %lldx%lld, %d columns, x transform %d)",
          format_name(w1.format), (long long)w1.rows, (long long)w1.cols, format_name(w2.format), (long long)w2.rows,
          (long long)w2.cols, C, xt.mode);
    GemvArgs a1, a2;  // one chunk each (C <= GEMV_WIDE_COLS), checked as gemv()'s
    gemv_each_chunk(w1, x, ldx, C, y1, ldy1, false, nullptr, 0, xt, GEMV_WIDE_COLS, [&](const GemvArgs& a) { a1 = a; });
    gemv_each_chunk(w2, x, ldx, C, y2, ldy2, false, nullptr, 0, xt, GEMV_WIDE_COLS, [&](const GemvArgs& a) { a2 = a; });
    gemv_xp2_launch<FMT_Q4, FMT_Q5, 8>(a1, a2, stream, xt.again);
}

// ---- 7.3 norms ------------------------------------------------------------------------------
//
// a row is one token's vector (heads == 1) or one head of it (q/k norm over 256, the gdn gated
// norm over 128): row r is token r / heads, head r % heads, at x + token*ldx + head*n.
// rmsnorm: a block a row; a thread writes only the entries it read, so y may alias x.

enum { NORM_THREADS = 128 };

// y = bf16( x * rsqrt(mean(x^2) + eps) * (1 + w) ), all fp32 (model.md 4.1); plain_w: * w
// (used by no text norm of qwen3.5, kept for the vision tower and tests).
// vec (rmsnorm_vec: rows of 8-entry, 16-byte aligned pieces, n <= 8 x 1024): a thread's 8
// entries in one 16-byte load held in registers (one pass, a block of n / 8 threads); else
// two passes of 2-byte loads (the second hits l1)
enum { NORM_VEC_MAX = 8 * 1024 };
__global__ void __launch_bounds__(1024) rmsnorm_kernel(const bf16_t* x, int ldx, bf16_t* y, int ldy,
                                                               const bf16_t* __restrict__ w, int n, int heads, float eps, int plain_w,
                                                               int vec) {
    pdl_entry_small();
    int r = blockIdx.x, tok = r / heads, hd = r % heads;
    const bf16_t* xr = x + (int64_t)tok * ldx + (int64_t)hd * n;
    bf16_t* yr = y + (int64_t)tok * ldy + (int64_t)hd * n;
    if (vec) {
        const int i = threadIdx.x * 8;
        uint4 xv = make_uint4(0, 0, 0, 0);
        if (i < n) xv = *(const uint4*)(xr + i);
        bf16_t* e = (bf16_t*)&xv;
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) { const float v = bf2f(e[j]); ss += v * v; }
        ss = block_sum(ss);  // every load is done before the block's first barrier: y may alias x
        const float inv = rsqrtf(ss / (float)n + eps);
        if (i >= n) return;
        const uint4 wv = __ldg((const uint4*)(w + i));
        const bf16_t* we = (const bf16_t*)&wv;
#pragma unroll
        for (int j = 0; j < 8; j++) e[j] = f2bf(bf2f(e[j]) * inv * (plain_w ? bf2f(we[j]) : 1.f + bf2f(we[j])));
        *(uint4*)(yr + i) = xv;
        return;
    }
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) { float v = bf2f(xr[i]); ss += v * v; }
    ss = block_sum(ss);
    float inv = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float wv = bf2f(w[i]);
        yr[i] = f2bf(bf2f(xr[i]) * inv * (plain_w ? wv : 1.f + wv));
    }
}
static void rmsnorm(const bf16_t* x, int ldx, bf16_t* y, int ldy, const bf16_t* w, int n, int rows, int heads, float eps,
                    bool plain_w, cudaStream_t stream) {
    CHECK(rows % heads == 0, "rmsnorm: rows %d not a multiple of heads %d", rows, heads);
    // about 8 elements per thread: a decode row of 4096 is one block, and its latency is the
    // loop over the row, so wide rows get wide blocks (128 .. 1024 threads; vec: n / 8)
    const bool vec = n % 8 == 0 && n <= NORM_VEC_MAX && ldx % 8 == 0 && ldy % 8 == 0 && ((uintptr_t)x & 15) == 0 &&
                     ((uintptr_t)y & 15) == 0 && ((uintptr_t)w & 15) == 0;
    const int threads = vec ? (int)CEIL_DIV(n / 8, 32) * 32 : std::min(1024, std::max((int)NORM_THREADS, (int)CEIL_DIV(n, 8 * 32) * 32));
    launch_k(rmsnorm_kernel, rows, threads, 0, stream, x, ldx, y, ldy, w, n, heads, eps, plain_w ? 1 : 0, vec ? 1 : 0);
    cudaCheck(cudaGetLastError());
}

// gdn output norm per value head (model.md 3.8), with hf's roundings:
//   nrm = bf16(o * rsqrt(mean(o^2) + eps)); p = bf16(w * nrm); y = bf16(p * silu(z))  (silu in fp32)
// o: [T][heads*n] (ldo), z: [T][heads*n] (ldz), w plain (no 1+w); n = GEMV_GATED_N (the
// family's dv). one warp a head, lane l holding entries l + 32j: the sum of squares is the
// tree the decode products' prep replays (gemv_gated_inv: a block_sum over 128 threads of one
// entry each), each 32-entry slice's shuffle tree then (w0 + w2) + (w1 + w3), with no barrier
// and four loads in flight a lane (a block a head measured 2.7x slower at prefill: bench-notes)
enum { GATED_HEADS = 4 };  // heads (warps) a block
__global__ void __launch_bounds__(GATED_HEADS * 32) gated_rmsnorm_kernel(const bf16_t* __restrict__ o, int ldo,
                                                                         const bf16_t* __restrict__ z, int ldz, bf16_t* y, int ldy,
                                                                         const bf16_t* __restrict__ w, int rows, int heads, float eps) {
    constexpr int n = GEMV_GATED_N, J = n / 32;
    pdl_entry_small();
    const int r = blockIdx.x * GATED_HEADS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return;
    const int tok = r / heads, hd = r % heads;
    const bf16_t* orow = o + (int64_t)tok * ldo + (int64_t)hd * n;
    const bf16_t* zrow = z + (int64_t)tok * ldz + (int64_t)hd * n;
    bf16_t* yrow = y + (int64_t)tok * ldy + (int64_t)hd * n;
    float ov[J], sq[J];
#pragma unroll
    for (int j = 0; j < J; j++) { ov[j] = bf2f(orow[lane + 32 * j]); sq[j] = warp_sum(ov[j] * ov[j]); }
    static_assert(J == 4, "the gated norm's tree is block_sum's over 4 warps");
    const float ss = (sq[0] + sq[2]) + (sq[1] + sq[3]);
    const float inv = rsqrtf(ss / (float)n + eps);
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int i = lane + 32 * j;
        const float nrm = bfround(ov[j] * inv);
        const float p = bfround(bf2f(w[i]) * nrm);
        yrow[i] = f2bf(p * silu_f(bf2f(zrow[i])));
    }
}
static void gated_rmsnorm(const bf16_t* o, int ldo, const bf16_t* z, int ldz, bf16_t* y, int ldy, const bf16_t* w, int n,
                          int T, int heads, float eps, cudaStream_t stream) {
    CHECK(n == GEMV_GATED_N, "gated_rmsnorm: heads of %d, the kernel takes %d", n, (int)GEMV_GATED_N);
    const int rows = T * heads;
    launch_k(gated_rmsnorm_kernel, (unsigned)CEIL_DIV(rows, (int)GATED_HEADS), GATED_HEADS * 32, 0, stream, o, ldo, z, ldz, y, ldy, w,
             rows, heads, eps);
    cudaCheck(cudaGetLastError());
}

// l2 norm per head (model.md 3.4): y = x * rsqrt(sum(x^2) + eps) * scale, fp32 in and out of
// the math, fp32 out (what the chunked gdn consumes). one warp per row of n (<= 1024).
enum { L2_THREADS = 128 };
__global__ void __launch_bounds__(L2_THREADS) l2norm_kernel(const bf16_t* __restrict__ x, int ldx, float* y, int ldy, int n, int rows,
                                                            int heads, float eps, float scale) {
    pdl_entry_small();
    int r = blockIdx.x * (L2_THREADS / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return;
    int tok = r / heads, hd = r % heads;
    const bf16_t* xr = x + (int64_t)tok * ldx + (int64_t)hd * n;
    float* yr = y + (int64_t)tok * ldy + (int64_t)hd * n;
    float ss = 0.f;
    for (int i = lane; i < n; i += 32) { float v = bf2f(xr[i]); ss += v * v; }
    ss = warp_sum(ss);
    float inv = rsqrtf(ss + eps) * scale;
    for (int i = lane; i < n; i += 32) yr[i] = bf2f(xr[i]) * inv;
}
static void l2norm(const bf16_t* x, int ldx, float* y, int ldy, int n, int T, int heads, float eps, float scale,
                   cudaStream_t stream) {
    int rows = T * heads;
    launch_k(l2norm_kernel, CEIL_DIV(rows, L2_THREADS / 32), L2_THREADS, 0, stream, x, ldx, y, ldy, n, rows, heads, eps, scale);
    cudaCheck(cudaGetLastError());
}

// ---- 7.4 elementwise ------------------------------------------------------------------------

enum { EW_THREADS = 256 };

// a plain 16-byte grid-stride copy: the copy-bandwidth ceiling ninfer-bench (and the kernel
// benches) measure the products against; no pdl (it runs alone)
__global__ void copy16_kernel(const uint4* __restrict__ a, uint4* __restrict__ b, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) b[i] = a[i];
}

// mlp activation (model.md 4.2) with hf's bf16 roundings: y = bf16( bf16(silu(gate)) * up ).
// gu: [T][2I] = [gate | up] (the fused gate_up gemv output), y: [T][I]
__global__ void swiglu_kernel(const bf16_t* __restrict__ gu, int ldgu, bf16_t* y, int ldy, int I, int T) {
    pdl_entry_small();
    int64_t idx = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x;
    if (idx >= (int64_t)I * T) return;
    int t = (int)(idx / I), i = (int)(idx % I);
    const bf16_t* row = gu + (int64_t)t * ldgu;
    y[(int64_t)t * ldy + i] = f2bf(bfround(silu_f(bf2f(row[i]))) * bf2f(row[I + i]));
}
static void swiglu(const bf16_t* gu, int ldgu, bf16_t* y, int ldy, int I, int T, cudaStream_t stream) {
    launch_k(swiglu_kernel, (unsigned)CEIL_DIV((int64_t)I * T, (int64_t)EW_THREADS), EW_THREADS, 0, stream, gu, ldgu, y, ldy, I, T);
    cudaCheck(cudaGetLastError());
}

// lane j of a group of a grouped format: the signed code (device twin of format.h group_code)
__device__ __forceinline__ int dev_group_code(int f, const uint8_t* base, const uint8_t* high, int j) {
    if (f == FMT_W8) return (int8_t)base[j];
    int u = (base[j >> 1] >> ((j & 1) * 4)) & 0xF;
    int b = 4;
    if (f == FMT_Q5) { u |= ((high[j >> 3] >> (j & 7)) & 1) << 4; b = 5; }
    else if (f == FMT_Q6) { u |= ((high[j >> 2] >> ((j & 3) * 2)) & 3) << 4; b = 6; }
    return (u ^ (1 << (b - 1))) - (1 << (b - 1));
}

// embedding rows (model.md 4.4), from any stored format: y[t] = bf16(scale * code) (bf16
// weights copy exactly). ids[t] >= 0 gathers that row; ids[t] < 0 copies row (-1 - ids[t])
// of `ovr` instead (per-token embedding overrides: vision features, mtp inputs).
__global__ void embed_gather_kernel(Mat w, const int* __restrict__ ids, const bf16_t* __restrict__ ovr, int ldo, bf16_t* y, int ldy) {
    pdl_entry_small();
    int t = blockIdx.y;
    int64_t k = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x;
    if (k >= w.cols) return;
    int id = ids[t];
    bf16_t* yr = y + (int64_t)t * ldy;
    if (id < 0) { yr[k] = ovr[(int64_t)(-1 - id) * ldo + k]; return; }
    if (id >= w.rows) id = (int)w.rows - 1;  // out-of-range ids are the caller's bug; never read outside
    if (w.format == FMT_BF16) { yr[k] = ((const bf16_t*)(w.base + (int64_t)id * w.base_row))[k]; return; }
    int G = w.format == FMT_W8 ? 32 : 64, hb = w.format == FMT_Q5 ? 8 : w.format == FMT_Q6 ? 16 : 0;
    int64_t grp = k / G; int j = (int)(k % G);
    const uint8_t* base = w.base + (int64_t)id * w.base_row + grp * 32;
    const uint8_t* high = w.high + (int64_t)id * w.high_row + grp * hb;
    float s = f16bits2f(((const unsigned short*)(w.scale + (int64_t)id * w.scale_row))[grp]);
    yr[k] = f2bf(s * (float)dev_group_code(w.format, base, high, j));
}
static void embed_gather(const Mat& w, const int* ids, int T, const bf16_t* ovr, int ldo, bf16_t* y, int ldy, cudaStream_t stream) {
    CHECK(w.format == FMT_BF16 || format_grouped(w.format), "embed_gather: unsupported format %s", format_name(w.format));
    dim3 grid((unsigned)CEIL_DIV(w.cols, (int64_t)EW_THREADS), T);
    launch_k(embed_gather_kernel, grid, EW_THREADS, 0, stream, w, ids, ovr, ldo, y, ldy);
    cudaCheck(cudaGetLastError());
}

// partial interleaved m-rope (model.md 2.3; attn_prep applies it, test/dev_kernels.cuh keeps the
// separate kernel as its reference), in place on nheads heads of head_dim per token:
// dims [0, rot) rotate as rotate_half pairs (i, i+rot/2); the rest pass through. pair i uses
// position axis T/H/W by the interleaved rule of mrope_section; angle = pos[t][axis] *
// inv_freq[i] in fp32; cos/sin rounded to bf16, products and sum rounded to bf16 as hf does:
//   x'_i = bf16( bf16(x_i c) - bf16(x_{i+h} s) ),  x'_{i+h} = bf16( bf16(x_{i+h} c) + bf16(x_i s) )
// pos: device [T][3] int32 (text: all three equal).
// inv_freq_j = 1 / theta^(2j/rot) in fp32, as hf builds it; zeros past rot/2 up to 64
static void rope_inv_freq(float theta, int rot, float* out) {
    for (int j = 0; j < 64; j++) out[j] = j < rot / 2 ? 1.0f / powf(theta, (float)(2 * j) / (float)rot) : 0.f;
}
// ---- 7.5 gated deltanet decode: conv, gates, recurrent step ---------------------------------
// gated deltanet: causal conv, gates, recurrent step
//
// conv state per slot: the last 3 raw in_proj_qkv outputs (model.md 3.7), stored tap-major
// [3][conv_dim] bf16 (oldest first) so that a warp reads 64 consecutive bytes per tap. the
// conv weight is the artifact's [4][conv_dim] (tap 3 multiplies the current token).
// numerics: y = bf16( silu( sum_tau w_tau u_tau ) ) with the sum and silu in fp32 (one
// rounding, as the fused causal_conv1d kernel does; hf's torch fallback rounds the conv
// output to bf16 before the silu as well).

enum { CONV_THREADS = 128, CONV_TOKENS = 16 };

struct ConvStepArgs {
    const bf16_t* u; int ldu;          // [C][conv_dim] raw projections
    const bf16_t* w;                   // [4][conv_dim]
    bf16_t* state; int64_t slot_stride;  // slot s at state + s*slot_stride: [3][conv_dim]
    const int* slots;                  // [2C], see the header
    bf16_t* y; int ldy;                // [C][conv_dim]
    int C, conv_dim;
    int lanes = 0;                     // every column its own sequence: slots[c], slots[C + c] >= 0,
                                       // no slot shared by two columns (they run concurrently)
};
// decode: one thread per channel runs the C columns in order (a chain: the mtp verify's
// columns continue each other); lanes: grid.z = column, each column its own chain of one
__global__ void __launch_bounds__(CONV_THREADS) conv_step_kernel(ConvStepArgs a) {
    pdl_entry_small();
    int ch = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (ch >= a.conv_dim) return;
    int D = a.conv_dim;
    float w0 = bf2f(a.w[ch]), w1 = bf2f(a.w[D + ch]), w2 = bf2f(a.w[2 * D + ch]), w3 = bf2f(a.w[3 * D + ch]);
    float s0 = 0.f, s1 = 0.f, s2 = 0.f;  // u_{t-3}, u_{t-2}, u_{t-1}
    const int c0 = a.lanes ? (int)blockIdx.z : 0, c1 = a.lanes ? c0 + 1 : a.C;
    for (int c = c0; c < c1; c++) {
        int sin = a.slots[c], sout = a.slots[a.C + c];
        if (sin >= 0) {
            const bf16_t* st = a.state + sin * a.slot_stride;
            s0 = bf2f(st[ch]); s1 = bf2f(st[D + ch]); s2 = bf2f(st[2 * D + ch]);
        }
        float u = bf2f(a.u[(int64_t)c * a.ldu + ch]);
        float acc = fmaf(w3, u, fmaf(w2, s2, fmaf(w1, s1, w0 * s0)));
        a.y[(int64_t)c * a.ldy + ch] = f2bf(silu_f(acc));
        s0 = s1; s1 = s2; s2 = u;
        if (sout >= 0) {
            bf16_t* st = a.state + sout * a.slot_stride;
            st[ch] = f2bf(s0); st[D + ch] = f2bf(s1); st[2 * D + ch] = f2bf(s2);
        }
    }
}
static void conv_step(const bf16_t* u, int ldu, const bf16_t* w, bf16_t* state, int64_t slot_stride, const int* slots,
                      bf16_t* y, int ldy, int C, int conv_dim, cudaStream_t stream, bool lanes = false) {
    ConvStepArgs a{u, ldu, w, state, slot_stride, slots, y, ldy, C, conv_dim, lanes ? 1 : 0};
    launch_k(conv_step_kernel, dim3(CEIL_DIV(conv_dim, CONV_THREADS), 1, lanes ? C : 1), CONV_THREADS, 0, stream, a);
    cudaCheck(cudaGetLastError());
}

// prefill: T tokens, each thread one channel and CONV_TOKENS consecutive tokens. inputs
// before the first token come from state_in (nullptr: zeros). the state is not touched here
// (blocks of later tokens may still read state_in); conv_state_update writes it afterwards.
// a thread's inputs are all loaded before its first store (y never aliases u), so its
// CONV_TOKENS loads are in flight together rather than one a token after each store
__global__ void __launch_bounds__(CONV_THREADS) conv_prefill_kernel(const bf16_t* __restrict__ u, int ldu, const bf16_t* __restrict__ w,
                                                                    const bf16_t* state_in, bf16_t* __restrict__ y, int ldy, int T,
                                                                    int conv_dim) {
    pdl_entry();
    int ch = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (ch >= conv_dim) return;
    int D = conv_dim;
    int t0 = blockIdx.y * CONV_TOKENS;
    float w0 = bf2f(w[ch]), w1 = bf2f(w[D + ch]), w2 = bf2f(w[2 * D + ch]), w3 = bf2f(w[3 * D + ch]);
    auto in = [&](int t) -> float {
        if (t >= 0) return bf2f(u[(int64_t)t * ldu + ch]);
        return state_in ? bf2f(state_in[(3 + t) * D + ch]) : 0.f;
    };
    float s0 = in(t0 - 3), s1 = in(t0 - 2), s2 = in(t0 - 1);
    float xs[CONV_TOKENS];
#pragma unroll
    for (int j = 0; j < CONV_TOKENS; j++) xs[j] = t0 + j < T ? bf2f(u[(int64_t)(t0 + j) * ldu + ch]) : 0.f;
#pragma unroll
    for (int j = 0; j < CONV_TOKENS; j++) {
        const float x = xs[j];
        const float acc = fmaf(w3, x, fmaf(w2, s2, fmaf(w1, s1, w0 * s0)));
        if (t0 + j < T) y[(int64_t)(t0 + j) * ldy + ch] = f2bf(silu_f(acc));
        s0 = s1; s1 = s2; s2 = x;
    }
}
// the state after T tokens: the last 3 raw inputs (left-filled from state_in when T < 3)
__global__ void conv_state_update_kernel(const bf16_t* __restrict__ u, int ldu, const bf16_t* state_in, bf16_t* state_out, int T,
                                         int conv_dim) {
    pdl_entry_small();
    int ch = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (ch >= conv_dim) return;
    float v[3];
    for (int j = 0; j < 3; j++) {
        int t = T - 3 + j;
        v[j] = t >= 0 ? bf2f(u[(int64_t)t * ldu + ch]) : state_in ? bf2f(state_in[(3 + t) * conv_dim + ch]) : 0.f;
    }
    for (int j = 0; j < 3; j++) state_out[j * conv_dim + ch] = f2bf(v[j]);
}
static void conv_prefill(const bf16_t* u, int ldu, const bf16_t* w, const bf16_t* state_in, bf16_t* state_out, bf16_t* y,
                         int ldy, int T, int conv_dim, cudaStream_t stream) {
    dim3 grid(CEIL_DIV(conv_dim, CONV_THREADS), CEIL_DIV(T, CONV_TOKENS));
    launch_k(conv_prefill_kernel, grid, CONV_THREADS, 0, stream, u, ldu, w, state_in, y, ldy, T, conv_dim);
    cudaCheck(cudaGetLastError());
    if (state_out) {
        launch_k(conv_state_update_kernel, CEIL_DIV(conv_dim, CONV_THREADS), CONV_THREADS, 0, stream, u, ldu, state_in, state_out, T, conv_dim);
        cudaCheck(cudaGetLastError());
    }
}

// gdn gates (model.md 3.3), shared by the standalone kernel and the fused decode step:
//   beta = bf16(sigmoid(b)) (hf computes it in the activation dtype), g = -exp(A_log) *
//   softplus(a + dt_bias) in fp32 (a_log, dt_bias are stored fp32)
__device__ __forceinline__ void gdn_gate_math(float a, float b, float a_log, float dt_bias, float& beta, float& g) {
    beta = bfround(sigmoid_f(b));
    g = -expf(a_log) * softplus_f(a + dt_bias);
}
// a, b: [T][*] bf16 projection outputs (lda, ldb); beta, g: [T][Hv] fp32
__global__ void gdn_gates_kernel(const bf16_t* __restrict__ a, int lda, const bf16_t* __restrict__ b, int ldb, const float* __restrict__ a_log,
                                 const float* __restrict__ dt_bias, float* beta, float* g, int T, int Hv) {
    pdl_entry_small();
    int idx = blockIdx.x * EW_THREADS + threadIdx.x;
    if (idx >= T * Hv) return;
    int t = idx / Hv, h = idx % Hv;
    float be, gg;
    gdn_gate_math(bf2f(a[(int64_t)t * lda + h]), bf2f(b[(int64_t)t * ldb + h]), a_log[h], dt_bias[h], be, gg);
    beta[idx] = be; g[idx] = gg;
}
static void gdn_gates(const bf16_t* a, int lda, const bf16_t* b, int ldb, const float* a_log, const float* dt_bias,
                      float* beta, float* g, int T, int Hv, cudaStream_t stream) {
    launch_k(gdn_gates_kernel, CEIL_DIV(T * Hv, EW_THREADS), EW_THREADS, 0, stream, a, lda, b, ldb, a_log, dt_bias, beta, g, T, Hv);
    cudaCheck(cudaGetLastError());
}

// recurrent gated delta rule, C columns of decode (model.md 3.5), fused with the l2 norm and
// q scaling of q, k (3.4) and the gates (3.3). state fp32 [Hv][dk][dv] per slot (dk = dv =
// 128), read and written through the slot map (header). the C columns run in order in each
// block (the mtp verify's chain); lanes: grid.z = column, so C independent sequences step at
// once with each column's arithmetic that of a lone launch.
// parallelisation: the dv columns of a head are independent (m_j, delta_j, o_j only need
// column j of S), so block (head h, 32 columns) keeps its 128 x 32 slice of S in registers:
// warp w holds rows [32w, 32w+32) of column j0 + lane (32 floats per thread, coalesced 128-byte
// rows). per column: S *= e^g; m = S^T k; delta = beta (v - m); S += k delta^T; o = S^T q.
// output o: bf16 [C][Hv*dv] (hf casts the fp32 core output once).
enum { GDN_D = 128, GDN_COLS = 32, GDN_THREADS = 128 };
struct GdnStepArgs {
    const bf16_t* qkv; int ldqkv;   // conv output [C][conv_dim]: q heads | k heads | v heads
    const bf16_t* a; const bf16_t* b; int ldab;  // [C][Hv] gate projections (bf16)
    const float* a_log; const float* dt_bias;     // [Hv]
    float* state; int64_t slot_stride;            // slot s at state + s*slot_stride
    const int* slots;                             // [2C]
    bf16_t* out; int ldo;                         // [C][Hv*dv]
    int C, Hk, Hv;
    bool lanes = false;                           // every column its own sequence: slots[c], slots[C + c] >= 0,
                                                  // no slot shared by two columns (they run concurrently)
};
__global__ void __launch_bounds__(GDN_THREADS) gdn_step_kernel(GdnStepArgs a) {
    pdl_entry_small();
    const int h = blockIdx.x, j = blockIdx.y * GDN_COLS + (threadIdx.x & 31);
    const int warp = threadIdx.x >> 5, tid = threadIdx.x, i0 = warp * 32;
    const int hk = h / (a.Hv / a.Hk);
    __shared__ float qs[GDN_D], ks[GDN_D], part[4][32];
    float s[32];
#pragma unroll
    for (int r = 0; r < 32; r++) s[r] = 0.f;
    const float a_log = a.a_log[h], dt_bias = a.dt_bias[h];
    const int c0 = a.lanes ? (int)blockIdx.z : 0, c1 = a.lanes ? c0 + 1 : a.C;  // lanes: grid.z = column
    for (int c = c0; c < c1; c++) {
        int sin = a.slots[c], sout = a.slots[a.C + c];
        if (sin >= 0) {
            const float* S = a.state + sin * a.slot_stride + ((int64_t)h * GDN_D + i0) * GDN_D + j;
#pragma unroll
            for (int r = 0; r < 32; r++) s[r] = S[r * GDN_D];
        }
        const bf16_t* row = a.qkv + (int64_t)c * a.ldqkv;
        float qv = bf2f(row[hk * GDN_D + tid]);
        float kv = bf2f(row[(a.Hk + hk) * GDN_D + tid]);
        float qq = block_sum(qv * qv);
        float kk = block_sum(kv * kv);
        qs[tid] = qv * rsqrtf(qq + 1e-6f) * 0.08838834764831845f;  // dk^-1/2
        ks[tid] = kv * rsqrtf(kk + 1e-6f);
        float beta, g;
        gdn_gate_math(bf2f(a.a[(int64_t)c * a.ldab + h]), bf2f(a.b[(int64_t)c * a.ldab + h]), a_log, dt_bias, beta, g);
        float eg = expf(g);
        __syncthreads();
        float m = 0.f;
#pragma unroll
        for (int r = 0; r < 32; r++) { s[r] *= eg; m = fmaf(s[r], ks[i0 + r], m); }
        part[warp][threadIdx.x & 31] = m;
        __syncthreads();
        m = part[0][tid & 31] + part[1][tid & 31] + part[2][tid & 31] + part[3][tid & 31];
        float vj = bf2f(row[(2 * a.Hk) * GDN_D + h * GDN_D + j]);
        float delta = beta * (vj - m);
        float o = 0.f;
#pragma unroll
        for (int r = 0; r < 32; r++) { s[r] = fmaf(ks[i0 + r], delta, s[r]); o = fmaf(s[r], qs[i0 + r], o); }
        __syncthreads();  // everyone has read part (m)
        part[warp][tid & 31] = o;
        __syncthreads();
        if (warp == 0) a.out[(int64_t)c * a.ldo + h * GDN_D + j] = f2bf(part[0][tid] + part[1][tid] + part[2][tid] + part[3][tid]);
        if (sout >= 0) {
            float* S = a.state + sout * a.slot_stride + ((int64_t)h * GDN_D + i0) * GDN_D + j;
#pragma unroll
            for (int r = 0; r < 32; r++) S[r * GDN_D] = s[r];
        }
        __syncthreads();  // qs, ks, part are reused by the next column
    }
}
static void gdn_step(const GdnStepArgs& a, cudaStream_t stream) {
    CHECK(a.Hv % a.Hk == 0, "gdn_step: Hv %d not a multiple of Hk %d", a.Hv, a.Hk);
    dim3 grid(a.Hv, GDN_D / GDN_COLS, a.lanes ? a.C : 1);
    launch_k(gdn_step_kernel, grid, GDN_THREADS, 0, stream, a);
    cudaCheck(cudaGetLastError());
}

// ---- 7.6 attention decode: kv formats, attn_prep, split-k attention -------------------------
// attention decode (model.md 2.4): bf16 kv cache, split-k over the context, gqa
//
// cache per layer: K and V [Hkv][cap][256] bf16 (position-addressed; rows past the visible
// length are never read, so they may hold anything). attn_prep writes the C new columns at
// their positions first; then column c attends to keys 0..pos[c] (mtp verification: the
// draft columns see each other causally).
// attn_decode: block (kv head h, split sp) handles keys [sp*split_keys, +split_keys) for all
// G*C queries of that kv head on the tensor cores (q K^T and p v as mma.sync, the kernel's
// comment says how); the partial (m, l, acc) of each split goes to scratch; attn_combine
// merges the splits, normalizes, rounds to bf16 and applies the output gate:
// y = bf16(o * bf16(sigmoid(gate))). scores are fp32 (q*k products of bf16 summed in fp32,
// scale 1/16 exact); p and the sums fp32.

enum { ATT_HD = 256, ATT_KEYS = 128, ATT_THREADS = 128, ATT_MAX_Q = 16 };

// kv cache formats (reference-engine.md 15). the codes live in [Hkv][cap][256] planes like the
// bf16 cache (one byte per element for int8 / fp8), plus fp16 scales [Hkv][cap][4], one per 64
// contiguous elements of a head vector:
//   int8 (NInfer's INT8-G64): s = f16_rne(max|x| / 127), code = clamp(rne(x / s), -127, 127)
//        (x * (1/s), 0 when s = 0), x ~ code * s
//   fp8 (ours; NInfer's fp8 codec is not documented): e4m3 with the same per-64 scale,
//        s = f16_rne(max|x| / 448) so the group's largest element lands at the top of the e4m3
//        range, code = e4m3_rn_satfinite(x * (1/s)), x ~ code * s. e4m3 keeps 3 mantissa bits
//        at every magnitude, so small elements of a group keep their relative precision
//        (int8 loses them); the step at the top of the range is coarser (1/16 vs 1/127).
enum KvDtype { KV_BF16 = 0, KV_INT8 = 1, KV_FP8 = 2 };
enum { KV_GROUP = 64, KV_GROUPS = ATT_HD / KV_GROUP };
static const char* kv_dtype_name(int kv) { return kv == KV_INT8 ? "int8" : kv == KV_FP8 ? "fp8" : "bf16"; }
static int kv_elem_bytes(int kv) { return kv == KV_BF16 ? 2 : 1; }
// one attention layer's cache on the device: codes [Hkv][cap][256] in the KvDtype, and for
// int8 / fp8 fp16 scales [Hkv][cap][KV_GROUPS] (null for bf16)
// paging (the --max-concurrency lanes share one pool of cap rows in pages of KV_PAGE rows):
// column c's logical row p lives at physical row pages[c * page_ld + p / KV_PAGE] * KV_PAGE +
// p % KV_PAGE (page_ld 0: every column reads the one table at pages); pages null: physical =
// logical. KV_PAGE is a multiple of the decode (ATT_KEYS) and prefill (FA_BK) key tiles, so a
// tile never straddles pages.
enum { KV_PAGE = 128 };
struct KvCache {
    int kv = KV_BF16; void* kc = nullptr; void* vc = nullptr; __half* ksc = nullptr; __half* vsc = nullptr; int64_t cap = 0;
    const int* pages = nullptr; int page_ld = 0;  // device page table (above), nullable
};
static_assert(KV_PAGE % ATT_KEYS == 0, "a decode key tile must not straddle kv pages");
// the physical cache row of logical row p through one sequence's page table (null: identity)
__device__ __forceinline__ int64_t kv_row(const int* pages, int64_t p) {
    return pages ? (int64_t)pages[p / KV_PAGE] * KV_PAGE + p % KV_PAGE : p;
}

// 8 consecutive elements (dims d0..d0+7) of one cache row (row = kv_head * cap + position)
template <int KV> struct KvVec;
template <> struct KvVec<KV_BF16> {
    uint4 r;
    __device__ __forceinline__ void load(const void* c, const __half*, int64_t row, int d0) {
        r = *(const uint4*)((const bf16_t*)c + row * ATT_HD + d0);
    }
    __device__ __forceinline__ void zero() { r = make_uint4(0, 0, 0, 0); }
    __device__ __forceinline__ void get(float (&f)[8]) const {
        const __nv_bfloat162* p2 = (const __nv_bfloat162*)&r;
#pragma unroll
        for (int e = 0; e < 4; e++) { float2 v = __bfloat1622float2(p2[e]); f[2 * e] = v.x; f[2 * e + 1] = v.y; }
    }
};
template <> struct KvVec<KV_INT8> {
    uint2 r; float s;
    __device__ __forceinline__ void load(const void* c, const __half* sc, int64_t row, int d0) {
        r = *(const uint2*)((const int8_t*)c + row * ATT_HD + d0);
        s = __half2float(sc[row * KV_GROUPS + d0 / KV_GROUP]);
    }
    __device__ __forceinline__ void zero() { r = make_uint2(0, 0); s = 0.f; }
    __device__ __forceinline__ void get(float (&f)[8]) const {
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = (float)(int8_t)(((i < 4 ? r.x : r.y) >> (8 * (i & 3))) & 0xFF) * s;
    }
};
template <> struct KvVec<KV_FP8> {
    uint2 r; float s;
    __device__ __forceinline__ void load(const void* c, const __half* sc, int64_t row, int d0) {
        r = *(const uint2*)((const uint8_t*)c + row * ATT_HD + d0);
        s = __half2float(sc[row * KV_GROUPS + d0 / KV_GROUP]);
    }
    __device__ __forceinline__ void zero() { r = make_uint2(0, 0); s = 0.f; }
    __device__ __forceinline__ void get(float (&f)[8]) const {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(((e < 2 ? r.x : r.y) >> (16 * (e & 1))) & 0xFFFF), __NV_E4M3);
            float2 v = __half22float2(*(const __half2*)&h);
            f[2 * e] = v.x * s; f[2 * e + 1] = v.y * s;
        }
    }
};

// the attention inputs of C columns in one kernel (instead of rmsnorm x2, mrope x2, kv_append):
// block = (column, head), thread = dim. q heads: zero-centred rmsnorm (1+w), then m-rope, in
// place. kv heads: the same for k, then k and v appended at logical row kvpos[c] through
// column c's page table (int8 / fp8 quantized per 64 elements). the roundings are those of
// the separate kernels (rmsnorm, and test/dev_kernels.cuh's mrope and kv_append):
// y = bf16(x * inv * (1+w)); rotated dims bf16(bf16(x1 c) -+ bf16(x2 s)) with c, s rounded
// to bf16.
struct AttnPrepParams {
    bf16_t* qk; int ldqk;               // [C][(Hq+Hkv)*256]: q heads then k heads
    const bf16_t* v; int ldv;           // [C][Hkv*256]
    const bf16_t* qw; const bf16_t* kw; // norm weights (256)
    const int* pos3; const int* kvpos;  // [C][3], [C]
    void* kc; void* vc; __half* ksc; __half* vsc; int64_t cap;
    const int* pages; int page_ld;      // column c's page table at pages + c*page_ld (KvCache)
    int Hq, Hkv, half, sec_h, sec_w;
    float eps;
    float inv_freq[64];
};
template <int KV>
__global__ void __launch_bounds__(ATT_HD) attn_prep_kernel(AttnPrepParams a) {
    pdl_entry_small();
    const int nh = a.Hq + a.Hkv, c = blockIdx.x / nh, hh = blockIdx.x % nh, d = threadIdx.x, warp = d >> 5;
    const bool isk = hh >= a.Hq;
    __shared__ float ys[ATT_HD];
    __shared__ float wmax[2][ATT_HD / 32];
    bf16_t* row = a.qk + (int64_t)c * a.ldqk + (int64_t)hh * ATT_HD;
    const float x = bf2f(row[d]);
    const float ss = block_sum(x * x);
    const float inv = rsqrtf(ss / (float)ATT_HD + a.eps);
    const float wv = bf2f((isk ? a.kw : a.qw)[d]);
    ys[d] = bfround(x * inv * (1.f + wv));
    __syncthreads();
    float out = ys[d];
    if (d < 2 * a.half) {
        const int i = d < a.half ? d : d - a.half;
        const int axis = (i % 3 == 1 && i < 3 * a.sec_h) ? 1 : (i % 3 == 2 && i < 3 * a.sec_w) ? 2 : 0;
        const float ang = (float)a.pos3[c * 3 + axis] * a.inv_freq[i];
        float sn, cs;
        sincosf(ang, &sn, &cs);
        const float co = bfround(cs), si = bfround(sn), x1 = ys[i], x2 = ys[i + a.half];
        out = d < a.half ? bfround(x1 * co) - bfround(x2 * si) : bfround(x2 * co) + bfround(x1 * si);
    }
    const bf16_t ob = f2bf(out);
    row[d] = ob;
    if (!isk) return;
    const int h = hh - a.Hq;
    const int64_t lp = a.kvpos[c];
    if (lp < 0) return;  // uniform over the block
    const int64_t p = kv_row(a.pages ? a.pages + (int64_t)c * a.page_ld : nullptr, lp);
    if (p >= a.cap) return;
    const int64_t crow = (int64_t)h * a.cap + p;
    const float xv = bf2f(a.v[(int64_t)c * a.ldv + h * ATT_HD + d]);
    if constexpr (KV == KV_BF16) {
        ((bf16_t*)a.kc)[crow * ATT_HD + d] = ob;
        ((bf16_t*)a.vc)[crow * ATT_HD + d] = f2bf(xv);
    } else {
        const float xk = bf2f(ob);
        float mk = warp_max(fabsf(xk)), mv = warp_max(fabsf(xv));
        if ((d & 31) == 0) { wmax[0][warp] = mk; wmax[1][warp] = mv; }
        __syncthreads();
        const int gw = (d / KV_GROUP) * 2;
        mk = fmaxf(wmax[0][gw], wmax[0][gw + 1]);
        mv = fmaxf(wmax[1][gw], wmax[1][gw + 1]);
        const float qmax = KV == KV_INT8 ? 127.f : 448.f;
        const __half hk = __float2half_rn(mk / qmax), hv = __float2half_rn(mv / qmax);
        const float sk = __half2float(hk), sv = __half2float(hv);
        const float ik = sk > 0.f ? 1.f / sk : 0.f, iv = sv > 0.f ? 1.f / sv : 0.f;
        if constexpr (KV == KV_INT8) {
            ((int8_t*)a.kc)[crow * ATT_HD + d] = (int8_t)fminf(fmaxf(rintf(xk * ik), -127.f), 127.f);
            ((int8_t*)a.vc)[crow * ATT_HD + d] = (int8_t)fminf(fmaxf(rintf(xv * iv), -127.f), 127.f);
        } else {
            ((uint8_t*)a.kc)[crow * ATT_HD + d] = (uint8_t)__nv_cvt_float_to_fp8(xk * ik, __NV_SATFINITE, __NV_E4M3);
            ((uint8_t*)a.vc)[crow * ATT_HD + d] = (uint8_t)__nv_cvt_float_to_fp8(xv * iv, __NV_SATFINITE, __NV_E4M3);
        }
        if (d % KV_GROUP == 0) { a.ksc[crow * KV_GROUPS + d / KV_GROUP] = hk; a.vsc[crow * KV_GROUPS + d / KV_GROUP] = hv; }
    }
}
// the launcher's arguments (the kernel's AttnPrepParams add the rope frequencies)
struct AttnPrepArgs {
    bf16_t* qk = nullptr; int ldqk = 0;              // [C][(Hq+Hkv)*256]: q heads then k heads, in place
    const bf16_t* v = nullptr; int ldv = 0;          // [C][Hkv*256]
    const bf16_t* qw = nullptr; const bf16_t* kw = nullptr;  // q / k norm weights (256)
    const int* pos3 = nullptr; const int* kvpos = nullptr;   // [C][3] m-rope positions, [C] cache rows (device)
    KvCache c;
    int C = 0, Hq = 0, Hkv = 0, rot = 0;             // rot: rotated dims per head
    float theta = 0.f, eps = 0.f;
    const int* sections = nullptr;                   // m-rope sections [3]
};
static void attn_prep(const AttnPrepArgs& in, cudaStream_t stream) {
    const int rot = in.rot;
    CHECK(rot % 2 == 0 && rot / 2 <= 64 && rot <= ATT_HD, "attn_prep: rotary dims %d", rot);
    AttnPrepParams a;
    a.qk = in.qk; a.ldqk = in.ldqk; a.v = in.v; a.ldv = in.ldv; a.qw = in.qw; a.kw = in.kw; a.pos3 = in.pos3; a.kvpos = in.kvpos;
    a.kc = in.c.kc; a.vc = in.c.vc; a.ksc = in.c.ksc; a.vsc = in.c.vsc; a.cap = in.c.cap; a.pages = in.c.pages; a.page_ld = in.c.page_ld;
    a.Hq = in.Hq; a.Hkv = in.Hkv; a.half = rot / 2;
    a.sec_h = in.sections[1]; a.sec_w = in.sections[2]; a.eps = in.eps;
    rope_inv_freq(in.theta, rot, a.inv_freq);
    const unsigned blocks = (unsigned)(in.C * (in.Hq + in.Hkv));
    const int kv = in.c.kv;
    if (kv == KV_INT8) launch_k(attn_prep_kernel<KV_INT8>, blocks, ATT_HD, 0, stream, a);
    else if (kv == KV_FP8) launch_k(attn_prep_kernel<KV_FP8>, blocks, ATT_HD, 0, stream, a);
    else launch_k(attn_prep_kernel<KV_BF16>, blocks, ATT_HD, 0, stream, a);
}

struct AttnArgs {
    const bf16_t* q; int ldq;         // column c, head hq at q + c*ldq + hq*256 (normed, roped)
    const void* kc; const void* vc; int64_t cap;   // codes [Hkv][cap][256] (KvDtype)
    const __half* ksc; const __half* vsc;          // int8 / fp8 scales [Hkv][cap][4], else null
    const int* pos;                   // [C] device
    int C, Hq, Hkv;
    int n_splits, split_keys;         // split_keys a multiple of ATT_KEYS
    const int* pages; int page_ld;    // KvCache's page table; shared-kv columns read the one at pages
    bool lanes; const int* split_keys_col;  // AttnDecodeArgs: grid.z = column, each its own table and plan
    float* part_acc;                  // [Hkv][n_splits][G*C][256]
    float* part_ml;                   // [Hkv][n_splits][G*C][2]
    float scale;
};

// a lane's 8 consecutive elements d0..d0+7 of one cache row as 4 bf16x2 words, the lower dim in
// the low half. int8 and e4m3 codes are bf16 values, so the codes convert exactly.
template <int KV>
__device__ __forceinline__ uint4 kv_frag8(const void* c, int64_t row, int d0) {
    if constexpr (KV == KV_BF16) {
        return *(const uint4*)((const bf16_t*)c + row * ATT_HD + d0);
    } else {
        const uint2 r = *(const uint2*)((const uint8_t*)c + row * ATT_HD + d0);
        uint32_t w[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const uint32_t pair = ((e < 2 ? r.x : r.y) >> (16 * (e & 1))) & 0xFFFF;
            float2 f;
            if constexpr (KV == KV_INT8) {
                f = make_float2((float)(int8_t)(pair & 0xFF), (float)(int8_t)(pair >> 8));
            } else {
                __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)pair, __NV_E4M3);
                f = __half22float2(*(const __half2*)&hr);
            }
            __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
            w[e] = *(const uint32_t*)&b;
        }
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
}
// two floats as one bf16x2 word (rne), lo in the low half
__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
    __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    return *(const uint32_t*)&b;
}
// p as three bf16 terms (each the bf16 of what the ones before leave): p to ~2^-26 relative
// through the bf16 mma, as exact as fp32 p (two terms, 2^-17, left the outputs 10x further
// from the float64 rounding than the cuda-core kernel's; bench-notes, session 14)
__device__ __forceinline__ void split_bf2(float a, float b, uint32_t (&w)[3]) {
#pragma unroll
    for (int k = 0; k < 3; k++) {
        w[k] = pack_bf2(a, b);
        const __nv_bfloat162 h = *(const __nv_bfloat162*)&w[k];
        a -= __low2float(h); b -= __high2float(h);
    }
}

// block (kv head h, split sp[, lanes: column blockIdx.z]) takes keys [sp*split_keys, +split_keys)
// of all its queries (G per column: up to 8 for NT 1, 16 for NT 2); warp w takes the split's
// 16-key chunks w, w+4, ... and keeps its own online softmax; the 4 warps merge at the end in
// warp order. per chunk, with mma.sync m16n8k16 (bf16 in, fp32 sums), g = lane/4, t = lane%4:
//   S = Q K^T [16 queries][16 keys]: A = q (shared), B = K rows straight from global: lane
//       (g, t) reads 16 bytes (dims 32c + 8t ..) of key g of each 8-key tile, and those dims
//       fill its k slots of two k-steps; q's A fragments take the same dims, so the product is
//       Q K^T over permuted dims. 4 lanes read a 64-byte run of a key: whole sectors.
//   online softmax on S's registers: a query's 4 keys of the chunk are in one quad of lanes.
//   O^T += V^T P^T [256 dims][8 queries]: A = V^T, lane (g, t) reads 16 bytes (dims 64i + 8g
//       ..) of keys 2t, 2t+1, 8+2t, 9+2t (8 lanes a 128-byte run) and pairs two keys' halves
//       per dim with a byte permute; B = P^T is S's accumulator layout as it stands (query g,
//       keys 2t, 2t+1 of each tile), as three bf16 terms so that p keeps fp32 precision.
// int8 / fp8: the codes go in exactly; scores sum each 64-dim group apart and scale it by the
// key's k scale; p is multiplied by the key's v scale of each group before its split.
// scores scale by 1/16 after the sum (a power of two: the same as scaling q); p and the sums
// fp32. keys past the split or past a query's last key get p = 0 (their rows are clamped to the
// split's last key, so nothing past the visible cache is read).
enum { ATT_CHUNK = 16, ATT_QLD = ATT_HD + 32 };  // q rows padded: the A fragments' loads are conflict-free
template <int NT, int KV>
__global__ void __launch_bounds__(ATT_THREADS, 2) attn_decode_kernel(AttnArgs a) {
    pdl_entry_small();
    constexpr bool Q8 = KV != KV_BF16;
    constexpr int NQ = 8 * NT;
    const int h = blockIdx.x, sp = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    // the block's columns: all C (one sequence), or lanes: column blockIdx.z alone, with the
    // same arithmetic as a lone launch of that column (only the partials' slots differ)
    const int z = a.lanes ? (int)blockIdx.z : 0, C = a.lanes ? 1 : a.C;
    const bf16_t* qz = a.q + (int64_t)z * a.ldq;
    const int* pos = a.pos + z;
    const int* pages = a.pages ? a.pages + (int64_t)z * a.page_ld : nullptr;
    const int split_keys = a.lanes ? a.split_keys_col[z] : a.split_keys;
    const int G = a.Hq / a.Hkv, nq = G * C, nq_all = G * a.C, q_first = z * G;
    __shared__ __align__(16) bf16_t qs[NQ][ATT_QLD];
    __shared__ __align__(16) float red[4][8][ATT_HD];  // the warps' p v sums of one query tile
    __shared__ float wml[4][NQ][2];                    // the warps' (m, l) per query
    int lmax = 0;
    for (int c = 0; c < C; c++) lmax = max(lmax, pos[c] + 1);
    for (int i = tid; i < NQ * (ATT_HD / 8); i += ATT_THREADS) {
        const int qi = i / (ATT_HD / 8), d = (i % (ATT_HD / 8)) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (qi < nq) v = *(const uint4*)(qz + (int64_t)(qi / G) * a.ldq + (h * G + qi % G) * ATT_HD + d);
        *(uint4*)&qs[qi][d] = v;
    }
    // the lane's query rows g and g + 8 (S's accumulator rows): the last key each sees
    const int vis0 = g < nq ? pos[g / G] : -1, vis1 = NT == 2 && g + 8 < nq ? pos[(g + 8) / G] : -1;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // rows g, g + 8 (the lane's part of l)
    // O^T: [query tile][64-dim group i][m-tile j][c]: dims 64i + 8g + 2j (c 0, 1) and + 1 (c 2, 3),
    // queries 8 nt + 2t (c 0, 2) and + 1 (c 1, 3)
    float acc[NT][4][4][4] = {};
    const int64_t hrow = (int64_t)h * a.cap;  // cache row of physical row 0 of this kv head
    const int kbeg = sp * split_keys;
    const int kend = min(kbeg + split_keys, lmax);  // empty: the partial stays m = -inf (skipped)
    __syncthreads();
    for (int k0 = kbeg + warp * ATT_CHUNK; k0 < kend; k0 += 4 * ATT_CHUNK) {
        const int64_t trow = hrow + kv_row(pages, k0);  // the chunk's keys are consecutive rows of one page
        const int last = kend - 1 - k0;
        auto krow = [&](int k) { return trow + min(k, last); };
        // (1) S: tile jt holds keys 8 jt .. 8 jt + 7 of the chunk; s[jt][c]: row g (c 0, 1) or
        // g + 8 (c 2, 3), key 8 jt + 2t (c 0, 2) or + 1 (c 1, 3)
        float s[2][4] = {};
#pragma unroll
        for (int gi = 0; gi < KV_GROUPS; gi++) {
            float sg[2][4] = {};  // this group's sums (int8 / fp8: scaled by the key's k scale below)
#pragma unroll
            for (int cc = 0; cc < 2; cc++) {
                const int d0 = 64 * gi + 32 * cc + 8 * t;
                const uint4 qa = *(const uint4*)&qs[g][d0];
                uint4 qb = make_uint4(0, 0, 0, 0);
                if constexpr (NT == 2) qb = *(const uint4*)&qs[g + 8][d0];
#pragma unroll
                for (int jt = 0; jt < 2; jt++) {
                    const uint4 u = kv_frag8<KV>(a.kc, krow(8 * jt + g), d0);
                    float (&dst)[4] = Q8 ? sg[jt] : s[jt];
                    mma_bf16_16816(dst, qa.x, qb.x, qa.y, qb.y, u.x, u.y);
                    mma_bf16_16816(dst, qa.z, qb.z, qa.w, qb.w, u.z, u.w);
                }
            }
            if constexpr (Q8) {
#pragma unroll
                for (int jt = 0; jt < 2; jt++) {
                    const float sc0 = __half2float(a.ksc[krow(8 * jt + 2 * t) * KV_GROUPS + gi]);
                    const float sc1 = __half2float(a.ksc[krow(8 * jt + 2 * t + 1) * KV_GROUPS + gi]);
                    s[jt][0] = fmaf(sg[jt][0], sc0, s[jt][0]); s[jt][1] = fmaf(sg[jt][1], sc1, s[jt][1]);
                    s[jt][2] = fmaf(sg[jt][2], sc0, s[jt][2]); s[jt][3] = fmaf(sg[jt][3], sc1, s[jt][3]);
                }
            }
        }
        // (2) online softmax of rows g and g + 8 (the quad's 4 lanes hold a row's 16 keys)
        float alpha[2];
#pragma unroll
        for (int r = 0; r < NT; r++) {
            const int vis = r ? vis1 : vis0;
            float cm = -INFINITY;
#pragma unroll
            for (int jt = 0; jt < 2; jt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = k0 + 8 * jt + 2 * t + e;
                    float& v = s[jt][2 * r + e];
                    v = key <= vis && key < kend ? v * a.scale : -INFINITY;
                    cm = fmaxf(cm, v);
                }
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 1));
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 2));
            const float mn = fmaxf(m_run[r], cm);
            alpha[r] = mn == -INFINITY ? 1.f : expf(m_run[r] - mn);
            float sum = 0.f;
#pragma unroll
            for (int jt = 0; jt < 2; jt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float& v = s[jt][2 * r + e];
                    v = mn == -INFINITY ? 0.f : expf(v - mn);
                    sum += v;
                }
            l_run[r] = l_run[r] * alpha[r] + sum;
            m_run[r] = mn;
        }
        // (3) O^T: rescale the columns (queries 8 nt + 2t, + 1: their alpha is in quads 2t, 2t + 1)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const float a0 = __shfl_sync(0xffffffffu, alpha[nt], 8 * t), a1 = __shfl_sync(0xffffffffu, alpha[nt], 8 * t + 4);
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    acc[nt][i][j][0] *= a0; acc[nt][i][j][1] *= a1; acc[nt][i][j][2] *= a0; acc[nt][i][j][3] *= a1;
                }
        }
        // then add V^T P^T. the lane's keys: 2t, 2t + 1, 8 + 2t, 9 + 2t (B's k slots 2t, 2t + 1,
        // 2t + 8, 2t + 9), which are S's columns of this lane: p of key kk[x] is s[x / 2][2r + x % 2]
        int64_t vrow[4];
#pragma unroll
        for (int x = 0; x < 4; x++) vrow[x] = krow(8 * (x / 2) + 2 * t + (x & 1));
        float vsc[4][KV_GROUPS];
        if constexpr (Q8) {
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const uint2 r = *(const uint2*)(a.vsc + vrow[x] * KV_GROUPS);
                const float2 lo = __half22float2(*(const __half2*)&r.x), hi = __half22float2(*(const __half2*)&r.y);
                vsc[x][0] = lo.x; vsc[x][1] = lo.y; vsc[x][2] = hi.x; vsc[x][3] = hi.y;
            }
        }
        uint32_t bp[NT][2][3];  // B = P^T: [query tile][keys 2t.. / 8 + 2t..][split term]
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint4 v[4];
#pragma unroll
            for (int x = 0; x < 4; x++) v[x] = kv_frag8<KV>(a.vc, vrow[x], 64 * i + 8 * g);
            if (Q8 || i == 0) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int jt = 0; jt < 2; jt++) {
                        float p0 = s[jt][2 * nt], p1 = s[jt][2 * nt + 1];
                        if constexpr (Q8) { p0 *= vsc[2 * jt][i]; p1 *= vsc[2 * jt + 1][i]; }
                        split_bf2(p0, p1, bp[nt][jt]);
                    }
            }
            const uint32_t* w0 = &v[0].x; const uint32_t* w1 = &v[1].x; const uint32_t* w2 = &v[2].x; const uint32_t* w3 = &v[3].x;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint32_t a0 = __byte_perm(w0[j], w1[j], 0x5410), a1 = __byte_perm(w0[j], w1[j], 0x7632);
                const uint32_t a2 = __byte_perm(w2[j], w3[j], 0x5410), a3 = __byte_perm(w2[j], w3[j], 0x7632);
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int k = 0; k < 3; k++) mma_bf16_16816(acc[nt][i][j], a0, a1, a2, a3, bp[nt][0][k], bp[nt][1][k]);
            }
        }
    }
    // the block's partials: the warps merged in warp order
#pragma unroll
    for (int r = 0; r < NT; r++) {
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
        if (t == 0) { wml[warp][g + 8 * r][0] = m_run[r]; wml[warp][g + 8 * r][1] = l_run[r]; }
    }
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {  // this lane's query columns 8 nt + 2t + e
            const int qq = 8 * nt + 2 * t + e;
            float M = -INFINITY;
#pragma unroll
            for (int w = 0; w < 4; w++) M = fmaxf(M, wml[w][qq][0]);
            const float mw = wml[warp][qq][0], f = mw == -INFINITY ? 0.f : expf(mw - M);
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int d = 64 * i + 8 * g + 2 * j;
                    *(float2*)&red[warp][2 * t + e][d] = make_float2(acc[nt][i][j][e] * f, acc[nt][i][j][2 + e] * f);
                }
        }
        __syncthreads();
        for (int idx = tid; idx < 8 * ATT_HD; idx += ATT_THREADS) {
            const int qq = idx / ATT_HD, d = idx % ATT_HD, qi = 8 * nt + qq;
            if (qi >= nq) break;  // uniform over the rest of the loop: qi only grows
            const int64_t slot = ((int64_t)h * a.n_splits + sp) * nq_all + q_first + qi;
            a.part_acc[slot * ATT_HD + d] = red[0][qq][d] + red[1][qq][d] + red[2][qq][d] + red[3][qq][d];
            if (d == 0) {
                float M = -INFINITY, L = 0.f;
                for (int w = 0; w < 4; w++) M = fmaxf(M, wml[w][qi][0]);
                for (int w = 0; w < 4; w++) {
                    const float mw = wml[w][qi][0];
                    L += mw == -INFINITY ? 0.f : wml[w][qi][1] * expf(mw - M);
                }
                a.part_ml[slot * 2] = M; a.part_ml[slot * 2 + 1] = L;
            }
        }
        if (nt + 1 < NT) __syncthreads();  // red is rewritten by the next query tile
    }
}

// merge the splits of column c, query head hq (block): warp w sums splits w, w + 8, .. (lanes
// over dims, 8 each), then the 8 warps' sums are added in warp order. every split's partial is
// written (empty ones m = -inf, l = 0, acc = 0) and weighs 0, so the loop has no branches.
enum { ATT_COMBINE_WARPS = ATT_HD / 32 };
__global__ void __launch_bounds__(ATT_HD) attn_combine_kernel(AttnArgs a, const bf16_t* __restrict__ gate, int ldg, bf16_t* y, int ldy) {
    pdl_entry_small();
    const int c = blockIdx.x / a.Hq, hq = blockIdx.x % a.Hq, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int G = a.Hq / a.Hkv, nq = G * a.C, h = hq / G, qi = c * G + hq % G;
    const int64_t slot0 = (int64_t)h * a.n_splits * nq + qi;  // split s: slot0 + s * nq
    __shared__ __align__(16) float red[ATT_COMBINE_WARPS][ATT_HD];
    __shared__ float wl[ATT_COMBINE_WARPS], wm[ATT_COMBINE_WARPS];
    float M = -INFINITY;
    for (int s = tid; s < a.n_splits; s += ATT_HD) M = fmaxf(M, a.part_ml[(slot0 + (int64_t)s * nq) * 2]);
    M = warp_max(M);
    if (lane == 0) wm[warp] = M;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < ATT_COMBINE_WARPS; w++) M = fmaxf(M, wm[w]);
    float o[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, L = 0.f;
#pragma unroll 4
    for (int s = warp; s < a.n_splits; s += ATT_COMBINE_WARPS) {
        const int64_t slot = slot0 + (int64_t)s * nq;
        const float m = a.part_ml[slot * 2], l = a.part_ml[slot * 2 + 1];
        const float4 x0 = *(const float4*)(a.part_acc + slot * ATT_HD + lane * 8), x1 = *(const float4*)(a.part_acc + slot * ATT_HD + lane * 8 + 4);
        const float e = m == -INFINITY ? 0.f : expf(m - M);
        L = fmaf(l, e, L);
        o[0] = fmaf(x0.x, e, o[0]); o[1] = fmaf(x0.y, e, o[1]); o[2] = fmaf(x0.z, e, o[2]); o[3] = fmaf(x0.w, e, o[3]);
        o[4] = fmaf(x1.x, e, o[4]); o[5] = fmaf(x1.y, e, o[5]); o[6] = fmaf(x1.z, e, o[6]); o[7] = fmaf(x1.w, e, o[7]);
    }
    *(float4*)&red[warp][lane * 8] = make_float4(o[0], o[1], o[2], o[3]);
    *(float4*)&red[warp][lane * 8 + 4] = make_float4(o[4], o[5], o[6], o[7]);
    if (lane == 0) wl[warp] = L;
    __syncthreads();
    float out = 0.f, Lt = 0.f;
#pragma unroll
    for (int w = 0; w < ATT_COMBINE_WARPS; w++) { out += red[w][tid]; Lt += wl[w]; }
    out = Lt > 0.f ? out / Lt : 0.f;
    if (gate) out = bfround(out) * bfround(sigmoid_f(bf2f(gate[(int64_t)c * ldg + hq * ATT_HD + tid])));
    y[(int64_t)c * ldy + hq * ATT_HD + tid] = f2bf(out);
}

// scratch floats attn_decode needs for (Hkv, n_splits, queries per launch); lanes > 0: for
// that many independent columns (AttnDecodeArgs::lanes)
static size_t attn_scratch_floats(int Hq, int Hkv, int n_splits, int lanes = 0) {
    int G = Hq / Hkv, cols = lanes > 0 ? lanes : ATT_MAX_Q / G;
    return (size_t)Hkv * n_splits * (G * cols) * (ATT_HD + 2);
}
// y[c] = gate-scaled attention of the C columns (q heads of column c at q + c*ldq), keys 0..pos[c].
// n_splits * split_keys must cover the longest visible context. scratch: attn_scratch_floats.
// gate: nullable [C][Hq*256] (ldg). shared-kv mode (the columns are one sequence, the mtp
// verify): columns go in launches of ATT_MAX_Q / G, reading each key once for all of them
// through the one page table at c.pages. lanes mode (every column its own sequence, up to the
// batch's C): one launch of grid (Hkv, n_splits, C) and one combine; column c reads its page
// row c.pages + c*page_ld and splits by split_keys_col[c], so n_splits * split_keys_col[c] must
// cover pos[c] + 1; its splits past pos[c] are empty and they weigh 0 in the combine, so its output
// is bit for bit that of a lone shared-kv launch of it with the same split_keys. a query's
// arithmetic does not depend on the other queries of its launch (the tensor cores sum each
// output element apart), so the verify's columns get the bits a decode step would.
struct AttnDecodeArgs {
    KvCache c;
    const bf16_t* q = nullptr; int ldq = 0;  // column c, head hq at q + c*ldq + hq*256 (normed, roped)
    const int* pos = nullptr;                // [C] device: the last visible key of each column
    int C = 0, Hq = 0, Hkv = 0;
    int n_splits = 0, split_keys = 0;        // the split plan (split_keys a multiple of ATT_KEYS)
    // lanes: every column is its own sequence (its own page table row, keys 0..pos[c]) with its
    // own plan: split_keys_col[c] keys per split (device [C]), n_splits the most any column needs
    bool lanes = false; const int* split_keys_col = nullptr;
    float* scratch = nullptr;                // attn_scratch_floats(Hq, Hkv, n_splits[, C when lanes])
    const bf16_t* gate = nullptr; int ldg = 0;  // nullable [C][Hq*256]
    bf16_t* y = nullptr; int ldy = 0;
};
// the decode kernel of a launch: one query tile (up to 8 queries) or two
static void attn_decode_launch(int kv, int nq, dim3 grid, const AttnArgs& a, cudaStream_t stream) {
    auto go = [&](auto kernel1, auto kernel2) { launch_k(nq <= 8 ? kernel1 : kernel2, grid, ATT_THREADS, 0, stream, a); };
    if (kv == KV_INT8) go(attn_decode_kernel<1, KV_INT8>, attn_decode_kernel<2, KV_INT8>);
    else if (kv == KV_FP8) go(attn_decode_kernel<1, KV_FP8>, attn_decode_kernel<2, KV_FP8>);
    else go(attn_decode_kernel<1, KV_BF16>, attn_decode_kernel<2, KV_BF16>);
}
using AttnCombineFn = void (*)(AttnArgs, const bf16_t*, int, bf16_t*, int);
// attn_decode with the given kernels (decode(kv, nq, grid, args, stream) and the combine): the
// launches, their columns and their scratch (test/dev_kernels.cuh runs version 1 through it)
template <typename Decode>
static void attn_decode_with(const AttnDecodeArgs& in, cudaStream_t stream, Decode decode, AttnCombineFn combine) {
    const int C = in.C, Hq = in.Hq, Hkv = in.Hkv, n_splits = in.n_splits;
    CHECK(Hq % Hkv == 0 && in.split_keys % ATT_KEYS == 0 && n_splits > 0, "attn_decode: bad arguments");
    int G = Hq / Hkv, cols = ATT_MAX_Q / G;
    CHECK(cols >= 1, "attn_decode: %d query heads per kv head is more than %d", G, ATT_MAX_Q);
    CHECK(!in.lanes || in.split_keys_col, "attn_decode: lanes without a split plan per column");
    CHECK(in.lanes || !in.c.pages || in.c.page_ld == 0 || C == 1, "attn_decode: shared-kv columns read one page table (page_ld %d)",
          in.c.page_ld);
    if (in.lanes) cols = C;  // one launch: the block's queries are one column's G
    for (int c0 = 0; c0 < C; c0 += cols) {
        AttnArgs a;
        a.q = in.q + (int64_t)c0 * in.ldq; a.ldq = in.ldq; a.kc = in.c.kc; a.vc = in.c.vc; a.cap = in.c.cap; a.pos = in.pos + c0;
        a.ksc = in.c.ksc; a.vsc = in.c.vsc;
        a.C = C - c0 < cols ? C - c0 : cols; a.Hq = Hq; a.Hkv = Hkv;
        a.n_splits = n_splits; a.split_keys = in.split_keys;
        a.pages = in.c.pages; a.page_ld = in.lanes ? in.c.page_ld : 0;
        a.lanes = in.lanes; a.split_keys_col = in.split_keys_col;
        a.part_acc = in.scratch;
        a.part_ml = in.scratch + (size_t)Hkv * n_splits * (G * cols) * ATT_HD;
        a.scale = 1.0f / sqrtf((float)ATT_HD);
        decode(in.c.kv, in.lanes ? G : G * a.C, dim3(Hkv, n_splits, in.lanes ? C : 1), a, stream);
        cudaCheck(cudaGetLastError());
        launch_k(combine, a.C * Hq, ATT_HD, 0, stream, a, in.gate ? in.gate + (int64_t)c0 * in.ldg : nullptr, in.ldg,
                 in.y + (int64_t)c0 * in.ldy, in.ldy);
        cudaCheck(cudaGetLastError());
    }
}
static void attn_decode(const AttnDecodeArgs& in, cudaStream_t stream) { attn_decode_with(in, stream, attn_decode_launch, attn_combine_kernel); }

// ---- 7.7 argmax -----------------------------------------------------------------------------
// argmax over the first n logits of each of C columns (greedy sampling), lowest id on ties;
// nan never wins. stage 1: ARGMAX_BLOCKS blocks per column each reduce a strided slice;
// stage 2: one warp per column merges them. logits fp32 or bf16.

enum { ARGMAX_THREADS = 256, ARGMAX_BLOCKS = 64 };

__device__ __forceinline__ void argmax_merge(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i) || (v != v && v2 == v2)) { v = v2; i = i2; }
}
template <typename T>
__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_stage1_kernel(const T* __restrict__ logits, int64_t ld, int n, float* pv, int* pi) {
    pdl_entry_small();
    const int c = blockIdx.y;
    const T* row = logits + (int64_t)c * ld;
    float v = -INFINITY; int idx = INT32_MAX;
    for (int k = blockIdx.x * ARGMAX_THREADS + threadIdx.x; k < n; k += ARGMAX_BLOCKS * ARGMAX_THREADS) {
        float x;
        if constexpr (sizeof(T) == 2) x = bf2f(row[k]); else x = row[k];
        if (x == x) argmax_merge(v, idx, x, k);
    }
    for (int o = 16; o; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, v, o); int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        argmax_merge(v, idx, v2, i2);
    }
    __shared__ float sv[ARGMAX_THREADS / 32]; __shared__ int si[ARGMAX_THREADS / 32];
    if ((threadIdx.x & 31) == 0) { sv[threadIdx.x >> 5] = v; si[threadIdx.x >> 5] = idx; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_THREADS / 32; w++) argmax_merge(v, idx, sv[w], si[w]);
        pv[c * ARGMAX_BLOCKS + blockIdx.x] = v; pi[c * ARGMAX_BLOCKS + blockIdx.x] = idx;
    }
}
__global__ void argmax_stage2_kernel(const float* __restrict__ pv, const int* __restrict__ pi, int* out) {
    pdl_entry_small();
    const int c = blockIdx.x, lane = threadIdx.x;
    float v = -INFINITY; int idx = INT32_MAX;
    for (int k = lane; k < ARGMAX_BLOCKS; k += 32) argmax_merge(v, idx, pv[c * ARGMAX_BLOCKS + k], pi[c * ARGMAX_BLOCKS + k]);
    for (int o = 16; o; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, v, o); int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        argmax_merge(v, idx, v2, i2);
    }
    if (lane == 0) out[c] = idx == INT32_MAX ? 0 : idx;
}
// scratch: ARGMAX_BLOCKS * C floats + as many ints (argmax_scratch_bytes)
static size_t argmax_scratch_bytes(int C) { return (size_t)C * ARGMAX_BLOCKS * 8; }
template <typename T>
static void argmax(const T* logits, int64_t ld, int n, int C, void* scratch, int* out, cudaStream_t stream) {
    float* pv = (float*)scratch; int* pi = (int*)(pv + (size_t)C * ARGMAX_BLOCKS);
    launch_k(argmax_stage1_kernel<T>, dim3(ARGMAX_BLOCKS, C), ARGMAX_THREADS, 0, stream, logits, ld, n, pv, pi);
    cudaCheck(cudaGetLastError());
    launch_k(argmax_stage2_kernel, C, 32, 0, stream, pv, pi, out);
    cudaCheck(cudaGetLastError());
}

// ---- 7.8 sampling on the device -------------------------------------------------------------
// sampling: sample()'s semantics (section 5) on the device, so that a sampled token costs 4
// bytes to the host instead of the domain's logits (~1 MB) and a cpu sort.
//
// a candidate is a 64-bit key: the order-preserving bits of its adjusted logit on top, its
// inverted id below. "larger key" is then exactly sample()'s order (adjusted logit descending,
// the lower id first on ties; -0 and +0 are one value) and no two keys are equal, so a radix
// select needs no tie rule. the stages, and why they are fused the way they are:
//   adjust   logit_bias (in list order, as sample() adds it), then the presence / frequency
//            penalty from the device count array (sampler_penalise: the same fp32 operations
//            as the cpu). elementwise, so it lives in whichever kernel reads the row first:
//            a separate pass would write and re-read the ~1 MB row for nothing.
//   top-k    1 <= k <= SAMPLE_KMAX (the usual case, k = 20): sample_topk_kernel, one block per
//            SAMPLE_CHUNK ids, keeps its chunk's best k (radix select in shared memory), then
//            sample_draw_kernel (one block) selects the best k of those, sorts them (bitonic in
//            shared memory) and finishes. two launches, the row read once.
//   all      top_k <= 0, or k > SAMPLE_KMAX: sample_keys_kernel writes every key and a bitonic
//            sort orders the whole (power-of-two padded) row: tile passes in shared memory and
//            global passes for the long strides (~40 launches for 248k ids: slow, ~0.1-0.2 ms,
//            but only for settings that are off the default), then sample_walk_kernel.
//   finish   temperature, weights w = exp(adj/T - top) (sampler_weight, the cpu's bits), min_p,
//            the shortest top_p prefix and the draw (rng_uniform of the same seed, position
//            and purpose), walking the kept set in sorted order. these are prefix sums in fp32:
//            one thread does them in sample()'s order, so the pick is sample()'s pick bit for
//            bit. past SAMPLE_SEQ_MAX candidates (top_k <= 0 over a real vocabulary) that is too
//            slow for one thread: 1024 threads each sum a segment and the segment sums are added
//            in order. sample() itself sums a top_k <= 0 row in the order its partial sort left
//            it, so there the totals differ in the last bits and a draw within a few ulp of a
//            boundary can go the other way; the distribution is the same (test_kernels).
// greedy (temperature <= 0) with a logit_bias is the k = 1 path without penalties or draw.

enum { SAMPLE_THREADS = 1024, SAMPLE_CHUNK = 4096, SAMPLE_KMAX = 1024, SAMPLE_SEQ_MAX = 8192, SAMPLE_TILE = 2048,
       SAMPLE_MAX_BIAS = 4096 };

// one sample() call as the kernels see it
struct SampleArgs {
    const float* logits;    // [n] a logits row (its first n entries: the token domain)
    int n;                  // the domain
    const int* counts;      // [n] times each id was generated; null: no penalties (greedy)
    float presence, frequency;
    const int* bias_id;     // [n_bias] distinct biased ids, ascending
    const int* bias_off;    // [n_bias + 1] each id's values in bias_val, in list order
    const float* bias_val;
    int n_bias;
    int k;                  // candidates: top_k when 0 < top_k < n, else n (1 for greedy)
    int greedy;             // the best candidate wins: no weights, no draw
    int exact;              // the prefix sums in one thread (sample()'s order)
    float inv_t, top_p, min_p;
    uint64_t seed, position;
    int purpose;
    uint64_t* cand;         // scratch [CEIL_DIV(n, SAMPLE_CHUNK) * SAMPLE_KMAX] per-chunk best k
    uint64_t* keys;         // scratch [sample_pad(n)] every key (the sort path)
    float* w;               // scratch [sample_pad(n)] weights (the sort path)
    int* out;               // [1] the picked id
};

// order-preserving bits of a float (-0 counts as +0, as sample()'s comparisons do), and back
__host__ __device__ __forceinline__ uint32_t sample_fkey(float f) {
    if (f == 0.0f) f = 0.0f;
    union { float f; uint32_t u; } v; v.f = f;
    return (v.u & 0x80000000u) ? ~v.u : (v.u | 0x80000000u);
}
__host__ __device__ __forceinline__ float sample_key_value(uint64_t key) {
    uint32_t k = (uint32_t)(key >> 32);
    union { float f; uint32_t u; } v; v.u = (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
    return v.f;
}
__host__ __device__ __forceinline__ int sample_key_id(uint64_t key) { return (int)~(uint32_t)key; }

// adjusted logit of id i: logit + its biases (list order), minus its penalty
__device__ __forceinline__ float sample_adjust(const SampleArgs& a, int i) {
    float x = a.logits[i];
    if (a.n_bias) {
        int lo = 0, hi = a.n_bias;  // the first biased id >= i
        while (lo < hi) { int mid = (lo + hi) >> 1; if (a.bias_id[mid] < i) lo = mid + 1; else hi = mid; }
        if (lo < a.n_bias && a.bias_id[lo] == i)
            for (int j = a.bias_off[lo]; j < a.bias_off[lo + 1]; j++) x = SMP_FADD(x, a.bias_val[j]);
    }
    if (a.counts) x = sampler_penalise(x, a.presence, a.frequency, a.counts[i]);
    return x;
}
__device__ __forceinline__ uint64_t sample_key(const SampleArgs& a, int i) {
    return (uint64_t)sample_fkey(sample_adjust(a, i)) << 32 | (uint32_t)~(uint32_t)i;
}

// the k-th largest of m distinct keys get(0..m), by the whole block: 8-bit digits from the
// top; each pass histograms the keys that share the digits found so far, and one warp scans
// the 256 bins (a shuffle scan over lanes of 8 bins) for the bin holding the k-th. it stops as
// soon as that bin holds exactly the keys still needed (for continuous logits: 3-4 passes).
// returns T with exactly min(k, m) of the keys >= T (0 when k >= m: all of them).
struct SampleSelect { int hist[256]; uint64_t prefix, mask; int need, done; };
template <typename Get>
__device__ uint64_t sample_block_select(Get get, int m, int k, SampleSelect& s) {
    if (k >= m) return 0;
    if (threadIdx.x == 0) { s.prefix = 0; s.mask = 0; s.need = k; s.done = 0; }
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) s.hist[i] = 0;
        __syncthreads();
        const uint64_t prefix = s.prefix, mask = s.mask;
        for (int i = threadIdx.x; i < m; i += blockDim.x) {
            uint64_t key = get(i);
            if ((key & mask) == prefix) atomicAdd(&s.hist[(key >> shift) & 255], 1);
        }
        __syncthreads();
        if (threadIdx.x < 32) {  // lane l: bins 255-8l down to 248-8l
            const int lane = threadIdx.x, need = s.need;
            int h[8], sum = 0;
            for (int j = 0; j < 8; j++) { h[j] = s.hist[255 - 8 * lane - j]; sum += h[j]; }
            int incl = sum;
            for (int o = 1; o < 32; o <<= 1) { int t = __shfl_up_sync(0xffffffffu, incl, o); if (lane >= o) incl += t; }
            int c = incl - sum;
            if (c < need && need <= incl) {
                for (int j = 0; j < 8; j++) {
                    if (c + h[j] >= need) {
                        s.prefix = prefix | (uint64_t)(255 - 8 * lane - j) << shift;
                        s.mask = mask | 255ull << shift;
                        s.need = need - c;
                        s.done = h[j] == need - c;
                        break;
                    }
                    c += h[j];
                }
            }
        }
        __syncthreads();
        if (s.done) break;
    }
    return s.prefix;
}

// bitonic sort of a shared array of P keys (a power of two), descending, by the whole block
__device__ void sample_block_sort(uint64_t* s, int P) {
    for (int size = 2; size <= P; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < P / 2; i += blockDim.x) {
                int lo = (i / stride) * 2 * stride + (i % stride), hi = lo + stride;
                bool desc = (lo & size) == 0;
                uint64_t x = s[lo], y = s[hi];
                if (desc ? x < y : x > y) { s[lo] = y; s[hi] = x; }
            }
            __syncthreads();
        }
}

// temperature, min_p, top_p and the draw over n sorted candidates keys[0..n) with weights
// w[0..n), by the whole block: nseg threads each own a contiguous segment; nseg = 1 is
// sample()'s loops operation for operation (starting sums at 0 and offsets of 0 change no bit).
struct SampleWalk { float seg_sum[SAMPLE_THREADS], seg_off[SAMPLE_THREADS]; int seg_cnt[SAMPLE_THREADS]; float total, mass; int above, kp, pick; };
__device__ void sample_walk(const SampleArgs& a, const uint64_t* keys, const float* w, int n, int nseg, SampleWalk& s) {
    const int t = threadIdx.x, S = CEIL_DIV(n, nseg), lo = min(n, t * S), hi = min(n, lo + S);
    if (t < nseg) {  // the total weight and the count above min_p
        float sum = 0.0f; int c = 0;
        for (int i = lo; i < hi; i++) { sum = SMP_FADD(sum, w[i]); c += w[i] >= a.min_p; }
        s.seg_sum[t] = sum; s.seg_cnt[t] = c;
    }
    __syncthreads();
    if (t == 0) {
        float acc = 0.0f; int c = 0;
        for (int i = 0; i < nseg; i++) { s.seg_off[i] = acc; acc = SMP_FADD(acc, s.seg_sum[i]); c += s.seg_cnt[i]; }
        s.total = acc; s.above = c; s.kp = n; s.pick = INT32_MAX;
    }
    __syncthreads();
    int keep = a.min_p > 0.0f ? max(s.above, 1) : n;
    if (a.top_p < 1.0f) {  // the shortest prefix whose weight reaches top_p of the total (at least 1)
        const float thr = SMP_FMUL(a.top_p, s.total);
        if (t < nseg) {
            float cum = s.seg_off[t];
            for (int i = lo; i < hi; i++) { cum = SMP_FADD(cum, w[i]); if (cum >= thr) { atomicMin(&s.kp, i + 1); break; } }
        }
        __syncthreads();
        keep = min(keep, s.kp);
    }
    if (t < nseg && lo < keep && keep <= hi) {  // the kept mass, by the segment holding keep - 1
        float m = s.seg_off[t];
        for (int i = lo; i < keep; i++) m = SMP_FADD(m, w[i]);
        s.mass = m;
    }
    __syncthreads();
    const float u0 = SMP_FMUL(rng_uniform(a.seed, a.position, a.purpose), s.mass);
    if (t < nseg && lo < keep) {  // the draw: the first i whose running weight passes u
        float u = SMP_FSUB(u0, s.seg_off[t]);
        for (int i = lo; i < min(hi, keep); i++) { u = SMP_FSUB(u, w[i]); if (u < 0.0f) { atomicMin(&s.pick, i); break; } }
    }
    __syncthreads();
    if (t == 0) {  // none: u met the rounding edge; then the last candidate of nonzero weight (sampler_draw)
        int i = s.pick;
        if (i == INT32_MAX) for (i = keep - 1; i > 0 && !(w[i] > 0.0f); i--) {}
        a.out[0] = sample_key_id(keys[i]);
    }
}

// top-k, stage 1: the best min(k, chunk) keys of each SAMPLE_CHUNK ids (unordered) to
// cand[blockIdx.x * k ..]; a short last chunk pads with key 0, below every real key
__device__ __forceinline__ void sample_topk_block(const SampleArgs& a) {
    __shared__ uint64_t keys[SAMPLE_CHUNK];
    __shared__ SampleSelect sel;
    __shared__ int cnt;
    const int base = blockIdx.x * SAMPLE_CHUNK, m = min(SAMPLE_CHUNK, a.n - base);
    for (int i = threadIdx.x; i < m; i += blockDim.x) keys[i] = sample_key(a, base + i);
    if (threadIdx.x == 0) cnt = 0;
    __syncthreads();
    const uint64_t T = sample_block_select([&](int i) { return keys[i]; }, m, a.k, sel);
    uint64_t* out = a.cand + (size_t)blockIdx.x * a.k;
    for (int i = threadIdx.x; i < m; i += blockDim.x)
        if (keys[i] >= T) out[atomicAdd(&cnt, 1)] = keys[i];
    for (int j = m + threadIdx.x; j < a.k; j += blockDim.x) out[j] = 0;
}
__global__ void __launch_bounds__(SAMPLE_THREADS) sample_topk_kernel(SampleArgs a) {
    pdl_entry();
    sample_topk_block(a);
}

// top-k, stage 2 (one block): the best k of the chunks' candidates, sorted, then the finish
// stage 2's selection, every thread of the block: the k largest of stage 1's keys (k per chunk)
// into top[0, k) in descending order, zeros up to the next power of two
__device__ __forceinline__ void sample_top(const SampleArgs& a, uint64_t* top, SampleSelect& sel, int& cnt) {
    const int k = a.k, m = CEIL_DIV(a.n, SAMPLE_CHUNK) * k;
    if (threadIdx.x == 0) cnt = 0;
    __syncthreads();
    const uint64_t T = sample_block_select([&](int i) { return a.cand[i]; }, m, k, sel);
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
        uint64_t key = a.cand[i];
        if (key >= T && key) top[atomicAdd(&cnt, 1)] = key;
    }
    int P = 1;
    while (P < k) P <<= 1;
    for (int i = k + threadIdx.x; i < P; i += blockDim.x) top[i] = 0;
    __syncthreads();
    sample_block_sort(top, P);
}
__device__ __forceinline__ void sample_draw_block(const SampleArgs& a) {
    __shared__ uint64_t top[SAMPLE_KMAX];
    __shared__ float w[SAMPLE_KMAX];
    __shared__ SampleSelect sel;
    __shared__ SampleWalk walk;
    __shared__ int cnt;
    const int k = a.k;
    sample_top(a, top, sel, cnt);
    if (a.greedy) { if (threadIdx.x == 0) a.out[0] = sample_key_id(top[0]); return; }
    const float topv = SMP_FMUL(sample_key_value(top[0]), a.inv_t);
    for (int i = threadIdx.x; i < k; i += blockDim.x) w[i] = sampler_weight(sample_key_value(top[i]), a.inv_t, topv);
    __syncthreads();
    sample_walk(a, top, w, k, 1, walk);
}
__global__ void __launch_bounds__(SAMPLE_THREADS) sample_draw_kernel(SampleArgs a) {
    pdl_entry();
    sample_draw_block(a);
}

// the lanes' draws (a batched decode step's sampled lanes, LaneSched): draw j is one sample()
// call a[j] over its own logits row, counts and bias table: the kernels above with blockIdx.y
// (top-k) or blockIdx.x (the draw) = j. accept[j]: the token the lane's step fed, counted in
// counts[j] before the draw (-1: they hold it already: the lane's first step since its
// sampler was uploaded)
__global__ void sample_accept_lanes_kernel(const SampleArgs* a, int* const* counts, const int* accept, int n) {
    pdl_entry();
    const int j = threadIdx.x;
    if (j >= n) return;
    const int id = accept[j];
    if (id >= 0 && id < a[j].n) counts[j][id]++;
}
__global__ void __launch_bounds__(SAMPLE_THREADS) sample_topk_lanes_kernel(const SampleArgs* a) {
    pdl_entry();
    sample_topk_block(a[blockIdx.y]);
}
__global__ void __launch_bounds__(SAMPLE_THREADS) sample_draw_lanes_kernel(const SampleArgs* a) {
    pdl_entry();
    sample_draw_block(a[blockIdx.x]);
}

// speculative sampling of one verification column (section 5's sample_spec; the bonus column:
// sample() with RNG_SPEC_BONUS) on the top-k path: stage 2 as sample_draw_kernel, then one
// thread does sample_spec's arithmetic over the sorted candidates, operation for operation (the
// kept set and its mass as sample_walk with one segment, the draft's weight and the others' in
// draw order, the accept test, the residual draw skipping the draft). columns run in order,
// each after its own stage 1; the column that ends the round (a rejection, or the bonus) sets
// *done and the later ones do nothing. the picked token is counted for the next columns'
// penalties (the host counts it too: the device and host counts stay equal).
// an mtp round's result block (generate_spec_gpu): [c][tokens of columns 0..c][the next
// round's drafts 1..K]
enum { SPEC_COLS = SPEC_MAX_K + 1, SPEC_BLK_RES = 0, SPEC_BLK_TOK = 1, SPEC_BLK_DRAFT = 1 + SPEC_COLS, SPEC_BLK_INTS = 1 + SPEC_COLS + SPEC_MAX_K };
struct SpecDraw {
    const int* ids;    // the verify's ids: column c's draft is ids[c + 1]
    const int* kvpos;  // the verify's kv rows: column c's token is at index kvpos[0] + c + 1
    int c, last;       // the column; the last (bonus) column
    int* res;          // the round's result block (SPEC_BLK_*): the column count and tokens
    int* done;         // the round ended at an earlier column
    int* counts;       // [n] the penalties' counts
};
__global__ void __launch_bounds__(SAMPLE_THREADS) sample_spec_kernel(SampleArgs a, SpecDraw sd) {
    pdl_entry();
    __shared__ uint64_t top[SAMPLE_KMAX];
    __shared__ float w[SAMPLE_KMAX];
    __shared__ SampleSelect sel;
    __shared__ int cnt;
    if (*sd.done) return;
    const int k = a.k;
    sample_top(a, top, sel, cnt);
    if (!a.greedy) {
        const float topv = SMP_FMUL(sample_key_value(top[0]), a.inv_t);
        for (int i = threadIdx.x; i < k; i += blockDim.x) w[i] = sampler_weight(sample_key_value(top[i]), a.inv_t, topv);
    }
    __syncthreads();
    if (threadIdx.x) return;
    const int c = sd.c, d = c < sd.last ? sd.ids[c + 1] : -1;
    const uint64_t position = (uint64_t)sd.kvpos[0] + c + 1;
    int tok = sample_key_id(top[0]);
    bool acc = false;
    if (a.greedy) {
        acc = tok == d;
    } else {
        float total = 0.0f; int above = 0;
        for (int i = 0; i < k; i++) { total = SMP_FADD(total, w[i]); above += w[i] >= a.min_p; }
        int keep = a.min_p > 0.0f ? max(above, 1) : k;
        if (a.top_p < 1.0f) {
            const float thr = SMP_FMUL(a.top_p, total);
            float cum = 0.0f; int kp = k;
            for (int i = 0; i < k; i++) { cum = SMP_FADD(cum, w[i]); if (cum >= thr) { kp = i + 1; break; } }
            keep = min(keep, kp);
        }
        float mass = 0.0f;
        for (int i = 0; i < keep; i++) mass = SMP_FADD(mass, w[i]);
        int skip = -1, purpose = RNG_SPEC_BONUS;
        float dm = mass;  // the mass the draw walks
        if (d >= 0) {
            float wd = 0.0f, rest = 0.0f;
            for (int i = 0; i < keep; i++) {
                if (sample_key_id(top[i]) == d) wd = w[i];
                else rest = SMP_FADD(rest, w[i]);
            }
            acc = wd > 0.0f && (rest == 0.0f || SMP_FMUL(rng_uniform(a.seed, position, RNG_SPEC_ACCEPT), mass) < wd);
            skip = d; purpose = RNG_SPEC_CORRECTION; dm = rest;
        }
        if (acc) {
            tok = d;
        } else {  // sampler_draw: the first candidate whose running weight passes u, skipping the draft
            float u = SMP_FMUL(rng_uniform(a.seed, position, purpose), dm);
            int lastid = -1;
            for (int i = 0; i < keep; i++) {
                const int id = sample_key_id(top[i]);
                if (id == skip) continue;
                if (w[i] > 0.0f || lastid < 0) lastid = id;  // the rounding edge: the last of nonzero weight
                u = SMP_FSUB(u, w[i]);
                if (u < 0.0f) break;
            }
            tok = lastid;
        }
    }
    sd.res[SPEC_BLK_RES] = c;
    sd.res[SPEC_BLK_TOK + c] = tok;
    if (!acc || c == sd.last) *sd.done = 1;
    if (sd.counts && tok >= 0 && tok < a.n) sd.counts[tok]++;
}

// the sort path: every key (pad entries 0, which sort last)
__global__ void sample_keys_kernel(SampleArgs a, int npad) {
    pdl_entry();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < npad; i += gridDim.x * blockDim.x) a.keys[i] = i < a.n ? sample_key(a, i) : 0;
}
// bitonic steps with strides < SAMPLE_TILE inside one tile of shared memory, for the merge
// sizes size_lo..size_hi (the first launch sorts whole tiles: 2..SAMPLE_TILE), one pair a thread
__global__ void __launch_bounds__(SAMPLE_TILE / 2) sample_bitonic_tile_kernel(uint64_t* keys, int size_lo, int size_hi) {
    pdl_entry();
    __shared__ uint64_t s[SAMPLE_TILE];
    uint64_t* g = keys + (size_t)blockIdx.x * SAMPLE_TILE;
    for (int i = threadIdx.x; i < SAMPLE_TILE; i += blockDim.x) s[i] = g[i];
    __syncthreads();
    for (int size = size_lo; size <= size_hi; size <<= 1)
        for (int stride = min(size, (int)SAMPLE_TILE) >> 1; stride > 0; stride >>= 1) {
            const int i = threadIdx.x, lo = (i / stride) * 2 * stride + (i % stride), hi = lo + stride;
            const bool desc = ((blockIdx.x * SAMPLE_TILE + lo) & size) == 0;
            uint64_t x = s[lo], y = s[hi];
            if (desc ? x < y : x > y) { s[lo] = y; s[hi] = x; }
            __syncthreads();
        }
    for (int i = threadIdx.x; i < SAMPLE_TILE; i += blockDim.x) g[i] = s[i];
}
// one bitonic step with a stride >= SAMPLE_TILE over the whole array, one pair a thread
__global__ void sample_bitonic_global_kernel(uint64_t* keys, int size, int stride) {
    pdl_entry();
    const int i = blockIdx.x * blockDim.x + threadIdx.x, lo = (i / stride) * 2 * stride + (i % stride), hi = lo + stride;
    const bool desc = (lo & size) == 0;
    uint64_t x = keys[lo], y = keys[hi];
    if (desc ? x < y : x > y) { keys[lo] = y; keys[hi] = x; }
}
// the sort path's finish (one block) over the first k sorted keys
__global__ void __launch_bounds__(SAMPLE_THREADS) sample_walk_kernel(SampleArgs a) {
    pdl_entry();
    __shared__ SampleWalk walk;
    const float topv = SMP_FMUL(sample_key_value(a.keys[0]), a.inv_t);
    for (int i = threadIdx.x; i < a.k; i += blockDim.x) a.w[i] = sampler_weight(sample_key_value(a.keys[i]), a.inv_t, topv);
    __syncthreads();
    sample_walk(a, a.keys, a.w, a.k, a.exact ? 1 : SAMPLE_THREADS, walk);
}
// a generated token: its count for the penalties
__global__ void sample_accept_kernel(int* counts, int n, int id, const int* id_dev) {
    pdl_entry();
    if (id_dev) id = *id_dev;  // the id the device just picked (decode running ahead of the host)
    if (id >= 0 && id < n) counts[id]++;
}

// the sampler's device state and scratch, one allocation for a domain of n ids
struct SampleScratch {
    int n = 0;
    int* counts = nullptr;                // [n] the bound sampler's counts
    int* bias_id = nullptr; int* bias_off = nullptr; float* bias_val = nullptr;  // the bound sampler's logit_bias table
    int n_bias = 0;                       // its distinct ids; -1: over SAMPLE_MAX_BIAS (that sampler samples on the host)
    uint64_t* cand = nullptr; uint64_t* keys = nullptr; float* w = nullptr;
    int* out = nullptr;
};
static int sample_pad(int n) { int p = SAMPLE_TILE; while (p < n) p <<= 1; return p; }
// lays the scratch out at base (null: only sizes); returns the bytes. sort false: without the
// sort path's keys and weights (a lane's sampler: the lanes' draws take the top-k path only)
static size_t sample_layout(SampleScratch* s, uint8_t* base, int n, bool sort = true) {
    size_t off = 0;
    auto take = [&](size_t bytes) -> uint8_t* { off = align_up(off, 256); uint8_t* p = base ? base + off : nullptr; off += bytes; return p; };
    const size_t pad = sample_pad(n);
    s->n = n;
    s->counts = (int*)take((size_t)n * 4);
    s->bias_id = (int*)take(SAMPLE_MAX_BIAS * 4);
    s->bias_off = (int*)take((SAMPLE_MAX_BIAS + 1) * 4);
    s->bias_val = (float*)take(SAMPLE_MAX_BIAS * 4);
    s->cand = (uint64_t*)take((size_t)CEIL_DIV(n, SAMPLE_CHUNK) * SAMPLE_KMAX * 8);
    s->keys = sort ? (uint64_t*)take(pad * 8) : nullptr;
    s->w = sort ? (float*)take(pad * 4) : nullptr;
    s->out = (int*)take(4);
    return align_up(off, 256);
}

// the sampler's counts and logit_bias to the device (once per generation, not per token). the
// bias list becomes distinct ids ascending, each with its values in list order (sample() adds
// them in list order); more than SAMPLE_MAX_BIAS distinct ids: n_bias = -1 (the host samples).
static void sample_upload(SampleScratch* s, const Sampler* smp, cudaStream_t stream) {
    CHECK(smp->domain == s->n, "sampler domain %d, device sampler %d", smp->domain, s->n);
    std::vector<std::pair<int, int>> e;  // (id, index in the list)
    for (size_t i = 0; i < smp->p.logit_bias.size(); i++) {
        int id = smp->p.logit_bias[i].first;
        if (id >= 0 && id < s->n) e.emplace_back(id, (int)i);
    }
    std::sort(e.begin(), e.end());
    std::vector<int> ids, off;
    std::vector<float> val;
    for (size_t i = 0; i < e.size(); i++) {
        if (i == 0 || e[i].first != e[i - 1].first) { ids.push_back(e[i].first); off.push_back((int)val.size()); }
        val.push_back(smp->p.logit_bias[e[i].second].second);
    }
    off.push_back((int)val.size());
    s->n_bias = (int)ids.size();
    if (val.size() > SAMPLE_MAX_BIAS) { s->n_bias = -1; return; }
    // pageable sources: each call returns once its bytes are staged, so the temporaries may go
    cudaCheck(cudaMemcpyAsync(s->counts, smp->counts.data(), (size_t)s->n * 4, cudaMemcpyHostToDevice, stream));
    if (s->n_bias) {
        cudaCheck(cudaMemcpyAsync(s->bias_id, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice, stream));
        cudaCheck(cudaMemcpyAsync(s->bias_off, off.data(), off.size() * 4, cudaMemcpyHostToDevice, stream));
        cudaCheck(cudaMemcpyAsync(s->bias_val, val.data(), val.size() * 4, cudaMemcpyHostToDevice, stream));
    }
}

// a constraint's mask (Sampler.mask) on a device logits row: ids [0, n) without their bit get
// -inf, in place, before the argmax or the sampler reads the row
__global__ void mask_logits_kernel(float* __restrict__ logits, const uint32_t* __restrict__ mask, int n) {
    pdl_entry_small();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        if (!((mask[i >> 5] >> (i & 31)) & 1)) logits[i] = -INFINITY;
}
static void mask_logits(float* logits, const uint32_t* mask, int n, cudaStream_t stream) {
    launch_k(mask_logits_kernel, CEIL_DIV(n, 256), 256, 0, stream, logits, mask, n);
    cudaCheck(cudaGetLastError());
}

// sample(smp, logits, position, purpose) on the device, with the counts and bias table of
// the last sample_upload and the sampler parameters p: the picked id to s.out[0]. logits:
// a device row whose first s.n entries are the domain's.
static SampleArgs sample_args(const float* logits, const SamplerParams& p, const SampleScratch& s, uint64_t position, int purpose) {
    CHECK(s.n_bias >= 0, "logit_bias table over %d entries: sample on the host", (int)SAMPLE_MAX_BIAS);
    SampleArgs a = {};
    a.logits = logits; a.n = s.n;
    a.greedy = p.temperature <= 0.0f;
    a.counts = a.greedy ? nullptr : s.counts;  // greedy is the argmax of the biased logits
    a.presence = p.presence; a.frequency = p.frequency;
    a.bias_id = s.bias_id; a.bias_off = s.bias_off; a.bias_val = s.bias_val; a.n_bias = s.n_bias;
    a.k = a.greedy ? 1 : (p.top_k > 0 && p.top_k < s.n ? p.top_k : s.n);
    a.exact = a.k <= SAMPLE_SEQ_MAX;
    a.inv_t = a.greedy ? 0.0f : 1.0f / p.temperature;  // sample()'s expression
    a.top_p = p.top_p; a.min_p = p.min_p;
    a.seed = p.seed; a.position = position; a.purpose = purpose;
    a.cand = s.cand; a.keys = s.keys; a.w = s.w; a.out = s.out;
    return a;
}
static void sample_gpu(const float* logits, const SamplerParams& p, const SampleScratch& s, uint64_t position, int purpose, cudaStream_t stream) {
    const SampleArgs a = sample_args(logits, p, s, position, purpose);
    if (a.k <= SAMPLE_KMAX) {
        launch_k(sample_topk_kernel, CEIL_DIV(s.n, SAMPLE_CHUNK), SAMPLE_THREADS, 0, stream, a);
        cudaCheck(cudaGetLastError());
        launch_k(sample_draw_kernel, 1, SAMPLE_THREADS, 0, stream, a);
        cudaCheck(cudaGetLastError());
        return;
    }
    const int npad = sample_pad(s.n);
    launch_k(sample_keys_kernel, npad / 256, 256, 0, stream, a, npad);
    launch_k(sample_bitonic_tile_kernel, npad / SAMPLE_TILE, SAMPLE_TILE / 2, 0, stream, s.keys, 2, (int)SAMPLE_TILE);
    for (int size = 2 * SAMPLE_TILE; size <= npad; size <<= 1) {
        for (int stride = size / 2; stride >= SAMPLE_TILE; stride >>= 1)
            launch_k(sample_bitonic_global_kernel, npad / 2 / 256, 256, 0, stream, s.keys, size, stride);
        launch_k(sample_bitonic_tile_kernel, npad / SAMPLE_TILE, SAMPLE_TILE / 2, 0, stream, s.keys, size, size);
    }
    launch_k(sample_walk_kernel, 1, SAMPLE_THREADS, 0, stream, a);
    cudaCheck(cudaGetLastError());
}
// sample_spec of verification column sd.c (the bonus column: sample()) on the device, where
// sample_spec_gpu_ok: the top-k path in sample()'s summation order and a bias table on the device
static bool sample_spec_gpu_ok(const SamplerParams& p, const SampleScratch& s) {
    const int k = p.temperature <= 0.0f ? 1 : (p.top_k > 0 && p.top_k < s.n ? p.top_k : s.n);
    return s.n_bias >= 0 && k <= SAMPLE_KMAX && k <= SAMPLE_SEQ_MAX;
}
static void sample_spec_gpu(const float* logits, const SamplerParams& p, const SampleScratch& s, const SpecDraw& sd, cudaStream_t stream) {
    CHECK(sample_spec_gpu_ok(p, s), "speculative sampling on the device takes the top-k path only");
    const SampleArgs a = sample_args(logits, p, s, 0, 0);
    launch_k(sample_topk_kernel, CEIL_DIV(s.n, SAMPLE_CHUNK), SAMPLE_THREADS, 0, stream, a);
    cudaCheck(cudaGetLastError());
    launch_k(sample_spec_kernel, 1, SAMPLE_THREADS, 0, stream, a, sd);
    cudaCheck(cudaGetLastError());
}
// the draws of a lanes step (sample_*_lanes_kernel): nd sample() calls a[0, nd) on the device,
// each a top-k one (k <= SAMPLE_KMAX) over a domain of n ids, its pick to a[j].out; first the
// fed tokens accept[j] (>= 0) counted in counts[j]
static bool sample_lane_ok(const SamplerParams& p, int n) {
    const int k = p.temperature <= 0.0f ? 1 : (p.top_k > 0 && p.top_k < n ? p.top_k : n);
    size_t bias = 0;
    for (const auto& b : p.logit_bias) bias += b.first >= 0 && b.first < n;
    return k <= SAMPLE_KMAX && bias <= SAMPLE_MAX_BIAS;
}
static void sample_lanes(const SampleArgs* a, int* const* counts, const int* accept, int nd, int n, cudaStream_t stream) {
    launch_k(sample_accept_lanes_kernel, 1, CEIL_DIV(nd, 32) * 32, 0, stream, a, counts, accept, nd);
    cudaCheck(cudaGetLastError());
    launch_k(sample_topk_lanes_kernel, dim3((unsigned)CEIL_DIV(n, SAMPLE_CHUNK), (unsigned)nd), SAMPLE_THREADS, 0, stream, a);
    cudaCheck(cudaGetLastError());
    launch_k(sample_draw_lanes_kernel, nd, SAMPLE_THREADS, 0, stream, a);
    cudaCheck(cudaGetLastError());
}
// count a generated token on the device (sampler_accept's twin)
static void sample_accept(const SampleScratch& s, int id, cudaStream_t stream, const int* id_dev = nullptr) {
    launch_k(sample_accept_kernel, 1, 1, 0, stream, s.counts, s.n, id, id_dev);
    cudaCheck(cudaGetLastError());
}

// ---- 7.9 shared-memory matrix helpers -------------------------------------------------------
// shared-memory matrix helpers (the prefill kernels)

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
// four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}
__device__ __forceinline__ void cp_async16_m(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit_m() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait_m() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
// mbarriers (sm_90): a shared-memory barrier of `count` arrivals a phase; a waiter names the
// phase by its parity (the n-th completion of a barrier has parity n & 1, from 0). they take the
// barrier's shared address (smem_u32), which a kernel computes once rather than at each wait
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#endif
}
// the barriers' initialization visible to every proxy
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n\t.reg .pred p;\n\tWAIT:\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t@!p bra WAIT;\n\t}"
                 ::"r"(bar), "r"(parity) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared::cta.b64 st, [%0];\n\t}" ::"r"(bar) : "memory");
#endif
}
// tma (sm_90): one arrival on bar that also expects `bytes` of copies to complete on it
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
// the box of a 2-d tensor map at (c0 inner, c1 outer) into shared memory at dst, its bytes
// counted on bar; rows past the tensor's end arrive as zeros
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
#endif
}

// ---- 7.10 gemm (prefill products) and linear ------------------------------------------------
// gemm: Y[t][n] = sum_k W[n,k] X[t][k] for many tokens (prefill), tensor cores
//
// prefill multiplies each weight by hundreds of tokens, so it is arithmetic, not a stream:
// a block computes a 128-token x 128-row tile with mma.sync m16n8k16 (8 warps, 64 x 32 each),
// k in steps of 64. the x tile arrives by cp.async (double buffered); the weight tile is read
// into registers one step ahead and decoded into shared memory as exact bf16 *codes* (the
// magic-number trick of the gemv: 128 + code in the mantissa of bf16 128, one bf16x2 fma
// removes the 128 and the sign offset). the tensor core sums one quantization group of codes
// times x, and that partial sum is scaled in fp32 by the group's fp16 scale: products exact,
// sums fp32, the same arithmetic as the gemv (results differ from it only in summation order).
// w8 has two 32-lane groups per k step (w8 codes do not fit the magic, they convert through
// float); bf16 weights accumulate straight into the result. one __syncthreads per k step: the
// step's buffers were filled before it, the next step's go to the other buffers.
// requirements: cols % 64 == 0 (every qwen3.5 width); x 16-byte aligned with ldx % 8 == 0.
// y as in the gemv: fp32, or bf16 with an optional residual y = bf16(resid + bf16(Wx)).
// on sm_90a (hopper, the binary built with 90a code) q4 / q5 / q6 take gemm_wgmma_kernel
// instead: the same arithmetic on wgmma, 1.7-1.9x this kernel at prefill sizes (bench-notes);
// this one stays for w8, bf16 and every other arch.

enum { GM_BM = 128, GM_BN = 128, GM_BK = 64, GM_THREADS = 256, GM_LDS = GM_BK + 8 };  // smem rows padded: conflict-free ldmatrix
static const size_t GM_SMEM = (size_t)2 * (GM_BM + GM_BN) * GM_LDS * 2 + (size_t)2 * GM_BN * 2 * sizeof(float);

struct GemmArgs {
    Mat w;
    const bf16_t* x; int ldx; int T;
    void* y; int ldy; int y_f32;
    const bf16_t* resid; int ldr;
};
// y[m][n] = v (+ the residual: fp32 out adds it in fp32; bf16 out adds it to the bf16 of v),
// the store of both gemm kernels
__device__ __forceinline__ void gemm_store(const GemmArgs& a, int m, int64_t n, float v) {
    if (a.y_f32) {
        ((float*)a.y)[(int64_t)m * a.ldy + n] = a.resid ? v + bf2f(a.resid[(int64_t)m * a.ldr + n]) : v;
    } else {
        const float o = a.resid ? bf2f(a.resid[(int64_t)m * a.ldr + n]) + bfround(v) : v;
        ((bf16_t*)a.y)[(int64_t)m * a.ldy + n] = f2bf(o);
    }
}
// the bf16x2 of two q4 / q5 / q6 codes, exactly: u holds the raw offset-binary fields at bits
// 0-5 and 16-21; flipping the sign bit (SB) gives code + SB, ored into the mantissa of bf16 128
// that is 128 + code + SB, and one fma with -(128 + SB) leaves the code (both gemm kernels)
template <int F>
__device__ __forceinline__ uint32_t gemm_code_pair(uint32_t u) {
    constexpr uint32_t SB = F == FMT_Q4 ? 8 : F == FMT_Q5 ? 16 : 32;
    constexpr uint32_t NEG = F == FMT_Q4 ? BF2(BF_M136) : F == FMT_Q5 ? BF2(BF_M144) : BF2(BF_M160);
    return bf2_fma((u ^ (SB | SB << 16)) | 0x43004300u, BF2(BF_ONE), NEG);
}

// one thread's share of a weight k step: row tid/2, lanes [32*(tid&1), +32) of the step
// (w8: the whole group 2*kt + (tid&1); bf16: 32 elements)
template <int F> struct GemmRaw {
    uint4 b[F == FMT_BF16 ? 4 : F == FMT_W8 ? 2 : 1];
    uint2 hi;
    uint32_t sc;
};
template <int F>
__device__ __forceinline__ void gemm_load_w(const Mat& w, int64_t row, int kt, int wh, GemmRaw<F>& r) {
    const uint8_t* base = w.base + row * w.base_row;
    if constexpr (F == FMT_BF16) {
        const uint4* p = (const uint4*)(base + ((int64_t)kt * GM_BK + wh * 32) * 2);
#pragma unroll
        for (int i = 0; i < 4; i++) r.b[i] = __ldg(p + i);
    } else if constexpr (F == FMT_W8) {
        const int64_t grp = (int64_t)kt * 2 + wh;
        const uint4* p = (const uint4*)(base + grp * 32);
        r.b[0] = __ldg(p); r.b[1] = __ldg(p + 1);
        r.sc = __ldg((const unsigned short*)(w.scale + row * w.scale_row) + grp);
    } else {
        r.b[0] = __ldg((const uint4*)(base + (int64_t)kt * 32 + wh * 16));
        if constexpr (F == FMT_Q5) r.hi.x = __ldg((const unsigned int*)(w.high + row * w.high_row + (int64_t)kt * 8 + wh * 4));
        if constexpr (F == FMT_Q6) r.hi = __ldg((const uint2*)(w.high + row * w.high_row + (int64_t)kt * 16 + wh * 8));
        r.sc = __ldg((const unsigned short*)(w.scale + row * w.scale_row) + kt);
    }
}
// decode to 32 bf16 values (codes, exact) at dst; the scale(s) to scd[0] (w8: scd[wh])
template <int F>
__device__ __forceinline__ void gemm_store_w(const GemmRaw<F>& r, bf16_t* dst, float* scd, int wh) {
    uint32_t o[16];
    if constexpr (F == FMT_BF16) {
        const uint32_t* w = (const uint32_t*)r.b;
#pragma unroll
        for (int p = 0; p < 16; p++) o[p] = w[p];
    } else if constexpr (F == FMT_W8) {
        const uint32_t* w = (const uint32_t*)r.b;  // lane l is byte l & 3 of word l >> 2
#pragma unroll
        for (int p = 0; p < 16; p++) {
            uint32_t word = w[p >> 1] >> (16 * (p & 1));
            o[p] = pack_bf2((float)(int8_t)(word & 0xFF), (float)(int8_t)((word >> 8) & 0xFF));
        }
        scd[wh] = f16bits2f(r.sc);
    } else {
        // lane l: nibble at bits 4*(l&7) of base word l>>3; q5: bit 4 from bit l of hi.x; q6:
        // bits 4-5 from bits 2l, 2l+1 of hi. u ^ sign bit is the offset-binary code, < 64.
        const uint32_t* w = (const uint32_t*)r.b;
        const uint64_t hi = F == FMT_Q6 ? ((uint64_t)r.hi.y << 32) | r.hi.x : (uint64_t)r.hi.x;
#pragma unroll
        for (int p = 0; p < 16; p++) {
            const int l0 = 2 * p, l1 = 2 * p + 1;
            uint32_t u0 = (w[l0 >> 3] >> (4 * (l0 & 7))) & 15u, u1 = (w[l1 >> 3] >> (4 * (l1 & 7))) & 15u;
            if constexpr (F == FMT_Q5) { u0 |= (uint32_t)((hi >> l0) & 1u) << 4; u1 |= (uint32_t)((hi >> l1) & 1u) << 4; }
            if constexpr (F == FMT_Q6) { u0 |= (uint32_t)((hi >> (2 * l0)) & 3u) << 4; u1 |= (uint32_t)((hi >> (2 * l1)) & 3u) << 4; }
            o[p] = gemm_code_pair<F>(u0 | u1 << 16);
        }
        if (wh == 0) scd[0] = f16bits2f(r.sc);
    }
    uint4* d = (uint4*)dst;
#pragma unroll
    for (int i = 0; i < 4; i++) d[i] = make_uint4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]);
}

template <int F>
__global__ void __launch_bounds__(GM_THREADS, 1) gemm_kernel(GemmArgs a) {
    pdl_entry();
    constexpr bool SCALED = F != FMT_BF16;
    constexpr int NG = F == FMT_W8 ? 2 : 1;  // quantization groups per k step
    constexpr int KS = 4 / NG;               // k16 steps per group
    extern __shared__ __align__(16) uint8_t gm_smem[];
    bf16_t* xs = (bf16_t*)gm_smem;                      // [2][BM][LDS]
    bf16_t* ws = xs + 2 * GM_BM * GM_LDS;               // [2][BN][LDS]
    float* scs = (float*)(ws + 2 * GM_BN * GM_LDS);     // [2][BN][2]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, t = lane & 3;
    const int wm = warp >> 2, wn = warp & 3;
    const int64_t N = a.w.rows;
    const int64_t n0 = (int64_t)blockIdx.x * GM_BN;
    const int m0 = blockIdx.y * GM_BM;
    const int nk = (int)(a.w.cols / GM_BK);
    const int wr = tid >> 1, wh = tid & 1;
    const int64_t wrow = n0 + wr < N ? n0 + wr : N - 1;  // rows past the end: read twice, never stored

    auto load_x = [&](int kt, int buf) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int c = tid + i * GM_THREADS, r = c >> 3, c16 = c & 7;
            const int m = m0 + r < a.T ? m0 + r : a.T - 1;
            cp_async16_m(smem_u32(xs + ((size_t)buf * GM_BM + r) * GM_LDS + c16 * 8), a.x + (int64_t)m * a.ldx + (int64_t)kt * GM_BK + c16 * 8);
        }
        cp_async_commit_m();
    };

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

    GemmRaw<F> raw;
    load_x(0, 0);
    gemm_load_w<F>(a.w, wrow, 0, wh, raw);
    gemm_store_w<F>(raw, ws + (size_t)wr * GM_LDS + wh * 32, scs + wr * 2, wh);
    for (int kt = 0; kt < nk; kt++) {
        const int cur = kt & 1;
        cp_async_wait_m<0>();
        __syncthreads();  // step kt's tiles are in; everyone is done with step kt-1's buffers
        if (kt + 1 < nk) {
            load_x(kt + 1, cur ^ 1);
            gemm_load_w<F>(a.w, wrow, kt + 1, wh, raw);
        }
        const bf16_t* xb = xs + (size_t)cur * GM_BM * GM_LDS;
        const bf16_t* wb = ws + (size_t)cur * GM_BN * GM_LDS;
        const float* sb = scs + cur * GM_BN * 2;
#pragma unroll
        for (int gi = 0; gi < NG; gi++) {
            uint32_t bfr[KS][4][2];
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    const int row = wn * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
                    const int col = (gi * KS + ks) * 16 + ((lane >> 3) & 1) * 8;
                    ldsm_x4(smem_u32(wb + row * GM_LDS + col), bfr[ks][2 * np][0], bfr[ks][2 * np][1], bfr[ks][2 * np + 1][0],
                            bfr[ks][2 * np + 1][1]);
                }
            float s[4][2];
            if constexpr (SCALED) {
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    s[nt][0] = sb[(wn * 32 + nt * 8 + 2 * t) * 2 + gi];
                    s[nt][1] = sb[(wn * 32 + nt * 8 + 2 * t + 1) * 2 + gi];
                }
            }
#pragma unroll
            for (int mt = 0; mt < 4; mt++) {
                float tmp[4][4];
#pragma unroll
                for (int nt = 0; nt < 4; nt++) tmp[nt][0] = tmp[nt][1] = tmp[nt][2] = tmp[nt][3] = 0.f;
#pragma unroll
                for (int ks = 0; ks < KS; ks++) {
                    uint32_t a0, a1, a2, a3;
                    const int row = wm * 64 + mt * 16 + (lane & 15);
                    const int col = (gi * KS + ks) * 16 + (lane >> 4) * 8;
                    ldsm_x4(smem_u32(xb + row * GM_LDS + col), a0, a1, a2, a3);
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        if constexpr (SCALED) mma_bf16_16816(tmp[nt], a0, a1, a2, a3, bfr[ks][nt][0], bfr[ks][nt][1]);
                        else mma_bf16_16816(acc[mt][nt], a0, a1, a2, a3, bfr[ks][nt][0], bfr[ks][nt][1]);
                    }
                }
                if constexpr (SCALED) {
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        acc[mt][nt][0] = fmaf(s[nt][0], tmp[nt][0], acc[mt][nt][0]);
                        acc[mt][nt][1] = fmaf(s[nt][1], tmp[nt][1], acc[mt][nt][1]);
                        acc[mt][nt][2] = fmaf(s[nt][0], tmp[nt][2], acc[mt][nt][2]);
                        acc[mt][nt][3] = fmaf(s[nt][1], tmp[nt][3], acc[mt][nt][3]);
                    }
                }
            }
        }
        if (kt + 1 < nk)
            gemm_store_w<F>(raw, ws + ((size_t)(cur ^ 1) * GM_BN + wr) * GM_LDS + wh * 32, scs + ((cur ^ 1) * GM_BN + wr) * 2, wh);
    }
    // epilogue: thread (g, t) holds rows g, g+8 and columns 2t, 2t+1 of each 16 x 8 tile
    const int g = lane >> 2;
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int m = m0 + wm * 64 + mt * 16 + g + (j >= 2 ? 8 : 0);
                const int64_t n = n0 + wn * 32 + nt * 8 + 2 * t + (j & 1);
                if (m < a.T && n < N) gemm_store(a, m, n, acc[mt][nt][j]);
            }
}
// the sm_90a path of gemm() for q4 / q5 / q6 (wgmma): the same contract and arithmetic:
// codes enter the tensor core exact, each 64-k group's partial sum is scaled by its fp16
// scale in fp32. a block is a 64-row x 256-token tile, both operands of wgmma in shared memory:
// every group, the block's 256 threads decode the 64 rows' codes once (a thread: 16 lanes of
// one row) into an A tile (bf16, 128-byte swizzled, WG_ABUF buffers), and its two warpgroups
// each multiply that tile by their own 128 tokens of the x stage (B: one tma copy a group from
// a tensor map of x, WG_STAGES stages asked for WG_AHEAD groups ahead). per group and
// warpgroup: 4 x m64n128k16 into tmp (the group's partial), then acc += scale(row) * tmp; the
// next group's codes are decoded while the tensor core runs. rows of D are weight rows, so a
// thread scales by only 2 values.
// why this shape: a 128 x 128 tile with A in registers (test/dev_kernels.cuh's
// gemm_wgmma_rs_kernel, sessions 16-22's product) decoded each weight for 128 tokens and spent
// ~240-315 instructions a warp a group against 4 wgmmas, issue-bound at ~345 TFLOP/s (q4, h100);
// sharing the decoded tile between the warpgroups halves the decode a token (session 22); the
// x stage by tma frees every warp of the 8 cp.async a group it issued (+11-22% a product,
// bench-notes, session 23). the stages and A buffers are tracked by mbarriers (full: the
// stage's tma bytes / every thread's A stores landed; empty: every warp's wgmma on it is done),
// so the warpgroups drift apart by up to a group and one's scaling fma runs under the other's
// wgmma (bench-notes, sessions 16 and 20).
enum { WG_BM = 64, WG_BN = 256, WG_STAGES = 4, WG_AHEAD = 3, WG_ABUF = 2, WG_THREADS = 256 };
static constexpr size_t wg_smem_bytes(int stages) {  // + the 1024-byte alignment
    return (size_t)stages * WG_BN * 128 + (size_t)WG_ABUF * WG_BM * 128 + 1024;
}
static const size_t WG_SMEM = wg_smem_bytes(WG_STAGES);

// the descriptor as its low word (start >> 4, leading offset 1: unused with the swizzle) and a
// constant high word (stride between 8-row groups 1024 B, 128-byte swizzle). the kernels add
// byte offsets / 16 to a stage's low word, which stays exact below 256 KB of shared memory: one
// uniform add a wgmma where the whole descriptor built from its address took ~6
enum : uint32_t { WG_DESC_HI = (1024 >> 4) | (1u << 30) };
__device__ __forceinline__ uint32_t wg_desc_lo(uint32_t addr) { return ((addr & 0x3FFFF) >> 4) | (1u << 16); }
__device__ __forceinline__ uint64_t wg_desc(uint32_t lo) { return (uint64_t)WG_DESC_HI << 32 | lo; }
__device__ __forceinline__ void wg_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_fence_proxy() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
// the 64 fp32 accumulators of an m64n128 wgmma (d[0..63]) as asm in-out operands
#define WG_ACC64(d) \
    "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]), "+f"((d)[4]), "+f"((d)[5]), "+f"((d)[6]), "+f"((d)[7]), \
    "+f"((d)[8]), "+f"((d)[9]), "+f"((d)[10]), "+f"((d)[11]), "+f"((d)[12]), "+f"((d)[13]), "+f"((d)[14]), "+f"((d)[15]), \
    "+f"((d)[16]), "+f"((d)[17]), "+f"((d)[18]), "+f"((d)[19]), "+f"((d)[20]), "+f"((d)[21]), "+f"((d)[22]), "+f"((d)[23]), \
    "+f"((d)[24]), "+f"((d)[25]), "+f"((d)[26]), "+f"((d)[27]), "+f"((d)[28]), "+f"((d)[29]), "+f"((d)[30]), "+f"((d)[31]), \
    "+f"((d)[32]), "+f"((d)[33]), "+f"((d)[34]), "+f"((d)[35]), "+f"((d)[36]), "+f"((d)[37]), "+f"((d)[38]), "+f"((d)[39]), \
    "+f"((d)[40]), "+f"((d)[41]), "+f"((d)[42]), "+f"((d)[43]), "+f"((d)[44]), "+f"((d)[45]), "+f"((d)[46]), "+f"((d)[47]), \
    "+f"((d)[48]), "+f"((d)[49]), "+f"((d)[50]), "+f"((d)[51]), "+f"((d)[52]), "+f"((d)[53]), "+f"((d)[54]), "+f"((d)[55]), \
    "+f"((d)[56]), "+f"((d)[57]), "+f"((d)[58]), "+f"((d)[59]), "+f"((d)[60]), "+f"((d)[61]), "+f"((d)[62]), "+f"((d)[63])
// waits for the warpgroup's wgmmas and names their accumulators in the wait itself, so ptxas
// keeps d unread until they are done
__device__ __forceinline__ void wg_wait0(float* d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned 0;"
                 : WG_ACC64(d)
                 :: "memory");
#endif
}
// d (64 fp32: m64 x n128) = A (descriptor: 64 rows x k16) . B (descriptor: 128 tokens x k16) [+ d]
__device__ __forceinline__ void wg_mma_ss(float* d, uint64_t da, uint64_t db, int acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,"
        "%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,"
        "%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : WG_ACC64(d)
        : "l"(da), "l"(db), "r"(acc));
#else
    __trap();
#endif
}
// orders the compiler's writes of v before the wgmma.fence that precedes a wgmma reading v
__device__ __forceinline__ void wg_keep(float& v) { asm volatile("" : "+f"(v)::"memory"); }

__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// a decoding thread's share of one row's group: lanes [16q, 16q + 16), its 8 base bytes
// (bytes 8q..8q+7: byte j holds lanes 2j (low nibble) and 2j + 1) and their high bits (q5: bit
// i of halfword q is lane 16q + i; q6: bits 2i, 2i + 1 of word q)
template <int F> struct WgRaw { uint2 b; uint32_t h; };
template <int F>
__device__ __forceinline__ void wg_load(const Mat& w, int64_t row, int kt, int q, WgRaw<F>& r) {
    r.b = __ldg((const uint2*)(w.base + row * w.base_row + (int64_t)kt * 32) + q);
    r.h = 0;
    if constexpr (F == FMT_Q5) r.h = __ldg((const unsigned short*)(w.high + row * w.high_row + (int64_t)kt * 8) + q);
    if constexpr (F == FMT_Q6) r.h = __ldg((const unsigned int*)(w.high + row * w.high_row + (int64_t)kt * 16) + q);
}
// its 8 bf16x2 code pairs in k order (pair j: lanes 16q + 2j, + 1). byte j of a base word and
// byte j of the word >> 4 (one prmt) put the pair's codes at bits 0-3 and 16-19; the high bits
// go to bits 4 (and 5) of each half; the code pair's magic and one bf16 fma make the values.
// q4: the mask and the magic in one lop3 (ptxas made two)
template <int F>
__device__ __forceinline__ void wg_decode(const WgRaw<F>& r, uint32_t (&o)[8]) {
    const uint32_t w[2] = {r.b.x, r.b.y};
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const uint32_t ws = w[u] >> 4;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int P = 4 * u + j;
            const uint32_t sel = (uint32_t)j | (uint32_t)(4 + j) << 8;
            if constexpr (F == FMT_Q4) {
                o[P] = bf2_fma(lop3<LOP_AND_XOR>(__byte_perm(w[u], ws, sel), 0x000F000Fu, 0x43084308u), BF2(BF_ONE), BF2(BF_M136));
            } else {
                uint32_t p = __byte_perm(w[u], ws, sel) & 0x000F000Fu;
                if constexpr (F == FMT_Q5) p |= ((r.h >> (2 * P)) & 1u) << 4 | ((r.h >> (2 * P + 1)) & 1u) << 20;
                if constexpr (F == FMT_Q6) p |= ((r.h >> (4 * P)) & 3u) << 4 | ((r.h >> (4 * P + 2)) & 3u) << 20;
                o[P] = gemm_code_pair<F>(p);
            }
        }
    }
}

// acc += a group's partial scaled by its rows' scales (s0: row g, s1: row g + 8)
__device__ __forceinline__ void wg_accumulate(float (&acc)[64], const float (&tmp)[64], float s0, float s1) {
#pragma unroll
    for (int j = 0; j < 16; j++) {
        acc[4 * j + 0] = fmaf(s0, tmp[4 * j + 0], acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(s0, tmp[4 * j + 1], acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(s1, tmp[4 * j + 2], acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(s1, tmp[4 * j + 3], acc[4 * j + 3]);
    }
}
// the warp's tile of y: d[4j + {0,1}] = row g, tokens 8j + 2t + {0,1}; d[4j + {2,3}] = row g + 8.
// SW: the gate and the up of output n0 + g, stored as swiglu_kernel's bf16(bf16(silu(bf16
// gate)) * bf16 up) (y bf16 [T][I], no residual)
template <bool SW = false>
__device__ __forceinline__ void wg_store(const GemmArgs& a, const float (&acc)[64], int m0, int64_t n0, int g, int t) {
    if constexpr (SW) {
        const int64_t n = n0 + g;
        if (n >= a.w.rows / 2) return;
#pragma unroll
        for (int j = 0; j < 16; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int m = m0 + 8 * j + 2 * t + e;
                if (m < a.T) ((bf16_t*)a.y)[(int64_t)m * a.ldy + n] = f2bf(bfround(silu_f(bfround(acc[4 * j + e]))) * bfround(acc[4 * j + 2 + e]));
            }
    } else {
#pragma unroll
        for (int j = 0; j < 16; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int m = m0 + 8 * j + 2 * t + (e & 1);
                const int64_t n = n0 + g + (e >= 2 ? 8 : 0);
                if (m < a.T && n < a.w.rows) gemm_store(a, m, n, acc[4 * j + e]);
            }
    }
}

// SW: gemm_swiglu's epilogue (gate_up: the block's 32 outputs' gate rows and up rows)
// xmap: x as a [T][K] bf16 tensor map, boxes of 64 k x WG_BN tokens, 128-byte swizzle (wg_xmap)
template <int F, bool SW = false>
__global__ void __launch_bounds__(WG_THREADS, 1) gemm_wgmma_kernel(GemmArgs a, const __grid_constant__ CUtensorMap xmap) {
    constexpr int S = WG_STAGES, AH = WG_AHEAD, AB = WG_ABUF;
    pdl_entry();
    extern __shared__ __align__(16) uint8_t wg_smem[];
    __shared__ uint64_t xfull[S], xempty[S], afull[AB], aempty[AB];
    const uint32_t sbase = (smem_u32(wg_smem) + 1023) & ~1023u;  // the 128-byte swizzle wants 1024-byte stages
    const uint32_t abase = sbase + S * WG_BN * 128;               // the A buffers after the x stages
    const uint32_t xf0 = smem_u32(xfull), xe0 = smem_u32(xempty), af0 = smem_u32(afull), ae0 = smem_u32(aempty);  // [i]: + 8 i
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3, wg = tid >> 7, wi = (tid >> 5) & 3;
    const int nk = (int)(a.w.cols / 64);
    const int mb = blockIdx.y * WG_BN, m0 = mb + wg * 128;  // the block's tokens, this warpgroup's (past T: zeros, not stored)
    // the decoding thread's A row ar = tid / 4 (lanes [16q, 16q + 16) of it) and its matrix row;
    // the D rows of this thread's accumulators (16 wi + g, + 8: their scales) and the store's
    // first row. SW: A rows 16 wi + {0..7} are the gate rows of outputs n0 + 8 wi + {0..7},
    // 16 wi + {8..15} their up rows, so each thread holds the gate and the up of its outputs
    const int ar = tid >> 2, q = tid & 3;
    int64_t rowA, rowD0, rowD1, nst;
    if constexpr (SW) {
        const int64_t I = a.w.rows / 2, n0 = (int64_t)blockIdx.x * (WG_BM / 2);
        const int64_t ga = n0 + 8 * (ar >> 4) + (ar & 7), gd = n0 + 8 * wi + g;
        rowA = (ga < I ? ga : I - 1) + ((ar & 15) >= 8 ? I : 0);
        rowD0 = gd < I ? gd : I - 1; rowD1 = I + rowD0;
        nst = n0 + 8 * wi;
    } else {
        const int64_t N = a.w.rows, n0 = (int64_t)blockIdx.x * WG_BM;
        rowA = n0 + ar < N ? n0 + ar : N - 1;
        rowD0 = n0 + 16 * wi + g < N ? n0 + 16 * wi + g : N - 1;
        rowD1 = n0 + 16 * wi + g + 8 < N ? n0 + 16 * wi + g + 8 : N - 1;
        nst = n0 + 16 * wi;
    }
    // the A tile's two 16-byte chunks of this thread (2q, 2q + 1 of row ar, swizzled)
    const uint32_t ad0 = ar * 128 + (((2 * q) ^ (ar & 7)) << 4), ad1 = ar * 128 + (((2 * q + 1) ^ (ar & 7)) << 4);
    if (tid == 0) {
        for (int i = 0; i < S; i++) { mbar_init(xf0 + 8 * i, 1); mbar_init(xe0 + 8 * i, WG_THREADS / 32); }
        for (int i = 0; i < AB; i++) { mbar_init(af0 + 8 * i, WG_THREADS); mbar_init(ae0 + 8 * i, WG_THREADS / 32); }
        mbar_init_fence();
    }
    __syncthreads();

    // x group kt into stage kt % S: thread 0's tma copy of the block's tokens, counted on xfull
    // (tokens past T arrive as zeros: their columns are not stored); the stage's previous group
    // (kt - S) must be done in every warp first (xempty). the tma writes in the 128-byte swizzle
    // the B descriptor names
    auto load_x = [&](int kt, int s) {  // s = kt % S, a constant in the unrolled loop
        if (kt >= nk || tid != 0) return;
        const int use = kt / S;
        if (use > 0) mbar_wait(xe0 + 8 * s, (uint32_t)((use - 1) & 1));
        mbar_arrive_expect_tx(xf0 + 8 * s, WG_BN * 128);
        tma_load_2d(sbase + (uint32_t)s * (WG_BN * 128), &xmap, kt * 64, mb, xf0 + 8 * s);
    };
    // group kt's codes (raw r) decoded into A buffer b = kt % AB, counted on afull (its previous
    // group, kt - AB, done in every warp: the caller waited on aempty). the stores reach the
    // wgmma (async proxy) through the fence and the barrier
    auto store_a = [&](int b, const WgRaw<F>& r) {  // b = kt % AB
        uint32_t o[8];
        wg_decode<F>(r, o);
        const uint32_t at = abase + (uint32_t)b * (WG_BM * 128);
        st_shared_v4(at + ad0, o[0], o[1], o[2], o[3]);
        st_shared_v4(at + ad1, o[4], o[5], o[6], o[7]);
        wg_fence_proxy();
        mbar_arrive(af0 + 8 * b);
    };
    auto scale = [&](int64_t row, int kt) { return f16bits2f(__ldg((const unsigned short*)(a.w.scale + row * a.w.scale_row) + kt)); };

    float acc[64], tmp[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = tmp[i] = 0.f;
    for (int i = 0; i < AH; i++) load_x(i, i);
    WgRaw<F> raw;
    wg_load<F>(a.w, rowA, 0, q, raw);
    store_a(0, raw);
    wg_load<F>(a.w, rowA, nk > 1 ? 1 : 0, q, raw);
    float s0 = scale(rowD0, 0), s1 = scale(rowD1, 0);
    const uint32_t adlo = wg_desc_lo(abase), xdlo = wg_desc_lo(sbase) + (uint32_t)wg * (128 * 128 >> 4);
    // step kt = 4 j + P: its stage, buffer and barrier parities are constants of P and j's parity
    // (the loop unrolled by S = 2 AB)
    static_assert(S == 4 && AB == 2, "the unrolled loop's phases");
    auto step = [&](int kt, auto P) {
        constexpr int s = decltype(P)::value % S, b = decltype(P)::value % AB, bn = (decltype(P)::value + 1) % AB;
        // every wait before the wgmmas: no branch between them and their wait (ptxas then tracks
        // the accumulators in flight; a branch there serialized the four wgmmas). the last step
        // decodes and loads the last group again, unused
        if (kt + 1 >= AB) mbar_wait(ae0 + 8 * bn, (uint32_t)(((kt + 1) / AB - 1) & 1));  // buffer bn's last group done
        mbar_wait(af0 + 8 * b, (uint32_t)((kt / AB) & 1));
        mbar_wait(xf0 + 8 * s, (uint32_t)((kt / S) & 1));  // the tma writes in the async proxy, as wgmma reads
#pragma unroll
        for (int i = 0; i < 64; i++) wg_keep(tmp[i]);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
            wg_mma_ss(tmp, wg_desc(adlo + (uint32_t)b * (WG_BM * 128 >> 4) + ks * (32 >> 4)),
                      wg_desc(xdlo + (uint32_t)s * (WG_BN * 128 >> 4) + ks * (32 >> 4)), ks);
        wg_commit();
        // while the tensor core runs: group kt + 1's codes into the other buffer, group kt + 2's
        // words and group kt + 1's scales loaded
        store_a(bn, raw);
        wg_load<F>(a.w, rowA, kt + 2 < nk ? kt + 2 : nk - 1, q, raw);
        const int kn = kt + 1 < nk ? kt + 1 : nk - 1;
        const float n0 = scale(rowD0, kn), n1 = scale(rowD1, kn);
        wg_wait0(tmp);
        __syncwarp();
        if (lane == 0) { mbar_arrive(xe0 + 8 * s); mbar_arrive(ae0 + 8 * b); }  // this warp is done with stage s and buffer b
        wg_accumulate(acc, tmp, s0, s1);
        s0 = n0; s1 = n1;
        load_x(kt + AH, (decltype(P)::value + AH) % S);
    };
    using P0 = std::integral_constant<int, 0>; using P1 = std::integral_constant<int, 1>;
    using P2 = std::integral_constant<int, 2>; using P3 = std::integral_constant<int, 3>;
    for (int kt = 0; kt < nk; kt += 4) {
        step(kt, P0{});
        if (kt + 1 < nk) step(kt + 1, P1{});
        if (kt + 2 < nk) step(kt + 2, P2{});
        if (kt + 3 < nk) step(kt + 3, P3{});
    }
    wg_store<SW>(a, acc, m0, nst, g, t);
}
// whether sm_90a code runs here (the binary carries it and the device is 9.0): wgmma exists only there
__global__ void wg_probe_kernel(int* ok) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *ok = 1;
#else
    *ok = 0;
#endif
}
static bool g_gemm_wgmma = false;  // gemm() takes the wgmma kernel for q4 / q5 / q6 (gpu_kernels_init)

static bool gemm_ok(const Mat& w) {
    return (format_grouped(w.format) || w.format == FMT_BF16) && w.cols % GM_BK == 0;
}
static bool gemm_on_wgmma(const Mat& w) { return g_gemm_wgmma && (w.format == FMT_Q4 || w.format == FMT_Q5 || w.format == FMT_Q6); }
static void gemm_check(const Mat& w, const bf16_t* x, int ldx, int T) {
    CHECK(gemm_ok(w) && T >= 1, "gemm: format %s, cols %lld", format_name(w.format), (long long)w.cols);
    CHECK(ldx % 8 == 0 && ((uintptr_t)x & 15) == 0, "gemm: x must be 16-byte aligned with ldx %% 8 == 0 (ldx %d)", ldx);
}
// the driver's tensor-map encoder (cudart's entry point: no libcuda link); gpu_kernels_init
// looks it up where the wgmma kernel runs
static PFN_cuTensorMapEncodeTiled_v12000 g_tmap_encode = nullptr;
// x [T][K] (row stride ldx) as the wgmma kernel's tensor map: boxes of 64 k x WG_BN tokens,
// 128-byte swizzled (the B descriptor's), zeros past T. a host call (~1 us), captured by value
// into a graph's launch as the kernel's other arguments are
static CUtensorMap wg_xmap(const bf16_t* x, int ldx, int64_t K, int T) {
    CUtensorMap m;
    const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)T}, strides[1] = {(cuuint64_t)ldx * 2};
    const cuuint32_t box[2] = {64, WG_BN}, el[2] = {1, 1};
    const CUresult r = g_tmap_encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void*)x, dims, strides, box, el, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    CHECK(r == CUDA_SUCCESS, "gemm: the tensor map of x (%d tokens x %lld, ldx %d): driver error %d", T, (long long)K, ldx, (int)r);
    return m;
}
template <bool SW>
static void gemm_wgmma(const GemmArgs& a, cudaStream_t stream) {
    const int64_t tiles = SW ? CEIL_DIV(a.w.rows / 2, (int64_t)WG_BM / 2) : CEIL_DIV(a.w.rows, (int64_t)WG_BM);
    dim3 grid((unsigned)tiles, (unsigned)CEIL_DIV(a.T, WG_BN));
    const CUtensorMap xm = wg_xmap(a.x, a.ldx, a.w.cols, a.T);
    if (a.w.format == FMT_Q4) launch_k(gemm_wgmma_kernel<FMT_Q4, SW>, grid, WG_THREADS, WG_SMEM, stream, a, xm);
    else if (a.w.format == FMT_Q5) launch_k(gemm_wgmma_kernel<FMT_Q5, SW>, grid, WG_THREADS, WG_SMEM, stream, a, xm);
    else launch_k(gemm_wgmma_kernel<FMT_Q6, SW>, grid, WG_THREADS, WG_SMEM, stream, a, xm);
    cudaCheck(cudaGetLastError());
}
// gate_up's product with swiglu in its epilogue (the wgmma kernel: where gemm_on_wgmma), so
// prefill writes y [T][I] and no [T][2I] product and runs no swiglu kernel; the bits of gemm +
// swiglu (each output its own dot product in the same k order, then swiglu_kernel's roundings)
static bool gemm_swiglu_ok(const Mat& w) { return gemm_ok(w) && gemm_on_wgmma(w) && w.rows % 2 == 0; }
static void gemm_swiglu(const Mat& w, const bf16_t* x, int ldx, int T, bf16_t* y, int ldy, cudaStream_t stream) {
    gemm_check(w, x, ldx, T);
    CHECK(gemm_swiglu_ok(w), "gemm_swiglu: format %s, %lld rows, wgmma %d", format_name(w.format), (long long)w.rows, (int)g_gemm_wgmma);
    gemm_wgmma<true>(GemmArgs{w, x, ldx, T, y, ldy, 0, nullptr, 0}, stream);
}
static void gemm(const Mat& w, const bf16_t* x, int ldx, int T, void* y, int ldy, bool y_f32, const bf16_t* resid, int ldr,
                 cudaStream_t stream) {
    gemm_check(w, x, ldx, T);
    GemmArgs a{w, x, ldx, T, y, ldy, y_f32 ? 1 : 0, resid, ldr};
    if (gemm_on_wgmma(w)) { gemm_wgmma<false>(a, stream); return; }
    dim3 grid((unsigned)CEIL_DIV(w.rows, (int64_t)GM_BN), (unsigned)CEIL_DIV(T, GM_BM));
    switch (w.format) {
        case FMT_Q4: launch_k(gemm_kernel<FMT_Q4>, grid, GM_THREADS, GM_SMEM, stream, a); break;
        case FMT_Q5: launch_k(gemm_kernel<FMT_Q5>, grid, GM_THREADS, GM_SMEM, stream, a); break;
        case FMT_Q6: launch_k(gemm_kernel<FMT_Q6>, grid, GM_THREADS, GM_SMEM, stream, a); break;
        case FMT_W8: launch_k(gemm_kernel<FMT_W8>, grid, GM_THREADS, GM_SMEM, stream, a); break;
        case FMT_BF16: launch_k(gemm_kernel<FMT_BF16>, grid, GM_THREADS, GM_SMEM, stream, a); break;
        default: CHECK(false, "gemm: format %s", format_name(w.format));
    }
    cudaCheck(cudaGetLastError());
}

// the matrix product of the forward: gemv for a few columns (decode), gemm for prefill pieces
// (gemv_only: every T through the gemv, GpuTuning::force_gemv)
enum { LINEAR_GEMV_MAX = 8 };
static bool linear_on_gemm(const Mat& w, int T, bool gemv_only) { return T > LINEAR_GEMV_MAX && !gemv_only && gemm_ok(w); }
static void linear(const Mat& w, const bf16_t* x, int ldx, int T, void* y, int ldy, bool y_f32, const bf16_t* resid, int ldr,
                   cudaStream_t stream, GemvX xt = GemvX(), bool gemv_only = false) {
    if (linear_on_gemm(w, T, gemv_only)) {
        CHECK(xt.mode == GEMV_X_PLAIN, "linear: x transforms are for the gemv");
        gemv_xp_forget(stream);
        gemm(w, x, ldx, T, y, ldy, y_f32, resid, ldr, stream);
    } else {
        gemv(w, x, ldx, T, y, ldy, y_f32, resid, ldr, stream, xt);
    }
}

// ---- 7.11 gated delta rule prefill, recurrent -----------------------------------------------
// gated delta rule over a prefill piece (model.md 3.5), recurrent, state in registers
//
// the same recurrence as gdn_step, organised for many tokens: q and k arrive l2-normed in
// fp32 (l2norm), beta and g from gdn_gates, so the loop over tokens does only the state
// update. one warp owns 8 columns of one head's state: lane = column (lane & 7) x row part
// (lane >> 3, 32 rows each), the 32 x 1 slice in registers. per token: m = k.S[:, j] (32 fma,
// two shuffles), delta = beta (v_j - e^g m), S[:, j] = e^g S[:, j] + k delta, o_j = q.S[:, j]
// (two shuffles). no barriers: q, k of the next token are fetched while this one is computed
// and staged through a warp-private shared buffer. state fp32, read from state_in (null:
// zeros) and written to state_out (may be the same slot). output bf16 [T][Hv*dv].

enum { GDNP_COLS = 8, GDNP_ROWS = GDN_D / 4, GDNP_PAD = GDN_D + GDN_D / 32 * 4 };
struct GdnPrefillArgs {
    const float* q; const float* k; int ldqk;  // [T][Hk*128]; q already scaled by dk^-1/2
    const bf16_t* v; int ldv;                  // value head h of token t at v + t*ldv + h*128
    const float* beta; const float* g; int ldg;// [T][Hv]
    const float* state_in; float* state_out;   // [Hv][dk][dv]
    bf16_t* out; int ldo;                      // [T][Hv*dv]
    int T, Hk, Hv;
    float* scratch = nullptr;                  // chunked form only: gdn_chunked_scratch_floats(T, Hv)
};
__device__ __forceinline__ int gdnp_idx(int i) { return i + (i >> 5) * 4; }  // row parts 4 banks apart
__global__ void __launch_bounds__(32) gdn_prefill_kernel(GdnPrefillArgs a) {
    pdl_entry();
    const int h = blockIdx.x, lane = threadIdx.x;
    const int col = lane & 7, part = lane >> 3;
    const int j = blockIdx.y * GDNP_COLS + col, i0 = part * GDNP_ROWS;
    const int hk = h / (a.Hv / a.Hk);
    __shared__ __align__(16) float qs[2][GDNP_PAD], ks[2][GDNP_PAD];
    float s[GDNP_ROWS];
#pragma unroll
    for (int r = 0; r < GDNP_ROWS; r++)
        s[r] = a.state_in ? a.state_in[((int64_t)h * GDN_D + i0 + r) * GDN_D + j] : 0.f;
    float4 pq, pk; float pv, pb, pg;
    auto fetch = [&](int tt) {
        pq = *(const float4*)(a.q + (int64_t)tt * a.ldqk + hk * GDN_D + lane * 4);
        pk = *(const float4*)(a.k + (int64_t)tt * a.ldqk + hk * GDN_D + lane * 4);
        pv = bf2f(a.v[(int64_t)tt * a.ldv + h * GDN_D + j]);
        pb = a.beta[(int64_t)tt * a.ldg + h];
        pg = a.g[(int64_t)tt * a.ldg + h];
    };
    if (a.T > 0) fetch(0);
    for (int t = 0; t < a.T; t++) {
        const int buf = t & 1;
        *(float4*)&qs[buf][gdnp_idx(lane * 4)] = pq;
        *(float4*)&ks[buf][gdnp_idx(lane * 4)] = pk;
        const float vj = pv, beta = pb, eg = expf(pg);
        __syncwarp();
        if (t + 1 < a.T) fetch(t + 1);
        const float* kr = &ks[buf][gdnp_idx(i0)];
        const float* qr = &qs[buf][gdnp_idx(i0)];
        float m0 = 0.f, m1 = 0.f, m2 = 0.f, m3 = 0.f;
#pragma unroll
        for (int r = 0; r < GDNP_ROWS; r += 4) {
            const float4 kk = *(const float4*)&kr[r];
            m0 = fmaf(s[r], kk.x, m0); m1 = fmaf(s[r + 1], kk.y, m1); m2 = fmaf(s[r + 2], kk.z, m2); m3 = fmaf(s[r + 3], kk.w, m3);
        }
        float m = (m0 + m1) + (m2 + m3);
        m += __shfl_xor_sync(0xffffffffu, m, 8);
        m += __shfl_xor_sync(0xffffffffu, m, 16);
        const float delta = beta * (vj - eg * m);
        float o0 = 0.f, o1 = 0.f, o2 = 0.f, o3 = 0.f;
#pragma unroll
        for (int r = 0; r < GDNP_ROWS; r += 4) {
            const float4 kk = *(const float4*)&kr[r], qq = *(const float4*)&qr[r];
            s[r] = fmaf(kk.x, delta, s[r] * eg); s[r + 1] = fmaf(kk.y, delta, s[r + 1] * eg);
            s[r + 2] = fmaf(kk.z, delta, s[r + 2] * eg); s[r + 3] = fmaf(kk.w, delta, s[r + 3] * eg);
            o0 = fmaf(s[r], qq.x, o0); o1 = fmaf(s[r + 1], qq.y, o1); o2 = fmaf(s[r + 2], qq.z, o2); o3 = fmaf(s[r + 3], qq.w, o3);
        }
        float o = (o0 + o1) + (o2 + o3);
        o += __shfl_xor_sync(0xffffffffu, o, 8);
        o += __shfl_xor_sync(0xffffffffu, o, 16);
        if (part == 0) a.out[(int64_t)t * a.ldo + h * GDN_D + j] = f2bf(o);
    }
    if (a.state_out) {
#pragma unroll
        for (int r = 0; r < GDNP_ROWS; r++) a.state_out[((int64_t)h * GDN_D + i0 + r) * GDN_D + j] = s[r];
    }
}
static void gdn_prefill(const GdnPrefillArgs& a, cudaStream_t stream) {
    CHECK(a.Hv % a.Hk == 0 && a.ldqk % 4 == 0, "gdn_prefill: bad arguments");
    launch_k(gdn_prefill_kernel, dim3(a.Hv, GDN_D / GDNP_COLS), 32, 0, stream, a);
    cudaCheck(cudaGetLastError());
}

// ---- 7.12 gated delta rule prefill, chunked -------------------------------------------------
// gated delta rule over a prefill piece, chunked (model.md 3.6), tensor cores
//
// the recurrent kernel above does T dependent steps per head (latency-bound); the chunked form
// turns the steps inside a chunk of 64 tokens into matrix products; only the chunk-to-chunk
// state update stays serial. it pays from 64-token pieces on (1.2x there, 6x at 4096 on the
// h200: test/bench-notes.md, "gated deltanet prefill"), hence GpuTuning::gdn_chunked_min.
// two kernels:
//   gdn_chunk_prep (one block per chunk x value head, all chunks in parallel): Gamma = the
//     cumulative log-decay in the chunk; A[r][s] = beta_r (k_r.k_s) e^(Gamma_r - Gamma_s) for
//     s < r; T = (I + A)^-1 (16x16 diagonal blocks by forward substitution, then the blocks
//     below them, T_ij = -T_ii sum_k A_ik T_kj, in fp32); writes T' = T diag(beta) and
//     P[r][s] = (q_r.k_s) e^(Gamma_r - Gamma_s) for s <= r (the intra-chunk attention) to the
//     scratch, tf32-rounded, and Gamma.
//   gdn_chunk_scan (one block per value head x NC state columns, the chunks in order): the
//     state slice S [128 x NC] lives in mma accumulators; per chunk, with X = K S, Y = Q S
//     (one 128-row product: [K; Q] S),
//        V_new = T' (V - e^Gamma X)                     (= U - W S of model.md 3.6, with
//                                                        U = T diag(beta) V, W = T diag(beta e^Gamma) K)
//        O     = e^Gamma Y + P V_new                    -> out (bf16)
//        S     = e^Gamma_last S + K^T (e^(Gamma_last - Gamma) V_new)
//     columns of S are independent, so the 128 / NC blocks of a head share nothing but the
//     chunk's K, Q, T', P, which each loads (cp.async, prefetched one stage ahead).
// numerics: mma.sync m16n8k8 tf32 with fp32 accumulation; every operand is rounded to tf32
// (cvt.rna: relative error <= 2^-11) once, the state is fp32 in registers between chunks and
// is read from / written to the fp32 state slots. tf32 rather than bf16 (2^-8) because the
// state carries over the whole prompt and into decode, and V - e^Gamma K S cancels when the
// state already predicts v; the work is small enough (~20 GFLOP per 9b layer at T = 4096) that
// the tf32 rate is not the limit. measured against a float64 recurrence: state rel-l2 4-5e-4
// (~2^-11, not growing with T: the update is a contraction), output 1.7e-3 (its bf16 rounding);
// a numpy model of these roundings (test/gdn_rounding.py) puts the state at 3e-3 for
// near-identical keys with beta ~ 1; bf16 operands give 4e-3 on random keys and 2.4e-2 there.
// decays: e^(Gamma_r - Gamma_s) is only formed for s <= r and e^Gamma_r, e^(Gamma_last -
// Gamma_r) are <= 1, so strong decay underflows to 0 and never overflows. a partial last
// chunk is zero-padded (q = k = v = 0, beta = 0, g = 0), which leaves the result unchanged.

enum { GDC = 64, GDC_LDK = GDN_D + 4, GDC_LDT = GDC + 4, GDC_TILE = 2 * GDC * GDC + GDC, GDC_PREP_THREADS = 128,
       GDC_SCAN_THREADS = 256 };
static_assert((int)GDC == (int)GDN_CHUNK, "the gpu chunk is the cpu reference's");
static const size_t GDC_PREP_SMEM = (size_t)2 * GDC * GDC_LDK * 4;
// scratch per prefill piece: per (chunk, value head) T' [64][64], P [64][64], Gamma [64]
static size_t gdn_chunked_scratch_floats(int T, int Hv) { return (size_t)CEIL_DIV(T, GDC) * Hv * GDC_TILE; }
template <int NC>
static constexpr size_t gdc_scan_smem() {
    return ((size_t)3 * GDC * GDC_LDK + 2 * GDC * GDC_LDT + (size_t)(128 + 2 * GDC) * (NC + 8) + 2 * GDC) * 4;
}
static int g_sms = 132;               // multiprocessors of the device (gpu_kernels_init)

__device__ __forceinline__ uint32_t tf32_bits(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float tf32_round(float x) { return __uint_as_float(tf32_bits(x)); }
__device__ __forceinline__ void mma_tf32_1688(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// the a fragment (16 rows x 8 k, row-major fp32 in shared memory, row stride ld floats) of
// m16n8k8 tf32 by one ldmatrix.x4: matrix i = rows (i & 1) * 8.., k (i >> 1) * 4..; lane
// gets row lane/4, k lane%4 of each, which is the tf32 fragment layout
__device__ __forceinline__ void ldsm_a_tf32(const float* base, int ld, int lane, uint32_t (&a)[4]) {
    ldsm_x4(smem_u32(base + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 4), a[0], a[1], a[2], a[3]);
}
// 64 rows of 128 fp32 (row r at src + r*ld) into shared memory [64][GDC_LDK]; rows >= n zero
__device__ __forceinline__ void gdc_load_rows(float* dst, const float* src, int64_t ld, int n, int tid, int nthreads) {
    for (int i = tid; i < GDC * 32; i += nthreads) {
        const int r = i >> 5, c4 = (i & 31) * 4;
        float* d = dst + r * GDC_LDK + c4;
        if (r < n) cp_async16_m(smem_u32(d), src + (int64_t)r * ld + c4);
        else *(float4*)d = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

__global__ void __launch_bounds__(GDC_PREP_THREADS) gdn_chunk_prep_kernel(GdnPrefillArgs a) {
    pdl_entry();
    extern __shared__ __align__(16) float gp_smem[];
    __shared__ float Gs[GDC], Bs[GDC];
    const int c = blockIdx.x, h = blockIdx.y, hk = h / (a.Hv / a.Hk);
    const int t0 = c * GDC, n = min(GDC, a.T - t0);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    float* Ks = gp_smem;
    float* Qs = Ks + GDC * GDC_LDK;
    gdc_load_rows(Ks, a.k + (int64_t)t0 * a.ldqk + hk * GDN_D, a.ldqk, n, tid, GDC_PREP_THREADS);
    gdc_load_rows(Qs, a.q + (int64_t)t0 * a.ldqk + hk * GDN_D, a.ldqk, n, tid, GDC_PREP_THREADS);
    cp_async_commit_m();
    float* tile = a.scratch + ((int64_t)c * a.Hv + h) * GDC_TILE;
    if (tid < GDC) Bs[tid] = tid < n ? a.beta[(int64_t)(t0 + tid) * a.ldg + h] : 0.f;
    if (warp == 0) {  // Gamma: inclusive scan of g, tokens lane and lane + 32
        float v0 = lane < n ? a.g[(int64_t)(t0 + lane) * a.ldg + h] : 0.f;
        float v1 = lane + 32 < n ? a.g[(int64_t)(t0 + lane + 32) * a.ldg + h] : 0.f;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float y0 = __shfl_up_sync(0xffffffffu, v0, o), y1 = __shfl_up_sync(0xffffffffu, v1, o);
            if (lane >= o) { v0 += y0; v1 += y1; }
        }
        v1 += __shfl_sync(0xffffffffu, v0, 31);
        Gs[lane] = v0; Gs[lane + 32] = v1;
        tile[2 * GDC * GDC + lane] = v0; tile[2 * GDC * GDC + lane + 32] = v1;
    }
    cp_async_wait_m<0>();
    __syncthreads();
    // K K^T and Q K^T, rows 16 warp.. of each, 64 columns
    float kk[8][4], qk[8][4];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) kk[i][j] = qk[i][j] = 0.f;
#pragma unroll 4
    for (int ks = 0; ks < GDN_D / 8; ks++) {
        uint32_t ak[4], aq[4];
        ldsm_a_tf32(Ks + 16 * warp * GDC_LDK + ks * 8, GDC_LDK, lane, ak);
        ldsm_a_tf32(Qs + 16 * warp * GDC_LDK + ks * 8, GDC_LDK, lane, aq);
#pragma unroll
        for (int j = 0; j < 4; j++) { ak[j] = tf32_bits(__uint_as_float(ak[j])); aq[j] = tf32_bits(__uint_as_float(aq[j])); }
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            const float* kb = Ks + (nt * 8 + g) * GDC_LDK + ks * 8 + t;
            const uint32_t b0 = tf32_bits(kb[0]), b1 = tf32_bits(kb[4]);
            mma_tf32_1688(kk[nt], ak[0], ak[1], ak[2], ak[3], b0, b1);
            mma_tf32_1688(qk[nt], aq[0], aq[1], aq[2], aq[3], b0, b1);
        }
    }
    __syncthreads();  // K and Q are consumed: the space becomes A, T and the merge scratch
    float* Am = gp_smem;               // [64][GDC_LDT]
    float* Tm = Am + GDC * GDC_LDT;    // [64][GDC_LDT], lower block triangle only
    float* Mm = Tm + GDC * GDC_LDT;    // [3][16][17]
    float* Pg = tile + GDC * GDC;
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = 16 * warp + g + 8 * hf, s = nt * 8 + 2 * t;
            float av[2], pv[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float d = expf(Gs[r] - Gs[s + e]);  // used only where s + e <= r (<= 1 there)
                av[e] = s + e < r ? Bs[r] * kk[nt][2 * hf + e] * d : 0.f;
                pv[e] = s + e <= r ? tf32_round(qk[nt][2 * hf + e] * d) : 0.f;
            }
            *(float2*)&Am[r * GDC_LDT + s] = make_float2(av[0], av[1]);
            *(float2*)&Pg[r * GDC + s] = make_float2(pv[0], pv[1]);
        }
    __syncthreads();
    // T = (I + A)^-1. diagonal 16x16 blocks: thread (block i, column cc), forward substitution
    if (tid < GDC) {
        const int i = tid >> 4, cc = tid & 15;
        const float* Ad = Am + 16 * i * GDC_LDT + 16 * i;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; r++) {
            float acc = r == cc ? 1.f : 0.f;
#pragma unroll
            for (int m = 0; m < r; m++) acc = fmaf(-Ad[r * GDC_LDT + m], x[m], acc);
            x[r] = acc;
        }
#pragma unroll
        for (int r = 0; r < 16; r++) Tm[(16 * i + r) * GDC_LDT + 16 * i + cc] = x[r];
    }
    __syncthreads();
    // the blocks below: (I + A) T = I in block row i gives T_ij = -T_ii M_ij with
    // M_ij = sum_{k=j}^{i-1} A_ik T_kj (the T_kj are rows of earlier block rows)
    for (int i = 1; i < 4; i++) {
        for (int e = tid; e < i * 256; e += GDC_PREP_THREADS) {
            const int j = e >> 8, r = (e >> 4) & 15, cc = e & 15;
            const float* ar = Am + (16 * i + r) * GDC_LDT;
            float acc = 0.f;
            for (int col = 16 * j; col < 16 * i; col++) acc = fmaf(ar[col], Tm[col * GDC_LDT + 16 * j + cc], acc);
            Mm[(16 * j + r) * 17 + cc] = acc;
        }
        __syncthreads();
        for (int e = tid; e < i * 256; e += GDC_PREP_THREADS) {
            const int j = e >> 8, r = (e >> 4) & 15, cc = e & 15;
            const float* tr = Tm + (16 * i + r) * GDC_LDT + 16 * i;
            float acc = 0.f;
            for (int m = 0; m <= r; m++) acc = fmaf(tr[m], Mm[(16 * j + m) * 17 + cc], acc);
            Tm[(16 * i + r) * GDC_LDT + 16 * j + cc] = -acc;
        }
        __syncthreads();
    }
    // T' = T diag(beta), zero above the diagonal blocks
    for (int e = tid; e < GDC * GDC / 4; e += GDC_PREP_THREADS) {
        const int r = e >> 4, s4 = (e & 15) * 4;
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; q++) v[q] = (s4 >> 4) <= (r >> 4) ? tf32_round(Tm[r * GDC_LDT + s4 + q] * Bs[s4 + q]) : 0.f;
        *(float4*)&tile[r * GDC + s4] = make_float4(v[0], v[1], v[2], v[3]);
    }
}

// one block = value head blockIdx.x, state columns blockIdx.y * NC.. (8 warps). warp w owns
// rows 16w.. of the state slice (NC/8 accumulator tiles of 16 x 8). shared memory: K (two
// stages), Q, T', P, the state as the b operand, R = V - e^Gamma X, V_new, Gamma (two stages).
// per chunk, three barriers:
//   B1  K, Q, T', Gamma of the chunk and S are in: every warp computes 16 rows of [K; Q] S;
//       warps 0-3 write R, warps 4-7 keep e^Gamma Y as their output accumulators
//   B2  R is in: V_new = T' R (each warp a 16 x NC/2 tile)
//   B3  V_new and P are in: warps 4-7 add P V_new and store O; every warp updates its rows of S
//       and writes them back as the next chunk's b operand
// prefetch (cp.async groups, in order): after B1 P(c) and K(c+1), after B2 Q(c+1), after B3
// T'(c+1) and Gamma(c+1); before B3 wait for P(c) (2 younger groups may fly), before B1 for all.
template <int NC>
__global__ void __launch_bounds__(GDC_SCAN_THREADS, 1) gdn_chunk_scan_kernel(GdnPrefillArgs a) {
    pdl_entry();
    constexpr int NT = NC / 8, LDS = NC + 8;  // LDS = 8 mod 32 (or 24): conflict-free b-fragment reads
    extern __shared__ __align__(16) float gs_smem[];
    float* Kb = gs_smem;                      // [2][64][GDC_LDK]
    float* Qs = Kb + 2 * GDC * GDC_LDK;       // [64][GDC_LDK]
    float* Ts = Qs + GDC * GDC_LDK;           // [64][GDC_LDT]
    float* Ps = Ts + GDC * GDC_LDT;           // [64][GDC_LDT]
    float* Ss = Ps + GDC * GDC_LDT;           // [128][LDS] the state, tf32-rounded
    float* Rs = Ss + 128 * LDS;               // [64][LDS]
    float* Vn = Rs + GDC * LDS;               // [64][LDS]
    float* Gb = Vn + GDC * LDS;               // [2][64]
    const int h = blockIdx.x, j0 = blockIdx.y * NC, hk = h / (a.Hv / a.Hk);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int nch = CEIL_DIV(a.T, GDC);
    const float* kbase = a.k + hk * GDN_D;
    const float* qbase = a.q + hk * GDN_D;
    auto tile = [&](int c) { return a.scratch + ((int64_t)c * a.Hv + h) * GDC_TILE; };
    auto chunk_n = [&](int c) { return min(GDC, a.T - c * GDC); };
    auto load_tile = [&](float* dst, const float* src) {  // 64 x 64 fp32
        for (int i = tid; i < GDC * GDC / 4; i += GDC_SCAN_THREADS) {
            const int r = i >> 4, c4 = (i & 15) * 4;
            cp_async16_m(smem_u32(dst + r * GDC_LDT + c4), src + r * GDC + c4);
        }
    };
    auto load_gamma = [&](float* dst, const float* src) { if (tid < GDC / 4) cp_async16_m(smem_u32(dst + tid * 4), src + tid * 4); };
    // the state slice: rows 16 warp + g (+8), columns j0 + 8 nt + 2t (+1)
    const int sr = 16 * warp + g;
    float S[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        float2 lo = make_float2(0.f, 0.f), hi = lo;
        if (a.state_in) {
            const float* p = a.state_in + ((int64_t)h * GDN_D + sr) * GDN_D + j0 + nt * 8 + 2 * t;
            lo = *(const float2*)p; hi = *(const float2*)(p + 8 * GDN_D);
        }
        S[nt][0] = lo.x; S[nt][1] = lo.y; S[nt][2] = hi.x; S[nt][3] = hi.y;
    }
    auto store_S = [&]() {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            *(float2*)&Ss[sr * LDS + nt * 8 + 2 * t] = make_float2(tf32_round(S[nt][0]), tf32_round(S[nt][1]));
            *(float2*)&Ss[(sr + 8) * LDS + nt * 8 + 2 * t] = make_float2(tf32_round(S[nt][2]), tf32_round(S[nt][3]));
        }
    };
    gdc_load_rows(Kb, kbase, a.ldqk, chunk_n(0), tid, GDC_SCAN_THREADS);
    gdc_load_rows(Qs, qbase, a.ldqk, chunk_n(0), tid, GDC_SCAN_THREADS);
    load_tile(Ts, tile(0));
    load_gamma(Gb, tile(0) + 2 * GDC * GDC);
    cp_async_commit_m();
    store_S();
    const int rr = 16 * (warp & 3) + g;  // this warp's chunk rows in [K; Q] S, V_new and O: rr, rr + 8
    for (int c = 0; c < nch; c++) {
        const int n = chunk_n(c), t0 = c * GDC, buf = c & 1;
        const float* Ks = Kb + buf * GDC * GDC_LDK;
        const float* Gm = Gb + buf * GDC;
        uint32_t vv[NT][2];  // warps 0-3: v at rows rr, rr + 8 (bf16 pairs)
        if (warp < 4) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const bf16_t* vp = a.v + (int64_t)(t0 + rr) * a.ldv + h * GDN_D + j0 + nt * 8 + 2 * t;
                vv[nt][0] = rr < n ? *(const uint32_t*)vp : 0u;
                vv[nt][1] = rr + 8 < n ? *(const uint32_t*)(vp + 8 * (int64_t)a.ldv) : 0u;
            }
        }
        cp_async_wait_m<0>();
        __syncthreads();  // B1
        load_tile(Ps, tile(c) + GDC * GDC);
        cp_async_commit_m();
        if (c + 1 < nch) gdc_load_rows(Kb + (buf ^ 1) * GDC * GDC_LDK, kbase + (int64_t)(t0 + GDC) * a.ldqk, a.ldqk, chunk_n(c + 1), tid, GDC_SCAN_THREADS);
        cp_async_commit_m();
        // [K; Q] S: warp w < 4 rows 16w.. of K S, warp w >= 4 rows 16(w-4).. of Q S
        float acc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
        {
            const float* As = (warp < 4 ? Ks : Qs) + 16 * (warp & 3) * GDC_LDK;
#pragma unroll 4
            for (int ks = 0; ks < GDN_D / 8; ks++) {
                uint32_t af[4];
                ldsm_a_tf32(As + ks * 8, GDC_LDK, lane, af);
#pragma unroll
                for (int j = 0; j < 4; j++) af[j] = tf32_bits(__uint_as_float(af[j]));
                const float* sb = Ss + (ks * 8 + t) * LDS + g;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    mma_tf32_1688(acc[nt], af[0], af[1], af[2], af[3], __float_as_uint(sb[nt * 8]), __float_as_uint(sb[4 * LDS + nt * 8]));
            }
        }
        const float e0 = expf(Gm[rr]), e1 = expf(Gm[rr + 8]);
        if (warp < 4) {  // R = V - e^Gamma K S
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const float2 v0 = __bfloat1622float2(*(const __nv_bfloat162*)&vv[nt][0]);
                const float2 v1 = __bfloat1622float2(*(const __nv_bfloat162*)&vv[nt][1]);
                *(float2*)&Rs[rr * LDS + nt * 8 + 2 * t] = make_float2(tf32_round(v0.x - e0 * acc[nt][0]), tf32_round(v0.y - e0 * acc[nt][1]));
                *(float2*)&Rs[(rr + 8) * LDS + nt * 8 + 2 * t] = make_float2(tf32_round(v1.x - e1 * acc[nt][2]), tf32_round(v1.y - e1 * acc[nt][3]));
            }
        } else {  // O starts as e^Gamma Q S
#pragma unroll
            for (int nt = 0; nt < NT; nt++) { acc[nt][0] *= e0; acc[nt][1] *= e0; acc[nt][2] *= e1; acc[nt][3] *= e1; }
        }
        __syncthreads();  // B2
        if (c + 1 < nch) gdc_load_rows(Qs, qbase + (int64_t)(t0 + GDC) * a.ldqk, a.ldqk, chunk_n(c + 1), tid, GDC_SCAN_THREADS);
        cp_async_commit_m();
        {  // V_new = T' R: rows 16 (warp & 3).., columns (warp >> 2) * NC/2..
            constexpr int NH = NT / 2;
            float vacc[NH][4];
#pragma unroll
            for (int q = 0; q < NH; q++) vacc[q][0] = vacc[q][1] = vacc[q][2] = vacc[q][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < GDC / 8; ks++) {
                uint32_t af[4];
                ldsm_a_tf32(Ts + 16 * (warp & 3) * GDC_LDT + ks * 8, GDC_LDT, lane, af);
                const float* rb = Rs + (ks * 8 + t) * LDS + (warp >> 2) * NH * 8 + g;
#pragma unroll
                for (int q = 0; q < NH; q++)
                    mma_tf32_1688(vacc[q], af[0], af[1], af[2], af[3], __float_as_uint(rb[q * 8]), __float_as_uint(rb[4 * LDS + q * 8]));
            }
#pragma unroll
            for (int q = 0; q < NH; q++) {
                const int col = ((warp >> 2) * NH + q) * 8 + 2 * t;
                *(float2*)&Vn[rr * LDS + col] = make_float2(tf32_round(vacc[q][0]), tf32_round(vacc[q][1]));
                *(float2*)&Vn[(rr + 8) * LDS + col] = make_float2(tf32_round(vacc[q][2]), tf32_round(vacc[q][3]));
            }
        }
        cp_async_wait_m<2>();  // P(c) is in (K(c+1), Q(c+1) may still be in flight)
        __syncthreads();       // B3
        if (c + 1 < nch) { load_tile(Ts, tile(c + 1)); load_gamma(Gb + (buf ^ 1) * GDC, tile(c + 1) + 2 * GDC * GDC); }
        cp_async_commit_m();
        if (warp >= 4) {  // O += P V_new, store rows < n
#pragma unroll
            for (int ks = 0; ks < GDC / 8; ks++) {
                uint32_t af[4];
                ldsm_a_tf32(Ps + 16 * (warp - 4) * GDC_LDT + ks * 8, GDC_LDT, lane, af);
                const float* vb = Vn + (ks * 8 + t) * LDS + g;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    mma_tf32_1688(acc[nt], af[0], af[1], af[2], af[3], __float_as_uint(vb[nt * 8]), __float_as_uint(vb[4 * LDS + nt * 8]));
            }
            bf16_t* op = a.out + (int64_t)(t0 + rr) * a.ldo + h * GDN_D + j0 + 2 * t;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                if (rr < n) *(__nv_bfloat162*)(op + nt * 8) = __floats2bfloat162_rn(acc[nt][0], acc[nt][1]);
                if (rr + 8 < n) *(__nv_bfloat162*)(op + 8 * (int64_t)a.ldo + nt * 8) = __floats2bfloat162_rn(acc[nt][2], acc[nt][3]);
            }
        }
        {  // S = e^Gamma_last S + K^T (e^(Gamma_last - Gamma) V_new): rows 16 warp.. of S
            const float gl = Gm[GDC - 1], dl = expf(gl);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) { S[nt][0] *= dl; S[nt][1] *= dl; S[nt][2] *= dl; S[nt][3] *= dl; }
#pragma unroll
            for (int ks = 0; ks < GDC / 8; ks++) {
                const int k0 = ks * 8 + t;
                const float* kr0 = Ks + k0 * GDC_LDK + 16 * warp + g;
                const float* kr1 = kr0 + 4 * GDC_LDK;
                const uint32_t a0 = tf32_bits(kr0[0]), a1 = tf32_bits(kr0[8]), a2 = tf32_bits(kr1[0]), a3 = tf32_bits(kr1[8]);
                const float d0 = expf(gl - Gm[k0]), d1 = expf(gl - Gm[k0 + 4]);
                const float* vb = Vn + k0 * LDS + g;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    mma_tf32_1688(S[nt], a0, a1, a2, a3, tf32_bits(vb[nt * 8] * d0), tf32_bits(vb[4 * LDS + nt * 8] * d1));
            }
        }
        store_S();  // Ss was last read before B2
    }
    if (a.state_out) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            float* p = a.state_out + ((int64_t)h * GDN_D + sr) * GDN_D + j0 + nt * 8 + 2 * t;
            *(float2*)p = make_float2(S[nt][0], S[nt][1]);
            *(float2*)(p + 8 * GDN_D) = make_float2(S[nt][2], S[nt][3]);
        }
    }
}
// state columns per scan block: the fewest that still fill the device in one wave (a block
// takes most of an sm's shared memory): 9b (32 heads) 32 columns = 128 blocks, 0.8b 16, 27b 64
static int gdn_scan_cols(int Hv) {
    for (int nc : {16, 32, 64})
        if (Hv * (GDN_D / nc) <= g_sms) return nc;
    return 64;
}
static void gdn_prefill_chunked(const GdnPrefillArgs& a, cudaStream_t stream, int nc = 0) {
    CHECK(a.Hv % a.Hk == 0 && a.ldqk % 4 == 0 && a.ldv % 2 == 0 && a.ldo % 2 == 0 && a.scratch && a.T > 0, "gdn_prefill_chunked: bad arguments");
    launch_k(gdn_chunk_prep_kernel, dim3(CEIL_DIV(a.T, GDC), a.Hv), GDC_PREP_THREADS, GDC_PREP_SMEM, stream, a);
    cudaCheck(cudaGetLastError());
    if (!nc) nc = gdn_scan_cols(a.Hv);
    if (nc == 16) launch_k(gdn_chunk_scan_kernel<16>, dim3(a.Hv, GDN_D / 16), GDC_SCAN_THREADS, gdc_scan_smem<16>(), stream, a);
    else if (nc == 32) launch_k(gdn_chunk_scan_kernel<32>, dim3(a.Hv, GDN_D / 32), GDC_SCAN_THREADS, gdc_scan_smem<32>(), stream, a);
    else launch_k(gdn_chunk_scan_kernel<64>, dim3(a.Hv, GDN_D / 64), GDC_SCAN_THREADS, gdc_scan_smem<64>(), stream, a);
    cudaCheck(cudaGetLastError());
}

// ---- 7.13 flash attention prefill; kernel init ----------------------------------------------
// attention over a prefill piece (model.md 2.4): flash attention with tensor cores
//
// block = (64 queries, one query head); 4 warps of 16 queries. the keys come from the cache
// (the piece's own rows were appended first; logical rows through the sequence's page
// table), 64 at a time: S = Q K^T by mma (q and k bf16, fp32 sums, scale 1/16 exact),
// causal mask by kv row (query t sees rows <= pos0 + t), online softmax in fp32 per row
// (FA2: the score fragment becomes the A operand of P V in bf16), O in fp32 registers (16
// rows x 256 dims per warp). K and V tiles: cp.async for bf16 caches
// (V's copy lands while S is computed); int8 / fp8 are decoded to bf16 on the way into
// shared memory. rows past the last written key are zero-filled (never nan times 0). the
// output is gated like attn_combine: y = bf16( bf16(o) * bf16(sigmoid(gate)) ).
// the heaviest query tiles (most keys) are scheduled first.

enum { FA_BQ = 64, FA_BK = 64, FA_THREADS = 128, FA_LDS = ATT_HD + 8 };
static const size_t FA_SMEM = (size_t)3 * 64 * FA_LDS * 2;
static_assert(KV_PAGE % FA_BK == 0, "a prefill key tile must not straddle kv pages");
struct FlashArgs {
    const bf16_t* q; int ldq;            // token t, head hq at q + t*ldq + hq*256
    const void* kc; const void* vc; const __half* ksc; const __half* vsc; int64_t cap;
    const int* pages = nullptr;          // the sequence's page table (KvCache), nullable
    int pos0;                            // kv row of token 0 of the piece
    int T, Hq, Hkv;
    const bf16_t* gate; int ldg;         // [T][Hq*256]
    bf16_t* y; int ldy;                  // [T][Hq*256]
};
template <int KV>
__device__ __forceinline__ void fa_load_tile(bf16_t* dst, const void* cache, const __half* sc, int64_t trow, int nvalid, int tid) {
    // 64 rows x 32 chunks of 8 elements from cache row trow on (one page); rows >= nvalid are zeros
#pragma unroll 4
    for (int i = 0; i < 64 * 32 / FA_THREADS; i++) {
        const int c = tid + i * FA_THREADS, r = c >> 5, c8 = c & 31;
        bf16_t* d = dst + r * FA_LDS + c8 * 8;
        if (r >= nvalid) { *(uint4*)d = make_uint4(0, 0, 0, 0); continue; }
        if constexpr (KV == KV_BF16) {
            cp_async16_m(smem_u32(d), (const bf16_t*)cache + (trow + r) * ATT_HD + c8 * 8);
        } else {
            KvVec<KV> v;
            v.load(cache, sc, trow + r, c8 * 8);
            float f[8];
            v.get(f);
            *(uint4*)d = make_uint4(pack_bf2(f[0], f[1]), pack_bf2(f[2], f[3]), pack_bf2(f[4], f[5]), pack_bf2(f[6], f[7]));
        }
    }
}
template <int KV>
__global__ void __launch_bounds__(FA_THREADS) flash_prefill_kernel(FlashArgs a) {
    pdl_entry();
    extern __shared__ __align__(16) uint8_t fa_smem[];
    bf16_t* Qs = (bf16_t*)fa_smem;
    bf16_t* Ks = Qs + 64 * FA_LDS;
    bf16_t* Vs = Ks + 64 * FA_LDS;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int nqt = CEIL_DIV(a.T, FA_BQ);
    const int q0 = (nqt - 1 - (int)blockIdx.x) * FA_BQ;  // heaviest first
    const int hq = blockIdx.y, G = a.Hq / a.Hkv, h = hq / G;
    const int64_t hrow = (int64_t)h * a.cap;
    const int kv_len = a.pos0 + a.T;                         // rows written so far
    const int q_last = min(q0 + FA_BQ, a.T) - 1;
    const int n_keys = a.pos0 + q_last + 1;                  // keys the tile's last query sees
    // q tile
    for (int c = tid; c < 64 * 32; c += FA_THREADS) {
        const int r = c >> 5, c8 = c & 31;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (q0 + r < a.T) v = *(const uint4*)(a.q + (int64_t)(q0 + r) * a.ldq + hq * ATT_HD + c8 * 8);
        *(uint4*)(Qs + r * FA_LDS + c8 * 8) = v;
    }
    float O[32][4];
#pragma unroll
    for (int i = 0; i < 32; i++) O[i][0] = O[i][1] = O[i][2] = O[i][3] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    const int qr0 = q0 + warp * 16 + g;                      // this thread's two query rows
    const int qp[2] = {a.pos0 + qr0, a.pos0 + qr0 + 8};      // their kv rows (visibility)
    const float scale = 1.0f / 16.0f;                        // 256^-1/2
    for (int k0 = 0; k0 < n_keys; k0 += FA_BK) {
        __syncthreads();  // the previous tile is consumed (and the q tile is written)
        const int nvalid = min(FA_BK, kv_len - k0);
        const int64_t trow = hrow + kv_row(a.pages, k0);  // the tile's rows are consecutive in one page
        fa_load_tile<KV>(Ks, a.kc, a.ksc, trow, nvalid, tid);
        if constexpr (KV == KV_BF16) cp_async_commit_m();
        fa_load_tile<KV>(Vs, a.vc, a.vsc, trow, nvalid, tid);
        if constexpr (KV == KV_BF16) { cp_async_commit_m(); cp_async_wait_m<1>(); }
        __syncthreads();
        // S = Q K^T for the warp's 16 rows x 64 keys
        float S[8][4];
#pragma unroll
        for (int i = 0; i < 8; i++) S[i][0] = S[i][1] = S[i][2] = S[i][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < ATT_HD / 16; ks++) {
            uint32_t a0, a1, a2, a3;
            ldsm_x4(smem_u32(Qs + (warp * 16 + (lane & 15)) * FA_LDS + ks * 16 + (lane >> 4) * 8), a0, a1, a2, a3);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4(smem_u32(Ks + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * FA_LDS + ks * 16 + ((lane >> 3) & 1) * 8), b0, b1, b2, b3);
                mma_bf16_16816(S[2 * np], a0, a1, a2, a3, b0, b1);
                mma_bf16_16816(S[2 * np + 1], a0, a1, a2, a3, b2, b3);
            }
        }
        // mask, online softmax
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int key = k0 + nt * 8 + 2 * t + (j & 1);
                const float v = key <= qp[j >> 1] ? S[nt][j] * scale : -INFINITY;
                S[nt][j] = v;
                mx[j >> 1] = fmaxf(mx[j >> 1], v);
            }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float mn = fmaxf(mrow[r], mx[r]);
            alpha[r] = mn == -INFINITY ? 1.f : __expf(mrow[r] - mn);
            mrow[r] = mn;
        }
        float ls[2] = {0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float mr = mrow[j >> 1];
                const float p = mr == -INFINITY ? 0.f : __expf(S[nt][j] - mr);
                S[nt][j] = p;
                ls[j >> 1] += p;
            }
        lrow[0] = lrow[0] * alpha[0] + ls[0];
        lrow[1] = lrow[1] * alpha[1] + ls[1];
#pragma unroll
        for (int i = 0; i < 32; i++) { O[i][0] *= alpha[0]; O[i][1] *= alpha[0]; O[i][2] *= alpha[1]; O[i][3] *= alpha[1]; }
        if constexpr (KV == KV_BF16) cp_async_wait_m<0>();
        __syncthreads();  // V is in
        // O += P V
#pragma unroll
        for (int kk = 0; kk < FA_BK / 16; kk++) {
            const uint32_t p0 = pack_bf2(S[2 * kk][0], S[2 * kk][1]), p1 = pack_bf2(S[2 * kk][2], S[2 * kk][3]);
            const uint32_t p2 = pack_bf2(S[2 * kk + 1][0], S[2 * kk + 1][1]), p3 = pack_bf2(S[2 * kk + 1][2], S[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < ATT_HD / 16; dp++) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4_t(smem_u32(Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * FA_LDS + dp * 16 + (lane >> 4) * 8), b0, b1, b2, b3);
                mma_bf16_16816(O[2 * dp], p0, p1, p2, p3, b0, b1);
                mma_bf16_16816(O[2 * dp + 1], p0, p1, p2, p3, b2, b3);
            }
        }
    }
    // normalise, gate, store
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
        lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = qr0 + 8 * r;
        if (row >= a.T) continue;
        const float inv = lrow[r] > 0.f ? 1.f / lrow[r] : 0.f;
        const bf16_t* gr = a.gate + (int64_t)row * a.ldg + hq * ATT_HD;
        bf16_t* yr = a.y + (int64_t)row * a.ldy + hq * ATT_HD;
#pragma unroll
        for (int dt = 0; dt < 32; dt++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int d = dt * 8 + 2 * t + j;
                const float o = bfround(O[dt][2 * r + j] * inv) * bfround(sigmoid_f(bf2f(gr[d])));
                yr[d] = f2bf(o);
            }
    }
}
static void flash_prefill(int kv, const FlashArgs& a, cudaStream_t stream) {
    CHECK(a.Hq % a.Hkv == 0 && a.ldq % 8 == 0, "flash_prefill: bad arguments");
    dim3 grid(CEIL_DIV(a.T, FA_BQ), a.Hq);
    if (kv == KV_INT8) launch_k(flash_prefill_kernel<KV_INT8>, grid, FA_THREADS, FA_SMEM, stream, a);
    else if (kv == KV_FP8) launch_k(flash_prefill_kernel<KV_FP8>, grid, FA_THREADS, FA_SMEM, stream, a);
    else launch_k(flash_prefill_kernel<KV_BF16>, grid, FA_THREADS, FA_SMEM, stream, a);
    cudaCheck(cudaGetLastError());
}

// the shared memory (static + dynamic) past 48 KB that kernels ask for: once per device, before any capture
template <int F>
static void gemv_xs_init() {
    cudaCheck(cudaFuncSetAttribute(gemv_xs_kernel<F, 8, 3, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GEMV_XS_SMEM_MAX));
    cudaCheck(cudaFuncSetAttribute(gemv_xs_kernel<F, 4, 4, 6>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GEMV_XS_SMEM_MAX));
    cudaCheck(cudaFuncSetAttribute(gemv_xs_kernel<F, 8, 3, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GEMV_XS_SMEM_MAX));
}
static void gpu_kernels_init(bool pdl = true, bool wgmma = true) {
    int dev = 0, major = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    g_launch_pdl = major >= 9 && pdl;
    static int wg_here = -1;  // the probe once per process
    if (wg_here < 0) {
        wg_here = 0;
        if (major == 9) {
            int* d = nullptr;
            cudaCheck(cudaMalloc(&d, sizeof(int)));
            cudaCheck(cudaMemset(d, 0, sizeof(int)));
            wg_probe_kernel<<<1, 1>>>(d);
            cudaCheck(cudaGetLastError());
            cudaCheck(cudaMemcpy(&wg_here, d, sizeof(int), cudaMemcpyDeviceToHost));
            cudaCheck(cudaFree(d));
        }
    }
    if (wg_here == 1 && !g_tmap_encode) {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            g_tmap_encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
        else
            wg_here = 0, (void)cudaGetLastError();  // no tensor maps from this driver: the mma.sync gemm serves
    }
    g_gemm_wgmma = wg_here == 1 && wgmma;
    if (wg_here == 1) {
        for (auto k : {gemm_wgmma_kernel<FMT_Q4, false>, gemm_wgmma_kernel<FMT_Q5, false>, gemm_wgmma_kernel<FMT_Q6, false>,
                       gemm_wgmma_kernel<FMT_Q4, true>, gemm_wgmma_kernel<FMT_Q5, true>, gemm_wgmma_kernel<FMT_Q6, true>})
            cudaCheck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)WG_SMEM));
    }
    gemv_xs_init<FMT_Q4>(); gemv_xs_init<FMT_Q5>(); gemv_xs_init<FMT_Q6>(); gemv_xs_init<FMT_W8>();
    gemv_xp_init<FMT_Q4>(); gemv_xp_init<FMT_Q5>(); gemv_xp_init<FMT_Q6>(); gemv_xp_init<FMT_W8>(); gemv_xp2_init();
    gemv_xp_reserve((cudaStream_t)0);  // the default stream's (tests and tools launch there)
    cudaCheck(cudaFuncSetAttribute(gemm_kernel<FMT_Q4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GM_SMEM));
    cudaCheck(cudaFuncSetAttribute(gemm_kernel<FMT_Q5>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GM_SMEM));
    cudaCheck(cudaFuncSetAttribute(gemm_kernel<FMT_Q6>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GM_SMEM));
    cudaCheck(cudaFuncSetAttribute(gemm_kernel<FMT_W8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GM_SMEM));
    cudaCheck(cudaFuncSetAttribute(gemm_kernel<FMT_BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GM_SMEM));
    cudaCheck(cudaFuncSetAttribute(flash_prefill_kernel<KV_BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)FA_SMEM));
    cudaCheck(cudaFuncSetAttribute(flash_prefill_kernel<KV_INT8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)FA_SMEM));
    cudaCheck(cudaFuncSetAttribute(flash_prefill_kernel<KV_FP8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)FA_SMEM));
    cudaCheck(cudaFuncSetAttribute(gdn_chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GDC_PREP_SMEM));
    cudaCheck(cudaFuncSetAttribute(gdn_chunk_scan_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gdc_scan_smem<16>()));
    cudaCheck(cudaFuncSetAttribute(gdn_chunk_scan_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gdc_scan_smem<32>()));
    cudaCheck(cudaFuncSetAttribute(gdn_chunk_scan_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gdc_scan_smem<64>()));
    cudaCheck(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev));
}

// ---- 7.14 the vision tower's kernels --------------------------------------------------------
//
// model.md 6.3; the cpu twins are the steps of vision_forward_cpu.
//
// the tower's residual stream x stays fp32 [N, Dv]; every product's input is bf16 (pixels,
// layernorm outputs, rotated q / k and v, attention output, gelu outputs) and every product's
// output fp32 (gemm / gemv with y_f32), which vision_forward_cpu(bf16 = true) reproduces. biases
// and norm weights are bf16 (the artifact's). N patches of an item are t frames of h*w rows,
// 2x2-block-major.

// x = y + bias + positions: y the patch embedding product [N, D] fp32; the position rows of a
// frame come from the bf16 table, bilinear with the 4 taps and weights of pos_axis (fp32)
__global__ void vis_embed_kernel(const float* __restrict__ y, const bf16_t* __restrict__ bias, const bf16_t* __restrict__ table,
                                 int D, int side, int h, int w, int merge, float* __restrict__ x) {
    pdl_entry();
    const int p = blockIdx.x, fp = p % (h * w), bw = w / merge;
    const int row = fp / (merge * merge * bw) * merge + (fp / merge) % merge, col = (fp / (merge * merge)) % bw * merge + fp % merge;
    int th[2], tw[2];
    float wh[2], ww[2];
    const float sh = (float)row * (float)(side - 1) / (float)max(h - 1, 1), sw = (float)col * (float)(side - 1) / (float)max(w - 1, 1);
    const float fh = floorf(sh), fw = floorf(sw);
    for (int o = 0; o < 2; o++) {
        th[o] = min(max((int)fh + o, 0), side - 1); wh[o] = fmaxf(0.f, 1.f - fabsf(sh - fh - (float)o));
        tw[o] = min(max((int)fw + o, 0), side - 1); ww[o] = fmaxf(0.f, 1.f - fabsf(sw - fw - (float)o));
    }
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float pe = 0.f;
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++) pe += bf2f(table[(int64_t)(th[a] * side + tw[b]) * D + i]) * (wh[a] * ww[b]);
        x[(int64_t)p * D + i] = (y[(int64_t)p * D + i] + bf2f(bias[i])) + pe;
    }
}

// y = bf16(LayerNorm(x) * w + b) per row of n fp32 (mean, then the variance around it; eps on it)
__global__ void __launch_bounds__(1024) vis_layernorm_kernel(const float* __restrict__ x, const bf16_t* __restrict__ w,
                                                             const bf16_t* __restrict__ b, int n, float eps, bf16_t* __restrict__ y) {
    pdl_entry();
    const float* xr = x + (int64_t)blockIdx.x * n;
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    const float mean = block_sum(s) / (float)n;
    float v = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
    const float r = 1.0f / sqrtf(block_sum(v) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[(int64_t)blockIdx.x * n + i] = f2bf((xr[i] - mean) * r * bf2f(w[i]) + bf2f(b[i]));
}

// qkv = bf16(rope(y + bias)): y the qkv product [N, 3D] fp32 ([q heads | k heads | v heads]);
// q and k rotated by the patch's (row, col), the pairs (i, i + d/2) of each head
struct VisRope { float f[32]; };  // vision_rope_freq(d, i), i < d/4, from the host
__global__ void vis_qkv_kernel(const float* __restrict__ y, const bf16_t* __restrict__ bias, int D, int nh, int w, int frame, int merge,
                               VisRope fr, bf16_t* __restrict__ qkv) {
    pdl_entry();
    const int p = blockIdx.x, d = D / nh, half = d / 2, q4 = d / 4, fp = p % frame, bw = w / merge;
    const int row = fp / (merge * merge * bw) * merge + (fp / merge) % merge, col = (fp / (merge * merge)) % bw * merge + fp % merge;
    const float* yr = y + (int64_t)p * 3 * D;
    bf16_t* o = qkv + (int64_t)p * 3 * D;
    for (int k = threadIdx.x; k < 3 * nh * half; k += blockDim.x) {
        const int hh = k / half, i = k % half, c0 = hh * d + i, c1 = c0 + half;
        const float x0 = yr[c0] + bf2f(bias[c0]), x1 = yr[c1] + bf2f(bias[c1]);
        if (hh >= 2 * nh) { o[c0] = f2bf(x0); o[c1] = f2bf(x1); continue; }  // v heads
        const float a = (float)(i < q4 ? row : col) * fr.f[i < q4 ? i : i - q4];
        const float cs = cosf(a), sn = sinf(a);
        o[c0] = f2bf(x0 * cs - x1 * sn);
        o[c1] = f2bf(x1 * cs + x0 * sn);
    }
}

// non-causal attention within each frame: one thread per query (VIS_AQ per block, grid
// frames x heads x query blocks), keys and values staged VIS_AK at a time in shared memory as
// fp32 (every thread reads the same key: broadcasts), online softmax in fp32. q from qkv
// [N, 3D], out bf16 [N, D] heads side by side.
enum { VIS_AQ = 128, VIS_AK = 32 };
template <int HD>
__global__ void __launch_bounds__(VIS_AQ) vis_attn_kernel(const bf16_t* __restrict__ qkv, int D, int frame, float scale, bf16_t* __restrict__ out) {
    pdl_entry();
    __shared__ float Ks[VIS_AK][HD], Vs[VIS_AK][HD];
    const int f0 = blockIdx.x * frame, h = blockIdx.y, qi = blockIdx.z * VIS_AQ + threadIdx.x;
    const bool live = qi < frame;
    float q[HD], o[HD];
    const bf16_t* qr = qkv + (int64_t)(f0 + (live ? qi : 0)) * 3 * D + h * HD;
#pragma unroll
    for (int i = 0; i < HD; i++) { q[i] = bf2f(qr[i]) * scale; o[i] = 0.f; }
    float m = -INFINITY, l = 0.f;
    for (int k0 = 0; k0 < frame; k0 += VIS_AK) {
        const int nk = min(VIS_AK, frame - k0);
        __syncthreads();
        for (int e = threadIdx.x; e < nk * HD; e += VIS_AQ) {
            const int j = e / HD, i = e % HD;
            const bf16_t* kr = qkv + (int64_t)(f0 + k0 + j) * 3 * D + h * HD + i;
            Ks[j][i] = bf2f(kr[D]); Vs[j][i] = bf2f(kr[2 * D]);
        }
        __syncthreads();
        for (int j = 0; j < nk; j++) {
            float s = 0.f;
#pragma unroll
            for (int i = 0; i < HD; i++) s = fmaf(q[i], Ks[j][i], s);
            if (s > m) {
                const float c = expf(m - s);  // 0 on the first key (m = -inf)
                l *= c;
#pragma unroll
                for (int i = 0; i < HD; i++) o[i] *= c;
                m = s;
            }
            const float pj = expf(s - m);
            l += pj;
#pragma unroll
            for (int i = 0; i < HD; i++) o[i] = fmaf(pj, Vs[j][i], o[i]);
        }
    }
    if (!live) return;
    bf16_t* orow = out + (int64_t)(f0 + qi) * D + h * HD;
    const float inv = 1.f / l;
#pragma unroll
    for (int i = 0; i < HD; i++) orow[i] = f2bf(o[i] * inv);
}

// the epilogue of a product y [T, n] fp32: mode VIS_RESID: x += y + b (fp32 residual, [T, n]);
// VIS_TANH / VIS_ERF / VIS_NONE: out = bf16(gelu(y + b)) with the tanh or erf gelu, or none, in
// rows of ldo >= n whose columns [n, ldo) are written as zeros (the next product may run over
// the padded k: vis_linear)
enum { VIS_NONE = 0, VIS_TANH = 1, VIS_ERF = 2, VIS_RESID = 3 };
__global__ void vis_bias_kernel(const float* __restrict__ y, const bf16_t* __restrict__ b, int n, int ldo, int64_t total, int mode,
                                float* __restrict__ x, bf16_t* __restrict__ out) {
    pdl_entry();
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        if (mode == VIS_RESID) { x[e] += y[e] + bf2f(b[e % n]); continue; }
        const int64_t r = e / ldo;
        const int c = (int)(e % ldo);
        if (c >= n) { out[e] = f2bf(0.f); continue; }
        const float v = y[r * n + c] + bf2f(b[c]);
        const float a = mode == VIS_TANH ? 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))
                      : mode == VIS_ERF ? 0.5f * v * (1.f + erff(v * 0.70710678118654752f)) : v;
        out[e] = f2bf(a);
    }
}

__global__ void vis_cast_kernel(const float* __restrict__ x, int64_t n, bf16_t* __restrict__ y) {
    pdl_entry();
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) y[e] = f2bf(x[e]);
}

// launchers
static unsigned vis_blocks(int64_t total) { return (unsigned)std::min<int64_t>(CEIL_DIV(total, 256), 65535); }
static void vis_embed(const float* y, const bf16_t* bias, const bf16_t* table, int D, int side, int N, int h, int w, int merge, float* x,
                      cudaStream_t s) {
    launch_k(vis_embed_kernel, dim3(N), dim3(128), 0, s, y, bias, table, D, side, h, w, merge, x);
    cudaCheck(cudaGetLastError());
}
static void vis_layernorm(const float* x, const bf16_t* w, const bf16_t* b, int n, int T, float eps, bf16_t* y, cudaStream_t s) {
    launch_k(vis_layernorm_kernel, dim3(T), dim3(256), 0, s, x, w, b, n, eps, y);
    cudaCheck(cudaGetLastError());
}
static void vis_qkv(const float* y, const bf16_t* bias, int D, int nh, int N, int w, int frame, int merge, bf16_t* qkv, cudaStream_t s) {
    const int d = D / nh;
    CHECK(d / 4 <= 32, "vis_qkv: head dim %d", d);
    VisRope fr;
    for (int i = 0; i < d / 4; i++) fr.f[i] = vision_rope_freq(d, i);
    launch_k(vis_qkv_kernel, dim3(N), dim3(256), 0, s, y, bias, D, nh, w, frame, merge, fr, qkv);
    cudaCheck(cudaGetLastError());
}
static void vis_attn(const bf16_t* qkv, int D, int nh, int N, int frame, bf16_t* out, cudaStream_t s) {
    const int d = D / nh;
    dim3 grid(N / frame, nh, CEIL_DIV(frame, VIS_AQ));
    const float scale = 1.0f / sqrtf((float)d);
    if (d == 64) launch_k(vis_attn_kernel<64>, grid, dim3(VIS_AQ), 0, s, qkv, D, frame, scale, out);
    else if (d == 72) launch_k(vis_attn_kernel<72>, grid, dim3(VIS_AQ), 0, s, qkv, D, frame, scale, out);
    else CHECK(false, "vis_attn: head dim %d (the kernel is built for 64 and 72)", d);
    cudaCheck(cudaGetLastError());
}
static void vis_bias(const float* y, const bf16_t* b, int n, int T, int mode, float* x, bf16_t* out, cudaStream_t s, int ldo = 0) {
    if (ldo == 0) ldo = n;
    CHECK(ldo >= n && (mode != VIS_RESID || ldo == n), "vis_bias: ldo %d for %d columns", ldo, n);
    const int64_t total = (int64_t)ldo * T;
    launch_k(vis_bias_kernel, dim3(vis_blocks(total)), dim3(256), 0, s, y, b, n, ldo, total, mode, x, out);
    cudaCheck(cudaGetLastError());
}
// the k a product runs over: the gemm needs a multiple of 64. the grouped formats store each row
// padded to 128 (format.md 7), so a k that is not (the 9b's fc2, 4304) runs over the padding,
// against activation rows of that width whose padding is zero (vis_bias writes it): the padded
// codes multiply zeros. bf16 weights are stored unpadded and keep their k (linear: the gemv).
static int64_t vis_k(const Mat& w) {
    const int64_t k = (int64_t)align_up((uint64_t)w.cols, GM_BK);
    return format_grouped(w.format) && k <= w.gpr * group_size(w.format) ? k : w.cols;
}
// y [T, rows] fp32 = w x, x rows of ldx >= vis_k(w) bf16 (zero past w.cols)
static void vis_linear(const Mat& w, const bf16_t* x, int ldx, int T, float* y, int ldy, cudaStream_t s) {
    Mat wp = w;
    wp.cols = vis_k(w);
    CHECK(ldx >= wp.cols, "vis_linear: rows of %d for k %lld", ldx, (long long)wp.cols);
    linear(wp, x, ldx, T, y, ldy, true, nullptr, 0, s);
}
static void vis_cast(const float* x, int64_t n, bf16_t* y, cudaStream_t s) {
    launch_k(vis_cast_kernel, dim3(vis_blocks(n)), dim3(256), 0, s, x, n, y);
    cudaCheck(cudaGetLastError());
}

// ---- 7.15 the mtp round's bookkeeping -------------------------------------------------------
// the few threads' work between the big pieces of a speculative round (generate_spec_gpu), so
// that its picks stay on the device and the host reads one small block per round:
//   spec_greedy  a greedy verification's accepted count: the drafts ids[1..n] against the
//                argmax out[0..n-1] of the columns before them, the first mismatch ends it;
//                res = [c, out[0..c]] (the tokens of columns 0..c: c drafts, then the target's)
//   spec_commit  from res: the realignment's ids (row t <= c: the token at index n0+t+1, i.e.
//                d_{t+1} for t < c and out[c] for t = c; rows past c repeat it: they only write
//                mtp kv rows past the true ones, which the draft steps overwrite before any
//                row reads them) and the draft steps' positions n0+c+1+j (clamped into the
//                cache: a draft past the capacity is never verified)
//   spec_row     row c of the mtp's hidden rows: the first draft step's input
//   spec_draft   a proposal's argmax through the draft head's id map: the next round's draft k
//                (res) and the next draft step's token
__global__ void spec_greedy_kernel(const int* ids, const int* out, int n, int* res) {
    pdl_entry_small();
    if (threadIdx.x) return;
    int c = 0;
    while (c < n && out[c] == ids[c + 1]) c++;
    res[SPEC_BLK_RES] = c;
    for (int t = 0; t <= c; t++) res[SPEC_BLK_TOK + t] = out[t];
}
// re_*: the realignment's inputs (kv rows and positions staged by the host), ds_*: the draft steps'
__global__ void spec_commit_kernel(const int* res, const int* ids, int T, int K, int* re_ids, const int* re_kvpos, const int* re_pos3,
                                   int* ds_kvpos, int* ds_pos3, int cap) {
    pdl_entry_small();
    const int c = res[SPEC_BLK_RES], last = res[SPEC_BLK_TOK + c], n0 = re_kvpos[0], rd = re_pos3[0] - n0;
    for (int t = threadIdx.x; t < T; t += blockDim.x) re_ids[t] = t < c ? ids[t + 1] : last;
    for (int j = threadIdx.x; j + 1 < K; j += blockDim.x) {
        const int p = min(n0 + c + 1 + j, cap - 1);
        ds_kvpos[j] = p;
        for (int a = 0; a < 3; a++) ds_pos3[3 * j + a] = p + rd;
    }
}
__global__ void spec_row_kernel(const bf16_t* rows, int H, const int* res, bf16_t* out) {
    pdl_entry_small();
    const bf16_t* r = rows + (int64_t)res[SPEC_BLK_RES] * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) out[i] = r[i];
}
__global__ void spec_draft_kernel(const int* amax, const int32_t* remap, int* res, int k, int* next_id) {
    pdl_entry_small();
    if (threadIdx.x) return;
    const int id = remap ? remap[*amax] : *amax;
    res[SPEC_BLK_DRAFT + k - 1] = id;
    if (next_id) *next_id = id;
}

// === 8. gpu forward ==========================================================
//
// loading, sequence state, the forward pass, cuda graphs, generation
//
// GpuEngine is one model resident on one gpu with one sequence, or with --max-concurrency
// lanes (GpuOpts::lanes > 1) several (below: lanes):
//   * weights: every tensor the chosen features need (text; not the draft head, mtp or vision
//     until those features run on the gpu) is copied into one device allocation, in file
//     order at 256-byte alignment, streamed from the mmap'd artifact through two pinned
//     staging buffers; the cpu Weights views are then rebased onto the arena (a pointer into
//     the mapping -> the same offset in the tensor's device copy), so every Mat / Vec the
//     kernels see is the binder's view with device pointers.
//   * sequence state (one allocation): per full-attention layer k and v caches [Hkv][cap][256]
//     in the --kv-dtype format (+ fp16 scales for int8 / fp8); per deltanet layer `gdn_slots`
//     slots of conv state [3][conv_dim] bf16 and recurrent state [Hv][dk][dv] fp32. `slot` is
//     the live one; decode kernels read and write slots through a device slot map (section 7's
//     header), so verification can snapshot every column (model.md 5.3) and prefix reuse can
//     keep a copy (gpu_snapshot / gpu_restore).
//   * workspace (one allocation): bf16 activations [T_max][features] for one prefill piece,
//     fp32 logits for up to logit_rows rows, attention / argmax scratch, the step inputs.
//
// one forward call runs T tokens (columns) at kv rows pos..pos+T-1:
//   T <= 8 (decode; mtp verification): gemv, conv_step / gdn_step through the slot map,
//     attn_decode split over the context with a per-bucket plan
//   T > 8 (prefill piece): gemm (gate_up with swiglu in its epilogue where the wgmma kernel
//     runs: GpuTuning::fuse_swiglu), conv_prefill, l2norm + gdn_gates + gdn_prefill (recurrent
//     below GpuTuning::gdn_chunked_min tokens, chunked from there on), flash_prefill; a prompt's
//     pieces before its last skip the final norm and the head (gpu_forward's head)
// numerics follow model.md 8: bf16 activations and residual stream, fp32 inside every kernel,
// fp32 deltanet state, fp32 logits.
//
//   decode (T <= 8, GpuTuning::fuse_x): the products that read a norm of the residual stream, and
//     down (swiglu of gate_up), make their x while staging it (GemvX), so a step has 24 row
//     norms (the a/b branch of each deltanet layer) instead of 65 and no swiglu kernel; a
//     deltanet layer's output product reads the gated norm from its prep, bit for bit the
//     gated_rmsnorm kernel's (which prefill runs).
//
// speed and where a decode step's time goes: README ("Speed") and test/bench-notes.md.
//
// cuda graphs: a decode step (embed -> layers -> final norm -> head -> argmax) reads its token,
// positions and slots from a small device block, so a captured graph replays for any step.
// only the attention split plan depends on the context length: one graph per length bucket
// (powers of two from 512 keys: at most ~10 graphs), captured the first time a step lands in
// the bucket. eager decode (--no-cuda-graph) launches the same kernels with the same plan, so
// graph and eager decode give bit-identical logits.
//
// lanes (GpuOpts::lanes > 1, the server's --max-concurrency): one weight arena and workspace,
// several sequences. each lane has its own group of gdn slots (its live pair, or the mtp
// round's K+1) and its kv rows in one pool of kv_rows rows shared by all lanes, in pages of
// KV_PAGE rows that a lane takes for its request (gpu_lane_reserve: the server reserves a
// request's prompt + output rows as it enters) and gives back when its request ends or it is
// evicted (gpu_lane_trim; a reset keeps them); every kernel reads kv rows through the lane's
// page table (section 7's KvCache). the single-sequence functions (gpu_forward, generate_gpu,
// the snapshots, ...) act on the current lane (gpu_lane_select). gpu_decode_lanes runs one
// decode token of up to LANES_MAX lanes as one forward call: every column its own sequence
// (lanes mode of attn_decode, conv_step, gdn_step), the products gemv over all the columns
// (weights read once a step), each column bit for bit the one-token step its lane would take
// alone (the gemv is column-count invariant, attention takes each column's own split plan), so
// batching is lossless.
// graphs per (batch bucket: 1, 2, 4, .. LANES_MAX columns, context bucket of the longest lane);
// padding columns embed token 0, write no kv row (kvpos -1) and use the trash gdn slot.

enum { DEC_COLS = 8, GPU_BUCKET0 = 512, GPU_MAX_BUCKETS = 24 };
enum { LANES_MAX = 64, LANE_BUCKETS = 7 };  // batch buckets 1, 2, 4, .. 64
// the draws of one lanes step (sample_lanes): draw j's sample() call, its lane's counts, the
// token its step fed (-1: counted already); picks[i]: column i's pick
struct LaneDrawIn {
    SampleArgs a[LANES_MAX];
    int* counts[LANES_MAX];
    int accept[LANES_MAX];
    int picks[LANES_MAX];
};
enum { HEAD_NONE = 0, HEAD_LAST = 1, HEAD_ALL = 2 };

// the gpu path's measurement and test knobs, in one place (GpuOpts::tune). the cli and the
// server fill it once at startup from the environment (gpu_tuning_from_env); tests set the
// fields. measurement only: the defaults are the measured best, and every knob that stays
// measured faster on (test/bench-notes.md) and has a test with it off (test_gpu).
//   pdl      true  programmatic dependent launch on sm_90+ (NINFER_PDL=0: off). a decode step
//                  3.43 -> 3.20 ms with it (session 2)
//   wgmma    true  prefill q4 / q5 / q6 products on gemm_wgmma_kernel where sm_90a code runs
//                  (NINFER_WGMMA=0: gemm_kernel's mma.sync, test_kernels Gemm.MatchesFloat64
//                  tests both). 9b pp4096 11.1k -> 17.6k tok/s (session 16)
//   fork     true  independent products on a second stream, graph branches in a capture
//                  (NINFER_FORK=0: one stream). ~1% of a step (v2)
//   fuse_x   true  decode: row norms and swiglu made inside the gemvs' x staging (no env;
//                  tests and bench_gpu). 3.32 -> 3.20 ms a step (v5)
//   fuse_swiglu true  prefill: gate_up's wgmma gemm makes swiglu in its epilogue (gemm_swiglu)
//                  instead of writing [T][2I] for swiglu_kernel (NINFER_FUSE_SWIGLU=0: off). 9b
//                  pp4096 18.8k -> 19.6k (h100, session 21)
//   fuse_gated true decode (with fuse_x): a deltanet layer's output product reads the gated norm
//                  from its prep (GEMV_X_GATED) instead of gated_rmsnorm's output (NINFER_FUSE_GATED=0:
//                  off). 9b step 3.016 -> 2.990 ms, 64 lanes at 760 10.672 -> 10.616 (h200, issue 14)
//   gdn_chunked_min 64  prefill pieces of this many tokens or more take the chunked delta rule
//                  (NINFER_GDN_CHUNKED=N; 0: never). the pair costs ~22 us at any T <= 64, the
//                  recurrent kernel 0.41 us a token: 0.92x at 48, 1.18x at 64 (h200, 9b)
//   attn_splits 128, attn_min_keys 128: decode attention splits a bucket's length into about
//                  attn_splits pieces per kv head of at least attn_min_keys keys (a multiple of
//                  128): Hkv x splits blocks, of which those past the context do nothing (a
//                  context just past a bucket's half has half of them). 9b tg128 at depth 16384 /
//                  32768 with the tensor-core kernel: 310.0 / 292.8 tok/s with 64 splits, 312.2 /
//                  299.5 with 128, 306.4 / 291.8 with 256; the same at 4096 (h200, issue 16)
//                  (NINFER_ATT_SPLITS=N, NINFER_ATT_MIN_KEYS=N)
//   gemv_occ_rows 32768  products of at most this many rows take 8 warps a 16-row tile (the
//                  x-staged gemv at 4 blocks per sm, its wide kernel and prep: g_gemv_occ_rows;
//                  NINFER_GEMV_OCC_ROWS=N, 0: off). tg128 9b 335.7 -> 350.8, 4b 469.2 -> 472.1
//                  (16384: 349.4, 469.3; h200, session 17)
//   lane_draw true   a sampled lane of a lanes step draws its next token in the step, on the
//                  device (sample_lanes: each lane's counts and bias table there), instead of its
//                  logits row copied out for the host sampler, so its token can be queued as a
//                  greedy lane's (LaneSched): 9b served, 256-token sampled streams, steady
//                  3,052 -> 3,554 tok/s at C = 16, 4,362 -> 5,370 at C = 64 (h200, issue 14).
//                  the cpu lanes draw in the step always (NINFER_LANE_DRAW=0: off)
//   pair     true  decode: the input projections' pairs of one x (query_key with value_z or
//                  gate_value) in one launch (gemv2; NINFER_PAIR=0: two launches, attention's
//                  on two streams). measured in test/bench-notes.md, session 20
// test-only forcing (no env): every product through the gemv (force_gemv); prefill attention
// through attn_decode (force_attn_decode); prefill deltanet through gdn_step (force_gdn_step);
// every sampled pick on the host (force_host_sample: the fallback sample_gpu cannot take).
// attn_prep is always on (the separate kernels measured no faster: ~0.2%) and device sampling
// always where it applies (13% -> 0.4% of a decode token).
enum { GPU_ATT_SPLITS = 128, GPU_ATT_MIN_KEYS = 128 };  // GpuTuning::attn_splits / attn_min_keys' defaults
struct GpuTuning {
    bool pdl = true;
    bool wgmma = true;
    bool fork = true;
    bool fuse_x = true;
    bool fuse_gated = true;
    int gdn_chunked_min = 64;
    int attn_splits = GPU_ATT_SPLITS, attn_min_keys = GPU_ATT_MIN_KEYS;
    int gemv_occ_rows = GEMV_OCC_ROWS;
    bool lane_draw = true;
    bool pair = true;
    bool fuse_swiglu = true;
    bool force_gemv = false, force_attn_decode = false, force_gdn_step = false, force_host_sample = false;
};
static GpuTuning gpu_tuning_from_env() {
    GpuTuning t;
    auto off = [](const char* name) { const char* v = getenv(name); return v && !strcmp(v, "0"); };
    t.pdl = !off("NINFER_PDL");
    t.wgmma = !off("NINFER_WGMMA");
    t.fork = !off("NINFER_FORK");
    t.fuse_gated = !off("NINFER_FUSE_GATED");
    t.pair = !off("NINFER_PAIR");
    t.fuse_swiglu = !off("NINFER_FUSE_SWIGLU");
    if (const char* gc = getenv("NINFER_GDN_CHUNKED")) t.gdn_chunked_min = atoi(gc) > 0 ? atoi(gc) : (1 << 30);
    if (const char* as = getenv("NINFER_ATT_SPLITS")) t.attn_splits = std::min(std::max(atoi(as), 1), 4096);
    if (const char* ak = getenv("NINFER_ATT_MIN_KEYS")) t.attn_min_keys = std::min(std::max(atoi(ak), 1), 1 << 20);
    if (const char* gw = getenv("NINFER_GEMV_OCC_ROWS")) t.gemv_occ_rows = std::max(atoi(gw), 0);
    if (const char* ld = getenv("NINFER_LANE_DRAW")) t.lane_draw = strcmp(ld, "0") != 0;
    return t;
}

enum { GPU_LIVE_SLOTS = 2 };  // gdn slots 0 and 1: the live pair (generate_gpu runs a step ahead into the other)

struct GpuOpts {
    int device = 0;
    int kv = KV_BF16;          // --kv-dtype
    int max_context = 2048;    // --max-context: tokens per sequence
    int kv_capacity = 0;       // --kv-capacity: kv rows allocated (0: = max_context, -1: auto)
    int prefill_chunk = 1024;  // --prefill-chunk: tokens per prefill call
    bool graphs = true;        // --no-cuda-graph turns them off
    int gdn_slots = GPU_LIVE_SLOTS;  // one lane's slots (the live pair or the mtp round's K+1), then shared snapshots (prefix reuse)
    int lanes = 1;             // --max-concurrency: sequences (lanes > 1: the paged kv pool, gpu_decode_lanes)
    bool quiet = false;        // no load progress / summary on stderr (tests)
    SpecOpts spec;             // --spec mtp: the mtp module (and --lm-head-draft's head) resident, its kv cache, K+1 gdn slots
    GpuTuning tune;            // measurement / test knobs (above)
};

// the step inputs of one forward call, device pointers
struct StepPtrs {
    int* ids;    // [T] token ids; id < 0: row (-1 - id) of the embedding override
    int* pos3;   // [T][3] m-rope positions (t, h, w)
    int* kvpos;  // [T] kv row of each column
    int* slots;  // [2T] gdn slot map (decode path)
    int* out;    // [T] argmax of each column's logits (decode path)
    int* skeys = nullptr;  // lanes: [T] each column's attention split (its lane's plan); non-null = lanes mode
    int* pages = nullptr;  // lanes: [T][page_ld] each column's page table
    int page_ld = 0;       // ... the step's context bucket's pages (gpu_decode_lanes)
};

// one sequence of a lanes engine (the current lane's live in GpuEngine's pos / slot / ...)
struct GpuLane {
    int pos = 0, rope_delta = 0, slot = 0, mtp_pos = 0;  // (its logits are not kept: gpu_lane_select)
    std::vector<int> pages;    // its pool pages in order: logical row p is in pages[p / KV_PAGE]
};

// the mtp round's device state (generate_spec_gpu), only with --spec mtp
struct GpuMtp {
    int K = 0;                 // draft window (0: no mtp on the device)
    bool draft_head = false;   // drafts scored by text/draft_head (its id map: draft_ids)
    int pos = 0;               // mtp kv rows that pair a token with its hidden: the sequence's pos between
                               // rounds, or pos - 1 after a prefill without sampling (gpu_spec_prefill)
    bf16_t* bridge = nullptr;  // [H] then: the main hidden row pos - 1, whose mtp row waits for token pos (the current lane's row of bridges)
    bf16_t* bridges = nullptr; // [lanes][H]
    KvCache kv;                // the mtp layer's own kv cache, capacity rows, the --kv-dtype format
    const int32_t* draft_ids = nullptr;  // device copy of text/draft_head_token_ids
    bf16_t* hid = nullptr;     // [T_max][H] the main model's final-normed hidden rows (the verify columns, a prefill piece)
    bf16_t* in = nullptr;      // [T_max][2H] [rmsnorm(embed) | rmsnorm(hidden)]
    bf16_t* mh = nullptr;      // [T_max][H] the mtp's final-normed hidden rows
    bf16_t* row = nullptr;     // [H] the draft chain's hidden row
    float* dlog = nullptr;     // [vocab] proposal logits (logits row DEC_COLS - 1: never a verify row)
    int* blk = nullptr;        // device [SPEC_BLK_INTS]: accepted count c, tokens of columns 0..c, the next drafts
    StepPtrs re, ds;           // the realignment's inputs [DEC_COLS]; the draft steps' (column j: draft step j + 1)
    int* amax = nullptr;       // the proposal head's argmax
    int* done = nullptr;       // the device's speculative sampling: the round ended (SpecDraw)
    int* h_blk = nullptr;      // pinned [SPEC_BLK_INTS + 2 * 8 * DEC_COLS]: the result block, then staging for re / ds
    cudaEvent_t staged = nullptr;  // the last copy out of h_blk's staging has run
    float* h_logits = nullptr; // pinned [SPEC_COLS][vocab]: the verify rows, for the host's speculative sampling
    cudaGraphExec_t verify[GPU_MAX_BUCKETS] = {}, draft[GPU_MAX_BUCKETS] = {};  // a K+1-column round, per bucket
    DraftHook hook = nullptr; void* hook_ctx = nullptr;  // test hook (generate_spec_cpu's): replaces drafts on the host
};

struct GpuEngine {
    const Model* m = nullptr;
    GpuOpts o;
    int device = 0;
    cudaStream_t stream = nullptr;
    int capacity = 0;   // kv rows = the sequence's capacity
    int T_max = 0;      // tokens per forward call
    int logit_rows = 0; // rows of fp32 logits the workspace holds
    int domain = 0;     // sampled ids [0, domain)
    int pos = 0, rope_delta = 0, slot = 0;  // the sequence: tokens in it, m-rope offset, live gdn slot
    // lanes (the header): the current lane, its slot group [slot0, slot0 + lane_slots), the
    // gdn slots in all (lanes' groups, the trash slot, then the shared snapshots from
    // shared_slot0), the pool's rows (kv_rows = capacity with one lane), its free pages
    int lane = 0, slot0 = 0, lane_slots = 0, n_slots = 0, trash_slot = -1, shared_slot0 = 0;
    int64_t kv_rows = 0;
    int max_pages = 0;                    // pages of a full sequence (capacity rows)
    std::vector<GpuLane> lanes;           // [o.lanes] (empty with one lane)
    std::vector<int> free_pages;
    int* d_pages = nullptr;               // the current lane's page table [max_pages] (lanes; null: identity)
    int* d_lin = nullptr;                 // lanes step inputs (device): StepPtrs of LANES_MAX columns
    int* h_lin = nullptr;                 // its pinned mirror
    size_t lin_ints = 0;
    StepPtrs lin;
    float* h_lane_logits = nullptr;       // pinned [LANES_MAX][vocab]: rows a lanes step copies out
    // the lanes' draws (GpuTuning::lane_draw): each lane's sampler on the device, a step's draws
    std::vector<SampleScratch> lane_smp;  // [o.lanes] (empty: the host samples every sampled lane)
    uint8_t* lane_smp_mem = nullptr;
    LaneDrawIn* d_draw = nullptr;         // a step's draws on the device, and its pinned mirror
    LaneDrawIn* h_draw = nullptr;
    cudaGraphExec_t lane_graph[LANE_BUCKETS][GPU_MAX_BUCKETS] = {};
    // weights
    uint8_t* arena = nullptr; size_t arena_bytes = 0;
    Weights w;          // device views
    struct Span { const uint8_t* host; uint64_t bytes; uint64_t off; };
    std::vector<Span> spans;
    // sequence state
    uint8_t* state = nullptr; size_t state_bytes = 0, gdn_state_off = 0;
    void* kc[MAX_LAYERS] = {}; void* vc[MAX_LAYERS] = {};
    __half* ksc[MAX_LAYERS] = {}; __half* vsc[MAX_LAYERS] = {};
    bf16_t* conv[MAX_LAYERS] = {}; float* rec[MAX_LAYERS] = {};
    int64_t conv_slot = 0, rec_slot = 0;  // elements per slot
    // workspace
    uint8_t* work = nullptr; size_t work_bytes = 0;
    bf16_t *x = nullptr, *xb = nullptr, *qk = nullptr, *gv = nullptr, *att = nullptr, *u = nullptr;
    bf16_t *pab = nullptr, *cy = nullptr, *core = nullptr, *gn = nullptr, *gu = nullptr, *hb = nullptr, *ovr = nullptr;
    Mat ab[MAX_LAYERS];            // gdn layers: a_proj and b_proj as one [2Hv, H] view when adjacent in the arena
    float *qn = nullptr, *kn = nullptr, *beta = nullptr, *gg = nullptr, *logits = nullptr, *attn_scr = nullptr;
    float* gdn_scr = nullptr;      // chunked delta rule scratch of one prefill piece (T', P, Gamma per chunk and head)
    void* amax_scr = nullptr;
    int n_splits_max = 0;
    float* last_logits = nullptr;  // the row of the last token of the last forward call
    StepPtrs pre, dec;             // prefill inputs [T_max], decode inputs [DEC_COLS] (the graphs read dec)
    int* h_in[2] = {};             // pinned mirrors of the input block, used in turn
    cudaEvent_t in_done[2] = {};   // the copies out of each mirror have run
    int in_cur = 0;
    int* d_in = nullptr;           // device input block: pre | dec
    size_t in_ints = 0, dec_off = 0;
    float* h_logits = nullptr;     // pinned [vocab]
    int* h_out = nullptr;          // pinned [DEC_COLS]
    uint32_t* h_mask = nullptr;    // pinned [ceil(domain / 32)] a constraint's mask, and its device copy
    uint32_t* d_mask = nullptr;
    cudaEvent_t tok_ready = nullptr;  // the picked id has reached h_out (generate_gpu)
    cudaGraphExec_t graph[GPU_MAX_BUCKETS] = {};
    bool graph_used = false;
    cudaStream_t side = nullptr;          // a second stream: independent products run beside the main chain
    cudaEvent_t fork_ev = nullptr, join_ev = nullptr;
    // the sampler on the device (section 7's sampling): counts, bias table and scratch in one
    // allocation; smp_bound is the Sampler whose counts and bias table it holds (gpu_sampler_bind)
    uint8_t* smp_mem = nullptr;
    SampleScratch smp;
    const Sampler* smp_bound = nullptr;
    GpuMtp mtp;                           // --spec mtp
};

// run `side_work` on e->side concurrently with what the caller launches next on e->stream;
// gpu_join makes e->stream wait for it. inside a capture this forks and joins graph branches.
template <typename F>
static void gpu_fork(GpuEngine* e, F side_work) {
    if (!e->o.tune.fork) { side_work(e->stream); return; }
    cudaCheck(cudaEventRecord(e->fork_ev, e->stream));
    cudaCheck(cudaStreamWaitEvent(e->side, e->fork_ev, 0));
    side_work(e->side);
    cudaCheck(cudaEventRecord(e->join_ev, e->side));
}
static void gpu_join(GpuEngine* e) {
    if (e->o.tune.fork) cudaCheck(cudaStreamWaitEvent(e->stream, e->join_ev, 0));
}

// ---- loading --------------------------------------------------------------------------------

// does this tensor become resident? the text model; the mtp module with --spec mtp, the draft
// head with --lm-head-draft (the vision tower has its own arena: GpuVision)
static bool gpu_needs_tensor(const std::string& name, const SpecOpts& spec) {
    if (spec.K && name.rfind("mtp/", 0) == 0) return true;
    if (name.rfind("text/", 0) != 0) return false;
    if (name.rfind("text/draft_head", 0) == 0) return spec.K && spec.lm_head_draft;
    return true;
}

// a pointer into the mapping -> the same byte of the tensor's device copy
static const uint8_t* gpu_rebase(const GpuEngine* e, const uint8_t* p) {
    if (!p) return nullptr;
    size_t lo = 0, hi = e->spans.size();
    while (hi - lo > 1) { size_t mid = (lo + hi) / 2; if (e->spans[mid].host <= p) lo = mid; else hi = mid; }
    const GpuEngine::Span& s = e->spans[lo];
    CHECK(p >= s.host && p <= s.host + s.bytes, "gpu_rebase: a weight view points outside the resident tensors");
    return e->arena + s.off + (p - s.host);
}
static void gpu_rebase_mat(const GpuEngine* e, Mat* m) {
    m->base = gpu_rebase(e, m->base); m->high = gpu_rebase(e, m->high); m->scale = gpu_rebase(e, m->scale);
}
static void gpu_rebase_vec(const GpuEngine* e, Vec* v) { v->p = gpu_rebase(e, v->p); }

// the gpu kernels read norms as bf16 and the deltanet's a_log / dt_bias as fp32 (what
// convert.py writes); anything else is a file this build cannot run on the gpu
static bool gpu_check_formats(const Model* m, const SpecOpts& spec, std::string* err) {
    auto bad = [&](const char* what, NumFormat f, const char* want) {
        *err = m->art.path + ": " + what + " is " + format_name(f) + "; the gpu path needs " + want; return false; };
    const Weights& w = m->w;
    if (w.final_norm.format != FMT_BF16) return bad("text/final_norm", w.final_norm.format, "BF16");
    if (spec.K) {
        const MtpWeights& mw = w.mtp;
        for (const Vec* v : {&mw.embedding_norm, &mw.hidden_norm, &mw.final_norm, &mw.layer.input_norm, &mw.layer.post_norm,
                             &mw.layer.attn.query_norm, &mw.layer.attn.key_norm})
            if (v->format != FMT_BF16) return bad("an mtp norm", v->format, "BF16");
    }
    for (const LayerWeights& l : w.layers) {
        if (l.input_norm.format != FMT_BF16 || l.post_norm.format != FMT_BF16) return bad("a layer norm", l.input_norm.format, "BF16");
        if (l.full) {
            if (l.attn.query_norm.format != FMT_BF16 || l.attn.key_norm.format != FMT_BF16) return bad("a q/k norm", l.attn.query_norm.format, "BF16");
        } else {
            if (l.gdn.norm.format != FMT_BF16) return bad("a gdn norm", l.gdn.norm.format, "BF16");
            if (l.gdn.a_log.format != FMT_FP32 || l.gdn.dt_bias.format != FMT_FP32) return bad("a gdn a_log / dt_bias", l.gdn.a_log.format, "FP32");
        }
    }
    return true;
}

static double gib(double b) { return b / (1024.0 * 1024.0 * 1024.0); }

// copy the resident tensors into the arena (allocated by the caller, laid out by e->spans)
static void gpu_upload_weights(GpuEngine* e) {
    const size_t STAGE = 64ull << 20;
    uint8_t* stage[2];
    cudaEvent_t done[2];
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaHostAlloc((void**)&stage[i], STAGE, cudaHostAllocDefault));
        cudaCheck(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming));
        cudaCheck(cudaEventRecord(done[i], e->stream));
    }
    const bool bar = !e->o.quiet && isatty(2);
    double t0 = now_s();
    uint64_t total = 0, sent = 0, shown = 0;
    for (const auto& s : e->spans) total += s.bytes;
    int b = 0;
    for (const auto& s : e->spans) {
        for (uint64_t off = 0; off < s.bytes; off += STAGE) {
            size_t n = (size_t)std::min<uint64_t>(STAGE, s.bytes - off);
            cudaCheck(cudaEventSynchronize(done[b]));  // the buffer's previous copy is done
            memcpy(stage[b], s.host + off, n);
            cudaCheck(cudaMemcpyAsync(e->arena + s.off + off, stage[b], n, cudaMemcpyHostToDevice, e->stream));
            cudaCheck(cudaEventRecord(done[b], e->stream));
            b ^= 1;
            sent += n;
            if (bar && (sent - shown > (total >> 6) || sent == total)) {
                shown = sent;
                int pct = (int)(100.0 * sent / std::max<uint64_t>(total, 1)), w = pct / 4;
                fprintf(stderr, "\rninfer: loading weights [%.*s%*s] %3d%% %.2f / %.2f GiB", w, "#########################", 25 - w, "", pct,
                        gib(sent), gib(total));
            }
        }
    }
    cudaCheck(cudaStreamSynchronize(e->stream));
    if (bar) fprintf(stderr, "\n");
    double dt = now_s() - t0;
    if (!e->o.quiet) {
        cudaDeviceProp prop;
        cudaCheck(cudaGetDeviceProperties(&prop, e->device));
        fprintf(stderr, "ninfer: %.2f GiB of weights on gpu %d (%s) in %.2f s (%.1f GiB/s)\n", gib(total), e->device, prop.name, dt, gib(total) / std::max(dt, 1e-9));
    }
    for (int i = 0; i < 2; i++) { cudaCheck(cudaEventDestroy(done[i])); cudaCheck(cudaFreeHost(stage[i])); }
}

// ---- sizes ------------------------------------------------------------------------------------

static size_t gpu_kv_bytes_per_row(const Geometry& g, int kv) {  // one kv row of every full layer
    size_t per = (size_t)g.Hkv * ATT_HD * kv_elem_bytes(kv) + (kv == KV_BF16 ? 0 : (size_t)g.Hkv * KV_GROUPS * 2);
    return 2 * per * g.n_full;
}
static size_t gpu_gdn_bytes(const Geometry& g, int slots) {
    return (size_t)g.n_gdn * slots * ((size_t)3 * g.conv_dim * 2 + (size_t)g.Hv * g.dk * g.dv * 4);
}

// attention split plan of a decode bucket: keys per split a multiple of ATT_KEYS, at least
// min_keys, about `target` splits of the bucket's length (GpuTuning::attn_splits, attn_min_keys)
static int gpu_bucket_of(int len) { int b = 0; while (((int64_t)GPU_BUCKET0 << b) < len) b++; return b; }
static void gpu_attn_plan(int bucket, int* n_splits, int* split_keys, int target = GPU_ATT_SPLITS, int min_keys = GPU_ATT_MIN_KEYS) {
    int64_t len = (int64_t)GPU_BUCKET0 << bucket;
    int64_t sk = std::max<int64_t>(min_keys, CEIL_DIV(len, (int64_t)target));
    sk = CEIL_DIV(sk, (int64_t)ATT_KEYS) * ATT_KEYS;
    *split_keys = (int)sk;
    *n_splits = (int)CEIL_DIV(len, sk);
}

// the workspace layout; with base == nullptr it only sizes (returns bytes)
static size_t gpu_work_layout(GpuEngine* e, uint8_t* base) {
    const Geometry& g = e->m->geo;
    size_t off = 0;
    auto take = [&](size_t bytes) -> uint8_t* { off = align_up(off, 256); uint8_t* p = base ? base + off : nullptr; off += bytes; return p; };
    const size_t T = e->T_max, qkd = (size_t)(g.Hq + g.Hkv) * g.head_dim, kd = (size_t)g.Hk * g.dk, vd = (size_t)g.Hv * g.dv;
    e->x = (bf16_t*)take(T * g.H * 2);
    e->xb = (bf16_t*)take(T * g.H * 2);
    e->ovr = (bf16_t*)take(T * g.H * 2);
    e->qk = (bf16_t*)take(T * qkd * 2);
    e->gv = (bf16_t*)take(T * qkd * 2);
    e->att = (bf16_t*)take(T * g.Hq * g.head_dim * 2);
    e->u = (bf16_t*)take(T * (g.conv_dim + vd) * 2);  // [q | k | v | z]: the conv input, then the output gate
    e->cy = (bf16_t*)take(T * g.conv_dim * 2);
    e->pab = (bf16_t*)take(T * 2 * g.Hv * 2);            // [a | b] gate projections
    e->core = (bf16_t*)take(T * vd * 2);
    e->gn = (bf16_t*)take(T * vd * 2);
    e->gu = (bf16_t*)take(T * 2 * g.I * 2);
    e->hb = (bf16_t*)take(T * g.I * 2);
    e->qn = (float*)take(T * kd * 4);
    e->kn = (float*)take(T * kd * 4);
    e->beta = (float*)take(T * g.Hv * 4);
    e->gg = (float*)take(T * g.Hv * 4);
    e->gdn_scr = (float*)take(gdn_chunked_scratch_floats((int)T, g.Hv) * 4);
    e->logits = (float*)take((size_t)e->logit_rows * g.vocab * 4);
    e->attn_scr = (float*)take(std::max(attn_scratch_floats(g.Hq, g.Hkv, e->n_splits_max),
                                        e->o.lanes > 1 ? attn_scratch_floats(g.Hq, g.Hkv, e->n_splits_max, LANES_MAX) : 0) * 4);
    e->amax_scr = take(argmax_scratch_bytes(e->o.lanes > 1 ? (int)LANES_MAX : (int)DEC_COLS));
    if (e->o.spec.K) {
        GpuMtp& mt = e->mtp;
        mt.hid = (bf16_t*)take(T * g.H * 2);
        mt.in = (bf16_t*)take(T * 2 * g.H * 2);
        mt.mh = (bf16_t*)take(T * g.H * 2);
        mt.row = (bf16_t*)take((size_t)g.H * 2);
        mt.bridges = (bf16_t*)take((size_t)std::max(1, e->o.lanes) * g.H * 2);
        mt.bridge = mt.bridges;
        mt.blk = (int*)take((SPEC_BLK_INTS + 2 * 8 * DEC_COLS + 2) * 4);
    }
    return align_up(off, 256);
}

// ---- build / free -------------------------------------------------------------------------------

static void gpu_free(GpuEngine* e) {
    if (!e) return;
    for (auto& gx : e->graph) if (gx) cudaGraphExecDestroy(gx);
    for (auto& gx : e->mtp.verify) if (gx) cudaGraphExecDestroy(gx);
    for (auto& gx : e->mtp.draft) if (gx) cudaGraphExecDestroy(gx);
    if (e->mtp.h_blk) cudaFreeHost(e->mtp.h_blk);
    if (e->mtp.h_logits) cudaFreeHost(e->mtp.h_logits);
    if (e->mtp.staged) cudaEventDestroy(e->mtp.staged);
    if (e->arena) cudaFree(e->arena);
    if (e->state) cudaFree(e->state);
    if (e->work) cudaFree(e->work);
    if (e->d_in) cudaFree(e->d_in);
    if (e->d_pages) cudaFree(e->d_pages);
    if (e->d_lin) cudaFree(e->d_lin);
    if (e->h_lin) cudaFreeHost(e->h_lin);
    if (e->h_lane_logits) cudaFreeHost(e->h_lane_logits);
    for (auto& row : e->lane_graph) for (auto& gx : row) if (gx) cudaGraphExecDestroy(gx);
    for (int i = 0; i < 2; i++) {
        if (e->h_in[i]) cudaFreeHost(e->h_in[i]);
        if (e->in_done[i]) cudaEventDestroy(e->in_done[i]);
    }
    if (e->h_logits) cudaFreeHost(e->h_logits);
    if (e->h_out) cudaFreeHost(e->h_out);
    if (e->h_mask) cudaFreeHost(e->h_mask);
    if (e->d_mask) cudaFree(e->d_mask);
    if (e->tok_ready) cudaEventDestroy(e->tok_ready);
    if (e->smp_mem) cudaFree(e->smp_mem);
    if (e->lane_smp_mem) cudaFree(e->lane_smp_mem);
    if (e->d_draw) cudaFree(e->d_draw);
    if (e->h_draw) cudaFreeHost(e->h_draw);
    if (e->fork_ev) cudaEventDestroy(e->fork_ev);
    if (e->join_ev) cudaEventDestroy(e->join_ev);
    if (e->side) { gemv_xp_release(e->side); cudaStreamDestroy(e->side); }
    if (e->stream) { gemv_xp_release(e->stream); cudaStreamDestroy(e->stream); }
    delete e;
}

// forget the sequence: position 0, zero deltanet states in every slot (kv rows are position-
// addressed and overwritten). lanes: every lane, each back at its group's first slot with no
// pages, lane 0 current
static void gpu_reset(GpuEngine* e) {
    cudaCheck(cudaMemsetAsync(e->state + e->gdn_state_off, 0, e->state_bytes - e->gdn_state_off, e->stream));
    e->pos = 0; e->rope_delta = 0; e->slot = 0; e->mtp.pos = 0; e->lane = 0; e->slot0 = 0;
    e->last_logits = nullptr;
    if (e->o.lanes > 1) {
        e->lanes.assign(e->o.lanes, GpuLane());
        for (int l = 0; l < e->o.lanes; l++) e->lanes[l].slot = l * e->lane_slots;
        e->free_pages.clear();
        for (int p = (int)(e->kv_rows / KV_PAGE) - 1; p >= 0; p--) e->free_pages.push_back(p);
    }
}

// the arena's layout: resident tensors in file order at 256-byte alignment (e->spans)
static void gpu_arena_layout(GpuEngine* e) {
    uint64_t off = 0;
    for (const TensorObject& t : e->m->art.objects) {
        if (t.resource || !gpu_needs_tensor(t.name, e->o.spec)) continue;
        off = align_up(off, 256);
        e->spans.push_back({t.data, t.bytes, off});
        off += t.bytes;
    }
    e->arena_bytes = align_up(off, 256);
}

// the sizes of the sequence state and the workspace: the kv capacity (--kv-capacity auto: what
// fits), T_max, work_bytes, state_bytes. false with a one-line *err when they do not fit.
static bool gpu_size_state(GpuEngine* e, std::string* err) {
    const Geometry& g = e->m->geo;
    const size_t headroom = 256ull << 20;  // cuda context growth, graphs, library scratch
    const size_t xp = 2 * gemv_xp_buf_bytes();  // the main and side streams' prepared x (gpu_build reserves them)
    SampleScratch sz;
    const size_t draws = e->o.lanes > 1 && e->o.tune.lane_draw ? e->o.lanes * sample_layout(&sz, nullptr, g.vocab, false) : 0;  // the lanes' samplers
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    const GpuOpts& o = e->o;
    const size_t kv_row = gpu_kv_bytes_per_row(g, o.kv) * (g.n_full + (o.spec.K ? 1 : 0)) / g.n_full, gdn = gpu_gdn_bytes(g, e->n_slots);
    const bool lanes = o.lanes > 1;
    const int min_cols = lanes ? LANES_MAX : 1;  // a lanes step is one forward call of up to LANES_MAX columns
    e->T_max = std::max(min_cols, o.prefill_chunk);
    e->logit_rows = std::max<int>(lanes ? (int)LANES_MAX : (int)DEC_COLS, (int)std::min<int64_t>(e->T_max, (256ll << 20) / ((int64_t)g.vocab * 4)));
    // one lane: the sequence's rows are the cache's. lanes: a sequence holds up to
    // --max-context rows of the pool (--kv-capacity, NInfer's default --max-context, at least a
    // page a lane), which all lanes share
    int rows = o.kv_capacity > 0 ? o.kv_capacity : o.max_context;
    auto work_for = [&](int cap) {
        int b, ns, sk;
        b = gpu_bucket_of(cap); gpu_attn_plan(b, &ns, &sk, o.tune.attn_splits, o.tune.attn_min_keys);
        e->n_splits_max = ns;
        int tm = e->T_max; e->T_max = std::min(tm, std::max(cap, min_cols));  // as below
        size_t w = gpu_work_layout(e, nullptr);
        e->T_max = tm;
        return w;
    };
    if (o.kv_capacity < 0) {  // auto: the most rows (multiples of 64) that fit with 1 GiB to spare
        size_t fixed = e->arena_bytes + gdn + work_for(o.max_context) + xp + draws + headroom + (1ull << 30);
        if (fixed >= free_b) rows = o.max_context;
        else rows = (int)std::min<int64_t>(std::max<int64_t>(o.max_context, (int64_t)((free_b - fixed) / kv_row) / 64 * 64), INT32_MAX / 2);
    }
    if (lanes) rows = (int)std::min<int64_t>(std::max<int64_t>(CEIL_DIV((int64_t)rows, (int64_t)KV_PAGE), o.lanes) * KV_PAGE, INT32_MAX / 2 / KV_PAGE * KV_PAGE);
    e->kv_rows = rows;
    e->capacity = lanes ? o.max_context : rows;
    e->max_pages = (int)CEIL_DIV(e->capacity, KV_PAGE);
    e->T_max = std::min(e->T_max, std::max(e->capacity, min_cols));
    e->work_bytes = work_for(e->capacity);
    e->state_bytes = align_up((size_t)e->kv_rows * kv_row + (size_t)(g.n_full + 1) * 4 * 256 + 256, 256) + gdn + (size_t)g.n_gdn * 2 * 256;
    size_t need = e->arena_bytes + e->state_bytes + e->work_bytes + xp + draws + headroom;
    if (need > free_b) {
        char buf[512];
        snprintf(buf, sizeof buf,
                 "not enough gpu memory on device %d: need %.2f GiB (weights %.2f, kv cache %.2f for %d tokens of %s, deltanet state %.2f, "
                 "workspace %.2f for --prefill-chunk %d and %.2f for the wide products' x and the lanes' samplers), %.2f GiB free of %.2f; lower --max-context / "
                 "--kv-capacity, use --kv-dtype int8 or fp8, or a smaller --prefill-chunk",
                 o.device, gib(need), gib(e->arena_bytes), gib((double)e->kv_rows * kv_row), (int)e->kv_rows, kv_dtype_name(o.kv), gib(gdn),
                 gib(e->work_bytes), e->T_max, gib(xp + draws), gib(free_b), gib(total_b));
        *err = buf;
        return false;
    }
    return true;
}

// the cpu Weights views rebased onto the arena (text only), and the fused a/b product
static void gpu_device_views(GpuEngine* e) {
    const Geometry& g = e->m->geo;
    e->w = e->m->w;
    e->w.vision = VisionWeights();
    if (!e->o.spec.K) e->w.mtp = MtpWeights();
    if (!e->o.spec.K || !e->o.spec.lm_head_draft) { e->w.draft_head = Mat(); e->w.draft_ids = nullptr; }
    if (e->o.spec.K) {
        MtpWeights& mw = e->w.mtp;
        gpu_rebase_mat(e, &mw.input_projection); gpu_rebase_vec(e, &mw.embedding_norm); gpu_rebase_vec(e, &mw.hidden_norm);
        gpu_rebase_vec(e, &mw.final_norm);
        LayerWeights& l = mw.layer;
        gpu_rebase_vec(e, &l.input_norm); gpu_rebase_vec(e, &l.post_norm); gpu_rebase_mat(e, &l.gate_up); gpu_rebase_mat(e, &l.down);
        gpu_rebase_mat(e, &l.attn.query_key); gpu_rebase_mat(e, &l.attn.gate_value); gpu_rebase_mat(e, &l.attn.output);
        gpu_rebase_vec(e, &l.attn.query_norm); gpu_rebase_vec(e, &l.attn.key_norm);
        if (e->o.spec.lm_head_draft) {
            gpu_rebase_mat(e, &e->w.draft_head);
            e->mtp.draft_ids = (const int32_t*)gpu_rebase(e, (const uint8_t*)e->w.draft_ids);
            e->w.draft_ids = nullptr;  // a device pointer: the host never reads it
        }
    }
    gpu_rebase_mat(e, &e->w.token_embedding);
    gpu_rebase_mat(e, &e->w.output_head);
    gpu_rebase_vec(e, &e->w.final_norm);
    for (LayerWeights& l : e->w.layers) {
        gpu_rebase_vec(e, &l.input_norm); gpu_rebase_vec(e, &l.post_norm);
        gpu_rebase_mat(e, &l.gate_up); gpu_rebase_mat(e, &l.down);
        if (l.full) {
            gpu_rebase_mat(e, &l.attn.query_key); gpu_rebase_mat(e, &l.attn.gate_value); gpu_rebase_mat(e, &l.attn.output);
            gpu_rebase_vec(e, &l.attn.query_norm); gpu_rebase_vec(e, &l.attn.key_norm);
        } else {
            GdnWeights& d = l.gdn;
            gpu_rebase_vec(e, &d.a_log); gpu_rebase_vec(e, &d.dt_bias); gpu_rebase_vec(e, &d.convolution); gpu_rebase_vec(e, &d.norm);
            gpu_rebase_mat(e, &d.a_proj); gpu_rebase_mat(e, &d.b_proj); gpu_rebase_mat(e, &d.query_key);
            gpu_rebase_mat(e, &d.value_z); gpu_rebase_mat(e, &d.output);
        }
    }
    // a_proj and b_proj are consecutive in the file and (bf16, 256-byte multiples) in the arena:
    // one product over both when the second starts where the first ends
    for (int l = 0; l < g.L; l++) {
        if (g.full[l]) continue;
        const Mat& a = e->w.layers[l].gdn.a_proj; const Mat& b = e->w.layers[l].gdn.b_proj;
        if (a.format == b.format && a.format == FMT_BF16 && a.cols == b.cols && b.base == a.base + a.rows * a.base_row) {
            e->ab[l] = a; e->ab[l].rows = a.rows + b.rows;
        }
    }

}

// the sequence state's layout: kv planes per full-attention layer, then the deltanet slots
// (zeroed by gpu_reset)
static void gpu_state_layout(GpuEngine* e) {
    const Geometry& g = e->m->geo;
    const GpuOpts& o = e->o;
    size_t so = 0;
    auto take = [&](size_t bytes) { so = align_up(so, 256); uint8_t* p = e->state + so; so += bytes; return p; };
    const size_t plane = (size_t)g.Hkv * e->kv_rows * ATT_HD * kv_elem_bytes(o.kv);
    const size_t splane = (size_t)g.Hkv * e->kv_rows * KV_GROUPS * 2;
    for (int l = 0; l < g.L; l++) {
        if (!g.full[l]) continue;
        e->kc[l] = take(plane); e->vc[l] = take(plane);
        if (o.kv != KV_BF16) { e->ksc[l] = (__half*)take(splane); e->vsc[l] = (__half*)take(splane); }
    }
    if (o.spec.K) {
        KvCache& c = e->mtp.kv;
        c.kv = o.kv; c.cap = e->kv_rows; c.kc = take(plane); c.vc = take(plane);
        if (o.kv != KV_BF16) { c.ksc = (__half*)take(splane); c.vsc = (__half*)take(splane); }
    }
    so = align_up(so, 256);
    e->gdn_state_off = so;
    e->conv_slot = (int64_t)3 * g.conv_dim;
    e->rec_slot = (int64_t)g.Hv * g.dk * g.dv;
    for (int l = 0; l < g.L; l++) {
        if (g.full[l]) continue;
        e->conv[l] = (bf16_t*)take((size_t)e->n_slots * e->conv_slot * 2);
        e->rec[l] = (float*)take((size_t)e->n_slots * e->rec_slot * 4);
    }
    CHECK(so <= e->state_bytes, "state layout %zu > %zu", so, e->state_bytes);
    cudaCheck(cudaMemsetAsync(e->state, 0, e->state_bytes, e->stream));  // no nan in never-written kv rows

}

// the step inputs: prefill [T_max] then decode [DEC_COLS], each ids | pos3 | kvpos | slots |
// out, on the device and in two pinned host mirrors; the pinned logits row and picked ids
static void gpu_steps_alloc(GpuEngine* e) {
    const Geometry& g = e->m->geo;
    auto per = [](size_t T) { return T + 3 * T + T + 2 * T + T; };
    e->in_ints = per(e->T_max) + per(DEC_COLS);
    e->dec_off = per(e->T_max);
    cudaCheck(cudaMalloc(&e->d_in, e->in_ints * sizeof(int)));
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaHostAlloc((void**)&e->h_in[i], e->in_ints * sizeof(int), cudaHostAllocDefault));
        cudaCheck(cudaEventCreateWithFlags(&e->in_done[i], cudaEventDisableTiming));
        cudaCheck(cudaEventRecord(e->in_done[i], e->stream));
    }
    auto ptrs = [](int* b, size_t T) { StepPtrs p; p.ids = b; p.pos3 = b + T; p.kvpos = b + 4 * T; p.slots = b + 5 * T; p.out = b + 7 * T; return p; };
    e->pre = ptrs(e->d_in, e->T_max);
    e->dec = ptrs(e->d_in + e->dec_off, DEC_COLS);
    cudaCheck(cudaHostAlloc((void**)&e->h_logits, (size_t)g.vocab * 4, cudaHostAllocDefault));
    cudaCheck(cudaHostAlloc((void**)&e->h_out, DEC_COLS * sizeof(int), cudaHostAllocDefault));
    cudaCheck(cudaHostAlloc((void**)&e->h_mask, (size_t)CEIL_DIV(g.vocab, 32) * 4, cudaHostAllocDefault));
    cudaCheck(cudaMalloc(&e->d_mask, (size_t)CEIL_DIV(g.vocab, 32) * 4));
    cudaCheck(cudaEventCreateWithFlags(&e->tok_ready, cudaEventDisableTiming));
    if (e->o.spec.K) {
        GpuMtp& mt = e->mtp;
        mt.K = e->o.spec.K; mt.draft_head = e->o.spec.lm_head_draft;
        mt.re = ptrs(mt.blk + SPEC_BLK_INTS, DEC_COLS);
        mt.ds = ptrs(mt.blk + SPEC_BLK_INTS + 8 * DEC_COLS, DEC_COLS);
        mt.amax = mt.blk + SPEC_BLK_INTS + 16 * DEC_COLS;
        mt.done = mt.amax + 1;
        mt.dlog = e->logits + (size_t)(DEC_COLS - 1) * g.vocab;
        cudaCheck(cudaHostAlloc((void**)&mt.h_blk, (SPEC_BLK_INTS + 16 * DEC_COLS) * sizeof(int), cudaHostAllocDefault));
        cudaCheck(cudaHostAlloc((void**)&mt.h_logits, (size_t)SPEC_COLS * g.vocab * 4, cudaHostAllocDefault));
        cudaCheck(cudaEventCreateWithFlags(&mt.staged, cudaEventDisableTiming));
        cudaCheck(cudaEventRecord(mt.staged, e->stream));
        cudaCheck(cudaMemsetAsync(mt.blk, 0, (SPEC_BLK_INTS + 16 * DEC_COLS + 2) * sizeof(int), e->stream));
    }
    if (e->o.lanes > 1) {  // the current lane's page table; a lanes step's inputs [LANES_MAX] with every column's table
        const size_t B = LANES_MAX;
        cudaCheck(cudaMalloc(&e->d_pages, (size_t)e->max_pages * sizeof(int)));
        cudaCheck(cudaMemsetAsync(e->d_pages, 0, (size_t)e->max_pages * sizeof(int), e->stream));
        e->mtp.kv.pages = e->d_pages;
        e->lin_ints = 9 * B + B * e->max_pages;
        cudaCheck(cudaMalloc(&e->d_lin, e->lin_ints * sizeof(int)));
        cudaCheck(cudaHostAlloc((void**)&e->h_lin, e->lin_ints * sizeof(int), cudaHostAllocDefault));
        StepPtrs& p = e->lin;
        int* d = e->d_lin;
        p.ids = d; p.pos3 = d + B; p.kvpos = d + 4 * B; p.slots = d + 5 * B; p.out = d + 7 * B; p.skeys = d + 8 * B; p.pages = d + 9 * B;
        p.page_ld = e->max_pages;
        cudaCheck(cudaHostAlloc((void**)&e->h_lane_logits, (size_t)e->o.lanes * g.vocab * 4, cudaHostAllocDefault));
    }
}

// the device sampler: ~4.5 MB for a 248k domain, inside the workspace headroom
static void gpu_sampler_alloc(GpuEngine* e) {
    cudaCheck(cudaMalloc(&e->smp_mem, sample_layout(&e->smp, nullptr, e->domain)));
    sample_layout(&e->smp, e->smp_mem, e->domain);
    if (e->o.lanes > 1 && e->o.tune.lane_draw) {
        SampleScratch sz;
        const size_t one = sample_layout(&sz, nullptr, e->domain, false);
        cudaCheck(cudaMalloc(&e->lane_smp_mem, one * e->o.lanes));
        e->lane_smp.resize(e->o.lanes);
        for (int l = 0; l < e->o.lanes; l++) sample_layout(&e->lane_smp[l], e->lane_smp_mem + one * l, e->domain, false);
        cudaCheck(cudaMalloc(&e->d_draw, sizeof(LaneDrawIn)));
        cudaCheck(cudaHostAlloc((void**)&e->h_draw, sizeof(LaneDrawIn), cudaHostAllocDefault));
    }
}

// one model on one gpu with one sequence of o.max_context tokens. on a user-facing failure
// (no such device, not enough memory, a format the kernels cannot read) returns null with a
// one-line *err.
static GpuEngine* gpu_build(const Model* m, const GpuOpts& o, std::string* err) {
    int ndev = gpu_count();
    if (ndev == 0) { *err = "no cuda device"; return nullptr; }
    if (o.device < 0 || o.device >= ndev) { *err = "--device " + std::to_string(o.device) + ": there are " + std::to_string(ndev) + " cuda device(s)"; return nullptr; }
    if (!gpu_check_formats(m, o.spec, err)) return nullptr;
    if (o.spec.K && o.gdn_slots < o.spec.K + 1) { *err = "--spec mtp needs K+1 deltanet slots"; return nullptr; }
    if (o.lanes < 1 || o.lanes > LANES_MAX) { *err = "--max-concurrency " + std::to_string(o.lanes) + ": the gpu batches 1 to " + std::to_string((int)LANES_MAX) + " lanes"; return nullptr; }
    if (o.kv_capacity > 0 && o.kv_capacity < o.max_context) {
        *err = "--kv-capacity " + std::to_string(o.kv_capacity) + " is smaller than --max-context " + std::to_string(o.max_context) + " (one sequence holds max-context rows)";
        return nullptr;
    }
    CHECK(o.gdn_slots >= GPU_LIVE_SLOTS, "%d gdn slots: the live pair needs %d", o.gdn_slots, (int)GPU_LIVE_SLOTS);
    cudaCheck(cudaSetDevice(o.device));
    gpu_kernels_init(o.tune.pdl, o.tune.wgmma);
    g_gemv_occ_rows = o.tune.gemv_occ_rows;
    GpuEngine* e = new GpuEngine();
    e->m = m; e->o = o; e->device = o.device;
    cudaCheck(cudaStreamCreateWithFlags(&e->stream, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreateWithFlags(&e->side, cudaStreamNonBlocking));
    gemv_xp_reserve(e->stream); gemv_xp_reserve(e->side);
    cudaCheck(cudaEventCreateWithFlags(&e->fork_ev, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&e->join_ev, cudaEventDisableTiming));
    FrontendIds fr;
    if (!frontend_ids(m, &fr, err)) { gpu_free(e); return nullptr; }
    e->domain = fr.domain;
    // gdn slots: each lane's group, the trash slot of a lanes step's padding columns, then the
    // shared snapshots (what o.gdn_slots has past one lane's group)
    e->lane_slots = std::max<int>(GPU_LIVE_SLOTS, o.spec.K + 1);
    e->trash_slot = o.lanes > 1 ? o.lanes * e->lane_slots : -1;
    e->shared_slot0 = o.lanes * e->lane_slots + (o.lanes > 1 ? 1 : 0);
    e->n_slots = e->shared_slot0 + std::max(0, o.gdn_slots - e->lane_slots);
    gpu_arena_layout(e);
    if (!gpu_size_state(e, err)) { gpu_free(e); return nullptr; }
    cudaCheck(cudaMalloc(&e->arena, e->arena_bytes));
    cudaCheck(cudaMalloc(&e->state, e->state_bytes));
    cudaCheck(cudaMalloc(&e->work, e->work_bytes));
    gpu_work_layout(e, e->work);
    gpu_upload_weights(e);
    gpu_device_views(e);
    gpu_state_layout(e);
    gpu_steps_alloc(e);
    gpu_sampler_alloc(e);
    gpu_reset(e);
    cudaCheck(cudaStreamSynchronize(e->stream));
    return e;
}

// ---- the forward pass on the device --------------------------------------------------------

// what a layer makes inside its products' x staging (GemvX) instead of a separate kernel: in
// decode, where the x-staged kernel takes the products (gemv_fusable) and GpuTuning::fuse_x
struct LayerFuse {
    bool input_norm;  // the input projections read rmsnorm(x) (the deltanet a/b branch still runs the norm)
    bool post_norm;   // gate_up reads rmsnorm(x)
    bool swiglu;      // down reads swiglu(gate_up)
    bool gated;       // a deltanet layer's output reads the gated norm of its core output (the wide prep's)
};
static LayerFuse gpu_layer_fuse(const GpuEngine* e, const LayerWeights& w, int T, bool decode) {
    auto ok = [&](const Mat& m) { return decode && e->o.tune.fuse_x && gemv_fusable(m); };
    LayerFuse f;
    f.input_norm = w.full ? ok(w.attn.query_key) && ok(w.attn.gate_value) : ok(w.gdn.query_key) && ok(w.gdn.value_z);
    f.post_norm = ok(w.gate_up);
    // swiglu staged inside down's product is swiglu_kernel's math element for element, so the
    // product's bits are the same either way: fused (a launch saved; the wide kernel's prep
    // makes it once a product)
    f.swiglu = ok(w.down);
    f.gated = !w.full && e->o.tune.fuse_gated && ok(w.gdn.output) && e->m->geo.dv == GEMV_GATED_N;
    return f;
}
// the head reads rmsnorm(x) of its rows
static bool gpu_head_fuse(const GpuEngine* e, int rows, bool decode) {
    return decode && e->o.tune.fuse_x && gemv_fusable(e->w.output_head);
}
// layer l's kv cache
static KvCache gpu_kv_cache(const GpuEngine* e, int l) {
    KvCache c;
    c.kv = e->o.kv; c.kc = e->kc[l]; c.vc = e->vc[l]; c.ksc = e->ksc[l]; c.vsc = e->vsc[l]; c.cap = e->kv_rows;
    c.pages = e->d_pages;
    return c;
}

// one decoder layer on e->x [T][H]. decode: the slot map, kv rows and positions come from P
// (device); prefill: pos0 (host) is the kv row of column 0 and the live slot is e->slot.
// wo / kvo (the mtp layer): a full-attention layer's weights and kv cache in place of layer l's
static void gpu_layer(GpuEngine* e, int l, int T, const StepPtrs& P, bool decode, int pos0, int n_splits, int split_keys,
                      const LayerWeights* wo = nullptr, const KvCache* kvo = nullptr) {
    const Geometry& g = e->m->geo;
    const LayerWeights& w = wo ? *wo : e->w.layers[l];
    const GpuTuning& tu = e->o.tune;
    cudaStream_t s = e->stream;
    const int H = g.H, hd = g.head_dim;
    const bool lanes = P.skeys != nullptr;  // a lanes step: every column its own sequence, every product a gemv
    const bool gemv_only = tu.force_gemv || lanes;
    auto linear = [&](const Mat& m, const bf16_t* x, int ldx, void* y, int ldy, const bf16_t* resid, cudaStream_t st, GemvX xt = GemvX()) {
        ::linear(m, x, ldx, T, y, ldy, false, resid, resid ? ldy : 0, st, xt, gemv_only);
    };
    const LayerFuse fu = gpu_layer_fuse(e, w, T, decode);
    const bool fin = fu.input_norm;
    GemvX nin;
    if (fin) { nin.mode = GEMV_X_RMS; nin.w = (const bf16_t*)w.input_norm.p; nin.eps = g.eps; }
    // the input projections' pairs in one launch (GpuTuning::pair) where both take the gemv
    // and gemv2 takes them; else as before (attention's two on two streams)
    auto pairs = [&](const Mat& a, const Mat& b) {
        return tu.pair && !linear_on_gemm(a, T, gemv_only) && !linear_on_gemm(b, T, gemv_only) && gemv2_ok(a, b, T, nin.mode);
    };
    const bf16_t* xin = fin ? e->x : e->xb;  // what the input projections read
    if (!fin) rmsnorm(e->x, H, e->xb, H, (const bf16_t*)w.input_norm.p, H, T, 1, g.eps, false, s);
    if (w.full) {
        const int qd = g.Hq * hd, kvd = g.Hkv * hd, ld = qd + kvd;
        if (pairs(w.attn.query_key, w.attn.gate_value)) {
            gemv2(w.attn.query_key, e->qk, ld, w.attn.gate_value, e->gv, ld, xin, H, T, s, nin);
        } else {
            gpu_fork(e, [&](cudaStream_t s2) { linear(w.attn.gate_value, xin, H, e->gv, ld, nullptr, s2, nin); });
            linear(w.attn.query_key, xin, H, e->qk, ld, nullptr, s, nin);
            gpu_join(e);  // v
        }
        KvCache kv = kvo ? *kvo : gpu_kv_cache(e, l);
        if (lanes) { kv.pages = P.pages; kv.page_ld = P.page_ld; }
        AttnPrepArgs ap;
        ap.qk = e->qk; ap.ldqk = ld; ap.v = e->gv + qd; ap.ldv = ld; ap.qw = (const bf16_t*)w.attn.query_norm.p;
        ap.kw = (const bf16_t*)w.attn.key_norm.p; ap.pos3 = P.pos3; ap.kvpos = P.kvpos; ap.c = kv; ap.C = T; ap.Hq = g.Hq;
        ap.Hkv = g.Hkv; ap.rot = g.rope_dim; ap.theta = g.rope_theta; ap.sections = g.mrope_section; ap.eps = g.eps;
        attn_prep(ap, s);
        if (decode || tu.force_attn_decode) {
            AttnDecodeArgs ad;
            ad.c = kv; ad.q = e->qk; ad.ldq = ld; ad.pos = P.kvpos; ad.C = T; ad.Hq = g.Hq; ad.Hkv = g.Hkv; ad.n_splits = n_splits;
            ad.split_keys = split_keys; ad.scratch = e->attn_scr; ad.gate = e->gv; ad.ldg = ld; ad.y = e->att; ad.ldy = qd;
            ad.lanes = lanes; ad.split_keys_col = P.skeys;
            attn_decode(ad, s);
        } else {
            FlashArgs fa;
            fa.q = e->qk; fa.ldq = ld; fa.kc = kv.kc; fa.vc = kv.vc; fa.ksc = kv.ksc; fa.vsc = kv.vsc;
            fa.cap = kv.cap; fa.pages = kv.pages; fa.pos0 = pos0; fa.T = T; fa.Hq = g.Hq; fa.Hkv = g.Hkv;
            fa.gate = e->gv; fa.ldg = ld; fa.y = e->att; fa.ldy = qd;
            flash_prefill(e->o.kv, fa, s);
        }
        linear(w.attn.output, e->att, qd, e->x, H, e->x, s);
    } else {
        const GdnWeights& d = w.gdn;
        const int C = g.conv_dim, kd = g.Hk * g.dk, vd = g.Hv * g.dv, LU = C + vd, Hv2 = 2 * g.Hv;
        // u = [q | k | v | z] per token: query_key into the first 2kd columns, value_z's [v | z]
        // rows after them (one product each); the conv reads [q | k | v], the norm gate z
        const bf16_t* z = e->u + C;
        bf16_t *pa = e->pab, *pb = e->pab + g.Hv;
        gpu_fork(e, [&](cudaStream_t s2) {  // the gate projections (bf16: never fused) beside the others
            if (fin) rmsnorm(e->x, H, e->xb, H, (const bf16_t*)w.input_norm.p, H, T, 1, g.eps, false, s2);
            if (e->ab[l].rows) linear(e->ab[l], e->xb, H, e->pab, Hv2, nullptr, s2);
            else {
                linear(d.a_proj, e->xb, H, pa, Hv2, nullptr, s2);
                linear(d.b_proj, e->xb, H, pb, Hv2, nullptr, s2);
            }
        });
        if (pairs(d.query_key, d.value_z)) {
            gemv2(d.query_key, e->u, LU, d.value_z, e->u + 2 * kd, LU, xin, H, T, s, nin);
        } else {
            linear(d.query_key, xin, H, e->u, LU, nullptr, s, nin);
            GemvX nin2 = nin;
            nin2.again = true;  // value_z reads query_key's x: one prep for both
            linear(d.value_z, xin, H, e->u + 2 * kd, LU, nullptr, s, nin2);
        }
        gpu_join(e);
        bf16_t* cst = e->conv[l] + (int64_t)e->slot * e->conv_slot;
        float* rst = e->rec[l] + (int64_t)e->slot * e->rec_slot;
        if (decode) {
            conv_step(e->u, LU, (const bf16_t*)d.convolution.p, e->conv[l], e->conv_slot, P.slots, e->cy, C, T, C, s, lanes);
        } else {
            conv_prefill(e->u, LU, (const bf16_t*)d.convolution.p, cst, cst, e->cy, C, T, C, s);
        }
        if (decode || tu.force_gdn_step) {
            GdnStepArgs a;
            a.qkv = e->cy; a.ldqkv = C; a.a = pa; a.b = pb; a.ldab = Hv2;
            a.a_log = (const float*)d.a_log.p; a.dt_bias = (const float*)d.dt_bias.p;
            a.state = e->rec[l]; a.slot_stride = e->rec_slot; a.slots = P.slots;
            a.out = e->core; a.ldo = vd; a.C = T; a.Hk = g.Hk; a.Hv = g.Hv; a.lanes = lanes;
            gdn_step(a, s);
        } else {
            l2norm(e->cy, C, e->qn, kd, g.dk, T, g.Hk, 1e-6f, 1.0f / sqrtf((float)g.dk), s);
            l2norm(e->cy + kd, C, e->kn, kd, g.dk, T, g.Hk, 1e-6f, 1.0f, s);
            gdn_gates(pa, Hv2, pb, Hv2, (const float*)d.a_log.p, (const float*)d.dt_bias.p, e->beta, e->gg, T, g.Hv, s);
            GdnPrefillArgs a;
            a.q = e->qn; a.k = e->kn; a.ldqk = kd; a.v = e->cy + 2 * kd; a.ldv = C;
            a.beta = e->beta; a.g = e->gg; a.ldg = g.Hv; a.state_in = rst; a.state_out = rst;
            a.out = e->core; a.ldo = vd; a.T = T; a.Hk = g.Hk; a.Hv = g.Hv; a.scratch = e->gdn_scr;
            if (T >= tu.gdn_chunked_min) gdn_prefill_chunked(a, s);
            else gdn_prefill(a, s);
        }
        if (fu.gated) {
            GemvX gx;
            gx.mode = GEMV_X_GATED; gx.w = (const bf16_t*)d.norm.p; gx.eps = g.eps; gx.z = z; gx.ldz = LU;
            linear(d.output, e->core, vd, e->x, H, e->x, s, gx);
        } else {
            gated_rmsnorm(e->core, vd, z, LU, e->gn, vd, (const bf16_t*)d.norm.p, g.dv, T, g.Hv, g.eps, s);
            linear(d.output, e->gn, vd, e->x, H, e->x, s);
        }
    }
    GemvX npost, sw;
    if (fu.post_norm) { npost.mode = GEMV_X_RMS; npost.w = (const bf16_t*)w.post_norm.p; npost.eps = g.eps; }
    else rmsnorm(e->x, H, e->xb, H, (const bf16_t*)w.post_norm.p, H, T, 1, g.eps, false, s);
    // a prefill piece's gate_up on the wgmma gemm makes swiglu in its epilogue (GpuTuning::fuse_swiglu)
    const bool sw_gemm = tu.fuse_swiglu && !npost.mode && linear_on_gemm(w.gate_up, T, gemv_only) && gemm_swiglu_ok(w.gate_up);
    if (sw_gemm) {
        gemv_xp_forget(s);
        gemm_swiglu(w.gate_up, e->xb, H, T, e->hb, g.I, s);
    } else {
        linear(w.gate_up, npost.mode ? e->x : e->xb, H, e->gu, 2 * g.I, nullptr, s, npost);
        if (fu.swiglu) sw.mode = GEMV_X_SWIGLU;
        else swiglu(e->gu, 2 * g.I, e->hb, g.I, g.I, T, s);
    }
    linear(w.down, sw.mode ? e->gu : e->hb, sw.mode ? 2 * g.I : g.I, e->x, H, e->x, s, sw);
}

// embed -> layers -> final norm -> head (-> argmax per column). logits fp32 in e->logits:
// HEAD_LAST: row 0 = the last column's; HEAD_ALL: row t = column t's (T <= logit_rows).
static void gpu_model(GpuEngine* e, int T, const StepPtrs& P, bool decode, int pos0, int bucket, int head, bool amax) {
    const Geometry& g = e->m->geo;
    cudaStream_t s = e->stream;
    int n_splits = 0, split_keys = 0;
    gpu_attn_plan(bucket, &n_splits, &split_keys, e->o.tune.attn_splits, e->o.tune.attn_min_keys);
    CHECK(n_splits <= e->n_splits_max, "attention plan of %d splits, scratch for %d", n_splits, e->n_splits_max);
    embed_gather(e->w.token_embedding, P.ids, T, e->ovr, g.H, e->x, g.H, s);
    for (int l = 0; l < g.L; l++) gpu_layer(e, l, T, P, decode, pos0, n_splits, split_keys);
    if (head == HEAD_NONE) return;
    const bf16_t* xr = head == HEAD_ALL ? e->x : e->x + (size_t)(T - 1) * g.H;
    const int rows = head == HEAD_ALL ? T : 1;
    CHECK(rows <= e->logit_rows, "logits of %d rows, room for %d", rows, e->logit_rows);
    GemvX nf;
    if (gpu_head_fuse(e, rows, decode)) { nf.mode = GEMV_X_RMS; nf.w = (const bf16_t*)e->w.final_norm.p; nf.eps = g.eps; }
    else rmsnorm(xr, g.H, e->xb, g.H, (const bf16_t*)e->w.final_norm.p, g.H, rows, 1, g.eps, false, s);
    linear(e->w.output_head, nf.mode ? xr : e->xb, g.H, rows, e->logits, g.vocab, true, nullptr, 0, s, nf, e->o.tune.force_gemv || P.skeys);
    if (amax) argmax<float>(e->logits, g.vocab, e->domain, rows, e->amax_scr, P.out, s);
}

// ---- lanes (the header): the current lane, kv pages ---------------------------------------

// the current lane's page table to the device (stream-ordered: the kernels queued before it
// read the previous lane's)
static void gpu_lane_pages_upload(GpuEngine* e) {
    const std::vector<int>& pg = e->lanes[e->lane].pages;
    if (!pg.empty()) cudaCheck(cudaMemcpyAsync(e->d_pages, pg.data(), pg.size() * sizeof(int), cudaMemcpyHostToDevice, e->stream));
    cudaCheck(cudaStreamSynchronize(e->stream));  // pg is a pageable vector the host may change next
}
// the current lane's live fields back into its GpuLane
static void gpu_lane_store(GpuEngine* e) {
    if (e->o.lanes <= 1) return;
    GpuLane& a = e->lanes[e->lane];
    a.pos = e->pos; a.rope_delta = e->rope_delta; a.slot = e->slot; a.mtp_pos = e->mtp.pos;
}
// make lane l the one the single-sequence functions act on (its logits are not kept across a
// switch: other lanes' calls overwrite the rows)
static void gpu_lane_select(GpuEngine* e, int l) {
    if (e->o.lanes <= 1) return;
    CHECK(l >= 0 && l < e->o.lanes, "lane %d of %d", l, e->o.lanes);
    if (l == e->lane) return;
    gpu_lane_store(e);
    const GpuLane& b = e->lanes[l];
    e->lane = l; e->slot0 = l * e->lane_slots;
    e->pos = b.pos; e->rope_delta = b.rope_delta; e->slot = b.slot; e->mtp.pos = b.mtp_pos;
    if (e->mtp.bridges) e->mtp.bridge = e->mtp.bridges + (size_t)l * e->m->geo.H;
    e->last_logits = nullptr;
    gpu_lane_pages_upload(e);
}
// lane l holds pages for `rows` rows (taking free ones); false when the pool has too few or
// rows > capacity. one lane: the cache is the sequence's, nothing to take
static bool gpu_lane_reserve(GpuEngine* e, int l, int rows) {
    if (rows > e->capacity) return false;
    if (e->o.lanes <= 1) return true;
    GpuLane& ln = e->lanes[l];
    const size_t need = (size_t)CEIL_DIV(rows, KV_PAGE);
    if (need <= ln.pages.size()) return true;
    if (need - ln.pages.size() > e->free_pages.size()) return false;
    while (ln.pages.size() < need) { ln.pages.push_back(e->free_pages.back()); e->free_pages.pop_back(); }
    if (l == e->lane) gpu_lane_pages_upload(e);
    return true;
}
// lane l keeps the pages of its first `rows` rows, the rest go back to the pool
static void gpu_lane_trim(GpuEngine* e, int l, int rows) {
    if (e->o.lanes <= 1) return;
    GpuLane& ln = e->lanes[l];
    const size_t keep = (size_t)CEIL_DIV(std::max(rows, 0), KV_PAGE);
    while (ln.pages.size() > keep) { e->free_pages.push_back(ln.pages.back()); ln.pages.pop_back(); }
}

// the current lane forgets its sequence: zero deltanet state in its group's first slot, which
// becomes live, position 0 (the other slots and lanes stay). its pages stay its own: they are
// the request's reservation (a request that starts afresh resets after it entered), which
// gpu_lane_trim gives back
static void gpu_lane_reset(GpuEngine* e) {
    const Geometry& g = e->m->geo;
    e->slot = e->slot0;
    for (int l = 0; l < g.L; l++) {
        if (g.full[l]) continue;
        cudaCheck(cudaMemsetAsync(e->conv[l] + (int64_t)e->slot * e->conv_slot, 0, e->conv_slot * 2, e->stream));
        cudaCheck(cudaMemsetAsync(e->rec[l] + (int64_t)e->slot * e->rec_slot, 0, e->rec_slot * 4, e->stream));
    }
    e->pos = 0; e->rope_delta = 0; e->last_logits = nullptr; e->mtp.pos = 0;
}

// fill the host mirror of a step block for T columns at kv rows e->pos.., upload it
// (p0 >= 0: kv rows from p0 instead: the mtp's rows)
static void gpu_stage_inputs(GpuEngine* e, bool decode, const int* ids, const int* pos3, int T, const int* snap_slots, int p0 = -1) {
    if (p0 < 0) p0 = e->pos;
    const size_t TT = decode ? DEC_COLS : e->T_max;
    const int k = e->in_cur;
    e->in_cur ^= 1;
    cudaCheck(cudaEventSynchronize(e->in_done[k]));  // this mirror's previous copies have run
    int* h = e->h_in[k] + (decode ? e->dec_off : 0);
    int* hid = h; int* hp = h + TT; int* hkv = h + 4 * TT; int* hsl = h + 5 * TT;
    for (int t = 0; t < T; t++) {
        hid[t] = ids ? ids[t] : -1 - t;
        for (int a = 0; a < 3; a++) hp[3 * t + a] = pos3 ? pos3[a * T + t] : p0 + t + e->rope_delta;
        hkv[t] = p0 + t;
        hsl[t] = t == 0 ? e->slot : -1;                                    // column 0 reads the live slot
        hsl[T + t] = snap_slots ? snap_slots[t] : (t == T - 1 ? e->slot : -1);  // the last writes it back
    }
    int* d = e->d_in + (decode ? e->dec_off : 0);
    // ids | pos3 | kvpos | slots in one copy, the unused tails of each array included (the out
    // array after them is written by the device): one copy per step, not four (a decode step
    // is ~3 ms, and each copy costs a few us of latency in front of the graph)
    cudaCheck(cudaMemcpyAsync(d, h, (5 * TT + T + T) * sizeof(int), cudaMemcpyHostToDevice, e->stream));
    cudaCheck(cudaEventRecord(e->in_done[k], e->stream));
}

// the text model on T tokens of the sequence, continuing from its state: forward_cpu's
// contract (ids may be null or < 0 per row with embed_override [T, H] fp32; pos3 [3, T] or
// null; logits [T, vocab] when all_logits, else [vocab], may be null), plus snap_slots: for a
// decode-path call (T <= 8), the gdn slot each column writes its state to (null: the live slot
// after the last column). the last row's logits stay on the device (e->last_logits). head
// false (a prompt's piece before its last, where nothing reads the logits): no final norm and
// head, logits must be null and e->last_logits is left stale.
static void gpu_forward(GpuEngine* e, const int* ids, const float* embed_override, const int* pos3, int T, float* logits,
                        bool all_logits, const int* snap_slots = nullptr, bool head = true) {
    const Geometry& g = e->m->geo;
    CHECK(T >= 1 && T <= e->T_max, "gpu forward of %d tokens (at most %d per call)", T, e->T_max);
    CHECK(e->pos + T <= e->capacity, "context overflow: %d + %d > %d", e->pos, T, e->capacity);
    CHECK(!all_logits || T <= e->logit_rows, "all logits of %d rows: at most %d per call", T, e->logit_rows);
    CHECK(gpu_lane_reserve(e, e->lane, e->pos + T), "lane %d: no free kv pages for rows up to %d (the caller reserves first)", e->lane, e->pos + T);
    const bool decode = T <= DEC_COLS;
    CHECK(!snap_slots || decode, "per-column state snapshots need a decode-path call (T <= %d)", DEC_COLS);
    CHECK(head || (!logits && !all_logits), "a forward call without its head returns no logits");
    std::vector<int> idv;
    if (embed_override) {
        std::vector<uint16_t> rows((size_t)T * g.H);
        for (size_t i = 0; i < rows.size(); i++) rows[i] = f32_to_bf16(embed_override[i]);
        cudaCheck(cudaMemcpyAsync(e->ovr, rows.data(), rows.size() * 2, cudaMemcpyHostToDevice, e->stream));
        idv.resize(T);
        for (int t = 0; t < T; t++) idv[t] = ids && ids[t] >= 0 ? ids[t] : -1 - t;
        cudaCheck(cudaStreamSynchronize(e->stream));  // rows is a pageable temporary
        ids = idv.data();
    }
    for (int t = 0; t < T && ids; t++) CHECK(ids[t] < g.vocab && (ids[t] >= 0 || embed_override), "token id %d outside the embedding", ids[t]);
    gpu_stage_inputs(e, decode, ids, pos3, T, snap_slots);
    const StepPtrs& P = decode ? e->dec : e->pre;
    const int hm = !head ? HEAD_NONE : all_logits ? HEAD_ALL : HEAD_LAST;
    gpu_model(e, T, P, decode, e->pos, gpu_bucket_of(e->pos + T), hm, decode);
    e->last_logits = e->logits + (all_logits ? (size_t)(T - 1) * g.vocab : 0);
    if (logits) {
        cudaCheck(cudaMemcpyAsync(logits, e->logits, (size_t)(all_logits ? T : 1) * g.vocab * 4, cudaMemcpyDeviceToHost, e->stream));
        cudaCheck(cudaStreamSynchronize(e->stream));
    }
    if (snap_slots) e->slot = snap_slots[T - 1];
    e->pos += T;
}

// body() from its captured graph *gx (captured the first time), or eagerly
template <typename F>
static void gpu_replay(GpuEngine* e, cudaGraphExec_t* gx, bool graph, F body) {
    if (!graph) { body(); return; }
    if (!*gx) {
        cudaGraph_t gr;
        cudaCheck(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeThreadLocal));
        body();
        cudaCheck(cudaStreamEndCapture(e->stream, &gr));
        cudaCheck(cudaGraphInstantiate(gx, gr, 0));
        cudaCheck(cudaGraphDestroy(gr));
    }
    cudaCheck(cudaGraphLaunch(*gx, e->stream));
    e->graph_used = true;
}

// one decode token at e->pos: the captured graph of its bucket (or the same kernels eagerly).
// the logits stay on the device (e->last_logits), the greedy id in e->dec.out[0].
// id_dev (non-null): the token is the id the device just picked, read from there, and the
// step's deltanet state goes to slot `to` (the step runs ahead of the host: generate_gpu
// commits it or not); else `id`, and the live slot is updated in place.
static void gpu_decode_step(GpuEngine* e, int id, const int* id_dev, int to) {
    CHECK(e->pos < e->capacity, "context overflow at %d", e->pos);
    CHECK(gpu_lane_reserve(e, e->lane, e->pos + 1), "lane %d: no free kv pages for row %d (the caller reserves first)", e->lane, e->pos);
    CHECK(id_dev || (id >= 0 && id < e->m->geo.vocab), "token id %d outside the embedding", id);
    gpu_stage_inputs(e, true, &id, nullptr, 1, &to);
    if (id_dev) cudaCheck(cudaMemcpyAsync(e->dec.ids, id_dev, sizeof(int), cudaMemcpyDeviceToDevice, e->stream));
    const int b = gpu_bucket_of(e->pos + 1);
    CHECK(b < GPU_MAX_BUCKETS, "bucket %d", b);
    gpu_replay(e, &e->graph[b], e->o.graphs, [&] { gpu_model(e, 1, e->dec, true, 0, b, HEAD_ALL, true); });
}
static void gpu_decode(GpuEngine* e, int id) {
    gpu_decode_step(e, id, nullptr, e->slot);
    e->last_logits = e->logits;
    e->pos += 1;
}

// the lanes' draws take this sampler (GpuTuning::lane_draw; sample_lane_ok: the top-k path,
// the bias table on the device)
static bool gpu_lane_draw_ok(const GpuEngine* e, const Sampler* smp) {
    return !e->lane_smp.empty() && !e->o.tune.force_host_sample && smp->domain == e->domain && sample_lane_ok(smp->p, e->domain);
}
// one decode token for each of n lanes as one forward call (the header): lane ls[i] takes
// token ids[i] at its pos, column i. row_out[i]: its logits row goes to the lane's host row
// (h_lane_logits + ls[i] * vocab: the host samples, or the tap reads it); amax[i] is the row's
// argmax over the domain, or, where draw (nullable) has draw[i], that sampler's pick: sample()
// at the lane's new pos with RNG_DECODE on the device (gpu_lane_draw_ok), the lane's device
// counts holding ids[i] (fresh[i]: the sampler is uploaded first, and its counts hold it
// already). every lane's pos += 1, the live slot updated in place. the caller reserved each
// lane's pages for pos + 1 (gpu_lane_reserve).
// in two halves: gpu_lanes_launch queues the step (inputs, graph, draws, copies back) and
// returns; gpu_lanes_wait waits for it and reads the picks (the scheduler wakes the last step's
// lanes between the two, off the device's path)
static void gpu_lanes_launch(GpuEngine* e, int n, const int* ls, const int* ids, const bool* row_out,
                             const Sampler* const* draw = nullptr, const bool* fresh = nullptr) {
    const Geometry& g = e->m->geo;
    CHECK(e->o.lanes > 1 && n >= 1 && n <= e->o.lanes, "a lanes step of %d lanes on an engine of %d lanes", n, e->o.lanes);
    gpu_lane_store(e);
    int bi = 0;
    while ((1 << bi) < n) bi++;
    const int B = 1 << bi, LB = LANES_MAX;
    int b = 0;
    for (int i = 0; i < n; i++) {
        const GpuLane& ln = e->lanes[ls[i]];
        CHECK(ids[i] >= 0 && ids[i] < g.vocab, "token id %d outside the embedding", ids[i]);
        CHECK(gpu_lane_reserve(e, ls[i], ln.pos + 1), "lane %d: no free kv page for row %d (the caller reserves first)", ls[i], ln.pos);
        for (int j = 0; j < i; j++) CHECK(ls[j] != ls[i], "lane %d twice in a lanes step", ls[i]);
        b = std::max(b, gpu_bucket_of(ln.pos + 1));
    }
    CHECK(b < GPU_MAX_BUCKETS, "bucket %d", b);
    int* h = e->h_lin;
    int ns, sk_pad;
    gpu_attn_plan(b, &ns, &sk_pad, e->o.tune.attn_splits, e->o.tune.attn_min_keys);
    // the page tables hold the bucket's pages (no column reads a row past the bucket's length):
    // a step at --max-context 262144 fills and uploads 8 ints a lane at a 1K context, not 2048.
    // the graph of bucket b is captured with this page_ld, and every replay fills with it
    const int ld = (int)std::min<int64_t>(e->max_pages, CEIL_DIV((int64_t)GPU_BUCKET0 << b, (int64_t)KV_PAGE));
    e->lin.page_ld = ld;
    for (int c = 0; c < B; c++) {
        const GpuLane* ln = c < n ? &e->lanes[ls[c]] : nullptr;
        h[c] = ln ? ids[c] : 0;
        for (int a = 0; a < 3; a++) h[LB + 3 * c + a] = ln ? ln->pos + ln->rope_delta : 0;
        h[4 * LB + c] = ln ? ln->pos : -1;                    // padding: no kv row, no keys
        h[5 * LB + c] = h[5 * LB + B + c] = ln ? ln->slot : e->trash_slot;
        int sk = sk_pad;
        if (ln) gpu_attn_plan(gpu_bucket_of(ln->pos + 1), &ns, &sk, e->o.tune.attn_splits, e->o.tune.attn_min_keys);
        h[8 * LB + c] = sk;                                   // the column's own plan: its lone step's
        int* pg = h + 9 * LB + (size_t)c * ld;
        const int np = ln ? (int)ln->pages.size() : 0;
        for (int k = 0; k < ld; k++) pg[k] = k < np ? ln->pages[k] : 0;
    }
    cudaCheck(cudaMemcpyAsync(e->d_lin, h, ((size_t)9 * LB + (size_t)B * ld) * sizeof(int), cudaMemcpyHostToDevice, e->stream));
    gpu_replay(e, &e->lane_graph[bi][b], e->o.graphs, [&] { gpu_model(e, B, e->lin, true, 0, b, HEAD_ALL, true); });
    cudaCheck(cudaMemcpyAsync(h + 7 * LB, e->lin.out, n * sizeof(int), cudaMemcpyDeviceToHost, e->stream));
    int nd = 0;
    for (int i = 0; draw && i < n; i++) {
        if (!draw[i]) continue;
        CHECK(gpu_lane_draw_ok(e, draw[i]), "lane %d: a draw in the step the device sampler cannot take", ls[i]);
        SampleScratch& ss = e->lane_smp[ls[i]];
        if (fresh[i]) sample_upload(&ss, draw[i], e->stream);
        LaneDrawIn* hd = e->h_draw;  // its last copy to the device ran: the previous step was waited for
        hd->a[nd] = sample_args(e->logits + (size_t)i * g.vocab, draw[i]->p, ss, (uint64_t)e->lanes[ls[i]].pos + 1, RNG_DECODE);
        hd->a[nd].out = (int*)((uint8_t*)e->d_draw + offsetof(LaneDrawIn, picks)) + i;
        hd->counts[nd] = ss.counts;
        hd->accept[nd] = fresh[i] ? -1 : ids[i];
        nd++;
    }
    if (nd) {
        uint8_t* d = (uint8_t*)e->d_draw;
        cudaCheck(cudaMemcpyAsync(d, e->h_draw, offsetof(LaneDrawIn, picks), cudaMemcpyHostToDevice, e->stream));
        sample_lanes((const SampleArgs*)(d + offsetof(LaneDrawIn, a)), (int* const*)(d + offsetof(LaneDrawIn, counts)),
                     (const int*)(d + offsetof(LaneDrawIn, accept)), nd, e->domain, e->stream);
        cudaCheck(cudaMemcpyAsync(e->h_draw->picks, d + offsetof(LaneDrawIn, picks), n * sizeof(int), cudaMemcpyDeviceToHost, e->stream));
    }
    for (int i = 0; i < n; i++)
        if (row_out && row_out[i])
            cudaCheck(cudaMemcpyAsync(e->h_lane_logits + (size_t)ls[i] * g.vocab, e->logits + (size_t)i * g.vocab, (size_t)g.vocab * 4,
                                      cudaMemcpyDeviceToHost, e->stream));
}
// draw: as the launch's (the lanes that drew: their picks)
static void gpu_lanes_wait(GpuEngine* e, int n, const int* ls, int* amax, const Sampler* const* draw = nullptr) {
    cudaCheck(cudaStreamSynchronize(e->stream));
    const int* h = e->h_lin + 7 * LANES_MAX;
    for (int i = 0; i < n; i++) { amax[i] = draw && draw[i] ? e->h_draw->picks[i] : h[i]; e->lanes[ls[i]].pos += 1; }
    const GpuLane& cur = e->lanes[e->lane];
    e->pos = cur.pos;
    e->last_logits = nullptr;
}

// the device sampler mirrors one Sampler: its counts (the penalties) and its logit_bias table.
// gpu_sampler_bind uploads them (once per generation: generate_gpu binds at its start, so a
// Sampler that lives across calls and engine resets keeps its counts exactly as on the cpu
// path); gpu_sampler_accept counts a generated token on both sides. whoever changes a bound
// Sampler in another way binds it again.
static void gpu_sampler_bind(GpuEngine* e, const Sampler* smp) {
    e->smp_bound = nullptr;
    if (smp->domain != e->domain) return;
    sample_upload(&e->smp, smp, e->stream);
    e->smp_bound = smp;
}
static void gpu_sampler_accept(GpuEngine* e, Sampler* smp, int id) {
    sampler_accept(smp, id);
    if (e->smp_bound == smp && id >= 0 && id < e->domain) sample_accept(e->smp, id, e->stream);
}

// the next token from the last forward's logits, sample()'s pick, with 4 bytes to the host:
// greedy without a logit_bias is the argmax (the decode step already took it when
// `after_decode`); everything else is sample_gpu with the bound sampler's state. the host
// samples (the domain's logits to the host, the cpu sampler) only for force_host_sample, a
// logit_bias of more than SAMPLE_MAX_BIAS ids, or a sampler of another domain.
// gpu_pick_device queues the pick and returns the device address its id will be at, or null
// when the pick has to run on the host (nothing ran yet: the cpu path samples zero logits;
// force_host_sample; a bias table too large); gpu_pick waits for the id.
// a constraint's mask (smp->mask, a sampler of the engine's domain) goes to the device and
// masks the row first (mask_logits), so the argmax is taken again after it; on the host
// path sample() applies it.
static const int* gpu_pick_device(GpuEngine* e, Sampler* smp, uint64_t position, int purpose, bool after_decode) {
    if (!e->last_logits) return nullptr;
    if (smp->mask && smp->domain == e->domain) {
        const size_t bytes = (size_t)CEIL_DIV(e->domain, 32) * 4;
        memcpy(e->h_mask, smp->mask, bytes);  // the previous copy out of h_mask ran: its pick was waited for
        cudaCheck(cudaMemcpyAsync(e->d_mask, e->h_mask, bytes, cudaMemcpyHostToDevice, e->stream));
        mask_logits(e->last_logits, e->d_mask, e->domain, e->stream);
        after_decode = false;
    }
    if (smp->p.temperature <= 0.0f && smp->p.logit_bias.empty()) {  // greedy: the argmax on the device
        if (!after_decode) argmax<float>(e->last_logits, e->m->geo.vocab, e->domain, 1, e->amax_scr, e->dec.out, e->stream);
        return e->dec.out;
    }
    if (!e->o.tune.force_host_sample) {
        if (e->smp_bound != smp) gpu_sampler_bind(e, smp);
        if (e->smp_bound == smp && e->smp.n_bias >= 0) {
            sample_gpu(e->last_logits, smp->p, e->smp, position, purpose, e->stream);
            return e->smp.out;
        }
    }
    return nullptr;
}
static int gpu_pick(GpuEngine* e, Sampler* smp, uint64_t position, int purpose, bool after_decode) {
    if (const int* d = gpu_pick_device(e, smp, position, purpose, after_decode)) {
        cudaCheck(cudaMemcpyAsync(e->h_out, d, sizeof(int), cudaMemcpyDeviceToHost, e->stream));
        cudaCheck(cudaStreamSynchronize(e->stream));
        return e->h_out[0];
    }
    if (!e->last_logits) {
        std::vector<float> zero(e->domain, 0.0f);
        return sample(smp, zero.data(), position, purpose);
    }
    cudaCheck(cudaMemcpyAsync(e->h_logits, e->last_logits, (size_t)e->domain * 4, cudaMemcpyDeviceToHost, e->stream));
    cudaCheck(cudaStreamSynchronize(e->stream));
    return sample(smp, e->h_logits, position, purpose);
}

// state slots: copy the live deltanet state into slot `to` (prefix reuse keeps it), or make
// slot `from` the live one again (kv rows are position-addressed: restoring also needs the
// position the snapshot was taken at). slots 0 and 1 are the live pair (generate_gpu runs a
// step ahead into the other one), so snapshots take slots from 2 on.
static void gpu_snapshot(GpuEngine* e, int to) {
    const Geometry& g = e->m->geo;
    CHECK(to >= e->shared_slot0 && to < e->n_slots && to != e->slot, "snapshot slot %d: the shared slots are %d..%d",
          to, e->shared_slot0, e->n_slots - 1);
    for (int l = 0; l < g.L; l++) {
        if (g.full[l]) continue;
        cudaCheck(cudaMemcpyAsync(e->conv[l] + to * e->conv_slot, e->conv[l] + e->slot * e->conv_slot, e->conv_slot * 2, cudaMemcpyDeviceToDevice, e->stream));
        cudaCheck(cudaMemcpyAsync(e->rec[l] + to * e->rec_slot, e->rec[l] + e->slot * e->rec_slot, e->rec_slot * 4, cudaMemcpyDeviceToDevice, e->stream));
    }
}
static void gpu_restore(GpuEngine* e, int from, int pos) {
    const Geometry& g = e->m->geo;
    CHECK(from >= 0 && from < e->n_slots && pos >= 0 && pos <= e->capacity, "restore slot %d pos %d", from, pos);
    for (int l = 0; l < g.L && from != e->slot; l++) {  // into the live slot; the snapshot stays
        if (g.full[l]) continue;
        cudaCheck(cudaMemcpyAsync(e->conv[l] + e->slot * e->conv_slot, e->conv[l] + from * e->conv_slot, e->conv_slot * 2, cudaMemcpyDeviceToDevice, e->stream));
        cudaCheck(cudaMemcpyAsync(e->rec[l] + e->slot * e->rec_slot, e->rec[l] + from * e->rec_slot, e->rec_slot * 4, cudaMemcpyDeviceToDevice, e->stream));
    }
    e->pos = pos;
    e->last_logits = nullptr;
}

// ---- prefix reuse on the device: state images and kv rows (the engine's PrefixCache) ------
//
// a state image is the deltanet state of every gdn layer (conv bf16 + recurrent fp32,
// gpu_gdn_bytes of one slot); device images are gdn slots (PrefixCache takes the last
// --device-state-slots of them), host images pinned buffers laid out layer by layer, conv
// then recurrent. kv rows [a, b) of a prefix of n rows go to / come from a pinned buffer laid
// out per full layer as k codes [Hkv][n][256], v codes, then (int8 / fp8) k and v scales
// [Hkv][n][KV_GROUPS]: the device planes' order with n rows instead of the capacity.
static void gpu_image_host(GpuEngine* e, int slot, uint8_t* host, bool to_host) {
    const Geometry& g = e->m->geo;
    const cudaMemcpyKind k = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    size_t off = 0;
    for (int l = 0; l < g.L; l++) {
        if (g.full[l]) continue;
        uint8_t* c = (uint8_t*)(e->conv[l] + (int64_t)slot * e->conv_slot);
        uint8_t* r = (uint8_t*)(e->rec[l] + (int64_t)slot * e->rec_slot);
        const size_t cb = e->conv_slot * 2, rb = e->rec_slot * 4;
        cudaCheck(cudaMemcpyAsync(to_host ? host + off : c, to_host ? c : host + off, cb, k, e->stream)); off += cb;
        cudaCheck(cudaMemcpyAsync(to_host ? host + off : r, to_host ? r : host + off, rb, k, e->stream)); off += rb;
    }
    cudaCheck(cudaStreamSynchronize(e->stream));  // the host buffer is read or reused right after
}
// every kv plane of the sequence state: f(plane, bytes per row) for each full layer's k and v
// codes, then (int8 / fp8) scales, then the mtp layer's (--spec)
template <typename F>
static void gpu_kv_planes(GpuEngine* e, F f) {
    const Geometry& g = e->m->geo;
    const size_t code = (size_t)ATT_HD * kv_elem_bytes(e->o.kv), scale = (size_t)KV_GROUPS * 2;
    auto layer = [&](void* kc, void* vc, void* ksc, void* vsc) {
        f((uint8_t*)kc, code); f((uint8_t*)vc, code);
        if (e->o.kv != KV_BF16) { f((uint8_t*)ksc, scale); f((uint8_t*)vsc, scale); }
    };
    for (int l = 0; l < g.L; l++) if (g.full[l]) layer(e->kc[l], e->vc[l], e->ksc[l], e->vsc[l]);
    if (e->mtp.K) layer(e->mtp.kv.kc, e->mtp.kv.vc, e->mtp.kv.ksc, e->mtp.kv.vsc);
}
// logical rows [a, b) of lane l (one lane: of the sequence) in runs that stay inside a page:
// f(first row, end row, physical row of the first)
template <typename F>
static void gpu_row_runs(const GpuEngine* e, int l, int a, int b, F f) {
    if (e->o.lanes <= 1) { if (b > a) f(a, b, (int64_t)a); return; }
    const std::vector<int>& pg = e->lanes[l].pages;
    CHECK((int64_t)pg.size() * KV_PAGE >= b, "lane %d: kv rows up to %d on %zu pages", l, b, pg.size());
    for (int r = a; r < b;) {
        const int r1 = std::min(b, (r / KV_PAGE + 1) * KV_PAGE);
        f(r, r1, (int64_t)pg[r / KV_PAGE] * KV_PAGE + r % KV_PAGE);
        r = r1;
    }
}
static void gpu_kv_rows_host(GpuEngine* e, int a, int b, int n, uint8_t* host, bool to_host) {
    const Geometry& g = e->m->geo;
    CHECK(0 <= a && a <= b && b <= n && n <= e->capacity, "kv rows [%d, %d) of %d", a, b, n);
    if (a == b) return;
    const cudaMemcpyKind k = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    gpu_lane_store(e);
    size_t off = 0;
    gpu_kv_planes(e, [&](uint8_t* dev, size_t row) {  // one [Hkv][rows][row bytes] plane
        const size_t dp = (size_t)e->kv_rows * row, hp = (size_t)n * row;
        gpu_row_runs(e, e->lane, a, b, [&](int r0, int r1, int64_t phys) {
            uint8_t* d = dev + phys * row; uint8_t* h = host + off + (size_t)r0 * row;
            const size_t w = (size_t)(r1 - r0) * row;
            if (to_host) cudaCheck(cudaMemcpy2DAsync(h, hp, d, dp, w, g.Hkv, k, e->stream));
            else cudaCheck(cudaMemcpy2DAsync(d, dp, h, hp, w, g.Hkv, k, e->stream));
        });
        off += hp * g.Hkv;
    });
    cudaCheck(cudaStreamSynchronize(e->stream));
}
// kv rows [a, b) of lane src into lane dst's pages (both reserved for b rows): prefix reuse
// across lanes
static void gpu_kv_lane_copy(GpuEngine* e, int dst, int src, int a, int b) {
    const Geometry& g = e->m->geo;
    CHECK(e->o.lanes > 1 && dst != src, "kv rows between lanes %d and %d", dst, src);
    const std::vector<int>& sp = e->lanes[src].pages;
    CHECK((int64_t)sp.size() * KV_PAGE >= b, "lane %d: kv rows up to %d on %zu pages", src, b, sp.size());
    gpu_kv_planes(e, [&](uint8_t* dev, size_t row) {
        const size_t dp = (size_t)e->kv_rows * row;
        gpu_row_runs(e, dst, a, b, [&](int r0, int r1, int64_t phys) {  // a run of dst is inside one page of src too
            const int64_t sphys = (int64_t)sp[r0 / KV_PAGE] * KV_PAGE + r0 % KV_PAGE;
            cudaCheck(cudaMemcpy2DAsync(dev + phys * row, dp, dev + sphys * row, dp, (size_t)(r1 - r0) * row, g.Hkv,
                                        cudaMemcpyDeviceToDevice, e->stream));
        });
    });
}

// ---- generation ----------------------------------------------------------------------------

// rows per forward call when every row's logits are kept (--logits-out, perplexity)
static int gpu_logits_piece(const GpuEngine* e) { return std::min(e->T_max, e->logit_rows); }

// generate_cpu's contract on the gpu: prefill the prompt in pieces (every row's logits to
// the tap when it asks), then sample, emit and decode until max_new, a stop id or a full
// context. with a cancel poll each piece is waited for before the poll, so a cancel ends the
// prefill within one piece (the host would otherwise queue them all at once).
// with a constraint the host computes step n+1's mask while the device runs step n+1's
// forward (the step ahead below, queued before the host reads token n), and the mask goes
// up in front of the pick.
template <typename Emit>
static GenStats generate_gpu(GpuEngine* e, Sampler* smp, const std::vector<int>& prompt, int max_new, const std::vector<int>& stop_ids,
                             const GenTap* tap, Emit emit, const GenCancel& cancel = GenCancel(), const MmPrompt* mm = nullptr,
                             GenConstraint* gc = nullptr) {
    const Geometry& g = e->m->geo;
    GenStats s;
    s.prompt = (int)prompt.size();
    const bool all_rows = tap && tap->prompt_rows, per_token = tap && tap->sampled;
    const int piece = all_rows ? gpu_logits_piece(e) : e->T_max;
    std::vector<float> logits(all_rows ? (size_t)piece * g.vocab : per_token ? g.vocab : 0);
    double t0 = now_s();
    const bool prefilled = prefill_pieces(prompt, e->pos, piece, g.H, mm, [&](int i) {
        if (!cancel.fn) return false;
        if (i > 0) cudaCheck(cudaStreamSynchronize(e->stream));
        return cancel();
    }, [&](const int* ids, const float* rows, const int* pos3, int T, bool last) {
        gpu_forward(e, ids, rows, pos3, T, all_rows ? logits.data() : nullptr, all_rows, nullptr, all_rows || last);
        if (all_rows) tap->prompt_rows(tap->ctx, logits.data(), T, g.vocab);
    });
    if (!prefilled) { s.cancelled = true; s.prefill_s = now_s() - t0; return s; }
    if (mm) e->rope_delta = mm->rope_delta;
    cudaCheck(cudaStreamSynchronize(e->stream));
    s.prefill_s = now_s() - t0;
    t0 = now_s();
    if (smp->p.temperature > 0.0f || !smp->p.logit_bias.empty()) gpu_sampler_bind(e, smp);  // counts and bias as they are now
    // where the device picks the tokens (greedy, or the device sampler) the loop runs one step
    // ahead of the host: step n+1, embedding the id the device picked, is queued before the
    // host has read token n, which it then reads behind an event while step n+1 runs, so the
    // gpu does not wait for the host between steps (~0.1 ms a token on the h200, bench-notes).
    // the step ahead writes its deltanet state to the other slot of the live pair (0, 1), so a
    // stop id, a cancel or max_new leaves it uncommitted: the live slot and e->pos stay, its
    // kv row is overwritten by the next forward, and its logits are dropped.
    constraint_start(gc);
    for (int n = 0; n < max_new; n++) {
        // the row this id is drawn from, for the tap: queued before the pick (stream order;
        // the pick's wait covers it). the step ahead would overwrite it, so it is off then.
        const bool tapped = per_token && e->last_logits;
        if (tapped) cudaCheck(cudaMemcpyAsync(logits.data(), e->last_logits, (size_t)g.vocab * 4, cudaMemcpyDeviceToHost, e->stream));
        smp->mask = constraint_mask(gc);  // overlaps the forward queued last step
        const int* did = gpu_pick_device(e, smp, e->pos, n == 0 ? RNG_PREFILL : RNG_DECODE, n > 0);
        const bool ahead = did && !per_token && n + 1 < max_new && e->pos < e->capacity;
        const int spare = e->slot == e->slot0 ? e->slot0 + 1 : e->slot0;  // the other slot of the lane's live pair
        int id;
        if (did) {
            cudaCheck(cudaMemcpyAsync(e->h_out, did, sizeof(int), cudaMemcpyDeviceToHost, e->stream));
            cudaCheck(cudaEventRecord(e->tok_ready, e->stream));
            if (ahead) {
                if (did == e->smp.out) sample_accept(e->smp, 0, e->stream, did);  // the device sampler picked it: count it there
                gpu_decode_step(e, 0, did, spare);
            }
            cudaCheck(cudaEventSynchronize(e->tok_ready));
            id = e->h_out[0];
        } else {
            id = gpu_pick(e, smp, e->pos, n == 0 ? RNG_PREFILL : RNG_DECODE, n > 0);
        }
        smp->mask = nullptr;
        if (tapped) { cudaCheck(cudaStreamSynchronize(e->stream)); tap->sampled(tap->ctx, logits.data(), g.vocab, id); }
        const bool go = gen_take(&s, id, stop_ids, gc, emit, [&] {
            if (ahead) sampler_accept(smp, id);  // the device counted it already
            else gpu_sampler_accept(e, smp, id);
        });
        if (!go) {
            if (ahead) e->last_logits = nullptr;  // the step ahead overwrote them (a sampler bound later re-uploads the counts)
            break;
        }
        if (ahead) {  // commit the step ahead
            e->slot = spare;
            e->pos += 1;
            e->last_logits = e->logits;
            continue;
        }
        if (n + 1 == max_new || e->pos == e->capacity) break;
        gpu_decode(e, id);
    }
    s.decode_s = now_s() - t0;
    return s;
}

// ---- mtp speculative decoding on the device ----------------------------------------------
//
// generate_spec_cpu's round (section 6's header is the contract; the cpu round is the oracle)
// with the device's pieces:
//   verify   gpu_model on the T = K+1 columns [x, d1..dK] through the decode path, column t
//            leaving its deltanet state in slot snap[t] (snap[0] is the live slot, updated in
//            place: column 0 is always committed), then the final norm of every column's
//            hidden row into mtp.hid (the mtp's input; the head's own norm stays fused, so the
//            logits are a plain step's)
//   accept   greedy: spec_greedy on the device. sampling: sample_spec_kernel column by column on
//            the device (sample_spec's arithmetic bit for bit, on the top-k path); samplers it
//            cannot take (top_k off or > 1024, a bias table past SAMPLE_MAX_BIAS): the columns'
//            logits to the host and sample_spec there, the outcome written to the result block
//   realign  spec_commit, the mtp on the T rows (rows past c are scratch), spec_row, then the
//            draft chain (gpu_spec_drafts) into the result block
// the host then reads the block (c, the tokens, the next drafts: 13 ints) and runs the tokens
// through the stop ids, the emitter and the limits; a stop inside the round commits exactly
// the columns before it (pos, live slot, mtp pos) and ends generation.
// lossless greedy needs each verification column to be a one-token step bit for bit: the gemv
// picks its kernel by the matrix alone (7.2); attention, deltanet and norms work per column;
// the attention split plan is per length bucket, so a round never straddles a bucket boundary
// (it verifies fewer drafts there: T columns with bucket_of(n0+1) == bucket_of(n0+T)), nor the
// capacity. cuda graphs: the verify and the realign + drafts of a full round (T = K+1) are
// captured per bucket the first time; they read the staged step blocks and the result block,
// so one pair replays for every full round of its bucket. shortened rounds (at a bucket
// boundary, near the capacity) run the same launches eagerly, and so does --no-cuda-graph:
// the same kernels, the same tokens. the mtp's attention takes the next bucket's plan (its
// draft rows reach n0+2K-1 at most, never past twice the bucket).
// drafts do not change the output, only how much of it a round produces; the test hook
// replaces them on the host between rounds (the chain that made them is not re-run).

// column j of a step block as a one-column block (the mtp's full layer reads no slots)
static StepPtrs step_col(const StepPtrs& P, int j) {
    StepPtrs q = P;
    q.ids += j; q.pos3 += 3 * j; q.kvpos += j; q.out += j;
    return q;
}
static int gpu_mtp_bucket(const GpuEngine* e, int b) { return std::min(b + 1, gpu_bucket_of(e->capacity)); }

// the mtp module on T rows (mtp_forward_cpu's math): P holds each row's token (x_{p+1}), kv row
// and position; hid [T][H] the hidden rows it pairs them with; out [T][H] its final-normed
// hidden rows (may alias hid). decode (T <= DEC_COLS): the decode kernels with the attention
// plan of `bucket`; else the prefill path from kv row pos0.
static void gpu_mtp(GpuEngine* e, int T, const StepPtrs& P, bool decode, int pos0, int bucket, const bf16_t* hid, bf16_t* out) {
    const Geometry& g = e->m->geo;
    const MtpWeights& w = e->w.mtp;
    GpuMtp& mt = e->mtp;
    cudaStream_t s = e->stream;
    const int H = g.H;
    int ns = 0, sk = 0;
    gpu_attn_plan(bucket, &ns, &sk, e->o.tune.attn_splits, e->o.tune.attn_min_keys);
    CHECK(ns <= e->n_splits_max, "attention plan of %d splits, scratch for %d", ns, e->n_splits_max);
    embed_gather(e->w.token_embedding, P.ids, T, e->ovr, H, e->x, H, s);
    rmsnorm(e->x, H, mt.in, 2 * H, (const bf16_t*)w.embedding_norm.p, H, T, 1, g.eps, false, s);
    rmsnorm(hid, H, mt.in + H, 2 * H, (const bf16_t*)w.hidden_norm.p, H, T, 1, g.eps, false, s);
    linear(w.input_projection, mt.in, 2 * H, T, e->x, H, false, nullptr, 0, s, GemvX(), e->o.tune.force_gemv);
    gpu_layer(e, -1, T, P, decode, pos0, ns, sk, &w.layer, &mt.kv);
    rmsnorm(e->x, H, out, H, (const bf16_t*)w.final_norm.p, H, T, 1, g.eps, false, s);
}

// drafts 1..K from the hidden row in mtp.row: each the proposal head's argmax (the full head
// over the domain, or the draft head through its id map) into the result block; all but the
// last feed the next draft step (one mtp row: column j of mtp.ds, positions staged there)
static void gpu_spec_drafts(GpuEngine* e, int bucket) {
    GpuMtp& mt = e->mtp;
    const Geometry& g = e->m->geo;
    cudaStream_t s = e->stream;
    const Mat& head = mt.draft_head ? e->w.draft_head : e->w.output_head;
    const int rows = (int)head.rows, n = mt.draft_head ? rows : e->domain;
    for (int k = 1; k <= mt.K; k++) {
        const bool more = k < mt.K;
        linear(head, mt.row, g.H, 1, mt.dlog, rows, true, nullptr, 0, s, GemvX(), e->o.tune.force_gemv);
        argmax<float>(mt.dlog, rows, n, 1, e->amax_scr, mt.amax, s);
        launch_k(spec_draft_kernel, 1, 32, 0, s, (const int*)mt.amax, mt.draft_ids, mt.blk, k, more ? mt.ds.ids + (k - 1) : nullptr);
        cudaCheck(cudaGetLastError());
        if (more) gpu_mtp(e, 1, step_col(mt.ds, k - 1), true, 0, bucket, mt.row, mt.row);
    }
}

// n rows of ids (host, null: written on the device), kv rows p0.. (clamped into the cache) and
// their positions into a [DEC_COLS] block P through the staging mirror hm
static void gpu_spec_stage(GpuEngine* e, const StepPtrs& P, int* hm, const int* ids, int n, int p0) {
    CHECK(n >= 1 && n <= DEC_COLS, "mtp staging of %d rows", n);
    cudaCheck(cudaEventSynchronize(e->mtp.staged));  // the mirror's previous copy has run
    int *hid = hm, *hp = hm + DEC_COLS, *hk = hm + 4 * DEC_COLS;
    for (int t = 0; t < n; t++) {
        const int p = std::min(p0 + t, e->capacity - 1);
        if (ids) hid[t] = ids[t];
        hk[t] = p;
        for (int a = 0; a < 3; a++) hp[3 * t + a] = p + e->rope_delta;
    }
    if (ids) cudaCheck(cudaMemcpyAsync(P.ids, hid, 5 * DEC_COLS * sizeof(int), cudaMemcpyHostToDevice, e->stream));
    else cudaCheck(cudaMemcpyAsync(P.pos3, hp, 4 * DEC_COLS * sizeof(int), cudaMemcpyHostToDevice, e->stream));
    cudaCheck(cudaEventRecord(e->mtp.staged, e->stream));
}

// the mtp rows p0..p0+T-1 with tokens ids (host) and hidden rows hid: the decode path for a
// few rows, the prefill path for a piece
static void gpu_mtp_rows(GpuEngine* e, const int* ids, int T, int p0, const bf16_t* hid, bf16_t* out) {
    GpuMtp& mt = e->mtp;
    if (T <= DEC_COLS) {
        gpu_spec_stage(e, mt.re, mt.h_blk + SPEC_BLK_INTS, ids, T, p0);
        gpu_mtp(e, T, mt.re, true, 0, gpu_bucket_of(p0 + T), hid, out);
    } else {
        gpu_stage_inputs(e, false, ids, nullptr, T, nullptr, p0);
        gpu_mtp(e, T, e->pre, false, p0, gpu_bucket_of(p0 + T), hid, out);
    }
}

// the verify of T columns staged in e->dec, in bucket b; the columns' hidden rows to mtp.hid
static void gpu_spec_verify(GpuEngine* e, int T, int b) {
    const Geometry& g = e->m->geo;
    gpu_model(e, T, e->dec, true, 0, b, HEAD_ALL, true);
    rmsnorm(e->x, g.H, e->mtp.hid, g.H, (const bf16_t*)e->w.final_norm.p, g.H, T, 1, g.eps, false, e->stream);
}
// from the result block's c: the realignment of T rows (kv rows staged in mtp.re) and the drafts
static void gpu_spec_realign(GpuEngine* e, int T, int b) {
    GpuMtp& mt = e->mtp;
    const Geometry& g = e->m->geo;
    cudaStream_t s = e->stream;
    launch_k(spec_commit_kernel, 1, 32, 0, s, (const int*)mt.blk, (const int*)e->dec.ids, T, mt.K, mt.re.ids, (const int*)mt.re.kvpos,
             (const int*)mt.re.pos3, mt.ds.kvpos, mt.ds.pos3, e->capacity);
    cudaCheck(cudaGetLastError());
    const int bm = gpu_mtp_bucket(e, b);
    gpu_mtp(e, T, mt.re, true, 0, bm, mt.hid, mt.mh);
    launch_k(spec_row_kernel, 1, 256, 0, s, (const bf16_t*)mt.mh, g.H, (const int*)mt.blk, mt.row);
    cudaCheck(cudaGetLastError());
    gpu_spec_drafts(e, bm);
}
// the result block to the host (after everything queued so far)
static const int* gpu_spec_read(GpuEngine* e) {
    cudaCheck(cudaMemcpyAsync(e->mtp.h_blk, e->mtp.blk, SPEC_BLK_INTS * sizeof(int), cudaMemcpyDeviceToHost, e->stream));
    cudaCheck(cudaStreamSynchronize(e->stream));
    return e->mtp.h_blk;
}

// a prefill that samples nothing (prefix reuse's boundary pieces): T tokens through the main
// model and the mtp rows of all but the last, whose row waits for the next token: its hidden
// row is kept in mtp.bridge and mtp.pos = pos - 1 (gpu_spec_bridge makes the row once the
// token is known; generate_spec_gpu does it with its prompt's first token). the cpu's twin is
// the prefix cache's bridge.
static void gpu_spec_bridge(GpuEngine* e, int next) {
    GpuMtp& mt = e->mtp;
    if (!mt.K || mt.pos != e->pos - 1) return;
    gpu_mtp_rows(e, &next, 1, mt.pos, mt.bridge, mt.mh);
    mt.pos = e->pos;
}
static void gpu_spec_prefill(GpuEngine* e, const int* ids, int T) {
    GpuMtp& mt = e->mtp;
    const Geometry& g = e->m->geo;
    CHECK(mt.K && T >= 1 && T <= e->T_max, "an mtp prefill of %d tokens", T);
    gpu_spec_bridge(e, ids[0]);
    CHECK(mt.pos == e->pos, "mtp rows %d, sequence %d", mt.pos, e->pos);
    gpu_forward(e, ids, nullptr, nullptr, T, nullptr, false);
    rmsnorm(e->x, g.H, mt.hid, g.H, (const bf16_t*)e->w.final_norm.p, g.H, T, 1, g.eps, false, e->stream);
    if (T > 1) gpu_mtp_rows(e, ids + 1, T - 1, e->pos - T, mt.hid, mt.mh);
    cudaCheck(cudaMemcpyAsync(mt.bridge, mt.hid + (size_t)(T - 1) * g.H, (size_t)g.H * 2, cudaMemcpyDeviceToDevice, e->stream));
    mt.pos = e->pos - 1;
}
// the pending row's hidden (mtp.bridge) to or from the host ([H] bf16), for a retained prefix
static void gpu_spec_bridge_host(GpuEngine* e, uint16_t* host, bool to_host) {
    const size_t b = (size_t)e->m->geo.H * 2;
    if (to_host) cudaCheck(cudaMemcpyAsync(host, e->mtp.bridge, b, cudaMemcpyDeviceToHost, e->stream));
    else cudaCheck(cudaMemcpyAsync(e->mtp.bridge, host, b, cudaMemcpyHostToDevice, e->stream));
    cudaCheck(cudaStreamSynchronize(e->stream));
}

// generate_spec_cpu's contract on the gpu (e built with o.spec: the mtp resident, K+1 gdn slots)
template <typename Emit>
static GenStats generate_spec_gpu(GpuEngine* e, Sampler* smp, const std::vector<int>& prompt, int max_new, const std::vector<int>& stop_ids,
                                  Emit emit, const GenCancel& cancel = GenCancel()) {
    const Geometry& g = e->m->geo;
    GpuMtp& mt = e->mtp;
    const int K = mt.K, n = (int)prompt.size(), H = g.H;
    CHECK(K >= 1 && e->lane_slots >= K + 1, "the engine was built without --spec mtp");
    if (n > 0) gpu_spec_bridge(e, prompt[0]);  // a prefill that sampled nothing left the last row pending
    CHECK(mt.pos == e->pos, "mtp rows %d, sequence %d", mt.pos, e->pos);
    GenStats s;
    s.prompt = n;
    s.spec.K = K;
    double t0 = now_s();
    // prefill: each piece's final-normed hidden rows feed the mtp rows of the same positions;
    // the last piece's rows wait for the first sampled token
    const int base = e->pos;
    int last0 = 0, lastT = 0;
    for (int i = 0; i < n; i += e->T_max) {
        if (cancel.fn) {
            if (i > 0) cudaCheck(cudaStreamSynchronize(e->stream));
            if (cancel()) { s.cancelled = true; s.prefill_s = now_s() - t0; return s; }
        }
        const int T = std::min(e->T_max, n - i);
        gpu_forward(e, prompt.data() + i, nullptr, nullptr, T, nullptr, false, nullptr, i + T == n);
        rmsnorm(e->x, H, mt.hid, H, (const bf16_t*)e->w.final_norm.p, H, T, 1, g.eps, false, e->stream);
        if (i + T < n) { gpu_mtp_rows(e, prompt.data() + i + 1, T, base + i, mt.hid, mt.mh); mt.pos = e->pos; continue; }
        last0 = i; lastT = T;
    }
    cudaCheck(cudaStreamSynchronize(e->stream));
    s.prefill_s = now_s() - t0;
    t0 = now_s();
    // sampled rounds draw on the device (sample_spec_kernel) where its top-k path takes the
    // sampler, else on the host; the device counts the tokens it draws itself
    const bool sampled = smp->p.temperature > 0.0f || !smp->p.logit_bias.empty();
    if (sampled) gpu_sampler_bind(e, smp);
    const bool dev_pick = sampled && !e->o.tune.force_host_sample && e->smp_bound == smp && sample_spec_gpu_ok(smp->p, e->smp);
    auto take = [&](int id, bool counted) {  // counted: by the device sampler already (its own draws)
        return gen_take(&s, id, stop_ids, nullptr, emit, [&] {
            if (dev_pick && !counted) gpu_sampler_accept(e, smp, id);
            else sampler_accept(smp, id);
        }) && s.generated < max_new;
    };
    if (max_new <= 0 || n == 0) { s.decode_s = now_s() - t0; return s; }
    int x = gpu_pick(e, smp, e->pos, RNG_PREFILL, false);
    bool go = take(x, false) && e->pos < e->capacity;
    int drafts[SPEC_MAX_K] = {};
    auto read_drafts = [&](const int* blk) {
        for (int k = 1; k <= K; k++) {
            drafts[k - 1] = blk[SPEC_BLK_DRAFT + k - 1];
            if (mt.hook) drafts[k - 1] = mt.hook(mt.hook_ctx, e->pos + k, k, drafts[k - 1]);
        }
    };
    if (go) {  // the last piece's mtp rows (its tokens shifted by one, then x), the first drafts
        std::vector<int> ids(prompt.begin() + last0 + 1, prompt.end());
        ids.push_back(x);
        gpu_mtp_rows(e, ids.data(), lastT, base + last0, mt.hid, mt.mh);
        cudaCheck(cudaMemcpyAsync(mt.row, mt.mh + (size_t)(lastT - 1) * H, (size_t)H * 2, cudaMemcpyDeviceToDevice, e->stream));
        if (K > 1) gpu_spec_stage(e, mt.ds, mt.h_blk + SPEC_BLK_INTS + 8 * DEC_COLS, nullptr, K - 1, e->pos);
        gpu_spec_drafts(e, gpu_mtp_bucket(e, gpu_bucket_of(e->pos + 1)));
        read_drafts(gpu_spec_read(e));
        mt.pos = e->pos;
    }
    while (go) {
        // a round boundary polls the cancel (the server's lanes hand the device to other lanes
        // there: the state between rounds is the lane's own, the drafts on the host); another
        // lane's sampler may have taken the device sampler meanwhile
        if (cancel.fn && cancel()) { s.cancelled = true; break; }
        if (sampled && e->smp_bound != smp) gpu_sampler_bind(e, smp);
        const int n0 = e->pos, b = gpu_bucket_of(n0 + 1);
        CHECK(gpu_lane_reserve(e, e->lane, std::min(e->capacity, n0 + 2 * K + 1)), "lane %d: no free kv pages for the round at %d (the caller reserves first)",
              e->lane, n0);
        int T = std::min(K + 1, e->capacity - n0);
        while (T > 1 && gpu_bucket_of(n0 + T) != b) T--;
        int ids[SPEC_COLS], snap[SPEC_COLS];
        ids[0] = x;
        for (int t = 1; t < T; t++) ids[t] = drafts[t - 1];
        for (int t = 0, sl = e->slot0; t < T; t++) {  // the live slot, then the others of the lane's group in order
            if (t == 0) { snap[0] = e->slot; continue; }
            if (sl == e->slot) sl++;
            snap[t] = sl++;
        }
        gpu_stage_inputs(e, true, ids, nullptr, T, snap);
        gpu_spec_stage(e, mt.re, mt.h_blk + SPEC_BLK_INTS, nullptr, T, n0);
        const bool graph = T == K + 1 && e->o.graphs;
        gpu_replay(e, &mt.verify[b], graph, [&] { gpu_spec_verify(e, T, b); });
        int tok[SPEC_COLS], c = 0, last = 0;  // tokens of columns 0..c; last: the last committed column
        const int* blk = nullptr;              // the result block with the next drafts (go on)
        if (!sampled || dev_pick) {  // the accept on the device: c and the tokens in the result block
            if (!sampled) {
                launch_k(spec_greedy_kernel, 1, 32, 0, e->stream, (const int*)e->dec.ids, (const int*)e->dec.out, T - 1, mt.blk);
                cudaCheck(cudaGetLastError());
            } else {
                cudaCheck(cudaMemsetAsync(mt.done, 0, sizeof(int), e->stream));
                for (int col = 0; col < T; col++) {
                    SpecDraw sd;
                    sd.ids = e->dec.ids; sd.kvpos = e->dec.kvpos; sd.c = col; sd.last = T - 1;
                    sd.res = mt.blk; sd.done = mt.done; sd.counts = e->smp.counts;
                    sample_spec_gpu(e->logits + (size_t)col * g.vocab, smp->p, e->smp, sd, e->stream);
                }
            }
            gpu_replay(e, &mt.draft[b], graph, [&] { gpu_spec_realign(e, T, b); });
            blk = gpu_spec_read(e);
            c = blk[SPEC_BLK_RES];
            for (int t = 0; t <= c; t++) tok[t] = blk[SPEC_BLK_TOK + t];
            for (last = 0; last <= c; last++) {
                if (last < c) { s.spec.accepted++; s.spec.per_position[last]++; }
                if (!take(tok[last], true)) { go = false; break; }
            }
            if (go) last = c;
        } else {
            cudaCheck(cudaMemcpyAsync(mt.h_logits, e->logits, (size_t)T * g.vocab * 4, cudaMemcpyDeviceToHost, e->stream));
            cudaCheck(cudaStreamSynchronize(e->stream));
            for (c = 0;; c++) {  // generate_spec_cpu's accept loop
                const float* lg = mt.h_logits + (size_t)c * g.vocab;
                bool acc = false;
                tok[c] = c < T - 1 ? sample_spec(smp, lg, ids[c + 1], n0 + c + 1, &acc) : sample(smp, lg, n0 + c + 1, RNG_SPEC_BONUS);
                if (acc) { s.spec.accepted++; s.spec.per_position[c]++; }
                if (!take(tok[c], false)) { go = false; break; }
                if (!acc) break;
            }
            last = c;
            if (go) {
                int* hb = mt.h_blk;
                cudaCheck(cudaEventSynchronize(mt.staged));
                hb[SPEC_BLK_RES] = c;
                for (int t = 0; t <= c; t++) hb[SPEC_BLK_TOK + t] = tok[t];
                cudaCheck(cudaMemcpyAsync(mt.blk, hb, SPEC_BLK_DRAFT * sizeof(int), cudaMemcpyHostToDevice, e->stream));
                gpu_replay(e, &mt.draft[b], graph, [&] { gpu_spec_realign(e, T, b); });
                blk = gpu_spec_read(e);
            }
        }
        if (T > 1) { s.spec.rounds++; s.spec.drafted += T - 1; }
        else s.spec.fallback_steps++;
        // commit columns 0..last
        e->pos = n0 + last + 1;
        e->slot = snap[last];
        mt.pos = e->pos;
        x = tok[last];
        if (!go || e->pos == e->capacity) break;
        read_drafts(blk);
    }
    e->last_logits = nullptr;
    s.decode_s = now_s() - t0;
    return s;
}

// perplexity_cpu's contract on the gpu (non-overlapping windows, a fresh sequence each)
static double perplexity_gpu(GpuEngine* e, const std::vector<int>& ids, int window, int64_t* scored) {
    return perplexity_windows(ids, window, gpu_logits_piece(e), e->m->geo.vocab, scored, [&] { gpu_reset(e); },
                              [&](const int* x, int T, float* lg) { gpu_forward(e, x, nullptr, nullptr, T, lg, true); });
}

// device copy bandwidth, read + written bytes per second (GB/s): copy16_kernel over two buffers
// of `bytes` (1 GiB, well past the 60 MB l2), the median of 10 timed copies after 2 warm-ups
static double gpu_copy_bandwidth(GpuEngine* e, size_t bytes = 1ull << 30) {
    void *a, *b;
    cudaCheck(cudaMalloc(&a, bytes)); cudaCheck(cudaMalloc(&b, bytes));
    cudaCheck(cudaMemsetAsync(a, 1, bytes, e->stream));
    int sms = 0; cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, e->device));
    cudaEvent_t e0, e1; cudaCheck(cudaEventCreate(&e0)); cudaCheck(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int r = 0; r < 12; r++) {
        cudaCheck(cudaEventRecord(e0, e->stream));
        copy16_kernel<<<sms * 8, 512, 0, e->stream>>>((const uint4*)a, (uint4*)b, bytes / 16);
        cudaCheck(cudaGetLastError());
        cudaCheck(cudaEventRecord(e1, e->stream));
        cudaCheck(cudaEventSynchronize(e1));
        float t; cudaCheck(cudaEventElapsedTime(&t, e0, e1));
        if (r >= 2) ms.push_back(t);
    }
    cudaCheck(cudaEventDestroy(e0)); cudaCheck(cudaEventDestroy(e1));
    cudaCheck(cudaFree(a)); cudaCheck(cudaFree(b));
    std::sort(ms.begin(), ms.end());
    return 2.0 * bytes / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

// ---- the vision tower on the device -------------------------------------------------------
//
// only when vision is asked for (startup residency, reference-engine.md): the tower's weights
// get their own device arena, apart from the text model's, and a workspace for up to `cap`
// patches per item; without it nothing of the tower is on the device. one item at a time, as
// on the cpu (vision_forward_cpu is the oracle, with bf16 = true at the rounding points of the
// kernels above). the products are the text path's linear() over the stored formats.

struct GpuVision {
    cudaStream_t stream = nullptr;
    Geometry geo;             // the model's; the v_* part is what the tower uses
    VisionWeights w;          // views into `arena`
    uint8_t* arena = nullptr; // the vision tensors, each 256-byte aligned
    int cap = 0;              // patches per item the workspace holds
    void* ws = nullptr;       // the workspace, one allocation:
    float* pix = nullptr;     //   [cap, P] the pixel rows as the host gives them
    bf16_t* pixb = nullptr;   //   [cap, P]
    bf16_t* out = nullptr;    //   [cap/4, O] an item's output rows (mm_prepare_gpu)
    float* x = nullptr;       //   [cap, Dv] the residual stream
    float* y = nullptr;       //   [cap, max(3Dv, Iv, O/4)] product outputs
    bf16_t* xb = nullptr;     //   [cap, Dv] layernorm outputs
    bf16_t* qkv = nullptr;    //   [cap, 3Dv] rotated q, k and v
    bf16_t* att = nullptr;    //   [cap, Dv] attention output
    bf16_t* h = nullptr;      //   gelu outputs: [cap, Iv] or [cap/4, 4Dv], rows padded to 64 with zeros
};

// the workspace for items of up to cap patches (cap a multiple of 4)
static void gpu_vision_workspace(GpuVision* v, int cap) {
    const Geometry& g = v->geo;
    const int64_t P = vision_patch_len(g), D = g.v_dim;
    const int64_t ycols = std::max({3 * D, (int64_t)g.v_inter, (int64_t)CEIL_DIV(g.v_out, g.v_merge * g.v_merge)});
    const int64_t W4 = D * g.v_merge * g.v_merge;  // the merger's rows: cap / 4 of them
    const int64_t helems = std::max((int64_t)align_up(g.v_inter, GM_BK) * cap, (int64_t)align_up(W4, GM_BK) * (cap / 4));
    size_t off = 0;
    auto take = [&](size_t bytes) { size_t o = off; off += (bytes + 255) / 256 * 256; return o; };
    size_t o_pix = take(cap * P * 4), o_pixb = take(cap * P * 2), o_x = take(cap * D * 4), o_y = take(cap * ycols * 4),
           o_xb = take(cap * D * 2), o_qkv = take(cap * 3 * D * 2), o_att = take(cap * D * 2), o_h = take(helems * 2),
           o_out = take((size_t)cap / 4 * g.v_out * 2);
    cudaCheck(cudaMalloc(&v->ws, off));
    uint8_t* b = (uint8_t*)v->ws;
    v->pix = (float*)(b + o_pix); v->pixb = (bf16_t*)(b + o_pixb); v->x = (float*)(b + o_x); v->y = (float*)(b + o_y);
    v->xb = (bf16_t*)(b + o_xb); v->qkv = (bf16_t*)(b + o_qkv); v->att = (bf16_t*)(b + o_att); v->h = (bf16_t*)(b + o_h);
    v->out = (bf16_t*)(b + o_out);
    v->cap = cap;
}

// copy the model's vision tensors to the device and make the views; false with *err when the
// model has none or stores them in formats the kernels do not read
static bool gpu_vision_build(GpuVision* v, const Model* m, int cap, cudaStream_t stream, std::string* err) {
    *v = GpuVision();
    v->stream = stream; v->geo = m->geo; v->w = m->w.vision;
    const Geometry& g = m->geo;
    if (!g.has_vision) { *err = m->art.path + ": the model has no vision tower"; return false; }
    if (cap < 4 || cap % 4) { *err = "vision workspace of " + std::to_string(cap) + " patches: not a positive multiple of 4"; return false; }
    auto vec_ok = [](const Vec& x) { return x.format == FMT_BF16; };
    const VisionWeights& w = m->w.vision;
    bool ok = vec_ok(w.patch_bias) && vec_ok(w.merger_fc1_bias) && vec_ok(w.merger_fc2_bias) && vec_ok(w.merger_norm_w) &&
              vec_ok(w.merger_norm_b) && w.position_embedding.format == FMT_BF16;
    for (const VisionLayerWeights& L : w.layers)
        ok = ok && vec_ok(L.qkv_bias) && vec_ok(L.output_bias) && vec_ok(L.fc1_bias) && vec_ok(L.fc2_bias) && vec_ok(L.norm1_w) &&
             vec_ok(L.norm1_b) && vec_ok(L.norm2_w) && vec_ok(L.norm2_b);
    if (!ok) { *err = m->art.path + ": the gpu vision tower needs bf16 biases, norms and position table"; return false; }
    struct Span { const uint8_t* host; uint64_t bytes; size_t off; };
    std::vector<Span> spans;
    size_t total = 0;
    for (const TensorObject& t : m->art.objects) {
        if (t.resource || t.name.rfind("vision/", 0) != 0) continue;
        spans.push_back({t.data, t.bytes, total});
        total += (t.bytes + 255) / 256 * 256;
    }
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.host < b.host; });
    cudaCheck(cudaMalloc(&v->arena, total));
    for (const Span& s : spans) cudaCheck(cudaMemcpy(v->arena + s.off, s.host, s.bytes, cudaMemcpyHostToDevice));
    auto rebase = [&](const uint8_t* p) -> const uint8_t* {
        if (!p) return nullptr;
        auto it = std::upper_bound(spans.begin(), spans.end(), p, [](const uint8_t* q, const Span& s) { return q < s.host; });
        CHECK(it != spans.begin(), "gpu_vision_build: a view outside the vision tensors");
        --it;
        CHECK(p <= it->host + it->bytes, "gpu_vision_build: a view outside the vision tensors");
        return v->arena + it->off + (p - it->host);
    };
    auto mat = [&](Mat* x) { x->base = rebase(x->base); x->high = rebase(x->high); x->scale = rebase(x->scale); };
    auto vec = [&](Vec* x) { x->p = rebase(x->p); };
    VisionWeights& d = v->w;
    mat(&d.patch_embedding); vec(&d.patch_bias); mat(&d.position_embedding);
    for (VisionLayerWeights& L : d.layers) {
        mat(&L.qkv); vec(&L.qkv_bias); mat(&L.output); vec(&L.output_bias); mat(&L.fc1); vec(&L.fc1_bias); mat(&L.fc2); vec(&L.fc2_bias);
        vec(&L.norm1_w); vec(&L.norm1_b); vec(&L.norm2_w); vec(&L.norm2_b);
    }
    mat(&d.merger_fc1); vec(&d.merger_fc1_bias); mat(&d.merger_fc2); vec(&d.merger_fc2_bias); vec(&d.merger_norm_w); vec(&d.merger_norm_b);
    gpu_vision_workspace(v, cap);
    return true;
}

static void gpu_vision_free(GpuVision* v) {
    if (v->arena) cudaCheck(cudaFree(v->arena));
    if (v->ws) cudaCheck(cudaFree(v->ws));
    *v = GpuVision();
}

// the tower on one item (host pixel rows) into out: [tokens, v_out] bf16 on the device, the
// rows the text forward's embedding overrides take. asynchronous on v->stream.
static bool gpu_vision_forward(GpuVision* v, const VisionInput& in, bf16_t* out, std::string* err) {
    const Geometry& g = v->geo;
    const VisionWeights& w = v->w;
    if (!vision_input_ok(g, in, err)) return false;
    const int N = in.t * in.h * in.w, frame = in.h * in.w, D = g.v_dim, P = vision_patch_len(g), mg = g.v_merge;
    if (N > v->cap) { *err = "media item of " + std::to_string(N) + " patches: the vision workspace holds " + std::to_string(v->cap); return false; }
    cudaStream_t s = v->stream;
    auto bv = [](const Vec& x) { return (const bf16_t*)x.p; };
    cudaCheck(cudaMemcpyAsync(v->pix, in.pixels, (size_t)N * P * 4, cudaMemcpyHostToDevice, s));
    vis_cast(v->pix, (int64_t)N * P, v->pixb, s);
    vis_linear(w.patch_embedding, v->pixb, P, N, v->y, D, s);
    vis_embed(v->y, bv(w.patch_bias), (const bf16_t*)w.position_embedding.base, D, (int)lround(sqrt((double)g.v_pos)), N, in.h, in.w, mg,
              v->x, s);
    for (const VisionLayerWeights& L : w.layers) {
        vis_layernorm(v->x, bv(L.norm1_w), bv(L.norm1_b), D, N, g.eps, v->xb, s);
        vis_linear(L.qkv, v->xb, D, N, v->y, 3 * D, s);
        vis_qkv(v->y, bv(L.qkv_bias), D, g.v_heads, N, in.w, frame, mg, v->qkv, s);
        vis_attn(v->qkv, D, g.v_heads, N, frame, v->att, s);
        vis_linear(L.output, v->att, D, N, v->y, D, s);
        vis_bias(v->y, bv(L.output_bias), D, N, VIS_RESID, v->x, nullptr, s);
        vis_layernorm(v->x, bv(L.norm2_w), bv(L.norm2_b), D, N, g.eps, v->xb, s);
        vis_linear(L.fc1, v->xb, D, N, v->y, g.v_inter, s);
        const int ldh = (int)vis_k(L.fc2);
        vis_bias(v->y, bv(L.fc1_bias), g.v_inter, N, VIS_TANH, nullptr, v->h, s, ldh);
        vis_linear(L.fc2, v->h, ldh, N, v->y, D, s);
        vis_bias(v->y, bv(L.fc2_bias), D, N, VIS_RESID, v->x, nullptr, s);
    }
    const int M = N / (mg * mg), W4 = D * mg * mg;
    vis_layernorm(v->x, bv(w.merger_norm_w), bv(w.merger_norm_b), D, N, g.eps, v->xb, s);
    vis_linear(w.merger_fc1, v->xb, W4, M, v->y, W4, s);
    vis_bias(v->y, bv(w.merger_fc1_bias), W4, M, VIS_ERF, nullptr, v->h, s, (int)vis_k(w.merger_fc2));
    vis_linear(w.merger_fc2, v->h, (int)vis_k(w.merger_fc2), M, v->y, g.v_out, s);
    vis_bias(v->y, bv(w.merger_fc2_bias), g.v_out, M, VIS_NONE, nullptr, out, s);
    return true;
}

// mm_prepare_cpu with the gpu tower: each item's rows come back to the host (fp32 from bf16) for
// the prompt's override rows, which the text forward uploads again with its piece
// one item's rows on the host: [tokens, v_out] fp32 from the tower's bf16
static bool gpu_vision_rows(GpuVision* v, const VisionInput& in, float* out, std::vector<uint16_t>* rows, std::string* err) {
    if (!gpu_vision_forward(v, in, v->out, err)) return false;
    rows->resize((size_t)vision_tokens(v->geo, in) * v->geo.v_out);
    cudaCheck(cudaMemcpyAsync(rows->data(), v->out, rows->size() * 2, cudaMemcpyDeviceToHost, v->stream));
    cudaCheck(cudaStreamSynchronize(v->stream));
    for (size_t i = 0; i < rows->size(); i++) out[i] = bf16_to_f32((*rows)[i]);
    return true;
}
[[maybe_unused]] static bool mm_prepare_gpu(GpuVision* v, const Model* m, const VisionTokenIds& vt, const std::vector<int>& tokens,
                           const std::vector<VisionInput>& media, MmPrompt* p, std::string* err) {
    std::vector<uint16_t> rows;
    return mm_prepare(m, vt, tokens, media, p, err,
                      [&](const VisionInput& in, float* out, std::string* e) { return gpu_vision_rows(v, in, out, &rows, e); });
}

// === 9. engine ===============================================================
//
// one sequence on either path: the interface the cli (and the server) drive; then the
// server's retained prefixes over one or more such sequences (PrefixCache)

struct LaneSched;
struct Engine {
    const Model* m = nullptr;
    bool gpu = false;
    SpecOpts spec;         // --spec mtp --draft-tokens K [--lm-head-draft]
    RunState rs;           // cpu path
    SeqState st;
    SpecState sp;          // cpu path with spec
    GpuEngine* g = nullptr;  // gpu path
    int lane = 0;            // lanes: its index (gpu: the lane of g it is; g is lane 0's, the others share it)
    LaneSched* sched = nullptr;  // --max-concurrency > 1: the lanes' scheduler (engine_generate takes its steps)
};
// the gpu engine with this Engine's lane current (every gpu call of sections 9 and 11 goes
// through it: lanes take turns on the one GpuEngine)
static GpuEngine* engine_gpu(const Engine* en) {
    gpu_lane_select(en->g, en->lane);
    return en->g;
}

// cpu: max_context rows, prefill pieces of prefill_chunk; gpu: everything in o. with spec: the
// artifact must have what it needs (spec_check); the cpu sequence gets K+1 deltanet slots and
// the mtp kv cache (without spec, none of the mtp part). false with *err when it cannot start
// (the caller decides whether to fall back)
static bool engine_build(Engine* en, const Model* m, bool gpu, const GpuOpts& o, std::string* err, const SpecOpts& spec = SpecOpts()) {
    *en = Engine();
    en->m = m; en->gpu = gpu; en->spec = spec;
    if (!spec_check(m, spec, err)) return false;
    if (gpu) {
        GpuOpts go = o;
        go.spec = spec;
        if (spec.K) go.gdn_slots = std::max(go.gdn_slots, spec.K + 1);
        en->g = gpu_build(m, go, err);
        return en->g != nullptr;
    }
    seq_build(&en->st, m->geo, o.max_context, spec.K + 1, spec.K > 0);
    run_build(&en->rs, m->geo, std::max(std::min(o.prefill_chunk, o.max_context), spec.K + 1), o.max_context);
    if (spec.K) spec_build(&en->sp, m->geo, spec, en->rs.T_max);
    return true;
}
// engine_build on the gpu unless `cpu` or there is none (then a notice on stderr from `who`)
static bool engine_start(Engine* en, const Model* m, bool cpu, const GpuOpts& o, const SpecOpts& spec, const char* who, std::string* err) {
    bool gpu = !cpu && gpu_count() > 0;
    // the cpu reference keeps one fp32 kv of exactly --max-context rows: kv formats and pool
    // sizes are the gpu's, refused rather than ignored
    if (!gpu && (o.kv_capacity < 0 || (o.kv_capacity > 0 && o.kv_capacity != o.max_context))) {
        *err = "--kv-capacity is a gpu setting; the cpu reference path holds --max-context rows (give --max-context instead)";
        return false;
    }
    if (!gpu && o.kv != KV_BF16) { *err = "--kv-dtype int8 / fp8 are gpu kv formats; the cpu reference path keeps fp32 kv"; return false; }
    if (!cpu && !gpu) fprintf(stderr, "%s: no gpu found: running the cpu reference path\n", who);
    return engine_build(en, m, gpu, o, err, spec);
}
static void engine_free(Engine* en) {
    if (en->gpu) { if (en->lane == 0) gpu_free(en->g); }
    else if (en->st.block) { run_free(&en->rs); seq_free(&en->st); }
    *en = Engine();
}
// a lanes engine resets the Engine's lane only
static void engine_reset(Engine* en) {
    if (!en->gpu) seq_reset(&en->st);
    else if (en->g->o.lanes > 1) gpu_lane_reset(engine_gpu(en));
    else gpu_reset(en->g);
}
static int engine_pos(const Engine* en) { return en->gpu ? engine_gpu(en)->pos : en->st.pos; }
static int engine_capacity(const Engine* en) { return en->gpu ? en->g->capacity : en->st.capacity; }  // every lane's

// ---- lanes: many sequences taking their steps together (--max-concurrency) -------------------
//
// the server runs each request on its own thread and its own lane (an Engine: on the cpu a
// sequence state per lane, on the gpu a lane of the one GpuEngine). the device is one
// resource, so the lanes' work goes through LaneSched in steps of two kinds:
//   * an exclusive step: the lane's own work on the device, from its first turn (admission,
//     the media tower, prefix reuse, the prompt's prefill) in pieces of at most --prefill-chunk
//     tokens: the lane holds the turn and hands it back between pieces (sched_yield, the
//     prefill's cancel poll), and once more around prefix_finish; mtp rounds (--spec) too
//   * a decode step: one token for every lane that waits for one, batched. on the gpu one
//     forward call of all of them (gpu_decode_lanes: the weights read once a step); on the cpu
//     their forwards one after another.
// policy: a waiting exclusive piece goes after each decode step (a budget of one prefill piece
// per decode step), so a long prompt entering stalls the running streams by one piece at a
// time and is itself never starved; a decode step waits for the lanes of the previous one to
// ask again (each does host work between tokens: the sampler, the detokenizer, the stream)
// for at most LANE_WAIT_US, so the batch does not split in two. a lane that ends leaves the
// step at once; its next request, or another, may take the lane.
// the decode steps run on the scheduler's own thread (sched_runner): it starts the next step as
// soon as the last one's bookkeeping is done, with the lanes' queued tokens (below), instead of
// handing the device to a lane thread woken by the step's end (a wake-up and the mutex behind
// every woken lane: the served gap between steps, test/bench-notes.md, issue 14).
// a greedy lane (no bias, mask or tap: its pick is the step's argmax) and a sampled lane that
// draws in its step (no mask or tap: the step runs sample() with the scheduler's copy of its
// sampler, on the gpu the device sampler per lane, GpuTuning::lane_draw) do their host work
// while the next step runs: at the end of its step the scheduler queues the step's pick as the
// lane's next token (unless it is a stop id or the lane's limits end it there), so the next
// step can start as soon as the last one ends (the runner starts it then). a lane whose host
// work then ends it (a stop string, the client gone) waits for the step that takes its queued
// token (sched_done): its state holds that token too, fed back as every earlier one (its
// position says so, and prefix_finish keeps exactly the rows the state holds). taking the
// token back instead would save the lane at most a step, and only where a piece came first.
enum { LANE_WAIT_US = 5000 };
// what a lane's decode step lets the scheduler do at its end: queue the step's argmax as the
// lane's next token when it is none of `stops` (null: queue nothing)
struct LaneNext { const std::vector<int>* stops = nullptr; };
struct LaneSched {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Engine*> lanes;
    std::vector<char> busy;          // [lanes] a request holds the lane
    std::vector<char> held;          // [lanes] the lane holds the exclusive turn
    std::deque<int> turns;           // lanes waiting for an exclusive step, in order
    std::vector<int> want;           // [lanes] the token a lane waits to decode (-1: none)
    std::vector<char> row;           // [lanes] ... and wants its logits row
    std::vector<int> amax;           // [lanes][2] the argmax of its decode step k at [k & 1] (a queued step may end before the lane reads the one before)
    std::vector<int> domain;         // [lanes] the ids its argmax runs over (the cpu step takes it; the gpu's is the engine's)
    std::vector<uint64_t> steps;     // [lanes] decode steps done
    std::vector<LaneNext> next;      // [lanes] what its step in progress lets the scheduler queue
    std::vector<char> queued;        // [lanes] want holds the token the scheduler queued (the lane has not asked for it yet)
    std::vector<uint64_t> queued_at; // [lanes] ... the lane's steps when it was queued
    std::vector<char> expected;      // [lanes] in the last decode step and not back yet
    std::vector<std::vector<float>> rows;  // cpu lanes: [lanes][vocab] the last logits row
    // a sampled lane that draws in its step (generate_lane's `drawn`): its sampler, copied at its
    // first decode step and from then on advanced by the tokens its steps feed (on the gpu the
    // lane's device counts are, uploaded from this copy; the lane's own sampler counts the same
    // tokens as it emits them, beside the next step)
    std::vector<Sampler> draw;       // [lanes]
    std::vector<char> draw_on;       // [lanes] the lane draws in its steps
    std::vector<char> draw_fresh;    // [lanes] ... and draw's counts hold the token its next step feeds (no step yet)
    // the decode step's scratch, sized once (one step runs at a time): its lanes, their domains,
    // tokens, argmaxes and whether each wants its row
    std::vector<int> step_lanes, step_domain, step_ids, step_amax;
    std::unique_ptr<bool[]> step_rows, step_fresh;
    std::vector<const Sampler*> step_draw;
    bool step_any_draw = false;      // ... some lane of the step draws in it
    std::thread runner;              // the decode steps' thread (sched_runner; started by sched_build)
    std::condition_variable run_cv;  // ... waits on it: a lane's arrival, a turn's end, a lane done, the stop
    bool runner_idle = false;        // ... is waiting on run_cv
    bool wake_due = false;           // ... wakes the last step's lanes once the next step is launched
    bool stop = false;               // ... returns (sched_stop)
    bool running = false;            // a step is on the device
    bool piece_due = false;          // an exclusive piece goes before the next decode step
    double last_end = 0;             // when the last decode step ended
    bool back_to_back = false;       // ... with a lane queued, and no exclusive turn taken since
    uint64_t decode_steps = 0, decode_tokens = 0;  // statistics: lanes per decode step
    uint64_t decode_draws = 0;       // ... tokens drawn in the steps (sampled lanes')
    // ... seconds in the decode steps (host work, device, wait), and between a step that ended
    // with a lane queued and the next one when no exclusive turn came between (the time the
    // device idles for the scheduler alone); the stats line's figures since its last
    double step_s = 0, gap_s = 0;
    uint64_t gaps = 0;
    uint64_t stats_steps = 0, stats_tokens = 0;  // decode_steps / _tokens at the last stats line
    ~LaneSched();                    // sched_stop: the runner ends before the lanes it steps
};
static void sched_runner(LaneSched* ls);
static void sched_build(LaneSched* ls, const std::vector<Engine*>& lanes) {
    const size_t n = lanes.size();
    ls->lanes = lanes;
    ls->busy.assign(n, 0); ls->held.assign(n, 0); ls->want.assign(n, -1); ls->row.assign(n, 0);
    ls->amax.assign(2 * n, 0); ls->domain.assign(n, 0); ls->steps.assign(n, 0); ls->expected.assign(n, 0);
    ls->next.assign(n, LaneNext()); ls->queued.assign(n, 0); ls->queued_at.assign(n, 0);
    ls->rows.assign(n, {});
    ls->step_lanes.reserve(n); ls->step_domain.reserve(n); ls->step_ids.assign(n, 0); ls->step_amax.assign(n, 0);
    ls->step_rows.reset(new bool[n]); ls->step_fresh.reset(new bool[n]); ls->step_draw.assign(n, nullptr);
    ls->draw.assign(n, Sampler()); ls->draw_on.assign(n, 0); ls->draw_fresh.assign(n, 0);
    for (size_t k = 0; k < n; k++) {
        if (!lanes[k]->gpu) ls->rows[k].assign(lanes[k]->m->geo.vocab, 0.f);
        lanes[k]->sched = ls;
        lanes[k]->lane = (int)k;  // the scheduler's index (on the gpu also the GpuEngine's lane)
    }
    CHECK(!ls->runner.joinable(), "the lanes' scheduler built twice");
    ls->stop = false;
    ls->runner = std::thread(sched_runner, ls);
}
// the runner returns (it finishes a step in progress first); the lanes are idle or gone
static void sched_stop(LaneSched* ls) {
    if (!ls->runner.joinable()) return;
    { std::lock_guard<std::mutex> lk(ls->mu); ls->stop = true; ls->run_cv.notify_one(); }
    ls->runner.join();
}
LaneSched::~LaneSched() { sched_stop(this); }
// wake the runner where it waits (a lane's arrival, a turn's end, a lane done: each may make a
// step ready); the caller holds the mutex
static void sched_wake(LaneSched* ls) { if (ls->runner_idle) ls->run_cv.notify_one(); }
// a decode step may start: someone waits, and the lanes of the last step are back (or late)
static bool sched_decode_ready(const LaneSched* ls) {
    bool any = false, late = false;
    for (size_t k = 0; k < ls->want.size(); k++) {
        if (ls->want[k] >= 0) any = true;
        else if (ls->expected[k]) late = true;
    }
    return any && (!late || (now_s() - ls->last_end) * 1e6 >= LANE_WAIT_US);
}
// the lane's logits row of its last step, on the host
static float* sched_row(LaneSched* ls, int lane) {
    Engine* en = ls->lanes[lane];
    return en->gpu ? en->g->h_lane_logits + (size_t)lane * en->m->geo.vocab : ls->rows[lane].data();
}
// take the exclusive turn (in order; after a decode step's piece budget)
static void sched_turn(LaneSched* ls, int lane) {
    std::unique_lock<std::mutex> lk(ls->mu);
    if (ls->held[lane]) return;
    ls->turns.push_back(lane);
    ls->cv.wait(lk, [&] { return !ls->running && ls->turns.front() == lane && (ls->piece_due || !sched_decode_ready(ls)); });
    ls->turns.pop_front();
    ls->running = true; ls->held[lane] = 1; ls->back_to_back = false;
}
static void sched_turn_end(LaneSched* ls, int lane) {
    std::lock_guard<std::mutex> lk(ls->mu);
    if (!ls->held[lane]) return;
    ls->held[lane] = 0; ls->running = false; ls->piece_due = false;
    ls->cv.notify_all();
    sched_wake(ls);
}
// between two pieces of exclusive work: a decode step may run
static void sched_yield(LaneSched* ls, int lane) {
    sched_turn_end(ls, lane);
    sched_turn(ls, lane);
}
// the decode step of the lanes ls->step_lanes (the caller holds the device: running), in two
// halves: sched_launch_decode queues it on the gpu (nothing on the cpu), sched_finish_decode
// waits for it (on the cpu runs it) and leaves each lane's pick in ls->amax. step_domain[i]: the
// ids lane step_lanes[i]'s argmax runs over (taken under the lock: the lane may ask again
// meanwhile)
static void sched_launch_decode(LaneSched* ls) {
    const std::vector<int>& batch = ls->step_lanes;
    Engine* en0 = ls->lanes[batch[0]];
    const int n = (int)batch.size();
    for (int k : batch) {  // a drawing lane's sampler counts the token its step feeds (sampler_accept before its next sample();
        // on the gpu the lane's device counts do, and the copy was only the upload's source)
        if (!en0->gpu && ls->draw_on[k] && !ls->draw_fresh[k]) sampler_accept(&ls->draw[k], ls->want[k]);
        ls->decode_draws += ls->draw_on[k] != 0;
    }
    if (!en0->gpu) return;
    int* ids = ls->step_ids.data();
    bool* rows = ls->step_rows.get();
    bool* fresh = ls->step_fresh.get();
    bool any = false;
    for (int i = 0; i < n; i++) {
        const int k = batch[i];
        ids[i] = ls->want[k]; rows[i] = ls->row[k];
        ls->step_draw[i] = ls->draw_on[k] ? &ls->draw[k] : nullptr; fresh[i] = ls->draw_fresh[k];
        any |= ls->draw_on[k] != 0;
    }
    ls->step_any_draw = any;
    gpu_lanes_launch(en0->g, n, batch.data(), ids, rows, any ? ls->step_draw.data() : nullptr, fresh);
}
static void sched_finish_decode(LaneSched* ls) {
    const std::vector<int>& batch = ls->step_lanes;
    const std::vector<int>& domain = ls->step_domain;
    Engine* en0 = ls->lanes[batch[0]];
    const int n = (int)batch.size();
    if (en0->gpu) {
        int* amax = ls->step_amax.data();
        gpu_lanes_wait(en0->g, n, batch.data(), amax, ls->step_any_draw ? ls->step_draw.data() : nullptr);
        for (int i = 0; i < n; i++) ls->amax[2 * batch[i] + ((ls->steps[batch[i]] + 1) & 1)] = amax[i];
        return;
    }
    for (int i = 0; i < n; i++) {  // the cpu reference: the lanes one after another
        const int lane = batch[i];
        Engine* en = ls->lanes[lane];
        int id = ls->want[lane];
        float* row = ls->rows[lane].data();
        forward_cpu(en->m, &en->rs, &en->st, &id, nullptr, nullptr, 1, row, false, nullptr);
        ls->amax[2 * lane + ((ls->steps[lane] + 1) & 1)] = ls->draw_on[lane] ? sample(&ls->draw[lane], row, (uint64_t)en->st.pos, RNG_DECODE)
                                                                              : argmax(row, domain[i]);  // sample()'s greedy pick
    }
}
// one decode token for the lane (its turn not held): wait for the step that takes it; the
// step's argmax (over the lane's first `domain` ids) is returned, the logits row (row, or
// always on the cpu) is at sched_row. id is the token the scheduler queued when it did (the
// last step's pick: the lane asks for exactly that one). next: what this step lets the
// scheduler queue at its end. smp (non-null): the lane draws in its steps, and the pick
// returned is sample()'s with this sampler at the lane's new position (RNG_DECODE), which the
// first call of a generation copies (its counts holding id already)
static int sched_decode(LaneSched* ls, int lane, int id, bool row, int domain, LaneNext next, const Sampler* smp = nullptr) {
    // the copy (a vocabulary of counts) outside the lock: only this lane's thread sets draw_on
    // (here and in sched_done), and no step reads the lane's copy before it is set
    const bool first_draw = smp && !ls->draw_on[lane];
    if (first_draw) sampler_copy(&ls->draw[lane], *smp);
    std::unique_lock<std::mutex> lk(ls->mu);
    CHECK(!ls->held[lane], "lane %d decodes while it holds the turn", lane);
    if (first_draw) { ls->draw_on[lane] = 1; ls->draw_fresh[lane] = 1; }
    uint64_t mine = ls->steps[lane];
    if (ls->queued[lane]) {
        mine = ls->queued_at[lane];
        CHECK(ls->amax[2 * lane + (mine & 1)] == id, "lane %d asks for token %d, the scheduler queued %d", lane, id, ls->amax[2 * lane + (mine & 1)]);
        ls->queued[lane] = 0;
    } else {
        ls->want[lane] = id; ls->row[lane] = row; ls->expected[lane] = 0;
    }
    ls->domain[lane] = domain; ls->next[lane] = next;
    // the runner alone is woken: waking every waiting lane at each arrival was a thundering
    // herd on the one mutex (test/bench_sched.cc, bench-notes)
    sched_wake(ls);
    ls->cv.wait(lk, [&] { return ls->steps[lane] != mine; });
    return ls->amax[2 * lane + ((mine + 1) & 1)];
}
// the decode steps' thread: a step of every lane that waits, whenever one is ready (no
// exclusive piece due first, the device free). at a step's end it queues each lane's next token
// where it may (LaneSched's header) and, the mutex still held, looks for the next step at once
static void sched_runner(LaneSched* ls) {
    if (ls->lanes[0]->gpu) cudaCheck(cudaSetDevice(ls->lanes[0]->g->device));  // the engine's device on this thread too
    std::unique_lock<std::mutex> lk(ls->mu);
    bool next = false;  // the last step's end found the next one ready, the mutex held since
    while (!ls->stop) {
        const bool pieces = ls->piece_due && !ls->turns.empty();
        if (!next && (ls->running || pieces || !sched_decode_ready(ls))) {
            if (ls->wake_due) { ls->wake_due = false; ls->cv.notify_all(); }  // (the step's end said a step follows: it always does)
            bool any = false;
            for (int w : ls->want) any |= w >= 0;
            ls->runner_idle = true;
            if (any && !ls->running && !pieces) ls->run_cv.wait_for(lk, std::chrono::microseconds(LANE_WAIT_US));  // a late lane
            else ls->run_cv.wait(lk);
            ls->runner_idle = false;
            continue;
        }
        next = false;
        ls->step_lanes.clear(); ls->step_domain.clear();
        for (int k = 0; k < (int)ls->want.size(); k++)
            if (ls->want[k] >= 0) { ls->step_lanes.push_back(k); ls->step_domain.push_back(ls->domain[k]); }
        ls->running = true;
        const double t0 = now_s();
        if (ls->back_to_back) { ls->gap_s += t0 - ls->last_end; ls->gaps++; }
        const bool wake = ls->wake_due;
        ls->wake_due = false;
        lk.unlock();
        sched_launch_decode(ls);
        if (wake) ls->cv.notify_all();  // the last step's lanes, while this one runs (waking 64 threads takes ~0.1 ms)
        sched_finish_decode(ls);
        lk.lock();
        bool queued = false;
        for (int k : ls->step_lanes) {
            ls->want[k] = -1; ls->steps[k]++; ls->expected[k] = 1; ls->draw_fresh[k] = 0;
            const int a = ls->amax[2 * k + (ls->steps[k] & 1)];
            const std::vector<int>* stops = ls->next[k].stops;
            ls->next[k] = LaneNext();
            if (!stops || std::find(stops->begin(), stops->end(), a) != stops->end()) continue;
            ls->want[k] = a; ls->row[k] = 0; ls->expected[k] = 0;  // queued: the lane is back already
            ls->queued[k] = 1; ls->queued_at[k] = ls->steps[k];
            queued = true;
        }
        ls->decode_steps++; ls->decode_tokens += ls->step_lanes.size();
        ls->running = false; ls->piece_due = true; ls->last_end = now_s();
        ls->step_s += ls->last_end - t0; ls->back_to_back = queued;
        // the step's lanes are woken by the next step's launch where one follows at once, else
        // here (a piece due, a lane late, or none waiting)
        next = !(ls->piece_due && !ls->turns.empty()) && sched_decode_ready(ls);
        if (next) ls->wake_due = true;
        else ls->cv.notify_all();
    }
}
// the lane is done decoding: the next step does not wait for it. a token queued for it is
// in a step or in the next one: the lane waits for that step's end (its state then holds the
// token: the caller reads the lane's position)
static void sched_done(LaneSched* ls, int lane) {
    std::unique_lock<std::mutex> lk(ls->mu);
    if (ls->queued[lane]) {
        ls->cv.wait(lk, [&] { return ls->steps[lane] != ls->queued_at[lane]; });
        ls->queued[lane] = 0;
    }
    ls->expected[lane] = 0;
    ls->draw_on[lane] = 0; ls->draw_fresh[lane] = 0;
    ls->cv.notify_all();
    sched_wake(ls);
}

// how a lane's decode steps pick its tokens, for a sampler with no mask or tap (`plain`):
// greedy without a bias: the step's argmax (no row to the host on the gpu); sampled (or biased):
// the step draws the pick (drawn: on the gpu where the device sampler takes the sampler). either
// way the scheduler may queue it as the next token (LaneSched's header); neither: the host
// samples the step's logits row (sample())
struct LanePick { bool greedy, drawn; };
static LanePick lane_pick(const Engine* en, const Sampler* smp, bool plain) {
    LanePick p;
    p.greedy = plain && smp->p.temperature <= 0.0f && smp->p.logit_bias.empty();
    p.drawn = plain && !p.greedy && (!en->gpu || gpu_lane_draw_ok(en->g, smp));  // en->g: engine_gpu would select the lane (its turn is not held)
    return p;
}

// generate_cpu's contract for a lane of a LaneSched, on either path: the caller holds the
// lane's turn (the prefill's pieces hand it back between them through the cancel poll, as
// sched_yield); after the prompt the turn goes back and every token is a decode step. the
// sampler runs on the host on the step's logits row for a lane with a mask or a tap (and on
// the gpu where the lanes' draws cannot take it); otherwise the step picks (greedy: its
// argmax; sampled: its draw, sample() with a copy of the sampler), without the row's copy on
// the gpu, and the scheduler may queue the pick as its next token.
template <typename Emit>
static GenStats generate_lane(Engine* en, Sampler* smp, const std::vector<int>& prompt, int max_new, const std::vector<int>& stop_ids,
                              const GenTap* tap, Emit emit, const GenCancel& cancel, const MmPrompt* mm, GenConstraint* gc) {
    LaneSched* ls = en->sched;
    const int lane = en->lane;
    const Geometry& g = en->m->geo;
    GenStats s;
    s.prompt = (int)prompt.size();
    const bool all_rows = tap && tap->prompt_rows;
    const int piece = en->gpu ? (all_rows ? gpu_logits_piece(en->g) : en->g->T_max) : all_rows ? logits_piece(&en->rs, g.vocab) : en->rs.T_max;
    std::vector<float> logits(all_rows ? (size_t)piece * g.vocab : 0);
    float* row = sched_row(ls, lane);
    double t0 = now_s();
    sched_turn(ls, lane);
    s.cancelled = !prefill_pieces(prompt, engine_pos(en), piece, g.H, mm, [&](int i) { return i > 0 && cancel.fn && cancel(); },
                                  [&](const int* ids, const float* rows, const int* pos3, int T, bool last) {
        float* out = all_rows ? logits.data() : last ? row : nullptr;
        if (en->gpu) {
            GpuEngine* e = engine_gpu(en);
            gpu_forward(e, ids, rows, pos3, T, all_rows ? out : nullptr, all_rows, nullptr, all_rows || last);
            if (last && !all_rows) {
                cudaCheck(cudaMemcpyAsync(row, e->last_logits, (size_t)g.vocab * 4, cudaMemcpyDeviceToHost, e->stream));
                cudaCheck(cudaStreamSynchronize(e->stream));
            }
        } else {
            forward_cpu(en->m, &en->rs, &en->st, ids, rows, pos3, T, out, all_rows, nullptr);
        }
        if (!all_rows) return;
        tap->prompt_rows(tap->ctx, logits.data(), T, g.vocab);
        if (last) memcpy(row, logits.data() + (size_t)(T - 1) * g.vocab, sizeof(float) * g.vocab);
    });
    if (mm && !s.cancelled) { if (en->gpu) engine_gpu(en)->rope_delta = mm->rope_delta; else en->st.rope_delta = mm->rope_delta; }
    int pos = engine_pos(en);  // from here on the lane's pos is kept here: the gpu's current lane is not ours between turns
    sched_turn_end(ls, lane);
    s.prefill_s = now_s() - t0;
    if (s.cancelled) return s;
    t0 = now_s();
    constraint_start(gc);
    const LanePick lp = lane_pick(en, smp, !gc && !(tap && tap->sampled));
    const bool greedy = lp.greedy, drawn = lp.drawn;
    const bool fast = greedy || drawn;
    int amax = -1;
    for (int n = 0; n < max_new; n++) {
        int id;
        if (fast && n > 0) id = amax;
        else {
            smp->mask = constraint_mask(gc);
            id = sample(smp, row, pos, n == 0 ? RNG_PREFILL : RNG_DECODE);
            smp->mask = nullptr;
        }
        if (tap && tap->sampled) tap->sampled(tap->ctx, row, g.vocab, id);
        if (!gen_take(&s, id, stop_ids, gc, emit, [&] { sampler_accept(smp, id); })) break;
        if (n + 1 == max_new || pos == engine_capacity(en)) break;
        LaneNext next;  // the next token may be queued where the next turn of this loop would ask for it
        if (fast && n + 2 < max_new && pos + 1 < engine_capacity(en)) next.stops = &stop_ids;
        amax = sched_decode(ls, lane, id, !fast, smp->domain, next, drawn ? smp : nullptr);
        pos++;
    }
    sched_done(ls, lane);
    s.decode_s = now_s() - t0;
    return s;
}

// mm: a multimodal prompt (mm_prepare_cpu), of which `prompt` is the part not yet in the sequence
// gc: a constraint (GenConstraint); not with --spec: there is no constrained round (the server
// and the cli refuse the pair)
template <typename Emit>
static GenStats engine_generate(Engine* en, Sampler* smp, const std::vector<int>& prompt, int max_new, const std::vector<int>& stop_ids,
                                const GenTap* tap, Emit emit, const GenCancel& cancel = GenCancel(), const MmPrompt* mm = nullptr,
                                GenConstraint* gc = nullptr) {
    CHECK(!en->spec.K || !(gc && gc->m), "a constraint with --spec");
    if (en->sched && !en->spec.K) return generate_lane(en, smp, prompt, max_new, stop_ids, tap, emit, cancel, mm, gc);
    if (en->spec.K && !tap && !mm) {
        if (en->gpu) return generate_spec_gpu(engine_gpu(en), smp, prompt, max_new, stop_ids, emit, cancel);
        return generate_spec_cpu(en->m, &en->rs, &en->st, &en->sp, smp, prompt, max_new, stop_ids, emit, cancel);
    }
    // a multimodal prompt decodes one token at a time even with --spec: the mtp rows of vision
    // tokens (their embedding overrides, m-rope positions) are not built. the output is the
    // same (speculation is lossless); the statistics say so: every token a fallback step.
    // (a tap has no per-id rows in a round: the server refuses logprobs with --spec, the cli
    // --logits-out.)
    CHECK(!en->spec.K || !tap, "--logits-out or logprobs with --spec");
    GenStats s = en->gpu ? generate_gpu(engine_gpu(en), smp, prompt, max_new, stop_ids, tap, emit, cancel, mm, gc)
                         : generate_cpu(en->m, &en->rs, &en->st, smp, prompt, max_new, stop_ids, tap, emit, cancel, mm, gc);
    if (en->spec.K) { s.spec.K = en->spec.K; s.spec.fallback_steps = s.generated; }
    return s;
}
static double engine_perplexity(Engine* en, const std::vector<int>& ids, int window, int64_t* scored) {
    if (en->gpu) return perplexity_gpu(engine_gpu(en), ids, window, scored);
    return perplexity_cpu(en->m, &en->rs, &en->st, ids, window, scored);
}

// ---- prefix reuse: retained prefixes in state-slot tiers ------------------------------------
//
// the server keeps one live sequence (the Engine) and retained prefixes of earlier requests.
// an entry is the token list of a sequence at a reusable boundary and what continues it
// exactly: its state image (every gdn layer's conv and recurrent state; on the cpu with
// --spec also the mtp's pending row, below) in a device slot or a pinned host slot, and its kv
// rows, which are either the live sequence's own rows (while the live rows hold the entry's
// tokens: "live-backed") or a pinned host copy. there is no longest-common-prefix reuse: the
// deltanet state cannot be rebuilt from kv rows, so a request continues only from an entry
// whose tokens its prompt starts with (reference-engine.md 14).
//   - tiers: --device-state-slots images on the device (gdn slots after the live pair),
//     --host-state-slots pinned host images, --host-kv-mib pinned host bytes of kv copies
//     (allocated per entry as needed, up to the budget). a new image goes to a free device
//     slot; with none free a device image spills to a host slot (a host entry is evicted for it
//     when they are all taken); with no host slots it is dropped. the victim in a full tier is
//     the new entry's own ancestor when it has one there (the previous turn of the same
//     conversation, superseded by this one), else the least recently used. restoring reads
//     either tier straight into the live state.
//   - kv: before live rows from r on are overwritten (a request starting at r), every other
//     live-backed entry longer than r gets a host copy of its rows (evicting the least
//     recently used copies to make room) or, when it cannot fit, is dropped. restoring a
//     host-backed entry copies back only the rows the live sequence does not already hold.
//   - exactness: an entry is used only when the prompt starts with its tokens, and leaves at
//     least one prompt token to prefill (the first output is sampled from that row's logits).
// the capture points are the server's (served_generate: the template boundaries); this part
// knows only tokens. one lane at a time (the one whose turn it is: LaneRing).

struct PrefixOpts {
    bool on = false;              // --no-prefix-reuse turns it off
    int dev_slots = 0;            // --device-state-slots
    int host_slots = 0;           // --host-state-slots
    int64_t host_kv_bytes = 0;    // --host-kv-mib
};

struct PrefixEntry {
    std::vector<int> tok;         // the prefix: rows [0, n) with n = tok.size()
    int dev = -1, host = -1;      // its image: a device slot or a host slot (exactly one)
    uint8_t* kv = nullptr;        // host copy of kv rows [0, n), n * row_bytes; null: live-backed
    int lane = -1;                // live-backed: the lane whose live rows hold them
    std::vector<float> bridge;    // cpu --spec: main hidden row n-1 (the mtp row n-1 waits for token n)
    std::vector<uint16_t> gbridge;  // gpu --spec: the same row in bf16 when the row is pending (else empty:
                                  // the entry was kept after a response, its mtp rows complete)
    uint64_t used = 0;            // lru clock
};

struct PrefixCache {
    PrefixOpts o;
    bool gpu = false;
    size_t image_bytes = 0, row_bytes = 0;   // one state image; one kv row of every attention layer
    int first_dev_slot = 0;       // gpu: the gdn slot of device image 0 (the last dev_slots slots)
    uint8_t* dev_img = nullptr;   // cpu: [dev_slots] images (the gpu's are gdn slots)
    std::vector<uint8_t*> host_img;  // [host_slots] images, pinned on the gpu path
    std::list<PrefixEntry> entries;
    std::vector<Engine*> lanes;   // the live sequences (--max-concurrency; the gpu has one)
    std::vector<std::vector<int>> live;     // per lane: the tokens of its kv rows [0, size); their state is its live one
    std::vector<std::vector<float>> bridge; // per lane, cpu --spec: the pending mtp input (st.mtp_pos == pos - 1)
    int64_t host_kv_used = 0;
    uint64_t clock = 0;
    std::vector<float> logits;    // cpu: one row for the boundary prefill
    long spills = 0, kv_copies = 0, drops = 0, host_restores = 0;  // for the tests and the log
};

static uint8_t* prefix_host_alloc(const PrefixCache* pc, size_t bytes) {
    uint8_t* p = nullptr;
    if (pc->gpu) { if (cudaHostAlloc((void**)&p, bytes, cudaHostAllocDefault) != cudaSuccess) { cudaGetLastError(); return nullptr; } }
    else p = (uint8_t*)malloc(bytes);
    return p;
}
static void prefix_host_free(const PrefixCache* pc, uint8_t* p) {
    if (!p) return;
    if (pc->gpu) cudaCheck(cudaFreeHost(p)); else free(p);
}

// the live state <-> the images and kv rows, on either path
static void cpu_image(SeqState* st, const Geometry& g, uint8_t* img, bool save) {
    size_t off = 0;
    for (int l = 0; l < g.L; l++) {
        if (g.full[l]) continue;
        float* c = st->conv[l]; float* r = st->rec[l];
        const size_t cb = st->conv_n * 4, rb = st->rec_n * 4;
        if (save) { memcpy(img + off, c, cb); memcpy(img + off + cb, r, rb); }
        else { memcpy(c, img + off, cb); memcpy(r, img + off + cb, rb); }
        off += cb + rb;
    }
}
static void cpu_kv_rows(SeqState* st, const Geometry& g, int a, int b, int n, uint8_t* host, bool to_host) {
    const size_t row = (size_t)g.Hkv * g.head_dim * 4;
    size_t off = 0;
    auto plane = [&](float* p) {
        uint8_t* d = (uint8_t*)p + (size_t)a * row; uint8_t* h = host + off + (size_t)a * row;
        if (b > a) memcpy(to_host ? h : d, to_host ? d : h, (size_t)(b - a) * row);
        off += (size_t)n * row;
    };
    for (int l = 0; l < g.L; l++) if (g.full[l]) { plane(st->key[l]); plane(st->value[l]); }
    if (st->mtp_key) { plane(st->mtp_key); plane(st->mtp_value); }
}
static void prefix_image_save(PrefixCache* pc, Engine* en, const PrefixEntry& e) {  // live -> e's slot
    if (en->gpu) {
        if (e.dev >= 0) gpu_snapshot(engine_gpu(en), pc->first_dev_slot + e.dev);
        else gpu_image_host(engine_gpu(en), engine_gpu(en)->slot, pc->host_img[e.host], true);
    } else cpu_image(&en->st, en->m->geo, e.dev >= 0 ? pc->dev_img + e.dev * pc->image_bytes : pc->host_img[e.host], true);
}
static void prefix_image_load(PrefixCache* pc, Engine* en, const PrefixEntry& e) {  // e's slot -> live
    if (e.host >= 0) pc->host_restores++;
    if (en->gpu) {
        if (e.dev >= 0) gpu_restore(engine_gpu(en), pc->first_dev_slot + e.dev, engine_gpu(en)->pos);
        else gpu_image_host(engine_gpu(en), engine_gpu(en)->slot, pc->host_img[e.host], false);
    } else cpu_image(&en->st, en->m->geo, e.dev >= 0 ? pc->dev_img + e.dev * pc->image_bytes : pc->host_img[e.host], false);
}
static void prefix_image_spill(PrefixCache* pc, Engine* en, int dev, int host) {  // device image -> host slot
    if (en->gpu) gpu_image_host(engine_gpu(en), pc->first_dev_slot + dev, pc->host_img[host], true);
    else memcpy(pc->host_img[host], pc->dev_img + dev * pc->image_bytes, pc->image_bytes);
    pc->spills++;
}
static void prefix_kv_rows(Engine* en, int a, int b, int n, uint8_t* host, bool to_host) {
    if (en->gpu) gpu_kv_rows_host(engine_gpu(en), a, b, n, host, to_host);
    else cpu_kv_rows(&en->st, en->m->geo, a, b, n, host, to_host);
}
// kv rows [a, b) from one lane's sequence to another's (dst holds pages for b rows)
static void prefix_kv_lane_copy(Engine* dst, Engine* src, int a, int b) {
    if (dst->gpu) { gpu_kv_lane_copy(dst->g, dst->lane, src->lane, a, b); return; }
    const Geometry& g = dst->m->geo;
    const size_t row = (size_t)g.Hkv * g.head_dim * 4;
    auto plane = [&](float* d, const float* s) { if (b > a) memcpy((uint8_t*)d + (size_t)a * row, (const uint8_t*)s + (size_t)a * row, (size_t)(b - a) * row); };
    for (int l = 0; l < g.L; l++) if (g.full[l]) { plane(dst->st.key[l], src->st.key[l]); plane(dst->st.value[l], src->st.value[l]); }
    if (dst->st.mtp_key) { plane(dst->st.mtp_key, src->st.mtp_key); plane(dst->st.mtp_value, src->st.mtp_value); }
}
// a fresh live sequence that leaves the images and kv rows alone (engine_reset clears all
// state slots): zero deltanet state in the live slot(s), position 0
static void prefix_reset_live(Engine* en) {
    const Geometry& g = en->m->geo;
    if (en->gpu) {
        gpu_lane_reset(engine_gpu(en));
        return;
    }
    SeqState* st = &en->st;
    for (int l = 0; l < g.L; l++)
        if (!g.full[l]) { memset(st->conv0[l], 0, st->gdn_slots * st->conv_n * 4); memset(st->rec0[l], 0, st->gdn_slots * st->rec_n * 4); }
    st->pos = st->rope_delta = st->mtp_pos = 0;
    seq_set_slot(st, 0);
}
static void prefix_seek(Engine* en, int pos) {
    if (en->gpu) { GpuEngine* e = engine_gpu(en); e->pos = pos; e->rope_delta = 0; e->last_logits = nullptr; }
    else { en->st.pos = pos; en->st.rope_delta = 0; }
}

static bool prefix_build(PrefixCache* pc, const std::vector<Engine*>& lanes, const PrefixOpts& o, std::string* err) {
    Engine* en = lanes[0];
    const Geometry& g = en->m->geo;
    pc->o = o;
    pc->gpu = en->gpu;
    pc->lanes = lanes;
    pc->live.assign(lanes.size(), {});
    pc->bridge.assign(lanes.size(), {});
    if (!en->gpu) pc->logits.assign(g.vocab, 0.0f);  // the split prefill runs with reuse off too
    if (!o.on) return true;
    if (en->gpu) {
        pc->image_bytes = gpu_gdn_bytes(g, 1);
        pc->row_bytes = gpu_kv_bytes_per_row(g, en->g->o.kv) * (g.n_full + (en->g->mtp.K ? 1 : 0)) / g.n_full;
        pc->first_dev_slot = en->g->n_slots - o.dev_slots;
        CHECK(pc->first_dev_slot >= en->g->shared_slot0, "%d gdn slots for %d device state slots", en->g->n_slots, o.dev_slots);
    } else {
        pc->image_bytes = (size_t)g.n_gdn * (en->st.conv_n + en->st.rec_n) * 4;
        pc->row_bytes = (size_t)(g.n_full + (en->st.mtp_key ? 1 : 0)) * 2 * g.Hkv * g.head_dim * 4;
        if (o.dev_slots > 0 && !(pc->dev_img = (uint8_t*)malloc(o.dev_slots * pc->image_bytes))) {
            *err = "out of memory for " + std::to_string(o.dev_slots) + " device state slots"; return false;
        }
    }
    for (int i = 0; i < o.host_slots; i++) {
        uint8_t* p = prefix_host_alloc(pc, pc->image_bytes);
        if (!p) {
            char b[256];
            snprintf(b, sizeof b, "cannot pin %d host state slots of %.1f MiB (--host-state-slots)", o.host_slots, pc->image_bytes / 1048576.0);
            *err = b; return false;
        }
        pc->host_img.push_back(p);
    }
    return true;
}
static void prefix_free(PrefixCache* pc) {
    for (PrefixEntry& e : pc->entries) prefix_host_free(pc, e.kv);
    for (uint8_t* p : pc->host_img) prefix_host_free(pc, p);
    free(pc->dev_img);
    *pc = PrefixCache();
}

static int prefix_common(const std::vector<int>& a, const std::vector<int>& b) {
    size_t n = std::min(a.size(), b.size()), i = 0;
    while (i < n && a[i] == b[i]) i++;
    return (int)i;
}
static void prefix_drop(PrefixCache* pc, std::list<PrefixEntry>::iterator it) {
    if (it->kv) { prefix_host_free(pc, it->kv); pc->host_kv_used -= (int64_t)(it->tok.size() * pc->row_bytes); }
    pc->entries.erase(it);
    pc->drops++;
}
// the least recently used entry matching pred, or end
template <typename Pred>
static std::list<PrefixEntry>::iterator prefix_lru(PrefixCache* pc, Pred pred) {
    auto best = pc->entries.end();
    for (auto it = pc->entries.begin(); it != pc->entries.end(); ++it)
        if (pred(*it) && (best == pc->entries.end() || it->used < best->used)) best = it;
    return best;
}
// give a live-backed entry its own host copy of its kv rows; false when the budget cannot hold it
static bool prefix_keep_kv(PrefixCache* pc, std::list<PrefixEntry>::iterator it, std::list<PrefixEntry>::iterator keep) {
    const int n = (int)it->tok.size();
    const int64_t bytes = (int64_t)n * pc->row_bytes;
    if (bytes > pc->o.host_kv_bytes) return false;
    const PrefixEntry* kp = keep == pc->entries.end() ? nullptr : &*keep;
    while (pc->host_kv_used + bytes > pc->o.host_kv_bytes) {
        auto v = prefix_lru(pc, [&](const PrefixEntry& e) { return e.kv && &e != &*it && &e != kp; });
        if (v == pc->entries.end()) return false;
        prefix_drop(pc, v);
    }
    it->kv = prefix_host_alloc(pc, bytes);
    if (!it->kv) return false;
    prefix_kv_rows(pc->lanes[it->lane], 0, n, n, it->kv, true);
    pc->host_kv_used += bytes;
    pc->kv_copies++;
    return true;
}
// a lane's live rows from r on are about to change: every other entry they back that is longer
// than r keeps its rows on the host or goes
static void prefix_protect(PrefixCache* pc, int lane, int r, std::list<PrefixEntry>::iterator keep) {
    for (auto it = pc->entries.begin(); it != pc->entries.end();) {
        auto nx = std::next(it);
        if (it != keep && !it->kv && it->lane == lane && (int)it->tok.size() > r && !prefix_keep_kv(pc, it, keep)) prefix_drop(pc, it);
        it = nx;
    }
}

// place the live sequence for `prompt`: continue from the longest entry the prompt starts
// with (lookup) or start afresh. returns the tokens reused (the sequence's position); *tier
// says where the state came from: "device", "host", "miss" (or "off")
static int prefix_begin(PrefixCache* pc, int lane, const std::vector<int>& prompt, bool lookup, const char** tier) {
    Engine* en = pc->lanes[lane];
    *tier = "off";
    if (!pc->o.on) { engine_reset(en); return 0; }
    *tier = lookup ? "miss" : "off";
    auto best = pc->entries.end();
    if (lookup)
        for (auto it = pc->entries.begin(); it != pc->entries.end(); ++it) {
            const size_t n = it->tok.size();
            if (n < prompt.size() && (best == pc->entries.end() || n > best->tok.size()) &&
                std::equal(it->tok.begin(), it->tok.end(), prompt.begin()))
                best = it;
        }
    if (best == pc->entries.end()) {
        prefix_protect(pc, lane, 0, best);
        prefix_reset_live(en);
        pc->live[lane].clear(); pc->bridge[lane].clear();
        return 0;
    }
    // the rows this lane already holds; the rest from the host copy or the lane that backs it
    const int n = (int)best->tok.size(), c = std::min(n, prefix_common(best->tok, pc->live[lane]));
    CHECK(c == n || best->kv || best->lane != lane, "a live-backed prefix of %d rows whose rows its lane lost at %d", n, c);
    prefix_protect(pc, lane, c, best);
    if (c < n) {
        if (best->kv) prefix_kv_rows(en, c, n, n, best->kv, false);
        else prefix_kv_lane_copy(en, pc->lanes[best->lane], c, n);
    }
    pc->live[lane] = best->tok;
    prefix_seek(en, n);
    prefix_image_load(pc, en, *best);
    if (!en->gpu && en->spec.K) { en->st.mtp_pos = n - 1; pc->bridge[lane] = best->bridge; }
    if (en->gpu && en->spec.K) {
        if (best->gbridge.empty()) engine_gpu(en)->mtp.pos = n;
        else { gpu_spec_bridge_host(engine_gpu(en), best->gbridge.data(), false); engine_gpu(en)->mtp.pos = n - 1; }
    }
    best->used = ++pc->clock;
    *tier = best->dev >= 0 ? "device" : "host";
    return n;
}

// --spec: the mtp row pos-1 (token pos with the main hidden row pos-1) once token pos is known
static void prefix_bridge(PrefixCache* pc, int lane, int next) {
    Engine* en = pc->lanes[lane];
    if (en->gpu && en->spec.K) { gpu_spec_bridge(engine_gpu(en), next); return; }
    if (en->gpu || !en->spec.K || en->st.mtp_pos != en->st.pos - 1) return;
    CHECK((int)pc->bridge[lane].size() == en->m->geo.H, "the mtp row %d has no hidden row", en->st.mtp_pos);
    mtp_forward_cpu(en->m, &en->rs, &en->st, &next, nullptr, pc->bridge[lane].data(), nullptr, 1, nullptr, false, nullptr);
}

// append ids[0, T) to the live sequence without sampling (a boundary's prefill); false when
// cancel stopped it (the sequence holds the pieces done)
static bool prefix_prefill(PrefixCache* pc, int lane, const int* ids, int T, const GenCancel& cancel) {
    Engine* en = pc->lanes[lane];
    const Geometry& g = en->m->geo;
    const int piece = en->gpu ? engine_gpu(en)->T_max : en->rs.T_max;
    for (int i = 0; i < T; i += piece) {
        if (en->gpu && i > 0 && cancel.fn) cudaCheck(cudaStreamSynchronize(engine_gpu(en)->stream));
        if (cancel()) return false;
        const int t = std::min(piece, T - i);
        if (en->gpu && en->spec.K) gpu_spec_prefill(engine_gpu(en), ids + i, t);  // the mtp rows too, the last one pending
        else if (en->gpu) gpu_forward(engine_gpu(en), ids + i, nullptr, nullptr, t, nullptr, false);
        else if (!en->spec.K) forward_cpu(en->m, &en->rs, &en->st, ids + i, nullptr, nullptr, t, pc->logits.data(), false, nullptr);
        else {  // the mtp rows of the same positions, all but the last (its token is the next piece's first)
            prefix_bridge(pc, lane, ids[i]);
            float* hid = en->sp.hid.data();
            forward_cpu(en->m, &en->rs, &en->st, ids + i, nullptr, nullptr, t, pc->logits.data(), false, hid);
            if (t > 1) mtp_forward_cpu(en->m, &en->rs, &en->st, ids + i + 1, nullptr, hid, nullptr, t - 1, nullptr, false, nullptr);
            pc->bridge[lane].assign(hid + (size_t)(t - 1) * g.H, hid + (size_t)t * g.H);
        }
        pc->live[lane].insert(pc->live[lane].end(), ids + i, ids + i + t);
    }
    if (en->gpu) cudaCheck(cudaStreamSynchronize(engine_gpu(en)->stream));
    return true;
}

static void prefix_capture(PrefixCache* pc, int lane);

// a generation's placing: the live sequence continues from the longest retained prefix of
// `prompt` (reuse) or starts afresh, and is prefilled up to the last of `splits` (ascending
// token indices), with a piece boundary at each: the state at `capture` (one of them) is kept.
// the generation's own prompt is then prompt[*at:] (its mtp bridge done). false when cancel
// stopped the prefill. *start: the tokens reused.
// why splits: the gpu's prefill rounds differently with its piece boundaries (the deltanet's
// chunk grid, the decode kernels for short pieces), and a continued prefix was prefilled in
// pieces cut where its own requests were cut. cutting every prompt at every template turn
// opener, whether or not anything is reused (and with --no-prefix-reuse), makes a request that
// continues from a turn boundary compute bit for bit what the same prompt computes from scratch.
static bool prefix_prepare(PrefixCache* pc, int lane, const std::vector<int>& prompt, const std::vector<int>& splits, int capture,
                           bool reuse, const GenCancel& cancel, int* start, int* at, const char** tier) {
    *start = *at = prefix_begin(pc, lane, prompt, reuse, tier);
    for (int b : splits) {
        if (b <= *at || b >= (int)prompt.size()) continue;
        if (!prefix_prefill(pc, lane, prompt.data() + *at, b - *at, cancel)) return false;
        *at = b;
        if (reuse && b == capture) prefix_capture(pc, lane);
    }
    if (*at > 0) prefix_bridge(pc, lane, prompt[*at]);
    return true;
}

// after a generation: the live rows hold the prompt, then the ids fed back (out: every id
// emitted, in order); rows that are no one's prefix (a media prompt's: keep false) are
// forgotten. replay: keep the state after the response too (cpu --spec cannot: the round
// leaves no pending mtp row to key)
static void prefix_finish(PrefixCache* pc, int lane, const std::vector<int>& prompt, const std::vector<int>& out, bool keep, bool replay) {
    if (!pc->o.on) return;
    Engine* en = pc->lanes[lane];
    std::vector<int>& live = pc->live[lane];
    const int pos = engine_pos(en);
    live.assign(prompt.begin(), prompt.begin() + std::min<int>(pos, (int)prompt.size()));
    for (int k = 0; (int)live.size() < pos && k < (int)out.size(); k++) live.push_back(out[k]);
    if (!keep || (int)live.size() != pos) { prefix_reset_live(en); live.clear(); pc->bridge[lane].clear(); }
    else if (replay && (en->gpu || !en->spec.K)) prefix_capture(pc, lane);
}

// retain a lane's live sequence as it is now (its tokens are pc->live[lane])
static void prefix_capture(PrefixCache* pc, int lane) {
    Engine* en = pc->lanes[lane];
    const std::vector<int>& live = pc->live[lane];
    if (!pc->o.on || live.empty() || (pc->o.dev_slots == 0 && pc->o.host_slots == 0)) return;
    CHECK((int)live.size() == engine_pos(en), "live tokens %zu at position %d", live.size(), engine_pos(en));
    for (PrefixEntry& e : pc->entries)
        if (e.tok == live) { e.used = ++pc->clock; return; }  // the same state, already kept
    PrefixEntry ne;
    ne.tok = live;
    ne.lane = lane;
    auto taken = [&](bool dev, int k) {
        for (const PrefixEntry& e : pc->entries) if ((dev ? e.dev : e.host) == k) return true;
        return false;
    };
    // the victim in a full tier: the new entry's own ancestors first (the earlier checkpoints of
    // the same conversation, which its next turn no longer needs), then the least recently used
    auto ancestor = [&](const PrefixEntry& e) {
        return e.tok.size() < ne.tok.size() && std::equal(e.tok.begin(), e.tok.end(), ne.tok.begin());
    };
    auto victim = [&](bool dev) {
        auto v = prefix_lru(pc, [&](const PrefixEntry& e) { return (dev ? e.dev : e.host) >= 0 && ancestor(e); });
        return v != pc->entries.end() ? v : prefix_lru(pc, [&](const PrefixEntry& e) { return (dev ? e.dev : e.host) >= 0; });
    };
    auto free_host = [&]() -> int {  // a free host slot, evicting a host entry when they are all taken
        for (int k = 0; k < pc->o.host_slots; k++) if (!taken(false, k)) return k;
        auto v = victim(false);
        const int k = v->host;
        prefix_drop(pc, v);
        return k;
    };
    for (int k = 0; k < pc->o.dev_slots && ne.dev < 0; k++) if (!taken(true, k)) ne.dev = k;
    if (ne.dev < 0 && pc->o.dev_slots > 0) {  // the device tier is full: its lru image moves down
        auto v = victim(true);
        ne.dev = v->dev;
        if (pc->o.host_slots == 0) prefix_drop(pc, v);
        else { const int h = free_host(); prefix_image_spill(pc, en, v->dev, h); v->dev = -1; v->host = h; }
    }
    if (ne.dev < 0) ne.host = free_host();
    if (!en->gpu && en->spec.K) ne.bridge = pc->bridge[lane];
    if (en->gpu && en->spec.K && engine_gpu(en)->mtp.pos == engine_gpu(en)->pos - 1) {
        ne.gbridge.resize(en->m->geo.H);
        gpu_spec_bridge_host(engine_gpu(en), ne.gbridge.data(), true);
    }
    ne.used = ++pc->clock;
    prefix_image_save(pc, en, ne);
    pc->entries.push_back(std::move(ne));
}

// === 10. info =================================================================

static const char* const kResourceNames[] = {
    "frontend/tokenizer.json", "frontend/tokenizer_config.json", "frontend/chat_template.jinja",
    "frontend/generation_config.json", "frontend/preprocessor_config.json", "frontend/video_preprocessor_config.json"};

// the class of an object, for --info's totals
static const char* object_class(const TensorObject& t) {
    if (t.resource) return "resources";
    if (t.name.rfind("text/draft_head", 0) == 0) return "draft head";
    if (t.name.rfind("text/", 0) == 0) return "text";
    if (t.name.rfind("mtp/", 0) == 0) return "mtp";
    if (t.name.rfind("vision/", 0) == 0) return "vision";
    return "other";
}

static void print_info(FILE* f, const Model* m) {
    const Artifact& a = m->art;
    const Geometry& g = m->geo;
    fprintf(f, "file            %s (%llu bytes, container v%d, %zu objects)\n", a.path.c_str(),
            (unsigned long long)a.file_size, a.version, a.objects.size());
    fprintf(f, "model_id        %s\n", a.model_id.c_str());
    if (a.version >= 2) fprintf(f, "weights_id      %s\n", a.weights_id.c_str());
    fprintf(f, "hidden          %d\n", g.H);
    fprintf(f, "layers          %d (%d gated deltanet, %d full attention:", g.L, g.n_gdn, g.n_full);
    for (int l = 0; l < g.L; l++) if (g.full[l]) fprintf(f, " %d", l);
    fprintf(f, ")\n");
    fprintf(f, "attention       %d query heads, %d kv heads, head dim %d, rope dims %d\n", g.Hq, g.Hkv, g.head_dim, g.rope_dim);
    fprintf(f, "deltanet        %d key heads, %d value heads, head dims %d/%d, conv %d x %d\n", g.Hk, g.Hv, g.dk, g.dv, g.conv_k, g.conv_dim);
    fprintf(f, "mlp             %d\n", g.I);
    fprintf(f, "vocab           %d rows, %s output head\n", g.vocab, g.tied ? "tied (embedding)" : "untied");
    fprintf(f, "mtp             %s\n", g.has_mtp ? "present (1 layer)" : "absent");
    if (g.draft_rows) fprintf(f, "draft head      %d rows\n", g.draft_rows);
    else fprintf(f, "draft head      absent\n");
    if (g.has_vision)
        fprintf(f, "vision          depth %d, width %d, %d heads (head dim %d), mlp %d, out %d\n", g.v_depth, g.v_dim,
                g.v_heads, g.v_dim / g.v_heads, g.v_inter, g.v_out);
    else fprintf(f, "vision          absent\n");
    // object classes with format totals
    const char* classes[] = {"text", "draft head", "mtp", "vision", "resources"};
    fprintf(f, "objects:\n");
    for (const char* c : classes) {
        uint64_t total = 0, count = 0, by_fmt[FMT_COUNT] = {}, n_fmt[FMT_COUNT] = {};
        for (const TensorObject& t : a.objects) {
            if (strcmp(object_class(t), c) != 0) continue;
            total += t.bytes; count++;
            if (!t.resource) { by_fmt[t.format] += t.bytes; n_fmt[t.format]++; }
        }
        if (!count) continue;
        fprintf(f, "  %-12s %5llu objects %15llu bytes", c, (unsigned long long)count, (unsigned long long)total);
        for (int k = 0; k < FMT_COUNT; k++)
            if (n_fmt[k]) fprintf(f, "  %s x%llu (%llu B)", format_name((NumFormat)k), (unsigned long long)n_fmt[k], (unsigned long long)by_fmt[k]);
        fprintf(f, "\n");
    }
    fprintf(f, "resources:\n");
    for (const char* r : kResourceNames) {
        const TensorObject* t = artifact_find(&a, r);
        if (t && t->resource) fprintf(f, "  %-40s %llu bytes\n", r, (unsigned long long)t->bytes);
        else fprintf(f, "  %-40s absent\n", r);
    }
}

// === 11. text and serving =====================================================
//
// the path from text to text, shared by the cli and the server: render the chat template,
// tokenize, generate on either path (Engine: cpu reference or gpu), and split the output
// into reasoning, content and tool calls with stop strings (tokenizer.h's TextOut).

// the vision side of a loaded model, only when vision is on (startup residency: without it
// media is refused and nothing of the tower is on the device)
struct TextVision {
    bool on = false;
    VisionConfig cfg;            // the artifact's preprocessor configs
    MediaLimits lim;             // per item (vision.h)
    double frames_fps = 24;      // a frame list's rate (--video-fps)
    bool local_files = true;     // paths and file:// allowed (the cli); the server takes data: uris only
    int threads = 1;             // preprocessing threads (NInfer: at most 16)
    GpuVision gpu;               // the device tower, when the engine is on the gpu
    bool gpu_on = false;
    // the media cache (--media-cache-mib): tower rows by item, so an image sent again in a later
    // turn is not encoded again. keyed by the sha-256 of the item's grid and pixel rows (the
    // preprocessed content: the same picture under another name or encoding that preprocesses
    // the same hits too). least recently used entries go first. engine thread only.
    struct CacheEntry { std::string key; std::vector<float> rows; uint64_t used = 0; };
    int64_t cache_cap = 0;       // bytes of rows kept; 0: no cache
    int64_t cache_bytes = 0;
    uint64_t cache_clock = 0;
    std::vector<CacheEntry> cache;
    int64_t cache_hits = 0, cache_misses = 0;
};

// a loaded model with its tokenizer and its engine (one sequence)
struct TextModel {
    Model m;
    Tokenizer tok;
    FrontendIds fr;
    SpecOpts spec;   // set before text_model_start
    Engine en;
    TextVision vis;
    GrammarVocab gvocab;  // the vocabulary's byte trie for constrained decoding, built at the first use
    std::mutex gvocab_mu; // (by the first of the server's lanes that needs it)
};

// open the artifact and its tokenizer (no engine yet: text_model_start builds it)
static bool text_model_open(TextModel* t, const char* path, std::string* err) {
    if (!model_open(&t->m, path, err)) return false;
    std::string tj = artifact_resource(&t->m.art, "frontend/tokenizer.json");
    if (tj.empty()) { *err = t->m.art.path + ": no frontend/tokenizer.json resource"; return false; }
    std::string terr;
    if (!tokenizer_load(&t->tok, tj.data(), tj.size(), &terr)) { *err = t->m.art.path + ": frontend/tokenizer.json: " + terr; return false; }
    if (!frontend_ids(&t->m, &t->fr, err)) return false;
    // a default eos id outside the domain can never be sampled: drop it
    std::vector<int> stops;
    for (int id : t->fr.stops) if (id >= 0 && id < t->fr.domain) stops.push_back(id);
    t->fr.stops = stops;
    return true;
}

// build the engine (engine_start)
static bool text_model_start(TextModel* t, bool cpu, const GpuOpts& o, const char* who, std::string* err) {
    return engine_start(&t->en, &t->m, cpu, o, t->spec, who, err);
}

static void text_model_close(TextModel* t) {
    if (t->vis.gpu_on) gpu_vision_free(&t->vis.gpu);
    engine_free(&t->en);
    model_close(&t->m);
}

// one generation request in token space, with its output handling
struct TextRequest {
    std::vector<int> prompt;
    bool thinking_open = false;       // the prompt ends inside <think>: output starts as reasoning
    bool raw = false;                 // no reasoning/content split, special tokens kept (--raw-output)
    bool tools = false;               // parse <tool_call> blocks
    bool plain = false;               // a completion: content only, stop strings only (OutputParser::plain)
    std::vector<std::string> stop, reasoning_stop;  // stop strings per channel
    std::vector<int> stop_ids;        // model defaults + caller's
    int max_new = 128;
    SamplerParams sp;
    GenCancel cancel;                 // polled between prefill pieces
    const GenTap* tap = nullptr;      // the prompt's logits and the sampled rows (GenTap)
    // called for every emitted id before its text is parsed, with the channel the parser is
    // in (OUT_REASONING, OUT_CONTENT, OUT_TOOL_CALL): the channel the token's text starts in
    void (*on_token)(void* ctx, int id, int channel) = nullptr;
    void* token_ctx = nullptr;
    const MmPrompt* mm = nullptr;     // the prompt's media rows and positions (text_media_tower), if any
    bool keep = false;                // continue the sequence where it stands (the server placed it: prefix
                                      // reuse); else start afresh
    Engine* engine = nullptr;         // the sequence to run on (the server's lanes); null: the model's own
    std::shared_ptr<const Grammar> grammar;  // constrain the output (the content, after the reasoning) to it
};

struct TextResult {
    GenStats gen;                     // gen.complete: the grammar's structure was completed
    std::string stop_hit;  // the stop string that ended generation, if one did
    int tool_calls = 0;
    std::string error;     // the request's grammar could not start (nothing was generated)
};

// ---- media in a conversation ----------------------------------------------------------
//
// the call chain: the media parts of the messages (chat_media: references in the order the
// template renders them) -> vision.h's vision_prepare (decode + preprocess on host threads) ->
// chat_render -> vision_expand_prompt (model.md 6.5) -> tokenizer_encode -> the tower
// (mm_prepare_cpu | mm_prepare_gpu) -> engine_generate with the MmPrompt. the first four run
// where the request is prepared (the server: on a connection thread, so usage and count_tokens
// see the vision tokens); the tower runs where the engine does.

// NInfer's per-request vision budgets (reference-engine.md 17), beside vision.h's per-item limits
struct MediaBudget {
    int max_items = 16;
    int64_t max_bytes = 256ll << 20;   // encoded media bytes, summed over the request
    int64_t max_patches = 131072;      // raw patches (t*h*w), summed
    int64_t max_tokens = 32768;        // vision tokens, summed
};

// the media of a request, preprocessed
struct MediaPrompt {
    std::vector<VisionItem> items;     // in prompt order
};

// vision on for t: the artifact's tower and processor configs (before the engine is built)
static bool text_vision_open(TextModel* t, const TextVision& opts, std::string* err) {
    if (!t->m.geo.has_vision) { *err = t->m.art.path + ": the model has no vision tower; images and video need a vision model"; return false; }
    t->vis.on = true;
    t->vis.lim = opts.lim; t->vis.frames_fps = opts.frames_fps; t->vis.local_files = opts.local_files; t->vis.threads = opts.threads;
    t->vis.cache_cap = opts.cache_cap;
    std::string e;
    if (!vision_config_parse(artifact_resource(&t->m.art, "frontend/preprocessor_config.json"),
                             artifact_resource(&t->m.art, "frontend/video_preprocessor_config.json"), &t->vis.cfg, &e)) {
        *err = t->m.art.path + ": " + e;
        return false;
    }
    return true;
}

// the device tower beside a gpu engine (after text_model_start); a workspace for the largest
// item the processor configs allow, at most the request's patch budget
static bool text_vision_start(TextModel* t, std::string* err) {
    if (!t->vis.on || !t->en.gpu) return true;
    const VisionConfig& c = t->vis.cfg;
    const int64_t per = (int64_t)c.patch * c.patch;
    int64_t cap = std::max<int64_t>(c.max_pixels / per, c.video_max_pixels / per / std::max(1, c.temporal));  // a video's pixels are all its frames'
    cap = std::min<int64_t>(cap, MediaBudget().max_patches) / 4 * 4;
    if (!gpu_vision_build(&t->vis.gpu, &t->m, (int)std::max<int64_t>(cap, 4), 0, err)) return false;
    t->vis.gpu_on = true;
    return true;
}

// a media reference of a part: a string, or {url: string} for the *_url forms
static const Json* chat_media_ref(const Json& part, const char* key) {
    const Json* v = part.get(key);
    if (v && v->is_object()) v = v->get("url");
    return v && v->is_string() ? v : nullptr;
}

// the media parts of messages (NInfer's names: image / image_url, video / video_url; a string or
// {url} each) as preprocessing jobs in the order the template renders them; each part becomes
// the template's plain {"type": "image" | "video"}. false with *err naming the message and part.
static bool chat_media(Json* messages, bool local_files, std::vector<MediaJob>* jobs, std::string* err) {
    jobs->clear();
    if (!messages->is_array()) return true;
    for (size_t mi = 0; mi < messages->arr.size(); mi++) {
        Json* content = messages->arr[mi].is_object() ? messages->arr[mi].get("content") : nullptr;
        if (!content || !content->is_array()) continue;
        for (size_t pi = 0; pi < content->arr.size(); pi++) {
            Json& part = content->arr[pi];
            const Json* ty = part.is_object() ? part.get("type") : nullptr;
            if (!ty || !ty->is_string()) continue;
            const std::string type = ty->str;
            const bool video = type == "video" || type == "video_url";
            if (!video && type != "image" && type != "image_url") continue;
            const std::string where = "message " + std::to_string(mi) + ", part " + std::to_string(pi);
            const Json* ref = chat_media_ref(part, type.c_str());
            if (!ref) { *err = where + ": the " + type + " part needs '" + type + "', a string" + (type.size() > 5 && type.back() == 'l' ? " or {\"url\": string}" : ""); return false; }
            const std::string& r = ref->str;
            if (r.rfind("http://", 0) == 0 || r.rfind("https://", 0) == 0) {
                *err = where + ": http(s) media urls are not fetched (ninfer fetches nothing); send the " + (video ? "video" : "image") + " as a base64 data: uri";
                return false;
            }
            if (!local_files && r.rfind("data:", 0) != 0) {
                *err = where + ": the server reads no local files; send the " + std::string(video ? "video" : "image") + " as a base64 data: uri";
                return false;
            }
            MediaJob j;
            j.video = video; j.ref = r;
            jobs->push_back(std::move(j));
            Json plain = Json::object();
            plain.set("type", Json::string(video ? "video" : "image"));
            part = std::move(plain);
        }
    }
    return true;
}

enum { PROMPT_BAD_INPUT = 0, PROMPT_OVER_BUDGET = 1, PROMPT_RENDER = 2 };  // why text_prompt failed

// messages (openai shape) -> the prompt's tokens in rq and its preprocessed media in *mp: render,
// expand and tokenize. budget: the request's (the server's; nullptr: none). false with *err and
// *why (a PROMPT_ value).
static bool text_prompt(TextModel* t, Json messages, const Json* tools, const ChatOptions& co, const MediaBudget* budget,
                        TextRequest* rq, MediaPrompt* mp, std::string* err, int* why = nullptr) {
    int why_ = 0;
    if (!why) why = &why_;
    *why = PROMPT_BAD_INPUT;
    std::vector<MediaJob> jobs;
    if (!chat_media(&messages, t->vis.local_files, &jobs, err)) return false;
    if (!jobs.empty() && !t->vis.on) { *err = "images and video need vision (ninfer-serve --vision)"; return false; }
    auto over = [&](const std::string& what) { *err = what; *why = PROMPT_OVER_BUDGET; return false; };
    if (budget) {
        if ((int)jobs.size() > budget->max_items)
            return over(std::to_string(jobs.size()) + " media items, over the request budget of " + std::to_string(budget->max_items));
        int64_t bytes = 0;
        for (const MediaJob& j : jobs) bytes += (int64_t)j.ref.size() / 4 * 3;  // data: uris, base64
        if (bytes > budget->max_bytes)
            return over("about " + std::to_string(bytes) + " media bytes, over the request budget of " + std::to_string(budget->max_bytes));
    }
    if (!chat_from_openai(&messages, err)) return false;
    std::string rendered;
    TextSpans literal, expanded_literal;  // the conversation's own text: tokenized literally, never a placeholder
    if (!chat_render(messages, tools, co, &rendered, err, &literal)) { *why = PROMPT_RENDER; return false; }
    mp->items.clear();
    std::string text = rendered;
    if (!jobs.empty()) {
        vision_prepare(&jobs, t->vis.cfg, t->vis.lim, t->vis.frames_fps, t->vis.threads);
        std::vector<const VisionItem*> images, videos;
        int64_t patches = 0, tokens = 0;
        for (MediaJob& j : jobs) {
            if (!j.ok) { *err = j.err; return false; }
            patches += j.item.rows(); tokens += j.item.tokens(t->vis.cfg.merge);
            mp->items.push_back(std::move(j.item));
        }
        if (budget && patches > budget->max_patches)
            return over(std::to_string(patches) + " vision patches, over the request budget of " + std::to_string(budget->max_patches));
        if (budget && tokens > budget->max_tokens)
            return over(std::to_string(tokens) + " vision tokens, over the request budget of " + std::to_string(budget->max_tokens));
        for (const VisionItem& it : mp->items) (it.video ? videos : images).push_back(&it);
        if (!vision_expand_prompt(rendered, images, videos, t->vis.cfg.merge, &text, err, &literal, &expanded_literal)) return false;
        literal.swap(expanded_literal);
    }
    tokenizer_encode(&t->tok, text, &rq->prompt, true, &literal);
    rq->thinking_open = chat_thinking_open(rendered);
    rq->tools = tools != nullptr;
    return true;
}

// the media cache's key of an item: its kind, grid and pixel rows
static std::string media_cache_key(const VisionItem& it) {
    std::string k = std::string(it.video ? "video " : "image ") + std::to_string(it.t) + " " + std::to_string(it.h) + " " +
                    std::to_string(it.w) + " ";
    for (double s : it.timestamps) k += std::to_string(s) + " ";
    return k + sha256_hex((const uint8_t*)it.pixels.data(), it.pixels.size() * sizeof(float));
}

// the tower over a prepared prompt's media: the MmPrompt engine_generate takes (cpu or gpu
// tower), each item's rows from the media cache when it holds them
static bool text_media_tower(TextModel* t, const std::vector<int>& prompt, const MediaPrompt& mp, MmPrompt* mm, std::string* err) {
    TextVision& v = t->vis;
    std::vector<VisionInput> media;
    if (!vision_inputs_of(t->m.geo, mp.items, &media, err)) return false;
    auto tower = [&](const VisionInput& in, float* out, std::string* e) {
        const size_t k = (size_t)(&in - media.data()), n = (size_t)vision_tokens(t->m.geo, in) * t->m.geo.H;
        std::string key;
        if (v.cache_cap > 0) {
            key = media_cache_key(mp.items[k]);
            for (TextVision::CacheEntry& c : v.cache)
                if (c.key == key && c.rows.size() == n) {
                    memcpy(out, c.rows.data(), n * sizeof(float));
                    c.used = ++v.cache_clock;
                    v.cache_hits++;
                    return true;
                }
        }
        std::vector<uint16_t> rows;
        const bool ok = v.gpu_on ? gpu_vision_rows(&v.gpu, in, out, &rows, e) : vision_forward_cpu(&t->m, in, out, e);
        if (!ok || v.cache_cap <= 0) return ok;
        v.cache_misses++;
        const int64_t bytes = (int64_t)(n * sizeof(float));
        if (bytes > v.cache_cap) return true;  // larger than the whole cache: not kept
        while (v.cache_bytes + bytes > v.cache_cap) {  // evict the least recently used
            size_t lru = 0;
            for (size_t i = 1; i < v.cache.size(); i++) if (v.cache[i].used < v.cache[lru].used) lru = i;
            v.cache_bytes -= (int64_t)(v.cache[lru].rows.size() * sizeof(float));
            v.cache.erase(v.cache.begin() + (long)lru);
        }
        v.cache.push_back({key, std::vector<float>(out, out + n), ++v.cache_clock});
        v.cache_bytes += bytes;
        return true;
    };
    return mm_prepare(&t->m, t->fr.vision, prompt, media, mm, err, tower);
}

// run rq on t's engine from an empty sequence. on_event(const OutEvent&, int id) gets every
// piece of output as it is decoded and returns false to stop (e.g. the client left); each
// event's bytes are complete utf-8.
// the matcher of a request's grammar over t's vocabulary (the trie is built once: the domain's
// token bytes, control tokens left out; the stop ids end a completed structure). false and
// *err when the grammar matches nothing.
static bool text_constraint(TextModel* t, const TextRequest& rq, GrammarMatcher* m, GenConstraint* gc, std::string* err) {
    std::lock_guard<std::mutex> lk(t->gvocab_mu);
    if (!t->gvocab.n) {
        std::vector<std::string> bytes(t->fr.domain);
        for (int id = 0; id < t->fr.domain; id++)
            if (!tokenizer_is_special(&t->tok, id)) bytes[id] = tokenizer_token_bytes(&t->tok, id);
        vocab_build(&t->gvocab, bytes, t->fr.stops);
    }
    if (!matcher_init(m, rq.grammar, &t->gvocab, err)) return false;
    gc->m = m;
    gc->open_id = -1;
    if (rq.thinking_open) {
        gc->open_id = tokenizer_find(&t->tok, "</think>");
        if (gc->open_id < 0) { *err = "constrained output with thinking needs a </think> token, which this tokenizer does not have"; return false; }
    }
    return true;
}

template <typename OnEvent>
static TextResult generate_text(TextModel* t, const TextRequest& rq, OnEvent on_event) {
    TextResult res;
    Sampler smp;
    sampler_build(&smp, rq.sp, t->fr.domain);
    GrammarMatcher matcher;
    GenConstraint gc;
    if (rq.grammar && !text_constraint(t, rq, &matcher, &gc, &res.error)) return res;
    Engine* en = rq.engine ? rq.engine : &t->en;
    if (!rq.keep) engine_reset(en);
    TextOut to;
    text_out_init(&to, rq.thinking_open, rq.raw);
    to.parser.stop = rq.stop;
    to.parser.reasoning_stop = rq.reasoning_stop;
    to.parser.parse_tools = rq.tools;
    to.parser.plain = rq.plain;
    std::vector<OutEvent> evs;
    bool alive = true;
    res.gen = engine_generate(en, &smp, rq.prompt, rq.max_new, rq.stop_ids, rq.tap, [&](int id) -> bool {
        if (rq.on_token) rq.on_token(rq.token_ctx, id, to.parser.mode);
        bool go = text_out_push(&to, &t->tok, id, &evs);
        for (const OutEvent& e : evs) if (alive && !on_event(e, id)) alive = false;
        evs.clear();
        if (!go) res.stop_hit = to.parser.stop_hit;
        return go && alive;
    }, rq.cancel, rq.mm, rq.grammar ? &gc : nullptr);
    if (res.stop_hit.empty() && alive) {  // flush what the decoder and the parser still hold
        text_out_finish(&to, &evs);
        for (const OutEvent& e : evs) if (alive && !on_event(e, -1)) alive = false;
    }
    res.tool_calls = to.parser.tool_calls;
    return res;
}

// ---- the server's engine (serve.h's interface) --------------------------------

// --max-concurrency lanes: serve.h calls generate on up to C threads at once; each request
// takes a free lane (the one whose sequence already holds the longest part of the prompt) and
// its steps go through the lanes' scheduler (LaneSched, section 9: exclusive pieces and
// batched decode steps). on the gpu a lane first reserves the kv pages its request can fill
// (prompt + max_tokens, at most --max-context rows: admission by free pages, so a running lane
// never waits for a page); pages short, it takes them from idle lanes (their retained prefixes
// are dropped or copied to the host tier first) or waits for a lane to end.
struct ServedModel {
    ServeEngine api;  // what serve.h sees; api.self points back here
    TextModel t;
    std::vector<std::unique_ptr<Engine>> extra;  // lanes 1..C-1 (lane 0 is t.en)
    std::vector<Engine*> lanes;
    LaneSched sched;  // C > 1
    std::vector<double> idle_since;  // [lanes] when the lane's last request ended (reclaim order)
    PrefixCache pc;   // retained prefixes (the lane with the turn)
    int im_start = -1;  // the template's turn opener id: reuse boundaries sit before the open turn's
};

// lane k's live rows go back to the pool: the prefixes they back are copied to the host tier
// or dropped (under the turn of the lane that asks)
static void lane_evict(ServedModel* s, int k) {
    GpuEngine* e = s->lanes[k]->g;
    const int cur = e->lane;
    prefix_protect(&s->pc, k, 0, s->pc.entries.end());
    prefix_reset_live(s->lanes[k]);
    gpu_lane_trim(e, k, 0);
    s->pc.live[k].clear(); s->pc.bridge[k].clear();
    gpu_lane_select(e, cur);
}
// kv pages for `rows` rows of the lane, from the pool or from idle lanes (least recently used
// first); false when the pool cannot hold them now, and then the lane holds no pages (its own
// kept rows go too: lanes that wait hold nothing, so they wait only for running ones)
static bool lane_pages(ServedModel* s, int lane, int rows) {
    Engine* en = s->lanes[lane];
    if (!en->gpu || en->g->o.lanes <= 1) return true;
    GpuEngine* e = en->g;
    for (;;) {
        if (gpu_lane_reserve(e, lane, rows)) return true;
        int victim = -1;
        for (int k = 0; k < (int)s->lanes.size(); k++)
            if (k != lane && !s->sched.busy[k] && !e->lanes[k].pages.empty() && (victim < 0 || s->idle_since[k] < s->idle_since[victim])) victim = k;
        if (victim < 0) { if (!e->lanes[lane].pages.empty()) lane_evict(s, lane); return false; }
        lane_evict(s, victim);
    }
}
// take a free lane and its first turn (and, on the gpu, its pages). serve.h admits at most
// C generations, so a lane is free; pages may not be: then wait for a lane to end
static int lane_enter(ServedModel* s, const std::vector<int>& prompt, int rows) {
    LaneSched& r = s->sched;
    int lane = -1;
    {
        std::unique_lock<std::mutex> lk(r.mu);
        int best = -1;
        for (int k = 0; k < (int)r.busy.size(); k++) {
            if (r.busy[k]) continue;
            const int c = s->pc.o.on ? prefix_common(s->pc.live[k], prompt) : 0;
            if (c > best) { best = c; lane = k; }
        }
        CHECK(lane >= 0, "more generations than lanes (%zu)", r.busy.size());
        r.busy[lane] = 1;
    }
    for (;;) {
        sched_turn(&r, lane);
        if (lane_pages(s, lane, rows)) return lane;
        sched_turn_end(&r, lane);
        std::unique_lock<std::mutex> lk(r.mu);
        r.cv.wait_for(lk, std::chrono::milliseconds(20));  // a lane that ends gives its pages back under its turn
    }
}
static void lane_leave(ServedModel* s, int lane, int keep_rows) {
    LaneSched& r = s->sched;
    sched_turn(&r, lane);
    Engine* en = s->lanes[lane];
    if (en->gpu) gpu_lane_trim(en->g, lane, keep_rows);  // the rows its retained prefix needs stay
    sched_turn_end(&r, lane);
    std::lock_guard<std::mutex> lk(r.mu);
    r.busy[lane] = 0;
    s->idle_since[lane] = now_s();
    r.cv.notify_all();
}
struct LaneTurn {  // a request's lane for the scope of its generation; C = 1: none
    ServedModel* s; int lane = 0;
    LaneTurn(ServedModel* s_, const std::vector<int>& prompt, int rows) : s(s_) {
        if (s->lanes.size() > 1) lane = lane_enter(s, prompt, rows);
    }
    ~LaneTurn() {
        if (s->lanes.size() > 1) lane_leave(s, lane, s->pc.o.on ? (int)s->pc.live[lane].size() : 0);
    }
};
// the prefill's cancel poll: a step boundary too
struct LanePoll { ServedModel* s; int lane; const ServeSink* sink; };
static bool lane_poll(void* ctx) {
    LanePoll* p = (LanePoll*)ctx;
    if (p->s->lanes.size() > 1) {
        sched_yield(&p->s->sched, p->lane);
        Engine* en = p->s->lanes[p->lane];
        if (en->gpu) engine_gpu(en);  // ours again after the other lanes' steps
    }
    return p->sink->cancelled(p->sink->ctx);
}

// serve.h's threads call in on their own: the engine's device is theirs too (a kernel launched
// into a stream of another device than the thread's current one fails: --device 1)
static void served_thread(ServedModel* s) { if (s->t.en.gpu) cudaCheck(cudaSetDevice(s->t.en.g->device)); }
static bool served_prepare(void* self, const ServeChat& chat, ServePrompt* out, ServeError* err) {
    ServedModel* s = (ServedModel*)self;
    served_thread(s);
    if (!chat.reasoning_effort.empty()) {
        err->code = "reasoning_effort_not_supported"; err->param = "reasoning_effort";
        err->message = "this model's chat template has no reasoning effort levels";
        return false;
    }
    ChatOptions o;
    o.enable_thinking = chat.enable_thinking ? 1 : 0;
    o.developer_as_system = true;
    o.preserve_thinking = chat.preserve_thinking;
    TextRequest rq;
    auto media = std::make_shared<MediaPrompt>();
    std::string msg;
    int why = 0;
    const MediaBudget budget;
    if (!text_prompt(&s->t, chat.messages, chat.tools.is_array() ? &chat.tools : nullptr, o, &budget, &rq, media.get(), &msg, &why)) {
        if (why == PROMPT_OVER_BUDGET) { err->code = "media_budget_exceeded"; err->param = "messages"; }
        err->message = why == PROMPT_RENDER ? "the conversation cannot be rendered with the chat template: " + msg : msg;
        return false;
    }
    out->tokens = std::move(rq.prompt);
    out->thinking = rq.thinking_open;
    out->tools = rq.tools;
    if (!media->items.empty()) out->media = media;  // the tower runs in served_generate, on the engine thread
    // where NInfer keys a conversation's checkpoint (reference-engine.md 14): before the open
    // turn's assistant opener (the generation prologue: the last turn opener, as the
    // conversation's own text cannot make one), which the next request renders unchanged
    // whether or not the reply keeps its reasoning; with preserve_thinking the next request
    // replays the whole response as generated, so the state after it is kept too
    for (int i = (int)out->tokens.size() - 1; i > 0 && out->reuse_boundary < 0; i--)
        if (out->tokens[i] == s->im_start) out->reuse_boundary = i;
    out->reuse_replay = chat.preserve_thinking;
    return true;
}

// served_generate passes tokenizer.h's event kinds to serve.h as they are
static_assert((int)SERVE_REASONING == (int)OUT_REASONING && (int)SERVE_CONTENT == (int)OUT_CONTENT &&
              (int)SERVE_TOOL_CALL == (int)OUT_TOOL_CALL, "serve.h's event kinds are tokenizer.h's output kinds");

// a completion prompt (/v1/completions): the text is the model's whole input, tokenized as
// --raw-prompt does (added tokens in the text are matched: the client writes any template)
static bool served_prepare_text(void* self, const std::string& text, ServePrompt* out, ServeError* err) {
    ServedModel* s = (ServedModel*)self;
    tokenizer_encode(&s->t.tok, text, &out->tokens);
    out->thinking = false; out->tools = false; out->raw = true;
    out->reuse_replay = true;  // a client continuing a completion sends the output back after the prompt
    if (out->tokens.empty()) { err->param = "prompt"; err->message = "the prompt has no tokens"; return false; }
    return true;
}

static std::string served_token_bytes(void* self, int id) { return tokenizer_token_bytes(&((ServedModel*)self)->t.tok, id); }

// one request's logprobs: the tap's rows become ServeLogprob entries. sampled (before the
// emit) computes the id's entry; on_token (in the emit, with the parser's channel) sends it
// and counts reasoning tokens. prompt rows: row k predicts prompt token k + 1.
struct ServedTokens {
    const ServedModel* s;
    const ServeSink* sink;
    const std::vector<int>* prompt;
    int top_n = -1;            // -1: no logprobs
    int row = 0;               // prompt rows seen
    int reasoning = 0;         // tokens that started on the reasoning channel
    ServeLogprob pending;      // the entry of the id about to be emitted
    std::vector<int>* ids = nullptr;  // every emitted id in order (what the sequence holds after the prompt)
    ServedModel* lanes = nullptr; int lane = 0;  // --spec lanes: every token ends an exclusive step (sched_yield)
};
static void served_tap_sampled(void* ctx, const float* lg, int vocab, int id) {
    ServedTokens* t = (ServedTokens*)ctx;
    t->pending.id = id;
    t->pending.logprob = token_logprobs(lg, vocab, t->s->t.fr.domain, id, t->top_n, &t->pending.top);
}
static void served_tap_rows(void* ctx, const float* lg, int T, int vocab) {
    ServedTokens* t = (ServedTokens*)ctx;
    ServeEvent ev;
    ev.kind = SERVE_PROMPT_LOGPROBS;
    const int n = std::max(0, std::min(T, (int)t->prompt->size() - 1 - t->row));  // the last row predicts the first output token
    ev.logprobs.resize(n);
    #pragma omp parallel for schedule(static)
    for (int k = 0; k < n; k++) {  // rows are independent: one softmax over the vocabulary each
        ServeLogprob& e = ev.logprobs[k];
        e.id = (*t->prompt)[t->row + 1 + k];
        e.logprob = token_logprobs(lg + (size_t)k * vocab, vocab, t->s->t.fr.domain, e.id, t->top_n, &e.top);
    }
    t->row += T;
    if (n > 0) t->sink->emit(t->sink->ctx, ev);  // a client gone is seen at the next token
}
static void served_on_token(void* ctx, int id, int channel) {
    ServedTokens* t = (ServedTokens*)ctx;
    if (t->lanes) sched_yield(&t->lanes->sched, t->lane);
    if (t->ids) t->ids->push_back(id);
    if (channel == OUT_REASONING) t->reasoning++;
    if (t->top_n < 0 || t->pending.id != id) return;
    ServeEvent ev;
    ev.kind = SERVE_LOGPROB;
    t->pending.channel = (ServeEventKind)channel;
    ev.logprobs.push_back(std::move(t->pending));
    t->pending = ServeLogprob();
    t->sink->emit(t->sink->ctx, ev);
}

static void served_generate(void* self, const ServePrompt& p, const ServeSampling& smp, const ServeSink& sink, ServeResult* res) {
    ServedModel* s = (ServedModel*)self;
    served_thread(s);
    TextRequest rq;
    rq.prompt = p.tokens;
    rq.thinking_open = p.thinking && !p.raw;
    rq.tools = p.tools && !p.raw;
    rq.plain = p.raw;
    rq.stop = smp.stop;
    rq.stop_ids = s->t.fr.stops;
    rq.max_new = smp.max_tokens;
    rq.sp.temperature = smp.temperature; rq.sp.top_p = smp.top_p; rq.sp.top_k = smp.top_k; rq.sp.min_p = smp.min_p;
    rq.sp.presence = smp.presence_penalty; rq.sp.frequency = smp.frequency_penalty; rq.sp.seed = smp.seed;
    rq.sp.logit_bias = smp.logit_bias;
    rq.grammar = smp.grammar;
    const int64_t want_rows = std::min<int64_t>((int64_t)p.tokens.size() + std::max(0, smp.max_tokens) + 2 * s->t.spec.K + 1, engine_capacity(&s->t.en));
    LaneTurn turn(s, p.tokens, (int)want_rows);
    LanePoll poll{s, turn.lane, &sink};
    rq.cancel = GenCancel{lane_poll, &poll};  // a client that leaves during the prefill frees the lane within a piece
    ServedTokens tk{s, &sink, &p.tokens};
    // --spec lanes: the rounds are exclusive steps, handed over at round boundaries (the cancel
    // poll) on the gpu, at every token on the cpu (its lanes' states are their own)
    if (s->lanes.size() > 1 && s->t.spec.K && !s->t.en.gpu) { tk.lanes = s; tk.lane = turn.lane; }
    tk.top_n = smp.logprobs;
    GenTap tap;
    if (smp.logprobs >= 0) {
        tap.sampled = served_tap_sampled;
        if (smp.prompt_logprobs) tap.prompt_rows = served_tap_rows;
        tap.ctx = &tk;
        rq.tap = &tap;
    }
    rq.on_token = served_on_token;
    rq.token_ctx = &tk;
    MmPrompt mm;
    if (p.media) {
        std::string err;
        if (!text_media_tower(&s->t, p.tokens, *(const MediaPrompt*)p.media.get(), &mm, &err)) { res->error = err; return; }
        rq.mm = &mm;
    }
    // prefix reuse (PrefixCache): continue from the longest retained prefix the prompt starts
    // with, prefill to the template boundary and keep the state there, then generate from it.
    // a media prompt reuses nothing (placeholder ids do not say which picture) and leaves no
    // reusable rows; prompt logprobs need every prompt row's logits, so they prefill it all.
    PrefixCache* pc = &s->pc;
    Engine* en = s->lanes[turn.lane];
    rq.engine = en;
    const bool reuse = pc->o.on && !p.media && !smp.prompt_logprobs;
    const double t0 = now_s();
    const char* tier = "off";
    int start = 0, at = 0;
    rq.keep = true;
    std::vector<int> splits;  // every turn opener (prefix_prepare says why); none where the prefill must stay whole
    if (!p.media && !smp.prompt_logprobs && !p.raw)
        for (int i = 1; i < (int)p.tokens.size(); i++) if (p.tokens[i] == s->im_start) splits.push_back(i);
    const bool placed = prefix_prepare(pc, turn.lane, p.tokens, splits, p.reuse_boundary, reuse, rq.cancel, &start, &at, &tier);
    res->cache = tier;
    if (!placed) { res->prompt_tokens = (int)p.tokens.size(); res->cached_tokens = start; res->finish = "stop"; return; }
    const double boundary_s = now_s() - t0;
    if (at > 0) rq.prompt.assign(p.tokens.begin() + at, p.tokens.end());
    std::vector<int> out_ids;
    tk.ids = &out_ids;
    bool cancelled = false;
    TextResult r = generate_text(&s->t, rq, [&](const OutEvent& e, int) {
        ServeEvent ev;
        ev.kind = (ServeEventKind)e.kind; ev.text = e.text; ev.tool_name = e.name; ev.tool_args = e.arguments;
        if (!sink.emit(sink.ctx, ev) || sink.cancelled(sink.ctx)) { cancelled = true; return false; }
        return true;
    });
    if (!r.error.empty()) { res->error = r.error; return; }
    if (p.raw && r.gen.stopped && tk.pending.id == r.gen.stop_id) {
        // a completion lists its stop id too (one entry per counted token: lm-evaluation-harness
        // drops the last entry of echo + max_tokens 1 as the generated one); chat does not
        ServeEvent ev;
        ev.kind = SERVE_LOGPROB;
        ev.logprobs.push_back(std::move(tk.pending));
        sink.emit(sink.ctx, ev);
    }
    // what the live rows hold now: the prompt, then the ids fed back; a media sequence's rows
    // are no one's prefix
    if (s->lanes.size() > 1) sched_turn(&s->sched, turn.lane);  // prefix_finish works on the lane's state (held until the lane leaves)
    prefix_finish(pc, turn.lane, p.tokens, out_ids, !p.media, reuse && p.reuse_replay);
    res->prompt_tokens = (int)p.tokens.size();
    res->cached_tokens = start;
    res->completion_tokens = r.gen.generated + (r.gen.stopped ? 1 : 0);  // a withheld stop id counts
    res->reasoning_tokens = tk.reasoning;
    res->prefill_s = boundary_s + r.gen.prefill_s;
    res->decode_s = r.gen.decode_s;
    if (const SpecStats& sp = r.gen.spec; sp.K) {
        ServeSpecStats& o = res->speculative;
        o.backend = "mtp"; o.draft_window = sp.K;
        o.rounds = sp.rounds; o.drafted_tokens = sp.drafted; o.accepted_tokens = sp.accepted; o.fallback_steps = sp.fallback_steps;
        o.accepted_per_position.assign(sp.per_position, sp.per_position + sp.K);
    }
    res->stop_string = r.stop_hit;
    bool full = r.gen.generated >= smp.max_tokens || engine_pos(en) == engine_capacity(en);
    // a constrained output that did not complete ended on a limit (its stop ids are masked
    // until the structure may end, and stop strings are refused with it): never "stop"
    res->finish = r.tool_calls > 0 ? "tool_calls"
                : (r.gen.complete || r.gen.stopped || !r.stop_hit.empty() || cancelled || r.gen.cancelled) ? "stop"
                : full || rq.grammar ? "length" : "stop";
}

// the lanes' scheduler since the last stats line: decode steps, lanes a step, the mean step and
// the mean back-to-back gap between steps (LaneSched::gap_s)
static std::string served_stats(void* self) {
    LaneSched& ls = ((ServedModel*)self)->sched;
    std::lock_guard<std::mutex> lk(ls.mu);
    const uint64_t steps = ls.decode_steps - ls.stats_steps, tokens = ls.decode_tokens - ls.stats_tokens;
    char b[160];
    snprintf(b, sizeof b, " decode_steps=%llu lanes_per_step=%.2f step_ms=%.3f gap_ms=%.3f", (unsigned long long)steps,
             steps ? (double)tokens / steps : 0.0, steps ? 1e3 * ls.step_s / steps : 0.0, ls.gaps ? 1e3 * ls.gap_s / ls.gaps : 0.0);
    ls.stats_steps = ls.decode_steps; ls.stats_tokens = ls.decode_tokens;
    ls.step_s = ls.gap_s = 0; ls.gaps = 0;
    return b;
}

static void served_close(void* self) {
    ServedModel* s = (ServedModel*)self;
    sched_stop(&s->sched);
    prefix_free(&s->pc);
    for (auto& e : s->extra) engine_free(e.get());
    text_model_close(&s->t);
    delete s;
}

// the features behind server flags that this build has (serve.h asks before loading)
static bool served_supports(const char* feature) {
    bool gpu = gpu_count() > 0;
    if (!strcmp(feature, "--vision") || !strcmp(feature, "--media-preprocess-threads") || !strcmp(feature, "--media-cache-mib"))
        return true;  // both paths run the tower and its cache
    if (!strcmp(feature, "--kv-dtype int8") || !strcmp(feature, "--kv-dtype fp8") || !strcmp(feature, "--kv-capacity"))
        return gpu;  // kv formats and pools are gpu-side; the cpu reference keeps fp32 kv
    if (!strcmp(feature, "--spec mtp") || !strcmp(feature, "--lm-head-draft")) return true;  // the load says what the artifact lacks
    for (const char* f : {"--preserve-thinking", "--device-state-slots", "--host-state-slots", "--host-kv-mib", "--max-concurrency"})
        if (!strcmp(feature, f)) return true;  // prefix reuse (PrefixCache) on both paths
    return false;
}

// startup's memory plan on stderr: what is resident where (reference-engine.md 13: weights,
// the kv pool, state slots on the device and the host, graphs)
static void served_memory_plan(const ServedModel* s, const ServeOptions& o) {
    const Engine& en = s->t.en;
    const PrefixCache& pc = s->pc;
    const double mib = 1048576.0;
    char reuse[256];
    if (!pc.o.on) snprintf(reuse, sizeof reuse, "prefix reuse off (--no-prefix-reuse)");
    else snprintf(reuse, sizeof reuse, "prefix reuse: %d device state slots + %d pinned host state slots of %.1f MiB, host kv up to %d MiB (pinned as needed)",
                  pc.o.dev_slots, pc.o.host_slots, pc.image_bytes / mib, o.host_kv_mib);
    if (en.gpu) {
        const GpuEngine* e = en.g;
        const int live = e->o.lanes * e->lane_slots;
        char spec[96] = "", lanes[192] = "";
        if (e->mtp.K) snprintf(spec, sizeof spec, " (with the mtp layer's)");
        if (e->o.lanes > 1) {
            SampleScratch sz;
            char draws[64] = "";
            if (!e->lane_smp.empty())
                snprintf(draws, sizeof draws, ", their samplers %.1f MiB", e->o.lanes * sample_layout(&sz, nullptr, e->domain, false) / mib);
            snprintf(lanes, sizeof lanes, ", %d lane(s) of up to %d tokens in a pool of %d pages of %d tokens (batched decode%s)", e->o.lanes, e->capacity,
                     (int)(e->kv_rows / KV_PAGE), (int)KV_PAGE, draws);
        }
        fprintf(stderr, "ninfer-serve: memory plan (gpu %d): weights %.1f MiB, kv %d tokens of %s (%.1f MiB%s%s), deltanet state %d slots of %.1f MiB "
                "(%d live%s + %d device state slots), workspace %.1f MiB (+ 2 x %.1f MiB: the wide products' x), cuda graphs %s; %s\n",
                e->device, e->arena_bytes / mib, (int)e->kv_rows, kv_dtype_name(e->o.kv),
                (double)e->kv_rows * gpu_kv_bytes_per_row(e->m->geo, e->o.kv) * (e->m->geo.n_full + (e->mtp.K ? 1 : 0)) / e->m->geo.n_full / mib, spec,
                lanes, e->n_slots, gpu_gdn_bytes(e->m->geo, 1) / mib, live, e->mtp.K ? ": the mtp round's K+1" : "", pc.o.dev_slots,
                e->work_bytes / mib, gemv_xp_buf_bytes() / mib, e->o.graphs ? (e->o.lanes > 1 ? "per decode bucket and batch size" : "per decode bucket") : "off", reuse);
    } else {
        fprintf(stderr, "ninfer-serve: memory plan (cpu reference path): %zu lane(s), each a sequence state of %.1f MiB (kv %d tokens, fp32); %s\n",
                s->lanes.size(), en.st.n_floats * 4 / mib, en.st.capacity, reuse);
    }
}

static ServeEngine* served_load(const char* path, const ServeOptions& o, std::string* err) {
    ServedModel* s = new ServedModel();
    GpuOpts g;
    g.device = o.device;
    g.graphs = !o.no_cuda_graph;
    g.kv = o.kv_dtype == "int8" ? KV_INT8 : o.kv_dtype == "fp8" ? KV_FP8 : KV_BF16;
    g.max_context = o.max_context;
    g.prefill_chunk = o.prefill_chunk;
    g.kv_capacity = o.kv_capacity.empty() ? 0 : o.kv_capacity == "auto" ? -1 : atoi(o.kv_capacity.c_str());
    g.tune = gpu_tuning_from_env();
    g.lanes = std::max(1, o.max_concurrency);
    PrefixOpts po;
    po.on = !o.no_prefix_reuse;
    po.dev_slots = po.on ? (o.device_state_slots < 0 ? o.max_concurrency : o.device_state_slots) : 0;
    po.host_slots = po.on ? o.host_state_slots : 0;
    po.host_kv_bytes = po.on ? (int64_t)o.host_kv_mib << 20 : 0;
    // the device state slots are the last gdn slots, after the live pair or the mtp round's K+1
    g.gdn_slots = std::max<int>(GPU_LIVE_SLOTS, o.spec == "mtp" ? o.draft_tokens + 1 : 0) + po.dev_slots;
    if (o.spec == "mtp") { s->t.spec.K = o.draft_tokens; s->t.spec.lm_head_draft = o.lm_head_draft; }
    if (!text_model_open(&s->t, path, err)) { delete s; return nullptr; }
    if (o.vision) {  // startup residency: the tower (and its device workspace) only with --vision
        TextVision v;
        v.local_files = false;  // the server reads data: uris only
        v.cache_cap = (int64_t)o.media_cache_mib << 20;
        v.threads = o.media_preprocess_threads > 0 ? o.media_preprocess_threads
                                                   : (int)std::min(16u, std::max(1u, std::thread::hardware_concurrency()));
        if (!text_vision_open(&s->t, v, err)) { text_model_close(&s->t); delete s; return nullptr; }
    }
    if (!text_model_start(&s->t, false, g, "ninfer-serve", err) || !text_vision_start(&s->t, err)) { text_model_close(&s->t); delete s; return nullptr; }
    s->lanes.push_back(&s->t.en);
    for (int k = 1; k < o.max_concurrency; k++) {
        s->extra.emplace_back(new Engine());
        Engine* en = s->extra.back().get();
        if (s->t.en.gpu) {  // a lane of the one GpuEngine (built with g.lanes)
            *en = s->t.en; en->lane = k;
        } else if (!engine_build(en, &s->t.m, false, g, err, s->t.spec)) {  // a sequence and a workspace each, the weights shared
            served_close(s); return nullptr;
        }
        s->lanes.push_back(en);
    }
    s->idle_since.assign(s->lanes.size(), 0.0);
    if (s->lanes.size() > 1) sched_build(&s->sched, s->lanes);
    else s->sched.busy.assign(1, 0);
    if (!prefix_build(&s->pc, s->lanes, po, err)) { served_close(s); return nullptr; }
    for (const AddedToken& a : s->t.tok.added) if (a.content == "<|im_start|>") s->im_start = a.id;
    served_memory_plan(s, o);
    s->api.self = s;
    s->api.model_id = s->t.m.art.model_id;
    s->api.max_context = engine_capacity(&s->t.en);
    s->api.n_vocab = s->t.fr.domain;
    s->api.vision = o.vision;
    s->api.prepare = served_prepare;
    s->api.prepare_text = served_prepare_text;
    s->api.token_bytes = served_token_bytes;
    s->api.logprobs = s->t.spec.K == 0;  // the speculative round has no per-id rows for the tap
    s->api.structured = s->t.spec.K == 0;  // nor a constrained round
    s->api.generate = served_generate;
    s->api.close = served_close;
    if (s->lanes.size() > 1) s->api.stats = served_stats;
    return &s->api;
}

// === 12. cli ==================================================================

// the gpu flags of the cli: true when argv[*i] is one (consumed, with its value); bad values
// exit with one line. --max-context and --prefill-chunk stay the cli's own (both paths use them).
static bool gpu_parse_flag(int argc, char** argv, int* i, GpuOpts* o) {
    const char* a = argv[*i];
    auto value = [&]() -> const char* {
        if (*i + 1 >= argc) { fprintf(stderr, "ninfer: error: %s needs a value\n", a); exit(EXIT_FAILURE); }
        return argv[++*i];
    };
    auto whole = [&](const char* v, long long lo, long long hi) {
        char* end; errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end || x < lo || x > hi) {
            fprintf(stderr, "ninfer: error: %s: '%s' is not an integer in [%lld, %lld]\n", a, v, lo, hi); exit(EXIT_FAILURE);
        }
        return (int)x;
    };
    if (!strcmp(a, "--device")) { o->device = whole(value(), 0, 1024); return true; }
    if (!strcmp(a, "--no-cuda-graph")) { o->graphs = false; return true; }
    if (!strcmp(a, "--kv-dtype")) {
        const char* v = value();
        if (!strcmp(v, "bf16")) o->kv = KV_BF16;
        else if (!strcmp(v, "int8")) o->kv = KV_INT8;
        else if (!strcmp(v, "fp8")) o->kv = KV_FP8;
        else { fprintf(stderr, "ninfer: error: --kv-dtype: '%s' is not one of bf16, int8, fp8\n", v); exit(EXIT_FAILURE); }
        return true;
    }
    if (!strcmp(a, "--kv-capacity")) {
        const char* v = value();
        o->kv_capacity = !strcmp(v, "auto") ? -1 : whole(v, 1, INT32_MAX / 2);
        return true;
    }
    return false;
}

#ifndef NINFER_TESTING

static void usage(FILE* f) {
    fprintf(f,
        "usage: ninfer MODEL.ninfer (--prompt TEXT | --messages FILE | --raw-prompt TEXT | --prompt-ids IDS) [options]\n"
        "       ninfer MODEL.ninfer (--perplexity FILE | --tokenize | --render | --info)\n"
        "       ninfer-serve MODEL.ninfer [server options]   (ninfer-serve --help lists them)\n"
        "       ninfer-bench MODEL.ninfer [bench options]    (or ninfer --bench; ninfer-bench --help)\n"
        "\n"
        "input:\n"
        "  --prompt TEXT          one user message, rendered with the model's chat template (its text\n"
        "                         is literal: \"<|im_end|>\" in it is text, never the control token)\n"
        "  --messages FILE        a json array of messages, or {\"messages\": [...], \"tools\": [...]}\n"
        "  --raw-prompt TEXT      text completion: the text is tokenized as is (special tokens too), no\n"
        "                         chat template (ninfer)\n"
        "  --prompt-ids IDS       the prompt as token ids, e.g. 1,2,3 (output: generated ids)\n"
        "  --no-thinking          render the non-thinking generation prompt (thinking is the default)\n"
        "  --image PATH           an image (png, jpeg, ppm/pgm; a path, file:// or a base64 data: uri), repeatable;\n"
        "                         with --prompt the media come first in the user message, in command-line order\n"
        "  --video PATH           a video: a directory of frames, a comma-separated list of images, or a\n"
        "                         video file decoded by an ffmpeg on PATH; repeatable\n"
        "  --video-fps F          frame rate of a directory or list of frames (24, as transformers assumes)\n"
        "  --max-image-pixels N   decoded pixels allowed per image (67108864)\n"
        "  --max-video-pixels N   decoded pixels allowed per video, sampled frames summed (134217728)\n"
        "  --max-media-mib N      bytes allowed per media file, in MiB (256)\n"
        "  --vision               accepted for NInfer's command lines: a vision model runs its tower\n"
        "                         whenever the prompt has media (--messages: image/image_url, video/video_url parts)\n"
        "\n"
        "generation:\n"
        "  --max-new N            output token limit (128)\n"
        "  --max-context N        sequence capacity in tokens (2048)\n"
        "  --prefill-chunk N      prompt tokens per forward call (1024)\n"
        "  --greedy               exact argmax (ignores the sampling flags)\n"
        "  --temperature F        [0, 2], 0 = greedy (0.6)\n"
        "  --top-p F              [0, 1] (0.95)\n"
        "  --top-k N              <= 0 = no limit (20; NInfer caps its candidates at 20, ninfer does not)\n"
        "  --min-p F              [0, 1] (0)\n"
        "  --presence-penalty F   [-2, 2], over generated tokens (1.0)\n"
        "  --frequency-penalty F  [-2, 2], over generated tokens (0)\n"
        "  --seed N               u64 (0)\n"
        "  --stop-token-id N      extra stop token id, repeatable (the model's eos ids always stop)\n"
        "  --stop TEXT            stop string on the content channel, repeatable (not printed)\n"
        "  --reasoning-stop TEXT  stop string on the reasoning channel, repeatable\n"
        "  --raw-output           no reasoning/content split, special tokens printed\n"
        "  --json-schema FILE     constrain the answer (after the reasoning) to a json schema (grammar.h lists\n"
        "                         the keywords; others are refused by name); exit 1 if --max-new ends it inside\n"
        "  --grammar FILE         constrain the answer to a gbnf-like grammar (root ::= ...; grammar.h)\n"
        "\n"
        "speculative decoding (lossless: greedy output is plain decoding's, token for token):\n"
        "  --spec mtp             draft with the artifact's mtp module, verify K+1 tokens per pass\n"
        "  --draft-tokens N       the draft window K, 1..5 (required with --spec)\n"
        "  --lm-head-draft        score drafts with the artifact's reduced proposal head (needs --spec)\n"
        "                         (drafted / accepted / per position / tokens per round on stderr)\n"
        "\n"
        "execution:\n"
        "  --cpu                  the cpu reference path (automatic when there is no gpu)\n"
        "  --device N             cuda device (0)\n"
        "  --kv-dtype T           bf16 | int8 | fp8 kv cache on the gpu (bf16; the cpu path refuses int8 / fp8)\n"
        "  --kv-capacity N|auto   kv rows to allocate on the gpu (default: --max-context; the cpu path\n"
        "                         holds exactly --max-context rows and refuses other values)\n"
        "  --no-cuda-graph        run decode eagerly instead of replaying a cuda graph\n"
        "\n"
        "diagnostics:\n"
        "  --tokenize             read text on stdin, print its token ids\n"
        "  --render               print the rendered prompt (with --prompt or --messages) and exit\n"
        "  --print-token-ids      print prompt and generated ids on stderr, each id beside its text\n"
        "  --logits-out FILE      write the prompt's logits as float32 [prompt tokens, vocab rows]\n"
        "  --decode-out FILE      write the decoded pixels of the one --image (exif orientation applied)\n"
        "                         as rgb8 [height, width, 3]; prints 'image WIDTH HEIGHT'\n"
        "  --pixels-out FILE      write the preprocessed pixel values of every --image and --video, in\n"
        "                         command-line order, as float32 [patch rows, 1536]; prints\n"
        "                         'image|video T H W' (grid_thw) for each\n"
        "  --perplexity FILE      perplexity over a text file or a file of token ids, in\n"
        "                         non-overlapping windows of --max-context tokens\n"
        "  --info                 print the artifact's identity, geometry, objects and resources\n"
        "  -h, --help             this text\n"
        "\n"
        "stdout carries only the answer (or the requested diagnostic output); reasoning, progress,\n"
        "stats and errors go to stderr; the exit code is 0 only on success.\n");
}

// whole-string numbers in [lo, hi], else one line naming the flag and exit 1
static long long parse_int(const char* flag, const char* s, long long lo, long long hi) {
    char* end; errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) die("%s: '%s' is not an integer", flag, s);
    if (v < lo || v > hi) die("%s: %lld is outside [%lld, %lld]", flag, v, lo, hi);
    return v;
}
static float parse_float(const char* flag, const char* s, double lo, double hi) {
    char* end; errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) die("%s: '%s' is not a number", flag, s);
    if (v < lo || v > hi) die("%s: %g is outside [%g, %g]", flag, v, lo, hi);
    return (float)v;
}
static uint64_t parse_u64(const char* flag, const char* s) {
    char* end; errno = 0;
    if (*s == '-') die("%s: '%s' is not an unsigned integer", flag, s);
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end) die("%s: '%s' is not an unsigned integer", flag, s);
    return v;
}

static std::string read_file(const char* path) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) die("%s: is a directory, not a file", path);
    FILE* f = fopen(path, "rb");
    if (!f) die("%s: cannot open: %s%s", path, strerror(errno), path_case_hint(path).c_str());
    std::string s;
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    fclose(f);
    return s;
}

// a printable rendition of a token's bytes for --print-token-ids
static std::string show_piece(const std::string& s) {
    std::string o;
    for (unsigned char c : s) {
        if (c == '\n') o += "\\n";
        else if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\x%02x", c); o += b; }
        else o += (char)c;
    }
    return o;
}

struct MediaArg { bool video; std::string ref; };  // one --image or --video, in command-line order

// the command line, NInfer's defaults (reference-engine.md 2.1)
struct CliArgs {
    const char* model_path = nullptr;
    bool info = false, tokenize = false, render = false;
    bool cpu = false;                  // force the reference path; automatic without a gpu
    const char* prompt_text = nullptr; // --prompt
    const char* messages_path = nullptr;
    const char* raw_prompt = nullptr;  // --raw-prompt (ours): completion without the template
    const char* prompt_ids = nullptr;  // --prompt-ids
    const char* logits_path = nullptr;
    const char* ppl_path = nullptr;
    int max_new = 128;                 // output token limit
    int max_context = 2048;            // sequence capacity (kv rows)
    int prefill_chunk = 1024;          // prompt tokens per forward call
    SamplerParams sp;                  // temperature 0.6, top-p 0.95, top-k 20, min-p 0, presence 1.0, frequency 0, seed 0
    bool greedy = false, no_thinking = false, raw_output = false, print_ids = false;
    std::vector<int> user_stops;
    std::vector<std::string> stop_strings, reasoning_stops;
    GpuOpts gopt;                      // --device, --kv-dtype, --kv-capacity, --no-cuda-graph; tune from the environment
    const char* spec_name = nullptr;   // --spec mtp
    int draft_tokens = 0;              // --draft-tokens (required with --spec)
    bool lm_head_draft = false;
    std::vector<MediaArg> media;       // --image, --video
    bool vision = false;               // --vision: the tower is resident only with media either way
    double video_fps = 24;             // a frame list has no rate; transformers assumes 24
    MediaLimits media_limits;          // --max-image-pixels, --max-video-pixels, --max-media-mib
    const char* decode_out = nullptr;  // --decode-out
    const char* pixels_out = nullptr;  // --pixels-out
    const char* json_schema = nullptr; // --json-schema FILE: constrain the answer to the schema
    const char* grammar = nullptr;     // --grammar FILE: constrain the answer to the grammar (grammar.h's syntax)
    int inputs = 0;                    // how many of the input modes were given
};

// poor man's argparse: the flags into *c, or a one-line error and exit 1 (--help: exit 0)
static void cli_parse(int argc, char** argv, CliArgs* c) {
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        auto value = [&]() -> const char* { if (i + 1 >= argc) die("%s needs a value", a); return argv[++i]; };
        SamplerParams& sp = c->sp;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); exit(0); }
        else if (!strcmp(a, "--info")) c->info = true;
        else if (!strcmp(a, "--tokenize")) c->tokenize = true;
        else if (!strcmp(a, "--render")) c->render = true;
        else if (!strcmp(a, "--cpu")) c->cpu = true;
        else if (!strcmp(a, "--prompt")) c->prompt_text = value();
        else if (!strcmp(a, "--messages")) c->messages_path = value();
        else if (!strcmp(a, "--raw-prompt")) c->raw_prompt = value();
        else if (!strcmp(a, "--prompt-ids")) c->prompt_ids = value();
        else if (!strcmp(a, "--logits-out")) c->logits_path = value();
        else if (!strcmp(a, "--perplexity")) c->ppl_path = value();
        else if (!strcmp(a, "--max-new")) c->max_new = (int)parse_int(a, value(), 0, INT32_MAX);
        else if (!strcmp(a, "--max-context")) c->max_context = (int)parse_int(a, value(), 1, INT32_MAX);
        else if (!strcmp(a, "--prefill-chunk")) c->prefill_chunk = (int)parse_int(a, value(), 1, INT32_MAX);
        else if (!strcmp(a, "--greedy")) c->greedy = true;
        else if (!strcmp(a, "--temperature")) sp.temperature = parse_float(a, value(), 0, 2);
        else if (!strcmp(a, "--top-p")) sp.top_p = parse_float(a, value(), 0, 1);
        else if (!strcmp(a, "--top-k")) sp.top_k = (int)parse_int(a, value(), INT32_MIN, INT32_MAX);
        else if (!strcmp(a, "--min-p")) sp.min_p = parse_float(a, value(), 0, 1);
        else if (!strcmp(a, "--presence-penalty")) sp.presence = parse_float(a, value(), -2, 2);
        else if (!strcmp(a, "--frequency-penalty")) sp.frequency = parse_float(a, value(), -2, 2);
        else if (!strcmp(a, "--seed")) sp.seed = parse_u64(a, value());
        else if (!strcmp(a, "--stop-token-id")) c->user_stops.push_back((int)parse_int(a, value(), 0, INT32_MAX));
        else if (!strcmp(a, "--stop")) { const char* v = value(); if (!*v) die("--stop: empty string"); c->stop_strings.push_back(v); }
        else if (!strcmp(a, "--reasoning-stop")) { const char* v = value(); if (!*v) die("--reasoning-stop: empty string"); c->reasoning_stops.push_back(v); }
        else if (!strcmp(a, "--no-thinking")) c->no_thinking = true;
        else if (!strcmp(a, "--raw-output")) c->raw_output = true;
        else if (!strcmp(a, "--print-token-ids")) c->print_ids = true;
        else if (!strcmp(a, "--spec")) {
            c->spec_name = value();
            if (strcmp(c->spec_name, "mtp") && strcmp(c->spec_name, "dflash")) die("--spec: '%s' is not one of mtp, dflash", c->spec_name);
            if (!strcmp(c->spec_name, "dflash")) die("--spec dflash is not supported yet (qwen3.5 dense has no dflash drafter)");
        }
        else if (!strcmp(a, "--draft-tokens")) c->draft_tokens = (int)parse_int(a, value(), 1, 15);
        else if (!strcmp(a, "--lm-head-draft")) c->lm_head_draft = true;
        else if (!strcmp(a, "--image")) c->media.push_back({false, value()});
        else if (!strcmp(a, "--video")) c->media.push_back({true, value()});
        else if (!strcmp(a, "--video-fps")) c->video_fps = parse_float(a, value(), 0.001, 1000);
        else if (!strcmp(a, "--max-image-pixels")) c->media_limits.max_pixels = parse_int(a, value(), 1, 1ll << 40);
        else if (!strcmp(a, "--max-video-pixels")) c->media_limits.max_video_pixels = parse_int(a, value(), 1, 1ll << 42);
        else if (!strcmp(a, "--max-media-mib")) c->media_limits.max_bytes = parse_int(a, value(), 1, 1 << 20) << 20;
        else if (!strcmp(a, "--decode-out")) c->decode_out = value();
        else if (!strcmp(a, "--pixels-out")) c->pixels_out = value();
        else if (!strcmp(a, "--vision")) c->vision = true;
        else if (!strcmp(a, "--json-schema")) c->json_schema = value();
        else if (!strcmp(a, "--grammar")) c->grammar = value();
        else if (!strcmp(a, "--reasoning-effort"))
            die("%s is not supported yet", a);
        else if (gpu_parse_flag(argc, argv, &i, &c->gopt)) {}
        else if (a[0] == '-' && a[1] != '\0') { fprintf(stderr, "ninfer: error: unknown option '%s'\n", a); usage(stderr); exit(1); }
        else if (!c->model_path) c->model_path = a;
        else die("unexpected argument '%s' (the model path was already given as '%s')", a, c->model_path);
    }
    if (!c->model_path) { usage(stderr); exit(1); }
    if (c->greedy) c->sp.temperature = 0.0f;
    c->inputs = !!c->prompt_text + !!c->messages_path + !!c->raw_prompt + !!c->prompt_ids + !!c->ppl_path + c->tokenize;
    if (c->inputs > 1) die("give one of --prompt, --messages, --raw-prompt, --prompt-ids, --perplexity, --tokenize");
    if (c->render && !c->prompt_text && !c->messages_path) die("--render needs --prompt or --messages");
    if (c->info && (c->inputs || c->render || c->logits_path || c->print_ids))
        die("--info prints the artifact and exits: it takes no --prompt, --messages, --raw-prompt, --prompt-ids, --perplexity, --tokenize, --render or --logits-out");
    // text arguments are utf-8, as request strings are for the server (an invalid byte is an
    // error there too, not a silent U+FFFD)
    for (auto [flag, v] : {std::pair<const char*, const char*>{"--prompt", c->prompt_text}, {"--raw-prompt", c->raw_prompt}})
        if (v && !utf8_valid(v, strlen(v))) {
            size_t at = 0, n = strlen(v);
            while (at < n) {  // the first ill-formed sequence
                unsigned char b = (unsigned char)v[at];
                size_t len = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
                if (at + len > n || !utf8_valid(v + at, len)) break;
                at += len;
            }
            die("%s: the text is not valid utf-8 (byte %zu)", flag, at);
        }
    if (c->logits_path && (!(c->prompt_text || c->messages_path || c->raw_prompt || c->prompt_ids) || c->render))
        die("--logits-out needs a prompt (--prompt, --messages, --raw-prompt or --prompt-ids)");
    c->gopt.max_context = c->max_context;
    c->gopt.prefill_chunk = std::min(c->prefill_chunk, c->max_context);
    c->gopt.tune = gpu_tuning_from_env();
    // NInfer's rules (and messages: serve.h's serve_parse_args)
    if (c->spec_name && !c->draft_tokens) die("--spec %s needs --draft-tokens", c->spec_name);
    if (!c->spec_name && c->draft_tokens) die("--draft-tokens needs --spec");
    if (c->spec_name && c->draft_tokens > SPEC_MAX_K) die("--draft-tokens for --spec mtp is 1..%d", SPEC_MAX_K);
    if (!c->spec_name && c->lm_head_draft) die("--lm-head-draft needs --spec");
    if (c->ppl_path && c->spec_name) die("--perplexity cannot be combined with --spec (it scores, it does not generate)");
    if (c->spec_name && c->logits_path) die("--logits-out cannot be combined with --spec (it writes the prompt's logits of a plain run)");
    if (const char* f = c->json_schema ? "--json-schema" : c->grammar ? "--grammar" : nullptr) {
        if (c->json_schema && c->grammar) die("give one of --json-schema and --grammar");
        if (!(c->prompt_text || c->messages_path || c->raw_prompt) || c->render)
            die("%s constrains generated text: it needs --prompt, --messages or --raw-prompt", f);
        if (c->logits_path) die("%s cannot be combined with --logits-out", f);
        if (c->spec_name) die("%s cannot be combined with --spec yet (a constrained mtp round is not built)", f);
        if (c->raw_output) die("%s cannot be combined with --raw-output (the constraint applies to the answer channel)", f);
    }
}

// --json-schema / --grammar FILE -> the request's grammar, or a one-line error naming the file
static std::shared_ptr<const Grammar> cli_grammar(const CliArgs& c) {
    if (!c.json_schema && !c.grammar) return nullptr;
    const char* path = c.json_schema ? c.json_schema : c.grammar;
    std::string text = read_file(path), err;
    auto g = std::make_shared<Grammar>();
    if (c.json_schema) {
        Json schema;
        if (!json_parse(text, &schema, &err)) die("%s: not json: %s", path, err.c_str());
        if (!schema_compile(schema, g.get(), &err)) die("%s: %s", path, err.c_str());
    } else if (!grammar_parse_gbnf(text, g.get(), &err)) die("%s: %s", path, err.c_str());
    return g;
}

// --info
static int cli_info(const CliArgs& c) {
    Model m;
    std::string err;
    if (!model_open(&m, c.model_path, &err)) die("%s", err.c_str());
    print_info(stdout, &m);
    model_close(&m);
    return 0;
}

// --decode-out / --pixels-out: media through vision.h with the artifact's preprocessor
// configs, no tower. stdout: one line per item (the decoded size, or grid_thw); a video's
// sampled frame timestamps go to stderr.
static int cli_media(const CliArgs& c) {
    const std::vector<MediaArg>& media = c.media;
    const MediaLimits& lim = c.media_limits;
    const char *decode_out = c.decode_out, *pixels_out = c.pixels_out, *model_path = c.model_path;
    if (media.empty()) die("%s needs an --image or a --video", decode_out ? "--decode-out" : "--pixels-out");
    std::string err;
    if (decode_out) {
        if (media.size() != 1 || media[0].video || pixels_out) die("--decode-out takes exactly one --image (and no --video or --pixels-out)");
        Image im;
        if (!media_image(media[0].ref, lim, &im, &err)) die("%s", err.c_str());
        FILE* f = fopen(decode_out, "wb");
        if (!f) die("%s: cannot create: %s", decode_out, strerror(errno));
        if (fwrite(im.rgb.data(), 1, im.rgb.size(), f) != im.rgb.size() || fclose(f) != 0) die("%s: write failed: %s", decode_out, strerror(errno));
        printf("image %d %d\n", im.w, im.h);
        return 0;
    }
    Model m;
    if (!model_open(&m, model_path, &err)) die("%s", err.c_str());
    if (!m.geo.has_vision) die("%s: the model has no vision tower; --image and --video need a vision model", model_path);
    VisionConfig cfg;
    if (!vision_config_parse(artifact_resource(&m.art, "frontend/preprocessor_config.json"),
                             artifact_resource(&m.art, "frontend/video_preprocessor_config.json"), &cfg, &err))
        die("%s: %s", model_path, err.c_str());
    FILE* f = fopen(pixels_out, "wb");
    if (!f) die("%s: cannot create: %s", pixels_out, strerror(errno));
    auto put = [&](const VisionItem& it) {
        if (fwrite(it.pixels.data(), sizeof(float), it.pixels.size(), f) != it.pixels.size()) die("%s: write failed: %s", pixels_out, strerror(errno));
        printf("%s %d %d %d\n", it.video ? "video" : "image", it.t, it.h, it.w);
    };
    std::vector<MediaJob> jobs(media.size());
    for (size_t i = 0; i < media.size(); i++) { jobs[i].video = media[i].video; jobs[i].ref = media[i].ref; }
    vision_prepare(&jobs, cfg, lim, c.video_fps, (int)std::min(16u, std::max(1u, std::thread::hardware_concurrency())));  // NInfer: <= 16 threads
    for (const MediaJob& j : jobs) {
        if (!j.ok) die("%s", j.err.c_str());
        put(j.item);
        if (j.video) {
            fprintf(stderr, "ninfer: %s: %d temporal patches at", j.ref.c_str(), j.item.t);
            for (double ts : j.item.timestamps) fprintf(stderr, " <%.1f seconds>", ts);
            fprintf(stderr, "\n");
        }
    }
    if (fclose(f) != 0) die("%s: write failed: %s", pixels_out, strerror(errno));
    model_close(&m);
    return 0;
}

// --tokenize: text on stdin, ids on stdout
static int cli_tokenize(TextModel* t) {
    std::string text;
    char buf[1 << 16]; size_t n;
    while ((n = fread(buf, 1, sizeof buf, stdin)) > 0) text.append(buf, n);
    std::vector<int> ids;
    tokenizer_encode(&t->tok, text, &ids);
    for (size_t i = 0; i < ids.size(); i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    model_close(&t->m);
    return 0;
}

// the prompt's tokens into rq: the chat template (--prompt, --messages), the text as is
// (--raw-prompt) or ids (--prompt-ids). --render prints the rendered prompt and returns false.
static bool cli_prompt(const CliArgs& c, TextModel* t, TextRequest* rq, MediaPrompt* mp) {
    std::string err;
    if (!c.media.empty() && !c.prompt_text) die("--image and --video go with --prompt (in --messages, give image and video parts)");
    if ((c.vision || !c.media.empty()) && !t->m.geo.has_vision) die("%s: the model has no vision tower; --image, --video and --vision need a vision model", c.model_path);
    if (c.prompt_text || c.messages_path) {
        Json messages, tools;
        if (c.prompt_text) {
            messages = chat_messages_from_prompt(c.prompt_text);
            if (!c.media.empty()) {
                Json parts = Json::array();
                for (const MediaArg& a : c.media) {
                    Json p = Json::object();
                    p.set("type", Json::string(a.video ? "video" : "image"));
                    p.set(a.video ? "video" : "image", Json::string(a.ref));
                    parts.push(std::move(p));
                }
                Json tp = Json::object();
                tp.set("type", Json::string("text"));
                tp.set("text", Json::string(c.prompt_text));
                parts.push(std::move(tp));
                messages.arr[0].set("content", std::move(parts));
            }
        } else if (!chat_parse_request(read_file(c.messages_path), &messages, &tools, &err)) die("%s: %s", c.messages_path, err.c_str());
        ChatOptions co;
        co.enable_thinking = c.no_thinking ? 0 : -1;
        co.developer_as_system = true;
        const char* where = c.messages_path ? c.messages_path : "--prompt";
        if (c.render) {
            std::vector<MediaJob> jobs;
            if (!chat_media(&messages, true, &jobs, &err)) die("%s: %s", where, err.c_str());
            if (!chat_from_openai(&messages, &err)) die("%s: %s", where, err.c_str());
            std::string rendered;
            if (!chat_render(messages, tools.is_array() ? &tools : nullptr, co, &rendered, &err)) die("%s: %s", where, err.c_str());
            fwrite(rendered.data(), 1, rendered.size(), stdout);
            return false;
        }
        if (t->m.geo.has_vision) {  // cheap: the processor configs; the tower only runs when there are media
            TextVision v;
            v.lim = c.media_limits; v.frames_fps = c.video_fps;
            v.threads = (int)std::min(16u, std::max(1u, std::thread::hardware_concurrency()));  // NInfer: <= 16 threads
            if (!text_vision_open(t, v, &err)) die("%s", err.c_str());
        }
        if (!text_prompt(t, messages, tools.is_array() ? &tools : nullptr, co, nullptr, rq, mp, &err)) die("%s: %s", where, err.c_str());
    } else if (c.raw_prompt) {  // a completion: no template, no reasoning channel, no tool calls
        tokenizer_encode(&t->tok, c.raw_prompt, &rq->prompt);
        if (rq->prompt.empty()) die("--raw-prompt: the text has no tokens");
    } else if (c.prompt_ids) {
        if (!parse_ids(c.prompt_ids, &rq->prompt) || rq->prompt.empty())
            die("--prompt-ids: '%s' is not a list of token ids (e.g. 1,2,3)", c.prompt_ids);
    }
    return true;
}

// --perplexity FILE (token ids or text) in windows of --max-context
static int cli_perplexity(const CliArgs& c, TextModel* t) {
    const char* path = c.ppl_path;
    std::string text = read_file(path);
    std::vector<int> ids;
    bool as_ids = parse_ids(text.c_str(), &ids);
    if (!as_ids) tokenizer_encode(&t->tok, text, &ids);  // a text file
    if (ids.size() < 2) die("%s: needs at least 2 tokens, has %zu", path, ids.size());
    const int vocab = t->m.geo.vocab;
    for (size_t i = 0; i < ids.size(); i++)
        if (ids[i] >= vocab) die("%s: token %zu is id %d, outside the vocabulary [0, %d)", path, i, ids[i], vocab);
    double t0 = now_s();
    int64_t n = 0;
    double nll = engine_perplexity(&t->en, ids, c.max_context, &n);
    if (n == 0) die("%s: no token was scored (every window has one token; raise --max-context)", path);
    printf("perplexity: %.6f over %lld tokens\n", exp(nll / n), (long long)n);
    fprintf(stderr, "ninfer: %zu tokens (%s) in windows of %d, %.2f s\n", ids.size(), as_ids ? "ids" : "text", c.max_context, now_s() - t0);
    text_model_close(t);
    return 0;
}

// token space: ids out (--prompt-ids) or the decoded text, and the prompt's logits (--logits-out)
static GenStats cli_generate_ids(const CliArgs& c, TextModel* t, const TextRequest& rq) {
    const bool ids_out = c.prompt_ids != nullptr;
    FILE* lf = nullptr;
    if (c.logits_path && !(lf = fopen(c.logits_path, "wb"))) die("%s: cannot create: %s", c.logits_path, strerror(errno));
    Sampler smp;
    sampler_build(&smp, rq.sp, t->fr.domain);
    std::vector<int> out;
    GenTap tap;  // --logits-out: the prompt's rows to the file
    tap.prompt_rows = [](void* f, const float* lg, int T, int vocab) {
        CHECK(fwrite(lg, sizeof(float) * vocab, T, (FILE*)f) == (size_t)T, "writing logits");
    };
    tap.ctx = lf;
    GenStats s = engine_generate(&t->en, &smp, rq.prompt, rq.max_new, rq.stop_ids, lf ? &tap : nullptr, [&](int id) {
        if (ids_out) { printf(out.empty() ? "%d" : " %d", id); fflush(stdout); }
        out.push_back(id);
    }, GenCancel(), rq.mm);
    if (ids_out && !out.empty()) printf("\n");
    if (!ids_out) { std::string text = tokenizer_decode(&t->tok, out, !rq.raw); printf("%s\n", text.c_str()); }
    if (lf && fclose(lf) != 0) die("%s: write failed: %s", c.logits_path, strerror(errno));
    return s;
}

// text: content to stdout, reasoning to stderr, tool calls to stdout as json lines
static TextResult cli_generate_text(const CliArgs& c, TextModel* t, const TextRequest& rq) {
    bool in_reasoning = false;
    TextResult r = generate_text(t, rq, [&](const OutEvent& e, int id) {
        if (e.kind == OUT_CONTENT) {
            if (in_reasoning) { fprintf(stderr, "\n"); in_reasoning = false; }
            fwrite(e.text.data(), 1, e.text.size(), stdout);
            fflush(stdout);
        } else if (e.kind == OUT_REASONING) {
            in_reasoning = true;
            fwrite(e.text.data(), 1, e.text.size(), stderr);
        } else {
            std::string line = "{\"tool_call\":{\"name\":";
            json_escape(&line, e.name);
            line += ",\"arguments\":" + (e.arguments.empty() ? std::string("{}") : e.arguments) + "}}\n";
            fwrite(line.data(), 1, line.size(), stdout);
        }
        if (c.print_ids && id >= 0) fprintf(stderr, "[%d '%s']", id, show_piece(tokenizer_token_bytes(&t->tok, id)).c_str());
        return true;
    });
    printf("\n");
    fflush(stdout);
    return r;
}

// generation from the prompt in rq: checks, stop ids and strings, then ids or text out, stats
static int cli_generate(const CliArgs& c, TextModel* t, TextRequest& rq) {
    const int domain = t->fr.domain;
    for (size_t i = 0; i < rq.prompt.size(); i++)
        if (rq.prompt[i] < 0 || rq.prompt[i] >= domain) die("prompt id %d (position %zu) is outside the token domain [0, %d)", rq.prompt[i], i, domain);
    if ((int)rq.prompt.size() >= engine_capacity(&t->en))
        die("the prompt has %zu tokens, no room left in --max-context %d (raise it)", rq.prompt.size(), engine_capacity(&t->en));
    rq.stop_ids = t->fr.stops;
    for (int id : c.user_stops) {
        if (id >= domain) die("--stop-token-id %d is outside the token domain [0, %d)", id, domain);
        rq.stop_ids.push_back(id);
    }
    rq.stop = c.stop_strings;
    rq.reasoning_stop = c.reasoning_stops;
    rq.raw = rq.raw || c.raw_output;
    rq.max_new = c.max_new;
    rq.sp = c.sp;
    rq.grammar = cli_grammar(c);
    if (rq.grammar && !c.stop_strings.empty()) die("--stop cannot be combined with %s (a stop string could cut the structure)", c.json_schema ? "--json-schema" : "--grammar");
    if (c.print_ids) {
        fprintf(stderr, "prompt ids:");
        for (int id : rq.prompt) fprintf(stderr, " %d", id);
        fprintf(stderr, "\n");
    }
    TextResult r;
    if (c.prompt_ids || c.logits_path) r.gen = cli_generate_ids(c, t, rq);
    else r = cli_generate_text(c, t, rq);
    if (!r.error.empty()) die("%s", r.error.c_str());
    const GenStats& s = r.gen;
    fprintf(stderr, "ninfer: %s; prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens in %.3f s (%.1f tok/s)%s\n",
            t->en.gpu ? "gpu" : "cpu", s.prompt, s.prefill_s, s.prompt / std::max(s.prefill_s, 1e-9), s.generated, s.decode_s,
            s.generated > 1 ? (s.generated - 1) / std::max(s.decode_s, 1e-9) : 0.0,
            s.complete ? ", the structure is complete" : s.stopped ? ", stopped on a stop id" : !r.stop_hit.empty() ? ", stopped on a stop string"
            : engine_pos(&t->en) == engine_capacity(&t->en) ? ", context full" : "");
    if (const SpecStats& sp = s.spec; sp.K) {
        std::string per;
        for (int k = 0; k < sp.K; k++) {
            char b[32]; snprintf(b, sizeof b, "%s%.3f", k ? " " : "", sp.rounds ? (double)sp.per_position[k] / sp.rounds : 0.0);
            per += b;
        }
        fprintf(stderr, "ninfer: mtp K=%d%s: %ld rounds, %ld drafted, %ld accepted (%.1f%%), acceptance per position [%s], %.2f tokens/round, "
                "%ld one-token steps\n", sp.K, t->spec.lm_head_draft ? " (draft head)" : "", sp.rounds, sp.drafted, sp.accepted,
                sp.drafted ? 100.0 * sp.accepted / sp.drafted : 0.0, per.c_str(), sp.rounds ? 1.0 + (double)sp.accepted / sp.rounds : 0.0,
                sp.fallback_steps);
    }
    text_model_close(t);
    if (rq.grammar && !s.complete && !s.stopped)  // a stop id is only allowed where the structure may end
        die("the output ended inside the %s structure (%s): it is incomplete", c.json_schema ? "--json-schema" : "--grammar",
            s.cancelled ? "stopped" : "--max-new or the context reached");
    return 0;
}

// ---- ninfer-bench -------------------------------------------------------------------------
//
// llama-bench's tests (reference-engine.md 18.7) on either path, through the Engine the cli
// drives: ppN = an N-token prompt after D tokens of context (-d D), tgN = N decode steps after a
// D-token prompt (at least one token), ppP+tgG = both, timed together. prompts are random ids of
// the token domain (a fixed seed), decoding is greedy unless --sample (the cli's defaults), no
// stop ids, so every test runs its whole length. the depth's prefill is not timed. each test
// runs --warmup times untimed (graph capture, first touch), then -r times; a row is the mean
// tok/s of its runs with their standard deviation. GB/s = the bytes the test must move
// (bench_test_bytes) over its mean time; "copy" = that over a copy bandwidth measured in the
// same run (read + written bytes of a large buffer: copy16_kernel on the gpu, memcpy across
// the openmp threads on the cpu). prefill pieces are --prefill-chunk tokens whatever the tests
// (the depth's prefill too).

struct BenchTest { int p = 0, g = 0, depth = 0; };  // ppP (g = 0), tgG (p = 0), ppP+tgG
enum { BENCH_TABLE, BENCH_JSON, BENCH_CSV };
struct BenchArgs {
    const char* model_path = nullptr;
    std::vector<int> p = {512}, n = {128}, depth = {0};  // -p, -n, -d (llama-bench's defaults)
    std::vector<std::pair<int, int>> pg;                 // -pg P,G
    int reps = 5, warmup = 1;
    int prefill_chunk = 1024;  // the cli's default: the bench measures what ninfer runs
    bool cpu = false, sample = false;
    int output = BENCH_TABLE;
    GpuOpts gopt;
    SpecOpts spec;
    const char* spec_name = nullptr;
};

static void bench_usage(FILE* f) {
    fprintf(f,
        "usage: ninfer-bench MODEL.ninfer [options]   (the same: ninfer --bench MODEL.ninfer [options])\n"
        "\n"
        "llama-bench's tests on the gpu, or the cpu reference path: ppN = an N-token prompt, tgN = N\n"
        "generated tokens, ppP+tgG = both timed together, each after -d tokens of context (random ids,\n"
        "greedy, no stop ids). a row: tok/s (mean +- standard deviation of -r runs), the bytes the test\n"
        "must move per second and their fraction of a copy bandwidth measured in the same run.\n"
        "\n"
        "  -p LIST                prompt lengths, e.g. 512,4096; 0 = none (512)\n"
        "  -n LIST                generation lengths, e.g. 128; 0 = none (128)\n"
        "  -pg P,G                a P-token prompt then G generated tokens; repeatable (none)\n"
        "  -d LIST                context depth before each test, e.g. 0,4096,32768 (0)\n"
        "  -r N                   timed runs per test (5)\n"
        "  --warmup N             untimed runs per test before them (1)\n"
        "  --prefill-chunk N      prompt tokens per forward call, depth prefill included (1024)\n"
        "  --sample               sample with ninfer's defaults (temperature 0.6, top-k 20, top-p 0.95,\n"
        "                         presence 1.0) instead of greedy\n"
        "  --spec mtp             mtp speculative decoding in the generation tests, with the draft\n"
        "  --draft-tokens K       window K (1..5); rows add the acceptance; with --spec, -p and -pg\n"
        "  --lm-head-draft        need -d 0\n"
        "  --kv-dtype T           bf16 | int8 | fp8 kv cache on the gpu (bf16)\n"
        "  --kv-capacity N|auto   kv rows to allocate on the gpu (default: what the tests need)\n"
        "  --no-cuda-graph        decode eagerly instead of replaying cuda graphs\n"
        "  --cpu                  the cpu reference path (automatic without a gpu)\n"
        "  --device N             cuda device (0)\n"
        "  -o table|json|csv      output format on stdout (table); progress goes to stderr\n"
        "  -h, --help             this text\n");
}

// "512,4096" -> values in [lo, hi], else one line naming the flag
static std::vector<int> bench_list(const char* flag, const char* v, int lo, int hi) {
    std::vector<int> out;
    std::string s = v;
    size_t p = 0;
    if (s.empty()) die("%s: empty list (give e.g. 512,4096)", flag);
    while (p <= s.size()) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        std::string item = s.substr(p, q - p);
        if (item.empty()) die("%s: '%s' has an empty item (give e.g. 512,4096)", flag, v);
        out.push_back((int)parse_int(flag, item.c_str(), lo, hi));
        p = q + 1;
    }
    return out;
}

static void bench_parse(int argc, char** argv, BenchArgs* b) {
    bool got_p = false, got_n = false, got_d = false;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        auto value = [&]() -> const char* { if (i + 1 >= argc) die("%s needs a value", a); return argv[++i]; };
        auto list = [&](std::vector<int>* dst, bool* got, int lo) {  // repeated flags add to the list
            std::vector<int> v = bench_list(a, value(), lo, 1 << 24);
            if (!*got) dst->clear();
            *got = true;
            dst->insert(dst->end(), v.begin(), v.end());
        };
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { bench_usage(stdout); exit(0); }
        else if (!strcmp(a, "-p")) list(&b->p, &got_p, 0);
        else if (!strcmp(a, "-n")) list(&b->n, &got_n, 0);
        else if (!strcmp(a, "-d")) list(&b->depth, &got_d, 0);
        else if (!strcmp(a, "-pg")) {
            const char* v = value();
            std::vector<int> x = bench_list(a, v, 1, 1 << 24);
            if (x.size() != 2) die("-pg: '%s' is not a pair P,G (e.g. 512,128)", v);
            b->pg.push_back({x[0], x[1]});
        }
        else if (!strcmp(a, "-r")) b->reps = (int)parse_int(a, value(), 1, 1000);
        else if (!strcmp(a, "--warmup")) b->warmup = (int)parse_int(a, value(), 0, 1000);
        else if (!strcmp(a, "--prefill-chunk")) b->prefill_chunk = (int)parse_int(a, value(), 1, 1 << 24);
        else if (!strcmp(a, "--sample")) b->sample = true;
        else if (!strcmp(a, "--cpu")) b->cpu = true;
        else if (!strcmp(a, "--spec")) {
            b->spec_name = value();
            if (strcmp(b->spec_name, "mtp")) die("--spec: '%s' is not supported (ninfer-bench runs mtp)", b->spec_name);
        }
        else if (!strcmp(a, "--draft-tokens")) b->spec.K = (int)parse_int(a, value(), 1, SPEC_MAX_K);
        else if (!strcmp(a, "--lm-head-draft")) b->spec.lm_head_draft = true;
        else if (!strcmp(a, "-o")) {
            const char* v = value();
            if (!strcmp(v, "table")) b->output = BENCH_TABLE;
            else if (!strcmp(v, "json")) b->output = BENCH_JSON;
            else if (!strcmp(v, "csv")) b->output = BENCH_CSV;
            else die("-o: '%s' is not one of table, json, csv", v);
        }
        else if (gpu_parse_flag(argc, argv, &i, &b->gopt)) {}
        else if (a[0] == '-' && a[1] != '\0') { fprintf(stderr, "ninfer-bench: error: unknown option '%s'\n", a); bench_usage(stderr); exit(1); }
        else if (!b->model_path) b->model_path = a;
        else die("unexpected argument '%s' (the model path was already given as '%s')", a, b->model_path);
    }
    if (!b->model_path) { bench_usage(stderr); exit(1); }
    if (b->spec_name && !b->spec.K) die("--spec mtp needs --draft-tokens");
    if (!b->spec_name && b->spec.K) die("--draft-tokens needs --spec");
    if (!b->spec_name && b->spec.lm_head_draft) die("--lm-head-draft needs --spec");
    // a prompt after a depth would leave the mtp rows of the depth's last token unmade (they
    // wait for a sampled token): with --spec only generation tests take a depth
    if (b->spec.K && (!b->pg.empty() || std::count(b->p.begin(), b->p.end(), 0) < (long)b->p.size()))
        for (int d : b->depth)
            if (d > 0) die("-d %d with --spec: -p and -pg tests need -d 0 (give -p 0 to time only generation at depth)", d);
}

static std::vector<BenchTest> bench_tests(const BenchArgs& b) {
    std::vector<BenchTest> t;
    for (int d : b.depth) {
        for (int p : b.p) if (p > 0) t.push_back({p, 0, d});
        for (int n : b.n) if (n > 0) t.push_back({0, n, d});
        for (auto [p, n] : b.pg) t.push_back({p, n, d});
    }
    return t;
}

static std::string bench_name(const BenchTest& t) {
    std::string s = t.p && t.g ? "pp" + std::to_string(t.p) + "+tg" + std::to_string(t.g) : t.p ? "pp" + std::to_string(t.p) : "tg" + std::to_string(t.g);
    if (t.depth) s += " @ d" + std::to_string(t.depth);
    return s;
}

// what a forward call must read: every resident matrix once (the embedding one row a token,
// unless it is the head), the deltanet states read and written; kv bytes of one context row
struct BenchBytes { double weights = 0, state = 0, kv_row = 0; };
static BenchBytes bench_bytes(const Model& m, bool gpu, int kv) {
    const Geometry& g = m.geo;
    BenchBytes b;
    for (const TensorObject& t : m.art.objects)
        if (!t.resource && t.name.rfind("text/", 0) == 0 && t.name.rfind("text/draft_head", 0) != 0) b.weights += (double)t.bytes;
    const TensorObject* emb = artifact_find(&m.art, "text/token_embedding");
    if (emb && !g.tied) b.weights -= (double)emb->bytes - (double)emb->bytes / g.vocab;
    b.state = 2.0 * g.n_gdn * ((double)g.Hv * g.dk * g.dv * 4 + 3.0 * g.conv_dim * 2);
    b.kv_row = gpu ? (double)gpu_kv_bytes_per_row(g, kv) : 2.0 * g.n_full * g.Hkv * g.head_dim * sizeof(float);
    return b;
}
// a test's bytes: each prefill piece reads the matrices once and the kv before its end, and
// writes its rows; each decode step reads the matrices and the kv of its context
static double bench_test_bytes(const BenchBytes& b, const BenchTest& t, int chunk) {
    double bytes = 0;
    int ctx = t.p ? t.depth : std::max(1, t.depth);
    for (int i = 0; i < t.p; i += chunk) {
        const int T = std::min(chunk, t.p - i);
        bytes += b.weights + b.state + b.kv_row * (ctx + T + T);
        ctx += T;
    }
    for (int i = 0; i < t.g; i++, ctx++) bytes += b.weights + b.state + b.kv_row * (ctx + 1);
    return bytes;
}

// read + written bytes per second of memcpy over two 256 MiB buffers split across the openmp
// threads (the median of 5 after a warm-up): the cpu path's ceiling
static double cpu_copy_bandwidth() {
    const size_t n = 256ull << 20, parts = 64;
    std::vector<char> a(n, 1), b(n, 2);
    std::vector<double> s;
    for (int r = 0; r < 6; r++) {
        double t0 = now_s();
        #pragma omp parallel for schedule(static)
        for (size_t k = 0; k < parts; k++) memcpy(b.data() + k * (n / parts), a.data() + k * (n / parts), n / parts);
        if (r) s.push_back(now_s() - t0);
    }
    std::sort(s.begin(), s.end());
    return 2.0 * n / s[s.size() / 2] / 1e9;
}

struct BenchRow {
    BenchTest t;
    std::vector<double> tps;   // per timed run
    double mean = 0, sd = 0, ms = 0, gbs = 0, frac = 0;
    SpecStats spec;            // summed over the timed runs (--spec)
};

// one run of a test from an empty sequence: its timed seconds (and the round statistics)
static double bench_once(Engine* en, const BenchTest& t, const std::vector<int>& ids, const SamplerParams& sp, int domain, SpecStats* spec) {
    engine_reset(en);
    Sampler smp;
    sampler_build(&smp, sp, domain);
    auto none = [](int) {};
    auto check = [&](const GenStats& s, int want) {
        CHECK(s.generated == want, "the bench generated %d of %d tokens", s.generated, want);
        if (s.spec.K) {
            spec->K = s.spec.K; spec->rounds += s.spec.rounds; spec->drafted += s.spec.drafted; spec->accepted += s.spec.accepted;
        }
    };
    if (!t.p) {  // decode after the depth's prompt; the first pick is from the prompt's logits, then t.g steps
        std::vector<int> pre(ids.begin(), ids.begin() + std::max(1, t.depth));
        GenStats s = engine_generate(en, &smp, pre, t.g + 1, {}, nullptr, none);
        check(s, t.g + 1);
        return s.decode_s;
    }
    if (t.depth) engine_generate(en, &smp, std::vector<int>(ids.begin(), ids.begin() + t.depth), 0, {}, nullptr, none);
    std::vector<int> prompt(ids.begin() + t.depth, ids.begin() + t.depth + t.p);
    GenStats s = engine_generate(en, &smp, prompt, t.g ? t.g + 1 : 0, {}, nullptr, none);
    if (t.g) check(s, t.g + 1);
    return s.prefill_s + (t.g ? s.decode_s : 0);
}

// csv fields are quoted when they hold a comma, a quote or a line break
static std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
    std::string o = "\"";
    for (char c : s) { if (c == '"') o += '"'; o += c; }
    return o + "\"";
}

static int bench_main(int argc, char** argv) {
    BenchArgs b;
    bench_parse(argc, argv, &b);
    const std::vector<BenchTest> tests = bench_tests(b);
    if (tests.empty()) die("no tests: -p, -n and -pg leave nothing to run");
    Model m;
    std::string err;
    if (!model_open(&m, b.model_path, &err)) die("%s", err.c_str());
    FrontendIds fr;
    if (!frontend_ids(&m, &fr, &err)) die("%s", err.c_str());
    // the sequence holds the largest test (and a verification window)
    int need = 1;
    for (const BenchTest& t : tests) need = std::max(need, std::max(t.p ? t.depth : 1, t.depth) + t.p + t.g + 1 + b.spec.K + 1);
    b.gopt.max_context = need;
    b.gopt.prefill_chunk = std::min(b.prefill_chunk, need);
    b.gopt.tune = gpu_tuning_from_env();
    b.gopt.quiet = true;
    Engine en;
    double t0 = now_s();
    if (!engine_start(&en, &m, b.cpu, b.gopt, b.spec, "ninfer-bench", &err)) die("%s", err.c_str());
    std::string device;
    double bw;
    int threads = 1;
    if (en.gpu) {
        cudaDeviceProp prop; cudaCheck(cudaGetDeviceProperties(&prop, en.g->device));
        device = prop.name;
        bw = gpu_copy_bandwidth(en.g);
    } else {
        #ifdef _OPENMP
        threads = omp_get_max_threads();
        #endif
        device = "cpu, " + std::to_string(threads) + " thread" + (threads > 1 ? "s" : "");
        bw = cpu_copy_bandwidth();
    }
    const BenchBytes bb = bench_bytes(m, en.gpu, b.gopt.kv);
    const char* kv = en.gpu ? kv_dtype_name(b.gopt.kv) : "f32";
    const int chunk = en.gpu ? en.g->T_max : en.rs.T_max;  // prompt tokens per forward call, as the engine runs them
    fprintf(stderr, "ninfer-bench: %s on %s (%s), engine built in %.2f s; copy bandwidth %.1f GB/s (read + write); "
            "a decode token reads %.4f GB (+ %.1f KB kv per context row); kv %s, prefill chunk %d, graphs %s%s\n",
            m.art.model_id.c_str(), en.gpu ? "the gpu" : "the cpu reference path", device.c_str(), now_s() - t0, bw,
            (bb.weights + bb.state) / 1e9, bb.kv_row / 1e3, kv, chunk, en.gpu && b.gopt.graphs ? "on" : "off",
            b.spec.K ? (", mtp K=" + std::to_string(b.spec.K) + (b.spec.lm_head_draft ? " (draft head)" : "")).c_str() : "");
    std::vector<int> ids(need);
    std::mt19937_64 rng(1);
    for (int& id : ids) id = (int)(rng() % fr.domain);
    SamplerParams sp;
    if (!b.sample) sp.temperature = 0;

    const std::string backend = en.gpu ? "gpu" : "cpu";
    const bool spec = b.spec.K > 0;
    auto row_json = [&](const BenchRow& r) {
        std::string s = "{\"model\":";
        json_escape(&s, m.art.model_id);
        s += ",\"backend\":\"" + backend + "\",\"device\":";
        json_escape(&s, device);
        char buf[512];
        snprintf(buf, sizeof buf, ",\"kv\":\"%s\",\"graphs\":%s,\"prefill_chunk\":%d,\"sampling\":\"%s\",\"spec\":", kv,
                 en.gpu && b.gopt.graphs ? "true" : "false", chunk, b.sample ? "default" : "greedy");
        s += buf;
        if (spec) { snprintf(buf, sizeof buf, "{\"method\":\"mtp\",\"draft_tokens\":%d,\"lm_head_draft\":%s}", b.spec.K, b.spec.lm_head_draft ? "true" : "false"); s += buf; }
        else s += "null";
        s += ",\"test\":";
        json_escape(&s, bench_name(r.t));
        snprintf(buf, sizeof buf, ",\"n_prompt\":%d,\"n_gen\":%d,\"n_depth\":%d,\"reps\":%d,\"warmup\":%d,\"avg_ts\":%.3f,\"stddev_ts\":%.3f,\"avg_ms\":%.4f,"
                 "\"gbs\":%.4f,\"copy_gbs\":%.2f,\"copy_fraction\":%.6f,\"samples_ts\":[", r.t.p, r.t.g, r.t.depth, b.reps, b.warmup, r.mean, r.sd, r.ms, r.gbs, bw, r.frac);
        s += buf;
        for (size_t i = 0; i < r.tps.size(); i++) { snprintf(buf, sizeof buf, "%s%.3f", i ? "," : "", r.tps[i]); s += buf; }
        s += "]";
        if (spec && r.t.g) {
            snprintf(buf, sizeof buf, ",\"rounds\":%ld,\"drafted\":%ld,\"accepted\":%ld,\"acceptance\":%.5f", r.spec.rounds, r.spec.drafted, r.spec.accepted,
                     r.spec.drafted ? (double)r.spec.accepted / r.spec.drafted : 0.0);
            s += buf;
        }
        return s + "}";
    };
    if (b.output == BENCH_TABLE) {
        printf("| model | backend | kv | test | t/s | ms | GB/s | copy |%s\n", spec ? " accept |" : "");
        printf("| --- | --- | --- | --- | ---: | ---: | ---: | ---: |%s\n", spec ? " ---: |" : "");
    } else if (b.output == BENCH_CSV) {
        printf("model,backend,device,kv,graphs,prefill_chunk,sampling,spec_draft_tokens,test,n_prompt,n_gen,n_depth,reps,avg_ts,stddev_ts,avg_ms,gbs,copy_gbs,copy_fraction,acceptance\n");
    } else printf("[");
    for (size_t k = 0; k < tests.size(); k++) {
        const BenchTest& t = tests[k];
        BenchRow r;
        r.t = t;
        SpecStats ignored;
        for (int w = 0; w < b.warmup; w++) bench_once(&en, t, ids, sp, fr.domain, &ignored);
        double sum_s = 0;
        for (int i = 0; i < b.reps; i++) {
            const double s = bench_once(&en, t, ids, sp, fr.domain, &r.spec);
            sum_s += s;
            r.tps.push_back((t.p + t.g) / std::max(s, 1e-12));
        }
        for (double x : r.tps) r.mean += x / r.tps.size();
        for (double x : r.tps) r.sd += (x - r.mean) * (x - r.mean);
        r.sd = r.tps.size() > 1 ? sqrt(r.sd / (r.tps.size() - 1)) : 0.0;
        r.ms = 1e3 * sum_s / b.reps;
        r.gbs = bench_test_bytes(bb, t, chunk) / (sum_s / b.reps) / 1e9;
        r.frac = r.gbs / bw;
        const double acc = r.spec.drafted ? (double)r.spec.accepted / r.spec.drafted : 0.0;
        if (b.output == BENCH_TABLE) {
            printf("| %s | %s | %s | %s | %.2f ± %.2f | %.2f | %.1f | %.1f%% |", m.art.model_id.c_str(), backend.c_str(), kv, bench_name(t).c_str(), r.mean, r.sd,
                   r.ms, r.gbs, 100.0 * r.frac);
            if (spec) printf(t.g ? " %.3f |" : " - |", acc);
            printf("\n");
        } else if (b.output == BENCH_CSV) {
            printf("%s,%s,%s,%s,%d,%d,%s,%d,%s,%d,%d,%d,%d,%.3f,%.3f,%.4f,%.4f,%.2f,%.6f,%s\n", csv_field(m.art.model_id).c_str(), backend.c_str(),
                   csv_field(device).c_str(), kv, en.gpu && b.gopt.graphs ? 1 : 0, chunk, b.sample ? "default" : "greedy", b.spec.K,
                   csv_field(bench_name(t)).c_str(), t.p, t.g, t.depth, b.reps, r.mean, r.sd, r.ms, r.gbs, bw, r.frac,
                   spec && t.g ? std::to_string(acc).c_str() : "");
        } else printf("%s\n  %s", k ? "," : "", row_json(r).c_str());
        fflush(stdout);
    }
    if (b.output == BENCH_JSON) printf("\n]\n");
    engine_free(&en);
    model_close(&m);
    return 0;
}

int main(int argc, char** argv) {
    // the server and the bench are the same binary under other names (or ninfer --bench)
    const char* base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    if (!strcmp(base, "ninfer-serve")) return serve_main(argc, argv, ServeBackend{served_supports, served_load});
    if (!strcmp(base, "ninfer-bench")) return bench_main(argc, argv);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--bench")) {
            std::vector<char*> rest(argv, argv + argc);
            rest.erase(rest.begin() + i);
            return bench_main(argc - 1, rest.data());
        }

    CliArgs c;
    cli_parse(argc, argv, &c);
    if (c.info) return cli_info(c);
    if (c.decode_out || c.pixels_out) return cli_media(c);
    if (!c.inputs) die("nothing to do: give --prompt TEXT, --messages FILE, --raw-prompt TEXT, --prompt-ids IDS, --perplexity FILE, --tokenize or --info");

    TextModel t;
    std::string err;
    if (!text_model_open(&t, c.model_path, &err)) die("%s", err.c_str());
    if (c.tokenize) return cli_tokenize(&t);
    TextRequest rq;
    MediaPrompt mp;
    if (!cli_prompt(c, &t, &rq, &mp)) { model_close(&t.m); return 0; }  // --render
    if (c.spec_name) { t.spec.K = c.draft_tokens; t.spec.lm_head_draft = c.lm_head_draft; }
    if (!text_model_start(&t, c.cpu, c.gopt, "ninfer", &err)) die("%s", err.c_str());
    MmPrompt mm;
    if (!mp.items.empty()) {  // the tower is resident only now (startup residency: media asked for it)
        if (c.spec_name) fprintf(stderr, "ninfer: --spec mtp: a prompt with images or video decodes one token at a time (the mtp rows of vision tokens are not built)\n");
        if ((int)rq.prompt.size() >= engine_capacity(&t.en))
            die("the prompt has %zu tokens with its media, no room left in --max-context %d (raise it)", rq.prompt.size(), engine_capacity(&t.en));
        if (!text_vision_start(&t, &err) || !text_media_tower(&t, rq.prompt, mp, &mm, &err)) die("%s", err.c_str());
        rq.mm = &mm;
    }
    if (c.ppl_path) return cli_perplexity(c, &t);
    return cli_generate(c, &t, rq);
}

#endif  // NINFER_TESTING
