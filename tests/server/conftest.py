"""A tiny random Llama with a byte-level tokenizer and chat template (``tests.byte_llama``), served on a
loopback port.

Most server tests run against this model (fast on the CPU); ``offline`` gives the greedy
tokens the engine produces without HTTP, the reference the served outputs must equal.
"""

from __future__ import annotations

import pytest

from oscarkv.engine.async_engine import AsyncEngine
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import SamplingParams
from oscarkv.server.app import create_app, served_model
from oscarkv.server.launch import serving_in_thread
from oscarkv.config import ServerConfig
from tests import byte_llama
from tests.byte_llama import CHAT_TEMPLATE, SMALL, SPECIAL, byte_model, byte_tokenizer  # noqa: F401 (shared)
from tests.engine.conftest import engine_config, run

MODEL = "tiny"
tok, model, model_dir = byte_llama.tok, byte_llama.model, byte_llama.model_dir  # the fixtures, shared


def make_engine(model, tok, method: str = "bf16", artifact=None, **kw) -> LLMEngine:
    return LLMEngine.from_hf(model, engine_config(method, **kw), artifact, tok)


class Served:
    """A running server: its base URL, the async engine and the app."""

    def __init__(self, url: str, engine: AsyncEngine, app) -> None:
        self.url, self.engine, self.app = url, engine, app

    @property
    def llm(self) -> LLMEngine:
        return self.engine.engine

    def idle(self) -> bool:
        e = self.llm
        used = e.manager.bf16.num_used + (e.manager.int2.num_used if e.manager.int2 else 0)
        return not e.has_unfinished() and used == 0


def start(model, tok, cfg: ServerConfig | None = None, method: str = "bf16", artifact=None, **kw):
    """Context manager: serve ``model`` on a free loopback port; yields a :class:`Served`."""
    from contextlib import contextmanager

    @contextmanager
    def _cm():
        llm = make_engine(model, tok, method, artifact, **kw)
        engine = AsyncEngine(llm)
        scfg = cfg or ServerConfig(served_model_name=MODEL, default_max_tokens=16)
        app = create_app(engine, served_model(llm, model.config, tok, scfg.served_model_name, scfg), scfg)
        try:
            with serving_in_thread(app) as url:
                yield Served(url, engine, app)
        finally:
            engine.close()

    return _cm()


@pytest.fixture(scope="module")
def served(model, tok):
    with start(model, tok) as s:
        yield s


def offline(model, tok, prompts: list[list[int]], max_tokens: int, method: str = "bf16", artifact=None,
            ignore_eos: bool = False, **kw) -> list:
    """Greedy outputs of the engine without HTTP (a fresh engine, the same config)."""
    sp = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=ignore_eos)
    return run(make_engine(model, tok, method, artifact, **kw), prompts, sp)


def wait_idle(served: Served, timeout: float = 10.0) -> bool:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if served.idle():
            return True
        time.sleep(0.02)
    return served.idle()
