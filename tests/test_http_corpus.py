"""Corpora once served (a real `suffixspec serve` on the tiny model, with a corpus index built by
`suffixspec index` with the model's tokenizer): the start-up log lists each corpus, `/metrics` has its
documents and tokens, `usage.suffixspec.corpus_documents` says how many documents a request's filter
selected (0 included), and a missing or damaged corpus stops the start-up with a line naming it."""

import subprocess
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.http import ROOT, ServerProcess, make_tiny_model_dir


def cli(*args):
    return subprocess.run([sys.executable, "-m", "suffixspec.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("http_corpus")
    model_dir = make_tiny_model_dir(root / "tiny")
    docs = root / "docs"
    docs.mkdir()
    for i in range(5):
        (docs / f"d{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * 20)
    index = root / "code.idx"
    done = cli("index", str(docs), "-o", str(index), "--tokenizer", str(model_dir), "--tag", "repo=a")
    assert done.returncode == 0, done.stderr
    server = ServerProcess(["--model", str(model_dir), "--corpus", str(index)], root / "server.log")
    try:
        yield server, model_dir, index, root
    finally:
        assert server.stop() == 0, server.log()


def ask(server, flt=None):
    body = {"model": "tiny", "prompt": "def f1(x):\n", "max_tokens": 4, "temperature": 0}
    if flt is not None:
        body["suffixspec"] = {"filter": flt}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["suffixspec"]["corpus_documents"]


def test_the_corpus_is_listed_counted_and_filtered(setup):
    server, _, index, _ = setup
    line = next(line for line in server.log().splitlines() if f"corpus {index}:" in line)
    assert "5 documents (0 deleted)" in line and "tokens, tokenizer" in line, line
    metrics = {(s.name, s.labels.get("corpus")): s.value for f in text_string_to_metric_families(
        httpx.get(server.url + "/metrics").text) for s in f.samples}
    assert metrics[("suffixspec_corpus_documents", str(index))] == 5
    assert metrics[("suffixspec_corpus_tokens", str(index))] > 0
    assert ask(server) == 5
    assert ask(server, {"repo": "a"}) == 5
    assert ask(server, {"repo": "nowhere"}) == 0  # legal, and visible


def test_a_missing_or_damaged_corpus_is_named(setup):
    _, model_dir, index, root = setup
    damaged = root / "damaged.idx"
    damaged.mkdir()
    (damaged / "manifest.json").write_text("{not json")
    for bad in (root / "missing.idx", damaged):
        server = ServerProcess(["--model", str(model_dir), "--corpus", str(bad)], root / "bad.log", wait=False)
        code = server.proc.wait(300)
        server.stop()
        last = server.log().strip().splitlines()[-1]
        assert code == 2 and last.startswith(f"suffixspec serve: error: --corpus {bad}:"), server.log()
        assert "model failed" not in server.log()


def test_metrics_count_the_corpus_drafts(setup):
    """Draft tokens by source: a prompt copied from the corpus gets corpus drafts, counted in /metrics."""
    server = setup[0]
    for _ in range(3):
        r = httpx.post(server.url + "/v1/completions", timeout=60, json={
            "model": "tiny", "prompt": "def f3(x):\n    return x * 3\n" * 3, "max_tokens": 16, "temperature": 0})
        assert r.status_code == 200, r.text
    samples = {(s.name, s.labels.get("source")): s.value for f in text_string_to_metric_families(
        httpx.get(server.url + "/metrics").text) for s in f.samples}
    drafted = samples[("suffixspec_drafted_tokens_by_source_total", "corpus")]
    accepted = samples[("suffixspec_accepted_tokens_by_source_total", "corpus")]
    assert drafted > 0 and 0 <= accepted <= drafted, samples
    assert samples[("suffixspec_drafted_tokens_by_source_total", "other")] >= 0
