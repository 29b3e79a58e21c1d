"""A bad input names its parameter in `BadInputError.param` / `BadInputTypeError.param`: the check
helpers set it, it survives pickling, and the HTTP layer answers with it (never with a word parsed
out of the message) in the same error object as before."""

import asyncio
import json
import pickle

import httpx
import pytest


def test_check_helpers_and_options_name_the_parameter():
    from suffixspec.engine.options import DecodeOptions, check_int
    from suffixspec.errors import BadInputError, BadInputTypeError

    for call, param in [(lambda: check_int(-1, "top_k", low=0), "top_k"),
                        (lambda: check_int("3", "seed"), "seed"),
                        (lambda: DecodeOptions(temperature=-1.0), "temperature"),
                        (lambda: DecodeOptions(top_p=2.0), "top_p"),
                        (lambda: DecodeOptions(do_sample="yes"), "do_sample"),
                        (lambda: DecodeOptions(budget=-2), "budget"),
                        (lambda: DecodeOptions(stop=[""]), "stop"),
                        (lambda: DecodeOptions(stop=[[1, -1]]), "stop"),
                        (lambda: DecodeOptions(stop=3), "stop"),
                        (lambda: DecodeOptions(eos_token_id=[-1]), "eos_token_id")]:
        with pytest.raises((BadInputError, BadInputTypeError)) as info:
            call()
        assert info.value.param == param and str(info.value).startswith(param + ": "), (param, info.value)


def test_param_is_an_attribute_kept_by_pickling():
    from suffixspec.errors import BadInputError, BadInputTypeError, SuffixSpecError
    from suffixspec.http.chat import ChatTemplateError

    for cls in (BadInputError, BadInputTypeError, ChatTemplateError):
        plain = cls("something is wrong")
        assert plain.param is None and str(plain) == "something is wrong" and isinstance(plain, SuffixSpecError)
        err = cls("the value is too long", param="prompt")
        assert str(err) == "the value is too long" and err.args == ("the value is too long",)
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is cls and back.param == "prompt" and back.args == err.args


class RefusingEngine:
    """Just enough of `engine.engine.Engine` for the engine loop: `add` refuses with `error`."""

    def __init__(self, error):
        from suffixspec.engine.stats import GenerationStats

        self.error = error
        self.stats = GenerationStats(requests=[])
        self.idle, self.running = True, 0

    def add(self, prompt, **kw):
        raise self.error

    def upkeep(self):
        pass


class Tok:
    eos_token_id = None

    def encode(self, text):
        return [ord(c) % 50 for c in text]

    def decode(self, ids):
        return "".join(chr(97 + i % 26) for i in ids)


def _post(server, body):
    from suffixspec.http.app import AppState, create_app
    from suffixspec.http.engine_loop import EngineLoop
    from suffixspec.http.protocol import ModelContext

    state = AppState(["m"])
    state.ctx = ModelContext(names=["m"], tokenizer=Tok(), vocab_size=50, max_positions=64, max_new_tokens_limit=32)
    state.engine = EngineLoop(server, metrics=state.metrics)
    state.engine.start()

    async def go():
        transport = httpx.ASGITransport(app=create_app(state))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            return await http.post("/v1/completions", json=body)

    try:
        return asyncio.run(asyncio.wait_for(go(), 20))
    finally:
        state.engine.stop()


def test_a_refused_request_answers_the_errors_param_attribute():
    """The message's first word is not the parameter: the answer's param is the attribute's."""
    from suffixspec.errors import BadInputError, BadInputTypeError

    body = {"model": "m", "prompt": "hello", "max_tokens": 4, "temperature": 0}
    for error, param in [(BadInputError("too many prompt tokens: 9 of 8", param="prompt"), "prompt"),
                         (BadInputTypeError("a token is not an integer"), None)]:
        r = _post(RefusingEngine(error), body)
        assert r.status_code == 400
        assert r.content == json.dumps({"error": {"message": str(error), "type": "invalid_request_error",
                                                  "param": param, "code": None}},
                                       ensure_ascii=False, separators=(",", ":")).encode(), r.text


def test_parse_request_reads_the_options_errors_param(monkeypatch):
    from suffixspec.errors import BadInputError
    from suffixspec.http import protocol

    def refuse(**kw):
        raise BadInputError("sampling cannot use these settings", param="top_k")

    monkeypatch.setattr(protocol, "DecodeOptions", refuse)
    ctx = protocol.ModelContext(names=["m"], tokenizer=Tok(), vocab_size=50, max_positions=64, max_new_tokens_limit=32)
    with pytest.raises(protocol.APIError) as info:
        protocol.parse_request({"model": "m", "prompt": "hi", "max_tokens": 2}, "completion", ctx)
    assert info.value.body() == {"error": {"message": "sampling cannot use these settings",
                                           "type": "invalid_request_error", "param": "top_k",
                                           "code": "invalid_value"}}


def test_library_refusals_name_their_param():
    """Refusals outside the HTTP layer carry `param` too: a server's prompt and prediction, a proposer
    knob, the vLLM adapter's options."""
    from suffixspec.draft.config import ProposerConfig
    from suffixspec.draft.proposer import Proposer
    from suffixspec.errors import BadInputError, BadInputTypeError
    from suffixspec.tokenids import as_tokens

    for bad, param in [(None, "prompt"), ([1.5], "prompt"), ([-1], "prompt"), ([[1]], "prompt")]:
        with pytest.raises((BadInputError, BadInputTypeError)) as err:
            as_tokens(bad, "prompt")
        assert err.value.param == param
    with pytest.raises(BadInputError) as err:
        ProposerConfig(max_nodes=0)
    assert err.value.param == "max_nodes"
    with pytest.raises(BadInputError) as err:
        Proposer().start([1, 2, 3], filter={"lang": "py"})
    assert err.value.param == "filter"
