"""A real MCP client for the tests of agent-run-mcp: the official MCP Python SDK (`mcp` on PyPI)
over stdio, driven by the Rust test through JSON lines.

    python3 driver.py [--tasks] -- SERVER [ARGS...]

The SDK launches SERVER as its child (its own session, as the SDK always does) and speaks the
protocol version it negotiates with it. The test writes one JSON object a line on our stdin, each
with an "id"; we answer each with one JSON line on stdout carrying the same id, when it is done.
Operations run concurrently, so a long call can be in flight while another cancels it.

    {"op": "list_tools"}                             -> {"tools": [...]}
    {"op": "call", "name", "args", "progress": bool} -> {"result": CallToolResult} or {"task": ...}
    {"op": "abort", "target": ID}                    -> the call ID is cancelled by the SDK (it
                                                        sends notifications/cancelled); ID answers
                                                        {"aborted": true}
    {"op": "tasks_get", "task_id"}                   -> {"raw": the tasks/get result}
    {"op": "tasks_cancel", "task_id"}                -> {"raw": the tasks/cancel acknowledgement}
    {"op": "notifications"}                          -> {"notifications": [...]} (those since the
                                                        last ask: progress and the like)
    {"op": "close"}                                  -> leaves the client (the SDK closes the
                                                        server's stdin and waits for it), then exits

With --tasks the client declares the Tasks extension (io.modelcontextprotocol/tasks): a tool call
the server turns into a task answers {"task": CreateTaskResult}, and the test polls and cancels
it with tasks_get and tasks_cancel (the SDK has the types but no client API for them yet, so
these go out as ordinary requests through the session).
"""

import json
import os
import sys
import time
from typing import Any, Literal

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClientExtension, ResultClaim
from mcp_types._types import (
    CancelTaskRequest,
    CancelTaskRequestParams,
    GetTaskRequest,
    GetTaskRequestParams,
)
from pydantic import ConfigDict, TypeAdapter

TASK_MARK = "io.modelcontextprotocol/tasks"


class CreateTask(types.Result):
    """A tools/call answered with a task handle (resultType "task")."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"]
    task_id: str
    status: str


async def hand_task_to_test(res: CreateTask, ctx: Any) -> types.CallToolResult:
    # Give the handle back as the call's result; the test drives the task from here.
    return types.CallToolResult(
        content=[],
        structured_content={TASK_MARK: res.model_dump(by_alias=True, mode="json")},
    )


class Tasks(ClientExtension):
    identifier = TASK_MARK

    def claims(self):
        return [ResultClaim(result_type="task", model=CreateTask, resolve=hand_task_to_test)]


out_lock = anyio.Lock()


async def reply(msg: dict) -> None:
    async with out_lock:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()


def dump(model: Any) -> Any:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


async def main() -> None:
    args = sys.argv[1:]
    tasks = "--tasks" in args[: args.index("--")]
    server = args[args.index("--") + 1 :]
    notes: list = []

    async def on_message(m: Any) -> None:
        if isinstance(m, Exception):
            notes.append({"exception": repr(m)})
            return
        method = getattr(m, "method", None)
        params = getattr(m, "params", None)
        if method is not None:
            notes.append({"method": method, "params": dump(params) if params is not None else None, "t": time.time()})

    # The server gets our whole environment (the SDK's default passes only HOME, PATH and a few).
    params = StdioServerParameters(command=server[0], args=server[1:], env=dict(os.environ))
    client = Client(
        params,
        extensions=[Tasks()] if tasks else None,
        message_handler=on_message,
        cache=None,
    )
    scopes: dict = {}
    done = anyio.Event()
    async with client:
        await reply({"event": "ready", "protocol": getattr(client.session, "_negotiated_version", None)})

        async def op(msg: dict) -> None:
            oid = msg["id"]
            name = msg["op"]
            try:
                if name == "list_tools":
                    r = await client.list_tools()
                    await reply({"id": oid, "ok": True, "tools": [dump(t) for t in r.tools]})
                elif name == "call":
                    with anyio.CancelScope() as scope:
                        scopes[oid] = scope
                        progress = None
                        if msg.get("progress"):
                            async def progress(p: float, total: Any, message: Any) -> None:
                                notes.append({"method": "progress-callback", "params": {"progress": p, "message": message}, "t": time.time()})
                        r = await client.call_tool(msg["name"], msg.get("args") or {}, progress_callback=progress)
                    if scope.cancelled_caught:
                        await reply({"id": oid, "ok": False, "aborted": True})
                        return
                    sc = r.structured_content or {}
                    if isinstance(sc, dict) and TASK_MARK in sc:
                        await reply({"id": oid, "ok": True, "task": sc[TASK_MARK]})
                    else:
                        await reply({"id": oid, "ok": True, "result": dump(r)})
                elif name == "abort":
                    scopes[msg["target"]].cancel()
                    await reply({"id": oid, "ok": True})
                elif name == "tasks_get":
                    req = GetTaskRequest(params=GetTaskRequestParams(task_id=msg["task_id"]))
                    raw = await client.session.send_request(req, TypeAdapter(dict))
                    await reply({"id": oid, "ok": True, "raw": raw})
                elif name == "tasks_cancel":
                    req = CancelTaskRequest(params=CancelTaskRequestParams(task_id=msg["task_id"]))
                    raw = await client.session.send_request(req, TypeAdapter(dict))
                    await reply({"id": oid, "ok": True, "raw": raw})
                elif name == "notifications":
                    got = list(notes)
                    notes.clear()
                    await reply({"id": oid, "ok": True, "notifications": got})
                elif name == "close":
                    done.set()
                else:
                    await reply({"id": oid, "ok": False, "error": {"message": f"no op {name}"}})
            except Exception as e:  # the test wants to see every failure, typed
                err = getattr(e, "error", None)
                await reply(
                    {
                        "id": oid,
                        "ok": False,
                        "error": {
                            "type": type(e).__name__,
                            "message": str(e),
                            "code": getattr(err, "code", getattr(e, "code", None)),
                        },
                    }
                )

        async with anyio.create_task_group() as tg:

            async def read_stdin() -> None:
                stdin = anyio.wrap_file(sys.stdin)
                async for line in stdin:
                    line = line.strip()
                    if not line:
                        continue
                    msg = json.loads(line)
                    if msg.get("op") == "close":
                        close_id = msg["id"]
                        done.set()
                        tg.cancel_scope.cancel()
                        scopes["__close__"] = close_id
                        return
                    tg.start_soon(op, msg)
                done.set()
                tg.cancel_scope.cancel()

            tg.start_soon(read_stdin)
            await done.wait()
            tg.cancel_scope.cancel()
        t0 = time.time()
    # Out of the client: the SDK closed the server's stdin and waited for it to exit.
    await reply({"id": scopes.get("__close__"), "ok": True, "closed_in_s": time.time() - t0})


anyio.run(main)
