"""The async pool's room: ``async def`` handlers run as coroutines on one
event loop (docs/howto/async-handlers.md#the-async-pool)."""
