"""An OpenAI-compatible HTTP server over the paged INT2 engine (optional extra ``serve``).

Data flow (DESIGN.md §5): HTTP → :mod:`~oscarkv.server.protocol` (pydantic request models,
validated into :class:`~oscarkv.engine.request.SamplingParams` and prompt token ids) →
:class:`~oscarkv.engine.async_engine.AsyncEngine` (one background thread stepping
:class:`~oscarkv.engine.engine.LLMEngine`, so concurrent requests share continuous batches)
→ :class:`~oscarkv.engine.request.RequestOutput` deltas → JSON or SSE chunks.

Modules (its config is :class:`oscarkv.config.ServerConfig`): ``protocol`` (OpenAI wire types), ``app``
(the FastAPI factory and routes, no globals), ``state`` (per-app :class:`Server`: the served
model, request validation, generation with metrics), ``endpoints`` (completions and chat, JSON
or SSE), ``streaming`` (SSE lines, usage, racing a client's disconnect), ``errors`` (OpenAI
error bodies as exception handlers), ``middleware`` (response counts, the body limit, the API key), ``metrics`` (Prometheus on a per-app registry),
and ``launch`` (build the server from typed configs, bind, run; ``oscarkv serve`` calls it). FastAPI, uvicorn and
prometheus_client are imported only here, so the core package does not need them.
"""
