# ninfer-serve's newer endpoints with the official openai sdk: the Responses API
# (/v1/responses, streaming, input_tokens, GET / DELETE, previous_response_id and the bounded
# store), legacy Completions (/v1/completions: text or token-id prompts, echo, logprobs,
# stop, streaming) and logprobs on Chat Completions.
#
# two servers: the REAL engine (ninfer-serve on models/kjv/kjv.ninfer, the real tokenizer and
# chat template; the cpu reference path where there is no gpu) and the fake engine
# (build/test/serve_fake, for scripted tool calls and exact shapes). logprobs are checked
# against the model's own logits: `ninfer --logits-out` on the same ids, log-softmaxed here in
# float64 over every vocabulary row (the server's normalisation).
import json
import os
import re
import subprocess
import time

import numpy as np
import openai
import pytest

from test_serve import Conn, Server, http, request, sse_events

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, os.environ.get("NINFER_BIN", "build/test/ninfer"))
SERVE_BIN = os.path.join(os.path.dirname(BIN), "ninfer-serve")
FAKE_BIN = os.environ.get("SERVE_FAKE_BIN") or os.path.join(ROOT, "build", "test", "serve_fake")
KJV = os.path.join(ROOT, "models/kjv/kjv.ninfer")
TEXT = "In the beginning God created the heaven and the earth. And the earth was without form"


def need(path):
    if not os.path.exists(path):
        pytest.skip(f"{os.path.relpath(path, ROOT)} is not built")


@pytest.fixture(scope="module")
def real():
    need(SERVE_BIN)
    s = Server("--max-context", "1024", "--default-max-tokens", "16", cmd=[SERVE_BIN, KJV])
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def fake():
    need(FAKE_BIN)
    s = Server("--max-context", "4096", "--default-max-tokens", "64", "--response-store-max-records", "3",
               cmd=[FAKE_BIN, "fake"])
    yield s
    assert s.stop() == 0


def client(srv):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="none", max_retries=0, timeout=120)


def model_of(srv):
    st, _, body = request(srv.port, "GET", "/v1/models")
    assert st == 200
    return json.loads(body)["data"][0]["id"]


def on_cpu(srv):
    return "running the cpu reference path" in srv.text()


def ninfer(*args):
    r = subprocess.run([BIN, KJV, *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def kjv_ids(text):
    r = subprocess.run([BIN, KJV, "--tokenize"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [int(x) for x in r.stdout.split()]


def oracle_logprobs(tmp_path, ids):
    """log softmax of the model's logits for every prompt row, [len(ids), vocab] float64"""
    f = tmp_path / "logits.f32"
    ninfer("--prompt-ids", ",".join(map(str, ids)), "--logits-out", str(f), "--max-new", "1", "--greedy")
    lg = np.fromfile(f, dtype=np.float32).reshape(len(ids), -1).astype(np.float64)
    m = lg.max(axis=1, keepdims=True)
    return lg - (m + np.log(np.exp(lg - m).sum(axis=1, keepdims=True)))


def tol(srv):
    # cpu: the server runs the same reference forward as --logits-out (prompt rows bit for bit;
    # decode rows through the recurrent deltanet instead of the chunked prefill: fp32 rounding).
    # gpu: bf16 activations, decode kernels against prefill kernels
    return 2e-3 if on_cpu(srv) else 0.15


# ---------------------------------------------------------------------------------------
# legacy completions against the real engine

def test_completions_prompt_logprobs_equal_the_models(real, tmp_path):
    """lm-evaluation-harness local-completions: prompt as [[ids]], echo, max_tokens 1, logprobs 1,
    temperature 0; the prompt's token_logprobs and top alternatives are the model's own"""
    ids = kjv_ids(TEXT)
    assert len(ids) > 10
    lp = oracle_logprobs(tmp_path, ids)
    r = client(real).completions.create(model=model_of(real), prompt=[ids], echo=True, max_tokens=1, logprobs=5,
                                        temperature=0)
    ch = r.choices[0]
    L = ch.logprobs
    assert len(L.tokens) == len(ids) + 1 and len(L.token_logprobs) == len(ids) + 1
    assert L.token_logprobs[0] is None and L.top_logprobs[0] is None
    exact = 1e-5 if on_cpu(real) else tol(real)
    for k in range(1, len(ids)):
        assert abs(L.token_logprobs[k] - lp[k - 1, ids[k]]) < exact, (k, L.token_logprobs[k], lp[k - 1, ids[k]])
        # the 5 alternatives: the model's 5 best ids (as text) with their logprobs
        best = np.argsort(-lp[k - 1], kind="stable")[:5]
        got = sorted(L.top_logprobs[k].values(), reverse=True)
        want = [lp[k - 1, b] for b in best]
        assert len(got) <= 5 and abs(got[0] - want[0]) < exact
        for g, w in zip(got, want):
            assert abs(g - w) < max(exact, 1e-4) or len(got) < 5  # two ids with one text merge into one key
    # the generated token: greedy, so it is the argmax of the last row, with its logprob
    assert abs(L.token_logprobs[-1] - lp[-1].max()) < exact
    assert L.token_logprobs[-1] == pytest.approx(max(L.top_logprobs[-1].values()), abs=1e-6)
    # lm-eval's is_greedy over the continuation: the token equals the best alternative
    greedy = [L.token_logprobs[k] >= max(L.top_logprobs[k].values()) - 1e-6 for k in range(1, len(ids))]
    assert any(greedy) and not all(greedy)  # a real text: some tokens are the model's pick, some not
    # text offsets are code points into the returned text (the echoed prompt, then the output)
    assert ch.text.startswith(TEXT)
    for k, off in enumerate(L.text_offset):
        assert ch.text[off:].startswith(L.tokens[k])
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 1


def test_completions_list_a_generated_stop_token(real, tmp_path):
    """a stop id (<|im_end|>, forced by logit_bias) ends the completion: it counts in usage and
    has its entry, with the model's raw logprob (the bias is a sampler setting, not the model)"""
    ids = kjv_ids("And God said")
    lp = oracle_logprobs(tmp_path, ids)
    r = client(real).completions.create(model=model_of(real), prompt=ids, echo=True, max_tokens=4, logprobs=1,
                                        temperature=0, logit_bias={"4258": 100})
    ch = r.choices[0]
    assert ch.finish_reason == "stop" and r.usage.completion_tokens == 1 and ch.text == "And God said"
    assert len(ch.logprobs.token_logprobs) == len(ids) + 1 and ch.logprobs.tokens[-1] == "<|im_end|>"
    exact = 1e-5 if on_cpu(real) else tol(real)
    assert abs(ch.logprobs.token_logprobs[-1] - lp[-1, 4258]) < exact and lp[-1, 4258] < lp[-1].max() - 1


def test_completions_score_only_and_string_prompt(real, tmp_path):
    ids = kjv_ids(TEXT)
    lp = oracle_logprobs(tmp_path, ids)
    r = client(real).completions.create(model=model_of(real), prompt=TEXT, echo=True, max_tokens=0, logprobs=0)
    ch = r.choices[0]
    assert ch.text == TEXT and ch.finish_reason == "length"
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 0
    assert "".join(ch.logprobs.tokens) == TEXT
    s = sum(ch.logprobs.token_logprobs[1:])
    assert abs(s - sum(lp[k - 1, ids[k]] for k in range(1, len(ids)))) < 1e-4 * len(ids)
    assert all(t == {} for t in ch.logprobs.top_logprobs[1:])


def test_completions_generated_logprobs_equal_the_models(real, tmp_path):
    m = model_of(real)
    ids = kjv_ids("And God said")
    r = client(real).completions.create(model=m, prompt=ids, max_tokens=12, logprobs=3, temperature=0)
    ch = r.choices[0]
    L = ch.logprobs
    assert "".join(L.tokens) == ch.text and len(L.tokens) == r.usage.completion_tokens
    gen = kjv_ids(ch.text)
    lp = oracle_logprobs(tmp_path, ids + gen)
    t = tol(real)
    for k, v in enumerate(L.token_logprobs):
        row = lp[len(ids) - 1 + k]
        assert abs(v - row.max()) < t, (k, v, row.max())  # greedy: the argmax, with its logprob
        assert abs(max(L.top_logprobs[k].values()) - v) < 1e-6
    # the same text as the cli's greedy completion
    cli = ninfer("--raw-prompt", "And God said", "--greedy", "--max-new", "12").stdout
    assert cli.rstrip("\n") == ch.text


def byte_level_id(tok, b):
    """the id of the token whose raw bytes are b (gpt-2 byte-level alphabet), via hf tokenizers"""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for x in range(256):
        if x not in bs:
            bs.append(x)
            cs.append(256 + n)
            n += 1
    m = dict(zip(bs, map(chr, cs)))
    i = tok.token_to_id("".join(m[x] for x in b))
    assert i is not None, b
    return i


def test_chat_sampled_logprobs_equal_the_models(real, tmp_path):
    """sampled (temperature 1): each token's logprob is the model's at that token, not the argmax's"""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(ROOT, "models/kjv/tokenizer/tokenizer.json"))
    c, m = client(real), model_of(real)
    r = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "And God said"}], max_tokens=12, temperature=1.0,
                                  top_p=1.0, seed=7, logprobs=True, top_logprobs=2, extra_body={"enable_thinking": False, "top_k": 0})
    content = r.choices[0].logprobs.content
    p = subprocess.run([BIN, KJV, "--prompt", "And God said", "--no-thinking", "--print-token-ids", "--max-new", "1"],
                       capture_output=True, text=True, timeout=300)
    prompt = [int(x) for x in re.search(r"prompt ids:([ 0-9]+)", p.stderr).group(1).split()]
    gen = [byte_level_id(tok, bytes(e.bytes)) for e in content]
    lp = oracle_logprobs(tmp_path, prompt + gen)
    t = tol(real)
    below = 0
    for k, e in enumerate(content):
        row = lp[len(prompt) - 1 + k]
        assert abs(e.logprob - row[gen[k]]) < t, (k, e.logprob, row[gen[k]])
        assert abs(e.top_logprobs[0].logprob - row.max()) < t
        below += e.logprob < e.top_logprobs[0].logprob - 1e-3
    assert below > 0  # some sampled tokens were not the argmax: the test sees more than greedy


def test_completions_stop_echo_and_stream(real):
    c, m = client(real), model_of(real)
    full = c.completions.create(model=m, prompt="And God said", max_tokens=16, temperature=0).choices[0].text
    words = full.split()
    assert len(words) >= 4
    stop = " " + words[2]
    cut = c.completions.create(model=m, prompt="And God said", max_tokens=16, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[:full.index(stop)] and cut.choices[0].finish_reason == "stop"
    echo = c.completions.create(model=m, prompt="And God said", max_tokens=16, temperature=0, echo=True)
    assert echo.choices[0].text == "And God said" + full
    # streaming: the same text, with the echo first and the logprobs split across chunks
    chunks = list(c.completions.create(model=m, prompt="And God said", max_tokens=16, temperature=0, echo=True,
                                       logprobs=1, stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == "And God said" + full
    assert chunks[0].choices[0].text == "And God said"
    toks = [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens]
    assert "".join(toks) == text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16


# ---------------------------------------------------------------------------------------
# chat completions logprobs against the real engine

def test_chat_logprobs_equal_the_models(real, tmp_path):
    c, m = client(real), model_of(real)
    msgs = [{"role": "user", "content": "Who made the heaven and the earth?"}]
    r = c.chat.completions.create(model=m, messages=msgs, max_tokens=10, temperature=0, logprobs=True, top_logprobs=3,
                                  extra_body={"enable_thinking": False})
    ch = r.choices[0]
    content = ch.logprobs.content
    assert content and "".join(bytes(t.bytes).decode("utf-8", "replace") for t in content).strip() == ch.message.content.strip()
    for t in content:
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob, abs=1e-6)  # greedy
    # the oracle: the rendered prompt's ids (the cli renders the same template), then the
    # generated ids fed back; row len(prompt)-1+k is the distribution of generated token k
    p = subprocess.run([BIN, KJV, "--prompt", msgs[0]["content"], "--no-thinking", "--print-token-ids", "--greedy",
                        "--max-new", "10"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    prompt = [int(x) for x in re.search(r"prompt ids:([ 0-9]+)", p.stderr).group(1).split()]
    assert len(prompt) == r.usage.prompt_tokens
    gen = [int(x) for x in re.findall(r"\[(\d+) '", p.stderr)]
    lp = oracle_logprobs(tmp_path, prompt + gen)
    t = tol(real)
    for k, e in enumerate(content):
        assert abs(e.logprob - lp[len(prompt) - 1 + k].max()) < t, (k, e.logprob)
    # streamed: the same tokens, each once, in the chunks that carry their text
    st = list(c.chat.completions.create(model=m, messages=msgs, max_tokens=10, temperature=0, logprobs=True,
                                        top_logprobs=3, stream=True, extra_body={"enable_thinking": False}))
    toks = [x for ck in st if ck.choices and ck.choices[0].logprobs and ck.choices[0].logprobs.content
            for x in ck.choices[0].logprobs.content]
    assert [x.token for x in toks] == [x.token for x in content]
    assert [x.logprob for x in toks] == [x.logprob for x in content]


# ---------------------------------------------------------------------------------------
# the responses api against the real engine (real template)

def test_responses_real(real):
    c, m = client(real), model_of(real)
    r = c.responses.create(model=m, input="And God said", instructions="Answer in the words of scripture.",
                           max_output_tokens=24, temperature=0, reasoning={"effort": "none"})
    assert r.object == "response" and r.status in ("completed", "incomplete") and r.id.startswith("resp_")
    assert r.instructions == "Answer in the words of scripture."
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 24
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.output_text and r.output[-1].type == "message"
    n = c.responses.input_tokens.count(model=m, input="And God said", instructions="Answer in the words of scripture.",
                                       reasoning={"effort": "none"})
    assert n.input_tokens == r.usage.input_tokens
    # streaming: the sdk helper's events and final response agree with the non-streamed one
    with c.responses.stream(model=m, input="And God said", instructions="Answer in the words of scripture.",
                            max_output_tokens=24, temperature=0, reasoning={"effort": "none"}) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response() if r.status == "completed" else None
    assert "".join(deltas) == r.output_text
    if final is not None:
        assert final.output_text == r.output_text and final.usage.output_tokens == r.usage.output_tokens
    # stream=True: raw events, numbered, one terminal event
    evs = list(c.responses.create(model=m, input="And God said", max_output_tokens=24, stream=True))
    assert [e.sequence_number for e in evs] == list(range(len(evs)))
    assert evs[0].type == "response.created" and evs[-1].type in ("response.completed", "response.incomplete")
    # thinking on (the template's default): a reasoning item first, counted in reasoning_tokens
    t = c.responses.create(model=m, input="And God said", max_output_tokens=24)
    assert t.output[0].type == "reasoning" and t.usage.output_tokens_details.reasoning_tokens > 0


def test_responses_tool_history_renders_with_the_real_template(real):
    """a 3-turn tool loop as agents send it: the call (as the model would have made it) and its
    output come back as items; the real template renders them and the model answers"""
    c, m = client(real), model_of(real)
    tools = [{"type": "function", "name": "get_verse", "description": "look a verse up",
              "parameters": {"type": "object", "properties": {"ref": {"type": "string"}}, "required": ["ref"]},
              "strict": False}]
    first = c.responses.create(model=m, input="Find Genesis 1:1", tools=tools, max_output_tokens=16,
                               reasoning={"effort": "none"})
    items = [{"type": "function_call", "call_id": "call_1", "name": "get_verse", "arguments": '{"ref": "Genesis 1:1"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "In the beginning God created"}]
    second = c.responses.create(model=m, previous_response_id=first.id, input=items, tools=tools, max_output_tokens=16,
                                reasoning={"effort": "none"})
    assert second.status in ("completed", "incomplete") and second.usage.input_tokens > first.usage.input_tokens
    n = c.responses.input_tokens.count(model=m, previous_response_id=first.id, input=items, tools=tools,
                                       reasoning={"effort": "none"})
    assert n.input_tokens == second.usage.input_tokens
    third = c.responses.create(model=m, previous_response_id=second.id, input="And then?", tools=tools,
                               max_output_tokens=16, reasoning={"effort": "none"})
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens - 4
    listed = c.responses.input_items.list(second.id, order="asc")
    assert [i.type for i in listed.data] == ["function_call", "function_call_output"]
    # invalid arguments json: a 400 naming the item
    with pytest.raises(openai.BadRequestError) as ei:
        c.responses.create(model=m, input=[{"type": "function_call", "call_id": "c", "name": "get_verse", "arguments": "{"}])
    assert ei.value.body["param"] == "input[0].arguments"


def test_responses_store_get_delete(real):
    c, m = client(real), model_of(real)
    r = c.responses.create(model=m, input="And God said", max_output_tokens=16, metadata={"k": "v"})
    got = c.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.metadata == {"k": "v"}
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as ei:
        c.responses.retrieve(r.id)
    assert ei.value.body["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model=m, input="x", previous_response_id=r.id)
    nostore = c.responses.create(model=m, input="And God said", max_output_tokens=16, store=False)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(nostore.id)


# ---------------------------------------------------------------------------------------
# the fake engine: scripted tool calls, exact shapes, the store's bounds, validation

def test_fake_responses_function_call_loop(fake):
    c, m = client(fake), model_of(fake)
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    r = c.responses.create(model=m, input="weather?", tools=tools)
    assert [o.type for o in r.output] == ["reasoning", "function_call"]
    fc = r.output[1]
    assert fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "Paris"}
    assert fc.call_id.startswith("call_") and fc.id.startswith("fc_") and r.status == "completed"
    assert r.output[0].content[0].text == "Let me think." and r.usage.output_tokens_details.reasoning_tokens == 4
    r2 = c.responses.create(model=m, previous_response_id=r.id, tools=tools,
                            input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"}])
    assert r2.output_text == "Result: sunny"
    # streamed: the function call's events, and the helper's final response
    with c.responses.stream(model=m, input="weather?", tools=tools) as s:
        types = [e.type for e in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types
    assert final.output[1].type == "function_call" and json.loads(final.output[1].arguments) == {"city": "Paris"}
    assert types[-1] == "response.completed"


def test_fake_responses_stream_events(fake):
    m = model_of(fake)
    st, h, body = request(fake.port, "POST", "/v1/responses", {"model": m, "input": "hi", "stream": True})
    assert st == 200 and h["content-type"] == "text/event-stream"
    evs = [(e, json.loads(d)) for e, d in sse_events(body)]
    assert all(e == d["type"] for e, d in evs) and [d["sequence_number"] for _, d in evs] == list(range(len(evs)))
    types = [e for e, _ in evs]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert types[-1] == "response.completed" and "[DONE]" not in body.decode()
    text = "".join(d["delta"] for e, d in evs if e == "response.output_text.delta")
    assert text == "Hello, wörld! 你好 🙂 done."
    done = evs[-1][1]["response"]
    assert done["output"][1]["content"][0]["text"] == text and done["usage"]["output_tokens"] == 21
    # an engine failure mid-stream: response.failed
    st, _, body = request(fake.port, "POST", "/v1/responses", {"model": m, "input": "[[fail]]", "stream": True})
    evs = [(e, json.loads(d)) for e, d in sse_events(body)]
    assert evs[-1][0] == "response.failed" and evs[-1][1]["response"]["status"] == "failed"


def test_fake_responses_incomplete(fake):
    r = client(fake).responses.create(model=model_of(fake), input="[[tokens=40]]", max_output_tokens=16,
                                      reasoning={"effort": "none"})
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens" and r.usage.output_tokens == 16


def test_fake_response_store_bounded(fake):
    """--response-store-max-records 3: the fourth response evicts the least recently used"""
    c, m = client(fake), model_of(fake)
    ids = [c.responses.create(model=m, input=f"n{k}", reasoning={"effort": "none"}).id for k in range(3)]
    c.responses.retrieve(ids[0])  # now the most recent: ids[1] goes next
    c.responses.create(model=m, input="n3", reasoning={"effort": "none"})
    c.responses.retrieve(ids[0])
    c.responses.retrieve(ids[2])
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(ids[1])
    with pytest.raises(openai.NotFoundError) as ei:
        c.responses.create(model=m, input="x", previous_response_id=ids[1])
    assert ei.value.body["code"] == "response_not_found" and ei.value.body["param"] == "previous_response_id"


def test_response_store_mib_limit():
    need(FAKE_BIN)
    s = Server("--response-store-max-mib", "0", cmd=[FAKE_BIN, "fake"])
    try:
        c, m = client(s), model_of(s)
        r = c.responses.create(model=m, input="hi")
        assert r.store is False  # it does not fit: not kept, and the response says so
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r.id)
    finally:
        assert s.stop() == 0


def test_fake_responses_input_items_and_fixed_failures(fake):
    c, m = client(fake), model_of(fake)
    items = [{"role": "user", "content": f"m{k}"} for k in range(5)]
    r = c.responses.create(model=m, input=items, reasoning={"effort": "none"})
    desc = c.responses.input_items.list(r.id, limit=2)
    assert [i.content[0].text if hasattr(i.content[0], "text") else i.content for i in desc.data] == ["m4", "m3"] or \
           [i.content for i in desc.data] == ["m4", "m3"]
    assert desc.has_more
    asc = c.responses.input_items.list(r.id, order="asc", after=desc.data[0].id)
    assert len(asc.data) == 0
    for path, code in (("/v1/responses/compact", "compaction_not_supported"), (f"/v1/responses/{r.id}/cancel", "invalid_request_error")):
        st, _, body = request(fake.port, "POST", path, {"model": m})
        assert st == 400 and json.loads(body)["error"]["code"] == code
    st, _, _ = request(fake.port, "PUT", f"/v1/responses/{r.id}")
    assert st == 405


@pytest.mark.parametrize("extra,param,code", [
    ({"frobnicate": 1}, "frobnicate", "unknown_parameter"),
    ({"tools": [{"type": "function", "name": "f", "strict": True}]}, "tools[0].strict", "strict_not_supported"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "tool_type_not_supported"),
    ({"tool_choice": "required"}, "tool_choice", "invalid_request_error"),
    ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}}, "tool_choice", "invalid_request_error"),
    ({"top_logprobs": 2}, "top_logprobs", "invalid_request_error"),
    ({"background": True}, "background", "invalid_request_error"),
    ({"include": ["reasoning.encrypted_content"]}, "include", "invalid_request_error"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type", "response_format_not_supported"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "array", "uniqueItems": True}}}}, "text.format.schema",
     "schema_not_supported"),
    ({"reasoning": {"summary": "auto"}}, "reasoning.summary", "invalid_request_error"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort", "reasoning_effort_not_supported"),
    ({"max_output_tokens": 8}, "max_output_tokens", "invalid_request_error"),
    ({"parallel_tool_calls": False}, "parallel_tool_calls", "invalid_request_error"),
    ({"truncation": "auto"}, "truncation", "invalid_request_error"),
    ({"metadata": {"k": 1}}, "metadata", "invalid_request_error"),
    ({"input": []}, "input", "invalid_request_error"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "invalid_request_error"),
    ({"input": [{"role": "user", "content": "a", "extra": 1}]}, "input[0].extra", "unknown_parameter"),
    ({"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}]}, "input[0].summary", "invalid_request_error"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", "invalid_request_error"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}, "input[0].content", "vision_disabled"),
    ({"instructions": 3}, "instructions", "invalid_request_error"),
    ({"preserve_thinking": 1}, "preserve_thinking", "invalid_request_error"),
    ({"chat_template_kwargs": {"preserve_thinking": "on"}}, "chat_template_kwargs.preserve_thinking", "invalid_request_error"),
    ({"reasoning": {"effort": "low"}}, "reasoning.effort", "reasoning_effort_not_supported"),
])
def test_fake_responses_refuse_by_name(fake, extra, param, code):
    body = {"model": model_of(fake), "input": "hi"}
    body.update(extra)
    st, _, b = request(fake.port, "POST", "/v1/responses", body)
    err = json.loads(b)["error"]
    assert st == 400 and err["param"] == param and err["code"] == code, err


def test_fake_input_tokens(fake):
    m = model_of(fake)
    st, _, b = request(fake.port, "POST", "/v1/responses/input_tokens", {"model": m, "input": "hi"})
    assert st == 200 and json.loads(b) == {"object": "response.input_tokens",
                                           "input_tokens": len("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n")}
    st, _, b = request(fake.port, "POST", "/v1/responses/input_tokens", {"model": m, "input": "hi", "stream": True})
    assert st == 400 and json.loads(b)["error"]["param"] == "stream"


def test_fake_completions_shapes(fake):
    c, m = client(fake), model_of(fake)
    r = c.completions.create(model=m, prompt="ab", echo=True, logprobs=2, max_tokens=3)
    ch = r.choices[0]
    assert ch.text == "abHello, w" and ch.finish_reason == "length" and r.object == "text_completion"
    assert ch.logprobs.tokens == ["a", "b", "H", ",", " "]  # the fake's token ids are their first bytes
    assert ch.logprobs.token_logprobs[:3] == [None, -1.0, -0.5] and ch.logprobs.top_logprobs[1] == {"b": -1.0, "c": -2.0}
    assert r.usage.prompt_tokens == 2 and r.usage.completion_tokens == 3
    ids = c.completions.create(model=m, prompt=[104, 105], max_tokens=64, stop=[" w"])
    assert ids.choices[0].text == "Hello," and ids.choices[0].finish_reason == "stop"
    # streaming with echo: the prompt first
    chunks = list(c.completions.create(model=m, prompt="[[tokens=3]]", echo=True, max_tokens=64, stream=True))
    assert chunks[0].choices[0].text == "[[tokens=3]]"
    assert "".join(k.choices[0].text for k in chunks) == "[[tokens=3]]w0 w1 w2"


@pytest.mark.parametrize("extra,param,code", [
    ({"prompt": ["a", "b"]}, "prompt", "invalid_request_error"),
    ({"prompt": [[1, 2], [3]]}, "prompt", "invalid_request_error"),
    ({"prompt": []}, "prompt", "invalid_request_error"),
    ({"prompt": [1, -2]}, "prompt", "invalid_request_error"),
    ({"prompt": [1, 300]}, "prompt", "invalid_request_error"),
    ({"prompt": ""}, "prompt", "invalid_request_error"),
    ({"suffix": "x"}, "suffix", "invalid_request_error"),
    ({"n": 2}, "n", "n_not_supported"),
    ({"best_of": 3}, "best_of", "n_not_supported"),
    ({"max_tokens": 0}, "max_tokens", "invalid_request_error"),
    ({"logprobs": 21}, "logprobs", "invalid_request_error"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_request_error"),
    ({"user": "u"}, "user", "unknown_parameter"),
])
def test_fake_completions_refuse_by_name(fake, extra, param, code):
    body = {"model": model_of(fake), "prompt": "hi"}
    body.update(extra)
    st, _, b = request(fake.port, "POST", "/v1/completions", body)
    err = json.loads(b)["error"]
    assert st == 400 and err["param"] == param and err["code"] == code, err


def test_fake_chat_logprobs(fake):
    c, m = client(fake), model_of(fake)
    r = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=2)
    lp = r.choices[0].logprobs
    pieces = [b"Hello", b",", b" w", b"\xc3", b"\xb6rld", b"!", b" ", b"\xe4\xbd", b"\xa0\xe5", b"\xa5\xbd", b" ",
              b"\xf0\x9f", b"\x99\x82", b" done", b"."]  # serve_fake.cc's content tokens: id = first byte
    assert [t.bytes for t in lp.content] == [[p[0]] for p in pieces]
    assert all(t.logprob == -0.5 and [a.logprob for a in t.top_logprobs] == [-0.5, -1.5] for t in lp.content)
    assert [t["token"] for t in lp.model_extra["reasoning_content"]] == ["L", " ", " ", ".", "<"]  # <: the silent </think>
    # streamed: every content token once, in order, riding on the chunks with text
    st = list(c.chat.completions.create(model=m, messages=[{"role": "user", "content": "hi"}], logprobs=True, stream=True))
    toks = [t.token for k in st if k.choices and k.choices[0].logprobs for t in (k.choices[0].logprobs.content or [])]
    assert toks == [t.token for t in lp.content]
    assert all(t.top_logprobs == [] for k in st if k.choices and k.choices[0].logprobs for t in (k.choices[0].logprobs.content or []))
    # no logprobs asked: null
    r = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].logprobs is None
    for bad, param in (({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                       ({"logprobs": 1}, "logprobs")):
        body = {"model": m, "messages": [{"role": "user", "content": "hi"}]}
        body.update(bad)
        st, _, b = request(fake.port, "POST", "/v1/chat/completions", body)
        assert st == 400 and json.loads(b)["error"]["param"] == param


def test_fake_hostile_bodies_never_crash(fake):
    """every field of both endpoints with every wrong json type: a 400 (or a 200 where the value
    happens to be valid), never a 5xx, and the server answers afterwards"""
    m = model_of(fake)
    wrong = [None, True, -1, 0, 1.5, 1e300, "", "x" * 300, [], [None], [[]], {}, {"a": None}, [{"type": None}],
             [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": None}]}],
             [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}],
             [{"type": "reasoning", "content": [{"type": "reasoning_text"}]}]]
    bases = {"/v1/completions": ({"model": m, "prompt": "hi", "max_tokens": 4},
                                 ["model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
                                  "frequency_penalty", "seed", "stop", "echo", "logprobs", "stream", "stream_options", "n",
                                  "best_of", "logit_bias", "suffix"]),
             "/v1/responses": ({"model": m, "input": "hi", "max_output_tokens": 16},
                               ["model", "input", "instructions", "previous_response_id", "max_output_tokens", "stream", "store",
                                "temperature", "top_p", "metadata", "reasoning", "preserve_thinking", "chat_template_kwargs",
                                "text", "tools", "tool_choice", "parallel_tool_calls", "truncation", "top_logprobs",
                                "service_tier", "background", "include"]),
             "/v1/responses/input_tokens": ({"model": m, "input": "hi"}, ["input", "instructions", "tools", "reasoning"])}
    n = 0
    for path, (base, fields) in bases.items():
        for f in fields:
            for v in wrong:
                body = dict(base)
                body[f] = v
                st, _, b = request(fake.port, "POST", path, body)
                assert st in (200, 400, 404), (path, f, v, st, b)
                if st != 200:
                    err = json.loads(b)["error"]
                    assert err["message"] and err["code"], (path, f, v, b)
                n += 1
    assert n > 600
    st, _, b = request(fake.port, "POST", "/v1/completions", {"model": m, "prompt": "hi", "max_tokens": 4})
    assert st == 200, b


@pytest.mark.parametrize("path,body", [
    ("/v1/responses", {"input": "[[tokens=300]][[delay=20]]", "max_output_tokens": 400, "reasoning": {"effort": "none"}}),
    ("/v1/completions", {"prompt": "[[tokens=300]][[delay=20]]", "max_tokens": 400, "logprobs": 2}),
])
def test_fake_client_leaves_mid_stream(fake, path, body):
    """the generation is cancelled at the next token; the server answers at once"""
    m = model_of(fake)
    mark = len(fake.log)
    c = Conn(fake.port)
    c.send(http("POST", path, json.dumps(dict(body, model=m, stream=True)).encode()))
    c.read_until(b"w2")
    c.close()
    t0 = time.time()
    st, _, _ = request(fake.port, "POST", "/v1/completions", {"model": m, "prompt": "hi", "max_tokens": 2})
    assert st == 200 and time.time() - t0 < 2
    line = fake.wait_log(r" 499 POST " + path + r" .*completion=(\d+)", since=mark)
    assert int(re.search(r"completion=(\d+)", line).group(1)) < 100


def test_logprobs_refused_with_speculative_decoding():
    """the mtp round emits ids without a row each: logprobs are refused by name, not faked"""
    need(SERVE_BIN)
    s = Server("--max-context", "512", "--default-max-tokens", "8", "--spec", "mtp", "--draft-tokens", "2", cmd=[SERVE_BIN, KJV])
    try:
        m = model_of(s)
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}),
                           ("/v1/completions", {"prompt": "And God said", "logprobs": 1})):
            st, _, b = request(s.port, "POST", path, dict(body, model=m))
            assert st == 400 and json.loads(b)["error"]["param"] == "logprobs", b
        st, _, b = request(s.port, "POST", "/v1/completions", {"model": m, "prompt": "And God said", "max_tokens": 4})
        assert st == 200 and json.loads(b)["usage"]["completion_tokens"] == 4, b
    finally:
        assert s.stop() == 0
