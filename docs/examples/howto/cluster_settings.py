# settings.py (docs/howto/cluster.md): any node of the cluster; the client
# reads the slot map from it and follows MOVED and ASK answers
ECHOMQ = {
    "URL": "redis://10.0.0.11:7000/0",
    "CLUSTER": True,
    "QUEUES": {"counting": {"MAX_ATTEMPTS": 3}, "reports": {}},
}
