"""Errors that end a command with a one-line message and exit status 2."""


class UsageError(Exception):
    """Bad input from the person: a flag, a file, a config value, an
    unreachable endpoint. The message names the problem and the fix."""
