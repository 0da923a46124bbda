"""The picture of a turn: what was heard and when (issue #18)."""
