# the agent frameworks' structured-output flows, as their users write them, against the REAL
# engine (ninfer-serve on models/kjv/kjv.ninfer with its real chat template; the cpu path
# without a gpu): pydantic-ai output_type (tool output: a forced tool call; native output:
# response_format json_schema), openai-agents output_type (chat completions and the responses
# api), langchain with_structured_output (json_schema, function_calling), the llm
# cli's --schema, the openai sdk's chat.completions.parse() and responses.parse(), and the
# anthropic sdk's messages.parse(). each result is the framework's own parsed object, checked
# against the pydantic model it was asked for. the packages are pinned in test/requirements.txt.
import asyncio
import json
import os
import subprocess
import sys

from typing import Literal

import pytest
from pydantic import BaseModel, Field

from test_serve import Server, request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, os.environ.get("NINFER_BIN", "build/test/ninfer"))
SERVE_BIN = os.path.join(os.path.dirname(BIN), "ninfer-serve")
KJV = os.path.join(ROOT, "models/kjv/kjv.ninfer")


class Verse(BaseModel):
    # kjv writes long strings: the book is a choice, so every framework's form of the schema
    # (the anthropic sdk moves maxLength and the bounds into the description) can end
    book: Literal["Genesis", "Exodus", "Psalms", "John"] = Field(description="the book")
    chapter: int = Field(ge=1, le=150)


@pytest.fixture(scope="module")
def kjv():
    if not os.path.exists(SERVE_BIN):
        pytest.skip("build/test/ninfer-serve is not built")
    s = Server("--max-context", "2048", "--default-max-tokens", "300", "--no-thinking", "--seed", "1", cmd=[SERVE_BIN, KJV])
    yield s
    assert s.stop() == 0


def base(srv):
    return f"http://127.0.0.1:{srv.port}/v1"


def model_of(srv):
    st, _, body = request(srv.port, "GET", "/v1/models")
    return json.loads(body)["data"][0]["id"]


def check(v):
    assert isinstance(v, Verse), v
    Verse.model_validate(v.model_dump())  # the bounds hold


def test_openai_sdk_parse(kjv):
    import openai
    c = openai.OpenAI(base_url=base(kjv), api_key="none", max_retries=0, timeout=300)
    r = c.chat.completions.parse(model=model_of(kjv), messages=[{"role": "user", "content": "a verse"}], response_format=Verse, max_tokens=300)
    check(r.choices[0].message.parsed)
    r = c.responses.parse(model=model_of(kjv), input="a verse", text_format=Verse, max_output_tokens=300)
    check(r.output_parsed)


def test_anthropic_sdk_messages_parse(kjv):
    import anthropic
    c = anthropic.Anthropic(base_url=f"http://127.0.0.1:{kjv.port}", api_key="none", max_retries=0, timeout=300)
    m = c.messages.parse(model="kjv", max_tokens=300, messages=[{"role": "user", "content": "a verse"}], output_format=Verse)
    check(m.parsed_output)


def test_pydantic_ai_output_type(kjv):
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    model = OpenAIChatModel(model_of(kjv), provider=OpenAIProvider(base_url=base(kjv), api_key="none"))
    # the default: a tool output, i.e. a forced call of the output tool
    check(Agent(model, output_type=Verse, retries=0).run_sync("a verse").output)
    # native output: response_format json_schema
    check(Agent(model, output_type=NativeOutput(Verse), retries=0).run_sync("a verse").output)


def test_openai_agents_output_type(kjv):
    import agents
    from openai import AsyncOpenAI
    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base(kjv), api_key="none", max_retries=0, timeout=300)
    for m in (agents.OpenAIChatCompletionsModel(model=model_of(kjv), openai_client=client),
              agents.OpenAIResponsesModel(model=model_of(kjv), openai_client=client)):
        a = agents.Agent(name="v", instructions="Answer with a verse.", output_type=Verse, model=m)
        check(agents.Runner.run_sync(a, "a verse").final_output)


def test_langchain_with_structured_output(kjv):
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(model=model_of(kjv), base_url=base(kjv), api_key="none", max_retries=0, timeout=300, max_tokens=300)
    # json_mode (response_format json_object) is any object: kjv's free strings rarely end
    # within a limit, so it is checked in test_structured.py, which accepts a "length" finish
    for method in ("json_schema", "function_calling"):
        check(llm.with_structured_output(Verse, method=method).invoke("a verse"))


def test_llm_cli_schema(kjv, tmp_path):
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: kjv\n  model_name: {model_of(kjv)}\n  api_base: {base(kjv)}\n  supports_schema: true\n  api_key_name: none\n")
    (tmp_path / "keys.json").write_text(json.dumps({"none": "none"}))
    env = dict(os.environ, LLM_USER_PATH=str(tmp_path))
    schema = json.dumps(Verse.model_json_schema())
    r = subprocess.run([sys.executable, "-m", "llm", "-m", "kjv", "--no-log", "--schema", schema, "-o", "max_tokens", "300", "a verse"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    check(Verse.model_validate_json(r.stdout))
    # the concise schema syntax too: a free string and an integer
    r = subprocess.run([sys.executable, "-m", "llm", "-m", "kjv", "--no-log", "--schema", "chapter int, verse int", "-o", "max_tokens", "300", "a verse"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert list(doc) == ["chapter", "verse"] and all(isinstance(v, int) for v in doc.values())
