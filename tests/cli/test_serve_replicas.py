"""``oscarkv serve --data-parallel-size N`` before anything starts: each replica gets exactly the flags the
user gave (parsing its argv gives back the same engine, server and node settings), a missing router or an
API key is one line and exit status 2; and one replica's ``/metrics`` carries vLLM's names with the
values of oscarkv's own series."""

import re

import httpx

from oscarkv.cli.main import build_parser, main
from oscarkv.cli.serve import NOT_FORWARDED, build, replica_argv
from oscarkv.server import replicas
from oscarkv.server.launch import serving_in_thread
from tests.cli.conftest import SMALL


def test_replicas_get_the_flags_given():
    p = build_parser()
    given = p.parse_args(["serve", "--data-parallel-size", "3", "--kv", "bf16", "--no-enable-prefix-caching",
                          "--page-size", "32", "--sink", "32", "--max-num-seqs", "7", "--port", "9000", "--overlap"])
    again = p.parse_args(["serve", *replica_argv(given)])
    differ = {k for k in vars(given) if getattr(given, k) != getattr(again, k)}
    assert differ == {"data_parallel_size", "port"} and differ <= NOT_FORWARDED


def test_refusals_are_one_line(monkeypatch, capsys):
    monkeypatch.setattr(replicas, "router_available", lambda: False)
    assert main(["serve", "--data-parallel-size", "2"]) == 2
    assert "pip install 'oscarkv[router]'" in capsys.readouterr().err
    monkeypatch.setattr(replicas, "router_available", lambda: True)
    assert main(["serve", "--data-parallel-size", "2", "--api-key", "k"]) == 2
    assert "--data-parallel-size with an API key is not supported" in capsys.readouterr().err
    assert main(["serve", "--data-parallel-size", "2", "--router-policy", "nearest"]) == 2
    assert "--router-policy must be one of" in capsys.readouterr().err  # the flag, in its own words


def series(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_vllm_names_match_oscarkv_series(model_dir):
    built = build(build_parser().parse_args(["serve", "--model", str(model_dir), "--kv", "bf16", *SMALL]))
    try:
        with serving_in_thread(built.app) as url:
            body = {"model": str(model_dir), "prompt": [5] * 80, "max_tokens": 3, "temperature": 0}
            for _ in range(2):
                assert httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 200
            m = httpx.get(url + "/metrics").text
    finally:
        built.engine.close()
    assert series(m, "vllm:prefix_cache_hits_total") == series(m, "oscarkv_prefix_cache_hit_tokens_total") > 0
    assert series(m, "vllm:prefix_cache_queries_total") == series(m, "oscarkv_prompt_tokens_total") == 160
    assert series(m, "vllm:num_requests_running") == series(m, "oscarkv_running_requests") == 0
    assert series(m, "vllm:kv_cache_usage_perc") == series(m, "vllm:gpu_cache_usage_perc") == max(
        float(v) for v in re.findall(r"^oscarkv_kv_pool_occupancy{[^}]*} (\S+)$", m, re.M))


def test_the_router_blocks_are_the_replicas_pages(monkeypatch):
    """Without ``--page-size`` the default model's replicas serve the shipped recipe's pages: the router is told
    that block size and every replica gets it as a flag (an explicit ``--page-size`` wins for both)."""
    from oscarkv.data import default_recipe

    monkeypatch.setattr(replicas, "router_available", lambda: True)
    seen = []
    monkeypatch.setattr(replicas, "run", lambda cfg, argv, where, block: seen.append((argv, block)) or 0)
    pages = default_recipe()["recipe"]["page_size"]
    for extra, want in (([], pages), (["--page-size", "32"], 32)):
        assert main(["serve", "--data-parallel-size", "2", *extra]) == 0
        argv, (block, _) = seen.pop()
        assert block == want and argv[argv.index("--page-size") + 1] == str(want)
