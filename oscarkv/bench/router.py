"""Replicas behind vllm-router, measured as users run them: prefix-cache hit rate by policy, and failover.

Role: :class:`Fleet` starts ``oscarkv serve --data-parallel-size N --port 0`` in a subprocess (the one
command a user types) and reads the router's and the replicas' addresses (and pids) from its log.
:func:`hit_rate` sends requests that share a long prefix through a router, one after the other, and reads
what the replicas' ``/metrics`` say they served from their prefix caches (vLLM's counter names), per
replica. :func:`failover` starts a long request, SIGKILLs the replica serving it (found by its
``vllm:num_requests_running``), and records how that request ended and how the next requests fared.
``python -m oscarkv.bench.router`` prints both for ``cache_aware`` against ``round_robin`` (a second
vllm-router over the same replicas). ``tests/server/test_router.py`` asserts on the same figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

START_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 120.0


@dataclass
class Fleet:
    """A running ``oscarkv serve --data-parallel-size N``: its process, the router and the replicas."""

    proc: subprocess.Popen
    log: Path
    router: str = ""
    replicas: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)

    @classmethod
    @contextlib.contextmanager
    def start(cls, n: int, serve_args: list[str], policy: str = "cache_aware"):
        log = Path(tempfile.mkstemp(prefix="oscarkv-fleet-", suffix=".log")[1])
        cmd = [sys.executable, "-m", "oscarkv.cli", "serve", "--data-parallel-size", str(n), "--port", "0",
               "--router-policy", policy, *serve_args]
        with open(log, "w") as f:
            fleet = cls(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT), log)
        try:
            fleet._wait(n)
            yield fleet
        finally:
            fleet.stop()
            log.unlink(missing_ok=True)

    def _wait(self, n: int) -> None:
        end = time.monotonic() + START_TIMEOUT_S
        while len(self.replicas) < n:
            text = self.log.read_text()
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"oscarkv serve --data-parallel-size {n} did not start:\n{text[-3000:]}")
            if m := re.search(r"vllm-router \(\w+\) on (\S+) in front", text):
                self.router = m.group(1)
                found = re.findall(r"replica \d+: (\S+) .*pid (\d+)\)", text)
                self.replicas, self.pids = [u for u, _ in found], [int(p) for _, p in found]
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def metric(url: str, name: str) -> float:
    """One series of ``url``'s ``/metrics`` (summed over labels)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def prefix_prompts(n: int, prefix_words: int, tag: str) -> list[str]:
    """``n`` prompts sharing a prefix of ``prefix_words`` words (``tag`` makes the prefix new to the caches)."""
    prefix = " ".join(f"{tag}{i % 97}" for i in range(prefix_words))
    return [f"{prefix}\nQuestion {i}: what comes next?" for i in range(n)]


def complete(url: str, prompt: str, max_tokens: int, timeout: float = REQUEST_TIMEOUT_S) -> httpx.Response:
    body = {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=timeout)


def hit_rate(router: str, replicas: list[str], prompts: list[str], max_tokens: int) -> dict:
    """Send ``prompts`` one by one through ``router``; prefix-cache hit tokens / prompt tokens over the
    replicas (the change in their counters), the requests each replica took, and the texts."""
    def counters():
        return [(metric(u, "vllm:prefix_cache_hits_total"), metric(u, "vllm:prefix_cache_queries_total")) for u in replicas]
    before, texts = counters(), []
    for p in prompts:
        r = complete(router, p, max_tokens)
        r.raise_for_status()
        texts.append(r.json()["choices"][0]["text"])
    after = counters()
    hits = [a[0] - b[0] for a, b in zip(after, before)]
    queries = [a[1] - b[1] for a, b in zip(after, before)]
    return {"hit_rate": sum(hits) / max(sum(queries), 1), "queries_per_replica": queries, "texts": texts}


def failover(fleet: Fleet, prompt: str, long_tokens: int, after: list[str], max_tokens: int) -> dict:
    """Kill the replica streaming a long request; how that stream ended, and the requests sent after.
    NOTE: streamed, because vllm-router retries a non-streamed request on another replica (from scratch)."""
    result: dict = {"events": 0}

    def long_request() -> None:
        t = time.monotonic()
        body = {"model": "default", "prompt": prompt, "max_tokens": long_tokens, "temperature": 0, "stream": True}
        try:
            with httpx.stream("POST", f"{fleet.router}/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S) as r:
                result["status"] = r.status_code
                for line in r.iter_lines():
                    result["events"] += line.startswith("data:")
                    result["last"] = line[:300]
        except httpx.HTTPError as e:
            result["error"] = f"{type(e).__name__}: {e}"
        result["seconds"] = time.monotonic() - t
    thread = threading.Thread(target=long_request, daemon=True)
    thread.start()
    victim = _busy_replica(fleet.replicas, thread)
    os.kill(fleet.pids[victim], signal.SIGKILL)
    thread.join(timeout=REQUEST_TIMEOUT_S)
    result["hung"] = thread.is_alive()
    t, later = time.monotonic(), []
    for p in after:
        r = complete(fleet.router, p, max_tokens)
        later.append((r.status_code, r.json()["choices"][0]["text"] if r.status_code == 200 else r.text[:200]))
    out = {"killed": victim, "in_flight": result, "after": later, "after_seconds": time.monotonic() - t}
    if any(code != 200 for code, _ in later):  # the router's and replicas' own account of it
        out["log_tail"] = fleet.log.read_text(errors="replace")[-4000:]
    return out


def _busy_replica(replicas: list[str], thread: threading.Thread) -> int:
    while thread.is_alive():
        for i, u in enumerate(replicas):
            if metric(u, "vllm:num_requests_running") > 0:
                return i
        time.sleep(0.05)
    raise RuntimeError("the long request finished before a replica was seen running it; raise its max_tokens")


@contextlib.contextmanager
def router(replicas: list[str], policy: str):
    """A second vllm-router over the same replicas (the baseline policy), on free loopback ports."""
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    cmd = [sys.executable, "-m", "vllm_router.launch_router", "--port", str(ports[0]), "--prometheus-port",
           str(ports[1]), "--policy", policy, "--worker-urls", *replicas]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, end = f"http://127.0.0.1:{ports[0]}", time.monotonic() + 60
    try:
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"vllm-router --policy {policy} did not start")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m oscarkv.bench.router", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--prefix-words", type=int, default=700, help="shared prefix (the default model: ~1.5 tokens/word)")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--json", type=Path, default=None)
    args, serve_args = p.parse_known_args(argv)
    serve_args = serve_args or ["--device", "cpu", "--kv-memory-bytes", str(64 << 20)]
    with Fleet.start(2, serve_args) as fleet:
        aware = hit_rate(fleet.router, fleet.replicas, prefix_prompts(args.requests, args.prefix_words, "a"), args.max_tokens)
        with router(fleet.replicas, "round_robin") as rr:
            robin = hit_rate(rr, fleet.replicas, prefix_prompts(args.requests, args.prefix_words, "b"), args.max_tokens)
        fail = failover(fleet, prefix_prompts(1, 50, "c")[0], 400, prefix_prompts(3, 50, "d"), args.max_tokens)
    rows = {"cache_aware": aware, "round_robin": robin}
    for name, r in rows.items():
        print(f"{name:12s} prefix-cache hit rate {r['hit_rate']:.3f}  prompt tokens per replica {r['queries_per_replica']}")
    f = fail["in_flight"]
    print(f"failover: replica {fail['killed']} killed mid-stream -> that stream: HTTP {f.get('status')}, "
          f"{f['events']} events, ended after {f['seconds']:.1f} s with {f.get('error') or f.get('last')!r}; "
          f"hung: {f['hung']}; next {len(fail['after'])} requests: {[s for s, _ in fail['after']]} "
          f"in {fail['after_seconds']:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"policies": {k: {x: v[x] for x in ("hit_rate", "queries_per_replica")}
                                                      for k, v in rows.items()}, "failover": fail}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
