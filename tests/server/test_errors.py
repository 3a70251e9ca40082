"""Bad input gets an OpenAI-style error body and a 4xx status; an engine failure a 500 (or an
error event in a stream); the server keeps serving."""

import json

import httpx
import openai
import pytest

from oscarkv.config import ServerConfig
from tests.engine.conftest import fail_once, make_artifact
from tests.server.conftest import MODEL, start, wait_idle

OK = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
CASES = [  # (id, path, body (dict or raw text), status, param)
    ("malformed-json", "/v1/completions", '{"model": "tiny", "prompt": ', 400, None),
    ("not-an-object", "/v1/completions", "[1, 2]", 400, None),
    ("unknown-model", "/v1/completions", {**OK, "model": "gpt-9"}, 404, "model"),
    ("unknown-model-chat", "/v1/chat/completions", {**CHAT, "model": "gpt-9"}, 404, "model"),
    ("missing-prompt", "/v1/completions", {"model": MODEL}, 400, "prompt"),
    ("negative-max-tokens", "/v1/completions", {**OK, "max_tokens": -1}, 400, "max_tokens"),
    ("zero-max-tokens", "/v1/chat/completions", {**CHAT, "max_tokens": 0}, 400, "max_tokens"),
    ("huge-max-tokens", "/v1/completions", {**OK, "max_tokens": 10**12}, 400, "max_tokens"),
    ("huge-max-completion-tokens", "/v1/chat/completions", {**CHAT, "max_completion_tokens": 100000}, 400, "max_tokens"),
    ("temperature-high", "/v1/completions", {**OK, "temperature": 2.5}, 400, "temperature"),
    ("temperature-negative", "/v1/chat/completions", {**CHAT, "temperature": -0.1}, 400, "temperature"),
    ("temperature-nan", "/v1/completions", '{"model": "tiny", "prompt": "x", "temperature": NaN}', 400, "temperature"),
    ("top-p-zero", "/v1/completions", {**OK, "top_p": 0}, 400, "top_p"),
    ("top-p-high", "/v1/chat/completions", {**CHAT, "top_p": 1.5}, 400, "top_p"),
    ("n-2", "/v1/chat/completions", {**CHAT, "n": 2}, 400, "n"),
    ("best-of", "/v1/completions", {**OK, "best_of": 3}, 400, "best_of"),
    ("penalty", "/v1/completions", {**OK, "presence_penalty": 0.5}, 400, "presence_penalty"),
    ("logit-bias", "/v1/chat/completions", {**CHAT, "logit_bias": {"1": 5}}, 400, "logit_bias"),
    ("tools", "/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, 400, "tools"),
    ("json-mode", "/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object"}}, 400, "response_format"),
    ("top-logprobs", "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 3}, 400, "top_logprobs"),
    ("echo", "/v1/completions", {**OK, "echo": True}, 400, "echo"),
    ("unknown-field", "/v1/completions", {**OK, "frobnicate": 1}, 400, "frobnicate"),
    ("stream-options-without-stream", "/v1/completions", {**OK, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("too-many-stops", "/v1/completions", {**OK, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("seed-too-large", "/v1/completions", {**OK, "seed": 2**70}, 400, "seed"),
    ("empty-prompt", "/v1/completions", {**OK, "prompt": ""}, 400, "prompt"),
    ("multiple-prompts", "/v1/completions", {**OK, "prompt": ["a", "b"]}, 400, "prompt"),
    ("token-out-of-vocab", "/v1/completions", {**OK, "prompt": [1, 99999]}, 400, "prompt"),
    ("prompt-longer-than-context", "/v1/completions", {**OK, "prompt": "x" * 600}, 400, "prompt"),
    ("prompt-plus-max-tokens-over-context", "/v1/completions", {**OK, "prompt": "x" * 500, "max_tokens": 20}, 400, "max_tokens"),
    ("chat-long-message", "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "y" * 600}]}, 400, "prompt"),
    ("empty-messages", "/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages"),
    ("bad-role", "/v1/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role"),
    ("image-part", "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, 400, None),
]


@pytest.mark.parametrize("path,body,status,param", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused(served, path, body, status, param):
    with httpx.Client(base_url=served.url, timeout=30) as c:
        raw = body if isinstance(body, str) else json.dumps(body)
        r = c.post(path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["message"] and err["type"]
        if param is not None:
            assert err["param"] == param, err


def test_other_http_errors_and_still_serving(served):
    with httpx.Client(base_url=served.url, timeout=30) as c:
        r = c.get("/v1/nope")
        assert r.status_code == 404 and "error" in r.json()
        r = c.get("/v1/completions")
        assert r.status_code == 405 and "error" in r.json()
        r = c.post("/v1/completions", content=b"\xff\xfe", headers={"content-type": "application/json"})
        assert r.status_code == 400
        assert c.get("/health").json() == {"status": "ok"}
        r = c.post("/v1/completions", json=OK)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


def test_engine_failure_is_a_500_and_the_server_serves_on(served, monkeypatch):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0)
    fail_once(monkeypatch, served.llm.runner, "run")
    with pytest.raises(openai.InternalServerError) as e:
        client.completions.create(model=MODEL, prompt="boom", max_tokens=4)
    assert e.value.status_code == 500 and "injected failure" in e.value.body["message"]
    assert e.value.body["type"] == "internal_server_error"
    fail_once(monkeypatch, served.llm.runner, "run")
    with pytest.raises(openai.APIError, match="injected failure"):  # the error event of a stream
        for _ in client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "boom"}],
                                                max_tokens=4, stream=True):
            pass
    assert wait_idle(served)
    assert httpx.get(served.url + "/health").json() == {"status": "ok"}
    r = client.completions.create(model=MODEL, prompt="fine", max_tokens=3, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
    metrics = httpx.get(served.url + "/metrics").text
    assert 'oscarkv_requests_total{endpoint="completions",finish_reason="error"} 1.0' in metrics
    assert 'oscarkv_http_responses_total{path="/v1/completions",status="500"} 1.0' in metrics


def test_engine_refuses_what_its_pools_cannot_hold(model, tok):
    """A BF16 pool of 5 pages: a 100-token prompt fits the context (512) but its first prefill
    chunk needs 8 BF16 pages, so the engine's check refuses it with a 400, streamed or not."""
    page = 2 * 2 * 2 * 8 * 32 * 2  # a BF16 page: 2 layers x K,V x 2 heads x 8 tokens x 32 x bf16
    kw = dict(method="oscar", artifact=make_artifact(model.config), bf16_fraction=6 * page / (1 << 22))
    with start(model, tok, ServerConfig(served_model_name=MODEL), **kw) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError, match=r"needs 8 BF16 and \d+ INT2 KV pages, but the pools hold 5"):
                client.completions.create(model=MODEL, prompt="x" * 100, max_tokens=4, stream=stream)
        r = client.completions.create(model=MODEL, prompt="x" * 20, max_tokens=20, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 20 and wait_idle(s)
