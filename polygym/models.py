"""What a model server is written with, beyond ``polygym.ModelServer``: ``polygym.models``.

An environment or an agent needs only what ``polygym`` exports. A model server is different: it
is the adapter between polygym's wire (OpenAI Responses) and an upstream that speaks another
dialect, over a network that fails in ways the rest of the stack must be told about by class.
So the pieces it is written with are the converters and the transport's vocabulary, which
environments never see:

- ``chat`` and ``messages``: the Responses <-> Chat Completions and <-> Anthropic Messages
  converters (modules), and the few ``chat`` names servers use bare (``item_type``, the
  echoed-field names);
- token capture (``polygym.token_fields``): the field names, ``attach_token_fields`` to write
  one call's fields, ``strip_token_fields`` before a history goes
  upstream, ``logprob_semantics``;
- ``relay`` and ``upstream_failure``: forward a request upstream and turn what went wrong into an
  ``HTTPError`` carrying its failure class; ``failure``: those classes (module); ``budget``: the
  retry budget and deadline the call chain shares (module); ``Reply``, ``TRANSIENT_STATUSES``;
- ``redact_text``: secrets masked in anything logged or returned from an upstream;
- token-in/token-out continuation for training (``parent_ids``, ``check_prefix``, ...), and the
  local model's weights (``ensure_weights``);
- for a scripted policy: ``example_arguments`` (tool arguments valid by a tool's JSON Schema) and
  ``validation_message`` (a pydantic error as ``field: problem``, for a 400 that says what to fix).

Shipped model servers (``responses_api_models/*``) import from ``polygym`` and from here only; an
import-linter contract holds them to it. Everything named here is re-exported from its home
module, which stays the one place it is defined.
"""

from __future__ import annotations

from polygym.dialects import chat, messages
from polygym.dialects.chat import ECHOED_RESPONSE_FIELDS, item_type
from polygym.json_schema import example_arguments
from polygym.net import budget, failure
from polygym.net.client import Reply
from polygym.net.retry import TRANSIENT_STATUSES
from polygym.redact import redact_text
from polygym.servers.base import validation_message
from polygym.servers.model import Probe, relay, upstream_failure
from polygym.token_fields import (
    LOGPROB_SEMANTICS_FIELD,
    POLICY_VERSION_FIELD,
    PREFIX_FIELD,
    PROMPT_CONTINUATION_FIELD,
    TRAINING_TOKEN_FIELDS,
    attach_token_fields,
    logprob_semantics,
    strip_token_fields,
)
from polygym.training.continuation import (
    Continuation,
    NoCleanSuffix,
    check_prefix,
    join,
    parent_ids,
    probe_messages,
    suffix_text,
)
from polygym.weights import KNOWN_MODELS, WeightsError, ensure_weights

__all__ = [
    "ECHOED_RESPONSE_FIELDS",
    "KNOWN_MODELS",
    "LOGPROB_SEMANTICS_FIELD",
    "POLICY_VERSION_FIELD",
    "PREFIX_FIELD",
    "PROMPT_CONTINUATION_FIELD",
    "TRAINING_TOKEN_FIELDS",
    "TRANSIENT_STATUSES",
    "Continuation",
    "NoCleanSuffix",
    "Probe",
    "Reply",
    "WeightsError",
    "attach_token_fields",
    "budget",
    "chat",
    "check_prefix",
    "ensure_weights",
    "example_arguments",
    "failure",
    "item_type",
    "join",
    "logprob_semantics",
    "messages",
    "parent_ids",
    "probe_messages",
    "redact_text",
    "relay",
    "strip_token_fields",
    "suffix_text",
    "upstream_failure",
    "validation_message",
]
