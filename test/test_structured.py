# structured outputs (grammar.h, issue 17), with the jsonschema package as the oracle:
#   - the compiler over the corpus (test/schemas/corpus.json, made by test/make_schema_corpus.py:
#     >= 100 schemas from pydantic, the openai and anthropic sdks' strict forms and the
#     JSON-Schema-Test-Suite's shapes): random walks through each grammar (build/test/grammar_gen)
#     all validate; the refused ones fail with the keyword named
#   - the REAL engine: ninfer-serve on models/kjv/kjv.ninfer (the real tokenizer and chat
#     template, the cpu path without a gpu) and on the random-weight tiny model: every
#     completed output validates, a token limit inside the structure is a "length" finish
#     with partial text, property order and required fields, json_object, streaming, the
#     responses api's text.format, anthropic output_config.format, forced tool calls on both
#     apis, refusals by name; the cli's --json-schema / --grammar
import json
import os
import subprocess

import anthropic
import jsonschema
import openai
import pytest

from test_serve import Server, request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, os.environ.get("NINFER_BIN", "build/test/ninfer"))
SERVE_BIN = os.path.join(os.path.dirname(BIN), "ninfer-serve")
GEN_BIN = os.path.join(ROOT, "build", "test", "grammar_gen")
KJV = os.path.join(ROOT, "models/kjv/kjv.ninfer")
TINY = os.path.join(ROOT, "build/models/tiny.ninfer")
CORPUS = json.load(open(os.path.join(ROOT, "test/schemas/corpus.json")))


def need(path):
    if not os.path.exists(path):
        pytest.skip(f"{os.path.relpath(path, ROOT)} is not built")


def validator(schema):
    cls = jsonschema.validators.validator_for(schema if isinstance(schema, dict) else {})
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def check_valid(schema, text, what):
    doc = json.loads(text)  # a completed output is json ...
    errors = [e.message for e in validator(schema).iter_errors(doc)]
    assert not errors, f"{what}: {text!r}: {errors[:3]}"  # ... of the schema
    return doc


def test_corpus_size_and_sources():
    names = [e["name"] for e in CORPUS["corpus"]]
    assert len(names) >= 100 and len(set(names)) == len(names)
    for src in ("pydantic-", "openai-strict-", "anthropic-", "suite-"):
        assert sum(n.startswith(src) for n in names) >= 15, src
    for e in CORPUS["corpus"]:
        jsonschema.validators.validator_for(e["schema"] if isinstance(e["schema"], dict) else {}).check_schema(e["schema"])


def run_gen(tmp_path, entries, n, seed):
    p = tmp_path / "c.json"
    p.write_text(json.dumps(entries))
    r = subprocess.run([GEN_BIN, "gen", str(p), str(n), str(seed)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.split("\n") if line]


def test_compiler_walks_validate(tmp_path):
    need(GEN_BIN)
    out = run_gen(tmp_path, CORPUS["corpus"], 8, 17)
    assert len(out) == len(CORPUS["corpus"])
    total = 0
    for e, r in zip(CORPUS["corpus"], out):
        assert "error" not in r, (e["name"], r.get("error"))
        for t in r["samples"]:
            check_valid(e["schema"], t, e["name"])
            total += 1
    assert total == 8 * len(CORPUS["corpus"])


def test_compiler_refuses_by_name(tmp_path):
    need(GEN_BIN)
    out = run_gen(tmp_path, CORPUS["refused"], 1, 1)
    for e, r in zip(CORPUS["refused"], out):
        assert "error" in r, e["name"]
        assert e["names"] in r["error"], (e["name"], r["error"])


# ---- the real engine -------------------------------------------------------------------

@pytest.fixture(scope="module")
def kjv():
    need(SERVE_BIN)
    s = Server("--max-context", "2048", "--default-max-tokens", "200", "--no-thinking", cmd=[SERVE_BIN, KJV])
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def tiny():
    need(SERVE_BIN)
    need(TINY)
    s = Server("--max-context", "1024", "--no-thinking", cmd=[SERVE_BIN, TINY])
    yield s
    assert s.stop() == 0


def oai(srv):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="none", max_retries=0, timeout=300)


def ant(srv):
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{srv.port}", api_key="none", max_retries=0, timeout=300)


def model_of(srv):
    st, _, body = request(srv.port, "GET", "/v1/models")
    return json.loads(body)["data"][0]["id"]


def chat_schema(srv, schema, max_tokens, seed, prompt="Answer in json.", **kw):
    return oai(srv).chat.completions.create(
        model=model_of(srv), messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}, **kw)


def corpus_run(srv, entries, max_tokens, min_complete):
    done = 0
    for i, e in enumerate(entries):
        r = chat_schema(srv, e["schema"], max_tokens, seed=i)
        c = r.choices[0]
        if c.finish_reason == "stop":
            check_valid(e["schema"], c.message.content, e["name"])
            done += 1
        else:
            assert c.finish_reason == "length", (e["name"], c.finish_reason)
            assert r.usage.completion_tokens == max_tokens
    assert done >= min_complete * len(entries), f"only {done} of {len(entries)} outputs completed"
    return done


def test_kjv_corpus_outputs_validate(kjv):
    # every third schema of the corpus (all of it is ~3 minutes on the cpu path)
    entries = [e for e in CORPUS["corpus"] if isinstance(e["schema"], dict)][::3]  # the api takes object schemas
    corpus_run(kjv, entries, 160, 0.5)


def test_tiny_random_weights_outputs_validate(tiny):
    # random weights pick any allowed token: bounded schemas complete, the rest end on the limit
    entries = [e for e in CORPUS["corpus"] if e["name"].startswith("suite-") and isinstance(e["schema"], dict)][::2]
    corpus_run(tiny, entries, 48, 0.2)


def test_property_order_and_required(kjv):
    schema = {"type": "object", "properties": {"zeta": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "alpha": {"type": "boolean"}, "mid": {"type": "string", "maxLength": 8},
                                               "opt": {"type": "null"}},
              "required": ["zeta", "mid", "alpha"], "additionalProperties": False}
    for seed in range(4):
        r = chat_schema(kjv, schema, 300, seed)
        assert r.choices[0].finish_reason == "stop"
        doc = check_valid(schema, r.choices[0].message.content, "order")
        keys = [k for k in doc]
        assert [k for k in keys if k != "opt"] == ["zeta", "alpha", "mid"]  # schema order, required present
        assert keys.index("opt") == 3 if "opt" in keys else True


def test_json_object_and_stream(kjv):
    c = oai(kjv)
    r = c.chat.completions.create(model=model_of(kjv), messages=[{"role": "user", "content": "json please"}], max_tokens=200, seed=3,
                                  response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 99}}, "required": ["n"],
              "additionalProperties": False}
    text, finish = "", None
    for ch in c.chat.completions.create(model=model_of(kjv), messages=[{"role": "user", "content": "a number"}], max_tokens=80, seed=5,
                                        stream=True, response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}):
        if ch.choices and ch.choices[0].delta.content:
            text += ch.choices[0].delta.content
        if ch.choices and ch.choices[0].finish_reason:
            finish = ch.choices[0].finish_reason
    assert finish == "stop"
    check_valid(schema, text, "stream")


def test_token_limit_inside_structure_is_length(kjv):
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    r = chat_schema(kjv, schema, 6, 1)
    c = r.choices[0]
    assert c.finish_reason == "length" and r.usage.completion_tokens == 6
    with pytest.raises(json.JSONDecodeError):
        json.loads(c.message.content)  # the partial text, never reported complete


def test_thinking_on_constrains_the_answer_only(kjv):
    # with thinking on the reasoning is free; kjv never closes it, so the answer never starts:
    # the output ends on the limit, on the reasoning channel, with finish "length"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = chat_schema(kjv, schema, 40, 2, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert r.choices[0].finish_reason == "length"
    assert (r.choices[0].message.content or "") == ""


def test_responses_text_format(kjv):
    schema = {"type": "object", "properties": {"word": {"type": "string", "maxLength": 10}, "n": {"type": "integer", "minimum": 0, "maximum": 5}},
              "required": ["word", "n"], "additionalProperties": False}
    r = oai(kjv).responses.create(model=model_of(kjv), input="json", max_output_tokens=120,
                                  text={"format": {"type": "json_schema", "name": "w", "schema": schema, "strict": True}})
    assert r.status == "completed", r
    assert r.text.format.type == "json_schema"
    check_valid(schema, r.output_text, "responses")


def test_anthropic_output_config_format(kjv):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "ok": {"type": "boolean"}},
              "required": ["city", "ok"], "additionalProperties": False}
    # greedy: the messages api has no seed, and a sampled walk through the grammar's optional
    # whitespace can outrun max_tokens on the random kjv model (about 1 run in 15 did)
    m = ant(kjv).messages.create(model="kjv", max_tokens=120, messages=[{"role": "user", "content": "json"}], extra_body={"temperature": 0},
                                 output_config={"format": {"type": "json_schema", "schema": schema}}, thinking={"type": "disabled"})
    assert m.stop_reason == "end_turn"
    check_valid(schema, m.content[0].text, "anthropic")


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                            "unit": {"enum": ["c", "f"]}}, "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 6}},
                                                                               "required": ["tz"]}}}]


def test_openai_forced_tool_calls(kjv):
    c = oai(kjv)
    for choice, names in (("required", {"get_weather", "get_time"}), ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})):
        for seed in range(3):
            r = c.chat.completions.create(model=model_of(kjv), messages=[{"role": "user", "content": "weather in Paris?"}], max_tokens=160,
                                          seed=seed, tools=TOOLS, tool_choice=choice)
            ch = r.choices[0]
            assert ch.finish_reason == "tool_calls", ch
            call = ch.message.tool_calls[0]
            assert call.function.name in names
            params = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.function.name)
            check_valid(params, call.function.arguments, "tool arguments")
    # strict tools are honoured under a forced call, refused otherwise
    strict = [dict(TOOLS[0], function=dict(TOOLS[0]["function"], strict=True))]
    r = c.chat.completions.create(model=model_of(kjv), messages=[{"role": "user", "content": "x"}], max_tokens=160, tools=strict,
                                  tool_choice="required", seed=1)
    assert r.choices[0].finish_reason == "tool_calls"
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model=model_of(kjv), messages=[{"role": "user", "content": "x"}], tools=strict)
    assert "strict" in str(ei.value)


def test_anthropic_forced_tool_use(kjv):
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
    for choice, names in (({"type": "any"}, {"get_weather", "get_time"}), ({"type": "tool", "name": "get_weather"}, {"get_weather"})):
        m = ant(kjv).messages.create(model="kjv", max_tokens=160, messages=[{"role": "user", "content": "weather?"}], tools=tools,
                                     tool_choice=choice, thinking={"type": "disabled"})
        assert m.stop_reason == "tool_use", m
        use = [b for b in m.content if b.type == "tool_use"][0]
        assert use.name in names
        validator(next(t["input_schema"] for t in tools if t["name"] == use.name)).validate(use.input)


@pytest.mark.parametrize("body,param,word", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": 1}}}},
     "response_format.json_schema.schema", "minProperties"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "format": "uri"}}}},
     "response_format.json_schema.schema", "uri"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}, "stop": ["}"]}, "stop", "stop"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "json_schema"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "not in"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"not": {}}}}}}],
      "tool_choice": "required"}, "tools", "not"),
])
def test_refused_by_name(kjv, body, param, word):
    b = {"model": model_of(kjv), "messages": [{"role": "user", "content": "x"}], **body}
    st, _, out = request(kjv.port, "POST", "/v1/chat/completions", json.dumps(b).encode(), {"Content-Type": "application/json"})
    assert st == 400, out
    err = json.loads(out)["error"]
    assert err["param"] == param and word in err["message"], err


def test_anthropic_refused_by_name(kjv):
    with pytest.raises(anthropic.BadRequestError) as ei:
        ant(kjv).messages.create(model="kjv", max_tokens=10, messages=[{"role": "user", "content": "x"}],
                                 output_config={"format": {"type": "json_schema", "schema": {"type": "array", "uniqueItems": True}}})
    assert "uniqueItems" in str(ei.value)


# ---- the cli -------------------------------------------------------------------------

def test_cli_json_schema_and_grammar(tmp_path):
    need(BIN)
    schema = {"type": "object", "properties": {"book": {"type": "string", "maxLength": 12}, "chapter": {"type": "integer", "minimum": 1, "maximum": 150}},
              "required": ["book", "chapter"], "additionalProperties": False}
    sp = tmp_path / "s.json"
    sp.write_text(json.dumps(schema))
    done = 0
    for seed in range(3):
        r = subprocess.run([BIN, KJV, "--cpu", "--raw-prompt", "And God said", "--json-schema", str(sp), "--max-new", "120", "--seed", str(seed)],
                           capture_output=True, text=True, timeout=300)
        if r.returncode == 0:
            assert "the structure is complete" in r.stderr
            check_valid(schema, r.stdout, "cli")
            done += 1
        else:
            assert "incomplete" in r.stderr, r.stderr
    assert done >= 2
    gp = tmp_path / "g.gbnf"
    gp.write_text('root ::= "Verse " [1-9] [0-9]? ": " word (" " word){2,5} "."\nword ::= [a-z]{1,8}\n')
    r = subprocess.run([BIN, KJV, "--cpu", "--raw-prompt", "And God said", "--grammar", str(gp), "--max-new", "60", "--seed", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    import re
    assert re.fullmatch(r"Verse [1-9][0-9]?: [a-z]{1,8}( [a-z]{1,8}){2,5}\.\n", r.stdout), r.stdout
    # bad inputs: one line naming the file and the keyword, exit 1
    sp.write_text(json.dumps({"type": "object", "minProperties": 2}))
    r = subprocess.run([BIN, KJV, "--cpu", "--raw-prompt", "x", "--json-schema", str(sp)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "minProperties" in r.stderr and str(sp) in r.stderr
    gp.write_text("root ::= undefined\n")
    r = subprocess.run([BIN, KJV, "--cpu", "--raw-prompt", "x", "--grammar", str(gp)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "undefined" in r.stderr
