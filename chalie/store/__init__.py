"""The store: one interface over SQLite and PostgreSQL, where it lives, copying it."""
