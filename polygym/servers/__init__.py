"""What server implementations subclass: the ASGI base, resources servers, agents, model servers.

This stratum knows HTTP routes, sessions and the wire protocol, never how a stack is configured or
placed; a server learns its peers only by name through its client.
"""
