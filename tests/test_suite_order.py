"""The suite's own scheduling hint (conftest.COSTLIEST_FIRST) names files that exist: a renamed file would
otherwise drop silently to the end of the order."""

from __future__ import annotations

from pathlib import Path

from conftest import COSTLIEST_FIRST


def test_costliest_first_names_existing_files_once():
    here = Path(__file__).parent
    assert [n for n in COSTLIEST_FIRST if not (here / n).is_file()] == []
    assert len(set(COSTLIEST_FIRST)) == len(COSTLIEST_FIRST)
