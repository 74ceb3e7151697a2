// ninfer: inference for the Qwen3.5 dense family (hybrid gated deltanet + gated attention,
// mtp head, vision tower) from .ninfer artifacts, in one cuda translation unit.
//
// contents (sections are in dependency order; grep for the banner "// === N.")
//   1. includes and checks   CHECK macros, cuda error checks, timers
//   2. geometry              the model's dimensions, read from the artifact's tensor shapes
//   3. weights               plain structs of views into the mmap'd artifact; the binder
//                            that validates the whole inventory
//   4. info                  --info: identity, geometry, object classes, resources
//   5. cli                   poor man's argparse and main (left out when NINFER_TESTING)
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
#include <string>      // defines: std::string
#include <vector>      // defines: std::vector
#include <algorithm>   // defines: std::sort, std::max
#include <cuda_runtime.h>  // defines: cudaGetDeviceCount, cudaMalloc
#include "format.h"    // defines: Json, Artifact, artifact_open, Mat, mat_rows, mat_row_dequant

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

// gpu kernels and the gpu forward are staged in gpu_wip.cuh while the cpu reference
// (the section above) is written in parallel; they are folded into this file, in this
// place, when both land. keep this include here, after the cpu reference.
#include "gpu_wip.cuh"

// === 4. info =================================================================

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

// === 5. cli ==================================================================

#ifndef NINFER_TESTING

static void usage(FILE* f) {
    fprintf(f,
        "usage: ninfer MODEL.ninfer [options]\n"
        "       ninfer-serve MODEL.ninfer [server options]\n"
        "\n"
        "diagnostics:\n"
        "  --info                 print the artifact's identity, geometry, objects and resources\n"
        "  -h, --help             this text\n");
}

int main(int argc, char** argv) {
    const char* model_path = nullptr;
    bool info = false;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--info")) info = true;
        else if (a[0] == '-' && a[1] != '\0') { fprintf(stderr, "ninfer: error: unknown option '%s'\n", a); usage(stderr); return 1; }
        else if (!model_path) model_path = a;
        else die("unexpected argument '%s' (the model path was already given as '%s')", a, model_path);
    }
    if (!model_path) { usage(stderr); return 1; }
    Model m;
    std::string err;
    if (!model_open(&m, model_path, &err)) die("%s", err.c_str());
    if (info) { print_info(stdout, &m); model_close(&m); return 0; }
    die("nothing to do: give --info (generation arrives with the cpu reference path)");
}

#endif  // NINFER_TESTING
