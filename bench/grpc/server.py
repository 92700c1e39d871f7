"""`python -m bench.grpc.server SLOTS`: the grpcio Echo servicer in a process of its own (bench.grpc).

Prints the ready line (`rampmeter-ready {"data": "127.0.0.1:PORT"}`) and serves until SIGTERM;
Sleep serves at most SLOTS calls at once (the overload case's capacity).
"""

from __future__ import annotations

import signal
import sys
import threading

from proxy.testing import grpc_servicer as gs
from proxy.testing.procs import print_ready


def main() -> None:
    slots = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    servicer = gs.Servicer(sleep_capacity=threading.BoundedSemaphore(slots))
    with gs.serve(workers=64, servicer=servicer) as echo:
        print_ready({"data": echo.target})
        stop.wait()


if __name__ == "__main__":
    main()
