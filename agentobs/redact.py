"""Secrets never echoed: every URL agentobs prints, logs, shows or writes goes through ``mask_url`` first."""

from __future__ import annotations

import re

# scheme://user:password@ — the password runs to the netloc's last "@" (a raw "@" in it stays hidden too)
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^/\s]*@")


def mask_url(text) -> str:
    """``text`` (a URL, or a message quoting URLs) with the password of every URL in it replaced by ``***``:
    ``http://user:***@host:8123/db``. Text without a URL password, such as a file path, comes back unchanged."""
    return _USERINFO.sub(r"\g<head>***@", str(text))
