"""``oscarkv serve`` start-up: the oscar path with a synthetic artifact, refusal of a mismatched
artifact (the field named, exit status 2, no fallback), and the start-up log."""

import logging

import httpx

from oscarkv.cli.main import build_parser, main
from oscarkv.cli.serve import build as build_server
from oscarkv.server.launch import serving_in_thread
from tests.cli.conftest import SMALL
from tests.engine.conftest import make_artifact, tiny_config


def test_oscar_serves_with_artifact_and_logs(model_dir, model, tmp_path, caplog):
    art = make_artifact(model.config).save(tmp_path / "rot")
    args = build_parser().parse_args(["serve", "--model", str(model_dir), "--kv", "oscar", "--rotations", str(art),
                                      "--served-model-name", "tiny-oscar", "--overlap", *SMALL])
    with caplog.at_level(logging.INFO, logger="oscarkv.serve"):
        built = build_server(args)
    try:
        assert built.engine.engine.overlap  # steps launched ahead, as on a GPU (default there; off on a CPU)
        log = caplog.text
        assert "KV capacity bf16=" in log and "int2=" in log and "BPE at capacity" in log
        assert "rotation artifact: format 2" in log and "recipe:" in log
        with serving_in_thread(built.app) as url:
            r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
                "model": "tiny-oscar", "messages": [{"role": "user", "content": "x" * 70}],
                "max_tokens": 6, "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["prompt_tokens"] > 64  # past sink + window: INT2 history pages are written
            metrics = httpx.get(url + "/metrics").text
            assert 'oscarkv_kv_pages_total{tier="int2"}' in metrics
            ahead = next(line for line in metrics.splitlines() if line.startswith("oscarkv_decode_steps_ahead_total"))
            assert float(ahead.split()[-1]) > 0  # 6 tokens: the decode steps after the first run ahead
            assert httpx.get(url + "/v1/models").json()["data"][0]["kv"] == "oscar"
    finally:
        built.engine.close()


def test_mismatched_artifact_is_refused(model_dir, tmp_path, capsys):
    other = make_artifact(tiny_config(num_attention_heads=8)).save(tmp_path / "other")
    rc = main(["serve", "--model", str(model_dir), "--kv", "oscar", "--rotations", str(other), *SMALL])
    err = capsys.readouterr().err
    assert rc == 2
    assert "oscarkv serve: error:" in err and "field model.num_heads" in err


def test_oscar_calibrates_a_new_model_once_at_start(model_dir, model, tmp_path, monkeypatch, caplog):
    """No --rotations for a model without an artifact: the first start calibrates (the recipe's tokens) and caches
    the artifact under the model's fingerprint, saying where; the second start reuses it."""
    import oscarkv.calibrate.default as cd
    from oscarkv.quant.artifact import MANIFEST_FILE, TENSOR_FILE, ModelFingerprint

    calls, real = [], cd.calibrate
    monkeypatch.setattr(cd, "calibrate", lambda *a: calls.append(a[1]) or real(*a))
    args = build_parser().parse_args(["serve", "--model", str(model_dir), "--kv", "oscar", "--cache-dir",
                                      str(tmp_path), *SMALL])
    caplog.set_level(logging.INFO, logger="oscarkv")
    for start in (1, 2):
        build_server(args).engine.close()
        assert len(calls) == 1, start
    path = tmp_path / "rotations" / ModelFingerprint.from_config(model.config).config_hash
    assert (path / TENSOR_FILE).is_file() and (path / MANIFEST_FILE).is_file()
    assert "calibrating once on 16384 + 1024 held-out tokens of oscarkv.data:calibration.txt (" in caplog.text
    assert f") -> {path}" in caplog.text and f"cached at {path}" in caplog.text
    assert f"the cached artifact {path}" in caplog.text


def test_bad_server_flags(model_dir, capsys):
    assert main(["serve", "--model", str(model_dir), "--kv", "bf16", "--port", "70000", *SMALL]) == 2
    assert "--port must lie in [0, 65535]" in capsys.readouterr().err
