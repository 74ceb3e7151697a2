#!/usr/bin/env python3
# make_goldens.py: the independent oracle for ninfer's CPU reference path.
#
# for each synthetic checkpoint (tiny, tiny-gqa1, tiny-gqa3, built by convert.py --synthetic) and each
# weight profile (bf16, groupwise-int) this loads the checkpoint into HF transformers'
# Qwen3_5ForConditionalGeneration in float32, puts in exactly the weight values the .ninfer artifact
# carries (bf16 words, or the dequantized groupwise-int codes), and writes what the C++ tests compare
# against:
#
#   test/golden/hf_<model>_<profile>.json   prompts of 1/7/64/65/200 tokens (one chunked prefill each),
#                                           32-step greedy decode through the cache, a split prefill
#                                           (40 + 25 tokens), MTP first pass + 3 draft steps, perplexity
#   test/golden/hf_<model>_<profile>.f32    one full logits row (7-token prompt, last position), raw LE f32
#   test/golden/ppl_tokens.txt              300 fixed token ids for the perplexity test
#
# HF has no MTP, so the MTP module below is ours, written from docs/model.md section 5, and
# cross-checked against HF's own Qwen3_5DecoderLayer. see test/reference/README.md for the
# schema, the numeric choices and how to run this (here and on the GPU machine).
#
# needs only torch, transformers, numpy, safetensors; no network. python3 make_goldens.py --help

import argparse
import copy
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import time

# hub kernels off before transformers is imported: we want the torch fallback paths everywhere
os.environ["USE_HUB_KERNELS"] = "0"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch
import safetensors
from safetensors import safe_open
import transformers
from transformers import Qwen3_5ForConditionalGeneration
import transformers.models.qwen3_5.modeling_qwen3_5 as hf_qwen

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MODELS = ["tiny", "tiny-gqa1", "tiny-gqa3"]
PROFILES = ["bf16", "groupwise-int"]
PROMPT_LENS = [1, 7, 64, 65, 200]
PROMPT_POSITIONS = [0, 1, 31, 62, 63, 64]  # plus len-1; clipped to [0, len)
TOP_K = 64
N_SUBSET = 2048
N_DECODE = 32
SPLIT_AT = 40  # split prefill of the 65-token prompt: 40 then 25 in one call
MTP_STEPS = 3  # autoregressive MTP steps after the first pass
PPL_LEN = 300
FORMAT_VERSION = 1
# records carrying the subset values (the rest carry top-64 + maxabs only, to stay within the size
# budget): prompt rows at the chunk boundary and the last row, decode steps 0, 1, 31, split prefill
# position 64, MTP first-pass rows 0, 6 and the last, every MTP draft step
FULL_PROMPT_POSITIONS = (63, 64)
FULL_DECODE_STEPS = (0, 1, 31)
TOL_CONSISTENT = 5e-5  # path-vs-path agreement we insist on: half the acceptance bound (1e-4)
MIN_MARGIN_REL = 2.5e-4  # greedy margins / max|logit| below this count as near ties (noise is ~1e-5)
MAX_ATTEMPTS = 8

# ----------------------------------------------------------------------------
# deterministic ids: splitmix64, so the streams never depend on a numpy/torch version

MASK64 = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.s = seed & MASK64

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n  # modulo bias is ~1e-14 for n < 2^18, irrelevant here


def prompt_ids(seed, length, domain):
    # one independent stream per prompt length
    r = SplitMix64(seed * 1000003 + length)
    return [r.below(domain) for _ in range(length)]


def decode_prompt_ids(seed, attempt, domain):
    # attempt 0 is the 7-token prompt of prompts[]; later attempts (near ties only) use fresh streams
    if attempt == 0:
        return prompt_ids(seed, 7, domain)
    r = SplitMix64(seed * 1000003 + 7 + 1000 * attempt)
    return [r.below(domain) for _ in range(7)]


def subset_ids(seed, vocab_rows, n):
    # n distinct rows over the whole logits row (padding rows past the tokenizer included), sorted
    r = SplitMix64(seed * 1000003 + 999983)
    s = set()
    while len(s) < n:
        s.add(r.below(vocab_rows))
    return sorted(s)


def ppl_token_ids(seed, domain):
    r = SplitMix64(seed * 1000003 + 777767)
    return [r.below(domain) for _ in range(PPL_LEN)]


# ----------------------------------------------------------------------------
# numerics helpers

def bf16_round(t):
    # f32 -> bf16 (round to nearest even, torch's cast) -> f32
    return t.to(torch.bfloat16).to(torch.float32)


def f32_json(v):
    # shortest decimal that round-trips to this float32 (numpy's str of a float32), returned as a python
    # float whose repr is that decimal. json.dumps then writes it verbatim; parsing it as a double and
    # casting to float (or strtof) gives back the exact float32, which we assert here.
    x = np.float32(v)
    if not np.isfinite(x):
        raise ValueError(f"non-finite value {x}")
    f = float(str(x))
    if np.float32(f) != x:
        raise AssertionError(f"float32 round trip failed for {x!r}")
    return f


def f32_list(arr):
    return [f32_json(v) for v in np.asarray(arr, dtype=np.float32).ravel()]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for blk in iter(lambda: f.read(1 << 20), b""):
            h.update(blk)
    return h.hexdigest()


# ----------------------------------------------------------------------------
# the canonical groupwise encoder MAXABS_F16_RECIP_RNE_V1 (format.md 6.3), our own numpy copy.
# convert.py's encoder is the one the artifact uses; when it can be found we run both and demand
# bit-identical codes and scales, and the artifact check decodes the .ninfer file itself.

GROUPED = {  # format -> (bits, group, qmin, qmax)
    "Q4G64_F16S": (4, 64, -8, 7),
    "Q5G64_F16S": (5, 64, -16, 15),
    "Q6G64_F16S": (6, 64, -32, 31),
    "W8G32_F16S": (8, 32, -127, 127),
}


def encode_groupwise_ref(x, fmt):
    # x: [N, K] float32. returns (codes int8 [N, ceil(K/G)*G], scales float16 [N, ceil(K/G)]).
    # lanes past K (partial last group) get code 0; the scale comes from the real values only.
    _, G, qmin, qmax = GROUPED[fmt]
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ValueError("non-finite weight")
    N, K = x.shape
    ng = -(-K // G)
    xp = np.zeros((N, ng * G), dtype=np.float32)
    xp[:, :K] = x
    xg = xp.reshape(N, ng, G)
    amax = np.abs(xg).max(axis=-1)  # f32
    raw = (amax / np.float32(qmax)).astype(np.float32)  # f32 division, RNE
    s16 = raw.astype(np.float16)  # f32 -> f16, RNE
    tiny = np.frombuffer(np.uint16(1).tobytes(), dtype=np.float16)[0]  # 2^-24
    s16 = np.where((s16 == 0) & (amax != 0), tiny, s16)
    zero = amax == 0
    s16 = np.where(zero, np.float16(0), s16)
    if not (np.isfinite(s16).all() and (s16[~zero] > 0).all()):
        raise ValueError("scale overflow")
    with np.errstate(divide="ignore"):
        inv = (np.float32(1) / s16.astype(np.float32)).astype(np.float32)
    inv = np.where(zero, np.float32(0), inv)
    prod = (xg * inv[..., None]).astype(np.float32)  # f32 multiply, RNE
    codes = np.clip(np.rint(prod), qmin, qmax).astype(np.int8)  # rint: half to even
    return codes.reshape(N, ng * G), s16


def decode_groupwise_ref(codes, scales, K, fmt):
    _, G, _, _ = GROUPED[fmt]
    N = codes.shape[0]
    ng = scales.shape[1]
    w = scales.astype(np.float32)[..., None] * codes.reshape(N, ng, G).astype(np.float32)  # exact in f32
    return w.reshape(N, ng * G)[:, :K]


class ConvertEncoder:
    # ours always runs; when convert.py is there its encode_groupwise(x, fmt) -> (codes int8 [N, K_pad],
    # scales fp16 words [N, gpr]) must give the same codes and scales bit for bit. (the artifact check
    # then decodes the .ninfer file itself, so convert.py's packing is covered too.)
    def __init__(self, path):
        self.encode = None
        if path and os.path.exists(path):
            spec = importlib.util.spec_from_file_location("ninfer_convert", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            self.encode = getattr(mod, "encode_groupwise", None)
            if self.encode is None:
                raise RuntimeError(f"{path} has no encode_groupwise(x, fmt)")

    def codes(self, x, fmt):
        codes, scales = encode_groupwise_ref(x, fmt)
        if self.encode is not None:
            c2, s2 = self.encode(np.ascontiguousarray(x, dtype=np.float32), fmt)
            ng = scales.shape[1]
            c2 = np.asarray(c2).reshape(x.shape[0], -1)[:, : ng * GROUPED[fmt][1]]
            s2 = np.asarray(s2).reshape(x.shape[0], -1)[:, :ng]
            s2 = s2.astype(np.uint16) if s2.dtype != np.float16 else s2.view(np.uint16)
            if not (np.array_equal(c2.astype(np.int32), codes.astype(np.int32))
                    and np.array_equal(s2, scales.view(np.uint16))):
                raise AssertionError(f"convert.py's encode_groupwise disagrees with MAXABS_F16_RECIP_RNE_V1 ({fmt})")
        return codes, scales

    def dequant(self, x, fmt):
        codes, scales = self.codes(x, fmt)
        return decode_groupwise_ref(codes, scales, x.shape[1], fmt), ("ours == convert.py" if self.encode else "ours")


def selftest_encoder(enc):
    # the rounding rules of format.md 6.3 on hand-made groups, then ours vs convert.py's on awkward data
    def one(vals, fmt):
        G = GROUPED[fmt][1]
        x = np.zeros((1, G), dtype=np.float32)
        x[0, :len(vals)] = vals
        c, s = enc.codes(x, fmt)
        return c[0, :len(vals)].tolist(), s.view(np.uint16)[0, 0]
    # Q4: amax 7 -> scale 1, so codes are rint-half-even of the values
    c, s = one([7, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5], "Q4G64_F16S")
    assert c == [7, 0, 0, 2, -2, 2, -2, 4] and s == 0x3C00, (c, hex(s))
    c, s = one([-127, 126.5, 0.5], "W8G32_F16S")  # never -128
    assert c == [-127, 126, 0] and s == 0x3C00, (c, hex(s))
    c, s = one([1e-9, -1e-9], "Q6G64_F16S")  # scale underflows fp16: rescued to 2^-24
    assert s == 0x0001 and c == [0, 0], (c, hex(s))
    c, s = one([0.0, -0.0], "Q5G64_F16S")  # all-zero group: scale +0, codes 0
    assert s == 0 and c == [0, 0], (c, hex(s))
    g = np.random.default_rng(7)
    for fmt in GROUPED:
        x = (g.standard_normal((37, 100)) * np.exp(g.uniform(-30, 3, (37, 1)))).astype(np.float32)
        x[3] = 0
        x[5, ::7] = 0.5
        enc.codes(x, fmt)  # raises if convert.py disagrees


# ----------------------------------------------------------------------------
# which artifact object every HF weight ends up in, and in which format (format.md 8.2, 8.4, 8.9).
# grouped formats are per row with groups along K, so quantizing each HF source tensor row by row
# gives exactly the values of the fused artifact objects; the q_proj query/gate interleave only
# decides which rows get Q4 (query) and which Q5 (gate).

P = "model.language_model."


def quant_plan(tc):
    # hf name -> list of (row index array or None for all rows, format). names absent here stay bf16.
    plan = {}
    hd = tc.head_dim
    Hq = tc.num_attention_heads
    kd = tc.linear_num_key_heads * tc.linear_key_head_dim
    vd = tc.linear_num_value_heads * tc.linear_value_head_dim
    plan[P + "embed_tokens.weight"] = [(None, "Q6G64_F16S")]
    if not tc.tie_word_embeddings:
        plan["lm_head.weight"] = [(None, "Q6G64_F16S")]
    rows = np.arange(Hq * 2 * hd)
    q_rows, g_rows = rows[rows % (2 * hd) < hd], rows[rows % (2 * hd) >= hd]
    for l, t in enumerate(tc.layer_types):
        p = f"{P}layers.{l}."
        if t == "full_attention":
            plan[p + "self_attn.q_proj.weight"] = [(q_rows, "Q4G64_F16S"), (g_rows, "Q5G64_F16S")]
            plan[p + "self_attn.k_proj.weight"] = [(None, "Q4G64_F16S")]
            plan[p + "self_attn.v_proj.weight"] = [(None, "Q5G64_F16S")]
            plan[p + "self_attn.o_proj.weight"] = [(None, "Q5G64_F16S")]
        else:
            plan[p + "linear_attn.in_proj_qkv.weight"] = [(np.arange(0, 2 * kd), "Q4G64_F16S"),
                                                          (np.arange(2 * kd, 2 * kd + vd), "Q5G64_F16S")]
            plan[p + "linear_attn.in_proj_z.weight"] = [(None, "Q5G64_F16S")]
            plan[p + "linear_attn.out_proj.weight"] = [(None, "Q5G64_F16S")]
        plan[p + "mlp.gate_proj.weight"] = [(None, "Q4G64_F16S")]
        plan[p + "mlp.up_proj.weight"] = [(None, "Q4G64_F16S")]
        plan[p + "mlp.down_proj.weight"] = [(None, "Q5G64_F16S")]
    for n in ("fc", "layers.0.self_attn.q_proj", "layers.0.self_attn.k_proj", "layers.0.self_attn.v_proj",
              "layers.0.self_attn.o_proj", "layers.0.mlp.gate_proj", "layers.0.mlp.up_proj",
              "layers.0.mlp.down_proj"):
        plan[f"mtp.{n}.weight"] = [(None, "W8G32_F16S")]
    return plan


def artifact_value(name, x, profile, plan, enc, stats):
    # x: checkpoint tensor (any float dtype). returns the float32 tensor the artifact holds for it.
    x = x.to(torch.float32)
    if name.endswith("linear_attn.A_log") or name.endswith("linear_attn.dt_bias"):
        return x  # FP32 in the artifact: a_log copied, dt_bias widened (exact)
    if profile == "groupwise-int" and name in plan:
        w = x.numpy().reshape(x.shape[0], -1).copy()
        for rows, fmt in plan[name]:
            sel = slice(None) if rows is None else rows
            w[sel], note = enc.dequant(w[sel], fmt)
            stats[fmt] = stats.get(fmt, 0) + 1
            stats["encoder"] = note
        return torch.from_numpy(w).reshape(x.shape)
    # BF16 objects: norms (gdn norm too: F32 in the checkpoint, BF16 in the artifact), conv, a/b proj,
    # and everything when profile == bf16. a no-op for tensors that are bf16 in the checkpoint.
    return bf16_round(x)


# ----------------------------------------------------------------------------
# the .ninfer reader for the artifact check (format.md 2, 6, 7): decode every tensor to float32

def read_ninfer(path):
    with open(path, "rb") as f:
        data = f.read()
    magic = data[:8]
    if magic[:7] != b"NINFER\0" or magic[7] not in (1, 2):
        raise ValueError(f"{path}: bad magic {magic!r}")
    (jb,) = struct.unpack("<Q", data[8:16])
    d = json.loads(data[16:16 + jb].decode("utf-8"))
    base = (16 + jb + 4095) // 4096 * 4096
    out = {}
    for o in d["objects"]:
        if o["kind"] != "tensor":
            continue
        buf = data[base + o["offset"]: base + o["offset"] + o["bytes"]]
        shape, fmt = o["shape"], o["format"]
        if fmt == "BF16":
            u = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            v = u.view(np.float32).reshape(shape)
        elif fmt == "FP32":
            v = np.frombuffer(buf, dtype="<f4").reshape(shape).copy()
        elif fmt == "I32":
            v = np.frombuffer(buf, dtype="<i4").reshape(shape).copy()
        elif fmt in GROUPED:
            bits, G, _, _ = GROUPED[fmt]
            N, K = shape
            gpr = (K + 127) // 128 * 128 // G
            hb = {4: 0, 5: 8, 6: 16, 8: 0}[bits]
            base_b = N * gpr * 32
            hi_off = (base_b + 255) // 256 * 256
            sc_off = hi_off + (N * gpr * hb + 255) // 256 * 256
            basep = np.frombuffer(buf, dtype=np.uint8, count=base_b).reshape(N, gpr, 32)
            if bits == 8:
                u = basep.view(np.int8).astype(np.int32)
            else:
                u = np.empty((N, gpr, G), dtype=np.int32)
                u[..., 0::2] = basep & 0xF
                u[..., 1::2] = basep >> 4
                if hb:
                    hp = np.frombuffer(buf, dtype=np.uint8, count=N * gpr * hb, offset=hi_off).reshape(N, gpr, hb)
                    bitsarr = np.unpackbits(hp, axis=-1, bitorder="little").astype(np.int32)  # [N,gpr,hb*8]
                    nh = bits - 4
                    bitsarr = bitsarr.reshape(N, gpr, G, nh)
                    for j in range(nh):
                        u |= bitsarr[..., j] << (4 + j)
                u = np.where(u >= (1 << (bits - 1)), u - (1 << bits), u)
            sc = np.frombuffer(buf, dtype="<f2", count=N * gpr, offset=sc_off).reshape(N, gpr)
            v = (sc.astype(np.float32)[..., None] * u.astype(np.float32)).reshape(N, gpr * G)[:, :K]
        else:
            raise ValueError(f"{o['name']}: format {fmt} not handled by the golden script")
        out[o["name"]] = (np.ascontiguousarray(v), fmt)
    return d, out


def artifact_to_hf(objs, tc, head_tied):
    # map decoded artifact objects back onto HF tensor names (inverse of format.md 8.9)
    hd = tc.head_dim
    Hq, Hkv = tc.num_attention_heads, tc.num_key_value_heads
    kd = tc.linear_num_key_heads * tc.linear_key_head_dim
    vd = tc.linear_num_value_heads * tc.linear_value_head_dim
    hf = {}
    g = lambda n: objs[n][0]
    hf[P + "embed_tokens.weight"] = g("text/token_embedding")
    hf[P + "norm.weight"] = g("text/final_norm")
    if not head_tied:
        hf["lm_head.weight"] = g("text/output_head")

    def attn(src, dst):
        nq, nk = Hq * hd, Hkv * hd
        if src.startswith("mtp/"):  # one [q, k, gate, v] object
            qkgv = g(src + "attention/query_key_gate_value")
            qk, gv = qkgv[:nq + nk], qkgv[nq + nk:]
        else:
            qk, gv = g(src + "attention/query_key"), g(src + "attention/gate_value")
        q = np.stack([qk[:nq].reshape(Hq, hd, -1), gv[:nq].reshape(Hq, hd, -1)], axis=1).reshape(2 * nq, -1)
        hf[dst + "self_attn.q_proj.weight"] = q
        hf[dst + "self_attn.k_proj.weight"] = qk[nq:]
        hf[dst + "self_attn.v_proj.weight"] = gv[nq:]
        hf[dst + "self_attn.q_norm.weight"] = g(src + "attention/query_norm")
        hf[dst + "self_attn.k_norm.weight"] = g(src + "attention/key_norm")
        hf[dst + "self_attn.o_proj.weight"] = g(src + "attention/output")

    def mlp(src, dst, I):
        gu = g(src + "mlp/gate_up")
        hf[dst + "mlp.gate_proj.weight"], hf[dst + "mlp.up_proj.weight"] = gu[:I], gu[I:]
        hf[dst + "mlp.down_proj.weight"] = g(src + "mlp/down")
        hf[dst + "input_layernorm.weight"] = g(src + "input_norm")
        hf[dst + "post_attention_layernorm.weight"] = g(src + "post_attention_norm")

    for l, t in enumerate(tc.layer_types):
        src, dst = f"text/layers/{l}/", f"{P}layers.{l}."
        if t == "full_attention":
            attn(src, dst)
        else:
            qk, vz = g(src + "gdn/query_key"), g(src + "gdn/value_z")
            hf[dst + "linear_attn.in_proj_qkv.weight"] = np.concatenate([qk, vz[:vd]])
            hf[dst + "linear_attn.in_proj_z.weight"] = vz[vd:]
            hf[dst + "linear_attn.in_proj_a.weight"] = g(src + "gdn/a_projection")
            hf[dst + "linear_attn.in_proj_b.weight"] = g(src + "gdn/b_projection")
            hf[dst + "linear_attn.conv1d.weight"] = g(src + "gdn/convolution").T.reshape(2 * kd + vd, 1, -1)
            hf[dst + "linear_attn.A_log"] = g(src + "gdn/a_log")
            hf[dst + "linear_attn.dt_bias"] = g(src + "gdn/dt_bias")
            hf[dst + "linear_attn.norm.weight"] = g(src + "gdn/norm")
            hf[dst + "linear_attn.out_proj.weight"] = g(src + "gdn/output")
        mlp(src, dst, tc.intermediate_size)
    if "mtp/input_projection" in objs:
        hf["mtp.fc.weight"] = g("mtp/input_projection")
        hf["mtp.pre_fc_norm_embedding.weight"] = g("mtp/embedding_norm")
        hf["mtp.pre_fc_norm_hidden.weight"] = g("mtp/hidden_norm")
        hf["mtp.norm.weight"] = g("mtp/final_norm")
        attn("mtp/layer/", "mtp.layers.0.")
        mlp("mtp/layer/", "mtp.layers.0.", tc.intermediate_size)
    return hf


# ----------------------------------------------------------------------------
# our MTP module (model.md 5.1), float32. everything is written out here, including the one
# full-attention decoder layer; check_mtp_layer() compares that layer with HF's Qwen3_5DecoderLayer.

def rms_1pw(x, w, eps):
    # zero-centred rmsnorm y = x * rsqrt(mean(x^2) + eps) * (1 + w), all f32 (model.md 4.1)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


class MTPRef:
    def __init__(self, W, tc, embed, head, device):
        self.W = {k: v.to(device) for k, v in W.items()}  # names without the "mtp." prefix
        self.eps = tc.rms_norm_eps
        self.hd = tc.head_dim
        self.Hq, self.Hkv = tc.num_attention_heads, tc.num_key_value_heads
        rp = getattr(tc, "rope_parameters", None) or {}
        theta = rp.get("rope_theta", getattr(tc, "rope_theta", 1e7))
        partial = rp.get("partial_rotary_factor", getattr(tc, "partial_rotary_factor", 0.25))
        self.rot = int(self.hd * partial)
        # text-only: all three M-RoPE axes carry the same position, so this is plain partial rope
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.rot, 2, dtype=torch.float32, device=device) / self.rot))
        self.embed, self.head = embed, head
        self.reset()

    def reset(self):
        self.k = self.v = self.kpos = None  # the MTP layer's own KV cache

    def rope(self, x, pos):  # x [T, heads, hd]; rotate_half on dims [0, rot)
        ang = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
        sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
        xr, xp = x[..., : self.rot], x[..., self.rot:]
        h = self.rot // 2
        rot = torch.cat([-xr[..., h:], xr[..., :h]], -1)
        return torch.cat([xr * cos + rot * sin, xp], -1)

    def attention(self, x, pos, W, use_cache=True):
        T, hd, Hq, Hkv = x.shape[0], self.hd, self.Hq, self.Hkv
        qg = (x @ W["self_attn.q_proj.weight"].T).view(T, Hq, 2 * hd)  # per head [query 256 | gate 256]
        q, gate = qg[..., :hd], qg[..., hd:].reshape(T, Hq * hd)
        k = (x @ W["self_attn.k_proj.weight"].T).view(T, Hkv, hd)
        v = (x @ W["self_attn.v_proj.weight"].T).view(T, Hkv, hd)
        q = self.rope(rms_1pw(q, W["self_attn.q_norm.weight"], self.eps), pos)
        k = self.rope(rms_1pw(k, W["self_attn.k_norm.weight"], self.eps), pos)
        if use_cache:
            if self.k is not None:
                k, v, kpos = torch.cat([self.k, k]), torch.cat([self.v, v]), torch.cat([self.kpos, pos])
            else:
                kpos = pos
            self.k, self.v, self.kpos = k, v, kpos
        else:
            kpos = pos
        rep = Hq // Hkv  # query head h reads kv head h // rep
        kx, vx = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = torch.einsum("thd,shd->hts", q, kx) * hd ** -0.5
        s = s.masked_fill(kpos[None, None, :] > pos[None, :, None], float("-inf"))
        o = torch.einsum("hts,shd->thd", torch.softmax(s, dim=-1), vx).reshape(T, Hq * hd)
        return (o * torch.sigmoid(gate)) @ W["self_attn.o_proj.weight"].T

    def layer(self, x, pos, W, use_cache=True):
        # one full-attention decoder layer (model.md 2 + 4.3)
        x = x + self.attention(rms_1pw(x, W["input_layernorm.weight"], self.eps), pos, W, use_cache)
        h = rms_1pw(x, W["post_attention_layernorm.weight"], self.eps)
        m = torch.nn.functional.silu(h @ W["mlp.gate_proj.weight"].T) * (h @ W["mlp.up_proj.weight"].T)
        return x + m @ W["mlp.down_proj.weight"].T

    def forward(self, tokens, hidden, pos):
        # tokens [T] (t_{p+1}), hidden [T,H] (main post-norm h_p, or our own previous output), pos [T] (p)
        W = self.W
        e = rms_1pw(self.embed[tokens], W["pre_fc_norm_embedding.weight"], self.eps)
        h = rms_1pw(hidden, W["pre_fc_norm_hidden.weight"], self.eps)
        c = torch.cat([e, h], -1) @ W["fc.weight"].T  # embedding first
        lw = {k[len("layers.0."):]: v for k, v in W.items() if k.startswith("layers.0.")}
        y = self.layer(c, pos, lw)
        out = rms_1pw(y, W["norm.weight"], self.eps)  # mtp.norm; this is also the next step's hidden
        return out @ self.head.T, out, c


# ----------------------------------------------------------------------------
# golden records

class Golden:
    def __init__(self, subset, domain):
        self.subset = np.asarray(subset, dtype=np.int64)
        self.domain = domain

    def rec(self, row, pos, full, **extra):
        # row: float32 logits [V]. full=True adds the values at all subset ids.
        r = row.detach().to("cpu", torch.float32).numpy()
        V = r.shape[0]
        order = np.lexsort((np.arange(V), -r))[:TOP_K]  # by value desc, ties by id asc
        d = r[: self.domain]
        a = int(np.argmax(d))  # greedy over the tokenizer domain, first index on ties
        second = np.max(np.delete(d, a))
        out = {"pos": int(pos)}
        out.update(extra)
        out.update({
            "maxabs": f32_json(np.abs(r).max()),
            "argmax": a,
            "margin": f32_json(r[a] - second),
            "top_ids": [int(i) for i in order],
            "top_vals": f32_list(r[order]),
        })
        if full:
            out["sub_vals"] = f32_list(r[self.subset])
        return out


def rel_err(a, b):
    # max over rows of max|a - b| / max|b| (a row = one logits vector): the acceptance test's measure
    a, b = a.double(), b.double()
    if b.dim() == 1:
        a, b = a[None], b[None]
    return float(((a - b).abs().amax(-1) / b.abs().amax(-1)).max())


# ----------------------------------------------------------------------------
# model setup

def force_torch_paths():
    # use the pure torch gated-delta-rule and conv implementations whatever is installed: the hub
    # decorators keep the torch function as __wrapped__ (functools.wraps)
    notes = {}
    for n in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
              "causal_conv1d_update"):
        f = getattr(hf_qwen, n, None)
        if f is None:
            notes[n] = "absent"
            continue
        base = f
        while hasattr(base, "__wrapped__"):
            base = base.__wrapped__
        setattr(hf_qwen, n, base)
        notes[n] = f"{base.__module__}.{base.__name__}"
    notes["fla_installed"] = importlib.util.find_spec("fla") is not None
    notes["causal_conv1d_installed"] = importlib.util.find_spec("causal_conv1d") is not None
    return notes


def load_checkpoint_tensors(ckpt):
    files = sorted(f for f in os.listdir(ckpt) if f.endswith(".safetensors"))
    t = {}
    for fn in files:
        with safe_open(os.path.join(ckpt, fn), framework="pt") as f:
            for k in f.keys():
                t[k] = f.get_tensor(k)
    return t


def token_domain(ckpt):
    # ids 0..max id of tokenizer.json (vocab + added tokens); the rest of the logits rows is padding
    p = os.path.join(ckpt, "tokenizer.json")
    if not os.path.exists(p):
        return None
    with open(p, encoding="utf-8") as f:
        tj = json.load(f)
    ids = list(tj.get("model", {}).get("vocab", {}).values()) + [a["id"] for a in tj.get("added_tokens", [])]
    return max(ids) + 1


def build_model(ckpt, profile, device, enc):
    model, info = Qwen3_5ForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    if info.get("missing_keys") or info.get("mismatched_keys") or info.get("error_msgs"):
        raise RuntimeError(f"{ckpt}: loading info {info}")
    model.eval()
    tc = model.config.text_config
    raw = load_checkpoint_tensors(ckpt)
    plan = quant_plan(tc)
    stats = {}
    ref = {k: artifact_value(k, v, profile, plan, enc, stats) for k, v in raw.items()
           if k.startswith(P) or k.startswith("mtp.") or k == "lm_head.weight"}
    # overwrite every text parameter with the artifact's value (and make sure each was in the file)
    seen = set()
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if name.startswith("model.visual."):
                continue
            if name not in ref:
                raise RuntimeError(f"{name} is not in the checkpoint")
            # what from_pretrained put there must be the checkpoint value itself (no hidden transform)
            if not torch.equal(prm.data, raw[name].to(torch.float32).reshape(prm.shape)):
                raise RuntimeError(f"{name}: HF's loaded value differs from the checkpoint's")
            prm.data.copy_(ref[name].reshape(prm.shape))
            seen.add(name)
    tied = tc.tie_word_embeddings
    lm = model.lm_head.weight
    emb = model.model.language_model.embed_tokens.weight
    if tied != (lm.data_ptr() == emb.data_ptr()):
        raise RuntimeError("lm_head tie does not follow tie_word_embeddings")
    unused = sorted(k for k in ref if k not in seen and not k.startswith("mtp.") and not (tied and k == "lm_head.weight"))
    if unused:
        raise RuntimeError(f"checkpoint tensors HF did not take: {unused[:5]}")
    model.to(device)
    mtp = {k[len("mtp."):]: v for k, v in ref.items() if k.startswith("mtp.")}
    return model, ref, mtp, stats


# ----------------------------------------------------------------------------
# the runs

@torch.no_grad()
def fwd(model, ids, cache=None):
    t = torch.tensor([ids], dtype=torch.long, device=model.device)
    out = model(input_ids=t, past_key_values=cache, use_cache=True)
    return out.logits[0].float(), out.past_key_values


@torch.no_grad()
def main_hidden(model, ids):
    # the text model's final hidden after model.norm (what feeds lm_head and the MTP)
    t = torch.tensor([ids], dtype=torch.long, device=model.device)
    return model.model.language_model(input_ids=t, use_cache=False).last_hidden_state[0].float()


@torch.no_grad()
def check_mtp_layer(model, mtpref, tc, n, device):
    # our decoder layer vs HF's Qwen3_5DecoderLayer carrying the same mtp.layers.0 weights
    li = tc.layer_types.index("full_attention")
    hl = hf_qwen.Qwen3_5DecoderLayer(tc, li).to(device=device, dtype=torch.float32).eval()
    lw = {k[len("layers.0."):]: v for k, v in mtpref.W.items() if k.startswith("layers.0.")}
    hl.load_state_dict({k: v for k, v in lw.items()}, strict=True)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, tc.hidden_size, generator=g).to(device)
    pos = torch.arange(n, device=device)
    # (3, batch, T) text positions: transformers 5.17 wants all three m-rope axes spelled out
    cos, sin = model.model.language_model.rotary_emb(x[None], pos[None, None].expand(3, 1, -1))
    mask = torch.full((n, n), float("-inf"), device=device).triu(1)[None, None]
    y_hf = hl(x[None], position_embeddings=(cos, sin), attention_mask=mask, position_ids=pos[None],
              past_key_values=None)
    y_hf = (y_hf[0] if isinstance(y_hf, tuple) else y_hf)[0]
    y_ours = mtpref.layer(x, pos, lw, use_cache=False)
    return rel_err(y_ours, y_hf)


@torch.no_grad()
def run_one(model, mtpw, name, profile, seed, subset, domain, ppl_ids, out_dir):
    dev = model.device
    tc = model.config.text_config
    G = Golden(subset, domain)
    checks, info = {}, {}  # checks must hold (main() fails otherwise); info is the float noise floor
    doc = {}

    # prompts: one chunked prefill each
    prompts, logits_by_len, full_row = [], {}, None
    for L in PROMPT_LENS:
        ids = prompt_ids(seed, L, domain)
        lg, _ = fwd(model, ids)
        logits_by_len[L] = lg
        poss = sorted({p for p in PROMPT_POSITIONS + [L - 1] if 0 <= p < L})
        prompts.append({"len": L, "ids": ids, "records": [G.rec(lg[p], p, p in FULL_PROMPT_POSITIONS or p == L - 1)
                                                          for p in poss]})
        if L == 7:
            full_row = lg[L - 1].cpu().numpy().astype("<f4")
    doc["prompts"] = prompts

    # the one full row
    fname = f"hf_{name}_{profile}.f32"
    fpath = os.path.join(out_dir, fname)
    full_row.tofile(fpath)
    doc["full_row"] = {"file": fname, "prompt_len": 7, "pos": 6, "count": int(full_row.size),
                       "dtype": "float32 little-endian", "sha256": sha256_file(fpath),
                       "maxabs": f32_json(np.abs(full_row).max())}

    # greedy decode: 7-token prompt, 32 tokens; step i holds the logits that chose token i
    # (step 0 = the prefill's last row, steps 1.. = single-token calls: the recurrent GDN path).
    # a near tie would make the "32 identical ids" test flaky, so when one step's margin is below
    # MIN_MARGIN_REL of max|logit| we start over from the next 7-token stream (recorded in attempt)
    for attempt in range(MAX_ATTEMPTS):
        p7 = decode_prompt_ids(seed, attempt, domain)
        lg, cache = fwd(model, p7)
        row = lg[-1]
        gen, steps, step_rows = [], [], []
        for i in range(N_DECODE):
            r = G.rec(row, 6 + i, i in FULL_DECODE_STEPS, step=i)
            gen.append(r["argmax"])
            steps.append(r)
            step_rows.append(row)
            if i + 1 < N_DECODE:
                lg, cache = fwd(model, [gen[-1]], cache)
                row = lg[-1]
        tight = min(r["margin"] / r["maxabs"] for r in steps)
        if tight >= MIN_MARGIN_REL:
            break
        print(f"note: {name} {profile}: decode attempt {attempt} has a near tie ({tight:.2g}), next prompt",
              file=sys.stderr)
    else:
        raise RuntimeError(f"{name} {profile}: no decode prompt without a near tie in {MAX_ATTEMPTS} attempts")
    doc["decode"] = {"prompt_len": 7, "attempt": attempt, "prompt_ids": p7, "n": N_DECODE, "ids": gen,
                     "steps": steps}
    seq = p7 + gen  # 39 tokens
    # the same 39 tokens as one chunked prefill must give the stepwise rows and the same greedy ids
    lg_all, _ = fwd(model, seq)
    dec_rows = lg_all[6:6 + N_DECODE]
    checks["decode_prefill_vs_stepwise_ids_equal"] = dec_rows[:, :domain].argmax(-1).tolist() == gen
    checks["decode_prefill_vs_stepwise_rel_err"] = rel_err(torch.stack(step_rows), dec_rows)

    # the 65-token prompt token by token through the cache vs its chunked prefill (crosses the
    # 64-token chunk boundary)
    p65 = prompt_ids(seed, 65, domain)
    ref65 = logits_by_len[65]
    lg, cache = fwd(model, p65[:1])
    rows = [lg[-1]]
    for t in p65[1:]:
        lg, cache = fwd(model, [t], cache)
        rows.append(lg[-1])
    checks["prompt65_stepwise_vs_prefill_rel_err"] = rel_err(torch.stack(rows), ref65)

    # split prefill: 40 tokens, then the other 25 in one multi-token call on the cache. the right
    # answer is the one-shot prefill's; a transformers that drops the cached GDN state (initial_state
    # None, release-era behaviour) disagrees, and then we store the one-shot rows and say so.
    lg40, cache = fwd(model, p65[:SPLIT_AT])
    lg25, cache = fwd(model, p65[SPLIT_AT:], cache)
    split_err = rel_err(torch.cat([lg40, lg25]), ref65)
    info["split_prefill_vs_oneshot_rel_err"] = split_err
    src = "hf split prefill (40 + 25 through the cache)"
    if split_err > TOL_CONSISTENT:
        print(f"WARNING: {name} {profile}: HF's split prefill disagrees with the one-shot prefill (rel err "
              f"{split_err:.3g}); transformers {transformers.__version__} does not continue the GDN state. "
              "storing the one-shot rows.", file=sys.stderr)
        lg25 = ref65[SPLIT_AT:]
        src = f"one-shot prefill (HF split disagreed, rel err {split_err:.3g})"
    doc["split_prefill"] = {
        "prompt_len": 65, "split": SPLIT_AT, "prompt_ids": p65, "source": src,
        "records": [G.rec(lg25[0], SPLIT_AT, False), G.rec(lg25[-1], 64, True)],
    }

    # MTP: first pass over the aligned rows of the 39-token sequence, then the draft steps
    H = main_hidden(model, seq)  # h_0..h_38 after model.norm
    checks["main_hidden_times_head_vs_logits_rel_err"] = rel_err(H @ model.lm_head.weight.T, lg_all)
    embed = model.model.language_model.embed_tokens.weight
    m = MTPRef(mtpw, tc, embed, model.lm_head.weight, dev)
    checks["mtp_layer_ours_vs_hf_decoderlayer_rel_err"] = check_mtp_layer(model, m, tc, 70, dev)
    n_rows = len(seq) - 1  # row p: token t_{p+1}, hidden h_p, position p, p = 0..37
    tok = torch.tensor(seq[1:], device=dev)
    pos = torch.arange(n_rows, device=dev)
    m.reset()
    lgm, outm, _ = m.forward(tok, H[:n_rows], pos)
    first = [G.rec(lgm[p], p, p in (0, 6, n_rows - 1), token=seq[p + 1]) for p in range(n_rows)]
    # row by row through the MTP KV cache must match the one-call first pass
    m2 = MTPRef(mtpw, tc, embed, model.lm_head.weight, dev)
    inc = torch.cat([m2.forward(tok[p:p + 1], H[p:p + 1], pos[p:p + 1])[0] for p in range(n_rows)])
    checks["mtp_first_pass_rowwise_vs_oneshot_rel_err"] = rel_err(inc, lgm)
    # draft steps: input = previous draft (greedy), hidden = the MTP's own post-norm output, position + 1
    draft = [first[-1]["argmax"]]
    hid = outm[-1:]
    mtp_steps = []
    for s in range(MTP_STEPS):
        p = n_rows + s
        lgs, hid, _ = m.forward(torch.tensor([draft[-1]], device=dev), hid, torch.tensor([p], device=dev))
        r = G.rec(lgs[0], p, True, step=s + 1, input_token=draft[-1])
        mtp_steps.append(r)
        draft.append(r["argmax"])
    # the same MTP in float64 over the same inputs: the float32 noise of the MTP goldens
    m64 = MTPRef({k: v.double() for k, v in mtpw.items()}, tc, embed.double(), model.lm_head.weight.double(), dev)
    m64.inv_freq = m.inv_freq.double()
    lg64, _, _ = m64.forward(tok, H[:n_rows].double(), pos)
    info["mtp_first_pass_vs_float64_rel_err"] = rel_err(lgm, lg64)
    doc["mtp"] = {"tokens": seq, "n_rows": n_rows, "first_pass": first, "drafts": draft, "steps": mtp_steps}

    # perplexity (tiny only): one window, all 300 tokens in one forward
    if ppl_ids is not None:
        lg, _ = fwd(model, ppl_ids)
        tgt = torch.tensor(ppl_ids[1:], device=dev)[:, None]
        nll = -torch.log_softmax(lg.double(), -1)[:-1].gather(1, tgt)[:, 0]
        nlld = -torch.log_softmax(lg[:, :domain].double(), -1)[:-1].gather(1, tgt)[:, 0]
        doc["ppl"] = {"file": "ppl_tokens.txt", "n_tokens": len(ppl_ids), "n_scored": len(ppl_ids) - 1,
                      "window": len(ppl_ids), "mean_nll": float(nll.mean()), "ppl": float(nll.mean().exp()),
                      "mean_nll_token_domain": float(nlld.mean()), "ppl_token_domain": float(nlld.mean().exp())}

    # the float32 noise floor: the stored prompt rows against the same model in float64
    m64 = copy.deepcopy(model).double()
    worst = 0.0
    for L in PROMPT_LENS:
        lg64, _ = fwd(m64, prompt_ids(seed, L, domain))
        poss = [r["pos"] for r in prompts[PROMPT_LENS.index(L)]["records"]]
        worst = max(worst, rel_err(logits_by_len[L][poss], lg64[poss]))
    info["prompt_records_vs_float64_rel_err"] = worst
    del m64
    # how close the greedy choices are: C++ and HF must agree on every one of these
    info["decode_min_margin_rel"] = min(r["margin"] / r["maxabs"] for r in steps)
    info["mtp_drafts_min_margin_rel"] = min(r["margin"] / r["maxabs"] for r in [first[-1]] + mtp_steps)
    for k in ("decode_min_margin_rel", "mtp_drafts_min_margin_rel"):
        if info[k] < MIN_MARGIN_REL:
            print(f"WARNING: {name} {profile}: {k} = {info[k]:.2g}, a near tie; greedy ids may flip", file=sys.stderr)
    return doc, checks, info


# ----------------------------------------------------------------------------
# output

def dump_golden(obj, path):
    # compact JSON, one top-level key per line and one record per line (readable diffs, small files)
    def c(v):
        return json.dumps(v, separators=(",", ":"), ensure_ascii=True, allow_nan=False)

    def block(v, ind):
        if isinstance(v, dict) and ind < 2 and any(isinstance(x, (dict, list)) for x in v.values()):
            items = [f'{" " * (ind + 1)}{c(k)}:{block(x, ind + 1)}' for k, x in v.items()]
            return "{\n" + ",\n".join(items) + "\n" + " " * ind + "}"
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            return "[\n" + ",\n".join(" " * (ind + 1) + block(x, ind + 1) for x in v) + "\n" + " " * ind + "]"
        return c(v)

    with open(path, "w", encoding="ascii") as f:
        f.write(block(obj, 0) + "\n")


SCHEMA = """hf_<model>_<profile>.json, written by test/reference/make_goldens.py (see its README).
logits of HF transformers Qwen3_5ForConditionalGeneration in float32 (eager attention, torch GDN paths)
carrying exactly the weight values of the .ninfer artifact convert.py makes from this checkpoint and profile
(bf16: the checkpoint words, gdn norm rounded to bf16, a_log/dt_bias fp32; groupwise-int: the dequantized
MAXABS_F16_RECIP_RNE_V1 codes). MTP logits come from the script's own float32 module (model.md section 5).
floats: the shortest decimal that round-trips to the float32 (parse as double, cast to float: exact).
record = {pos, maybe step/token/input_token, maxabs: max |logit| over the whole row (every vocab row),
argmax: greedy id over [0, token_domain) (first index on ties), margin: best minus second best in that
range, top_ids/top_vals: the 64 largest logits of the whole row (value desc, id asc; compare the value at
each id, not the id set), sub_vals (only some records): the logits at subset_ids, same order}.
prompts[i] = {len, ids, records}: one prefill of ids; records at positions {0,1,31,62,63,64,len-1} < len,
with sub_vals at 63, 64 and len-1. full_row: the whole row of the len-7 prompt at position 6, raw
little-endian float32 in <file>. decode: greedy from prompt_ids (the len-7 prompt when attempt is 0; a
fresh 7-token stream when that one had a greedy margin under 2.5e-4 of max|logit|); steps[i] holds the
logits at position 6+i that chose ids[i] (step 0 = the prefill row, then one single-token call per step);
sub_vals at steps 0, 1, 31. split_prefill: prompt_ids as a prefill of <split> tokens, then the rest in one
call through the cache; records at positions 40 and 64 (source says whether HF's own split run or the
one-shot prefill supplied them). mtp: tokens = decode prompt + ids; first_pass[p] (p < n_rows) = MTP(token
tokens[p+1], main hidden h_p after model.norm, position p), all rows in one call through a fresh MTP KV cache;
drafts[0] = argmax of the last row; steps[s] = MTP(input_token drafts[s], hidden = the previous call's
output after mtp.norm, position n_rows+s) and drafts[s+1] is its argmax; sub_vals at rows 0, 6, n_rows-1
and every step. ppl (tiny only): one window over ppl_tokens.txt, mean NLL of tokens 1..n-1 in float64
(softmax over every vocab row; *_token_domain: over [0, token_domain)). checks: consistency the script
insists on; noise_floor: float32-vs-float64 and path-vs-path differences (max over rows of
max|diff| / max|logit|) and the smallest greedy margins."""


def main():
    ap = argparse.ArgumentParser(description=__doc__ or "make ninfer's HF golden files")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--seed", type=int, default=1234, help="golden seed: prompts, subset, ppl tokens")
    ap.add_argument("--ckpt-seed", type=int, default=0, help="convert.py --synthetic --seed (default 0)")
    ap.add_argument("--convert", default=os.path.join(REPO, "convert.py"))
    ap.add_argument("--ckpt-root", default=None,
                    help="use existing checkpoints <root>/<model> instead of running convert.py --synthetic")
    ap.add_argument("--work", default=None, help="scratch dir for checkpoints and artifacts (default: a temp dir)")
    ap.add_argument("--out", default=os.path.join(REPO, "test", "golden"))
    ap.add_argument("--no-artifact-check", action="store_true",
                    help="skip converting to .ninfer and comparing its decoded weights with ours")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False  # real float32 on the GPU
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = torch.device(args.device)
    paths = force_torch_paths()
    if paths["fla_installed"]:
        print("note: flash-linear-attention is installed; its functions are bypassed", file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    work = args.work or tempfile.mkdtemp(prefix="ninfer_goldens_")  # removed at the end when ours
    os.makedirs(work, exist_ok=True)
    have_convert = os.path.exists(args.convert)
    enc = ConvertEncoder(args.convert if have_convert else None)
    selftest_encoder(enc)
    conv_sha = sha256_file(args.convert) if have_convert else None

    t_all = time.time()
    ppl_written = False
    for name in args.models.split(","):
        t0 = time.time()
        if args.ckpt_root:
            ckpt = os.path.join(args.ckpt_root, name)
        else:
            if not have_convert:
                sys.exit(f"{args.convert} not found; pass --ckpt-root or --convert")
            ckpt = os.path.join(work, name)
            subprocess.run([sys.executable, args.convert, "--synthetic", name, "--seed", str(args.ckpt_seed),
                            "-o", ckpt], check=True, cwd=REPO)
        domain = token_domain(ckpt) or 151669
        with open(os.path.join(ckpt, "config.json")) as f:
            cfg_json = json.load(f)
        for profile in args.profiles.split(","):
            t1 = time.time()
            model, ref, mtpw, qstats = build_model(ckpt, profile, dev, enc)
            tc = model.config.text_config
            V = model.lm_head.weight.shape[0]
            subset = subset_ids(args.seed, V, N_SUBSET)
            ppl_ids = None
            if name == "tiny":
                ppl_ids = ppl_token_ids(args.seed, domain)
                if not ppl_written:
                    with open(os.path.join(args.out, "ppl_tokens.txt"), "w") as f:
                        for i in range(0, PPL_LEN, 20):
                            f.write(" ".join(str(x) for x in ppl_ids[i:i + 20]) + "\n")
                    ppl_written = True
            art = None
            if have_convert and not args.no_artifact_check:
                art = check_artifact(args.convert, ckpt, profile, work, name, ref, tc,
                                     None if args.ckpt_root else args.ckpt_seed)
            doc, checks, info = run_one(model, mtpw, name, profile, args.seed, subset, domain, ppl_ids, args.out)
            if art:
                checks["artifact_weights_bit_exact"] = art["bit_exact"]
            gold = {
                "schema": SCHEMA,
                "format_version": FORMAT_VERSION,
                "model": name,
                "profile": profile,
                "generator": {
                    "script": "test/reference/make_goldens.py",
                    "python": platform.python_version(),
                    "torch": torch.__version__,
                    "transformers": transformers.__version__,
                    "numpy": np.__version__,
                    "safetensors": safetensors.__version__,
                    "device": str(dev),
                    "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine(),
                    "dtype": "float32",
                    "tf32": bool(torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32),
                    "model_class": "Qwen3_5ForConditionalGeneration",
                    "attn_implementation": "eager",
                    "gdn_paths": paths,
                    "mtp": "ours (make_goldens.py MTPRef, float32), model.md section 5",
                },
                "seed": args.seed,
                "checkpoint": {
                    "convert": None if args.ckpt_root else f"convert.py --synthetic {name} --seed {args.ckpt_seed} -o DIR",
                    "seed": None if args.ckpt_root else args.ckpt_seed,
                    "convert_py_sha256": conv_sha,
                    "config_sha256": sha256_file(os.path.join(ckpt, "config.json")),
                    "safetensors_sha256": {fn: sha256_file(os.path.join(ckpt, fn)) for fn in sorted(os.listdir(ckpt)) if fn.endswith(".safetensors")},
                },
                "artifact": art and {k: v for k, v in art.items() if k != "bit_exact"},
                "weights": {"profile": profile, "quantized_tensors": qstats},
                "geometry": {
                    "hidden": tc.hidden_size, "layers": tc.num_hidden_layers, "intermediate": tc.intermediate_size,
                    "q_heads": tc.num_attention_heads, "kv_heads": tc.num_key_value_heads, "head_dim": tc.head_dim,
                    "gdn_k_heads": tc.linear_num_key_heads, "gdn_v_heads": tc.linear_num_value_heads,
                    "vocab_rows": V, "tied": bool(tc.tie_word_embeddings), "layer_types": list(tc.layer_types),
                },
                "token_domain": domain,
                "top_k": TOP_K,
                "subset_ids": subset,
            }
            gold.update(doc)
            gold["checks"] = checks
            gold["noise_floor"] = info
            path = os.path.join(args.out, f"hf_{name}_{profile}.json")
            dump_golden(gold, path)
            bad = [k for k, v in checks.items() if v is False or (not isinstance(v, bool) and v > TOL_CONSISTENT)]
            fmt = lambda d: ", ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items())
            print(f"{name} {profile}: {os.path.getsize(path)} B json, {time.time() - t1:.1f}s\n  checks: {fmt(checks)}"
                  f"\n  noise: {fmt(info)}")
            if bad:
                raise RuntimeError(f"{name} {profile}: failed checks {bad}")
            del model
        print(f"{name}: {time.time() - t0:.1f}s")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    print(f"all done in {time.time() - t_all:.1f}s, goldens in {args.out}")


def check_artifact(convert, ckpt, profile, work, name, ref, tc, ckpt_seed):
    # convert the checkpoint with convert.py and compare every decoded tensor with our reference values.
    # the C++ tests may instead build the artifact straight from the seed (convert.py --synthetic NAME
    # -o X.ninfer); both must give the same bytes.
    out = os.path.join(work, f"{name}_{profile}.ninfer")
    subprocess.run([sys.executable, convert, ckpt, "-o", out, "--weights", profile], check=True, cwd=REPO)
    direct = None
    if ckpt_seed is not None:
        out2 = os.path.join(work, f"{name}_{profile}_direct.ninfer")
        subprocess.run([sys.executable, convert, "--synthetic", name, "--seed", str(ckpt_seed), "-o", out2,
                        "--weights", profile], check=True, cwd=REPO)
        direct = sha256_file(out2) == sha256_file(out)
        if not direct:
            raise RuntimeError(f"{out2} (from the seed) differs from {out} (from the checkpoint dir)")
    d, objs = read_ninfer(out)
    hf = artifact_to_hf(objs, tc, tc.tie_word_embeddings)
    bad = []
    for k, v in hf.items():
        r = ref[k].numpy().reshape(v.shape)
        if not np.array_equal(v.astype(np.float32), r):
            bad.append((k, float(np.abs(v - r).max())))
    missing = sorted(k for k in ref if k not in hf and not (tc.tie_word_embeddings and k == "lm_head.weight"))
    if bad or missing:
        raise RuntimeError(f"artifact {out} differs from the reference weights: {bad[:6]} missing {missing[:6]}")
    ident = d.get("identity", {"model_id": d.get("model_id")})
    sha, size = sha256_file(out), os.path.getsize(out)
    for p in (out, os.path.join(work, f"{name}_{profile}_direct.ninfer")):
        if os.path.exists(p):
            os.remove(p)  # only the hash is kept
    return {"file": f"{name}_{profile}.ninfer", "sha256": sha, "bytes": size,
            "identity": ident, "objects": len(d["objects"]), "compared_tensors": len(hf), "bit_exact": True,
            "same_bytes_from_seed": direct}


if __name__ == "__main__":
    main()
