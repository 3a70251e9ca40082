"""The official ``openai`` client (sync, async, streaming) against a loopback server.

Greedy outputs over HTTP equal the offline engine's for the same token prompts, whether the
requests arrive one by one or concurrently (sharing continuous batches), streamed or not.
"""

import asyncio

import httpx
import openai
import pytest

from tests.server.conftest import MODEL, offline, wait_idle

PROMPTS = ["hello world", "the quick brown fox", "lorem ipsum dolor sit amet", "a"]


def _ids(tok, prompts):
    return [tok(p).input_ids for p in prompts]


def _chat_ids(tok, text):
    s = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tok(s, add_special_tokens=False).input_ids


def test_sync_client(served, model, tok):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    ref = offline(model, tok, _ids(tok, PROMPTS[:2]), 12)
    for prompt, want in zip(PROMPTS[:2], ref):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
        assert r.choices[0].text == want.text and r.choices[0].finish_reason == want.finish_reason
        assert r.usage.prompt_tokens == len(want.prompt_token_ids)
        assert r.usage.completion_tokens == len(want.token_ids)
    want = offline(model, tok, [_chat_ids(tok, "hi there")], 10)[0]
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi there"}],
                                       max_tokens=10, temperature=0, logprobs=True)
    assert r.choices[0].message.content == want.text and r.choices[0].message.role == "assistant"
    assert len(r.choices[0].logprobs.content) == len(want.token_ids)
    assert all(lp.logprob <= 0 for lp in r.choices[0].logprobs.content)
    r = client.completions.create(model=MODEL, prompt=_ids(tok, PROMPTS[:1])[0], max_tokens=12, temperature=0,
                                  logprobs=0)
    assert r.choices[0].text == ref[0].text and len(r.choices[0].logprobs.token_logprobs) == 12


def test_async_client_concurrent_streams(served, model, tok):
    """12 concurrent requests (chat and completions, streamed and not) equal offline greedy."""
    ref = offline(model, tok, _ids(tok, PROMPTS), 10)
    chat_ref = offline(model, tok, [_chat_ids(tok, p) for p in PROMPTS], 10)
    async def completion(client, p, stream):
        if not stream:
            return (await client.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0)).choices[0].text
        text = ""
        async for chunk in await client.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0,
                                                           stream=True):
            text += chunk.choices[0].text if chunk.choices else ""
        return text

    async def chat(client, p):
        parts, usage = [], None
        stream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}],
                                                      max_tokens=10, temperature=0, stream=True,
                                                      stream_options={"include_usage": True})
        async for chunk in stream:
            usage = chunk.usage or usage
            parts += [c.delta.content or "" for c in chunk.choices]
        return "".join(parts), usage

    async def main():
        # closed inside its own loop: a client left to the garbage collector schedules its close on
        # whatever loop runs then, and that task's failure is logged from inside a later test
        async with openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0) as client:
            jobs = [completion(client, p, s) for p in PROMPTS for s in (False, True)]
            return await asyncio.gather(*jobs, *[chat(client, p) for p in PROMPTS])

    res = asyncio.run(main())
    assert res[:8] == [r.text for r in ref for _ in (0, 1)]
    assert [t for t, _ in res[8:]] == [r.text for r in chat_ref]
    assert [u.completion_tokens for _, u in res[8:]] == [len(r.token_ids) for r in chat_ref]
    assert wait_idle(served)


def test_seeded_sampling_is_reproducible(served):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0)
    kw = dict(model=MODEL, prompt="seeded", max_tokens=8, temperature=0.9, top_p=0.9, seed=1234)
    assert client.completions.create(**kw).choices[0].text == client.completions.create(**kw).choices[0].text


def test_client_sees_errors(served):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, n=2)
    assert e.value.body["param"] == "n"


def test_chat_follow_ups_reuse_the_earlier_turns_ids(served, model, tok, monkeypatch):
    """A chat's next turn (the whole conversation sent again) is tokenized only past the earlier prompt's last
    added token (``TokenMemo``; short texts allowed here): usage and greedy answers equal the engine's on the whole
    text's ids, turn after turn."""
    from oscarkv.engine import token_memo

    monkeypatch.setattr(token_memo, "MIN_CHARS", 16)
    memo = served.app.state.server.model.tokens
    assert memo is not None and memo.enabled
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0)
    msgs, before = [{"role": "user", "content": "tell me about the harbour " * 4}], memo.reused
    for turn in range(3):
        r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0)
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False).input_ids
        want = offline(model, tok, [ids], 6)[0]
        assert r.usage.prompt_tokens == len(ids) and r.choices[0].message.content == want.text
        msgs += [{"role": "assistant", "content": want.text}, {"role": "user", "content": f"and then {turn}?"}]
    assert memo.reused - before > 2 * 100  # turns 2 and 3 took the earlier prompts' ids
    metrics = httpx.get(served.url + "/metrics").text
    assert f"oscarkv_prompt_tokens_reused_total {float(memo.reused)}" in metrics


def test_accepted_connections_send_without_waiting_for_acks():
    """The listening socket of ``serve`` (``launch.bind``) makes the connections the event loop accepts send
    small writes at once (``TCP_NODELAY``): a response's body written after its headers, or an SSE chunk after
    the last, never waits for the client's delayed ACK (40 ms on Linux loopback, every response)."""
    import socket

    from oscarkv.server.launch import bind

    sock = bind("127.0.0.1", 0)

    async def accepted_nodelay() -> int:
        got = asyncio.get_running_loop().create_future()
        server = await asyncio.start_server(
            lambda r, w: got.set_result(w.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)),
            sock=sock)
        _, writer = await asyncio.open_connection(*sock.getsockname())
        try:
            return await asyncio.wait_for(got, 10)
        finally:
            writer.close()
            server.close()

    assert asyncio.run(accepted_nodelay()) != 0
