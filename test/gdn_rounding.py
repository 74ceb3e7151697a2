#!/usr/bin/env python3
# the roundings of the gpu's chunked delta rule (ninfer.cu gdn_chunk_prep / gdn_chunk_scan:
# every mma operand rounded to tf32, fp32 sums modelled in float64) against a float64
# recurrence (model.md 3.5), for one head of dk = dv = 128 over T tokens; and the same with
# bf16 operands. prints the relative l2 error of the final state and of the outputs.
#   python3 test/gdn_rounding.py        (numpy only, ~1 min)
import numpy as np

def round_tf32(x):  # cvt.rna.tf32.f32: 10 mantissa bits, ties away from zero
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((b + 0x1000) & 0xFFFFE000).astype(np.uint32)).view(np.float32).astype(np.float64)

def round_bf16(x):  # round to nearest even, 7 mantissa bits
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)).view(np.float32).astype(np.float64)

def case(rho, beta_lo, a_log, rnd, T=512, D=128, C=64, seed=0):
    """keys with cosine ~rho to a common direction, beta in (beta_lo, 1), g = -e^a_log softplus(2 N(0,1))"""
    r = np.random.default_rng(seed)
    m = r.normal(size=D)
    k = rho * m + np.sqrt(1 - rho ** 2) * r.normal(size=(T, D)); k /= np.linalg.norm(k, axis=1, keepdims=True)
    q = r.normal(size=(T, D)); q /= np.linalg.norm(q, axis=1, keepdims=True) * np.sqrt(D)
    v = r.normal(size=(T, D)); beta = r.uniform(beta_lo, 1, T)
    g = -np.exp(a_log) * np.log1p(np.exp(2 * r.normal(size=T)))
    S0 = 0.5 * r.normal(size=(D, D))
    S, O = S0.copy(), np.zeros((T, D))  # float64 recurrence
    for t in range(T):
        S *= np.exp(g[t]); d = beta[t] * (v[t] - S.T @ k[t]); S += np.outer(k[t], d); O[t] = S.T @ q[t]
    S_ref, O_ref = S, O
    S, O = S0.copy(), np.zeros((T, D))  # the kernels' chunked form, operands rounded by rnd
    for c0 in range(0, T, C):
        K, Q, V, B = k[c0:c0 + C], q[c0:c0 + C], v[c0:c0 + C], beta[c0:c0 + C]
        G = np.cumsum(g[c0:c0 + C]); E = np.exp(G[:, None] - G[None, :])
        A = np.tril(B[:, None] * (rnd(K) @ rnd(K).T) * E, -1)          # prep: K K^T
        Tp = rnd(np.linalg.inv(np.eye(len(K)) + A) * B[None, :])       # T' = (I + A)^-1 diag(beta), fp32 solve
        P = rnd(np.tril((rnd(Q) @ rnd(K).T) * E))                      # prep: P
        X, Y = rnd(K) @ rnd(S), rnd(Q) @ rnd(S)                         # scan: [K; Q] S
        Vn = rnd(Tp @ rnd(V - np.exp(G)[:, None] * X))                  # V_new = T' R
        O[c0:c0 + C] = np.exp(G)[:, None] * Y + P @ Vn
        S = np.exp(G[-1]) * S + rnd(K).T @ rnd(np.exp(G[-1] - G)[:, None] * Vn)
    rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)
    return rel(S, S_ref), rel(O, O_ref)

if __name__ == "__main__":
    print("%-44s %21s %21s" % ("keys, beta, decay", "tf32: state   output", "bf16: state   output"))
    for rho, blo, al, what in [(0.0, 0.02, -1, "random keys, beta (0,1), g ~ -0.5"),
                               (0.9, 0.02, -1, "cosine 0.81, beta (0,1), g ~ -0.5"),
                               (0.999, 0.9, -4, "cosine ~1, beta (0.9,1), g ~ -0.01")]:
        a, b = case(rho, blo, al, round_tf32), case(rho, blo, al, round_bf16)
        print("%-44s %10.2e %10.2e %10.2e %10.2e" % (what, a[0], a[1], b[0], b[1]))
