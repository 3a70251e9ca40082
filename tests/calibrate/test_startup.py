"""A model without an artifact, served with ``kv="oscar"``: calibrated once with the recipe, cached under its
fingerprint, reused at the next start; a stale cache is refitted, a damaged one refused by name, and a
directory the caller names wins (``oscarkv.calibrate.default``). The real calibration runs on a tiny random
Llama (the recipe's 16384 + 1024 tokens of the bundled text: ~1 s on one CPU core)."""

import pytest
import torch

import oscarkv.calibrate.default as cd
from oscarkv.calibrate.default import artifact_for, as_stored, cached_artifact, current_recipe
from oscarkv.config import CalibrationConfig
from oscarkv.models.loader import LoadedModel
from oscarkv.quant.artifact import MANIFEST_FILE, TENSOR_FILE, Artifact, ArtifactError, ModelFingerprint
from tests.engine.conftest import make_artifact, tiny_config, tiny_model
from tests.models.test_architectures import IdTokenizer


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return LoadedModel(tiny_model(), IdTokenizer(), "tiny")


@pytest.fixture
def calls(monkeypatch) -> list[CalibrationConfig]:
    """The configs the start-up path calibrates with (the real calibration runs)."""
    seen, real = [], cd.calibrate

    def counted(loaded, cfg):
        seen.append(cfg)
        return real(loaded, cfg)

    monkeypatch.setattr(cd, "calibrate", counted)
    return seen


def cache_path(tmp_path, loaded):
    return tmp_path / "rotations" / ModelFingerprint.from_config(loaded.config).config_hash


def same(a: Artifact, b: Artifact) -> bool:
    return a.tensors.keys() == b.tensors.keys() and all(torch.equal(t, b.tensors[k]) for k, t in a.tensors.items())


def test_calibrates_once_then_reuses_the_cache(loaded, calls, tmp_path, caplog):
    caplog.set_level("INFO", logger="oscarkv")
    first = artifact_for(loaded, "oscar", None, tmp_path)
    path = cache_path(tmp_path, loaded)
    assert calls == [cd.startup_config(loaded)] and calls[0].options() == CalibrationConfig().options()  # the recipe
    assert (path / TENSOR_FILE).is_file() and (path / MANIFEST_FILE).is_file()
    assert as_stored(first.manifest["options"]) == current_recipe() and "recipe" not in first.manifest  # none validated
    assert "16384 + 1024 held-out tokens of oscarkv.data:calibration.txt (" in caplog.text
    assert f") -> {path}" in caplog.text
    assert f"cached at {path}" in caplog.text
    again = artifact_for(loaded, "oscar", None, tmp_path)
    assert len(calls) == 1 and same(again, first) and again.manifest == as_stored(first.manifest)


def test_a_stale_cache_is_refitted(loaded, calls, tmp_path):
    """Fitted with other options, or for another model's fingerprint (at this model's path): calibrated again."""
    from oscarkv.calibrate import calibrate

    path = cache_path(tmp_path, loaded)
    small = CalibrationConfig(tokens=128, chunk=64, heldout_tokens=64)
    calibrate(loaded, small)[0].save(path)
    assert as_stored(cached_artifact(loaded, tmp_path).manifest["options"]) == current_recipe() and len(calls) == 1
    make_artifact(tiny_config(num_attention_heads=8)).save(path)
    fitted = cached_artifact(loaded, tmp_path)
    assert len(calls) == 2 and fitted.fingerprint == ModelFingerprint.from_config(loaded.config)
    assert same(Artifact.load(path), fitted)


@pytest.mark.parametrize("damage", ["truncated tensors", "manifest not JSON"])
def test_a_damaged_cache_is_an_error_naming_the_file(loaded, calls, tmp_path, damage):
    path = cache_path(tmp_path, loaded)
    make_artifact(loaded.config).save(path)
    name = TENSOR_FILE if damage == "truncated tensors" else MANIFEST_FILE
    data = (path / name).read_bytes()
    (path / name).write_bytes(data[:len(data) // 2])
    with pytest.raises(ArtifactError, match=f"{path / name}.*delete {path} to calibrate again"):
        cached_artifact(loaded, tmp_path)
    assert calls == []


def test_the_directory_named_wins(loaded, calls, tmp_path):
    art = make_artifact(loaded.config)
    got = artifact_for(loaded, "oscar", art.save(tmp_path / "mine"), tmp_path / "cache")
    assert same(got, art) and calls == [] and not (tmp_path / "cache").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_startup_calibration_is_streamed_to_the_same_artifact(calls, tmp_path, caplog):
    """Where there is a GPU, the start-up calibration runs one decoder layer at a time on it, and gives the
    artifact the whole-model calibration gives on the same device (``oscarkv.calibrate.stream``)."""
    from oscarkv.calibrate import calibrate

    caplog.set_level("INFO", logger="oscarkv")
    on_gpu = LoadedModel(tiny_model().cuda(), IdTokenizer(), "tiny")
    got = cached_artifact(on_gpu, tmp_path)
    assert len(calls) == 1 and calls[0].stream_layers and "streamed layer by layer on" in caplog.text
    want, _ = calibrate(on_gpu, CalibrationConfig())
    assert same(got, want)
