"""`Client` and `AsyncClient`: httpx clients with the resilient transport and the error tree.

Theory of operation: each is a thin shell over an `httpx.Client` /
`httpx.AsyncClient` whose transport is a `ResilientTransport` /
`AsyncResilientTransport` around the real one. The shell adds two things:
per-call options as keyword arguments (`deadline_s`, `priority`, `cost_hint`,
`tenant`, `idempotency_key`), carried to the transport in
`request.extensions`, and the SDK's error tree (`client_sdk.errors`) in place of
httpx's transport errors and of sidecar-made answers. Anything else httpx does
(auth, cookies, base_url, streaming) is httpx's; `.http` is the underlying
client for the rest of its API.

AsyncClient runs under asyncio and trio alike (httpx and anyio pick the
backend; this module imports neither trio nor asyncio).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any, Self

import httpx

from client_sdk.config import EXTENSION, CallOptions, RetryConfig
from client_sdk.engine import ClientStatistics
from client_sdk.errors import error_for_exception, error_for_response, needs_error
from client_sdk.transport import AsyncResilientTransport, ResilientTransport

# httpx only applies these when it builds the transport itself; the SDK builds
# the inner transport, so it passes them on.
_TRANSPORT_KWARGS = ("verify", "cert", "http1", "http2", "limits", "trust_env")


def _split(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {name: kwargs.pop(name) for name in _TRANSPORT_KWARGS if name in kwargs}


def _call_kwargs(
    kwargs: dict[str, Any],
    deadline_s: float | None,
    priority: str | None,
    cost_hint: int | None,
    tenant: str | None,
    idempotency_key: str | bool | None,
) -> dict[str, Any]:
    options = CallOptions(deadline_s, priority, cost_hint, tenant, idempotency_key)
    kwargs["extensions"] = {**(kwargs.get("extensions") or {}), EXTENSION: options}
    return kwargs


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    """httpx transport errors -> the SDK's tree (the SDK's own errors pass as they are)."""
    try:
        yield
    except httpx.HTTPError as exc:
        mapped = error_for_exception(exc)
        if mapped is None or mapped is exc:  # type: ignore[comparison-overlap]  # error_for_exception passes the SDK's own through
            raise
        raise mapped from exc


class Client:
    """Sync client. `Client("http://pod:8000", config=RetryConfig(max_attempts=4))`."""

    def __init__(
        self,
        base_url: str | httpx.URL = "",
        *,
        config: RetryConfig | None = None,
        transport: httpx.BaseTransport | None = None,
        **kwargs: Any,
    ) -> None:
        """`transport`: the inner transport (default httpx.HTTPTransport). The SDK's
        keyword arguments (`clock`, `sleep`, `rng`, `wall_clock`, `key_factory`,
        `hooks`, `engine`) go to `ResilientTransport`; the rest to `httpx.Client`."""
        sdk = {name: kwargs.pop(name) for name in ResilientTransport.SDK_KWARGS if name in kwargs}
        inner = transport if transport is not None else httpx.HTTPTransport(**_split(kwargs))
        self.transport = ResilientTransport(inner, config, **sdk)
        self._wall_clock = self.transport.engine.wall_clock
        self.http = httpx.Client(base_url=base_url, transport=self.transport, **kwargs)

    def request(
        self,
        method: str,
        url: str | httpx.URL,
        *,
        deadline_s: float | None = None,
        priority: str | None = None,
        cost_hint: int | None = None,
        tenant: str | None = None,
        idempotency_key: str | bool | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        kwargs = _call_kwargs(kwargs, deadline_s, priority, cost_hint, tenant, idempotency_key)
        with _mapped():
            response = self.http.request(method, url, **kwargs)
        return self._checked(response)

    @contextlib.contextmanager
    def stream(
        self,
        method: str,
        url: str | httpx.URL,
        *,
        deadline_s: float | None = None,
        priority: str | None = None,
        cost_hint: int | None = None,
        tenant: str | None = None,
        idempotency_key: str | bool | None = None,
        **kwargs: Any,
    ) -> Iterator[httpx.Response]:
        """Like httpx's `stream()`; errors while reading the body map into the tree too."""
        kwargs = _call_kwargs(kwargs, deadline_s, priority, cost_hint, tenant, idempotency_key)
        with _mapped(), self.http.stream(method, url, **kwargs) as response:
            if needs_error(response):
                response.read()  # a small error body, for the error's message
            yield self._checked(response)

    def _checked(self, response: httpx.Response) -> httpx.Response:
        error = error_for_response(response, self._wall_clock())
        if error is not None:
            response.close()
            raise error
        return response

    def get(self, url: str | httpx.URL, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def head(self, url: str | httpx.URL, **kwargs: Any) -> httpx.Response:
        return self.request("HEAD", url, **kwargs)

    def post(self, url: str | httpx.URL, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def put(self, url: str | httpx.URL, **kwargs: Any) -> httpx.Response:
        return self.request("PUT", url, **kwargs)

    def patch(self, url: str | httpx.URL, **kwargs: Any) -> httpx.Response:
        return self.request("PATCH", url, **kwargs)

    def delete(self, url: str | httpx.URL, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", url, **kwargs)

    def statistics(self) -> ClientStatistics:
        return self.transport.statistics()

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        base_url = str(self.http.base_url)
        return f"<client_sdk.Client base_url={base_url!r} {self.transport.engine!r}>"


class AsyncClient:
    """Async client for asyncio and trio. `async with AsyncClient(base_url) as client: ...`."""

    def __init__(
        self,
        base_url: str | httpx.URL = "",
        *,
        config: RetryConfig | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        **kwargs: Any,
    ) -> None:
        """As `Client`, with `AsyncResilientTransport` and an async `sleep`."""
        sdk = {name: kwargs.pop(name) for name in AsyncResilientTransport.SDK_KWARGS if name in kwargs}
        inner = transport if transport is not None else httpx.AsyncHTTPTransport(**_split(kwargs))
        self.transport = AsyncResilientTransport(inner, config, **sdk)
        self._wall_clock = self.transport.engine.wall_clock
        self.http = httpx.AsyncClient(base_url=base_url, transport=self.transport, **kwargs)

    async def request(
        self,
        method: str,
        url: str | httpx.URL,
        *,
        deadline_s: float | None = None,
        priority: str | None = None,
        cost_hint: int | None = None,
        tenant: str | None = None,
        idempotency_key: str | bool | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        kwargs = _call_kwargs(kwargs, deadline_s, priority, cost_hint, tenant, idempotency_key)
        with _mapped():
            response = await self.http.request(method, url, **kwargs)
        return await self._checked(response)

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        url: str | httpx.URL,
        *,
        deadline_s: float | None = None,
        priority: str | None = None,
        cost_hint: int | None = None,
        tenant: str | None = None,
        idempotency_key: str | bool | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[httpx.Response]:
        kwargs = _call_kwargs(kwargs, deadline_s, priority, cost_hint, tenant, idempotency_key)
        with _mapped():
            async with self.http.stream(method, url, **kwargs) as response:
                if needs_error(response):
                    await response.aread()
                yield await self._checked(response)

    async def _checked(self, response: httpx.Response) -> httpx.Response:
        error = error_for_response(response, self._wall_clock())
        if error is not None:
            await response.aclose()
            raise error
        return response

    async def get(self, url: str | httpx.URL, **kwargs: Any) -> httpx.Response:
        return await self.request("GET", url, **kwargs)

    async def head(self, url: str | httpx.URL, **kwargs: Any) -> httpx.Response:
        return await self.request("HEAD", url, **kwargs)

    async def post(self, url: str | httpx.URL, **kwargs: Any) -> httpx.Response:
        return await self.request("POST", url, **kwargs)

    async def put(self, url: str | httpx.URL, **kwargs: Any) -> httpx.Response:
        return await self.request("PUT", url, **kwargs)

    async def patch(self, url: str | httpx.URL, **kwargs: Any) -> httpx.Response:
        return await self.request("PATCH", url, **kwargs)

    async def delete(self, url: str | httpx.URL, **kwargs: Any) -> httpx.Response:
        return await self.request("DELETE", url, **kwargs)

    def statistics(self) -> ClientStatistics:
        return self.transport.statistics()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        base_url = str(self.http.base_url)
        return f"<client_sdk.AsyncClient base_url={base_url!r} {self.transport.engine!r}>"
