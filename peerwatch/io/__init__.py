"""Shared I/O: what every side (live worker, replay, exporters, tools) reads and writes the same
way. ``topic_reader``: a topic read up to its end, bounded in time."""
