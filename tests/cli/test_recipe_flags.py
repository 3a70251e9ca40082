"""The engine's window, page and bit flags (and ``LLM``'s ``recipe_overrides``) over the shipped artifact's recipe: unset ones
come from the recipe; a set window or page size changes only itself (the per-head 4-bit keys, the clip and the
other windows stay); set bits replace the recipe's allocation."""

import pytest

from oscarkv.cli.flags import engine_config
from oscarkv.cli.main import build_parser
from oscarkv.data import default_rotations_dir
from oscarkv.quant.artifact import Artifact


@pytest.fixture(scope="module")
def shipped() -> Artifact:
    return Artifact.load(default_rotations_dir())


def kv_for(flags: list[str], artifact: Artifact):
    return engine_config(build_parser().parse_args(["generate", "--prompt", "x", *flags]), artifact).kv


def test_unset_flags_serve_the_recipe(shipped):
    r = shipped.manifest["recipe"]
    kv = kv_for([], shipped)
    assert (kv.sink, kv.recent, kv.page_size, kv.key_clip) == (r["sink"], r["recent"], r["page_size"], r["key_clip"])
    assert [list(h) for h in kv.layer_key_heads] == r["layer_key_heads"]


@pytest.mark.parametrize("flags, changed", [(["--sink", "32"], {"sink": 32}), (["--recent", "64"], {"recent": 64}),
                                            (["--page-size", "32", "--sink", "32"], {"page_size": 32, "sink": 32})])
def test_a_window_flag_changes_only_its_window(shipped, flags, changed):
    base, kv = kv_for([], shipped), kv_for(flags, shipped)
    for name in ("sink", "recent", "page_size", "key_clip", "layer_key_heads", "key_bits", "value_bits"):
        assert getattr(kv, name) == changed.get(name, getattr(base, name)), name


def test_bit_flags_replace_the_allocation(shipped):
    kv = kv_for(["--key-bits", "4"], shipped)
    assert kv.key_bits == 4 and not kv.layer_key_heads and kv.recent == shipped.manifest["recipe"]["recent"]
    assert kv_for(["--value-bits", "4"], shipped).layer_key_heads == kv_for([], shipped).layer_key_heads


def test_a_sink_off_the_recipes_pages_is_refused(shipped):
    from oscarkv.cli.flags import UserError

    with pytest.raises(UserError, match=r"sink \(12\) must be a multiple of EngineConfig.kv.page_size \(16\)"):
        kv_for(["--sink", "12"], shipped)


def test_llm_sets_fields_over_the_recipe_as_the_flags_do(shipped):
    """``LLM(recipe_overrides=...)`` serves what the same flags serve; with a ``config`` it is refused."""
    from oscarkv.config import EngineConfig
    from oscarkv.llm import LLM
    from oscarkv.models.loader import load_model

    loaded = load_model("default", "float32", device="cpu")
    with LLM(loaded, artifact=shipped, recipe_overrides={"sink": 32}) as llm:
        assert llm.engine.cfg.kv == kv_for(["--sink", "32"], shipped)
        assert llm.recipe.endswith("(set by the caller: the artifact's recipe but sink 32)")
    with pytest.raises(ValueError, match="recipe_overrides"):
        LLM(loaded, artifact=shipped, config=EngineConfig(), recipe_overrides={"sink": 32})
