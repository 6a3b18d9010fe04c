"""``async with`` for anything with ``start()`` and ``aclose()``: one copy of the protocol."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["Service"]


class Service:
    """A component started by ``start()`` and closed by ``aclose()``; ``async with`` does both,
    closing on the way out whether the block raised or not."""

    async def start(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
