"""The cascade backend: reranking as a list of stages, each keeping its top-n for the next.

A cheap stage sees every candidate and a costly one only the top of its list, e.g. late
interaction over 1,000 candidates with stored document vectors (onnxrank.rerankers.stored), then
the cross-encoder over its top 50. One latency budget covers the whole cascade: each stage gets
what the earlier ones left as its `deadline_ms` (the local engine then scores batch by batch
until it runs out), and a stage that starts with nothing left is skipped, so its candidates keep
the earlier stage's order.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from onnxrank.engine.ranking import RankedDocument
from onnxrank.engine.runtime import DEFAULT_MODELS_DIR
from onnxrank.rerankers.base import (
    DEFAULT_ON_ERROR,
    BackendRankedDocument,
    OnError,
    RerankBackend,
    check_rerank_arguments,
)

if TYPE_CHECKING:
    from onnxrank.engine.config import EngineConfig
    from onnxrank.rerankers.stored import StoredVectors

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CascadeStage:
    """One stage: a backend and how many of its best documents go on to the next stage.

    Attributes:
        backend: Any RerankBackend (local, stored late interaction, cohere...).
        keep: Documents passed to the next stage, e.g. 50; None passes all (the last stage's
            `keep` is ignored: the caller's top_k applies).
    """

    backend: RerankBackend
    keep: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.backend, RerankBackend):
            raise TypeError(f"a cascade stage needs a RerankBackend, got {type(self.backend).__name__}")
        if self.keep is not None and (isinstance(self.keep, bool) or not isinstance(self.keep, int)
                                      or self.keep < 1):
            raise ValueError(f"a cascade stage's keep must be a positive int or None, got {self.keep!r}")


@dataclass(frozen=True, slots=True)
class CascadeRankedDocument(BackendRankedDocument):
    """A document of the cascade's answer.

    Attributes:
        stage: Position of the last stage that scored it (its `score` and `backend` are that
            stage's); -1 when no stage did (``reranked=False``, retrieval order).
    """

    stage: int = -1


@dataclass(frozen=True, slots=True)
class StageRun:
    """What one stage did in one call.

    Attributes:
        backend: The stage's backend name.
        candidates: Documents it was given (0 when skipped).
        scored: Documents it scored (fewer than candidates when its deadline cut it short).
        ms: Wall time of the stage.
        skipped: True when the budget was spent before the stage started.
    """

    backend: str
    candidates: int
    scored: int
    ms: float
    skipped: bool = False


@dataclass(frozen=True, slots=True)
class CascadeResult:
    """The ranked documents and, per stage, what it did."""

    documents: list[RankedDocument]
    stages: tuple[StageRun, ...]


class CascadeReranker:
    """Reranks through a list of stages under one latency budget.

    Stage i reranks what stage i-1 kept (the first stage: every document) and keeps its best
    `keep`. The answer lists the last stage's order, then each earlier stage's documents that
    did not go on, in that stage's order, then unscored documents in input order.

    Args:
        stages: The stages, cheapest first.
        budget_ms: Time budget of one call across all stages, e.g. 200; None: no budget (a
            caller's `deadline_ms` still applies; the smaller of the two wins).

    Example:
        >>> cascade = CascadeReranker([CascadeStage(late, keep=50), CascadeStage(cross)],
        ...                           budget_ms=200)  # doctest: +SKIP
        >>> cascade.rerank("wing flutter", candidates, top_k=10)[0].backend  # doctest: +SKIP
        'local'
    """

    name = "cascade"

    def __init__(self, stages: Sequence[CascadeStage], *, budget_ms: float | None = None) -> None:
        if not stages:
            raise ValueError("a cascade needs at least one stage, got none")
        for index, stage in enumerate(stages):
            if not isinstance(stage, CascadeStage):
                raise TypeError(f"stages[{index}] must be a CascadeStage, got {type(stage).__name__}")
        if budget_ms is not None and (isinstance(budget_ms, bool) or not budget_ms >= 0):
            raise ValueError(f"budget_ms must be >= 0 or None, got {budget_ms!r}")
        self.stages = tuple(stages)
        self.budget_ms = budget_ms

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_k: int | None = None,
        deadline_ms: float | None = None,
    ) -> list[RankedDocument]:
        """Documents best first (see the class); `deadline_ms` caps the budget for this call.

        Raises:
            ValueError, TypeError: Bad arguments.
            BackendUnavailableError: A stage built with ``on_error="raise"`` could not rerank.
        """
        return self.rerank_detailed(query, documents, top_k=top_k, deadline_ms=deadline_ms).documents

    def rerank_detailed(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_k: int | None = None,
        deadline_ms: float | None = None,
    ) -> CascadeResult:
        """`rerank` plus what each stage did (candidates, scored, time, skipped).

        Raises:
            As for rerank.
        """
        documents = check_rerank_arguments(query, documents, top_k, deadline_ms)
        budgets = [budget for budget in (self.budget_ms, deadline_ms) if budget is not None]
        ends_at = time.perf_counter() + min(budgets) / 1000 if budgets else math.inf
        # `current`: the documents (input indices) the next stage sees, best first; `passed_over`
        # collects, stage by stage, those an earlier stage scored but did not pass on.
        current = list(range(len(documents)))
        scored_by: dict[int, CascadeRankedDocument] = {}
        passed_over: list[list[int]] = []
        runs: list[StageRun] = []
        for position, stage in enumerate(self.stages):
            left_ms = (ends_at - time.perf_counter()) * 1000
            if not current or left_ms <= 0:
                runs.append(StageRun(stage.backend.name, 0, 0, 0.0, skipped=bool(current)))
                continue
            started = time.perf_counter()
            ranked = stage.backend.rerank(
                query, [documents[index] for index in current],
                deadline_ms=None if math.isinf(left_ms) else left_ms,
            )
            ms = (time.perf_counter() - started) * 1000
            order = [current[item.index] for item in ranked if item.reranked]
            unscored = [current[item.index] for item in ranked if not item.reranked]
            for item in ranked:
                if item.reranked:
                    scored_by[current[item.index]] = CascadeRankedDocument(
                        index=current[item.index], score=item.score, text=item.text, span=item.span,
                        backend=getattr(item, "backend", stage.backend.name), stage=position)
            runs.append(StageRun(stage.backend.name, len(current), len(order), ms))
            # A stage cut short by its deadline passes on only what it scored; the rest keep
            # the earlier order, after what it passed over.
            keep = len(order) if stage.keep is None or position == len(self.stages) - 1 else stage.keep
            passed_over.append(order[keep:] + unscored)
            current = order[:keep]
        final = current + [index for group in reversed(passed_over) for index in group]
        answer: list[RankedDocument] = [
            scored_by.get(index) or CascadeRankedDocument(
                index=index, score=math.nan, text=documents[index], reranked=False, backend=self.name)
            for index in final
        ]
        return CascadeResult(answer if top_k is None else answer[:top_k], tuple(runs))


def parse_stages(text: str) -> list[tuple[str, int | None]]:
    """(model, keep) of each stage of a ``--cascade`` value: comma-separated ``MODEL[:KEEP]``,
    e.g. "colbert-small:50,minilm-standin" (late interaction keeps its best 50 for the
    cross-encoder).

    Raises:
        ValueError: An empty stage or model, or a KEEP that is not a positive integer.
    """
    stages: list[tuple[str, int | None]] = []
    for part in text.split(","):
        model, colon, keep = part.strip().rpartition(":")
        if not colon:
            model, keep = keep, ""
        if not model:
            raise ValueError(f"--cascade needs MODEL[:KEEP] stages separated by commas, got {text!r}")
        if keep and not (keep.isdigit() and int(keep) > 0):
            raise ValueError(f"a cascade stage's KEEP must be a positive integer, got {keep!r} in "
                             f"{text!r}")
        stages.append((model, int(keep) if keep else None))
    return stages


def build_cascade(
    stages: Sequence[tuple[str | Path, int | None]],
    *,
    models_dir: str | Path = DEFAULT_MODELS_DIR,
    config: EngineConfig | None = None,
    document_vectors: StoredVectors | None = None,
    budget_ms: float | None = None,
    on_error: OnError = DEFAULT_ON_ERROR,
) -> CascadeReranker:
    """A cascade of local models, loaded now; each stage is chosen by its model's kind.

    1. A late-interaction model: StoredVectorReranker, reading `document_vectors` when they were
       stored with this model (else it encodes the documents).
    2. Any other model: LocalReranker.

    Args:
        stages: (model name under `models_dir` or directory, keep) per stage (parse_stages).
        models_dir: Where model names are looked up.
        config: Engine settings of every stage; None uses the defaults.
        document_vectors: An index's stored vectors (open_document_vectors).
        budget_ms: The cascade's budget (CascadeReranker).
        on_error: Each stage's "fallback" or "raise".

    Raises:
        ModelLoadError: A model cannot be loaded.
    """
    from onnxrank.engine.late_interaction import LateInteractionReranker
    from onnxrank.engine.reranker import Reranker
    from onnxrank.rerankers.local import LocalReranker
    from onnxrank.rerankers.stored import StoredVectorReranker

    built = []
    for model_name, keep in stages:
        model = Reranker.from_pretrained(model_name, models_dir=models_dir, config=config)
        backend: RerankBackend
        if isinstance(model, LateInteractionReranker):
            vectors = document_vectors
            if vectors is not None and vectors.record.manifest_hash != model.spec.manifest_hash():
                logger.warning("the index stores document vectors of %s, not of %s; that stage "
                               "encodes its documents", vectors.record.name, model.spec.name)
                vectors = None
            backend = StoredVectorReranker(model, vectors, on_error=on_error)
        else:
            backend = LocalReranker(model, on_error=on_error)
        built.append(CascadeStage(backend, keep))
    return CascadeReranker(built, budget_ms=budget_ms)
