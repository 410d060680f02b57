"""An OpenAI-compatible HTTP server over the course's continuous-batching engine (Module 12).

    course serve --model tiny --port 8000          # from the shell
    from course_lib.serving.server import build_app, serve_in_thread
    app = build_app("tiny")                         # a FastAPI app (model loaded, engine thread not yet started)
    with serve_in_thread(app) as base_url:          # uvicorn on a free localhost port, stopped on exit
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused")
        client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=16)

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream=true`` as Server-Sent
Events, ending in ``data: [DONE]``), ``GET /v1/models``, ``GET /metrics`` (Prometheus text format, see
``course_lib.serving.server_metrics``), ``GET /health``.

How it is wired (one engine, one thread that owns it):

    HTTP handler (asyncio)  --InFlight-->    queue.Queue  -->  engine thread: add_request, step(), step() ...
          ^                                                        |
          +---- per-request asyncio.Queue <-- call_soon_threadsafe -+  (each StepOutput via the engine callback)

The engine (``course_lib.serving.engine.Engine``) is not thread-safe, so only the engine thread touches it: it
drains its inbox (submissions to add: a ValueError from the engine goes back to the handler as a 400; aborts),
runs one ``step()`` while anything is unfinished (sleeps on an Event otherwise), and forgets finished requests.
Tokens stream out through the engine's per-request callback into the request's own asyncio.Queue, so streams
cannot mix. Each request keeps the engine's record of it, a ``course_lib.perf.metrics.Trace``; the latency
histograms are observed from it when it finishes.

Nothing slow runs on the event loop, so one client cannot stall the others (``/health`` included):

* The body is read with a bound (``max_body_bytes``, 1 MiB by default; ``course serve --max-body-bytes``):
  past it, a 413 naming the limit, before a byte is parsed (from the Content-Length when the client sends
  one, else as soon as the streamed body passes it).
* The JSON is parsed and the prompt tokenized in a worker thread (``asyncio.to_thread``): a megabyte of text
  takes a second to tokenize, and the tokenizer (Rust) releases the GIL meanwhile.

A client that disconnects is cancelled, as vLLM's OpenAI server does (its ``listen_for_disconnect`` waits for
the ASGI ``http.disconnect`` message; the engine's ``abort`` follows): a task per request waits for that
message, and the handler's own exit before the last token (Starlette cancels a stream whose client left)
does the same. Either one puts an abort in the engine thread's inbox; before its next step the engine drops
the request (``Engine.abort_request``: its KV blocks freed at once, the scheduler forgets it) and
``course_requests_aborted_total`` counts it. A request whose client left while its prompt was being
tokenized never reaches the engine (counted as aborted too).

Refused, with a 400 and an OpenAI-style ``{"error": {"message", "type", "param"}}`` body (never silently
ignored): a missing or empty prompt / messages, a prompt longer than the model's context (``param`` is
"prompt" or "messages", the message gives its length in tokens), ``max_tokens`` < 1 or past what the context
leaves after the prompt, an unknown model, ``n`` != 1, stop *strings*, ``logprobs``, ``echo``, non-zero
penalties, ``logit_bias``, tools, unknown fields; a body over ``max_body_bytes`` with a 413.
"""


import asyncio
import contextlib
import json
import numbers
import queue
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

from course_lib.models import load
from course_lib.validate import integer

from .engine import Engine
from .request import SamplingParams
from .server_metrics import ServerMetrics

__all__ = ["ServerState", "RequestError", "build_app", "serve_in_thread", "parse_request", "parse_completion_request",
           "parse_chat_request", "chat_prompt", "DEFAULT_MAX_BODY_BYTES", "main"]


class RequestError(ValueError):
    """A bad request: answered with `status` (400 by default) and an OpenAI-style error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.type = message, param, status, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": None}}


# --------------------------------------------------------------------------------------------------
# Request parsing: every field either used or refused
# --------------------------------------------------------------------------------------------------
# fields accepted and used; fields accepted only at their neutral value (anything else is refused)
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options", "seed", "stop",
           "user"}
_NEUTRAL = {"presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logprobs": (None, False, 0),
            "echo": (False,), "best_of": (1,), "logit_bias": (None, {}), "top_logprobs": (None, 0),
            "suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none"),
            "response_format": (None, {"type": "text"}), "parallel_tool_calls": (None,)}
COMPLETION_FIELDS = _COMMON | {"prompt"} | {"presence_penalty", "frequency_penalty", "logprobs", "echo", "best_of",
                                            "logit_bias", "suffix"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens"} | {
    "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "logit_bias", "tools", "tool_choice",
    "response_format", "parallel_tool_calls"}
DEFAULT_MAX_TOKENS = 16
DEFAULT_MAX_BODY_BYTES = 1 << 20       # 1 MiB: far more than any prompt that fits a small model's context


@dataclass
class ParsedRequest:
    """What the client asked for, checked: the prompt's token ids, how to decode them, and how to answer
    (streamed or not, with a usage chunk or not, under which model name)."""
    prompt_ids: list
    params: SamplingParams
    stream: bool
    include_usage: bool
    model: str


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_fields(body: dict, fields: set, state: "ServerState"):
    """The checks that need no tokens (run before the prompt is tokenized: a bad field costs nothing)."""
    unknown = sorted(set(body) - fields)
    if unknown:
        raise RequestError(f"unsupported field(s) {unknown}: this server implements {sorted(fields)}", unknown[0])
    for name, neutral in _NEUTRAL.items():
        if name in body and body[name] not in neutral:
            raise RequestError(f"{name}={body[name]!r} is not supported by this server (only {neutral[0]!r})", name)
    model = body.get("model")
    if model is None:
        raise RequestError("'model' is required", "model")
    if model != state.model_name:
        raise RequestError(f"unknown model {model!r}: this server serves {state.model_name!r} (see /v1/models)",
                           "model", status=404, type="not_found_error")
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise RequestError(f"n={n!r}: this server returns one choice per request (n=1); send n requests instead", "n")
    stop = body.get("stop")
    if stop not in (None, [], ""):
        raise RequestError("stop strings are not supported (the engine stops on token ids only: end-of-text)", "stop")


def _common(body: dict, state: "ServerState", prompt_ids: list, max_tokens, prompt_param: str) -> ParsedRequest:
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not _is_int(max_tokens) or max_tokens < 1:
        raise RequestError(f"max_tokens must be an integer >= 1, got {max_tokens!r}", "max_tokens")
    if len(prompt_ids) > state.context:              # even max_tokens=1 needs the prompt's P positions
        what = ("the prompt is" if prompt_param == "prompt" else
                "the messages are (as one prompt in the chat template)")
        raise RequestError(f"{what} {len(prompt_ids)} tokens long, past the model's context of {state.context} "
                           f"tokens: shorten it to at most {state.context} tokens (fewer, to leave room for "
                           f"max_tokens)", prompt_param)
    room = state.context - len(prompt_ids) + 1     # positions 0 .. P + N - 2 are fed to the model
    if max_tokens > room:
        raise RequestError(f"the prompt has {len(prompt_ids)} tokens; with max_tokens={max_tokens} it needs "
                           f"{len(prompt_ids) + max_tokens - 1} positions, past the model's context of "
                           f"{state.context} (at most max_tokens={max(room, 0)})", "max_tokens")
    temperature = body.get("temperature", 1.0)
    temperature = 1.0 if temperature is None else temperature
    if not _is_num(temperature) or not 0 <= temperature <= 2:
        raise RequestError(f"temperature must be a number in [0, 2], got {temperature!r}", "temperature")
    top_p = body.get("top_p")
    if top_p is not None and (not _is_num(top_p) or not 0 < top_p <= 1):
        raise RequestError(f"top_p must be a number in (0, 1], got {top_p!r}", "top_p")
    top_k = body.get("top_k")
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise RequestError(f"top_k must be an integer >= 1, got {top_k!r}", "top_k")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise RequestError(f"seed must be an integer, got {seed!r}", "seed")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestError(f"stream must be true or false, got {stream!r}", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict) or set(opts) - {"include_usage"}:
        raise RequestError(f"stream_options may only hold include_usage, got {opts!r}", "stream_options")
    if opts and not stream:
        raise RequestError("stream_options is only allowed with stream=true", "stream_options")
    params = SamplingParams(max_new_tokens=int(max_tokens), temperature=float(temperature),
                            top_p=None if top_p is None or top_p == 1 else float(top_p), top_k=top_k, seed=seed,
                            stop_token_ids=state.stop_token_ids)
    return ParsedRequest(prompt_ids, params, stream, bool(opts.get("include_usage", False)), body["model"])


def _tokenize_prompt(prompt, state: "ServerState") -> list:
    """A prompt as token ids: a string, a list of one string, or a list of token ids."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("prompt is empty", "prompt")
        return state.encode(prompt)
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < state.vocab_size]
        if bad:
            raise RequestError(f"prompt has token ids outside the vocabulary [0, {state.vocab_size}): {bad[:5]}",
                               "prompt")
        return [int(t) for t in prompt]
    if isinstance(prompt, list) and len(prompt) > 1:
        raise RequestError("a batch of prompts is not supported: send one request per prompt", "prompt")
    raise RequestError(f"prompt must be a non-empty string or a list of token ids, got {prompt!r:.60}", "prompt")


def parse_completion_request(body, state: "ServerState") -> ParsedRequest:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if "prompt" not in body or body["prompt"] is None:
        raise RequestError("'prompt' is required", "prompt")
    _check_fields(body, COMPLETION_FIELDS, state)
    ids = _tokenize_prompt(body["prompt"], state)
    return _common(body, state, ids, body.get("max_tokens"), "prompt")


def chat_prompt(messages) -> str:
    """The course's plain chat template (the bundled model has none of its own and was never tuned to chat):
    ``"role: content\\n"`` per message, then ``"assistant:"``. ValueError on a malformed message list."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects", "messages")
    lines = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) - {"role", "content", "name"}:
            raise RequestError(f"messages[{i}] must be an object with role and content only, got {m!r:.80}",
                               "messages")
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "developer", "user", "assistant"):
            raise RequestError(f"messages[{i}].role must be system, developer, user or assistant, got {role!r}",
                               "messages")
        if isinstance(content, list):      # [{"type": "text", "text": ...}, ...]: text parts only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise RequestError(f"messages[{i}].content: only text parts are supported", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string, got {content!r:.60}", "messages")
        lines.append(f"{role}: {content}\n")
    return "".join(lines) + "assistant:"


def parse_chat_request(body, state: "ServerState") -> ParsedRequest:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if "messages" not in body:
        raise RequestError("'messages' is required", "messages")
    _check_fields(body, CHAT_FIELDS, state)
    text = chat_prompt(body["messages"])
    mt, mct = body.get("max_tokens"), body.get("max_completion_tokens")
    if mt is not None and mct is not None and mt != mct:
        raise RequestError("give max_tokens or max_completion_tokens, not two different values", "max_tokens")
    return _common(body, state, state.encode(text), mct if mct is not None else mt, "messages")


def parse_request(raw: bytes, chat: bool, state: "ServerState") -> ParsedRequest:
    """A raw request body: JSON-decoded, checked and its prompt tokenized. The server runs it in a worker
    thread (a long prompt takes seconds to tokenize, and the event loop must keep serving the others)."""
    try:
        body = json.loads(raw)
    except ValueError as e:                  # JSONDecodeError and UnicodeDecodeError both are ValueErrors
        raise RequestError(f"the request body is not valid JSON: {e}") from None
    return (parse_chat_request if chat else parse_completion_request)(body, state)


# --------------------------------------------------------------------------------------------------
# The engine thread
# --------------------------------------------------------------------------------------------------
@dataclass
class InFlight:
    """A parsed request on its way between its handler (the event loop) and the engine thread: the request
    itself (not a copy of its fields), where its tokens go, and what each side knows of it. The engine's
    own record of it is the engine's (``Engine.output(rid)``, a Trace). Not ``grading``'s Submission (a
    student's notebook)."""
    request: ParsedRequest
    loop: asyncio.AbstractEventLoop
    tokens: asyncio.Queue                          # StepOutputs for this request, in order (or _ABORTED, an error)
    accepted: asyncio.Future                     # request id, or the engine's ValueError
    arrival: float = field(default_factory=time.perf_counter)
    rid: int | None = None                       # the engine's id (set by the engine thread when it adds it)
    finished: bool = False                       # the handler has seen its last token
    aborting: bool = False                       # an abort is on its way to the engine thread


@dataclass
class _Abort:
    sub: InFlight


_ABORTED = object()          # put in a request's token queue when the engine dropped it (its client left)


class _ClientGone(Exception):
    """The client of this request disconnected: stop serving it."""


class ServerState:
    """The model, tokenizer, engine, metrics and the engine thread (``start()`` / ``stop()``)."""

    def __init__(self, model, tokenizer, model_name: str | None = None, num_blocks: int = 256,
                 block_size: int = 16, max_batch: int = 16, max_prefill_tokens: int = 512):
        self.model, self.tokenizer = model, tokenizer
        self.model_name = model_name or getattr(model, "name", "model")
        self.engine = Engine(model, num_blocks=num_blocks, block_size=block_size, max_batch=max_batch,
                             max_prefill_tokens=max_prefill_tokens)
        self.context = self.engine.context
        self.vocab_size = self.engine.vocab_size
        eos = getattr(tokenizer, "eos_token_id", None)
        self.stop_token_ids = () if eos is None else (int(eos),)
        self.metrics = ServerMetrics(num_blocks=num_blocks)
        self._inbox: queue.Queue = queue.Queue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._subs: dict[int, InFlight] = {}
        self.error: BaseException | None = None        # what killed the engine thread, if anything
        self.created = int(time.time())

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # --- thread ------------------------------------------------------------------------------------
    def start(self):
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="course-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0):
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, sub: InFlight):
        if self.error is not None:
            raise RequestError(f"the engine stopped: {self.error!r}", status=503, type="server_error")
        self._inbox.put(sub)
        self._wake.set()

    def abort(self, sub: InFlight):
        """Stop serving `sub` (its client left): the engine thread drops it before its next step. Called on
        the event loop; a request that already finished, or is already being aborted, is left alone."""
        if sub.finished or sub.aborting:
            return
        sub.aborting = True
        self._inbox.put(_Abort(sub))       # after the submission itself: one FIFO queue
        self._wake.set()

    def _deliver(self, sub: InFlight, item):
        sub.loop.call_soon_threadsafe(sub.tokens.put_nowait, item)

    def _drain_inbox(self):
        """Add the new submissions and carry out the aborts, in the order they came."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Abort):
                self._abort(item.sub)
            else:
                self._add(item)

    def _add(self, sub: InFlight):
        try:
            rid = self.engine.add_request(sub.request.prompt_ids, sub.request.params, arrival_time=sub.arrival,
                                          callback=lambda so, s=sub: self._deliver(s, so))
        except (ValueError, TypeError) as e:
            sub.loop.call_soon_threadsafe(_set_result, sub.accepted, RequestError(str(e)))
            return
        sub.rid = rid
        self._subs[rid] = sub
        self.metrics.on_admit(len(sub.request.prompt_ids))
        sub.loop.call_soon_threadsafe(_set_result, sub.accepted, rid)

    def _abort(self, sub: InFlight):
        if sub.rid is None:                   # the engine refused it: nothing runs
            return
        out = self.engine.abort_request(sub.rid)
        if out is None:                       # it finished before the abort came
            return
        self._subs.pop(sub.rid, None)
        self.metrics.observe_engine(self.engine)      # the gauges first: whoever sees the count sees them
        self.metrics.on_abort(out)
        self._deliver(sub, _ABORTED)

    def _run(self):
        eng = self.engine
        try:
            while not self._stop.is_set():
                self._drain_inbox()
                if not eng.has_unfinished():
                    self.metrics.observe_engine(eng)
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                outs = eng.step()
                self.metrics.on_tokens(len(outs))
                for tr in eng.pop_finished():
                    self._subs.pop(tr.rid, None)
                    self.metrics.on_finish(tr)
                self.metrics.observe_engine(eng)
        except BaseException as e:       # a broken engine: fail every open request instead of hanging them
            self.error = e
            for sub in self._subs.values():
                self._deliver(sub, e)
            raise


def _set_result(fut, value):
    if not fut.done():
        fut.set_result(value)


# --------------------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------------------
def build_app(model="tiny", *, device=None, num_blocks: int = 256, block_size: int = 16, max_batch: int = 16,
              max_prefill_tokens: int = 512, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              start_engine: bool = True):
    """A FastAPI app serving `model` (a name for ``course_lib.models.load``, or a (model, tokenizer) pair).
    The engine thread starts with the app (its lifespan) and stops with it; ``app.state.server`` is the
    ServerState. max_body_bytes: the largest request body accepted (a larger one gets a 413 before it is
    parsed)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

    max_body_bytes = integer(max_body_bytes, "max_body_bytes", low=1)   # bytes

    if isinstance(model, tuple):
        mdl, tok = model
        name = getattr(mdl, "name", "model")
    else:
        mdl, tok = load(model, device=device, verbose=False)
        name = str(model)
    state = ServerState(mdl, tok, name, num_blocks=num_blocks, block_size=block_size, max_batch=max_batch,
                        max_prefill_tokens=max_prefill_tokens)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if start_engine:
            state.start()
        yield
        state.stop()

    app = FastAPI(title="course_lib OpenAI-compatible server", lifespan=lifespan)
    app.state.server = state

    def error(e: RequestError):
        return JSONResponse(e.body(), status_code=e.status)

    def too_large(size: int | None) -> RequestError:
        got = f"{size} bytes" if size is not None else f"more than {max_body_bytes} bytes"
        return RequestError(f"the request body is {got}, past this server's limit of {max_body_bytes} bytes "
                            f"(max_body_bytes; course serve --max-body-bytes)", status=413)

    async def read_body(request: Request) -> bytes:
        """The body, refused (413) as soon as it is known to pass max_body_bytes: from its Content-Length
        before a byte is read, else while it streams in. Nothing of it is parsed here."""
        declared = request.headers.get("content-length", "").strip()
        if declared.isdigit() and int(declared) > max_body_bytes:
            raise too_large(int(declared))
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise too_large(None)
            chunks.append(chunk)
        return b"".join(chunks)

    async def enqueue(parsed: ParsedRequest, watch: "_DisconnectWatch") -> InFlight:
        if watch.gone:                        # the client left while its prompt was tokenized
            raise _ClientGone
        loop = asyncio.get_running_loop()
        sub = InFlight(parsed, loop, asyncio.Queue(), loop.create_future())
        state.submit(sub)
        watch.attach(sub)
        rid = await sub.accepted
        if isinstance(rid, RequestError):
            sub.finished = True               # refused by the engine: nothing to abort
            raise rid
        return sub

    async def tokens_of(sub: InFlight):
        """The request's StepOutputs as they arrive, until the finished one (_ClientGone if it was aborted)."""
        while True:
            item = await sub.tokens.get()
            if item is _ABORTED:
                raise _ClientGone
            if isinstance(item, BaseException):
                raise RuntimeError(f"the engine failed: {item!r}")
            if item.finished:
                sub.finished = True
            yield item
            if item.finished:
                return

    def usage(sub, n_out):
        n_in = len(sub.request.prompt_ids)
        return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}

    async def handle(request: Request, chat: bool):
        try:
            raw = await read_body(request)
        except RequestError as e:
            state.metrics.on_rejected(e.status)
            return error(e)
        watch = _DisconnectWatch(request, state)          # from here on, a client that leaves is cancelled
        try:
            parsed = await asyncio.to_thread(parse_request, raw, chat, state)    # off the event loop
            sub = await enqueue(parsed, watch)
        except RequestError as e:
            watch.close()
            state.metrics.on_rejected(e.status)
            return error(e)
        except _ClientGone:
            watch.close()
            state.metrics.on_abort()
            return Response(status_code=499)       # nginx's "client closed request": nobody reads it
        except BaseException:
            watch.close()
            raise
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"

        def choice(text, reason, delta=False):
            if chat:
                msg = {"role": "assistant", "content": text} if not delta else ({"content": text} if text else {})
                return {"index": 0, ("delta" if delta else "message"): msg, "finish_reason": reason,
                        "logprobs": None}
            return {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}

        if not parsed.stream:
            ids, reason = [], None
            try:
                async for so in tokens_of(sub):
                    ids.append(so.token)
                    reason = so.finish_reason
            except _ClientGone:
                return Response(status_code=499)
            finally:
                watch.close()                  # aborts the request if this handler ends before its last token
            return JSONResponse({"id": rid, "object": obj, "created": created, "model": state.model_name,
                                 "choices": [choice(state.decode(ids), reason)], "usage": usage(sub, len(ids))})

        async def events():
            head = {"id": rid, "object": obj + (".chunk" if chat else ""), "created": created,
                    "model": state.model_name}
            try:
                if chat:      # OpenAI's first chunk carries the role
                    yield _sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                     "finish_reason": None, "logprobs": None}]})
                ids, sent = [], ""
                async for so in tokens_of(sub):
                    ids.append(so.token)
                    text = state.decode(ids)
                    # hold back an incomplete multi-byte character (decodes as U+FFFD) until it is complete
                    if so.finished:
                        delta = text[len(sent):] if text.startswith(sent) else text
                    elif text.startswith(sent) and not text.endswith("\ufffd"):
                        delta = text[len(sent):]
                    else:
                        delta = ""
                    sent += delta
                    if delta or so.finished:
                        yield _sse({**head, "choices": [choice(delta, so.finish_reason, delta=True)]})
                if parsed.include_usage:
                    yield _sse({**head, "choices": [], "usage": usage(sub, len(ids))})
                yield "data: [DONE]\n\n"
            except _ClientGone:
                return
            finally:        # cancelled or closed (the client left: Starlette stops the stream) -> abort
                watch.close()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, chat=True)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": state.created,
                                            "owned_by": "course_lib", "max_model_len": state.context}]}

    @app.get("/metrics")
    async def metrics():
        body, ctype = state.metrics.render()
        return PlainTextResponse(body, media_type=ctype)

    @app.get("/health")
    async def health():
        if state.error is not None:
            return JSONResponse({"status": "engine failed", "error": repr(state.error)}, status_code=503)
        return {"status": "ok"}

    return app


def _sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


class _DisconnectWatch:
    """Notice a client that leaves, as vLLM's OpenAI server does (``listen_for_disconnect``): a task waits
    for the ASGI ``http.disconnect`` message (the server sends it when the connection is lost) and aborts the
    request. ``close()`` (the handler is done with the request, one way or another) stops the task and aborts
    the request unless its last token was seen: a handler cancelled or closed early (Starlette stops a
    stream whose client left) does not leave it running."""

    def __init__(self, request, state: ServerState):
        self.state, self.sub, self.gone = state, None, False
        self.task = asyncio.get_running_loop().create_task(self._listen(request.receive))

    async def _listen(self, receive):
        while (await receive())["type"] != "http.disconnect":
            pass                               # the body was read before this task started: nothing else comes
        self.gone = True
        if self.sub is not None:
            self.state.abort(self.sub)

    def attach(self, sub: InFlight):
        self.sub = sub
        if self.gone:
            self.state.abort(sub)

    def close(self):
        self.task.cancel()
        if self.sub is not None:
            self.state.abort(self.sub)         # a no-op once its last token was seen


@contextlib.contextmanager
def serve_in_thread(app, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0):
    """Run `app` with uvicorn in a background thread on `host`:`port` (0: a free port); yields the base URL
    (``http://127.0.0.1:PORT``) once it accepts connections, and shuts the server down on exit."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    t0 = time.perf_counter()
    while not server.started:
        if not thread.is_alive() or time.perf_counter() - t0 > timeout:
            server.should_exit = True
            sock.close()
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()


def main(argv=None) -> int:
    """``course serve``: start the server in the foreground."""
    import argparse

    p = argparse.ArgumentParser(prog="course serve", description="OpenAI-compatible server over the course engine")
    p.add_argument("--model", default="tiny", help="course_lib.models.load name or folder (default: tiny)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: the best one here)")
    p.add_argument("--num-blocks", type=int, default=256)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--max-prefill-tokens", type=int, default=512)
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help=f"largest request body accepted; larger ones get a 413 (default: {DEFAULT_MAX_BODY_BYTES})")
    a = p.parse_args(argv)
    try:
        import uvicorn
    except ImportError:
        print("course serve needs the serve extra: pip install 'course_lib[serve]'")
        return 1
    app = build_app(a.model, device=a.device, num_blocks=a.num_blocks, block_size=a.block_size,
                    max_batch=a.max_batch, max_prefill_tokens=a.max_prefill_tokens, max_body_bytes=a.max_body_bytes)
    print(f"serving {a.model!r} on http://{a.host}:{a.port}/v1 (metrics at /metrics)")
    uvicorn.run(app, host=a.host, port=a.port, log_level="info")
    return 0
