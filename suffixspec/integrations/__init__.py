"""Adapters that plug suffixspec's proposer into other serving engines.

- `suffixspec.integrations.vllm.SuffixSpecProposer`: a vLLM `custom_class` speculative proposer.
- `suffixspec.integrations.llama_cpp.SuffixSpecDraftModel`: a llama-cpp-python draft model
  (`Llama(draft_model=...)`), its `LlamaDraftModel` base imported on first access of the name.

Importing this package imports nothing but itself; each adapter imports only suffixspec and
numpy/numba, never the engine it serves (the engine passes its objects in).
"""
