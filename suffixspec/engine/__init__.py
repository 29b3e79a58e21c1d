"""The engine: continuous batching of speculative requests, one round at a time.

- `engine`: `Engine`, the queue, admission and stepping; `round`: one round's phases and charges;
- `budget`: how much of each tree is worth a pass; `prefill`: reading prompts in chunks;
- `lifecycle`: a request's stages and session; `options`: decode options, validated once;
- `stats`: request and run statistics; `fallback`: decoding models that cannot verify trees;
- `warmup`: compiling kernels and measuring the pass cost before the clock starts.

Importing this package imports nothing.
"""
