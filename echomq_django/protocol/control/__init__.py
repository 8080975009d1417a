"""What an operator changes while the queues run (docs/explanation/house.md,
"protocol/control/"): a queue's concurrency cap, its groups' pause and caps,
and the periodic entries added at run time, kept in Redis so every worker
and pump sees a change without a restart."""
