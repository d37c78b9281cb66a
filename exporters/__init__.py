"""Exporters: OTLP, stdout, the archive writer, the drain controller sink."""
