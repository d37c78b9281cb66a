"""Avro contracts (*.avsc) and the codec: the only place a wire format is defined."""
