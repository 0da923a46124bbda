"""The bodies of the event log's rows, by family (re-exported by voice.log.events)."""
