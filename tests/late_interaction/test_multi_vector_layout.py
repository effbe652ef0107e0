"""sentence-transformers 6's own save of a MultiVectorEncoder is its own layout (settings in the
Transformer's sentence_bert_config.json and the MultiVectorMask module, markers as prompts), read
into the same row settings as the PyLate files it was loaded from; a module stack the export
cannot reproduce is refused, naming what is wrong. (Its scores against MultiVectorEncoder are in
test_late_interaction.py, which runs every layout.)"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import transformers
from colbert_checkpoints import reference_model

from onnxrank.errors import ExportError
from onnxrank.export.colbert_checkpoint import read_layout, row_settings
from onnxrank.export.pipeline import EXPORT_ROUTES, ExportRequest, export_model
from onnxrank.export.request import ROUTED_TASKS

pytestmark = pytest.mark.costly(10)


def test_a_resaved_pylate_checkpoint_reads_the_same(bert_checkpoint_dir: Path,
                                                    tmp_path: Path) -> None:
    reference_model(bert_checkpoint_dir).save(str(tmp_path / "resaved"))
    assert not {"query_prefix", "query_length", "do_query_expansion"} & set(json.loads(
        (tmp_path / "resaved" / "config_sentence_transformers.json").read_text()))
    pylate, resaved = read_layout(bert_checkpoint_dir), read_layout(tmp_path / "resaved")
    assert (pylate.name, resaved.name) == ("pylate", "sentence_transformers")

    def settings(layout: Any, directory: Path) -> Any:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
        return row_settings(layout, tokenizer, 128, 16)

    assert settings(resaved, tmp_path / "resaved") == settings(pylate, bert_checkpoint_dir)
    for ours, theirs in zip(resaved.projections, pylate.projections, strict=True):
        np.testing.assert_array_equal(ours.weight, theirs.weight)


def test_the_manifest_records_the_layout(multi_vector_model_dir: Path) -> None:
    manifest = json.loads((multi_vector_model_dir / "manifest.json").read_text())
    vocabulary = json.loads((multi_vector_model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    settings = manifest["late_interaction"]
    assert manifest["task"] == "late_interaction"
    assert manifest["source"]["layout"] == "sentence_transformers"
    assert (settings["query_prefix_id"], settings["document_prefix_id"]) == (
        vocabulary["[unused0]"], vocabulary["[unused1]"])
    assert (settings["query_length"], settings["document_length"], settings["dim"]) == (16, 40, 16)
    assert settings["query_expansion"] and settings["attend_to_expansion_tokens"]


def test_routed_tasks_are_the_routes() -> None:
    assert set(ROUTED_TASKS) == set(EXPORT_ROUTES)


def _edit_json(name: str, edit: Callable[[Any], Any]) -> Callable[[Path], None]:
    def apply(directory: Path) -> None:
        path = directory / name
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    return apply


POOLING = "sentence_transformers.multi_vector_encoder.modules.token_pooling.HierarchicalTokenPooling"
UNSUPPORTED: dict[str, tuple[Callable[[Path], None], str]] = {
    "token pooling": (
        _edit_json("modules.json", lambda modules: [
            *modules[:3], {"idx": 3, "name": "3", "path": "3_Pool", "type": POOLING}, *modules[3:]]),
        f"'s modules.json has module '{POOLING}' (3_Pool); a late-interaction export reproduces "
        "Transformer, Dense..., MultiVectorMask and Normalize only"),
    "no normalize": (
        _edit_json("modules.json", lambda modules: modules[:3]),
        "'s modules.json has no Normalize module after its Dense modules; onnxrank's token "
        "vectors are L2-normalised"),
    "mean maxsim": (
        _edit_json("config_sentence_transformers.json",
                   lambda config: {**config, "similarity_fn_name": "meanmaxsim"}),
        "/config_sentence_transformers.json sets similarity_fn_name 'meanmaxsim'; onnxrank scores "
        "late interaction by MaxSim ('maxsim')"),
    "min expansion": (
        _edit_json("sentence_bert_config.json", lambda config: {
            **config, "query_expansion": {**config["query_expansion"], "strategy": "min"}}),
        "/sentence_bert_config.json sets query_expansion {'strategy': 'min', 'attend': True, "
        "'token': None, 'length': 16}; onnxrank expands queries to a fixed length: strategy "
        "'fixed', or null for none"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_an_unsupported_stack_is_refused(case: str, multi_vector_checkpoint_dir: Path,
                                         tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(multi_vector_checkpoint_dir, source)
    edit, message = UNSUPPORTED[case]
    edit(source)
    with pytest.raises(ExportError, match=re.escape(f"{source}{message}")):
        export_model(ExportRequest(model=str(source), out_dir=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_prompt_that_is_no_single_token_is_refused(multi_vector_checkpoint_dir: Path,
                                                     tmp_path: Path) -> None:
    """[unused0] in the vocabulary but not registered as a special token: sentence-transformers
    prepends the prompt as text, which the tokenizer splits into pieces."""
    source = tmp_path / "source"
    shutil.copytree(multi_vector_checkpoint_dir, source)
    _edit_json("tokenizer.json", lambda tokenizer: {**tokenizer, "added_tokens": [
        token for token in tokenizer["added_tokens"] if token["content"] != "[unused0]"]})(source)
    with pytest.raises(ExportError, match=re.escape(
            f"the query prefix prompt '[unused0]' of {source} does not tokenize as the one token "
            "'[unused0]' before the text ('[unused0]what is the lift of a wing?' gives ")):
        export_model(ExportRequest(model=str(source), out_dir=tmp_path / "out"))
