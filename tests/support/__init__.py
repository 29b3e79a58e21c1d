"""Helpers shared by the tests (and by the bench harnesses that drive a server as the tests do):
brute-force references (`naive`), tiny random models and stand-in proposers (`tiny_models`), a real
`suffixspec serve` on loopback with a tiny model (`http`), raw-socket HTTP clients (`sockets`).
Tests import them as `support.<module>`; bench scripts through `bench/common.load_test_support`."""
