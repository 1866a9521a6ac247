"""Conversations: their parent, a turn actor each, the port, delegates, chat."""
