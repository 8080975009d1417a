"""What an operator changes while the queues run (docs/explanation/house.md,
"protocol/control/"): a queue's concurrency cap, kept in Redis so every
worker sees it at its next claim."""
