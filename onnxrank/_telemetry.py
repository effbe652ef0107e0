"""Opt out of the usage reporting of onnxrank's dependencies, unless the user decided otherwise.

onnxrank promises to make no outbound calls. Some dependencies report usage by default:
onnxruntime (1.29+ on Linux and macOS), NNCF (through openvino-telemetry) and Ray. Each opt-out
must be in the environment before that dependency initialises, so this runs when onnxrank is
imported: the one deliberate exception to "importing onnxrank has no side effects". A variable
the user has set is left as it is.
"""

from __future__ import annotations

import os

OPT_OUTS = {
    "ORT_DISABLE_TELEMETRY": "1",  # onnxruntime's 1DS telemetry: off before the runtime starts
    "NNCF_CI": "1",  # NNCF replaces its openvino-telemetry sender with a stub when this is set
    "RAY_USAGE_STATS_ENABLED": "0",  # Ray's usage-stats reporting
}


def opt_out_of_dependency_telemetry() -> None:
    """Set each opt-out variable that the user has not set."""
    for name, value in OPT_OUTS.items():
        os.environ.setdefault(name, value)
