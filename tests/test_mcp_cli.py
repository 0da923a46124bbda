"""MCP servers from the outside: the README's few lines of config, `voice
chat` as a person runs it, `voice doctor`, `voice config show`, `voice
grants`, against real server processes: the Home Assistant stand-in over
Streamable HTTP behind a bearer token (no Home Assistant runs here), and
mcp-server-time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcp_fixtures import chaos_server_command, events, start_home_assistant, time_server_command

REPO = Path(__file__).resolve().parent.parent
TOKEN = "long-lived-token-1234567890"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and k != "VOICE_DB"}
    e.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "cfg"),
             XDG_DATA_HOME=str(tmp_path / "data"), HF_HUB_OFFLINE="1", NO_PROXY="*",
             HA_AUTHORIZATION=f"Bearer {TOKEN}")
    return e


def voice(env: dict[str, str], *args: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voice", *args], cwd=REPO, env=env, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def toml_list(argv: list[str]) -> str:
    return json.dumps(argv)


def home_config(tmp_path: Path, url: str) -> Path:
    """The README's lines for Home Assistant."""
    path = tmp_path / "voice.toml"
    path.write_text(f'[mcp.servers.home]\nurl = "{url}"\nheaders = {{ Authorization = "HA_AUTHORIZATION" }}\n')
    return path


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "script.toml"
    path.write_text(body)
    return f"scripted:{path}"


TURN_OFF_KITCHEN = """
[[reply]]
chunk_delay_ms = 1
[[reply.tool_calls]]
name = "home__HassTurnOff"
arguments = { name = "Kitchen light" }
[[reply]]
chunk_delay_ms = 1
text = "The kitchen light is off."
"""


def test_turn_off_the_kitchen_light_through_home_assistant_asks_first_then_does_it(tmp_path, env):
    with start_home_assistant(tmp_path, TOKEN) as (url, _, journal):
        config = home_config(tmp_path, url)
        db = tmp_path / "e.db"
        r = voice(env, "chat", "--config", str(config), "--db", str(db), "--new",
                  "--llm", script(tmp_path, TURN_OFF_KITCHEN), stdin="turn off the kitchen light\nyes\n")
        assert r.returncode == 0, r.stderr
        calls = events(journal, "done")
    assert "[Should I use HassTurnOff on home, with name Kitchen light? Say yes or no.]" in r.stdout
    assert "assistant: The kitchen light is off." in r.stdout
    assert [(c["tool"], c["label"]) for c in calls] == [("HassTurnOff", "Kitchen light")]
    # Home Assistant sends no annotations: a destructive write, asked about, with a receipt.
    log = voice(env, "effects", "--db", str(db), "--json")
    assert [(e["tool"], e["state"]) for e in json.loads(log.stdout)] == [("home__HassTurnOff", "confirmed")]
    # The token is in no file voice wrote, and `config show` names only the variable.
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.suffix in ("", ".db", ".db-wal", ".json", ".toml"):
            assert TOKEN.encode() not in path.read_bytes(), path
    shown = voice(env, "config", "show", "--config", str(config))
    assert "HA_AUTHORIZATION" in shown.stdout and TOKEN not in shown.stdout


def test_a_wrong_token_is_one_line_naming_the_variable_and_the_assistant_answers_without_the_tools(tmp_path, env):
    env["HA_AUTHORIZATION"] = "Bearer wrong"
    with start_home_assistant(tmp_path, TOKEN) as (url, _, _journal):
        config = home_config(tmp_path, url)
        r = voice(env, "chat", "--config", str(config), "--db", str(tmp_path / "e.db"), "--new",
                  "--llm", script(tmp_path, '[[reply]]\ntext = "Hello."\n'), stdin="hello\n")
        doctor = voice(env, "doctor", "--config", str(config), "--no-load")
    assert r.returncode == 0, r.stderr
    assert "assistant: Hello." in r.stdout
    line = [ln for ln in (r.stdout + r.stderr).splitlines() if "server home did not start" in ln]
    assert len(line) == 1
    assert "answered HTTP 401 (its token, from HA_AUTHORIZATION, was refused)" in line[0]
    assert "[warn] mcp home: failed:" in doctor.stdout and "HTTP 401" in doctor.stdout


def test_doctor_lists_each_server_its_tools_and_what_each_may_do(tmp_path, env):
    config = tmp_path / "voice.toml"
    config.write_text(
        f"[mcp.servers.time]\ncommand = {json.dumps(time_server_command()[0])}\ntrust_annotations = true\n"
        f"[mcp.servers.chaos]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = {toml_list(chaos_server_command(tmp_path / 'j')[1:])}\nallow = [\"unlock_door\", \"lookup\"]\n"
        f"[mcp.servers.gone]\ncommand = \"/no/such/program\"\n")
    r = voice(env, "doctor", "--config", str(config), "--no-load")
    lines = {ln.split(":")[0]: ln for ln in r.stdout.splitlines() if "] mcp " in ln}
    assert "2 of 2 tools offered: convert_time (read), get_current_time (read)" in lines["[  ok] mcp time"]
    assert ("2 of 7 tools offered: lookup (destructive write, asks first), unlock_door (destructive write, "
            "asks first)") in lines["[  ok] mcp chaos"]
    assert "'/no/such/program' was not found" in lines["[warn] mcp gone"]
    assert "-> run /no/such/program by hand" in lines["[warn] mcp gone"]


@pytest.mark.parametrize("body, message", [
    ('[mcp.servers.x]\ncommand = "a"\nurl = "http://h/mcp"\n', "needs exactly one of command"),
    ('[mcp.servers.x]\n', "needs exactly one of command"),
    ('[mcp.servers.x]\ncommand = "a"\napprove = "sometimes"\n',
     'mcp.servers.x.approve = "sometimes" must be one of "destructive", "writes", "never"'),
    ('[mcp.servers.x]\nurl = "ftp://h"\n', 'mcp.servers.x.url = "ftp://h" must be "" or an http(s) URL'),
    ('[mcp.servers.x]\nurl = "http://h/mcp"\nheaders = { Authorization = "Bearer abc def" }\n',
     "must be a table of HTTP headers, each naming the environment variable"),
    ('[mcp.servers.x]\ncommand = "a"\ntimeout_s = 0\n', "mcp.servers.x.timeout_s = 0 must be a number above 0"),
    ('[mcp.servers.x]\ncommand = "a"\ncolour = "red"\n', "unknown key 'mcp.servers.x.colour'"),
    ('[mcp.servers."my server"]\ncommand = "a"\n', "a server's name must be 1 to 32 letters"),
    ('[mcp.servers.x]\nurl = "http://h/mcp"\nargs = ["-v"]\n', "args, env and cwd are for a stdio server"),
])
def test_a_bad_server_table_is_one_line_naming_the_key_and_what_is_allowed(tmp_path, env, body, message):
    config = tmp_path / "voice.toml"
    config.write_text(body)
    r = voice(env, "config", "show", "--config", str(config))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_grants_are_listed_and_revoked_from_the_cli(tmp_path, env):
    grants = tmp_path / "cfg" / "voice" / "grants.json"
    grants.parent.mkdir(parents=True)
    grants.write_text('{"always": [["home", "home__HassTurnOn"]]}\n')
    assert voice(env, "grants").stdout == "home home__HassTurnOn: always allowed\n"
    r = voice(env, "grants", "revoke", "home", "home__HassTurnOn")
    assert r.returncode == 0 and "asks again" in r.stdout
    assert "no grants" in voice(env, "grants").stdout
    again = voice(env, "grants", "revoke", "home", "home__HassTurnOn")
    assert again.returncode == 1 and "no grant for home__HassTurnOn of home" in again.stderr
