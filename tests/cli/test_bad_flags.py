"""Every command's bad-flag path, run in-process as ``oscarkv`` runs it: one line on stderr, ``oscarkv CMD:
error: ...`` naming the flag as the user typed it (never the config field behind it), exit status 2,
before any model loads (``--kv-memory-bytes``, which needs the model's size, after)."""

import re

import pytest

from oscarkv.config import ENGINE_METHODS
from oscarkv.cli.bench import BENCHES
from oscarkv.cli.flags import FIELD_PATH, flag_names, in_flag_words
from oscarkv.cli.main import COMMANDS, build_parser, main
from tests.cli.conftest import SMALL

CASES = [  # (argv, what the error line must say); TMP: a fresh empty folder
    (["generate", "--prompt", "x", "--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
    (["generate", "--prompt", "x", "--temperature", "-1"], "--temperature must be >= 0"),
    (["generate", "--prompt", "x", "--sink", "12"], "--sink (12) must be a multiple of --page-size (64)"),
    (["generate", "--prompt", "x", "--key-bits", "3"], "--key-bits must be 2 or 4, got 3"),
    (["serve", "--port", "99999"], "--port must lie in [0, 65535], got 99999"),
    (["serve", "--prefill-chunk", "100"], "--prefill-chunk (100) must be a positive multiple of --page-size (64)"),
    (["serve", "--protect-metrics"], "--protect-metrics needs --api-key"),
    (["serve", "--piecewise-graph-buckets", "512", "--l2-prefetch", "all"],
     "--piecewise-graph-buckets with --l2-prefetch"),
    (["generate", "--prompt", "x", "--piecewise-graph-buckets", "1,512"], "--piecewise-graph-buckets must be token"),
    (["eval", "--out", "TMP", "--contexts", "100"], "--contexts must be >= 256 tokens, got (100,)"),
    (["eval", "--out", "TMP", "--methods", "bf16,fp8"], "--methods: unknown ['fp8']"),
    (["calibrate", "--out", "TMP", "--tokens", "32", "--chunk", "64"], "--tokens (32) must be >= --chunk (64) >= 16"),
    (["calibrate", "--out", "TMP", "--max-bpe", "2"], "--max-bpe must exceed 2 bits, got 2.0"),
    (["calibrate", "--out", "TMP", "--allocate", "key-heads"], "--allocate ('key-heads',) needs --max-bpe"),
    (["calibrate", "--out", "TMP", "--max-bpe", "3", "--allocate", "key,key-heads"],
     "--allocate: key and key-heads both raise keys"),
    (["demo", "--samples", "0"], "--samples must be >= 1, got 0"),
    (["report", "--run", "TMP"], "point --run at"),
    (["import-rotations", "TMP", "--model", "default", "--out", "TMP/a", "--key-clip", "2"],
     "--key-clip must lie in (0, 1], got 2.0"),
    (["export-rotations", "TMP/none", "--out", "TMP/a"], "TMP/none"),
    (["bench", "attention", "--key-bits", "3"], "--key-bits must be 2 or 4, got 3"),
    (["bench", "decode", "--methods", "fp8"], f"--methods must be methods of {ENGINE_METHODS}, got ('fp8',)"),
    (["bench", "prefill", "--chunks", "0"], "--chunks must be >= 1, got (0,)"),
    (["bench", "jobs", "--requests", "0"], "--requests must be >= 1, got 0"),
    (["bench", "capacity", "--methods", "naive"], "--methods must include 'bf16'"),
    (["bench", "engine", "--batches", "1,0"], "--batches must be >= 1, got (1, 0)"),
    (["bench", "serve", "--kv", "kivi"], f"--kv must be methods of {ENGINE_METHODS}, got ('kivi',)"),
    (["bench", "followup", "--new-tokens", "8,0"], "--new-tokens must be >= 1, got (8, 0)"),
    (["generate", "--prompt", "x", "--speculative", "ngram", "--min-accepted-tokens", "9"],
     "--min-accepted-tokens must be in [0, --num-speculative-tokens (4)], got 9.0"),
    (["bench", "speculative", "--num-speculative-tokens", "2,4", "--min-accepted-tokens", "3"],
     "--min-accepted-tokens must be in [0, the smallest --num-speculative-tokens (2)], got 3.0"),
    (["bench", "speculative", "--speculative", "none"], "--speculative must be one of ('ngram',), got 'none'"),
]


def _error_line(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("argv,says", CASES, ids=[" ".join(a[:2]) + f" {i}" for i, (a, _) in enumerate(CASES)])
def test_bad_flag_is_one_line_naming_the_flag(argv, says, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OSCARKV_API_KEY", raising=False)
    argv = [a.replace("TMP", str(tmp_path)) for a in argv]
    line = _error_line(argv, capsys)
    command = argv[0]
    assert line.startswith(f"oscarkv {command}: error: "), line
    assert says.replace("TMP", str(tmp_path)) in line, line
    assert not FIELD_PATH.search(line.split(str(tmp_path))[0]), line  # no ServerConfig.port left


def test_every_command_and_bench_has_a_bad_flag_case():
    assert {a[0] for a, _ in CASES} == set(COMMANDS)
    assert {a[1] for a, _ in CASES if a[0] == "bench"} == set(BENCHES)


def test_kv_memory_too_small_names_the_flag(model_dir, capsys):
    """Found only once the model's size is known: the error is the last line, after the windows line."""
    argv = ["generate", "--model", str(model_dir), "--kv", "bf16", "--prompt", "x", *SMALL, "--kv-memory-bytes", "1000"]
    assert main(argv) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("oscarkv generate: error: --kv-memory-bytes=1000 is too small"), line


def test_flags_name_the_fields_they_set():
    """The mapping is the parser's own: each flag sets the attribute of its field's name, so
    translating a field names a flag of that command that sets it (``--seed`` of generate sets
    ``sample_seed``, not ``EngineConfig.seed``)."""
    parser = build_parser()
    gen = flag_names(parser, "generate")
    assert gen["kv_memory_bytes"] == "--kv-memory-bytes" and gen["sample_seed"] == "--seed" and "seed" not in gen
    assert "port" not in gen and flag_names(parser, "serve")["port"] == "--port"
    assert in_flag_words("EngineConfig.seed and KVConfig.key_bits/value_bits", gen) == \
        "EngineConfig.seed and --key-bits/--value-bits"
    for dest, flag in flag_names(parser).items():  # one spelling per field, over all commands
        assert re.fullmatch(r"--[a-z0-9-]+", flag) and (flag == "--" + dest.replace("_", "-") or dest == "sample_seed")
