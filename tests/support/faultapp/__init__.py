"""A test app whose ``jobs`` module registers the ``fault.*`` handlers the
fault suite runs (tests/faults/test_chaos.py); installed only by
``tests.support.fault_settings``."""
