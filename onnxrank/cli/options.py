"""Flags and their environment twins, generated in one place.

Two kinds of twins, one meaning each:
1. Engine options (every EngineConfig field, plus ``--model`` and ``--models-dir``) mean the same
   in every command that loads a model, so their twins are global: ``ONNXRANK_DEVICE``,
   ``ONNXRANK_MAX_BATCH_TOKENS``, ``ONNXRANK_MODEL`` (the rerank model).
2. Every other flag belongs to its command: ``--out`` of `bench` is ``ONNXRANK_BENCH_OUT`` and
   ``--out`` of `export` is ``ONNXRANK_EXPORT_OUT``.
This module and the subcommands are the only code that reads os.environ. The flag-name rule
(``field_flag``, ``config_flags``) lives in onnxrank/options.py, where the library can import it
too; it is re-exported here for the commands.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Collection
from dataclasses import fields
from pathlib import Path
from typing import Any

from onnxrank.engine.config import EngineConfig
from onnxrank.engine.runtime import DEFAULT_MODELS_DIR, resolve_model_dir
from onnxrank.options import config_flags as config_flags
from onnxrank.options import field_flag
from onnxrank.rerankers.local import DEFAULT_LOCAL_MODEL

ENV_PREFIX = "ONNXRANK_"
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")
# the library's own default, never retyped here
DEFAULT_RERANK_MODEL = DEFAULT_LOCAL_MODEL
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


def add_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, command: str | None,
             flag: str, **kwargs: Any) -> argparse.Action:
    """Add `flag` with its environment twin as default and the twin's name in the help.

    Args:
        parser: The subcommand's parser, or one of its argument groups.
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


def add_config_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                       config_class: type, command: str | None, *,
                       exclude: Collection[str] = ()) -> None:
    """One flag per field of a config dataclass whose field metadata has help/kind/choices.

    Flags default to "unset", so `config_overrides` passes on only what the user chose and every
    default stays the dataclass's own (shown in the help).

    Args:
        exclude: Fields that get no flag (the command has its own flag of that name).
    """
    defaults = config_class()
    for spec in fields(config_class):
        if spec.name in exclude:
            continue
        meta = spec.metadata
        flag = field_flag(spec.name)
        help_text = f"{meta['help']}; default: {getattr(defaults, spec.name)}"
        if meta["kind"] is bool:
            add_flag(parser, command, flag, action=argparse.BooleanOptionalAction, default=UNSET,
                     help=help_text)
            continue
        kind = _optional_int if meta.get("optional") and meta["kind"] is int else meta["kind"]
        choices = meta.get("choices")
        add_flag(parser, command, flag, type=kind, choices=choices, default=UNSET,
                 help=help_text, metavar=None if choices else spec.name.upper())


def config_overrides(args: argparse.Namespace, config_class: type, *,
                     exclude: Collection[str] = ()) -> dict[str, Any]:
    """The fields of `config_class` that the user set through a flag or its twin.

    Args:
        exclude: Fields whose namesake in `args` is a flag of the command's own, as passed to
            `add_config_options`.
    """
    return {spec.name: getattr(args, spec.name) for spec in fields(config_class)
            if spec.name not in exclude and hasattr(args, spec.name)}


def add_engine_options(parser: argparse.ArgumentParser, *,
                       model_help: str = "rerank model: a name under --models-dir, or a model "
                                         "directory") -> None:
    """Add --model, --models-dir and one flag per EngineConfig field, with global twins."""
    group = parser.add_argument_group("engine options (same meaning in every command)")
    add_flag(group, None, "--model", default=DEFAULT_RERANK_MODEL, help=model_help)
    add_flag(group, None, "--models-dir", default=DEFAULT_MODELS_DIR,
             help="where model names are looked up")
    add_config_options(group, EngineConfig, None)


def engine_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The EngineConfig fields the user set through a flag or its twin."""
    return config_overrides(args, EngineConfig)


def load_reranker(args: argparse.Namespace, **fixed: Any) -> Any:
    """The Reranker named by --model / --models-dir with the engine options from `args`.

    Args:
        args: A namespace from a parser that has `add_engine_options`.
        **fixed: Options the command itself decides (they win over the user's).
    """
    from onnxrank.engine.reranker import Reranker

    options = {**engine_overrides(args), **fixed}
    return Reranker.from_pretrained(args.model, models_dir=args.models_dir, **options)


def locate_model(args: argparse.Namespace, name: str, *, task: str = "rerank") -> Path:
    """The model directory of `name` under --models-dir, exported as `task` on first use when
    it is a checkpoint directory or Hub id not yet exported, unless --no-export-on-first-use."""
    allowed = getattr(args, "export_on_first_use", EngineConfig().export_on_first_use)
    return resolve_model_dir(name, args.models_dir, export_task=task if allowed else None)
