"""The offline API: ``LLM(model, kv="oscar", rotations=DIR).generate(prompts, params)``.

Role: load a model (``oscarkv.models.loader``) or take an already loaded one, build an
:class:`~oscarkv.engine.engine.LLMEngine`, and run a list of prompts to completion with
continuous batching. Results come back in prompt order.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from oscarkv.config import EngineConfig
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import RequestOutput, SamplingParams


def load_artifact(loaded, kv: str, rotations: str | Path | None):
    """The validated rotation artifact for ``kv == "oscar"`` (``None`` otherwise).

    The default model falls back to its cached calibration (``oscarkv calibrate`` once)."""
    if kv != "oscar":
        return None
    from oscarkv.quant.artifact import Artifact, ModelFingerprint

    fp = ModelFingerprint.from_config(loaded.config)
    if rotations is not None:
        return Artifact.load(Path(rotations), expect=fp)
    if Path(loaded.source).name.endswith(".gguf") and "SmolLM2-135M" in Path(loaded.source).name:
        from oscarkv.cli import DEFAULT_CACHE
        from oscarkv.cli_commands import default_artifact

        return default_artifact(loaded, DEFAULT_CACHE)
    raise ValueError("kv='oscar' needs rotations=DIR (make one with: oscarkv calibrate --out DIR)")


class LLM:
    """Offline batch generation over the paged engine."""

    def __init__(self, model="default", kv: str = "oscar", rotations: str | Path | None = None,
                 config: EngineConfig | None = None, dtype: str = "auto") -> None:
        """``model``: a spec for :func:`~oscarkv.models.loader.load_model` or a ``LoadedModel``;
        ``kv`` overrides ``config.kv.method``; ``rotations``: the artifact directory for ``oscar``."""
        if isinstance(model, str):
            from oscarkv.cli_commands import DTYPES, auto_dtype
            from oscarkv.models.loader import load_model

            model = load_model(model, DTYPES[auto_dtype() if dtype == "auto" else dtype])
        config = config or EngineConfig()
        config = replace(config, kv=replace(config.kv, method=kv))
        self.loaded = model
        self.engine = LLMEngine.from_hf(model.model, config, load_artifact(model, kv, rotations), model.tokenizer)
        self._next_id = 0

    def generate(self, prompts: str | list[str] | list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; one output per prompt, in order. A prompt the engine
        refuses raises its ``ValueError`` before anything runs; a request whose step failed comes
        back with ``finish_reason == "error"``."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params or SamplingParams()
        params = params if isinstance(params, list) else [params] * len(prompts)
        ids = []
        try:
            for prompt, p in zip(prompts, params):
                ids.append(f"llm-{self._next_id}")
                self._next_id += 1
                self.engine.add_request(ids[-1], prompt, p)
        except ValueError:
            for i in ids:  # none of this batch stays queued
                self.engine.abort(i)
            raise
        done: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
        return [done[i] for i in ids]
