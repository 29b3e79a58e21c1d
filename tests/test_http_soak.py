"""A short soak of a real `suffixspec serve` (the tiny model): 300 requests at concurrency 32 through
`bench/bench_soak.py`'s harness (completions and chat, streams and non-streams, a dropped stream every
tenth request, mixed lengths): no error but the drops, each drop cancelled inside the engine, a sample
of the outputs identical when sent again one at a time, the server healthy and its log clean after.
The full soak (5,000 requests, memory before and after) is `python bench/bench_soak.py`."""


import httpx

from support.harness import load_bench_script
from support.http import ServerProcess, make_tiny_model_dir


def load_harness():
    return load_bench_script("bench_soak")


def test_300_requests_at_concurrency_32(tmp_path):
    soak = load_harness()
    model_dir = make_tiny_model_dir(tmp_path / "tiny")
    server = ServerProcess(["--model", str(model_dir), "--max-batch", "8"], tmp_path / "server.log")
    try:
        out = soak.soak(server.url, server.proc.pid, "tiny", n=300, concurrency=32, warmup=50, sample=20,
                        limit_s=300)
        assert httpx.get(server.url + "/health").status_code == 200
    finally:
        code = server.stop()
    assert code == 0, server.log()
    assert out["started"] == out["requests"] == 300
    assert out["errors"] == 0, out["error_examples"]
    assert out["cancelled"] == 30 and out["server_cancelled"] == 30, out
    assert out["completed"] == 270
    assert out["sample"] == 20 and out["sample_mismatched"] == [], out
    log = server.log()
    # what the server chose, and why
    assert "torch threads: 1 (OMP_NUM_THREADS); OpenMP wait policy unset (the runtime's default)" in log
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
