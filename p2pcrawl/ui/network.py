"""The network view: every peer's status, found through the DHT, and the network's totals.

Each peer announces where its status server is in the DHT's value store (Kademlia STORE)
under ``p2pcrawl/status/v1/<node id>``, refreshed every :data:`ANNOUNCE_EVERY_S`. Any peer
can then build the whole view: it walks its routing table, looks each node's announcement
up (Kademlia FIND_VALUE) and asks that status server for ``/api/status``.

In a network with a key (``--secret``) an announcement carries an HMAC over its fields made
with that key, and one without a valid tag, for another node, or older than
:data:`ANNOUNCE_MAX_AGE_S` is ignored: a value in the DHT can be stored by any node that
can reach the store, and the view must not send the operator's token to an address a
stranger planted. Without a key (loopback networks) announcements are taken as they are.

The status server's token is never announced: a network view asks every peer with the
token of the server it runs in, so a network whose status servers need a token gives them
all the same one.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ANNOUNCE_EVERY_S",
    "ANNOUNCE_MAX_AGE_S",
    "Announcement",
    "NetworkMonitor",
    "PeerRow",
    "announce_key",
    "announced_address",
    "decode_announcement",
    "encode_announcement",
    "format_network",
    "loopback_only",
    "network_view",
]

ANNOUNCE_PREFIX = "p2pcrawl/status/v1/"
ANNOUNCE_EVERY_S = 60.0
ANNOUNCE_MAX_AGE_S = 600.0  # ten refreshes missed: the peer is gone or cut off
MAX_ANNOUNCEMENT_BYTES = 1024
MAX_PEERS = 256  # a view never asks more status servers than this

log = logging.getLogger(__name__)

# The fields of /api/status a row keeps; the rest stays on the peer's own page.
_ROW_FIELDS = (
    "state",
    "listen",
    "version",
    "pages_fetched",
    "pages_per_s",
    "tasks_queued",
    "tasks_in_flight",
    "backups_held",
    "done",
    "errors",
    "bytes_fetched",
    "uptime_s",
)
_SUMMED = (
    "pages_fetched",
    "pages_per_s",
    "tasks_queued",
    "tasks_in_flight",
    "backups_held",
    "done",
    "errors",
    "bytes_fetched",
)


def announce_key(node_id: bytes) -> str:
    return ANNOUNCE_PREFIX + node_id.hex()


@dataclass(frozen=True, slots=True)
class Announcement:
    node_id: bytes
    status: str  # HOST:PORT of the status server, as other peers should reach it
    at: float  # unix time the peer made it


def _tag(secret: str, node_id: bytes, status: str, at: float) -> str:
    msg = f"{ANNOUNCE_PREFIX}|{node_id.hex()}|{status}|{at:.3f}".encode()
    return hmac.new(secret.encode("utf-8"), msg, hashlib.sha256).hexdigest()


def encode_announcement(node_id: bytes, status: str, secret: str, at: float | None = None) -> str:
    at = round(time.time() if at is None else at, 3)
    doc: dict[str, object] = {"node": node_id.hex(), "status": status, "at": at}
    if secret:
        doc["mac"] = _tag(secret, node_id, status, at)
    return json.dumps(doc, separators=(",", ":"))


def decode_announcement(
    raw: object, node_id: bytes, secret: str, now: float | None = None
) -> Announcement | None:
    """The announcement ``node_id`` made, or None when ``raw`` is not one (checked: it comes
    from the network, and with a key it must carry that key's tag and be recent)."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not isinstance(raw, str) or len(raw) > MAX_ANNOUNCEMENT_BYTES:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    status, at, node = doc.get("status"), doc.get("at"), doc.get("node")
    if node != node_id.hex() or not isinstance(status, str) or not _valid_hostport(status):
        return None
    if not isinstance(at, int | float) or isinstance(at, bool):
        return None
    if secret:
        mac = doc.get("mac")
        expected = _tag(secret, node_id, status, float(at))
        if not isinstance(mac, str) or not hmac.compare_digest(mac, expected):
            return None
        now = time.time() if now is None else now
        if not -ANNOUNCE_MAX_AGE_S / 10 <= now - at <= ANNOUNCE_MAX_AGE_S:
            return None
    return Announcement(node_id, status, float(at))


def _valid_hostport(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        return False
    return len(host) <= 255 and all(c.isalnum() or c in ".-[]:" for c in host)


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def announced_address(status_host: str, status_port: int, udp_host: str) -> str:
    """What other peers should dial: a status server bound to every interface is reached
    at the address the peer is known by in the DHT (its UDP host)."""
    host = udp_host if _is_wildcard(status_host) else status_host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{status_port}"


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def loopback_only(status_addr: str, udp_host: str) -> str | None:
    """Why ``status_addr`` cannot be reached from here: a loopback status server of a peer
    on another machine (its UDP address is not loopback) would be this machine's own."""
    host = status_addr.rpartition(":")[0]
    if _is_loopback(host) and not _is_loopback(udp_host):
        return (
            f"its status server listens on {status_addr}, loopback only; start that peer with "
            "--status 0.0.0.0:PORT --status-token T to see it here"
        )
    return None


@dataclass(slots=True)
class PeerRow:
    """One peer in the view: where it is, and its status or why it could not be read."""

    node_id: str
    status_addr: str | None
    status: dict[str, Any] | None
    problem: str = ""
    me: bool = False

    def as_dict(self, total_pages: int) -> dict[str, Any]:
        st = self.status or {}
        pages = int(st.get("pages_fetched") or 0)
        row: dict[str, Any] = {
            "node_id": self.node_id,
            "status_addr": self.status_addr,
            "page": f"http://{self.status_addr}/" if self.status_addr else None,
            "me": self.me,
            "reachable": self.status is not None,
            "problem": self.problem,
            "share": round(pages / total_pages, 4) if total_pages else 0.0,
        }
        for f in _ROW_FIELDS:
            row[f] = st.get(f)
        row["state"] = st.get("state") or "unknown"
        # Two lanes' fields, shown when the peer has them.
        row["errors_by_kind"] = st.get("errors_by_kind") or {}
        row["loop_lag_ms"] = st.get("loop_lag_p99_ms")  # p99 of the peer's recent samples
        return row


def network_state(rows: Sequence[PeerRow]) -> str:
    """``finished`` once every peer says so and none is unaccounted for; ``unknown`` while a
    peer cannot be read; otherwise the state most peers are in, ``active`` first."""
    if any(r.status is None for r in rows):
        return "unknown"
    states = [str((r.status or {}).get("state")) for r in rows]
    if states and all(s == "finished" for s in states):
        return "finished"
    for s in ("active", "joining", "leaving", "finished", "stopped"):
        if s in states:
            return s
    return "unknown"


def network_view(rows: Sequence[PeerRow], now: float | None = None) -> dict[str, Any]:
    """``/api/network``: the peers (this one first, then by node ID) and the totals."""
    ordered = sorted(rows, key=lambda r: (not r.me, r.node_id))
    totals: dict[str, float] = dict.fromkeys(_SUMMED, 0)
    for r in ordered:
        for f in _SUMMED:
            v = (r.status or {}).get(f)
            if isinstance(v, int | float) and not isinstance(v, bool):
                totals[f] += v
    totals["pages_per_s"] = round(totals["pages_per_s"], 2)
    total_pages = int(totals["pages_fetched"])
    return {
        "generated_at": time.time() if now is None else now,
        "state": network_state(ordered),
        "peers_known": len(ordered),
        "peers_reachable": sum(r.status is not None for r in ordered),
        "totals": {k: (round(v, 2) if isinstance(v, float) else v) for k, v in totals.items()},
        "peers": [r.as_dict(total_pages) for r in ordered],
    }


# -- collecting the rows ----------------------------------------------------------------------

Lookup = Callable[[bytes], Awaitable[str | None]]  # node ID -> its status address
Fetch = Callable[[str], Awaitable[dict[str, Any]]]  # status address -> its /api/status


async def collect_rows(
    me: PeerRow,
    others: Iterable[bytes],
    lookup: Lookup,
    fetch: Fetch,
    *,
    concurrency: int = 8,
    timeout: float = 3.0,
) -> list[PeerRow]:
    """This peer's row plus one per other node: looked up, then asked, ``concurrency`` at a
    time, each bounded by ``timeout``; a failure becomes the row's ``problem``."""
    gate = asyncio.Semaphore(concurrency)
    ids = list(dict.fromkeys(others))[: MAX_PEERS - 1]

    async def one(node_id: bytes) -> PeerRow:
        row = PeerRow(node_id.hex(), None, None)
        async with gate:
            try:
                async with asyncio.timeout(timeout):
                    row.status_addr = await lookup(node_id)
                    if row.status_addr is None:
                        row.problem = "no status address announced in the DHT (yet)"
                        return row
                    row.status = await fetch(row.status_addr)
            except TimeoutError:
                row.problem = f"no answer within {timeout:.0f} s"
            except Exception as exc:  # any failure of one peer is that row's, not the view's
                row.problem = str(exc) or type(exc).__name__
        if row.status is not None and row.status.get("node_id") not in (None, row.node_id):
            row.problem = f"{row.status_addr} answers as another node"
            row.status = None
        return row

    return [me, *await asyncio.gather(*(one(i) for i in ids))]


def _cell(value: Any, kind: str = "") -> str:
    if value is None:
        return "-"
    if kind == "pct":
        return f"{100 * float(value):.0f}%"
    if kind == "rate":
        return f"{float(value):.1f}"
    return str(value)


def format_network(doc: Mapping[str, Any]) -> str:
    """The view as a terminal table, one peer a line, totals last."""
    head = ("node", "state", "share", "pages", "pages/s", "queued", "backups", "errors", "page")
    lines: list[tuple[str, ...]] = [head]
    for p in doc.get("peers", []):
        node = str(p.get("node_id", ""))[:8] + ("*" if p.get("me") else "")
        state = p.get("state") or "unknown"
        if not p.get("reachable"):
            lines.append((node, "?", "-", "-", "-", "-", "-", "-", p.get("problem") or ""))
            continue
        lines.append(
            (
                node,
                str(state),
                _cell(p.get("share"), "pct"),
                _cell(p.get("pages_fetched")),
                _cell(p.get("pages_per_s"), "rate"),
                _cell(p.get("tasks_queued")),
                _cell(p.get("backups_held")),
                _cell(p.get("errors")),
                p.get("page") or "",
            )
        )
    t = doc.get("totals", {})
    lines.append(
        (
            "total",
            str(doc.get("state", "")),
            "100%" if t.get("pages_fetched") else "-",
            _cell(t.get("pages_fetched")),
            _cell(t.get("pages_per_s"), "rate"),
            _cell(t.get("tasks_queued")),
            _cell(t.get("backups_held")),
            _cell(t.get("errors")),
            f"{doc.get('peers_reachable', 0)}/{doc.get('peers_known', 0)} peers answered",
        )
    )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head) - 1)]
    right = {2, 3, 4, 5, 6, 7}
    out = []
    for row in lines:
        cells = [
            row[i].rjust(widths[i]) if i in right else row[i].ljust(widths[i])
            for i in range(len(head) - 1)
        ]
        out.append("  ".join([*cells, row[-1]]).rstrip())
    out.append("(* = the peer asked)")
    return "\n".join(out)


# -- the live part: announcing this peer, asking the others -----------------------------------

LOOKUP_TTL_S = 30.0
VIEW_TTL_S = 1.0  # a page polling every second, from several tabs, costs one round
NETWORK_LIMIT_EVERY_S = 2.0
FAST_ANNOUNCE_S = 5.0  # while the routing table changes (a network forming), announce often


class NetworkMonitor:
    """Announces this peer's status address in the DHT and builds the network view.

    Owned by the status server: ``start`` and ``aclose`` bracket its announce task and its
    HTTP session.
    """

    def __init__(self, peer: Any, status_addr: Callable[[], str], token: str = "") -> None:
        self.peer = peer
        self.status_addr = status_addr
        self.token = token
        self.announced = 0  # announcements stored (locally at least)
        self._lookups: dict[bytes, tuple[str, float]] = {}
        self._udp_hosts: dict[bytes, str] = {}
        self._view: tuple[float, dict[str, Any]] | None = None
        self._view_lock = asyncio.Lock()
        self._session: Any = None
        self._task: asyncio.Task[None] | None = None
        self._limit_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        import aiohttp

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._session = aiohttp.ClientSession(
            headers=headers, timeout=aiohttp.ClientTimeout(total=3.0)
        )
        self._task = asyncio.ensure_future(self._announce_loop())
        if self.peer.config.crawl.scope.max_network_pages:
            self._limit_task = asyncio.ensure_future(self._network_limit_loop())

    async def aclose(self) -> None:
        if self._limit_task is not None:
            self._limit_task.cancel()
            await asyncio.gather(self._limit_task, return_exceptions=True)
            self._limit_task = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- announcing --------------------------------------------------------------------------

    def _secret(self) -> str:
        return str(self.peer.config.peer.secret or "")

    async def announce(self) -> None:
        from protocol import PeerTimeout, RemoteError, key_for

        node = self.peer.node
        if node is None or self.peer.state not in ("active", "finished"):
            return
        key = announce_key(self.peer.node_id)
        value = encode_announcement(self.peer.node_id, self.status_addr(), self._secret())
        # Kept here too: a lone founder has no neighbour to store it on, and kademlia hands
        # stored values on to the nodes that join later (Kademlia §2.5).
        node.storage[key_for(key)] = value
        self.announced += 1
        if node.peers():
            try:
                await node.set(key, value)
            except (PeerTimeout, RemoteError, OSError) as exc:
                log.debug("status announcement not stored: %s", exc)

    async def _announce_loop(self) -> None:
        last_at = -ANNOUNCE_EVERY_S
        last_peers = -1
        while True:
            node = self.peer.node
            peers = len(node.peers()) if node is not None and node.protocol is not None else -1
            now = time.monotonic()
            due = now - last_at >= ANNOUNCE_EVERY_S
            changed = peers != last_peers and now - last_at >= FAST_ANNOUNCE_S
            if peers >= 0 and (due or changed):
                try:
                    await self.announce()
                    last_at, last_peers = now, peers
                except Exception:
                    # The node closes under us while the peer stops; the next round retries.
                    log.debug("status announcement failed", exc_info=True)
            await asyncio.sleep(1.0)

    async def _network_limit_loop(self) -> None:
        """--max-network-pages: stop fetching once the peers together fetched that many.

        The total is the network view's, so it counts the peers whose status servers this
        one reaches, and it is read every few seconds: the crawl may overshoot by what the
        network fetches in that time.
        """
        limit = int(self.peer.config.crawl.scope.max_network_pages)
        while True:
            await asyncio.sleep(NETWORK_LIMIT_EVERY_S)
            engine = self.peer.engine
            if engine is None or engine.network_limit_reached or self.peer.node is None:
                continue
            try:
                doc = await self.view()
            except Exception:
                log.debug("network view for --max-network-pages failed", exc_info=True)
                continue
            total = int(doc["totals"]["pages_fetched"])
            if total >= limit:
                engine.network_limit_reached = True
                log.info(
                    "network page limit reached: %d pages fetched by %d peers "
                    "(--max-network-pages %d); this peer stops fetching",
                    total,
                    doc["peers_reachable"],
                    limit,
                )
                self.peer.events.add("network_limit", pages=total)

    # -- the view ----------------------------------------------------------------------------

    async def lookup(self, node_id: bytes) -> str | None:
        from protocol import PeerTimeout, RemoteError

        hit = self._lookups.get(node_id)
        now = time.monotonic()
        if hit is not None and now - hit[1] < LOOKUP_TTL_S:
            return hit[0]
        node = self.peer.node
        if node is None:
            return None
        try:
            raw = await node.get(announce_key(node_id))
        except (PeerTimeout, RemoteError, OSError):
            return None
        ann = decode_announcement(raw, node_id, self._secret())
        if ann is None:
            return None
        if len(self._lookups) >= MAX_PEERS * 2:
            self._lookups.clear()
        self._lookups[node_id] = (ann.status, now)
        return ann.status

    async def lookup_reachable(self, node_id: bytes) -> str | None:
        addr = await self.lookup(node_id)
        udp_host = self._udp_hosts.get(node_id)
        if addr is not None and udp_host is not None:
            why = loopback_only(addr, udp_host)
            if why is not None:
                raise OSError(why)
        return addr

    async def recrawl_at(self, node_id: bytes, url: str) -> dict[str, Any] | None:
        """Ask the owner's own status server to seed ``url`` with ``recrawl``; its verdict, or
        None when it cannot be asked (no announcement, unreachable, refused)."""
        import aiohttp

        try:
            addr = await self.lookup_reachable(node_id)
            if addr is None or self._session is None:
                return None
            body = {"urls": [url], "recrawl": True}
            async with self._session.post(f"http://{addr}/api/seed", json=body) as resp:
                doc = await resp.json(content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            log.info("asking %s to recrawl %s failed: %s", node_id.hex()[:8], url, exc)
            return None
        if resp.status != 200 or not isinstance(doc, dict):
            return None
        seeds = doc.get("seeds")
        if not isinstance(seeds, list) or len(seeds) != 1 or not isinstance(seeds[0], dict):
            return None
        return dict(seeds[0])

    async def fetch(self, addr: str) -> dict[str, Any]:
        assert self._session is not None
        async with self._session.get(f"http://{addr}/api/status") as resp:
            doc = await resp.json(content_type=None)
            if resp.status != 200 or not isinstance(doc, dict):
                error = doc.get("error") if isinstance(doc, dict) else None
                raise OSError(f"{addr} answered {resp.status}: {error or 'not a status'}")
            return doc

    async def view(self) -> dict[str, Any]:
        async with self._view_lock:
            now = time.monotonic()
            if self._view is not None and now - self._view[0] < VIEW_TTL_S:
                return self._view[1]
            node = self.peer.node
            known = node.peers() if node is not None and node.protocol else []
            self._udp_hosts = {p.id: p.host for p in known}
            me = PeerRow(self.peer.node_id.hex(), self.status_addr(), self.peer.status(), me=True)
            others = [p.id for p in known]
            rows = await collect_rows(me, others, self.lookup_reachable, self.fetch)
            doc = network_view(rows)
            self._view = (time.monotonic(), doc)
            return doc
