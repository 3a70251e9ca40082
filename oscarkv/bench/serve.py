"""``oscarkv bench serve``: requests/s, TTFT and TPOT of a real loopback server per concurrency.

Role: for each KV method, start ``oscarkv serve --port 0`` in a subprocess (its own process,
as in production: the client does not share its GIL), read the bound port from its log, and
drive it with the official ``openai`` async client: ``requests`` streamed completions at each
concurrency level (a semaphore keeps ``c`` in flight), after a warm-up. Per request, TTFT is
the arrival of the first SSE chunk (the engine sends one per token) and TPOT is
``(last chunk - first chunk) / (completion tokens - 1)``; requests/s is requests over the
wall time of the level. Results print as a table and optionally go to JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from oscarkv.bench.configs import ServeBench

PROMPT = "Question {i}: in two sentences, explain why the sky is blue to a child who is {age} years old."


def run(spec: ServeBench, model: str, rotations: Path | None, out: Path | None) -> str:
    """Every level of ``spec`` against one server per KV method; the table (and JSON at ``out``)."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    rows = []
    for kv in spec.kv:
        with _server(model, kv, rotations, max(spec.concurrency)) as url:
            rows += asyncio.run(_measure(url, kv, spec))
    if out:
        out.write_text(json.dumps(rows, indent=2) + "\n")
    return format_table(rows)


class _server:
    """``oscarkv serve --port 0`` in a subprocess; the URL once it listens."""

    def __init__(self, model: str, kv: str, rotations: Path | None, max_seqs: int) -> None:
        self.cmd = [sys.executable, "-m", "oscarkv.cli", "serve", "--model", model, "--kv", kv, "--port", "0",
                    "--dtype", "float32", "--max-num-seqs", str(max_seqs), "--served-model-name", "bench"]
        self.cmd += ["--rotations", str(rotations)] if rotations else []

    def __enter__(self) -> str:
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        while self.proc.poll() is None:
            m = re.search(r"listening on (http://\S+)", Path(self.log.name).read_text())
            if m:
                return m.group(1)
            time.sleep(0.2)
        raise RuntimeError(f"server exited with {self.proc.returncode}:\n{Path(self.log.name).read_text()[-3000:]}")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


async def _one(client, i: int, max_tokens: int) -> tuple[float, float, float, int]:
    """(start, first chunk, last chunk, completion tokens) of one streamed completion."""
    start, first, n = time.perf_counter(), None, 0
    stream = await client.completions.create(model="bench", prompt=PROMPT.format(i=i, age=5 + i % 7),
                                             max_tokens=max_tokens, temperature=0, stream=True,
                                             stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for chunk in stream:
        first = first or time.perf_counter()
        n = chunk.usage.completion_tokens if chunk.usage else n
    return start, first, time.perf_counter(), n


async def _measure(url: str, kv: str, spec: ServeBench) -> list[dict]:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600)
    await asyncio.gather(*[_one(client, -1 - i, 2) for i in range(2)])  # warm-up
    rows = []
    for c in spec.concurrency:
        n, sem = spec.requests or max(4, 2 * c), asyncio.Semaphore(c)

        async def bounded(i: int):
            async with sem:
                return await _one(client, i, spec.max_tokens)

        t0 = time.perf_counter()
        res = await asyncio.gather(*[bounded(i) for i in range(n)])
        wall = time.perf_counter() - t0
        ttft = [f - s for s, f, _, _ in res]
        tpot = [(e - f) / (k - 1) for _, f, e, k in res if k > 1]
        rows.append({"kv": kv, "concurrency": c, "requests": n, "max_tokens": spec.max_tokens,
                     "requests_per_s": n / wall, "output_tok_per_s": sum(r[3] for r in res) / wall,
                     "ttft_median_s": statistics.median(ttft), "ttft_p90_s": _p90(ttft),
                     "tpot_median_s": statistics.median(tpot), "tpot_p90_s": _p90(tpot), "wall_s": wall})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _p90(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.9 * len(xs)))]


def format_table(rows: list[dict]) -> str:
    head = "| kv | concurrency | requests | req/s | out tok/s | TTFT median (s) | TTFT p90 (s) | TPOT median (s) | TPOT p90 (s) |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r['kv']} | {r['concurrency']} | {r['requests']} | {r['requests_per_s']:.3f} | "
                     f"{r['output_tok_per_s']:.2f} | {r['ttft_median_s']:.2f} | {r['ttft_p90_s']:.2f} | "
                     f"{r['tpot_median_s']:.3f} | {r['tpot_p90_s']:.3f} |")
    return "\n".join(lines)

