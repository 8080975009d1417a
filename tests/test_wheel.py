"""The wheel carries the Lua scripts and works from a fresh venv (issue 2
point 1): build it from a copy of the checkout, install it (with its
dependencies, from the package index) into a new venv, and run one job
through it against the private Redis from a directory outside the repo."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
# What a wheel is built from; copied so the build leaves no build/ in the checkout.
SOURCES = ("pyproject.toml", "README.md", "echomq_django", "lua")
SCRIPT = textwrap.dedent("""
    import sys
    import redis
    from echomq_django import EchoMQ
    from echomq_django.scripts import lua_dir

    mq = EchoMQ(redis.Redis.from_url(sys.argv[1]), prefix="wheel")
    job_id = mq.enqueue("wheelq", "wheel.job", {"n": 1}, job_id="w1")
    [job] = mq.claim("wheelq", 1)
    mq.complete(job, {"ok": True})
    print(lua_dir())
    print(mq.get_job("wheelq", job_id).state.value)
""")


def run(*args: str, cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
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


def test_one_job_through_a_fresh_venv(wheel: Path, tmp_path: Path, r, redis_server: str) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", str(venv), cwd=tmp_path)
    python = venv / "bin" / "python"
    run(str(python), "-m", "pip", "install", "--quiet", str(wheel), cwd=tmp_path)
    (tmp_path / "one_job.py").write_text(SCRIPT)
    out = run(str(python), "-I", "one_job.py", redis_server, cwd=tmp_path).split()
    assert out[-1] == "completed"
    assert Path(out[-2]).is_relative_to(venv), "the scripts came from the installed wheel"
    assert r.hget("wheel:{wheelq}:job:w1", "result") == b'{"ok":true}'
