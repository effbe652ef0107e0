"""NNCF post-training quantization that collects each calibration statistic once per ladder.

The OpenVINO int8 ladder quantizes one graph several times, each rung with a wider ignored
scope. ``nncf.quantize`` collects its statistics afresh on every call: one pass over the
calibration rows for SmoothQuant on the graph, one for MinMax and bias correction on the smoothed
graph (about 16 s each on the stand-in, 2 cores). A wider ignored scope changes neither the model
a pass runs (SmoothQuant smooths every MatMul whatever the scope) nor what a collector measures at
a point; it only drops points. `StatisticsReuse.quantize` runs NNCF's own pipeline step by step,
as ``nncf.quantize`` runs it for an OpenVINO model, and gives a step the aggregators an earlier call
collected when the model entering the step is the same graph (`model_fingerprint`) and each
collector the step asks for was collected there at the same point with the same reducers and
aggregators. Otherwise the step collects, as ``nncf.quantize`` would. The quantized weights are
the same bytes (tests/export/test_calibration_statistics.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from onnxrank._optional import require

# (fingerprint of the model entering a step, step index, target point) -> collected collectors
_PointKey = tuple[str, int, str, str, int]


def model_fingerprint(model: Any) -> str:
    """A digest of an ``openvino.Model``'s graph: each op's type and attributes, where its
    inputs come from, and every constant's bytes (node names left out: NNCF numbers the nodes it
    inserts afresh on every call)."""
    ops = model.get_ordered_ops()
    position = {op.get_instance_id(): index for index, op in enumerate(ops)}
    digest = hashlib.sha256()
    for op in ops:
        digest.update(f"{op.get_type_name()}{sorted(op.get_attributes().items())!r}".encode())
        for port in op.inputs():
            source = port.get_source_output()
            digest.update(f"<{position[source.get_node().get_instance_id()]}:{source.get_index()}"
                          .encode())
        if op.get_type_name() == "Constant":
            data = op.get_data()
            digest.update(f"{data.dtype}{data.shape}".encode())
            digest.update(np.ascontiguousarray(data).tobytes())
    return digest.hexdigest()


def _collectors(points: Any) -> Iterator[tuple[Any, Any]]:
    """(statistic point, tensor collector) for every collector of a StatisticPointsContainer."""
    for statistic_points in points.values():
        for point in statistic_points:
            for collectors in point.algorithm_to_tensor_collectors.values():
                for collector in collectors:
                    yield point, collector


class StatisticsReuse:
    """Calibration statistics of one calibration set, kept across ``quantize`` calls.

    One instance serves one ladder: every call must pass the same calibration items.

    Attributes:
        passes: The last call's statistics passes: ``collected`` (run over the calibration
            items) and ``reused`` (from an earlier call).
    """

    def __init__(self) -> None:
        self._collected: dict[_PointKey, list[Any]] = {}
        self.passes = {"collected": 0, "reused": 0}

    def quantize(self, model: Any, calibration: Sequence[dict[str, np.ndarray]], *,
                 model_type: Any, ignored_scope: Any, advanced_parameters: Any) -> Any:
        """``nncf.quantize`` of an ``openvino.Model`` on every item of `calibration`, reusing the
        statistics of earlier calls where they apply.

        Raises:
            ValueError: No calibration items.
            MissingDependencyError: nncf (extra ``export``) is missing.
        """
        if not calibration:
            raise ValueError("quantizing needs calibration items (one model input each); got none")
        nncf = require("nncf", extra="export")
        from nncf.common.factory import build_graph
        from nncf.openvino.graph.model_utils import remove_friendly_name_duplicates
        from nncf.openvino.graph.node_utils import get_number_if_op
        from nncf.openvino.quantization.backend_parameters import is_weight_compression_needed
        from nncf.openvino.rt_info import dump_parameters
        from nncf.quantization.advanced_parameters import convert_to_dict_recursively
        from nncf.quantization.algorithms.pipeline import collect_statistics
        from nncf.quantization.algorithms.post_training.pipeline import create_ptq_pipeline
        from openvino._offline_transformations import compress_quantize_weights_transformation

        self.passes = {"collected": 0, "reused": 0}
        dataset = nncf.Dataset(list(calibration))
        options = {"subset_size": len(calibration), "model_type": model_type,
                   "ignored_scope": ignored_scope, "advanced_parameters": advanced_parameters}
        model = remove_friendly_name_duplicates(model)
        pipeline = create_ptq_pipeline(**options)
        if get_number_if_op(model) > 0:  # NNCF quantizes If bodies its own way, every pass anew
            self.passes["collected"] = len(pipeline.pipeline_steps)
            return nncf.quantize(model, dataset, **options)
        for index in range(len(pipeline.pipeline_steps)):
            graph = build_graph(model)
            points = pipeline.get_statistic_points_for_step(index, model, graph)
            fingerprint = model_fingerprint(model)
            if next(_collectors(points), None) is None:
                pass  # nothing to measure: no pass over the items
            elif self._reuse(fingerprint, index, points):
                self.passes["reused"] += 1
            else:
                points = collect_statistics(points, model, graph, dataset)
                self._keep(fingerprint, index, points)
                self.passes["collected"] += 1
            model = pipeline.run_step(index, points, model, graph)
        if is_weight_compression_needed(advanced_parameters):
            compress_quantize_weights_transformation(model)
        # the record nncf.quantize leaves in the IR's rt_info
        dump_parameters(model, {
            "preset": None, "target_device": nncf.TargetDevice.ANY.value,
            "subset_size": len(calibration), "fast_bias_correction": True,
            "model_type": model_type, "ignored_scope": ignored_scope,
            "advanced_parameters": convert_to_dict_recursively(advanced_parameters)})
        return model

    def _reuse(self, fingerprint: str, index: int, points: Any) -> bool:
        """Give every collector of `points` the aggregators collected at its point before;
        False (nothing given) when one has none."""
        found = []
        for point, collector in _collectors(points):
            keys = set(collector.aggregators)
            match = next((old for old in self._collected.get(_key(fingerprint, index, point), [])
                          if set(old.aggregators) == keys), None)
            if match is None:
                return False
            found.append((collector, match))
        for collector, match in found:
            for key, aggregator in match.aggregators.items():
                collector.replace_aggregator(key, aggregator)
            collector.disable()  # collected: nothing more may be registered into them
        return True

    def _keep(self, fingerprint: str, index: int, points: Any) -> None:
        for point, collector in _collectors(points):
            self._collected.setdefault(_key(fingerprint, index, point), []).append(collector)


def _key(fingerprint: str, index: int, point: Any) -> _PointKey:
    target = point.target_point
    return (fingerprint, index, str(target.type), target.target_node_name, target.port_id)

