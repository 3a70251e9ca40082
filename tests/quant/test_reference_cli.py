"""``oscarkv import-rotations`` and ``export-rotations`` on a tiny model directory: files in, artifact
out, files back; a refusal is one line naming the field, exit status 2."""

import pytest
import torch

from oscarkv.cli.main import main
from oscarkv.quant.artifact import Artifact, ModelFingerprint
from tests.quant.test_reference import per_head_files
from tests.byte_llama import byte_model, byte_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-model")
    byte_model().save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path


def test_import_then_export_gives_the_files_back(model_dir, tmp_path, capsys):
    src = per_head_files(tmp_path / "ref")
    assert main(["import-rotations", str(src), "--model", str(model_dir), "--out", str(tmp_path / "art"),
                 "--value-clip", "0.9"]) == 0
    assert "overrides {'value_clip': 0.9}" in capsys.readouterr().out
    fp = ModelFingerprint.from_config(byte_model().config)  # the config alone was read: the same fingerprint
    assert Artifact.load(tmp_path / "art", expect=fp).manifest["clip"]["value"] == [0.9, 0.9]
    assert main(["export-rotations", str(tmp_path / "art"), "--out", str(tmp_path / "out")]) == 0
    for name in ("k_rotation_tiny.pt", "v_rotation_tiny.pt"):
        a, b = (torch.load(d / name, weights_only=True) for d in (src, tmp_path / "out"))
        assert all(torch.equal(a["layers"][i]["rotation"], b["layers"][i]["rotation"]) for i in a["layers"])


def test_refusal_names_the_field(model_dir, tmp_path, capsys):
    src = per_head_files(tmp_path / "ref", layers=(0,))
    assert main(["import-rotations", str(src), "--model", str(model_dir), "--out", str(tmp_path / "art")]) == 2
    err = capsys.readouterr().err
    assert "oscarkv import-rotations: error:" in err and "field layers: missing layer 1" in err
