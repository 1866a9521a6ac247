"""The permission gate: policy and decisions, approvals, tokens, what a person is asked."""
