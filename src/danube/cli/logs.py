"""The broker's log: one line per event on stderr, `key=value` after the level (`text`, the
default) or one JSON object per line (`json`, for a log shipper).

The messages themselves are `event=... key=value ...`; the JSON form parses those pairs into
fields (numbers stay strings: a field's type must not change with its value), keeps any
other text under `message`, and a traceback under `exc_info`.

grpclib logs an INFO line of its own for every call a client abandons ("Request was
cancelled: Connection lost"), without saying which call: it is kept at WARNING, and the
broker logs its own `event=stream_closed` (danube.runtime.grpc_util) instead, or one
`event=grpc_streams_cut` for a connection that closed with many calls open; with
`--log-level debug` grpclib's lines are shown too.
"""

from __future__ import annotations

import json
import logging
import re
import time

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"

_PAIR = re.compile(r"""\s*([A-Za-z_][\w.]*)=('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\S*)""")


def fields_of(message: str) -> dict[str, str]:
    """`key=value` pairs of a message (quoted values unquoted); text that is not a pair goes
    under `message`."""
    fields: dict[str, str] = {}
    rest: list[str] = []
    position = 0
    while position < len(message):
        match = _PAIR.match(message, position)
        if match is None:
            end = message.find(" ", position + 1)
            end = len(message) if end < 0 else end
            rest.append(message[position:end].strip())
            position = end
            continue
        key, value = match.group(1), match.group(2)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1].replace("\\" + value[0], value[0]).replace("\\\\", "\\")
        fields[key] = value
        position = match.end()
    text = " ".join(part for part in rest if part)
    if text:
        fields["message"] = text
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        created = time.gmtime(record.created)
        line: dict[str, str] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", created) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
        }
        for key, value in fields_of(record.getMessage()).items():
            line.setdefault(key, value)
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def setup_logging(level: str, log_format: str = "text") -> None:
    handler = logging.StreamHandler()
    json_lines = log_format == "json"
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    debug = level.lower() == "debug"
    logging.getLogger("grpclib").setLevel(logging.NOTSET if debug else logging.WARNING)
