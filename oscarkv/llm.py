"""The offline API: ``LLM(model, kv="oscar", rotations=DIR).generate(prompts, params)``.

Role: load a model (``oscarkv.models.loader``) or take an already loaded one, find its
artifact (``oscarkv.calibrate.default.artifact_for``), build an
:class:`~oscarkv.engine.engine.LLMEngine`, and run a list of prompts to completion with
continuous batching. Results come back in prompt order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from oscarkv.calibrate.default import artifact_for
from oscarkv.config import CACHE_DIR, EngineConfig
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import RequestOutput, SamplingParams
from oscarkv.models.loader import load_model
from oscarkv.quant.artifact import Artifact, describe_recipe, recipe_with

log = logging.getLogger("oscarkv")


class LLM:
    """Offline batch generation over the paged engine."""

    def __init__(self, model="default", kv: str = "oscar", rotations: str | Path | None = None,
                 config: EngineConfig | None = None, dtype: str = "auto", artifact: Artifact | None = None,
                 tensor_parallel_size: int | None = None, device: str = "auto", cache_dir: Path = CACHE_DIR,
                 recipe_overrides: dict | None = None) -> None:
        """``model``: a spec for :func:`~oscarkv.models.loader.load_model` or a ``LoadedModel``;
        ``kv`` overrides ``config.kv.method``; ``rotations``: the artifact directory for ``oscar``
        (or ``artifact``, one already loaded); without either, the default model's shipped artifact, or for
        another model one calibrated once (a progress bar on stderr) and cached under ``cache_dir`` by the
        model's fingerprint, which the next ``LLM`` of that model reuses (``oscarkv.calibrate.default``);
        ``tensor_parallel_size`` overrides ``config.tensor_parallel_size`` (ranks > 1 are worker
        processes until :meth:`close`; they are spawned and import the main module, so a script that
        builds this needs the ``if __name__ == "__main__":`` guard). Without ``config``, an OSCAR
        artifact's recipe (the windows ``oscarkv calibrate --max-bpe`` chose, in its manifest) sets
        the windows; the line describing them is logged at start-up and kept as ``self.recipe``.
        ``recipe_overrides``: ``KVConfig`` fields set over that recipe, as the flags do (``{"sink": 64}`` widens
        the sink and keeps the per-head bits; ``key_bits``/``value_bits`` replace the allocation).
        ``device``: where a model named by a spec runs (:data:`oscarkv.config.DEVICES`; ``auto``: the
        first CUDA device when one is visible); a ``LoadedModel`` runs where its weights are."""
        if config is not None and recipe_overrides:
            raise ValueError("LLM: recipe_overrides set fields over the artifact's recipe, which serves only without "
                             "config; set them in config.kv instead")
        if isinstance(model, str):
            tp = tensor_parallel_size or (config or EngineConfig()).tensor_parallel_size
            model = load_model(model, dtype, device=device, tensor_parallel_size=tp)
        artifact = artifact if artifact is not None else artifact_for(model, kv, rotations, cache_dir)
        kv_cfg = replace((config or EngineConfig()).kv, method=kv)
        kv_cfg = recipe_with(kv_cfg, artifact, recipe_overrides or {}) if config is None else kv_cfg
        config = replace(config or EngineConfig(), kv=kv_cfg)
        if tensor_parallel_size is not None:
            config = replace(config, tensor_parallel_size=tensor_parallel_size)
        self.recipe = describe_recipe(kv_cfg, artifact)
        log.info("%s", self.recipe)
        self.loaded = model
        self.engine = LLMEngine.from_hf(model.model, config, artifact, model.tokenizer, device=model.runs_on)
        self._next_id = 0

    def close(self) -> None:
        """Stop the engine's tensor-parallel workers, if any (also on leaving a ``with`` block)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def chat_prompt(self, message: str) -> str:
        """``message`` as one user turn in the tokenizer's chat template (unchanged without one)."""
        tok = self.loaded.tokenizer
        if not getattr(tok, "chat_template", None):
            return message
        return tok.apply_chat_template([{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True)

    def generate(self, prompts: str | list[str] | list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; one output per prompt, in order. A prompt the engine
        refuses raises its ``ValueError`` before anything runs; a request whose step failed comes
        back with ``finish_reason == "error"``."""
        done: dict[str, RequestOutput] = {}
        ids = self._add(prompts, params)
        for out in self._steps():
            if out.finished:
                done[out.request_id] = out
        return [done[i] for i in ids]

    def stream(self, prompts: str | list[str] | list[list[int]],
               params: SamplingParams | list[SamplingParams] | None = None) -> Iterator[RequestOutput]:
        """Every prompt run to completion, yielding each request's output after every step it advanced
        (``new_text`` holds the text it added; the last has ``finished``)."""
        self._add(prompts, params)
        yield from self._steps()

    def _add(self, prompts, params) -> list[str]:
        """Queue the prompts (all or none: a refused prompt raises before anything runs)."""
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
        return ids

    def _steps(self) -> Iterator[RequestOutput]:
        while self.engine.has_unfinished():
            yield from self.engine.step()
