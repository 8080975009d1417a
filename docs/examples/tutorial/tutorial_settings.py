"""The tutorial's project settings in miniature, for the docs' tests
(tests/test_docs_examples.py): what ``django-admin startproject`` writes
that matters here, then the lines docs/tutorial/index.md adds, read from
settings_snippet.py itself so the page and the test cannot drift apart.
"""

import tempfile
from pathlib import Path

SECRET_KEY = "tutorial-only"
DEBUG = True
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = __name__
urlpatterns = []
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(Path(tempfile.gettempdir()) / "echomq-tutorial.sqlite3"),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

exec((Path(__file__).parent / "settings_snippet.py").read_text())
