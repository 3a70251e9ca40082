"""The OSCAR reference's rotation files: import every quirk, refuse naming the field, export, round trip,
and an imported artifact serving through the engine and ``OscarCache``.

The files are synthetic, built here exactly as the reference writes them: ``torch.save`` of
``{format_version, objective, source_grouping, layers: {id: {layer_id, rotation, eigenvalues}}}``.
"""

import shutil
import zipfile

import pytest
import torch

from oscarkv.cache.hf_cache import OscarCache
from oscarkv.config import ReferenceRecipe
from oscarkv.quant.artifact import Artifact
from oscarkv.quant.reference import ReferenceFormatError, export_rotations, import_rotations
from oscarkv.quant.rotation import hadamard
from tests.engine.conftest import (D, HKV, engine_config, hf_greedy, make_artifact, make_engine, prompts, run,
                                   tiny_config, tiny_model)

L4 = 4


def orthogonal(*shape, seed=0) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(*shape, D, D, generator=torch.Generator().manual_seed(seed)))[0]


def entry(lid, rot, eigen=True, seed=0):
    e = {"layer_id": lid, "rotation": rot}
    if eigen:
        heads = rot.shape[:-2]
        e["eigenvalues"] = torch.rand(*heads, D, generator=torch.Generator().manual_seed(seed)).sort(-1).values
    return e


def write(path, layers, version=2, eigen=True, objective="query_second_moment", grouping="per_kv_head"):
    """One reference file; ``layers``: ``{key: rotation}`` (rotation tensors may share storage)."""
    obj = {"format_version": version, "objective": objective, "source_grouping": grouping,
           "layers": {k: entry(k, r, eigen, seed=i) for i, (k, r) in enumerate(layers.items())}}
    torch.save(obj, path)
    return path


def per_head_files(folder, layers=range(2), seed=0, **kw):
    folder.mkdir(parents=True, exist_ok=True)
    for j, prefix in enumerate("kv"):
        write(folder / f"{prefix}_rotation_tiny.pt", {i: orthogonal(HKV, seed=seed + 10 * j + i) for i in layers}, **kw)
    return folder


def test_per_head_files_import_as_given(tmp_path):
    folder = per_head_files(tmp_path / "ref")
    art = import_rotations(folder, tiny_config())
    raw = torch.load(folder / "k_rotation_tiny.pt", weights_only=True)
    assert torch.equal(art.tensors["key.rotation"][1], raw["layers"][1]["rotation"])
    assert torch.equal(art.tensors["key.eigenvalues"][1], raw["layers"][1]["eigenvalues"].flip(-1))  # ours descend
    assert not art.tensors["key.mean"].any() and "key.scale" not in art.tensors
    m = art.manifest
    assert m["clip"] == {"key": [0.96] * 2, "value": [0.92] * 2} and m["group_size"] == D  # min(128, head_dim)
    assert m["options"]["overrides"] == {} and m["imported"]["key"]["format_version"] == 2


def test_quirks_identity_v1_str_ids_shared_hadamard_renamed_archive_reflection(tmp_path):
    folder = tmp_path / "ref"
    folder.mkdir()
    h = hadamard(D).float()
    write(tmp_path / "k_rotation_original.pt", {"0": h, "1": h}, version="identity-v1", eigen=False)  # one storage
    shutil.move(tmp_path / "k_rotation_original.pt", folder / "k_rotation_renamed.pt")
    reflection = orthogonal(seed=3)
    reflection[0] *= -1 if torch.det(reflection) > 0 else 1
    write(folder / "v_rotation_x.pt", {0: reflection, 1: orthogonal(seed=4)}, version=1, grouping="layer_mean")
    raw = torch.load(folder / "k_rotation_renamed.pt", weights_only=True)
    assert raw["layers"]["0"]["rotation"].untyped_storage().data_ptr() == raw["layers"]["1"]["rotation"].untyped_storage().data_ptr()
    assert zipfile.ZipFile(folder / "k_rotation_renamed.pt").namelist()[0].startswith("k_rotation_original/")
    assert torch.det(reflection) < 0

    art = import_rotations(folder, tiny_config())
    assert torch.equal(art.tensors["key.rotation"], h.expand(2, HKV, D, D))
    assert torch.equal(art.tensors["value.rotation"][0, 1], reflection)
    meta = art.manifest["imported"]["key"]
    assert (meta["format_version"], meta["layer_keys"], meta["archive_name"], meta["file"]) == \
        ("identity-v1", "str", "k_rotation_original", "k_rotation_renamed.pt")
    assert not art.tensors["key.eigenvalues"].any() and meta["eigenvalues"] is False
    art.save(tmp_path / "art")  # safetensors refuses shared storage: the import copied the layers apart
    Artifact.load(tmp_path / "art")


def test_sparse_layer_ids_need_bf16_layers(tmp_path):
    config = tiny_config(num_hidden_layers=L4)
    folder = per_head_files(tmp_path / "ref", layers=(0, 2))  # a hybrid model's global layers only
    with pytest.raises(ReferenceFormatError, match=r"k_rotation_tiny.pt: field layers: missing layer 1"):
        import_rotations(folder, config)
    art = import_rotations(folder, config, bf16_layers=frozenset({1, 3}))
    assert torch.equal(art.tensors["value.rotation"][3], torch.eye(D).expand(HKV, D, D))
    assert art.manifest["imported"]["value"]["layer_ids"] == [0, 2]


@pytest.mark.parametrize("break_it, field", [
    (lambda r: r[:, :16, :16], r"field layers\[1\].rotation: shape \(2, 16, 16\)"),
    (lambda r: r * 1.001, r"field layers\[1\].rotation: not orthogonal"),
    (lambda r: r.index_put_((torch.tensor([0]),) * 3, torch.tensor(float("nan"))), r"field layers\[1\].rotation: contains NaN"),
])
def test_refusals_name_the_field(tmp_path, break_it, field):
    folder = per_head_files(tmp_path / "ref")
    path = folder / "k_rotation_tiny.pt"
    obj = torch.load(path, weights_only=True)
    obj["layers"][1]["rotation"] = break_it(obj["layers"][1]["rotation"].clone())
    torch.save(obj, path)
    with pytest.raises(ReferenceFormatError, match=field):
        import_rotations(folder, tiny_config())


def test_refuses_a_missing_layer_and_several_candidates(tmp_path):
    folder = per_head_files(tmp_path / "ref", layers=(0,))
    with pytest.raises(ReferenceFormatError, match="field layers: missing layer 1"):
        import_rotations(folder, tiny_config())
    folder = per_head_files(tmp_path / "two")
    shutil.copy(folder / "k_rotation_tiny.pt", folder / "k_rotation_other.pt")
    with pytest.raises(ReferenceFormatError, match="several candidate key files"):
        import_rotations(folder, tiny_config())


def test_recipe_overrides_are_recorded(tmp_path):
    art = import_rotations(per_head_files(tmp_path / "ref"), tiny_config(), ReferenceRecipe(key_clip=0.9, group_size=16))
    assert art.manifest["options"]["overrides"] == {"key_clip": 0.9, "group_size": 16}
    assert art.manifest["group_size"] == 16 and art.manifest["clip"]["key"] == [0.9, 0.9]


def test_files_round_trip_through_import_and_export(tmp_path):
    """files → artifact → files: every field, key type and tensor as written (shared and per-head files)."""
    src = tmp_path / "ref"
    src.mkdir()
    write(src / "k_rotation_m.pt", {"0": hadamard(D).float(), "1": orthogonal(seed=1)}, version="identity-v1", eigen=False)
    write(src / "v_rotation_m.pt", {0: orthogonal(HKV, seed=2), 1: orthogonal(HKV, seed=3)})
    art = import_rotations(src, tiny_config())
    art.save(tmp_path / "art")
    paths, _ = export_rotations(Artifact.load(tmp_path / "art"), tmp_path / "out")
    assert sorted(p.name for p in paths) == ["k_rotation_m.pt", "v_rotation_m.pt"]
    for p in paths:
        a, b = torch.load(src / p.name, weights_only=True), torch.load(p, weights_only=True)
        assert {k: v for k, v in a.items() if k != "layers"} == {k: v for k, v in b.items() if k != "layers"}
        assert list(a["layers"]) == list(b["layers"])  # same ids, same key types
        for lid in a["layers"]:
            ea, eb = a["layers"][lid], b["layers"][lid]
            assert ea.keys() == eb.keys() and all(torch.equal(ea[k], eb[k]) for k in ea if k != "layer_id")


def test_our_artifact_round_trips_through_export_and_import(tmp_path):
    """artifact → files → artifact: the same rotations and eigenvalues per head; what the format drops is said."""
    config = tiny_config()
    art = make_artifact(config)
    paths, dropped = export_rotations(art, tmp_path / "out", "tiny")
    assert any("key.mean" in d for d in dropped)
    raw = torch.load(paths[0], weights_only=True)
    assert raw["format_version"] == 2 and raw["layers"][0]["rotation"].shape == (HKV, D, D)
    back = import_rotations(tmp_path / "out", config)
    for kind in ("key", "value"):
        assert torch.equal(back.tensors[f"{kind}.rotation"], art.tensors[f"{kind}.rotation"])
        assert torch.equal(back.tensors[f"{kind}.eigenvalues"], art.tensors[f"{kind}.eigenvalues"])


def test_imported_artifact_serves_through_the_engine_and_oscar_cache(tmp_path):
    """The engine with an imported artifact ≡ transformers with OscarCache.from_artifact (tokens)."""
    llama = tiny_model()
    art = import_rotations(per_head_files(tmp_path / "ref", seed=5), llama.config)
    art.save(tmp_path / "art")
    ps = prompts(2, 41)
    outs = run(make_engine(llama, "oscar", art), ps)
    for p, out in zip(ps, outs):
        cache = OscarCache.from_artifact(llama.config, tmp_path / "art", engine_config().kv)
        toks, _ = hf_greedy(llama, p, 24, cache)
        assert out.token_ids == toks
