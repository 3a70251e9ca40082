"""A client that disconnects has its request aborted and its pages freed; a full pool queues
or preempts and never fails a request; /metrics reports it."""

import asyncio

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from oscarkv.config import ServerConfig
from tests.server.conftest import MODEL, offline, start, wait_idle


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


def test_disconnect_mid_stream_aborts_and_frees(served):
    body = {"model": MODEL, "prompt": "stream then leave", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.Client(base_url=served.url, timeout=30) as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(x.startswith("data: ") for x in got)
            assert served.llm.has_unfinished()
        # leaving the block closes the connection mid-stream
    assert wait_idle(served), "request not aborted or pages not freed after disconnect"
    assert _metrics(served.url)['oscarkv_requests_total{endpoint=completions}{finish_reason=abort}'] >= 1


def test_disconnect_while_waiting_for_a_json_response(served):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "long"}], "max_tokens": 400,
            "temperature": 0, "ignore_eos": True}
    try:
        httpx.post(served.url + "/v1/chat/completions", json=body, timeout=0.5)
    except httpx.TimeoutException:
        pass
    assert wait_idle(served), "non-streaming request kept running after its client left"


def test_full_pool_queues_and_preempts(model, tok):
    """A pool of 5 pages (40 tokens), 10 concurrent requests of up to 32 tokens: every one is
    answered, equal to offline greedy; preemptions are counted; occupancy returns to zero."""
    kw = dict(kv_memory_bytes=6 * 8192, max_num_seqs=8)  # a BF16 page: 2 layers x K,V x 2 heads x 8 x 32 x fp32
    prompts = [[(7 * i + j) % 250 for j in range(9 + i)] for i in range(10)]
    ref = offline(model, tok, prompts, 14, ignore_eos=True, **kw)
    with start(model, tok, ServerConfig(served_model_name=MODEL), **kw) as s:
        async def one(client, p):
            r = await client.completions.create(model=MODEL, prompt=p, max_tokens=14, temperature=0,
                                                extra_body={"ignore_eos": True})
            return r.choices[0].text

        async def main():  # the client is closed inside its own loop (see test_openai_client)
            async with openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0) as client:
                return await asyncio.gather(*[one(client, p) for p in prompts])

        texts = asyncio.run(main())
        during = _metrics(s.url)
        assert wait_idle(s)
        after = _metrics(s.url)
    assert texts == [r.text for r in ref]
    assert during["oscarkv_preemptions_total"] >= 1
    assert after["oscarkv_kv_pages_used{tier=bf16}"] == 0 and after["oscarkv_queue_depth"] == 0
    assert after["oscarkv_requests_total{endpoint=completions}{finish_reason=length}"] == 10
    assert after["oscarkv_time_to_first_token_seconds_count"] == 10
    assert after["oscarkv_time_per_output_token_seconds_count"] == 10
    assert after["oscarkv_generation_tokens_total"] == 140
    assert after["oscarkv_prompt_tokens_total"] == sum(map(len, prompts))
    assert 0 <= after["oscarkv_prefix_cache_hit_rate"] <= 1 and after["oscarkv_kv_bpe_at_capacity"] == 32
    assert after["oscarkv_http_responses_total{path=/v1/completions}{status=200}"] == 10
