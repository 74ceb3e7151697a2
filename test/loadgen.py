"""a load generator for ninfer-serve over http (python standard library only, so it runs on the
gpu machine as it is). measurements, not tests: timings go to test/bench-notes.md.

  chat:   a multi-turn conversation (system prompt + growing history), one streamed request per
          turn: per turn the prompt, the cached prefix (usage.prompt_tokens_details), the time to
          the first token and the output. --compare URL2 runs the same turns against a second
          server (e.g. --no-prefix-reuse) and exits 1 when a greedy output differs.
  decode: C concurrent streams of P-token prompts and N output tokens each; aggregate and
          per-stream decode tok/s, ttft p50 / p99. --concurrency 1,2,4 runs each level in turn.
  poisson: --requests streams arriving as a poisson process of --rate requests a second (a fixed
          seed): ttft p50 / p99, the aggregate and the mean per-stream decode tok/s.

  python3 test/loadgen.py chat --url http://127.0.0.1:8080 --turns 10 --user-words 600
  python3 test/loadgen.py decode --url http://127.0.0.1:8080 --concurrency 1,2,4,8 --prompt-words 400 --max-tokens 256
  python3 test/loadgen.py decode --url http://127.0.0.1:8080 --concurrency 64 --temperature 0.6   (sampled streams)
  python3 test/loadgen.py poisson --url http://127.0.0.1:8080 --rate 4 --requests 64 --prompt-words 400 --max-tokens 128
"""
import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import threading
import time
import urllib.request

WORDS = ("and the lord spake unto moses saying speak unto the children of israel that they bring me an offering "
         "of every man that giveth it willingly with his heart ye shall take my offering").split()


def text_of(n, seed):
    r = random.Random(seed)
    return " ".join(r.choice(WORDS) for _ in range(n))


def model_of(url):
    with urllib.request.urlopen(url + "/v1/models", timeout=60) as f:
        return json.load(f)["data"][0]["id"]


def stream_chat(url, model, messages, max_tokens, extra=None):
    """one streamed chat request: (reasoning, content, usage, ttft seconds, total seconds)"""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    body.update(extra or {})
    rq = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                headers={"Content-Type": "application/json"})
    t0 = time.time()
    ttft, reasoning, content, usage, tokens = None, [], [], None, []
    with urllib.request.urlopen(rq, timeout=3600) as f:
        for raw in f:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            o = json.loads(line[6:])
            if o.get("usage"):
                usage = o["usage"]
            for ch in o.get("choices", []):
                d = ch.get("delta", {})
                piece = (d.get("reasoning_content") or "") + (d.get("content") or "")
                if piece:
                    if ttft is None:
                        ttft = time.time() - t0
                    tokens.append(time.time())
                reasoning.append(d.get("reasoning_content") or "")
                content.append(d.get("content") or "")
    return "".join(reasoning), "".join(content), usage, ttft, time.time() - t0, tokens


def chat(a):
    urls = [a.url] + ([a.compare] if a.compare else [])
    models = [model_of(u) for u in urls]
    hists = [[{"role": "system", "content": text_of(a.system_words, 1)}] for _ in urls]
    same = True
    print("turn  prompt  cached  ttft_ms" + ("  ttft_ms(compare)  same" if a.compare else ""))
    for t in range(a.turns):
        res = []
        for k, u in enumerate(urls):
            hists[k].append({"role": "user", "content": text_of(a.user_words, 100 + t)})
            r, c, usage, ttft, _, _ = stream_chat(u, models[k], hists[k], a.max_tokens)
            hists[k].append({"role": "assistant", "content": c, "reasoning_content": r})
            res.append((r, c, usage, ttft))
        u = res[0][2]
        line = "%4d  %6d  %6d  %7.1f" % (t + 1, u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"], res[0][3] * 1e3)
        if a.compare:
            eq = res[0][:2] == res[1][:2] and res[0][2]["completion_tokens"] == res[1][2]["completion_tokens"]
            same = same and eq
            line += "  %16.1f  %s" % (res[1][3] * 1e3, "yes" if eq else "NO")
        print(line, flush=True)
    return 0 if same else 1


def sampling(a, i):
    """a decode / poisson stream's request fields: greedy, or --temperature T with a seed per stream
    (the server's other sampling defaults: top_k 20, top_p 0.95, presence 1.0)"""
    extra = {"chat_template_kwargs": {"enable_thinking": False}}
    if a.temperature > 0:
        extra.update({"temperature": a.temperature, "seed": 1000 + i})
    return extra


def decode_streams(a, model, ids, start):
    """the streams ids of a decode level, each on its own thread, started together once every
    process is at start (a multiprocessing barrier): a list of (id, stream_chat's result, or None
    where the request failed: the error goes to stderr)"""
    out = {}

    def one(i):
        msgs = [{"role": "user", "content": text_of(a.prompt_words, 1000 + i)}]
        try:
            out[i] = stream_chat(a.url, model, msgs, a.max_tokens, sampling(a, i))
        except Exception as e:  # the level reports it; the other streams go on
            print("stream %d: %s" % (i, e), file=sys.stderr)
    th = [threading.Thread(target=one, args=(i,)) for i in ids]
    start.wait()
    for x in th:
        x.start()
    for x in th:
        x.join()
    return [(i, out.get(i)) for i in ids]


def decode_worker(a, model, ids, start, q):
    c0 = time.process_time()
    res = decode_streams(a, model, ids, start)
    q.put((res, time.process_time() - c0))


def decode(a):
    """each level's C streams run on --procs processes (threads within each): 64 streams' threads
    behind one python interpreter lock timed the events late (5,980 events/s against 6,010 with 4
    processes, one server: test/bench-notes.md, session 13). client_cpu: the load generator's cpu
    seconds over the level's wall time (per process, the largest): near 1.0 a process was
    saturated and its figures are its own limit"""
    model = model_of(a.url)
    print("C  aggregate_tok_s  steady_tok_s  per_stream_tok_s  ttft_p50_ms  ttft_p99_ms  wall_s  procs  client_cpu  events_per_token")
    ctx = mp.get_context("fork")
    for C in [int(x) for x in a.concurrency.split(",")]:
        procs = max(1, min(C, a.procs or len(os.sched_getaffinity(0))))
        start, q = ctx.Barrier(procs + 1), ctx.Queue()
        ws = [ctx.Process(target=decode_worker, args=(a, model, list(range(k, C, procs)), start, q)) for k in range(procs)]
        for w in ws:
            w.start()
        start.wait()  # every worker's threads are made
        t0 = time.time()
        got = [q.get() for _ in ws]
        wall = time.time() - t0
        for w in ws:
            w.join()
        out = [o for res, _ in got for _, o in sorted(res)]
        cpu = max(c for _, c in got) / wall
        bad = sum(1 for o in out if o is None or not o[5] or not o[2])
        if bad:
            print("C = %d: %d of %d streams ended without tokens or usage (the server's log says why)" % (C, bad, C), file=sys.stderr)
            return 1
        ttfts = sorted(o[3] for o in out)
        # decode rate: tokens after the first over the time after the first, per stream and in all
        per = [(o[2]["completion_tokens"] - 1) / max(o[5][-1] - o[5][0], 1e-9) for o in out if len(o[5]) > 1]
        first = min(o[5][0] for o in out if o[5])
        last = max(o[5][-1] for o in out if o[5])
        agg = sum(o[2]["completion_tokens"] - 1 for o in out) / max(last - first, 1e-9)
        # steady: while every stream decodes (after the last first token, before the first last
        # one), the tokens of all streams over that window: the batched decode without the
        # prefills of streams joining and the tails of streams ending. a stream event carries one
        # token's text, or more where the server held a token's text back (an incomplete utf-8
        # character, which a random model's output is full of): a stream's events in the window
        # count its tokens a stream event (completion_tokens / events; events_per_token in all)
        w0 = max(o[5][0] for o in out if o[5])
        w1 = min(o[5][-1] for o in out if o[5])
        steady = sum(sum(1 for t in o[5] if w0 < t <= w1) * o[2]["completion_tokens"] / len(o[5]) for o in out if o[5]) / (w1 - w0) \
            if w1 > w0 else float("nan")
        ept = sum(len(o[5]) for o in out) / max(sum(o[2]["completion_tokens"] for o in out), 1)
        p = lambda q: ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))] * 1e3
        print("%d  %15.1f  %12.1f  %16.1f  %11.1f  %11.1f  %6.2f  %5d  %10.2f  %16.3f" %
              (C, agg, steady, sum(per) / max(len(per), 1), p(0.5), p(0.99), wall, procs, cpu, ept), flush=True)
    return 0


def poisson(a):
    model = model_of(a.url)
    r = random.Random(7)
    gaps = [r.expovariate(a.rate) for _ in range(a.requests)]
    out = [None] * a.requests

    def one(i):
        msgs = [{"role": "user", "content": text_of(a.prompt_words, 2000 + i)}]
        out[i] = stream_chat(a.url, model, msgs, a.max_tokens, sampling(a, i))
    th = []
    t0 = time.time()
    for i in range(a.requests):
        time.sleep(gaps[i])
        th.append(threading.Thread(target=one, args=(i,)))
        th[-1].start()
    for x in th:
        x.join()
    wall = time.time() - t0
    ttfts = sorted(o[3] for o in out)
    per = [(o[2]["completion_tokens"] - 1) / max(o[5][-1] - o[5][0], 1e-9) for o in out if len(o[5]) > 1]
    agg = sum(o[2]["completion_tokens"] for o in out) / wall
    p = lambda q: ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))] * 1e3
    print("rate %.1f/s  %d requests  ttft_p50_ms %.1f  ttft_p99_ms %.1f  tokens_per_s %.1f  per_stream_tok_s %.1f  wall_s %.2f" %
          (a.rate, a.requests, p(0.5), p(0.99), agg, sum(per) / max(len(per), 1), wall), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["chat", "decode", "poisson"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--compare")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--system-words", type=int, default=200)
    ap.add_argument("--user-words", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", default="1")
    ap.add_argument("--prompt-words", type=int, default=400)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--procs", type=int, default=0, help="decode: processes the streams run on (0: one a usable cpu, at most C)")
    ap.add_argument("--temperature", type=float, default=0.0, help="decode / poisson: sampled streams (0: greedy)")
    a = ap.parse_args()
    sys.exit({"chat": chat, "decode": decode, "poisson": poisson}[a.mode](a))


if __name__ == "__main__":
    main()
