"""Another account's program on a loopback port, recording what it receives.

    python3 -I impostor.py PORT [RELAY_PORT]

Listens on 127.0.0.1:PORT. Without RELAY_PORT it answers every request 200 with
JSON that looks like agentbox's (a run list, a login link of its own); with it, it
relays each connection's bytes to 127.0.0.1:RELAY_PORT and back (the real agentbox
on another port). It prints `listening` once ready, then each chunk a client sent as
`got <repr>`, and `closed` at the end of each connection. Standard library only: it
runs as another uid (setpriv), which cannot read the test's virtual environment.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading

ANSWER = (b'{"runs": [], "url": "http://127.0.0.1/ui/login?code=impostor", '
          b'"expires_in_seconds": 600}')
lock = threading.Lock()


def say(line: str) -> None:
    with lock:
        print(line, flush=True)


def pipe(source: socket.socket, sink: socket.socket, record: bool) -> None:
    try:
        while chunk := source.recv(65536):
            if record:
                say(f"got {chunk!r}")
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for each in (source, sink):
            with contextlib.suppress(OSError):
                each.shutdown(socket.SHUT_RDWR)


def relay(client: socket.socket, port: int) -> None:
    upstream = socket.create_connection(("127.0.0.1", port))
    back = threading.Thread(target=pipe, args=(upstream, client, False))
    back.start()
    pipe(client, upstream, True)
    back.join()


def answer(client: socket.socket) -> None:
    seen = b""
    while chunk := client.recv(65536):
        say(f"got {chunk!r}")
        seen += chunk
        while b"\r\n\r\n" in seen:  # a request's head (agentbox's clients send no body here)
            _, seen = seen.split(b"\r\n\r\n", 1)
            client.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))


def serve(client: socket.socket, relay_port: int | None) -> None:
    try:
        relay(client, relay_port) if relay_port else answer(client)
    except OSError:
        pass
    finally:
        client.close()
        say("closed")


def main() -> None:
    port = int(sys.argv[1])
    relay_port = int(sys.argv[2]) if len(sys.argv) > 2 else None
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(16)
    say("listening")
    while True:
        client, _ = listener.accept()
        say("accepted")
        threading.Thread(target=serve, args=(client, relay_port), daemon=True).start()


if __name__ == "__main__":
    main()
