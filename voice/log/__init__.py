"""The durable event log and the views derived from it."""
