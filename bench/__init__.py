"""The flow benchmark (issue 8): ``python -m bench --help``."""
