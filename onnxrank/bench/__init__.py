"""`onnxrank bench`: workloads, baselines, interleaved measurement, budgets and the report."""

from __future__ import annotations
