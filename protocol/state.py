"""Saved node state as JSON (kademlia's ``save_state`` uses pickle: loading a pickle runs
arbitrary code from whoever could write the file)."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from protocol.ownership import ID_BYTES

__all__ = ["SavedState", "read_state", "write_state"]

STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class SavedState:
    node_id: bytes
    ksize: int
    alpha: int
    neighbors: list[tuple[str, int]]


def write_state(path: str | os.PathLike[str], state: SavedState) -> None:
    """Write atomically (temp file + rename): a crash never leaves half a file."""
    data = {
        "version": STATE_VERSION,
        "id": state.node_id.hex(),
        "ksize": state.ksize,
        "alpha": state.alpha,
        "neighbors": [[h, p] for h, p in state.neighbors],
    }
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def read_state(path: str | os.PathLike[str]) -> SavedState:
    """Read and validate; raises ValueError on anything unexpected (a pickle included)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a JSON state file") from exc
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise ValueError(f"{path}: not a version {STATE_VERSION} state file")
    try:
        node_id = bytes.fromhex(data["id"])
        ksize, alpha = data["ksize"], data["alpha"]
        neighbors = [(str(h), int(p)) for h, p in data["neighbors"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: bad state file: {exc}") from exc
    if len(node_id) != ID_BYTES or type(ksize) is not int or type(alpha) is not int:
        raise ValueError(f"{path}: bad id, ksize or alpha")
    return SavedState(node_id, ksize, alpha, neighbors)
