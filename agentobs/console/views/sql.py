"""SQL: read-only queries over the source (agentobs.source: Source.user_sql), schema browser, saved queries,
downloads."""

from __future__ import annotations

import streamlit as st

from agentobs.config import load_settings
from agentobs.console import data, saved, ui
from agentobs.errors import AgentobsError
from agentobs.output import render

SOURCE = data.source(ui.stamp())
ctx = ui.page("SQL", note=SOURCE.sql_rules + " Results are capped in rows and time.")
settings = load_settings()

# The URL holds the last query run (q) and its row cap / time limit when not the defaults: opening the link (or
# reloading) shows that query and runs it again (read-only, capped in rows and time like any run).
DEFAULT_CAP, DEFAULT_TIMEOUT = int(settings.sql_row_cap), float(settings.sql_timeout_s)
url_q = st.query_params.get("q")
cap0 = ui.from_url("sql_cap", "rows", cast=lambda v: int(v) if 1 <= int(v) <= 1_000_000 else None, default=DEFAULT_CAP)
timeout0 = ui.from_url("sql_timeout", "timeout", cast=lambda v: float(v) if 1 <= float(v) <= 600 else None,
                       default=DEFAULT_TIMEOUT)
if "sql_text" not in st.session_state:
    st.session_state["sql_text"] = url_q or saved.EXAMPLES[0][1]
    if url_q and "sql_last" not in st.session_state:
        st.session_state["sql_last"] = (url_q, int(cap0), float(timeout0))

editor, side = st.columns([3, 1])

with side:
    st.subheader("Saved queries")
    queries = saved.load()
    names = [name for name, _ in queries]

    def _load():
        pick = st.session_state.get("sql_pick")
        st.session_state["sql_text"] = dict(queries).get(pick, st.session_state["sql_text"])

    st.selectbox("Open", names, index=None, key="sql_pick", on_change=_load, placeholder="choose a query")
    st.subheader("Schema")
    sch = ui.schema(ctx.stamp)
    for (obj, kind), cols in sch.group_by(["name", "kind"], maintain_order=True):
        with st.expander(f"{obj} ({'view' if kind == 'view' else 'table'})"):
            st.markdown("\n".join(f"- `{c}` {t.lower()}" for c, t in zip(cols["column"], cols["type"], strict=True)))

with editor:
    # one form: the query text and the click reach the app together (no lost edits before "Run query")
    with st.form("sql_form", border=False):
        st.text_area("Query", key="sql_text", height=220, label_visibility="collapsed")
        c1, c2, c3 = st.columns([1, 1, 2])
        row_cap = c1.number_input("Row cap", min_value=1, max_value=1_000_000, step=1000, key="sql_cap")
        timeout = c2.number_input("Time limit (s)", min_value=1.0, max_value=600.0, key="sql_timeout")
        run = c3.form_submit_button("Run query", type="primary")
        s1, s2 = st.columns([3, 1])
        name = s1.text_input("Save the query as", placeholder="name", key="sql_save_name")
        save = s2.form_submit_button("Save query")
    if save:
        try:
            if not name.strip():
                raise AgentobsError("a saved query needs a name")
            where = saved.save(name.strip(), st.session_state["sql_text"])
            st.success(f"saved {name.strip()!r} to {where}")
        except AgentobsError as e:
            st.error(str(e))
    if run:
        st.session_state["sql_last"] = (st.session_state["sql_text"], int(row_cap), float(timeout))
    last = st.session_state.get("sql_last")
    if last:
        sql_text, cap, limit = last
        ui.to_url("q", sql_text)
        ui.to_url("rows", cap, default=DEFAULT_CAP)
        ui.to_url("timeout", limit, default=DEFAULT_TIMEOUT)
        try:
            res = data.source(ctx.stamp).user_sql(sql_text, row_cap=cap, timeout_s=limit)
        except AgentobsError as e:
            st.error(str(e))
        else:
            note = res.notice()
            msg = f"{res.table.num_rows:,} rows in {res.elapsed_s * 1000:.0f} ms"
            (st.warning if note else st.success)(msg + (f" — {note}" if note else ""))
            st.dataframe(res.table, width="stretch", hide_index=True)  # the query's own values, unformatted
            d1, d2, _ = st.columns([1, 1, 3])
            d1.download_button("Download CSV", render(res.table, "csv"), "agentobs-query.csv", "text/csv",
                               on_click="ignore")
            d2.download_button("Download Parquet", render(res.table, "parquet"), "agentobs-query.parquet",
                               "application/vnd.apache.parquet", on_click="ignore")
