"""Stream processors: attribution, per-job windows, the straggler detector, the drain policy."""
