"""Node network telemetry: sysfs reads (InfiniBand, RoCE, netdev) and counter arithmetic."""
