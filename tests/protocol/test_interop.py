"""Without a secret the wire is stock kademlia/rpcudp: plain kademlia Servers interoperate."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from kademlia.network import Server
from kademlia.utils import digest

from tests.protocol.conftest import NodeFactory, eventually

pytestmark = pytest.mark.timeout(30)

StockFactory = Callable[[], Awaitable[tuple[Server, int]]]


@pytest.fixture
async def stock_server() -> AsyncIterator[StockFactory]:
    servers: list[Server] = []

    async def factory() -> tuple[Server, int]:
        server = Server()
        await server.listen(0, interface="127.0.0.1")
        servers.append(server)
        port: int = server.transport.get_extra_info("sockname")[1]
        return server, port

    yield factory
    for server in servers:
        server.stop()


async def test_stock_servers_bootstrap_and_share_values_through_a_crawl_node(
    make_node: NodeFactory, stock_server: StockFactory
) -> None:
    node = await make_node()
    s1, _ = await stock_server()
    s2, _ = await stock_server()
    assert await s1.bootstrap([node.me.addr])
    assert await s1.set("colour", "blue") is True
    assert node.storage.get(digest("colour")) == "blue"  # stored on the CrawlNode
    await s2.bootstrap([node.me.addr])
    assert await s2.get("colour") == "blue"
    await eventually(lambda: len(node.peers()) == 2)


async def test_crawl_node_bootstraps_from_a_stock_server(
    make_node: NodeFactory, stock_server: StockFactory
) -> None:
    stock, port = await stock_server()
    node = await make_node()
    assert [p.id for p in await node.join([("127.0.0.1", port)])] == [stock.node.id]
    assert await node.set("shape", "round") is True
    assert stock.storage.get(digest("shape")) == "round"
    assert await node.get("shape") == "round"
    assert await node.ping_peer(node.peers()[0]) == stock.node.id
