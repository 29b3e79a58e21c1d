"""Raw HTTP/1.1 over sockets, for clients that misbehave on purpose (the hostile-client tests and their
bench harness): a connection, a request head, a response read off the socket, whether the server
closed it, and the server process's resident memory."""

import socket

import httpx


def connect(server, timeout: float = 8.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=timeout)


def read_response(sock) -> tuple[int, dict, bytes]:
    """One HTTP/1.1 response read off `sock` (Content-Length bodies; the server answers errors so)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response head: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", 0))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split()[1]), headers, rest[:length]


def closed_by_server(sock) -> bool:
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def post_head(length=None, ctype="application/json", chunked=False, path="/v1/completions") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1"]
    if ctype is not None:
        lines.append(f"Content-Type: {ctype}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    elif length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def post(server, content: bytes, ctype="application/json", path="/v1/completions") -> httpx.Response:
    headers = {"Content-Type": ctype} if ctype is not None else {}
    return httpx.post(server.url + path, content=content, headers=headers, timeout=60)


def rss_kb(server) -> int:
    with open(f"/proc/{server.proc.pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1])
