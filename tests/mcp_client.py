"""A real MCP client (the official Python SDK, `mcp` on PyPI) driving
`layerfs serve --mcp` over stdio: initialize, list the tools, call each,
and check the error cases. Driven by tests/it/agent_mcp.rs.

usage: mcp_client.py MODE [--expect NAME=CONTENT] -- LAYERFS SERVE-ARGS...
MODE: full (every file tool and error case), state (diff, log, reset,
snapshots, checkpoints, undo, raw reads), readonly (only the reading
tools are offered), execute (commands in the workspace's sandbox), fork
(diff of a fork against each base: its checkpoint holds base.txt and
a.txt = "alpha\n", the fork adds fork.txt) or list (only the tools
line).
The workspace holds a.txt = "alpha\nbeta\nalpha\n", src/main.rs and
bin.dat (bytes 0..=255 twice), and its policy makes src/** read-only. Prints a transcript
(one JSON object a line) and OK at the end; any failed check raises.
"""

import asyncio
import base64
import json
import sys
import time

from mcp import ClientSession, StdioServerParameters, stdio_client

READING = {"ls", "read", "grep", "glob", "stat"}
STATE_READING = {"diff", "log", "snapshot_list", "checkpoint_list"}
STATE_CHANGING = {"reset", "snapshot_save", "snapshot_restore", "checkpoint", "undo"}
ALL = READING | STATE_READING | STATE_CHANGING | {"write", "edit", "delete", "rename", "mkdir", "execute"}


def show(kind, **fields):
    print(json.dumps({"kind": kind, **fields}), flush=True)


def text_of(result):
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def call(session, name, args, ok=True):
    """One call; ok None: a protocol error is expected (bad arguments)."""
    if ok is None:
        try:
            result = await session.call_tool(name, args)
        except Exception as e:  # the SDK raises on a protocol error
            show("call", tool=name, arguments=args, protocol_error=str(e)[:300])
            return None, str(e)
        raise AssertionError(f"{name} {args}: answered {text_of(result)}")
    result = await session.call_tool(name, args)
    text = text_of(result)
    show("call", tool=name, arguments=args, is_error=result.is_error, text=text[:300])
    assert result.is_error != ok, f"{name} {args}: is_error={result.is_error}: {text}"
    return result, text


async def full(session, expect):
    r, t = await call(session, "ls", {"path": "/"})
    names = [e["path"] for e in r.structured_content["entries"]]
    assert "a.txt" in names and "src" in names, names

    r, t = await call(session, "read", {"path": "a.txt", "offset": 1, "limit": 1})
    assert t.startswith("     2\tbeta"), t
    assert r.structured_content["truncated"] is True

    r, t = await call(session, "write", {"path": "notes/new.txt", "content": "x"}, ok=False)
    assert "no such file" in t, t
    await call(session, "mkdir", {"path": "notes/deep", "parents": True})
    await call(session, "write", {"path": "notes/new.txt", "content": "one\ntwo\n"})
    r, t = await call(session, "write", {"path": "notes/new.txt", "content": "x"}, ok=False)
    assert "notes/new.txt" in t and "already exists" in t, t
    assert r.structured_content["error"]["kind"] == "exists"
    await call(session, "write", {"path": "notes/new.txt", "content": "uno\n", "overwrite": True})

    r, t = await call(session, "edit", {"path": "a.txt", "old_string": "zzz", "new_string": "y"}, ok=False)
    assert "0 matches" in t, t
    r, t = await call(session, "edit", {"path": "a.txt", "old_string": "alpha", "new_string": "y"}, ok=False)
    assert "2 times" in t, t
    assert r.structured_content["error"]["kind"] == "matches"
    r, t = await call(session, "edit", {"path": "a.txt", "old_string": "beta", "new_string": "gamma"})
    assert r.structured_content["replacements"] == 1
    r, t = await call(session, "edit", {"path": "a.txt", "old_string": "alpha", "new_string": "omega", "replace_all": True})
    assert r.structured_content["replacements"] == 2

    r, t = await call(session, "write", {"path": "src/evil.rs", "content": "x"}, ok=False)
    assert "readonly src/**" in t and "src/evil.rs" in t, t
    assert r.structured_content["error"]["kind"] == "denied"
    r, t = await call(session, "edit", {"path": "src/main.rs", "old_string": "main", "new_string": "x"}, ok=False)
    assert "readonly src/**" in t, t

    for bad in ["../escape.txt", "notes/../../escape.txt"]:
        r, t = await call(session, "write", {"path": bad, "content": "x"}, ok=False)
        assert "`..` is refused" in t, t
        assert r.structured_content["error"]["kind"] == "bad_path"

    r, t = await call(session, "grep", {"pattern": "OMEGA", "ignore_case": True})
    assert [(m["path"], m["line"]) for m in r.structured_content["matches"]] == [("a.txt", 1), ("a.txt", 3)]
    r, t = await call(session, "grep", {"pattern": "^u.o$", "regex": True, "output_mode": "files"})
    assert r.structured_content["files"] == ["notes/new.txt"], r.structured_content
    r, t = await call(session, "glob", {"pattern": "**/*.rs"})
    assert [e["path"] for e in r.structured_content["entries"]] == ["src/main.rs"]

    await call(session, "rename", {"path": "notes/new.txt", "new_path": "notes/moved.txt"})
    r, t = await call(session, "stat", {"path": "notes/moved.txt"})
    assert r.structured_content["kind"] == "file" and r.structured_content["size"] == 4
    r, t = await call(session, "stat", {"path": "notes/new.txt"}, ok=False)
    assert "no such file" in t
    await call(session, "delete", {"path": "notes/deep"})
    r, t = await call(session, "delete", {"path": "notes"}, ok=False)
    assert "not empty" in t, t
    await call(session, "write", {"path": "kept.txt", "content": "kept\n"})

    for name, content in expect:
        r, t = await call(session, "read", {"path": name})
        assert t == "     1\t" + content, (t, content)

    # Round trips, for the figures (not asserted: the machine is shared).
    n = 200
    start = time.perf_counter()
    for _ in range(n):
        await session.call_tool("stat", {"path": "a.txt"})
    show("timing", calls=n, stat_round_trip_ms=round((time.perf_counter() - start) * 1000 / n, 3))


async def state(session):
    # Raw bytes: base64, byte offset and limit.
    r, t = await call(session, "read", {"path": "bin.dat"})
    assert r.structured_content["binary"] is True, r.structured_content
    r, t = await call(session, "read", {"path": "bin.dat", "encoding": "base64"})
    sc = r.structured_content
    assert base64.b64decode(sc["data"]) == bytes(range(256)) * 2, sc
    assert sc["eof"] is True and sc["size"] == 512 and sc["bytes"] == 512, sc
    r, t = await call(session, "read", {"path": "bin.dat", "encoding": "base64", "offset": 250, "limit": 10})
    sc = r.structured_content
    assert base64.b64decode(sc["data"]) == bytes([250, 251, 252, 253, 254, 255, 0, 1, 2, 3]), sc
    assert sc["eof"] is False and sc["offset"] == 250, sc
    r, t = await call(session, "read", {"path": "bin.dat", "encoding": "rot13"}, ok=None)

    # An edit, a denied write with its rule, and the diff that shows them.
    await call(session, "edit", {"path": "a.txt", "old_string": "beta", "new_string": "gamma"})
    await call(session, "write", {"path": "new.txt", "content": "new\n"})
    r, t = await call(session, "write", {"path": "src/evil.rs", "content": "x"}, ok=False)
    assert "readonly src/**" in t, t
    r, t = await call(session, "diff", {})
    changes = [(c["path"], c["kind"]) for c in r.structured_content["changes"]]
    assert changes == [("a.txt", "M"), ("new.txt", "A")], r.structured_content
    assert t == "M a.txt\nA new.txt\n", t
    r, t = await call(session, "diff", {"paths": ["a.txt"], "patch": True})
    (c,) = r.structured_content["changes"]
    assert "-beta" in c["patch"] and "+gamma" in c["patch"], c

    # reset: a read-only path is refused with its rule; a path goes back.
    r, t = await call(session, "reset", {"paths": ["src/main.rs"]}, ok=False)
    assert "readonly src/**" in t and r.structured_content["error"]["kind"] == "denied", t
    r, t = await call(session, "reset", {"paths": ["../etc"]}, ok=False)
    assert r.structured_content["error"]["kind"] == "bad_path", t
    r, t = await call(session, "reset", {"paths": ["new.txt"]})
    assert r.structured_content["reset"] == ["new.txt"], r.structured_content
    r, t = await call(session, "stat", {"path": "new.txt"}, ok=False)

    # Snapshots: save, change, restore; an unknown one is refused.
    r, t = await call(session, "snapshot_save", {"id": "s1"})
    assert r.structured_content["id"] == "s1", r.structured_content
    await call(session, "write", {"path": "a.txt", "content": "changed\n", "overwrite": True})
    r, t = await call(session, "snapshot_restore", {"id": "nope"}, ok=False)
    assert "no snapshot `nope`" in t and r.structured_content["error"]["kind"] == "state", t
    r, t = await call(session, "snapshot_restore", {"id": "s1"})
    assert r.structured_content["snapshot"]["id"] == "s1", r.structured_content
    r, t = await call(session, "read", {"path": "a.txt"})
    assert t == "     1\talpha\n     2\tgamma\n     3\talpha", t
    r, t = await call(session, "snapshot_list", {})
    assert [s["id"] for s in r.structured_content["entries"]] == ["s1"], r.structured_content

    # A checkpoint, a change after it, and undo back to it.
    r, t = await call(session, "checkpoint", {"name": "c1"})
    assert r.structured_content["name"] == "c1", r.structured_content
    await call(session, "write", {"path": "later.txt", "content": "later\n"})
    r, t = await call(session, "diff", {})
    assert [c["path"] for c in r.structured_content["changes"]] == ["later.txt"], r.structured_content
    r, t = await call(session, "undo", {})
    assert r.structured_content == {"at": "c1", "dropped": 0}, r.structured_content
    r, t = await call(session, "stat", {"path": "later.txt"}, ok=False)
    assert "no such file" in t, t
    r, t = await call(session, "checkpoint_list", {})
    assert [c["name"] for c in r.structured_content["entries"]] == ["c1"], r.structured_content
    r, t = await call(session, "undo", {"to": "nothing"}, ok=False)
    assert "no checkpoint nothing" in t, t

    # The journal has each operation, naming the client and tool.
    r, t = await call(session, "log", {"op": "reset"})
    (row,) = r.structured_content["entries"]
    assert row["comm"] == "mcp:reset" and row["path"] == "new.txt", row
    r, t = await call(session, "log", {"op": "deny"})
    assert any("readonly src/**" in (e["rule"] or "") for e in r.structured_content["entries"]), r.structured_content
    r, t = await call(session, "log", {"limit": 2})
    rows = r.structured_content["entries"]
    assert len(rows) == 2 and rows[-1]["op"] == "undo" and rows[-1]["comm"] == "mcp:undo", rows
    r, t = await call(session, "log", {"op": "frobnicate"}, ok=False)
    assert "unknown journal op" in t, t


async def fork(session):
    r, t = await call(session, "diff", {})
    changes = [(c["path"], c["kind"]) for c in r.structured_content["changes"]]
    assert changes == [("fork.txt", "A")], r.structured_content
    r, t = await call(session, "diff", {"base": "checkpoint"})
    assert t == "A fork.txt\n", t
    r, t = await call(session, "diff", {"base": "shared"})
    changes = [(c["path"], c["kind"]) for c in r.structured_content["changes"]]
    assert changes == [("a.txt", "M"), ("base.txt", "A"), ("fork.txt", "A")], r.structured_content
    assert t == "M a.txt\nA base.txt\nA fork.txt\n", t
    r, t = await call(session, "diff", {"base": "shared", "paths": ["a.txt"], "patch": True})
    (c,) = r.structured_content["changes"]
    assert "-beta" in c["patch"], c
    r, t = await call(session, "diff", {"base": "upper"}, ok=None)


async def execute(session):
    r, t = await call(session, "execute", {"command": "echo out; echo err >&2; exit 3"})
    sc = r.structured_content
    assert sc["exit_code"] == 3 and sc["output"] == "out\nerr\n", sc
    assert sc["truncated"] is False and sc["timed_out"] is False, sc
    assert t.endswith("[exit code 3]"), t

    # Changes made by the command are seen by the next read at once.
    r, t = await call(session, "execute", {"command": "pwd; printf 'made\\n' > made.txt"})
    assert r.structured_content["exit_code"] == 0, r.structured_content
    assert r.structured_content["output"] == "/workspace\n", r.structured_content
    r, t = await call(session, "read", {"path": "made.txt"})
    assert t == "     1\tmade", t
    # And the command sees what the tools wrote.
    await call(session, "write", {"path": "from-tool.txt", "content": "tool\n"})
    r, t = await call(session, "execute", {"command": "cat from-tool.txt"})
    assert r.structured_content["output"] == "tool\n", r.structured_content

    # The policy holds inside the command: src/** is read-only.
    r, t = await call(session, "execute", {"command": "echo x > src/evil.rs"})
    sc = r.structured_content
    assert sc["exit_code"] != 0 and "src/evil.rs" in sc["output"], sc
    r, t = await call(session, "stat", {"path": "src/evil.rs"}, ok=False)
    assert "no such file" in t, t

    # Output past max_output is cut, and says so.
    r, t = await call(session, "execute", {"command": "head -c 5000 /dev/zero | tr '\\0' a", "max_output": 100})
    sc = r.structured_content
    assert sc["truncated"] is True and sc["output"] == "a" * 100 and sc["output_bytes"] == 5000, sc
    assert sc["exit_code"] == 0, sc

    # The timeout kills the command and what it started.
    start = time.perf_counter()
    r, t = await call(session, "execute", {"command": "sleep 60 & sleep 60", "timeout": 1})
    took = time.perf_counter() - start
    sc = r.structured_content
    assert sc["timed_out"] is True and sc["exit_code"] == 124, sc
    assert took < 20, took

    r, t = await call(session, "execute", {"command": "  "}, ok=False)
    assert "empty" in t, t

    # Round trips, for the figures (not asserted: the machine is shared).
    n = 10
    start = time.perf_counter()
    for _ in range(n):
        await session.call_tool("execute", {"command": "true"})
    show("timing", calls=n, execute_true_round_trip_ms=round((time.perf_counter() - start) * 1000 / n, 3))


async def readonly(session):
    r, t = await call(session, "read", {"path": "a.txt"})
    assert t.startswith("     1\talpha"), t
    for name, args in [("write", {"path": "x", "content": "x"}), ("reset", {"all": True}),
                       ("snapshot_save", {}), ("checkpoint", {}), ("undo", {})]:
        try:
            result = await session.call_tool(name, args)
            assert result.is_error, f"{name} answered on a read-only server"
            show("call", tool=name, is_error=True, text=text_of(result)[:300])
        except Exception as e:  # the SDK raises on a protocol error
            assert "no tool" in str(e), e
            show("call", tool=name, protocol_error=str(e)[:300])


async def main():
    argv = sys.argv[1:]
    mode = argv.pop(0)
    expect = []
    while argv and argv[0] == "--expect":
        name, content = argv[1].split("=", 1)
        expect.append((name, content))
        argv = argv[2:]
    assert argv.pop(0) == "--"
    params = StdioServerParameters(command=argv[0], args=argv[1:])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            show("initialize", server=init.server_info.name, version=init.server_info.version)
            assert init.server_info.name == "layerfs"
            tools = (await session.list_tools()).tools
            names = {t.name for t in tools}
            show("tools", names=sorted(names))
            for t in tools:
                assert t.description and t.input_schema["type"] == "object", t
            if mode == "full":
                assert names == ALL, names
                await full(session, expect)
            elif mode == "list":
                pass  # the tools line is the answer
            elif mode == "state":
                assert STATE_READING | STATE_CHANGING <= names, names
                await state(session)
            elif mode == "fork":
                assert "diff" in names, names
                schema = next(t.input_schema for t in tools if t.name == "diff")
                assert schema["properties"]["base"]["enum"] == ["checkpoint", "shared"], schema
                await fork(session)
            elif mode == "execute":
                assert "execute" in names, names
                await execute(session)
            else:
                # --read-only offers the reading tools, the state's too;
                # an allow list may offer fewer.
                assert READING <= names <= READING | STATE_READING, names
                await readonly(session)
    print("OK", flush=True)


asyncio.run(main())
