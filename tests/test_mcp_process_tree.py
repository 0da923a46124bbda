"""Nothing an MCP server started outlives `voice chat`, however it was
started: through a shell script that runs the real server as its child
(no exec), one whose server calls setsid, `npx -y` (server-memory, node),
or the README's own `uvx mcp-server-time`. Real `voice chat` processes
with a scripted model; the server is up once its tool has answered; then
voice is killed with -9, the wrapper itself crashes, or the chat ends
normally, and within GONE_WITHIN_S no process of the server's tree is
left, found from the outside by a marker in its environment
(mcp_fixtures.server_tree).

Before the guardian (voice/agent/mcp/guardian.py) the server behind a shell
wrapper outlived a `kill -9` of voice, and one that left the wrapper's
process group (setsid) outlived all three.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcp_fixtures import (SERVER_MEMORY_INSTALL_HINT, SETSID_WRAPPER, SHELL_WRAPPER, OneToolChat, npx_server_memory,
                          stubborn_chaos_behind, tree_left_after, uvx_time_server, warm_uv_cache, write_wrapper)
from voice.agent.mcp.stdio import STOP_BOUND_S

# The guardian's schedule ends within STOP_BOUND_S; the rest is slack for a loaded 2-core machine
# (benchmarks/mcp_orphans.py measures the real figure).
GONE_WITHIN_S = STOP_BOUND_S + 2.5
WRAPPERS = pytest.mark.parametrize("body", [SHELL_WRAPPER, SETSID_WRAPPER], ids=["shell", "setsid"])
LOOKUP = ("lookup", {"key": "k"})
READ_GRAPH = ("read_graph", {})
TIME_NOW = ("get_current_time", {"timezone": "UTC"})


@pytest.fixture
def chat_of(tmp_path):
    chats = []

    def start(server: str, tool: str, arguments: dict) -> OneToolChat:
        chats.append(OneToolChat(tmp_path, server, tool, arguments))
        return chats[-1]

    yield start
    for chat in chats:
        chat.close()


@pytest.fixture
def memory_server(tmp_path) -> str:
    server = npx_server_memory(tmp_path)
    if server is None:
        pytest.skip(SERVER_MEMORY_INSTALL_HINT)
    return server


@pytest.fixture(scope="module")
def uv_cache() -> str:
    cache, why = warm_uv_cache()
    if cache is None:
        pytest.skip(why)
    return cache


def killed(chat: OneToolChat) -> dict[int, str]:
    """kill -9 of voice; what of the server's tree is left after GONE_WITHIN_S."""
    chat.proc.kill()
    chat.proc.wait(timeout=10)
    return tree_left_after(chat.marker, GONE_WITHIN_S)[0]


@WRAPPERS
def test_kill_9_of_voice_takes_a_server_behind_a_wrapper_along(tmp_path, chat_of, body):
    chat = chat_of(stubborn_chaos_behind(tmp_path, write_wrapper(tmp_path, body)), *LOOKUP)
    up = chat.ask()
    assert any("wrapper.sh" in line for line in up.values()) and any("chaos_server.py" in line for line in up.values())
    left = killed(chat)
    assert not left, f"outlived voice chat killed with -9: {left}"


@WRAPPERS
def test_a_crashed_wrapper_leaves_nothing_of_its_server(tmp_path, chat_of, body):
    chat = chat_of(stubborn_chaos_behind(tmp_path, write_wrapper(tmp_path, body)), *LOOKUP)
    [launcher] = [pid for pid, line in chat.ask().items() if "wrapper.sh" in line]
    os.kill(launcher, 9)
    left, _ = tree_left_after(chat.marker, GONE_WITHIN_S)
    assert chat.proc.poll() is None, "voice chat ended with its server"
    assert not left, f"outlived its wrapper's crash: {left}"
    assert chat.end() == 0


@WRAPPERS
def test_a_normal_exit_leaves_nothing_of_a_server_behind_a_wrapper(tmp_path, chat_of, body):
    chat = chat_of(stubborn_chaos_behind(tmp_path, write_wrapper(tmp_path, body)), *LOOKUP)
    chat.ask()
    assert chat.end() == 0
    left, _ = tree_left_after(chat.marker, GONE_WITHIN_S)
    assert not left, f"outlived voice chat's normal exit: {left}"


def test_kill_9_of_voice_takes_npx_and_its_node_server_along(chat_of, memory_server):
    chat = chat_of(memory_server, *READ_GRAPH)
    up = chat.ask()
    assert any(line.startswith("npm exec") for line in up.values()), up  # npx runs the server as a grandchild
    assert any(line.startswith("node ") and "mcp-server-memory" in line for line in up.values()), up
    left = killed(chat)
    assert not left, f"outlived voice chat killed with -9: {left}"


def test_a_crashed_npx_leaves_nothing_of_its_node_server(chat_of, memory_server):
    chat = chat_of(memory_server, *READ_GRAPH)
    [npm] = [pid for pid, line in chat.ask().items() if line.startswith("npm exec")]
    os.kill(npm, 9)
    left, _ = tree_left_after(chat.marker, GONE_WITHIN_S)
    assert chat.proc.poll() is None, "voice chat ended with its server"
    assert not left, f"outlived npx's crash: {left}"
    assert chat.end() == 0


def test_the_readme_uvx_time_server_goes_with_voice_on_kill_9_and_on_exit(tmp_path: Path, chat_of, uv_cache):
    chat = chat_of(uvx_time_server(uv_cache), *TIME_NOW)
    up = chat.ask()
    assert any(" tool uvx " in line for line in up.values()), up  # uv stays, the server is its child
    assert any("mcp-server-time" in line and "python" in line for line in up.values()), up
    left = killed(chat)
    assert not left, f"outlived voice chat killed with -9: {left}"

    chat = chat_of(uvx_time_server(uv_cache), *TIME_NOW)
    chat.ask()
    assert chat.end() == 0
    left, _ = tree_left_after(chat.marker, GONE_WITHIN_S)
    assert not left, f"outlived voice chat's normal exit: {left}"
