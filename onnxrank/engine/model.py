"""The base of every model kind: a loaded manifest, its runner and its row encoder.

A kind is a subclass that says which manifests it runs (`kind`, a ModelKind), how its items
become rows (`row_encoder`), what the runtime probe times (`probe_items`) and what it checks once
loaded (`_checked`). Loading is shared: `from_dir` reads the manifest, picks the kind's class once
from ``ModelSpec.kind`` in `KINDS`, and loads the files through onnxrank.engine.runtime.

`KINDS` is filled by the kind classes themselves: a class that declares its own `kind` records
itself when it is defined (`EngineModel.__init_subclass__`). The package face
(onnxrank/engine/__init__.py) imports every kind's module, and importing any module of the
package runs it first, so the table is complete before any `from_dir` reads it; this module
imports no kind, and no import runs back up to it.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Generic, TypeVar, cast

from tokenizers import Tokenizer

from onnxrank.engine.backends.base import DeviceInfo, ModelRunner
from onnxrank.engine.batching import padding_multiple, plan_engine_batches
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.execution import FiniteCheck, RowPlan
from onnxrank.engine.recipe import PromptRecipe
from onnxrank.engine.rows import EncodedRow, RowEncoder
from onnxrank.engine.runtime import (
    DEFAULT_MODELS_DIR,
    LoadedModel,
    load_model,
    resolve_model_dir,
)
from onnxrank.engine.spec import ModelKind, ModelSpec, kind_task, load_model_spec
from onnxrank.errors import ModelLoadError

Item = TypeVar("Item")
Model = TypeVar("Model", bound="EngineModel[Any]")

# ModelKind -> the class that runs it, one each; written only by EngineModel.__init_subclass__
_KIND_CLASSES: dict[ModelKind, type[EngineModel[Any]]] = {}
KINDS: Mapping[ModelKind, type[EngineModel[Any]]] = MappingProxyType(_KIND_CLASSES)


class EngineModel(ABC, Generic[Item]):
    """A loaded model of one kind; its items (pairs or texts) become rows through its encoder.

    Attributes:
        spec: The manifest.
        model_dir: The model directory.
        config: The engine settings it runs with.
    """

    # the manifests this class runs; None on a base that runs none itself
    kind: ClassVar[ModelKind | None] = None
    # what loading a manifest of another kind says this class needs
    needs: ClassVar[str] = "an exported model"
    # how a non-finite output is named: what an output is and what an input item is
    output_noun: ClassVar[str] = "output"
    item_noun: ClassVar[str] = "item"

    def __init__(self, spec: ModelSpec, model_dir: Path, runner: ModelRunner,
                 encoder: RowEncoder[Item], tokenizer: Tokenizer, config: EngineConfig) -> None:
        self.spec = spec
        self.model_dir = model_dir
        self.config = config
        self._runner = runner
        self._encoder = encoder
        self._tokenizer = tokenizer
        self._finite = FiniteCheck(runner.info.model_file, self.output_noun, self.item_noun)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Record a class that declares its own `kind` as the one that runs that kind; a
        subclass that keeps (or repeats) its parent's kind is a user's variant, not recorded.

        Raises:
            TypeError: Another class, not a base of this one, already runs its kind.
        """
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if kind is None:
            return
        known = _KIND_CLASSES.setdefault(kind, cls)
        if not issubclass(cls, known):
            raise TypeError(f"{cls.__module__}.{cls.__qualname__} declares kind={kind.name}, which "
                            f"{known.__module__}.{known.__qualname__} runs already; a model kind "
                            "is run by one class")

    @classmethod
    def from_dir(cls: type[Model], path: str | Path, config: EngineConfig | None = None,
                 **overrides: Any) -> Model:
        """Load an exported model directory (see onnxrank.engine.spec) as the class of the kind
        its manifest names (this class or one below it), and build its runtime.

        Args:
            path: Directory written by `onnxrank export`.
            config: Engine settings; None = EngineConfig() defaults.
            **overrides: EngineConfig fields to change, e.g. ``device="cpu", threads=2``
                (see onnxrank.engine.config for every option, its default and range).

        Returns:
            The loaded model, e.g. a Reranker (a DecoderReranker for a decoder reranker's
            manifest) or an Embedder.

        Raises:
            ModelLoadError: Missing/unreadable files, manifest hash mismatch, a tokenizer that
                does not match the model, or a model of a kind this class does not run.
            DeviceUnavailableError: device="cuda" without a working CUDA provider.
            ValueError: A setting is out of range, or the requested backend or precision cannot
                run here (the message names what can), or a setting the kind refuses (see the
                kind's class).
            TypeError: An override is not an EngineConfig field.
        """
        started = time.perf_counter()
        config = (config or EngineConfig()).with_overrides(**overrides)
        model_dir = Path(path)
        spec = load_model_spec(model_dir)
        kind = KINDS.get(spec.kind)
        if kind is not None and issubclass(cls, kind) and cls.kind is spec.kind:
            kind = cls  # a user's subclass of the kind's class runs as itself
        if kind is None or not issubclass(kind, cls):
            raise ModelLoadError(f"{model_dir} holds a {spec.task!r} model, but this needs "
                                 f"{cls.needs}")
        loaded = load_model(spec, model_dir, config=config, probe_rows=kind.probe_rows,
                            started=started)
        return cast(Model, kind._checked(loaded, config))

    @classmethod
    def from_pretrained(cls: type[Model], name: str | Path, *,
                        models_dir: str | Path = DEFAULT_MODELS_DIR,
                        config: EngineConfig | None = None, **overrides: Any) -> Model:
        """Load ``models_dir/name`` (or `name` itself when it is a model directory).

        A Hugging Face checkpoint directory or Hub id that is not exported yet is exported once
        into the user cache and loaded from there (``export_on_first_use``, on by default; see
        onnxrank.engine.first_use).

        Raises:
            ModelLoadError: Neither location holds a model directory and nothing was exported;
                else as from_dir.
            MissingDependencyError: A first-use export needs the ``export`` extra.
            ExportError: A first-use export failed (FidelityError: the fp32 gate).
        """
        config = (config or EngineConfig()).with_overrides(**overrides)
        return cls.from_dir(cls.locate(name, models_dir=models_dir, config=config), config)

    @classmethod
    def locate(cls, name: str | Path, *, models_dir: str | Path = DEFAULT_MODELS_DIR,
               config: EngineConfig) -> Path:
        """The model directory `from_pretrained` loads for `name`: ``models_dir/name``, `name`
        itself, or (``config.export_on_first_use``) a not yet exported checkpoint's export in
        the user cache, exported now.

        Raises:
            ModelLoadError, MissingDependencyError, ExportError: As for from_pretrained.
        """
        export_task = kind_task(cls.kind) if config.export_on_first_use and cls.kind else None
        return resolve_model_dir(name, models_dir, export_task=export_task)

    @classmethod
    @abstractmethod
    def _checked(cls: type[Model], loaded: LoadedModel, config: EngineConfig) -> Model:
        """The model built from what was loaded, after the kind's own checks of its settings."""

    @classmethod
    @abstractmethod
    def row_encoder(cls, tokenizer: Tokenizer, max_length: int,
                    recipe: PromptRecipe | None) -> RowEncoder[Item]:
        """The encoder that turns this kind's items into rows of at most `max_length` tokens."""

    @classmethod
    @abstractmethod
    def probe_items(cls) -> list[Item]:
        """The items the runtime probe times candidates on (from runtime.probe_pairs)."""

    @classmethod
    def probe_rows(cls, spec: ModelSpec, tokenizer: Tokenizer, tokens: int) -> list[EncodedRow]:
        """The probe's rows: `probe_items` with about `tokens` tokens of item text."""
        length = min(tokens, spec.max_length)
        return cls.row_encoder(tokenizer, length, spec.recipe).encode(cls.probe_items())

    @property
    def device_info(self) -> DeviceInfo:
        """The backend, provider, variant file, runtime version and threads actually running."""
        return self._runner.info

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (truncation and padding off); do not change its settings."""
        return self._tokenizer

    @property
    def padding_multiple(self) -> int:
        """What this model's batches are padded to a multiple of (the settings' pad_to_multiple,
        else the one its load measured on this machine: onnxrank.engine.batching)."""
        return padding_multiple(self.config, self._runner)

    @property
    def max_length(self) -> int:
        """Tokens per row this model runs (a reranker's settings may lower the manifest's)."""
        return self._encoder.max_length

    def _plan(self, rows: Sequence[EncodedRow], *, sort_by_length: bool = True) -> RowPlan:
        """Rows cut into batches with the engine's settings and the runner's per-run charge."""
        batches = plan_engine_batches([len(row.ids) for row in rows], self.config, self._runner,
                                      sort_by_length=sort_by_length)
        return RowPlan(rows, batches, self.spec.pad_token_id)

