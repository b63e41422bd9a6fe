from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from stores import new_store

from agentobs.config import load_settings
from agentobs.model import connect
from agentobs.store.writer import Writer

# Streamlit's AppTest runs the console script as ``__main__`` (sys.modules["__main__"] = the app's module) and leaves
# it there; a collector started later in the same worker gets decoder processes from a forkserver, whose spawn
# preparation re-runs the main module's file — the console app — and breaks the pool. Each test starts with
# pytest's own ``__main__`` back.
_MAIN = sys.modules["__main__"]


@pytest.fixture(autouse=True)
def _pytest_main_module():
    sys.modules["__main__"] = _MAIN
    yield
    sys.modules["__main__"] = _MAIN

FIXTURES = Path(__file__).parent / "fixtures"

# `make test` hands whole files to two pytest-xdist workers (--dist loadfile) in collection order
# (--no-loadscope-reorder: xdist would otherwise start with the files of most tests and leave these few-test,
# costly files for the end, one worker running them while the other idles). The costliest files go first, longest
# first, so that the two workers finish together; a sample_db user leads the second worker, so the first worker
# (ClickHouse parity, which does not read the sample) never waits for the sample's import. The costs that set this
# order are in docs/testing.md.
COSTLIEST_FIRST = (
    "test_clickhouse_parity.py", "test_findings_ledger.py", "test_console_browser.py", "test_model_state.py",
    "test_metrics_golden_cases.py", "test_console_clickhouse.py", "test_collect_service.py", "test_console_app.py",
    "test_clickhouse_backend.py", "test_demo.py", "test_findings_rules.py", "test_causes_evidence.py",
    "test_whatif.py", "test_loadgen.py", "test_instance_evidence.py", "test_cli_sessions.py",
    "test_metrics_prepare_v1.py", "test_metrics_golden.py", "test_sim_bundle.py", "test_findings_sample.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The costliest files first (COSTLIEST_FIRST's order), the others after them as collected; a file's own tests
    keep their order (a stable sort on the file)."""
    rank = {name: i for i, name in enumerate(COSTLIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def settings():
    return load_settings(env={})


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "test.duckdb"


@pytest.fixture
def store(db_path):
    """A fresh read-write store and its writer: (connection, writer)."""
    con = new_store(db_path)
    w = Writer(con, batch_rows=10_000, flush_s=0.05)
    yield con, w
    w.close()
    con.close()


SAMPLE_BUNDLE = Path(__file__).parent.parent / "sample_data" / "fleet"


def _build_sample(path: Path) -> None:
    from agentobs.collect.bundle import import_bundle
    from agentobs.config import Settings

    con = connect(path)
    with Writer(con) as w:
        import_bundle(SAMPLE_BUNDLE, w, Settings())
    con.close()


@pytest.fixture(scope="session")
def sample_db(tmp_path_factory) -> Path:
    """sample_data/fleet imported once for the whole test session (read it only: tests share it). Under
    pytest-xdist the first worker that asks imports it into the run's common temp folder and every worker
    copies that file into its own (DuckDB lets one process at a time write a file)."""
    if not (SAMPLE_BUNDLE / "manifest.json").exists():
        pytest.skip("sample_data/fleet not in this checkout")
    path = tmp_path_factory.mktemp("sample_shared") / "sample.duckdb"
    if "PYTEST_XDIST_WORKER" not in os.environ:  # one process
        _build_sample(path)
        return path
    common = tmp_path_factory.getbasetemp().parent  # shared by the run's workers
    built, claim, failed = common / "sample.duckdb", common / "sample.claim", common / "sample.failed"
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:  # another worker is importing it: wait for its file (renamed into place when whole)
        deadline = time.monotonic() + 900
        while not built.exists():
            if failed.exists():
                raise RuntimeError(f"another xdist worker failed to import the sample: {failed.read_text()}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"{built} not built by another xdist worker within 900 s") from None
            time.sleep(0.2)
    else:
        part = common / "sample.duckdb.part"
        try:
            _build_sample(part)
        except BaseException as e:
            failed.write_text(repr(e))
            raise
        part.rename(built)
    shutil.copyfile(built, path)
    return path
