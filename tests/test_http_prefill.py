"""Long prompts through a real `suffixspec serve` process (a tiny model, `--max-step-tokens 16`):
streams keep receiving tokens while a long prompt is read in chunks, the long request's answer is
plain decoding's, `/metrics` counts the chunks, and a prompt that cannot fit is refused before it
is tokenized."""

import threading

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.http import ServerProcess, make_tiny_model_dir
from support.tiny_models import hf_generate

STEP = 16


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from suffixspec import load_model

    from support import tiny_models  # noqa: F401  (one torch thread, as the server)

    root = tmp_path_factory.mktemp("http_prefill")
    model_dir = make_tiny_model_dir(root / "tiny")
    server = ServerProcess(["--model", str(model_dir), "--max-batch", "4", "--max-step-tokens", str(STEP),
                            "--threads", "1"], root / "server.log")
    try:
        model, tokenizer = load_model(str(model_dir))
        yield server, model, tokenizer
    finally:
        code = server.stop()
    assert code == 0, server.log()


def metric(url, name):
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"no metric {name}")


def test_streams_go_on_while_a_long_prompt_is_read(served):
    server, model, tokenizer = served
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    long_ids = [int(t) for t in (tokenizer.encode("def f(x):\n    return x + 1\n" * 40)[:400])]
    chunks_before = metric(server.url, "suffixspec_prefill_chunks_total")
    arrivals = {0: [], 1: []}  # per stream: for each chunk, was the long request done yet?
    long_done = threading.Event()
    started = threading.Barrier(3)
    answer = {}

    def stream(i):
        got = client.completions.create(model="tiny", prompt=f"class C{i}:\n", max_tokens=120, stream=True,
                                        temperature=0)
        for n, chunk in enumerate(got):
            if n == 3:
                started.wait(timeout=60)
            arrivals[i].append(long_done.is_set())

    def long_request():
        started.wait(timeout=60)
        answer["r"] = client.completions.create(model="tiny", prompt=long_ids, max_tokens=8, temperature=0)
        long_done.set()

    threads = [threading.Thread(target=stream, args=(i,)) for i in (0, 1)] + [threading.Thread(target=long_request)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    # the long prompt was read in chunks, and both streams received a token for about every other
    # chunk after the long request was sent and before its answer came (read whole, they would wait)
    chunks = metric(server.url, "suffixspec_prefill_chunks_total") - chunks_before
    assert chunks >= 400 // STEP - 2
    for i in (0, 1):
        assert arrivals[i].count(False) - 3 >= chunks // 2, (chunks, arrivals[i])
    want = hf_generate(model, long_ids, 8)
    assert answer["r"].choices[0].text == tokenizer.decode(want)


def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing(served):
    server, _, tokenizer = served
    longest = max(len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size)
                  if _has_bytes(tokenizer, i))
    text = "x" * (512 * longest + 10)
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": text, "max_tokens": 1}, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert "characters make at least" in err["message"]
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                   json={"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    # a prompt under the bound is tokenized and refused by its real count, as before
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "x" * 2000, "max_tokens": 1},
                   timeout=30)
    assert r.status_code == 400 and "characters make" not in r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "context_length_exceeded"


def _has_bytes(tokenizer, i):
    try:
        tokenizer.token_bytes(i)
        return True
    except ValueError:
        return False
