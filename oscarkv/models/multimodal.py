"""Text only from a multimodal checkpoint: Gemma 3's ``Gemma3ForConditionalGeneration`` (4B and larger).

Role: :func:`oscarkv.models.loader.load_model` hands such a model directory here. Its ``config.json`` is a
``Gemma3Config`` holding a ``text_config`` (a ``Gemma3TextConfig``) and a ``vision_config``; what oscarkv
serves is the language model alone, a ``Gemma3ForCausalLM`` built from ``text_config``
(:func:`text_config`), so calibration, ``OscarCache``, evaluation and the paged engine see the same text
model as for the 1B checkpoint (its sliding layers windowed the same way). Image inputs are refused by
the server.

The language-model weights are read by name from the safetensors headers (:func:`text_weights`); the
vision tower and the projector are never read from disk. Checkpoints name them in one of the two layouts
transformers 5 reads (``conversion_mapping``'s ``llava`` renames for ``gemma3``):

* ``language_model.model.*`` (+ ``language_model.lm_head.weight``), as Google published them and as
  transformers 5 saves them;
* ``model.language_model.*`` (+ ``lm_head.weight``), as transformers 4.52-4.57 saved them.

Both map to the text model's ``model.*`` / ``lm_head.*`` (:data:`LANGUAGE_PREFIXES`).

The tokenizer's chat template may live in the processor's ``chat_template.json`` only, which transformers'
tokenizer does not read (:func:`load_tokenizer` does).
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

TEXT_ONLY = {"Gemma3ForConditionalGeneration": "Gemma3ForCausalLM"}
"""Multimodal architecture → the text architecture served in its place."""

LANGUAGE_PREFIXES = (("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
                     ("model.language_model.", "model."), ("lm_head.", "lm_head."))
"""Checkpoint prefix → text model prefix; every other tensor (``vision_tower``, ``multi_modal_projector``)
is left on disk."""

_SHARED_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def is_text_only(config) -> bool:
    """Whether ``config`` is a multimodal config of which oscarkv serves the text model only."""
    return (getattr(config, "architectures", None) or [None])[0] in TEXT_ONLY


def text_config(config):
    """The text model's config of the multimodal ``config``: ``config.text_config`` with the text
    architecture, and the special token ids the outer config sets (Gemma 3 4B's ``eos_token_id`` is
    ``[1, 106]`` there, ``<end_of_turn>`` included).

    NOTE: transformers' ``Gemma3ForConditionalGeneration`` computes its logits without
    ``final_logit_softcapping`` (``Gemma3ForCausalLM`` applies it); the text model here computes them as
    the multimodal model does (the published configs set it to null, so both agree on them)."""
    text = copy.deepcopy(config.text_config)
    text.architectures = [TEXT_ONLY[config.architectures[0]]]
    text.final_logit_softcapping = None
    for name in _SHARED_IDS:
        if getattr(config, name, None) is not None:
            setattr(text, name, getattr(config, name))
    return text


def text_name(name: str) -> str | None:
    """The text model's name of checkpoint tensor ``name``, or ``None`` for a tensor not loaded."""
    for prefix, to in LANGUAGE_PREFIXES:
        if name.startswith(prefix):
            return to + name.removeprefix(prefix)
    return None


def text_weights(path: Path, files: dict[str, str]) -> dict[str, torch.Tensor]:
    """The language model's tensors under their text-model names, read from the directory's safetensors
    (``files``: checkpoint name → file, :func:`~oscarkv.models.loader.scan_weights`); nothing else is read."""
    from safetensors import safe_open

    by_file: dict[str, list[str]] = {}
    for name, file in files.items():
        if text_name(name) is not None:
            by_file.setdefault(file, []).append(name)
    state = {}
    for file, names in sorted(by_file.items()):
        with safe_open(str(path / file), "pt") as h:
            state |= {text_name(n): h.get_tensor(n) for n in names}
    return state


def load_text_model(path: Path, config, files: dict[str, str], dtype: torch.dtype = torch.float32):
    """``(model, loading info)``: the text model of the multimodal ``config`` in ``path`` (in ``dtype``), its
    weights only those of the language model; ``info`` as transformers reports it (missing, mismatched)."""
    import transformers

    log.info("%s at %s: text only: the vision tower is not loaded", config.architectures[0], path)
    text = text_config(config)
    model_class = getattr(transformers, text.architectures[0])
    return model_class.from_pretrained(None, config=text, state_dict=text_weights(path, files), dtype=dtype,
                                       output_loading_info=True, ignore_mismatched_sizes=True)


def text_files(files: dict[str, str]) -> dict[str, str]:
    """``files`` (checkpoint name → file) under the text model's names, for error messages."""
    return {text_name(n): f for n, f in files.items() if text_name(n) is not None}


def load_tokenizer(path: Path):
    """The directory's tokenizer, its chat template taken from the processor's ``chat_template.json`` where the
    tokenizer's own files hold none (transformers reads that file for the processor only)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    processor_template = path / "chat_template.json"
    if not getattr(tok, "chat_template", None) and processor_template.is_file():
        tok.chat_template = json.loads(processor_template.read_text())["chat_template"]
    return tok
