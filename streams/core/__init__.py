"""The pure core: records in, records out; no I/O. Shared by the live stream, replay and the evaluation."""
