"""A stand-in of vLLM 0.34's speculator interface (no vLLM needed), written from its source
(vllm-0.34.0 wheel: `v1/worker/gpu/spec_decode/speculator_config.py`, `speculator.py`,
`__init__.py`; `v1/worker/gpu/states.py`; `v1/worker/gpu/model_runner.py`): the modules a plugin and
a speculator import, as files of a fake `vllm` package of a given version."""

from pathlib import Path

FILES = {
    "vllm/__init__.py": "",
    "vllm/version.py": "__version__ = {version!r}\n",
    "vllm/v1/__init__.py": "",
    "vllm/v1/worker/__init__.py": "",
    "vllm/v1/worker/gpu/__init__.py": "",
}
FILES_034 = {
    "vllm/v1/worker/gpu/spec_decode/__init__.py": '''
import importlib, inspect

def resolve_obj_by_qualname(qualname):
    module, name = qualname.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)

def init_speculator(vllm_config, device, req_states):
    from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator
    cls = resolve_obj_by_qualname(vllm_config.speculative_config.speculator_config.speculator_class)
    if not (isinstance(cls, type) and issubclass(cls, BaseSpeculator)):
        raise TypeError("speculator_class must be a BaseSpeculator subclass")
    if "req_states" in inspect.signature(cls).parameters:
        return cls(vllm_config, device, req_states=req_states)
    return cls(vllm_config, device)
''',
    "vllm/v1/worker/gpu/spec_decode/speculator_config.py": '''
from typing import ClassVar

class SpeculatorConfig:
    base_method: ClassVar = None
    speculator_class: ClassVar = None
    supported_options: ClassVar = frozenset()
    prefer_dense_token_history: ClassVar = False
    adaptive_verification_uses_draft_logits: ClassVar = True

    @classmethod
    def configure(cls, spec):
        spec.prompt_lookup_max = 0
        spec.prompt_lookup_min = 0
        spec.draft_model_config = spec.target_model_config

    def __init__(self, spec_config):
        self.spec_config = spec_config

_CUSTOM_CONFIGS = {}
REGISTER_CALLS = []

def register_speculative_method(name, config_cls):
    REGISTER_CALLS.append((name, config_cls))
    if name in ("ngram", "suffix", "eagle", "draft_model"):
        raise ValueError(f"'{name}' is a built-in speculative method.")
    if name in _CUSTOM_CONFIGS and _CUSTOM_CONFIGS[name] != config_cls:
        raise ValueError(f"Speculative method '{name}' is already registered.")
    _CUSTOM_CONFIGS[name] = config_cls

def get_custom_speculator_config_class(method):
    from vllm.v1.worker.gpu.spec_decode import resolve_obj_by_qualname
    if method not in _CUSTOM_CONFIGS:
        return None
    cls = _CUSTOM_CONFIGS[method]
    if isinstance(cls, str):
        cls = resolve_obj_by_qualname(cls)
    if not (isinstance(cls, type) and issubclass(cls, SpeculatorConfig)):
        raise TypeError("must be a SpeculatorConfig subclass")
    if cls.speculator_class is None:
        raise ValueError("must set speculator_class")
    return cls
''',
    "vllm/v1/worker/gpu/spec_decode/speculator.py": '''
from abc import ABC, abstractmethod

class BaseSpeculator(ABC):
    num_query_per_req = 1
    supports_mm_inputs = False
    draft_logits = None

    @abstractmethod
    def init_cudagraph_manager(self, cudagraph_mode): ...

    @abstractmethod
    def capture(self): ...

    @abstractmethod
    def propose(self, input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states, num_sampled,
                num_rejected, last_sampled, next_prefill_tokens, temperature, seeds, dp_sync_state=None,
                dummy_run=False, skip_attn_for_dummy_run=False, mm_inputs=None, is_profile=False,
                num_speculative_tokens=None): ...

    def add_request(self, req_index): return

    def on_requests_finished(self, finished_req_ids): return

    def reset_state(self): return

    def update_max_model_len(self, max_model_len): return
''',
}


def write_fake_vllm(root: Path, version: str) -> Path:
    """A fake `vllm` package of `version` under `root` (0.34's speculator modules from 0.34 on)."""
    files = dict(FILES)
    major, minor = (int(x) for x in version.split(".")[:2]) if version[0].isdigit() else (0, 0)
    if (major, minor) >= (0, 34):
        files.update(FILES_034)
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.format(version=version) if rel.endswith("version.py") else text)
    return root
