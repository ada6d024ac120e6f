"""The benchmarks' client of examples/serve_memory.rs.

Usage: python3 serve-memory-client.py HOST:PORT SECONDS REQUEST...

Connects (retrying while nothing listens, for at most SECONDS), sends each REQUEST as a
line, prints each request with its reply, then "first MS": the milliseconds since the
epoch when the first reply came.
"""

import socket
import sys
import time

host, port = sys.argv[1].rsplit(":", 1)
deadline = time.time() + float(sys.argv[2])
while True:
    try:
        s = socket.create_connection((host, int(port)), timeout=float(sys.argv[2]))
        break
    except OSError:
        if time.time() > deadline:
            sys.exit("no server at %s:%s" % (host, port))
        time.sleep(0.001)
f = s.makefile("rw")
first = None
for request in sys.argv[3:]:
    f.write(request + "\n")
    f.flush()
    reply = f.readline().strip()
    first = first or int(time.time() * 1000)
    print(request, reply)
print("first", first)
