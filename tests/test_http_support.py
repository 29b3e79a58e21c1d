"""Unit tests of the HTTP server's pieces that need no server: incremental detokenization with stop
strings, the GGUF chat-template reader, FIM prompts, request checking (the server helpers of the
HTTP tests are in `support/http.py`)."""

from pathlib import Path

import pytest

# ----------------------------------------------------------------------------------- unit tests


def test_text_assembler_holds_back_partial_characters_and_stop_strings():
    from suffixspec.http.text import TextAssembler

    data = "héllo wörld STOP tail".encode()
    # one byte per token: a decoder of byte ids, replacing incomplete UTF-8 like a tokenizer does
    decode = lambda ids: bytes(ids).decode("utf-8", errors="replace")  # noqa: E731
    asm = TextAssembler(decode, stops=["STOP"], eos=[])
    pieces = []
    end = data.index(b"STOP") + 4
    for b in data[: end - 1]:
        piece = asm.feed([b])
        assert "\ufffd" not in piece
        pieces.append(piece)
    assert "".join(pieces) == "héllo wörld "  # "STO" held back as it grew
    pieces.append(asm.finish("stop", [data[end - 1]]))  # the round that completes "STOP" ends the request
    assert "".join(pieces) == asm.text() == "héllo wörld "


def test_text_assembler_drops_the_eos_token_and_releases_a_false_stop_start():
    from suffixspec.http.text import TextAssembler

    decode = lambda ids: "".join(chr(i) for i in ids)  # noqa: E731
    asm = TextAssembler(decode, stops=["ab"], eos=[ord("$")])
    assert asm.feed([ord("x"), ord("a")]) == "x"  # "a" may start "ab"
    assert asm.feed([ord("c")]) == "ac"
    assert asm.finish("eos") == "" and asm.text() == "xac"
    asm = TextAssembler(decode, stops=[], eos=[ord("$")])
    assert asm.feed([ord("q")]) == "q"
    assert asm.finish("eos", [ord("r"), ord("$")]) == "r"
    assert asm.text() == "qr"
    asm = TextAssembler(decode, stops=["ab"], eos=[])
    assert asm.feed([ord("x"), ord("a"), ord("b"), ord("c")]) == "x"  # a whole stop string is never sent


def test_gguf_chat_template_reader_matches_the_gguf_package():
    import tempfile

    from gguf import GGUFWriter

    from suffixspec.http.chat import gguf_string_field

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        w = GGUFWriter(str(path), "llama")
        w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
        w.add_uint32("x.count", 7)
        w.add_string("tokenizer.chat_template", "{{ messages }}é")
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.close()
        assert gguf_string_field(path, "tokenizer.chat_template") == "{{ messages }}é"
        assert gguf_string_field(path, "missing.key") is None


def test_fim_prompt_and_missing_tokens(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from suffixspec import load_tokenizer
    from suffixspec.http import fim

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<fim_prefix>", "<fim_middle>", "<fim_suffix>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["def f(x):\n    return x\n"], trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    t = load_tokenizer(tmp_path)
    ids = fim.fim_tokens(t)
    assert ids == (0, 2, 1)  # StarCoder family: prefix, suffix, middle
    prompt = fim.fim_prompt(t, ids, "def f(", "):\n")
    assert prompt[0] == 0 and prompt[-1] == 1 and 2 in prompt
    assert prompt == [0, *t.encode("def f("), 2, *t.encode("):\n"), 1]
    assert "<|fim_prefix|>" in fim.missing_message()
    assert fim.fim_end_tokens(t) == (0, 1, 2)  # the family's own tokens end a middle too


def test_a_fim_request_also_stops_at_the_family_end_tokens(tmp_path):
    """Qwen2.5-Coder writes <|endoftext|> (or opens another file) after a middle, while its chat end
    token is <|im_end|>: a request with `suffix` stops at those; one without does not."""
    from suffixspec import load_tokenizer
    from suffixspec.http import fim
    from suffixspec.http.protocol import ModelContext, parse_request

    from support.http import make_tiny_model_dir

    t = load_tokenizer(make_tiny_model_dir(tmp_path / "tiny"))
    ends = fim.fim_end_tokens(t)
    named = {t.backend.id_to_token(i) for i in ends}
    assert {"<|endoftext|>", "<|fim_pad|>", "<|fim_prefix|>"} <= named and "<|im_end|>" not in named
    ctx = ModelContext(names=["m"], tokenizer=t, vocab_size=t.backend.get_vocab_size(), max_positions=512,
                       max_new_tokens_limit=32, fim_ids=fim.fim_tokens(t), fim_end_ids=ends)
    body = {"model": "m", "prompt": "def f(", "max_tokens": 8, "stop_token_ids": [5]}
    with_suffix = parse_request(dict(body, suffix="):\n"), "completion", ctx)
    without = parse_request(body, "completion", ctx)
    assert set(with_suffix.options.stop_token_ids) == {5, *ends}
    assert tuple(without.options.stop_token_ids) == (5,)


def test_parse_request_errors_name_the_parameter():
    from suffixspec.http.protocol import APIError, ModelContext, parse_request

    class Tok:
        def encode(self, text):
            return [ord(c) % 50 for c in text]

    ctx = ModelContext(names=["m"], tokenizer=Tok(), vocab_size=50, max_positions=64, max_new_tokens_limit=32)
    good = {"model": "m", "prompt": "hello", "max_tokens": 8}
    req = parse_request(good, "completion", ctx)
    assert req.prompt_ids == Tok().encode("hello") and req.max_tokens == 8 and req.options.do_sample
    assert not parse_request({**good, "temperature": 0}, "completion", ctx).options.do_sample
    cases = [({"prompt": "x", "max_tokens": 1}, "model"), ({**good, "model": "other"}, "model"),
             ({**good, "prompt": ""}, "prompt"), ({**good, "prompt": [1, 99]}, "prompt"),
             ({**good, "max_tokens": 60}, "max_tokens"), ({**good, "max_tokens": "8"}, "max_tokens"),
             ({**good, "temperature": -0.5}, "temperature"), ({**good, "top_p": 0}, "top_p"),
             ({**good, "top_p": 1.5}, "top_p"), ({**good, "n": 17}, "n"), ({**good, "stop": ["a"] * 5}, "stop"),
             ({**good, "suffix": "x"}, "suffix"), ({**good, "logit_bias": {"77": 1}}, "logit_bias"),
             ({**good, "suffixspec": {"budget": -1}}, "suffixspec.budget"), ("[1]", None),
             ({**good, "suffixspec": {"filter": {"repo": "x"}}}, "suffixspec.filter")]
    for body, param in cases:
        with pytest.raises(APIError) as info:
            parse_request(body, "completion", ctx)
        assert info.value.status == 400 and info.value.param == param, (body, info.value.body())
    with pytest.raises(APIError) as info:
        parse_request({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "chat", ctx)
    assert info.value.param == "messages" and "chat template" in info.value.message
