"""Adapters to other libraries' reranker interfaces.

Each lives in its own module and imports its framework when the module is imported, so importing
this package costs nothing:

* ``onnxrank.integrations.langchain``: OnnxRankRerank (a BaseDocumentCompressor) and
  OnnxRankCrossEncoder (a BaseCrossEncoder for LangChain's CrossEncoderReranker); extra ``langchain``.
* ``onnxrank.integrations.llamaindex``: OnnxRankRerank (a BaseNodePostprocessor); extra ``llamaindex``.
* ``onnxrank.integrations.sentence_transformers``: CrossEncoder, a drop-in for
  sentence-transformers' ``CrossEncoder.predict`` / ``rank``; no extra.
"""

from __future__ import annotations
