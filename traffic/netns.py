"""Enter another network namespace in this thread, so one process can open sockets in many emulated hosts (a
socket stays in the namespace it was created in). Python 3.11 has no os.setns: setns(2) through ctypes."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


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
