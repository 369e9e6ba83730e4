"""How servers reach each other: the client, its retries, the in-process transport, listening sockets."""
