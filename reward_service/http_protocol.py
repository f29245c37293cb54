"""uvicorn's httptools protocol, with a 400 that names what is malformed.

A request whose head the HTTP parser rejects (a Content-Length that is not one decimal number, an empty or
overflowing one, a bad header character) never reaches the app: uvicorn answers a plain-text "Invalid HTTP request
received." and closes. This subclass answers the same status with the service's JSON error body
(`{"status": "error", "error": ...}`) quoting the parser's reason, e.g. "Invalid character in Content-Length", and
how to fix it; nothing was read or queued. Used when httptools is installed (the `service` extra), else uvicorn's
default protocol answers.
"""

from __future__ import annotations

import json
from typing import Any

STATUS_LINE = b"HTTP/1.1 400 Bad Request\r\n"


def explain(reason: str) -> str:
    """The error text of a request the parser refused for `reason`."""
    if "content-length" in reason.lower():
        return (
            f"malformed request head: {reason}. The Content-Length header must be one decimal byte count equal to "
            "the body's length (or send Transfer-Encoding: chunked); nothing was read or queued."
        )
    return f"malformed request head: {reason}. Nothing was read or queued; send a valid HTTP/1.1 request."


def protocol_class() -> Any:
    """The protocol class for `uvicorn.Config(http=...)`: `ExplainingHttpTools` with httptools, else "auto"."""
    try:
        import httptools
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "auto"

    class ExplainingHttpTools(HttpToolsProtocol):
        """HttpToolsProtocol whose parser errors get a JSON 400 naming the reason (see the module doc)."""

        def data_received(self, data: bytes) -> None:
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
            except httptools.HttpParserError as exc:
                self.logger.warning("Invalid HTTP request received: %s", exc)
                self.send_explained_400(explain(str(exc)))

        def send_explained_400(self, error: str) -> None:
            body = json.dumps({"status": "error", "error": error}).encode()
            head = [STATUS_LINE]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head += [
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n\r\n",
            ]
            self.transport.write(b"".join(head) + body)
            self.transport.close()

    return ExplainingHttpTools
