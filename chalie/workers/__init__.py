"""Ability worker processes: the process itself and the broker's bookkeeping."""
