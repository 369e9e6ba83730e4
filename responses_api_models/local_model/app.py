"""local_model: an embedded policy that needs no key, no GPU and no download.

A small GGUF model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, by default) runs inside this process on
llama.cpp (``xllamacpp``). Its weights come from pip data packages and are assembled once into a
user cache (weights.py). The server speaks ``/v1/responses`` and ``/v1/chat/completions``; chat
requests are converted to Responses and back with ``polygym.dialects.chat``, so both endpoints share
one code path. README.md documents the config and the request extensions.

How a turn is produced, and why:
1. The request becomes chat messages (``developer`` -> ``system``, which small models' templates
   understand; leading system messages merged into one) and the model's own chat template renders
   messages and tools; the prompt is tokenized so the exact ``prompt_token_ids`` are known. The
   prompt is not otherwise touched by default: a tool-use hint in the system message (config
   ``tool_prompt``) made the 0.5B model *talk about* calling the tool instead of calling it (first
   turns with a call: 11/15 without a hint, 6-8/15 with three different hints).
2. Generation is constrained by a grammar (tool_calls.py): either calls of offered tools with
   schema-valid arguments, in any wrapping the model likes, or a plain-text answer. ``tool_choice``
   narrows it (``none`` -> answer only, ``required``/a named tool -> calls only).
3. The text is read with a lenient parser (tool_calls.py) into ``function_call`` items and/or a
   message.
4. Termination: small models like to call the same tool again after getting its result. A call
   identical to one already made in this episode (since the last user message) is not returned;
   the turn is regenerated with that tool removed from the grammar, down to "answer only". After
   ``max_tool_rounds`` rounds of calls the model must answer. Both make rollouts end with an answer.

Token ids and log probs are returned when asked (``return_token_ids`` in the request or config):
``prompt_token_ids``, ``generation_token_ids`` and ``generation_log_probs`` on the last output item.
When the history sent back carries them, the next prompt is those exact ids plus the tokens of the
newer messages (token-in/token-out, ``polygym.training.continuation``), not a re-rendered history,
and ``prompt_continuation`` on the output says so (or why not).
Log probs are the model's own (temperature 1, before the grammar mask), i.e. what a trainer
recomputes; generation ids include the end-of-turn token when the model stopped by itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from polygym import (
    HTTPError,
    ModelServer,
    ServerConfig,
    function_call_item,
    input_items,
    message_item,
    new_response,
    require_extra,
)
from polygym.models import (
    ECHOED_RESPONSE_FIELDS,
    KNOWN_MODELS,
    Continuation,
    NoCleanSuffix,
    WeightsError,
    attach_token_fields,
    check_prefix,
    ensure_weights,
    item_type,
    join,
    logprob_semantics,
    parent_ids,
    probe_messages,
    suffix_text,
)
from polygym.models import chat as chat_convert
from responses_api_models.local_model.engine import (
    Engine,
    EngineSettings,
    Generation,
    default_batch_threads,
    default_threads,
)
from responses_api_models.local_model.tool_calls import (
    ParsedCall,
    ParsedTurn,
    build_grammar,
    function_tools,
    parse_tool_calls,
    sanitize_schema,
)

logger = logging.getLogger("polygym.local_model")

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
LOGPROBS_INCLUDE = "message.output_text.logprobs"


class Config(ServerConfig):
    model: str | None = None
    """A known model name (default qwen2.5-coder-0.5b), or just the reported name with model_path."""
    model_path: str | None = None
    """Any GGUF file; when set, no weights are assembled."""
    cache_dir: str | None = None
    """Where assembled weights live (default $POLYGYM_CACHE_DIR or ~/.cache/polygym/models)."""
    n_ctx: int = Field(default=4096, ge=256)
    """Context length of each slot (prompt + generation), in tokens."""
    n_parallel: int = Field(default=8, ge=1, le=256)
    """Sequences generated at once (continuous batching); more requests wait their turn. Each slot
    keeps its last prompt cached, so a slot per concurrent rollout saves re-reading prompts."""
    n_threads: int | None = Field(default=None, ge=1)
    """CPU threads for decoding; default: usable cores - 1, at least 1, at most 8."""
    n_threads_batch: int | None = Field(default=None, ge=1)
    """CPU threads for prompt processing; default: n_threads when set, else usable cores (at most 8)."""
    n_batch: int = Field(default=512, ge=32)
    prompt_cache_mib: int = Field(default=256, ge=0)
    """Room for saved slot states (files in a private temporary directory, slots.py): a prompt prefix
    computed once is copied into every slot that needs it, and a conversation's evicted slot back."""
    max_output_tokens: int = Field(default=1024, ge=1)
    """Generation limit when the request sets none (always capped by the room left in n_ctx)."""
    temperature: float = Field(default=0.0, ge=0)
    """Used when the request sets none; 0 = greedy (see README.md, "Sampling defaults")."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    """0 = off: a request's temperature and top_p then fully define the sampling distribution."""
    min_p: float = Field(default=0.0, ge=0, le=1)
    seed: int | None = None
    """Sampling seed when the request sets none (None: a fresh random seed per call)."""
    return_token_ids: bool = False
    """Always return the training token fields (a request may also ask with return_token_ids)."""
    constrain_tool_calls: bool = True
    """Constrain output to valid tool calls or an answer when tools are offered (see tool_calls.py)."""
    max_calls_per_turn: int = Field(default=1, ge=1)
    """Calls one turn may hold; small models given more tend to list the same call many times."""
    max_array_items: int | None = Field(default=64, ge=1)
    """Longest list a tool call may hold where the tool's schema sets no maxItems (stops loops)."""
    max_tool_rounds: int | None = Field(default=8, ge=0)
    """After this many rounds of calls since the last user message the model must answer."""
    avoid_repeated_calls: bool = True
    """Regenerate a turn that repeats an earlier identical call, without that tool (needs constraints)."""
    tool_prompt: str = ""
    """Appended to the system message when tools are offered (default: nothing; see module doc)."""
    verbose: bool = False
    """Let llama.cpp log to stderr."""

    @model_validator(mode="after")
    def _known_model(self) -> Config:
        if self.model_path is None and (self.model or DEFAULT_MODEL) not in KNOWN_MODELS:
            known = ", ".join(sorted(KNOWN_MODELS))
            raise ValueError(
                f"model {self.model!r} is not a known model ({known}); set model_path to use any GGUF file"
            )
        return self


# ------------------------------------------------------------------------------------- requests


@dataclass
class Episode:
    """What the turn logic needs from the conversation since the last user message."""

    call_keys: set[str] = field(default_factory=set)
    tool_rounds: int = 0


def episode_of(items: list[dict[str, Any]]) -> Episode:
    users = [i for i, item in enumerate(items) if item_type(item) == "message" and item.get("role") == "user"]
    episode = Episode()
    in_round = False
    for item in items[users[-1] + 1 if users else 0 :]:
        kind = item_type(item)
        if kind == "function_call":
            if not in_round:
                episode.tool_rounds += 1
            in_round = True
            raw = item.get("arguments") or "{}"
            try:
                arguments = json.loads(raw) if isinstance(raw, str) else raw
            except json.JSONDecodeError:
                continue
            if isinstance(arguments, dict):
                episode.call_keys.add(ParsedCall(str(item.get("name", "")), arguments).key())
        elif kind != "reasoning":
            in_round = False
    return episode


@dataclass
class ToolMode:
    """Which tools the grammar offers, and whether calls and/or an answer are allowed."""

    tools: list[dict[str, Any]]
    allow_calls: bool
    allow_answer: bool


def tool_mode(choice: Any, tools: list[dict[str, Any]]) -> ToolMode:
    if choice in (None, "auto"):
        return ToolMode(tools, bool(tools), True)
    if choice == "none":
        return ToolMode(tools, False, True)
    if choice == "required":
        return ToolMode(tools, bool(tools), not tools)
    if isinstance(choice, dict):
        if choice.get("type") == "function" and choice.get("name"):
            chosen = [t for t in tools if t["name"] == choice["name"]]
            if not chosen:
                raise HTTPError(400, f"tool_choice names {choice['name']!r}, which is not in tools")
            return ToolMode(chosen, True, False)
        if choice.get("type") == "allowed_tools":
            names = {str(t.get("name")) for t in choice.get("tools") or [] if isinstance(t, dict)}
            allowed = [t for t in tools if t["name"] in names]
            required = choice.get("mode") == "required"
            return ToolMode(allowed, bool(allowed), not (required and allowed))
    raise HTTPError(400, f"unsupported tool_choice: {json.dumps(choice)[:200]}", "invalid_request")


def _number(body: dict[str, Any], key: str, default: Any, kind: type, low: float, high: float | None) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and value != int(value)):
        raise HTTPError(400, f"{key} must be a {kind.__name__}, not {value!r}", "invalid_request")
    if value < low or (high is not None and value > high):
        limit = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
        raise HTTPError(400, f"{key} must be {limit}, not {value!r}", "invalid_request")
    return kind(value)


def answer_schema_of(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON Schema an answer must follow (Responses ``text.format``), if any."""
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "object"}
    if fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        return fmt["schema"]
    raise HTTPError(400, f"unsupported text.format: {json.dumps(fmt)[:200]}", "invalid_request")


def _chat_text(content: Any, role: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise HTTPError(
        400, f"local_model takes text only; a {role} message has other content", "invalid_request"
    )


def prepare_messages(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """Messages as small chat templates expect them: one leading system message, text content."""
    prepared: list[dict[str, Any]] = []
    for message in messages:
        role = "system" if message.get("role") == "developer" else str(message.get("role", "user"))
        prepared.append({**message, "role": role, "content": _chat_text(message.get("content"), role)})
    while len(prepared) > 1 and prepared[0]["role"] == "system" and prepared[1]["role"] == "system":
        second = prepared.pop(1)
        prepared[0] = {**prepared[0], "content": f"{prepared[0]['content']}\n\n{second['content']}"}
    if hint:
        if prepared and prepared[0]["role"] == "system":
            prepared[0] = {**prepared[0], "content": f"{prepared[0]['content']}\n\n{hint}".strip()}
        else:
            prepared.insert(0, {"role": "system", "content": hint})
    return prepared


@dataclass
class Turn:
    """The result of one model call: the parsed turn plus what produced it."""

    parsed: ParsedTurn
    generation: Generation
    prompt_ids: list[int]
    attempts: int
    continuation: Continuation | None = None
    """How the prompt was built from the previous call's ids, on later turns of a token-capturing
    episode (``polygym.training.continuation``)."""


# ------------------------------------------------------------------------------------- server


class LocalModel(ModelServer[Config]):
    """Serves an in-process llama.cpp model on ``/v1/responses`` and ``/v1/chat/completions``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        require_extra(self.name, "local", "xllamacpp")  # imported when the model loads, at startup
        self.engine: Engine | None = None
        self.model_path: Path | None = None
        self.startup_seconds: dict[str, float] = {}

    @property
    def model_name(self) -> str:
        if self.config.model:
            return self.config.model
        return Path(self.config.model_path).stem if self.config.model_path else DEFAULT_MODEL

    # ------------------------------------------------------------------------------ lifecycle

    def _batch_threads(self) -> int:
        """Prompt threads: as configured, else as many as the decoding threads a user set, else
        every usable core (``engine.default_batch_threads``)."""
        return self.config.n_threads_batch or self.config.n_threads or default_batch_threads()

    def _resolve_model_path(self) -> Path:
        if self.config.model_path:
            path = Path(self.config.model_path).expanduser()
            if not path.is_file():
                raise WeightsError(f"model_path {path} does not exist or is not a file")
            return path
        spec = KNOWN_MODELS[self.config.model or DEFAULT_MODEL]
        return ensure_weights(spec, self.config.cache_dir)

    async def startup(self) -> None:
        """Assemble (first run) or find the weights, then load the model; both off the event loop."""
        started = time.perf_counter()
        self.model_path = await asyncio.to_thread(self._resolve_model_path)
        weights_done = time.perf_counter()
        threads = self.config.n_threads or default_threads()
        engine = Engine(
            EngineSettings(
                model_path=self.model_path,
                n_ctx=self.config.n_ctx,
                n_parallel=self.config.n_parallel,
                n_threads=threads,
                n_threads_batch=self._batch_threads(),
                n_batch=self.config.n_batch,
                prompt_cache_mib=self.config.prompt_cache_mib,
                verbose=self.config.verbose,
            )
        )
        await asyncio.to_thread(engine.start)
        await engine.open()
        self.engine = engine
        done = time.perf_counter()
        self.startup_seconds = {
            "weights_s": round(weights_done - started, 3),
            "load_s": round(done - weights_done, 3),
            "total_s": round(done - started, 3),
        }
        logger.info("%s: %s ready %s", self.name, self.model_name, self.startup_seconds)

    async def shutdown(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            logger.info("%s: shutting down after %s", self.name, engine.stats)
            await engine.close()

    async def health(self) -> dict[str, Any]:
        info = {**await super().health(), "model": self.model_name, "loaded": self.engine is not None}
        if self.engine is not None:
            settings = self.engine.settings
            info.update(
                model_path=str(self.model_path),
                n_parallel=settings.n_parallel,
                n_ctx=settings.n_ctx,
                n_threads=settings.n_threads,
                in_flight=self.engine.in_flight,
                startup=self.startup_seconds,
                stats={k: round(v, 3) for k, v in self.engine.stats.items()},
            )
        return info

    def _engine(self) -> Engine:
        if self.engine is None:
            raise HTTPError(503, "the local model is not loaded (startup did not finish)", "model_not_ready")
        return self.engine

    # ------------------------------------------------------------------------------ endpoints

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("stream"):
            raise HTTPError(400, "stream=true is not supported by local_model; send stream=false")
        want_tokens = self._want_tokens(body)
        include = body.get("include") or []
        want_logprobs = isinstance(include, list) and LOGPROBS_INCLUDE in include
        turn = await self.turn(body, answer_schema_of(body), want_tokens or want_logprobs)
        return self._response(body, turn, want_tokens, want_logprobs)

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(body.get("messages"), list):
            raise HTTPError(400, "messages must be a list of message objects", "invalid_request")
        if body.get("stream"):
            raise HTTPError(400, "stream=true is not supported by local_model; send stream=false")
        if body.get("n") not in (None, 1):
            raise HTTPError(400, "local_model returns one choice; n must be 1", "invalid_request")
        params = chat_convert.chat_request_to_responses(body)
        for key in ("seed", "top_k", "min_p", "stop", "return_token_ids"):
            if body.get(key) is not None:
                params[key] = body[key]
        want_tokens = self._want_tokens(params)
        want_logprobs = bool(body.get("logprobs"))
        top = _number(body, "top_logprobs", 0, int, 0, 20)
        turn = await self.turn(params, _chat_answer_schema(body), want_tokens or want_logprobs, top)
        response = self._response(params, turn, False, False)
        completion = chat_convert.response_to_chat_completion(response, self.model_name)
        choice = completion["choices"][0]
        if want_logprobs:
            choice["logprobs"] = {"content": _logprob_entries(turn.generation, top)}
        if want_tokens:
            _attach_training_fields([choice["message"]], turn, self._temperature(params))
        cached = turn.generation.cached_tokens
        completion["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
        return completion

    def _want_tokens(self, body: dict[str, Any]) -> bool:
        asked = body.get("return_token_ids")
        if asked is not None and not isinstance(asked, bool):
            raise HTTPError(400, "return_token_ids must be true or false", "invalid_request")
        return bool(asked) if asked is not None else self.config.return_token_ids

    # ------------------------------------------------------------------------------ one turn

    async def turn(
        self,
        body: dict[str, Any],
        answer_schema: dict[str, Any] | None,
        want_tokens: bool,
        top_logprobs: int = 0,
    ) -> Turn:
        """Generate one model turn for a Responses create body (see the module docstring)."""
        engine = self._engine()
        if body.get("tools") is not None and not isinstance(body.get("tools"), list):
            raise HTTPError(400, "tools must be a list", "invalid_request")
        tools = function_tools(body.get("tools"))
        mode = tool_mode(body.get("tool_choice"), tools)
        prompt_ids, continuation = await self._prompt_ids(engine, body, bool(tools))
        room = engine.settings.n_ctx - len(prompt_ids)
        options = self._sampling(body, room)
        if top_logprobs:
            options["n_probs"] = top_logprobs

        episode = episode_of(input_items(body))
        if self.config.max_tool_rounds is not None and episode.tool_rounds >= self.config.max_tool_rounds:
            mode = ToolMode(mode.tools, False, True)
        max_calls = self.config.max_calls_per_turn if body.get("parallel_tool_calls") is not False else 1
        constrain = self.config.constrain_tool_calls
        offered = mode.tools
        attempts = 0
        while True:
            attempts += 1
            allow_calls = mode.allow_calls and bool(offered)
            # Calls are only read from text whose grammar allowed them (or that had no grammar).
            read_calls = allow_calls if constrain else bool(tools) and mode.allow_calls
            grammar = None
            if constrain or answer_schema is not None:
                grammar = build_grammar(
                    offered if constrain else [],
                    allow_calls=allow_calls and constrain,
                    allow_answer=mode.allow_answer or not allow_calls,
                    max_calls=max_calls,
                    answer_schema=answer_schema,
                    tags=engine.tags,
                    guard_answer=constrain and bool(tools),
                    max_array_items=self.config.max_array_items,
                )
            request = {**options, "grammar": grammar} if grammar else options
            generation = await engine.generate(prompt_ids, request, want_tokens, self.session_id())
            parsed = parse_tool_calls(generation.text) if read_calls else ParsedTurn(generation.text)
            fresh = _fresh_calls(parsed.calls, episode.call_keys)
            if not parsed.calls or fresh or not (constrain and self.config.avoid_repeated_calls):
                break
            # Every call repeats an earlier one: offer the turn again without those tools.
            repeated = {call.name for call in parsed.calls}
            remaining = [t for t in offered if t["name"] not in repeated]
            if len(remaining) == len(offered):
                break
            offered = remaining
            logger.debug("%s: repeated call(s) to %s; regenerating", self.name, sorted(repeated))
        if fresh or not parsed.calls:
            parsed = ParsedTurn(parsed.text, fresh)
        return Turn(parsed, generation, prompt_ids, attempts, continuation)

    async def _prompt_ids(
        self, engine: Engine, body: dict[str, Any], has_tools: bool
    ) -> tuple[list[int], Continuation | None]:
        """The request as token ids: the previous call's exact ids plus the new messages' tokens when
        the history carries them (token-in/token-out), else the whole history rendered by the
        model's chat template and tokenized; 400 when too long."""
        raw_input = body.get("input", [])
        if not isinstance(raw_input, str | list) or (
            isinstance(raw_input, list) and not all(isinstance(i, dict) for i in raw_input)
        ):
            raise HTTPError(400, "input must be a string or a list of item objects", "invalid_request")
        chat = chat_convert.responses_request_to_chat(body)
        # The hint depends only on the request, so every turn of an episode shares the prompt prefix.
        hint = self.config.tool_prompt if has_tools and body.get("tool_choice") != "none" else ""
        messages = prepare_messages(chat["messages"], hint)
        if not messages:
            raise HTTPError(400, "input is empty", "invalid_request")
        tools = chat.get("tools") or []
        full = await _render(engine, messages, tools)
        prefix, no_prefix = parent_ids(input_items(body))
        continuation = None if no_prefix is None else Continuation(None, no_prefix)
        if prefix is not None:
            continuation = await self._continued(engine, prefix, messages, tools, full)
        if continuation is not None and continuation.prompt_ids is not None:
            prompt_ids = continuation.prompt_ids
        else:
            prompt_ids = await engine.tokenize(full)
        if len(prompt_ids) >= engine.settings.n_ctx:
            raise HTTPError(
                400,
                f"the prompt has {len(prompt_ids)} tokens; local_model's context (n_ctx) is "
                f"{engine.settings.n_ctx} per request",
                "context_length_exceeded",
            )
        return prompt_ids, continuation

    @staticmethod
    async def _continued(
        engine: Engine,
        prefix: list[int],
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        full: str,
    ) -> Continuation:
        try:
            prefix = check_prefix(prefix, engine.n_vocab or 1 << 31, engine.settings.n_ctx)
            probe = await _render(engine, probe_messages(messages), tools)
            text = suffix_text(full, probe, engine.eos_text)
        except (NoCleanSuffix, ValueError) as exc:
            return Continuation(None, str(exc))
        return Continuation(join(prefix, await engine.tokenize(text, add_special=False)))

    def _temperature(self, body: dict[str, Any]) -> float | None:
        return _number(body, "temperature", self.config.temperature, float, 0, 2)

    def _sampling(self, body: dict[str, Any], room: int) -> dict[str, Any]:
        cfg = self.config
        max_tokens = _number(body, "max_output_tokens", cfg.max_output_tokens, int, 1, None)
        options: dict[str, Any] = {
            "n_predict": min(max_tokens, room),
            "temperature": self._temperature(body),
            "top_p": _number(body, "top_p", cfg.top_p, float, 0, 1),
            "top_k": _number(body, "top_k", cfg.top_k, int, 0, None),
            "min_p": _number(body, "min_p", cfg.min_p, float, 0, 1),
        }
        seed = _number(body, "seed", cfg.seed, int, 0, 2**32 - 2)
        if seed is not None:
            options["seed"] = seed
        stop = body.get("stop")
        if stop is not None:
            stops = [stop] if isinstance(stop, str) else stop
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise HTTPError(400, "stop must be a string or a list of strings", "invalid_request")
            options["stop"] = stops
        return options

    # ------------------------------------------------------------------------------ output

    def _response(
        self, body: dict[str, Any], turn: Turn, want_tokens: bool, want_logprobs: bool
    ) -> dict[str, Any]:
        generation = turn.generation
        output: list[dict[str, Any]] = []
        if turn.parsed.text or not turn.parsed.calls:
            message = message_item(turn.parsed.text)
            if want_logprobs:
                message["content"][0]["logprobs"] = _logprob_entries(generation, 0)
            output.append(message)
        for call in turn.parsed.calls:
            output.append(function_call_item(call.name, json.dumps(call.arguments, ensure_ascii=False)))
        if want_tokens:
            _attach_training_fields(output, turn, self._temperature(body))
        extra: dict[str, Any] = {"error": None, "incomplete_details": None}
        status = "completed"
        if generation.finish_reason == "length" and not turn.parsed.calls:
            status = "incomplete"
            extra["incomplete_details"] = {"reason": "max_output_tokens"}
        usage = {
            "input_tokens": len(turn.prompt_ids),
            "input_tokens_details": {"cached_tokens": generation.cached_tokens},
            "output_tokens": generation.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": len(turn.prompt_ids) + generation.completion_tokens,
        }
        echoed = {key: body.get(key, default) for key, default in ECHOED_RESPONSE_FIELDS.items()}
        return new_response(
            output, self.model_name, usage, status=status, tools=body.get("tools") or [], **extra, **echoed
        )


async def _render(engine: Engine, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """The model's chat template applied to ``messages`` and ``tools`` (generation prompt on)."""
    try:
        return await engine.apply_template(messages, tools)
    except HTTPError:
        if not tools:
            raise
        # llama.cpp also compiles the tool schemas here and rejects ones it cannot (an unresolved
        # $ref, ...): show the model the simplified schemas, descriptions kept, instead.
        return await engine.apply_template(messages, [_displayable(t) for t in tools])


def _displayable(tool: dict[str, Any]) -> dict[str, Any]:
    """A chat-format tool with its parameters reduced to the schema subset every engine accepts."""
    function = dict(tool.get("function") or {})
    function["parameters"] = sanitize_schema(function.get("parameters") or {}, keep_descriptions=True)
    return {**tool, "function": function}


def _fresh_calls(calls: list[ParsedCall], seen: set[str]) -> list[ParsedCall]:
    """Calls not made before in this episode, nor earlier in the same turn."""
    fresh, keys = [], set(seen)
    for call in calls:
        key = call.key()
        if key not in keys:
            keys.add(key)
            fresh.append(call)
    return fresh


def _attach_training_fields(output: list[dict[str, Any]], turn: Turn, temperature: float | None) -> None:
    """The training token fields on ``output``'s last item, stamped with llama.cpp's log-prob
    semantics: without ``post_sampling_probs`` its probabilities are the model's raw distribution."""
    generation = turn.generation
    attach_token_fields(
        output,
        turn.prompt_ids,
        generation.token_ids,
        generation.log_probs,
        logprob_semantics("llama_cpp", temperature, "raw"),
        None if turn.continuation is None else turn.continuation.stamp(),
    )


def _logprob_entries(generation: Generation, top: int) -> list[dict[str, Any]]:
    """OpenAI-shaped log prob records (token, bytes, logprob, top_logprobs) from llama.cpp's."""
    entries = []
    for entry in generation.entries:
        alternatives = entry.get("top_logprobs") or []
        entries.append(
            {
                "token": entry.get("token", ""),
                "bytes": entry.get("bytes"),
                "logprob": entry.get("logprob", 0.0),
                "top_logprobs": [
                    {"token": a.get("token", ""), "bytes": a.get("bytes"), "logprob": a.get("logprob", 0.0)}
                    for a in alternatives[:top]
                ],
            }
        )
    return entries


def _chat_answer_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    fmt = body.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "object"}
    spec = fmt.get("json_schema")
    if fmt.get("type") == "json_schema" and isinstance(spec, dict) and isinstance(spec.get("schema"), dict):
        return spec["schema"]
    raise HTTPError(400, f"unsupported response_format: {json.dumps(fmt)[:200]}", "invalid_request")
