"""The agentobs console, from a checkout: ``streamlit run dashboards/console.py -- --db PATH``.

The app itself lives in the package (``agentobs/console/``: ``app.py`` + ``views/``) so that
``agentobs console`` works from an installed wheel; this file only runs it. See docs/console.md.
"""

from agentobs.console.shell import run

run()
