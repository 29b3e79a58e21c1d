"""`bench/bench_generate.py`'s `--budget` configurations: auto or a token count, `+r` for recycled
predictions on; anything else refused with the flag's name; auto compared only with fixed budgets."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bg(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_generate", ROOT / "bench" / "bench_generate.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_generate", mod)
    spec.loader.exec_module(mod)
    return mod


def test_budget_configurations(bg):
    assert bg.budget_config("auto") == bg.BudgetConfig("ss-auto", "auto", False)
    assert bg.budget_config("16") == bg.BudgetConfig("ss-16", 16, False)
    assert bg.budget_config("auto+r") == bg.BudgetConfig("ss-auto+r", "auto", True)
    assert bg.budget_config(" 8+r ") == bg.BudgetConfig("ss-8+r", 8, True)
    for bad in ("", "+r", "auto+", "-4", "4.5", "r+auto", "auto+rr"):
        with pytest.raises(SystemExit, match="--budget: expected auto or a token count"):
            bg.budget_config(bad)


def test_auto_is_compared_with_fixed_budgets_only(bg):
    tps = {"ss-auto": 10.0, "ss-8": 8.0, "ss-16": 9.0, "ss-auto+r": 12.0, "ss-16+r": 13.0}
    got = bg._auto_vs_fixed(tps, list(tps))
    assert got == {"best_fixed": "ss-16", "auto_vs_best_fixed": 10.0 / 9.0}
    assert bg._auto_vs_fixed({"ss-auto": 1.0, "ss-auto+r": 2.0}, ["ss-auto", "ss-auto+r"]) == {}
