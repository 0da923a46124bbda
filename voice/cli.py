"""The `voice` command line. Every subcommand but `service` takes --config;
those that read or write the event log take --db, and the two that cannot
use one (`replay` writes a fresh log into --out, `ctl` talks to a daemon
that has its own) refuse it.

Bad input (unknown flag, missing file, malformed TOML, unreachable LLM)
ends with one line on stderr naming the problem, and exit status 2; a
request that was understood but did not succeed (the daemon refused it or
went away) with one line and exit status 1. Output for people by default,
`--json` for scripts; a closed pipe (`voice history | head -1`) ends the
command quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from voice.cli_args import build_parser
from voice.errors import Failed, UsageError, as_usage_error

if TYPE_CHECKING:
    from voice.settings import Settings


def _settings(args: argparse.Namespace) -> Settings:
    """The config, checked, with the command line's overrides, read once into the typed settings."""
    from voice.settings import Settings

    return Settings.from_config(_config_with_sources(args)[0])


def _config_with_sources(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """The config, checked, with the command line's overrides (also checked)."""
    from voice.config import load_config_with_sources, override

    config, sources = load_config_with_sources(args.config)
    if getattr(args, "llm_model", None) is not None:
        override(config, sources, "llm.model", args.llm_model, "--llm-model")
    return config, sources


def _refuse_db(args: argparse.Namespace, why: str) -> None:
    if args.db is not None:
        raise UsageError(f"--db: {why}")


def _store(args: argparse.Namespace, settings: Settings, *, read_only: bool = True):
    """The log a command reads (history, show, trace, effects): opened
    read-only, so a mistyped --db is "no such log" and a log someone sent
    you is never changed. `fork` writes, but into a log that must exist."""
    from voice.log.store import open_store

    if not read_only:
        open_store(settings.paths, args.db, read_only=True).close()  # exists, and is a log
    return open_store(settings.paths, args.db, read_only=read_only)


def _conversation_of(store, args: argparse.Namespace, turn: int | None = None) -> str:
    if args.conversation:
        if args.conversation not in store.conversations():
            raise UsageError(f"no conversation {args.conversation!r} in {store.path}")
        return args.conversation
    if turn is not None:
        convs = store.conversations_of_turn(turn)
        if not convs:
            raise UsageError(f"no turn {turn} in {store.path}")
        return convs[0]
    conv = store.latest_conversation()
    if conv is None:
        raise UsageError(f"the log {store.path} is empty: talk first (voice chat)")
    return conv


def cmd_chat(args: argparse.Namespace) -> int:
    from voice.app import open_app
    from voice.log.conversations import resume_or_new
    from voice.log.store import new_conversation_id
    from voice.service.chat import run_chat
    from voice.surfaces.text import TextSurface

    settings = _settings(args)
    surface = TextSurface(show_reasoning=settings.chat.show_reasoning)
    rules = settings.conversation

    async def main() -> None:
        async with open_app(settings, db=args.db, llm=args.llm, notice=lambda text: print(f"[{text}]", flush=True)) as app:
            if args.new:
                conversation = new_conversation_id()
            else:  # the latest, as `voice run` picks it: not if it ended or was idle past the gap
                conversation = args.conversation or resume_or_new(app.store, rules.idle_gap_s)
            await app.announcer.attach(surface.notice)
            await run_chat(app.agent(surface, conversation), idle_gap_s=rules.idle_gap_s,
                           new_phrases=rules.new_phrases, new_reply=rules.new_reply)

    anyio.run(main)
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from voice.log.projections import chat_view, derive_messages, message_line

    store = _store(args, _settings(args))
    if args.list:
        return _list_conversations(store, args.json)
    conv = _conversation_of(store, args)
    if args.chat:
        print("\n".join(chat_view(store, conv)))
    elif args.json:
        print(json.dumps(derive_messages(store, conv), ensure_ascii=False, indent=2))
    else:
        for m in derive_messages(store, conv):
            print(message_line(m))
    return 0


def _list_conversations(store, as_json: bool) -> int:
    from voice.log.conversations import list_conversations
    from voice.service.ctl_format import conversation_lines

    listed = [c.__dict__ for c in list_conversations(store)]
    print(json.dumps(listed, ensure_ascii=False, indent=2) if as_json else "\n".join(conversation_lines(listed)))
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    from voice.log.projections import format_trajectory, trajectory

    store = _store(args, _settings(args))
    conv = _conversation_of(store, args, args.turn)
    records, outcome = trajectory(store, conv, args.turn)
    if args.json:
        print(json.dumps({"turn": args.turn, "conversation": conv, "outcome": outcome,
                          "requests": [r.to_json() for r in records]}, indent=2))
    else:
        print(format_trajectory(args.turn, records, outcome))
    return 0


def cmd_fork(args: argparse.Namespace) -> int:
    from voice.log.projections import fork

    store = _store(args, _settings(args), read_only=False)
    conv = _conversation_of(store, args, args.turn)
    with as_usage_error(ValueError):
        new = fork(store, conv, args.turn)
    print(new)  # alone on stdout, for scripts: id=$(voice fork 3)
    db = f" --db {args.db}" if args.db else ""
    print(f"forked turn {args.turn} of {conv} into {new}; continue it with: "
          f"voice chat{db} --conversation {new}", file=sys.stderr)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from voice.service.replay import run_replay

    _refuse_db(args, f"voice replay always writes a fresh log to {Path(args.out) / 'events.db'} and never "
                     f"touches another; drop --db (read the result with voice history --db {Path(args.out) / 'events.db'})")
    recorded = Path(args.scenario).parent / "config.toml"
    if args.config is None and recorded.is_file():  # a recorded session replays with the settings it ran with
        args.config = str(recorded)
        print(f"using the recorded settings in {recorded}", file=sys.stderr)
    summary = run_replay(Path(args.scenario), Path(args.out), _settings(args), realtime=args.realtime,
                         stt_model=args.stt_model, verbose=args.verbose)
    wrote = "events.db, summary.json" + (", requests.json" if (Path(args.out) / "requests.json").is_file() else "")
    print(f"wrote {args.out}/mic.wav, played.wav, {wrote} "
          f"({summary['device']['duration_s']:.1f} s of audio in {summary['device']['wall_s']:.1f} s)")
    for t in summary["turns"]:
        if t["status"] == "aborted" and t["ack_ms"] is None:  # stopped by no barge-in (`ctl cancel`, `new`)
            print(f"turn {t['turn']}: stopped; delivered: {t['delivered_text']!r}")
        elif t["status"] == "aborted":
            began = {"clip": "its clip's first loud sample", "vad": "the VAD's onset"}.get(t.get("ack_from"), "")
            print(f"turn {t['turn']}: stopped {t['ack_ms']} ms after the barge-in began ({began}; the picture's "
                  f"marks count from the VAD's onset); delivered: {t['delivered_text']!r}")
    if summary["device"]["gave_up"]:
        print(f"voice: warning: {summary['device']['gave_up']}", file=sys.stderr)
    for loss in summary["device"]["losses_not_reached"]:
        print(f"voice: warning: {loss}", file=sys.stderr)
    if args.show:
        from voice.show.load import from_replay_dir
        from voice.show.page import write_html, write_png

        cut = [t["turn"] for t in summary["turns"] if t["status"] == "aborted"]
        for turn in cut or [t["turn"] for t in summary["turns"]]:
            timeline = from_replay_dir(Path(args.out), turn)
            write_html(timeline, Path(args.out) / f"turn-{turn}.html")
            write_png(timeline, Path(args.out) / f"turn-{turn}.png")
            print(f"drew turn {turn}: {args.out}/turn-{turn}.html, turn-{turn}.png")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from voice.show.load import from_store
    from voice.show.page import write_html, write_png

    if args.out is None and args.png is None:
        raise UsageError("voice show needs --out FILE.html or --png FILE.png (or both)")
    for path, kind in ((args.out, _PAGE), (args.png, _PICTURE)):  # both first: never a page without its PNG
        if path is not None:
            _check_writable(Path(path))
            _check_replaceable(Path(path), kind)
    store = _store(args, _settings(args))
    conv = _conversation_of(store, args, args.turn)
    timeline = from_store(store, conv, args.turn)
    for path, write in ((args.out, write_html), (args.png, write_png)):
        if path is not None:
            try:
                write(timeline, path)
            except OSError as exc:
                raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
            print(f"wrote {path}")
    for gap in timeline.gaps:
        print(f"not in the log: {gap}", file=sys.stderr)
    return 0


_PAGE = ("an HTML page", b"<!doctype html>")
_PICTURE = ("a PNG picture", b"\x89PNG\r\n\x1a\n")


def _check_replaceable(path: Path, kind: tuple[str, bytes]) -> None:
    """Only an earlier page or picture is written over: never the log, a
    recording or anything else a mistyped path names."""
    if not path.is_file():
        return
    with path.open("rb") as f:
        head = f.read(len(kind[1]))
    if head.lower() != kind[1].lower():
        raise UsageError(f"{path} exists and is not {kind[0]}: voice show writes only over its own output; "
                         f"choose a new file")


def _check_writable(path: Path) -> None:
    """A file we are about to write can be: its folder exists and takes it."""
    folder = path.parent
    why = ("Is a directory" if path.is_dir() else "No such file or directory" if not folder.is_dir()
           else "Permission denied" if not os.access(folder, os.W_OK | os.X_OK)
           or (path.exists() and not os.access(path, os.W_OK)) else None)
    if why is not None:
        raise UsageError(f"cannot write {path}: {why}")


def cmd_run(args: argparse.Namespace) -> int:
    from voice.service.daemon import run_daemon

    if args.record is not None and not args.record.strip():
        raise UsageError("--record needs a directory (a new or empty one), e.g. --record ~/voice-bug")
    return run_daemon(_settings(args), args.db, args.llm, Path(args.replay) if args.replay else None,
                      verbose=args.verbose, record=Path(args.record).expanduser() if args.record is not None else None)


def cmd_acp(args: argparse.Namespace) -> int:
    from voice.service.acp_server import run_acp

    return run_acp(_settings(args), args.db, args.llm)


def cmd_ctl(args: argparse.Namespace) -> int:
    from voice.service import ctl_format
    from voice.service.control import request, stream_until_stopped

    _refuse_db(args, "voice ctl talks to the running daemon, which keeps its own log; drop --db "
                     "(to read a log file directly: voice history --db PATH)")
    if args.text and args.cmd not in ("say", "save"):
        raise UsageError(f"voice ctl {args.cmd} takes no text (only say and save do)")
    if (args.since is not None or args.follow) and args.cmd != "events":
        raise UsageError("--since and --follow are for voice ctl events")
    if args.list and args.cmd != "history":
        raise UsageError("--list is for voice ctl history")
    if args.always and args.cmd != "approve":
        raise UsageError("--always is for voice ctl approve")
    payload: dict[str, Any] = {"cmd": args.cmd}
    if args.always:
        payload["always"] = True
    if args.list:
        payload["list"] = True
    if args.cmd == "say":
        if not args.text:
            raise UsageError("voice ctl say needs the text to say, e.g. voice ctl say what time is it")
        payload["text"] = " ".join(args.text)
    if args.cmd == "save":
        if len(args.text) != 1:
            raise UsageError("voice ctl save needs one new directory, e.g. voice ctl save ~/voice-bug")
        payload["dir"] = str(Path(args.text[0]).expanduser().resolve())  # the daemon's cwd is not ours
    if args.cmd == "events":
        payload["follow"] = args.follow
        if args.since is not None or not args.follow:
            payload["after"] = max(0, args.since or 0)
    show = ctl_format.as_json if args.json else ctl_format.for_people(args.cmd)
    path = _settings(args).service.socket_path
    if args.cmd == "events":  # a stream: until it ends, or Ctrl-C / SIGTERM
        first = anyio.run(lambda: stream_until_stopped(path, payload, show))
        return 0 if first is None else ctl_format.exit_status(args.cmd, first)
    try:
        first = anyio.run(lambda: request(path, payload, show))
    except KeyboardInterrupt:
        return 0
    return ctl_format.exit_status(args.cmd, first)


def cmd_config(args: argparse.Namespace) -> int:
    from voice.config import override, show

    config, sources = _config_with_sources(args)
    if args.db is not None:
        override(config, sources, "paths.db", args.db, "--db")
    print(show(config, sources), end="")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from voice.service.doctor import run_doctor

    return run_doctor(args.config, args.llm, load_models=not args.no_load, llm_model=args.llm_model, db=args.db)


def cmd_service(args: argparse.Namespace) -> int:
    from voice.service import unit

    print(unit.install() if args.action == "install" else unit.uninstall())
    return 0


def cmd_effects(args: argparse.Namespace) -> int:
    from voice.agent.effects import effects

    store = _store(args, _settings(args))
    found = effects(store)  # read-only: a dispatch with no receipt reads as unknown
    if args.json:
        print(json.dumps([e.to_json() for e in found], ensure_ascii=False, indent=2))
    else:
        for e in found:
            outcome = f" ({e.outcome})" if e.state == "reconciled" else ""
            print(f"turn {e.turn}: {e.tool}({json.dumps(e.arguments, ensure_ascii=False)}) {e.state}{outcome}")
        if not found:
            print("no writes have been dispatched")
    return 0


def cmd_grants(args: argparse.Namespace) -> int:
    from voice.agent.approvals import Grants

    grants = Grants()
    if args.action == "revoke":
        if not (args.server and args.tool):
            raise UsageError("voice grants revoke needs the server and the tool, as voice grants lists them")
        if not grants.revoke(args.server, args.tool):
            raise Failed(f"no grant for {args.tool} of {args.server} (voice grants lists them)")
        print(f"revoked: {args.tool} of {args.server} asks again before each call")
        return 0
    if args.server or args.tool:
        raise UsageError("voice grants takes a server and a tool only with revoke")
    listed = [(s, t, "always allowed") for s, t in grants.list("always")]
    listed += [(s, t, "always declined") for s, t in grants.list("never")]
    for server, tool, what in listed:
        print(f"{server} {tool}: {what}")
    if not listed:
        print(f"no grants ({grants.path}): every call that asks first asks each time")
    return 0


COMMANDS = {"grants": cmd_grants, "chat": cmd_chat, "effects": cmd_effects, "replay": cmd_replay, "show": cmd_show, "run": cmd_run, "acp": cmd_acp, "ctl": cmd_ctl,
            "config": cmd_config, "doctor": cmd_doctor, "service": cmd_service, "history": cmd_history, "trace": cmd_trace, "fork": cmd_fork}


def main(argv: list[str] | None = None) -> int:
    from voice.audio.clock import install_test_sleep
    from voice.paths import make_files_private

    from voice.log.events import DamagedEvent

    make_files_private()  # the log, notes, recordings: the user's alone
    install_test_sleep()  # (tests only: VOICE_TEST_SLEEP_FILE, a simulated sleep; voice.audio.clock)
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except DamagedEvent as exc:  # a log changed outside voice: say which row, keep the rest as it is
        print(f"voice: error: {exc}", file=sys.stderr)
        return 2
    except (UsageError, Failed, BrokenPipeError, BaseExceptionGroup) as exc:
        leaves = _leaves(exc)
        if not all(isinstance(e, (UsageError, Failed, BrokenPipeError)) for e in leaves):
            raise  # a bug, with others beside it: shown whole, never reduced to one line
        if any(isinstance(e, BrokenPipeError) for e in leaves):
            return _pipe_closed()
        for line in dict.fromkeys(str(e) for e in leaves):  # each problem once, in order
            print(f"voice: error: {line}", file=sys.stderr)
        return 2 if any(isinstance(e, UsageError) for e in leaves) else 1
    except KeyboardInterrupt:
        return 130


def _pipe_closed() -> int:
    """Whoever read our output stopped reading (`voice history | head -1`):
    that is not an error to report. Point stdout at /dev/null so the flush at
    exit does not fail again, and end as a process killed by SIGPIPE would."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + 13  # SIGPIPE


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions in `exc`, with task groups' wrapping taken off."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


if __name__ == "__main__":
    sys.exit(main())
