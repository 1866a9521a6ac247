"""Conversations: events, storage, channels and the act loop's pure rules."""
