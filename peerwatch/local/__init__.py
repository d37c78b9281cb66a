"""Local services for development, tests and the demo: a real Kafka broker, started without Docker."""
