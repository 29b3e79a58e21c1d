"""`suffixspec bench --grid --grid-recycle-both`: the speculative arm with recycled predictions on run
beside the one with them off, interleaved with plain; each cell gains the `recycle_*` keys (on over
off paired repeat by repeat) while its own keys stay those of the arm with recycling off."""

import json
import subprocess
import sys

import pytest

from suffixspec.errors import BadInputError

from support.http import ROOT, make_tiny_model_dir


def run(mode, c, k, tokens, makespan):
    return {"mode": mode, "concurrency": c, "repeat": k, "makespan_s": makespan,
            "requests": [{"id": f"q{i}", "new_tokens": t} for i, t in enumerate(tokens)]}


def test_paired_throughput_ratios_pair_repeats_in_order():
    from suffixspec.bench.grid import paired_throughput_ratios

    runs = [run("speculative", 1, 0, [10, 10], 2.0), run("recycle", 1, 0, [10, 10], 1.0),  # 10 then 20 tok/s: 2x
            run("speculative", 1, 1, [10, 10], 1.0), run("recycle", 1, 1, [10, 10], 4.0),  # 0.25x
            run("speculative", 2, 0, [8], 1.0), run("recycle", 2, 0, [8], 1.0),
            run("recycle", 2, 1, [8], 1.0),  # no pair: left out
            run("speculative", 4, 0, [8], 0.0), run("recycle", 4, 0, [8], 1.0)]  # a baseline of 0 pairs with nothing
    assert paired_throughput_ratios(runs, "recycle", "speculative") == {1: [2.0, 0.25], 2: [1.0]}
    assert paired_throughput_ratios(runs, "speculative", "recycle") == {1: [0.5, 4.0], 2: [1.0], 4: [0.0]}


def test_recycle_verdict_boundaries():
    from suffixspec.bench.grid import recycle_verdict

    assert recycle_verdict(1.03, 0.93) == "pays"
    assert recycle_verdict(1.2, 0.9299) == "loses"  # one bad repeat loses it whatever the median
    assert recycle_verdict(0.9699, 0.96) == "loses"
    assert recycle_verdict(0.97, 0.95) == "neutral"
    assert recycle_verdict(1.0299, 1.0) == "neutral"


def test_recycle_arm_adds_its_keys_and_leaves_the_cells_own():
    from suffixspec.bench.grid import format_recycle, grid_cells, recycle_arm, recycle_heatmap_cells

    def rec(mode, c, thr, **kw):
        return {"mode": mode, "concurrency": c, "throughput_tok_s": thr, "ttft_ms": 10.0, "repeats": 2, **kw}

    records = [rec("plain", 1, 10.0), rec("speculative", 1, 15.0, speedup=1.5, speedup_min=1.4, speedup_max=1.6,
                                          drafted_per_round=2.0, mean_accepted_tokens=1.8),
               rec("recycle", 1, 18.0, speedup=1.8, speedup_min=1.7, speedup_max=1.9, drafted_per_round=6.0,
                   mean_accepted_tokens=2.2, mismatches=0),
               rec("plain", 4, 20.0), rec("speculative", 4, 20.0, speedup=1.0, speedup_min=1.0, speedup_max=1.0,
                                          drafted_per_round=0.1)]  # no recycle arm at 4: left as it was
    results = [("w", 8, records)]
    runs = [run("speculative", 1, 0, [30], 2.0), run("recycle", 1, 0, [30], 1.5),  # 4/3
            run("speculative", 1, 1, [30], 2.0), run("recycle", 1, 1, [30], 2.5)]  # 0.8
    plain = grid_cells(results)
    cells = recycle_arm(grid_cells(results), results, {("w", 8): runs})
    for before, after in zip(plain, cells):  # the cells' own keys are those of the arm with recycling off
        assert {k: after[k] for k in before} == before
    one, four = cells
    assert one["recycle_vs_off_runs"] == pytest.approx([4 / 3, 0.8])
    assert one["recycle_vs_off"] == pytest.approx((4 / 3 + 0.8) / 2)  # the median of two
    assert one["recycle_vs_off_min"] == pytest.approx(0.8) and one["recycle_vs_off_max"] == pytest.approx(4 / 3)
    assert one["recycle_verdict"] == "loses"  # a repeat at 0.8x
    assert one["recycle_speedup"] == 1.8 and one["recycle_drafted_per_round"] == 6.0
    assert one["recycle_tokens_per_round"] == 2.2 and one["recycle_tok_s"] == 18.0
    assert not any(k.startswith("recycle_") for k in four)
    table = format_recycle(cells).splitlines()
    assert len(table) == 3 and "1.067x [0.800-1.333]" in table[2] and "2.00>6.00" in table[2] and "loses" in table[2]
    assert recycle_heatmap_cells(cells) == [{"workload": "w", "max_new_tokens": 8, "concurrency": 1,
                                             "speedup": one["recycle_vs_off"], "speedup_min": 0.8, "verdict": "loses"}]


def test_grid_recycle_both_arguments():
    from suffixspec._commands.bench import settings_from_args
    from suffixspec.cli import build_parser, main

    args = build_parser().parse_args(["bench", "--grid", "--grid-recycle-both"])
    assert settings_from_args(args).modes == ("plain", "speculative", "recycle")
    assert settings_from_args(build_parser().parse_args(["bench", "--grid"])).modes == ("plain", "speculative")
    for flags, says in ((["--grid-recycle-both"], "applies to --grid"),
                        (["--grid", "--grid-recycle-both", "--recycle"], "not with --recycle"),
                        (["--grid", "--grid-recycle-both", "--no-recycle"], "not with --recycle")):
        with pytest.raises(BadInputError, match=says):
            settings_from_args(build_parser().parse_args(["bench", *flags]))
    assert main(["bench", "--grid-recycle-both"]) == 2


def test_grid_recycle_both_in_process(tmp_path):
    """Its own process on a tiny local model: the three modes interleaved, greedy outputs identical,
    every cell with its recycling keys, a second heat map, the recorded line with them."""
    model_dir = make_tiny_model_dir(tmp_path / "tiny", fim=False)
    prompts = [f"def g{i}(a, b):\n    return a * {i} + b\n\ndef g{i}(a, b):\n    return a" for i in range(2)]
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    out, record = tmp_path / "grid", tmp_path / "rec.jsonl"
    done = subprocess.run([sys.executable, "-m", "suffixspec.cli", "bench", "--model", str(model_dir), "--grid",
                           "--grid-recycle-both", "--grid-workloads", str(path), "--grid-concurrency", "1,2",
                           "--grid-max-new-tokens", "10", "--num-prompts", "2", "--repeat", "2", "--budget", "8",
                           "--threads", "1", "--out", str(out), "--record", str(record)],
                          capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "grid.json").read_text())
    assert report["grid"]["mode"] == "speculative" and report["grid"]["recycle_arm"] == "recycle"
    assert report["settings"]["recycle"] is False  # the cells' own arm: recycling off
    (part,) = report["benchmarks"]
    assert {(r["mode"], r["concurrency"]) for r in part["runs"]} == {
        (m, c) for c in (1, 2) for m in ("plain", "recycle", "speculative")}
    assert part["settings"]["mode_runs"] == "interleaved"
    by = {(r["mode"], r["concurrency"]): r for r in part["records"]}
    assert all(rec["mismatches"] == 0 and rec["failures"] == 0 for rec in by.values())
    for cell in report["cells"]:
        assert cell["recycle_mismatches"] == 0 and cell["recycle_failures"] == 0 and len(cell["recycle_vs_off_runs"]) == 2
        assert cell["recycle_vs_off_min"] <= cell["recycle_vs_off"] <= cell["recycle_vs_off_max"]
        assert cell["recycle_speedup"] == by[("recycle", cell["concurrency"])]["speedup"]
        assert cell["recycle_verdict"] in ("pays", "neutral", "loses")
    assert (out / "grid_recycle.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "recycled predictions on (mode recycle) against off (speculative)" in done.stdout
    (line,) = [json.loads(x) for x in record.read_text().splitlines()]
    assert all(c["recycle_vs_off"] > 0 and "recycle_verdict" in c for c in line["result"]["cells"])
