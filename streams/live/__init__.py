"""The live path: the faust app and its hot stage (Kafka in, Kafka out)."""
