"""Hub model ids resolved offline from a cache laid out as ``huggingface_hub`` lays it out:
``models--ORG--NAME/{blobs/<sha256>, refs/<branch or tag>, snapshots/<commit>/<file> -> ../../blobs/<sha256>}``."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from oscarkv.cli.main import build_parser
from oscarkv.cli.serve import build as build_server
from oscarkv.models.loader import ModelLoadError, load_config, load_model
from oscarkv.server.launch import serving_in_thread
from tests.byte_llama import byte_model, byte_tokenizer
from tests.byte_llama import SMALL

REPO, COMMIT = "tiny-org/tiny-llama", "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    """A hub cache holding REPO at COMMIT under refs main and v1, files as symlinks into blobs."""
    cache = tmp_path_factory.mktemp("hub")
    files = tmp_path_factory.mktemp("files")
    byte_model().save_pretrained(files)
    byte_tokenizer().save_pretrained(files)
    repo = cache / ("models--" + REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for f in files.iterdir():
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        f.rename(repo / "blobs" / digest)
        (snapshot / f.name).symlink_to(Path("../../blobs") / digest)
    (repo / "refs").mkdir()
    for ref in ("main", "v1"):
        (repo / "refs" / ref).write_text(COMMIT)
    return cache


@pytest.fixture
def offline(hub_cache, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub_cache


def test_hub_id_and_revision_load_from_the_cache(offline):
    for spec in (REPO, REPO + "@v1", f"{REPO}@{COMMIT}"):
        loaded = load_model(spec)
        assert Path(loaded.source).name == COMMIT and loaded.config.architectures == ["LlamaForCausalLM"]


def test_config_alone(offline):
    assert load_config(REPO).architectures == ["LlamaForCausalLM"]


def test_missing_id_names_it_and_says_offline(offline):
    with pytest.raises(ModelLoadError, match=r"'tiny-org/absent'.*offline \(HF_HUB_OFFLINE=1\)"):
        load_model("tiny-org/absent")
    with pytest.raises(ModelLoadError, match=r"revision nope.*offline"):
        load_model(REPO + "@nope")


def test_serve_starts_from_the_hub_cache(offline):
    args = build_parser().parse_args(["serve", "--model", REPO, "--kv", "bf16", *SMALL])
    built = build_server(args)
    try:
        with serving_in_thread(built.app) as url:
            r = httpx.post(url + "/v1/completions", timeout=60,
                           json={"model": REPO, "prompt": "hello", "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 4
    finally:
        built.engine.close()


def test_the_environment_switch_reaches_the_library(hub_cache):
    """HF_HUB_OFFLINE=1 and HF_HUB_CACHE as a user sets them: generate runs from the cache alone."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "oscarkv.cli", "generate", "--model", REPO, "--kv", "bf16", "--prompt", "hi",
           "--max-tokens", "3", *SMALL]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
