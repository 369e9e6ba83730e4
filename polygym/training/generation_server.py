"""A Hugging Face causal LM served as a vLLM-like Chat Completions server: the trainer's policy.

On-policy RL needs rollouts sampled from the weights being trained. Large setups get that from a
vLLM server whose weights the trainer updates; this module is the same thing for a model living in
this process (CPU or one GPU): ``GenerationServer`` answers ``POST /v1/chat/completions`` from the
``torch`` model object the trainer optimizes, so every rollout uses the current weights with no
copying or syncing. It speaks exactly the dialect ``vllm_model`` expects of an upstream with
``return_token_ids`` on (vLLM's OpenAI-server extensions):

- ``prompt_token_ids`` on the completion: the chat-templated prompt, token by token;
- ``choices[0].token_ids``: the generated ids, the stop token included when one ended the turn;
- ``choices[0].logprobs.content[i].logprob``: the log-prob of each generated id under the
  distribution it was *sampled* from (after temperature and top-p), entries' ``token`` written
  as ``"token_id:<id>"``;
- ``policy_version`` on the completion, when a weight-sync hook set ``HFGenerator.policy_version``
  (``weight_sync``): the version of the weights that generated it, for staleness checks.

and it implements the ``required_prefix_token_ids`` extension (NeMo Gym 0.7's name): a request
carrying the previous turn's prompt + generation ids gets exactly those ids as its prompt's start,
followed by the tokens the template adds for the newer messages (``polygym.training.continuation``);
the reply's ``prompt_continuation`` says whether that worked (``{"exact": true}``) or why the
history was rendered anew instead,

so the whole polygym stack — agents, environments, verifiers, ``vllm_model`` and the token-level
collector — runs unchanged on top of it. It is also a small reference for what a remote trainer's
generation server must return (README "Training").

Choices, and why:
- **Micro-batching**: rollouts of a step reach the server at nearly the same moment; requests that
  arrive within ``batch_window_s`` of each other (and share sampling settings) are generated as one
  left-padded batch. On a CPU this is the difference between minutes and seconds per step.
- **Generation runs in one worker thread**, never on the event loop, so the server keeps accepting
  requests (and the trainer's process stays responsive) while the model is busy.
- ``top_k`` is disabled unless asked for: Transformers' default ``top_k=50`` would silently sample
  from a different distribution than the log-probs describe.
- Tool calls: when tools are offered, ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
  blocks in the text (the Hermes/Qwen convention most chat templates use) become ``tool_calls``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
import torch
from jinja2 import TemplateError

from polygym.net.listen import AppServer, bind_socket
from polygym.servers.base import HTTPError, ServerConfig
from polygym.servers.model import ModelServer
from polygym.token_fields import PREFIX_FIELD, PROMPT_CONTINUATION_FIELD, logprob_semantics
from polygym.training.continuation import (
    Continuation,
    NoCleanSuffix,
    check_prefix,
    join,
    probe_messages,
    suffix_text,
)

TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
_ROLES = {"developer": "system"}


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    future: asyncio.Future[GenerationResult] | None = None

    @property
    def key(self) -> tuple[float, float, int]:
        return (self.temperature, self.top_p, self.top_k)

    def semantics(self) -> dict[str, Any]:
        """How ``generate`` takes this request's log-probs: from the scores ``generate`` sampled
        from (temperature, top-p, top-k applied), or the raw logits when decoding greedily."""
        if self.temperature <= 0:
            return logprob_semantics("hf_generate", 0.0, "raw")
        return logprob_semantics(
            "hf_generate", self.temperature, "sampling_distribution", top_p=self.top_p, top_k=self.top_k
        )


@dataclass
class GenerationResult:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    """``stop`` (a stop token ended it) or ``length`` (``max_tokens`` reached)."""
    policy_version: int | None = None
    """``HFGenerator.policy_version`` while the batch was generated (read under the lock)."""


@dataclass
class GeneratorStats:
    batches: int = 0
    sequences: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)


class HFGenerator:
    """Chat templating and batched sampling with exact log-probs for one HF model + tokenizer."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_batch: int = 64,
        batch_window_s: float = 0.02,
        default_max_tokens: int = 256,
        chat_template_kwargs: dict[str, Any] | None = None,
        stop_token_ids: Sequence[int] = (),
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self.default_max_tokens = default_max_tokens
        self.chat_template_kwargs = chat_template_kwargs or {}
        eos = tokenizer.eos_token_id
        self.stop_ids = sorted({*stop_token_ids, *([eos] if isinstance(eos, int) else eos or [])})
        if not self.stop_ids:
            raise ValueError("the tokenizer has no eos token; pass stop_token_ids")
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_ids[0]
        self.max_context = int(getattr(model.config, "max_position_embeddings", None) or 1 << 20)
        self.stats = GeneratorStats()
        self.lock = threading.Lock()
        """Held while generating; a trainer that updates weights concurrently can take it too."""
        self.policy_version: int | None = None
        """The version of the weights being served (set by a ``weight_sync`` hook under ``lock``),
        stated on every completion with token ids as ``policy_version``; None: not tracked."""
        self._queue: asyncio.Queue[GenerationRequest] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="polygym-generate")

    # -- prompts ---------------------------------------------------------------------------------
    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        """The chat template's text for ``messages`` (and ``tools``), generation prompt appended."""
        cleaned = [_template_message(m) for m in messages]
        return str(
            self.tokenizer.apply_chat_template(
                cleaned,
                tools=tools or None,
                add_generation_prompt=True,
                tokenize=False,
                **self.chat_template_kwargs,
            )
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """The chat-templated prompt with the generation prompt appended, as token ids."""
        return self.encode(self.render(messages, tools))

    def continued_prompt(
        self, prefix: list[int], messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> Continuation:
        """``prefix`` (the previous turn's exact ids) + the tokens the messages after the last
        assistant turn add (``polygym.training.continuation``); no prompt, with the reason, when
        the template gives no clean suffix."""
        stop = prefix[-1] if prefix[-1] in self.stop_ids else self.stop_ids[0]
        try:
            probe = self.render(probe_messages(messages), tools)
            text = suffix_text(self.render(messages, tools), probe, self.tokenizer.decode([stop]))
        except NoCleanSuffix as exc:
            return Continuation(None, str(exc))
        except TemplateError as exc:
            return Continuation(None, f"the chat template cannot render the probe messages: {exc}")
        return Continuation(join(prefix, self.encode(text)))

    # -- generation --------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Generate for requests sharing sampling settings, as one left-padded batch (blocking)."""
        if not requests:
            return []
        temperature, top_p, top_k = requests[0].key
        longest = max(len(r.prompt_ids) for r in requests)
        ids = torch.full((len(requests), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(requests), longest), dtype=torch.long)
        for row, request in enumerate(requests):
            n = len(request.prompt_ids)
            ids[row, longest - n :] = torch.tensor(request.prompt_ids, dtype=torch.long)
            mask[row, longest - n :] = 1
        device = next(self.model.parameters()).device
        sample = temperature > 0
        options: dict[str, Any] = {
            "max_new_tokens": max(r.max_tokens for r in requests),
            "do_sample": sample,
            "pad_token_id": self.pad_id,
            "eos_token_id": self.stop_ids,
            "output_scores": True,
            "return_dict_in_generate": True,
            "use_cache": True,
            "top_k": top_k if sample and top_k > 0 else None,
            "top_p": top_p if sample else None,
            "temperature": temperature if sample else None,
            "repetition_penalty": None,
        }
        began = time.perf_counter()
        with self.lock, torch.no_grad():
            version = self.policy_version
            training = self.model.training
            self.model.eval()
            try:
                out = self.model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **options)
            finally:
                self.model.train(training)
        generated = out.sequences[:, longest:]
        # log-prob of each chosen token under the (processed) distribution it was sampled from
        logprobs = torch.stack(
            [
                torch.log_softmax(scores.float(), dim=-1).gather(1, generated[:, t : t + 1]).squeeze(1)
                for t, scores in enumerate(out.scores)
            ],
            dim=1,
        ).cpu()
        generated = generated.cpu()
        results = []
        for row, request in enumerate(requests):
            tokens = generated[row].tolist()[: request.max_tokens]
            end = next((i for i, t in enumerate(tokens) if t in self.stop_ids), None)
            finish = "stop" if end is not None else "length"
            tokens = tokens[: end + 1] if end is not None else tokens
            chosen = [float(x) for x in logprobs[row, : len(tokens)]]
            results.append(GenerationResult(tokens, chosen, finish, version))
        self.stats.batches += 1
        self.stats.sequences += len(requests)
        self.stats.generated_tokens += sum(len(r.token_ids) for r in results)
        self.stats.seconds += time.perf_counter() - began
        self.stats.batch_sizes.append(len(requests))
        return results

    async def submit(self, request: GenerationRequest) -> GenerationResult:
        """Queue one request; it is generated with whatever arrives within the batch window."""
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._worker = asyncio.get_running_loop().create_task(self._batches())
        request.future = asyncio.get_running_loop().create_future()
        await self._queue.put(request)
        return await request.future

    async def _batches(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            pending = [await self._queue.get()]
            deadline = loop.time() + self.batch_window_s
            while len(pending) < self.max_batch:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    break
                try:
                    pending.append(await asyncio.wait_for(self._queue.get(), timeout))
                except TimeoutError:
                    break
            groups: dict[tuple[float, float, int], list[GenerationRequest]] = {}
            for request in pending:
                groups.setdefault(request.key, []).append(request)
            for group in groups.values():
                live = [r for r in group if r.future is not None and not r.future.done()]
                if not live:
                    continue
                try:
                    results = await loop.run_in_executor(self._executor, self.generate, live)
                except Exception as exc:  # the callers get the error; the worker keeps serving
                    for request in live:
                        if request.future is not None and not request.future.done():
                            request.future.set_exception(exc)
                    continue
                for request, result in zip(live, results, strict=True):
                    if request.future is not None and not request.future.done():
                        request.future.set_result(result)

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
            self._queue = None

    def shutdown_executor(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- chat completions ----------------------------------------------------------------------------
    async def chat_completion(self, body: dict[str, Any], model_name: str) -> dict[str, Any]:
        """A Chat Completions reply for ``body``, with vLLM's token fields when asked for."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise HTTPError(400, "messages must be a non-empty list of message objects", "invalid_request")
        if body.get("stream"):
            raise HTTPError(400, "stream=true is not supported", "invalid_request")
        tools = [t.get("function", t) for t in body.get("tools") or [] if isinstance(t, dict)]
        continuation = None
        if body.get(PREFIX_FIELD) is not None:
            try:
                prefix = check_prefix(body[PREFIX_FIELD], len(self.tokenizer), self.max_context)
            except ValueError as exc:
                raise HTTPError(400, str(exc), "invalid_request") from None
            continuation = self.continued_prompt(prefix, messages, tools)
        exact = continuation.prompt_ids if continuation is not None else None
        prompt = exact if exact is not None else self.prompt_ids(messages, tools)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or self.default_max_tokens
        temperature = body.get("temperature")
        request = GenerationRequest(
            prompt_ids=prompt,
            max_tokens=int(max_tokens),
            temperature=1.0 if temperature is None else float(temperature),
            top_p=1.0 if body.get("top_p") is None else float(body["top_p"]),
            top_k=int(body.get("top_k") or 0),
        )
        if request.max_tokens < 1:
            raise HTTPError(400, "max_tokens must be at least 1", "invalid_request")
        result = await self.submit(request)
        text = self.tokenizer.decode(
            [t for t in result.token_ids if t not in self.stop_ids], skip_special_tokens=True
        )
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish = result.finish_reason
        if tools:
            calls, rest = parse_tool_calls(text)
            if calls:
                message = {"role": "assistant", "content": rest or None, "tool_calls": calls}
                finish = "tool_calls" if finish == "stop" else finish
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
        completion: dict[str, Any] = {
            "id": f"chatcmpl-{secrets.token_hex(12)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(result.token_ids),
                "total_tokens": len(prompt) + len(result.token_ids),
            },
        }
        if body.get("return_token_ids"):
            completion["prompt_token_ids"] = prompt
            choice["token_ids"] = result.token_ids
            completion["logprob_semantics"] = request.semantics()
            if result.policy_version is not None:
                completion["policy_version"] = result.policy_version
        if continuation is not None:
            completion[PROMPT_CONTINUATION_FIELD] = continuation.stamp()
        if body.get("logprobs"):
            choice["logprobs"] = {
                "content": [
                    {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                    for t, lp in zip(result.token_ids, result.logprobs, strict=True)
                ]
            }
        return completion


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A Chat message as chat templates expect it: string content, known roles."""
    role = _ROLES.get(str(message.get("role")), str(message.get("role", "user")))
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    out = {**message, "role": role, "content": content or ""}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [_template_call(c) for c in calls if isinstance(c, dict)]
    return out


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    raw = function.get("arguments")
    if isinstance(raw, str):
        with contextlib.suppress(orjson.JSONDecodeError):
            function["arguments"] = orjson.loads(raw)
    return {**call, "function": function}


def parse_tool_calls(text: str) -> tuple[list[dict[str, Any]], str]:
    """``<tool_call>{json}</tool_call>`` blocks as Chat ``tool_calls``, and the text around them."""
    calls = []
    for raw in TOOL_CALL.findall(text):
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            continue
        arguments = data.get("arguments", data.get("parameters", {}))
        calls.append(
            {
                "id": f"call_{secrets.token_hex(8)}",
                "type": "function",
                "function": {
                    "name": data["name"],
                    "arguments": arguments
                    if isinstance(arguments, str)
                    else orjson.dumps(arguments).decode(),
                },
            }
        )
    rest = TOOL_CALL.sub("", text).strip() if calls else text
    return calls, rest


class GenerationServerConfig(ServerConfig):
    model: str = "policy"


class GenerationServer(ModelServer[GenerationServerConfig]):
    """``/v1/chat/completions`` (and ``/v1/models``) answered by an ``HFGenerator``."""

    def __init__(self, name: str, generator: HFGenerator, config: dict[str, Any] | None = None) -> None:
        super().__init__(name, config)
        self.generator = generator

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.generator.chat_completion(body, self.config.model)

    async def shutdown(self) -> None:
        await self.generator.close()


class GenerationServerThread:
    """A ``GenerationServer`` on a loopback port, served from its own thread and event loop.

    ``url`` (``http://127.0.0.1:PORT/v1``) is what ``vllm_model``'s ``base_url`` should be.
    """

    def __init__(self, generator: HFGenerator, model_name: str = "policy", host: str = "127.0.0.1") -> None:
        self.server = GenerationServer("generation", generator, {"model": model_name})
        self.sock = bind_socket(host, 0)
        self._app: AppServer | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="polygym-generation", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> GenerationServerThread:
        self._thread.start()
        self._app = AppServer(self.server.app, self.sock)
        asyncio.run_coroutine_threadsafe(self._app.start(), self._loop).result()
        return self

    def stop(self) -> None:
        if self._app is not None:
            asyncio.run_coroutine_threadsafe(self._app.stop(), self._loop).result()
            self._app = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self.server.generator.shutdown_executor()

    def __enter__(self) -> GenerationServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
