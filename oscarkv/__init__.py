"""oscarkv: INT2 KV cache with offline attention-aware rotations (OSCAR) for long-context serving.

The package's face: ``LLM``, ``SamplingParams``, ``OscarCache`` and ``__version__``, imported
lazily (``import oscarkv`` imports neither torch nor transformers).
"""

from oscarkv.config import __version__

__all__ = ["LLM", "OscarCache", "SamplingParams", "__version__"]


def __getattr__(name: str):
    if name == "OscarCache":
        from oscarkv.cache.hf_cache import OscarCache

        return OscarCache
    if name == "LLM":
        from oscarkv.llm import LLM

        return LLM
    if name == "SamplingParams":
        from oscarkv.engine.request import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'oscarkv' has no attribute {name!r}")
