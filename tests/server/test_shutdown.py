"""SIGTERM (or SIGINT) on a real ``oscarkv serve`` process: it stops accepting, lets the
streams in flight finish within ``--shutdown-grace`` or ends them with an error event, frees
their pages and exits with status 0."""

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import SMALL

ROOT = Path(__file__).resolve().parents[2]
BODY = {"model": "tiny", "prompt": "drain me", "temperature": 0, "ignore_eos": True, "stream": True}


class ServeProcess:
    """``python -m oscarkv.cli.main serve ...`` on a free port; its stderr read line by line."""

    def __init__(self, model_dir, *flags: str) -> None:
        cmd = [sys.executable, "-m", "oscarkv.cli.main", "serve", "--model", str(model_dir), "--kv", "bf16",
               "--served-model-name", "tiny", "--port", "0", *flags, *SMALL]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        self.log = []
        port = None
        while port is None:
            line = self.proc.stderr.readline()
            assert line, f"the server ended during start-up: {''.join(self.log)}"
            self.log.append(line)
            port = re.search(r"listening on http://[^:]+:(\d+)", line)
        self.url = f"http://127.0.0.1:{port.group(1)}"

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=60)
        self.log += self.proc.stderr.readlines()
        return rc


def _events(lines) -> list:
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stream_in_flight_finishes_within_the_grace_period(model_dir, sig):
    server = ServeProcess(model_dir, "--shutdown-grace", "60", "--host", "0.0.0.0")
    try:
        with httpx.stream("POST", server.url + "/v1/completions", json={**BODY, "max_tokens": 120, "stream_options": {"include_usage": True}},
                           timeout=60) as r:
            lines = r.iter_lines()
            first = next(lines)
            server.proc.send_signal(sig)
            rest = list(lines)
        with pytest.raises(httpx.ConnectError):  # no new connections once the signal arrived
            httpx.get(server.url + "/health", timeout=5)
    finally:
        rc = server.stop(sig)
    events = _events([first, *rest])
    assert events[-1] == "[DONE]" and json.loads(events[-3])["choices"][0]["finish_reason"] == "length"
    assert json.loads(events[-2])["usage"]["completion_tokens"] == 120
    log = "".join(server.log)
    assert rc == 0, log
    assert "beyond loopback, without an API key" in log  # --host 0.0.0.0 without a key
    assert "1 request(s) finished within the grace period, 0 ended with an error" in log
    assert "KV pages still held: 0" in log


def test_stream_past_the_grace_period_ends_with_an_error_event(model_dir):
    server = ServeProcess(model_dir, "--shutdown-grace", "0")
    try:
        with httpx.stream("POST", server.url + "/v1/completions", json={**BODY, "max_tokens": 480}, timeout=60) as r:
            lines = r.iter_lines()
            first = next(lines)
            server.proc.send_signal(signal.SIGTERM)
            rest = list(lines)
    finally:
        rc = server.stop()
    events = _events([first, *rest])
    error = json.loads(events[-2])["error"]
    assert events[-1] == "[DONE]" and error["code"] == "shutting_down" and "grace period" in error["message"]
    assert len(events) < 480
    log = "".join(server.log)
    assert rc == 0, log
    assert "0 request(s) finished within the grace period, 1 ended with an error" in log
    assert "KV pages still held: 0" in log
