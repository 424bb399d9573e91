"""Errors Flide reports to its users.

Every error a request can cause names the request field at fault, so an HTTP
route can answer 4xx with it and a CLI can print it on one line.
"""

from __future__ import annotations

import re

# Pydantic names the member of a union it tried in the error location.
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|dict\[.*\]|list\[.*\]|function-\w+\[.*\]|[\w-]+\[.*\])$")


class FlideError(Exception):
    """Base class of Flide's user-facing errors."""


class RequestError(FlideError, ValueError):
    """A request that cannot be answered as sent.

    Attributes:
        field: dotted path of the offending request field, e.g. ``questions[2].options``.
        message: what is wrong with it, in words.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")

    def to_dict(self) -> dict:
        return {"field": self.field, "message": self.message}


class ModelLoadError(FlideError):
    """A model path or built-in model name that cannot be loaded."""


def field_path(loc: tuple) -> str:
    """Render a pydantic error location ``('questions', 1, 'options')`` as
    ``questions[1].options``."""
    out = ""
    for part in loc:
        if isinstance(part, str) and _UNION_TAG.match(part):
            continue  # a union member's type tag such as 'str' or 'list[int]', not a field
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "request"


def validate_model(model, obj, tags: tuple = ()):
    """``model.model_validate(obj)``, with any failure as a RequestError naming the
    first offending field.

    Args:
        model: a pydantic model class.
        obj: the raw request (usually a dict from JSON).
        tags: discriminator values to leave out of field paths (e.g. ``"choice"``).

    Raises:
        RequestError: the field and message of the first validation error, or
            ``request`` when the input is nested too deeply to validate.
    """
    from pydantic import ValidationError

    try:
        return model.model_validate(obj)
    except RecursionError:
        raise RequestError("request", "is nested too deeply") from None
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(p for p in err["loc"] if p not in tags)
        raise RequestError(field_path(loc), err["msg"].removeprefix("Value error, ")) from None
