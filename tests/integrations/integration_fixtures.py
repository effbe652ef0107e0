"""Texts shared by the integration tests, and the independent score reference."""

from __future__ import annotations

import numpy as np

from onnxrank import Reranker

QUERY = "what similarity laws must be obeyed when constructing aeroelastic models"
TEXTS = [
    "experimental investigation of the aerodynamics of a wing in a slipstream .",
    "the theory of aeroelastic models of heated high speed aircraft and their similarity laws",
    "simple shear flow past a flat plate in an incompressible fluid of small viscosity .",
    "heat conduction in composite slabs",
    "the effect of ablation on the heat transfer to a blunt body in hypersonic flow",
    "boundary layer " * 300,
]


def sigmoid_scores(reranker: Reranker, query: str, texts: list[str]) -> np.ndarray:
    """The model's activation (sigmoid) of Reranker.score, computed here, not by the adapters."""
    logits = reranker.score([(query, text) for text in texts]).astype(np.float64)
    return 1.0 / (1.0 + np.exp(-logits))


def best_first(scores: np.ndarray) -> list[int]:
    """Indices by descending score, ties in input order."""
    return sorted(range(len(scores)), key=lambda index: (-scores[index], index))
