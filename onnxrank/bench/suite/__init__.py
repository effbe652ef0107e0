"""The pytest-benchmark scenarios of `onnxrank bench`, shipped with the package (run them with
`onnxrank bench`; see docs/benchmarks.md)."""

from __future__ import annotations
