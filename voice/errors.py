"""Errors that end a command with a one-line message: exit status 2 for
bad input, 1 for a request that failed."""


class UsageError(Exception):
    """Bad input from the person: a flag, a file, a config value, an
    unreachable endpoint. The message names the problem and the fix."""


class Failed(Exception):
    """A request that was understood but did not succeed (the daemon refused
    it or went away before answering): one line, exit status 1."""
