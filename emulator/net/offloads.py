"""Checksum and segmentation offloads off on interfaces, from this process: ethtool's own ioctls in the interface's
namespace instead of one `ethtool -K` process per interface (512 of them were a fifth of a 512-GPU bring-up).

TCP over the userspace datapath stalls with offloads on (OVS forwards a packet whose checksum the sender's kernel
left to a NIC that is not there), so the hosts' NICs go without them, as `ethtool -K tx off rx off gso off tso off
gro off` leaves them: the features are found by name in the kernel's own list (ETHTOOL_GSTRINGS), as ethtool finds
them, so a segmentation offload a newer kernel adds (tx-tcp-accecn-segmentation) goes off too."""

from __future__ import annotations

import ctypes
import fcntl
import re
import socket
import struct

from traffic.netns import entered

SIOCETHTOOL = 0x8946
ETHTOOL_GSTRINGS, ETHTOOL_GSSET_INFO, ETHTOOL_SFEATURES = 0x1B, 0x37, 0x3B
ETH_SS_FEATURES = 4
NAME_LEN = 32
# tx: every transmit checksum; rx; gso; tso: every TCP segmentation; gro
OFF = re.compile(r"tx-checksum-.*|rx-checksum|tx-generic-segmentation|tx-tcp.*-segmentation|rx-gro")


def _ioctl(sock: socket.socket, name: str, buf: ctypes.Array) -> None:
    request = struct.pack("16sP", name.encode(), ctypes.addressof(buf)).ljust(40, b"\0")
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, request)


def _features(sock: socket.socket, name: str) -> list[str]:
    """The kernel's feature names, in bit order."""
    info = ctypes.create_string_buffer(struct.pack("IIQI", ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_FEATURES, 0))
    _ioctl(sock, name, info)
    count = struct.unpack_from("I", info, 16)[0]
    strings = ctypes.create_string_buffer(struct.pack("III", ETHTOOL_GSTRINGS, ETH_SS_FEATURES, count)
                                          + bytes(count * NAME_LEN))
    _ioctl(sock, name, strings)
    raw = strings.raw[12:12 + count * NAME_LEN]
    return [raw[i:i + NAME_LEN].split(b"\0")[0].decode() for i in range(0, len(raw), NAME_LEN)]


def offloads_off(interfaces: dict[str | None, list[str]]) -> None:
    """Every offload OFF names turned off on each interface, by namespace path (/proc/PID/ns/net; None: this
    one) -> its interfaces."""
    request = None
    for netns, names in interfaces.items():
        with entered(netns):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with sock:
            for name in names:
                if request is None:  # the same list for every device of a kernel: build the request once
                    bits = [i for i, feature in enumerate(_features(sock, name)) if OFF.fullmatch(feature)]
                    blocks = [0] * (max(bits) // 32 + 1)
                    for bit in bits:
                        blocks[bit // 32] |= 1 << (bit % 32)
                    request = struct.pack("II", ETHTOOL_SFEATURES, len(blocks)) + b"".join(
                        struct.pack("II", valid, 0) for valid in blocks)  # valid: these bits; requested: off
                _ioctl(sock, name, ctypes.create_string_buffer(request))
