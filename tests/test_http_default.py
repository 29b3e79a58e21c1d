"""`suffixspec serve` on the embedded default model (SmolLM2-135M-Instruct), one server process for the
module: greedy output through HTTP equals `SpeculativeGenerator.generate` and plain greedy decoding
(transformers' `generate`) in this process; predicted outputs (a right prediction is accepted in
nearly whole rounds, a wrong one changes nothing); the model's own chat template; no FIM tokens: 400."""

import json

import httpx
import openai
import pytest
import torch

from support.http import ServerProcess

MAX_NEW = 48


@pytest.fixture(scope="module")
def default(tmp_path_factory):
    from suffixspec import SpeculativeGenerator, load_model

    from support import tiny_models  # noqa: F401  (one torch thread, as the server)

    root = tmp_path_factory.mktemp("http_default")
    server = ServerProcess([], root / "server.log", wait=False)
    try:
        model, tokenizer = load_model()
        gen = SpeculativeGenerator(model, tokenizer)
        server.wait_ready()
        yield server, gen, model, tokenizer
    finally:
        code = server.stop()
    assert code == 0, server.log()


def edit_prompt() -> str:
    from pathlib import Path

    rows = [json.loads(line) for line in (Path(__file__).resolve().parent.parent / "corpora" /
                                          "copy_edit_prompts.jsonl").read_text().splitlines()]
    return min(rows, key=lambda r: len(r["prompt"]))["prompt"]


def chat_ids(tokenizer, messages):
    from suffixspec.http.chat import ChatTemplate, find_chat_template

    source, _ = find_chat_template(None)
    return tokenizer.encode(ChatTemplate(source, tokenizer).render(messages))


def without_eos(tokenizer, out):
    return out[:-1] if out and out[-1] == tokenizer.eos_token_id else out


def test_greedy_http_equals_generate_and_plain_greedy(default):
    server, gen, model, tokenizer = default
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": edit_prompt()}]
    r = c.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=MAX_NEW, temperature=0)
    ids = chat_ids(tokenizer, messages)
    assert r.usage.prompt_tokens == len(ids)  # the model's template (its system line included)
    spec = gen.generate([ids], max_new_tokens=MAX_NEW).sequences[0]
    with torch.inference_mode():
        plain = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                               max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
    assert spec == plain
    assert r.choices[0].message.content == tokenizer.decode(without_eos(tokenizer, spec))
    assert r.usage.completion_tokens == len(spec)
    assert r.choices[0].finish_reason == ("stop" if spec[-1] == tokenizer.eos_token_id else "length")

    # completions take raw text, encoded as generate([text]) encodes it
    text = "def fibonacci(n):\n    "
    r = c.completions.create(model="SmolLM2-135M-Instruct", prompt=text, max_tokens=32, temperature=0)
    out = gen.generate([text], max_new_tokens=32).sequences[0]
    assert r.choices[0].text == tokenizer.decode(without_eos(tokenizer, out))


def test_predicted_outputs(default):
    server, gen, model, tokenizer = default
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": edit_prompt()}]
    kw = dict(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=MAX_NEW, temperature=0)
    base = c.chat.completions.create(**kw)
    answer = base.choices[0].message.content
    right = c.chat.completions.create(**kw, extra_body={"prediction": {"type": "content", "content": answer}})
    assert right.choices[0].message.content == answer
    details = right.usage.completion_tokens_details
    n = right.usage.completion_tokens
    extra = right.usage.model_extra["suffixspec"]
    assert details.accepted_prediction_tokens >= 0.8 * (n - extra["rounds"])  # nearly all drafts came from it
    assert extra["rounds"] <= max(3, n // 6)  # accepted in (almost) whole rounds
    assert base.usage.completion_tokens_details.accepted_prediction_tokens == 0

    wrong = c.chat.completions.create(**kw, extra_body={"prediction": {
        "type": "content", "content": "SELECT name, price FROM items WHERE price > 10 ORDER BY price DESC;\n" * 3}})
    assert wrong.choices[0].message.content == answer
    assert wrong.usage.completion_tokens_details.rejected_prediction_tokens > 0


def test_no_fim_tokens_answers_400_naming_them(default):
    server = default[0]
    r = httpx.post(server.url + "/v1/completions", json={"model": "SmolLM2-135M-Instruct", "prompt": "def f(",
                                                          "suffix": "):\n    pass\n", "max_tokens": 8})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "suffix" and "<|fim_prefix|>" in err["message"] and "<fim_prefix>" in err["message"]


def test_kernels_are_ready_before_the_first_request(default):
    """The server warms every kernel a round can reach (`warm_kernels`) before it answers ready."""
    server = default[0]
    log = server.log()
    assert "kernels ready in" in log
    assert log.index("kernels ready in") < log.index("ready: serving")


def test_logprobs_penalties_and_json_on_the_default_model(default):
    """On the real model: chat logprobs through speculation equal plain decoding's (within 1e-4) and a
    forward pass's; penalties keep greedy output identical to plain; a code edit asked for as
    `{"code": ...}` under a JSON schema parses."""
    import numpy as np

    server, gen, model, tokenizer = default
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": edit_prompt()}]
    kw = dict(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=MAX_NEW, logprobs=True, top_logprobs=2)
    for sampling in ({"temperature": 0}, {"temperature": 0.8, "seed": 3}):
        spec = c.chat.completions.create(**kw, **sampling, extra_body={"frequency_penalty": 0.5})
        plain = c.chat.completions.create(**kw, **sampling, extra_body={"frequency_penalty": 0.5,
                                                                        "suffixspec": {"budget": 0}})
        assert spec.choices[0].message.content == plain.choices[0].message.content
        a = [t.logprob for t in spec.choices[0].logprobs.content]
        b = [t.logprob for t in plain.choices[0].logprobs.content]
        assert len(a) == len(b) and np.max(np.abs(np.array(a) - np.array(b))) < 1e-4
    assert spec.usage.model_extra["suffixspec"]["accepted"] > 0  # it did speculate
    schema = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"],
              "additionalProperties": False}
    ask = [{"role": "user", "content": edit_prompt() + '\n\nAnswer with a JSON object {"code": "..."}.'}]
    r = c.chat.completions.create(model="SmolLM2-135M-Instruct", messages=ask, max_tokens=400, temperature=0,
                                  response_format={"type": "json_schema",
                                                   "json_schema": {"name": "edit", "schema": schema, "strict": True}})
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content)["code"], str)  # (a 135M model's edit: any text)
