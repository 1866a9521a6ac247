"""The call pipeline: a call checked, resolved, healed, run, rendered and recorded."""
