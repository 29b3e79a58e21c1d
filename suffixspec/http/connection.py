"""uvicorn's HTTP/1.1 connection (h11) with a deadline on a request's head.

uvicorn closes a keep-alive connection that stays silent for `timeout_keep_alive` after a response,
but it has no deadline on the head itself: a connection that sends nothing at all, or drips its
request line and headers a byte at a time, stays open for ever (and one byte resets the keep-alive
timer). `head_deadline_protocol(seconds)` is the protocol class whose connections must deliver a whole
request head within `seconds` of opening, and again of each response's end; else the connection is
closed (with a 408 when part of a head came). Bodies have their own deadline (`limits.read_body`).
"""

from __future__ import annotations

import logging

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["head_deadline_protocol"]

log = logging.getLogger(__name__)

TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
               b"content-length: %d\r\n\r\n%s")
BODY_408 = (b'{"error":{"message":"the request head did not arrive in time","type":"invalid_request_error",'
            b'"param":null,"code":"request_timeout"}}')


def head_deadline_protocol(seconds: float) -> type:
    class HeadDeadlineProtocol(H11Protocol):
        head_timeout_s = seconds

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._head_timer = None
            self._head_bytes = 0
            self._arm_head_timer()

        def _arm_head_timer(self) -> None:
            self._disarm_head_timer()
            self._head_bytes = 0
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

        def _disarm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def data_received(self, data: bytes) -> None:
            if self._head_timer is not None:
                self._head_bytes += len(data)
            super().data_received(data)

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a whole head arrived: its body has a deadline of its own
                self._disarm_head_timer()

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():
                self._arm_head_timer()  # before a pipelined head is handled (which disarms it)
            super().on_response_complete()

        def connection_lost(self, exc) -> None:
            self._disarm_head_timer()
            super().connection_lost(exc)

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.transport.is_closing():
                return
            if self._head_bytes:
                self.transport.write(TIMEOUT_408 % (len(BODY_408), BODY_408))
                log.info("closed a connection whose request head did not arrive within %g s (%d bytes came)",
                         self.head_timeout_s, self._head_bytes)
            self.transport.close()

    return HeadDeadlineProtocol
