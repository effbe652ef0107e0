"""The drop-in side by side with sentence-transformers' own CrossEncoder on the same checkpoint.

The same calls go to `sentence_transformers.CrossEncoder(checkpoint)` and to
`onnxrank.integrations.sentence_transformers.CrossEncoder(export of that checkpoint)` (fp32), and
the results must have the same types, dtypes, shapes and orders, with scores within 1e-4. The
default run uses the tiny fixture model; the slow run the full-size stand-in (models/minilm-standin
and its checkpoint/).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import sentence_transformers
import torch
from integration_fixtures import QUERY, TEXTS

from onnxrank.integrations.sentence_transformers import CrossEncoder

MODELS = Path(__file__).parents[2] / "models"
PAIRS = [(QUERY, text) for text in TEXTS] + [("heat conduction in composite slabs", text)
                                             for text in TEXTS]
ATOL = 1e-4


def assert_same_result(theirs: object, ours: object, what: str) -> None:
    assert type(ours) is type(theirs), f"{what}: {type(ours)} vs sentence-transformers {type(theirs)}"
    if isinstance(theirs, np.ndarray | np.floating):
        assert np.asarray(ours).dtype == np.asarray(theirs).dtype, what
        assert np.shape(ours) == np.shape(theirs), what
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL, err_msg=what)
    elif isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, what  # type: ignore[attr-defined]
        torch.testing.assert_close(ours, theirs, rtol=0, atol=ATOL, msg=what)
    elif isinstance(theirs, list):
        assert len(ours) == len(theirs), what  # type: ignore[arg-type]
        for index, (mine, reference) in enumerate(zip(ours, theirs)):  # type: ignore[call-overload]
            assert_same_result(reference, mine, f"{what}[{index}]")
    elif isinstance(theirs, dict):
        assert list(ours) == list(theirs), what  # type: ignore[call-overload]
        for key in theirs:
            assert_same_result(theirs[key], ours[key], f"{what}[{key!r}]")  # type: ignore[index]
    else:
        assert ours == theirs, what


def side_by_side(theirs: sentence_transformers.CrossEncoder, ours: CrossEncoder) -> None:
    calls = {
        "predict(pairs)": lambda model: model.predict(PAIRS),
        "predict(list of lists)": lambda model: model.predict([list(pair) for pair in PAIRS]),
        "predict(one pair)": lambda model: model.predict(PAIRS[1]),
        "predict([])": lambda model: model.predict([]),
        "predict(batch_size=4, show_progress_bar=False)":
            lambda model: model.predict(PAIRS, batch_size=4, show_progress_bar=False),
        "predict(activation_fn=Identity)":
            lambda model: model.predict(PAIRS, activation_fn=torch.nn.Identity()),
        "predict(activation_fn=Tanh)": lambda model: model.predict(PAIRS, activation_fn=torch.nn.Tanh()),
        "predict(apply_softmax=True)": lambda model: model.predict(PAIRS[:3], apply_softmax=True),
        "predict(convert_to_tensor=True)": lambda model: model.predict(PAIRS, convert_to_tensor=True),
        "predict(one pair, convert_to_tensor=True)":
            lambda model: model.predict(PAIRS[0], convert_to_tensor=True),
        "predict(convert_to_numpy=False)":
            lambda model: model.predict(PAIRS[:4], convert_to_numpy=False),
        "predict(sentences=...)": lambda model: model.predict(sentences=PAIRS[:2]),
        "rank": lambda model: model.rank(QUERY, TEXTS),
        "rank(top_k=3, return_documents=True)":
            lambda model: model.rank(QUERY, TEXTS, top_k=3, return_documents=True),
        "rank(activation_fn=Identity)":
            lambda model: model.rank(QUERY, TEXTS, activation_fn=torch.nn.Identity()),
        "rank([])": lambda model: model.rank(QUERY, []),
    }
    for what, call in calls.items():
        assert_same_result(call(theirs), call(ours), what)
    # the order itself, spelled out: the ranks' corpus ids agree exactly
    assert [hit["corpus_id"] for hit in ours.rank(QUERY, TEXTS)] == [
        hit["corpus_id"] for hit in theirs.rank(QUERY, TEXTS)]


def test_drop_in_matches_sentence_transformers_on_the_tiny_model(
    tiny_checkpoint_dir: Path, tiny_model_dir: Path
) -> None:
    theirs = sentence_transformers.CrossEncoder(str(tiny_checkpoint_dir), device="cpu")
    ours = CrossEncoder(tiny_model_dir, device="cpu", precision="fp32")
    side_by_side(theirs, ours)


@pytest.mark.slow
def test_drop_in_matches_sentence_transformers_on_the_full_size_standin() -> None:
    model_dir = MODELS / "minilm-standin"
    if not (model_dir / "checkpoint" / "config.json").is_file():
        pytest.fail(f"{model_dir} with its checkpoint/ is needed: run "
                    "`onnxrank export --model minilm-standin` first")
    theirs = sentence_transformers.CrossEncoder(str(model_dir / "checkpoint"), device="cpu")
    ours = CrossEncoder("minilm-standin", models_dir=MODELS, device="cpu", precision="fp32")
    side_by_side(theirs, ours)


def test_drop_in_errors(tiny_model_dir: Path) -> None:
    ours = CrossEncoder(tiny_model_dir, precision="fp32")
    assert ours.num_labels == 1 and ours.max_length > 0
    with pytest.raises(ValueError, match=re.escape("batch_size must be a positive integer, got 0.")):
        ours.predict(PAIRS, batch_size=0)
    with pytest.raises(TypeError, match=re.escape("predict() takes the pairs as `inputs` (or the "
                                                  "older `sentences`), exactly one of them")):
        ours.predict()
    with pytest.raises(TypeError, match="unknown engine options"):
        CrossEncoder(tiny_model_dir, trust_remote_code=True)


def test_numpy_activation_and_default_override(tiny_model_dir: Path) -> None:
    logits_model = CrossEncoder(tiny_model_dir, precision="fp32",
                                activation_fn=lambda logits: logits * 2.0)
    plain = CrossEncoder(tiny_model_dir, precision="fp32")
    doubled = logits_model.predict(PAIRS)
    raw = plain.predict(PAIRS, activation_fn=torch.nn.Identity())
    assert doubled.dtype == np.float32
    np.testing.assert_allclose(doubled, 2.0 * raw, rtol=1e-6)
