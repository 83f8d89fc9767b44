"""Enter another network namespace in this thread, so one process can open sockets in many emulated hosts (a
socket stays in the namespace it was created in). Python 3.11 has no os.setns: setns(2) through ctypes
(traffic.kernel)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from traffic.kernel import check, libc

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    check(libc.setns(fd, CLONE_NEWNET), "setns")


@contextmanager
def entered(path: str | None) -> Iterator[None]:
    """Inside the block this thread is in the network namespace at `path` (such as /proc/PID/ns/net); None
    stays where it is."""
    if path is None:
        yield
        return
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(path, os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(home)
