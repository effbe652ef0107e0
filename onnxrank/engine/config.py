"""Every engine option, defined once: default, allowed values and help text.

`Reranker.from_dir(path, config=None, **overrides)` builds an EngineConfig from these fields, and
the CLI generates one flag and one ``ONNXRANK_*`` environment twin per field from the same
metadata (onnxrank.cli.options), so a default is never typed twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from onnxrank.types import Device

Backend = Literal["auto", "onnxruntime", "openvino"]
Precision = Literal["auto", "fp32", "opt", "int8", "fp16", "bf16", "int8+bf16"]
LongDocuments = Literal["truncate", "max_chunk"]

BACKENDS: tuple[str, ...] = ("auto", "onnxruntime", "openvino")
PRECISIONS: tuple[str, ...] = ("auto", "fp32", "opt", "int8", "fp16", "bf16", "int8+bf16")
DEVICES: tuple[str, ...] = tuple(device.value for device in Device)
LONG_DOCUMENTS: tuple[str, ...] = ("truncate", "max_chunk")


def _option(help: str, *, kind: type, choices: tuple[str, ...] | None = None,
            minimum: int | None = None, optional: bool = False) -> dict[str, Any]:
    """Field metadata read by EngineConfig's checks and by the CLI generator."""
    return {"help": help, "kind": kind, "choices": choices, "minimum": minimum,
            "optional": optional}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Every engine setting, built once by Reranker.from_dir and passed down.

    Each field's metadata carries its help text, type, allowed values or minimum; see the field
    definitions for the worked numbers.
    """

    device: str = field(default=Device.AUTO.value, metadata=_option(
        "where inference runs: cpu, cuda, or auto (CUDA when a working CUDA provider exists)",
        kind=str, choices=DEVICES))
    backend: Backend = field(default="auto", metadata=_option(
        "CPU runtime: onnxruntime (CPU execution provider), openvino (OpenVINO runtime, extra "
        "'openvino'), or auto (the fastest validated variant on this machine, probed once and "
        "cached)", kind=str, choices=BACKENDS))
    precision: Precision = field(default="auto", metadata=_option(
        "variant to run: fp32, opt (fused fp32), int8, fp16 (CUDA), bf16 (OpenVINO on CPUs with "
        "BF16), int8+bf16 (OpenVINO's int8 file with the rest in bf16, CPUs with BF16), or auto "
        "(the fastest variant that passed the export's fidelity gate)",
        kind=str, choices=PRECISIONS))
    threads: int | None = field(default=None, metadata=_option(
        "intra-op threads; default: the CPUs this process may use (affinity and cgroup quota)",
        kind=int, minimum=1, optional=True))
    max_batch_tokens: int = field(default=8192, metadata=_option(
        "padded tokens per model run (rows x padded length): 8192 holds 16 pairs of 512 tokens "
        "or 85 pairs of 96 tokens (then capped by max_batch_size)", kind=int, minimum=1))
    max_batch_size: int = field(default=64, metadata=_option(
        "rows per model run, whatever their length", kind=int, minimum=1))
    max_length: int | None = field(default=None, metadata=_option(
        "tokens per (query, document) row; default and upper bound: the manifest's max_length",
        kind=int, minimum=8, optional=True))
    sort_by_length: bool = field(default=True, metadata=_option(
        "sort rows by length before cutting batches (about 1 percent padding instead of padding "
        "each batch to its longest row in input order)",
        kind=bool))
    pad_to_multiple: int | None = field(default=None, metadata=_option(
        "round each batch's padded length up to a multiple of this (8: 61 tokens run as 64); "
        "default: the multiple at which the running variant's scores do not move with their "
        "batch mates on this machine, measured once at load and cached (the batch check)",
        kind=int, minimum=1, optional=True))
    long_documents: LongDocuments = field(default="truncate", metadata=_option(
        "truncate: score the first window of a long document; max_chunk: score every window "
        "and keep the best (its character span is returned)", kind=str, choices=LONG_DOCUMENTS))
    window_tokens: int | None = field(default=None, metadata=_option(
        "document tokens per window with long_documents=max_chunk; default: what the query "
        "leaves free in max_length", kind=int, minimum=8, optional=True))
    window_overlap_tokens: int = field(default=64, metadata=_option(
        "tokens shared by consecutive windows with long_documents=max_chunk", kind=int,
        minimum=0))
    instruction: str | None = field(default=None, metadata=_option(
        "decoder rerankers (exported with --recipe): the task instruction in the prompt, e.g. "
        "'Given a web search query, retrieve relevant passages that answer the query'; default: "
        "the recipe's; a per-call instruction overrides it; cross-encoders take none",
        kind=str, optional=True))
    prefix_reuse: bool = field(default=True, metadata=_option(
        "decoder rerankers: run the prompt head a query's rows share (recipe prefix, instruction, "
        "query) once per query through the export's prefix graph, when the variant that runs has "
        "one that passed its gate (the manifest's prefix_graphs); off: every row runs whole, "
        "the reference path", kind=bool))
    cache_size: int = field(default=0, metadata=_option(
        "entries of the LRU score cache keyed by model, settings, query and document; 0 = off",
        kind=int, minimum=0))
    compile_cache: bool = field(default=True, metadata=_option(
        "keep OpenVINO's compiled models in compile_cache_dir, so that the next process loads "
        "one instead of compiling it again", kind=bool))
    export_on_first_use: bool = field(default=True, metadata=_option(
        "a model given by name that is a Hugging Face checkpoint directory or Hub id and not "
        "exported yet is exported once (as `onnxrank export` would, minutes; needs the export "
        "extra) into models/ in the user cache directory, and loaded from there afterwards",
        kind=bool))
    compile_cache_dir: str | None = field(default=None, metadata=_option(
        "directory of the compiled-model cache; default: openvino/ in the user cache directory "
        "($XDG_CACHE_HOME/onnxrank, else ~/.cache/onnxrank)", kind=str, optional=True))

    def __post_init__(self) -> None:
        if isinstance(self.device, Device):  # Device.CPU and "cpu" are the same setting
            object.__setattr__(self, "device", self.device.value)
        for spec in fields(self):
            check_option(spec.name, getattr(self, spec.name))

    def with_overrides(self, **overrides: Any) -> EngineConfig:
        """A copy with some fields replaced.

        Raises:
            TypeError: An override names no EngineConfig field.
            ValueError: A value is out of range.
        """
        unknown = sorted(set(overrides) - set(option_names()))
        if unknown:
            raise TypeError(
                f"unknown engine options {unknown}; allowed: {', '.join(option_names())}"
            )
        return replace(self, **overrides)


def option_names() -> tuple[str, ...]:
    """The EngineConfig field names, in definition order."""
    return tuple(spec.name for spec in fields(EngineConfig))


def option_metadata(name: str) -> dict[str, Any]:
    """The metadata (help, kind, choices, minimum, optional) of one EngineConfig field."""
    for spec in fields(EngineConfig):
        if spec.name == name:
            return dict(spec.metadata)
    raise KeyError(name)


def check_option(name: str, value: Any) -> None:
    """Check one option value against its field's metadata.

    Raises:
        ValueError: Wrong type, not one of the choices, or below the minimum.
    """
    meta = option_metadata(name)
    if value is None and meta["optional"]:
        return
    if isinstance(value, Device):
        value = value.value
    kind = meta["kind"]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{name} must be an int{' or None' if meta['optional'] else ''}, "
                         f"got {value!r}")
    if kind is bool and not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    if meta["choices"] is not None and value not in meta["choices"]:
        raise ValueError(
            f"{name} must be one of {', '.join(repr(c) for c in meta['choices'])}, got {value!r}"
        )
    if meta["minimum"] is not None and value < meta["minimum"]:
        raise ValueError(f"{name} must be >= {meta['minimum']}, got {value!r}")
