"""The application: the composition root that wires the core and the actors into a daemon."""
