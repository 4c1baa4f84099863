"""An outsider without the secret, in its own process: it listens where a victim dials (a
crashed voter's port, say), relays the victim's handshake to a live node, and once it has
seen Welcome go by it injects a request of its own into the authenticated connection.

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


def _frames(buf: bytearray) -> list[object]:
    """Decode what complete frame headers ``buf`` holds (the relay can read: no encryption)."""
    out: list[object] = []
    i = 0
    while len(buf) - i >= PREFIX.size:
        _m, _p, flags, hlen, plen = PREFIX.unpack_from(buf, i)
        tags = TAGS_SIZE if flags & FLAG_MAC else 0
        end = i + PREFIX.size + hlen + tags + plen
        if end > len(buf):
            break
        try:
            out.append(decode_header(bytes(buf[i + PREFIX.size : i + PREFIX.size + hlen])))
        except Exception:
            out.append(None)
        i = end
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--seconds", type=float, default=6.0)
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
    state = {"welcome": False, "manifest": False, "upstream_closed": "open"}
    lock = threading.Lock()

    def pump(src: socket.socket, dst: socket.socket, watch: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                if watch:
                    with lock:
                        seen.extend(data)
                        for f in _frames(seen):
                            if isinstance(f, Welcome) and not state["welcome"]:
                                state["welcome"] = True
                                # The attack: speak on the victim's authenticated connection.
                                up.sendall(_forged())
                            if type(f).__name__ == "ManifestData":
                                state["manifest"] = True
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
