"""scripted_model: a deterministic tool-calling policy that needs no network, no key and no GPU.

It exists so that everything around a model — agents, environments, rollout collection, the
multi-environment machinery, benchmarks — can be run and tested end to end, quickly and with exact
expectations. It plays a policy, decided in this order (README.md documents each one):

1. a **script** — from the request's ``metadata.script`` (a JSON string) or the config's ``script`` —
   saying what to emit on each model call, including HTTP errors and delays;
2. the first config **rule** whose tools are offered and whose regex matches the first user message;
3. a **generic fallback** that calls each offered tool once with arguments made from its schema
   (by ``polygym.json_schema``, the synthesizer ``gym env check`` uses: required properties only).

The server is stateless: the progress of an episode is read from the request ``input`` (the model
turns since the last user message), so any number of rollouts can run at once, a retried request
gets the same answer, and the same policy serves ``/v1/responses`` and ``/v1/chat/completions``.
Token usage is estimated as whitespace-separated words, so it is deterministic too. With
``return_token_ids`` it also returns fake training token fields (UTF-8 bytes, log-prob 0), so the
token-level training path can be tested without a real tokenizer.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError, model_validator

from polygym import (
    HTTPError,
    ModelServer,
    ServerConfig,
    function_call_item,
    input_items,
    item_text,
    message_item,
    new_response,
)
from polygym.models import (
    ECHOED_RESPONSE_FIELDS,
    attach_token_fields,
    example_arguments,
    item_type,
    logprob_semantics,
    validation_message,
)
from polygym.models import chat as chat_convert

DONE = "done"
"""The answer once a script or the generic fallback has nothing left to call."""

_TEMPLATE = re.compile(r"\{([A-Za-z_]\w*)\}")
_OUTPUTS_KEY = "$outputs"
_ECHO_CHARS = 200


# ------------------------------------------------------------------------------------------ config


class ForEach(BaseModel):
    """Repeat a call once per item of a match variable split on ``sep`` (items are stripped)."""

    model_config = ConfigDict(extra="forbid")

    group: str
    sep: str = ","


class RuleCall(BaseModel):
    """One call of a rule: ``tool`` with ``arguments`` (templated), optionally ``for_each`` item."""

    model_config = ConfigDict(extra="forbid")

    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    for_each: ForEach | None = None


class Rule(BaseModel):
    """A declarative policy for one kind of task (see README.md, "Rules")."""

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    when_tools: list[str] = Field(default_factory=list)
    match: str | None = None
    calls: list[RuleCall] = Field(default_factory=list)
    answer: str = DONE

    _pattern: re.Pattern[str] | None = PrivateAttr(default=None)

    @property
    def pattern(self) -> re.Pattern[str] | None:
        return self._pattern

    @model_validator(mode="after")
    def _compile_and_check(self) -> Rule:
        """Compile the regex and check every template name now, not on the thousandth rollout."""
        label = f"rule {self.name!r}" if self.name else "rule"
        if self.match is not None:
            try:
                self._pattern = re.compile(self.match)
            except re.error as exc:
                raise ValueError(f"{label}: match is not a valid regular expression: {exc}") from None
        groups = set(self._pattern.groupindex) if self._pattern else set()
        called: set[str] = set()
        for index, call in enumerate(self.calls):
            where = f"{label}, calls[{index}] ({call.tool})"
            known = groups | {"last_output"}
            if call.for_each is not None:
                if call.for_each.group not in groups:
                    raise ValueError(f"{where}: for_each.group {call.for_each.group!r} {_no_group(groups)}")
                known.add("item")
            _check_arguments(call.arguments, known, called, where)
            called.add(call.tool)
        _check_template(self.answer, groups | {"last_output"}, f"{label}, answer")
        return self


def _no_group(groups: set[str]) -> str:
    names = ", ".join(sorted(groups)) or "none"
    return f"is not a named group of the match regex (groups: {names})"


def _check_template(text: str, known: set[str], where: str) -> None:
    for name in _TEMPLATE.findall(text):
        if name not in known:
            raise ValueError(
                f"{where}: template {{{name}}} is unknown; available: {', '.join(sorted(known))}"
            )


def _check_arguments(value: Any, known: set[str], called: set[str], where: str) -> None:
    if isinstance(value, str):
        _check_template(value, known, where)
    elif isinstance(value, dict) and _OUTPUTS_KEY in value:
        extra = set(value) - {_OUTPUTS_KEY, "field"}
        if extra:
            raise ValueError(f"{where}: an {_OUTPUTS_KEY} value takes only 'field', not {sorted(extra)}")
        if value[_OUTPUTS_KEY] not in called:
            raise ValueError(
                f"{where}: {_OUTPUTS_KEY} names {value[_OUTPUTS_KEY]!r}, which no earlier call uses"
            )
    elif isinstance(value, dict):
        for item in value.values():
            _check_arguments(item, known, called, where)
    elif isinstance(value, list):
        for item in value:
            _check_arguments(item, known, called, where)


class ScriptTurn(BaseModel):
    """What to emit on one model call: a tool call, an answer or an HTTP error (+ a delay)."""

    model_config = ConfigDict(extra="forbid")

    tool: str | None = None
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    answer: str | None = None
    error: int | None = None
    message: str = "scripted error"
    sleep_ms: float = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _one_action(self) -> ScriptTurn:
        actions = [name for name in ("tool", "answer", "error") if getattr(self, name) is not None]
        if len(actions) != 1:
            found = ", ".join(actions) or "none"
            raise ValueError(
                f"a script turn needs exactly one of 'tool', 'answer' or 'error' (found: {found})"
            )
        if self.error is not None and not 400 <= self.error <= 599:
            raise ValueError(f"error must be an HTTP error status (400-599), not {self.error}")
        return self


_SCRIPT = TypeAdapter(list[ScriptTurn])


class Config(ServerConfig):
    model: str = "scripted"
    latency_ms: float = Field(default=0, ge=0)
    rules: list[Rule] = Field(default_factory=list)
    script: list[ScriptTurn] | None = None
    return_token_ids: bool = False
    """Attach fake training token fields (see ``fake_token_ids``); a request's own
    ``return_token_ids`` overrides this either way."""


# ------------------------------------------------------------------------------------ conversation


def _is_model_item(item: dict[str, Any]) -> bool:
    kind = item_type(item)
    if kind == "message":
        return item.get("role") == "assistant"
    return kind == "reasoning" or kind.endswith("_call")


def _output_text(output: Any) -> str:
    return output if isinstance(output, str) else chat_convert.content_text(output)


def _words(text: str) -> int:
    return len(text.split())


@dataclass
class Conversation:
    """What the policy needs from a request, read once."""

    tools: list[dict[str, Any]]
    first_user: str = ""
    last_user: str = ""
    turns: int = 0
    """Model turns since the last user message: runs of consecutive model-produced items."""
    calls: list[tuple[str, str]] = field(default_factory=list)
    """(tool name, call_id) of every function call since the last user message, in order."""
    outputs: dict[str, str] = field(default_factory=dict)
    last_output: str = ""
    input_words: int = 0

    @property
    def tool_names(self) -> list[str]:
        return [t["name"] for t in self.tools]

    @classmethod
    def parse(cls, body: dict[str, Any]) -> Conversation:
        items = _checked_items(body)
        tools = body.get("tools") or []
        if not isinstance(tools, list):
            raise HTTPError(400, "tools must be a list", "invalid_request")
        conv = cls(tools=_function_tools(tools))
        users = [i for i, item in enumerate(items) if _is_user_message(item)]
        if users:
            conv.first_user = item_text(items[users[0]])
            conv.last_user = item_text(items[users[-1]])
        conv.input_words = _words(str(body.get("instructions") or "")) + sum(_item_words(i) for i in items)
        in_turn = False
        for item in items[users[-1] + 1 if users else 0 :]:
            kind = item_type(item)
            if _is_model_item(item):
                conv.turns += 0 if in_turn else 1
                in_turn = True
            else:
                in_turn = False
            if kind == "function_call":
                conv.calls.append((str(item.get("name", "")), str(item.get("call_id", ""))))
            elif kind == "function_call_output":
                conv.last_output = _output_text(item.get("output", ""))
                conv.outputs[str(item.get("call_id", ""))] = conv.last_output
        return conv


def _checked_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    raw = body.get("input", [])
    if isinstance(raw, str) or (isinstance(raw, list) and all(isinstance(i, dict) for i in raw)):
        return input_items(body)
    raise HTTPError(400, "input must be a string or a list of item objects", "invalid_request")


def _is_user_message(item: dict[str, Any]) -> bool:
    return item_type(item) == "message" and item.get("role") == "user"


def _item_words(item: dict[str, Any]) -> int:
    """Estimated tokens of one input item: its whitespace-separated words."""
    kind = item_type(item)
    if kind == "message":
        return _words(item_text(item))
    if kind == "function_call":
        return _words(f"{item.get('name', '')} {item.get('arguments', '')}")
    if kind == "function_call_output":
        return _words(_output_text(item.get("output", "")))
    return 0


def _function_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """Offered function tools as ``{"name", "parameters"}``, accepting either API's tool shape."""
    found = []
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            continue
        spec = tool["function"] if isinstance(tool.get("function"), dict) else tool
        if spec.get("name"):
            found.append({"name": str(spec["name"]), "parameters": spec.get("parameters") or {}})
    return found


# ------------------------------------------------------------------------------------------ policy


@dataclass
class Decision:
    """One model turn: exactly one of ``call`` (name, arguments), ``answer`` or ``error``."""

    call: tuple[str, dict[str, Any] | str] | None = None
    answer: str | None = None
    error: tuple[int, str] | None = None
    sleep_ms: float = 0


def decide(conv: Conversation, config: Config, metadata: Any = None) -> Decision:
    """The policy: a script if there is one, else the first applicable rule, else the fallback."""
    script = request_script(metadata)
    if script is None:
        script = config.script
    if script is not None:
        return _play_script(script, conv.turns)
    for rule in config.rules:
        variables = _rule_variables(rule, conv)
        if variables is not None:
            return _play_rule(rule, variables, conv)
    return _fallback(conv)


def request_script(metadata: Any) -> list[ScriptTurn] | None:
    """The per-request script in ``metadata.script`` (a JSON string, or a list), if any."""
    if not isinstance(metadata, dict) or metadata.get("script") is None:
        return None
    raw = metadata["script"]
    if isinstance(raw, str):
        try:
            raw = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise HTTPError(400, f"metadata.script is not valid JSON: {exc}", "invalid_script") from None
    try:
        return _SCRIPT.validate_python(raw)
    except ValidationError as exc:
        raise HTTPError(400, f"metadata.script: {validation_message(exc)}", "invalid_script") from None


def _play_script(script: list[ScriptTurn], turn: int) -> Decision:
    if turn >= len(script):
        return Decision(answer=DONE)
    step = script[turn]
    if step.error is not None:
        return Decision(error=(step.error, step.message), sleep_ms=step.sleep_ms)
    if step.tool is not None:
        return Decision(call=(step.tool, step.arguments), sleep_ms=step.sleep_ms)
    return Decision(answer=step.answer, sleep_ms=step.sleep_ms)


def _rule_variables(rule: Rule, conv: Conversation) -> dict[str, str] | None:
    """The rule's match variables when it applies to this conversation, else None."""
    offered = set(conv.tool_names)
    if any(name not in offered for name in rule.when_tools):
        return None
    if rule.pattern is None:
        return {}
    found = rule.pattern.search(conv.first_user)
    if found is None:
        return None
    return {name: value or "" for name, value in found.groupdict().items()}


def _fill(text: str, variables: dict[str, str]) -> str:
    return _TEMPLATE.sub(lambda m: variables.get(m.group(1), m.group(0)), text)


def _play_rule(rule: Rule, variables: dict[str, str], conv: Conversation) -> Decision:
    plan: list[tuple[RuleCall, str | None]] = []
    for call in rule.calls:
        if call.for_each is None:
            plan.append((call, None))
            continue
        parts = variables.get(call.for_each.group, "").split(call.for_each.sep)
        plan.extend((call, part.strip()) for part in parts if part.strip())
    values = {**variables, "last_output": conv.last_output}
    if conv.turns >= len(plan):
        return Decision(answer=_fill(rule.answer, values))
    call, item = plan[conv.turns]
    if item is not None:
        values["item"] = item
    return Decision(call=(call.tool, _render(call.arguments, values, conv, rule)))


def _render(value: Any, variables: dict[str, str], conv: Conversation, rule: Rule) -> Any:
    if isinstance(value, str):
        return _fill(value, variables)
    if isinstance(value, dict) and _OUTPUTS_KEY in value:
        return _collect_outputs(str(value[_OUTPUTS_KEY]), value.get("field"), conv, rule)
    if isinstance(value, dict):
        return {key: _render(item, variables, conv, rule) for key, item in value.items()}
    if isinstance(value, list):
        return [_render(item, variables, conv, rule) for item in value]
    return value


def _collect_outputs(tool: str, key: str | None, conv: Conversation, rule: Rule) -> list[Any]:
    """JSON-decoded outputs of every earlier call to ``tool``, taking ``key`` from each."""
    values = []
    for name, call_id in conv.calls:
        if name != tool:
            continue
        if call_id not in conv.outputs:
            raise HTTPError(400, f"input has a call to {tool} (call_id {call_id!r}) but no output for it")
        raw = conv.outputs[call_id]
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            value = raw
        if key is not None:
            if not isinstance(value, dict) or key not in value:
                raise HTTPError(
                    500,
                    f"rule {rule.name!r}: the output of {tool} has no field {key!r}: {raw[:300]}",
                    "rule_error",
                )
            value = value[key]
        values.append(value)
    return values


def _fallback(conv: Conversation) -> Decision:
    if conv.turns < len(conv.tools):
        tool = conv.tools[conv.turns]
        arguments = example_arguments(tool["parameters"] or {"type": "object"}, required_only=True)
        return Decision(call=(tool["name"], arguments if isinstance(arguments, dict) else {}))
    if conv.tools:
        return Decision(answer=DONE)
    said = " ".join(conv.last_user.split())
    if len(said) > _ECHO_CHARS:
        said = said[:_ECHO_CHARS] + "..."
    return Decision(answer=f"Scripted model reply to: {said}" if said else "Scripted model reply.")


# ------------------------------------------------------------------------------------ fake tokens


def _render_item(item: dict[str, Any]) -> str:
    """One item as text for ``fake_token_ids``: a pure function of the item's content, ids ignored."""
    kind = item_type(item)
    if kind == "message":
        return f"<|{item.get('role', 'assistant')}|>{item_text(item)}\n"
    if kind == "function_call":
        return f"<|call|>{item.get('name', '')} {item.get('arguments', '')}\n"
    if kind == "function_call_output":
        return f"<|output|>{_output_text(item.get('output', ''))}\n"
    return f"<|{kind}|>\n"


def fake_token_ids(items: list[dict[str, Any]], instructions: Any = None) -> list[int]:
    """Deterministic stand-in token ids: the UTF-8 bytes of the items rendered one after another.

    Each item renders the same wherever it appears, so the next turn's prompt is always exactly
    this turn's prompt + generation + the tool outputs added in between: the rollouts of a
    multi-turn episode are contiguous by construction, as a real server's should be.
    """
    text = f"<|system|>{instructions}\n" if instructions else ""
    return list((text + "".join(_render_item(item) for item in items)).encode())


# ------------------------------------------------------------------------------------------ server


class ScriptedModel(ModelServer[Config]):
    """Serves the scripted policy on ``/v1/responses`` and ``/v1/chat/completions``."""

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.respond(body)

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(body.get("messages"), list):
            raise HTTPError(400, "messages must be a list of message objects", "invalid_request")
        response = await self.respond(chat_convert.chat_request_to_responses(body))
        return chat_convert.response_to_chat_completion(response)

    async def respond(self, body: dict[str, Any]) -> dict[str, Any]:
        """One model turn for a Responses create body, as a Responses object."""
        conv = Conversation.parse(body)
        decision = decide(conv, self.config, body.get("metadata"))
        delay_ms = self.config.latency_ms + decision.sleep_ms
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        if decision.error is not None:
            status, message = decision.error
            raise HTTPError(status, message, "scripted_error")
        if decision.call is not None:
            name, arguments = decision.call
            item = function_call_item(name, arguments)
            output_words = _words(f"{name} {item['arguments']}")
        else:
            text = decision.answer or ""
            item = message_item(text)
            output_words = _words(text)
        usage = {
            "input_tokens": conv.input_words,
            "output_tokens": output_words,
            "total_tokens": conv.input_words + output_words,
        }
        flag = body.get("return_token_ids")
        if flag if isinstance(flag, bool) else self.config.return_token_ids:
            generated = fake_token_ids([item])
            prompt = fake_token_ids(_checked_items(body), body.get("instructions"))
            semantics = logprob_semantics("scripted", body.get("temperature"), "none")
            attach_token_fields([item], prompt, generated, [0.0] * len(generated), semantics)
        echoed = {key: body.get(key, default) for key, default in ECHOED_RESPONSE_FIELDS.items()}
        return new_response(
            [item],
            self.config.model,
            usage,
            tools=body.get("tools") or [],
            error=None,
            incomplete_details=None,
            **echoed,
        )
