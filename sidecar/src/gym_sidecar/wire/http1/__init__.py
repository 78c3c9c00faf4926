"""The sidecar's HTTP/1.1 server: ASGI apps on asyncio and httptools, with limits.

It serves the OTLP/HTTP receiver (4318), the admin listener (13133) and the web view
(``gym-sidecar ui``). It used to be uvicorn, driven from the sidecar's loop, through a
subclass of uvicorn's private ``HttpToolsProtocol`` that added the limits uvicorn lacks.
Importing that protocol cost **4.8 MiB resident** (uvicorn.config, click, uvicorn's
logging and middleware: 49 modules; measured by import with compiled bytecode, on top
of the rest of the sidecar) against 0.2 MiB for httptools, the C parser (llhttp) both
use. So the parts of uvicorn the listeners used are written here by hand, with the same
behaviour (see each module's docstring for what was kept and the few deliberate
differences):

- :mod:`.listener`: :class:`~.listener.AsgiListener`, bind, serve, graceful stop;
- :mod:`.protocol`: one connection: parsing, keep-alive, pipelining, flow control,
  the connection cap, header size and timeouts, idle timeout, 400 on bad requests;
- :mod:`.cycle`: one request and its response: the ASGI ``receive``/``send`` calls,
  100-continue, HEAD, response framing, 500 when the app raises;
- :mod:`.connection_limits`: :class:`~.connection_limits.ConnectionLimits`, per listener,
  and their counters.

The apps stay ASGI apps (the receiver is a raw one, the admin app Starlette), so their
code and tests do not depend on the server.
"""
