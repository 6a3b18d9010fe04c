"""UDP datagrams with a forged source address, on loopback: what an attacker sends when it
wants a datagram to look like another peer's (docs/security.md).

A raw IPv4 socket (``IP_HDRINCL``) writes the IP and UDP headers itself, so the kernel
delivers the datagram to the destination's socket with whatever source it names. That needs
``CAP_NET_RAW``; without it :func:`raw_spoofing` is False and a test hands the datagram to the
receiving endpoint itself, with the forged source, which is what the socket would have done.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import struct

__all__ = ["raw_spoofing", "send_spoofed"]

_UDP = 17


@functools.cache
def raw_spoofing() -> bool:
    """Whether this process may send datagrams with a forged source (a raw socket)."""
    try:
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW).close()
    except OSError:
        return False
    return True


def send_spoofed(payload: bytes, source: tuple[str, int], dest: tuple[str, int]) -> None:
    """Send ``payload`` to ``dest`` as a UDP datagram from ``source`` (IPv4 loopback only:
    tests talk to nothing else)."""
    src, dst = ipaddress.IPv4Address(source[0]), ipaddress.IPv4Address(dest[0])
    if not (src.is_loopback and dst.is_loopback):
        raise ValueError("spoofed datagrams go from loopback to loopback only")
    udp_len = 8 + len(payload)
    # UDP checksum 0: none (RFC 768), which IPv4 allows. The kernel fills in the IP header's
    # checksum, and its id and total length where they are 0.
    udp = struct.pack("!HHHH", source[1], dest[1], udp_len, 0)
    ip = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, 0, 0, 64, _UDP, 0, src.packed, dst.packed
    )
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as sock:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
        sock.sendto(ip + udp + payload, (dest[0], 0))
