"""The embedded llama.cpp engine: load a GGUF in-process, template, tokenize, generate.

``xllamacpp.Server`` runs llama.cpp's server core inside this process: a scheduler thread that
batches every active sequence into one forward pass (continuous batching over ``n_parallel``
slots) and reuses each slot's KV cache for a prompt that extends the previous one (an agent's next
turn only pays for the new tokens). Its ``handle_completions`` call blocks until the generation is
done but releases the GIL, so the server calls it from a small thread pool, one thread per slot,
behind ``Admission`` (admission.py: which waiting request goes next): the event loop never blocks
and excess requests queue in asyncio. Each admitted request runs in the slot ``SlotTable`` chooses
(slots.py), after the states it names were saved or restored through llama.cpp's slot files: a
prompt prefix computed once serves every slot that wants it.

Why the server drives generation itself from token ids rather than through llama.cpp's chat
endpoint: training needs the exact ``prompt_token_ids`` the model saw, and the tool-call grammar
must be ours (see tool_calls.py). So a request is templated (the model's own Jinja chat template,
tools included) and tokenized first, then generated from the token ids with our grammar.

Templating and tokenizing are not exposed in-process; llama.cpp's core also listens on a loopback
port, where ``/apply-template``, ``/tokenize`` and ``/detokenize`` are used. That listener is
locked with a random API key generated at start, so nothing else on the machine can use it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from polygym import HTTPError
from responses_api_models.local_model.admission import Admission, prefix_key
from responses_api_models.local_model.slots import Placement, SlotTable
from responses_api_models.local_model.tool_calls import CallTags

_HELPER_ATTEMPTS = 3


def default_threads() -> int:
    """Decoding threads when the config leaves them open: all usable cores but one, at most 8.

    Rollouts share the machine with the agent, the environments and their verifiers (often in this
    very process). llama.cpp's worker threads spin at barriers; oversubscribed, they collapse
    (measured on a busy 2-core machine: 2 threads decoded 6x slower than 1). Beyond ~8 threads a
    model this small stops getting faster.
    """
    return max(1, min(8, _usable_cores() - 1))


def default_batch_threads() -> int:
    """Prompt-processing threads when the config leaves threads open: every usable core, at most 8.

    Reading a prompt is most of a rollout's model time on a CPU (a first turn's ~220 tokens at
    32-38 tokens/s on one thread), and while a prompt is read the rest of the stack waits for it.
    Measured on the 2-core machine (quickstart, interleaved runs): one rollout alone 13.1 / 11.4 s
    against 13.6 / 15.3 s with one thread, the first of ten 26 / 20 s against 33 / 67 s, all ten
    174 / 153 s against 200 / 187 s.
    """
    return max(1, min(8, _usable_cores()))


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


@dataclass
class EngineSettings:
    model_path: Path
    n_ctx: int
    n_parallel: int
    n_threads: int
    n_threads_batch: int
    n_batch: int
    prompt_cache_mib: int
    verbose: bool = False


@dataclass
class Generation:
    """One completion: text, finish reason, and — when requested — sampled token ids and log probs."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    entries: list[dict[str, Any]] = field(default_factory=list)
    """llama.cpp's per-token records (token, bytes, logprob, top_logprobs) for logprob outputs."""
    seconds: float = 0.0


class Engine:
    """One loaded model; ``start``/``close`` are blocking and meant to run in a worker thread."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self._server: Any = None
        self._api_key = secrets.token_urlsafe(24)
        self._base_url = ""
        self._http: aiohttp.ClientSession | None = None
        self._pool = ThreadPoolExecutor(max_workers=settings.n_parallel, thread_name_prefix="local_model")
        self._admission = Admission(settings.n_parallel)
        self._slots = SlotTable(settings.n_parallel, settings.prompt_cache_mib << 20)
        self._saving: dict[str, asyncio.Future[None]] = {}
        """Saves under way, by state name: a restore of that state waits for its save."""
        self._state_dir = ""
        self.tags = CallTags()
        self.eos_text = ""
        """The end-of-generation token's text (``<|im_end|>``): where the template ends a turn."""
        self.n_vocab = 0
        self.in_flight = 0
        self.stats = {
            "generations": 0,
            "prompt_tokens": 0,
            "cached_prompt_tokens": 0,
            "generated_tokens": 0,
            "generation_seconds": 0.0,
        }
        """Running totals since start (shown by ``GET /``): how much prefix caching saves, tokens/s."""

    # ------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Load the model (blocking: seconds)."""
        import xllamacpp

        s = self.settings
        params = xllamacpp.CommonParams()
        params.model.path = str(s.model_path)
        params.n_parallel = s.n_parallel
        params.n_ctx = s.n_ctx * s.n_parallel  # llama.cpp splits the context evenly over the slots
        params.n_batch = s.n_batch
        params.cpuparams.n_threads = s.n_threads
        params.cpuparams_batch.n_threads = s.n_threads_batch
        params.cache_prompt = True
        # Requests name their slot, which bypasses llama.cpp's own prompt cache: SlotTable's saved
        # states (files in a private directory) take its place.
        params.cache_ram_mib = 0
        self._state_dir = tempfile.mkdtemp(prefix="polygym-slots-")
        params.slot_save_path = self._state_dir
        params.use_jinja = True
        params.ui = False
        params.n_threads_http = 2
        params.api_keys = [self._api_key]
        params.verbosity = 3 if s.verbose else -1
        self._server = xllamacpp.Server(params)
        self._base_url = str(self._server.listening_address).rstrip("/")

    async def open(self) -> None:
        """Connect to the loopback helper endpoints and learn how this vocabulary spells tool tags."""
        # A fresh loopback connection per call: llama.cpp's HTTP server drops idle keep-alive
        # connections on its own schedule, and writing into one it just closed fails the call.
        self._http = aiohttp.ClientSession(
            headers={"authorization": f"Bearer {self._api_key}"},
            timeout=aiohttp.ClientTimeout(total=120),
            connector=aiohttp.TCPConnector(force_close=True, limit=0),
        )
        self.tags = CallTags(
            open=await self._tag_literal("<tool_call>"), close=await self._tag_literal("</tool_call>")
        )
        self.eos_text = str((await self._get("/props")).get("eos_token") or "")
        models = (await self._get("/v1/models")).get("data") or [{}]
        self.n_vocab = int((models[0].get("meta") or {}).get("n_vocab") or 0)

    async def _tag_literal(self, tag: str) -> str:
        pieces = await self._post("/tokenize", {"content": tag, "with_pieces": True, "parse_special": True})
        tokens = pieces.get("tokens") or []
        if len(tokens) == 1 and isinstance(tokens[0], dict) and tokens[0].get("piece") == tag:
            return f"<[{int(tokens[0]['id'])}]>"
        return '"' + tag + '"'

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._server is not None:
            # Freeing the model joins llama.cpp's threads: do it off the event loop. A generation
            # still running holds its own reference, so the model outlives it.
            holder = [self._server]
            self._server = None
            await asyncio.get_running_loop().run_in_executor(None, holder.clear)
        self._pool.shutdown(wait=False)
        if self._state_dir:
            shutil.rmtree(self._state_dir, ignore_errors=True)

    @property
    def loaded(self) -> bool:
        return self._server is not None

    # ------------------------------------------------------------------------------ helpers

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Call a loopback helper endpoint; they are pure, so a broken connection is retried."""
        if self._http is None:
            raise HTTPError(503, "the local model is not loaded yet", "model_not_ready")
        attempt = 0
        while True:
            attempt += 1
            try:
                async with self._http.post(self._base_url + path, json=body) as reply:
                    data = await reply.json(content_type=None)
                    status = reply.status
            except aiohttp.ClientConnectionError as exc:
                if attempt >= _HELPER_ATTEMPTS:
                    raise HTTPError(500, f"llama.cpp {path} failed: {exc!r}", "llama_error") from exc
                await asyncio.sleep(0.05 * attempt)
                continue
            if status >= 400:
                error = data.get("error") if isinstance(data, dict) else None
                message = error.get("message") if isinstance(error, dict) else data
                raise HTTPError(400 if status < 500 else 500, f"llama.cpp {path}: {message}", "llama_error")
            return data

    async def _get(self, path: str) -> dict[str, Any]:
        if self._http is None:
            raise HTTPError(503, "the local model is not loaded yet", "model_not_ready")
        async with self._http.get(self._base_url + path) as reply:
            data = await reply.json(content_type=None)
        return data if isinstance(data, dict) else {}

    async def apply_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        """The prompt text the model's chat template makes of ``messages`` and ``tools``."""
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"] = tools
        return str((await self._post("/apply-template", body))["prompt"])

    async def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids exactly as llama.cpp tokenizes a text prompt (special tokens parsed; BOS and
        the like added unless ``add_special`` is off, as for a suffix)."""
        body = {"content": text, "add_special": add_special, "parse_special": True}
        return [int(t) for t in (await self._post("/tokenize", body))["tokens"]]

    async def detokenize(self, token_ids: list[int]) -> str:
        return str((await self._post("/detokenize", {"tokens": token_ids}))["content"])

    # ------------------------------------------------------------------------------ generation

    async def generate(
        self, prompt_ids: list[int], options: dict[str, Any], want_tokens: bool, session: str | None = None
    ) -> Generation:
        """Complete ``prompt_ids`` with llama.cpp sampling ``options`` (a /completion body, no prompt),
        when ``Admission`` gives the request (of the conversation ``session``) a slot."""
        body = {"cache_prompt": True, **options, "prompt": prompt_ids, "stream": False}
        if want_tokens:
            body["n_probs"] = max(1, int(body.get("n_probs") or 0))
        key = prefix_key(prompt_ids)
        await self._admission.acquire(session, key)
        placement = self._slots.place(prompt_ids)
        if placement.spill is not None:  # before any other request can look for it
            self._saving[placement.spill.name] = asyncio.get_running_loop().create_future()
        ran = False
        try:
            if self._server is None:
                raise HTTPError(503, "the local model is not loaded", "model_not_ready")
            self.in_flight += 1
            started = time.perf_counter()
            try:
                await self._prepare(placement)
                if placement.slot >= 0:
                    body["id_slot"] = placement.slot
                reply = await asyncio.get_running_loop().run_in_executor(
                    self._pool, self._server.handle_completions, body
                )
                ran = True
            finally:
                self.in_flight -= 1
            seconds = time.perf_counter() - started
        finally:
            if placement.spill is not None:
                self._saved(placement.spill.name, 0)  # no-op unless the save never ended
            self._slots.release(placement.slot, prompt_ids if ran else ())
            self._admission.release(key, ran)
        generation = _generation(reply, seconds)
        self.stats["generations"] += 1
        self.stats["prompt_tokens"] += generation.prompt_tokens
        self.stats["cached_prompt_tokens"] += generation.cached_tokens
        self.stats["generated_tokens"] += generation.completion_tokens
        self.stats["generation_seconds"] += seconds
        return generation

    async def _prepare(self, placement: Placement) -> None:
        """Save the slot's content and/or load a saved state into it, as placed. A failed step
        costs prompt processing, never the request."""
        if placement.spill is not None:
            reply = await self._slot_action(placement.slot, "save", placement.spill.name)
            self._saved(placement.spill.name, int(reply.get("n_written") or 0))
        if placement.restore is not None:
            saving = self._saving.get(placement.restore.name)
            if saving is not None:
                await asyncio.shield(saving)
            await self._slot_action(placement.slot, "restore", placement.restore.name)

    def _saved(self, name: str, size: int) -> None:
        """A save ended (``size`` bytes; 0: failed or abandoned): record it, delete the files of
        states dropped, and let restores waiting for it go on. Only the first call counts."""
        saving = self._saving.pop(name, None)
        if saving is None:
            return
        for dropped in self._slots.stored(name, size):
            Path(self._state_dir, dropped).unlink(missing_ok=True)
        saving.set_result(None)

    async def _slot_action(self, slot: int, action: str, name: str) -> dict[str, Any]:
        """llama.cpp's slot save or restore of the state file ``name``; {} when it failed."""
        try:
            return await self._post(f"/slots/{slot}?action={action}", {"filename": name})
        except HTTPError:
            return {}


def _generation(reply: Any, seconds: float) -> Generation:
    if not isinstance(reply, dict):
        raise HTTPError(500, f"llama.cpp returned {type(reply).__name__}, not an object", "llama_error")
    if "error" in reply:
        error = reply["error"] if isinstance(reply["error"], dict) else {"message": str(reply["error"])}
        code = int(error.get("code") or 500)
        kind = str(error.get("type") or "llama_error")
        if kind == "exceed_context_size_error":
            kind = "context_length_exceeded"
        raise HTTPError(400 if 400 <= code < 500 else 500, str(error.get("message") or error), kind)
    choice = (reply.get("choices") or [{}])[0]
    usage = reply.get("usage") or {}
    entries = list(((choice.get("logprobs") or {}).get("content")) or [])
    return Generation(
        text=str(choice.get("text") or ""),
        finish_reason=str(choice.get("finish_reason") or "stop"),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
        token_ids=[int(e["id"]) for e in entries],
        log_probs=[float(e.get("logprob", 0.0)) for e in entries],
        entries=entries,
        seconds=seconds,
    )
