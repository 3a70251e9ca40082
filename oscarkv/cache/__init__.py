"""KV-cache storage: per-sequence tiers (sink, low-bit history, recent window).

``hf_cache`` holds :class:`~oscarkv.cache.hf_cache.OscarCache`, a transformers ``Cache`` that
stores real packed low-bit pages for ``model.generate``; it is the reference the paged engine
caches (page pools, prefix cache) are checked against.
"""


def __getattr__(name: str):
    # Lazy, like ``oscarkv.__getattr__``: importing ``oscarkv.cache`` must not import transformers.
    if name in ("OscarCache", "OscarLayer"):
        from oscarkv.cache import hf_cache

        return getattr(hf_cache, name)
    raise AttributeError(name)
