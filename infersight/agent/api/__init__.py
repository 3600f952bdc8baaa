"""The agent's HTTP side: the ASGI app and its routes (server, detail_routes), the summary document
(report), one request explained (request_explain), two windows compared (window_compare), the
listener socket and the capture token file."""
