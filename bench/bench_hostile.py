"""Hostile clients against a real `suffixspec serve` on loopback, case by case, while a well-behaved
client keeps asking: per case the status it got (against the one expected), how long the answer took
(against the case's limit), and the well-behaved client's latency meanwhile; the server's resident
memory (VmRSS) before and after the suite (target: within 10%).

The cases are those of `tests/test_http_hostile.py` (whose socket helpers, `tests/support/sockets.py`, this reuses), each bounded:
a declared body over the limit, an oversized body sent anyway, a chunked body cut at the limit, a
100,000-deep nested JSON, a lone surrogate, Latin-1 bytes, a non-JSON content type, 10,000 stop
strings, a 100,000-entry logit_bias, a prompt at the context limit and one over it, max_tokens at
its limit with n at its maximum and n over it, a silent connection, a head and a body dripped a
byte every quarter second, 200 idle keep-alive connections, a client hanging up mid-body. The server
runs with `--max-body-bytes`, `--read-timeout` and `--keep-alive` of this script (small, so deadlines
come soon). A table, then one JSON line last (``--record``: ``bench/results/hostile.jsonl``).

    python bench/bench_hostile.py                  # the HTTP tests' tiny model
    python bench/bench_hostile.py --model default --threads 1 --max-batch 4
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import common

TESTS = common.ROOT / "tests"


class Server:
    """What the tests' helpers read of a server: its port, URL and process."""

    def __init__(self, proc, url: str):
        self.proc, self.url = proc, url
        self.port = int(url.rsplit(":", 1)[1])


class Prober:
    """A well-behaved client: one short completion after another, latencies kept by phase."""

    def __init__(self, url: str, model: str):
        self.url, self.model = url, model
        self.phase = "before"
        self.latencies: dict[str, list[float]] = {}
        self.failures: list[str] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=120) as http:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    r = http.post(self.url + "/v1/completions", json={"model": self.model, "prompt": "def f(x):\n",
                                                                      "max_tokens": 4, "temperature": 0})
                    ok = r.status_code == 200
                except httpx.HTTPError as exc:
                    ok, r = False, exc
                if ok:
                    self.latencies.setdefault(self.phase, []).append(time.monotonic() - t0)
                else:
                    self.failures.append(f"{self.phase}: {r}")
                self._stop.wait(0.05)

    def summary(self, phase: str) -> dict:
        got = sorted(self.latencies.get(phase, []))
        if not got:
            return {"n": 0}
        return {"n": len(got), "p50_s": round(statistics.median(got), 4), "max_s": round(got[-1], 4)}

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(150)


def cases(h, server, model: str, limit: int, read_timeout: float, slack: float, max_n: int):
    """(name, expected, limit_s, function returning what it got) for every case; `h`: the test module."""
    import httpx

    def status_of(r):
        return r.status_code

    def declared_over():
        with h.connect(server) as sock:
            sock.sendall(h.post_head(length=200_000_000))
            return h.read_response(sock)[0]

    def sent_over():
        with h.connect(server) as sock:
            sock.sendall(h.post_head(length=200_000_000))
            sent = 0
            try:
                while sent < 50_000_000:
                    sock.sendall(b"x" * 65536)
                    sent += 65536
            except (BrokenPipeError, ConnectionResetError):
                pass
            return f"cut after {sent // 1_000_000} MB" if sent < 50_000_000 else "read 50 MB"

    def chunked_over():
        with h.connect(server) as sock:
            sock.sendall(h.post_head(chunked=True))
            piece = b"[" + b"1," * 32000 + b"1]"
            try:
                for _ in range(4 * limit // len(piece)):
                    sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            except (BrokenPipeError, ConnectionResetError):
                pass
            return h.read_response(sock)[0]

    def body(payload, ctype="application/json", path="/v1/completions"):
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return lambda: status_of(h.post(server, data, ctype=ctype, path=path))

    def context():
        return httpx.get(server.url + "/v1/models").json()["data"][0]["max_model_len"]

    def silent():
        with h.connect(server) as sock:
            return "closed" if h.closed_by_server(sock) else "open"

    def drip_head():
        with h.connect(server) as sock:
            try:
                for byte in h.post_head(length=10):
                    sock.sendall(bytes([byte]))
                    time.sleep(0.25)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return h.read_response(sock)[0]

    def drip_body():
        with h.connect(server) as sock:
            sock.sendall(h.post_head(length=1000))
            try:
                for _ in range(1000):
                    sock.sendall(b" ")
                    time.sleep(0.25)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return h.read_response(sock)[0]

    def idle_200():
        socks = []
        try:
            for _ in range(200):
                sock = h.connect(server)
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                socks.append(sock)
            answered = sum(h.read_response(sock)[0] == 200 for sock in socks)
            closed = sum(h.closed_by_server(sock) for sock in socks)
            return f"{answered} answered, {closed} closed"
        finally:
            for sock in socks:
                sock.close()

    def hang_up():
        with h.connect(server) as sock:
            sock.sendall(h.post_head(length=1000) + b'{"model": "x", "pro')
            time.sleep(0.2)
        return "sent 22 bytes, hung up"

    base = {"model": model, "prompt": "x", "max_tokens": 4}
    ctx = context()
    quick = 10.0 + slack
    deadline = read_timeout + slack
    return [
        ("Content-Length 200 MB", 413, quick, declared_over),
        ("200 MB body sent anyway", "cut after", quick, sent_over),
        ("chunked body past the limit", 413, quick, chunked_over),
        ("JSON nested 100,000 deep", 400, quick,
         body(b'{"model": "x", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")),
        ("lone surrogate \\ud800", 400, quick, body(b'{"model": "x", "prompt": "ab\\ud800cd", "max_tokens": 4}')),
        ("Latin-1 bytes, not UTF-8", 400, quick, body(b'{"model": "x", "prompt": "caf\xe9"}')),
        ("Content-Type text/plain", 415, quick, body(base, ctype="text/plain")),
        ("10,000 stop strings", 400, quick, body({**base, "stop": [f"s{i}" for i in range(10_000)]})),
        ("100,000-entry logit_bias", 400, quick, body({**base, "logit_bias": {str(i): 1 for i in range(100_000)}})),
        ("prompt at the context limit", 200, 120.0, body({"model": model, "prompt": [5] * (ctx - 2), "max_tokens": 2,
                                                          "temperature": 0})),
        ("prompt over the context limit", 400, quick, body({"model": model, "prompt": [5] * ctx, "max_tokens": 2})),
        (f"max_tokens at its limit, n={max_n}", 200, 300.0, None),  # filled in by main (the server's flag)
        (f"n={max_n + 1}, over its limit", 400, quick, body({**base, "n": max_n + 1})),
        ("silent connection", "closed", deadline, silent),
        ("head dripped 4 bytes/s", 408, deadline, drip_head),
        ("body dripped 4 bytes/s", 408, deadline, drip_body),
        ("200 idle keep-alive connections", "200 answered, 200 closed", 60.0, idle_200),
        ("client hangs up mid-body", "sent 22 bytes, hung up", quick, hang_up),
    ]


def run_case(name, expected, limit_s, fn) -> dict:
    t0 = time.monotonic()
    try:
        got = fn()
    except Exception as exc:  # noqa: BLE001 - a case that breaks is reported, the suite goes on
        got = f"{type(exc).__name__}: {exc}"[:120]
    seconds = time.monotonic() - t0
    ok = (got == expected) if not isinstance(expected, str) or not isinstance(got, str) else got.startswith(expected)
    return {"case": name, "expected": expected, "got": got, "seconds": round(seconds, 3), "limit_s": limit_s,
            "ok": bool(ok and seconds <= limit_s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model directory or 'default' (default: the tests' tiny model)")
    ap.add_argument("--threads", type=int, default=None, help="the server's --threads (default: its own choice)")
    ap.add_argument("--max-batch", type=int, default=4, help="the server's --max-batch (default 4)")
    ap.add_argument("--max-tokens-limit", type=int, default=64, help="the server's --max-new-tokens-limit (default 64)")
    ap.add_argument("--max-body-bytes", type=int, default=2_000_000, help="the server's body limit (default 2000000)")
    ap.add_argument("--read-timeout", type=float, default=3.0, help="the server's --read-timeout (default 3)")
    ap.add_argument("--keep-alive", type=float, default=2.0, help="the server's --keep-alive (default 2)")
    ap.add_argument("--slack", type=float, default=6.0, help="seconds a deadline may be exceeded by (default 6)")
    common.add_record_flag(ap)
    args = ap.parse_args()
    h = common.load_test_support("sockets")  # the hostile-client tests' raw-socket helpers
    from suffixspec.http.protocol import MAX_N

    with tempfile.TemporaryDirectory(prefix="suffixspec-hostile-") as tmp:
        root = Path(tmp)
        if args.model is None:
            model_dir = str(common.load_test_support("http").make_tiny_model_dir(root / "tiny"))
        else:
            model_dir = None if args.model == "default" else args.model
        extra = ["--max-new-tokens-limit", str(args.max_tokens_limit), "--max-body-bytes", str(args.max_body_bytes),
                 "--read-timeout", str(args.read_timeout), "--keep-alive", str(args.keep_alive)]
        if args.threads:
            extra += ["--threads", str(args.threads)]
        log = root / "server.log"
        proc, url = common.spawn_server(model_dir, args.max_batch, log, extra)
        server = Server(proc, url)
        import httpx

        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        prober = Prober(url, model)
        prober.thread.start()
        try:
            time.sleep(3.0)  # the well-behaved client's latency alone
            rss_before = h.rss_kb(server)
            rows = []
            for name, expected, limit_s, fn in cases(h, server, model, args.max_body_bytes, args.read_timeout,
                                                     args.slack, MAX_N):
                if fn is None:  # max_tokens at the server's limit
                    payload = json.dumps({"model": model, "prompt": "x", "max_tokens": args.max_tokens_limit,
                                          "n": MAX_N, "temperature": 0}).encode()
                    fn = (lambda data: lambda: h.post(server, data).status_code)(payload)
                prober.phase = "suite"
                rows.append(run_case(name, expected, limit_s, fn))
                print(json.dumps(rows[-1]), file=sys.stderr)
            prober.phase = "after"
            time.sleep(3.0)
            rss_after = h.rss_kb(server)
        finally:
            prober.stop()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        text = log.read_text(errors="replace")
        hung_up = [line for line in text.splitlines() if "hung up" in line]
    print(f"{'case':34} {'expected':>26} {'got':>26} {'seconds':>8} {'limit':>6}  ok")
    for r in rows:
        print(f"{r['case']:34} {r['expected']!s:>26} {r['got']!s:>26} {r['seconds']:8.2f} {r['limit_s']:6.0f}  "
              f"{'yes' if r['ok'] else 'NO'}")
    latency = {phase: prober.summary(phase) for phase in ("before", "suite", "after")}
    print(f"RSS {rss_before} kB before, {rss_after} kB after ({rss_after / rss_before - 1:+.1%}); other client's "
          f"latency: {latency}; its failures: {len(prober.failures)}")
    common.emit({"benchmark": "hostile", "model": args.model or "tests' tiny random Qwen2", "cases": rows,
                 "ok": sum(r["ok"] for r in rows), "of": len(rows), "rss_kb_before": rss_before,
                 "rss_kb_after": rss_after, "rss_growth": round(rss_after / rss_before - 1, 4),
                 "other_client_latency": latency, "other_client_failures": prober.failures[:5],
                 "hung_up_log_lines": hung_up, "log_tracebacks": text.count("Traceback"),
                 "log_errors": text.count(" ERROR "), "exit_status": code,
                 "server": {"max_batch": args.max_batch, "max_body_bytes": args.max_body_bytes,
                            "read_timeout_s": args.read_timeout, "keep_alive_s": args.keep_alive,
                            "threads": args.threads}}, args, "hostile")


if __name__ == "__main__":
    main()
