"""Exceptions for the runtime phases. Bad arguments raise ValueError/TypeError instead."""

from __future__ import annotations


class RerankError(Exception):
    """Base class for onnxrank's runtime errors."""


class ModelLoadError(RerankError):
    """A model directory could not be loaded: missing or unreadable files, hash mismatch, bad tokenizer."""


class DeviceUnavailableError(ModelLoadError):
    """An explicitly requested execution provider (e.g. CUDA) is not available or did not attach."""


class InferenceError(RerankError):
    """Running the model failed or produced non-finite scores."""


class ExportError(RerankError):
    """Exporting a model failed: unreachable Hub, bad checkpoint, unwritable output, unsupported model."""


class FidelityError(ExportError):
    """An exported variant scored below its validation thresholds against the PyTorch reference."""


class RetrievalError(RerankError):
    """An index could not be built, opened or queried."""


class IndexMismatchError(RetrievalError):
    """An index was built with a different embedder (or settings) than the one used to query it."""


class MissingDependencyError(ImportError):
    """An optional dependency is not installed; the message names the extra to install."""
