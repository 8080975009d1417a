"""The wheel carries the Lua scripts and works from a fresh venv: build it
from a copy of the checkout, install it (with its dependencies, from the
package index) into a new venv, and run one job through it against the private
Redis from a directory outside the repo. Then the steps of
docs/tutorial/index.md and docs/howto/tasks-backend.md: a fresh ``django-admin
startproject``, the app and a ``@task`` added, ``migrate``, ``check``, the task
and an ``async def`` handler run through ``runworker``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# What a wheel is built from; copied so the build leaves no build/ in the checkout.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "echomq_django", "lua")
SCRIPT = textwrap.dedent("""
    import sys
    import redis
    from echomq_django import EchoMQ
    from echomq_django.protocol.scripts import lua_dir

    mq = EchoMQ(redis.Redis.from_url(sys.argv[1]), prefix="wheel")
    job_id = mq.enqueue("wheelq", "wheel.job", {"n": 1}, job_id="w1")
    [job] = mq.claim("wheelq", 1)
    mq.complete(job, {"ok": True})
    print(lua_dir())
    print(mq.get_job("wheelq", job_id).state.value)
""")


def run(*args: str, cwd: Path, env: dict | None = None) -> str:
    done = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=600, check=False, env=env
    )
    assert done.returncode == 0, f"{args[:3]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("dist")
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--quiet",
        "-w",
        str(out),
        str(src),
        cwd=src,
    )
    [built] = out.glob("echomq_django-*.whl")
    return built


def test_wheel_contains_the_lua_scripts(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"echomq_django/lua/{p.name}" for p in (REPO / "lua").glob("*.lua")}
    assert "echomq_django/lua/claim.lua" in expected
    assert expected <= names
    assert "echomq_django/lua/lib/flow.lua" in names


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed (and, before Django 6, the
    tasks extra: the django-tasks backport)."""
    where = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", str(where), cwd=where)
    spec = str(wheel) + ("[tasks]" if sys.version_info < (3, 12) else "")
    run(str(where / "bin" / "python"), "-m", "pip", "install", "--quiet", spec, cwd=where)
    return where


def test_wheel_is_typed_and_licensed(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "echomq_django/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_one_job_through_a_fresh_venv(venv: Path, tmp_path: Path, r, redis_server: str) -> None:
    python = venv / "bin" / "python"
    (tmp_path / "one_job.py").write_text(SCRIPT)
    out = run(str(python), "-I", "one_job.py", redis_server, cwd=tmp_path).split()
    assert out[-1] == "completed"
    assert Path(out[-2]).is_relative_to(venv), "the scripts came from the installed wheel"
    assert r.hget("wheel:{wheelq}:job:w1", "result") == b'{"ok":true}'


SETTINGS = textwrap.dedent("""

    # --- added as docs/tutorial/index.md says ---
    import os
    from importlib.util import find_spec

    INSTALLED_APPS += ["echomq_django", "shop"]
    if find_spec("django.tasks") is None:
        INSTALLED_APPS += ["django_tasks"]  # the backport, on Django 5.2
    ECHOMQ = {
        "URL": os.environ.get("ECHOMQ_URL", "redis://127.0.0.1:6379/0"),
        "PREFIX": "site",
        "QUEUES": {"default": {"MAX_ATTEMPTS": 3}},
    }
    TASKS = {
        "default": {"BACKEND": "echomq_django.tasks.EchoMQBackend", "QUEUES": ["default"]}
    }
""")
TASKS_PY = textwrap.dedent("""
    try:
        from django.tasks import task
    except ImportError:
        from django_tasks import task


    @task
    def add(a, b):
        return a + b
""")
JOBS_PY = textwrap.dedent("""
    import echomq_django as emq


    @emq.handler("shop.hello")
    async def hello(job):
        return {"hello": job.payload["name"]}
""")
ENQUEUE = (
    "import echomq_django as emq; from shop.tasks import add; "
    "print(add.enqueue(2, 3).id); print(emq.enqueue('default', 'shop.hello', {'name': 'ada'}))"
)
READ = (
    "import echomq_django as emq; from shop.tasks import add; "
    "r = add.get_result({task!r}); print(r.status, r.return_value); "
    "print(emq.get_job('default', {job!r}).result)"
)


def test_a_fresh_startproject_runs_a_task_through_runworker(
    venv: Path, tmp_path: Path, r, redis_server: str
) -> None:
    bin_ = venv / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    env["ECHOMQ_URL"] = redis_server
    run(str(bin_ / "django-admin"), "startproject", "mysite", str(tmp_path), cwd=tmp_path, env=env)
    python = str(bin_ / "python")

    def manage(*args: str) -> str:
        return run(python, "manage.py", *args, cwd=tmp_path, env=env)

    manage("startapp", "shop")
    (tmp_path / "shop" / "tasks.py").write_text(TASKS_PY)
    (tmp_path / "shop" / "jobs.py").write_text(JOBS_PY)
    with (tmp_path / "mysite" / "settings.py").open("a") as settings:
        settings.write(SETTINGS)
    manage("check")
    manage("migrate", "--verbosity", "0")
    # (Django >= 5.2's shell may print a line of its own first)
    task_id, job_id = manage("shell", "-c", ENQUEUE).split()[-2:]
    manage("runworker", "default", "--burst")
    manage("runpump", "default", "--once")
    read = READ.format(task=task_id, job=job_id)
    status, result = manage("shell", "-c", read).strip().split("\n")[-2:]
    assert status == "SUCCESSFUL 5"
    assert result == "{'hello': 'ada'}"
    assert r.hget(f"site:{{default}}:job:{task_id}", "s") == b"completed"
