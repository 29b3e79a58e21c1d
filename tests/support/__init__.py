"""Helpers shared by the tests (and by the bench harnesses that drive a server as the tests do):
brute-force references (`naive`), tiny random models and stand-in proposers (`tiny_models`), the
generation tests' prompts and sampled-distribution checks (`prompts`), draft-tree checks and the
exhaustive per-source candidates (`trees`), a fake bench engine and backend (`fakes`), the vLLM
adapter tests' requests (`vllm_requests`), a real `suffixspec serve` on loopback with a tiny model
(`http`), raw-socket HTTP clients (`sockets`), bench scripts loaded as modules (`harness`).
Tests import them as `support.<module>`; bench scripts through `bench/common.load_test_support`."""
