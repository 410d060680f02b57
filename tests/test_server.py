"""The OpenAI-compatible server (course_lib.serving.server) with the official ``openai`` client on localhost.

Oracle for the text: ``course_lib.generation.generate`` (one request decoded alone, contiguous cache), greedy,
decoded with the model's tokenizer. The server runs uvicorn in a thread on a free port for the whole module
(one model load); the load test is time-boxed and checks every stream against the non-streamed answer.
"""
import json

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
from course_lib.serving.server import build_app, serve_in_thread  # noqa: E402
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
    assert e.value.code == 0 and "--model" in capsys.readouterr().out


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
