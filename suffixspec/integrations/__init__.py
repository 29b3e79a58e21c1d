"""Adapters that plug suffixspec's proposer into other serving engines.

- `suffixspec.integrations.vllm.SuffixSpecProposer`: a vLLM `custom_class` speculative proposer.

Importing this package imports nothing but itself; each adapter imports only suffixspec and
numpy/numba, never the engine it serves (the engine passes its objects in).
"""
