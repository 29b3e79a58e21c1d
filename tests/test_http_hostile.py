"""Hostile clients against a real `suffixspec serve` process on loopback (the tiny model of the HTTP
tests): oversized, deeply nested, malformed and mislabelled bodies, slow-drip heads and bodies, idle
connections, clients hanging up mid-body. Every case must answer with the right status and an OpenAI
error object (never Python's own exception text), close what it must close, leave the log free of
tracebacks, and leave other clients served. The server runs with small limits (a 2 MB body, a 2 s
read deadline, a 1 s keep-alive) so the deadlines are reached quickly; they bound each case's wait."""

import json
import re
import socket
import threading
import time

import httpx
import pytest

from support import sockets
from support.http import ServerProcess, make_tiny_model_dir

LIMIT = 2_000_000
READ_TIMEOUT = 2.0
SLACK = 6.0  # a deadline must be met within this much more (a loaded 2-core host)
PYTHON_ERRORS = re.compile(r"RecursionError|TypeError|ValueError|UnicodeDecodeError|Traceback|TextInputSequence")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from support import tiny_models  # noqa: F401  (one torch thread, as the server)

    root = tmp_path_factory.mktemp("http_hostile")
    model_dir = make_tiny_model_dir(root / "tiny")
    proc = ServerProcess(["--model", str(model_dir), "--max-batch", "4", "--max-new-tokens-limit", "64",
                          "--max-body-bytes", str(LIMIT), "--read-timeout", str(READ_TIMEOUT), "--keep-alive", "1"],
                         root / "server.log")
    try:
        yield proc
    finally:
        code = proc.stop()
    assert code == 0, proc.log()
    log = proc.log()
    assert "Traceback" not in log and " ERROR " not in log, log


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["message"] and not PYTHON_ERRORS.search(err["message"]), err
    if code is not None:
        assert err["code"] == code, err
    return err


def connect(server) -> socket.socket:
    return sockets.connect(server, READ_TIMEOUT + SLACK)


def completion(server, prompt="def f(x):\n", max_tokens=8) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", timeout=60,
                      json={"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})


# ----------------------------------------------------------------------------------- bodies


def test_a_declared_length_over_the_limit_is_refused_before_the_body(server):
    rss_before = sockets.rss_kb(server)
    with connect(server) as sock:
        sock.sendall(sockets.post_head(length=200_000_000))  # the header alone: the server must not wait for the body
        status, headers, body = sockets.read_response(sock)
        assert status == 413 and headers.get("connection") == "close"
        assert json.loads(body)["error"]["code"] == "request_too_large"
        assert sockets.closed_by_server(sock)
    # a client that sends the body anyway gets its answer and the connection closed, not read to the end
    with connect(server) as sock:
        sock.sendall(sockets.post_head(length=200_000_000))
        sent = 0
        try:
            while sent < 50_000_000:
                sock.sendall(b"x" * 65536)
                sent += 65536
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert sent < 50_000_000, "the server kept reading an oversized body"
    assert completion(server).status_code == 200
    assert sockets.rss_kb(server) < rss_before * 1.1 + 20_000


def test_a_chunked_body_is_cut_at_the_limit(server):
    with connect(server) as sock:
        sock.sendall(sockets.post_head(chunked=True))
        piece = b"[" + b"1," * 32000 + b"1]"
        status = None
        try:
            for _ in range(4 * LIMIT // len(piece)):
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, headers, body = sockets.read_response(sock)
        assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    # under the limit, chunked is fine
    r = httpx.post(server.url + "/v1/completions", headers={"Content-Type": "application/json"},
                   content=iter([b'{"model": "tiny", ', b'"prompt": "def f(x):\\n", "max_tokens": 4}']), timeout=60)
    assert r.status_code == 200, r.text


def test_deep_nesting_lone_surrogates_and_bad_utf8_answer_400(server):
    deep = b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert_error(sockets.post(server, deep), 400, "invalid_json")
    nested = {"model": "tiny", "prompt": "x"}
    for _ in range(80):  # legal for Python's parser, deeper than any request
        nested = {"a": nested}
    assert "nests deeper" in assert_error(sockets.post(server, json.dumps(nested).encode()), 400, "invalid_json")["message"]

    err = assert_error(sockets.post(server, b'{"model": "tiny", "prompt": "ab\\ud800cd", "max_tokens": 4}'), 400, "invalid_text")
    assert err["param"] == "prompt" and "\\ud800" in err["message"]
    chat = b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udfff"}]}'
    err = assert_error(sockets.post(server, chat, path="/v1/chat/completions"), 400, "invalid_text")
    assert err["param"] == "messages[0].content"
    assert_error(sockets.post(server, b'{"model": "tiny", "prompt": "caf\xe9"}'), 400, "invalid_json")  # Latin-1, not UTF-8
    assert_error(sockets.post(server, b'{"model": "tiny", "prompt": '), 400, "invalid_json")
    assert completion(server, "caf\u00e9 \U0001f600\n").status_code == 200  # real non-ASCII text is fine


def test_content_types_other_than_json_answer_415(server):
    body = json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 2}).encode()
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "garbage;;\x01", "multipart/form-data"):
        assert_error(sockets.post(server, body, ctype=ctype), 415, "unsupported_media_type")
    for ctype in ("application/json", "application/json; charset=utf-8", "Application/JSON", None):
        assert sockets.post(server, body, ctype=ctype).status_code == 200


def test_huge_parameters_are_refused_quickly(server):
    stops = {"model": "tiny", "prompt": "x", "max_tokens": 4, "stop": [f"s{i}" for i in range(10_000)]}
    assert_error(sockets.post(server, json.dumps(stops).encode()), 400)
    bias = {"model": "tiny", "prompt": "x", "max_tokens": 4, "logit_bias": {str(i): 1 for i in range(100_000)}}
    assert assert_error(sockets.post(server, json.dumps(bias).encode()), 400)["param"] == "logit_bias"
    assert_error(sockets.post(server, json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 65}).encode()), 400)
    assert completion(server, max_tokens=64).status_code == 200
    from suffixspec.http.protocol import MAX_N

    at_limit = {"model": "tiny", "prompt": "x", "max_tokens": 64, "n": MAX_N, "temperature": 0}  # both at their limit
    r = sockets.post(server, json.dumps(at_limit).encode())
    assert r.status_code == 200 and len(r.json()["choices"]) == MAX_N, r.text
    assert assert_error(sockets.post(server, json.dumps(dict(at_limit, n=MAX_N + 1)).encode()), 400)["param"] == "n"


def test_a_prompt_at_the_context_limit(server):
    context = httpx.get(server.url + "/v1/models").json()["data"][0]["max_model_len"]
    fits = {"model": "tiny", "prompt": [5] * (context - 2), "max_tokens": 2, "temperature": 0}
    r = httpx.post(server.url + "/v1/completions", json=fits, timeout=120)
    assert r.status_code == 200, r.text
    over = dict(fits, prompt=[5] * context)
    assert_error(httpx.post(server.url + "/v1/completions", json=over, timeout=60), 400)


# ----------------------------------------------------------------------------------- slow and idle clients


def test_slow_heads_bodies_and_silent_connections_are_cut_at_the_deadline(server):
    results = {}

    def silent():
        with connect(server) as sock:
            t0 = time.monotonic()
            results["silent"] = sockets.closed_by_server(sock), time.monotonic() - t0

    def drip_head():
        with connect(server) as sock:
            t0 = time.monotonic()
            try:
                for byte in sockets.post_head(length=10):
                    sock.sendall(bytes([byte]))
                    time.sleep(0.25)
            except (BrokenPipeError, ConnectionResetError):
                pass
            status = sockets.read_response(sock)[0]
            results["head"] = status, time.monotonic() - t0

    def drip_body():
        with connect(server) as sock:
            sock.sendall(sockets.post_head(length=1000))
            t0 = time.monotonic()
            try:
                for _ in range(1000):
                    sock.sendall(b" ")
                    time.sleep(0.25)
            except (BrokenPipeError, ConnectionResetError):
                pass
            status, _, body = sockets.read_response(sock)
            results["body"] = status, json.loads(body)["error"]["code"], time.monotonic() - t0

    threads = [threading.Thread(target=f) for f in (silent, drip_head, drip_body)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    while any(t.is_alive() for t in threads):  # other clients are served meanwhile
        assert completion(server, max_tokens=4).status_code == 200
    for t in threads:
        t.join()
    assert time.monotonic() - t0 < READ_TIMEOUT + SLACK
    assert results["silent"][0] and results["silent"][1] < READ_TIMEOUT + SLACK
    assert results["head"][0] == 408 and results["head"][1] < READ_TIMEOUT + SLACK
    assert results["body"][:2] == (408, "request_timeout") and results["body"][2] < READ_TIMEOUT + SLACK


def test_200_idle_keep_alive_connections_are_closed_and_others_served(server):
    socks = []
    try:
        for _ in range(200):
            sock = connect(server)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            socks.append(sock)
        for sock in socks:
            assert sockets.read_response(sock)[0] == 200
        assert completion(server).status_code == 200  # while 200 connections idle
        assert all(sockets.closed_by_server(sock) for sock in socks)  # the keep-alive timeout closes them
    finally:
        for sock in socks:
            sock.close()


def test_a_client_hanging_up_mid_body_is_one_info_line(server):
    with connect(server) as sock:
        sock.sendall(sockets.post_head(length=1000) + b'{"model": "tiny", "pro')
        time.sleep(0.2)
    deadline = time.monotonic() + 10
    while "hung up" not in server.log():
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.05)
    lines = [line for line in server.log().splitlines() if "hung up" in line]
    assert len(lines) == 1 and " INFO " in lines[0] and "22 bytes" in lines[0], lines
    assert "ClientDisconnect" not in server.log()


# ----------------------------------------------------------------------------------- predicted outputs


def test_predicted_output_counts(server):
    """OpenAI's counts: accepted = prediction tokens found in the completion, rejected = the others."""
    def ask(prediction):
        body = {"model": "tiny", "prompt": "def f(x):\n", "max_tokens": 40, "temperature": 0,
                "prediction": {"type": "content", "content": prediction}}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    answer = completion(server, max_tokens=40).json()["choices"][0]["text"]
    same = ask(answer)
    assert same["choices"][0]["text"] == answer
    details = same["usage"]["completion_tokens_details"]
    assert details["rejected_prediction_tokens"] == 0 and details["accepted_prediction_tokens"] > 0, details
    disjoint = ask("\u00e9\u00e8" * 20)["usage"]["completion_tokens_details"]
    assert disjoint["accepted_prediction_tokens"] == 0 and disjoint["rejected_prediction_tokens"] > 0, disjoint
    half = ask(answer[: len(answer) // 2] + "\u00e9\u00e8" * 10)["usage"]["completion_tokens_details"]
    assert half["accepted_prediction_tokens"] > 0 and half["rejected_prediction_tokens"] > 0, half
    assert half["accepted_prediction_tokens"] < details["accepted_prediction_tokens"]
    print("prediction equal to the answer: tokens per round",
          same["usage"]["suffixspec"]["tokens_per_round"], "rounds", same["usage"]["suffixspec"]["rounds"])
