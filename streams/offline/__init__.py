"""The offline path: replay of archives and Kafka ranges through the same core."""
