"""A test app whose ``jobs`` module registers the ``t.*`` handlers the worker
tests run (discovered at startup like any installed app's ``jobs.py``)."""
