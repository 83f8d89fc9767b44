"""The traffic agents. An agent process whose environment names a current mypyc build of the hot path
(BUILD_ENV, set by the runner: traffic.hotpath) finds that build's modules before their sources."""

import os as _os
import sys as _sys

BUILD_ENV = "MPFT_AGENT_BUILD"

if _os.environ.get(BUILD_ENV):
    __path__.insert(0, _os.path.join(_os.environ[BUILD_ENV], "traffic"))
    _sys.path.append(_os.environ[BUILD_ENV])  # the compiled group's shared library is a top-level module
