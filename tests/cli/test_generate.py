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
