"""What the test web's pages are made of: prose, binary resources, link-count statistics."""

from __future__ import annotations

import math
import random
import struct
import zlib

__all__ = ["LINK_CAP", "LINK_SIGMA", "PDF", "PNG", "WORDS", "lognormal_mu", "make_text"]

LINK_CAP = 4000  # below FetchLimits.max_links_per_page, so no crawler drops a planned link
# Median = mean / 2 makes the link count skewed like the real web (few hubs, many leaves):
# for a lognormal, mean / median = exp(sigma^2 / 2), so sigma^2 = 2 ln 2.
LINK_SIGMA = math.sqrt(2.0 * math.log(2.0))


def png_bytes() -> bytes:
    """A valid 1x1 PNG whose tEXt chunk looks like a link, to catch crawlers parsing images."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\x20\x60\xa0")
    text = b'Comment\x00<a href="/trap/from-png.html">not a link</a>'
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"tEXt", text)
        + chunk(b"IDAT", pixels)
        + chunk(b"IEND", b"")
    )


PDF = (
    b"%PDF-1.4\n"
    b'% <a href="/trap/from-pdf.html">a PDF is fetched, never parsed for links</a>\n'
    b"1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n"
    b"2 0 obj << /Type /Pages /Kids [] /Count 0 >> endobj\n"
    b"trailer << /Root 1 0 R >>\n%%EOF\n"
)
PNG = png_bytes()

_VOCABULARY = (
    "peer crawl host page link queue frontier owner node key hash ring table bucket "
    "fetch parse robots delay polite server client socket request response header body "
    "graph web index archive record replica backup recovery join leave route lookup "
    "distance closest contact value store fingerprint filter bloom seen done task batch "
    "the a of and to in is that for on with as by at from this be are it an or which "
    "network protocol system distributed scalable overlay latency bandwidth throughput "
    "ordered random uniform skewed breadth depth first level priority politeness gap"
)
WORDS = _VOCABULARY.split()


# --- the web -----------------------------------------------------------------------------


def lognormal_mu(mean: float) -> float:
    """mu such that min(lognormal(mu, sigma), 10 * mean) averages ``mean``."""
    if mean <= 0:
        return 0.0
    cap = min(LINK_CAP, 10 * mean)
    s = LINK_SIGMA

    def phi(x: float) -> float:
        return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))

    def capped_mean(mu: float) -> float:
        lc = math.log(cap)
        return math.exp(mu + s * s / 2) * phi((lc - mu - s * s) / s) + cap * (
            1 - phi((lc - mu) / s)
        )

    lo, hi = math.log(mean) - 5.0, math.log(mean) + 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if capped_mean(mid) < mean else (lo, mid)
    return (lo + hi) / 2


def make_text(seed: int) -> tuple[str, list[int]]:
    """~128 KiB of paragraphs every page draws its prose and padding from."""
    rng = random.Random(f"{seed}:text")
    paragraphs: list[str] = []
    starts: list[int] = []
    size = 0
    while size < 128 * 1024:
        words = rng.choices(WORDS, k=rng.randint(40, 110))
        words[0] = words[0].capitalize()
        paragraph = f"<p>{' '.join(words)}.</p>\n"
        starts.append(size)
        paragraphs.append(paragraph)
        size += len(paragraph)
    return "".join(paragraphs), starts


# --- CLI -----------------------------------------------------------------------------------
