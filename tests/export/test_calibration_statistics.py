"""NNCF's calibration passes reused across the OpenVINO int8 ladder's rungs, on the tiny reranker:
each rung's IR is the one nncf.quantize writes alone, and a rung on another graph collects
afresh."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest

from onnxrank.engine.runtime import open_model_file
from onnxrank.export.calibration_statistics import StatisticsReuse, model_fingerprint
from onnxrank.export.quantize_openvino import (
    OvInt8Settings,
    _kept_fp32,
    quantize_openvino_int8,
    weights_path,
)

pytestmark = pytest.mark.costly(20)

# the ladder's scopes on a 2-layer model: the head, then the top layer's feed-forward block too
WIDER = (OvInt8Settings(fp32_head=True),
         OvInt8Settings(fp32_head=True, fp32_ffn_up_layers=1, fp32_ffn_down_layers=1))


def _nncf_alone(fp32: Path, out: Path, settings: OvInt8Settings,
                calibration: list[dict[str, np.ndarray]]) -> None:
    """What quantize_openvino_int8 ran before the reuse: nncf.quantize itself."""
    import nncf
    import openvino
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix

    kept = _kept_fp32(fp32, settings, up=settings.fp32_ffn_up_layers,
                      down=settings.fp32_ffn_down_layers)
    model = nncf.quantize(
        openvino.Core().read_model(str(fp32)), nncf.Dataset(calibration),
        model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calibration),
        ignored_scope=nncf.IgnoredScope(patterns=[f"^{re.escape(name)}(/WithoutBiases)?$"
                                                  for name in kept]),
        advanced_parameters=AdvancedQuantizationParameters(overflow_fix=OverflowFix.ENABLE))
    openvino.save_model(model, str(out), compress_to_fp16=False)


def test_rungs_reuse_the_passes_and_write_what_nncf_quantize_writes(
        tiny_model_dir: Path, calibration: list, validation_batch: dict, tmp_path: Path) -> None:
    fp32 = tiny_model_dir / "model.onnx"
    statistics = StatisticsReuse()
    passes = []
    for index, settings in enumerate(WIDER):
        reused, alone = tmp_path / f"reused{index}.xml", tmp_path / f"alone{index}.xml"
        record = quantize_openvino_int8(fp32_path=fp32, out_path=reused, settings=settings,
                                        calibration=calibration, layers=2, statistics=statistics)
        passes.append(record["calibration"]["statistics_passes"])
        _nncf_alone(fp32, alone, settings, calibration)
        assert weights_path(reused).read_bytes() == weights_path(alone).read_bytes()
        scores = [open_model_file(path, backend="openvino", precision="int8", threads=1).run(validation_batch)
                  for path in (reused, alone)]
        np.testing.assert_array_equal(scores[0], scores[1])
    # SmoothQuant's pass on the graph, MinMax's and bias correction's on the smoothed graph
    assert passes == [{"collected": 2, "reused": 0}, {"collected": 0, "reused": 2}]


def test_another_graph_collects_its_own_passes(
        tiny_model_dir: Path, calibration: list, tmp_path: Path) -> None:
    fp32 = tiny_model_dir / "model.onnx"
    statistics = StatisticsReuse()
    quantize_openvino_int8(fp32_path=fp32, out_path=tmp_path / "plain.xml", settings=WIDER[0],
                           calibration=calibration, layers=2, statistics=statistics)
    # the outlier split rewrites the MatMuls' inputs under the same node names
    record = quantize_openvino_int8(
        fp32_path=fp32, out_path=tmp_path / "split.xml", calibration=calibration, layers=2,
        statistics=statistics,
        settings=OvInt8Settings(fp32_head=True, fp32_ffn_down_layers=2, outlier_channel_ratio=1.5))
    assert record["outlier_channels"]["channels_per_matmul"]
    assert record["calibration"]["statistics_passes"] == {"collected": 2, "reused": 0}


def test_no_calibration_items_is_refused_before_nncf_runs(tiny_model_dir: Path) -> None:
    import openvino

    model = openvino.Core().read_model(str(tiny_model_dir / "model.onnx"))
    with pytest.raises(ValueError, match=re.escape(
            "quantizing needs calibration items (one model input each); got none")):
        StatisticsReuse().quantize(model, [], model_type=None, ignored_scope=None,
                                   advanced_parameters=None)


def test_the_fingerprint_follows_the_weights_not_the_names(tiny_model_dir: Path) -> None:
    import openvino

    core = openvino.Core()
    first, second = (core.read_model(str(tiny_model_dir / "model.onnx")) for _ in range(2))
    assert model_fingerprint(first) == model_fingerprint(second)
    for op in second.get_ordered_ops():
        op.set_friendly_name(op.get_friendly_name() + "/renamed")
    assert model_fingerprint(first) == model_fingerprint(second)
    constant = next(op for op in second.get_ordered_ops()
                    if op.get_type_name() == "Constant" and op.get_data().dtype == np.float32
                    and op.get_data().size > 100)
    changed = openvino.opset13.constant(constant.get_data() + np.float32(0.5))
    constant.output(0).replace(changed.output(0))
    assert model_fingerprint(first) != model_fingerprint(second)


def test_nncf_logs_only_what_onnxrank_would(tiny_model_dir: Path, calibration: list,
                                            tmp_path: Path) -> None:
    """NNCF logs each node it leaves unquantized at INFO on its own stdout handler: an export
    shows them only when onnxrank's logger is at INFO (``--verbose``)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    nncf_logger, onnxrank_logger = logging.getLogger("nncf"), logging.getLogger("onnxrank")
    nncf_level, onnxrank_level = nncf_logger.level, onnxrank_logger.level
    nncf_logger.addHandler(handler)
    shown = []
    try:
        for level in (logging.WARNING, logging.INFO):
            onnxrank_logger.setLevel(level)
            records.clear()
            quantize_openvino_int8(fp32_path=tiny_model_dir / "model.onnx",
                                   out_path=tmp_path / "model_ov_int8.xml", settings=WIDER[0],
                                   calibration=calibration, layers=2)
            shown.append(sum(record.levelno == logging.INFO for record in records))
            assert nncf_logger.level == nncf_level  # put back
    finally:
        nncf_logger.removeHandler(handler)
        onnxrank_logger.setLevel(onnxrank_level)
    assert shown[0] == 0 and shown[1] > 0, shown
