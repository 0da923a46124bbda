"""run_command: only configured commands run; the receipt says what happened."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from voice.agent.tools.base import ToolContext, ToolError
from voice.agent.tools.commands import run_command_tool

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def context(tmp_path: Path, commands: dict[str, list[str]]) -> ToolContext:
    return ToolContext(
        conversation="c", turn=1, tool_call_id="t", data_dir=tmp_path, commands=commands, kill_after_s=0.5
    )


async def call(args: dict, ctx: ToolContext):
    with anyio.fail_after(10):
        return await run_command_tool().run(args, ctx)


def test_the_tool_is_a_write_that_takes_a_name() -> None:
    tool = run_command_tool()
    assert (tool.name, tool.effect) == ("run_command", "write")
    assert tool.parameters["required"] == ["name"]
    assert "only configured commands" in tool.description.lower()
    listed = run_command_tool(["lights_on", "backup"])
    assert "backup, lights_on" in listed.description
    assert listed.parameters["properties"]["name"]["enum"] == ["backup", "lights_on"]


async def test_a_configured_command_runs_and_is_confirmed(tmp_path: Path) -> None:
    ctx = context(tmp_path, {"greet": ["sh", "-c", "echo hello; echo note >&2"]})
    outcome = await call({"name": "greet"}, ctx)
    assert outcome.content == {"name": "greet", "exit_status": 0, "stdout": "hello\n", "stderr": "note\n"}
    assert outcome.receipt is not None and outcome.receipt.state == "confirmed"
    evidence = outcome.receipt.evidence
    assert evidence["argv"] == ["sh", "-c", "echo hello; echo note >&2"] and evidence["exit_status"] == 0
    assert evidence["pid"] > 0 and evidence["duration_s"] >= 0
    assert outcome.phrase == "Done, greet ran."


async def test_a_nonzero_exit_is_a_failed_receipt(tmp_path: Path) -> None:
    ctx = context(tmp_path, {"broken": ["sh", "-c", "echo oops >&2; exit 3"]})
    outcome = await call({"name": "broken"}, ctx)
    assert outcome.content["exit_status"] == 3 and outcome.content["stderr"] == "oops\n"
    assert outcome.receipt is not None and outcome.receipt.state == "failed"
    assert outcome.receipt.evidence["exit_status"] == 3
    assert outcome.phrase is None


async def test_output_is_cut_to_its_last_2000_characters(tmp_path: Path) -> None:
    ctx = context(tmp_path, {"long": ["sh", "-c", "seq 1 5000"]})
    outcome = await call({"name": "long"}, ctx)
    assert len(outcome.content["stdout"]) == 2000 and outcome.content["stdout"].endswith("4999\n5000\n")


async def test_an_unknown_name_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    ctx = context(tmp_path, {"touch_it": ["touch", str(marker)], "other": ["touch", str(marker)]})
    with pytest.raises(ToolError) as caught:
        await call({"name": "rm -rf /"}, ctx)
    assert "other" in str(caught.value) and "touch_it" in str(caught.value)
    with pytest.raises(ToolError):
        await call({"name": "touch"}, ctx)  # the program's name is not a command's name
    await anyio.sleep(0.1)
    assert not marker.exists()
    await call({"name": "touch_it"}, ctx)  # the control: the configured command does create it
    assert marker.exists()


@pytest.mark.parametrize("args", [{}, {"name": 3}, {"name": ""}, {"name": None}, {"name": ["touch_it"]}])
async def test_bad_arguments_are_a_tool_error(tmp_path: Path, args: dict) -> None:
    marker = tmp_path / "ran"
    ctx = context(tmp_path, {"touch_it": ["touch", str(marker)]})
    with pytest.raises(ToolError):
        await call(args, ctx)
    assert not marker.exists()


async def test_no_commands_configured_refuses_everything(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="none are configured"):
        await call({"name": "anything"}, context(tmp_path, {}))


async def test_a_program_that_does_not_exist_is_a_failed_receipt(tmp_path: Path) -> None:
    ctx = context(tmp_path, {"ghost": ["/nonexistent/ghost-program", "--flag"]})
    outcome = await call({"name": "ghost"}, ctx)
    assert outcome.receipt is not None and outcome.receipt.state == "failed"
    assert "FileNotFoundError" in outcome.receipt.evidence["error"]
    assert outcome.receipt.evidence["argv"] == ["/nonexistent/ghost-program", "--flag"]
    assert outcome.phrase is None


async def test_a_program_that_may_not_execute_is_a_failed_receipt(tmp_path: Path) -> None:
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    outcome = await call({"name": "noexec"}, context(tmp_path, {"noexec": [str(script)]}))
    assert outcome.receipt is not None and outcome.receipt.state == "failed"
    assert "PermissionError" in outcome.receipt.evidence["error"]


async def test_cancellation_propagates_and_stops_the_command(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    ctx = context(tmp_path, {"slow": ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"]})
    outcome: dict[str, object] = {}

    async def runner() -> None:
        try:
            outcome["result"] = await run_command_tool().run({"name": "slow"}, ctx)
        except anyio.get_cancelled_exc_class():
            outcome["cancelled"] = True
            raise

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner)
            while not (pidfile.exists() and pidfile.read_text().endswith("\n")):
                await anyio.sleep(0.005)
            tg.cancel_scope.cancel()
    assert outcome == {"cancelled": True}
    pid = int(pidfile.read_text())
    assert not Path(f"/proc/{pid}").exists()
