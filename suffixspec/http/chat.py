"""The model's chat template: found once at start-up, rendered per request with jinja2.

Contract:

* `find_chat_template(model_spec, template_file=None) -> (source, where)`: the template text and
  where it came from. `template_file` (the `--chat-template FILE` flag) wins; else a model directory's
  `chat_template.jinja` or `tokenizer_config.json` `chat_template` (a string, or a list of named
  templates: "default" first); else a GGUF's `tokenizer.chat_template` metadata (the embedded default
  model's included), read by `gguf_string_field` without parsing the rest of the file. `(None, "")`
  when the model carries none.
* `ChatTemplate(source, tokenizer)`: `render(messages, tools=None, add_generation_prompt=True) -> str`,
  the prompt text of the conversation with the assistant's turn opened (unless told not to: a prefill
  continues the last message), `tools` given to templates that take them (`takes_tools`), rendered in jinja2's sandbox
  (templates are data). Template errors become `ChatTemplateError` (a `BadInputError`) with jinja2's message.
* `chatml_template()`: the ChatML form (`<|im_start|>role\\ncontent<|im_end|>\\n`...), the fallback for
  tokenizers that hold `<|im_start|>` but carry no template.
* `chat_template_for(found, tokenizer) -> (ChatTemplate | None, where)`: what `find_chat_template`
  found, else that fallback, loaded: the one template choice of `suffixspec serve` and
  `suffixspec generate --chat`.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

from ..errors import BadInputError

__all__ = ["ChatTemplate", "ChatTemplateError", "find_chat_template", "gguf_string_field", "chatml_template",
           "chat_template_for"]

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


class ChatTemplateError(BadInputError):
    """A chat template failed to load or to render (a ValueError)."""


def chatml_template() -> str:
    return CHATML


def chat_template_for(found: tuple[str | None, str], tokenizer) -> tuple[ChatTemplate | None, str]:
    """`found` (`find_chat_template`'s answer) loaded, else ChatML when the tokenizer holds `<|im_start|>`;
    `(None, "")` when neither."""
    from .fim import token_id

    source, where = found
    if source is None and token_id(tokenizer, "<|im_start|>") is not None:
        source, where = CHATML, "ChatML (the tokenizer has <|im_start|>, the model no template)"
    return (ChatTemplate(source, tokenizer), where) if source else (None, "")


def find_chat_template(model_spec, template_file=None) -> tuple[str | None, str]:
    if template_file is not None:
        try:
            return Path(template_file).read_text(encoding="utf-8"), str(template_file)
        except OSError as exc:
            raise ChatTemplateError(f"--chat-template: cannot read {str(template_file)!r}: {exc}",
                                    param="--chat-template") from None
    if model_spec is None or (isinstance(model_spec, str) and model_spec.strip().lower() in ("default", "smollm2")):
        from ..tokenizer import default_gguf_path

        path = default_gguf_path()
    else:
        path = Path(model_spec).expanduser()
    if path.is_dir():
        jinja = path / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8"), str(jinja)
        config = path / "tokenizer_config.json"
        if config.is_file():
            try:
                template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
            except (OSError, ValueError) as exc:
                raise ChatTemplateError(f"{str(config)!r}: not readable JSON: {exc}") from None
            if isinstance(template, list):  # named templates
                named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
                template = named.get("default") or next(iter(named.values()), None)
            if isinstance(template, str) and template:
                return template, str(config)
        return None, ""
    if path.is_file() and path.suffix.lower() == ".gguf":
        template = gguf_string_field(path, "tokenizer.chat_template")
        return (template, str(path)) if template else (None, "")
    return None, ""


# ----------------------------------------------------------------------------------- GGUF metadata

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def gguf_string_field(path, key: str) -> str | None:
    """The string value of metadata `key` in the GGUF file `path` (None when absent). Walks the
    key/value section only, skipping arrays (the vocabulary) by their lengths."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ChatTemplateError(f"{str(path)!r} is not a GGUF file")
        version = struct.unpack_from("<I", buf, 4)[0]
        wide = version >= 2  # version 1 used 32-bit counts and lengths
        count_fmt = "<Q" if wide else "<I"
        step = 8 if wide else 4
        pos = 8 + step  # magic, version, tensor count
        n_kv = struct.unpack_from(count_fmt, buf, pos)[0]
        pos += step

        def string(at: int) -> tuple[bytes, int]:
            n = struct.unpack_from(count_fmt, buf, at)[0]
            return buf[at + step : at + step + n], at + step + n

        def skip(kind: int, at: int) -> int:
            if kind in _SCALAR:
                return at + struct.calcsize(_SCALAR[kind])
            if kind == _STRING:
                return string(at)[1]
            if kind == _ARRAY:
                inner = struct.unpack_from("<I", buf, at)[0]
                n = struct.unpack_from(count_fmt, buf, at + 4)[0]
                at += 4 + step
                if inner in _SCALAR:
                    return at + n * struct.calcsize(_SCALAR[inner])
                for _ in range(n):
                    at = skip(inner, at)
                return at
            raise ChatTemplateError(f"{str(path)!r}: unknown GGUF value type {kind}")

        for _ in range(n_kv):
            name, pos = string(pos)
            kind = struct.unpack_from("<I", buf, pos)[0]
            pos += 4
            if name.decode("utf-8", "replace") == key and kind == _STRING:
                return string(pos)[0].decode("utf-8")
            pos = skip(kind, pos)
    return None


# ----------------------------------------------------------------------------------- rendering


class ChatTemplate:
    def __init__(self, source: str, tokenizer=None):
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise ChatTemplateError(f"chat template: {message}", param="messages")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from None
        self.source = source
        self.special = {"bos_token": "", "eos_token": ""}
        if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
            try:
                self.special["eos_token"] = tokenizer.decode([tokenizer.eos_token_id])
            except Exception:  # noqa: BLE001 - a template without eos_token still renders
                pass

    @property
    def takes_tools(self) -> bool:
        """Whether the template renders a `tools` variable (function tools), as tool-calling models' do."""
        return "tools" in self.source

    def render(self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True) -> str:
        """The prompt text of the conversation; `tools` (OpenAI function tools) reach a template that
        takes them; `add_generation_prompt` False leaves the last message open (no assistant turn)."""
        import jinja2

        extra = {"tools": tools} if tools else {}
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **extra, **self.special)
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError) as exc:
            raise ChatTemplateError(f"chat template failed on these messages: {exc}", param="messages") from None
