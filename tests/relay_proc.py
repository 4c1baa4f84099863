"""An outsider without the secret, in its own process: it listens where a victim dials (a
crashed voter's port, say), relays the victim's handshake to a live node, and once it has
seen Welcome go by it injects a request of its own into the authenticated connection.
With ``--flip`` it injects nothing and instead flips one bit in the payload of every chunk
reply it relays (chunk payloads carry no MAC: the committed digests must catch this).

Prints one JSON line when it is done: whether the handshake got through, whether the live
node answered the injected request with a manifest, and how the upstream connection ended.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import threading
import time

from tensorhub.core.auth import TAGS_SIZE
from tensorhub.core.messages import GetManifest, Welcome
from tensorhub.core.wire import FLAG_MAC, PREFIX, decode_header, encode_header


def _frames(buf: bytearray) -> list[tuple[object, int]]:
    """Decode the frame headers ``buf`` holds whole (the relay can read: no encryption),
    each with the offset of its payload in ``buf``."""
    out: list[tuple[object, int]] = []
    i = 0
    while len(buf) - i >= PREFIX.size:
        _m, _p, flags, hlen, plen = PREFIX.unpack_from(buf, i)
        tags = TAGS_SIZE if flags & FLAG_MAC else 0
        body = i + PREFIX.size + hlen + tags
        if body > len(buf):
            break
        try:
            out.append((decode_header(bytes(buf[i + PREFIX.size : i + PREFIX.size + hlen])), body))
        except Exception:
            out.append((None, body))
        i = body + plen
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--flip", action="store_true", help="alter chunk payloads, inject nothing")
    args = ap.parse_args()
    host, port = args.upstream.rsplit(":", 1)
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    print(f"READY 127.0.0.1:{lsock.getsockname()[1]}", flush=True)
    victim, _ = lsock.accept()
    up = socket.create_connection((host, int(port)))
    seen = bytearray()
    state: dict[str, object] = {
        "welcome": False,
        "manifest": False,
        "upstream_closed": "open",
        "flipped": 0,
    }
    flipped: set[int] = set()
    lock = threading.Lock()

    def pump(src: socket.socket, dst: socket.socket, watch: bool) -> None:
        try:
            while data := bytearray(src.recv(1 << 16)):
                if watch:
                    with lock:
                        start = len(seen)
                        seen.extend(data)
                        for f, body in _frames(seen):
                            if isinstance(f, Welcome) and not state["welcome"]:
                                state["welcome"] = True
                                if not args.flip:
                                    # The attack: speak on the victim's authenticated connection.
                                    up.sendall(_forged())
                            if type(f).__name__ == "ManifestData":
                                state["manifest"] = True
                            if (
                                args.flip
                                and type(f).__name__ == "ChunkData"
                                and start <= body < len(seen)
                                and body not in flipped
                            ):
                                flipped.add(body)
                                data[body - start] ^= 1
                                state["flipped"] = len(flipped)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            if watch:
                state["upstream_closed"] = "closed"

    def _forged() -> bytes:
        raw = encode_header(GetManifest(999, "dtypes", 1))
        prefix = bytearray(raw[: PREFIX.size])
        prefix[3] = FLAG_MAC
        return bytes(prefix) + raw[PREFIX.size :] + os.urandom(TAGS_SIZE)

    threads = [
        threading.Thread(target=pump, args=(victim, up, False), daemon=True),
        threading.Thread(target=pump, args=(up, victim, True), daemon=True),
    ]
    for t in threads:
        t.start()
    time.sleep(args.seconds)
    with lock:
        print(json.dumps(state), flush=True)


if __name__ == "__main__":
    main()
