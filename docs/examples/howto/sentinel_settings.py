# settings.py (docs/howto/sentinel.md): the sentinels to ask, and the name
# they know the master by (the name in their `sentinel monitor` line)
ECHOMQ = {
    "SENTINELS": [("10.0.0.1", 26379), ("10.0.0.2", 26379), ("10.0.0.3", 26379)],
    "MASTER_NAME": "mymaster",
    "SENTINEL_KWARGS": {"socket_timeout": 0.5},  # for the sentinels themselves
    "OPTIONS": {"socket_timeout": 5},  # for the master: db, password, timeouts...
    "QUEUES": {"counting": {"MAX_ATTEMPTS": 3}, "reports": {}},
}

# or the same as one URL (in ECHOMQ["URL"] or the ECHOMQ_URL environment variable)
SENTINEL_URL = "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/mymaster/0"
