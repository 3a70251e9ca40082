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


def test_oscar_needs_rotations_for_other_models(model_dir, capsys):
    assert main(["serve", "--model", str(model_dir), "--kv", "oscar", *SMALL]) == 2
    assert "rotations" in capsys.readouterr().err


def test_bad_server_flags(model_dir, capsys):
    assert main(["serve", "--model", str(model_dir), "--kv", "bf16", "--port", "70000", *SMALL]) == 2
    assert "--port must lie in [0, 65535]" in capsys.readouterr().err
