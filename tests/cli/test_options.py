"""Flags and environment twins generated from the option definitions."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import fields

import pytest

from onnxrank.cli import build_parser
from onnxrank.cli.options import (
    add_engine_options,
    add_flag,
    engine_overrides,
    env_name,
    parse_bool,
)
from onnxrank.engine.config import EngineConfig
from onnxrank.options import config_flags


def engine_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="test", exit_on_error=False)
    add_engine_options(parser)
    return parser


def test_every_engine_option_has_one_flag_and_one_global_twin() -> None:
    help_text = " ".join(engine_parser().format_help().split())  # undo line wrapping
    for spec in fields(EngineConfig):
        flag = "--" + spec.name.replace("_", "-")
        assert flag in help_text
        assert f"(env ONNXRANK_{spec.name.upper()})" in help_text
    assert "(env ONNXRANK_MODEL)" in help_text and "(env ONNXRANK_MODELS_DIR)" in help_text


def test_only_what_the_user_set_overrides_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    assert engine_overrides(engine_parser().parse_args([])) == {}
    args = engine_parser().parse_args(["--max-batch-tokens", "4096", "--no-sort-by-length",
                                       "--threads", "none"])
    assert engine_overrides(args) == {"max_batch_tokens": 4096, "sort_by_length": False,
                                      "threads": None}
    monkeypatch.setenv("ONNXRANK_MAX_BATCH_TOKENS", "2048")
    monkeypatch.setenv("ONNXRANK_SORT_BY_LENGTH", "off")
    monkeypatch.setenv("ONNXRANK_DEVICE", "cpu")
    assert engine_overrides(engine_parser().parse_args([])) == {
        "max_batch_tokens": 2048, "sort_by_length": False, "device": "cpu"}
    # the flag wins over its twin
    args = engine_parser().parse_args(["--max-batch-tokens", "1024"])
    assert engine_overrides(args)["max_batch_tokens"] == 1024


def test_bad_twin_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONNXRANK_MAX_BATCH_TOKENS", "lots")
    with pytest.raises(ValueError, match=re.escape(
        "environment variable ONNXRANK_MAX_BATCH_TOKENS='lots' is not valid: invalid literal "
    )):
        engine_parser()
    monkeypatch.setenv("ONNXRANK_MAX_BATCH_TOKENS", "8")
    monkeypatch.setenv("ONNXRANK_BACKEND", "tensorrt")
    with pytest.raises(ValueError, match=re.escape(
        "environment variable ONNXRANK_BACKEND='tensorrt' must be one of auto, onnxruntime, "
        "openvino"
    )):
        engine_parser()


def test_one_boolean_parser() -> None:
    for word in ("1", "true", "YES", " on "):
        assert parse_bool(word) is True
    for word in ("0", "false", "No", "off", ""):
        assert parse_bool(word) is False
    with pytest.raises(ValueError, match=re.escape(
        "expected a boolean (1/true/yes/on or 0/false/no/off), got 'maybe'")):
        parse_bool("maybe")


def test_command_twins_are_scoped(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_name("bench", "--out") == "ONNXRANK_BENCH_OUT"
    assert env_name(None, "--max-batch-tokens") == "ONNXRANK_MAX_BATCH_TOKENS"
    parser = argparse.ArgumentParser(prog="test")
    add_flag(parser, "bench", "--out", required=True, help="report directory")
    assert "report directory (env ONNXRANK_BENCH_OUT)" in parser.format_help()
    monkeypatch.setenv("ONNXRANK_BENCH_OUT", "reports")
    parser = argparse.ArgumentParser(prog="test")
    add_flag(parser, "bench", "--out", required=True)
    assert parser.parse_args([]).out == "reports"  # the twin satisfies `required`


def test_config_flags_are_read_back_as_the_same_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    # The bench starts `onnxrank serve` subprocesses with its engine options this way, through
    # onnxrank.options, which the library imports without the CLI.
    for name in [name for name in os.environ if name.startswith("ONNXRANK_")]:
        monkeypatch.delenv(name)
    options = {"precision": "fp32", "max_batch_tokens": 2048, "sort_by_length": False,
               "max_length": 128}
    args = build_parser().parse_args(["serve", *config_flags(options)])
    assert engine_overrides(args) == options
    assert config_flags({"sort_by_length": True}) == ["--sort-by-length"]
