"""The weekly report's SQL files (agentobs/report/queries/*.sql): every header is complete and agrees with its body,
and a header that does not is refused with the file and line."""

from __future__ import annotations

import pytest

from agentobs.errors import QueryError
from agentobs.report.query_files import load, names, parse


def test_every_report_query_has_a_checked_header():
    assert names() == ["about", "spend", "task_types", "totals"]
    for n in names():
        q = load(n)
        assert q.header["summary"] and q.header["reads"].startswith("m_calls")
    assert load("totals").params == ("lo", "hi") and load("about").params == ("ids",)
    assert load("spend").fields == ("cols", "sets", "dim", "value") and load("about").fields == ("key", "usual")


GOOD = """-- query: q
-- summary: one row
--   over two lines
-- reads: m_calls
-- params: lo
-- template: key (a column)
SELECT {key} FROM m_calls WHERE start_s >= $lo
"""


def test_a_good_header_and_its_template():
    q = parse("q", GOOD, "q.sql")
    assert q.header["summary"] == "one row over two lines"
    assert q.render(key="task_id") == "SELECT task_id FROM m_calls WHERE start_s >= $lo\n"
    with pytest.raises(QueryError, match=r"takes fields \['key'\], got \['col'\]"):
        q.render(col="x")


@pytest.mark.parametrize("text,message", [
    (GOOD.replace("-- reads: m_calls\n", ""), r"q.sql:1: header lacks reads"),
    (GOOD.replace("-- query: q", "-- query: other"), r"header says query 'other', the file is 'q'"),
    (GOOD.replace("-- params: lo", "-- params: lo, hi"), r"parameters in the body \['lo'\] are not the header's"),
    (GOOD.replace("-- template: key (a column)", "-- template: key, other"), r"template fields in the body"),
    (GOOD.replace("-- reads:", "-- raeds:"), r"q.sql:4: unknown header key 'raeds'"),
])
def test_a_header_that_disagrees_is_refused(text, message):
    with pytest.raises(QueryError, match=message):
        parse("q", text, "q.sql")
