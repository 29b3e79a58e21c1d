"""The start-up choice of torch's thread count (`suffixspec.threads`): the rule itself, the wait
policy set before torch loads, and the log line of a real `suffixspec generate` / `serve` process."""

import os
import subprocess
import sys

import pytest

from suffixspec.threads import ThreadChoice, ThreadPlan, choose, usable_cores
from test_http_support import ROOT, make_tiny_model_dir


@pytest.mark.parametrize("cores, others, want", [
    (2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.0, 1), (2, 2.0, 1), (2, 5.0, 1),
    (16, 0.0, 16), (16, 3.2, 13), (16, 15.9, 1), (1, 0.0, 1),
])
def test_one_thread_per_core_left_free(cores, others, want):
    threads, reason = choose(None, cores, others, env={})
    assert threads == want
    assert f"{cores} usable cores" in reason and f"kept {others:.1f} busy" in reason


def test_a_given_count_wins_then_omp_num_threads_then_the_cores():
    assert choose(3, 2, 2.0, env={"OMP_NUM_THREADS": "1"}) == (3, "--threads")
    assert choose(None, 2, 0.0, env={"OMP_NUM_THREADS": "4"}) == (4, "OMP_NUM_THREADS")
    assert choose(None, 8, None, env={"OMP_NUM_THREADS": "junk"})[0] == 8  # not a count: ignored; unmeasured: all
    assert 1 <= usable_cores() <= os.cpu_count()


def test_the_wait_policy_is_set_only_for_a_chosen_count_and_never_over_the_users():
    env = {}
    plan = ThreadPlan(None, env)
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" or plan.torch_loaded
    env = {"OMP_WAIT_POLICY": "active"}
    ThreadPlan(None, env)
    assert env["OMP_WAIT_POLICY"] == "active"
    env = {}
    ThreadPlan(2, env)  # --threads: OpenMP left as it is
    assert "OMP_WAIT_POLICY" not in env
    env = {"OMP_NUM_THREADS": "2"}
    ThreadPlan(None, env)
    assert "OMP_WAIT_POLICY" not in env


def test_choice_in_a_fresh_process_before_torch_loads():
    code = ("import os, sys\nfrom suffixspec.threads import ThreadPlan\nplan = ThreadPlan.start(None)\n"
            "assert 'torch' not in sys.modules\nimport torch\nchoice = plan.finish()\n"
            "print(choice.threads, torch.get_num_threads(), os.environ['OMP_WAIT_POLICY'], choice.others_busy is not None)")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    chosen, applied, policy, measured = out.stdout.split()
    assert chosen == applied and 1 <= int(chosen) <= usable_cores()
    assert policy == "PASSIVE" and measured == "True"


def test_generate_logs_what_it_chose_and_why(tmp_path):
    model_dir = make_tiny_model_dir(tmp_path / "tiny")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}

    def run(*flags):
        out = subprocess.run([sys.executable, "-m", "suffixspec.cli", "generate", "--model", str(model_dir),
                              "--prompt", "def f(x):\n", "--max-new-tokens", "2", *flags],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        assert out.returncode == 0, out.stderr
        return [line for line in out.stderr.splitlines() if "torch threads:" in line]

    lines = run()
    assert len(lines) == 1, lines
    assert lines[0].startswith("suffixspec generate: torch threads: ")
    assert "usable cores, other processes kept" in lines[0] and lines[0].endswith("OpenMP wait policy PASSIVE")
    assert run("--threads", "1") == ["suffixspec generate: torch threads: 1 (--threads); OpenMP wait policy "
                                     "unset (libgomp's default)"]


def test_describe():
    c = ThreadChoice(1, "--threads", "", 2, None)
    assert c.describe() == "torch threads: 1 (--threads); OpenMP wait policy unset (libgomp's default)"
