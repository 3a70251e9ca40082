"""Hugging Face Hub model ids: ``--model ORG/NAME[@REVISION]`` → a local snapshot directory.

Role: :func:`oscarkv.models.loader.load_model` hands a spec that is no local path and looks like a
hub id to :func:`resolve`, which asks ``huggingface_hub.snapshot_download`` for the config, the
tokenizer files and the safetensors weights only (no ``.bin``/``.pt`` pickles, no other formats).
Everything else is that library's: its cache (``HF_HOME`` / ``HF_HUB_CACHE``), its offline switch
(``HF_HUB_OFFLINE``: only the cache is read) and its tokens. The snapshot directory it returns is
then loaded like any model directory.
"""

from __future__ import annotations

import re
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")
"""``ORG/NAME`` with an optional ``@REVISION`` (branch, tag or commit)."""

FILES = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
         "tokenizer*", "special_tokens_map.json", "vocab.*", "merges.txt", "*.tiktoken", "chat_template*"]
"""What is fetched (or read from the cache): config, tokenizer and safetensors weights only."""


class HubError(ValueError):
    """A hub id that cannot be resolved; the message names the id and whether the run was offline."""


def is_hub_id(spec: str) -> bool:
    return bool(HUB_ID.match(spec))


def split(spec: str) -> tuple[str, str | None]:
    """``("ORG/NAME", "REVISION" or None)``."""
    repo, _, rev = spec.partition("@")
    return repo, rev or None


def resolve(spec: str, files: list[str] = FILES) -> Path:
    """The snapshot directory of hub id ``spec`` holding ``files`` (patterns; from the cache when offline)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    repo, rev = split(spec)
    offline = bool(constants.HF_HUB_OFFLINE)
    try:
        return Path(snapshot_download(repo, revision=rev, allow_patterns=files))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as e:
        where = (f"offline (HF_HUB_OFFLINE=1): not in the cache {constants.HF_HUB_CACHE}" if offline
                 else "online: not found on the Hub and not in the cache")
        raise HubError(f"model {spec!r} (hub id {repo}, revision {rev or 'main'}): {where} "
                       f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from e
