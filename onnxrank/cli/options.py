"""Flags and their environment twins, generated in one place.

Two kinds of twins, one meaning each:
1. Engine options (every EngineConfig field, plus ``--model`` and ``--models-dir``) mean the same
   in every command that loads a model, so their twins are global: ``ONNXRANK_DEVICE``,
   ``ONNXRANK_MAX_BATCH_TOKENS``, ``ONNXRANK_MODEL`` (the rerank model).
2. Every other flag belongs to its command: ``--out`` of `bench` is ``ONNXRANK_BENCH_OUT`` and
   ``--out`` of `export` is ``ONNXRANK_EXPORT_OUT``.
This module and the subcommands are the only code that reads os.environ.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import fields
from typing import Any

from onnxrank.engine.config import EngineConfig, option_metadata

ENV_PREFIX = "ONNXRANK_"
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")
DEFAULT_RERANK_MODEL = "minilm-standin"
DEFAULT_MODELS_DIR = "models"
# options the user did not set stay out of the namespace, so library defaults apply
UNSET = argparse.SUPPRESS


def parse_bool(text: str) -> bool:
    """The one boolean parser for environment twins: 1/true/yes/on or 0/false/no/off/empty.

    Raises:
        ValueError: Any other text.
    """
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(
        f"expected a boolean ({'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS[:-1])}), got {text!r}"
    )


def env_name(command: str | None, flag: str) -> str:
    """The environment twin of a flag: ONNXRANK_[COMMAND_]FLAG."""
    scope = f"{command.upper()}_" if command else ""
    return ENV_PREFIX + scope + flag.lstrip("-").upper().replace("-", "_")


def add_flag(parser: argparse.ArgumentParser, command: str | None, flag: str,
             **kwargs: Any) -> argparse.Action:
    """Add `flag` with its environment twin as default and the twin's name in the help.

    Args:
        parser: The subcommand's parser.
        command: The subcommand whose twin this is (None: a global engine option).
        flag: The long flag, e.g. "--port".
        **kwargs: argparse.add_argument arguments. With ``required=True`` the flag is required
            only when its twin is unset.

    Raises:
        ValueError: The twin is set to a value the flag's type or choices reject.
    """
    name = env_name(command, flag)
    raw = os.environ.get(name)
    if raw is not None:
        kwargs["default"] = _env_value(name, raw, kwargs)
        kwargs["required"] = False
    help_text = kwargs.pop("help", "")
    kwargs["help"] = f"{help_text} (env {name})" if help_text else f"(env {name})"
    return parser.add_argument(flag, **kwargs)


def _env_value(name: str, raw: str, kwargs: dict[str, Any]) -> Any:
    action = kwargs.get("action")
    try:
        if action in ("store_true", "store_false") or action is argparse.BooleanOptionalAction:
            return parse_bool(raw)
        kind = kwargs.get("type")
        value = kind(raw) if kind is not None else raw
    except (TypeError, ValueError) as err:
        raise ValueError(f"environment variable {name}={raw!r} is not valid: {err}") from err
    choices = kwargs.get("choices")
    if choices is not None and value not in choices:
        raise ValueError(
            f"environment variable {name}={raw!r} must be one of {', '.join(map(str, choices))}"
        )
    return value


def _optional_int(text: str) -> int | None:
    return None if text.strip().lower() in ("", "none", "auto") else int(text)


def add_engine_options(parser: argparse.ArgumentParser, *,
                       model_help: str = "rerank model: a name under --models-dir, or a model "
                                         "directory") -> None:
    """Add --model, --models-dir and one flag per EngineConfig field, with global twins.

    Engine flags default to "unset", so `engine_overrides` passes on only what the user chose
    and every default stays the library's own.
    """
    group = parser.add_argument_group("engine options (same meaning in every command)")
    add_flag(group, None, "--model", default=DEFAULT_RERANK_MODEL, help=model_help)
    add_flag(group, None, "--models-dir", default=DEFAULT_MODELS_DIR,
             help="where model names are looked up")
    defaults = EngineConfig()
    for spec in fields(EngineConfig):
        meta = option_metadata(spec.name)
        flag = "--" + spec.name.replace("_", "-")
        default = getattr(defaults, spec.name)
        help_text = f"{meta['help']}; default: {default}"
        if meta["kind"] is bool:
            add_flag(group, None, flag, action=argparse.BooleanOptionalAction, default=UNSET,
                     help=help_text)
            continue
        kind = meta["kind"]
        if meta["optional"]:
            kind = _optional_int
        add_flag(group, None, flag, type=kind, choices=meta["choices"], default=UNSET,
                 help=help_text, metavar=None if meta["choices"] else spec.name.upper())


def engine_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The EngineConfig fields the user set through a flag or its twin."""
    return {spec.name: getattr(args, spec.name) for spec in fields(EngineConfig)
            if hasattr(args, spec.name)}


def load_reranker(args: argparse.Namespace, **fixed: Any) -> Any:
    """The Reranker named by --model / --models-dir with the engine options from `args`.

    Args:
        args: A namespace from a parser that has `add_engine_options`.
        **fixed: Options the command itself decides (they win over the user's).
    """
    from onnxrank.engine.reranker import Reranker

    options = {**engine_overrides(args), **fixed}
    return Reranker.from_pretrained(args.model, models_dir=args.models_dir, **options)
