"""Offline batch scoring of (query, document) files: resumable local runs and Ray Data scale-out."""

from __future__ import annotations

from onnxrank.scoring.job import ScoreSummary, score_file

__all__ = ["ScoreSummary", "score_file"]
