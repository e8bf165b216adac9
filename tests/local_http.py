"""A directory served over HTTP on 127.0.0.1, for tests that crawl a site."""

import contextlib
import functools
import http.server
import threading


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files, logging nothing."""

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve(root, handler=QuietHandler):
    """Serve the directory ``root`` on 127.0.0.1 (a free port) with
    ``handler``; yields its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "http://127.0.0.1:%d/" % server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
