// ninfer: inference for the Qwen3.5 dense family (hybrid gated deltanet + gated attention,
// mtp head, vision tower) from .ninfer artifacts, in one cuda translation unit.
//
// contents (sections are in dependency order; grep for the banner "// === N.")
//   1. includes and checks   CHECK macros, cuda error checks, timers
//   2. geometry              the model's dimensions, read from the artifact's tensor shapes
//   3. weights               plain structs of views into the mmap'd artifact; the binder
//                            that validates the whole inventory
//   4. reference path (cpu)  the model math in fp32, the oracle for every kernel:
//                            4.1 row decode + matmul, 4.2 norms, 4.3 SeqState (kv, conv and
//                            recurrent state; snapshot/restore) and RunState, 4.4 attention
//                            with m-rope, 4.5 gated deltanet (conv, chunked + recurrent delta
//                            rule), 4.6 mlp, layer, forward_cpu, mtp_forward_cpu, prefill_cpu
//   5. sampler               greedy / temperature / top-k / top-p / min-p / penalties,
//                            counter-based rng
//   6. generation (cpu)      token domain and stop ids from the artifact, the generation
//                            loop, perplexity
//   (gpu_wip.cuh)            gpu kernels, the gpu forward and Engine (one sequence on either
//                            path); staged in a header while it is written, folded in later
//   7. info                  --info: identity, geometry, object classes, resources
//   8. text and serving      chat template -> tokens -> Engine -> reasoning / content / tool
//                            calls with stop strings; serve.h's engine interface
//   9. cli                   poor man's argparse and main (left out when NINFER_TESTING)
//
// the model math is in shared/docs/model.md, the container in shared/docs/format.md.
// user-facing contract: stdout carries only generated text or the requested diagnostic
// output; progress, stats and errors go to stderr; exit code 0 only on success.

// === 1. includes and checks ==================================================

#include <stdio.h>     // defines: printf, fprintf
#include <stdlib.h>    // defines: exit, strtol
#include <stdint.h>    // defines: int64_t, uint16_t
#include <stdarg.h>    // defines: va_list
#include <string.h>    // defines: strcmp, memcpy
#include <math.h>      // defines: expf, sqrtf
#include <time.h>      // defines: clock_gettime
#include <ctype.h>     // defines: isspace
#include <errno.h>     // defines: errno
#include <omp.h>       // defines: omp_get_max_threads
#include <string>      // defines: std::string
#include <vector>      // defines: std::vector
#include <algorithm>   // defines: std::sort, std::max
#include <type_traits> // defines: std::is_void_v
#include <cuda_runtime.h>  // defines: cudaGetDeviceCount, cudaMalloc
#include "format.h"    // defines: Json, Artifact, artifact_open, Mat, mat_rows, mat_row_dequant
#include "tokenizer.h" // defines: Tokenizer, tokenizer_encode, chat_render, TextOut, OutEvent
#include "serve.h"     // defines: serve_main, ServeBackend, ServeEngine (the http server)

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

static bool model_open(Model* m, const char* path, std::string* err) {
    if (!artifact_open(&m->art, path, err)) return false;
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
// and sums are fp32, the deltanet state is fp32. nothing is rounded to bf16: what this matches
// is hugging face in float32 with the artifact's weights (bf16 values or dequantized codes).
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
//   per deltanet layer: conv window [conv_dim, 3] (the last three raw in_proj_qkv outputs,
//     oldest first; 3.7) and the recurrent state [Hv, dk, dv] (3.5)
//   the mtp layer's own key/value cache (model.md 5.1), when the model has one
// a copy of the block plus the scalars is a complete snapshot (speculative decoding, prefix
// reuse). kv rows are position-addressed: restoring an older snapshot and writing again
// simply overwrites the rows past its position.

struct SeqState {
    int capacity = 0;     // kv rows, = --max-context
    int pos = 0;          // tokens processed: the next kv row
    int rope_delta = 0;   // m-rope: a text token at kv row p rotates by position p + rope_delta (model.md 6.7)
    int mtp_pos = 0;      // rows in the mtp kv cache
    size_t n_floats = 0;
    float* block = nullptr;                  // the one allocation; the views below point into it
    float* key[MAX_LAYERS] = {};             // full layers: [capacity, Hkv, hd]
    float* value[MAX_LAYERS] = {};
    float* conv[MAX_LAYERS] = {};            // gdn layers: [conv_dim, 3]
    float* rec[MAX_LAYERS] = {};             // gdn layers: [Hv, dk, dv]
    float* mtp_key = nullptr, *mtp_value = nullptr;  // [capacity, Hkv, hd]
};

static void seq_build(SeqState* s, const Geometry& g, int capacity) {
    CHECK(capacity > 0, "capacity %d", capacity);
    *s = SeqState();
    s->capacity = capacity;
    size_t kv = (size_t)capacity * g.Hkv * g.head_dim;
    size_t conv = (size_t)g.conv_dim * 3, rec = (size_t)g.Hv * g.dk * g.dv;
    s->n_floats = (size_t)g.n_full * 2 * kv + (size_t)g.n_gdn * (conv + rec) + (g.has_mtp ? 2 * kv : 0);
    s->block = (float*)calloc(s->n_floats, sizeof(float));
    CHECK(s->block, "out of memory for the sequence state (%zu MiB)", s->n_floats * 4 >> 20);
    float* p = s->block;
    for (int l = 0; l < g.L; l++) {
        if (g.full[l]) { s->key[l] = p; p += kv; s->value[l] = p; p += kv; }
        else { s->conv[l] = p; p += conv; s->rec[l] = p; p += rec; }
    }
    if (g.has_mtp) { s->mtp_key = p; p += kv; s->mtp_value = p; p += kv; }
}

static void seq_free(SeqState* s) { free(s->block); *s = SeqState(); }

// forget the sequence: position 0, zero conv and recurrent states (kv rows are overwritten)
static void seq_reset(SeqState* s) {
    memset(s->block, 0, s->n_floats * sizeof(float));
    s->pos = s->rope_delta = s->mtp_pos = 0;
}

// dst := src. both were built for the same model and capacity (dst keeps its own block).
static void seq_copy(SeqState* dst, const SeqState* src) {
    CHECK(dst->n_floats == src->n_floats && dst->capacity == src->capacity, "seq_copy between different shapes");
    memcpy(dst->block, src->block, src->n_floats * sizeof(float));
    dst->pos = src->pos; dst->rope_delta = src->rope_delta; dst->mtp_pos = src->mtp_pos;
}
// ([[maybe_unused]]: callers so far are the tests; speculative decoding and prefix reuse come later)
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
};

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

// rotate the first rope_dim dims of one head, rotate_half (neox) style; the rest pass
static void rope_apply(float* x, const float* cos, const float* sin, int half) {
    for (int i = 0; i < half; i++) {
        float x0 = x[i], x1 = x[i + half];
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
    // 2. per-head q/k rmsnorm (1+w), then rope; k and v go to the cache
    #pragma omp parallel for schedule(static) if ((int64_t)T * ld * 8 >= PARALLEL_MIN)
    for (int t = 0; t < T; t++) {
        const float* c = r->rope_cos + t * half; const float* s = r->rope_sin + t * half;
        for (int h = 0; h < g.Hq; h++) {
            float* q = r->qk + (size_t)t * ld + h * hd;
            rmsnorm(q, q, w.query_norm, hd, g.eps);
            rope_apply(q, c, s, half);
        }
        for (int h = 0; h < g.Hkv; h++) {
            float* k = r->qk + (size_t)t * ld + qd + h * hd;
            rmsnorm(k, k, w.key_norm, hd, g.eps);
            rope_apply(k, c, s, half);
            memcpy(kcache + ((size_t)(row0 + t) * g.Hkv + h) * hd, k, hd * sizeof(float));
            memcpy(vcache + ((size_t)(row0 + t) * g.Hkv + h) * hd, r->gv + (size_t)t * ld + qd + h * hd, hd * sizeof(float));
        }
    }
    // 3. causal softmax attention, query head h reading kv head h / (Hq/Hkv); then the
    //    sigmoid output gate
    const float scale = 1.0f / sqrtf((float)hd);
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
            float sum = 0.0f;
            for (int j = 0; j < n; j++) { sc[j] = expf(sc[j] - mx); sum += sc[j]; }
            float* o = r->att + (size_t)t * qd + h * hd;
            for (int d = 0; d < hd; d++) o[d] = 0.0f;
            for (int j = 0; j < n; j++) {
                const float p = sc[j] / sum;
                const float* v = vcache + ((size_t)j * g.Hkv + kvh) * hd;
                for (int d = 0; d < hd; d++) o[d] += p * v[d];
            }
            const float* gate = r->gv + (size_t)t * ld + h * hd;
            for (int d = 0; d < hd; d++) o[d] *= sigmoid(gate[d]);
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

// one token of the gated delta rule for one value head (3.5), state S [dk, dv]:
//   S <- e^g S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q
static void gdn_recurrent_step(float* S, const float* q, const float* k, const float* v, float g, float beta,
                               float* o, int dk, int dv) {
    float decay = expf(g);
    float m[128];
    CHECK(dv <= 128, "dv %d", dv);
    for (int j = 0; j < dv; j++) m[j] = 0.0f;
    for (int i = 0; i < dk; i++) {
        float* Si = S + (size_t)i * dv;
        for (int j = 0; j < dv; j++) { Si[j] *= decay; m[j] += Si[j] * k[i]; }
    }
    for (int j = 0; j < dv; j++) m[j] = beta * (v[j] - m[j]);  // m becomes delta
    for (int j = 0; j < dv; j++) o[j] = 0.0f;
    for (int i = 0; i < dk; i++) {
        float* Si = S + (size_t)i * dv;
        for (int j = 0; j < dv; j++) { Si[j] += k[i] * m[j]; o[j] += Si[j] * q[i]; }
    }
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

// a deltanet layer over T tokens (3.9). reads r->xb, writes r->out; conv_state [conv_dim, 3]
// and S [Hv, dk, dv] carry over between calls.
static void gdn_cpu(const Geometry& g, RunState* r, const GdnWeights& w, float* conv_state, float* S, int T) {
    const int C = g.conv_dim, kd = g.Hk * g.dk, vd = g.Hv * g.dv;
    // 1. projections: u = [q | k | v] (the conv input), z, a, b
    matmul(r->qkv, C, r->xb, g.H, w.query_key, T);
    matmul(r->qkv + 2 * kd, C, r->xb, g.H, mat_rows(w.value_z, 0, vd), T);
    matmul(r->z, vd, r->xb, g.H, mat_rows(w.value_z, vd, vd), T);
    matmul(r->ga, g.Hv, r->xb, g.H, w.a_proj, T);
    matmul(r->gb, g.Hv, r->xb, g.H, w.b_proj, T);
    // 2. causal conv + silu, carrying the conv window
    gdn_conv(r->conv, r->qkv, conv_state, w.convolution, T, C);
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
            *b = sigmoid(*b);
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
        if (T == 1) gdn_recurrent_step(Sh, q, k, v, r->ga[h], r->gb[h], o, g.dk, g.dv);
        else gdn_chunked(Sh, q, k, v, C, r->ga + h, r->gb + h, g.Hv, o, vd, T, g.dk, g.dv, r->chunk + h * gdn_chunk_scratch(g));
    }
    // 6. gated rmsnorm per head (plain w, 3.8): o / rms(o) * w * silu(z); then the output projection
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < g.Hv; h++) {
            float* o = r->core + (size_t)t * vd + h * g.dv;
            const float* z = r->z + (size_t)t * vd + h * g.dv;
            float ss = 0.0f;
            for (int j = 0; j < g.dv; j++) ss += o[j] * o[j];
            const float rs = 1.0f / sqrtf(ss / g.dv + g.eps);
            for (int j = 0; j < g.dv; j++) o[j] = (w.norm.at(j) * (o[j] * rs)) * silu(z[j]);
        }
    }
    matmul(r->out, g.H, r->core, vd, w.output, T);
}

// ---- 4.6 mlp, layer, forward -------------------------------------------------------------

// swiglu (4.2): down(silu(gate x) * up x). reads r->xb, writes r->out
static void mlp_cpu(const Geometry& g, RunState* r, const LayerWeights& w, int T) {
    matmul(r->mlp, 2 * g.I, r->xb, g.H, w.gate_up, T);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < g.I; i++)
            r->hb[(size_t)t * g.I + i] = silu(r->mlp[(size_t)t * 2 * g.I + i]) * r->mlp[(size_t)t * 2 * g.I + g.I + i];
    matmul(r->out, g.H, r->hb, g.I, w.down, T);
}

// one decoder layer (4.3) on r->x [T, H]. full layers use kcache/vcache from kv row row0 on;
// deltanet layers use conv_state and S.
static void layer_cpu(const Geometry& g, RunState* r, const LayerWeights& w, float* kcache, float* vcache,
                      float* conv_state, float* S, int row0, int T) {
    for (int t = 0; t < T; t++) rmsnorm(r->xb + (size_t)t * g.H, r->x + (size_t)t * g.H, w.input_norm, g.H, g.eps);
    if (w.full) attention_cpu(g, r, w.attn, kcache, vcache, row0, T);
    else gdn_cpu(g, r, w.gdn, conv_state, S, T);
    for (size_t i = 0; i < (size_t)T * g.H; i++) r->x[i] += r->out[i];
    for (int t = 0; t < T; t++) rmsnorm(r->xb + (size_t)t * g.H, r->x + (size_t)t * g.H, w.post_norm, g.H, g.eps);
    mlp_cpu(g, r, w, T);
    for (size_t i = 0; i < (size_t)T * g.H; i++) r->x[i] += r->out[i];
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
    for (int t = 0; t < T; t++) rmsnorm(r->xb + (size_t)t * g.H, r->x + (size_t)t * g.H, norm, g.H, g.eps);
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
static void forward_cpu(const Model* m, RunState* r, SeqState* st, const int* ids, const float* embed_override,
                        const int* pos3, int T, float* logits, bool all_logits, float* hidden_out) {
    const Geometry& g = m->geo;
    CHECK(T >= 1 && T <= r->T_max, "forward of %d tokens (at most %d per call)", T, r->T_max);
    CHECK(r->capacity >= st->capacity, "run state for %d rows, sequence of %d", r->capacity, st->capacity);
    CHECK(st->pos + T <= st->capacity, "context overflow: %d + %d > %d", st->pos, T, st->capacity);
    embed_cpu(m, r->x, ids, embed_override, T);
    rope_tables(r, g, pos3, st->pos + st->rope_delta, T);
    for (int l = 0; l < g.L; l++)
        layer_cpu(g, r, m->w.layers[l], st->key[l], st->value[l], st->conv[l], st->rec[l], st->pos, T);
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
[[maybe_unused]] static void mtp_forward_cpu(const Model* m, RunState* r, SeqState* st, const int* ids, const float* embed_override,
                            const float* hidden, const int* pos3, int T, float* logits, bool all_logits, float* hidden_out) {
    const Geometry& g = m->geo;
    const MtpWeights& w = m->w.mtp;
    CHECK(g.has_mtp, "the model has no mtp module");
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

struct SamplerParams {
    float temperature = 0.6f;  // <= 0: greedy
    float top_p = 0.95f;
    int top_k = 20;            // <= 0: no limit
    float min_p = 0.0f;
    float presence = 1.0f;     // presence penalty
    float frequency = 0.0f;    // frequency penalty
    uint64_t seed = 0;
};

enum { RNG_PREFILL = 0, RNG_DECODE = 1 };  // the purpose key: first token after a prefill, later tokens

struct Sampler {
    SamplerParams p;
    int domain = 0;                         // sample ids [0, domain)
    std::vector<int> counts;                // [domain] times each id was generated
    std::vector<std::pair<float, int>> cand;  // scratch: (adjusted logit, id)
};

static void sampler_build(Sampler* s, const SamplerParams& p, int domain) {
    s->p = p; s->domain = domain;
    s->counts.assign(domain, 0);
    s->cand.reserve(domain);
}

// record a generated token (for the penalties)
static void sampler_accept(Sampler* s, int id) { if (id >= 0 && id < s->domain) s->counts[id]++; }

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
// uniform in [0, 1) from (seed, position, purpose)
static float rng_uniform(uint64_t seed, uint64_t position, int purpose) {
    uint64_t x = splitmix64(splitmix64(splitmix64(seed) ^ position) ^ (uint64_t)purpose);
    return (float)(x >> 40) * (1.0f / 16777216.0f);
}

static int argmax(const float* x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;  // strict: the lowest id wins ties
    return best;
}

// pick the next token from logits [>= domain] for sequence position `position`
static int sample(Sampler* s, const float* logits, uint64_t position, int purpose) {
    const SamplerParams& p = s->p;
    if (p.temperature <= 0.0f) return argmax(logits, s->domain);
    auto& c = s->cand;
    c.clear();
    for (int i = 0; i < s->domain; i++) {
        float adj = logits[i];
        if (s->counts[i]) adj -= p.presence + p.frequency * (float)s->counts[i];
        c.emplace_back(adj, i);
    }
    auto before = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    // the candidates c[0..n) are sorted only as far as needed: c[0..sorted) is the sorted head
    size_t n = c.size(), sorted = 0;
    auto sort_upto = [&](size_t k) {
        k = std::min(k, n);
        if (k > sorted) { std::partial_sort(c.begin() + sorted, c.begin() + k, c.begin() + n, before); sorted = k; }
    };
    if (p.top_k > 0 && (size_t)p.top_k < n) {
        std::partial_sort(c.begin(), c.begin() + p.top_k, c.end(), before);
        n = sorted = p.top_k;
    }
    sort_upto(1);
    // weights relative to the best candidate: w = exp(adj/T - max)
    const float inv_t = 1.0f / p.temperature, top = c[0].first * inv_t;
    auto weight = [&](size_t i) { return expf(c[i].first * inv_t - top); };
    float total = 0.0f;
    size_t above_min_p = 0;  // the candidates with w >= min_p (the best has w = 1): a sorted prefix
    for (size_t i = 0; i < n; i++) { float w = weight(i); total += w; above_min_p += w >= p.min_p; }
    size_t keep = p.min_p > 0.0f ? std::max<size_t>(above_min_p, 1) : n;
    if (p.top_p < 1.0f) {  // the shortest sorted prefix reaching top_p of the total
        float cum = 0.0f;
        size_t k = 0;
        for (size_t chunk = 64; k < n && (k == 0 || cum < p.top_p * total); chunk *= 4) {
            sort_upto(k + chunk);
            while (k < sorted && (k == 0 || cum < p.top_p * total)) cum += weight(k++);
        }
        keep = std::min(keep, k);
    }
    if (keep < n) sort_upto(keep);  // the kept set is the best `keep` (the draw walks them in array order)
    float mass = 0.0f;
    for (size_t i = 0; i < keep; i++) mass += weight(i);
    float u = rng_uniform(p.seed, position, purpose) * mass;
    for (size_t i = 0; i < keep; i++) {
        u -= weight(i);
        if (u < 0.0f) return c[i].second;
    }
    return c[keep - 1].second;  // u landed on the rounding edge
}

// === 6. generation (cpu) =====================================================
//
// what the cli runs on the reference path: the token domain and stop ids from the artifact's
// frontend resources, a generation loop, --logits-out and --perplexity.

// what generation needs from the artifact's frontend resources (never hard-coded ids):
//   domain  the ids the tokenizer can produce: 1 + the largest id of tokenizer.json (model.vocab
//           and added_tokens), at most the embedding rows; all rows when there is no tokenizer.
//           for qwen3.5 this is 248077 of 248320 rows.
//   stops   the default stop ids: generation_config.json eos_token_id (an int or a list), and
//           tokenizer_config.json's eos_token looked up in tokenizer.json
struct FrontendIds {
    int domain = 0;
    std::vector<int> stops;
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

struct GenStats {
    int prompt = 0, generated = 0;   // generated counts emitted ids (a stop id is not emitted)
    double prefill_s = 0, decode_s = 0;
    bool stopped = false; int stop_id = -1;  // ended on a stop id
    bool cancelled = false;          // the emitter asked to stop (stop string, client gone)
};

// emitters may return void (always go on) or bool (false: stop after this id)
template <typename Emit>
static bool emit_more(Emit& emit, int id) {
    if constexpr (std::is_void_v<decltype(emit(id))>) { emit(id); return true; }
    else return emit(id);
}

// generate up to max_new tokens after the prompt. each id is passed to emit as it is
// sampled (emit may return false to end generation there); a stop id ends generation and is
// not emitted. generation also ends when the
// sequence reaches its capacity. with logits_out, the prompt's logits [n, vocab] are written there.
template <typename Emit>
static GenStats generate_cpu(const Model* m, RunState* r, SeqState* st, Sampler* smp, const std::vector<int>& prompt,
                             int max_new, const std::vector<int>& stop_ids, FILE* logits_out, Emit emit) {
    const Geometry& g = m->geo;
    GenStats s;
    s.prompt = (int)prompt.size();
    const int piece = logits_out ? logits_piece(r, g.vocab) : r->T_max;
    std::vector<float> logits((size_t)g.vocab * (logits_out ? piece : 1));
    double t0 = now_s();
    for (int i = 0; i < s.prompt; i += piece) {  // prefill, piece by piece
        int T = std::min(piece, s.prompt - i);
        forward_cpu(m, r, st, prompt.data() + i, nullptr, nullptr, T, logits.data(), logits_out != nullptr, nullptr);
        if (!logits_out) continue;
        CHECK(fwrite(logits.data(), sizeof(float) * g.vocab, T, logits_out) == (size_t)T, "writing logits");
        if (i + T == s.prompt) memmove(logits.data(), logits.data() + (size_t)(T - 1) * g.vocab, sizeof(float) * g.vocab);
    }
    s.prefill_s = now_s() - t0;
    t0 = now_s();
    for (int n = 0; n < max_new; n++) {
        int id = sample(smp, logits.data(), st->pos, n == 0 ? RNG_PREFILL : RNG_DECODE);
        if (std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) { s.stopped = true; s.stop_id = id; break; }
        sampler_accept(smp, id);
        s.generated++;
        if (!emit_more(emit, id)) { s.cancelled = true; break; }  // a stop string, or the client left
        if (n + 1 == max_new || st->pos == st->capacity) break;  // done, or no room to feed it back
        forward_cpu(m, r, st, &id, nullptr, nullptr, 1, logits.data(), false, nullptr);
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
// nll and the number of scored tokens; ppl = exp(nll / n).
static double perplexity_cpu(const Model* m, RunState* r, SeqState* st, const std::vector<int>& ids, int window, int64_t* scored) {
    const Geometry& g = m->geo;
    const int piece = logits_piece(r, g.vocab);
    std::vector<float> logits((size_t)piece * g.vocab);
    double nll = 0.0;
    *scored = 0;
    for (size_t w0 = 0; w0 < ids.size(); w0 += window) {
        int n = (int)std::min<size_t>(window, ids.size() - w0);
        seq_reset(st);
        for (int i = 0; i < n; i += piece) {
            int T = std::min(piece, n - i);
            forward_cpu(m, r, st, ids.data() + w0 + i, nullptr, nullptr, T, logits.data(), true, nullptr);
            for (int t = 0; t < T && i + t + 1 < n; t++) {  // row t predicts token i+t+1 of the window
                nll += token_nll(logits.data() + (size_t)t * g.vocab, g.vocab, ids[w0 + i + t + 1]);
                (*scored)++;
            }
        }
    }
    return nll;
}

// gpu kernels and the gpu forward are staged in gpu_wip.cuh while the cpu reference
// (sections 4-6) is written in parallel; they are folded into this file, in this
// place, when both land. keep this include here, after the cpu reference.
#include "gpu_wip.cuh"

// === 7. info =================================================================

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

// === 8. text and serving =====================================================
//
// the path from text to text, shared by the cli and the server: render the chat template,
// tokenize, generate on either path (Engine: cpu reference or gpu), and split the output
// into reasoning, content and tool calls with stop strings (tokenizer.h's TextOut).

// a loaded model with its tokenizer and its engine (one sequence)
struct TextModel {
    Model m;
    Tokenizer tok;
    FrontendIds fr;
    Engine en;
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

// build the engine: on the gpu unless `cpu` or there is none (then a notice on stderr)
static bool text_model_start(TextModel* t, bool cpu, const GpuOpts& o, const char* who, std::string* err) {
    bool gpu = !cpu && gpu_count() > 0;
    if (!cpu && !gpu) fprintf(stderr, "%s: no gpu found: running the cpu reference path\n", who);
    return engine_build(&t->en, &t->m, gpu, o, err);
}

static void text_model_close(TextModel* t) { engine_free(&t->en); model_close(&t->m); }

// one generation request in token space, with its output handling
struct TextRequest {
    std::vector<int> prompt;
    bool thinking_open = false;       // the prompt ends inside <think>: output starts as reasoning
    bool raw = false;                 // no reasoning/content split, special tokens kept (--raw-output)
    bool tools = false;               // parse <tool_call> blocks
    std::vector<std::string> stop, reasoning_stop;  // stop strings per channel
    std::vector<int> stop_ids;        // model defaults + caller's
    int max_new = 128;
    SamplerParams sp;
};

struct TextResult {
    GenStats gen;
    std::string stop_hit;  // the stop string that ended generation, if one did
    int tool_calls = 0;
};

// run rq on t's engine from an empty sequence. on_event(const OutEvent&, int id) gets every
// piece of output as it is decoded and returns false to stop (e.g. the client left); each
// event's bytes are complete utf-8.
template <typename OnEvent>
static TextResult generate_text(TextModel* t, const TextRequest& rq, OnEvent on_event) {
    TextResult res;
    Sampler smp;
    sampler_build(&smp, rq.sp, t->fr.domain);
    engine_reset(&t->en);
    TextOut to;
    text_out_init(&to, rq.thinking_open, rq.raw);
    to.parser.stop = rq.stop;
    to.parser.reasoning_stop = rq.reasoning_stop;
    to.parser.parse_tools = rq.tools;
    std::vector<OutEvent> evs;
    bool alive = true;
    res.gen = engine_generate(&t->en, &smp, rq.prompt, rq.max_new, rq.stop_ids, nullptr, [&](int id) -> bool {
        bool go = text_out_push(&to, &t->tok, id, &evs);
        for (const OutEvent& e : evs) if (alive && !on_event(e, id)) alive = false;
        evs.clear();
        if (!go) res.stop_hit = to.parser.stop_hit;
        return go && alive;
    });
    if (res.stop_hit.empty() && alive) {  // flush what the decoder and the parser still hold
        text_out_finish(&to, &evs);
        for (const OutEvent& e : evs) if (alive && !on_event(e, -1)) alive = false;
    }
    res.tool_calls = to.parser.tool_calls;
    return res;
}

// ---- the server's engine (serve.h's interface) --------------------------------

struct ServedModel {
    ServeEngine api;  // what serve.h sees; api.self points back here
    TextModel t;
};

static bool served_prepare(void* self, const ServeChat& chat, ServePrompt* out, ServeError* err) {
    ServedModel* s = (ServedModel*)self;
    if (!chat.reasoning_effort.empty()) {
        err->code = "reasoning_effort_not_supported"; err->param = "reasoning_effort";
        err->message = "this model's chat template has no reasoning effort levels";
        return false;
    }
    ChatOptions o;
    o.enable_thinking = chat.enable_thinking ? 1 : 0;
    o.developer_as_system = true;
    std::string text, msg;
    if (!chat_render(chat.messages, chat.tools.is_array() ? &chat.tools : nullptr, o, &text, &msg)) {
        err->message = "the conversation cannot be rendered with the chat template: " + msg;
        return false;
    }
    tokenizer_encode(&s->t.tok, text, &out->tokens);
    out->thinking = chat_thinking_open(text);
    out->tools = chat.tools.is_array();
    return true;
}

static void served_generate(void* self, const ServePrompt& p, const ServeSampling& smp, const ServeSink& sink, ServeResult* res) {
    ServedModel* s = (ServedModel*)self;
    TextRequest rq;
    rq.prompt = p.tokens;
    rq.thinking_open = p.thinking;
    rq.tools = p.tools;
    rq.stop = smp.stop;
    rq.stop_ids = s->t.fr.stops;
    rq.max_new = smp.max_tokens;
    rq.sp.temperature = smp.temperature; rq.sp.top_p = smp.top_p; rq.sp.top_k = smp.top_k; rq.sp.min_p = smp.min_p;
    rq.sp.presence = smp.presence_penalty; rq.sp.frequency = smp.frequency_penalty; rq.sp.seed = smp.seed;
    bool cancelled = false;
    TextResult r = generate_text(&s->t, rq, [&](const OutEvent& e, int) {
        ServeEvent ev;
        ev.kind = (ServeEventKind)e.kind; ev.text = e.text; ev.tool_name = e.name; ev.tool_args = e.arguments;
        if (!sink.emit(sink.ctx, ev) || sink.cancelled(sink.ctx)) { cancelled = true; return false; }
        return true;
    });
    res->prompt_tokens = r.gen.prompt;
    res->completion_tokens = r.gen.generated + (r.gen.stopped ? 1 : 0);  // a withheld stop id counts
    res->prefill_s = r.gen.prefill_s;
    res->decode_s = r.gen.decode_s;
    res->stop_string = r.stop_hit;
    bool full = r.gen.generated >= smp.max_tokens || engine_pos(&s->t.en) == engine_capacity(&s->t.en);
    res->finish = r.tool_calls > 0 ? "tool_calls"
                : (r.gen.stopped || !r.stop_hit.empty() || cancelled) ? "stop"
                : full ? "length" : "stop";
}

static void served_close(void* self) {
    ServedModel* s = (ServedModel*)self;
    text_model_close(&s->t);
    delete s;
}

// the features behind server flags that this build has (serve.h asks before loading)
static bool served_supports(const char* feature) {
    bool gpu = gpu_count() > 0;
    if (!strcmp(feature, "--kv-dtype int8") || !strcmp(feature, "--kv-dtype fp8") || !strcmp(feature, "--kv-capacity"))
        return gpu;  // kv formats and pools are gpu-side; the cpu reference keeps fp32 kv
    return false;
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
    if (!text_model_open(&s->t, path, err) || !text_model_start(&s->t, false, g, "ninfer-serve", err)) { delete s; return nullptr; }
    s->api.self = s;
    s->api.model_id = s->t.m.art.model_id;
    s->api.max_context = engine_capacity(&s->t.en);
    s->api.n_vocab = s->t.fr.domain;
    s->api.vision = false;
    s->api.prepare = served_prepare;
    s->api.generate = served_generate;
    s->api.close = served_close;
    return &s->api;
}

// === 9. cli ==================================================================

#ifndef NINFER_TESTING

static void usage(FILE* f) {
    fprintf(f,
        "usage: ninfer MODEL.ninfer (--prompt TEXT | --messages FILE | --raw-prompt TEXT | --prompt-ids IDS) [options]\n"
        "       ninfer MODEL.ninfer (--perplexity FILE | --tokenize | --render | --info)\n"
        "       ninfer-serve MODEL.ninfer [server options]   (ninfer-serve --help lists them)\n"
        "\n"
        "input:\n"
        "  --prompt TEXT          one user message, rendered with the model's chat template\n"
        "  --messages FILE        a json array of messages, or {\"messages\": [...], \"tools\": [...]}\n"
        "  --raw-prompt TEXT      text completion: the text is tokenized as is, no chat template (ninfer)\n"
        "  --prompt-ids IDS       the prompt as token ids, e.g. 1,2,3 (output: generated ids)\n"
        "  --no-thinking          render the non-thinking generation prompt (thinking is the default)\n"
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
        "\n"
        "execution:\n"
        "  --cpu                  the cpu reference path (automatic when there is no gpu)\n"
        "  --device N             cuda device (0)\n"
        "  --kv-dtype T           bf16 | int8 | fp8 kv cache on the gpu (bf16)\n"
        "  --kv-capacity N|auto   kv rows to allocate (default: --max-context)\n"
        "  --no-cuda-graph        run decode eagerly instead of replaying a cuda graph\n"
        "\n"
        "diagnostics:\n"
        "  --tokenize             read text on stdin, print its token ids\n"
        "  --render               print the rendered prompt (with --prompt or --messages) and exit\n"
        "  --print-token-ids      print prompt and generated ids on stderr, each id beside its text\n"
        "  --logits-out FILE      write the prompt's logits as float32 [prompt tokens, vocab rows]\n"
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
    FILE* f = fopen(path, "rb");
    if (!f) die("%s: cannot open: %s", path, strerror(errno));
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

int main(int argc, char** argv) {
    // the server is the same binary under another name
    const char* base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    if (!strcmp(base, "ninfer-serve")) return serve_main(argc, argv, ServeBackend{served_supports, served_load});

    // defaults: NInfer's (reference-engine.md 2.1)
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
    GpuOpts gopt;                      // --device, --kv-dtype, --kv-capacity, --no-cuda-graph

    // poor man's argparse
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        auto value = [&]() -> const char* { if (i + 1 >= argc) die("%s needs a value", a); return argv[++i]; };
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--info")) info = true;
        else if (!strcmp(a, "--tokenize")) tokenize = true;
        else if (!strcmp(a, "--render")) render = true;
        else if (!strcmp(a, "--cpu")) cpu = true;
        else if (!strcmp(a, "--prompt")) prompt_text = value();
        else if (!strcmp(a, "--messages")) messages_path = value();
        else if (!strcmp(a, "--raw-prompt")) raw_prompt = value();
        else if (!strcmp(a, "--prompt-ids")) prompt_ids = value();
        else if (!strcmp(a, "--logits-out")) logits_path = value();
        else if (!strcmp(a, "--perplexity")) ppl_path = value();
        else if (!strcmp(a, "--max-new")) max_new = (int)parse_int(a, value(), 0, INT32_MAX);
        else if (!strcmp(a, "--max-context")) max_context = (int)parse_int(a, value(), 1, INT32_MAX);
        else if (!strcmp(a, "--prefill-chunk")) prefill_chunk = (int)parse_int(a, value(), 1, INT32_MAX);
        else if (!strcmp(a, "--greedy")) greedy = true;
        else if (!strcmp(a, "--temperature")) sp.temperature = parse_float(a, value(), 0, 2);
        else if (!strcmp(a, "--top-p")) sp.top_p = parse_float(a, value(), 0, 1);
        else if (!strcmp(a, "--top-k")) sp.top_k = (int)parse_int(a, value(), INT32_MIN, INT32_MAX);
        else if (!strcmp(a, "--min-p")) sp.min_p = parse_float(a, value(), 0, 1);
        else if (!strcmp(a, "--presence-penalty")) sp.presence = parse_float(a, value(), -2, 2);
        else if (!strcmp(a, "--frequency-penalty")) sp.frequency = parse_float(a, value(), -2, 2);
        else if (!strcmp(a, "--seed")) sp.seed = parse_u64(a, value());
        else if (!strcmp(a, "--stop-token-id")) user_stops.push_back((int)parse_int(a, value(), 0, INT32_MAX));
        else if (!strcmp(a, "--stop")) { const char* v = value(); if (!*v) die("--stop: empty string"); stop_strings.push_back(v); }
        else if (!strcmp(a, "--reasoning-stop")) { const char* v = value(); if (!*v) die("--reasoning-stop: empty string"); reasoning_stops.push_back(v); }
        else if (!strcmp(a, "--no-thinking")) no_thinking = true;
        else if (!strcmp(a, "--raw-output")) raw_output = true;
        else if (!strcmp(a, "--print-token-ids")) print_ids = true;
        else if (!strcmp(a, "--spec") || !strcmp(a, "--draft-tokens") || !strcmp(a, "--lm-head-draft") || !strcmp(a, "--vision") ||
                 !strcmp(a, "--reasoning-effort"))
            die("%s is not supported yet", a);
        else if (gpu_parse_flag(argc, argv, &i, &gopt)) {}
        else if (a[0] == '-' && a[1] != '\0') { fprintf(stderr, "ninfer: error: unknown option '%s'\n", a); usage(stderr); return 1; }
        else if (!model_path) model_path = a;
        else die("unexpected argument '%s' (the model path was already given as '%s')", a, model_path);
    }
    if (!model_path) { usage(stderr); return 1; }
    if (greedy) sp.temperature = 0.0f;
    int inputs = !!prompt_text + !!messages_path + !!raw_prompt + !!prompt_ids + !!ppl_path + tokenize;
    if (inputs > 1) die("give one of --prompt, --messages, --raw-prompt, --prompt-ids, --perplexity, --tokenize");
    if (render && !prompt_text && !messages_path) die("--render needs --prompt or --messages");
    if (logits_path && (!(prompt_text || messages_path || raw_prompt || prompt_ids) || render))
        die("--logits-out needs a prompt (--prompt, --messages, --raw-prompt or --prompt-ids)");
    gopt.max_context = max_context;
    gopt.prefill_chunk = std::min(prefill_chunk, max_context);

    Model m;
    std::string err;
    if (info) {
        if (!model_open(&m, model_path, &err)) die("%s", err.c_str());
        print_info(stdout, &m);
        model_close(&m);
        return 0;
    }
    if (!inputs) die("nothing to do: give --prompt TEXT, --messages FILE, --raw-prompt TEXT, --prompt-ids IDS, --perplexity FILE, --tokenize or --info");

    // text in: render the chat template or take the text as is; tokenize
    TextModel t;
    if (!text_model_open(&t, model_path, &err)) die("%s", err.c_str());
    if (tokenize) {
        std::string text, line;
        char buf[1 << 16]; size_t n;
        while ((n = fread(buf, 1, sizeof buf, stdin)) > 0) text.append(buf, n);
        std::vector<int> ids;
        tokenizer_encode(&t.tok, text, &ids);
        for (size_t i = 0; i < ids.size(); i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
        model_close(&t.m);
        return 0;
    }
    TextRequest rq;
    std::string rendered;
    bool ids_out = prompt_ids != nullptr;  // ids in, ids out
    if (prompt_text || messages_path) {
        Json messages, tools;
        if (prompt_text) messages = chat_messages_from_prompt(prompt_text);
        else if (!chat_parse_request(read_file(messages_path), &messages, &tools, &err)) die("%s: %s", messages_path, err.c_str());
        chat_from_openai(&messages);
        ChatOptions co;
        co.enable_thinking = no_thinking ? 0 : -1;
        co.developer_as_system = true;
        if (!chat_render(messages, tools.is_array() ? &tools : nullptr, co, &rendered, &err))
            die("%s: %s", messages_path ? messages_path : "--prompt", err.c_str());
        if (render) { fwrite(rendered.data(), 1, rendered.size(), stdout); model_close(&t.m); return 0; }
        tokenizer_encode(&t.tok, rendered, &rq.prompt);
        rq.thinking_open = chat_thinking_open(rendered);
        rq.tools = tools.is_array();
    } else if (raw_prompt) {  // a completion: no template, no reasoning channel, no tool calls
        tokenizer_encode(&t.tok, raw_prompt, &rq.prompt);
        if (rq.prompt.empty()) die("--raw-prompt: the text has no tokens");
    } else if (prompt_ids) {
        if (!parse_ids(prompt_ids, &rq.prompt) || rq.prompt.empty()) die("--prompt-ids: '%s' is not a list of token ids (e.g. 1,2,3)", prompt_ids);
    }
    const int domain = t.fr.domain;
    const Geometry& g = t.m.geo;
    if (!text_model_start(&t, cpu, gopt, "ninfer", &err)) die("%s", err.c_str());

    if (ppl_path) {
        std::string text = read_file(ppl_path);
        std::vector<int> ids;
        bool as_ids = parse_ids(text.c_str(), &ids);
        if (!as_ids) tokenizer_encode(&t.tok, text, &ids);  // a text file
        if (ids.size() < 2) die("%s: needs at least 2 tokens, has %zu", ppl_path, ids.size());
        for (size_t i = 0; i < ids.size(); i++)
            if (ids[i] >= g.vocab) die("%s: token %zu is id %d, outside the vocabulary [0, %d)", ppl_path, i, ids[i], g.vocab);
        double t0 = now_s();
        int64_t n = 0;
        double nll = engine_perplexity(&t.en, ids, max_context, &n);
        if (n == 0) die("%s: no token was scored (every window has one token; raise --max-context)", ppl_path);
        printf("perplexity: %.6f over %lld tokens\n", exp(nll / n), (long long)n);
        fprintf(stderr, "ninfer: %zu tokens (%s) in windows of %d, %.2f s\n", ids.size(), as_ids ? "ids" : "text", max_context, now_s() - t0);
        text_model_close(&t);
        return 0;
    }

    for (size_t i = 0; i < rq.prompt.size(); i++)
        if (rq.prompt[i] < 0 || rq.prompt[i] >= domain) die("prompt id %d (position %zu) is outside the token domain [0, %d)", rq.prompt[i], i, domain);
    if ((int)rq.prompt.size() >= engine_capacity(&t.en))
        die("the prompt has %zu tokens, no room left in --max-context %d (raise it)", rq.prompt.size(), engine_capacity(&t.en));
    rq.stop_ids = t.fr.stops;
    for (int id : user_stops) {
        if (id >= domain) die("--stop-token-id %d is outside the token domain [0, %d)", id, domain);
        rq.stop_ids.push_back(id);
    }
    rq.stop = stop_strings;
    rq.reasoning_stop = reasoning_stops;
    rq.raw = rq.raw || raw_output;
    rq.max_new = max_new;
    rq.sp = sp;
    if (print_ids) {
        fprintf(stderr, "prompt ids:");
        for (int id : rq.prompt) fprintf(stderr, " %d", id);
        fprintf(stderr, "\n");
    }

    TextResult r;
    if (ids_out || logits_path) {  // token space: ids out (and the prompt's logits)
        FILE* lf = nullptr;
        if (logits_path && !(lf = fopen(logits_path, "wb"))) die("%s: cannot create: %s", logits_path, strerror(errno));
        Sampler smp;
        sampler_build(&smp, rq.sp, domain);
        std::vector<int> out;
        r.gen = engine_generate(&t.en, &smp, rq.prompt, rq.max_new, rq.stop_ids, lf, [&](int id) {
            if (ids_out) { printf(out.empty() ? "%d" : " %d", id); fflush(stdout); }
            out.push_back(id);
        });
        if (ids_out && !out.empty()) printf("\n");
        if (!ids_out) { std::string text = tokenizer_decode(&t.tok, out, !rq.raw); printf("%s\n", text.c_str()); }
        if (lf && fclose(lf) != 0) die("%s: write failed: %s", logits_path, strerror(errno));
    } else {  // text: content to stdout, reasoning to stderr, tool calls to stdout as json lines
        bool in_reasoning = false;
        r = generate_text(&t, rq, [&](const OutEvent& e, int id) {
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
            if (print_ids && id >= 0) fprintf(stderr, "[%d '%s']", id, show_piece(tokenizer_token_bytes(&t.tok, id)).c_str());
            return true;
        });
        printf("\n");
        fflush(stdout);
    }
    const GenStats& s = r.gen;
    fprintf(stderr, "ninfer: %s; prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens in %.3f s (%.1f tok/s)%s\n",
            t.en.gpu ? "gpu" : "cpu", s.prompt, s.prefill_s, s.prompt / std::max(s.prefill_s, 1e-9), s.generated, s.decode_s,
            s.generated > 1 ? (s.generated - 1) / std::max(s.decode_s, 1e-9) : 0.0,
            s.stopped ? ", stopped on a stop id" : !r.stop_hit.empty() ? ", stopped on a stop string"
            : engine_pos(&t.en) == engine_capacity(&t.en) ? ", context full" : "");
    text_model_close(&t);
    return 0;
}

#endif  // NINFER_TESTING
