"""The `voice` command line's grammar: every subcommand, its flags and
their help (voice.cli runs them). A usage error is one line and exit status 2."""

from __future__ import annotations

import argparse
from typing import NoReturn


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _common(p: argparse.ArgumentParser, db: str = "the event log (default: $XDG_STATE_HOME/voice/events.db)") -> None:
    p.add_argument("--config", metavar="PATH", help="a TOML file layered over config/voice.toml")
    p.add_argument("--db", metavar="PATH", help=db)


def _llm(p: argparse.ArgumentParser) -> None:
    p.add_argument("--llm", metavar="URL|scripted:FILE", help="an OpenAI-compatible base URL, or scripted:FILE: a file of replies, used in order "
                   "whatever is asked (the format: docs/SCENARIOS.md)")
    p.add_argument("--llm-model", metavar="NAME", help="the model to ask for (overrides llm.model), e.g. llama3.2")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="voice", description="A hands-free voice assistant that really stops when you talk over it.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("chat", help="talk to the assistant in text (Ctrl-C stops a reply)")
    _common(p)
    _llm(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--conversation", metavar="ID", help="continue this conversation (default: the latest, unless it "
                   "ended or was idle longer than [conversation] idle_gap_s)")
    g.add_argument("--new", action="store_true", help="start a new conversation")

    p = sub.add_parser("replay", help="replay a scenario's recorded audio through the voice pipeline")
    _common(p, db="refused: the replay's log is always a fresh OUT/events.db")
    p.add_argument("scenario", metavar="SCENARIO.toml")
    p.add_argument("--out", metavar="DIR", required=True,
                   help="a new or empty folder for mic.wav, played.wav, events.db, summary.json, requests.json")
    p.add_argument("--realtime", action="store_true", help="pace the replay at real time instead of the virtual clock")
    p.add_argument("--stt-model", choices=("base", "tiny.en"), help="override stt.model")
    p.add_argument("-v", "--verbose", action="store_true", help="also print what was heard and not acted on")
    p.add_argument("--show", action="store_true",
                   help="also draw every turn that was cut (all turns if none was) as OUT/turn-N.html and .png")

    p = sub.add_parser("show", help="draw one turn: what was heard and said, and when (an HTML page, a PNG)",
                       description="Draw one turn of a log: the microphone and speaker waveforms (when the log sits "
                                   "beside a recording: voice replay --out, voice run --record, voice ctl save), "
                                   "speech, the transcript, the reply's words where they played, the barge-in and "
                                   "the latency parts.")
    _common(p, db="the event log; a recording's DIR/events.db finds its mic.wav and played.wav beside it")
    p.add_argument("turn", type=int, metavar="TURN")
    p.add_argument("--conversation", metavar="ID", help="default: the first conversation holding the turn")
    p.add_argument("--out", metavar="FILE.html", help="the page (self-contained, works offline)")
    p.add_argument("--png", metavar="FILE.png", help="the same picture as a PNG")

    p = sub.add_parser("run", help="the assistant as a service: listen and talk until SIGINT/SIGTERM")
    _common(p)
    _llm(p)
    p.add_argument("--replay", metavar="SCENARIO.toml",
                   help="the replay device instead of the sound card (headless machines, tests); stays up after it")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also print what was heard and not acted on (no wake word, backchannel, echo)")
    p.add_argument("--record", metavar="DIR",
                   help="keep the session in DIR (new or empty): mic before echo cancellation, what played, "
                        "the events and a scenario.toml that voice replay runs")

    p = sub.add_parser("acp", help="serve the Agent Client Protocol on stdin/stdout (for editors such as Zed)")
    _common(p)
    _llm(p)

    p = sub.add_parser("ctl", help="talk to the running daemon over its control socket",
                       description="Talk to the running daemon. `events` prints the log's events (all of them, "
                                   "or those after --since SEQ) and exits; with --follow it is a stream that "
                                   "prints each new event as it is written, until Ctrl-C.")
    _common(p, db="refused: the daemon keeps its own log (voice history --db PATH reads one)")
    p.add_argument("cmd", choices=("status", "say", "cancel", "mute", "unmute", "history", "new", "save", "events",
                                   "approve", "deny"))
    p.add_argument("text", nargs="*", help="for say: the text of the turn; for save: a new directory to write "
                                           "the last few minutes ([record] ring_s) into")
    p.add_argument("--list", action="store_true", help="for history: list the conversations in the log")
    p.add_argument("--always", action="store_true",
                   help="for approve: also allow this tool of this server from now on (voice grants lists them)")
    p.add_argument("--json", action="store_true", help="print the daemon's JSON replies (one per line)")
    p.add_argument("--since", metavar="SEQ", type=int, help="for events: only those after this sequence number")
    p.add_argument("--follow", action="store_true",
                   help="for events: keep printing new events as they are written (a stream; Ctrl-C ends it); "
                        "without --since it starts from now")

    p = sub.add_parser("config", help="the effective configuration")
    _common(p)
    p.add_argument("action", choices=("show",))

    p = sub.add_parser("doctor", help="check audio, models, LLM, config, service; say what to fix")
    _common(p)
    _llm(p)
    p.add_argument("--no-load", action="store_true", help="do not load the speech models (faster)")

    p = sub.add_parser("service", help="install or remove the systemd user unit")
    p.add_argument("action", choices=("install", "uninstall"))

    p = sub.add_parser("effects", help="every dispatched write and what is known of it")
    _common(p)
    p.add_argument("--json", action="store_true", help='print a list of {"tool", "arguments", "state", "turn"}')

    p = sub.add_parser("grants", help='the "always" answers to approval questions: per MCP server and tool, '
                                      'and per configured command (tools.commands NAME)')
    p.add_argument("action", nargs="?", choices=("list", "revoke"), default="list")
    p.add_argument("server", nargs="?", help="for revoke: the server's name ([mcp.servers.NAME]), "
                                             "or tools.commands for a configured command")
    p.add_argument("tool", nargs="?", help="for revoke: the tool, or the command's name, as voice grants lists it")

    p = sub.add_parser("history", help="the model history derived from the log")
    _common(p)
    p.add_argument("--conversation", metavar="ID", help="default: the latest conversation")
    p.add_argument("--json", action="store_true", help="print a JSON list of messages")
    p.add_argument("--chat", action="store_true", help="print the chat view instead")
    p.add_argument("--list", action="store_true",
                   help="list the conversations (id, turns, when, how it ended, its first words)")

    p = sub.add_parser("trace", help="the trajectory of one turn: each provider request and its fate")
    _common(p)
    p.add_argument("turn", type=int, metavar="TURN")
    p.add_argument("--conversation", metavar="ID", help="default: the first conversation holding the turn")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("fork", help="a new conversation with the history up to TURN; prints its id "
                                    "(and, on stderr, how to continue it)")
    _common(p)
    p.add_argument("turn", type=int, metavar="TURN")
    p.add_argument("--conversation", metavar="ID", help="default: the first conversation holding the turn")
    return parser
