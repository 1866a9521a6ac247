"""The worker pool: ability worker processes over ZeroMQ."""
