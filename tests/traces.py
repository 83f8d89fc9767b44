"""Where the shared real trace files are: $MPFT_TRACES, else ../shared/traces beside the repository, else the
team machine's /work/shared/traces (a clean clone elsewhere still finds them). Tests skip with the reason when
none is there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_CANDIDATES = [os.environ.get("MPFT_TRACES"), Path(__file__).resolve().parents[1].parent / "shared" / "traces",
               "/work/shared/traces"]
TRACES = next((Path(c) for c in _CANDIDATES if c and Path(c).is_dir()), Path("../shared/traces"))
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="real trace files not found (set MPFT_TRACES)")
