"""Tools on top of the core: the benchmark and the evaluation harness."""
