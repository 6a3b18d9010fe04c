"""The shape of a many-host web with heavy-tailed page counts, shared by the benchmarks.

Host ``i`` is the address ``198.19.(i // 256).(i % 256)`` (RFC 2544's benchmarking range, so
nothing here can be confused with a real site), served on port 80 so canonical URLs carry no
port and the host key is the bare address. Page counts follow Zipf's rank-size law, as site
sizes do on the real web: the host of rank ``r`` has ``round(max_pages * r ** -exponent)``
pages (at least 1), and which host gets which rank is a seeded shuffle.

Page ``j`` of a host is ``/p{j}``; ``/`` is page 0. Pages link to ``2j+1`` and ``2j+2`` on the
same host (every page reachable in log2 steps), to a few random pages of the same host, and
to the root pages of a few random other hosts; host 0's root also links to every host's root,
so a crawl seeded there reaches the whole web.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property

FIRST_HOST = (198 << 24) | (19 << 16)  # 198.19.0.0
MAX_HOSTS = 1 << 16


@dataclass(frozen=True)
class ZipfWeb:
    hosts: int = 3000
    max_pages: int = 1000
    exponent: float = 1.0
    seed: int = 1
    local_links: int = 4  # random same-host links per page, beyond the two tree children
    cross_links: int = 2  # links to other hosts' roots per page

    def __post_init__(self) -> None:
        if not 1 <= self.hosts <= MAX_HOSTS:
            raise ValueError(f"hosts must be 1..{MAX_HOSTS}")
        if self.max_pages < 1 or self.exponent < 0:
            raise ValueError("max_pages >= 1 and exponent >= 0")

    @staticmethod
    def host_name(i: int) -> str:
        a = FIRST_HOST + i
        return f"{a >> 24}.{(a >> 16) & 255}.{(a >> 8) & 255}.{a & 255}"

    @staticmethod
    def host_index(name: str) -> int:
        parts = [int(p) for p in name.split(".")]
        a = (parts[0] << 24) | (parts[1] << 16) | (parts[2] << 8) | parts[3]
        i = a - FIRST_HOST
        if not 0 <= i < MAX_HOSTS:
            raise ValueError(f"{name} is not a test web host")
        return i

    @cached_property
    def pages(self) -> list[int]:
        """Page count of each host, by host index."""
        by_rank = [
            max(1, round(self.max_pages * r**-self.exponent)) for r in range(1, self.hosts + 1)
        ]
        random.Random(f"zipfweb:{self.seed}").shuffle(by_rank)
        return by_rank

    @property
    def total_pages(self) -> int:
        return sum(self.pages)

    def names(self) -> list[str]:
        return [self.host_name(i) for i in range(self.hosts)]

    @staticmethod
    def path(page: int) -> str:
        return "/" if page == 0 else f"/p{page}"

    def url(self, host: int, page: int) -> str:
        return f"http://{self.host_name(host)}{self.path(page)}"

    def links(self, host: int, page: int) -> list[tuple[int, int]]:
        """(host, page) targets of one page, in document order."""
        n = self.pages[host]
        rng = random.Random(f"{self.seed}:{host}:{page}")
        out = [(host, c) for c in (2 * page + 1, 2 * page + 2) if c < n]
        out += [(host, rng.randrange(n)) for _ in range(self.local_links)]
        out += [(rng.randrange(self.hosts), 0) for _ in range(self.cross_links)]
        if host == 0 and page == 0:
            out += [(h, 0) for h in range(1, self.hosts)]
        return out
