"""Ryu's own example apps, for the tests that run them unchanged (test_custom_apps.py). They are not ours to
commit: taken at set-up time (.ci/setup runs this file) from Ryu 4.34's source distribution on PyPI, checked
against its published sha256, and kept in build/ryu-4.34/ (ignored by git)."""

from __future__ import annotations

import hashlib
import io
import re
import sys
import tarfile
from pathlib import Path
from urllib.request import urlopen

REPO = Path(__file__).resolve().parents[2]
INDEX = "https://pypi.org/simple/ryu/"
SHA256 = "a31041eb53aee0c36ca428645ad2607163ca5e1390f5a3d6ef2025b7829ce93e"
APPS = ("simple_switch_13.py", "simple_switch_stp_13.py")
DEST = REPO / "build" / "ryu-4.34"


def fetch() -> Path:
    """The directory holding the example apps, downloading them first if they are not there."""
    if all((DEST / app).is_file() for app in APPS):
        return DEST
    page = urlopen(INDEX, timeout=60).read().decode()
    found = re.search(r'href="([^"#]+/ryu-4\.34\.tar\.gz)#sha256=([0-9a-f]{64})"', page)
    if not found or found.group(2) != SHA256:
        raise RuntimeError(f"{INDEX} does not list ryu-4.34.tar.gz with sha256 {SHA256}")
    data = urlopen(found.group(1), timeout=120).read()
    if hashlib.sha256(data).hexdigest() != SHA256:
        raise RuntimeError("ryu-4.34.tar.gz does not match its sha256")
    DEST.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for app in APPS:
            member = archive.extractfile(f"ryu-4.34/ryu/app/{app}")
            assert member is not None
            (DEST / app).write_bytes(member.read())
    return DEST


if __name__ == "__main__":
    print(fetch())
    sys.exit(0)
