"""Shipped data: validation pairs and stand-in head pairs (onnxrank/export/validation_data.py)."""

from __future__ import annotations
