"""The server's proof that it is this user's agentbox, asked before the admin token leaves.

Every account of a machine can listen on a free loopback port: a stopped
agentbox's port (its address file left behind, or the configured one) may be
another account's program by the time a client calls. So on each new connection
to a loopback address, before any request of its own, a client (agentbox.client,
and the CLI, watcher, MCP server and tray over it) sends a random nonce to
PROOF_PATH and the server answers `address` (the local address of the socket it
was reached on, as the OS gives it) and `proof`, an HMAC under a key made from
the admin token over the nonce and that address. The client checks both against
the token it holds and the address it is connected to; a listener that cannot
answer so gets nothing more on that connection, and the call fails with
`NotProven`.

What it holds against: a listener without the token cannot make the proof, and
the proof it sees (its own nonce's) tells it nothing about the token. A listener
that relays the nonce to the real agentbox on another port gets back a proof for
the real one's address, which is not where the client is connected: refused.
The server learns nothing: it knows the token. What it does not hold against: an
account that can read the user's token (or run as the user) is the user; and
beyond loopback over plain http nothing is proved (TLS proves an https server).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
import secrets
from collections.abc import Callable
from typing import Any

PROOF_PATH = "/.well-known/agentbox-proof"
NONCE = re.compile(r"[0-9a-f]{32,128}")  # what a client sends: hexadecimal, 16 to 64 bytes
PROOF_SECONDS = 10.0  # how long a client waits for the proof before it gives up
MAX_PROOF_BYTES = 4096  # a proof's answer is a few hundred bytes: more is not agentbox's
_KEY_LABEL = b"agentbox server proof"
_VERSION = "agentbox-proof-v1"


class NotProven(Exception):
    """What listens at the address did not prove it is this user's agentbox."""


def address(host: str, port: int) -> str:
    """A socket address as both sides write it: `127.0.0.1:8000`, `[::1]:8000`."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return f"{host}:{port}"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def proof(token: bytes, nonce: str, at: str) -> str:
    """The server's answer to `nonce`, reached at `at`: HMAC-SHA256 under a key of the
    token's own (never the token itself: the session key is another)."""
    key = hmac.new(token, _KEY_LABEL, hashlib.sha256).digest()
    return hmac.new(key, f"{_VERSION}\n{nonce}\n{at}".encode(), hashlib.sha256).hexdigest()


def answer(token: bytes, nonce: str, server: tuple[str, int] | None) -> dict[str, str] | None:
    """The server's JSON answer to a nonce, or None for one that is not a nonce."""
    if server is None or not NONCE.fullmatch(nonce):
        return None
    at = address(*server)
    return {"address": at, "proof": proof(token, nonce, at)}


def check(token: str, nonce: str, peer: tuple[Any, ...] | None, body: bytes) -> None:
    """NotProven unless `body` is the proof for `nonce` from the address `peer`."""
    try:
        found = json.loads(body)
        at, given = str(found["address"]), str(found["proof"])
    except (ValueError, KeyError, TypeError):
        raise NotProven("it did not answer agentbox's proof") from None
    if peer is None or at != address(str(peer[0]), int(peer[1])):
        raise NotProven(f"it answered for agentbox at {at[:60]}, not for itself")
    if not hmac.compare_digest(given.encode(), proof(token.encode(), nonce, at).encode()):
        raise NotProven("its proof is not made with your admin token")


def new_nonce() -> str:
    return secrets.token_hex(32)


def exchange(write: Callable[[bytes], None], read: Callable[[], bytes],
             host_header: str, nonce: str) -> tuple[bytes, bool]:
    """One GET of PROOF_PATH over a fresh connection (`write`, `read`: its bytes; read
    returns b"" at its end): the answer's body, when the status is 200, and whether the
    connection stays open for the requests that follow (HTTP/1.1 keep-alive; a server
    at its connections' limit may close it)."""
    import h11

    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_PROOF_BYTES)
    try:
        write(conn.send(h11.Request(method="GET", target=f"{PROOF_PATH}?nonce={nonce}",
                                    headers=[("Host", host_header),
                                             ("Accept", "application/json")]))
              + (conn.send(h11.EndOfMessage()) or b""))
        status, body = 0, b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(read())
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_PROOF_BYTES:
                    raise NotProven("it answered agentbox's proof with too much")
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise NotProven("it closed the connection instead of proving itself")
    except h11.ProtocolError:
        raise NotProven("it did not answer in HTTP") from None
    if status != 200:
        raise NotProven(f"it answered agentbox's proof with {status or 'nothing'}")
    return body, conn.their_state is h11.DONE
