"""kairos' own HTTP pieces, below the gateway that uses them: an HTTP/1.1 server for ASGI apps
(`server`), an upstream client with a connection pool and proxies (`client`), server-sent
events read and written (`sse`), the ASGI aliases (`types`) and the access log every server
writes a line per request to (`access`). They import nothing of kairos but
`kairos.errors` and `kairos.telemetry` (the client sends the current trace's `traceparent`)."""
