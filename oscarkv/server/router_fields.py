"""Fields a router adds to every request it forwards, accepted only with the values that change nothing.

Role: vllm-router re-serializes each OpenAI request with SGLang/vLLM extensions at their defaults
(``no_stop_trim: false``, ``skip_special_tokens: true``, ...; read from the bodies it sends). The
request models of ``oscarkv.server.protocol`` refuse unknown fields, so :func:`drop_neutral` (a
``mode="before"`` validator there) removes these fields when they carry exactly :data:`NEUTRAL`'s value,
which is oscarkv's behaviour anyway; any other value stays and is refused as an unknown field, naming it.
"""

from __future__ import annotations

from typing import Any

NEUTRAL = {"no_stop_trim": False, "skip_special_tokens": True, "return_hidden_states": False,
           "continue_final_message": False, "separate_reasoning": True, "stream_reasoning": True,
           "include_reasoning": True}
"""Field → the value that asks for what oscarkv does: keep stop trimming, skip special tokens in text, no
hidden states, a fresh assistant turn, no reasoning parser (there is no reasoning to separate)."""


def drop_neutral(data: Any) -> Any:
    """``data`` without the router fields that hold their neutral value (a request body as parsed JSON)."""
    if not isinstance(data, dict) or not NEUTRAL.keys() & data.keys():
        return data
    return {k: v for k, v in data.items() if not (k in NEUTRAL and v is NEUTRAL[k])}  # NOTE: `is`: JSON true, not 1
