// The RPC relay's byte pump (server/system/relay.py): once a relay or a dialer has done its
// handshake in Python, the two connected sockets are spliced here, off the GIL, so a split's
// per-step traffic (graphs, activations, logits) never waits on a Python thread.
#pragma once

// Copies bytes both ways between the connected sockets `a` and `b` (one thread per direction)
// until either direction ends (its source closed or failed, or its destination failed), then
// shuts both down so the other direction ends too. Returns 0 if the a -> b direction ended
// first, 1 if b -> a did. The caller still owns (and closes) both descriptors. `counts`, when
// given, receives the bytes copied a -> b and b -> a.
int splice_sockets(int a, int b, unsigned long long * counts = nullptr);
