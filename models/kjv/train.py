#!/usr/bin/env python3
# train.py: a tiny Qwen3.5 (gated deltanet + gated attention, with an mtp head) on the kjv bible.
#
#   python3 models/kjv/train.py --out models/kjv/hf [--time 300] [--device cuda]
#
# needs torch, transformers (Qwen3_5ForCausalLM; the torch fallback for the gdn layers is fine),
# safetensors, numpy. reads models/kjv/data/{train,val}.ids (make_data.py) and the tokenizer
# files in models/kjv/tokenizer/ (make_tokenizer.py). writes to --out:
#   config.json, model.safetensors     a Qwen3_5ForConditionalGeneration-shaped checkpoint
#                                      (model.language_model.*, tied head, mtp.*; no vision
#                                      weights) that convert.py turns into a .ninfer
#   tokenizer.json, tokenizer_config.json, generation_config.json, chat_template.jinja
#   train_log.txt, metrics.json        the loss curve, the command, the final numbers
#
# the main model is HF's Qwen3_5ForCausalLM. the mtp head (model.md 5.1) is ours: for the pair
# (h_p, x_{p+1}) it computes c = fc([norm_e(embed(x_{p+1})), norm_h(h_p)]), runs one gated
# full-attention decoder layer over c at position p, then mtp.norm and the shared (tied) head,
# and is trained jointly to predict x_{p+2}. h_p is the main model's final hidden state after
# model.norm, the vector that feeds lm_head.
#
# perplexity, the definition of ninfer's --perplexity: the held-out ids (tokenized whole, no bos)
# are cut into non-overlapping windows ids[k*ctx : (k+1)*ctx] (the last one shorter), each run
# from an empty state; in each window every token after the first is scored given the window's
# prefix, over all embedding rows; ppl = exp(mean nll). 72,103 held-out ids at ctx 256 score
# 71,821 tokens.
import argparse, copy, json, math, os, shutil, sys, time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))

# ----------------------------------------------------------------------------
# config: family constants (head_dim 256, gdn heads 128, conv 4, partial rope 0.25, mrope
# [11,11,10], theta 1e7) kept; everything else shrunk.

def text_config(args, vocab_rows):
    L = args.layers
    return {
        "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True,
        "bos_token_id": None, "dtype": "bfloat16", "eos_token_id": args.eos_id,
        "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu",
        "hidden_size": args.hidden, "initializer_range": 0.02, "intermediate_size": args.intermediate,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)],
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": args.gdn_k_heads,
        "linear_num_value_heads": args.gdn_v_heads, "linear_value_head_dim": 128,
        "mamba_ssm_dtype": "float32", "max_position_embeddings": 262144, "model_type": "qwen3_5_text",
        "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": args.heads, "num_hidden_layers": L, "num_key_value_heads": args.kv_heads,
        "pad_token_id": None, "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
                            "rope_theta": 10000000, "rope_type": "default"},
        "tie_word_embeddings": True, "use_cache": True, "vocab_size": vocab_rows,
    }


def full_config(tc, ids):
    # the official Qwen3_5ForConditionalGeneration layout (model.md 1.1). the vision tower is
    # described (a small one) but has no weights: convert.py then writes no vision objects.
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
        "text_config": tc, "tie_word_embeddings": True, "transformers_version": "5.13.0",
        "vision_config": {
            "deepstack_visual_indexes": [], "depth": 2, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 128,
            "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 256, "model_type": "qwen3_5",
            "num_heads": 2, "num_position_embeddings": 2304, "out_hidden_size": tc["hidden_size"],
            "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
        },
    }

# ----------------------------------------------------------------------------
# the mtp head, written from model.md 2 and 5.1 (HF drops mtp.*, so there is no HF class for it).
# parameter names are the checkpoint's (model.md 1.3) below the "mtp." prefix.

class RMSNorm(nn.Module):
    """zero-centred: x * rsqrt(mean(x^2) + eps) * (1 + w), in fp32, cast back (model.md 4.1)"""
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.zeros(n)), eps

    def forward(self, x):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


def rope(x, pos, theta=1e7, rot=64):
    """partial rotate-half rope on the first `rot` dims of each head; text-only, so all three
    m-rope axes carry the same position and the interleave is the identity (model.md 2.3).
    x [B, heads, T, 256], pos [T]."""
    inv = 1.0 / (theta ** (torch.arange(0, rot, 2, device=x.device, dtype=torch.float32) / rot))
    ang = pos.float()[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    xr, xp = x[..., :rot], x[..., rot:]
    half = torch.cat([-xr[..., rot // 2:], xr[..., :rot // 2]], -1)
    return torch.cat([xr * cos + half * sin, xp], -1)


class GatedAttention(nn.Module):
    """model.md 2: q_proj gives per head [query 256 | gate 256]; q/k rmsnorm before rope; gqa;
    the output is gated by sigmoid(gate) before o_proj."""
    def __init__(self, H, Hq, Hkv, hd=256):
        super().__init__()
        self.Hq, self.Hkv, self.hd = Hq, Hkv, hd
        self.q_proj = nn.Linear(H, 2 * Hq * hd, bias=False)
        self.k_proj = nn.Linear(H, Hkv * hd, bias=False)
        self.v_proj = nn.Linear(H, Hkv * hd, bias=False)
        self.o_proj = nn.Linear(Hq * hd, H, bias=False)
        self.q_norm, self.k_norm = RMSNorm(hd), RMSNorm(hd)

    def forward(self, x, pos):
        B, T, _ = x.shape
        qg = self.q_proj(x).view(B, T, self.Hq, 2 * self.hd)
        q, gate = qg[..., :self.hd], qg[..., self.hd:].reshape(B, T, -1)
        q = rope(self.q_norm(q).transpose(1, 2), pos)
        k = rope(self.k_norm(self.k_proj(x).view(B, T, self.Hkv, self.hd)).transpose(1, 2), pos)
        v = self.v_proj(x).view(B, T, self.Hkv, self.hd).transpose(1, 2)
        rep = self.Hq // self.Hkv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.hd ** -0.5)
        o = o.transpose(1, 2).reshape(B, T, -1) * torch.sigmoid(gate)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(H, I, bias=False), nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MTPLayer(nn.Module):
    def __init__(self, H, I, Hq, Hkv):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(H), RMSNorm(H)
        self.self_attn, self.mlp = GatedAttention(H, Hq, Hkv), MLP(H, I)

    def forward(self, x, pos):
        x = x + self.self_attn(self.input_layernorm(x), pos)
        return x + self.mlp(self.post_attention_layernorm(x))


class MTP(nn.Module):
    def __init__(self, H, I, Hq, Hkv):
        super().__init__()
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding, self.pre_fc_norm_hidden = RMSNorm(H), RMSNorm(H)
        self.layers = nn.ModuleList([MTPLayer(H, I, Hq, Hkv)])
        self.norm = RMSNorm(H)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)  # HF's initializer_range

    def forward(self, h, e):
        """h [B, T, H]: main final-normed hidden at positions 0..T-1; e [B, T, H]: embeddings of
        the tokens at positions 1..T. returns the mtp's normed hidden (predicts positions 2..T+1)."""
        c = self.fc(torch.cat([self.pre_fc_norm_embedding(e), self.pre_fc_norm_hidden(h)], -1))
        return self.norm(self.layers[0](c, torch.arange(h.shape[1], device=h.device)))

# ----------------------------------------------------------------------------
# model: HF main model + our mtp head, one forward for both losses

class KJVModel(nn.Module):
    def __init__(self, tc):
        super().__init__()
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
        self.lm = Qwen3_5ForCausalLM(Qwen3_5TextConfig.from_dict(tc))
        assert self.lm.lm_head.weight is self.lm.model.embed_tokens.weight, "head not tied"
        self.mtp = MTP(tc["hidden_size"], tc["intermediate_size"], tc["num_attention_heads"], tc["num_key_value_heads"])

    def forward(self, x):
        """x [B, T]. returns main logits [B, T, V] (predicting x[:, 1:] and one more) and mtp
        logits [B, T-1, V] (position p predicts x[:, p+2], from h_p and x[:, p+1])."""
        h = self.lm.model(input_ids=x, use_cache=False).last_hidden_state
        g = self.mtp(h[:, :-1], self.lm.model.embed_tokens(x[:, 1:]))
        return self.lm.lm_head(h), self.lm.lm_head(g)


def add_dropout(lm, p):
    """residual dropout on every mixer and mlp output (HF's Qwen3.5 has none); training only."""
    def hook(mod, inp, out):
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, mod.training),) + tuple(out[1:])
        return F.dropout(out, p, mod.training)
    for layer in lm.model.layers:
        for m in (getattr(layer, "linear_attn", None), getattr(layer, "self_attn", None), layer.mlp):
            if m is not None:
                m.register_forward_hook(hook)


def check_mtp_layer(model, log):
    """our mtp decoder layer == HF's full-attention Qwen3_5DecoderLayer with the same weights
    (fp32, cpu). a layer-api mismatch across transformers versions only skips the check."""
    try:
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer
        cfg = model.lm.config
        idx = cfg.layer_types.index("full_attention")
        ours = copy.deepcopy(model.mtp.layers[0]).float().cpu()
        for p in ours.parameters():
            nn.init.normal_(p, std=0.05)
        hf = Qwen3_5DecoderLayer(cfg, idx).float().cpu()
        hf.load_state_dict(ours.state_dict())
        T, H = 7, cfg.hidden_size
        x = torch.randn(2, T, H)
        rot = copy.deepcopy(model.lm.model.rotary_emb).float().cpu()
        pe = rot(x, torch.arange(T)[None, None, :].expand(3, 2, T))
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None].expand(2, 1, T, T)
        with torch.no_grad():
            d = (hf(x, position_embeddings=pe, attention_mask=mask) - ours(x, torch.arange(T))).abs().max().item()
        log("mtp layer vs HF Qwen3_5DecoderLayer (full attention): max |diff| %.2e %s" % (d, "ok" if d < 1e-4 else "MISMATCH"))
        if d >= 1e-4:
            sys.exit("train.py: our mtp layer does not match HF's decoder layer")
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 (an api drift must not stop a training run)
        log("mtp layer check skipped (%s: %s)" % (type(e).__name__, e))

# ----------------------------------------------------------------------------
# evaluation: perplexity on non-overlapping windows, mtp agreement

@torch.no_grad()
def evaluate(model, ids, ctx, device, autocast, max_windows=None):
    """perplexity as ninfer's --perplexity defines it: windows ids[k*ctx : (k+1)*ctx], each from an
    empty state, every token after a window's first scored. returns dict: loss, ppl, tokens
    (scored), acc (main top-1); mtp_loss / mtp_acc on token p+2 and mtp_agree, the mtp's top-1
    agreement with the main model's greedy next-next token (the main argmax at p+1, which has
    seen x_{p+1}): the first draft's acceptance rate under greedy speculative decoding."""
    model.eval()
    starts = list(range(0, len(ids) - 1, ctx))[:max_windows]
    full = [st for st in starts if st + ctx <= len(ids)]
    groups = [full[i:i + 64] for i in range(0, len(full), 64)] + [[st] for st in starts if st + ctx > len(ids)]
    s = dict(nll=0.0, tok=0, acc=0, mnll=0.0, mtok=0, macc=0, agree=0)
    for g in groups:
        w = min(ctx, len(ids) - g[0])
        x = torch.tensor(np.stack([ids[st:st + w] for st in g]).astype(np.int64), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits, mlog = model(x[:, :-1])
        logits, mlog, tgt = logits.float(), mlog.float(), x[:, 1:]
        top = logits.argmax(-1)
        s["nll"] += F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), reduction="sum").item()
        s["tok"] += tgt.numel()
        s["acc"] += (top == tgt).sum().item()
        if w >= 3:
            mtop = mlog.argmax(-1)  # row p drafts x[p+2] = tgt[p+1]
            s["mnll"] += F.cross_entropy(mlog.flatten(0, 1), tgt[:, 1:].flatten(), reduction="sum").item()
            s["mtok"] += tgt[:, 1:].numel()
            s["macc"] += (mtop == tgt[:, 1:]).sum().item()
            s["agree"] += (mtop == top[:, 1:]).sum().item()
    model.train()
    loss = s["nll"] / s["tok"]
    return {"loss": loss, "ppl": math.exp(loss), "tokens": s["tok"], "acc": s["acc"] / s["tok"],
            "mtp_loss": s["mnll"] / max(1, s["mtok"]), "mtp_acc": s["macc"] / max(1, s["mtok"]),
            "mtp_agree": s["agree"] / max(1, s["mtok"])}


@torch.no_grad()
def greedy(model, prompt, n, device):
    """greedy continuation by re-running the whole sequence (no cache: slow, simple, exact)."""
    model.eval()
    x = list(prompt)
    for _ in range(n):
        logits = model.lm(input_ids=torch.tensor([x], device=device), use_cache=False).logits
        x.append(int(logits[0, -1].float().argmax()))
    model.train()
    return x[len(prompt):]

# ----------------------------------------------------------------------------
# export: bf16 tensors except the two the real checkpoint keeps in f32 (model.md 1.3)

def export_state(model):
    out = {}
    for k, v in model.lm.state_dict().items():
        if k == "lm_head.weight":
            continue  # tied
        assert k.startswith("model."), k
        out["model.language_model." + k[len("model."):]] = v
    for k, v in model.mtp.state_dict().items():
        out["mtp." + k] = v
    f32 = lambda k: k.endswith("linear_attn.A_log") or k.endswith("linear_attn.norm.weight")
    return {k: v.detach().to(torch.float32 if f32(k) else torch.bfloat16).cpu().contiguous() for k, v in out.items()}


def load_exported(model, state):
    """the model as the checkpoint stores it: bf16 weights, A_log and the gated norm in f32."""
    m = copy.deepcopy(model).to(torch.bfloat16)
    lm = {("model." + k[len("model.language_model."):]): v for k, v in state.items() if k.startswith("model.language_model.")}
    mtp = {k[len("mtp."):]: v for k, v in state.items() if k.startswith("mtp.")}
    for mod, sd in ((m.lm, lm), (m.mtp, mtp)):
        for name, p in mod.named_parameters():
            if name in sd:
                p.data = sd[name].to(p.device)
    return m

# ----------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description="train the tiny kjv Qwen3.5 model")
    ap.add_argument("--out", required=True, help="checkpoint directory to write")
    ap.add_argument("--data", default=os.path.join(HERE, "data"), help="directory with train.ids / val.ids")
    ap.add_argument("--tokenizer", default=os.path.join(HERE, "tokenizer"), help="tokenizer files to ship")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--time", type=float, default=300, help="training time budget in seconds (evals included)")
    ap.add_argument("--steps", type=int, default=20000, help="max optimizer steps")
    ap.add_argument("--ctx", type=int, default=256, help="context length (training and perplexity)")
    ap.add_argument("--batch", type=int, default=64, help="sequences per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.1, help="residual dropout (training only)")
    ap.add_argument("--mtp-weight", type=float, default=0.3, help="weight of the mtp loss")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-windows", type=int, default=None, help="cap on held-out windows per eval (smoke tests)")
    ap.add_argument("--patience", type=int, default=5, help="evals without a new best that start the decay (or stop it)")
    ap.add_argument("--decay-frac", type=float, default=0.2, help="the decay's share of the run")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--gdn-k-heads", type=int, default=2)
    ap.add_argument("--gdn-v-heads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--prompt", default="And God said")
    ap.add_argument("--sample-tokens", type=int, default=64, help="greedy tokens logged at the end")
    ap.add_argument("--autocast", choices=["auto", "on", "off"], default="auto",
                    help="bf16 autocast for training and evals (auto: on for cuda, off for cpu)")
    args = ap.parse_args()

    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "train_log.txt"), "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    t_start = time.time()
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    device = torch.device(args.device)
    autocast = device.type == "cuda" if args.autocast == "auto" else args.autocast == "on"
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    import transformers
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    ids_of = tok.get_vocab(with_added_tokens=True)
    n_ids = tok.get_vocab_size(with_added_tokens=True)
    vocab_rows = (n_ids + 63) // 64 * 64
    args.eos_id = ids_of["<|endoftext|>"]
    train = np.fromfile(os.path.join(args.data, "train.ids"), dtype="<u2").astype(np.int64)
    val = np.fromfile(os.path.join(args.data, "val.ids"), dtype="<u2").astype(np.int64)
    assert train.max() < n_ids and val.max() < n_ids

    tc = text_config(args, vocab_rows)
    model = KJVModel(tc).to(device)
    add_dropout(model.lm, args.dropout)
    n_main = sum(p.numel() for p in model.lm.parameters())
    n_mtp = sum(p.numel() for p in model.mtp.parameters())
    log("command: python3 " + " ".join(sys.argv))
    log("torch %s, transformers %s, device %s%s" % (torch.__version__, transformers.__version__, device,
        " (%s)" % torch.cuda.get_device_name(device) if device.type == "cuda" else ""))
    log("data: train %d tokens, held-out %d tokens; tokenizer %d ids, embedding rows %d" % (len(train), len(val), n_ids, vocab_rows))
    log("model: H %d, L %d (full attention at %s), I %d, attn %d/%d heads, gdn %d/%d heads; %.2fM params + mtp %.2fM"
        % (args.hidden, args.layers, [i for i, t in enumerate(tc["layer_types"]) if t == "full_attention"], args.intermediate,
           args.heads, args.kv_heads, args.gdn_k_heads, args.gdn_v_heads, n_main / 1e6, n_mtp / 1e6))
    check_mtp_layer(model, log)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda")

    # schedule, warmup-stable-decay: linear warmup, then the peak lr until the held-out loss has
    # not improved for `patience` evals (or 1-decay_frac of the budget is gone), then a linear
    # decay to min-lr over decay_frac/(1-decay_frac) of the steps so far (cut short by the end of
    # the time budget), then stop. the best held-out checkpoint is kept throughout.
    T, B = args.ctx, args.batch
    tokens_per_epoch = len(train)
    best, best_state, best_step, bad_evals = float("inf"), None, 0, 0
    curve, decay, stop = [], None, ""
    log("training: batch %d x %d tokens, lr %g (warmup %d, then stable, then linear decay to %g), wd %g, dropout %g, "
        "mtp weight %g, budget %d steps / %.0f s" % (B, T, args.lr, args.warmup, args.min_lr, args.wd, args.dropout,
                                                    args.mtp_weight, args.steps, args.time))
    log("%6s %7s %9s %8s %8s %8s | %8s %8s %7s %7s %7s" % ("step", "epoch", "lr", "loss", "mtp", "tok/s", "val", "val_ppl", "acc", "mtp_acc", "agree"))
    t0 = time.time()
    t_end = t0 + args.time
    step, seen, tl, tm, tn, t_last = 0, 0, 0.0, 0.0, 0, t0
    while True:
        now = time.time()
        progress = 0.0 if decay is None else max((step - decay[0]) / decay[2], (now - decay[1]) / max(1e-9, t_end - decay[1]))
        if decay is not None and progress >= 1.0:
            stop = "end of the decay"
        elif now >= t_end or step >= args.steps:
            stop = "budget (%d steps / %.0f s)" % (args.steps, args.time)
        if step % args.eval_every == 0 or stop:
            ev = evaluate(model, val, T, device, autocast, args.eval_windows)
            curve.append({"step": step, "epoch": seen / tokens_per_epoch, "lr": opt.param_groups[0]["lr"],
                          "train": tl / max(1, tn), "train_mtp": tm / max(1, tn), **ev})
            if ev["loss"] < best:
                best, best_step, bad_evals = ev["loss"], step, 0
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            else:
                bad_evals += 1
            log("%6d %7.2f %9.2e %8.4f %8.4f %8.0f | %8.4f %8.2f %7.3f %7.3f %7.3f%s"
                % (step, seen / tokens_per_epoch, opt.param_groups[0]["lr"], tl / max(1, tn), tm / max(1, tn),
                   tn * B * T / max(1e-9, time.time() - t_last), ev["loss"], ev["ppl"], ev["acc"], ev["mtp_acc"],
                   ev["mtp_agree"], " *" if best_step == step else ""))
            tl, tm, tn, t_last = 0.0, 0.0, 0, time.time()
            late = now - t0 >= (1 - args.decay_frac) * args.time or step >= (1 - args.decay_frac) * args.steps
            if not stop and decay is None and step >= args.warmup and (bad_evals >= args.patience or late):
                n = max(2 * args.eval_every, round(step * args.decay_frac / (1 - args.decay_frac)))
                decay, bad_evals = (step, now, n), 0
                log("decay: from step %d over %d steps (%s)" % (step, n, "late in the budget" if late else
                    "no new best for %d evals" % args.patience))
            elif not stop and decay is not None and bad_evals >= args.patience:
                stop = "early stopping in the decay (%d evals without a new best)" % args.patience
            if stop:
                break
        if decay is None:
            lr = args.lr * min(1.0, (step + 1) / args.warmup)
        else:
            lr = args.min_lr + (args.lr - args.min_lr) * max(0.0, 1.0 - progress)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = rng.integers(0, len(train) - T - 1, size=B)
        x = torch.from_numpy(np.stack([train[s:s + T + 1] for s in starts])).to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits, mlog = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        mloss = F.cross_entropy(mlog.float().flatten(0, 1), x[:, 2:].flatten())
        opt.zero_grad(set_to_none=True)
        (loss + args.mtp_weight * mloss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tl, tm, tn = tl + loss.item(), tm + mloss.item(), tn + 1
        step, seen = step + 1, seen + B * T
    train_s = time.time() - t0
    log("stopped: %s; best held-out loss %.4f at step %d; %d steps, %.2f epochs in %.0f s"
        % (stop, best, best_step, step, seen / tokens_per_epoch, train_s))

    # final numbers on the best weights: fp32 master (no tf32) and the exported bf16 checkpoint
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model.load_state_dict(best_state)
    state = export_state(model)
    fin32 = evaluate(model, val, T, device, False, args.eval_windows)
    exported = load_exported(model, state)
    fin16 = evaluate(exported, val, T, device, False, args.eval_windows)
    prompt = tok.encode(args.prompt, add_special_tokens=False).ids
    cont = greedy(exported, prompt, args.sample_tokens, device)
    for name, ev in (("fp32 weights, fp32 compute", fin32), ("exported bf16 checkpoint, bf16 compute", fin16)):
        log("held-out (%s), ctx %d, %d tokens scored: loss %.4f, perplexity %.3f, top-1 %.3f; mtp: loss(t+2) %.4f, top-1 %.3f, "
            "top-1 agreement with the main model's next-next greedy token %.3f"
            % (name, T, ev["tokens"], ev["loss"], ev["ppl"], ev["acc"], ev["mtp_loss"], ev["mtp_acc"], ev["mtp_agree"]))
    log("greedy from %r (bf16 checkpoint): %r" % (args.prompt, tok.decode(cont)))

    # the checkpoint directory
    from safetensors.torch import save_file
    save_file(state, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(args.out, "config.json"), "w") as f:
        f.write(json.dumps(full_config(tc, ids_of), indent=2, sort_keys=True) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        shutil.copyfile(os.path.join(args.tokenizer, name), os.path.join(args.out, name))
    metrics = {"command": "python3 " + " ".join(sys.argv), "torch": torch.__version__, "transformers": transformers.__version__,
               "device": str(device), "params_main": n_main, "params_mtp": n_mtp, "config": tc, "args": vars(args),
               "stop": stop, "steps": step, "epochs": seen / tokens_per_epoch, "train_seconds": train_s,
               "best_step": best_step, "final_fp32": fin32, "final_bf16": fin16,
               "greedy": {"prompt": args.prompt, "prompt_ids": prompt, "ids": cont, "text": tok.decode(cont)},
               "curve": curve}
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        f.write(json.dumps(metrics, indent=1) + "\n")
    log("wrote %s (%.0f s in all)" % (args.out, time.time() - t_start))


if __name__ == "__main__":
    main()
