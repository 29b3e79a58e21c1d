"""`suffixspec.http`: the OpenAI-compatible HTTP server behind `suffixspec serve`.

Importing this package imports nothing heavy; its modules are:

* `protocol`: request parsing and validation (OpenAI completions and chat completions bodies, the
  `suffixspec` extension object), `APIError` (an OpenAI-style error object with its HTTP status), and
  the response, chunk and usage shapes.
* `text`: incremental detokenization of committed tokens (no broken multi-byte characters, stop
  strings held back and cut).
* `chat`: the model's chat template (from a file, a model directory or a GGUF), rendered with jinja2.
* `fim`: fill-in-the-middle token families and prompt building.
* `engine_loop`: the one engine thread that owns the `engine.engine.Engine`, request handles, the bounded
  queue, cancellation, drain and health.
* `metrics`: the Prometheus metrics (prometheus-client, a registry of the server's own).
* `limits`: what a body must be before it is parsed (size, read deadline, Content-Type, UTF-8, nesting,
  lone surrogates).
* `connection`: uvicorn's h11 connection with a deadline on each request's head.
* `app`: the Starlette application (routes, authentication, server-sent events); imports the web stack.
"""
