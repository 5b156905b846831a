"""The Python client against a real gateway and daemon.

Run by clients/python/python-client.kvm.test.ts, which starts the gateway and gives its URL and
keys: SANDFORK_URL, SANDFORK_API_KEY (a key with credits), SANDFORK_POOR_API_KEY (a key of an
account without credits); SANDFORK_TEST_TIME_SCALE scales the waits (1 native, ~15 in QEMU).
The server_sent_events tests need no gateway.
"""

from __future__ import annotations

import json
import os
import time
import unittest
import uuid
from collections.abc import Callable
from typing import Any, cast

from sandfork import (
    Execution,
    NetworkRequest,
    RichResult,
    Sandfork,
    SandforkError,
    StreamEvent,
    decode_result,
    server_sent_events,
)

SCALE = float(os.environ.get("SANDFORK_TEST_TIME_SCALE", "1"))
TICKS = "import time\nfor i in range(5):\n    print('tick', i, flush=True)\n    time.sleep(0.1)\n"


def gateway(key_variable: str = "SANDFORK_API_KEY") -> Sandfork:
    return Sandfork(os.environ["SANDFORK_URL"], os.environ[key_variable], timeout=60 * SCALE)


def without_results(execution: Execution) -> Execution:
    kept = dict(execution)
    kept.pop("results", None)
    return cast(Execution, kept)


class ServerSentEventsTest(unittest.TestCase):
    def test_fields_comments_line_ends_and_multi_line_data(self) -> None:
        body = [
            b": a comment\n",
            b"event: started\n",
            b'data: {"id": "1"}\n',
            b"\n",
            b"event: output\r\n",
            b"data:one\r\n",
            b"data: two\r\n",
            b"\r\n",
            b"data: no event name\n",
        ]
        self.assertEqual(
            list(server_sent_events(iter(body))),
            [("started", '{"id": "1"}'), ("output", "one\ntwo"), ("message", "no event name")],
        )

    def test_decode_result(self) -> None:
        png: RichResult = {"type": "image/png", "data": "iVBORw0KGgo="}
        self.assertEqual(decode_result(png), b"\x89PNG\r\n\x1a\n")
        html: RichResult = {"type": "text/html", "data": "<table></table>"}
        self.assertEqual(decode_result(html), b"<table></table>")


class GatewayTest(unittest.TestCase):
    def setUp(self) -> None:
        if "SANDFORK_URL" not in os.environ:
            self.fail("no gateway: run python-client.kvm.test.ts, or set SANDFORK_URL and the keys")
        self.sandfork = gateway()

    def test_execute(self) -> None:
        run = self.sandfork.execute(
            "python",
            "import sys\nprint(6*7, sys.argv[1:], sys.stdin.read(), open('/work/in.txt').read())",
            stdin="from stdin",
            args=["a", "b"],
            files=[{"path": "in.txt", "content": "from a file"}],
        )
        self.assertEqual(run["status"], "completed")
        self.assertEqual(run["exit_code"], 0)
        self.assertEqual(run["stdout"], "42 ['a', 'b'] from stdin from a file\n")
        self.assertGreater(run["usage"]["units"] or 0, 0)
        # GET answers the stored record: the run's results are not kept.
        self.assertEqual(self.sandfork.execution(run["id"]), without_results(run))
        failed = self.sandfork.execute("python", "raise SystemExit(3)")
        self.assertEqual((failed["status"], failed["exit_code"]), ("completed", 3))

    def test_rich_results_and_output_files(self) -> None:
        with self.sandfork.create_session("python") as session:
            session.run("class Table:\n    def _repr_html_(self):\n        return '<b>7</b>'\n")
            cell = session.run("Table()")
            types = [result["type"] for result in cell["results"]]
            self.assertIn("text/html", types, cell)
            html = next(r for r in cell["results"] if r["type"] == "text/html")
            self.assertEqual(decode_result(html), b"<b>7</b>")
            plain = session.run("6 * 7")["results"]
            self.assertEqual(plain[-1], {"type": "text/plain", "data": "42"})
        run = self.sandfork.execute(
            "python",
            "import os\nos.makedirs('/work/out/plots', exist_ok=True)\n"
            "open('/work/out/plots/data.bin', 'wb').write(bytes(range(256)))\n",
        )
        files = run.get("files", [])
        self.assertEqual([(f["path"], f["size"]) for f in files], [("plots/data.bin", 256)], run)
        url = files[0]["url"]
        assert url is not None, files
        self.assertEqual(self.sandfork.file(url), bytes(range(256)))
        with self.assertRaises(SandforkError) as refused:
            gateway("SANDFORK_POOR_API_KEY").file(url)  # another account's key
        self.assertEqual(refused.exception.status, 404)

    def test_idempotency_key_bills_a_retry_once(self) -> None:
        key = str(uuid.uuid4())
        first = self.sandfork.execute("python", "print(1)", idempotency_key=key)
        again = self.sandfork.execute("python", "print(1)", idempotency_key=key)
        self.assertEqual(again["id"], first["id"])

    def test_stream(self) -> None:
        seen: list[tuple[StreamEvent, float]] = []
        sent = time.monotonic()
        for event in self.sandfork.stream("python", TICKS):
            seen.append((event, time.monotonic() - sent))
        events = [event for event, _ in seen]
        started, last = events[0], events[-1]
        assert started["event"] == "started" and last["event"] == "execution", events
        execution = last["execution"]
        self.assertEqual(execution["id"], started["id"])
        self.assertEqual(execution["stdout"], "tick 0\ntick 1\ntick 2\ntick 3\ntick 4\n")
        outputs = [(event, at) for event, at in seen if event["event"] == "output"]
        text = "".join(e["data"] for e, _ in outputs if e["event"] == "output")
        self.assertEqual(text, execution["stdout"])
        # Five lines 100 ms apart: the first arrives ~400 ms before the end, not with it.
        self.assertGreater(seen[-1][1] - outputs[0][1], 0.25, [(e["event"], at) for e, at in seen])
        self.assertEqual(self.sandfork.execution(execution["id"]), without_results(execution))

    def test_templates(self) -> None:
        python = next(t for t in self.sandfork.templates() if t["name"] == "python")
        self.assertTrue(python["ready"])
        self.assertEqual(python["languages"], ["python"])

    def test_session_keeps_state_across_cells_pause_resume_fork_and_files(self) -> None:
        with self.sandfork.create_session("python", idle_timeout_s=600) as session:
            self.assertEqual(session.info["state"], "running")
            first = session.run("x = 41")
            self.assertEqual((first["value"], first["error"]), (None, None))
            second = session.run("print('adding')\nx + 1")
            self.assertEqual(second["value"], "42")
            self.assertEqual(second["execution"]["stdout"], "adding\n")
            self.assertEqual(session.info["cells"], 2)
            missing = session.run("y")
            self.assertEqual(missing["value"], None)
            error = missing["error"]
            self.assertEqual(None if error is None else error["name"], "NameError")

            data = bytes(range(256))
            written = session.write_file("data/all.bin", data)
            self.assertEqual(written, {"path": "data/all.bin", "bytes": 256})
            length = session.run("len(open('/work/data/all.bin', 'rb').read())")
            self.assertEqual(length["value"], "256")
            session.run("open('/work/out.txt', 'w').write('from the cell')")
            self.assertEqual(session.read_file("out.txt"), b"from the cell")
            session.delete_file("out.txt")
            with self.assertRaises(SandforkError) as gone:
                session.read_file("out.txt")
            self.assertEqual(gone.exception.status, 404)

            paused = session.pause()
            self.assertEqual(paused["session"]["state"], "paused")
            self.assertEqual(len(paused["sha256"]), 64)
            self.assertEqual(session.resume()["state"], "running")
            session.pause()
            resumed = session.run("x * 2")
            self.assertEqual((resumed["value"], resumed["resumed"]), ("82", True))

            taken = session.checkpoint()
            with session.fork(taken["checkpoint"]) as fork:
                self.assertNotEqual(fork.id, session.id)
                fork.run("x = 0")
                self.assertEqual(fork.run("x + 1")["value"], "1")
            self.assertEqual(fork.info["state"], "deleted")
            copies = session.fork(taken["checkpoint"], count=3)
            self.assertEqual(len({copy.id for copy in copies} - {session.id}), 3)
            for copy in copies:  # each its own x: one that saw another's change answers 43
                self.assertEqual(copy.run("x += 1\nx")["value"], "42")
                self.assertEqual(copy.delete()["state"], "deleted")
            self.assertEqual(session.run("x + 1")["value"], "42")
            self.assertIn(session.id, [s["id"] for s in self.sandfork.sessions()])
            self.assertEqual(self.sandfork.session(session.id).info["cells"], session.info["cells"])
        self.assertEqual(session.info["state"], "deleted")
        with self.assertRaises(SandforkError) as deleted:
            self.sandfork.session(session.id)
        self.assertEqual((deleted.exception.status, deleted.exception.slug), (404, "not-found"))

    def test_session_saved_as_a_template(self) -> None:
        name = f"prepared-{uuid.uuid4().hex[:8]}"
        with self.sandfork.create_session("python") as session:
            session.run("import fractions\nbase = 40\nopen('/work/kept.txt', 'w').write('kept')")
            saved = session.save_template(name, description="base = 40")
            self.assertEqual(
                (saved["name"], saved["version"], saved["status"], saved["from_session"]),
                (name, "1", "ready", session.id),
            )
            self.assertEqual(saved["description"], "base = 40")
            ran = self.sandfork.execute(
                f"{name}@1", "print(base + 2, open('/work/kept.txt').read(), fractions.Fraction(1, 2))"
            )
            self.assertEqual(ran["stdout"], "42 kept 1/2\n")
            second = session.save_template(name)
            self.assertEqual(second["version"], "2")
            with self.assertRaises(SandforkError) as taken:
                session.save_template(name, version="1")
            self.assertEqual(taken.exception.slug, "template-version-exists")

    def test_problems_are_typed_errors(self) -> None:
        poor = gateway("SANDFORK_POOR_API_KEY")
        with self.assertRaises(SandforkError) as short:
            poor.execute("python", "print(1)")
        self.assertEqual(
            (short.exception.status, short.exception.slug), (402, "insufficient-credits")
        )
        self.assertFalse(short.exception.retryable)
        with self.assertRaises(SandforkError) as streamed:
            next(poor.stream("python", "print(1)"))
        self.assertEqual(streamed.exception.slug, "insufficient-credits")
        with self.assertRaises(SandforkError) as unknown:
            self.sandfork.execute("no-such-template", "print(1)")
        self.assertEqual(unknown.exception.status // 100, 4)
        with self.assertRaises(SandforkError) as invalid:
            self.sandfork.execute("python", "print(1)", timeout_ms=0)
        self.assertEqual(
            (invalid.exception.status, invalid.exception.slug), (422, "validation-failed")
        )
        # This suite's key has no network policy: asking for network is refused, on every call.
        allow: NetworkRequest = {"allow": ["example.com:443"], "max_connections": 1}
        refusals: list[Callable[[], object]] = [
            lambda: self.sandfork.execute("python", "print(1)", network=allow),
            lambda: next(self.sandfork.stream("python", "print(1)", network=allow)),
        ]
        with self.sandfork.create_session("python") as session:
            refusals.append(lambda: session.run("print(1)", network=allow))
            for refusal in refusals:
                with self.assertRaises(SandforkError) as no_policy:
                    refusal()
                self.assertEqual(
                    (no_policy.exception.status, no_policy.exception.slug),
                    (403, "network-not-allowed"),
                )
                self.assertFalse(no_policy.exception.retryable)
        with self.assertRaises(SandforkError) as anonymous:
            Sandfork(os.environ["SANDFORK_URL"], "sfk_not_a_key").templates()
        self.assertEqual(anonymous.exception.status, 401)

    def test_agent_tools_keep_state_in_a_session(self) -> None:
        names = [tool["function"]["name"] for tool in self.sandfork.tools("openai")]
        self.assertIn("run_cell", names)
        self.assertEqual([t["name"] for t in self.sandfork.tools("anthropic")], names)

        def openai(name: str, arguments: str) -> dict[str, Any]:
            function = {"name": name, "arguments": arguments}
            call = {"id": f"call_{name}", "type": "function", "function": function}
            message = self.sandfork.tool_call(call)
            self.assertEqual(message["tool_call_id"], f"call_{name}")
            return cast(dict[str, Any], json.loads(message["content"]))

        session_id = openai("open_session", '{"language": "python"}')["session_id"]
        openai("run_cell", '{"session_id": "%s", "code": "x = 41"}' % session_id)
        cell = {"session_id": session_id, "code": "x + 1"}
        block = self.sandfork.tool_call(
            {"type": "tool_use", "id": "toolu_1", "name": "run_cell", "input": cell}
        )
        self.assertFalse(block["is_error"], block)
        self.assertIn('"value":"42"', block["content"])
        closed = openai("close_session", '{"session_id": "%s"}' % session_id)
        self.assertEqual(closed["state"], "deleted")


if __name__ == "__main__":
    unittest.main()
