"""The serving scenario's server processes get the bench run's engine options."""

from __future__ import annotations

import os

import pytest

from onnxrank.bench.serving import engine_flags
from onnxrank.cli import build_parser
from onnxrank.cli.options import engine_overrides


def test_engine_flags_reach_the_serve_command_as_the_same_options(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("ONNXRANK_")]:
        monkeypatch.delenv(name)
    options = {"precision": "fp32", "max_batch_tokens": 2048, "sort_by_length": False,
               "max_length": 128}
    args = build_parser().parse_args(["serve", *engine_flags(options)])
    assert engine_overrides(args) == options
