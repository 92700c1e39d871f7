"""HPACK encoder and decoder that remember header blocks they have already coded.

Why: against a trivial upstream, hpack's decoding (Huffman decoding of the
`date` and `server` values, ~30 debug-log calls) and encoding of the same
request head are a fifth of the load generator's CPU per h2c request. Most
blocks repeat byte for byte: a client sends the same head every time and, once
its fields are in the dynamic table, encodes it to the same indexed bytes; a
server answers with the same status and headers (nginx changes `date` once a
second). No maintained HPACK library offers this; it is a cache in front of
hpack's own coder, which still does all the coding.

Exactness: a coded block depends only on its input and the dynamic table, so
the tables here count every change (`VersionedHeaderTable.version`: an added
entry or a new maximum size; adding to an empty table too small for the entry
changes nothing, and nginx does exactly that on every response once it has
sized its table 0). A result is remembered only when coding it left
the table unchanged, and is reused only while the table is at that same
version and the decoder's limits are the ones it was checked against. A block
that adds to the table, or a pending table-size update, always goes to hpack,
and so does a head with hpack's `HeaderTuple` kinds (a never-indexed field
compares equal to a plain tuple). Anything that raised is not remembered, so it raises again.

Fields whose value changes from one block to the next (grpc-timeout, x-request-id, the
sidecar's own x-rampmeter-queue-ms, a jittered retry-after-ms) would defeat that: every block
is new, and hpack indexes each new value, evicting the stable entries. So the encoder learns
which names carry changing values (`VOLATILE_AFTER` changes seen on memo misses; at most
MAX_VOLATILE names) and from then on codes their fields as literals without indexing (RFC
7541 6.2.2, raw strings) where they stand; the runs of other fields between them go through
the memo as before (a block is a sequence of independent field instructions, so the runs'
codes concatenate). A literal without indexing leaves the table as it is, so the memo's
exactness holds, and the fields keep their order (gRPC metadata order is visible to clients).

`install(conn)` swaps these into an `h2.connection.H2Connection` before it has
coded any headers (h2 creates its coder in `__init__` and only ever reads the
attributes this keeps). The sidecar's h2c server and upstream client install
it as the load generator does: clients repeat their heads (h2load, gRPC, the
OpenAI SDK over h2), and so do model servers.
"""

from __future__ import annotations

from typing import Any

import hpack
from hpack.hpack import encode_integer
from hpack.table import HeaderTable, table_entry_size

# Bounds per coder (one encoder and one decoder per connection): the oldest remembered block goes first.
MAX_ENTRIES = 16
MAX_BLOCK_BYTES = 1024  # longer blocks are not remembered: at worst ~32 KiB per coder (blocks + fields)
VOLATILE_AFTER = 2  # value changes of one name (seen on memo misses) after which it is coded as a literal
MAX_VOLATILE = 16  # names an encoder treats so (the values it watches: at most MAX_WATCHED names)
MAX_WATCHED = 64

# RFC 7541 appendix A: a name's first static-table index, for "literal without indexing, indexed name".
_STATIC_NAME: dict[bytes, int] = {}
for _index, (_name, _) in enumerate(HeaderTable.STATIC_TABLE, start=1):
    _STATIC_NAME.setdefault(_name, _index)


def _literal(name: bytes, value: bytes) -> bytes:
    """One field as a literal without indexing (RFC 7541 6.2.2), strings raw (no Huffman)."""
    index = _STATIC_NAME.get(name)  # first byte 0000xxxx: the name's index, or 0 and the name as a string
    out = encode_integer(index, 4) if index is not None else bytearray(b"\x00") + encode_integer(len(name), 7) + name
    out += encode_integer(len(value), 7)
    out += value
    return bytes(out)


_NAME_CODES: dict[bytes, bytes] = {}  # a volatile name's part of its literal (at most MAX_VOLATILE per encoder)


def _literal_fast(name: bytes, value: bytes) -> bytes:
    """`_literal`, with the name's part remembered and a short value's length as its one byte
    (a 7-bit prefix holds up to 126): a volatile field is coded on every block that carries it."""
    prefix = _NAME_CODES.get(name)
    if prefix is None:
        if len(_NAME_CODES) >= 4 * MAX_VOLATILE:
            _NAME_CODES.clear()
        prefix = _NAME_CODES[name] = _literal(name, b"")[:-1]
    size = len(value)
    if size < 127:
        return prefix + bytes((size,)) + value
    return _literal(name, value)


class VersionedHeaderTable(HeaderTable):
    """hpack's table, counting its changes."""

    def __init__(self) -> None:
        super().__init__()
        self.version = 0

    def add(self, name: bytes, value: bytes) -> None:
        if self.dynamic_entries or table_entry_size(name, value) <= self._maxsize:
            self.version += 1  # else a no-op: nginx indexes into a table it sized 0
        super().add(name, value)

    @HeaderTable.maxsize.setter  # type: ignore[attr-defined]
    def maxsize(self, newmax: int) -> None:
        if int(newmax) != self._maxsize:
            self.version += 1
        HeaderTable.maxsize.fset(self, newmax)  # type: ignore[attr-defined]


class MemoEncoder(hpack.Encoder):
    def __init__(self) -> None:
        super().__init__()
        self.header_table: VersionedHeaderTable = VersionedHeaderTable()
        self._memo: dict[tuple, tuple[int, bytes]] = {}
        self.hits = self.misses = 0
        self.volatile: set[bytes] = set()  # names whose fields go as literals (module doc)
        self._last: dict[bytes, bytes] = {}  # each watched name's value in the last missed block
        self._changes: dict[bytes, int] = {}

    def encode(self, headers: Any, huffman: bool = True) -> bytes:
        table = self.header_table
        if table.resized or isinstance(headers, dict):
            return super().encode(headers, huffman)
        items = tuple(headers)
        volatile = self.volatile
        mixed = False
        for field in items:  # one pass for both checks
            if type(field) is not tuple:  # HeaderTuple kinds compare equal to plain tuples
                return super().encode(items, huffman)
            if field[0] in volatile:
                mixed = True
        if mixed:
            # In order: runs of the other fields through the memo, each volatile field a literal.
            out: list[bytes] = []
            run: list[tuple[bytes, bytes]] = []
            for field in items:
                if field[0] in volatile:
                    if run:
                        out.append(self._memo_encode(tuple(run), huffman))
                        run = []
                    out.append(_literal_fast(*field))
                else:
                    run.append(field)
            if run:
                out.append(self._memo_encode(tuple(run), huffman))
            return b"".join(out)
        return self._memo_encode(items, huffman)

    def _watch(self, items: tuple) -> None:
        """On a miss: count value changes per regular name; past VOLATILE_AFTER the name is volatile."""
        last, changes = self._last, self._changes
        for name, value in items:
            if name[:1] == b":":
                continue
            before = last.get(name)
            if before is None:
                if len(last) < MAX_WATCHED:
                    last[name] = value
            elif before != value:
                last[name] = value
                n = changes[name] = changes.get(name, 0) + 1
                if n >= VOLATILE_AFTER and len(self.volatile) < MAX_VOLATILE:
                    self.volatile.add(name)

    def _memo_encode(self, items: tuple, huffman: bool) -> bytes:
        table = self.header_table
        key = (items, huffman)
        hit = self._memo.get(key)
        if hit is not None and hit[0] == table.version:
            self.hits += 1
            return hit[1]
        self.misses += 1
        self._watch(items)
        before = table.version
        block = super().encode(items, huffman)
        if table.version == before and len(block) <= MAX_BLOCK_BYTES:
            _remember(self._memo, key, (before, block))
        return block


class MemoDecoder(hpack.Decoder):
    def __init__(self, max_header_list_size: int = hpack.hpack.DEFAULT_MAX_HEADER_LIST_SIZE) -> None:
        super().__init__(max_header_list_size)
        self.header_table: VersionedHeaderTable = VersionedHeaderTable()
        self._memo: dict[tuple, tuple[tuple, list]] = {}
        self.hits = self.misses = 0

    def decode(self, data: bytes, raw: bool = False) -> Any:
        if len(data) > MAX_BLOCK_BYTES:
            return super().decode(data, raw)
        data = bytes(data)
        state = (self.header_table.version, self.max_header_list_size, self.max_allowed_table_size)
        hit = self._memo.get((data, raw))
        if hit is not None and hit[0] == state:
            self.hits += 1
            return list(hit[1])
        self.misses += 1
        headers = super().decode(data, raw)
        if self.header_table.version == state[0]:
            _remember(self._memo, (data, raw), (state, list(headers)))
        return headers


def _remember(memo: dict, key: Any, value: Any) -> None:
    if len(memo) >= MAX_ENTRIES:
        del memo[next(iter(memo))]  # the oldest (dicts keep insertion order)
    memo[key] = value


def install(conn: Any) -> bool:
    """Give h2 connection `conn` a MemoEncoder and MemoDecoder with the same settings.

    Only before it has coded a header (both tables empty and never resized by the
    peer); answers whether it did."""
    enc, dec = conn.encoder, conn.decoder
    if enc.header_table.dynamic_entries or dec.header_table.dynamic_entries or enc.header_table.resized:
        return False
    new_enc, new_dec = MemoEncoder(), MemoDecoder(dec.max_header_list_size)
    new_enc.header_table.maxsize = enc.header_table.maxsize
    new_enc.header_table.resized = False
    new_dec.header_table.maxsize = dec.header_table.maxsize
    new_dec.max_allowed_table_size = dec.max_allowed_table_size
    conn.encoder, conn.decoder = new_enc, new_dec
    return True
