"""The admin: read-only pages over the mirrored jobs and queues, live pages
over Redis, and the few actions an operator takes (retry, cancel, remove,
pause). Django's ``autodiscover`` imports this package; importing it
registers the model admins."""

from . import model_admins, schedules  # noqa: F401  (registers the ModelAdmins)
