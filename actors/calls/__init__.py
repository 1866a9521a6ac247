"""The dispatcher and its executors: one chokepoint for every tool call."""
