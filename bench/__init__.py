"""The flow benchmark (docs/explanation/performance.md#the-benchmark):
``python -m bench --help``."""
