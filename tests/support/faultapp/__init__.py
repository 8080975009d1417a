"""A test app whose ``jobs`` module registers the ``fault.*`` handlers the
fault suite runs (tests/test_fault_suite.py); installed only by
``tests.support.fault_settings``."""
