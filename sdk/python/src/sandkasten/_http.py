"""The HTTP layer over httpx, sync (`Transport`) and async (`AsyncTransport`): the base URL and bearer key (arguments,
else SANDKASTEN_URL and SANDKASTEN_API_KEY), requests made only from an `Operation` of `_operations.OPERATIONS`,
error answers turned into exceptions (errors.py), and event streams turned into `SseEvent`s. Calls that wait for
something to run (exec, code, runs, streams) have no read timeout: the server bounds them by the sandbox's limits."""

from __future__ import annotations

import os
from typing import Any, AsyncIterator, Dict, Iterator, Mapping, Optional, Set, Tuple

import httpx

from ._operations import Operation
from ._streams import SseEvent, SseParser
from .errors import ProtocolError, error_from_body

__version__ = "0.1.0"

#: Default seconds for connecting and for calls that do not wait on a program.
DEFAULT_TIMEOUT = 60.0

#: (surface, operation name) of every request made in this process, surface "sync" or "async" (the SDK's test suite
#: checks that it exercised every operation on both).
CALLED: Set[Tuple[str, str]] = set()

Params = Optional[Mapping[str, Any]]


def resolve(url: Optional[str], api_key: Optional[str]) -> "tuple[str, str]":
    """The base URL and key: the arguments, else SANDKASTEN_URL / SANDKASTEN_API_KEY, else an error saying so."""
    url = url or os.environ.get("SANDKASTEN_URL") or "http://127.0.0.1:8080"
    api_key = api_key or os.environ.get("SANDKASTEN_API_KEY")
    if not api_key:
        raise ValueError("no API key: pass api_key= or set SANDKASTEN_API_KEY (a tenant key of the server's config)")
    return url.rstrip("/"), api_key


def _headers(api_key: str) -> Dict[str, str]:
    return {"Authorization": f"Bearer {api_key}", "User-Agent": f"sandkasten-python/{__version__}"}


def _timeout(base: float, long: bool) -> httpx.Timeout:
    return httpx.Timeout(base, read=None) if long else httpx.Timeout(base)


def _clean(params: Params) -> Optional[Dict[str, Any]]:
    if params is None:
        return None
    cleaned = {}
    for key, value in params.items():
        if value is None:
            continue
        cleaned[key] = ("true" if value else "false") if isinstance(value, bool) else value
    return cleaned


def _check(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        raise error_from_body(response.status_code, response.content, body)
    return response


def json_of(response: httpx.Response) -> Any:
    """The response's JSON body, or ProtocolError."""
    try:
        return response.json()
    except ValueError:
        raise ProtocolError("protocol", f"expected JSON, got {response.text[:200]!r}", response.status_code) from None


class Transport:
    """Sync requests to one server with one key."""

    def __init__(self, url: Optional[str], api_key: Optional[str], timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url, key = resolve(url, api_key)
        self.api_key = key
        self.timeout = timeout
        self._http = httpx.Client(base_url=self.url, headers=_headers(key), timeout=timeout)

    def request(
        self,
        operation: Operation,
        path: Mapping[str, str],
        *,
        params: Params = None,
        json: Any = None,
        content: Optional[bytes] = None,
        headers: Optional[Dict[str, str]] = None,
        long: bool = False,
    ) -> httpx.Response:
        CALLED.add(("sync", operation.name))
        response = self._http.request(
            operation.method,
            operation.url_path(**path),
            params=_clean(params),
            json=json,
            content=content,
            headers=headers,
            timeout=_timeout(self.timeout, long),
        )
        return _check(response)

    def stream(
        self,
        operation: Operation,
        path: Mapping[str, str],
        *,
        params: Params = None,
        json: Any = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> Iterator[SseEvent]:
        CALLED.add(("sync", operation.name))
        all_headers = {"Accept": "text/event-stream", **(headers or {})}
        request = self._http.build_request(
            operation.method,
            operation.url_path(**path),
            params=_clean(params),
            json=json,
            headers=all_headers,
            timeout=_timeout(self.timeout, True),
        )
        response = self._http.send(request, stream=True)
        try:
            if response.status_code >= 400:
                response.read()
                _check(response)
            parser = SseParser()
            for line in response.iter_lines():
                event = parser.feed(line)
                if event is not None:
                    yield event
        finally:
            response.close()

    def sibling(self) -> Transport:
        """A new transport to the same server with the same key (for a sandbox that closes its own)."""
        return Transport(self.url, self.api_key, self.timeout)

    def close(self) -> None:
        self._http.close()


class AsyncTransport:
    """Async requests to one server with one key."""

    def __init__(self, url: Optional[str], api_key: Optional[str], timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url, key = resolve(url, api_key)
        self.api_key = key
        self.timeout = timeout
        self._http = httpx.AsyncClient(base_url=self.url, headers=_headers(key), timeout=timeout)

    async def request(
        self,
        operation: Operation,
        path: Mapping[str, str],
        *,
        params: Params = None,
        json: Any = None,
        content: Optional[bytes] = None,
        headers: Optional[Dict[str, str]] = None,
        long: bool = False,
    ) -> httpx.Response:
        CALLED.add(("async", operation.name))
        response = await self._http.request(
            operation.method,
            operation.url_path(**path),
            params=_clean(params),
            json=json,
            content=content,
            headers=headers,
            timeout=_timeout(self.timeout, long),
        )
        return _check(response)

    async def stream(
        self,
        operation: Operation,
        path: Mapping[str, str],
        *,
        params: Params = None,
        json: Any = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> AsyncIterator[SseEvent]:
        CALLED.add(("async", operation.name))
        all_headers = {"Accept": "text/event-stream", **(headers or {})}
        request = self._http.build_request(
            operation.method,
            operation.url_path(**path),
            params=_clean(params),
            json=json,
            headers=all_headers,
            timeout=_timeout(self.timeout, True),
        )
        response = await self._http.send(request, stream=True)
        try:
            if response.status_code >= 400:
                await response.aread()
                _check(response)
            parser = SseParser()
            async for line in response.aiter_lines():
                event = parser.feed(line)
                if event is not None:
                    yield event
        finally:
            await response.aclose()

    def sibling(self) -> AsyncTransport:
        """A new transport to the same server with the same key (for a sandbox that closes its own)."""
        return AsyncTransport(self.url, self.api_key, self.timeout)

    async def close(self) -> None:
        await self._http.aclose()
