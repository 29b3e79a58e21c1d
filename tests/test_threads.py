"""The start-up choice of torch's threads (`suffixspec.threads`): the rule itself, the wait policy set
before torch loads (and never over the user's), and the log line of a real `suffixspec generate`."""

import os
import subprocess
import sys

from suffixspec.threads import WAIT_ENV, ThreadChoice, ThreadPlan, choose, usable_cores

from support.http import ROOT, make_tiny_model_dir


def test_a_given_count_wins_then_omp_num_threads_then_the_cores():
    assert choose(3, 2, env={"OMP_NUM_THREADS": "1"}) == (3, "--threads")
    assert choose(None, 2, env={"OMP_NUM_THREADS": "4"}) == (4, "OMP_NUM_THREADS")
    threads, reason = choose(None, 8, env={"OMP_NUM_THREADS": "junk"})  # not a count: ignored
    assert threads == 8 and "one per usable core, 8" in reason
    assert choose(None, 2, env={"OMP_NUM_THREADS": "0"})[0] == 2
    cores = usable_cores()  # the affinity mask, never above it (a CPU quota may lower it)
    assert 0 < cores <= len(os.sched_getaffinity(0))


def test_the_wait_policy_is_set_only_for_a_chosen_count_and_never_over_the_users():
    env = {}
    plan = ThreadPlan(None, env)
    assert env == (WAIT_ENV if not plan.torch_loaded else {})
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
            "print(choice.threads, torch.get_num_threads(), os.environ['OMP_WAIT_POLICY'], choice.cores)")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    chosen, applied, policy, cores = out.stdout.split()
    assert chosen == applied == cores == str(usable_cores())
    assert policy == "PASSIVE"


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
    assert f"torch threads: {usable_cores()} (one per usable core" in lines[0]
    assert lines[0].endswith("OpenMP wait policy PASSIVE")
    assert run("--threads", "1") == ["suffixspec generate: torch threads: 1 (--threads); OpenMP wait policy "
                                     "unset (the runtime's default)"]


def test_describe():
    c = ThreadChoice(1, "--threads", "", 2)
    assert c.describe() == "torch threads: 1 (--threads); OpenMP wait policy unset (the runtime's default)"
