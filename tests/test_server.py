"""The OpenAI-compatible server (course_lib.serving.server) with the official ``openai`` client on localhost.

Oracle for the text: ``course_lib.generation.generate`` (one request decoded alone, contiguous cache), greedy,
decoded with the model's tokenizer. The server runs uvicorn in a thread on a free port for the whole module
(one model load); the load test is time-boxed and checks every stream against the non-streamed answer.

Bad clients are real ones: the ``openai`` client closing a stream, a raw socket closed before the answer, a
body past the limit. What the engine did is read from the engine itself (its state recorded on the engine
thread at each abort); nothing asserts a duration: the event-loop check is an ordering (``/health``
answered while the tokenizer was held).
"""
import json
import socket
import threading
import time

import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

from course_lib.generation import generate  # noqa: E402
from course_lib.perf.metrics import format_summary  # noqa: E402
from course_lib.serving.loadtest import load_test  # noqa: E402
from course_lib.serving.server import build_app, chat_prompt, serve_in_thread  # noqa: E402
from course_lib.serving.server_metrics import parse_metrics  # noqa: E402

PROMPTS = ["Once upon a time", "The little dog", "She opened the door and", "In the morning the"]


@pytest.fixture(scope="module")
def server():
    app = build_app("tiny", device="cpu", num_blocks=128, max_batch=8)
    with serve_in_thread(app) as url:
        yield url, app.state.server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)


def greedy_text(state, prompt: str, n: int) -> str:
    """The oracle: the prompt decoded alone, greedy, stopping at end-of-text as the server does."""
    ids = state.encode(prompt)
    with torch.inference_mode():
        toks = generate(state.model, ids, n, cache="contiguous").tokens.tolist()
    toks = toks[0] if toks and isinstance(toks[0], list) else toks
    eos = state.stop_token_ids
    if eos and eos[0] in toks:
        toks = toks[:toks.index(eos[0]) + 1]
    return state.decode(toks)


def test_models_endpoint(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny"]


def test_completion_matches_greedy_decoding_alone(client, server):
    r = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0)
    assert r.object == "text_completion" and len(r.choices) == 1
    assert r.choices[0].text == greedy_text(server[1], PROMPTS[0], 12)
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.prompt_tokens == len(server[1].encode(PROMPTS[0]))
    assert r.usage.completion_tokens <= 12 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streamed_completion_equals_the_non_streamed_one(client):
    ref = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=10, temperature=0)
    chunks = list(client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == ref.choices[0].text
    assert len([c for c in chunks if c.choices]) >= 2, "a stream of one chunk is not streaming"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == ref.choices[0].finish_reason
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == ref.usage.completion_tokens


def test_chat_completion_streamed_and_not(client, server):
    msgs = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "A story about a cat"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    from course_lib.serving.server import chat_prompt
    assert r.choices[0].message.content == greedy_text(server[1], chat_prompt(msgs), 8)
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_seeded_sampling_is_reproducible(client):
    kw = dict(model="tiny", prompt=PROMPTS[2], max_tokens=10, temperature=1.0, top_p=0.9, seed=1234)
    assert client.completions.create(**kw).choices[0].text == client.completions.create(**kw).choices[0].text


BAD = [
    ("completions", {"model": "tiny", "max_tokens": 4}, 400, "prompt"),
    ("completions", {"model": "tiny", "prompt": "", "max_tokens": 4}, 400, "empty"),
    ("completions", {"model": "tiny", "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"model": "tiny", "prompt": "hi", "max_tokens": 100000}, 400, "context"),
    ("completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2.5}, 400, "max_tokens"),
    ("completions", {"model": "gpt-17", "prompt": "hi"}, 404, "unknown model"),
    ("completions", {"prompt": "hi"}, 400, "model"),
    ("completions", {"model": "tiny", "prompt": "hi", "n": 2}, 400, "n=2"),
    ("completions", {"model": "tiny", "prompt": "hi", "stop": ["\n"]}, 400, "stop"),
    ("completions", {"model": "tiny", "prompt": "hi", "logprobs": 3}, 400, "logprobs"),
    ("completions", {"model": "tiny", "prompt": "hi", "echo": True}, 400, "echo"),
    ("completions", {"model": "tiny", "prompt": "hi", "frequency_penalty": 0.5}, 400, "frequency_penalty"),
    ("completions", {"model": "tiny", "prompt": "hi", "temprature": 0}, 400, "temprature"),
    ("completions", {"model": "tiny", "prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("completions", {"model": "tiny", "prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("completions", {"model": "tiny", "prompt": ["a", "b"]}, 400, "batch"),
    ("completions", {"model": "tiny", "prompt": [1, 99999]}, 400, "vocabulary"),
    ("completions", {"model": "tiny", "prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream"),
    ("chat/completions", {"model": "tiny", "messages": []}, 400, "messages"),
    ("chat/completions", {"model": "tiny"}, 400, "messages"),
    ("chat/completions", {"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ("chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": [{}]}, 400,
     "tools"),
]


@pytest.mark.parametrize("path,body,status,words", BAD, ids=[f"{p}-{w}" for p, _, _, w in BAD])
def test_bad_requests_get_4xx_with_a_clear_message(server, path, body, status, words):
    r = httpx.post(f"{server[0]}/v1/{path}", json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert words.lower() in err["message"].lower(), err


def test_invalid_json_and_the_client_sees_the_message(server, client):
    r = httpx.post(f"{server[0]}/v1/completions", content=b"{not json", timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="tiny", prompt="hi", max_tokens=-3)
    with pytest.raises(openai.NotFoundError, match="unknown model"):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_bounded_load_test_no_lost_or_mixed_streams(server):
    url, state = server
    before = parse_metrics(httpx.get(url + "/metrics", timeout=30).text)
    res = load_test(url, "tiny", PROMPTS, concurrency=4, duration_s=2.0, max_tokens=8)
    print(format_summary(res.summary))
    assert res.ok, res.problems[:5]
    s = res.summary
    assert s["requests"] >= 4 and s["throughput_tok_s"] > 0 and s["ttft_p50"] > 0
    assert s["ttft_p50"] <= s["ttft_p90"] <= s["ttft_p99"]
    # every prompt was served, and each stream equals its prompt's reference (load_test checked the texts)
    assert {t.rid for t in res.traces} == set(range(len(PROMPTS)))
    after = parse_metrics(httpx.get(url + "/metrics", timeout=30).text)
    finished = after['course_requests_finished_total{finish_reason="length"}'] + after.get(
        'course_requests_finished_total{finish_reason="stop"}', 0)
    assert after["course_time_to_first_token_seconds_count"] == finished
    gained = after["course_generation_tokens_total"] - before["course_generation_tokens_total"]
    assert gained >= sum(t.n_tokens for t in res.traces)
    # idle again: nothing queued or running, every KV block back in the pool
    assert after["course_queue_length"] == after["course_running_requests"] == after["course_kv_blocks_used"] == 0
    assert after["course_kv_blocks_total"] == 128
    assert after["course_token_throughput"] > 0


def test_load_test_refuses_remote_urls():
    with pytest.raises(ValueError, match="localhost"):
        load_test("http://example.com:8000", "tiny", ["x"])


def test_metrics_page_is_prometheus_text(server):
    r = httpx.get(server[0] + "/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    names = parse_metrics(r.text)
    for key in ("course_queue_length", "course_running_requests", "course_kv_blocks_used",
                "course_token_throughput", "course_e2e_request_latency_seconds_bucket{le=\"+Inf\"}",
                "course_time_per_output_token_seconds_count"):
        assert key in names, key
    assert httpx.get(server[0] + "/health", timeout=30).json() == {"status": "ok"}


def test_course_serve_command_help(capsys):
    from course_lib.cli import main
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--model" in out and "--max-body-bytes" in out


def test_json_bodies_are_what_openai_sends(server):
    """A raw SSE stream: data lines of JSON chunks, ending with [DONE]."""
    with httpx.stream("POST", server[0] + "/v1/completions", timeout=30,
                      json={"model": "tiny", "prompt": "Hello", "max_tokens": 3, "temperature": 0,
                            "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[len("data: "):]) for ln in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] is not None


# --- bad clients ---------------------------------------------------------------------------------------------
def wait_until(cond, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def metrics(url) -> dict:
    return parse_metrics(httpx.get(url + "/metrics", timeout=30).text)


def finished(state) -> float:
    """Requests that ran to their end (length or stop), from the server's metrics registry."""
    get = state.metrics.registry.get_sample_value
    return sum(get("course_requests_finished_total", {"finish_reason": r}) or 0 for r in ("length", "stop"))


@pytest.fixture
def aborts(server, monkeypatch):
    """The engine as each abort left it, recorded on the engine thread right after ``abort_request``."""
    state = server[1]
    eng, real, rec = state.engine, state.metrics.on_abort, []

    def on_abort(trace=None):
        if trace is None:                  # the client left before the request reached the engine
            rec.append({"trace": None})
        else:
            rid = trace.rid
            rec.append({"trace": trace, "in_engine": rid in eng.requests,
                        "scheduled": any(r.id == rid for r in list(eng.running) + list(eng.waiting)),
                        "holds_kv": rid in eng.cache.computed, "blocks_used": eng.manager.num_used_blocks,
                        "blocks_of_others": sum(len(eng.manager.block_table(r.id)) for r in eng.running)})
        real(trace)

    monkeypatch.setattr(state.metrics, "on_abort", on_abort)
    return rec


def assert_aborted_and_freed(a, max_tokens):
    t = a["trace"]
    print(f"aborted after {t.n_tokens} of {max_tokens} tokens")
    assert t.finish_reason == "abort", t
    assert t.n_tokens < max_tokens // 2, f"{t.n_tokens} of {max_tokens} tokens generated for a client that left"
    assert not a["in_engine"] and not a["scheduled"], "the engine still holds the aborted request"
    assert not a["holds_kv"] and a["blocks_used"] == a["blocks_of_others"], a


def test_a_client_that_disconnects_mid_stream_is_aborted(server, client, aborts):
    """The openai client reads three chunks of a 480-token stream and closes it while another client
    streams: the engine drops the request at once (few tokens, blocks freed, out of the scheduler), the
    abort is counted, and the other client gets exactly its greedy answer."""
    url, state = server
    before, done0 = metrics(url), finished(state)
    leaving = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=480, temperature=0, stream=True)
    first = [next(leaving) for _ in range(3)]
    other = {}

    def other_client():
        chunks = list(client.completions.create(model="tiny", prompt=PROMPTS[3], max_tokens=40, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        other["text"] = "".join(c.choices[0].text for c in chunks if c.choices)
        other["reason"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        other["tokens"] = chunks[-1].usage.completion_tokens

    th = threading.Thread(target=other_client)
    th.start()
    wait_until(lambda: len(state.engine.running) == 2, 30)     # both in the batch (best effort)
    leaving.close()                                            # the connection closes: the client is gone
    th.join(60)
    wait_until(lambda: aborts or finished(state) > done0 + 1)  # aborted, or both ran to their end

    assert len(first) == 3 and len(aborts) == 1, "the request of the client that left was not aborted"
    assert_aborted_and_freed(aborts[0], 480)
    assert other["text"] == greedy_text(state, PROMPTS[3], 40) and other["reason"] in ("length", "stop")
    assert wait_until(lambda: metrics(url)["course_kv_blocks_used"] == 0, 30)
    after = metrics(url)
    assert after["course_requests_aborted_total"] - before["course_requests_aborted_total"] == 1
    # not one token more than the aborted request's trace and the other request hold
    gained = after["course_generation_tokens_total"] - before["course_generation_tokens_total"]
    assert gained == aborts[0]["trace"].n_tokens + other["tokens"]
    assert after["course_running_requests"] == after["course_queue_length"] == 0


def test_a_client_that_leaves_before_a_non_streamed_answer_is_aborted(server, aborts):
    """A raw socket sends a 480-token request without streaming and closes once the engine generates."""
    url, state = server
    before, done0 = metrics(url), finished(state)
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 480, "temperature": 0}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + body)
        assert wait_until(lambda: any(len(r.generated) >= 2 for r in list(state.engine.running)), 60)
    wait_until(lambda: aborts or finished(state) > done0)      # aborted, or it ran to its end
    assert len(aborts) == 1, "the request of the client that left was not aborted"
    assert_aborted_and_freed(aborts[0], 480)
    after = metrics(url)
    assert after["course_requests_aborted_total"] - before["course_requests_aborted_total"] == 1
    assert after['course_requests_finished_total{finish_reason="length"}'] == \
        before['course_requests_finished_total{finish_reason="length"}']          # an abort is not a finish


def hold_tokenizer(state, monkeypatch, min_chars: int):
    """Hold ``state.encode`` of a text of at least min_chars characters until ``release`` is set (30 s at
    most); ``started`` / ``finished`` say where the tokenizer is."""
    real = state.encode
    ev = {k: threading.Event() for k in ("started", "release", "finished")}

    def encode(text):
        if len(text) < min_chars:
            return real(text)
        ev["started"].set()
        ev["release"].wait(30)
        try:
            return real(text)
        finally:
            ev["finished"].set()

    monkeypatch.setattr(state, "encode", encode)
    return ev


def test_a_huge_prompt_is_tokenized_off_the_event_loop(server, monkeypatch):
    """While the tokenizer is held on a 200 KB prompt, /health answers: the event loop is free. (On the
    loop, /health could only answer after the tokenizer, and the held tokenizer waits for /health.)"""
    url, state = server
    ev = hold_tokenizer(state, monkeypatch, 100_000)
    text = "Once upon a time there was a little dog. " * 5000
    out = {}
    th = threading.Thread(target=lambda: out.update(r=httpx.post(
        url + "/v1/completions", json={"model": "tiny", "prompt": text, "max_tokens": 4}, timeout=120)))
    th.start()
    try:
        assert ev["started"].wait(60), "the prompt never reached the tokenizer"
        t0 = time.perf_counter()
        health = httpx.get(url + "/health", timeout=60)
        waited = time.perf_counter() - t0
        tokenizing = not ev["finished"].is_set()
    finally:
        ev["release"].set()
        th.join(120)
    print(f"/health answered in {waited * 1e3:.0f} ms while the tokenizer was held")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert tokenizing, f"/health waited {waited:.1f} s, until the tokenizer was done: it runs on the event loop"
    r = out["r"]
    n = len(state.encode(text))
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert f"{n} tokens long" in r.json()["error"]["message"]


def test_a_client_that_leaves_while_its_prompt_is_tokenized_is_not_run(server, monkeypatch, aborts):
    """It left before its request reached the engine: it is counted as aborted and never runs (if the
    server notices only after the engine added it, the engine aborts it: either way nothing runs on)."""
    url, state = server
    before, done0 = metrics(url), finished(state)
    ev = hold_tokenizer(state, monkeypatch, 300)
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": "tiny", "prompt": "the dog " * 40, "max_tokens": 200, "temperature": 0}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    try:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(head + body)
            assert ev["started"].wait(60)
        time.sleep(0.2)                        # let the server see the closed connection
    finally:
        ev["release"].set()
    wait_until(lambda: aborts or finished(state) > done0)      # aborted, or it ran to its end
    assert len(aborts) == 1, "the request of a client that had left ran"
    print("aborted", "before the engine" if aborts[0]["trace"] is None else "in the engine")
    if aborts[0]["trace"] is not None:
        assert_aborted_and_freed(aborts[0], 200)
    assert wait_until(lambda: not state.engine.has_unfinished(), 60)
    after = metrics(url)
    assert after["course_requests_aborted_total"] - before["course_requests_aborted_total"] == 1


def test_a_body_over_the_limit_gets_413_before_it_is_parsed(server):
    url, state = server
    before = metrics(url).get('course_requests_rejected_total{status="413"}', 0)
    body = json.dumps({"model": "tiny", "prompt": "a " * 600_000}).encode()                  # 1.2 MB
    r = httpx.post(url + "/v1/completions", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413, r.text
    msg = r.json()["error"]["message"]              # refused from its Content-Length: the size is known
    assert f"is {len(body)} bytes, past this server's limit of 1048576 bytes" in msg, msg
    assert "max_body_bytes" in msg and "--max-body-bytes" in msg
    # no Content-Length (a chunked upload): refused once it passes the limit
    r = httpx.post(url + "/v1/chat/completions", content=(b"x" * 65536 for _ in range(20)), timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and "more than 1048576 bytes" in r.json()["error"]["message"]
    assert metrics(url)['course_requests_rejected_total{status="413"}'] - before == 2
    assert httpx.get(url + "/health", timeout=30).json() == {"status": "ok"}
    # the limit is the server's setting
    with pytest.raises(ValueError, match="max_body_bytes"):
        build_app((state.model, state.tokenizer), max_body_bytes=0)
    small = build_app((state.model, state.tokenizer), max_body_bytes=2000, num_blocks=16, max_batch=2)
    name = small.state.server.model_name
    with serve_in_thread(small) as url2:
        ok = httpx.post(url2 + "/v1/completions", json={"model": name, "prompt": "Once", "max_tokens": 2}, timeout=60)
        big = httpx.post(url2 + "/v1/completions", json={"model": name, "prompt": "a " * 1000}, timeout=60)
    assert ok.status_code == 200, ok.text
    assert big.status_code == 413 and "limit of 2000 bytes" in big.json()["error"]["message"]


LONG = "the little dog ran home. " * 200         # about a thousand tokens: past tiny's context of 512


@pytest.mark.parametrize("path,key,value", [("completions", "prompt", LONG), ("completions", "prompt", [7] * 600),
                                            ("chat/completions", "messages", [{"role": "user", "content": LONG}])],
                         ids=["text", "token-ids", "chat"])
def test_a_prompt_past_the_context_is_named_with_its_length(server, path, key, value):
    url, state = server
    n = (len(value) if key == "prompt" and isinstance(value, list) else
         len(state.encode(value if key == "prompt" else chat_prompt(value))))
    assert n > state.context
    r = httpx.post(f"{url}/v1/{path}", json={"model": "tiny", key: value, "max_tokens": 4}, timeout=60)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == key, err
    assert f"{n} tokens long" in err["message"] and f"context of {state.context} tokens" in err["message"], err
    assert "max_tokens=0" not in err["message"]


def test_the_context_boundary_through_the_openai_client(server, client):
    url, state = server
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=LONG, max_tokens=1)
    assert e.value.param == "prompt" and "past the model's context" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": LONG}], max_tokens=1)
    assert e.value.param == "messages"
    # a prompt of exactly the context still gets its one token; one more token is a max_tokens error
    full = [7] * state.context
    r = client.completions.create(model="tiny", prompt=full, max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens == state.context and r.usage.completion_tokens == 1
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=full, max_tokens=2)
    assert e.value.param == "max_tokens" and "at most max_tokens=1" in str(e.value)
