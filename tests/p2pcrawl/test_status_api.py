"""The status server's JSON API and /metrics against a real peer crawling a real test web."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from p2pcrawl.network import Peer, PeerConfig
from p2pcrawl.ui.status import MAX_BODY, MAX_SEEDS_PER_REQUEST, StatusServer, token_matches
from tests.conftest import PeerFactory, StatusFactory, WebFactory, crawl_settings_for, wait_idle

STATUS_FIELDS: dict[str, type | tuple[type, ...]] = {
    # the status contract of docs/architecture.md, "Finished" ...
    "node_id": str,
    "listen": str,
    "state": str,
    "peers": int,
    "tasks_queued": int,
    "tasks_in_flight": int,
    "backups_held": int,
    "done": int,
    "pages_fetched": int,
    "urls_discovered": int,
    "errors": int,
    "uptime_s": (int, float),
    # ... and what the status page shows besides.
    "version": str,
    "network_size": int,
    "errors_by_kind": dict,
    "bytes_fetched": int,
    "pages_per_s": (int, float),
    "discovered_per_s": (int, float),
    "bytes_per_s": (int, float),
    "rpc_in_transit": int,
    "handoff": dict,
    "backups_by_owner": dict,
}

HOST_FIELDS: dict[str, type | tuple[type, ...]] = {
    "host": str,
    "queued": int,
    "busy": bool,
    "next_allowed_in_s": (int, float),
    "last_response_s": (int, float),
}


def check_fields(doc: dict[str, Any], fields: dict[str, type | tuple[type, ...]]) -> None:
    missing = set(fields) - set(doc)
    assert not missing, f"missing {missing} in {doc}"
    for key, kind in fields.items():
        assert isinstance(doc[key], kind), f"{key}={doc[key]!r} is not {kind}"
        if kind is int:
            assert not isinstance(doc[key], bool), key


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.content_type == "application/json"
        return await resp.json()


async def test_api_shapes_seed_drain_and_metrics(
    make_web: WebFactory, make_peer: PeerFactory, make_status: StatusFactory
) -> None:
    web = await make_web()
    peer = await make_peer(crawl=crawl_settings_for(web))
    server = await make_status(peer)
    base = server.url
    async with aiohttp.ClientSession() as s:
        before = await get_json(s, base + "api/status")
        check_fields(before, STATUS_FIELDS)
        assert before["node_id"] == peer.node_id.hex()
        assert before["state"] == "active"
        assert before["listen"] == f"{peer.me.host}:{peer.me.port}"
        assert before["pages_fetched"] == 0

        async with s.post(base + "api/seed", json={"urls": [web.hub_url]}) as resp:
            assert resp.status == 200
            doc = await resp.json()
            assert doc["accepted"] == 1
            assert doc["seeds"] == [
                {"url": web.hub_url, "canonical": web.hub_url, "result": "accepted", "reason": ""}
            ]
        st = await wait_idle(s, base)
        check_fields(st, STATUS_FIELDS)
        assert st["tasks_queued"] == 0 and st["tasks_in_flight"] == 0
        assert st["pages_fetched"] > 0 and st["done"] > 0 and st["urls_discovered"] > 0
        assert st["bytes_fetched"] > 200_000  # the large page alone

        # The page itself carries the values, for curl and browsers without JavaScript.
        async with s.get(base) as resp:
            page = await resp.text()
        assert f'data-key="node_id">{peer.node_id.hex()}</dd>' in page
        assert 'class="badge s-active" data-key="state">active</span>' in page
        fetched = f"{peer.engine.stats.pages_fetched:,}" if peer.engine else "?"
        assert re.search(rf'data-key="pages_fetched"\s+data-fmt="int">{fetched}</div>', page)
        assert not re.search(r'data-key="[a-z_]+"[^>]*>…<', page), "a field left unrendered"

        peers = await get_json(s, base + "api/peers")
        assert set(peers) == {"peers", "buckets", "rpc"}
        assert peers["peers"] == []  # a lone founder
        assert len(peers["buckets"]) >= 1
        for bucket in peers["buckets"]:
            assert len(bucket["range"]) == 2 and isinstance(bucket["peers"], list)
        for key in ("rpc_sent", "rpc_received", "latency_ms", "dropped"):
            assert isinstance(peers["rpc"][key], dict)

        hosts = await get_json(s, base + "api/hosts?limit=2")
        assert isinstance(hosts["hosts"], list) and len(hosts["hosts"]) <= 2
        for h in hosts["hosts"]:
            check_fields(h, HOST_FIELDS)

        events = await get_json(s, base + "api/events")
        assert isinstance(events["now"], float) and isinstance(events["events"], list)
        peer.events.add("probe", detail=b"\x01\x02")  # bytes must not break the JSON
        events = await get_json(s, base + "api/events?limit=1")
        assert len(events["events"]) == 1
        assert events["events"][0]["kind"] == "probe" and events["events"][0]["detail"] == "0102"

        history = await get_json(s, base + "api/history?seconds=60")
        assert history["columns"] == ["t", "pages_fetched", "urls_discovered", "bytes_fetched"]
        assert history["samples"], "the engine samples its counters every second"
        times = [row[0] for row in history["samples"]]
        assert times == sorted(times) and 0 <= times[0] <= history["uptime_s"]
        assert all(len(row) == 4 for row in history["samples"])

        async with s.get(base + "metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
        st = await get_json(s, base + "api/status")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(x.name, tuple(sorted(x.labels.items()))): x.value for x in _samples(families)}
    assert samples[("p2pcrawl_pages_fetched_total", ())] == st["pages_fetched"]
    assert samples[("p2pcrawl_urls_discovered_total", ())] == st["urls_discovered"]
    assert samples[("p2pcrawl_done", ())] == st["done"]
    assert samples[("p2pcrawl_tasks_queued", ())] == 0
    state = ("p2pcrawl_state", st["state"])
    assert st["state"] in ("active", "finished")
    assert samples[("p2pcrawl_state", (state,))] == 1
    assert families["p2pcrawl_fetch_seconds"].type == "histogram"
    assert samples[("p2pcrawl_fetch_seconds_count", ())] >= st["pages_fetched"]
    assert families["p2pcrawl_rpc_sent"].type == "counter"
    assert families["p2pcrawl_rpc_latency_mean_seconds"].type == "gauge"
    codes = {
        dict(lbl)["code"] for (name, lbl) in samples if name == "p2pcrawl_http_responses_total"
    }
    assert {"200", "404"} <= codes  # the test web answers both


def _samples(families: dict[str, Any]) -> list[Any]:
    return [sample for family in families.values() for sample in family.samples]


OVERSIZE = b'{"urls": ["' + b"a" * (MAX_BODY + 1) + b'"]}'
TOO_MANY = {"urls": [f"http://127.0.0.2/{i}" for i in range(MAX_SEEDS_PER_REQUEST + 1)]}

# (method, path, body (bytes: sent raw; other: as JSON), extra headers, expected status)
BAD_REQUESTS: list[tuple[str, str, Any, dict[str, str], int]] = [
    ("POST", "/api/seed", b"not json", {}, 400),
    ("POST", "/api/seed", b"", {}, 400),
    ("POST", "/api/seed", b'{"urls": ["\xff\xfe"]}', {}, 400),  # not UTF-8
    ("POST", "/api/seed", b"[" * 100_000, {}, 400),  # nesting that overflows the parser
    ("POST", "/api/seed", ["http://a.example/"], {}, 400),  # not an object
    ("POST", "/api/seed", {"urls": "http://a.example/"}, {}, 400),
    ("POST", "/api/seed", {"urls": []}, {}, 400),
    ("POST", "/api/seed", {"urls": [1]}, {}, 400),
    ("POST", "/api/seed", {"urls": [None]}, {}, 400),
    ("POST", "/api/seed", {"url": ["http://a.example/"]}, {}, 400),  # unknown field
    ("POST", "/api/seed", TOO_MANY, {}, 413),
    ("POST", "/api/seed", OVERSIZE, {}, 413),
    # A page on another site must not start crawls or stop the peer through the browser.
    ("POST", "/api/seed", {"urls": ["http://a.example/"]}, {"Origin": "http://evil.test"}, 403),
    ("POST", "/api/leave", None, {"Origin": "null"}, 403),
    # DNS rebinding: same origin for the browser, but the Host header is not loopback.
    ("GET", "/api/status", None, {"Host": "rebind.evil.test:8080"}, 403),
    ("GET", "/api/seed", None, {}, 405),
    ("GET", "/api/leave", None, {}, 405),
    ("DELETE", "/api/status", None, {}, 405),
    ("PUT", "/", b"x", {}, 405),
    ("GET", "/nope", None, {}, 404),
    ("GET", "/api/", None, {}, 404),
    ("POST", "/api/nope", {}, {}, 404),
    ("GET", "/api/hosts?limit=abc", None, {}, 400),
    ("GET", "/api/hosts?limit=0", None, {}, 400),
    ("GET", "/api/hosts?limit=100000", None, {}, 400),
    ("GET", "/api/events?limit=-1", None, {}, 400),
    ("GET", "/api/history?seconds=1.5", None, {}, 400),
]


@pytest.fixture
async def idle_server(make_peer: PeerFactory, make_status: StatusFactory) -> StatusServer:
    return await make_status(await make_peer())


async def test_urls_that_are_not_crawlable_each_get_an_invalid_verdict(
    idle_server: StatusServer,
) -> None:
    bad = ["ftp://a.example/", "javascript:alert(1)", "/relative/path"]
    bad.append("http://a.example/" + "x" * 5000)
    async with (
        aiohttp.ClientSession() as s,
        s.post(idle_server.url + "api/seed", json={"urls": bad}) as resp,
    ):
        assert resp.status == 200
        doc = await resp.json()
        st = await get_json(s, idle_server.url + "api/status")
    assert doc["accepted"] == 0
    assert [v["result"] for v in doc["seeds"]] == ["invalid"] * len(bad)
    # What is echoed back is bounded: the URL as given, cut to a few hundred characters.
    assert [v["url"] for v in doc["seeds"]][:3] == bad[:3]
    assert len(doc["seeds"][3]["url"]) == 200 and all(v["reason"] for v in doc["seeds"])
    assert st["tasks_queued"] == 0


async def test_bad_requests_get_json_errors(idle_server: StatusServer) -> None:
    async with aiohttp.ClientSession() as s:
        for method, path, body, headers, expected in BAD_REQUESTS:
            kwargs: dict[str, Any] = {"headers": headers}
            if isinstance(body, bytes):
                kwargs["data"] = body
                kwargs["headers"] = {"Content-Type": "application/json", **headers}
            elif body is not None:
                kwargs["json"] = body
            case = f"{method} {path} {str(body)[:60]} {headers}"
            async with s.request(method, idle_server.url.rstrip("/") + path, **kwargs) as resp:
                assert resp.status == expected, f"{case}: {resp.status} {await resp.text()}"
                assert resp.content_type == "application/json", case
                doc = await resp.json()
                assert isinstance(doc["error"], str) and doc["error"], case
                if expected == 405:
                    assert "Allow" in resp.headers, case
        # None of that seeded anything.
        st = await get_json(s, idle_server.url + "api/status")
        assert st["pages_fetched"] == 0 and st["tasks_queued"] == 0


async def test_same_origin_post_and_loopback_names_are_accepted(
    make_peer: PeerFactory, make_status: StatusFactory, make_web: WebFactory
) -> None:
    web = await make_web(hosts=1, pages_per_host=1, features=False)
    server = await make_status(await make_peer(crawl=crawl_settings_for(web)))
    origin = f"http://127.0.0.1:{server.port}"
    async with aiohttp.ClientSession() as s:
        async with s.post(
            server.url + "api/seed", json={"urls": [web.hub_url]}, headers={"Origin": origin}
        ) as resp:
            assert resp.status == 200, await resp.text()
        for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", "[::1]"):
            async with s.get(server.url + "api/status", headers={"Host": host}) as resp:
                assert resp.status == 200, host


async def test_page_is_self_contained_with_a_csp_that_allows_only_its_script(
    idle_server: StatusServer,
) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.get(idle_server.url) as resp,
    ):
        assert resp.status == 200
        assert resp.content_type == "text/html"
        html = await resp.text()
        csp = resp.headers["Content-Security-Policy"]
        assert resp.headers["Referrer-Policy"] == "no-referrer"
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    for tag in ("script", "style"):
        bodies = re.findall(rf"<{tag}[^>]*>(.*?)</{tag}>", html, re.DOTALL)
        assert len(bodies) == 1, f"exactly one inline <{tag}>, covered by the CSP hash"
        digest = base64.b64encode(hashlib.sha256(bodies[0].encode()).digest()).decode()
        assert f"'sha256-{digest}'" in csp
    # No external resources: the machine may be offline.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html, re.IGNORECASE)
    for element_id in ("node_id", "state", "pages_fetched", "tasks_queued", "done", "chart"):
        assert f'id="{element_id}"' in html


async def test_token_is_required_everywhere_when_set(
    make_peer: PeerFactory, make_status: StatusFactory
) -> None:
    token = "s3cret-token"
    server = await make_status(await make_peer(), token=token)
    good = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as s:

        async def status_of(method: str, path: str, **kw: Any) -> int:
            async with s.request(method, server.url.rstrip("/") + path, **kw) as resp:
                if resp.status == 401:
                    assert (await resp.json())["error"]
                    assert resp.headers["WWW-Authenticate"] == "Bearer"
                return resp.status

        for path in ("/", "/api/status", "/api/peers", "/metrics", "/nope"):
            assert await status_of("GET", path) == 401, path
            assert await status_of("GET", path, headers={"Authorization": "Bearer wrong"}) == 401
            assert await status_of("GET", path + "?token=s3cret-toke") == 401, path
        assert await status_of("GET", "/api/status", headers=good) == 200
        assert await status_of("GET", "/", headers=good) == 200
        assert await status_of("GET", f"/api/status?token={token}") == 200
        assert await status_of("GET", f"/?token={token}") == 200
        lower = {"Authorization": f"bearer {token}"}  # RFC 7235: the scheme is case-blind
        assert await status_of("GET", "/metrics", headers=lower) == 200
        # With a token the server may be reached by any name (it listens beyond loopback).
        remote = {**good, "Host": "peer.example.net:8080"}
        assert await status_of("GET", "/api/status", headers=remote) == 200
        # A state-changing request takes the token from a header only, never from the URL.
        body = {"urls": ["http://127.0.0.2/"]}
        assert await status_of("POST", "/api/seed", json=body) == 401
        assert await status_of("POST", f"/api/seed?token={token}", json=body) == 401
        assert await status_of("POST", "/api/leave", headers={"Authorization": token}) == 401
        assert await status_of("POST", "/api/seed", json={"urls": [1]}, headers=good) == 400


async def test_non_loopback_status_needs_a_token(make_peer: PeerFactory) -> None:
    peer = await make_peer()
    for host in ("0.0.0.0", "::", "192.168.1.10", "example.org"):
        with pytest.raises(ValueError, match="status-token"):
            StatusServer(peer, host, 8080)
    StatusServer(peer, "0.0.0.0", 8080, token="t")  # constructing does not bind
    for host in ("127.0.0.1", "127.1.2.3", "::1", "localhost"):
        StatusServer(peer, host, 8080)


def test_token_matches() -> None:
    assert token_matches("abc", "abc")
    assert not token_matches("abd", "abc")
    assert not token_matches("ab", "abc")
    assert not token_matches("", "abc")
    assert token_matches("\udcff\u00e9", "\udcff\u00e9")  # odd bytes from a header still compare


async def test_leave_makes_run_return_and_then_refuses_work(
    make_peer: PeerFactory, make_status: StatusFactory
) -> None:
    peer = await make_peer()
    server = await make_status(peer)
    runner = asyncio.ensure_future(peer.run())
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(server.url + "api/leave") as resp:
                assert resp.status == 202
                assert await resp.json() == {"state": "leaving"}
            report = await asyncio.wait_for(runner, timeout=15)
            assert report.failed == 0
            async with s.post(server.url + "api/seed", json={"urls": ["http://a.example/"]}) as r:
                assert r.status == 409
                assert "leaving" in (await r.json())["error"]
            async with s.post(server.url + "api/leave") as resp:
                assert resp.status == 409
            st = await get_json(s, server.url + "api/status")
            assert st["state"] == "leaving"
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_api_answers_before_the_peer_has_started(tmp_path: Path) -> None:
    """The CLI starts the status server before the peer, so early polls must not fail."""
    peer = Peer(PeerConfig(data_dir=tmp_path / "early"))
    server = StatusServer(peer, "127.0.0.1", 0)
    await server.start()
    try:
        async with aiohttp.ClientSession() as s:
            st = await get_json(s, server.url + "api/status")
            check_fields(st, STATUS_FIELDS)
            assert st["state"] == "joining" and st["listen"] == ""
            assert st["node_id"] == peer.node_id.hex()
            for path in ("api/peers", "api/hosts", "api/events", "api/history"):
                await get_json(s, server.url + path)
            async with s.post(server.url + "api/seed", json={"urls": ["http://a.example/"]}) as r:
                assert r.status == 409
            async with s.get(server.url + "metrics") as resp:
                assert resp.status == 200
                names = {f.name for f in text_string_to_metric_families(await resp.text())}
                assert "p2pcrawl_tasks_queued" in names
    finally:
        await server.aclose()
        await peer.aclose()


async def test_peers_api_lists_the_routing_table_of_a_joined_peer(
    make_peer: PeerFactory, make_status: StatusFactory
) -> None:
    founder = await make_peer()
    joiner = await make_peer(bootstrap=((founder.me.host, founder.me.port),))
    server = await make_status(joiner)
    async with aiohttp.ClientSession() as s:
        doc = await get_json(s, server.url + "api/peers")
        st = await get_json(s, server.url + "api/status")
    assert doc["peers"] == [
        {"id": founder.node_id.hex(), "host": founder.me.host, "port": founder.me.port}
    ]
    listed = [p for b in doc["buckets"] for p in b["peers"]]
    assert [p["id"] for p in listed] == [founder.node_id.hex()[:8]]
    entry = listed[0]
    assert entry["addr"] == f"{founder.me.host}:{founder.me.port}"
    assert isinstance(entry["last_seen_s"], int | float) and entry["failures"] == 0
    assert doc["rpc"]["rpc_sent"].get("find_node", 0) >= 1  # the join lookup (§2.3)
    assert st["peers"] == 1 and st["network_size"] == 2
