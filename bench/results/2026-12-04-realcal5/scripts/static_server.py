"""A keep-alive HTTP/1.1 server: GET /metrics answers one file (a vLLM-sized page), anything else a small 200."""
import sys, trio
body = open(sys.argv[2], "rb").read()
def answer(b):
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\ncontent-length: %d\r\n\r\n" % len(b) + b
big, small = answer(body), answer(b"{}")
async def handle(stream):
    buf = b""
    try:
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return
            buf += data
            while b"\r\n\r\n" in buf:
                head, buf = buf.split(b"\r\n\r\n", 1)
                await stream.send_all(big if b" /metrics" in head.split(b"\r\n", 1)[0] else small)
    except trio.BrokenResourceError:
        pass
trio.run(lambda: trio.serve_tcp(handle, int(sys.argv[1]), host="127.0.0.1"))
