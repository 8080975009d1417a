"""Talking to a job while it runs or once it ends (docs/explanation/house.md,
"protocol/live/"): waiting for its result, and what a caller follows
without polling."""
