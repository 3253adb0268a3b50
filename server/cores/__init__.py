"""The broker on several cores (spec/cores.md): worker processes that each own a shard of destinations.

``pymq-server --workers W`` (W > 1) runs :mod:`.supervisor`, which starts W worker processes
(:mod:`.worker`); each is today's broker (one :class:`~pymq_server.broker.broker.Broker` per process)
bound to the same STOMP port with ``SO_REUSEPORT``, with its own data directory. A destination's
*owner* is chosen by rendezvous hashing over the worker ids (:mod:`.ownership`); frames for a
destination owned elsewhere cross a Unix-socket channel (:mod:`.mesh`, envelope: :mod:`.envelope`)
from the connection's *home* session (:mod:`.home`) to a *shadow* of the connection at the owner
(:mod:`.shadow`), which runs the unchanged session code. With W = 1 nothing here is imported.
"""
