"""The GPU path's scripts live in benchmarks/gpu (not a package): put that folder on sys.path."""

import sys
from pathlib import Path

GPU_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
if str(GPU_DIR) not in sys.path:
    sys.path.insert(0, str(GPU_DIR))
