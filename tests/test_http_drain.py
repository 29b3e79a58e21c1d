"""The end of a drain, with real clients mid-stream: a `suffixspec serve` process (the tiny model, one
slot, a grace period of zero) gets SIGTERM while one completion streams, one chat completion streams
and two non-streaming requests wait for the slot. When the grace period ends every stream ends with a
chunk whose finish reason is "abort", an SSE error object and `data: [DONE]`; every non-streaming
request gets 503 with an OpenAI error object; the process exits with status 0."""

import asyncio
import json
import signal

import httpx

from support.http import ServerProcess, make_tiny_model_dir

PROMPT = "def g(a):\n    return a + 1\n"


def body(stream: bool, chat=False) -> dict:
    b = {"model": "tiny", "max_tokens": 400, "temperature": 0, "stream": stream, "suffixspec": {"budget": 0}}
    if chat:
        b["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        b["prompt"] = PROMPT
    return b


async def read_stream(response) -> list:
    """Every `data:` event of an SSE response: chunks as dicts, `[DONE]` as the string."""
    events = []
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            events.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
    return events


def test_the_end_of_the_grace_period_tells_every_client(tmp_path):
    from support import tiny_models  # noqa: F401  (one torch thread, as the server)

    server = ServerProcess(["--model", str(make_tiny_model_dir(tmp_path / "tiny")), "--max-batch", "1",
                            "--grace-period", "0"], tmp_path / "server.log")

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            async with http.stream("POST", "/v1/completions", json=body(True)) as running, \
                    http.stream("POST", "/v1/chat/completions", json=body(True, chat=True)) as queued_stream:
                assert running.status_code == queued_stream.status_code == 200
                lines = running.aiter_lines()
                while not (await lines.__anext__()).startswith("data: "):  # the running one has begun
                    pass
                waiting = [asyncio.ensure_future(http.post("/v1/completions", json=body(False))) for _ in range(2)]
                await asyncio.sleep(0.3)  # their handlers have submitted them
                server.proc.send_signal(signal.SIGTERM)
                rest = []
                async for line in lines:
                    if line.startswith("data: "):
                        rest.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
                return rest, await read_stream(queued_stream), await asyncio.gather(*waiting)

    try:
        running, queued, waiting = asyncio.run(scenario())
        code = server.proc.wait(30)
    finally:
        server.stop()
    assert code == 0, server.log()
    for events in (running, queued):
        assert events[-1] == "[DONE]", events[-3:]
        assert events[-2]["error"]["code"] == "aborted" and events[-2]["error"]["type"] == "service_unavailable"
        assert events[-3]["choices"][0]["finish_reason"] == "abort", events[-3:]
        assert all(e["choices"][0]["finish_reason"] is None for e in events[:-3]), events
    for r in waiting:
        assert r.status_code == 503 and r.json()["error"]["code"] == "aborted", r.text
    assert "grace period over" in server.log()
