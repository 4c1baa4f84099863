"""Real I/O: the TCP transport, the torch bridge and the event-loop choice."""
