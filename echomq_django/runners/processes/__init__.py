"""The process pool's room: handlers run in pre-forked child processes that
the worker can kill (docs/howto/process-pool.md)."""
