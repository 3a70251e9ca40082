"""``oscarkv generate``, run as a user runs it: the engine is described once, and the streamed text
is the offline API's."""

import subprocess
import sys
from pathlib import Path

from oscarkv.cli.flags import engine_config
from oscarkv.cli.main import build_parser
from oscarkv.engine.request import SamplingParams
from oscarkv.llm import LLM
from oscarkv.models.loader import load_model
from tests.cli.conftest import SMALL

ROOT = Path(__file__).resolve().parents[2]


def test_generate_streams_and_describes_the_engine_once(model_dir):
    argv = ["generate", "--model", str(model_dir), "--kv", "bf16", "--no-chat", "--prompt", "Hello there",
            "--max-tokens", "12", *SMALL]
    done = subprocess.run([sys.executable, "-m", "oscarkv.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    printed = done.stdout + done.stderr
    assert printed.count("oscarkv engine:") == 1 and printed.count("kv bf16: sink 8, recent 16") == 1, printed
    args = build_parser().parse_args(argv)
    want = LLM(load_model(str(model_dir)), "bf16", config=engine_config(args)).generate(
        "Hello there", SamplingParams(12, 0.0))[0]
    assert done.stdout == f"{want.text}\n[{want.finish_reason}, {len(want.token_ids)} tokens]\n"


def test_generate_and_llm_calibrate_a_new_model_once(model_dir, tmp_path, monkeypatch, capsys):
    """``generate --kv oscar`` without --rotations calibrates the model once into --cache-dir; a second run and
    the offline API on the same cache reuse that artifact and give the same tokens."""
    import oscarkv.calibrate.default as cd
    from oscarkv.cli.main import main

    calls, real = [], cd.calibrate
    monkeypatch.setattr(cd, "calibrate", lambda *a: calls.append(a[1]) or real(*a))
    argv = ["generate", "--model", str(model_dir), "--kv", "oscar", "--cache-dir", str(tmp_path), "--no-chat",
            "--prompt", "Hello there, " * 8, "--max-tokens", "8", *SMALL]
    printed = []
    for run in (1, 2):
        assert main(argv) == 0
        printed.append(capsys.readouterr().out)
        assert len(calls) == 1, run
    assert printed[0] == printed[1]
    llm = LLM(str(model_dir), "oscar", config=engine_config(build_parser().parse_args(argv)), cache_dir=tmp_path)
    want = llm.generate("Hello there, " * 8, SamplingParams(8, 0.0))[0]
    assert len(calls) == 1 and printed[0] == f"{want.text}\n[{want.finish_reason}, {len(want.token_ids)} tokens]\n"
