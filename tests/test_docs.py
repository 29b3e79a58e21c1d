"""The documentation agrees with the code: the flags documented against argparse's, the README's
commands and Python example against the package, the metrics table against the metrics served, the
links against the files, and the README's results table and bench/RESULTS.md against what
`bench/render_results.py` renders from the recorded runs."""

import argparse
import importlib.util
import json
import re
from pathlib import Path

import pytest

from suffixspec import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def load_renderer():
    spec = importlib.util.spec_from_file_location("render_results", ROOT / "bench" / "render_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


R = load_renderer()


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def parser_flags(p: argparse.ArgumentParser) -> set[str]:
    return {f for a in p._actions if not isinstance(a, argparse._HelpAction) for f in a.option_strings}


def documented_flags(section: str) -> set[str]:
    """The flags in the first column of a section's table rows."""
    out = set()
    for line in section.splitlines():
        if line.startswith("| `-"):
            out |= set(re.findall(r"`(--?[\w-]+)`", line.split(" | ")[0]))
    return out


def cli_sections() -> dict[str, str]:
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    parts = re.split(r"^## suffixspec (\w+)\s*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_cli_reference_documents_every_flag_of_every_command_and_no_other():
    sections = cli_sections()
    assert set(sections) == set(subcommands()), "docs/cli.md needs one '## suffixspec NAME' section per command"
    for name, p in subcommands().items():
        have, documented = parser_flags(p), documented_flags(sections[name])
        assert have - documented == set(), f"suffixspec {name}: flags missing from docs/cli.md"
        assert documented - have == set(), f"suffixspec {name}: docs/cli.md documents flags it does not have"


def test_flags_named_in_serving_docs_exist():
    serve = parser_flags(subcommands()["serve"])
    text = (DOCS / "serving.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(--[\w-]+)", text))
    assert named and named - serve == set()


def command_lines(text: str) -> list[tuple[str, str]]:
    """(command, rest of the line) for every `suffixspec COMMAND ...` line of the fenced shell blocks."""
    out, fence = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
            continue
        m = re.match(r"\s*suffixspec (\w+)(.*)", line)
        if m and fence in ("bash", "sh", ""):
            out.append((m.group(1), m.group(2).split(" # ")[0]))
    return out


@pytest.mark.parametrize("doc", ["README.md", "docs/corpus.md", "docs/benchmarks.md"])
def test_documented_command_lines_use_real_commands_and_flags(doc):
    commands = subcommands()
    lines = command_lines((ROOT / doc).read_text(encoding="utf-8"))
    assert lines, f"{doc} shows no suffixspec command"
    for name, rest in lines:
        assert name in commands, f"{doc}: no command 'suffixspec {name}'"
        quoted = re.sub(r"'[^']*'|\"[^\"]*\"", "", rest)
        unknown = set(FLAG.findall(quoted)) - parser_flags(commands[name])
        assert unknown == set(), f"{doc}: suffixspec {name} has no {sorted(unknown)}"


def test_readme_keeps_the_two_setup_commands_that_ci_runs():
    readme = README.read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)\n```", readme.split("## Set-up")[1], flags=re.S)[:2]
    main, tests = blocks
    assert main.endswith("&& suffixspec demo") and tests.endswith("&& python -m pytest -q")
    assert tests in ci
    assert readme.index("## Set-up") < len(readme) / 3


def test_readme_is_for_users():
    readme = README.read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    assert not re.search(r"`[0-9a-f]{7,40}`", readme), "commit hashes belong in the results log"
    assert not re.search(r"\bsession \d+|this session", readme)


def test_readme_python_example_runs_up_to_the_model():
    """The example's imports and its model-free half, executed (the model half loads the default model)."""
    code = re.search(r"## Python API\n+```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S).group(1)
    head = code.split("model, tokenizer = load_model(")[0]
    scope = {}
    exec(compile(head, "README.md", "exec"), scope)
    assert scope["sam"].match_length([9, 1, 2]) == 2
    assert len(scope["tree"].tokens) > 0


def test_metrics_table_names_every_metric_served():
    source = (ROOT / "suffixspec" / "http" / "metrics.py").read_text(encoding="utf-8")
    served = {"suffixspec_" + m for m in re.findall(r'p \+ "(\w+)"', source)}
    text = (DOCS / "serving.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(suffixspec_\w+)`", text, flags=re.M))
    assert served and served == documented


def slug(heading: str) -> str:
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.M)} | set(re.findall(r'<a id="([^"]+)"', text))


def test_links_between_documents_resolve():
    docs = [README, ROOT / "bench" / "RESULTS.md", *sorted(DOCS.glob("*.md"))]
    for doc in docs:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if re.match(r"\w+://", target):
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            assert path.exists(), f"{doc.name}: link to missing {target}"
            if anchor and path.suffix == ".md":
                assert anchor in anchors(path), f"{doc.name}: no anchor #{anchor} in {path.name}"


def test_benchmarks_doc_names_every_bench_script():
    text = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    scripts = [p.name for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_")]
    assert [s for s in scripts if f"`{s}`" not in text] == []


def test_docs_exist():
    for name in ("architecture.md", "serving.md", "corpus.md", "benchmarks.md", "cli.md"):
        assert (DOCS / name).stat().st_size > 1000, name


# ------------------------------------------------------------------ the results log


def test_readme_table_and_results_log_are_rendered_from_the_records():
    rendered = R.render(ROOT)
    for path, text in rendered.items():
        assert path.read_text(encoding="utf-8") == text, \
            f"{path.name} is not what the records give: run `python bench/render_results.py`"
    readme = README.read_text(encoding="utf-8")
    table = readme[readme.index(R.BEGIN):readme.index(R.END)]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| measured")]
    assert 0 < len(rows) <= 12
    assert all("](bench/RESULTS.md#" in row and re.search(r"\| `(python|suffixspec) ", row) for row in rows)


def record(benchmark, date, result, command=("bench/bench_x.py", "--record")):
    return {"benchmark": benchmark, "date": date, "host": {"cpu": "X", "logical_cores": 2},
            "git_revision": "0" * 40, "git_dirty": False, "command": list(command), "result": result}


def offmode(pct):
    return {"workload": "chat", "max_new_tokens": 48,
            "rows": {"4": {"plain_round_ms": 50.0, "added_ms": 0.25, "added_pct": pct,
                           "added_without_closes_pct": 0.4, "added_pct_range": [0.4, 0.6]}}}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_headline_takes_each_benchmark_latest_record(tmp_path):
    write_jsonl(tmp_path / "offmode.jsonl", [record("offmode", "2026-12-02T00:00:00+00:00", offmode(0.7)),
                                             record("offmode", "2026-12-01T00:00:00+00:00", offmode(0.3))])
    records = R.load_records(tmp_path)
    assert [r["date"][:10] for r in records["offmode"]] == ["2026-12-01", "2026-12-02"]
    table = R.headline(records)
    rows = [line for line in table.splitlines() if line.startswith("| cost")]
    assert rows == ["| cost when speculation is off | 0.70% of a plain round at 4 rows | `python bench/bench_x.py` "
                    "| [2026-12-02](bench/RESULTS.md#offmode) |"]


def test_a_benchmark_split_by_setting_shows_each_settings_newest_figure(tmp_path):
    def recycle(budget, tpr):
        return {"rows": [{"set": "specbench", "budget": budget, "source": "both", "prompts": 12,
                          "tokens_per_round": tpr, "vs_copy": 1.2, "identical": True}]}

    write_jsonl(tmp_path / "recycle.jsonl", [record("recycle", "2026-12-01T00:00:00+00:00", recycle(16, 1.5)),
                                             record("recycle", "2026-12-02T00:00:00+00:00", recycle(64, 2.5)),
                                             record("recycle", "2026-12-03T00:00:00+00:00", recycle(16, 1.7))])
    rows = [line for line in R.headline(R.load_records(tmp_path)).splitlines() if line.startswith("| drafting beyond")]
    assert len(rows) == 1
    assert ("Spec-Bench sample: budget 16: 1.70 tokens per round, 1.20x the copy sources alone; budget 64: 2.50 "
            "tokens per round" in rows[0]) and "2026-12-03" in rows[0]


def test_generate_rows_come_from_each_models_own_newest_record(tmp_path):
    def generate(workload, ratio, model=None):
        s = {"prompts": 2, "ss-auto_vs_plain": ratio, "ss-auto_vs_best_pld": 1.1, "ss-auto_tokens_per_round": 3.0,
             "identical": True, "ss-auto_vs_plain_range": [ratio - 0.1, ratio + 0.1],
             "ss-auto_time_split": {"share": {"prefill": 0.5, "draft": 0.01, "verify": 0.45, "rest": 0.04}},
             "c4": {"concurrency": 4, "best_fixed": "ss-16", "auto_vs_best_fixed": 0.97,
                    "auto_vs_best_fixed_range": [0.95, 0.99]}}
        return {"workloads": {workload: s}, **({"model": model} if model else {})}

    code = "/somewhere/" + R.CODE_MODEL
    write_jsonl(tmp_path / "generate.jsonl", [
        record("generate", "2026-12-01T00:00:00+00:00", generate("specbench", 1.25)),
        record("generate", "2026-12-02T00:00:00+00:00", generate("code-edit", 2.5, code)),
        record("generate", "2026-12-03T00:00:00+00:00", generate("continue-file", 2.2, code)),
    ])
    table = R.headline(R.load_records(tmp_path))
    sb = [line for line in table.splitlines() if line.startswith(f"| Spec-Bench sample, end to end, {R.DEFAULT_LABEL} |")]
    assert len(sb) == 1 and "1.25x [1.15-1.35] plain greedy" in sb[0] and "2026-12-01" in sb[0]  # not hidden by newer code-model runs
    code_rows = [line for line in table.splitlines() if R.CODE_LABEL in line]
    assert len(code_rows) == 2  # each workload from the newest code-model record that has it
    assert "2.50x [2.40-2.60] plain greedy" in code_rows[0] and "2026-12-02" in code_rows[0]
    assert "time prefill/draft/verify/rest 50/1/45/4%" in code_rows[0]
    assert "automatic budget 0.970 [0.950-0.990] of the best fixed (ss-16) at 4 requests" in code_rows[0]
    assert "2.20x" in code_rows[1] and "2026-12-03" in code_rows[1]


def test_results_log_lists_every_run_newest_first_then_the_history(tmp_path):
    write_jsonl(tmp_path / "offmode.jsonl", [record("offmode", "2026-12-01T00:00:00+00:00", offmode(0.3)),
                                             record("offmode", "2026-12-02T00:00:00+00:00", offmode(0.7))])
    write_jsonl(tmp_path / "new_thing.jsonl", [record("new_thing", "2026-12-03T00:00:00+00:00", {"speedup": 1.5, "n": 3})])
    log = R.results_log(R.load_records(tmp_path), "### 2026-11-30 · an old figure\n\nkept as it was")
    assert log.index("0.70%") < log.index("0.30%") < log.index("an old figure")
    assert "- speedup: 1.5" in log and "- n: 3" in log  # a benchmark without a summary shows its scalars
    assert log.count("`python bench/bench_x.py`") == 4  # three runs and the headline row


def test_a_damaged_record_is_named(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"benchmark": "x"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"x.jsonl:1"):
        R.load_records(tmp_path)
    (tmp_path / "x.jsonl").write_text("not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"x.jsonl:1: not JSON"):
        R.load_records(tmp_path)


def test_command_lines_read_as_a_user_types_them():
    assert R.command_line(["/work/x/suffixspec/cli.py", "bench", "--grid", "--record"]) == "suffixspec bench --grid"
    assert R.command_line(["/usr/bin/suffixspec", "bench", "--record", "out.jsonl", "--repeat", "2"]) == "suffixspec bench --repeat 2"
    assert R.command_line(["python", "bench/bench_plain.py", "--repeats", "5"]) == "python bench/bench_plain.py --repeats 5"
    assert R.command_line(["/abs/bench/bench_corpus.py", "--record=x.jsonl", "--no-peers"]) == "python bench/bench_corpus.py --no-peers"


def test_command_lines_name_no_path_of_the_recording_machine():
    """A file of the machine that recorded a run becomes the variable its flag also reads, else the path
    below the checkout, else its name; temporary paths stay as typed."""
    cmd = ["bench/bench_generate.py", "--specbench", "/work/shared/data/specbench-dev.jsonl", "--out=/home/me/bench/out",
           "--corpus", "/data/idx/code.idx", "--lock", "/tmp/x.lock"]
    assert R.command_line(cmd) == ("python bench/bench_generate.py --specbench $SUFFIXSPEC_SPECBENCH --out=bench/out "
                                   "--corpus code.idx --lock /tmp/x.lock")


def test_check_mode_finds_a_stale_table_and_rendering_mends_it(tmp_path):
    (tmp_path / "bench" / "results").mkdir(parents=True)
    write_jsonl(tmp_path / "bench" / "results" / "offmode.jsonl", [record("offmode", "2026-12-01T00:00:00+00:00", offmode(0.3))])
    (tmp_path / "bench" / "results" / "history.md").write_text("old figures", encoding="utf-8")
    (tmp_path / "README.md").write_text(f"# x\n\n{R.BEGIN}\n| hand | edited |\n{R.END}\n\nmore\n", encoding="utf-8")
    assert R.main(["--check", "--root", str(tmp_path)]) == 1
    assert not (tmp_path / "bench" / "RESULTS.md").exists()
    assert R.main(["--root", str(tmp_path)]) == 0
    assert R.main(["--check", "--root", str(tmp_path)]) == 0
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "hand" not in readme and "0.30% of a plain round" in readme and readme.endswith("\n\nmore\n")
    (tmp_path / "README.md").write_text("# no markers\n", encoding="utf-8")
    with pytest.raises(ValueError, match="marker"):
        R.main(["--root", str(tmp_path)])
