"""The default model's artifact ships with the package and is what ``oscarkv calibrate --model default`` makes.

The shipped files (``oscarkv/data/default_rotations``) were written by that command with the
recipe's defaults; their manifest's ``recipe`` (4-bit keys in 42 of 90 KV heads, pages of 16, sink 16, recent 16, the INT2 key
clip 0.95 elsewhere) is what the per-head allocation study then chose for them on development samples
(``lab/scripts/twobit_heads.py``, ``lab/scripts/twobit_head_recipe.py``, ``lab/results/dev_twobit_8k_heads/``), kept as data (``oscarkv/data/default_recipe.json``, with the options it holds for and its provenance)
that the command writes into what it fits, so that it makes the shipped artifact in full, recipe included.
Reproducing them in full streams 16K tokens through all 30 layers (~90 s of
CPU on one core), so the default suite runs the command on the model cut to two layers instead: a layer's
statistics depend only on the layers below it and every layer is solved on its own, so
calibrating the model cut to two layers must give the shipped layers 0 and 1. The full
reproduction is marked ``full_calibration`` (deselected by default; ``pytest -m full_calibration``).

NOTE: "reproduces" is bit for bit (``torch.equal``), on the CPU in float32: the shipped files were
made with the same kernels (CPU, 2 threads and 1 thread gave identical bytes). Another BLAS may
round a matmul differently; the tolerance below then says by how much it may move
(``TOL``: the rotations are solved in fp64 from fp32 Gram sums, whose rounding is ~1e-6 relative).
"""

import pytest
import torch

from oscarkv.calibrate.default import cached_artifact, current_recipe
from oscarkv.data import default_recipe, default_rotations_dir
from oscarkv.quant.artifact import Artifact

TOL = 1e-4


@pytest.fixture(scope="module")
def shipped() -> Artifact:
    return Artifact.load(default_rotations_dir())


def test_shipped_recipe_is_the_development_search(shipped):
    """The shipped recipe is the allocation the development study chose for this artifact
    (``lab/scripts/twobit_head_recipe.py`` wrote it from ``lab/results/dev_twobit_8k_heads/``; development needles as
    served chose its windows, ``lab/results/gpu_heads_windows/``), and the serving entry points apply it: 4-bit keys
    in the 42 most sensitive KV heads, 2-bit values, pages of 16, sink 16, recent 16, key clip 0.95."""
    import json
    from pathlib import Path

    from oscarkv.config import KVConfig
    from oscarkv.quant.artifact import apply_recipe

    chosen = json.loads((Path(__file__).parents[2] / "lab/scripts/twobit_recipe_8192_s16_r16_p16.json").read_text())
    assert shipped.manifest["recipe"] == chosen
    kv = apply_recipe(KVConfig("oscar"), shipped)
    assert (kv.key_clip, kv.sink, kv.recent, kv.page_size, kv.bits, kv.levels) == (0.95, 16, 16, 16, (2, 2), "uniform")
    assert sum(map(len, kv.layer_key_heads)) == 42 and 2 in kv.layer_key_heads[18]  # layer 18 head 2: the most
    assert not kv.layer_key_bits and not kv.layer_value_bits


def test_shipped_recipe_stores_no_more_than_int2(shipped):
    """Within the bytes of the uniform INT2 recipe shipped before it (``frontier.int2``: the served key-clip search's
    recipe, lab/results/dev_keyclip/) at 4K and 8K, at the bits per element its provenance states."""
    import json
    from pathlib import Path

    from oscarkv.calibrate.default import frontier_artifacts
    from oscarkv.config import KVConfig
    from oscarkv.quant.artifact import apply_recipe
    from oscarkv.quant.codec import build_codec

    searched = json.loads((Path(__file__).parents[2] / "lab/results/dev_keyclip/keyclip_manifest.json").read_text())
    arts = frontier_artifacts(shipped)
    assert arts["int2"].manifest["recipe"] == searched["recipe"] and arts["int2"].tensors is shipped.tensors
    bpe = {name: build_codec(apply_recipe(KVConfig("oscar", group_size=shipped.manifest["group_size"]), a),
                             *shipped.fingerprint.kv_dims, a).bpe for name, a in arts.items()}
    for context in (4096, 8192):
        assert bpe[""](context) <= bpe["int2"](context) < bpe["k4v2"](context)
    assert round(bpe[""](8192), 4) == shipped.manifest["recipe"]["bpe"]
    assert round(bpe["k4v2"](4096), 4) == arts["k4v2"].manifest["recipe"]["bpe"]


def test_shipped_artifact_is_current(shipped):
    """Valid, fitted with the current recipe (a recipe change must re-ship it), and names no machine path."""
    assert shipped.manifest["options"] == current_recipe()
    assert shipped.manifest["calibration"]["model_source"] == "default"
    fp = shipped.fingerprint
    assert (fp.architecture, fp.num_layers, fp.num_kv_heads, fp.head_dim) == ("LlamaForCausalLM", 30, 3, 64)


def cut(loaded, layers: int):
    loaded.model.model.layers = loaded.model.model.layers[:layers]
    loaded.model.config.num_hidden_layers = layers
    return loaded


def assert_reproduces(got: Artifact, shipped: Artifact, layers: int) -> None:
    for name, t in got.tensors.items():
        ref = shipped.tensors[name][:layers]
        if not torch.equal(t, ref):
            err = ((t - ref).abs().max() / ref.abs().max()).item()
            assert err < TOL, f"{name}: relative difference {err:.2e}"
    for kind in ("key", "value"):
        assert got.manifest["clip"][kind] == shipped.manifest["clip"][kind][:layers], kind


def test_the_validated_recipe_is_the_shipped_one(shipped):
    """``default_recipe.json`` holds the shipped manifest's recipe, for the options the artifact was fitted with."""
    entry = default_recipe()
    assert entry["recipe"] == shipped.manifest["recipe"] and entry["options"] == shipped.manifest["options"]
    assert "lab/scripts/twobit_heads.py" in entry["provenance"] and "lab/results/gpu_heads_windows/" in entry["provenance"]


SKIP = {"calibration", "oscarkv_version"}  # seconds taken; the version


@pytest.mark.slow
def test_calibrate_as_documented_reproduces_the_shipped_artifact_on_two_layers(shipped, monkeypatch, tmp_path,
                                                                             capsys):
    """The default model uses the shipped artifact without calibrating; ``oscarkv calibrate --model default --out
    DIR`` on its first two layers writes the shipped layers 0 and 1, the shipped options and the shipped recipe."""
    import oscarkv.calibrate.default as cd
    import oscarkv.cli.calibrate as cli
    from oscarkv.cli.main import main
    from oscarkv.models.loader import load_model

    loaded = load_model("default", torch.float32)
    monkeypatch.setattr(cd, "calibrate", lambda *a: pytest.fail("the default model was calibrated"))
    assert cached_artifact(loaded, tmp_path).manifest == shipped.manifest
    monkeypatch.setattr(cli, "load", lambda *args: cut(loaded, 2))
    # the recipe's per-head bits name 30 layers: the model cut to two gets them cut too (the full reproduction
    # below writes the shipped recipe as it is)
    entry = default_recipe()
    two = {**entry["recipe"], **{k: entry["recipe"][k][:2] for k in ("layer_key_heads",)}}
    monkeypatch.setattr(cd, "default_recipe", lambda: {**entry, "recipe": two})
    assert main(["calibrate", "--model", "default", "--out", str(tmp_path / "out")]) == 0
    assert "serving recipe: the validated one for the default model" in capsys.readouterr().out
    got = Artifact.load(tmp_path / "out")
    assert_reproduces(got, shipped, 2)
    assert got.manifest["recipe"] == two  # exactly: windows, per-layer bits, key clip, the study
    for field in ("options", "group_size", "method", "format_version"):
        assert got.manifest[field] == shipped.manifest[field], field
    assert got.manifest["calibration"]["source"] == shipped.manifest["calibration"]["source"]


@pytest.mark.slow
@pytest.mark.full_calibration
def test_calibrate_default_reproduces_the_shipped_artifact(shipped, tmp_path):
    from oscarkv.cli.main import main

    assert main(["calibrate", "--model", "default", "--out", str(tmp_path)]) == 0
    got = Artifact.load(tmp_path)
    assert_reproduces(got, shipped, 30)
    assert {k: v for k, v in got.manifest.items() if k not in SKIP} == \
        {k: v for k, v in shipped.manifest.items() if k not in SKIP}  # the recipe included
