"""The network's edges: loopback, what we bind and admit, what may be fetched, TLS."""
