"""The paged serving engine: request → scheduler → model runner → sampler → outputs.

Data flow (DESIGN.md §5): :class:`~oscarkv.llm.LLM` (offline) or
:class:`~oscarkv.engine.async_engine.AsyncEngine` (servers) submit requests to
:class:`~oscarkv.engine.engine.LLMEngine`, whose step runs the
:class:`~oscarkv.engine.scheduler.Scheduler` (token budget, chunked prefill, prefix hits,
preemption; pages through ``oscarkv.cache.manager``), the
:class:`~oscarkv.engine.model_runner.ModelRunner` (paged model + attention backend) and the
sampler, then detokenizes and reports :class:`~oscarkv.engine.request.RequestOutput` s.
"""
