"""What every request check shares: the HTTP error (`APIError`, answered as an OpenAI error object),
the 400 naming a parameter (`bad`), message contents as text, and the refusal of text that cannot
fit the model's context before it is tokenized.
"""

from __future__ import annotations

__all__ = ["APIError", "bad", "text_content", "fits"]


class APIError(Exception):
    """An HTTP error answered with an OpenAI-style error object."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _error_type(status)
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _error_type(status: int) -> str:
    return {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            429: "rate_limit_error", 503: "service_unavailable"}.get(
        status, "invalid_request_error" if 400 <= status < 500 else "server_error")


def bad(message: str, param: str | None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def text_content(content, name: str) -> str:
    """A message or prediction content: a string or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"{name}[{i}]: expected a text part {{\"type\": \"text\", \"text\": \"...\"}}, got {part!r}",
                          name, "invalid_type")
            parts.append(part["text"])
        return "".join(parts)
    raise bad(f"{name}: expected a string or a list of text parts, got {type(content).__name__}", name, "invalid_type")


def fits(ctx, text: str, param: str) -> None:
    """Refuse text that cannot fit the model's context before tokenizing it: tokenizing a huge prompt
    would hold this request's worker and memory only to refuse it after."""
    if ctx.max_positions is None or not hasattr(ctx.tokenizer, "fewest_tokens"):
        return
    fewest = ctx.tokenizer.fewest_tokens(text)
    if fewest >= int(ctx.max_positions):
        raise bad(f"{param}: {len(text)} characters make at least {fewest} tokens, more than the model's context "
                  f"of {ctx.max_positions} positions", param, "context_length_exceeded")


