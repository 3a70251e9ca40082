"""``--api-key`` / ``OSCARKV_API_KEY``: every ``/v1/*`` route asks for the bearer token and answers
401 with an OpenAI error body without it; ``/health`` stays open; ``/metrics`` is open unless
``protect_metrics``. Checked with the official ``openai`` client: right key, wrong key, none."""

import httpx
import openai
import pytest

from oscarkv.cli.main import build_parser
from oscarkv.cli.serve import API_KEY_ENV, server_config
from oscarkv.config import ServerConfig
from tests.server.conftest import MODEL, start

KEY = "sk-test-8d1f0c"


@pytest.fixture(scope="module")
def guarded(model, tok):
    with start(model, tok, ServerConfig(served_model_name=MODEL, default_max_tokens=4, api_key=KEY)) as s:
        yield s


def test_the_right_key_is_served(guarded):
    client = openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.usage.completion_tokens >= 1
    chunks = list(client.completions.create(model=MODEL, prompt="x", max_tokens=3, stream=True))
    assert chunks and chunks[-1].choices[0].finish_reason is not None


@pytest.mark.parametrize("key", ["sk-wrong", ""], ids=["wrong-key", "no-key"])
def test_a_wrong_or_missing_key_is_a_401(guarded, key):
    client = openai.OpenAI(base_url=guarded.url + "/v1", api_key=key or "unused", max_retries=0,
                           default_headers={} if key else {"Authorization": ""})
    for call in (lambda: client.models.list(),
                 lambda: client.completions.create(model=MODEL, prompt="x", max_tokens=2),
                 lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])):
        with pytest.raises(openai.AuthenticationError) as e:
            call()
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
        assert ("Incorrect API key" if key else "Missing API key") in e.value.body["message"]


def test_health_and_metrics_stay_open(guarded):
    assert httpx.get(guarded.url + "/health").json() == {"status": "ok"}
    metrics = httpx.get(guarded.url + "/metrics")
    assert metrics.status_code == 200 and 'status="401"' in metrics.text


def test_protected_metrics(model, tok):
    with start(model, tok, ServerConfig(served_model_name=MODEL, api_key=KEY, protect_metrics=True)) as s:
        assert httpx.get(s.url + "/metrics").status_code == 401
        assert httpx.get(s.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert httpx.get(s.url + "/health").status_code == 200


def test_the_key_comes_from_the_flag_or_the_environment(monkeypatch):
    parse = build_parser().parse_args
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert server_config(parse(["serve"])).api_key == ""
    assert server_config(parse(["serve", "--api-key", "flag"])).api_key == "flag"
    monkeypatch.setenv(API_KEY_ENV, "env")
    assert server_config(parse(["serve"])).api_key == "env"
    assert server_config(parse(["serve", "--api-key", "flag"])).api_key == "flag"
    assert "env" not in repr(server_config(parse(["serve"])))  # the secret stays out of logs and reprs
