"""A real MCP client (the official Python SDK, `mcp` on PyPI) driving
`layerfs serve --mcp` over stdio: initialize, list the tools, call each,
and check the error cases. Driven by tests/it/agent_mcp.rs.

usage: mcp_client.py MODE [--expect NAME=CONTENT] -- LAYERFS SERVE-ARGS...
MODE: full (every tool and error case), readonly (only the reading
tools are offered) or execute (commands in the workspace's sandbox). The workspace holds a.txt = "alpha\nbeta\nalpha\n",
src/main.rs, and its policy makes src/** read-only. Prints a transcript
(one JSON object a line) and OK at the end; any failed check raises.
"""

import asyncio
import json
import sys
import time

from mcp import ClientSession, StdioServerParameters, stdio_client

READING = {"ls", "read", "grep", "glob", "stat"}
ALL = READING | {"write", "edit", "delete", "rename", "mkdir", "execute"}


def show(kind, **fields):
    print(json.dumps({"kind": kind, **fields}), flush=True)


def text_of(result):
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def call(session, name, args, ok=True):
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
    try:
        result = await session.call_tool("write", {"path": "x", "content": "x"})
        assert result.is_error, "write answered on a read-only server"
        show("call", tool="write", is_error=True, text=text_of(result)[:300])
    except Exception as e:  # the SDK raises on a protocol error
        show("call", tool="write", protocol_error=str(e)[:300])


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
            elif mode == "execute":
                assert "execute" in names, names
                await execute(session)
            else:
                assert names == READING, names
                await readonly(session)
    print("OK", flush=True)


asyncio.run(main())
