"""`suffixspec bench`: arrival processes, statistics on a fake generator with known costs, report files, CLI."""

import json
import math

import numpy as np
import pytest

from suffixspec import bench
from suffixspec.bench import BenchSettings, Request, Workload
from suffixspec.errors import BadInputError
from suffixspec.generate import GenerationResult, GenerationStats, RequestStats

# ------------------------------------------------------------------------------------------ arrivals


def test_poisson_arrivals_statistics_and_seed():
    a = bench.poisson_arrivals(20000, rate=4.0, seed=7)
    gaps = np.diff(np.concatenate([[0.0], a]))
    assert np.all(gaps > 0)
    assert abs(gaps.mean() - 0.25) < 0.01  # mean 1/rate
    assert abs(gaps.std() - 0.25) < 0.01  # exponential: std == mean
    assert abs(np.mean(gaps > 0.25) - math.exp(-1)) < 0.01  # P(gap > 1/rate) = e^-1
    assert np.array_equal(a, bench.poisson_arrivals(20000, rate=4.0, seed=7))
    assert not np.array_equal(a, bench.poisson_arrivals(20000, rate=4.0, seed=8))
    counts = np.histogram(a, bins=np.arange(0, 4000, 1.0))[0]  # Poisson counts per second: mean == var == 4
    assert abs(counts.mean() - 4) < 0.1 and abs(counts.var() - 4) < 0.3
    with pytest.raises(BadInputError):
        bench.poisson_arrivals(3, rate=0)


def test_closed_loop_waves():
    assert bench.closed_loop(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert bench.closed_loop(2, 4) == [[0, 1]]
    assert bench.closed_loop(3, 1) == [[0], [1], [2]]
    with pytest.raises(BadInputError):
        bench.closed_loop(3, 0)


def fixed_batches(duration, times):
    """run_batch with a fixed batch duration and per-slot (ttft, e2e)."""
    calls = []

    def run_batch(indices):
        calls.append(list(indices))
        return duration, [times[i % len(times)] for i in range(len(indices))]

    return run_batch, calls


def test_closed_loop_schedule_counts_waiting_for_the_wave():
    run_batch, calls = fixed_batches(10.0, [(1.0, 4.0), (1.0, 10.0)])
    served, makespan = bench.simulate_schedule(4, 2, run_batch)
    assert calls == [[0, 1], [2, 3]]
    assert makespan == 20.0
    s = {x.index: x for x in served}
    assert (s[0].arrival, s[0].ttft, s[0].e2e) == (0.0, 1.0, 4.0)
    assert (s[1].arrival, s[1].ttft, s[1].e2e) == (0.0, 1.0, 10.0)
    # client 0 finished at 4 s but its next request only starts with the wave at 10 s
    assert (s[2].arrival, s[2].start, s[2].ttft, s[2].e2e) == (4.0, 10.0, 7.0, 10.0)
    assert (s[3].arrival, s[3].start, s[3].ttft, s[3].e2e) == (10.0, 10.0, 1.0, 10.0)


def test_poisson_schedule_fifo_batches_and_queueing():
    run_batch, calls = fixed_batches(5.0, [(1.0, 5.0)])
    served, makespan = bench.simulate_schedule(4, 2, run_batch, arrivals=[0.0, 1.0, 2.0, 20.0])
    # t=0: only request 0 has arrived; at 5 requests 1 and 2 wait and go together; 3 arrives at 20
    assert calls == [[0], [1, 2], [3]]
    s = {x.index: x for x in served}
    assert (s[0].start, s[0].ttft, s[0].e2e) == (0.0, 1.0, 5.0)
    assert (s[1].start, s[1].ttft, s[1].e2e) == (5.0, 5.0, 9.0)
    assert (s[2].start, s[2].ttft, s[2].e2e) == (5.0, 4.0, 8.0)
    assert (s[3].start, s[3].ttft, s[3].e2e) == (20.0, 1.0, 5.0)
    assert makespan == 25.0


# ------------------------------------------------------------------------------------------ fake generator


class FakeGenerator:
    """A generator with known costs: every round of a batch of B costs `base + per_row * B` seconds;
    plain decoding commits 1 token per round, speculative `k` (k - 1 accepted drafts from `k - 1`
    drafted); every output is `[7] * max_new_tokens` (or `[8]...` when `diverge`)."""

    def __init__(self, base=0.010, per_row=0.002, k=3, diverge=False):
        self.base, self.per_row, self.k, self.diverge = base, per_row, k, diverge
        self.calls = []

    def generate(self, prompts, *, max_new_tokens, do_sample, temperature, top_k, top_p, seed, budget,
                 request_offset=0, logits_processor=None):
        self.calls.append((len(prompts), max_new_tokens, budget, seed))
        per_round = 1 if budget == 0 else self.k
        cost = self.base + self.per_row * len(prompts)
        rounds = math.ceil(max_new_tokens / per_round)
        reqs = []
        for p in prompts:
            rs = RequestStats(prompt_tokens=len(p), new_tokens=max_new_tokens, rounds=rounds,
                              drafted=0 if budget == 0 else rounds * (per_round - 1),
                              accepted=0 if budget == 0 else rounds * (per_round - 1),
                              accepted_by_position=[] if budget == 0 else [rounds] * (per_round - 1),
                              ttft_s=cost, e2e_s=rounds * cost, finish_reason="length")
            reqs.append(rs)
        stats = GenerationStats(requests=reqs, rounds=rounds, proposer_s=0.001 * rounds * (budget != 0),
                                verifier_s=rounds * cost, e2e_s=rounds * cost, peak_memory_bytes=2**20)
        token = 8 if (self.diverge and budget != 0) else 7
        return GenerationResult([[token] * max_new_tokens for _ in prompts], stats)


def fake_workload(n):
    return Workload("fake", [Request(f"r{i}", prompt_ids=[1, 2, 3]) for i in range(n)], "test")


def run_fake(settings, n=4, fake=None, **kw):
    fake = fake or FakeGenerator(**kw)
    runs = bench.run_benchmark(fake_workload(n), [[1, 2, 3]] * n, {"plain": fake, "speculative": fake},
                               settings, progress=False)
    return bench.summarize(runs, settings), runs, fake


def test_statistics_on_fake_generator_are_exact():
    settings = BenchSettings(concurrency=[1, 2], max_new_tokens=12, budget=8, repeat=2)
    records, runs, fake = run_fake(settings, n=4)
    assert len(runs) == 2 * 2 * 2  # repeats x concurrency x modes
    by = {(r["mode"], r["concurrency"]): r for r in records}
    assert set(by) == {("plain", 1), ("speculative", 1), ("plain", 2), ("speculative", 2)}

    # plain, c=1: a round costs 12 ms, 12 rounds; requests one after another, no waiting (closed loop)
    p1 = by[("plain", 1)]
    assert p1["ttft_ms"] == pytest.approx(12.0)
    assert p1["tpot_ms"] == pytest.approx((12 * 12 - 12) / 11)  # (e2e - ttft) / (n - 1) = 12 ms
    assert p1["e2e_ms_p50"] == pytest.approx(144.0) and p1["e2e_ms_p99"] == pytest.approx(144.0)
    assert p1["throughput_tok_s"] == pytest.approx(4 * 12 / (4 * 0.144))
    assert p1["mean_accepted_tokens"] == pytest.approx(1.0)
    assert p1["acceptance_rate"] == 0.0 and p1["mismatches"] == 0 and "speedup" not in p1

    # speculative, c=1: 3 tokens a round -> 4 rounds of 12 ms
    s1 = by[("speculative", 1)]
    assert s1["e2e_ms_p50"] == pytest.approx(48.0)
    assert s1["tpot_ms"] == pytest.approx((48 - 12) / 11)
    assert s1["mean_accepted_tokens"] == pytest.approx(3.0)
    assert s1["acceptance_rate"] == pytest.approx(1.0)
    assert s1["accepted_by_position"] == pytest.approx([1.0, 1.0])
    assert s1["speedup"] == pytest.approx(3.0) and s1["speedup_min"] == s1["speedup_max"] == pytest.approx(3.0)
    assert s1["speedup_runs"] == pytest.approx([3.0, 3.0]) and s1["speedup_std"] == pytest.approx(0.0)
    assert s1["verdict"] == "pays" and s1["mismatches"] == 0 and s1["failures"] == 0
    assert s1["proposer_s"] == pytest.approx(4 * 0.004)  # 4 requests x 4 rounds x 1 ms, mean over repeats

    # plain, c=2: a round of 2 rows costs 14 ms; wave 2 starts at 168 ms and nobody waits
    p2 = by[("plain", 2)]
    assert p2["ttft_ms"] == pytest.approx(14.0) and p2["e2e_ms_p50"] == pytest.approx(168.0)
    assert p2["throughput_tok_s"] == pytest.approx(48 / 0.336)
    s2 = by[("speculative", 2)]
    assert s2["speedup"] == pytest.approx(3.0)
    assert fake.calls[0][3] == 0 and any(c[3] == 1 for c in fake.calls)  # seed + repeat
    assert {c[0] for c in fake.calls} == {1, 2}


def test_mismatches_count_as_failures_under_greedy_only():
    greedy = BenchSettings(concurrency=[2], max_new_tokens=4, budget=4)
    records, _, _ = run_fake(greedy, n=3, diverge=True)
    spec = next(r for r in records if r["mode"] == "speculative")
    assert spec["mismatches"] == 3 and spec["failures"] == 3
    assert spec["mismatched_requests"][0]["first_difference"] == 0
    sampled = BenchSettings(concurrency=[2], max_new_tokens=4, budget=4, temperature=0.7)
    records, _, _ = run_fake(sampled, n=3, diverge=True)
    assert next(r for r in records if r["mode"] == "speculative")["mismatches"] == 0


def test_slow_speculation_is_reported_as_slower():
    class Slow(FakeGenerator):
        def generate(self, prompts, **kw):
            result = super().generate(prompts, **kw)
            if kw["budget"] != 0:  # every round 5x dearer, 3 tokens a round: 0.6x plain
                for rs in result.stats.requests:
                    rs.ttft_s *= 5
                    rs.e2e_s *= 5
                result.stats.e2e_s *= 5
            return result

    settings = BenchSettings(concurrency=[1], max_new_tokens=12, budget=4)
    records, _, _ = run_fake(settings, n=2, fake=Slow())
    spec = next(r for r in records if r["mode"] == "speculative")
    assert spec["speedup"] == pytest.approx(0.6) and spec["verdict"] == "slower"


def test_poisson_run_accounts_queueing():
    settings = BenchSettings(concurrency=[4], qps=1000.0, max_new_tokens=12, budget=4, seed=3)
    records, runs, _ = run_fake(settings, n=4)
    arrivals = bench.poisson_arrivals(4, 1000.0, seed=3)
    plain = next(r for r in runs if r.mode == "plain")
    # all four arrive within a few ms; the first is served alone, the rest wait for it
    assert plain.requests[0]["queue_s"] == 0.0
    assert all(q["queue_s"] > 0 for q in plain.requests[1:])
    for q, a in zip(plain.requests, arrivals):
        assert q["arrival_s"] == pytest.approx(a)
        assert q["ttft_s"] == pytest.approx(q["queue_s"] + (q["start_s"] - q["start_s"]) + 0.01 + 0.002 * q["batch_size"])


def test_failed_batch_is_a_failure_not_a_crash():
    class Broken(FakeGenerator):
        def generate(self, prompts, **kw):
            if kw["budget"] != 0:
                raise RuntimeError("boom")
            return super().generate(prompts, **kw)

    records, _, _ = run_fake(BenchSettings(concurrency=[1], max_new_tokens=4, budget=4), n=2, fake=Broken())
    spec = next(r for r in records if r["mode"] == "speculative")
    assert spec["failures"] >= 2 and "boom" in spec["errors"][0]


# ------------------------------------------------------------------------------------------ quality, constraint


def test_wilson_interval():
    lo, hi = bench.wilson_interval(5, 10)
    assert lo < 0.5 < hi and lo == pytest.approx(1 - hi)
    assert bench.wilson_interval(0, 0) == (0.0, 1.0)
    assert bench.wilson_interval(0, 20)[0] == 0.0


def test_quality_gate_numeric_and_humaneval():
    check_num = {"kind": "numeric", "answer": 14}
    check_he = {"kind": "humaneval", "prompt": "def add(a, b):\n", "test": "def check(f):\n    assert f(2, 3) == 5\n",
                "entry_point": "add"}
    assert bench._numeric_correct(check_num, "7 + 7 = 14\nThe answer is 14.")
    assert not bench._numeric_correct(check_num, "It is 13")
    assert bench._humaneval_passes(check_he, "    return a + b\n\ndef unrelated():\n    raise SystemExit(1)\n")
    assert not bench._humaneval_passes(check_he, "    return a - b\n")
    assert not bench._humaneval_passes(check_he, "    while True: pass\n", timeout=1.0)

    wl = Workload("w", [Request("a", prompt_ids=[1], check=check_num), Request("b", prompt_ids=[1], check=check_num)], "t")
    runs = [bench.Run("plain", 1, 0, [{"finish_reason": "length"}] * 2, 1.0, outputs=[[1], [2]]),
            bench.Run("speculative", 1, 0, [{"finish_reason": "length"}] * 2, 1.0, outputs=[[1], [1]])]
    q = bench.quality_gate(wl, runs, lambda ids: {1: "so 14", 2: "so 3"}[ids[0]])
    assert q["plain"]["correct"] == 1 and q["speculative"]["correct"] == 2
    assert q["difference"] == pytest.approx(0.5) and q["within_noise"]  # two samples: all noise


def test_charset_constraint():
    torch = pytest.importorskip("torch")

    class Tok:
        vocab_size = 5
        table = [b"12", b"ab", b" ", b"[1,", b"x"]

        def token_bytes(self, t):
            return self.table[t]

    c = bench.CharsetConstraint(Tok(), 6, eos_token_id=5)
    assert c.allowed.tolist() == [True, False, True, True, False, True]
    out = c(None, torch.zeros(1, 6))
    assert torch.isinf(out[0, 1]) and out[0, 0] == 0
    assert c.valid([0, 2, 5]) and not c.valid([0, 1])


def test_named_workloads_load():
    for name in ("code_edit", "chat", "math", "summarization", "long_context", "math_reasoning", "code_completion"):
        wl = bench.load_workload(name, limit=3)
        assert len(wl.requests) == 3 and all(r.prompt for r in wl.requests), name
    assert bench.load_workload("math").checkable
    assert bench.load_workload("chat", 1).requests[0].prompt.startswith("<|im_start|>system")
    with pytest.raises(BadInputError):
        bench.load_workload("no-such-workload")


def test_workload_file(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps({"id": "x", "prompt": "hello", "max_new_tokens": 5}) + "\n"
                    + json.dumps({"prompt_ids": [1, 2], "answer": 3}) + "\n"
                    + json.dumps({"turns": ["hi"]}) + "\n")
    wl = bench.load_workload(str(path))
    assert [r.id for r in wl.requests] == ["x", "1", "2"]
    assert wl.requests[0].prompt == "hello" and wl.requests[0].max_new_tokens == 5
    assert wl.requests[1].prompt_ids == [1, 2] and wl.requests[1].check == {"kind": "numeric", "answer": 3}
    assert "<|im_start|>user\nhi" in wl.requests[2].prompt
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n")
    with pytest.raises(BadInputError):
        bench.load_workload(str(bad))


# ------------------------------------------------------------------------------------------ report files


def test_report_table_and_plots(tmp_path):
    settings = BenchSettings(concurrency=[1, 4], max_new_tokens=9, budget=4, repeat=2)
    records, _, _ = run_fake(settings, n=4)
    bench.write_report(tmp_path / "report.json", {"records": records})
    data = json.loads((tmp_path / "report.json").read_text())
    required = {"mode", "concurrency", "ttft_ms", "tpot_ms", "e2e_ms_p50", "throughput_tok_s",
                "mean_accepted_tokens", "acceptance_rate", "mismatches"}
    for rec in data["records"]:
        assert required <= set(rec)
        assert ("speedup" in rec) == (rec["mode"] == "speculative")
    table = bench.format_table(records)
    assert "speculative" in table and "3.00x [3.00-3.00]" in table  # 9 tokens: 9 plain rounds vs 3 spec rounds
    plots = bench.write_plots(tmp_path, records, "(fake)")
    assert sorted(p.rsplit("/", 1)[1] for p in plots) == ["accepted_by_position.png", "speedup_vs_concurrency.png",
                                                          "tpot_distribution.png"]
    import matplotlib.image as mpimg

    for p in plots:
        with open(p, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
        assert mpimg.imread(p).shape[0] > 100


# ------------------------------------------------------------------------------------------ CLI


def test_cli_parsing():
    from suffixspec.cli import build_parser
    from suffixspec._commands.bench import parse_budget, parse_concurrency, settings_from_args

    args = build_parser().parse_args(["bench"])
    assert args.workload == "code_edit" and args.concurrency == "1,4" and args.budget == "auto"
    s = settings_from_args(args)
    assert s.concurrency == [1, 4] and s.max_new_tokens == 64 and s.repeat == 1 and not s.do_sample and s.qps is None
    args = build_parser().parse_args(["bench", "--workload", "chat", "--model", "m", "--corpus", "a.idx", "--corpus",
                                      "b.idx", "--filter", "repo=x", "--concurrency", "16,1,4", "--qps", "2.5",
                                      "--max-new-tokens", "32", "--budget", "8", "--temperature", "0.7",
                                      "--repeat", "3", "--out", "d"])
    s = settings_from_args(args)
    assert args.corpus == ["a.idx", "b.idx"] and args.filter == ["repo=x"] and args.out == "d"
    assert s.concurrency == [1, 4, 16] and s.qps == 2.5 and s.budget == 8 and s.do_sample and s.repeat == 3
    assert parse_budget("auto") == "auto"
    for bad in ("x", "-1"):
        with pytest.raises(BadInputError):
            parse_budget(bad)
    for bad in ("", "a,b", "0,4"):
        with pytest.raises(BadInputError):
            parse_concurrency(bad)


def test_cli_errors_are_messages(capsys):
    from suffixspec.cli import main

    assert main(["bench", "--concurrency", "0"]) == 2
    assert "--concurrency" in capsys.readouterr().err
    assert main(["bench", "--workload", "nope", "--max-new-tokens", "4"]) == 2


# ------------------------------------------------------------------------------------------ tiny end-to-end


def test_end_to_end_on_tiny_model(tmp_path):
    pytest.importorskip("transformers")
    from tiny_models import tiny_model

    from suffixspec.proposer import Proposer

    model = tiny_model("llama", vocab=97, sharpen=4.0)
    rng = np.random.default_rng(0)
    prompts = [(rng.integers(1, 97, 6).tolist() * 3) for _ in range(3)]
    wl = Workload("tiny", [Request(f"t{i}", prompt_ids=p) for i, p in enumerate(prompts)], "test")
    spec = bench.SpeculativeBackend(model, None, lambda: Proposer())
    backends = {"plain": spec, "speculative": spec, "prompt_lookup": bench.PromptLookupBackend(model, 4)}
    settings = BenchSettings(concurrency=[1, 2], max_new_tokens=12, budget=6)
    runs = bench.run_benchmark(wl, prompts, backends, settings, progress=False)
    records = bench.summarize(runs, settings)
    modes = {(r["mode"], r["concurrency"]) for r in records}
    assert modes == {("plain", 1), ("speculative", 1), ("prompt_lookup", 1), ("plain", 2), ("speculative", 2)}
    for rec in records:
        assert rec["mismatches"] == 0 and rec["failures"] == 0, rec
        assert rec["new_tokens"] == 36
        if rec["mode"] != "plain":
            assert rec["speedup"] > 0
    assert next(r for r in records if r["mode"] == "speculative")["acceptance_rate"] > 0
    bench.write_plots(tmp_path, records)
