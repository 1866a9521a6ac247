"""Chat bridges: the protocol, the session, and the WebSocket and ZeroMQ transports."""
