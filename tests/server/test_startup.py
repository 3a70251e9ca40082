"""Every start-up fault of ``oscarkv serve`` is one line on stderr naming the file, the tensor
or the field and the fault, with exit status 2: a port in use (found before the model loads),
a missing ``serve`` extra, an artifact the method would ignore, and every artifact and model
file fault (cut short, corrupt, wrong dtype, NaN/Inf, wrong shape, missing tensor)."""

import logging
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from oscarkv.cli.main import main
from oscarkv.quant.artifact import TENSOR_FILE
from tests.engine.conftest import make_artifact
from tests.server.conftest import SMALL

WEIGHT = "model.layers.0.self_attn.q_proj.weight"


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "nothing on stderr"
    return err[-1]


def _serve(capsys, *flags) -> str:
    assert main(["serve", *flags, *SMALL]) == 2
    line = _error_line(capsys)
    assert line.startswith("oscarkv serve: error: "), line
    return line


def test_port_in_use_is_refused_before_the_model_loads(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _serve(capsys, "--model", "/nonexistent/model", "--kv", "bf16", "--port", str(port))
    assert f"cannot listen on 127.0.0.1:{port}" in line and "in use" in line  # not "model not found": no loading


def test_missing_serve_extra():
    code = ("import sys; sys.modules['fastapi'] = None\n"  # as if fastapi were not installed
            "from oscarkv.cli.main import main; sys.exit(main(['serve', '--model', '/nonexistent', '--kv', 'bf16']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("oscarkv serve: error: serving needs the 'serve' extra")
    assert "Traceback" not in r.stderr


def test_rotations_with_a_method_that_ignores_them(model_dir, tmp_path, capsys):
    (tmp_path / "rot").mkdir()  # not even an artifact: it must not be silently ignored
    line = _serve(capsys, "--model", str(model_dir), "--kv", "bf16", "--rotations", str(tmp_path / "rot"))
    assert "only --kv oscar uses a rotation artifact" in line


def _rewrite(path, change):
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _cut(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def _set(name, value):
    return lambda t: t.__setitem__(name, value(t[name]))


def _poke(name, value):
    def change(t):
        t[name].view(-1)[3] = value
    return change


ARTIFACT_FAULTS = [  # (id, fault on rotations.safetensors, tensor, words of the fault)
    ("truncated", _cut, None, "truncated or corrupt safetensors file"),
    ("garbage", lambda p: p.write_bytes(b"\x07" * 64), None, "truncated or corrupt safetensors file"),
    ("dtype", lambda p: _rewrite(p, _set("key.mean", lambda t: t.to(torch.int32))), "key.mean", "dtype int32"),
    ("nan-scale", lambda p: _rewrite(p, lambda t: t.__setitem__("value.scale", torch.ones_like(t["value.mean"])) or
                                     _poke("value.scale", float("nan"))(t)), "value.scale", "contains NaN"),
    ("inf", lambda p: _rewrite(p, _poke("key.eigenvalues", float("inf"))), "key.eigenvalues", "contains Inf"),
    ("shape", lambda p: _rewrite(p, _set("value.mean", lambda t: t[..., :-1].contiguous())), "value.mean", "shape mismatch"),
    ("missing", lambda p: _rewrite(p, lambda t: t.pop("key.eigvecs")), "key.eigvecs", "missing"),
]


@pytest.mark.parametrize("fault,tensor,words", [c[1:] for c in ARTIFACT_FAULTS], ids=[c[0] for c in ARTIFACT_FAULTS])
def test_artifact_faults_are_one_line(model_dir, model, tmp_path, capsys, fault, tensor, words):
    art = make_artifact(model.config).save(tmp_path / "rot")
    fault(art / TENSOR_FILE)
    line = _serve(capsys, "--model", str(model_dir), "--kv", "oscar", "--rotations", str(art))
    assert str(art / TENSOR_FILE) in line and words in line, line
    assert tensor is None or f"tensor {tensor}:" in line, line


MODEL_FAULTS = [  # (id, fault on model.safetensors, words of the fault)
    ("truncated", _cut, "truncated or corrupt safetensors file"),
    ("dtype", lambda p: _rewrite(p, _set(WEIGHT, lambda t: t.to(torch.int32))), "dtype I32"),
    ("nan", lambda p: _rewrite(p, _poke(WEIGHT, float("nan"))), "contains NaN"),
    ("inf", lambda p: _rewrite(p, _poke(WEIGHT, float("-inf"))), "contains Inf"),
    ("shape", lambda p: _rewrite(p, _set(WEIGHT, lambda t: t[:-1].contiguous())), "shape mismatch"),
    ("missing", lambda p: _rewrite(p, lambda t: t.pop(WEIGHT)), "missing from model.safetensors"),
]


@pytest.mark.parametrize("fault,words", [c[1:] for c in MODEL_FAULTS], ids=[c[0] for c in MODEL_FAULTS])
def test_model_faults_are_one_line(model_dir, tmp_path, capsys, fault, words):
    bad = tmp_path / "model"
    bad.mkdir()
    for f in model_dir.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    fault(bad / "model.safetensors")
    line = _serve(capsys, "--model", str(bad), "--kv", "bf16")
    assert str(bad) in line and words in line, line
    assert fault is _cut or f"tensor {WEIGHT}:" in line, line


def test_startup_log_summarizes_the_manifest(model_dir, model, tmp_path, caplog):
    from oscarkv.cli.main import build_parser
    from oscarkv.cli.serve import build

    art = make_artifact(model.config).save(tmp_path / "rot")
    args = build_parser().parse_args(["serve", "--model", str(model_dir), "--kv", "oscar", "--rotations", str(art), *SMALL])
    with caplog.at_level(logging.INFO, logger="oscarkv.serve"):
        built = build(args)
    built.engine.close()
    lines = [r.getMessage() for r in caplog.records if "artifact" in r.getMessage() or r.getMessage().startswith("oscarkv serve:   ")]
    assert 2 <= len(lines) <= 6 and all(len(line) < 300 for line in lines), lines
    assert "LlamaForCausalLM (2 layers" in lines[0] and "clip ratios per layer: keys 0.90-0.90" in caplog.text
