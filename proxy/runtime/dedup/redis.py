"""The Redis dedup store: claims and results shared by every replica (coredis, native trio).

Theory of operation: one string key per scope, `{prefix}{scope}`:
  in flight: b"I" + owner token + b" " + fingerprint, with a PX lease (claimed
             atomically: SET NX PX inside a script that returns what is there instead);
  complete:  b"C" + msgpack(Stored), with a PX TTL.
Every step is one Lua script, so ownership checks and writes are atomic and
cost one round trip: complete/release succeed only while the caller's exact
in-flight value is there (a lapsed, re-claimed key is not touched), and publish
on `{prefix}done:{scope}` in the same script (C, or R + the reason). Refresh
extends all of a replica's live leases in one call.

Followers on this replica of a leader on another subscribe per scope on one
shared pub/sub connection (coredis PubSub), then re-read the record: the
subscription is a hint, the record the truth, so a message lost in a reconnect
only delays a follower until its re-check. coredis's PubSub dies with its
connection; `_notifications` supervises it: wakes every watcher, backs off,
reconnects and resubscribes. Every backend failure becomes `StoreUnavailable`.
A single Redis server (or a primary behind Sentinel's address) is assumed: the
refresh script touches many keys, which Redis Cluster would reject across slots.
"""

from __future__ import annotations

import logging
from typing import Any

import coredis
import msgspec
import trio
from coredis.exceptions import RedisError
from coredis.retry import NoRetryPolicy

from proxy.core.dedup import Record, State, Stored
from proxy.runtime.dedup.store import Signal, Signals, StoreUnavailable

log = logging.getLogger("rampmeter.dedup.redis")

_ERRORS = (RedisError, OSError, TimeoutError, ExceptionGroup)
CONNECT_TIMEOUT_S = 2.0
MAX_BACKOFF_S = 2.0

CLAIM = """
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
return false
"""
COMPLETE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('PUBLISH', ARGV[4], 'C')
return 1
"""
RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""
REFRESH = """
local lost = 0
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then redis.call('PEXPIRE', key, ARGV[1]) else lost = lost + 1 end
end
return lost
"""

_encode = msgspec.msgpack.Encoder().encode
_decode_stored = msgspec.msgpack.Decoder(Stored).decode


def in_flight_value(token: str, fingerprint: str) -> bytes:
    return f"I{token} {fingerprint}".encode()


def decode_record(value: bytes) -> Record:
    try:
        if value[:1] == b"I":
            token, fingerprint = value[1:].decode().split(" ", 1)
            return Record(State.IN_FLIGHT, fingerprint, token)
        if value[:1] == b"C":
            stored = _decode_stored(value[1:])
            return Record(State.COMPLETE, stored.fingerprint, "", stored)
    except (ValueError, msgspec.DecodeError):
        pass
    raise StoreUnavailable("unreadable idempotency record (another version's format?)")


class RedisStore:
    in_process = False

    def __init__(self, url: str, key_prefix: str) -> None:
        self._url = url
        self._prefix = key_prefix
        self._channel_prefix = f"{key_prefix}done:"
        self._client: coredis.Redis[bytes] | None = None
        self._pubsub: Any = None
        self._pubsub_up = trio.Event()  # replaced when the connection is lost
        self._signals = Signals()
        self._scripts: dict[str, Any] = {}
        self._reconnects = 0

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        # No retries inside coredis: the engine's deadline and breaker decide what a failure costs.
        client = coredis.Redis.from_url(self._url, retry_policy=NoRetryPolicy(), connect_timeout=CONNECT_TIMEOUT_S)
        async with client:  # connects lazily: a Redis that is down does not stop the sidecar starting
            self._scripts = {name: client.register_script(src) for name, src in _SCRIPTS.items()}
            self._client = client
            await _preload(client)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._notifications, client)
                    task_status.started()
            finally:
                self._client = None

    async def claim(self, scope: str, fingerprint: str, token: str, lease_ms: int) -> Record | None:
        found = await self._script("claim", [self._key(scope)], [in_flight_value(token, fingerprint), lease_ms])
        return None if found is None else decode_record(found)

    async def complete(self, scope: str, token: str, fingerprint: str, stored: Stored, ttl_s: float) -> bool:
        args = [
            in_flight_value(token, fingerprint),
            b"C" + _encode(stored),
            max(1, int(ttl_s * 1000)),
            self._channel(scope),
        ]
        return bool(await self._script("complete", [self._key(scope)], args))

    async def release(self, scope: str, token: str, fingerprint: str, reason: str) -> bool:
        args = [in_flight_value(token, fingerprint), self._channel(scope), b"R" + reason.encode()]
        return bool(await self._script("release", [self._key(scope)], args))

    async def refresh(self, claims: list[tuple[str, str, str]], lease_ms: int) -> int:
        keys = [self._key(scope) for scope, _, _ in claims]
        values = [in_flight_value(token, fp) for _, token, fp in claims]
        return int(await self._script("refresh", keys, [lease_ms, *values]))

    async def get(self, scope: str) -> Record | None:
        client = self._connected()
        try:
            value = await client.get(self._key(scope))
        except _ERRORS as exc:
            raise StoreUnavailable(f"redis: {exc}") from None
        return None if value is None else decode_record(value)

    async def watch(self, scope: str) -> Signal:
        signal, _ = self._signals.join(scope)
        try:
            if self._pubsub is None:  # (re)connecting: wait, within the caller's deadline
                await self._pubsub_up.wait()
            pubsub = self._pubsub
            if pubsub is None:
                raise StoreUnavailable("redis: notifications are not connected")
            # Every watcher waits for its own SUBSCRIBE acknowledgement (a repeat is a no-op in Redis),
            # so none re-reads the record before its notifications are flowing.
            await pubsub.subscribe(self._channel(scope))
        except BaseException as exc:
            self._signals.leave(scope, signal)
            if isinstance(exc, _ERRORS):
                raise StoreUnavailable(f"redis: {exc}") from None
            raise
        return signal

    async def unwatch(self, scope: str, signal: Signal) -> None:
        if self._signals.leave(scope, signal) and self._pubsub is not None:
            try:
                await self._pubsub.unsubscribe(self._channel(scope))
            except _ERRORS as exc:
                raise StoreUnavailable(f"redis: {exc}") from None

    async def _script(self, name: str, keys: list[Any], args: list[Any]) -> Any:
        self._connected()
        try:
            return await self._scripts[name](keys=keys, args=args)
        except _ERRORS as exc:
            raise StoreUnavailable(f"redis: {exc}") from None

    def _connected(self) -> coredis.Redis[bytes]:
        if self._client is None:
            raise StoreUnavailable("redis store is not running")
        return self._client

    def _key(self, scope: str) -> str:
        return self._prefix + scope

    def _channel(self, scope: str) -> str:
        return self._channel_prefix + scope

    async def _notifications(self, client: coredis.Redis[bytes]) -> None:
        """Keep one pub/sub connection alive; deliver messages to the watched scopes' signals."""
        backoff = 0.05
        while True:
            try:
                async with client.pubsub(ignore_subscribe_messages=True, retry_policy=NoRetryPolicy()) as pubsub:
                    if self._signals.by_name:
                        await pubsub.subscribe(*(self._channel(s) for s in self._signals.by_name))
                    self._pubsub, backoff = pubsub, 0.05
                    self._pubsub_up.set()
                    self._signals.fire_all()  # messages sent while we were away are lost: re-check
                    while True:
                        message = await pubsub.get_message()
                        if message is not None and message["type"] == "message":
                            self._deliver(message["channel"], message["data"])  # type: ignore[arg-type]  # a message's data is bytes or str
            except* (RedisError, OSError, TimeoutError) as group:
                # coredis raises its connection loss as an ExceptionGroup; except* also keeps a
                # concurrent Cancelled (teardown) propagating instead of swallowing the lot.
                log.debug("redis pub/sub connection lost: %r", group.exceptions[0])
            finally:
                self._pubsub = None
                if self._pubsub_up.is_set():
                    self._pubsub_up = trio.Event()
            self._reconnects += 1
            self._signals.fire_all()
            await trio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _deliver(self, channel: bytes | str, data: bytes | str) -> None:
        name = channel.decode() if isinstance(channel, bytes) else channel
        if name.startswith(self._channel_prefix):
            self._signals.fire(name[len(self._channel_prefix) :], data if isinstance(data, bytes) else data.encode())

    def statistics(self) -> dict[str, Any]:
        return {
            "store": "redis",
            "running": self._client is not None,
            "notifications_connected": self._pubsub is not None,
            "watched": len(self._signals.by_name),
            "pubsub_reconnects": self._reconnects,
        }

    def __repr__(self) -> str:
        return f"<RedisStore prefix={self._prefix!r} running={self._client is not None} watched={len(self._signals.by_name)}>"


_SCRIPTS = {"claim": CLAIM, "complete": COMPLETE, "release": RELEASE, "refresh": REFRESH}


async def _preload(client: coredis.Redis[bytes]) -> None:
    """Connect and load the scripts at start, best effort and bounded.

    Without it the first burst of requests after a start each opens a connection and
    meets NOSCRIPT before its EVAL; under store_timeout_ms they all time out together
    and fail open (tests/integration/test_dedup_e2e.py, the two-replica burst).
    """
    with trio.move_on_after(CONNECT_TIMEOUT_S):
        try:
            for src in _SCRIPTS.values():
                await client.script_load(src)
        except _ERRORS as exc:  # Redis down at start: scripts load on first use instead
            log.debug("redis: scripts not preloaded: %r", exc)
