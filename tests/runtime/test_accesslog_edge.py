"""The edge of the data path, in virtual time: request ids, x-rampmeter-class, the access line.

The real App (its `edge` in front of its request path) and the simulated pod in this
trio run, as in test_request_path_deadlines; requests enter through `app.edge`, the
data listener's handler.
"""

from __future__ import annotations

import json
import logging
import re

import pytest
import trio
import trio.testing

from proxy.http.messages import header_value
from tests.runtime.test_request_path_deadlines import CHAT, chat, policy, stack, start

HEX32 = re.compile(r"^[0-9a-f]{32}$")


def logged(**sections):
    """The test policy with the access log on (it is off by default), `access_log` keys on top."""
    return policy(**{**sections, "access_log": {"enabled": True, **sections.get("access_log", {})}})


def call(s, body: bytes, *headers: tuple[str, str], path: str = CHAT):
    hdrs = [(b"content-type", b"application/json"), *((k.encode(), v.encode()) for k, v in headers)]
    return start(s.nursery, s.app.edge, path, body, hdrs)


def upstream_ids(s) -> list[list[bytes]]:
    """The x-request-id values of each request the pod received."""
    return [[v for k, v in headers if k == b"x-request-id"] for headers in s.pool.forwarded]


@pytest.fixture
def access(caplog):
    caplog.set_level(logging.INFO, logger="rampmeter.access")

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "rampmeter.access"]

    return lines


def fields_of(line: str) -> dict[str, str]:
    """A text access line back into its fields (values without spaces, or JSON-quoted)."""
    assert line.startswith("request_id=")
    out = {}
    for match in re.finditer(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line):
        key, value = match.groups()
        out[key] = json.loads(value) if value.startswith('"') else value
    return out


async def test_a_request_without_an_id_gets_one_made_sent_upstream_and_returned(autojump_clock, access):
    async with stack(logged()) as s:
        pipe = call(s, chat(4))
        status, _ = await pipe.answer()
        rid = pipe.header("x-request-id")
        assert status == 200 and HEX32.match(rid)
        assert upstream_ids(s) == [[rid.encode()]]  # exactly one, the same
        assert pipe.header("x-rampmeter-class") == "interactive"
        (line,) = access()
        assert fields_of(line)["request_id"] == rid


async def test_the_callers_id_is_kept_and_a_malformed_one_replaced_not_refused(autojump_clock):
    async with stack(logged()) as s:
        kept = call(s, chat(2), ("x-request-id", "req-7f3a:b/9+c=@x"))
        assert (await kept.answer())[0] == 200
        assert kept.header("x-request-id") == "req-7f3a:b/9+c=@x"
        for bad in ('a"b', "has space", "x" * 129, "ünï"):
            pipe = call(s, chat(2), ("x-request-id", bad))
            assert (await pipe.answer())[0] == 200
            assert HEX32.match(pipe.header("x-request-id"))
        sent = upstream_ids(s)
        assert sent[0] == [b"req-7f3a:b/9+c=@x"]
        assert all(len(ids) == 1 and HEX32.match(ids[0].decode()) for ids in sent[1:])  # replaced, not added


async def test_every_rejection_body_names_the_request_and_the_class_that_refused_it(autojump_clock, access):
    async with stack(logged()) as s:
        pipe = call(s, chat(100), ("x-request-timeout-ms", "5"), ("x-request-id", "client-1"))
        status, body = await pipe.answer()
        assert (status, pipe.header("x-rampmeter-reason")) == (503, "deadline_unmeetable")
        err = json.loads(body)["error"]
        assert (err["code"], err["request_id"]) == ("deadline_unmeetable", "client-1")
        assert pipe.header("x-request-id") == "client-1" and pipe.header("x-rampmeter-class") == "interactive"
        assert int(pipe.header("content-length") or len(body)) == len(body)
        # A malformed header is refused before classification: the id, no class.
        bad = call(s, chat(2), ("x-request-timeout-ms", "soon"))
        status, body = await bad.answer()
        assert status == 400 and json.loads(body)["error"]["request_id"] == bad.header("x-request-id")
        assert bad.header("x-rampmeter-class") is None
        lines = [fields_of(line) for line in access()]
        assert [(f["status"], f["reason"], f["class"]) for f in lines] == [
            ("503", "deadline_unmeetable", "interactive"),
            ("400", "bad_request", "-"),
        ]


async def test_an_unknown_priority_learns_which_class_served_it(autojump_clock):
    async with stack(logged()) as s:
        pipe = call(s, chat(2), ("x-priority", "urgent!!"))
        assert (await pipe.answer())[0] == 200
        assert pipe.header("x-rampmeter-class") == "interactive"  # scheduling.default_class
        batch = call(s, chat(2), ("x-priority", "batch"))
        assert (await batch.answer())[0] == 200 and batch.header("x-rampmeter-class") == "batch"


async def test_the_access_line_has_every_field_of_a_served_request(autojump_clock, access):
    async with stack(logged(limit=1)) as s:
        first = call(s, chat(40))
        await trio.testing.wait_all_tasks_blocked()
        second = call(s, chat(4), ("x-priority", "batch"), ("authorization", "Bearer k1"))
        await first.answer()
        status, body = await second.answer()
        assert status == 200
        got = fields_of(access()[1])
        assert list(got) == [
            "request_id",
            "peer",
            "method",
            "path",
            "protocol",
            "class",
            "tenant",
            "cost",
            "queue_ms",
            "service_ms",
            "total_ms",
            "status",
            "reason",
            "upstream",
            "bytes_in",
            "bytes_out",
            "idempotency",
            "trace_id",
        ]
        assert (got["method"], got["path"], got["protocol"], got["class"]) == ("POST", CHAT, "HTTP/1.1", "batch")
        assert (got["status"], got["reason"], got["upstream"]) == ("200", "-", "pod.inproc:80")
        assert got["bytes_in"] == str(len(chat(4))) and got["bytes_out"] == str(len(body))
        assert int(got["cost"]) == s.app.scheduler.estimate(CHAT, chat(4)).units
        queue_ms, service_ms, total_ms = (float(got[k]) for k in ("queue_ms", "service_ms", "total_ms"))
        assert queue_ms > 100  # it waited for the long one, the only slot
        assert queue_ms + service_ms == pytest.approx(total_ms, abs=0.2)
        assert re.fullmatch(r"[0-9a-f]{12}", got["tenant"]) and "k1" not in access()[1]  # hashed


async def test_sampling_never_drops_a_failure_and_off_writes_nothing(autojump_clock, access):
    async with stack(logged(access_log={"sample_rate": 0.0})) as s:
        for _ in range(5):
            assert (await call(s, chat(2)).answer())[0] == 200
        await call(s, chat(100), ("x-request-timeout-ms", "5")).answer()
        assert [fields_of(line)["status"] for line in access()] == ["503"]
        assert s.app.edge.access_log.written == 1
    async with stack(logged(access_log={"enabled": False})) as s:
        await call(s, chat(100), ("x-request-timeout-ms", "5")).answer()
        assert s.app.edge.access_log.written == 0


async def test_a_sample_rate_between_writes_about_that_share(autojump_clock, access):
    async with stack(logged(access_log={"sample_rate": 0.25})) as s:
        for _ in range(200):
            assert (await call(s, chat(1)).answer())[0] == 200
        assert 25 <= s.app.edge.access_log.written <= 75  # binomial(200, 0.25): mean 50, sd 6


async def test_idempotency_outcomes_are_in_the_line(autojump_clock, access):
    async with stack(logged()) as s:
        key = ("idempotency-key", "order-9")
        assert (await call(s, chat(4), key).answer())[0] == 200
        replay = call(s, chat(4), key)
        assert (await replay.answer())[0] == 200 and replay.header("idempotent-replayed") == "true"
        assert replay.header("x-request-id") != header_value(s.pool.forwarded[0], b"x-request-id").decode()
        assert [fields_of(line)["idempotency"] for line in access()] == ["lead", "replay"]
        assert len(s.pool.forwarded) == 1


async def test_json_format_puts_the_fields_in_the_record(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="rampmeter.access")
    async with stack(logged()) as s:
        s.app.edge.access_log.json_format = True
        pipe = call(s, chat(2), ("x-request-id", "j-1"))
        await pipe.answer()
        (record,) = [r for r in caplog.records if r.name == "rampmeter.access"]
        assert record.getMessage() == f"POST {CHAT} 200"
        assert (record.request_id, record.status, record.path) == ("j-1", 200, CHAT)


async def test_text_and_json_lines_say_the_same_and_what_a_client_sends_is_quoted(autojump_clock, access):
    """The text line is written by hand for speed; it must agree with the JSON fields, field for field."""
    async with stack(logged(limit=1)) as s:
        log = s.app.edge.access_log
        seen = []
        write = log.write
        log.write = lambda ex, now, error=None: (seen.append((ex, now)), write(ex, now, error))
        first = call(s, chat(20))
        await trio.testing.wait_all_tasks_blocked()
        odd = call(s, chat(2), ("x-request-id", "q-1"), ("idempotency-key", "k"), path=CHAT + '/x"y z')
        refused = call(s, chat(100), ("x-request-timeout-ms", "5"))
        for pipe in (first, odd, refused):
            await pipe.answer()
        for ex, now in seen:
            as_json = {k: "-" if v is None else str(v) for k, v in log.fields(ex, now).items()}
            assert fields_of(log.text(ex, now)) == as_json
        assert len(seen) == 3 and {f["idempotency"] for f in map(fields_of, access())} == {"-", "lead"}
    bad = log.text(seen[0][0], seen[0][1]).replace("path=/v1/chat/completions", 'path="a b"')
    assert fields_of(bad)["path"] == "a b"  # quoted values read back whole


async def test_a_reload_turns_the_access_log_off_from_the_next_request(autojump_clock, access):
    from proxy.runtime.reload import PolicyVersion

    async with stack(logged()) as s:
        await call(s, chat(2)).answer()
        s.app.lifecycles.update_policy = lambda policy: None  # the stand-in lifecycles (always ready)
        s.app.apply_policy(logged(access_log={"enabled": False}), PolicyVersion("test", 2, "", 0.0))
        await call(s, chat(100), ("x-request-timeout-ms", "5")).answer()  # a rejection: logged only when on
        assert len(access()) == 1


async def test_batched_requests_get_a_line_each_with_their_own_id_and_the_batchs_service_time(autojump_clock, access):
    """The batcher may release a member's slot from another task: what a line says is noted in the member's own."""
    import msgspec

    from tests.runtime import test_batcher as tb

    pol = tb.policy()
    async with tb.stack(msgspec.structs.replace(pol, access_log=logged().access_log)) as s:
        pipes = []
        for i in range(3):
            hdrs = [(b"content-type", b"application/json"), (b"x-request-id", b"emb-%d" % i)]
            pipes.append(start(s.nursery, s.app.edge, tb.EMBED, tb.embed(f"text {i}"), hdrs))
            await trio.sleep(0.0001)
        for pipe in pipes:
            assert (await pipe.answer())[0] == 200
        assert len(s.pool.bodies) == 1  # one upstream call for the three
        lines = sorted((fields_of(line) for line in access()), key=lambda f: f["request_id"])
        assert [f["request_id"] for f in lines] == ["emb-0", "emb-1", "emb-2"]
        assert {f["upstream"] for f in lines} == {"pod.inproc:80"}
        assert all(f["service_ms"] != "-" and float(f["service_ms"]) > 0 for f in lines)
        assert [p.header("x-request-id") for p in pipes] == ["emb-0", "emb-1", "emb-2"]


async def test_a_flood_of_failures_is_bounded_to_max_lines_per_s_and_what_was_dropped_is_said(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="rampmeter.access")
    async with stack(logged(access_log={"max_lines_per_s": 10.0})) as s:
        for _ in range(30):  # at one instant: a burst of 10 lines, then nothing
            await call(s, chat(2), ("x-request-timeout-ms", "soon")).answer()
        log = s.app.edge.access_log
        assert (log.written, log.suppressed) == (10, 20)
        await trio.sleep(0.5)  # 5 tokens back
        for _ in range(6):
            await call(s, chat(2), ("x-request-timeout-ms", "soon")).answer()
        assert (log.written, log.suppressed) == (15, 21)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == ["20 access lines dropped over access_log.max_lines_per_s (10)"]


async def test_off_by_default(autojump_clock, access):
    async with stack(policy()) as s:
        await call(s, chat(100), ("x-request-timeout-ms", "5")).answer()
        assert access() == [] and s.app.edge.access_log.written == 0


async def test_request_ids_are_vouched_for_to_the_h1_writer_while_their_request_lives(autojump_clock):
    """A made or kept id skips h1write's check only while its request is in the edge: the known set
    does not fill with one id a request (issue 16), and a head written later checks it as any other."""
    from proxy.http import h1write

    async with stack(logged()) as s:
        before = len(h1write._KNOWN)
        seen_during: list[bool] = []
        inner = s.app.edge.inner

        async def spy(request, sink, fields):
            seen_during.append((b"x-request-id", fields.request_id) in h1write._KNOWN)
            await inner(request, sink, fields)

        s.app.edge.inner = spy
        ids = []
        for given in (None, "req-7f3a:b/9+c=@x", "has space"):
            pipe = call(s, chat(2), *([("x-request-id", given)] if given else []))
            assert (await pipe.answer())[0] == 200
            ids.append(pipe.header("x-request-id").encode())
        assert seen_during == [True, True, True]  # made, kept, and made for a malformed one
        assert not any((b"x-request-id", rid) in h1write._KNOWN for rid in ids)  # forgotten once answered
        assert len(h1write._KNOWN) == before  # nothing left behind (no HTTP/1.1 heads are written in this stack)
        # Not vouched for, a pair is checked as any other: a bad one still raises.
        with pytest.raises(h1write.FieldError):
            h1write.response_head(200, [(b"x-request-id", b"a\r\nb")])
