"""--max-concurrency C through the real server (issue 14): models/kjv on the cpu reference path,
the real template, the openai sdk. the lanes' steps go through the scheduler (LaneSched: prefill
pieces alone, decode tokens batched; on the cpu the batch's tokens run one after another); every
request keeps its own sampler, limits and stop strings, so N requests
running at once give what the same requests give one at a time (greedy, and seeded sampling),
with mixed prompt lengths, some ending on stop strings and some cancelled mid-stream (their lane
frees for the next). the reference is a --max-concurrency 1 server fed the same requests in turn."""
import os
import re
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_serve_reuse import KJV, MODEL, SERVE, SYSTEM, oai, same_output, chat, start as reuse_start  # noqa: E402

NOTHINK = {"chat_template_kwargs": {"enable_thinking": False}}


# on a gpu a prefix whose rows came from decode steps equals a fresh prefill of them only within
# the prefill kernels' tolerance (GpuModel.PrefillKernelsMatchDecodeKernels; the tap's prompt
# logprobs differ from the cpu's by up to 7e-2), so greedy text continued from such a prefix may
# part from a fresh prefill's where the fresh top two are closer than this (a device run: 0.008
# at token 5 of "... Thou shalt not and"). the cpu path's prefill and decode are one arithmetic:
# there the text is equal
NEAR_TIE = 0.1


def same_or_near_tie(got, ref, gpu):
    """a completion's text equals the reference completion's (requested with logprobs=2), or on
    a gpu parts from it only at a token where the reference's top two are within NEAR_TIE, the
    reference's runner-up taken there"""
    text = ref.choices[0].text
    if got == text or not gpu:
        assert got == text
        return
    lp = ref.choices[0].logprobs
    head = ""
    for tok, top in zip(lp.tokens, lp.top_logprobs):
        if not got.startswith(head + tok):
            (a, va), (b, vb) = sorted(top.items(), key=lambda kv: -kv[1])[:2]
            assert a == tok and va - vb < NEAR_TIE and got[len(head):].startswith(b), (got, text, head, top)
            return
        head += tok
    assert False, (got, text)


def on_gpu(s):
    """the server runs on a gpu (its memory plan's line says so)"""
    return " on gpu " in s.text()


def kv_pool(one, rows):
    """--kv-capacity rows on a gpu server (its lanes share one pool of kv pages; the cpu path
    keeps --max-context rows a lane and takes no --kv-capacity)"""
    return ["--kv-capacity", str(rows)] if on_gpu(one) else []


def words(n, seed):
    import random
    r = random.Random(seed)
    w = "and the lord spake unto moses saying speak unto the children of israel that they bring".split()
    return " ".join(r.choice(w) for _ in range(n))


def start(*args):
    return reuse_start("--prefill-chunk", "128", *args)  # small pieces: prefills interleave with decode steps


@pytest.fixture(scope="module")
def one():
    s = start("--no-prefix-reuse")
    yield s
    assert s.stop() == 0, s.text()[-3000:]


@pytest.fixture(scope="module")
def four():
    s = start("--max-concurrency", "4", "--no-prefix-reuse")
    yield s
    assert s.stop() == 0, s.text()[-3000:]


def requests_mix():
    """mixed prompt lengths and limits; thinking off so the output is content (stop strings apply)"""
    out = []
    for i, (n, mt) in enumerate([(5, 24), (400, 12), (40, 30), (150, 8), (3, 40), (260, 20)]):
        out.append(dict(messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": words(n, i)}],
                        max_tokens=mt, extra_body=NOTHINK))
    return out


def run_all(s, reqs, at_once):
    res = [None] * len(reqs)

    def go(i):
        res[i] = chat(s, **reqs[i])
    if not at_once:
        for i in range(len(reqs)):
            go(i)
        return res
    th = [threading.Thread(target=go, args=(i,)) for i in range(len(reqs))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return res


def test_concurrent_greedy_equals_one_at_a_time(one, four):
    reqs = requests_mix()
    ref = run_all(one, reqs, False)
    # stop strings: a word from the middle of two of the reference outputs
    for i in (0, 2):
        w = ref[i]["content"].split()
        assert len(w) > 4, ref[i]
        reqs[i]["stop"] = [w[len(w) // 2]]
    ref = run_all(one, reqs, False)
    since = len(four.log)
    got = run_all(four, reqs, True)
    for a, b in zip(got, ref):
        same_output(a, b)
    assert ref[0]["completion"] < 24 and ref[2]["completion"] < 30  # they did end on the stop strings
    lines = four.request_lines(since, n=len(reqs), pattern=" POST /v1/chat")
    assert len(lines) == len(reqs) and all(" 200 " in l for l in lines)


def test_seeded_sampling_per_request(one, four):
    reqs = []
    for i in range(5):
        r = requests_mix()[i]
        r.update(temperature=0.9, top_p=0.9, seed=11 + i, presence_penalty=0.5 * (i % 2))
        reqs.append(r)
    ref = run_all(one, reqs, False)
    got = run_all(four, reqs, True)
    for a, b in zip(got, ref):
        same_output(a, b)


def stream_until(s, body, n_chunks, results, key, cancel, until=None):
    """a streamed request; with cancel, the client leaves after n_chunks content chunks; with
    until (an event), when it is set"""
    c = oai(s)
    text, k = [], 0
    st = c.chat.completions.create(model=MODEL, stream=True, **body)
    for ch in st:
        if ch.choices and ch.choices[0].delta.content:
            text.append(ch.choices[0].delta.content)
            k += 1
            if k == 1:
                results[key + "_first"] = time.time()
            if (cancel and k >= n_chunks) or (until is not None and until.is_set()):
                st.close()
                break
    results[key] = ("".join(text), time.time())


def stream_in_background(s, body, results, key, until=None):
    """a streamed request on a thread, once its first content chunk is in: the thread"""
    t = threading.Thread(target=stream_until, args=(s, body, 0, results, key, False, until))
    t.start()
    while key + "_first" not in results:
        time.sleep(0.01)
    return t


def test_streams_interleave_and_cancelled_lanes_free(one):
    s = start("--max-concurrency", "2", "--no-prefix-reuse")
    try:
        # the long stream has room for 1500 tokens and its client leaves once the short one is
        # done: on a gpu the kjv decodes 300 tokens before a second client's request is in
        long = dict(messages=[{"role": "user", "content": words(20, 1)}], max_tokens=1500, temperature=0, extra_body=NOTHINK)
        short = dict(messages=[{"role": "user", "content": words(200, 2)}], max_tokens=6, temperature=0, extra_body=NOTHINK)
        res, done = {}, threading.Event()
        t1 = stream_in_background(s, long, res, "long", until=done)
        stream_until(s, short, 0, res, "short", False)  # joins while the long stream runs
        done.set()
        t1.join()
        # the short request (a 200-word prompt) entered, prefilled and finished while the long
        # one was still streaming: the lanes took turns
        ref_long = chat(one, **long)["content"]
        ref_short = chat(one, **short)["content"]
        assert res["short"][0] == ref_short
        assert ref_long.startswith(res["long"][0]) and len(res["long"][0]) < len(ref_long), (res["long"][0], ref_long)
        # cancelled mid-stream: two clients leave after a few chunks; their lanes serve the next ones
        since = len(s.log)
        ths = [threading.Thread(target=stream_until, args=(s, long, 3, res, f"c{i}", True)) for i in range(2)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        after = run_all(s, requests_mix()[:3], True)
        for a, b in zip(after, run_all(one, requests_mix()[:3], False)):
            same_output(a, b)
        s.wait_log(r" 499 POST /v1/chat/completions", since=since, timeout=20)
        lines = s.request_lines(since, n=5, pattern=" POST /v1/chat")
        assert sum(" 499 " in l for l in lines) == 2 and sum(" 200 " in l for l in lines) == 3, lines
    finally:
        assert s.stop() == 0, s.text()[-3000:]


def test_stats_line_counts_the_lanes_steps():
    """the stats line's scheduler figures (--log-stats-interval-ms): the decode steps of four
    concurrent requests on two lanes, lanes a step, the step and the gap between steps, summed
    over the lines, account for every decoded token (each request's first token comes from its
    prefill; its last one may have been fed by a step that started before the lane ended)"""
    s = start("--max-concurrency", "2", "--no-prefix-reuse", "--log-stats-interval-ms", "100")
    try:
        reqs = [dict(messages=[{"role": "user", "content": words(10, 60 + i)}], max_tokens=24 + 8 * i, temperature=0, extra_body=NOTHINK)
                for i in range(4)]
        got = {}
        th = [threading.Thread(target=lambda i=i: got.__setitem__(i, chat(s, **reqs[i]))) for i in range(4)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        time.sleep(0.5)  # the last busy interval's line
        lines = [l for l in s.text().splitlines() if "stats:" in l]
        steps = tokens = 0
        busy = False
        for l in lines:
            m = re.search(r" decode_steps=(\d+) lanes_per_step=([\d.]+) step_ms=([\d.]+) gap_ms=([\d.]+)", l)
            assert m, l
            n, lps, step, gap = int(m.group(1)), float(m.group(2)), float(m.group(3)), float(m.group(4))
            assert (n == 0) == (lps == 0) and (n == 0) == (step == 0) and gap >= 0, l
            assert n == 0 or 1.0 <= lps <= 2.0, l
            steps += n; tokens += n * lps
            busy |= lps > 1.0
        done = sum(got[i]["completion"] for i in range(4))
        assert done - 4 - 0.01 * steps <= tokens <= done + 0.01 * steps, (tokens, done, lines)
        assert busy, lines  # some steps ran both lanes
    finally:
        assert s.stop() == 0, s.text()[-3000:]


def test_stats_lines_come_while_every_lane_is_busy():
    """the stats lines come every --log-stats-interval-ms while every engine thread runs a
    request: the accept thread logs them (an engine thread logged them between requests, so a
    loaded server went quiet exactly when its figures mattered)"""
    s = start("--max-concurrency", "2", "--no-prefix-reuse", "--log-stats-interval-ms", "10")
    try:
        long = dict(messages=[{"role": "user", "content": words(20, 1)}], max_tokens=1500, temperature=0, extra_body=NOTHINK)
        res = {}
        since = len(s.log)
        th = [threading.Thread(target=stream_until, args=(s, long, 0, res, k, False)) for k in ("a", "b")]
        for t in th:
            t.start()
        for t in th:
            t.join()
        time.sleep(0.05)
        # both streams ran from the later first token to the earlier end (the kjv on a gpu
        # decodes 1500 tokens in ~0.3 s, on the cpu in seconds): a line each 10 ms, half of them
        both = min(res["a"][1], res["b"][1]) - max(res["a_first"], res["b_first"])
        busy = [l for l in list(s.log)[since:] if "stats:" in l and " running=2 " in l]
        assert both > 0.05, ("the streams hardly overlapped", both)
        assert len(busy) >= max(3, int(0.5 * both / 0.01)), (both, list(s.log)[since:])
    finally:
        assert s.stop() == 0, s.text()[-3000:]


def test_prefix_reuse_across_lanes(one):
    """two conversations running at once on two lanes, each turn continuing from its previous
    turn's boundary (wherever that state lives), greedy outputs as without reuse"""
    s = start("--max-concurrency", "2", "--device-state-slots", "2", "--host-state-slots", "2")
    try:
        hists = {c: [{"role": "system", "content": SYSTEM}] for c in "AB"}
        refs = {c: [{"role": "system", "content": SYSTEM}] for c in "AB"}
        for k in range(3):
            out = {}

            def turn(c):
                hists[c].append({"role": "user", "content": words(30 + 10 * k, ord(c) + k)})
                out[c] = chat(s, hists[c], max_tokens=12)
            th = [threading.Thread(target=turn, args=(c,)) for c in "AB"]
            for t in th:
                t.start()
            for t in th:
                t.join()
            for c in "AB":
                refs[c].append(hists[c][-1])
                same_output(out[c], chat(one, refs[c], max_tokens=12))
                if k > 0:
                    assert out[c]["cached"] > 0, (c, k, out[c])
                hists[c].append({"role": "assistant", "content": out[c]["content"], "reasoning_content": out[c]["reasoning"]})
                refs[c].append(hists[c][-1])
    finally:
        assert s.stop() == 0, s.text()[-3000:]


def test_pending_rules_count_the_lanes(one):
    """with C lanes busy and no room in the queue, the next request is 429. the two streams have
    room for 1500 tokens and their clients leave once the third request is answered: on a gpu
    the kjv decodes 400 tokens before a third client's request is in"""
    # a pool for both streams' reservations (prompt + 1500 rows each; on the gpu a request
    # waits for pages that the running ones hold)
    s = start("--max-concurrency", "2", "--max-pending-requests", "0", "--no-prefix-reuse", *kv_pool(one, 4096))
    try:
        import openai
        long = dict(messages=[{"role": "user", "content": "Who was Moses?"}], max_tokens=1500, temperature=0, extra_body=NOTHINK)
        res, done = {}, threading.Event()
        ths = [threading.Thread(target=stream_until, args=(s, long, 0, res, f"l{i}", False, done)) for i in range(2)]
        for t in ths:
            t.start()
        deadline = time.time() + 60
        while time.time() < deadline and not ("l0_first" in res and "l1_first" in res):
            time.sleep(0.01)
        try:
            assert "l0" not in res and "l1" not in res  # both still streaming: both lanes busy
            with pytest.raises(openai.RateLimitError):
                oai(s).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            assert "l0" not in res and "l1" not in res  # and the 429 came while they were
        finally:
            done.set()
            for t in ths:
                t.join()
    finally:
        assert s.stop() == 0, s.text()[-3000:]


def test_concurrency_flags():
    if not os.path.exists(SERVE):
        pytest.skip("not built")
    import subprocess
    r = subprocess.run([SERVE, KJV, "--max-concurrency", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr == "ninfer-serve: error: missing or bad value for --max-concurrency (1..64)\n", r.stderr
    s = start("--max-concurrency", "3")
    try:
        line = s.wait_log(r"memory plan")
        assert "3 lane(s)" in line and "3 device state slots" in line, line  # --device-state-slots defaults to C
    finally:
        assert s.stop() == 0, s.text()[-3000:]


def test_spec_mtp_lanes_equal_one_at_a_time(one):
    """cpu --spec mtp: each lane runs its own rounds (its own mtp rows and drafts)"""
    s = start("--max-concurrency", "3", "--spec", "mtp", "--draft-tokens", "2")
    try:
        reqs = requests_mix()[:4]
        got = run_all(s, reqs, True)
        for a, b in zip(got, run_all(one, reqs, False)):
            same_output(a, b)
    finally:
        assert s.stop() == 0, s.text()[-3000:]


def test_a_prompt_that_can_never_fit_is_400_with_the_numbers(four):
    import openai
    with pytest.raises(openai.BadRequestError) as e:
        oai(four).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": words(3000, 5)}], max_tokens=4)
    b = e.value.body
    assert b["code"] == "context_length_exceeded" and "do not fit a sequence of 2048" in b["message"], b
    assert re.search(r"the prompt's \d+ tokens", b["message"]), b


@pytest.mark.parametrize("temperature", [0, 0.8])
def test_lanes_ending_on_stop_strings_or_cancels_then_reused(one, temperature):
    """lanes take their next token while the next step runs (the scheduler queues the step's
    pick: greedy lanes' argmax, sampled lanes' draw in the step): a lane that a stop string or a
    leaving client then ends holds that token too when a step took it first. while a long stream
    keeps the steps going on the other lane, conversations whose turns end on stop strings, a
    completion continued after its stop, and a conversation continued after a cancelled stream
    give what a one-lane server without reuse gives (seeded when sampled), and continue from
    retained prefixes"""
    T = dict(temperature=temperature, seed=7) if temperature else dict(temperature=0)
    # the pool holds the long stream's reservation (prompt + 1900 rows) and the others'
    s = start("--max-concurrency", "2", "--device-state-slots", "2", "--host-state-slots", "2", *kv_pool(one, 4096))
    try:
        # the long stream: its client leaves at the end (its steps run beside everything below)
        long = dict(messages=[{"role": "user", "content": words(20, 9)}], max_tokens=1900, extra_body=NOTHINK, **T)
        res, done = {}, threading.Event()
        bg = stream_in_background(s, long, res, "bg", until=done)
        hist = [{"role": "system", "content": SYSTEM}]
        cached = []
        for k in range(3):
            hist.append({"role": "user", "content": words(12 + 5 * k, 40 + k)})
            ref = chat(one, hist, max_tokens=30, extra_body=NOTHINK, **T)
            w = ref["content"].split()
            assert len(w) > 4, ref
            stop = [w[len(w) // 2]]
            ref = chat(one, hist, max_tokens=30, stop=stop, extra_body=NOTHINK, **T)
            got = chat(s, hist, max_tokens=30, stop=stop, extra_body=NOTHINK, **T)
            same_output(got, ref)
            assert got["completion"] < 30, got  # it ended on the stop string
            cached.append(got["cached"])
            hist.append({"role": "assistant", "content": got["content"]})
        assert cached[0] == 0 and cached[1] > 0 and cached[2] > cached[1], cached
        # a completion stopped by a stop string, then continued by its client
        c = oai(s)
        ref1 = oai(one).completions.create(model=MODEL, prompt="And God said", max_tokens=40, **T)
        stop = [ref1.choices[0].text.split()[4]]
        r1 = c.completions.create(model=MODEL, prompt="And God said", max_tokens=40, stop=stop, **T)
        o1 = oai(one).completions.create(model=MODEL, prompt="And God said", max_tokens=40, stop=stop, **T)
        assert r1.choices[0].text == o1.choices[0].text and r1.choices[0].finish_reason == "stop"
        p2 = "And God said" + r1.choices[0].text + stop[0] + " and"  # the client puts the stop string back, and more
        r2 = c.completions.create(model=MODEL, prompt=p2, max_tokens=20, **T)
        o2 = oai(one).completions.create(model=MODEL, prompt=p2, max_tokens=20, logprobs=2, **T)
        same_or_near_tie(r2.choices[0].text, o2, on_gpu(s))
        assert r2.usage.prompt_tokens_details.cached_tokens > 0
        # a stream its client leaves, then the conversation goes on from the retained prefix
        hist2 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": words(30, 77)}]
        stream_until(s, dict(messages=hist2, max_tokens=200, extra_body=NOTHINK, **T), 4, res, "left", True)
        hist2.append({"role": "assistant", "content": res["left"][0]})
        hist2.append({"role": "user", "content": words(10, 78)})
        a, b = chat(s, hist2, max_tokens=20, extra_body=NOTHINK, **T), chat(one, hist2, max_tokens=20, extra_body=NOTHINK, **T)
        same_output(a, b)
        assert a["cached"] > 0, a
        done.set()
        bg.join()
    finally:
        assert s.stop() == 0, s.text()[-3000:]
