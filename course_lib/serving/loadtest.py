"""A bounded load test of an OpenAI-compatible server with the official ``openai`` client (Module 12).

    from course_lib.serving.loadtest import load_test
    from course_lib.perf.metrics import format_summary
    res = load_test("http://127.0.0.1:8000", "tiny", prompts, concurrency=8, duration_s=10, max_tokens=16)
    print(format_summary(res.summary))
    assert res.ok, res.problems        # every stream finished and equals the greedy answer for its prompt

``concurrency`` clients (asyncio tasks, one ``AsyncOpenAI``) each send greedy streaming completions one after
the other, prompts taken round-robin, until ``duration_s`` has passed (requests in flight then are finished,
each bounded by ``max_tokens``; nothing new starts). Only localhost URLs are accepted: it is a test tool, not a
way to load someone else's server.

Each streamed request is recorded as the course's one request record, a ``course_lib.perf.metrics.Trace``
(start = just before the request is sent; one token event per streamed text chunk, which is one token except
where the server holds back the bytes of an incomplete character), so ``summarize`` gives TTFT / TPOT
percentiles and throughput as seen by the clients, HTTP included.

Correctness, checked for every stream: it ended (a finish_reason and ``[DONE]``), and its text equals the
*non-streamed* greedy completion of the same prompt (fetched first, one request at a time): a lost, cut or
mixed-up stream shows up as a mismatch.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

from course_lib.perf.metrics import Trace, summarize
from course_lib.validate import integer, number

__all__ = ["LoadTestResult", "load_test", "reference_completions"]

_LOCAL = {"127.0.0.1", "localhost", "::1"}


@dataclass
class LoadTestResult:
    traces: list            # one Trace per finished stream (rid = the prompt's index)
    texts: list             # the streamed text of each
    references: list        # the non-streamed greedy text of each prompt
    problems: list = field(default_factory=list)    # lost / failed / mismatched streams, in words
    duration_s: float = 0.0
    concurrency: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems and bool(self.traces)

    @property
    def summary(self) -> dict:
        s = summarize(self.traces)
        s["concurrency"] = self.concurrency
        return s


def _check_url(base_url: str) -> str:
    u = urlparse(base_url)
    if u.scheme not in ("http", "https") or u.hostname not in _LOCAL:
        raise ValueError(f"base_url must be a localhost http URL (this is a local load test), got {base_url!r}")
    return base_url.rstrip("/").removesuffix("/v1") + "/v1"


def reference_completions(base_url: str, model: str, prompts, max_tokens: int) -> list[str]:
    """The non-streamed greedy completion of each prompt, one request at a time."""
    import openai
    client = openai.OpenAI(base_url=_check_url(base_url), api_key="unused", max_retries=0)
    return [client.completions.create(model=model, prompt=p, max_tokens=max_tokens, temperature=0).choices[0].text
            for p in prompts]


async def _run(url, model, prompts, refs, concurrency, duration_s, max_tokens, timeout):
    import openai
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=timeout)
    traces, texts, problems = [], [], []
    t_end = time.perf_counter() + duration_s
    counter = iter(range(10**9))

    async def one(i: int):
        k = i % len(prompts)
        tr = Trace(time.perf_counter(), prompt_tokens=0, rid=k, max_new_tokens=max_tokens)
        parts, reason = [], None
        stream = await client.completions.create(model=model, prompt=prompts[k], max_tokens=max_tokens,
                                                 temperature=0, stream=True)
        async for chunk in stream:
            if not chunk.choices:
                continue
            c = chunk.choices[0]
            if c.text:
                tr.add_token(time.perf_counter())
                parts.append(c.text)
            if c.finish_reason is not None:
                reason = c.finish_reason
        text = "".join(parts)
        tr.end(time.perf_counter(), reason)
        if reason is None:
            problems.append(f"request {i} (prompt {k}): the stream ended without a finish_reason")
        elif text != refs[k]:
            problems.append(f"request {i} (prompt {k}): streamed {text!r} != non-streamed {refs[k]!r}")
        if tr.n_tokens:
            traces.append(tr)
            texts.append(text)
        else:
            problems.append(f"request {i} (prompt {k}): no text streamed")

    async def client_loop():
        while time.perf_counter() < t_end:
            i = next(counter)
            try:
                await one(i)
            except Exception as e:      # a failed request is a finding, not a crash of the test
                problems.append(f"request {i}: {type(e).__name__}: {e}")

    t0 = time.perf_counter()
    await asyncio.gather(*[client_loop() for _ in range(concurrency)])
    await client.close()
    return traces, texts, problems, time.perf_counter() - t0


def load_test(base_url: str, model: str, prompts, concurrency: int = 4, duration_s: float = 5.0,
              max_tokens: int = 16, timeout: float = 120.0) -> LoadTestResult:
    """Run the bounded load test (see the module docstring); returns a LoadTestResult."""
    url = _check_url(base_url)
    prompts = list(prompts)
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty strings")
    concurrency = integer(concurrency, "concurrency", low=1)
    duration_s = number(duration_s, "duration_s", 0, low_open=True, finite=False)
    max_tokens = integer(max_tokens, "max_tokens", low=1)
    refs = reference_completions(base_url, model, prompts, max_tokens)
    traces, texts, problems, dt = asyncio.run(_run(url, model, prompts, refs, concurrency, duration_s, max_tokens,
                                                   timeout))
    return LoadTestResult(traces, texts, refs, problems, dt, concurrency)
