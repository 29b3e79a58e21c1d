"""The prefix cache through real `suffixspec serve` processes and the official `openai` client: a
four-turn conversation reports `cached_tokens` and answers as a server without the cache does,
streamed usage too; a small bound evicts and still answers right; concurrent requests sharing a
prefix; `/metrics` counts hits, misses, evictions and bytes; bad flags are refused by name."""

import subprocess
import sys
import threading

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.http import ServerProcess, make_tiny_model_dir

FILE = "".join(f"def value_{i}(count, index=None):\n    return count * {i} + index\n\n" for i in range(12))
QUESTIONS = ["What does value_3 return?", "And value_7?", "Rename count to total.", "Now add a docstring."]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("http_prefix")
    model_dir = make_tiny_model_dir(root / "tiny", positions=2048)
    common = ["--model", str(model_dir), "--max-batch", "4", "--threads", "1"]
    started = {}
    try:
        started["cached"] = ServerProcess(common + ["--prefix-cache-bytes", "64Mi"], root / "cached.log")
        started["plain"] = ServerProcess(common + ["--no-prefix-cache"], root / "plain.log")
        started["small"] = ServerProcess(common + ["--prefix-cache-bytes", "200k", "--budget", "0"],
                                         root / "small.log")
        yield started
    finally:
        codes = {name: s.stop() for name, s in started.items()}
    assert all(code == 0 for code in codes.values()), {n: s.log() for n, s in started.items()}


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def metric(url, name):
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"no metric {name}")


def converse(server, stream: bool):
    """Four turns over one file; returns each turn's (answer, prompt tokens, cached tokens)."""
    c = client(server)
    messages = [{"role": "system", "content": "You edit code.\n" + FILE}]
    turns = []
    for q in QUESTIONS:
        messages.append({"role": "user", "content": q})
        if stream:
            chunks = list(c.chat.completions.create(model="tiny", messages=messages, max_tokens=24, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}))
            text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            usage = chunks[-1].usage
        else:
            r = c.chat.completions.create(model="tiny", messages=messages, max_tokens=24, temperature=0)
            text, usage = r.choices[0].message.content, r.usage
        turns.append((text, usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens))
        messages.append({"role": "assistant", "content": text})
    return turns


@pytest.mark.parametrize("stream", [False, True])
def test_a_conversation_reuses_each_turn_and_answers_as_without_the_cache(servers, stream):
    hits = metric(servers["cached"].url, "suffixspec_prefix_cache_hit_tokens_total")
    cached = converse(servers["cached"], stream)
    plain = converse(servers["plain"], stream)
    assert [t[0] for t in cached] == [t[0] for t in plain]
    assert [t[1] for t in cached] == [t[1] for t in plain]
    assert all(t[2] == 0 for t in plain)
    for previous, turn in zip(cached, cached[1:]):
        assert turn[2] >= 0.8 * previous[1], (previous, turn)  # the previous turn's prompt, at least 80% of it
        assert turn[2] < turn[1]
    assert metric(servers["cached"].url, "suffixspec_prefix_cache_hit_tokens_total") - hits >= sum(t[2] for t in cached)
    assert metric(servers["cached"].url, "suffixspec_prefix_cache_bytes") > 0


def test_the_responses_api_reports_cached_input_tokens(servers):
    c = client(servers["cached"])
    text = "Summarise this file.\n" + FILE
    first = c.responses.create(model="tiny", input=text, max_output_tokens=8, temperature=0)
    again = c.responses.create(model="tiny", input=text + "\nBriefly.", max_output_tokens=8, temperature=0)
    assert again.usage.input_tokens_details.cached_tokens >= 0.8 * first.usage.input_tokens


def test_a_small_bound_evicts_and_answers_stay_right(servers):
    small, plain = client(servers["small"]), client(servers["plain"])
    prompts = [f"# file {i}\n" + FILE.replace("count", f"c{i}") for i in range(6)]
    for p in prompts + prompts[:2]:
        got = small.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0)
        want = plain.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0)
        assert got.choices[0].text == want.choices[0].text
    url = servers["small"].url
    assert metric(url, "suffixspec_prefix_cache_evictions_total") > 0
    assert metric(url, "suffixspec_prefix_cache_bytes") <= metric(url, "suffixspec_prefix_cache_max_bytes") == 200_000


def test_concurrent_requests_sharing_a_prefix(servers):
    """Four completions over one file arriving together (different endings): each answers as the
    server without a cache does; the shared file is read once, so the hits cover three of them."""
    prompts = [FILE + f"def tail_{i}(x):\n" for i in range(4)]
    want = [client(servers["plain"]).completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0)
            .choices[0].text for p in prompts]
    url = servers["cached"].url
    hits = metric(url, "suffixspec_prefix_cache_hit_tokens_total")
    got, cached = [None] * 4, [None] * 4
    barrier = threading.Barrier(4)

    def one(i):
        barrier.wait(timeout=30)
        r = client(servers["cached"]).completions.create(model="tiny", prompt=prompts[i], max_tokens=12,
                                                         temperature=0)
        got[i], cached[i] = r.choices[0].text, r.usage.prompt_tokens_details.cached_tokens

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == want
    assert metric(url, "suffixspec_prefix_cache_hit_tokens_total") - hits == sum(cached)
    assert sum(1 for c in cached if c > 0) >= 3


def test_bad_prefix_cache_flags_are_refused_by_name(tmp_path):
    for args, needle in [(["--prefix-cache-bytes", "lots"], "--prefix-cache-bytes"),
                         (["--prefix-cache-bytes", "1G", "--no-prefix-cache"], "--no-prefix-cache")]:
        out = subprocess.run([sys.executable, "-m", "suffixspec.cli", "serve", "--port", "0", *args],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out
        assert needle in out.stderr and out.stderr.count("\n") <= 2, out.stderr
