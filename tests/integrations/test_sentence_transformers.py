"""The drop-in side by side with sentence-transformers 6's own CrossEncoder on the same checkpoint.

The same calls (positional as well as keyword, the older argument names 6.x still takes, prompts,
and the errors) go to `sentence_transformers.CrossEncoder(checkpoint)` and to
`onnxrank.integrations.sentence_transformers.CrossEncoder(export of that checkpoint)` (fp32), and
the results must have the same types, dtypes, shapes and orders, with scores within 1e-4. The
default run uses the tiny fixture model (also saved by sentence-transformers with an Identity
activation, against the export with the manifest activation "none"); the slow run the full-size
stand-in (models/minilm-standin and its checkpoint/).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
import sentence_transformers
import torch
from integration_fixtures import QUERY, TEXTS

from onnxrank.engine.spec import MANIFEST_NAME, Activation, load_model_spec, write_manifest
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
    elif isinstance(theirs, float):  # rank's scores: Python floats in sentence-transformers 6
        assert abs(ours - theirs) <= ATOL, what  # type: ignore[operator]
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
        "predict(tuple of pairs)": lambda model: model.predict(tuple(PAIRS)),
        "predict(2-d str array)": lambda model: model.predict(np.array(PAIRS[:3])),
        "predict(1-d str array)": lambda model: model.predict(np.array(PAIRS[2])),
        "predict(one pair)": lambda model: model.predict(PAIRS[1]),
        "predict([])": lambda model: model.predict([]),
        "predict(batch_size=4, show_progress_bar=False)":
            lambda model: model.predict(PAIRS, batch_size=4, show_progress_bar=False),
        # sentence-transformers 6's positional order: inputs, prompt_name, prompt, batch_size,
        # show_progress_bar, activation_fn, apply_softmax, convert_to_numpy, convert_to_tensor
        "predict(positional, up to activation_fn=Identity)":
            lambda model: model.predict(PAIRS, None, None, 4, False, torch.nn.Identity()),
        "predict(positional, up to convert_to_tensor=True)":
            lambda model: model.predict(PAIRS, None, None, 32, False, None, False, True, True),
        "predict(activation_fn=Identity)":
            lambda model: model.predict(PAIRS, activation_fn=torch.nn.Identity()),
        "predict(activation_fn=Tanh)": lambda model: model.predict(PAIRS, activation_fn=torch.nn.Tanh()),
        "predict(activation_fct=Identity), the older name":
            lambda model: model.predict(PAIRS, activation_fct=torch.nn.Identity()),
        # 6.x: the softmax applies only to scores that keep a label axis: none on one label
        "predict(apply_softmax=True)": lambda model: model.predict(PAIRS[:3], apply_softmax=True),
        "predict(convert_to_tensor=True)": lambda model: model.predict(PAIRS, convert_to_tensor=True),
        "predict(one pair, convert_to_tensor=True)":
            lambda model: model.predict(PAIRS[0], convert_to_tensor=True),
        "predict([], convert_to_tensor=True)": lambda model: model.predict([], convert_to_tensor=True),
        "predict(convert_to_numpy=False)":
            lambda model: model.predict(PAIRS[:4], convert_to_numpy=False),
        "predict(one pair, convert_to_numpy=False)":
            lambda model: model.predict(PAIRS[0], convert_to_numpy=False),
        "predict([], convert_to_numpy=False)": lambda model: model.predict([], convert_to_numpy=False),
        "predict(sentences=...)": lambda model: model.predict(sentences=PAIRS[:2]),
        "predict(prompt=...)": lambda model: model.predict(PAIRS, prompt="query: "),
        "predict(device='cpu')": lambda model: model.predict(PAIRS[:3], device="cpu"),
        "predict(num_workers=2), ignored": lambda model: model.predict(PAIRS[:3], num_workers=2),
        "rank": lambda model: model.rank(QUERY, TEXTS),
        "rank(top_k=3, return_documents=True)":
            lambda model: model.rank(QUERY, TEXTS, top_k=3, return_documents=True),
        "rank(positional top_k, return_documents)": lambda model: model.rank(QUERY, TEXTS, 2, True),
        "rank(top_k=0)": lambda model: model.rank(QUERY, TEXTS, top_k=0),
        "rank(activation_fn=Identity)":
            lambda model: model.rank(QUERY, TEXTS, activation_fn=torch.nn.Identity()),
        "rank(activation_fn=Tanh)": lambda model: model.rank(QUERY, TEXTS, activation_fn=torch.nn.Tanh()),
        "rank(prompt=...)": lambda model: model.rank(QUERY, TEXTS, prompt="query: "),
        "rank(batch_size=2, show_progress_bar=False, device='cpu')":
            lambda model: model.rank(QUERY, TEXTS, batch_size=2, show_progress_bar=False, device="cpu"),
        # the older arguments 6.x drops from rank (its scores are always Python floats)
        "rank(convert_to_tensor=True, convert_to_numpy=False, apply_softmax=True), ignored":
            lambda model: model.rank(QUERY, TEXTS, convert_to_tensor=True, convert_to_numpy=False,
                                     apply_softmax=True),
        "rank([])": lambda model: model.rank(QUERY, []),
    }
    for what, call in calls.items():
        assert_same_result(call(theirs), call(ours), what)
    # the order itself, spelled out: the ranks' corpus ids agree exactly, scores are Python floats
    ranked = ours.rank(QUERY, TEXTS)
    assert [hit["corpus_id"] for hit in ranked] == [hit["corpus_id"] for hit in theirs.rank(QUERY, TEXTS)]
    assert all(type(hit["score"]) is float for hit in ranked)
    # the same errors, same type and message
    errors = {
        "predict(batch_size=0)": lambda model: model.predict(PAIRS, batch_size=0),
        "predict(prompt_name unknown)": lambda model: model.predict(PAIRS, prompt_name="nope"),
    }
    for what, call in errors.items():
        try:
            call(theirs)
        except Exception as error:  # whatever sentence-transformers raises
            expected = error
        else:
            pytest.fail(f"{what}: sentence-transformers raised nothing")
        with pytest.raises(type(expected), match=re.escape(str(expected))):
            call(ours)


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


def test_prompts_match_sentence_transformers(tiny_checkpoint_dir: Path, tiny_model_dir: Path) -> None:
    """The constructor's prompts and default_prompt_name, and predict/rank's prompt_name and
    prompt, go before each query as in sentence-transformers 6."""
    prompts = {"search": "search query: ", "question": "question: ", "none": ""}
    theirs = sentence_transformers.CrossEncoder(str(tiny_checkpoint_dir), device="cpu", prompts=prompts,
                                                default_prompt_name="search")
    ours = CrossEncoder(tiny_model_dir, device="cpu", precision="fp32", prompts=prompts,
                        default_prompt_name="search")
    calls = {
        "predict (the default prompt)": lambda model: model.predict(PAIRS),
        "predict(prompt_name='question')": lambda model: model.predict(PAIRS, prompt_name="question"),
        "predict(prompt_name='none')": lambda model: model.predict(PAIRS, prompt_name="none"),
        "predict(prompt='')": lambda model: model.predict(PAIRS, prompt=""),
        "predict(prompt=..., prompt_name=...): prompt wins":
            lambda model: model.predict(PAIRS[:3], prompt="q: ", prompt_name="question"),
        "predict(positional prompt_name)": lambda model: model.predict(PAIRS[0], "question"),
        "rank (the default prompt)": lambda model: model.rank(QUERY, TEXTS),
        "rank(prompt_name='question')": lambda model: model.rank(QUERY, TEXTS, prompt_name="question"),
    }
    for what, call in calls.items():
        assert_same_result(call(theirs), call(ours), what)
    # the prompt changes the scores (the calls above compare something)
    assert not np.allclose(ours.predict(PAIRS), ours.predict(PAIRS, prompt=""), atol=ATOL)
    # an unknown default prompt name: the same error
    with pytest.raises(ValueError) as their_error:
        sentence_transformers.CrossEncoder(str(tiny_checkpoint_dir), device="cpu", prompts=prompts,
                                           default_prompt_name="passage")
    with pytest.raises(ValueError, match=re.escape(str(their_error.value))):
        CrossEncoder(tiny_model_dir, precision="fp32", prompts=prompts, default_prompt_name="passage")


def _with_activation(model_dir: Path, activation: Activation, out_dir: Path) -> Path:
    """`model_dir` with its manifest's activation replaced (the other files linked, not copied)."""
    out_dir.mkdir()
    for path in model_dir.iterdir():
        if path.name != MANIFEST_NAME:
            (out_dir / path.name).symlink_to(path)
    write_manifest(dataclasses.replace(load_model_spec(model_dir), activation=activation), out_dir)
    return out_dir


def test_the_default_activation_is_the_models_own(
    tiny_checkpoint_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """sentence-transformers 6 reads the default activation from the checkpoint's
    config_sentence_transformers.json; the drop-in reads the manifest's. A checkpoint saved with
    Identity (raw logits) against the export whose manifest carries it ("none"): the same logits,
    by default, in every call."""
    checkpoint = tmp_path / "identity-checkpoint"
    sentence_transformers.CrossEncoder(str(tiny_checkpoint_dir), device="cpu",
                                       activation_fn=torch.nn.Identity()).save(
        str(checkpoint), create_model_card=False)
    stored = json.loads((checkpoint / "config_sentence_transformers.json").read_text(encoding="utf-8"))
    assert stored["activation_fn"] == "torch.nn.modules.linear.Identity"
    theirs = sentence_transformers.CrossEncoder(str(checkpoint), device="cpu")
    assert isinstance(theirs.activation_fn, torch.nn.Identity)
    ours = CrossEncoder(_with_activation(tiny_model_dir, "none", tmp_path / "identity-model"),
                        device="cpu", precision="fp32")
    side_by_side(theirs, ours)
    # an explicit activation_fn still wins over the model's, in the constructor too
    sigmoid = CrossEncoder(tmp_path / "identity-model", device="cpu", precision="fp32",
                           activation_fn=torch.nn.Sigmoid())
    assert_same_result(sentence_transformers.CrossEncoder(str(checkpoint), device="cpu",
                                                          activation_fn=torch.nn.Sigmoid()).predict(PAIRS),
                       sigmoid.predict(PAIRS), "CrossEncoder(activation_fn=Sigmoid) over a stored Identity")


def test_drop_in_errors(tiny_model_dir: Path) -> None:
    ours = CrossEncoder(tiny_model_dir, device="cpu", precision="fp32")
    assert ours.num_labels == 1 and ours.max_seq_length == 512
    with pytest.warns(DeprecationWarning, match="`max_length` property was renamed"):
        assert ours.max_length == ours.max_seq_length
    assert CrossEncoder(tiny_model_dir, precision="fp32", max_length=128).max_seq_length == 128
    with pytest.raises(ValueError, match=re.escape("batch_size must be a positive integer, got 0.")):
        ours.predict(PAIRS, batch_size=0)
    with pytest.raises(TypeError, match=re.escape("predict() takes the pairs as `inputs` (or the "
                                                  "older `sentences`), exactly one of them")):
        ours.predict()
    with pytest.raises(TypeError, match=re.escape("exactly one of them")):
        ours.predict(PAIRS, sentences=PAIRS)
    with pytest.raises(TypeError, match="unknown engine options"):
        CrossEncoder(tiny_model_dir, trust_remote_code=True)
    with pytest.raises(TypeError, match=re.escape(
            "predict() got unexpected keyword arguments ['processing_kwargs']: sentence-transformers "
            "hands them to its model's preprocess/forward")):
        ours.predict(PAIRS, processing_kwargs={"text": {"max_length": 16}})
    with pytest.raises(TypeError, match=re.escape("rank() got unexpected keyword arguments ['foo']")):
        ours.rank(QUERY, TEXTS, foo=1)
    with pytest.raises(ValueError, match=re.escape(
            "this model was loaded on cpu and an onnxrank model cannot move: load it with "
            "CrossEncoder(..., device='cuda:0')")):
        ours.predict(PAIRS, device="cuda:0")
    with pytest.raises(ValueError, match=re.escape("multi-process inference (a device list or pool=) "
                                                   "is not supported")):
        ours.rank(QUERY, TEXTS, device=["cpu", "cpu"])
    with pytest.raises(ValueError, match=re.escape("multi-process inference")):
        ours.predict(PAIRS, pool={"processes": []})
    # the older constructor name of activation_fn
    older = CrossEncoder(tiny_model_dir, device="cpu", precision="fp32",
                         default_activation_function=torch.nn.Identity())
    np.testing.assert_allclose(older.predict(PAIRS), ours.predict(PAIRS, activation_fn=torch.nn.Identity()),
                               rtol=0, atol=0)


def test_numpy_activation_and_default_override(tiny_model_dir: Path) -> None:
    logits_model = CrossEncoder(tiny_model_dir, precision="fp32",
                                activation_fn=lambda logits: logits * 2.0)
    plain = CrossEncoder(tiny_model_dir, precision="fp32")
    doubled = logits_model.predict(PAIRS)
    raw = plain.predict(PAIRS, activation_fn=torch.nn.Identity())
    assert doubled.dtype == np.float32
    np.testing.assert_allclose(doubled, 2.0 * raw, rtol=1e-6)
