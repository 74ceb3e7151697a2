#!/usr/bin/env python3
# make_vision_goldens.py: the HF oracle for ninfer's vision tower and multimodal prompt (model.md 6.3-6.7)
# on the CPU reference path.
#
# for the synthetic `tiny` checkpoint (convert.py --synthetic tiny, seed 0; it carries a 2-block vision
# tower, Dv 128, 2 heads) and each weight profile (bf16, groupwise-int) this
#   1. builds the checkpoint and the .ninfer artifact with convert.py, decodes every tensor of the artifact
#      (make_goldens.read_ninfer) and loads those exact values into HF transformers'
#      Qwen3_5ForConditionalGeneration in float32 (eager attention, torch gdn paths): text, and vision
#      (whose matrices are Q6/Q4/Q5/W8 in the groupwise-int profile);
#   2. runs the tower alone (model.visual) on deterministic pixel rows for a few grids (one image, two
#      images in one call, a 3-temporal-patch video, a wide image past the 48x48 position grid) and keeps
#      the patch embedding + position embedding, the last block's hidden and the merged output;
#   3. runs whole multimodal prompts (two images; a video with timestamp text between its frames; an image
#      and a video) through Qwen3_5ForConditionalGeneration with mm_token_type_ids, keeps logits records,
#      HF's own m-rope positions (get_rope_index) and rope_delta, and a 4-step greedy decode through the cache
#      (which positions decode tokens by rope_delta);
#   4. reruns everything in float64 for the noise floor.
#
#   test/golden/hf_vision_tiny_<profile>.json   cases, records, positions, checks, noise floor
#   test/golden/hf_vision_tiny_<profile>.f32    the tower tensors, raw little-endian float32 (offsets in the json)
#
# pixel rows are not stored: row r, value c of a case is the splitmix64 stream seeded as in pixel_rows()
# below, mapped to [-1, 1) exactly in float32; test/test_tower.cu regenerates them and checks the stored sum.
# needs torch, transformers, numpy, safetensors (no network). run from the repo root:
#   python3 test/reference/make_vision_goldens.py [--device cuda] [--out DIR]

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import shutil
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_goldens as mg  # noqa: E402  (sets USE_HUB_KERNELS before transformers is imported)
from make_goldens import torch, np, transformers, Qwen3_5ForConditionalGeneration, bf16_round  # noqa: E402

REPO = mg.REPO
MODEL = "tiny"
PROFILES = ["bf16", "groupwise-int"]
FORMAT_VERSION = 1

# tower cases: name -> list of grid_thw (t, gh, gw) in patches; all in one call of the tower
TOWER_CASES = {
    "image": [[1, 6, 8]],
    "two_images": [[1, 4, 6], [1, 10, 4]],
    "video": [[3, 4, 6]],
    "wide": [[1, 2, 52]],  # wider than the 48-entry learned grid: interpolation spacing < 1
}
# multimodal prompts: a list of parts; ("text", n) = n random text ids, ("image", case) / ("video", case)
# = that tower case's media (images: <vs> pads <ve>; video: per temporal patch, 3 text ids standing in for
# the "<t seconds>" timestamp, then <vs> pads <ve>)
PROMPTS = {
    "two_images": [("text", 5), ("image", ("two_images", 0)), ("text", 4), ("image", ("two_images", 1)), ("text", 6)],
    "video": [("text", 3), ("video", ("video", 0)), ("text", 5)],
    "image_video": [("text", 2), ("image", ("image", 0)), ("text", 3), ("video", ("video", 0)), ("text", 4)],
}
N_DECODE = 4
TEXT_ID_MAX = 151643  # random text ids stay below the tokenizer fixture's special tokens


def pixel_rows(case_index, media_index, n_rows, row_len):
    # value j of row r: splitmix64 stream seeded (case_index * 1000 + media_index) * 1000003 + 17, taken
    # in row-major order; u = top 24 bits of the 64-bit output, value = u * 2^-23 - 1 (exact in float32)
    r = mg.SplitMix64((case_index * 1000 + media_index) * 1000003 + 17)
    n = n_rows * row_len
    out = np.empty(n, dtype=np.float32)
    for i in range(n):
        out[i] = np.float32((r.next() >> 40) * (2.0 ** -23) - 1.0)
    return out.reshape(n_rows, row_len)


def vision_to_hf(objs, depth):
    # decoded artifact vision objects -> HF parameter names (inverse of convert.py's vision mapping)
    g = lambda n: objs[n][0]
    V = "model.visual."
    hf = {
        V + "patch_embed.proj.weight": g("vision/patch_embedding"),  # [Dv, 1536] -> [Dv, 3, 2, 16, 16]
        V + "patch_embed.proj.bias": g("vision/patch_embedding_bias"),
        V + "pos_embed.weight": g("vision/position_embedding"),
        V + "merger.linear_fc1.weight": g("vision/merger/fc1"),
        V + "merger.linear_fc1.bias": g("vision/merger/fc1_bias"),
        V + "merger.linear_fc2.weight": g("vision/merger/fc2"),
        V + "merger.linear_fc2.bias": g("vision/merger/fc2_bias"),
        V + "merger.norm.weight": g("vision/merger/norm/weight"),
        V + "merger.norm.bias": g("vision/merger/norm/bias"),
    }
    roles = {"attention/qkv": "attn.qkv.weight", "attention/qkv_bias": "attn.qkv.bias",
             "attention/output": "attn.proj.weight", "attention/output_bias": "attn.proj.bias",
             "mlp/fc1": "mlp.linear_fc1.weight", "mlp/fc1_bias": "mlp.linear_fc1.bias",
             "mlp/fc2": "mlp.linear_fc2.weight", "mlp/fc2_bias": "mlp.linear_fc2.bias",
             "norm1/weight": "norm1.weight", "norm1/bias": "norm1.bias",
             "norm2/weight": "norm2.weight", "norm2/bias": "norm2.bias"}
    for b in range(depth):
        for src, dst in roles.items():
            hf[f"{V}blocks.{b}.{dst}"] = g(f"vision/layers/{b}/{src}")
    return hf


def build(ckpt, artifact, device):
    model, info = Qwen3_5ForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    if info.get("missing_keys") or info.get("mismatched_keys") or info.get("error_msgs"):
        raise RuntimeError(f"{ckpt}: loading info {info}")
    model.eval()
    tc, vc = model.config.text_config, model.config.vision_config
    d, objs = mg.read_ninfer(artifact)
    hf = mg.artifact_to_hf(objs, tc, tc.tie_word_embeddings)
    hf.update(vision_to_hf(objs, vc.depth))
    seen = set()
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if name not in hf:
                raise RuntimeError(f"{name}: no artifact object maps to it")
            prm.data.copy_(torch.from_numpy(np.ascontiguousarray(hf[name])).reshape(prm.shape))
            seen.add(name)
    left = sorted(k for k in hf if k not in seen and not k.startswith("mtp.") and
                  not (tc.tie_word_embeddings and k == "lm_head.weight"))
    if left:
        raise RuntimeError(f"artifact objects HF did not take: {left[:5]}")
    return model.to(device), d


def tower_inputs(case_index, grids, vc):
    row_len = vc.in_channels * vc.temporal_patch_size * vc.patch_size * vc.patch_size
    rows = [pixel_rows(case_index, i, t * h * w, row_len) for i, (t, h, w) in enumerate(grids)]
    return rows


@torch.no_grad()
def run_tower(model, pixels, grids):
    vis = model.model.visual
    dt = next(vis.parameters()).dtype
    x = torch.from_numpy(np.concatenate(pixels)).to(model.device, dt)
    thw = torch.tensor(grids, dtype=torch.long, device=model.device)
    captured = {}
    h = vis.blocks[0].register_forward_pre_hook(lambda m, a, kw: captured.__setitem__("embed", a[0].clone()),
                                                with_kwargs=True)
    try:
        out = vis(x, grid_thw=thw, return_dict=True)
    finally:
        h.remove()
    return captured["embed"], out.last_hidden_state, out.pooler_output


def build_prompt(spec, seed, cfg, grids_of, merge):
    # returns ids, mm_token_type_ids, the media in prompt order [(kind, case, index)]
    r = mg.SplitMix64(seed)
    text = lambda n: [r.below(TEXT_ID_MAX) for _ in range(n)]
    ids, types, media = [], [], []
    vs, ve = cfg.vision_start_token_id, cfg.vision_end_token_id
    for kind, arg in spec:
        if kind == "text":
            t = text(arg)
            ids += t; types += [0] * len(t)
            continue
        case, i = arg
        t_, h, w = grids_of[case][i]
        per = h * w // (merge * merge)
        media.append((kind, case, i))
        if kind == "image":
            ids += [vs] + [cfg.image_token_id] * (t_ * per) + [ve]
            types += [0] + [1] * (t_ * per) + [0]
        else:
            for f in range(t_):
                ts = text(3)
                ids += ts + [vs] + [cfg.video_token_id] * per + [ve]
                types += [0] * 3 + [0] + [2] * per + [0]
    return ids, types, media


@torch.no_grad()
def run_prompt(model, ids, types, media, pixels_of, grids_of):
    dev = model.device
    dt = next(model.parameters()).dtype
    imgs = [(c, i) for k, c, i in media if k == "image"]
    vids = [(c, i) for k, c, i in media if k == "video"]
    kw = {}
    if imgs:
        kw["pixel_values"] = torch.from_numpy(np.concatenate([pixels_of[c][i] for c, i in imgs])).to(dev, dt)
        kw["image_grid_thw"] = torch.tensor([grids_of[c][i] for c, i in imgs], dtype=torch.long, device=dev)
    if vids:
        kw["pixel_values_videos"] = torch.from_numpy(np.concatenate([pixels_of[c][i] for c, i in vids])).to(dev, dt)
        kw["video_grid_thw"] = torch.tensor([grids_of[c][i] for c, i in vids], dtype=torch.long, device=dev)
    t_ids = torch.tensor([ids], dtype=torch.long, device=dev)
    t_types = torch.tensor([types], dtype=torch.int32, device=dev)
    pos, delta = model.model.get_rope_index(t_ids, t_types, kw.get("image_grid_thw"),
                                            None if not vids else kw["video_grid_thw"].clone())
    model.model.rope_deltas = None
    out = model(input_ids=t_ids, mm_token_type_ids=t_types, use_cache=True, **kw)
    logits = out.logits[0].to(torch.float64 if dt == torch.float64 else torch.float32)
    cache = out.past_key_values
    return logits, cache, pos[:, 0].cpu().numpy(), int(delta.reshape(-1)[0])


@torch.no_grad()
def greedy_steps(model, first_row, cache, n, domain):
    dev = model.device
    rows, toks = [first_row], []
    for s in range(n):
        tok = int(torch.argmax(rows[-1][:domain]))
        toks.append(tok)
        if s == n - 1:
            break
        out = model(input_ids=torch.tensor([[tok]], device=dev), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        rows.append(out.logits[0, -1].to(first_row.dtype))
    return rows, toks


def rel_rows(a, b):
    # max over rows of max|a - b| / max|b|
    return mg.rel_err(a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]))


SCHEMA = """hf_vision_tiny_<profile>.json, written by test/reference/make_vision_goldens.py.
HF transformers Qwen3_5ForConditionalGeneration in float32 (eager attention, torch gdn paths) carrying exactly
the decoded values of the .ninfer artifact (artifact.sha256), text and vision. tower[name] = {grids: [[t,gh,gw]..]
in one call of model.visual, pixel_sum: float64 sum of the regenerated pixel rows (make_vision_goldens.pixel_rows),
tensors: {embed: patch embedding + position embedding [patches, Dv], hidden: after the last block [patches, Dv],
merged: the merger output [tokens, out]} each {offset, count} in float32 units into <file>}. prompts[name] =
{ids, mm_token_type_ids, media: [{kind, tower_case, index}] in prompt order, positions: HF get_rope_index [3][len],
rope_delta, records (logits, make_goldens.Golden: maxabs, argmax over [0, token_domain), margin, top_ids/top_vals,
sub_vals at subset_ids on the listed rows), decode: greedy steps through the HF cache (steps[0] = the prefill's last
row; token ids chose by each step's row)}. checks must hold; noise_floor: float32 vs float64 runs of the same HF
model (max over rows of max|diff| / max|ref|)."""


# ----------------------------------------------------------------------------
# the 9b's tower geometry (Dv 1152, 16 heads of 72, mlp 4304, out 4096; one block): HF's vision
# model alone, with weights both sides generate (no artifact; too big to commit): tensor k of
# V9B_TENSORS, element i (row-major) = bf16(scale_k * (u * 2^-23 - 1)), u the top 24 bits of
# splitmix64's output for state (k + 1) * 0x9E3779B97F4A7C15 + 0x5EED + (i + 1) * 0x9E3779B97F4A7C15
# (the C++ twin: test_tower.cu, V9b). shapes in HF's layout; the patch embedding is [Dv, 1536].

V9B = {"depth": 1, "hidden": 1152, "heads": 16, "intermediate": 4304, "out": 4096}
V9B_GRIDS = {"image": [[1, 4, 6]], "video": [[2, 4, 4]]}  # pixels: pixel_rows(20 + case, item)


def v9b_tensors():
    D, I, O = V9B["hidden"], V9B["intermediate"], V9B["out"]
    t = [("patch_embed.proj.weight", (D, 1536), 2 / 1536 ** 0.5), ("patch_embed.proj.bias", (D,), 0.02),
         ("pos_embed.weight", (2304, D), 0.1)]
    for b in range(V9B["depth"]):
        p = f"blocks.{b}."
        t += [(p + "norm1.weight", (D,), -1.0), (p + "norm1.bias", (D,), 0.05), (p + "norm2.weight", (D,), -1.0),
              (p + "norm2.bias", (D,), 0.05), (p + "attn.qkv.weight", (3 * D, D), 2 / D ** 0.5), (p + "attn.qkv.bias", (3 * D,), 0.02),
              (p + "attn.proj.weight", (D, D), 2 / D ** 0.5), (p + "attn.proj.bias", (D,), 0.02),
              (p + "mlp.linear_fc1.weight", (I, D), 2 / D ** 0.5), (p + "mlp.linear_fc1.bias", (I,), 0.02),
              (p + "mlp.linear_fc2.weight", (D, I), 2 / I ** 0.5), (p + "mlp.linear_fc2.bias", (D,), 0.02)]
    t += [("merger.norm.weight", (D,), -1.0), ("merger.norm.bias", (D,), 0.05),
          ("merger.linear_fc1.weight", (4 * D, 4 * D), 2 / (4 * D) ** 0.5), ("merger.linear_fc1.bias", (4 * D,), 0.02),
          ("merger.linear_fc2.weight", (O, 4 * D), 2 / (4 * D) ** 0.5), ("merger.linear_fc2.bias", (O,), 0.02)]
    return t  # scale -1: a layernorm weight, 1 + 0.1 (u 2^-23 - 1)


def v9b_values(k, shape, scale):
    n = int(np.prod(shape))
    G = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        st = (np.uint64(k + 1) * G + np.uint64(0x5EED)) + (np.arange(1, n + 1, dtype=np.uint64) * G)
        z = st
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float64) * 2.0 ** -23 - 1.0
    v = (1.0 + 0.1 * u) if scale < 0 else scale * u
    return bf16_round(torch.from_numpy(v.astype(np.float32))).reshape(shape)


@torch.no_grad()
def v9b_goldens(out_dir, device):
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel
    cfg = Qwen3_5VisionConfig(depth=V9B["depth"], hidden_size=V9B["hidden"], num_heads=V9B["heads"],
                              intermediate_size=V9B["intermediate"], out_hidden_size=V9B["out"])
    cfg._attn_implementation = "eager"
    res = {}
    for dt in (torch.float32, torch.float64):
        vis = Qwen3_5VisionModel(cfg).eval()
        sd = {}
        for k, (name, shape, scale) in enumerate(v9b_tensors()):
            v = v9b_values(k, shape, scale)
            sd[name] = v.reshape(1152, 3, 2, 16, 16) if name == "patch_embed.proj.weight" else v
        missing, unexpected = vis.load_state_dict(sd, strict=False)
        if unexpected or [m for m in missing if not m.startswith("rotary")]:
            raise RuntimeError(f"9b tower state dict: missing {missing} unexpected {unexpected}")
        vis = vis.to(device=device, dtype=dt)
        for ci, (case, grids) in enumerate(V9B_GRIDS.items()):
            pix = [pixel_rows(20 + ci, i, t * h * w, 1536) for i, (t, h, w) in enumerate(grids)]
            x = torch.from_numpy(np.concatenate(pix)).to(device, dt)
            thw = torch.tensor(grids, dtype=torch.long, device=device)
            emb = {}
            hk = vis.blocks[0].register_forward_pre_hook(lambda m, a, kw: emb.__setitem__("e", a[0].clone()), with_kwargs=True)
            o = vis(x, grid_thw=thw, return_dict=True)
            hk.remove()
            res[(case, dt)] = (emb["e"], o.pooler_output, float(sum(float(p.astype(np.float64).sum()) for p in pix)))
    blob, doc, off = [], {}, 0
    for ci, case in enumerate(V9B_GRIDS):
        e32, m32, psum = res[(case, torch.float32)]
        e64, m64, _ = res[(case, torch.float64)]
        rec = {"grids": V9B_GRIDS[case], "case_index": 20 + ci, "pixel_sum": psum,
               "noise_merged_f32_vs_f64": rel_rows(m32, m64), "noise_embed_f32_vs_f64": rel_rows(e32, e64)}
        for nm, t in (("embed", e32), ("merged", m32)):
            a = t.detach().cpu().numpy().astype("<f4").ravel()
            blob.append(a)
            rec[nm] = {"offset": off, "count": int(a.size), "shape": list(t.shape)}
            off += a.size
        doc[case] = rec
    fname = "hf_vision_9b_tower.f32"
    np.concatenate(blob).astype("<f4").tofile(os.path.join(out_dir, fname))
    gold = {"schema": "the 9b tower geometry, one block, generated weights (make_vision_goldens.py: v9b_tensors / "
                      "v9b_values); HF Qwen3_5VisionModel in float32, eager; embed = input of block 0, merged = the "
                      "merger's rows; {offset, count} in float32 units into <file>",
            "generator": {"script": "test/reference/make_vision_goldens.py", "torch": torch.__version__,
                          "transformers": transformers.__version__, "device": str(device)},
            "vision": V9B, "file": fname, "cases": doc}
    mg.dump_golden(gold, os.path.join(out_dir, "hf_vision_9b_tower.json"))
    print(f"9b tower: {doc}")


def main():
    ap = argparse.ArgumentParser(description="make ninfer's HF vision goldens")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--seed", type=int, default=4321, help="golden seed: prompt text ids, subset ids")
    ap.add_argument("--ckpt-seed", type=int, default=0)
    ap.add_argument("--convert", default=os.path.join(REPO, "convert.py"))
    ap.add_argument("--out", default=os.path.join(REPO, "test", "golden"))
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = torch.device(args.device)
    paths = mg.force_torch_paths()
    work = args.work or tempfile.mkdtemp(prefix="ninfer_vgold_")
    os.makedirs(work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    t_all = time.time()
    ckpt = os.path.join(work, MODEL)
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        subprocess.run([sys.executable, args.convert, "--synthetic", MODEL, "--seed", str(args.ckpt_seed), "-o", ckpt],
                       check=True, cwd=REPO)
    domain = mg.token_domain(ckpt) or 151669
    for profile in args.profiles.split(","):
        t0 = time.time()
        art = os.path.join(work, f"{MODEL}_{profile}.ninfer")
        subprocess.run([sys.executable, args.convert, "--synthetic", MODEL, "--seed", str(args.ckpt_seed), "-o", art,
                        "--weights", profile], check=True, cwd=REPO)
        model, d = build(ckpt, art, dev)
        model64, _ = build(ckpt, art, dev)
        model64 = model64.double()
        cfg, vc = model.config, model.config.vision_config
        merge = vc.spatial_merge_size
        V = model.lm_head.weight.shape[0]
        subset = mg.subset_ids(args.seed, V, 512)
        G = mg.Golden(subset, domain)
        checks, noise = {}, {}
        blob, tower = [], {}
        off = 0

        def put(arr):
            nonlocal off
            a = np.ascontiguousarray(arr.detach().cpu().numpy().astype("<f4")).ravel()
            blob.append(a)
            rec = {"offset": off, "count": int(a.size)}
            off += a.size
            return rec

        pixels_of, grids_of = {}, {}
        for ci, (name, grids) in enumerate(TOWER_CASES.items()):
            pix = tower_inputs(ci, grids, vc)
            pixels_of[name], grids_of[name] = pix, grids
            emb, hid, mer = run_tower(model, pix, grids)
            emb64, hid64, mer64 = run_tower(model64, pix, grids)
            tower[name] = {
                "grids": grids,
                "case_index": ci,
                "pixel_sum": float(sum(float(p.astype(np.float64).sum()) for p in pix)),
                "tensors": {"embed": put(emb), "hidden": put(hid), "merged": put(mer)},
                "shapes": {"embed": list(emb.shape), "hidden": list(hid.shape), "merged": list(mer.shape)},
            }
            noise[f"tower_{name}_merged_f32_vs_f64"] = rel_rows(mer, mer64)
            noise[f"tower_{name}_hidden_f32_vs_f64"] = rel_rows(hid, hid64)
            # the tower on each media item alone must equal its rows of the joint call (block-diagonal attention)
            if len(grids) > 1:
                per = [run_tower(model, [p], [g])[2] for p, g in zip(pix, grids)]
                checks[f"tower_{name}_joint_vs_separate"] = rel_rows(mer, torch.cat(per))

        prompts = {}
        for pi, (name, spec) in enumerate(PROMPTS.items()):
            ids, types, media = build_prompt(spec, args.seed * 1000003 + pi, cfg, grids_of, merge)
            lg, cache, pos, delta = run_prompt(model, ids, types, media, pixels_of, grids_of)
            lg64, cache64, _, _ = run_prompt(model64, ids, types, media, pixels_of, grids_of)
            noise[f"prompt_{name}_f32_vs_f64"] = rel_rows(lg, lg64)
            L = len(ids)
            # rows: the first, around every media run, and the last
            rows = {0, L - 1}
            for i in range(1, L):
                if types[i] != types[i - 1]:
                    rows.update({i - 1, i})
            full_rows = {L - 1, min(i for i in range(L) if types[i] != 0)}
            recs = [G.rec(lg[p], p, p in full_rows) for p in sorted(rows)]
            steps, toks = greedy_steps(model, lg[L - 1], cache, N_DECODE, domain)
            steps64, toks64 = greedy_steps(model64, lg64[L - 1], cache64, N_DECODE, domain)
            checks[f"prompt_{name}_decode_ids_f32_eq_f64"] = toks == toks64
            noise[f"prompt_{name}_decode_f32_vs_f64"] = rel_rows(torch.stack(steps), torch.stack(steps64).float())
            dec = [G.rec(r, L - 1 + s, True, step=s, token=toks[s]) for s, r in enumerate(steps)]
            margins = [r["margin"] / r["maxabs"] for r in dec]
            noise[f"prompt_{name}_min_decode_margin_rel"] = float(min(margins))
            prompts[name] = {
                "ids": ids, "mm_token_type_ids": types,
                "media": [{"kind": k, "tower_case": c, "index": i} for k, c, i in media],
                "positions": pos.astype(int).tolist(), "rope_delta": delta,
                "records": recs, "decode": {"ids": toks, "steps": dec},
            }

        fname = f"hf_vision_{MODEL}_{profile}.f32"
        fpath = os.path.join(args.out, fname)
        np.concatenate(blob).astype("<f4").tofile(fpath)
        gold = {
            "schema": SCHEMA,
            "format_version": FORMAT_VERSION,
            "model": MODEL, "profile": profile,
            "generator": {
                "script": "test/reference/make_vision_goldens.py",
                "python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "numpy": np.__version__,
                "device": str(dev), "dtype": "float32", "attn_implementation": "eager", "gdn_paths": paths,
            },
            "seed": args.seed,
            "artifact": {"convert": f"convert.py --synthetic {MODEL} --seed {args.ckpt_seed} -o X.ninfer --weights {profile}",
                         "sha256": mg.sha256_file(art), "bytes": os.path.getsize(art)},
            "vision": {"depth": vc.depth, "hidden": vc.hidden_size, "heads": vc.num_heads,
                       "intermediate": vc.intermediate_size, "out": vc.out_hidden_size},
            "token_ids": {"image": cfg.image_token_id, "video": cfg.video_token_id,
                          "vision_start": cfg.vision_start_token_id, "vision_end": cfg.vision_end_token_id},
            "token_domain": domain, "top_k": mg.TOP_K, "subset_ids": subset,
            "file": fname, "file_sha256": mg.sha256_file(fpath),
            "tower": tower, "prompts": prompts,
            "checks": checks, "noise_floor": noise,
        }
        path = os.path.join(args.out, f"hf_vision_{MODEL}_{profile}.json")
        mg.dump_golden(gold, path)
        bad = [k for k, v in checks.items() if v is False or (not isinstance(v, bool) and v > mg.TOL_CONSISTENT)]
        print(f"{MODEL} {profile}: {os.path.getsize(path)} B json + {os.path.getsize(fpath)} B f32, "
              f"{time.time() - t0:.1f}s\n  checks: {checks}\n  noise: {noise}")
        if bad:
            raise RuntimeError(f"failed checks {bad}")
        os.remove(art)
        del model, model64
    v9b_goldens(args.out, dev)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    print(f"all done in {time.time() - t_all:.1f}s")


if __name__ == "__main__":
    main()
