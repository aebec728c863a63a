"""The drafters: where speculative tokens come from, one module each, and the `Proposal` they return."""
