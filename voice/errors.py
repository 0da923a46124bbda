"""Errors that end a command with a one-line message: exit status 2 for
bad input, 1 for a request that failed."""

from collections.abc import Iterator
from contextlib import contextmanager


class UsageError(Exception):
    """Bad input from the person: a flag, a file, a config value, an
    unreachable endpoint. The message names the problem and the fix."""


class Failed(Exception):
    """A request that was understood but did not succeed (the daemon refused
    it or went away before answering): one line, exit status 1."""


@contextmanager
def as_usage_error(*kinds: type[Exception]) -> Iterator[None]:
    """Errors of these kinds, whose message already names the problem and
    the fix (a file that is not a log, a scenario's bad key, a device that
    will not open), end the command as that one line."""
    try:
        yield
    except kinds as exc:
        raise UsageError(str(exc)) from None
