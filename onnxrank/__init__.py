"""onnxrank: fast, honest cross-encoder reranking on ONNX Runtime."""

from __future__ import annotations

from onnxrank._telemetry import opt_out_of_dependency_telemetry

opt_out_of_dependency_telemetry()  # before any dependency initialises (see onnxrank/_telemetry.py)

from onnxrank.engine.ranking import RankedDocument  # noqa: E402
from onnxrank.engine.reranker import Reranker  # noqa: E402
from onnxrank.retrieval.hybrid import HybridRetriever  # noqa: E402
from onnxrank.types import Device  # noqa: E402

__version__ = "0.1.0"

__all__ = ["Device", "HybridRetriever", "RankedDocument", "Reranker", "__version__"]
