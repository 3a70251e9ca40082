"""Typed configuration: one frozen dataclass per concern, validated on construction.

CLI flags derive from these fields (``oscarkv.cli.flags``); nothing is read from environment
variables here (the one exception, a secret, is read by ``oscarkv serve``: ``OSCARKV_API_KEY``).
Serving (:mod:`oscarkv.config.serving`): ``KVConfig`` says how the KV cache is stored,
``EngineConfig`` how the paged engine runs; ``ServerConfig`` what the HTTP layer adds
(:mod:`oscarkv.config.server`). Offline
work (:mod:`oscarkv.config.studies`): ``CalibrationConfig`` how the rotation artifact is fitted,
``RecipeSearchConfig`` how the recipe is chosen, ``EvalConfig`` what is measured,
``ReferenceRecipe`` what the reference's files leave out. Import them from here. This package
imports nothing heavy (the command line's ``--help`` reads it without torch).
"""

from __future__ import annotations

from oscarkv.config.server import ROUTER_POLICIES, ReplicaConfig, ServerConfig
from oscarkv.config.serving import (CACHE_DIR, DEVICES, DTYPES, ENGINE_METHODS, FIXED_BITS, L2_PREFETCH_POINTS,
                                    LADDER_METHODS, LEVEL_KINDS, METHODS, PIECEWISE_BUCKETS, RUNGS, SPECULATIVE_METHODS,
                                    DistributedConfig,
                                    EngineConfig, KVConfig, SpeculativeConfig, prefetch_points)
from oscarkv.config.studies import (ALLOCATE_KINDS, CENTER_MODES, CLIP_MODES, DEV_PROTOCOLS, HAYSTACKS,
                                    QUERY_WEIGHTINGS, TASKS, CalibrationConfig, EvalConfig, RecipeSearchConfig, ReferenceRecipe)

__version__ = "0.1.0"
"""The package version (recorded in every artifact manifest)."""

__all__ = ["L2_PREFETCH_POINTS", "prefetch_points", "CACHE_DIR", "DEVICES", "DTYPES", "ENGINE_METHODS", "FIXED_BITS", "LADDER_METHODS", "LEVEL_KINDS", "METHODS", "RUNGS",
           "PIECEWISE_BUCKETS",
           "SPECULATIVE_METHODS", "SpeculativeConfig", "DistributedConfig", "ReplicaConfig", "ROUTER_POLICIES",
           "EngineConfig", "KVConfig", "ServerConfig", "ALLOCATE_KINDS", "CENTER_MODES", "CLIP_MODES", "DEV_PROTOCOLS", "HAYSTACKS",
           "QUERY_WEIGHTINGS", "TASKS", "CalibrationConfig", "EvalConfig", "RecipeSearchConfig", "ReferenceRecipe",
           "__version__"]
