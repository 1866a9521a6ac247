"""What crosses a boundary: messages and events, who sends them, tool names, the bus."""
