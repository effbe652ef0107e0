from __future__ import annotations

import sys

from onnxrank.cli import main

sys.exit(main())
