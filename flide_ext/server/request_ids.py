"""Request ids (SGLang's ``rid``): the ``X-Request-Id`` a client sends, or a new
one, for each HTTP request. It is echoed on every response, carried as ``rid``
in every error body Flide writes, and ends the server's log lines for the
request (uvicorn's access line, and errors logged while it runs).
"""

from __future__ import annotations

import copy
import logging
import re
import uuid
from contextvars import ContextVar

HEADER = b"x-request-id"
# A client's id is kept when it is 1 to 128 visible ASCII characters (no spaces,
# so a log line's rid= field stays one word); anything else gets a new id.
_ACCEPTED = re.compile(rb"[!-~]{1,128}")

# The id of the request whose task is running; set by the outermost middleware
# in the request's own task, so every line logged in that task can read it.
RID: ContextVar[str] = ContextVar("flide_rid", default="-")


def request_id(scope: dict) -> str:
    """The request's id: its ``X-Request-Id`` header when acceptable, else a new
    uuid4 hex (as SGLang makes its rids)."""
    for name, value in scope.get("headers", ()):
        if name == HEADER:
            if _ACCEPTED.fullmatch(value):
                return value.decode("ascii")
            break
    return uuid.uuid4().hex


class RidFilter(logging.Filter):
    """Gives each record ``rid`` (the running request's id, ``-`` outside one)
    and ``rid_note`` (`` rid=<id>`` inside a request, empty outside)."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = RID.get()
        record.rid = rid
        record.rid_note = "" if rid == "-" else f" rid={rid}"
        return True


def uvicorn_log_config() -> dict:
    """uvicorn's own logging configuration, with the request id at the end of
    its access lines (`` rid=<id>``) and of the lines it logs inside a request."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["rid"] = {"()": RidFilter}
    config["formatters"]["access"]["fmt"] += " rid=%(rid)s"
    config["formatters"]["default"]["fmt"] += "%(rid_note)s"
    for handler in config["handlers"].values():
        handler.setdefault("filters", []).append("rid")
    return config
