"""oscarkv: INT2 KV cache with offline attention-aware rotations (OSCAR) for long-context serving."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy: importing oscarkv must not import transformers.
    if name == "OscarCache":
        from oscarkv.cache.hf_cache import OscarCache

        return OscarCache
    if name == "LLM":
        from oscarkv.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from oscarkv.engine.request import SamplingParams

        return SamplingParams
    raise AttributeError(name)
