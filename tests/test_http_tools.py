"""Tool calls and assistant prefill on `/v1/chat/completions`, against a real `suffixspec serve` on a
tiny random Qwen2 model (whose template takes no tools: the generic tool prompt), with the official
`openai` client: forced calls (required, named) always parse, name an allowed function and carry
schema-valid arguments, whole and streamed, over random small schemas; speculation keeps them equal
to plain decoding; tool history is accepted and rendered; a prefill answers only its continuation.
The parsing of calls a model wrote on its own ("auto": Hermes blocks, Llama-style JSON) and the
stream's fragments are checked on text directly."""

import json

import httpx
import jsonschema
import numpy as np
import openai
import pytest

from support.http import TINY_TEMPLATE, ServerProcess, make_tiny_model_dir

USER = [{"role": "user", "content": "def g(x):\n    return x + 1\n"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from support import tiny_models  # noqa: F401  (one torch thread, as the server)

    root = tmp_path_factory.mktemp("http_tools")
    model_dir = make_tiny_model_dir(root / "tiny", positions=4096)  # (the tools prompt is long in 420 tokens)
    server = ServerProcess(["--model", str(model_dir), "--max-batch", "8"], root / "server.log")
    try:
        yield server
    finally:
        code = server.stop()
    assert code == 0, server.log()


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def random_tools(rng, count):
    tools = []
    for t in range(count):
        props = {}
        for i in range(int(rng.integers(1, 3))):
            kind = rng.choice(["string", "integer", "enum"])
            props[f"a{i}"] = ({"type": "string", "maxLength": 6} if kind == "string" else
                              {"type": "integer", "minimum": 0, "maximum": 50} if kind == "integer" else
                              {"enum": ["x", "y"]})
        tools.append({"type": "function", "function": {"name": f"tool_{t}", "description": f"tool number {t}",
                                                       "parameters": {"type": "object", "properties": props,
                                                                      "required": sorted(props),
                                                                      "additionalProperties": False}}})
    return tools


def streamed_calls(stream):
    calls, reason = {}, None
    for chunk in stream:
        (c,) = chunk.choices
        for frag in c.delta.tool_calls or []:
            call = calls.setdefault(frag.index, {"id": None, "name": None, "arguments": ""})
            if frag.id:
                assert call["id"] is None  # the id and name come first, once
                call["id"], call["name"] = frag.id, frag.function.name
            call["arguments"] += frag.function.arguments or ""
        reason = c.finish_reason or reason
    return [calls[k] for k in sorted(calls)], reason


def test_forced_calls_parse_and_validate_whole_and_streamed(served):
    oai = client(served)
    rng = np.random.default_rng(0)
    for trial in range(8):
        tools = random_tools(rng, int(rng.integers(1, 4)))
        named = tools[int(rng.integers(0, len(tools)))]["function"]["name"]
        choice = "required" if trial % 2 else {"type": "function", "function": {"name": named}}
        kw = dict(model="tiny", messages=USER, tools=tools, tool_choice=choice, max_tokens=120,
                  temperature=0.8, seed=trial, parallel_tool_calls=False)
        res = oai.chat.completions.create(**kw)
        msg = res.choices[0].message
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        if res.choices[0].finish_reason == "length":
            continue
        assert res.choices[0].finish_reason == "tool_calls" and msg.content is None
        (call,) = msg.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in schemas and (choice == "required" or call.function.name == named)
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        calls, reason = streamed_calls(oai.chat.completions.create(stream=True, **kw))
        assert reason == "tool_calls"
        assert [(c["name"], c["arguments"]) for c in calls] == [(call.function.name, call.function.arguments)]


def test_forced_calls_equal_plain_decoding(served):
    tools = random_tools(np.random.default_rng(3), 2)
    body = {"model": "tiny", "messages": USER, "tools": tools, "tool_choice": "required", "max_tokens": 120,
            "temperature": 0, "parallel_tool_calls": False}

    def answer(extra):
        r = httpx.post(served.url + "/v1/chat/completions", json=dict(body, **extra), timeout=120).json()
        message = r["choices"][0]["message"]
        for call in message.get("tool_calls") or []:
            call.pop("id")  # (fresh per answer)
        return message, r["choices"][0]["finish_reason"]

    spec, plain = answer({}), answer({"suffixspec": {"budget": 0}})
    assert spec == plain and spec[1] == "tool_calls", spec


def test_tool_history_and_auto_are_accepted(served):
    tools = random_tools(np.random.default_rng(1), 1)
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "tool_0", "arguments": '{"a0": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    prompts = {}
    for choice in ("auto", "none"):
        r = client(served).chat.completions.create(model="tiny", messages=history, tools=tools, tool_choice=choice,
                                                   max_tokens=8, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
        prompts[choice] = r.usage.prompt_tokens
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason != "tool_calls"  # "none": no call
    assert prompts["none"] == prompts["auto"]  # the tools stay in the prompt under "none"


def test_prefill_answers_only_the_continuation(served):
    start = "def g(x):\n    return"
    messages = USER + [{"role": "assistant", "content": start}]
    r = httpx.post(served.url + "/v1/chat/completions", timeout=120, json={
        "model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 0,
        "continue_final_message": True, "add_generation_prompt": False}).json()
    from suffixspec.http.chat import ChatTemplate

    prompt = ChatTemplate(TINY_TEMPLATE).render(messages, add_generation_prompt=False)
    prompt = prompt[: prompt.rfind(start) + len(start)]
    plain = httpx.post(served.url + "/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0}).json()
    assert r["choices"][0]["message"]["content"] == plain["choices"][0]["text"]
    assert not r["choices"][0]["message"]["content"].startswith(start)


BAD = [({"tools": [{"type": "function", "function": {"name": "a"}}], "tool_choice":
         {"type": "function", "function": {"name": "b"}}}, "tool_choice"),
       ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
       ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
       ({"tool_choice": "required"}, "tool_choice"),
       ({"continue_final_message": True}, "continue_final_message"),
       ({"add_generation_prompt": False}, "add_generation_prompt"),
       ({"tools": [{"type": "function", "function": {"name": "a"}}], "tool_choice": "required",
         "response_format": {"type": "json_object"}}, "response_format")]


def test_bad_tool_values_name_the_parameter(served):
    for extra, param in BAD:
        r = httpx.post(served.url + "/v1/chat/completions", timeout=30,
                       json={"model": "tiny", "messages": USER, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)


def test_calls_written_by_a_model_are_parsed_and_streamed():
    from suffixspec.http.tools import ToolStream, parse_calls, parse_tools

    spec = parse_tools({"tools": [{"type": "function", "function": {"name": "read_file"}},
                                  {"type": "function", "function": {"name": "write"}}]})
    hermes = ('Reading both.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "write", "arguments": {"path": "b.py", "text": "x = {1: 2}"}}\n</tool_call>')
    content, calls = parse_calls(hermes, spec)
    assert content == "Reading both." and [c.name for c in calls] == ["read_file", "write"]
    assert json.loads(calls[1].arguments) == {"path": "b.py", "text": "x = {1: 2}"}
    llama = '<|python_tag|>{"name": "read_file", "parameters": {"path": "c.py"}}'
    assert [(c.name, json.loads(c.arguments)) for c in parse_calls(llama, spec)[1]] == [("read_file", {"path": "c.py"})]
    for text in ("plain text", '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>', "<tool_call>{broken"):
        assert parse_calls(text, spec) == (text, [])
    stream = ToolStream(spec)  # a stream's fragments rebuild exactly what the whole answer parses
    content_sent, frags = "", []
    for k in range(1, len(hermes) + 1):
        piece, fr = stream.feed(hermes[:k])
        content_sent += piece
        frags += fr
    piece, fr, final = stream.finish(hermes)
    content_sent += piece
    frags += fr
    rebuilt = {}
    for f in frags:
        rebuilt.setdefault(f["index"], {"name": None, "arguments": ""})
        rebuilt[f["index"]]["name"] = f["function"].get("name") or rebuilt[f["index"]]["name"]
        rebuilt[f["index"]]["arguments"] += f["function"]["arguments"]
    assert [(v["name"], v["arguments"]) for _, v in sorted(rebuilt.items())] == [(c.name, c.arguments) for c in final]
    assert content_sent.strip() == "Reading both."


def test_forced_calls_cut_by_max_tokens_come_back_as_calls(served):
    """A forced call that `max_tokens` cuts is a call with `finish_reason` "length", its arguments as far as
    written (greedy: a prefix of the whole call's), whole and streamed, wherever the cut falls."""
    oai = client(served)
    tools = random_tools(np.random.default_rng(7), 2)
    named = tools[1]["function"]["name"]
    for choice in ({"type": "function", "function": {"name": named}}, "required"):
        kw = dict(model="tiny", messages=USER, tools=tools[1:] if choice == "required" else tools, tool_choice=choice,
                  temperature=0, parallel_tool_calls=False)
        full = oai.chat.completions.create(max_tokens=120, **kw)
        assert full.choices[0].finish_reason == "tool_calls"
        (whole,) = full.choices[0].message.tool_calls
        length = full.usage.completion_tokens
        for cut in sorted({1, 2, 4, length // 3, length // 2, length - 3, length - 1}):
            res = oai.chat.completions.create(max_tokens=cut, **kw)
            msg = res.choices[0].message
            assert res.choices[0].finish_reason == "length" and msg.content is None, (cut, msg)
            (call,) = msg.tool_calls
            assert call.id.startswith("call_") and call.function.name == named, (cut, call)
            assert whole.function.arguments.startswith(call.function.arguments), (cut, call, whole)
            calls, reason = streamed_calls(oai.chat.completions.create(max_tokens=cut, stream=True, **kw))
            assert reason == "length" and [(c["name"], c["arguments"]) for c in calls] == [
                (call.function.name, call.function.arguments)], (cut, calls)
        rkw = dict(model="tiny", input=USER[0]["content"], max_output_tokens=length // 2, temperature=0,
                   parallel_tool_calls=False, tools=[{"type": "function", **t["function"]} for t in kw["tools"]],
                   tool_choice={"type": "function", "name": named} if choice != "required" else choice)
        cut = oai.responses.create(**rkw)
        (item,) = cut.output
        assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
        assert item.type == "function_call" and item.name == named and item.status == "incomplete"
        events = list(oai.with_options(timeout=60).responses.create(stream=True, **rkw))  # (not the helper: it wants "completed")
        final = events[-1].response
        assert events[-1].type == "response.incomplete"
        (streamed,) = final.output
        assert final.status == "incomplete" and (streamed.type, streamed.name, streamed.arguments, streamed.status) == (
            "function_call", named, item.arguments, "incomplete")


def cut_reference(text: str, k: int, allowed: list[str]) -> list[tuple[str, str]]:
    """What a forced answer `text` (calls in the grammar's compact form) cut after `k` characters holds,
    call by call from the text's positions: a closed call whole; an open one when the name part written
    fits one allowed function, with its arguments as far as written."""
    out, head = [], '<tool_call>\n{"name":"'
    for start in [i for i in range(len(text)) if text.startswith("<tool_call>", i)]:
        if k <= start:
            break
        name_at = start + len(head)
        name = text[name_at: text.index('"', name_at)]
        args_at = name_at + len(name) + len('","arguments":')
        args_end = text.index("}\n</tool_call>", args_at)
        closed = k >= args_end + len("}\n</tool_call>")
        written = text[name_at: min(k, name_at + len(name))] if k > name_at else ""
        fits = [n for n in allowed if (n == written if k > name_at + len(name) else n.startswith(written))]
        if closed or len(fits) == 1:
            out.append((name, text[args_at: min(k, args_end)] if k > args_at else ""))
    return out


def test_cut_forced_calls_parse_and_stream_at_every_cut():
    """Every prefix of a forced answer (the grammar's form: one call, or two): the calls `cut_reference`
    says, never content; its stream's fragments rebuild the same calls."""
    from suffixspec.http.tools import ToolStream, parse_calls, parse_tools

    names = ["read_file", "read_dir", "write"]
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    one = '<tool_call>\n{"name":"read_file","arguments":{"path":"a \\"}.py","n":[1,{"k":2}]}}\n</tool_call>\n'
    two = one + '<tool_call>\n{"name":"write","arguments":{"text":"x"}}\n</tool_call>\n'
    for choice, text, allowed in (({"type": "function", "function": {"name": "read_file"}}, one, ["read_file"]),
                                  ("required", two, names)):
        spec = parse_tools({"tools": tools, "tool_choice": choice})
        for k in range(len(text) + 1):
            content, calls = parse_calls(text[:k], spec)
            assert content is None and [(c.name, c.arguments) for c in calls] == cut_reference(text, k, allowed), k
            stream, frags = ToolStream(spec), []
            for j in range(1, k + 1):
                piece, fr = stream.feed(text[:j])
                assert piece == ""
                frags += fr
            piece, fr, final = stream.finish(text[:k])
            assert piece == "" and [(c.name, c.arguments) for c in final] == cut_reference(text, k, allowed)
            rebuilt = {}
            for f in frags + fr:
                entry = rebuilt.setdefault(f["index"], {"name": None, "arguments": ""})
                entry["name"] = f["function"].get("name") or entry["name"]
                entry["arguments"] += f["function"]["arguments"]
            assert [(v["name"], v["arguments"]) for _, v in sorted(rebuilt.items())] == cut_reference(text, k, allowed)


# ----------------------------------------------------------------------------------- the Responses API


def test_responses_whole_and_streamed(served):
    oai = client(served)
    kw = dict(model="tiny", input="def g(x):\n    return x + 1\n", instructions="Be brief.", max_output_tokens=10,
              temperature=0)
    whole = oai.responses.create(**kw)
    assert whole.object == "response" and whole.status in ("completed", "incomplete")
    if whole.status == "incomplete":
        assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens <= 10 and whole.usage.total_tokens == whole.usage.input_tokens + \
        whole.usage.output_tokens
    kinds, texts = [], []
    with httpx.stream("POST", served.url + "/v1/responses", json=dict(kw, stream=True), timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                assert event["sequence_number"] == len(kinds)
                kinds.append(event["type"])
                texts += [event["delta"]] if event["type"] == "response.output_text.delta" else []
                last = event
    assert "".join(texts) == whole.output_text and last["response"]["status"] == whole.status
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == f"response.{whole.status}"
    assert kinds.index("response.output_item.added") < kinds.index("response.content_part.added") < kinds.index(
        "response.output_text.delta") < kinds.index("response.output_text.done") < kinds.index(
        "response.content_part.done") < kinds.index("response.output_item.done")
    history = oai.responses.create(model="tiny", max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "call_1", "name": "tool_0", "arguments": '{"a0": 1}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "2"}],
        tools=[{"type": "function", "name": "tool_0", "parameters": {"type": "object"}}])
    assert history.status in ("completed", "incomplete")


def test_responses_json_and_forced_calls(served):
    oai = client(served)
    schema = {"type": "object", "properties": {"k": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["k"], "additionalProperties": False}
    fmt = dict(model="tiny", input="a number", max_output_tokens=40, temperature=0,
               text={"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": True}})
    r = oai.responses.create(**fmt)
    assert r.status == "completed" and json.loads(r.output_text)["k"] in range(10)
    with oai.responses.stream(**fmt) as stream:  # the official client's helper accepts our events
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(deltas) == r.output_text
    tool = random_tools(np.random.default_rng(5), 1)[0]["function"]
    kw = dict(model="tiny", input="call it", max_output_tokens=120, temperature=0, parallel_tool_calls=False,
              tools=[{"type": "function", **tool}], tool_choice="required")
    r = oai.responses.create(**kw)
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.name == tool["name"]
    jsonschema.validate(json.loads(call.arguments), tool["parameters"])
    with oai.responses.stream(**kw) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    (streamed,) = [item for item in final.output if item.type == "function_call"]
    assert (streamed.name, streamed.arguments) == (call.name, call.arguments)


def test_responses_bad_values_name_the_parameter(served):
    base = {"model": "tiny", "input": "x"}
    for extra, param in (({"previous_response_id": "resp_1"}, "previous_response_id"), ({"store": True}, "store"),
                         ({"background": True}, "background"), ({"reasoning": {"effort": "low"}}, "reasoning"),
                         ({"tools": [{"type": "function", "name": "a"}], "tool_choice": {"type": "function",
                                                                                      "name": "b"}}, "tool_choice")):
        r = httpx.post(served.url + "/v1/responses", json={**base, **extra}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)


def test_agent_workload_renders_its_turns():
    """`suffixspec bench --workload agent`: each prompt is the conversation its messages render, ending
    with the tool result (the function) and an open assistant turn."""
    from suffixspec.bench.workloads import load_workload
    from suffixspec.http.chat import ChatTemplate, chatml_template

    workload = load_workload("agent")
    assert len(workload.requests) >= 10
    for req in workload.requests:
        assert req.prompt == ChatTemplate(chatml_template()).render(req.messages)
        assert req.messages[-1]["role"] == "tool" and "def " in req.messages[-1]["content"]
        assert '"name":"read_file"' in req.messages[2]["content"]


HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools><|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }} {{ c.function.arguments | tojson }}</tool_call>"
    "{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_templates_that_take_tools_get_them_and_the_history():
    """A template rendering `tools` (Hermes style) gets the tools and the calls as sent; one that does
    not gets the generic tools prompt and the calls written out."""
    from types import SimpleNamespace

    from suffixspec.http.chat import ChatTemplate, chatml_template
    from suffixspec.http.conversation import chat_prompt
    from suffixspec.http.tools import parse_tools

    class Chars:  # a tokenizer whose ids are characters: the prompt text is visible in the ids
        def encode(self, text):
            return [ord(c) for c in text]

    body = {"messages": USER + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "tool_0", "arguments": '{"a0": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}],
        "tools": [{"type": "function", "function": {"name": "tool_0"}}]}
    spec = parse_tools(body)
    for source, expect in ((HERMES_TEMPLATE, '<tools>tool_0;</tools>'), (chatml_template(), "<tools>\n{")):
        ctx = SimpleNamespace(chat=ChatTemplate(source), tokenizer=Chars(), max_positions=None)
        text = "".join(chr(i) for i in chat_prompt(body, ctx, spec))
        assert expect in text and "42" in text and text.endswith("<|im_start|>assistant\n")
        assert '"a0"' in text and "tool_0" in text
